/* storage/ckpt.h — the project's own model snapshot between pipeline stages: a folder
 * with arch.json (the arch descriptor's JSON form, heterogeneous layers included) and
 * model.safetensors (fp32, HF tensor names). Written atomically; loads back bit-exact.
 * Not an export format: export (storage/export.h) writes what other engines load.
 */
#ifndef AC_STORAGE_CKPT_H
#define AC_STORAGE_CKPT_H

#include <stddef.h>

#include "engine/model.h"

/* Write m into folder dir (created). arch.json and model.safetensors are each written
 * to a temporary file, fsynced and renamed. Returns 0, or -1 with a reason. */
int ckpt_save(const eng_model *m, const char *dir, char *err, size_t errlen);

/* Load a snapshot from dir into m (uninitialized) on backend be. Every tensor of the
 * arch must be present with its shape. Returns 0 (free m with eng_model_free), or -1
 * with a reason naming the file or tensor at fault; nothing to free on failure. */
int ckpt_load(const char *dir, eng_backend *be, eng_model *m, char *err, size_t errlen);

#endif
