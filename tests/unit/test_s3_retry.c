/* tests/unit/test_s3_retry.c — the S3 client (storage/s3.c) against a scripted endpoint on
 * the loopback: an answer S3 asks clients to retry (503 SlowDown, 500, a connection closed
 * without an answer) is followed by the same request again, signed afresh with its whole
 * body, and the upload or read succeeds; an answer that is final (403) is not retried; a
 * ranged read answered with the whole object (200) is an error before any byte is handed
 * over, and one that broke after bytes were handed over is not sent again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>

#include "storage/fileio.h"
#include "storage/s3.h"

/* ---- the scripted endpoint ------------------------------------------------------------ */

enum { MAX_STEPS = 8 };
typedef struct {
    int status;           /* 0: close the connection without an answer */
    const char *headers;  /* extra header lines, each ending \r\n */
    const char *body;
    int body_cut;         /* promise strlen(body) + body_cut bytes, send body, close */
} step;

typedef struct {
    int lfd, port;
    pthread_t th;
    step steps[MAX_STEPS];
    int n_steps, served;
    size_t body_len[MAX_STEPS];   /* request body bytes each request carried */
    char method[MAX_STEPS][8];
    char head[MAX_STEPS][2048];   /* each request's line and headers (cut to fit) */
} endpoint;

static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read one request (headers, then Content-Length bytes of body); its method, head and
 * body size. */
static int read_request(int fd, char method[8], char head[2048], size_t *body)
{
    char buf[16384];
    size_t got = 0;
    char *end = NULL;
    while (!end) {
        if (got == sizeof buf - 1)
            return -1;
        ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (r <= 0)
            return -1;
        got += (size_t)r;
        buf[got] = 0;
        end = strstr(buf, "\r\n\r\n");
    }
    snprintf(method, 8, "%.*s", (int)strcspn(buf, " "), buf);
    snprintf(head, 2048, "%.*s", (int)(end - buf), buf);
    const char *cl = strcasestr(buf, "\r\nContent-Length:");
    size_t want = cl ? (size_t)strtoull(cl + 17, NULL, 10) : 0, have = got - (size_t)(end + 4 - buf);
    while (have < want) {
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0)
            return -1;
        have += (size_t)r;
    }
    *body = have;
    return 0;
}

static void *endpoint_main(void *arg)
{
    endpoint *e = arg;
    while (e->served < e->n_steps) {
        int fd = accept(e->lfd, NULL, NULL);
        if (fd < 0)
            return NULL;
        int i = e->served;
        if (read_request(fd, e->method[i], e->head[i], &e->body_len[i]) < 0) {
            close(fd);
            continue;
        }
        e->served++;
        const step *s = &e->steps[i];
        if (s->status) {
            char head[1024];
            size_t bl = s->body ? strlen(s->body) : 0;
            int n = snprintf(head, sizeof head, "HTTP/1.1 %d X\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n",
                             s->status, bl + (size_t)s->body_cut, s->headers ? s->headers : "");
            if (send_all(fd, head, (size_t)n) == 0 && bl)
                (void)send_all(fd, s->body, bl);
        }
        shutdown(fd, SHUT_RDWR);
        close(fd);
    }
    return NULL;
}

static void endpoint_start(endpoint *e)
{
    e->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(e->lfd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(e->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(e->lfd, 8), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(e->lfd, (struct sockaddr *)&a, &al), 0);
    e->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&e->th, NULL, endpoint_main, e), 0);
}

static void endpoint_stop(endpoint *e)
{
    shutdown(e->lfd, SHUT_RDWR);
    pthread_join(e->th, NULL);
    close(e->lfd);
}

static s3_client *client_for(const endpoint *e)
{
    char ep[64], err[512];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", e->port);
    s3_options o = {.endpoint = ep, .region = "us-east-1", .allow_http = 1};
    s3_client *c = s3_open("s3://bucket/prefix", &o, err, sizeof err);
    if (!c)
        fail_msg("s3_open: %s", err);
    return c;
}

static char dir[64], file[128];
static const char payload[] = "the bytes of one small artifact, sent whole in one PUT";

static int setup(void **state)
{
    (void)state;
    setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", 1);
    unsetenv("AWS_SESSION_TOKEN");
    snprintf(dir, sizeof dir, "/tmp/ac-s3retry-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(file, sizeof file, "%s/blob", dir);
    char err[256];
    if (fio_write_atomic(file, payload, sizeof payload - 1, err, sizeof err) < 0)
        return -1;
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    curl_global_cleanup();
    return fio_remove_tree(dir);
}

static const char slow_down[] = "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";

static void test_put_retried(void **state)
{
    (void)state;
    endpoint e = {.n_steps = 3,
                  .steps = {{503, NULL, slow_down, 0}, {0, NULL, NULL, 0}, {200, "ETag: \"abc123\"\r\n", NULL, 0}}};
    endpoint_start(&e);
    s3_client *c = client_for(&e);
    char etag[65] = "", err[512] = "";
    int rc = s3_put_file(c, "k", file, etag, err, sizeof err);
    s3_close(c);
    endpoint_stop(&e);
    if (rc)
        fail_msg("s3_put_file: %s", err);
    assert_string_equal(etag, "abc123");
    assert_int_equal(e.served, 3);
    for (int i = 0; i < 3; i++) {   /* each attempt carried the whole body */
        assert_string_equal(e.method[i], "PUT");
        assert_int_equal(e.body_len[i], sizeof payload - 1);
    }
}

static void test_final_answer_not_retried(void **state)
{
    (void)state;
    endpoint e = {.n_steps = 2,
                  .steps = {{403, NULL, "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>", 0},
                            {200, "ETag: \"x\"\r\n", NULL, 0}}};
    endpoint_start(&e);
    s3_client *c = client_for(&e);
    char err[512] = "";
    assert_int_equal(s3_put_file(c, "k", file, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "HTTP 403 AccessDenied"));
    assert_int_equal(e.served, 1);
    /* the endpoint's second step serves the next request: unblock its thread */
    assert_int_equal(s3_head(c, "k", NULL, NULL, err, sizeof err), 0);
    s3_close(c);
    endpoint_stop(&e);
}

typedef struct {
    char buf[256];
    size_t n;
} sink_buf;

static int to_buf(void *user, const void *p, size_t n)
{
    sink_buf *b = user;
    if (b->n + n > sizeof b->buf)
        return 1;
    memcpy(b->buf + b->n, p, n);
    b->n += n;
    return 0;
}

static void test_ranges(void **state)
{
    (void)state;
    /* a 500, then the range */
    endpoint e = {.n_steps = 2,
                  .steps = {{500, NULL, "<Error><Code>InternalError</Code></Error>", 0},
                            {206, "Content-Range: bytes 4-8/20\r\n", "45678", 0}}};
    endpoint_start(&e);
    s3_client *c = client_for(&e);
    sink_buf b = {0};
    int64_t got = 0;
    char err[512] = "";
    int rc = s3_get_range(c, "k", 4, 5, to_buf, &b, &got, err, sizeof err);
    s3_close(c);
    endpoint_stop(&e);
    if (rc)
        fail_msg("s3_get_range: %s", err);
    assert_int_equal(got, 5);
    assert_memory_equal(b.buf, "45678", 5);

    /* the whole object (200) for a range from byte 4: refused, nothing handed over */
    endpoint w = {.n_steps = 1, .steps = {{200, NULL, "0123456789abcdefghij", 0}}};
    endpoint_start(&w);
    c = client_for(&w);
    memset(&b, 0, sizeof b);
    assert_int_equal(s3_get_range(c, "k", 4, 5, to_buf, &b, &got, err, sizeof err), -1);
    assert_non_null(strstr(err, "whole object"));
    assert_int_equal(b.n, 0);
    assert_int_equal(w.served, 1);
    s3_close(c);
    endpoint_stop(&w);

    /* broken off after bytes were handed over: not sent again (they would arrive twice) */
    endpoint cut = {.n_steps = 2, .steps = {{206, "Content-Range: bytes 0-9/20\r\n", "01234", 5}, {206, NULL, "0123456789", 0}}};
    endpoint_start(&cut);
    c = client_for(&cut);
    memset(&b, 0, sizeof b);
    assert_int_equal(s3_get_range(c, "k", 0, 10, to_buf, &b, &got, err, sizeof err), -1);
    assert_int_equal(cut.served, 1);
    assert_int_equal(b.n, 5);
    assert_int_equal(s3_head(c, "k", NULL, NULL, err, sizeof err), 0);   /* unblock the endpoint */
    s3_close(c);
    endpoint_stop(&cut);
}

/* A credentials file of ~/.aws/credentials' shape: the profile AWS_PROFILE names (else
 * [default]) is the one read, its token with its keys; another profile's keys, or its
 * token, never mix in. Lines before any [section] (this product's own format) count for
 * every profile. */
static void test_credentials_profiles(void **state)
{
    (void)state;
    char path[128], err[512];
    snprintf(path, sizeof path, "%s/credentials", dir);
    static const char text[] = "[default]\naws_access_key_id = AKIADEFAULT\naws_secret_access_key = s-default\n"
                               "aws_session_token = tok-default\n\n[prod]\naws_access_key_id = AKIAPROD\n"
                               "aws_secret_access_key = s-prod\n";
    assert_int_equal(fio_write_atomic(path, text, sizeof text - 1, err, sizeof err), 0);
    static const char *const profiles[] = {NULL, "prod"}, *const want_key[] = {"AKIADEFAULT/", "AKIAPROD/"};
    for (int k = 0; k < 2; k++) {
        if (profiles[k])
            setenv("AWS_PROFILE", profiles[k], 1);
        else
            unsetenv("AWS_PROFILE");
        endpoint e = {.n_steps = 1, .steps = {{200, "Content-Length: 3\r\n", NULL, 0}}};
        endpoint_start(&e);
        char ep[64];
        snprintf(ep, sizeof ep, "http://127.0.0.1:%d", e.port);
        s3_options o = {.endpoint = ep, .region = "us-east-1", .allow_http = 1, .credentials_file = path};
        s3_client *c = s3_open("s3://bucket/prefix", &o, err, sizeof err);
        if (!c)
            fail_msg("s3_open: %s", err);
        int64_t size = 0;
        (void)s3_head(c, "k", &size, NULL, err, sizeof err);
        s3_close(c);
        endpoint_stop(&e);
        unsetenv("AWS_PROFILE");
        assert_int_equal(e.served, 1);
        if (!strstr(e.head[0], want_key[k]))
            fail_msg("profile %s: signed with another key: %s", profiles[k] ? profiles[k] : "default", e.head[0]);
        int token = strcasestr(e.head[0], "x-amz-security-token: tok-default") != NULL;
        if (token != (k == 0))
            fail_msg("profile %s: the session token %s: %s", profiles[k] ? profiles[k] : "default",
                     token ? "of [default] went with it" : "is missing", e.head[0]);
    }
}

/* s3_open refuses what would fail later or leak: a prefix with "." or ".." segments (the
 * HTTP client folds them after signing, so every request would fail its signature), and
 * names an endpoint with a user and password without them. */
static void test_open_refusals(void **state)
{
    (void)state;
    char err[512];
    static const char *const urls[] = {"s3://bucket/a/../b", "s3://bucket/./x", "s3://bucket/a//b", "s3://bucket/.."};
    s3_options o = {.endpoint = "https://s3.example.com", .region = "us-east-1"};
    for (size_t i = 0; i < sizeof urls / sizeof *urls; i++) {
        s3_client *c = s3_open(urls[i], &o, err, sizeof err);
        if (c) {
            s3_close(c);
            fail_msg("%s was taken", urls[i]);
        }
        assert_non_null(strstr(err, "segment"));
    }
    s3_client *c = s3_open("s3://bucket/a.b/c..d/.e", &o, err, sizeof err);   /* dots inside names are names */
    if (!c)
        fail_msg("s3://bucket/a.b/c..d/.e: %s", err);
    s3_close(c);
    o.endpoint = "https://AKIAUSER:s3cr3tpass@s3.example.com";
    assert_null(s3_open("s3://bucket/p", &o, err, sizeof err));
    if (strstr(err, "s3cr3tpass") || strstr(err, "AKIAUSER") || !strstr(err, "s3.example.com"))
        fail_msg("the refusal: %s", err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_retried),
        cmocka_unit_test(test_final_answer_not_retried),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_credentials_profiles),
        cmocka_unit_test(test_open_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
