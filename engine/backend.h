/* engine/backend.h — the backend interface: a table of function pointers that model
 * code calls for every allocation and every numerical op. The CPU backend
 * (engine/backend_cpu.c) is the reference; the CUDA backend (cuda/) implements the same
 * table. Buffers are device memory of the backend; fp32 unless an op says otherwise.
 * Allocation is accounted (current and peak bytes) so memory predictions can be
 * checked against measurement.
 */
#ifndef AC_ENGINE_BACKEND_H
#define AC_ENGINE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef struct eng_backend eng_backend;

struct eng_backend {
    const char *name;            /* "cpu", "cuda:0" */
    int threads;                 /* CPU worker threads (0 = default) */
    size_t cur_bytes, peak_bytes;/* accounted device bytes */
    void *impl;                  /* backend private state */

    /* Memory. alloc returns NULL on failure (nothing accounted). */
    void *(*alloc)(eng_backend *be, size_t bytes);
    void (*free)(eng_backend *be, void *p, size_t bytes);
    void (*to_device)(eng_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*to_host)(eng_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*copy)(eng_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(eng_backend *be, void *dst, size_t bytes);
    void (*sync)(eng_backend *be);

    /* The numerical ops are added by the engine (see backend_cpu.c for the reference). */
};

/* Create the CPU backend with `threads` worker threads (0: all cores).
 * Returns a new backend, or NULL on OOM. Free with eng_backend_free. */
eng_backend *eng_backend_cpu_new(int threads);
void eng_backend_free(eng_backend *be);

/* Reset the peak counter to the current bytes. */
void eng_backend_reset_peak(eng_backend *be);

#endif
