/* storage/store.c — the SQLite job store (see store.h). Each thread uses its own
 * connection with a cache of prepared statements keyed by the SQL literal's address.
 * Writes run in BEGIN IMMEDIATE transactions with a busy timeout, so the server's threads
 * and the worker processes serialize on the database file, never on a process lock.
 */
#include "storage/store.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
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

/* Roll back the current transaction and return ret (the caller's status). */
static int abandon(conn *c, int ret)
{
    rollback(c);
    return ret;
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

/* ---- statement helpers ----------------------------------------------------------------
 * A bind format has one letter per `?` of the statement, in order:
 *   t  const char *  text; NULL binds ''
 *   z  const char *  text; NULL binds SQL NULL
 *   i  int
 *   I  int64_t       (pass an int64_t, never a plain int literal)
 * A column format has one letter per column read, from column 0:
 *   t  char *dst, size_t size   text copied ("" for NULL)
 *   s  char **                  text strdup'd ("" for NULL; NULL when out of memory)
 *   i  int *          I  int64_t *          j  json_t ** (NEW reference or NULL)
 *   r  row_reader, void *out    the whole row (alone in the format)
 * SQL arguments must be static literals: the statement cache keys on their address. */

/* Fills *out (a store_job, store_event, ...) from the current row of s. */
typedef void (*row_reader)(sqlite3_stmt *s, void *out);

/* Bind fmt's arguments to s. 0 or -1 (logged). */
static int bind_va(sqlite3_stmt *s, const char *fmt, va_list *ap)
{
    int n = (int)strlen(fmt);
    if (n != sqlite3_bind_parameter_count(s)) {
        fprintf(stderr, "store: %d binds for %d parameters (%s)\n", n, sqlite3_bind_parameter_count(s),
                sqlite3_sql(s));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int rc = SQLITE_MISUSE;
        const char *t;
        switch (fmt[i]) {
        case 't':
            t = va_arg(*ap, const char *);
            rc = sqlite3_bind_text(s, i + 1, t ? t : "", -1, SQLITE_TRANSIENT);
            break;
        case 'z':
            t = va_arg(*ap, const char *);
            rc = t ? sqlite3_bind_text(s, i + 1, t, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(s, i + 1);
            break;
        case 'i':
            rc = sqlite3_bind_int(s, i + 1, va_arg(*ap, int));
            break;
        case 'I':
            rc = sqlite3_bind_int64(s, i + 1, va_arg(*ap, int64_t));
            break;
        }
        if (rc != SQLITE_OK) {
            fprintf(stderr, "store: bind %d ('%c'): %s (%s)\n", i + 1, fmt[i], sqlite3_errstr(rc), sqlite3_sql(s));
            return -1;
        }
    }
    return 0;
}

/* The cached statement for sql with fmt's arguments bound; NULL on failure (logged). */
static sqlite3_stmt *stmt_va(conn *c, const char *sql, const char *fmt, va_list *ap)
{
    sqlite3_stmt *s = S(c, sql);
    return s && bind_va(s, fmt, ap) == 0 ? s : NULL;
}

static sqlite3_stmt *stmt(conn *c, const char *sql, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sqlite3_stmt *s = stmt_va(c, sql, fmt, &ap);
    va_end(ap);
    return s;
}

/* Run a statement that returns no rows (INSERT, UPDATE, DELETE) with fmt's arguments.
 * Returns the number of rows it changed, or -1 (logged). */
static int run(conn *c, const char *sql, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sqlite3_stmt *s = stmt_va(c, sql, fmt, &ap);
    va_end(ap);
    if (!s || step_done(c, s) < 0)
        return -1;
    return sqlite3_changes(c->db);
}

/* Store the current row of s into the outputs that cols names. 0, or -1 on a bad format. */
static int cols_read(sqlite3_stmt *s, const char *cols, va_list *ap)
{
    if (cols[0] == 'r') {
        row_reader rd = va_arg(*ap, row_reader);
        rd(s, va_arg(*ap, void *));
        return 0;
    }
    if ((int)strlen(cols) > sqlite3_column_count(s))
        return -1;
    for (int i = 0; cols[i]; i++) {
        switch (cols[i]) {
        case 't': {
            char *dst = va_arg(*ap, char *);
            col_copy(s, i, dst, va_arg(*ap, size_t));
            break;
        }
        case 's': {
            const char *t = (const char *)sqlite3_column_text(s, i);
            *va_arg(*ap, char **) = strdup(t ? t : "");
            break;
        }
        case 'i':
            *va_arg(*ap, int *) = sqlite3_column_int(s, i);
            break;
        case 'I':
            *va_arg(*ap, int64_t *) = sqlite3_column_int64(s, i);
            break;
        case 'j':
            *va_arg(*ap, json_t **) = col_json(s, i);
            break;
        default:
            return -1;
        }
    }
    return 0;
}

/* Run a query with fmt's arguments (then cols' outputs, in that order) and read its first
 * row. Returns 0 (outputs filled), 1 when there is no row (outputs untouched), -1 on error
 * (a failed step is not logged; the caller reports it). */
static int row(conn *c, const char *sql, const char *fmt, const char *cols, ...)
{
    va_list ap;
    va_start(ap, cols);
    sqlite3_stmt *s = stmt_va(c, sql, fmt, &ap);
    int rc = s ? sqlite3_step(s) : SQLITE_ERROR;
    if (rc == SQLITE_ROW && cols_read(s, cols, &ap) < 0)
        rc = SQLITE_MISUSE;
    va_end(ap);
    if (s)
        sqlite3_reset(s);
    return rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? 1 : -1;
}

/* Read the rows of s (prepared and bound, its LIMIT at most limit + 1) into a new array of
 * at most `limit` elements of elem_size bytes, each filled by rd; *has_more (when not NULL)
 * is set when a row beyond `limit` exists. Returns the array (malloc'd, caller frees; *n
 * elements) or NULL on error, after releasing the rows read with clear (when not NULL).
 * s is reset either way. */
static void *rows_read(sqlite3_stmt *s, int limit, size_t elem_size, row_reader rd,
                       void (*clear)(void *elem), int *n, int *has_more)
{
    *n = 0;
    char *arr = calloc((size_t)limit + 1, elem_size);
    if (!arr) {
        sqlite3_reset(s);
        return NULL;
    }
    int k = 0, rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (k == limit) {
            if (has_more)
                *has_more = 1;
            break;
        }
        rd(s, arr + (size_t)k++ * elem_size);
    }
    sqlite3_reset(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        for (int i = 0; clear && i < k; i++)
            clear(arr + (size_t)i * elem_size);
        free(arr);
        return NULL;
    }
    *n = k;
    return arr;
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

/* Inside a transaction (or alone). data is stolen (a NEW reference, or NULL). 0 or -1. */
static int event_insert(conn *c, const char *job_id, const char *type, const char *message,
                        json_t *data)
{
    char *dt = data ? json_dumps(data, JSON_COMPACT) : NULL;
    int lost = data && !dt;
    json_decref(data);
    if (lost)
        return -1;
    int rc = run(c, SQL_EVENT_INSERT, "tttzI", job_id, type, message, dt, store_now());
    free(dt);
    return rc < 0 ? -1 : 0;
}

/* Bump a job's version and updated_at, so that its ETag changes. 0 or -1 (logged). */
static int job_touch(conn *c, const char *id)
{
    static const char *bump = "UPDATE jobs SET version=version+1, updated_at=? WHERE id=?";
    return run(c, bump, "It", store_now(), id) < 0 ? -1 : 0;
}

int store_event_append(store *st, const char *job_id, const char *type, const char *message,
                       json_t *data)
{
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    if (job_touch(c, job_id) < 0 || event_insert(c, job_id, type, message, json_incref(data)) < 0 ||
        commit(c) < 0)
        return abandon(c, -1);
    return 0;
}

static void event_from_row(sqlite3_stmt *s, void *out)
{
    store_event *e = out;
    e->seq = sqlite3_column_int64(s, 0);
    snprintf(e->id, sizeof e->id, "evt_%016lld", (long long)e->seq);
    col_copy(s, 1, e->job_id, sizeof e->job_id);
    col_copy(s, 2, e->type, sizeof e->type);
    const char *m = (const char *)sqlite3_column_text(s, 3);
    e->message = strdup(m ? m : "");
    e->data = col_json(s, 4);
    e->created_at = sqlite3_column_int64(s, 5);
}

static void event_clear_elem(void *e)
{
    store_event_clear(e);
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
    sqlite3_stmt *s = stmt(c, sql, "tIi", job_id, after_seq, limit + 1);
    if (!s)
        return -1;
    *out = rows_read(s, limit, sizeof **out, event_from_row, event_clear_elem, n, has_more);
    return *out ? 0 : -1;
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

static void job_from_row(sqlite3_stmt *s, void *out)
{
    store_job *j = out;
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

static void job_clear_elem(void *j)
{
    store_job_clear(j);
}

static int job_get_conn(conn *c, const char *id, store_job *out)
{
    static const char *sql = "SELECT " JOB_COLS " FROM jobs WHERE id=?";
    return row(c, sql, "t", "r", id, job_from_row, out);
}

/* End the current write transaction with job id read into out (as store_job_get does).
 * 0 (out filled; store_job_clear it) or -1 (rolled back; out holds nothing). */
static int commit_job(conn *c, const char *id, store_job *out)
{
    if (job_get_conn(c, id, out) != 0)
        return abandon(c, -1);
    if (commit(c) < 0) {
        store_job_clear(out);
        return abandon(c, -1);
    }
    return 0;
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
    return row(c, sql, "t", "It", id, version, status, (size_t)16);
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
        int rc = row(c, q, "tt", "", idem_scope, idem_key);
        if (rc < 0)
            goto fail;
        if (rc == 0) {
            rollback(c);
            ret = 1;
            goto out;
        }
        static const char *ins = "INSERT INTO idempotency(scope, key, body_sha256, job_id, status, "
                                 "response, created_at) VALUES (?,?,?,?,?,?,?)";
        if (run(c, ins, "ttttitI", idem_scope, idem_key, body_sha256, j->id, resp_status, resp_text,
                store_now()) < 0)
            goto fail;
    }
    int64_t now = j->created_at ? j->created_at : store_now();
    static const char *ins = "INSERT INTO jobs(id, kind, status, device, name, spec, stages, "
                             "created_at, updated_at) VALUES (?,?,'queued',?,?,?,?,?,?)";
    if (run(c, ins, "ttttttII", j->id, j->kind, j->device, j->name, spec, stages, now, now) < 0)
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
    int rc = row(c, sql, "tt", "tis", scope, key, sha256_out, (size_t)65, resp_status, resp_text);
    return rc == 0 && !*resp_text ? -1 : rc;
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
        int rc = row(c, q, "tt", "I", after, kind, &after_seq);
        if (rc != 0)
            return rc;
    }
    static const char *sql = "SELECT " JOB_COLS " FROM jobs WHERE kind=? AND seq<? ORDER BY seq DESC LIMIT ?";
    sqlite3_stmt *s = stmt(c, sql, "tIi", kind, after_seq, limit + 1);
    if (!s)
        return -1;
    *out = rows_read(s, limit, sizeof **out, job_from_row, job_clear_elem, n, has_more);
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
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *q = "SELECT id FROM jobs WHERE status='queued' AND device=? ORDER BY seq LIMIT 1";
    char id[48] = "";
    int rc = row(c, q, "t", "t", device, id, sizeof id);
    if (rc != 0)
        return abandon(c, rc);
    int64_t now = store_now();
    static const char *u = "UPDATE jobs SET status='running', attempts=attempts+1, worker_pid=0, "
                           "started_at=CASE WHEN started_at=0 THEN ? ELSE started_at END, "
                           "version=version+1, updated_at=? WHERE id=?";
    if (run(c, u, "IIt", now, now, id) < 0 || event_insert(c, id, "job.started", "worker starting", NULL) < 0)
        return abandon(c, -1);
    return commit_job(c, id, out);
}

int store_job_set_pid(store *st, const char *id, int pid)
{
    conn *c = C(st);
    static const char *sql = "UPDATE jobs SET worker_pid=?, updated_at=? WHERE id=?";
    return c && run(c, sql, "iIt", pid, store_now(), id) >= 0 ? 0 : -1;
}

int store_job_progress(store *st, const char *id, int64_t step, int64_t total)
{
    conn *c = C(st);
    static const char *sql = "UPDATE jobs SET step=?, total_steps=?, version=version+1, updated_at=? WHERE id=?";
    return c && run(c, sql, "IIIt", step, total, store_now(), id) >= 0 ? 0 : -1;
}

int store_job_stage_begin(store *st, const char *id, int index, const char *name)
{
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *sql = "UPDATE jobs SET stage=?, step=0, total_steps=0, version=version+1, "
                             "updated_at=? WHERE id=? AND stage_index=?";
    if (run(c, sql, "tIti", name, store_now(), id, index) < 0)
        return abandon(c, -1);
    char msg[128];
    snprintf(msg, sizeof msg, "stage %s started", name);
    json_t *d = json_pack("{s:s,s:i}", "stage", name, "index", index);
    if (event_insert(c, id, "stage.started", msg, d) < 0 || commit(c) < 0)
        return abandon(c, -1);
    return 0;
}

/* Read, modify and write the report inside the current transaction. */
static int report_update(conn *c, const char *id, json_t *fragment, const char *append_stage,
                         double wall_s, int attempt)
{
    static const char *q = "SELECT report FROM jobs WHERE id=?";
    json_t *r = NULL;
    if (row(c, q, "t", "j", id, &r) != 0)
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
    int rc = run(c, u, "tIt", text, store_now(), id);
    free(text);
    return rc < 0 ? -1 : 0;
}

int store_job_stage_done(store *st, const char *id, int index, const char *name, double wall_s)
{
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *sql = "UPDATE jobs SET stage_index=?, version=version+1, updated_at=? "
                             "WHERE id=? AND stage_index=?";
    int changed = run(c, sql, "iIti", index + 1, store_now(), id, index);
    if (changed < 0)
        return abandon(c, -1);
    if (changed == 0) /* already recorded (or not this stage): no-op */
        return abandon(c, 0);
    static const char *qa = "SELECT attempts FROM jobs WHERE id=?";
    int attempt = 0;
    if (row(c, qa, "t", "i", id, &attempt) < 0 || report_update(c, id, NULL, name, wall_s, attempt) < 0)
        return abandon(c, -1);
    char msg[128];
    snprintf(msg, sizeof msg, "stage %s completed in %.3f s", name, wall_s);
    json_t *d = json_pack("{s:s,s:i,s:f}", "stage", name, "index", index, "wall_s", wall_s);
    if (event_insert(c, id, "stage.completed", msg, d) < 0 || commit(c) < 0)
        return abandon(c, -1);
    return 0;
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
    char kind[16];
    json_t *spec = NULL;
    if (row(c, q, "t", "tj", id, kind, sizeof kind, &spec) != 0)
        return -1;
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
    int rc = text && run(c, ins, "tttttII", msg_id, id, url, type, text, now, now) >= 0 ? 0 : -1;
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
    char cur[16] = "";
    if (row(c, q, "t", "t", id, cur, sizeof cur) != 0)
        return abandon(c, -1);
    if (is_terminal(cur))
        return abandon(c, 1);
    int64_t now = store_now();
    static const char *u = "UPDATE jobs SET status=?, error_code=?, error_message=?, worker_pid=0, "
                           "finished_at=?, version=version+1, updated_at=? WHERE id=?";
    if (run(c, u, "tttIIt", status, code, message, now, now, id) < 0)
        return abandon(c, -1);
    char type[48];
    snprintf(type, sizeof type, "job.%s", status);
    if (webhook_enqueue(c, id, type, status, code, message, now) < 0)
        return abandon(c, -1);
    json_t *d = code ? json_pack("{s:s,s:s}", "code", code, "message", message ? message : "") : NULL;
    char msg[1200];
    snprintf(msg, sizeof msg, "job %s%s%s", status, message ? ": " : "", message ? message : "");
    if (event_insert(c, id, type, msg, d) < 0 || commit(c) < 0)
        return abandon(c, -1);
    return 0;
}

int store_job_requeue(store *st, const char *id, const char *reason)
{
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *u = "UPDATE jobs SET status='queued', worker_pid=0, version=version+1, "
                           "updated_at=? WHERE id=? AND status='running'";
    int changed = run(c, u, "It", store_now(), id);
    if (changed < 0)
        return abandon(c, -1);
    if (changed == 0)
        return abandon(c, 1);
    if (event_insert(c, id, "job.requeued", reason, NULL) < 0 || commit(c) < 0)
        return abandon(c, -1);
    return 0;
}

int store_recover(store *st, int max_attempts)
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "SELECT id, cancel_requested, attempts, stage FROM jobs WHERE status='running' "
                           "ORDER BY seq";
    sqlite3_stmt *s = S(c, q);
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
        col_copy(s, 0, left[n].id, sizeof left[n].id);
        left[n].cancel = sqlite3_column_int(s, 1);
        left[n].attempts = sqlite3_column_int(s, 2);
        col_copy(s, 3, left[n].stage, sizeof left[n].stage);
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
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *q = "SELECT status, cancel_requested FROM jobs WHERE id=?";
    char cur[16] = "";
    int requested = 0;
    int rc = row(c, q, "t", "ti", id, cur, sizeof cur, &requested);
    if (rc != 0)
        return abandon(c, rc);
    int64_t now = store_now();
    if (!strcmp(cur, "queued")) {
        static const char *u = "UPDATE jobs SET status='cancelled', cancel_requested=1, finished_at=?, "
                               "version=version+1, updated_at=? WHERE id=?";
        if (run(c, u, "IIt", now, now, id) < 0 ||
            event_insert(c, id, "job.cancelled", "job cancelled before it started", NULL) < 0)
            return abandon(c, -1);
    } else if (!strcmp(cur, "running") && !requested) {
        static const char *u = "UPDATE jobs SET cancel_requested=1, version=version+1, updated_at=? WHERE id=?";
        if (run(c, u, "It", now, id) < 0 ||
            event_insert(c, id, "job.cancel_requested", "cancellation requested", NULL) < 0)
            return abandon(c, -1);
    }
    return commit_job(c, id, out);
}

int store_job_cancel_requested(store *st, const char *id)
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "SELECT cancel_requested FROM jobs WHERE id=?";
    int v = -1;
    return row(c, q, "t", "i", id, &v) == 0 ? v : -1;
}

int store_job_delete(store *st, const char *id, char ***orphans, int *n_orphans)
{
    *orphans = NULL;
    *n_orphans = 0;
    conn *c = C(st);
    if (!c || begin(c) < 0)
        return -1;
    static const char *q = "SELECT status FROM jobs WHERE id=?";
    char cur[16] = "";
    int rc = row(c, q, "t", "t", id, cur, sizeof cur);
    if (rc != 0)
        return abandon(c, rc);
    if (!is_terminal(cur))
        return abandon(c, 2);
    static const char *qo = "SELECT DISTINCT a.sha256 FROM artifacts a WHERE a.job_id=? AND NOT EXISTS "
                            "(SELECT 1 FROM artifacts b WHERE b.sha256=a.sha256 AND b.job_id<>a.job_id)";
    sqlite3_stmt *s = stmt(c, qo, "t", id);
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
        if (run(c, dels[i], "t", id) < 0)
            goto fail_list;
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
    return abandon(c, -1);
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

static void artifact_from_row(sqlite3_stmt *s, void *out)
{
    store_artifact *a = out;
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
    if (run(c, sql, "tttttItI", a->id, a->job_id, a->name, a->stage, a->sha256, a->size_bytes,
            a->content_type, a->created_at) < 0)
        return abandon(c, -1);
    char msg[320];
    snprintf(msg, sizeof msg, "artifact %s published", a->name);
    json_t *d = json_pack("{s:s,s:s,s:s,s:I}", "id", a->id, "name", a->name, "sha256", a->sha256,
                          "size_bytes", (json_int_t)a->size_bytes);
    if (event_insert(c, a->job_id, "artifact.published", msg, d) < 0 || job_touch(c, a->job_id) < 0 ||
        commit(c) < 0)
        return abandon(c, -1);
    return 0;
}

#define ART_COLS "id, job_id, name, stage, sha256, size_bytes, content_type, created_at"

int store_artifact_get(store *st, const char *job_id, const char *name, store_artifact *out)
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "SELECT " ART_COLS " FROM artifacts WHERE job_id=? AND name=?";
    return row(c, q, "tt", "r", job_id, name, artifact_from_row, out);
}

int store_artifact_list(store *st, const char *job_id, store_artifact **out, int *n)
{
    *out = NULL;
    *n = 0;
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "SELECT " ART_COLS " FROM artifacts WHERE job_id=? ORDER BY name";
    sqlite3_stmt *s = stmt(c, q, "t", job_id);
    if (!s)
        return -1;
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

static void model_from_row(sqlite3_stmt *s, void *out)
{
    store_model *m = out;
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
    if (run(c, sql, "tttttItttIIItI", m->id, m->path, m->tokenizer, m->name, m->format, m->created_at,
            m->status, m->url, m->sha256, m->size_bytes, m->bytes_done, m->bytes_total, m->error,
            m->updated_at) < 0)
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

/* The model with this sha256 on connection c: 0 found, 1 absent, -1 error. */
static int model_by_sha(conn *c, const char *sha, store_model *out)
{
    static const char *q = "SELECT " MODEL_COLS " FROM models WHERE sha256=?";
    return row(c, q, "t", "r", sha, model_from_row, out);
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
            if (run(c, sql, "tttIIIt", m->url, m->name, m->tokenizer, m->size_bytes, m->size_bytes, store_now(),
                    old->id) < 0 ||
                model_by_sha(c, m->sha256, old) != 0)
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
    return row(c, q, "", "r", model_from_row, out);
}

int store_model_fetch_progress(store *st, const char *id, int64_t bytes_done, int64_t bytes_total)
{
    conn *c = C(st);
    static const char *sql = "UPDATE models SET bytes_done=?, bytes_total=?, updated_at=? "
                             "WHERE id=? AND status='fetching'";
    return c && run(c, sql, "IIIt", bytes_done, bytes_total, store_now(), id) >= 0 ? 0 : -1;
}

int store_model_fetch_done(store *st, const char *id, const char *status, int64_t bytes, const char *error)
{
    conn *c = C(st);
    if (!c || (strcmp(status, "ready") && strcmp(status, "failed")))
        return -1;
    static const char *sql_ready = "UPDATE models SET status='ready', bytes_done=?, bytes_total=?, error='', "
                                   "updated_at=? WHERE id=? AND status='fetching'";
    static const char *sql_failed = "UPDATE models SET status='failed', error=?, updated_at=? "
                                    "WHERE id=? AND status='fetching'";
    int changed = !strcmp(status, "ready") ? run(c, sql_ready, "IIIt", bytes, bytes, store_now(), id)
                                           : run(c, sql_failed, "tIt", error, store_now(), id);
    if (changed < 0)
        return -1;
    return changed == 1 ? 0 : 1;
}

int store_model_get(store *st, const char *id, store_model *out)
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "SELECT " MODEL_COLS " FROM models WHERE id=?";
    return row(c, q, "t", "r", id, model_from_row, out);
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
    sqlite3_stmt *s = stmt(c, q, "Ii", after_seq, limit + 1);
    if (!s)
        return -1;
    *out = rows_read(s, limit, sizeof **out, model_from_row, NULL, n, has_more);
    return *out ? 0 : -1;
}

int64_t store_data_version(store *st)
{
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "PRAGMA data_version";
    int64_t v = -1;
    return row(c, q, "", "I", &v) == 0 ? v : -1;
}

/* ---- webhook outbox ---------------------------------------------------------------- */

static void webhook_from_row(sqlite3_stmt *s, void *out)
{
    store_webhook *w = out;
    col_copy(s, 0, w->id, sizeof w->id);
    col_copy(s, 1, w->job_id, sizeof w->job_id);
    col_copy(s, 2, w->url, sizeof w->url);
    col_copy(s, 3, w->type, sizeof w->type);
    const char *p = (const char *)sqlite3_column_text(s, 4);
    w->payload = strdup(p ? p : "{}");
    w->attempts = sqlite3_column_int(s, 5);
}

static void webhook_clear_elem(void *w)
{
    free(((store_webhook *)w)->payload);
}

int store_webhook_due(store *st, int64_t now, int limit, store_webhook **out, int *n)
{
    *out = NULL;
    *n = 0;
    conn *c = C(st);
    if (!c)
        return -1;
    static const char *q = "SELECT id, job_id, url, type, payload, attempts FROM webhooks "
                           "WHERE state='pending' AND next_at<=? ORDER BY next_at LIMIT ?";
    sqlite3_stmt *s = stmt(c, q, "Ii", now, limit);
    if (!s)
        return -1;
    *out = rows_read(s, limit, sizeof **out, webhook_from_row, webhook_clear_elem, n, NULL);
    return *out ? 0 : -1;
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
    const char *state = delivered ? "delivered" : give_up ? "failed" : "pending";
    int64_t delivered_at = delivered ? store_now() : 0;
    if (run(c, u, "tItIt", state, next_at, error, delivered_at, id) < 0)
        return abandon(c, -1);
    if (delivered || give_up) {
        char msg[600];
        snprintf(msg, sizeof msg, delivered ? "webhook %s delivered" : "webhook %s failed for good: %s", id,
                 error ? error : "");
        if (event_insert(c, job_id, delivered ? "webhook.delivered" : "webhook.failed", msg,
                         json_pack("{s:s}", "id", id)) < 0)
            return abandon(c, -1);
    }
    if (commit(c) < 0)
        return abandon(c, -1);
    return 0;
}
