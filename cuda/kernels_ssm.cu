/* cuda/kernels_ssm.cu — the Mamba-2 ops on the GPU (contracts in engine/backend.h, CPU
 * reference engine/cpu_ssm.c): the depthwise causal conv with its history, the
 * selective-state scan step by step (one warp per state row: head h, channel p, the state's
 * columns over the lanes, states up to 256 wide), its backward from the checkpoints
 * (likewise; B, C, dt and the per-head parameter gradients summed with atomics), the
 * group-gated RMSNorm and squared ReLU. Rows of a chunk or more scan in the chunked form of
 * kernels_ssd.cu instead, both ways, where its blocks fit; decode and short rows here.
 */
#include "cuda/cu_internal.h"
#include "cuda/cu_ops.h"

#include <math.h>

/* ---- conv ------------------------------------------------------------------------------ */

__device__ __forceinline__ float conv_in(const float *x, const float *hist, int b, int T, int cd, int K, int i, int c)
{
    if (i >= 0)
        return x[((size_t)b * T + i) * cd + c];
    return hist ? hist[((size_t)b * (K - 1) + (K - 1) + i) * cd + c] : 0.0f;
}

__global__ void k_conv_fwd(float *y, const float *x, const float *w, const float *bias, const float *state, int B,
                           int T, int cd, int K)
{
    GRID_STRIDE(i, (size_t)B * T * cd) {
        int c = (int)(i % cd), n = (int)(i / cd), b = n / T, t = n % T;
        float acc = bias ? bias[c] : 0.0f;
        for (int k = 0; k < K; k++)
            acc += w[(size_t)c * K + k] * conv_in(x, state, b, T, cd, K, t - (K - 1) + k, c);
        y[i] = acc * cu_sigmoid(acc);
    }
}

__global__ void k_conv_state(float *state, const float *x, const int *lens, int B, int T, int cd, int K)
{
    GRID_STRIDE(i, (size_t)B * cd) {
        int c = (int)(i % cd), b = (int)(i / cd), len = lens ? lens[b] : T;
        float keep[16];
        for (int j = 0; j < K - 1; j++)
            keep[j] = conv_in(x, state, b, T, cd, K, len - (K - 1) + j, c);
        for (int j = 0; j < K - 1; j++)
            state[((size_t)b * (K - 1) + j) * cd + c] = keep[j];
    }
}

static void cu_ssm_conv_fwd(eng_backend *be, float *y, const float *x, const float *w, const float *bias, float *state,
                            const int *lens, int B, int T, int cd, int K)
{
    if (cu_enter(be) != 0)
        return;
    cudaStream_t st = cu_of(be)->stream;
    k_conv_fwd<<<grid_for((size_t)B * T * cd), NT, 0, st>>>(y, x, w, bias, state, B, T, cd, K);
    CHECK_LAUNCH(be);
    if (state && K > 1) {
        k_conv_state<<<grid_for((size_t)B * cd), NT, 0, st>>>(state, x, lens, B, T, cd, K);
        CHECK_LAUNCH(be);
    }
}

/* d pre-activation at step t of row b, channel c (no history: training). */
__device__ __forceinline__ float conv_dpre(const float *dy, const float *x, const float *w, const float *bias, int b,
                                           int T, int cd, int K, int t, int c)
{
    float pre = bias ? bias[c] : 0.0f;
    for (int k = 0; k < K; k++)
        pre += w[(size_t)c * K + k] * conv_in(x, NULL, b, T, cd, K, t - (K - 1) + k, c);
    float s = cu_sigmoid(pre);
    return dy[((size_t)b * T + t) * cd + c] * s * (1.0f + pre * (1.0f - s));
}

__global__ void k_conv_bwd_dx(float *dx, const float *dy, const float *x, const float *w, const float *bias, int B,
                              int T, int cd, int K)
{
    GRID_STRIDE(i, (size_t)B * T * cd) {
        int c = (int)(i % cd), n = (int)(i / cd), b = n / T, s = n % T;
        float acc = 0;
        for (int k = 0; k < K; k++) {
            int t = s + (K - 1) - k;
            if (t < T)
                acc += w[(size_t)c * K + k] * conv_dpre(dy, x, w, bias, b, T, cd, K, t, c);
        }
        dx[i] = acc;
    }
}

__global__ void k_conv_bwd_dw(float *dw, float *dbias, const float *dy, const float *x, const float *w,
                              const float *bias, int B, int T, int cd, int K)
{
    GRID_STRIDE(c, (size_t)cd) {
        double gw[16] = {0}, gb = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                float dp = conv_dpre(dy, x, w, bias, b, T, cd, K, t, (int)c);
                gb += dp;
                for (int k = 0; k < K; k++) {
                    int i = t - (K - 1) + k;
                    if (i >= 0)
                        gw[k] += (double)dp * x[((size_t)b * T + i) * cd + c];
                }
            }
        for (int k = 0; k < K; k++)
            dw[c * K + k] += (float)gw[k];
        if (dbias)
            dbias[c] += (float)gb;
    }
}

static void cu_ssm_conv_bwd(eng_backend *be, float *dx, float *dw, float *dbias, const float *dy, const float *x,
                            const float *w, const float *bias, int B, int T, int cd, int K)
{
    if (cu_enter(be) != 0)
        return;
    cudaStream_t st = cu_of(be)->stream;
    k_conv_bwd_dx<<<grid_for((size_t)B * T * cd), NT, 0, st>>>(dx, dy, x, w, bias, B, T, cd, K);
    CHECK_LAUNCH(be);
    k_conv_bwd_dw<<<grid_for((size_t)cd), NT, 0, st>>>(dw, dbias, dy, x, w, bias, B, T, cd, K);
    CHECK_LAUNCH(be);
}

/* ---- scan ------------------------------------------------------------------------------ */

/* The scan, one warp per state row (b, h, p), the row's S columns over the lanes (SCAN_REGS
 * per lane, in registers): each step's update and its dot with C run in parallel and
 * reduce by shuffles, B*H*P*32 threads in all (one thread per row left an H200 at 0.8% of
 * its GEMM ceiling in a hybrid's prefill). For S <= 32 * SCAN_REGS. */
#define SCAN_REGS 8

/* A state wider than the registers hold is refused (recorded on the backend): 1 then. */
static int scan_too_wide(eng_backend *be, int S)
{
    if (S <= 32 * SCAN_REGS)
        return 0;
    char why[96];
    snprintf(why, sizeof why, "Mamba state size %d above %d (not built on CUDA)", S, 32 * SCAN_REGS);
    cu_set_error(be, __FILE__, __LINE__, "ssm scan", why);
    return 1;
}
__global__ void k_scan_fwd_warp(float *y, float *ckpt, const float *xbc, const float *dt_raw, const float *dt_bias,
                                const float *A_log, const float *Dskip, float *state, const int *lens, int B, int T,
                                int H, int P, int G, int S, int chunk)
{
    int di = H * P, cd = di + 2 * G * S, hpg = H / G, nch = (T + chunk - 1) / chunk, lane = threadIdx.x & 31;
    size_t rows = (size_t)B * H * P;
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; i < rows;
         i += (size_t)gridDim.x * blockDim.x / 32) {
        int p = (int)(i % P), bh = (int)(i / P), b = bh / H, h = bh % H, g = h / hpg, len = lens ? lens[b] : T;
        float *s = state + i * S, A = -expf(A_log[h]), Dh = Dskip[h], dtb = dt_bias[h], r[SCAN_REGS];
#pragma unroll
        for (int k = 0; k < SCAN_REGS; k++)
            r[k] = lane + 32 * k < S ? s[lane + 32 * k] : 0.0f;
        for (int t = 0; t < T; t++) {
            const float *row = xbc + ((size_t)b * T + t) * cd;
            if (ckpt && t % chunk == 0) {
                float *ck = ckpt + ((((size_t)b * nch + t / chunk) * H + h) * P + p) * S;
#pragma unroll
                for (int k = 0; k < SCAN_REGS; k++)
                    if (lane + 32 * k < S)
                        ck[lane + 32 * k] = r[k];
            }
            if (t >= len) {
                if (lane == 0)
                    y[((size_t)b * T + t) * di + (size_t)h * P + p] = 0;
                continue;
            }
            float dt = cu_softplus(dt_raw[((size_t)b * T + t) * H + h] + dtb), da = expf(dt * A);
            float xp = row[h * P + p], xd = dt * xp, acc = 0;
            const float *Bg = row + di + (size_t)g * S, *Cg = Bg + (size_t)G * S;
#pragma unroll
            for (int k = 0; k < SCAN_REGS; k++) {
                int j = lane + 32 * k;
                if (j < S) {
                    r[k] = r[k] * da + xd * Bg[j];
                    acc += r[k] * Cg[j];
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0)
                y[((size_t)b * T + t) * di + (size_t)h * P + p] = acc + Dh * xp;
        }
#pragma unroll
        for (int k = 0; k < SCAN_REGS; k++)
            if (lane + 32 * k < S)
                s[lane + 32 * k] = r[k];
    }
}

static void cu_ssm_scan_fwd(eng_backend *be, float *y, float *ckpt, const float *xbc, const float *dt_raw,
                            const float *dt_bias, const float *A_log, const float *Dskip, float *state, const int *lens,
                            int B, int T, int H, int P, int G, int S, int chunk)
{
    if (cu_enter(be) != 0)
        return;
    if (scan_too_wide(be, S))
        return;
    if (cu_ssd_scan_fwd(be, y, ckpt, xbc, dt_raw, dt_bias, A_log, Dskip, state, lens, B, T, H, P, G, S, chunk))
        return;
    size_t rows = (size_t)B * H * P;
    k_scan_fwd_warp<<<grid_for(rows * 32), NT, 0, cu_of(be)->stream>>>(y, ckpt, xbc, dt_raw, dt_bias, A_log, Dskip,
                                                                      state, lens, B, T, H, P, G, S, chunk);
    CHECK_LAUNCH(be);
}

/* The scan's backward from the checkpoints, one warp per state row (b, h, p), the row's
 * columns over the lanes: dS in registers, the chunk's recomputed states in scratch (each
 * lane its own columns), the row's sums over the columns reduced by shuffles. For S <=
 * 32 * SCAN_REGS. */
__global__ void k_scan_bwd_warp(float *dxbc, float *ddt_raw, float *ddt_bias, float *dA_log, float *dD,
                                const float *dy, const float *xbc, const float *dt_raw, const float *dt_bias,
                                const float *A_log, const float *Dskip, const float *ckpt, float *scratch, int B, int T,
                                int H, int P, int G, int S, int chunk)
{
    int di = H * P, cd = di + 2 * G * S, hpg = H / G, nch = (T + chunk - 1) / chunk, lane = threadIdx.x & 31;
    size_t ps = (size_t)P * S, rows = (size_t)B * H * P;
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; i < rows;
         i += (size_t)gridDim.x * blockDim.x / 32) {
        int p = (int)(i % P), bh = (int)(i / P), b = bh / H, h = bh % H, g = h / hpg;
        float *st = scratch + (size_t)bh * (chunk + 2) * ps + (size_t)p * S, dS[SCAN_REGS];
        float A = -expf(A_log[h]), Dh = Dskip[h];
        double accA = 0, accD = 0;
#pragma unroll
        for (int k = 0; k < SCAN_REGS; k++)
            dS[k] = 0;
        for (int c = nch - 1; c >= 0; c--) {
            int t0 = c * chunk, t1 = t0 + chunk < T ? t0 + chunk : T;
            const float *ck = ckpt + ((((size_t)b * nch + c) * H + h) * P + p) * S;
            for (int j = lane; j < S; j += 32)
                st[j] = ck[j];
            for (int t = t0; t < t1; t++) {   /* the chunk's states again, row p, this lane's columns */
                const float *row = xbc + ((size_t)b * T + t) * cd;
                float dt = cu_softplus(dt_raw[((size_t)b * T + t) * H + h] + dt_bias[h]), da = expf(dt * A);
                float xd = dt * row[h * P + p];
                const float *Bg = row + di + (size_t)g * S;
                float *s0 = st + (size_t)(t - t0) * ps, *s1 = s0 + ps;
                for (int j = lane; j < S; j += 32)
                    s1[j] = s0[j] * da + xd * Bg[j];
            }
            for (int t = t1 - 1; t >= t0; t--) {
                size_t rw = (size_t)b * T + t;
                const float *row = xbc + rw * cd, *Bg = row + di + (size_t)g * S, *Cg = Bg + (size_t)G * S;
                const float *s1 = st + (size_t)(t - t0 + 1) * ps, *s0 = s1 - ps;
                float v = dt_raw[rw * H + h] + dt_bias[h], dt = cu_softplus(v), da = expf(dt * A);
                float gp = dy[rw * di + (size_t)h * P + p], xp = row[h * P + p];
                float *dB = dxbc + rw * cd + di + (size_t)g * S, *dC = dB + (size_t)G * S;
                double sb = 0, ss = 0;
#pragma unroll
                for (int k = 0; k < SCAN_REGS; k++) {
                    int j = lane + 32 * k;
                    if (j < S) {
                        atomicAdd(dC + j, s1[j] * gp);
                        dS[k] += gp * Cg[j];
                        sb += (double)dS[k] * Bg[j];
                        ss += (double)dS[k] * s0[j];
                        atomicAdd(dB + j, dt * dS[k] * xp);
                        dS[k] *= da;
                    }
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) {
                    sb += __shfl_xor_sync(0xffffffffu, sb, o);
                    ss += __shfl_xor_sync(0xffffffffu, ss, o);
                }
                if (lane == 0) {
                    accD += (double)gp * xp;
                    dxbc[rw * cd + (size_t)h * P + p] = Dh * gp + dt * (float)sb;
                    accA += ss * da * dt;
                    float gv = (float)(sb * xp + ss * da * A) * cu_sigmoid(v);
                    atomicAdd(ddt_raw + rw * H + h, gv);
                    atomicAdd(ddt_bias + h, gv);
                }
            }
        }
        if (lane == 0) {
            atomicAdd(dA_log + h, (float)(accA * A));
            atomicAdd(dD + h, (float)accD);
        }
    }
}

static void cu_ssm_scan_bwd(eng_backend *be, float *dxbc, float *ddt_raw, float *ddt_bias, float *dA_log, float *dD,
                            const float *dy, const float *xbc, const float *dt_raw, const float *dt_bias,
                            const float *A_log, const float *Dskip, const float *ckpt, float *scratch, int B, int T,
                            int H, int P, int G, int S, int chunk)
{
    if (cu_enter(be) != 0)
        return;
    if (scan_too_wide(be, S))
        return;
    if (cu_ssd_scan_bwd(be, dxbc, ddt_raw, ddt_bias, dA_log, dD, dy, xbc, dt_raw, dt_bias, A_log, Dskip, ckpt, scratch,
                        B, T, H, P, G, S, chunk))
        return;
    cudaStream_t st = cu_of(be)->stream;
    size_t cd = (size_t)H * P + 2 * (size_t)G * S;
    CHECK_CUDA(be, cudaMemsetAsync(dxbc, 0, sizeof(float) * (size_t)B * T * cd, st));
    CHECK_CUDA(be, cudaMemsetAsync(ddt_raw, 0, sizeof(float) * (size_t)B * T * H, st));
    size_t rows = (size_t)B * H * P;
    k_scan_bwd_warp<<<grid_for(rows * 32), NT, 0, st>>>(dxbc, ddt_raw, ddt_bias, dA_log, dD, dy, xbc, dt_raw, dt_bias,
                                                        A_log, Dskip, ckpt, scratch, B, T, H, P, G, S, chunk);
    CHECK_LAUNCH(be);
}

/* ---- gated norm and squared ReLU ----------------------------------------------------------- */

__global__ void k_gnorm_fwd(float *out, float *rstd, const float *y, const float *z, const float *w, int N, int di,
                            int G, float eps)
{
    int gs = di / G;
    GRID_STRIDE(i, (size_t)N * G) {
        size_t n = i / G, g = i % G, base = n * di + g * gs;
        double ss = 0;
        for (int c = 0; c < gs; c++) {
            float zc = z[base + c], v = y[base + c] * zc * cu_sigmoid(zc);
            out[base + c] = v;
            ss += (double)v * v;
        }
        float r = (float)(1.0 / sqrt(ss / gs + eps));
        rstd[i] = r;
        for (int c = 0; c < gs; c++)
            out[base + c] *= r * w[g * gs + c];
    }
}

__global__ void k_gnorm_bwd(float *dy, float *dz, const float *dout, const float *y, const float *z, const float *w,
                            const float *rstd, int N, int di, int G)
{
    int gs = di / G;
    GRID_STRIDE(i, (size_t)N * G) {
        size_t n = i / G, g = i % G, base = n * di + g * gs;
        float r = rstd[i];
        double dot = 0;
        for (int c = 0; c < gs; c++) {
            float zc = z[base + c];
            dot += (double)dout[base + c] * w[g * gs + c] * y[base + c] * zc * cu_sigmoid(zc);
        }
        float k = (float)((double)r * r * r / gs * dot);
        for (int c = 0; c < gs; c++) {
            float zc = z[base + c], s = cu_sigmoid(zc), gate = zc * s, gv = y[base + c] * gate;
            float dg = r * w[g * gs + c] * dout[base + c] - gv * k;
            dy[base + c] = dg * gate;
            dz[base + c] = dg * y[base + c] * s * (1.0f + zc * (1.0f - s));
        }
    }
}

__global__ void k_gnorm_dw(float *dw, const float *dout, const float *y, const float *z, const float *rstd, int N,
                           int di, int G)
{
    int gs = di / G;
    GRID_STRIDE(c, (size_t)di) {
        double acc = 0;
        for (int n = 0; n < N; n++) {
            size_t i = (size_t)n * di + c;
            acc += (double)dout[i] * y[i] * z[i] * cu_sigmoid(z[i]) * rstd[(size_t)n * G + c / gs];
        }
        dw[c] += (float)acc;
    }
}

static void cu_gated_norm_fwd(eng_backend *be, float *out, float *rstd, const float *y, const float *z, const float *w,
                              int N, int di, int G, float eps)
{
    if (cu_enter(be) != 0)
        return;
    k_gnorm_fwd<<<grid_for((size_t)N * G), NT, 0, cu_of(be)->stream>>>(out, rstd, y, z, w, N, di, G, eps);
    CHECK_LAUNCH(be);
}

static void cu_gated_norm_bwd(eng_backend *be, float *dy, float *dz, float *dw, const float *dout, const float *y,
                              const float *z, const float *w, const float *rstd, int N, int di, int G)
{
    if (cu_enter(be) != 0)
        return;
    cudaStream_t st = cu_of(be)->stream;
    k_gnorm_bwd<<<grid_for((size_t)N * G), NT, 0, st>>>(dy, dz, dout, y, z, w, rstd, N, di, G);
    CHECK_LAUNCH(be);
    if (dw) {
        k_gnorm_dw<<<grid_for((size_t)di), NT, 0, st>>>(dw, dout, y, z, rstd, N, di, G);
        CHECK_LAUNCH(be);
    }
}

__global__ void k_relu2_fwd(float *h, const float *u, size_t n)
{
    GRID_STRIDE(i, n) h[i] = u[i] > 0 ? u[i] * u[i] : 0.0f;
}

__global__ void k_relu2_bwd(float *du, const float *dh, const float *u, size_t n)
{
    GRID_STRIDE(i, n) du[i] = u[i] > 0 ? 2.0f * u[i] * dh[i] : 0.0f;
}

static void cu_relu2_fwd(eng_backend *be, float *h, const float *u, size_t n)
{
    if (!n || cu_enter(be) != 0)
        return;
    k_relu2_fwd<<<grid_for(n), NT, 0, cu_of(be)->stream>>>(h, u, n);
    CHECK_LAUNCH(be);
}

static void cu_relu2_bwd(eng_backend *be, float *du, const float *dh, const float *u, size_t n)
{
    if (!n || cu_enter(be) != 0)
        return;
    k_relu2_bwd<<<grid_for(n), NT, 0, cu_of(be)->stream>>>(du, dh, u, n);
    CHECK_LAUNCH(be);
}

void cu_ssm_install(eng_backend *be)
{
    be->ssm_conv_fwd = cu_ssm_conv_fwd;
    be->ssm_conv_bwd = cu_ssm_conv_bwd;
    be->ssm_scan_fwd = cu_ssm_scan_fwd;
    be->ssm_scan_bwd = cu_ssm_scan_bwd;
    be->gated_norm_fwd = cu_gated_norm_fwd;
    be->gated_norm_bwd = cu_gated_norm_bwd;
    be->relu2_fwd = cu_relu2_fwd;
    be->relu2_bwd = cu_relu2_bwd;
}
