/* cuda/kernels_attn.cu — causal grouped-query attention on the GPU, same contract as
 * engine/backend.h and the CPU reference: flash-style tiled forward (online softmax,
 * one warp per query, 32-key tiles in shared memory), a split-key decode kernel for
 * short query blocks over a long KV cache, and a two-kernel backward (dq per query,
 * dk/dv per key) that recomputes probabilities from the forward's log-sum-exp. No
 * [B,H,T,S] score tensor is ever stored. Head dims up to 128 (CU_ATTN_MAX_D).
 */
#include "cuda/cu_internal.h"
#include "cuda/cu_ops.h"

#include <math.h>
#include <type_traits>

#define CU_ATTN_MAX_D 128
#define KT 32          /* keys (or queries) per shared-memory tile */
#define QW 8           /* warps (queries) per block in the tiled kernels */
#define DEC_W 4        /* warps per block in the decode kernel */
#define DEC_MAX_T 4    /* query blocks this short use the decode kernel */

/* Number of keys query t of row b attends: positions 0 .. pos0+t, capped by S. */
__device__ __forceinline__ int attn_nk(int pos0, int t, int S)
{
    return min(pos0 + t + 1, S);
}

/* ---- tiled forward ------------------------------------------------------------------
 * grid (ceil(T/QW), Hq, B), QW warps; warp w owns query t = blockIdx.x*QW + w. Shared:
 * Ks[KT][D+1], Vs[KT][D], Qs[QW][D]. NACC = ceil(D/32) output dims per lane. */
template <int NACC>
__global__ void k_attn_fwd_tiled(float *out, float *lse, const float *q, const float *k, const float *v,
                                 const int *pos0_, const int *lens_, int T, int S, int Hq, int Hkv, int D,
                                 float scale)
{
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = Ks + KT * (D + 1), *Qs = Vs + KT * D;
    int b = blockIdx.z, h = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int hk = h / (Hq / Hkv);
    int t = (int)blockIdx.x * QW + w;
    int pos0 = pos0_[b], len = min(lens_[b], T);
    bool valid = t < len;
    size_t qi = ((size_t)b * T + t) * Hq + h;   /* row of q/out/lse (when t < T) */
    for (int d = lane; d < D; d += 32)
        Qs[w * D + d] = valid ? q[qi * D + d] : 0.0f;
    /* keys any valid query of this block needs */
    int tfirst = (int)blockIdx.x * QW, tlast = min(tfirst + QW, len) - 1;
    int kmax = tlast >= tfirst ? attn_nk(pos0, tlast, S) : 0;
    int nk = valid ? attn_nk(pos0, t, S) : 0;
    float m = -INFINITY, l = 0.0f, acc[NACC];
    for (int i = 0; i < NACC; i++)
        acc[i] = 0.0f;
    size_t kvrow = (size_t)Hkv * D;
    const float *kb = k + (size_t)b * S * kvrow + (size_t)hk * D;
    const float *vb = v + (size_t)b * S * kvrow + (size_t)hk * D;
    for (int j0 = 0; j0 < kmax; j0 += KT) {
        __syncthreads();   /* previous tile fully consumed (and Qs written, first time) */
        for (int e = threadIdx.x; e < KT * D; e += blockDim.x) {
            int j = e / D, d = e % D;
            bool in = j0 + j < kmax;
            Ks[j * (D + 1) + d] = in ? kb[(size_t)(j0 + j) * kvrow + d] : 0.0f;
            Vs[j * D + d] = in ? vb[(size_t)(j0 + j) * kvrow + d] : 0.0f;
        }
        __syncthreads();
        if (j0 >= nk)
            continue;      /* warp-uniform: this query's keys ended */
        float s = -INFINITY;
        if (j0 + lane < nk) {
            float dot = 0.0f;
            const float *kr = Ks + lane * (D + 1), *qr = Qs + w * D;
            for (int d = 0; d < D; d++)
                dot += qr[d] * kr[d];
            s = dot * scale;
        }
        float mt = cu_warp_max(s), mn = fmaxf(m, mt);
        float corr = expf(m - mn);     /* m = -inf on the first tile: 0 */
        float p = j0 + lane < nk ? expf(s - mn) : 0.0f;
        l = l * corr + cu_warp_sum(p);
        for (int i = 0; i < NACC; i++)
            acc[i] *= corr;
        int jn = min(KT, nk - j0);
        for (int jj = 0; jj < jn; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            for (int i = 0; i < NACC; i++) {
                int d = lane + 32 * i;
                if (d < D)
                    acc[i] += pj * Vs[jj * D + d];
            }
        }
        m = mn;
    }
    if (t >= T)
        return;
    float inv = valid ? 1.0f / l : 0.0f;
    for (int i = 0; i < NACC; i++) {
        int d = lane + 32 * i;
        if (d < D)
            out[qi * D + d] = valid ? acc[i] * inv : 0.0f;
    }
    if (lse && lane == 0)
        lse[qi] = valid ? m + logf(l) : 0.0f;
}

/* ---- decode (split keys) ------------------------------------------------------------
 * grid (nsplit, Hq, B*T), DEC_W warps. Block `split` covers keys [split*chunk, +chunk)
 * of its query; each warp takes 32-key groups round robin, lane j scoring key j
 * straight from global memory. Warps merge in shared memory; with nsplit > 1 the block
 * writes a partial (m, l, acc[D]) to part[(row*nsplit + split)] and k_attn_combine
 * finishes. Shared: Qs[D], Ms[DEC_W], Ls[DEC_W], As[DEC_W][D]. */
template <int NACC>
__global__ void k_attn_decode(float *out, float *lse, float *part, const float *q, const float *k,
                              const float *v, const int *pos0_, const int *lens_, int T, int S, int Hq,
                              int Hkv, int D, float scale, int chunk)
{
    extern __shared__ float sm[];
    float *Qs = sm, *Ms = Qs + D, *Ls = Ms + DEC_W, *As = Ls + DEC_W;
    int split = blockIdx.x, nsplit = gridDim.x, h = blockIdx.y;
    int b = blockIdx.z / T, t = blockIdx.z % T;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int hk = h / (Hq / Hkv);
    bool valid = t < lens_[b];
    size_t qi = ((size_t)b * T + t) * Hq + h;
    int nk = valid ? attn_nk(pos0_[b], t, S) : 0;
    int ja = split * chunk, jb = min(nk, ja + chunk);
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        Qs[d] = valid ? q[qi * D + d] : 0.0f;
    __syncthreads();
    size_t kvrow = (size_t)Hkv * D;
    const float *kb = k + (size_t)b * S * kvrow + (size_t)hk * D;
    const float *vb = v + (size_t)b * S * kvrow + (size_t)hk * D;
    float m = -INFINITY, l = 0.0f, acc[NACC];
    for (int i = 0; i < NACC; i++)
        acc[i] = 0.0f;
    for (int j0 = ja + w * 32; j0 < jb; j0 += DEC_W * 32) {
        int j = j0 + lane;
        float s = -INFINITY;
        if (j < jb) {
            const float *kr = kb + (size_t)j * kvrow;
            float dot = 0.0f;
            for (int d = 0; d < D; d++)
                dot += Qs[d] * kr[d];
            s = dot * scale;
        }
        float mn = fmaxf(m, cu_warp_max(s));
        float corr = expf(m - mn);
        float p = j < jb ? expf(s - mn) : 0.0f;
        l = l * corr + cu_warp_sum(p);
        for (int i = 0; i < NACC; i++)
            acc[i] *= corr;
        int jn = min(32, jb - j0);
        for (int jj = 0; jj < jn; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            const float *vr = vb + (size_t)(j0 + jj) * kvrow;
            for (int i = 0; i < NACC; i++) {
                int d = lane + 32 * i;
                if (d < D)
                    acc[i] += pj * vr[d];
            }
        }
        m = mn;
    }
    if (lane == 0) {
        Ms[w] = m;
        Ls[w] = l;
    }
    for (int i = 0; i < NACC; i++) {
        int d = lane + 32 * i;
        if (d < D)
            As[w * D + d] = acc[i];
    }
    __syncthreads();
    if (w != 0)
        return;
    float M = -INFINITY;
    for (int u = 0; u < DEC_W; u++)
        M = fmaxf(M, Ms[u]);
    float L = 0.0f;
    for (int u = 0; u < DEC_W; u++)
        L += Ms[u] == -INFINITY ? 0.0f : Ls[u] * expf(Ms[u] - M);
    for (int i = 0; i < NACC; i++) {
        int d = lane + 32 * i;
        if (d >= D)
            continue;
        float a = 0.0f;
        for (int u = 0; u < DEC_W; u++)
            a += Ms[u] == -INFINITY ? 0.0f : As[u * D + d] * expf(Ms[u] - M);
        if (nsplit > 1)
            part[((size_t)blockIdx.z * Hq + h) * nsplit * (D + 2) + (size_t)split * (D + 2) + 2 + d] = a;
        else
            out[qi * D + d] = valid ? a / L : 0.0f;
    }
    if (lane == 0) {
        if (nsplit > 1) {
            float *pr = part + ((size_t)blockIdx.z * Hq + h) * nsplit * (D + 2) + (size_t)split * (D + 2);
            pr[0] = M;
            pr[1] = L;
        } else if (lse) {
            lse[qi] = valid ? M + logf(L) : 0.0f;
        }
    }
}

/* One warp per (row, head): merge nsplit partials. grid (B*T*Hq), 32 threads. */
__global__ void k_attn_combine(float *out, float *lse, const float *part, const int *lens_, int T, int Hq, int D,
                               int nsplit)
{
    size_t r = blockIdx.x;   /* ((b*T + t)*Hq + h) */
    int b = (int)(r / ((size_t)T * Hq)), t = (int)(r / Hq % T);
    bool valid = t < lens_[b];
    const float *pr = part + r * nsplit * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++)
        M = fmaxf(M, pr[(size_t)s * (D + 2)]);
    float L = 0.0f;
    for (int s = 0; s < nsplit; s++) {
        float ms = pr[(size_t)s * (D + 2)];
        L += ms == -INFINITY ? 0.0f : pr[(size_t)s * (D + 2) + 1] * expf(ms - M);
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < nsplit; s++) {
            float ms = pr[(size_t)s * (D + 2)];
            a += ms == -INFINITY ? 0.0f : pr[(size_t)s * (D + 2) + 2 + d] * expf(ms - M);
        }
        out[r * D + d] = valid ? a / L : 0.0f;
    }
    if (lse && threadIdx.x == 0)
        lse[r] = valid ? M + logf(L) : 0.0f;
}

/* Call launch(std::integral_constant<int, NACC>{}) with the accumulator count the
 * kernels are built for that covers head dim D: 1 (D <= 32), 2 (D <= 64) or 4. */
template <typename F>
static void with_nacc(int D, F launch)
{
    if (D <= 32)
        launch(std::integral_constant<int, 1>{});
    else if (D <= 64)
        launch(std::integral_constant<int, 2>{});
    else
        launch(std::integral_constant<int, 4>{});
}

static int attn_check(eng_backend *be, int T, int S, int Hq, int Hkv, int D)
{
    if (D > CU_ATTN_MAX_D || D < 1 || Hkv < 1 || Hq % Hkv != 0) {
        char why[96];
        snprintf(why, sizeof why, "unsupported shape Hq=%d Hkv=%d D=%d (head_dim <= %d)", Hq, Hkv, D, CU_ATTN_MAX_D);
        cu_set_error(be, __FILE__, __LINE__, "attention", why);
        return -1;
    }
    (void)T;
    (void)S;
    return 0;
}

static void cu_attn_fwd(eng_backend *be, float *out, float *lse, const float *q, const float *k,
                        const float *v, const int *pos0, const int *lens,
                        int B, int T, int S, int Hq, int Hkv, int D, float scale)
{
    cu_impl *c = cu_of(be);
    if (B <= 0 || T <= 0 || Hq <= 0 || cu_enter(be) != 0 || attn_check(be, T, S, Hq, Hkv, D) != 0)
        return;
    if (T > DEC_MAX_T) {
        dim3 grid((unsigned)((T + QW - 1) / QW), (unsigned)Hq, (unsigned)B);
        size_t shm = sizeof(float) * ((size_t)KT * (D + 1) + (size_t)KT * D + (size_t)QW * D);
        with_nacc(D, [&](auto n) {
            k_attn_fwd_tiled<decltype(n)::value><<<grid, QW * 32, shm, c->stream>>>(out, lse, q, k, v, pos0, lens, T, S, Hq, Hkv, D, scale);
        });
        CHECK_LAUNCH(be);
        return;
    }
    /* Decode: split the keys so that the grid fills the device (about 2 blocks per SM),
     * with at least 128 keys per split. The key count is not known on the host (pos0
     * is on the device), so splits cover the capacity S; empty ones merge as nothing. */
    long rows = (long)B * T * Hq;
    int nsplit = (int)((2L * c->sms + rows - 1) / rows);
    int max_split = (S + 127) / 128;
    if (nsplit > max_split)
        nsplit = max_split;
    if (nsplit < 1)
        nsplit = 1;
    int chunk = (S + nsplit - 1) / nsplit;
    float *part = NULL;
    if (nsplit > 1) {
        part = (float *)cu_workspace(be, sizeof(float) * (size_t)rows * nsplit * (D + 2));
        if (!part)
            return;
    }
    dim3 grid((unsigned)nsplit, (unsigned)Hq, (unsigned)(B * T));
    size_t shm = sizeof(float) * ((size_t)D + 2 * DEC_W + (size_t)DEC_W * D);
    with_nacc(D, [&](auto n) {
        k_attn_decode<decltype(n)::value><<<grid, DEC_W * 32, shm, c->stream>>>(out, lse, part, q, k, v, pos0, lens, T, S, Hq, Hkv, D, scale, chunk);
    });
    CHECK_LAUNCH(be);
    if (nsplit > 1) {
        k_attn_combine<<<(unsigned)rows, 32, 0, c->stream>>>(out, lse, part, lens, T, Hq, D, nsplit);
        CHECK_LAUNCH(be);
    }
}

/* ---- backward -------------------------------------------------------------------- */

/* di[r] = dout[r,:] . out[r,:] for valid queries, 0 otherwise. One thread per row,
 * summing in the same order and with the same fmaf as dout.v in the kernels below, so
 * that dout.v - di is exactly 0 where out == v (a query attending one key), as on the
 * CPU; otherwise the cancellation leaves rounding noise in dk. */
__global__ void k_attn_di(float *di, const float *dout, const float *out, const int *lens_, int T, int Hq, int D,
                          size_t rows)
{
    size_t r = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (r >= rows)
        return;
    int b = (int)(r / ((size_t)T * Hq)), t = (int)(r / Hq % T);
    float s = 0.0f;
    if (t < lens_[b])
        for (int d = 0; d < D; d++)
            s = fmaf(dout[r * D + d], out[r * D + d], s);
    di[r] = s;
}

/* dq: grid (ceil(T/QW), Hq, B), QW warps, one query per warp. Shared: Ks[KT][D+1],
 * Vs[KT][D+1], Qs[QW][D], Gs[QW][D]. dq = scale * sum_j p_j (dout.v_j - di) k_j. */
template <int NACC>
__global__ void k_attn_bwd_dq(float *dq, const float *dout, const float *q, const float *k, const float *v,
                              const float *lse, const float *di, const int *pos0_, const int *lens_, int T, int S,
                              int Hq, int Hkv, int D, float scale)
{
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = Ks + KT * (D + 1), *Qs = Vs + KT * (D + 1), *Gs = Qs + QW * D;
    int b = blockIdx.z, h = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int hk = h / (Hq / Hkv);
    int t = (int)blockIdx.x * QW + w;
    int pos0 = pos0_[b], len = min(lens_[b], T);
    bool valid = t < len;
    size_t qi = ((size_t)b * T + t) * Hq + h;
    for (int d = lane; d < D; d += 32) {
        Qs[w * D + d] = valid ? q[qi * D + d] : 0.0f;
        Gs[w * D + d] = valid ? dout[qi * D + d] : 0.0f;
    }
    float l = valid ? lse[qi] : 0.0f, dI = valid ? di[qi] : 0.0f;
    int tfirst = (int)blockIdx.x * QW, tlast = min(tfirst + QW, len) - 1;
    int kmax = tlast >= tfirst ? attn_nk(pos0, tlast, S) : 0;
    int nk = valid ? attn_nk(pos0, t, S) : 0;
    float acc[NACC];
    for (int i = 0; i < NACC; i++)
        acc[i] = 0.0f;
    size_t kvrow = (size_t)Hkv * D;
    const float *kb = k + (size_t)b * S * kvrow + (size_t)hk * D;
    const float *vb = v + (size_t)b * S * kvrow + (size_t)hk * D;
    for (int j0 = 0; j0 < kmax; j0 += KT) {
        __syncthreads();
        for (int e = threadIdx.x; e < KT * D; e += blockDim.x) {
            int j = e / D, d = e % D;
            bool in = j0 + j < kmax;
            Ks[j * (D + 1) + d] = in ? kb[(size_t)(j0 + j) * kvrow + d] : 0.0f;
            Vs[j * (D + 1) + d] = in ? vb[(size_t)(j0 + j) * kvrow + d] : 0.0f;
        }
        __syncthreads();
        if (j0 >= nk)
            continue;
        float ds = 0.0f;
        if (j0 + lane < nk) {
            const float *kr = Ks + lane * (D + 1), *vr = Vs + lane * (D + 1);
            const float *qr = Qs + w * D, *gr = Gs + w * D;
            float sq = 0.0f, sg = 0.0f;
            for (int d = 0; d < D; d++) {
                sq += qr[d] * kr[d];
                sg = fmaf(gr[d], vr[d], sg);   /* same order and rounding as k_attn_di */
            }
            float p = expf(sq * scale - l);
            ds = p * (sg - dI) * scale;
        }
        int jn = min(KT, nk - j0);
        for (int jj = 0; jj < jn; jj++) {
            float dsj = __shfl_sync(0xffffffffu, ds, jj);
            for (int i = 0; i < NACC; i++) {
                int d = lane + 32 * i;
                if (d < D)
                    acc[i] += dsj * Ks[jj * (D + 1) + d];
            }
        }
    }
    if (t >= T)
        return;
    for (int i = 0; i < NACC; i++) {
        int d = lane + 32 * i;
        if (d < D)
            dq[qi * D + d] = acc[i];
    }
}

/* dk, dv: grid (ceil(S/QW), Hkv, B), QW warps, one key j per warp, over every query
 * head of the KV group and every query that attends j. Shared: Qt[KT][D+1],
 * Gt[KT][D+1], Kw[QW][D], Vw[QW][D], Lt[KT], Dt[KT].
 *   dv_j = sum p dout,  dk_j = sum scale * p (dout.v_j - di) q. */
template <int NACC>
__global__ void k_attn_bwd_dkdv(float *dk, float *dv, const float *dout, const float *q, const float *k,
                                const float *v, const float *lse, const float *di, const int *pos0_,
                                const int *lens_, int T, int S, int Hq, int Hkv, int D, float scale)
{
    extern __shared__ float sm[];
    float *Qt = sm, *Gt = Qt + KT * (D + 1), *Kw = Gt + KT * (D + 1), *Vw = Kw + QW * D, *Lt = Vw + QW * D,
          *Dt = Lt + KT;
    int b = blockIdx.z, hk = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int grp = Hq / Hkv;
    int j = (int)blockIdx.x * QW + w;
    int pos0 = pos0_[b], len = min(lens_[b], T);
    size_t kvrow = (size_t)Hkv * D;
    size_t ko = ((size_t)b * S + j) * kvrow + (size_t)hk * D;
    for (int d = lane; d < D; d += 32) {
        Kw[w * D + d] = j < S ? k[ko + d] : 0.0f;
        Vw[w * D + d] = j < S ? v[ko + d] : 0.0f;
    }
    /* Query t attends j iff j <= pos0 + t (and j < S): t >= j - pos0. */
    int jfirst = (int)blockIdx.x * QW;
    int tstart = max(0, jfirst - pos0);
    int tmin_w = max(0, j - pos0);
    float ak[NACC], av[NACC];
    for (int i = 0; i < NACC; i++)
        ak[i] = av[i] = 0.0f;
    for (int h = hk * grp; h < (hk + 1) * grp; h++) {
        for (int t0 = tstart; t0 < len; t0 += KT) {
            __syncthreads();
            for (int e = threadIdx.x; e < KT * D; e += blockDim.x) {
                int i = e / D, d = e % D, t = t0 + i;
                size_t qi = ((size_t)b * T + t) * Hq + h;
                bool in = t < len;
                Qt[i * (D + 1) + d] = in ? q[qi * D + d] : 0.0f;
                Gt[i * (D + 1) + d] = in ? dout[qi * D + d] : 0.0f;
            }
            for (int i = threadIdx.x; i < KT; i += blockDim.x) {
                int t = t0 + i;
                size_t qi = ((size_t)b * T + t) * Hq + h;
                Lt[i] = t < len ? lse[qi] : 0.0f;
                Dt[i] = t < len ? di[qi] : 0.0f;
            }
            __syncthreads();
            if (j >= S || t0 + KT <= tmin_w)
                continue;   /* warp-uniform: no query of this tile attends j */
            int t = t0 + lane;
            float p = 0.0f, ds = 0.0f;
            if (t < len && t >= tmin_w) {
                const float *qr = Qt + lane * (D + 1), *gr = Gt + lane * (D + 1);
                const float *kr = Kw + w * D, *vr = Vw + w * D;
                float sq = 0.0f, sg = 0.0f;
                for (int d = 0; d < D; d++) {
                    sq += qr[d] * kr[d];
                    sg = fmaf(gr[d], vr[d], sg);   /* same order and rounding as k_attn_di */
                }
                p = expf(sq * scale - Lt[lane]);
                ds = p * (sg - Dt[lane]) * scale;
            }
            for (int ii = 0; ii < KT; ii++) {
                float pi = __shfl_sync(0xffffffffu, p, ii);
                float dsi = __shfl_sync(0xffffffffu, ds, ii);
                for (int a = 0; a < NACC; a++) {
                    int d = lane + 32 * a;
                    if (d < D) {
                        av[a] += pi * Gt[ii * (D + 1) + d];
                        ak[a] += dsi * Qt[ii * (D + 1) + d];
                    }
                }
            }
        }
    }
    if (j >= S)
        return;
    for (int a = 0; a < NACC; a++) {
        int d = lane + 32 * a;
        if (d < D) {
            dk[ko + d] = ak[a];
            dv[ko + d] = av[a];
        }
    }
}

static void cu_attn_bwd(eng_backend *be, float *dq, float *dk, float *dv, const float *dout,
                        const float *q, const float *k, const float *v, const float *out,
                        const float *lse, const int *pos0, const int *lens,
                        int B, int T, int S, int Hq, int Hkv, int D, float scale)
{
    cu_impl *c = cu_of(be);
    if (B <= 0 || T <= 0 || Hq <= 0 || cu_enter(be) != 0 || attn_check(be, T, S, Hq, Hkv, D) != 0)
        return;
    size_t rows = (size_t)B * T * Hq;
    float *di = (float *)cu_workspace(be, sizeof(float) * rows);
    if (!di)
        return;
    k_attn_di<<<(unsigned)((rows + 255) / 256), 256, 0, c->stream>>>(di, dout, out, lens, T, Hq, D, rows);
    CHECK_LAUNCH(be);
    dim3 gq((unsigned)((T + QW - 1) / QW), (unsigned)Hq, (unsigned)B);
    size_t shq = sizeof(float) * (2 * (size_t)KT * (D + 1) + 2 * (size_t)QW * D);
    with_nacc(D, [&](auto n) {
        k_attn_bwd_dq<decltype(n)::value><<<gq, QW * 32, shq, c->stream>>>(dq, dout, q, k, v, lse, di, pos0, lens, T, S, Hq, Hkv, D, scale);
    });
    CHECK_LAUNCH(be);
    if (S <= 0)
        return;
    dim3 gk((unsigned)((S + QW - 1) / QW), (unsigned)Hkv, (unsigned)B);
    size_t shk = sizeof(float) * (2 * (size_t)KT * (D + 1) + 2 * (size_t)QW * D + 2 * KT);
    with_nacc(D, [&](auto n) {
        k_attn_bwd_dkdv<decltype(n)::value><<<gk, QW * 32, shk, c->stream>>>(dk, dv, dout, q, k, v, lse, di, pos0, lens, T, S, Hq, Hkv, D, scale);
    });
    CHECK_LAUNCH(be);
}

void cu_attn_install(eng_backend *be)
{
    be->attn_fwd = cu_attn_fwd;
    be->attn_bwd = cu_attn_bwd;
}
