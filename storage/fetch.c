/* storage/fetch.c — fetch_url (one resumable, size-limited, sha-256-verified libcurl
 * download into OUT.part, fsynced and renamed; see fetch.h). The model fetcher thread
 * that calls it is storage/fetch_service.c.
 */
#include "storage/fetch.h"
#include "storage/fileio.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/clock.h"
#include "storage/artstore.h"
#include "storage/modelio.h"

/* ---- fetch_url --------------------------------------------------------------------- */

typedef struct {
    int fd;
    int64_t start;           /* bytes of .part kept before this request (the Range start) */
    int64_t have;            /* bytes in .part now */
    int64_t total;           /* expected final size; -1 unknown */
    int64_t max;
    EVP_MD_CTX *md;
    CURL *c;
    fetch_opts *o;
    int is_http;
    int seen_body;           /* the first body byte of the final response arrived */
    int64_t cr_start, cr_total; /* Content-Range of the current response; -1 none */
    long code;               /* HTTP status of the response whose body arrived */
    int too_big, io_err, bad_range, cancelled, restarted;
    char io_msg[256];
    fetch_guard guard;       /* its connections' addresses */
    const char *shown;       /* the URL for messages (fetch_url_shown) */
} fx;

static int hexval(int ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                                             : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

static int is_sha256_hex(const char *s)
{
    if (!s || strlen(s) != 64)
        return 0;
    for (int i = 0; i < 64; i++)
        if (hexval((unsigned char)s[i]) < 0)
            return 0;
    return 1;
}

/* Parse "bytes A-B/T" or "bytes * /T" (without the space) after the header name. */
static void parse_content_range(const char *v, size_t n, int64_t *start, int64_t *total)
{
    char buf[128];
    if (n >= sizeof buf)
        return;
    memcpy(buf, v, n);
    buf[n] = 0;
    const char *p = buf;
    while (*p == ' ' || *p == '\t')
        p++;
    if (strncasecmp(p, "bytes", 5))
        return;
    p += 5;
    while (*p == ' ')
        p++;
    char *end;
    if (*p == '*') {
        p++;
    } else {
        errno = 0;
        long long a = strtoll(p, &end, 10);
        if (errno || end == p || *end != '-')
            return;
        *start = a;
        p = strchr(end, '/');
        if (!p)
            return;
    }
    if (*p != '/')
        return;
    errno = 0;
    long long t = strtoll(p + 1, &end, 10);
    if (!errno && end != p + 1 && t >= 0)
        *total = t;
}

static size_t fx_header(char *buf, size_t size, size_t nitems, void *u)
{
    fx *s = u;
    size_t n = size * nitems;
    if (n >= 5 && !strncmp(buf, "HTTP/", 5)) {   /* a new response (redirect, 100, final) */
        s->cr_start = -1;
        s->cr_total = -1;
    } else if (n > 14 && !strncasecmp(buf, "content-range:", 14)) {
        size_t vl = n - 14;
        while (vl && (buf[14 + vl - 1] == '\r' || buf[14 + vl - 1] == '\n'))
            vl--;
        parse_content_range(buf + 14, vl, &s->cr_start, &s->cr_total);
    }
    return n;
}

/* Start over at byte 0 (the server ignored the Range): empty .part, reset the digest. */
static int fx_restart(fx *s)
{
    if (ftruncate(s->fd, 0) || lseek(s->fd, 0, SEEK_SET) < 0) {
        snprintf(s->io_msg, sizeof s->io_msg, "truncate: %s", strerror(errno));
        return -1;
    }
    if (EVP_DigestInit_ex(s->md, EVP_sha256(), NULL) != 1) {
        snprintf(s->io_msg, sizeof s->io_msg, "sha256 init failed");
        return -1;
    }
    s->have = 0;
    s->restarted = 1;
    return 0;
}

/* The first body bytes of the final response: check status, range and size first. */
static int fx_first(fx *s)
{
    s->seen_body = 1;
    long code = 0;
    curl_off_t cl = -1;
    curl_easy_getinfo(s->c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_getinfo(s->c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
    s->code = code;
    if (s->is_http && code >= 300)
        return -1;                    /* an error page: handled after the transfer */
    if (s->is_http && code == 206) {
        if (s->cr_start != s->start) {
            s->bad_range = 1;
            return -1;
        }
        /* start + cl, where it fits: a larger one is over any limit anyway */
        s->total = s->cr_total >= 0 ? s->cr_total : cl >= 0 ? (cl > INT64_MAX - s->start ? INT64_MAX : s->start + cl) : -1;
    } else if (s->is_http) {          /* 200: the whole file */
        if (s->start > 0 && fx_restart(s) < 0) {
            s->io_err = 1;
            return -1;
        }
        s->total = cl >= 0 ? cl : -1;
    } else {                          /* file://: curl resumed at `start` itself */
        s->total = cl >= 0 ? (cl > INT64_MAX - s->start ? INT64_MAX : s->start + cl) : -1;
    }
    if (s->total > s->max) {
        s->too_big = 1;
        return -1;
    }
    return 0;
}

static size_t fx_write(char *ptr, size_t size, size_t nmemb, void *u)
{
    fx *s = u;
    size_t n = size * nmemb;
    if (!s->seen_body && fx_first(s) < 0)
        return 0;
    if (s->have + (int64_t)n > s->max) {
        s->too_big = 1;
        return 0;
    }
    if (fio_write_all(s->fd, ptr, n) < 0) {
        snprintf(s->io_msg, sizeof s->io_msg, "write: %s", strerror(errno));
        s->io_err = 1;
        return 0;
    }
    if (EVP_DigestUpdate(s->md, ptr, n) != 1) {
        snprintf(s->io_msg, sizeof s->io_msg, "sha256 update failed");
        s->io_err = 1;
        return 0;
    }
    s->have += (int64_t)n;
    return n;
}

static int fx_xferinfo(void *u, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow)
{
    (void)dltotal;
    (void)dlnow;
    (void)ultotal;
    (void)ulnow;
    fx *s = u;
    if (s->o->progress && s->o->progress(s->o->user, s->have, s->total)) {
        s->cancelled = 1;
        return 1;
    }
    return 0;
}

/* Hash the bytes an earlier attempt left in .part (fd at offset 0), leaving fd at its end.
 * Returns 0, FETCH_CANCELLED, or -1 with err. */
static int hash_existing(fx *s, const char *part, char *err, size_t errlen)
{
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", part);
        return -1;
    }
    int64_t next_report = 64LL << 20;
    s->have = 0;
    for (;;) {
        ssize_t r = read(s->fd, buf, CHUNK);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(err, errlen, "%s: read: %s", part, strerror(errno));
            free(buf);
            return -1;
        }
        if (r == 0)
            break;
        if (EVP_DigestUpdate(s->md, buf, (size_t)r) != 1) {
            snprintf(err, errlen, "%s: sha256 update failed", part);
            free(buf);
            return -1;
        }
        s->have += r;
        if (s->have >= next_report) {
            next_report += 64LL << 20;
            if (s->o->progress && s->o->progress(s->o->user, s->have, -1)) {
                free(buf);
                return FETCH_CANCELLED;
            }
        }
    }
    free(buf);
    return 0;
}

static void hex_digest(EVP_MD_CTX *md, char hex[65], int *ok)
{
    unsigned char dig[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    *ok = EVP_DigestFinal_ex(md, dig, &dl) == 1 && dl == 32;
    if (!*ok)
        memset(dig, 0, 32);
    art_hex(dig, 32, hex);
}

/* A scheme the caller allows: 0, or -1 with err. *is_http set for http(s). */
static int check_scheme(const char *url, unsigned flags, int *is_http, char *err, size_t errlen)
{
    *is_http = 1;
    if (!strncasecmp(url, "https://", 8) && url[8])
        return 0;
    if (!strncasecmp(url, "http://", 7) && url[7]) {
        if (flags & FETCH_ALLOW_HTTP)
            return 0;
        snprintf(err, errlen, "%.300s: plain http:// is not allowed here; use https://", url);
        return -1;
    }
    *is_http = 0;
    if (!strncasecmp(url, "file://", 7) && (flags & FETCH_ALLOW_FILE))
        return 0;
    snprintf(err, errlen, "%.300s: only %s URLs can be fetched", url,
             flags & FETCH_ALLOW_HTTP ? "https:// and http://" : "https://");
    return -1;
}

/* The curl results that mean the peer's certificate could not be verified (or the CAs to
 * verify it with could not be loaded): retrying cannot help. For those, writes the reason
 * into err (which CAs; curl's detail) and returns 1; 0 for any other result. A failed
 * handshake without a verdict on the certificate (CURLE_SSL_CONNECT_ERROR) is not one. */
static int tls_failure(CURLcode cc, const char *url, const char *ca_file, const char *cerr, char *err, size_t errlen)
{
    const char *detail = cerr[0] ? cerr : curl_easy_strerror(cc);
    char cas[600];
    if (ca_file)
        snprintf(cas, sizeof cas, "the CA file %.500s", ca_file);
    else
        snprintf(cas, sizeof cas, "the system CA store");
    switch (cc) {
    case CURLE_PEER_FAILED_VERIFICATION:   /* unknown issuer, self-signed, wrong host, expired */
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
        snprintf(err, errlen, "%.300s: the server's TLS certificate could not be verified against %s (%.300s)", url,
                 cas, detail);
        return 1;
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CRL_BADFILE:
        snprintf(err, errlen,
                 "%.300s: the server's TLS certificate could not be verified: %s could not be loaded (%.300s)", url,
                 cas, detail);
        return 1;
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CLIENTCERT:
        snprintf(err, errlen,
                 "%.300s: TLS certificate problem; the server's certificate could not be verified (%.300s)", url,
                 detail);
        return 1;
    default:
        return 0;
    }
}

/* Point s's curl handle at url for this attempt: protocols (file for a local URL, else
 * https, or http too with FETCH_ALLOW_HTTP), timeouts, TLS verification, callbacks, and a
 * Range from s->start when resuming. cerr (CURL_ERROR_SIZE bytes) receives curl's
 * message. 0, or -1 with err. */
static int fx_configure(fx *s, const char *url, char *cerr, char *err, size_t errlen)
{
    const fetch_opts *o = s->o;
    const char *protos = !s->is_http ? "file" : (o->flags & FETCH_ALLOW_HTTP) ? "http,https" : "https";
    char range[32];
    /* CURLOPT_RANGE rather than RESUME_FROM: curl then leaves a 200 answer to us (restart) */
    snprintf(range, sizeof range, "%lld-", (long long)s->start);
    long connect_s = o->connect_timeout_s > 0 ? o->connect_timeout_s : 30;
    long stall_s = o->stall_timeout_s > 0 ? o->stall_timeout_s : 60;
    CURL *c = s->c;
    if (curl_easy_setopt(c, CURLOPT_URL, url) || curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, protos) ||
        curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, protos) ||
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L) || curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L) ||
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, fx_write) || curl_easy_setopt(c, CURLOPT_WRITEDATA, s) ||
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, fx_header) || curl_easy_setopt(c, CURLOPT_HEADERDATA, s) ||
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L) ||
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, fx_xferinfo) ||
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, s) ||
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, connect_s) ||
        /* a stall: under 1 KiB/s for stall_s (a drip of bytes is no download) */
        curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L) || curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, stall_s) ||
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L) || curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr) ||
        curl_easy_setopt(c, CURLOPT_USERAGENT, "autocompress") ||
        fetch_guard_install(c, &s->guard) ||
        curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L) || curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L) ||
        (o->ca_file && (curl_easy_setopt(c, CURLOPT_CAINFO, o->ca_file) ||
                        curl_easy_setopt(c, CURLOPT_CAPATH, (char *)NULL))) ||
        (s->start > 0 && curl_easy_setopt(c, CURLOPT_RANGE, range))) {
        snprintf(err, errlen, "%.300s: libcurl rejected an option", s->shown);
        return -1;
    }
    return 0;
}

/* What the transfer that ended with cc (HTTP status code) means for the download in
 * part: FETCH_OK when every byte is in part, or FETCH_RETRY / FETCH_FAILED /
 * FETCH_CANCELLED with err, and *keep_part set when part is worth resuming from. */
static int fx_outcome(fx *s, const char *url, const char *part, CURLcode cc, long code, const char *cerr,
                      int *keep_part, char *err, size_t errlen)
{
    fetch_opts *o = s->o;
    if (s->cancelled) {
        snprintf(err, errlen, "%.300s: cancelled after %lld bytes", url, (long long)s->have);
        *keep_part = 1;
        return FETCH_CANCELLED;
    }
    if (s->too_big) {
        if (s->total > s->max)
            snprintf(err, errlen, "%.300s: %lld bytes is larger than the limit of %lld bytes", url,
                     (long long)s->total, (long long)s->max);
        else
            snprintf(err, errlen, "%.300s: larger than the limit of %lld bytes", url, (long long)s->max);
        return FETCH_FAILED;
    }
    if (s->io_err) {
        snprintf(err, errlen, "%s: %s", part, s->io_msg);
        return FETCH_FAILED;
    }
    if (s->bad_range) {
        snprintf(err, errlen, "%.300s: asked for bytes from %lld, the server sent a range from %lld; starting over",
                 url, (long long)s->start, (long long)s->cr_start);
        return FETCH_RETRY;
    }
    if (cc == CURLE_COULDNT_CONNECT && s->guard.refused[0]) {   /* first: a redirect's status may still be the code */
        snprintf(err, errlen, "%.300s: refused to connect to %s, which is not a public address (a server allows its own "
                 "network with --allow-private-model-hosts%s)", url, s->guard.refused, fetch_guard_proxy_note());
        return FETCH_FAILED;
    }
    int complete_already = 0;
    /* curl keeps a redirect's status when the connection to its target fails before an
     * answer: a 3xx beside a transfer error is that error (below), not the redirect's */
    if (s->is_http && code >= 300 && !(code < 400 && cc != CURLE_OK)) {
        if (code == 416 && s->start > 0 && s->cr_total == s->start) {
            complete_already = 1;     /* an earlier attempt got every byte before it stopped */
        } else if (code == 416 && s->start > 0) {
            snprintf(err, errlen, "%.300s: HTTP 416 for a resume at byte %lld; starting over", url,
                     (long long)s->start);
            return FETCH_RETRY;
        } else {
            snprintf(err, errlen, "%.300s: HTTP %ld", url, code);
            int transient = code >= 500 || code == 408 || code == 429;
            *keep_part = transient;
            return transient ? FETCH_RETRY : FETCH_FAILED;
        }
    } else if (cc != CURLE_OK && tls_failure(cc, url, o->ca_file, cerr, err, errlen)) {
        o->tls_unverified = 1;
        return FETCH_FAILED;    /* permanent: the same certificate fails the same way next time */
    } else if (cc != CURLE_OK) {
        snprintf(err, errlen, "%.300s: %s after %lld bytes", url, cerr[0] ? cerr : curl_easy_strerror(cc),
                 (long long)s->have);
        int rc = cc == CURLE_UNSUPPORTED_PROTOCOL || cc == CURLE_URL_MALFORMAT || cc == CURLE_TOO_MANY_REDIRECTS
                     ? FETCH_FAILED : FETCH_RETRY;
        *keep_part = rc == FETCH_RETRY;
        return rc;
    }
    if (!complete_already && !s->seen_body && s->is_http && code == 200 && s->start > 0 && fx_restart(s) < 0) {
        snprintf(err, errlen, "%s: %s", part, s->io_msg);   /* an empty 200 body */
        return FETCH_FAILED;
    }
    if (s->total >= 0 && s->have != s->total && !complete_already) {
        snprintf(err, errlen, "%.300s: got %lld of %lld bytes", url, (long long)s->have, (long long)s->total);
        *keep_part = 1;
        return FETCH_RETRY;
    }
    return FETCH_OK;
}

/* The bytes in part are the whole file: check their sha-256 against sha (when given;
 * o->sha256 gets the digest either way), fsync, and rename part to out_path. FETCH_OK,
 * or FETCH_FAILED with err (*resumed_mismatch when a resumed download does not match). */
static int fx_commit(fx *s, const char *url, const char *sha, const char *part, const char *out_path,
                     int *resumed_mismatch, char *err, size_t errlen)
{
    fetch_opts *o = s->o;
    int ok;
    hex_digest(s->md, o->sha256, &ok);
    if (!ok) {
        snprintf(err, errlen, "%.300s: sha256 failed", url);
        return FETCH_FAILED;
    }
    if (sha && strcasecmp(o->sha256, sha)) {
        snprintf(err, errlen, "%.300s: sha256 mismatch: got %s, expected %s", url, o->sha256, sha);
        *resumed_mismatch = s->start > 0 && !s->restarted;
        return FETCH_FAILED;
    }
    if (fsync(s->fd)) {
        snprintf(err, errlen, "%s: fsync: %s", part, strerror(errno));
        return FETCH_FAILED;
    }
    if (rename(part, out_path)) {
        snprintf(err, errlen, "%s: rename: %s", out_path, strerror(errno));
        return FETCH_FAILED;
    }
    (void)fio_fsync_parent(out_path);   /* best effort */
    o->bytes = s->have;
    return FETCH_OK;
}

/* One attempt at downloading url into part (resumed from what part holds) and, when it
 * completes and matches sha, renaming it to out_path. Returns FETCH_OK, FETCH_RETRY,
 * FETCH_FAILED or FETCH_CANCELLED with err; part is kept when it is worth resuming.
 * *resumed_mismatch is set when a digest mismatch followed a resume. */
static int fetch_once(const char *url, const char *shown, const char *sha, int64_t max_bytes, const char *out_path,
                      const char *part, fetch_opts *o, int is_http, int *resumed_mismatch, char *err, size_t errlen)
{
    *resumed_mismatch = 0;
    fx s;
    memset(&s, 0, sizeof s);
    s.o = o;
    s.guard.allow_private = !!(o->flags & FETCH_ALLOW_PRIVATE);
    s.max = max_bytes;
    s.total = -1;
    s.cr_start = s.cr_total = -1;
    s.is_http = is_http;
    s.shown = shown;
    /* The .part is this download's while it holds its lock. A file locked just as the
     * download that held it renamed it into place (or removed it) is no longer the .part:
     * open it again. */
    for (int tries = 0;; tries++) {
        s.fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (s.fd < 0) {
            snprintf(err, errlen, "%s: %s", part, strerror(errno));
            return FETCH_FAILED;
        }
        if (flock(s.fd, LOCK_EX | LOCK_NB) < 0) {
            snprintf(err, errlen, "%s: another download of this file is in progress", part);
            close(s.fd);
            return FETCH_BUSY;
        }
        struct stat held = {0}, named;
        if (fstat(s.fd, &held) == 0 && stat(part, &named) == 0 && held.st_ino == named.st_ino &&
            held.st_dev == named.st_dev)
            break;
        close(s.fd);
        /* renamed into place: the download that held the lock has finished (a caller may
         * have made out_path itself beforehand, so only a replaced .part says this) */
        if (held.st_nlink > 0 && stat(out_path, &named) == 0 && named.st_ino == held.st_ino) {
            snprintf(err, errlen, "%s: finished by another download", out_path);
            return FETCH_BUSY;
        }
        if (tries == 3) {
            snprintf(err, errlen, "%s: replaced while it was opened, again and again", part);
            return FETCH_BUSY;
        }
    }
    int rc = FETCH_FAILED, keep_part = 0;
    s.md = EVP_MD_CTX_new();
    s.c = curl_easy_init();
    if (!s.md || !s.c || EVP_DigestInit_ex(s.md, EVP_sha256(), NULL) != 1) {
        snprintf(err, errlen, "%.300s: cannot initialise libcurl/openssl", shown);
        goto done;
    }
    int h = hash_existing(&s, part, err, errlen);
    if (h) {
        rc = h == FETCH_CANCELLED ? FETCH_CANCELLED : FETCH_FAILED;
        keep_part = h == FETCH_CANCELLED;
        if (h == FETCH_CANCELLED)
            snprintf(err, errlen, "%.300s: cancelled", shown);
        goto done;
    }
    if (s.have > max_bytes && fx_restart(&s) < 0) {
        snprintf(err, errlen, "%s: %s", part, s.io_msg);
        goto done;
    }
    s.start = s.have;
    o->resumed_from = s.start;
    char cerr[CURL_ERROR_SIZE] = "";
    if (fx_configure(&s, url, cerr, err, errlen) < 0)
        goto done;
    if (o->transfer_starts)
        o->transfer_starts(o->user);
    CURLcode cc = curl_easy_perform(s.c);
    long code = 0;
    curl_easy_getinfo(s.c, CURLINFO_RESPONSE_CODE, &code);
    rc = fx_outcome(&s, shown, part, cc, code, cerr, &keep_part, err, errlen);
    if (rc == FETCH_OK) {
        rc = fx_commit(&s, shown, sha, part, out_path, resumed_mismatch, err, errlen);
        keep_part = rc == FETCH_OK;   /* renamed: nothing to remove */
    }
done:
    if (s.c)
        curl_easy_cleanup(s.c);
    EVP_MD_CTX_free(s.md);
    if (!keep_part)
        unlink(part);
    close(s.fd);     /* releases the lock */
    return rc;
}

int fetch_part_path(const char *out_path, char *buf, size_t n)
{
    return snprintf(buf, n, "%s.part", out_path) < (int)n ? 0 : -1;
}

int fetch_url(const char *url, const char *sha256_hex, int64_t max_bytes, const char *out_path, fetch_opts *opts,
              char *err, size_t errlen)
{
    fetch_opts dflt;
    memset(&dflt, 0, sizeof dflt);
    fetch_opts *o = opts ? opts : &dflt;
    o->sha256[0] = 0;
    o->bytes = 0;
    o->resumed_from = 0;
    o->tls_unverified = 0;
    int is_http;
    char shown[2100];
    fetch_url_shown(url ? url : "", shown, sizeof shown);
    if (!url || check_scheme(shown, o->flags, &is_http, err, errlen) < 0)
        return FETCH_FAILED;
    if (sha256_hex && !is_sha256_hex(sha256_hex)) {
        snprintf(err, errlen, "%.300s: sha256 must be 64 hex digits", shown);
        return FETCH_FAILED;
    }
    if (max_bytes < 0)
        max_bytes = 0;
    char part[4200];
    if (fetch_part_path(out_path, part, sizeof part) < 0) {
        snprintf(err, errlen, "%.300s: output path too long", out_path);
        return FETCH_FAILED;
    }
    int resumed_mismatch = 0;
    int rc = fetch_once(url, shown, sha256_hex, max_bytes, out_path, part, o, is_http, &resumed_mismatch, err,
                        errlen);
    if (rc == FETCH_FAILED && resumed_mismatch)   /* the kept bytes were stale: once more from 0 */
        rc = fetch_once(url, shown, sha256_hex, max_bytes, out_path, part, o, is_http, &resumed_mismatch, err,
                        errlen);
    return rc;
}

const char *fetch_model_file_name(const char *url, char *out, size_t outlen, char *err, size_t errlen)
{
    const char *p = strstr(url, "://");
    p = p ? p + 3 : url;
    size_t n = strcspn(p, "?#");
    const char *slash = NULL;
    for (const char *q = p; q < p + n; q++)
        if (*q == '/')
            slash = q;
    if (!slash || slash + 1 == p + n) {
        snprintf(err, errlen, "the URL names no file (its path must end in NAME.gguf or NAME.bin)");
        return NULL;
    }
    const char *base = slash + 1;
    size_t bl = (size_t)(p + n - base);
    if (bl >= outlen || bl > 200 || base[0] == '.') {
        snprintf(err, errlen, "the URL's file name must be 1 to 200 characters and not start with '.'");
        return NULL;
    }
    for (size_t i = 0; i < bl; i++) {
        char ch = base[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '_' || ch == '-')) {
            snprintf(err, errlen, "the URL's file name may hold only letters, digits, '.', '_' and '-'");
            return NULL;
        }
    }
    memcpy(out, base, bl);
    out[bl] = 0;
    if (bl > 5 && fio_has_suffix(out, ".gguf"))
        return "gguf";
    if (bl > 4 && fio_has_suffix(out, ".bin"))
        return "llama2c";
    snprintf(err, errlen, "the URL's file must be a .gguf file or a llama2.c .bin checkpoint (lowercase suffix)");
    return NULL;
}

int fetch_check_ca_file(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "CA file %.3000s: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "CA file %.3000s: not a regular file", path);
        fclose(f);
        return -1;
    }
    int certs = 0;
    X509 *x;
    ERR_clear_error();
    while ((x = PEM_read_X509(f, NULL, NULL, NULL))) {
        certs++;
        X509_free(x);
    }
    int read_err = ferror(f);
    ERR_clear_error();   /* the read that ended the loop leaves "no start line" queued */
    fclose(f);
    if (read_err) {
        snprintf(err, errlen, "CA file %.3000s: read error", path);
        return -1;
    }
    if (certs == 0) {
        snprintf(err, errlen, "CA file %.3000s: holds no PEM certificate (-----BEGIN CERTIFICATE-----)", path);
        return -1;
    }
    return 0;
}

int fetch_model_path(const char *data_dir, const char *sha256_hex, const char *file, char *out, size_t outlen)
{
    int n = snprintf(out, outlen, "%s/models/%s/%s", data_dir, sha256_hex, file);
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}
