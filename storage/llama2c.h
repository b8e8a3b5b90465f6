/* storage/llama2c.h — Karpathy's llama2.c legacy checkpoint (.bin): a 7-int32 header then
 * fp32 tensors in a fixed order (shared/data/PROVENANCE.md). Read only. Tensors come out
 * under HF names and in HF layout: llama2.c's RoPE rotates interleaved pairs, so wq/wk
 * rows are permuted to the rotate_half order the engine uses.
 */
#ifndef AC_STORAGE_LLAMA2C_H
#define AC_STORAGE_LLAMA2C_H

#include <stddef.h>
#include <stdint.h>

#include "engine/arch.h"

typedef struct {
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
    int shared_classifier;      /* 1 when the header's vocab_size was positive */
} l2c_header;

typedef struct {
    char name[96];              /* HF name */
    int64_t shape[2];
    int ndim;
    uint64_t offset;            /* byte offset of the first float in the file */
    int permute_heads;          /* >0: rows are interleaved-pair RoPE with this many heads */
} l2c_tensor;

typedef struct {
    l2c_header h;
    const uint8_t *base;        /* the whole file */
    size_t len;
    void *map;                  /* NULL for l2c_open_mem */
    int n;
    l2c_tensor *t;
} l2c_file;

/* Validate a header (the file's first 28 bytes, `head`) against sane limits and the
 * file's length: what makes a file a llama2.c checkpoint, whatever its name. Fills *H.
 * Returns 0, or -1 with a reason. */
int l2c_header_check(const void *head, uint64_t file_len, l2c_header *H, char *err, size_t errlen);

/* Open and validate a checkpoint (mmap). The file length must match the header exactly
 * (the optional classifier included). Returns 0, or -1 with a reason; nothing to close
 * on failure. */
int l2c_open(l2c_file *f, const char *path, char *err, size_t errlen);
/* Same on a memory image (borrowed; must outlive f). */
int l2c_open_mem(l2c_file *f, const void *buf, size_t len, char *err, size_t errlen);
void l2c_close(l2c_file *f);

/* The arch of the checkpoint (family llama, rope_theta 10000, norm_eps 1e-5). a must not
 * own memory. Returns 0, or -1 with a reason. */
int l2c_arch(const l2c_file *f, arch *a, char *err, size_t errlen);

/* Tensor i as fp32 in HF layout into out (capacity n floats). Returns 0, or -1. */
int l2c_read_f32(const l2c_file *f, int i, float *out, int64_t n, char *err, size_t errlen);

/* Undo interleaved-pair RoPE row order in place: for each head h of `n_heads`, row
 * h*D + 2i + p moves to h*D + p*D/2 + i (D = rows/n_heads). w is [rows, cols]. Shared
 * with the GGUF reader (llama.cpp's converter applies the same permutation).
 * Returns 0, or -1 on OOM or rows not divisible by 2*n_heads. */
int l2c_unpermute_rope_rows(float *w, int64_t rows, int64_t cols, int n_heads);

#endif
