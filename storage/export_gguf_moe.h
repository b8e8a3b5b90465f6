/* storage/export_gguf_moe.h — GGUF of the mixture-of-experts families
 * (storage/export_gguf_moe.c), for the GGUF writer storage/export_gguf.c.
 */
#ifndef AC_STORAGE_EXPORT_GGUF_MOE_H
#define AC_STORAGE_EXPORT_GGUF_MOE_H

#include <stddef.h>

#include "engine/model.h"
#include "storage/gguf_write.h"

/* GGUF of an MoE family (storage/export_gguf_moe.c): the llama.cpp architecture's name
 * ("llama" for Mixtral, "qwen2moe"), or -1 with the reason llama.cpp cannot hold the arch;
 * the architecture's expert keys; the tensors (declared, then written to path with weight
 * type wt, a ggw_type). Each 0, or -1 (keys: nonzero on OOM). */
int exp_gguf_moe_arch(const arch *a, char *arch_name, size_t cap, char *err, size_t errlen);
int exp_gguf_moe_keys(ggw *w, const arch *a, const char *an);
int exp_gguf_moe_tensors(ggw *w, const eng_model *m, const char *an, int wt, const char *path, char *err,
                         size_t errlen);

#endif
