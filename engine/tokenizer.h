/* engine/tokenizer.h — text <-> token ids for the model families we load: byte-level BPE
 * (GPT-2, Llama-3, SmolLM pre-tokenizer regexes, run with PCRE2 in UTF-8/Unicode mode)
 * and SentencePiece-style BPE with byte fallback (Llama-2, llama2.c). No file I/O: the
 * builders in storage/tokload.c fill a tokenizer from tokenizer.json, GGUF or tok*.bin.
 * A built tokenizer is read-only and may be shared by threads.
 */
#ifndef AC_ENGINE_TOKENIZER_H
#define AC_ENGINE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    TOK_BYTELEVEL = 1,   /* GPT-2 byte-to-unicode mapping, regex pre-tokenization */
    TOK_SPM = 2          /* SentencePiece: spaces as U+2581 (optional), byte fallback <0xNN> */
} tok_kind;

/* Token types, numbered as GGUF's tokenizer.ggml.token_type. */
typedef enum {
    TOK_TYPE_NORMAL = 1, TOK_TYPE_UNKNOWN = 2, TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4, TOK_TYPE_UNUSED = 5, TOK_TYPE_BYTE = 6
} tok_type;

/* Options a builder sets before tok_finalize (ids are -1 when absent). */
typedef struct {
    int bos_id, eos_id, unk_id, pad_id;
    int add_bos, add_eos;         /* what tok_encode(add_special=1) adds */
    int add_dummy_prefix;         /* SPM: prepend " " to non-empty text; decode strips it */
    int escape_spaces;            /* SPM: pieces spell " " as U+2581 */
    int byte_fallback;            /* SPM: unknown bytes become <0xNN> tokens */
    int add_prefix_space;         /* byte-level: prepend " " unless text starts with one */
    int ignore_merges;            /* byte-level (Llama-3): a pre-token found whole in the vocab is kept */
} tok_config;

typedef struct tok_tokenizer tok_tokenizer;

/* New empty tokenizer of `kind` with n_vocab ids (all pieces empty until set).
 * Returns NULL on OOM or n_vocab out of (0, 2^24]. Free with tok_free. */
tok_tokenizer *tok_new(tok_kind kind, int n_vocab);
void tok_free(tok_tokenizer *t);

/* Mutable options; valid until tok_free. Change only before tok_finalize. */
tok_config *tok_config_of(tok_tokenizer *t);

/* Longest piece tok_set_token accepts, in bytes. */
#define TOK_MAX_PIECE_BYTES (1u << 20)

/* Failures of tok_set_token. */
enum { TOK_SET_OOM = -1, TOK_SET_BAD_ID = -2, TOK_SET_TOO_LONG = -3 };

/* Set token `id`: its piece (bytes as stored in the vocab: byte-level unicode or
 * U+2581-escaped), score (SPM merge priority) and type. The piece is copied.
 * Returns 0, or TOK_SET_BAD_ID (id out of range), TOK_SET_TOO_LONG (piece longer than
 * TOK_MAX_PIECE_BYTES) or TOK_SET_OOM. A later token with the same piece wins lookups.
 * Setting an id again replaces its piece: the old piece finds the token that held it
 * before, if any, or nothing. */
int tok_set_token(tok_tokenizer *t, int id, const char *piece, size_t len, float score, tok_type type);

/* Append a merge rule "left right" (rank = order of calls; lower merges first). Pieces
 * not in the vocab make the rule unusable: it is skipped and 1 is returned. Call after
 * all tok_set_token. Returns 0, 1 (skipped) or -1 (OOM). An SPM tokenizer with no
 * merges at all merges by piece scores (highest first) as SentencePiece does; a
 * byte-level one with no merges does not merge. */
int tok_add_merge(tok_tokenizer *t, const char *left, size_t llen, const char *right, size_t rlen);

/* Append a pre-tokenizer split (PCRE2 pattern, UTF + Unicode properties). Splits run in
 * order; each splits every current piece into its matches and the gaps between them.
 * Returns 0, or -1 with the compile error in err. */
int tok_add_pretok_regex(tok_tokenizer *t, const char *pattern, char *err, size_t errlen);

/* Add a named pre-tokenizer: "gpt2" (GPT-2 regex), "llama3" (Llama-3 regex), "qwen2"
 * (Qwen2's), "smollm" (digits split one by one, then GPT-2 regex). Returns 0, or -1
 * (unknown name) with err. */
int tok_set_pretok_preset(tok_tokenizer *t, const char *name, char *err, size_t errlen);

/* The presets' patterns, for builders that write them out (tokenizer.json). */
extern const char *const TOK_REGEX_GPT2;
extern const char *const TOK_REGEX_LLAMA3;
extern const char *const TOK_REGEX_QWEN2;     /* Llama-3's, with digits one at a time */

/* Check and index the tokenizer. Returns 0, or -1 with a reason (no pieces, missing
 * byte tokens for byte-level BPE, ...). Encode/decode need a finalized tokenizer. */
int tok_finalize(tok_tokenizer *t, char *err, size_t errlen);

/* Encode `len` bytes of `text` (at most TOK_MAX_TEXT_BYTES: longer text is split by the
 * caller). add_special: add BOS/EOS as configured; parse_special: control and user-defined
 * tokens written literally in the text become their ids. *ids is NEW (malloc; caller
 * frees), *n its count. Returns 0, or -1 with a reason (invalid UTF-8 for byte-level BPE,
 * too long, OOM). */
#define TOK_MAX_TEXT_BYTES ((size_t)512 << 20)   /* SentencePiece's escaped text (3 bytes a space) fits int */
int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int add_special, int parse_special,
               int **ids, size_t *n, char *err, size_t errlen);

/* Decode ids to text; skip_special: control tokens (BOS, EOS, ...) produce nothing.
 * decode(encode(x)) == x, except that with escape_spaces a literal U+2581 in x comes back
 * as a space (as in SentencePiece) and byte-level bytes the vocabulary lacks are dropped.
 * *out is NEW (malloc, NUL-terminated; caller frees), *out_len its length.
 * Returns 0, or -1 (id out of range, OOM) with a reason. */
int tok_decode(const tok_tokenizer *t, const int *ids, size_t n, int skip_special,
               char **out, size_t *out_len, char *err, size_t errlen);

/* The text bytes one token stands for (byte-level unmapped, U+2581 as space, <0xNN> as
 * that byte, control tokens as their piece). Writes at most cap bytes into buf; returns
 * the byte count needed, or -1 for a bad id. */
int tok_token_text(const tok_tokenizer *t, int id, char *buf, size_t cap);

/* Vocabulary access. tok_piece returns the stored piece (borrowed) and its length, or
 * NULL for a bad id. tok_lookup returns the id of an exact piece, or -1. */
int tok_n_vocab(const tok_tokenizer *t);
tok_kind tok_kind_of(const tok_tokenizer *t);
const char *tok_piece(const tok_tokenizer *t, int id, size_t *len);
float tok_score(const tok_tokenizer *t, int id);
tok_type tok_type_of(const tok_tokenizer *t, int id);
int tok_lookup(const tok_tokenizer *t, const char *piece, size_t len);
const tok_config *tok_cfg(const tok_tokenizer *t);

#endif
