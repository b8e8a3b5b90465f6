/* storage/gguf_families.h — GGUF parents of the mixture-of-experts and Mamba-2 families as
 * llama.cpp names them (the inverse of storage/export_gguf_moe.c and export_gguf_hybrid.c):
 * `llama` with experts (Mixtral), `qwen2moe`, `olmoe`, `mamba2`, `nemotron_h` and
 * `nemotron_h_moe`. The arch comes from their keys; every GGUF tensor maps to the HF tensors it
 * holds (a stacked ffn_*_exps tensor to one per expert; llama.cpp's ssm_a = -exp(A_log) back to
 * A_log), for storage/modelio.c.
 */
#ifndef AC_STORAGE_GGUF_FAMILIES_H
#define AC_STORAGE_GGUF_FAMILIES_H

#include <stddef.h>
#include <stdint.h>

#include "engine/arch.h"
#include "storage/gguf.h"

/* The architectures read here, for messages. */
#define GGUF_FAMILIES "llama with experts, qwen2moe, olmoe, mamba2, nemotron_h, nemotron_h_moe"

/* 1 when general.architecture `an` is one of this file's (llama with experts is decided by
 * its expert_count, in gguf_arch). */
int gguf_family_known(const char *an);

/* The arch of a GGUF of architecture `an` (gguf_arch calls it). a must not own memory.
 * 0, or -1 with a reason naming the key. */
int gguf_family_arch(const gguf_file *g, const char *an, arch *a, char *err, size_t errlen);

/* How one HF tensor is read out of a GGUF tensor: its rows un-permuted for llama.cpp's
 * interleaved RoPE (permute_heads > 0), its values -exp(A_log) to be taken back to A_log
 * (neg_exp), or part `sub` of a stack of n_sub experts (n_sub 1: the whole tensor). */
typedef struct {
    char name[128];
    int64_t shape[2];
    int ndim, permute_heads, neg_exp, sub, n_sub;
} gguf_hf_part;

/* The HF tensors GGUF tensor i holds under arch a (from gguf_arch): into the NEW array *parts
 * (the caller frees it), *n_parts of them. Returns 0; 1 for a tensor the engine does not use
 * (nothing allocated); -1 for a name a's family does not have (err names it). */
int gguf_hf_parts(const gguf_file *g, const arch *a, int i, gguf_hf_part **parts, int *n_parts, char *err,
                  size_t errlen);

#endif
