/* engine/cpu_mm16.c — bf16/fp16 GEMMs through oneDNN's matmul primitive (see cpu_mm16.h),
 * the kept 16-bit copies of weights declared constant, and the CPU backend's decode-shape
 * kernel at every precision.
 *
 * A oneDNN primitive is built for one shape, one layout and one alpha/beta; building it
 * costs far more than a small multiply, so built primitives are kept in a table keyed by
 * exactly those (a model has few distinct shapes: one per projection width and token
 * count). oneDNN's CPU runtime in Debian is OpenMP, the engine's own: its threads are the
 * OpenMP threads the backend set, so there is still a single thread pool.
 */
#include "engine/cpu_mm16.h"

#include "engine/backend.h"

#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SLOTS 256            /* primitive table size (a slot is reused on collision) */
#define REGIONS 64           /* constant regions held at once */
#define PAR_CONVERT 65536    /* elements below which conversion stays on one thread */

typedef struct {
    int used;
    int ta, tb, M, N, K, ldc;
    uint32_t alpha, beta;    /* bit patterns */
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
} slot;

/* A rounded copy of one matrix inside a constant region (see cpu_mm16_const_begin). */
typedef struct {
    const float *src;
    int rows, cols, ld, valid;
    uint16_t *data;          /* [rows, cols] compact */
} c16_entry;

/* A caller-declared constant range of fp32 memory (a frozen model's weights) and the
 * rounded copies of the matrices read from it. Entries outlive an end (their buffers are
 * reused, re-rounded on first use) until the region's slot goes to another range. */
typedef struct {
    const float *lo, *hi;
    int active;
    c16_entry *e;
    int n, cap;
} c16_region;

struct cpu_mm16 {
    int type;
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    slot slots[SLOTS];
    c16_region regions[REGIONS];
    size_t cache_bytes, cache_cap;
    uint16_t *ws;            /* A then B, 16-bit, compact */
    size_t ws_elems;
    char impl[64];
    char err[256];
};

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline uint16_t to_fp16(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

/* dst [rows, cols] compact <- src [rows, cols] with row stride ld, rounded. */
static void convert(int type, uint16_t *dst, const float *src, int rows, int cols, int ld)
{
    size_t n = (size_t)rows * cols;
#pragma omp parallel for schedule(static) if (n >= PAR_CONVERT)
    for (int r = 0; r < rows; r++) {
        const float *s = src + (size_t)r * ld;
        uint16_t *d = dst + (size_t)r * cols;
        if (type == MM16_BF16) {
#pragma omp simd
            for (int c = 0; c < cols; c++)
                d[c] = mm16_bf16_bits(s[c]);
        } else {
#pragma omp simd
            for (int c = 0; c < cols; c++)
                d[c] = to_fp16(s[c]);
        }
    }
}

static int fail(cpu_mm16 *m, const char *what, dnnl_status_t s)
{
    static const char *const names[] = {"success", "out of memory", "invalid arguments", "no implementation",
                                        "iterator ends", "runtime error", "not required"};
    const char *name = (int)s >= 0 && (int)s < (int)(sizeof names / sizeof names[0]) ? names[s] : "error";
    if (!m->err[0])
        snprintf(m->err, sizeof m->err, "oneDNN %s: %s (status %d)", what, name, (int)s);
    return -1;
}

static void slot_clear(slot *s)
{
    if (!s->used)
        return;
    dnnl_primitive_destroy(s->prim);
    dnnl_memory_destroy(s->a);
    dnnl_memory_destroy(s->b);
    dnnl_memory_destroy(s->c);
    memset(s, 0, sizeof *s);
}

/* Build the primitive of one shape into s (cleared on failure). Operands are compact:
 * A is [K,M] when ta else [M,K]; B is [N,K] when tb else [K,N]; C has row stride ldc. */
static int build(cpu_mm16 *m, slot *s, int ta, int tb, int M, int N, int K, int ldc, float alpha, float beta,
                 const char **impl)
{
    dnnl_data_type_t t = m->type == MM16_BF16 ? dnnl_bf16 : dnnl_f16;
    dnnl_memory_desc_t ad, bd, cd;
    dnnl_dims_t adim = {M, K}, bdim = {K, N}, cdim = {M, N};
    dnnl_dims_t ast = {ta ? 1 : K, ta ? M : 1}, bst = {tb ? 1 : N, tb ? K : 1}, cst = {ldc, 1};
    dnnl_status_t st;
    if ((st = dnnl_memory_desc_init_by_strides(&ad, 2, adim, t, ast)) != dnnl_success ||
        (st = dnnl_memory_desc_init_by_strides(&bd, 2, bdim, t, bst)) != dnnl_success ||
        (st = dnnl_memory_desc_init_by_strides(&cd, 2, cdim, dnnl_f32, cst)) != dnnl_success)
        return fail(m, "memory descriptor", st);
    dnnl_matmul_desc_t md;
    if ((st = dnnl_matmul_desc_init(&md, &ad, &bd, NULL, &cd)) != dnnl_success)
        return fail(m, "matmul descriptor", st);
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int rc = -1;
    if ((st = dnnl_primitive_attr_create(&attr)) != dnnl_success)
        goto out;
    if (alpha != 1.0f && (st = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha)) != dnnl_success)
        goto out;
    if (beta != 0.0f) {
        if ((st = dnnl_post_ops_create(&po)) != dnnl_success || (st = dnnl_post_ops_append_sum(po, beta)) != dnnl_success ||
            (st = dnnl_primitive_attr_set_post_ops(attr, po)) != dnnl_success)
            goto out;
    }
    if ((st = dnnl_primitive_desc_create(&pd, &md, attr, m->eng, NULL)) != dnnl_success)
        goto out;
    if (impl && (st = dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, impl)) != dnnl_success)
        goto out;
    if (impl)
        snprintf(m->impl, sizeof m->impl, "%s", *impl);
    if ((st = dnnl_primitive_create(&s->prim, pd)) != dnnl_success)
        goto out;
    if ((st = dnnl_memory_create(&s->a, &ad, m->eng, DNNL_MEMORY_NONE)) != dnnl_success ||
        (st = dnnl_memory_create(&s->b, &bd, m->eng, DNNL_MEMORY_NONE)) != dnnl_success ||
        (st = dnnl_memory_create(&s->c, &cd, m->eng, DNNL_MEMORY_NONE)) != dnnl_success) {
        if (s->a)
            dnnl_memory_destroy(s->a);
        if (s->b)
            dnnl_memory_destroy(s->b);
        dnnl_primitive_destroy(s->prim);
        memset(s, 0, sizeof *s);
        goto out;
    }
    s->used = 1;
    s->ta = ta, s->tb = tb, s->M = M, s->N = N, s->K = K, s->ldc = ldc;
    s->alpha = fbits(alpha), s->beta = fbits(beta);
    rc = 0;
out:
    if (rc)
        fail(m, "matmul primitive", st);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (po)
        dnnl_post_ops_destroy(po);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return rc;
}

static unsigned slot_of(int ta, int tb, int M, int N, int K, int ldc, uint32_t a, uint32_t b)
{
    uint64_t h = 1469598103934665603ull;
    const uint64_t v[] = {(uint64_t)ta, (uint64_t)tb, (uint64_t)M, (uint64_t)N, (uint64_t)K, (uint64_t)ldc, a, b};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        h = (h ^ v[i]) * 1099511628211ull;
    return (unsigned)(h % SLOTS);
}

static int workspace(cpu_mm16 *m, size_t elems)
{
    if (elems <= m->ws_elems)
        return 0;
    size_t bytes = (elems * 2 + 63) & ~(size_t)63;
    uint16_t *p = aligned_alloc(64, bytes);
    if (!p) {
        if (!m->err[0])
            snprintf(m->err, sizeof m->err, "out of memory for a %zu-byte GEMM operand workspace", bytes);
        return -1;
    }
    free(m->ws);
    m->ws = p;
    m->ws_elems = bytes / 2;
    return 0;
}

static void region_clear(cpu_mm16 *m, c16_region *r)
{
    for (int i = 0; i < r->n; i++) {
        m->cache_bytes -= (size_t)r->e[i].rows * r->e[i].cols * 2;
        free(r->e[i].data);
    }
    free(r->e);
    memset(r, 0, sizeof *r);
}

/* The rounded copy of B [rows, cols] (row stride ld) when B lies inside an active constant
 * region (made on first use), else NULL: the caller rounds B into the workspace. */
static const uint16_t *cached(cpu_mm16 *m, const float *B, int rows, int cols, int ld)
{
    const float *end = B + (size_t)(rows - 1) * ld + cols;
    c16_region *r = NULL;
    for (int i = 0; i < REGIONS && !r; i++)
        if (m->regions[i].active && B >= m->regions[i].lo && end <= m->regions[i].hi)
            r = &m->regions[i];
    if (!r)
        return NULL;
    c16_entry *e = NULL;
    for (int i = 0; i < r->n && !e; i++)
        if (r->e[i].src == B && r->e[i].rows == rows && r->e[i].cols == cols && r->e[i].ld == ld)
            e = &r->e[i];
    if (!e) {
        size_t bytes = (size_t)rows * cols * 2;
        if (m->cache_bytes + bytes > m->cache_cap)
            return NULL;
        if (r->n == r->cap) {
            int cap = r->cap ? 2 * r->cap : 64;
            c16_entry *ne = realloc(r->e, (size_t)cap * sizeof *ne);
            if (!ne)
                return NULL;
            r->e = ne, r->cap = cap;
        }
        uint16_t *d = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        if (!d)
            return NULL;
        e = &r->e[r->n++];
        *e = (c16_entry){.src = B, .rows = rows, .cols = cols, .ld = ld, .data = d};
        m->cache_bytes += bytes;
    }
    if (!e->valid) {
        convert(m->type, e->data, B, rows, cols, ld);
        e->valid = 1;
    }
    return e->data;
}

const uint16_t *cpu_mm16_const_copy(cpu_mm16 *m, const float *B, int rows, int cols, int ld)
{
    return cached(m, B, rows, cols, ld);
}

/* w as the fp32 value of its 16 bits */
static inline float from16(int type, uint16_t w)
{
    if (type == MM16_FP16) {
        _Float16 h;
        memcpy(&h, &w, 2);
        return (float)h;
    }
    uint32_t u = (uint32_t)w << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One weight of row r at k: kept 16 bits (Wh), fp32 rounded as it is read (r16), or fp32. */
#define ROW_W(r16, kept, wf, wh, k) ((kept) ? from16(r16, (wh)[k]) : (r16) ? mm16_round1(r16, (wf)[k]) : (wf)[k])

static inline __attribute__((always_inline)) void rows_t(int r16, int kept, const float *Wf, const uint16_t *Wh,
                                                         int ldw, const float *A, int lda, int M, float *C, int ldc,
                                                         int n, int K, float alpha, float beta)
{
    int o = 0;
    /* one row (decode B=1): eight outputs at once, eight independent sums (a single sum is
     * bound by the add latency, not by the weight bytes); each output's own sum runs in
     * the same order as below */
    for (; M == 1 && o + 8 <= n; o += 8) {
        const float *f[8];
        const uint16_t *h[8];
        for (int j = 0; j < 8; j++) {   /* only the given form is indexed (no offsets on NULL) */
            f[j] = kept ? NULL : Wf + (size_t)(o + j) * ldw;
            h[j] = kept ? Wh + (size_t)(o + j) * ldw : NULL;
        }
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
#pragma omp simd reduction(+:a0, a1, a2, a3, a4, a5, a6, a7)
        for (int k = 0; k < K; k++) {
            float x = A[k];
            a0 = __builtin_fmaf(ROW_W(r16, kept, f[0], h[0], k), x, a0);
            a1 = __builtin_fmaf(ROW_W(r16, kept, f[1], h[1], k), x, a1);
            a2 = __builtin_fmaf(ROW_W(r16, kept, f[2], h[2], k), x, a2);
            a3 = __builtin_fmaf(ROW_W(r16, kept, f[3], h[3], k), x, a3);
            a4 = __builtin_fmaf(ROW_W(r16, kept, f[4], h[4], k), x, a4);
            a5 = __builtin_fmaf(ROW_W(r16, kept, f[5], h[5], k), x, a5);
            a6 = __builtin_fmaf(ROW_W(r16, kept, f[6], h[6], k), x, a6);
            a7 = __builtin_fmaf(ROW_W(r16, kept, f[7], h[7], k), x, a7);
        }
        float acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
        for (int j = 0; j < 8; j++)
            C[o + j] = alpha * acc[j] + (beta != 0.0f ? beta * C[o + j] : 0.0f);
    }
    for (; o < n; o++) {
        const float *f = kept ? NULL : Wf + (size_t)o * ldw;
        const uint16_t *h = kept ? Wh + (size_t)o * ldw : NULL;
        float acc[CPU_ROWS_MAX_M];
        int m = 0;
        for (; m + 4 <= M; m += 4) {   /* four rows of A: four sums run together */
            const float *x0 = A + (size_t)m * lda, *x1 = x0 + lda, *x2 = x1 + lda, *x3 = x2 + lda;
            float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+:a0, a1, a2, a3)
            for (int k = 0; k < K; k++) {
                float w = ROW_W(r16, kept, f, h, k);
                a0 += w * x0[k];
                a1 += w * x1[k];
                a2 += w * x2[k];
                a3 += w * x3[k];
            }
            acc[m] = a0;
            acc[m + 1] = a1;
            acc[m + 2] = a2;
            acc[m + 3] = a3;
        }
        for (; m < M; m++) {
            const float *x = A + (size_t)m * lda;
            float a = 0;
#pragma omp simd reduction(+:a)
            for (int k = 0; k < K; k++)
                a += ROW_W(r16, kept, f, h, k) * x[k];
            acc[m] = a;
        }
        for (m = 0; m < M; m++) {
            float *c = C + (size_t)m * ldc + o;
            *c = alpha * acc[m] + (beta != 0.0f ? beta * *c : 0.0f);
        }
    }
}

void cpu_gemm_rows(int r16, const float *Wf, const uint16_t *Wh, int ldw, const float *A, int lda, int M, float *C,
                   int ldc, int n, int K, float alpha, float beta)
{
    if (Wh && r16 == MM16_FP16)
        rows_t(MM16_FP16, 1, NULL, Wh, ldw, A, lda, M, C, ldc, n, K, alpha, beta);
    else if (Wh)
        rows_t(MM16_BF16, 1, NULL, Wh, ldw, A, lda, M, C, ldc, n, K, alpha, beta);
    else if (r16 == MM16_FP16)
        rows_t(MM16_FP16, 0, Wf, NULL, ldw, A, lda, M, C, ldc, n, K, alpha, beta);
    else if (r16 == MM16_BF16)
        rows_t(MM16_BF16, 0, Wf, NULL, ldw, A, lda, M, C, ldc, n, K, alpha, beta);
    else
        rows_t(0, 0, Wf, NULL, ldw, A, lda, M, C, ldc, n, K, alpha, beta);
}

void cpu_mm16_const_begin(cpu_mm16 *m, const float *p, size_t n)
{
    c16_region *r = NULL, *idle = NULL;
    for (int i = 0; i < REGIONS && !r; i++)
        if (m->regions[i].lo == p && m->regions[i].hi == p + n)
            r = &m->regions[i];
    for (int i = 0; i < REGIONS && !r && !idle; i++)   /* a free slot first */
        if (!m->regions[i].lo)
            idle = &m->regions[i];
    for (int i = 0; i < REGIONS && !r && !idle; i++)   /* else a range no longer constant */
        if (!m->regions[i].active)
            idle = &m->regions[i];
    if (!r && idle) {
        region_clear(m, idle);
        idle->lo = p, idle->hi = p + n;
        r = idle;
    }
    if (r) {
        r->active = 1;
        for (int i = 0; i < r->n; i++)
            r->e[i].valid = 0;   /* the range may have changed since its last end */
    }
}

void cpu_mm16_const_end(cpu_mm16 *m, const float *p)
{
    for (int i = 0; i < REGIONS; i++)
        if (m->regions[i].lo == p)
            m->regions[i].active = 0;
}

int cpu_mm16_gemm(cpu_mm16 *m, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc)
{
    int ra = ta ? K : M, ca = ta ? M : K;
    int rb = tb ? N : K, cb = tb ? K : N;
    size_t na = (size_t)ra * ca, off_b = (na + 31) & ~(size_t)31, nb = (size_t)rb * cb;
    const uint16_t *b16 = cached(m, B, rb, cb, ldb);
    if (workspace(m, b16 ? na : off_b + nb))
        return -1;
    convert(m->type, m->ws, A, ra, ca, lda);
    if (!b16) {
        convert(m->type, m->ws + off_b, B, rb, cb, ldb);
        b16 = m->ws + off_b;
    }
    uint32_t ab = fbits(alpha), bb = fbits(beta);
    slot *s = &m->slots[slot_of(ta, tb, M, N, K, ldc, ab, bb)];
    if (!s->used || s->ta != ta || s->tb != tb || s->M != M || s->N != N || s->K != K || s->ldc != ldc ||
        s->alpha != ab || s->beta != bb) {
        slot_clear(s);
        if (build(m, s, ta, tb, M, N, K, ldc, alpha, beta, NULL))
            return -1;
    }
    dnnl_status_t st;
    if ((st = dnnl_memory_set_data_handle(s->a, m->ws)) != dnnl_success ||
        (st = dnnl_memory_set_data_handle(s->b, (void *)b16)) != dnnl_success ||
        (st = dnnl_memory_set_data_handle(s->c, C)) != dnnl_success)
        return fail(m, "memory handle", st);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, s->a}, {DNNL_ARG_WEIGHTS, s->b}, {DNNL_ARG_DST, s->c}};
    if ((st = dnnl_primitive_execute(s->prim, m->stream, 3, args)) != dnnl_success)
        return fail(m, "matmul", st);
    if ((st = dnnl_stream_wait(m->stream)) != dnnl_success)
        return fail(m, "stream wait", st);
    return 0;
}

cpu_mm16 *cpu_mm16_new(int type, char *err, size_t errlen)
{
    const char *name = type == MM16_BF16 ? "bf16" : "fp16";
    if (type != MM16_BF16 && type != MM16_FP16) {
        snprintf(err, errlen, "unknown 16-bit GEMM type %d", type);
        return NULL;
    }
    cpu_mm16 *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    m->type = type;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    m->cache_cap = pages > 0 && page > 0 ? (size_t)pages * (size_t)page / 4 : (size_t)1 << 30;
    if (m->cache_cap > (size_t)8 << 30)
        m->cache_cap = (size_t)8 << 30;
    dnnl_status_t st;
    if ((st = dnnl_engine_create(&m->eng, dnnl_cpu, 0)) != dnnl_success) {
        snprintf(err, errlen, "oneDNN: cannot create a CPU engine (status %d)", (int)st);
        free(m);
        return NULL;
    }
    if ((st = dnnl_stream_create(&m->stream, m->eng, dnnl_stream_default_flags)) != dnnl_success) {
        snprintf(err, errlen, "oneDNN: cannot create a stream (status %d)", (int)st);
        dnnl_engine_destroy(m->eng);
        free(m);
        return NULL;
    }
    /* Probe: a 64x64x64 multiply. oneDNN without a kernel for the type on this CPU either
     * refuses (unimplemented) or falls to its reference loops ("ref:any"). */
    slot probe = {0};
    const char *impl = NULL;
    if (build(m, &probe, 0, 1, 64, 64, 64, 64, 1.0f, 0.0f, &impl)) {
        snprintf(err, errlen, "%s GEMMs are not available on this CPU through oneDNN %d.%d (%s)", name,
                 (int)dnnl_version()->major, (int)dnnl_version()->minor, m->err);
        cpu_mm16_free(m);
        return NULL;
    }
    slot_clear(&probe);
    if (!strncmp(m->impl, "ref", 3)) {
        snprintf(err, errlen, "%s GEMMs on this CPU would run oneDNN's reference loops (%s), slower than fp32: "
                              "no %s instructions", name, m->impl,
                 type == MM16_BF16 ? "AVX512-BF16 / AMX or AVX-512" : "AVX512-FP16 / AMX-FP16");
        cpu_mm16_free(m);
        return NULL;
    }
    return m;
}

void cpu_mm16_free(cpu_mm16 *m)
{
    if (!m)
        return;
    for (int i = 0; i < SLOTS; i++)
        slot_clear(&m->slots[i]);
    for (int i = 0; i < REGIONS; i++)
        region_clear(m, &m->regions[i]);
    if (m->stream)
        dnnl_stream_destroy(m->stream);
    if (m->eng)
        dnnl_engine_destroy(m->eng);
    free(m->ws);
    free(m);
}

const char *cpu_mm16_error(const cpu_mm16 *m)
{
    return m->err;
}

void cpu_mm16_fail(cpu_mm16 *m, const char *why)
{
    if (!m->err[0])
        snprintf(m->err, sizeof m->err, "%s", why);
}

size_t cpu_mm16_workspace_bytes(const cpu_mm16 *m)
{
    return m->ws_elems * 2 + m->cache_bytes;
}

const char *cpu_mm16_impl(const cpu_mm16 *m)
{
    return m->impl;
}

/* ---- the CPU backend's precision (be->impl) ---------------------------------------- */

void cpu_impl_free(cpu_impl *ci)
{
    if (ci) {
        cpu_mm16_free(ci->mm);
        free(ci->rows);
        free(ci->rows16);
        free(ci);
    }
}

/* A's M (<= SMALL_M) rows rounded to the 16-bit type into ci->rows (row stride K), or NULL
 * when out of memory. */
const float *cpu_impl_round_rows(cpu_impl *ci, const float *A, int lda, int M, int K)
{
    size_t n = (size_t)M * K;
    if (n > ci->rows_n) {
        float *p = realloc(ci->rows, n * sizeof *p);
        if (!p)
            return NULL;
        ci->rows = p, ci->rows_n = n;
    }
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++)
            ci->rows[(size_t)m * K + k] = mm16_round1(ci->type, A[(size_t)m * lda + k]);
    ci->kp = 0;
    if (ci->type != MM16_BF16 || !__builtin_cpu_supports("avx512bf16"))
        return ci->rows;
    int kp = (K + 31) / 32 * 32;
    size_t n16 = (size_t)M * kp;
    if (n16 > ci->rows16_n) {
        uint16_t *p = aligned_alloc(64, (n16 * 2 + 63) & ~(size_t)63);
        if (!p)
            return ci->rows;   /* the portable kernel, without the packed rows */
        free(ci->rows16);
        ci->rows16 = p, ci->rows16_n = n16;
    }
    for (int m = 0; m < M; m++)
        for (int k = 0; k < kp; k++)
            ci->rows16[(size_t)m * kp + k] = k < K ? mm16_bf16_bits(A[(size_t)m * lda + k]) : 0;
    ci->kp = kp;
    return ci->rows;
}

/* ---- AVX512-BF16 decode rows -------------------------------------------------------- */

#define DP_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

/* 32 weights of a row from k on (fewer at the tail, zeros past K) as bf16 pairs */
DP_TARGET static inline __m512bh dp_w(const float *wf, const uint16_t *wh, int k, int K)
{
    int rem = K - k;
    if (wh) {
        __mmask32 t = rem >= 32 ? 0xffffffffu : (1u << rem) - 1;
        return (__m512bh)_mm512_maskz_loadu_epi16(t, wh + k);
    }
    __mmask16 t0 = rem >= 16 ? 0xffff : (__mmask16)((1u << rem) - 1);
    __mmask16 t1 = rem >= 32 ? 0xffff : rem > 16 ? (__mmask16)((1u << (rem - 16)) - 1) : 0;
    __m512 lo = _mm512_maskz_loadu_ps(t0, wf + k), hi = _mm512_maskz_loadu_ps(t1, wf + k + 16);
    return _mm512_cvtne2ps_pbh(hi, lo);
}

DP_TARGET void cpu_gemm_rows_dp(const float *Wf, const uint16_t *Wh, int ldw, const uint16_t *A16, int kp, int M,
                                float *C, int ldc, int n, int K, float alpha, float beta)
{
    int o = 0;
    for (; M == 1 && o + 4 <= n; o += 4) {   /* one row: four outputs, four independent sums */
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        size_t r = (size_t)o * ldw;
        const float *f = Wh ? NULL : Wf + r;
        const uint16_t *h = Wh ? Wh + r : NULL;
        for (int k = 0; k < K; k += 32) {
            __m512bh x = (__m512bh)_mm512_load_si512(A16 + k);
            a0 = _mm512_dpbf16_ps(a0, x, dp_w(f, h, k, K));
            a1 = _mm512_dpbf16_ps(a1, x, dp_w(f ? f + ldw : NULL, h ? h + ldw : NULL, k, K));
            a2 = _mm512_dpbf16_ps(a2, x, dp_w(f ? f + 2 * (size_t)ldw : NULL, h ? h + 2 * (size_t)ldw : NULL, k, K));
            a3 = _mm512_dpbf16_ps(a3, x, dp_w(f ? f + 3 * (size_t)ldw : NULL, h ? h + 3 * (size_t)ldw : NULL, k, K));
        }
        float acc[4] = {_mm512_reduce_add_ps(a0), _mm512_reduce_add_ps(a1), _mm512_reduce_add_ps(a2),
                        _mm512_reduce_add_ps(a3)};
        for (int j = 0; j < 4; j++)
            C[o + j] = alpha * acc[j] + (beta != 0.0f ? beta * C[o + j] : 0.0f);
    }
    for (; o < n; o++) {   /* each output against every row of A */
        __m512 acc[CPU_ROWS_MAX_M];
        for (int m = 0; m < M; m++)
            acc[m] = _mm512_setzero_ps();
        size_t r = (size_t)o * ldw;
        const float *f = Wh ? NULL : Wf + r;
        const uint16_t *h = Wh ? Wh + r : NULL;
        for (int k = 0; k < K; k += 32) {
            __m512bh w = dp_w(f, h, k, K);
            for (int m = 0; m < M; m++)
                acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_load_si512(A16 + (size_t)m * kp + k), w);
        }
        for (int m = 0; m < M; m++) {
            float *c = C + (size_t)m * ldc + o;
            *c = alpha * _mm512_reduce_add_ps(acc[m]) + (beta != 0.0f ? beta * *c : 0.0f);
        }
    }
}

int eng_backend_cpu_set_precision(eng_backend *be, const char *precision, char *err, size_t errlen)
{
    int type = !strcmp(precision, "bf16") ? MM16_BF16 : !strcmp(precision, "fp16") ? MM16_FP16 : 0;
    if (!type && strcmp(precision, "fp32")) {
        snprintf(err, errlen, "%s: unknown precision (expected fp32, bf16 or fp16)", precision);
        return -1;
    }
    cpu_impl *ci = NULL;
    if (type) {
        if (!(ci = calloc(1, sizeof *ci))) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        ci->type = type;
        if (!(ci->mm = cpu_mm16_new(type, err, errlen))) {
            free(ci);
            return -1;
        }
    }
    cpu_impl_free(be->impl);
    be->impl = ci;
    return 0;
}

const char *eng_backend_cpu_precision(const eng_backend *be)
{
    const cpu_impl *ci = be->impl;
    return !ci ? "fp32" : ci->type == MM16_BF16 ? "bf16" : "fp16";
}

const char *eng_backend_cpu_error(const eng_backend *be)
{
    const cpu_impl *ci = be->impl;
    return ci ? cpu_mm16_error(ci->mm) : "";
}

const char *eng_backend_cpu_gemm_kernel(const eng_backend *be)
{
    const cpu_impl *ci = be->impl;
    return ci ? cpu_mm16_impl(ci->mm) : eng_blas_kernel();
}

size_t eng_backend_cpu_workspace_bytes(const eng_backend *be)
{
    const cpu_impl *ci = be->impl;
    return ci ? cpu_mm16_workspace_bytes(ci->mm) : 0;
}

const char *eng_cpu_gemm16_version(char *buf, size_t len)
{
    const dnnl_version_t *d = dnnl_version();
    snprintf(buf, len, "%d.%d.%d", (int)d->major, (int)d->minor, (int)d->patch);
    return buf;
}

void eng_backend_cpu_const(eng_backend *be, const float *p, size_t n, int on)
{
    cpu_impl *ci = be->impl;
    if (!ci)
        return;   /* fp32 multiplies the weights as they are */
    if (on)
        cpu_mm16_const_begin(ci->mm, p, n);
    else
        cpu_mm16_const_end(ci->mm, p);
}

int eng_cpu_gemm16_probe(const char *precision, char *kernel, size_t kernel_len, char *err, size_t errlen)
{
    int type = !strcmp(precision, "bf16") ? MM16_BF16 : !strcmp(precision, "fp16") ? MM16_FP16 : 0;
    if (!type) {
        snprintf(err, errlen, "%s: not a 16-bit precision (bf16, fp16)", precision);
        return -1;
    }
    cpu_mm16 *m = cpu_mm16_new(type, err, errlen);
    if (!m)
        return -1;
    snprintf(kernel, kernel_len, "%s", m->impl);
    cpu_mm16_free(m);
    return 0;
}
