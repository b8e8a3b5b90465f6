/* tests/unit/test_s3_retry.c — the S3 client (storage/s3.c) against a scripted endpoint on
 * the loopback: an answer S3 asks clients to retry (503 SlowDown, 500, a connection closed
 * without an answer) is followed by the same request again, signed afresh with its whole
 * body, and the upload or read succeeds; an answer that is final (403) is not retried; a
 * ranged read answered with the whole object (200) is an error before any byte is handed
 * over, and one that broke after bytes were handed over is not sent again; a multipart
 * Complete whose answer was lost counts as done when the object holds its size and
 * sha-256; a renewed credentials file is read again; the artifact store replaces a remote
 * object of the right size that lacks the blob's sha-256.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "storage/artstore.h"
#include "storage/fileio.h"
#include "storage/s3.h"

/* ---- the scripted endpoint ------------------------------------------------------------ */

enum { MAX_STEPS = 8 };
typedef struct {
    int status;           /* 0: close the connection without an answer */
    const char *headers;  /* extra header lines, each ending \r\n */
    const char *body;
    int body_cut;         /* promise strlen(body) + body_cut bytes, send body, close */
    int delay_ms;         /* wait this long before answering */
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
        if (s->delay_ms)
            usleep((useconds_t)s->delay_ms * 1000);
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

/* A client of s3://bucket/prefix at the endpoint: credentials from the environment, or
 * the file cred_path; parts of part_bytes (0: the default). */
static s3_client *client_with(const endpoint *e, const char *cred_path, int64_t part_bytes)
{
    char ep[64], err[512];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", e->port);
    s3_options o = {.endpoint = ep, .region = "us-east-1", .allow_http = 1, .credentials_file = cred_path,
                    .part_bytes = part_bytes};
    s3_client *c = s3_open("s3://bucket/prefix", &o, err, sizeof err);
    if (!c)
        fail_msg("s3_open: %s", err);
    return c;
}

static s3_client *client_for(const endpoint *e)
{
    return client_with(e, NULL, 0);
}

/* The artifact store's remote: s3://bucket/prefix at the endpoint (its HEAD of the bucket
 * the endpoint's next step). */
static void attach(artstore *as, const endpoint *e)
{
    char ep[64], err[512];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", e->port);
    setenv("AWS_ENDPOINT_URL", ep, 1);
    int rc = art_attach_remote(as, "s3://bucket/prefix", NULL, 1, err, sizeof err);
    unsetenv("AWS_ENDPOINT_URL");
    if (rc)
        fail_msg("art_attach_remote: %s", err);
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
    int rc = s3_put_file(c, "k", file, NULL, etag, err, sizeof err);
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
    assert_int_equal(s3_put_file(c, "k", file, NULL, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "HTTP 403 AccessDenied"));
    assert_int_equal(e.served, 1);
    /* the endpoint's second step serves the next request: unblock its thread */
    assert_int_equal(s3_head(c, "k", NULL, err, sizeof err), 0);
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
    assert_int_equal(s3_head(c, "k", NULL, err, sizeof err), 0);   /* unblock the endpoint */
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
        s3_client *c = client_with(&e, path, 0);
        (void)s3_head(c, "k", NULL, err, sizeof err);
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

/* Temporary credentials renewed in their file by an agent: the next request is signed with
 * the new keys, and a token the new file no longer has is not sent. */
static void test_credentials_renewed(void **state)
{
    (void)state;
    char path[128], err[512];
    snprintf(path, sizeof path, "%s/renewed", dir);
    static const char one[] = "[default]\naws_access_key_id = AKIAONE\naws_secret_access_key = s-one\n"
                              "aws_session_token = tok-one\n";
    static const char two[] = "[default]\naws_access_key_id = AKIATWO\naws_secret_access_key = s-two\n";
    assert_int_equal(fio_write_atomic(path, one, sizeof one - 1, err, sizeof err), 0);
    endpoint e = {.n_steps = 2, .steps = {{200, NULL, NULL, 3}, {200, NULL, NULL, 3}}};
    endpoint_start(&e);
    s3_client *c = client_with(&e, path, 0);
    assert_int_equal(s3_head(c, "k", NULL, err, sizeof err), 0);
    assert_int_equal(fio_write_atomic(path, two, sizeof two - 1, err, sizeof err), 0);
    assert_int_equal(s3_head(c, "k", NULL, err, sizeof err), 0);
    s3_close(c);
    endpoint_stop(&e);
    assert_non_null(strstr(e.head[0], "AKIAONE/"));
    assert_non_null(strcasestr(e.head[0], "x-amz-security-token: tok-one"));
    if (!strstr(e.head[1], "AKIATWO/") || strcasestr(e.head[1], "x-amz-security-token"))
        fail_msg("after the file was renewed: %s", e.head[1]);
}

/* the signed headers of a request that stores a sha-256 (real S3 refuses an unsigned x-amz-*) */
#define SIGNED_META "SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-meta-sha256,"

static const char sha_hex[] = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/* A multipart upload whose Complete was carried out but whose answer was lost: the retry
 * finds the upload gone (404 NoSuchUpload). The object now holds this upload's size and
 * sha-256 (stored at its start as x-amz-meta-sha256), so the upload succeeded. The same
 * 404 with an object of another sha-256 there is the failure it says. */
static void test_complete_answer_lost(void **state)
{
    (void)state;
    char big[160], err[512] = "", etag[65] = "";
    snprintf(big, sizeof big, "%s/big", dir);
    int64_t size = 6 * 1024 * 1024;   /* two parts of 5 MiB (the smallest part size) */
    FILE *f = fopen(big, "wb");
    assert_non_null(f);
    assert_int_equal(fseek(f, size - 1, SEEK_SET), 0);
    assert_int_equal(fputc('x', f), 'x');
    assert_int_equal(fclose(f), 0);
    static const char no_upload[] = "<Error><Code>NoSuchUpload</Code><Message>gone</Message></Error>";
    char head_ok[256], head_other[256];
    snprintf(head_ok, sizeof head_ok, "ETag: \"done-2\"\r\nx-amz-meta-sha256: %s\r\n", sha_hex);
    snprintf(head_other, sizeof head_other, "ETag: \"old-2\"\r\nx-amz-meta-sha256: %064d\r\n", 0);
    for (int other = 0; other < 2; other++) {
        endpoint e = {.n_steps = 7,
                      .steps = {{200, NULL, "<InitiateMultipartUploadResult><UploadId>U1</UploadId>"
                                            "</InitiateMultipartUploadResult>", 0},
                                {200, "ETag: \"p1\"\r\n", NULL, 0},
                                {200, "ETag: \"p2\"\r\n", NULL, 0},
                                {0, NULL, NULL, 0},          /* the Complete: done, its answer lost */
                                {404, NULL, no_upload, 0},   /* its retry */
                                /* the HEAD: no body, its Content-Length the object's size */
                                {200, other ? head_other : head_ok, NULL, (int)size},
                                {404, NULL, no_upload, 0}}}; /* the abort (best effort) */
        endpoint_start(&e);
        s3_client *c = client_with(&e, NULL, 5 * 1024 * 1024);
        int rc = s3_put_file(c, "k", big, sha_hex, etag, err, sizeof err);
        s3_close(c);
        endpoint_stop(&e);
        if (!strcasestr(e.head[0], "x-amz-meta-sha256: 9f86d0") || !strstr(e.head[0], SIGNED_META))
            fail_msg("the multipart start does not carry the sha-256, signed: %s", e.head[0]);
        assert_string_equal(e.method[5], "HEAD");
        assert_int_equal(e.served, 7);   /* and the abort was still sent */
        assert_string_equal(e.method[6], "DELETE");
        if (other) {
            assert_int_equal(rc, -1);
            assert_non_null(strstr(err, "NoSuchUpload"));
        } else {
            if (rc)
                fail_msg("s3_put_file: %s", err);
            assert_string_equal(etag, "done-2");
        }
    }
}

/* The artifact store's write-through (artstore.c): an object already under the blob's key,
 * of the same size but without this sha-256 beside it (another tool's, or wrong), is
 * replaced, the upload carrying the sha-256; one that has it is left alone. */
static void test_remote_object_replaced(void **state)
{
    (void)state;
    char store_dir[128], hex[65], err[512], head_have[256], head_none[64];
    int64_t size = 0;
    snprintf(store_dir, sizeof store_dir, "%s/store", dir);
    assert_int_equal(art_sha256_file(file, hex, &size, err, sizeof err), 0);
    artstore *as = art_open(store_dir, err, sizeof err);
    if (!as)
        fail_msg("art_open: %s", err);
    snprintf(head_none, sizeof head_none, "ETag: \"e\"\r\n");
    char upper[65];   /* a store may give the stored value back in another case */
    for (int i = 0; i < 65; i++)
        upper[i] = (char)toupper((unsigned char)hex[i]);
    snprintf(head_have, sizeof head_have, "ETag: \"e\"\r\nx-amz-meta-sha256:\t%s \r\n", upper);
    for (int has = 0; has < 2; has++) {
        endpoint e = {.n_steps = 3,
                      .steps = {{200, NULL, NULL, 0},                                  /* HEAD of the bucket */
                                {200, has ? head_have : head_none, NULL, (int)size},   /* HEAD of the object */
                                {200, "ETag: \"new\"\r\n", NULL, 0}}};               /* the PUT */
        endpoint_start(&e);
        char got[65];
        attach(as, &e);
        int64_t n = 0;
        if (art_put(as, file, got, &n, err, sizeof err))
            fail_msg("art_put: %s", err);
        endpoint_stop(&e);
        assert_int_equal(e.served, has ? 2 : 3);
        assert_string_equal(e.method[1], "HEAD");
        if (!has) {
            char want[100];
            snprintf(want, sizeof want, "x-amz-meta-sha256: %s", hex);
            assert_string_equal(e.method[2], "PUT");
            if (!strcasestr(e.head[2], want) || !strstr(e.head[2], SIGNED_META))
                fail_msg("the upload does not carry the sha-256, signed: %s", e.head[2]);
        }
    }
    art_close(as);
}

typedef struct {
    artstore *as;
    const char *hex;
    int64_t size;
    int fd;
    char err[512];
} opener;

static void *open_blob(void *arg)
{
    opener *o = arg;
    o->fd = art_open_blob(o->as, o->hex, o->size, 1, o->err, sizeof o->err);
    return NULL;
}

/* Two readers of a blob that only the bucket holds: one copy comes in (one GET), and the
 * other reader waits for it and opens it, checked, instead of fetching it again. */
static void test_remote_fetch_once(void **state)
{
    (void)state;
    char store_dir[128], hex[65], err[512];
    int64_t size = 0;
    snprintf(store_dir, sizeof store_dir, "%s/once", dir);
    assert_int_equal(art_sha256_file(file, hex, &size, err, sizeof err), 0);
    artstore *as = art_open(store_dir, err, sizeof err);
    if (!as)
        fail_msg("art_open: %s", err);
    endpoint e = {.n_steps = 3,
                  .steps = {{200, NULL, NULL, 0, 0},                 /* HEAD of the bucket */
                            {200, NULL, payload, 0, 500},            /* the object, slowly */
                            {200, NULL, payload, 0, 0}}};            /* a second GET, if any */
    endpoint_start(&e);
    attach(as, &e);
    opener o[2] = {{as, hex, size, -1, ""}, {as, hex, size, -1, ""}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pthread_create(&th[i], NULL, open_blob, &o[i]), 0);
        usleep(100000);   /* the second asks while the first's GET is answered */
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    endpoint_stop(&e);
    for (int i = 0; i < 2; i++) {
        if (o[i].fd < 0)
            fail_msg("reader %d: %s", i, o[i].err);
        close(o[i].fd);
    }
    assert_int_equal(e.served, 2);
    assert_string_equal(e.method[1], "GET");
    char lockp[300];
    snprintf(lockp, sizeof lockp, "%s/sha256/%.2s/%s.fetching", store_dir, hex, hex);
    assert_int_not_equal(access(lockp, F_OK), 0);   /* the lock file goes with the fetch */
    art_close(as);

    /* a fetch that fails: the reader waiting for it gets its reason, without a GET of its own */
    snprintf(store_dir, sizeof store_dir, "%s/once-failed", dir);
    as = art_open(store_dir, err, sizeof err);
    assert_non_null(as);
    static const char no_key[] = "<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>";
    endpoint g = {.n_steps = 3,
                  .steps = {{200, NULL, NULL, 0, 0}, {404, NULL, no_key, 0, 500}, {404, NULL, no_key, 0, 0}}};
    endpoint_start(&g);
    attach(as, &g);
    for (int i = 0; i < 2; i++) {
        o[i] = (opener){as, hex, size, -1, ""};
        assert_int_equal(pthread_create(&th[i], NULL, open_blob, &o[i]), 0);
        usleep(100000);
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    endpoint_stop(&g);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(o[i].fd, -1);
        if (!strstr(o[i].err, "NoSuchKey"))
            fail_msg("reader %d: %s", i, o[i].err);
    }
    assert_int_equal(g.served, 2);
    art_close(as);
}

/* The multipart uploads a killed writer left (started more than a day ago) are aborted;
 * a recent one (perhaps another server's, still uploading) and one outside the store's
 * prefix are left alone. */
static void test_stale_uploads_aborted(void **state)
{
    (void)state;
    char recent[32], body[1600], err[512];
    time_t t = time(NULL) - 60;
    struct tm tm;
    assert_non_null(gmtime_r(&t, &tm));
    assert_true(strftime(recent, sizeof recent, "%Y-%m-%dT%H:%M:%S.000Z", &tm) > 0);
    snprintf(body, sizeof body,
             "<ListMultipartUploadsResult><Bucket>bucket</Bucket><IsTruncated>false</IsTruncated>"
             "<Upload><Key>prefix/sha256/aaa</Key><UploadId>U-OLD</UploadId>"
             "<Initiated>2020-01-01T00:00:00.000Z</Initiated></Upload>"
             "<Upload><Key>prefix/sha256/bbb</Key><UploadId>U-NEW</UploadId><Initiated>%s</Initiated></Upload>"
             "<Upload><Key>elsewhere/sha256/ccc</Key><UploadId>U-OTHER</UploadId>"
             "<Initiated>2020-01-01T00:00:00.000Z</Initiated></Upload></ListMultipartUploadsResult>", recent);
    endpoint e = {.n_steps = 3, .steps = {{200, NULL, body, 0, 0}, {204, NULL, NULL, 0, 0}, {204, NULL, NULL, 0, 0}}};
    endpoint_start(&e);
    s3_client *c = client_for(&e);
    int aborted = -1;
    int rc = s3_abort_stale_uploads(c, "sha256/", 86400, &aborted, err, sizeof err);
    s3_close(c);
    endpoint_stop(&e);
    if (rc)
        fail_msg("s3_abort_stale_uploads: %s", err);
    assert_int_equal(aborted, 1);
    assert_int_equal(e.served, 2);
    if (!strstr(e.head[0], "GET /bucket?uploads&prefix=prefix%2Fsha256%2F&max-uploads=100 "))
        fail_msg("the listing: %s", e.head[0]);
    if (!strstr(e.head[1], "DELETE /bucket/prefix/sha256/aaa?uploadId=U-OLD "))
        fail_msg("the abort: %s", e.head[1]);

    /* a listing longer than the answer kept: an error, nothing parsed from a spliced text
     * (a live upload's key beside a dead one's date) and nothing aborted */
    size_t cap = 400 * 1024;
    char *big = malloc(cap), *w = big;
    w += sprintf(w, "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>");
    for (int i = 0; w - big < (long)cap - 400; i++)
        w += sprintf(w, "<Upload><Key>prefix/sha256/k%06d</Key><UploadId>U%06d</UploadId>"
                        "<Initiated>%s</Initiated><StorageClass>STANDARD</StorageClass></Upload>", i, i,
                     i % 2 ? recent : "2020-01-01T00:00:00.000Z");
    sprintf(w, "</ListMultipartUploadsResult>");
    endpoint l = {.n_steps = 2, .steps = {{200, NULL, big, 0, 0}, {204, NULL, NULL, 0, 0}}};
    endpoint_start(&l);
    c = client_for(&l);
    rc = s3_abort_stale_uploads(c, "sha256/", 86400, &aborted, err, sizeof err);
    s3_close(c);
    endpoint_stop(&l);
    free(big);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, "longer than"));
    assert_int_equal(l.served, 1);
    assert_int_equal(aborted, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_retried),
        cmocka_unit_test(test_final_answer_not_retried),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_credentials_profiles),
        cmocka_unit_test(test_open_refusals),
        cmocka_unit_test(test_complete_answer_lost),
        cmocka_unit_test(test_credentials_renewed),
        cmocka_unit_test(test_remote_object_replaced),
        cmocka_unit_test(test_remote_fetch_once),
        cmocka_unit_test(test_stale_uploads_aborted),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
