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
    int webhook_private_hosts; /* a callback_url may name a non-public address */
} spec_env;

/* Validate a job spec (borrowed). Returns a NEW normalized spec, or NULL with *status
 * (400 shape/type faults, 403 path confinement, 422 values, ranges, contradictions,
 * unknown devices, missing files) and *errors (a NEW array of {pointer, message}). */
json_t *spec_validate(json_t *in, const spec_env *env, int *status, json_t **errors);

/* Validate a calibration request {model, target, name?, metadata?} the same way. */
json_t *spec_validate_calibration(json_t *in, const spec_env *env, int *status, json_t **errors);

/* Validate an estimate request {model | arch, target}: exactly one of a model reference
 * (checked and resolved as for jobs: path inside the roots, registered id, or url) and an
 * arch (DESIGN.md §10); the target with the job spec's defaults. Returns a NEW normalized
 * request, or NULL with *status and *errors as spec_validate. */
json_t *spec_validate_estimate(json_t *in, const spec_env *env, int *status, json_t **errors);

/* Resolve a server path (absolute, or relative to data_dir) inside the roots into out.
 * Returns 0; 403 for `..`, a path outside every root or a symlink escaping one (one
 * message for all, whether the file exists or not; a path that reaches a root through
 * links is inside); 422 when it does not exist inside the roots (msg says which). */
int spec_resolve_path(const spec_env *env, const char *path, char *out, size_t outlen,
                      char *msg, size_t msglen);

/* The loader reads a model's files by name, links followed: a folder's entries (config,
 * shards, tokenizer files), or the config and tokenizers beside a model file. 0 when no
 * symlink among them leads out of the roots; else -1 with the first such entry's name in
 * bad. */
int spec_model_confined(const spec_env *env, const char *path, char *bad, size_t badlen);

/* The model format at a resolved path, by storage/modelio's one probe: "hf", "safetensors",
 * "gguf" or "llama2c"; or NULL with why (the file's name, what is wrong and the formats
 * accepted). */
const char *spec_model_format(const char *resolved, char *why, size_t whylen);

/* The path form of a model reference, as every route checks it: obj.path (required,
 * confined to the roots, a model the format probe knows) and obj.tokenizer (optional, a
 * regular file), with pointers under ptr (e.g. "/model", or "" for a body). Fills out
 * (borrowed) with the resolved path, tokenizer and format; faults are appended to errors
 * (borrowed) and *status is raised by severity (403 > 400 > 422). */
void spec_check_model_path(const spec_env *env, json_t *obj, const char *ptr, json_t *out, json_t *errors,
                           int *status);

/* JSON has one number type: 1 when j is an integer or a real with no fraction within
 * +-2^53 (179639.0 is the integer 179639), with its value in *out; 0 otherwise. */
int spec_json_int(const json_t *j, json_int_t *out);
/* 1 when j is a real with an integral value of magnitude 2^53 or more (1e19): an integer to
 * JSON Schema that spec_json_int cannot hold exactly, so out of range (422), not mistyped. */
int spec_json_big_int(const json_t *j);

/* NULL when a resolved path is a regular file, else what it is (fio_file_kind's words, or
 * "missing"); nothing is opened. */
const char *spec_file_kind(const char *resolved);

#endif
