/* storage/export_gguf_moe.c — GGUF of the mixture-of-experts families, as llama.cpp reads
 * them: Mixtral as its `llama` architecture with experts (interleaved RoPE: q/k rows
 * permuted), Qwen2-MoE as `qwen2moe` (NeoX RoPE, q/k/v biases, a shared expert with its
 * sigmoid gate), OLMoE as `olmoe` (NeoX RoPE, attn_q_norm / attn_k_norm). Each layer's experts are stacked into 3-D tensors ffn_{gate,up,down}_exps
 * [E][F][C] (GGUF ne = {C, F, E}; down {F, C, E}), the router is ffn_gate_inp. llama.cpp
 * holds one expert count, top-k and width for every layer, no dense layer in these
 * architectures, and renormalizes the top-k weights for `llama` and never for `qwen2moe` or `olmoe`:
 * other archs are refused with the reason.
 */
#include "storage/export_gguf_moe.h"

#include "storage/export_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/gguf_write.h"

int exp_gguf_moe_arch(const arch *a, char *arch_name, size_t cap, char *err, size_t errlen)
{
    int mixtral = !strcmp(a->family, "mixtral"), olmoe = !strcmp(a->family, "olmoe");
    if (a->n_layers == 0 || !a->layers[0].moe.n_experts) {
        snprintf(err, errlen, "GGUF export: llama.cpp's %s needs every layer to be a mixture of experts",
                 mixtral ? "llama (Mixtral)" : olmoe ? "olmoe" : "qwen2moe");
        return -1;
    }
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *y = &a->layers[l], *f = &a->layers[0];
        if (!y->n_heads || y->n_heads != f->n_heads || y->n_kv_heads != f->n_kv_heads || y->ffn_dim ||
            memcmp(&y->moe, &f->moe, sizeof y->moe)) {
            snprintf(err, errlen, "GGUF export: layer %d differs from layer 0 (heads, experts, widths or a removed "
                     "part); llama.cpp holds one shape for every layer of an MoE model (export \"hf\" instead)", l);
            return -1;
        }
    }
    if (a->rope_scaling.type != ROPE_SCALING_NONE) {
        snprintf(err, errlen, "GGUF export: RoPE scaling of MoE families is not written in this build");
        return -1;
    }
    if (mixtral) {
        snprintf(arch_name, cap, "llama");
        return 0;
    }
    const arch_moe *e = &a->layers[0].moe;
    if (e->norm_topk) {
        snprintf(err, errlen, "GGUF export: llama.cpp's %s never renormalizes the top-k weights, and this "
                 "model does (norm_topk_prob)", olmoe ? "olmoe" : "qwen2moe");
        return -1;
    }
    if (olmoe) {   /* src/models/olmoe.cpp: q, k_norm and o_proj sized by the hidden size */
        if (a->layers[0].n_heads * a->head_dim != a->hidden_size || a->layers[0].n_kv_heads != a->layers[0].n_heads) {
            snprintf(err, errlen, "GGUF export: llama.cpp's olmoe needs heads x head_dim = hidden size and as many "
                     "KV heads as query heads (it sizes q, k_norm and o_proj by the hidden size)");
            return -1;
        }
        snprintf(arch_name, cap, "olmoe");
        return 0;
    }
    if (!e->shared_ffn_dim) {
        snprintf(err, errlen, "GGUF export: llama.cpp's qwen2moe needs a shared expert");
        return -1;
    }
    if (a->layers[0].n_heads * a->head_dim != a->hidden_size) {
        snprintf(err, errlen, "GGUF export: llama.cpp's qwen2moe needs heads x head_dim = hidden size");
        return -1;
    }
    snprintf(arch_name, cap, "qwen2moe");
    return 0;
}

int exp_gguf_moe_keys(ggw *w, const arch *a, const char *an)
{
    char key[128];
    const arch_moe *e = &a->layers[0].moe;
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", an, suffix), key)
    int bad = 0;
    bad |= ggw_kv_u32(w, K("feed_forward_length"), (uint32_t)e->expert_ffn_dim);
    bad |= ggw_kv_u32(w, K("attention.head_count"), (uint32_t)a->layers[0].n_heads);
    bad |= ggw_kv_u32(w, K("attention.head_count_kv"), (uint32_t)a->layers[0].n_kv_heads);
    bad |= ggw_kv_u32(w, K("expert_count"), (uint32_t)e->n_experts);
    bad |= ggw_kv_u32(w, K("expert_used_count"), (uint32_t)e->top_k);
    if (!strcmp(an, "qwen2moe")) {
        bad |= ggw_kv_u32(w, K("expert_feed_forward_length"), (uint32_t)e->expert_ffn_dim);
        bad |= ggw_kv_u32(w, K("expert_shared_feed_forward_length"), (uint32_t)e->shared_ffn_dim);
    }
#undef K
    return bad;
}

void exp_gtensor_add(exp_gtensor *t, int *n, const char *name, int64_t n0, int64_t n1, int64_t n2, const char *hf,
                     int stack)
{
    exp_gtensor *x = &t[(*n)++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    snprintf(x->hf, sizeof x->hf, "%s", hf);
    x->ne[0] = n0;
    x->ne[1] = n1;
    x->ne[2] = n2;
    x->ndim = n2 ? 3 : n1 ? 2 : 1;
    x->stack = stack;
}

/* The tensors in llama.cpp's names, in order. Returns the count written into t. */
static int moe_tensors(const arch *a, const char *an, exp_gtensor *t)
{
    int qwen = !strcmp(an, "qwen2moe"), olmoe = !strcmp(an, "olmoe"), n = 0;
    const arch_layer *y = &a->layers[0];
    int64_t C = a->hidden_size, V = a->vocab_size, D = a->head_dim, F = y->moe.expert_ffn_dim,
            S = y->moe.shared_ffn_dim, E = y->moe.n_experts, Q = (int64_t)y->n_heads * D,
            KVD = (int64_t)y->n_kv_heads * D;
    char g[96], h[128];
    exp_gtensor_add(t, &n, "token_embd.weight", C, V, 0, "model.embed_tokens.weight", 0);
    exp_gtensor_add(t, &n, "output_norm.weight", C, 0, 0, "model.norm.weight", 0);
    /* qwen2moe and olmoe need output.weight even when tied; llama falls back to token_embd */
    if (!a->tie_word_embeddings || qwen || olmoe)
        exp_gtensor_add(t, &n, "output.weight", C, V, 0,
                        a->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", 0);
    const char *moe = qwen || olmoe ? "mlp" : "block_sparse_moe";
    for (int l = 0; l < a->n_layers; l++) {
#define T(gg, n0, n1, n2, hh, stack, perm) do { snprintf(g, sizeof g, "blk.%d.%s", l, gg); \
        snprintf(h, sizeof h, "model.layers.%d.%s", l, hh); exp_gtensor_add(t, &n, g, n0, n1, n2, h, stack); \
        t[n - 1].permute = perm; } while (0)
        T("attn_norm.weight", C, 0, 0, "input_layernorm.weight", 0, 0);
        T("attn_q.weight", C, Q, 0, "self_attn.q_proj.weight", 0, qwen || olmoe ? 0 : y->n_heads);
        T("attn_k.weight", C, KVD, 0, "self_attn.k_proj.weight", 0, qwen || olmoe ? 0 : y->n_kv_heads);
        T("attn_v.weight", C, KVD, 0, "self_attn.v_proj.weight", 0, 0);
        if (a->attention_bias) {
            T("attn_q.bias", Q, 0, 0, "self_attn.q_proj.bias", 0, 0);
            T("attn_k.bias", KVD, 0, 0, "self_attn.k_proj.bias", 0, 0);
            T("attn_v.bias", KVD, 0, 0, "self_attn.v_proj.bias", 0, 0);
        }
        if (olmoe) {
            T("attn_q_norm.weight", Q, 0, 0, "self_attn.q_norm.weight", 0, 0);
            T("attn_k_norm.weight", KVD, 0, 0, "self_attn.k_norm.weight", 0, 0);
        }
        T("attn_output.weight", Q, C, 0, "self_attn.o_proj.weight", 0, 0);
        T("ffn_norm.weight", C, 0, 0, "post_attention_layernorm.weight", 0, 0);
        char r[64];
        snprintf(r, sizeof r, "%s.gate.weight", moe);
        T("ffn_gate_inp.weight", C, E, 0, r, 0, 0);
        t[n - 1].f32 = 1;   /* the router stays F32, as llama.cpp's converter and quantizer keep it */
        static const char *const mx[3] = {"w1", "w3", "w2"}, *const qw[3] = {"gate_proj", "up_proj", "down_proj"};
        static const char *const gn[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
        for (int k = 0; k < 3; k++) {
            snprintf(r, sizeof r, "%s.experts.%%d.%s.weight", moe, qwen || olmoe ? qw[k] : mx[k]);
            T(gn[k], k == 2 ? F : C, k == 2 ? C : F, E, r, 1, 0);
        }
        if (qwen) {
            T("ffn_gate_inp_shexp.weight", C, 0, 0, "mlp.shared_expert_gate.weight", 0, 0);
            T("ffn_gate_shexp.weight", C, S, 0, "mlp.shared_expert.gate_proj.weight", 0, 0);
            T("ffn_up_shexp.weight", C, S, 0, "mlp.shared_expert.up_proj.weight", 0, 0);
            T("ffn_down_shexp.weight", S, C, 0, "mlp.shared_expert.down_proj.weight", 0, 0);
        }
#undef T
    }
    return n;
}

static int64_t gt_numel(const exp_gtensor *x)
{
    return x->ne[0] * (x->ndim > 1 ? x->ne[1] : 1) * (x->ndim > 2 ? x->ne[2] : 1);
}

/* The values of tensor x (NEW buffer), read from m and transformed. NULL with err. */
static float *gt_fetch(const eng_model *m, const exp_gtensor *x, char *err, size_t errlen)
{
    int64_t count = x->stack ? x->ne[2] : 1, per = gt_numel(x) / count;
    float *d = malloc((size_t)gt_numel(x) * sizeof *d);
    if (!d) {
        snprintf(err, errlen, "GGUF export: out of memory");
        return NULL;
    }
    for (int64_t e = 0; e < count; e++) {
        char hf[160];
        if (x->stack)
            snprintf(hf, sizeof hf, x->hf, (int)e);
        else
            snprintf(hf, sizeof hf, "%s", x->hf);
        if (eng_model_get_tensor(m, hf, d + e * per, per) != per) {
            snprintf(err, errlen, "GGUF export: tensor %s is missing or of another size", hf);
            free(d);
            return NULL;
        }
    }
    if (x->permute && exp_permute_rows(d, x->permute, x->ne[1], x->ne[0]) < 0) {
        snprintf(err, errlen, "GGUF export: cannot permute %s for %d heads", x->hf, x->permute);
        free(d);
        return NULL;
    }
    for (int64_t i = 0; x->neg_exp && i < gt_numel(x); i++)
        d[i] = -expf(d[i]);
    return d;
}

int exp_gguf_write_list(ggw *w, const eng_model *m, const exp_gtensor *t, int n, int wt, const char *path, char *err,
                        size_t errlen)
{
    for (int i = 0; i < n; i++) {
        ggw_type tt = t[i].ndim == 1 || t[i].f32 ? GGW_F32 : (ggw_type)wt;
        if (tt == GGW_Q8_0 && t[i].ne[0] % GGW_QK8_0)
            tt = GGW_F16;
        if (ggw_tensor(w, t[i].name, t[i].ne, t[i].ndim, tt, err, errlen) < 0)
            return -1;
    }
    if (ggw_begin(w, path, err, errlen) < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        float *d = gt_fetch(m, &t[i], err, errlen);
        int wr = d ? ggw_write_tensor(w, d, gt_numel(&t[i]), err, errlen) : -1;
        free(d);
        if (wr < 0)
            return -1;
    }
    return ggw_finish(w, err, errlen);
}

int exp_gguf_moe_tensors(ggw *w, const eng_model *m, const char *an, int wt, const char *path, char *err,
                         size_t errlen)
{
    const arch *a = &m->a;
    exp_gtensor *t = calloc((size_t)(3 + 17 * a->n_layers), sizeof *t);
    if (!t) {
        snprintf(err, errlen, "GGUF export: out of memory");
        return -1;
    }
    int rc = exp_gguf_write_list(w, m, t, moe_tensors(a, an, t), wt, path, err, errlen);
    free(t);
    return rc;
}
