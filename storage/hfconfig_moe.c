/* storage/hfconfig_moe.c — config.json of the mixture-of-experts families, read and written:
 * MixtralForCausalLM (every layer an MoE of num_local_experts SwiGLU experts of width
 * intermediate_size, top num_experts_per_tok renormalized) and Qwen2MoeForCausalLM (MoE
 * layers of moe_intermediate_size experts plus a shared expert of
 * shared_expert_intermediate_size; norm_topk_prob; dense layers of intermediate_size where
 * mlp_only_layers or decoder_sparse_step say; q/k/v bias) and OlmoeForCausalLM (every layer an
 * MoE of num_experts experts of intermediate_size, norm_topk_prob, no shared expert; q and k
 * RMS-normed over their rows; clip_qkv refused). Defaults are transformers' MixtralConfig /
 * Qwen2MoeConfig / OlmoeConfig ones. A pruned arch whose layers differ carries
 * block_configs as NVIDIA Model Optimizer writes them for heterogeneous MoE models: per
 * layer attention {no_op | n_heads_in_group} and ffn {no_op | intermediate_size |
 * moe {num_local_experts, num_experts_per_tok, expert_intermediate_dim,
 * shared_expert_intermediate_dim}}; transformers' own classes cannot hold such a model,
 * this reader and the project's engine can.
 */
#include "storage/hfconfig_moe.h"

#include "storage/hfconfig.h"

#include <stdio.h>
#include <string.h>


int hfconfig_moe_family(const char *cls, const char *model_type)
{
    if (cls)
        return !strcmp(cls, "MixtralForCausalLM") ? 1 : !strcmp(cls, "Qwen2MoeForCausalLM") ? 2
               : !strcmp(cls, "OlmoeForCausalLM") ? 3 : 0;
    if (model_type)
        return !strcmp(model_type, "mixtral") ? 1 : !strcmp(model_type, "qwen2_moe") ? 2
               : !strcmp(model_type, "olmoe") ? 3 : 0;
    return 0;
}

double hfconfig_moe_default(int fam, const char *field)
{
    if (!strcmp(field, "rms_norm_eps"))   /* MixtralConfig, OlmoeConfig: 1e-5; Qwen2MoeConfig: 1e-6 */
        return fam == 2 ? 1e-6 : 1e-5;
    if (!strcmp(field, "max_position_embeddings"))   /* MixtralConfig 4096 * 32, Qwen2MoeConfig 32768, OlmoeConfig 4096 */
        return fam == 1 ? 131072 : fam == 2 ? 32768 : 4096;
    return fam == 1 ? 1e6 : 10000.0;      /* rope_theta: MixtralConfig 1e6, the others 10000 */
}

/* block_configs[l] of an MoE family into y (attention heads H in the config). */
static int moe_block(json_t *b, int l, int64_t H, arch_layer *y, char *err, size_t errlen)
{
    json_t *at = json_object_get(b, "attention"), *ff = json_object_get(b, "ffn");
    if (!json_is_object(at) || !json_is_object(ff)) {
        snprintf(err, errlen, "config.json: block_configs[%d]: needs attention and ffn objects", l);
        return -1;
    }
    if (!json_is_true(json_object_get(at, "no_op"))) {
        int64_t g;
        if (hfconfig_int_in(at, "n_heads_in_group", -1, 1, H, &g) || g < 1 || H % g) {
            snprintf(err, errlen, "config.json: block_configs[%d].attention.n_heads_in_group: must divide "
                     "num_attention_heads (%lld)", l, (long long)H);
            return -1;
        }
        y->n_heads = (int)H;
        y->n_kv_heads = (int)(H / g);
    }
    if (json_is_true(json_object_get(ff, "no_op")))
        return 0;
    json_t *moe = json_object_get(ff, "moe");
    if (json_is_object(moe)) {
        int64_t e, k, f, s;
        if (hfconfig_int_in(moe, "num_local_experts", -1, 1, 4096, &e) || hfconfig_int_in(moe, "num_experts_per_tok", -1, 1, e, &k) ||
            hfconfig_int_in(moe, "expert_intermediate_dim", -1, 1, 1 << 20, &f) ||
            hfconfig_int_in(moe, "shared_expert_intermediate_dim", 0, 0, 1 << 20, &s) || e < 1 || k < 1 || f < 1) {
            snprintf(err, errlen, "config.json: block_configs[%d].ffn.moe: needs num_local_experts, "
                     "num_experts_per_tok (<= the experts), expert_intermediate_dim in range", l);
            return -1;
        }
        y->moe.n_experts = (int)e;
        y->moe.top_k = (int)k;
        y->moe.expert_ffn_dim = (int)f;
        y->moe.shared_ffn_dim = (int)s;
        return 0;
    }
    int64_t f;
    if (hfconfig_int_in(ff, "intermediate_size", -1, 1, 1 << 20, &f) || f < 1) {
        snprintf(err, errlen, "config.json: block_configs[%d].ffn: needs moe, intermediate_size or no_op", l);
        return -1;
    }
    y->ffn_dim = (int)f;
    return 0;
}

int hfconfig_moe_layers(json_t *cfg, int fam, arch *a, int64_t H, int64_t KV, char *err, size_t errlen)
{
    int64_t F, E, k, Fe, S, step;
    int mixtral = fam == 1, olmoe = fam == 3;
    snprintf(a->family, sizeof a->family, "%s", mixtral ? "mixtral" : olmoe ? "olmoe" : "qwen2_moe");
    json_t *clip = json_object_get(cfg, "clip_qkv");
    if (olmoe && clip && !json_is_null(clip)) {
        snprintf(err, errlen, "config.json: clip_qkv: clamping q, k and v is not supported");
        return -1;
    }
    if (hfconfig_int_in(cfg, "intermediate_size", mixtral ? 14336 : olmoe ? 2048 : 5632, 1, 1 << 20, &F) ||
        hfconfig_int_in(cfg, mixtral ? "num_local_experts" : "num_experts", mixtral ? 8 : olmoe ? 64 : 60, 0, 4096, &E) ||
        hfconfig_int_in(cfg, "num_experts_per_tok", mixtral ? 2 : olmoe ? 8 : 4, 1, 4096, &k) ||
        hfconfig_int_in(cfg, "moe_intermediate_size", 1408, 1, 1 << 20, &Fe) ||
        hfconfig_int_in(cfg, "shared_expert_intermediate_size", 5632, 0, 1 << 20, &S) ||
        hfconfig_int_in(cfg, "decoder_sparse_step", 1, 1, 1024, &step)) {
        snprintf(err, errlen, "config.json: the MoE fields (intermediate sizes, expert counts, decoder_sparse_step) "
                 "must be integers in range");
        return -1;
    }
    json_t *nt = json_object_get(cfg, "norm_topk_prob"), *only = json_object_get(cfg, "mlp_only_layers");
    json_t *bc = json_object_get(cfg, "block_configs");
    if ((nt && !json_is_boolean(nt)) || (only && !json_is_null(only) && !json_is_array(only)) ||
        (bc && !json_is_null(bc) && (!json_is_array(bc) || (int)json_array_size(bc) != a->n_layers))) {
        snprintf(err, errlen, "config.json: norm_topk_prob must be a boolean, mlp_only_layers a list, block_configs "
                 "one entry per layer");
        return -1;
    }
    int norm = mixtral ? 1 : nt && json_is_true(nt);
    if (olmoe && E == 0) {
        snprintf(err, errlen, "config.json: num_experts: OLMoE needs at least one expert");
        return -1;
    }
    if (!mixtral && E > 0 && k > E) {
        snprintf(err, errlen, "config.json: num_experts_per_tok %lld exceeds num_experts %lld", (long long)k,
                 (long long)E);
        return -1;
    }
    for (int l = 0; l < a->n_layers; l++) {
        arch_layer *y = &a->layers[l];
        int src = y->source_layer;
        *y = (arch_layer){.source_layer = src};
        if (bc && json_is_array(bc)) {
            if (moe_block(json_array_get(bc, (size_t)l), l, H, y, err, errlen))
                return -1;
        } else {
            y->n_heads = (int)H;
            y->n_kv_heads = (int)KV;
            int qwen = !mixtral && !olmoe;   /* OLMoE: every layer an MoE of intermediate_size experts */
            int dense = qwen && (E == 0 || (l + 1) % step != 0);
            for (size_t i = 0; qwen && only && i < json_array_size(only); i++)
                dense |= json_integer_value(json_array_get(only, i)) == l;
            if (dense) {
                y->ffn_dim = (int)F;
            } else {
                y->moe = (arch_moe){.n_experts = (int)E, .top_k = (int)k, .expert_ffn_dim = (int)(qwen ? Fe : F),
                                    .shared_ffn_dim = qwen ? (int)S : 0};
            }
        }
        if (y->moe.n_experts)
            y->moe.norm_topk = norm;
    }
    return 0;
}

/* 1 when the family's own fields describe every layer: attention on with the first layer's
 * heads, every MoE like the first; dense MLPs only in Qwen2-MoE (its mlp_only_layers), all of
 * one width. Anything else needs block_configs. */
static int moe_uniform(const arch *a)
{
    const arch_moe *e = arch_first_moe(a, NULL);
    int qwen = !strcmp(a->family, "qwen2_moe"), dense = 0;
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *y = &a->layers[l];
        if (!e || !y->n_heads || y->n_heads != a->layers[0].n_heads || y->n_kv_heads != a->layers[0].n_kv_heads ||
            !arch_layer_has_mlp(y))
            return 0;
        if (y->ffn_dim) {
            if (!qwen || (dense && y->ffn_dim != dense))
                return 0;
            dense = y->ffn_dim;
        } else if (memcmp(&y->moe, e, sizeof y->moe)) {
            return 0;
        }
    }
    return 1;
}

static json_t *moe_blocks(const arch *a)
{
    json_t *blocks = json_array();
    for (int l = 0; blocks && l < a->n_layers; l++) {
        const arch_layer *y = &a->layers[l];
        json_t *att = y->n_heads ? json_pack("{s:b,s:i}", "no_op", 0, "n_heads_in_group", y->n_heads / y->n_kv_heads)
                                 : json_pack("{s:b}", "no_op", 1);
        json_t *ffn;
        if (y->moe.n_experts)
            ffn = json_pack("{s:b,s:{s:i,s:i,s:i,s:i}}", "no_op", 0, "moe", "num_local_experts", y->moe.n_experts,
                            "num_experts_per_tok", y->moe.top_k, "expert_intermediate_dim", y->moe.expert_ffn_dim,
                            "shared_expert_intermediate_dim", y->moe.shared_ffn_dim);
        else if (y->ffn_dim)
            ffn = json_pack("{s:b,s:i}", "no_op", 0, "intermediate_size", y->ffn_dim);
        else
            ffn = json_pack("{s:b}", "no_op", 1);
        json_t *b = att && ffn ? json_pack("{s:o,s:o}", "attention", att, "ffn", ffn) : NULL;
        if (!b || json_array_append_new(blocks, b)) {
            json_decref(blocks);
            return NULL;
        }
    }
    return blocks;
}

json_t *hfconfig_moe_from_arch(const arch *a, const char *torch_dtype, char *err, size_t errlen)
{
    const arch_moe *e = arch_first_moe(a, NULL);
    const arch_layer *att = NULL, *dense = NULL;
    for (int l = 0; l < a->n_layers; l++) {
        if (!att && a->layers[l].n_heads)
            att = &a->layers[l];
        if (!dense && a->layers[l].ffn_dim)
            dense = &a->layers[l];
    }
    /* With no MoE or no attention layer left, the top-level fields only need to be valid:
       block_configs say what every layer holds. */
    arch_moe none = {0};
    arch_layer no_att = {.n_heads = a->head_dim > 0 ? a->hidden_size / a->head_dim : 0};
    no_att.n_kv_heads = no_att.n_heads;
    const arch_moe *em = e ? e : &none;
    if (!att)
        att = &no_att;
    if (att->n_heads <= 0) {
        snprintf(err, errlen, "config.json: hidden_size %d is not a multiple of head_dim %d", a->hidden_size,
                 a->head_dim);
        return NULL;
    }
    int mixtral = !strcmp(a->family, "mixtral"), olmoe = !strcmp(a->family, "olmoe");
    const char *cls = mixtral ? "MixtralForCausalLM" : olmoe ? "OlmoeForCausalLM" : "Qwen2MoeForCausalLM";
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].n_heads && a->layers[l].n_heads != att->n_heads) {
            snprintf(err, errlen, "config.json: layer %d has %d query heads, layer before it %d: the %s config holds "
                     "one query-head count (block_configs vary KV heads only)", l, a->layers[l].n_heads,
                     att->n_heads, a->family);
            return NULL;
        }
    if (att->n_heads * a->head_dim != a->hidden_size) {
        snprintf(err, errlen, "config.json: %s derives head_dim as hidden_size/num_attention_heads (%d/%d), "
                 "but the arch has head_dim %d", cls, a->hidden_size, att->n_heads, a->head_dim);
        return NULL;
    }
    json_t *j = json_pack("{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:f,s:b,s:s,s:s,s:b,s:i,s:b,s:o}",
                          "architectures", cls, "model_type", a->family, "vocab_size", a->vocab_size,
                          "hidden_size", a->hidden_size, "num_hidden_layers", a->n_layers,
                          "num_attention_heads", att->n_heads, "num_key_value_heads", att->n_kv_heads,
                          "head_dim", a->head_dim, "max_position_embeddings", a->max_position_embeddings,
                          "rope_theta", a->rope_theta, "rms_norm_eps", a->norm_eps,
                          "tie_word_embeddings", a->tie_word_embeddings, "hidden_act", "silu",
                          "torch_dtype", torch_dtype ? torch_dtype : "float32", "use_cache", 1,
                          "num_experts_per_tok", em->top_k ? em->top_k : 1, "output_router_logits", 0,
                          "rope_scaling", hfconfig_rope_scaling(a));
    int rc = !j;
    if (j && mixtral) {
        rc |= json_object_set_new(j, "intermediate_size", json_integer(e ? em->expert_ffn_dim : dense ? dense->ffn_dim : 1));
        rc |= json_object_set_new(j, "num_local_experts", json_integer(em->n_experts ? em->n_experts : 1));
        rc |= json_object_set_new(j, "sliding_window", json_null());
    } else if (j && olmoe) {
        rc |= json_object_set_new(j, "intermediate_size", json_integer(e ? em->expert_ffn_dim : 1));
        rc |= json_object_set_new(j, "num_experts", json_integer(em->n_experts ? em->n_experts : 1));
        rc |= json_object_set_new(j, "norm_topk_prob", json_boolean(em->norm_topk));
        rc |= json_object_set_new(j, "clip_qkv", json_null());
        rc |= json_object_set_new(j, "attention_bias", json_false());
    } else if (j) {
        rc |= json_object_set_new(j, "intermediate_size", json_integer(dense ? dense->ffn_dim : e ? em->expert_ffn_dim : 1));
        rc |= json_object_set_new(j, "moe_intermediate_size", json_integer(e ? em->expert_ffn_dim : 1));
        rc |= json_object_set_new(j, "shared_expert_intermediate_size", json_integer(em->shared_ffn_dim));
        rc |= json_object_set_new(j, "num_experts", json_integer(em->n_experts));
        rc |= json_object_set_new(j, "norm_topk_prob", json_boolean(em->norm_topk));
        /* dense layers: by decoder_sparse_step when they fit its pattern (every reader has it),
           else mlp_only_layers (transformers >= 4.41) */
        int step = 0;
        for (int st = 1; !step && st <= a->n_layers; st++) {
            int fits = 1;
            for (int l = 0; l < a->n_layers; l++)
                fits &= (a->layers[l].moe.n_experts > 0) == ((l + 1) % st == 0);
            step = fits ? st : 0;
        }
        rc |= json_object_set_new(j, "decoder_sparse_step", json_integer(step ? step : 1));
        json_t *only = json_array();
        for (int l = 0; only && !step && l < a->n_layers; l++)
            if (a->layers[l].ffn_dim && json_array_append_new(only, json_integer(l)))
                rc = 1;
        rc |= json_object_set_new(j, "mlp_only_layers", only);
        rc |= json_object_set_new(j, "use_sliding_window", json_false());
    }
    if (j && !moe_uniform(a))
        rc |= json_object_set_new(j, "block_configs", moe_blocks(a));
    if (rc) {
        json_decref(j);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    return j;
}
