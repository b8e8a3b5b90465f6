/* api/api.c — the route table, dispatch, responses, problem+json and the request
 * metrics behind /metrics. Routes are matched segment by segment; "{name*}" as the last
 * segment captures the rest of the path (so a bad artifact name is a 400, not a 404).
 */
#include "api/api_internal.h"
#include "storage/strbuf.h"
#include "storage/utf8.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* api/report_html.c: the report as an HTML page with inline SVG charts. */

typedef struct {
    const char *method;
    const char *pattern;
    api_handler fn;
    int writes, has_body;
    int blocking;               /* the handler may wait (api_route_blocking) */
} route;

static const route routes[] = {
    {"GET", "/v1/jobs", h_jobs_list, 0, 0, 0},
    {"POST", "/v1/jobs", h_jobs_create, 1, 1, 1},
    {"GET", "/v1/jobs/{id}", h_jobs_get, 0, 0, 0},
    {"DELETE", "/v1/jobs/{id}", h_jobs_delete, 1, 0, 1},
    {"POST", "/v1/jobs/{id}/cancel", h_jobs_cancel, 1, 0, 0},
    {"GET", "/v1/jobs/{id}/events", h_events_list, 0, 0, 0},
    {"GET", "/v1/jobs/{id}/report", h_report_get, 0, 0, 0},
    {"GET", "/v1/jobs/{id}/report.html", h_report_html, 0, 0, 0},
    {"GET", "/v1/jobs/{id}/artifacts", h_artifacts_list, 0, 0, 0},
    {"GET", "/v1/jobs/{id}/artifacts/{name*}", h_artifact_get, 0, 0, 1},
    {"HEAD", "/v1/jobs/{id}/artifacts/{name*}", h_artifact_get, 0, 0, 1},
    {"GET", "/v1/models", h_models_list, 0, 0, 0},
    {"POST", "/v1/models", h_models_create, 1, 1, 1},
    {"GET", "/v1/models/{id}", h_models_get, 0, 0, 0},
    {"GET", "/v1/calibrations", h_cal_list, 0, 0, 0},
    {"POST", "/v1/calibrations", h_cal_create, 1, 1, 1},
    {"GET", "/v1/calibrations/{id}", h_cal_get, 0, 0, 0},
    {"POST", "/v1/calibrations/{id}/cancel", h_cal_cancel, 1, 0, 0},
    {"POST", "/v1/estimates", h_estimates, 0, 1, 1},
    {"GET", "/v1/devices", h_devices, 0, 0, 1},
    {"GET", "/v1/engines", h_engines, 0, 0, 1},
    {"GET", "/healthz", h_healthz, 0, 0, 0},
    {"GET", "/readyz", h_readyz, 0, 0, 0},
    {"GET", "/metrics", h_metrics, 0, 0, 0},
    {"GET", "/openapi.yaml", h_openapi, 0, 0, 0},
};
#define N_ROUTES ((int)(sizeof routes / sizeof routes[0]))

/* Match path against pattern; fills up to 2 params (pointers into bufs). 1 on match. */
static int match(const char *pattern, const char *path, char bufs[2][1024], int *np)
{
    const char *p = pattern, *s = path;
    *np = 0;
    while (*p && *s) {
        if (*p != '/' || *s != '/')
            return 0;
        p++;
        s++;
        const char *pe = strchr(p, '/');
        size_t pl = pe ? (size_t)(pe - p) : strlen(p);
        if (p[0] == '{') {
            int greedy = pl >= 2 && p[pl - 2] == '*';
            const char *se = greedy ? s + strlen(s) : strchr(s, '/');
            size_t sl = se ? (size_t)(se - s) : strlen(s);
            if (sl == 0 || sl >= 1024 || *np == 2)
                return 0;
            memcpy(bufs[*np], s, sl);
            bufs[*np][sl] = 0;
            (*np)++;
            s += sl;
        } else {
            if (strncmp(p, s, pl) != 0 || (s[pl] != '/' && s[pl] != 0))
                return 0;
            s += pl;
        }
        p += pl;
    }
    return *p == 0 && *s == 0;
}

int api_route_find(const char *method, const char *path, char *allow, size_t allowlen)
{
    char bufs[2][1024];
    int np, path_found = 0;
    const char *m = !strcmp(method, "HEAD") ? "GET" : method;
    if (allow && allowlen)
        allow[0] = 0;
    for (int i = 0; i < N_ROUTES; i++) {
        if (!match(routes[i].pattern, path, bufs, &np))
            continue;
        if (!strcmp(routes[i].method, method) || !strcmp(routes[i].method, m))
            return i;
        path_found = 1;
    }
    if (!path_found)
        return -404;
    size_t k = 0;
    int has_get = 0;
    for (int i = 0; i < N_ROUTES && allow; i++) {
        if (!match(routes[i].pattern, path, bufs, &np))
            continue;
        if (!strcmp(routes[i].method, "HEAD"))
            continue;
        has_get |= !strcmp(routes[i].method, "GET");
        k += (size_t)snprintf(allow + k, k < allowlen ? allowlen - k : 0, "%s%s", k ? ", " : "", routes[i].method);
    }
    if (has_get && allow && k < allowlen)
        snprintf(allow + k, allowlen - k, ", HEAD");
    return -405;
}

int api_route_writes(int r) { return r >= 0 && r < N_ROUTES && routes[r].writes; }
int api_route_has_body(int r) { return r >= 0 && r < N_ROUTES && routes[r].has_body; }
int api_route_blocking(int r) { return r >= 0 && r < N_ROUTES && routes[r].blocking; }

void api_routes_print(FILE *f)
{
    for (int i = 0; i < N_ROUTES; i++) {
        char pat[256];
        size_t k = 0;
        for (const char *p = routes[i].pattern; *p && k + 1 < sizeof pat; p++)
            if (*p != '*')
                pat[k++] = *p;
        pat[k] = 0;
        fprintf(f, "%s %s\n", routes[i].method, pat);
    }
}

void api_resp_init(api_resp *r)
{
    memset(r, 0, sizeof *r);
}

void api_resp_free(api_resp *r)
{
    json_decref(r->json);
    if (!r->text_static)
        free(r->text);
    art_stream_free(r->stream);
    for (int i = 0; i < r->nhdr; i++)
        free(r->hdr[i].value);
    api_resp_init(r);
}

int api_resp_header(api_resp *r, const char *name, const char *fmt, ...)
{
    if (r->nhdr == API_MAX_HEADERS)
        return -1;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *v = strdup(buf);
    if (!v)
        return -1;
    for (int i = 0; i < r->nhdr; i++)   /* one value per name: a later call replaces it */
        if (!strcasecmp(r->hdr[i].name, name)) {
            free(r->hdr[i].value);
            r->hdr[i].value = v;
            return 0;
        }
    r->hdr[r->nhdr].name = name;
    r->hdr[r->nhdr].value = v;
    r->nhdr++;
    return 0;
}

void api_json(api_resp *resp, int status, json_t *body)
{
    json_decref(resp->json);
    resp->json = body;
    resp->status = status;
    resp->content_type = "application/json";
    if (!body && status < 500) {   /* a body that could not be built is an error, never an empty 200 */
        for (int i = 0; i < resp->nhdr; i++)   /* nor does it carry the headers of the answer it replaces */
            free(resp->hdr[i].value);
        resp->nhdr = 0;
        api_problem(resp, 500, "internal", "the response could not be built", NULL);
    }
}

void api_list(api_resp *resp, json_t *data, int has_more, const char *first_id, const char *last_id)
{
    api_json(resp, 200, json_pack("{s:s,s:o,s:b,s:o,s:o}", "object", "list", "data", data, "has_more", has_more,
                                  "first_id", first_id ? json_string(first_id) : json_null(), "last_id",
                                  last_id ? json_string(last_id) : json_null()));
}

void api_text(api_resp *resp, int status, char *text, size_t len, const char *content_type)
{
    resp->status = status;
    resp->text = text;
    resp->text_len = len;
    resp->content_type = content_type;
}

static const char *reason(int status)
{
    switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 412: return "Precondition Failed";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

json_t *api_text_json(const char *s)
{
    json_t *v = json_string(s ? s : "");
    if (v)
        return v;
    char *c = utf8_mended(s, "\xef\xbf\xbd");
    v = c ? json_string(c) : NULL;
    free(c);
    return v;
}

void api_utf8_clean(const char *in, char *out, size_t n)
{
    utf8_clean(in, out, n, 1);   /* an undecodable or control byte is never echoed */
}

void api_fault_append(json_t *errors, const char *pointer, const char *message)
{
    char p[600], m[1100];
    api_utf8_clean(pointer, p, sizeof p);
    api_utf8_clean(message, m, sizeof m);
    json_array_append_new(errors, json_pack("{s:s,s:s}", "pointer", p, "message", m));
}


/* At most this many faults are listed; the rest are counted. */
#define API_MAX_ERRORS 100

void api_problem(api_resp *r, int status, const char *code, const char *detail, json_t *errors)
{
    char type[128], clean[2048];
    snprintf(type, sizeof type, "https://autocompress.dev/problems/%s", code);
    size_t n_err = json_array_size(errors);
    if (n_err > API_MAX_ERRORS) {
        while (json_array_size(errors) > API_MAX_ERRORS)
            json_array_remove(errors, json_array_size(errors) - 1);
        char more[2048 + 64];
        snprintf(more, sizeof more, "%s (%zu faults; the first %d are listed)", detail ? detail : "", n_err,
                 API_MAX_ERRORS);
        api_utf8_clean(more, clean, sizeof clean);
    } else {
        api_utf8_clean(detail, clean, sizeof clean);
    }
    json_t *p = json_pack("{s:s,s:s,s:i,s:s,s:s}", "type", type, "title", reason(status), "status",
                          status, "detail", clean, "code", code);
    if (p && n_err > API_MAX_ERRORS)
        json_object_set_new(p, "errors_total", json_integer((json_int_t)n_err));
    if (p && errors)
        json_object_set_new(p, "errors", errors);
    else
        json_decref(errors);
    api_json(r, status, p);
    r->content_type = "application/problem+json";
    if (status == 503)   /* every 503 says when to come back (a caller may set its own) */
        api_resp_header(r, "Retry-After", "1");
}

int api_query_int(const api_req *req, const char *key, long long lo, long long hi, long long dflt,
                  long long *out, api_resp *resp)
{
    const char *v = req->query ? req->query(req->h, key) : NULL;
    if (!v) {
        *out = dflt;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    /* digits, with an optional minus: strtoll alone also took "+5" and " 5" */
    int digits = isdigit((unsigned char)v[*v == '-']) != 0;
    long long x = digits ? strtoll(v, &end, 10) : 0;
    if (!digits || *end || errno == ERANGE || x < lo || x > hi) {
        char msg[160];
        snprintf(msg, sizeof msg, "must be an integer between %lld and %lld", lo, hi);
        char detail[200];
        snprintf(detail, sizeof detail, "query parameter %s %s", key, msg);
        api_problem(resp, 400, "invalid_parameter", detail,
                    json_pack("[{s:s,s:s}]", "parameter", key, "message", msg));
        return -1;
    }
    *out = x;
    return 0;
}

int api_query_cursor(const api_req *req, const char *prefix, const char **out, api_resp *resp)
{
    const char *v = req->query ? req->query(req->h, "after") : NULL;
    *out = v;
    if (!v)
        return 0;
    size_t pl = strlen(prefix), n = strlen(v);
    int ok = n == pl + 24 && !strncmp(v, prefix, pl);
    for (size_t i = pl; ok && i < n; i++)
        ok = (v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'f');
    if (!ok) {
        char msg[96], detail[160];
        snprintf(msg, sizeof msg, "must be an id: %s and 24 hex digits", prefix);
        snprintf(detail, sizeof detail, "query parameter after %s", msg);
        api_problem(resp, 400, "invalid_parameter", detail, json_pack("[{s:s,s:s}]", "parameter", "after", "message", msg));
        return -1;
    }
    return 0;
}

void api_cursor_not_found(api_resp *resp, const char *what)
{
    char detail[160];
    snprintf(detail, sizeof detail, "query parameter after names no %s in this list", what);
    api_problem(resp, 422, "cursor_not_found", detail,
                json_pack("[{s:s,s:s}]", "parameter", "after", "message", "no such id"));
}

/* The JSON pointer of the value being read at byte pos of the body b (valid JSON up to
 * there): the object keys and array indices open at pos, "" at the top. A key that cannot
 * be decoded (a U+0000 in it) ends the pointer at its object. For the values jansson reads
 * but cannot hold, whose error position is just past them. */
typedef struct {
    int obj;        /* an object, else an array */
    long idx;       /* an array's element */
    char key[128];  /* an object's member */
    int keyed;      /* 1: key holds it; -1: it cannot be named; 0: none yet */
} jp_frame;

static void pointer_at(const char *b, size_t n, size_t pos, char *out, size_t outlen)
{
    enum { DEPTH = 32 };
    jp_frame st[DEPTH];
    int d = 0, extra = 0, want_key = 0;   /* extra: levels deeper than DEPTH, not tracked */
    for (size_t i = 0; i < n && i < pos; i++) {
        char c = b[i];
        if (c == '"') {
            size_t j = i + 1;
            while (j < n && b[j] != '"')
                j += b[j] == '\\' ? 2 : 1;
            if (j >= n)
                break;
            if (want_key && !extra && d > 0) {   /* a key: decoded by jansson itself */
                json_t *k = json_loadb(b + i, j + 1 - i, JSON_DECODE_ANY, NULL);
                const char *ks = json_string_value(k);
                st[d - 1].keyed = ks && strlen(ks) == json_string_length(k) && strlen(ks) < sizeof st[0].key ? 1 : -1;
                if (st[d - 1].keyed == 1)
                    snprintf(st[d - 1].key, sizeof st[0].key, "%s", ks);
                json_decref(k);
                want_key = 0;
            }
            i = j;
        } else if (c == '{' || c == '[') {
            if (d < DEPTH && !extra)
                st[d++] = (jp_frame){.obj = c == '{'};
            else
                extra++;
            want_key = c == '{';
        } else if (c == '}' || c == ']') {
            if (extra)
                extra--;
            else if (d)
                d--;
            want_key = 0;
        } else if (c == ',' && !extra && d && i + 1 < pos) {   /* past the value in error: not counted */
            if (st[d - 1].obj)
                want_key = 1;
            else
                st[d - 1].idx++;
        }
    }
    char step[512];
    out[0] = 0;
    for (int k = 0; k < d; k++) {
        if (st[k].obj && st[k].keyed != 1)
            break;
        if (st[k].obj)
            json_ptr_join(step, sizeof step, out, st[k].key);   /* RFC 6901: ~ as ~0, / as ~1 */
        else if (snprintf(step, sizeof step, "%s/%ld", out, st[k].idx) >= (int)sizeof step)
            break;   /* too deep to name: the pointer so far */
        if (snprintf(out, outlen, "%s", step) >= (int)outlen)
            break;
    }
}

json_t *api_parse_body(const api_req *req, api_resp *resp)
{
    json_error_t e;
    /* Any JSON value: the handlers' own checks name a body that is not an object. */
    json_t *j = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &e);
    if (!j) {
        /* Valid JSON that C strings and 64-bit integers cannot hold is a 422: the syntax is
           right, the server cannot take the value (a NUL would cut a path short). */
        enum json_error_code code = json_error_code(&e);
        int holdable = code != json_error_null_character && code != json_error_null_byte_in_key &&
                       code != json_error_numeric_overflow;
        char detail[400];
        snprintf(detail, sizeof detail,
                 holdable ? "the body is not valid JSON: %s (line %d, column %d)"
                          : "the body holds a value this server does not take (strings without U+0000, "
                            "integers within 64 bits): %s (line %d, column %d)",
                 e.text, e.line, e.column);
        char ptr[512] = "";
        if (!holdable && e.position >= 0)   /* valid JSON up to there: where the value sits */
            pointer_at(req->body, req->body_len, (size_t)e.position, ptr, sizeof ptr);
        json_t *errors = json_array();
        if (errors)   /* cleaned: a pointer cut at its buffer's end inside a character still lists */
            api_fault_append(errors, ptr, e.text);
        api_problem(resp, holdable ? 400 : 422, holdable ? "invalid_json" : "unprocessable_json", detail, errors);
    }
    return j;
}

spec_env api_spec_env(api_ctx *ctx)
{
    spec_env env = {ctx->roots, ctx->n_roots, ctx->data_dir, ctx->st, ctx->test_stages, ctx->webhooks,
                   ctx->webhook_private_hosts};
    return env;
}

void api_dispatch(api_ctx *ctx, int route, const api_req *req, api_resp *resp)
{
    char bufs[2][1024];
    int np = 0;
    if (route < 0 || route >= N_ROUTES || !match(routes[route].pattern, req->path, bufs, &np)) {
        api_problem(resp, 404, "not_found", "no such route", NULL);
        return;
    }
    const char *params[2] = {np > 0 ? bufs[0] : NULL, np > 1 ? bufs[1] : NULL};
    routes[route].fn(ctx, req, params, resp);
    if (!resp->status)
        api_problem(resp, 500, "internal", "the handler produced no response", NULL);
}

/* ---- metrics ----------------------------------------------------------------------- */

static const double buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5};
#define N_BUCKETS ((int)(sizeof buckets / sizeof buckets[0]))
static atomic_llong by_class[6];                 /* 1xx..5xx by status/100 */
static atomic_llong hist[N_BUCKETS + 1];
static atomic_llong dur_us_sum, n_obs;

void api_metrics_observe(int status, double seconds)
{
    int c = status / 100;
    if (c >= 1 && c <= 5)
        atomic_fetch_add(&by_class[c], 1);
    int b = 0;
    while (b < N_BUCKETS && seconds > buckets[b])
        b++;
    atomic_fetch_add(&hist[b], 1);
    atomic_fetch_add(&dur_us_sum, (long long)(seconds * 1e6));
    atomic_fetch_add(&n_obs, 1);
}

/* Render Prometheus text exposition into a new malloc'd buffer. */
static char *metrics_text(api_ctx *ctx, size_t *len)
{
    size_t cap = 8192, k = 0;
    char *b = malloc(cap);
    if (!b)
        return NULL;
#define OUT(...) k += (size_t)snprintf(b + k, k < cap ? cap - k : 0, __VA_ARGS__)
    OUT("# HELP ac_http_requests_total HTTP requests answered, by status class.\n");
    OUT("# TYPE ac_http_requests_total counter\n");
    for (int c = 1; c <= 5; c++)
        OUT("ac_http_requests_total{code=\"%dxx\"} %lld\n", c, (long long)atomic_load(&by_class[c]));
    OUT("# HELP ac_http_request_duration_seconds Time from the request's first byte to its response.\n");
    OUT("# TYPE ac_http_request_duration_seconds histogram\n");
    long long cum = 0;
    for (int i = 0; i <= N_BUCKETS; i++) {
        cum += atomic_load(&hist[i]);
        if (i < N_BUCKETS)
            OUT("ac_http_request_duration_seconds_bucket{le=\"%g\"} %lld\n", buckets[i], cum);
        else
            OUT("ac_http_request_duration_seconds_bucket{le=\"+Inf\"} %lld\n", cum);
    }
    OUT("ac_http_request_duration_seconds_sum %.6f\n", atomic_load(&dur_us_sum) / 1e6);
    OUT("ac_http_request_duration_seconds_count %lld\n", (long long)atomic_load(&n_obs));
    int64_t counts[5];
    static const char *names[5] = {"queued", "running", "succeeded", "failed", "cancelled"};
    if (store_job_counts(ctx->st, counts) == 0) {
        OUT("# HELP ac_jobs Jobs (and calibrations) in the store, by status.\n# TYPE ac_jobs gauge\n");
        for (int i = 0; i < 5; i++)
            OUT("ac_jobs{status=\"%s\"} %lld\n", names[i], (long long)counts[i]);
    }
    OUT("# HELP ac_workers_running Worker processes running now.\n# TYPE ac_workers_running gauge\n");
    OUT("ac_workers_running %d\n", ctx->sched ? sched_running(ctx->sched) : 0);
    OUT("# HELP ac_http_suspended_requests Long-polls parked now.\n# TYPE ac_http_suspended_requests gauge\n");
    OUT("ac_http_suspended_requests %d\n", ctx->suspended_count ? ctx->suspended_count() : 0);
    OUT("# HELP ac_uptime_seconds Seconds since the server started.\n# TYPE ac_uptime_seconds gauge\n");
    OUT("ac_uptime_seconds %lld\n", (long long)(store_now() - ctx->started_at));
#undef OUT
    if (k >= cap) {
        free(b);
        return NULL;
    }
    *len = k;
    return b;
}

void h_metrics(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)req;
    (void)params;
    size_t len = 0;
    char *t = metrics_text(ctx, &len);
    if (!t) {
        api_problem(resp, 500, "internal", "metrics could not be rendered", NULL);
        return;
    }
    api_text(resp, 200, t, len, "text/plain; version=0.0.4; charset=utf-8");
}
