/* cuda/cu_internal.h — private to cuda/: the backend's state, error-check macros and
 * launch helpers shared by backend_cuda.cu and the kernel files. CUDA C++ only.
 * Errors never abort: a failing call records "file:line: call: reason" in the backend
 * and the op returns (ops that return int return -1).
 */
#ifndef AC_CUDA_CU_INTERNAL_H
#define AC_CUDA_CU_INTERNAL_H

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <stdio.h>

#include "cuda/backend_cuda.h"

typedef struct {
    int dev;
    int sms;                  /* streaming multiprocessors of the device */
    cudaStream_t stream;
    cudaMemPool_t pool;       /* the backend's own stream-ordered pool (cu_alloc) */
    cublasHandle_t blas;
    void *ws;                 /* workspace: GEMM operand copies (bf16/fp16), attention's
                                 split partials, the chunked scan's scratch */
    size_t ws_bytes;
    void *blas_ws;            /* the workspace handed to cuBLAS (cublasSetWorkspace) */
    size_t blas_ws_bytes;
    int64_t context_bytes;    /* device memory the CUDA context took (-1: not measured) */
    int prec;                 /* CU_PREC_* */
    int scan;                 /* CU_SCAN_* */
    double *red;              /* 64 bytes of device scratch for host-returning reductions */
    cudaEvent_t ev0, ev1;
    int timing;               /* 1 after cu_timer_start */
    char err[256];            /* first error since creation, "" when none */
} cu_impl;

static inline cu_impl *cu_of(eng_backend *be) { return (cu_impl *)be->impl; }

/* Record an error (only the first one is kept: later ones usually follow from it). */
void cu_set_error(eng_backend *be, const char *file, int line, const char *what, const char *why);
const char *cu_blas_status_str(cublasStatus_t s);

/* Make the backend's device current for this host thread; 0 or -1 (recorded). */
int cu_enter(eng_backend *be);

/* 1-D launches of the kernel files: NT threads per block, enough blocks for n elements
 * (capped: grid-stride loops cover the rest). */
#define NT 256
static inline unsigned grid_for(size_t n)
{
    size_t b = (n + NT - 1) / NT;
    if (b > 65535u * 16u)
        b = 65535u * 16u;
    return (unsigned)(b ? b : 1);
}
#define GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

#define CHECK_CUDA_R(be, call, ret)                                                        \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            cu_set_error((be), __FILE__, __LINE__, #call, cudaGetErrorString(e_));         \
            return ret;                                                                    \
        }                                                                                  \
    } while (0)
#define CHECK_CUBLAS_R(be, call, ret)                                                      \
    do {                                                                                   \
        cublasStatus_t s_ = (call);                                                        \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
            cu_set_error((be), __FILE__, __LINE__, #call, cu_blas_status_str(s_));         \
            return ret;                                                                    \
        }                                                                                  \
    } while (0)
/* For void functions. */
#define CHECK_CUDA(be, call) CHECK_CUDA_R(be, call, )
#define CHECK_CUBLAS(be, call) CHECK_CUBLAS_R(be, call, )
/* After a kernel launch: launch-configuration errors. */
#define CHECK_LAUNCH(be) CHECK_CUDA(be, cudaGetLastError())
#define CHECK_LAUNCH_R(be, ret) CHECK_CUDA_R(be, cudaGetLastError(), ret)

static inline unsigned cu_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 0x7fffffffu ? 0x7fffffffu : (b ? b : 1));
}

#ifdef __CUDACC__
__device__ __forceinline__ float cu_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }
/* torch's softplus (threshold 20: linear above). */
__device__ __forceinline__ float cu_softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

/* Warp and block reductions (blockDim.x a multiple of 32, at most 1024). The block
 * versions use a 32-float shared scratch and return the result to every thread. */
__device__ __forceinline__ float cu_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float cu_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double cu_warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float cu_block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = cu_warp_sum(v);
    __syncthreads();             /* sh may still be read by a previous reduction */
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return cu_warp_sum(v);
}
__device__ __forceinline__ float cu_block_max(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = cu_warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return cu_warp_max(v);
}
__device__ __forceinline__ double cu_block_sum_d(double v, double *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = cu_warp_sum_d(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
    return cu_warp_sum_d(v);
}
#endif

/* Grow the workspace (c->ws) to at least `bytes`. It is kept for the backend's life
 * and NOT counted in cur_bytes/peak_bytes (so those return to 0 when every buffer is
 * freed); cu_backend_workspace_bytes reports it as a runtime buffer.
 * Returns the workspace or NULL (error recorded). */
void *cu_workspace(eng_backend *be, size_t bytes);

#endif
