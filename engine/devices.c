/* engine/devices.c — device enumeration and backend creation by name. The CPU is
 * described from sysconf and the compiler's CPU feature probe (its free memory from
 * /proc/meminfo, engine/procstat.h);
 * CUDA devices come from cuda/backend_cuda.h when built with AC_CUDA=1.
 */
#include "engine/devices.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/procstat.h"

#if defined(AC_CUDA) && AC_CUDA
#include "cuda/backend_cuda.h"
#define DEV_HAVE_CUDA 1
#else
#define DEV_HAVE_CUDA 0
#endif

static const char NO_CUDA_MSG[] = "this build has no CUDA backend (make CUDA=1)";

static int dev_cuda_count(void)
{
#if DEV_HAVE_CUDA
    int n = cu_device_count();
    return n > 0 ? n : 0;
#else
    return 0;
#endif
}

int eng_device_count(void)
{
    return 1 + dev_cuda_count();
}

int eng_cpu_cores(void)
{
    int n = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    if (n <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int)c : 1;
    }
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "re");   /* "QUOTA PERIOD", or "max PERIOD" */
    if (f) {
        char quota[32];
        long long period = 0;
        if (fscanf(f, "%31s %lld", quota, &period) == 2 && strcmp(quota, "max") && period > 0) {
            long long q = atoll(quota), cap = q > 0 ? (q + period - 1) / period : 0;
            if (cap > 0 && cap < n)
                n = (int)cap;
        }
        fclose(f);
    }
    return n;
}

static void dev_cpu_info(eng_device_info *out)
{
    snprintf(out->name, sizeof out->name, "cpu");
    long pages = sysconf(_SC_PHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    out->cores = eng_cpu_cores();
    out->memory_bytes = (pages > 0 && page > 0) ? (uint64_t)pages * (uint64_t)page : 0;
    const char *feat = "";
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        feat = " (AVX-512)";
    else if (__builtin_cpu_supports("avx2"))
        feat = " (AVX2)";
    const char *isa = "x86_64";
#elif defined(__aarch64__)
    const char *isa = "aarch64";
#else
    const char *isa = "unknown";
#endif
    snprintf(out->description, sizeof out->description, "%s CPU%s, %d cores", isa, feat, out->cores);
    snprintf(out->blas_kernel, sizeof out->blas_kernel, "%s", eng_blas_kernel());
    snprintf(out->blas_config, sizeof out->blas_config, "%s", eng_blas_config());
}

int eng_device_get(int i, eng_device_info *out)
{
    memset(out, 0, sizeof *out);
    if (i == 0) {
        dev_cpu_info(out);
        return 0;
    }
    if (i < 0 || i > dev_cuda_count())
        return -1;
#if DEV_HAVE_CUDA
    int gpu = i - 1;
    snprintf(out->name, sizeof out->name, "cuda:%d", gpu);
    if (cu_device_query(gpu, out->description, sizeof out->description, &out->memory_bytes,
                        &out->cc_major, &out->cc_minor, &out->cores) != 0) {
        memset(out, 0, sizeof *out);
        return -1;
    }
    return 0;
#else
    return -1;
#endif
}

int64_t eng_device_free_bytes(const char *device)
{
    int kind, index;
    char err[160];
    if (eng_device_parse(device, &kind, &index, err, sizeof err))
        return -1;
    if (kind == 0)
        return eng_mem_available_bytes();
#if DEV_HAVE_CUDA
    uint64_t f = 0;
    if (index < dev_cuda_count() && cu_device_free(index, &f) == 0)
        return (int64_t)f;
#endif
    return -1;
}

int eng_device_parse(const char *device, int *kind, int *index, char *err, size_t errlen)
{
    if (!device || !*device) {
        snprintf(err, errlen, "empty device name (expected \"cpu\" or \"cuda:N\")");
        return -1;
    }
    if (strcmp(device, "cpu") == 0) {
        *kind = 0;
        *index = 0;
        return 0;
    }
    if (strcmp(device, "cuda") == 0) {
        *kind = 1;
        *index = 0;
        return 0;
    }
    if (strncmp(device, "cuda:", 5) == 0) {
        const char *s = device + 5;
        char *end = NULL;
        if (*s < '0' || *s > '9') {
            snprintf(err, errlen, "%s: expected a device index after \"cuda:\"", device);
            return -1;
        }
        long v = strtol(s, &end, 10);
        if (*end != '\0' || v < 0 || v > 1023) {
            snprintf(err, errlen, "%s: bad CUDA device index", device);
            return -1;
        }
        *kind = 1;
        *index = (int)v;
        return 0;
    }
    snprintf(err, errlen, "%s: unknown device (expected \"cpu\" or \"cuda:N\")", device);
    return -1;
}

int eng_device_name(const char *device, char *out, size_t n, char *err, size_t errlen)
{
    int kind, index;
    if (eng_device_parse(device, &kind, &index, err, errlen) < 0)
        return -1;
    if (kind == 0)
        snprintf(out, n, "cpu");
    else
        snprintf(out, n, "cuda:%d", index);
    return 0;
}

int eng_device_exists(const char *device, char *err, size_t errlen)
{
    int kind = 0, index = 0;
    if (eng_device_parse(device, &kind, &index, err, errlen) != 0)
        return 0;
    if (kind == 0)
        return 1;
    if (!DEV_HAVE_CUDA) {
        snprintf(err, errlen, "%s: %s", device, NO_CUDA_MSG);
        return 0;
    }
    int n = dev_cuda_count();
    if (index >= n) {
        if (n == 0)
            snprintf(err, errlen, "%s: no CUDA device is present on this machine", device);
        else
            snprintf(err, errlen, "%s: only %d CUDA device%s (cuda:0..cuda:%d)", device, n,
                     n == 1 ? "" : "s", n - 1);
        return 0;
    }
    return 1;
}

eng_backend *eng_backend_new(const char *device, char *err, size_t errlen)
{
    int kind = 0, index = 0;
    if (eng_device_parse(device, &kind, &index, err, errlen) != 0)
        return NULL;
    if (kind == 0) {
        eng_backend *be = eng_backend_cpu_new(0);
        if (!be)
            snprintf(err, errlen, "cpu: out of memory creating the backend");
        return be;
    }
#if DEV_HAVE_CUDA
    if (!eng_device_exists(device, err, errlen))
        return NULL;
    return eng_backend_cuda_new(index, err, errlen);
#else
    snprintf(err, errlen, "%s: %s", device, NO_CUDA_MSG);
    return NULL;
#endif
}

int eng_backend_check(eng_backend *be, char *err, size_t errlen)
{
    if (!be)
        return 0;
    be->sync(be);
    const char *e = "";
    if (!strcmp(be->name, "cpu"))
        e = eng_backend_cpu_error(be);
#if DEV_HAVE_CUDA
    else
        e = cu_backend_error(be);
#endif
    if (e[0]) {
        const char *op = eng_backend_failed_op(be);
        if (op[0])
            snprintf(err, errlen, "%s: %s (first seen after op %s)", be->name, e, op);
        else
            snprintf(err, errlen, "%s: %s", be->name, e);
        return -1;
    }
    return 0;
}

int eng_backend_set_precision(eng_backend *be, const char *precision, char *err, size_t errlen)
{
    int fp32 = strcmp(precision, "fp32") == 0;
    int half = strcmp(precision, "bf16") == 0 || strcmp(precision, "fp16") == 0;
    if (!fp32 && !half) {
        snprintf(err, errlen, "%s: unknown precision (expected fp32, bf16 or fp16)", precision);
        return -1;
    }
#if DEV_HAVE_CUDA
    if (strncmp(be->name, "cuda", 4) == 0) {
        int p = fp32 ? CU_PREC_FP32 : strcmp(precision, "bf16") == 0 ? CU_PREC_BF16 : CU_PREC_FP16;
        if (cu_backend_set_precision(be, p) != 0) {
            snprintf(err, errlen, "%s: cannot set precision %s", be->name, precision);
            return -1;
        }
        return 0;
    }
#endif
    if (!strcmp(be->name, "cpu"))
        return eng_backend_cpu_set_precision(be, precision, err, errlen);
    if (!fp32) {
        snprintf(err, errlen, "%s: precision %s is not available on this backend (fp32 only)", be->name, precision);
        return -1;
    }
    return 0;
}

/* The CPU's answer per 16-bit type, probed once per process (a oneDNN kernel exists for
 * it on this CPU, or why not): index 0 bf16, 1 fp16. */
static pthread_mutex_t prec_mu = PTHREAD_MUTEX_INITIALIZER;
static int prec_known[2], prec_ok[2];
static char prec_why[2][256], prec_kernel[2][128];

int eng_device_precision(const char *device, const char *precision, char *err, size_t errlen)
{
    int kind, index;
    if (eng_device_parse(device, &kind, &index, err, errlen))
        return -1;
    if (!strcmp(precision, "fp32"))
        return 0;
    int i = !strcmp(precision, "bf16") ? 0 : !strcmp(precision, "fp16") ? 1 : -1;
    if (i < 0) {
        snprintf(err, errlen, "%s: unknown precision (expected fp32, bf16 or fp16)", precision);
        return -1;
    }
    if (kind != 0)   /* CUDA: cuBLAS runs all three; the device itself is checked where it runs */
        return 0;
    pthread_mutex_lock(&prec_mu);
    if (!prec_known[i]) {
        /* oneDNN's probe alone: no backend, so the process's thread count is untouched */
        prec_ok[i] = eng_cpu_gemm16_probe(precision, prec_kernel[i], sizeof prec_kernel[i], prec_why[i],
                                          sizeof prec_why[i]) == 0;
        prec_known[i] = 1;
    }
    int ok = prec_ok[i];
    if (!ok)
        snprintf(err, errlen, "%s", prec_why[i]);
    pthread_mutex_unlock(&prec_mu);
    return ok ? 0 : -1;
}

const char *eng_cpu_gemm_kernel(const char *precision)
{
    char why[256];
    if (!precision || !strcmp(precision, "fp32"))
        return eng_blas_kernel();
    if (eng_device_precision("cpu", precision, why, sizeof why))
        return "";
    return prec_kernel[!strcmp(precision, "bf16") ? 0 : 1];   /* written once, before prec_known */
}

void eng_backend_const(eng_backend *be, const void *p, size_t bytes, int on)
{
    if (be && !strcmp(be->name, "cpu"))
        eng_backend_cpu_const(be, p, bytes / sizeof(float), on);
}

int64_t eng_backend_runtime_bytes(eng_backend *be)
{
#if DEV_HAVE_CUDA
    cu_mem_items m;
    if (be && strncmp(be->name, "cuda", 4) == 0 && cu_backend_memory_items(be, &m) == 0)
        return (m.context_bytes > 0 ? m.context_bytes : 0) + m.blas_workspace_bytes + m.gemm16_workspace_bytes +
               m.pool_slack_bytes;
#endif
    (void)be;
    return -1;
}

eng_coll *eng_coll_device_new(eng_coll *cpu, eng_backend *be, char *err, size_t errlen)
{
    err[0] = 0;
    if (!be || !strcmp(be->name, "cpu"))
        return NULL;   /* host memory: the CPU collective itself */
#if DEV_HAVE_CUDA
    if (strncmp(be->name, "cuda", 4) == 0)
        return cu_coll_nccl_new(cpu, be, err, errlen);
#endif
    (void)cpu;
    snprintf(err, errlen, "%s: no collective for this backend", be->name);
    return NULL;
}
