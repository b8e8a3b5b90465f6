/* storage/store.c — the SQLite job store's core (see store.h, store_internal.h): open
 * and migrations, one connection per thread with a cache of prepared statements keyed by
 * the SQL literal's address, and the statement helpers every query goes through. Writes
 * run in BEGIN IMMEDIATE transactions with a busy timeout, so the server's threads and
 * the worker processes serialize on the database file, never on a process lock. The
 * tables are read and written by store_jobs.c, store_events.c, store_artifacts.c,
 * store_models.c, store_outbox.c and store_idem.c.
 */
#include "storage/store_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "storage/artstore.h"

#define STMT_CACHE 96

struct store_conn {
    sqlite3 *db;
    struct { const char *sql; sqlite3_stmt *st; } cache[STMT_CACHE];
    int ncache;
    store *owner;
    struct store_conn *next;
};

struct store {
    char *path;
    pthread_key_t key;
    pthread_mutex_t mu;
    store_conn *all;
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
    art_hex(r, sizeof r, out + pl);
    return 0;
}

static void conn_close(store_conn *c)
{
    for (int i = 0; i < c->ncache; i++)
        sqlite3_finalize(c->cache[i].st);
    sqlite3_close(c->db);
    free(c);
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

store_conn *store_conn_get(store *st)
{
    store_conn *c = pthread_getspecific(st->key);
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

sqlite3_stmt *sql_prepared(store_conn *c, const char *sql)
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

static int exec(store_conn *c, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(c->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        fprintf(stderr, "store: %s: %s\n", sql, msg ? msg : sqlite3_errmsg(c->db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

int sql_begin(store_conn *c)
{
    return exec(c, "BEGIN IMMEDIATE");
}

int sql_commit(store_conn *c)
{
    return exec(c, "COMMIT");
}

void sql_rollback(store_conn *c)
{
    if (!sqlite3_get_autocommit(c->db))
        (void)sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
}

int sql_abandon(store_conn *c, int ret)
{
    sql_rollback(c);
    return ret;
}

int64_t sql_last_rowid(store_conn *c)
{
    return sqlite3_last_insert_rowid(c->db);
}

const char *sql_errmsg(store_conn *c)
{
    return sqlite3_errmsg(c->db);
}

/* Step a statement that returns no rows. 0 or -1 (logged). */
static int step_done(store_conn *c, sqlite3_stmt *s)
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

void sql_col_copy(sqlite3_stmt *s, int i, char *dst, size_t n)
{
    const unsigned char *t = sqlite3_column_text(s, i);
    snprintf(dst, n, "%s", t ? (const char *)t : "");
}

json_t *sql_col_json(sqlite3_stmt *s, int i)
{
    const char *t = (const char *)sqlite3_column_text(s, i);
    if (!t)
        return NULL;
    return json_loads(t, 0, NULL);
}

/* ---- statement helpers (formats: store_internal.h) ------------------------------------ */

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
static sqlite3_stmt *stmt_va(store_conn *c, const char *sql, const char *fmt, va_list *ap)
{
    sqlite3_stmt *s = sql_prepared(c, sql);
    return s && bind_va(s, fmt, ap) == 0 ? s : NULL;
}

sqlite3_stmt *sql_stmt(store_conn *c, const char *sql, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sqlite3_stmt *s = stmt_va(c, sql, fmt, &ap);
    va_end(ap);
    return s;
}

int sql_run(store_conn *c, const char *sql, const char *fmt, ...)
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
        sql_row_reader rd = va_arg(*ap, sql_row_reader);
        rd(s, va_arg(*ap, void *));
        return 0;
    }
    if ((int)strlen(cols) > sqlite3_column_count(s))
        return -1;
    for (int i = 0; cols[i]; i++) {
        switch (cols[i]) {
        case 't': {
            char *dst = va_arg(*ap, char *);
            sql_col_copy(s, i, dst, va_arg(*ap, size_t));
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
            *va_arg(*ap, json_t **) = sql_col_json(s, i);
            break;
        default:
            return -1;
        }
    }
    return 0;
}

int sql_cols(sqlite3_stmt *s, const char *cols, ...)
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
    sqlite3_stmt *s = stmt_va(c, sql, fmt, &ap);
    int rc = s ? sqlite3_step(s) : SQLITE_ERROR;
    if (rc == SQLITE_ROW && cols_read(s, cols, &ap) < 0)
        rc = SQLITE_MISUSE;
    va_end(ap);
    if (s)
        sqlite3_reset(s);
    return rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? 1 : -1;
}

void *sql_rows(sqlite3_stmt *s, int limit, size_t elem_size, sql_row_reader rd, void (*clear)(void *elem),
               int *n, int *has_more)
{
    *n = 0;
    size_t cap = limit < 16 ? (size_t)limit + 1 : 16;
    char *arr = calloc(cap, elem_size);
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
        if ((size_t)k == cap) {
            char *na = realloc(arr, 2 * cap * elem_size);
            if (!na) {
                rc = SQLITE_NOMEM;
                break;
            }
            memset(na + cap * elem_size, 0, cap * elem_size);
            arr = na;
            cap *= 2;
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

/* Apply the migrations the database lacks, each in one exclusive transaction (concurrent
 * openers wait). Returns the schema version afterwards, or -1 (with err when the schema
 * is newer than this build or a migration failed). */
static int migrate(store_conn *c, const char *path, char *err, size_t errlen)
{
    for (;;) {
        if (exec(c, "BEGIN EXCLUSIVE") < 0)
            return -1;
        sqlite3_stmt *s = NULL;
        if (sqlite3_prepare_v2(c->db, "PRAGMA user_version", -1, &s, NULL) != SQLITE_OK)
            return sql_abandon(c, -1);
        int version = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
        sqlite3_finalize(s);
        if (version < 0 || version > N_MIGRATIONS) {
            snprintf(err, errlen, "%s: schema version %d is newer than this build (%d)", path,
                     version, N_MIGRATIONS);
            return sql_abandon(c, -1);
        }
        if (version == N_MIGRATIONS)
            return sql_commit(c) < 0 ? -1 : version;
        if (exec(c, migrations[version]) < 0) {
            snprintf(err, errlen, "%s: migration %d failed", path, version + 1);
            return sql_abandon(c, -1);
        }
        char pv[64];
        snprintf(pv, sizeof pv, "PRAGMA user_version=%d", version + 1);
        if (exec(c, pv) < 0 || sql_commit(c) < 0)
            return sql_abandon(c, -1);
    }
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
    store_conn *c = conn_open(st, err, errlen);
    if (!c) {
        pthread_key_delete(st->key);
        free(st->path);
        free(st);
        return NULL;
    }
    int version = migrate(c, path, err, errlen);
    if (version < 0)
        goto fail;
    st->schema_version = version;
    if (pthread_setspecific(st->key, c) != 0)
        goto fail;
    st->all = c;
    return st;
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
    free(st->path);
    free(st);
}

int store_schema_version(store *st)
{
    return st->schema_version;
}

int64_t store_data_version(store *st)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "PRAGMA data_version";
    int64_t v = -1;
    return sql_row(c, q, "", "I", &v) == 0 ? v : -1;
}
