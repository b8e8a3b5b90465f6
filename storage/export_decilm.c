/* storage/export_decilm.c — which HF class states an arch, and its config.json (see
 * export.h). A uniform arch is LlamaForCausalLM (Qwen2 with q/k/v bias, or the parent's
 * own MistralForCausalLM), written by storage/hfconfig.c; anything else is
 * DeciLMForCausalLM with per-layer block_configs in the Nemotron-NAS schema, written here
 * and read back by hfconfig.c. What DeciLM cannot state is refused with the layer named.
 */
#include "storage/export_internal.h"

#include <stdio.h>
#include <string.h>

#include "storage/hfconfig.h"

static const char *torch_dtype(exp_dtype d)
{
    return d == EXP_FP32 ? "float32" : d == EXP_FP16 ? "float16" : "bfloat16";
}

static int first_attention_heads(const arch *a)
{
    for (int i = 0; i < a->n_layers; i++)
        if (a->layers[i].n_heads > 0)
            return a->layers[i].n_heads;
    return 0;
}

int exp_hf_class(const arch *a, const json_t *parent_config, char *cls, size_t cap, char *err, size_t errlen)
{
    if (arch_moe_family(a)) {
        /* the family's own class; block_configs carry layers that differ (storage/hfconfig_moe.c) */
        snprintf(cls, cap, "%s", !strcmp(a->family, "mixtral") ? "MixtralForCausalLM" : !strcmp(a->family, "olmoe")
                                 ? "OlmoeForCausalLM" : "Qwen2MoeForCausalLM");
        return 0;
    }
    if (arch_hybrid(a)) {   /* one shape per block kind: storage/hfconfig_hybrid.c */
        snprintf(cls, cap, "%s", !strcmp(a->family, "mamba2") ? "Mamba2ForCausalLM" : "NemotronHForCausalLM");
        return 0;
    }
    if (strcmp(a->family, "llama") != 0) {
        snprintf(err, errlen, "HF export: family '%s' is not supported (llama, mixtral, qwen2_moe, olmoe, nemotron_h, "
                 "mamba2)",
                 a->family);
        return -1;
    }
    if (a->n_layers > 0 && arch_is_uniform(a)) {
        const char *pcls = hfconfig_class(parent_config);
        if (a->attention_bias && a->layers[0].n_heads * a->head_dim != a->hidden_size) {
            snprintf(err, errlen, "HF export: Qwen2ForCausalLM derives head_dim as hidden_size/num_attention_heads "
                     "(%d/%d), but the arch has head_dim %d", a->hidden_size, a->layers[0].n_heads, a->head_dim);
            return -1;
        }
        if (a->attention_bias)
            snprintf(cls, cap, "Qwen2ForCausalLM");
        else if (pcls && !strcmp(pcls, "MistralForCausalLM"))
            snprintf(cls, cap, "%s", pcls);
        else
            snprintf(cls, cap, "LlamaForCausalLM");
        return 0;
    }
    if (exp_decilm_check(a, err, errlen) < 0)
        return -1;
    snprintf(cls, cap, "DeciLMForCausalLM");
    return 0;
}

int exp_decilm_check(const arch *a, char *err, size_t errlen)
{
    if (a->attention_bias) {
        snprintf(err, errlen, "HF export: a model with q/k/v biases (Qwen2) is written as Qwen2ForCausalLM, one "
                 "shape for every layer; DeciLM's attention_bias would also give o_proj a bias this model does not "
                 "have, so no format of this build holds per-layer shapes of it");
        return -1;
    }
    int H = first_attention_heads(a);
    if (H == 0) {
        snprintf(err, errlen, "HF export: no layer keeps attention; DeciLM needs num_attention_heads "
                 "from at least one attention layer");
        return -1;
    }
    if (a->head_dim * H != a->hidden_size) {
        snprintf(err, errlen, "HF export: DeciLM derives head_dim as hidden_size/num_attention_heads "
                 "(%d/%d), but the arch has head_dim %d", a->hidden_size, H, a->head_dim);
        return -1;
    }
    if (a->rope_scaling.type == ROPE_SCALING_DYNAMIC) {
        snprintf(err, errlen, "HF export: dynamic RoPE scaling is not expressible for DeciLM in this build");
        return -1;
    }
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        if (l->n_heads > 0 && l->n_heads != H) {
            snprintf(err, errlen, "HF export: layer %d has %d query heads but layer with attention before it "
                     "has %d; DeciLM block_configs (n_heads_in_group) fix the query head count for every "
                     "layer, so per-layer query heads are only expressible in GGUF", i, l->n_heads, H);
            return -1;
        }
        if (l->ffn_dim > 0 && hfconfig_decilm_ffn_mult(l->ffn_dim, a->hidden_size) < 0) {
            snprintf(err, errlen, "HF export: layer %d ffn_dim %d cannot be written as DeciLM ffn_mult "
                     "(readers round int(2*ffn_mult*%d/3) up to a multiple of 256)", i, l->ffn_dim,
                     a->hidden_size);
            return -1;
        }
        if (l->n_heads == 0 && l->ffn_dim == 0) {
            snprintf(err, errlen, "HF export: layer %d has neither attention nor MLP (a removed layer "
                     "must be absent from the arch)", i);
            return -1;
        }
    }
    return 0;
}

static int set(json_t *o, const char *k, json_t *v)
{
    return v ? json_object_set_new(o, k, v) : -1;
}

/* Nemotron-NAS block_configs: per layer, attention (n_heads_in_group, or no_op) and ffn
 * (ffn_mult, or no_op). Returns a NEW array, or NULL on OOM. */
static json_t *decilm_blocks(const arch *a)
{
    json_t *blocks = json_array();
    for (int i = 0; blocks && i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        json_t *att = json_pack("{s:o, s:b, s:n, s:b, s:n, s:b, s:b, s:n}",
            "n_heads_in_group", l->n_heads ? json_integer(l->n_heads / l->n_kv_heads) : json_null(),
            "no_op", l->n_heads == 0, "num_sink_tokens", "replace_with_linear", 0, "sparsify",
            "unshifted_sink", 0, "use_prefill_window_in_sink_attention", 0, "window_length");
        double m = l->ffn_dim ? hfconfig_decilm_ffn_mult(l->ffn_dim, a->hidden_size) : -1;
        json_t *ffn = json_pack("{s:o, s:b, s:b, s:n}",
            "ffn_mult", l->ffn_dim ? json_real(m) : json_null(), "no_op", l->ffn_dim == 0,
            "replace_with_linear", 0, "sparsify");
        json_t *b = att && ffn ? json_pack("{s:o, s:o}", "attention", att, "ffn", ffn) : NULL;
        if (!b || json_array_append_new(blocks, b) < 0) {
            json_decref(blocks);
            return NULL;
        }
    }
    return blocks;
}

/* The DeciLMForCausalLM fields of config.json for `a`. Returns a NEW object, or NULL on
 * OOM. */
static json_t *decilm_config(const arch *a, const char *cls, exp_dtype dtype)
{
    json_t *c = json_object();
    if (!c)
        return NULL;
    int rc = 0;
    rc |= set(c, "architectures", json_pack("[s]", cls));
    rc |= set(c, "model_type", json_string("nemotron-nas"));
    rc |= set(c, "hidden_size", json_integer(a->hidden_size));
    rc |= set(c, "num_hidden_layers", json_integer(a->n_layers));
    rc |= set(c, "num_attention_heads", json_integer(first_attention_heads(a)));
    rc |= set(c, "head_dim", json_integer(a->head_dim));
    rc |= set(c, "vocab_size", json_integer(a->vocab_size));
    rc |= set(c, "max_position_embeddings", json_integer(a->max_position_embeddings));
    rc |= set(c, "rms_norm_eps", json_real(a->norm_eps));
    rc |= set(c, "rope_theta", json_real(a->rope_theta));
    rc |= set(c, "rope_scaling", hfconfig_rope_scaling(a));
    rc |= set(c, "tie_word_embeddings", json_boolean(a->tie_word_embeddings));
    rc |= set(c, "attention_bias", json_boolean(a->attention_bias));
    rc |= set(c, "hidden_act", json_string("silu"));
    rc |= set(c, "torch_dtype", json_string(torch_dtype(dtype)));
    rc |= set(c, "use_cache", json_true());
    /* Nemotron-NAS schema (nvidia/Llama-3_1-Nemotron-51B-Instruct block_config.py; read
     * by vLLM nemotron_nas.py and llama.cpp conversion/deci.py). The class code is
     * NVIDIA's: transformers fetches it (trust_remote_code) from the auto_map repo. */
    rc |= set(c, "intermediate_size", json_null());
    rc |= set(c, "num_key_value_heads", json_null());
    rc |= set(c, "auto_map", json_pack("{s:s, s:s}",
        "AutoConfig", "nvidia/Llama-3_1-Nemotron-51B-Instruct--configuration_decilm.DeciLMConfig",
        "AutoModelForCausalLM", "nvidia/Llama-3_1-Nemotron-51B-Instruct--modeling_decilm.DeciLMForCausalLM"));
    rc |= set(c, "block_configs", decilm_blocks(a));
    if (rc) {
        json_decref(c);
        return NULL;
    }
    return c;
}

json_t *exp_hf_config(const arch *a, const char *cls, exp_dtype dtype, const json_t *parent_config,
                      char *err, size_t errlen)
{
    json_t *c;
    int rc = 0;
    if (strcmp(cls, "DeciLMForCausalLM") != 0) {
        /* Uniform: storage/hfconfig.c writes the class fields; the parent's own class name
         * (Mistral) is kept when it describes the same layout. */
        if (!(c = hfconfig_from_arch(a, torch_dtype(dtype), err, errlen)))
            return NULL;
        if (!strcmp(cls, "MistralForCausalLM")) {
            rc |= set(c, "architectures", json_pack("[s]", cls));
            rc |= set(c, "model_type", json_string("mistral"));
        }
    } else if (!(c = decilm_config(a, cls, dtype))) {
        goto oom;
    }
    if (strcmp(a->family, "mamba2")) {   /* the attention families' fields (Mamba2Config has none of them) */
        rc |= set(c, "mlp_bias", json_false());
        rc |= set(c, "attention_dropout", json_real(0.0));
        rc |= set(c, "pretraining_tp", json_integer(1));
    }
    rc |= set(c, "initializer_range", json_real(0.02));
    json_t *src = json_array();
    for (int i = 0; src && i < a->n_layers; i++)
        rc |= json_array_append_new(src, json_integer(a->layers[i].source_layer));
    rc |= set(c, "autocompress_source_layers", src);
    const json_t *v;
    if ((v = json_object_get(parent_config, "bos_token_id")))
        rc |= json_object_set(c, "bos_token_id", (json_t *)v);
    if ((v = json_object_get(parent_config, "eos_token_id")))
        rc |= json_object_set(c, "eos_token_id", (json_t *)v);
    if (rc)
        goto oom;
    return c;
oom:
    json_decref(c);
    snprintf(err, errlen, "config.json: out of memory");
    return NULL;
}
