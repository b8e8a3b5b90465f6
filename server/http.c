/* server/http.c — the libmicrohttpd daemon (http.h). One request context per request,
 * created in the URI-log callback (so timing starts at the request line) and freed in the
 * completion callback, which also writes the access-log line; one connection record per
 * TCP connection, from accept to close. Parked long-polls sit in a list guarded by one
 * mutex; connections still receiving a request sit in a deadline list, oldest first,
 * guarded by another. One housekeeping thread resumes parked long-polls (when PRAGMA
 * data_version says another connection committed, when their wait ends, or at shutdown)
 * and shuts down connections whose request has not arrived by its deadline.
 */
#include "server/http.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/log.h"
#include "engine/clock.h"
#include "engine/rng.h"

/* One TCP connection (MHD_OPTION_NOTIFY_CONNECTION's socket context). From accept, and
 * again from the end of each response, the next request must arrive whole (request line,
 * headers, body) by `deadline`; while it is due the record sits in the server's deadline
 * list. Answering a request takes it off (conn_claim), so a response being sent or
 * a parked long-poll is never cut. */
typedef struct http_conn {
    MHD_socket fd;
    double deadline;            /* monotonic s */
    int listed;                 /* in the deadline list */
    int cut;                    /* shut down at the deadline */
    int logged;                 /* an access-log line reported the cut */
    struct http_conn *prev, *next;
} http_conn;

typedef struct http_req {
    double t0;
    http_conn *cn;              /* borrowed: the connection's record, NULL if it has none */
    char request_id[72];
    char *uri;                  /* raw URI as received */
    char method[16];
    int started;
    int route;                  /* >= 0 route, < 0 rejected early */
    int early;                  /* a response was queued on the first call */
    char *body;
    size_t len, cap;
    int overflow;
    double deadline;            /* long-poll deadline carried across resumes */
    unsigned long gen_seen;     /* waker generation when the handler last looked */
    struct MHD_Connection *conn;
    int status;
    uint64_t bytes;
    struct http_req *next_parked;
    int off;                    /* OFF_*: where a blocking route's handler stands */
    int counted;                /* in the server's n_unsent from its handler's end to its completion */
    char *path;                 /* the decoded path, for the handler thread */
    api_resp off_resp;          /* its response, once OFF_DONE */
    struct http_req *next_off;
} http_req;

enum { OFF_NONE = 0, OFF_QUEUED, OFF_DONE };

struct http_server {
    struct MHD_Daemon *d;
    api_ctx *api;
    const auth *au;
    size_t body_limit;
    size_t uri_limit, head_limit;   /* longest request target, request head we answer (bytes) */
    double deadline_s;              /* per-request deadline; 0 = none */
    int max_suspended;
    pthread_mutex_t dmu;            /* guards the deadline list and every http_conn's fields */
    http_conn *due_head, *due_tail; /* connections receiving a request, by deadline */
    pthread_mutex_t mu;
    http_req *parked;
    int n_parked;
    unsigned long gen;
    int stop_waker, quiesced;
    pthread_t waker;
    int port;
    /* requests of blocking routes, for the handler threads (guarded by mu) */
    pthread_cond_t off_cv;
    http_req *off_head, *off_tail;
    int n_off;                      /* handed to the handler threads, not yet handled */
    int n_unsent;                   /* handled, their answer not yet sent (completed) */
    int stop_handlers;
    pthread_t *handlers;
    int n_handlers;
};

static http_server *g_server; /* for the suspended-count callback of /metrics */

/* ---- per-request deadlines ------------------------------------------------------------
 * All deadlines are "now + deadline_s" taken under dmu, so appending keeps the list in
 * deadline order and the reaper only ever looks at its head. */

static void due_unlink(http_server *h, http_conn *c)
{
    if (!c->listed)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        h->due_head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        h->due_tail = c->prev;
    c->prev = c->next = NULL;
    c->listed = 0;
}

/* Start c's clock for its next request (at accept and after each response). */
static void conn_arm(http_server *h, http_conn *c)
{
    if (!c || h->deadline_s <= 0)
        return;
    pthread_mutex_lock(&h->dmu);
    if (!c->cut) {
        due_unlink(h, c);
        c->deadline = eng_wall_s() + h->deadline_s;
        c->prev = h->due_tail;
        if (h->due_tail)
            h->due_tail->next = c;
        else
            h->due_head = c;
        h->due_tail = c;
        c->listed = 1;
    }
    pthread_mutex_unlock(&h->dmu);
}

/* The request on c has arrived and is being answered: stop its clock. Returns 0 when the
 * reaper already cut the connection (the caller must not act on the request), 1 otherwise
 * (also for a connection without a record). */
static int conn_claim(http_server *h, http_conn *c)
{
    if (!c)
        return 1;
    pthread_mutex_lock(&h->dmu);
    int ok = !c->cut;
    due_unlink(h, c);
    pthread_mutex_unlock(&h->dmu);
    return ok;
}

static int conn_was_cut(http_server *h, http_conn *c)
{
    if (!c)
        return 0;
    pthread_mutex_lock(&h->dmu);
    int cut = c->cut;
    pthread_mutex_unlock(&h->dmu);
    return cut;
}

/* Shut down every connection whose request is overdue. shutdown() leaves the descriptor
 * open: libmicrohttpd sees the end of the stream, closes the connection in its own thread
 * and only then (after the CLOSED notification takes c off this list) closes the fd, so a
 * listed fd is never one reused by another connection. */
static void reap_overdue(http_server *h, double now)
{
    pthread_mutex_lock(&h->dmu);
    while (h->due_head && h->due_head->deadline <= now) {
        http_conn *c = h->due_head;
        due_unlink(h, c);
        c->cut = 1;
        if (shutdown(c->fd, SHUT_RDWR) != 0 && errno != ENOTCONN)
            log_msg("warn", "shutting down a connection past its request deadline: %s", strerror(errno));
    }
    pthread_mutex_unlock(&h->dmu);
}

static void client_addr(struct MHD_Connection *conn, char *addr, size_t n)
{
    addr[0] = 0;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr)
        getnameinfo(ci->client_addr, ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                         : sizeof(struct sockaddr_in),
                    addr, (socklen_t)n, NULL, 0, NI_NUMERICHOST);
}

/* MHD_OPTION_NOTIFY_CONNECTION: a connection's record lives from accept to close. A
 * connection cut before its request line arrived has had no access-log line, so its
 * close gets one here. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    http_server *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        http_conn *c = ci ? calloc(1, sizeof *c) : NULL;
        if (!c) {
            log_msg("warn", "a connection has no deadline record (out of memory); only the idle timeout applies");
            *socket_context = NULL;
            return;
        }
        c->fd = ci->connect_fd;
        *socket_context = c;
        conn_arm(h, c);
        return;
    }
    http_conn *c = *socket_context;
    if (!c)
        return;
    pthread_mutex_lock(&h->dmu);
    due_unlink(h, c);
    int unlogged_cut = c->cut && !c->logged;
    pthread_mutex_unlock(&h->dmu);
    if (unlogged_cut) {
        char addr[64];
        client_addr(conn, addr, sizeof addr);
        log_json("info", json_pack("{s:s,s:s,s:s}", "msg", "connection closed before a request line arrived",
                                   "remote", addr, "terminated", "deadline"));
    }
    free(c);
    *socket_context = NULL;
}

static int parked_count(void)
{
    http_server *h = g_server;
    if (!h)
        return 0;
    pthread_mutex_lock(&h->mu);
    int n = h->n_parked;
    pthread_mutex_unlock(&h->mu);
    return n;
}

static int request_id_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
              c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

/* "req_" + 20 hex digits from a per-thread xorshift generator seeded from getrandom
 * (request ids need uniqueness, not secrecy; this keeps a syscall off every request). */
static void new_request_id(char *out, size_t n)
{
    static __thread uint64_t x;
    if (!x) {
        if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x || !x)
            x = (uint64_t)(uintptr_t)&x ^ (uint64_t)time(NULL) ^ 0x9E3779B97F4A7C15ull;
    }
    uint64_t r[2];
    for (int i = 0; i < 2; i++) {
        r[i] = eng_xorshift64(&x);
    }
    snprintf(out, n, "req_%016llx%04llx", (unsigned long long)r[0], (unsigned long long)(r[1] & 0xffff));
}

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    (void)cls;
    http_req *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->t0 = eng_wall_s();
    r->uri = strdup(uri ? uri : "");
    r->conn = conn;
    r->route = -1;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    r->cn = ci ? ci->socket_context : NULL;
    return r;
}

static const char *lookup_query(void *h, const char *key)
{
    return MHD_lookup_connection_value((struct MHD_Connection *)h, MHD_GET_ARGUMENT_KIND, key);
}

static const char *lookup_header(void *h, const char *name)
{
    return MHD_lookup_connection_value((struct MHD_Connection *)h, MHD_HEADER_KIND, name);
}

/* An artifact's bytes for MHD: a read error or a digest mismatch (the blob no longer
 * matches its sha-256) ends the response early, so a client never gets bad bytes as a
 * complete download. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    ssize_t k = art_stream_read(cls, pos, buf, max);
    if (k < 0) {
        log_msg("error", "artifact stream stopped: a read error or a sha-256 mismatch (the blob was set aside)");
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    return k == 0 ? MHD_CONTENT_READER_END_OF_STREAM : k;
}

static void stream_free(void *cls)
{
    art_stream_free(cls);
}

/* Turn an api_resp into an MHD response and queue it; the request's deadline stops (a
 * connection already cut at its deadline gets no response: MHD_NO closes it). */
static enum MHD_Result send_resp(http_server *h, struct MHD_Connection *conn, http_req *r, api_resp *ar)
{
    if (!conn_claim(h, r->cn))
        return MHD_NO;
    struct MHD_Response *resp = NULL;
    if (ar->json && !ar->no_body) {
        if (ar->status >= 400 && json_is_object(ar->json))
            json_object_set_new(ar->json, "request_id", json_string(r->request_id));
        char *text = json_dumps(ar->json, JSON_COMPACT);
        if (text) {
            size_t n = strlen(text);
            r->bytes = n;
            resp = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
            if (!resp)
                free(text);
        }
    } else if (ar->stream && !ar->no_body) {
        resp = MHD_create_response_from_callback((uint64_t)ar->len, 256 * 1024, stream_read, ar->stream,
                                                 stream_free);
        if (resp) {
            ar->stream = NULL; /* MHD frees it */
            r->bytes = (uint64_t)ar->len;
        }
    } else if (ar->text && !ar->no_body) {
        if (ar->text_static) {
            resp = MHD_create_response_from_buffer(ar->text_len, ar->text, MHD_RESPMEM_PERSISTENT);
        } else {
            resp = MHD_create_response_from_buffer(ar->text_len, ar->text, MHD_RESPMEM_MUST_FREE);
            if (resp)
                ar->text = NULL;
        }
        r->bytes = ar->text_len;
    } else {
        resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    }
    if (!resp)
        return MHD_NO;
    if (ar->content_type && !ar->no_body)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ar->content_type);
    for (int i = 0; i < ar->nhdr; i++)
        MHD_add_response_header(resp, ar->hdr[i].name, ar->hdr[i].value);
    MHD_add_response_header(resp, "X-Request-Id", r->request_id);
    r->status = ar->status;
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)ar->status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result send_problem(http_server *h, struct MHD_Connection *conn, http_req *r, int status,
                                    const char *code, const char *detail, const char *hname, const char *hval)
{
    api_resp ar;
    api_resp_init(&ar);
    api_problem(&ar, status, code, detail, NULL);
    if (hname)
        api_resp_header(&ar, hname, "%s", hval);
    enum MHD_Result ok = send_resp(h, conn, r, &ar);
    api_resp_free(&ar);
    return ok;
}

static int is_json_type(const char *ct)
{
    if (!ct)
        return 0;
    while (*ct == ' ')
        ct++;
    size_t n = strlen("application/json");
    return strncasecmp(ct, "application/json", n) == 0 && (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
}

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    (void)value;
    struct { const char *name; int n; } *want = cls;
    if (key && !strcasecmp(key, want->name))
        want->n++;
    return MHD_YES;
}

static int header_count(struct MHD_Connection *conn, const char *name)
{
    struct { const char *name; int n; } want = {name, 0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, count_header, &want);
    return want.n;
}

/* The request's own shape, before anything else looks at it: a request target or head
 * longer than this server answers (414, 431), and message framing that could be read two
 * ways (RFC 9112 §6.3: repeated Content-Length, Content-Length beside Transfer-Encoding,
 * a transfer coding other than chunked). libmicrohttpd takes the first Content-Length
 * and would read an unknown coding's body until the connection closes, so these are
 * refused and the connection closed after the answer. Returns 1 with a response queued. */
static int framing_refused(http_server *h, struct MHD_Connection *conn, http_req *r, enum MHD_Result *res)
{
    char d[200];
    if (r->uri && strlen(r->uri) > h->uri_limit) {
        snprintf(d, sizeof d, "the request target is %zu bytes; this server takes at most %zu", strlen(r->uri),
                 h->uri_limit);
        *res = send_problem(h, conn, r, 414, "uri_too_long", d, "Connection", "close");
        return 1;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    if (ci && ci->header_size > h->head_limit) {
        snprintf(d, sizeof d, "the request line and headers are %zu bytes; this server takes at most %zu",
                 ci->header_size, h->head_limit);
        *res = send_problem(h, conn, r, 431, "headers_too_large", d, "Connection", "close");
        return 1;
    }
    int n_cl = header_count(conn, MHD_HTTP_HEADER_CONTENT_LENGTH);
    int n_te = header_count(conn, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    const char *why = n_cl > 1                ? "the request has more than one Content-Length header"
                      : n_cl && n_te          ? "the request has both Content-Length and Transfer-Encoding"
                      : n_te > 1              ? "the request has more than one Transfer-Encoding header"
                                              : NULL;
    if (why) {
        *res = send_problem(h, conn, r, 400, "invalid_request", why, "Connection", "close");
        return 1;
    }
    const char *te = n_te ? lookup_header(conn, MHD_HTTP_HEADER_TRANSFER_ENCODING) : NULL;
    if (te && strcasecmp(te, "chunked") != 0) {
        *res = send_problem(h, conn, r, 501, "not_implemented",
                            "the only transfer coding this server takes is chunked", "Connection", "close");
        return 1;
    }
    return 0;
}

/* First call: request id, framing, auth, routing and the limits that need no body.
 * Returns 1 when a response was queued (the request is done), 0 to continue. */
static int first_call(http_server *h, struct MHD_Connection *conn, http_req *r, const char *url,
                      const char *method, enum MHD_Result *res)
{
    const char *rid = lookup_header(conn, "X-Request-Id");
    if (rid && request_id_ok(rid))
        snprintf(r->request_id, sizeof r->request_id, "%s", rid);
    else
        new_request_id(r->request_id, sizeof r->request_id);
    r->started = 1;
    snprintf(r->method, sizeof r->method, "%s", method);
    if (framing_refused(h, conn, r, res))
        return 1;
    if (h->au && !strncmp(url, "/v1/", 4)) {
        int writes = strcmp(method, "GET") && strcmp(method, "HEAD");
        int rc = auth_check(h->au, lookup_header(conn, MHD_HTTP_HEADER_AUTHORIZATION), writes);
        if (rc == 401) {
            *res = send_problem(h, conn, r, 401, "unauthorized", "a valid bearer token is required",
                                "WWW-Authenticate", "Bearer realm=\"autocompress\"");
            return 1;
        }
        if (rc == 403) {
            *res = send_problem(h, conn, r, 403, "insufficient_scope",
                                writes ? "this token lacks the write scope" : "this token lacks the read scope",
                                "WWW-Authenticate", "Bearer error=\"insufficient_scope\"");
            return 1;
        }
    }
    /* libmicrohttpd decodes %00 into the C string it hands over, so "ID%00junk" would
     * be served as "ID": a NUL anywhere in the request target is refused first. */
    if (r->uri && strstr(r->uri, "%00")) {
        *res = send_problem(h, conn, r, 400, "invalid_request", "the request target holds an encoded NUL byte (%00)",
                            NULL, NULL);
        return 1;
    }
    char allow[128];
    int route = api_route_find(method, url, allow, sizeof allow);
    if (route == -404) {
        *res = send_problem(h, conn, r, 404, "not_found", "no such route", NULL, NULL);
        return 1;
    }
    if (route == -405) {
        char d[200];
        snprintf(d, sizeof d, "%s is not allowed here (allowed: %s)", method, allow);
        *res = send_problem(h, conn, r, 405, "method_not_allowed", d, "Allow", allow);
        return 1;
    }
    r->route = route;
    const char *cl = lookup_header(conn, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end = NULL;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (*cl && !*end && errno != ERANGE && n > h->body_limit) {
            char d[160];
            snprintf(d, sizeof d, "the body exceeds the limit of %zu bytes", h->body_limit);
            *res = send_problem(h, conn, r, 413, "body_too_large", d, NULL, NULL);
            return 1;
        }
    }
    if (api_route_has_body(route) && !is_json_type(lookup_header(conn, MHD_HTTP_HEADER_CONTENT_TYPE))) {
        *res = send_problem(h, conn, r, 415, "unsupported_media_type",
                            "the body must be application/json", "Accept-Post", "application/json");
        return 1;
    }
    return 0;
}

/* Park r until the store changes or its deadline passes. Returns 1 when parked, 0 when
 * the caller should look again now (a change raced with the check, or no room). */
static int park(http_server *h, http_req *r)
{
    pthread_mutex_lock(&h->mu);
    if (h->quiesced || h->n_parked >= h->max_suspended || h->gen != r->gen_seen) {
        int no_room = h->quiesced || h->n_parked >= h->max_suspended;
        pthread_mutex_unlock(&h->mu);
        if (no_room)
            r->deadline = 1e-9; /* in the past: answer now */
        return 0;
    }
    r->next_parked = h->parked;
    h->parked = r;
    h->n_parked++;
    MHD_suspend_connection(r->conn);
    pthread_mutex_unlock(&h->mu);
    return 1;
}

/* ---- requests that may wait ------------------------------------------------------------
 * A pool thread serves many connections (poll()): a handler that waits there (a lock, a
 * child process, a file hashed; api_route_blocking) would stall every connection on that
 * thread, downloads and health checks included. Such a request is suspended and queued for
 * the handler threads instead; one runs it, keeps the response in the request and resumes
 * the connection, whose next call sends the response. A suspended connection is never
 * closed under the handler (libmicrohttpd does not look at it), so the request lives until
 * it is resumed. */

static void off_run(http_server *h, http_req *r)
{
    api_req req = {
        .method = r->method, .path = r->path, .query = lookup_query, .header = lookup_header, .h = r->conn,
        .body = r->body ? r->body : "", .body_len = r->len, .request_id = r->request_id, .deadline = r->deadline,
    };
    api_resp_init(&r->off_resp);
    api_dispatch(h->api, r->route, &req, &r->off_resp);
}

static void *handler_main(void *arg)
{
    http_server *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->off_head && !h->stop_handlers)
            pthread_cond_wait(&h->off_cv, &h->mu);
        http_req *r = h->off_head;
        if (!r)
            break;   /* stopping, and nothing is left to answer */
        h->off_head = r->next_off;
        if (!h->off_head)
            h->off_tail = NULL;
        r->next_off = NULL;
        pthread_mutex_unlock(&h->mu);
        off_run(h, r);
        pthread_mutex_lock(&h->mu);
        r->off = OFF_DONE;
        r->counted = 1;
        h->n_off--;
        h->n_unsent++;
        MHD_resume_connection(r->conn);   /* r is the connection's again: not touched after */
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Hand r (its route blocking) to the handler threads. 1 when queued (the connection is
 * suspended), 0 when it must run here (no handler thread, they have stopped, or no memory
 * for its path). */
static int offload(http_server *h, http_req *r, const char *url)
{
    if (!r->path && !(r->path = strdup(url)))
        return 0;
    pthread_mutex_lock(&h->mu);
    if (h->n_handlers == 0 || h->stop_handlers) {   /* none started, or shutting down: here */
        pthread_mutex_unlock(&h->mu);
        return 0;
    }
    r->off = OFF_QUEUED;
    MHD_suspend_connection(r->conn);
    if (h->off_tail)
        h->off_tail->next_off = r;
    else
        h->off_head = r;
    h->off_tail = r;
    h->n_off++;
    pthread_cond_signal(&h->off_cv);
    pthread_mutex_unlock(&h->mu);
    return 1;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    (void)version;
    http_server *h = cls;
    http_req *r = *req_cls;
    if (!r) {
        r = on_uri(NULL, url, conn);
        if (!r)
            return MHD_NO;
        *req_cls = r;
    }
    if (conn_was_cut(h, r->cn))
        return MHD_NO; /* past its deadline: the connection is closing */
    if (!r->started) {
        enum MHD_Result res = MHD_YES;
        if (first_call(h, conn, r, url, method, &res)) {
            r->early = 1;
            return res;
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->early || r->overflow)
            return MHD_YES;
        if (r->len + n > h->body_limit) {
            r->overflow = 1;
            free(r->body);
            r->body = NULL;
            r->len = r->cap = 0;
            return MHD_YES;
        }
        if (r->len + n + 1 > r->cap) {
            size_t nc = r->cap ? r->cap : 4096;
            while (nc < r->len + n + 1)
                nc *= 2;
            char *nb = realloc(r->body, nc);
            if (!nb)
                return MHD_NO;
            r->body = nb;
            r->cap = nc;
        }
        memcpy(r->body + r->len, upload_data, n);
        r->len += n;
        r->body[r->len] = 0;
        return MHD_YES;
    }
    if (r->early)
        return MHD_YES;
    if (r->overflow) {
        char d[160];
        snprintf(d, sizeof d, "the body exceeds the limit of %zu bytes", h->body_limit);
        r->early = 1;
        return send_problem(h, conn, r, 413, "body_too_large", d, NULL, NULL);
    }
    if (r->off == OFF_DONE) {
        enum MHD_Result ok = send_resp(h, conn, r, &r->off_resp);
        api_resp_free(&r->off_resp);
        r->off = OFF_NONE;
        r->early = 1;
        return ok;
    }
    if (!conn_claim(h, r->cn))
        return MHD_NO; /* the request arrived, but after its deadline */
    if (api_route_blocking(r->route) && offload(h, r, url))
        return MHD_YES;
    for (;;) {
        pthread_mutex_lock(&h->mu);
        r->gen_seen = h->gen;
        pthread_mutex_unlock(&h->mu);
        api_req req = {
            .method = method, .path = url, .query = lookup_query, .header = lookup_header, .h = conn,
            .body = r->body ? r->body : "", .body_len = r->len, .request_id = r->request_id,
            .deadline = r->deadline,
        };
        api_resp ar;
        api_resp_init(&ar);
        api_dispatch(h->api, r->route, &req, &ar);
        if (ar.wait_until > 0) {
            r->deadline = ar.wait_until;
            api_resp_free(&ar);
            if (park(h, r))
                return MHD_YES;
            continue;
        }
        enum MHD_Result ok = send_resp(h, conn, r, &ar);
        api_resp_free(&ar);
        r->early = 1;
        return ok;
    }
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    http_server *h = cls;
    http_req *r = *req_cls;
    if (!r)
        return;
    double dur = eng_wall_s() - r->t0;
    char addr[64];
    client_addr(conn, addr, sizeof addr);
    int cut = 0;
    if (r->cn) {
        pthread_mutex_lock(&h->dmu);
        cut = r->cn->cut;
        r->cn->logged |= cut;
        pthread_mutex_unlock(&h->dmu);
    }
    /* A request libmicrohttpd answered itself (a malformed or oversized request it
     * refused before our handler ran): its status is the library's. */
    int by_library = 0;
    if (!r->status) {
        const union MHD_ConnectionInfo *si = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_HTTP_STATUS);
        if (si && si->http_status) {
            r->status = (int)si->http_status;
            by_library = 1;
        }
    }
    const char *term = cut                                         ? "deadline"
                       : toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? NULL
                       : toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? "timeout"
                       : toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT ? "client_abort"
                       : toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN ? "shutdown" : "error";
    log_access(r->method, r->uri, r->status, r->bytes, dur, r->request_id, addr, by_library, term);
    if (r->status)
        api_metrics_observe(r->status, dur);
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        conn_arm(h, r->cn); /* the connection stays open: the next request's clock starts */
    if (r->off == OFF_DONE)   /* resumed, then closed before its response was sent */
        api_resp_free(&r->off_resp);
    if (r->counted) {
        pthread_mutex_lock(&h->mu);
        h->n_unsent--;
        pthread_mutex_unlock(&h->mu);
    }
    free(r->path);
    free(r->uri);
    free(r->body);
    free(r);
    *req_cls = NULL;
}

/* The housekeeping thread: every 20 ms, resume the parked long-polls that are due and cut
 * the connections whose request is overdue. */
static void *waker(void *arg)
{
    http_server *h = arg;
    int64_t last = store_data_version(h->api->st);
    while (1) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&h->mu);
        int stop = h->stop_waker, quiesced = h->quiesced, any = h->n_parked > 0;
        pthread_mutex_unlock(&h->mu);
        if (stop)
            break;
        int64_t v = store_data_version(h->api->st);
        int changed = v != last;
        last = v;
        double now = eng_wall_s();
        pthread_mutex_lock(&h->mu);
        if (changed)
            h->gen++;
        if (any || changed) {
            http_req **pp = &h->parked;
            while (*pp) {
                http_req *r = *pp;
                if (changed || quiesced || now >= r->deadline) {
                    *pp = r->next_parked;
                    h->n_parked--;
                    r->next_parked = NULL;
                    MHD_resume_connection(r->conn);
                } else {
                    pp = &r->next_parked;
                }
            }
        }
        pthread_mutex_unlock(&h->mu);
        reap_overdue(h, now);
    }
    return NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = 0;
    log_json("warn", json_pack("{s:s,s:s}", "msg", "libmicrohttpd", "detail", buf));
}

static void on_panic(void *cls, const char *file, unsigned int line, const char *reason)
{
    (void)cls;
    char buf[1024];
    snprintf(buf, sizeof buf, "{\"level\":\"error\",\"msg\":\"libmicrohttpd panic\",\"file\":\"%s\",\"line\":%u,\"reason\":\"%s\"}\n",
             file ? file : "?", line, reason ? reason : "?");
    ssize_t w = write(2, buf, strlen(buf));
    (void)w;
    abort();
}

/* Let every request handed to the handler threads be handled (for at most wait_s; each
 * handler's own wait is bounded) and its answer sent (for at most 2 s more: a short answer
 * goes out at once, a long download is cut as libmicrohttpd's stop cuts any), then stop the
 * handler threads. */
static void handlers_stop(http_server *h, double wait_s)
{
    double t0 = eng_wall_s(), handled = 0;   /* when the last was handled */
    pthread_mutex_lock(&h->mu);
    for (;;) {
        double now = eng_wall_s();
        if (h->n_off == 0 && handled == 0)
            handled = now;
        if (h->n_off > 0 ? now - t0 >= wait_s : h->n_unsent == 0 || now - handled >= 2)
            break;
        pthread_mutex_unlock(&h->mu);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&h->mu);
    }
    int left = h->n_off;
    h->stop_handlers = 1;
    pthread_cond_broadcast(&h->off_cv);
    int n = h->n_handlers;
    pthread_mutex_unlock(&h->mu);
    if (left > 0)
        log_msg("warn", "%d requests still being handled after %.0f s of shutdown", left, wait_s);
    for (int i = 0; i < n; i++)
        pthread_join(h->handlers[i], NULL);
    pthread_mutex_lock(&h->mu);
    h->n_handlers = 0;
    pthread_mutex_unlock(&h->mu);
    free(h->handlers);
    h->handlers = NULL;
}

http_server *http_start(const srv_config *cfg, api_ctx *api, const auth *au, char *err, size_t errlen)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int rc = getaddrinfo(cfg->host, port, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errlen, "--listen %s: %s", cfg->host, gai_strerror(rc));
        return NULL;
    }
    http_server *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->api = api;
    h->au = au;
    h->body_limit = cfg->body_limit_bytes;
    /* Below what a connection's memory pool holds, so that libmicrohttpd's own HTML 414 and
       431 answers (for what does not fit at all) are left for truly oversized requests. */
    h->uri_limit = cfg->conn_memory_bytes / 8;
    h->head_limit = cfg->conn_memory_bytes / 2;
    h->deadline_s = cfg->request_deadline_s;
    h->max_suspended = cfg->max_suspended;
    pthread_mutex_init(&h->mu, NULL);
    pthread_mutex_init(&h->dmu, NULL);
    pthread_cond_init(&h->off_cv, NULL);
    /* without any, blocking routes run on the pool threads (said once) */
    h->handlers = calloc((size_t)cfg->handler_threads, sizeof *h->handlers);
    for (int i = 0; h->handlers && i < cfg->handler_threads; i++) {
        if (pthread_create(&h->handlers[i], NULL, handler_main, h) != 0)
            break;
        h->n_handlers++;
    }
    if (h->n_handlers < cfg->handler_threads)
        log_msg("warn", "started %d of %d handler threads", h->n_handlers, cfg->handler_threads);
    if (cfg->per_ip_connections >= cfg->max_connections)
        log_msg("warn", "--per-ip-connections %d is not below --max-connections %d: one client address can take "
                "every connection", cfg->per_ip_connections, cfg->max_connections);
    MHD_set_panic_func(on_panic, NULL);
    /* poll(), not epoll: with a thread pool, libmicrohttpd 0.9.75-0.9.77 panics in MHD_quiesce_daemon when a
       worker removes the listen socket from its epoll set first (an unchecked ENOENT), which a shutdown under
       load can hit. Quiescing in poll mode only signals each worker through its ITC pipe. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG | MHD_USE_TURBO;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h,
                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)cfg->threads,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->per_ip_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout_s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)cfg->conn_memory_bytes,
                            MHD_OPTION_URI_LOG_CALLBACK, on_uri, NULL,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        snprintf(err, errlen, "cannot listen on %s:%d (in use, or not an address of this host)", cfg->host, cfg->port);
        handlers_stop(h, 0);
        pthread_cond_destroy(&h->off_cv);
        pthread_mutex_destroy(&h->mu);
        pthread_mutex_destroy(&h->dmu);
        free(h);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : cfg->port;
    g_server = h;
    api->suspended_count = parked_count;
    if (pthread_create(&h->waker, NULL, waker, h) != 0) {
        handlers_stop(h, 0);
        MHD_stop_daemon(h->d);
        pthread_cond_destroy(&h->off_cv);
        pthread_mutex_destroy(&h->mu);
        pthread_mutex_destroy(&h->dmu);
        free(h);
        g_server = NULL;
        snprintf(err, errlen, "cannot start the long-poll waker thread");
        return NULL;
    }
    return h;
}


int http_port(http_server *h)
{
    return h->port;
}

const char *http_library_version(void)
{
    return MHD_get_version();
}

void http_quiesce(http_server *h)
{
    MHD_socket s = MHD_quiesce_daemon(h->d);
    if (s != MHD_INVALID_SOCKET)
        close(s);
    pthread_mutex_lock(&h->mu);
    h->quiesced = 1;
    pthread_mutex_unlock(&h->mu);
}

void http_stop(http_server *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->quiesced = 1;
    pthread_mutex_unlock(&h->mu);
    handlers_stop(h, 10);   /* well inside the shutdown deadline (serve: grace + 15 s) */
    /* Let the waker answer every parked request, then stop it. */
    for (int i = 0; i < 100 && parked_count() > 0; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&h->mu);
    h->stop_waker = 1;
    while (h->parked) {
        http_req *r = h->parked;
        h->parked = r->next_parked;
        h->n_parked--;
        MHD_resume_connection(r->conn);
    }
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->waker, NULL);
    MHD_stop_daemon(h->d);
    g_server = NULL;
    pthread_cond_destroy(&h->off_cv);
    pthread_mutex_destroy(&h->mu);
    pthread_mutex_destroy(&h->dmu);
    free(h);
}
