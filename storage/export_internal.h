/* storage/export_internal.h — what the export files share and nothing else includes:
 * the model's tensors as export reads them, the parent model's format and tokenizer,
 * SentencePiece pieces as HF and llama.cpp spell them, and the checks and phases one
 * writer borrows from another. The contract for callers is storage/export.h.
 *
 *   export.c         dtypes, tensors, the parent model, JSON files
 *   export_decilm.c  HF class choice and config.json (DeciLM block_configs)
 *   export_hf.c      the HF directory writer
 *   export_tok.c     tokenizer.json and the tokenizer files of an HF export
 *   export_gguf.c    the GGUF writer
 *   export_gguf_moe.c  its MoE families (llama with experts, qwen2moe) and the tensor-list writer
 *   export_gguf_hybrid.c  Nemotron-H (nemotron_h, nemotron_h_moe), Mamba-2 (mamba2)
 *   export_verify.c  SHA256SUMS, verification, loading an export back
 */
#ifndef AC_STORAGE_EXPORT_INTERNAL_H
#define AC_STORAGE_EXPORT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "storage/gguf_write.h"

#include "storage/export.h"
#include "storage/modelio.h"

/* One tensor of the model being exported. */
typedef struct {
    const char *name;     /* HF name, borrowed from the model */
    int64_t shape[2];     /* [rows, cols]; 1-D tensors use shape[0] */
    int ndim;             /* 1 or 2 */
    int64_t numel;
} exp_tensor;

/* The result a writer fills: res, or scratch when the caller passed none; cleared. */
exp_result *exp_result_clear(exp_result *res, exp_result *scratch);

/* Every tensor of m in enumeration order. Returns 0 with *out (NEW array of *n; free),
 * or -1 with err (a model without tensors, one of more than two dimensions, OOM). */
int exp_list_tensors(const eng_model *m, exp_tensor **out, int *n, char *err, size_t errlen);

/* Tensor t's fp32 values, read from any backend. Returns a NEW buffer of t->numel floats
 * (free), or NULL with err. */
float *exp_fetch_tensor(const eng_model *m, const exp_tensor *t, char *err, size_t errlen);

/* The parent's format by the one model probe (storage/modelio.h); 0 without a parent or
 * when it is in no model format. */
mio_format exp_parent_format(const char *parent);

/* The parent's tokenizer, as the subcommands load it (tok_path: a file overriding the
 * one found beside the parent; may be NULL). Returns a NEW tokenizer, or NULL with err. */
tok_tokenizer *exp_parent_tokenizer(const char *parent, const char *tok_path, char *err, size_t errlen);

/* Write JSON document j (borrowed) atomically as every export file is written: 2-space
 * indent, keys in insertion order. 0, or -1 with err. */
int exp_write_json(const char *path, const json_t *j, char *err, size_t errlen);

/* The pieces of an SPM tokenizer as llama.cpp and HF spell them: a space in a normal
 * piece is U+2581 (llama2.c's export turned those back into spaces). On success *pieces
 * (n NEW NUL-terminated strings; exp_free_pieces) and *lens; returns 0, or -1 on OOM. */
int exp_spm_pieces(const tok_tokenizer *t, char ***pieces, size_t **lens);
void exp_free_pieces(char **pieces, size_t *lens, int n);

/* q/k rows from the rotate_half layout to interleaved pairs, as convert_hf_to_gguf's
 * permute() for llama.cpp's RoPE: new row h*D + 2j + t takes old row h*D + t*D/2 + j, for
 * n_heads heads of D = rows/n_heads rows of `cols` values (storage/export_gguf.c). 0, or -1
 * (rows not in heads of even size, OOM). */
int exp_permute_rows(float *w, int n_heads, int64_t rows, int64_t cols);

/* A GGUF tensor of the MoE and hybrid writers (storage/export_gguf_moe.c): its llama.cpp name
 * and shape (ggml ne order), where its values come from (an HF name; stack: the experts'
 * tensors one after the other, the name holding %d) and what is done to them on the way
 * (permute: q/k rows interleaved for this many heads; neg_exp: -exp of each value). 1-D tensors
 * and those marked f32 stay F32, as llama.cpp's converter keeps them. */
typedef struct {
    char name[96], hf[128];
    int64_t ne[3];
    int ndim, stack, permute, neg_exp, f32;
} exp_gtensor;

/* Append tensor `name` {n0[, n1[, n2]]} from hf to t[*n] (stack as above; permute, neg_exp and
 * f32 zero, for the caller to set on t[*n - 1]). */
void exp_gtensor_add(exp_gtensor *t, int *n, const char *name, int64_t n0, int64_t n1, int64_t n2, const char *hf,
                     int stack);

/* Declare the n tensors of t in w with weight type wt (a ggw_type; rows not divisible into
 * Q8_0 blocks fall back to F16, as llama.cpp's quantizer does), then write the file at path,
 * each tensor's values read from m and transformed. 0, or -1 with err. */
int exp_gguf_write_list(ggw *w, const eng_model *m, const exp_gtensor *t, int n, int wt, const char *path, char *err,
                        size_t errlen);

/* Whether DeciLM block_configs can state `a` (one query head count, FFN widths that
 * ffn_mult gives back, no dynamic RoPE, no empty layer). 0, or -1 with the layer and the
 * reason in err. */
int exp_decilm_check(const arch *a, char *err, size_t errlen);

/* The tokenizer files of an HF export whose parent is not an HF directory, written into
 * dir: tokenizer.json, tokenizer_config.json (model_max_length max_pos) and
 * special_tokens_map.json, from a GGUF byte-level BPE's metadata (parent_gguf) or a
 * SentencePiece-style vocabulary (llama2.c tok*.bin, GGUF "llama"); the parent's BOS/EOS
 * ids go into conf (borrowed). A tokenizer that cannot be carried over is not an error:
 * res->note says why and res->tokenizer stays 0. Returns 0, or -1 with err (the GGUF
 * parent unreadable, a file not written, OOM). err must be empty on entry. */
int exp_hf_tokenizer_files(const char *parent, const char *tok_path, int parent_gguf, int max_pos,
                           const char *dir, json_t *conf, exp_result *res, char *err, size_t errlen);

#endif
