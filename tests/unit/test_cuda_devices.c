/* tests/unit/test_cuda_devices.c — device enumeration and backend creation by name
 * (engine/devices.h) in every build: the CPU is always device 0, names parse strictly,
 * and "cuda:N" either works (a GPU present in a CUDA=1 build) or fails with the reason.
 * The GPU-only checks print "SKIPPED: no CUDA device" when there is none.
 */
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/devices.h"
#if defined(AC_CUDA) && AC_CUDA
#include "cuda/backend_cuda.h"
#endif

static void test_cpu_is_device_zero(void **state)
{
    (void)state;
    assert_true(eng_device_count() >= 1);
    eng_device_info d;
    assert_int_equal(eng_device_get(0, &d), 0);
    assert_string_equal(d.name, "cpu");
    assert_true(d.cores >= 1);
    assert_true(d.memory_bytes > ((uint64_t)64 << 20));
    assert_int_equal(d.cc_major, 0);
    assert_true(strstr(d.description, "CPU") != NULL);
    assert_int_equal(eng_device_get(-1, &d), -1);
    assert_int_equal(eng_device_get(eng_device_count(), &d), -1);
    assert_string_equal(d.name, "");   /* zeroed on failure */
    /* free memory now: the CPU's within its RAM; an unknown device's unknown */
    assert_int_equal(eng_device_get(0, &d), 0);
    int64_t f = eng_device_free_bytes("cpu");
    assert_true(f > 0 && (uint64_t)f <= d.memory_bytes);
    assert_int_equal(eng_device_free_bytes("tpu"), -1);
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", eng_device_count() - 1);   /* one past the last GPU */
    assert_int_equal(eng_device_free_bytes(name), -1);
}

/* The CPU's cores are the ones this process may run on: pinned to one CPU (taskset, a
 * container's cpuset), it has one, not the machine's count (llama.cpp then started a
 * thread per host CPU on that one). In a child, so the pinning stays there. */
static void test_cpu_cores_follow_affinity(void **state)
{
    (void)state;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0)
            _exit(3);
        eng_device_info d;
        if (eng_device_get(0, &d) != 0)
            _exit(4);
        _exit(d.cores == 1 && eng_cpu_cores() == 1 ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_parse(void **state)
{
    (void)state;
    char err[128];
    int kind = -1, idx = -1;
    assert_int_equal(eng_device_parse("cpu", &kind, &idx, err, sizeof err), 0);
    assert_int_equal(kind, 0);
    assert_int_equal(eng_device_parse("cuda", &kind, &idx, err, sizeof err), 0);
    assert_int_equal(kind, 1);
    assert_int_equal(idx, 0);
    assert_int_equal(eng_device_parse("cuda:7", &kind, &idx, err, sizeof err), 0);
    assert_int_equal(idx, 7);
    const char *bad[] = {"", "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1a", "cuda:99999", "CPU", "cpu:0"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = '\0';
        assert_int_equal(eng_device_parse(bad[i], &kind, &idx, err, sizeof err), -1);
        assert_true(err[0] != '\0');
    }
    assert_int_equal(eng_device_parse(NULL, &kind, &idx, err, sizeof err), -1);
}

static void test_backend_by_name(void **state)
{
    (void)state;
    char err[256] = "";
    eng_backend *be = eng_backend_new("cpu", err, sizeof err);
    assert_non_null(be);
    assert_string_equal(be->name, "cpu");
    assert_non_null(be->gemm);
    assert_int_equal(eng_backend_check(be, err, sizeof err), 0);
    assert_int_equal(eng_backend_set_precision(be, "fp32", err, sizeof err), 0);
    /* bf16 on the CPU runs where oneDNN has a kernel for it, else it says why. */
    if (eng_backend_set_precision(be, "bf16", err, sizeof err) == 0)
        assert_string_equal(eng_backend_cpu_precision(be), "bf16");
    else
        assert_non_null(strstr(err, "bf16"));
    assert_int_equal(eng_backend_set_precision(be, "int3", err, sizeof err), -1);
    assert_non_null(strstr(err, "unknown precision"));
    eng_backend_free(be);
    assert_int_equal(eng_backend_check(NULL, err, sizeof err), 0);
    assert_null(eng_backend_new("tpu:0", err, sizeof err));
    assert_true(strstr(err, "tpu:0") != NULL);
    assert_int_equal(eng_device_exists("cpu", err, sizeof err), 1);
    /* one past the last CUDA device never exists, whatever the build */
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", eng_device_count() - 1);
    assert_int_equal(eng_device_exists(name, err, sizeof err), 0);
    assert_null(eng_backend_new(name, err, sizeof err));
#if !(defined(AC_CUDA) && AC_CUDA)
    assert_true(strstr(err, "this build has no CUDA backend (make CUDA=1)") != NULL);
#endif
}

static void test_cuda_devices_listed(void **state)
{
    (void)state;
    int n = eng_device_count();
    if (n < 2) {
        printf("SKIPPED: no CUDA device (GPU listing checks)\n");
        return;
    }
    for (int i = 1; i < n; i++) {
        eng_device_info d;
        assert_int_equal(eng_device_get(i, &d), 0);
        char want[32];
        snprintf(want, sizeof want, "cuda:%d", i - 1);
        assert_string_equal(d.name, want);
        assert_true(d.cc_major >= 7);
        assert_true(d.memory_bytes > ((uint64_t)1 << 30));
        assert_true(d.cores > 0);
        assert_true(d.description[0] != '\0');
        int64_t f = eng_device_free_bytes(d.name);
        assert_true(f > 0 && (uint64_t)f <= d.memory_bytes);
        printf("device %s: %s, %.1f GiB, sm_%d%d, %d SMs\n", d.name, d.description,
               (double)d.memory_bytes / (1 << 30), d.cc_major, d.cc_minor, d.cores);
    }
    char err[256] = "";
    eng_backend *be = eng_backend_new("cuda:0", err, sizeof err);
    if (!be)
        fail_msg("cuda:0: %s", err);
    assert_string_equal(be->name, "cuda:0");
    assert_int_equal(be->cur_bytes, 0);
    assert_int_equal(eng_backend_set_precision(be, "bf16", err, sizeof err), 0);
    assert_int_equal(eng_backend_set_precision(be, "fp16", err, sizeof err), 0);
    assert_int_equal(eng_backend_set_precision(be, "fp32", err, sizeof err), 0);
    /* the memory outside the accounted allocations, each item measured: cuBLAS gets a
     * workspace of a known size; the context is measured or -1, never made up */
    int64_t rt = eng_backend_runtime_bytes(be);
    assert_true(rt >= ((int64_t)4 << 20));
    printf("cuda:0 runtime memory outside the backend's accounting: %.1f MiB\n", (double)rt / (1 << 20));
#if defined(AC_CUDA) && AC_CUDA
    /* the context is the process's: a second backend on the device reports the size the
     * first measured (a fresh process serving the model pays it), not -1 */
    cu_mem_items m1, m2;
    assert_int_equal(cu_backend_memory_items(be, &m1), 0);
    eng_backend_free(be);
    be = eng_backend_new("cuda:0", err, sizeof err);
    if (!be)
        fail_msg("cuda:0 again: %s", err);
    assert_int_equal(cu_backend_memory_items(be, &m2), 0);
    printf("cuda:0 context: %.1f MiB, then %.1f MiB for a second backend\n", (double)m1.context_bytes / (1 << 20),
           (double)m2.context_bytes / (1 << 20));
    assert_true(m2.context_bytes == m1.context_bytes);
#endif
    eng_backend_free(be);
    be = eng_backend_new("cpu", err, sizeof err);
    assert_int_equal(eng_backend_runtime_bytes(be), -1);   /* the CPU's is measured from its RSS */
    eng_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_is_device_zero),
        cmocka_unit_test(test_cpu_cores_follow_affinity),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_backend_by_name),
        cmocka_unit_test(test_cuda_devices_listed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
