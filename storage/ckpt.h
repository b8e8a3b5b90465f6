/* storage/ckpt.h — the project's own model snapshot between pipeline stages: a folder
 * with arch.json (the arch descriptor's JSON form, heterogeneous layers included) and
 * model.safetensors (fp32, HF tensor names). Written atomically; loads back bit-exact.
 * Not an export format: export (storage/export.h) writes what other engines load.
 */
#ifndef AC_STORAGE_CKPT_H
#define AC_STORAGE_CKPT_H

#include <stddef.h>

#include "engine/model.h"

/* The safetensors metadata key under which a snapshot's weights carry their arch (the
 * compact JSON text of arch.json). */
#define CKPT_ARCH_KEY "autocompress_arch"

/* Write m into folder dir (created). model.safetensors (its metadata carrying the arch)
 * and then arch.json are each written to a temporary file, fsynced and renamed. Returns 0,
 * or -1 with a reason. */
int ckpt_save(const eng_model *m, const char *dir, char *err, size_t errlen);

/* Load a snapshot from dir into m (uninitialized) on backend be. The weights' arch, when
 * they carry one, must be arch.json's (a save cut short between the two files leaves new
 * weights beside an older arch.json: refused), and every tensor of the arch must be
 * present with its shape, checked before anything is allocated. Returns 0 (free m with
 * eng_model_free), or -1 with a reason naming the file or tensor at fault; nothing to free
 * on failure. */
int ckpt_load(const char *dir, eng_backend *be, eng_model *m, char *err, size_t errlen);

/* Load a snapshot from dir into m, a model of the same arch (its weights overwritten in
 * place, with no second copy), after the checks of ckpt_load. Returns 0; -2 when dir
 * holds another arch (m untouched); -1 with a reason (a read failing part way leaves m's
 * weights partly overwritten). */
int ckpt_load_into(const char *dir, eng_model *m, char *err, size_t errlen);

#endif
