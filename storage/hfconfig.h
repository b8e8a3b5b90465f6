/* storage/hfconfig.h — Hugging Face config.json <-> arch for LlamaForCausalLM,
 * MistralForCausalLM and Qwen2ForCausalLM (rope_scaling, tie_word_embeddings, Qwen2's
 * q/k/v bias). config.json describes uniform layers only: non-uniform archs are written
 * by export in other forms (DESIGN.md §8).
 */
#ifndef AC_STORAGE_HFCONFIG_H
#define AC_STORAGE_HFCONFIG_H

#include <stddef.h>
#include <jansson.h>

#include "engine/arch.h"

/* Parse a config.json object (borrowed) into a (must not own memory). Returns 0, or -1
 * with "config.json: field: reason" in err. */
int hfconfig_to_arch(json_t *cfg, arch *a, char *err, size_t errlen);

/* Read and parse the file at `path`. Same contract. */
int hfconfig_load(const char *path, arch *a, char *err, size_t errlen);

/* config.json for a uniform arch: Qwen2ForCausalLM when attention_bias, else
 * LlamaForCausalLM. Returns a NEW reference, or NULL with a reason (non-uniform arch,
 * OOM). torch_dtype names the stored weight dtype ("float32", "bfloat16", "float16"). */
json_t *hfconfig_from_arch(const arch *a, const char *torch_dtype, char *err, size_t errlen);

#endif
