/* api/api.h — the REST API v1 as plain functions: a request (method, path, query,
 * headers, body) in, a response (status, headers, JSON/text/file body) out. The HTTP
 * daemon (server/http.c) owns sockets, auth, limits and long-poll suspension; this layer
 * owns routing, validation, problem+json errors and rendering. Handlers never block for
 * long: a long-poll returns `wait_until` and is called again when the store changes.
 */
#ifndef AC_API_API_H
#define AC_API_API_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <jansson.h>

#include "engine/devices.h"
#include "jobs/sched.h"
#include "storage/artstore.h"
#include "storage/store.h"

/* Shared by every request; set up once by the server, read-only afterwards except the
 * atomic counters. */
typedef struct {
    store *st;
    artstore *as;
    sched *sched;                /* may be NULL (no workers: jobs stay queued) */
    const char *data_dir;
    char **roots;                /* allowed server-path roots, realpath'd */
    int n_roots;
    int test_stages;             /* AC_TEST_STAGES=1: x_test_* spec fields accepted */
    int webhooks;                /* a webhook sender runs: callback_url accepted */
    int webhook_private_hosts;   /* it delivers to non-public addresses too */
    int max_wait_s;              /* cap on ?wait= */
    int64_t started_at;          /* Unix s */
    volatile int shutting_down;  /* readyz answers 503 */
    int (*suspended_count)(void);/* long-polls parked now (for /metrics); may be NULL */
    const char *runner;          /* this server's name in the runners registry; NULL when it runs no jobs */
} api_ctx;

#define API_MAX_HEADERS 12

typedef struct {
    const char *method;          /* "GET", "HEAD", "POST", "DELETE", ... */
    const char *path;            /* decoded path, no query */
    const char *(*query)(void *h, const char *key);   /* NULL when absent */
    const char *(*header)(void *h, const char *name); /* case-insensitive; NULL when absent */
    void *h;                     /* handle for query/header */
    const char *body;            /* NUL-terminated copy of the body (may be empty) */
    size_t body_len;
    const char *request_id;
    double deadline;             /* long-poll deadline (monotonic s) from an earlier call; 0 first */
} api_req;

typedef struct {
    int status;
    json_t *json;                /* JSON body (owned) ... */
    char *text;                  /* ... or a text body (owned unless text_static) */
    size_t text_len;
    int text_static;
    const char *content_type;    /* static string; default application/json */
    art_stream *stream;          /* ... or a blob range (owned), verified as it streams */
    int64_t off, len;            /* that range: first byte and length */
    int no_body;                 /* 304/204: headers only */
    struct {
        const char *name;        /* static */
        char *value;             /* owned */
    } hdr[API_MAX_HEADERS];
    int nhdr;
    double wait_until;           /* > 0: park the request until then or a store change */
} api_resp;

/* Route lookup before the body arrives. Returns the route index (>= 0), or -404 (no
 * route) or -405 (path exists, method not allowed: allow gets "GET, HEAD, ..."). */
int api_route_find(const char *method, const char *path, char *allow, size_t allowlen);
/* 1 when the route changes state (needs the write scope), 0 for reads. */
int api_route_writes(int route);
/* 1 when the route reads a JSON request body (415 unless application/json). */
int api_route_has_body(int route);
/* 1 when the route's handler may wait on something slow: a lock (DELETE of a job waits up to
 * 5 s for the artifact store), a child process (the llama.cpp probe behind /v1/engines and
 * the checks of a spec), the file system under a model or an artifact (a blob hashed before
 * it is served). The HTTP layer runs these off the threads that serve connections. None of
 * them long-polls (wait_until stays 0). */
int api_route_blocking(int route);
/* Print every route as "METHOD /pattern" lines (the OpenAPI parity test reads these). */
void api_routes_print(FILE *f);

void api_resp_init(api_resp *r);
void api_resp_free(api_resp *r);
/* Add a header (value copied). 0, or -1 when full. */
int api_resp_header(api_resp *r, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Handle a request whose route was found: fills resp (api_resp_init'ed by the caller).
 * Never fails: every fault becomes a problem response. */
void api_dispatch(api_ctx *ctx, int route, const api_req *req, api_resp *resp);

/* Problem+json (RFC 9457): {type, title, status, detail, code, errors?}. errors is a
 * NEW array (stolen) of {pointer|parameter, message} or NULL. The server adds request_id. */
void api_problem(api_resp *r, int status, const char *code, const char *detail, json_t *errors);

/* A JSON string of text the service stored (a job's error message, an event's): the
 * text itself, or, where it is not valid UTF-8 (a path of other bytes quoted in it), each
 * byte outside a valid sequence replaced by '?'. NEW reference; NULL on OOM. */
json_t *api_text_json(const char *s);

/* Copy in to out (capacity n), each byte that is not part of valid UTF-8 and each control
 * byte replaced by '?': what a problem may echo of a client's input. */
void api_utf8_clean(const char *in, char *out, size_t n);

/* Append {pointer, message} to the array errors, both cleaned by api_utf8_clean: a
 * message cut inside a character, or a client's key that is not UTF-8, still lists its
 * fault (jansson refuses invalid UTF-8, and the fault was dropped while its status stood). */
void api_fault_append(json_t *errors, const char *pointer, const char *message);

/* Device d as /v1/devices lists it: {id, object, kind, description, memory_bytes,
 * compute_capability, cores, precisions, blas (CPU)}. Also what a runner registers
 * (store_runner_beat). NEW reference, or NULL on OOM. */
json_t *api_device_json(const eng_device_info *d);

/* Metrics the server feeds: one finished request. */
void api_metrics_observe(int status, double seconds);

#endif
