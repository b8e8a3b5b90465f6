/* storage/modelcard.h — MODEL_CARD.md for an exported checkpoint: the parent, the
 * deployment target, the limits, the chosen architecture (per layer), predicted and
 * measured costs and accuracy, rendered from the job report (DESIGN.md §10 shape).
 *
 * Every section is optional in the input: a missing value is written as "not measured"
 * (never invented). The card states which export formats the directory was written for.
 */
#ifndef AC_STORAGE_MODELCARD_H
#define AC_STORAGE_MODELCARD_H

#include <stddef.h>
#include <jansson.h>

#include "engine/arch.h"

typedef struct {
    const char *parent;          /* parent model path or name (required) */
    const char *model_class;     /* "LlamaForCausalLM", "DeciLMForCausalLM", ... */
    const char *dtype;           /* "bf16", "fp16", "fp32" */
    const char *formats;         /* e.g. "HF directory (safetensors), GGUF" */
    const char *tokenizer;       /* what tokenizer files ship, or why none does (NULL: not stated) */
} mc_info;

/* Render the card. `a` is the exported arch (borrowed); `report` (borrowed, may be NULL)
 * is a job report object. Returns a NEW NUL-terminated string (caller frees), or NULL on
 * OOM. */
char *mc_render(const arch *a, const json_t *report, const mc_info *info);

/* Render and write atomically to `path` (temporary file, fsync, rename).
 * Returns 0, or -1 with a reason in err. */
int mc_write(const char *path, const arch *a, const json_t *report, const mc_info *info,
             char *err, size_t errlen);

#endif
