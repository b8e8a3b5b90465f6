/* engine/devices.h — the compute devices this build can run on, and backends for them
 * by name. "cpu" is always device 0; "cuda:N" devices follow when the binary was built
 * with CUDA=1 (-DAC_CUDA=1) and a driver and GPU are present. Without CUDA support a
 * "cuda:N" name is refused with a message saying so; nothing is faked.
 */
#ifndef AC_ENGINE_DEVICES_H
#define AC_ENGINE_DEVICES_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/collective.h"

typedef struct {
    char name[32];            /* "cpu", "cuda:0", ... (what eng_backend_new accepts) */
    char description[128];    /* "NVIDIA H100 80GB HBM3", "x86_64 CPU (AVX2, FMA)" */
    uint64_t memory_bytes;    /* device memory (GPU) or physical RAM (CPU) */
    int cc_major, cc_minor;   /* CUDA compute capability; 0, 0 for the CPU */
    int cores;                /* CPU: online logical cores; GPU: streaming multiprocessors */
    char blas_kernel[32];     /* CPU: the kernel OpenBLAS runs ("SkylakeX"); "" for a GPU */
    char blas_config[160];    /* CPU: OpenBLAS's build configuration; "" for a GPU */
} eng_device_info;

/* Number of devices: 1 (the CPU) plus the CUDA devices the driver reports (0 of those in
 * a CPU-only build or without a working driver). Never fails. */
int eng_device_count(void);

/* Fill *out for device i (0 = cpu, 1.. = cuda:0..). Returns 0, or -1 when i is out of
 * range or the driver refuses the query (out is then zeroed).
 * (Named _get because C does not allow a function and a type to share the name
 * eng_device_info.) */
int eng_device_get(int i, eng_device_info *out);

/* The memory a new allocation on `device` can still get now, in bytes: the CPU's
 * MemAvailable (engine/procstat.h), a GPU's free memory as its driver reports it; -1
 * when unknown (an unknown or absent device, a refused query). */
int64_t eng_device_free_bytes(const char *device);

/* The CPUs this process may run on: its affinity set (taskset, a container's cpuset),
 * capped by a cgroup v2 CPU quota (cpu.max); at least 1. */
int eng_cpu_cores(void);

/* Parse a device name: "cpu" -> *kind 0, *index 0; "cuda" or "cuda:N" -> *kind 1,
 * *index N. Returns 0, or -1 with a message in err for anything else (no range check
 * against present devices: see eng_device_exists). */
int eng_device_parse(const char *device, int *kind, int *index, char *err, size_t errlen);
/* The one name of a device, the one jobs are stored and claimed under: "cpu", or "cuda:N"
 * for "cuda", "cuda:N" and "cuda:0N". 0 with the name in out, or -1 with err as
 * eng_device_parse. */
int eng_device_name(const char *device, char *out, size_t n, char *err, size_t errlen);

/* 1 if `device` names a device present in this build on this machine, else 0 with the
 * reason in err ("this build has no CUDA backend (make CUDA=1)", "cuda:3: only 2 CUDA
 * devices", ...). */
int eng_device_exists(const char *device, char *err, size_t errlen);

/* Create a backend for `device` ("cpu", "cuda:N"). Returns a new backend (free with
 * eng_backend_free), or NULL with the reason in err: unknown name, no CUDA in this
 * build, device absent, out of memory, driver error. */
eng_backend *eng_backend_new(const char *device, char *err, size_t errlen);

/* Set the precision of `be`'s GEMMs by name: "fp32" (every backend; exact fp32, no
 * TF32), "bf16" or "fp16" (operands rounded to 16 bits, fp32 accumulation and output;
 * everything else stays fp32; on the CPU through oneDNN, where this CPU has the
 * instructions: eng_backend_cpu_set_precision). Returns 0, or -1 with the reason in err
 * (unknown name, not available on this backend or CPU). */
int eng_backend_set_precision(eng_backend *be, const char *precision, char *err, size_t errlen);

/* 0 when `device` runs GEMMs at `precision` ("fp32", "bf16", "fp16"), else -1 with the
 * reason in err. The CPU's answer comes from a oneDNN probe made once per process (a
 * kernel for the type on this CPU, not its reference loops); CUDA backends run all three
 * (the device's presence is checked where it runs). Thread-safe. */
int eng_device_precision(const char *device, const char *precision, char *err, size_t errlen);

/* The kernel the CPU backend's GEMMs run at `precision`: the OpenBLAS kernel at fp32
 * (NULL too), oneDNN's implementation at bf16/fp16 ("brg:avx512_core_bf16", ...), ""
 * where that precision is not available. */
const char *eng_cpu_gemm_kernel(const char *precision);

/* Declare `bytes` of device memory at p constant (on = 1) until the same call with on =
 * 0: the backend may keep 16-bit copies of matrices it multiplies from there (a frozen
 * teacher, a student between optimizer steps). Nothing may write the range meanwhile. A
 * hint: backends without such copies ignore it. */
void eng_backend_const(eng_backend *be, const void *p, size_t bytes, int on);

/* Device memory `be` holds outside its accounted allocations, measured on the device:
 * on a CUDA backend its CUDA context (when measured), cuBLAS workspace, 16-bit operand
 * copies and memory-pool slack since the previous call (cu_backend_memory_items); -1 on
 * the CPU, whose runtime memory is measured from the process's RSS instead. */
int64_t eng_backend_runtime_bytes(eng_backend *be);

/* The collective for a data-parallel rank whose buffers live on `be`, over the CPU group
 * `cpu` this process joined: a new NCCL collective on a CUDA backend (one process per
 * GPU; free with c->free); NULL with err "" on the CPU, whose buffers the CPU collective
 * reduces itself; NULL with the reason in err otherwise. */
eng_coll *eng_coll_device_new(eng_coll *cpu, eng_backend *be, char *err, size_t errlen);

/* Synchronize `be` and report whether its ops have failed since it was created: CUDA
 * ops return void and record their first CUDA / cuBLAS failure (an illegal address, a
 * launch error, an unsupported shape) instead of aborting. Returns 0 when all is well,
 * or -1 with "cuda:N: <reason>" in err; then results computed on it must not be used and
 * the job should fail with that message. The CPU backend fails only at 16 bits (out of
 * memory for its operand workspace, a oneDNN error). */
int eng_backend_check(eng_backend *be, char *err, size_t errlen);

#endif
