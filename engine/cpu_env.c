/* engine/cpu_env.c — what the CPU backend runs on, as the process environment sets it:
 * the kernel OpenBLAS picked (and the re-exec that corrects a generic one) and how idle
 * OpenMP threads wait. Contracts in engine/backend.h.
 */
#include "engine/backend.h"

#include <cblas.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

const char *eng_blas_kernel(void)
{
    const char *k = openblas_get_corename();
    return k ? k : "unknown";
}

const char *eng_blas_config(void)
{
    const char *c = openblas_get_config();
    return c ? c : "unknown";
}

const char *eng_blas_kernel_for(const char *detected, int avx512, int avx2_fma)
{
    /* OpenBLAS's x86 kernels without AVX2 (what it falls back to on a CPU it does not know) */
    static const char *const old[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                                      "Sandybridge", "Katmai", "Coppermine", "Northwood", "Banias",
                                      "Athlon", "Opteron", "Opteron_SSE3", "Barcelona", "Bobcat",
                                      "Bulldozer", "Piledriver", "Steamroller", "Excavator"};
    if (!detected || !avx2_fma)
        return NULL;
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++)
        if (strcasecmp(detected, old[i]) == 0)
            return avx512 ? "SkylakeX" : "Haswell";
    return NULL;
}

void eng_blas_pick_kernel(char **argv)
{
#if defined(__x86_64__)
    if (getenv("OPENBLAS_CORETYPE"))
        return;
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    int avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const char *want = eng_blas_kernel_for(eng_blas_kernel(), avx512, avx2_fma);
    if (!want)
        return;
    if (setenv("OPENBLAS_CORETYPE", want, 1) != 0) {
        fprintf(stderr, "warning: OpenBLAS runs its %s kernel on a CPU that has %s; setting OPENBLAS_CORETYPE "
                "failed (%s)\n", eng_blas_kernel(), avx512 ? "AVX-512" : "AVX2", strerror(errno));
        return;
    }
    execv("/proc/self/exe", argv);
    fprintf(stderr, "warning: OpenBLAS runs its %s kernel on a CPU that has %s, and re-running with "
            "OPENBLAS_CORETYPE=%s failed (%s): GEMMs run several times slower\n", eng_blas_kernel(),
            avx512 ? "AVX-512" : "AVX2", want, strerror(errno));
#else
    (void)argv;
#endif
}

const char *eng_cpu_wait_policy(char *buf, size_t len)
{
    const char *pol = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
    if (pol && *pol && spin && *spin)
        snprintf(buf, len, "OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s", pol, spin);
    else if (pol && *pol)
        snprintf(buf, len, "OMP_WAIT_POLICY=%s", pol);
    else if (spin && *spin)
        snprintf(buf, len, "GOMP_SPINCOUNT=%s", spin);
    else
        snprintf(buf, len, "default");
    return buf;
}

int eng_cpu_default_threads(void)
{
    return omp_get_num_procs();
}
