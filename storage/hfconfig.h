/* storage/hfconfig.h — Hugging Face config.json <-> arch for LlamaForCausalLM,
 * MistralForCausalLM and Qwen2ForCausalLM (rope_scaling, tie_word_embeddings, Qwen2's
 * q/k/v bias), read and written, and DeciLMForCausalLM (Nemotron-NAS block_configs:
 * per-layer KV heads and FFN widths, attention or FFN removed), read. The writer here
 * holds uniform layers only; storage/export_decilm.c writes block_configs (DESIGN.md §8).
 */
#ifndef AC_STORAGE_HFCONFIG_H
#define AC_STORAGE_HFCONFIG_H

#include <stddef.h>
#include <jansson.h>

#include "engine/arch.h"

/* Significant digits of the reals in an exported config.json (exp_write_json). */
#define EXPORT_REAL_DIGITS 15

/* Parse a config.json object (borrowed) into a (must not own memory; owns the layers
 * on success, arch_free). Source layers come from "autocompress_source_layers" when
 * present (our exports record them), else 0..n-1. Returns 0, or -1 with
 * "config.json: field: reason" in err and nothing to free. */
int hfconfig_to_arch(json_t *cfg, arch *a, char *err, size_t errlen);

/* The JSON document at `path` (at most 16 MiB, duplicate keys refused), the non-finite
 * numbers Python's json writes (Infinity, -Infinity, NaN) read as null: a NEW reference, or
 * NULL with "PATH: reason" in err. Every reader of a config.json goes through it. */
json_t *hfconfig_read_json(const char *path, char *err, size_t errlen);

/* Read and parse the file at `path`. Same contract. */
int hfconfig_load(const char *path, arch *a, char *err, size_t errlen);

/* DeciLM's FFN width for ffn_mult: int(2*ffn_mult*hidden/3) rounded up to a multiple of
 * 256, as vLLM's nemotron_nas and llama.cpp's converter compute it. */
int hfconfig_decilm_intermediate_size(double ffn_mult, int hidden_size);

/* The ffn_mult (rounded to 6 digits, as block_config.py stores it) that gives ffn_dim
 * back exactly through hfconfig_decilm_intermediate_size; -1 when none does. */
double hfconfig_decilm_ffn_mult(int ffn_dim, int hidden_size);

/* Integer field k of object o: def when absent or null; 0, or -1 when it is not an integer in
 * [lo, hi]. The family readers' one field reader (storage/hfconfig_moe.c, hfconfig_hybrid.c). */
int hfconfig_int_in(json_t *o, const char *k, int64_t def, int64_t lo, int64_t hi, int64_t *v);

/* The class a config.json object names: architectures[0], borrowed from cfg; NULL when
 * it names none. */
const char *hfconfig_class(const json_t *cfg);

/* rope_scaling of config.json for a's RoPE scaling, as transformers writes it (rope_type,
 * and type as well for linear and dynamic); JSON null when a has none. Returns a NEW
 * reference, or NULL on OOM. Every config.json writer uses it (DeciLM's included). */
json_t *hfconfig_rope_scaling(const arch *a);

/* config.json for a uniform arch: Qwen2ForCausalLM when attention_bias, else
 * LlamaForCausalLM. Returns a NEW reference, or NULL with a reason (non-uniform arch,
 * OOM). torch_dtype names the stored weight dtype ("float32", "bfloat16", "float16"). */
json_t *hfconfig_from_arch(const arch *a, const char *torch_dtype, char *err, size_t errlen);

#endif
