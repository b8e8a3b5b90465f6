/* storage/modelio.h — one entry point for parent models in any supported format:
 * an HF directory (config.json + safetensors, tokenizer.json), a .safetensors file
 * with config.json beside it, a .gguf file, or a llama2.c .bin (tokenizer tok*.bin
 * beside it). Detection looks at the bytes, not only the name. Tensors come out with
 * HF names in HF layout; mio_load copies them into an engine model.
 */
#ifndef AC_STORAGE_MODELIO_H
#define AC_STORAGE_MODELIO_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/arch.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "storage/gguf.h"
#include "storage/llama2c.h"
#include "storage/safetensors.h"

typedef enum { MIO_HF_DIR = 1, MIO_SAFETENSORS, MIO_GGUF, MIO_LLAMA2C } mio_format;

typedef struct {
    char name[128];             /* HF name */
    int64_t shape[2];
    int ndim;
    const char *dtype;          /* stored dtype: "F32", "BF16", "Q4_1", ... (static string) */
    uint64_t nbytes;            /* stored bytes */
    int src;                    /* index in the format's own table */
    int permute_heads;          /* GGUF q/k: rows to un-permute for RoPE */
    int neg_exp;                /* GGUF ssm_a: stored -exp(A_log), read back as A_log */
    int sub, n_sub;             /* GGUF stacked experts: part sub of n_sub (n_sub 1: whole) */
} mio_tensor;

typedef struct {
    mio_format format;
    char path[PATH_MAX];
    char tok_path[PATH_MAX];    /* tokenizer file ("" when it lives inside the model file) */
    int tok_given;              /* 1: tok_path is the caller's (--tokenizer), not one found beside the model */
    arch a;
    int n_tensors;
    mio_tensor *t;
    st_file st;
    gguf_file gg;
    l2c_file l2;
} mio_model;

/* The formats a model may be in, for messages that list them. */
#define MIO_FORMATS "an HF directory (config.json + model.safetensors), a .safetensors file with config.json " \
                    "beside it, a GGUF file or a llama2.c checkpoint (.bin)"

/* The one format probe: which model format is at `path`, from its bytes (GGUF magic,
 * safetensors header, a llama2.c header that matches the file's length) or, for a
 * directory, its files; the name does not matter. Only regular files and directories are
 * looked at: a FIFO, socket or device is refused without being opened. Returns 0 with
 * *fmt set, or -1 with a reason that names the accepted formats. */
int mio_probe(const char *path, mio_format *fmt, char *err, size_t errlen);

/* Open the model at `path` (format from mio_probe). tokenizer_path (may be NULL) overrides where the tokenizer
 * is looked for. Reads and validates the arch and the tensor table, not the weights.
 * Returns 0, or -1 with a reason; nothing to close on failure. */
int mio_open(mio_model *m, const char *path, const char *tokenizer_path, char *err, size_t errlen);
void mio_close(mio_model *m);

const char *mio_format_name(mio_format f);

/* Tensor i as fp32 in HF layout into out (capacity n floats). 0, or -1 with a reason. */
int mio_read_tensor(const mio_model *m, int i, float *out, int64_t n, char *err, size_t errlen);

/* Check the tensor table against arch `a` without reading or allocating weights: every
 * tensor belongs to `a` with its shape, none appears twice, none is missing (a tied
 * lm_head in the file is ignored). O(n log n). Returns 0, or -1 naming the tensor at
 * fault. Call it before eng_model_init so that a small file claiming a large model is
 * refused before the claim is allocated. */
int mio_check(const mio_model *m, const arch *a, char *err, size_t errlen);

/* Copy every tensor into `em` (initialised with m->a), after mio_check against em->a,
 * so that each engine tensor is set exactly once. Returns 0, or -1 naming the tensor
 * at fault. */
int mio_load(const mio_model *m, eng_model *em, char *err, size_t errlen);

/* Build the model's tokenizer. Returns a NEW tokenizer, or NULL with a reason. */
tok_tokenizer *mio_tokenizer(const mio_model *m, char *err, size_t errlen);

/* 0 when m has a tokenizer where mio_tokenizer reads it (a regular file, or a GGUF's own
 * tokenizer.ggml.model and tokens), without building it; else -1 with mio_tokenizer's
 * reason. */
int mio_tokenizer_found(const mio_model *m, char *err, size_t errlen);

/* Convenience: open `path`, init `em` on `be`, load the weights and (if tok != NULL)
 * the tokenizer. On success em and *tok are owned by the caller (eng_model_free,
 * tok_free). Returns 0, or -1 with a reason and nothing to free. */
int mio_load_model(const char *path, const char *tokenizer_path, eng_backend *be, eng_model *em,
                   tok_tokenizer **tok, char *err, size_t errlen);

#endif
