/* compress/costmodel.c — timing tables and the memory model: strict JSON reading and
 * writing (docs/timing-tables.md), linear interpolation between grid points, additive
 * latency prediction, itemized memory, the on-disk calibration cache and
 * POST /v1/estimates. Pure lookups: nothing here runs the engine.
 */
#include "compress/costmodel.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/sha.h>

#include "storage/archjson.h"
#include "storage/fileio.h"
#include "storage/hfconfig.h"
#include "storage/modelio.h"

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

static const char *const part_names[] = {"attention", "mlp"};

/* ---------- small JSON readers (strict, with pointers) ---------- */

static int check_keys(json_t *o, const char *at, const char *const *known, char *err, size_t errlen)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; known[i]; i++)
            ok |= !strcmp(k, known[i]);
        if (!ok)
            FAIL("%s/%s: unknown key", at, k);
    }
    return 0;
}

static int get_int(json_t *o, const char *at, const char *k, int64_t lo, int64_t hi, int required,
                   int64_t *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(o, k);
    if (!v) {
        if (required)
            FAIL("%s/%s: required", at, k);
        return 0;
    }
    if (!json_is_integer(v))
        FAIL("%s/%s: must be an integer", at, k);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        FAIL("%s/%s: %lld is out of range [%lld, %lld]", at, k, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

static int get_i32(json_t *o, const char *at, const char *k, int lo, int hi, int required, int *out,
                   char *err, size_t errlen)
{
    int64_t x = *out;
    if (get_int(o, at, k, lo, hi, required, &x, err, errlen))
        return -1;
    *out = (int)x;
    return 0;
}

/* A finite number >= lo. */
static int get_num(json_t *o, const char *at, const char *k, double lo, int required, double *out,
                   char *err, size_t errlen)
{
    json_t *v = json_object_get(o, k);
    if (!v) {
        if (required)
            FAIL("%s/%s: required", at, k);
        return 0;
    }
    if (!json_is_number(v))
        FAIL("%s/%s: must be a number", at, k);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo)
        FAIL("%s/%s: must be a finite number >= %g", at, k, lo);
    *out = x;
    return 0;
}

static int get_str(json_t *o, const char *at, const char *k, int required, char *out, size_t outlen,
                   char *err, size_t errlen)
{
    json_t *v = json_object_get(o, k);
    if (!v) {
        if (required)
            FAIL("%s/%s: required", at, k);
        return 0;
    }
    if (!json_is_string(v))
        FAIL("%s/%s: must be a string", at, k);
    const char *s = json_string_value(v);
    if (!*s || strlen(s) >= outlen)
        FAIL("%s/%s: must be a non-empty string shorter than %zu bytes", at, k, outlen);
    snprintf(out, outlen, "%s", s);
    return 0;
}

/* ---------- target ---------- */

int cm_hidden_candidates(int C, int out[4])
{
    int n = 0;
    for (int j = 4; j < 8; j++) {
        int h = (C * j / 8) / 8 * 8;
        if (h > 0 && h < C && (!n || out[n - 1] != h))
            out[n++] = h;
    }
    return n;
}

void cm_target_default(cm_target *t)
{
    memset(t, 0, sizeof *t);
    snprintf(t->device, sizeof t->device, "cpu");
    snprintf(t->precision, sizeof t->precision, "fp32");
    t->batch_size = CM_DEFAULT_BATCH;
    t->prompt_tokens = CM_DEFAULT_PROMPT_TOKENS;
    t->output_tokens = CM_DEFAULT_OUTPUT_TOKENS;
}

int cm_target_from_json(json_t *j, const char *ptr, cm_target *t, char *err, size_t errlen)
{
    static const char *const keys[] = {"device", "precision", "workload", NULL};
    static const char *const wkeys[] = {"batch_size", "prompt_tokens", "output_tokens", NULL};
    char at[96];
    memset(t, 0, sizeof *t);
    if (!json_is_object(j))
        FAIL("%s: must be an object", ptr);
    if (check_keys(j, ptr, keys, err, errlen))
        return -1;
    snprintf(t->precision, sizeof t->precision, "fp32");
    if (get_str(j, ptr, "device", 1, t->device, sizeof t->device, err, errlen) ||
        get_str(j, ptr, "precision", 0, t->precision, sizeof t->precision, err, errlen))
        return -1;
    if (strcmp(t->device, "cpu") && strncmp(t->device, "cuda", 4))
        FAIL("%s/device: \"%s\" is not a device name (cpu, cuda:N)", ptr, t->device);
    if (strcmp(t->precision, "fp32") && strcmp(t->precision, "bf16") && strcmp(t->precision, "fp16"))
        FAIL("%s/precision: \"%s\" is not one of fp32, bf16, fp16", ptr, t->precision);
    json_t *w = json_object_get(j, "workload");
    snprintf(at, sizeof at, "%s/workload", ptr);
    if (!w)
        FAIL("%s: required", at);
    if (!json_is_object(w))
        FAIL("%s: must be an object", at);
    if (check_keys(w, at, wkeys, err, errlen) ||
        get_i32(w, at, "batch_size", 1, 4096, 1, &t->batch_size, err, errlen) ||
        get_i32(w, at, "prompt_tokens", 1, 1 << 20, 1, &t->prompt_tokens, err, errlen) ||
        get_i32(w, at, "output_tokens", 1, 1 << 20, 1, &t->output_tokens, err, errlen))
        return -1;
    return 0;
}

json_t *cm_target_to_json(const cm_target *t)
{
    return json_pack("{s:s,s:s,s:{s:i,s:i,s:i}}", "device", t->device, "precision", t->precision,
                     "workload", "batch_size", t->batch_size, "prompt_tokens", t->prompt_tokens,
                     "output_tokens", t->output_tokens);
}

/* ---------- tables <-> JSON ---------- */

void cm_tables_free(cm_tables *t)
{
    if (!t)
        return;
    free(t->prefill);
    free(t->decode);
    free(t->fixed);
    t->prefill = t->decode = NULL;
    t->fixed = NULL;
    t->n_prefill = t->n_decode = t->n_fixed = 0;
}

static int set_new(json_t *o, const char *k, json_t *v)
{
    return v ? json_object_set_new(o, k, v) : -1;
}

static json_t *entry_key_json(const cm_entry *e)
{
    json_t *o = json_object();
    int rc = 0;
    if (!o)
        return NULL;
    rc |= set_new(o, "part", json_string(part_names[e->part]));
    rc |= set_new(o, "hidden_size", json_integer(e->hidden_size));
    if (e->part == CM_ATTN) {
        rc |= set_new(o, "n_heads", json_integer(e->n_heads));
        rc |= set_new(o, "n_kv_heads", json_integer(e->n_kv_heads));
    } else {
        rc |= set_new(o, "ffn_dim", json_integer(e->ffn_dim));
    }
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *cm_tables_to_json(const cm_tables *t)
{
    json_t *o = json_object(), *pre = json_array(), *dec = json_array(), *fix = json_object(),
           *byh = json_array();
    int rc = !o || !pre || !dec || !fix || !byh;
    for (int i = 0; !rc && i < t->n_prefill; i++) {
        const cm_entry *e = &t->prefill[i];
        json_t *x = entry_key_json(e);
        rc |= !x || json_array_append_new(pre, x);
        if (rc)
            break;
        rc |= set_new(x, "ms", json_real(e->ms));
        rc |= set_new(x, "mad_ms", json_real(e->mad_ms));
        if (e->workspace_bytes >= 0)
            rc |= set_new(x, "workspace_bytes", json_integer(e->workspace_bytes));
        rc |= set_new(x, "samples", json_integer(e->samples));
    }
    for (int i = 0; !rc && i < t->n_decode; i++) {
        const cm_entry *e = &t->decode[i];
        json_t *x = entry_key_json(e), *c = json_array(), *m = json_array(), *d = json_array();
        rc |= !x || !c || !m || !d || json_array_append_new(dec, x);
        for (int k = 0; !rc && k < e->n_ctx; k++)
            rc |= json_array_append_new(c, json_integer(e->ctx[k])) ||
                  json_array_append_new(m, json_real(e->ctx_ms[k])) ||
                  json_array_append_new(d, json_real(e->ctx_mad_ms[k]));
        if (rc || !x) {
            json_decref(c);
            json_decref(m);
            json_decref(d);
            break;
        }
        rc |= set_new(x, "contexts", c) | set_new(x, "ms", m) | set_new(x, "mad_ms", d);
        rc |= set_new(x, "ms_at_context_0", json_real(e->ms0));
        rc |= set_new(x, "ms_per_context", json_real(e->ms_per_ctx));
        rc |= set_new(x, "samples", json_integer(e->samples));
    }
    for (int i = 0; !rc && i < t->n_fixed; i++) {
        const cm_fixed *f = &t->fixed[i];
        json_t *x = json_pack("{s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:I}", "hidden_size", f->hidden_size,
                              "prefill_embedding_ms", f->prefill_embed_ms, "prefill_head_ms",
                              f->prefill_head_ms, "prefill_other_ms", f->prefill_other_ms,
                              "decode_embedding_ms", f->decode_embed_ms, "decode_head_ms",
                              f->decode_head_ms, "decode_other_ms", f->decode_other_ms, "workspace_bytes",
                              (json_int_t)f->workspace_bytes);
        rc |= !x || json_array_append_new(byh, x);
        if (!rc) {
            rc |= set_new(x, "prefill_scale", json_real(f->prefill_scale > 0 ? f->prefill_scale : 1));
            rc |= set_new(x, "decode_scale", json_real(f->decode_scale > 0 ? f->decode_scale : 1));
        }
    }
    if (!rc) {
        rc |= set_new(fix, "by_hidden", byh);
        byh = NULL;
        rc |= set_new(o, "shape", json_pack("{s:s,s:i,s:i,s:b,s:b}", "family", t->family, "vocab_size",
                                            t->vocab_size, "head_dim", t->head_dim, "tie_word_embeddings",
                                            t->tie_word_embeddings, "attention_bias", t->attention_bias));
        rc |= set_new(o, "prefill", pre);
        rc |= set_new(o, "decode", dec);
        rc |= set_new(o, "fixed", fix);
        pre = dec = fix = NULL;
        rc |= set_new(o, "memory", json_pack("{s:s,s:f,s:I,s:f,s:I,s:I}", "workspace_combine",
                                             t->mem.workspace_combine == CM_WS_SUM_MAXIMA ? "sum_of_part_maxima"
                                                                                           : "max",
                                             "weight_bytes_per_param",
                                             t->mem.weight_bytes_per_param, "weight_overhead_bytes",
                                             (json_int_t)t->mem.weight_overhead_bytes, "kv_bytes_per_element",
                                             t->mem.kv_bytes_per_elem, "kv_overhead_bytes",
                                             (json_int_t)t->mem.kv_overhead_bytes, "runtime_bytes",
                                             (json_int_t)t->mem.runtime_bytes));
    }
    json_decref(pre);
    json_decref(dec);
    json_decref(fix);
    json_decref(byh);
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Least-squares line through (x, y); one point: flat. */
static void fit_line(const int *x, const double *y, int n, double *a, double *b)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        sx += x[i];
        sy += y[i];
        sxx += (double)x[i] * x[i];
        sxy += (double)x[i] * y[i];
    }
    double den = n * sxx - sx * sx;
    if (n < 2 || fabs(den) < 1e-12) {
        *b = 0;
        *a = n ? sy / n : 0;
        return;
    }
    *b = (n * sxy - sx * sy) / den;
    *a = (sy - *b * sx) / n;
}

void cm_entry_fit_decode(cm_entry *e)
{
    fit_line(e->ctx, e->ctx_ms, e->n_ctx, &e->ms0, &e->ms_per_ctx);
    /* Noise on tiny parts can tilt the line below zero at a sampled end: a step never
     * takes negative time, so fall back to the flat mean there. */
    for (int k = 0; k < e->n_ctx; k++)
        if (e->ms0 + e->ms_per_ctx * e->ctx[k] < 0) {
            double m = 0;
            for (int j = 0; j < e->n_ctx; j++)
                m += e->ctx_ms[j];
            e->ms0 = e->n_ctx ? m / e->n_ctx : 0;
            e->ms_per_ctx = 0;
            break;
        }
}

static int same_key(const cm_entry *a, const cm_entry *b)
{
    if (a->part != b->part || a->hidden_size != b->hidden_size)
        return 0;
    return a->part == CM_ATTN ? a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads
                              : a->ffn_dim == b->ffn_dim;
}

static int parse_entry_key(json_t *x, const char *at, cm_entry *e, char *err, size_t errlen)
{
    json_t *p = json_object_get(x, "part");
    if (!p)
        FAIL("%s/part: required (\"attention\" or \"mlp\")", at);
    if (!json_is_string(p))
        FAIL("%s/part: must be a string", at);
    if (!strcmp(json_string_value(p), "attention"))
        e->part = CM_ATTN;
    else if (!strcmp(json_string_value(p), "mlp"))
        e->part = CM_MLP;
    else
        FAIL("%s/part: \"%s\" is not \"attention\" or \"mlp\"", at, json_string_value(p));
    if (get_i32(x, at, "hidden_size", 1, 1 << 20, 1, &e->hidden_size, err, errlen))
        return -1;
    if (e->part == CM_ATTN) {
        if (json_object_get(x, "ffn_dim"))
            FAIL("%s/ffn_dim: not allowed on an attention entry", at);
        if (get_i32(x, at, "n_heads", 0, 1 << 16, 1, &e->n_heads, err, errlen) ||
            get_i32(x, at, "n_kv_heads", 0, 1 << 16, 1, &e->n_kv_heads, err, errlen))
            return -1;
        if ((e->n_heads == 0) != (e->n_kv_heads == 0))
            FAIL("%s/n_kv_heads: must be 0 exactly when n_heads is 0", at);
        if (e->n_heads && e->n_heads % e->n_kv_heads)
            FAIL("%s/n_kv_heads: %d does not divide n_heads %d", at, e->n_kv_heads, e->n_heads);
    } else {
        if (json_object_get(x, "n_heads") || json_object_get(x, "n_kv_heads"))
            FAIL("%s: n_heads/n_kv_heads not allowed on an mlp entry", at);
        if (get_i32(x, at, "ffn_dim", 0, 1 << 24, 1, &e->ffn_dim, err, errlen))
            return -1;
    }
    return 0;
}

static int parse_prefill(json_t *arr, const char *ptr, cm_tables *t, char *err, size_t errlen)
{
    static const char *const keys[] = {"part", "hidden_size", "n_heads", "n_kv_heads", "ffn_dim", "ms",
                                       "mad_ms", "workspace_bytes", "samples", NULL};
    char at[128];
    snprintf(at, sizeof at, "%s/prefill", ptr);
    if (!json_is_array(arr))
        FAIL("%s: must be an array", at);
    size_t n = json_array_size(arr);
    if (n == 0)
        FAIL("%s: must have at least one entry", at);
    t->prefill = calloc(n, sizeof *t->prefill);
    if (!t->prefill)
        FAIL("%s: out of memory", at);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(arr, i);
        cm_entry *e = &t->prefill[i];
        snprintf(at, sizeof at, "%s/prefill/%zu", ptr, i);
        if (!json_is_object(x))
            FAIL("%s: must be an object", at);
        e->workspace_bytes = -1;
        e->samples = 1;
        if (check_keys(x, at, keys, err, errlen) || parse_entry_key(x, at, e, err, errlen) ||
            get_num(x, at, "ms", 0, 1, &e->ms, err, errlen) ||
            get_num(x, at, "mad_ms", 0, 0, &e->mad_ms, err, errlen) ||
            get_int(x, at, "workspace_bytes", 0, INT64_MAX, 0, &e->workspace_bytes, err, errlen) ||
            get_i32(x, at, "samples", 0, 1 << 30, 0, &e->samples, err, errlen))
            return -1;
        for (size_t k = 0; k < i; k++)
            if (same_key(&t->prefill[k], e))
                FAIL("%s: duplicate of %s/prefill/%zu", at, ptr, k);
        t->n_prefill = (int)i + 1;
    }
    return 0;
}

static int parse_ctx_array(json_t *x, const char *at, const char *k, int n_expect, int is_int, cm_entry *e,
                           double *out, char *err, size_t errlen)
{
    json_t *a = json_object_get(x, k);
    if (!a) {
        if (n_expect < 0)
            FAIL("%s/%s: required", at, k);
        return 1;   /* optional and absent */
    }
    if (!json_is_array(a))
        FAIL("%s/%s: must be an array", at, k);
    size_t n = json_array_size(a);
    if (n < 1 || n > CM_MAX_CTX)
        FAIL("%s/%s: must hold 1 to %d values", at, k, CM_MAX_CTX);
    if (n_expect >= 0 && (int)n != n_expect)
        FAIL("%s/%s: has %zu values but contexts has %d", at, k, n, n_expect);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (is_int) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 24))
                FAIL("%s/%s/%zu: must be an integer context length in [0, %d]", at, k, i, 1 << 24);
            e->ctx[i] = (int)json_integer_value(v);
            if (i > 0 && e->ctx[i] <= e->ctx[i - 1])
                FAIL("%s/%s/%zu: contexts must increase", at, k, i);
        } else {
            if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0)
                FAIL("%s/%s/%zu: must be a finite number >= 0", at, k, i);
            out[i] = json_number_value(v);
        }
    }
    if (is_int)
        e->n_ctx = (int)n;
    return 0;
}

static int parse_decode(json_t *arr, const char *ptr, cm_tables *t, char *err, size_t errlen)
{
    static const char *const keys[] = {"part", "hidden_size", "n_heads", "n_kv_heads", "ffn_dim", "contexts",
                                       "ms", "mad_ms", "ms_at_context_0", "ms_per_context", "samples", NULL};
    char at[128];
    snprintf(at, sizeof at, "%s/decode", ptr);
    if (!json_is_array(arr))
        FAIL("%s: must be an array", at);
    size_t n = json_array_size(arr);
    if (n == 0)
        FAIL("%s: must have at least one entry", at);
    t->decode = calloc(n, sizeof *t->decode);
    if (!t->decode)
        FAIL("%s: out of memory", at);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(arr, i);
        cm_entry *e = &t->decode[i];
        snprintf(at, sizeof at, "%s/decode/%zu", ptr, i);
        if (!json_is_object(x))
            FAIL("%s: must be an object", at);
        e->workspace_bytes = -1;
        e->samples = 1;
        if (check_keys(x, at, keys, err, errlen) || parse_entry_key(x, at, e, err, errlen) ||
            parse_ctx_array(x, at, "contexts", -1, 1, e, NULL, err, errlen) ||
            parse_ctx_array(x, at, "ms", e->n_ctx, 0, e, e->ctx_ms, err, errlen) < 0 ||
            parse_ctx_array(x, at, "mad_ms", e->n_ctx, 0, e, e->ctx_mad_ms, err, errlen) < 0 ||
            get_i32(x, at, "samples", 0, 1 << 30, 0, &e->samples, err, errlen))
            return -1;
        if (!json_object_get(x, "ms"))
            FAIL("%s/ms: required (one time per context)", at);
        json_t *a0 = json_object_get(x, "ms_at_context_0"), *b0 = json_object_get(x, "ms_per_context");
        if (!!a0 != !!b0)
            FAIL("%s/%s: ms_at_context_0 and ms_per_context come together", at,
                 a0 ? "ms_per_context" : "ms_at_context_0");
        if (a0) {
            /* The fit is given (e.g. by the calibration that wrote it); it may be negative
             * at context 0 but must be non-negative over the sampled contexts. */
            if (get_num(x, at, "ms_at_context_0", -1e12, 1, &e->ms0, err, errlen) ||
                get_num(x, at, "ms_per_context", -1e12, 1, &e->ms_per_ctx, err, errlen))
                return -1;
            for (int k = 0; k < e->n_ctx; k++)
                if (e->ms0 + e->ms_per_ctx * e->ctx[k] < -1e-9)
                    FAIL("%s/ms_per_context: the fit is negative at context %d", at, e->ctx[k]);
        } else {
            cm_entry_fit_decode(e);
        }
        for (size_t k = 0; k < i; k++)
            if (same_key(&t->decode[k], e))
                FAIL("%s: duplicate of %s/decode/%zu", at, ptr, k);
        int found = 0;
        for (int k = 0; k < t->n_prefill; k++)
            found |= same_key(&t->prefill[k], e);
        if (!found)
            FAIL("%s: no prefill entry has the same part and size", at);
        t->n_decode = (int)i + 1;
    }
    for (int k = 0; k < t->n_prefill; k++) {
        int found = 0;
        for (int i = 0; i < t->n_decode; i++)
            found |= same_key(&t->prefill[k], &t->decode[i]);
        if (!found)
            FAIL("%s/prefill/%d: no decode entry has the same part and size", ptr, k);
    }
    return 0;
}

static int parse_fixed(json_t *fx, const char *ptr, cm_tables *t, char *err, size_t errlen)
{
    static const char *const keys[] = {"by_hidden", NULL};
    static const char *const hkeys[] = {"hidden_size", "prefill_embedding_ms", "prefill_head_ms",
                                        "prefill_other_ms", "decode_embedding_ms", "decode_head_ms",
                                        "decode_other_ms", "workspace_bytes", "prefill_scale", "decode_scale",
                                        NULL};
    char at[128];
    snprintf(at, sizeof at, "%s/fixed", ptr);
    if (!json_is_object(fx))
        FAIL("%s: must be an object", at);
    if (check_keys(fx, at, keys, err, errlen))
        return -1;
    json_t *arr = json_object_get(fx, "by_hidden");
    snprintf(at, sizeof at, "%s/fixed/by_hidden", ptr);
    if (!arr)
        FAIL("%s: required", at);
    if (!json_is_array(arr) || json_array_size(arr) == 0)
        FAIL("%s: must be a non-empty array", at);
    size_t n = json_array_size(arr);
    t->fixed = calloc(n, sizeof *t->fixed);
    if (!t->fixed)
        FAIL("%s: out of memory", at);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(arr, i);
        cm_fixed *f = &t->fixed[i];
        snprintf(at, sizeof at, "%s/fixed/by_hidden/%zu", ptr, i);
        if (!json_is_object(x))
            FAIL("%s: must be an object", at);
        /* "other" may be slightly negative: it is a difference of medians. */
        if (check_keys(x, at, hkeys, err, errlen) ||
            get_i32(x, at, "hidden_size", 1, 1 << 20, 1, &f->hidden_size, err, errlen) ||
            get_num(x, at, "prefill_embedding_ms", 0, 1, &f->prefill_embed_ms, err, errlen) ||
            get_num(x, at, "prefill_head_ms", 0, 1, &f->prefill_head_ms, err, errlen) ||
            get_num(x, at, "prefill_other_ms", -1e12, 1, &f->prefill_other_ms, err, errlen) ||
            get_num(x, at, "decode_embedding_ms", 0, 1, &f->decode_embed_ms, err, errlen) ||
            get_num(x, at, "decode_head_ms", 0, 1, &f->decode_head_ms, err, errlen) ||
            get_num(x, at, "decode_other_ms", -1e12, 1, &f->decode_other_ms, err, errlen) ||
            get_int(x, at, "workspace_bytes", 0, INT64_MAX, 1, &f->workspace_bytes, err, errlen))
            return -1;
        f->prefill_scale = f->decode_scale = 1;
        if (get_num(x, at, "prefill_scale", 0, 0, &f->prefill_scale, err, errlen) ||
            get_num(x, at, "decode_scale", 0, 0, &f->decode_scale, err, errlen))
            return -1;
        if (!(f->prefill_scale > 0) || !(f->decode_scale > 0))
            FAIL("%s/%s: must be positive", at, f->prefill_scale > 0 ? "decode_scale" : "prefill_scale");
        for (size_t k = 0; k < i; k++)
            if (t->fixed[k].hidden_size == f->hidden_size)
                FAIL("%s/hidden_size: duplicate of %s/fixed/by_hidden/%zu", at, ptr, k);
        t->n_fixed = (int)i + 1;
    }
    for (int k = 0; k < t->n_prefill; k++) {
        int found = 0;
        for (int i = 0; i < t->n_fixed; i++)
            found |= t->fixed[i].hidden_size == t->prefill[k].hidden_size;
        if (!found)
            FAIL("%s/prefill/%d/hidden_size: %d has no entry in fixed/by_hidden", ptr, k,
                 t->prefill[k].hidden_size);
    }
    return 0;
}

static int parse_memory(json_t *m, const char *ptr, cm_tables *t, char *err, size_t errlen)
{
    static const char *const keys[] = {"workspace_combine", "weight_bytes_per_param", "weight_overhead_bytes",
                                       "kv_bytes_per_element", "kv_overhead_bytes", "runtime_bytes", NULL};
    char at[128];
    snprintf(at, sizeof at, "%s/memory", ptr);
    if (!json_is_object(m))
        FAIL("%s: must be an object", at);
    if (check_keys(m, at, keys, err, errlen) ||
        get_num(m, at, "weight_bytes_per_param", 0, 1, &t->mem.weight_bytes_per_param, err, errlen) ||
        get_int(m, at, "weight_overhead_bytes", -(INT64_C(1) << 40), INT64_C(1) << 50, 1,
                &t->mem.weight_overhead_bytes, err, errlen) ||
        get_num(m, at, "kv_bytes_per_element", 0, 1, &t->mem.kv_bytes_per_elem, err, errlen) ||
        get_int(m, at, "kv_overhead_bytes", -(INT64_C(1) << 40), INT64_C(1) << 50, 1, &t->mem.kv_overhead_bytes,
                err, errlen) ||
        get_int(m, at, "runtime_bytes", 0, INT64_C(1) << 50, 1, &t->mem.runtime_bytes, err, errlen))
        return -1;
    json_t *wc = json_object_get(m, "workspace_combine");
    t->mem.workspace_combine = CM_WS_MAX;
    if (wc) {
        if (!json_is_string(wc))
            FAIL("%s/workspace_combine: must be a string (\"max\" or \"sum_of_part_maxima\")", at);
        if (!strcmp(json_string_value(wc), "sum_of_part_maxima"))
            t->mem.workspace_combine = CM_WS_SUM_MAXIMA;
        else if (strcmp(json_string_value(wc), "max"))
            FAIL("%s/workspace_combine: \"%s\" is not \"max\" or \"sum_of_part_maxima\"", at,
                 json_string_value(wc));
    }
    if (!(t->mem.weight_bytes_per_param > 0))
        FAIL("%s/weight_bytes_per_param: must be positive", at);
    if (!(t->mem.kv_bytes_per_elem > 0))
        FAIL("%s/kv_bytes_per_element: must be positive", at);
    return 0;
}

static int parse_shape(json_t *s, const char *ptr, cm_tables *t, char *err, size_t errlen)
{
    static const char *const keys[] = {"family", "vocab_size", "head_dim", "tie_word_embeddings",
                                       "attention_bias", NULL};
    char at[128];
    snprintf(at, sizeof at, "%s/shape", ptr);
    if (!json_is_object(s))
        FAIL("%s: must be an object", at);
    if (check_keys(s, at, keys, err, errlen) ||
        get_str(s, at, "family", 1, t->family, sizeof t->family, err, errlen) ||
        get_i32(s, at, "vocab_size", 1, 1 << 24, 1, &t->vocab_size, err, errlen) ||
        get_i32(s, at, "head_dim", 1, 1 << 14, 1, &t->head_dim, err, errlen))
        return -1;
    json_t *tie = json_object_get(s, "tie_word_embeddings"), *bias = json_object_get(s, "attention_bias");
    if (!tie || !json_is_boolean(tie))
        FAIL("%s/tie_word_embeddings: required, true or false", at);
    if (bias && !json_is_boolean(bias))
        FAIL("%s/attention_bias: must be true or false", at);
    t->tie_word_embeddings = json_is_true(tie);
    t->attention_bias = bias && json_is_true(bias);
    return 0;
}

int cm_tables_from_json(json_t *j, const char *ptr, cm_tables *t, char *err, size_t errlen)
{
    static const char *const keys[] = {"shape", "prefill", "decode", "fixed", "memory", NULL};
    cm_target keep = t->target;
    memset(t, 0, sizeof *t);
    t->target = keep;
    snprintf(t->source, sizeof t->source, "autocompress");
    int rc = -1;
    if (!json_is_object(j)) {
        snprintf(err, errlen, "%s: must be an object", ptr);
        return -1;
    }
    const char *need[] = {"shape", "prefill", "decode", "fixed", "memory"};
    for (int i = 0; i < 5; i++)
        if (!json_object_get(j, need[i])) {
            snprintf(err, errlen, "%s/%s: required", ptr, need[i]);
            return -1;
        }
    if (!check_keys(j, ptr, keys, err, errlen) && !parse_shape(json_object_get(j, "shape"), ptr, t, err, errlen) &&
        !parse_prefill(json_object_get(j, "prefill"), ptr, t, err, errlen) &&
        !parse_decode(json_object_get(j, "decode"), ptr, t, err, errlen) &&
        !parse_fixed(json_object_get(j, "fixed"), ptr, t, err, errlen) &&
        !parse_memory(json_object_get(j, "memory"), ptr, t, err, errlen))
        rc = 0;
    if (rc) {
        cm_tables_free(t);
        memset(t, 0, sizeof *t);
    }
    return rc;
}

int cm_tables_import(json_t *doc, cm_tables *t, char *err, size_t errlen)
{
    static const char *const keys[] = {"format", "target", "tables", "source", NULL};
    memset(t, 0, sizeof *t);
    if (!json_is_object(doc))
        FAIL(": the document must be a JSON object");
    if (check_keys(doc, "", keys, err, errlen))
        return -1;
    json_t *f = json_object_get(doc, "format");
    if (!f)
        FAIL("/format: required (\"autocompress.timing-tables/1\")");
    if (!json_is_string(f) || strcmp(json_string_value(f), "autocompress.timing-tables/1"))
        FAIL("/format: must be \"autocompress.timing-tables/1\"");
    json_t *tg = json_object_get(doc, "target"), *tb = json_object_get(doc, "tables");
    if (!tg)
        FAIL("/target: required");
    if (!tb)
        FAIL("/tables: required");
    cm_target target;
    if (cm_target_from_json(tg, "/target", &target, err, errlen))
        return -1;
    t->target = target;
    if (cm_tables_from_json(tb, "/tables", t, err, errlen))
        return -1;
    snprintf(t->source, sizeof t->source, "import");
    char src[32] = "";
    if (get_str(doc, "", "source", 0, src, sizeof src, err, errlen)) {
        cm_tables_free(t);
        return -1;
    }
    return 0;
}

/* ---------- interpolation ---------- */

/* Linear interpolation of y over sorted distinct xs (n >= 1) at x: exact on points,
 * between the bracketing pair inside, extrapolated from the outermost pair below the
 * smallest point (clamped at 0); beyond the largest point is refused (-1). */
static int interp(const double *xs, const double *ys, int n, double x, double *y)
{
    if (n == 1) {
        if (x != xs[0])
            return -1;
        *y = ys[0];
        return 0;
    }
    if (x > xs[n - 1] + 1e-9)
        return -1;
    int i = 1;
    while (i < n - 1 && xs[i] < x)
        i++;
    for (int k = 0; k < n; k++)
        if (xs[k] == x) {
            *y = ys[k];
            return 0;
        }
    double v = ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1]);
    *y = v < 0 ? 0 : v;
    return 0;
}

/* Values of one entry used by predictions, at the tables' workload. */
static void entry_values(const cm_tables *t, const cm_entry *pre, const cm_entry *dec, double v[3])
{
    double S = t->target.prompt_tokens, N = t->target.output_tokens;
    v[0] = pre->ms;
    /* sum_{c=S}^{S+N-1} (ms0 + slope*c) */
    v[1] = dec ? N * dec->ms0 + dec->ms_per_ctx * (N * S + N * (N - 1) / 2) : 0;
    v[2] = pre->workspace_bytes >= 0 ? (double)pre->workspace_bytes : 0;
}

static const cm_entry *find_decode(const cm_tables *t, const cm_entry *pre)
{
    for (int i = 0; i < t->n_decode; i++)
        if (same_key(&t->decode[i], pre))
            return &t->decode[i];
    return NULL;
}

#define MAX_GRID 256

/* Grid points of one part at one hidden size along one axis, sorted by x:
 *   mlp: x = ffn_dim (nonzero entries);
 *   attention axis 0: entries with n_kv_heads == nkv, x = n_heads;
 *   attention axis 1: entries with the same group size n_heads/n_kv_heads, x = n_kv_heads.
 * ys[j] are the entry values (prefill ms, decode ms over the workload, workspace). */
static int collect(const cm_tables *t, int part, int hidden, int axis, int nh, int nkv, double *xs,
                   double ys[3][MAX_GRID])
{
    int n = 0;
    for (int i = 0; i < t->n_prefill && n < MAX_GRID; i++) {
        const cm_entry *e = &t->prefill[i];
        if (e->part != part || e->hidden_size != hidden)
            continue;
        double x;
        if (part == CM_MLP) {
            if (e->ffn_dim == 0)
                continue;
            x = e->ffn_dim;
        } else if (e->n_heads == 0) {
            continue;
        } else if (axis == 0) {
            if (e->n_kv_heads != nkv)
                continue;
            x = e->n_heads;
        } else {
            if ((int64_t)e->n_heads * nkv != (int64_t)nh * e->n_kv_heads)
                continue;
            x = e->n_kv_heads;
        }
        double v[3];
        entry_values(t, e, find_decode(t, e), v);
        int k = n++;
        while (k > 0 && xs[k - 1] > x) {   /* insertion sort by x */
            xs[k] = xs[k - 1];
            for (int j = 0; j < 3; j++)
                ys[j][k] = ys[j][k - 1];
            k--;
        }
        xs[k] = x;
        for (int j = 0; j < 3; j++)
            ys[j][k] = v[j];
    }
    return n;
}

/* Part cost at an exact calibrated hidden size. 0, or -1 outside the grid. */
static int part_at_hidden(const cm_tables *t, int part, int hidden, int nh, int nkv, int ffn, double out[3])
{
    double xs[MAX_GRID], ys[3][MAX_GRID];
    if ((part == CM_ATTN && nh == 0) || (part == CM_MLP && ffn == 0)) {
        /* Removed: an explicit size-0 entry if calibrated, else nothing runs. */
        for (int i = 0; i < t->n_prefill; i++) {
            const cm_entry *e = &t->prefill[i];
            if (e->part == part && e->hidden_size == hidden &&
                (part == CM_ATTN ? e->n_heads == 0 : e->ffn_dim == 0)) {
                entry_values(t, e, find_decode(t, e), out);
                return 0;
            }
        }
        out[0] = out[1] = out[2] = 0;
        return 0;
    }
    for (int axis = 0; axis < (part == CM_ATTN ? 2 : 1); axis++) {
        int n = collect(t, part, hidden, axis, nh, nkv, xs, ys);
        double x = part == CM_MLP ? ffn : axis == 0 ? nh : nkv;
        int ok = n > 0;
        for (int j = 0; ok && j < 3; j++)
            ok = !interp(xs, ys[j], n, x, &out[j]);
        if (ok)
            return 0;
    }
    return -1;
}

/* Sorted distinct calibrated hidden sizes (from fixed/by_hidden). */
static int hidden_sizes(const cm_tables *t, int *hs)
{
    int n = 0;
    for (int i = 0; i < t->n_fixed && n < MAX_GRID; i++) {
        int h = t->fixed[i].hidden_size, k = n++;
        while (k > 0 && hs[k - 1] > h) {
            hs[k] = hs[k - 1];
            k--;
        }
        hs[k] = h;
    }
    return n;
}

/* Bracket hidden size h: lo/hi calibrated sizes and weight w of hi (exact: lo == hi). */
static int hidden_bracket(const cm_tables *t, int h, int *lo, int *hi, double *w)
{
    int hs[MAX_GRID], n = hidden_sizes(t, hs);
    for (int i = 0; i < n; i++)
        if (hs[i] == h) {
            *lo = *hi = h;
            *w = 0;
            return 0;
        }
    for (int i = 1; i < n; i++)
        if (hs[i - 1] < h && h < hs[i]) {
            *lo = hs[i - 1];
            *hi = hs[i];
            *w = (double)(h - *lo) / (*hi - *lo);
            return 0;
        }
    return -1;
}

static const cm_fixed *fixed_at(const cm_tables *t, int h);

/* Phase scales at hidden h (interpolated between calibrated hidden sizes). */
static void scales_at(const cm_tables *t, int lo, int hi, double w, double *sp, double *sd)
{
    const cm_fixed *a = fixed_at(t, lo), *b = fixed_at(t, hi);
    double pa = a && a->prefill_scale > 0 ? a->prefill_scale : 1, pb = b && b->prefill_scale > 0 ? b->prefill_scale : 1;
    double da = a && a->decode_scale > 0 ? a->decode_scale : 1, db = b && b->decode_scale > 0 ? b->decode_scale : 1;
    *sp = pa + w * (pb - pa);
    *sd = da + w * (db - da);
}

int cm_part_cost(const cm_tables *t, int part, int hidden, int n_heads, int n_kv_heads, int ffn_dim,
                 double *prefill_ms, double *decode_ms, double *workspace_bytes)
{
    int lo, hi;
    double w, a[3], b[3], sp, sd;
    if (hidden_bracket(t, hidden, &lo, &hi, &w))
        return -1;
    scales_at(t, lo, hi, w, &sp, &sd);
    if (part_at_hidden(t, part, lo, n_heads, n_kv_heads, ffn_dim, a))
        return -1;
    if (hi != lo) {
        if (part_at_hidden(t, part, hi, n_heads, n_kv_heads, ffn_dim, b))
            return -1;
        for (int j = 0; j < 3; j++)
            a[j] += w * (b[j] - a[j]);
    }
    if (prefill_ms)
        *prefill_ms = sp * a[0];
    if (decode_ms)
        *decode_ms = sd * a[1];
    if (workspace_bytes)
        *workspace_bytes = a[2];
    return 0;
}

static const cm_fixed *fixed_at(const cm_tables *t, int h)
{
    for (int i = 0; i < t->n_fixed; i++)
        if (t->fixed[i].hidden_size == h)
            return &t->fixed[i];
    return NULL;
}

/* Fixed costs at hidden h (interpolated): prefill ms, decode ms over N steps, workspace. */
int cm_fixed_cost(const cm_tables *t, int hidden, double *prefill_ms, double *decode_ms, double *workspace_bytes)
{
    int lo, hi;
    double w;
    if (hidden_bracket(t, hidden, &lo, &hi, &w))
        return -1;
    const cm_fixed *a = fixed_at(t, lo), *b = fixed_at(t, hi);
    double N = t->target.output_tokens;
    double pa = a->prefill_embed_ms + a->prefill_head_ms + a->prefill_other_ms;
    double pb = b->prefill_embed_ms + b->prefill_head_ms + b->prefill_other_ms;
    double da = N * (a->decode_embed_ms + a->decode_head_ms + a->decode_other_ms);
    double db = N * (b->decode_embed_ms + b->decode_head_ms + b->decode_other_ms);
    double sp, sd;
    scales_at(t, lo, hi, w, &sp, &sd);
    if (prefill_ms)
        *prefill_ms = sp * (pa + w * (pb - pa));
    if (decode_ms)
        *decode_ms = sd * (da + w * (db - da));
    if (workspace_bytes)
        *workspace_bytes = a->workspace_bytes + w * ((double)b->workspace_bytes - a->workspace_bytes);
    return 0;
}

int cm_predict(const cm_tables *t, const arch *a, cm_prediction *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (strcmp(a->family, t->family))
        FAIL("arch family \"%s\" differs from the tables' \"%s\"", a->family, t->family);
    if (a->vocab_size != t->vocab_size || a->head_dim != t->head_dim ||
        !!a->tie_word_embeddings != !!t->tie_word_embeddings || !!a->attention_bias != !!t->attention_bias)
        FAIL("arch globals (vocab_size %d, head_dim %d, tied %d, bias %d) differ from the tables' (%d, %d, %d, %d)",
             a->vocab_size, a->head_dim, a->tie_word_embeddings, a->attention_bias, t->vocab_size, t->head_dim,
             t->tie_word_embeddings, t->attention_bias);
    int C = a->hidden_size;
    double pre, dec, ws;
    if (cm_fixed_cost(t, C, &pre, &dec, &ws))
        FAIL("hidden_size %d lies outside the calibrated hidden sizes", C);
    double ws_max = ws, ws_attn = ws, ws_mlp = ws, kv_elems = 0;
    double B = t->target.batch_size, T = t->target.prompt_tokens + t->target.output_tokens;
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        double lp, ld, lw;
        if (cm_part_cost(t, CM_ATTN, C, l->n_heads, l->n_kv_heads, 0, &lp, &ld, &lw))
            FAIL("layers[%d].attention (%d heads, %d kv heads) lies outside the timing tables", i, l->n_heads,
                 l->n_kv_heads);
        pre += lp;
        dec += ld;
        ws_max = lw > ws_max ? lw : ws_max;
        ws_attn = lw > ws_attn ? lw : ws_attn;
        if (cm_part_cost(t, CM_MLP, C, 0, 0, l->ffn_dim, &lp, &ld, &lw))
            FAIL("layers[%d].mlp (ffn_dim %d) lies outside the timing tables", i, l->ffn_dim);
        pre += lp;
        dec += ld;
        ws_max = lw > ws_max ? lw : ws_max;
        ws_mlp = lw > ws_mlp ? lw : ws_mlp;
        if (l->n_heads)
            kv_elems += 2.0 * l->n_kv_heads * a->head_dim * B * T;
    }
    p->prefill_ms = pre;
    p->decode_ms = dec;
    p->decode_ms_per_token = dec / t->target.output_tokens;
    p->latency_ms = pre + dec;
    p->throughput_tps = dec > 0 ? B * t->target.output_tokens / dec * 1000.0 : 0;
    p->params = arch_params(a);
    p->weights = (int64_t)llround(t->mem.weight_bytes_per_param * (double)p->params) + t->mem.weight_overhead_bytes;
    p->request_cache = kv_elems > 0 ? (int64_t)llround(t->mem.kv_bytes_per_elem * kv_elems) + t->mem.kv_overhead_bytes : 0;
    if (t->mem.workspace_combine == CM_WS_SUM_MAXIMA)
        p->prefill_workspace = (int64_t)llround(ws_attn + ws_mlp - ws);
    else
        p->prefill_workspace = (int64_t)llround(ws_max);
    p->runtime_buffers = t->mem.runtime_bytes;
    p->total = p->weights + p->request_cache + p->prefill_workspace + p->runtime_buffers;
    p->naive_bytes = (int64_t)llround(t->mem.weight_bytes_per_param * (double)p->params +
                                      t->mem.kv_bytes_per_elem * kv_elems);
    return 0;
}

json_t *cm_prediction_to_json(const cm_prediction *p)
{
    return json_pack("{s:f,s:f,s:f,s:f,s:{s:I,s:I,s:I,s:I,s:I}}", "latency_ms", p->latency_ms, "prefill_ms",
                     p->prefill_ms, "decode_ms_per_token", p->decode_ms_per_token, "throughput_tokens_per_s",
                     p->throughput_tps, "memory_bytes", "weights", (json_int_t)p->weights, "request_cache",
                     (json_int_t)p->request_cache, "prefill_workspace", (json_int_t)p->prefill_workspace,
                     "runtime_buffers", (json_int_t)p->runtime_buffers, "total", (json_int_t)p->total);
}

/* ---------- ids and the cache ---------- */

void cm_calibration_id(const cm_target *t, const arch *a, char id[40])
{
    int maxh = 0, maxkv = 0, maxf = 0;
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        maxh = l->n_heads > maxh ? l->n_heads : maxh;
        maxkv = l->n_kv_heads > maxkv ? l->n_kv_heads : maxkv;
        maxf = l->ffn_dim > maxf ? l->ffn_dim : maxf;
    }
    char buf[512];
    int n = snprintf(buf, sizeof buf, "v1|%s|%s|%s|V%d|C%d|D%d|tie%d|bias%d|H%d|KV%d|F%d|B%d|S%d|N%d", t->device,
                     t->precision, a->family, a->vocab_size, a->hidden_size, a->head_dim, a->tie_word_embeddings,
                     a->attention_bias, maxh, maxkv, maxf, t->batch_size, t->prompt_tokens, t->output_tokens);
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)buf, (size_t)(n < 0 ? 0 : n), md);
    int o = snprintf(id, 40, "cal_");
    for (int i = 0; i < 8; i++)
        o += snprintf(id + o, (size_t)(40 - o), "%02x", md[i]);
}

int cm_calibration_path(const char *data_dir, const char *id, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s/calibrations/%s.json", data_dir, id);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

json_t *cm_calibration_load(const char *data_dir, const char *id, char *err, size_t errlen)
{
    char path[4096];
    json_error_t je;
    if (strncmp(id, "cal_", 4) || strchr(id, '/') || strchr(id, '.')) {
        snprintf(err, errlen, "%s: not a calibration id", id);
        return NULL;
    }
    if (cm_calibration_path(data_dir, id, path, sizeof path)) {
        snprintf(err, errlen, "data directory path too long");
        return NULL;
    }
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        snprintf(err, errlen, "%s: %s", path, je.text);
    return j;
}

int cm_calibration_save(const char *data_dir, json_t *cal, char *err, size_t errlen)
{
    char dir[4096], path[4096];
    json_t *idj = json_object_get(cal, "id");
    if (!json_is_string(idj))
        FAIL("calibration has no id");
    int n = snprintf(dir, sizeof dir, "%s/calibrations", data_dir);
    if (n < 0 || (size_t)n >= sizeof dir || cm_calibration_path(data_dir, json_string_value(idj), path, sizeof path))
        FAIL("data directory path too long");
    if (fio_mkdirs(dir))
        FAIL("%s: %s", dir, strerror(errno));
    if (fio_write_json(path, cal, JSON_INDENT(1) | JSON_SORT_KEYS, err, errlen))
        return -1;
    return 0;
}

/* Parse target and tables of a calibration object. 0 or -1. */
int cm_calibration_tables(json_t *cal, cm_tables *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    cm_target tg;
    if (!json_is_object(cal))
        FAIL("calibration: must be an object");
    if (cm_target_from_json(json_object_get(cal, "target"), "/target", &tg, err, errlen))
        return -1;
    t->target = tg;
    if (cm_tables_from_json(json_object_get(cal, "tables"), "/tables", t, err, errlen))
        return -1;
    json_t *idj = json_object_get(cal, "id");
    if (json_is_string(idj))
        snprintf(t->id, sizeof t->id, "%s", json_string_value(idj));
    return 0;
}

static int same_target(const cm_target *a, const cm_target *b)
{
    return !strcmp(a->device, b->device) && !strcmp(a->precision, b->precision) &&
           a->batch_size == b->batch_size && a->prompt_tokens == b->prompt_tokens &&
           a->output_tokens == b->output_tokens;
}

json_t *cm_calibration_find(const char *data_dir, const cm_target *t, const arch *a)
{
    char dir[4096], e[256];
    int n = snprintf(dir, sizeof dir, "%s/calibrations", data_dir);
    if (n < 0 || (size_t)n >= sizeof dir)
        return NULL;
    /* The parent's own id first (the common case), then any covering calibration. */
    char id[40];
    cm_calibration_id(t, a, id);
    json_t *cal = cm_calibration_load(data_dir, id, e, sizeof e);
    if (cal) {
        json_t *st = json_object_get(cal, "status");
        if (json_is_string(st) && !strcmp(json_string_value(st), "succeeded"))
            return cal;
        json_decref(cal);
    }
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    struct dirent *de;
    json_t *found = NULL;
    while (!found && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (strncmp(de->d_name, "cal_", 4) || len < 6 || strcmp(de->d_name + len - 5, ".json") || len - 5 >= 40)
            continue;
        char cid[40];
        snprintf(cid, sizeof cid, "%.*s", (int)(len - 5), de->d_name);
        cal = cm_calibration_load(data_dir, cid, e, sizeof e);
        if (!cal)
            continue;
        json_t *st = json_object_get(cal, "status");
        cm_tables tb;
        cm_prediction p;
        if (json_is_string(st) && !strcmp(json_string_value(st), "succeeded") &&
            !cm_calibration_tables(cal, &tb, e, sizeof e)) {
            if (same_target(&tb.target, t) && !cm_predict(&tb, a, &p, e, sizeof e))
                found = cal;
            cm_tables_free(&tb);
        }
        if (!found)
            json_decref(cal);
    }
    closedir(d);
    return found;
}

/* ---------- arch from a model path ---------- */

int cm_load_arch(const char *path, arch *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    size_t n = strlen(path);
    struct stat st;
    if (n > 5 && !strcmp(path + n - 5, ".json") && !stat(path, &st) && S_ISREG(st.st_mode)) {
        /* a shape alone: an arch JSON (DESIGN.md §10) or an HF config.json */
        json_error_t je;
        json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
        if (!j)
            FAIL("%s:%d: %s", path, je.line, je.text);
        int rc;
        char e2[400];
        if (json_object_get(j, "layers"))
            rc = arch_from_json(j, a, e2, sizeof e2);
        else
            rc = hfconfig_to_arch(j, a, e2, sizeof e2);
        json_decref(j);
        if (rc)
            FAIL("%s: %s", path, e2);
        return 0;
    }
    /* a model in any format: the one probe and reader of storage/modelio (weights unread) */
    mio_model m;
    if (mio_open(&m, path, NULL, err, errlen))
        return -1;
    int rc = arch_copy(a, &m.a);
    mio_close(&m);
    if (rc)
        FAIL("%s: out of memory copying the shape", path);
    return 0;
}

/* ---------- POST /v1/estimates ---------- */

cm_est_status cm_estimate(const arch *a, const cm_target *tg, const char *data_dir, json_t **out, char *err,
                          size_t errlen)
{
    *out = NULL;
    json_t *cal = cm_calibration_find(data_dir, tg, a);
    if (!cal) {
        char id[40];
        cm_calibration_id(tg, a, id);
        snprintf(err, errlen,
                 "no calibration covers this arch on target %s/%s (batch %d, prompt %d, output %d): run calibration "
                 "%s first (POST /v1/calibrations with this arch and target, or `autocompress calibrate`)",
                 tg->device, tg->precision, tg->batch_size, tg->prompt_tokens, tg->output_tokens, id);
        return CM_EST_UNCALIBRATED;
    }
    cm_tables tb;
    cm_prediction p;
    memset(&tb, 0, sizeof tb);
    cm_est_status rc = CM_EST_UNCOVERED;
    if (!cm_calibration_tables(cal, &tb, err, errlen) && !cm_predict(&tb, a, &p, err, errlen)) {
        json_t *pj = cm_prediction_to_json(&p), *arj = arch_to_json(a);
        *out = pj && arj ? json_pack("{s:s,s:O,s:I,s:O,s:I}", "calibration_id", tb.id, "arch", arj, "params",
                                     (json_int_t)p.params, "predicted", pj, "naive_weights_plus_kv_bytes",
                                     (json_int_t)p.naive_bytes)
                         : NULL;
        json_decref(pj);
        json_decref(arj);
        rc = *out ? CM_EST_OK : CM_EST_FAILED;
        if (!*out)
            snprintf(err, errlen, "out of memory");
    }
    cm_tables_free(&tb);
    json_decref(cal);
    return rc;
}
