/* storage/store_events.c — a job's events (see store.h): appended in the transaction of
 * the change they report, read back oldest first after a sequence number. Each append
 * bumps the job's version, so an ETag changes with its event list.
 */
#include "storage/store_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *SQL_EVENT_INSERT =
    "INSERT INTO events(job_id, type, message, data, created_at) VALUES (?,?,?,?,?)";

int store_event_insert(store_conn *c, const char *job_id, const char *type, const char *message,
                       json_t *data)
{
    char *dt = data ? json_dumps(data, JSON_COMPACT) : NULL;
    int lost = data && !dt;
    json_decref(data);
    if (lost)
        return -1;
    int rc = sql_run(c, SQL_EVENT_INSERT, "tttzI", job_id, type, message, dt, store_now());
    free(dt);
    return rc < 0 ? -1 : 0;
}

int store_event_append(store *st, const char *job_id, const char *type, const char *message,
                       json_t *data)
{
    store_conn *c;
    int fence = store_begin_fenced(st, job_id, &c);
    if (fence != 0)
        return fence;
    if (store_job_touch(c, job_id) < 0 || store_event_insert(c, job_id, type, message, json_incref(data)) < 0 ||
        sql_commit(c) < 0)
        return sql_abandon(c, -1);
    return 0;
}

static void event_from_row(sql_stmt *s, void *out)
{
    store_event *e = out;
    sql_cols(s, "IttsjI", &e->seq, e->job_id, sizeof e->job_id, e->type, sizeof e->type, &e->message, &e->data,
             &e->created_at);
    snprintf(e->id, sizeof e->id, "evt_%016lld", (long long)e->seq);
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
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *sql = "SELECT seq, job_id, type, message, data, created_at FROM events "
                             "WHERE job_id=? AND seq>? ORDER BY seq LIMIT ?";
    sql_stmt *s = sql_query(c, sql, "tIi", job_id, after_seq, limit + 1);
    if (!s)
        return -1;
    *out = sql_rows(s, limit, sizeof **out, event_from_row, event_clear_elem, n, has_more);
    return *out ? 0 : -1;
}

void store_event_list_free(store_event *ev, int n)
{
    for (int i = 0; i < n; i++)
        store_event_clear(&ev[i]);
    free(ev);
}

void store_event_clear(store_event *e)
{
    free(e->message);
    json_decref(e->data);
    e->message = NULL;
    e->data = NULL;
}
