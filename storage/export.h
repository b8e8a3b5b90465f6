/* storage/export.h — checkpoints that real engines load (DESIGN.md §8): an HF directory
 * (config.json, safetensors shards, generation_config.json, tokenizer files, MODEL_CARD.md,
 * SHA256SUMS) and a GGUF file, written from a model on any backend.
 *
 * Class and format choice follow the arch, never the other way round: a uniform arch is
 * LlamaForCausalLM (or the parent's own class), a heterogeneous one DeciLMForCausalLM with
 * per-layer block_configs (Nemotron-NAS schema, as vLLM's nemotron_nas and llama.cpp's
 * convert read it), and GGUF uses llama.cpp's `llama` architecture when uniform or `deci`
 * (per-layer arrays) otherwise. An arch the chosen format cannot express is refused with a
 * message naming the layer and the reason; nothing is rounded or dropped silently.
 * Tokenizer metadata comes from the parent: HF tokenizer files are copied, a GGUF parent's
 * tokenizer.* keys are copied into GGUF and turned into tokenizer.json for HF, and a
 * SentencePiece-style vocabulary (llama2.c tok*.bin) becomes GGUF "llama" metadata or an
 * HF tokenizer.json.
 */
#ifndef AC_STORAGE_EXPORT_H
#define AC_STORAGE_EXPORT_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "engine/model.h"
#include "engine/tokenizer.h"

typedef enum { EXP_BF16 = 0, EXP_FP16, EXP_FP32, EXP_Q8_0 } exp_dtype;

/* "bf16", "fp16"/"f16", "fp32"/"f32", "q8_0" -> dtype; -1 when unknown. */
int exp_dtype_parse(const char *s);
const char *exp_dtype_name(exp_dtype d);

typedef struct {
    exp_dtype dtype;            /* HF: bf16 (default), fp16, fp32; GGUF: also q8_0 */
    int64_t shard_bytes;        /* HF: largest safetensors shard (0: 5 GiB) */
    const char *parent_path;    /* parent model (HF dir, .gguf, llama2.c .bin); NULL: none */
    const char *parent_tokenizer; /* the parent's tokenizer file when not beside it (NULL: found as
                                 * the subcommands find it) */
    const json_t *report;       /* job report for MODEL_CARD.md (borrowed; NULL: none) */
    const char *name;           /* model name for metadata (NULL: "autocompress-export") */
    const char *hf_class;       /* HF: NULL = by the arch; "llama" = LlamaForCausalLM only
                                 * (a heterogeneous arch is refused); "deci" = DeciLM always */
    int (*cancelled)(void *arg); /* NULL, or asked before each tensor: nonzero stops the export
                                 * (-1 with err "export cancelled", nothing left under the final
                                 * name) */
    void *cancel_arg;
} exp_opts;

/* What an export wrote, for manifests and messages. */
typedef struct {
    char model_class[64];       /* "LlamaForCausalLM", "DeciLMForCausalLM", "llama", "deci" */
    int n_shards;
    int tokenizer;              /* 1 when tokenizer files / metadata were carried over */
    char note[512];             /* what was not carried over, or "" */
} exp_result;

/* Which HF class expresses `a`: 0 with the class name in cls (cap bytes), or -1 with the
 * reason in err (e.g. per-layer query heads, which DeciLM block_configs cannot state). */
int exp_hf_class(const arch *a, const json_t *parent_config, char *cls, size_t cap,
                 char *err, size_t errlen);

/* config.json for `a` in class `cls` (from exp_hf_class). parent_config (borrowed, may be
 * NULL) supplies fields the arch does not hold (token ids, model_type of the parent's own
 * class). Returns a NEW reference, or NULL with err. */
json_t *exp_hf_config(const arch *a, const char *cls, exp_dtype dtype, const json_t *parent_config,
                      char *err, size_t errlen);

/* Write the HF directory `dir` (created; must not exist or be empty). Returns 0, or -1
 * with err (nothing half-written is left under the final names). */
int exp_hf_write(const eng_model *m, const char *dir, const exp_opts *o, exp_result *res,
                 char *err, size_t errlen);

/* Check that GGUF (llama.cpp) can express `a`; writes "llama" or "deci" into arch_name.
 * Returns 0, or -1 with the reason in err. */
int exp_gguf_arch(const arch *a, char *arch_name, size_t cap, char *err, size_t errlen);

/* Write a GGUF file for llama.cpp. Tokenizer metadata is copied from a GGUF parent
 * (o->parent_path) byte for byte, or built from a SentencePiece-style parent tokenizer
 * (llama2.c, HF byte-fallback) as llama.cpp's "llama" vocabulary; a byte-level BPE
 * parent that is not GGUF is refused (no merge list). Without a parent the file carries
 * no tokenizer (engine round trips only) and res->note says so. Returns 0, or -1 with err. */
int exp_gguf_write(const eng_model *m, const char *path, const exp_opts *o, exp_result *res,
                   char *err, size_t errlen);

/* tokenizer.json (HF `tokenizers` format) for a SentencePiece-style tokenizer (llama2.c
 * tok*.bin, GGUF "llama"; borrowed), as transformers' LlamaConverter writes one: a BPE
 * model with byte fallback whose merges are every split (a, b) of a piece into two pieces,
 * ordered by the merged piece's score (higher first); "▁" prepended and spaces escaped by
 * the normalizer; control pieces as special added tokens; BOS/EOS by the post-processor
 * as the tokenizer adds them. HF's BPE then encodes as the engine does. Returns a NEW
 * reference, or NULL with err (a piece that is not UTF-8 text, two ids with one piece).
 * *config_out (NEW, NULL on failure) receives the matching tokenizer_config.json. */
json_t *exp_tokenizer_json_spm(const tok_tokenizer *t, json_t **config_out, char *err, size_t errlen);

/* tokenizer.json (HF `tokenizers` format) built from a GGUF file's tokenizer metadata
 * (byte-level BPE: tokenizer.ggml.model "gpt2" with a known pre-tokenizer). Returns a NEW
 * reference, or NULL with err naming what is not supported. *tok_config (NEW, may be
 * NULL on failure) receives the matching tokenizer_config.json object. */
json_t *exp_tokenizer_json_from_gguf(const char *gguf_path, json_t **tok_config, char *err, size_t errlen);

/* Write SHA256SUMS in `dir` ("<hex>  <name>" per regular file, sorted; sha256sum -c
 * reads it). Returns 0 or -1 with err. */
int exp_write_sums(const char *dir, char *err, size_t errlen);

/* Verify every file listed in dir/SHA256SUMS (and that no listed file is missing).
 * SHA256SUMS must be a regular file, read whole (a FIFO or a folder is refused, a read
 * error is an error). Returns 0 when all match, or -1 with the first mismatch
 * ("model.safetensors: sha-256 mismatch (file corrupted or truncated)") in err. */
int exp_verify_dir(const char *dir, char *err, size_t errlen);

/* Verify one file against an expected hex digest and size (size < 0: not checked).
 * Returns 0 or -1 with err. */
int exp_verify_file(const char *path, const char *hex, int64_t size, char *err, size_t errlen);

/* Load a model to export or to check an export, through storage/modelio (every format
 * the subcommands read, DeciLM directories included). A directory with SHA256SUMS is
 * verified first (a damaged file is refused). m must be uninitialized; free with
 * eng_model_free. Returns 0, or -1 with err. */
int exp_load_model(const char *path, eng_backend *be, eng_model *m, char *err, size_t errlen);

#endif
