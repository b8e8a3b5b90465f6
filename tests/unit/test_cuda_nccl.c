/* tests/unit/test_cuda_nccl.c — the NCCL all-reduce used for data-parallel distillation:
 * one backend per CUDA device of the host (one rank when there is one GPU), random
 * per-rank buffers, every rank must end with the element-wise sum. Also checks that a
 * communicator refuses two ranks on one device and non-CUDA backends.
 * Skips ("SKIPPED: no CUDA device") without a GPU or in a build without CUDA.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/devices.h"
#if defined(AC_CUDA) && AC_CUDA
#include "cuda/backend_cuda.h"

#define MAXR 8

static void test_allreduce(void **state)
{
    (void)state;
    int n = eng_device_count() - 1;
    if (n > MAXR)
        n = MAXR;
    eng_backend *be[MAXR];
    float *buf[MAXR];
    size_t cnt = 100003;
    float *host = malloc(sizeof(float) * cnt * (size_t)n), *sum = calloc(cnt, sizeof(float)), *back = malloc(sizeof(float) * cnt);
    assert_non_null(host);
    assert_non_null(sum);
    assert_non_null(back);
    char err[256];
    uint64_t s = 12345;
    for (int r = 0; r < n; r++) {
        char name[32];
        snprintf(name, sizeof name, "cuda:%d", r);
        be[r] = eng_backend_new(name, err, sizeof err);
        if (!be[r])
            fail_msg("%s: %s", name, err);
        buf[r] = be[r]->alloc(be[r], sizeof(float) * cnt);
        assert_non_null(buf[r]);
        for (size_t i = 0; i < cnt; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            float v = (float)((double)(s >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
            host[(size_t)r * cnt + i] = v;
            sum[i] += v;   /* same order as a ring would not guarantee: compare with tolerance */
        }
        be[r]->to_device(be[r], buf[r], host + (size_t)r * cnt, sizeof(float) * cnt);
    }
    cu_comm *c = cu_comm_new(be, n, err, sizeof err);
    if (!c)
        fail_msg("cu_comm_new over %d devices: %s", n, err);
    if (cu_allreduce_sum(c, buf, cnt, err, sizeof err) != 0)
        fail_msg("all-reduce: %s", err);
    double worst = 0;
    for (int r = 0; r < n; r++) {
        be[r]->to_host(be[r], back, buf[r], sizeof(float) * cnt);
        for (size_t i = 0; i < cnt; i++) {
            double d = fabs((double)back[i] - sum[i]);
            if (!(d <= worst))
                worst = d;
        }
    }
    printf("all-reduce over %d rank(s): max abs error %.3e\n", n, worst);
    assert_true(worst <= 1e-5 * n);
    cu_comm_free(c);
    for (int r = 0; r < n; r++) {
        be[r]->free(be[r], buf[r], sizeof(float) * cnt);
        eng_backend_free(be[r]);
    }
    free(host);
    free(sum);
    free(back);
}

static void test_comm_refusals(void **state)
{
    (void)state;
    char err[256];
    eng_backend *g = eng_backend_new("cuda:0", err, sizeof err), *cpu = eng_backend_new("cpu", err, sizeof err);
    assert_non_null(g);
    assert_non_null(cpu);
    eng_backend *twice[2] = {g, g}, *mixed[2] = {g, cpu};
    assert_null(cu_comm_new(twice, 2, err, sizeof err));
    assert_non_null(strstr(err, "share"));
    assert_null(cu_comm_new(mixed, 2, err, sizeof err));
    assert_non_null(strstr(err, "not a CUDA backend"));
    assert_null(cu_comm_new(mixed, 0, err, sizeof err));
    eng_backend_free(g);
    eng_backend_free(cpu);
}
#endif

int main(void)
{
#if defined(AC_CUDA) && AC_CUDA
    if (eng_device_count() < 2) {
        printf("SKIPPED: no CUDA device\n");
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_comm_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#else
    printf("SKIPPED: no CUDA device (this build has no CUDA backend (make CUDA=1))\n");
    return 0;
#endif
}
