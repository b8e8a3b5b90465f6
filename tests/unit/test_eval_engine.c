/* tests/unit/test_eval_engine.c — the engine behind the scoring interface
 * (compress/eval_engine.c) on a tiny random model with a large vocabulary: a row longer
 * than the logits budget is scored in chunks through the KV cache, to the scores of one
 * whole forward, and no allocation made while scoring it passes the budget.
 */
/* ldflags: -Wl,--wrap=malloc */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compress/eval.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

/* malloc, for the whole program (-Wl,--wrap): while armed, the largest size asked. */
void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);
static int armed;
static size_t largest;

void *__wrap_malloc(size_t n)
{
    if (armed && n > largest)
        largest = n;
    return __real_malloc(n);
}

enum { V = 8192, CTX = 10, CONT = 100, HALF = 50 };

static void tiny_arch(arch *a)
{
    assert_int_equal(arch_init(a, 2), 0);
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = V;
    a->hidden_size = 16;
    a->head_dim = 8;
    a->max_position_embeddings = 256;
    a->rope_theta = 10000;
    a->norm_eps = 1e-5;
    for (int l = 0; l < 2; l++)
        a->layers[l] = (arch_layer){.source_layer = l, .n_heads = 2, .n_kv_heads = 1, .ffn_dim = 24};
}

/* Byte symbols and an end token: the engine needs a tokenizer with BOS or EOS. */
static tok_tokenizer *tiny_tokenizer(void)
{
    tok_tokenizer *t = tok_new(TOK_BYTELEVEL, 257);
    assert_non_null(t);
    for (int b = 0; b < 256; b++) {
        char s[2] = {(char)('A' + b % 26), (char)('a' + b / 26)};
        assert_int_equal(tok_set_token(t, b, s, 2, 0, TOK_TYPE_NORMAL), 0);
    }
    assert_int_equal(tok_set_token(t, 256, "<|end|>", 7, 0, TOK_TYPE_CONTROL), 0);
    tok_config_of(t)->eos_id = 256;
    char err[256];
    assert_int_equal(tok_finalize(t, err, sizeof err), 0);
    return t;
}

/* Two requests with one model input (the second's context holds the first's first HALF
 * continuation tokens), scored with the logits budget `budget` (0: the default). */
static void score(eng_model *m, const tok_tokenizer *tok, size_t budget, const int *toks, ev_request out[2],
                  int arm)
{
    ev_engine e = {.m = m, .tok = tok, .max_logit_bytes = budget};
    ev_model em;
    char err[256];
    assert_int_equal(ev_engine_model(&e, 0, &em, err, sizeof err), 0);
    out[0] = (ev_request){.ctx = toks, .n_ctx = CTX, .cont = toks + CTX, .n_cont = CONT};
    out[1] = (ev_request){.ctx = toks, .n_ctx = CTX + HALF, .cont = toks + CTX + HALF, .n_cont = CONT - HALF};
    armed = arm;
    largest = 0;
    int rc = em.loglik(em.user, out, 2, err, sizeof err);
    armed = 0;
    if (rc)
        fail_msg("%s", err);
    assert_int_equal(e.rows, 1);
    ev_engine_free(&e);
}

/* A 110-token row against a budget of 16 rows of logits: chunks of 16 through the
 * cache. Each request's score equals the one forward's (default budget), and nothing
 * allocated while scoring is larger than the budget. The old code kept the whole scored
 * tail's logits (100 x 8192 floats, 3.2 MB against 512 KiB). */
static void test_long_row_within_budget(void **state)
{
    (void)state;
    arch a;
    tiny_arch(&a);
    eng_backend *be = eng_backend_cpu_new(1);
    assert_non_null(be);
    eng_model m;
    char err[256];
    assert_int_equal(eng_model_init(&m, &a, be, err, sizeof err), 0);
    eng_model_randomize(&m, 7, 0.5f);
    tok_tokenizer *tok = tiny_tokenizer();
    int toks[CTX + CONT];
    for (int i = 0; i < CTX + CONT; i++)
        toks[i] = (i * 37 + 11) % 257;
    ev_request whole[2], chunked[2];
    score(&m, tok, 0, toks, whole, 0);
    const size_t budget = (size_t)16 * V * sizeof(float);
    score(&m, tok, budget, toks, chunked, 1);
    if (largest > budget)
        fail_msg("an allocation of %zu bytes while scoring, against a logits budget of %zu", largest, budget);
    for (int k = 0; k < 2; k++) {
        assert_true(isfinite(whole[k].ll) && whole[k].ll < 0);
        if (fabs(chunked[k].ll - whole[k].ll) > 1e-4 * fabs(whole[k].ll))
            fail_msg("request %d: %.9g in chunks, %.9g in one forward", k, chunked[k].ll, whole[k].ll);
        assert_int_equal(chunked[k].greedy, whole[k].greedy);
    }
    assert_true(whole[1].ll > whole[0].ll);   /* half the continuation: a part of the whole's sum */
    tok_free(tok);
    eng_model_free(&m);
    arch_free(&a);
    eng_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_long_row_within_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
