/* tests/unit/test_report_limits.c — the report's limit rows (jobs/report.c): one row per
 * spec limit with predicted, measured and whether each holds (upper bounds for latency,
 * memory and params, a lower bound for throughput; memory in GiB; unknown values null);
 * and the retention policy's environment parsing and disk-usage sum (jobs/retention.c),
 * and that a data directory whose size cannot be measured gets no job removed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jobs/report.h"
#include "jobs/retention.h"
#include "storage/artstore.h"
#include "storage/store.h"

static json_t *row(json_t *rows, const char *name)
{
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) if (!strcmp(json_string_value(json_object_get(r, "name")), name)) return r;
    return NULL;
}

static void test_rows(void **state)
{
    (void)state;
    json_t *c = json_pack("{s:f,s:f,s:f,s:i}", "latency_ms", 10.0, "throughput_tokens_per_s", 50.0, "memory_gib",
                          1.0, "params", 1000);
    json_t *pred = json_pack("{s:f,s:f,s:{s:I}}", "latency_ms", 9.5, "throughput_tokens_per_s", 55.0, "memory_bytes",
                             "total", (json_int_t)(1LL << 29));
    json_t *meas = json_pack("{s:f,s:f,s:I}", "latency_ms", 10.5, "throughput_tokens_per_s", 49.0,
                             "peak_memory_bytes", (json_int_t)(1LL << 30));
    json_t *aim = json_pack("{s:f,s:f}", "latency_ms", 9.6, "memory_gib", 0.99);
    json_t *rows = job_report_limits(c, pred, meas, 900, aim);
    assert_int_equal(json_array_size(rows), 4);
    json_t *l = row(rows, "latency_ms");
    assert_true(json_is_true(json_object_get(l, "holds_predicted")));
    assert_true(json_is_false(json_object_get(l, "holds")));   /* 10.5 > 10 */
    assert_float_equal(json_real_value(json_object_get(l, "measured")), 10.5, 1e-12);
    json_t *t = row(rows, "throughput_tokens_per_s");
    assert_true(json_is_true(json_object_get(t, "holds_predicted")));   /* 55 >= 50 */
    assert_true(json_is_false(json_object_get(t, "holds")));            /* 49 < 50 */
    json_t *m = row(rows, "memory_gib");
    assert_float_equal(json_real_value(json_object_get(m, "predicted")), 0.5, 1e-12);
    assert_float_equal(json_real_value(json_object_get(m, "measured")), 1.0, 1e-12);
    assert_true(json_is_true(json_object_get(m, "holds")));   /* exactly at the limit holds */
    /* the search's aim shows beside the limits it names, and only those */
    assert_float_equal(json_real_value(json_object_get(l, "aimed")), 9.6, 1e-12);
    assert_float_equal(json_real_value(json_object_get(m, "aimed")), 0.99, 1e-12);
    assert_null(json_object_get(t, "aimed"));
    json_t *p = row(rows, "params");
    assert_null(json_object_get(p, "aimed"));
    assert_true(json_is_true(json_object_get(p, "holds")));
    assert_float_equal(json_real_value(json_object_get(p, "predicted")), 900, 0);
    json_decref(rows);

    /* nothing measured (e.g. a measure stage that did not run): measured and holds null */
    rows = job_report_limits(c, pred, NULL, 1200, NULL);
    l = row(rows, "latency_ms");
    assert_true(json_is_null(json_object_get(l, "measured")));
    assert_true(json_is_null(json_object_get(l, "holds")));
    assert_true(json_is_false(json_object_get(row(rows, "params"), "holds")));   /* 1200 > 1000 */
    json_decref(rows);

    /* a measurement of 0 is none (a serving whose numbers were lost): never a limit held */
    json_t *zero = json_pack("{s:f,s:f,s:I}", "latency_ms", 0.0, "throughput_tokens_per_s", 0.0, "peak_memory_bytes",
                             (json_int_t)0);
    rows = job_report_limits(c, pred, zero, 900, NULL);
    for (size_t i = 0; i < 3; i++) {
        json_t *r = json_array_get(rows, i);
        assert_true(json_is_null(json_object_get(r, "measured")));
        assert_true(json_is_null(json_object_get(r, "holds")));
    }
    /* each row says what its value is */
    assert_non_null(strstr(json_string_value(json_object_get(row(rows, "throughput_tokens_per_s"), "basis")),
                           "prefill is not counted"));
    json_decref(rows);
    json_decref(zero);

    /* only the limits the spec sets get rows */
    json_t *c1 = json_pack("{s:f}", "latency_ms", 3.0);
    rows = job_report_limits(c1, pred, meas, 900, NULL);
    assert_int_equal(json_array_size(rows), 1);
    json_decref(rows);
    json_decref(c1);
    json_decref(c);
    json_decref(pred);
    json_decref(meas);
    json_decref(aim);
}

static void test_retention_env(void **state)
{
    (void)state;
    retention_policy p;
    unsetenv("AC_RETAIN_MAX_BYTES");
    unsetenv("AC_RETAIN_MAX_AGE_S");
    assert_int_equal(retention_from_env(&p), 0);
    setenv("AC_RETAIN_MAX_BYTES", "1048576", 1);
    assert_int_equal(retention_from_env(&p), 1);
    assert_int_equal(p.max_bytes, 1048576);
    assert_int_equal(p.max_age_s, 0);
    setenv("AC_RETAIN_MAX_BYTES", "12x", 1);   /* invalid: no cap */
    setenv("AC_RETAIN_MAX_AGE_S", "-5", 1);
    assert_int_equal(retention_from_env(&p), 0);
    unsetenv("AC_RETAIN_MAX_BYTES");
    unsetenv("AC_RETAIN_MAX_AGE_S");
}

static void test_dir_bytes(void **state)
{
    (void)state;
    char dir[] = "/tmp/ac-ret-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    int64_t empty = retention_dir_bytes(dir);
    assert_true(empty >= 0);
    snprintf(path, sizeof path, "%s/f", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    static char buf[1 << 20];
    memset(buf, 7, sizeof buf);
    assert_int_equal(fwrite(buf, 1, sizeof buf, f), sizeof buf);
    assert_int_equal(fclose(f), 0);
    int64_t full = retention_dir_bytes(dir);
    assert_true(full - empty >= (1 << 20));
    unlink(path);
    rmdir(dir);
    assert_int_equal(retention_dir_bytes(dir), -1);
}

/* The size is unknown (here the directory is missing; on a live server a walk can fail when
 * another worker removes a folder under it): retention must say so and remove nothing,
 * not take the unknown size for one over the cap. */
static void test_unmeasured_removes_nothing(void **state)
{
    (void)state;
    char dir[] = "/tmp/ac-ret-XXXXXX", path[96], err[512] = "";
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/t.db", dir);
    store *st = store_open(path, err, sizeof err);
    assert_non_null(st);
    snprintf(path, sizeof path, "%s/artifacts", dir);
    artstore *as = art_open(path, err, sizeof err);
    assert_non_null(as);
    store_job j;
    memset(&j, 0, sizeof j);
    assert_int_equal(store_new_id("job_", j.id, sizeof j.id), 0);
    snprintf(j.kind, sizeof j.kind, "job");
    snprintf(j.device, sizeof j.device, "cpu");
    j.spec = json_pack("{s:s}", "name", "x");
    j.stages = json_pack("[s]", "a");
    assert_int_equal(store_job_create(st, &j, NULL, NULL, NULL, 0, NULL, err, sizeof err), 0);
    char id[48];
    snprintf(id, sizeof id, "%s", j.id);
    store_job_clear(&j);
    store_claim cl = {"cpu", 0, "test-runner", 30};
    assert_int_equal(store_job_claim(st, &cl, &j), 0);
    store_job_clear(&j);
    assert_int_equal(store_job_finish(st, id, "succeeded", NULL, NULL), 0);

    retention_policy p = {.max_bytes = (int64_t)1 << 40, .max_age_s = 0};
    int removed = -1;
    snprintf(path, sizeof path, "%s/missing", dir);
    assert_int_equal(retention_enforce(st, as, path, &p, NULL, &removed, err, sizeof err), -1);
    assert_int_equal(removed, 0);
    assert_non_null(strstr(err, "cannot measure"));
    assert_int_equal(store_job_get(st, id, &j), 0);
    assert_string_equal(j.status, "succeeded");
    store_job_clear(&j);
    /* measured, the same cap removes nothing either */
    assert_int_equal(retention_enforce(st, as, dir, &p, NULL, &removed, err, sizeof err), 0);
    assert_int_equal(removed, 0);
    art_close(as);
    store_close(st);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_retention_env),
        cmocka_unit_test(test_dir_bytes),
        cmocka_unit_test(test_unmeasured_removes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
