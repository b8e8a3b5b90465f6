/* storage/export_gguf_hybrid.h — GGUF of the hybrid Mamba-2 family (storage/export_gguf_hybrid.c),
 * for the GGUF writer storage/export_gguf.c.
 */
#ifndef AC_STORAGE_EXPORT_GGUF_HYBRID_H
#define AC_STORAGE_EXPORT_GGUF_HYBRID_H

#include <stddef.h>

#include "engine/model.h"
#include "storage/gguf_write.h"

/* GGUF of a nemotron_h arch as llama.cpp reads it: the architecture's name ("nemotron_h", or
 * "nemotron_h_moe" when its feed-forward layers are MoEs), or -1 with the reason llama.cpp
 * cannot hold the arch; the architecture's keys (per-layer arrays; nonzero on OOM); the
 * tensors (declared, then written to path with weight type wt, a ggw_type; 0 or -1). */
int exp_gguf_hybrid_arch(const arch *a, char *arch_name, size_t cap, char *err, size_t errlen);
int exp_gguf_hybrid_keys(ggw *w, const arch *a, const char *an);
int exp_gguf_hybrid_tensors(ggw *w, const eng_model *m, int wt, const char *path, char *err, size_t errlen);

#endif
