/* storage/hfconfig_hybrid.c — config.json of the Mamba-2 families, read and written: NVIDIA's
 * hybrid (NemotronHForCausalLM, family nemotron_h) and the plain Mamba-2 model (Mamba2ForCausalLM
 * or mamba_ssm's config, family mamba2; at the end of the file). Every layer is one pre-norm block named by
 * hybrid_override_pattern: "M" a Mamba-2 mixer (mamba_num_heads x mamba_head_dim, n_groups,
 * ssm_state_size, conv_kernel), "*" attention without RoPE (num_attention_heads,
 * num_key_value_heads, head_dim), "-" a squared-ReLU MLP of intermediate_size, "E" an MoE of
 * squared-ReLU experts behind a sigmoid router (n_routed_experts, num_experts_per_tok,
 * moe_intermediate_size, a shared expert, n_group/topk_group, routed_scaling_factor,
 * norm_topk_prob; moe_latent_size: LatentMoE, the experts in a latent space). Newer configs
 * state the pattern as layers_block_type ("mamba"/"linear_attention", "attention"/
 * "full_attention", "mlp", "moe"); both are read, the pattern string is written. Defaults are NemotronHConfig's. The
 * checkpoints' time_step_limit [0.0, Infinity] reaches here with the Infinity read as null
 * (storage/hfconfig.c): no clamp, which is what the engine runs; any other limit is refused.
 */
#include "storage/hfconfig_hybrid.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/hfconfig.h"

#define BAD(...) do { snprintf(err, errlen, "config.json: " __VA_ARGS__); goto fail; } while (0)


/* 1 when field k is absent, null or equal to want (a boolean), else 0. */
static int bool_is(json_t *o, const char *k, int want)
{
    json_t *x = json_object_get(o, k);
    return !x || json_is_null(x) || (json_is_boolean(x) && json_is_true(x) == want);
}

/* 1 when string field k is absent, null or want. */
static int str_is(json_t *o, const char *k, const char *want)
{
    json_t *x = json_object_get(o, k);
    return !x || json_is_null(x) || (json_is_string(x) && !strcmp(json_string_value(x), want));
}

int hfconfig_hybrid_is(json_t *cfg, const char *cls, const char *model_type)
{
    if (cls)
        return !strcmp(cls, "NemotronHForCausalLM") || !strcmp(cls, "Mamba2ForCausalLM");
    if (model_type)
        return !strcmp(model_type, "nemotron_h") || !strcmp(model_type, "mamba2");
    return json_object_get(cfg, "ssm_cfg") && json_object_get(cfg, "d_model");   /* mamba_ssm's MambaConfig */
}

/* The layer pattern into pat (NUL-terminated, cap bytes): hybrid_override_pattern, or
 * layers_block_type mapped to its letters. 0, or -1 with err. */
static int read_pattern(json_t *cfg, char *pat, size_t cap, char *err, size_t errlen)
{
    json_t *p = json_object_get(cfg, "hybrid_override_pattern"), *lt = json_object_get(cfg, "layers_block_type");
    if (json_is_string(p)) {
        const char *s = json_string_value(p);
        size_t n = strlen(s);
        if (n == 0 || n >= cap || strspn(s, "M*-E") != n) {
            snprintf(err, errlen, "config.json: hybrid_override_pattern: \"%.40s\" must be 1 to %zu of M, *, - and E", s,
                     cap - 1);
            return -1;
        }
        memcpy(pat, s, n + 1);
        return 0;
    }
    if (!json_is_array(lt) || json_array_size(lt) == 0 || json_array_size(lt) >= cap) {
        snprintf(err, errlen, "config.json: hybrid_override_pattern or layers_block_type: one is needed");
        return -1;
    }
    static const char *const names[] = {"mamba", "linear_attention", "attention", "full_attention", "mlp", "moe"};
    static const char letters[] = "MM**-E";
    for (size_t i = 0; i < json_array_size(lt); i++) {
        const char *s = json_string_value(json_array_get(lt, i));
        size_t k = 0;
        while (s && k < 6 && strcmp(s, names[k]))
            k++;
        if (!s || k == 6) {
            snprintf(err, errlen, "config.json: layers_block_type[%zu]: must be one of mamba, attention, mlp, moe", i);
            return -1;
        }
        pat[i] = letters[k];
        pat[i + 1] = '\0';
    }
    return 0;
}

/* time_step_limit: absent, or [0, Infinity] (Infinity read as null, or a number at least 1e30). */
static int no_dt_clamp(json_t *cfg)
{
    json_t *t = json_object_get(cfg, "time_step_limit");
    if (!t || json_is_null(t))
        return 1;
    if (!json_is_array(t) || json_array_size(t) != 2)
        return 0;
    json_t *lo = json_array_get(t, 0), *hi = json_array_get(t, 1);
    return json_is_number(lo) && json_number_value(lo) == 0 &&
           (json_is_null(hi) || (json_is_number(hi) && json_number_value(hi) >= 1e30));
}

/* The MoE layers' shape (NemotronHConfig's defaults): n_routed_experts squared-ReLU experts of
 * moe_intermediate_size, top num_experts_per_tok in topk_group of n_group groups, sigmoid
 * scores normalized (norm_topk_prob) and times routed_scaling_factor, a shared expert of
 * moe_shared_expert_intermediate_size when n_shared_experts, the experts in a latent of
 * moe_latent_size when it is set (Nemotron 3 Super's LatentMoE). */
static int read_moe(json_t *cfg, arch_moe *e, char *err, size_t errlen)
{
    int64_t E, k, Fe, Fs, ns, ng, tg;
    double scale = 1.0;
    json_t *sc = json_object_get(cfg, "routed_scaling_factor"), *nt = json_object_get(cfg, "norm_topk_prob");
    json_t *lat = json_object_get(cfg, "moe_latent_size");
    memset(e, 0, sizeof *e);
    if (hfconfig_int_in(cfg, "n_routed_experts", 8, 1, 4096, &E) || hfconfig_int_in(cfg, "num_experts_per_tok", 2, 1, E, &k) ||
        hfconfig_int_in(cfg, "moe_intermediate_size", 7688, 1, 1 << 20, &Fe) ||
        hfconfig_int_in(cfg, "moe_shared_expert_intermediate_size", 7688, 0, 1 << 20, &Fs) ||
        hfconfig_int_in(cfg, "n_shared_experts", 1, 0, 1, &ns) || hfconfig_int_in(cfg, "n_group", 1, 1, E, &ng) ||
        hfconfig_int_in(cfg, "topk_group", 1, 1, ng, &tg)) {
        snprintf(err, errlen, "config.json: n_routed_experts, num_experts_per_tok, moe_intermediate_size, "
                 "moe_shared_expert_intermediate_size, n_shared_experts (0 or 1), n_group, topk_group: out of range");
        return -1;
    }
    if (sc && !json_is_null(sc) && (!json_is_number(sc) || !((scale = json_number_value(sc)) > 0))) {
        snprintf(err, errlen, "config.json: routed_scaling_factor: must be a positive number");
        return -1;
    }
    if (nt && !json_is_null(nt) && !json_is_boolean(nt)) {
        snprintf(err, errlen, "config.json: norm_topk_prob: must be true or false");
        return -1;
    }
    int64_t Lt = 0;
    if (lat && !json_is_null(lat) && (!json_is_integer(lat) || (Lt = json_integer_value(lat)) < 1 || Lt > 65536)) {
        snprintf(err, errlen, "config.json: moe_latent_size: must be null or an integer in [1, 65536]");
        return -1;
    }
    *e = (arch_moe){.n_experts = (int)E, .top_k = (int)k, .expert_ffn_dim = (int)Fe, .shared_ffn_dim = ns ? (int)Fs : 0,
                    .norm_topk = nt ? json_is_true(nt) : 1, .sigmoid = 1, .n_group = (int)ng, .topk_group = (int)tg,
                    .routed_scale = scale, .latent_dim = (int)Lt};
    return 0;
}

static int mamba2_to_arch(json_t *cfg, arch *a, char *err, size_t errlen);

/* An MoE layer's own expert counts and widths from its block_configs entry (NULL: the config's),
 * as NVIDIA Model Optimizer writes heterogeneous MoE models: {"ffn": {"moe":
 * {num_local_experts, num_experts_per_tok, expert_intermediate_dim,
 * shared_expert_intermediate_dim}}}; the routing stays the config's. 0, or -1 with err. */
static int layer_moe(json_t *b, int l, arch_moe *e, char *err, size_t errlen)
{
    json_t *mo = json_object_get(json_object_get(b, "ffn"), "moe");
    if (!b)
        return 0;
    int64_t E, k, F, S;
    if (!json_is_object(mo) || hfconfig_int_in(mo, "num_local_experts", e->n_experts, 1, 4096, &E) ||
        hfconfig_int_in(mo, "num_experts_per_tok", e->top_k < E ? e->top_k : E, 1, E, &k) ||
        hfconfig_int_in(mo, "expert_intermediate_dim", e->expert_ffn_dim, 1, 1 << 20, &F) ||
        hfconfig_int_in(mo, "shared_expert_intermediate_dim", e->shared_ffn_dim, 0, 1 << 20, &S)) {
        snprintf(err, errlen, "config.json: block_configs[%d].ffn.moe: needs num_local_experts, num_experts_per_tok "
                 "(<= the experts), expert_intermediate_dim, shared_expert_intermediate_dim in range", l);
        return -1;
    }
    e->n_experts = (int)E;
    e->top_k = (int)k;
    e->expert_ffn_dim = (int)F;
    e->shared_ffn_dim = (int)S;
    return 0;
}

int hfconfig_hybrid_to_arch(json_t *cfg, arch *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    const char *cls = hfconfig_class(cfg), *mt = json_string_value(json_object_get(cfg, "model_type"));
    if (cls ? strcmp(cls, "NemotronHForCausalLM") != 0 : !mt || strcmp(mt, "nemotron_h") != 0)
        return mamba2_to_arch(cfg, a, err, errlen);
    char pat[1025];
    if (read_pattern(cfg, pat, sizeof pat, err, errlen))
        return -1;
    int64_t L = (int64_t)strlen(pat), V, C, F, H, KV, D, P, MH, MP, S, G, K, nl;
    double eps = 1e-5;
    json_t *e = json_object_get(cfg, "layer_norm_epsilon");
    if (hfconfig_int_in(cfg, "vocab_size", 131072, 1, 1 << 22, &V))
        BAD("vocab_size: out of range");
    if (hfconfig_int_in(cfg, "hidden_size", 4096, 1, 65536, &C))
        BAD("hidden_size: out of range");
    if (hfconfig_int_in(cfg, "num_hidden_layers", L, L, L, &nl))
        BAD("num_hidden_layers: must equal the pattern's %lld layers", (long long)L);
    if (hfconfig_int_in(cfg, "intermediate_size", 21504, 1, 1 << 20, &F))
        BAD("intermediate_size: out of range");
    if (hfconfig_int_in(cfg, "num_attention_heads", 32, 1, 1024, &H))
        BAD("num_attention_heads: out of range");
    if (hfconfig_int_in(cfg, "num_key_value_heads", 8, 1, H, &KV) || H % KV)
        BAD("num_key_value_heads: must divide num_attention_heads");
    if (hfconfig_int_in(cfg, "head_dim", C / H, 2, 1024, &D) || D % 2)
        BAD("head_dim: must be even and in [2, 1024]");
    if (hfconfig_int_in(cfg, "max_position_embeddings", 4096, 1, 1 << 30, &P))
        BAD("max_position_embeddings: out of range");
    if (hfconfig_int_in(cfg, "mamba_num_heads", 128, 1, 4096, &MH) || hfconfig_int_in(cfg, "mamba_head_dim", 64, 1, 1024, &MP) ||
        hfconfig_int_in(cfg, "ssm_state_size", 128, 1, 1024, &S) || hfconfig_int_in(cfg, "n_groups", 8, 1, MH, &G) ||
        hfconfig_int_in(cfg, "conv_kernel", 4, 1, 16, &K))
        BAD("mamba_num_heads, mamba_head_dim, ssm_state_size, n_groups, conv_kernel: out of range");
    if (MH % G)
        BAD("n_groups: %lld does not divide mamba_num_heads %lld", (long long)G, (long long)MH);
    if (e && !json_is_null(e) && (!json_is_number(e) || !(json_number_value(e) > 0 && json_number_value(e) < 1)))
        BAD("layer_norm_epsilon: must be a number in (0, 1)");
    if (e && json_is_number(e))
        eps = json_number_value(e);
    if (!bool_is(cfg, "attention_bias", 0) || !bool_is(cfg, "mlp_bias", 0) || !bool_is(cfg, "use_bias", 0))
        BAD("attention_bias, mlp_bias, use_bias: biased projections are not supported for nemotron_h");
    if (!bool_is(cfg, "use_conv_bias", 1))
        BAD("use_conv_bias: a Mamba conv without bias is not supported");
    if (!str_is(cfg, "mlp_hidden_act", "relu2") || !str_is(cfg, "mamba_hidden_act", "silu"))
        BAD("mlp_hidden_act, mamba_hidden_act: only relu2 and silu are supported");
    if (!no_dt_clamp(cfg))
        BAD("time_step_limit: clamping dt is not supported (the engine runs [0, Infinity])");
    json_t *tie = json_object_get(cfg, "tie_word_embeddings");
    if (tie && !json_is_boolean(tie))
        BAD("tie_word_embeddings: must be true or false");
    json_t *src = json_object_get(cfg, "autocompress_source_layers"), *bc = json_object_get(cfg, "block_configs");
    if (src && !json_is_null(src) && (!json_is_array(src) || (int64_t)json_array_size(src) != L))
        BAD("autocompress_source_layers: must list the pattern's %lld layers", (long long)L);
    if (bc && !json_is_null(bc) && (!json_is_array(bc) || (int64_t)json_array_size(bc) != L))
        BAD("block_configs: must list the pattern's %lld layers", (long long)L);
    if (arch_init(a, (int)L)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    arch_moe moe;
    int have_moe = 0;
    snprintf(a->family, sizeof a->family, "nemotron_h");
    a->vocab_size = (int)V;
    a->hidden_size = (int)C;
    a->head_dim = (int)D;
    a->max_position_embeddings = (int)P;
    a->rope_theta = 10000.0;   /* unused: no RoPE in this family */
    a->norm_eps = eps;
    a->tie_word_embeddings = tie ? json_is_true(tie) : 0;
    for (int l = 0; l < L; l++) {
        json_t *s = json_array_get(src, (size_t)l);
        if (s && (!json_is_integer(s) || json_integer_value(s) < 0 || json_integer_value(s) > 1 << 20))
            BAD("autocompress_source_layers[%d]: must be a layer index", l);
        arch_layer *y = &a->layers[l];
        *y = (arch_layer){.source_layer = s ? (int)json_integer_value(s) : l};
        if (pat[l] == 'E') {
            if (!have_moe && read_moe(cfg, &moe, err, errlen))
                goto fail;
            have_moe = 1;
            y->moe = moe;
            if (layer_moe(json_array_get(json_object_get(cfg, "block_configs"), (size_t)l), l, &y->moe, err, errlen))
                goto fail;
        } else if (pat[l] == 'M')
            y->mamba = (arch_mamba){(int)MH, (int)MP, (int)S, (int)G, (int)K};
        else if (pat[l] == '*')
            y->n_heads = (int)H, y->n_kv_heads = (int)KV;
        else
            y->ffn_dim = (int)F;
    }
    char msg[256];
    if (arch_validate(a, msg, sizeof msg))
        BAD("%s", msg);
    return 0;
fail:
    arch_free(a);
    return -1;
}

static json_t *mamba2_from_arch(const arch *a, const char *torch_dtype, char *err, size_t errlen);

/* 1 when two MoE layers route alike (their counts and widths may differ: block_configs). */
static int same_routing(const arch_moe *x, const arch_moe *y)
{
    return x->norm_topk == y->norm_topk && x->sigmoid == y->sigmoid && x->n_group == y->n_group &&
           x->topk_group == y->topk_group && x->routed_scale == y->routed_scale && x->latent_dim == y->latent_dim;
}

/* block_configs for the MoE layers' own counts and widths (the other layers' entries empty), or
 * NULL (nothing to add: every MoE layer like the first, or OOM: *oom set). */
static json_t *moe_block_configs(const arch *a, const arch_moe *first, int *oom)
{
    int differ = 0;
    *oom = 0;
    for (int l = 0; l < a->n_layers; l++)
        differ |= a->layers[l].moe.n_experts && memcmp(&a->layers[l].moe, first, sizeof *first);
    if (!differ)
        return NULL;
    json_t *bc = json_array();
    for (int l = 0; bc && l < a->n_layers; l++) {
        const arch_moe *e = &a->layers[l].moe;
        json_t *b = e->n_experts ? json_pack("{s:{s:{s:i,s:i,s:i,s:i}}}", "ffn", "moe", "num_local_experts", e->n_experts,
                                             "num_experts_per_tok", e->top_k, "expert_intermediate_dim",
                                             e->expert_ffn_dim, "shared_expert_intermediate_dim", e->shared_ffn_dim)
                                 : json_object();
        if (!b || json_array_append_new(bc, b)) {
            json_decref(bc);
            bc = NULL;
        }
    }
    *oom = !bc;
    return bc;
}

json_t *hfconfig_hybrid_from_arch(const arch *a, const char *torch_dtype, char *err, size_t errlen)
{
    if (!strcmp(a->family, "mamba2"))
        return mamba2_from_arch(a, torch_dtype, err, errlen);
    const arch_layer *att = NULL, *mlp = NULL, *mam = NULL;
    char pat[1025] = {0};
    if (a->n_layers == 0 || a->n_layers >= (int)sizeof pat) {
        snprintf(err, errlen, "config.json: a nemotron_h config holds 1 to %zu layers", sizeof pat - 1);
        return NULL;
    }
    const arch_layer *moe = NULL;
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *y = &a->layers[l];
        const arch_layer **first = y->mamba.n_heads ? &mam : y->n_heads ? &att : y->moe.n_experts ? &moe : &mlp;
        if (arch_layer_has_mixer(y) && y->ffn_dim) {
            snprintf(err, errlen, "config.json: layer %d holds a mixer and an MLP; a NemotronHForCausalLM layer "
                     "holds one block", l);
            return NULL;
        }
        pat[l] = y->mamba.n_heads ? 'M' : y->n_heads ? '*' : y->moe.n_experts ? 'E' : '-';
        if (!*first)
            *first = y;
        int same = y->mamba.n_heads    ? !memcmp(&y->mamba, &mam->mamba, sizeof y->mamba)
                   : y->n_heads        ? y->n_heads == att->n_heads && y->n_kv_heads == att->n_kv_heads
                   : y->moe.n_experts ? same_routing(&y->moe, &moe->moe)   /* counts and widths: block_configs */
                                       : y->ffn_dim == mlp->ffn_dim;
        if (!same) {
            snprintf(err, errlen, "config.json: NemotronHForCausalLM gives every %s layer one %s, and layer %d "
                     "differs from the first", pat[l] == 'M' ? "Mamba" : pat[l] == '*' ? "attention" :
                     pat[l] == 'E' ? "MoE" : "MLP", pat[l] == 'E' ? "routing and latent" : "shape", l);
            return NULL;
        }
    }
    arch_mamba mz = {128, 64, 128, 8, 4}, mb = mam ? mam->mamba : mz;
    json_t *j = json_pack("{s:[s],s:s,s:i,s:i,s:i,s:i,s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:b,s:s,s:s,"
                          "s:b,s:b,s:b,s:b,s:b,s:s}",
                          "architectures", "NemotronHForCausalLM", "model_type", "nemotron_h",
                          "vocab_size", a->vocab_size, "hidden_size", a->hidden_size,
                          "intermediate_size", mlp ? mlp->ffn_dim : 1, "num_hidden_layers", a->n_layers,
                          "hybrid_override_pattern", pat,
                          "num_attention_heads", att ? att->n_heads : 1, "num_key_value_heads", att ? att->n_kv_heads : 1,
                          "head_dim", a->head_dim, "max_position_embeddings", a->max_position_embeddings,
                          "mamba_num_heads", mb.n_heads, "mamba_head_dim", mb.head_dim, "ssm_state_size", mb.d_state,
                          "n_groups", mb.n_groups, "conv_kernel", mb.conv_kernel,
                          "layer_norm_epsilon", a->norm_eps, "tie_word_embeddings", a->tie_word_embeddings,
                          "mlp_hidden_act", "relu2", "mamba_hidden_act", "silu",
                          "attention_bias", 0, "mlp_bias", 0, "use_bias", 0, "use_conv_bias", 1, "use_cache", 1,
                          "torch_dtype", torch_dtype ? torch_dtype : "float32");
    if (j && moe) {
        const arch_moe *e = &moe->moe;
        json_t *mo = json_pack("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:b,s:o}", "n_routed_experts", e->n_experts,
                               "num_experts_per_tok", e->top_k, "moe_intermediate_size", e->expert_ffn_dim,
                               "moe_shared_expert_intermediate_size", e->shared_ffn_dim ? e->shared_ffn_dim : 1,
                               "n_shared_experts", e->shared_ffn_dim ? 1 : 0, "n_group", e->n_group, "topk_group",
                               e->topk_group, "routed_scaling_factor", e->routed_scale, "norm_topk_prob", e->norm_topk,
                               "moe_latent_size", e->latent_dim ? json_integer(e->latent_dim) : json_null());
        int oom;
        json_t *bc = moe_block_configs(a, e, &oom);
        if (!mo || json_object_update(j, mo) || oom || (bc && json_object_set_new(j, "block_configs", bc))) {
            json_decref(j);
            j = NULL;
        }
        json_decref(mo);
    }
    if (!j)
        snprintf(err, errlen, "config.json: out of memory");
    return j;
}

/* Mamba-2 models: transformers' Mamba2ForCausalLM (Mamba2Config's defaults), or mamba_ssm's own
 * config.json (state-spaces/mamba2-*: d_model, n_layer, ssm_cfg {"layer": "Mamba2", ...}, the
 * vocabulary padded to pad_vocab_size_multiple as its embedding is). Every layer a Mamba-2 mixer
 * behind an RMSNorm; d_inner = expand * hidden = heads * head_dim. The gated norm runs per group
 * of d_inner / n_groups channels, as mamba_ssm and llama.cpp run it (transformers' torch path
 * normalizes the whole row; the two agree at n_groups 1, which the published checkpoints use). */
static int mamba2_to_arch(json_t *cfg, arch *a, char *err, size_t errlen)
{
    int ssm = !hfconfig_class(cfg) && !json_object_get(cfg, "model_type");   /* mamba_ssm's MambaConfig */
    json_t *sc = ssm ? json_object_get(cfg, "ssm_cfg") : cfg, *ex = json_object_get(sc, "expand");
    json_t *tie = json_object_get(cfg, ssm ? "tie_embeddings" : "tie_word_embeddings");
    json_t *e = json_object_get(cfg, "layer_norm_epsilon"), *attn = json_object_get(cfg, "attn_layer_idx");
    int64_t V, C, L, MH, MP, S, G, K, pad, dff;
    double expand = 2, eps = 1e-5;
    if (!json_is_object(sc))
        BAD("ssm_cfg: must be an object");
    if (ssm && !str_is(sc, "layer", "Mamba2"))
        BAD("ssm_cfg.layer: only \"Mamba2\" layers are supported");
    if (ssm && !json_object_get(sc, "layer"))
        BAD("ssm_cfg.layer: absent means Mamba-1 in mamba_ssm, which is not supported");
    if (hfconfig_int_in(cfg, ssm ? "d_model" : "hidden_size", ssm ? 2560 : 4096, 1, 65536, &C) ||
        hfconfig_int_in(cfg, ssm ? "n_layer" : "num_hidden_layers", 64, 1, 1024, &L) ||
        hfconfig_int_in(cfg, "vocab_size", ssm ? 50277 : 32768, 1, 1 << 22, &V) ||
        hfconfig_int_in(cfg, "pad_vocab_size_multiple", ssm ? 8 : 1, 1, 1024, &pad))
        BAD("%s, %s, vocab_size, pad_vocab_size_multiple: out of range",
            ssm ? "d_model" : "hidden_size", ssm ? "n_layer" : "num_hidden_layers");
    if (hfconfig_int_in(cfg, "d_intermediate", 0, 0, 0, &dff))
        BAD("d_intermediate: MLPs between the Mamba mixers are not supported (must be 0)");
    if (attn && !json_is_null(attn) && !(json_is_array(attn) && json_array_size(attn) == 0))
        BAD("attn_layer_idx: attention layers in a Mamba-2 model are not supported");
    if (ex && !json_is_null(ex) && (!json_is_number(ex) || !((expand = json_number_value(ex)) > 0) || expand > 64))
        BAD("expand: must be a positive number");
    if (hfconfig_int_in(sc, ssm ? "headdim" : "head_dim", 64, 1, 1024, &MP) ||
        hfconfig_int_in(sc, ssm ? "d_state" : "state_size", 128, 1, 1024, &S) ||
        hfconfig_int_in(sc, ssm ? "ngroups" : "n_groups", ssm ? 1 : 8, 1, 4096, &G) ||
        hfconfig_int_in(sc, ssm ? "d_conv" : "conv_kernel", 4, 1, 16, &K))
        BAD("head_dim, state_size, n_groups, conv_kernel: out of range");
    int64_t di = (int64_t)(expand * (double)C);
    if (ssm ? di % MP != 0 : hfconfig_int_in(cfg, "num_heads", 128, 1, 4096, &MH))
        BAD("%s: out of range, or not dividing expand * hidden", ssm ? "ssm_cfg.headdim" : "num_heads");
    if (ssm)
        MH = di / MP;
    if (MH * MP != di || MH > 4096)
        BAD("expand: expand * hidden (%lld) must equal num_heads * head_dim (%lld)", (long long)di, (long long)(MH * MP));
    if (MH % G)
        BAD("n_groups: %lld does not divide the %lld heads", (long long)G, (long long)MH);
    if (e && !json_is_null(e) && (!json_is_number(e) || !((eps = json_number_value(e)) > 0 && eps < 1)))
        BAD("layer_norm_epsilon: must be a number in (0, 1)");
    if (!bool_is(sc, ssm ? "bias" : "use_bias", 0))
        BAD("%s: a biased in_proj/out_proj is not supported", ssm ? "ssm_cfg.bias" : "use_bias");
    if (!bool_is(sc, ssm ? "conv_bias" : "use_conv_bias", 1))
        BAD("use_conv_bias: a Mamba conv without bias is not supported");
    if (!bool_is(cfg, "rms_norm", 1) || (ssm && (!bool_is(sc, "rmsnorm", 1) || !bool_is(sc, "norm_before_gate", 0) ||
                                                 !bool_is(sc, "D_has_hdim", 0))))
        BAD("rms_norm, ssm_cfg.rmsnorm, norm_before_gate, D_has_hdim: only RMSNorm, the gated norm after the gate "
            "and one D per head are supported");
    if (!str_is(cfg, "hidden_act", "silu") || (ssm && !str_is(sc, "activation", "swish") && !str_is(sc, "activation", "silu")))
        BAD("hidden_act: only silu is supported");
    json_t *lim = json_object_get(sc, "dt_limit");
    if (ssm ? lim && !json_is_null(lim) && !(json_is_array(lim) && json_array_size(lim) == 2 &&
                                             json_number_value(json_array_get(lim, 0)) == 0 &&
                                             (json_is_null(json_array_get(lim, 1)) ||
                                              json_number_value(json_array_get(lim, 1)) >= 1e30))
            : !no_dt_clamp(cfg))
        BAD("%s: clamping dt is not supported (the engine runs [0, Infinity])", ssm ? "dt_limit" : "time_step_limit");
    if (tie && !json_is_boolean(tie))
        BAD("%s: must be true or false", ssm ? "tie_embeddings" : "tie_word_embeddings");
    json_t *src = json_object_get(cfg, "autocompress_source_layers");
    if (src && !json_is_null(src) && (!json_is_array(src) || (int64_t)json_array_size(src) != L))
        BAD("autocompress_source_layers: must list the %lld layers", (long long)L);
    if (arch_init(a, (int)L)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(a->family, sizeof a->family, "mamba2");
    a->vocab_size = (int)((V + pad - 1) / pad * pad);
    a->hidden_size = (int)C;
    a->head_dim = 64;            /* unused: no attention in this family */
    a->max_position_embeddings = 1 << 20;   /* no position limit (llama.cpp's converter writes 2^20 too) */
    a->rope_theta = 10000.0;     /* unused */
    a->norm_eps = eps;
    a->tie_word_embeddings = tie ? json_is_true(tie) : ssm;
    for (int l = 0; l < L; l++) {
        json_t *s = json_array_get(src, (size_t)l);
        if (s && (!json_is_integer(s) || json_integer_value(s) < 0 || json_integer_value(s) > 1 << 20))
            BAD("autocompress_source_layers[%d]: must be a layer index", l);
        a->layers[l] = (arch_layer){.source_layer = s ? (int)json_integer_value(s) : l,
                                    .mamba = {(int)MH, (int)MP, (int)S, (int)G, (int)K}};
    }
    char msg[256];
    if (arch_validate(a, msg, sizeof msg))
        BAD("%s", msg);
    return 0;
fail:
    arch_free(a);
    return -1;
}

/* expand for d_inner di over hidden C as config.json holds it: the double of a decimal of
 * EXPORT_REAL_DIGITS significant digits (what the file keeps) whose int(expand * C) is di,
 * as transformers sizes the mixer. di / C itself can print as a decimal just under it
 * (32 / 24 -> 1.33333333333333, times 24 = 31.99...): then one unit of the last digit up.
 * 0, or -1 when no such decimal exists. */
static int mamba2_expand(int di, int C, double *out)
{
    double v = (double)di / C;
    for (int i = 0; i < 3; i++) {
        char buf[40];
        snprintf(buf, sizeof buf, "%.*g", EXPORT_REAL_DIGITS, v);
        double back = strtod(buf, NULL);
        if ((int64_t)(back * C) == di) {
            *out = back;
            return 0;
        }
        v = back + pow(10.0, floor(log10(back)) - (EXPORT_REAL_DIGITS - 1));
    }
    return -1;
}

/* Mamba2ForCausalLM's config.json: one Mamba shape for every layer. expand is the float whose
 * int(expand * hidden) is d_inner, as transformers sizes the mixer (it checks the product
 * against num_heads * head_dim); time_step_limit is left at its default (0, inf). */
static json_t *mamba2_from_arch(const arch *a, const char *torch_dtype, char *err, size_t errlen)
{
    const arch_mamba *mb = arch_first_mamba(a, NULL);
    if (!mb || a->n_layers == 0) {
        snprintf(err, errlen, "config.json: a Mamba2ForCausalLM has Mamba layers");
        return NULL;
    }
    for (int l = 0; l < a->n_layers; l++)
        if (memcmp(&a->layers[l].mamba, mb, sizeof *mb) || a->layers[l].n_heads || arch_layer_has_mlp(&a->layers[l])) {
            snprintf(err, errlen, "config.json: Mamba2ForCausalLM gives every layer one Mamba mixer of one shape, "
                     "and layer %d differs from the first", l);
            return NULL;
        }
    int di = arch_mamba_inner(mb), C = a->hidden_size;
    double expand;
    if (mamba2_expand(di, C, &expand)) {
        snprintf(err, errlen, "config.json: expand = %d / %d has no %d-digit decimal that transformers sizes the "
                 "mixer %d wide from", di, C, EXPORT_REAL_DIGITS, di);
        return NULL;
    }
    json_t *j = json_pack("{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:o,s:f,s:b,s:b,s:b,s:s,s:b,s:b,s:i,s:b,s:s}",
                          "architectures", "Mamba2ForCausalLM", "model_type", "mamba2", "vocab_size", a->vocab_size,
                          "hidden_size", C, "num_hidden_layers", a->n_layers, "num_heads", mb->n_heads,
                          "head_dim", mb->head_dim, "state_size", mb->d_state, "n_groups", mb->n_groups,
                          "conv_kernel", mb->conv_kernel,
                          "expand", di % C ? json_real(expand) : json_integer(di / C),
                          "layer_norm_epsilon", a->norm_eps, "tie_word_embeddings", a->tie_word_embeddings,
                          "use_bias", 0, "use_conv_bias", 1, "hidden_act", "silu", "rms_norm", 1,
                          "residual_in_fp32", 1, "chunk_size", 256, "use_cache", 1,
                          "torch_dtype", torch_dtype ? torch_dtype : "float32");
    if (!j)
        snprintf(err, errlen, "config.json: out of memory");
    return j;
}
