/* compress/costmodel_internal.h — what the cost model's files share (costmodel.c:
 * targets and prediction; cm_tables.c: the tables' JSON; cm_cache.c: the calibration
 * cache): strict JSON readers that name the JSON pointer of each fault, and entry keys.
 * Not for code outside compress/costmodel*.c and cm_*.c.
 */
#ifndef AC_COMPRESS_COSTMODEL_INTERNAL_H
#define AC_COMPRESS_COSTMODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "compress/costmodel.h"

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

/* Unknown keys of o (at pointer at) are an error naming the first. 0, or -1. */
int cmj_check_keys(json_t *o, const char *at, const char *const *known, char *err, size_t errlen);
/* Member k of o as an integer in [lo, hi] / int / number >= lo / string (required or not;
 * absent and not required leaves *out). 0, or -1 naming "at/k". */
int cmj_int(json_t *o, const char *at, const char *k, int64_t lo, int64_t hi, int required, int64_t *out, char *err, size_t errlen);
int cmj_i32(json_t *o, const char *at, const char *k, int lo, int hi, int required, int *out, char *err, size_t errlen);
int cmj_num(json_t *o, const char *at, const char *k, double lo, int required, double *out, char *err, size_t errlen);
int cmj_str(json_t *o, const char *at, const char *k, int required, char *out, size_t outlen, char *err, size_t errlen);
/* 1 when two entries have the same key (part, hidden, heads, KV heads, FFN width). */
int cm_same_key(const cm_entry *a, const cm_entry *b);

#endif
