/* storage/gguf_write.h — a GGUF v3 writer: metadata key/values and tensors in F32, F16,
 * BF16 or Q8_0, laid out exactly as llama.cpp's gguf reader expects (32-byte alignment,
 * tensor offsets relative to the aligned data section).
 *
 * Usage: ggw_new, add metadata (typed helpers, or ggw_kv_raw to copy an encoded value from
 * another GGUF verbatim), declare every tensor (ggw_tensor), ggw_begin(path) writes the
 * header to "path.tmp", then ggw_write_tensor streams each tensor's fp32 data in
 * declaration order, converting row by row; ggw_finish fsyncs and renames to path.
 * Tensors are never held whole in the writer. Shapes use GGUF order: ne[0] is the
 * innermost (row length), so an HF weight [out, in] is ne = {in, out}.
 */
#ifndef AC_STORAGE_GGUF_WRITE_H
#define AC_STORAGE_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "storage/gguf.h"

/* ggml tensor types this writer produces (values are ggml's). */
typedef enum { GGW_F32 = 0, GGW_F16 = 1, GGW_Q8_0 = 8, GGW_BF16 = 30 } ggw_type;

/* Metadata value types are storage/gguf.h's GGUF_T_* (the format's numbering). */

#define GGW_ALIGNMENT 32
#define GGW_QK8_0 32

typedef struct ggw ggw;

/* A new, empty writer; NULL on OOM. Free with ggw_free. */
ggw *ggw_new(void);
/* Free the writer; a begun but unfinished file is removed. Safe on NULL. */
void ggw_free(ggw *w);

/* Metadata. Each returns 0, or -1 on OOM or a duplicate key. Strings are copied. */
int ggw_kv_u32(ggw *w, const char *key, uint32_t v);
int ggw_kv_i32(ggw *w, const char *key, int32_t v);
int ggw_kv_f32(ggw *w, const char *key, float v);
int ggw_kv_bool(ggw *w, const char *key, int v);
int ggw_kv_str(ggw *w, const char *key, const char *v);
int ggw_kv_arr_i32(ggw *w, const char *key, const int32_t *v, size_t n);
int ggw_kv_arr_u32(ggw *w, const char *key, const uint32_t *v, size_t n);
int ggw_kv_arr_f32(ggw *w, const char *key, const float *v, size_t n);
/* Strings given as pointers and byte lengths (GGUF strings need not be NUL-free). */
int ggw_kv_arr_str(ggw *w, const char *key, const char *const *s, const size_t *len, size_t n);
/* A value already encoded in GGUF form (for copying from another file): `type` is the
 * value type, `bytes` its encoding exactly as it follows the type field. */
int ggw_kv_raw(ggw *w, const char *key, uint32_t type, const void *bytes, size_t len);
/* 1 if key was added already. */
int ggw_has_key(const ggw *w, const char *key);

/* Declare the next tensor: name, GGUF shape ne[0..n_dims), type. Q8_0 needs ne[0] % 32
 * == 0. Returns 0, or -1 with a reason in err. */
int ggw_tensor(ggw *w, const char *name, const int64_t *ne, int n_dims, ggw_type type,
               char *err, size_t errlen);

/* Write the header, metadata and tensor table to path.tmp. Returns 0 or -1 with err. */
int ggw_begin(ggw *w, const char *path, char *err, size_t errlen);

/* Write the next declared tensor from n fp32 values (n must equal its element count),
 * converted to its type. Returns 0, or -1 with err (wrong order or count, write error). */
int ggw_write_tensor(ggw *w, const float *data, int64_t n, char *err, size_t errlen);
/* Ask fn(arg) before each tensor is written: nonzero makes ggw_write_tensor fail with
 * "cancelled" in err (the file is left unfinished under its temporary name, removed by
 * ggw_free). fn NULL: never. */
void ggw_set_cancel(ggw *w, int (*fn)(void *arg), void *arg);

/* Check every declared tensor was written, fsync and rename path.tmp to path.
 * Returns 0, or -1 with err (the temporary file is removed). */
int ggw_finish(ggw *w, char *err, size_t errlen);

/* F16/BF16 conversion is storage/safetensors.h's (st_f32_to_f16, st_f32_to_bf16).
 * Quantize k values (k % 32 == 0) to Q8_0 blocks (34 bytes each: fp16 scale, 32 int8),
 * as ggml's reference quantize_row_q8_0. */
void ggw_quantize_q8_0(const float *x, int64_t k, uint8_t *out);
/* Bytes of a row of n elements in type t (0 when n does not fit the block size). */
size_t ggw_row_bytes(ggw_type t, int64_t n);

#endif
