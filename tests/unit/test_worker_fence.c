/* tests/unit/test_worker_fence.c — a worker whose job is taken from it. The worker runs
 * one attempt of a job (jobs/pipeline.c); while its stage runs, the job's lease is
 * treated as run out: another handle on the store requeues the job and runner "host-b"
 * claims it again (attempt 2). From then on nothing the old worker writes may land on
 * the job: not its progress, events, report, artifacts, the stage's completion, the next
 * stage or "succeeded". The job stays running at attempt 2 for host-b, and the old
 * worker stops at its next check instead of running on. Also: a stage's report merge
 * outlasts a store outage of a second or two (tried again, as the stage's completion is),
 * and so does the worker's read of a model's registration; a finished stage's resume
 * folders are removed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "jobs/pipeline.h"
#include "jobs/stage.h"
#include "storage/artstore.h"
#include "storage/fileio.h"
#include "storage/store.h"

static char dir[64], db[128];
static int ran_after, saw_stop;

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ac-fence-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(db, sizeof db, "%s/t.db", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return fio_remove_tree(dir);
}

/* The stage during which the job is taken over, then writes as the old attempt would. */
static int stage_taken(job_ctx *ctx, char *err, size_t errlen)
{
    store *other = store_open(db, err, errlen);
    if (!other)
        return -1;
    store_job b;
    int ok = store_job_requeue(other, job_ctx_id(ctx), "its runner stopped renewing the lease") == 0 &&
             store_job_claim(other, &(store_claim){"cpu", 0, "host-b", 30}, &b) == 0;
    if (ok)
        store_job_clear(&b);
    store_close(other);
    if (!ok) {
        snprintf(err, errlen, "the takeover failed");
        return -1;
    }
    job_progress(ctx, 7, 9);
    job_event(ctx, "test.stale", "written by the old attempt", NULL);
    job_report_merge(ctx, json_pack("{s:b}", "stale", 1));
    char path[4400];
    snprintf(path, sizeof path, "%s/stale.bin", job_ctx_stage_dir(ctx));
    if (fio_write_atomic(path, "old", 3, err, errlen) < 0)
        return -1;
    char perr[512];
    job_publish(ctx, "stale.bin", path, NULL, perr, sizeof perr);
    saw_stop = job_cancelled(ctx);
    return 0;
}

static int stage_after(job_ctx *ctx, char *err, size_t errlen)
{
    (void)ctx;
    (void)err;
    (void)errlen;
    ran_after = 1;
    return 0;
}

/* The store and an artifact store of its own (DIR/artifacts-NAME) for a test's job. */
static void open_stores(const char *name, store **st, artstore **as)
{
    char ad[128], err[512] = "";
    snprintf(ad, sizeof ad, "%s/artifacts-%s", dir, name);
    *st = store_open(db, err, sizeof err);
    *as = art_open(ad, err, sizeof err);
    assert_non_null(*st);
    assert_non_null(*as);
}

/* A job of `stages` (stolen) on device, with spec (stolen; NULL: a test pipeline's
 * alone), created and claimed by runner `owner` (attempt 1); its id into id. */
static void claimed_job(store *st, const char *device, json_t *spec, json_t *stages, const char *owner, char id[48])
{
    char err[256];
    store_job j, a;
    memset(&j, 0, sizeof j);
    assert_int_equal(store_new_id("job_", j.id, sizeof j.id), 0);
    snprintf(j.kind, sizeof j.kind, "job");
    snprintf(j.device, sizeof j.device, "%s", device);
    j.spec = spec ? spec : json_pack("{s:b}", "x_test_pipeline", 1);
    j.stages = stages;
    assert_int_equal(store_job_create(st, &j, NULL, NULL, NULL, 0, NULL, err, sizeof err), 0);
    assert_int_equal(store_job_claim(st, &(store_claim){device, 0, owner, 30}, &a), 0);
    assert_int_equal(a.attempts, 1);
    store_job_clear(&a);
    snprintf(id, 48, "%s", j.id);
    store_job_clear(&j);
}

static void test_taken_over(void **state)
{
    (void)state;
    char err[512] = "";
    store *st;
    artstore *as;
    open_stores("taken", &st, &as);
    stage_register("test_taken", stage_taken);
    stage_register("test_after", stage_after);
    store_job j;
    memset(&j, 0, sizeof j);
    claimed_job(st, "cpu", NULL, json_pack("[s,s]", "test_taken", "test_after"), "host-a", j.id);

    if (job_run(st, as, dir, j.id, err, sizeof err))
        fail_msg("job_run: %s", err);

    store_job now;
    assert_int_equal(store_job_get(st, j.id, &now), 0);
    assert_string_equal(now.status, "running");
    assert_string_equal(now.lease_owner, "host-b");
    assert_int_equal(now.attempts, 2);
    assert_int_equal(now.stage_index, 0);
    assert_true(now.step != 7 && now.total_steps != 9);
    assert_null(json_object_get(now.report, "stale"));
    store_job_clear(&now);
    assert_int_equal(ran_after, 0);
    assert_int_equal(saw_stop, 1);

    store_event *ev = NULL;
    int n = 0, more = 0;
    assert_int_equal(store_event_list(st, j.id, 0, 1000, &ev, &n, &more), 0);
    for (int i = 0; i < n; i++) {
        if (!strcmp(ev[i].type, "test.stale") || !strcmp(ev[i].type, "artifact.published") ||
            !strcmp(ev[i].type, "stage.completed") || !strncmp(ev[i].type, "job.succeeded", 13) ||
            !strcmp(ev[i].type, "job.failed") || !strcmp(ev[i].type, "job.cancelled"))
            fail_msg("the old attempt wrote event %s: %s", ev[i].type, ev[i].message);
    }
    store_event_list_free(ev, n);
    store_artifact *arts = NULL;
    assert_int_equal(store_artifact_list(st, j.id, &arts, &n), 0);
    assert_int_equal(n, 0);
    free(arts);

    /* the new attempt's own writes land */
    store_fence_job(st, j.id, 2);
    assert_int_equal(store_job_progress(st, j.id, 3, 4), 0);
    assert_int_equal(store_job_finish(st, j.id, "succeeded", NULL, NULL), 0);
    /* and none of a fenced handle's, once the job is finished */
    assert_int_equal(store_job_progress(st, j.id, 4, 4), STORE_FENCED);
    assert_int_equal(store_event_append(st, j.id, "test.late", "late", NULL), STORE_FENCED);
    assert_int_equal(store_job_watch(st, j.id), STORE_FENCED);
    store_job_clear(&j);
    art_close(as);
    store_close(st);
}

/* Drop the trigger that fails every report write, after 1.5 s. */
static void *store_back(void *arg)
{
    struct timespec ts = {1, 500000000};
    nanosleep(&ts, NULL);
    return (void *)(intptr_t)sqlite3_exec(arg, "DROP TRIGGER no_report", NULL, NULL, NULL);
}

/* Its report merge meets a store that refuses report writes for 1.5 s. */
static int stage_outage(job_ctx *ctx, char *err, size_t errlen)
{
    sqlite3 *h = NULL;
    pthread_t t;
    if (sqlite3_open(db, &h) != SQLITE_OK || sqlite3_busy_timeout(h, 10000) != SQLITE_OK ||
        sqlite3_exec(h, "CREATE TRIGGER no_report BEFORE UPDATE OF report ON jobs "
                        "BEGIN SELECT RAISE(ABORT, 'the store is down'); END", NULL, NULL, NULL) != SQLITE_OK ||
        pthread_create(&t, NULL, store_back, h)) {
        snprintf(err, errlen, "could not set the outage up");
        sqlite3_close(h);
        return -1;
    }
    int rc = job_report_merge(ctx, json_pack("{s:b}", "through", 1));
    void *dropped;
    pthread_join(t, &dropped);
    sqlite3_close(h);
    if (rc)
        snprintf(err, errlen, "the report merge failed");
    return rc || dropped ? -1 : 0;
}

/* Run a job of the one stage `stage` (registered as fn) to its end on device, with spec
 * (stolen; NULL: a test pipeline's alone); the job as it ended into *now (clear it). */
static void run_one_stage(const char *stage, stage_fn fn, const char *device, json_t *spec, store_job *now)
{
    char err[512] = "";
    store *st;
    artstore *as;
    open_stores(stage, &st, &as);
    stage_register(stage, fn);
    char id[48];
    claimed_job(st, device, spec, json_pack("[s]", stage), "host-a", id);
    if (job_run(st, as, dir, id, err, sizeof err))
        fail_msg("job_run: %s", err);
    assert_int_equal(store_job_get(st, id, now), 0);
    art_close(as);
    store_close(st);
}

static void test_report_merge_outlasts_outage(void **state)
{
    (void)state;
    store_job now;
    run_one_stage("test_outage", stage_outage, "cpu-outage", NULL, &now);
    assert_string_equal(now.status, "succeeded");
    assert_true(json_is_true(json_object_get(now.report, "through")));
    store_job_clear(&now);
}

static char scratch_stage_dir[4400];

/* Writes a result beside a folder kept only to resume (a distillation's checkpoints). */
static int stage_scratch(job_ctx *ctx, char *err, size_t errlen)
{
    char p[4500];
    snprintf(scratch_stage_dir, sizeof scratch_stage_dir, "%s", job_ctx_stage_dir(ctx));
    snprintf(p, sizeof p, "%s/%s", job_ctx_stage_dir(ctx), STAGE_DISTILL_CKPT);
    if (fio_mkdirs(p))
        return -1;
    snprintf(p, sizeof p, "%s/%s/step-5.bin", job_ctx_stage_dir(ctx), STAGE_DISTILL_CKPT);
    if (fio_write_atomic(p, "state", 5, err, errlen) < 0)
        return -1;
    snprintf(p, sizeof p, "%s/result.bin", job_ctx_stage_dir(ctx));
    return fio_write_atomic(p, "result", 6, err, errlen) < 0 ? -1 : 0;
}

/* A stage recorded finished never runs again on this host: what it kept only to resume
 * (STAGE_DISTILL_CKPT, STAGE_PRUNE_RECON) is removed, its outputs stay. */
static void test_resume_folders_dropped(void **state)
{
    (void)state;
    store_job now;
    run_one_stage("test_scratch", stage_scratch, "cpu-scratch", NULL, &now);
    assert_string_equal(now.status, "succeeded");
    store_job_clear(&now);
    char p[4500];
    snprintf(p, sizeof p, "%s/result.bin", scratch_stage_dir);
    assert_true(fio_is_file(p));
    snprintf(p, sizeof p, "%s/.done", scratch_stage_dir);
    assert_true(fio_is_file(p));
    snprintf(p, sizeof p, "%s/%s", scratch_stage_dir, STAGE_DISTILL_CKPT);
    assert_false(fio_is_dir(p));
}

static int stage_nothing(job_ctx *ctx, char *err, size_t errlen)
{
    (void)ctx;
    (void)err;
    (void)errlen;
    return 0;
}

/* Put the models table back after 1.5 s. */
static void *registry_back(void *arg)
{
    struct timespec ts = {1, 500000000};
    nanosleep(&ts, NULL);
    return (void *)(intptr_t)sqlite3_exec(arg, "ALTER TABLE models_away RENAME TO models", NULL, NULL, NULL);
}

/* A model the API fetched by URL, read from this host's own copy: while the registry
 * cannot be read (its table out of reach for 1.5 s), the worker asks again rather than take
 * the model for one given by path. Here the API's copy is on another host, this one has
 * none and no shared artifact store: the job fails naming that, as it does without the
 * outage (it went on, and its stages would have read a path that is not on this host). */
static void test_model_registry_outage(void **state)
{
    (void)state;
    char err[512] = "";
    store *st = store_open(db, err, sizeof err);
    assert_non_null(st);
    store_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.path, sizeof m.path, "/api-host/models/ab/stories.bin");
    snprintf(m.name, sizeof m.name, "stories");
    snprintf(m.format, sizeof m.format, "llama2c");
    snprintf(m.url, sizeof m.url, "https://example.org/stories.bin");
    snprintf(m.sha256, sizeof m.sha256, "%064d", 7);
    m.size_bytes = m.bytes_total = 1024;
    assert_int_equal(store_model_add(st, &m), 0);
    store_close(st);
    sqlite3 *h = NULL;
    pthread_t t;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_busy_timeout(h, 10000), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "ALTER TABLE models RENAME TO models_away", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(pthread_create(&t, NULL, registry_back, h), 0);
    store_job now;
    run_one_stage("test_nothing", stage_nothing, "cpu-registry",
                  json_pack("{s:b,s:{s:s,s:s}}", "x_test_pipeline", 1, "model", "id", m.id, "path", m.path), &now);
    void *back;
    assert_int_equal(pthread_join(t, &back), 0);
    assert_int_equal(sqlite3_close(h), SQLITE_OK);
    assert_null(back);
    assert_string_equal(now.status, "failed");
    assert_string_equal(now.error_code, "model_unavailable");
    assert_non_null(strstr(now.error_message, "no shared artifact store"));
    store_job_clear(&now);
}

static int seen_index = -1;

/* Notes the job's recorded progress (stage_index) as it runs. */
static int stage_seen(job_ctx *ctx, char *err, size_t errlen)
{
    store *st = store_open(db, err, errlen);
    store_job j;
    if (!st || store_job_get(st, job_ctx_id(ctx), &j)) {
        store_close(st);
        return -1;
    }
    seen_index = j.stage_index;
    store_job_clear(&j);
    store_close(st);
    return 0;
}

/* Two stages finished on another host, whose outputs this one cannot fetch: it runs them
 * again, and the job's recorded progress goes back with it: after the first of them,
 * one stage done, not two (a host taking over next would otherwise fetch the second's
 * outputs of the first run beside the first's of this one); and the report lists each
 * stage once. */
static void test_rerun_rewinds_progress(void **state)
{
    (void)state;
    char err[512] = "";
    store *st;
    artstore *as;
    open_stores("rewind", &st, &as);
    stage_register("test_r1", stage_nothing);
    stage_register("test_r2", stage_seen);
    char id[48];
    claimed_job(st, "cpu-rewind", NULL, json_pack("[s,s,s]", "test_r1", "test_r2", "test_r1"), "host-b", id);
    assert_int_equal(store_job_stage_done(st, id, 0, "test_r1", 1.0), 0);   /* on host a */
    assert_int_equal(store_job_stage_done(st, id, 1, "test_r2", 1.0), 0);
    if (job_run(st, as, dir, id, err, sizeof err))
        fail_msg("job_run: %s", err);
    assert_int_equal(seen_index, 1);
    store_job now;
    assert_int_equal(store_job_get(st, id, &now), 0);
    assert_string_equal(now.status, "succeeded");
    assert_int_equal(now.stage_index, 3);
    /* the report lists each stage once, as this run finished it */
    json_t *stages = json_object_get(now.report, "stages");
    assert_int_equal(json_array_size(stages), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(stages, 1), "name")), "test_r2");
    store_job_clear(&now);
    art_close(as);
    store_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_taken_over),
        cmocka_unit_test(test_report_merge_outlasts_outage),
        cmocka_unit_test(test_resume_folders_dropped),
        cmocka_unit_test(test_model_registry_outage),
        cmocka_unit_test(test_rerun_rewinds_progress),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
