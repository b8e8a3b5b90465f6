/* tests/unit/test_tokenizer_hfjson.c — HF tokenizer.json loading beyond the file itself:
 * BOS/EOS ids named only by tokenizer_config.json, special_tokens_map.json or config.json
 * beside it (as an exported SmolLM2 directory has them), their order of precedence, and
 * clear errors for names that are not in the vocabulary. Files are written here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "engine/tokenizer.h"
#include "storage/tokload.h"

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ac_hfjson_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A byte-level BPE whose post-processor adds nothing (no template): like the
 * tokenizer.json an SmolLM2 GGUF parent is exported to. */
static const char *const BYTELEVEL_JSON =
    "{\"version\": \"1.0\", \"added_tokens\": ["
    "{\"id\": 0, \"content\": \"<|endoftext|>\", \"special\": true},"
    "{\"id\": 1, \"content\": \"<|im_start|>\", \"special\": true},"
    "{\"id\": 2, \"content\": \"<|im_end|>\", \"special\": true}],"
    "\"normalizer\": null,"
    "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true},"
    "\"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": false},"
    "\"decoder\": {\"type\": \"ByteLevel\"},"
    "\"model\": {\"type\": \"BPE\", \"byte_fallback\": false, \"vocab\": {\"<|endoftext|>\": 0, "
    "\"<|im_start|>\": 1, \"<|im_end|>\": 2, \"a\": 3, \"b\": 4, \"\\u0120\": 5, \"ab\": 6}, "
    "\"merges\": [\"a b\"]}}";

static void put(const char *dir, const char *name, const char *text)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* A fresh subdirectory of tmpdir holding tokenizer.json; its path in dir. */
static void fresh(char *dir, size_t cap, const char *name)
{
    snprintf(dir, cap, "%s/%s", tmpdir, name);
    assert_int_equal(mkdir(dir, 0755), 0);
    put(dir, "tokenizer.json", BYTELEVEL_JSON);
}

static tok_tokenizer *load(const char *dir, char *err, size_t errlen)
{
    char p[256];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    return tokload_hf_json(p, err, errlen);
}

static void expect_ids(const char *dir, int bos, int eos)
{
    char err[256];
    tok_tokenizer *t = load(dir, err, sizeof err);
    if (!t)
        fail_msg("%s: %s", dir, err);
    assert_int_equal(tok_cfg(t)->bos_id, bos);
    assert_int_equal(tok_cfg(t)->eos_id, eos);
    assert_int_equal(tok_cfg(t)->add_bos, 0);   /* naming a BOS does not make encode add it */
    assert_int_equal(tok_cfg(t)->add_eos, 0);
    int *ids;
    size_t n;
    assert_int_equal(tok_encode(t, "ab a", 4, 1, 0, &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 3);   /* "ab" "Ġ" "a" */
    assert_int_equal(ids[0], 6);
    free(ids);
    tok_free(t);
}

/* Qwen2's tokenizer.json: a byte-level BPE with an NFC normalizer. It loads as byte-level
 * and tokenizes as without it; a normalizer that would change the tokens is refused. */
static void test_normalizers(void **state)
{
    (void)state;
    static const char *const norms[] = {
        "{\"type\": \"NFC\"}", "{\"type\": \"Lowercase\"}",
        "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]}",
        "{\"type\": \"Sequence\", \"normalizers\": []}",
        /* Llama-2's: SentencePiece-style however the model says, so its ByteLevel pre-tokenizer is refused */
        "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\u2581\"}, "
        "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}]}"};
    for (int k = 0; k < 5; k++) {
        char dir[128], err[256], *text = strdup(BYTELEVEL_JSON), *at = strstr(text, "\"normalizer\": null");
        assert_non_null(at);
        char *json = malloc(strlen(text) + 256);
        snprintf(json, strlen(text) + 256, "%.*s\"normalizer\": %s%s", (int)(at - text), text, norms[k],
                 at + strlen("\"normalizer\": null"));
        snprintf(dir, sizeof dir, "%s/norm%d", tmpdir, k);
        assert_int_equal(mkdir(dir, 0755), 0);
        put(dir, "tokenizer.json", json);
        tok_tokenizer *t = load(dir, err, sizeof err);
        if (k == 1 || k == 4) {
            assert_null(t);
            assert_non_null(strstr(err, k == 1 ? "normalizer \"Lowercase\"" : "SentencePiece-style"));
        } else {
            if (!t)
                fail_msg("NFC: %s", err);
            int *ids;
            size_t n;
            assert_int_equal(tok_encode(t, "ab a", 4, 1, 0, &ids, &n, err, sizeof err), 0);
            assert_int_equal(n, 3);   /* "ab" "Ġ" "a", as with no normalizer */
            assert_int_equal(ids[0], 6);
            assert_int_equal(ids[1], 5);
            assert_int_equal(ids[2], 3);
            free(ids);
            if (k == 0) {   /* a text longer than the tokenizer takes at once is refused before it is read */
                char *big = malloc(TOK_MAX_TEXT_BYTES + 1);
                assert_non_null(big);
                assert_int_equal(tok_encode(t, big, TOK_MAX_TEXT_BYTES + 1, 0, 0, &ids, &n, err, sizeof err), -1);
                assert_non_null(strstr(err, "split it"));
                free(big);
            }
            tok_free(t);
        }
        free(json);
        free(text);
    }
}

static void test_ids_from_tokenizer_config(void **state)
{
    (void)state;
    char dir[128];
    fresh(dir, sizeof dir, "tc");
    /* strings and AddedToken objects, both as transformers writes them */
    put(dir, "tokenizer_config.json", "{\"bos_token\": \"<|im_start|>\", \"eos_token\": {\"__type\": \"AddedToken\", "
                                      "\"content\": \"<|im_end|>\", \"special\": true}, \"unk_token\": null}");
    expect_ids(dir, 1, 2);
}

static void test_ids_from_special_tokens_map(void **state)
{
    (void)state;
    char dir[128];
    fresh(dir, sizeof dir, "stm");
    put(dir, "special_tokens_map.json", "{\"bos_token\": {\"content\": \"<|endoftext|>\"}, \"eos_token\": \"<|im_end|>\"}");
    expect_ids(dir, 0, 2);
}

static void test_ids_from_config(void **state)
{
    (void)state;
    char dir[128];
    fresh(dir, sizeof dir, "cfg");
    put(dir, "config.json", "{\"bos_token_id\": 1, \"eos_token_id\": [2, 0]}");   /* a list: the first */
    expect_ids(dir, 1, 2);
}

static void test_precedence(void **state)
{
    (void)state;
    char dir[128];
    fresh(dir, sizeof dir, "both");
    /* the tokenizer's own files win over the model's config.json; a file that names only
     * one of the two leaves the other to the next file */
    put(dir, "tokenizer_config.json", "{\"bos_token\": \"<|im_start|>\"}");
    put(dir, "config.json", "{\"bos_token_id\": 0, \"eos_token_id\": 2}");
    expect_ids(dir, 1, 2);
}

static void test_none_named(void **state)
{
    (void)state;
    char dir[128];
    fresh(dir, sizeof dir, "none");
    expect_ids(dir, -1, -1);
}

static void test_bad_names(void **state)
{
    (void)state;
    char dir[128], err[256];
    fresh(dir, sizeof dir, "badname");
    put(dir, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
    assert_null(load(dir, err, sizeof err));
    assert_non_null(strstr(err, "tokenizer_config.json"));
    assert_non_null(strstr(err, "<s>"));
    fresh(dir, sizeof dir, "badid");
    put(dir, "config.json", "{\"eos_token_id\": 99}");
    assert_null(load(dir, err, sizeof err));
    assert_non_null(strstr(err, "config.json"));
    assert_non_null(strstr(err, "99"));
    fresh(dir, sizeof dir, "badjson");
    put(dir, "tokenizer_config.json", "{\"bos_token\": ");
    assert_null(load(dir, err, sizeof err));
    assert_non_null(strstr(err, "tokenizer_config.json"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids_from_tokenizer_config),
        cmocka_unit_test(test_normalizers),
        cmocka_unit_test(test_ids_from_special_tokens_map),
        cmocka_unit_test(test_ids_from_config),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_none_named),
        cmocka_unit_test(test_bad_names),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
