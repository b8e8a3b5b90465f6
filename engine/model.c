/* engine/model.c — the Llama-family model on a backend: parameters, forward (prefill and
 * decode with a KV cache), backward for weights and search masks, CE/KD losses, AdamW,
 * sampling. Heterogeneous layers (own heads, KV heads, FFN width, removed parts) are
 * first-class. Every buffer comes from the backend, so peak bytes are measurable.
 *
 * Memory (floats are 4 bytes; N = B*T; qd = max_l Hq*D, kvd = max_l Hkv*D, F = max_l F_l,
 * Hm = max_l Hq; R = rows of the LM head at once):
 *   weights      arch_params(a) floats, one allocation, + head_dim/2 floats of RoPE
 *                frequencies (eng_model_init);
 *   grads        the same again (eng_model_enable_grads); masks 2 x (C + sum Hq + sum F + 2L);
 *   KV cache     2 * B * max_T * sum_{attn layers} Hkv_l*D floats (eng_kv_new);
 *   eng_forward  one workspace for the call, freed before return:
 *                N*(3C + 2qd + 2kvd + 3F + 1) floats (x, xn, y, q, o, k, v, gate, up, h, rstd)
 *                + R*(2C + V) for the head (R = B for LOGITS_LAST, min(N, ENG_LOGIT_CHUNK_ROWS)
 *                for ALL, 0 for NONE) + max(C, Hm, F) when stats are collected (+ N*qd when
 *                masks are enabled: the masked head outputs),
 *                + ints 2N + 2B (tokens, positions, first positions, lengths),
 *                + inside attention: threads * ENG_CPU_ATTN_ROWS * S floats of tile scratch
 *                (S = T, or max_T with a cache; CPU backend). eng_forward_workspace_bytes
 *                computes exactly this sum; the tests check it against the measured peak.
 *   training     eng_forward_backward, one workspace freed before return
 *                (eng_train_workspace_bytes computes exactly this, R = min(N, ENG_LOGIT_CHUNK_ROWS)):
 *                residual chain (blocks+1) * N*C; per attention block N*(1 + 2 Hq*D + 2 Hkv*D + Hq + C)
 *                (rstd, q, o, k, v, lse, y) and per MLP block N*(1 + 2F_l + C) (rstd, gate, up, y),
 *                each + N*C (r) when masks are enabled; backward scratch N*(4C + max(3qd + 2kvd, 3F)) + 1;
 *                loss chunks R*(2C + 1 + 2V) (+ R*V teacher logits and N*C_teacher teacher stream
 *                with KD) + 2R; ints 3N + 2B; attention tile scratch threads * 2 * ENG_CPU_ATTN_ROWS * T
 *                (backward; the forward's is half).
 *                With KD the teacher's forward runs first while this workspace is held; the
 *                peak takes the larger of it and the backward's attention tiles.
 *   Accounting counts requested bytes; the CPU backend rounds blocks >= 2 MiB up to 2 MiB
 *   (huge pages), so resident memory may exceed it by < 2 MiB per large block.
 *   Statistics: hidden_abs sums both norm outputs of a layer (attention and MLP input).
 */
#include "engine/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/clock.h"
#include "engine/rng.h"

#define F4 sizeof(float)

/* ---- tensor table ------------------------------------------------------------------ */

enum { SL_EMB, SL_ANORM, SL_WQ, SL_WK, SL_WV, SL_BQ, SL_BK, SL_BV, SL_WO, SL_FNORM, SL_WG,
       SL_WU, SL_WD, SL_NORM, SL_LM };

typedef struct {
    char name[96];
    int64_t shape[2];
    int ndim, slot, layer;
    size_t off;                  /* float offset into params / grads */
} tensor_ent;

struct eng_kv_cache {
    eng_model *m;
    int B, max_T;
    int *len;                    /* host [B] */
    float **k, **v;              /* [n_layers] device [B, max_T, Hkv*D]; NULL where no attention */
    size_t bytes;
};

typedef struct {
    tensor_ent *tens;
    int n_tens;
    float *inv_freq;             /* device [D/2] */
    size_t inv_freq_bytes;
    size_t masks_bytes;
} model_impl;

static int imax(int a, int b) { return a > b ? a : b; }

typedef struct {
    int qd, kvd, f, hq;          /* maxima over layers */
} dims_max;

static dims_max max_dims(const arch *a)
{
    dims_max d = {0, 0, 0, 0};
    for (int l = 0; l < a->n_layers; l++) {
        d.qd = imax(d.qd, a->layers[l].n_heads * a->head_dim);
        d.kvd = imax(d.kvd, a->layers[l].n_kv_heads * a->head_dim);
        d.f = imax(d.f, a->layers[l].ffn_dim);
        d.hq = imax(d.hq, a->layers[l].n_heads);
    }
    return d;
}

static int add_tensor(model_impl *im, int cap, size_t *off, int slot, int layer, const char *name,
                      int64_t d0, int64_t d1)
{
    if (im->n_tens >= cap)
        return -1;
    tensor_ent *t = &im->tens[im->n_tens++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->ndim = d1 > 0 ? 2 : 1;
    t->slot = slot;
    t->layer = layer;
    t->off = *off;
    *off += (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    return 0;
}

/* Lay out every tensor in HF order; the tied lm_head gets no entry. Returns floats. */
static size_t build_table(model_impl *im, const arch *a, int cap)
{
    size_t off = 0;
    int64_t C = a->hidden_size, D = a->head_dim, V = a->vocab_size;
    char nm[96];
    add_tensor(im, cap, &off, SL_EMB, -1, "model.embed_tokens.weight", V, C);
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *ly = &a->layers[l];
        int64_t q = (int64_t)ly->n_heads * D, kv = (int64_t)ly->n_kv_heads * D, F = ly->ffn_dim;
#define T(slot, suffix, d0, d1) do { snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix); \
        add_tensor(im, cap, &off, slot, l, nm, d0, d1); } while (0)
        if (ly->n_heads > 0) {
            T(SL_ANORM, "input_layernorm.weight", C, 0);
            T(SL_WQ, "self_attn.q_proj.weight", q, C);
            T(SL_WK, "self_attn.k_proj.weight", kv, C);
            T(SL_WV, "self_attn.v_proj.weight", kv, C);
            if (a->attention_bias) {
                T(SL_BQ, "self_attn.q_proj.bias", q, 0);
                T(SL_BK, "self_attn.k_proj.bias", kv, 0);
                T(SL_BV, "self_attn.v_proj.bias", kv, 0);
            }
            T(SL_WO, "self_attn.o_proj.weight", C, q);
        }
        if (F > 0) {
            T(SL_FNORM, "post_attention_layernorm.weight", C, 0);
            T(SL_WG, "mlp.gate_proj.weight", F, C);
            T(SL_WU, "mlp.up_proj.weight", F, C);
            T(SL_WD, "mlp.down_proj.weight", C, F);
        }
#undef T
    }
    add_tensor(im, cap, &off, SL_NORM, -1, "model.norm.weight", C, 0);
    if (!a->tie_word_embeddings)
        add_tensor(im, cap, &off, SL_LM, -1, "lm_head.weight", V, C);
    return off;
}

/* Point layer views, embedding, norm and head into `base` (params or grads). */
static void carve(const model_impl *im, const arch *a, float *base, eng_layer *ls,
                  float **emb, float **norm, float **lm)
{
    memset(ls, 0, sizeof *ls * (size_t)(a->n_layers ? a->n_layers : 1));
    *lm = NULL;
    for (int i = 0; i < im->n_tens; i++) {
        const tensor_ent *t = &im->tens[i];
        float *p = base + t->off;
        eng_layer *L = t->layer >= 0 ? &ls[t->layer] : NULL;
        switch (t->slot) {
        case SL_EMB: *emb = p; break;
        case SL_NORM: *norm = p; break;
        case SL_LM: *lm = p; break;
        case SL_ANORM: L->attn_norm = p; break;
        case SL_WQ: L->wq = p; break;
        case SL_WK: L->wk = p; break;
        case SL_WV: L->wv = p; break;
        case SL_BQ: L->bq = p; break;
        case SL_BK: L->bk = p; break;
        case SL_BV: L->bv = p; break;
        case SL_WO: L->wo = p; break;
        case SL_FNORM: L->ffn_norm = p; break;
        case SL_WG: L->w_gate = p; break;
        case SL_WU: L->w_up = p; break;
        case SL_WD: L->w_down = p; break;
        }
    }
    if (!*lm)
        *lm = *emb;
}

int eng_rope_inv_freq(const arch *a, float *out)
{
    int D = a->head_dim, half = D / 2;
    const arch_rope_scaling *rs = &a->rope_scaling;
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow(a->rope_theta, (2.0 * i) / D);
        if (rs->type == ROPE_SCALING_LINEAR && rs->factor > 0) {
            f /= rs->factor;
        } else if (rs->type == ROPE_SCALING_LLAMA3 && rs->factor > 0) {
            double old = rs->original_max_position_embeddings;
            double lo_wl = old / rs->low_freq_factor, hi_wl = old / rs->high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > lo_wl) {
                f /= rs->factor;
            } else if (wl >= hi_wl) {
                double s = (old / wl - rs->low_freq_factor) / (rs->high_freq_factor - rs->low_freq_factor);
                f = (1 - s) * f / rs->factor + s * f;
            }
        }
        out[i] = (float)f;
    }
    return 0;
}

static void set_const(eng_model *m, float *dst, float v, size_t n)
{
    m->be->fill(m->be, dst, v, n);
}

static void set_norms_to_one(eng_model *m)
{
    model_impl *im = m->impl;
    for (int i = 0; i < im->n_tens; i++) {
        tensor_ent *t = &im->tens[i];
        if (t->slot == SL_ANORM || t->slot == SL_FNORM || t->slot == SL_NORM)
            set_const(m, m->params + t->off, 1.0f, (size_t)t->shape[0]);
    }
}

int eng_model_init(eng_model *m, const arch *a, eng_backend *be, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (arch_validate(a, err, errlen) != 0)
        return -1;
    if (arch_copy(&m->a, a) != 0)
        goto oom;
    m->be = be;
    model_impl *im = calloc(1, sizeof *im);
    if (!im)
        goto oom;
    m->impl = im;
    int cap = 3 + 12 * a->n_layers;
    im->tens = calloc((size_t)cap, sizeof *im->tens);
    m->layers = calloc((size_t)(a->n_layers ? a->n_layers : 1), sizeof *m->layers);
    m->glayers = calloc((size_t)(a->n_layers ? a->n_layers : 1), sizeof *m->glayers);
    if (!im->tens || !m->layers || !m->glayers)
        goto oom;
    m->n_params = build_table(im, a, cap);
    if ((int64_t)m->n_params != arch_params(a)) {
        snprintf(err, errlen, "internal: parameter layout %zu != arch_params %lld", m->n_params,
                 (long long)arch_params(a));
        eng_model_free(m);
        return -1;
    }
    m->params = be->alloc(be, m->n_params * F4);
    if (!m->params)
        goto oom;
    be->zero(be, m->params, m->n_params * F4);
    carve(im, a, m->params, m->layers, &m->tok_emb, &m->final_norm, &m->lm_head);
    set_norms_to_one(m);
    int half = a->head_dim / 2;
    float *host = malloc(F4 * (size_t)half);
    im->inv_freq_bytes = F4 * (size_t)half;
    im->inv_freq = be->alloc(be, im->inv_freq_bytes);
    if (!host || !im->inv_freq) {
        free(host);
        goto oom;
    }
    eng_rope_inv_freq(a, host);
    be->to_device(be, im->inv_freq, host, im->inv_freq_bytes);
    free(host);
    return 0;
oom:
    snprintf(err, errlen, "out of memory allocating the model (%lld parameters)", (long long)arch_params(a));
    eng_model_free(m);
    return -1;
}

static void masks_free(eng_model *m)
{
    eng_masks *k = m->masks;
    if (!k)
        return;
    model_impl *im = m->impl;
    m->be->free(m->be, k->block, im->masks_bytes);
    m->be->free(m->be, k->grad_block, im->masks_bytes);
    free(k->head);
    free(k->g_head);
    free(k->ffn);
    free(k->g_ffn);
    free(k);
    m->masks = NULL;
}

void eng_model_free(eng_model *m)
{
    if (!m)
        return;
    model_impl *im = m->impl;
    masks_free(m);
    if (m->be) {
        m->be->free(m->be, m->params, m->n_params * F4);
        m->be->free(m->be, m->grads, m->n_params * F4);
        if (im)
            m->be->free(m->be, im->inv_freq, im->inv_freq_bytes);
    }
    if (im)
        free(im->tens);
    free(im);
    free(m->layers);
    free(m->glayers);
    arch_free(&m->a);
    memset(m, 0, sizeof *m);
}

void eng_model_randomize(eng_model *m, uint64_t seed, float std)
{
    /* Matrices and biases ~ N(0, std); norm weights ~ 1 + N(0, std) so that their
     * gradients are exercised by tests. Deterministic in seed. */
    model_impl *im = m->impl;
    uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
    size_t chunk = 1 << 16;
    float *buf = malloc(F4 * chunk);
    if (!buf)
        return;
    for (int i = 0; i < im->n_tens; i++) {
        const tensor_ent *t = &im->tens[i];
        size_t n = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        float base = (t->slot == SL_ANORM || t->slot == SL_FNORM || t->slot == SL_NORM) ? 1.0f : 0.0f;
        for (size_t o = 0; o < n; o += chunk) {
            size_t c = n - o < chunk ? n - o : chunk;
            for (size_t j = 0; j < c; j++)
                buf[j] = base + std * (float)eng_rng_normal(&s);
            m->be->to_device(m->be, m->params + t->off + o, buf, c * F4);
        }
    }
    free(buf);
}

static const tensor_ent *find_tensor(const eng_model *m, const char *name)
{
    const model_impl *im = m->impl;
    for (int i = 0; i < im->n_tens; i++)
        if (strcmp(im->tens[i].name, name) == 0)
            return &im->tens[i];
    if (m->a.tie_word_embeddings && strcmp(name, "lm_head.weight") == 0)
        return &im->tens[0];   /* tied: the embedding */
    return NULL;
}

int eng_model_set_tensor(eng_model *m, const char *hf_name, const float *data,
                         const int64_t *shape, int ndim, char *err, size_t errlen)
{
    const tensor_ent *t = find_tensor(m, hf_name);
    if (!t) {
        snprintf(err, errlen, "%s: no such tensor in this architecture", hf_name);
        return -1;
    }
    int ok = ndim == t->ndim && shape[0] == t->shape[0] && (ndim == 1 || shape[1] == t->shape[1]);
    if (!ok) {
        if (t->ndim == 2)
            snprintf(err, errlen, "%s: shape mismatch (expected [%lld, %lld], got ndim %d [%lld%s%lld])", hf_name,
                     (long long)t->shape[0], (long long)t->shape[1], ndim, (long long)(ndim > 0 ? shape[0] : -1),
                     ndim > 1 ? ", " : "", (long long)(ndim > 1 ? shape[1] : 0));
        else
            snprintf(err, errlen, "%s: shape mismatch (expected [%lld], got ndim %d [%lld])", hf_name,
                     (long long)t->shape[0], ndim, (long long)(ndim > 0 ? shape[0] : -1));
        return -1;
    }
    size_t n = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
    m->be->to_device(m->be, m->params + t->off, data, n * F4);
    return 0;
}

int eng_arch_tensors(const arch *a, eng_tensor_desc **out, char *err, size_t errlen)
{
    *out = NULL;
    if (arch_validate(a, err, errlen) != 0)
        return -1;
    int cap = 3 + 12 * a->n_layers;
    model_impl im = {0};
    im.tens = calloc((size_t)cap, sizeof *im.tens);
    eng_tensor_desc *d = calloc((size_t)cap, sizeof *d);
    if (!im.tens || !d) {
        free(im.tens);
        free(d);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    (void)build_table(&im, a, cap);
    for (int i = 0; i < im.n_tens; i++) {
        snprintf(d[i].name, sizeof d[i].name, "%s", im.tens[i].name);
        d[i].shape[0] = im.tens[i].shape[0];
        d[i].shape[1] = im.tens[i].ndim == 2 ? im.tens[i].shape[1] : 0;
        d[i].ndim = im.tens[i].ndim;
    }
    free(im.tens);
    *out = d;
    return im.n_tens;
}

int eng_model_tensor_count(const eng_model *m)
{
    return ((const model_impl *)m->impl)->n_tens;
}

int eng_model_tensor(const eng_model *m, int i, const char **name, int64_t shape[2], int *ndim, float **data)
{
    const model_impl *im = m->impl;
    if (i < 0 || i >= im->n_tens)
        return -1;
    const tensor_ent *t = &im->tens[i];
    if (name)
        *name = t->name;
    if (shape) {
        shape[0] = t->shape[0];
        shape[1] = t->ndim == 2 ? t->shape[1] : 0;
    }
    if (ndim)
        *ndim = t->ndim;
    if (data)
        *data = m->params + t->off;
    return 0;
}

int64_t eng_model_get_tensor(const eng_model *m, const char *hf_name, float *out, int64_t n)
{
    const tensor_ent *t = find_tensor(m, hf_name);
    if (!t)
        return -1;
    int64_t cnt = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
    if (cnt > n)
        return -1;
    m->be->to_host(m->be, out, m->params + t->off, (size_t)cnt * F4);
    return cnt;
}

int eng_model_enable_grads(eng_model *m)
{
    if (m->grads)
        return 0;
    m->grads = m->be->alloc(m->be, m->n_params * F4);
    if (!m->grads)
        return -1;
    m->be->zero(m->be, m->grads, m->n_params * F4);
    carve(m->impl, &m->a, m->grads, m->glayers, &m->g_tok_emb, &m->g_final_norm, &m->g_lm_head);
    return 0;
}

int eng_model_enable_masks(eng_model *m)
{
    if (m->masks)
        return 0;
    const arch *a = &m->a;
    int L = a->n_layers;
    size_t count = (size_t)a->hidden_size + 2 * (size_t)L;
    for (int l = 0; l < L; l++)
        count += (size_t)a->layers[l].n_heads + (size_t)a->layers[l].ffn_dim;
    eng_masks *k = calloc(1, sizeof *k);
    if (!k)
        return -1;
    m->masks = k;
    model_impl *im = m->impl;
    im->masks_bytes = count * F4;
    size_t nl = (size_t)(L ? L : 1);
    k->head = calloc(nl, sizeof *k->head);
    k->g_head = calloc(nl, sizeof *k->g_head);
    k->ffn = calloc(nl, sizeof *k->ffn);
    k->g_ffn = calloc(nl, sizeof *k->g_ffn);
    k->block = m->be->alloc(m->be, im->masks_bytes);
    k->grad_block = m->be->alloc(m->be, im->masks_bytes);
    if (!k->head || !k->g_head || !k->ffn || !k->g_ffn || !k->block || !k->grad_block) {
        masks_free(m);
        return -1;
    }
    k->count = count;
    m->be->fill(m->be, k->block, 1.0f, count);
    m->be->zero(m->be, k->grad_block, count * F4);
    size_t o = 0;
    k->hidden = k->block + o;
    k->g_hidden = k->grad_block + o;
    o += (size_t)a->hidden_size;
    for (int l = 0; l < L; l++) {
        int h = a->layers[l].n_heads, f = a->layers[l].ffn_dim;
        k->head[l] = h ? k->block + o : NULL;
        k->g_head[l] = h ? k->grad_block + o : NULL;
        o += (size_t)h;
        k->ffn[l] = f ? k->block + o : NULL;
        k->g_ffn[l] = f ? k->grad_block + o : NULL;
        o += (size_t)f;
    }
    k->attn_gate = k->block + o;
    k->g_attn_gate = k->grad_block + o;
    o += (size_t)L;
    k->mlp_gate = k->block + o;
    k->g_mlp_gate = k->grad_block + o;
    k->hidden_count = (float)a->hidden_size;
    k->g_hidden_count = 0;
    return 0;
}

void eng_model_zero_grads(eng_model *m)
{
    if (m->grads)
        m->be->zero(m->be, m->grads, m->n_params * F4);
    if (m->masks) {
        m->be->zero(m->be, m->masks->grad_block, m->masks->count * F4);
        m->masks->g_hidden_count = 0;
    }
}

/* ---- KV cache ------------------------------------------------------------------------ */

size_t eng_kv_bytes_for(const arch *a, int B, int max_T)
{
    size_t n = 0;
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].n_heads)
            n += 2 * (size_t)B * (size_t)max_T * (size_t)a->layers[l].n_kv_heads * (size_t)a->head_dim;
    return n * F4;
}

eng_kv_cache *eng_kv_new(eng_model *m, int B, int max_T)
{
    if (B <= 0 || max_T <= 0)
        return NULL;
    eng_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv)
        return NULL;
    int L = m->a.n_layers;
    kv->m = m;
    kv->B = B;
    kv->max_T = max_T;
    kv->len = calloc((size_t)B, sizeof *kv->len);
    kv->k = calloc((size_t)(L ? L : 1), sizeof *kv->k);
    kv->v = calloc((size_t)(L ? L : 1), sizeof *kv->v);
    if (!kv->len || !kv->k || !kv->v) {
        eng_kv_free(kv);
        return NULL;
    }
    for (int l = 0; l < L; l++) {
        if (!m->a.layers[l].n_heads)
            continue;
        size_t b = F4 * (size_t)B * (size_t)max_T * (size_t)m->a.layers[l].n_kv_heads * (size_t)m->a.head_dim;
        kv->k[l] = m->be->alloc(m->be, b);
        if (kv->k[l])
            kv->bytes += b;
        kv->v[l] = m->be->alloc(m->be, b);
        if (kv->v[l])
            kv->bytes += b;
        if (!kv->k[l] || !kv->v[l]) {
            eng_kv_free(kv);
            return NULL;
        }
    }
    return kv;
}

void eng_kv_reset(eng_kv_cache *kv)
{
    memset(kv->len, 0, sizeof *kv->len * (size_t)kv->B);
}

int eng_kv_len(const eng_kv_cache *kv, int b)
{
    return b >= 0 && b < kv->B ? kv->len[b] : -1;
}

size_t eng_kv_bytes(const eng_kv_cache *kv)
{
    return kv->bytes;
}

void eng_kv_free(eng_kv_cache *kv)
{
    if (!kv)
        return;
    eng_model *m = kv->m;
    for (int l = 0; kv->k && l < m->a.n_layers; l++) {
        size_t b = F4 * (size_t)kv->B * (size_t)kv->max_T * (size_t)m->a.layers[l].n_kv_heads * (size_t)m->a.head_dim;
        m->be->free(m->be, kv->k[l], kv->k[l] ? b : 0);
        if (kv->v)
            m->be->free(m->be, kv->v[l], kv->v[l] ? b : 0);
    }
    free(kv->k);
    free(kv->v);
    free(kv->len);
    free(kv);
}

/* ---- statistics ---------------------------------------------------------------------- */

eng_act_stats *eng_stats_new(const eng_model *m)
{
    const arch *a = &m->a;
    int L = a->n_layers;
    eng_act_stats *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->ffn_abs = calloc((size_t)(L ? L : 1), sizeof *s->ffn_abs);
    s->head_norm = calloc((size_t)(L ? L : 1), sizeof *s->head_norm);
    s->hidden_abs = calloc((size_t)a->hidden_size, sizeof *s->hidden_abs);
    int bad = !s->ffn_abs || !s->head_norm || !s->hidden_abs;
    for (int l = 0; !bad && l < L; l++) {
        if (a->layers[l].ffn_dim && !(s->ffn_abs[l] = calloc((size_t)a->layers[l].ffn_dim, sizeof(double))))
            bad = 1;
        if (a->layers[l].n_heads && !(s->head_norm[l] = calloc((size_t)a->layers[l].n_heads, sizeof(double))))
            bad = 1;
    }
    if (bad) {
        eng_stats_free(s, L);
        return NULL;
    }
    return s;
}

void eng_stats_free(eng_act_stats *s, int n_layers)
{
    if (!s)
        return;
    for (int l = 0; l < n_layers; l++) {
        if (s->ffn_abs)
            free(s->ffn_abs[l]);
        if (s->head_norm)
            free(s->head_norm[l]);
    }
    free(s->ffn_abs);
    free(s->head_norm);
    free(s->hidden_abs);
    free(s);
}

/* ---- forward --------------------------------------------------------------------------- */

/* One block's activations. Inference points these at shared scratch; training gives
 * every present block its own (the saved activations). */
typedef struct {
    float *rstd, *q, *k, *v, *o, *lse, *r, *y, *gate, *up;
} blk_act;

typedef struct {
    int B, T, N;
    const int *tok_d, *pos_d, *pos0_d, *lens_d;   /* device */
    const int *lens_h;                            /* host [B] */
    eng_kv_cache *kv;                             /* NULL: S = T */
    const eng_masks *mk;                          /* NULL: plain model */
    float n_eff;
    float *xn, *om, *h, *stat;                    /* scratch */
    float *stat_host;
    float **xs;                                   /* residual chain: block i reads xs[i], writes xs[i+1] */
    blk_act *acts;                                /* per block (training) or NULL */
    blk_act tmp;                                  /* inference scratch */
    double *layer_ns, *fixed_ns;
    eng_act_stats *stats;
} fwd_state;

/* Accumulate out[G] += per-group norms of x [N, G*D] over valid rows into host doubles. */
static void stats_add(eng_model *m, fwd_state *st, double *acc, const float *x, int G, int D)
{
    eng_backend *be = m->be;
    be->zero(be, st->stat, F4 * (size_t)G);
    size_t row = (size_t)G * D;
    for (int b = 0; b < st->B; b++) {
        int len = st->lens_h ? st->lens_h[b] : st->T;
        if (len > 0)
            be->group_norm_sum(be, st->stat, x + (size_t)b * st->T * row, len, G, D);
    }
    be->to_host(be, st->stat_host, st->stat, F4 * (size_t)G);
    for (int g = 0; g < G; g++)
        acc[g] += st->stat_host[g];
}

/* x_out = (x_in + gate*y) * hidden   (masks), or x_in + y. Saves r when asked. */
static void residual(eng_model *m, fwd_state *st, float *x_out, const float *x_in, const float *y,
                     const float *gate_dev, float *r_save)
{
    eng_backend *be = m->be;
    size_t n = (size_t)st->N * m->a.hidden_size;
    if (!st->mk) {
        be->add(be, x_out, x_in, y, n);
        return;
    }
    if (x_out != x_in)
        be->copy(be, x_out, x_in, n * F4);
    be->axpy_dev(be, x_out, gate_dev, y, n);
    if (r_save)
        be->copy(be, r_save, x_out, n * F4);
    be->mask_fwd(be, x_out, x_out, st->mk->hidden, st->N, m->a.hidden_size, 1);
}

static void linear(eng_backend *be, float *y, const float *x, const float *W, const float *b,
                   int N, int out, int in)
{
    be->gemm(be, 0, 1, N, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
    if (b)
        be->bias_add(be, y, b, N, out);
}

static void attn_block(eng_model *m, fwd_state *st, int l, const float *x_in, float *x_out, blk_act *A)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    const eng_layer *L = &m->layers[l];
    model_impl *im = m->impl;
    int N = st->N, C = a->hidden_size, D = a->head_dim;
    int Hq = a->layers[l].n_heads, Hkv = a->layers[l].n_kv_heads, qd = Hq * D, kvd = Hkv * D;
    be->rmsnorm_fwd(be, st->xn, A->rstd, x_in, L->attn_norm, N, C, st->n_eff, (float)a->norm_eps);
    if (st->stats)
        stats_add(m, st, st->stats->hidden_abs, st->xn, C, 1);
    linear(be, A->q, st->xn, L->wq, L->bq, N, qd, C);
    linear(be, A->k, st->xn, L->wk, L->bk, N, kvd, C);
    linear(be, A->v, st->xn, L->wv, L->bv, N, kvd, C);
    be->rope_fwd(be, A->q, st->pos_d, im->inv_freq, N, Hq, D);
    be->rope_fwd(be, A->k, st->pos_d, im->inv_freq, N, Hkv, D);
    const float *K = A->k, *V = A->v;
    int S = st->T;
    if (st->kv) {
        eng_kv_cache *kv = st->kv;
        for (int b = 0; b < st->B; b++) {
            size_t dst = ((size_t)b * kv->max_T + kv->len[b]) * kvd, src = (size_t)b * st->T * kvd;
            be->copy(be, kv->k[l] + dst, A->k + src, F4 * (size_t)st->T * kvd);
            be->copy(be, kv->v[l] + dst, A->v + src, F4 * (size_t)st->T * kvd);
        }
        K = kv->k[l];
        V = kv->v[l];
        S = kv->max_T;
    }
    be->attn_fwd(be, A->o, A->lse, A->q, K, V, st->pos0_d, st->lens_d, st->B, st->T, S, Hq, Hkv, D,
                 (float)(1.0 / sqrt((double)D)));
    if (st->stats)
        stats_add(m, st, st->stats->head_norm[l], A->o, Hq, D);
    const float *om = A->o;
    if (st->mk) {
        be->mask_fwd(be, st->om, A->o, st->mk->head[l], N, Hq, D);
        om = st->om;
    }
    linear(be, A->y, om, L->wo, NULL, N, C, qd);
    residual(m, st, x_out, x_in, A->y, st->mk ? st->mk->attn_gate + l : NULL, A->r);
}

static void mlp_block(eng_model *m, fwd_state *st, int l, const float *x_in, float *x_out, blk_act *A)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    const eng_layer *L = &m->layers[l];
    int N = st->N, C = a->hidden_size, F = a->layers[l].ffn_dim;
    be->rmsnorm_fwd(be, st->xn, A->rstd, x_in, L->ffn_norm, N, C, st->n_eff, (float)a->norm_eps);
    if (st->stats)
        stats_add(m, st, st->stats->hidden_abs, st->xn, C, 1);
    linear(be, A->gate, st->xn, L->w_gate, NULL, N, F, C);
    linear(be, A->up, st->xn, L->w_up, NULL, N, F, C);
    be->swiglu_fwd(be, st->h, A->gate, A->up, (size_t)N * F);
    if (st->stats)
        stats_add(m, st, st->stats->ffn_abs[l], st->h, F, 1);
    if (st->mk)
        be->mask_fwd(be, st->h, st->h, st->mk->ffn[l], N, F, 1);
    linear(be, A->y, st->h, L->w_down, NULL, N, C, F);
    residual(m, st, x_out, x_in, A->y, st->mk ? st->mk->mlp_gate + l : NULL, A->r);
}

/* Embedding and all layers. Training (acts set): block i reads xs[i] and writes
 * xs[i+1], the final stream is xs[n_blocks]; inference updates xs[0] in place. */
static void run_layers(eng_model *m, fwd_state *st)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    double e0 = 0;
    if (st->fixed_ns) {
        be->sync(be);
        e0 = eng_wall_s();
    }
    be->embed_fwd(be, st->xs[0], m->tok_emb, st->tok_d, st->N, a->hidden_size);
    if (st->mk)
        be->mask_fwd(be, st->xs[0], st->xs[0], st->mk->hidden, st->N, a->hidden_size, 1);
    if (st->fixed_ns) {
        be->sync(be);
        st->fixed_ns[0] = (eng_wall_s() - e0) * 1e9;
    }
    int blk = 0;
    for (int l = 0; l < a->n_layers; l++) {
        for (int part = 0; part < 2; part++) {
            int present = part == 0 ? a->layers[l].n_heads > 0 : a->layers[l].ffn_dim > 0;
            double t0 = 0;
            if (st->layer_ns) {
                be->sync(be);
                t0 = eng_wall_s();
            }
            if (present) {
                blk_act *A = st->acts ? &st->acts[blk] : &st->tmp;
                float *xin = st->acts ? st->xs[blk] : st->xs[0], *xout = st->acts ? st->xs[blk + 1] : st->xs[0];
                if (part == 0)
                    attn_block(m, st, l, xin, xout, A);
                else
                    mlp_block(m, st, l, xin, xout, A);
                blk++;
            }
            if (st->layer_ns) {
                be->sync(be);
                st->layer_ns[2 * l + part] = present ? (eng_wall_s() - t0) * 1e9 : 0;
            }
        }
    }
}

static int count_blocks(const arch *a)
{
    int n = 0;
    for (int l = 0; l < a->n_layers; l++)
        n += (a->layers[l].n_heads > 0) + (a->layers[l].ffn_dim > 0);
    return n;
}

static int head_rows(int B, int N, int logits_mode)
{
    if (logits_mode == ENG_LOGITS_LAST)
        return B;
    if (logits_mode == ENG_LOGITS_ALL)
        return N < ENG_LOGIT_CHUNK_ROWS ? N : ENG_LOGIT_CHUNK_ROWS;
    return 0;
}

/* Float count of the inference workspace (excluding ints and attention scratch). */
static size_t fwd_floats(const arch *a, int B, int T, int logits_mode, int with_stats, int with_masks)
{
    dims_max d = max_dims(a);
    size_t N = (size_t)B * T, C = (size_t)a->hidden_size;
    size_t n = N * (3 * C + 2 * (size_t)d.qd + 2 * (size_t)d.kvd + 3 * (size_t)d.f + 1);
    size_t R = (size_t)head_rows(B, (int)N, logits_mode);
    n += R * (2 * C + (size_t)a->vocab_size);
    if (with_stats)
        n += (size_t)imax(a->hidden_size, imax(d.hq, d.f));
    if (with_masks)
        n += N * (size_t)d.qd;
    return n;
}

static size_t fwd_bytes(const arch *a, int B, int T, int kv_max_T, int logits_mode, int threads, int with_stats,
                        int with_masks)
{
    size_t S = (size_t)(kv_max_T > 0 ? kv_max_T : T);
    int attn = 0;
    for (int l = 0; l < a->n_layers; l++)
        attn |= a->layers[l].n_heads > 0;
    return fwd_floats(a, B, T, logits_mode, with_stats, with_masks) * F4 +
           (2 * (size_t)B * T + 2 * (size_t)B) * sizeof(int) +
           (attn ? (size_t)(threads > 0 ? threads : 1) * ENG_CPU_ATTN_ROWS * S * F4 : 0);
}

size_t eng_forward_workspace_bytes(const arch *a, int B, int T, int kv_max_T, int logits_mode,
                                   int threads, int with_stats)
{
    return fwd_bytes(a, B, T, kv_max_T, logits_mode, threads, with_stats, 0);
}

typedef struct {
    float *f;
    size_t f_bytes;
    int *i;
    size_t i_bytes;
} ws_t;

static void ws_free(eng_backend *be, ws_t *w)
{
    be->free(be, w->f, w->f ? w->f_bytes : 0);
    be->free(be, w->i, w->i ? w->i_bytes : 0);
    w->f = NULL;
    w->i = NULL;
}

/* Upload tokens, positions, first positions and lengths. ints: [tok N | pos N | pos0 B | lens B]. */
static void upload_ints(eng_backend *be, int *dev, int *host, const int *tokens, const int *lens,
                        const eng_kv_cache *kv, int B, int T)
{
    int N = B * T;
    memcpy(host, tokens, sizeof(int) * (size_t)N);
    for (int b = 0; b < B; b++) {
        int past = kv ? kv->len[b] : 0;
        for (int t = 0; t < T; t++)
            host[N + b * T + t] = past + t;
        host[2 * N + b] = past;
        host[2 * N + B + b] = lens ? lens[b] : T;
    }
    be->to_device(be, dev, host, sizeof(int) * (size_t)(2 * N + 2 * B));
}

static int check_tokens(const int *tokens, size_t n, int V, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V) {
            snprintf(err, errlen, "token %d at index %zu is out of range [0, %d)", tokens[i], i, V);
            return -1;
        }
    return 0;
}

/* Prepare the inference state: workspace, ints and scratch pointers. With masks ==
 * NULL the model runs unmasked. The caller runs run_layers and frees ws. */
static int fwd_setup(eng_model *m, fwd_state *st, ws_t *ws, int *host_ints, const int *tokens, int B, int T,
                     const int *lens, eng_kv_cache *kv, int logits_mode, eng_act_stats *stats,
                     const eng_masks *mk, float **xs1, float **head_base)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    dims_max d = max_dims(a);
    size_t N = (size_t)B * T, C = (size_t)a->hidden_size;
    memset(st, 0, sizeof *st);
    memset(ws, 0, sizeof *ws);
    ws->f_bytes = fwd_floats(a, B, T, logits_mode, stats != NULL, mk != NULL) * F4;
    ws->i_bytes = sizeof(int) * (2 * N + 2 * (size_t)B);
    ws->f = be->alloc(be, ws->f_bytes);
    ws->i = be->alloc(be, ws->i_bytes);
    if (!ws->f || !ws->i) {
        ws_free(be, ws);
        return -1;
    }
    upload_ints(be, ws->i, host_ints, tokens, lens, kv, B, T);
    st->B = B;
    st->T = T;
    st->N = (int)N;
    st->tok_d = ws->i;
    st->pos_d = ws->i + N;
    st->pos0_d = ws->i + 2 * N;
    st->lens_d = ws->i + 2 * N + B;
    st->lens_h = host_ints + 2 * N + B;
    st->kv = kv;
    st->mk = mk;
    st->n_eff = mk ? mk->hidden_count : (float)a->hidden_size;
    float *p = ws->f;
    float *x = p; p += N * C;
    st->xn = p; p += N * C;
    st->tmp.y = p; p += N * C;
    st->tmp.rstd = p; p += N;
    st->tmp.q = p; p += N * (size_t)d.qd;
    st->tmp.o = p; p += N * (size_t)d.qd;
    st->tmp.k = p; p += N * (size_t)d.kvd;
    st->tmp.v = p; p += N * (size_t)d.kvd;
    st->tmp.gate = p; p += N * (size_t)d.f;
    st->tmp.up = p; p += N * (size_t)d.f;
    st->h = p; p += N * (size_t)d.f;
    if (mk) {
        st->om = p;
        p += N * (size_t)d.qd;
    }
    if (stats) {
        st->stat = p;
        p += (size_t)imax(a->hidden_size, imax(d.hq, d.f));
    }
    *head_base = p;
    xs1[0] = x;
    st->xs = xs1;
    st->stats = stats;
    return 0;
}

/* Logits for rows of the final stream x [N,C]: LAST gathers each row's last valid token. */
static void lm_head(eng_model *m, fwd_state *st, const float *x, float *head, int logits_mode,
                    float *logits_host, float n_eff)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    int C = a->hidden_size, V = a->vocab_size, B = st->B, T = st->T;
    if (logits_mode == ENG_LOGITS_LAST) {
        float *xg = head, *hn = head + (size_t)B * C, *lg = hn + (size_t)B * C;
        for (int b = 0; b < B; b++) {
            int last = st->lens_h[b] - 1;
            if (last < 0)
                be->zero(be, xg + (size_t)b * C, F4 * (size_t)C);
            else
                be->copy(be, xg + (size_t)b * C, x + ((size_t)b * T + last) * C, F4 * (size_t)C);
        }
        be->rmsnorm_fwd(be, hn, NULL, xg, m->final_norm, B, C, n_eff, (float)a->norm_eps);
        be->gemm(be, 0, 1, B, V, C, 1.0f, hn, C, m->lm_head, C, 0.0f, lg, V);
        be->to_host(be, logits_host, lg, F4 * (size_t)B * V);
        for (int b = 0; b < B; b++)
            if (st->lens_h[b] <= 0)
                memset(logits_host + (size_t)b * V, 0, F4 * (size_t)V);
    } else if (logits_mode == ENG_LOGITS_ALL) {
        int N = st->N, R = head_rows(B, N, logits_mode);
        float *hn = head + (size_t)R * C, *lg = hn + (size_t)R * C;
        for (int r0 = 0; r0 < N; r0 += R) {
            int r = N - r0 < R ? N - r0 : R;
            be->rmsnorm_fwd(be, hn, NULL, x + (size_t)r0 * C, m->final_norm, r, C, n_eff, (float)a->norm_eps);
            be->gemm(be, 0, 1, r, V, C, 1.0f, hn, C, m->lm_head, C, 0.0f, lg, V);
            be->to_host(be, logits_host + (size_t)r0 * V, lg, F4 * (size_t)r * V);
        }
    }
}

int eng_forward(eng_model *m, const eng_fwd_args *args, char *err, size_t errlen)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    int B = args->B, T = args->T;
    if (B <= 0 || T <= 0) {
        snprintf(err, errlen, "forward: batch %d x %d tokens is empty", B, T);
        return -1;
    }
    if (args->logits_mode != ENG_LOGITS_NONE && !args->logits) {
        snprintf(err, errlen, "forward: logits requested without an output buffer");
        return -1;
    }
    if (check_tokens(args->tokens, (size_t)B * T, a->vocab_size, err, errlen) != 0)
        return -1;
    for (int b = 0; args->lens && b < B; b++)
        if (args->lens[b] < 0 || args->lens[b] > T) {
            snprintf(err, errlen, "forward: lens[%d] = %d is out of range [0, %d]", b, args->lens[b], T);
            return -1;
        }
    eng_kv_cache *kv = args->kv;
    if (kv) {
        if (kv->m != m || kv->B != B) {
            snprintf(err, errlen, "forward: KV cache was made for another model or batch (%d rows, got %d)", kv->B, B);
            return -1;
        }
        for (int b = 0; b < B; b++)
            if (kv->len[b] + T > kv->max_T) {
                snprintf(err, errlen, "forward: KV cache full (row %d holds %d of %d positions, %d more asked)", b,
                         kv->len[b], kv->max_T, T);
                return -1;
            }
    }
    if (a->rope_scaling.type == ROPE_SCALING_DYNAMIC) {
        int past = 0;
        for (int b = 0; kv && b < B; b++)
            past = imax(past, kv->len[b]);
        if (past + T > a->max_position_embeddings) {
            snprintf(err, errlen, "forward: dynamic RoPE scaling beyond max_position_embeddings (%d) is not "
                     "available in this build", a->max_position_embeddings);
            return -1;
        }
    }
    int *host_ints = malloc(sizeof(int) * (size_t)(2 * B * T + 2 * B));
    if (!host_ints) {
        snprintf(err, errlen, "forward: out of host memory");
        return -1;
    }
    fwd_state st;
    ws_t ws;
    float *xs1[1], *head;
    if (fwd_setup(m, &st, &ws, host_ints, args->tokens, B, T, args->lens, kv, args->logits_mode, args->stats,
                  m->masks, xs1, &head) != 0) {
        free(host_ints);
        snprintf(err, errlen, "forward: out of device memory for the workspace of %d x %d tokens", B, T);
        return -1;
    }
    float *stat_host = NULL;
    if (args->stats) {
        dims_max d = max_dims(a);
        stat_host = malloc(F4 * (size_t)imax(a->hidden_size, imax(d.hq, d.f)));
        if (!stat_host) {
            ws_free(be, &ws);
            free(host_ints);
            snprintf(err, errlen, "forward: out of host memory");
            return -1;
        }
        st.stat_host = stat_host;
    }
    st.layer_ns = args->layer_ns;
    st.fixed_ns = args->fixed_ns;
    run_layers(m, &st);
    double t0 = eng_wall_s();
    lm_head(m, &st, st.xs[0], head, args->logits_mode, args->logits, st.n_eff);
    if (args->fixed_ns) {
        be->sync(be);
        args->fixed_ns[1] = (eng_wall_s() - t0) * 1e9;
    }
    if (args->stats) {
        int64_t n = 0;
        for (int b = 0; b < B; b++)
            n += st.lens_h[b];
        args->stats->tokens += n;
    }
    if (kv)
        for (int b = 0; b < B; b++)
            kv->len[b] += st.lens_h[b];
    ws_free(be, &ws);
    free(stat_host);
    free(host_ints);
    return 0;
}

/* ---- training ------------------------------------------------------------------------ */

typedef struct {
    size_t saved, scratch, loss;  /* floats */
} train_sizes;

static train_sizes train_floats(const arch *a, int B, int T, int with_masks, int teacher_C)
{
    dims_max d = max_dims(a);
    size_t N = (size_t)B * T, C = (size_t)a->hidden_size, V = (size_t)a->vocab_size;
    train_sizes s = {0, 0, 0};
    int nb = count_blocks(a);
    s.saved = (size_t)(nb + 1) * N * C;                    /* residual chain */
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *ly = &a->layers[l];
        size_t qd = (size_t)ly->n_heads * a->head_dim, kvd = (size_t)ly->n_kv_heads * a->head_dim;
        if (ly->n_heads)
            s.saved += N * (1 + 2 * qd + 2 * kvd + (size_t)ly->n_heads + (with_masks ? 2 * C : C));
        if (ly->ffn_dim)
            s.saved += N * (1 + 2 * (size_t)ly->ffn_dim + (with_masks ? 2 * C : C));
    }
    /* backward scratch: dx, dyb, xn, dxn [N,C] + max(attention: om, dO, dq (qd), dk, dv (kvd);
     * mlp: z, zm, dz (F)) + the masked head output of the forward (qd, masks) */
    size_t attn = 3 * (size_t)d.qd + 2 * (size_t)d.kvd, mlp = 3 * (size_t)d.f;
    s.scratch = N * (4 * C + (attn > mlp ? attn : mlp)) + 1;
    size_t R = (size_t)(N < ENG_LOGIT_CHUNK_ROWS ? N : ENG_LOGIT_CHUNK_ROWS);
    s.loss = R * (2 * C + 1 + (teacher_C ? 3 : 2) * V) + 2 * R;
    s.loss += N * (size_t)teacher_C;                       /* teacher's normed final stream */
    return s;
}

size_t eng_train_workspace_bytes(const eng_model *m, int B, int T, const eng_model *teacher)
{
    train_sizes s = train_floats(&m->a, B, T, m->masks != NULL, teacher ? teacher->a.hidden_size : 0);
    size_t N = (size_t)B * T, attn = 0;
    int threads = m->be->threads > 0 ? m->be->threads : 1;
    for (int l = 0; l < m->a.n_layers; l++)
        attn |= m->a.layers[l].n_heads > 0;
    size_t held = (s.saved + s.scratch + s.loss) * F4 + sizeof(int) * (3 * N + 2 * (size_t)B);
    /* on top of it, at different times: the backward's attention tiles (threads x 2 x
     * ENG_CPU_ATTN_ROWS x T floats; the forward's are half), or the teacher's forward */
    size_t extra = attn ? (size_t)threads * 2 * ENG_CPU_ATTN_ROWS * T * F4 : 0;
    if (teacher) {
        size_t tw = fwd_bytes(&teacher->a, B, T, 0, ENG_LOGITS_NONE, threads, 0, teacher != m && teacher->masks);
        extra = tw > extra ? tw : extra;
    }
    return held + extra;
}

/* y[N,out] = x[N,in] W^T backward: dW[out,in] += dy^T x (if dW); dx = dy W (+ beta dx). */
static void linear_bwd(eng_backend *be, float *dx, float beta, float *dW, const float *dy, const float *x,
                       const float *W, int N, int out, int in)
{
    if (dW)
        be->gemm(be, 1, 0, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW, in);
    if (dx)
        be->gemm(be, 0, 0, N, in, out, 1.0f, dy, out, W, in, beta, dx, in);
}

typedef struct {
    float *dx, *dyb, *xn, *dxn, *big;   /* big: block-specific scratch */
    float *d_neff;                      /* device scalar */
    int gw, gm;                         /* weight grads, mask grads wanted */
} bwd_state;

/* Backward of the residual update and hidden mask: dx holds d x_out on entry and
 * d r (== d x_in along the skip path) on exit; returns the block output's gradient. */
static const float *residual_bwd(eng_model *m, fwd_state *st, bwd_state *bs, blk_act *A,
                                 const float *gate_dev, float *g_gate_dev)
{
    eng_backend *be = m->be;
    size_t n = (size_t)st->N * m->a.hidden_size;
    if (!st->mk)
        return bs->dx;
    be->mask_bwd(be, bs->dx, bs->gm ? m->masks->g_hidden : NULL, bs->dx, A->r, st->mk->hidden, st->N,
                 m->a.hidden_size, 1);
    if (bs->gm)
        be->dot_acc(be, g_gate_dev, bs->dx, A->y, n);
    be->zero(be, bs->dyb, n * F4);
    be->axpy_dev(be, bs->dyb, gate_dev, bs->dx, n);
    return bs->dyb;
}

static void attn_bwd_block(eng_model *m, fwd_state *st, bwd_state *bs, int l, const float *x_in, blk_act *A)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    const eng_layer *L = &m->layers[l];
    eng_layer *G = &m->glayers[l];
    model_impl *im = m->impl;
    int N = st->N, C = a->hidden_size, D = a->head_dim;
    int Hq = a->layers[l].n_heads, Hkv = a->layers[l].n_kv_heads, qd = Hq * D, kvd = Hkv * D;
    const float *dy = residual_bwd(m, st, bs, A, st->mk ? st->mk->attn_gate + l : NULL,
                                   bs->gm ? m->masks->g_attn_gate + l : NULL);
    float *om = bs->big, *dO = om + (size_t)N * qd, *dq = dO + (size_t)N * qd;
    float *dk = dq + (size_t)N * qd, *dv = dk + (size_t)N * kvd;
    const float *omr = A->o;
    if (st->mk) {
        be->mask_fwd(be, om, A->o, st->mk->head[l], N, Hq, D);
        omr = om;
    }
    linear_bwd(be, dO, 0.0f, bs->gw ? G->wo : NULL, dy, omr, L->wo, N, C, qd);
    if (st->mk)
        be->mask_bwd(be, dO, bs->gm ? m->masks->g_head[l] : NULL, dO, A->o, st->mk->head[l], N, Hq, D);
    be->attn_bwd(be, dq, dk, dv, dO, A->q, A->k, A->v, A->o, A->lse, st->pos0_d, st->lens_d, st->B, st->T, st->T,
                 Hq, Hkv, D, (float)(1.0 / sqrt((double)D)));
    be->rope_bwd(be, dq, st->pos_d, im->inv_freq, N, Hq, D);
    be->rope_bwd(be, dk, st->pos_d, im->inv_freq, N, Hkv, D);
    if (bs->gw && L->bq) {
        be->colsum_acc(be, G->bq, dq, N, qd);
        be->colsum_acc(be, G->bk, dk, N, kvd);
        be->colsum_acc(be, G->bv, dv, N, kvd);
    }
    be->rmsnorm_fwd(be, bs->xn, NULL, x_in, L->attn_norm, N, C, st->n_eff, (float)a->norm_eps);
    linear_bwd(be, bs->dxn, 0.0f, bs->gw ? G->wq : NULL, dq, bs->xn, L->wq, N, qd, C);
    linear_bwd(be, bs->dxn, 1.0f, bs->gw ? G->wk : NULL, dk, bs->xn, L->wk, N, kvd, C);
    linear_bwd(be, bs->dxn, 1.0f, bs->gw ? G->wv : NULL, dv, bs->xn, L->wv, N, kvd, C);
    be->rmsnorm_bwd(be, bs->dx, bs->gw ? G->attn_norm : NULL, bs->gm ? bs->d_neff : NULL, bs->dxn, x_in,
                    L->attn_norm, A->rstd, N, C, st->n_eff);
}

static void mlp_bwd_block(eng_model *m, fwd_state *st, bwd_state *bs, int l, const float *x_in, blk_act *A)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    const eng_layer *L = &m->layers[l];
    eng_layer *G = &m->glayers[l];
    int N = st->N, C = a->hidden_size, F = a->layers[l].ffn_dim;
    const float *dy = residual_bwd(m, st, bs, A, st->mk ? st->mk->mlp_gate + l : NULL,
                                   bs->gm ? m->masks->g_mlp_gate + l : NULL);
    float *z = bs->big, *zm = z + (size_t)N * F, *dz = zm + (size_t)N * F;
    be->swiglu_fwd(be, z, A->gate, A->up, (size_t)N * F);
    const float *zr = z;
    if (st->mk) {
        be->mask_fwd(be, zm, z, st->mk->ffn[l], N, F, 1);
        zr = zm;
    }
    linear_bwd(be, dz, 0.0f, bs->gw ? G->w_down : NULL, dy, zr, L->w_down, N, C, F);
    if (st->mk)
        be->mask_bwd(be, dz, bs->gm ? m->masks->g_ffn[l] : NULL, dz, z, st->mk->ffn[l], N, F, 1);
    float *dgate = z, *dup = zm;   /* z and zm are dead now */
    be->swiglu_bwd(be, dgate, dup, dz, A->gate, A->up, (size_t)N * F);
    be->rmsnorm_fwd(be, bs->xn, NULL, x_in, L->ffn_norm, N, C, st->n_eff, (float)a->norm_eps);
    linear_bwd(be, bs->dxn, 0.0f, bs->gw ? G->w_gate : NULL, dgate, bs->xn, L->w_gate, N, F, C);
    linear_bwd(be, bs->dxn, 1.0f, bs->gw ? G->w_up : NULL, dup, bs->xn, L->w_up, N, F, C);
    be->rmsnorm_bwd(be, bs->dx, bs->gw ? G->ffn_norm : NULL, bs->gm ? bs->d_neff : NULL, bs->dxn, x_in,
                    L->ffn_norm, A->rstd, N, C, st->n_eff);
}

/* Teacher pass: its normed final stream [N,C] into out (device, on the student's backend). */
static int teacher_final(eng_model *t, const int *tokens, int B, int T, int unmasked, float *out,
                         char *err, size_t errlen)
{
    int *host_ints = malloc(sizeof(int) * (size_t)(2 * B * T + 2 * B));
    if (!host_ints) {
        snprintf(err, errlen, "teacher forward: out of host memory");
        return -1;
    }
    fwd_state st;
    ws_t ws;
    float *xs1[1], *head;
    const eng_masks *mk = unmasked ? NULL : t->masks;
    if (fwd_setup(t, &st, &ws, host_ints, tokens, B, T, NULL, NULL, ENG_LOGITS_NONE, NULL, mk, xs1, &head) != 0) {
        free(host_ints);
        snprintf(err, errlen, "teacher forward: out of device memory for %d x %d tokens", B, T);
        return -1;
    }
    run_layers(t, &st);
    t->be->rmsnorm_fwd(t->be, out, NULL, st.xs[0], t->final_norm, st.N, t->a.hidden_size, st.n_eff,
                       (float)t->a.norm_eps);
    ws_free(t->be, &ws);
    free(host_ints);
    return 0;
}

int eng_forward_backward(eng_model *m, const int *tokens, int B, int T, const eng_loss_spec *loss,
                         int grad_flags, eng_loss_result *out, char *err, size_t errlen)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    int C = a->hidden_size, V = a->vocab_size;
    size_t N = (size_t)B * T;
    memset(out, 0, sizeof *out);
    int want_ce = (loss->kind & ENG_LOSS_CE) != 0, want_kd = (loss->kind & ENG_LOSS_KD) != 0;
    if (B <= 0 || T <= 0 || (!want_ce && !want_kd)) {
        snprintf(err, errlen, "forward_backward: empty batch or no loss selected");
        return -1;
    }
    if (want_ce && !loss->targets) {
        snprintf(err, errlen, "forward_backward: CE loss needs targets");
        return -1;
    }
    if (want_kd && (!loss->teacher || loss->teacher->a.vocab_size != V || loss->teacher->be != be ||
                    !(loss->temperature > 0))) {
        snprintf(err, errlen, "forward_backward: KD needs a teacher with the same vocabulary on the same backend "
                              "and a positive temperature");
        return -1;
    }
    int gw = (grad_flags & ENG_GRAD_WEIGHTS) != 0, gm = (grad_flags & ENG_GRAD_MASKS) != 0;
    if (gw && !m->grads) {
        snprintf(err, errlen, "forward_backward: weight gradients asked but not enabled");
        return -1;
    }
    if (gm && !m->masks) {
        snprintf(err, errlen, "forward_backward: mask gradients asked but masks are not enabled");
        return -1;
    }
    if (check_tokens(tokens, N, V, err, errlen) != 0)
        return -1;
    if (a->rope_scaling.type == ROPE_SCALING_DYNAMIC && T > a->max_position_embeddings) {
        snprintf(err, errlen, "forward_backward: dynamic RoPE scaling beyond max_position_embeddings (%d) is not "
                 "available in this build", a->max_position_embeddings);
        return -1;
    }
    int64_t count = 0;
    for (size_t i = 0; i < N; i++) {
        if (loss->targets && loss->targets[i] >= V) {
            snprintf(err, errlen, "target %d at index %zu is out of range [-1, %d)", loss->targets[i], i, V);
            return -1;
        }
        count += loss->targets ? loss->targets[i] >= 0 : 1;
    }
    if (count == 0) {
        snprintf(err, errlen, "forward_backward: every target is ignored (-1)");
        return -1;
    }
    double w_kd = want_ce && want_kd ? loss->kd_weight : want_kd ? 1.0 : 0.0, w_ce = 1.0 - w_kd;

    int tC = want_kd ? loss->teacher->a.hidden_size : 0;
    train_sizes sz = train_floats(a, B, T, m->masks != NULL, tC);
    ws_t ws = {0};
    ws.f_bytes = (sz.saved + sz.scratch + sz.loss) * F4;
    ws.i_bytes = sizeof(int) * (3 * N + 2 * (size_t)B);
    int *host_ints = malloc(ws.i_bytes);
    int nb = count_blocks(a);
    blk_act *acts = calloc((size_t)(nb ? nb : 1), sizeof *acts);
    float **xs = calloc((size_t)nb + 1, sizeof *xs);
    float *loss_host = malloc(sizeof(float) * 2 * ENG_LOGIT_CHUNK_ROWS);
    ws.f = be->alloc(be, ws.f_bytes);
    ws.i = be->alloc(be, ws.i_bytes);
    if (!host_ints || !acts || !xs || !loss_host || !ws.f || !ws.i) {
        ws_free(be, &ws);
        free(host_ints);
        free(acts);
        free(xs);
        free(loss_host);
        snprintf(err, errlen, "forward_backward: out of memory for %d x %d tokens (%zu workspace bytes)", B, T,
                 (size_t)((sz.saved + sz.scratch + sz.loss) * F4));
        return -1;
    }
    /* Carve: saved | scratch | loss. */
    float *p = ws.f;
    for (int i = 0; i <= nb; i++) {
        xs[i] = p;
        p += N * C;
    }
    int blk = 0;
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *ly = &a->layers[l];
        size_t qd = (size_t)ly->n_heads * a->head_dim, kvd = (size_t)ly->n_kv_heads * a->head_dim;
        if (ly->n_heads) {
            blk_act *A = &acts[blk++];
            A->rstd = p; p += N;
            A->q = p; p += N * qd;
            A->o = p; p += N * qd;
            A->k = p; p += N * kvd;
            A->v = p; p += N * kvd;
            A->lse = p; p += N * (size_t)ly->n_heads;
            A->y = p; p += N * C;
            if (m->masks) {
                A->r = p;
                p += N * C;
            }
        }
        if (ly->ffn_dim) {
            blk_act *A = &acts[blk++];
            A->rstd = p; p += N;
            A->gate = p; p += N * (size_t)ly->ffn_dim;
            A->up = p; p += N * (size_t)ly->ffn_dim;
            A->y = p; p += N * C;
            if (m->masks) {
                A->r = p;
                p += N * C;
            }
        }
    }
    dims_max d = max_dims(a);
    bwd_state bs = {0};
    bs.gw = gw;
    bs.gm = gm;
    bs.dx = p; p += N * C;
    bs.dyb = p; p += N * C;
    bs.xn = p; p += N * C;
    bs.dxn = p; p += N * C;
    bs.d_neff = p; p += 1;
    bs.big = p;
    {
        size_t attn = 3 * (size_t)d.qd + 2 * (size_t)d.kvd, mlp = 3 * (size_t)d.f;
        p += N * (attn > mlp ? attn : mlp);
    }
    int R = (int)(N < ENG_LOGIT_CHUNK_ROWS ? N : ENG_LOGIT_CHUNK_ROWS);
    float *hn = p; p += (size_t)R * C;
    float *dhn = p; p += (size_t)R * C;
    float *rstd_c = p; p += (size_t)R;
    float *lg = p; p += (size_t)R * V;
    float *dlg = p; p += (size_t)R * V;
    float *tlg = NULL, *thn = NULL;
    if (want_kd) {
        tlg = p; p += (size_t)R * V;
        thn = p; p += N * (size_t)tC;
    }
    float *loss_ce = p; p += (size_t)R;
    float *loss_kd = p; p += (size_t)R;

    int rc = 0;
    if (want_kd) {
        eng_model *t = loss->teacher;
        rc = teacher_final(t, tokens, B, T, t == m, thn, err, errlen);
    }
    /* ints: tokens N | pos N | pos0 B | lens B | targets N */
    upload_ints(be, ws.i, host_ints, tokens, NULL, NULL, B, T);
    int *tgt_d = ws.i + 2 * N + 2 * B;
    for (size_t i = 0; i < N; i++)
        host_ints[2 * N + 2 * B + i] = loss->targets ? loss->targets[i] : 0;
    be->to_device(be, tgt_d, host_ints + 2 * N + 2 * B, sizeof(int) * N);

    fwd_state st;
    memset(&st, 0, sizeof st);
    st.B = B;
    st.T = T;
    st.N = (int)N;
    st.tok_d = ws.i;
    st.pos_d = ws.i + N;
    st.pos0_d = ws.i + 2 * N;
    st.lens_d = ws.i + 2 * N + B;
    st.lens_h = host_ints + 2 * N + B;
    st.mk = m->masks;
    st.n_eff = m->masks ? m->masks->hidden_count : (float)C;
    st.xn = bs.xn;
    st.om = bs.big;       /* forward-only use; backward rewrites it */
    st.h = bs.big;
    st.xs = xs;
    st.acts = acts;
    if (rc == 0)
        run_layers(m, &st);

    /* Loss and head backward, chunk by chunk. */
    double sum_ce = 0, sum_kd = 0;
    const float *xf = xs[nb];
    if (rc == 0) {
        be->zero(be, bs.dx, N * C * F4);
        if (gm)
            be->zero(be, bs.d_neff, F4);
        for (size_t r0 = 0; r0 < N; r0 += (size_t)R) {
            int r = (int)(N - r0 < (size_t)R ? N - r0 : (size_t)R);
            be->rmsnorm_fwd(be, hn, rstd_c, xf + r0 * C, m->final_norm, r, C, st.n_eff, (float)a->norm_eps);
            be->gemm(be, 0, 1, r, V, C, 1.0f, hn, C, m->lm_head, C, 0.0f, lg, V);
            be->zero(be, dlg, (size_t)r * V * F4);
            const int *tg = loss->targets ? tgt_d + r0 : NULL;
            if (want_ce)
                be->xent(be, loss_ce, dlg, (float)(w_ce / count), lg, tg, r, V);
            if (want_kd) {
                eng_model *t = loss->teacher;
                be->gemm(be, 0, 1, r, V, tC, 1.0f, thn + r0 * tC, tC, t->lm_head, tC, 0.0f, tlg, V);
                be->kl(be, loss_kd, dlg, (float)(w_kd / count), lg, tlg, tg, r, V, loss->temperature);
            }
            if (want_ce) {
                be->to_host(be, loss_host, loss_ce, F4 * (size_t)r);
                for (int i = 0; i < r; i++)
                    sum_ce += loss_host[i];
            }
            if (want_kd) {
                be->to_host(be, loss_host, loss_kd, F4 * (size_t)r);
                for (int i = 0; i < r; i++)
                    sum_kd += loss_host[i];
            }
            if (gw)
                be->gemm(be, 1, 0, V, C, r, 1.0f, dlg, V, hn, C, 1.0f, m->g_lm_head, C);
            be->gemm(be, 0, 0, r, C, V, 1.0f, dlg, V, m->lm_head, C, 0.0f, dhn, C);
            be->rmsnorm_bwd(be, bs.dx + r0 * C, gw ? m->g_final_norm : NULL, gm ? bs.d_neff : NULL, dhn,
                            xf + r0 * C, m->final_norm, rstd_c, r, C, st.n_eff);
        }
        /* Layers in reverse. */
        blk = nb;
        for (int l = a->n_layers - 1; l >= 0; l--) {
            if (a->layers[l].ffn_dim) {
                blk--;
                mlp_bwd_block(m, &st, &bs, l, xs[blk], &acts[blk]);
            }
            if (a->layers[l].n_heads) {
                blk--;
                attn_bwd_block(m, &st, &bs, l, xs[blk], &acts[blk]);
            }
        }
        /* Embedding: h0 = emb * hidden. */
        if (st.mk) {
            be->embed_fwd(be, bs.xn, m->tok_emb, st.tok_d, st.N, C);
            be->mask_bwd(be, bs.dx, gm ? m->masks->g_hidden : NULL, bs.dx, bs.xn, st.mk->hidden, st.N, C, 1);
        }
        if (gw)
            be->embed_bwd(be, m->g_tok_emb, bs.dx, st.tok_d, st.N, C);
        if (gm) {
            float dn = 0;
            be->to_host(be, &dn, bs.d_neff, F4);
            m->masks->g_hidden_count += dn;
        }
        be->sync(be);
        out->tokens = count;
        out->ce = sum_ce / count;
        out->kd = sum_kd / count;
        out->loss = w_ce * out->ce + w_kd * out->kd;
    }
    ws_free(be, &ws);
    free(host_ints);
    free(acts);
    free(xs);
    free(loss_host);
    return rc;
}

/* ---- AdamW ------------------------------------------------------------------------------ */

struct eng_adamw {
    eng_model *m;
    float *mb, *vb;              /* device [n_params] each */
    int64_t t;
};

eng_adamw *eng_adamw_new(eng_model *m)
{
    if (!m->grads)
        return NULL;
    eng_adamw *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    o->m = m;
    o->mb = m->be->alloc(m->be, m->n_params * F4);
    o->vb = m->be->alloc(m->be, m->n_params * F4);
    if (!o->mb || !o->vb) {
        eng_adamw_free(o);
        return NULL;
    }
    m->be->zero(m->be, o->mb, m->n_params * F4);
    m->be->zero(m->be, o->vb, m->n_params * F4);
    return o;
}

double eng_adamw_step(eng_adamw *o, float lr, float beta1, float beta2, float eps,
                      float weight_decay, float clip, float grad_scale)
{
    eng_model *m = o->m;
    eng_backend *be = m->be;
    model_impl *im = m->impl;
    double norm = sqrt(be->sumsq(be, m->grads, m->n_params)) * fabs((double)grad_scale);
    float gs = grad_scale;
    if (clip > 0 && norm > clip)
        gs = (float)(grad_scale * (clip / norm));
    o->t++;
    float bc1 = (float)(1.0 - pow(beta1, (double)o->t)), bc2 = (float)(1.0 - pow(beta2, (double)o->t));
    /* Weight decay applies to matrices (2-D tensors) only, not norms or biases. */
    for (int i = 0; i < im->n_tens; i++) {
        const tensor_ent *t = &im->tens[i];
        size_t n = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        be->adamw(be, m->params + t->off, m->grads + t->off, o->mb + t->off, o->vb + t->off, n, lr, beta1,
                  beta2, eps, t->ndim == 2 ? weight_decay : 0.0f, bc1, bc2, gs);
    }
    return norm;
}

int64_t eng_adamw_t(const eng_adamw *o)
{
    return o->t;
}

int eng_adamw_state(eng_adamw *o, float *m_host, float *v_host)
{
    eng_backend *be = o->m->be;
    be->to_host(be, m_host, o->mb, o->m->n_params * F4);
    be->to_host(be, v_host, o->vb, o->m->n_params * F4);
    return 0;
}

int eng_adamw_restore(eng_adamw *o, int64_t t, const float *m_host, const float *v_host)
{
    if (t < 0)
        return -1;
    eng_backend *be = o->m->be;
    be->to_device(be, o->mb, m_host, o->m->n_params * F4);
    be->to_device(be, o->vb, v_host, o->m->n_params * F4);
    o->t = t;
    return 0;
}

void eng_adamw_free(eng_adamw *o)
{
    if (!o)
        return;
    eng_backend *be = o->m->be;
    be->free(be, o->mb, o->mb ? o->m->n_params * F4 : 0);
    be->free(be, o->vb, o->vb ? o->m->n_params * F4 : 0);
    free(o);
}

/* ---- sampling --------------------------------------------------------------------------- */

typedef struct {
    float p;
    int i;
} prob_idx;

static int cmp_desc(const void *a, const void *b)
{
    float x = ((const prob_idx *)a)->p, y = ((const prob_idx *)b)->p;
    return x < y ? 1 : x > y ? -1 : ((const prob_idx *)a)->i - ((const prob_idx *)b)->i;
}

int eng_sample(const float *logits, int V, float temperature, float top_p, uint64_t *rng)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    if (!(temperature > 0))
        return best;
    prob_idx *pi = malloc(sizeof *pi * (size_t)V);
    if (!pi)
        return best;   /* out of memory: degrade to greedy rather than fail */
    double sum = 0;
    for (int i = 0; i < V; i++) {
        double e = exp(((double)logits[i] - logits[best]) / temperature);
        pi[i].p = (float)e;
        pi[i].i = i;
        sum += e;
    }
    int keep = V;
    if (top_p > 0 && top_p < 1) {
        qsort(pi, (size_t)V, sizeof *pi, cmp_desc);
        double c = 0;
        for (keep = 0; keep < V;) {
            c += pi[keep].p / sum;
            keep++;
            if (c >= top_p)
                break;
        }
        sum = 0;
        for (int i = 0; i < keep; i++)
            sum += pi[i].p;
    }
    double u = eng_rng_unit(eng_xorshift64(rng)) * sum, c = 0;
    int tok = pi[keep - 1].i;
    for (int i = 0; i < keep; i++) {
        c += pi[i].p;
        if (u < c) {
            tok = pi[i].i;
            break;
        }
    }
    free(pi);
    return tok;
}
