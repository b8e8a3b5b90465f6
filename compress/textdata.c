/* compress/textdata.c — reading documents, packing token streams, batching.
 * Documents are split by format (paragraphs, jsonl "text", "<|endoftext|>" lines);
 * the order is shuffled with a seeded xorshift so the same seed always gives the same
 * streams. Nothing here knows a tokenizer: callers pass an encode callback.
 */
#include "compress/textdata.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>

#include "engine/tokenizer.h"
#include "storage/fileio.h"
#include "engine/rng.h"

const char *td_format_name(td_format fmt)
{
    switch (fmt) {
    case TD_FMT_PLAIN: return "plain";
    case TD_FMT_JSONL: return "jsonl";
    case TD_FMT_STORIES: return "stories";
    default: return "auto";
    }
}

/* Read a whole file into a NUL-terminated buffer with CRLF turned into LF. */
static char *read_file(const char *path, size_t *len, char *err, size_t errlen)
{
    size_t n;
    char *buf = fio_read_all(path, TD_MAX_FILE_BYTES, &n, err, errlen);
    if (!buf)
        return NULL;
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (!(buf[i] == '\r' && i + 1 < n && buf[i + 1] == '\n'))
            buf[w++] = buf[i];
    buf[w] = 0;
    *len = w;
    return buf;
}

static int is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
            return 0;
    return 1;
}

/* A line that separates TinyStories documents ("<|endoftext|>", or the "</endoftext/>"
 * spelling some copies use), surrounding blanks allowed. */
static int is_sep_line(const char *s, size_t n)
{
    while (n && (*s == ' ' || *s == '\t')) {
        s++;
        n--;
    }
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        n--;
    return (n == 13 && !memcmp(s, "<|endoftext|>", 13)) || (n == 13 && !memcmp(s, "</endoftext/>", 13));
}

static int docs_push(td_docs *d, size_t *cap, const char *s, size_t n)
{
    /* trim leading/trailing newlines and spaces */
    while (n && (*s == '\n' || *s == ' ')) {
        s++;
        n--;
    }
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' '))
        n--;
    if (n == 0)
        return 0;
    if (d->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        char **nt = realloc(d->text, nc * sizeof *nt);
        if (!nt)
            return -1;
        d->text = nt;
        size_t *nl = realloc(d->len, nc * sizeof *nl);
        if (!nl)
            return -1;
        d->len = nl;
        *cap = nc;
    }
    char *c = malloc(n + 1);
    if (!c)
        return -1;
    memcpy(c, s, n);
    c[n] = 0;
    d->text[d->n] = c;
    d->len[d->n] = n;
    d->n++;
    return 0;
}

static td_format detect(const char *path, const char *buf, size_t len)
{
    if (fio_has_suffix(path, ".jsonl") || fio_has_suffix(path, ".json"))
        return TD_FMT_JSONL;
    const char *p = buf, *end = buf + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if (is_sep_line(p, (size_t)(le - p)))
            return TD_FMT_STORIES;
        p = le + 1;
    }
    return TD_FMT_PLAIN;
}

int td_detect_format(const char *path)
{
    char err[256];
    size_t len;
    char *buf = read_file(path, &len, err, sizeof err);
    if (!buf)
        return -1;
    td_format f = detect(path, buf, len);
    free(buf);
    return (int)f;
}

static int split_lines(const char *path, const char *buf, size_t len, td_format fmt, td_docs *d,
                       char *err, size_t errlen)
{
    size_t cap = 0, line_no = 0;
    const char *p = buf, *end = buf + len, *doc = buf;
    while (p <= end) {
        const char *nl = p < end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
        const char *le = nl ? nl : end;
        size_t n = (size_t)(le - p);
        line_no++;
        if (fmt == TD_FMT_JSONL) {
            if (!is_blank(p, n)) {
                json_error_t je;
                json_t *j = json_loadb(p, n, JSON_REJECT_DUPLICATES, &je);
                if (!j) {
                    snprintf(err, errlen, "%s:%zu: bad JSON: %s", path, line_no, je.text);
                    return -1;
                }
                json_t *t = json_is_object(j) ? json_object_get(j, "text") : NULL;
                if (!json_is_string(t)) {
                    json_decref(j);
                    snprintf(err, errlen, "%s:%zu: no \"text\" string field", path, line_no);
                    return -1;
                }
                int rc = docs_push(d, &cap, json_string_value(t), json_string_length(t));
                json_decref(j);
                if (rc)
                    goto oom;
            }
        } else {
            int boundary = fmt == TD_FMT_STORIES ? is_sep_line(p, n) : is_blank(p, n);
            if (boundary || !nl) {
                const char *stop = boundary ? p : end;
                if (docs_push(d, &cap, doc, (size_t)(stop - doc)))
                    goto oom;
                doc = nl ? nl + 1 : end;
            }
        }
        if (!nl)
            break;
        p = nl + 1;
    }
    return 0;
oom:
    snprintf(err, errlen, "%s: out of memory", path);
    return -1;
}

int td_read_docs(const char *path, td_format fmt, td_docs *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    size_t len;
    char *buf = read_file(path, &len, err, errlen);
    if (!buf)
        return -1;
    if (fmt == TD_FMT_AUTO)
        fmt = detect(path, buf, len);
    int rc = split_lines(path, buf, len, fmt, out, err, errlen);
    free(buf);
    if (rc == 0 && out->n == 0) {
        snprintf(err, errlen, "%s: no documents (format %s)", path, td_format_name(fmt));
        rc = -1;
    }
    if (rc)
        td_docs_free(out);
    return rc;
}

void td_docs_free(td_docs *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n; i++)
        free(d->text[i]);
    free(d->text);
    free(d->len);
    memset(d, 0, sizeof *d);
}

void td_stream_free(td_stream *s)
{
    if (!s)
        return;
    free(s->ids);
    s->ids = NULL;
    s->n = 0;
}

static int stream_append(td_stream *s, size_t *cap, const int *ids, size_t n)
{
    if (s->n + n > *cap) {
        size_t nc = *cap ? *cap : 4096;
        while (nc < s->n + n)
            nc *= 2;
        int *ni = realloc(s->ids, nc * sizeof *ni);
        if (!ni)
            return -1;
        s->ids = ni;
        *cap = nc;
    }
    memcpy(s->ids + s->n, ids, n * sizeof *ids);
    s->n += n;
    return 0;
}

/* The length of the next piece of a document's len bytes at text to encode at once: all
 * of it up to TD_CHUNK_BYTES, else cut after the last newline (else before the last
 * space) in its second half, else at a UTF-8 character's start (not UTF-8: anywhere). A document of gigabytes on one line is encoded in
 * pieces of bounded memory, and only until the stream's limit. */
#define TD_CHUNK_BYTES ((size_t)16 << 20)
static size_t chunk_len(const char *text, size_t len)
{
    if (len <= TD_CHUNK_BYTES)
        return len;
    for (size_t i = TD_CHUNK_BYTES; i > TD_CHUNK_BYTES / 2; i--)
        if (text[i - 1] == '\n')
            return i;
    for (size_t i = TD_CHUNK_BYTES; i > TD_CHUNK_BYTES / 2; i--)
        if (text[i - 1] == ' ')
            return i - 1;   /* before the space: tokenizers join a space to the word after it */
    size_t i = TD_CHUNK_BYTES;   /* a character's start: at most 3 continuation bytes back */
    while (i > TD_CHUNK_BYTES - 3 && ((unsigned char)text[i] & 0xc0) == 0x80)
        i--;
    return ((unsigned char)text[i] & 0xc0) == 0x80 ? TD_CHUNK_BYTES : i;
}

/* Encode document d and append [sep] + ids to s, stopping at limit tokens (0: none). */
static int pack_doc(const td_docs *docs, size_t d, td_encode_fn enc, void *ctx, int sep,
                    td_stream *s, size_t *cap, size_t limit, char *err, size_t errlen)
{
    if (sep >= 0 && stream_append(s, cap, &sep, 1)) {
        snprintf(err, errlen, "out of memory packing tokens");
        return -1;
    }
    const char *text = docs->text[d];
    for (size_t left = docs->len[d]; left > 0 && !(limit && s->n >= limit);) {
        size_t k = chunk_len(text, left);
        int *ids = NULL;
        size_t n = 0;
        if (enc(ctx, text, k, &ids, &n, err, errlen))
            return -1;
        if (limit && s->n + n > limit)
            n = limit - s->n;
        int rc = stream_append(s, cap, ids, n);
        free(ids);
        if (rc) {
            snprintf(err, errlen, "out of memory packing tokens");
            return -1;
        }
        text += k;
        left -= k;
    }
    return 0;
}

int td_pack(const td_docs *docs, td_encode_fn enc, void *enc_ctx, const td_pack_opts *o,
            td_stream *train, td_stream *val, char *err, size_t errlen)
{
    memset(train, 0, sizeof *train);
    if (val)
        memset(val, 0, sizeof *val);
    if (docs->n == 0) {
        snprintf(err, errlen, "no documents to pack");
        return -1;
    }
    if (o->val_fraction < 0 || o->val_fraction >= 1) {
        snprintf(err, errlen, "val_fraction %g must be in [0, 1)", o->val_fraction);
        return -1;
    }
    size_t *order = malloc(docs->n * sizeof *order);
    if (!order) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < docs->n; i++)
        order[i] = i;
    uint64_t rng = o->seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = docs->n - 1; i > 0; i--) {
        size_t j = (size_t)(eng_xorshift64star(&rng) % (i + 1));
        size_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    size_t n_val = 0;
    if (val && o->val_fraction > 0 && docs->n >= 2) {
        double want = (double)docs->n * o->val_fraction;
        n_val = (size_t)want;
        if ((double)n_val < want)
            n_val++;
        if (n_val < 1)
            n_val = 1;
        if (n_val >= docs->n)
            n_val = docs->n - 1;
    }
    size_t n_train = docs->n - n_val, tcap = 0, vcap = 0;
    size_t vlimit = o->max_tokens ? (size_t)((double)o->max_tokens * (o->val_fraction > 0 ? o->val_fraction : 0)) + 4096 : 0;
    int rc = 0;
    for (size_t i = 0; i < n_train && !rc; i++) {
        if (o->max_tokens && train->n >= o->max_tokens)
            break;
        rc = pack_doc(docs, order[i], enc, enc_ctx, o->sep_token, train, &tcap, o->max_tokens, err, errlen);
    }
    for (size_t i = n_train; i < docs->n && !rc; i++) {
        if (vlimit && val->n >= vlimit)
            break;
        rc = pack_doc(docs, order[i], enc, enc_ctx, o->sep_token, val, &vcap, vlimit, err, errlen);
    }
    free(order);
    if (!rc && val && n_val == 0 && o->val_fraction > 0) {
        /* a single document: hold out its last tokens */
        size_t nv = (size_t)((double)train->n * o->val_fraction);
        if (nv > 0 && nv < train->n) {
            val->ids = malloc(nv * sizeof *val->ids);
            if (!val->ids) {
                snprintf(err, errlen, "out of memory");
                rc = -1;
            } else {
                memcpy(val->ids, train->ids + train->n - nv, nv * sizeof *val->ids);
                val->n = nv;
                train->n -= nv;
            }
        }
    }
    if (!rc && train->n == 0) {
        snprintf(err, errlen, "the documents encode to no tokens");
        rc = -1;
    }
    if (rc) {
        td_stream_free(train);
        td_stream_free(val);
    }
    return rc;
}

int td_batch(const td_stream *s, uint64_t *cursor, int B, int T, int *tokens, int *targets)
{
    if (B <= 0 || T <= 0 || s->n < (size_t)T + 1)
        return -1;
    uint64_t c = *cursor;
    for (int b = 0; b < B; b++) {
        if (c + (uint64_t)T + 1 > s->n)
            c = 0;
        memcpy(tokens + (size_t)b * T, s->ids + c, (size_t)T * sizeof *tokens);
        if (targets)
            memcpy(targets + (size_t)b * T, s->ids + c + 1, (size_t)T * sizeof *targets);
        c += (uint64_t)T;
    }
    *cursor = c;
    return 0;
}

int td_encode_tok(void *ctx, const char *text, size_t len, int **ids, size_t *n, char *err, size_t errlen)
{
    return tok_encode((const tok_tokenizer *)ctx, text, len, 0, 0, ids, n, err, errlen);
}

uint64_t td_ids_hash(const int *ids, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)ids[i]) * 1099511628211ull;
    return h;
}
