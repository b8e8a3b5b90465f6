/* cuda/kernels_ssd.cu — the Mamba-2 scan in its chunked form (the state-space duality of
 * mamba_ssm's ssd_combined, in fp32 on the CUDA cores), forward and backward, behind
 * kernels_ssm.cu's ssm_scan_fwd / ssm_scan_bwd (contracts in engine/backend.h, CPU
 * reference engine/cpu_ssm.c). The rows are cut into chunks of Q = `chunk` steps (the
 * checkpoints' chunks). With a_t the cumulative dt*A within a chunk and w_t = dt_t (0 at
 * padded steps, which then leave the state as it is):
 *   Sc[c]       = sum_t exp(a_last - a_t) w_t x_t (outer) B_t       (the chunk's own state)
 *   S_before[c] = exp(a_last[c-1]) S_before[c-1] + Sc[c-1]           (sequential over chunks)
 *   y_t = exp(a_t) C_t . S_before[c] + sum_{u<=t} (C_t . B_u) exp(a_t - a_u) w_u x_u + D x_t
 * Forward, five launches each parallel over chunks and heads: the decays, the chunk states,
 * the pass between chunks (which leaves S_before in the checkpoints and the last state in
 * `state`), C.B per group, and the outputs. Backward (training: zero start, full rows),
 * from the checkpoints: the decays; each chunk's own state gradient sum_t exp(a_t) dy_t
 * (outer) C_t; the pass between chunks backwards, which leaves in R[c] the gradient of the
 * state after chunk c; C.B; then per chunk and head every gradient of the chunk's steps
 * (the block's own x and dt, B and C summed over the group's heads with atomics, one per
 * element per head). Both run over windows of chunks, the state (or its gradient) carried
 * from window to window: forward at most SSD_WINDOW chunks, fewer where their states would
 * pass SSD_STATES_CAP bytes, its scratch in the backend's workspace (dt, a, C.B, and the
 * chunk states when no checkpoints are asked for); backward chunk + 1 chunks, their state
 * gradients and the carry in the caller's scratch of (chunk + 2) chunks' states. The
 * step-by-step kernels of kernels_ssm.cu remain for decode, rows under a chunk, and shapes
 * whose blocks would not fit.
 */
#include "cuda/cu_internal.h"
#include "cuda/cu_ops.h"

#include <math.h>

#define SSD_MAX_Q 64                 /* a block's C.B pairs and outputs, 16 per thread at most */
#define SSD_PER (SSD_MAX_Q * SSD_MAX_Q / NT)
#define SSD_TILE 32                  /* columns per shared tile */
#define SSD_WINDOW 32                /* chunks per forward window */
#define SSD_STATES_CAP ((size_t)64 << 20)
#define SSD_SHM_MAX (48 * 1024)      /* what every device gives a block without opting in */

/* The row's shape, and the window: chunks c0 .. c0+wn-1 of nch. The chunk states (or
 * their gradients) of window chunk w are chunk sb + w of a buffer of sn chunks per row
 * (the checkpoints: sn = nch, sb = c0; scratch: sn = wn, sb = 0). */
typedef struct {
    int B, T, H, P, G, S, Q, nch, di, cd, c0, wn, sn, sb;
} ssd_dims;

/* Steps of chunk c (the last one may be short). */
__device__ __forceinline__ int ssd_steps(const ssd_dims &d, int c) { return d.T - c * d.Q < d.Q ? d.T - c * d.Q : d.Q; }
/* Chunk w of the window, head h, row b: its first float in the [B,H,W*Q] step scratch. */
__device__ __forceinline__ size_t ssd_at(const ssd_dims &d, int b, int h, int w)
{
    return (((size_t)b * d.H + h) * d.wn + w) * d.Q;
}
/* ... and its [P,S] slot in a state buffer of sn chunks per row, the window at chunk sb. */
__device__ __forceinline__ size_t ssd_slot(const ssd_dims &d, int sn, int sb, int b, int h, int w)
{
    return (((size_t)b * sn + sb + w) * d.H + h) * d.P * d.S;
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
            float dt = t < len ? cu_softplus(dt_raw[((size_t)b * d.T + t) * d.H + h] + dt_bias[h]) : 0.0f;
            cum += dt * A;
            dtv[at + u] = dt;
            acum[at + u] = cum;
        }
    }
}

/* One block per (chunk, head, row): sum over the chunk's steps u of v_u (outer) r_u into the
 * chunk's [P,S] slot of out. Forward (dy NULL): v_u = x_u w_u exp(a_last - a_u), r_u = B_u,
 * the chunk's own state. Backward: v_u = dy_u exp(a_u), r_u = C_u, the gradient its outputs
 * give the state before it. Shared: v [Q,P] and r [Q,S]. */
__global__ void k_ssd_outer(float *out, const float *xbc, const float *dy, const float *dtv, const float *acum,
                            ssd_dims d)
{
    extern __shared__ float sm[];
    int w = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (d.H / d.G), t0 = (d.c0 + w) * d.Q;
    int n = ssd_steps(d, d.c0 + w);
    const float *dt = dtv + ssd_at(d, b, h, w), *a = acum + ssd_at(d, b, h, w);
    float *v = sm, *r = sm + (size_t)d.Q * d.P, last = a[n - 1];
    for (int i = threadIdx.x; i < n * d.P; i += blockDim.x) {
        int u = i / d.P, p = i % d.P;
        size_t row = (size_t)b * d.T + t0 + u;
        v[i] = dy ? dy[row * d.di + (size_t)h * d.P + p] * expf(a[u])
                  : xbc[row * d.cd + (size_t)h * d.P + p] * dt[u] * expf(last - a[u]);
    }
    size_t roff = d.di + ((dy ? (size_t)d.G : 0) + g) * d.S;
    for (int i = threadIdx.x; i < n * d.S; i += blockDim.x) {
        int u = i / d.S, s = i % d.S;
        r[i] = xbc[((size_t)b * d.T + t0 + u) * d.cd + roff + s];
    }
    __syncthreads();
    float *o = out + ssd_slot(d, d.sn, d.sb, b, h, w);
    for (int e = threadIdx.x; e < d.P * d.S; e += blockDim.x) {
        int p = e / d.S, s = e % d.S;
        float acc = 0;
        for (int u = 0; u < n; u++)
            acc += v[u * d.P + p] * r[u * d.S + s];
        o[e] = acc;
    }
}

/* The pass between chunks, one thread per state element, over the window's chunks in
 * order (forward) or backwards: run = carry; for each chunk, own = slot, slot = run,
 * run = run * exp(a_last) + own; carry = run. Forward (carry: `state`) each slot becomes the
 * state before its chunk; backward (carry: the gradient of the state after the window) the
 * gradient of the state after its chunk. */
__global__ void k_ssd_pass(float *sc, float *carry, const float *acum, ssd_dims d, int backward)
{
    size_t ps = (size_t)d.P * d.S;
    GRID_STRIDE(i, (size_t)d.B * d.H * ps) {
        size_t e = i % ps, bh = i / ps;
        int b = (int)(bh / d.H), h = (int)(bh % d.H);
        float run = carry[i];
        for (int k = 0; k < d.wn; k++) {
            int w = backward ? d.wn - 1 - k : k;
            float *slot = sc + ssd_slot(d, d.sn, d.sb, b, h, w) + e, own = *slot;
            *slot = run;
            run = run * expf(acum[ssd_at(d, b, h, w) + ssd_steps(d, d.c0 + w) - 1]) + own;
        }
        carry[i] = run;
    }
}

/* acc[k] += sum_{j < len} A[t][j] * Bm[u][j] for the block's pairs o = threadIdx.x + k*NT
 * (t = o / Q, u = o % Q) of Q x Q, the rows A[t] = a + t*lda and Bm[u] = bm + u*ldb for t,
 * u < n (zero beyond), through shared tiles At, Bt of SSD_MAX_Q x (SSD_TILE + 1). */
__device__ void ssd_gram(float *acc, const float *a, size_t lda, const float *bm, size_t ldb, int n, int Q, int len,
                         float (*At)[SSD_TILE + 1], float (*Bt)[SSD_TILE + 1])
{
    for (int j0 = 0; j0 < len; j0 += SSD_TILE) {
        for (int i = threadIdx.x; i < Q * SSD_TILE; i += blockDim.x) {
            int u = i / SSD_TILE, j = i % SSD_TILE;
            At[u][j] = u < n && j0 + j < len ? a[u * lda + j0 + j] : 0.0f;
            Bt[u][j] = u < n && j0 + j < len ? bm[u * ldb + j0 + j] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < SSD_PER; k++) {
            int o = threadIdx.x + k * NT, t = o / Q, u = o % Q;
            if (o < Q * Q)
                for (int j = 0; j < SSD_TILE; j++)
                    acc[k] += At[t][j] * Bt[u][j];
        }
        __syncthreads();
    }
}

/* One block per (chunk, group, row): C_t . B_u for every pair of the chunk's steps
 * ([B,W,G,Q,Q]). */
__global__ void k_ssd_cb(float *cb, const float *xbc, ssd_dims d)
{
    __shared__ float At[SSD_MAX_Q][SSD_TILE + 1], Bt[SSD_MAX_Q][SSD_TILE + 1];
    int w = blockIdx.x, g = blockIdx.y, b = blockIdx.z, t0 = (d.c0 + w) * d.Q, QQ = d.Q * d.Q;
    float acc[SSD_PER];
#pragma unroll
    for (int k = 0; k < SSD_PER; k++)
        acc[k] = 0;
    const float *Bg = xbc + ((size_t)b * d.T + t0) * d.cd + d.di + (size_t)g * d.S;
    ssd_gram(acc, Bg + (size_t)d.G * d.S, d.cd, Bg, d.cd, ssd_steps(d, d.c0 + w), d.Q, d.S, At, Bt);
    float *out = cb + (((size_t)b * d.wn + w) * d.G + g) * QQ;
#pragma unroll
    for (int k = 0; k < SSD_PER; k++) {
        int o = threadIdx.x + k * NT;
        if (o < QQ)
            out[o] = acc[k];
    }
}

/* acc[k] += sum_s rows[u][s] * M[p][s] for the block's pairs o = threadIdx.x + k*NT (u =
 * o / P, p = o % P) of Q x P, rows[u] = rows + u*ld (u < n, zero beyond) and M [P,S]
 * (row-major, S columns), through shared tiles Rt [Q,TILE+1] and Mt [P,TILE+1]. */
__device__ void ssd_rows_m(float *acc, const float *rows, size_t ld, const float *M, int n, int Q, int P, int S,
                           float *Rt, float *Mt)
{
    for (int s0 = 0; s0 < S; s0 += SSD_TILE) {
        for (int i = threadIdx.x; i < Q * SSD_TILE; i += blockDim.x) {
            int u = i / SSD_TILE, j = i % SSD_TILE;
            Rt[u * (SSD_TILE + 1) + j] = u < n && s0 + j < S ? rows[u * ld + s0 + j] : 0.0f;
        }
        for (int i = threadIdx.x; i < P * SSD_TILE; i += blockDim.x) {
            int p = i / SSD_TILE, j = i % SSD_TILE;
            Mt[p * (SSD_TILE + 1) + j] = s0 + j < S ? M[(size_t)p * S + s0 + j] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < SSD_PER; k++) {
            int o = threadIdx.x + k * NT, u = o / P, p = o % P;
            if (o < Q * P)
                for (int j = 0; j < SSD_TILE; j++)
                    acc[k] += Rt[u * (SSD_TILE + 1) + j] * Mt[p * (SSD_TILE + 1) + j];
        }
        __syncthreads();
    }
}

/* One block per (chunk, head, row): the chunk's outputs [Q,P]. Shared: the decayed C.B
 * L [Q,Q+1], exp(a) [Q], the tiles of ssd_rows_m. */
__global__ void k_ssd_out(float *y, const float *xbc, const float *sb, const float *cb, const float *dtv,
                          const float *acum, const float *Dskip, const int *lens, ssd_dims d)
{
    extern __shared__ float sm[];
    int w = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (d.H / d.G), Q = d.Q, t0 = (d.c0 + w) * Q;
    int n = ssd_steps(d, d.c0 + w), len = lens ? lens[b] : d.T, QP = Q * d.P;
    const float *dt = dtv + ssd_at(d, b, h, w), *a = acum + ssd_at(d, b, h, w);
    const float *cbc = cb + (((size_t)b * d.wn + w) * d.G + g) * Q * Q;
    const float *xr = xbc + ((size_t)b * d.T + t0) * d.cd + (size_t)h * d.P;
    float *L = sm, *ea = L + Q * (Q + 1), *Rt = ea + Q, *Mt = Rt + Q * (SSD_TILE + 1);
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
    const float *Cr = xbc + ((size_t)b * d.T + t0) * d.cd + d.di + ((size_t)d.G + g) * d.S;
    ssd_rows_m(acc, Cr, d.cd, sb + ssd_slot(d, d.sn, d.sb, b, h, w), n, Q, d.P, d.S, Rt, Mt);   /* C_t . S_before[p] */
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

/* Shared bytes of k_ssd_outer, k_ssd_out and k_ssd_grad. */
static size_t ssd_outer_shm(const ssd_dims *d) { return sizeof(float) * (size_t)d->Q * (d->P + d->S); }
static size_t ssd_tiles(const ssd_dims *d) { return (size_t)(d->Q + d->P) * (SSD_TILE + 1); }
static size_t ssd_out_shm(const ssd_dims *d)
{
    return sizeof(float) * ((size_t)d->Q * (d->Q + 1) + d->Q + ssd_tiles(d));
}
static size_t ssd_grad_shm(const ssd_dims *d)
{
    size_t gram = 2 * (size_t)SSD_MAX_Q * (SSD_TILE + 1), t = ssd_tiles(d);
    return sizeof(float) * (3 * (size_t)d->Q * (d->Q + 1) + 7 * (size_t)d->Q + (gram > t ? gram : t) + 32);
}

/* Whether the chunked form runs: rows of a chunk or more (decode and short rows take the
 * recurrence), chunks and outputs a block holds, shared memory within SSD_SHM_MAX. */
static int ssd_fits(const ssd_dims *d, int backward)
{
    return d->T >= d->Q && d->Q <= SSD_MAX_Q && (size_t)d->Q * d->P <= (size_t)SSD_PER * NT &&
           ssd_outer_shm(d) <= SSD_SHM_MAX && ssd_out_shm(d) <= SSD_SHM_MAX &&
           (!backward || ssd_grad_shm(d) <= SSD_SHM_MAX);
}

static ssd_dims ssd_dims_of(int B, int T, int H, int P, int G, int S, int chunk)
{
    ssd_dims d = {B, T, H, P, G, S, chunk, (T + chunk - 1) / chunk, H * P, H * P + 2 * G * S, 0, 0, 0, 0};
    return d;
}

int cu_ssd_scan_fwd(eng_backend *be, float *y, float *ckpt, const float *xbc, const float *dt_raw,
                    const float *dt_bias, const float *A_log, const float *Dskip, float *state, const int *lens, int B,
                    int T, int H, int P, int G, int S, int chunk)
{
    ssd_dims d = ssd_dims_of(B, T, H, P, G, S, chunk);
    if (cu_of(be)->scan != CU_SCAN_AUTO || !ssd_fits(&d, 0))
        return 0;
    size_t chunk_states = (size_t)d.B * d.H * d.P * d.S;   /* floats of one chunk's states */
    size_t cap = SSD_STATES_CAP / (sizeof(float) * chunk_states);
    int W = cap < 1 ? 1 : cap < SSD_WINDOW ? (int)cap : SSD_WINDOW;
    W = W < d.nch ? W : d.nch;
    size_t bht = (size_t)d.B * d.H * W * d.Q, ncb = (size_t)d.B * W * d.G * d.Q * d.Q;
    float *ws = (float *)cu_workspace(be, sizeof(float) * (2 * bht + ncb + (ckpt ? 0 : W * chunk_states)));
    if (!ws)
        return 1;
    float *dtv = ws, *acum = ws + bht, *cb = acum + bht, *sc = ckpt ? ckpt : cb + ncb;
    cudaStream_t st = cu_of(be)->stream;
    for (d.c0 = 0; d.c0 < d.nch; d.c0 += W) {
        d.wn = d.nch - d.c0 < W ? d.nch - d.c0 : W;
        d.sn = ckpt ? d.nch : d.wn;
        d.sb = ckpt ? d.c0 : 0;
        dim3 heads((unsigned)d.wn, (unsigned)d.H, (unsigned)d.B), groups((unsigned)d.wn, (unsigned)d.G, (unsigned)d.B);
        k_ssd_decay<<<grid_for((size_t)d.B * d.H * d.wn), NT, 0, st>>>(dtv, acum, dt_raw, dt_bias, A_log, lens, d);
        CHECK_LAUNCH_R(be, 1);
        k_ssd_outer<<<heads, NT, ssd_outer_shm(&d), st>>>(sc, xbc, NULL, dtv, acum, d);
        CHECK_LAUNCH_R(be, 1);
        k_ssd_pass<<<grid_for(chunk_states), NT, 0, st>>>(sc, state, acum, d, 0);
        CHECK_LAUNCH_R(be, 1);
        k_ssd_cb<<<groups, NT, 0, st>>>(cb, xbc, d);
        CHECK_LAUNCH_R(be, 1);
        k_ssd_out<<<heads, NT, ssd_out_shm(&d), st>>>(y, xbc, sc, cb, dtv, acum, Dskip, lens, d);
        CHECK_LAUNCH_R(be, 1);
    }
    return 1;
}

/* One block per (chunk, head, row) of the backward: every gradient of the chunk's steps
 * for head h, given dy, the state before the chunk S0 (the checkpoint) and R, the gradient
 * of the state after it (see the file's head for the forward it inverts):
 *   Gy[t,u] = dy_t . x_u; M[t,u] = (C_t . B_u) exp(a_t - a_u) (u <= t); f_u = exp(a_last - a_u)
 *   dx_u  = sum_t M[t,u] w_u dy_t + f_u w_u R B_u + D dy_u                 (stored: its own)
 *   dC_t += exp(a_t) S0^T dy_t + sum_u exp(a_t - a_u) w_u Gy[t,u] B_u      (atomics: the group's)
 *   dB_u += sum_t exp(a_t - a_u) w_u Gy[t,u] C_t + f_u w_u R^T x_u
 *   dw_u  = sum_t M[t,u] Gy[t,u] + f_u x_u^T R B_u, and da_t (each a_t's gradient) from the
 *   same terms; then ddt_raw = (dw + A * suffix sums of da) * sigmoid(dt_raw + dt_bias),
 *   dA_log += A * sum_t da_t a_t / A, dD += sum dy . x (one atomic each per block). */
__global__ void k_ssd_grad(float *dxbc, float *ddt_raw, float *ddt_bias, float *dA_log, float *dD, const float *dy,
                           const float *xbc, const float *dt_raw, const float *dt_bias, const float *A_log,
                           const float *Dskip, const float *ckpt, const float *R, const float *cb, const float *dtv,
                           const float *acum, ssd_dims d)
{
    extern __shared__ float sm[];
    int w = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (d.H / d.G), Q = d.Q, t0 = (d.c0 + w) * Q;
    int n = ssd_steps(d, d.c0 + w), QQ = Q * Q, QP = Q * d.P, q1 = Q + 1;
    float *Mw = sm, *dCB = Mw + Q * q1, *MG = dCB + Q * q1, *a = MG + Q * q1, *dt = a + Q, *ea = dt + Q, *f = ea + Q;
    float *da = f + Q, *dw = da + Q, *V = dw + Q, *red = V + Q, *tiles = red + 32;
    const float *a_g = acum + ssd_at(d, b, h, w), *dt_g = dtv + ssd_at(d, b, h, w);
    size_t row0 = (size_t)b * d.T + t0;
    const float *dyr = dy + row0 * d.di + (size_t)h * d.P, *xr = xbc + row0 * d.cd + (size_t)h * d.P;
    const float *Br = xbc + row0 * d.cd + d.di + (size_t)g * d.S, *Cr = Br + (size_t)d.G * d.S;
    const float *S0 = ckpt + ssd_slot(d, d.nch, d.c0, b, h, w), *Rs = R + ssd_slot(d, d.wn, 0, b, h, w);
    const float *cbc = cb + (((size_t)b * d.wn + w) * d.G + g) * QQ;
    float A = -expf(A_log[h]), Dh = Dskip[h];
    for (int u = threadIdx.x; u < Q; u += blockDim.x) {
        a[u] = u < n ? a_g[u] : 0.0f;
        dt[u] = u < n ? dt_g[u] : 0.0f;
        da[u] = dw[u] = V[u] = 0;
    }
    __syncthreads();
    for (int u = threadIdx.x; u < Q; u += blockDim.x) {
        ea[u] = u < n ? expf(a[u]) : 0.0f;
        f[u] = u < n ? expf(a[n - 1] - a[u]) : 0.0f;
    }
    float acc[SSD_PER];
#pragma unroll
    for (int k = 0; k < SSD_PER; k++)
        acc[k] = 0;
    float (*At)[SSD_TILE + 1] = (float (*)[SSD_TILE + 1])tiles, (*Bt)[SSD_TILE + 1] = At + SSD_MAX_Q;
    ssd_gram(acc, dyr, d.di, xr, d.cd, n, Q, d.P, At, Bt);   /* Gy[t,u] */
#pragma unroll
    for (int k = 0; k < SSD_PER; k++) {
        int o = threadIdx.x + k * NT, t = o / Q, u = o % Q;
        if (o >= QQ)
            continue;
        float mw = 0, dcb = 0, mg = 0;
        if (t < n && u <= t) {
            float dec = expf(a[t] - a[u]), m = cbc[o] * dec;
            mw = m * dt[u];
            dcb = dec * dt[u] * acc[k];
            mg = m * acc[k];
        }
        Mw[t * q1 + u] = mw;
        dCB[t * q1 + u] = dcb;
        MG[t * q1 + u] = mg;
    }
    __syncthreads();
    for (int u = threadIdx.x; u < n; u += blockDim.x) {   /* the intra-chunk terms' dw and da */
        float sw = 0, sa = 0;
        for (int t = u; t < n; t++) {
            sw += MG[t * q1 + u];
            sa -= MG[t * q1 + u] * dt[u];
        }
        for (int v = 0; v <= u; v++)
            sa += MG[u * q1 + v] * dt[v];
        dw[u] = sw;
        da[u] = sa;
    }
#pragma unroll
    for (int k = 0; k < SSD_PER; k++)
        acc[k] = 0;
    ssd_rows_m(acc, Br, d.cd, Rs, n, Q, d.P, d.S, tiles, tiles + Q * (SSD_TILE + 1));   /* B_u . R[p] */
    float part_d = 0;   /* this thread's share of sum dy . x */
#pragma unroll
    for (int k = 0; k < SSD_PER; k++) {
        int o = threadIdx.x + k * NT, u = o / d.P, p = o % d.P;
        if (o >= QP || u >= n)
            continue;
        float gy = dyr[(size_t)u * d.di + p], v = f[u] * dt[u] * acc[k] + Dh * gy;
        for (int t = u; t < n; t++)
            v += Mw[t * q1 + u] * dyr[(size_t)t * d.di + p];
        dxbc[(row0 + u) * d.cd + (size_t)h * d.P + p] = v;
        part_d += gy * xr[(size_t)u * d.cd + p];
    }
    for (int o = threadIdx.x; o < n * d.S; o += blockDim.x) {   /* dC_t[s] and dB_u[s], t = u */
        int t = o / d.S, s = o % d.S;
        float sc = 0, xrs = 0, dci = 0, dbi = 0;
        for (int p = 0; p < d.P; p++) {
            sc += dyr[(size_t)t * d.di + p] * S0[(size_t)p * d.S + s];
            xrs += xr[(size_t)t * d.cd + p] * Rs[(size_t)p * d.S + s];
        }
        sc *= ea[t];
        for (int u = 0; u <= t; u++)
            dci += dCB[t * q1 + u] * Br[(size_t)u * d.cd + s];
        for (int v = t; v < n; v++)
            dbi += dCB[v * q1 + t] * Cr[(size_t)v * d.cd + s];
        float c = Cr[(size_t)t * d.cd + s], bv = Br[(size_t)t * d.cd + s];
        atomicAdd(dxbc + (row0 + t) * d.cd + d.di + ((size_t)d.G + g) * d.S + s, sc + dci);
        atomicAdd(dxbc + (row0 + t) * d.cd + d.di + (size_t)g * d.S + s, dbi + f[t] * dt[t] * xrs);
        atomicAdd(da + t, c * sc);
        atomicAdd(V + t, bv * xrs);
    }
    float part_rs = 0;   /* sum R . S0 */
    for (int e = threadIdx.x; e < d.P * d.S; e += blockDim.x)
        part_rs += Rs[e] * S0[e];
    __syncthreads();
    float rs = cu_block_sum(part_rs, red), sd = cu_block_sum(part_d, red);
    if (threadIdx.x == 0) {
        double last = (double)expf(a[n - 1]) * rs;
        for (int u = 0; u < n; u++) {   /* the end state's terms */
            float fv = f[u] * dt[u] * V[u];
            dw[u] += f[u] * V[u];
            da[u] -= fv;
            last += fv;
        }
        da[n - 1] += (float)last;
        double run = 0, sg = 0, dA = 0;
        for (int u = n - 1; u >= 0; u--) {
            size_t at = (row0 + u) * d.H + h;
            run += da[u];
            dA += (double)da[u] * (a[u] / A);
            float gv = (float)(dw[u] + A * run) * cu_sigmoid(dt_raw[at] + dt_bias[h]);
            ddt_raw[at] = gv;
            sg += gv;
        }
        atomicAdd(ddt_bias + h, (float)sg);
        atomicAdd(dA_log + h, (float)(dA * A));
        atomicAdd(dD + h, sd);
    }
}

int cu_ssd_scan_bwd(eng_backend *be, float *dxbc, float *ddt_raw, float *ddt_bias, float *dA_log, float *dD,
                    const float *dy, const float *xbc, const float *dt_raw, const float *dt_bias, const float *A_log,
                    const float *Dskip, const float *ckpt, float *scratch, int B, int T, int H, int P, int G, int S,
                    int chunk)
{
    ssd_dims d = ssd_dims_of(B, T, H, P, G, S, chunk);
    if (cu_of(be)->scan != CU_SCAN_AUTO || !ssd_fits(&d, 1))
        return 0;
    /* the caller's scratch holds (chunk + 2) chunks' states: a window's R and the carry */
    size_t chunk_states = (size_t)d.B * d.H * d.P * d.S;
    int W = d.nch < chunk + 1 ? d.nch : chunk + 1;
    size_t bht = (size_t)d.B * d.H * W * d.Q, ncb = (size_t)d.B * W * d.G * d.Q * d.Q;
    float *ws = (float *)cu_workspace(be, sizeof(float) * (2 * bht + ncb));
    if (!ws)
        return 1;
    float *dtv = ws, *acum = ws + bht, *cb = acum + bht, *R = scratch, *carry = scratch + (size_t)W * chunk_states;
    cudaStream_t st = cu_of(be)->stream;
    CHECK_CUDA_R(be, cudaMemsetAsync(dxbc, 0, sizeof(float) * (size_t)B * T * d.cd, st), 1);
    CHECK_CUDA_R(be, cudaMemsetAsync(carry, 0, sizeof(float) * chunk_states, st), 1);
    for (int c0 = (d.nch - 1) / W * W; c0 >= 0; c0 -= W) {
        d.c0 = c0;
        d.wn = d.nch - c0 < W ? d.nch - c0 : W;
        d.sn = d.wn;
        d.sb = 0;
        dim3 heads((unsigned)d.wn, (unsigned)d.H, (unsigned)d.B), groups((unsigned)d.wn, (unsigned)d.G, (unsigned)d.B);
        k_ssd_decay<<<grid_for((size_t)d.B * d.H * d.wn), NT, 0, st>>>(dtv, acum, dt_raw, dt_bias, A_log, NULL, d);
        CHECK_LAUNCH_R(be, 1);
        k_ssd_outer<<<heads, NT, ssd_outer_shm(&d), st>>>(R, xbc, dy, dtv, acum, d);
        CHECK_LAUNCH_R(be, 1);
        k_ssd_pass<<<grid_for(chunk_states), NT, 0, st>>>(R, carry, acum, d, 1);
        CHECK_LAUNCH_R(be, 1);
        k_ssd_cb<<<groups, NT, 0, st>>>(cb, xbc, d);
        CHECK_LAUNCH_R(be, 1);
        k_ssd_grad<<<heads, NT, ssd_grad_shm(&d), st>>>(dxbc, ddt_raw, ddt_bias, dA_log, dD, dy, xbc, dt_raw, dt_bias,
                                                        A_log, Dskip, ckpt, R, cb, dtv, acum, d);
        CHECK_LAUNCH_R(be, 1);
    }
    return 1;
}
