/* storage/store.c — the SQLite job store (see store.h). Each thread uses its own
 * connection with a cache of prepared statements keyed by the SQL literal's address.
 * Writes run in BEGIN IMMEDIATE transactions with a busy timeout, so the server's threads
 * and the worker processes serialize on the database file, never on a process lock.
 */
#include "storage/store.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define STMT_CACHE 96

typedef struct conn {
    sqlite3 *db;
    struct { const char *sql; sqlite3_stmt *st; } cache[STMT_CACHE];
    int ncache;
    store *owner;
    struct conn *next;
} conn;

struct store {
    char *path;
    pthread_key_t key;
    pthread_mutex_t mu;
    conn *all;
    int schema_version;
};

/* Numbered migrations, embedded from storage/migrations/NNNN_*.sql (append-only: a new
 * migration is a new file plus a line here, which also makes make rebuild this file).
 * Index i is migration i+1; PRAGMA user_version records the last one applied. */
#define MIGRATION(sym, file)                                                              \
    __asm__(".section .rodata\n.global " #sym "\n.type " #sym ", @object\n" #sym ":\n"     \
            ".incbin \"" file "\"\n.byte 0\n.size " #sym ", .-" #sym "\n.previous\n");      \
    extern const char sym[];
MIGRATION(store_migration_0001, "storage/migrations/0001_init.sql")
MIGRATION(store_migration_0002, "storage/migrations/0002_webhooks.sql")
MIGRATION(store_migration_0003, "storage/migrations/0003_model_fetch.sql")
static const char *const migrations[] = {
    store_migration_0001,
    store_migration_0002,
    store_migration_0003,
};
#define N_MIGRATIONS ((int)(sizeof migrations / sizeof migrations[0]))

int64_t store_now(void)
{
    return (int64_t)time(NULL);
}

int store_new_id(const char *prefix, char *out, size_t outlen)
{
    unsigned char r[12];
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t k = getrandom(r + got, sizeof r - got, 0);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        got += (size_t)k;
    }
    size_t pl = strlen(prefix);
    if (outlen < pl + 2 * sizeof r + 1)
        return -1;
    memcpy(out, prefix, pl);
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof r; i++) {
        out[pl + 2 * i] = hex[r[i] >> 4];
        out[pl + 2 * i + 1] = hex[r[i] & 15];
    }
    out[pl + 2 * sizeof r] = 0;
    return 0;
}

static void conn_close(conn *c)
{
    for (int i = 0; i < c->ncache; i++)
        sqlite3_finalize(c->cache[i].st);
    sqlite3_close(c->db);
    free(c);
}

static void conn_unlink(store *st, conn *c)
{
    pthread_mutex_lock(&st->mu);
    for (conn **p = &st->all; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    pthread_mutex_unlock(&st->mu);
}

static void conn_destructor(void *p)
{
    conn *c = p;
    conn_unlink(c->owner, c);
    conn_close(c);
}

static conn *conn_open(store *st, char *err, size_t errlen)
{
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    int rc = sqlite3_open_v2(st->path, &c->db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", st->path, c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
        sqlite3_close(c->db);
        free(c);
        return NULL;
    }
    sqlite3_busy_timeout(c->db, 30000);
    char *msg = NULL;
    if (sqlite3_exec(c->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;",
                     NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", st->path, msg ? msg : "pragma failed");
        sqlite3_free(msg);
        sqlite3_close(c->db);
        free(c);
        return NULL;
    }
    c->owner = st;
    return c;
}

/* This thread's connection (opened on first use); NULL when it cannot be opened. */
static conn *C(store *st)
{
    conn *c = pthread_getspecific(st->key);
    if (c)
        return c;
    char err[256];
    c = conn_open(st, err, sizeof err);
    if (!c) {
        fprintf(stderr, "store: %s\n", err);
        return NULL;
    }
    if (pthread_setspecific(st->key, c) != 0) {
        conn_close(c);
        return NULL;
    }
    pthread_mutex_lock(&st->mu);
    c->next = st->all;
    st->all = c;
    pthread_mutex_unlock(&st->mu);
    return c;
}

/* A prepared, reset statement for a static SQL literal; NULL on failure (logged). */
static sqlite3_stmt *S(conn *c, const char *sql)
{
    for (int i = 0; i < c->ncache; i++)
        if (c->cache[i].sql == sql) {
            sqlite3_reset(c->cache[i].st);
            sqlite3_clear_bindings(c->cache[i].st);
            return c->cache[i].st;
        }
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v3(c->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, NULL) != SQLITE_OK) {
        fprintf(stderr, "store: prepare failed: %s (%s)\n", sqlite3_errmsg(c->db), sql);
        return NULL;
    }
    if (c->ncache < STMT_CACHE) {
        c->cache[c->ncache].sql = sql;
        c->cache[c->ncache].st = s;
        c->ncache++;
    }
    return s;
}

static int exec(conn *c, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(c->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        fprintf(stderr, "store: %s: %s\n", sql, msg ? msg : sqlite3_errmsg(c->db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static int begin(conn *c) { return exec(c, "BEGIN IMMEDIATE"); }
static int commit(conn *c) { return exec(c, "COMMIT"); }
static void rollback(conn *c)
{
    if (!sqlite3_get_autocommit(c->db))
        (void)sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
}

/* Step a statement that returns no rows. 0 or -1 (logged). */
static int step_done(conn *c, sqlite3_stmt *s)
{
    int rc = sqlite3_step(s);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        fprintf(stderr, "store: %s\n", sqlite3_errmsg(c->db));
        sqlite3_reset(s);
        return -1;
    }
    sqlite3_reset(s);
    return 0;
}

static void bind_text(sqlite3_stmt *s, int i, const char *v)
{
    sqlite3_bind_text(s, i, v ? v : "", -1, SQLITE_TRANSIENT);
}

static void col_copy(sqlite3_stmt *s, int i, char *dst, size_t n)
{
    const unsigned char *t = sqlite3_column_text(s, i);
    snprintf(dst, n, "%s", t ? (const char *)t : "");
}

static json_t *col_json(sqlite3_stmt *s, int i)
{
    const char *t = (const char *)sqlite3_column_text(s, i);
    if (!t)
        return NULL;
    return json_loads(t, 0, NULL);
}

store *store_open(const char *path, char *err, size_t errlen)
{
    store *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&st->mu, NULL);
    if (pthread_key_create(&st->key, conn_destructor) != 0) {
        snprintf(err, errlen, "pthread_key_create failed");
        free(st->path);
        free(st);
        return NULL;
    }
    conn *c = conn_open(st, err, errlen);
    if (!c) {
        pthread_key_delete(st->key);
        free(st->path);
        free(st);
        return NULL;
    }
    /* Migrations run in one exclusive transaction each; concurrent openers wait. */
    int version = 0;
    for (;;) {
        if (exec(c, "BEGIN EXCLUSIVE") < 0)
            goto fail;
        sqlite3_stmt *s = NULL;
        if (sqlite3_prepare_v2(c->db, "PRAGMA user_version", -1, &s, NULL) != SQLITE_OK)
            goto fail_tx;
        version = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
        sqlite3_finalize(s);
        if (version < 0 || version > N_MIGRATIONS) {
            snprintf(err, errlen, "%s: schema version %d is newer than this build (%d)", path,
                     version, N_MIGRATIONS);
            goto fail_tx;
        }
        if (version == N_MIGRATIONS) {
            if (commit(c) < 0)
                goto fail;
            break;
        }
        if (exec(c, migrations[version]) < 0) {
            snprintf(err, errlen, "%s: migration %d failed", path, version + 1);
            goto fail_tx;
        }
        char pv[64];
        snprintf(pv, sizeof pv, "PRAGMA user_version=%d", version + 1);
        if (exec(c, pv) < 0 || commit(c) < 0)
            goto fail_tx;
    }
    st->schema_version = version;
    if (pthread_setspecific(st->key, c) != 0)
        goto fail;
    st->all = c;
    return st;
fail_tx:
    rollback(c);
fail:
    if (!err[0])
        snprintf(err, errlen, "%s: cannot initialise the database", path);
    conn_close(c);
    pthread_key_delete(st->key);
    free(st->path);
    free(st);
    return NULL;
}

void store_close(store *st)
{
    if (!st)
        return;
    pthread_mutex_lock(&st->mu);
    conn *c = st->all;
    st->all = NULL;
    pthread_mutex_unlock(&st->mu);
    while (c) {
        conn *n = c->next;
        conn_close(c);
        c = n;
    }
    pthread_setspecific(st->key, NULL);
    pthread_key_delete(st->key);
    pthread_mutex_destroy(&st->mu);
    free(st->path);
    free(st);
}

int store_schema_version(store *st)
{
    return st->schema_version;
}

void store_job_clear(store_job *j)
{
    json_decref(j->spec);
    json_decref(j->stages);
    json_decref(j->report);
    j->spec = j->stages = j->report = NULL;
}

void store_event_clear(store_event *e)
{
    free(e->message);
    json_decref(e->data);
    e->message = NULL;
    e->data = NULL;
}

/* ---- events ------------------------------------------------------------------------ */

static const char *SQL_EVENT_INSERT =
    "INSERT INTO events(job_id, type, message, data, created_at) VALUES (?,?,?,?,?)";

/* Inside a transaction (or alone). 0 or -1. */
static int event_insert(conn *c, const char *job_id, const char *type, const char *message,
                        json_t *data)
{
    sqlite3_stmt *s = S(c, SQL_EVENT_INSERT);
    if (!s)
        return -1;
    char *dt = data ? json_dumps(data, JSON_COMPACT) : NULL;
    bind_text(s, 1, job_id);
    bind_text(s, 2, type);
    bind_text(s, 3, message);
    if (dt)
        sqlite3_bind_text(s, 4, dt, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(s, 4);
    sqlite3_bind_int64(s, 5, store_now());
    int rc = step_done(c, s);
    free(dt);
    return rc;
}

int store_event_append(store *st, const char *job_id, const char *type, const char *message,
                       json_t *data)
{
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *bump = "UPDATE jobs SET version=version+1, updated_at=? WHERE id=?";
    sqlite3_stmt *s = S(c, bump);
    if (!s)
        goto fail;
    sqlite3_bind_int64(s, 1, store_now());
    bind_text(s, 2, job_id);
    if (step_done(c, s) < 0 || event_insert(c, job_id, type, message, data) < 0 || commit(c) < 0)
        goto fail;
    return 0;
fail:
    rollback(c);
    return -1;
}

int store_event_list(store *st, const char *job_id, int64_t after_seq, int limit,
                     store_event **out, int *n, int *has_more)
{
    *out = NULL;
    *n = 0;
    *has_more = 0;
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *sql = "SELECT seq, job_id, type, message, data, created_at FROM events "
                             "WHERE job_id=? AND seq>? ORDER BY seq LIMIT ?";
    sqlite3_stmt *s = S(c, sql);
    if (!s)
        return -1;
    bind_text(s, 1, job_id);
    sqlite3_bind_int64(s, 2, after_seq);
    sqlite3_bind_int(s, 3, limit + 1);
    store_event *ev = calloc((size_t)limit + 1, sizeof *ev);
    if (!ev)
        return -1;
    int k = 0, rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (k == limit) {
            *has_more = 1;
            break;
        }
        store_event *e = &ev[k++];
        e->seq = sqlite3_column_int64(s, 0);
        snprintf(e->id, sizeof e->id, "evt_%016lld", (long long)e->seq);
        col_copy(s, 1, e->job_id, sizeof e->job_id);
        col_copy(s, 2, e->type, sizeof e->type);
        const char *m = (const char *)sqlite3_column_text(s, 3);
        e->message = strdup(m ? m : "");
        e->data = col_json(s, 4);
        e->created_at = sqlite3_column_int64(s, 5);
    }
    int bad = rc != SQLITE_ROW && rc != SQLITE_DONE;
    sqlite3_reset(s);
    if (bad) {
        store_event_list_free(ev, k);
        return -1;
    }
    *out = ev;
    *n = k;
    return 0;
}

void store_event_list_free(store_event *ev, int n)
{
    for (int i = 0; i < n; i++)
        store_event_clear(&ev[i]);
    free(ev);
}

/* ---- jobs -------------------------------------------------------------------------- */

#define JOB_COLS                                                                             \
    "seq, id, kind, status, device, name, spec, stages, stage_index, stage, step, total_steps, " \
    "error_code, error_message, report, cancel_requested, worker_pid, attempts, version, "     \
    "created_at, started_at, finished_at, updated_at"

static void job_from_row(sqlite3_stmt *s, store_job *j)
{
    memset(j, 0, sizeof *j);
    j->seq = sqlite3_column_int64(s, 0);
    col_copy(s, 1, j->id, sizeof j->id);
    col_copy(s, 2, j->kind, sizeof j->kind);
    col_copy(s, 3, j->status, sizeof j->status);
    col_copy(s, 4, j->device, sizeof j->device);
    col_copy(s, 5, j->name, sizeof j->name);
    j->spec = col_json(s, 6);
    j->stages = col_json(s, 7);
    j->stage_index = sqlite3_column_int(s, 8);
    col_copy(s, 9, j->stage, sizeof j->stage);
    j->step = sqlite3_column_int64(s, 10);
    j->total_steps = sqlite3_column_int64(s, 11);
    col_copy(s, 12, j->error_code, sizeof j->error_code);
    col_copy(s, 13, j->error_message, sizeof j->error_message);
    j->report = col_json(s, 14);
    j->cancel_requested = sqlite3_column_int(s, 15);
    j->worker_pid = sqlite3_column_int(s, 16);
    j->attempts = sqlite3_column_int(s, 17);
    j->version = sqlite3_column_int64(s, 18);
    j->created_at = sqlite3_column_int64(s, 19);
    j->started_at = sqlite3_column_int64(s, 20);
    j->finished_at = sqlite3_column_int64(s, 21);
    j->updated_at = sqlite3_column_int64(s, 22);
    if (!j->spec)
        j->spec = json_object();
    if (!j->stages)
        j->stages = json_array();
    if (!j->report)
        j->report = json_object();
}

static int job_get_conn(conn *c, const char *id, store_job *out)
{
    static const char *sql = "SELECT " JOB_COLS " FROM jobs WHERE id=?";
    sqlite3_stmt *s = S(c, sql);
    if (!s)
        return -1;
    bind_text(s, 1, id);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        job_from_row(s, out);
        sqlite3_reset(s);
        return 0;
    }
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? 1 : -1;
}

int store_job_get(store *st, const char *id, store_job *out)
{
    conn *c = C(st);
    return c ? job_get_conn(c, id, out) : -1;
}

int store_job_version(store *st, const char *id, int64_t *version, char status[16])
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *sql = "SELECT version, status FROM jobs WHERE id=?";
    sqlite3_stmt *s = S(c, sql);
    if (!s)
        return -1;
    bind_text(s, 1, id);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *version = sqlite3_column_int64(s, 0);
        col_copy(s, 1, status, 16);
    }
    sqlite3_reset(s);
    return rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? 1 : -1;
}

int store_job_create(store *st, store_job *j, const char *idem_scope, const char *idem_key,
                     const char *body_sha256, int resp_status, const char *resp_text,
                     char *err, size_t errlen)
{
    conn *c = C(st);
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
    if (begin(c) < 0) {
        snprintf(err, errlen, "database busy");
        goto out;
    }
    if (idem_key) {
        static const char *q = "SELECT 1 FROM idempotency WHERE scope=? AND key=?";
        sqlite3_stmt *s = S(c, q);
        if (!s)
            goto fail;
        bind_text(s, 1, idem_scope);
        bind_text(s, 2, idem_key);
        int rc = sqlite3_step(s);
        sqlite3_reset(s);
        if (rc == SQLITE_ROW) {
            rollback(c);
            ret = 1;
            goto out;
        }
        static const char *ins = "INSERT INTO idempotency(scope, key, body_sha256, job_id, status, "
                                 "response, created_at) VALUES (?,?,?,?,?,?,?)";
        s = S(c, ins);
        if (!s)
            goto fail;
        bind_text(s, 1, idem_scope);
        bind_text(s, 2, idem_key);
        bind_text(s, 3, body_sha256);
        bind_text(s, 4, j->id);
        sqlite3_bind_int(s, 5, resp_status);
        bind_text(s, 6, resp_text);
        sqlite3_bind_int64(s, 7, store_now());
        if (step_done(c, s) < 0)
            goto fail;
    }
    int64_t now = j->created_at ? j->created_at : store_now();
    static const char *ins = "INSERT INTO jobs(id, kind, status, device, name, spec, stages, "
                             "created_at, updated_at) VALUES (?,?,'queued',?,?,?,?,?,?)";
    sqlite3_stmt *s = S(c, ins);
    if (!s)
        goto fail;
    bind_text(s, 1, j->id);
    bind_text(s, 2, j->kind);
    bind_text(s, 3, j->device);
    bind_text(s, 4, j->name);
    bind_text(s, 5, spec);
    bind_text(s, 6, stages);
    sqlite3_bind_int64(s, 7, now);
    sqlite3_bind_int64(s, 8, now);
    if (step_done(c, s) < 0)
        goto fail;
    j->seq = sqlite3_last_insert_rowid(c->db);
    if (event_insert(c, j->id, "job.created", "job queued", NULL) < 0 || commit(c) < 0)
        goto fail;
    snprintf(j->status, sizeof j->status, "queued");
    j->created_at = j->updated_at = now;
    j->version = 1;
    ret = 0;
    goto out;
fail:
    snprintf(err, errlen, "database write failed: %s", sqlite3_errmsg(c->db));
    rollback(c);
out:
    free(spec);
    free(stages);
    return ret;
}

int store_idem_get(store *st, const char *scope, const char *key, char sha256_out[65],
                   int *resp_status, char **resp_text)
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *sql = "SELECT body_sha256, status, response FROM idempotency WHERE scope=? AND key=?";
    sqlite3_stmt *s = S(c, sql);
    if (!s)
        return -1;
    bind_text(s, 1, scope);
    bind_text(s, 2, key);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        col_copy(s, 0, sha256_out, 65);
        *resp_status = sqlite3_column_int(s, 1);
        const char *t = (const char *)sqlite3_column_text(s, 2);
        *resp_text = strdup(t ? t : "");
    }
    sqlite3_reset(s);
    if (rc == SQLITE_ROW)
        return *resp_text ? 0 : -1;
    return rc == SQLITE_DONE ? 1 : -1;
}

int store_job_list(store *st, const char *kind, const char *after, int limit,
                   store_job **out, int *n, int *has_more)
{
    *out = NULL;
    *n = 0;
    *has_more = 0;
    conn *c = C(st);
    if (!c)
        return -1;
    int64_t after_seq = INT64_MAX;
    if (after) {
        static const char *q = "SELECT seq FROM jobs WHERE id=? AND kind=?";
        sqlite3_stmt *s = S(c, q);
        if (!s)
            return -1;
        bind_text(s, 1, after);
        bind_text(s, 2, kind);
        int rc = sqlite3_step(s);
        if (rc == SQLITE_ROW)
            after_seq = sqlite3_column_int64(s, 0);
        sqlite3_reset(s);
        if (rc == SQLITE_DONE)
            return 1;
        if (rc != SQLITE_ROW)
            return -1;
    }
    static const char *sql = "SELECT " JOB_COLS " FROM jobs WHERE kind=? AND seq<? ORDER BY seq DESC LIMIT ?";
    sqlite3_stmt *s = S(c, sql);
    if (!s)
        return -1;
    bind_text(s, 1, kind);
    sqlite3_bind_int64(s, 2, after_seq);
    sqlite3_bind_int(s, 3, limit + 1);
    store_job *jobs = calloc((size_t)limit + 1, sizeof *jobs);
    if (!jobs)
        return -1;
    int k = 0, rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (k == limit) {
            *has_more = 1;
            break;
        }
        job_from_row(s, &jobs[k++]);
    }
    int bad = rc != SQLITE_ROW && rc != SQLITE_DONE;
    sqlite3_reset(s);
    if (bad) {
        store_job_list_free(jobs, k);
        return -1;
    }
    *out = jobs;
    *n = k;
    return 0;
}

void store_job_list_free(store_job *jobs, int n)
{
    for (int i = 0; i < n; i++)
        store_job_clear(&jobs[i]);
    free(jobs);
}

int store_job_claim(store *st, const char *device, store_job *out)
{
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *q = "SELECT id FROM jobs WHERE status='queued' AND device=? ORDER BY seq LIMIT 1";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        goto fail;
    bind_text(s, 1, device);
    int rc = sqlite3_step(s);
    char id[48] = "";
    if (rc == SQLITE_ROW)
        col_copy(s, 0, id, sizeof id);
    sqlite3_reset(s);
    if (rc == SQLITE_DONE) {
        rollback(c);
        return 1;
    }
    if (rc != SQLITE_ROW)
        goto fail;
    int64_t now = store_now();
    static const char *u = "UPDATE jobs SET status='running', attempts=attempts+1, worker_pid=0, "
                           "started_at=CASE WHEN started_at=0 THEN ? ELSE started_at END, "
                           "version=version+1, updated_at=? WHERE id=?";
    s = S(c, u);
    if (!s)
        goto fail;
    sqlite3_bind_int64(s, 1, now);
    sqlite3_bind_int64(s, 2, now);
    bind_text(s, 3, id);
    if (step_done(c, s) < 0 || event_insert(c, id, "job.started", "worker starting", NULL) < 0)
        goto fail;
    if (job_get_conn(c, id, out) != 0)
        goto fail;
    if (commit(c) < 0) {
        store_job_clear(out);
        goto fail;
    }
    return 0;
fail:
    rollback(c);
    return -1;
}

/* Run one UPDATE with up to three text binds and an integer, no transaction needed. */
static int update_simple(store *st, const char *sql, const char *a, int64_t b, const char *id)
{
    conn *c = C(st);
    if (!c)
        return -1;
    sqlite3_stmt *s = S(c, sql);
    if (!s)
        return -1;
    int i = 1;
    if (a)
        bind_text(s, i++, a);
    sqlite3_bind_int64(s, i++, b);
    sqlite3_bind_int64(s, i++, store_now());
    bind_text(s, i, id);
    return step_done(c, s);
}

int store_job_set_pid(store *st, const char *id, int pid)
{
    static const char *sql = "UPDATE jobs SET worker_pid=?, updated_at=? WHERE id=?";
    return update_simple(st, sql, NULL, pid, id);
}

int store_job_progress(store *st, const char *id, int64_t step, int64_t total)
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *sql = "UPDATE jobs SET step=?, total_steps=?, version=version+1, updated_at=? WHERE id=?";
    sqlite3_stmt *s = S(c, sql);
    if (!s)
        return -1;
    sqlite3_bind_int64(s, 1, step);
    sqlite3_bind_int64(s, 2, total);
    sqlite3_bind_int64(s, 3, store_now());
    bind_text(s, 4, id);
    return step_done(c, s);
}

int store_job_stage_begin(store *st, const char *id, int index, const char *name)
{
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *sql = "UPDATE jobs SET stage=?, step=0, total_steps=0, version=version+1, "
                             "updated_at=? WHERE id=? AND stage_index=?";
    sqlite3_stmt *s = S(c, sql);
    if (!s)
        goto fail;
    bind_text(s, 1, name);
    sqlite3_bind_int64(s, 2, store_now());
    bind_text(s, 3, id);
    sqlite3_bind_int(s, 4, index);
    if (step_done(c, s) < 0)
        goto fail;
    json_t *d = json_pack("{s:s,s:i}", "stage", name, "index", index);
    char msg[128];
    snprintf(msg, sizeof msg, "stage %s started", name);
    int rc = event_insert(c, id, "stage.started", msg, d);
    json_decref(d);
    if (rc < 0 || commit(c) < 0)
        goto fail;
    return 0;
fail:
    rollback(c);
    return -1;
}

/* Read, modify and write the report inside the current transaction. */
static int report_update(conn *c, const char *id, json_t *fragment, const char *append_stage,
                         double wall_s, int attempt)
{
    static const char *q = "SELECT report FROM jobs WHERE id=?";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        return -1;
    bind_text(s, 1, id);
    if (sqlite3_step(s) != SQLITE_ROW) {
        sqlite3_reset(s);
        return -1;
    }
    json_t *r = col_json(s, 0);
    sqlite3_reset(s);
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
    s = S(c, u);
    if (!s) {
        free(text);
        return -1;
    }
    bind_text(s, 1, text);
    sqlite3_bind_int64(s, 2, store_now());
    bind_text(s, 3, id);
    int rc = step_done(c, s);
    free(text);
    return rc;
}

int store_job_stage_done(store *st, const char *id, int index, const char *name, double wall_s)
{
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *sql = "UPDATE jobs SET stage_index=?, version=version+1, updated_at=? "
                             "WHERE id=? AND stage_index=?";
    sqlite3_stmt *s = S(c, sql);
    if (!s)
        goto fail;
    sqlite3_bind_int(s, 1, index + 1);
    sqlite3_bind_int64(s, 2, store_now());
    bind_text(s, 3, id);
    sqlite3_bind_int(s, 4, index);
    if (step_done(c, s) < 0)
        goto fail;
    if (sqlite3_changes(c->db) == 0) { /* already recorded (or not this stage): no-op */
        rollback(c);
        return 0;
    }
    static const char *qa = "SELECT attempts FROM jobs WHERE id=?";
    s = S(c, qa);
    if (!s)
        goto fail;
    bind_text(s, 1, id);
    int attempt = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : 0;
    sqlite3_reset(s);
    if (report_update(c, id, NULL, name, wall_s, attempt) < 0)
        goto fail;
    json_t *d = json_pack("{s:s,s:i,s:f}", "stage", name, "index", index, "wall_s", wall_s);
    char msg[128];
    snprintf(msg, sizeof msg, "stage %s completed in %.3f s", name, wall_s);
    int rc = event_insert(c, id, "stage.completed", msg, d);
    json_decref(d);
    if (rc < 0 || commit(c) < 0)
        goto fail;
    return 0;
fail:
    rollback(c);
    return -1;
}

static int is_terminal(const char *status)
{
    return !strcmp(status, "succeeded") || !strcmp(status, "failed") || !strcmp(status, "cancelled");
}

/* Inside the finishing transaction: when the job's spec has a callback_url, add the
 * thin terminal event to the webhook outbox. 0 (also when there is nothing to send) or -1. */
static int webhook_enqueue(conn *c, const char *id, const char *type, const char *status, const char *code,
                           const char *message, int64_t now)
{
    static const char *q = "SELECT kind, spec FROM jobs WHERE id=?";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        return -1;
    bind_text(s, 1, id);
    if (sqlite3_step(s) != SQLITE_ROW) {
        sqlite3_reset(s);
        return -1;
    }
    char kind[16];
    col_copy(s, 0, kind, sizeof kind);
    json_t *spec = col_json(s, 1);
    sqlite3_reset(s);
    const char *url = json_string_value(json_object_get(spec, "callback_url"));
    if (!url || !url[0]) {
        json_decref(spec);
        return 0;
    }
    char msg_id[48];
    if (store_new_id("msg_", msg_id, sizeof msg_id) < 0) {
        json_decref(spec);
        return -1;
    }
    json_t *payload = json_pack("{s:s,s:I,s:{s:s,s:s,s:s,s:o}}", "type", type, "timestamp", (json_int_t)now, "data",
                                "id", id, "object", !strcmp(kind, "calibration") ? "calibration" : "job", "status",
                                status, "error",
                                code ? json_pack("{s:s,s:s}", "code", code, "message", message ? message : "")
                                     : json_null());
    char *text = payload ? json_dumps(payload, JSON_COMPACT) : NULL;
    json_decref(payload);
    static const char *ins = "INSERT INTO webhooks(id, job_id, url, type, payload, next_at, created_at) "
                             "VALUES (?,?,?,?,?,?,?)";
    s = S(c, ins);
    int rc = -1;
    if (s && text) {
        bind_text(s, 1, msg_id);
        bind_text(s, 2, id);
        bind_text(s, 3, url);
        bind_text(s, 4, type);
        bind_text(s, 5, text);
        sqlite3_bind_int64(s, 6, now);
        sqlite3_bind_int64(s, 7, now);
        rc = step_done(c, s);
    }
    free(text);
    json_decref(spec);
    return rc;
}

int store_job_finish(store *st, const char *id, const char *status, const char *code,
                     const char *message)
{
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *q = "SELECT status FROM jobs WHERE id=?";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        goto fail;
    bind_text(s, 1, id);
    char cur[16] = "";
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        col_copy(s, 0, cur, sizeof cur);
    sqlite3_reset(s);
    if (rc != SQLITE_ROW)
        goto fail;
    if (is_terminal(cur)) {
        rollback(c);
        return 1;
    }
    int64_t now = store_now();
    static const char *u = "UPDATE jobs SET status=?, error_code=?, error_message=?, worker_pid=0, "
                           "finished_at=?, version=version+1, updated_at=? WHERE id=?";
    s = S(c, u);
    if (!s)
        goto fail;
    bind_text(s, 1, status);
    bind_text(s, 2, code);
    bind_text(s, 3, message);
    sqlite3_bind_int64(s, 4, now);
    sqlite3_bind_int64(s, 5, now);
    bind_text(s, 6, id);
    if (step_done(c, s) < 0)
        goto fail;
    char type[48];
    snprintf(type, sizeof type, "job.%s", status);
    if (webhook_enqueue(c, id, type, status, code, message, now) < 0)
        goto fail;
    json_t *d = code ? json_pack("{s:s,s:s}", "code", code, "message", message ? message : "") : NULL;
    char msg[1200];
    snprintf(msg, sizeof msg, "job %s%s%s", status, message ? ": " : "", message ? message : "");
    rc = event_insert(c, id, type, msg, d);
    json_decref(d);
    if (rc < 0 || commit(c) < 0)
        goto fail;
    return 0;
fail:
    rollback(c);
    return -1;
}

int store_job_requeue(store *st, const char *id, const char *reason)
{
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *u = "UPDATE jobs SET status='queued', worker_pid=0, version=version+1, "
                           "updated_at=? WHERE id=? AND status='running'";
    sqlite3_stmt *s = S(c, u);
    if (!s)
        goto fail;
    sqlite3_bind_int64(s, 1, store_now());
    bind_text(s, 2, id);
    if (step_done(c, s) < 0)
        goto fail;
    if (sqlite3_changes(c->db) == 0) {
        rollback(c);
        return 1;
    }
    if (event_insert(c, id, "job.requeued", reason, NULL) < 0 || commit(c) < 0)
        goto fail;
    return 0;
fail:
    rollback(c);
    return -1;
}

int store_recover(store *st)
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "SELECT id, cancel_requested FROM jobs WHERE status='running' ORDER BY seq";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        return -1;
    char (*ids)[48] = NULL;
    int *cancel = NULL;
    int n = 0, cap = 0, rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            void *a = realloc(ids, (size_t)cap * sizeof *ids), *b = realloc(cancel, (size_t)cap * sizeof *cancel);
            if (a)
                ids = a;
            if (b)
                cancel = b;
            if (!a || !b) {
                sqlite3_reset(s);
                free(ids);
                free(cancel);
                return -1;
            }
        }
        col_copy(s, 0, ids[n], sizeof ids[n]);
        cancel[n] = sqlite3_column_int(s, 1);
        n++;
    }
    sqlite3_reset(s);
    int done = 0;
    for (int i = 0; i < n; i++) {
        int r = cancel[i] ? store_job_finish(st, ids[i], "cancelled", NULL, NULL)
                          : store_job_requeue(st, ids[i], "server restarted while the job was running; "
                                                          "resuming at the first unfinished stage");
        if (r == 0)
            done++;
    }
    free(ids);
    free(cancel);
    return rc == SQLITE_DONE ? done : -1;
}

int store_job_cancel(store *st, const char *id, store_job *out)
{
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *q = "SELECT status, cancel_requested FROM jobs WHERE id=?";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        goto fail;
    bind_text(s, 1, id);
    int rc = sqlite3_step(s);
    char cur[16] = "";
    int requested = 0;
    if (rc == SQLITE_ROW) {
        col_copy(s, 0, cur, sizeof cur);
        requested = sqlite3_column_int(s, 1);
    }
    sqlite3_reset(s);
    if (rc == SQLITE_DONE) {
        rollback(c);
        return 1;
    }
    if (rc != SQLITE_ROW)
        goto fail;
    int64_t now = store_now();
    if (!strcmp(cur, "queued")) {
        static const char *u = "UPDATE jobs SET status='cancelled', cancel_requested=1, finished_at=?, "
                               "version=version+1, updated_at=? WHERE id=?";
        s = S(c, u);
        if (!s)
            goto fail;
        sqlite3_bind_int64(s, 1, now);
        sqlite3_bind_int64(s, 2, now);
        bind_text(s, 3, id);
        if (step_done(c, s) < 0 || event_insert(c, id, "job.cancelled", "job cancelled before it started", NULL) < 0)
            goto fail;
    } else if (!strcmp(cur, "running") && !requested) {
        static const char *u = "UPDATE jobs SET cancel_requested=1, version=version+1, updated_at=? WHERE id=?";
        s = S(c, u);
        if (!s)
            goto fail;
        sqlite3_bind_int64(s, 1, now);
        bind_text(s, 2, id);
        if (step_done(c, s) < 0 ||
            event_insert(c, id, "job.cancel_requested", "cancellation requested", NULL) < 0)
            goto fail;
    }
    if (job_get_conn(c, id, out) != 0)
        goto fail;
    if (commit(c) < 0) {
        store_job_clear(out);
        goto fail;
    }
    return 0;
fail:
    rollback(c);
    return -1;
}

int store_job_cancel_requested(store *st, const char *id)
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "SELECT cancel_requested FROM jobs WHERE id=?";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        return -1;
    bind_text(s, 1, id);
    int rc = sqlite3_step(s);
    int v = rc == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
    sqlite3_reset(s);
    return v;
}

int store_job_delete(store *st, const char *id, char ***orphans, int *n_orphans)
{
    *orphans = NULL;
    *n_orphans = 0;
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *q = "SELECT status FROM jobs WHERE id=?";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        goto fail;
    bind_text(s, 1, id);
    int rc = sqlite3_step(s);
    char cur[16] = "";
    if (rc == SQLITE_ROW)
        col_copy(s, 0, cur, sizeof cur);
    sqlite3_reset(s);
    if (rc == SQLITE_DONE) {
        rollback(c);
        return 1;
    }
    if (rc != SQLITE_ROW)
        goto fail;
    if (!is_terminal(cur)) {
        rollback(c);
        return 2;
    }
    static const char *qo = "SELECT DISTINCT a.sha256 FROM artifacts a WHERE a.job_id=? AND NOT EXISTS "
                            "(SELECT 1 FROM artifacts b WHERE b.sha256=a.sha256 AND b.job_id<>a.job_id)";
    s = S(c, qo);
    if (!s)
        goto fail;
    bind_text(s, 1, id);
    char **list = NULL;
    int n = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
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
    static const char *d1 = "DELETE FROM events WHERE job_id=?";
    static const char *d2 = "DELETE FROM artifacts WHERE job_id=?";
    static const char *d3 = "DELETE FROM idempotency WHERE job_id=?";
    static const char *d4 = "DELETE FROM jobs WHERE id=?";
    static const char *d5 = "DELETE FROM webhooks WHERE job_id=?";
    const char *dels[] = {d1, d2, d3, d4, d5};
    for (int i = 0; i < 5; i++) {
        s = S(c, dels[i]);
        if (!s)
            goto fail_list;
        bind_text(s, 1, id);
        if (step_done(c, s) < 0)
            goto fail_list;
    }
    if (commit(c) < 0)
        goto fail_list;
    *orphans = list;
    *n_orphans = n;
    return 0;
fail_list:
    for (int i = 0; i < n; i++)
        free(list[i]);
    free(list);
fail:
    rollback(c);
    return -1;
}

int store_report_merge(store *st, const char *id, json_t *fragment)
{
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    if (report_update(c, id, fragment, NULL, 0, 0) < 0 || commit(c) < 0) {
        rollback(c);
        return -1;
    }
    return 0;
}

int store_job_counts(store *st, int64_t out[5])
{
    static const char *names[5] = {"queued", "running", "succeeded", "failed", "cancelled"};
    memset(out, 0, 5 * sizeof out[0]);
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "SELECT status, count(*) FROM jobs GROUP BY status";
    sqlite3_stmt *s = S(c, q);
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

/* ---- artifacts --------------------------------------------------------------------- */

static void artifact_from_row(sqlite3_stmt *s, store_artifact *a)
{
    memset(a, 0, sizeof *a);
    col_copy(s, 0, a->id, sizeof a->id);
    col_copy(s, 1, a->job_id, sizeof a->job_id);
    col_copy(s, 2, a->name, sizeof a->name);
    col_copy(s, 3, a->stage, sizeof a->stage);
    col_copy(s, 4, a->sha256, sizeof a->sha256);
    a->size_bytes = sqlite3_column_int64(s, 5);
    col_copy(s, 6, a->content_type, sizeof a->content_type);
    a->created_at = sqlite3_column_int64(s, 7);
}

int store_artifact_add(store *st, store_artifact *a)
{
    conn *c = C(st);
    if (!c || store_new_id("art_", a->id, sizeof a->id) < 0)
        return -1;
    a->created_at = store_now();
    if (begin(c) < 0)
        return -1;
    static const char *sql = "INSERT OR REPLACE INTO artifacts(id, job_id, name, stage, sha256, "
                             "size_bytes, content_type, created_at) VALUES (?,?,?,?,?,?,?,?)";
    sqlite3_stmt *s = S(c, sql);
    if (!s)
        goto fail;
    bind_text(s, 1, a->id);
    bind_text(s, 2, a->job_id);
    bind_text(s, 3, a->name);
    bind_text(s, 4, a->stage);
    bind_text(s, 5, a->sha256);
    sqlite3_bind_int64(s, 6, a->size_bytes);
    bind_text(s, 7, a->content_type);
    sqlite3_bind_int64(s, 8, a->created_at);
    if (step_done(c, s) < 0)
        goto fail;
    json_t *d = json_pack("{s:s,s:s,s:s,s:I}", "id", a->id, "name", a->name, "sha256", a->sha256,
                          "size_bytes", (json_int_t)a->size_bytes);
    char msg[320];
    snprintf(msg, sizeof msg, "artifact %s published", a->name);
    int rc = event_insert(c, a->job_id, "artifact.published", msg, d);
    json_decref(d);
    static const char *bump = "UPDATE jobs SET version=version+1, updated_at=? WHERE id=?";
    s = S(c, bump);
    if (rc < 0 || !s)
        goto fail;
    sqlite3_bind_int64(s, 1, store_now());
    bind_text(s, 2, a->job_id);
    if (step_done(c, s) < 0 || commit(c) < 0)
        goto fail;
    return 0;
fail:
    rollback(c);
    return -1;
}

#define ART_COLS "id, job_id, name, stage, sha256, size_bytes, content_type, created_at"

int store_artifact_get(store *st, const char *job_id, const char *name, store_artifact *out)
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "SELECT " ART_COLS " FROM artifacts WHERE job_id=? AND name=?";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        return -1;
    bind_text(s, 1, job_id);
    bind_text(s, 2, name);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        artifact_from_row(s, out);
    sqlite3_reset(s);
    return rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? 1 : -1;
}

int store_artifact_list(store *st, const char *job_id, store_artifact **out, int *n)
{
    *out = NULL;
    *n = 0;
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "SELECT " ART_COLS " FROM artifacts WHERE job_id=? ORDER BY name";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        return -1;
    bind_text(s, 1, job_id);
    store_artifact *arr = NULL;
    int k = 0, rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        store_artifact *na = realloc(arr, (size_t)(k + 1) * sizeof *na);
        if (!na) {
            rc = SQLITE_NOMEM;
            break;
        }
        arr = na;
        artifact_from_row(s, &arr[k++]);
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) {
        free(arr);
        return -1;
    }
    *out = arr;
    *n = k;
    return 0;
}

/* ---- models ------------------------------------------------------------------------ */

#define MODEL_COLS "seq, id, path, tokenizer, name, format, created_at, status, url, sha256, size_bytes, " \
                   "bytes_done, bytes_total, error, updated_at"

static void model_from_row(sqlite3_stmt *s, store_model *m)
{
    memset(m, 0, sizeof *m);
    m->seq = sqlite3_column_int64(s, 0);
    col_copy(s, 1, m->id, sizeof m->id);
    col_copy(s, 2, m->path, sizeof m->path);
    col_copy(s, 3, m->tokenizer, sizeof m->tokenizer);
    col_copy(s, 4, m->name, sizeof m->name);
    col_copy(s, 5, m->format, sizeof m->format);
    m->created_at = sqlite3_column_int64(s, 6);
    col_copy(s, 7, m->status, sizeof m->status);
    col_copy(s, 8, m->url, sizeof m->url);
    col_copy(s, 9, m->sha256, sizeof m->sha256);
    m->size_bytes = sqlite3_column_int64(s, 10);
    m->bytes_done = sqlite3_column_int64(s, 11);
    m->bytes_total = sqlite3_column_int64(s, 12);
    col_copy(s, 13, m->error, sizeof m->error);
    m->updated_at = sqlite3_column_int64(s, 14);
}

/* Insert m (id and times assigned). 0 or -1 (logged). */
static int model_insert(conn *c, store_model *m)
{
    if (store_new_id("mdl_", m->id, sizeof m->id) < 0)
        return -1;
    m->created_at = m->updated_at = store_now();
    if (!m->status[0]) {   /* registered by path: nothing to download */
        snprintf(m->status, sizeof m->status, "ready");
        m->size_bytes = m->bytes_total = -1;
        m->bytes_done = 0;
    }
    static const char *sql = "INSERT INTO models(id, path, tokenizer, name, format, created_at, status, url, sha256, "
                             "size_bytes, bytes_done, bytes_total, error, updated_at) "
                             "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
    sqlite3_stmt *s = S(c, sql);
    if (!s)
        return -1;
    bind_text(s, 1, m->id);
    bind_text(s, 2, m->path);
    bind_text(s, 3, m->tokenizer);
    bind_text(s, 4, m->name);
    bind_text(s, 5, m->format);
    sqlite3_bind_int64(s, 6, m->created_at);
    bind_text(s, 7, m->status);
    bind_text(s, 8, m->url);
    bind_text(s, 9, m->sha256);
    sqlite3_bind_int64(s, 10, m->size_bytes);
    sqlite3_bind_int64(s, 11, m->bytes_done);
    sqlite3_bind_int64(s, 12, m->bytes_total);
    bind_text(s, 13, m->error);
    sqlite3_bind_int64(s, 14, m->updated_at);
    if (step_done(c, s) < 0)
        return -1;
    m->seq = sqlite3_last_insert_rowid(c->db);
    return 0;
}

int store_model_add(store *st, store_model *m)
{
    conn *c = C(st);
    if (!c)
        return -1;
    return model_insert(c, m);
}

/* The model that query q (one text parameter: key) selects on connection c: 0 found,
 * 1 absent, -1 error. q must be a static string (the statement cache keys on it). */
static int model_one(conn *c, const char *q, const char *key, store_model *out)
{
    sqlite3_stmt *s = S(c, q);
    if (!s)
        return -1;
    bind_text(s, 1, key);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        model_from_row(s, out);
    sqlite3_reset(s);
    return rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? 1 : -1;
}

/* The model with this sha256 on connection c: 0 found, 1 absent, -1 error. */
static int model_by_sha(conn *c, const char *sha, store_model *out)
{
    return model_one(c, "SELECT " MODEL_COLS " FROM models WHERE sha256=?", sha, out);
}

int store_model_get_sha(store *st, const char *sha256_hex, store_model *out)
{
    conn *c = C(st);
    return c ? model_by_sha(c, sha256_hex, out) : -1;
}

int store_model_add_fetch(store *st, store_model *m, int *restarted)
{
    *restarted = 0;
    conn *c = C(st);
    if (!c || !m->sha256[0] || begin(c) < 0)
        return -1;
    store_model *old = malloc(sizeof *old);
    if (!old)
        goto fail;
    int rc = model_by_sha(c, m->sha256, old);
    if (rc < 0)
        goto fail;
    if (rc == 0) {
        if (!strcmp(old->status, "failed")) {
            static const char *sql = "UPDATE models SET status='fetching', url=?, name=?, tokenizer=?, size_bytes=?, "
                                     "bytes_done=0, bytes_total=?, error='', updated_at=? WHERE id=?";
            sqlite3_stmt *s = S(c, sql);
            if (!s)
                goto fail;
            bind_text(s, 1, m->url);
            bind_text(s, 2, m->name);
            bind_text(s, 3, m->tokenizer);
            sqlite3_bind_int64(s, 4, m->size_bytes);
            sqlite3_bind_int64(s, 5, m->size_bytes);
            sqlite3_bind_int64(s, 6, store_now());
            bind_text(s, 7, old->id);
            if (step_done(c, s) < 0 || model_by_sha(c, m->sha256, old) != 0)
                goto fail;
            *restarted = 1;
        }
        if (commit(c) < 0)
            goto fail;
        *m = *old;
        free(old);
        return 1;
    }
    snprintf(m->status, sizeof m->status, "fetching");
    m->bytes_done = 0;
    m->bytes_total = m->size_bytes;
    m->error[0] = 0;
    if (model_insert(c, m) < 0 || commit(c) < 0)
        goto fail;
    free(old);
    return 0;
fail:
    free(old);
    rollback(c);
    return -1;
}

int store_model_next_fetch(store *st, store_model *out)
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "SELECT " MODEL_COLS " FROM models WHERE status='fetching' ORDER BY seq LIMIT 1";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        return -1;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        model_from_row(s, out);
    sqlite3_reset(s);
    return rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? 1 : -1;
}

int store_model_fetch_progress(store *st, const char *id, int64_t bytes_done, int64_t bytes_total)
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *sql = "UPDATE models SET bytes_done=?, bytes_total=?, updated_at=? "
                             "WHERE id=? AND status='fetching'";
    sqlite3_stmt *s = S(c, sql);
    if (!s)
        return -1;
    sqlite3_bind_int64(s, 1, bytes_done);
    sqlite3_bind_int64(s, 2, bytes_total);
    sqlite3_bind_int64(s, 3, store_now());
    bind_text(s, 4, id);
    return step_done(c, s);
}

int store_model_fetch_done(store *st, const char *id, const char *status, int64_t bytes, const char *error)
{
    conn *c = C(st);
    if (!c || (strcmp(status, "ready") && strcmp(status, "failed")))
        return -1;
    int ready = !strcmp(status, "ready");
    static const char *sql_ready = "UPDATE models SET status='ready', bytes_done=?, bytes_total=?, error='', "
                                   "updated_at=? WHERE id=? AND status='fetching'";
    static const char *sql_failed = "UPDATE models SET status='failed', error=?, updated_at=? "
                                    "WHERE id=? AND status='fetching'";
    sqlite3_stmt *s = S(c, ready ? sql_ready : sql_failed);
    if (!s)
        return -1;
    if (ready) {
        sqlite3_bind_int64(s, 1, bytes);
        sqlite3_bind_int64(s, 2, bytes);
        sqlite3_bind_int64(s, 3, store_now());
        bind_text(s, 4, id);
    } else {
        bind_text(s, 1, error ? error : "");
        sqlite3_bind_int64(s, 2, store_now());
        bind_text(s, 3, id);
    }
    if (step_done(c, s) < 0)
        return -1;
    return sqlite3_changes(c->db) == 1 ? 0 : 1;
}

int store_model_get(store *st, const char *id, store_model *out)
{
    conn *c = C(st);
    return c ? model_one(c, "SELECT " MODEL_COLS " FROM models WHERE id=?", id, out) : -1;
}

int store_model_list(store *st, const char *after, int limit, store_model **out, int *n,
                     int *has_more)
{
    *out = NULL;
    *n = 0;
    *has_more = 0;
    conn *c = C(st);
    if (!c)
        return -1;
    int64_t after_seq = INT64_MAX;
    if (after) {
        store_model m;
        int r = store_model_get(st, after, &m);
        if (r != 0)
            return r;
        after_seq = m.seq;
    }
    static const char *q = "SELECT " MODEL_COLS " FROM models WHERE seq<? ORDER BY seq DESC LIMIT ?";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        return -1;
    sqlite3_bind_int64(s, 1, after_seq);
    sqlite3_bind_int(s, 2, limit + 1);
    store_model *arr = calloc((size_t)limit + 1, sizeof *arr);
    if (!arr)
        return -1;
    int k = 0, rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (k == limit) {
            *has_more = 1;
            break;
        }
        model_from_row(s, &arr[k++]);
    }
    int bad = rc != SQLITE_ROW && rc != SQLITE_DONE;
    sqlite3_reset(s);
    if (bad) {
        free(arr);
        return -1;
    }
    *out = arr;
    *n = k;
    return 0;
}

int64_t store_data_version(store *st)
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "PRAGMA data_version";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        return -1;
    int64_t v = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
    sqlite3_reset(s);
    return v;
}

/* ---- webhook outbox ---------------------------------------------------------------- */

int store_webhook_due(store *st, int64_t now, int limit, store_webhook **out, int *n)
{
    *out = NULL;
    *n = 0;
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "SELECT id, job_id, url, type, payload, attempts FROM webhooks "
                           "WHERE state='pending' AND next_at<=? ORDER BY next_at LIMIT ?";
    sqlite3_stmt *s = S(c, q);
    if (!s)
        return -1;
    sqlite3_bind_int64(s, 1, now);
    sqlite3_bind_int(s, 2, limit);
    store_webhook *arr = calloc((size_t)limit, sizeof *arr);
    if (!arr) {
        sqlite3_reset(s);
        return -1;
    }
    int k = 0, rc;
    while (k < limit && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        store_webhook *w = &arr[k++];
        col_copy(s, 0, w->id, sizeof w->id);
        col_copy(s, 1, w->job_id, sizeof w->job_id);
        col_copy(s, 2, w->url, sizeof w->url);
        col_copy(s, 3, w->type, sizeof w->type);
        const char *p = (const char *)sqlite3_column_text(s, 4);
        w->payload = strdup(p ? p : "{}");
        w->attempts = sqlite3_column_int(s, 5);
    }
    sqlite3_reset(s);
    *out = arr;
    *n = k;
    return 0;
}

void store_webhook_list_free(store_webhook *w, int n)
{
    for (int i = 0; i < n; i++)
        free(w[i].payload);
    free(w);
}

int store_webhook_result(store *st, const char *id, const char *job_id, int delivered, int give_up,
                         int64_t next_at, const char *error)
{
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *u = "UPDATE webhooks SET attempts=attempts+1, state=?, next_at=?, last_error=?, "
                           "delivered_at=? WHERE id=? AND state='pending'";
    sqlite3_stmt *s = S(c, u);
    if (!s)
        goto fail;
    const char *state = delivered ? "delivered" : give_up ? "failed" : "pending";
    bind_text(s, 1, state);
    sqlite3_bind_int64(s, 2, next_at);
    bind_text(s, 3, error ? error : "");
    sqlite3_bind_int64(s, 4, delivered ? store_now() : 0);
    bind_text(s, 5, id);
    if (step_done(c, s) < 0)
        goto fail;
    if (delivered || give_up) {
        char msg[600];
        snprintf(msg, sizeof msg, delivered ? "webhook %s delivered" : "webhook %s failed for good: %s", id,
                 error ? error : "");
        json_t *d = json_pack("{s:s}", "id", id);
        int rc = event_insert(c, job_id, delivered ? "webhook.delivered" : "webhook.failed", msg, d);
        json_decref(d);
        if (rc < 0)
            goto fail;
    }
    if (commit(c) < 0)
        goto fail;
    return 0;
fail:
    rollback(c);
    return -1;
}
