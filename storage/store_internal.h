/* storage/store_internal.h — what the store_*.c files share and nothing else includes:
 * this thread's connection, the statement helpers every query goes through, the two
 * database drivers behind them, and the writes one part of the store makes inside another
 * part's transaction. The contract for callers is storage/store.h.
 *
 * SQL is written once, in the dialect SQLite and PostgreSQL share: `?` parameters,
 * ON CONFLICT upserts, RETURNING. A row read to be changed in the same transaction ends
 * in FOR UPDATE (or FOR UPDATE SKIP LOCKED) as its last clause: PostgreSQL locks the row;
 * SQLite drops the clause, its write transactions already holding the database's lock.
 *
 *   store.c           open, migrations, connections, statement helpers
 *   store_sqlite.c    the SQLite driver (the default: a file under the data directory)
 *   store_pg.c        the PostgreSQL driver (libpq; a fleet's shared store)
 *   store_jobs.c      jobs: create, read, list, progress, finish, recover, delete
 *   store_events.c    a job's events
 *   store_artifacts.c artifact metadata
 *   store_models.c    registered models and their fetches
 *   store_outbox.c    the webhook outbox
 *   store_idem.c      idempotency records
 *   store_runners.c   the runners registry (what each host offers)
 */
#ifndef AC_STORAGE_STORE_INTERNAL_H
#define AC_STORAGE_STORE_INTERNAL_H

#include <stdint.h>

#include "storage/store.h"

/* One thread's database connection with its prepared-statement cache. */
typedef struct store_conn store_conn;
/* A prepared statement of one connection, with its bound values and current row: the
 * driver's own statement (impl) and the driver that reads it. */
typedef struct sql_stmt {
    const struct store_driver *drv;
    void *impl;
} sql_stmt;

/* One bound value: type 't' (text; NULL is SQL NULL) or 'I' (integer). */
typedef struct {
    char type;
    const char *text;
    int64_t i;
} sql_param;

/* A database driver. db is the driver's connection, s its statement; every call that
 * fails leaves its reason for errmsg. Statements belong to the connection that prepared
 * them. */
typedef struct store_driver {
    const char *name;                                     /* "sqlite" | "postgresql" */
    /* A new connection to target (a file path or a postgresql:// URI), or NULL with err. */
    void *(*open)(const char *target, char *err, size_t errlen);
    void (*close)(void *db);
    /* 0 while the connection can be used; -1 when it is lost (it is then reopened). */
    int (*alive)(void *db);
    /* Run SQL that takes no parameters and returns no rows (several statements allowed). */
    int (*exec)(void *db, const char *sql);
    void *(*prepare)(void *db, const char *sql);          /* NULL on failure */
    void (*finalize)(void *s);
    /* Bind n values and run (SQLite runs at the first step). 0 or -1. */
    int (*run)(void *s, const sql_param *p, int n);
    int (*nparams)(void *s);
    int (*step)(void *s);                                 /* 1 a row, 0 no more, -1 error */
    void (*reset)(void *s);                               /* done with the rows */
    int (*ncols)(void *s);
    const char *(*text)(void *s, int i);                  /* NULL for SQL NULL; borrowed */
    int64_t (*integer)(void *s, int i);
    int64_t (*changes)(void *s);                          /* rows the last run changed */
    const char *(*errmsg)(void *db);
    const char *begin_sql;                                /* a write transaction */
    /* Migrations: the exclusive transaction, the version read and written inside it. */
    const char *migrate_begin_sql;
    int (*schema_version)(void *db);                      /* -1 on error */
    int (*set_schema_version)(void *db, int v);
    const char *const *migrations;
    int n_migrations;
    /* The change counter (store_data_version) and its bump after each commit (NULL when
     * the database keeps it itself). */
    int64_t (*data_version)(void *db);
    void (*committed)(void *db);
} store_driver;

extern const store_driver store_sqlite_driver;
extern const store_driver store_pg_driver;

/* This thread's connection (opened on first use); NULL when it cannot be opened
 * (logged). Borrowed: the store closes it. */
store_conn *store_conn_get(store *st);

/* Transactions. sql_begin starts a write transaction (SQLite: BEGIN IMMEDIATE, waiting
 * for other writers up to the busy timeout; PostgreSQL: BEGIN); 0 or -1 (logged). sql_rollback ends one if open;
 * sql_abandon rolls back and returns ret, the caller's status. */
int sql_begin(store_conn *c);
int sql_commit(store_conn *c);
void sql_rollback(store_conn *c);
int sql_abandon(store_conn *c, int ret);

/* The last error's text (borrowed). */
const char *sql_errmsg(store_conn *c);

/* Statement helpers. A bind format has one letter per `?` of the statement, in order:
 *   t  const char *  text; NULL binds ''
 *   z  const char *  text; NULL binds SQL NULL
 *   i  int
 *   I  int64_t       (pass an int64_t, never a plain int literal)
 * A column format has one letter per column read, from column 0:
 *   t  char *dst, size_t size   text copied ("" for NULL)
 *   s  char **                  text strdup'd ("" for NULL; NULL when out of memory)
 *   i  int *          I  int64_t *          j  json_t ** (NEW reference or NULL)
 *   r  sql_row_reader, void *out    the whole row (alone in the format)
 * SQL arguments must be static literals: the statement cache keys on their address. */

/* Fills *out (a store_job, store_event, ...) from the current row of s. */
typedef void (*sql_row_reader)(sql_stmt *s, void *out);

/* The cached statement for sql with fmt's arguments bound (and run, on PostgreSQL);
 * NULL on failure (logged). Read its rows with sql_rows. */
sql_stmt *sql_query(store_conn *c, const char *sql, const char *fmt, ...);
/* Run a statement that returns no rows (INSERT, UPDATE, DELETE) with fmt's arguments.
 * Returns the number of rows it changed, or -1 (logged). */
int sql_run(store_conn *c, const char *sql, const char *fmt, ...);
/* Run a query with fmt's arguments (then cols' outputs, in that order) and read its first
 * row. Returns 0 (outputs filled), 1 when there is no row (outputs untouched), -1 on error
 * (a failed step is not logged; the caller reports it). */
int sql_row(store_conn *c, const char *sql, const char *fmt, const char *cols, ...);
/* Read the rows of s (prepared and bound; its LIMIT at most limit + 1 when it has one)
 * into a new array of at most `limit` elements of elem_size bytes, each filled by rd
 * (zeroed first); *has_more (when not NULL) is set when a row beyond `limit` exists.
 * Returns the array (malloc'd, caller frees; *n elements) or NULL on error, after
 * releasing the rows read with clear (when not NULL). s is reset either way. */
void *sql_rows(sql_stmt *s, int limit, size_t elem_size, sql_row_reader rd, void (*clear)(void *elem),
               int *n, int *has_more);
/* Store the current row of s into the outputs cols names, in sql_row's column format
 * (the row readers name their columns this way). 0, or -1 for a format longer than the
 * row or with an unknown letter (a programming error). */
int sql_cols(sql_stmt *s, const char *cols, ...);

/* Fencing (store_fence_job). store_fence_attempt: the attempt c's handle writes job id
 * as, 0 when its writes to id are not fenced. store_fence_check, inside the caller's
 * transaction: 0 when job id is running at `attempt` (always, for attempt 0), with its
 * row locked; STORE_FENCED when not (or absent); -1 on error. */
int store_fence_attempt(store_conn *c, const char *id);
int store_fence_check(store_conn *c, const char *id, int attempt);
/* A write transaction on this thread's connection (*c) for job id, begun and checked
 * against the connection's fence (store_fence_job): 0 inside it; STORE_FENCED or -1 with
 * nothing left open. */
int store_begin_fenced(store *st, const char *id, store_conn **c);

/* Writes made inside the caller's transaction (or alone). Each returns 0 or -1 (logged). */

/* Append an event to job_id; data is stolen (a NEW reference, or NULL). */
int store_event_insert(store_conn *c, const char *job_id, const char *type, const char *message, json_t *data);
/* Bump a job's version and updated_at, so that its ETag changes. */
int store_job_touch(store_conn *c, const char *id);
/* When job id's spec has a callback_url, queue the thin terminal event `type` (status,
 * error code and message) in the webhook outbox, due at now. 0 also when there is none. */
int store_webhook_enqueue(store_conn *c, const char *id, const char *type, const char *status, const char *code,
                          const char *message, int64_t now);
/* Record idempotency key (scope, key) for job_id with the request body's sha-256 and the
 * response to replay. Returns 0 (recorded), 1 when the key exists already (nothing
 * written), -1 on error. */
int store_idem_insert(store_conn *c, const char *scope, const char *key, const char *body_sha256,
                      const char *job_id, int resp_status, const char *resp_text);

#endif
