/* api/spec_internal.h — what the parts of the spec validator share (api/spec.c, the
 * sections; api/spec_model.c, the model): the context every check appends its faults to,
 * and the member readers that fault on the wrong shape.
 */
#ifndef AC_API_SPEC_INTERNAL_H
#define AC_API_SPEC_INTERNAL_H

#include <jansson.h>
#include <stddef.h>

#include "api/spec.h"

typedef struct {
    json_t *errors;
    int status;
    const spec_env *env;
} vctx;

/* Append {pointer, message}; the status rises by severity (403 > 400 > 422). */
void spec_fault(vctx *v, int status, const char *pointer, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* "PARENT/I" into out (n bytes). */
void spec_ptr_index(char *out, size_t n, const char *parent, size_t i);
/* Unknown keys of obj are 400 faults. */
void spec_only_keys(vctx *v, json_t *obj, const char *ptr, const char *const *allowed);
/* Member `key` of obj when it has type `type`; NULL (and a 400 fault when present with
 * another type, or required and missing). */
json_t *spec_member(vctx *v, json_t *obj, const char *ptr, const char *key, json_type type, int required);
/* A string member of at most maxlen bytes of UTF-8 without NUL bytes; NULL (and a fault)
 * otherwise. */
json_t *spec_string_field(vctx *v, json_t *obj, const char *ptr, const char *key, size_t maxlen, int required);
/* A path-valued string member: resolved and stored into out[key]. want_file: it must
 * name a regular file (never a FIFO or device, which could block the reader). */
void spec_path_field(vctx *v, json_t *obj, const char *ptr, const char *key, int required, int want_file,
                     json_t *out);

/* spec_model.c: in.model (exactly one of path, id, url) normalized into a NEW object
 * {path, tokenizer?, format, id?}; faults for what is wrong. */
json_t *spec_check_model(vctx *v, json_t *in);
/* spec_model.c: what the job in (normalized into out: model, target, export,
 * search_space) asks of its model: a tokenizer, a context that holds the workload,
 * exports that can hold a Qwen2. */
void spec_check_model_use(vctx *v, json_t *in, json_t *out);

#endif
