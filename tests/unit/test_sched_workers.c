/* tests/unit/test_sched_workers.c — the scheduler (jobs/sched.c) with stand-in worker
 * programs (shell scripts that behave like a crashing, exiting, slow or signal-handling
 * worker): exit status and signals become failed jobs naming them, at most `per_device`
 * workers run per device and devices run in parallel, a cancel reaches the worker at
 * once, and a halt sends SIGTERM and requeues jobs left running (the halted scheduler
 * still answers the API's calls until it is freed); a cancel recorded only
 * in the store (another host's API) reaches the worker, and a worker whose job another
 * runner took over is killed without touching the job.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "jobs/sched.h"
#include "storage/store.h"

static char dir[64];
static store *st;

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ac-sched-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char db[128], err[256];
    snprintf(db, sizeof db, "%s/t.db", dir);
    st = store_open(db, err, sizeof err);
    assert_non_null(st);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    store_close(st);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Write an executable script; path into out. */
static void script(const char *name, const char *body, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", dir, name);
    FILE *f = fopen(out, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    assert_int_equal(chmod(out, 0755), 0);
}

static void mk(const char *device, char *out)
{
    store_job j;
    memset(&j, 0, sizeof j);
    store_new_id("job_", j.id, sizeof j.id);
    snprintf(j.kind, sizeof j.kind, "job");
    snprintf(j.device, sizeof j.device, "%s", device);
    j.spec = json_object();
    j.stages = json_pack("[s]", "s");
    char err[256];
    assert_int_equal(store_job_create(st, &j, NULL, NULL, NULL, 0, NULL, err, sizeof err), 0);
    snprintf(out, 48, "%s", j.id);
    store_job_clear(&j);
}

/* Poll until the job leaves `from` (or timeout); returns the job (clear it). */
static store_job wait_leave(const char *id, const char *from, double timeout)
{
    store_job j;
    double t0 = now_s();
    for (;;) {
        assert_int_equal(store_job_get(st, id, &j), 0);
        if (strcmp(j.status, from) != 0 || now_s() - t0 > timeout)
            return j;
        store_job_clear(&j);
        usleep(10000);
    }
}

static sched *start_attempts(const char *exe, const char *const *devs, int ndev, int per_device, int max_attempts)
{
    sched_config cfg = {st, exe, dir, devs, ndev, per_device, 2000, max_attempts, "runner-here", 30, 0, NULL, NULL, 0};
    char err[256];
    sched *s = sched_start(&cfg, err, sizeof err);
    assert_non_null(s);
    return s;
}

static sched *start(const char *exe, const char *const *devs, int ndev, int per_device)
{
    return start_attempts(exe, devs, ndev, per_device, 1);
}

static int llamacpp_here(void)
{
    return 1;
}

/* llama.cpp installed after the runner started: once its probe answers, the runner's row
 * in the registry offers llama.cpp too (the APIs of other hosts sharing the store read
 * there which engines each device has), without waiting for a restart. */
static void test_late_engine_registered(void **state)
{
    (void)state;
    const char *devs[] = {"r9"};
    const char *info = "{\"devices\": [{\"id\": \"r9\"}], \"engines\": [\"autocompress\"], \"workers_per_device\": 1}";
    sched_config cfg = {st, "/bin/true", dir, devs, 1, 1, 2000, 1, "runner-late", 30, 0, info, llamacpp_here, 0.1};
    char err[256];
    sched *s = sched_start(&cfg, err, sizeof err);
    assert_non_null(s);
    int offered = 0;
    double t0 = now_s();
    while (!offered && now_s() - t0 < 10) {
        json_t *rs = store_runners(st, 0), *r, *e;
        size_t i, k;
        json_array_foreach(rs, i, r) {
            if (strcmp(json_string_value(json_object_get(r, "name")), "runner-late"))
                continue;
            json_array_foreach(json_object_get(json_object_get(r, "info"), "engines"), k, e)
                offered |= !strcmp(json_string_value(e), "llama.cpp");
        }
        json_decref(rs);
        usleep(20000);
    }
    sched_stop(s, 1000);
    assert_true(offered);
}

/* With max_attempts 2 a killed worker's job is requeued once (the reason recorded), and a
 * second death fails it with the signal named. */
static void test_retry_policy(void **state)
{
    (void)state;
    char exe[128], a[48], body[256];
    mk("r1", a);
    snprintf(body, sizeof body, "kill -KILL $$\nsleep 5");
    script("w_retry.sh", body, exe, sizeof exe);
    const char *devs[] = {"r1"};
    sched *s = start_attempts(exe, devs, 1, 1, 2);
    double t0 = now_s();
    store_job j;
    for (;;) {
        assert_int_equal(store_job_get(st, a, &j), 0);
        if (!strcmp(j.status, "failed") || now_s() - t0 > 20)
            break;
        store_job_clear(&j);
        usleep(10000);
    }
    sched_stop(s, 1000);
    assert_string_equal(j.status, "failed");
    assert_int_equal(j.attempts, 2);
    assert_string_equal(j.error_code, "worker_killed");
    assert_non_null(strstr(j.error_message, "SIGKILL"));
    store_job_clear(&j);
}

static void test_exit_and_signals(void **state)
{
    (void)state;
    char exe[128], a[48], b[48];
    /* $4 is the job id: exit 3 for the first job, SIGSEGV for the second */
    char body[512];
    mk("d1", a);
    mk("d1", b);
    snprintf(body, sizeof body, "[ \"$3\" = \"%s\" ] && exit 3\nkill -SEGV $$\nsleep 5", a);
    script("w1.sh", body, exe, sizeof exe);
    const char *devs[] = {"d1"};
    sched *s = start(exe, devs, 1, 1);
    store_job ja = wait_leave(a, "queued", 10), jb;
    store_job_clear(&ja);
    ja = wait_leave(a, "running", 10);
    jb = wait_leave(b, "queued", 10);
    store_job_clear(&jb);
    jb = wait_leave(b, "running", 10);
    sched_stop(s, 1000);
    assert_string_equal(ja.status, "failed");
    assert_string_equal(ja.error_code, "worker_exited");
    assert_non_null(strstr(ja.error_message, "status 3"));
    assert_string_equal(jb.status, "failed");
    assert_string_equal(jb.error_code, "worker_killed");
    assert_non_null(strstr(jb.error_message, "SIGSEGV"));
    assert_non_null(strstr(jb.error_message, "signal 11"));
    store_job_clear(&ja);
    store_job_clear(&jb);
    /* the worker's output went to its log */
    char log[256];
    snprintf(log, sizeof log, "%s/jobs/%s/worker.log", dir, a);
    assert_int_equal(access(log, F_OK), 0);
}

/* A worker that exits while the store refuses to record it (here a trigger aborts every
 * change of a job's status, as a store outage fails the write) leaves its job "running"
 * under this runner, whose renewals keep the lease: the runner tries again every second,
 * and once the store takes writes the job fails, naming the exit. */
static void test_exit_settled_after_store_failure(void **state)
{
    (void)state;
    char exe[128], a[48], db[128];
    mk("d1", a);
    script("w_exit.sh", "sleep 0.5\nexit 4", exe, sizeof exe);
    snprintf(db, sizeof db, "%s/t.db", dir);
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    sqlite3_busy_timeout(h, 10000);
    const char *devs[] = {"d1"};
    sched *s = start(exe, devs, 1, 1);
    store_job j = wait_leave(a, "queued", 10);
    assert_string_equal(j.status, "running");
    store_job_clear(&j);
    assert_int_equal(sqlite3_exec(h, "CREATE TRIGGER no_settle BEFORE UPDATE OF status ON jobs "
                                     "BEGIN SELECT RAISE(ABORT, 'the store is down'); END", NULL, NULL, NULL),
                     SQLITE_OK);
    usleep(2000 * 1000);   /* the worker exited and the runner failed to record it */
    assert_int_equal(sched_running(s), 0);
    assert_int_equal(store_job_get(st, a, &j), 0);
    assert_string_equal(j.status, "running");
    store_job_clear(&j);
    assert_int_equal(sqlite3_exec(h, "DROP TRIGGER no_settle", NULL, NULL, NULL), SQLITE_OK);
    j = wait_leave(a, "running", 5);
    sched_stop(s, 1000);
    assert_string_equal(j.status, "failed");
    assert_string_equal(j.error_code, "worker_exited");
    assert_non_null(strstr(j.error_message, "status 4"));
    store_job_clear(&j);
    assert_int_equal(sqlite3_close(h), SQLITE_OK);
}

/* This runner's lease ran out while its worker ran, and the job was requeued and claimed
 * again, by this same runner (here the store's attempts move on under it): the old
 * worker's start is over. The runner kills it at its next look, and its exit does not
 * settle the job, which the new start runs. */
static void test_reclaimed_start_killed(void **state)
{
    (void)state;
    char exe[128], a[48], db[128], body[256], done[160];
    mk("d1", a);
    snprintf(done, sizeof done, "%s/w_old.done", dir);
    snprintf(body, sizeof body, "sleep 3\ntouch '%s'\nexit 4", done);
    script("w_old.sh", body, exe, sizeof exe);
    snprintf(db, sizeof db, "%s/t.db", dir);
    const char *devs[] = {"d1"};
    sched *s = start(exe, devs, 1, 1);
    store_job j = wait_leave(a, "queued", 10);
    assert_string_equal(j.status, "running");
    assert_int_equal(j.attempts, 1);
    store_job_clear(&j);
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    sqlite3_busy_timeout(h, 10000);
    char sql[256];
    snprintf(sql, sizeof sql, "UPDATE jobs SET attempts=2 WHERE id='%s'", a);
    assert_int_equal(sqlite3_exec(h, sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_close(h), SQLITE_OK);
    double t0 = now_s();
    while (sched_running(s) > 0 && now_s() - t0 < 10)
        usleep(20000);
    usleep(500 * 1000);   /* the runner's record of the exit, had it made one */
    sched_stop(s, 1000);
    assert_int_equal(access(done, F_OK), -1);   /* killed before its end */
    assert_int_equal(store_job_get(st, a, &j), 0);
    assert_string_equal(j.status, "running");
    assert_int_equal(j.attempts, 2);
    store_job_clear(&j);
}

static void test_per_device_limit(void **state)
{
    (void)state;
    char exe[128], log[128], body[512];
    snprintf(log, sizeof log, "%s/order.log", dir);
    snprintf(body, sizeof body, "echo \"start $3\" >> %s\nsleep 0.3\necho \"end $3\" >> %s\nexit 0", log, log);
    script("w2.sh", body, exe, sizeof exe);
    char ids[4][48];
    mk("g1", ids[0]);
    mk("g1", ids[1]);
    mk("g1", ids[2]);
    mk("g2", ids[3]);
    const char *devs[] = {"g1", "g2"};
    double t0 = now_s();
    sched *s = start(exe, devs, 2, 1);
    for (int i = 0; i < 4; i++) {
        store_job j = wait_leave(ids[i], "queued", 10);
        store_job_clear(&j);
        j = wait_leave(ids[i], "running", 10);
        /* exit 0 without recording an outcome is still a failure */
        assert_string_equal(j.status, "failed");
        assert_non_null(strstr(j.error_message, "without finishing"));
        store_job_clear(&j);
    }
    double wall = now_s() - t0;
    sched_stop(s, 1000);
    /* g1's three jobs ran one after another; g2's ran beside them */
    assert_true(wall >= 0.85);
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char line[128];
    int g1_running = 0, max_g1 = 0, g2_overlap = 0, g2_running = 0;
    while (fgets(line, sizeof line, f)) {
        int is_g2 = strstr(line, ids[3]) != NULL;
        int start = !strncmp(line, "start", 5);
        if (is_g2) {
            g2_overlap |= g1_running > 0; /* g1 busy when g2 started or ended */
            g2_running = start;
        }
        else {
            g1_running += start ? 1 : -1;
            if (g1_running > max_g1)
                max_g1 = g1_running;
            if (g2_running && g1_running)
                g2_overlap = 1;
        }
    }
    fclose(f);
    assert_int_equal(max_g1, 1);
    assert_true(g2_overlap);
}

/* A scheduler on devices d1 and d2, each running one job (ids into a and b) in the
 * worker script `body` (name: its file). */
static sched *two_running(const char *name, const char *body, const char *d1, const char *d2, char a[48], char b[48])
{
    char exe[128];
    script(name, body, exe, sizeof exe);
    mk(d1, a);
    mk(d2, b);
    const char *devs[] = {d1, d2};
    sched *s = start(exe, devs, 2, 1);
    store_job j = wait_leave(a, "queued", 10);
    store_job_clear(&j);
    j = wait_leave(b, "queued", 10);
    store_job_clear(&j);
    usleep(200000); /* let the shells install their traps */
    return s;
}

static void test_cancel_and_stop(void **state)
{
    (void)state;
    char a[48], b[48];
    sched *s = two_running("w3.sh", "trap 'exit 0' USR1\ntrap 'exit 0' TERM\nsleep 30 &\nwait", "c1", "c2", a, b);
    store_job j;
    assert_int_equal(store_job_cancel(st, a, &j), 0);
    store_job_clear(&j);
    double t0 = now_s();
    assert_int_equal(sched_cancel(s, a), 1);
    assert_int_equal(sched_cancel(s, "job_other"), 0);
    j = wait_leave(a, "running", 5);
    assert_string_equal(j.status, "cancelled");
    assert_true(now_s() - t0 < 1.0);
    store_job_clear(&j);
    assert_int_equal(sched_running(s), 1);
    /* halted, as a server stops while requests are still in flight: b's worker exits on
     * SIGTERM without an outcome (requeued), and the scheduler still answers those
     * requests (it is freed only by sched_stop, once nothing can call it) */
    sched_halt(s, 3000);
    assert_int_equal(store_job_get(st, b, &j), 0);
    assert_string_equal(j.status, "queued");
    store_job_clear(&j);
    assert_int_equal(sched_running(s), 0);
    assert_int_equal(sched_cancel(s, b), 0);
    sched_notify(s);
    sched_halt(s, 3000);
    assert_int_equal(store_job_get(st, b, &j), 0);
    assert_string_equal(j.status, "queued");   /* nothing claimed it again */
    store_job_clear(&j);
    sched_stop(s, 0);
}

static void test_store_cancel_and_takeover(void **state)
{
    (void)state;
    char a[48], b[48];
    sched *s = two_running("w4.sh", "trap 'exit 0' USR1\nsleep 30 &\nwait", "t1", "t2", a, b);
    store_job j;
    assert_int_equal(store_job_get(st, a, &j), 0);
    assert_string_equal(j.lease_owner, "runner-here");
    store_job_clear(&j);
    /* a cancel recorded in the store alone, as another host's API records it */
    double t0 = now_s();
    assert_int_equal(store_job_cancel(st, a, &j), 0);
    store_job_clear(&j);
    j = wait_leave(a, "running", 5);
    assert_string_equal(j.status, "cancelled");
    assert_true(now_s() - t0 < 2.0);
    store_job_clear(&j);
    /* b's lease was rescued and another runner claimed it: this runner's worker must go */
    assert_int_equal(store_job_requeue(st, b, "test: lease ran out"), 0);
    store_claim other = {"t2", 0, "runner-elsewhere", 30};
    assert_int_equal(store_job_claim(st, &other, &j), 0);
    store_job_clear(&j);
    t0 = now_s();
    while (sched_running(s) > 0 && now_s() - t0 < 5)
        usleep(20000);
    assert_int_equal(sched_running(s), 0);
    assert_int_equal(store_job_get(st, b, &j), 0);
    assert_string_equal(j.status, "running");               /* still the other runner's */
    assert_string_equal(j.lease_owner, "runner-elsewhere");
    store_job_clear(&j);
    sched_stop(s, 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_and_signals),
        cmocka_unit_test(test_reclaimed_start_killed),
        cmocka_unit_test(test_exit_settled_after_store_failure),
        cmocka_unit_test(test_retry_policy),
        cmocka_unit_test(test_per_device_limit),
        cmocka_unit_test(test_cancel_and_stop),
        cmocka_unit_test(test_store_cancel_and_takeover),
        cmocka_unit_test(test_late_engine_registered),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
