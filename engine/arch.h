/* engine/arch.h — the architecture descriptor every part of AutoCompress shares.
 *
 * An arch is a parent or candidate model's shape: global dimensions plus one config
 * per layer (DESIGN.md §1). Layers may differ in every field. A removed attention has
 * n_heads == 0, a removed MLP ffn_dim == 0; a layer with both removed is simply absent
 * from `layers` (a derived arch names the parent layer each layer came from).
 * The JSON form (DESIGN.md §10) lives in storage/archjson.{c,h}; this file knows no JSON.
 */
#ifndef AC_ENGINE_ARCH_H
#define AC_ENGINE_ARCH_H

#include <stddef.h>
#include <stdint.h>

#define ARCH_FAMILY_MAX 32

/* Mixture-of-experts MLP (families "mixtral", "qwen2_moe", "olmoe", "nemotron_h"); n_experts == 0:
 * absent. A layer holds either a dense MLP (ffn_dim > 0) or an MoE, never both. The router is
 * a linear map to n_experts logits.
 * Softmax routing (sigmoid == 0: Mixtral, Qwen2-MoE): softmax over all experts, the top_k
 * kept; norm_topk = 1 renormalizes the kept probabilities to sum 1 (Mixtral always; Qwen2-MoE's
 * norm_topk_prob). Experts are SwiGLU MLPs of width expert_ffn_dim; shared_ffn_dim > 0
 * (qwen2_moe): a shared SwiGLU expert every token runs, scaled by sigmoid of its own one-row
 * gate.
 * Sigmoid routing (sigmoid == 1: Nemotron-H): scores sigmoid(logits); the choice reads the
 * scores plus a per-expert correction bias (a tensor of the layer), in n_group groups of whose
 * topk_group best (by the sum of each group's two best biased scores) the top_k experts are
 * taken; the weights are the unbiased scores, normalized to sum 1 when norm_topk, times
 * routed_scale. Experts are squared-ReLU MLPs (up, down); shared_ffn_dim > 0: a shared one
 * every token runs, added unweighted. latent_dim > 0 (Nemotron-H's LatentMoE, Nemotron 3
 * Super): the routed experts run in a latent space, the block's input projected to it by
 * fc1_latent_proj [latent, C] and their weighted sum back by fc2_latent_proj [C, latent]; the
 * router and the shared expert read the full width.
 * top_k <= n_experts. */
typedef struct {
    int n_experts, top_k, expert_ffn_dim, shared_ffn_dim, norm_topk;
    int sigmoid, n_group, topk_group;   /* 0, 0, 0 with softmax routing */
    double routed_scale;                /* 0 with softmax routing */
    int latent_dim;                     /* 0: the experts read and write the hidden size */
} arch_moe;

/* The width the routed experts read and write: the latent, else the hidden size C. */
static inline int arch_moe_io(const arch_moe *e, int C) { return e->latent_dim ? e->latent_dim : C; }

/* Mamba-2 mixer (families "nemotron_h", "mamba2"); n_heads == 0: absent. It takes the attention's
 * place in its layer (a layer holds attention or a Mamba mixer, not both). d_inner =
 * n_heads*head_dim; in_proj maps hidden to z (d_inner), xBC (conv_dim = d_inner +
 * 2*n_groups*d_state) and dt (n_heads); a depthwise causal conv of conv_kernel taps (with
 * bias) and SiLU run over xBC; head h reads B and C of group h / (n_heads/n_groups);
 * the SSM state of a head is head_dim x d_state. */
typedef struct {
    int n_heads, head_dim, d_state, n_groups, conv_kernel;
} arch_mamba;

/* d_inner and conv_dim of a Mamba mixer (0 when absent). */
static inline int arch_mamba_inner(const arch_mamba *m) { return m->n_heads * m->head_dim; }
static inline int arch_mamba_conv_dim(const arch_mamba *m)
{
    return m->n_heads ? m->n_heads * m->head_dim + 2 * m->n_groups * m->d_state : 0;
}
/* Rows of its in_proj: z (d_inner), xBC (conv_dim), dt (one per head). */
static inline int arch_mamba_in_rows(const arch_mamba *m)
{
    return arch_mamba_inner(m) + arch_mamba_conv_dim(m) + m->n_heads;
}

typedef struct {
    int source_layer;   /* index of the parent layer this layer came from */
    int n_heads;        /* query heads; 0 = attention removed */
    int n_kv_heads;     /* key/value heads; n_heads % n_kv_heads == 0 */
    int ffn_dim;        /* SwiGLU intermediate width; 0 = MLP removed (or an MoE) */
    arch_moe moe;       /* MoE families; zeroed for llama */
    arch_mamba mamba;   /* later families; zeroed for llama */
} arch_layer;

typedef enum { ROPE_SCALING_NONE = 0, ROPE_SCALING_LINEAR, ROPE_SCALING_LLAMA3, ROPE_SCALING_DYNAMIC } arch_rope_scaling_type;

typedef struct {
    arch_rope_scaling_type type;
    double factor;
    double low_freq_factor, high_freq_factor;       /* llama3 */
    int original_max_position_embeddings;           /* llama3 */
} arch_rope_scaling;

typedef struct {
    char family[ARCH_FAMILY_MAX];   /* "llama" (Llama 2/3, Mistral, Qwen2, SmolLM), "mixtral",
                                       "qwen2_moe", "olmoe" (OLMoE: softmax MoE, q and k RMS-normed
                                       over their whole rows), "nemotron_h" (hybrid Mamba-2: attention without
                                       RoPE, squared-ReLU MLPs of up and down only; a checkpoint's
                                       layer holds one block, the engine's may hold a mixer and an
                                       MLP, as calibration's timing models do), "mamba2" (Mamba-2 mixers
                                       only, each a layer: Mamba2ForCausalLM, state-spaces/mamba2) */
    int vocab_size;
    int hidden_size;
    int head_dim;
    int max_position_embeddings;
    double rope_theta;
    arch_rope_scaling rope_scaling;
    double norm_eps;
    int tie_word_embeddings;        /* 1: lm_head shares the embedding matrix */
    int attention_bias;             /* 1: q/k/v projections carry a bias (Qwen2) */
    int n_layers;
    arch_layer *layers;             /* n_layers entries, owned by the arch */
} arch;

/* Allocate `n_layers` zeroed layers; globals zeroed. Returns 0, or -1 on OOM. */
int arch_init(arch *a, int n_layers);

/* Initialize `a` as a named parent shape with `n_layers` layers (<= 0: the preset's own
 * depth), every layer identical and layers[l].source_layer = l. Known names:
 *   "smollm2-135m": llama, hidden 576, 30 layers, 9 heads / 3 KV heads, head_dim 64,
 *                   FFN 1536, vocab 49152, tied, rope_theta 100000, norm_eps 1e-5,
 *                   max_position_embeddings 8192.
 * Returns 0 (a owns its layers), or -1 for an unknown name or OOM (a zeroed, owns nothing). */
int arch_preset(arch *a, const char *name, int n_layers);

/* Free the layers; the struct may be reused after arch_init. Safe on a zeroed arch. */
void arch_free(arch *a);

/* Deep copy src into dst (dst must not own memory). Returns 0, or -1 on OOM. */
int arch_copy(arch *dst, const arch *src);

/* 1 if the shapes are identical (every global and per-layer field), else 0. */
int arch_equal(const arch *a, const arch *b);

/* 1 when two RoPE scalings are the same: type and original context exactly, the factors
 * within rel of each other (0: exactly). */
int arch_rope_scaling_same(const arch_rope_scaling *a, const arch_rope_scaling *b, double rel);

/* 1 when a and b rotate alike: the same scaling type, head_dim and rope_theta (within rel)
 * and, for llama3, the same factor per frequency (arch_rope_factors, within rel), so that a
 * scaling fitted back from a GGUF's rope_freqs (arch_rope_fit_llama3) is its HF config's;
 * for the others the same fields (arch_rope_scaling_same). */
int arch_rope_same(const arch *a, const arch *b, double rel);

/* Check internal consistency (positive dims, head divisibility, ...).
 * Returns 0, or -1 with a message naming the field ("layers[3].n_kv_heads: ...") in err. */
int arch_validate(const arch *a, char *err, size_t errlen);

/* Number of parameters, embedding and (untied) LM head included. */
int64_t arch_params(const arch *a);

/* 1 when the layer has an MLP: dense (ffn_dim > 0) or mixture of experts. */
static inline int arch_layer_has_mlp(const arch_layer *l) { return l->ffn_dim > 0 || l->moe.n_experts > 0; }
/* The MLP's unit width: a dense FFN's, else an MoE's routed experts' (0 without an MLP). */
static inline int arch_layer_units(const arch_layer *l)
{
    return l->ffn_dim > 0 ? l->ffn_dim : l->moe.n_experts > 0 ? l->moe.expert_ffn_dim : 0;
}

/* 1 when the layer has a token mixer: attention or a Mamba-2 mixer. */
static inline int arch_layer_has_mixer(const arch_layer *l) { return l->n_heads > 0 || l->mamba.n_heads > 0; }

/* Family traits. arch_mlp_gated: dense MLPs are SwiGLU (gate, up, down) rather than
 * squared ReLU (up, down; nemotron_h). arch_rope: attention rotates q and k (nemotron_h's
 * does not: its Mamba layers carry position). */
int arch_mlp_gated(const arch *a);
int arch_rope(const arch *a);

/* RoPE's scaling as one factor per frequency (head_dim/2 of them): frequency i turns at
 * rope_theta^(-2i/head_dim) / r[i] (llama.cpp's rope_freqs.weight holds these r). Linear
 * scaling: every r is its factor; llama3 (HF transformers' formula): the factor below the
 * low-frequency wavelength, 1 above the high one, smoothed between; none and dynamic: 1. */
void arch_rope_factors(const arch *a, double *r);

/* The llama3 scaling that gives the factors r[0..head_dim/2) (as read from a GGUF's
 * rope_freqs.weight) into a->rope_scaling. The factors depend on original_max_position_
 * embeddings only through its ratios to the low and high frequency factors, so it is
 * set to 8192 (Llama 3's) and those two follow. Every r at 1 leaves no scaling. 0, or -1
 * with err when no llama3 scaling gives these factors (within 1e-5 relative). */
int arch_rope_fit_llama3(arch *a, const float *r, char *err, size_t errlen);

/* 1 when attention RMS-normalizes its q and k projections over their whole rows (Hq*D and
 * Hkv*D wide, one weight per channel) before RoPE: OLMoE's q_norm and k_norm. */
int arch_qk_norm(const arch *a);

/* 1 for the softmax-routed MoE families (mixtral, qwen2_moe, olmoe). */
int arch_moe_family(const arch *a);

/* 1 for the Mamba-2 families (nemotron_h, mamba2): a checkpoint's layer is one pre-norm block
 * (backbone.layers.N.norm, .mixer), where the parent has its blocks. */
int arch_hybrid(const arch *a);

/* The first MoE layer's shape (NULL: no layer is a mixture of experts); *most (may be NULL)
 * gets the most experts of any layer. */
const arch_moe *arch_first_moe(const arch *a, int *most);

/* The first Mamba layer's shape (NULL: none); *most (may be NULL) gets the most Mamba heads
 * of any layer. */
const arch_mamba *arch_first_mamba(const arch *a, int *most);

/* 1 for grouped sigmoid routing: the experts sit in n_group groups, a pruned layer keeps as
 * many in each. */
static inline int arch_moe_grouped(const arch_moe *e) { return e->sigmoid && e->n_group > 1; }

/* 1 when a layer shaped e may keep n of its experts: 1 <= n <= n_experts and, with grouped
 * routing, as many per group, two at least where groups are dropped (a group's score is the
 * sum of its two best, as HF computes it). */
static inline int arch_moe_count_ok(const arch_moe *e, int n)
{
    if (n < 1 || n > e->n_experts)
        return 0;
    if (!arch_moe_grouped(e))
        return 1;
    return n % e->n_group == 0 && (e->topk_group >= e->n_group || n / e->n_group >= 2);
}

/* Shape e with n experts, top-k capped at n (pruning keeps the first n; routing cannot pick
 * more experts than there are; with groups, than the kept groups hold). */
arch_moe arch_moe_keep(const arch_moe *e, int n);

/* 1 if every layer has the same heads, kv heads, ffn_dim and MoE shape and none is removed. */
int arch_is_uniform(const arch *a);

/* Compact per-layer string, e.g. "h576 | a9/3 f1536 | a- f768 | ...". Writes at most
 * len bytes (NUL included); returns the length it needed. */
size_t arch_summary(const arch *a, char *buf, size_t len);

#endif
