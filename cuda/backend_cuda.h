/* cuda/backend_cuda.h — the CUDA backend behind engine/backend.h (cuBLAS GEMMs, custom
 * kernels, accounted device memory) plus device queries and an NCCL all-reduce for
 * data-parallel distillation. C-callable; implemented in cuda/backend_cuda.cu and only
 * compiled with CUDA=1. The CPU backend (engine/backend_cpu.c) is the reference.
 */
#ifndef AC_CUDA_BACKEND_CUDA_H
#define AC_CUDA_BACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/collective.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices the driver reports; 0 when there is no driver or no GPU
 * (never an error). */
int cu_device_count(void);

/* Describe device `dev`: its marketing name into desc (NUL-terminated, truncated to
 * desclen), total memory, compute capability and streaming multiprocessor count.
 * Returns 0, or -1 when the driver refuses the query. */
int cu_device_query(int dev, char *desc, size_t desclen, uint64_t *memory_bytes,
                    int *cc_major, int *cc_minor, int *sms);

/* The memory free on device `dev` now (cudaMemGetInfo: what a new allocation there can
 * still get) into *free_bytes. Returns 0, or -1 when the driver refuses the query. */
int cu_device_free(int dev, uint64_t *free_bytes);

/* Create the backend on device `dev` ("cuda:dev"): a stream, a cuBLAS handle and a
 * precision setting. Returns a new backend (free with eng_backend_free, which calls its
 * destroy hook; device buffers still allocated through it are not freed, free them
 * first), or NULL with the CUDA / cuBLAS error in err. */
eng_backend *eng_backend_cuda_new(int dev, char *err, size_t errlen);

/* GEMM input precision of a CUDA backend: weights and activations are fp32 buffers;
 * with CU_PREC_BF16 / CU_PREC_FP16 the GEMM operands are rounded to that type and
 * multiplied with fp32 accumulation (fp32 output). CU_PREC_FP32 is exact fp32 (TF32
 * off). Default CU_PREC_FP32. Returns 0, or -1 for an unknown precision or a non-CUDA
 * backend. */
enum { CU_PREC_FP32 = 0, CU_PREC_BF16 = 1, CU_PREC_FP16 = 2 };
int cu_backend_set_precision(eng_backend *be, int prec);

/* The form of a CUDA backend's Mamba-2 scan, forward and backward: CU_SCAN_AUTO (the
 * default) runs rows of a checkpoint chunk or more in the chunked (SSD) form, parallel over
 * chunks, and shorter ones (decode) step by step; CU_SCAN_RECURRENT runs every row step by
 * step (for bench/cuda's comparison). Returns 0, or -1 for an unknown form or a non-CUDA backend. */
enum { CU_SCAN_AUTO = 0, CU_SCAN_RECURRENT = 1 };
int cu_backend_set_scan(eng_backend *be, int form);

/* Bytes of the backend's private workspace (the GEMMs' bf16/fp16 operand copies, split
 * decode attention's partials, the chunked scan's scratch), which is not part of
 * cur_bytes/peak_bytes; 0 for other backends. */
size_t cu_backend_workspace_bytes(const eng_backend *be);

/* The device memory a CUDA backend holds outside its accounted allocations (cur_bytes),
 * each measured on the device: what the memory model's runtime_buffers item is made of.
 *   context_bytes: the CUDA context: the device's used memory (NVML, before any CUDA
 *       call of this process made the context) against cudaMemGetInfo once the context,
 *       stream and cuBLAS handle exist, less the backend's own buffers; a later backend
 *       on the device (the context made already) reports what the process's first
 *       measured; -1 when NVML is not there.
 *   blas_workspace_bytes: the workspace given to cuBLAS (cublasSetWorkspace: 32 MiB on
 *       compute capability 9.x, 4 MiB before, as NVIDIA recommends), so it is known.
 *   gemm16_workspace_bytes: the bf16/fp16 operand copies (cu_backend_workspace_bytes).
 *   pool_slack_bytes: the memory pool's reserved high water less peak_bytes (what
 *       cudaMallocAsync's pool rounds up and keeps), since the previous call (the call
 *       resets the high water; reset the backend's peak with it).
 * Returns 0, or -1 for a non-CUDA backend or a failed query (recorded). */
typedef struct {
    int64_t context_bytes, blas_workspace_bytes, gemm16_workspace_bytes, pool_slack_bytes;
} cu_mem_items;
int cu_backend_memory_items(eng_backend *be, cu_mem_items *out);

/* GEMM ceiling: time `iters` row-major [M,K]x[K,N] products with operands already in
 * `prec` (CU_PREC_BF16/FP16: 16-bit A and B, fp32 C and accumulation; CU_PREC_FP32:
 * fp32, no TF32) on random data, after one warm-up. Buffers are allocated for the call
 * and freed. Returns achieved TFLOP/s (2*M*N*K per product), or a negative value with
 * the reason in err. */
double cu_gemm_tflops(eng_backend *be, int prec, int M, int N, int K, int iters, char *err, size_t errlen);

/* Timing with events on the backend's stream: cu_timer_start records a start event,
 * cu_timer_stop records the end, waits for it and returns the milliseconds between,
 * or a negative value on a CUDA error. */
int cu_timer_start(eng_backend *be);
double cu_timer_stop_ms(eng_backend *be);

/* Data parallelism over the CUDA devices of one host (NCCL, one process, one thread
 * driving all ranks through ncclGroupStart/End).
 *   cu_comm_new: a communicator over n backends (each on a different device, the
 *                order gives the ranks). Returns a new handle or NULL with err.
 *   cu_allreduce_sum: in place, buf[r] (n_floats fp32 device floats on backends[r])
 *                becomes the element-wise sum over ranks. Returns 0 or -1 with err.
 *                Divide by n (e.g. via grad_scale of the optimizer step) for a mean. */
typedef struct cu_comm cu_comm;
cu_comm *cu_comm_new(eng_backend **backends, int n, char *err, size_t errlen);
int cu_allreduce_sum(cu_comm *c, float **bufs, size_t n_floats, char *err, size_t errlen);
void cu_comm_free(cu_comm *c);

/* Data parallelism with one process per GPU: this process as rank cpu->rank of
 * cpu->size on be's device, joined by an NCCL communicator whose id travels over the CPU
 * collective `cpu` (its processes already joined; it stays the caller's). allreduce_sum
 * on be's device buffers runs ncclAllReduce on be's stream and waits for it (every rank
 * gets the same bits); on host buffers (be NULL) it goes through `cpu`. abort aborts
 * the communicator and tells the CPU group. Returns a new eng_coll ("nccl", freed with
 * c->free), or NULL with err (not a CUDA backend, NCCL refused). */
eng_coll *cu_coll_nccl_new(eng_coll *cpu, eng_backend *be, char *err, size_t errlen);

/* The first CUDA / cuBLAS error the backend's ops met since it was created ("" when
 * none; "" for non-CUDA backends), as "file:line: call: reason". Ops return void, so a
 * failing op records its failure here and returns; the caller should check this after
 * a sync and fail the job with it (later results are not to be trusted). Borrowed. */
const char *cu_backend_error(const eng_backend *be);

#ifdef __cplusplus
}
#endif

#endif
