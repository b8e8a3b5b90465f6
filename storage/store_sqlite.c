/* storage/store_sqlite.c — the store's SQLite driver (store_internal.h): one file under
 * the data directory, WAL mode, synchronous=FULL. Write transactions are BEGIN IMMEDIATE
 * with a 30 s busy timeout, so the server's threads and the worker processes serialize on
 * the database file, never on a process lock; that is also why a FOR UPDATE clause is
 * dropped here. PRAGMA user_version records the last migration applied.
 */
#include "storage/store_internal.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Numbered migrations, embedded from storage/migrations/NNNN_*.sql (append-only: a new
 * migration is a new file plus a line here and in store_pg.c, which also makes make
 * rebuild this file). Index i is migration i+1. */
#define MIGRATION(sym, file)                                                              \
    __asm__(".section .rodata\n.global " #sym "\n.type " #sym ", @object\n" #sym ":\n"     \
            ".incbin \"" file "\"\n.byte 0\n.size " #sym ", .-" #sym "\n.previous\n");      \
    extern const char sym[];
MIGRATION(store_migration_0001, "storage/migrations/0001_init.sql")
MIGRATION(store_migration_0002, "storage/migrations/0002_webhooks.sql")
MIGRATION(store_migration_0003, "storage/migrations/0003_model_fetch.sql")
MIGRATION(store_migration_0004, "storage/migrations/0004_leases.sql")
MIGRATION(store_migration_0005, "storage/migrations/0005_runners.sql")
static const char *const migrations[] = {
    store_migration_0001,
    store_migration_0002,
    store_migration_0003,
    store_migration_0004,
    store_migration_0005,
};

typedef struct {
    sqlite3 *db;
    sqlite3_stmt *st;
} lite_stmt;

static void *lite_open(const char *path, char *err, size_t errlen)
{
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", path, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db, 30000);
    char *msg = NULL;
    if (sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;", NULL, NULL,
                     &msg) != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", path, msg ? msg : "pragma failed");
        sqlite3_free(msg);
        sqlite3_close(db);
        return NULL;
    }
    return db;
}

static void lite_close(void *db)
{
    sqlite3_close(db);
}

static int lite_alive(void *db)
{
    (void)db;
    return 0;
}

static int lite_exec(void *db, const char *sql)
{
    return sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
}

static void *lite_prepare(void *db, const char *sql)
{
    lite_stmt *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    /* the write transaction already holds the database: a row lock clause has no meaning */
    const char *fu = strstr(sql, " FOR UPDATE");
    int len = fu ? (int)(fu - sql) : -1;
    s->db = db;
    if (sqlite3_prepare_v3(db, sql, len, SQLITE_PREPARE_PERSISTENT, &s->st, NULL) != SQLITE_OK) {
        free(s);
        return NULL;
    }
    return s;
}

static void lite_finalize(void *p)
{
    lite_stmt *s = p;
    sqlite3_finalize(s->st);
    free(s);
}

static int lite_run(void *p, const sql_param *v, int n)
{
    lite_stmt *s = p;
    sqlite3_clear_bindings(s->st);
    for (int i = 0; i < n; i++) {
        int rc = v[i].type == 'I' ? sqlite3_bind_int64(s->st, i + 1, v[i].i)
                 : v[i].text      ? sqlite3_bind_text(s->st, i + 1, v[i].text, -1, SQLITE_TRANSIENT)
                                  : sqlite3_bind_null(s->st, i + 1);
        if (rc != SQLITE_OK)
            return -1;
    }
    return 0;
}

static int lite_nparams(void *p)
{
    return sqlite3_bind_parameter_count(((lite_stmt *)p)->st);
}

static int lite_step(void *p)
{
    int rc = sqlite3_step(((lite_stmt *)p)->st);
    return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : -1;
}

static void lite_reset(void *p)
{
    sqlite3_reset(((lite_stmt *)p)->st);
}

static int lite_ncols(void *p)
{
    return sqlite3_column_count(((lite_stmt *)p)->st);
}

static const char *lite_text(void *p, int i)
{
    return (const char *)sqlite3_column_text(((lite_stmt *)p)->st, i);
}

static int64_t lite_integer(void *p, int i)
{
    return sqlite3_column_int64(((lite_stmt *)p)->st, i);
}

static int64_t lite_changes(void *p)
{
    return sqlite3_changes(((lite_stmt *)p)->db);
}


static const char *lite_errmsg(void *db)
{
    return sqlite3_errmsg(db);
}

/* One integer from a PRAGMA; -1 on error. */
static int64_t pragma_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK)
        return -1;
    int64_t v = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
    sqlite3_finalize(s);
    return v;
}

static int lite_schema_version(void *db)
{
    return (int)pragma_int(db, "PRAGMA user_version");
}

static int lite_set_schema_version(void *db, int v)
{
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version=%d", v);
    return lite_exec(db, sql);
}

/* SQLite's own counter: it changes when another connection committed since this one's
 * previous read. */
static int64_t lite_data_version(void *db)
{
    return pragma_int(db, "PRAGMA data_version");
}

const store_driver store_sqlite_driver = {
    .name = "sqlite",
    .open = lite_open,
    .close = lite_close,
    .alive = lite_alive,
    .exec = lite_exec,
    .prepare = lite_prepare,
    .finalize = lite_finalize,
    .run = lite_run,
    .nparams = lite_nparams,
    .step = lite_step,
    .reset = lite_reset,
    .ncols = lite_ncols,
    .text = lite_text,
    .integer = lite_integer,
    .changes = lite_changes,
    .errmsg = lite_errmsg,
    .begin_sql = "BEGIN IMMEDIATE",
    .migrate_begin_sql = "BEGIN EXCLUSIVE",
    .schema_version = lite_schema_version,
    .set_schema_version = lite_set_schema_version,
    .migrations = migrations,
    .n_migrations = (int)(sizeof migrations / sizeof migrations[0]),
    .data_version = lite_data_version,
    .committed = NULL,
};
