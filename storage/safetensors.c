/* storage/safetensors.c — safetensors reader (mmap, validated header, shards) and atomic
 * writer, plus the fp16/bf16 conversions. Limits: F32/F16/BF16 only, header <= 100 MiB,
 * at most 8 dimensions, at most 1024 shards. Checks and look-ups by name are n log n.
 */
#include "storage/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/fileio.h"

#define ST_MAX_HEADER (100u << 20)
#define ST_MAX_SHARDS 1024

/* ---------- conversions ---------- */

float st_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {                          /* subnormal: normalize */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FF) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float st_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t st_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xFF, man = x & 0x7FFFFF;
    if (exp == 0xFF)
        return (uint16_t)(sign | 0x7C00 | (man ? 0x200 | (man >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7C00);
    if (e <= 0) {                         /* subnormal or zero */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000;
        int shift = 14 - e;
        uint32_t half = 1u << (shift - 1), rem = man & ((1u << shift) - 1), q = man >> shift;
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t q = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1)))
        q++;                              /* may carry into the exponent: still correct */
    return (uint16_t)(sign | q);
}

uint16_t st_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7FFFFFFF) > 0x7F800000)
        return (uint16_t)((x >> 16) | 0x40);   /* quiet NaN */
    x += 0x7FFF + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

size_t st_dtype_size(st_dtype d) { return d == ST_F32 ? 4 : 2; }
const char *st_dtype_name(st_dtype d) { return d == ST_F32 ? "F32" : d == ST_F16 ? "F16" : "BF16"; }

int st_dtype_parse(const char *s, st_dtype *d)
{
    if (!strcmp(s, "F32")) *d = ST_F32;
    else if (!strcmp(s, "F16")) *d = ST_F16;
    else if (!strcmp(s, "BF16")) *d = ST_BF16;
    else return -1;
    return 0;
}

/* ---------- reading ---------- */

static int cmp_begin(const void *a, const void *b)
{
    const st_tensor *x = *(st_tensor *const *)a, *y = *(st_tensor *const *)b;
    if (x->shard != y->shard)
        return x->shard - y->shard;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Append the tensors of one shard image to f (shard index `shard`). `what` names it in errors. */
static int parse_shard(st_file *f, int shard, const uint8_t *buf, size_t len, const char *what,
                       char *err, size_t errlen)
{
    if (len < 8) {
        snprintf(err, errlen, "%s: %zu bytes is too short for a safetensors header", what, len);
        return -1;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    if (hlen > ST_MAX_HEADER || hlen > len - 8) {
        snprintf(err, errlen, "%s: header length %llu exceeds the file (%zu bytes) or the 100 MiB limit", what,
                 (unsigned long long)hlen, len);
        return -1;
    }
    json_error_t je;
    json_t *h = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!h || !json_is_object(h)) {
        snprintf(err, errlen, "%s: header is not a JSON object (%s)", what, h ? "wrong type" : je.text);
        json_decref(h);
        return -1;
    }
    f->data[shard] = buf + 8 + hlen;
    f->data_len[shard] = len - 8 - hlen;
    size_t add = json_object_size(h);
    st_tensor *nt = realloc(f->t, (size_t)(f->n + (int)add + 1) * sizeof *nt);
    if (!nt) {
        json_decref(h);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    f->t = nt;
    const char *k;
    json_t *v;
    json_object_foreach(h, k, v) {
        if (!strcmp(k, "__metadata__")) {
            if (!json_is_object(v)) {
                snprintf(err, errlen, "%s: __metadata__ must be an object", what);
                goto fail;
            }
            if (!f->metadata)
                f->metadata = json_incref(v);
            continue;
        }
        st_tensor *t = &f->t[f->n];
        memset(t, 0, sizeof *t);
        json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
               *off = json_object_get(v, "data_offsets");
        if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(sh) || !json_is_array(off) ||
            json_array_size(off) != 2) {
            snprintf(err, errlen, "%s: tensor \"%s\": needs dtype, shape and data_offsets [begin, end]", what, k);
            goto fail;
        }
        if (st_dtype_parse(json_string_value(dt), &t->dtype)) {
            snprintf(err, errlen, "%s: tensor \"%s\": dtype %s is not supported (F32, F16, BF16)", what, k,
                     json_string_value(dt));
            goto fail;
        }
        if (json_array_size(sh) > ST_MAX_DIMS) {
            snprintf(err, errlen, "%s: tensor \"%s\": more than %d dimensions", what, k, ST_MAX_DIMS);
            goto fail;
        }
        t->ndim = (int)json_array_size(sh);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            json_t *x = json_array_get(sh, (size_t)d);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > (1LL << 40)) {
                snprintf(err, errlen, "%s: tensor \"%s\": shape[%d] is not a valid size", what, k, d);
                goto fail;
            }
            t->shape[d] = json_integer_value(x);
            if (t->shape[d] && numel > (1ULL << 40) / (uint64_t)t->shape[d]) {
                snprintf(err, errlen, "%s: tensor \"%s\": shape overflows", what, k);
                goto fail;
            }
            numel *= (uint64_t)t->shape[d];
        }
        t->numel = (int64_t)numel;
        json_t *b = json_array_get(off, 0), *e = json_array_get(off, 1);
        if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
            json_integer_value(e) < json_integer_value(b)) {
            snprintf(err, errlen, "%s: tensor \"%s\": data_offsets must be integers with 0 <= begin <= end", what, k);
            goto fail;
        }
        t->begin = (uint64_t)json_integer_value(b);
        t->end = (uint64_t)json_integer_value(e);
        if (t->end > f->data_len[shard]) {
            snprintf(err, errlen, "%s: tensor \"%s\": data ends at %llu, past the end of the data (%llu bytes)", what,
                     k, (unsigned long long)t->end, (unsigned long long)f->data_len[shard]);
            goto fail;
        }
        if (t->end - t->begin != numel * st_dtype_size(t->dtype)) {
            snprintf(err, errlen, "%s: tensor \"%s\": %llu bytes do not hold shape of %llu %s elements", what, k,
                     (unsigned long long)(t->end - t->begin), (unsigned long long)numel, st_dtype_name(t->dtype));
            goto fail;
        }
        t->shard = shard;
        t->name = strdup(k);
        if (!t->name) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        f->n++;
    }
    json_decref(h);
    return 0;
fail:
    json_decref(h);
    return -1;
}

static int cmp_name(const void *a, const void *b, void *ctx)
{
    const st_tensor *t = ctx;
    return strcmp(t[*(const int *)a].name, t[*(const int *)b].name);
}

/* Tensors must not overlap and names must be unique across shards (one shard's JSON
 * already refuses duplicate keys). Builds f->by_name for st_find. Sorting makes both
 * checks n log n. */
static int check_layout(st_file *f, char *err, size_t errlen)
{
    if (f->n == 0)
        return 0;
    st_tensor **s = malloc((size_t)f->n * sizeof *s);
    f->by_name = malloc((size_t)f->n * sizeof *f->by_name);
    if (!s || !f->by_name) {
        free(s);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < f->n; i++)
        s[i] = &f->t[i];
    qsort(s, (size_t)f->n, sizeof *s, cmp_begin);
    /* In order of begin, each non-empty tensor must start at or after the furthest end
     * so far in its shard (empty tensors share no bytes and end nothing). */
    int rc = 0;
    const st_tensor *last = NULL;   /* furthest-reaching non-empty tensor of the shard */
    for (int i = 0; i < f->n && !rc; i++) {
        if (s[i]->begin == s[i]->end)
            continue;
        if (last && last->shard == s[i]->shard && s[i]->begin < last->end) {
            snprintf(err, errlen, "tensors \"%s\" and \"%s\" overlap", last->name, s[i]->name);
            rc = -1;
        } else if (!last || last->shard != s[i]->shard || s[i]->end > last->end) {
            last = s[i];
        }
    }
    free(s);
    for (int i = 0; i < f->n; i++)
        f->by_name[i] = i;
    qsort_r(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name, f->t);
    for (int i = 1; i < f->n && !rc; i++)
        if (!strcmp(f->t[f->by_name[i - 1]].name, f->t[f->by_name[i]].name)) {
            snprintf(err, errlen, "tensor \"%s\" appears in two shards", f->t[f->by_name[i]].name);
            rc = -1;
        }
    return rc;
}

static int alloc_shards(st_file *f, int n)
{
    f->n_shards = n;
    f->data = calloc((size_t)n, sizeof *f->data);
    f->data_len = calloc((size_t)n, sizeof *f->data_len);
    f->maps = calloc((size_t)n, sizeof *f->maps);
    f->map_len = calloc((size_t)n, sizeof *f->map_len);
    return f->data && f->data_len && f->maps && f->map_len ? 0 : -1;
}

int st_open_mem_shards(st_file *f, const void *const *bufs, const size_t *lens, int n, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    if (n < 1 || n > ST_MAX_SHARDS) {
        snprintf(err, errlen, "safetensors: %d shards (1..%d)", n, ST_MAX_SHARDS);
        return -1;
    }
    if (alloc_shards(f, n)) {
        st_close(f);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, n > 1 ? "safetensors shard %d" : "safetensors", i);
        if (parse_shard(f, i, bufs[i], lens[i], what, err, errlen)) {
            st_close(f);
            return -1;
        }
    }
    if (check_layout(f, err, errlen)) {
        st_close(f);
        return -1;
    }
    return 0;
}

int st_open_mem(st_file *f, const void *buf, size_t len, char *err, size_t errlen)
{
    return st_open_mem_shards(f, &buf, &len, 1, err, errlen);
}

/* parse_shard over a file's map. The length and the header are copied out of the map
 * under a guard, and parsed from the copy: a file cut short after it was mapped (copied
 * over, rewritten in place) ends the open with an error, not the process by SIGBUS, and
 * nothing the parse allocated is lost to the jump. */
static int parse_mapped_shard(st_file *f, int shard, const char *path, char *err, size_t errlen)
{
    const uint8_t *map = f->maps[shard];
    size_t len = f->map_len[shard];
    volatile size_t n = len < 8 ? len : 8;
    uint8_t *volatile copy = NULL;
    fio_guard guard;
    if (sigsetjmp(guard.jb, 1)) {
        free(copy);
        snprintf(err, errlen, "%s: the file ended under its header (cut short or rewritten while it opened)", path);
        return -1;
    }
    fio_guard_enter(&guard);
    if (len >= 8) {   /* just what parse_shard reads: the length, and a header it will take */
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--)
            hlen = (hlen << 8) | map[i];
        if (hlen <= ST_MAX_HEADER && hlen <= len - 8)
            n = 8 + (size_t)hlen;
    }
    copy = malloc(n ? n : 1);
    if (copy)
        memcpy(copy, map, n);
    fio_guard_leave(&guard);
    if (!copy) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = parse_shard(f, shard, copy, len, path, err, errlen);
    if (rc == 0)   /* the data stays in the map */
        f->data[shard] = map + (f->data[shard] - copy);
    free(copy);
    return rc;
}

static int open_single(st_file *f, const char *path, char *err, size_t errlen)
{
    if (alloc_shards(f, 1)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (fio_map(path, 0, NULL, &f->maps[0], &f->map_len[0], err, errlen))
        return -1;
    return parse_mapped_shard(f, 0, path, err, errlen) || check_layout(f, err, errlen) ? -1 : 0;
}

/* Shard names of an index, unique, in order of first appearance; a hash of them keeps
 * an index of many tensors linear. */
typedef struct {
    const char *name[ST_MAX_SHARDS];   /* borrowed from the index JSON */
    int n;
    int16_t slot[2 * ST_MAX_SHARDS];   /* open addressing over name[], -1 empty */
} shard_names;

static uint32_t hash_str(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* Index of `s` in sn, added when new. Returns it, or -1 when ST_MAX_SHARDS are taken. */
static int shard_names_add(shard_names *sn, const char *s)
{
    uint32_t mask = 2 * ST_MAX_SHARDS - 1, i = hash_str(s) & mask;
    for (; sn->slot[i] >= 0; i = (i + 1) & mask)
        if (!strcmp(sn->name[sn->slot[i]], s))
            return sn->slot[i];
    if (sn->n == ST_MAX_SHARDS)
        return -1;
    sn->name[sn->n] = s;
    sn->slot[i] = (int16_t)sn->n;
    return sn->n++;
}

static int open_index(st_file *f, const char *index_path, char *err, size_t errlen)
{
    char why[512];
    json_t *ix = fio_load_json(index_path, JSON_REJECT_DUPLICATES, why, sizeof why);
    json_t *wm = ix ? json_object_get(ix, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        if (ix)
            snprintf(err, errlen, "%s: not a safetensors index (no weight_map object)", index_path);
        else
            snprintf(err, errlen, "not a safetensors index: %s", why);
        json_decref(ix);
        return -1;
    }
    char dir[PATH_MAX];
    fio_dir_of(index_path, dir, sizeof dir);
    shard_names *sn = malloc(sizeof *sn);
    int n = 0, rc = -1;
    const char *k;
    json_t *v;
    if (!sn) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    sn->n = 0;
    memset(sn->slot, 0xFF, sizeof sn->slot);
    json_object_foreach(wm, k, v) {
        if (!json_is_string(v)) {
            snprintf(err, errlen, "%s: weight_map/%s must be a file name", index_path, k);
            goto out;
        }
        const char *s = json_string_value(v);
        if (strchr(s, '/') || !strcmp(s, "..") || !*s) {
            snprintf(err, errlen, "%s: shard name \"%s\" must be a plain file name", index_path, s);
            goto out;
        }
        if (shard_names_add(sn, s) < 0) {
            snprintf(err, errlen, "%s: more than %d shards", index_path, ST_MAX_SHARDS);
            goto out;
        }
    }
    n = sn->n;
    if (alloc_shards(f, n ? n : 1)) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    f->n_shards = n;
    for (int i = 0; i < n; i++) {
        char p[PATH_MAX];
        if (fio_path_join(p, sizeof p, dir, sn->name[i]) < 0) {
            snprintf(err, errlen, "%s: shard path too long", index_path);
            goto out;
        }
        if (fio_map(p, 0, NULL, &f->maps[i], &f->map_len[i], err, errlen) ||
            parse_mapped_shard(f, i, p, err, errlen))
            goto out;
    }
    if (check_layout(f, err, errlen))
        goto out;
    json_object_foreach(wm, k, v) {
        int i = st_find(f, k);
        if (i < 0 || strcmp(sn->name[f->t[i].shard], json_string_value(v))) {
            snprintf(err, errlen, "%s: tensor \"%s\" is not in shard %s", index_path, k, json_string_value(v));
            goto out;
        }
    }
    rc = 0;
out:
    free(sn);
    json_decref(ix);
    return rc;
}

int st_open(st_file *f, const char *path, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    struct stat st;
    int rc;
    if (stat(path, &st)) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
        if (!stat(p, &st)) {   /* there, whatever it is: a FIFO or a folder is refused by name */
            rc = open_index(f, p, err, errlen);
        } else {
            snprintf(p, sizeof p, "%s/model.safetensors", path);
            rc = open_single(f, p, err, errlen);
        }
    } else if (fio_has_suffix(path, ".json")) {
        rc = open_index(f, path, err, errlen);
    } else {
        rc = open_single(f, path, err, errlen);
    }
    if (rc)
        st_close(f);
    return rc;
}

void st_close(st_file *f)
{
    for (int i = 0; i < f->n; i++)
        free(f->t[i].name);
    free(f->t);
    free(f->by_name);
    for (int i = 0; f->maps && i < f->n_shards; i++)
        fio_unmap(f->maps[i], f->map_len[i]);
    free(f->maps);
    free(f->map_len);
    free(f->data);
    free(f->data_len);
    json_decref(f->metadata);
    memset(f, 0, sizeof *f);
}

int st_find(const st_file *f, const char *name)
{
    int lo = 0, hi = f->by_name ? f->n : 0;   /* binary search over the names in order */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(f->t[f->by_name[mid]].name, name);
        if (!c)
            return f->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

int st_read_f32(const st_file *f, int i, float *out, int64_t n, char *err, size_t errlen)
{
    if (i < 0 || i >= f->n) {
        snprintf(err, errlen, "tensor index %d out of range", i);
        return -1;
    }
    const st_tensor *t = &f->t[i];
    if (n < t->numel) {
        snprintf(err, errlen, "tensor \"%s\": buffer of %lld floats is smaller than %lld", t->name, (long long)n,
                 (long long)t->numel);
        return -1;
    }
    fio_guard g;
    if (sigsetjmp(g.jb, 1)) {
        snprintf(err, errlen, "tensor \"%s\": the file ended under it (truncated or rewritten while it was read)",
                 t->name);
        return -1;
    }
    fio_guard_enter(&g);
    const uint8_t *p = f->data[t->shard] + t->begin;
    int64_t es = t->dtype == ST_F32 ? 4 : 2, step = (int64_t)FIO_RELEASE_STEP / es;
    for (int64_t k0 = 0; k0 < t->numel; k0 += step) {   /* the map's pages given back as copied */
        int64_t k1 = k0 + step < t->numel ? k0 + step : t->numel;
        if (t->dtype == ST_F32) {
            memcpy(out + k0, p + 4 * k0, (size_t)(k1 - k0) * 4);
        } else {
            for (int64_t k = k0; k < k1; k++) {
                uint16_t h = (uint16_t)(p[2 * k] | (p[2 * k + 1] << 8));
                out[k] = t->dtype == ST_F16 ? st_f16_to_f32(h) : st_bf16_to_f32(h);
            }
        }
        fio_map_release(f->maps[t->shard], f->map_len[t->shard], p + es * k0, (size_t)((k1 - k0) * es));
    }
    fio_guard_leave(&g);
    return 0;
}

/* ---------- writing ---------- */

int st_write(const char *path, const st_write_tensor *ts, int n, st_dtype dtype, json_t *metadata,
             char *err, size_t errlen)
{
    json_t *h = json_object();
    char *hdr = NULL, tmp[PATH_MAX] = "";
    uint8_t *chunk = NULL;
    int fd = -1, rc = -1;
    if (!h)
        goto oom;
    if (metadata && json_object_set(h, "__metadata__", metadata))
        goto oom;
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        int64_t numel = 1;
        if (!shape)
            goto oom;
        for (int d = 0; d < ts[i].ndim; d++) {
            numel *= ts[i].shape[d];
            if (json_array_append_new(shape, json_integer(ts[i].shape[d]))) {
                json_decref(shape);
                goto oom;
            }
        }
        uint64_t bytes = (uint64_t)numel * st_dtype_size(dtype);
        json_t *e = json_pack("{s:s,s:o,s:[I,I]}", "dtype", st_dtype_name(dtype), "shape", shape, "data_offsets",
                              (json_int_t)off, (json_int_t)(off + bytes));
        if (!e || json_object_set_new(h, ts[i].name, e))
            goto oom;
        off += bytes;
    }
    hdr = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    if (!hdr)
        goto oom;
    size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
    if (fio_temp_name(tmp, sizeof tmp, path)) {
        snprintf(err, errlen, "%s: path too long", path);
        goto out;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    if (fio_write_all(fd, len8, 8) || fio_write_all(fd, hdr, hl) || fio_write_all(fd, "        ", padded - hl))
        goto ioerr;
    size_t cap = 1 << 16;
    chunk = malloc(cap * 4);
    if (!chunk)
        goto oom;
    for (int i = 0; i < n; i++) {
        int64_t numel = 1;
        for (int d = 0; d < ts[i].ndim; d++)
            numel *= ts[i].shape[d];
        for (int64_t k = 0; k < numel; k += (int64_t)cap) {
            size_t m = (size_t)(numel - k < (int64_t)cap ? numel - k : (int64_t)cap);
            const float *src = ts[i].data + k;
            if (dtype == ST_F32) {
                memcpy(chunk, src, m * 4);
            } else {
                for (size_t j = 0; j < m; j++) {
                    uint16_t v = dtype == ST_F16 ? st_f32_to_f16(src[j]) : st_f32_to_bf16(src[j]);
                    chunk[2 * j] = (uint8_t)v;
                    chunk[2 * j + 1] = (uint8_t)(v >> 8);
                }
            }
            if (fio_write_all(fd, chunk, m * st_dtype_size(dtype)))
                goto ioerr;
        }
    }
    if (fsync(fd))
        goto ioerr;
    if (close(fd)) {
        fd = -1;
        goto ioerr;
    }
    fd = -1;
    if (rename(tmp, path))
        goto ioerr;
    (void)fio_fsync_parent(path);   /* best effort: some file systems refuse fsync on folders */
    rc = 0;
    goto out;
ioerr:
    snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
    goto out;
oom:
    snprintf(err, errlen, "out of memory while writing %s", path);
out:
    if (fd >= 0)
        close(fd);
    if (rc && tmp[0])
        unlink(tmp);
    free(chunk);
    free(hdr);
    json_decref(h);
    return rc;
}
