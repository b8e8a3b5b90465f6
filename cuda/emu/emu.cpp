// cuda/emu/emu.cpp — a SIMT emulator for checking the CUDA backend on a machine without a GPU
// (see cuda/emu/run.sh): kernels run one block at a time on the CPU, each thread a ucontext
// fiber that switches at barriers (__syncthreads, warp shuffles); divergent barriers, shuffles
// with exited lanes and over-sized shared memory abort. A fiber is entered with setcontext
// once, then switched by _setjmp/_longjmp, which leave the signal mask alone (swapcontext's
// system call at every switch was a third of the run). The CUDA runtime works on host memory,
// cublasGemmEx is a naive double-accumulating loop, NCCL an in-process sum. Test tool only.
#include <setjmp.h>
#include <ucontext.h>
#include <vector>
#include "cuda_runtime.h"
#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "nccl.h"

dim3 threadIdx, blockIdx, blockDim, gridDim;
float sm[1 << 16];

enum { RUN, WAIT_BLOCK, WAIT_WARP, DONE };
struct fiber { ucontext_t ctx; jmp_buf jb; int state; bool started; unsigned tid; char *stack; };
static std::vector<fiber> F;
static jmp_buf sched_jb;
static int cur = -1;
static std::function<void()> *body_p;
static unsigned char slots[1024][16];
static long launches = 0;

void *emu_warp_slot(int lane) { return slots[(threadIdx.x & ~31u) + (unsigned)lane]; }

static void yield_as(int st)
{
    F[cur].state = st;
    if (!_setjmp(F[cur].jb))
        _longjmp(sched_jb, 1);
    threadIdx = dim3(F[cur].tid % blockDim.x, (F[cur].tid / blockDim.x) % blockDim.y, F[cur].tid / (blockDim.x * blockDim.y));
}
void emu_syncthreads() { yield_as(WAIT_BLOCK); }
void emu_warp_sync() { yield_as(WAIT_WARP); }

static void fiber_main()
{
    (*body_p)();
    F[cur].state = DONE;
    _longjmp(sched_jb, 1);
}

static void fatal(const char *m)
{
    fprintf(stderr, "EMU FATAL: %s (block %u,%u,%u)\n", m, blockIdx.x, blockIdx.y, blockIdx.z);
    abort();
}

void emu_launch(dim3 g, dim3 b, size_t shm, std::function<void()> body)
{
    if (shm > sizeof sm) fatal("dynamic shared memory too large");
    if (shm > 48 * 1024) fatal("dynamic shared memory above 48 KiB without opt-in");
    unsigned nt = b.x * b.y * b.z;
    if (nt > 1024 || nt == 0) fatal("bad block size");
    if (g.y > 65535 || g.z > 65535) fatal("grid y/z above 65535");
    launches++;
    gridDim = g; blockDim = b; body_p = &body;
    F.resize(nt);
    for (auto &f : F) if (!f.stack) f.stack = (char *)malloc(1 << 16);
    for (unsigned bz = 0; bz < g.z; bz++)
    for (unsigned by = 0; by < g.y; by++)
    for (unsigned bx = 0; bx < g.x; bx++) {
        blockIdx = dim3(bx, by, bz);
        memset(sm, 0xff, shm);   // NaN garbage: reading unwritten shared memory shows up
        for (unsigned t = 0; t < nt; t++) {
            fiber &f = F[t];
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack; f.ctx.uc_stack.ss_size = 1 << 16; f.ctx.uc_link = NULL;
            makecontext(&f.ctx, fiber_main, 0);
            f.state = RUN; f.started = false; f.tid = t;
        }
        for (;;) {
            bool ran = false;
            for (unsigned t = 0; t < nt; t++) {
                if (F[t].state != RUN) continue;
                cur = (int)t; ran = true;
                threadIdx = dim3(t % b.x, (t / b.x) % b.y, t / (b.x * b.y));
                if (!_setjmp(sched_jb)) {
                    if (F[t].started)
                        _longjmp(F[t].jb, 1);
                    F[t].started = true;
                    setcontext(&F[t].ctx);
                }
            }
            if (ran) continue;
            // release barriers
            bool all_done = true, any = false;
            unsigned nblock = 0, alive = 0;
            for (unsigned t = 0; t < nt; t++) {
                if (F[t].state != DONE) { all_done = false; alive++; }
                if (F[t].state == WAIT_BLOCK) nblock++;
            }
            if (all_done) break;
            for (unsigned w = 0; w < (nt + 31) / 32; w++) {
                unsigned nw = 0, nd = 0, nb = 0, n = 0;
                for (unsigned t = w * 32; t < nt && t < w * 32 + 32; t++, n++) {
                    nw += F[t].state == WAIT_WARP; nd += F[t].state == DONE; nb += F[t].state == WAIT_BLOCK;
                }
                if (nw && nw + nd == n) {
                    if (nd) fatal("warp shuffle with exited lanes");
                    for (unsigned t = w * 32; t < nt && t < w * 32 + 32; t++) F[t].state = RUN;
                    any = true;
                } else if (nw && nb) {
                    fatal("divergence: lanes of one warp at a shuffle and at __syncthreads");
                }
            }
            if (any) continue;
            if (nblock == alive) {
                for (unsigned t = 0; t < nt; t++) if (F[t].state == WAIT_BLOCK) F[t].state = RUN;
                // threads that already exited while others wait at __syncthreads: UB on hardware
                if (alive != nt) fatal("__syncthreads with exited threads");
                continue;
            }
            fatal("deadlock");
        }
    }
}

// ---- runtime ----
#define EMU_MEMORY ((size_t)8 << 30)   // each device's memory: its properties and cudaMemGetInfo agree
static int ndev() { const char *e = getenv("EMU_DEVICES"); return e ? (int)strtol(e, NULL, 10) : 1; }
cudaError_t cudaGetDeviceCount(int *n) { *n = ndev(); return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev)
{
    if (dev < 0 || dev >= ndev()) return cudaErrorInvalidValue;
    memset(p, 0, sizeof *p); snprintf(p->name, sizeof p->name, "EMU SIMT %d", dev);
    p->totalGlobalMem = EMU_MEMORY; p->major = 9; p->minor = 0; p->multiProcessorCount = 16; return cudaSuccess;
}
static int cur_dev;   // the calling thread's device, as cudaSetDevice left it (one host thread per test)
cudaError_t cudaSetDevice(int dev)
{
    if (dev < 0 || dev >= ndev()) return cudaErrorInvalidValue;
    cur_dev = dev; return cudaSuccess;
}
cudaError_t cudaGetDevice(int *dev) { *dev = cur_dev; return cudaSuccess; }
cudaError_t emu_malloc(void **p, size_t n)
{
    if (n > ((size_t)1 << 40)) return cudaErrorMemoryAllocation;
    *p = malloc(n); if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0xff, n);   // NaN garbage, like uninitialised device memory might be
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t) { memmove(d, s, n); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) { memset(d, v, n); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { *s = (void *)1; return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
struct emu_event { int x; };
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = new emu_event; return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t) { *ms = 1.0f; return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated error"; }
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr, int) { *v = 16; return cudaSuccess; }

// ---- cuBLAS ----
struct emu_blas { int x; };
cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = new emu_blas; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy(cublasHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *, size_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
static float ld_el(const void *p, cudaDataType_t t, size_t i)
{
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    if (t == CUDA_R_16BF) return emu_bf16_to_float(((const __nv_bfloat16 *)p)[i]);
    return emu_half_to_float(((const __half *)p)[i]);
}
cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
  const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B, cudaDataType_t bt, int ldb,
  const void *beta, void *C, cudaDataType_t ct, int ldc, cublasComputeType_t, cublasGemmAlgo_t)
{
    if (ct != CUDA_R_32F || m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    // leading dimension rules of cuBLAS
    if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m || lda < 1 || ldb < 1 || ldc < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    float al = *(const float *)alpha, be = *(const float *)beta;
    float *Cf = (float *)C;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                float a = ta == CUBLAS_OP_N ? ld_el(A, at, (size_t)p * lda + i) : ld_el(A, at, (size_t)i * lda + p);
                float b = tb == CUBLAS_OP_N ? ld_el(B, bt, (size_t)j * ldb + p) : ld_el(B, bt, (size_t)p * ldb + j);
                s += (double)a * b;
            }
            float *c = Cf + (size_t)j * ldc + i;
            *c = be == 0.0f ? al * (float)s : al * (float)s + be * *c;
        }
    return CUBLAS_STATUS_SUCCESS;
}

// ---- NCCL ----
struct emu_nccl { int rank, n; };
struct pend { const float *s; float *r; size_t n; };
static std::vector<pend> group;
static int in_group = 0;
ncclResult_t ncclCommInitAll(ncclComm_t *c, int n, const int *) { for (int i = 0; i < n; i++) c[i] = new emu_nccl{i, n}; return ncclSuccess; }
ncclResult_t ncclCommDestroy(ncclComm_t c) { delete c; return ncclSuccess; }
ncclResult_t ncclGroupStart(void) { in_group = 1; group.clear(); return ncclSuccess; }
ncclResult_t ncclGroupEnd(void)
{
    in_group = 0;
    if (group.empty()) return ncclSuccess;
    size_t n = group[0].n;
    std::vector<float> sum(n, 0.0f);
    for (auto &p : group) { if (p.n != n) return ncclInvalidUsage; for (size_t i = 0; i < n; i++) sum[i] += p.s[i]; }
    for (auto &p : group) memcpy(p.r, sum.data(), n * 4);
    group.clear();
    return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)
{
    if (!in_group) return ncclInvalidUsage;
    group.push_back({(const float *)s, (float *)r, n}); return ncclSuccess;
}
// one process per GPU is not emulated (the emulator's ranks live in one process)
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) { memset(id, 7, sizeof *id); return ncclSuccess; }
ncclResult_t ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int) { return ncclInvalidUsage; }
ncclResult_t ncclCommAbort(ncclComm_t) { return ncclSuccess; }
const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "success" : "emulated nccl error"; }
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t) { return emu_malloc(p, n); }
cudaError_t cudaFreeAsync(void *p, cudaStream_t) { free(p); return cudaSuccess; }
cudaError_t cudaMemPoolCreate(cudaMemPool_t *p, const cudaMemPoolProps *) { *p = NULL; return cudaSuccess; }
cudaError_t cudaMemPoolDestroy(cudaMemPool_t) { return cudaSuccess; }
cudaError_t cudaMallocFromPoolAsync(void **p, size_t n, cudaMemPool_t, cudaStream_t) { return emu_malloc(p, n); }
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, size_t) { return cudaSuccess; }
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void *) { return cudaSuccess; }
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t, cudaMemPoolAttr, void *v) { *(uint64_t *)v = 0; return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) { *f = *t = EMU_MEMORY; return cudaSuccess; }
