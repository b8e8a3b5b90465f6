/* api/api_misc.c — the smaller resources: /v1/models (register a server path, or a URL
 * that the server's model fetcher downloads in the background),
 * /v1/devices, /v1/engines, /v1/estimates (the cost model), /healthz,
 * /readyz and /openapi.yaml (embedded in the binary at build time).
 */
#include "api/api_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "compress/costmodel.h"
#include "compress/llamacpp.h"
#include "engine/devices.h"
#include "storage/strbuf.h"
#include "storage/archjson.h"
#include "storage/fetch.h"
#include "storage/fileio.h"

/* openapi/openapi.yaml, embedded (NUL-terminated). The Makefile names the YAML as a
 * prerequisite of this object, so editing it rebuilds the binary. */
__asm__(".section .rodata\n"
        ".global ac_openapi_yaml\n"
        ".type ac_openapi_yaml, @object\n"
        "ac_openapi_yaml:\n"
        ".incbin \"openapi/openapi.yaml\"\n"
        ".byte 0\n"
        ".size ac_openapi_yaml, .-ac_openapi_yaml\n"
        ".previous\n");
extern const char ac_openapi_yaml[];

static json_t *render_model(const store_model *m)
{
    int by_url = m->url[0] != 0;
    char shown[sizeof m->url + 64];
    fetch_url_shown(m->url, shown, sizeof shown);   /* a presigned URL's secret is not shown */
    json_t *error = !strcmp(m->status, "failed")
                        ? json_pack("{s:s,s:s}", "code", "fetch_failed", "message", m->error)
                        : json_null();
    return json_pack("{s:s,s:s,s:s,s:o,s:s,s:s,s:I,s:s,s:o,s:o,s:o,s:o,s:o}", "id", m->id, "object", "model", "path",
                     m->path, "tokenizer", m->tokenizer[0] ? json_string(m->tokenizer) : json_null(), "name", m->name,
                     "format", m->format, "created_at", (json_int_t)m->created_at, "status",
                     m->status[0] ? m->status : "ready", "url", by_url ? json_string(shown) : json_null(), "sha256",
                     m->sha256[0] ? json_string(m->sha256) : json_null(), "bytes_done",
                     by_url ? json_integer(m->bytes_done) : json_null(), "bytes_total",
                     by_url && m->bytes_total >= 0 ? json_integer(m->bytes_total) : json_null(), "error", error);
}

/* One fault of a model registration: appended to errors; *status keeps the most severe
 * (403 over 400 over 422). */
static void reg_fault(json_t *errors, int *status, int st, const char *ptr, const char *msg)
{
    api_fault_append(errors, ptr, msg);
    if (!*status || st == 403 || (st == 400 && *status == 422))
        *status = st;
}

/* The problem response for a registration with faults (errors stolen). */
static void reg_problem(api_resp *resp, int status, json_t *errors)
{
    const char *first = json_string_value(json_object_get(json_array_get(errors, 0), "message"));
    char detail[700];
    snprintf(detail, sizeof detail, "the model registration is invalid: %s", first ? first : "?");
    api_problem(resp, status, status == 403 ? "path_forbidden" : status == 400 ? "invalid_request" : "unprocessable_request",
                detail, errors);
}

/* The url branch of POST /v1/models: checks what the fetcher needs, registers the model
 * in state "fetching" (or finds the one with the same sha256) and wakes the fetcher. */
static void models_create_url(api_ctx *ctx, json_t *body, api_resp *resp)
{
    json_t *errors = json_array();
    int status = 0;
#define FAULT(st, ptr, msg) reg_fault(errors, &status, st, ptr, msg)
    store_model *m = calloc(1, sizeof *m);
    if (!m) {
        json_decref(errors);
        api_problem(resp, 503, "out_of_memory", "out of memory; retry", NULL);
        return;
    }
    unsigned flags = 0;
    int64_t cap = 0;
    int fetcher = fetch_service_policy(&flags, &cap) == 0;
    char msg[600];
    json_t *x = json_object_get(body, "url");
    const char *url = json_string_value(x);
    if (!json_is_string(x) || strlen(url) != json_string_length(x)) {
        FAULT(400, "/url", "must be a string");
        url = NULL;
    } else if (json_string_length(x) > 2048) {
        FAULT(422, "/url", "at most 2048 characters");
        url = NULL;
    } else {
        int printable = 1;
        for (const char *p = url; *p; p++)
            printable &= (unsigned char)*p > 0x20 && (unsigned char)*p < 0x7f;
        int https = !strncasecmp(url, "https://", 8), http = !strncasecmp(url, "http://", 7);
        const char *host = https || http ? url + (https ? 8 : 7) : url;   /* inside the string either way */
        if (!printable || !(https || http)) {
            FAULT(422, "/url", "must be an https:// URL without spaces");
            url = NULL;
        } else if (memchr(host, '@', strcspn(host, "/?#"))) {   /* the URL is stored and shown to every reader */
            FAULT(422, "/url", "credentials in the URL (user@host) are refused: they would be stored and shown to "
                               "everyone who lists models");
            url = NULL;
        } else if (http && fetcher && !(flags & FETCH_ALLOW_HTTP)) {
            FAULT(422, "/url", "plain http:// is refused: use https:// (a server started with --allow-http-models "
                               "accepts http)");
            url = NULL;
        }
    }
    char file[256] = "";
    if (url) {
        const char *fmt = fetch_model_file_name(url, file, sizeof file, msg, sizeof msg);
        if (!fmt) {
            FAULT(422, "/url", msg);
        } else {
            snprintf(m->url, sizeof m->url, "%s", url);
            snprintf(m->format, sizeof m->format, "%s", fmt);
            snprintf(m->name, sizeof m->name, "%.128s", file);
        }
    }
    x = json_object_get(body, "sha256");
    if (!x) {
        FAULT(400, "/sha256", "required with url: the download is verified against it (64 hex digits)");
    } else if (!json_is_string(x) || json_string_length(x) != 64 ||
               strspn(json_string_value(x), "0123456789abcdefABCDEF") != 64) {
        FAULT(json_is_string(x) ? 422 : 400, "/sha256", "must be 64 hex digits");
    } else {
        for (int i = 0; i < 64; i++)
            m->sha256[i] = (char)tolower((unsigned char)json_string_value(x)[i]);
    }
    m->size_bytes = -1;
    x = json_object_get(body, "size_bytes");
    json_int_t size = 0;
    if (x) {
        if (!spec_json_int(x, &size))
            FAULT(spec_json_big_int(x) ? 422 : 400, "/size_bytes",
                  spec_json_big_int(x) ? "beyond the integers this field holds (magnitude below 2^53)"
                                       : "must be an integer");
        else if (size < 1)
            FAULT(422, "/size_bytes", "must be at least 1");
        else if (fetcher && size > cap) {
            snprintf(msg, sizeof msg, "%lld bytes is over this server's cap of %lld bytes (--max-model-bytes)",
                     (long long)size, (long long)cap);
            FAULT(422, "/size_bytes", msg);
        } else
            m->size_bytes = size;
    }
    x = json_object_get(body, "name");
    if (x) {
        if (!json_is_string(x) || strlen(json_string_value(x)) != json_string_length(x))
            FAULT(400, "/name", "must be a string");
        else if (json_string_length(x) > 128)
            FAULT(422, "/name", "at most 128 bytes of UTF-8");
        else
            snprintf(m->name, sizeof m->name, "%s", json_string_value(x));
    }
    x = json_object_get(body, "tokenizer");
    if (x) {
        spec_env env = api_spec_env(ctx);
        if (!json_is_string(x) || strlen(json_string_value(x)) != json_string_length(x)) {
            FAULT(400, "/tokenizer", "must be a string");
        } else {
            int rc = spec_resolve_path(&env, json_string_value(x), m->tokenizer, sizeof m->tokenizer, msg, sizeof msg);
            const char *kind = rc ? NULL : spec_file_kind(m->tokenizer);
            if (kind)   /* as a path registration's and a job's tokenizer: a file, never opened here */
                snprintf(msg, sizeof msg, "not a regular file (%s)", kind);
            if (rc || kind)
                FAULT(rc ? rc : 422, "/tokenizer", msg);
        }
    }
    if (file[0] && m->sha256[0] && fetch_model_path(ctx->data_dir, m->sha256, file, m->path, sizeof m->path) < 0)
        FAULT(422, "/url", "the model cache path is too long");
#undef FAULT
    if (json_array_size(errors) || status) {
        reg_problem(resp, status, errors);
        free(m);
        return;
    }
    json_decref(errors);
    if (!fetcher) {
        api_problem(resp, 503, "fetch_unavailable",
                    "registering a model by URL is not available here: no model fetcher runs in this server process",
                    NULL);
        free(m);
        return;
    }
    int restarted = 0;
    int rc = store_model_add_fetch(ctx->st, m, &restarted);
    if (rc < 0) {
        api_problem(resp, 503, "store_unavailable", "the model could not be stored; retry", NULL);
        free(m);
        return;
    }
    if (!strcmp(m->status, "fetching"))
        fetch_service_kick();
    api_resp_header(resp, "Location", "/v1/models/%s", m->id);
    api_json(resp, !strcmp(m->status, "ready") ? 200 : 202, render_model(m));
    free(m);
}

void h_models_create(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)params;
    json_t *body = api_parse_body(req, resp);
    if (!body)
        return;
    json_t *errors = json_array();
    int status = 0;
#define FAULT(st, ptr, msg) reg_fault(errors, &status, st, ptr, msg)
    store_model m;
    memset(&m, 0, sizeof m);
    spec_env env = api_spec_env(ctx);
    if (!json_is_object(body)) {
        FAULT(400, "", "must be a JSON object");
    } else {
        int by_url = json_object_get(body, "url") != NULL;
        const char *key;
        json_t *v;
        json_object_foreach(body, key, v) {
            int known = !strcmp(key, "path") || !strcmp(key, "tokenizer") || !strcmp(key, "name") ||
                        !strcmp(key, "url") || (by_url && (!strcmp(key, "sha256") || !strcmp(key, "size_bytes")));
            if (!known) {
                char p[300];
                json_ptr_join(p, sizeof p, "", key);
                FAULT(400, p, !strcmp(key, "sha256") || !strcmp(key, "size_bytes") ? "only with url" : "unknown field");
            }
        }
        if (by_url && json_object_get(body, "path"))
            FAULT(422, "", "give exactly one of path or url");
        if (by_url && !json_array_size(errors)) {
            json_decref(errors);
            models_create_url(ctx, body, resp);
            json_decref(body);
            return;
        }
        json_t *name = json_object_get(body, "name");
        if (name && (!json_is_string(name) || strlen(json_string_value(name)) != json_string_length(name)))
            FAULT(400, "/name", "must be a string");
        else if (name && json_string_length(name) > 128)
            FAULT(422, "/name", "at most 128 bytes of UTF-8");
        else if (name)
            snprintf(m.name, sizeof m.name, "%s", json_string_value(name));
        if (!by_url && !json_object_get(body, "path")) {
            FAULT(400, "/path", "required field is missing (or give url)");
        } else if (!by_url) {
            json_t *ref = json_object();
            spec_check_model_path(&env, body, "", ref, errors, &status);
            const char *rp = json_string_value(json_object_get(ref, "path")),
                       *rt = json_string_value(json_object_get(ref, "tokenizer")),
                       *rf = json_string_value(json_object_get(ref, "format"));
            snprintf(m.path, sizeof m.path, "%s", rp ? rp : "");
            snprintf(m.tokenizer, sizeof m.tokenizer, "%s", rt ? rt : "");
            snprintf(m.format, sizeof m.format, "%s", rf ? rf : "");
            json_decref(ref);
        }
    }
#undef FAULT
    json_decref(body);
    if (json_array_size(errors) || status) {
        reg_problem(resp, status, errors);
        return;
    }
    json_decref(errors);
    if (store_model_add(ctx->st, &m) < 0) {
        api_problem(resp, 503, "store_unavailable", "the model could not be stored; retry", NULL);
        return;
    }
    api_resp_header(resp, "Location", "/v1/models/%s", m.id);
    api_json(resp, 201, render_model(&m));
}

void h_models_get(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)req;
    store_model m;
    int rc = store_model_get(ctx->st, params[0], &m);
    if (rc != 0) {
        api_problem(resp, rc == 1 ? 404 : 503, rc == 1 ? "not_found" : "store_unavailable",
                    rc == 1 ? "no such model" : "the store could not be read", NULL);
        return;
    }
    api_json(resp, 200, render_model(&m));
}

void h_models_list(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)params;
    long long limit;
    if (api_query_int(req, "limit", 1, 1000, 20, &limit, resp) < 0)
        return;
    const char *after;
    if (api_query_cursor(req, "mdl_", &after, resp) < 0)
        return;
    store_model *ms = NULL;
    int n = 0, more = 0;
    int rc = store_model_list(ctx->st, after, (int)limit, &ms, &n, &more);
    if (rc == 1) {
        api_cursor_not_found(resp, "model");
        return;
    }
    if (rc < 0) {
        api_problem(resp, 503, "store_unavailable", "the store could not be read", NULL);
        return;
    }
    json_t *data = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(data, render_model(&ms[i]));
    api_list(resp, data, more, n ? ms[0].id : NULL, n ? ms[n - 1].id : NULL);
    free(ms);
}

json_t *api_device_json(const eng_device_info *d)
{
    int gpu = strncmp(d->name, "cuda", 4) == 0;
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
    json_t *dev = json_pack("{s:s,s:s,s:s,s:s,s:I,s:o,s:i}", "id", d->name, "object", "device", "kind",
                            gpu ? "cuda" : "cpu", "description", d->description, "memory_bytes",
                            (json_int_t)d->memory_bytes, "compute_capability", gpu ? json_string(cc) : json_null(),
                            "cores", d->cores);
    if (!dev)
        return NULL;
    if (!gpu)
        json_object_set_new(dev, "blas", json_pack("{s:s,s:s}", "kernel", d->blas_kernel, "config", d->blas_config));
    json_t *precs = json_array();
    static const char *const names[] = {"fp32", "bf16", "fp16"};
    char why[256];
    for (int k = 0; k < 3; k++)
        if (eng_device_precision(d->name, names[k], why, sizeof why) == 0)
            json_array_append_new(precs, json_string(names[k]));
    json_object_set_new(dev, "precisions", precs);
    return dev;
}

/* GET /v1/devices: this server's devices, then those the other runners sharing its store
 * offer (worker agents on other hosts), each with its runner. */
void h_devices(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)req;
    (void)params;
    json_t *data = json_array();
    int n = eng_device_count();
    for (int i = 0; i < n; i++) {
        eng_device_info d;
        if (eng_device_get(i, &d) == 0)
            json_array_append_new(data, api_device_json(&d));
    }
    json_t *runners = store_runners(ctx->st, store_now() - STORE_RUNNER_FRESH_S);
    size_t i, k;
    json_t *r, *dev;
    json_array_foreach(runners, i, r) {
        const char *name = json_string_value(json_object_get(r, "name"));
        if (ctx->runner && name && !strcmp(name, ctx->runner))
            continue;
        json_array_foreach(json_object_get(json_object_get(r, "info"), "devices"), k, dev) {
            json_t *copy = json_deep_copy(dev);
            json_object_set_new(copy, "runner", json_string(name ? name : ""));
            json_array_append_new(data, copy);
        }
    }
    json_decref(runners);
    api_json(resp, 200, json_pack("{s:s,s:o,s:b}", "object", "list", "data", data, "has_more", 0));
}

/* Calibrations made on other hosts (worker agents sharing the store): every calibrate
 * stage publishes its calibration as the artifact timing_tables.json; the newest jobs' and
 * calibration requests' ones that this data directory's cache lacks are copied into it,
 * so that estimates find them. Returns how many were added. */
static int import_calibrations(api_ctx *ctx)
{
    static const char *const kinds[] = {"calibration", "job"};
    int added = 0;
    for (int k = 0; k < 2; k++) {
        store_job *jobs = NULL;
        int n = 0, more = 0;
        if (store_job_list(ctx->st, kinds[k], NULL, 200, &jobs, &n, &more) != 0)
            continue;
        for (int i = 0; i < n; i++) {
            const char *id = json_string_value(json_object_get(jobs[i].report, "calibration_id"));
            char path[4096], err[256];
            store_artifact a;
            if (!id || cm_calibration_path(ctx->data_dir, id, path, sizeof path) || fio_is_file(path) ||
                store_artifact_get(ctx->st, jobs[i].id, "timing_tables.json", &a) != 0)
                continue;
            int fd = art_open_blob(ctx->as, a.sha256, a.size_bytes, 1, err, sizeof err);
            FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
            json_error_t je;
            json_t *cal = f ? json_loadf(f, JSON_REJECT_DUPLICATES, &je) : NULL;
            if (f)
                fclose(f);
            else if (fd >= 0)
                close(fd);
            /* measured by an agent, perhaps on another host: its env is the agent's, and it
               answers this server's estimates as an agent's job would price them */
            if (cal && json_is_string(json_object_get(cal, "id")) &&
                !strcmp(json_string_value(json_object_get(cal, "id")), id) &&
                json_object_set_new(cal, "from_agent", json_true()) == 0 &&
                cm_calibration_save(ctx->data_dir, cal, err, sizeof err) == 0)
                added++;
            json_decref(cal);
        }
        store_job_list_free(jobs, n);
    }
    return added;
}

/* GET /v1/engines: the serving engines a target can name, what each takes, and whether it
 * can run here (llama.cpp: its helper's build, or why it is absent). The built-in engine
 * runs on the devices of /v1/devices. */
void h_engines(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)ctx;
    (void)req;
    (void)params;
    json_t *builtin = json_pack("{s:s,s:b,s:o,s:s,s:s}", "name", CM_ENGINE_AUTOCOMPRESS, "present", 1, "precisions",
                                cm_words_json(CM_AUTOCOMPRESS_PRECISIONS), "default_precision",
                                CM_AUTOCOMPRESS_DEFAULT_PRECISION, "devices", "see /v1/devices");
    json_t *llama = lc_engine_json();
    json_t *body = builtin && llama ? json_pack("{s:[O,O]}", "engines", builtin, llama) : NULL;
    json_decref(builtin);
    json_decref(llama);
    if (!body) {
        api_problem(resp, 503, "out_of_memory", "out of memory; retry", NULL);
        return;
    }
    api_json(resp, 200, body);
}

void h_estimates(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)params;
    json_t *body = api_parse_body(req, resp);
    if (!body)
        return;
    /* the same model resolver as jobs: confined to the roots before any file is touched */
    spec_env env = api_spec_env(ctx);
    int status = 0;
    json_t *errors = NULL, *r = spec_validate_estimate(body, &env, &status, &errors);
    json_decref(body);
    if (!r) {
        api_spec_problem(resp, "estimate request", status, errors);
        return;
    }
    arch a;
    cm_target tg;
    char err[1024] = "";
    json_t *mj = json_object_get(r, "model");
    int rc = mj ? cm_load_arch(json_string_value(json_object_get(mj, "path")), &a, err, sizeof err)
                : arch_from_json(json_object_get(r, "arch"), &a, err, sizeof err);
    if (rc) {
        api_problem(resp, 422, "unprocessable_spec", err, NULL);
        json_decref(r);
        return;
    }
    /* (cm_estimate completes a llama.cpp target as calibration does: threads, build) */
    if (cm_target_from_json(json_object_get(r, "target"), "/target", &tg, err, sizeof err)) {
        api_problem(resp, 422, "unprocessable_spec", err, NULL);
    } else {
        json_t *est = NULL;
        cm_est_status es = cm_estimate(&a, &tg, ctx->data_dir, &est, err, sizeof err);
        if (es == CM_EST_UNCALIBRATED && import_calibrations(ctx) > 0)
            es = cm_estimate(&a, &tg, ctx->data_dir, &est, err, sizeof err);
        switch (es) {
        case CM_EST_OK: api_json(resp, 200, est); break;
        case CM_EST_UNCALIBRATED: api_problem(resp, 409, "calibration_required", err, NULL); break;
        case CM_EST_UNCOVERED: api_problem(resp, 422, "invalid_estimate", err, NULL); break;
        case CM_EST_FAILED: api_problem(resp, 500, "internal", err, NULL); break;
        }
    }
    arch_free(&a);
    json_decref(r);
}

void h_healthz(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)ctx;
    (void)req;
    (void)params;
    api_json(resp, 200, json_pack("{s:s}", "status", "ok"));
}

void h_readyz(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)req;
    (void)params;
    int64_t counts[5];
    int store_ok = store_job_counts(ctx->st, counts) == 0;
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/artifacts", ctx->data_dir);
    int disk_ok = access(probe, W_OK) == 0;
    if (!store_ok || !disk_ok || ctx->shutting_down) {
        char d[200];
        snprintf(d, sizeof d, "not ready:%s%s%s", store_ok ? "" : " job store unreadable;",
                 disk_ok ? "" : " artifact directory not writable;", ctx->shutting_down ? " shutting down" : "");
        api_problem(resp, 503, "not_ready", d, NULL);
        api_resp_header(resp, "Retry-After", "5");
        return;
    }
    api_json(resp, 200, json_pack("{s:s,s:{s:s,s:s,s:s},s:I,s:I}", "status", "ready", "checks", "store", "ok",
                                  "artifacts", "ok", "scheduler", ctx->sched ? "ok" : "off", "queued",
                                  (json_int_t)counts[0], "running", (json_int_t)counts[1]));
}

void h_openapi(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)ctx;
    (void)req;
    (void)params;
    resp->status = 200;
    resp->text = (char *)ac_openapi_yaml;
    resp->text_len = strlen(ac_openapi_yaml);
    resp->text_static = 1;
    resp->content_type = "application/yaml";
}
