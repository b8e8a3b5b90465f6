/* tests/unit/test_engine_optim.c — AdamW against the hand formula (bias correction,
 * decoupled decay on matrices only, gradient scaling and clipping), optimizer state
 * export/restore, and sampling: greedy is argmax, temperature sampling follows softmax,
 * top-p cuts the tail.
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

static void one_layer(arch *a)
{
    assert_int_equal(arch_init(a, 1), 0);
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = 11;
    a->hidden_size = 8;
    a->head_dim = 4;
    a->max_position_embeddings = 64;
    a->rope_theta = 10000;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = 1;
    a->layers[0].n_heads = 2;
    a->layers[0].n_kv_heads = 1;
    a->layers[0].ffn_dim = 6;
}

/* Is params index i inside a 2-D tensor? */
static int is_matrix(const eng_model *m, size_t i)
{
    for (int k = 0; k < eng_model_tensor_count(m); k++) {
        int64_t shape[2];
        int nd;
        float *d;
        eng_model_tensor(m, k, NULL, shape, &nd, &d);
        size_t off = (size_t)(d - m->params), n = (size_t)(shape[0] * (nd == 2 ? shape[1] : 1));
        if (i >= off && i < off + n)
            return nd == 2;
    }
    return -1;
}

static void test_adamw_matches_formula(void **state)
{
    (void)state;
    arch a;
    one_layer(&a);
    eng_backend *be = eng_backend_cpu_new(1);
    eng_model m;
    char err[256];
    assert_int_equal(eng_model_init(&m, &a, be, err, sizeof err), 0);
    eng_model_randomize(&m, 2, 0.5f);
    assert_null(eng_adamw_new(&m));             /* no grads yet */
    assert_int_equal(eng_model_enable_grads(&m), 0);
    eng_adamw *o = eng_adamw_new(&m);
    assert_non_null(o);
    size_t n = m.n_params;
    float *p0 = malloc(4 * n), *g = malloc(4 * n), *mh = malloc(4 * n), *vh = malloc(4 * n);
    memcpy(p0, m.params, 4 * n);
    double sq = 0;
    for (size_t i = 0; i < n; i++) {
        g[i] = (float)(((i * 37) % 17) - 8) * 0.01f;
        sq += (double)g[i] * g[i];
    }
    memcpy(m.grads, g, 4 * n);
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    /* Step 1: no clipping. */
    double norm = eng_adamw_step(o, lr, b1, b2, eps, wd, 0.0f, gs);
    assert_true(fabs(norm - sqrt(sq) * gs) < 1e-6 * norm);
    assert_int_equal(eng_adamw_t(o), 1);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double gi = g[i] * gs, mi = (1 - b1) * gi, vi = (1 - b2) * gi * gi;
        double up = (mi / (1 - b1)) / (sqrt(vi / (1 - b2)) + eps) + (is_matrix(&m, i) ? wd : 0) * p0[i];
        worst = fmax(worst, fabs(m.params[i] - (p0[i] - lr * up)));
    }
    assert_true(worst < 1e-6);
    /* Step 2 with clipping to half the norm: the effective scale is gs * clip / norm. */
    assert_int_equal(eng_adamw_state(o, mh, vh), 0);
    memcpy(p0, m.params, 4 * n);
    float clip = (float)(norm / 2);
    double norm2 = eng_adamw_step(o, lr, b1, b2, eps, wd, clip, gs);
    assert_true(fabs(norm2 - norm) < 1e-6 * norm);
    worst = 0;
    double sc = gs * clip / norm2;
    for (size_t i = 0; i < n; i++) {
        double gi = g[i] * sc, mi = b1 * mh[i] + (1 - b1) * gi, vi = b2 * vh[i] + (1 - b2) * gi * gi;
        double up = (mi / (1 - b1 * b1)) / (sqrt(vi / (1 - b2 * b2)) + eps) + (is_matrix(&m, i) ? wd : 0) * p0[i];
        worst = fmax(worst, fabs(m.params[i] - (p0[i] - lr * up)));
    }
    assert_true(worst < 1e-6);
    /* Restore: a fresh optimizer given step-2 state continues exactly like the original. */
    assert_int_equal(eng_adamw_state(o, mh, vh), 0);
    eng_adamw *o2 = eng_adamw_new(&m);
    assert_int_equal(eng_adamw_restore(o2, eng_adamw_t(o), mh, vh), 0);
    memcpy(p0, m.params, 4 * n);
    eng_adamw_step(o, lr, b1, b2, eps, wd, 0, 1);
    float *after1 = malloc(4 * n);
    memcpy(after1, m.params, 4 * n);
    memcpy(m.params, p0, 4 * n);
    eng_adamw_step(o2, lr, b1, b2, eps, wd, 0, 1);
    assert_memory_equal(after1, m.params, 4 * n);
    assert_int_equal(eng_adamw_t(o2), 3);
    /* A gradient with a NaN (or an infinity) is not applied, clipped or not: weights,
     * moments and step count stay, and the norm says why */
    for (int bad = 0; bad < 2; bad++) {
        memcpy(m.grads, g, 4 * n);
        m.grads[n / 2] = bad ? INFINITY : NAN;
        memcpy(p0, m.params, 4 * n);
        float *m1 = malloc(4 * n), *v1 = malloc(4 * n), *m2 = malloc(4 * n), *v2 = malloc(4 * n);
        assert_int_equal(eng_adamw_state(o2, m1, v1), 0);
        double nn = eng_adamw_step(o2, lr, b1, b2, eps, wd, 1.0f, 1);
        assert_false(isfinite(nn));
        assert_memory_equal(p0, m.params, 4 * n);
        assert_int_equal(eng_adamw_state(o2, m2, v2), 0);
        assert_memory_equal(m1, m2, 4 * n);
        assert_memory_equal(v1, v2, 4 * n);
        assert_int_equal(eng_adamw_t(o2), 3);
        free(m1), free(v1), free(m2), free(v2);
    }
    eng_adamw_free(o);
    eng_adamw_free(o2);
    eng_model_free(&m);
    assert_int_equal(be->cur_bytes, 0);
    eng_backend_free(be);
    arch_free(&a);
    free(p0);
    free(g);
    free(mh);
    free(vh);
    free(after1);
}

static void test_sampling(void **state)
{
    (void)state;
    float l[6] = {0.5f, 2.0f, -1.0f, 1.5f, 0.0f, 1.9f};
    uint64_t rng = 42;
    assert_int_equal(eng_sample(l, 6, 0.0f, 1.0f, &rng), 1);
    assert_int_equal(eng_sample(l, 6, 0.0f, 0.5f, &rng), 1);
    /* Temperature 1: frequencies follow softmax. */
    double p[6], z = 0;
    for (int i = 0; i < 6; i++)
        z += exp(l[i]);
    for (int i = 0; i < 6; i++)
        p[i] = exp(l[i]) / z;
    int cnt[6] = {0};
    enum { NS = 40000 };
    for (int k = 0; k < NS; k++) {
        int t = eng_sample(l, 6, 1.0f, 1.0f, &rng);
        assert_true(t >= 0 && t < 6);
        cnt[t]++;
    }
    for (int i = 0; i < 6; i++)
        assert_true(fabs((double)cnt[i] / NS - p[i]) < 0.01);
    /* top_p: the smallest prefix of sorted probabilities reaching top_p. p1+p5 ~ 0.61,
     * so top_p 0.5 keeps {1, 5}; top_p 0.75 keeps {1, 5, 3}. */
    assert_true(p[1] + p[5] > 0.5 && p[1] < 0.5);
    memset(cnt, 0, sizeof cnt);
    for (int k = 0; k < 4000; k++)
        cnt[eng_sample(l, 6, 1.0f, 0.5f, &rng)]++;
    assert_true(cnt[1] > 0 && cnt[5] > 0);
    assert_int_equal(cnt[0] + cnt[2] + cnt[3] + cnt[4], 0);
    /* kept tokens are renormalized: ratio follows exp(2.0 - 1.9) */
    assert_true(fabs((double)cnt[1] / cnt[5] - exp(0.1)) < 0.12);
    memset(cnt, 0, sizeof cnt);
    for (int k = 0; k < 4000; k++)
        cnt[eng_sample(l, 6, 1.0f, 0.75f, &rng)]++;
    assert_true(cnt[3] > 0);
    assert_int_equal(cnt[0] + cnt[2] + cnt[4], 0);
    /* Very low temperature concentrates on the argmax. */
    for (int k = 0; k < 100; k++)
        assert_int_equal(eng_sample(l, 6, 0.01f, 1.0f, &rng), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_matches_formula),
        cmocka_unit_test(test_sampling),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
