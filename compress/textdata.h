/* compress/textdata.h — calibration and distillation text: reading documents from the
 * shared formats (plain .txt/.raw/.tokens, jsonl with a "text" field as in c4,
 * TinyStories separated by "<|endoftext|>" lines), tokenizing them into packed token
 * streams in a seeded document order, a train/validation split, and sequential batches
 * with a resumable cursor. Whole files are read into memory (sizes of the shared data).
 */
#ifndef AC_COMPRESS_TEXTDATA_H
#define AC_COMPRESS_TEXTDATA_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    TD_FMT_AUTO = 0,    /* by extension (.jsonl/.json) or content (separator lines) */
    TD_FMT_PLAIN,       /* documents are paragraphs separated by blank lines */
    TD_FMT_JSONL,       /* one JSON object per line, document = its "text" string */
    TD_FMT_STORIES      /* documents separated by a line "<|endoftext|>" */
} td_format;

/* The largest text file read whole (4 GiB). */
#define TD_MAX_FILE_BYTES ((size_t)4 << 30)

/* Documents of a file: NUL-terminated UTF-8 strings (CRLF normalized to LF). */
typedef struct {
    char **text;
    size_t *len;
    size_t n;
} td_docs;

/* Read the documents of `path` in format fmt (TD_FMT_AUTO: detect). Empty documents
 * are dropped. Returns 0 with *out filled (free with td_docs_free), or -1 with a reason
 * (unreadable file, bad JSON on line N, no "text" field, no documents) in err. */
int td_read_docs(const char *path, td_format fmt, td_docs *out, char *err, size_t errlen);
void td_docs_free(td_docs *d);

/* Name of a format ("plain", "jsonl", "stories"), and the format a file would be read
 * as under TD_FMT_AUTO (-1 when unreadable). */
const char *td_format_name(td_format fmt);
int td_detect_format(const char *path);

/* A tokenizer as a callback: encode `len` bytes of text into a NEW malloc'd array
 * *ids of *n token ids (no special tokens added). Returns 0, or -1 with a reason. */
typedef int (*td_encode_fn)(void *ctx, const char *text, size_t len, int **ids, size_t *n,
                            char *err, size_t errlen);

/* A packed stream of token ids (owned). */
typedef struct {
    int *ids;
    size_t n;
} td_stream;

/* A 64-bit hash of n token ids (FNV-1a over each id's 32 bits): what a checkpoint records
 * of the text it was written for. */
uint64_t td_ids_hash(const int *ids, size_t n);

typedef struct {
    uint64_t seed;          /* document order: Fisher-Yates with this seed */
    double val_fraction;    /* share of documents (or of tokens, for a single document) held out */
    int sep_token;          /* id placed before every document (BOS), -1: none */
    size_t max_tokens;      /* cap on the train stream (0: none); validation capped at max_tokens*val_fraction+T */
} td_pack_opts;

/* Tokenize docs in a seeded order and pack them into a train and a validation stream:
 * [sep] doc [sep] doc ... The last ceil(n*val_fraction) documents of the shuffled order
 * (at least 1 when there are 2 or more documents and val_fraction > 0) form the
 * validation stream; with a single document its last val_fraction of tokens does.
 * val may be NULL (then everything is train). Returns 0 with both streams filled (free
 * with td_stream_free), or -1 with a reason in err. */
int td_pack(const td_docs *docs, td_encode_fn enc, void *enc_ctx, const td_pack_opts *o,
            td_stream *train, td_stream *val, char *err, size_t errlen);
void td_stream_free(td_stream *s);

/* Next batch of B rows of T inputs and their next-token targets from stream s, reading
 * consecutive windows of T+1 tokens with stride T from *cursor (wrapping to 0 when a
 * window would pass the end). tokens and targets are [B*T] (targets may be NULL).
 * Returns 0 and advances *cursor, or -1 when the stream has fewer than T+1 tokens. */
int td_batch(const td_stream *s, uint64_t *cursor, int B, int T, int *tokens, int *targets);

/* An encode callback over an engine tokenizer (ctx is a const tok_tokenizer *). */
int td_encode_tok(void *ctx, const char *text, size_t len, int **ids, size_t *n, char *err, size_t errlen);

#endif
