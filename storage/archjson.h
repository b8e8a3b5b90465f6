/* storage/archjson.h — the one JSON form of the arch descriptor (DESIGN.md §10).
 *
 * Parsing is strict: unknown keys, wrong types and impossible values are errors that
 * name the JSON pointer of the fault ("/layers/3/attention/n_kv_heads: ..."). A removed
 * attention or MLP is written and read as null.
 */
#ifndef AC_STORAGE_ARCHJSON_H
#define AC_STORAGE_ARCHJSON_H

#include <stddef.h>
#include <jansson.h>

#include "engine/arch.h"

/* Render `a` as JSON. Returns a NEW reference (caller json_decref's it), or NULL on OOM.
 * "attention": null / "mlp": null for removed parts; "moe"/"mamba" only when present;
 * "attention_bias" only when true. */
json_t *arch_to_json(const arch *a);

/* Parse `j` (borrowed) into `a` (overwritten; must not own memory). Unknown keys are
 * rejected. The result is checked with arch_validate. Returns 0, or -1 with
 * "JSON-POINTER: reason" in err and `a` left zeroed (nothing to free). */
int arch_from_json(json_t *j, arch *a, char *err, size_t errlen);

/* Convenience: parse a JSON text (duplicate keys rejected). Same contract as above. */
int arch_from_json_text(const char *text, size_t len, arch *a, char *err, size_t errlen);

#endif
