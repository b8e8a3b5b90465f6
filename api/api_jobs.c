/* api/api_jobs.c — /v1/jobs and /v1/calibrations: create (validated spec, idempotency
 * keys), list, get (ETag, long-poll), cancel, delete, events (cursor, long-poll), report
 * and artifacts (streamed from the fd with Range, strong ETag = sha-256, Repr-Digest).
 */
#define _XOPEN_SOURCE 700
#include "api/api_internal.h"
#include "engine/clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jobs/pipeline.h"
#include "jobs/stage.h"
#include "storage/fileio.h"

static int is_terminal(const char *s)
{
    return !strcmp(s, "succeeded") || !strcmp(s, "failed") || !strcmp(s, "cancelled");
}

static json_t *opt_time(int64_t t)
{
    return t ? json_integer(t) : json_null();
}

static json_t *render_job(const store_job *j)
{
    int cal = !strcmp(j->kind, "calibration");
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(j->id));
    json_object_set_new(o, "object", json_string(cal ? "calibration" : "job"));
    json_object_set_new(o, "status", json_string(j->status));
    json_object_set_new(o, "name", json_string(j->name));
    json_object_set_new(o, "device", json_string(j->device));
    json_object_set_new(o, "created_at", json_integer(j->created_at));
    json_object_set_new(o, "started_at", opt_time(j->started_at));
    json_object_set_new(o, "finished_at", opt_time(j->finished_at));
    json_object_set_new(o, "stage", j->stage[0] ? json_string(j->stage) : json_null());
    json_object_set(o, "stages", j->stages);
    json_object_set_new(o, "stages_done", json_integer(j->stage_index));
    if (j->stage[0]) {
        double pct = j->total_steps > 0 ? 100.0 * (double)j->step / (double)j->total_steps : 0.0;
        json_object_set_new(o, "progress", json_pack("{s:s,s:I,s:I,s:f}", "stage", j->stage, "step",
                                                     (json_int_t)j->step, "total_steps",
                                                     (json_int_t)j->total_steps, "percent", pct));
    } else {
        json_object_set_new(o, "progress", json_null());
    }
    json_object_set_new(o, "error", j->error_code[0] ? json_pack("{s:s,s:o}", "code", j->error_code, "message",
                                                                 api_text_json(j->error_message))
                                                     : json_null());
    json_object_set_new(o, "cancel_requested", json_boolean(j->cancel_requested));
    json_object_set_new(o, "attempts", json_integer(j->attempts));
    json_object_set_new(o, "runner", j->lease_owner[0] && !strcmp(j->status, "running") ? json_string(j->lease_owner)
                                                                                         : json_null());
    if (cal) {
        json_t *m = json_object_get(j->spec, "model"), *a = json_object_get(j->spec, "arch");
        json_object_set_new(o, "model", m ? json_incref(m) : json_null());
        if (a)
            json_object_set(o, "arch", a);
        json_object_set(o, "target", json_object_get(j->spec, "target"));
    } else {
        json_object_set(o, "spec", j->spec);
    }
    return o;
}

static void set_etag(api_resp *resp, const char *id, int64_t version)
{
    api_resp_header(resp, "ETag", "\"%s.%lld\"", id, (long long)version);
}

/* Does the If-None-Match header list this ETag (or "*")? */
static int inm_matches(const char *inm, const char *etag)
{
    if (!inm)
        return 0;
    if (!strcmp(inm, "*"))
        return 1;
    size_t n = strlen(etag);
    for (const char *p = inm; (p = strstr(p, etag)) != NULL; p += n) {
        char after = p[n];
        if (after == 0 || after == ',' || after == ' ')
            return 1;
    }
    return 0;
}

static const char *hdr(const api_req *req, const char *name)
{
    return req->header ? req->header(req->h, name) : NULL;
}

/* Load job id of `kind`; on absence a 404 problem. 0 found, -1 otherwise. */
static int load(api_ctx *ctx, const char *id, const char *kind, store_job *j, api_resp *resp)
{
    int rc = store_job_get(ctx->st, id, j);
    if (rc == 0 && strcmp(j->kind, kind) != 0) {
        store_job_clear(j);
        rc = 1;
    }
    if (rc == 1) {
        char d[160];
        snprintf(d, sizeof d, "no %s with id %.64s", kind, id);
        api_problem(resp, 404, "not_found", d, NULL);
    } else if (rc < 0) {
        api_problem(resp, 503, "store_unavailable", "the job store could not be read", NULL);
    }
    return rc == 0 ? 0 : -1;
}

/* The status of job id, of either kind, into status. 0, or -1 with a problem set: 404
 * for no such job, 503 when the store cannot be read. */
static int job_status(api_ctx *ctx, const char *id, char status[16], api_resp *resp)
{
    int64_t version;
    int rc = store_job_version(ctx->st, id, &version, status);
    if (rc != 0)
        api_problem(resp, rc == 1 ? 404 : 503, rc == 1 ? "not_found" : "store_unavailable",
                    rc == 1 ? "no such job" : "the job store could not be read", NULL);
    return rc == 0 ? 0 : -1;
}

/* ---- create ------------------------------------------------------------------------ */

static int idem_key_ok(const char *k)
{
    size_t n = strlen(k);
    if (n < 1 || n > 255)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (k[i] < 0x21 || k[i] > 0x7e)
            return 0;
    return 1;
}

/* The stored answer to an Idempotency-Key, as read once: replayed when the body's digest
 * is the stored one, else 422. Takes text (the response's body, or freed). */
static void replay(api_resp *resp, const char *stored, int status, char *text, const char *sha)
{
    if (strcmp(stored, sha) != 0) {
        free(text);
        api_problem(resp, 422, "idempotency_key_reused",
                    "this Idempotency-Key was already used with a different request body", NULL);
        return;
    }
    api_text(resp, status, text, strlen(text), "application/json");
    api_resp_header(resp, "Idempotent-Replayed", "true");
    json_t *j = json_loads(text, 0, NULL);
    const char *id = json_string_value(json_object_get(j, "id"));
    if (id)
        api_resp_header(resp, "Location", "/v1/%s/%s", !strncmp(id, "cal_", 4) ? "calibrations" : "jobs", id);
    json_decref(j);
}

/* Answer from the key's record when it has one: 1 when answered (a replay, a 422, or a 503
 * when the record cannot be read), 0 when the key has none (it is new, or its job was
 * deleted and the record with it). */
static int replay_if_known(api_resp *resp, store *st, const char *scope, const char *key, const char *sha)
{
    char stored[65];
    int status = 0;
    char *text = NULL;
    int rc = store_idem_get(st, scope, key, stored, &status, &text);
    if (rc == 1)
        return 0;
    if (rc != 0) {
        api_problem(resp, 503, "store_unavailable", "the idempotency record could not be read", NULL);
        return 1;
    }
    replay(resp, stored, status, text, sha);
    return 1;
}

static void create_common(api_ctx *ctx, const api_req *req, api_resp *resp, int calibration)
{
    const char *scope = calibration ? "POST /v1/calibrations" : "POST /v1/jobs";
    const char *key = hdr(req, "Idempotency-Key");
    if (key && !idem_key_ok(key)) {
        api_problem(resp, 400, "invalid_idempotency_key",
                    "Idempotency-Key must be 1 to 255 visible ASCII characters", NULL);
        return;
    }
    json_t *body = api_parse_body(req, resp);
    if (!body)
        return;
    char sha[65];
    char *canon = json_dumps(body, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    art_sha256_buf(canon ? canon : "", canon ? strlen(canon) : 0, sha);
    free(canon);
    if (key && replay_if_known(resp, ctx->st, scope, key, sha)) {
        json_decref(body);
        return;
    }
    spec_env env = api_spec_env(ctx);
    int status = 0;
    json_t *errors = NULL;
    json_t *spec = calibration ? spec_validate_calibration(body, &env, &status, &errors)
                               : spec_validate(body, &env, &status, &errors);
    json_decref(body);
    if (!spec) {
        api_spec_problem(resp, calibration ? "calibration request" : "spec", status, errors);
        return;
    }
    store_job j;
    memset(&j, 0, sizeof j);
    if (store_new_id(calibration ? "cal_" : "job_", j.id, sizeof j.id) < 0) {
        json_decref(spec);
        api_problem(resp, 500, "internal", "no random id available", NULL);
        return;
    }
    snprintf(j.kind, sizeof j.kind, "%s", calibration ? "calibration" : "job");
    snprintf(j.status, sizeof j.status, "queued");
    snprintf(j.device, sizeof j.device, "%s", json_string_value(json_object_get(json_object_get(spec, "target"), "device")));
    snprintf(j.name, sizeof j.name, "%s", json_string_value(json_object_get(spec, "name")));
    j.spec = spec;
    j.stages = job_pipeline_for(j.kind, spec);
    j.report = json_object();
    j.created_at = j.updated_at = store_now();
    j.version = 1;
    int code = calibration ? 202 : 201;
    json_t *rendered = render_job(&j);
    char *text = json_dumps(rendered, JSON_COMPACT);
    char err[256];
    int rc = 1;
    /* the key taken by a request beside this one: its answer is ours; gone again (its job
     * deleted since), the key is free for this one */
    for (int tries = 0; rc == 1 && tries < 3; tries++) {
        rc = text ? store_job_create(ctx->st, &j, key ? scope : NULL, key, sha, code, text, err, sizeof err) : -1;
        if (rc == 1 && replay_if_known(resp, ctx->st, scope, key, sha)) {
            free(text);
            json_decref(rendered);
            store_job_clear(&j);
            return;
        }
    }
    free(text);
    if (rc != 0) {   /* -1, or the key taken and freed again at every try */
        json_decref(rendered);
        store_job_clear(&j);
        api_problem(resp, 503, "store_unavailable", "the job could not be stored; retry", NULL);
        return;
    }
    if (ctx->sched)
        sched_notify(ctx->sched);
    api_resp_header(resp, "Location", "/v1/%s/%s", calibration ? "calibrations" : "jobs", j.id);
    set_etag(resp, j.id, j.version);
    api_json(resp, code, rendered);
    store_job_clear(&j);
}

void api_spec_problem(api_resp *resp, const char *what, int status, json_t *errors)
{
    char detail[600];
    const char *first = json_string_value(json_object_get(json_array_get(errors, 0), "message"));
    const char *ptr = json_string_value(json_object_get(json_array_get(errors, 0), "pointer"));
    snprintf(detail, sizeof detail, "the %s is invalid: %s: %s%s", what, ptr && ptr[0] ? ptr : "(root)",
             first ? first : "?", json_array_size(errors) > 1 ? " (and more: see errors)" : "");
    api_problem(resp, status, status == 403 ? "path_forbidden" : status == 400 ? "invalid_spec" : "unprocessable_spec",
                detail, errors);
}

void h_jobs_create(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)params;
    create_common(ctx, req, resp, 0);
}

void h_cal_create(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)params;
    create_common(ctx, req, resp, 1);
}

/* ---- rendered-job cache --------------------------------------------------------------
 * Status polls dominate the traffic; a job's JSON only changes with its version, so the
 * rendered text is cached per (id, version) in a fixed table with striped locks. */

#define JC_SLOTS 4096
#define JC_STRIPES 16
static struct {
    char id[48];
    int64_t version;
    char *text;
    size_t len;
} jc[JC_SLOTS];
static pthread_mutex_t jc_mu[JC_STRIPES] = {
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};

static unsigned jc_slot(const char *id)
{
    unsigned h = 2166136261u;
    for (const char *p = id; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    return h % JC_SLOTS;
}

/* A malloc'd copy of the cached text for (id, version), or NULL. */
static char *jc_get(const char *id, int64_t version, size_t *len)
{
    unsigned k = jc_slot(id);
    char *copy = NULL;
    pthread_mutex_lock(&jc_mu[k % JC_STRIPES]);
    if (jc[k].text && jc[k].version == version && !strcmp(jc[k].id, id) && (copy = malloc(jc[k].len + 1))) {
        memcpy(copy, jc[k].text, jc[k].len + 1);
        *len = jc[k].len;
    }
    pthread_mutex_unlock(&jc_mu[k % JC_STRIPES]);
    return copy;
}

static void jc_put(const char *id, int64_t version, const char *text, size_t len)
{
    char *copy = malloc(len + 1);
    if (!copy || strlen(id) >= sizeof jc[0].id) {
        free(copy);
        return;
    }
    memcpy(copy, text, len + 1);
    unsigned k = jc_slot(id);
    pthread_mutex_lock(&jc_mu[k % JC_STRIPES]);
    free(jc[k].text);
    snprintf(jc[k].id, sizeof jc[k].id, "%s", id);
    jc[k].version = version;
    jc[k].text = copy;
    jc[k].len = len;
    pthread_mutex_unlock(&jc_mu[k % JC_STRIPES]);
}

/* ---- list / get -------------------------------------------------------------------- */

static void list_common(api_ctx *ctx, const api_req *req, api_resp *resp, const char *kind)
{
    long long limit;
    if (api_query_int(req, "limit", 1, 1000, 20, &limit, resp) < 0)
        return;
    int cal = !strcmp(kind, "calibration");
    const char *after;
    if (api_query_cursor(req, cal ? "cal_" : "job_", &after, resp) < 0)
        return;
    store_job *jobs = NULL;
    int n = 0, more = 0;
    int rc = store_job_list(ctx->st, kind, after, (int)limit, &jobs, &n, &more);
    if (rc == 1) {
        api_cursor_not_found(resp, cal ? "calibration" : "job");
        return;
    }
    if (rc < 0) {
        api_problem(resp, 503, "store_unavailable", "the job store could not be read", NULL);
        return;
    }
    json_t *data = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(data, render_job(&jobs[i]));
    api_list(resp, data, more, n ? jobs[0].id : NULL, n ? jobs[n - 1].id : NULL);
    store_job_list_free(jobs, n);
}

void h_jobs_list(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)params;
    list_common(ctx, req, resp, "job");
}

void h_cal_list(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)params;
    list_common(ctx, req, resp, "calibration");
}

/* The deadline of a long-poll (0 when wait=0). -1 on a bad parameter (problem set). */
static int wait_deadline(api_ctx *ctx, const api_req *req, api_resp *resp, double *deadline)
{
    long long wait;
    /* any wait the contract allows; the server's --max-wait-s caps it */
    if (api_query_int(req, "wait", 0, 3600, 0, &wait, resp) < 0)
        return -1;
    if (wait > ctx->max_wait_s)
        wait = ctx->max_wait_s;
    *deadline = wait == 0 ? 0 : req->deadline > 0 ? req->deadline : eng_wall_s() + (double)wait;
    return 0;
}

/* A calibration's document (o, render_job's) gets "result": the calibrate stage's result
 * document once it succeeded ("calibration.json", or, as the stage publishes it today,
 * "timing_tables.json"), else null. */
static void cal_result(api_ctx *ctx, const store_job *j, json_t *o)
{
    json_t *result = json_null();
    store_artifact a;
    if (!strcmp(j->status, "succeeded") && (store_artifact_get(ctx->st, j->id, "calibration.json", &a) == 0 ||
                                            store_artifact_get(ctx->st, j->id, "timing_tables.json", &a) == 0)) {
        char err[256];
        int fd = art_open_blob(ctx->as, a.sha256, a.size_bytes, 1, err, sizeof err);
        if (fd >= 0) {
            FILE *f = fdopen(fd, "r");
            json_error_t e;
            json_t *doc = f ? json_loadf(f, 0, &e) : NULL;
            if (f)
                fclose(f);
            else
                close(fd);
            if (doc) {
                json_decref(result);
                result = doc;
            }
        }
    }
    json_object_set_new(o, "result", result);
}

static void get_common(api_ctx *ctx, const api_req *req, const char *id, api_resp *resp, const char *kind)
{
    double deadline;
    if (wait_deadline(ctx, req, resp, &deadline) < 0)
        return;
    int64_t version;
    char status[16];
    int rc = store_job_version(ctx->st, id, &version, status);
    if (rc < 0) {   /* the store did not answer: not a 404, whatever a second read would say */
        api_problem(resp, 503, "store_unavailable", "the job store could not be read", NULL);
        return;
    }
    /* every id carries its kind ("job_", "cal_"): one of the other kind is not parked */
    if (rc == 0 && strncmp(id, strcmp(kind, "job") ? "cal_" : "job_", 4))
        rc = 1;
    if (rc != 0) {
        store_job j;
        if (load(ctx, id, kind, &j, resp) == 0) /* kind mismatch: load answers */
            store_job_clear(&j);
        if (!resp->status)
            api_problem(resp, 404, "not_found", "no such job", NULL);
        return;
    }
    char etag[96];
    snprintf(etag, sizeof etag, "\"%s.%lld\"", id, (long long)version);
    const char *inm = hdr(req, "If-None-Match");
    int same = inm_matches(inm, etag);
    if (deadline > 0 && !is_terminal(status) && (!inm || same) && eng_wall_s() < deadline && !ctx->shutting_down) {
        resp->wait_until = deadline;
        resp->status = 200; /* provisional: the request is parked and asked again */
        return;
    }
    int is_job = !strcmp(kind, "job");
    if (is_job && !strncmp(id, "job_", 4)) {
        /* fast path: a 304, or the cached rendering of this version */
        if (same) {
            set_etag(resp, id, version);
            resp->status = 304;
            resp->no_body = 1;
            return;
        }
        size_t len = 0;
        char *text = jc_get(id, version, &len);
        if (text) {
            set_etag(resp, id, version);
            resp->status = 200;
            resp->text = text;
            resp->text_len = len;
            resp->content_type = "application/json";
            return;
        }
    }
    store_job j;
    if (load(ctx, id, kind, &j, resp) < 0)
        return;
    set_etag(resp, j.id, j.version);
    snprintf(etag, sizeof etag, "\"%s.%lld\"", id, (long long)j.version);
    if (inm_matches(inm, etag)) {
        resp->status = 304;
        resp->no_body = 1;
        store_job_clear(&j);
        return;
    }
    json_t *o = render_job(&j);
    if (is_job) {
        char *text = json_dumps(o, JSON_COMPACT);
        if (text) {
            size_t len = strlen(text);
            jc_put(j.id, j.version, text, len);
            json_decref(o);
            store_job_clear(&j);
            resp->status = 200;
            resp->text = text;
            resp->text_len = len;
            resp->content_type = "application/json";
            return;
        }
    }
    if (!strcmp(kind, "calibration"))
        cal_result(ctx, &j, o);
    store_job_clear(&j);
    api_json(resp, 200, o);
}

void h_jobs_get(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    get_common(ctx, req, params[0], resp, "job");
}

void h_cal_get(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    get_common(ctx, req, params[0], resp, "calibration");
}

/* ---- cancel / delete --------------------------------------------------------------- */

/* Cancel the job or calibration id (kind), answering with it as its GET renders it (no
 * wait, no conditional: a POST). */
static void cancel_common(api_ctx *ctx, const char *id, api_resp *resp, const char *kind)
{
    store_job j;
    if (load(ctx, id, kind, &j, resp) < 0)
        return;
    store_job_clear(&j);
    int rc = store_job_cancel(ctx->st, id, &j);
    if (rc != 0) {
        api_problem(resp, rc == 1 ? 404 : 503, rc == 1 ? "not_found" : "store_unavailable",
                    rc == 1 ? "no such job" : "the job store could not be updated", NULL);
        return;
    }
    if (!strcmp(j.status, "running") && ctx->sched)
        sched_cancel(ctx->sched, j.id);
    set_etag(resp, j.id, j.version);
    json_t *o = render_job(&j);
    if (strcmp(kind, "job"))   /* a calibration's document carries its result */
        cal_result(ctx, &j, o);
    api_json(resp, 200, o);
    store_job_clear(&j);
}

void h_jobs_cancel(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)req;
    cancel_common(ctx, params[0], resp, "job");
}

void h_cal_cancel(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)req;
    cancel_common(ctx, params[0], resp, "calibration");
}

void h_jobs_delete(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)req;
    store_job j;
    if (load(ctx, params[0], "job", &j, resp) < 0)
        return;
    store_job_clear(&j);
    char err[512];
    int rc = store_job_remove(ctx->st, ctx->as, params[0], 5.0, err, sizeof err);   /* a request waits 5 s at most */
    if (rc == 3) {
        api_problem(resp, 503, "store_busy", "the artifact store is busy publishing; retry", NULL);
        return;
    }
    if (rc == 2) {
        api_problem(resp, 409, "job_not_terminal", "only a succeeded, failed or cancelled job can be deleted; cancel it first", NULL);
        return;
    }
    if (rc != 0) {
        api_problem(resp, rc == 1 ? 404 : 503, rc == 1 ? "not_found" : "store_unavailable",
                    rc == 1 ? "no such job" : "the job or artifact store could not be updated", NULL);
        return;
    }
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/jobs/%s", ctx->data_dir, params[0]);
    if (job_artifact_name_ok(params[0]))
        (void)fio_remove_tree(dir);
    api_json(resp, 200, json_pack("{s:s,s:s,s:b}", "id", params[0], "object", "job.deleted", "deleted", 1));
}

/* ---- events ------------------------------------------------------------------------ */

void h_events_list(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    long long limit;
    double deadline;
    if (api_query_int(req, "limit", 1, 1000, 100, &limit, resp) < 0 || wait_deadline(ctx, req, resp, &deadline) < 0)
        return;
    int64_t after = 0;
    const char *a = req->query ? req->query(req->h, "after") : NULL;
    if (a) {
        /* ^evt_[0-9]{1,18}$, as the contract says (strtoll alone took "evt_-0", "evt_+5") */
        size_t nd = strncmp(a, "evt_", 4) == 0 ? strspn(a + 4, "0123456789") : 0;
        long long x = nd >= 1 && nd <= 18 && !a[4 + nd] ? strtoll(a + 4, NULL, 10) : -1;
        if (x < 0) {
            api_problem(resp, 400, "invalid_parameter", "query parameter after must be an event id (evt_...)",
                        json_pack("[{s:s,s:s}]", "parameter", "after", "message", "must be an event id"));
            return;
        }
        after = x;
    }
    char status[16];
    if (job_status(ctx, params[0], status, resp) < 0)
        return;
    store_event *ev = NULL;
    int n = 0, more = 0;
    if (store_event_list(ctx->st, params[0], after, (int)limit, &ev, &n, &more) < 0) {
        api_problem(resp, 503, "store_unavailable", "the event log could not be read", NULL);
        return;
    }
    if (n == 0 && deadline > 0 && !is_terminal(status) && eng_wall_s() < deadline && !ctx->shutting_down) {
        store_event_list_free(ev, n);
        resp->wait_until = deadline;
        resp->status = 200;
        return;
    }
    json_t *data = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(data, json_pack("{s:s,s:s,s:s,s:s,s:o,s:O?,s:I}", "id", ev[i].id, "object", "event",
                                              "job_id", ev[i].job_id, "type", ev[i].type, "message",
                                              api_text_json(ev[i].message), "data", ev[i].data, "created_at",
                                              (json_int_t)ev[i].created_at));
    api_list(resp, data, more, n ? ev[0].id : NULL, n ? ev[n - 1].id : NULL);
    store_event_list_free(ev, n);
}

/* ---- report ------------------------------------------------------------------------ */

void h_report_get(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)req;
    store_job j;
    if (load(ctx, params[0], "job", &j, resp) < 0)
        return;
    json_t *r = json_deep_copy(j.report);
    if (!json_is_object(r)) {
        json_decref(r);
        r = json_object();
    }
    json_object_set_new(r, "job_id", json_string(j.id));
    json_object_set_new(r, "status", json_string(j.status));
    json_object_set_new(r, "complete", json_boolean(!strcmp(j.status, "succeeded")));
    json_object_set(r, "method", json_object_get(j.spec, "method"));
    json_object_set(r, "target", json_object_get(j.spec, "target"));
    if (!json_object_get(r, "stages"))
        json_object_set_new(r, "stages", json_array());
    store_job_clear(&j);
    api_json(resp, 200, r);
}

/* ---- artifacts --------------------------------------------------------------------- */

static json_t *render_artifact(const store_artifact *a)
{
    char url[400];
    snprintf(url, sizeof url, "/v1/jobs/%s/artifacts/%s", a->job_id, a->name);
    return json_pack("{s:s,s:s,s:s,s:s,s:s,s:I,s:s,s:s,s:I,s:s}", "id", a->id, "object", "artifact", "job_id",
                     a->job_id, "name", a->name, "stage", a->stage, "size_bytes", (json_int_t)a->size_bytes,
                     "sha256", a->sha256, "content_type", a->content_type, "created_at",
                     (json_int_t)a->created_at, "url", url);
}

void h_artifacts_list(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)req;
    char status[16];
    if (job_status(ctx, params[0], status, resp) < 0)
        return;
    store_artifact *arts = NULL;
    int n = 0;
    if (store_artifact_list(ctx->st, params[0], &arts, &n) < 0) {
        api_problem(resp, 503, "store_unavailable", "the artifact list could not be read", NULL);
        return;
    }
    json_t *data = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(data, render_artifact(&arts[i]));
    api_list(resp, data, 0, n ? arts[0].id : NULL, n ? arts[n - 1].id : NULL);
    free(arts);
}

/* Parse a single "bytes=" range against size. Returns 1 with [*from, *to] (inclusive),
 * 0 when the header should be ignored (absent, malformed or several ranges), -1 when
 * unsatisfiable. A position past 2^63 - 1 (RFC 9110 allows any number of digits) reads
 * as LLONG_MAX, which strtoll saturates to: past any artifact's end, not malformed. */
static int parse_range(const char *h, int64_t size, int64_t *from, int64_t *to)
{
    if (!h || strncmp(h, "bytes=", 6) != 0 || strchr(h, ','))
        return 0;
    const char *p = h + 6;
    char *end;
    if (*p == '-') {
        if (p[1] < '0' || p[1] > '9')
            return 0;
        long long n = strtoll(p + 1, &end, 10);
        if (*end)
            return 0;
        if (n == 0 || size == 0)
            return -1;
        *from = n >= size ? 0 : size - n;
        *to = size - 1;
        return 1;
    }
    if (*p < '0' || *p > '9')
        return 0;
    long long a = strtoll(p, &end, 10);
    if (*end != '-')
        return 0;
    long long b = size - 1;
    if (end[1]) {
        if (end[1] < '0' || end[1] > '9')
            return 0;
        char *e2;
        b = strtoll(end + 1, &e2, 10);
        if (*e2 || b < a)
            return 0;
        if (b > size - 1)
            b = size - 1;
    }
    if (a >= size)
        return -1;
    *from = a;
    *to = b;
    return 1;
}

void h_artifact_get(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    const char *name = params[1];
    if (!job_artifact_name_ok(name)) {
        api_problem(resp, 400, "invalid_artifact_name",
                    "artifact names are 1 to 200 characters of [A-Za-z0-9._-] and do not start with '.'",
                    json_pack("[{s:s,s:s}]", "parameter", "name", "message", "invalid artifact name"));
        return;
    }
    store_artifact a;
    int rc = store_artifact_get(ctx->st, params[0], name, &a);
    if (rc != 0) {
        api_problem(resp, rc == 1 ? 404 : 503, rc == 1 ? "not_found" : "store_unavailable",
                    rc == 1 ? "no such job or artifact" : "the artifact store could not be read", NULL);
        return;
    }
    char etag[70], b64[48];
    snprintf(etag, sizeof etag, "\"%s\"", a.sha256);
    if (inm_matches(hdr(req, "If-None-Match"), etag)) {
        api_resp_header(resp, "ETag", "%s", etag);
        api_resp_header(resp, "Cache-Control", "private, immutable");
        resp->status = 304;
        resp->no_body = 1;
        return;
    }
    int64_t from = 0, to = a.size_bytes - 1;
    const char *range = hdr(req, "Range");
    const char *if_range = hdr(req, "If-Range");
    int pr = range ? parse_range(range, a.size_bytes, &from, &to) : 0;
    if (pr != 0 && if_range && strcmp(if_range, etag) != 0)
        pr = 0; /* the representation changed (or a weak validator): send it whole */
    /* a part is hashed whole before it goes out, unless this process or the file's mark says
       it was (art_put marks what it stores, the scrub what it checks); a whole download is
       hashed on the way (art_stream_new), a HEAD sends nothing */
    char err[512];
    int fd = !strcmp(req->method, "HEAD") ? art_peek_blob(ctx->as, a.sha256, a.size_bytes, err, sizeof err)
                                          : art_open_blob(ctx->as, a.sha256, a.size_bytes, pr == 1, err, sizeof err);
    if (fd == ART_REMOTE_ONLY)
        fd = -1;   /* a HEAD of a blob only the remote store holds: its stream is never read */
    else if (fd < 0) {
        /* a DELETE of the job may have taken row and content since the row was read: then
         * the artifact is gone, not broken */
        store_artifact now;
        if (store_artifact_get(ctx->st, params[0], name, &now) == 1) {
            api_problem(resp, 404, "not_found", "no such job or artifact", NULL);
            return;
        }
        api_problem(resp, 500, "artifact_unreadable", err, NULL);
        return;
    }
    /* the representation's headers go only with it (and a 416 says which one it refers
     * to), never with a problem a browser would save under the artifact's name */
    if (pr < 0) {
        if (fd >= 0)
            close(fd);
        api_resp_header(resp, "ETag", "%s", etag);
        api_resp_header(resp, "Content-Range", "bytes */%lld", (long long)a.size_bytes);
        api_problem(resp, 416, "range_not_satisfiable", "the range lies outside the artifact", NULL);
        return;
    }
    if (pr != 1) {
        from = 0;
        to = a.size_bytes - 1;
    }
    resp->stream = art_stream_new(ctx->as, a.sha256, fd, from, to - from + 1, a.size_bytes);
    if (!resp->stream) {
        if (fd >= 0)
            close(fd);
        api_problem(resp, 500, "internal", "out of memory", NULL);
        return;
    }
    api_resp_header(resp, "ETag", "%s", etag);
    if (art_sha256_b64(a.sha256, b64, sizeof b64) == 0)
        api_resp_header(resp, "Repr-Digest", "sha-256=:%s:", b64);
    api_resp_header(resp, "Accept-Ranges", "bytes");
    api_resp_header(resp, "Cache-Control", "private, immutable");
    api_resp_header(resp, "Content-Disposition", "attachment; filename=\"%s\"", a.name);
    resp->content_type = NULL;
    resp->off = from;
    resp->len = to - from + 1;
    resp->status = pr == 1 ? 206 : 200;
    if (pr == 1)
        api_resp_header(resp, "Content-Range", "bytes %lld-%lld/%lld", (long long)from, (long long)to,
                        (long long)a.size_bytes);
    api_resp_header(resp, "Content-Type", "%s", a.content_type);
}
