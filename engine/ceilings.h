/* engine/ceilings.h — the machine's two ceilings, measured the same way by every bench:
 * fp32 GEMM GFLOP/s on an n x n x n product through be->gemm, and memory bandwidth
 * (device copy through be->copy, or a host STREAM triad). Each is the best of a few
 * timed reps after one warm-up, with be->sync before every clock read, reported both as
 * wall-clock and as process-CPU-time rates (the CPU-time rate is the robust one on a
 * shared, oversubscribed machine; on a GPU backend only the wall rate means anything).
 * Not a benchmark suite: no statistics beyond "best of".
 */
#ifndef AC_ENGINE_CEILINGS_H
#define AC_ENGINE_CEILINGS_H

#include <stddef.h>

#include "engine/backend.h"

/* One measured rate. Each field is work / (the smallest time of that clock over the reps):
 * the best wall rep and the best CPU rep need not be the same rep. Units are the caller's
 * (GFLOP/s for eng_ceil_gemm, GB/s for the bandwidths). */
typedef struct {
    double wall;   /* per wall-clock second (CLOCK_MONOTONIC) */
    double cpu;    /* per process CPU second (CLOCK_PROCESS_CPUTIME_ID) */
} eng_rate;

/* C = A @ B with n x n fp32 matrices through be->gemm: one warm-up, then `reps` timed
 * products; 2 n^3 flops each. Returns 0 with *out in GFLOP/s, or -1 when be->alloc fails
 * (nothing leaked, *out zeroed). */
int eng_ceil_gemm(eng_backend *be, int n, int reps, eng_rate *out);

/* Device copy bandwidth: two `bytes` buffers through be->alloc, one warm-up copy, then
 * `reps` timed be->copy calls (alternating direction), each counted as bytes read +
 * bytes written (2 * bytes). Returns 0 with *out in GB/s, or -1 when be->alloc fails
 * (nothing leaked, *out zeroed). */
int eng_ceil_copy(eng_backend *be, size_t bytes, int reps, eng_rate *out);

/* Host STREAM triad a = b + 3c over n floats (a multiple of 16) on `threads` OpenMP threads (<= 0: the
 * OpenMP default): `reps` timed passes, 3 * 4n bytes each (write-allocate ignored).
 * Host memory only, no backend. Returns 0 with *out in GB/s, or -1 on OOM (*out zeroed). */
int eng_ceil_triad(size_t n, int threads, int reps, eng_rate *out);

#endif
