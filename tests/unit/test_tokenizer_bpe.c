/* tests/unit/test_tokenizer_bpe.c — byte-level BPE on a vocabulary built here: merge
 * order by rank (not by length or position), GPT-2 pre-tokenizer splits, special tokens,
 * ignore_merges, add_prefix_space, invalid UTF-8, decode(encode(x)) == x, and ids set
 * again and again (the piece table must not fill up). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/tokenizer.h"

/* 256 byte symbols (GPT-2 mapping: printable bytes map to themselves, space -> "Ġ"),
 * then merged pieces, then one special token. */
static const char *merged[] = {"ĠĠ", "Ġt", "he", "Ġthe", "ll", "llo", "Ġhe", "Ġhello", "12"};

/* The 256 byte symbols (the GPT-2 table) and the merged pieces into t, ids 0..264. */
static void fill_pieces(tok_tokenizer *t)
{
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        unsigned cp = direct ? (unsigned)b : 256u + (unsigned)extra++;
        char s[3];
        size_t l;
        if (cp < 0x80) { s[0] = (char)cp; l = 1; }
        else { s[0] = (char)(0xC0 | (cp >> 6)); s[1] = (char)(0x80 | (cp & 0x3F)); l = 2; }
        assert_int_equal(tok_set_token(t, b, s, l, 0, TOK_TYPE_NORMAL), 0);
    }
    for (size_t i = 0; i < sizeof merged / sizeof merged[0]; i++)
        assert_int_equal(tok_set_token(t, 256 + (int)i, merged[i], strlen(merged[i]), 0, TOK_TYPE_NORMAL), 0);
}

static tok_tokenizer *build(int with_merges, int ignore_merges)
{
    int n = 256 + (int)(sizeof merged / sizeof merged[0]) + 1;
    tok_tokenizer *t = tok_new(TOK_BYTELEVEL, n);
    assert_non_null(t);
    fill_pieces(t);
    assert_int_equal(tok_set_token(t, n - 1, "<|end|>", 7, 0, TOK_TYPE_CONTROL), 0);
    if (with_merges) {
        /* rank order matters: "l l" before "h e", "Ġ h" is absent so " he" needs "Ġhe" via "Ġ he"... */
        static const char *rules[][2] = {{"l", "l"}, {"h", "e"}, {"Ġ", "t"}, {"ll", "o"}, {"Ġt", "he"},
                                         {"Ġ", "he"}, {"Ġhe", "llo"}, {"Ġ", "Ġ"}};
        for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
            assert_int_equal(tok_add_merge(t, rules[i][0], strlen(rules[i][0]), rules[i][1], strlen(rules[i][1])), 0);
        assert_int_equal(tok_add_merge(t, "x", 1, "y", 1), 1);   /* "xy" not in vocab: skipped */
    }
    char err[256];
    assert_int_equal(tok_set_pretok_preset(t, "gpt2", err, sizeof err), 0);
    tok_config_of(t)->ignore_merges = ignore_merges;
    tok_config_of(t)->eos_id = n - 1;
    assert_int_equal(tok_finalize(t, err, sizeof err), 0);
    return t;
}

static void expect_ids(const tok_tokenizer *t, const char *text, const int *want, size_t nwant)
{
    int *ids;
    size_t n;
    char err[256];
    assert_int_equal(tok_encode(t, text, strlen(text), 0, 1, &ids, &n, err, sizeof err), 0);
    if (n != nwant || (n && memcmp(ids, want, n * sizeof *ids))) {
        fprintf(stderr, "text \"%s\": got", text);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
        fail_msg("ids differ");
    }
    char *dec;
    size_t dl;
    assert_int_equal(tok_decode(t, ids, n, 0, &dec, &dl, err, sizeof err), 0);
    assert_int_equal(dl, strlen(text));
    assert_memory_equal(dec, text, dl);
    free(dec);
    free(ids);
}

static void test_merges_by_rank(void **state)
{
    (void)state;
    tok_tokenizer *t = build(1, 0);
    /* "hello": l+l (rank 0), h+e (1), ll+o (3) -> "he" "llo"; no rule joins them without Ġ */
    expect_ids(t, "hello", (int[]){258, 261}, 2);
    /* " hello": ... then Ġ+he (5) -> "Ġhe", then Ġhe+llo (6) -> "Ġhello" */
    expect_ids(t, " hello", (int[]){263}, 1);
    /* " the": h+e (1) before Ġ+t (2) -> "Ġ" "t" "he"; Ġ+t is next -> "Ġt" "he"; then Ġt+he (4) */
    expect_ids(t, " the", (int[]){259}, 1);
    /* pre-tokenizer: "a  b" -> "a" " " " b"; merges never cross pieces */
    expect_ids(t, "a  b", (int[]){97, 32, 32, 98}, 4);
    expect_ids(t, "a   b", (int[]){97, 256, 32, 98}, 4);
    /* "12" is in the vocabulary but no rule merges 1+2 */
    expect_ids(t, "x 12", (int[]){120, 32, 49, 50}, 4);
    /* special tokens are matched literally */
    expect_ids(t, "x<|end|>he", (int[]){120, 265, 258}, 3);
    /* multi-byte characters go through the byte symbols */
    expect_ids(t, "é", (int[]){0xC3, 0xA9}, 2);
    expect_ids(t, "", (int[]){0}, 0);
    int *ids;
    size_t n;
    char err[256];
    assert_int_equal(tok_encode(t, "ok\xff", 3, 0, 1, &ids, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "UTF-8"));
    assert_int_equal(tok_encode(t, "x<|end|>", 8, 0, 0, &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 8);   /* parse_special off: spelled out in bytes */
    free(ids);
    char *dec;
    size_t dl;
    int with_special[] = {104, 265, 105};
    assert_int_equal(tok_decode(t, with_special, 3, 1, &dec, &dl, err, sizeof err), 0);
    assert_string_equal(dec, "hi");   /* skip_special drops the control token */
    free(dec);
    int bad = 9999;
    assert_int_equal(tok_decode(t, &bad, 1, 0, &dec, &dl, err, sizeof err), -1);
    tok_free(t);
}

static void test_ignore_merges(void **state)
{
    (void)state;
    tok_tokenizer *t = build(0, 1);
    expect_ids(t, " hello", (int[]){263}, 1);         /* whole pre-token in the vocabulary */
    expect_ids(t, "hello", (int[]){104, 101, 108, 108, 111}, 5);
    tok_free(t);
    t = build(0, 0);
    expect_ids(t, " hello", (int[]){32, 104, 101, 108, 108, 111}, 6);
    tok_free(t);
}

static void test_pretok_presets(void **state)
{
    (void)state;
    char err[256];
    tok_tokenizer *t = build(0, 0);
    assert_int_equal(tok_set_pretok_preset(t, "gpt5", err, sizeof err), -1);
    assert_non_null(strstr(err, "unknown"));
    assert_int_equal(tok_add_pretok_regex(t, "(unclosed", err, sizeof err), -1);
    assert_non_null(strstr(err, "regex"));
    tok_free(t);
    /* llama3: digits in groups of three, contractions case-insensitive */
    t = tok_new(TOK_BYTELEVEL, 256);
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        unsigned cp = direct ? (unsigned)b : 256u + (unsigned)extra++;
        char s[3];
        size_t l;
        if (cp < 0x80) { s[0] = (char)cp; l = 1; }
        else { s[0] = (char)(0xC0 | (cp >> 6)); s[1] = (char)(0x80 | (cp & 0x3F)); l = 2; }
        assert_int_equal(tok_set_token(t, b, s, l, 0, TOK_TYPE_NORMAL), 0);
    }
    assert_int_equal(tok_add_merge(t, "1", 1, "2", 1), 1);   /* "12" absent: skipped */
    assert_int_equal(tok_set_pretok_preset(t, "llama3", err, sizeof err), 0);
    assert_int_equal(tok_finalize(t, err, sizeof err), 0);
    int *ids;
    size_t n;
    char *dec;
    size_t dl;
    const char *txt = "I'M 1234567 tokens\n\n  ok";
    assert_int_equal(tok_encode(t, txt, strlen(txt), 0, 1, &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, strlen(txt));   /* no merges: one id per byte */
    assert_int_equal(tok_decode(t, ids, n, 0, &dec, &dl, err, sizeof err), 0);
    assert_string_equal(dec, txt);
    free(ids);
    free(dec);
    tok_free(t);
}

/* One id set to piece after piece (a tokenizer.json whose vocab maps many keys to one
 * id) keeps one table slot: old pieces are forgotten and lookups end. A hang is turned
 * into a failure by the alarm. Then random reassignments over a small vocabulary where
 * pieces are often shared: after each step every piece finds the token that took it
 * last, even when that token's piece has since changed again (fuzz-found). */
static void test_reassigned_ids(void **state)
{
    (void)state;
    alarm(20);
    tok_tokenizer *t = tok_new(TOK_BYTELEVEL, 8);   /* 16 table slots */
    assert_non_null(t);
    char p[16];
    for (int i = 0; i < 40; i++) {
        snprintf(p, sizeof p, "k%02d", i);
        assert_int_equal(tok_set_token(t, 5, p, strlen(p), 0, TOK_TYPE_NORMAL), 0);
    }
    assert_int_equal(tok_lookup(t, "k39", 3), 5);
    assert_int_equal(tok_lookup(t, "k00", 3), -1);
    assert_int_equal(tok_lookup(t, "absent", 6), -1);
    tok_free(t);
    /* the fuzz-found case: id 0 takes "<s>" from id 1, then moves on to "</s>" */
    t = tok_new(TOK_BYTELEVEL, 3);
    assert_non_null(t);
    assert_int_equal(tok_set_token(t, 0, "<unk>", 5, 0, TOK_TYPE_NORMAL), 0);
    assert_int_equal(tok_set_token(t, 1, "<s>", 3, 0, TOK_TYPE_NORMAL), 0);
    assert_int_equal(tok_set_token(t, 2, "</s>", 4, 0, TOK_TYPE_NORMAL), 0);
    assert_int_equal(tok_set_token(t, 0, "<s>", 3, 0, TOK_TYPE_CONTROL), 0);
    assert_int_equal(tok_lookup(t, "<s>", 3), 0);
    assert_int_equal(tok_set_token(t, 0, "</s>", 4, 0, TOK_TYPE_CONTROL), 0);
    assert_int_equal(tok_lookup(t, "<s>", 3), 1);
    assert_int_equal(tok_lookup(t, "</s>", 4), 0);
    assert_int_equal(tok_lookup(t, "<unk>", 5), -1);
    tok_free(t);

    enum { NV = 8, NP = 12, STEPS = 4000 };
    t = tok_new(TOK_BYTELEVEL, NV);
    assert_non_null(t);
    int cur[NV], when[NV];                          /* piece number each id holds (-1 none), set at step */
    for (int i = 0; i < NV; i++)
        cur[i] = when[i] = -1;
    uint64_t rng = 12345;
    for (int step = 0; step < STEPS; step++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        int id = (int)((rng >> 33) % NV), pc = (int)((rng >> 45) % NP);
        snprintf(p, sizeof p, "p%d", pc);
        assert_int_equal(tok_set_token(t, id, p, strlen(p), 0, TOK_TYPE_NORMAL), 0);
        cur[id] = pc;
        when[id] = step;
        for (int q = 0; q < NP; q++) {
            int want = -1;
            for (int i = 0; i < NV; i++)
                if (cur[i] == q && (want < 0 || when[i] > when[want]))
                    want = i;
            snprintf(p, sizeof p, "p%d", q);
            if (tok_lookup(t, p, strlen(p)) != want)
                fail_msg("step %d: \"%s\" finds %d, not %d", step, p, tok_lookup(t, p, strlen(p)), want);
        }
    }
    tok_free(t);
    alarm(0);
}

/* A vocabulary of many copies of one piece (a hostile GGUF) loads in linear time: the
 * lookup finds the copy set last, and each copy set to something else passes the piece
 * back to the copy before it. The old table probed every earlier copy on each insert
 * (quadratic: hours for 2^18 copies); the alarm turns a hang into a failure. */
static void test_duplicate_pieces(void **state)
{
    (void)state;
    enum { N = 1 << 18 };
    alarm(20);
    tok_tokenizer *t = tok_new(TOK_BYTELEVEL, N);
    assert_non_null(t);
    for (int i = 0; i < N; i++)
        assert_int_equal(tok_set_token(t, i, "dup", 3, 0, TOK_TYPE_NORMAL), 0);
    assert_int_equal(tok_lookup(t, "dup", 3), N - 1);
    assert_int_equal(tok_set_token(t, N - 1, "other", 5, 0, TOK_TYPE_NORMAL), 0);
    assert_int_equal(tok_lookup(t, "dup", 3), N - 2);
    assert_int_equal(tok_lookup(t, "other", 5), N - 1);
    assert_int_equal(tok_set_token(t, N / 2, "other", 5, 0, TOK_TYPE_NORMAL), 0);   /* from inside the chain */
    assert_int_equal(tok_lookup(t, "other", 5), N / 2);
    for (int i = N - 2; i > 0; i--)
        if (i != N / 2)
            assert_int_equal(tok_set_token(t, i, "x", 1, 0, TOK_TYPE_NORMAL), 0);
    assert_int_equal(tok_lookup(t, "dup", 3), 0);
    assert_int_equal(tok_set_token(t, 0, "x", 1, 0, TOK_TYPE_NORMAL), 0);
    assert_int_equal(tok_lookup(t, "dup", 3), -1);
    assert_int_equal(tok_lookup(t, "x", 1), 0);
    tok_free(t);
    alarm(0);
}

/* A user-defined token whose piece is not a whole character (a GGUF's "\xA9") never
 * matches inside one: "é" (C3 A9) with special tokens parsed is its two byte symbols, and
 * no segment handed to the pre-tokenizer's regex is cut inside a character. */
static void test_special_inside_a_character(void **state)
{
    (void)state;
    int n = 256 + (int)(sizeof merged / sizeof merged[0]) + 2;
    tok_tokenizer *t = tok_new(TOK_BYTELEVEL, n);
    assert_non_null(t);
    fill_pieces(t);
    assert_int_equal(tok_set_token(t, n - 2, "<|end|>", 7, 0, TOK_TYPE_CONTROL), 0);
    assert_int_equal(tok_set_token(t, n - 1, "\xA9", 1, 0, TOK_TYPE_USER_DEFINED), 0);
    char err[256];
    assert_int_equal(tok_set_pretok_preset(t, "gpt2", err, sizeof err), 0);
    assert_int_equal(tok_finalize(t, err, sizeof err), 0);
    int *ids;
    size_t k;
    assert_int_equal(tok_encode(t, "x\xc3\xa9<|end|>", 10, 0, 1, &ids, &k, err, sizeof err), 0);
    assert_int_equal(k, 4);
    assert_int_equal(ids[0], 'x');
    assert_int_equal(ids[1], 0xC3);
    assert_int_equal(ids[2], 0xA9);
    assert_int_equal(ids[3], n - 2);
    free(ids);
    tok_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merges_by_rank),
        cmocka_unit_test(test_ignore_merges),
        cmocka_unit_test(test_pretok_presets),
        cmocka_unit_test(test_reassigned_ids),
        cmocka_unit_test(test_duplicate_pieces),
        cmocka_unit_test(test_special_inside_a_character),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
