/* engine/cpu_ssm.c — the CPU backend's Mamba-2 ops (contracts in engine/backend.h): the
 * depthwise causal conv with its history, the selective-state scan run step by step per
 * head (the recurrent form of the SSD scan, two steps per pass over the state, four state
 * rows at a time, in fused multiply-adds), the group-gated RMSNorm and squared ReLU. Sums
 * of squares and reductions over steps accumulate in double where they feed a gradient.
 *
 * The chunked (quadratic) form of the scan is not built for the CPU: at the shapes of
 * Nemotron-H (head_dim 64, state 128, chunks of 32 or more) it does 1.1-1.2x the
 * multiply-adds of the recurrence, in small GEMMs of 32-256 rows, and the recurrence here
 * runs at 40-50% of the machine's sgemm rate and takes under a tenth of a hybrid's prefill
 * (bench/engine/engine_bench.c's ssm_scan line; docs/families.md).
 */
#include "engine/cpu_ssm.h"

#include <math.h>
#include <string.h>

static inline float sigm(float v) { return 1.0f / (1.0f + expf(-v)); }

/* torch's softplus (threshold 20: linear above). */
static inline float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

/* ---- depthwise causal conv ------------------------------------------------------------ */

/* Input i of row b at channel c: x for i >= 0, the history (or zero) before. */
static inline float conv_in(const float *x, const float *hist, int b, int T, int cd, int K, int i, int c)
{
    if (i >= 0)
        return x[((size_t)b * T + i) * cd + c];
    return hist ? hist[((size_t)b * (K - 1) + (K - 1) + i) * cd + c] : 0.0f;
}

static void cpu_ssm_conv_fwd(eng_backend *be, float *y, const float *x, const float *w, const float *bias,
                             float *state, const int *lens, int B, int T, int cd, int K)
{
    (void)be;
#pragma omp parallel for schedule(static) PAR_IF((double)B * T * cd * K)
    for (int n = 0; n < B * T; n++) {
        int b = n / T, t = n % T;
        float *yr = y + (size_t)n * cd;
        for (int c = 0; c < cd; c++) {
            float acc = bias ? bias[c] : 0.0f;
            for (int k = 0; k < K; k++)
                acc += w[(size_t)c * K + k] * conv_in(x, state, b, T, cd, K, t - (K - 1) + k, c);
            yr[c] = acc * sigm(acc);
        }
    }
    if (!state || K < 2)
        return;
    for (int b = 0; b < B; b++) {   /* the K-1 inputs before position lens[b] */
        int len = lens ? lens[b] : T;
        float *h = state + (size_t)b * (K - 1) * cd;
        for (int c = 0; c < cd; c++) {
            float keep[16];
            for (int j = 0; j < K - 1; j++)
                keep[j] = conv_in(x, state, b, T, cd, K, len - (K - 1) + j, c);
            for (int j = 0; j < K - 1; j++)
                h[(size_t)j * cd + c] = keep[j];
        }
    }
}

static void cpu_ssm_conv_bwd(eng_backend *be, float *dx, float *dw, float *dbias, const float *dy, const float *x,
                             const float *w, const float *bias, int B, int T, int cd, int K)
{
    (void)be;
    memset(dx, 0, sizeof(float) * (size_t)B * T * cd);
#pragma omp parallel for schedule(static) PAR_IF((double)B * T * cd * K)
    for (int c0 = 0; c0 < cd; c0 += 16) {
        int c1 = c0 + 16 < cd ? c0 + 16 : cd;
        for (int c = c0; c < c1; c++) {
            double gw[16] = {0}, gb = 0;
            for (int b = 0; b < B; b++)
                for (int t = T - 1; t >= 0; t--) {
                    float pre = bias ? bias[c] : 0.0f;
                    for (int k = 0; k < K; k++)
                        pre += w[(size_t)c * K + k] * conv_in(x, NULL, b, T, cd, K, t - (K - 1) + k, c);
                    float s = sigm(pre);
                    float dp = dy[((size_t)b * T + t) * cd + c] * s * (1.0f + pre * (1.0f - s));
                    gb += dp;
                    for (int k = 0; k < K; k++) {
                        int i = t - (K - 1) + k;
                        if (i < 0)
                            continue;
                        dx[((size_t)b * T + i) * cd + c] += w[(size_t)c * K + k] * dp;
                        gw[k] += (double)dp * x[((size_t)b * T + i) * cd + c];
                    }
                }
            for (int k = 0; k < K; k++)
                dw[(size_t)c * K + k] += (float)gw[k];
            if (dbias)
                dbias[c] += (float)gb;
        }
    }
}

/* ---- selective-state scan -------------------------------------------------------------- */

/* One step of head h's state s [P,S]: s = da*s + dt*x (outer) Bg; y = s Cg + Dh*x. Four rows
 * at a time: their dot products with Cg are four independent chains of vector adds, where
 * one row alone waits on the add's latency at every vector of S (and each vector of Bg and
 * Cg is loaded once for the four). */
static void scan_step(float *s, float *y, const float *x, const float *Bg, const float *Cg, float dt, float da,
                      float Dh, int P, int S)
{
    int p = 0;
    for (; p + 4 <= P; p += 4) {
        float *r0 = s + (size_t)p * S, *r1 = r0 + S, *r2 = r1 + S, *r3 = r2 + S;
        float x0 = dt * x[p], x1 = dt * x[p + 1], x2 = dt * x[p + 2], x3 = dt * x[p + 3];
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+:a0, a1, a2, a3)
        for (int j = 0; j < S; j++) {
            float b = Bg[j], c = Cg[j];
            r0[j] = fmaf(r0[j], da, x0 * b);
            r1[j] = fmaf(r1[j], da, x1 * b);
            r2[j] = fmaf(r2[j], da, x2 * b);
            r3[j] = fmaf(r3[j], da, x3 * b);
            a0 = fmaf(r0[j], c, a0);
            a1 = fmaf(r1[j], c, a1);
            a2 = fmaf(r2[j], c, a2);
            a3 = fmaf(r3[j], c, a3);
        }
        if (y) {
            y[p] = a0 + Dh * x[p];
            y[p + 1] = a1 + Dh * x[p + 1];
            y[p + 2] = a2 + Dh * x[p + 2];
            y[p + 3] = a3 + Dh * x[p + 3];
        }
    }
    for (; p < P; p++) {
        float *sr = s + (size_t)p * S, xp = dt * x[p], acc = 0;
#pragma omp simd reduction(+:acc)
        for (int j = 0; j < S; j++) {
            sr[j] = fmaf(sr[j], da, xp * Bg[j]);
            acc = fmaf(sr[j], Cg[j], acc);
        }
        if (y)
            y[p] = acc + Dh * x[p];
    }
}

/* Two steps (t, t + 1) of head h's state in one pass over it: each row is loaded and stored
 * once for both (the state is larger than the L1 cache, so a step's time is its traffic),
 * and each step's arithmetic is scan_step's, in the same order: the same result. */
static void scan_pair(float *s, float *y0, float *y1, const float *x0, const float *x1, const float *B0,
                      const float *C0, const float *B1, const float *C1, float dt0, float da0, float dt1, float da1,
                      float Dh, int P, int S)
{
    int p = 0;
    for (; p + 4 <= P; p += 4) {
        float *r0 = s + (size_t)p * S, *r1 = r0 + S, *r2 = r1 + S, *r3 = r2 + S;
        float u0 = dt0 * x0[p], u1 = dt0 * x0[p + 1], u2 = dt0 * x0[p + 2], u3 = dt0 * x0[p + 3];
        float v0 = dt1 * x1[p], v1 = dt1 * x1[p + 1], v2 = dt1 * x1[p + 2], v3 = dt1 * x1[p + 3];
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0, c0 = 0, c1 = 0, c2 = 0, c3 = 0;
#pragma omp simd reduction(+:a0, a1, a2, a3, c0, c1, c2, c3)
        for (int j = 0; j < S; j++) {
            float b = B0[j], c = C0[j], bb = B1[j], cc = C1[j];
            float s0 = fmaf(r0[j], da0, u0 * b), s1 = fmaf(r1[j], da0, u1 * b), s2 = fmaf(r2[j], da0, u2 * b),
                  s3 = fmaf(r3[j], da0, u3 * b);
            a0 = fmaf(s0, c, a0);
            a1 = fmaf(s1, c, a1);
            a2 = fmaf(s2, c, a2);
            a3 = fmaf(s3, c, a3);
            r0[j] = s0 = fmaf(s0, da1, v0 * bb);
            r1[j] = s1 = fmaf(s1, da1, v1 * bb);
            r2[j] = s2 = fmaf(s2, da1, v2 * bb);
            r3[j] = s3 = fmaf(s3, da1, v3 * bb);
            c0 = fmaf(s0, cc, c0);
            c1 = fmaf(s1, cc, c1);
            c2 = fmaf(s2, cc, c2);
            c3 = fmaf(s3, cc, c3);
        }
        y0[p] = a0 + Dh * x0[p];
        y0[p + 1] = a1 + Dh * x0[p + 1];
        y0[p + 2] = a2 + Dh * x0[p + 2];
        y0[p + 3] = a3 + Dh * x0[p + 3];
        y1[p] = c0 + Dh * x1[p];
        y1[p + 1] = c1 + Dh * x1[p + 1];
        y1[p + 2] = c2 + Dh * x1[p + 2];
        y1[p + 3] = c3 + Dh * x1[p + 3];
    }
    for (; p < P; p++) {
        float *sr = s + (size_t)p * S, u = dt0 * x0[p], v = dt1 * x1[p], a = 0, c = 0;
#pragma omp simd reduction(+:a, c)
        for (int j = 0; j < S; j++) {
            float s0 = fmaf(sr[j], da0, u * B0[j]);
            a = fmaf(s0, C0[j], a);
            sr[j] = s0 = fmaf(s0, da1, v * B1[j]);
            c = fmaf(s0, C1[j], c);
        }
        y0[p] = a + Dh * x0[p];
        y1[p] = c + Dh * x1[p];
    }
}

static void cpu_ssm_scan_fwd(eng_backend *be, float *y, float *ckpt, const float *xbc, const float *dt_raw,
                             const float *dt_bias, const float *A_log, const float *Dskip, float *state,
                             const int *lens, int B, int T, int H, int P, int G, int S, int chunk)
{
    (void)be;
    int di = H * P, cd = di + 2 * G * S, hpg = H / G, nch = (T + chunk - 1) / chunk;
    size_t ps = (size_t)P * S;
#pragma omp parallel for schedule(static) PAR_IF((double)B * T * H * ps)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H, g = h / hpg, len = lens ? lens[b] : T;
        float *s = state + (size_t)bh * ps, A = -expf(A_log[h]);
        for (int t = 0; t < T; t++) {
            const float *row = xbc + ((size_t)b * T + t) * cd;
            float *yr = y + ((size_t)b * T + t) * di + (size_t)h * P;
            if (ckpt && t % chunk == 0)
                memcpy(ckpt + (((size_t)b * nch + t / chunk) * H + h) * ps, s, sizeof(float) * ps);
            if (t >= len) {
                memset(yr, 0, sizeof(float) * (size_t)P);
                continue;
            }
            float dt = softplus(dt_raw[((size_t)b * T + t) * H + h] + dt_bias[h]);
            if (t + 1 < len && !(ckpt && (t + 1) % chunk == 0)) {   /* t + 1 in the same pass */
                const float *nx = row + cd;
                float dt1 = softplus(dt_raw[((size_t)b * T + t + 1) * H + h] + dt_bias[h]);
                scan_pair(s, yr, yr + di, row + (size_t)h * P, nx + (size_t)h * P, row + di + (size_t)g * S,
                          row + di + (size_t)(G + g) * S, nx + di + (size_t)g * S, nx + di + (size_t)(G + g) * S,
                          dt, expf(dt * A), dt1, expf(dt1 * A), Dskip[h], P, S);
                t++;
                continue;
            }
            scan_step(s, yr, row + (size_t)h * P, row + di + (size_t)g * S, row + di + (size_t)(G + g) * S, dt,
                      expf(dt * A), Dskip[h], P, S);
        }
    }
}

/* The backward of one head over one chunk [t0, t1), states st[0] (before t0) .. st[t1-t0]
 * recomputed; dS [P,S] carries d(state) from the future and leaves holding d(state before t0). */
static void scan_bwd_chunk(float *dxbc, float *ddt_raw, double *acc, float *dS, const float *st, const float *dy,
                           const float *xbc, const float *dt_raw, float dtb, float A, float Dh, int b, int h, int g,
                           int t0, int t1, int T, int H, int P, int G, int S)
{
    int di = H * P, cd = di + 2 * G * S;
    size_t ps = (size_t)P * S;
    for (int t = t1 - 1; t >= t0; t--) {
        size_t row = (size_t)b * T + t;
        const float *x = xbc + row * cd + (size_t)h * P, *Bg = xbc + row * cd + di + (size_t)g * S;
        const float *Cg = Bg + (size_t)G * S, *gy = dy + row * di + (size_t)h * P;
        const float *sn = st + (size_t)(t - t0 + 1) * ps, *sp = st + (size_t)(t - t0) * ps;
        float *dx = dxbc + row * cd + (size_t)h * P, *dB = dxbc + row * cd + di + (size_t)g * S;
        float *dC = dB + (size_t)G * S;
        float v = dt_raw[row * H + h] + dtb, dt = softplus(v), da = expf(dt * A);
        double ddt = 0, dda = 0;
        for (int p = 0; p < P; p++) {
            float *d = dS + (size_t)p * S, gp = gy[p], xp = x[p];
            const float *s1 = sn + (size_t)p * S, *s0 = sp + (size_t)p * S;
            float sbf = 0, ssf = 0, dxp = dt * xp;   /* one row's sums in float lanes (S terms) */
#pragma omp simd reduction(+:sbf, ssf)
            for (int j = 0; j < S; j++) {
                dC[j] += s1[j] * gp;
                float dj = d[j] + gp * Cg[j];
                sbf += dj * Bg[j];
                ssf += dj * s0[j];
                dB[j] += dxp * dj;
                d[j] = dj * da;
            }
            double sb = sbf, ss = ssf;
            acc[2] += (double)gp * xp;                 /* dD */
            dx[p] = Dh * gp + dt * (float)sb;
            ddt += sb * xp;
            dda += ss;
        }
        ddt += dda * da * A;
        acc[1] += dda * da * dt;                       /* d A */
        float gv = (float)ddt * sigm(v);
        ddt_raw[row * H + h] = gv;
        acc[0] += gv;                                  /* d dt_bias */
    }
}

static void cpu_ssm_scan_bwd(eng_backend *be, float *dxbc, float *ddt_raw, float *ddt_bias, float *dA_log, float *dD,
                             const float *dy, const float *xbc, const float *dt_raw, const float *dt_bias,
                             const float *A_log, const float *Dskip, const float *ckpt, float *scratch, int B, int T,
                             int H, int P, int G, int S, int chunk)
{
    (void)be;
    int di = H * P, cd = di + 2 * G * S, hpg = H / G, nch = (T + chunk - 1) / chunk;
    size_t ps = (size_t)P * S;
    for (size_t row = 0; row < (size_t)B * T; row++)   /* B and C gradients sum over a group's heads */
        memset(dxbc + row * cd + di, 0, sizeof(float) * 2 * (size_t)G * S);
#pragma omp parallel for schedule(static) PAR_IF((double)B * T * H * ps)
    for (int bg = 0; bg < B * G; bg++) {
        int b = bg / G, g = bg % G;
        for (int h = g * hpg; h < (g + 1) * hpg; h++) {
            float *st = scratch + ((size_t)b * H + h) * (size_t)(chunk + 2) * ps, *dS = st + (size_t)(chunk + 1) * ps;
            float A = -expf(A_log[h]);
            double acc[3] = {0, 0, 0};
            memset(dS, 0, sizeof(float) * ps);
            for (int c = nch - 1; c >= 0; c--) {
                int t0 = c * chunk, t1 = t0 + chunk < T ? t0 + chunk : T;
                memcpy(st, ckpt + (((size_t)b * nch + c) * H + h) * ps, sizeof(float) * ps);
                for (int t = t0; t < t1; t++) {
                    const float *row = xbc + ((size_t)b * T + t) * cd;
                    float *s = st + (size_t)(t - t0 + 1) * ps, dt = softplus(dt_raw[((size_t)b * T + t) * H + h] + dt_bias[h]);
                    memcpy(s, s - ps, sizeof(float) * ps);
                    scan_step(s, NULL, row + (size_t)h * P, row + di + (size_t)g * S, row + di + (size_t)(G + g) * S, dt,
                              expf(dt * A), 0, P, S);
                }
                scan_bwd_chunk(dxbc, ddt_raw, acc, dS, st, dy, xbc, dt_raw, dt_bias[h], A, Dskip[h], b, h, g, t0, t1, T,
                               H, P, G, S);
            }
#pragma omp critical(ssm_scan_bwd)
            {
                ddt_bias[h] += (float)acc[0];
                dA_log[h] += (float)(acc[1] * A);
                dD[h] += (float)acc[2];
            }
        }
    }
}

/* ---- gated RMSNorm ------------------------------------------------------------------------- */

static void cpu_gated_norm_fwd(eng_backend *be, float *out, float *rstd, const float *y, const float *z,
                               const float *w, int N, int di, int G, float eps)
{
    (void)be;
    int gs = di / G;
#pragma omp parallel for schedule(static) PAR_IF((double)N * di)
    for (int n = 0; n < N; n++) {
        const float *yr = y + (size_t)n * di, *zr = z + (size_t)n * di;
        float *o = out + (size_t)n * di;
        for (int g = 0; g < G; g++) {
            double ss = 0;
            for (int c = g * gs; c < (g + 1) * gs; c++) {
                o[c] = yr[c] * zr[c] * sigm(zr[c]);
                ss += (double)o[c] * o[c];
            }
            float r = (float)(1.0 / sqrt(ss / gs + eps));
            rstd[(size_t)n * G + g] = r;
            for (int c = g * gs; c < (g + 1) * gs; c++)
                o[c] *= r * w[c];
        }
    }
}

static void cpu_gated_norm_bwd(eng_backend *be, float *dy, float *dz, float *dw, const float *dout, const float *y,
                               const float *z, const float *w, const float *rstd, int N, int di, int G)
{
    (void)be;
    int gs = di / G;
#pragma omp parallel for schedule(static) PAR_IF((double)N * di)
    for (int n = 0; n < N; n++) {
        const float *yr = y + (size_t)n * di, *zr = z + (size_t)n * di, *gr = dout + (size_t)n * di;
        for (int g = 0; g < G; g++) {
            float r = rstd[(size_t)n * G + g];
            double dot = 0;
            for (int c = g * gs; c < (g + 1) * gs; c++)
                dot += (double)gr[c] * w[c] * yr[c] * zr[c] * sigm(zr[c]);
            float k = (float)((double)r * r * r / gs * dot);
            for (int c = g * gs; c < (g + 1) * gs; c++) {
                float s = sigm(zr[c]), gate = zr[c] * s, gv = yr[c] * gate;
                float dg = r * w[c] * gr[c] - gv * k;
                dy[(size_t)n * di + c] = dg * gate;
                dz[(size_t)n * di + c] = dg * yr[c] * s * (1.0f + zr[c] * (1.0f - s));
            }
        }
    }
    if (!dw)
        return;
#pragma omp parallel for schedule(static) PAR_IF((double)N * di)
    for (int c0 = 0; c0 < di; c0 += 64) {
        int c1 = c0 + 64 < di ? c0 + 64 : di;
        double acc[64] = {0};
        for (int n = 0; n < N; n++)
            for (int c = c0; c < c1; c++) {
                size_t i = (size_t)n * di + c;
                acc[c - c0] += (double)dout[i] * y[i] * z[i] * sigm(z[i]) * rstd[(size_t)n * G + c / gs];
            }
        for (int c = c0; c < c1; c++)
            dw[c] += (float)acc[c - c0];
    }
}

/* ---- squared ReLU ----------------------------------------------------------------------------- */

static void cpu_relu2_fwd(eng_backend *be, float *h, const float *u, size_t n)
{
    (void)be;
#pragma omp parallel for simd schedule(static) PAR_IF(n)
    for (size_t i = 0; i < n; i++)
        h[i] = u[i] > 0 ? u[i] * u[i] : 0.0f;
}

static void cpu_relu2_bwd(eng_backend *be, float *du, const float *dh, const float *u, size_t n)
{
    (void)be;
#pragma omp parallel for simd schedule(static) PAR_IF(n)
    for (size_t i = 0; i < n; i++)
        du[i] = u[i] > 0 ? 2.0f * u[i] * dh[i] : 0.0f;
}

void cpu_ssm_install(eng_backend *be)
{
    be->ssm_conv_fwd = cpu_ssm_conv_fwd;
    be->ssm_conv_bwd = cpu_ssm_conv_bwd;
    be->ssm_scan_fwd = cpu_ssm_scan_fwd;
    be->ssm_scan_bwd = cpu_ssm_scan_bwd;
    be->gated_norm_fwd = cpu_gated_norm_fwd;
    be->gated_norm_bwd = cpu_gated_norm_bwd;
    be->relu2_fwd = cpu_relu2_fwd;
    be->relu2_bwd = cpu_relu2_bwd;
}
