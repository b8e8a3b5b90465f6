/* storage/store_runners.c — the runners registry (see store.h): each server that runs jobs
 * and each worker agent keeps a row saying which devices and engines it offers, renewed
 * with its leases, so that an API on another host can accept jobs for them.
 */
#include "storage/store_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int store_runner_beat(store *st, const char *name, const char *info)
{
    store_conn *c = store_conn_get(st);
    static const char *u = "INSERT INTO runners(name, info, started_at, seen_at) VALUES (?,?,?,?) ON CONFLICT (name) "
                           "DO UPDATE SET info=excluded.info, seen_at=excluded.seen_at";
    int64_t now = store_now();
    return c && sql_run(c, u, "ttII", name, info, now, now) >= 0 ? 0 : -1;
}

int store_runner_gone(store *st, const char *name)
{
    store_conn *c = store_conn_get(st);
    static const char *d = "DELETE FROM runners WHERE name=?";
    return c && sql_run(c, d, "t", name) >= 0 ? 0 : -1;
}

typedef struct {
    char name[512];
    json_t *info;
    int64_t seen_at;
} runner_row;

static void runner_from_row(sql_stmt *s, void *out)
{
    runner_row *r = out;
    sql_cols(s, "tjI", r->name, sizeof r->name, &r->info, &r->seen_at);
}

static void runner_clear(void *r)
{
    json_decref(((runner_row *)r)->info);
}

json_t *store_runners(store *st, int64_t seen_after)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return NULL;
    static const char *q = "SELECT name, info, seen_at FROM runners WHERE seen_at>? ORDER BY name LIMIT ?";
    sql_stmt *s = sql_query(c, q, "Ii", seen_after, 1001);
    int n = 0;
    runner_row *rows = s ? sql_rows(s, 1000, sizeof *rows, runner_from_row, runner_clear, &n, NULL) : NULL;
    json_t *out = rows ? json_array() : NULL;
    for (int i = 0; rows && i < n; i++) {
        if (out && json_is_object(rows[i].info))
            json_array_append_new(out, json_pack("{s:s,s:I,s:O}", "name", rows[i].name, "seen_at",
                                                 (json_int_t)rows[i].seen_at, "info", rows[i].info));
        json_decref(rows[i].info);
    }
    free(rows);
    return out;
}
