/* storage/s3.c — the S3-compatible object client (see s3.h): path-style URLs, SigV4 signed
 * headers over libcurl, multipart uploads with per-part hashes. */
#include "storage/s3.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "storage/artstore.h"
#include "storage/fileio.h"
#include "storage/sigv4.h"
#include "storage/strbuf.h"

#define MIB (1024LL * 1024)
#define MAX_PARTS 10000
#define XML_MAX (256 * 1024)

typedef struct {
    char *access, *secret, *token;    /* owned, wiped when dropped */
} s3_creds;

struct s3_client {
    char scheme[8], authority[256];   /* "https", "host:port" */
    char bucket[64], prefix[512];
    char region[64];
    pthread_mutex_t mu;               /* guards creds and cred_seen (threads share a client) */
    s3_creds creds;
    char *cred_path;                  /* the credentials file, read again when it changes; NULL: env */
    struct stat cred_seen;            /* the file as it was when last read */
    int64_t part_bytes;
};

static char *dup_env(const char *a, const char *b)
{
    const char *v = getenv(a);
    if ((!v || !*v) && b)
        v = getenv(b);
    return v && *v ? strdup(v) : NULL;
}

static void wipe_free(char *s)
{
    if (s) {
        memset(s, 0, strlen(s));
        free(s);
    }
}

static void creds_drop(s3_creds *k)
{
    wipe_free(k->access);
    wipe_free(k->secret);
    wipe_free(k->token);
    *k = (s3_creds){0};
}

void s3_close(s3_client *c)
{
    if (!c)
        return;
    creds_drop(&c->creds);
    free(c->cred_path);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* "key = value" lines of a credentials file into *k (empty before): those before any
 * [section] and those of the profile AWS_PROFILE names (else [default]; "[profile NAME]" as
 * ~/.aws/config writes it), never another profile's. 0, or -1 with err (*k then empty). */
static int read_credentials(s3_creds *k, const char *path, char *err, size_t errlen)
{
    size_t n;
    char *txt = fio_read_input(path, 1 << 16, &n, err, errlen);
    if (!txt)
        return -1;
    const char *want = getenv("AWS_PROFILE");
    if (!want || !*want)
        want = "default";
    int ours = 1;   /* before any section */
    for (char *line = txt, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        while (*line == ' ' || *line == '\t')
            line++;
        if (line[0] == '[') {
            char *close = strchr(line, ']'), *name = line + 1;
            if (close)
                *close = 0;
            if (!strncmp(name, "profile ", 8))
                name += 8;
            while (*name == ' ')
                name++;
            ours = close && !strcmp(name, want);
            continue;
        }
        char *eq = strchr(line, '=');
        if (!eq || line[0] == '#' || line[0] == ';' || !ours)
            continue;
        char *key = line, *v = eq + 1, *e = eq;
        *eq = 0;
        while (*key == ' ' || *key == '\t')
            key++;
        while (e > key && (e[-1] == ' ' || e[-1] == '\t'))
            *--e = 0;
        while (*v == ' ' || *v == '\t')
            v++;
        for (size_t l = strlen(v); l && (v[l - 1] == ' ' || v[l - 1] == '\r' || v[l - 1] == '\t'); l--)
            v[l - 1] = 0;
        char **dst = !strcmp(key, "access_key") || !strcmp(key, "aws_access_key_id")       ? &k->access
                     : !strcmp(key, "secret_key") || !strcmp(key, "aws_secret_access_key") ? &k->secret
                     : !strcmp(key, "session_token") || !strcmp(key, "aws_session_token")  ? &k->token
                                                                                           : NULL;
        if (dst && *v) {
            wipe_free(*dst);
            *dst = strdup(v);
        }
    }
    memset(txt, 0, n);
    free(txt);
    if (!k->access || !k->secret) {
        creds_drop(k);
        snprintf(err, errlen, "%s: no access_key and secret_key lines", path);
        return -1;
    }
    return 0;
}

/* The credentials file read again when it is not the file last read (another inode, size
 * or modification time): temporary credentials that an agent rewrites before they expire
 * are used from then on. A file that cannot be read now keeps the last ones (the request
 * then fails on its own terms); the next request looks again. Called with c->mu held. */
static void creds_refresh(s3_client *c)
{
    struct stat st;
    if (!c->cred_path || stat(c->cred_path, &st) < 0)
        return;
    const struct stat *o = &c->cred_seen;
    if (st.st_ino == o->st_ino && st.st_dev == o->st_dev && st.st_size == o->st_size &&
        st.st_mtim.tv_sec == o->st_mtim.tv_sec && st.st_mtim.tv_nsec == o->st_mtim.tv_nsec)
        return;
    s3_creds k = {0};
    char e[512];
    if (read_credentials(&k, c->cred_path, e, sizeof e) < 0)
        return;
    creds_drop(&c->creds);
    c->creds = k;
    c->cred_seen = st;
}

static int parse_endpoint(s3_client *c, const char *ep, int allow_http, char *err, size_t errlen)
{
    const char *rest = NULL;
    if (!strncmp(ep, "https://", 8)) {
        snprintf(c->scheme, sizeof c->scheme, "https");
        rest = ep + 8;
    } else if (!strncmp(ep, "http://", 7) && allow_http) {
        snprintf(c->scheme, sizeof c->scheme, "http");
        rest = ep + 7;
    }
    size_t n = rest ? strcspn(rest, "/?#") : 0;
    if (!rest || n == 0 || n >= sizeof c->authority || strpbrk(rest, "@ \t\r\n") ||
        (rest[n] && strcmp(rest + n, "/"))) {
        /* named without what an '@' puts before the host (a user and password, never shown) */
        const char *at = rest ? strchr(rest, '@') : NULL;
        snprintf(err, errlen, "S3 endpoint \"%.*s%s\" is not %s://HOST[:PORT]%s", at ? (int)(rest - ep) : (int)strlen(ep),
                 ep, at ? at + 1 : "", allow_http ? "http(s)" : "https", at ? " (credentials go in the credentials "
                 "file or the environment, not the URL)" : "");
        return -1;
    }
    memcpy(c->authority, rest, n);
    c->authority[n] = 0;
    return 0;
}

s3_client *s3_open(const char *url, const s3_options *o, char *err, size_t errlen)
{
    s3_options none = {0};
    if (!o)
        o = &none;
    s3_client *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    const char *b = url && !strncmp(url, "s3://", 5) ? url + 5 : NULL;
    size_t bl = b ? strcspn(b, "/") : 0;
    if (!b || bl < 3 || bl > 63 || strspn(b, "abcdefghijklmnopqrstuvwxyz0123456789.-") < bl) {
        snprintf(err, errlen, "artifact URL \"%s\" is not s3://BUCKET[/PREFIX] (bucket: 3-63 of a-z 0-9 . -)",
                 url ? url : "");
        goto fail;
    }
    memcpy(c->bucket, b, bl);
    const char *p = b + bl;
    while (*p == '/')
        p++;
    size_t pl = strlen(p);
    while (pl && p[pl - 1] == '/')
        pl--;
    if (pl >= sizeof c->prefix) {
        snprintf(err, errlen, "artifact URL prefix is too long");
        goto fail;
    }
    memcpy(c->prefix, p, pl);
    /* "." and ".." segments (and empty ones) would be folded by the HTTP client after the
     * request was signed over them: every object request would fail its signature */
    for (const char *seg = c->prefix; *c->prefix;) {
        size_t sl = strcspn(seg, "/");
        if (sl == 0 || (sl == 1 && seg[0] == '.') || (sl == 2 && seg[0] == '.' && seg[1] == '.')) {
            snprintf(err, errlen, "artifact URL prefix \"%s\" has an empty, \".\" or \"..\" segment", c->prefix);
            goto fail;
        }
        if (!seg[sl])
            break;
        seg += sl + 1;
    }
    const char *reg = o->region;
    char *env_reg = reg ? NULL : dup_env("AWS_REGION", "AWS_DEFAULT_REGION");
    reg = reg ? reg : env_reg ? env_reg : "us-east-1";
    int bad_reg = strlen(reg) >= sizeof c->region || strspn(reg, "abcdefghijklmnopqrstuvwxyz0123456789-") < strlen(reg);
    if (!bad_reg)
        snprintf(c->region, sizeof c->region, "%s", reg);
    free(env_reg);
    if (bad_reg) {
        snprintf(err, errlen, "S3 region is not a region name (a-z 0-9 -)");
        goto fail;
    }
    char *env_ep = o->endpoint ? NULL : dup_env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL");
    char dflt[128];
    snprintf(dflt, sizeof dflt, "https://s3.%s.amazonaws.com", c->region);
    int bad_ep = parse_endpoint(c, o->endpoint ? o->endpoint : env_ep ? env_ep : dflt, o->allow_http, err, errlen);
    free(env_ep);
    if (bad_ep)
        goto fail;
    if (o->credentials_file) {
        if (stat(o->credentials_file, &c->cred_seen) < 0) {
            snprintf(err, errlen, "%s: %s", o->credentials_file, strerror(errno));
            goto fail;
        }
        if (read_credentials(&c->creds, o->credentials_file, err, errlen))
            goto fail;
        if (!(c->cred_path = strdup(o->credentials_file))) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
    } else {
        c->creds.access = dup_env("AWS_ACCESS_KEY_ID", NULL);
        c->creds.secret = dup_env("AWS_SECRET_ACCESS_KEY", NULL);
        c->creds.token = dup_env("AWS_SESSION_TOKEN", NULL);
        if (!c->creds.access || !c->creds.secret) {
            snprintf(err, errlen, "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give a "
                                  "credentials file");
            goto fail;
        }
    }
    c->part_bytes = o->part_bytes ? o->part_bytes : 64 * MIB;
    if (c->part_bytes < 5 * MIB || c->part_bytes > 5120 * MIB) {
        snprintf(err, errlen, "S3 part size %lld bytes is outside 5 MiB .. 5 GiB", (long long)c->part_bytes);
        goto fail;
    }
    return c;
fail:
    s3_close(c);
    return NULL;
}

/* ---- one request -------------------------------------------------------------------- */

typedef struct {
    const char *method;
    const char *key;               /* object key under the prefix; NULL: the bucket */
    const sigv4_pair *query;
    int n_query;
    const char *range;             /* "bytes=a-b" or NULL */
    const char *meta_sha256;       /* sent as x-amz-meta-sha256 (a PUT, a multipart's start), or NULL */
    const char *body;              /* request body or NULL */
    size_t body_len;
    s3_sink sink;                  /* 2xx body to here (else collected) */
    void *user;
    /* out */
    long status;
    char etag[65];
    char meta_sha256_got[65];      /* the answer's x-amz-meta-sha256 ("" without one) */
    int64_t length;                /* Content-Length of the response, -1 unknown */
    strbuf resp;                   /* the body when not sunk (XML), at most XML_MAX */
    int resp_cut;                  /* more than XML_MAX came: resp holds only its start */
    int64_t sunk;
    int sink_stopped;
    int64_t range_from, range_len; /* the range asked for (range_len 0: none) */
    int range_ignored;             /* the answer was the whole object, not the range */
} s3_req;

typedef struct {
    const char *p;
    size_t left;
} reader;

static size_t read_cb(char *dst, size_t size, size_t n, void *ud)
{
    reader *r = ud;
    size_t k = size * n < r->left ? size * n : r->left;
    memcpy(dst, r->p, k);
    r->p += k;
    r->left -= k;
    return k;
}

/* The value of header name (with its ':') in line into out (65 bytes): without the
 * blanks around it and its quotes, "" when longer than 64 bytes. 1 when line is that
 * header, else 0 (out untouched). */
static int header_value(const char *line, size_t len, const char *name, char out[65])
{
    size_t nl = strlen(name);
    if (len <= nl || strncasecmp(line, name, nl))
        return 0;
    const char *v = line + nl, *end = line + len;
    while (v < end && (*v == ' ' || *v == '\t' || *v == '"'))
        v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '"' || end[-1] == '\r' || end[-1] == '\n'))
        end--;
    size_t k = (size_t)(end - v);
    if (k > 64)
        k = 0;
    memcpy(out, v, k);
    out[k] = 0;
    return 1;
}

/* 1 when s is a sha-256 in hex (64 digits, either case). */
static int is_sha256_hex(const char *s)
{
    return strlen(s) == 64 && strspn(s, "0123456789abcdefABCDEF") == 64;
}

static size_t header_cb(char *line, size_t size, size_t n, void *ud)
{
    s3_req *r = ud;
    size_t len = size * n;
    header_value(line, len, "etag:", r->etag);
    if (header_value(line, len, "x-amz-meta-sha256:", r->meta_sha256_got)) {
        if (!is_sha256_hex(r->meta_sha256_got))
            r->meta_sha256_got[0] = 0;   /* not a digest: as if none were stored */
        for (char *p = r->meta_sha256_got; *p; p++)
            *p = (char)tolower((unsigned char)*p);
    }
    return len;
}

static size_t write_cb(char *p, size_t size, size_t n, void *ud)
{
    void **u = ud;
    s3_req *r = u[0];
    CURL *h = u[1];
    size_t len = size * n;
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    if (r->sink && code / 100 == 2) {
        /* a 200 to a ranged GET is the whole object: from byte 0, and perhaps more than
         * asked for; only one that starts at 0 and fits the range is that range */
        curl_off_t cl = -1;
        if (code == 200 && r->range_len > 0 &&
            (r->range_from > 0 || curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl) != CURLE_OK || cl < 0 ||
             cl > r->range_len)) {
            r->range_ignored = 1;
            return 0;
        }
        if (r->sink(r->user, p, len)) {
            r->sink_stopped = 1;
            return 0;
        }
        r->sunk += (int64_t)len;
        return len;
    }
    if (!r->resp_cut && r->resp.len + len <= XML_MAX)
        strbuf_printf(&r->resp, "%.*s", (int)len, p);
    else
        r->resp_cut = 1;   /* never a later piece after a dropped one */
    return len;
}

/* The text of <tag>...</tag> in xml into out (n bytes); "" when absent. */
static void xml_text(const char *xml, const char *tag, char *out, size_t n)
{
    char open[64], close[64];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *a = xml ? strstr(xml, open) : NULL;
    const char *b = a ? strstr(a, close) : NULL;
    out[0] = 0;
    if (a && b) {
        a += strlen(open);
        size_t k = (size_t)(b - a) < n - 1 ? (size_t)(b - a) : n - 1;
        memcpy(out, a, k);
        out[k] = 0;
    }
}

/* Append a header line to *l (curl copies it). 0, or -1 when out of memory. */
static int slist_add(struct curl_slist **l, const char *line)
{
    struct curl_slist *n = curl_slist_append(*l, line);
    if (!n)
        return -1;
    *l = n;
    return 0;
}

/* One attempt at request r. *transport is set when the transfer itself broke (no answer,
 * a connection reset), as opposed to an answer S3 gave. 0, or -1 with err. */
static int perform_once(s3_client *c, s3_req *r, int *transport, char *err, size_t errlen)
{
    *transport = 0;
    char objkey[2048], path[2200], host[400], date[17], sha[65], hdr[4096];
    int w = r->key ? snprintf(objkey, sizeof objkey, "%s%s%s", c->prefix, *c->prefix ? "/" : "", r->key) : 0;
    if (w < 0 || (size_t)w >= sizeof objkey) {
        snprintf(err, errlen, "S3 key too long");
        return -1;
    }
    snprintf(host, sizeof host, "%s", c->authority);   /* path-style: host/BUCKET/key */
    snprintf(path, sizeof path, "/%s%s%s", c->bucket, r->key ? "/" : "", r->key ? objkey : "");
    time_t now = time(NULL);
    struct tm tm;
    if (!gmtime_r(&now, &tm) || !strftime(date, sizeof date, "%Y%m%dT%H%M%SZ", &tm)) {
        snprintf(err, errlen, "the clock cannot be read");
        return -1;
    }
    art_sha256_buf(r->body ? r->body : "", r->body ? r->body_len : 0, sha);
    sigv4_pair hs[3] = {{"host", host}};
    int nh = 1;
    if (r->range)
        hs[nh++] = (sigv4_pair){"range", r->range};
    if (r->meta_sha256)
        hs[nh++] = (sigv4_pair){"x-amz-meta-sha256", r->meta_sha256};
    sigv4_request sr = {r->method, path, r->query, r->n_query, hs, nh, sha, date};
    pthread_mutex_lock(&c->mu);
    creds_refresh(c);
    sigv4_creds cr = {c->creds.access, c->creds.secret, c->creds.token, c->region, "s3"};
    int signed_bad = sigv4_sign_headers(&cr, &sr, hdr, sizeof hdr, NULL, 0, err, errlen);
    pthread_mutex_unlock(&c->mu);
    if (signed_bad)
        return -1;
    /* the URL: the same encoded path and query as signed */
    strbuf url = {0};
    char *ep = sigv4_encode(path, 1);
    strbuf_printf(&url, "%s://%s%s", c->scheme, host, ep ? ep : "");
    free(ep);
    for (int i = 0; i < r->n_query; i++) {
        char *k = sigv4_encode(r->query[i].name, 0), *v = sigv4_encode(r->query[i].value, 0);
        strbuf_printf(&url, "%c%s%s%s", i ? '&' : '?', k ? k : "", *r->query[i].value ? "=" : "", v ? v : "");
        free(k);
        free(v);
    }
    struct curl_slist *list = NULL;
    char line[600];
    snprintf(line, sizeof line, "Host: %s", host);
    int ok = !url.oom && !slist_add(&list, line) && !slist_add(&list, "Expect:");
    if (ok && r->range) {
        snprintf(line, sizeof line, "Range: %s", r->range);
        ok = !slist_add(&list, line);
    }
    if (ok && r->meta_sha256) {
        snprintf(line, sizeof line, "x-amz-meta-sha256: %s", r->meta_sha256);
        ok = !slist_add(&list, line);
    }
    /* a POST body is XML: without a type libcurl sends it as a form, which servers parse away */
    if (ok && !strcmp(r->method, "POST"))
        ok = !slist_add(&list, r->body ? "Content-Type: application/xml" : "Content-Type:");
    for (char *s = hdr, *e; ok && *s && (e = strchr(s, '\n')); s = e + 1) {
        *e = 0;
        ok = !slist_add(&list, s);
    }
    memset(hdr, 0, sizeof hdr);
    CURL *h = ok ? curl_easy_init() : NULL;
    int rc = -1;
    if (!h) {
        snprintf(err, errlen, "out of memory (libcurl)");
        goto out;
    }
    reader rd = {r->body, r->body ? r->body_len : 0};
    void *wu[2] = {r, h};
    char cerr[CURL_ERROR_SIZE] = "";
    r->length = -1;
    int is_head = !strcmp(r->method, "HEAD"), is_put = !strcmp(r->method, "PUT"), is_post = !strcmp(r->method, "POST");
    ok = curl_easy_setopt(h, CURLOPT_URL, url.s) == CURLE_OK &&
         curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https") == CURLE_OK &&
         curl_easy_setopt(h, CURLOPT_HTTPHEADER, list) == CURLE_OK &&
         curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L) == CURLE_OK &&
         curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L) == CURLE_OK &&
         curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L) == CURLE_OK &&
         curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 120L) == CURLE_OK &&
         curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr) == CURLE_OK &&
         curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb) == CURLE_OK &&
         curl_easy_setopt(h, CURLOPT_HEADERDATA, r) == CURLE_OK &&
         curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb) == CURLE_OK &&
         curl_easy_setopt(h, CURLOPT_WRITEDATA, wu) == CURLE_OK;
    if (ok && is_head)
        ok = curl_easy_setopt(h, CURLOPT_NOBODY, 1L) == CURLE_OK;
    else if (ok && is_put)
        ok = curl_easy_setopt(h, CURLOPT_UPLOAD, 1L) == CURLE_OK &&
             curl_easy_setopt(h, CURLOPT_READFUNCTION, read_cb) == CURLE_OK &&
             curl_easy_setopt(h, CURLOPT_READDATA, &rd) == CURLE_OK &&
             curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)rd.left) == CURLE_OK;
    else if (ok && is_post)
        ok = curl_easy_setopt(h, CURLOPT_POST, 1L) == CURLE_OK &&
             curl_easy_setopt(h, CURLOPT_POSTFIELDS, r->body ? r->body : "") == CURLE_OK &&
             curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)rd.left) == CURLE_OK;
    else if (ok && strcmp(r->method, "GET"))
        ok = curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method) == CURLE_OK;
    CURLcode cc = ok ? curl_easy_perform(h) : CURLE_FAILED_INIT;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    curl_off_t cl = -1;
    if (curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl) == CURLE_OK)
        r->length = cl;
    curl_easy_cleanup(h);
    const char *what = r->key ? r->key : c->bucket;
    if (r->range_ignored) {
        snprintf(err, errlen, "S3 %s %s: the endpoint answered the whole object (HTTP 200) to a request for bytes %s",
                 r->method, what, r->range);
    } else if (r->sink_stopped) {
        snprintf(err, errlen, "S3 %s %s: stopped by the reader", r->method, what);
    } else if (cc != CURLE_OK) {
        *transport = cc != CURLE_FAILED_INIT;
        snprintf(err, errlen, "S3 %s %s: %s", r->method, what, *cerr ? cerr : curl_easy_strerror(cc));
    } else if (r->status / 100 != 2) {
        char code[128], msg[256];
        xml_text(r->resp.s, "Code", code, sizeof code);
        xml_text(r->resp.s, "Message", msg, sizeof msg);
        snprintf(err, errlen, "S3 %s %s: HTTP %ld%s%s%s%s", r->method, what, r->status, *code ? " " : "", code,
                 *msg ? ": " : "", msg);
    } else {
        rc = 0;
    }
out:
    curl_slist_free_all(list);
    free(url.s);
    return rc;
}

/* A request that failed in a way S3 asks clients to retry: the transfer broke, or the
 * answer was 5xx, 429, SlowDown or RequestTimeout. Never once a sink has bytes (they
 * would be handed over twice) or the range was ignored. */
static int retryable(const s3_req *r, int transport)
{
    if (r->sunk > 0 || r->sink_stopped || r->range_ignored)
        return 0;
    if (transport || r->status >= 500 || r->status == 429)
        return 1;
    char code[64];
    xml_text(r->resp.s, "Code", code, sizeof code);
    return !strcmp(code, "SlowDown") || !strcmp(code, "RequestTimeout");
}

/* perform_once, sent again (signed afresh, the body from its start) after a failure worth
 * retrying, up to S3_ATTEMPTS in all, 0.25 s, 0.5 s, 1 s apart. */
#define S3_ATTEMPTS 4
static int perform(s3_client *c, s3_req *r, char *err, size_t errlen)
{
    for (int attempt = 1;; attempt++) {
        int transport = 0;
        int rc = perform_once(c, r, &transport, err, errlen);
        if (rc == 0 || attempt == S3_ATTEMPTS || !retryable(r, transport))
            return rc;
        free(r->resp.s);
        r->resp = (strbuf){0};
        r->etag[0] = r->meta_sha256_got[0] = 0;
        r->resp_cut = 0;
        r->status = 0;
        long ms = 250L << (attempt - 1);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
    }
}

/* ---- operations --------------------------------------------------------------------- */

int s3_head(s3_client *c, const char *key, s3_object *o, char *err, size_t errlen)
{
    s3_req r = {.method = "HEAD", .key = key};
    int rc = perform(c, &r, err, errlen);
    free(r.resp.s);
    if (rc && r.status == 404)
        return 1;
    if (rc)
        return -1;
    if (o) {
        o->size_bytes = r.length;
        memcpy(o->etag, r.etag, sizeof r.etag);
        memcpy(o->sha256, r.meta_sha256_got, sizeof r.meta_sha256_got);
    }
    return 0;
}

int s3_head_bucket(s3_client *c, char *err, size_t errlen)
{
    s3_req r = {.method = "HEAD"};
    int rc = perform(c, &r, err, errlen);
    free(r.resp.s);
    if (rc && r.status == 404)
        snprintf(err, errlen, "S3 bucket %s: no such bucket", c->bucket);
    return rc;
}

int s3_get_range(s3_client *c, const char *key, int64_t offset, int64_t len, s3_sink sink, void *user, int64_t *got,
                 char *err, size_t errlen)
{
    if (offset < 0 || len < 1) {
        snprintf(err, errlen, "S3 GET %s: bad range (offset %lld, length %lld)", key, (long long)offset,
                 (long long)len);
        return -1;
    }
    char range[64];
    snprintf(range, sizeof range, "bytes=%lld-%lld", (long long)offset, (long long)(offset + len - 1));
    s3_req r = {.method = "GET", .key = key, .range = range, .sink = sink, .user = user, .range_from = offset,
                .range_len = len};
    int rc = perform(c, &r, err, errlen);
    free(r.resp.s);
    if (got)
        *got = r.sunk;
    return rc;
}

static int put_one(s3_client *c, s3_req *r, char *err, size_t errlen)
{
    int rc = perform(c, r, err, errlen);
    free(r->resp.s);
    r->resp = (strbuf){0};
    return rc;
}

/* Read n bytes at off of fd into buf. 0, or -1 with err. */
static int read_at(int fd, char *buf, int64_t n, int64_t off, const char *path, char *err, size_t errlen)
{
    for (int64_t done = 0; done < n;) {
        ssize_t k = pread(fd, buf + done, (size_t)(n - done), (off_t)(off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            snprintf(err, errlen, "%s: %s", path, k < 0 ? strerror(errno) : "shorter than it was");
            return -1;
        }
        done += k;
    }
    return 0;
}

/* After a Complete that failed: whether the object is there anyway, this upload's (its
 * answer lost, the retry then told NoSuchUpload): its size and the sha-256 it was started
 * with. Only an upload that names its sha-256 can be recognised. 1 (etag set), or 0. */
static int completed_anyway(s3_client *c, const char *key, int64_t size, const char *sha256, char *etag)
{
    s3_object o;
    char e[256];
    if (!sha256 || s3_head(c, key, &o, e, sizeof e) != 0 || o.size_bytes != size || strcasecmp(o.sha256, sha256) != 0)
        return 0;
    if (etag)
        memcpy(etag, o.etag, sizeof o.etag);
    return 1;
}

static int multipart(s3_client *c, const char *key, int fd, const char *path, int64_t size, const char *sha256,
                     char *buf, int64_t part, char *etag, char *err, size_t errlen)
{
    sigv4_pair q_init[] = {{"uploads", ""}};
    s3_req r = {.method = "POST", .key = key, .query = q_init, .n_query = 1, .meta_sha256 = sha256};
    if (perform(c, &r, err, errlen)) {
        free(r.resp.s);
        return -1;
    }
    char id[1024];
    xml_text(r.resp.s, "UploadId", id, sizeof id);
    free(r.resp.s);
    if (!*id) {
        snprintf(err, errlen, "S3 POST %s?uploads: no UploadId in the answer", key);
        return -1;
    }
    int n_parts = (int)((size + part - 1) / part), rc = -1;
    strbuf done = {0};
    strbuf_printf(&done, "<CompleteMultipartUpload>");
    for (int i = 0; i < n_parts; i++) {
        int64_t off = (int64_t)i * part, n = size - off < part ? size - off : part;
        char num[16];
        snprintf(num, sizeof num, "%d", i + 1);
        sigv4_pair q[] = {{"partNumber", num}, {"uploadId", id}};
        s3_req pr = {.method = "PUT", .key = key, .query = q, .n_query = 2, .body = buf, .body_len = (size_t)n};
        if (read_at(fd, buf, n, off, path, err, errlen) || put_one(c, &pr, err, errlen))
            goto cancel;
        if (!*pr.etag) {
            snprintf(err, errlen, "S3 PUT %s part %d: no ETag in the answer", key, i + 1);
            goto cancel;
        }
        strbuf_printf(&done, "<Part><PartNumber>%d</PartNumber><ETag>\"%s\"</ETag></Part>", i + 1, pr.etag);
    }
    strbuf_printf(&done, "</CompleteMultipartUpload>");
    if (done.oom) {
        snprintf(err, errlen, "out of memory");
        goto cancel;
    }
    sigv4_pair q_done[] = {{"uploadId", id}};
    s3_req cr = {.method = "POST", .key = key, .query = q_done, .n_query = 1, .body = done.s, .body_len = done.len};
    rc = perform(c, &cr, err, errlen);
    /* a 200 may still carry an <Error> (S3 documents this for CompleteMultipartUpload) */
    char code[128];
    xml_text(cr.resp.s, "Code", code, sizeof code);
    if (!rc && *code) {
        snprintf(err, errlen, "S3 POST %s?uploadId: %s", key, code);
        rc = -1;
    }
    if (!rc && etag) {
        char e[80];
        xml_text(cr.resp.s, "ETag", e, sizeof e);
        const char *v = e;
        size_t k = 0;
        if (!strncmp(v, "&quot;", 6))
            v += 6;
        while (*v == '"')
            v++;
        while (k < 64 && v[k] && v[k] != '"' && v[k] != '&')
            k++;
        memcpy(etag, v, k);
        etag[k] = 0;
    }
    free(cr.resp.s);
    if (!rc)
        goto out;
    if (completed_anyway(c, key, size, sha256, etag))
        rc = 0;   /* the abort below is then a no-op, or frees what a real failure left */
cancel:;
    char e2[256];
    s3_req ar = {.method = "DELETE", .key = key, .query = (sigv4_pair[]){{"uploadId", id}}, .n_query = 1};
    put_one(c, &ar, e2, sizeof e2);   /* best effort: the first error is the one reported */
out:
    free(done.s);
    return rc;
}

/* <tag>...</tag> of the element that starts at p and ends before end (exclusive) into out. */
static void xml_text_in(const char *p, const char *end, const char *tag, char *out, size_t n)
{
    char *seg = strndup(p, (size_t)(end - p));
    out[0] = 0;
    if (seg)
        xml_text(seg, tag, out, n);
    free(seg);
}

/* "2026-12-07T21:34:20.000Z" as seconds since the epoch; -1 when it is not one. */
static double iso_time(const char *t)
{
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *rest = strptime(t, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!rest)
        return -1;
    time_t s = timegm(&tm);
    return s == (time_t)-1 ? -1 : (double)s;
}

int s3_abort_stale_uploads(s3_client *c, const char *key_prefix, double older_than_s, int *aborted, char *err,
                           size_t errlen)
{
    char full[1100], key_marker[1100] = "", id_marker[1024] = "";
    snprintf(full, sizeof full, "%s%s%s", c->prefix, *c->prefix ? "/" : "", key_prefix);
    size_t pl = strlen(c->prefix) + (*c->prefix ? 1 : 0);
    *aborted = 0;
    double now = (double)time(NULL);
    for (int page = 0; page < 20; page++) {
        /* a page of 100 fits in the answer kept (XML_MAX) */
        sigv4_pair q[5] = {{"uploads", ""}, {"prefix", full}, {"max-uploads", "100"}};
        int nq = 3;
        if (*key_marker) {
            q[nq++] = (sigv4_pair){"key-marker", key_marker};
            q[nq++] = (sigv4_pair){"upload-id-marker", id_marker};
        }
        s3_req r = {.method = "GET", .query = q, .n_query = nq};
        if (perform(c, &r, err, errlen) || r.resp_cut) {
            if (r.resp_cut)
                snprintf(err, errlen, "S3 GET ?uploads: the listing is longer than %d bytes", XML_MAX);
            free(r.resp.s);
            return -1;
        }
        const char *xml = r.resp.s ? r.resp.s : "";
        for (const char *u = strstr(xml, "<Upload>"), *e; u && (e = strstr(u, "</Upload>")); u = strstr(e, "<Upload>")) {
            char key[1100], id[1024], when[64];
            xml_text_in(u, e, "Key", key, sizeof key);
            xml_text_in(u, e, "UploadId", id, sizeof id);
            xml_text_in(u, e, "Initiated", when, sizeof when);
            double t = iso_time(when);
            /* only this store's keys (no XML escapes in them), started long enough ago that
               no live upload is taken for a dead one */
            if (strncmp(key, full, strlen(full)) || strchr(key, '&') || !*id || t < 0 || now - t < older_than_s)
                continue;
            char e2[256];
            sigv4_pair qa[] = {{"uploadId", id}};
            s3_req ar = {.method = "DELETE", .key = key + pl, .query = qa, .n_query = 1};
            if (put_one(c, &ar, e2, sizeof e2) == 0)
                ++*aborted;
        }
        char trunc[16];
        xml_text(xml, "IsTruncated", trunc, sizeof trunc);
        xml_text(xml, "NextKeyMarker", key_marker, sizeof key_marker);
        xml_text(xml, "NextUploadIdMarker", id_marker, sizeof id_marker);
        free(r.resp.s);
        if (strcmp(trunc, "true") || !*key_marker)
            return 0;
    }
    return 0;
}

int s3_put_file(s3_client *c, const char *key, const char *path, const char *sha256, char *etag, char *err,
                size_t errlen)
{
    if (sha256 && !is_sha256_hex(sha256)) {   /* it goes into a header line */
        snprintf(err, errlen, "S3 PUT %s: the sha-256 to store is not 64 hex digits", key);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    int64_t size = st.st_size, part = c->part_bytes;
    if (size > part && (size + part - 1) / part > MAX_PARTS)
        part = (size + MAX_PARTS - 1) / MAX_PARTS;   /* S3 allows 10,000 parts */
    int64_t bufn = size < part ? size : part;
    char *buf = malloc(bufn > 0 ? (size_t)bufn : 1);
    int rc = -1;
    if (!buf) {
        snprintf(err, errlen, "out of memory (a %lld-byte part)", (long long)bufn);
    } else if (size <= part) {
        s3_req r = {.method = "PUT", .key = key, .body = buf, .body_len = (size_t)size, .meta_sha256 = sha256};
        rc = read_at(fd, buf, size, 0, path, err, errlen) || put_one(c, &r, err, errlen) ? -1 : 0;
        if (!rc && etag)
            memcpy(etag, r.etag, sizeof r.etag);
    } else {
        rc = multipart(c, key, fd, path, size, sha256, buf, part, etag, err, errlen);
    }
    free(buf);
    close(fd);
    return rc;
}
