/* jobs/pstate.h — what the stages of one job share, loaded on first use and kept in the
 * job context for the rest of the worker run: the backend, the parent model (ranked
 * once the rank stage has run), its tokenizer, the calibration tables and the packed
 * text streams. After a restart each accessor rebuilds its value from the spec and
 * the files earlier stages wrote, so a resumed job sees what an uninterrupted one saw.
 *
 * Stage outputs (under the job directory):
 *   calibrate/calibration.json   the calibration object (DESIGN.md §10)
 *   rank/ranking.json            scores and permutations (compress/rank.h)
 *   search/arch.json             the chosen arch; search/search.json its summary
 *   prune/student/               pruned snapshot (storage/ckpt.h)
 *   distill/student/             distilled snapshot; distill/ckpt/ its checkpoints (until
 *                                the stage is recorded done: stage_resume_folders)
 *   evaluate/eval.json, measure/measure.json, export/...
 */
#ifndef AC_JOBS_PSTATE_H
#define AC_JOBS_PSTATE_H

#include <stddef.h>

#include "compress/costmodel.h"
#include "compress/dnas.h"
#include "compress/method.h"
#include "compress/textdata.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "jobs/stage.h"

/* The spec's target / limits / searched axes. 0, or -1 with a reason. */
int ps_target(job_ctx *ctx, cm_target *t, char *err, size_t errlen);
/* ps_limits: the limits the search aims at (0: none): the spec's, less the margin
 * compress/method.h method_aim picks from constraints.margin_pct or the job's
 * calibration. The report checks the spec's own limits. */
void ps_limits(job_ctx *ctx, const arch *parent, const cm_tables *tables, const dnas_axes *axes, dnas_limits *lim,
               method_margin *margin);
void ps_axes(job_ctx *ctx, dnas_axes *axes);
/* An integer member of the spec by JSON path ("budgets.search_tokens"), or def. */
long long ps_int(job_ctx *ctx, const char *path, long long def);

/* Borrowed from the context (freed at the end of the worker run); NULL with a reason. */
eng_backend *ps_backend(job_ctx *ctx, char *err, size_t errlen);
tok_tokenizer *ps_tokenizer(job_ctx *ctx, char *err, size_t errlen);
/* The parent; with ranked = 1 its weights are permuted by rank/ranking.json first
 * (the rank stage must have run). */
eng_model *ps_parent(job_ctx *ctx, int ranked, char *err, size_t errlen);
/* Packed token streams of the spec's data.calibration or data.distillation text
 * (which = "calibration" | "distillation"), packed as compress/steps.h step_text_default
 * says. */
int ps_text(job_ctx *ctx, const char *which, const td_stream **train, const td_stream **val,
            char *err, size_t errlen);
/* The calibration tables written by the calibrate stage. */
const cm_tables *ps_tables(job_ctx *ctx, char *err, size_t errlen);
/* The chosen arch written by the search stage. */
const arch *ps_arch(job_ctx *ctx, char *err, size_t errlen);

/* The server's data dir, two levels above the job directory ("<data>/jobs/<id>").
 * 0, or -1 when the path does not fit buf. */
int stage_job_data_dir(job_ctx *ctx, char *buf, size_t len);

/* A cache file for a result that depends only on the job's parent model and `key`:
 * <data>/<kind>/<sha-256>.json, the digest over kind, key, the extra file (or folder)
 * named by extra_path (may be NULL; e.g. a text the result depends on) and the parent
 * files (the spec's model.path and model.tokenizer): each file up to 256 MiB by its
 * size and sha-256 (a copy or re-download still hits), larger ones by resolved path,
 * size and mtime. The folder is created. 0, or -1 when a file cannot be named
 * (then nothing is to be cached). The backend precision of the job is part of the key
 * when it is not fp32. */
int ps_cache_path(job_ctx *ctx, const char *kind, const char *key, const char *extra_path, char *path,
                  size_t len);

/* Write a JSON document atomically into the current stage's directory under `name`
 * (stolen). Returns 0, or -1 with a reason. */
int ps_write_json(job_ctx *ctx, const char *name, json_t *doc, char *err, size_t errlen);

#endif
