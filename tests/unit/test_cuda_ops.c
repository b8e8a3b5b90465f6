/* tests/unit/test_cuda_ops.c — every op of the CUDA backend against the CPU reference
 * on random inputs (never zeros), printing each op's max relative error ("CUDAOP name
 * err tol": |gpu - cpu| max over elements divided by max |cpu|). fp32 ops must agree
 * within 1e-5, bf16/fp16 GEMMs within 1e-2. Without a GPU, or in a build without CUDA,
 * it prints "SKIPPED: no CUDA device" and exits 0.
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
#include "engine/devices.h"
#if defined(AC_CUDA) && AC_CUDA
#include "cuda/backend_cuda.h"
#endif

#define TOL32 1e-5
#define TOL16 1e-2

static eng_backend *CPU, *GPU;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Uniform in [lo, hi), never exactly 0. */
static float frand(float lo, float hi)
{
    float x;
    do
        x = lo + (hi - lo) * (float)urand();
    while (x == 0.0f);
    return x;
}

/* The same buffer on both backends. */
typedef struct {
    float *c, *g;
    size_t n;
} pair;

static pair pair_from(const float *host, size_t n)
{
    pair p = {CPU->alloc(CPU, n * 4), GPU->alloc(GPU, n * 4), n};
    assert_non_null(p.c);
    assert_non_null(p.g);
    CPU->to_device(CPU, p.c, host, n * 4);
    GPU->to_device(GPU, p.g, host, n * 4);
    return p;
}

static pair pair_rand(size_t n, float lo, float hi)
{
    float *h = malloc(n * 4 + 4);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++)
        h[i] = frand(lo, hi);
    pair p = pair_from(h, n);
    free(h);
    return p;
}

static void pair_free(pair *p)
{
    CPU->free(CPU, p->c, p->n * 4);
    GPU->free(GPU, p->g, p->n * 4);
}

/* max |g - c| / max |c| (absolute when the CPU values are all 0). */
static double pair_err(const pair *p)
{
    float *hc = malloc(p->n * 4 + 4), *hg = malloc(p->n * 4 + 4);
    assert_non_null(hc);
    assert_non_null(hg);
    CPU->to_host(CPU, hc, p->c, p->n * 4);
    GPU->to_host(GPU, hg, p->g, p->n * 4);
    double dmax = 0, cmax = 0;
    for (size_t i = 0; i < p->n; i++) {
        double d = fabs((double)hg[i] - hc[i]);
        if (!(d <= dmax))
            dmax = d;   /* NaN propagates as a failure */
        if (fabs(hc[i]) > cmax)
            cmax = fabs(hc[i]);
    }
    free(hc);
    free(hg);
    return cmax > 0 ? dmax / cmax : dmax;
}

/* Make the GPU copy equal to the CPU copy. */
static void pair_sync_to_gpu(pair *p)
{
    float *h = malloc(p->n * 4 + 4);
    assert_non_null(h);
    CPU->to_host(CPU, h, p->c, p->n * 4);
    GPU->to_device(GPU, p->g, h, p->n * 4);
    free(h);
}

static void check(const char *op, double err, double tol)
{
#if defined(AC_CUDA) && AC_CUDA
    const char *e = cu_backend_error(GPU);
    if (e[0])
        fail_msg("%s: CUDA error: %s", op, e);
#endif
    printf("CUDAOP %-28s %.3e %.0e\n", op, err, tol);
    if (!(err <= tol))
        fail_msg("%s: max relative error %.3e above %.0e", op, err, tol);
}

static void check_pair(const char *op, pair *p, double tol)
{
    check(op, pair_err(p), tol);
}

static int *ints_on(eng_backend *be, const int *h, int n)
{
    int *d = be->alloc(be, (size_t)n * 4);
    assert_non_null(d);
    be->to_device(be, d, h, (size_t)n * 4);
    return d;
}

/* ---- memory ------------------------------------------------------------------------ */

static void test_memory(void **state)
{
    (void)state;
    size_t base = GPU->cur_bytes;
    float h[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        h[i] = frand(-3, 3);
    float *a = GPU->alloc(GPU, sizeof h), *b = GPU->alloc(GPU, sizeof h);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(GPU->cur_bytes, base + 2 * sizeof h);
    assert_true(GPU->peak_bytes >= GPU->cur_bytes);
    GPU->to_device(GPU, a, h, sizeof h);
    GPU->copy(GPU, b, a, sizeof h);
    GPU->to_host(GPU, back, b, sizeof h);
    assert_memory_equal(h, back, sizeof h);
    GPU->zero(GPU, b, sizeof h);
    GPU->sync(GPU);
    GPU->to_host(GPU, back, b, sizeof h);
    for (int i = 0; i < 1000; i++)
        assert_true(back[i] == 0.0f);
    GPU->free(GPU, a, sizeof h);
    GPU->free(GPU, b, sizeof h);
    assert_int_equal(GPU->cur_bytes, base);
    eng_backend_reset_peak(GPU);
    assert_int_equal(GPU->peak_bytes, base);
    /* An impossible allocation fails cleanly and accounts nothing. */
    void *huge = GPU->alloc(GPU, (size_t)1 << 50);
    assert_null(huge);
    assert_int_equal(GPU->cur_bytes, base);
}

/* ---- GEMM -------------------------------------------------------------------------- */

static void gemm_case(int ta, int tb, int M, int N, int K, float alpha, float beta, double tol, const char *tag)
{
    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    pair A = pair_rand(na, -1, 1), B = pair_rand(nb, -1, 1);
    float *hc = malloc(nc * 4);
    assert_non_null(hc);
    for (size_t i = 0; i < nc; i++)
        hc[i] = beta == 0.0f ? NAN : frand(-1, 1);   /* beta = 0 must ignore C, even NaN */
    pair C = pair_from(hc, nc);
    free(hc);
    CPU->gemm(CPU, ta, tb, M, N, K, alpha, A.c, lda, B.c, ldb, beta, C.c, ldc);
    GPU->gemm(GPU, ta, tb, M, N, K, alpha, A.g, lda, B.g, ldb, beta, C.g, ldc);
    if (beta == 0.0f) {
        /* padding columns of C stay NaN on both; compare only the M x N block */
        float *c1 = malloc(nc * 4), *g1 = malloc(nc * 4);
        assert_non_null(c1);
        assert_non_null(g1);
        CPU->to_host(CPU, c1, C.c, nc * 4);
        GPU->to_host(GPU, g1, C.g, nc * 4);
        double dmax = 0, cmax = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double c = c1[(size_t)i * ldc + j], g = g1[(size_t)i * ldc + j];
                if (!(fabs(g - c) <= dmax))
                    dmax = fabs(g - c);
                if (fabs(c) > cmax)
                    cmax = fabs(c);
            }
        free(c1);
        free(g1);
        check(tag, cmax > 0 ? dmax / cmax : dmax, tol);
    } else {
        check_pair(tag, &C, tol);
    }
    pair_free(&A);
    pair_free(&B);
    pair_free(&C);
}

static void test_gemm_fp32(void **state)
{
    (void)state;
    char tag[64];
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            snprintf(tag, sizeof tag, "gemm_fp32_t%d%d", ta, tb);
            gemm_case(ta, tb, 67, 45, 131, 0.75f, 0.5f, TOL32, tag);
            snprintf(tag, sizeof tag, "gemm_fp32_t%d%d_beta0", ta, tb);
            gemm_case(ta, tb, 33, 70, 576, 1.0f, 0.0f, TOL32, tag);
        }
    gemm_case(0, 1, 256, 576, 1536, 1.0f, 0.0f, TOL32, "gemm_fp32_linear_576x1536");
    gemm_case(0, 1, 5, 9, 0, 1.0f, 0.5f, TOL32, "gemm_fp32_k0");
}

#if defined(AC_CUDA) && AC_CUDA
static void test_gemm_half(void **state)
{
    (void)state;
    char tag[64];
    int precs[2] = {CU_PREC_BF16, CU_PREC_FP16};
    const char *names[2] = {"bf16", "fp16"};
    for (int p = 0; p < 2; p++) {
        assert_int_equal(cu_backend_set_precision(GPU, precs[p]), 0);
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                snprintf(tag, sizeof tag, "gemm_%s_t%d%d", names[p], ta, tb);
                gemm_case(ta, tb, 67, 45, 131, 0.75f, 0.5f, TOL16, tag);
            }
        snprintf(tag, sizeof tag, "gemm_%s_linear_576x1536", names[p]);
        gemm_case(0, 1, 128, 576, 1536, 1.0f, 0.0f, TOL16, tag);
    }
    assert_int_equal(cu_backend_set_precision(GPU, CU_PREC_FP32), 0);
    assert_int_equal(cu_backend_set_precision(CPU, CU_PREC_BF16), -1);
}
#endif

/* ---- norms, RoPE, SwiGLU, embedding ----------------------------------------------- */

static void test_rmsnorm(void **state)
{
    (void)state;
    int N = 37, C = 576;
    float n_eff = 500.5f, eps = 1e-5f;
    pair x = pair_rand((size_t)N * C, -2, 2), w = pair_rand(C, 0.5f, 1.5f);
    pair y = pair_rand((size_t)N * C, -1, 1), r = pair_rand(N, 0, 1);
    CPU->rmsnorm_fwd(CPU, y.c, r.c, x.c, w.c, N, C, n_eff, eps);
    GPU->rmsnorm_fwd(GPU, y.g, r.g, x.g, w.g, N, C, n_eff, eps);
    check_pair("rmsnorm_fwd_y", &y, TOL32);
    check_pair("rmsnorm_fwd_rstd", &r, TOL32);
    pair dy = pair_rand((size_t)N * C, -1, 1), dx = pair_rand((size_t)N * C, -1, 1);
    pair dw = pair_rand(C, -1, 1), dn = pair_rand(1, 1, 2);
    CPU->rmsnorm_bwd(CPU, dx.c, dw.c, dn.c, dy.c, x.c, w.c, r.c, N, C, n_eff);
    GPU->rmsnorm_bwd(GPU, dx.g, dw.g, dn.g, dy.g, x.g, w.g, r.g, N, C, n_eff);
    check_pair("rmsnorm_bwd_dx", &dx, TOL32);
    check_pair("rmsnorm_bwd_dw", &dw, TOL32);
    check_pair("rmsnorm_bwd_dneff", &dn, TOL32);
    /* NULL outputs are allowed */
    CPU->rmsnorm_fwd(CPU, y.c, NULL, x.c, w.c, N, C, (float)C, eps);
    GPU->rmsnorm_fwd(GPU, y.g, NULL, x.g, w.g, N, C, (float)C, eps);
    check_pair("rmsnorm_fwd_no_rstd", &y, TOL32);
    CPU->rmsnorm_bwd(CPU, dx.c, NULL, NULL, dy.c, x.c, w.c, r.c, N, C, n_eff);
    GPU->rmsnorm_bwd(GPU, dx.g, NULL, NULL, dy.g, x.g, w.g, r.g, N, C, n_eff);
    check_pair("rmsnorm_bwd_dx_only", &dx, TOL32);
    pair *all[] = {&x, &w, &y, &r, &dy, &dx, &dw, &dn};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
}

static void test_rope(void **state)
{
    (void)state;
    int N = 29, H = 5, D = 64;
    int hpos[29];
    float hf[32];
    for (int n = 0; n < N; n++)
        hpos[n] = n < 20 ? n : 1000 + 4000 * n;   /* small and large positions */
    for (int i = 0; i < D / 2; i++)
        hf[i] = (float)pow(10000.0, -2.0 * i / D);
    int *pc = ints_on(CPU, hpos, N), *pg = ints_on(GPU, hpos, N);
    pair f = pair_from(hf, D / 2), x = pair_rand((size_t)N * H * D, -1, 1);
    CPU->rope_fwd(CPU, x.c, pc, f.c, N, H, D);
    GPU->rope_fwd(GPU, x.g, pg, f.g, N, H, D);
    check_pair("rope_fwd", &x, TOL32);
    CPU->rope_bwd(CPU, x.c, pc, f.c, N, H, D);
    GPU->rope_bwd(GPU, x.g, pg, f.g, N, H, D);
    check_pair("rope_bwd", &x, TOL32);
    pair_free(&f);
    pair_free(&x);
    CPU->free(CPU, pc, (size_t)N * 4);
    GPU->free(GPU, pg, (size_t)N * 4);
}

static void test_swiglu(void **state)
{
    (void)state;
    size_t n = 100003;
    pair g = pair_rand(n, -8, 8), u = pair_rand(n, -2, 2), h = pair_rand(n, -1, 1);
    CPU->swiglu_fwd(CPU, h.c, g.c, u.c, n);
    GPU->swiglu_fwd(GPU, h.g, g.g, u.g, n);
    check_pair("swiglu_fwd", &h, TOL32);
    pair dh = pair_rand(n, -1, 1), dg = pair_rand(n, -1, 1), du = pair_rand(n, -1, 1);
    CPU->swiglu_bwd(CPU, dg.c, du.c, dh.c, g.c, u.c, n);
    GPU->swiglu_bwd(GPU, dg.g, du.g, dh.g, g.g, u.g, n);
    check_pair("swiglu_bwd_dgate", &dg, TOL32);
    check_pair("swiglu_bwd_dup", &du, TOL32);
    pair *all[] = {&g, &u, &h, &dh, &dg, &du};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
}

static void test_embedding(void **state)
{
    (void)state;
    int V = 301, C = 72, N = 200;
    int tok[200];
    for (int n = 0; n < N; n++)
        tok[n] = n % 3 == 0 ? 7 : (int)(urand() * V);   /* many repeats of token 7 */
    int *tc = ints_on(CPU, tok, N), *tg = ints_on(GPU, tok, N);
    pair tab = pair_rand((size_t)V * C, -1, 1), out = pair_rand((size_t)N * C, -1, 1);
    CPU->embed_fwd(CPU, out.c, tab.c, tc, N, C);
    GPU->embed_fwd(GPU, out.g, tab.g, tg, N, C);
    check_pair("embed_fwd", &out, 0.0);
    pair dtab = pair_rand((size_t)V * C, -1, 1);
    CPU->embed_bwd(CPU, dtab.c, out.c, tc, N, C);
    GPU->embed_bwd(GPU, dtab.g, out.g, tg, N, C);
    check_pair("embed_bwd", &dtab, TOL32);
    pair_free(&tab);
    pair_free(&out);
    pair_free(&dtab);
    CPU->free(CPU, tc, (size_t)N * 4);
    GPU->free(GPU, tg, (size_t)N * 4);
}

/* The MoE row ops: gather with and without weights, scatter-add into distinct rows, row dots. */
static void test_rows(void **state)
{
    (void)state;
    int R = 150, C = 300, n = 97;
    int idx[97];
    for (int i = 0; i < n; i++)
        idx[i] = (i * 37 + 5) % R;   /* distinct: 37 is prime to 150 */
    int *ic = ints_on(CPU, idx, n), *ig = ints_on(GPU, idx, n);
    pair x = pair_rand((size_t)R * C, -1, 1), w = pair_rand((size_t)n, 0, 1), out = pair_rand((size_t)n * C, -1, 1);
    CPU->gather_rows(CPU, out.c, x.c, ic, NULL, n, C);
    GPU->gather_rows(GPU, out.g, x.g, ig, NULL, n, C);
    check_pair("gather_rows", &out, 0.0);
    CPU->gather_rows(CPU, out.c, x.c, ic, w.c, n, C);
    GPU->gather_rows(GPU, out.g, x.g, ig, w.g, n, C);
    check_pair("gather_rows_w", &out, TOL32);
    CPU->scatter_rows_acc(CPU, x.c, out.c, ic, w.c, n, C);
    GPU->scatter_rows_acc(GPU, x.g, out.g, ig, w.g, n, C);
    check_pair("scatter_rows_acc", &x, TOL32);
    pair d = pair_rand((size_t)n, -1, 1);
    CPU->rows_dot(CPU, d.c, out.c, x.c, n, C);
    GPU->rows_dot(GPU, d.g, out.g, x.g, n, C);
    check_pair("rows_dot", &d, TOL32);
    pair *all[] = {&x, &w, &out, &d};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
    CPU->free(CPU, ic, (size_t)n * 4);
    GPU->free(GPU, ig, (size_t)n * 4);
}

/* The Mamba-2 ops: conv with and without history (its update at row lengths), the scan with
 * checkpoints and lengths (the GPU's chunked form and its recurrence), its backward from
 * those checkpoints, the gated norm both ways, squared ReLU. B and C of a group are shared
 * by its heads (atomics on the GPU). */
/* The scan forward (state, checkpoints, padded rows) and backward at one shape; names
 * "ssm_scan_{fwd,bwd}_TAG...". */
static void scan_case(int B, int T, int H, int P, int G, int S, int chunk, int *lc, int *lg, const char *tag)
{
    int di = H * P, cd = di + 2 * G * S, N = B * T, nch = (T + chunk - 1) / chunk;
    pair x = pair_rand((size_t)N * cd, -1, 1), y = pair_rand((size_t)N * di, -1, 1);
    pair st = pair_rand((size_t)B * H * P * S, -1, 1), ck = pair_rand((size_t)B * nch * H * P * S, -1, 1);
    pair dt = pair_rand((size_t)N * H, -2, 1), dtb = pair_rand((size_t)H, -1, 1), alog = pair_rand((size_t)H, -1, 1.5f);
    pair Dk = pair_rand((size_t)H, 0.5f, 1.5f);
    char name[64];
#define NAME(what) (snprintf(name, sizeof name, "ssm_scan_%s_%s", what, tag), name)
    CPU->ssm_scan_fwd(CPU, y.c, ck.c, x.c, dt.c, dtb.c, alog.c, Dk.c, st.c, lc, B, T, H, P, G, S, chunk);
    GPU->ssm_scan_fwd(GPU, y.g, ck.g, x.g, dt.g, dtb.g, alog.g, Dk.g, st.g, lg, B, T, H, P, G, S, chunk);
    check_pair(NAME("fwd"), &y, TOL32);
    check_pair(NAME("fwd_state"), &st, TOL32);
    check_pair(NAME("fwd_ckpt"), &ck, TOL32);
    /* serving: no checkpoints (the GPU's chunk states in its scratch), on from the state */
    CPU->ssm_scan_fwd(CPU, y.c, NULL, x.c, dt.c, dtb.c, alog.c, Dk.c, st.c, lc, B, T, H, P, G, S, chunk);
    GPU->ssm_scan_fwd(GPU, y.g, NULL, x.g, dt.g, dtb.g, alog.g, Dk.g, st.g, lg, B, T, H, P, G, S, chunk);
    check_pair(NAME("fwd_nockpt"), &y, TOL32);
    check_pair(NAME("fwd_nockpt_state"), &st, TOL32);
    CPU->zero(CPU, st.c, st.n * 4);
    GPU->zero(GPU, st.g, st.n * 4);
    CPU->ssm_scan_fwd(CPU, y.c, ck.c, x.c, dt.c, dtb.c, alog.c, Dk.c, st.c, NULL, B, T, H, P, G, S, chunk);
    pair_sync_to_gpu(&ck);
    pair gy = pair_rand((size_t)N * di, -1, 1), dx = pair_rand((size_t)N * cd, -1, 1), ddt = pair_rand((size_t)N * H, -1, 1);
    pair gdtb = pair_rand((size_t)H, -1, 1), galog = pair_rand((size_t)H, -1, 1), gD = pair_rand((size_t)H, -1, 1);
    pair scr = pair_rand((size_t)B * H * (chunk + 2) * P * S, -1, 1);
    CPU->ssm_scan_bwd(CPU, dx.c, ddt.c, gdtb.c, galog.c, gD.c, gy.c, x.c, dt.c, dtb.c, alog.c, Dk.c, ck.c, scr.c, B, T, H,
                      P, G, S, chunk);
    GPU->ssm_scan_bwd(GPU, dx.g, ddt.g, gdtb.g, galog.g, gD.g, gy.g, x.g, dt.g, dtb.g, alog.g, Dk.g, ck.g, scr.g, B, T, H,
                      P, G, S, chunk);
    check_pair(NAME("bwd_dxbc"), &dx, TOL32);
    check_pair(NAME("bwd_ddt"), &ddt, TOL32);
    check_pair(NAME("bwd_ddt_bias"), &gdtb, TOL32);
    check_pair(NAME("bwd_dA_log"), &galog, TOL32);
    check_pair(NAME("bwd_dD"), &gD, TOL32);
#undef NAME
    pair *all[] = {&x, &y, &st, &ck, &dt, &dtb, &alog, &Dk, &gy, &dx, &ddt, &gdtb, &galog, &gD, &scr};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
}

static void test_ssm(void **state)
{
    (void)state;
    int B = 2, T = 37, H = 6, P = 5, G = 3, S = 7, K = 4, chunk = 16;
    int di = H * P, cd = di + 2 * G * S, N = B * T, nch = (T + chunk - 1) / chunk;
    int lens[2] = {T, 29};
    int *lc = ints_on(CPU, lens, B), *lg = ints_on(GPU, lens, B);
    pair x = pair_rand((size_t)N * cd, -1, 1), w = pair_rand((size_t)cd * K, -0.5f, 0.5f), bias = pair_rand((size_t)cd, -0.2f, 0.2f);
    pair hist = pair_rand((size_t)B * (K - 1) * cd, -1, 1), y = pair_rand((size_t)N * cd, -1, 1);
    CPU->ssm_conv_fwd(CPU, y.c, x.c, w.c, bias.c, hist.c, lc, B, T, cd, K);
    GPU->ssm_conv_fwd(GPU, y.g, x.g, w.g, bias.g, hist.g, lg, B, T, cd, K);
    check_pair("ssm_conv_fwd", &y, TOL32);
    check_pair("ssm_conv_fwd_state", &hist, TOL32);
    CPU->ssm_conv_fwd(CPU, y.c, x.c, w.c, bias.c, NULL, NULL, B, T, cd, K);
    GPU->ssm_conv_fwd(GPU, y.g, x.g, w.g, bias.g, NULL, NULL, B, T, cd, K);
    check_pair("ssm_conv_fwd_nohist", &y, TOL32);
    pair dy = pair_rand((size_t)N * cd, -1, 1), dx = pair_rand((size_t)N * cd, -1, 1);
    pair dw = pair_rand((size_t)cd * K, -1, 1), db = pair_rand((size_t)cd, -1, 1);
    CPU->ssm_conv_bwd(CPU, dx.c, dw.c, db.c, dy.c, x.c, w.c, bias.c, B, T, cd, K);
    GPU->ssm_conv_bwd(GPU, dx.g, dw.g, db.g, dy.g, x.g, w.g, bias.g, B, T, cd, K);
    check_pair("ssm_conv_bwd_dx", &dx, TOL32);
    check_pair("ssm_conv_bwd_dw", &dw, TOL32);
    check_pair("ssm_conv_bwd_dbias", &db, TOL32);
    pair dt = pair_rand((size_t)N * H, -2, 1), dtb = pair_rand((size_t)H, -1, 1), alog = pair_rand((size_t)H, -1, 1.5f);
    pair Dk = pair_rand((size_t)H, 0.5f, 1.5f), st = pair_rand((size_t)B * H * P * S, -1, 1);
    pair ys = pair_rand((size_t)N * di, -1, 1), ck = pair_rand((size_t)B * nch * H * P * S, -1, 1);
    CPU->ssm_scan_fwd(CPU, ys.c, ck.c, y.c, dt.c, dtb.c, alog.c, Dk.c, st.c, lc, B, T, H, P, G, S, chunk);
    GPU->ssm_scan_fwd(GPU, ys.g, ck.g, y.g, dt.g, dtb.g, alog.g, Dk.g, st.g, lg, B, T, H, P, G, S, chunk);
    check_pair("ssm_scan_fwd", &ys, TOL32);
    check_pair("ssm_scan_fwd_state", &st, TOL32);
    check_pair("ssm_scan_fwd_ckpt", &ck, TOL32);
    CPU->zero(CPU, st.c, st.n * 4);   /* the backward's zero start: checkpoints of all T steps */
    GPU->zero(GPU, st.g, st.n * 4);
    CPU->ssm_scan_fwd(CPU, ys.c, ck.c, y.c, dt.c, dtb.c, alog.c, Dk.c, st.c, NULL, B, T, H, P, G, S, chunk);
    GPU->ssm_scan_fwd(GPU, ys.g, ck.g, y.g, dt.g, dtb.g, alog.g, Dk.g, st.g, NULL, B, T, H, P, G, S, chunk);
    pair_sync_to_gpu(&ck);
    pair gy = pair_rand((size_t)N * di, -1, 1), dxbc = pair_rand((size_t)N * cd, -1, 1), ddt = pair_rand((size_t)N * H, -1, 1);
    pair gdtb = pair_rand((size_t)H, -1, 1), galog = pair_rand((size_t)H, -1, 1), gD = pair_rand((size_t)H, -1, 1);
    pair scr = pair_rand((size_t)B * H * (chunk + 2) * P * S, -1, 1);
    CPU->ssm_scan_bwd(CPU, dxbc.c, ddt.c, gdtb.c, galog.c, gD.c, gy.c, y.c, dt.c, dtb.c, alog.c, Dk.c, ck.c, scr.c, B, T,
                      H, P, G, S, chunk);
    GPU->ssm_scan_bwd(GPU, dxbc.g, ddt.g, gdtb.g, galog.g, gD.g, gy.g, y.g, dt.g, dtb.g, alog.g, Dk.g, ck.g, scr.g, B, T,
                      H, P, G, S, chunk);
    check_pair("ssm_scan_bwd_dxbc", &dxbc, TOL32);
    check_pair("ssm_scan_bwd_ddt", &ddt, TOL32);
    check_pair("ssm_scan_bwd_ddt_bias", &gdtb, TOL32);
    check_pair("ssm_scan_bwd_dA_log", &galog, TOL32);
    check_pair("ssm_scan_bwd_dD", &gD, TOL32);
    /* a state of several register rows per lane (S 80); the widest the registers hold (256) */
    scan_case(B, T, H, 3, G, 80, chunk, lc, lg, "s80");
    scan_case(B, T, H, 3, G, 256, chunk, lc, lg, "s256");
    /* rows of a chunk or more take the chunked form on the GPU: at a Nemotron-H head (P 64,
     * S 128: four shared tiles, eight outputs per thread), chunks of 32, the last one short */
    scan_case(1, 70, 2, 64, 1, 128, 32, NULL, NULL, "p64s128");
    {   /* rows longer than a window of chunks (32): two windows, the state carried across,
         * a row ending inside the second */
        int wl[2] = {533, 517}, *wc = ints_on(CPU, wl, B), *wg = ints_on(GPU, wl, B);
        scan_case(B, 533, H, P, G, S, chunk, wc, wg, "windows");
        CPU->free(CPU, wc, (size_t)B * 4);
        GPU->free(GPU, wg, (size_t)B * 4);
    }
    /* shorter rows the recurrence: decode's single step, and a row under one chunk */
    scan_case(B, 1, H, P, G, S, chunk, NULL, NULL, "decode");
    scan_case(B, 9, H, P, G, S, chunk, NULL, NULL, "short");
#if defined(AC_CUDA) && AC_CUDA
    /* the step-by-step kernels at a chunked shape, as cu_backend_set_scan forces them */
    assert_int_equal(cu_backend_set_scan(GPU, 7), -1);
    assert_int_equal(cu_backend_set_scan(CPU, CU_SCAN_RECURRENT), -1);
    assert_int_equal(cu_backend_set_scan(GPU, CU_SCAN_RECURRENT), 0);
    scan_case(B, T, H, P, G, S, chunk, lc, lg, "recurrent");
    assert_int_equal(cu_backend_set_scan(GPU, CU_SCAN_AUTO), 0);
    {   /* wider is refused with the reason, on a backend of its own (errors stay) */
        char e2[256];
        eng_backend *g2 = eng_backend_new("cuda:0", e2, sizeof e2);
        assert_non_null(g2);
        int S2 = 260, di2 = H * 3, cd2 = di2 + 2 * G * S2;
        float *x2 = g2->alloc(g2, (size_t)N * cd2 * 4), *y2 = g2->alloc(g2, (size_t)N * di2 * 4);
        float *p2 = g2->alloc(g2, (size_t)(B * T * H + 3 * H + B * H * 3 * S2) * 4);
        assert_true(x2 && y2 && p2);
        g2->ssm_scan_fwd(g2, y2, NULL, x2, p2, p2, p2, p2, p2 + B * T * H + 3 * H, NULL, B, T, H, 3, G, S2, chunk);
        assert_non_null(strstr(cu_backend_error(g2), "state size 260 above 256"));
        printf("CUDAOP %-28s refused: %s\n", "ssm_scan_fwd_s260", cu_backend_error(g2));
        g2->free(g2, x2, (size_t)N * cd2 * 4);
        g2->free(g2, y2, (size_t)N * di2 * 4);
        g2->free(g2, p2, (size_t)(B * T * H + 3 * H + B * H * 3 * S2) * 4);
        eng_backend_free(g2);
    }
#endif
    pair z = pair_rand((size_t)N * di, -2, 2), nw = pair_rand((size_t)di, 0.5f, 1.5f), out = pair_rand((size_t)N * di, -1, 1);
    pair rs = pair_rand((size_t)N * G, -1, 1);
    CPU->gated_norm_fwd(CPU, out.c, rs.c, ys.c, z.c, nw.c, N, di, G, 1e-5f);
    GPU->gated_norm_fwd(GPU, out.g, rs.g, ys.g, z.g, nw.g, N, di, G, 1e-5f);
    check_pair("gated_norm_fwd", &out, TOL32);
    check_pair("gated_norm_fwd_rstd", &rs, TOL32);
    pair_sync_to_gpu(&rs);
    pair gdy = pair_rand((size_t)N * di, -1, 1), gdz = pair_rand((size_t)N * di, -1, 1), gnw = pair_rand((size_t)di, -1, 1);
    CPU->gated_norm_bwd(CPU, gdy.c, gdz.c, gnw.c, gy.c, ys.c, z.c, nw.c, rs.c, N, di, G);
    GPU->gated_norm_bwd(GPU, gdy.g, gdz.g, gnw.g, gy.g, ys.g, z.g, nw.g, rs.g, N, di, G);
    check_pair("gated_norm_bwd_dy", &gdy, TOL32);
    check_pair("gated_norm_bwd_dz", &gdz, TOL32);
    check_pair("gated_norm_bwd_dw", &gnw, TOL32);
    CPU->relu2_fwd(CPU, out.c, z.c, out.n);
    GPU->relu2_fwd(GPU, out.g, z.g, out.n);
    check_pair("relu2_fwd", &out, TOL32);
    CPU->relu2_bwd(CPU, gdy.c, gy.c, z.c, gdy.n);
    GPU->relu2_bwd(GPU, gdy.g, gy.g, z.g, gdy.n);
    check_pair("relu2_bwd", &gdy, TOL32);
    pair *all[] = {&x, &w, &bias, &hist, &y, &dy, &dx, &dw, &db, &dt, &dtb, &alog, &Dk, &st, &ys, &ck, &gy, &dxbc,
                   &ddt, &gdtb, &galog, &gD, &scr, &z, &nw, &out, &rs, &gdy, &gdz, &gnw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
    CPU->free(CPU, lc, (size_t)B * 4);
    GPU->free(GPU, lg, (size_t)B * 4);
}

/* ---- attention --------------------------------------------------------------------- */

/* One forward + backward case. pos0/lens per row on the host; S the KV length. */
static void attn_case(const char *tag, int B, int T, int S, int Hq, int Hkv, int D, const int *pos0, const int *lens)
{
    float scale = 1.0f / sqrtf((float)D);
    size_t nq = (size_t)B * T * Hq * D, nkv = (size_t)B * S * Hkv * D, nl = (size_t)B * T * Hq;
    pair q = pair_rand(nq, -1.5f, 1.5f), k = pair_rand(nkv, -1.5f, 1.5f), v = pair_rand(nkv, -1, 1);
    pair o = pair_rand(nq, -1, 1), l = pair_rand(nl, -1, 1);
    int *p0c = ints_on(CPU, pos0, B), *p0g = ints_on(GPU, pos0, B);
    int *lc = ints_on(CPU, lens, B), *lg = ints_on(GPU, lens, B);
    char name[96];
    CPU->attn_fwd(CPU, o.c, l.c, q.c, k.c, v.c, p0c, lc, B, T, S, Hq, Hkv, D, scale);
    GPU->attn_fwd(GPU, o.g, l.g, q.g, k.g, v.g, p0g, lg, B, T, S, Hq, Hkv, D, scale);
    snprintf(name, sizeof name, "attn_fwd_%s_out", tag);
    check_pair(name, &o, TOL32);
    snprintf(name, sizeof name, "attn_fwd_%s_lse", tag);
    check_pair(name, &l, TOL32);
    /* lse may be NULL */
    pair o2 = pair_rand(nq, -1, 1);
    CPU->attn_fwd(CPU, o2.c, NULL, q.c, k.c, v.c, p0c, lc, B, T, S, Hq, Hkv, D, scale);
    GPU->attn_fwd(GPU, o2.g, NULL, q.g, k.g, v.g, p0g, lg, B, T, S, Hq, Hkv, D, scale);
    snprintf(name, sizeof name, "attn_fwd_%s_nolse", tag);
    check_pair(name, &o2, TOL32);
    /* the backward gets identical inputs on both: the CPU forward's out and lse (dk, dv
     * depend on dout.v - dout.out, which cancels; GPU forward differences would show) */
    pair_sync_to_gpu(&o);
    pair_sync_to_gpu(&l);
    pair dout = pair_rand(nq, -1, 1), dq = pair_rand(nq, -1, 1), dk = pair_rand(nkv, -1, 1), dv = pair_rand(nkv, -1, 1);
    CPU->attn_bwd(CPU, dq.c, dk.c, dv.c, dout.c, q.c, k.c, v.c, o.c, l.c, p0c, lc, B, T, S, Hq, Hkv, D, scale);
    GPU->attn_bwd(GPU, dq.g, dk.g, dv.g, dout.g, q.g, k.g, v.g, o.g, l.g, p0g, lg, B, T, S, Hq, Hkv, D, scale);
    snprintf(name, sizeof name, "attn_bwd_%s_dq", tag);
    check_pair(name, &dq, TOL32);
    snprintf(name, sizeof name, "attn_bwd_%s_dk", tag);
    check_pair(name, &dk, TOL32);
    snprintf(name, sizeof name, "attn_bwd_%s_dv", tag);
    check_pair(name, &dv, TOL32);
    pair *all[] = {&q, &k, &v, &o, &l, &o2, &dout, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
    CPU->free(CPU, p0c, (size_t)B * 4);
    GPU->free(GPU, p0g, (size_t)B * 4);
    CPU->free(CPU, lc, (size_t)B * 4);
    GPU->free(GPU, lg, (size_t)B * 4);
}

static void test_attention_prefill(void **state)
{
    (void)state;
    int z2[2] = {0, 0}, full[2] = {45, 45}, pad[2] = {45, 17};
    attn_case("prefill_d64_gqa3", 2, 45, 45, 6, 2, 64, z2, full);
    attn_case("prefill_d64_padded", 2, 45, 45, 6, 2, 64, z2, pad);
    attn_case("prefill_d8_stories", 2, 45, 45, 8, 4, 8, z2, pad);
    int z1[1] = {0}, l1[1] = {70};
    attn_case("prefill_d128_mha", 1, 70, 70, 4, 4, 128, z1, l1);
    attn_case("prefill_d48", 1, 70, 70, 3, 1, 48, z1, l1);
    /* a chunk appended to a cache: queries start at pos0 within capacity S */
    int p0[2] = {30, 5}, lc[2] = {20, 11};
    attn_case("chunk_cached", 2, 20, 64, 6, 3, 64, p0, lc);
    int zl[1] = {0}, ll[1] = {300};
    attn_case("prefill_long300", 1, 300, 300, 2, 1, 64, zl, ll);
}

static void test_attention_decode(void **state)
{
    (void)state;
    int p0[3] = {0, 77, 999}, l1[3] = {1, 1, 1};
    attn_case("decode_t1_d64", 3, 1, 1000, 9, 3, 64, p0, l1);
    attn_case("decode_t1_d8", 3, 1, 1000, 8, 4, 8, p0, l1);
    attn_case("decode_t1_d128", 3, 1, 1000, 4, 2, 128, p0, l1);
    int p3[2] = {10, 500}, l3[2] = {3, 2};
    attn_case("decode_t3_padded", 2, 3, 600, 6, 2, 64, p3, l3);
    int p4[1] = {4090}, l4[1] = {1};
    attn_case("decode_t1_s4096", 1, 1, 4096, 9, 3, 64, p4, l4);
}

/* ---- losses ------------------------------------------------------------------------ */

static void test_losses(void **state)
{
    (void)state;
    int R = 13, V = 4099;
    int tg[13];
    for (int r = 0; r < R; r++)
        tg[r] = r == 3 ? -1 : (r == 7 ? V + 5 : (int)(urand() * V));   /* ignored rows */
    int *tc = ints_on(CPU, tg, R), *tgd = ints_on(GPU, tg, R);
    pair s = pair_rand((size_t)R * V, -6, 6), t = pair_rand((size_t)R * V, -6, 6);
    pair loss = pair_rand(R, -1, 1), d = pair_rand((size_t)R * V, -1, 1);
    CPU->xent(CPU, loss.c, d.c, 0.37f, s.c, tc, R, V);
    GPU->xent(GPU, loss.g, d.g, 0.37f, s.g, tgd, R, V);
    check_pair("xent_loss", &loss, TOL32);
    check_pair("xent_dlogits", &d, TOL32);
    CPU->xent(CPU, loss.c, NULL, 1.0f, t.c, tc, R, V);
    GPU->xent(GPU, loss.g, NULL, 1.0f, t.g, tgd, R, V);
    check_pair("xent_loss_fwd_only", &loss, TOL32);
    CPU->kl(CPU, loss.c, d.c, 0.21f, s.c, t.c, tc, R, V, 2.0f);
    GPU->kl(GPU, loss.g, d.g, 0.21f, s.g, t.g, tgd, R, V, 2.0f);
    check_pair("kl_tau2_loss", &loss, TOL32);
    check_pair("kl_tau2_dlogits", &d, TOL32);
    CPU->kl(CPU, loss.c, d.c, 1.0f, s.c, t.c, NULL, R, V, 1.0f);
    GPU->kl(GPU, loss.g, d.g, 1.0f, s.g, t.g, NULL, R, V, 1.0f);
    check_pair("kl_tau1_all_rows_loss", &loss, TOL32);
    check_pair("kl_tau1_all_rows_dlogits", &d, TOL32);
    /* cosine distance: student rows [R,C] against the first C of a teacher's [R,ldb] rows,
       through channel weights; row 5 of the student is zero (no loss, no gradient) */
    int C = 300, ldb = 333;
    pair a = pair_rand((size_t)R * C, -2, 2), b = pair_rand((size_t)R * ldb, -2, 2);
    pair da = pair_rand((size_t)R * C, -1, 1), w = pair_rand((size_t)C, 0, 3);
    CPU->zero(CPU, a.c + 5 * C, sizeof(float) * (size_t)C);
    GPU->zero(GPU, a.g + 5 * C, sizeof(float) * (size_t)C);
    CPU->cosd(CPU, loss.c, da.c, 0.3f, a.c, b.c, ldb, w.c, R, C);
    GPU->cosd(GPU, loss.g, da.g, 0.3f, a.g, b.g, ldb, w.g, R, C);
    check_pair("cosd_loss", &loss, TOL32);
    check_pair("cosd_da", &da, TOL32);
    CPU->cosd(CPU, loss.c, NULL, 1.0f, da.c, b.c, ldb, w.c, R, C);
    GPU->cosd(GPU, loss.g, NULL, 1.0f, da.g, b.g, ldb, w.g, R, C);
    check_pair("cosd_loss_fwd_only", &loss, TOL32);
    pair *all[] = {&s, &t, &loss, &d, &a, &b, &da, &w};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
    CPU->free(CPU, tc, (size_t)R * 4);
    GPU->free(GPU, tgd, (size_t)R * 4);
}

/* ---- elementwise, masks, reductions, AdamW ---------------------------------------- */

static void test_elementwise(void **state)
{
    (void)state;
    size_t n = 70001;
    pair a = pair_rand(n, -1, 1), b = pair_rand(n, -1, 1), y = pair_rand(n, -1, 1);
    CPU->add(CPU, y.c, a.c, b.c, n);
    GPU->add(GPU, y.g, a.g, b.g, n);
    check_pair("add", &y, TOL32);
    CPU->add(CPU, y.c, y.c, b.c, n);   /* y may alias */
    GPU->add(GPU, y.g, y.g, b.g, n);
    check_pair("add_alias", &y, TOL32);
    CPU->axpy(CPU, y.c, -0.3f, a.c, n);
    GPU->axpy(GPU, y.g, -0.3f, a.g, n);
    check_pair("axpy", &y, TOL32);
    pair al = pair_rand(1, 0.5f, 2);
    CPU->axpy_dev(CPU, y.c, al.c, b.c, n);
    GPU->axpy_dev(GPU, y.g, al.g, b.g, n);
    check_pair("axpy_dev", &y, TOL32);
    CPU->scale(CPU, y.c, 1.7f, n);
    GPU->scale(GPU, y.g, 1.7f, n);
    check_pair("scale", &y, TOL32);
    pair acc = pair_rand(1, 1, 2);
    CPU->dot_acc(CPU, acc.c, a.c, b.c, n);
    GPU->dot_acc(GPU, acc.g, a.g, b.g, n);
    check_pair("dot_acc", &acc, TOL32);
    double sc = CPU->sumsq(CPU, a.c, n), sg = GPU->sumsq(GPU, a.g, n);
    check("sumsq", fabs(sg - sc) / sc, TOL32);
    CPU->fill(CPU, y.c, 0.625f, n);
    GPU->fill(GPU, y.g, 0.625f, n);
    check_pair("fill", &y, 0.0);
    int N = 33, M = 96;
    pair bias = pair_rand(M, -1, 1), z = pair_rand((size_t)N * M, -1, 1), cs = pair_rand(M, -1, 1);
    CPU->bias_add(CPU, z.c, bias.c, N, M);
    GPU->bias_add(GPU, z.g, bias.g, N, M);
    check_pair("bias_add", &z, TOL32);
    CPU->colsum_acc(CPU, cs.c, z.c, N, M);
    GPU->colsum_acc(GPU, cs.g, z.g, N, M);
    check_pair("colsum_acc", &cs, TOL32);
    pair *all[] = {&a, &b, &y, &al, &acc, &bias, &z, &cs};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
}

static void mask_case(const char *tag, int N, int G, int D)
{
    char name[64];
    size_t n = (size_t)N * G * D;
    pair x = pair_rand(n, -1, 1), m = pair_rand(G, 0, 1), y = pair_rand(n, -1, 1);
    CPU->mask_fwd(CPU, y.c, x.c, m.c, N, G, D);
    GPU->mask_fwd(GPU, y.g, x.g, m.g, N, G, D);
    snprintf(name, sizeof name, "mask_fwd_%s", tag);
    check_pair(name, &y, TOL32);
    pair dy = pair_rand(n, -1, 1), dm = pair_rand(G, -1, 1), dx = pair_rand(n, -1, 1);
    CPU->mask_bwd(CPU, dx.c, dm.c, dy.c, x.c, m.c, N, G, D);
    GPU->mask_bwd(GPU, dx.g, dm.g, dy.g, x.g, m.g, N, G, D);
    snprintf(name, sizeof name, "mask_bwd_%s_dx", tag);
    check_pair(name, &dx, TOL32);
    snprintf(name, sizeof name, "mask_bwd_%s_dm", tag);
    check_pair(name, &dm, TOL32);
    /* dx aliasing dy, dm NULL */
    CPU->mask_bwd(CPU, dy.c, NULL, dy.c, x.c, m.c, N, G, D);
    GPU->mask_bwd(GPU, dy.g, NULL, dy.g, x.g, m.g, N, G, D);
    snprintf(name, sizeof name, "mask_bwd_%s_alias", tag);
    check_pair(name, &dy, TOL32);
    pair gs = pair_rand(G, 0, 1);
    CPU->group_norm_sum(CPU, gs.c, x.c, N, G, D);
    GPU->group_norm_sum(GPU, gs.g, x.g, N, G, D);
    snprintf(name, sizeof name, "group_norm_sum_%s", tag);
    check_pair(name, &gs, TOL32);
    pair *all[] = {&x, &m, &y, &dy, &dm, &dx, &gs};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
}

static void test_masks(void **state)
{
    (void)state;
    mask_case("hidden_d1", 75, 576, 1);
    mask_case("heads_d64", 75, 9, 64);
    mask_case("ffn_d1", 40, 1536, 1);
}

static void test_adamw(void **state)
{
    (void)state;
    size_t n = 50021;
    pair p = pair_rand(n, -1, 1), g = pair_rand(n, -1, 1), m = pair_rand(n, -0.1f, 0.1f), v = pair_rand(n, 0.001f, 0.01f);
    for (int t = 1; t <= 3; t++) {
        float b1 = 0.9f, b2 = 0.95f, bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
        CPU->adamw(CPU, p.c, g.c, m.c, v.c, n, 1e-3f, b1, b2, 1e-8f, 0.1f, bc1, bc2, 0.5f);
        GPU->adamw(GPU, p.g, g.g, m.g, v.g, n, 1e-3f, b1, b2, 1e-8f, 0.1f, bc1, bc2, 0.5f);
    }
    check_pair("adamw_p", &p, TOL32);
    check_pair("adamw_m", &m, TOL32);
    check_pair("adamw_v", &v, TOL32);
    pair *all[] = {&p, &g, &m, &v};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(all[i]);
}

/* A failing op records its error; eng_backend_check reports it (on a separate backend,
 * since the first error sticks for the backend's life). */
static void test_error_reporting(void **state)
{
    (void)state;
    char err[256] = "";
    eng_backend *be = eng_backend_new("cuda:0", err, sizeof err);
    assert_non_null(be);
    assert_int_equal(eng_backend_check(be, err, sizeof err), 0);
    int one = 1;
    int *p0 = ints_on(be, &one, 1), *ln = ints_on(be, &one, 1);
    be->attn_fwd(be, NULL, NULL, NULL, NULL, NULL, p0, ln, 1, 1, 1, 2, 1, 256, 1.0f);   /* head_dim 256: unsupported */
    assert_int_equal(eng_backend_check(be, err, sizeof err), -1);
    printf("reported: %s\n", err);
    assert_non_null(strstr(err, "cuda:0"));
    assert_non_null(strstr(err, "head_dim"));
    be->free(be, p0, 4);
    be->free(be, ln, 4);
    eng_backend_free(be);
    assert_int_equal(eng_backend_check(CPU, err, sizeof err), 0);
}

static void test_leaks(void **state)
{
    (void)state;
    GPU->sync(GPU);
    assert_int_equal(GPU->cur_bytes, 0);
    assert_int_equal(CPU->cur_bytes, 0);
}

int main(void)
{
    char err[256] = "";
    GPU = eng_backend_new("cuda:0", err, sizeof err);
    if (!GPU) {
        printf("SKIPPED: no CUDA device (%s)\n", err);
        return 0;
    }
    CPU = eng_backend_cpu_new(0);
    if (!CPU) {
        fprintf(stderr, "cpu backend: out of memory\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_gemm_fp32),
#if defined(AC_CUDA) && AC_CUDA
        cmocka_unit_test(test_gemm_half),
#endif
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_ssm),
        cmocka_unit_test(test_attention_prefill),
        cmocka_unit_test(test_attention_decode),
        cmocka_unit_test(test_losses),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_masks),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_error_reporting),
        cmocka_unit_test(test_leaks),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    eng_backend_free(GPU);
    eng_backend_free(CPU);
    return rc;
}
