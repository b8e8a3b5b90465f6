/* cuda/kernels_ssm.cu — the Mamba-2 ops on the GPU (contracts in engine/backend.h, CPU
 * reference engine/cpu_ssm.c): the depthwise causal conv with its history, the
 * selective-state scan (one warp per state row: head h, channel p, the state's columns over
 * the lanes, states up to 256 wide; the steps in order), its backward from the checkpoints
 * (likewise; B, C, dt and the per-head parameter gradients summed with atomics), the
 * group-gated RMSNorm and squared ReLU. Prefill of a chunk or more runs the chunked (SSD)
 * form instead of the step-by-step scan: parallel over the chunks, the steps within a chunk
 * as small matrix products (below). The backward stays the recurrence from the checkpoints.
 */
#include "cuda/cu_internal.h"
#include "cuda/cu_ops.h"

#include <math.h>

__device__ __forceinline__ float sigm(float v) { return 1.0f / (1.0f + expf(-v)); }
__device__ __forceinline__ float softplus_f(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

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
        y[i] = acc * sigm(acc);
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
    float s = sigm(pre);
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
            float dt = softplus_f(dt_raw[((size_t)b * T + t) * H + h] + dtb), da = expf(dt * A);
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

/* ---- the chunked (SSD) scan: prefill --------------------------------------------------- */

/* Mamba-2's state-space duality (mamba_ssm's ssd_combined, in fp32 on the CUDA cores): the
 * rows are cut into chunks of Q = `chunk` steps (the checkpoints' chunks). With a the
 * cumulative dt*A within a chunk and w_t = dt_t (0 at padded steps, which then leave the
 * state as it is):
 *   Sc[c]       = sum_t exp(a_last - a_t) w_t x_t (outer) B_t       (the chunk's own state)
 *   S_before[c] = exp(a_last[c-1]) S_before[c-1] + Sc[c-1]           (sequential over chunks)
 *   y_t = exp(a_t) C_t . S_before[c] + sum_{u<=t} (C_t . B_u) exp(a_t - a_u) w_u x_u + D x_t
 * Five launches, each parallel over chunks and heads: the decays, the chunk states, the
 * pass between chunks (which leaves S_before in the checkpoints and the last state in
 * `state`), C.B per group, and the outputs. They run over windows of at most SSD_WINDOW
 * chunks, fewer where the windows' chunk states would pass SSD_STATES_CAP bytes, the state
 * carried from window to window. Scratch in the backend's workspace, per window: dt and a
 * [B,H,W*Q], C.B [B,W,G,Q,Q], and the chunk states [B,W,H,P,S] when no checkpoints are
 * asked for (then: into the checkpoints). */
#define SSD_MAX_Q 64                 /* a block's C.B pairs and outputs, 16 per thread at most */
#define SSD_PER (SSD_MAX_Q * SSD_MAX_Q / NT)
#define SSD_TILE 32                  /* state columns per shared tile */
#define SSD_WINDOW 32                /* chunks per window */
#define SSD_STATES_CAP ((size_t)64 << 20)

/* The row's shape, and the window: chunks c0 .. c0+wn-1 of nch. The chunk states of window
 * chunk w are chunk sb + w of a buffer of sn chunks per row (the checkpoints: sn = nch,
 * sb = c0; scratch: sn = wn, sb = 0). */
typedef struct {
    int B, T, H, P, G, S, Q, nch, di, cd, c0, wn, sn, sb;
} ssd_dims;

/* Steps of chunk c (the last one may be short). */
__device__ __forceinline__ int ssd_steps(const ssd_dims &d, int c) { return d.T - c * d.Q < d.Q ? d.T - c * d.Q : d.Q; }
/* Chunk w of the window, head h, row b: its first float in [B,H,W*Q] and in the states. */
__device__ __forceinline__ size_t ssd_at(const ssd_dims &d, int b, int h, int w)
{
    return (((size_t)b * d.H + h) * d.wn + w) * d.Q;
}
__device__ __forceinline__ size_t ssd_state_at(const ssd_dims &d, int b, int h, int w)
{
    return (((size_t)b * d.sn + d.sb + w) * d.H + h) * d.P * d.S;
}

/* dt (0 past the row's length) and its running sum times A within each chunk. */
__global__ void k_ssd_decay(float *dtv, float *acum, const float *dt_raw, const float *dt_bias, const float *A_log,
                            const int *lens, ssd_dims d)
{
    GRID_STRIDE(i, (size_t)d.B * d.H * d.wn) {
        int w = (int)(i % d.wn), bh = (int)(i / d.wn), b = bh / d.H, h = bh % d.H, t0 = (d.c0 + w) * d.Q;
        int len = lens ? lens[b] : d.T, n = ssd_steps(d, d.c0 + w);
        float A = -expf(A_log[h]), cum = 0;
        size_t at = ssd_at(d, b, h, w);
        for (int u = 0; u < n; u++) {
            int t = t0 + u;
            float dt = t < len ? softplus_f(dt_raw[((size_t)b * d.T + t) * d.H + h] + dt_bias[h]) : 0.0f;
            cum += dt * A;
            dtv[at + u] = dt;
            acum[at + u] = cum;
        }
    }
}

/* One block per (chunk, head, row): the chunk's own state Sc [P,S]. Shared: the weighted
 * x [Q,P] and B [Q,S]. */
__global__ void k_ssd_chunk_state(float *sc, const float *xbc, const float *dtv, const float *acum, ssd_dims d)
{
    extern __shared__ float sm[];
    int w = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (d.H / d.G), t0 = (d.c0 + w) * d.Q;
    int n = ssd_steps(d, d.c0 + w);
    const float *dt = dtv + ssd_at(d, b, h, w), *a = acum + ssd_at(d, b, h, w);
    float *xw = sm, *Bs = sm + (size_t)d.Q * d.P, last = a[n - 1];
    for (int i = threadIdx.x; i < n * d.P; i += blockDim.x) {
        int u = i / d.P, p = i % d.P;
        xw[i] = xbc[((size_t)b * d.T + t0 + u) * d.cd + (size_t)h * d.P + p] * dt[u] * expf(last - a[u]);
    }
    for (int i = threadIdx.x; i < n * d.S; i += blockDim.x) {
        int u = i / d.S, s = i % d.S;
        Bs[i] = xbc[((size_t)b * d.T + t0 + u) * d.cd + d.di + (size_t)g * d.S + s];
    }
    __syncthreads();
    float *out = sc + ssd_state_at(d, b, h, w);
    for (int o = threadIdx.x; o < d.P * d.S; o += blockDim.x) {
        int p = o / d.S, s = o % d.S;
        float acc = 0;
        for (int u = 0; u < n; u++)
            acc += xw[u * d.P + p] * Bs[u * d.S + s];
        out[o] = acc;
    }
}

/* The pass between chunks, one thread per state element: each chunk's own state becomes
 * the state before it (from `state` on), and `state` the state after the window. */
__global__ void k_ssd_pass(float *sc, float *state, const float *acum, ssd_dims d)
{
    size_t ps = (size_t)d.P * d.S;
    GRID_STRIDE(i, (size_t)d.B * d.H * ps) {
        size_t e = i % ps, bh = i / ps;
        int b = (int)(bh / d.H), h = (int)(bh % d.H);
        float run = state[i];
        for (int w = 0; w < d.wn; w++) {
            float *slot = sc + ssd_state_at(d, b, h, w) + e, own = *slot;
            *slot = run;
            run = run * expf(acum[ssd_at(d, b, h, w) + ssd_steps(d, d.c0 + w) - 1]) + own;
        }
        state[i] = run;
    }
}

/* One block per (chunk, group, row): C_t . B_u for every pair of the chunk's steps
 * ([B,W,G,Q,Q]), over shared tiles of SSD_TILE state columns. */
__global__ void k_ssd_cb(float *cb, const float *xbc, ssd_dims d)
{
    __shared__ float Ct[SSD_MAX_Q][SSD_TILE + 1], Bt[SSD_MAX_Q][SSD_TILE + 1];
    int w = blockIdx.x, g = blockIdx.y, b = blockIdx.z, t0 = (d.c0 + w) * d.Q, QQ = d.Q * d.Q;
    int n = ssd_steps(d, d.c0 + w);
    float acc[SSD_PER];
#pragma unroll
    for (int k = 0; k < SSD_PER; k++)
        acc[k] = 0;
    for (int s0 = 0; s0 < d.S; s0 += SSD_TILE) {
        for (int i = threadIdx.x; i < d.Q * SSD_TILE; i += blockDim.x) {
            int u = i / SSD_TILE, j = i % SSD_TILE, s = s0 + j;
            size_t at = ((size_t)b * d.T + t0 + u) * d.cd + d.di + (size_t)g * d.S + s;
            Bt[u][j] = u < n && s < d.S ? xbc[at] : 0.0f;
            Ct[u][j] = u < n && s < d.S ? xbc[at + (size_t)d.G * d.S] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < SSD_PER; k++) {
            int o = threadIdx.x + k * NT, t = o / d.Q, u = o % d.Q;
            if (o < QQ)
                for (int j = 0; j < SSD_TILE; j++)
                    acc[k] += Ct[t][j] * Bt[u][j];
        }
        __syncthreads();
    }
    float *out = cb + (((size_t)b * d.wn + w) * d.G + g) * QQ;
#pragma unroll
    for (int k = 0; k < SSD_PER; k++) {
        int o = threadIdx.x + k * NT;
        if (o < QQ)
            out[o] = acc[k];
    }
}

/* One block per (chunk, head, row): the chunk's outputs [Q,P]. Shared: the decayed C.B
 * L [Q,Q+1], exp(a) [Q], a tile of C [Q,TILE+1] and of S_before [P,TILE+1]. */
__global__ void k_ssd_out(float *y, const float *xbc, const float *sb, const float *cb, const float *dtv,
                          const float *acum, const float *Dskip, const int *lens, ssd_dims d)
{
    extern __shared__ float sm[];
    int w = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (d.H / d.G), Q = d.Q, t0 = (d.c0 + w) * Q;
    int n = ssd_steps(d, d.c0 + w), len = lens ? lens[b] : d.T, QP = Q * d.P;
    const float *dt = dtv + ssd_at(d, b, h, w), *a = acum + ssd_at(d, b, h, w);
    const float *cbc = cb + (((size_t)b * d.wn + w) * d.G + g) * Q * Q, *sbc = sb + ssd_state_at(d, b, h, w);
    const float *xr = xbc + ((size_t)b * d.T + t0) * d.cd + (size_t)h * d.P;
    float *L = sm, *ea = L + Q * (Q + 1), *Ct = ea + Q, *St = Ct + Q * (SSD_TILE + 1);
    for (int i = threadIdx.x; i < Q * Q; i += blockDim.x) {
        int t = i / Q, u = i % Q;
        L[t * (Q + 1) + u] = t < n && u <= t ? cbc[i] * expf(a[t] - a[u]) * dt[u] : 0.0f;
    }
    for (int t = threadIdx.x; t < Q; t += blockDim.x)
        ea[t] = t < n ? expf(a[t]) : 0.0f;
    float acc[SSD_PER];
#pragma unroll
    for (int k = 0; k < SSD_PER; k++)
        acc[k] = 0;
    for (int s0 = 0; s0 < d.S; s0 += SSD_TILE) {   /* C_t . S_before[p, :] */
        for (int i = threadIdx.x; i < Q * SSD_TILE; i += blockDim.x) {
            int t = i / SSD_TILE, j = i % SSD_TILE, s = s0 + j;
            Ct[t * (SSD_TILE + 1) + j] =
                t < n && s < d.S ? xbc[((size_t)b * d.T + t0 + t) * d.cd + d.di + ((size_t)d.G + g) * d.S + s] : 0.0f;
        }
        for (int i = threadIdx.x; i < d.P * SSD_TILE; i += blockDim.x) {
            int p = i / SSD_TILE, j = i % SSD_TILE, s = s0 + j;
            St[p * (SSD_TILE + 1) + j] = s < d.S ? sbc[(size_t)p * d.S + s] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < SSD_PER; k++) {
            int o = threadIdx.x + k * NT, t = o / d.P, p = o % d.P;
            if (o < QP)
                for (int j = 0; j < SSD_TILE; j++)
                    acc[k] += Ct[t * (SSD_TILE + 1) + j] * St[p * (SSD_TILE + 1) + j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int k = 0; k < SSD_PER; k++) {
        int o = threadIdx.x + k * NT, t = o / d.P, p = o % d.P;
        if (o >= QP || t >= n)
            continue;
        float v = acc[k] * ea[t];
        for (int u = 0; u <= t; u++)
            v += L[t * (Q + 1) + u] * xr[(size_t)u * d.cd + p];
        y[((size_t)b * d.T + t0 + t) * d.di + (size_t)h * d.P + p] =
            t0 + t < len ? v + Dskip[h] * xr[(size_t)t * d.cd + p] : 0.0f;
    }
}

/* Shared bytes of k_ssd_chunk_state and k_ssd_out. */
static size_t ssd_state_shm(const ssd_dims *d) { return sizeof(float) * (size_t)d->Q * (d->P + d->S); }
static size_t ssd_out_shm(const ssd_dims *d)
{
    return sizeof(float) * ((size_t)d->Q * (d->Q + 1) + d->Q + (size_t)(d->Q + d->P) * (SSD_TILE + 1));
}

/* Whether the chunked form runs: rows of a chunk or more (decode and short rows take the
 * recurrence), chunks and outputs a block holds, shared memory within the 48 KiB every
 * device gives without opting in. */
static int ssd_fits(const ssd_dims *d)
{
    return d->T >= d->Q && d->Q <= SSD_MAX_Q && (size_t)d->Q * d->P <= (size_t)SSD_PER * NT &&
           ssd_state_shm(d) <= 48 * 1024 && ssd_out_shm(d) <= 48 * 1024;
}

static void ssd_scan_fwd(eng_backend *be, float *y, float *ckpt, const float *xbc, const float *dt_raw,
                         const float *dt_bias, const float *A_log, const float *Dskip, float *state, const int *lens,
                         ssd_dims d)
{
    size_t chunk_states = (size_t)d.B * d.H * d.P * d.S;   /* floats of one chunk's states */
    size_t cap = SSD_STATES_CAP / (sizeof(float) * chunk_states);
    int W = cap < 1 ? 1 : cap < SSD_WINDOW ? (int)cap : SSD_WINDOW;
    W = W < d.nch ? W : d.nch;
    size_t bht = (size_t)d.B * d.H * W * d.Q, ncb = (size_t)d.B * W * d.G * d.Q * d.Q;
    float *ws = (float *)cu_workspace(be, sizeof(float) * (2 * bht + ncb + (ckpt ? 0 : W * chunk_states)));
    if (!ws)
        return;
    float *dtv = ws, *acum = ws + bht, *cb = acum + bht, *sc = ckpt ? ckpt : cb + ncb;
    cudaStream_t st = cu_of(be)->stream;
    for (d.c0 = 0; d.c0 < d.nch; d.c0 += W) {
        d.wn = d.nch - d.c0 < W ? d.nch - d.c0 : W;
        d.sn = ckpt ? d.nch : d.wn;
        d.sb = ckpt ? d.c0 : 0;
        dim3 heads((unsigned)d.wn, (unsigned)d.H, (unsigned)d.B), groups((unsigned)d.wn, (unsigned)d.G, (unsigned)d.B);
        k_ssd_decay<<<grid_for((size_t)d.B * d.H * d.wn), NT, 0, st>>>(dtv, acum, dt_raw, dt_bias, A_log, lens, d);
        CHECK_LAUNCH(be);
        k_ssd_chunk_state<<<heads, NT, ssd_state_shm(&d), st>>>(sc, xbc, dtv, acum, d);
        CHECK_LAUNCH(be);
        k_ssd_pass<<<grid_for(chunk_states), NT, 0, st>>>(sc, state, acum, d);
        CHECK_LAUNCH(be);
        k_ssd_cb<<<groups, NT, 0, st>>>(cb, xbc, d);
        CHECK_LAUNCH(be);
        k_ssd_out<<<heads, NT, ssd_out_shm(&d), st>>>(y, xbc, sc, cb, dtv, acum, Dskip, lens, d);
        CHECK_LAUNCH(be);
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
    ssd_dims d = {B, T, H, P, G, S, chunk, (T + chunk - 1) / chunk, H * P, H * P + 2 * G * S, 0, 0, 0, 0};
    if (cu_of(be)->scan == CU_SCAN_AUTO && ssd_fits(&d)) {
        ssd_scan_fwd(be, y, ckpt, xbc, dt_raw, dt_bias, A_log, Dskip, state, lens, d);
        return;
    }
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
                float dt = softplus_f(dt_raw[((size_t)b * T + t) * H + h] + dt_bias[h]), da = expf(dt * A);
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
                float v = dt_raw[rw * H + h] + dt_bias[h], dt = softplus_f(v), da = expf(dt * A);
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
                    float gv = (float)(sb * xp + ss * da * A) * sigm(v);
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
            float zc = z[base + c], v = y[base + c] * zc * sigm(zc);
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
            dot += (double)dout[base + c] * w[g * gs + c] * y[base + c] * zc * sigm(zc);
        }
        float k = (float)((double)r * r * r / gs * dot);
        for (int c = 0; c < gs; c++) {
            float zc = z[base + c], s = sigm(zc), gate = zc * s, gv = y[base + c] * gate;
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
            acc += (double)dout[i] * y[i] * z[i] * sigm(z[i]) * rstd[(size_t)n * G + c / gs];
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
