/* tests/unit/test_engine_checkops.c — the op check of debug runs (engine/backend.h
 * eng_backend_check_ops): with AC_CHECK_OPS=1 every backend comes wrapped; ops still
 * compute the same results; the first op after which the backend reports a failure is
 * named, by the check and in eng_backend_check's message; without the switch backends
 * are not wrapped. The failure is one recorded inside the CPU backend's 16-bit GEMM
 * state (its only failure: an out-of-memory operand workspace), on CPUs that run bf16.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/backend.h"
#include "engine/cpu_mm16.h"
#include "engine/devices.h"

static void test_unchecked_by_default(void **state)
{
    (void)state;
    unsetenv("AC_CHECK_OPS");
    assert_int_equal(eng_backend_ops_checked(), 0);
    eng_backend *be = eng_backend_cpu_new(1);
    assert_non_null(be);
    assert_null(be->checks);
    assert_string_equal(eng_backend_failed_op(be), "");
    eng_backend_free(be);
}

static void test_checked_ops_name_the_failure(void **state)
{
    (void)state;
    setenv("AC_CHECK_OPS", "1", 1);
    assert_int_equal(eng_backend_ops_checked(), 1);
    eng_backend *be = eng_backend_cpu_new(1);
    assert_non_null(be);
    assert_non_null(be->checks);
    /* the wrapped ops compute what the plain ones do: C = A B^T */
    float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, -1, 2, 1, 0}, C[4];
    be->gemm(be, 0, 1, 2, 2, 3, 1.0f, A, 3, B, 3, 0.0f, C, 2);
    float want[4] = {-2, 4, -2, 13};
    assert_memory_equal(C, want, sizeof C);
    float *d = be->alloc(be, 64 * sizeof(float));
    assert_non_null(d);
    be->fill(be, d, 2.0f, 64);
    assert_true(be->sumsq(be, d, 64) == 256.0);
    be->free(be, d, 64 * sizeof(float));
    char err[512];
    assert_int_equal(eng_backend_check(be, err, sizeof err), 0);
    assert_string_equal(eng_backend_failed_op(be), "");
    if (eng_backend_set_precision(be, "bf16", err, sizeof err) == 0) {
        /* a failure recorded inside the backend (as an out-of-memory GEMM workspace
         * would be) is seen right after the op in which it happens */
        be->gemm(be, 0, 1, 2, 2, 3, 1.0f, A, 3, B, 3, 0.0f, C, 2);
        assert_string_equal(eng_backend_failed_op(be), "");
        cpu_mm16_fail(((cpu_impl *)be->impl)->mm, "injected failure");
        be->axpy(be, C, 1.0f, C, 4);
        assert_string_equal(eng_backend_failed_op(be), "axpy");
        assert_int_equal(eng_backend_check(be, err, sizeof err), -1);
        assert_non_null(strstr(err, "injected failure"));
        assert_non_null(strstr(err, "after op axpy"));
        printf("op check: %s\n", err);
        be->scale(be, C, 1.0f, 4);   /* a later op does not take the blame */
        assert_string_equal(eng_backend_failed_op(be), "axpy");
    } else {
        printf("no bf16 GEMMs on this CPU (%s): the failing-op half is not run\n", err);
    }
    eng_backend_free(be);
    unsetenv("AC_CHECK_OPS");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unchecked_by_default),
        cmocka_unit_test(test_checked_ops_name_the_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
