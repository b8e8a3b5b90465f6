/* storage/archjson.c — arch descriptor <-> JSON (DESIGN.md §10).
 * Strict reader: each object's keys are checked against the known set, every value's
 * type and range is checked, and errors carry the JSON pointer of the fault.
 */
#include "storage/archjson.h"
#include "storage/strbuf.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const rope_type_names[] = {"none", "linear", "llama3", "dynamic"};

/* ---------- writer ---------- */

static int obj_set(json_t *o, const char *k, json_t *v)
{
    return v ? json_object_set_new(o, k, v) : -1;
}

json_t *arch_to_json(const arch *a)
{
    json_t *o = json_object(), *layers = json_array();
    int rc = 0;
    if (!o || !layers)
        goto fail;
    rc |= obj_set(o, "family", json_string(a->family));
    rc |= obj_set(o, "vocab_size", json_integer(a->vocab_size));
    rc |= obj_set(o, "hidden_size", json_integer(a->hidden_size));
    rc |= obj_set(o, "head_dim", json_integer(a->head_dim));
    rc |= obj_set(o, "max_position_embeddings", json_integer(a->max_position_embeddings));
    rc |= obj_set(o, "rope_theta", json_real(a->rope_theta));
    if (a->rope_scaling.type == ROPE_SCALING_NONE) {
        rc |= obj_set(o, "rope_scaling", json_null());
    } else {
        const arch_rope_scaling *s = &a->rope_scaling;
        json_t *r = json_object();
        rc |= obj_set(o, "rope_scaling", r);
        if (!r)
            goto fail;
        rc |= obj_set(r, "type", json_string(rope_type_names[s->type]));
        rc |= obj_set(r, "factor", json_real(s->factor));
        if (s->type == ROPE_SCALING_LLAMA3) {
            rc |= obj_set(r, "low_freq_factor", json_real(s->low_freq_factor));
            rc |= obj_set(r, "high_freq_factor", json_real(s->high_freq_factor));
            rc |= obj_set(r, "original_max_position_embeddings",
                          json_integer(s->original_max_position_embeddings));
        }
    }
    rc |= obj_set(o, "norm_eps", json_real(a->norm_eps));
    rc |= obj_set(o, "tie_word_embeddings", json_boolean(a->tie_word_embeddings));
    if (a->attention_bias)
        rc |= obj_set(o, "attention_bias", json_true());
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        json_t *lo = json_object();
        if (!lo || json_array_append_new(layers, lo))
            goto fail;
        rc |= obj_set(lo, "source_layer", json_integer(l->source_layer));
        if (l->n_heads > 0)
            rc |= obj_set(lo, "attention", json_pack("{s:i,s:i}", "n_heads", l->n_heads,
                                                     "n_kv_heads", l->n_kv_heads));
        else
            rc |= obj_set(lo, "attention", json_null());
        if (l->ffn_dim > 0)
            rc |= obj_set(lo, "mlp", json_pack("{s:i}", "ffn_dim", l->ffn_dim));
        else
            rc |= obj_set(lo, "mlp", json_null());
        if (l->moe.n_experts > 0) {
            json_t *mo = json_pack("{s:i,s:i,s:i,s:i,s:b}", "n_experts", l->moe.n_experts, "top_k", l->moe.top_k,
                                   "expert_ffn_dim", l->moe.expert_ffn_dim, "shared_ffn_dim", l->moe.shared_ffn_dim,
                                   "norm_topk_prob", l->moe.norm_topk);
            if (mo && l->moe.sigmoid)   /* Nemotron-H's router */
                rc |= obj_set(mo, "router", json_pack("{s:s,s:i,s:i,s:f}", "scores", "sigmoid", "n_group",
                                                      l->moe.n_group, "topk_group", l->moe.topk_group,
                                                      "routed_scaling_factor", l->moe.routed_scale));
            if (mo && l->moe.latent_dim)   /* LatentMoE: the experts' width */
                rc |= obj_set(mo, "latent_dim", json_integer(l->moe.latent_dim));
            rc |= obj_set(lo, "moe", mo);
        }
        if (l->mamba.n_heads > 0)
            rc |= obj_set(lo, "mamba", json_pack("{s:i,s:i,s:i,s:i,s:i}", "n_heads", l->mamba.n_heads,
                                                 "head_dim", l->mamba.head_dim, "d_state",
                                                 l->mamba.d_state, "n_groups", l->mamba.n_groups,
                                                 "conv_kernel", l->mamba.conv_kernel));
    }
    rc |= json_object_set(o, "layers", layers);
    json_decref(layers);
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return o;
fail:
    json_decref(layers);
    json_decref(o);
    return NULL;
}

/* ---------- reader ---------- */

typedef struct {
    char *err;
    size_t errlen;
} perr;

#define FAIL(pe, ...) do { snprintf((pe)->err, (pe)->errlen, __VA_ARGS__); return -1; } while (0)

/* Reject keys of object `o` (at pointer `at`) that are not in the NULL-terminated list. */
static int check_keys(perr *pe, json_t *o, const char *at, const char *const *known)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; known[i]; i++)
            if (!strcmp(k, known[i]))
                ok = 1;
        if (!ok) {
            char p[300];
            json_ptr_join(p, sizeof p, at, k);   /* a key with '/' or '~' is one token of it */
            FAIL(pe, "%s: unknown key", p);
        }
    }
    return 0;
}

/* Read an integer member; `required`: absent is an error, else *out keeps its value. */
static int get_int(perr *pe, json_t *o, const char *at, const char *k, int lo, int hi, int required, int *out)
{
    json_t *v = json_object_get(o, k);
    if (!v) {
        if (required)
            FAIL(pe, "%s/%s: required", at, k);
        return 0;
    }
    if (!json_is_integer(v))
        FAIL(pe, "%s/%s: must be an integer", at, k);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        FAIL(pe, "%s/%s: %lld is out of range [%d, %d]", at, k, (long long)x, lo, hi);
    *out = (int)x;
    return 0;
}

static int get_num(perr *pe, json_t *o, const char *at, const char *k, int required, double *out)
{
    json_t *v = json_object_get(o, k);
    if (!v) {
        if (required)
            FAIL(pe, "%s/%s: required", at, k);
        return 0;
    }
    if (!json_is_number(v))
        FAIL(pe, "%s/%s: must be a number", at, k);
    double x = json_number_value(v);
    if (!isfinite(x))
        FAIL(pe, "%s/%s: must be finite", at, k);
    *out = x;
    return 0;
}

static int get_bool(perr *pe, json_t *o, const char *at, const char *k, int required, int *out)
{
    json_t *v = json_object_get(o, k);
    if (!v) {
        if (required)
            FAIL(pe, "%s/%s: required", at, k);
        return 0;
    }
    if (!json_is_boolean(v))
        FAIL(pe, "%s/%s: must be true or false", at, k);
    *out = json_is_true(v);
    return 0;
}

static int parse_rope_scaling(perr *pe, json_t *r, arch_rope_scaling *s)
{
    static const char *const keys[] = {"type", "rope_type", "factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings", NULL};
    memset(s, 0, sizeof *s);
    if (!r || json_is_null(r))
        return 0;
    if (!json_is_object(r))
        FAIL(pe, "/rope_scaling: must be an object or null");
    if (check_keys(pe, r, "/rope_scaling", keys))
        return -1;
    json_t *t = json_object_get(r, "type");
    const char *tk = "type";
    if (!t) {
        t = json_object_get(r, "rope_type");
        tk = "rope_type";
    }
    if (!t || !json_is_string(t))
        FAIL(pe, "/rope_scaling/type: required string (linear, llama3, dynamic)");
    const char *tn = json_string_value(t);
    int found = -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(tn, rope_type_names[i]))
            found = i;
    if (found < 0)
        FAIL(pe, "/rope_scaling/%s: unknown rope scaling \"%s\" (linear, llama3, dynamic, none)", tk, tn);
    s->type = (arch_rope_scaling_type)found;
    if (s->type == ROPE_SCALING_NONE)
        return 0;
    if (get_num(pe, r, "/rope_scaling", "factor", 1, &s->factor))
        return -1;
    if (!(s->factor > 0))
        FAIL(pe, "/rope_scaling/factor: must be positive");
    int req = s->type == ROPE_SCALING_LLAMA3;
    if (get_num(pe, r, "/rope_scaling", "low_freq_factor", req, &s->low_freq_factor) ||
        get_num(pe, r, "/rope_scaling", "high_freq_factor", req, &s->high_freq_factor) ||
        get_int(pe, r, "/rope_scaling", "original_max_position_embeddings", 1, 1 << 30, req,
                &s->original_max_position_embeddings))
        return -1;
    if (req && !(s->high_freq_factor > s->low_freq_factor))
        FAIL(pe, "/rope_scaling/high_freq_factor: must exceed low_freq_factor");
    return 0;
}

static int parse_layer(perr *pe, json_t *lo, int i, arch_layer *l)
{
    static const char *const keys[] = {"source_layer", "attention", "mlp", "moe", "mamba", NULL};
    static const char *const akeys[] = {"n_heads", "n_kv_heads", NULL};
    static const char *const mkeys[] = {"ffn_dim", NULL};
    static const char *const ekeys[] = {"n_experts", "top_k", "expert_ffn_dim", "shared_ffn_dim", "norm_topk_prob",
                                        "router", "latent_dim", NULL};
    static const char *const rkeys[] = {"scores", "n_group", "topk_group", "routed_scaling_factor", NULL};
    static const char *const bkeys[] = {"n_heads", "head_dim", "d_state", "n_groups", "conv_kernel", NULL};
    char at[64], sub[80];
    snprintf(at, sizeof at, "/layers/%d", i);
    if (!json_is_object(lo))
        FAIL(pe, "%s: must be an object", at);
    if (check_keys(pe, lo, at, keys))
        return -1;
    l->source_layer = i;
    if (get_int(pe, lo, at, "source_layer", 0, 1 << 20, 0, &l->source_layer))
        return -1;
    json_t *att = json_object_get(lo, "attention");
    snprintf(sub, sizeof sub, "%s/attention", at);
    if (!att)
        FAIL(pe, "%s: required (an object, or null when removed)", sub);
    if (!json_is_null(att)) {
        if (!json_is_object(att))
            FAIL(pe, "%s: must be an object or null", sub);
        if (check_keys(pe, att, sub, akeys) ||
            get_int(pe, att, sub, "n_heads", 1, 1024, 1, &l->n_heads) ||
            get_int(pe, att, sub, "n_kv_heads", 1, 1024, 1, &l->n_kv_heads))
            return -1;
        if (l->n_kv_heads > l->n_heads || l->n_heads % l->n_kv_heads)
            FAIL(pe, "%s/n_kv_heads: %d must divide n_heads=%d", sub, l->n_kv_heads, l->n_heads);
    }
    json_t *mlp = json_object_get(lo, "mlp");
    snprintf(sub, sizeof sub, "%s/mlp", at);
    if (!mlp)
        FAIL(pe, "%s: required (an object, or null when removed)", sub);
    if (!json_is_null(mlp)) {
        if (!json_is_object(mlp))
            FAIL(pe, "%s: must be an object or null", sub);
        if (check_keys(pe, mlp, sub, mkeys) || get_int(pe, mlp, sub, "ffn_dim", 1, 1 << 20, 1, &l->ffn_dim))
            return -1;
    }
    json_t *moe = json_object_get(lo, "moe");
    snprintf(sub, sizeof sub, "%s/moe", at);
    if (moe && !json_is_null(moe)) {
        if (!json_is_object(moe))
            FAIL(pe, "%s: must be an object or null", sub);
        if (check_keys(pe, moe, sub, ekeys) ||
            get_int(pe, moe, sub, "n_experts", 1, 4096, 1, &l->moe.n_experts) ||
            get_int(pe, moe, sub, "top_k", 1, 4096, 1, &l->moe.top_k) ||
            get_int(pe, moe, sub, "expert_ffn_dim", 1, 1 << 20, 1, &l->moe.expert_ffn_dim) ||
            get_int(pe, moe, sub, "shared_ffn_dim", 0, 1 << 20, 0, &l->moe.shared_ffn_dim) ||
            get_bool(pe, moe, sub, "norm_topk_prob", 0, &l->moe.norm_topk) ||
            get_int(pe, moe, sub, "latent_dim", 1, 65536, 0, &l->moe.latent_dim))
            return -1;
        json_t *ro = json_object_get(moe, "router");
        char rsub[96];
        snprintf(rsub, sizeof rsub, "%s/router", sub);
        if (ro && !json_is_null(ro)) {
            const char *sc = json_string_value(json_object_get(ro, "scores"));
            if (!json_is_object(ro))
                FAIL(pe, "%s: must be an object or null", rsub);
            if (check_keys(pe, ro, rsub, rkeys))
                return -1;
            if (!sc || strcmp(sc, "sigmoid"))
                FAIL(pe, "%s/scores: must be \"sigmoid\" (softmax routing has no router object)", rsub);
            l->moe.sigmoid = 1;
            if (get_int(pe, ro, rsub, "n_group", 1, 4096, 1, &l->moe.n_group) ||
                get_int(pe, ro, rsub, "topk_group", 1, 4096, 1, &l->moe.topk_group) ||
                get_num(pe, ro, rsub, "routed_scaling_factor", 1, &l->moe.routed_scale))
                return -1;
        }
    }
    json_t *mam = json_object_get(lo, "mamba");
    snprintf(sub, sizeof sub, "%s/mamba", at);
    if (mam && !json_is_null(mam)) {
        if (!json_is_object(mam))
            FAIL(pe, "%s: must be an object or null", sub);
        if (check_keys(pe, mam, sub, bkeys) ||
            get_int(pe, mam, sub, "n_heads", 1, 4096, 1, &l->mamba.n_heads) ||
            get_int(pe, mam, sub, "head_dim", 1, 4096, 1, &l->mamba.head_dim) ||
            get_int(pe, mam, sub, "d_state", 1, 4096, 1, &l->mamba.d_state) ||
            get_int(pe, mam, sub, "n_groups", 1, 4096, 1, &l->mamba.n_groups) ||
            get_int(pe, mam, sub, "conv_kernel", 1, 64, 1, &l->mamba.conv_kernel))
            return -1;
    }
    return 0;
}

/* Turn arch_validate's "layers[3].attention.n_kv_heads: msg" into "/layers/3/attention/n_kv_heads: msg". */
static void validate_to_pointer(const char *msg, char *err, size_t errlen)
{
    const char *colon = strstr(msg, ": ");
    size_t n = 0;
    if (!colon || errlen == 0) {
        snprintf(err, errlen, "/%s", msg);
        return;
    }
    err[n++] = '/';
    for (const char *p = msg; p < colon && n + 2 < errlen; p++) {
        if (*p == '[' || *p == '.')
            err[n++] = '/';
        else if (*p != ']')
            err[n++] = *p;
    }
    err[n] = '\0';
    size_t used = strlen(err);
    snprintf(err + used, errlen - used, "%s", colon);
}

int arch_from_json(json_t *j, arch *a, char *err, size_t errlen)
{
    static const char *const keys[] = {"family", "vocab_size", "hidden_size", "head_dim",
                                       "max_position_embeddings", "rope_theta", "rope_scaling",
                                       "norm_eps", "tie_word_embeddings", "attention_bias", "layers", NULL};
    perr pe = {err, errlen};
    memset(a, 0, sizeof *a);
    if (!json_is_object(j)) {
        snprintf(err, errlen, ": the arch must be a JSON object");
        return -1;
    }
    if (check_keys(&pe, j, "", keys))
        return -1;
    json_t *fam = json_object_get(j, "family");
    if (!fam || !json_is_string(fam)) {
        snprintf(err, errlen, "/family: required string");
        return -1;
    }
    if (json_string_length(fam) >= ARCH_FAMILY_MAX) {
        snprintf(err, errlen, "/family: longer than %d bytes", ARCH_FAMILY_MAX - 1);
        return -1;
    }
    json_t *layers = json_object_get(j, "layers");
    if (!layers || !json_is_array(layers)) {
        snprintf(err, errlen, "/layers: required array");
        return -1;
    }
    if (json_array_size(layers) > 1024) {
        snprintf(err, errlen, "/layers: %zu layers is more than 1024", json_array_size(layers));
        return -1;
    }
    if (arch_init(a, (int)json_array_size(layers))) {
        snprintf(err, errlen, ": out of memory");
        return -1;
    }
    snprintf(a->family, sizeof a->family, "%s", json_string_value(fam));
    a->max_position_embeddings = 0;
    if (get_int(&pe, j, "", "vocab_size", 1, 1 << 22, 1, &a->vocab_size) ||
        get_int(&pe, j, "", "hidden_size", 1, 1 << 16, 1, &a->hidden_size) ||
        get_int(&pe, j, "", "head_dim", 1, 1024, 1, &a->head_dim) ||
        get_int(&pe, j, "", "max_position_embeddings", 1, 1 << 30, 1, &a->max_position_embeddings) ||
        get_num(&pe, j, "", "rope_theta", 1, &a->rope_theta) ||
        parse_rope_scaling(&pe, json_object_get(j, "rope_scaling"), &a->rope_scaling) ||
        get_num(&pe, j, "", "norm_eps", 1, &a->norm_eps) ||
        get_bool(&pe, j, "", "tie_word_embeddings", 1, &a->tie_word_embeddings) ||
        get_bool(&pe, j, "", "attention_bias", 0, &a->attention_bias))
        goto fail;
    for (int i = 0; i < a->n_layers; i++)
        if (parse_layer(&pe, json_array_get(layers, (size_t)i), i, &a->layers[i]))
            goto fail;
    char msg[256];
    if (arch_validate(a, msg, sizeof msg)) {
        validate_to_pointer(msg, err, errlen);
        goto fail;
    }
    return 0;
fail:
    arch_free(a);
    memset(a, 0, sizeof *a);
    return -1;
}

int arch_from_json_text(const char *text, size_t len, arch *a, char *err, size_t errlen)
{
    json_error_t je;
    memset(a, 0, sizeof *a);
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        snprintf(err, errlen, ": invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
        return -1;
    }
    int rc = arch_from_json(j, a, err, errlen);
    json_decref(j);
    return rc;
}
