/* storage/store_models.c — registered models (see store.h): by path, ready at once, or
 * by URL, "fetching" until storage/fetch.c ends the download as "ready" or "failed". A
 * URL model is keyed by its sha-256, so registering the same bytes twice finds the first.
 */
#include "storage/store_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL_COLS "seq, id, path, tokenizer, name, format, created_at, status, url, sha256, size_bytes, " \
                   "bytes_done, bytes_total, error, updated_at"

static void model_from_row(sql_stmt *s, void *out)
{
    store_model *m = out;
    memset(m, 0, sizeof *m);
    sql_cols(s, "ItttttItttIIItI", &m->seq, m->id, sizeof m->id, m->path, sizeof m->path, m->tokenizer,
             sizeof m->tokenizer, m->name, sizeof m->name, m->format, sizeof m->format, &m->created_at, m->status,
             sizeof m->status, m->url, sizeof m->url, m->sha256, sizeof m->sha256, &m->size_bytes, &m->bytes_done,
             &m->bytes_total, m->error, sizeof m->error, &m->updated_at);
}

/* Insert m (id and times assigned). 0; 1 when a model with m's sha256 exists (nothing
 * inserted: on PostgreSQL a transaction that did not see it may have committed it since);
 * -1 (logged). */
static int model_insert(store_conn *c, store_model *m)
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
                             "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
                             "ON CONFLICT (sha256) WHERE sha256 <> '' DO NOTHING RETURNING seq";
    return sql_row(c, sql, "tttttItttIIItI", "I", m->id, m->path, m->tokenizer, m->name, m->format, m->created_at,
                   m->status, m->url, m->sha256, m->size_bytes, m->bytes_done, m->bytes_total, m->error,
                   m->updated_at, &m->seq);
}

int store_model_add(store *st, store_model *m)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    return model_insert(c, m) == 0 ? 0 : -1;
}

/* The model with this sha256 on connection c: 0 found, 1 absent, -1 error. */
static int model_by_sha(store_conn *c, const char *sha, store_model *out)
{
    static const char *q = "SELECT " MODEL_COLS " FROM models WHERE sha256=? FOR UPDATE";
    return sql_row(c, q, "t", "r", sha, model_from_row, out);
}

int store_model_get_sha(store *st, const char *sha256_hex, store_model *out)
{
    store_conn *c = store_conn_get(st);
    return c ? model_by_sha(c, sha256_hex, out) : -1;
}

int store_model_add_fetch(store *st, store_model *m, int *restarted)
{
    *restarted = 0;
    store_conn *c = store_conn_get(st);
    if (!c || !m->sha256[0] || sql_begin(c) < 0)
        return -1;
    store_model *old = malloc(sizeof *old);
    if (!old)
        goto fail;
    int rc = model_by_sha(c, m->sha256, old);
    if (rc < 0)
        goto fail;
    if (rc == 1) {
        snprintf(m->status, sizeof m->status, "fetching");
        m->bytes_done = 0;
        m->bytes_total = m->size_bytes;
        m->error[0] = 0;
        int ins = model_insert(c, m);
        if (ins < 0)
            goto fail;
        if (ins == 0) {
            if (sql_commit(c) < 0)
                goto fail;
            free(old);
            return 0;
        }
        /* registered at the same moment by another transaction, which committed it (the
         * insert waited for it): this statement sees it */
        if (model_by_sha(c, m->sha256, old) != 0)
            goto fail;
    }
    if (!strcmp(old->status, "failed")) {
        /* the new registration's file name decides the path and the format: the failed
         * one may have named the wrong format */
        static const char *sql = "UPDATE models SET status='fetching', url=?, name=?, tokenizer=?, size_bytes=?, "
                                 "bytes_done=0, bytes_total=?, error='', path=?, format=?, updated_at=? "
                                 "WHERE id=?";
        if (sql_run(c, sql, "tttIIttIt", m->url, m->name, m->tokenizer, m->size_bytes, m->size_bytes, m->path,
                    m->format, store_now(), old->id) < 0 ||
            model_by_sha(c, m->sha256, old) != 0)
            goto fail;
        *restarted = 1;
    }
    if (sql_commit(c) < 0)
        goto fail;
    *m = *old;
    free(old);
    return 1;
fail:
    free(old);
    sql_rollback(c);
    return -1;
}

int store_model_next_fetch(store *st, int64_t after_seq, store_model *out)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    /* those registered after after_seq first, then from the start */
    static const char *q = "SELECT " MODEL_COLS " FROM models WHERE status='fetching' "
                           "ORDER BY (seq <= ?), seq LIMIT 1";
    return sql_row(c, q, "I", "r", after_seq, model_from_row, out);
}

int store_model_fetch_waiting(store *st, const char *id)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "SELECT COUNT(*) FROM models WHERE status='fetching' AND id<>?";
    int64_t n = 0;
    return sql_row(c, q, "t", "I", id, &n) < 0 ? -1 : n > 0;
}

int store_model_fetch_progress(store *st, const char *id, int64_t bytes_done, int64_t bytes_total)
{
    store_conn *c = store_conn_get(st);
    static const char *sql = "UPDATE models SET bytes_done=?, bytes_total=?, updated_at=? "
                             "WHERE id=? AND status='fetching'";
    return c && sql_run(c, sql, "IIIt", bytes_done, bytes_total, store_now(), id) >= 0 ? 0 : -1;
}

int store_model_fetch_done(store *st, const char *id, const char *status, int64_t bytes, const char *error)
{
    store_conn *c = store_conn_get(st);
    if (!c || (strcmp(status, "ready") && strcmp(status, "failed")))
        return -1;
    static const char *sql_ready = "UPDATE models SET status='ready', bytes_done=?, bytes_total=?, error='', "
                                   "updated_at=? WHERE id=? AND status='fetching'";
    static const char *sql_failed = "UPDATE models SET status='failed', error=?, updated_at=? "
                                    "WHERE id=? AND status='fetching'";
    int changed = !strcmp(status, "ready") ? sql_run(c, sql_ready, "IIIt", bytes, bytes, store_now(), id)
                                           : sql_run(c, sql_failed, "tIt", error, store_now(), id);
    if (changed < 0)
        return -1;
    return changed == 1 ? 0 : 1;
}

int store_model_get(store *st, const char *id, store_model *out)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "SELECT " MODEL_COLS " FROM models WHERE id=?";
    return sql_row(c, q, "t", "r", id, model_from_row, out);
}

int store_model_list(store *st, const char *after, int limit, store_model **out, int *n,
                     int *has_more)
{
    *out = NULL;
    *n = 0;
    *has_more = 0;
    store_conn *c = store_conn_get(st);
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
    sql_stmt *s = sql_query(c, q, "Ii", after_seq, limit + 1);
    if (!s)
        return -1;
    *out = sql_rows(s, limit, sizeof **out, model_from_row, NULL, n, has_more);
    return *out ? 0 : -1;
}
