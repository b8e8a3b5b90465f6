/* storage/sigv4.c — AWS Signature Version 4 (see sigv4.h): canonical request, string to
 * sign, signing key and signature, as AWS documents them for S3 (paths encoded once). */
#include "storage/sigv4.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "storage/strbuf.h"

#define ALGO "AWS4-HMAC-SHA256"

typedef struct {
    char *name, *value;          /* owned; encoded (query) or canonical (headers) */
} kv;

typedef struct {
    kv *v;
    int n;
} kvs;

static void kvs_free(kvs *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->v[i].name);
        free(l->v[i].value);
    }
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

/* Append (name, value), stealing both; -1 (both freed) when out of memory or NULL. */
static int kvs_add(kvs *l, char *name, char *value)
{
    kv *v = name && value ? realloc(l->v, (size_t)(l->n + 1) * sizeof *v) : NULL;
    if (!v) {
        free(name);
        free(value);
        return -1;
    }
    l->v = v;
    l->v[l->n].name = name;
    l->v[l->n].value = value;
    l->n++;
    return 0;
}

static int kv_cmp(const void *a, const void *b)
{
    const kv *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->value, y->value);
}

char *sigv4_encode(const char *s, int keep_slash)
{
    size_t n = strlen(s);
    char *o = malloc(3 * n + 1), *p = o;
    if (!o)
        return NULL;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (isalnum(*c) || *c == '-' || *c == '_' || *c == '.' || *c == '~' || (keep_slash && *c == '/'))
            *p++ = (char)*c;
        else
            p += snprintf(p, 4, "%%%02X", *c);
    }
    *p = 0;
    return o;
}

/* A header value as signed: leading and trailing blanks removed, inner runs of blanks
 * made one space. NEW string or NULL. */
static char *header_trim(const char *s)
{
    char *o = malloc(strlen(s) + 1), *p = o;
    if (!o)
        return NULL;
    while (*s == ' ' || *s == '\t')
        s++;
    for (; *s; s++) {
        if (*s == ' ' || *s == '\t') {
            if (p > o && p[-1] != ' ')
                *p++ = ' ';
        } else {
            *p++ = *s;
        }
    }
    while (p > o && p[-1] == ' ')
        p--;
    *p = 0;
    return o;
}

static char *lower_dup(const char *s)
{
    char *o = strdup(s);
    for (char *p = o; p && *p; p++)
        *p = (char)tolower((unsigned char)*p);
    return o;
}

static void hex32(const unsigned char *d, char out[65])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static int sha256_hex(const char *s, size_t n, char out[65])
{
    unsigned char d[32];
    unsigned int dl = 0;
    if (!EVP_Digest(s, n, d, &dl, EVP_sha256(), NULL) || dl != 32)
        return -1;
    hex32(d, out);
    return 0;
}

static int hmac(const unsigned char *key, size_t keylen, const char *msg, unsigned char out[32])
{
    unsigned int ml = 0;
    return HMAC(EVP_sha256(), key, (int)keylen, (const unsigned char *)msg, strlen(msg), out, &ml) && ml == 32 ? 0
                                                                                                               : -1;
}

int sigv4_signing_key(const char *secret, const char *yyyymmdd, const char *region, const char *service,
                      unsigned char key[32])
{
    size_t sl = strlen(secret);
    char *k = malloc(sl + 5);
    if (!k)
        return -1;
    memcpy(k, "AWS4", 4);
    memcpy(k + 4, secret, sl + 1);
    unsigned char a[32], b[32];
    int rc = hmac((unsigned char *)k, sl + 4, yyyymmdd, a) || hmac(a, 32, region, b) || hmac(b, 32, service, a) ||
             hmac(a, 32, "aws4_request", key);
    OPENSSL_cleanse(k, sl + 4);
    OPENSSL_cleanse(a, sizeof a);
    OPENSSL_cleanse(b, sizeof b);
    free(k);
    return rc ? -1 : 0;
}

static int date_ok(const char *d)
{
    if (!d || strlen(d) != 16 || d[8] != 'T' || d[15] != 'Z')
        return 0;
    for (int i = 0; i < 15; i++)
        if (i != 8 && !isdigit((unsigned char)d[i]))
            return 0;
    return 1;
}

static int has_header(const sigv4_request *r, const char *name)
{
    for (int i = 0; i < r->n_headers; i++)
        if (r->headers[i].name && !strcasecmp(r->headers[i].name, name))
            return 1;
    return 0;
}

/* What both forms share: the checked inputs, the encoded query and the canonical
 * headers (sorted, duplicates joined by ','), and the credential scope. */
typedef struct {
    kvs q, h;
    char scope[160];
} parts;

static int parts_init(const sigv4_creds *cr, const sigv4_request *r, int sign_all_headers, parts *p, char *err,
                      size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (!cr || !cr->access_key || !*cr->access_key || !cr->secret_key || !*cr->secret_key || !cr->region ||
        !*cr->region || !cr->service || !*cr->service) {
        snprintf(err, errlen, "sigv4: the access key, secret key, region and service are all required");
        return -1;
    }
    if (!r->method || !*r->method || !r->path || r->path[0] != '/') {
        snprintf(err, errlen, "sigv4: a method and a path starting with '/' are required");
        return -1;
    }
    if (!date_ok(r->amz_date)) {
        snprintf(err, errlen, "sigv4: amz_date \"%s\" is not YYYYMMDDTHHMMSSZ", r->amz_date ? r->amz_date : "");
        return -1;
    }
    if (!has_header(r, "host")) {
        snprintf(err, errlen, "sigv4: the request has no host header");
        return -1;
    }
    int n = snprintf(p->scope, sizeof p->scope, "%.8s/%s/%s/aws4_request", r->amz_date, cr->region, cr->service);
    if (n < 0 || (size_t)n >= sizeof p->scope) {
        snprintf(err, errlen, "sigv4: region or service too long");
        return -1;
    }
    for (int i = 0; i < r->n_query; i++)
        if (!r->query[i].name || !*r->query[i].name ||
            kvs_add(&p->q, sigv4_encode(r->query[i].name, 0), sigv4_encode(r->query[i].value ? r->query[i].value : "", 0)))
            goto bad;
    for (int i = 0; i < r->n_headers; i++) {
        const sigv4_pair *hp = &r->headers[i];
        if (!hp->name || !*hp->name || strpbrk(hp->name, ": \t\r\n") || (hp->value && strpbrk(hp->value, "\r\n")))
            goto bad;
        if (!sign_all_headers && strcasecmp(hp->name, "host"))
            continue;
        if (kvs_add(&p->h, lower_dup(hp->name), header_trim(hp->value ? hp->value : "")))
            goto bad;
    }
    if (p->q.n > 1)   /* an empty list has no array, and qsort takes none */
        qsort(p->q.v, (size_t)p->q.n, sizeof(kv), kv_cmp);
    if (p->h.n > 1)
        qsort(p->h.v, (size_t)p->h.n, sizeof(kv), kv_cmp);
    /* duplicates of one header: one line, values joined by ',' in the order sorted */
    int w = 0;
    for (int i = 0; i < p->h.n; i++) {
        if (w && !strcmp(p->h.v[w - 1].name, p->h.v[i].name)) {
            strbuf s = {0};
            strbuf_printf(&s, "%s,%s", p->h.v[w - 1].value, p->h.v[i].value);
            if (s.oom) {
                free(s.s);
                goto bad;
            }
            free(p->h.v[w - 1].value);
            p->h.v[w - 1].value = s.s;
            free(p->h.v[i].name);
            free(p->h.v[i].value);
        } else {
            p->h.v[w++] = p->h.v[i];
        }
    }
    p->h.n = w;
    return 0;
bad:
    snprintf(err, errlen, "sigv4: a query parameter or header is malformed (empty name, ':' or a line break) "
                          "or memory ran out");
    kvs_free(&p->q);
    kvs_free(&p->h);
    return -1;
}

/* The canonical request, the signed-header list and the signature. 0 or -1. */
static int sign_parts(const sigv4_creds *cr, const sigv4_request *r, parts *p, const char *payload, strbuf *canon,
                      strbuf *signed_h, char sig[65])
{
    char *path = sigv4_encode(r->path, 1);
    if (!path)
        return -1;
    strbuf_printf(canon, "%s\n%s\n", r->method, path);
    free(path);
    for (int i = 0; i < p->q.n; i++)
        strbuf_printf(canon, "%s%s=%s", i ? "&" : "", p->q.v[i].name, p->q.v[i].value);
    strbuf_printf(canon, "\n");
    for (int i = 0; i < p->h.n; i++) {
        strbuf_printf(canon, "%s:%s\n", p->h.v[i].name, p->h.v[i].value);
        strbuf_printf(signed_h, "%s%s", i ? ";" : "", p->h.v[i].name);
    }
    strbuf_printf(canon, "\n%s\n%s", signed_h->s ? signed_h->s : "", payload);
    if (canon->oom || signed_h->oom)
        return -1;
    char ch[65];
    if (sha256_hex(canon->s, canon->len, ch))
        return -1;
    strbuf sts = {0};
    strbuf_printf(&sts, ALGO "\n%s\n%s\n%s", r->amz_date, p->scope, ch);
    unsigned char key[32], mac[32];
    char day[9];
    memcpy(day, r->amz_date, 8);
    day[8] = 0;
    int rc = sts.oom || sigv4_signing_key(cr->secret_key, day, cr->region, cr->service, key) ||
             hmac(key, 32, sts.s, mac);
    OPENSSL_cleanse(key, sizeof key);
    free(sts.s);
    if (rc)
        return -1;
    hex32(mac, sig);
    return 0;
}

/* A request signed: its encoded query and canonical headers, canonical request,
 * signed-header list and signature. */
typedef struct {
    parts p;
    strbuf canon, signed_h;
    char sig[65];
} signed_req;

static void signed_free(signed_req *s)
{
    kvs_free(&s->p.q);
    kvs_free(&s->p.h);
    free(s->canon.s);
    free(s->signed_h.s);
}

/* Sign r (every header, or host alone when !sign_all_headers) over payload into *s.
 * 0, or -1 with err (nothing to free then). */
static int sign_request(const sigv4_creds *cr, const sigv4_request *r, int sign_all_headers, const char *payload,
                        signed_req *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (parts_init(cr, r, sign_all_headers, &s->p, err, errlen))
        return -1;
    if (sign_parts(cr, r, &s->p, payload, &s->canon, &s->signed_h, s->sig)) {
        snprintf(err, errlen, "sigv4: signing failed (out of memory or OpenSSL)");
        signed_free(s);
        return -1;
    }
    return 0;
}

/* Copy the NUL-terminated s into out (outlen bytes). 0, or -1 with err. */
static int put(const char *s, char *out, size_t outlen, const char *what, char *err, size_t errlen)
{
    size_t n = strlen(s);
    if (!out || n >= outlen) {
        snprintf(err, errlen, "sigv4: %s needs %zu bytes, the buffer holds %zu", what, n + 1, out ? outlen : 0);
        return -1;
    }
    memcpy(out, s, n + 1);
    return 0;
}

int sigv4_sign_headers(const sigv4_creds *cr, const sigv4_request *req, char *out, size_t outlen, char *canonical,
                       size_t canonical_len, char *err, size_t errlen)
{
    const char *payload = req->payload_sha256 && *req->payload_sha256 ? req->payload_sha256 : SIGV4_EMPTY_SHA256;
    int tok = cr && cr->session_token && *cr->session_token;
    /* the request with the headers the signer adds */
    sigv4_pair *h = malloc((size_t)(req->n_headers + 3) * sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int n = 0;
    for (int i = 0; i < req->n_headers; i++)
        h[n++] = req->headers[i];
    int add_date = !has_header(req, "x-amz-date"), add_sha = !has_header(req, "x-amz-content-sha256");
    int add_tok = tok && !has_header(req, "x-amz-security-token");
    if (add_date)
        h[n++] = (sigv4_pair){"x-amz-date", req->amz_date};
    if (add_sha)
        h[n++] = (sigv4_pair){"x-amz-content-sha256", payload};
    if (add_tok)
        h[n++] = (sigv4_pair){"x-amz-security-token", cr->session_token};
    sigv4_request r = *req;
    r.headers = h;
    r.n_headers = n;
    signed_req sr;
    if (sign_request(cr, &r, 1, payload, &sr, err, errlen)) {
        free(h);
        return -1;
    }
    strbuf o = {0};
    strbuf_printf(&o, "Authorization: " ALGO " Credential=%s/%s,SignedHeaders=%s,Signature=%s\n", cr->access_key,
                  sr.p.scope, sr.signed_h.s, sr.sig);
    if (add_date)
        strbuf_printf(&o, "x-amz-date: %s\n", req->amz_date);
    if (add_sha)
        strbuf_printf(&o, "x-amz-content-sha256: %s\n", payload);
    if (add_tok)
        strbuf_printf(&o, "x-amz-security-token: %s\n", cr->session_token);
    int rc = -1;
    if (o.oom)
        snprintf(err, errlen, "out of memory");
    else
        rc = put(o.s, out, outlen, "the headers", err, errlen);
    if (!rc && canonical)
        rc = put(sr.canon.s, canonical, canonical_len, "the canonical request", err, errlen);
    signed_free(&sr);
    if (o.s)
        OPENSSL_cleanse(o.s, o.len);
    free(o.s);
    free(h);
    return rc;
}

int sigv4_presign_url(const sigv4_creds *cr, const sigv4_request *req, const char *scheme_host, long expires_s,
                      char *out, size_t outlen, char *err, size_t errlen)
{
    if (expires_s < 1 || expires_s > 604800) {
        snprintf(err, errlen, "sigv4: expiry %ld s is outside 1..604800", expires_s);
        return -1;
    }
    if (!scheme_host || strncmp(scheme_host, "http", 4) || !strstr(scheme_host, "://")) {
        snprintf(err, errlen, "sigv4: \"%s\" is not an http(s)://host", scheme_host ? scheme_host : "");
        return -1;
    }
    if (!cr || !cr->access_key || !cr->region || !cr->service || !req->amz_date) {
        snprintf(err, errlen, "sigv4: the access key, region, service and date are all required");
        return -1;
    }
    int tok = cr->session_token && *cr->session_token;
    char cred[320], exp[24];
    snprintf(cred, sizeof cred, "%s/%.8s/%s/%s/aws4_request", cr->access_key, req->amz_date, cr->region, cr->service);
    snprintf(exp, sizeof exp, "%ld", expires_s);
    sigv4_pair *q = malloc((size_t)(req->n_query + 6) * sizeof *q);
    if (!q) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int n = 0;
    for (int i = 0; i < req->n_query; i++)
        q[n++] = req->query[i];
    q[n++] = (sigv4_pair){"X-Amz-Algorithm", ALGO};
    q[n++] = (sigv4_pair){"X-Amz-Credential", cred};
    q[n++] = (sigv4_pair){"X-Amz-Date", req->amz_date};
    q[n++] = (sigv4_pair){"X-Amz-Expires", exp};
    q[n++] = (sigv4_pair){"X-Amz-SignedHeaders", "host"};
    if (tok)
        q[n++] = (sigv4_pair){"X-Amz-Security-Token", cr->session_token};
    sigv4_request r = *req;
    r.query = q;
    r.n_query = n;
    signed_req sr;
    if (sign_request(cr, &r, 0, SIGV4_UNSIGNED, &sr, err, errlen)) {
        free(q);
        return -1;
    }
    char *path = sigv4_encode(req->path, 1);
    strbuf o = {0};
    strbuf_printf(&o, "%s%s?", scheme_host, path ? path : "");
    for (int i = 0; i < sr.p.q.n; i++)
        strbuf_printf(&o, "%s=%s&", sr.p.q.v[i].name, sr.p.q.v[i].value);
    strbuf_printf(&o, "X-Amz-Signature=%s", sr.sig);
    int rc = -1;
    if (!path || o.oom)
        snprintf(err, errlen, "out of memory");
    else
        rc = put(o.s, out, outlen, "the URL", err, errlen);
    free(path);
    signed_free(&sr);
    free(o.s);
    free(q);
    return rc;
}
