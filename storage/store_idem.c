/* storage/store_idem.c — idempotency records (see store.h): a POST with an
 * Idempotency-Key is recorded with its body's sha-256 and the response to replay, in the
 * transaction that creates its job, so a retried request finds the first answer.
 */
#include "storage/store_internal.h"

int store_idem_insert(store_conn *c, const char *scope, const char *key, const char *body_sha256,
                      const char *job_id, int resp_status, const char *resp_text)
{
    /* a key another request recorded first, even one committing right now, changes nothing */
    static const char *ins = "INSERT INTO idempotency(scope, key, body_sha256, job_id, status, "
                             "response, created_at) VALUES (?,?,?,?,?,?,?) ON CONFLICT (scope, key) DO NOTHING";
    int changed = sql_run(c, ins, "ttttitI", scope, key, body_sha256, job_id, resp_status, resp_text, store_now());
    return changed < 0 ? -1 : changed == 0 ? 1 : 0;
}

int store_idem_get(store *st, const char *scope, const char *key, char sha256_out[65],
                   int *resp_status, char **resp_text)
{
    store_conn *c = store_conn_get(st);
    if (!c)
        return -1;
    static const char *sql = "SELECT body_sha256, status, response FROM idempotency WHERE scope=? AND key=?";
    int rc = sql_row(c, sql, "tt", "tis", scope, key, sha256_out, (size_t)65, resp_status, resp_text);
    return rc == 0 && !*resp_text ? -1 : rc;
}
