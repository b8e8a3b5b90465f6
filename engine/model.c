/* engine/model.c — the model object: the tensor table in HF order and names, one backend
 * allocation of parameters with named views carved out of it (and the same again for
 * gradients), the search masks, tensor get/set and random initialization. Forward,
 * backward, the KV cache, AdamW and sampling live in their own files beside this one.
 *
 * Memory (floats are 4 bytes): weights arch_params(a) floats, one allocation, + head_dim/2
 * floats of RoPE frequencies (eng_model_init); grads the same again (eng_model_enable_grads);
 * masks 2 x (C + sum H + sum F + 2L + sum E + sum S) (eng_model_enable_masks; H: attention or Mamba heads). Accounting counts requested
 * bytes; the CPU backend rounds blocks >= 2 MiB up to 2 MiB (huge pages), so resident
 * memory may exceed it by < 2 MiB per large block.
 */
#include "engine/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/devices.h"
#include "engine/model_internal.h"
#include "engine/rng.h"

/* ---- tensor table ------------------------------------------------------------------ */

static int add_tensor(model_impl *im, int cap, size_t *off, int slot, int layer, const char *name,
                      int64_t d0, int64_t d1)
{
    if (im->n_tens >= cap)
        return -1;
    tensor_ent *t = &im->tens[im->n_tens++];
    t->expert = -1;
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

/* An MoE block's tensors in its family's HF names: Mixtral's block_sparse_moe (gate, experts.e.w1
 * gate / w2 down / w3 up) or Qwen2-MoE's mlp (gate, experts.e.{gate,up,down}_proj, shared_expert,
 * shared_expert_gate). */
static void add_moe(model_impl *im, int cap, size_t *off, const arch *a, int l)
{
    const arch_moe *e = &a->layers[l].moe;
    int64_t C = a->hidden_size, F = e->expert_ffn_dim, S = e->shared_ffn_dim;
    int mixtral = !strcmp(a->family, "mixtral");
    char nm[96];
    snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
    add_tensor(im, cap, off, SL_FNORM, l, nm, C, 0);
    snprintf(nm, sizeof nm, "model.layers.%d.%s.gate.weight", l, mixtral ? "block_sparse_moe" : "mlp");
    add_tensor(im, cap, off, SL_ROUTER, l, nm, e->n_experts, C);
    static const char *const mx[3] = {"w1", "w3", "w2"}, *const qw[3] = {"gate_proj", "up_proj", "down_proj"};
    static const int slots[3] = {SL_XG, SL_XU, SL_XD};
    for (int x = 0; x < e->n_experts; x++)
        for (int k = 0; k < 3; k++) {
            if (mixtral)
                snprintf(nm, sizeof nm, "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", l, x, mx[k]);
            else
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s.weight", l, x, qw[k]);
            if (add_tensor(im, cap, off, slots[k], l, nm, k == 2 ? C : F, k == 2 ? F : C) == 0)
                im->tens[im->n_tens - 1].expert = x;
        }
    if (S > 0) {
        static const int sslots[3] = {SL_SG, SL_SU, SL_SD};
        for (int k = 0; k < 3; k++) {
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_expert.%s.weight", l, qw[k]);
            add_tensor(im, cap, off, sslots[k], l, nm, k == 2 ? C : S, k == 2 ? S : C);
        }
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_expert_gate.weight", l);
        add_tensor(im, cap, off, SL_SGATE, l, nm, 1, C);
    }
}

/* A nemotron_h layer's block in its HF names (backbone.layers.l.norm and .mixer.*): attention
 * (q/k/v/o_proj), a Mamba-2 mixer (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj; the
 * conv weight [cd, 1, K] of the checkpoint is held as [cd, K]) or a squared-ReLU MLP
 * (up_proj, down_proj). The norm takes the slot of the part the block fills. A layer holding
 * a mixer and an MLP (calibration's timing models; no checkpoint has one) names the MLP's
 * block mlp_norm, mlp.up_proj, mlp.down_proj. */
static void add_hybrid(model_impl *im, int cap, size_t *off, const arch *a, int l)
{
    const arch_layer *ly = &a->layers[l];
    int64_t C = a->hidden_size, D = a->head_dim, F = ly->ffn_dim;
    char nm[96];
#define T(slot, suffix, d0, d1) do { snprintf(nm, sizeof nm, "backbone.layers.%d.%s", l, suffix); \
        add_tensor(im, cap, off, slot, l, nm, d0, d1); } while (0)
    T(arch_layer_has_mixer(ly) ? SL_ANORM : SL_FNORM, "norm.weight", C, 0);
    int both = arch_layer_has_mixer(ly) && arch_layer_has_mlp(ly);   /* the MLP's tensors in a block of their own */
    if (ly->n_heads > 0) {
        int64_t q = (int64_t)ly->n_heads * D, kv = (int64_t)ly->n_kv_heads * D;
        T(SL_WQ, "mixer.q_proj.weight", q, C);
        T(SL_WK, "mixer.k_proj.weight", kv, C);
        T(SL_WV, "mixer.v_proj.weight", kv, C);
        T(SL_WO, "mixer.o_proj.weight", C, q);
    } else if (ly->mamba.n_heads > 0) {
        const arch_mamba *mb = &ly->mamba;
        int64_t di = arch_mamba_inner(mb), cd = arch_mamba_conv_dim(mb), H = mb->n_heads;
        T(SL_MIN, "mixer.in_proj.weight", di + cd + H, C);
        T(SL_MCONVW, "mixer.conv1d.weight", cd, mb->conv_kernel);
        T(SL_MCONVB, "mixer.conv1d.bias", cd, 0);
        T(SL_MDTB, "mixer.dt_bias", H, 0);
        T(SL_MALOG, "mixer.A_log", H, 0);
        T(SL_MD, "mixer.D", H, 0);
        T(SL_MNORM, "mixer.norm.weight", di, 0);
        T(SL_MOUT, "mixer.out_proj.weight", C, di);
    }
    if (ly->moe.n_experts > 0) {   /* Nemotron-H's MoE: sigmoid router with its bias, squared-ReLU experts */
        const arch_moe *e = &ly->moe;
        if (both)
            T(SL_FNORM, "mlp_norm.weight", C, 0);
        const char *pre = both ? "mlp" : "mixer";
        char sfx[64];
        snprintf(sfx, sizeof sfx, "%s.gate.weight", pre);
        T(SL_ROUTER, sfx, e->n_experts, C);
        snprintf(sfx, sizeof sfx, "%s.gate.e_score_correction_bias", pre);
        T(SL_RBIAS, sfx, e->n_experts, 0);
        int64_t io = arch_moe_io(e, (int)C);   /* the experts' width: the latent, else C */
        if (e->latent_dim) {
            snprintf(sfx, sizeof sfx, "%s.fc1_latent_proj.weight", pre);
            T(SL_LATIN, sfx, io, C);
            snprintf(sfx, sizeof sfx, "%s.fc2_latent_proj.weight", pre);
            T(SL_LATOUT, sfx, C, io);
        }
        for (int x = 0; x < e->n_experts; x++)
            for (int k = 0; k < 2; k++) {
                snprintf(sfx, sizeof sfx, "%s.experts.%d.%s_proj.weight", pre, x, k ? "down" : "up");
                T(k ? SL_XD : SL_XU, sfx, k ? io : e->expert_ffn_dim, k ? e->expert_ffn_dim : io);
                im->tens[im->n_tens - 1].expert = x;
            }
        if (e->shared_ffn_dim > 0) {
            snprintf(sfx, sizeof sfx, "%s.shared_experts.up_proj.weight", pre);
            T(SL_SU, sfx, e->shared_ffn_dim, C);
            snprintf(sfx, sizeof sfx, "%s.shared_experts.down_proj.weight", pre);
            T(SL_SD, sfx, C, e->shared_ffn_dim);
        }
    }
    if (F > 0) {
        if (both)
            T(SL_FNORM, "mlp_norm.weight", C, 0);
        T(SL_WU, both ? "mlp.up_proj.weight" : "mixer.up_proj.weight", F, C);
        T(SL_WD, both ? "mlp.down_proj.weight" : "mixer.down_proj.weight", C, F);
    }
#undef T
}

/* Lay out every tensor in HF order; the tied lm_head gets no entry. Returns floats. */
static size_t build_table(model_impl *im, const arch *a, int cap)
{
    size_t off = 0;
    int64_t C = a->hidden_size, D = a->head_dim, V = a->vocab_size;
    int hybrid = arch_hybrid(a);
    char nm[96];
    add_tensor(im, cap, &off, SL_EMB, -1, hybrid ? "backbone.embeddings.weight" : "model.embed_tokens.weight", V, C);
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *ly = &a->layers[l];
        int64_t q = (int64_t)ly->n_heads * D, kv = (int64_t)ly->n_kv_heads * D, F = ly->ffn_dim;
        if (hybrid) {
            add_hybrid(im, cap, &off, a, l);
            continue;
        }
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
            if (arch_qk_norm(a)) {
                T(SL_QNORM, "self_attn.q_norm.weight", q, 0);
                T(SL_KNORM, "self_attn.k_norm.weight", kv, 0);
            }
            T(SL_WO, "self_attn.o_proj.weight", C, q);
        }
        if (F > 0) {
            T(SL_FNORM, "post_attention_layernorm.weight", C, 0);
            T(SL_WG, "mlp.gate_proj.weight", F, C);
            T(SL_WU, "mlp.up_proj.weight", F, C);
            T(SL_WD, "mlp.down_proj.weight", C, F);
        }
        if (ly->moe.n_experts > 0)
            add_moe(im, cap, &off, a, l);
#undef T
    }
    add_tensor(im, cap, &off, SL_NORM, -1, hybrid ? "backbone.norm_f.weight" : "model.norm.weight", C, 0);
    if (!a->tie_word_embeddings)
        add_tensor(im, cap, &off, SL_LM, -1, "lm_head.weight", V, C);
    return off;
}

/* Point layer views, embedding, norm and head into `base` (params or grads); xp holds
 * 3 pointers per expert of every layer (the layers' `experts` arrays). */
static void carve(const model_impl *im, const arch *a, float *base, eng_layer *ls, float **xp,
                  float **emb, float **norm, float **lm)
{
    memset(ls, 0, sizeof *ls * (size_t)(a->n_layers ? a->n_layers : 1));
    for (int l = 0, o = 0; l < a->n_layers; l++)
        if (a->layers[l].moe.n_experts) {
            ls[l].experts = xp + o;
            o += 3 * a->layers[l].moe.n_experts;
        }
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
        case SL_QNORM: L->q_norm = p; break;
        case SL_LATIN: L->lat_in = p; break;
        case SL_LATOUT: L->lat_out = p; break;
        case SL_KNORM: L->k_norm = p; break;
        case SL_WO: L->wo = p; break;
        case SL_FNORM: L->ffn_norm = p; break;
        case SL_WG: L->w_gate = p; break;
        case SL_WU: L->w_up = p; break;
        case SL_WD: L->w_down = p; break;
        case SL_ROUTER: L->router = p; break;
        case SL_XG: L->experts[3 * t->expert] = p; break;
        case SL_XU: L->experts[3 * t->expert + 1] = p; break;
        case SL_XD: L->experts[3 * t->expert + 2] = p; break;
        case SL_SG: L->sh_gate = p; break;
        case SL_SU: L->sh_up = p; break;
        case SL_SD: L->sh_down = p; break;
        case SL_SGATE: L->sh_router = p; break;
        case SL_MIN: L->in_proj = p; break;
        case SL_MCONVW: L->conv_w = p; break;
        case SL_MCONVB: L->conv_b = p; break;
        case SL_MDTB: L->dt_bias = p; break;
        case SL_MALOG: L->A_log = p; break;
        case SL_MD: L->Dskip = p; break;
        case SL_MNORM: L->m_norm = p; break;
        case SL_MOUT: L->out_proj = p; break;
        case SL_RBIAS: L->router_bias = p; break;
        }
    }
    if (!*lm)
        *lm = *emb;
}

int eng_rope_inv_freq(const arch *a, float *out)
{
    int D = a->head_dim, half = D / 2;
    double r[512];   /* head_dim <= 1024 (arch_validate) */
    if (half > 512)
        return -1;
    arch_rope_factors(a, r);
    for (int i = 0; i < half; i++)
        out[i] = (float)(1.0 / pow(a->rope_theta, (2.0 * i) / D) / r[i]);
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
        if (t->slot == SL_ANORM || t->slot == SL_FNORM || t->slot == SL_NORM || t->slot == SL_MNORM)
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
    if (!be->ssm_scan_fwd || !be->relu2_fwd)
        for (int l = 0; l < a->n_layers; l++)
            if (a->layers[l].mamba.n_heads || (a->layers[l].ffn_dim && !arch_mlp_gated(a)) || a->layers[l].moe.sigmoid) {
                snprintf(err, errlen, "layers[%d]: the %s backend has no %s kernels in this build", l, be->name,
                         a->layers[l].mamba.n_heads ? "Mamba-2" : "squared-ReLU");
                arch_free(&m->a);
                memset(m, 0, sizeof *m);
                return -1;
            }
    model_impl *im = calloc(1, sizeof *im);
    if (!im)
        goto oom;
    m->impl = im;
    int cap = table_cap(a);
    im->tens = calloc((size_t)cap, sizeof *im->tens);
    m->layers = calloc((size_t)(a->n_layers > 0 ? a->n_layers : 1), sizeof *m->layers);
    m->glayers = calloc((size_t)(a->n_layers > 0 ? a->n_layers : 1), sizeof *m->glayers);
    size_t nx = 1;
    for (int l = 0; l < a->n_layers; l++)
        nx += 3 * (size_t)a->layers[l].moe.n_experts;
    im->xptr = calloc(nx, sizeof *im->xptr);
    im->gxptr = calloc(nx, sizeof *im->gxptr);
    if (!im->tens || !m->layers || !m->glayers || !im->xptr || !im->gxptr)
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
    carve(im, a, m->params, m->layers, im->xptr, &m->tok_emb, &m->final_norm, &m->lm_head);
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
    free(k->expert);
    free(k->g_expert);
    free(k->shared);
    free(k->g_shared);
    free(k->latent);
    free(k->g_latent);
    free(k);
    m->masks = NULL;
}

void eng_model_free(eng_model *m)
{
    if (!m)
        return;
    model_impl *im = m->impl;
    masks_free(m);
    if (m->be && m->params)
        eng_model_const(m, 0);   /* no kept copy may outlive the weights */
    if (m->be) {
        m->be->free(m->be, m->params, m->n_params * F4);
        m->be->free(m->be, m->grads, m->n_params * F4);
        if (im)
            m->be->free(m->be, im->inv_freq, im->inv_freq_bytes);
    }
    if (im) {
        free(im->tens);
        free(im->xptr);
        free(im->gxptr);
    }
    free(im);
    free(m->layers);
    free(m->glayers);
    arch_free(&m->a);
    memset(m, 0, sizeof *m);
}

void eng_model_randomize(eng_model *m, uint64_t seed, float std)
{
    (void)eng_model_randomize_until(m, seed, std, NULL, NULL);
}

int eng_model_randomize_until(eng_model *m, uint64_t seed, float std, int (*stop)(void *ud), void *ud)
{
    /* Matrices and biases ~ N(0, std); norm weights ~ 1 + N(0, std) so that their
     * gradients are exercised by tests (out of memory: nothing drawn, silently). Deterministic in seed: the model's values, in
     * tensor order, are one splitmix64 stream of normals. Drawn in parallel pieces of
     * that stream (each jumps to its first draw), the same bits on any thread count; a
     * served 135M-parameter model took 5 s on one thread, and measurements build one per
     * serving. Copied to the device from this thread only. */
    model_impl *im = m->impl;
    uint64_t s0 = seed * 0x2545F4914F6CDD1Dull + 1, first = 0;   /* the stream; a tensor's first value */
    size_t drawn = 0;
    const size_t block = (size_t)1 << 20, piece = (size_t)1 << 14;
    float *buf = malloc(F4 * block);
    if (!buf)
        return -1;
    for (int i = 0; i < im->n_tens; i++) {
        const tensor_ent *t = &im->tens[i];
        size_t n = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        int norm = t->slot == SL_ANORM || t->slot == SL_FNORM || t->slot == SL_NORM || t->slot == SL_MNORM ||
                   t->slot == SL_QNORM || t->slot == SL_KNORM;
        float base = norm ? 1.0f : 0.0f;
        for (size_t o = 0; o < n; o += block) {
            if (stop && drawn >= block) {   /* asked after each 2^20 values drawn */
                drawn = 0;
                if (stop(ud)) {
                    free(buf);
                    return 1;
                }
            }
            size_t c = n - o < block ? n - o : block;
            long np = (long)((c + piece - 1) / piece);
#pragma omp parallel for schedule(static) if (c > piece)
            for (long p = 0; p < np; p++) {
                size_t j0 = (size_t)p * piece, j1 = j0 + piece < c ? j0 + piece : c;
                uint64_t s = eng_splitmix64_skip(s0, 2 * (first + o + j0));
                for (size_t j = j0; j < j1; j++)
                    buf[j] = base + std * (float)eng_rng_normal(&s);
            }
            m->be->to_device(m->be, m->params + t->off + o, buf, c * F4);
            drawn += c;
        }
        first += n;
    }
    free(buf);
    return 0;
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

/* The tensor hf_name of m when shape/ndim are its own, else NULL with err. */
static const tensor_ent *tensor_of_shape(eng_model *m, const char *hf_name, const int64_t *shape, int ndim, char *err,
                                         size_t errlen)
{
    const tensor_ent *t = find_tensor(m, hf_name);
    if (!t) {
        snprintf(err, errlen, "%s: no such tensor in this architecture", hf_name);
        return NULL;
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
        return NULL;
    }
    return t;
}

static size_t tensor_numel(const tensor_ent *t)
{
    return (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
}

/* 0 when every one of data's n values is finite, else -1 naming the first that is not. */
static int check_finite(const char *hf_name, const float *data, size_t n, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &data[i], sizeof u);
        if ((u & 0x7f800000u) == 0x7f800000u) {   /* exponent all ones: NaN or ±Inf */
            snprintf(err, errlen, "%s: element %zu is %s: a model's weights are finite numbers", hf_name, i,
                     u & 0x007fffffu ? "NaN" : "infinite");
            return -1;
        }
    }
    return 0;
}

int eng_model_set_tensor(eng_model *m, const char *hf_name, const float *data,
                         const int64_t *shape, int ndim, char *err, size_t errlen)
{
    const tensor_ent *t = tensor_of_shape(m, hf_name, shape, ndim, err, errlen);
    if (!t || check_finite(hf_name, data, tensor_numel(t), err, errlen))
        return -1;
    m->be->to_device(m->be, m->params + t->off, data, tensor_numel(t) * F4);
    return 0;
}

int eng_model_fill_tensor(eng_model *m, const char *hf_name, const int64_t *shape, int ndim, eng_fill_fn fill,
                          void *ud, char *err, size_t errlen)
{
    const tensor_ent *t = tensor_of_shape(m, hf_name, shape, ndim, err, errlen);
    if (!t)
        return -1;
    size_t n = tensor_numel(t);
    if (m->be->host_memory) {
        float *dst = m->params + t->off;
        return fill(ud, dst, (int64_t)n, err, errlen) || check_finite(hf_name, dst, n, err, errlen) ? -1 : 0;
    }
    float *buf = malloc((n ? n : 1) * sizeof *buf);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory for a host copy of %zu floats", hf_name, n);
        return -1;
    }
    int rc = fill(ud, buf, (int64_t)n, err, errlen) || check_finite(hf_name, buf, n, err, errlen) ? -1 : 0;
    if (rc == 0)
        m->be->to_device(m->be, m->params + t->off, buf, n * F4);
    free(buf);
    return rc;
}

int eng_arch_tensors(const arch *a, eng_tensor_desc **out, char *err, size_t errlen)
{
    *out = NULL;
    if (arch_validate(a, err, errlen) != 0)
        return -1;
    int cap = table_cap(a);
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

int eng_model_moe_inputs(const eng_model *m, int l, eng_moe_input *out, int cap)
{
    const model_impl *im = m->impl;
    if (l < 0 || l >= m->a.n_layers || !m->a.layers[l].moe.n_experts)
        return 0;
    int latent = m->a.layers[l].moe.latent_dim > 0, n = 0;
    for (int i = 0; i < im->n_tens; i++) {
        const tensor_ent *t = &im->tens[i];
        int kind = t->slot == SL_ROUTER ? ENG_MOE_ROUTER : t->slot == SL_XG && !latent ? ENG_MOE_XGATE
                 : t->slot == SL_XU && !latent ? ENG_MOE_XUP : t->slot == SL_SG ? ENG_MOE_SGATE
                 : t->slot == SL_SU ? ENG_MOE_SUP : t->slot == SL_SGATE ? ENG_MOE_SGATEW
                 : t->slot == SL_LATIN ? ENG_MOE_LATENT : -1;
        if (t->layer != l || kind < 0)
            continue;
        if (n < cap)
            out[n] = (eng_moe_input){.name = t->name, .kind = kind,
                                     .expert = kind == ENG_MOE_XGATE || kind == ENG_MOE_XUP ? t->expert : -1,
                                     .rows = t->shape[0]};
        n++;
    }
    return n;
}

const char *eng_model_expert_down(const eng_model *m, int l, int x)
{
    const model_impl *im = m->impl;
    for (int i = 0; i < im->n_tens; i++)
        if (im->tens[i].layer == l &&
            (x < 0 ? im->tens[i].slot == SL_SD : im->tens[i].slot == SL_XD && im->tens[i].expert == x))
            return im->tens[i].name;
    return NULL;
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
    model_impl *im = m->impl;
    carve(im, &m->a, m->grads, m->glayers, im->gxptr, &m->g_tok_emb, &m->g_final_norm, &m->g_lm_head);
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
        count += (size_t)mixer_heads(&a->layers[l]) + (size_t)arch_layer_units(&a->layers[l]) +
                 (size_t)a->layers[l].moe.n_experts + (size_t)a->layers[l].moe.shared_ffn_dim +
                 (size_t)a->layers[l].moe.latent_dim;
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
    k->expert = calloc(nl, sizeof *k->expert);
    k->g_expert = calloc(nl, sizeof *k->g_expert);
    k->shared = calloc(nl, sizeof *k->shared);
    k->g_shared = calloc(nl, sizeof *k->g_shared);
    k->latent = calloc(nl, sizeof *k->latent);
    k->g_latent = calloc(nl, sizeof *k->g_latent);
    k->block = m->be->alloc(m->be, im->masks_bytes);
    k->grad_block = m->be->alloc(m->be, im->masks_bytes);
    if (!k->head || !k->g_head || !k->ffn || !k->g_ffn || !k->expert || !k->g_expert || !k->shared || !k->g_shared ||
        !k->latent || !k->g_latent || !k->block ||
        !k->grad_block) {
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
        int h = mixer_heads(&a->layers[l]), f = arch_layer_units(&a->layers[l]);
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
    o += (size_t)L;
    for (int l = 0; l < L; l++) {
        int e = a->layers[l].moe.n_experts;
        k->expert[l] = e ? k->block + o : NULL;
        k->g_expert[l] = e ? k->grad_block + o : NULL;
        o += (size_t)e;
    }
    for (int l = 0; l < L; l++) {
        int sh = a->layers[l].moe.shared_ffn_dim;
        k->shared[l] = sh ? k->block + o : NULL;
        k->g_shared[l] = sh ? k->grad_block + o : NULL;
        o += (size_t)sh;
    }
    for (int l = 0; l < L; l++) {
        int lt = a->layers[l].moe.latent_dim;
        k->latent[l] = lt ? k->block + o : NULL;
        k->g_latent[l] = lt ? k->grad_block + o : NULL;
        o += (size_t)lt;
    }
    k->hidden_count = (float)a->hidden_size;
    k->g_hidden_count = 0;
    return 0;
}

void eng_model_const(eng_model *m, int on)
{
    eng_backend_const(m->be, m->params, m->n_params * F4, on);
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
