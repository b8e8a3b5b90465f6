/* storage/hfconfig.c — config.json reader and writer for the Llama-style families, and
 * the reader of DeciLM's block_configs (the MoE families: storage/hfconfig_moe.c; Nemotron-H:
 * storage/hfconfig_hybrid.c). The reader takes the non-finite numbers Python's json writes
 * (Infinity, NaN: NVIDIA's configs carry them) as null.
 * Defaults follow transformers' LlamaConfig/MistralConfig/Qwen2Config where a field is
 * absent; fields that change the math but that the engine lacks (sliding windows that
 * bind, DeciLM's MoE and linear replacements) are refused rather than ignored.
 */
#include "storage/hfconfig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/fileio.h"
#include "storage/hfconfig_hybrid.h"
#include "storage/hfconfig_moe.h"

#define BAD(...) do { snprintf(err, errlen, "config.json: " __VA_ARGS__); goto fail; } while (0)

static int get_int(json_t *o, const char *k, int64_t def, int64_t *v)
{
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x)) {
        *v = def;
        return 0;
    }
    if (!json_is_integer(x))
        return -1;
    *v = json_integer_value(x);
    return 0;
}

static int get_num(json_t *o, const char *k, double def, double *v)
{
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x)) {
        *v = def;
        return 0;
    }
    if (!json_is_number(x))
        return -1;
    *v = json_number_value(x);
    return 0;
}

int hfconfig_int_in(json_t *o, const char *k, int64_t def, int64_t lo, int64_t hi, int64_t *v)
{
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x)) {
        *v = def;
        return 0;
    }
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi)
        return -1;
    *v = json_integer_value(x);
    return 0;
}

int hfconfig_decilm_intermediate_size(double ffn_mult, int hidden_size)
{
    int64_t v = (int64_t)(2.0 * ffn_mult * (double)hidden_size / 3.0);
    if (v % 256)
        v += 256 - v % 256;
    return (int)v;
}

double hfconfig_decilm_ffn_mult(int ffn_dim, int hidden_size)
{
    if (ffn_dim <= 0 || hidden_size <= 0 || ffn_dim % 256)
        return -1;
    char buf[64];
    snprintf(buf, sizeof buf, "%.6f", 3.0 * ffn_dim / (2.0 * hidden_size));
    double m = strtod(buf, NULL);   /* round(x, 6), as block_config.py stores it */
    return hfconfig_decilm_intermediate_size(m, hidden_size) == ffn_dim ? m : -1;
}

/* A block_configs entry's field that must be absent, null or false: the feature it
 * turns on (linear replacement, sliding windows, attention sinks, sparsity, MoE) is not
 * in the engine. */
static int decilm_unsupported(json_t *o, const char *k)
{
    json_t *x = json_object_get(o, k);
    return x && !json_is_null(x) && !json_is_false(x);
}

/* Layer l of a DeciLM block_configs array into a->layers[l] (H query heads, hidden C). */
static int decilm_block(json_t *bc, int l, int64_t H, int64_t C, arch *a, char *err, size_t errlen)
{
    json_t *b = json_array_get(bc, (size_t)l);
    json_t *at = json_object_get(b, "attention"), *ff = json_object_get(b, "ffn");
    arch_layer *y = &a->layers[l];
    if (!json_is_object(at) || !json_is_object(ff)) {
        snprintf(err, errlen, "config.json: block_configs[%d]: needs attention and ffn objects", l);
        return -1;
    }
    static const char *const att_off[] = {"replace_with_linear", "window_length", "num_sink_tokens", "sparsify"};
    static const char *const ffn_off[] = {"replace_with_linear", "sparsify", "moe"};
    for (size_t k = 0; k < sizeof att_off / sizeof *att_off; k++)
        if (decilm_unsupported(at, att_off[k])) {
            snprintf(err, errlen, "config.json: block_configs[%d].attention.%s is not supported", l, att_off[k]);
            return -1;
        }
    for (size_t k = 0; k < sizeof ffn_off / sizeof *ffn_off; k++)
        if (decilm_unsupported(ff, ffn_off[k])) {
            snprintf(err, errlen, "config.json: block_configs[%d].ffn.%s is not supported", l, ffn_off[k]);
            return -1;
        }
    if (!json_is_true(json_object_get(at, "no_op"))) {
        json_t *g = json_object_get(at, "n_heads_in_group");
        if (!json_is_integer(g) || json_integer_value(g) <= 0 || H % json_integer_value(g)) {
            snprintf(err, errlen, "config.json: block_configs[%d].attention.n_heads_in_group: must divide "
                                  "num_attention_heads (%lld)", l, (long long)H);
            return -1;
        }
        y->n_heads = (int)H;
        y->n_kv_heads = (int)(H / json_integer_value(g));
    }
    if (!json_is_true(json_object_get(ff, "no_op"))) {
        json_t *m = json_object_get(ff, "ffn_mult"), *is = json_object_get(ff, "intermediate_size");
        if (json_is_number(m) && json_number_value(m) > 0 && json_number_value(m) < 1e4)
            y->ffn_dim = hfconfig_decilm_intermediate_size(json_number_value(m), (int)C);
        else if (json_is_integer(is) && json_integer_value(is) > 0 && json_integer_value(is) <= (1 << 20))
            y->ffn_dim = (int)json_integer_value(is);
        else {
            snprintf(err, errlen, "config.json: block_configs[%d].ffn: needs a positive ffn_mult", l);
            return -1;
        }
    }
    if (y->n_heads == 0 && y->ffn_dim == 0) {
        snprintf(err, errlen, "config.json: block_configs[%d]: both attention and ffn are no_op (a removed layer "
                              "is absent from the config)", l);
        return -1;
    }
    return 0;
}

const char *hfconfig_class(const json_t *cfg)
{
    return json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
}

/* An absent max_position_embeddings is transformers' default for the class: LlamaConfig
 * 2048, MistralConfig 4096 * 32, Qwen2Config 32768, the MoE families' their own (the spec
 * check holds a job's workload to it). */
static int64_t default_context(const char *cls, const char *model_type, int moe, int qwen2)
{
    int mistral = cls ? !strcmp(cls, "MistralForCausalLM") : model_type && !strcmp(model_type, "mistral");
    return moe ? (int64_t)hfconfig_moe_default(moe, "max_position_embeddings") : qwen2 ? 32768 : mistral ? 131072
                                                                                                    : 2048;
}

int hfconfig_to_arch(json_t *cfg, arch *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    if (!json_is_object(cfg)) {
        snprintf(err, errlen, "config.json: not a JSON object");
        return -1;
    }
    const char *an = hfconfig_class(cfg);
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    if (hfconfig_hybrid_is(cfg, an, mt))
        return hfconfig_hybrid_to_arch(cfg, a, err, errlen);
    int qwen2 = 0, deci = 0, moe = hfconfig_moe_family(an, mt);
    if (moe) {
        qwen2 = moe == 2;   /* Qwen2-MoE's attention is Qwen2's: q/k/v bias */
    } else if (an) {
        if (!strcmp(an, "Qwen2ForCausalLM"))
            qwen2 = 1;
        else if (!strcmp(an, "DeciLMForCausalLM"))
            deci = 1;
        else if (strcmp(an, "LlamaForCausalLM") && strcmp(an, "MistralForCausalLM")) {
            snprintf(err, errlen, "config.json: architectures: \"%s\" is not supported "
                                  "(LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, DeciLMForCausalLM, "
                                  "MixtralForCausalLM, Qwen2MoeForCausalLM, OlmoeForCausalLM, NemotronHForCausalLM, "
                                  "Mamba2ForCausalLM)", an);
            return -1;
        }
    } else if (mt) {
        if (!strcmp(mt, "qwen2"))
            qwen2 = 1;
        else if (!strcmp(mt, "nemotron-nas") || !strcmp(mt, "deci"))
            deci = 1;
        else if (strcmp(mt, "llama") && strcmp(mt, "mistral")) {
            snprintf(err, errlen, "config.json: model_type: \"%s\" is not supported (llama, mistral, qwen2, "
                                  "nemotron-nas, mixtral, qwen2_moe, olmoe, nemotron_h, mamba2)", mt);
            return -1;
        }
    } else {
        snprintf(err, errlen, "config.json: neither architectures nor model_type is given");
        return -1;
    }
    int64_t V, C, F = 0, L, H, KV = 0, D, P;
    double theta, eps;
    if (get_int(cfg, "vocab_size", 32000, &V) || V <= 0 || V > (1 << 22))
        BAD("vocab_size: missing or out of range");
    if (get_int(cfg, "hidden_size", -1, &C) || C <= 0 || C > 65536)
        BAD("hidden_size: missing or out of range");
    if (!deci && !moe && (get_int(cfg, "intermediate_size", -1, &F) || F <= 0 || F > (1 << 20)))
        BAD("intermediate_size: missing or out of range");
    if (get_int(cfg, "num_hidden_layers", -1, &L) || L < 0 || L > 1024)
        BAD("num_hidden_layers: missing or out of range");
    if (get_int(cfg, "num_attention_heads", -1, &H) || H <= 0 || H > 1024)
        BAD("num_attention_heads: missing or out of range");
    if (!deci && (get_int(cfg, "num_key_value_heads", H, &KV) || KV <= 0 || KV > H || H % KV))
        BAD("num_key_value_heads: must divide num_attention_heads");
    if (get_int(cfg, "head_dim", C / H, &D) || D <= 0 || D > 1024)
        BAD("head_dim: out of range");
    if (get_int(cfg, "max_position_embeddings", default_context(an, mt, moe, qwen2), &P) || P <= 0 || P > (1 << 30))
        BAD("max_position_embeddings: out of range");
    if (get_num(cfg, "rope_theta", moe ? hfconfig_moe_default(moe, "rope_theta") : 10000.0, &theta))
        BAD("rope_theta: must be a number");
    if (get_num(cfg, "rms_norm_eps", moe ? hfconfig_moe_default(moe, "rms_norm_eps") : 1e-6, &eps))
        BAD("rms_norm_eps: must be a number");
    json_t *tie = json_object_get(cfg, "tie_word_embeddings");
    if (tie && !json_is_boolean(tie))
        BAD("tie_word_embeddings: must be true or false");
    json_t *bias = json_object_get(cfg, "attention_bias");
    if (bias && json_is_true(bias) && !qwen2)
        BAD("attention_bias: Llama with biased projections (o_proj included) is not supported");
    json_t *sw = json_object_get(cfg, "sliding_window");
    int64_t swv = 0;
    if (sw && !json_is_null(sw) && json_is_integer(sw))
        swv = json_integer_value(sw);
    int use_sw = qwen2 ? json_is_true(json_object_get(cfg, "use_sliding_window")) : swv > 0;
    if (use_sw && swv > 0 && swv < P)
        BAD("sliding_window: %lld is shorter than max_position_embeddings; sliding-window attention is not supported",
            (long long)swv);
    json_t *bc = moe ? NULL : json_object_get(cfg, "block_configs");
    if (deci && (!json_is_array(bc) || (int64_t)json_array_size(bc) != L))
        BAD("block_configs: must list num_hidden_layers=%lld blocks", (long long)L);
    json_t *src = json_object_get(cfg, "autocompress_source_layers");
    if (src && !json_is_null(src) && (!json_is_array(src) || (int64_t)json_array_size(src) != L))
        BAD("autocompress_source_layers: must list num_hidden_layers=%lld parent layers", (long long)L);
    if (arch_init(a, (int)L)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = (int)V;
    a->hidden_size = (int)C;
    a->head_dim = (int)D;
    a->max_position_embeddings = (int)P;
    a->rope_theta = theta;
    a->norm_eps = eps;
    a->tie_word_embeddings = tie ? json_is_true(tie) : 0;
    a->attention_bias = qwen2;
    for (int l = 0; l < L; l++) {
        json_t *s = json_array_get(src, (size_t)l);
        if (s && (!json_is_integer(s) || json_integer_value(s) < 0 || json_integer_value(s) > 1 << 20))
            BAD("autocompress_source_layers[%d]: must be a layer index", l);
        a->layers[l] = (arch_layer){.source_layer = s ? (int)json_integer_value(s) : l};
        if (!deci) {
            a->layers[l].n_heads = (int)H;
            a->layers[l].n_kv_heads = (int)KV;
            a->layers[l].ffn_dim = (int)F;
        } else if (decilm_block(bc, l, H, C, a, err, errlen)) {
            goto fail;
        }
    }
    if (moe && hfconfig_moe_layers(cfg, moe, a, H, KV, err, errlen))
        goto fail;
    json_t *rs = json_object_get(cfg, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        const char *ty = json_string_value(json_object_get(rs, "rope_type"));
        if (!ty)
            ty = json_string_value(json_object_get(rs, "type"));
        arch_rope_scaling *s = &a->rope_scaling;
        double omax = 0;
        if (!ty)
            BAD("rope_scaling: needs rope_type or type");
        if (!strcmp(ty, "default"))
            s->type = ROPE_SCALING_NONE;
        else if (!strcmp(ty, "linear"))
            s->type = ROPE_SCALING_LINEAR;
        else if (!strcmp(ty, "dynamic"))
            s->type = ROPE_SCALING_DYNAMIC;
        else if (!strcmp(ty, "llama3"))
            s->type = ROPE_SCALING_LLAMA3;
        else
            BAD("rope_scaling: type \"%s\" is not supported (linear, dynamic, llama3)", ty);
        if (s->type != ROPE_SCALING_NONE && (get_num(rs, "factor", 0, &s->factor) || !(s->factor > 0)))
            BAD("rope_scaling.factor: must be a positive number");
        if (s->type == ROPE_SCALING_LLAMA3) {
            if (get_num(rs, "low_freq_factor", 1.0, &s->low_freq_factor) ||
                get_num(rs, "high_freq_factor", 4.0, &s->high_freq_factor) ||
                get_num(rs, "original_max_position_embeddings", 8192, &omax) || omax <= 0 || omax > (1 << 30))
                BAD("rope_scaling: llama3 fields must be numbers");
            s->original_max_position_embeddings = (int)omax;
        }
    }
    char msg[256];
    if (arch_validate(a, msg, sizeof msg))
        BAD("%s", msg);
    return 0;
fail:
    arch_free(a);
    return -1;
}

/* text with the non-finite numbers Python's json writes (Infinity, -Infinity, NaN) outside
 * strings replaced by null: a NEW buffer, or NULL out of memory. */
static char *finite_json(const char *text, size_t len)
{
    char *out = malloc(2 * len + 1), *o = out;
    if (!out)
        return NULL;
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_str) {
            *o++ = c;
            if (c == '\\' && i + 1 < len)
                *o++ = text[++i];
            else if (c == '"')
                in_str = 0;
            continue;
        }
        static const char *const bad[] = {"-Infinity", "Infinity", "NaN"};
        size_t k = 0;
        while (k < 3 && strncmp(text + i, bad[k], strlen(bad[k])))
            k++;
        if (k < 3) {
            memcpy(o, "null", 4);
            o += 4;
            i += strlen(bad[k]) - 1;
            continue;
        }
        in_str = c == '"';
        *o++ = c;
    }
    *o = '\0';
    return out;
}

json_t *hfconfig_read_json(const char *path, char *err, size_t errlen)
{
    size_t len = 0;
    char *text = fio_read_all(path, 16u << 20, &len, err, errlen), *clean = text ? finite_json(text, len) : NULL;
    int oom = text && !clean;
    free(text);
    if (!clean) {
        if (oom)
            snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loads(clean, JSON_REJECT_DUPLICATES, &je);
    free(clean);
    if (!j)
        snprintf(err, errlen, "%s: %s (line %d)", path, je.text, je.line);
    return j;
}

int hfconfig_load(const char *path, arch *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    json_t *j = hfconfig_read_json(path, err, errlen);
    if (!j)
        return -1;
    int rc = hfconfig_to_arch(j, a, err, errlen);
    json_decref(j);
    return rc;
}

json_t *hfconfig_rope_scaling(const arch *a)
{
    const arch_rope_scaling *s = &a->rope_scaling;
    if (s->type == ROPE_SCALING_LINEAR || s->type == ROPE_SCALING_DYNAMIC) {
        const char *ty = s->type == ROPE_SCALING_LINEAR ? "linear" : "dynamic";
        return json_pack("{s:s,s:s,s:f}", "rope_type", ty, "type", ty, "factor", s->factor);
    }
    if (s->type == ROPE_SCALING_LLAMA3)
        return json_pack("{s:s,s:f,s:f,s:f,s:i}", "rope_type", "llama3", "factor", s->factor, "low_freq_factor",
                         s->low_freq_factor, "high_freq_factor", s->high_freq_factor,
                         "original_max_position_embeddings", s->original_max_position_embeddings);
    return json_null();
}

json_t *hfconfig_from_arch(const arch *a, const char *torch_dtype, char *err, size_t errlen)
{
    if (arch_hybrid(a))
        return hfconfig_hybrid_from_arch(a, torch_dtype, err, errlen);
    if (strcmp(a->family, "llama"))
        return hfconfig_moe_from_arch(a, torch_dtype, err, errlen);
    if (a->n_layers == 0 || !arch_is_uniform(a)) {
        snprintf(err, errlen, "config.json holds uniform layers only; this arch differs per layer or removes parts "
                              "(export it as DeciLM or GGUF)");
        return NULL;
    }
    const arch_layer *l = &a->layers[0];
    int qwen2 = a->attention_bias;
    json_t *j = json_pack("{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:f,s:b,s:s,s:s,s:b}",
                          "architectures", qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM",
                          "model_type", qwen2 ? "qwen2" : "llama",
                          "vocab_size", a->vocab_size, "hidden_size", a->hidden_size,
                          "intermediate_size", l->ffn_dim, "num_hidden_layers", a->n_layers,
                          "num_attention_heads", l->n_heads, "num_key_value_heads", l->n_kv_heads,
                          "head_dim", a->head_dim, "max_position_embeddings", a->max_position_embeddings,
                          "rope_theta", a->rope_theta, "rms_norm_eps", a->norm_eps,
                          "tie_word_embeddings", a->tie_word_embeddings, "hidden_act", "silu",
                          "torch_dtype", torch_dtype ? torch_dtype : "float32", "use_cache", 1);
    if (!j) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!qwen2 && json_object_set_new(j, "attention_bias", json_false()))
        goto oom;
    json_t *rs = hfconfig_rope_scaling(a);
    if (!rs || json_object_set_new(j, "rope_scaling", rs))
        goto oom;
    return j;
oom:
    json_decref(j);
    snprintf(err, errlen, "out of memory");
    return NULL;
}
