/* storage/tokload.h — build an engine tokenizer (engine/tokenizer.h) from the files that
 * describe one: llama2.c tok*.bin, GGUF tokenizer.ggml.* metadata, or HF tokenizer.json
 * (BPE models: byte-level, or SentencePiece-style with byte fallback). Unsupported
 * tokenizer kinds are errors that say what was found.
 */
#ifndef AC_STORAGE_TOKLOAD_H
#define AC_STORAGE_TOKLOAD_H

#include <stddef.h>

#include "engine/tokenizer.h"
#include "storage/gguf.h"

/* llama2.c tokenizer export: int32 max_token_length, then n_vocab records (float32
 * score, int32 byte length, bytes). Ids 0/1/2 are <unk>/BOS/EOS, <0xNN> pieces bytes.
 * Returns a NEW finalized tokenizer, or NULL with a reason in err. */
tok_tokenizer *tokload_llama2c(const char *path, int n_vocab, char *err, size_t errlen);
tok_tokenizer *tokload_llama2c_mem(const void *buf, size_t len, int n_vocab, char *err, size_t errlen);

/* The engine's pre-tokenizer preset (tok_set_pretok_preset) for a GGUF
 * tokenizer.ggml.pre name (llama.cpp's), with whether its BPE ignores merges for words in
 * the vocabulary (Llama-3); NULL when there is none. The names, for messages: */
const char *tokload_gguf_pretok(const char *pre, int *ignore_merges);
#define TOKLOAD_GGUF_PRETOKS "default, gpt-2, olmo, smollm, starcoder, refact, llama-bpe, qwen2"

/* From GGUF metadata (tokenizer.ggml.model "llama" or "gpt2" with a known
 * tokenizer.ggml.pre). Returns a NEW finalized tokenizer, or NULL with a reason. */
tok_tokenizer *tokload_gguf(const gguf_file *g, char *err, size_t errlen);

/* From an HF tokenizer.json. BOS/EOS ids its post-processor does not name are taken
 * from tokenizer_config.json, special_tokens_map.json or config.json beside it (in that
 * order; they set the ids, not whether encode adds them). A SentencePiece-style BPE gets
 * piece scores rebuilt from its merge order (for writers of score-driven vocabularies;
 * encoding follows the merges). Returns a NEW finalized
 * tokenizer, or NULL with a reason (a named token absent from the vocabulary included). */
tok_tokenizer *tokload_hf_json(const char *path, char *err, size_t errlen);

#endif
