/* storage/store_jobs.c — jobs and calibrations (see store.h): every state change one
 * transaction with its event, so a job is always in exactly one durable state. A
 * terminal state also queues the webhook (store_outbox.c); a restart requeues what was
 * running (store_recover).
 */
#include "storage/store_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/utf8.h"

#define JOB_COLS                                                                             \
    "seq, id, kind, status, device, name, spec, stages, stage_index, stage, step, total_steps, " \
    "error_code, error_message, report, cancel_requested, worker_pid, attempts, version, "     \
    "created_at, started_at, finished_at, updated_at, engine, lease_owner, lease_expires_at"

static void job_from_row(sql_stmt *s, void *out)
{
    store_job *j = out;
    memset(j, 0, sizeof *j);
    sql_cols(s, "ItttttjjitIIttjiiiIIIIIttI", &j->seq, j->id, sizeof j->id, j->kind, sizeof j->kind, j->status,
             sizeof j->status, j->device, sizeof j->device, j->name, sizeof j->name, &j->spec, &j->stages,
             &j->stage_index, j->stage, sizeof j->stage, &j->step, &j->total_steps, j->error_code,
             sizeof j->error_code, j->error_message, sizeof j->error_message, &j->report, &j->cancel_requested,
             &j->worker_pid, &j->attempts, &j->version, &j->created_at, &j->started_at, &j->finished_at,
             &j->updated_at, j->engine, sizeof j->engine, j->lease_owner, sizeof j->lease_owner,
             &j->lease_expires_at);
    if (!j->spec)
        j->spec = json_object();
    if (!j->stages)
        j->stages = json_array();
    if (!j->report)
        j->report = json_object();
}

static void job_clear_elem(void *j)
{
    store_job_clear(j);
}

static int job_get_conn(store_conn *c, const char *id, store_job *out)
{
    static const char *sql = "SELECT " JOB_COLS " FROM jobs WHERE id=?";
    return sql_row(c, sql, "t", "r", id, job_from_row, out);
}

/* End the current write transaction with job id read into out (as store_job_get does).
 * 0 (out filled; store_job_clear it) or -1 (rolled back; out holds nothing). */
static int commit_job(store_conn *c, const char *id, store_job *out)
{
    if (job_get_conn(c, id, out) != 0)
        return sql_abandon(c, -1);
    if (sql_commit(c) < 0) {
        store_job_clear(out);
        return sql_abandon(c, -1);
    }
    return 0;
}

int store_job_get(store *st, const char *id, store_job *out)
{
    store_conn *c = store_conn_get(st);
    return c ? job_get_conn(c, id, out) : -1;
}

int store_job_version(store *st, const char *id, int64_t *version, char status[16])
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *sql = "SELECT version, status FROM jobs WHERE id=?";
    return sql_row(c, sql, "t", "It", id, version, status, (size_t)16);
}

int store_job_create(store *st, store_job *j, const char *idem_scope, const char *idem_key,
                     const char *body_sha256, int resp_status, const char *resp_text,
                     char *err, size_t errlen)
{
    store_conn *c = store_conn_get(st);
    if (!c) {
        snprintf(err, errlen, "database unavailable");
        return -1;
    }
    char *spec = json_dumps(j->spec, JSON_COMPACT | JSON_SORT_KEYS);
    char *stages = json_dumps(j->stages, JSON_COMPACT);
    if (!spec || !stages) {
        free(spec);
        free(stages);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int ret = -1;
    if (sql_begin(c) < 0) {
        snprintf(err, errlen, "database busy");
        goto out;
    }
    if (idem_key) {
        int rc = store_idem_insert(c, idem_scope, idem_key, body_sha256, j->id, resp_status, resp_text);
        if (rc < 0)
            goto fail;
        if (rc == 1) {
            sql_rollback(c);
            ret = 1;
            goto out;
        }
    }
    int64_t now = j->created_at ? j->created_at : store_now();
    if (!j->engine[0]) {   /* the target's engine decides which runners may claim it */
        const char *e = json_string_value(json_object_get(json_object_get(j->spec, "target"), "engine"));
        snprintf(j->engine, sizeof j->engine, "%s", e ? e : "autocompress");
    }
    static const char *ins = "INSERT INTO jobs(id, kind, status, device, name, spec, stages, created_at, updated_at, "
                             "engine) VALUES (?,?,'queued',?,?,?,?,?,?,?) RETURNING seq";
    if (sql_row(c, ins, "ttttttIIt", "I", j->id, j->kind, j->device, j->name, spec, stages, now, now, j->engine,
                &j->seq) != 0)
        goto fail;
    if (store_event_insert(c, j->id, "job.created", "job queued", NULL) < 0 || sql_commit(c) < 0)
        goto fail;
    snprintf(j->status, sizeof j->status, "queued");
    j->created_at = j->updated_at = now;
    j->version = 1;
    ret = 0;
    goto out;
fail:
    snprintf(err, errlen, "database write failed: %s", sql_errmsg(c));
    sql_rollback(c);
out:
    free(spec);
    free(stages);
    return ret;
}

int store_job_list(store *st, const char *kind, const char *after, int limit,
                   store_job **out, int *n, int *has_more)
{
    *out = NULL;
    *n = 0;
    *has_more = 0;
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    int64_t after_seq = INT64_MAX;
    if (after) {
        static const char *q = "SELECT seq FROM jobs WHERE id=? AND kind=?";
        int rc = sql_row(c, q, "tt", "I", after, kind, &after_seq);
        if (rc != 0)
            return rc;
    }
    static const char *sql = "SELECT " JOB_COLS " FROM jobs WHERE kind=? AND seq<? ORDER BY seq DESC LIMIT ?";
    sql_stmt *s = sql_query(c, sql, "tIi", kind, after_seq, limit + 1);
    if (!s)
        return -1;
    *out = sql_rows(s, limit, sizeof **out, job_from_row, job_clear_elem, n, has_more);
    return *out ? 0 : -1;
}

void store_job_list_free(store_job *jobs, int n)
{
    for (int i = 0; i < n; i++)
        store_job_clear(&jobs[i]);
    free(jobs);
}

int store_job_claim(store *st, const store_claim *cl, store_job *out)
{
    store_conn *c = store_conn_get(st);
    if (!c || sql_begin(c) < 0)
        return -1;
    /* PostgreSQL: a job another runner is claiming right now is skipped, not waited for */
    static const char *q = "SELECT id FROM jobs WHERE status='queued' AND device=? AND (engine='autocompress' OR ?=1) "
                           "ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED";
    char id[48] = "";
    int rc = sql_row(c, q, "ti", "t", cl->device, cl->has_llamacpp ? 1 : 0, id, sizeof id);
    if (rc != 0)
        return sql_abandon(c, rc);
    int64_t now = store_now();
    static const char *u = "UPDATE jobs SET status='running', attempts=attempts+1, worker_pid=0, "
                           "started_at=CASE WHEN started_at=0 THEN ? ELSE started_at END, lease_owner=?, "
                           "lease_expires_at=?, version=version+1, updated_at=? WHERE id=?";
    char msg[300];
    snprintf(msg, sizeof msg, "worker starting on %s", cl->owner);
    if (sql_run(c, u, "ItIIt", now, cl->owner, now + cl->lease_s, now, id) < 0 ||
        store_event_insert(c, id, "job.started", msg, json_pack("{s:s}", "runner", cl->owner)) < 0)
        return sql_abandon(c, -1);
    return commit_job(c, id, out);
}

int store_lease_renew(store *st, const char *owner, int lease_s)
{
    store_conn *c = store_conn_get(st);
    static const char *u = "UPDATE jobs SET lease_expires_at=? WHERE lease_owner=? AND status='running'";
    return c ? sql_run(c, u, "It", store_now() + lease_s, owner) : -1;
}

int store_job_set_pid(store *st, const char *id, int pid)
{
    store_conn *c = store_conn_get(st);
    static const char *sql = "UPDATE jobs SET worker_pid=?, updated_at=? WHERE id=?";
    return c && sql_run(c, sql, "iIt", pid, store_now(), id) >= 0 ? 0 : -1;
}

int store_job_progress(store *st, const char *id, int64_t step, int64_t total)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    int attempt = store_fence_attempt(c, id);
    if (!attempt) {
        static const char *sql = "UPDATE jobs SET step=?, total_steps=?, version=version+1, updated_at=? WHERE id=?";
        return sql_run(c, sql, "IIIt", step, total, store_now(), id) >= 0 ? 0 : -1;
    }
    static const char *fenced = "UPDATE jobs SET step=?, total_steps=?, version=version+1, updated_at=? "
                                "WHERE id=? AND status='running' AND attempts=?";
    int changed = sql_run(c, fenced, "IIIti", step, total, store_now(), id, attempt);
    return changed < 0 ? -1 : changed == 0 ? STORE_FENCED : 0;
}

int store_fence_check(store_conn *c, const char *id, int attempt)
{
    if (attempt <= 0)
        return 0;
    static const char *q = "SELECT status, attempts FROM jobs WHERE id=? FOR UPDATE";
    char status[16] = "";
    int at = 0;
    int rc = sql_row(c, q, "t", "ti", id, status, sizeof status, &at);
    if (rc < 0)
        return -1;
    return rc == 0 && !strcmp(status, "running") && at == attempt ? 0 : STORE_FENCED;
}

int store_begin_fenced(store *st, const char *id, store_conn **c)
{
    *c = store_conn_get(st);
    if (!*c || sql_begin(*c) < 0)
        return -1;
    int fence = store_fence_check(*c, id, store_fence_attempt(*c, id));
    return fence != 0 ? sql_abandon(*c, fence) : 0;
}

int store_job_watch(store *st, const char *id)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    int attempt = store_fence_attempt(c, id);
    static const char *q = "SELECT cancel_requested, status, attempts FROM jobs WHERE id=?";
    char status[16] = "";
    int cancel = 0, at = 0;
    int rc = sql_row(c, q, "t", "iti", id, &cancel, status, sizeof status, &at);
    if (rc < 0)
        return -1;
    if (rc == 0 && cancel)
        return 1;
    if (attempt && (rc != 0 || strcmp(status, "running") || at != attempt))
        return STORE_FENCED;   /* gone, finished or taken over */
    return 0;
}

int store_job_stage_begin(store *st, const char *id, int index, const char *name)
{
    store_conn *c;
    int fence = store_begin_fenced(st, id, &c);
    if (fence != 0)
        return fence;
    static const char *sql = "UPDATE jobs SET stage=?, step=0, total_steps=0, version=version+1, "
                             "updated_at=? WHERE id=? AND stage_index=?";
    if (sql_run(c, sql, "tIti", name, store_now(), id, index) < 0)
        return sql_abandon(c, -1);
    char msg[128];
    snprintf(msg, sizeof msg, "stage %s started", name);
    json_t *d = json_pack("{s:s,s:i}", "stage", name, "index", index);
    if (store_event_insert(c, id, "stage.started", msg, d) < 0 || sql_commit(c) < 0)
        return sql_abandon(c, -1);
    return 0;
}

/* Delete the member at dotted path p ("parent.measured") of object r, if it is there. */
static void report_clear(json_t *r, const char *p)
{
    char key[128];
    for (;;) {
        const char *dot = strchr(p, '.');
        if (!dot) {
            json_object_del(r, p);
            return;
        }
        snprintf(key, sizeof key, "%.*s", (int)(dot - p) < (int)sizeof key ? (int)(dot - p) : 0, p);
        r = json_object_get(r, key);
        if (!json_is_object(r))
            return;
        p = dot + 1;
    }
}

/* Inside the current transaction: the report's list of finished stages keeps its first n
 * entries (one a stage, in order): the stages after run again, and are listed again as
 * they finish. */
static int report_keep_stages(store_conn *c, const char *id, int n)
{
    static const char *q = "SELECT report FROM jobs WHERE id=? FOR UPDATE";
    json_t *r = NULL;
    if (sql_row(c, q, "t", "j", id, &r) != 0)
        return -1;
    json_t *stages = json_object_get(r, "stages");
    int rc = 0;
    if (json_is_array(stages) && json_array_size(stages) > (size_t)n) {
        while (json_array_size(stages) > (size_t)n)
            json_array_remove(stages, json_array_size(stages) - 1);
        char *text = json_dumps(r, JSON_COMPACT | JSON_SORT_KEYS);
        static const char *u = "UPDATE jobs SET report=? WHERE id=?";
        rc = text && sql_run(c, u, "tt", text, id) >= 0 ? 0 : -1;
        free(text);
    }
    json_decref(r);
    return rc;
}

int store_job_rewind(store *st, const char *id, int index)
{
    store_conn *c;
    int fence = store_begin_fenced(st, id, &c);
    if (fence != 0)
        return fence;
    static const char *u = "UPDATE jobs SET stage_index=?, version=version+1, updated_at=? WHERE id=? AND stage_index>?";
    int changed = sql_run(c, u, "iIti", index, store_now(), id, index);
    if (changed < 0 || (changed > 0 && report_keep_stages(c, id, index) < 0) || sql_commit(c) < 0)
        return sql_abandon(c, -1);
    return 0;
}

/* Read, modify and write the report inside the current transaction: the paths of clear
 * (NULL-terminated, or NULL) deleted, then fragment merged. */
static int report_update(store_conn *c, const char *id, const char *const *clear, json_t *fragment,
                         const char *append_stage, double wall_s, int attempt)
{
    static const char *q = "SELECT report FROM jobs WHERE id=? FOR UPDATE";
    json_t *r = NULL;
    if (sql_row(c, q, "t", "j", id, &r) != 0)
        return -1;
    if (!json_is_object(r)) {
        json_decref(r);
        r = json_object();
    }
    for (int i = 0; clear && clear[i]; i++)
        report_clear(r, clear[i]);
    if (fragment && json_object_update_recursive(r, fragment) < 0) {
        json_decref(r);
        return -1;
    }
    if (append_stage) {
        json_t *stages = json_object_get(r, "stages");
        if (!json_is_array(stages)) {
            stages = json_array();
            json_object_set_new(r, "stages", stages);
        }
        json_array_append_new(stages, json_pack("{s:s,s:f,s:i}", "name", append_stage, "wall_s",
                                                wall_s, "attempt", attempt));
    }
    char *text = json_dumps(r, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(r);
    if (!text)
        return -1;
    static const char *u = "UPDATE jobs SET report=?, version=version+1, updated_at=? WHERE id=?";
    int rc = sql_run(c, u, "tIt", text, store_now(), id);
    free(text);
    return rc < 0 ? -1 : 0;
}

int store_job_stage_done(store *st, const char *id, int index, const char *name, double wall_s)
{
    store_conn *c;
    int fence = store_begin_fenced(st, id, &c);
    if (fence != 0)
        return fence;
    static const char *sql = "UPDATE jobs SET stage_index=?, version=version+1, updated_at=? "
                             "WHERE id=? AND stage_index=?";
    int changed = sql_run(c, sql, "iIti", index + 1, store_now(), id, index);
    if (changed < 0)
        return sql_abandon(c, -1);
    if (changed == 0) /* already recorded (or not this stage): no-op */
        return sql_abandon(c, 0);
    static const char *qa = "SELECT attempts FROM jobs WHERE id=?";
    int attempt = 0;
    if (sql_row(c, qa, "t", "i", id, &attempt) < 0 || report_update(c, id, NULL, NULL, name, wall_s, attempt) < 0)
        return sql_abandon(c, -1);
    char msg[128];
    snprintf(msg, sizeof msg, "stage %s completed in %.3f s", name, wall_s);
    json_t *d = json_pack("{s:s,s:i,s:f}", "stage", name, "index", index, "wall_s", wall_s);
    if (store_event_insert(c, id, "stage.completed", msg, d) < 0 || sql_commit(c) < 0)
        return sql_abandon(c, -1);
    return 0;
}

static int is_terminal(const char *status)
{
    return !strcmp(status, "succeeded") || !strcmp(status, "failed") || !strcmp(status, "cancelled");
}

/* Begin a write transaction on this thread's connection (*c) and read job id's status.
 * 0 inside the transaction; 1 when there is no such job, -1 on error, both with nothing
 * left open. */
static int begin_with_status(store *st, const char *id, store_conn **c, char status[16])
{
    *c = store_conn_get(st);
    if (!*c || sql_begin(*c) < 0)
        return -1;
    static const char *q = "SELECT status FROM jobs WHERE id=? FOR UPDATE";
    int rc = sql_row(*c, q, "t", "t", id, status, (size_t)16);
    return rc != 0 ? sql_abandon(*c, rc) : 0;
}

/* Inside a transaction holding job id's row: 1 when its lease has not run out (a lease
 * rescue read it expired, and its runner renewed it since), 0 when it has, -1 on error. */
static int lease_renewed(store_conn *c, const char *id)
{
    static const char *q = "SELECT lease_expires_at FROM jobs WHERE id=?";
    int64_t expires = 0;
    int rc = sql_row(c, q, "t", "I", id, &expires);
    if (rc < 0)
        return -1;
    return rc == 0 && (expires <= 0 || expires >= store_now());
}

/* finish_job of a message that is valid UTF-8. */
static int finish_valid(store *st, const char *id, int attempt, int rescue, const char *status, const char *code,
                        const char *message)
{
    store_conn *c;
    char cur[16] = "";
    if (begin_with_status(st, id, &c, cur) != 0)
        return -1;
    int fence = store_fence_check(c, id, attempt);
    if (fence != 0)
        return sql_abandon(c, fence);
    if (is_terminal(cur))
        return sql_abandon(c, 1);
    int renewed = rescue ? lease_renewed(c, id) : 0;
    if (renewed != 0)
        return sql_abandon(c, renewed);
    int64_t now = store_now();
    static const char *u = "UPDATE jobs SET status=?, error_code=?, error_message=?, worker_pid=0, lease_owner='', "
                           "lease_expires_at=0, finished_at=?, version=version+1, updated_at=? WHERE id=?";
    if (sql_run(c, u, "tttIIt", status, code, message, now, now, id) < 0)
        return sql_abandon(c, -1);
    char type[48];
    snprintf(type, sizeof type, "job.%s", status);
    if (store_webhook_enqueue(c, id, type, status, code, message, now) < 0)
        return sql_abandon(c, -1);
    json_t *d = code ? json_pack("{s:s,s:s}", "code", code, "message", message ? message : "") : NULL;
    char whole[4600], msg[1200];
    snprintf(whole, sizeof whole, "job %s%s%s", status, message ? ": " : "", message ? message : "");
    utf8_cut(msg, sizeof msg, whole);
    if (store_event_insert(c, id, type, msg, d) < 0 || sql_commit(c) < 0)
        return sql_abandon(c, -1);
    return 0;
}

/* store_job_finish_at; for a lease rescue (`rescue`), only while the lease is still out. A
 * message that is not valid UTF-8 (cut at a byte limit inside a character) is mended first:
 * the webhook's payload and the event's data are JSON, which would refuse it. */
static int finish_job(store *st, const char *id, int attempt, int rescue, const char *status, const char *code,
                      const char *message)
{
    if (!message || utf8_valid(message))
        return finish_valid(st, id, attempt, rescue, status, code, message);
    char *mended = utf8_mended(message, "\xef\xbf\xbd");
    int rc = mended ? finish_valid(st, id, attempt, rescue, status, code, mended) : -1;
    free(mended);
    return rc;
}

int store_job_finish_at(store *st, const char *id, int attempt, const char *status, const char *code,
                        const char *message)
{
    return finish_job(st, id, attempt, 0, status, code, message);
}

int store_job_finish(store *st, const char *id, const char *status, const char *code,
                     const char *message)
{
    store_conn *c = store_conn_get(st);
    return c ? store_job_finish_at(st, id, store_fence_attempt(c, id), status, code, message) : -1;
}

/* store_job_requeue_at; for a lease rescue (`rescue`), only while the lease is still out. */
static int requeue_job(store *st, const char *id, int attempt, int rescue, const char *reason)
{
    store_conn *c = store_conn_get(st);
    if (!c || sql_begin(c) < 0)
        return -1;
    int fence = store_fence_check(c, id, attempt);
    if (fence != 0)
        return sql_abandon(c, fence);
    int renewed = rescue ? lease_renewed(c, id) : 0;
    if (renewed != 0)
        return sql_abandon(c, renewed);
    static const char *u = "UPDATE jobs SET status='queued', worker_pid=0, lease_owner='', lease_expires_at=0, "
                           "version=version+1, updated_at=? WHERE id=? AND status='running'";
    int changed = sql_run(c, u, "It", store_now(), id);
    if (changed < 0)
        return sql_abandon(c, -1);
    if (changed == 0)
        return sql_abandon(c, 1);
    if (store_event_insert(c, id, "job.requeued", reason, NULL) < 0 || sql_commit(c) < 0)
        return sql_abandon(c, -1);
    return 0;
}

int store_job_requeue_at(store *st, const char *id, int attempt, const char *reason)
{
    return requeue_job(st, id, attempt, 0, reason);
}

int store_job_requeue(store *st, const char *id, const char *reason)
{
    store_conn *c = store_conn_get(st);
    return c ? store_job_requeue_at(st, id, store_fence_attempt(c, id), reason) : -1;
}

/* A running job whose runner is gone, as store_recover and store_lease_rescue read it. */
typedef struct {
    char id[48], stage[64];
    int cancel, attempts;
} left_job;

static void left_from_row(sql_stmt *s, void *out)
{
    left_job *l = out;
    sql_cols(s, "tiit", l->id, sizeof l->id, &l->cancel, &l->attempts, l->stage, sizeof l->stage);
}

/* Settle each job of s's rows (id, cancel_requested, attempts, stage), whose runner is
 * gone for `why`: a pending cancel is finished; a job that has had max_attempts starts
 * fails with `code`; the rest go back to the queue to resume at their stage. Each at the
 * attempt read: a job another rescuer settled and a runner claimed again since is left
 * to that runner. For a lease rescue (`rescue`), each only while its lease is still out
 * when its row is locked: a runner that renewed since the read keeps its job. Returns how
 * many changed, or -1. */
static int settle_left(store *st, sql_stmt *s, int max_attempts, int rescue, const char *why, const char *code)
{
    int n = 0;
    left_job *left = sql_rows(s, INT_MAX, sizeof *left, left_from_row, NULL, &n, NULL);
    if (!left)
        return -1;
    int done = 0;
    for (int i = 0; i < n; i++) {
        const left_job *l = &left[i];
        int r;
        char msg[600];
        const char *stage = l->stage[0] ? l->stage : "(before the first stage)";
        if (l->cancel) {
            r = finish_job(st, l->id, l->attempts, rescue, "cancelled", NULL, NULL);
        } else if (l->attempts >= max_attempts) {
            /* every start counts: a job whose worker takes its runner down must not loop */
            snprintf(msg, sizeof msg, "%s while the job was running, during stage %s, after %d of %d attempts "
                     "(--max-attempts)", why, stage, l->attempts, max_attempts);
            r = finish_job(st, l->id, l->attempts, rescue, "failed", code, msg);
        } else {
            snprintf(msg, sizeof msg, "%s while the job was running; resuming at the first unfinished stage "
                     "(attempt %d of %d)", why, l->attempts + 1, max_attempts);
            r = requeue_job(st, l->id, l->attempts, rescue, msg);
        }
        if (r == 0)
            done++;
    }
    free(left);
    return done;
}

int store_recover(store *st, const char *owner, int max_attempts)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "SELECT id, cancel_requested, attempts, stage FROM jobs WHERE status='running' "
                           "AND (lease_owner=? OR lease_owner='') ORDER BY seq";
    sql_stmt *s = sql_query(c, q, "t", owner);
    return s ? settle_left(st, s, max_attempts, 0, "the server stopped", "server_lost") : -1;
}

int store_lease_rescue(store *st, int max_attempts, const char *self)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "SELECT id, cancel_requested, attempts, stage FROM jobs WHERE status='running' "
                           "AND lease_expires_at>0 AND lease_expires_at<? AND (lease_owner IS NULL OR lease_owner<>?) "
                           "ORDER BY seq";
    sql_stmt *s = sql_query(c, q, "It", store_now(), self);
    return s ? settle_left(st, s, max_attempts, 1, "its runner stopped renewing the lease", "lease_expired") : -1;
}

int store_job_cancel(store *st, const char *id, store_job *out)
{
    store_conn *c = store_conn_get(st);
    if (!c || sql_begin(c) < 0)
        return -1;
    static const char *q = "SELECT status, cancel_requested FROM jobs WHERE id=? FOR UPDATE";
    char cur[16] = "";
    int requested = 0;
    int rc = sql_row(c, q, "t", "ti", id, cur, sizeof cur, &requested);
    if (rc != 0)
        return sql_abandon(c, rc);
    int64_t now = store_now();
    if (!strcmp(cur, "queued")) {
        static const char *u = "UPDATE jobs SET status='cancelled', cancel_requested=1, finished_at=?, "
                               "version=version+1, updated_at=? WHERE id=?";
        if (sql_run(c, u, "IIt", now, now, id) < 0 ||
            store_event_insert(c, id, "job.cancelled", "job cancelled before it started", NULL) < 0)
            return sql_abandon(c, -1);
    } else if (!strcmp(cur, "running") && !requested) {
        static const char *u = "UPDATE jobs SET cancel_requested=1, version=version+1, updated_at=? WHERE id=?";
        if (sql_run(c, u, "It", now, id) < 0 ||
            store_event_insert(c, id, "job.cancel_requested", "cancellation requested", NULL) < 0)
            return sql_abandon(c, -1);
    }
    return commit_job(c, id, out);
}

int store_job_runner(store *st, const char *id, char status[16], char owner[256], int *cancel_requested,
                     int *attempts)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "SELECT status, lease_owner, cancel_requested, attempts FROM jobs WHERE id=?";
    return sql_row(c, q, "t", "ttii", id, status, (size_t)16, owner, (size_t)256, cancel_requested, attempts);
}

int store_job_cancel_requested(store *st, const char *id)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "SELECT cancel_requested FROM jobs WHERE id=?";
    int v = -1;
    return sql_row(c, q, "t", "i", id, &v) == 0 ? v : -1;
}

static void sha_from_row(sql_stmt *s, void *out)
{
    sql_cols(s, "s", (char **)out);
}

static void free_elem(void *p)
{
    free(*(char **)p);
}

int store_job_delete(store *st, const char *id, char ***orphans, int *n_orphans)
{
    *orphans = NULL;
    *n_orphans = 0;
    store_conn *c;
    char cur[16] = "";
    int rc = begin_with_status(st, id, &c, cur);
    if (rc != 0)
        return rc;
    if (!is_terminal(cur))
        return sql_abandon(c, 2);
    static const char *qo = "SELECT DISTINCT a.sha256 FROM artifacts a WHERE a.job_id=? AND NOT EXISTS "
                            "(SELECT 1 FROM artifacts b WHERE b.sha256=a.sha256 AND b.job_id<>a.job_id)";
    sql_stmt *s = sql_query(c, qo, "t", id);
    int n = 0;
    char **list = s ? sql_rows(s, INT_MAX, sizeof *list, sha_from_row, free_elem, &n, NULL) : NULL;
    if (!list)
        goto fail;
    static const char *d1 = "DELETE FROM events WHERE job_id=?";
    static const char *d2 = "DELETE FROM artifacts WHERE job_id=?";
    static const char *d3 = "DELETE FROM idempotency WHERE job_id=?";
    static const char *d4 = "DELETE FROM jobs WHERE id=?";
    static const char *d5 = "DELETE FROM webhooks WHERE job_id=?";
    const char *dels[] = {d1, d2, d3, d4, d5};
    for (int i = 0; i < 5; i++)
        if (sql_run(c, dels[i], "t", id) < 0)
            goto fail_list;
    if (sql_commit(c) < 0)
        goto fail_list;
    if (n == 0)
        free(list), list = NULL;
    *orphans = list;
    *n_orphans = n;
    return 0;
fail_list:
    for (int i = 0; i < n; i++)
        free(list[i]);
    free(list);
fail:
    return sql_abandon(c, -1);
}

int store_report_merge(store *st, const char *id, const char *const *clear, json_t *fragment)
{
    store_conn *c;
    int fence = store_begin_fenced(st, id, &c);
    if (fence != 0)
        return fence;
    if (report_update(c, id, clear, fragment, NULL, 0, 0) < 0 || sql_commit(c) < 0) {
        sql_rollback(c);
        return -1;
    }
    return 0;
}

typedef struct {
    char status[16];
    int64_t n;
} status_count;

static void count_from_row(sql_stmt *s, void *out)
{
    status_count *sc = out;
    sql_cols(s, "tI", sc->status, sizeof sc->status, &sc->n);
}

int store_job_counts(store *st, int64_t out[5])
{
    static const char *names[5] = {"queued", "running", "succeeded", "failed", "cancelled"};
    memset(out, 0, 5 * sizeof out[0]);
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "SELECT status, count(*) FROM jobs GROUP BY status";
    sql_stmt *s = sql_query(c, q, "");
    int n = 0;
    status_count *rows = s ? sql_rows(s, 8, sizeof *rows, count_from_row, NULL, &n, NULL) : NULL;
    if (!rows)
        return -1;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < 5; i++)
            if (!strcmp(rows[k].status, names[i]))
                out[i] = rows[k].n;
    free(rows);
    return 0;
}

int store_job_touch(store_conn *c, const char *id)
{
    static const char *bump = "UPDATE jobs SET version=version+1, updated_at=? WHERE id=?";
    return sql_run(c, bump, "It", store_now(), id) < 0 ? -1 : 0;
}

void store_job_clear(store_job *j)
{
    json_decref(j->spec);
    json_decref(j->stages);
    json_decref(j->report);
    j->spec = j->stages = j->report = NULL;
}
