/* tests/unit/test_fetch.c — fetch_url against a tiny HTTP/1.1 server on a thread of this
 * test (loopback, one connection at a time, Connection: close): full download with the
 * digest checked, digest mismatch, size limit, resume after a dropped connection (Range),
 * a server that ignores Range (200, restart), a stale .part, HTTP errors, cancellation,
 * scheme policy, CA files (fetch_check_ca_file; a CA bundle that cannot be loaded fails
 * an https download at once, as a certificate that cannot be verified); and the model
 * fetcher resuming a model left "fetching" from its .part.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/file.h>
#include <signal.h>
#include <unistd.h>
#include <cmocka.h>
#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "engine/clock.h"
#include "storage/artstore.h"
#include "storage/fetch.h"
#include "storage/fileio.h"
#include "storage/store.h"

/* ---- the test server --------------------------------------------------------------- */

/* MODE_DRIP: 200 with the whole length promised, then one byte every 20 ms (it would take
 * hours) until the client leaves or the server stops. */
enum { MODE_RANGE, MODE_DROP_ONCE, MODE_NO_RANGE, MODE_404, MODE_503, MODE_DROP_ALWAYS, MODE_DRIP };

typedef struct {
    int lfd, port;
    pthread_t th;
    pthread_mutex_t mu;
    const unsigned char *body;
    size_t len;
    int mode;
    int requests;
    char last_range[128];   /* Range header of the last request ("" none) */
    int stop;
} srv;

static int send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static void serve_one(srv *s, int fd)
{
    char req[4096];
    size_t got = 0;
    while (got < sizeof req - 1) {
        ssize_t r = recv(fd, req + got, sizeof req - 1 - got, 0);
        if (r <= 0)
            return;
        got += (size_t)r;
        req[got] = 0;
        if (strstr(req, "\r\n\r\n"))
            break;
    }
    char range[128] = "";
    const char *h = strcasestr(req, "\r\nRange:");
    if (h) {
        h += 8;
        while (*h == ' ')
            h++;
        size_t n = strcspn(h, "\r\n");
        snprintf(range, sizeof range, "%.*s", (int)n, h);
    }
    pthread_mutex_lock(&s->mu);
    int mode = s->mode, nreq = ++s->requests;
    snprintf(s->last_range, sizeof s->last_range, "%s", range);
    if (mode == MODE_DROP_ONCE && nreq > 1)
        mode = MODE_RANGE;
    pthread_mutex_unlock(&s->mu);
    char hdr[512];
    if (mode == MODE_404 || mode == MODE_503) {
        int n = snprintf(hdr, sizeof hdr, "HTTP/1.1 %s\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot here\n",
                         mode == MODE_404 ? "404 Not Found" : "503 Service Unavailable");
        (void)send_all(fd, hdr, (size_t)n);
        return;
    }
    if (mode == MODE_DRIP) {
        int n = snprintf(hdr, sizeof hdr, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                         s->len);
        int stop = send_all(fd, hdr, (size_t)n) < 0;
        for (size_t i = 0; i < s->len && !stop; i++) {
            usleep(20000);
            pthread_mutex_lock(&s->mu);
            stop = s->stop;
            pthread_mutex_unlock(&s->mu);
            stop = stop || send_all(fd, s->body + i, 1) < 0;
        }
        return;
    }
    size_t from = 0;
    if (range[0] && mode == MODE_RANGE) {
        unsigned long long a = 0;
        if (sscanf(range, "bytes=%llu-", &a) == 1)
            from = (size_t)a;
    }
    if (from >= s->len && range[0] && mode == MODE_RANGE) {
        int n = snprintf(hdr, sizeof hdr, "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */%zu\r\n"
                                          "Content-Length: 0\r\nConnection: close\r\n\r\n", s->len);
        (void)send_all(fd, hdr, (size_t)n);
        return;
    }
    int n;
    if (from > 0)
        n = snprintf(hdr, sizeof hdr, "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %zu-%zu/%zu\r\n"
                                      "Content-Length: %zu\r\nConnection: close\r\n\r\n", from, s->len - 1, s->len,
                     s->len - from);
    else
        n = snprintf(hdr, sizeof hdr, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nAccept-Ranges: bytes\r\n"
                                      "Connection: close\r\n\r\n", s->len);
    if (send_all(fd, hdr, (size_t)n) < 0)
        return;
    size_t end = mode == MODE_DROP_ONCE ? s->len / 2 : s->len;   /* drop the connection halfway */
    if (mode == MODE_DROP_ALWAYS)
        end = from + (s->len - from) / 2;   /* halfway through what is left, every time */
    (void)send_all(fd, s->body + from, end - from);
}

static void *srv_main(void *arg)
{
    srv *s = arg;
    for (;;) {
        int fd = accept(s->lfd, NULL, NULL);
        pthread_mutex_lock(&s->mu);
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop) {
            if (fd >= 0)
                close(fd);
            return NULL;
        }
        if (fd < 0)
            continue;
        serve_one(s, fd);
        shutdown(fd, SHUT_RDWR);
        close(fd);
    }
}

static void srv_start(srv *s, const unsigned char *body, size_t len, int mode)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->body = body;
    s->len = len;
    s->mode = mode;
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s->lfd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s->lfd, 8), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&a, &al), 0);
    s->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&s->th, NULL, srv_main, s), 0);
}

static void srv_set_mode(srv *s, int mode)
{
    pthread_mutex_lock(&s->mu);
    s->mode = mode;
    s->requests = 0;
    s->last_range[0] = 0;
    pthread_mutex_unlock(&s->mu);
}

static void srv_stop(srv *s)
{
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_mutex_unlock(&s->mu);
    int fd = socket(AF_INET, SOCK_STREAM, 0);   /* wake accept() */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    (void)connect(fd, (struct sockaddr *)&a, sizeof a);
    close(fd);
    pthread_join(s->th, NULL);
    close(s->lfd);
    pthread_mutex_destroy(&s->mu);
}

/* ---- fixtures ---------------------------------------------------------------------- */

enum { BODY_LEN = 3 * 100000 + 17 };
static unsigned char body[BODY_LEN];
static char body_sha[65];
static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    for (size_t i = 0; i < BODY_LEN; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        body[i] = (unsigned char)x;
    }
    art_sha256_buf(body, BODY_LEN, body_sha);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ac_fetch_XXXXXX");
    if (!mkdtemp(tmpdir))
        return -1;
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    curl_global_cleanup();
    return system(cmd) == 0 ? 0 : -1;
}

static void path_of(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", tmpdir, name);
}

static int64_t file_size(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 ? (int64_t)sb.st_size : -1;
}

static void assert_file_is_body(const char *p)
{
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    unsigned char *buf = malloc(BODY_LEN + 1);
    assert_non_null(buf);
    size_t n = fread(buf, 1, BODY_LEN + 1, f);
    fclose(f);
    assert_int_equal(n, BODY_LEN);
    assert_memory_equal(buf, body, BODY_LEN);
    free(buf);
}

static void url_of(char *out, size_t n, const srv *s, const char *name)
{
    snprintf(out, n, "http://127.0.0.1:%d/files/%s", s->port, name);
}

static void write_part(const char *out, const unsigned char *p, size_t n)
{
    char part[600];
    snprintf(part, sizeof part, "%s.part", out);
    FILE *f = fopen(part, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* ---- fetch_url --------------------------------------------------------------------- */

static void test_full_download(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, body, BODY_LEN, MODE_RANGE);
    char url[256], out[512], part[600], err[1024] = "";
    url_of(url, sizeof url, &s, "m.bin");
    path_of(out, sizeof out, "full.bin");
    fetch_opts o = {.flags = FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE};
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_OK);
    assert_file_is_body(out);
    assert_string_equal(o.sha256, body_sha);
    assert_int_equal(o.bytes, BODY_LEN);
    assert_int_equal(o.resumed_from, 0);
    snprintf(part, sizeof part, "%s.part", out);
    assert_int_equal(file_size(part), -1);
    assert_string_equal(s.last_range, "");
    /* without a digest: downloaded and its digest reported */
    unlink(out);
    assert_int_equal(fetch_url(url, NULL, BODY_LEN, out, &o, err, sizeof err), FETCH_OK);
    assert_string_equal(o.sha256, body_sha);
    srv_stop(&s);
}

static void test_sha_mismatch(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, body, BODY_LEN, MODE_RANGE);
    char url[256], out[512], part[600], err[1024] = "", wrong[65];
    url_of(url, sizeof url, &s, "m.bin");
    path_of(out, sizeof out, "wrong.bin");
    memcpy(wrong, body_sha, 65);
    wrong[5] = wrong[5] == '0' ? '1' : '0';
    fetch_opts o = {.flags = FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE};
    assert_int_equal(fetch_url(url, wrong, BODY_LEN, out, &o, err, sizeof err), FETCH_FAILED);
    assert_non_null(strstr(err, "sha256 mismatch"));
    assert_non_null(strstr(err, wrong));
    assert_non_null(strstr(err, body_sha));
    assert_int_equal(file_size(out), -1);
    snprintf(part, sizeof part, "%s.part", out);
    assert_int_equal(file_size(part), -1);
    /* not hex at all */
    assert_int_equal(fetch_url(url, "xyz", BODY_LEN, out, &o, err, sizeof err), FETCH_FAILED);
    assert_non_null(strstr(err, "64 hex digits"));
    srv_stop(&s);
}

static void test_size_limit(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, body, BODY_LEN, MODE_RANGE);
    char url[256], out[512], part[600], err[1024] = "", want[64];
    url_of(url, sizeof url, &s, "m.bin");
    path_of(out, sizeof out, "big.bin");
    fetch_opts o = {.flags = FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE};
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN - 1, out, &o, err, sizeof err), FETCH_FAILED);
    /* refused by its Content-Length, before a byte was written */
    snprintf(want, sizeof want, "%d bytes is larger than the limit of %d bytes", BODY_LEN, BODY_LEN - 1);
    assert_non_null(strstr(err, want));
    assert_int_equal(file_size(out), -1);
    snprintf(part, sizeof part, "%s.part", out);
    assert_int_equal(file_size(part), -1);
    srv_stop(&s);
}

static void test_resume_after_drop(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, body, BODY_LEN, MODE_DROP_ONCE);
    char url[256], out[512], part[600], err[1024] = "", want[64];
    url_of(url, sizeof url, &s, "m.bin");
    path_of(out, sizeof out, "resumed.bin");
    snprintf(part, sizeof part, "%s.part", out);
    fetch_opts o = {.flags = FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE};
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_RETRY);
    assert_int_equal(file_size(out), -1);
    assert_int_equal(file_size(part), BODY_LEN / 2);   /* kept for the resume */
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_OK);
    snprintf(want, sizeof want, "bytes=%d-", BODY_LEN / 2);
    assert_string_equal(s.last_range, want);
    assert_int_equal(s.requests, 2);
    assert_int_equal(o.resumed_from, BODY_LEN / 2);
    assert_file_is_body(out);
    assert_int_equal(file_size(part), -1);
    srv_stop(&s);
}

static void test_server_ignores_range(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, body, BODY_LEN, MODE_NO_RANGE);
    char url[256], out[512], part[600], err[1024] = "", want[64];
    url_of(url, sizeof url, &s, "m.bin");
    path_of(out, sizeof out, "restart.bin");
    snprintf(part, sizeof part, "%s.part", out);
    write_part(out, body, BODY_LEN / 3);
    fetch_opts o = {.flags = FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE};
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_OK);
    snprintf(want, sizeof want, "bytes=%d-", BODY_LEN / 3);
    assert_string_equal(s.last_range, want);   /* asked for a range ... */
    assert_int_equal(s.requests, 1);           /* ... got 200 and restarted in the same request */
    assert_file_is_body(out);
    srv_stop(&s);
}

static void test_stale_part_and_complete_part(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, body, BODY_LEN, MODE_RANGE);
    char url[256], out[512], err[1024] = "";
    url_of(url, sizeof url, &s, "m.bin");
    /* a .part from other bytes: the resumed digest mismatches, one fresh retry fixes it */
    path_of(out, sizeof out, "stale.bin");
    unsigned char junk[1000];
    memset(junk, 0x5a, sizeof junk);
    write_part(out, junk, sizeof junk);
    fetch_opts o = {.flags = FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE};
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_OK);
    assert_int_equal(s.requests, 2);
    assert_file_is_body(out);
    /* a .part that is already complete (stopped before the rename): 416, then verified */
    srv_set_mode(&s, MODE_RANGE);
    path_of(out, sizeof out, "complete.bin");
    write_part(out, body, BODY_LEN);
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_OK);
    assert_int_equal(s.requests, 1);
    assert_file_is_body(out);
    srv_stop(&s);
}

static void test_http_errors(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, body, BODY_LEN, MODE_404);
    char url[256], out[512], part[600], err[1024] = "";
    url_of(url, sizeof url, &s, "m.bin");
    path_of(out, sizeof out, "err.bin");
    snprintf(part, sizeof part, "%s.part", out);
    fetch_opts o = {.flags = FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE};
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_FAILED);
    assert_non_null(strstr(err, "HTTP 404"));
    assert_int_equal(file_size(part), -1);
    srv_set_mode(&s, MODE_503);
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_RETRY);
    assert_non_null(strstr(err, "HTTP 503"));
    assert_int_equal(file_size(out), -1);
    srv_stop(&s);
    /* nobody listening: transient */
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_RETRY);
}

static int cancel_at_once(void *user, int64_t done, int64_t total)
{
    (void)done;
    (void)total;
    ++*(int *)user;
    return 1;
}

/* A server that drips (a few bytes a second, never silent) is a stalled download: less
 * than 1 KiB/s over the stall time is a transient failure (retried, then failed), where one
 * byte per stall time kept it alive for ever (and its model fetching). Here 50 B/s against a
 * 1 s stall time; the progress callback stops the old behaviour after 5 s. */
static int stop_after_5s(void *user, int64_t done, int64_t total)
{
    (void)done;
    (void)total;
    return eng_wall_s() - *(double *)user > 5;
}

static void test_drip_is_a_stall(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, body, BODY_LEN, MODE_DRIP);
    char url[256], out[512], err[1024] = "";
    url_of(url, sizeof url, &s, "m.bin");
    path_of(out, sizeof out, "drip.bin");
    double t0 = eng_wall_s();
    fetch_opts o = {.flags = FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE, .stall_timeout_s = 1, .progress = stop_after_5s,
                    .user = &t0};
    int rc = fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err);
    if (rc != FETCH_RETRY)
        fail_msg("a download at 50 B/s ended %d after %.1f s: %s", rc, eng_wall_s() - t0, err);
    assert_true(eng_wall_s() - t0 < 4);
    srv_stop(&s);
}

static void test_cancel_and_schemes(void **state)
{
    (void)state;
    srv s;
    srv_start(&s, body, BODY_LEN, MODE_RANGE);
    char url[256], out[512], err[1024] = "";
    url_of(url, sizeof url, &s, "m.bin");
    path_of(out, sizeof out, "cancel.bin");
    int calls = 0;
    fetch_opts o = {.flags = FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE, .progress = cancel_at_once, .user = &calls};
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_CANCELLED);
    assert_true(calls >= 1);
    assert_int_equal(file_size(out), -1);
    /* http refused unless allowed; file:// only with its own flag; others never */
    fetch_opts strict = {0};
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &strict, err, sizeof err), FETCH_FAILED);
    assert_non_null(strstr(err, "http:// is not allowed"));
    char furl[600];
    path_of(out, sizeof out, "src.bin");
    FILE *f = fopen(out, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(body, 1, BODY_LEN, f), BODY_LEN);
    assert_int_equal(fclose(f), 0);
    snprintf(furl, sizeof furl, "file://%s", out);
    path_of(out, sizeof out, "copy.bin");
    assert_int_equal(fetch_url(furl, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_FAILED);
    assert_non_null(strstr(err, "only https:// and http:// URLs"));
    fetch_opts local = {.flags = FETCH_ALLOW_FILE};
    assert_int_equal(fetch_url(furl, body_sha, BODY_LEN, out, &local, err, sizeof err), FETCH_OK);
    assert_file_is_body(out);
    assert_int_equal(local.resumed_from, 0);
    unlink(out);
    write_part(out, body, 1000);   /* file:// resumes too */
    assert_int_equal(fetch_url(furl, body_sha, BODY_LEN, out, &local, err, sizeof err), FETCH_OK);
    assert_int_equal(local.resumed_from, 1000);
    assert_file_is_body(out);
    assert_int_equal(fetch_url("ftp://example.com/x.bin", NULL, 10, out, &local, err, sizeof err), FETCH_FAILED);
    srv_stop(&s);
}

/* Write a self-signed certificate (PEM) to cert_path and its key alone to key_path. */
static void write_self_signed(const char *cert_path, const char *key_path)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    assert_non_null(k);
    X509 *x = X509_new();
    assert_non_null(x);
    assert_int_equal(ASN1_INTEGER_set(X509_get_serialNumber(x), 1), 1);
    assert_non_null(X509_gmtime_adj(X509_getm_notBefore(x), 0));
    assert_non_null(X509_gmtime_adj(X509_getm_notAfter(x), 3600));
    assert_int_equal(X509_set_pubkey(x, k), 1);
    X509_NAME *n = X509_get_subject_name(x);
    assert_int_equal(X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"test CA", -1, -1, 0),
                     1);
    assert_int_equal(X509_set_issuer_name(x, n), 1);
    assert_true(X509_sign(x, k, EVP_sha256()) > 0);
    FILE *f = fopen(cert_path, "w");
    assert_non_null(f);
    assert_int_equal(PEM_write_X509(f, x), 1);
    assert_int_equal(fclose(f), 0);
    f = fopen(key_path, "w");
    assert_non_null(f);
    assert_int_equal(PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL), 1);
    assert_int_equal(fclose(f), 0);
    X509_free(x);
    EVP_PKEY_free(k);
}

static void test_ca_files(void **state)
{
    (void)state;
    char cert[512], key[512], junk[512], err[1024] = "";
    path_of(cert, sizeof cert, "ca.pem");
    path_of(key, sizeof key, "ca.key");
    path_of(junk, sizeof junk, "junk.pem");
    write_self_signed(cert, key);
    FILE *f = fopen(junk, "w");
    assert_non_null(f);
    assert_true(fputs("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n", f) >= 0);
    assert_int_equal(fclose(f), 0);

    assert_int_equal(fetch_check_ca_file(cert, err, sizeof err), 0);
    assert_int_equal(fetch_check_ca_file(key, err, sizeof err), -1);
    assert_non_null(strstr(err, key));
    assert_non_null(strstr(err, "holds no PEM certificate"));
    assert_int_equal(fetch_check_ca_file(junk, err, sizeof err), -1);
    assert_non_null(strstr(err, "holds no PEM certificate"));
    assert_int_equal(fetch_check_ca_file("/nonexistent/ca.pem", err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/ca.pem: No such file or directory"));
    assert_int_equal(fetch_check_ca_file(tmpdir, err, sizeof err), -1);
    assert_non_null(strstr(err, "not a regular file"));

    /* a CA bundle libcurl cannot load: permanent, reported as a certificate that cannot be
     * verified, naming the file; nothing left behind */
    srv s;
    srv_start(&s, body, BODY_LEN, MODE_RANGE);
    char url[256], out[512], part[600];
    snprintf(url, sizeof url, "https://127.0.0.1:%d/files/m.bin", s.port);
    path_of(out, sizeof out, "tls.bin");
    snprintf(part, sizeof part, "%s.part", out);
    const char *bad[] = {junk, "/nonexistent/ca.pem"};
    for (int i = 0; i < 2; i++) {
        fetch_opts o = {.ca_file = bad[i], .flags = FETCH_ALLOW_PRIVATE};
        assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_FAILED);
        assert_int_equal(o.tls_unverified, 1);
        assert_non_null(strstr(err, "certificate could not be verified"));
        assert_non_null(strstr(err, bad[i]));
        assert_int_equal(file_size(out), -1);
        assert_int_equal(file_size(part), -1);
    }
    /* the flag is an output: reset by a download that fails for another reason */
    fetch_opts o = {.ca_file = junk, .flags = FETCH_ALLOW_PRIVATE};
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_FAILED);
    assert_int_equal(o.tls_unverified, 1);
    assert_int_equal(fetch_url("ftp://example.com/x.bin", NULL, 10, out, &o, err, sizeof err), FETCH_FAILED);
    assert_int_equal(o.tls_unverified, 0);
    srv_stop(&s);

    /* the model fetcher refuses a CA file it cannot use, before it starts */
    char db[600];
    path_of(db, sizeof db, "ca.db");
    store *st = store_open(db, err, sizeof err);
    assert_non_null(st);
    assert_null(fetch_service_start(st, NULL, 0, 1 << 20, "/nonexistent/ca.pem", err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/ca.pem"));
    unsigned flags;
    int64_t cap;
    assert_int_equal(fetch_service_policy(&flags, &cap), -1);
    fetch_service *fs = fetch_service_start(st, NULL, 0, 1 << 20, cert, err, sizeof err);
    assert_non_null(fs);
    fetch_service_stop(fs);
    store_close(st);
}

/* Without FETCH_ALLOW_PRIVATE a download never connects to a non-public address: a URL to
 * this host's loopback is refused before any request (it was fetched, and a server's model
 * registration could probe its own network), naming the address; which addresses are not
 * public. */
static void test_private_addresses(void **state)
{
    (void)state;
    static const struct { const char *ip; int non_public; } cases[] = {
        {"127.0.0.1", 1}, {"10.1.2.3", 1}, {"169.254.169.254", 1}, {"172.20.0.1", 1}, {"192.168.1.1", 1},
        {"100.64.0.1", 1}, {"0.0.0.0", 1}, {"224.0.0.1", 1}, {"255.255.255.255", 1}, {"192.0.0.8", 1},
        {"198.18.0.1", 1}, {"::1", 1}, {"::", 1}, {"fe80::1", 1}, {"fd00::1", 1}, {"ff02::1", 1},
        {"::ffff:127.0.0.1", 1}, {"64:ff9b::a9fe:a9fe", 1}, {"fec0::1", 1}, {"64:ff9b:1::1", 1},
        {"8.8.8.8", 0}, {"1.1.1.1", 0}, {"172.32.0.1", 0}, {"100.128.0.1", 0}, {"2606:4700::1111", 0},
        {"::ffff:8.8.8.8", 0},
        /* IPv4 inside IPv6: IPv4-compatible (::a.b.c.d), 6to4 (2002:V4::/48); Teredo and the
         * documentation prefix reach nothing public of their own */
        {"::7f00:1", 1}, {"::a9fe:a9fe", 1}, {"::808:808", 0}, {"2002:7f00:1::1", 1}, {"2002:a9fe:a9fe::", 1},
        {"2002:808:808::1", 0}, {"2001:0:4136:e378:8000:63bf:3fff:fdd2", 1}, {"2001:db8::1", 1},
        {"2001:4860:4860::8888", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof ss);
        int v6 = strchr(cases[i].ip, ':') != NULL;
        ss.ss_family = v6 ? AF_INET6 : AF_INET;
        void *dst = v6 ? (void *)&((struct sockaddr_in6 *)&ss)->sin6_addr : (void *)&((struct sockaddr_in *)&ss)->sin_addr;
        assert_int_equal(inet_pton(ss.ss_family, cases[i].ip, dst), 1);
        if (fetch_addr_non_public((struct sockaddr *)&ss) != cases[i].non_public)
            fail_msg("%s: non_public %d, want %d", cases[i].ip, !cases[i].non_public, cases[i].non_public);
    }
    srv s;
    srv_start(&s, body, BODY_LEN, MODE_RANGE);
    char url[256], out[512], part[600], err[1024] = "";
    url_of(url, sizeof url, &s, "m.bin");
    path_of(out, sizeof out, "private.bin");
    snprintf(part, sizeof part, "%s.part", out);
    fetch_opts o = {.flags = FETCH_ALLOW_HTTP};
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_FAILED);
    if (!strstr(err, "refused to connect to 127.0.0.1, which is not a public address"))
        fail_msg("error: %s", err);
    assert_int_equal(file_size(out), -1);
    assert_int_equal(file_size(part), -1);
    o.flags |= FETCH_ALLOW_PRIVATE;
    assert_int_equal(fetch_url(url, body_sha, BODY_LEN, out, &o, err, sizeof err), FETCH_OK);
    srv_stop(&s);
}

/* The early judgement of a URL's host as written: literals and localhost only; names (and
 * forms inet_pton does not read, like 127.1) are left to the guard at connection time. */
static void test_url_hosts(void **state)
{
    (void)state;
    static const struct { const char *url; int non_public; } cases[] = {
        {"http://127.0.0.1:8080/hook", 1}, {"https://10.0.0.5/x", 1}, {"http://169.254.169.254", 1},
        {"http://[::1]:9/h", 1}, {"http://[fe80::1%25eth0]/h", 1}, {"http://[::ffff:192.168.0.1]/", 1},
        {"http://localhost/h", 1}, {"http://LOCALHOST.:80/h", 1}, {"http://api.localhost/h", 1},
        {"http://user:pw@127.0.0.1/h", 1}, {"https://a@b@10.1.1.1/x", 1},
        {"https://example.com/hook", 0}, {"https://8.8.8.8/h", 0}, {"http://[2606:4700::1111]:443/", 0},
        {"http://127.1/h", 0}, {"http://notlocalhost/h", 0}, {"https://example.com/?u=http://127.0.0.1/", 0},
        {"https://example.com#@127.0.0.1", 0}, {"no-scheme", 0}, {"http://[::1/h", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (fetch_url_host_non_public(cases[i].url) != cases[i].non_public)
            fail_msg("%s: non_public %d, want %d", cases[i].url, !cases[i].non_public, cases[i].non_public);
}

static void test_model_file_names(void **state)
{
    (void)state;
    char f[256], err[256];
    assert_string_equal(fetch_model_file_name("https://h.example/a/b/model.Q4_1.gguf?x=1#y", f, sizeof f, err,
                                              sizeof err), "gguf");
    assert_string_equal(f, "model.Q4_1.gguf");
    assert_string_equal(fetch_model_file_name("http://h:8/stories260K.bin", f, sizeof f, err, sizeof err),
                        "llama2c");
    assert_null(fetch_model_file_name("https://h.example/", f, sizeof f, err, sizeof err));
    assert_null(fetch_model_file_name("https://h.example", f, sizeof f, err, sizeof err));
    assert_null(fetch_model_file_name("https://h.example/x.safetensors", f, sizeof f, err, sizeof err));
    assert_null(fetch_model_file_name("https://h.example/a%2F..%2Fb.bin", f, sizeof f, err, sizeof err));
    assert_null(fetch_model_file_name("https://h.example/.hidden.bin", f, sizeof f, err, sizeof err));
    char p[128];
    assert_int_equal(fetch_model_path("/d", "ab", "m.gguf", p, sizeof p), 0);
    assert_string_equal(p, "/d/models/ab/m.gguf");
    assert_int_equal(fetch_model_path("/d", "ab", "m.gguf", p, 8), -1);
}

/* ---- the model fetcher: a model left "fetching" resumes from its .part --------------- */

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    assert_true(len > 0);
    rewind(f);
    unsigned char *b = malloc((size_t)len);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static int wait_status(store *st, const char *id, const char *want, store_model *m)
{
    for (int i = 0; i < 600; i++) {   /* 30 s */
        assert_int_equal(store_model_get(st, id, m), 0);
        if (!strcmp(m->status, want))
            return 0;
        usleep(50000);
    }
    return -1;
}

/* Register a new llama2c model by URL (the test server on port, /m/file) whose sha256 is
 * 64 times `digit` (no download matches it), into m. */
static void register_new(store *st, store_model *m, int port, const char *file, char digit)
{
    memset(m, 0, sizeof *m);
    snprintf(m->url, sizeof m->url, "http://127.0.0.1:%d/m/%s", port, file);
    memset(m->sha256, digit, 64);
    snprintf(m->format, sizeof m->format, "llama2c");
    m->size_bytes = -1;
    assert_int_equal(fetch_model_path(tmpdir, m->sha256, file, m->path, sizeof m->path), 0);
    int restarted = -1;
    assert_int_equal(store_model_add_fetch(st, m, &restarted), 0);
    assert_int_equal(restarted, 0);
}

/* Register stories260K (sha256 sha) by URL from the test server on port, cached under
 * data_dir, into m (zeroed first): a new model, "fetching". */
static void register_stories(store *st, store_model *m, const char *data_dir, int port, const char *sha)
{
    memset(m, 0, sizeof *m);
    snprintf(m->url, sizeof m->url, "http://127.0.0.1:%d/m/stories260K.bin", port);
    snprintf(m->sha256, sizeof m->sha256, "%s", sha);
    snprintf(m->format, sizeof m->format, "llama2c");
    m->size_bytes = -1;
    assert_int_equal(fetch_model_path(data_dir, sha, "stories260K.bin", m->path, sizeof m->path), 0);
    int restarted = -1;
    assert_int_equal(store_model_add_fetch(st, m, &restarted), 0);
    assert_int_equal(restarted, 0);
    assert_string_equal(m->status, "fetching");
}

/* stories260K's bytes (*len of them; free) and their sha256 into sha (may be NULL) */
static unsigned char *stories_bytes(size_t *len, char sha[65])
{
    const char *shared = getenv("AC_SHARED");
    char src[600];
    snprintf(src, sizeof src, "%s/data/models/stories260K/stories260K.bin", shared ? shared : "../shared");
    unsigned char *model = slurp(src, len);
    if (sha)
        art_sha256_buf(model, *len, sha);
    return model;
}

/* A data folder of its own under the test's tmpdir (its path into data) and a store in it. */
static store *fresh_store(const char *name, char *data, size_t n)
{
    char db[700], err[1024];
    path_of(data, n, name);
    assert_int_equal(mkdir(data, 0755), 0);
    snprintf(db, sizeof db, "%s/t.db", data);
    store *st = store_open(db, err, sizeof err);
    assert_non_null(st);
    return st;
}

/* Open (creating) the .part of m's download, its folder made; the descriptor. */
static int open_part(const store_model *m, int flags)
{
    char part[sizeof m->path + 8], folder[sizeof m->path];
    snprintf(part, sizeof part, "%s.part", m->path);
    snprintf(folder, sizeof folder, "%s", m->path);
    *strrchr(folder, '/') = 0;
    assert_int_equal(fio_mkdirs(folder), 0);
    int fd = open(part, flags | O_CREAT, 0644);
    assert_true(fd >= 0);
    return fd;
}

static void test_fetcher_resumes(void **state)
{
    (void)state;
    char db[600], err[1024] = "", sha[65];
    size_t len;
    unsigned char *model = stories_bytes(&len, sha);
    srv s;
    srv_start(&s, model, len, MODE_RANGE);
    path_of(db, sizeof db, "fetcher.db");
    store *st = store_open(db, err, sizeof err);
    assert_non_null(st);
    assert_int_equal(store_schema_version(st), 5);

    /* as a server would leave it: registered, "fetching", a third downloaded */
    store_model *m = calloc(1, sizeof *m);
    assert_non_null(m);
    register_stories(st, m, tmpdir, s.port, sha);
    int restarted = -1;
    char dir[700];
    snprintf(dir, sizeof dir, "%s/models", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(dir, sizeof dir, "%s/models/%s", tmpdir, sha);
    assert_int_equal(mkdir(dir, 0755), 0);
    write_part(m->path, model, len / 3);

    /* the same sha256 again: the same model, no second row */
    store_model *again = calloc(1, sizeof *again);
    assert_non_null(again);
    *again = *m;
    again->id[0] = 0;
    assert_int_equal(store_model_add_fetch(st, again, &restarted), 1);
    assert_string_equal(again->id, m->id);

    unsigned flags;
    int64_t cap;
    assert_int_equal(fetch_service_policy(&flags, &cap), -1);
    fetch_service *fs = fetch_service_start(st, NULL, FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE, 1 << 30, NULL, err, sizeof err);
    assert_non_null(fs);
    assert_int_equal(fetch_service_policy(&flags, &cap), 0);
    assert_int_equal(flags, FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE);
    assert_int_equal(cap, 1 << 30);
    fetch_service_kick();
    store_model *got = calloc(1, sizeof *got);
    assert_non_null(got);
    assert_int_equal(wait_status(st, m->id, "ready", got), 0);
    char want[64];
    snprintf(want, sizeof want, "bytes=%zu-", len / 3);
    assert_string_equal(s.last_range, want);
    assert_int_equal(s.requests, 1);
    assert_int_equal(got->bytes_done, (int64_t)len);
    assert_int_equal(got->bytes_total, (int64_t)len);
    char hex[65];
    int64_t size;
    assert_int_equal(art_sha256_file(got->path, hex, &size, err, sizeof err), 0);
    assert_string_equal(hex, sha);

    /* a digest no download can match: failed with the reason, nothing left behind */
    register_new(st, again, s.port, "other.bin", 'e');
    fetch_service_kick();
    assert_int_equal(wait_status(st, again->id, "failed", got), 0);
    assert_non_null(strstr(got->error, "sha256 mismatch"));
    assert_int_equal(file_size(again->path), -1);
    /* registering it again restarts the failed one */
    assert_int_equal(store_model_add_fetch(st, again, &restarted), 1);
    assert_int_equal(restarted, 1);
    assert_string_equal(again->status, "fetching");
    assert_int_equal(wait_status(st, again->id, "failed", got), 0);

    /* a server that drops every connection halfway: failed once its attempts are spent, and
     * the half it sent removed (a failed model's .part is never resumed; registering it again
     * starts over), so hostile URLs cannot fill the disk with parts */
    srv drop;
    srv_start(&drop, model, len, MODE_DROP_ALWAYS);
    register_new(st, again, drop.port, "dropped.bin", 'd');
    /* and its backoff (2, 4 and 8 s between the attempts) holds however often the fetcher is
     * kicked (every registration kicks it): a failing URL is not hammered */
    int failed = 0;
    double t0 = eng_wall_s();
    for (int i = 0; i < 600 && !failed; i++) {
        fetch_service_kick();
        assert_int_equal(store_model_get(st, again->id, got), 0);
        failed = !strcmp(got->status, "failed");
        usleep(50000);
    }
    assert_true(failed);
    if (eng_wall_s() - t0 < 14.0)
        fail_msg("4 attempts in %.1f s: the kicks cut the 14 s of backoff short", eng_wall_s() - t0);
    assert_int_equal(drop.requests, 4);
    assert_null(strstr(got->error, "sha256"));
    char part[sizeof again->path + 8];
    snprintf(part, sizeof part, "%s.part", again->path);
    assert_int_equal(file_size(part), -1);
    /* registered again under another file name (the first named the wrong format): the
     * new name and its format are what is fetched, not the failed registration's */
    snprintf(again->url, sizeof again->url, "http://127.0.0.1:%d/m/dropped.gguf", drop.port);
    snprintf(again->format, sizeof again->format, "gguf");
    assert_int_equal(fetch_model_path(tmpdir, again->sha256, "dropped.gguf", again->path, sizeof again->path), 0);
    char want_path[sizeof again->path];
    snprintf(want_path, sizeof want_path, "%s", again->path);
    assert_int_equal(store_model_add_fetch(st, again, &restarted), 1);
    assert_int_equal(restarted, 1);
    assert_string_equal(again->format, "gguf");
    assert_string_equal(again->path, want_path);
    assert_int_equal(store_model_get(st, again->id, got), 0);
    assert_string_equal(got->path, want_path);
    srv_stop(&drop);

    fetch_service_stop(fs);
    assert_int_equal(fetch_service_policy(&flags, &cap), -1);
    store_close(st);
    srv_stop(&s);
    free(m);
    free(again);
    free(got);
    free(model);
}

/* Turns: a URL that sends a byte now and then never stalls long enough to time out, and
 * once held the one fetcher for good, so every model registered after it waited. A
 * download now yields after its turn (here 1 s) when other models wait, keeping its .part,
 * and the fetcher takes the models in turn: the model behind the drip becomes ready while
 * the drip is still fetching, and the drip is taken up again after it. */
static void test_fetcher_turns(void **state)
{
    (void)state;
    char data[600], err[1024] = "", sha[65];
    size_t len;
    unsigned char *model = stories_bytes(&len, sha);
    srv drip, good;
    srv_start(&drip, model, len, MODE_DRIP);
    srv_start(&good, model, len, MODE_RANGE);
    store *st = fresh_store("turns", data, sizeof data);

    store_model *slow = calloc(1, sizeof *slow), *m = calloc(1, sizeof *m), *got = calloc(1, sizeof *got);
    assert_non_null(slow);
    assert_non_null(m);
    assert_non_null(got);
    register_new(st, slow, drip.port, "drip.bin", 'f');
    register_stories(st, m, data, good.port, sha);

    fetch_service *fs = fetch_service_start(st, NULL, FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE, 1 << 30, NULL, err, sizeof err);
    assert_non_null(fs);
    fetch_service_set_turn(fs, 1.0);
    fetch_service_kick();
    assert_int_equal(wait_status(st, m->id, "ready", got), 0);
    assert_int_equal(good.requests, 1);
    assert_int_equal(store_model_get(st, slow->id, got), 0);
    assert_string_equal(got->status, "fetching");
    int again = 0;
    for (int i = 0; i < 200 && !again; i++) {   /* 10 s */
        pthread_mutex_lock(&drip.mu);
        again = drip.requests >= 2;
        pthread_mutex_unlock(&drip.mu);
        usleep(50000);
    }
    assert_true(again);
    fetch_service_stop(fs);
    store_close(st);
    srv_stop(&drip);
    srv_stop(&good);
    free(slow);
    free(m);
    free(got);
    free(model);
}

/* A turn counts from the transfer, not from the re-hash of what an earlier turn left in
 * the .part: a part that takes longer to hash than a turn, beside another download that
 * waits, was cancelled while hashing, every turn, and never reached its server again. Here
 * a sparse 256 MiB part with turns of 50 ms and two downloads that never finish. */
static void test_turn_counts_from_the_transfer(void **state)
{
    (void)state;
    char data[600], err[1024] = "";
    size_t len;
    unsigned char *model = stories_bytes(&len, NULL);
    srv big, other;
    srv_start(&big, model, len, MODE_DRIP);
    srv_start(&other, model, len, MODE_DRIP);
    store *st = fresh_store("turnclock", data, sizeof data);
    store_model *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    assert_non_null(a);
    assert_non_null(b);
    register_new(st, a, big.port, "big.bin", 'b');
    register_new(st, b, other.port, "other.bin", 'c');
    int fd = open_part(a, O_WRONLY | O_TRUNC);
    assert_int_equal(ftruncate(fd, 256LL << 20), 0);
    assert_int_equal(close(fd), 0);

    fetch_service *fs = fetch_service_start(st, NULL, FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE, 1 << 30, NULL, err,
                                            sizeof err);
    assert_non_null(fs);
    fetch_service_set_turn(fs, 0.05);
    fetch_service_kick();
    int reached = 0, others = 0;
    for (int i = 0; i < 300 && !reached; i++) {   /* 15 s */
        pthread_mutex_lock(&big.mu);
        reached = big.requests;
        pthread_mutex_unlock(&big.mu);
        pthread_mutex_lock(&other.mu);
        others = other.requests;
        pthread_mutex_unlock(&other.mu);
        usleep(50000);
    }
    fetch_service_stop(fs);
    if (!reached)
        fail_msg("the download with a large part never reached its server (the other's turns: %d)", others);
    store_close(st);
    srv_stop(&big);
    srv_stop(&other);
    free(a);
    free(b);
    free(model);
}

/* Another process downloading the same model (two servers on one data directory) holds
 * the .part's lock: this fetcher leaves the model fetching and its .part alone, instead of
 * counting the lock as failed attempts, failing the model and removing the .part the other
 * is writing; once the lock is free, it downloads the model itself. */
static void test_part_locked_by_another(void **state)
{
    (void)state;
    char data[600], err[1024] = "", sha[65];
    size_t len;
    unsigned char *model = stories_bytes(&len, sha);
    srv s;
    srv_start(&s, model, len, MODE_RANGE);
    store *st = fresh_store("locked", data, sizeof data);
    store_model *m = calloc(1, sizeof *m), *got = calloc(1, sizeof *got);
    assert_non_null(m);
    assert_non_null(got);
    register_stories(st, m, data, s.port, sha);
    char part[sizeof m->path + 8];
    snprintf(part, sizeof part, "%s.part", m->path);
    int fd = open_part(m, O_RDWR);
    assert_int_equal(write(fd, model, 1000), 1000);   /* the other's first bytes */
    pid_t other = fork();
    assert_true(other >= 0);
    if (other == 0) {   /* the other process: holds the lock until killed (or this test ends) */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || flock(fd, LOCK_EX) != 0)
            _exit(1);
        pause();
        _exit(0);
    }
    usleep(200000);
    fetch_service *fs = fetch_service_start(st, NULL, FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE, 1 << 30, NULL, err,
                                            sizeof err);
    assert_non_null(fs);
    for (int i = 0; i < 40; i++) {   /* 2 s of kicks: every backoff cut short */
        fetch_service_kick();
        usleep(50000);
    }
    int got_rc = store_model_get(st, m->id, got);
    int64_t kept = file_size(part);
    kill(other, SIGKILL);
    waitpid(other, NULL, 0);
    assert_int_equal(got_rc, 0);
    if (strcmp(got->status, "fetching"))
        fail_msg("the model is %s while another process downloads it: %s", got->status, got->error);
    assert_int_equal(kept, 1000);   /* the other's bytes, untouched */
    assert_int_equal(close(fd), 0);
    fetch_service_kick();
    assert_int_equal(wait_status(st, m->id, "ready", got), 0);
    fetch_service_stop(fs);
    store_close(st);
    srv_stop(&s);
    free(m);
    free(got);
    free(model);
}

/* What a model's URL shows: every query value hidden (a presigned URL's signature), the
 * fragment dropped, the rest as written; cut to the buffer. */
static void test_url_shown(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"https://h.example/p/m.gguf", "https://h.example/p/m.gguf"},
        {"https://h/m.gguf?X-Amz-Signature=abc123&X-Amz-Expires=60#frag",
         "https://h/m.gguf?X-Amz-Signature=REDACTED&X-Amz-Expires=REDACTED"},
        {"https://h/m.gguf?s3cr3t", "https://h/m.gguf?REDACTED"},
        {"https://h/m.gguf?a=&&b", "https://h/m.gguf?a=REDACTED&&REDACTED"},
        {"https://h/m.gguf?", "https://h/m.gguf?"},
        {"https://h/m.gguf#x?y=1", "https://h/m.gguf"},
        {"", ""},
    };
    char out[128];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fetch_url_shown(cases[i][0], out, sizeof out);
        assert_string_equal(out, cases[i][1]);
    }
    fetch_url_shown("https://h/m.gguf?token=abcdef", out, 20);
    assert_string_equal(out, "https://h/m.gguf?to");
    assert_null(strstr(out, "abc"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_download),
        cmocka_unit_test(test_sha_mismatch),
        cmocka_unit_test(test_size_limit),
        cmocka_unit_test(test_resume_after_drop),
        cmocka_unit_test(test_server_ignores_range),
        cmocka_unit_test(test_stale_part_and_complete_part),
        cmocka_unit_test(test_http_errors),
        cmocka_unit_test(test_cancel_and_schemes),
        cmocka_unit_test(test_drip_is_a_stall),
        cmocka_unit_test(test_ca_files),
        cmocka_unit_test(test_private_addresses),
        cmocka_unit_test(test_url_hosts),
        cmocka_unit_test(test_model_file_names),
        cmocka_unit_test(test_fetcher_resumes),
        cmocka_unit_test(test_fetcher_turns),
        cmocka_unit_test(test_turn_counts_from_the_transfer),
        cmocka_unit_test(test_url_shown),
        cmocka_unit_test(test_part_locked_by_another),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
