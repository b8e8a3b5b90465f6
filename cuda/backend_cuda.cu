/* cuda/backend_cuda.cu — the CUDA backend's life cycle: device queries, the accounting
 * allocator, host<->device copies, one stream per backend, the cuBLAS handle and GEMM
 * precision, event timing, and NCCL all-reduce across the devices of one host.
 * The numerical ops live in cuda/kernels_*.cu and are wired into the table here.
 */
#include "cuda/cu_internal.h"
#include "cuda/cu_ops.h"

#include <nccl.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ---------------------------------------------------------------------- */

void cu_set_error(eng_backend *be, const char *file, int line, const char *what, const char *why)
{
    cu_impl *c = cu_of(be);
    if (c->err[0])
        return;   /* keep the first failure: later ones usually follow from it */
    snprintf(c->err, sizeof c->err, "%s:%d: %s: %s", file, line, what, why);
}

const char *cu_blas_status_str(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "cuBLAS not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "cuBLAS allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "cuBLAS invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "cuBLAS architecture mismatch";
    case CUBLAS_STATUS_MAPPING_ERROR: return "cuBLAS mapping error";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "cuBLAS execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "cuBLAS internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "cuBLAS operation not supported";
    default: return "cuBLAS error";
    }
}

extern "C" const char *cu_backend_error(const eng_backend *be)
{
    if (!be || !be->impl || strncmp(be->name, "cuda", 4) != 0)
        return "";
    return ((const cu_impl *)be->impl)->err;
}

int cu_enter(eng_backend *be)
{
    CHECK_CUDA_R(be, cudaSetDevice(cu_of(be)->dev), -1);
    return 0;
}

/* ---- devices --------------------------------------------------------------------- */

extern "C" int cu_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();   /* no driver / no device: clear the sticky error */
        return 0;
    }
    return n;
}

extern "C" int cu_device_query(int dev, char *desc, size_t desclen, uint64_t *memory_bytes,
                               int *cc_major, int *cc_minor, int *sms)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    snprintf(desc, desclen, "%s", p.name);
    *memory_bytes = (uint64_t)p.totalGlobalMem;
    *cc_major = p.major;
    *cc_minor = p.minor;
    *sms = p.multiProcessorCount;
    return 0;
}

extern "C" int cu_device_free(int dev, uint64_t *free_bytes)
{
    int cur = 0;
    size_t f = 0, t = 0;
    if (cudaGetDevice(&cur) != cudaSuccess || cudaSetDevice(dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    cudaError_t e = cudaMemGetInfo(&f, &t);
    if (cudaSetDevice(cur) != cudaSuccess || e != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    *free_bytes = (uint64_t)f;
    return 0;
}

/* ---- memory ---------------------------------------------------------------------- */

/* Allocation is stream-ordered from the backend's own memory pool (cudaMallocFromPoolAsync),
 * so the per-call workspaces of the model do not pay a cudaMalloc and a device-wide sync
 * each time. cur_bytes/peak_bytes count live allocations; the pool keeps freed memory
 * cached (nvidia-smi shows more), is trimmed and retried once when it runs out, and goes
 * back to the device with the backend: a pool of its own, so that its high water (the
 * memory items' slack) is this backend's alone, and a freed backend holds nothing. */
static void *cu_alloc(eng_backend *be, size_t bytes)
{
    cu_impl *c = cu_of(be);
    if (cu_enter(be) != 0)
        return NULL;
    void *p = NULL;
    cudaError_t e = cudaMallocFromPoolAsync(&p, bytes ? bytes : 1, c->pool, c->stream);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        if (cudaStreamSynchronize(c->stream) == cudaSuccess && cudaMemPoolTrimTo(c->pool, 0) == cudaSuccess)
            e = cudaMallocFromPoolAsync(&p, bytes ? bytes : 1, c->pool, c->stream);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();   /* out of memory is not sticky; callers report it */
        return NULL;
    }
    be->cur_bytes += bytes;
    if (be->cur_bytes > be->peak_bytes)
        be->peak_bytes = be->cur_bytes;
    return p;
}

static void cu_free(eng_backend *be, void *p, size_t bytes)
{
    if (!p)
        return;
    if (cu_enter(be) != 0)
        return;
    /* stream-ordered: kernels already queued on the stream that use p finish first */
    CHECK_CUDA(be, cudaFreeAsync(p, cu_of(be)->stream));
    be->cur_bytes = bytes <= be->cur_bytes ? be->cur_bytes - bytes : 0;
}

static void cu_to_device(eng_backend *be, void *dst, const void *host_src, size_t bytes)
{
    cu_impl *c = cu_of(be);
    if (!bytes || cu_enter(be) != 0)
        return;
    CHECK_CUDA(be, cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, c->stream));
    CHECK_CUDA(be, cudaStreamSynchronize(c->stream));   /* host_src may be reused on return */
}

static void cu_to_host(eng_backend *be, void *host_dst, const void *src, size_t bytes)
{
    cu_impl *c = cu_of(be);
    if (!bytes || cu_enter(be) != 0)
        return;
    CHECK_CUDA(be, cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CHECK_CUDA(be, cudaStreamSynchronize(c->stream));
}

static void cu_copy(eng_backend *be, void *dst, const void *src, size_t bytes)
{
    if (!bytes || cu_enter(be) != 0)
        return;
    CHECK_CUDA(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cu_of(be)->stream));
}

static void cu_zero(eng_backend *be, void *dst, size_t bytes)
{
    if (!bytes || cu_enter(be) != 0)
        return;
    CHECK_CUDA(be, cudaMemsetAsync(dst, 0, bytes, cu_of(be)->stream));
}

static void cu_sync(eng_backend *be)
{
    if (cu_enter(be) != 0)
        return;
    CHECK_CUDA(be, cudaStreamSynchronize(cu_of(be)->stream));
}

void *cu_workspace(eng_backend *be, size_t bytes)
{
    cu_impl *c = cu_of(be);
    if (c->ws_bytes >= bytes)
        return c->ws;
    size_t want = bytes + bytes / 4;   /* grow with slack so shapes that creep up don't thrash */
    if (c->ws) {
        CHECK_CUDA_R(be, cudaStreamSynchronize(c->stream), NULL);
        CHECK_CUDA_R(be, cudaFree(c->ws), NULL);
        c->ws = NULL;
        c->ws_bytes = 0;
    }
    CHECK_CUDA_R(be, cudaMalloc(&c->ws, want), NULL);
    c->ws_bytes = want;
    return c->ws;
}

/* ---- life cycle ------------------------------------------------------------------ */

static void cu_release(eng_backend *be)
{
    cu_impl *c = cu_of(be);
    if (c) {
        (void)cudaSetDevice(c->dev);
        if (c->stream)
            (void)cudaStreamSynchronize(c->stream);
        if (c->ws)
            (void)cudaFree(c->ws);
        if (c->blas_ws)
            (void)cudaFree(c->blas_ws);
        if (c->red)
            (void)cudaFree(c->red);
        if (c->blas)
            (void)cublasDestroy(c->blas);
        if (c->ev0)
            (void)cudaEventDestroy(c->ev0);
        if (c->ev1)
            (void)cudaEventDestroy(c->ev1);
        if (c->stream)
            (void)cudaStreamDestroy(c->stream);
        if (c->pool)   /* its memory back to the device (at once: every free has run) */
            (void)cudaMemPoolDestroy(c->pool);
        (void)cudaGetLastError();
        free(c);
    }
    free((void *)be->name);
    free(be);
}

extern "C" size_t cu_backend_workspace_bytes(const eng_backend *be)
{
    if (!be || !be->impl || strncmp(be->name, "cuda", 4) != 0)
        return 0;
    return ((const cu_impl *)be->impl)->ws_bytes;
}

/* The device's used memory by NVML (which makes no CUDA context), -1 when NVML is not
 * there. Loaded at run time: a machine without the driver's NVML still runs the rest. */
/* The CUDA context's device memory per device, as the first backend on it measured (0
 * unknown): the later backends of the process find the context made. */
enum { CU_CTX_DEVICES = 64 };
static int64_t ctx_bytes_seen[CU_CTX_DEVICES];

static int64_t nvml_used_bytes(int dev)
{
    typedef struct {
        unsigned long long total, free, used;
    } nvml_memory;
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return -1;
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*by_index)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*mem)(void *, nvml_memory *) = (int (*)(void *, nvml_memory *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    int (*shutdown)(void) = (int (*)(void))dlsym(h, "nvmlShutdown");
    int64_t used = -1;
    void *d = NULL;
    nvml_memory m;
    if (init && by_index && mem && shutdown && init() == 0) {
        /* NVML numbers devices as the driver does; CUDA_VISIBLE_DEVICES may renumber
         * them for CUDA: then the index is only right when nothing is hidden */
        if (by_index((unsigned)dev, &d) == 0 && mem(d, &m) == 0)
            used = (int64_t)m.used;
        shutdown();
    }
    dlclose(h);
    return used;
}

extern "C" int cu_backend_memory_items(eng_backend *be, cu_mem_items *out)
{
    memset(out, 0, sizeof *out);
    if (!be || !be->impl || strncmp(be->name, "cuda", 4) != 0 || cu_enter(be) != 0)
        return -1;
    cu_impl *c = cu_of(be);
    out->context_bytes = c->context_bytes;
    out->blas_workspace_bytes = (int64_t)c->blas_ws_bytes;
    out->gemm16_workspace_bytes = (int64_t)c->ws_bytes;
    uint64_t high = 0;
    CHECK_CUDA_R(be, cudaStreamSynchronize(c->stream), -1);
    CHECK_CUDA_R(be, cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrReservedMemHigh, &high), -1);
    out->pool_slack_bytes = high > be->peak_bytes ? (int64_t)(high - be->peak_bytes) : 0;
    uint64_t zero = 0;   /* the next call measures from here */
    CHECK_CUDA_R(be, cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReservedMemHigh, &zero), -1);
    return 0;
}

#define NEW_FAIL(msg_call, why)                                                            \
    do {                                                                                   \
        snprintf(err, errlen, "cuda:%d: %s: %s", dev, msg_call, why);                     \
        cu_release(be);                                                                    \
        return NULL;                                                                       \
    } while (0)

extern "C" eng_backend *eng_backend_cuda_new(int dev, char *err, size_t errlen)
{
    eng_backend *be = (eng_backend *)calloc(1, sizeof *be);
    cu_impl *c = (cu_impl *)calloc(1, sizeof *c);
    char *name = (char *)malloc(16);
    if (!be || !c || !name) {
        free(be);
        free(c);
        free(name);
        snprintf(err, errlen, "cuda:%d: out of host memory", dev);
        return NULL;
    }
    snprintf(name, 16, "cuda:%d", dev);
    be->name = name;
    be->impl = c;
    c->dev = dev;
    c->prec = CU_PREC_FP32;
    c->scan = CU_SCAN_AUTO;
    int64_t used0 = nvml_used_bytes(dev);   /* before this process's context on dev, if any */
    cudaError_t e;
    if ((e = cudaSetDevice(dev)) != cudaSuccess)
        NEW_FAIL("cudaSetDevice", cudaGetErrorString(e));
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess)
        NEW_FAIL("cudaStreamCreate", cudaGetErrorString(e));
    if ((e = cudaEventCreate(&c->ev0)) != cudaSuccess || (e = cudaEventCreate(&c->ev1)) != cudaSuccess)
        NEW_FAIL("cudaEventCreate", cudaGetErrorString(e));
    cublasStatus_t s;
    if ((e = cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
        NEW_FAIL("cudaDeviceGetAttribute", cudaGetErrorString(e));
    /* the backend's pool, keeping freed memory cached across synchronizations (see cu_alloc) */
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    uint64_t keep = UINT64_MAX;
    if ((e = cudaMemPoolCreate(&c->pool, &props)) != cudaSuccess ||
        (e = cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &keep)) != cudaSuccess)
        NEW_FAIL("memory pool", cudaGetErrorString(e));
    if ((e = cudaMalloc((void **)&c->red, 64)) != cudaSuccess)
        NEW_FAIL("cudaMalloc(reduction scalar)", cudaGetErrorString(e));
    if ((s = cublasCreate(&c->blas)) != CUBLAS_STATUS_SUCCESS)
        NEW_FAIL("cublasCreate", cu_blas_status_str(s));
    if ((s = cublasSetStream(c->blas, c->stream)) != CUBLAS_STATUS_SUCCESS)
        NEW_FAIL("cublasSetStream", cu_blas_status_str(s));
    /* Default math: fp32 GEMMs request CUBLAS_COMPUTE_32F, which never rounds to TF32
     * (CPU parity within 1e-5); bf16/fp16 GEMMs may use tensor cores. */
    if ((s = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS)
        NEW_FAIL("cublasSetMathMode", cu_blas_status_str(s));
    /* cuBLAS's workspace is ours, so its size is known, not assumed */
    int major = 0;
    if ((e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)) != cudaSuccess)
        NEW_FAIL("cudaDeviceGetAttribute", cudaGetErrorString(e));
    c->blas_ws_bytes = (size_t)(major >= 9 ? 32 : 4) << 20;
    if ((e = cudaMalloc(&c->blas_ws, c->blas_ws_bytes)) != cudaSuccess)
        NEW_FAIL("cudaMalloc(cuBLAS workspace)", cudaGetErrorString(e));
    if ((s = cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes)) != CUBLAS_STATUS_SUCCESS)
        NEW_FAIL("cublasSetWorkspace", cu_blas_status_str(s));
    size_t free_b = 0, total_b = 0;
    c->context_bytes = -1;
    if (used0 >= 0 && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
        int64_t ctx = (int64_t)(total_b - free_b) - used0 - (int64_t)c->blas_ws_bytes - 64;
        c->context_bytes = ctx > 0 ? ctx : -1;   /* <= 0: the context was there before */
    }
    /* The context is the process's, made once per device: a later backend on the device
     * reports the size the first one measured, since a process serving the model pays it. */
    if (dev >= 0 && dev < CU_CTX_DEVICES) {
        if (c->context_bytes > 0)
            __atomic_store_n(&ctx_bytes_seen[dev], c->context_bytes, __ATOMIC_RELAXED);
        else if (__atomic_load_n(&ctx_bytes_seen[dev], __ATOMIC_RELAXED) > 0)
            c->context_bytes = __atomic_load_n(&ctx_bytes_seen[dev], __ATOMIC_RELAXED);
    }
    (void)cudaGetLastError();
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->to_device = cu_to_device;
    be->to_host = cu_to_host;
    be->copy = cu_copy;
    be->zero = cu_zero;
    be->sync = cu_sync;
    be->destroy = cu_release;
    cu_ops_install(be);
    return eng_backend_check_ops(be);
}

extern "C" int cu_backend_set_precision(eng_backend *be, int prec)
{
    if (!be || strncmp(be->name, "cuda", 4) != 0)
        return -1;
    if (prec != CU_PREC_FP32 && prec != CU_PREC_BF16 && prec != CU_PREC_FP16)
        return -1;
    cu_of(be)->prec = prec;
    return 0;
}

extern "C" int cu_backend_set_scan(eng_backend *be, int form)
{
    if (!be || strncmp(be->name, "cuda", 4) != 0)
        return -1;
    if (form != CU_SCAN_AUTO && form != CU_SCAN_RECURRENT)
        return -1;
    cu_of(be)->scan = form;
    return 0;
}

extern "C" int cu_timer_start(eng_backend *be)
{
    cu_impl *c = cu_of(be);
    if (cu_enter(be) != 0)
        return -1;
    CHECK_CUDA_R(be, cudaEventRecord(c->ev0, c->stream), -1);
    c->timing = 1;
    return 0;
}

extern "C" double cu_timer_stop_ms(eng_backend *be)
{
    cu_impl *c = cu_of(be);
    if (!c->timing || cu_enter(be) != 0)
        return -1.0;
    c->timing = 0;
    float ms = 0.0f;
    CHECK_CUDA_R(be, cudaEventRecord(c->ev1, c->stream), -1.0);
    CHECK_CUDA_R(be, cudaEventSynchronize(c->ev1), -1.0);
    CHECK_CUDA_R(be, cudaEventElapsedTime(&ms, c->ev0, c->ev1), -1.0);
    return (double)ms;
}

/* ---- NCCL ------------------------------------------------------------------------ */

struct cu_comm {
    int n;
    ncclComm_t *comms;
    eng_backend **bes;   /* borrowed */
};

#define CHECK_NCCL_R(call, ret)                                                            \
    do {                                                                                   \
        ncclResult_t r_ = (call);                                                          \
        if (r_ != ncclSuccess) {                                                           \
            snprintf(err, errlen, "%s:%d: %s: %s", __FILE__, __LINE__, #call,              \
                     ncclGetErrorString(r_));                                              \
            return ret;                                                                    \
        }                                                                                  \
    } while (0)

extern "C" cu_comm *cu_comm_new(eng_backend **backends, int n, char *err, size_t errlen)
{
    if (n < 1) {
        snprintf(err, errlen, "cu_comm_new: need at least one backend");
        return NULL;
    }
    int *devs = (int *)calloc((size_t)n, sizeof *devs);
    cu_comm *cm = (cu_comm *)calloc(1, sizeof *cm);
    ncclComm_t *comms = (ncclComm_t *)calloc((size_t)n, sizeof *comms);
    eng_backend **bes = (eng_backend **)calloc((size_t)n, sizeof *bes);
    if (!devs || !cm || !comms || !bes) {
        free(devs); free(cm); free(comms); free(bes);
        snprintf(err, errlen, "cu_comm_new: out of host memory");
        return NULL;
    }
    for (int r = 0; r < n; r++) {
        if (!backends[r] || strncmp(backends[r]->name, "cuda", 4) != 0) {
            snprintf(err, errlen, "cu_comm_new: rank %d is not a CUDA backend", r);
            free(devs); free(cm); free(comms); free(bes);
            return NULL;
        }
        devs[r] = cu_of(backends[r])->dev;
        for (int q = 0; q < r; q++)
            if (devs[q] == devs[r]) {
                snprintf(err, errlen, "cu_comm_new: ranks %d and %d share cuda:%d", q, r, devs[r]);
                free(devs); free(cm); free(comms); free(bes);
                return NULL;
            }
        bes[r] = backends[r];
    }
    ncclResult_t nr = ncclCommInitAll(comms, n, devs);
    free(devs);
    if (nr != ncclSuccess) {
        snprintf(err, errlen, "ncclCommInitAll over %d devices: %s", n, ncclGetErrorString(nr));
        free(cm); free(comms); free(bes);
        return NULL;
    }
    cm->n = n;
    cm->comms = comms;
    cm->bes = bes;
    return cm;
}

extern "C" int cu_allreduce_sum(cu_comm *cm, float **bufs, size_t n_floats, char *err, size_t errlen)
{
    if (n_floats == 0)
        return 0;
    CHECK_NCCL_R(ncclGroupStart(), -1);
    for (int r = 0; r < cm->n; r++) {
        cu_impl *c = cu_of(cm->bes[r]);
        cudaError_t e = cudaSetDevice(c->dev);
        if (e != cudaSuccess) {
            (void)ncclGroupEnd();
            snprintf(err, errlen, "cudaSetDevice(%d): %s", c->dev, cudaGetErrorString(e));
            return -1;
        }
        ncclResult_t nr = ncclAllReduce(bufs[r], bufs[r], n_floats, ncclFloat, ncclSum, cm->comms[r], c->stream);
        if (nr != ncclSuccess) {
            (void)ncclGroupEnd();
            snprintf(err, errlen, "ncclAllReduce rank %d: %s", r, ncclGetErrorString(nr));
            return -1;
        }
    }
    CHECK_NCCL_R(ncclGroupEnd(), -1);
    for (int r = 0; r < cm->n; r++) {
        cu_impl *c = cu_of(cm->bes[r]);
        cudaError_t e = cudaSetDevice(c->dev);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess) {
            snprintf(err, errlen, "all-reduce on cuda:%d: %s", c->dev, cudaGetErrorString(e));
            return -1;
        }
    }
    return 0;
}

extern "C" void cu_comm_free(cu_comm *cm)
{
    if (!cm)
        return;
    for (int r = 0; r < cm->n; r++)
        (void)ncclCommDestroy(cm->comms[r]);
    free(cm->comms);
    free(cm->bes);
    free(cm);
}


/* ---- the NCCL collective: one process per GPU ------------------------------------ */

typedef struct {
    eng_coll *cpu;       /* borrowed: host buffers and the communicator's id */
    eng_backend *be;     /* borrowed */
    ncclComm_t comm;
} nccl_coll;

static int nc_allreduce(eng_coll *c, eng_backend *be, float *buf, size_t n, char *err, size_t errlen)
{
    nccl_coll *k = (nccl_coll *)c->impl;
    if (!be)
        return k->cpu->allreduce_sum(k->cpu, NULL, buf, n, err, errlen);
    if (be != k->be || !k->comm) {
        snprintf(err, errlen, "nccl collective (rank %d): %s", c->rank,
                 k->comm ? "the buffer is on another backend" : "the communicator was aborted");
        return -1;
    }
    if (n == 0)
        return 0;
    if (cu_enter(be) != 0) {
        snprintf(err, errlen, "%s: %s", be->name, cu_backend_error(be));
        return -1;
    }
    CHECK_NCCL_R(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, k->comm, cu_of(be)->stream), -1);
    cudaError_t e = cudaStreamSynchronize(cu_of(be)->stream);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "%s: all-reduce: %s", be->name, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

static void nc_abort(eng_coll *c, const char *why)
{
    nccl_coll *k = (nccl_coll *)c->impl;
    if (k->comm)
        (void)ncclCommAbort(k->comm);
    k->comm = NULL;
    k->cpu->abort(k->cpu, why);
}

static void nc_free(eng_coll *c)
{
    if (!c)
        return;
    nccl_coll *k = (nccl_coll *)c->impl;
    if (k && k->comm)
        (void)ncclCommDestroy(k->comm);
    free(k);
    free(c);
}

extern "C" eng_coll *cu_coll_nccl_new(eng_coll *cpu, eng_backend *be, char *err, size_t errlen)
{
    if (!cpu || !be || strncmp(be->name, "cuda", 4) != 0) {
        snprintf(err, errlen, "an NCCL collective needs a CPU group and a CUDA backend");
        return NULL;
    }
    /* rank 0 makes the id; it reaches the others as byte values summed with zeros */
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (cpu->rank == 0)
        CHECK_NCCL_R(ncclGetUniqueId(&id), NULL);
    float bytes[NCCL_UNIQUE_ID_BYTES];
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
        bytes[i] = cpu->rank == 0 ? (float)(unsigned char)id.internal[i] : 0.0f;
    if (cpu->allreduce_sum(cpu, NULL, bytes, NCCL_UNIQUE_ID_BYTES, err, errlen))
        return NULL;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
        id.internal[i] = (char)(unsigned char)bytes[i];
    if (cu_enter(be) != 0) {
        snprintf(err, errlen, "%s: %s", be->name, cu_backend_error(be));
        return NULL;
    }
    eng_coll *c = (eng_coll *)calloc(1, sizeof *c);
    nccl_coll *k = (nccl_coll *)calloc(1, sizeof *k);
    if (!c || !k) {
        free(c);
        free(k);
        snprintf(err, errlen, "out of host memory");
        return NULL;
    }
    ncclResult_t r = ncclCommInitRank(&k->comm, cpu->size, id, cpu->rank);
    if (r != ncclSuccess) {
        snprintf(err, errlen, "%s: ncclCommInitRank (rank %d of %d): %s", be->name, cpu->rank, cpu->size,
                 ncclGetErrorString(r));
        free(c);
        free(k);
        return NULL;
    }
    k->cpu = cpu;
    k->be = be;
    c->rank = cpu->rank;
    c->size = cpu->size;
    c->kind = "nccl";
    c->allreduce_sum = nc_allreduce;
    c->abort = nc_abort;
    c->free = nc_free;
    c->impl = k;
    return c;
}
