/* storage/store_jobs.c — jobs and calibrations (see store.h): every state change one
 * transaction with its event, so a job is always in exactly one durable state. A
 * terminal state also queues the webhook (store_outbox.c); a restart requeues what was
 * running (store_recover).
 */
#include "storage/store_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JOB_COLS                                                                             \
    "seq, id, kind, status, device, name, spec, stages, stage_index, stage, step, total_steps, " \
    "error_code, error_message, report, cancel_requested, worker_pid, attempts, version, "     \
    "created_at, started_at, finished_at, updated_at"

static void job_from_row(sqlite3_stmt *s, void *out)
{
    store_job *j = out;
    memset(j, 0, sizeof *j);
    sql_cols(s, "ItttttjjitIIttjiiiIIIII", &j->seq, j->id, sizeof j->id, j->kind, sizeof j->kind, j->status,
             sizeof j->status, j->device, sizeof j->device, j->name, sizeof j->name, &j->spec, &j->stages,
             &j->stage_index, j->stage, sizeof j->stage, &j->step, &j->total_steps, j->error_code,
             sizeof j->error_code, j->error_message, sizeof j->error_message, &j->report, &j->cancel_requested,
             &j->worker_pid, &j->attempts, &j->version, &j->created_at, &j->started_at, &j->finished_at,
             &j->updated_at);
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
    static const char *ins = "INSERT INTO jobs(id, kind, status, device, name, spec, stages, "
                             "created_at, updated_at) VALUES (?,?,'queued',?,?,?,?,?,?)";
    if (sql_run(c, ins, "ttttttII", j->id, j->kind, j->device, j->name, spec, stages, now, now) < 0)
        goto fail;
    j->seq = sql_last_rowid(c);
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
    sqlite3_stmt *s = sql_stmt(c, sql, "tIi", kind, after_seq, limit + 1);
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

int store_job_claim(store *st, const char *device, store_job *out)
{
    store_conn *c = store_conn_get(st);
    if (!c || sql_begin(c) < 0)
        return -1;
    static const char *q = "SELECT id FROM jobs WHERE status='queued' AND device=? ORDER BY seq LIMIT 1";
    char id[48] = "";
    int rc = sql_row(c, q, "t", "t", device, id, sizeof id);
    if (rc != 0)
        return sql_abandon(c, rc);
    int64_t now = store_now();
    static const char *u = "UPDATE jobs SET status='running', attempts=attempts+1, worker_pid=0, "
                           "started_at=CASE WHEN started_at=0 THEN ? ELSE started_at END, "
                           "version=version+1, updated_at=? WHERE id=?";
    if (sql_run(c, u, "IIt", now, now, id) < 0 || store_event_insert(c, id, "job.started", "worker starting", NULL) < 0)
        return sql_abandon(c, -1);
    return commit_job(c, id, out);
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
    static const char *sql = "UPDATE jobs SET step=?, total_steps=?, version=version+1, updated_at=? WHERE id=?";
    return c && sql_run(c, sql, "IIIt", step, total, store_now(), id) >= 0 ? 0 : -1;
}

int store_job_stage_begin(store *st, const char *id, int index, const char *name)
{
    store_conn *c = store_conn_get(st);
    if (!c || sql_begin(c) < 0)
        return -1;
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

/* Read, modify and write the report inside the current transaction. */
static int report_update(store_conn *c, const char *id, json_t *fragment, const char *append_stage,
                         double wall_s, int attempt)
{
    static const char *q = "SELECT report FROM jobs WHERE id=?";
    json_t *r = NULL;
    if (sql_row(c, q, "t", "j", id, &r) != 0)
        return -1;
    if (!json_is_object(r)) {
        json_decref(r);
        r = json_object();
    }
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
    store_conn *c = store_conn_get(st);
    if (!c || sql_begin(c) < 0)
        return -1;
    static const char *sql = "UPDATE jobs SET stage_index=?, version=version+1, updated_at=? "
                             "WHERE id=? AND stage_index=?";
    int changed = sql_run(c, sql, "iIti", index + 1, store_now(), id, index);
    if (changed < 0)
        return sql_abandon(c, -1);
    if (changed == 0) /* already recorded (or not this stage): no-op */
        return sql_abandon(c, 0);
    static const char *qa = "SELECT attempts FROM jobs WHERE id=?";
    int attempt = 0;
    if (sql_row(c, qa, "t", "i", id, &attempt) < 0 || report_update(c, id, NULL, name, wall_s, attempt) < 0)
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
    static const char *q = "SELECT status FROM jobs WHERE id=?";
    int rc = sql_row(*c, q, "t", "t", id, status, (size_t)16);
    return rc != 0 ? sql_abandon(*c, rc) : 0;
}

int store_job_finish(store *st, const char *id, const char *status, const char *code,
                     const char *message)
{
    store_conn *c;
    char cur[16] = "";
    if (begin_with_status(st, id, &c, cur) != 0)
        return -1;
    if (is_terminal(cur))
        return sql_abandon(c, 1);
    int64_t now = store_now();
    static const char *u = "UPDATE jobs SET status=?, error_code=?, error_message=?, worker_pid=0, "
                           "finished_at=?, version=version+1, updated_at=? WHERE id=?";
    if (sql_run(c, u, "tttIIt", status, code, message, now, now, id) < 0)
        return sql_abandon(c, -1);
    char type[48];
    snprintf(type, sizeof type, "job.%s", status);
    if (store_webhook_enqueue(c, id, type, status, code, message, now) < 0)
        return sql_abandon(c, -1);
    json_t *d = code ? json_pack("{s:s,s:s}", "code", code, "message", message ? message : "") : NULL;
    char msg[1200];
    snprintf(msg, sizeof msg, "job %s%s%s", status, message ? ": " : "", message ? message : "");
    if (store_event_insert(c, id, type, msg, d) < 0 || sql_commit(c) < 0)
        return sql_abandon(c, -1);
    return 0;
}

int store_job_requeue(store *st, const char *id, const char *reason)
{
    store_conn *c = store_conn_get(st);
    if (!c || sql_begin(c) < 0)
        return -1;
    static const char *u = "UPDATE jobs SET status='queued', worker_pid=0, version=version+1, "
                           "updated_at=? WHERE id=? AND status='running'";
    int changed = sql_run(c, u, "It", store_now(), id);
    if (changed < 0)
        return sql_abandon(c, -1);
    if (changed == 0)
        return sql_abandon(c, 1);
    if (store_event_insert(c, id, "job.requeued", reason, NULL) < 0 || sql_commit(c) < 0)
        return sql_abandon(c, -1);
    return 0;
}

int store_recover(store *st, int max_attempts)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "SELECT id, cancel_requested, attempts, stage FROM jobs WHERE status='running' "
                           "ORDER BY seq";
    sqlite3_stmt *s = sql_prepared(c, q);
    if (!s)
        return -1;
    struct left { char id[48], stage[64]; int cancel, attempts; } *left = NULL;
    int n = 0, cap = 0, rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            void *a = realloc(left, (size_t)cap * sizeof *left);
            if (!a) {
                sqlite3_reset(s);
                free(left);
                return -1;
            }
            left = a;
        }
        sql_col_copy(s, 0, left[n].id, sizeof left[n].id);
        left[n].cancel = sqlite3_column_int(s, 1);
        left[n].attempts = sqlite3_column_int(s, 2);
        sql_col_copy(s, 3, left[n].stage, sizeof left[n].stage);
        n++;
    }
    sqlite3_reset(s);
    int done = 0;
    for (int i = 0; i < n; i++) {
        const struct left *l = &left[i];
        int r;
        char msg[400];
        if (l->cancel) {
            r = store_job_finish(st, l->id, "cancelled", NULL, NULL);
        } else if (l->attempts >= max_attempts) {
            /* every start counts: a job whose worker takes the server down must not loop */
            snprintf(msg, sizeof msg, "the server stopped while the job was running, during stage %s, after %d of "
                     "%d attempts (--max-attempts)", l->stage[0] ? l->stage : "(before the first stage)",
                     l->attempts, max_attempts);
            r = store_job_finish(st, l->id, "failed", "server_lost", msg);
        } else {
            snprintf(msg, sizeof msg, "server restarted while the job was running; resuming at the first "
                     "unfinished stage (attempt %d of %d)", l->attempts + 1, max_attempts);
            r = store_job_requeue(st, l->id, msg);
        }
        if (r == 0)
            done++;
    }
    free(left);
    return rc == SQLITE_DONE ? done : -1;
}

int store_job_cancel(store *st, const char *id, store_job *out)
{
    store_conn *c = store_conn_get(st);
    if (!c || sql_begin(c) < 0)
        return -1;
    static const char *q = "SELECT status, cancel_requested FROM jobs WHERE id=?";
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

int store_job_cancel_requested(store *st, const char *id)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "SELECT cancel_requested FROM jobs WHERE id=?";
    int v = -1;
    return sql_row(c, q, "t", "i", id, &v) == 0 ? v : -1;
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
    sqlite3_stmt *s = sql_stmt(c, qo, "t", id);
    if (!s)
        goto fail;
    char **list = NULL;
    int n = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        char **nl = realloc(list, (size_t)(n + 1) * sizeof *nl);
        const char *t = (const char *)sqlite3_column_text(s, 0);
        if (!nl)
            break;
        list = nl;
        list[n] = strdup(t ? t : "");
        if (list[n])
            n++;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        goto fail_list;
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

int store_report_merge(store *st, const char *id, json_t *fragment)
{
    store_conn *c = store_conn_get(st);
    if (!c || sql_begin(c) < 0)
        return -1;
    if (report_update(c, id, fragment, NULL, 0, 0) < 0 || sql_commit(c) < 0) {
        sql_rollback(c);
        return -1;
    }
    return 0;
}

int store_job_counts(store *st, int64_t out[5])
{
    static const char *names[5] = {"queued", "running", "succeeded", "failed", "cancelled"};
    memset(out, 0, 5 * sizeof out[0]);
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "SELECT status, count(*) FROM jobs GROUP BY status";
    sqlite3_stmt *s = sql_prepared(c, q);
    if (!s)
        return -1;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(s, 0);
        for (int i = 0; i < 5; i++)
            if (t && !strcmp(t, names[i]))
                out[i] = sqlite3_column_int64(s, 1);
    }
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? 0 : -1;
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
