/* tests/unit/gguf_image.h — builds GGUF v3 images in memory for the unit tests: a
 * growing byte buffer, typed metadata entries and a tensor table with 32-byte aligned
 * data. Test helper only (asserts through cmocka; include after <cmocka.h>). */
#ifndef AC_TESTS_GGUF_IMAGE_H
#define AC_TESTS_GGUF_IMAGE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "storage/gguf.h"

typedef struct { uint8_t *p; size_t n, cap; } buf;

static inline void put(buf *b, const void *x, size_t n)
{
    if (!n)
        return;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, x, n);
    b->n += n;
}
static inline void u32(buf *b, uint32_t v) { put(b, &v, 4); }
static inline void u64(buf *b, uint64_t v) { put(b, &v, 8); }
static inline void str(buf *b, const char *s) { u64(b, strlen(s)); put(b, s, strlen(s)); }
static inline void kv_u32(buf *b, const char *k, uint32_t v) { str(b, k); u32(b, GGUF_T_U32); u32(b, v); }
static inline void kv_f32(buf *b, const char *k, float v) { str(b, k); u32(b, GGUF_T_F32); put(b, &v, 4); }
static inline void kv_str(buf *b, const char *k, const char *v) { str(b, k); u32(b, GGUF_T_STRING); str(b, v); }
static inline void kv_u64(buf *b, const char *k, uint64_t v) { str(b, k); u32(b, GGUF_T_U64); u64(b, v); }
static inline void kv_arr_str(buf *b, const char *k, const char *const *v, int n)
{
    str(b, k); u32(b, GGUF_T_ARRAY); u32(b, GGUF_T_STRING); u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++) str(b, v[i]);
}
static inline void kv_arr_i32(buf *b, const char *k, const int32_t *v, int n)
{
    str(b, k); u32(b, GGUF_T_ARRAY); u32(b, GGUF_T_I32); u64(b, (uint64_t)n); put(b, v, 4 * (size_t)n);
}

typedef struct { const char *name; int nd; int64_t ne[2]; uint32_t type; const void *data; size_t bytes; } tdesc;

/* A GGUF v3 image: header, kvs (already serialized in `kvs`, n_kv of them), tensors. */
static inline buf build(const buf *kvs, int n_kv, const tdesc *ts, int nt)
{
    buf b = {0};
    u32(&b, 0x46554747u); u32(&b, 3); u64(&b, (uint64_t)nt); u64(&b, (uint64_t)n_kv);
    put(&b, kvs->p, kvs->n);
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        str(&b, ts[i].name); u32(&b, (uint32_t)ts[i].nd);
        for (int d = 0; d < ts[i].nd; d++) u64(&b, (uint64_t)ts[i].ne[d]);
        u32(&b, ts[i].type); u64(&b, off);
        off += (ts[i].bytes + 31) / 32 * 32;
    }
    static const uint8_t zero[32];
    put(&b, zero, (32 - b.n % 32) % 32);
    for (int i = 0; i < nt; i++) {
        put(&b, ts[i].data, ts[i].bytes);
        put(&b, zero, (32 - ts[i].bytes % 32) % 32);
    }
    return b;
}

#endif
