/* tests/unit/test_engine_grad.c — finite-difference checks of eng_forward_backward on a
 * tiny heterogeneous model (GQA, attention bias, untied head, a removed attention and a
 * removed MLP): sampled coordinates of every weight tensor and of every mask kind (hidden,
 * head, ffn, attn_gate, mlp_gate, hidden_count) under a mixed CE + KD loss; gradients
 * accumulate across calls and zero_grads clears them; a model is its own unmasked teacher;
 * one and two threads give the same gradients on a model large enough to run in parallel.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/model.h"

static void small_arch(arch *a, int V, int C)
{
    assert_int_equal(arch_init(a, 3), 0);
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = V;
    a->hidden_size = C;
    a->head_dim = 4;
    a->max_position_embeddings = 64;
    a->rope_theta = 10000;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = 0;
    a->attention_bias = 1;
    int cfg[3][3] = {{2, 1, 6}, {0, 0, 5}, {3, 3, 0}};
    for (int l = 0; l < 3; l++) {
        a->layers[l].source_layer = l;
        a->layers[l].n_heads = cfg[l][0];
        a->layers[l].n_kv_heads = cfg[l][1];
        a->layers[l].ffn_dim = cfg[l][2];
    }
}

enum { B = 2, T = 5 };
static int toks[B * T] = {1, 4, 7, 2, 9, 3, 3, 0, 12, 5};
static int tgts[B * T] = {4, 7, 2, 9, -1, 3, 0, 12, 5, 6};

static double loss_of(eng_model *m, const eng_loss_spec *ls)
{
    char err[256];
    eng_loss_result r;
    assert_int_equal(eng_forward_backward(m, toks, B, T, ls, 0, &r, err, sizeof err), 0);
    return r.loss;
}

static int check(const char *what, double an, double fd)
{
    double tol = 2e-3 + 3e-2 * fabs(an);
    if (fabs(an - fd) > tol) {
        print_message("%s: analytic %.6g finite-difference %.6g\n", what, an, fd);
        return 1;
    }
    return 0;
}

/* Central difference of the loss in one float *p (host memory on the CPU backend). */
static double fd_at(eng_model *m, const eng_loss_spec *ls, float *p)
{
    const float h = 1e-2f;
    float keep = *p;
    *p = keep + h;
    double lp = loss_of(m, ls);
    *p = keep - h;
    double lm = loss_of(m, ls);
    *p = keep;
    return (lp - lm) / (2.0 * h);
}

static void test_finite_differences(void **state)
{
    (void)state;
    arch a, ta;
    small_arch(&a, 13, 8);
    small_arch(&ta, 13, 12);
    eng_backend *be = eng_backend_cpu_new(1);
    eng_model m, t;
    char err[256];
    assert_int_equal(eng_model_init(&m, &a, be, err, sizeof err), 0);
    assert_int_equal(eng_model_init(&t, &ta, be, err, sizeof err), 0);
    eng_model_randomize(&m, 11, 0.4f);
    eng_model_randomize(&t, 12, 0.4f);
    assert_int_equal(eng_model_enable_grads(&m), 0);
    assert_int_equal(eng_model_enable_masks(&m), 0);
    uint64_t s = 5;
    for (size_t i = 0; i < m.masks->count; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        m.masks->block[i] = 0.6f + 0.8f * (float)((s >> 33) % 1000) / 1000.0f;
    }
    m.masks->hidden_count = 6.5f;
    eng_loss_spec ls = {.kind = ENG_LOSS_CE | ENG_LOSS_KD, .targets = tgts, .teacher = &t,
                        .temperature = 1.5f, .kd_weight = 0.4f};
    eng_loss_result r;
    eng_model_zero_grads(&m);
    assert_int_equal(eng_forward_backward(&m, toks, B, T, &ls, ENG_GRAD_WEIGHTS | ENG_GRAD_MASKS, &r, err, sizeof err), 0);
    assert_int_equal(r.tokens, 9);
    int bad = 0, checked = 0;
    char what[160];
    /* Weights: three coordinates of every tensor. */
    for (int i = 0; i < eng_model_tensor_count(&m); i++) {
        const char *name;
        int64_t shape[2];
        int nd;
        float *d;
        assert_int_equal(eng_model_tensor(&m, i, &name, shape, &nd, &d), 0);
        int64_t n = shape[0] * (nd == 2 ? shape[1] : 1);
        for (int k = 0; k < 3; k++) {
            int64_t j = (k * 7919 + i * 31) % n;
            if (k == 0 && strcmp(name, "model.embed_tokens.weight") == 0)
                j = 4 * shape[1] + 1;   /* a token that occurs */
            snprintf(what, sizeof what, "%s[%lld]", name, (long long)j);
            bad += check(what, m.grads[(d - m.params) + j], fd_at(&m, &ls, d + j));
            checked++;
        }
    }
    /* Masks: every element of every kind (there are few). */
    for (size_t i = 0; i < m.masks->count; i++) {
        snprintf(what, sizeof what, "mask[%zu]", i);
        bad += check(what, m.masks->grad_block[i], fd_at(&m, &ls, m.masks->block + i));
        checked++;
    }
    bad += check("hidden_count", m.masks->g_hidden_count, fd_at(&m, &ls, &m.masks->hidden_count));
    print_message("%d gradient coordinates checked, %d off\n", checked + 1, bad);
    assert_int_equal(bad, 0);
    /* Removed parts have no gate gradient. */
    assert_true(m.masks->g_attn_gate[1] == 0.0f && m.masks->g_mlp_gate[2] == 0.0f);
    assert_true(m.masks->g_attn_gate[0] != 0.0f && m.masks->g_mlp_gate[0] != 0.0f);

    /* Accumulation: a second call doubles every gradient; zero_grads clears. */
    float g0 = m.grads[5], h0 = m.masks->g_hidden[1];
    assert_int_equal(eng_forward_backward(&m, toks, B, T, &ls, ENG_GRAD_WEIGHTS | ENG_GRAD_MASKS, &r, err, sizeof err), 0);
    assert_true(fabsf(m.grads[5] - 2 * g0) <= 1e-5f * (1 + fabsf(g0)));
    assert_true(fabsf(m.masks->g_hidden[1] - 2 * h0) <= 1e-5f * (1 + fabsf(h0)));
    eng_model_zero_grads(&m);
    double sq = 0;
    for (size_t i = 0; i < m.n_params; i++)
        sq += (double)m.grads[i] * m.grads[i];
    assert_true(sq == 0.0 && m.masks->g_hidden_count == 0.0f);

    /* Self-teacher: the model runs unmasked as teacher; with masks at 1 the KD loss is 0. */
    for (size_t i = 0; i < m.masks->count; i++)
        m.masks->block[i] = 1.0f;
    m.masks->hidden_count = (float)a.hidden_size;
    eng_loss_spec self = {.kind = ENG_LOSS_KD, .teacher = &m, .temperature = 2.0f};
    assert_int_equal(eng_forward_backward(&m, toks, B, T, &self, ENG_GRAD_MASKS, &r, err, sizeof err), 0);
    assert_true(fabs(r.kd) < 1e-6);
    assert_int_equal(r.tokens, B * T);
    /* Asking for weight grads on a model without grads, or masks without masks, fails. */
    assert_int_equal(eng_forward_backward(&t, toks, B, T, &ls, ENG_GRAD_WEIGHTS, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "not enabled"));
    eng_model_free(&m);
    eng_model_free(&t);
    assert_int_equal(be->cur_bytes, 0);
    eng_backend_free(be);
    arch_free(&a);
    arch_free(&ta);
}

/* Gradients of a model large enough to cross every parallel threshold, computed with
 * `threads` threads; host copies of weight and mask grads are returned (caller frees). */
static void grads_with_threads(int threads, float **gw, float **gmk, size_t *nw, size_t *nm, double *loss)
{
    arch a;
    small_arch(&a, 300, 128);
    a.head_dim = 16;
    int cfg[3][3] = {{8, 2, 96}, {0, 0, 80}, {4, 4, 0}};
    for (int l = 0; l < 3; l++) {
        a.layers[l].n_heads = cfg[l][0];
        a.layers[l].n_kv_heads = cfg[l][1];
        a.layers[l].ffn_dim = cfg[l][2];
    }
    eng_backend *be = eng_backend_cpu_new(threads);
    eng_model m;
    char err[256];
    assert_int_equal(eng_model_init(&m, &a, be, err, sizeof err), 0);
    eng_model_randomize(&m, 21, 0.1f);
    assert_int_equal(eng_model_enable_grads(&m), 0);
    assert_int_equal(eng_model_enable_masks(&m), 0);
    for (size_t i = 0; i < m.masks->count; i++)
        m.masks->block[i] = 0.75f + 0.5f * (float)((i * 37) % 11) / 11.0f;
    m.masks->hidden_count = 100.0f;
    enum { BB = 4, TT = 72 };
    static int tk[BB * TT], tg[BB * TT];
    for (int i = 0; i < BB * TT; i++) {
        tk[i] = (i * 31 + 7) % 300;
        tg[i] = i % 13 == 0 ? -1 : (i * 17 + 3) % 300;
    }
    eng_loss_spec ls = {.kind = ENG_LOSS_CE | ENG_LOSS_KD, .targets = tg, .teacher = &m, .temperature = 1.5f,
                        .kd_weight = 0.5f};
    eng_loss_result r;
    assert_int_equal(eng_forward_backward(&m, tk, BB, TT, &ls, ENG_GRAD_WEIGHTS | ENG_GRAD_MASKS, &r, err, sizeof err), 0);
    *loss = r.loss;
    *nw = m.n_params;
    *nm = m.masks->count + 1;
    *gw = malloc(sizeof(float) * *nw);
    *gmk = malloc(sizeof(float) * *nm);
    memcpy(*gw, m.grads, sizeof(float) * *nw);
    memcpy(*gmk, m.masks->grad_block, sizeof(float) * (*nm - 1));
    (*gmk)[*nm - 1] = m.masks->g_hidden_count;
    eng_model_free(&m);
    assert_int_equal(be->cur_bytes, 0);
    eng_backend_free(be);
    arch_free(&a);
}

static double rel_diff(const float *a, const float *b, size_t n)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

static void test_threads_agree(void **state)
{
    (void)state;
    float *w1, *m1, *w2, *m2;
    size_t nw, nm;
    double l1, l2;
    grads_with_threads(1, &w1, &m1, &nw, &nm, &l1);
    grads_with_threads(2, &w2, &m2, &nw, &nm, &l2);
    double ew = rel_diff(w2, w1, nw), em = rel_diff(m2, m1, nm);
    print_message("1 vs 2 threads: loss %.8f / %.8f, weight grads rel %.2e, mask grads rel %.2e\n", l1, l2, ew, em);
    assert_true(fabs(l1 - l2) < 1e-6 * fabs(l1));
    assert_true(ew < 1e-5 && em < 1e-5);
    double sq = 0;
    for (size_t i = 0; i < nm; i++)
        sq += (double)m1[i] * m1[i];
    assert_true(sq > 0);
    free(w1);
    free(m1);
    free(w2);
    free(m2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_threads_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
