/* storage/safetensors.h — the safetensors format: read (mmap, F32/F16/BF16, one file or a
 * sharded set with model.safetensors.index.json) and write (atomic: temporary file,
 * fsync, rename). Headers are validated completely before any tensor is touched:
 * offsets past the end, overlapping or misshaped tensors and unknown dtypes are errors.
 * Also holds the fp16/bf16 <-> fp32 conversions the other format readers share.
 */
#ifndef AC_STORAGE_SAFETENSORS_H
#define AC_STORAGE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

typedef enum { ST_F32 = 0, ST_F16 = 1, ST_BF16 = 2 } st_dtype;

#define ST_MAX_DIMS 8

typedef struct {
    char *name;                 /* owned */
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end;        /* byte offsets into its shard's data section */
    int shard;
} st_tensor;

typedef struct {
    int n;                      /* tensors */
    st_tensor *t;
    int n_shards;
    const uint8_t **data;       /* [n_shards] start of each data section */
    uint64_t *data_len;         /* [n_shards] */
    void **maps;                /* [n_shards] mmap'ed files (NULL for st_open_mem) */
    size_t *map_len;
    json_t *metadata;           /* "__metadata__" of the first shard (new ref) or NULL */
    int *by_name;               /* [n] tensor indices in strcmp order of name (st_find) */
} st_file;

/* Open `path`: a .safetensors file, a model.safetensors.index.json, or a directory
 * holding model.safetensors or model.safetensors.index.json. Files are mmap'ed
 * read-only. Returns 0, or -1 with a reason naming the file and fault; on failure
 * nothing needs closing. Close with st_close. */
int st_open(st_file *f, const char *path, char *err, size_t errlen);

/* Parse one safetensors image in memory (borrowed: must outlive f). Same checks. */
int st_open_mem(st_file *f, const void *buf, size_t len, char *err, size_t errlen);

/* Parse n images (1..1024, borrowed) as the shards of one model: names must be unique
 * across them. Same checks and contract as st_open_mem. */
int st_open_mem_shards(st_file *f, const void *const *bufs, const size_t *lens, int n, char *err, size_t errlen);

void st_close(st_file *f);

/* Index of the tensor named `name`, or -1. O(log n). */
int st_find(const st_file *f, const char *name);

/* Convert tensor i to fp32 into out (capacity n floats, must be >= numel).
 * Returns 0, or -1 with a reason. */
int st_read_f32(const st_file *f, int i, float *out, int64_t n, char *err, size_t errlen);

/* Bytes per element and name of a dtype ("F32", "F16", "BF16"). */
size_t st_dtype_size(st_dtype d);
const char *st_dtype_name(st_dtype d);
/* Parse a dtype name; returns 0 and sets *d, or -1 when not one of the three. */
int st_dtype_parse(const char *s, st_dtype *d);

/* One tensor to write: fp32 host data with its shape. */
typedef struct {
    const char *name;
    const float *data;
    int64_t shape[ST_MAX_DIMS];
    int ndim;
} st_write_tensor;

/* Write n tensors, converted to dtype, to `path` atomically (a fio_temp_name file, fsync,
 * rename, fsync of the folder). metadata (borrowed, may be NULL) must be an object of
 * strings. Returns 0, or -1 with a reason (the temporary file is removed). */
int st_write(const char *path, const st_write_tensor *ts, int n, st_dtype dtype, json_t *metadata,
             char *err, size_t errlen);

/* Scalar conversions (IEEE half and bfloat16; round to nearest even on the way down). */
float st_f16_to_f32(uint16_t h);
float st_bf16_to_f32(uint16_t h);
uint16_t st_f32_to_f16(float f);
uint16_t st_f32_to_bf16(float f);

#endif
