/* tests/unit/test_engine_backend.c — CPU backend ops against naive references: gemm in
 * every transpose combination (row vectors, strided operands, beta, the threaded split),
 * RoPE forward/backward round trip, group masks and their reductions, and allocation
 * accounting. Model-level numerics are covered by the oracle and the gradient test.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/backend.h"

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xFFFF) / 32768.0f - 1.0f;
}

static void test_gemm_all_layouts(void **state)
{
    (void)state;
    eng_backend *be = eng_backend_cpu_new(2);
    assert_non_null(be);
    uint64_t rng = 1;
    int Ms[3] = {1, 7, 64}, Ns[3] = {1, 33, 300}, Ks[2] = {5, 70};
    int cases = 0;
    for (int mi = 0; mi < 3; mi++)
        for (int ni = 0; ni < 3; ni++)
            for (int ki = 0; ki < 2; ki++)
                for (int ta = 0; ta < 2; ta++)
                    for (int tb = 0; tb < 2; tb++)
                        for (int bi = 0; bi < 2; bi++) {
                            int M = Ms[mi], N = Ns[ni], K = Ks[ki], pad = 3;
                            int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
                            int ra = ta ? K : M, rb = tb ? N : K;
                            float beta = bi ? 0.5f : 0.0f, alpha = 1.25f;
                            float *A = malloc(sizeof(float) * (size_t)ra * lda);
                            float *B = malloc(sizeof(float) * (size_t)rb * ldb);
                            float *C = malloc(sizeof(float) * (size_t)M * ldc), *C0 = malloc(sizeof(float) * (size_t)M * ldc);
                            for (int i = 0; i < ra * lda; i++)
                                A[i] = frand(&rng);
                            for (int i = 0; i < rb * ldb; i++)
                                B[i] = frand(&rng);
                            for (int i = 0; i < M * ldc; i++)
                                C0[i] = C[i] = bi ? frand(&rng) : NAN;
                            be->gemm(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
                            double worst = 0;
                            for (int i = 0; i < M; i++)
                                for (int j = 0; j < N; j++) {
                                    double acc = 0;
                                    for (int k = 0; k < K; k++) {
                                        double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                                        double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                                        acc += a * b;
                                    }
                                    double ref = alpha * acc + (bi ? beta * C0[(size_t)i * ldc + j] : 0.0);
                                    double e = fabs(ref - C[(size_t)i * ldc + j]);
                                    if (!(e <= worst))
                                        worst = e;
                                }
                            if (!(worst < 1e-4))
                                fail_msg("gemm M%d N%d K%d ta%d tb%d beta%g: max err %g", M, N, K, ta, tb, beta, worst);
                            /* padding columns of C untouched */
                            for (int i = 0; i < M; i++)
                                for (int j = N; j < ldc; j++)
                                    assert_memory_equal(&C[(size_t)i * ldc + j], &C0[(size_t)i * ldc + j], sizeof(float));
                            free(A);
                            free(B);
                            free(C);
                            free(C0);
                            cases++;
                        }
    assert_int_equal(cases, 144);
    eng_backend_free(be);
}

static void test_rope_roundtrip_and_masks(void **state)
{
    (void)state;
    eng_backend *be = eng_backend_cpu_new(1);
    enum { N = 5, H = 3, D = 8, G = 4 };
    float x[N * H * D], x0[N * H * D], inv[D / 2] = {1.0f, 0.1f, 0.01f, 0.001f};
    int pos[N] = {0, 1, 7, 100, 5000};
    uint64_t rng = 3;
    for (int i = 0; i < N * H * D; i++)
        x0[i] = x[i] = frand(&rng);
    be->rope_fwd(be, x, pos, inv, N, H, D);
    /* position 0 is the identity; a rotation keeps each pair's norm */
    assert_memory_equal(x, x0, sizeof(float) * H * D);
    float a = x[3 * H * D + 1], b = x[3 * H * D + 1 + D / 2];
    float a0 = x0[3 * H * D + 1], b0 = x0[3 * H * D + 1 + D / 2];
    assert_true(fabsf(a * a + b * b - (a0 * a0 + b0 * b0)) < 1e-5f);
    assert_true(fabsf(a - (a0 * cosf(10.0f) - b0 * sinf(10.0f))) < 1e-5f);
    be->rope_bwd(be, x, pos, inv, N, H, D);
    for (int i = 0; i < N * H * D; i++)
        assert_true(fabsf(x[i] - x0[i]) < 1e-5f);
    /* group mask forward and its reduction */
    float y[N * G * 2], dy[N * G * 2], dx[N * G * 2], m[G] = {1.0f, 0.5f, 0.0f, 2.0f}, dm[G] = {1, 1, 1, 1};
    for (int i = 0; i < N * G * 2; i++) {
        y[i] = frand(&rng);
        dy[i] = frand(&rng);
    }
    float ym[N * G * 2];
    be->mask_fwd(be, ym, y, m, N, G, 2);
    be->mask_bwd(be, dx, dm, dy, y, m, N, G, 2);
    for (int g = 0; g < G; g++) {
        double s = 0;
        for (int n = 0; n < N; n++)
            for (int d = 0; d < 2; d++) {
                size_t i = (size_t)n * G * 2 + g * 2 + d;
                s += (double)dy[i] * y[i];
                assert_true(ym[i] == y[i] * m[g] && dx[i] == dy[i] * m[g]);
            }
        assert_true(fabs(dm[g] - (1.0 + s)) < 1e-5);
    }
    /* accounting */
    size_t c0 = be->cur_bytes;
    void *p = be->alloc(be, 1000);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    assert_int_equal(be->cur_bytes, c0 + 1000);
    assert_true(be->peak_bytes >= c0 + 1000);
    be->free(be, p, 1000);
    assert_int_equal(be->cur_bytes, c0);
    eng_backend_reset_peak(be);
    assert_int_equal(be->peak_bytes, c0);
    eng_backend_free(be);
}

/* The kernel OpenBLAS is asked for: a generic fallback on a CPU with AVX-512 or AVX2 is
 * replaced, a kernel that fits the CPU (or a CPU without AVX2) is kept. */
static void test_blas_kernel_for(void **state)
{
    (void)state;
    assert_string_equal(eng_blas_kernel_for("Prescott", 1, 1), "SkylakeX");
    assert_string_equal(eng_blas_kernel_for("prescott", 0, 1), "Haswell");
    assert_string_equal(eng_blas_kernel_for("Nehalem", 0, 1), "Haswell");
    assert_string_equal(eng_blas_kernel_for("Sandybridge", 1, 1), "SkylakeX");
    assert_null(eng_blas_kernel_for("Prescott", 0, 0));       /* the CPU has nothing better */
    assert_null(eng_blas_kernel_for("SkylakeX", 1, 1));
    assert_null(eng_blas_kernel_for("Haswell", 1, 1));        /* already vector-wide enough to keep */
    assert_null(eng_blas_kernel_for("Zen", 1, 1));
    assert_null(eng_blas_kernel_for("SapphireRapids", 1, 1));
    assert_null(eng_blas_kernel_for(NULL, 1, 1));
    assert_true(eng_blas_kernel()[0] != 0 && eng_blas_config()[0] != 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_all_layouts),
        cmocka_unit_test(test_rope_roundtrip_and_masks),
        cmocka_unit_test(test_blas_kernel_for),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
