/* compress/cm_tables.c — the timing tables to and from JSON (docs/timing-tables.md):
 * strict reading with a JSON pointer for each fault, writing with sorted keys, and the
 * import of tables measured in another engine. No prediction here (costmodel.c).
 */
#include "compress/costmodel.h"
#include "storage/strbuf.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compress/costmodel_internal.h"

static const char *const part_names[] = {"attention", "mlp"};

/* ---------- small JSON readers (strict, with pointers) ---------- */

int cmj_check_keys(json_t *o, const char *at, const char *const *known, char *err, size_t errlen)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; known[i]; i++)
            ok |= !strcmp(k, known[i]);
        if (!ok) {
            char p[300];
            json_ptr_join(p, sizeof p, at, k);   /* a key with '/' or '~' is one token of it */
            FAIL("%s: unknown key", p);
        }
    }
    return 0;
}

/* Member k of o into *v: 1 when present, 0 when absent and not required, -1 (err
 * naming "at/k") when absent and required. */
static int member(json_t *o, const char *at, const char *k, int required, json_t **v, char *err, size_t errlen)
{
    *v = json_object_get(o, k);
    if (*v)
        return 1;
    if (required)
        FAIL("%s/%s: required", at, k);
    return 0;
}

int cmj_int(json_t *o, const char *at, const char *k, int64_t lo, int64_t hi, int required,
            int64_t *out, char *err, size_t errlen)
{
    json_t *v;
    int have = member(o, at, k, required, &v, err, errlen);
    if (have <= 0)
        return have;
    if (!json_is_integer(v))
        FAIL("%s/%s: must be an integer", at, k);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        FAIL("%s/%s: %lld is out of range [%lld, %lld]", at, k, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

int cmj_i32(json_t *o, const char *at, const char *k, int lo, int hi, int required, int *out,
            char *err, size_t errlen)
{
    int64_t x = *out;
    if (cmj_int(o, at, k, lo, hi, required, &x, err, errlen))
        return -1;
    *out = (int)x;
    return 0;
}

/* A finite number >= lo. */
int cmj_num(json_t *o, const char *at, const char *k, double lo, int required, double *out,
            char *err, size_t errlen)
{
    json_t *v;
    int have = member(o, at, k, required, &v, err, errlen);
    if (have <= 0)
        return have;
    if (!json_is_number(v))
        FAIL("%s/%s: must be a number", at, k);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo)
        FAIL("%s/%s: must be a finite number >= %g", at, k, lo);
    *out = x;
    return 0;
}

int cmj_str(json_t *o, const char *at, const char *k, int required, char *out, size_t outlen,
            char *err, size_t errlen)
{
    json_t *v;
    int have = member(o, at, k, required, &v, err, errlen);
    if (have <= 0)
        return have;
    if (!json_is_string(v))
        FAIL("%s/%s: must be a string", at, k);
    const char *s = json_string_value(v);
    if (!*s || strlen(s) >= outlen)
        FAIL("%s/%s: must be a non-empty string shorter than %zu bytes", at, k, outlen);
    snprintf(out, outlen, "%s", s);
    return 0;
}

/* ---------- tables <-> JSON ---------- */
int cm_tables_copy(cm_tables *dst, const cm_tables *src)
{
    *dst = *src;
    dst->prefill = malloc(sizeof *dst->prefill * (size_t)(src->n_prefill > 0 ? src->n_prefill : 1));
    dst->decode = malloc(sizeof *dst->decode * (size_t)(src->n_decode > 0 ? src->n_decode : 1));
    dst->fixed = malloc(sizeof *dst->fixed * (size_t)(src->n_fixed > 0 ? src->n_fixed : 1));
    if (!dst->prefill || !dst->decode || !dst->fixed) {
        cm_tables_free(dst);
        return -1;
    }
    memcpy(dst->prefill, src->prefill, sizeof *dst->prefill * (size_t)src->n_prefill);
    memcpy(dst->decode, src->decode, sizeof *dst->decode * (size_t)src->n_decode);
    memcpy(dst->fixed, src->fixed, sizeof *dst->fixed * (size_t)src->n_fixed);
    return 0;
}

void cm_tables_rescale(cm_tables *t, double prefill, double decode)
{
    for (int f = 0; f < t->n_fixed; f++) {
        t->fixed[f].prefill_scale = (t->fixed[f].prefill_scale > 0 ? t->fixed[f].prefill_scale : 1) * prefill;
        t->fixed[f].decode_scale = (t->fixed[f].decode_scale > 0 ? t->fixed[f].decode_scale : 1) * decode;
    }
}


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
        const arch_mamba *m = &e->mamba;
        if (m->n_heads)
            rc |= set_new(o, "mamba", json_pack("{s:i,s:i,s:i,s:i,s:i}", "n_heads", m->n_heads, "head_dim",
                                                m->head_dim, "d_state", m->d_state, "n_groups", m->n_groups,
                                                "conv_kernel", m->conv_kernel));
    } else {
        rc |= set_new(o, "ffn_dim", json_integer(e->ffn_dim));
        json_t *mo = e->n_experts ? json_pack("{s:i,s:i,s:i,s:i}", "n_experts", e->n_experts, "top_k", e->top_k,
                                              "expert_ffn_dim", e->expert_ffn_dim, "shared_ffn_dim",
                                              e->shared_ffn_dim) : NULL;
        if (mo && e->latent_dim)
            rc |= set_new(mo, "latent_dim", json_integer(e->latent_dim));
        if (e->n_experts)
            rc |= set_new(o, "moe", mo);
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
    if (!rc && t->width_multiple > 1)
        rc |= set_new(o, "width_multiple", json_integer(t->width_multiple));
    if (!rc && t->parent_bias_prefill > 0 && t->parent_bias_decode > 0)
        rc |= set_new(o, "parent_bias",
                      json_pack("{s:f,s:f}", "prefill", t->parent_bias_prefill, "decode", t->parent_bias_decode));
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
        json_t *mo = json_object_get(o, "memory");
        if (!rc && mo && t->mem.embed_bytes_per_param > 0)
            rc |= set_new(mo, "embed_bytes_per_param", json_real(t->mem.embed_bytes_per_param));
        if (!rc && mo && t->mem.state_bytes_per_elem > 0)
            rc |= set_new(mo, "state_bytes_per_element", json_real(t->mem.state_bytes_per_elem));
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

int cm_same_key(const cm_entry *a, const cm_entry *b)
{
    if (a->part != b->part || a->hidden_size != b->hidden_size)
        return 0;
    return a->part == CM_ATTN ? a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
                                    !memcmp(&a->mamba, &b->mamba, sizeof a->mamba)
                              : a->ffn_dim == b->ffn_dim && a->n_experts == b->n_experts && a->top_k == b->top_k &&
                                    a->expert_ffn_dim == b->expert_ffn_dim && a->shared_ffn_dim == b->shared_ffn_dim &&
                                    a->latent_dim == b->latent_dim;
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
    if (cmj_i32(x, at, "hidden_size", 1, 1 << 20, 1, &e->hidden_size, err, errlen))
        return -1;
    if (e->part == CM_ATTN) {
        if (json_object_get(x, "ffn_dim"))
            FAIL("%s/ffn_dim: not allowed on an attention entry", at);
        if (cmj_i32(x, at, "n_heads", 0, 1 << 16, 1, &e->n_heads, err, errlen) ||
            cmj_i32(x, at, "n_kv_heads", 0, 1 << 16, 1, &e->n_kv_heads, err, errlen))
            return -1;
        if ((e->n_heads == 0) != (e->n_kv_heads == 0))
            FAIL("%s/n_kv_heads: must be 0 exactly when n_heads is 0", at);
        if (e->n_heads && e->n_heads % e->n_kv_heads)
            FAIL("%s/n_kv_heads: %d does not divide n_heads %d", at, e->n_kv_heads, e->n_heads);
        json_t *mb = json_object_get(x, "mamba");
        if (mb) {
            static const char *const mk[] = {"n_heads", "head_dim", "d_state", "n_groups", "conv_kernel", NULL};
            char mat[160];
            arch_mamba *m = &e->mamba;
            snprintf(mat, sizeof mat, "%s/mamba", at);
            if (!json_is_object(mb))
                FAIL("%s: must be an object", mat);
            if (cmj_check_keys(mb, mat, mk, err, errlen) ||
                cmj_i32(mb, mat, "n_heads", 1, 4096, 1, &m->n_heads, err, errlen) ||
                cmj_i32(mb, mat, "head_dim", 1, 1024, 1, &m->head_dim, err, errlen) ||
                cmj_i32(mb, mat, "d_state", 1, 1024, 1, &m->d_state, err, errlen) ||
                cmj_i32(mb, mat, "n_groups", 1, m->n_heads, 1, &m->n_groups, err, errlen) ||
                cmj_i32(mb, mat, "conv_kernel", 1, 16, 1, &m->conv_kernel, err, errlen))
                return -1;
            if (m->n_heads % m->n_groups)
                FAIL("%s/n_groups: %d does not divide n_heads %d", mat, m->n_groups, m->n_heads);
            if (e->n_heads)
                FAIL("%s/n_heads: must be 0 on a Mamba entry", at);
        }
    } else {
        if (json_object_get(x, "n_heads") || json_object_get(x, "n_kv_heads"))
            FAIL("%s: n_heads/n_kv_heads not allowed on an mlp entry", at);
        if (cmj_i32(x, at, "ffn_dim", 0, 1 << 24, 1, &e->ffn_dim, err, errlen))
            return -1;
        json_t *moe = json_object_get(x, "moe");
        if (moe) {
            static const char *const mk[] = {"n_experts", "top_k", "expert_ffn_dim", "shared_ffn_dim", "latent_dim",
                                             NULL};
            char mat[160];
            snprintf(mat, sizeof mat, "%s/moe", at);
            if (!json_is_object(moe))
                FAIL("%s: must be an object", mat);
            if (cmj_check_keys(moe, mat, mk, err, errlen) ||
                cmj_i32(moe, mat, "n_experts", 1, 4096, 1, &e->n_experts, err, errlen) ||
                cmj_i32(moe, mat, "top_k", 1, e->n_experts, 1, &e->top_k, err, errlen) ||
                cmj_i32(moe, mat, "expert_ffn_dim", 1, 1 << 24, 1, &e->expert_ffn_dim, err, errlen) ||
                cmj_i32(moe, mat, "shared_ffn_dim", 0, 1 << 24, 1, &e->shared_ffn_dim, err, errlen) ||
                cmj_i32(moe, mat, "latent_dim", 0, 65536, 0, &e->latent_dim, err, errlen))
                return -1;
            if (e->ffn_dim)
                FAIL("%s/ffn_dim: must be 0 on an MoE entry", at);
        }
    }
    return 0;
}

/* One table of entries (prefill or decode): an array of objects with the given keys,
 * each read by fields() after its key, no two with the same key. *out gets the NEW array
 * and *n its length as far as it was read. 0, or -1 with err naming the pointer. */
typedef int (*entry_fields_fn)(json_t *x, const char *at, cm_entry *e, const cm_tables *t, char *err,
                               size_t errlen);

static int parse_entries(json_t *arr, const char *ptr, const char *name, const char *const *keys,
                         entry_fields_fn fields, const cm_tables *t, cm_entry **out, int *n_out, char *err,
                         size_t errlen)
{
    char at[128];
    snprintf(at, sizeof at, "%s/%s", ptr, name);
    if (!json_is_array(arr))
        FAIL("%s: must be an array", at);
    size_t n = json_array_size(arr);
    if (n == 0)
        FAIL("%s: must have at least one entry", at);
    *out = calloc(n, sizeof **out);
    if (!*out)
        FAIL("%s: out of memory", at);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(arr, i);
        cm_entry *e = &(*out)[i];
        snprintf(at, sizeof at, "%s/%s/%zu", ptr, name, i);
        if (!json_is_object(x))
            FAIL("%s: must be an object", at);
        e->workspace_bytes = -1;
        e->samples = 1;
        if (cmj_check_keys(x, at, keys, err, errlen) || parse_entry_key(x, at, e, err, errlen) ||
            fields(x, at, e, t, err, errlen))
            return -1;
        for (size_t k = 0; k < i; k++)
            if (cm_same_key(&(*out)[k], e))
                FAIL("%s: duplicate of %s/%s/%zu", at, ptr, name, k);
        *n_out = (int)i + 1;
    }
    return 0;
}

static int prefill_fields(json_t *x, const char *at, cm_entry *e, const cm_tables *t, char *err, size_t errlen)
{
    (void)t;
    return cmj_num(x, at, "ms", 0, 1, &e->ms, err, errlen) || cmj_num(x, at, "mad_ms", 0, 0, &e->mad_ms, err, errlen) ||
                   cmj_int(x, at, "workspace_bytes", 0, INT64_MAX, 0, &e->workspace_bytes, err, errlen) ||
                   cmj_i32(x, at, "samples", 0, 1 << 30, 0, &e->samples, err, errlen)
               ? -1
               : 0;
}

static int parse_prefill(json_t *arr, const char *ptr, cm_tables *t, char *err, size_t errlen)
{
    static const char *const keys[] = {"part", "hidden_size", "n_heads", "n_kv_heads", "ffn_dim", "moe", "mamba",
                                       "ms", "mad_ms", "workspace_bytes", "samples", NULL};
    return parse_entries(arr, ptr, "prefill", keys, prefill_fields, t, &t->prefill, &t->n_prefill, err, errlen);
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

/* A decode entry: times per context, a linear fit (given or computed), and a prefill
 * entry of the same key (prefill is read first). */
static int decode_fields(json_t *x, const char *at, cm_entry *e, const cm_tables *t, char *err, size_t errlen)
{
    if (parse_ctx_array(x, at, "contexts", -1, 1, e, NULL, err, errlen) ||
        parse_ctx_array(x, at, "ms", e->n_ctx, 0, e, e->ctx_ms, err, errlen) < 0 ||
        parse_ctx_array(x, at, "mad_ms", e->n_ctx, 0, e, e->ctx_mad_ms, err, errlen) < 0 ||
        cmj_i32(x, at, "samples", 0, 1 << 30, 0, &e->samples, err, errlen))
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
        if (cmj_num(x, at, "ms_at_context_0", -1e12, 1, &e->ms0, err, errlen) ||
            cmj_num(x, at, "ms_per_context", -1e12, 1, &e->ms_per_ctx, err, errlen))
            return -1;
        for (int k = 0; k < e->n_ctx; k++)
            if (e->ms0 + e->ms_per_ctx * e->ctx[k] < -1e-9)
                FAIL("%s/ms_per_context: the fit is negative at context %d", at, e->ctx[k]);
    } else {
        cm_entry_fit_decode(e);
    }
    int found = 0;
    for (int k = 0; k < t->n_prefill; k++)
        found |= cm_same_key(&t->prefill[k], e);
    if (!found)
        FAIL("%s: no prefill entry has the same part and size", at);
    return 0;
}

static int parse_decode(json_t *arr, const char *ptr, cm_tables *t, char *err, size_t errlen)
{
    static const char *const keys[] = {"part", "hidden_size", "n_heads", "n_kv_heads", "ffn_dim", "moe", "mamba",
                                       "contexts", "ms", "mad_ms", "ms_at_context_0", "ms_per_context", "samples",
                                       NULL};
    if (parse_entries(arr, ptr, "decode", keys, decode_fields, t, &t->decode, &t->n_decode, err, errlen))
        return -1;
    for (int k = 0; k < t->n_prefill; k++) {
        int found = 0;
        for (int i = 0; i < t->n_decode; i++)
            found |= cm_same_key(&t->prefill[k], &t->decode[i]);
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
    if (cmj_check_keys(fx, at, keys, err, errlen))
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
        if (cmj_check_keys(x, at, hkeys, err, errlen) ||
            cmj_i32(x, at, "hidden_size", 1, 1 << 20, 1, &f->hidden_size, err, errlen) ||
            cmj_num(x, at, "prefill_embedding_ms", 0, 1, &f->prefill_embed_ms, err, errlen) ||
            cmj_num(x, at, "prefill_head_ms", 0, 1, &f->prefill_head_ms, err, errlen) ||
            cmj_num(x, at, "prefill_other_ms", -1e12, 1, &f->prefill_other_ms, err, errlen) ||
            cmj_num(x, at, "decode_embedding_ms", 0, 1, &f->decode_embed_ms, err, errlen) ||
            cmj_num(x, at, "decode_head_ms", 0, 1, &f->decode_head_ms, err, errlen) ||
            cmj_num(x, at, "decode_other_ms", -1e12, 1, &f->decode_other_ms, err, errlen) ||
            cmj_int(x, at, "workspace_bytes", 0, INT64_MAX, 1, &f->workspace_bytes, err, errlen))
            return -1;
        f->prefill_scale = f->decode_scale = 1;
        if (cmj_num(x, at, "prefill_scale", 0, 0, &f->prefill_scale, err, errlen) ||
            cmj_num(x, at, "decode_scale", 0, 0, &f->decode_scale, err, errlen))
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
                                       "kv_bytes_per_element", "kv_overhead_bytes", "runtime_bytes",
                                       "embed_bytes_per_param", "state_bytes_per_element", NULL};
    char at[128];
    snprintf(at, sizeof at, "%s/memory", ptr);
    if (!json_is_object(m))
        FAIL("%s: must be an object", at);
    if (cmj_check_keys(m, at, keys, err, errlen) ||
        cmj_num(m, at, "weight_bytes_per_param", 0, 1, &t->mem.weight_bytes_per_param, err, errlen) ||
        cmj_int(m, at, "weight_overhead_bytes", -(INT64_C(1) << 40), INT64_C(1) << 50, 1,
                &t->mem.weight_overhead_bytes, err, errlen) ||
        cmj_num(m, at, "kv_bytes_per_element", 0, 1, &t->mem.kv_bytes_per_elem, err, errlen) ||
        cmj_int(m, at, "kv_overhead_bytes", -(INT64_C(1) << 40), INT64_C(1) << 50, 1, &t->mem.kv_overhead_bytes,
                err, errlen) ||
        cmj_int(m, at, "runtime_bytes", 0, INT64_C(1) << 50, 1, &t->mem.runtime_bytes, err, errlen) ||
        (json_object_get(m, "embed_bytes_per_param") &&
         cmj_num(m, at, "embed_bytes_per_param", 0, 1, &t->mem.embed_bytes_per_param, err, errlen)) ||
        (json_object_get(m, "state_bytes_per_element") &&
         cmj_num(m, at, "state_bytes_per_element", 0, 1, &t->mem.state_bytes_per_elem, err, errlen)))
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
    if (cmj_check_keys(s, at, keys, err, errlen) ||
        cmj_str(s, at, "family", 1, t->family, sizeof t->family, err, errlen) ||
        cmj_i32(s, at, "vocab_size", 1, 1 << 24, 1, &t->vocab_size, err, errlen) ||
        cmj_i32(s, at, "head_dim", 1, 1 << 14, 1, &t->head_dim, err, errlen))
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

/* The optional parent_bias {prefill, decode}: both within CM_PARENT_BIAS_MAX of 1. */
static int parse_parent_bias(json_t *b, const char *ptr, cm_tables *t, char *err, size_t errlen)
{
    static const char *const keys[] = {"prefill", "decode", NULL};
    char at[128];
    snprintf(at, sizeof at, "%s/parent_bias", ptr);
    if (!b)
        return 0;
    if (!json_is_object(b))
        FAIL("%s: must be an object", at);
    if (cmj_check_keys(b, at, keys, err, errlen) || cmj_num(b, at, "prefill", 0, 1, &t->parent_bias_prefill, err, errlen) ||
        cmj_num(b, at, "decode", 0, 1, &t->parent_bias_decode, err, errlen))
        return -1;
    double lo = 1 / CM_PARENT_BIAS_MAX, hi = CM_PARENT_BIAS_MAX;
    if (t->parent_bias_prefill < lo || t->parent_bias_prefill > hi || t->parent_bias_decode < lo ||
        t->parent_bias_decode > hi)
        FAIL("%s: both phases must lie in [%g, %g]", at, lo, hi);
    return 0;
}

int cm_tables_from_json(json_t *j, const char *ptr, cm_tables *t, char *err, size_t errlen)
{
    static const char *const keys[] = {"shape", "prefill", "decode", "fixed", "memory", "width_multiple",
                                       "parent_bias", NULL};
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
    if (!cmj_check_keys(j, ptr, keys, err, errlen) && !parse_shape(json_object_get(j, "shape"), ptr, t, err, errlen) &&
        !parse_prefill(json_object_get(j, "prefill"), ptr, t, err, errlen) &&
        !parse_decode(json_object_get(j, "decode"), ptr, t, err, errlen) &&
        !parse_fixed(json_object_get(j, "fixed"), ptr, t, err, errlen) &&
        !parse_memory(json_object_get(j, "memory"), ptr, t, err, errlen) &&
        !(json_object_get(j, "width_multiple") &&
          cmj_i32(j, ptr, "width_multiple", 1, 4096, 1, &t->width_multiple, err, errlen)) &&
        !parse_parent_bias(json_object_get(j, "parent_bias"), ptr, t, err, errlen))
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
    if (cmj_check_keys(doc, "", keys, err, errlen))
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
    if (cmj_str(doc, "", "source", 0, src, sizeof src, err, errlen)) {
        cm_tables_free(t);
        return -1;
    }
    return 0;
}

