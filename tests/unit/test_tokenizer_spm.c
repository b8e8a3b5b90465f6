/* tests/unit/test_tokenizer_spm.c — SentencePiece-style BPE: llama2.c's tok512.bin
 * (stories260K) encodes the reference sentence to its 44 tokens, byte fallback for
 * unseen characters, dummy prefix handled on decode, round trips; and a hand-built
 * U+2581-escaped vocabulary merging by score (Llama-2 / GGUF "llama" style). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/tokenizer.h"
#include "storage/tokload.h"

static tok_tokenizer *load512(void)
{
    const char *shared = getenv("AC_SHARED");
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/data/models/stories260K/tok512.bin", shared ? shared : "../shared");
    tok_tokenizer *t = tokload_llama2c(path, 512, err, sizeof err);
    if (!t)
        fail_msg("%s", err);
    return t;
}

static void round_trip(const tok_tokenizer *t, const char *text, size_t *count)
{
    int *ids;
    size_t n, dl;
    char *dec, err[256];
    assert_int_equal(tok_encode(t, text, strlen(text), 1, 0, &ids, &n, err, sizeof err), 0);
    assert_int_equal(tok_decode(t, ids, n, 1, &dec, &dl, err, sizeof err), 0);
    if (dl != strlen(text) || memcmp(dec, text, dl))
        fail_msg("round trip of \"%s\" gave \"%s\"", text, dec);
    if (count)
        *count = n;
    free(ids);
    free(dec);
}

static void test_tok512(void **state)
{
    (void)state;
    tok_tokenizer *t = load512();
    const tok_config *c = tok_cfg(t);
    assert_int_equal(c->bos_id, 1);
    assert_int_equal(c->eos_id, 2);
    assert_int_equal(tok_type_of(t, 3), TOK_TYPE_BYTE);   /* <0x00> */
    size_t n;
    round_trip(t, "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
                  "One day, she saw a big, red ball.", &n);
    assert_int_equal(n, 45);   /* BOS + the 44 tokens of PROVENANCE.md's reference sentence */
    int *ids;
    char err[256];
    assert_int_equal(tok_encode(t, "Once", 4, 1, 0, &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1);
    size_t pl;
    const char *p = tok_piece(t, ids[1], &pl);
    assert_int_equal(pl, 5);
    assert_memory_equal(p, " Once", 5);   /* the dummy prefix joined the word */
    free(ids);
    /* an emoji is not in the 512-token vocabulary: four byte tokens */
    assert_int_equal(tok_encode(t, "\xF0\x9F\xA4\x97", 4, 0, 0, &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 5);   /* " " then 4 bytes */
    assert_int_equal(ids[1], 0xF0 + 3);
    assert_int_equal(ids[4], 0x97 + 3);
    free(ids);
    static const char *texts[] = {"", " ", "  two leading", "tabs\tand\nnewlines\r\n", "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC",
                                  "12345 + 678 = ?", "\xFF\xFE invalid utf-8 bytes"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        round_trip(t, texts[i], NULL);
    tok_free(t);
}

static void test_truncated_tokenizer_file(void **state)
{
    (void)state;
    uint8_t buf[64] = {0};
    char err[256];
    int32_t len = 1000;
    memcpy(buf + 8, &len, 4);   /* token 0 claims 1000 bytes */
    assert_null(tokload_llama2c_mem(buf, sizeof buf, 5, err, sizeof err));
    assert_non_null(strstr(err, "beyond the file"));
    /* fewer bytes than the vocabulary's 8 a token: refused before the vocabulary is
     * allocated (4M tokens of a config on a 64-byte file took 140 MB first) */
    assert_null(tokload_llama2c_mem(buf, 10, 512, err, sizeof err));
    assert_non_null(strstr(err, "too short"));
    assert_null(tokload_llama2c_mem(buf, sizeof buf, 1 << 22, err, sizeof err));
    assert_non_null(strstr(err, "too short (64 bytes) for a vocabulary of 4194304"));
}

/* tok512.bin for a model of 500 tokens: 12 entries follow, and it was loaded from its first
 * 500 (a tokenizer of another vocabulary, or a file with a tail, tokenized with no word);
 * now refused, naming the file. */
static void test_tokenizer_larger_than_model(void **state)
{
    (void)state;
    const char *shared = getenv("AC_SHARED");
    char path[512], err[1024];
    snprintf(path, sizeof path, "%s/data/models/stories260K/tok512.bin", shared ? shared : "../shared");
    assert_null(tokload_llama2c(path, 500, err, sizeof err));
    if (!strstr(err, "follow the model's 500 tokens") || !strstr(err, "tok512.bin"))
        fail_msg("error \"%s\"", err);
    tok_tokenizer *t = tokload_llama2c(path, 512, err, sizeof err);
    assert_non_null(t);
    tok_free(t);
}

/* Llama-2 style: pieces escaped with U+2581, merges by score of the merged piece. */
static void test_escaped_scores(void **state)
{
    (void)state;
    static const char *pieces[] = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "c",
                                   "ab", "bc", "\xE2\x96\x81" "a", "\xE2\x96\x81" "abc"};
    static const float scores[] = {0, 0, 0, -1, -2, -2, -2, -5, -3, -4, -6};
    int n = (int)(sizeof pieces / sizeof pieces[0]);
    tok_tokenizer *t = tok_new(TOK_SPM, n + 256);
    for (int i = 0; i < n; i++)
        assert_int_equal(tok_set_token(t, i, pieces[i], strlen(pieces[i]), scores[i],
                                       i == 0 ? TOK_TYPE_UNKNOWN : i < 3 ? TOK_TYPE_CONTROL : TOK_TYPE_NORMAL), 0);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        assert_int_equal(tok_set_token(t, n + b, name, 6, 0, TOK_TYPE_BYTE), 0);
    }
    tok_config *c = tok_config_of(t);
    c->bos_id = 1; c->eos_id = 2; c->unk_id = 0; c->add_bos = 1;
    c->add_dummy_prefix = 1; c->escape_spaces = 1; c->byte_fallback = 1;
    char err[256];
    assert_int_equal(tok_finalize(t, err, sizeof err), 0);
    int *ids;
    size_t k;
    /* "abc" -> "▁ a b c": bc (-3) first, then ▁a (-4) (ab is gone), then ▁a+bc -> "▁abc" */
    assert_int_equal(tok_encode(t, "abc", 3, 1, 0, &ids, &k, err, sizeof err), 0);
    assert_int_equal(k, 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 10);
    free(ids);
    /* "cab": ▁ c a b -> ab (-5) is the only pair in the vocabulary: ▁ c ab */
    assert_int_equal(tok_encode(t, "cab", 3, 0, 0, &ids, &k, err, sizeof err), 0);
    assert_int_equal(k, 3);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 6);
    assert_int_equal(ids[2], 7);
    free(ids);
    round_trip(t, "abc cab \xC3\xA9", NULL);
    tok_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tok512),
        cmocka_unit_test(test_truncated_tokenizer_file),
        cmocka_unit_test(test_tokenizer_larger_than_model),
        cmocka_unit_test(test_escaped_scores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
