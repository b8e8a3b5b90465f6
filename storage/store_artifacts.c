/* storage/store_artifacts.c — artifact metadata (see store.h): one row per (job, name),
 * its bytes in storage/artstore.c by sha-256. Publishing records the row and its
 * "artifact.published" event in one transaction.
 */
#include "storage/store_internal.h"
#include "storage/artstore.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void artifact_from_row(sql_stmt *s, void *out)
{
    store_artifact *a = out;
    memset(a, 0, sizeof *a);
    sql_cols(s, "tttttItI", a->id, sizeof a->id, a->job_id, sizeof a->job_id, a->name, sizeof a->name, a->stage,
             sizeof a->stage, a->sha256, sizeof a->sha256, &a->size_bytes, a->content_type, sizeof a->content_type,
             &a->created_at);
}

int store_artifact_publish(store *st, artstore *as, const char *src, store_artifact *a, char *err, size_t errlen)
{
    if (art_put(as, src, a->sha256, &a->size_bytes, err, errlen) < 0)
        return -1;
    int lk = art_lock(as, 0, -1, err, errlen);   /* a worker: it waits for a delete to end */
    if (lk < 0)
        return -1;
    /* a delete may have taken the blob since art_put found it stored (another job's, orphaned) */
    int rc = !art_has(as, a->sha256, a->size_bytes) && art_put(as, src, a->sha256, &a->size_bytes, err, errlen) < 0
                 ? -1 : 0;
    int added = rc == 0 ? store_artifact_add(st, a) : 0;
    if (added == STORE_FENCED) {
        snprintf(err, errlen, "artifact %s not recorded: job %s is no longer running at this worker's attempt",
                 a->name, a->job_id);
        rc = STORE_FENCED;
    } else if (added < 0) {
        snprintf(err, errlen, "recording artifact %s failed", a->name);
        rc = -1;
    }
    art_unlock(lk);
    return rc;
}

int store_job_remove(store *st, artstore *as, const char *id, double wait_s, char *err, size_t errlen)
{
    int lk = art_lock(as, 1, wait_s, err, errlen);
    if (lk < 0)
        return lk == -2 ? 3 : -1;
    char **orphans = NULL;
    int n = 0, rc = store_job_delete(st, id, &orphans, &n);
    for (int i = 0; i < n; i++) {
        art_remove(as, orphans[i]);
        free(orphans[i]);
    }
    free(orphans);
    art_unlock(lk);
    if (rc < 0)
        snprintf(err, errlen, "the job store could not be updated");
    return rc;
}

int store_artifact_add(store *st, store_artifact *a)
{
    store_conn *c = store_conn_get(st);
    if (!c || store_new_id("art_", a->id, sizeof a->id) < 0)
        return -1;
    a->created_at = store_now();
    if (sql_begin(c) < 0)
        return -1;
    int fence = store_fence_check(c, a->job_id, store_fence_attempt(c, a->job_id));
    if (fence != 0)
        return sql_abandon(c, fence);
    /* the job's row first: its events are appended under its lock (store_events.c) */
    if (store_job_touch(c, a->job_id) < 0)
        return sql_abandon(c, -1);
    static const char *sql = "INSERT INTO artifacts(id, job_id, name, stage, sha256, size_bytes, content_type, "
                             "created_at) VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (job_id, name) DO UPDATE SET "
                             "id=excluded.id, stage=excluded.stage, sha256=excluded.sha256, "
                             "size_bytes=excluded.size_bytes, content_type=excluded.content_type, "
                             "created_at=excluded.created_at";
    if (sql_run(c, sql, "tttttItI", a->id, a->job_id, a->name, a->stage, a->sha256, a->size_bytes,
            a->content_type, a->created_at) < 0)
        return sql_abandon(c, -1);
    char msg[320];
    snprintf(msg, sizeof msg, "artifact %s published", a->name);
    json_t *d = json_pack("{s:s,s:s,s:s,s:I}", "id", a->id, "name", a->name, "sha256", a->sha256,
                          "size_bytes", (json_int_t)a->size_bytes);
    if (store_event_insert(c, a->job_id, "artifact.published", msg, d) < 0 || sql_commit(c) < 0)
        return sql_abandon(c, -1);
    return 0;
}

#define ART_COLS "id, job_id, name, stage, sha256, size_bytes, content_type, created_at"

int store_artifact_get(store *st, const char *job_id, const char *name, store_artifact *out)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "SELECT " ART_COLS " FROM artifacts WHERE job_id=? AND name=?";
    return sql_row(c, q, "tt", "r", job_id, name, artifact_from_row, out);
}

int store_artifact_list(store *st, const char *job_id, store_artifact **out, int *n)
{
    *out = NULL;
    *n = 0;
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *q = "SELECT " ART_COLS " FROM artifacts WHERE job_id=? ORDER BY name";
    sql_stmt *s = sql_query(c, q, "t", job_id);
    if (!s)
        return -1;
    *out = sql_rows(s, INT_MAX, sizeof **out, artifact_from_row, NULL, n, NULL);
    return *out ? 0 : -1;
}
