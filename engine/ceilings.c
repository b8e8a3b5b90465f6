/* engine/ceilings.c — GEMM GFLOP/s and memory bandwidth ceilings (see ceilings.h).
 * Shared by bench/engine, bench/distill and bench/cuda so that every table quotes the
 * machine's limits measured the same way.
 */
#include "engine/ceilings.h"

#include <omp.h>
#include <stdlib.h>

#include "engine/clock.h"

/* Best (smallest) wall and CPU seconds seen so far. */
typedef struct {
    double wall0, cpu0, best_wall, best_cpu;
} ceil_timer;

static void timer_init(ceil_timer *t)
{
    t->best_wall = t->best_cpu = 1e30;
}

static void timer_start(ceil_timer *t)
{
    t->cpu0 = eng_cpu_s();
    t->wall0 = eng_wall_s();
}

static void timer_stop(ceil_timer *t)
{
    double cpu = eng_cpu_s() - t->cpu0;
    double wall = eng_wall_s() - t->wall0;
    if (cpu < t->best_cpu)
        t->best_cpu = cpu;
    if (wall < t->best_wall)
        t->best_wall = wall;
}

static void timer_rate(const ceil_timer *t, double work, eng_rate *out)
{
    out->wall = t->best_wall > 0 ? work / t->best_wall : 0;
    out->cpu = t->best_cpu > 0 ? work / t->best_cpu : 0;
}

int eng_ceil_gemm(eng_backend *be, int n, int reps, eng_rate *out)
{
    out->wall = out->cpu = 0;
    size_t count = (size_t)n * n, bytes = sizeof(float) * count;
    float *A = be->alloc(be, bytes), *B = be->alloc(be, bytes), *C = be->alloc(be, bytes);
    if (!A || !B || !C) {
        be->free(be, A, A ? bytes : 0);
        be->free(be, B, B ? bytes : 0);
        be->free(be, C, C ? bytes : 0);
        return -1;
    }
    be->fill(be, A, 0.5f, count);
    be->fill(be, B, 0.25f, count);
    be->gemm(be, 0, 0, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);   /* warm-up */
    be->sync(be);
    ceil_timer t;
    timer_init(&t);
    for (int r = 0; r < reps; r++) {
        timer_start(&t);
        be->gemm(be, 0, 0, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        be->sync(be);
        timer_stop(&t);
    }
    be->free(be, A, bytes);
    be->free(be, B, bytes);
    be->free(be, C, bytes);
    timer_rate(&t, 2.0 * n * (double)n * n / 1e9, out);
    return 0;
}

int eng_ceil_copy(eng_backend *be, size_t bytes, int reps, eng_rate *out)
{
    out->wall = out->cpu = 0;
    void *a = be->alloc(be, bytes), *b = be->alloc(be, bytes);
    if (!a || !b) {
        be->free(be, a, a ? bytes : 0);
        be->free(be, b, b ? bytes : 0);
        return -1;
    }
    be->zero(be, a, bytes);
    be->copy(be, b, a, bytes);   /* warm-up */
    be->sync(be);
    ceil_timer t;
    timer_init(&t);
    for (int r = 0; r < reps; r++) {
        timer_start(&t);
        be->copy(be, r % 2 ? a : b, r % 2 ? b : a, bytes);
        be->sync(be);
        timer_stop(&t);
    }
    be->free(be, a, bytes);
    be->free(be, b, bytes);
    timer_rate(&t, 2.0 * (double)bytes / 1e9, out);
    return 0;
}

int eng_ceil_triad(size_t n, int threads, int reps, eng_rate *out)
{
    out->wall = out->cpu = 0;
    if (threads <= 0)
        threads = omp_get_max_threads();
    float *a = aligned_alloc(64, n * 4), *b = aligned_alloc(64, n * 4), *c = aligned_alloc(64, n * 4);
    if (!a || !b || !c) {
        free(a);
        free(b);
        free(c);
        return -1;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < n; i++) {
        a[i] = 0;
        b[i] = 1;
        c[i] = 2;
    }
    ceil_timer t;
    timer_init(&t);
    for (int r = 0; r < reps; r++) {
        timer_start(&t);
#pragma omp parallel for simd schedule(static) num_threads(threads)
        for (size_t i = 0; i < n; i++)
            a[i] = b[i] + 3.0f * c[i];
        timer_stop(&t);
    }
    volatile float sink = a[n / 2];
    (void)sink;
    free(a);
    free(b);
    free(c);
    timer_rate(&t, 3.0 * 4.0 * (double)n / 1e9, out);
    return 0;
}
