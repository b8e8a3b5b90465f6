/* storage/store_outbox.c — the webhook outbox (see store.h): a terminal job's event is
 * queued in the transaction that finishes the job, so a finished job is never left
 * unannounced; the sender reads the due rows and records each attempt here.
 */
#include "storage/store_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int store_webhook_enqueue(store_conn *c, const char *id, const char *type, const char *status, const char *code,
                          const char *message, int64_t now)
{
    static const char *q = "SELECT kind, spec FROM jobs WHERE id=?";
    char kind[16];
    json_t *spec = NULL;
    if (sql_row(c, q, "t", "tj", id, kind, sizeof kind, &spec) != 0)
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
    int rc = text && sql_run(c, ins, "tttttII", msg_id, id, url, type, text, now, now) >= 0 ? 0 : -1;
    free(text);
    json_decref(spec);
    return rc;
}

static void webhook_from_row(sql_stmt *s, void *out)
{
    store_webhook *w = out;
    sql_cols(s, "ttttsi", w->id, sizeof w->id, w->job_id, sizeof w->job_id, w->url, sizeof w->url, w->type,
             sizeof w->type, &w->payload, &w->attempts);
}

static void webhook_clear_elem(void *w)
{
    free(((store_webhook *)w)->payload);
}

int store_webhook_due(store *st, int64_t now, int limit, store_webhook **out, int *n)
{
    *out = NULL;
    *n = 0;
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "SELECT id, job_id, url, type, payload, attempts FROM webhooks "
                           "WHERE state='pending' AND next_at<=? ORDER BY next_at LIMIT ?";
    sql_stmt *s = sql_query(c, q, "Ii", now, limit);
    if (!s)
        return -1;
    *out = sql_rows(s, limit, sizeof **out, webhook_from_row, webhook_clear_elem, n, NULL);
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
    store_conn *c = store_conn_get(st);
    if (!c || sql_begin(c) < 0)
        return -1;
    static const char *u = "UPDATE webhooks SET attempts=attempts+1, state=?, next_at=?, last_error=?, "
                           "delivered_at=? WHERE id=? AND state='pending'";
    const char *state = delivered ? "delivered" : give_up ? "failed" : "pending";
    int64_t delivered_at = delivered ? store_now() : 0;
    int changed = sql_run(c, u, "tItIt", state, next_at, error, delivered_at, id);
    if (changed < 0)
        return sql_abandon(c, -1);
    if (changed == 0)   /* settled already, or its job was deleted meanwhile: no event */
        return sql_abandon(c, 0);
    if (delivered || give_up) {
        if (store_job_touch(c, job_id) < 0)   /* a new event changes the job's ETag */
            return sql_abandon(c, -1);
        char msg[600];
        snprintf(msg, sizeof msg, delivered ? "webhook %s delivered" : "webhook %s failed for good: %s", id,
                 error ? error : "");
        if (store_event_insert(c, job_id, delivered ? "webhook.delivered" : "webhook.failed", msg,
                               json_pack("{s:s}", "id", id)) < 0)
            return sql_abandon(c, -1);
    }
    if (sql_commit(c) < 0)
        return sql_abandon(c, -1);
    return 0;
}
