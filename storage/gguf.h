/* storage/gguf.h — GGUF reader (v2/v3): metadata key/values, tensor infos, and tensors
 * F32/F16/BF16/Q8_0/Q4_0/Q4_1 dequantized to fp32. Read only (export writes GGUF in
 * storage/gguf_write.c). Every count, length and offset is checked against the file
 * before use. gguf_arch/gguf_hf_tensor map the `llama` architecture to the arch
 * descriptor and HF tensor names, undoing llama.cpp's RoPE row permutation of q/k;
 * gguf_name_for_hf names tensors the other way for the writer.
 */
#ifndef AC_STORAGE_GGUF_H
#define AC_STORAGE_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "engine/arch.h"

enum {
    GGUF_T_U8 = 0, GGUF_T_I8, GGUF_T_U16, GGUF_T_I16, GGUF_T_U32, GGUF_T_I32, GGUF_T_F32, GGUF_T_BOOL,
    GGUF_T_STRING, GGUF_T_ARRAY, GGUF_T_U64, GGUF_T_I64, GGUF_T_F64
};
enum { GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8, GGML_BF16 = 30 };

typedef struct {
    const char *key;            /* points into meta; not NUL-terminated */
    size_t key_len;
    uint32_t type;              /* GGUF_T_* */
    uint64_t off;               /* value (scalar or string) offset; arrays: first item */
    uint32_t arr_type;          /* arrays: item type */
    uint64_t arr_n;             /* arrays: item count */
    uint64_t *str_off;          /* arrays of strings: offset of each item (owned) */
    uint64_t end;               /* offset of the byte after the value */
} gguf_kv;

typedef struct {
    char name[96];              /* GGUF name, NUL-terminated */
    int n_dims;
    int64_t ne[4];              /* ne[0] is the fastest-varying dimension */
    uint32_t type;              /* GGML_* */
    uint64_t offset;            /* absolute byte offset in the file */
    uint64_t nbytes;
    int64_t numel;
} gguf_tensor;

typedef struct {
    const uint8_t *base;        /* the file (map or memory image): tensor data is read here */
    size_t len;
    const uint8_t *meta;        /* bytes [0, data_off): metadata and tensor infos are read here.
                                   gguf_open copies them out of the map (a file cut short under
                                   a reader cannot fault a metadata read); gguf_open_mem: base */
    uint8_t *meta_copy;         /* owned copy, or NULL */
    void *map;                  /* NULL for gguf_open_mem */
    uint32_t version;
    int n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *t;
    uint64_t data_off;
} gguf_file;

/* Open and validate (mmap), copying the metadata out of the map, all under a fio_guard: a
 * file cut short while it opens is an error naming it. Returns 0, or -1 with a reason;
 * nothing to close on failure. */
int gguf_open(gguf_file *g, const char *path, char *err, size_t errlen);
/* Same on a memory image (borrowed; must outlive g). */
int gguf_open_mem(gguf_file *g, const void *buf, size_t len, char *err, size_t errlen);
void gguf_close(gguf_file *g);

/* Metadata access. Each returns 0, or -1 when the key is absent or of another type. */
int gguf_find(const gguf_file *g, const char *key);                  /* index or -1 */
int gguf_get_int(const gguf_file *g, const char *key, int64_t *v);    /* any integer type or bool */
int gguf_get_float(const gguf_file *g, const char *key, double *v);   /* f32, f64 or integer */
int gguf_get_str(const gguf_file *g, const char *key, const char **s, size_t *len);  /* not NUL-terminated */
/* Arrays: item count and type; item accessors (index checked). */
int gguf_get_arr(const gguf_file *g, const char *key, uint32_t *item_type, uint64_t *n);
int gguf_arr_int(const gguf_file *g, int kv, uint64_t i, int64_t *v);
int gguf_arr_float(const gguf_file *g, int kv, uint64_t i, double *v);
int gguf_arr_str(const gguf_file *g, int kv, uint64_t i, const char **s, size_t *len);

/* Entry kv's value exactly as encoded after its type field, for copying it into another
 * GGUF (ggw_kv_raw): *bytes points into the file (borrowed), *len bytes. 0, or -1 for an
 * index out of range. */
int gguf_kv_raw(const gguf_file *g, int kv, const void **bytes, size_t *len);

/* Name of a ggml type ("F32", "Q4_1", ...), or "?". */
const char *gguf_type_name(uint32_t type);

/* Dequantize tensor i (GGUF layout, no renaming) into out (capacity n floats). 0 or -1. */
int gguf_read_f32(const gguf_file *g, int i, float *out, int64_t n, char *err, size_t errlen);

/* The same for part `sub` of tensor i cut into n_sub equal parts along its slowest dimension
 * (one expert of a stacked ffn_*_exps tensor). 0 or -1. */
int gguf_read_f32_sub(const gguf_file *g, int i, int sub, int n_sub, float *out, int64_t n, char *err, size_t errlen);

/* Index of the tensor named `name`, or -1. */
int gguf_tensor_index(const gguf_file *g, const char *name);

/* A per-layer integer: an array key with one entry per layer, or a scalar for all. 0, or -1
 * with err. */
int gguf_layer_int(const gguf_file *g, const char *key, int layer, int n_layers, int64_t *v, char *err, size_t errlen);

/* The arch of a `llama` GGUF (per-layer arrays for head_count, head_count_kv and
 * feed_forward_length honoured; tied embeddings when there is no output.weight), or of the
 * MoE and Mamba-2 families' (storage/gguf_families.h). a must not own memory. Returns 0, or -1
 * with a reason. */
int gguf_arch(const gguf_file *g, arch *a, char *err, size_t errlen);

/* HF name and shape of tensor i ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight",
 * shape [ne1, ne0]); *permute_heads > 0 when the rows must be un-permuted for RoPE
 * (pass the arch from gguf_arch). Returns 0, 1 for tensors the engine does not use
 * (e.g. rope_freqs), or -1 for an unknown name. */
int gguf_hf_tensor(const gguf_file *g, const arch *a, int i, char *name, size_t namelen, int64_t shape[2],
                   int *ndim, int *permute_heads);

/* The GGUF name of HF tensor `hf` ("model.layers.3.self_attn.q_proj.weight" ->
 * "blk.3.attn_q.weight"), the inverse of gguf_hf_tensor, into out; *permute_heads > 0
 * when the rows must be permuted for llama.cpp's interleaved RoPE. Returns 0, or -1 for a
 * name the `llama` architecture does not have or a layer outside a. */
int gguf_name_for_hf(const arch *a, const char *hf, char *out, size_t cap, int *permute_heads);

#endif
