/* storage/gguf.c — GGUF reader. A cursor walks the header with a bound check on every
 * read; tensor data must lie inside the file at the declared alignment. Limits: at most
 * 1M keys and tensors, 4 dimensions, names up to 95 bytes.
 */
#include "storage/gguf.h"
#include "storage/gguf_families.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/fileio.h"
#include "storage/llama2c.h"
#include "storage/safetensors.h"

typedef struct {
    const uint8_t *p;
    size_t len, pos;
    char *err;
    size_t errlen;
} cursor;

static int need(cursor *c, uint64_t n, const char *what)
{
    if (n > c->len - c->pos) {
        snprintf(c->err, c->errlen, "GGUF: %s at byte %zu runs past the end of the file (%zu bytes)", what, c->pos,
                 c->len);
        return -1;
    }
    return 0;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what)
{
    if (need(c, 4, what))
        return -1;
    memcpy(v, c->p + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what)
{
    if (need(c, 8, what))
        return -1;
    memcpy(v, c->p + c->pos, 8);
    c->pos += 8;
    return 0;
}

static int rd_str(cursor *c, const char **s, size_t *n, const char *what)
{
    uint64_t l;
    if (rd_u64(c, &l, what) || need(c, l, what))
        return -1;
    *s = (const char *)c->p + c->pos;
    *n = (size_t)l;
    c->pos += (size_t)l;
    return 0;
}

static size_t scalar_size(uint32_t t)
{
    switch (t) {
    case GGUF_T_U8: case GGUF_T_I8: case GGUF_T_BOOL: return 1;
    case GGUF_T_U16: case GGUF_T_I16: return 2;
    case GGUF_T_U32: case GGUF_T_I32: case GGUF_T_F32: return 4;
    case GGUF_T_U64: case GGUF_T_I64: case GGUF_T_F64: return 8;
    default: return 0;
    }
}

static int parse_kv(cursor *c, gguf_kv *kv)
{
    const char *k;
    size_t kl;
    if (rd_str(c, &k, &kl, "metadata key") || rd_u32(c, &kv->type, "metadata type"))
        return -1;
    kv->key = k;
    kv->key_len = kl;
    if (kv->type == GGUF_T_STRING) {
        kv->off = c->pos;
        const char *s;
        size_t n;
        return rd_str(c, &s, &n, "metadata string");
    }
    if (kv->type == GGUF_T_ARRAY) {
        if (rd_u32(c, &kv->arr_type, "array type") || rd_u64(c, &kv->arr_n, "array length"))
            return -1;
        kv->off = c->pos;
        if (kv->arr_type == GGUF_T_STRING) {
            if (kv->arr_n > (c->len - c->pos) / 8) {
                snprintf(c->err, c->errlen, "GGUF: key %.*s: %llu strings cannot fit in the file", (int)kl, k,
                         (unsigned long long)kv->arr_n);
                return -1;
            }
            kv->str_off = malloc((size_t)(kv->arr_n ? kv->arr_n : 1) * sizeof *kv->str_off);
            if (!kv->str_off) {
                snprintf(c->err, c->errlen, "out of memory");
                return -1;
            }
            for (uint64_t i = 0; i < kv->arr_n; i++) {
                const char *s;
                size_t n;
                kv->str_off[i] = c->pos;
                if (rd_str(c, &s, &n, "array string"))
                    return -1;
            }
            return 0;
        }
        size_t es = scalar_size(kv->arr_type);
        if (!es) {
            snprintf(c->err, c->errlen, "GGUF: key %.*s: array item type %u is not supported", (int)kl, k, kv->arr_type);
            return -1;
        }
        if (kv->arr_n > (c->len - c->pos) / es)
            return need(c, UINT64_MAX, "array data");
        c->pos += (size_t)(kv->arr_n * es);
        return 0;
    }
    size_t es = scalar_size(kv->type);
    if (!es) {
        snprintf(c->err, c->errlen, "GGUF: key %.*s: value type %u is unknown", (int)kl, k, kv->type);
        return -1;
    }
    kv->off = c->pos;
    if (need(c, es, "metadata value"))
        return -1;
    c->pos += es;
    return 0;
}

static int type_block(uint32_t type, int64_t *elems, int64_t *bytes)
{
    switch (type) {
    case GGML_F32: *elems = 1; *bytes = 4; return 0;
    case GGML_F16: case GGML_BF16: *elems = 1; *bytes = 2; return 0;
    case GGML_Q4_0: *elems = 32; *bytes = 18; return 0;
    case GGML_Q4_1: *elems = 32; *bytes = 20; return 0;
    case GGML_Q8_0: *elems = 32; *bytes = 34; return 0;
    default: return -1;
    }
}

const char *gguf_type_name(uint32_t type)
{
    switch (type) {
    case GGML_F32: return "F32";
    case GGML_F16: return "F16";
    case GGML_BF16: return "BF16";
    case GGML_Q4_0: return "Q4_0";
    case GGML_Q4_1: return "Q4_1";
    case GGML_Q8_0: return "Q8_0";
    default: return "?";
    }
}

static int cmp_key(const void *a, const void *b)
{
    const gguf_kv *x = *(const gguf_kv *const *)a, *y = *(const gguf_kv *const *)b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* A key written twice is refused (llama.cpp refuses it too): which copy a reader takes is
 * up to the reader. 0, or -1 with err naming it. */
static int unique_keys(const gguf_file *g, char *err, size_t errlen)
{
    const gguf_kv **k = malloc(sizeof *k * (size_t)(g->n_kv ? g->n_kv : 1));
    if (!k) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < g->n_kv; i++)
        k[i] = &g->kv[i];
    qsort(k, (size_t)g->n_kv, sizeof *k, cmp_key);
    int rc = 0;
    for (int i = 1; i < g->n_kv && !rc; i++)
        if (!cmp_key(&k[i - 1], &k[i])) {
            snprintf(err, errlen, "GGUF: key %.*s appears more than once", (int)(k[i]->key_len < 200 ? k[i]->key_len : 200),
                     k[i]->key);
            rc = -1;
        }
    free(k);
    return rc;
}

static int parse(gguf_file *g, char *err, size_t errlen)
{
    cursor c = {g->base, g->len, 0, err, errlen};
    uint32_t magic;
    uint64_t nt, nkv;
    if (rd_u32(&c, &magic, "magic"))
        return -1;
    if (magic != 0x46554747u) {
        snprintf(err, errlen, "GGUF: bad magic (not a GGUF file)");
        return -1;
    }
    if (rd_u32(&c, &g->version, "version") || rd_u64(&c, &nt, "tensor count") || rd_u64(&c, &nkv, "key count"))
        return -1;
    if (g->version < 2 || g->version > 3) {
        snprintf(err, errlen, "GGUF: version %u is not supported (2 or 3)", g->version);
        return -1;
    }
    if (nt > (1 << 20) || nkv > (1 << 20) || nkv > g->len / 12 || nt > g->len / 24) {
        snprintf(err, errlen, "GGUF: %llu tensors / %llu keys is implausible for a %zu-byte file",
                 (unsigned long long)nt, (unsigned long long)nkv, g->len);
        return -1;
    }
    g->kv = calloc((size_t)(nkv ? nkv : 1), sizeof *g->kv);
    g->t = calloc((size_t)(nt ? nt : 1), sizeof *g->t);
    if (!g->kv || !g->t) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (uint64_t i = 0; i < nkv; i++) {
        g->n_kv = (int)i + 1;
        if (parse_kv(&c, &g->kv[i]))
            return -1;
        g->kv[i].end = c.pos;
    }
    if (unique_keys(g, err, errlen))
        return -1;
    uint64_t align = 32;
    int64_t av;
    if (gguf_find(g, "general.alignment") >= 0 && gguf_get_int(g, "general.alignment", &av)) {
        snprintf(err, errlen, "GGUF: general.alignment is not an integer");
        return -1;
    }
    if (gguf_find(g, "general.alignment") >= 0) {
        if (av <= 0 || av > 65536 || (av & (av - 1))) {
            snprintf(err, errlen, "GGUF: general.alignment %lld is not a power of two", (long long)av);
            return -1;
        }
        align = (uint64_t)av;
    }
    for (uint64_t i = 0; i < nt; i++) {
        gguf_tensor *t = &g->t[i];
        const char *name;
        size_t nl;
        uint32_t nd;
        g->n_tensors = (int)i + 1;
        if (rd_str(&c, &name, &nl, "tensor name") || rd_u32(&c, &nd, "tensor dims"))
            return -1;
        if (nl >= sizeof t->name || memchr(name, 0, nl)) {
            snprintf(err, errlen, "GGUF: tensor %llu: name is too long or holds NUL", (unsigned long long)i);
            return -1;
        }
        memcpy(t->name, name, nl);
        t->name[nl] = '\0';
        if (nd < 1 || nd > 4) {
            snprintf(err, errlen, "GGUF: tensor %s: %u dimensions (1..4 supported)", t->name, nd);
            return -1;
        }
        t->n_dims = (int)nd;
        uint64_t numel = 1;
        for (int d = 0; d < 4; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t v;
            if (rd_u64(&c, &v, "tensor dim"))
                return -1;
            if (v == 0 || v > (1ULL << 40) || numel > (1ULL << 40) / v) {
                snprintf(err, errlen, "GGUF: tensor %s: dimension %u = %llu is out of range or overflows", t->name, d,
                         (unsigned long long)v);
                return -1;
            }
            t->ne[d] = (int64_t)v;
            numel *= v;
        }
        t->numel = (int64_t)numel;
        uint64_t off;
        if (rd_u32(&c, &t->type, "tensor type") || rd_u64(&c, &off, "tensor offset"))
            return -1;
        int64_t be, bb;
        if (type_block(t->type, &be, &bb)) {
            snprintf(err, errlen, "GGUF: tensor %s: ggml type %u is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1)",
                     t->name, t->type);
            return -1;
        }
        if (t->ne[0] % be) {
            snprintf(err, errlen, "GGUF: tensor %s: row length %lld is not a multiple of the block size %lld", t->name,
                     (long long)t->ne[0], (long long)be);
            return -1;
        }
        t->nbytes = numel / (uint64_t)be * (uint64_t)bb;
        t->offset = off;   /* relative for now */
        if (off % align) {
            snprintf(err, errlen, "GGUF: tensor %s: offset %llu is not aligned to %llu", t->name,
                     (unsigned long long)off, (unsigned long long)align);
            return -1;
        }
    }
    g->data_off = (c.pos + align - 1) / align * align;
    for (int i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->t[i];
        if (g->data_off > g->len || t->offset > g->len - g->data_off || t->nbytes > g->len - g->data_off - t->offset) {
            snprintf(err, errlen, "GGUF: tensor %s: data [%llu, +%llu) lies past the end of the file (%zu bytes; truncated?)",
                     t->name, (unsigned long long)(g->data_off + t->offset), (unsigned long long)t->nbytes, g->len);
            return -1;
        }
        t->offset += g->data_off;
    }
    return 0;
}

int gguf_open_mem(gguf_file *g, const void *buf, size_t len, char *err, size_t errlen)
{
    memset(g, 0, sizeof *g);
    g->base = g->meta = buf;
    g->len = len;
    if (parse(g, err, errlen)) {
        gguf_close(g);
        return -1;
    }
    return 0;
}

/* Move the metadata reads of a parsed g from its map to a copy of bytes [0, data_off),
 * within the file: a file without tensors may end before its header's aligned end (the
 * tensors' check keeps data_off inside the file for the others). */
static int copy_meta(gguf_file *g, char *err, size_t errlen)
{
    size_t n = g->data_off < g->len ? (size_t)g->data_off : g->len;
    if (!(g->meta_copy = malloc(n ? n : 1))) {
        snprintf(err, errlen, "out of memory for %zu bytes of GGUF metadata", n);
        return -1;
    }
    memcpy(g->meta_copy, g->base, n);
    for (int i = 0; i < g->n_kv; i++)
        g->kv[i].key = (const char *)g->meta_copy + ((const uint8_t *)g->kv[i].key - g->base);
    g->meta = g->meta_copy;
    return 0;
}

int gguf_open(gguf_file *g, const char *path, char *err, size_t errlen)
{
    memset(g, 0, sizeof *g);
    void *m;
    size_t len;
    if (fio_map(path, 24, "a GGUF file", &m, &len, err, errlen))
        return -1;
    g->map = m;
    g->base = g->meta = m;
    g->len = len;
    fio_guard guard;
    if (sigsetjmp(guard.jb, 1)) {
        snprintf(err, errlen, "%s: GGUF: the file ended under its metadata (cut short or rewritten while it opened)",
                 path);
        gguf_close(g);
        return -1;
    }
    fio_guard_enter(&guard);
    int rc = parse(g, err, errlen) || copy_meta(g, err, errlen);
    fio_guard_leave(&guard);
    if (rc) {
        fio_err_path(err, errlen, path);
        gguf_close(g);
        return -1;
    }
    return 0;
}

void gguf_close(gguf_file *g)
{
    for (int i = 0; g->kv && i < g->n_kv; i++)
        free(g->kv[i].str_off);
    free(g->kv);
    free(g->t);
    free(g->meta_copy);
    fio_unmap(g->map, g->len);
    memset(g, 0, sizeof *g);
}

/* ---------- metadata ---------- */

int gguf_find(const gguf_file *g, const char *key)
{
    size_t n = strlen(key);
    for (int i = 0; i < g->n_kv; i++)
        if (g->kv[i].key_len == n && !memcmp(g->kv[i].key, key, n))
            return i;
    return -1;
}

static int scalar_int(const uint8_t *p, uint32_t type, int64_t *v)
{
    switch (type) {
    case GGUF_T_U8: case GGUF_T_BOOL: *v = p[0]; return 0;
    case GGUF_T_I8: *v = (int8_t)p[0]; return 0;
    case GGUF_T_U16: { uint16_t x; memcpy(&x, p, 2); *v = x; return 0; }
    case GGUF_T_I16: { int16_t x; memcpy(&x, p, 2); *v = x; return 0; }
    case GGUF_T_U32: { uint32_t x; memcpy(&x, p, 4); *v = x; return 0; }
    case GGUF_T_I32: { int32_t x; memcpy(&x, p, 4); *v = x; return 0; }
    case GGUF_T_U64: { uint64_t x; memcpy(&x, p, 8); if (x > INT64_MAX) return -1; *v = (int64_t)x; return 0; }
    case GGUF_T_I64: { int64_t x; memcpy(&x, p, 8); *v = x; return 0; }
    default: return -1;
    }
}

static int scalar_float(const uint8_t *p, uint32_t type, double *v)
{
    if (type == GGUF_T_F32) { float x; memcpy(&x, p, 4); *v = x; return 0; }
    if (type == GGUF_T_F64) { double x; memcpy(&x, p, 8); *v = x; return 0; }
    int64_t i;
    if (scalar_int(p, type, &i))
        return -1;
    *v = (double)i;
    return 0;
}

int gguf_get_int(const gguf_file *g, const char *key, int64_t *v)
{
    int i = gguf_find(g, key);
    return i < 0 ? -1 : scalar_int(g->meta + g->kv[i].off, g->kv[i].type, v);
}

int gguf_get_float(const gguf_file *g, const char *key, double *v)
{
    int i = gguf_find(g, key);
    return i < 0 ? -1 : scalar_float(g->meta + g->kv[i].off, g->kv[i].type, v);
}

int gguf_get_str(const gguf_file *g, const char *key, const char **s, size_t *len)
{
    int i = gguf_find(g, key);
    if (i < 0 || g->kv[i].type != GGUF_T_STRING)
        return -1;
    uint64_t l;
    memcpy(&l, g->meta + g->kv[i].off, 8);
    *s = (const char *)g->meta + g->kv[i].off + 8;
    *len = (size_t)l;
    return 0;
}

int gguf_get_arr(const gguf_file *g, const char *key, uint32_t *item_type, uint64_t *n)
{
    int i = gguf_find(g, key);
    if (i < 0 || g->kv[i].type != GGUF_T_ARRAY)
        return -1;
    *item_type = g->kv[i].arr_type;
    *n = g->kv[i].arr_n;
    return i;
}

int gguf_arr_int(const gguf_file *g, int kv, uint64_t i, int64_t *v)
{
    if (kv < 0 || kv >= g->n_kv || g->kv[kv].type != GGUF_T_ARRAY || i >= g->kv[kv].arr_n ||
        g->kv[kv].arr_type == GGUF_T_STRING)
        return -1;
    size_t es = scalar_size(g->kv[kv].arr_type);
    return scalar_int(g->meta + g->kv[kv].off + i * es, g->kv[kv].arr_type, v);
}

int gguf_arr_float(const gguf_file *g, int kv, uint64_t i, double *v)
{
    if (kv < 0 || kv >= g->n_kv || g->kv[kv].type != GGUF_T_ARRAY || i >= g->kv[kv].arr_n ||
        g->kv[kv].arr_type == GGUF_T_STRING)
        return -1;
    size_t es = scalar_size(g->kv[kv].arr_type);
    return scalar_float(g->meta + g->kv[kv].off + i * es, g->kv[kv].arr_type, v);
}

int gguf_arr_str(const gguf_file *g, int kv, uint64_t i, const char **s, size_t *len)
{
    if (kv < 0 || kv >= g->n_kv || g->kv[kv].type != GGUF_T_ARRAY || g->kv[kv].arr_type != GGUF_T_STRING ||
        i >= g->kv[kv].arr_n)
        return -1;
    uint64_t l, o = g->kv[kv].str_off[i];
    memcpy(&l, g->meta + o, 8);
    *s = (const char *)g->meta + o + 8;
    *len = (size_t)l;
    return 0;
}

int gguf_kv_raw(const gguf_file *g, int kv, const void **bytes, size_t *len)
{
    if (kv < 0 || kv >= g->n_kv)
        return -1;
    const gguf_kv *k = &g->kv[kv];
    size_t start = (size_t)((const uint8_t *)k->key - g->meta) + k->key_len + 4;   /* past the type */
    *bytes = g->meta + start;
    *len = (size_t)(k->end - start);
    return 0;
}

/* ---------- tensors ---------- */

/* Bytes per 32 elements of a type gguf_read_f32 converts, or -1. */
static int64_t block32_bytes(uint32_t type)
{
    switch (type) {
    case GGML_F32:
        return 128;
    case GGML_F16:
    case GGML_BF16:
        return 64;
    case GGML_Q8_0:
        return 34;
    case GGML_Q4_0:
        return 18;
    case GGML_Q4_1:
        return 20;
    default:
        return -1;
    }
}

/* n elements of type (one block32_bytes knows; quantized: n a multiple of 32) at p into
 * out as fp32. */
static void convert_f32(uint32_t type, const uint8_t *p, float *out, int64_t n)
{
    int64_t nb = n / 32;
    switch (type) {
    case GGML_F32:
        memcpy(out, p, (size_t)n * 4);
        break;
    case GGML_F16:
    case GGML_BF16:
        for (int64_t k = 0; k < n; k++) {
            uint16_t h = (uint16_t)(p[2 * k] | (p[2 * k + 1] << 8));
            out[k] = type == GGML_F16 ? st_f16_to_f32(h) : st_bf16_to_f32(h);
        }
        break;
    case GGML_Q8_0:
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *q = p + b * 34;
            float d = st_f16_to_f32((uint16_t)(q[0] | (q[1] << 8)));
            for (int j = 0; j < 32; j++)
                out[b * 32 + j] = d * (float)(int8_t)q[2 + j];
        }
        break;
    case GGML_Q4_0:
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *q = p + b * 18;
            float d = st_f16_to_f32((uint16_t)(q[0] | (q[1] << 8)));
            for (int j = 0; j < 16; j++) {
                out[b * 32 + j] = d * (float)((q[2 + j] & 0xF) - 8);
                out[b * 32 + j + 16] = d * (float)((q[2 + j] >> 4) - 8);
            }
        }
        break;
    case GGML_Q4_1:
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *q = p + b * 20;
            float d = st_f16_to_f32((uint16_t)(q[0] | (q[1] << 8)));
            float m = st_f16_to_f32((uint16_t)(q[2] | (q[3] << 8)));
            for (int j = 0; j < 16; j++) {
                out[b * 32 + j] = d * (float)(q[4 + j] & 0xF) + m;
                out[b * 32 + j + 16] = d * (float)(q[4 + j] >> 4) + m;
            }
        }
        break;
    }
}

int gguf_read_f32(const gguf_file *g, int i, float *out, int64_t n, char *err, size_t errlen)
{
    return gguf_read_f32_sub(g, i, 0, 1, out, n, err, errlen);
}

int gguf_read_f32_sub(const gguf_file *g, int i, int sub, int n_sub, float *out, int64_t n, char *err, size_t errlen)
{
    if (i < 0 || i >= g->n_tensors) {
        snprintf(err, errlen, "tensor index %d out of range", i);
        return -1;
    }
    const gguf_tensor *t = &g->t[i];
    if (n_sub < 1 || sub < 0 || sub >= n_sub || t->numel % n_sub || t->nbytes % (uint64_t)n_sub) {
        snprintf(err, errlen, "%s: part %d of %d does not divide the tensor", t->name, sub, n_sub);
        return -1;
    }
    int64_t numel = t->numel / n_sub;
    if (n < numel) {
        snprintf(err, errlen, "%s: output buffer too small", t->name);
        return -1;
    }
    const uint8_t *p = g->base + t->offset + (uint64_t)sub * (t->nbytes / (uint64_t)n_sub);
    int64_t bb = block32_bytes(t->type);   /* bytes per 32 elements */
    if (bb < 0) {
        snprintf(err, errlen, "%s: unsupported type", t->name);
        return -1;
    }
    fio_guard guard;
    if (sigsetjmp(guard.jb, 1)) {
        snprintf(err, errlen, "%s: the file ended under it (truncated or rewritten while it was read)", t->name);
        return -1;
    }
    fio_guard_enter(&guard);
    /* in steps of whole blocks, the map's pages given back as they are converted */
    int64_t step = (int64_t)FIO_RELEASE_STEP / 4 / 32 * 32;
    for (int64_t k0 = 0; k0 < numel; k0 += step) {
        int64_t k1 = k0 + step < numel ? k0 + step : numel;
        const uint8_t *q0 = p + k0 / 32 * bb;   /* k0 is whole blocks; a float type's last step need not be */
        size_t nb = (size_t)((k1 - k0) * bb / 32);
        convert_f32(t->type, q0, out + k0, k1 - k0);
        fio_map_release(g->map, g->len, q0, nb);
    }
    fio_guard_leave(&guard);
    return 0;
}

/* ---------- llama architecture ---------- */

int gguf_layer_int(const gguf_file *g, const char *key, int layer, int n_layers, int64_t *v, char *err, size_t errlen)
{
    uint32_t ty;
    uint64_t n;
    int kv = gguf_get_arr(g, key, &ty, &n);
    if (kv >= 0) {
        if (n != (uint64_t)n_layers || gguf_arr_int(g, kv, (uint64_t)layer, v)) {
            snprintf(err, errlen, "GGUF: %s: expected %d integers (one per layer)", key, n_layers);
            return -1;
        }
        return 0;
    }
    if (gguf_get_int(g, key, v)) {
        snprintf(err, errlen, "GGUF: %s: missing or not an integer", key);
        return -1;
    }
    return 0;
}

int gguf_tensor_index(const gguf_file *g, const char *name)
{
    for (int i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->t[i].name, name))
            return i;
    return -1;
}

int gguf_arch(const gguf_file *g, arch *a, char *err, size_t errlen)
{
    const char *an;
    size_t al;
    char key[128], archname[32];
    memset(a, 0, sizeof *a);
    if (gguf_get_str(g, "general.architecture", &an, &al)) {
        snprintf(err, errlen, "GGUF: general.architecture is missing");
        return -1;
    }
    /* "deci" (llama.cpp's DeciLM) uses the llama keys and tensors under its own prefix,
     * with per-layer arrays and zero counts for removed parts. The MoE and Mamba-2 families
     * (and llama with experts: Mixtral) are storage/gguf_families.c's. */
    snprintf(archname, sizeof archname, "%.*s", (int)(al < sizeof archname - 1 ? al : sizeof archname - 1), an);
    int64_t n_exp = 0;
    if (!strcmp(archname, "llama"))
        (void)gguf_get_int(g, "llama.expert_count", &n_exp);
    if (gguf_family_known(archname) || n_exp > 0)
        return gguf_family_arch(g, archname, a, err, errlen);
    if (strcmp(archname, "llama") && strcmp(archname, "deci")) {
        snprintf(err, errlen, "GGUF: architecture \"%.*s\" is not supported (llama, deci, %s)", (int)(al < 40 ? al : 40),
                 an, GGUF_FAMILIES);
        return -1;
    }
#define KEY(s) (snprintf(key, sizeof key, "%s." s, archname), key)
    int64_t L, C, ctx = 2048, V = 0, D = 0;
    double theta = 10000.0, eps = 1e-5;
    if (gguf_get_int(g, KEY("block_count"), &L) || L < 1 || L > 1024) {
        snprintf(err, errlen, "GGUF: %s missing or out of range [1, 1024]", key);
        return -1;
    }
    if (gguf_get_int(g, KEY("embedding_length"), &C) || C <= 0 || C > 65536) {
        snprintf(err, errlen, "GGUF: %s missing or out of range", key);
        return -1;
    }
    if (gguf_find(g, KEY("context_length")) >= 0 && (gguf_get_int(g, key, &ctx) || ctx <= 0 || ctx >= (1 << 30))) {
        snprintf(err, errlen, "GGUF: %s is not an integer in [1, 2^30)", key);
        return -1;
    }
    (void)gguf_get_float(g, KEY("rope.freq_base"), &theta);
    (void)gguf_get_float(g, KEY("attention.layer_norm_rms_epsilon"), &eps);
    if (gguf_get_int(g, KEY("vocab_size"), &V)) {
        uint32_t ty;
        uint64_t n;
        if (gguf_get_arr(g, "tokenizer.ggml.tokens", &ty, &n) >= 0)
            V = (int64_t)n;
        int te = gguf_tensor_index(g, "token_embd.weight");
        if (te >= 0)
            V = g->t[te].ne[1];
    }
    if (arch_init(a, (int)L)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(a->family, sizeof a->family, "llama");
    if (V <= 0 || V > (1 << 22)) {
        snprintf(err, errlen, "GGUF: a vocabulary of %lld tokens (%s, tokenizer.ggml.tokens, token_embd.weight) is "
                 "out of range [1, 2^22]", (long long)V, KEY("vocab_size"));
        arch_free(a);
        return -1;
    }
    a->vocab_size = (int)V;
    a->hidden_size = (int)C;
    a->max_position_embeddings = (int)ctx;
    a->rope_theta = theta;
    a->norm_eps = eps;
    a->tie_word_embeddings = gguf_tensor_index(g, "output.weight") < 0;
    int64_t h0 = 0;
    for (int l = 0; l < L; l++) {
        int64_t h, kvh, f;
        if (gguf_layer_int(g, KEY("attention.head_count"), l, (int)L, &h, err, errlen))
            goto fail;
        if (gguf_find(g, KEY("attention.head_count_kv")) < 0)
            kvh = h;   /* no GQA */
        else if (gguf_layer_int(g, key, l, (int)L, &kvh, err, errlen))
            goto fail;
        if (gguf_layer_int(g, KEY("feed_forward_length"), l, (int)L, &f, err, errlen))
            goto fail;
        if (h < 0 || h > 1024 || kvh < 0 || kvh > 1024 || f < 0 || f > (1 << 20)) {
            snprintf(err, errlen, "GGUF: layer %d: head counts or feed_forward_length out of range", l);
            goto fail;
        }
        a->layers[l].source_layer = l;
        a->layers[l].n_heads = (int)h;
        a->layers[l].n_kv_heads = h ? (int)kvh : 0;
        a->layers[l].ffn_dim = (int)f;
        if (h && !h0)
            h0 = h;
    }
    if (gguf_get_int(g, KEY("attention.key_length"), &D) && gguf_get_int(g, KEY("rope.dimension_count"), &D))
        D = h0 ? C / h0 : 0;
    a->head_dim = (int)(D > 0 && D <= 1024 ? D : 0);
    const char *rs;
    size_t rl;
    if (!gguf_get_str(g, KEY("rope.scaling.type"), &rs, &rl) && !(rl == 4 && !memcmp(rs, "none", 4))) {
        double factor = 1.0;
        (void)gguf_get_float(g, KEY("rope.scaling.factor"), &factor);
        if (rl == 6 && !memcmp(rs, "linear", 6)) {
            a->rope_scaling.type = ROPE_SCALING_LINEAR;
            a->rope_scaling.factor = factor;
        } else {
            snprintf(err, errlen, "GGUF: rope scaling \"%.*s\" is not supported", (int)(rl < 20 ? rl : 20), rs);
            goto fail;
        }
    }
    /* llama3 scaling (Llama 3.1 and later) is a tensor of one factor per frequency */
    int rf = gguf_tensor_index(g, "rope_freqs.weight");
    if (rf >= 0) {
        float r[512];
        if (g->t[rf].n_dims != 1 || a->head_dim < 2 || g->t[rf].ne[0] != a->head_dim / 2) {
            snprintf(err, errlen, "GGUF: rope_freqs.weight holds %lld values; the head size %d needs %d",
                     (long long)g->t[rf].ne[0], a->head_dim, a->head_dim / 2);
            goto fail;
        }
        if (a->rope_scaling.type != ROPE_SCALING_NONE) {
            snprintf(err, errlen, "GGUF: both %s and rope_freqs.weight scale RoPE", KEY("rope.scaling.type"));
            goto fail;
        }
        char why[256];
        if (gguf_read_f32(g, rf, r, a->head_dim / 2, err, errlen) < 0)
            goto fail;
        if (arch_rope_fit_llama3(a, r, why, sizeof why) < 0) {
            snprintf(err, errlen, "GGUF: rope_freqs.weight: %s", why);
            goto fail;
        }
    }
#undef KEY
    if (arch_validate(a, err, errlen))
        goto fail;
    return 0;
fail:
    arch_free(a);
    return -1;
}

/* llama.cpp's names for the `llama` architecture and HF's, both ways. perm: the rows are
 * permuted for RoPE with the layer's query (1) or KV (2) head count. */
static const struct { const char *gg, *hf; } GLOBAL_NAMES[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};
static const struct { const char *gg, *hf; int perm; } LAYER_NAMES[] = {
    {"attn_norm.weight", "input_layernorm.weight", 0},
    {"attn_q.weight", "self_attn.q_proj.weight", 1},
    {"attn_k.weight", "self_attn.k_proj.weight", 2},
    {"attn_v.weight", "self_attn.v_proj.weight", 0},
    {"attn_output.weight", "self_attn.o_proj.weight", 0},
    {"attn_q.bias", "self_attn.q_proj.bias", 1},
    {"attn_k.bias", "self_attn.k_proj.bias", 2},
    {"attn_v.bias", "self_attn.v_proj.bias", 0},
    {"ffn_norm.weight", "post_attention_layernorm.weight", 0},
    {"ffn_gate.weight", "mlp.gate_proj.weight", 0},
    {"ffn_up.weight", "mlp.up_proj.weight", 0},
    {"ffn_down.weight", "mlp.down_proj.weight", 0},
};

/* name (GGUF names when from_hf is 0, HF names when 1) in the other scheme, into out.
 * Returns 0 with *permute_heads, or -1 for a name neither table holds. */
static int map_name(const arch *a, const char *name, int from_hf, char *out, size_t cap, int *permute_heads)
{
    *permute_heads = 0;
    for (size_t k = 0; k < sizeof GLOBAL_NAMES / sizeof *GLOBAL_NAMES; k++)
        if (!strcmp(name, from_hf ? GLOBAL_NAMES[k].hf : GLOBAL_NAMES[k].gg))
            return snprintf(out, cap, "%s", from_hf ? GLOBAL_NAMES[k].gg : GLOBAL_NAMES[k].hf) < 0 ? -1 : 0;
    int l, n = 0;
    if (sscanf(name, from_hf ? "model.layers.%d.%n" : "blk.%d.%n", &l, &n) != 1 || n == 0 || l < 0 ||
        l >= a->n_layers)
        return -1;
    for (size_t k = 0; k < sizeof LAYER_NAMES / sizeof *LAYER_NAMES; k++)
        if (!strcmp(name + n, from_hf ? LAYER_NAMES[k].hf : LAYER_NAMES[k].gg)) {
            if (LAYER_NAMES[k].perm == 1)
                *permute_heads = a->layers[l].n_heads;
            else if (LAYER_NAMES[k].perm == 2)
                *permute_heads = a->layers[l].n_kv_heads;
            return snprintf(out, cap, from_hf ? "blk.%d.%s" : "model.layers.%d.%s", l,
                            from_hf ? LAYER_NAMES[k].gg : LAYER_NAMES[k].hf) < 0 ? -1 : 0;
        }
    return -1;
}

int gguf_hf_tensor(const gguf_file *g, const arch *a, int i, char *name, size_t namelen, int64_t shape[2],
                   int *ndim, int *permute_heads)
{
    if (i < 0 || i >= g->n_tensors)
        return -1;
    const gguf_tensor *t = &g->t[i];
    *permute_heads = 0;
    if (t->n_dims > 2)
        return -1;
    *ndim = t->n_dims;
    shape[0] = t->n_dims == 2 ? t->ne[1] : t->ne[0];
    shape[1] = t->n_dims == 2 ? t->ne[0] : 0;
    if (!strcmp(t->name, "rope_freqs.weight"))
        return 1;
    return map_name(a, t->name, 0, name, namelen, permute_heads);
}

int gguf_name_for_hf(const arch *a, const char *hf, char *out, size_t cap, int *permute_heads)
{
    return map_name(a, hf, 1, out, cap, permute_heads);
}
