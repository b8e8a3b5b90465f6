/* tests/unit/test_engine_bf16.c — the CPU backend's 16-bit GEMMs (oneDNN): every layout,
 * alpha/beta, the decode path of a few rows and the threaded shapes equal a double
 * reference on operands rounded to bf16 (so the rounding is bf16's, round to nearest
 * even, and accumulation is fp32), and differ from the unrounded product by what bf16
 * costs (so nothing quietly ran in fp32); rounding of ties and NaN; precision names;
 * a model's logits at bf16 against fp32 within bf16's tolerance, decode against full
 * recompute at bf16, and a distillation loss curve at bf16 against fp32's.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/backend.h"
#include "engine/cpu_mm16.h"
#include "engine/devices.h"
#include "engine/model.h"

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xFFFF) / 32768.0f - 1.0f;
}

static float bits_to_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_rounding(void **state)
{
    (void)state;
    /* 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties go to the even mantissa (1). */
    assert_true(mm16_round1(MM16_BF16, 1.0f + 0x1p-8f) == 1.0f);
    /* 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up. */
    assert_true(mm16_round1(MM16_BF16, 1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
    assert_true(mm16_round1(MM16_BF16, 1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
    assert_true(isnan(mm16_round1(MM16_BF16, NAN)));
    assert_true(isnan(mm16_round1(MM16_BF16, bits_to_float(0x7f800001u))));   /* low-bit NaN stays NaN */
    assert_true(isinf(mm16_round1(MM16_BF16, INFINITY)));
    assert_true(isinf(mm16_round1(MM16_BF16, 3.4e38f)));                      /* rounds past the largest */
    assert_true(mm16_round1(MM16_FP16, 1.0f + 0x1p-11f) == 1.0f);
}

/* Worst |C - ref| over the product, ref in double from operands rounded (r16) or not. */
static double worst_err(int r16, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, const float *C0, const float *C, int ldc)
{
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++) {
                float a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                float b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                if (r16)
                    a = mm16_round1(r16, a), b = mm16_round1(r16, b);
                acc += (double)a * b;
            }
            double ref = alpha * acc + (beta != 0.0f ? beta * (double)C0[(size_t)i * ldc + j] : 0.0);
            double e = fabs(ref - C[(size_t)i * ldc + j]);
            if (!(e <= worst))
                worst = e;
        }
    return worst;
}

static void test_gemm_bf16_all_layouts(void **state)
{
    (void)state;
    eng_backend *be = eng_backend_cpu_new(2);
    assert_non_null(be);
    char err[256];
    if (eng_backend_set_precision(be, "bf16", err, sizeof err)) {
        /* Only a CPU without bf16 kernels in oneDNN may refuse, and it must say why. */
        assert_non_null(strstr(err, "bf16"));
        eng_backend_free(be);
        skip();
    }
    assert_string_equal(eng_backend_cpu_precision(be), "bf16");
    uint64_t rng = 7;
    int Ms[4] = {1, 4, 40, 130}, Ns[3] = {1, 33, 300}, Ks[2] = {5, 200};
    int cases = 0;
    double worst_vs_fp32 = 0;
    for (int mi = 0; mi < 4; mi++)
        for (int ni = 0; ni < 3; ni++)
            for (int ki = 0; ki < 2; ki++)
                for (int ta = 0; ta < 2; ta++)
                    for (int tb = 0; tb < 2; tb++)
                        for (int bi = 0; bi < 2; bi++) {
                            int M = Ms[mi], N = Ns[ni], K = Ks[ki], pad = 3;
                            int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
                            int ra = ta ? K : M, rb = tb ? N : K;
                            float beta = bi ? 0.5f : 0.0f, alpha = bi ? 1.25f : 1.0f;
                            float *A = malloc(sizeof(float) * (size_t)ra * lda);
                            float *B = malloc(sizeof(float) * (size_t)rb * ldb);
                            float *C = malloc(sizeof(float) * (size_t)M * ldc), *C0 = malloc(sizeof(float) * (size_t)M * ldc);
                            assert_true(A && B && C && C0);
                            for (int i = 0; i < ra * lda; i++)
                                A[i] = frand(&rng);
                            for (int i = 0; i < rb * ldb; i++)
                                B[i] = frand(&rng);
                            for (int i = 0; i < M * ldc; i++)
                                C0[i] = C[i] = bi ? frand(&rng) : NAN;
                            be->gemm(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
                            assert_int_equal(eng_backend_check(be, err, sizeof err), 0);
                            double e16 = worst_err(MM16_BF16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, C, ldc);
                            double e32 = worst_err(0, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, C, ldc);
                            /* fp32 accumulation of K products of magnitude <= 1. */
                            if (!(e16 < 2e-6 * K + 1e-6))
                                fail_msg("bf16 gemm M%d N%d K%d ta%d tb%d beta%g: %g from the rounded-operand product",
                                         M, N, K, ta, tb, beta, e16);
                            /* bf16 keeps 8 bits: a product of two rounded operands is off by up
                             * to 2^-8 relative, so the sum by about sqrt(K) 2^-8 / 3. */
                            if (!(e32 < 0.02 * sqrt(K)))
                                fail_msg("bf16 gemm M%d N%d K%d: %g from the fp32 product", M, N, K, e32);
                            if (K == 200 && e32 > worst_vs_fp32)
                                worst_vs_fp32 = e32;
                            for (int i = 0; i < M; i++)
                                for (int j = N; j < ldc; j++)
                                    assert_memory_equal(&C[(size_t)i * ldc + j], &C0[(size_t)i * ldc + j], sizeof(float));
                            free(A);
                            free(B);
                            free(C);
                            free(C0);
                            cases++;
                        }
    assert_int_equal(cases, 192);
    /* The operands really were rounded: at K = 200 an fp32 product would be within 1e-4. */
    assert_true(worst_vs_fp32 > 1e-3);
    assert_true(eng_backend_cpu_workspace_bytes(be) > 0);
    assert_int_equal(eng_backend_set_precision(be, "fp32", err, sizeof err), 0);
    assert_string_equal(eng_backend_cpu_precision(be), "fp32");
    assert_int_equal(eng_backend_cpu_workspace_bytes(be), 0);
    assert_int_equal(be->cur_bytes, 0);
    eng_backend_free(be);
}

/* A GEMM whose weights lie in a range declared constant reuses one rounded copy: the
 * same bits as rounding per call, for both layouts that read the same weights (forward
 * x W^T, backward dY W) and for the decode path's few rows; after the range is released, rewritten and declared again, the
 * new weights are used, never the old copy. */
static void test_const_weights(void **state)
{
    (void)state;
    char err[256];
    eng_backend *be = eng_backend_cpu_new(2);
    if (eng_backend_set_precision(be, "bf16", err, sizeof err)) {
        assert_non_null(strstr(err, "bf16"));   /* a CPU without bf16 kernels says why */
        eng_backend_free(be);
        skip();
    }
    enum { M = 24, OUT = 40, IN = 72 };
    uint64_t rng = 5;
    float *W = malloc(sizeof(float) * (OUT * IN + 16)), *X = malloc(sizeof(float) * M * IN);
    float *DY = malloc(sizeof(float) * M * OUT), *C0 = malloc(sizeof(float) * M * (OUT + IN));
    float *C1 = malloc(sizeof(float) * M * (OUT + IN));
    float D0[4 * OUT], D1[4 * OUT];
    assert_true(W && X && DY && C0 && C1);
    for (int i = 0; i < OUT * IN + 16; i++)
        W[i] = frand(&rng);
    for (int i = 0; i < M * IN; i++)
        X[i] = frand(&rng);
    for (int i = 0; i < M * OUT; i++)
        DY[i] = frand(&rng);
    float *w = W + 16;   /* a matrix inside the range, not at its start */
    for (int round = 0; round < 2; round++) {
        /* y = x W^T [M, OUT] and dx = dy W [M, IN], per-call rounding first; then the
         * decode path (3 rows: the weights streamed, rounded as they are read) */
        be->gemm(be, 0, 1, M, OUT, IN, 1.0f, X, IN, w, IN, 0.0f, C0, OUT);
        be->gemm(be, 0, 0, M, IN, OUT, 1.0f, DY, OUT, w, IN, 0.0f, C0 + M * OUT, IN);
        be->gemm(be, 0, 1, 3, OUT, IN, 0.5f, X, IN, w, IN, 0.0f, D0, OUT);
        be->gemm(be, 0, 1, 1, OUT, IN, 1.0f, X, IN, w, IN, 0.0f, D0 + 3 * OUT, OUT);
        size_t before = eng_backend_cpu_workspace_bytes(be);
        eng_backend_const(be, W, sizeof(float) * (OUT * IN + 16), 1);
        for (int rep = 0; rep < 2; rep++) {
            be->gemm(be, 0, 1, M, OUT, IN, 1.0f, X, IN, w, IN, 0.0f, C1, OUT);
            be->gemm(be, 0, 0, M, IN, OUT, 1.0f, DY, OUT, w, IN, 0.0f, C1 + M * OUT, IN);
            assert_memory_equal(C0, C1, sizeof(float) * (M * OUT + M * IN));
            /* the decode path reads the kept copy: half the bytes, the same sums */
            be->gemm(be, 0, 1, 3, OUT, IN, 0.5f, X, IN, w, IN, 0.0f, D1, OUT);
            be->gemm(be, 0, 1, 1, OUT, IN, 1.0f, X, IN, w, IN, 0.0f, D1 + 3 * OUT, OUT);   /* B=1 */
            assert_memory_equal(D0, D1, sizeof(float) * 4 * OUT);
        }
        if (round == 0)   /* one copy of the matrix kept (the two layouts share it) */
            assert_true(eng_backend_cpu_workspace_bytes(be) - before >= (size_t)OUT * IN * 2);
        eng_backend_const(be, W, sizeof(float) * (OUT * IN + 16), 0);
        assert_int_equal(eng_backend_check(be, err, sizeof err), 0);
        for (int i = 0; i < OUT * IN; i++)   /* an optimizer step, while not constant */
            w[i] = -2.0f * w[i] + 0.01f;
    }
    free(W), free(X), free(DY), free(C0), free(C1);
    eng_backend_free(be);
}

static void test_precision_names(void **state)
{
    (void)state;
    eng_backend *be = eng_backend_cpu_new(1);
    assert_non_null(be);
    char err[256] = "";
    assert_int_equal(eng_backend_set_precision(be, "int3", err, sizeof err), -1);
    assert_non_null(strstr(err, "int3"));
    /* fp16 runs where oneDNN has a kernel for it, else it is refused with the reason. */
    err[0] = 0;
    if (eng_backend_set_precision(be, "fp16", err, sizeof err) == 0)
        assert_string_equal(eng_backend_cpu_precision(be), "fp16");
    else
        assert_non_null(strstr(err, "fp16"));
    eng_backend_free(be);
}

/* A small arch in which every GEMM path runs: prefill rows past the decode path, GQA. */
static void small_arch(arch *a)
{
    assert_int_equal(arch_init(a, 2), 0);
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = 96;
    a->hidden_size = 64;
    a->head_dim = 16;
    a->max_position_embeddings = 256;
    a->rope_theta = 10000;
    a->norm_eps = 1e-5;
    for (int l = 0; l < 2; l++) {
        a->layers[l].source_layer = l;
        a->layers[l].n_heads = 4;
        a->layers[l].n_kv_heads = 2;
        a->layers[l].ffn_dim = 160;
    }
}

static double rel_rms(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - ref[i]) * (double)(a[i] - ref[i]);
        den += ref[i] * (double)ref[i];
    }
    return sqrt(num / den);
}

/* Logits at bf16 against fp32: bf16's relative error, not fp32's; decode with the cache
 * at bf16 (the few-row path) equals full recompute at bf16 (oneDNN) closely. */
static void test_model_logits_bf16(void **state)
{
    (void)state;
    eng_backend *be = eng_backend_cpu_new(2);
    assert_non_null(be);
    char err[256];
    arch a;
    small_arch(&a);
    eng_model m;
    assert_int_equal(eng_model_init(&m, &a, be, err, sizeof err), 0);
    arch_free(&a);   /* the model holds its own copy */
    eng_model_randomize(&m, 11, 0.2f);
    enum { T = 40 };
    int V = a.vocab_size, tok[T];
    for (int i = 0; i < T; i++)
        tok[i] = (i * 7 + 3) % V;
    float *l32 = malloc(sizeof(float) * T * V), *l16 = malloc(sizeof(float) * T * V), *step = malloc(sizeof(float) * V);
    assert_true(l32 && l16 && step);
    eng_fwd_args fa = {.tokens = tok, .B = 1, .T = T, .logits_mode = ENG_LOGITS_ALL, .logits = l32};
    assert_int_equal(eng_forward(&m, &fa, err, sizeof err), 0);
    if (eng_backend_set_precision(be, "bf16", err, sizeof err)) {
        free(l32), free(l16), free(step);
        eng_model_free(&m);
        eng_backend_free(be);
        skip();
    }
    fa.logits = l16;
    assert_int_equal(eng_forward(&m, &fa, err, sizeof err), 0);
    assert_int_equal(eng_backend_check(be, err, sizeof err), 0);
    double rel = rel_rms(l16, l32, (size_t)T * V);
    if (!(rel > 1e-4 && rel < 3e-2))
        fail_msg("bf16 logits: relative error %g (expected bf16's, between 1e-4 and 3e-2)", rel);
    /* Prefill 30 (oneDNN), then decode one token at a time (rounded streaming pass). */
    eng_kv_cache *kv = eng_kv_new(&m, 1, T);
    assert_non_null(kv);
    eng_fwd_args pa = {.tokens = tok, .B = 1, .T = 30, .kv = kv, .logits_mode = ENG_LOGITS_LAST, .logits = step};
    assert_int_equal(eng_forward(&m, &pa, err, sizeof err), 0);
    double worst = rel_rms(step, l16 + (size_t)29 * V, V);
    for (int t = 30; t < T; t++) {
        eng_fwd_args da = {.tokens = tok + t, .B = 1, .T = 1, .kv = kv, .logits_mode = ENG_LOGITS_LAST, .logits = step};
        assert_int_equal(eng_forward(&m, &da, err, sizeof err), 0);
        double e = rel_rms(step, l16 + (size_t)t * V, V);
        if (e > worst)
            worst = e;
    }
    /* Same rounded operands, fp32 sums in another order: far below bf16's own error. */
    if (!(worst < rel / 10))
        fail_msg("bf16 decode vs full recompute: %g (bf16 vs fp32 is %g)", worst, rel);
    eng_kv_free(kv);
    free(l32), free(l16), free(step);
    eng_model_free(&m);
    eng_backend_free(be);
}

/* Distillation from a teacher, 40 AdamW steps at fp32 and at bf16 from the same start:
 * the bf16 loss curve stays within 2% of fp32's at every step and falls as far. */
static void train(const char *precision, double *loss, int steps)
{
    eng_backend *be = eng_backend_cpu_new(2);
    assert_non_null(be);
    char err[256];
    assert_int_equal(eng_backend_set_precision(be, precision, err, sizeof err), 0);
    arch a;
    small_arch(&a);
    eng_model st, te;
    assert_int_equal(eng_model_init(&st, &a, be, err, sizeof err), 0);
    assert_int_equal(eng_model_init(&te, &a, be, err, sizeof err), 0);
    arch_free(&a);
    eng_model_randomize(&st, 3, 0.2f);
    eng_model_randomize(&te, 4, 0.4f);
    assert_int_equal(eng_model_enable_grads(&st), 0);
    eng_adamw *o = eng_adamw_new(&st);
    assert_non_null(o);
    enum { B = 2, T = 48 };
    int tok[B * T];
    uint64_t rng = 99;
    eng_loss_spec ls = {.kind = ENG_LOSS_KD, .teacher = &te, .temperature = 1.0f};
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < B * T; i++)
            tok[i] = (int)((frand(&rng) + 1.0f) * 0.5f * (a.vocab_size - 1));
        eng_model_zero_grads(&st);
        eng_loss_result r;
        assert_int_equal(eng_forward_backward(&st, tok, B, T, &ls, ENG_GRAD_WEIGHTS, &r, err, sizeof err), 0);
        eng_adamw_step(o, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1.0f);
        loss[s] = r.loss;
    }
    assert_int_equal(eng_backend_check(be, err, sizeof err), 0);
    eng_adamw_free(o);
    eng_model_free(&st);
    eng_model_free(&te);
    eng_backend_free(be);
}

static void test_distill_curve_bf16(void **state)
{
    (void)state;
    eng_backend *probe = eng_backend_cpu_new(1);
    char err[256];
    int have = eng_backend_set_precision(probe, "bf16", err, sizeof err) == 0;
    eng_backend_free(probe);
    if (!have)
        skip();
    enum { STEPS = 40 };
    double l32[STEPS], l16[STEPS];
    train("fp32", l32, STEPS);
    train("bf16", l16, STEPS);
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        double e = fabs(l16[s] - l32[s]) / l32[s];
        if (e > worst)
            worst = e;
    }
    print_message("bf16 vs fp32 distillation: loss %.4f -> %.4f vs %.4f -> %.4f, worst step %.3f%%\n", l16[0],
                  l16[STEPS - 1], l32[0], l32[STEPS - 1], 100 * worst);
    assert_true(l32[STEPS - 1] < 0.8 * l32[0]);
    if (!(worst < 0.02))
        fail_msg("bf16 distillation loss departs from fp32's by %.2f%% at worst", 100 * worst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rounding),
        cmocka_unit_test(test_gemm_bf16_all_layouts),
        cmocka_unit_test(test_const_weights),
        cmocka_unit_test(test_precision_names),
        cmocka_unit_test(test_model_logits_bf16),
        cmocka_unit_test(test_distill_curve_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
