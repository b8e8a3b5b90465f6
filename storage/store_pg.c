/* storage/store_pg.c — the store's PostgreSQL driver (store_internal.h), through libpq:
 * the shared store of a fleet, where the API and workers on other hosts meet. Statements
 * are prepared once per connection with `?` rewritten to $1..$n and run with text
 * parameters; transactions are READ COMMITTED and rows read to be changed are locked with
 * FOR UPDATE (job claims with FOR UPDATE SKIP LOCKED). A lost connection reports itself
 * through alive() and is reopened by the store. The change counter behind long-polls is a
 * sequence advanced after each commit. Migrations (storage/migrations/pg/) run under an
 * advisory lock, their number in table ac_schema.
 */
#include "storage/store_internal.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/utf8.h"

/* The PostgreSQL dialect of each numbered migration (the same numbers as SQLite's). */
#define MIGRATION(sym, file)                                                              \
    __asm__(".section .rodata\n.global " #sym "\n.type " #sym ", @object\n" #sym ":\n"     \
            ".incbin \"" file "\"\n.byte 0\n.size " #sym ", .-" #sym "\n.previous\n");      \
    extern const char sym[];
MIGRATION(store_pg_migration_0001, "storage/migrations/pg/0001_init.sql")
MIGRATION(store_pg_migration_0002, "storage/migrations/pg/0002_webhooks.sql")
MIGRATION(store_pg_migration_0003, "storage/migrations/pg/0003_model_fetch.sql")
MIGRATION(store_pg_migration_0004, "storage/migrations/pg/0004_leases.sql")
MIGRATION(store_pg_migration_0005, "storage/migrations/pg/0005_runners.sql")
static const char *const migrations[] = {
    store_pg_migration_0001,
    store_pg_migration_0002,
    store_pg_migration_0003,
    store_pg_migration_0004,
    store_pg_migration_0005,
};

#define PG_MAX_PARAMS 32

typedef struct {
    PGconn *conn;
    int next_stmt;               /* names of prepared statements: s1, s2, ... */
    int lost;                    /* a call failed without an answer from the server */
    char err[512];
} pg_db;

typedef struct {
    pg_db *db;
    char name[16];
    int nparams;
    PGresult *res;               /* the last run's rows (NULL after reset) */
    int row;                     /* the current row; -1 before the first step */
    int64_t changed;
} pg_stmt;

/* After a failed call with result r (may be NULL): an error the server did not send (no
 * SQLSTATE: the socket closed, the server crashed) means the connection is gone, whatever
 * PQstatus says yet. */
static void note_failure(pg_db *d, const PGresult *r)
{
    if (!r || !PQresultErrorField(r, PG_DIAG_SQLSTATE) || PQstatus(d->conn) != CONNECTION_OK)
        d->lost = 1;
}

static void set_err(pg_db *d, const char *msg)
{
    snprintf(d->err, sizeof d->err, "%s", msg && *msg ? msg : "PostgreSQL error");
    size_t n = strlen(d->err);
    while (n && (d->err[n - 1] == '\n' || d->err[n - 1] == ' '))
        d->err[--n] = 0;
}

static void quiet(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

static void *pg_open(const char *uri, char *err, size_t errlen)
{
    pg_db *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    /* our defaults first: what the URI says overrides them. Over TCP a database host
     * that drops off the network (no reset, no answer) fails a call within about 30 s
     * (keepalive probes after 10 s idle, 3 more 5 s apart; unacknowledged data 30 s)
     * rather than the system's two hours, and the connection is opened again. */
    const char *keys[] = {"connect_timeout", "application_name", "keepalives", "keepalives_idle",
                          "keepalives_interval", "keepalives_count", "tcp_user_timeout", "dbname", NULL};
    const char *vals[] = {"10", "autocompress", "1", "10", "5", "3", "30000", uri, NULL};
    d->conn = PQconnectdbParams(keys, vals, 1);
    if (!d->conn || PQstatus(d->conn) != CONNECTION_OK) {
        char where[1024];
        store_target_for_logs(uri, where, sizeof where);
        set_err(d, d->conn ? PQerrorMessage(d->conn) : "out of memory");
        snprintf(err, errlen, "%s: %s", where, d->err);
        PQfinish(d->conn);
        free(d);
        return NULL;
    }
    PQsetNoticeProcessor(d->conn, quiet, NULL);
    return d;
}

static void pg_close(void *p)
{
    pg_db *d = p;
    if (!d)
        return;
    PQfinish(d->conn);
    free(d);
}

static int pg_alive(void *p)
{
    pg_db *d = p;
    return !d->lost && PQstatus(d->conn) == CONNECTION_OK ? 0 : -1;
}

static int pg_exec(void *p, const char *sql)
{
    pg_db *d = p;
    PGresult *r = PQexec(d->conn, sql);
    ExecStatusType t = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    int ok = t == PGRES_COMMAND_OK || t == PGRES_TUPLES_OK;
    if (!ok) {
        set_err(d, PQerrorMessage(d->conn));
        note_failure(d, r);
    }
    PQclear(r);
    return ok ? 0 : -1;
}

/* sql with each `?` outside quotes rewritten as $1, $2, ... (malloc'd; *n the count). */
static char *dollar_params(const char *sql, int *n)
{
    size_t len = strlen(sql);
    size_t cap = 4 * len + 1, k = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    int quoted = 0;
    *n = 0;
    for (const char *s = sql; *s; s++) {
        if (*s == '\'')
            quoted = !quoted;
        if (*s == '?' && !quoted)
            k += (size_t)snprintf(out + k, cap - k, "$%d", ++*n);
        else
            out[k++] = *s;
    }
    out[k] = 0;
    return out;
}

static void *pg_prepare(void *p, const char *sql)
{
    pg_db *d = p;
    pg_stmt *s = calloc(1, sizeof *s);
    char *text = s ? dollar_params(sql, &s->nparams) : NULL;
    if (!text || s->nparams > PG_MAX_PARAMS) {
        set_err(d, text ? "too many parameters" : "out of memory");
        free(text);
        free(s);
        return NULL;
    }
    s->db = d;
    s->row = -1;
    snprintf(s->name, sizeof s->name, "s%d", ++d->next_stmt);
    PGresult *r = PQprepare(d->conn, s->name, text, 0, NULL);
    free(text);
    if (!r || PQresultStatus(r) != PGRES_COMMAND_OK) {
        set_err(d, PQerrorMessage(d->conn));
        note_failure(d, r);
        PQclear(r);
        free(s);
        return NULL;
    }
    PQclear(r);
    return s;
}

static void pg_reset(void *p)
{
    pg_stmt *s = p;
    PQclear(s->res);
    s->res = NULL;
    s->row = -1;
}

static void pg_finalize(void *p)
{
    pg_reset(p);
    free(p);
}

/* text as PostgreSQL takes it: NULL when it is valid UTF-8 already (use it as it is), else
 * a malloc'd copy with each invalid byte replaced by U+FFFD. SQLite keeps such bytes; here
 * they can only be lookups of ids no row has, which then find nothing, as in SQLite. */
static char *utf8_fixed(const char *text)
{
    return utf8_valid(text) ? NULL : utf8_mended(text, "\xef\xbf\xbd");
}

static int pg_run(void *p, const sql_param *v, int n)
{
    pg_stmt *s = p;
    pg_reset(s);
    char nums[PG_MAX_PARAMS][24];
    const char *vals[PG_MAX_PARAMS];
    char *fixed[PG_MAX_PARAMS] = {0};
    for (int i = 0; i < n && i < PG_MAX_PARAMS; i++) {
        if (v[i].type == 'I') {
            snprintf(nums[i], sizeof nums[i], "%lld", (long long)v[i].i);
            vals[i] = nums[i];
        } else {
            vals[i] = v[i].text;
            if (vals[i] && (fixed[i] = utf8_fixed(vals[i])))
                vals[i] = fixed[i];
        }
    }
    s->res = PQexecPrepared(s->db->conn, s->name, n, vals, NULL, NULL, 0);
    for (int i = 0; i < n && i < PG_MAX_PARAMS; i++)
        free(fixed[i]);
    ExecStatusType t = s->res ? PQresultStatus(s->res) : PGRES_FATAL_ERROR;
    if (t != PGRES_TUPLES_OK && t != PGRES_COMMAND_OK) {
        set_err(s->db, PQerrorMessage(s->db->conn));
        note_failure(s->db, s->res);
        pg_reset(s);
        return -1;
    }
    const char *ct = PQcmdTuples(s->res);
    s->changed = ct && *ct ? strtoll(ct, NULL, 10) : 0;
    return 0;
}

static int pg_nparams(void *p)
{
    return ((pg_stmt *)p)->nparams;
}

static int pg_step(void *p)
{
    pg_stmt *s = p;
    if (!s->res)
        return -1;
    return ++s->row < PQntuples(s->res) ? 1 : 0;
}

static int pg_ncols(void *p)
{
    pg_stmt *s = p;
    return s->res ? PQnfields(s->res) : 0;
}

static const char *pg_text(void *p, int i)
{
    pg_stmt *s = p;
    if (!s->res || s->row < 0 || s->row >= PQntuples(s->res) || PQgetisnull(s->res, s->row, i))
        return NULL;
    return PQgetvalue(s->res, s->row, i);
}

static int64_t pg_integer(void *p, int i)
{
    const char *t = pg_text(p, i);
    return t ? strtoll(t, NULL, 10) : 0;
}

static int64_t pg_changes(void *p)
{
    return ((pg_stmt *)p)->changed;
}


static const char *pg_errmsg(void *p)
{
    pg_db *d = p;
    return d->err[0] ? d->err : "no error";
}

/* One integer from a query without parameters; -1 on error. */
static int64_t query_int(pg_db *d, const char *sql)
{
    PGresult *r = PQexec(d->conn, sql);
    int64_t v = -1;
    if (r && PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
        v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    } else {
        set_err(d, PQerrorMessage(d->conn));
        note_failure(d, r);
    }
    PQclear(r);
    return v;
}

static int pg_schema_version(void *p)
{
    pg_db *d = p;
    /* created by the first opener; a role without CREATE (a worker's) only reads it */
    int64_t have = query_int(d, "SELECT count(*) FROM pg_tables WHERE tablename='ac_schema' "
                                "AND schemaname=current_schema()");
    if (have < 0 || (have == 0 && pg_exec(d, "CREATE TABLE ac_schema (version INTEGER NOT NULL)") < 0))
        return -1;
    return (int)query_int(d, "SELECT coalesce(max(version), 0) FROM ac_schema");
}

static int pg_set_schema_version(void *p, int v)
{
    char sql[96];
    snprintf(sql, sizeof sql, "DELETE FROM ac_schema; INSERT INTO ac_schema VALUES (%d)", v);
    return pg_exec(p, sql);
}

static int64_t pg_data_version(void *p)
{
    return query_int(p, "SELECT last_value FROM ac_data_version");
}

/* After a commit: advance the counter, so that a reader who sees the new value also sees
 * what was committed (a failure only delays a long-poll to its deadline). */
static void pg_committed(void *p)
{
    (void)query_int(p, "SELECT nextval('ac_data_version')");
}

const store_driver store_pg_driver = {
    .name = "postgresql",
    .open = pg_open,
    .close = pg_close,
    .alive = pg_alive,
    .exec = pg_exec,
    .prepare = pg_prepare,
    .finalize = pg_finalize,
    .run = pg_run,
    .nparams = pg_nparams,
    .step = pg_step,
    .reset = pg_reset,
    .ncols = pg_ncols,
    .text = pg_text,
    .integer = pg_integer,
    .changes = pg_changes,
    .errmsg = pg_errmsg,
    .begin_sql = "BEGIN",
    .migrate_begin_sql = "BEGIN; SELECT pg_advisory_xact_lock(4242001)",
    .schema_version = pg_schema_version,
    .set_schema_version = pg_set_schema_version,
    .migrations = migrations,
    .n_migrations = (int)(sizeof migrations / sizeof migrations[0]),
    .data_version = pg_data_version,
    .committed = pg_committed,
};
