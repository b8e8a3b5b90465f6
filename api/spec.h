/* api/spec.h — the constraint spec v1 (DESIGN.md §10): complete validation before a job
 * is queued, and the normalized form (defaults filled in) that is stored with the job.
 * Every fault is reported with the JSON pointer it concerns. Server-side paths resolve
 * only inside the configured roots (realpath): `..`, anything outside and symlinks that
 * escape are refused with 403, so an API user can never make the server read arbitrary
 * files.
 */
#ifndef AC_API_SPEC_H
#define AC_API_SPEC_H

#include <stddef.h>
#include <jansson.h>

#include "storage/store.h"

typedef struct {
    char **roots;           /* realpath'd allowed roots */
    int n_roots;
    const char *data_dir;   /* relative paths resolve against it */
    store *st;              /* for {"model": {"id"}}; may be NULL (ids then refused) */
    int test_stages;        /* accept x_test_* fields */
    int webhooks;           /* callback_url accepted (the server signs and sends webhooks) */
} spec_env;

/* Validate a job spec (borrowed). Returns a NEW normalized spec, or NULL with *status
 * (400 shape/type faults, 403 path confinement, 422 values, ranges, contradictions,
 * unknown devices, missing files) and *errors (a NEW array of {pointer, message}). */
json_t *spec_validate(json_t *in, const spec_env *env, int *status, json_t **errors);

/* Validate a calibration request {model, target, name?, metadata?} the same way. */
json_t *spec_validate_calibration(json_t *in, const spec_env *env, int *status, json_t **errors);

/* Resolve a server path (absolute, or relative to data_dir) inside the roots into out.
 * Returns 0; 403 for `..`, a path outside every root or a symlink escaping one; 422 when
 * it does not exist (msg says which). */
int spec_resolve_path(const spec_env *env, const char *path, char *out, size_t outlen,
                      char *msg, size_t msglen);

/* The model format at a resolved path: "hf" (directory with config.json), "gguf",
 * "llama2c" (.bin), or NULL when unrecognised. */
const char *spec_model_format(const char *resolved);

#endif
