/* storage/gguf_write.c — GGUF v3 writer (see gguf_write.h).
 *
 * Metadata is serialized into one growing byte buffer as it is added; tensor infos are
 * kept as a list so that offsets can be computed before any data is written. Data is
 * converted one row at a time into a small scratch buffer.
 */
#include "storage/gguf_write.h"
#include "storage/fileio.h"
#include "storage/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char *name;
    int n_dims;
    int64_t ne[4];
    ggw_type type;
    uint64_t offset, bytes;
} ggw_tinfo;

struct ggw {
    unsigned char *kv;           /* encoded key/values */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    char **keys;                 /* for duplicate detection */
    size_t n_keys, keys_cap;
    ggw_tinfo *t;
    size_t n_t, t_cap;
    uint64_t data_bytes;         /* sum of aligned tensor sizes */
    int fd;
    char *path, *tmp;
    size_t next;                 /* next tensor to write */
    uint64_t written;            /* data bytes written so far */
    unsigned char *scratch;
    size_t scratch_cap;
    int (*cancelled)(void *arg);
    void *cancel_arg;
};

void ggw_set_cancel(ggw *w, int (*fn)(void *arg), void *arg)
{
    w->cancelled = fn;
    w->cancel_arg = arg;
}

/* ---- conversions (F16/BF16 from storage/safetensors.c) ---- */

void ggw_quantize_q8_0(const float *x, int64_t k, uint8_t *out)
{
    for (int64_t b = 0; b < k / GGW_QK8_0; b++) {
        const float *v = x + b * GGW_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < GGW_QK8_0; j++)
            amax = fmaxf(amax, fabsf(v[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = st_f32_to_f16(d);
        uint8_t *blk = out + b * (2 + GGW_QK8_0);
        blk[0] = (uint8_t)(dh & 0xff);
        blk[1] = (uint8_t)(dh >> 8);
        for (int j = 0; j < GGW_QK8_0; j++)
            blk[2 + j] = (uint8_t)(int8_t)roundf(v[j] * id);
    }
}

size_t ggw_row_bytes(ggw_type t, int64_t n)
{
    switch (t) {
    case GGW_F32: return (size_t)n * 4;
    case GGW_F16:
    case GGW_BF16: return (size_t)n * 2;
    case GGW_Q8_0: return n % GGW_QK8_0 ? 0 : (size_t)(n / GGW_QK8_0) * (2 + GGW_QK8_0);
    }
    return 0;
}

/* ---- metadata ---- */

ggw *ggw_new(void)
{
    ggw *w = calloc(1, sizeof *w);
    if (w)
        w->fd = -1;
    return w;
}

void ggw_free(ggw *w)
{
    if (!w)
        return;
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp);
    }
    for (size_t i = 0; i < w->n_keys; i++)
        free(w->keys[i]);
    for (size_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->keys);
    free(w->t);
    free(w->kv);
    free(w->path);
    free(w->tmp);
    free(w->scratch);
    free(w);
}

static int buf_put(ggw *w, const void *p, size_t n)
{
    if (w->kv_len + n > w->kv_cap) {
        size_t nc = w->kv_cap ? w->kv_cap : 4096;
        while (nc < w->kv_len + n)
            nc *= 2;
        unsigned char *nb = realloc(w->kv, nc);
        if (!nb)
            return -1;
        w->kv = nb;
        w->kv_cap = nc;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return 0;
}

static int put_u32(ggw *w, uint32_t v) { return buf_put(w, &v, 4); }
static int put_u64(ggw *w, uint64_t v) { return buf_put(w, &v, 8); }

static int put_str(ggw *w, const char *s, size_t n)
{
    return put_u64(w, n) < 0 || buf_put(w, s, n) < 0 ? -1 : 0;
}

int ggw_has_key(const ggw *w, const char *key)
{
    for (size_t i = 0; i < w->n_keys; i++)
        if (!strcmp(w->keys[i], key))
            return 1;
    return 0;
}

/* Key and type header; records the key. */
static int put_key(ggw *w, const char *key, uint32_t type)
{
    if (ggw_has_key(w, key))
        return -1;
    if (w->n_keys == w->keys_cap) {
        size_t nc = w->keys_cap ? w->keys_cap * 2 : 32;
        char **nk = realloc(w->keys, nc * sizeof *nk);
        if (!nk)
            return -1;
        w->keys = nk;
        w->keys_cap = nc;
    }
    size_t n = strlen(key);
    char *k = malloc(n + 1);
    if (!k)
        return -1;
    memcpy(k, key, n + 1);
    w->keys[w->n_keys++] = k;
    w->n_kv++;
    return put_str(w, key, n) < 0 || put_u32(w, type) < 0 ? -1 : 0;
}

int ggw_kv_u32(ggw *w, const char *key, uint32_t v)
{
    return put_key(w, key, GGUF_T_U32) < 0 ? -1 : put_u32(w, v);
}

int ggw_kv_i32(ggw *w, const char *key, int32_t v)
{
    return put_key(w, key, GGUF_T_I32) < 0 ? -1 : buf_put(w, &v, 4);
}

int ggw_kv_f32(ggw *w, const char *key, float v)
{
    return put_key(w, key, GGUF_T_F32) < 0 ? -1 : buf_put(w, &v, 4);
}

int ggw_kv_bool(ggw *w, const char *key, int v)
{
    uint8_t b = v ? 1 : 0;
    return put_key(w, key, GGUF_T_BOOL) < 0 ? -1 : buf_put(w, &b, 1);
}

int ggw_kv_str(ggw *w, const char *key, const char *v)
{
    return put_key(w, key, GGUF_T_STRING) < 0 ? -1 : put_str(w, v, strlen(v));
}

static int put_arr_head(ggw *w, const char *key, uint32_t elem_type, size_t n)
{
    return put_key(w, key, GGUF_T_ARRAY) < 0 || put_u32(w, elem_type) < 0 || put_u64(w, n) < 0 ? -1 : 0;
}

int ggw_kv_arr_i32(ggw *w, const char *key, const int32_t *v, size_t n)
{
    return put_arr_head(w, key, GGUF_T_I32, n) < 0 ? -1 : buf_put(w, v, n * 4);
}

int ggw_kv_arr_u32(ggw *w, const char *key, const uint32_t *v, size_t n)
{
    return put_arr_head(w, key, GGUF_T_U32, n) < 0 ? -1 : buf_put(w, v, n * 4);
}

int ggw_kv_arr_f32(ggw *w, const char *key, const float *v, size_t n)
{
    return put_arr_head(w, key, GGUF_T_F32, n) < 0 ? -1 : buf_put(w, v, n * 4);
}

int ggw_kv_arr_str(ggw *w, const char *key, const char *const *s, const size_t *len, size_t n)
{
    if (put_arr_head(w, key, GGUF_T_STRING, n) < 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (put_str(w, s[i], len[i]) < 0)
            return -1;
    return 0;
}

int ggw_kv_raw(ggw *w, const char *key, uint32_t type, const void *bytes, size_t len)
{
    return put_key(w, key, type) < 0 ? -1 : buf_put(w, bytes, len);
}

/* ---- tensors ---- */

static uint64_t align_up(uint64_t v)
{
    return (v + GGW_ALIGNMENT - 1) / GGW_ALIGNMENT * GGW_ALIGNMENT;
}

int ggw_tensor(ggw *w, const char *name, const int64_t *ne, int n_dims, ggw_type type,
               char *err, size_t errlen)
{
    if (w->fd >= 0) {
        snprintf(err, errlen, "gguf: tensor '%s' declared after the header was written", name);
        return -1;
    }
    if (n_dims < 1 || n_dims > 4) {
        snprintf(err, errlen, "gguf: tensor '%s': %d dimensions (1..4 supported)", name, n_dims);
        return -1;
    }
    if (strlen(name) >= 64) {
        snprintf(err, errlen, "gguf: tensor name '%s' longer than llama.cpp's 63 bytes", name);
        return -1;
    }
    int64_t rows = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0) {
            snprintf(err, errlen, "gguf: tensor '%s': dimension %d is %lld", name, d, (long long)ne[d]);
            return -1;
        }
        if (d > 0)
            rows *= ne[d];
    }
    size_t rb = ggw_row_bytes(type, ne[0]);
    if (rb == 0) {
        snprintf(err, errlen, "gguf: tensor '%s': row length %lld is not a multiple of 32 (Q8_0)",
                 name, (long long)ne[0]);
        return -1;
    }
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) {
            snprintf(err, errlen, "gguf: duplicate tensor '%s'", name);
            return -1;
        }
    if (w->n_t == w->t_cap) {
        size_t nc = w->t_cap ? w->t_cap * 2 : 64;
        ggw_tinfo *nt = realloc(w->t, nc * sizeof *nt);
        if (!nt)
            goto oom;
        w->t = nt;
        w->t_cap = nc;
    }
    ggw_tinfo *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    size_t n = strlen(name);
    if (!(t->name = malloc(n + 1)))
        goto oom;
    memcpy(t->name, name, n + 1);
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++)
        t->ne[d] = ne[d];
    t->type = type;
    t->bytes = (uint64_t)rb * (uint64_t)rows;
    t->offset = w->data_bytes;
    w->data_bytes = align_up(w->data_bytes + t->bytes);
    if (rb > w->scratch_cap) {
        unsigned char *s = realloc(w->scratch, rb);
        if (!s)
            goto oom;
        w->scratch = s;
        w->scratch_cap = rb;
    }
    w->n_t++;
    return 0;
oom:
    snprintf(err, errlen, "gguf: out of memory");
    return -1;
}

static int write_zeros(int fd, size_t n)
{
    static const unsigned char z[GGW_ALIGNMENT];
    return n ? fio_write_all(fd, z, n) : 0;
}

int ggw_begin(ggw *w, const char *path, char *err, size_t errlen)
{
    size_t n = strlen(path);
    free(w->path);
    free(w->tmp);
    w->path = malloc(n + 1);
    w->tmp = malloc(n + 64);
    if (!w->path || !w->tmp || fio_temp_name(w->tmp, n + 64, path) < 0) {
        snprintf(err, errlen, "gguf: out of memory");
        return -1;
    }
    memcpy(w->path, path, n + 1);
    /* a name of its own: two writers of one path never write into one file */
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        snprintf(err, errlen, "gguf: create %s: %s", w->tmp, strerror(errno));
        return -1;
    }
    /* Header, metadata and tensor infos assembled in one buffer. */
    unsigned char *hdr = NULL;
    size_t cap = 24 + w->kv_len + w->n_t * (8 + 64 + 4 + 32 + 4 + 8) + GGW_ALIGNMENT, len = 0;
    if (!(hdr = malloc(cap))) {
        snprintf(err, errlen, "gguf: out of memory");
        return -1;
    }
#define PUT(p, k) do { memcpy(hdr + len, (p), (k)); len += (k); } while (0)
    uint32_t magic_version[2] = {0x46554747u, 3};   /* "GGUF" little-endian, v3 */
    uint64_t counts[2] = {w->n_t, w->n_kv};
    PUT(magic_version, 8);
    PUT(counts, 16);
    PUT(w->kv, w->kv_len);
    for (size_t i = 0; i < w->n_t; i++) {
        const ggw_tinfo *t = &w->t[i];
        uint64_t nl = strlen(t->name);
        uint32_t nd = (uint32_t)t->n_dims, ty = (uint32_t)t->type;
        PUT(&nl, 8);
        PUT(t->name, nl);
        PUT(&nd, 4);
        for (int d = 0; d < t->n_dims; d++) {
            uint64_t v = (uint64_t)t->ne[d];
            PUT(&v, 8);
        }
        PUT(&ty, 4);
        PUT(&t->offset, 8);
    }
#undef PUT
    size_t pad = (size_t)(align_up(len) - len);
    int rc = fio_write_all(w->fd, hdr, len) < 0 || write_zeros(w->fd, pad) < 0 ? -1 : 0;
    free(hdr);
    if (rc < 0) {
        snprintf(err, errlen, "gguf: write %s: %s", w->tmp, strerror(errno));
        return -1;
    }
    w->next = 0;
    w->written = 0;
    return 0;
}

int ggw_write_tensor(ggw *w, const float *data, int64_t n, char *err, size_t errlen)
{
    if (w->fd < 0 || w->next >= w->n_t) {
        snprintf(err, errlen, "gguf: no tensor left to write (or header not written)");
        return -1;
    }
    if (w->cancelled && w->cancelled(w->cancel_arg)) {
        snprintf(err, errlen, "export cancelled");
        return -1;
    }
    const ggw_tinfo *t = &w->t[w->next];
    int64_t count = 1;
    for (int d = 0; d < t->n_dims; d++)
        count *= t->ne[d];
    if (n != count) {
        snprintf(err, errlen, "gguf: tensor '%s' has %lld elements, got %lld", t->name,
                 (long long)count, (long long)n);
        return -1;
    }
    int64_t row = t->ne[0], rows = count / row;
    size_t rb = ggw_row_bytes(t->type, row);
    for (int64_t r = 0; r < rows; r++) {
        const float *x = data + r * row;
        unsigned char *s = w->scratch;
        switch (t->type) {
        case GGW_F32:
            memcpy(s, x, rb);
            break;
        case GGW_F16:
            for (int64_t j = 0; j < row; j++) {
                uint16_t h = st_f32_to_f16(x[j]);
                memcpy(s + 2 * j, &h, 2);
            }
            break;
        case GGW_BF16:
            for (int64_t j = 0; j < row; j++) {
                uint16_t h = st_f32_to_bf16(x[j]);
                memcpy(s + 2 * j, &h, 2);
            }
            break;
        case GGW_Q8_0:
            ggw_quantize_q8_0(x, row, s);
            break;
        }
        if (fio_write_all(w->fd, s, rb) < 0) {
            snprintf(err, errlen, "gguf: write %s: %s", w->tmp, strerror(errno));
            return -1;
        }
    }
    uint64_t end = t->offset + t->bytes;
    if (write_zeros(w->fd, (size_t)(align_up(end) - end)) < 0) {
        snprintf(err, errlen, "gguf: write %s: %s", w->tmp, strerror(errno));
        return -1;
    }
    w->written = align_up(end);
    w->next++;
    return 0;
}

int ggw_finish(ggw *w, char *err, size_t errlen)
{
    if (w->fd < 0) {
        snprintf(err, errlen, "gguf: header not written");
        return -1;
    }
    int rc = -1;
    if (w->next != w->n_t) {
        snprintf(err, errlen, "gguf: %zu of %zu tensors written", w->next, w->n_t);
    } else if (fsync(w->fd) < 0) {
        snprintf(err, errlen, "gguf: fsync %s: %s", w->tmp, strerror(errno));
    } else {
        int c = close(w->fd);
        w->fd = -1;
        if (c < 0)
            snprintf(err, errlen, "gguf: close %s: %s", w->tmp, strerror(errno));
        else if (rename(w->tmp, w->path) < 0)
            snprintf(err, errlen, "gguf: rename %s: %s", w->tmp, strerror(errno));
        else {
            (void)fio_fsync_parent(w->path);   /* the rename durable (best effort, as fio_write_atomic) */
            return 0;
        }
        unlink(w->tmp);
        return -1;
    }
    close(w->fd);
    w->fd = -1;
    unlink(w->tmp);
    return rc;
}
