/* bench/prune_recovery/ceilings_probe.c — the machine's two ceilings for a bench whose
 * work runs in other processes: sgemm GFLOP/s (1024^3 through the CPU backend) and the
 * STREAM triad GB/s, wall-clock and CPU-time rates, as "name value" lines.
 * Usage: ceilings_probe [THREADS] (0 or absent: all cores). Not part of the product.
 */
#include <stdio.h>
#include <stdlib.h>

#include "engine/backend.h"
#include "engine/ceilings.h"

int main(int argc, char **argv)
{
    eng_blas_pick_kernel(argv);
    int threads = argc > 1 ? (int)strtol(argv[1], NULL, 10) : 0;
    eng_backend *be = eng_backend_cpu_new(threads);
    eng_rate gf, bw;
    if (!be || eng_ceil_gemm(be, 1024, 5, &gf) != 0 || eng_ceil_triad((size_t)64 << 20, be->threads, 5, &bw) != 0) {
        fprintf(stderr, "ceilings_probe: out of memory\n");
        return 1;
    }
    printf("threads %d\nsgemm_gflops %.1f\nsgemm_gflops_cpu %.1f\ntriad_gbs %.2f\ntriad_gbs_cpu %.2f\n", be->threads,
           gf.wall, gf.cpu, bw.wall, bw.cpu);
    eng_backend_free(be);
    return 0;
}
