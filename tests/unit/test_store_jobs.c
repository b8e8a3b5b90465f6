/* tests/unit/test_store_jobs.c — the job store (storage/store*.c): migrations, job
 * state transitions (one transaction each), idempotency records, list pagination,
 * cancel/requeue/recover, leases (renewal, rescue, the engine a runner has), a worker's
 * writes fenced to its attempt, concurrent
 * claims, events with a cursor, artifacts and orphan detection on delete (a publish beside a
 * delete of the same content keeps its bytes), models, report
 * merging, concurrent writers on per-thread connections, and the change counter behind
 * long-polls. SQLite by default; with AC_TEST_STORE=postgresql://... (an empty database:
 * tests/run_all.sh makes one) the same tests run against PostgreSQL, and the store's TCP
 * connections are checked for keepalive probes and a user timeout.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "storage/artstore.h"
#include "storage/store.h"

static char dir[64], dbpath[1024];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/ac-store-XXXXXX");
    assert_non_null(mkdtemp(dir));
    const char *pg = getenv("AC_TEST_STORE");
    if (pg && *pg)
        snprintf(dbpath, sizeof dbpath, "%s", pg);
    else
        snprintf(dbpath, sizeof dbpath, "%s/t.db", dir);
    char err[256] = "";
    store *st = store_open(dbpath, err, sizeof err);
    if (!st)
        fail_msg("store_open: %s", err);
    *state = st;
    return 0;
}

static int teardown(void **state)
{
    store_close(*state);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Create a queued job on device with a 3-stage pipeline and the target's engine (NULL:
 * none named, the built-in one); id into out. */
static void mk_engine(store *st, const char *device, const char *engine, char *out)
{
    store_job j;
    memset(&j, 0, sizeof j);
    assert_int_equal(store_new_id("job_", j.id, sizeof j.id), 0);
    snprintf(j.kind, sizeof j.kind, "job");
    snprintf(j.device, sizeof j.device, "%s", device);
    j.spec = engine ? json_pack("{s:s,s:{s:s}}", "name", "x", "target", "engine", engine) : json_pack("{s:s}", "name", "x");
    j.stages = json_pack("[s,s,s]", "a", "b", "c");
    char err[256];
    assert_int_equal(store_job_create(st, &j, NULL, NULL, NULL, 0, NULL, err, sizeof err), 0);
    assert_string_equal(j.status, "queued");
    snprintf(out, 48, "%s", j.id);
    store_job_clear(&j);
}

static void mk(store *st, const char *device, char *out)
{
    mk_engine(st, device, NULL, out);
}

/* Claim as runner `owner` with a lease of lease_s (built-in engine only). */
static int claim_as(store *st, const char *device, const char *owner, int lease_s, store_job *j)
{
    store_claim cl = {device, 0, owner, lease_s};
    return store_job_claim(st, &cl, j);
}

static int claim(store *st, const char *device, store_job *j)
{
    return claim_as(st, device, "test-runner", 30, j);
}

static void test_migrations(void **state)
{
    store *st = *state;
    assert_int_equal(store_schema_version(st), 5);
    assert_string_equal(store_backend(st), strncmp(dbpath, "postgres", 8) ? "sqlite" : "postgresql");
    char err[256];
    store *again = store_open(dbpath, err, sizeof err); /* re-open: nothing to migrate */
    assert_non_null(again);
    assert_int_equal(store_schema_version(again), 5);
    store_close(again);
}

/* A server killed while its job runs: each restart's requeue is a start that counts
 * toward --max-attempts, so a job that keeps killing the server cannot loop. */
static void test_recover_counts_attempts(void **state)
{
    store *st = *state;
    char id[48];
    mk(st, "recover-dev", id);
    store_job j;
    for (int attempt = 1; attempt <= 2; attempt++) {
        assert_int_equal(claim(st, "recover-dev", &j), 0);
        assert_int_equal(j.attempts, attempt);
        store_job_clear(&j);
        assert_int_equal(store_job_stage_begin(st, id, 0, "a"), 0);
        assert_int_equal(store_recover(st, "test-runner", 2), 1);   /* the server died */
        assert_int_equal(store_job_get(st, id, &j), 0);
        assert_string_equal(j.status, attempt < 2 ? "queued" : "failed");
        if (attempt == 2) {
            assert_string_equal(j.error_code, "server_lost");
            assert_non_null(strstr(j.error_message, "after 2 of 2 attempts"));
        }
        store_job_clear(&j);
    }
    assert_int_equal(claim(st, "recover-dev", &j), 1);   /* nothing to run again */
}

static void test_ids(void **state)
{
    (void)state;
    char a[48], b[48];
    assert_int_equal(store_new_id("job_", a, sizeof a), 0);
    assert_int_equal(store_new_id("job_", b, sizeof b), 0);
    assert_int_equal(strlen(a), 28);
    assert_string_not_equal(a, b);
    char small[8];
    assert_int_equal(store_new_id("job_", small, sizeof small), -1);
}

static void test_lifecycle(void **state)
{
    store *st = *state;
    char id[48];
    mk(st, "cpu", id);
    store_job j;
    assert_int_equal(store_job_get(st, id, &j), 0);
    assert_string_equal(j.status, "queued");
    assert_int_equal(json_array_size(j.stages), 3);
    int64_t v0 = j.version;
    store_job_clear(&j);
    assert_int_equal(store_job_get(st, "job_nope", &j), 1);

    assert_int_equal(claim(st, "cuda:0", &j), 1); /* wrong device */
    assert_int_equal(claim(st, "cpu", &j), 0);
    assert_string_equal(j.id, id);
    assert_string_equal(j.status, "running");
    assert_int_equal(j.attempts, 1);
    assert_true(j.started_at > 0);
    assert_true(j.version > v0);
    store_job_clear(&j);
    assert_int_equal(claim(st, "cpu", &j), 1); /* nothing else queued */

    assert_int_equal(store_job_set_pid(st, id, 4242), 0);
    assert_int_equal(store_job_stage_begin(st, id, 0, "a"), 0);
    assert_int_equal(store_job_progress(st, id, 3, 10), 0);
    assert_int_equal(store_job_get(st, id, &j), 0);
    assert_string_equal(j.stage, "a");
    assert_int_equal(j.step, 3);
    assert_int_equal(j.total_steps, 10);
    assert_int_equal(j.worker_pid, 4242);
    store_job_clear(&j);
    assert_int_equal(store_job_stage_done(st, id, 0, "a", 1.5), 0);
    assert_int_equal(store_job_stage_done(st, id, 0, "a", 1.5), 0); /* stale index: no effect */
    assert_int_equal(store_job_get(st, id, &j), 0);
    assert_int_equal(j.stage_index, 1);
    json_t *stages = json_object_get(j.report, "stages");
    assert_int_equal(json_array_size(stages), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(stages, 0), "name")), "a");
    store_job_clear(&j);

    /* server restart: requeue keeps the stage index; claim again resumes there */
    assert_int_equal(store_recover(st, "test-runner", 5), 1);
    assert_int_equal(store_job_get(st, id, &j), 0);
    assert_string_equal(j.status, "queued");
    assert_int_equal(j.stage_index, 1);
    assert_int_equal(j.worker_pid, 0);
    store_job_clear(&j);
    assert_int_equal(store_job_requeue(st, id, "x"), 1); /* not running */
    assert_int_equal(claim(st, "cpu", &j), 0);
    assert_int_equal(j.attempts, 2);
    assert_int_equal(j.stage_index, 1);
    store_job_clear(&j);

    assert_int_equal(store_job_finish(st, id, "failed", "stage_failed", "b broke"), 0);
    assert_int_equal(store_job_finish(st, id, "succeeded", NULL, NULL), 1); /* already terminal */
    assert_int_equal(store_job_get(st, id, &j), 0);
    assert_string_equal(j.status, "failed");
    assert_string_equal(j.error_code, "stage_failed");
    assert_string_equal(j.error_message, "b broke");
    assert_true(j.finished_at >= j.started_at);
    store_job_clear(&j);

    store_event *ev;
    int n, more;
    assert_int_equal(store_event_list(st, id, 0, 100, &ev, &n, &more), 0);
    const char *want[] = {"job.created", "job.started", "stage.started", "stage.completed", "job.requeued",
                          "job.started", "job.failed"};
    assert_int_equal(n, 7);
    for (int i = 0; i < n; i++)
        assert_string_equal(ev[i].type, want[i]);
    assert_false(more);
    int64_t third = ev[2].seq;
    store_event_list_free(ev, n);
    assert_int_equal(store_event_list(st, id, third, 2, &ev, &n, &more), 0);
    assert_int_equal(n, 2);
    assert_true(more);
    assert_string_equal(ev[0].type, "stage.completed");
    assert_non_null(ev[0].data);
    store_event_list_free(ev, n);
}

static void test_cancel(void **state)
{
    store *st = *state;
    char q[48], r[48];
    mk(st, "cancel-dev", q);
    mk(st, "cancel-dev", r);
    store_job j;
    assert_int_equal(claim(st, "cancel-dev", &j), 0);
    assert_string_equal(j.id, q); /* oldest first */
    store_job_clear(&j);
    assert_int_equal(store_job_cancel(st, r, &j), 0); /* queued: cancelled at once */
    assert_string_equal(j.status, "cancelled");
    store_job_clear(&j);
    assert_int_equal(store_job_cancel(st, q, &j), 0); /* running: requested */
    assert_string_equal(j.status, "running");
    assert_true(j.cancel_requested);
    store_job_clear(&j);
    assert_int_equal(store_job_cancel_requested(st, q), 1);
    assert_int_equal(store_job_watch(st, q), 1);   /* the worker's one look sees it too */
    assert_int_equal(store_job_cancel(st, "job_missing", &j), 1);
    /* a dead server with a cancel pending: recover finishes the cancel */
    assert_int_equal(store_recover(st, "test-runner", 5), 1);
    assert_int_equal(store_job_get(st, q, &j), 0);
    assert_string_equal(j.status, "cancelled");
    store_job_clear(&j);
    assert_int_equal(store_job_cancel(st, q, &j), 0); /* terminal: unchanged */
    assert_string_equal(j.status, "cancelled");
    store_job_clear(&j);
}

static void test_idempotency(void **state)
{
    store *st = *state;
    store_job j;
    memset(&j, 0, sizeof j);
    store_new_id("job_", j.id, sizeof j.id);
    snprintf(j.kind, sizeof j.kind, "job");
    snprintf(j.device, sizeof j.device, "cpu");
    j.spec = json_object();
    j.stages = json_array();
    char err[256];
    assert_int_equal(store_job_create(st, &j, "POST /v1/jobs", "k", "abc", 201, "{\"id\":1}", err, sizeof err), 0);
    char first[48];
    snprintf(first, sizeof first, "%s", j.id);
    store_new_id("job_", j.id, sizeof j.id);
    assert_int_equal(store_job_create(st, &j, "POST /v1/jobs", "k", "def", 201, "{}", err, sizeof err), 1);
    store_job probe;
    assert_int_equal(store_job_get(st, j.id, &probe), 1); /* nothing inserted */
    char sha[65];
    int status;
    char *text;
    assert_int_equal(store_idem_get(st, "POST /v1/jobs", "k", sha, &status, &text), 0);
    assert_string_equal(sha, "abc");
    assert_int_equal(status, 201);
    assert_string_equal(text, "{\"id\":1}");
    free(text);
    assert_int_equal(store_idem_get(st, "POST /v1/calibrations", "k", sha, &status, &text), 1);
    /* same key in another scope is independent */
    assert_int_equal(store_job_create(st, &j, "POST /v1/calibrations", "k", "def", 202, "{}", err, sizeof err), 0);
    store_job_clear(&j);
}

static void test_pagination(void **state)
{
    store *st = *state;
    char ids[25][48];
    for (int i = 0; i < 25; i++)
        mk(st, "page-dev", ids[i]);
    int total_before = 0, seen[25] = {0};
    const char *after = NULL;
    char cursor[48];
    int64_t last_seq = INT64_MAX;
    for (;;) {
        store_job *jobs;
        int n, more;
        assert_int_equal(store_job_list(st, "job", after, 7, &jobs, &n, &more), 0);
        for (int i = 0; i < n; i++) {
            assert_true(jobs[i].seq < last_seq); /* newest first, strictly */
            last_seq = jobs[i].seq;
            int hit = 0;
            for (int k = 0; k < 25; k++)
                if (!strcmp(jobs[i].id, ids[k])) {
                    seen[k]++;
                    hit = 1;
                }
            total_before += !hit;
        }
        if (n)
            snprintf(cursor, sizeof cursor, "%s", jobs[n - 1].id);
        store_job_list_free(jobs, n);
        if (!more)
            break;
        after = cursor;
    }
    for (int k = 0; k < 25; k++)
        assert_int_equal(seen[k], 1);
    store_job *jobs;
    int n, more;
    assert_int_equal(store_job_list(st, "job", "job_doesnotexist", 5, &jobs, &n, &more), 1);
    assert_int_equal(store_job_list(st, "calibration", NULL, 5, &jobs, &n, &more), 0);
    assert_int_equal(n, 0);
    store_job_list_free(jobs, n);
}

static void test_artifacts_and_delete(void **state)
{
    store *st = *state;
    char a[48], b[48];
    mk(st, "art-dev", a);
    mk(st, "art-dev", b);
    store_artifact x = {0};
    snprintf(x.job_id, sizeof x.job_id, "%s", a);
    snprintf(x.name, sizeof x.name, "m.tar");
    snprintf(x.stage, sizeof x.stage, "export");
    memset(x.sha256, 'a', 64);
    x.size_bytes = 10;
    snprintf(x.content_type, sizeof x.content_type, "application/x-tar");
    assert_int_equal(store_artifact_add(st, &x), 0);
    assert_memory_equal(x.id, "art_", 4);
    store_artifact shared = x;
    snprintf(shared.name, sizeof shared.name, "shared.bin");
    memset(shared.sha256, 'b', 64);
    assert_int_equal(store_artifact_add(st, &shared), 0);
    snprintf(shared.job_id, sizeof shared.job_id, "%s", b); /* b holds the same content */
    assert_int_equal(store_artifact_add(st, &shared), 0);
    /* re-publishing a name replaces it */
    x.size_bytes = 11;
    assert_int_equal(store_artifact_add(st, &x), 0);
    store_artifact *list;
    int n;
    assert_int_equal(store_artifact_list(st, a, &list, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(list[0].name, "m.tar");
    assert_int_equal(list[0].size_bytes, 11);
    free(list);
    store_artifact got;
    assert_int_equal(store_artifact_get(st, a, "m.tar", &got), 0);
    assert_int_equal(store_artifact_get(st, a, "nope", &got), 1);

    char **orphans;
    int no;
    assert_int_equal(store_job_delete(st, a, &orphans, &no), 2); /* queued: not terminal */
    store_job j;
    assert_int_equal(store_job_cancel(st, a, &j), 0);
    store_job_clear(&j);
    assert_int_equal(store_job_delete(st, a, &orphans, &no), 0);
    assert_int_equal(no, 1); /* shared.bin's content is still used by b */
    assert_memory_equal(orphans[0], "aaaa", 4);
    free(orphans[0]);
    free(orphans);
    assert_int_equal(store_job_get(st, a, &j), 1);
    store_event *ev;
    int more;
    assert_int_equal(store_event_list(st, a, 0, 10, &ev, &n, &more), 0);
    assert_int_equal(n, 0);
    store_event_list_free(ev, n);
    assert_int_equal(store_job_delete(st, a, &orphans, &no), 1);
}

/* A job publishes content that a delete is finding orphaned (the other job that held it is
 * being removed). The delete holds the artifact store's publish lock; the publisher, having
 * found the blob stored, waits for it, then finds the blob gone and puts it again before
 * its row goes in: its artifact is readable. Without the lock a delete could unlink the
 * blob after the publisher had found it and before its row was recorded. */
static void test_publish_beside_delete(void **state)
{
    store *st = *state;
    char err[512], adir[1100], src[1100];
    snprintf(adir, sizeof adir, "%s/artifacts-race", dir);
    artstore *as = art_open(adir, err, sizeof err);
    assert_non_null(as);
    snprintf(src, sizeof src, "%s/content.bin", dir);
    FILE *f = fopen(src, "w");
    assert_non_null(f);
    assert_true(fputs("the same bytes in two jobs\n", f) >= 0);
    assert_int_equal(fclose(f), 0);
    char a[48], b[48];
    mk(st, "race-dev", a);
    mk(st, "race-dev", b);
    store_artifact x = {0};
    snprintf(x.job_id, sizeof x.job_id, "%s", a);
    snprintf(x.name, sizeof x.name, "r.json");
    assert_int_equal(store_artifact_publish(st, as, src, &x, err, sizeof err), 0);
    store_job j;
    assert_int_equal(store_job_cancel(st, a, &j), 0);   /* terminal: a may be deleted */
    store_job_clear(&j);
    int go[2], done[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(done), 0);
    fflush(NULL);
    pid_t kid = fork();   /* before the lock: a forked child shares its holder's locks */
    assert_true(kid >= 0);
    if (kid == 0) {   /* the publisher: its own connections, once the delete is under way */
        close(go[1]);
        close(done[0]);
        char c;
        if (read(go[0], &c, 1) != 1)
            _exit(2);
        store *cs = store_open(dbpath, err, sizeof err);
        artstore *cas = art_open(adir, err, sizeof err);
        store_artifact y = {0};
        snprintf(y.job_id, sizeof y.job_id, "%s", b);
        snprintf(y.name, sizeof y.name, "r.json");
        int rc = cs && cas ? store_artifact_publish(cs, cas, src, &y, err, sizeof err) : -1;
        if (write(done[1], "x", 1) != 1)
            rc = -1;
        art_close(cas);
        store_close(cs);
        _exit(rc == 0 ? 0 : 1);
    }
    close(go[0]);
    int lk = art_lock(as, 1, -1, err, sizeof err);   /* the delete, under way */
    assert_true(lk >= 0);
    assert_int_equal(write(go[1], "g", 1), 1);
    close(go[1]);
    close(done[1]);
    usleep(500 * 1000);   /* the publisher has found the blob stored and waits for the lock */
    char **orphans;
    int no;
    assert_int_equal(store_job_delete(st, a, &orphans, &no), 0);
    assert_int_equal(no, 1);   /* b's row is not in yet: the content is orphaned */
    assert_int_equal(art_remove(as, orphans[0]), 0);
    free(orphans[0]);
    free(orphans);
    char c;
    assert_int_equal(fcntl(done[0], F_SETFL, O_NONBLOCK), 0);
    assert_int_equal(read(done[0], &c, 1), -1);   /* still waiting while the delete holds the lock */
    art_unlock(lk);
    int status;
    assert_int_equal(waitpid(kid, &status, 0), kid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(done[0]);
    store_artifact got;
    assert_int_equal(store_artifact_get(st, b, "r.json", &got), 0);
    assert_true(art_has(as, got.sha256, got.size_bytes));   /* put again: the row points at bytes */
    int fd = art_open_blob(as, got.sha256, got.size_bytes, 1, err, sizeof err);
    assert_true(fd >= 0);
    close(fd);
    /* store_job_remove: the delete and its blobs in one step, under the lock */
    assert_int_equal(store_job_cancel(st, b, &j), 0);
    store_job_clear(&j);
    /* a request does not wait for ever behind a publisher: 3 after wait_s, nothing removed */
    int pub = art_lock(as, 0, -1, err, sizeof err);
    assert_true(pub >= 0);
    assert_int_equal(store_job_remove(st, as, b, 0.2, err, sizeof err), 3);
    assert_non_null(strstr(err, "busy publishing"));
    assert_int_equal(store_artifact_get(st, b, "r.json", &got), 0);
    art_unlock(pub);
    assert_int_equal(store_job_remove(st, as, b, -1, err, sizeof err), 0);
    assert_false(art_has(as, got.sha256, got.size_bytes));
    assert_int_equal(store_job_remove(st, as, b, -1, err, sizeof err), 1);
    art_close(as);
}

static void test_models_and_report(void **state)
{
    store *st = *state;
    store_model m = {0};
    snprintf(m.path, sizeof m.path, "/data/models/x.gguf");
    snprintf(m.format, sizeof m.format, "gguf");
    assert_int_equal(store_model_add(st, &m), 0);
    store_model got;
    assert_int_equal(store_model_get(st, m.id, &got), 0);
    assert_string_equal(got.path, m.path);
    store_model *list;
    int n, more;
    assert_int_equal(store_model_list(st, NULL, 10, &list, &n, &more), 0);
    assert_int_equal(n, 1);
    free(list);

    char id[48];
    mk(st, "rep-dev", id);
    json_t *f1 = json_pack("{s:{s:i},s:s}", "search", "iterations", 3, "method", "x");
    json_t *f2 = json_pack("{s:{s:i}}", "search", "selection_tokens", 99);
    assert_int_equal(store_report_merge(st, id, NULL, f1), 0);
    assert_int_equal(store_report_merge(st, id, NULL, f2), 0);
    json_decref(f1);
    json_decref(f2);
    store_job j;
    assert_int_equal(store_job_get(st, id, &j), 0);
    json_t *s = json_object_get(j.report, "search");
    assert_int_equal(json_integer_value(json_object_get(s, "iterations")), 3);
    assert_int_equal(json_integer_value(json_object_get(s, "selection_tokens")), 99);
    store_job_clear(&j);

    /* a stage run again names what it owns: its members of the run before are gone, even
     * those the new run does not write, and the others' stay */
    json_t *m1 = json_pack("{s:[i],s:{s:{s:i},s:i},s:{s:i}}", "measure_tries", 1, "parent", "measured", "latency_ms",
                           5, "weights", 1, "result", "params", 7);
    const char *const owned[] = {"measure_tries", "parent.measured", "parent.weights", "result.params",
                                 "result.absent.deeper", "nothing", NULL};
    json_t *m2 = json_pack("{s:{s:{s:i}}}", "parent", "measured", "peak_memory_bytes", 9);
    assert_int_equal(store_report_merge(st, id, NULL, m1), 0);
    assert_int_equal(store_report_merge(st, id, owned, m2), 0);
    json_decref(m1);
    json_decref(m2);
    assert_int_equal(store_job_get(st, id, &j), 0);
    assert_null(json_object_get(j.report, "measure_tries"));
    json_t *p = json_object_get(j.report, "parent");
    assert_null(json_object_get(p, "weights"));
    assert_null(json_object_get(json_object_get(p, "measured"), "latency_ms"));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(p, "measured"), "peak_memory_bytes")), 9);
    assert_non_null(json_object_get(j.report, "result"));   /* emptied, not removed */
    assert_null(json_object_get(json_object_get(j.report, "result"), "params"));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j.report, "search"), "iterations")), 3);
    store_job_clear(&j);
}

/* A queued job on hook-dev whose spec has a callback_url, into *j (store_job_clear it). */
static void mk_hooked(store *st, store_job *j)
{
    char err[256];
    memset(j, 0, sizeof *j);
    assert_int_equal(store_new_id("job_", j->id, sizeof j->id), 0);
    snprintf(j->kind, sizeof j->kind, "job");
    snprintf(j->device, sizeof j->device, "hook-dev");
    j->spec = json_pack("{s:s}", "callback_url", "http://127.0.0.1:9/hook");
    j->stages = json_array();
    assert_int_equal(store_job_create(st, j, NULL, NULL, NULL, 0, NULL, err, sizeof err), 0);
}

static void test_webhook_outbox(void **state)
{
    store *st = *state;
    store_job j;
    mk_hooked(st, &j);
    char plain[48];
    mk(st, "hook-dev", plain);
    store_job c;
    assert_int_equal(claim(st, "hook-dev", &c), 0);
    store_job_clear(&c);
    assert_int_equal(claim(st, "hook-dev", &c), 0);
    store_job_clear(&c);
    store_webhook *w;
    int n;
    int64_t now = store_now();
    assert_int_equal(store_webhook_due(st, now + 10, 10, &w, &n), 0);
    assert_int_equal(n, 0); /* nothing terminal yet */
    store_webhook_list_free(w, n);
    assert_int_equal(store_job_finish(st, plain, "succeeded", NULL, NULL), 0); /* no callback_url */
    assert_int_equal(store_job_finish(st, j.id, "failed", "stage_failed", "boom"), 0);
    assert_int_equal(store_webhook_due(st, now + 10, 10, &w, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(w[0].job_id, j.id);
    assert_string_equal(w[0].type, "job.failed");
    assert_string_equal(w[0].url, "http://127.0.0.1:9/hook");
    json_t *p = json_loads(w[0].payload, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(json_object_get(p, "data"), "status")), "failed");
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_object_get(p, "data"), "error"), "code")),
                        "stage_failed");
    json_decref(p);
    char id[48];
    snprintf(id, sizeof id, "%s", w[0].id);
    store_webhook_list_free(w, n);
    /* a failed attempt is retried later, not before */
    assert_int_equal(store_webhook_result(st, id, j.id, 0, 0, now + 100, "HTTP 500"), 0);
    assert_int_equal(store_webhook_due(st, now + 10, 10, &w, &n), 0);
    assert_int_equal(n, 0);
    store_webhook_list_free(w, n);
    assert_int_equal(store_webhook_due(st, now + 100, 10, &w, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(w[0].attempts, 1);
    store_webhook_list_free(w, n);
    assert_int_equal(store_webhook_result(st, id, j.id, 1, 0, 0, NULL), 0);
    assert_int_equal(store_webhook_due(st, now + 1000, 10, &w, &n), 0);
    assert_int_equal(n, 0);
    store_webhook_list_free(w, n);
    store_event *ev;
    int more;
    assert_int_equal(store_event_list(st, j.id, 0, 100, &ev, &n, &more), 0);
    assert_string_equal(ev[n - 1].type, "webhook.delivered");
    store_event_list_free(ev, n);
    /* the outcome of a delivery that was in flight while its job was deleted: no event is
     * left behind for a job that is gone */
    store_job k;
    mk_hooked(st, &k);
    assert_int_equal(store_job_finish(st, k.id, "cancelled", NULL, NULL), 0);
    assert_int_equal(store_webhook_due(st, store_now() + 10, 10, &w, &n), 0);
    assert_int_equal(n, 1);
    snprintf(id, sizeof id, "%s", w[0].id);
    store_webhook_list_free(w, n);
    char **orphans = NULL;
    int n_orphans = 0;
    assert_int_equal(store_job_delete(st, k.id, &orphans, &n_orphans), 0);
    free(orphans);
    assert_int_equal(store_webhook_result(st, id, k.id, 1, 0, 0, NULL), 0);
    assert_int_equal(store_event_list(st, k.id, 0, 100, &ev, &n, &more), 0);
    assert_int_equal(n, 0);
    store_event_list_free(ev, n);
    store_job_clear(&k);
    store_job_clear(&j);
}

static void *writer(void *arg)
{
    store *st = arg;
    for (int i = 0; i < 50; i++) {
        char id[48];
        mk(st, "conc-dev", id);
    }
    return NULL;
}

static void test_concurrent_writers(void **state)
{
    store *st = *state;
    int64_t v0 = store_data_version(st);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, writer, st), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    /* other connections committed: this thread's change counter moved */
    assert_true(store_data_version(st) != v0);
    int64_t v1 = store_data_version(st);
    assert_int_equal(store_data_version(st), v1);
    int64_t counts[5];
    assert_int_equal(store_job_counts(st, counts), 0);
    store_job *jobs;
    int n, more;
    assert_int_equal(store_job_list(st, "job", NULL, 1000, &jobs, &n, &more), 0);
    int conc = 0;
    for (int i = 0; i < n; i++) {
        conc += !strcmp(jobs[i].device, "conc-dev");
        for (int k = i + 1; k < n; k++)
            assert_string_not_equal(jobs[i].id, jobs[k].id);
    }
    assert_int_equal(conc, 200);
    store_job_list_free(jobs, n);
}

/* Registering the same bytes by URL from several API threads (or hosts) at once: one
 * registration, the others find it; none fails. On PostgreSQL every transaction sees no
 * row for the digest, and all but the first insert used to hit the unique index. */
enum { SAME_SHA_THREADS = 8, SAME_SHA_ROUNDS = 5 };
static pthread_barrier_t same_sha_start;
static char same_sha[65];
static int same_sha_rc[SAME_SHA_THREADS];
static char same_sha_id[SAME_SHA_THREADS][48];

static void *register_same(void *arg)
{
    store *st = ((void **)arg)[0];
    int i = (int)(intptr_t)((void **)arg)[1];
    store_model *m = calloc(1, sizeof *m);
    if (!m) {
        same_sha_rc[i] = -2;
        return NULL;
    }
    snprintf(m->url, sizeof m->url, "https://models.example/m%d.gguf", i);
    snprintf(m->sha256, sizeof m->sha256, "%s", same_sha);
    snprintf(m->format, sizeof m->format, "gguf");
    snprintf(m->path, sizeof m->path, "/data/models/%s/m%d.gguf", same_sha, i);
    m->size_bytes = -1;
    int restarted = 0;
    pthread_barrier_wait(&same_sha_start);
    same_sha_rc[i] = store_model_add_fetch(st, m, &restarted);
    snprintf(same_sha_id[i], sizeof same_sha_id[i], "%s", m->id);
    free(m);
    return NULL;
}

static void test_models_same_sha_at_once(void **state)
{
    store *st = *state;
    for (int round = 0; round < SAME_SHA_ROUNDS; round++) {
        char id[48];
        assert_int_equal(store_new_id("", id, sizeof id), 0);
        snprintf(same_sha, sizeof same_sha, "%.24s%040d", id, round);
        pthread_t t[SAME_SHA_THREADS];
        void *args[SAME_SHA_THREADS][2];
        assert_int_equal(pthread_barrier_init(&same_sha_start, NULL, SAME_SHA_THREADS), 0);
        for (int i = 0; i < SAME_SHA_THREADS; i++) {
            args[i][0] = st;
            args[i][1] = (void *)(intptr_t)i;
            assert_int_equal(pthread_create(&t[i], NULL, register_same, args[i]), 0);
        }
        for (int i = 0; i < SAME_SHA_THREADS; i++)
            pthread_join(t[i], NULL);
        pthread_barrier_destroy(&same_sha_start);
        int inserted = 0;
        for (int i = 0; i < SAME_SHA_THREADS; i++) {
            if (same_sha_rc[i] != 0 && same_sha_rc[i] != 1)
                fail_msg("round %d: registration %d returned %d", round, i, same_sha_rc[i]);
            inserted += same_sha_rc[i] == 0;
            assert_string_equal(same_sha_id[i], same_sha_id[0]);
        }
        assert_int_equal(inserted, 1);
    }
}

/* Leases: a runner's recovery leaves other runners' jobs alone; a renewed lease holds; a
 * lease that ran out is rescued by anyone (requeued, the start counted), then claimed by
 * another runner; when the starts are spent it fails as lease_expired. */
static void test_leases(void **state)
{
    store *st = *state;
    char id[48];
    mk(st, "lease-dev", id);
    store_job j;
    assert_int_equal(claim_as(st, "lease-dev", "host-a", 1, &j), 0);
    assert_string_equal(j.lease_owner, "host-a");
    assert_true(j.lease_expires_at >= j.started_at + 1);
    store_job_clear(&j);
    assert_int_equal(store_recover(st, "host-b", 3), 0);      /* not B's job */
    assert_int_equal(store_lease_rescue(st, 3, "host-b"), 0); /* not expired yet */
    assert_int_equal(store_lease_renew(st, "host-a", 1), 1);  /* A holds one job */
    assert_int_equal(store_lease_renew(st, "host-b", 1), 0);
    char status[16], owner[256];
    int cancel = -1, attempts = 0;
    assert_int_equal(store_job_runner(st, id, status, owner, &cancel, &attempts), 0);
    assert_string_equal(status, "running");
    assert_string_equal(owner, "host-a");
    assert_int_equal(cancel, 0);
    assert_int_equal(attempts, 1);
    sleep(3);                                                  /* A died: its lease runs out */
    /* A itself, back from a store outage longer than the lease, does not take its own
     * running job for a dead runner's: its worker is alive and in its hands */
    assert_int_equal(store_lease_rescue(st, 2, "host-a"), 0);
    assert_int_equal(store_job_runner(st, id, status, owner, &cancel, &attempts), 0);
    assert_string_equal(status, "running");
    assert_int_equal(store_lease_rescue(st, 2, "host-b"), 1);
    assert_int_equal(store_job_get(st, id, &j), 0);
    assert_string_equal(j.status, "queued");
    assert_string_equal(j.lease_owner, "");
    store_job_clear(&j);
    assert_int_equal(claim_as(st, "lease-dev", "host-b", 1, &j), 0);
    assert_string_equal(j.lease_owner, "host-b");
    assert_int_equal(j.attempts, 2);
    store_job_clear(&j);
    sleep(3);
    assert_int_equal(store_lease_rescue(st, 2, "host-a"), 1); /* 2 of 2 starts: failed */
    assert_int_equal(store_job_get(st, id, &j), 0);
    assert_string_equal(j.status, "failed");
    assert_string_equal(j.error_code, "lease_expired");
    store_job_clear(&j);
    store_event *ev;
    int n, more;
    assert_int_equal(store_event_list(st, id, 0, 100, &ev, &n, &more), 0);
    int requeued = 0;
    for (int i = 0; i < n; i++)
        requeued += !strcmp(ev[i].type, "job.requeued") && strstr(ev[i].message, "lease") != NULL;
    assert_int_equal(requeued, 1);
    store_event_list_free(ev, n);
}

/* A rescue reads the expired leases, then settles each job in a transaction of its own.
 * A runner that renews its lease in between keeps its job: here job b's runner renews
 * while the rescuer settles job a (a trigger on a's requeue event). SQLite only: the
 * trigger is SQLite's. */
static void test_rescue_spares_renewed(void **state)
{
    store *st = *state;
    if (!strncmp(dbpath, "postgres", 8))
        skip();
    char a[48], b[48];
    mk(st, "renew-dev", a);
    mk(st, "renew-dev", b);
    store_job j;
    assert_int_equal(claim_as(st, "renew-dev", "host-a", 1, &j), 0);
    assert_string_equal(j.id, a);
    store_job_clear(&j);
    assert_int_equal(claim_as(st, "renew-dev", "host-a", 1, &j), 0);
    assert_string_equal(j.id, b);
    store_job_clear(&j);
    sleep(2);   /* both leases ran out */
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(dbpath, &h), SQLITE_OK);
    sqlite3_busy_timeout(h, 10000);
    char sql[512];
    snprintf(sql, sizeof sql, "CREATE TRIGGER renew_b AFTER INSERT ON events WHEN NEW.job_id='%s' "
             "AND NEW.type='job.requeued' BEGIN UPDATE jobs SET lease_expires_at=lease_expires_at+3600 "
             "WHERE id='%s'; END", a, b);
    assert_int_equal(sqlite3_exec(h, sql, NULL, NULL, NULL), SQLITE_OK);
    int n = store_lease_rescue(st, 3, "host-b");
    assert_int_equal(sqlite3_exec(h, "DROP TRIGGER renew_b", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_close(h), SQLITE_OK);
    assert_true(n >= 1);
    assert_int_equal(store_job_get(st, a, &j), 0);
    assert_string_equal(j.status, "queued");
    store_job_clear(&j);
    assert_int_equal(store_job_get(st, b, &j), 0);
    assert_string_equal(j.status, "running");
    assert_string_equal(j.lease_owner, "host-a");
    assert_int_equal(j.attempts, 1);
    store_job_clear(&j);
}

/* The runners registry: a beat writes or refreshes a runner's row; the list holds the
 * runners seen after a moment, by name; a runner that stops is gone from it. */
/* Fencing: a handle fenced to attempt 1 of a job writes it while it runs at attempt 1;
 * once the job is requeued and claimed again (attempt 2), none of its writes land —
 * stage begin and done, progress, report, events, artifacts, requeue, finish — and the
 * job's version does not move. Another job on the same handle is not fenced. */
static void test_fence(void **state)
{
    store *st = *state;
    char err[256] = "", id[48], free_id[48];
    mk(st, "fence-dev", id);
    mk(st, "fence-free", free_id);
    store_job j;
    assert_int_equal(claim_as(st, "fence-dev", "host-a", 30, &j), 0);
    assert_int_equal(j.attempts, 1);
    store_job_clear(&j);
    store *w = store_open(dbpath, err, sizeof err);
    assert_non_null(w);
    store_fence_job(w, id, 1);
    assert_int_equal(store_job_watch(w, id), 0);
    assert_int_equal(store_job_stage_begin(w, id, 0, "a"), 0);
    assert_int_equal(store_job_progress(w, id, 1, 2), 0);
    assert_int_equal(store_event_append(w, id, "test.mine", "attempt 1", NULL), 0);

    assert_int_equal(store_job_requeue(st, id, "lease ran out"), 0);
    assert_int_equal(store_job_watch(w, id), STORE_FENCED);
    assert_int_equal(claim_as(st, "fence-dev", "host-b", 30, &j), 0);
    assert_int_equal(j.attempts, 2);
    int64_t version = j.version;
    store_job_clear(&j);
    assert_int_equal(store_job_watch(w, id), STORE_FENCED);
    assert_int_equal(store_job_stage_begin(w, id, 0, "a"), STORE_FENCED);
    assert_int_equal(store_job_progress(w, id, 2, 2), STORE_FENCED);
    assert_int_equal(store_job_stage_done(w, id, 0, "a", 1.0), STORE_FENCED);
    json_t *frag = json_pack("{s:b}", "stale", 1);
    assert_int_equal(store_report_merge(w, id, NULL, frag), STORE_FENCED);
    json_decref(frag);
    assert_int_equal(store_event_append(w, id, "test.stale", "attempt 1", NULL), STORE_FENCED);
    store_artifact a;
    memset(&a, 0, sizeof a);
    snprintf(a.job_id, sizeof a.job_id, "%s", id);
    snprintf(a.name, sizeof a.name, "stale.bin");
    snprintf(a.sha256, sizeof a.sha256, "%064d", 0);
    assert_int_equal(store_artifact_add(w, &a), STORE_FENCED);
    assert_int_equal(store_job_requeue(w, id, "stale"), STORE_FENCED);
    assert_int_equal(store_job_finish(w, id, "succeeded", NULL, NULL), STORE_FENCED);
    assert_int_equal(store_job_get(st, id, &j), 0);
    assert_string_equal(j.status, "running");
    assert_string_equal(j.lease_owner, "host-b");
    assert_int_equal(j.stage_index, 0);
    assert_true(j.version == version);
    assert_null(json_object_get(j.report, "stale"));
    store_job_clear(&j);

    /* the fence is on one job: the handle's writes to others land */
    assert_int_equal(claim_as(st, "fence-free", "host-a", 30, &j), 0);
    store_job_clear(&j);
    assert_int_equal(store_job_progress(w, free_id, 1, 1), 0);
    assert_int_equal(store_job_finish(w, free_id, "succeeded", NULL, NULL), 0);
    store_close(w);
    assert_int_equal(store_job_finish(st, id, "cancelled", NULL, NULL), 0);
}

static void test_runners(void **state)
{
    store *st = *state;
    assert_int_equal(store_runner_beat(st, "worker/b/x", "{\"devices\":[{\"id\":\"cuda:0\"}]}"), 0);
    assert_int_equal(store_runner_beat(st, "worker/a/x", "{\"devices\":[],\"engines\":[\"autocompress\"]}"), 0);
    assert_int_equal(store_runner_beat(st, "worker/b/x", "{\"devices\":[{\"id\":\"cuda:1\"}]}"), 0);
    json_t *r = store_runners(st, store_now() - 5);
    assert_non_null(r);
    assert_int_equal(json_array_size(r), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(r, 0), "name")), "worker/a/x");
    json_t *dev = json_array_get(json_object_get(json_object_get(json_array_get(r, 1), "info"), "devices"), 0);
    assert_string_equal(json_string_value(json_object_get(dev, "id")), "cuda:1");   /* the latest beat */
    json_decref(r);
    r = store_runners(st, store_now() + 5);   /* none seen after the future */
    assert_int_equal(json_array_size(r), 0);
    json_decref(r);
    assert_int_equal(store_runner_gone(st, "worker/a/x"), 0);
    r = store_runners(st, 0);
    assert_int_equal(json_array_size(r), 1);
    json_decref(r);
}

/* A llama.cpp-target job goes only to a runner that has llama.cpp. */
static void test_claim_engine(void **state)
{
    store *st = *state;
    char id[48];
    mk_engine(st, "engine-dev", "llama.cpp", id);
    store_job j;
    assert_int_equal(store_job_get(st, id, &j), 0);
    assert_string_equal(j.engine, "llama.cpp");
    store_job_clear(&j);
    store_claim without = {"engine-dev", 0, "r", 30}, with = {"engine-dev", 1, "r", 30};
    assert_int_equal(store_job_claim(st, &without, &j), 1);
    assert_int_equal(store_job_claim(st, &with, &j), 0);
    assert_string_equal(j.id, id);
    store_job_clear(&j);
}

/* Claims from many threads (connections) at once: every job is claimed exactly once. */
#define CLAIM_JOBS 60
static char claim_ids[CLAIM_JOBS][48];
static int claimed_by[CLAIM_JOBS];

static void *claimer(void *st)
{
    store_job j;
    while (claim_as(st, "claim-dev", "racer", 30, &j) == 0) {
        for (int i = 0; i < CLAIM_JOBS; i++)
            if (!strcmp(claim_ids[i], j.id))
                __atomic_add_fetch(&claimed_by[i], 1, __ATOMIC_SEQ_CST);
        store_job_clear(&j);
    }
    return NULL;
}

static void test_concurrent_claims(void **state)
{
    store *st = *state;
    for (int i = 0; i < CLAIM_JOBS; i++)
        mk(st, "claim-dev", claim_ids[i]);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, claimer, st), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < CLAIM_JOBS; i++)
        assert_int_equal(claimed_by[i], 1);
}

/* ---- PostgreSQL over TCP ---------------------------------------------------------------
 * The test database listens on a Unix socket only; a small proxy gives it a TCP port on
 * the loopback, so the store's connection is the TCP one a fleet uses. */
typedef struct {
    int lfd, port;
    char unix_path[sizeof ((struct sockaddr_un *)0)->sun_path];
    pthread_t th;
} tcp_proxy;

static void *proxy_pump(void *arg)
{
    int *fds = arg;   /* {tcp, unix} */
    struct pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    char buf[8192];
    for (;;) {
        if (poll(p, 2, -1) < 0)
            break;
        int from = (p[0].revents & (POLLIN | POLLHUP | POLLERR)) ? 0 : (p[1].revents ? 1 : -1);
        if (from < 0)
            continue;
        ssize_t n = read(fds[from], buf, sizeof buf);
        if (n <= 0 || write(fds[1 - from], buf, (size_t)n) != n)
            break;
    }
    close(fds[0]);
    close(fds[1]);
    free(fds);
    return NULL;
}

static void *proxy_main(void *arg)
{
    tcp_proxy *px = arg;
    for (;;) {
        int c = accept(px->lfd, NULL, NULL);
        if (c < 0)
            return NULL;   /* the listening socket was shut down */
        int u = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un ua = {.sun_family = AF_UNIX};
        snprintf(ua.sun_path, sizeof ua.sun_path, "%s", px->unix_path);
        int *fds = malloc(2 * sizeof *fds);
        pthread_t t;
        if (u < 0 || !fds || connect(u, (struct sockaddr *)&ua, sizeof ua) < 0) {
            close(c);
            if (u >= 0)
                close(u);
            free(fds);
            continue;
        }
        fds[0] = c;
        fds[1] = u;
        if (pthread_create(&t, NULL, proxy_pump, fds) == 0)
            pthread_detach(t);
    }
}

/* The store's TCP connections carry keepalive probes and a user timeout, so that a
 * database host that drops off the network fails a call in about 30 s rather than two
 * hours (libpq's own defaults leave the system's, a 2-hour idle time). PostgreSQL only. */
static void test_pg_tcp_keepalive(void **state)
{
    (void)state;
    const char *uri = getenv("AC_TEST_STORE");
    const char *host = uri ? strstr(uri, "host=") : NULL;
    if (!uri || strncmp(uri, "postgresql:///", 14) || !host || host[5] != '/')
        skip();
    char db[256], sockdir[96];
    snprintf(db, sizeof db, "%.*s", (int)strcspn(uri + 14, "?"), uri + 14);
    snprintf(sockdir, sizeof sockdir, "%.*s", (int)strcspn(host + 5, "&"), host + 5);
    tcp_proxy px;
    memset(&px, 0, sizeof px);
    assert_true(snprintf(px.unix_path, sizeof px.unix_path, "%s/.s.PGSQL.5432", sockdir) < (int)sizeof px.unix_path);
    px.lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(px.lfd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(px.lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(px.lfd, 8), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(px.lfd, (struct sockaddr *)&a, &al), 0);
    px.port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&px.th, NULL, proxy_main, &px), 0);

    char tcp_uri[512], err[512];
    snprintf(tcp_uri, sizeof tcp_uri, "postgresql://postgres@127.0.0.1:%d/%s", px.port, db);
    store *st = store_open(tcp_uri, err, sizeof err);
    if (!st)
        fail_msg("store_open over TCP: %s", err);
    int64_t counts[5];
    assert_int_equal(store_job_counts(st, counts), 0);
    int found = 0;
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        int fd = atoi(e->d_name);
        struct sockaddr_in peer;
        socklen_t pl = sizeof peer;
        if (e->d_name[0] == '.' || getpeername(fd, (struct sockaddr *)&peer, &pl) < 0 ||
            peer.sin_family != AF_INET || ntohs(peer.sin_port) != px.port)
            continue;
        int on = 0, idle = 0, intvl = 0, cnt = 0;
        unsigned user_timeout = 0;
        socklen_t l = sizeof on;
        assert_int_equal(getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, &l), 0);
        l = sizeof idle;
        assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &l), 0);
        l = sizeof intvl;
        assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, &l), 0);
        l = sizeof cnt;
        assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, &l), 0);
        l = sizeof user_timeout;
        assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, &l), 0);
        assert_int_equal(on, 1);
        assert_int_equal(idle, 10);
        assert_int_equal(intvl, 5);
        assert_int_equal(cnt, 3);
        assert_int_equal(user_timeout, 30000);
        found++;
    }
    closedir(d);
    assert_true(found >= 1);
    store_close(st);
    shutdown(px.lfd, SHUT_RDWR);
    pthread_join(px.th, NULL);
    close(px.lfd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_migrations),
        cmocka_unit_test(test_ids),
        cmocka_unit_test(test_recover_counts_attempts),
        cmocka_unit_test(test_lifecycle),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_idempotency),
        cmocka_unit_test(test_pagination),
        cmocka_unit_test(test_artifacts_and_delete),
        cmocka_unit_test(test_publish_beside_delete),
        cmocka_unit_test(test_models_and_report),
        cmocka_unit_test(test_webhook_outbox),
        cmocka_unit_test(test_concurrent_writers),
        cmocka_unit_test(test_models_same_sha_at_once),
        cmocka_unit_test(test_leases),
        cmocka_unit_test(test_rescue_spares_renewed),
        cmocka_unit_test(test_fence),
        cmocka_unit_test(test_claim_engine),
        cmocka_unit_test(test_runners),
        cmocka_unit_test(test_concurrent_claims),
        cmocka_unit_test(test_pg_tcp_keepalive),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
