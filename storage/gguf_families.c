/* storage/gguf_families.c — GGUF parents of the MoE and Mamba-2 families (see gguf_families.h).
 * Keys and tensor names are llama.cpp's (src/llama-arch.cpp, src/models/{qwen2moe,olmoe,mamba2,
 * nemotron-h}.cpp): per-layer arrays of head_count, head_count_kv and feed_forward_length tell
 * Nemotron-H's block kinds apart (a Mamba layer has both of the latter 0, attention the second
 * 0); Mixtral is `llama` with expert_count. llama.cpp never renormalizes qwen2moe's or olmoe's
 * top-k weights and always Mixtral's, so norm_topk follows the architecture.
 */
#include "storage/gguf_families.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { F_MIXTRAL, F_QWEN2MOE, F_OLMOE, F_MAMBA2, F_NEMOTRON };

static int family_of(const char *an)
{
    static const char *const names[] = {"llama", "qwen2moe", "olmoe", "mamba2", "nemotron_h", "nemotron_h_moe"};
    for (int i = 0; i < 6; i++)
        if (!strcmp(an, names[i]))
            return i < 5 ? i : F_NEMOTRON;
    return -1;
}

int gguf_family_known(const char *an) { return family_of(an) > F_MIXTRAL; }

/* Integer key "<an>.<suffix>": def when absent (def < 0: required); in [lo, hi]. */
static int key_int(const gguf_file *g, const char *an, const char *suffix, int64_t def, int64_t lo, int64_t hi,
                   int64_t *v, char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", an, suffix);
    if (gguf_get_int(g, key, v)) {
        if (gguf_find(g, key) >= 0 || def < 0) {
            snprintf(err, errlen, "GGUF: %s: %s", key, gguf_find(g, key) >= 0 ? "not an integer" : "missing");
            return -1;
        }
        *v = def;
    }
    if (*v < lo || *v > hi) {
        snprintf(err, errlen, "GGUF: %s: %lld is out of range [%lld, %lld]", key, (long long)*v, (long long)lo,
                 (long long)hi);
        return -1;
    }
    return 0;
}

static double key_num(const gguf_file *g, const char *an, const char *suffix, double def)
{
    char key[128];
    double v;
    snprintf(key, sizeof key, "%s.%s", an, suffix);
    return gguf_get_float(g, key, &v) ? def : v;
}

/* The Mamba-2 shape from the ssm.* keys. */
static int read_ssm(const gguf_file *g, const char *an, arch_mamba *m, char *err, size_t errlen)
{
    int64_t K, di, S, H, G;
    if (key_int(g, an, "ssm.conv_kernel", -1, 1, 16, &K, err, errlen) ||
        key_int(g, an, "ssm.inner_size", -1, 1, 1 << 20, &di, err, errlen) ||
        key_int(g, an, "ssm.state_size", -1, 1, 1024, &S, err, errlen) ||
        key_int(g, an, "ssm.time_step_rank", -1, 1, 4096, &H, err, errlen) ||
        key_int(g, an, "ssm.group_count", 1, 1, 4096, &G, err, errlen))
        return -1;
    if (di % H || H % G) {
        snprintf(err, errlen, "GGUF: %s.ssm.*: %lld heads must divide the inner size %lld and be divisible by the "
                 "%lld groups", an, (long long)H, (long long)di, (long long)G);
        return -1;
    }
    *m = (arch_mamba){(int)H, (int)(di / H), (int)S, (int)G, (int)K};
    return 0;
}

/* Layer l's shared expert width where the keys do not say: its up (or gate) tensor's rows. */
static int64_t shexp_rows(const gguf_file *g, int l)
{
    char nm[64];
    snprintf(nm, sizeof nm, "blk.%d.ffn_up_shexp.weight", l);
    int i = gguf_tensor_index(g, nm);
    return i >= 0 && g->t[i].n_dims == 2 ? g->t[i].ne[1] : 0;
}

/* Nemotron-H's MoE shape (sigmoid routing) from the expert_* keys; ff: layer l's width. */
static int read_sigmoid_moe(const gguf_file *g, const char *an, int l, int64_t ff, arch_moe *e, char *err,
                            size_t errlen)
{
    int64_t E, k, Fe, Fs, ns, ng, tg, Lt, norm, sh = shexp_rows(g, l);
    if (key_int(g, an, "expert_count", -1, 1, 4096, &E, err, errlen) ||
        key_int(g, an, "expert_used_count", -1, 1, E, &k, err, errlen) ||
        key_int(g, an, "expert_feed_forward_length", ff, 1, 1 << 20, &Fe, err, errlen) ||
        key_int(g, an, "expert_shared_count", sh > 0, 0, 1, &ns, err, errlen) ||
        key_int(g, an, "expert_shared_feed_forward_length", sh, 0, 1 << 20, &Fs, err, errlen) ||
        key_int(g, an, "expert_group_count", 1, 1, E, &ng, err, errlen) ||
        key_int(g, an, "expert_group_used_count", 1, 1, ng, &tg, err, errlen) ||
        key_int(g, an, "moe_latent_size", 0, 0, 65536, &Lt, err, errlen) ||
        key_int(g, an, "expert_weights_norm", 0, 0, 1, &norm, err, errlen))
        return -1;
    double scale = key_num(g, an, "expert_weights_scale", 1.0);
    *e = (arch_moe){.n_experts = (int)E, .top_k = (int)k, .expert_ffn_dim = (int)Fe, .shared_ffn_dim = ns ? (int)Fs : 0,
                    .norm_topk = (int)norm, .sigmoid = 1, .n_group = (int)ng, .topk_group = ng > 1 ? (int)tg : 1,
                    .routed_scale = scale > 0 ? scale : 1.0, .latent_dim = (int)Lt};
    return 0;
}

/* Layer l of a Nemotron-H / Mamba-2 GGUF. */
static int hybrid_layer(const gguf_file *g, const char *an, int fam, int l, int L, const arch_mamba *mb,
                        arch_layer *y, char *err, size_t errlen)
{
    char key[128], nm[96];
    int64_t hq = 0, kv = 0, ff = 0;
    y->source_layer = l;
    if (fam == F_MAMBA2) {
        y->mamba = *mb;
        return 0;
    }
#define LAYER(s, out) (snprintf(key, sizeof key, "%s." s, an), gguf_layer_int(g, key, l, L, out, err, errlen))
    if (LAYER("attention.head_count_kv", &kv) || LAYER("feed_forward_length", &ff))
        return -1;
    if (ff == 0 && kv > 0 && LAYER("attention.head_count", &hq))
        return -1;
#undef LAYER
    if (kv < 0 || kv > 1024 || hq < 0 || hq > 1024 || ff < 0 || ff > (1 << 20)) {
        snprintf(err, errlen, "GGUF: %s layer %d: head counts or feed_forward_length out of range", an, l);
        return -1;
    }
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp.weight", l);
    if (kv == 0 && ff == 0)
        y->mamba = *mb;
    else if (ff == 0)
        y->n_heads = (int)hq, y->n_kv_heads = (int)kv;
    else if (gguf_tensor_index(g, nm) >= 0)
        return read_sigmoid_moe(g, an, l, ff, &y->moe, err, errlen);
    else
        y->ffn_dim = (int)ff;
    return 0;
}

/* Layer l of a softmax-routed MoE GGUF (Mixtral, Qwen2-MoE, OLMoE): every layer attention and
 * an MoE. */
static int moe_layer(const gguf_file *g, const char *an, int fam, int l, int L, arch_layer *y, char *err,
                     size_t errlen)
{
    char key[128];
    int64_t hq, kv, E, k, Fe, S = 0;
#define LAYER(s, out) (snprintf(key, sizeof key, "%s." s, an), gguf_layer_int(g, key, l, L, out, err, errlen))
    if (LAYER("attention.head_count", &hq))
        return -1;
    if (gguf_find(g, (snprintf(key, sizeof key, "%s.attention.head_count_kv", an), key)) < 0)
        kv = hq;
    else if (LAYER("attention.head_count_kv", &kv))
        return -1;
    if (key_int(g, an, "expert_count", -1, 1, 4096, &E, err, errlen) ||
        key_int(g, an, "expert_used_count", -1, 1, E, &k, err, errlen) ||
        (fam == F_QWEN2MOE ? key_int(g, an, "expert_feed_forward_length", -1, 1, 1 << 20, &Fe, err, errlen) ||
                                 key_int(g, an, "expert_shared_feed_forward_length", shexp_rows(g, l), 0, 1 << 20, &S,
                                         err, errlen)
                           : LAYER("feed_forward_length", &Fe)))
        return -1;
#undef LAYER
    if (hq < 1 || hq > 1024 || kv < 1 || kv > hq || hq % kv || Fe < 1 || Fe > (1 << 20)) {
        snprintf(err, errlen, "GGUF: %s layer %d: head counts or expert widths out of range", an, l);
        return -1;
    }
    *y = (arch_layer){.source_layer = l, .n_heads = (int)hq, .n_kv_heads = (int)kv,
                      .moe = {.n_experts = (int)E, .top_k = (int)k, .expert_ffn_dim = (int)Fe, .shared_ffn_dim = (int)S,
                              .norm_topk = fam == F_MIXTRAL}};
    return 0;
}

int gguf_family_arch(const gguf_file *g, const char *an, arch *a, char *err, size_t errlen)
{
    static const char *const fams[] = {"mixtral", "qwen2_moe", "olmoe", "mamba2", "nemotron_h"};
    int fam = family_of(an);
    int64_t L, C, ctx;
    memset(a, 0, sizeof *a);
    if (fam < 0) {
        snprintf(err, errlen, "GGUF: architecture \"%s\" is not supported (%s)", an, GGUF_FAMILIES);
        return -1;
    }
    if (key_int(g, an, "block_count", -1, 1, 1024, &L, err, errlen) ||
        key_int(g, an, "embedding_length", -1, 1, 65536, &C, err, errlen) ||
        key_int(g, an, "context_length", 4096, 1, 1 << 30, &ctx, err, errlen))
        return -1;
    int te = gguf_tensor_index(g, "token_embd.weight");
    if (te < 0 || g->t[te].n_dims != 2 || g->t[te].ne[0] != C || g->t[te].ne[1] < 1 || g->t[te].ne[1] > (1 << 22)) {
        snprintf(err, errlen, "GGUF: token_embd.weight: missing, or not [vocab, %lld]", (long long)C);
        return -1;
    }
    arch_mamba mb = {0};
    if ((fam == F_MAMBA2 || fam == F_NEMOTRON) && read_ssm(g, an, &mb, err, errlen))
        return -1;
    if (arch_init(a, (int)L)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(a->family, sizeof a->family, "%s", fams[fam]);
    a->vocab_size = (int)g->t[te].ne[1];
    a->hidden_size = (int)C;
    a->max_position_embeddings = (int)ctx;
    a->rope_theta = key_num(g, an, "rope.freq_base", 10000.0);
    a->norm_eps = key_num(g, an, "attention.layer_norm_rms_epsilon", key_num(g, an, "attention.layer_norm_epsilon", 1e-5));
    a->tie_word_embeddings = gguf_tensor_index(g, "output.weight") < 0;
    a->attention_bias = fam == F_QWEN2MOE && gguf_tensor_index(g, "blk.0.attn_q.bias") >= 0;
    int hq0 = 0;
    for (int l = 0; l < L; l++) {
        arch_layer *y = &a->layers[l];
        if (fam >= F_MAMBA2 ? hybrid_layer(g, an, fam, l, (int)L, &mb, y, err, errlen)
                            : moe_layer(g, an, fam, l, (int)L, y, err, errlen))
            goto fail;
        y->source_layer = l;
        if (!hq0)
            hq0 = y->n_heads;
    }
    int64_t D;
    if (key_int(g, an, "attention.key_length", hq0 ? C / hq0 : 64, 2, 1024, &D, err, errlen))
        goto fail;
    a->head_dim = (int)(D % 2 ? D + 1 : D);   /* odd only in a model without attention (unused there) */
    if (arch_validate(a, err, errlen))
        goto fail;
    return 0;
fail:
    arch_free(a);
    return -1;
}

/* ---------- tensors ---------- */

enum { PLAIN, FLAT, NEG_EXP, STACK, ROW2 };   /* how a GGUF tensor becomes HF tensors */

typedef struct {
    const char *gg, *hf;
    int how;
} name_map;

static const name_map HYBRID_NAMES[] = {
    {"attn_norm.weight", "norm.weight", PLAIN},
    {"ssm_in.weight", "mixer.in_proj.weight", PLAIN},
    {"ssm_conv1d.weight", "mixer.conv1d.weight", PLAIN},
    {"ssm_conv1d.bias", "mixer.conv1d.bias", PLAIN},
    {"ssm_dt.bias", "mixer.dt_bias", PLAIN},
    {"ssm_a", "mixer.A_log", NEG_EXP},
    {"ssm_d", "mixer.D", FLAT},
    {"ssm_norm.weight", "mixer.norm.weight", FLAT},
    {"ssm_out.weight", "mixer.out_proj.weight", PLAIN},
    {"attn_q.weight", "mixer.q_proj.weight", PLAIN},
    {"attn_k.weight", "mixer.k_proj.weight", PLAIN},
    {"attn_v.weight", "mixer.v_proj.weight", PLAIN},
    {"attn_output.weight", "mixer.o_proj.weight", PLAIN},
    {"ffn_up.weight", "mixer.up_proj.weight", PLAIN},
    {"ffn_down.weight", "mixer.down_proj.weight", PLAIN},
    {"ffn_gate_inp.weight", "mixer.gate.weight", PLAIN},
    {"exp_probs_b.bias", "mixer.gate.e_score_correction_bias", PLAIN},
    {"ffn_latent_down.weight", "mixer.fc1_latent_proj.weight", PLAIN},
    {"ffn_latent_up.weight", "mixer.fc2_latent_proj.weight", PLAIN},
    {"ffn_up_exps.weight", "mixer.experts.%d.up_proj.weight", STACK},
    {"ffn_down_exps.weight", "mixer.experts.%d.down_proj.weight", STACK},
    {"ffn_up_shexp.weight", "mixer.shared_experts.up_proj.weight", PLAIN},
    {"ffn_down_shexp.weight", "mixer.shared_experts.down_proj.weight", PLAIN},
};

static const name_map MOE_NAMES[] = {   /* qwen2moe, olmoe: NeoX RoPE, so nothing permuted */
    {"attn_norm.weight", "input_layernorm.weight", PLAIN},
    {"attn_q.weight", "self_attn.q_proj.weight", PLAIN},
    {"attn_k.weight", "self_attn.k_proj.weight", PLAIN},
    {"attn_v.weight", "self_attn.v_proj.weight", PLAIN},
    {"attn_q.bias", "self_attn.q_proj.bias", PLAIN},
    {"attn_k.bias", "self_attn.k_proj.bias", PLAIN},
    {"attn_v.bias", "self_attn.v_proj.bias", PLAIN},
    {"attn_q_norm.weight", "self_attn.q_norm.weight", PLAIN},
    {"attn_k_norm.weight", "self_attn.k_norm.weight", PLAIN},
    {"attn_output.weight", "self_attn.o_proj.weight", PLAIN},
    {"ffn_norm.weight", "post_attention_layernorm.weight", PLAIN},
    {"ffn_gate_inp.weight", "mlp.gate.weight", PLAIN},
    {"ffn_gate_exps.weight", "mlp.experts.%d.gate_proj.weight", STACK},
    {"ffn_up_exps.weight", "mlp.experts.%d.up_proj.weight", STACK},
    {"ffn_down_exps.weight", "mlp.experts.%d.down_proj.weight", STACK},
    {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", ROW2},
    {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight", PLAIN},
    {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight", PLAIN},
    {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight", PLAIN},
};

static const name_map MIXTRAL_NAMES[] = {   /* the rest is llama's (storage/gguf.c) */
    {"ffn_gate_inp.weight", "block_sparse_moe.gate.weight", PLAIN},
    {"ffn_gate_exps.weight", "block_sparse_moe.experts.%d.w1.weight", STACK},
    {"ffn_up_exps.weight", "block_sparse_moe.experts.%d.w3.weight", STACK},
    {"ffn_down_exps.weight", "block_sparse_moe.experts.%d.w2.weight", STACK},
};

/* The parts of GGUF tensor t as map m says, layer l under prefix pre ("" for globals). */
static int make_parts(const gguf_tensor *t, const name_map *m, const char *pre, int l, gguf_hf_part **parts,
                      int *n_parts, char *err, size_t errlen)
{
    int n = m->how == STACK ? (int)t->ne[2] : 1;
    if ((m->how == STACK) != (t->n_dims == 3) || n < 1 || n > 4096 || t->n_dims > 3) {
        snprintf(err, errlen, "GGUF: %s: %d dimensions, which %s does not have", t->name, t->n_dims, m->hf);
        return -1;
    }
    gguf_hf_part *p = calloc((size_t)n, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int e = 0; e < n; e++) {
        char leaf[96];
        if (m->how == STACK)
            snprintf(leaf, sizeof leaf, m->hf, e);
        else
            snprintf(leaf, sizeof leaf, "%s", m->hf);
        if (l >= 0)
            snprintf(p[e].name, sizeof p[e].name, pre, l);
        size_t k = strlen(p[e].name);
        snprintf(p[e].name + k, sizeof p[e].name - k, "%s", leaf);
        p[e].sub = e;
        p[e].n_sub = n;
        p[e].neg_exp = m->how == NEG_EXP;
        if (m->how == FLAT || m->how == NEG_EXP || t->n_dims == 1) {
            p[e].ndim = m->how == ROW2 ? 2 : 1;
            p[e].shape[0] = m->how == ROW2 ? 1 : t->numel;
            p[e].shape[1] = m->how == ROW2 ? t->numel : 0;
        } else {
            p[e].ndim = 2;
            p[e].shape[0] = t->ne[1];
            p[e].shape[1] = t->ne[0];
        }
    }
    *parts = p;
    *n_parts = n;
    return 0;
}

int gguf_hf_parts(const gguf_file *g, const arch *a, int i, gguf_hf_part **parts, int *n_parts, char *err,
                  size_t errlen)
{
    *parts = NULL;
    *n_parts = 0;
    if (i < 0 || i >= g->n_tensors)
        return -1;
    const gguf_tensor *t = &g->t[i];
    int hybrid = arch_hybrid(a), mixtral = !strcmp(a->family, "mixtral"), llama = !strcmp(a->family, "llama");
    int l = -1, n = 0;
    if (!hybrid && !llama && sscanf(t->name, "blk.%d.%n", &l, &n) == 1 && n > 0 && l >= 0 && l < a->n_layers) {
        const name_map *tab = mixtral ? MIXTRAL_NAMES : MOE_NAMES;
        size_t nt = mixtral ? sizeof MIXTRAL_NAMES / sizeof *MIXTRAL_NAMES : sizeof MOE_NAMES / sizeof *MOE_NAMES;
        for (size_t k = 0; k < nt; k++)
            if (!strcmp(t->name + n, tab[k].gg))
                return make_parts(t, &tab[k], "model.layers.%d.", l, parts, n_parts, err, errlen);
    }
    if (!hybrid) {   /* llama's names: Mixtral's attention, every family's globals */
        gguf_hf_part *p = calloc(1, sizeof *p);
        if (!p) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        int rc = gguf_hf_tensor(g, a, i, p->name, sizeof p->name, p->shape, &p->ndim, &p->permute_heads);
        if (rc == 0 && !mixtral && !llama)
            p->permute_heads = 0;   /* qwen2moe, olmoe: NeoX RoPE */
        p->n_sub = 1;
        if (rc != 0) {
            free(p);
            if (rc < 0)
                snprintf(err, errlen, "GGUF: tensor %s is not part of a %s model", t->name, a->family);
            return rc;
        }
        *parts = p;
        *n_parts = 1;
        return 0;
    }
    static const name_map globals[] = {{"token_embd.weight", "backbone.embeddings.weight", PLAIN},
                                       {"output_norm.weight", "backbone.norm_f.weight", PLAIN},
                                       {"output.weight", "lm_head.weight", PLAIN}};
    for (size_t k = 0; k < 3; k++)
        if (!strcmp(t->name, globals[k].gg))
            return make_parts(t, &globals[k], "", -1, parts, n_parts, err, errlen);
    if (sscanf(t->name, "blk.%d.%n", &l, &n) == 1 && n > 0 && l >= 0 && l < a->n_layers)
        for (size_t k = 0; k < sizeof HYBRID_NAMES / sizeof *HYBRID_NAMES; k++)
            if (!strcmp(t->name + n, HYBRID_NAMES[k].gg))
                return make_parts(t, &HYBRID_NAMES[k], "backbone.layers.%d.", l, parts, n_parts, err, errlen);
    snprintf(err, errlen, "GGUF: tensor %s is not part of a %s model", t->name, a->family);
    return -1;
}
