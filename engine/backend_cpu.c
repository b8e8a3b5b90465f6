/* engine/backend_cpu.c — the reference backend: host memory, OpenBLAS sgemm for dense
 * algebra, OpenMP loops for everything else. Every op follows the contract written in
 * engine/backend.h; reductions accumulate in double where a sum runs over a long axis.
 * Thread counts are process-wide (OpenMP's setting), so two CPU backends with different
 * thread counts in one process share the last setting; OpenBLAS itself runs on one thread
 * per call and GEMMs are split across the OpenMP threads (see cpu_gemm).
 */
#include "engine/backend.h"
#include "engine/cpu_mm16.h"
#include "engine/cpu_ssm.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* exp over 16 floats at once with GCC vector extensions (libm's expf does not vectorize
 * without -ffast-math): Cephes' range reduction and degree-6 polynomial, about 1 ulp on
 * [-87, 88]; inputs are clamped to that range (exp(-87.3) ~ 1e-38 stands for 0). */
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline v16f vsel(v16i m, v16f a, v16f b)   /* m ? a : b, m lanes all-ones or zero */
{
    return (v16f)(((v16i)a & m) | ((v16i)b & ~m));
}

static inline v16f vexp(v16f x)
{
    const v16f lo = (v16f){0} - 87.3f, hi = (v16f){0} + 88.7f;
    x = vsel(x < lo, lo, x);
    x = vsel(x > hi, hi, x);
    v16f t = x * 1.44269504088896341f + 0.5f;
    v16i i = __builtin_convertvector(t, v16i);                 /* truncates toward zero */
    i += (v16i)(__builtin_convertvector(i, v16f) > t);        /* floor: -1 where it rounded up */
    v16f n = __builtin_convertvector(i, v16f);
    v16f r = x - n * 0.693359375f + n * 2.12194440e-4f, r2 = r * r;
    v16f p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r2 + r + 1.0f;
    return p * (v16f)((i + 127) << 23);
}

static inline v16f vload(const float *p)
{
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vstore(float *p, v16f v)
{
    memcpy(p, &v, sizeof v);
}

static inline double vsum(v16f v)
{
    double s = 0;
    for (int j = 0; j < 16; j++)
        s += v[j];
    return s;
}

/* sum_i exp(a * x[i] + b) over n floats, in float per block of 1024 and double across blocks. */
static double sum_exp(const float *x, size_t n, float a, float b)
{
    double s = 0;
    size_t i = 0;
    while (i + 16 <= n) {
        v16f acc = {0};
        size_t end = i + 1024 < n ? i + 1024 : n;
        for (; i + 16 <= end; i += 16)
            acc += vexp(vload(x + i) * a + b);
        s += vsum(acc);
    }
    for (; i < n; i++)
        s += expf(a * x[i] + b);
    return s;
}

/* r[j] = exp(r[j] - mx) in place over n floats; returns the sum. */
static float exp_shift_sum(float *r, int n, float mx)
{
    v16f acc = {0};
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        v16f e = vexp(vload(r + j) - mx);
        vstore(r + j, e);
        acc += e;
    }
    float sum = (float)vsum(acc);
    for (; j < n; j++) {
        r[j] = expf(r[j] - mx);
        sum += r[j];
    }
    return sum;
}

/* ---- memory ------------------------------------------------------------------------ */

/* Blocks of 2 MiB and more are 2 MiB aligned and asked to be backed by transparent huge
 * pages: streaming weights through 4 KiB pages costs a third of the bandwidth of a
 * decode step in TLB misses. The accounting counts the requested bytes. */
#define HUGE_BYTES ((size_t)2 << 20)

static void *cpu_alloc(eng_backend *be, size_t bytes)
{
    void *p;
    if (bytes >= HUGE_BYTES) {
        size_t rounded = (bytes + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1);
        p = aligned_alloc(HUGE_BYTES, rounded);
        if (p)
            (void)madvise(p, rounded, MADV_HUGEPAGE);   /* advisory: failure only costs speed */
    } else {
        size_t rounded = (bytes + 63) & ~(size_t)63;
        p = aligned_alloc(64, rounded ? rounded : 64);
    }
    if (!p)
        return NULL;
    be->cur_bytes += bytes;
    if (be->cur_bytes > be->peak_bytes)
        be->peak_bytes = be->cur_bytes;
    return p;
}

static void cpu_free(eng_backend *be, void *p, size_t bytes)
{
    if (!p)
        return;
    free(p);
    be->cur_bytes -= bytes;
}

static void cpu_copy(eng_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes && dst != src)
        memmove(dst, src, bytes);
}

static void cpu_zero(eng_backend *be, void *dst, size_t bytes)
{
    (void)be;
    if (bytes)
        memset(dst, 0, bytes);
}

static void cpu_sync(eng_backend *be)
{
    (void)be;
}

static void cpu_destroy(eng_backend *be)
{
    cpu_impl_free(be->impl);
    free(be);
}

/* ---- dense algebra ----------------------------------------------------------------- */

/* Decode shapes (M <= SMALL_M rows, weights [N, K]) take cpu_gemm_rows (cpu_mm16.h): one
 * streaming pass over the weights. For them OpenBLAS 0.3.21's sgemm/sgemv pack or block the
 * weights: measured here, M = 1 reaches about 2x and M = 8 about 1.25x its rate. */
#define SMALL_M CPU_ROWS_MAX_M

/* One thread pool only: OpenBLAS runs single-threaded and each GEMM is split into
 * column (or row) slices across the OpenMP threads. Two pools that both spin after
 * their work (OpenBLAS' pthreads and libgomp's) starve each other on a busy machine. */
static void cpu_gemm(eng_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
    int nth = be->threads > 1 ? be->threads : 1;
    double flops = 2.0 * M * (double)N * K;
    cpu_impl *ci = be->impl;
    int r16 = ci ? ci->type : 0;
    if (M <= SMALL_M && tb && !ta) {
        /* Few rows (decode): one streaming pass over the weights, split by output columns.
         * At 16 bits, the same pass on rounded operands: the kept 16-bit copy of weights in
         * a constant range, else the fp32 weights rounded as they stream. */
        if (r16 && !(A = cpu_impl_round_rows(ci, A, lda, M, K))) {
            cpu_mm16_fail(ci->mm, "out of memory for the rounded rows of a GEMM");
            return;
        }
        if (r16)
            lda = K;
        const uint16_t *w16 = r16 ? cpu_mm16_const_copy(ci->mm, B, N, K, ldb) : NULL;   /* half the bytes */
        int parts = nth > 1 && flops >= 2e5 ? nth : 1;
        int chunk = ((N + parts - 1) / parts + 15) / 16 * 16;
#pragma omp parallel for schedule(static) num_threads(parts) if (parts > 1)
        for (int p = 0; p < parts; p++) {
            int n0 = p * chunk, len = N - n0 < chunk ? N - n0 : chunk;
            /* one row at bf16 on AVX512-BF16: 32 products an instruction (with more rows the
             * portable kernel measured faster: each output's sums end in M reductions) */
            if (len > 0 && r16 && ci->kp && M == 1)
                cpu_gemm_rows_dp(w16 ? NULL : B + (size_t)n0 * ldb, w16 ? w16 + (size_t)n0 * K : NULL,
                                 w16 ? K : ldb, ci->rows16, ci->kp, M, C + n0, ldc, len, K, alpha, beta);
            else if (len > 0)
                cpu_gemm_rows(r16, w16 ? NULL : B + (size_t)n0 * ldb, w16 ? w16 + (size_t)n0 * K : NULL,
                              w16 ? K : ldb, A, lda, M, C + n0, ldc, len, K, alpha, beta);
        }
        return;
    }
    if (r16) {    /* failures are kept for eng_backend_check */
        (void)cpu_mm16_gemm(ci->mm, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (M == 1) {
        /* One row, other layouts: a matrix-vector product (sgemm would pack the matrix). */
        int inc_a = ta ? lda : 1;
        int parts = nth > 1 && flops >= 2e5 ? nth : 1;
        int chunk = ((N + parts - 1) / parts + 15) / 16 * 16;
#pragma omp parallel for schedule(static) num_threads(parts) if (parts > 1)
        for (int p = 0; p < parts; p++) {
            int n0 = p * chunk, len = N - n0 < chunk ? N - n0 : chunk;
            if (len <= 0)
                continue;
            if (beta == 0.0f)   /* ignore old contents, even NaN */
                memset(C + n0, 0, sizeof(float) * (size_t)len);
            if (tb)
                cblas_sgemv(CblasRowMajor, CblasNoTrans, len, K, alpha, B + (size_t)n0 * ldb, ldb, A, inc_a, beta,
                            C + n0, 1);
            else      /* B stored [K,N]: C = B[:, n0:n0+len]^T a */
                cblas_sgemv(CblasRowMajor, CblasTrans, K, len, alpha, B + n0, ldb, A, inc_a, beta, C + n0, 1);
        }
        return;
    }
    if (nth == 1 || flops < 2e5) {
        cblas_sgemm(CblasRowMajor, opa, opb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* Split the larger output dimension into nth slices, multiples of 16. */
    int split_n = N >= M;
    int dim = split_n ? N : M;
    int chunk = ((dim + nth - 1) / nth + 15) / 16 * 16;
    int parts = (dim + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) num_threads(nth)
    for (int p = 0; p < parts; p++) {
        int s0 = p * chunk, len = dim - s0 < chunk ? dim - s0 : chunk;
        if (split_n) {
            const float *Bp = tb ? B + (size_t)s0 * ldb : B + s0;
            cblas_sgemm(CblasRowMajor, opa, opb, M, len, K, alpha, A, lda, Bp, ldb, beta, C + s0, ldc);
        } else {
            const float *Ap = ta ? A + s0 : A + (size_t)s0 * lda;
            cblas_sgemm(CblasRowMajor, opa, opb, len, N, K, alpha, Ap, lda, B, ldb, beta, C + (size_t)s0 * ldc, ldc);
        }
    }
}

/* ---- normalization ----------------------------------------------------------------- */

static void cpu_rmsnorm_fwd(eng_backend *be, float *y, float *rstd, const float *x, const float *w,
                            int N, int C, float n_eff, float eps)
{
    (void)be;
#pragma omp parallel for schedule(static) PAR_IF((double)N * C)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *yr = y + (size_t)n * C;
        double ss = 0;
        for (int c = 0; c < C; c++)
            ss += (double)xr[c] * xr[c];
        float r = (float)(1.0 / sqrt(ss / n_eff + eps));
        if (rstd)
            rstd[n] = r;
#pragma omp simd
        for (int c = 0; c < C; c++)
            yr[c] = xr[c] * r * w[c];
    }
}

static void cpu_rmsnorm_bwd(eng_backend *be, float *dx, float *dw, float *d_neff, const float *dy,
                            const float *x, const float *w, const float *rstd, int N, int C, float n_eff)
{
    (void)be;
    double dn = 0;
#pragma omp parallel for schedule(static) reduction(+:dn) PAR_IF((double)N * C)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *gr = dy + (size_t)n * C;
        float *dr = dx + (size_t)n * C;
        double s = 0, ss = 0;
        for (int c = 0; c < C; c++) {
            s += (double)gr[c] * w[c] * xr[c];
            ss += (double)xr[c] * xr[c];
        }
        double r = rstd[n];
        float k = (float)(r * r * r / n_eff * s);
        float rf = (float)r;
#pragma omp simd
        for (int c = 0; c < C; c++)
            dr[c] += rf * w[c] * gr[c] - xr[c] * k;
        dn += r * r * r * ss / (2.0 * (double)n_eff * n_eff) * s;
    }
    if (d_neff)
        *d_neff += (float)dn;
    if (dw) {
#pragma omp parallel for schedule(static) PAR_IF((double)N * C)
        for (int c0 = 0; c0 < C; c0 += 64) {
            int c1 = c0 + 64 < C ? c0 + 64 : C;
            double acc[64] = {0};
            for (int n = 0; n < N; n++) {
                const float *xr = x + (size_t)n * C, *gr = dy + (size_t)n * C;
                float r = rstd[n];
                for (int c = c0; c < c1; c++)
                    acc[c - c0] += gr[c] * xr[c] * r;
            }
            for (int c = c0; c < c1; c++)
                dw[c] += (float)acc[c - c0];
        }
    }
}

/* ---- RoPE ---------------------------------------------------------------------------- */

/* Angles are formed in double and reduced to [0, 2pi) before a float sincos, so large
 * positions keep full float precision. sign = +1 forward, -1 backward. */
static void rope_apply(float *x, const int *pos, const float *inv_freq, int N, int H, int D, float sign)
{
    int half = D / 2;
#pragma omp parallel PAR_IF((double)N * H * D)
    {
        float *cs = malloc(sizeof(float) * (size_t)D);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            if (!cs)
                continue;
            for (int i = 0; i < half; i++) {
                double ang = (double)pos[n] * (double)inv_freq[i];
                ang -= 2.0 * M_PI * floor(ang / (2.0 * M_PI));
                cs[i] = (float)cos(ang);
                cs[half + i] = sign * (float)sin(ang);
            }
            for (int h = 0; h < H; h++) {
                float *v = x + ((size_t)n * H + h) * D;
#pragma omp simd
                for (int i = 0; i < half; i++) {
                    float x1 = v[i], x2 = v[i + half], c = cs[i], s = cs[half + i];
                    v[i] = x1 * c - x2 * s;
                    v[i + half] = x2 * c + x1 * s;
                }
            }
        }
        free(cs);
    }
}

static void cpu_rope_fwd(eng_backend *be, float *x, const int *pos, const float *inv_freq, int N, int H, int D)
{
    (void)be;
    rope_apply(x, pos, inv_freq, N, H, D, 1.0f);
}

static void cpu_rope_bwd(eng_backend *be, float *dx, const int *pos, const float *inv_freq, int N, int H, int D)
{
    (void)be;
    rope_apply(dx, pos, inv_freq, N, H, D, -1.0f);
}

/* ---- attention --------------------------------------------------------------------- */

static inline float dotf(const float *a, const float *b, int D)
{
    float s = 0;
#pragma omp simd reduction(+:s)
    for (int d = 0; d < D; d++)
        s += a[d] * b[d];
    return s;
}

/* One query row: softmax over keys 0..nk-1 (stride ks between keys), writes o and
 * returns the log-sum-exp. sc is a scratch of nk floats. */
static float attn_row(float *o, const float *q, const float *k, const float *v, size_t ks,
                      int nk, int D, float scale, float *sc)
{
    float mx = -INFINITY;
    for (int j = 0; j < nk; j++) {
        float s = dotf(q, k + (size_t)j * ks, D) * scale;
        sc[j] = s;
        if (s > mx)
            mx = s;
    }
    float sum = exp_shift_sum(sc, nk, mx);
    float inv = 1.0f / sum;
    for (int d = 0; d < D; d++)
        o[d] = 0;
    for (int j = 0; j < nk; j++) {
        const float *vr = v + (size_t)j * ks;
        float p = sc[j] * inv;
#pragma omp simd
        for (int d = 0; d < D; d++)
            o[d] += p * vr[d];
    }
    return mx + logf(sum);
}

/* Forward in query tiles of ENG_CPU_ATTN_ROWS rows of one (row b, head h): scores of the
 * tile against the keys its last row may see come from one sgemm into the thread's
 * [ENG_CPU_ATTN_ROWS, S] scratch, are masked and normalized per row, and one more sgemm
 * forms the outputs. Tiles with fewer than 4 valid rows (decode) use the row kernel. */
static void cpu_attn_fwd(eng_backend *be, float *out, float *lse, const float *q, const float *k,
                         const float *v, const int *pos0, const int *lens,
                         int B, int T, int S, int Hq, int Hkv, int D, float scale)
{
    int nth = omp_get_max_threads();
    const int QB = ENG_CPU_ATTN_ROWS;
    size_t per = (size_t)S * QB;
    size_t scratch_bytes = sizeof(float) * per * (size_t)nth;
    float *scratch = cpu_alloc(be, scratch_bytes);
    int grp = Hq / Hkv, tiles = (T + QB - 1) / QB;
    size_t ks = (size_t)Hkv * D, qs = (size_t)Hq * D;
    long total = (long)B * Hq * tiles;
#pragma omp parallel PAR_IF((double)B * T * Hq * S * D / 2)
    {
        float *sc = scratch ? scratch + per * omp_get_thread_num() : malloc(sizeof(float) * per);
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < total; task++) {
            int tile = (int)(task % tiles);
            int h = (int)((task / tiles) % Hq);
            int b = (int)(task / ((long)tiles * Hq));
            int t0 = tile * QB, t1 = t0 + QB < T ? t0 + QB : T;
            int tv = t1 < lens[b] ? t1 : lens[b];          /* valid rows are t0..tv-1 */
            for (int t = (tv > t0 ? tv : t0); t < t1; t++) {
                size_t idx = ((size_t)b * T + t) * Hq + h;
                memset(out + idx * D, 0, sizeof(float) * (size_t)D);
                if (lse)
                    lse[idx] = 0;
            }
            int nq = tv - t0;
            if (nq <= 0 || !sc)
                continue;
            int hk = h / grp;
            const float *kb = k + (size_t)b * S * ks + (size_t)hk * D;
            const float *vb = v + (size_t)b * S * ks + (size_t)hk * D;
            size_t idx0 = ((size_t)b * T + t0) * Hq + h;
            if (nq < 4) {
                for (int i = 0; i < nq; i++) {
                    size_t idx = idx0 + (size_t)i * Hq;
                    int nk = pos0[b] + t0 + i + 1;
                    float l = attn_row(out + idx * D, q + idx * D, kb, vb, ks, nk < S ? nk : S, D, scale, sc);
                    if (lse)
                        lse[idx] = l;
                }
                continue;
            }
            int nk = pos0[b] + tv;
            if (nk > S)
                nk = S;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, scale, q + idx0 * D, (int)qs, kb,
                        (int)ks, 0.0f, sc, nk);
            for (int i = 0; i < nq; i++) {
                float *r = sc + (size_t)i * nk;
                int lim = pos0[b] + t0 + i + 1;
                if (lim > nk)
                    lim = nk;
                float mx = -INFINITY;
                for (int j = 0; j < lim; j++)
                    mx = r[j] > mx ? r[j] : mx;
                float sum = exp_shift_sum(r, lim, mx);
                float inv = 1.0f / sum;
                for (int j = 0; j < lim; j++)
                    r[j] *= inv;
                for (int j = lim; j < nk; j++)
                    r[j] = 0;
                if (lse)
                    lse[idx0 + (size_t)i * Hq] = mx + logf(sum);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, 1.0f, sc, nk, vb, (int)ks, 0.0f,
                        out + idx0 * D, (int)qs);
        }
        if (!scratch)
            free(sc);
    }
    cpu_free(be, scratch, scratch_bytes);
}

/* Backward in the forward's tiles: for each query tile of one head, P is recomputed from
 * the saved log-sum-exp (one sgemm), dP = dO V^T (one sgemm), dS = P (dP - rowsum(dO O)),
 * then dQ = dS K, dK += dS^T Q, dV += P^T dO (three sgemms). Each (b, KV head) is owned by
 * one thread, so its dK/dV rows have a single writer. Scratch: two tiles per thread. */
static void cpu_attn_bwd(eng_backend *be, float *dq, float *dk, float *dv, const float *dout,
                         const float *q, const float *k, const float *v, const float *out,
                         const float *lse, const int *pos0, const int *lens,
                         int B, int T, int S, int Hq, int Hkv, int D, float scale)
{
    int nth = omp_get_max_threads();
    const int QB = ENG_CPU_ATTN_ROWS;
    size_t per = 2 * (size_t)S * QB;
    size_t scratch_bytes = sizeof(float) * per * (size_t)nth;
    float *scratch = cpu_alloc(be, scratch_bytes);
    int grp = Hq / Hkv, tiles = (T + QB - 1) / QB;
    size_t ks = (size_t)Hkv * D, qs = (size_t)Hq * D;
#pragma omp parallel for schedule(dynamic, 1) PAR_IF((double)B * Hq * T * T * D)
    for (int bh = 0; bh < B * Hkv; bh++) {
        int b = bh / Hkv, hk = bh % Hkv;
        float *P = scratch ? scratch + per * omp_get_thread_num() : malloc(sizeof(float) * per);
        float *dP = P ? P + (size_t)S * QB : NULL;
        float *dkb = dk + (size_t)b * S * ks + (size_t)hk * D;
        float *dvb = dv + (size_t)b * S * ks + (size_t)hk * D;
        const float *kb = k + (size_t)b * S * ks + (size_t)hk * D;
        const float *vb = v + (size_t)b * S * ks + (size_t)hk * D;
        for (int j = 0; j < S; j++) {
            memset(dkb + (size_t)j * ks, 0, sizeof(float) * (size_t)D);
            memset(dvb + (size_t)j * ks, 0, sizeof(float) * (size_t)D);
        }
        for (int h = hk * grp; h < (hk + 1) * grp; h++) {
            for (int tile = 0; tile < tiles; tile++) {
                int t0 = tile * QB, t1 = t0 + QB < T ? t0 + QB : T;
                int tv = t1 < lens[b] ? t1 : lens[b];
                for (int t = t0; t < t1; t++)
                    memset(dq + (((size_t)b * T + t) * Hq + h) * D, 0, sizeof(float) * (size_t)D);
                int nq = tv - t0;
                if (nq <= 0 || !P)
                    continue;
                int nk = pos0[b] + tv < S ? pos0[b] + tv : S;
                size_t idx0 = ((size_t)b * T + t0) * Hq + h;
                const float *Qt = q + idx0 * D, *Ot = out + idx0 * D, *dOt = dout + idx0 * D;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, scale, Qt, (int)qs, kb, (int)ks,
                            0.0f, P, nk);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, 1.0f, dOt, (int)qs, vb, (int)ks,
                            0.0f, dP, nk);
                for (int i = 0; i < nq; i++) {
                    float *pr = P + (size_t)i * nk, *gr = dP + (size_t)i * nk;
                    int lim = pos0[b] + t0 + i + 1;
                    if (lim > nk)
                        lim = nk;
                    float di = dotf(dOt + (size_t)i * qs, Ot + (size_t)i * qs, D);
                    float l = lse[idx0 + (size_t)i * Hq];
                    exp_shift_sum(pr, lim, l);
                    for (int j = 0; j < lim; j++)
                        gr[j] = pr[j] * (gr[j] - di) * scale;
                    for (int j = lim; j < nk; j++)
                        pr[j] = gr[j] = 0;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, 1.0f, dP, nk, kb, (int)ks, 0.0f,
                            dq + idx0 * D, (int)qs);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, nq, 1.0f, dP, nk, Qt, (int)qs, 1.0f, dkb,
                            (int)ks);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, nq, 1.0f, P, nk, dOt, (int)qs, 1.0f, dvb,
                            (int)ks);
            }
        }
        if (!scratch)
            free(P);
    }
    cpu_free(be, scratch, scratch_bytes);
}

/* ---- SwiGLU and embedding ---------------------------------------------------------- */

static void cpu_swiglu_fwd(eng_backend *be, float *h, const float *gate, const float *up, size_t n)
{
    (void)be;
    size_t nv = n / 16;
#pragma omp parallel for schedule(static) PAR_IF(n)
    for (size_t b = 0; b < nv; b++) {
        v16f g = vload(gate + 16 * b);
        vstore(h + 16 * b, g / (1.0f + vexp(-g)) * vload(up + 16 * b));
    }
    for (size_t i = nv * 16; i < n; i++) {
        float g = gate[i];
        h[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static void cpu_swiglu_bwd(eng_backend *be, float *dgate, float *dup, const float *dh,
                           const float *gate, const float *up, size_t n)
{
    (void)be;
    size_t nv = n / 16;
#pragma omp parallel for schedule(static) PAR_IF(n)
    for (size_t b = 0; b < nv; b++) {
        v16f g = vload(gate + 16 * b), s = 1.0f / (1.0f + vexp(-g)), d = vload(dh + 16 * b);
        vstore(dup + 16 * b, d * g * s);
        vstore(dgate + 16 * b, d * vload(up + 16 * b) * s * (1.0f + g * (1.0f - s)));
    }
    for (size_t i = nv * 16; i < n; i++) {
        float g = gate[i], s = 1.0f / (1.0f + expf(-g)), d = dh[i];
        dup[i] = d * g * s;
        dgate[i] = d * up[i] * s * (1.0f + g * (1.0f - s));
    }
}

static void cpu_embed_fwd(eng_backend *be, float *out, const float *table, const int *tokens, int N, int C)
{
    (void)be;
#pragma omp parallel for schedule(static) PAR_IF((double)N * C)
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * C, table + (size_t)tokens[n] * C, sizeof(float) * (size_t)C);
}

static void cpu_embed_bwd(eng_backend *be, float *dtable, const float *dout, const int *tokens, int N, int C)
{
    (void)be;
    /* Columns are split across threads so repeated tokens never race. */
#pragma omp parallel for schedule(static) PAR_IF((double)N * C)
    for (int c0 = 0; c0 < C; c0 += 16) {
        int c1 = c0 + 16 < C ? c0 + 16 : C;
        for (int n = 0; n < N; n++) {
            float *d = dtable + (size_t)tokens[n] * C;
            const float *g = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++)
                d[c] += g[c];
        }
    }
}

/* ---- losses ------------------------------------------------------------------------ */

/* log-sum-exp of x[V]*inv_tau, in double. */
static double row_lse(const float *x, int V, double inv_tau)
{
    float mx = -INFINITY;
#pragma omp simd reduction(max:mx)
    for (int i = 0; i < V; i++)
        mx = x[i] > mx ? x[i] : mx;
    float it = (float)inv_tau;
    double s = sum_exp(x, (size_t)V, it, -mx * it);
    return mx * inv_tau + log(s);
}

static void cpu_xent(eng_backend *be, float *loss, float *dlogits, float dscale,
                     const float *logits, const int *targets, int R, int V)
{
    (void)be;
#pragma omp parallel for schedule(static) PAR_IF((double)R * V)
    for (int r = 0; r < R; r++) {
        int t = targets[r];
        if (t < 0 || t >= V) {
            loss[r] = 0;
            continue;
        }
        const float *x = logits + (size_t)r * V;
        double l = row_lse(x, V, 1.0);
        loss[r] = (float)(l - x[t]);
        if (dlogits) {
            float *d = dlogits + (size_t)r * V, fl = (float)l;
            int i = 0;
            for (; i + 16 <= V; i += 16)
                vstore(d + i, vload(d + i) + dscale * vexp(vload(x + i) - fl));
            for (; i < V; i++)
                d[i] += dscale * expf(x[i] - fl);
            d[t] -= dscale;
        }
    }
}

static void cpu_kl(eng_backend *be, float *loss, float *dlogits, float dscale, const float *s_logits,
                   const float *t_logits, const int *targets, int R, int V, float tau)
{
    (void)be;
    double it = 1.0 / tau;
#pragma omp parallel for schedule(static) PAR_IF((double)R * V)
    for (int r = 0; r < R; r++) {
        if (targets && targets[r] < 0) {
            loss[r] = 0;
            continue;
        }
        const float *s = s_logits + (size_t)r * V, *t = t_logits + (size_t)r * V;
        double ls = row_lse(s, V, it), lt = row_lse(t, V, it), kl = 0;
        float *d = dlogits ? dlogits + (size_t)r * V : NULL;
        float fit = (float)it, fls = (float)ls, flt = (float)lt, g = dscale * tau;
        /* log-probabilities are formed in float (block sums in double) */
        int i = 0;
        while (i + 16 <= V) {
            v16f acc = {0};
            int end = i + 1024 < V ? i + 1024 : V;
            for (; i + 16 <= end; i += 16) {
                v16f lp = vload(t + i) * fit - flt, lq = vload(s + i) * fit - fls, p = vexp(lp);
                acc += p * (lp - lq);
                if (d)
                    vstore(d + i, vload(d + i) + g * (vexp(lq) - p));
            }
            kl += vsum(acc);
        }
        for (; i < V; i++) {
            float lp = t[i] * fit - flt, lq = s[i] * fit - fls, p = expf(lp);
            kl += (double)(p * (lp - lq));
            if (d)
                d[i] += g * (expf(lq) - p);
        }
        loss[r] = (float)(kl * tau * tau);
    }
}

static void cpu_cosd(eng_backend *be, float *loss, float *da, float dscale, const float *a, const float *b, int ldb,
                     const float *w, int R, int C)
{
    (void)be;
#pragma omp parallel for schedule(static) PAR_IF((double)R * C)
    for (int r = 0; r < R; r++) {
        const float *x = a + (size_t)r * C, *y = b + (size_t)r * ldb;
        double xy = 0, xx = 0, yy = 0;
        for (int c = 0; c < C; c++) {   /* through the channel weights: x*w and y*w */
            double ww = (double)w[c] * w[c];
            xy += ww * x[c] * y[c], xx += ww * x[c] * x[c], yy += ww * y[c] * y[c];
        }
        int some = xx > 0 && yy > 0;   /* a zero row: no loss, no gradient */
        double cs = some ? xy / sqrt(xx * yy) : 1.0;
        loss[r] = (float)(1.0 - cs);
        float ka = some ? (float)(dscale * cs / xx) : 0, kb = some ? (float)(dscale / sqrt(xx * yy)) : 0;
        for (int c = 0; da && some && c < C; c++)
            da[(size_t)r * C + c] += w[c] * w[c] * (ka * x[c] - kb * y[c]);
    }
}

/* ---- elementwise and reductions ---------------------------------------------------- */

static void cpu_add(eng_backend *be, float *y, const float *a, const float *b, size_t n)
{
    (void)be;
#pragma omp parallel for simd schedule(static) PAR_IF(n)
    for (size_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

static void cpu_axpy(eng_backend *be, float *y, float alpha, const float *x, size_t n)
{
    (void)be;
#pragma omp parallel for simd schedule(static) PAR_IF(n)
    for (size_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

static void cpu_axpy_dev(eng_backend *be, float *y, const float *alpha_dev, const float *x, size_t n)
{
    cpu_axpy(be, y, *alpha_dev, x, n);
}

static void cpu_scale(eng_backend *be, float *x, float alpha, size_t n)
{
    (void)be;
#pragma omp parallel for simd schedule(static) PAR_IF(n)
    for (size_t i = 0; i < n; i++)
        x[i] *= alpha;
}

static void cpu_fill(eng_backend *be, float *x, float value, size_t n)
{
    (void)be;
#pragma omp parallel for simd schedule(static) PAR_IF(n)
    for (size_t i = 0; i < n; i++)
        x[i] = value;
}

static void cpu_dot_acc(eng_backend *be, float *out_dev, const float *a, const float *b, size_t n)
{
    (void)be;
    double s = 0;
#pragma omp parallel for schedule(static) reduction(+:s) PAR_IF(n)
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    *out_dev += (float)s;
}

static void cpu_mask_fwd(eng_backend *be, float *y, const float *x, const float *m, int N, int G, int D)
{
    (void)be;
    size_t row = (size_t)G * D;
#pragma omp parallel for schedule(static) PAR_IF((double)N * row)
    for (int n = 0; n < N; n++)
        for (int g = 0; g < G; g++) {
            const float *xr = x + n * row + (size_t)g * D;
            float *yr = y + n * row + (size_t)g * D, s = m[g];
            for (int d = 0; d < D; d++)
                yr[d] = xr[d] * s;
        }
}

/* out[G] += sum over rows of f(row, g), with per-thread double partials. f selects
 * the reduction: 0 = sum dy*x over the group, 1 = L2 norm of x's group, 2 = plain sum. */
static void group_reduce(float *out, const float *dy, const float *x, int N, int G, int D, int kind)
{
    size_t row = (size_t)G * D;
    int nth = (double)N * row >= PAR_MIN ? omp_get_max_threads() : 1;
    double *part = calloc((size_t)nth * G, sizeof(double));
    if (!part)
        nth = 1;
#pragma omp parallel num_threads(nth)
    {
        int tid = omp_get_thread_num();
        double *acc = part ? part + (size_t)tid * G : NULL;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            for (int g = 0; g < G; g++) {
                const float *xr = x + n * row + (size_t)g * D;
                double s = 0;
                if (kind == 0) {
                    const float *gr = dy + n * row + (size_t)g * D;
                    for (int d = 0; d < D; d++)
                        s += (double)gr[d] * xr[d];
                } else if (kind == 1) {
                    for (int d = 0; d < D; d++)
                        s += (double)xr[d] * xr[d];
                    s = D == 1 ? fabs(xr[0]) : sqrt(s);
                } else {
                    for (int d = 0; d < D; d++)
                        s += xr[d];
                }
                if (acc)
                    acc[g] += s;
                else
                    out[g] += (float)s;     /* single thread: no race */
            }
        }
    }
    if (part) {
        for (int g = 0; g < G; g++) {
            double s = 0;
            for (int t = 0; t < nth; t++)
                s += part[(size_t)t * G + g];
            out[g] += (float)s;
        }
        free(part);
    }
}

static void cpu_mask_bwd(eng_backend *be, float *dx, float *dm, const float *dy, const float *x,
                         const float *m, int N, int G, int D)
{
    if (dm)
        group_reduce(dm, dy, x, N, G, D, 0);
    cpu_mask_fwd(be, dx, dy, m, N, G, D);
}

static void cpu_bias_add(eng_backend *be, float *y, const float *b, int N, int M)
{
    (void)be;
#pragma omp parallel for schedule(static) PAR_IF((double)N * M)
    for (int n = 0; n < N; n++) {
        float *yr = y + (size_t)n * M;
#pragma omp simd
        for (int i = 0; i < M; i++)
            yr[i] += b[i];
    }
}

static void cpu_colsum_acc(eng_backend *be, float *out, const float *x, int N, int M)
{
    (void)be;
    group_reduce(out, NULL, x, N, M, 1, 2);
}

static void cpu_group_norm_sum(eng_backend *be, float *out, const float *x, int N, int G, int D)
{
    (void)be;
    group_reduce(out, NULL, x, N, G, D, 1);
}

static double cpu_sumsq(eng_backend *be, const float *x, size_t n)
{
    (void)be;
    double s = 0;
#pragma omp parallel for simd schedule(static) reduction(+:s) PAR_IF(n)
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

static void cpu_gather_rows(eng_backend *be, float *out, const float *x, const int *idx, const float *w, int n, int C)
{
    (void)be;
#pragma omp parallel for schedule(static) PAR_IF((double)n * C)
    for (int i = 0; i < n; i++) {
        const float *xr = x + (size_t)idx[i] * C;
        float *o = out + (size_t)i * C, s = w ? w[i] : 1.0f;
#pragma omp simd
        for (int c = 0; c < C; c++)
            o[c] = s * xr[c];
    }
}

static void cpu_scatter_rows_acc(eng_backend *be, float *y, const float *x, const int *idx, const float *w, int n,
                                 int C)
{
    (void)be;
#pragma omp parallel for schedule(static) PAR_IF((double)n * C)
    for (int i = 0; i < n; i++) {
        float *yr = y + (size_t)idx[i] * C, s = w ? w[i] : 1.0f;
        const float *xr = x + (size_t)i * C;
#pragma omp simd
        for (int c = 0; c < C; c++)
            yr[c] += s * xr[c];
    }
}

static void cpu_rows_dot(eng_backend *be, float *out, const float *a, const float *b, int n, int C)
{
    (void)be;
#pragma omp parallel for schedule(static) PAR_IF((double)n * C)
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int c = 0; c < C; c++)
            s += (double)a[(size_t)i * C + c] * b[(size_t)i * C + c];
        out[i] = (float)s;
    }
}

static void cpu_adamw(eng_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                      float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float gscale)
{
    (void)be;
    /* PyTorch's form: step lr/bc1 on m / (sqrt(v)/sqrt(bc2) + eps); one divide and one sqrt an element, both
       vectorized (the build has -fno-math-errno), so the update runs at memory speed */
    const float step = lr / bc1, inv_sqrt_bc2 = 1.0f / sqrtf(bc2), decay = lr * wd;
#pragma omp parallel for simd schedule(static) PAR_IF(n)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gscale;
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= step * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps) + decay * p[i];
    }
}

/* ---- construction -------------------------------------------------------------------- */

static void cpu_to_device(eng_backend *be, void *dst, const void *src, size_t bytes)
{
    cpu_copy(be, dst, src, bytes);
}

eng_backend *eng_backend_cpu_new(int threads)
{
    eng_backend *be = calloc(1, sizeof *be);
    if (!be)
        return NULL;
    if (threads <= 0)
        threads = eng_cpu_default_threads();
    omp_set_num_threads(threads);
    openblas_set_num_threads(1);   /* see cpu_gemm: one pool, OpenMP's */
    be->name = "cpu";
    be->threads = threads;
    be->host_memory = 1;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->to_device = cpu_to_device;
    be->to_host = cpu_to_device;
    be->copy = cpu_copy;
    be->zero = cpu_zero;
    be->sync = cpu_sync;
    be->destroy = cpu_destroy;
    be->gemm = cpu_gemm;
    be->rmsnorm_fwd = cpu_rmsnorm_fwd;
    be->rmsnorm_bwd = cpu_rmsnorm_bwd;
    be->rope_fwd = cpu_rope_fwd;
    be->rope_bwd = cpu_rope_bwd;
    be->attn_fwd = cpu_attn_fwd;
    be->attn_bwd = cpu_attn_bwd;
    be->swiglu_fwd = cpu_swiglu_fwd;
    be->swiglu_bwd = cpu_swiglu_bwd;
    be->embed_fwd = cpu_embed_fwd;
    be->embed_bwd = cpu_embed_bwd;
    be->xent = cpu_xent;
    be->kl = cpu_kl;
    be->cosd = cpu_cosd;
    be->add = cpu_add;
    be->axpy = cpu_axpy;
    be->axpy_dev = cpu_axpy_dev;
    be->scale = cpu_scale;
    be->fill = cpu_fill;
    be->dot_acc = cpu_dot_acc;
    be->mask_fwd = cpu_mask_fwd;
    be->mask_bwd = cpu_mask_bwd;
    be->bias_add = cpu_bias_add;
    be->colsum_acc = cpu_colsum_acc;
    be->group_norm_sum = cpu_group_norm_sum;
    be->sumsq = cpu_sumsq;
    be->adamw = cpu_adamw;
    be->gather_rows = cpu_gather_rows;
    be->scatter_rows_acc = cpu_scatter_rows_acc;
    be->rows_dot = cpu_rows_dot;
    cpu_ssm_install(be);
    return eng_backend_check_ops(be);
}

void eng_backend_free(eng_backend *be)
{
    if (be && be->destroy)
        be->destroy(be);
}

void eng_backend_reset_peak(eng_backend *be)
{
    be->peak_bytes = be->cur_bytes;
}
