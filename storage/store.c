/* storage/store.c — the job store's core (see store.h, store_internal.h): open and
 * migrations, one connection per thread with a cache of prepared statements keyed by the
 * SQL literal's address, and the statement helpers every query goes through, over either
 * driver (store_sqlite.c, store_pg.c). A lost connection (a PostgreSQL restart) is
 * reopened on the thread's next use. The tables are read and written by store_jobs.c,
 * store_events.c, store_artifacts.c, store_models.c, store_outbox.c and store_idem.c.
 */
#include "storage/store_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "storage/artstore.h"
#include "storage/utf8.h"

#define STMT_CACHE 96

struct store_conn {
    const store_driver *drv;
    void *db;
    int tx;                      /* inside sql_begin .. commit/rollback */
    struct { const char *sql; sql_stmt *st; } cache[STMT_CACHE];
    int ncache;
    store *owner;
    struct store_conn *next;
};

struct store {
    char *target;                /* the SQLite file or the postgresql:// URI */
    const store_driver *drv;
    pthread_key_t key;
    pthread_mutex_t mu;
    store_conn *all;
    int schema_version;
    char fence_id[48];           /* store_fence_job: the job this handle writes as one attempt */
    int fence_attempt;
};

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
    art_hex(r, sizeof r, out + pl);
    return 0;
}

void store_fence_job(store *st, const char *id, int attempt)
{
    snprintf(st->fence_id, sizeof st->fence_id, "%s", id);
    st->fence_attempt = attempt;
}

int store_fence_attempt(store_conn *c, const char *id)
{
    const store *st = c->owner;
    return st->fence_attempt > 0 && !strcmp(st->fence_id, id) ? st->fence_attempt : 0;
}

/* 1 when target names a PostgreSQL database rather than an SQLite file. */
static int is_url(const char *target)
{
    return !strncmp(target, "postgresql://", 13) || !strncmp(target, "postgres://", 11);
}

static void conn_forget_statements(store_conn *c)
{
    for (int i = 0; i < c->ncache; i++) {
        c->drv->finalize(c->cache[i].st->impl);
        free(c->cache[i].st);
    }
    c->ncache = 0;
}

static void conn_close(store_conn *c)
{
    conn_forget_statements(c);
    c->drv->close(c->db);
    free(c);
}

/* Why a connection could not be opened, said at most once every 10 s per process: while
 * a database is down every thread's every call fails the same way. */
static void say_unreachable(const char *err)
{
    static _Atomic int64_t last;
    int64_t now = store_now(), was = last;
    if (now - was >= 10 && atomic_compare_exchange_strong(&last, &was, now))
        fprintf(stderr, "store: %s (said again in 10 s while it lasts)\n", err);
}

/* A lost connection (the server restarted) is replaced in place, with new statements:
 * the caller's pointer stays good. Only between transactions. 0, or -1 (logged) while
 * the server is still away. */
static int conn_reopen(store_conn *c)
{
    char err[512];
    void *db = c->drv->open(c->owner->target, err, sizeof err);
    if (!db) {
        say_unreachable(err);
        return -1;
    }
    conn_forget_statements(c);
    c->drv->close(c->db);
    c->db = db;
    c->tx = 0;
    return 0;
}

/* After a failure outside a transaction: 1 when the connection was lost and is open
 * again, so the statement may run once more. */
static int conn_recovered(store_conn *c)
{
    return !c->tx && c->drv->alive(c->db) != 0 && conn_reopen(c) == 0;
}

static void conn_unlink(store *st, store_conn *c)
{
    pthread_mutex_lock(&st->mu);
    for (store_conn **p = &st->all; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    pthread_mutex_unlock(&st->mu);
}

static void conn_destructor(void *p)
{
    store_conn *c = p;
    conn_unlink(c->owner, c);
    conn_close(c);
}

static store_conn *conn_open(store *st, char *err, size_t errlen)
{
    store_conn *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->drv = st->drv;
    if (!(c->db = c->drv->open(st->target, err, errlen))) {
        free(c);
        return NULL;
    }
    c->owner = st;
    return c;
}

store_conn *store_conn_get(store *st)
{
    store_conn *c = pthread_getspecific(st->key);
    if (c)   /* one lost with its server is reopened here, or at its next failure */
        return c->drv->alive(c->db) == 0 || conn_reopen(c) == 0 ? c : NULL;
    char err[512];
    c = conn_open(st, err, sizeof err);
    if (!c) {
        say_unreachable(err);
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

/* The cached statement for a static SQL literal (SQL arguments are static literals: the
 * cache keys on their address); NULL on failure (logged). A full cache is a programming
 * error: every statement of the store fits. */
static sql_stmt *prepared(store_conn *c, const char *sql)
{
    for (int i = 0; i < c->ncache; i++)
        if (c->cache[i].sql == sql) {
            c->drv->reset(c->cache[i].st->impl);
            return c->cache[i].st;
        }
    if (c->ncache == STMT_CACHE) {
        fprintf(stderr, "store: more than %d statements (%s)\n", STMT_CACHE, sql);
        return NULL;
    }
    sql_stmt *s = malloc(sizeof *s);
    if (!s || !(s->impl = c->drv->prepare(c->db, sql))) {
        fprintf(stderr, "store: prepare failed: %s (%s)\n", s ? c->drv->errmsg(c->db) : "out of memory", sql);
        free(s);
        return NULL;
    }
    s->drv = c->drv;
    c->cache[c->ncache].sql = sql;
    c->cache[c->ncache].st = s;
    c->ncache++;
    return s;
}

static int exec(store_conn *c, const char *sql)
{
    if (c->drv->exec(c->db, sql) < 0) {
        fprintf(stderr, "store: %s: %s\n", sql, c->drv->errmsg(c->db));
        return -1;
    }
    return 0;
}

int sql_begin(store_conn *c)
{
    if (c->drv->exec(c->db, c->drv->begin_sql) < 0 && !(conn_recovered(c) && c->drv->exec(c->db, c->drv->begin_sql) == 0)) {
        fprintf(stderr, "store: %s: %s\n", c->drv->begin_sql, c->drv->errmsg(c->db));
        return -1;
    }
    c->tx = 1;
    return 0;
}

int sql_commit(store_conn *c)
{
    int rc = exec(c, "COMMIT");
    c->tx = 0;
    if (rc < 0)
        return -1;
    if (c->drv->committed)
        c->drv->committed(c->db);
    return 0;
}

void sql_rollback(store_conn *c)
{
    if (c->tx)
        (void)c->drv->exec(c->db, "ROLLBACK");
    c->tx = 0;
}

int sql_abandon(store_conn *c, int ret)
{
    sql_rollback(c);
    return ret;
}

const char *sql_errmsg(store_conn *c)
{
    return c->drv->errmsg(c->db);
}

/* Column i of the current row: text copied into dst (n bytes, "" for NULL; cut where it
 * does not fit at a character's start), or parsed as JSON (a NEW reference, NULL for NULL
 * or bad JSON). */
static void col_copy(sql_stmt *s, int i, char *dst, size_t n)
{
    const char *t = s->drv->text(s->impl, i);
    utf8_cut(dst, n, t ? t : "");
}

static json_t *col_json(sql_stmt *s, int i)
{
    const char *t = s->drv->text(s->impl, i);
    return t ? json_loads(t, 0, NULL) : NULL;
}

/* ---- statement helpers (formats: store_internal.h) ------------------------------------ */

/* fmt's arguments (store_internal.h) as values, into p (32 at most). Returns how many, or
 * -1 (logged) for a bad format. */
static int params_va(const char *sql, const char *fmt, va_list *ap, sql_param p[32])
{
    int n = (int)strlen(fmt);
    if (n > 32) {
        fprintf(stderr, "store: %d binds (%s)\n", n, sql);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        p[i].type = 't';
        p[i].text = NULL;
        p[i].i = 0;
        switch (fmt[i]) {
        case 't':
            p[i].text = va_arg(*ap, const char *);
            if (!p[i].text)
                p[i].text = "";
            break;
        case 'z':
            p[i].text = va_arg(*ap, const char *);
            break;
        case 'i':
            p[i].type = 'I';
            p[i].i = va_arg(*ap, int);
            break;
        case 'I':
            p[i].type = 'I';
            p[i].i = va_arg(*ap, int64_t);
            break;
        default:
            fprintf(stderr, "store: bind format '%c' (%s)\n", fmt[i], sql);
            return -1;
        }
    }
    return n;
}

/* The cached statement for sql with the n values p bound, run; NULL on failure (logged). */
static sql_stmt *run_params(store_conn *c, const char *sql, const sql_param *p, int n)
{
    sql_stmt *s = prepared(c, sql);
    if (!s)
        return NULL;
    if (n != c->drv->nparams(s->impl)) {
        fprintf(stderr, "store: %d binds for %d parameters (%s)\n", n, c->drv->nparams(s->impl), sql);
        return NULL;
    }
    if (c->drv->run(s->impl, p, n) < 0) {
        fprintf(stderr, "store: %s (%s)\n", c->drv->errmsg(c->db), sql);
        c->drv->reset(s->impl);
        return NULL;
    }
    return s;
}

/* The cached statement for sql, fmt's arguments (taken from ap, which is left after
 * them) bound and run; NULL on failure (logged). Outside a transaction a statement that
 * failed because the connection was lost runs once more on a new one. */
static sql_stmt *query_va(store_conn *c, const char *sql, const char *fmt, va_list *ap)
{
    sql_param p[32];
    int n = params_va(sql, fmt, ap, p);
    if (n < 0)
        return NULL;
    sql_stmt *s = run_params(c, sql, p, n);
    if (!s && conn_recovered(c))
        s = run_params(c, sql, p, n);
    return s;
}

sql_stmt *sql_query(store_conn *c, const char *sql, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sql_stmt *s = query_va(c, sql, fmt, &ap);
    va_end(ap);
    return s;
}

int sql_run(store_conn *c, const char *sql, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sql_stmt *s = query_va(c, sql, fmt, &ap);
    va_end(ap);
    if (!s)
        return -1;
    int rc;
    while ((rc = c->drv->step(s->impl)) == 1)
        ;
    if (rc < 0) {
        fprintf(stderr, "store: %s (%s)\n", c->drv->errmsg(c->db), sql);
        c->drv->reset(s->impl);
        return -1;
    }
    int64_t changed = c->drv->changes(s->impl);
    c->drv->reset(s->impl);
    if (c->drv->committed && !c->tx)   /* a statement alone commits */
        c->drv->committed(c->db);
    return (int)changed;
}

/* Store the current row of s into the outputs that cols names. 0, or -1 on a bad format. */
static int cols_read(sql_stmt *s, const char *cols, va_list *ap)
{
    if (cols[0] == 'r') {
        sql_row_reader rd = va_arg(*ap, sql_row_reader);
        rd(s, va_arg(*ap, void *));
        return 0;
    }
    if ((int)strlen(cols) > s->drv->ncols(s->impl))
        return -1;
    for (int i = 0; cols[i]; i++) {
        switch (cols[i]) {
        case 't': {
            char *dst = va_arg(*ap, char *);
            col_copy(s, i, dst, va_arg(*ap, size_t));
            break;
        }
        case 's': {
            const char *t = s->drv->text(s->impl, i);
            *va_arg(*ap, char **) = strdup(t ? t : "");
            break;
        }
        case 'i':
            *va_arg(*ap, int *) = (int)s->drv->integer(s->impl, i);
            break;
        case 'I':
            *va_arg(*ap, int64_t *) = s->drv->integer(s->impl, i);
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

int sql_cols(sql_stmt *s, const char *cols, ...)
{
    va_list ap;
    va_start(ap, cols);
    int rc = cols_read(s, cols, &ap);
    va_end(ap);
    return rc;
}

int sql_row(store_conn *c, const char *sql, const char *fmt, const char *cols, ...)
{
    va_list ap;
    va_start(ap, cols);
    sql_stmt *s = query_va(c, sql, fmt, &ap);
    int rc = s ? c->drv->step(s->impl) : -1;
    if (rc == 1 && cols_read(s, cols, &ap) < 0)
        rc = -1;
    va_end(ap);
    if (s)
        c->drv->reset(s->impl);
    return rc == 1 ? 0 : rc == 0 ? 1 : -1;
}

void *sql_rows(sql_stmt *s, int limit, size_t elem_size, sql_row_reader rd, void (*clear)(void *elem),
               int *n, int *has_more)
{
    *n = 0;
    size_t cap = limit < 16 ? (size_t)limit + 1 : 16;
    char *arr = calloc(cap, elem_size);
    if (!arr) {
        s->drv->reset(s->impl);
        return NULL;
    }
    int k = 0, rc;
    while ((rc = s->drv->step(s->impl)) == 1) {
        if (k == limit) {
            if (has_more)
                *has_more = 1;
            break;
        }
        if ((size_t)k == cap) {
            char *na = realloc(arr, 2 * cap * elem_size);
            if (!na) {
                rc = -1;
                break;
            }
            memset(na + cap * elem_size, 0, cap * elem_size);
            arr = na;
            cap *= 2;
        }
        rd(s, arr + (size_t)k++ * elem_size);
    }
    s->drv->reset(s->impl);
    if (rc < 0) {
        for (int i = 0; clear && i < k; i++)
            clear(arr + (size_t)i * elem_size);
        free(arr);
        return NULL;
    }
    *n = k;
    return arr;
}

/* Apply the migrations the database lacks, each in one exclusive transaction (concurrent
 * openers wait). Returns the schema version afterwards, or -1 (with err when the schema
 * is newer than this build or a migration failed). */
static int migrate(store_conn *c, const char *what, char *err, size_t errlen)
{
    const store_driver *d = c->drv;
    for (;;) {
        if (exec(c, d->migrate_begin_sql) < 0)
            return -1;
        c->tx = 1;
        int version = d->schema_version(c->db);
        if (version < 0) {
            snprintf(err, errlen, "%s: reading the schema version failed: %s", what, d->errmsg(c->db));
            return sql_abandon(c, -1);
        }
        if (version > d->n_migrations) {
            snprintf(err, errlen, "%s: schema version %d is newer than this build (%d)", what, version,
                     d->n_migrations);
            return sql_abandon(c, -1);
        }
        if (version == d->n_migrations)
            return sql_commit(c) < 0 ? -1 : version;
        if (exec(c, d->migrations[version]) < 0) {
            snprintf(err, errlen, "%s: migration %d failed: %s", what, version + 1, d->errmsg(c->db));
            return sql_abandon(c, -1);
        }
        if (d->set_schema_version(c->db, version + 1) < 0 || sql_commit(c) < 0)
            return sql_abandon(c, -1);
    }
}

void store_target_for_logs(const char *target, char *out, size_t n)
{
    const char *scheme = strstr(target, "://");
    const char *at = scheme ? strchr(scheme + 3, '@') : NULL;
    const char *colon = at ? memchr(scheme + 3, ':', (size_t)(at - scheme - 3)) : NULL;
    if (!colon)
        snprintf(out, n, "%s", target);
    else
        snprintf(out, n, "%.*s:***%s", (int)(colon - target), target, at);
    /* a password given as a parameter ("?password=...") is cut off with what follows */
    char *pw = strstr(out, "password=");
    if (pw)
        snprintf(pw, n - (size_t)(pw - out), "password=***");
}

store *store_open(const char *target, char *err, size_t errlen)
{
    store *st = calloc(1, sizeof *st);
    if (!st || !(st->target = strdup(target))) {
        free(st);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    st->drv = is_url(target) ? &store_pg_driver : &store_sqlite_driver;
    char what[1024];
    store_target_for_logs(target, what, sizeof what);
    pthread_mutex_init(&st->mu, NULL);
    if (pthread_key_create(&st->key, conn_destructor) != 0) {
        snprintf(err, errlen, "pthread_key_create failed");
        free(st->target);
        free(st);
        return NULL;
    }
    store_conn *c = conn_open(st, err, errlen);
    if (!c) {
        pthread_key_delete(st->key);
        free(st->target);
        free(st);
        return NULL;
    }
    int version = migrate(c, what, err, errlen);
    if (version < 0)
        goto fail;
    st->schema_version = version;
    if (pthread_setspecific(st->key, c) != 0)
        goto fail;
    st->all = c;
    return st;
fail:
    if (!err[0])
        snprintf(err, errlen, "%s: cannot initialise the database", what);
    conn_close(c);
    pthread_key_delete(st->key);
    free(st->target);
    free(st);
    return NULL;
}

void store_close(store *st)
{
    if (!st)
        return;
    pthread_mutex_lock(&st->mu);
    store_conn *c = st->all;
    st->all = NULL;
    pthread_mutex_unlock(&st->mu);
    while (c) {
        store_conn *n = c->next;
        conn_close(c);
        c = n;
    }
    pthread_setspecific(st->key, NULL);
    pthread_key_delete(st->key);
    pthread_mutex_destroy(&st->mu);
    free(st->target);
    free(st);
}

int store_schema_version(store *st)
{
    return st->schema_version;
}

const char *store_backend(store *st)
{
    return st->drv->name;
}

int64_t store_data_version(store *st)
{
    store_conn *c = store_conn_get(st);
    return c ? c->drv->data_version(c->db) : -1;
}
