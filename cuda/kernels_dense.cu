/* cuda/kernels_dense.cu — every CUDA op except attention: cuBLAS GEMM (fp32, or bf16 /
 * fp16 operands with fp32 accumulation), RMSNorm, RoPE, SwiGLU, embedding, losses,
 * masks, reductions and AdamW. Each kernel follows the CPU reference in
 * engine/backend_cpu.c; sums that the CPU takes in double are taken here as float
 * per-thread partials combined in double (agreement well inside 1e-5 relative).
 */
#include "cuda/cu_internal.h"
#include "cuda/cu_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <string.h>

#define CU_TWO_PI 6.283185307179586476925286766559   /* 2*M_PI (M_PI is not ISO C++) */

/* ---- GEMM -------------------------------------------------------------------------- */

__global__ void k_scale_rows(float *C, int M, int N, int ldc, float beta)
{
    size_t total = (size_t)M * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / N, c = i % N;
        float *p = C + r * ldc + c;
        *p = beta == 0.0f ? 0.0f : beta * *p;
    }
}

template <typename H>
__device__ __forceinline__ H to_half_t(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 to_half_t<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half to_half_t<__half>(float x) { return __float2half_rn(x); }

/* dst [rows, cols] compact <- src [rows, cols] with row stride ld. */
template <typename H>
__global__ void k_convert(H *dst, const float *src, int rows, int cols, int ld)
{
    size_t total = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / cols, c = i % cols;
        dst[i] = to_half_t<H>(src[r * ld + c]);
    }
}

/* Row-major C = alpha op(A) op(B) + beta C as a column-major cuBLAS call on the
 * transposes: C^T[N,M] = op(B)^T op(A)^T, with B passed first. */
static void cu_gemm(eng_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                    const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    cu_impl *c = cu_of(be);
    if (M <= 0 || N <= 0 || cu_enter(be) != 0)
        return;
    if (K <= 0) {
        k_scale_rows<<<grid_for((size_t)M * N), NT, 0, c->stream>>>(C, M, N, ldc, beta);
        CHECK_LAUNCH(be);
        return;
    }
    cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (c->prec == CU_PREC_FP32) {
        CHECK_CUBLAS(be, cublasGemmEx(c->blas, opB, opA, N, M, K, &alpha, B, CUDA_R_32F, ldb, A,
                                      CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
        return;
    }
    /* Round both operands to 16 bits into the workspace (compact rows), then multiply
     * with fp32 accumulation into the fp32 C. */
    int ra = ta ? K : M, ca = ta ? M : K;
    int rb = tb ? N : K, cb = tb ? K : N;
    size_t na = (size_t)ra * ca, nb = (size_t)rb * cb;
    size_t off_b = (na * 2 + 255) & ~(size_t)255;
    char *ws = (char *)cu_workspace(be, off_b + nb * 2);
    if (!ws)
        return;
    cudaDataType_t t16;
    if (c->prec == CU_PREC_BF16) {
        t16 = CUDA_R_16BF;
        k_convert<__nv_bfloat16><<<grid_for(na), NT, 0, c->stream>>>((__nv_bfloat16 *)ws, A, ra, ca, lda);
        k_convert<__nv_bfloat16><<<grid_for(nb), NT, 0, c->stream>>>((__nv_bfloat16 *)(ws + off_b), B, rb, cb, ldb);
    } else {
        t16 = CUDA_R_16F;
        k_convert<__half><<<grid_for(na), NT, 0, c->stream>>>((__half *)ws, A, ra, ca, lda);
        k_convert<__half><<<grid_for(nb), NT, 0, c->stream>>>((__half *)(ws + off_b), B, rb, cb, ldb);
    }
    CHECK_LAUNCH(be);
    CHECK_CUBLAS(be, cublasGemmEx(c->blas, opB, opA, N, M, K, &alpha, ws + off_b, t16, cb, ws, t16, ca,
                                  &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* ---- RMSNorm ----------------------------------------------------------------------- */

/* One block per row. */
__global__ void k_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int C, float n_eff, float eps)
{
    __shared__ double shd[32];
    int n = blockIdx.x;
    const float *xr = x + (size_t)n * C;
    float *yr = y + (size_t)n * C;
    float p = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        p += xr[c] * xr[c];
    double ss = cu_block_sum_d((double)p, shd);
    float r = (float)(1.0 / sqrt(ss / n_eff + eps));
    if (rstd && threadIdx.x == 0)
        rstd[n] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        yr[c] = xr[c] * r * w[c];
}

static void cu_rmsnorm_fwd(eng_backend *be, float *y, float *rstd, const float *x, const float *w,
                           int N, int C, float n_eff, float eps)
{
    if (N <= 0 || cu_enter(be) != 0)
        return;
    k_rmsnorm_fwd<<<N, NT, 0, cu_of(be)->stream>>>(y, rstd, x, w, C, n_eff, eps);
    CHECK_LAUNCH(be);
}

/* One block per row: dx (acc) and the row's d_neff term. */
__global__ void k_rmsnorm_bwd_dx(float *dx, float *d_neff, const float *dy, const float *x, const float *w,
                                 const float *rstd, int C, float n_eff)
{
    __shared__ double shd[32];
    int n = blockIdx.x;
    const float *xr = x + (size_t)n * C, *gr = dy + (size_t)n * C;
    float *dr = dx + (size_t)n * C;
    float ps = 0.0f, pss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        ps += gr[c] * w[c] * xr[c];
        pss += xr[c] * xr[c];
    }
    double s = cu_block_sum_d((double)ps, shd);
    double ss = cu_block_sum_d((double)pss, shd);
    double r = rstd[n];
    float k = (float)(r * r * r / n_eff * s);
    float rf = (float)r;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dr[c] += rf * w[c] * gr[c] - xr[c] * k;
    if (d_neff && threadIdx.x == 0)
        atomicAdd(d_neff, (float)(r * r * r * ss / (2.0 * (double)n_eff * n_eff) * s));
}

#define DW_ROWS 64
/* grid (ceil(C/NT), ceil(N/DW_ROWS)): each thread sums one column over a chunk of rows. */
__global__ void k_rmsnorm_bwd_dw(float *dw, const float *dy, const float *x, const float *rstd, int N, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    int n0 = blockIdx.y * DW_ROWS, n1 = min(N, n0 + DW_ROWS);
    float acc = 0.0f;
    for (int n = n0; n < n1; n++)
        acc += dy[(size_t)n * C + c] * x[(size_t)n * C + c] * rstd[n];
    atomicAdd(dw + c, acc);
}

static void cu_rmsnorm_bwd(eng_backend *be, float *dx, float *dw, float *d_neff, const float *dy,
                           const float *x, const float *w, const float *rstd, int N, int C, float n_eff)
{
    cu_impl *c = cu_of(be);
    if (N <= 0 || cu_enter(be) != 0)
        return;
    k_rmsnorm_bwd_dx<<<N, NT, 0, c->stream>>>(dx, d_neff, dy, x, w, rstd, C, n_eff);
    CHECK_LAUNCH(be);
    if (dw) {
        dim3 g((unsigned)((C + NT - 1) / NT), (unsigned)((N + DW_ROWS - 1) / DW_ROWS));
        k_rmsnorm_bwd_dw<<<g, NT, 0, c->stream>>>(dw, dy, x, rstd, N, C);
        CHECK_LAUNCH(be);
    }
}

/* ---- RoPE -------------------------------------------------------------------------- */

/* One thread per (row n, frequency i): the angle in double reduced to [0, 2pi) as on
 * the CPU, then the rotation applied to every head of the row. */
__global__ void k_rope(float *x, const int *pos, const float *inv_freq, int N, int H, int D, float sign)
{
    int half = D / 2;
    size_t total = (size_t)N * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        int n = (int)(idx / half), i = (int)(idx % half);
        double ang = (double)pos[n] * (double)inv_freq[i];
        ang -= CU_TWO_PI * floor(ang / CU_TWO_PI);
        float cs = (float)cos(ang), sn = sign * (float)sin(ang);
        for (int h = 0; h < H; h++) {
            float *v = x + ((size_t)n * H + h) * D;
            float x1 = v[i], x2 = v[i + half];
            v[i] = x1 * cs - x2 * sn;
            v[i + half] = x2 * cs + x1 * sn;
        }
    }
}

static void rope_launch(eng_backend *be, float *x, const int *pos, const float *inv_freq, int N, int H, int D, float sign)
{
    if (N <= 0 || D < 2 || cu_enter(be) != 0)
        return;
    k_rope<<<grid_for((size_t)N * (D / 2)), NT, 0, cu_of(be)->stream>>>(x, pos, inv_freq, N, H, D, sign);
    CHECK_LAUNCH(be);
}

static void cu_rope_fwd(eng_backend *be, float *x, const int *pos, const float *inv_freq, int N, int H, int D)
{
    rope_launch(be, x, pos, inv_freq, N, H, D, 1.0f);
}

static void cu_rope_bwd(eng_backend *be, float *dx, const int *pos, const float *inv_freq, int N, int H, int D)
{
    rope_launch(be, dx, pos, inv_freq, N, H, D, -1.0f);
}

/* ---- SwiGLU and embedding ---------------------------------------------------------- */


__global__ void k_swiglu_fwd(float *h, const float *gate, const float *up, size_t n)
{
    GRID_STRIDE(i, n) {
        float g = gate[i];
        h[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ void k_swiglu_bwd(float *dgate, float *dup, const float *dh, const float *gate, const float *up, size_t n)
{
    GRID_STRIDE(i, n) {
        float g = gate[i], s = 1.0f / (1.0f + expf(-g)), d = dh[i];
        float u = up[i];   /* read before writing: dup may alias up in callers' reuse */
        dup[i] = d * g * s;
        dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
    }
}

static void cu_swiglu_fwd(eng_backend *be, float *h, const float *gate, const float *up, size_t n)
{
    if (!n || cu_enter(be) != 0)
        return;
    k_swiglu_fwd<<<grid_for(n), NT, 0, cu_of(be)->stream>>>(h, gate, up, n);
    CHECK_LAUNCH(be);
}

static void cu_swiglu_bwd(eng_backend *be, float *dgate, float *dup, const float *dh,
                          const float *gate, const float *up, size_t n)
{
    if (!n || cu_enter(be) != 0)
        return;
    k_swiglu_bwd<<<grid_for(n), NT, 0, cu_of(be)->stream>>>(dgate, dup, dh, gate, up, n);
    CHECK_LAUNCH(be);
}

__global__ void k_embed_fwd(float *out, const float *table, const int *tokens, int N, int C)
{
    GRID_STRIDE(i, (size_t)N * C) {
        size_t n = i / C, c = i % C;
        out[i] = table[(size_t)tokens[n] * C + c];
    }
}

__global__ void k_embed_bwd(float *dtable, const float *dout, const int *tokens, int N, int C)
{
    GRID_STRIDE(i, (size_t)N * C) {
        size_t n = i / C, c = i % C;
        atomicAdd(dtable + (size_t)tokens[n] * C + c, dout[i]);
    }
}

static void cu_embed_fwd(eng_backend *be, float *out, const float *table, const int *tokens, int N, int C)
{
    if (N <= 0 || C <= 0 || cu_enter(be) != 0)
        return;
    k_embed_fwd<<<grid_for((size_t)N * C), NT, 0, cu_of(be)->stream>>>(out, table, tokens, N, C);
    CHECK_LAUNCH(be);
}

static void cu_embed_bwd(eng_backend *be, float *dtable, const float *dout, const int *tokens, int N, int C)
{
    if (N <= 0 || C <= 0 || cu_enter(be) != 0)
        return;
    k_embed_bwd<<<grid_for((size_t)N * C), NT, 0, cu_of(be)->stream>>>(dtable, dout, tokens, N, C);
    CHECK_LAUNCH(be);
}

/* ---- losses ------------------------------------------------------------------------ */

/* Block-wide log-sum-exp of x[V]*inv_tau (max of the raw row first, as on the CPU). */
__device__ float row_lse(const float *x, int V, float inv_tau, float *sh)
{
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, x[i]);
    mx = cu_block_max(mx, sh);
    float s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        s += expf((x[i] - mx) * inv_tau);
    s = cu_block_sum(s, sh);
    return mx * inv_tau + logf(s);
}

/* One block per row. */
__global__ void k_xent(float *loss, float *dlogits, float dscale, const float *logits, const int *targets, int V)
{
    __shared__ float sh[32];
    int r = blockIdx.x, t = targets[r];
    if (t < 0 || t >= V) {
        if (threadIdx.x == 0)
            loss[r] = 0.0f;
        return;
    }
    const float *x = logits + (size_t)r * V;
    float l = row_lse(x, V, 1.0f, sh);
    if (threadIdx.x == 0)
        loss[r] = l - x[t];
    if (dlogits) {
        float *d = dlogits + (size_t)r * V;
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            d[i] += dscale * expf(x[i] - l) - (i == t ? dscale : 0.0f);
    }
}

static void cu_xent(eng_backend *be, float *loss, float *dlogits, float dscale,
                    const float *logits, const int *targets, int R, int V)
{
    if (R <= 0 || cu_enter(be) != 0)
        return;
    k_xent<<<R, 512, 0, cu_of(be)->stream>>>(loss, dlogits, dscale, logits, targets, V);
    CHECK_LAUNCH(be);
}

__global__ void k_kl(float *loss, float *dlogits, float dscale, const float *s_logits, const float *t_logits,
                     const int *targets, int V, float tau)
{
    __shared__ float sh[32];
    __shared__ double shd[32];
    int r = blockIdx.x;
    if (targets && targets[r] < 0) {
        if (threadIdx.x == 0)
            loss[r] = 0.0f;
        return;
    }
    float it = 1.0f / tau;
    const float *s = s_logits + (size_t)r * V, *t = t_logits + (size_t)r * V;
    float ls = row_lse(s, V, it, sh), lt = row_lse(t, V, it, sh);
    float *d = dlogits ? dlogits + (size_t)r * V : NULL;
    float kl = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float lp = t[i] * it - lt, lq = s[i] * it - ls, p = expf(lp);
        kl += p * (lp - lq);
        if (d)
            d[i] += dscale * tau * (expf(lq) - p);
    }
    double tot = cu_block_sum_d((double)kl, shd);
    if (threadIdx.x == 0)
        loss[r] = (float)(tot * tau * tau);
}

static void cu_kl(eng_backend *be, float *loss, float *dlogits, float dscale, const float *s_logits,
                  const float *t_logits, const int *targets, int R, int V, float tau)
{
    if (R <= 0 || cu_enter(be) != 0)
        return;
    k_kl<<<R, 512, 0, cu_of(be)->stream>>>(loss, dlogits, dscale, s_logits, t_logits, targets, V, tau);
    CHECK_LAUNCH(be);
}

/* one block per row: the three sums in double, then the row's gradient */
__global__ void k_cosd(float *loss, float *da, float dscale, const float *a, const float *b, int ldb, const float *w,
                       int C)
{
    __shared__ double shd[32];
    size_t r = blockIdx.x;
    const float *x = a + r * C, *y = b + r * (size_t)ldb;
    double pxy = 0, pxx = 0, pyy = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        double ww = (double)w[c] * w[c];
        pxy += ww * x[c] * y[c];
        pxx += ww * x[c] * x[c];
        pyy += ww * y[c] * y[c];
    }
    double xy = cu_block_sum_d(pxy, shd), xx = cu_block_sum_d(pxx, shd), yy = cu_block_sum_d(pyy, shd);
    if (!(xx > 0) || !(yy > 0)) {
        if (threadIdx.x == 0)
            loss[r] = 0.0f;
        return;
    }
    double na = sqrt(xx), nb = sqrt(yy), cs = xy / (na * nb);
    if (threadIdx.x == 0)
        loss[r] = (float)(1.0 - cs);
    if (!da)
        return;
    float ka = (float)(dscale * cs / xx), kb = (float)(dscale / (na * nb));
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        da[r * C + c] += w[c] * w[c] * (ka * x[c] - kb * y[c]);
}

static void cu_cosd(eng_backend *be, float *loss, float *da, float dscale, const float *a, const float *b, int ldb,
                    const float *w, int R, int C)
{
    if (R <= 0 || C <= 0 || cu_enter(be) != 0)
        return;
    k_cosd<<<(unsigned)R, NT, 0, cu_of(be)->stream>>>(loss, da, dscale, a, b, ldb, w, C);
    CHECK_LAUNCH(be);
}

/* ---- elementwise ------------------------------------------------------------------- */

__global__ void k_add(float *y, const float *a, const float *b, size_t n)
{
    GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}
__global__ void k_axpy(float *y, float alpha, const float *alpha_dev, const float *x, size_t n)
{
    float a = alpha_dev ? *alpha_dev : alpha;
    GRID_STRIDE(i, n) y[i] += a * x[i];
}
__global__ void k_scale(float *x, float alpha, size_t n)
{
    GRID_STRIDE(i, n) x[i] *= alpha;
}
__global__ void k_fill(float *x, float value, size_t n)
{
    GRID_STRIDE(i, n) x[i] = value;
}

static void cu_add(eng_backend *be, float *y, const float *a, const float *b, size_t n)
{
    if (!n || cu_enter(be) != 0)
        return;
    k_add<<<grid_for(n), NT, 0, cu_of(be)->stream>>>(y, a, b, n);
    CHECK_LAUNCH(be);
}
static void cu_axpy(eng_backend *be, float *y, float alpha, const float *x, size_t n)
{
    if (!n || cu_enter(be) != 0)
        return;
    k_axpy<<<grid_for(n), NT, 0, cu_of(be)->stream>>>(y, alpha, NULL, x, n);
    CHECK_LAUNCH(be);
}
static void cu_axpy_dev(eng_backend *be, float *y, const float *alpha_dev, const float *x, size_t n)
{
    if (!n || cu_enter(be) != 0)
        return;
    k_axpy<<<grid_for(n), NT, 0, cu_of(be)->stream>>>(y, 0.0f, alpha_dev, x, n);
    CHECK_LAUNCH(be);
}
static void cu_scale(eng_backend *be, float *x, float alpha, size_t n)
{
    if (!n || cu_enter(be) != 0)
        return;
    k_scale<<<grid_for(n), NT, 0, cu_of(be)->stream>>>(x, alpha, n);
    CHECK_LAUNCH(be);
}
static void cu_fill(eng_backend *be, float *x, float value, size_t n)
{
    if (!n || cu_enter(be) != 0)
        return;
    k_fill<<<grid_for(n), NT, 0, cu_of(be)->stream>>>(x, value, n);
    CHECK_LAUNCH(be);
}

__global__ void k_bias_add(float *y, const float *b, int N, int M)
{
    GRID_STRIDE(i, (size_t)N * M) y[i] += b[i % M];
}
static void cu_bias_add(eng_backend *be, float *y, const float *b, int N, int M)
{
    if (N <= 0 || M <= 0 || cu_enter(be) != 0)
        return;
    k_bias_add<<<grid_for((size_t)N * M), NT, 0, cu_of(be)->stream>>>(y, b, N, M);
    CHECK_LAUNCH(be);
}

/* ---- rows (MoE routing) ------------------------------------------------------------- */
__global__ void k_gather_rows(float *out, const float *x, const int *idx, const float *w, int n, int C)
{
    GRID_STRIDE(i, (size_t)n * C)
    {
        size_t r = i / C, c = i % C;
        out[i] = (w ? w[r] : 1.0f) * x[(size_t)idx[r] * C + c];
    }
}
static void cu_gather_rows(eng_backend *be, float *out, const float *x, const int *idx, const float *w, int n, int C)
{
    if (n <= 0 || C <= 0 || cu_enter(be) != 0)
        return;
    k_gather_rows<<<grid_for((size_t)n * C), NT, 0, cu_of(be)->stream>>>(out, x, idx, w, n, C);
    CHECK_LAUNCH(be);
}
/* idx distinct within a call: no two threads write one element */
__global__ void k_scatter_rows(float *y, const float *x, const int *idx, const float *w, int n, int C)
{
    GRID_STRIDE(i, (size_t)n * C)
    {
        size_t r = i / C, c = i % C;
        y[(size_t)idx[r] * C + c] += (w ? w[r] : 1.0f) * x[i];
    }
}
static void cu_scatter_rows_acc(eng_backend *be, float *y, const float *x, const int *idx, const float *w, int n,
                                int C)
{
    if (n <= 0 || C <= 0 || cu_enter(be) != 0)
        return;
    k_scatter_rows<<<grid_for((size_t)n * C), NT, 0, cu_of(be)->stream>>>(y, x, idx, w, n, C);
    CHECK_LAUNCH(be);
}
/* one block of NT threads per row, a shared-memory tree sum */
__global__ void k_rows_dot(float *out, const float *a, const float *b, int C)
{
    __shared__ float part[NT];
    size_t r = blockIdx.x;
    float s = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        s += a[r * C + c] * b[r * C + c];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k /= 2) {
        if ((int)threadIdx.x < k)
            part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        out[r] = part[0];
}
static void cu_rows_dot(eng_backend *be, float *out, const float *a, const float *b, int n, int C)
{
    if (n <= 0 || C <= 0 || cu_enter(be) != 0)
        return;
    k_rows_dot<<<(unsigned)n, NT, 0, cu_of(be)->stream>>>(out, a, b, C);
    CHECK_LAUNCH(be);
}

/* y[n,g,d] = x[n,g,d] * m[g] (y may alias x). */
__global__ void k_mask(float *y, const float *x, const float *m, int N, int G, int D)
{
    GRID_STRIDE(i, (size_t)N * G * D) y[i] = x[i] * m[(i / D) % G];
}
static void cu_mask_fwd(eng_backend *be, float *y, const float *x, const float *m, int N, int G, int D)
{
    if (N <= 0 || G <= 0 || D <= 0 || cu_enter(be) != 0)
        return;
    k_mask<<<grid_for((size_t)N * G * D), NT, 0, cu_of(be)->stream>>>(y, x, m, N, G, D);
    CHECK_LAUNCH(be);
}

/* ---- group reductions ---------------------------------------------------------------
 * out[g] += sum_n f(n, g) over x [N, G*D]: kind 0 = sum_d dy*x, 1 = L2 norm of the
 * group (|x| when D == 1), 2 = sum_d x. grid (ceil(G/NT), ceil(N/GR_ROWS)); each thread
 * owns one g for a chunk of rows and adds its partial once. */
#define GR_ROWS 32
__global__ void k_group_reduce(float *out, const float *dy, const float *x, int N, int G, int D, int kind)
{
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= G)
        return;
    size_t row = (size_t)G * D;
    int n0 = blockIdx.y * GR_ROWS, n1 = min(N, n0 + GR_ROWS);
    double acc = 0.0;
    for (int n = n0; n < n1; n++) {
        const float *xr = x + n * row + (size_t)g * D;
        float s = 0.0f;
        if (kind == 0) {
            const float *gr = dy + n * row + (size_t)g * D;
            for (int d = 0; d < D; d++)
                s += gr[d] * xr[d];
        } else if (kind == 1) {
            for (int d = 0; d < D; d++)
                s += xr[d] * xr[d];
            s = D == 1 ? fabsf(xr[0]) : sqrtf(s);
        } else {
            for (int d = 0; d < D; d++)
                s += xr[d];
        }
        acc += s;
    }
    atomicAdd(out + g, (float)acc);
}

static void group_reduce(eng_backend *be, float *out, const float *dy, const float *x, int N, int G, int D, int kind)
{
    if (N <= 0 || G <= 0 || D <= 0)
        return;
    dim3 grid((unsigned)((G + NT - 1) / NT), (unsigned)((N + GR_ROWS - 1) / GR_ROWS));
    k_group_reduce<<<grid, NT, 0, cu_of(be)->stream>>>(out, dy, x, N, G, D, kind);
    CHECK_LAUNCH(be);
}

static void cu_mask_bwd(eng_backend *be, float *dx, float *dm, const float *dy, const float *x,
                        const float *m, int N, int G, int D)
{
    if (cu_enter(be) != 0)
        return;
    if (dm)
        group_reduce(be, dm, dy, x, N, G, D, 0);   /* before dx: dx may alias dy */
    cu_mask_fwd(be, dx, dy, m, N, G, D);
}

static void cu_colsum_acc(eng_backend *be, float *out, const float *x, int N, int M)
{
    if (cu_enter(be) != 0)
        return;
    group_reduce(be, out, NULL, x, N, M, 1, 2);
}

static void cu_group_norm_sum(eng_backend *be, float *out, const float *x, int N, int G, int D)
{
    if (cu_enter(be) != 0)
        return;
    group_reduce(be, out, NULL, x, N, G, D, 1);
}

/* ---- scalar reductions ------------------------------------------------------------- */

/* *outf += sum a*b (b NULL: a*a), or *outd += the same when outd is set. */
__global__ void k_dot(float *outf, double *outd, const float *a, const float *b, size_t n)
{
    __shared__ double shd[32];
    float p = 0.0f;
    GRID_STRIDE(i, n) p += a[i] * (b ? b[i] : a[i]);
    double s = cu_block_sum_d((double)p, shd);
    if (threadIdx.x == 0) {
        if (outd)
            atomicAdd(outd, s);
        else
            atomicAdd(outf, (float)s);
    }
}

static unsigned grid_reduce(size_t n)
{
    size_t b = (n + NT * 8 - 1) / (NT * 8);
    return (unsigned)(b < 1 ? 1 : (b > 1024 ? 1024 : b));
}

static void cu_dot_acc(eng_backend *be, float *out_dev, const float *a, const float *b, size_t n)
{
    if (!n || cu_enter(be) != 0)
        return;
    k_dot<<<grid_reduce(n), NT, 0, cu_of(be)->stream>>>(out_dev, NULL, a, b, n);
    CHECK_LAUNCH(be);
}

static double cu_sumsq(eng_backend *be, const float *x, size_t n)
{
    cu_impl *c = cu_of(be);
    double h = 0.0;
    if (!n || cu_enter(be) != 0)
        return 0.0;
    CHECK_CUDA_R(be, cudaMemsetAsync(c->red, 0, sizeof(double), c->stream), NAN);
    k_dot<<<grid_reduce(n), NT, 0, c->stream>>>(NULL, c->red, x, NULL, n);
    CHECK_LAUNCH_R(be, NAN);
    CHECK_CUDA_R(be, cudaMemcpyAsync(&h, c->red, sizeof(double), cudaMemcpyDeviceToHost, c->stream), NAN);
    CHECK_CUDA_R(be, cudaStreamSynchronize(c->stream), NAN);
    return h;
}

/* ---- AdamW ------------------------------------------------------------------------- */

__global__ void k_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
                        float eps, float wd, float bc1, float bc2, float gscale)
{
    /* the CPU backend's form (PyTorch's): step lr/bc1 on m / (sqrt(v)/sqrt(bc2) + eps) */
    const float step = lr / bc1, inv_sqrt_bc2 = 1.0f / sqrtf(bc2), decay = lr * wd;
    GRID_STRIDE(i, n) {
        float gi = g[i] * gscale;
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= step * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps) + decay * p[i];
    }
}

static void cu_adamw(eng_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                     float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float gscale)
{
    if (!n || cu_enter(be) != 0)
        return;
    k_adamw<<<grid_for(n), NT, 0, cu_of(be)->stream>>>(p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, gscale);
    CHECK_LAUNCH(be);
}

/* ---- table ------------------------------------------------------------------------- */

void cu_ops_install(eng_backend *be)
{
    be->gemm = cu_gemm;
    be->rmsnorm_fwd = cu_rmsnorm_fwd;
    be->rmsnorm_bwd = cu_rmsnorm_bwd;
    be->rope_fwd = cu_rope_fwd;
    be->rope_bwd = cu_rope_bwd;
    be->swiglu_fwd = cu_swiglu_fwd;
    be->swiglu_bwd = cu_swiglu_bwd;
    be->embed_fwd = cu_embed_fwd;
    be->embed_bwd = cu_embed_bwd;
    be->xent = cu_xent;
    be->kl = cu_kl;
    be->cosd = cu_cosd;
    be->add = cu_add;
    be->axpy = cu_axpy;
    be->axpy_dev = cu_axpy_dev;
    be->scale = cu_scale;
    be->fill = cu_fill;
    be->dot_acc = cu_dot_acc;
    be->mask_fwd = cu_mask_fwd;
    be->mask_bwd = cu_mask_bwd;
    be->bias_add = cu_bias_add;
    be->colsum_acc = cu_colsum_acc;
    be->group_norm_sum = cu_group_norm_sum;
    be->sumsq = cu_sumsq;
    be->adamw = cu_adamw;
    be->gather_rows = cu_gather_rows;
    be->scatter_rows_acc = cu_scatter_rows_acc;
    be->rows_dot = cu_rows_dot;
    cu_attn_install(be);
    cu_ssm_install(be);
}

/* ---- GEMM ceiling benchmark -------------------------------------------------------- */

__global__ void k_fill_pattern(float *x, size_t n)
{
    GRID_STRIDE(i, n) x[i] = (float)((i * 2654435761u) % 2001u) / 1000.0f - 1.0f;
}

extern "C" double cu_gemm_tflops(eng_backend *be, int prec, int M, int N, int K, int iters, char *err, size_t errlen)
{
    cu_impl *c = cu_of(be);
    if (strncmp(be->name, "cuda", 4) != 0 || M <= 0 || N <= 0 || K <= 0 || iters <= 0) {
        snprintf(err, errlen, "cu_gemm_tflops: needs a CUDA backend and positive sizes");
        return -1.0;
    }
    if (cu_enter(be) != 0) {
        snprintf(err, errlen, "%s", c->err);
        return -1.0;
    }
    size_t ea = prec == CU_PREC_FP32 ? 4 : 2;
    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    void *A = NULL, *B = NULL, *C = NULL;
    float *tmp = NULL;
    double tflops = -1.0;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaDataType_t t = prec == CU_PREC_BF16 ? CUDA_R_16BF : prec == CU_PREC_FP16 ? CUDA_R_16F : CUDA_R_32F;
    const float one = 1.0f, zero = 0.0f;
    float ms = 0.0f;
    cudaError_t e;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
#define BENCH_TRY(call)                                                                    \
    do {                                                                                   \
        if ((e = (call)) != cudaSuccess) {                                                 \
            snprintf(err, errlen, "%s: %s", #call, cudaGetErrorString(e));                 \
            goto done;                                                                     \
        }                                                                                  \
    } while (0)
    BENCH_TRY(cudaMalloc(&A, na * ea));
    BENCH_TRY(cudaMalloc(&B, nb * ea));
    BENCH_TRY(cudaMalloc(&C, nc * 4));
    BENCH_TRY(cudaMalloc((void **)&tmp, (na > nb ? na : nb) * 4));
    BENCH_TRY(cudaEventCreate(&e0));
    BENCH_TRY(cudaEventCreate(&e1));
    for (int w = 0; w < 2; w++) {
        size_t n = w ? nb : na;
        void *dst = w ? B : A;
        k_fill_pattern<<<grid_for(n), NT, 0, c->stream>>>(prec == CU_PREC_FP32 ? (float *)dst : tmp, n);
        if (prec == CU_PREC_BF16)
            k_convert<__nv_bfloat16><<<grid_for(n), NT, 0, c->stream>>>((__nv_bfloat16 *)dst, tmp, 1, (int)n, (int)n);
        else if (prec == CU_PREC_FP16)
            k_convert<__half><<<grid_for(n), NT, 0, c->stream>>>((__half *)dst, tmp, 1, (int)n, (int)n);
        BENCH_TRY(cudaGetLastError());
        BENCH_TRY(cudaStreamSynchronize(c->stream));   /* tmp is reused for B */
    }
    for (int it = -1; it < iters; it++) {
        if (it == 0)
            BENCH_TRY(cudaEventRecord(e0, c->stream));
        s = cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, t, N, A, t, K, &zero, C,
                         CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) {
            snprintf(err, errlen, "cublasGemmEx: %s", cu_blas_status_str(s));
            goto done;
        }
    }
    BENCH_TRY(cudaEventRecord(e1, c->stream));
    BENCH_TRY(cudaEventSynchronize(e1));
    BENCH_TRY(cudaEventElapsedTime(&ms, e0, e1));
    tflops = ms > 0 ? 2.0 * M * N * (double)K * iters / (ms * 1e-3) / 1e12 : -1.0;
    if (ms <= 0)
        snprintf(err, errlen, "cu_gemm_tflops: no elapsed time measured");
done:
#undef BENCH_TRY
    (void)cudaStreamSynchronize(c->stream);
    if (e0)
        (void)cudaEventDestroy(e0);
    if (e1)
        (void)cudaEventDestroy(e1);
    (void)cudaFree(A);
    (void)cudaFree(B);
    (void)cudaFree(C);
    (void)cudaFree(tmp);
    return tflops;
}
