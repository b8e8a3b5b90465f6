/* jobs/stages.h — the built-in stages: the registration of each (stages_builtin.c calls
 * them all) and the helpers several stages share. A stage's own work stays static in its
 * file; nothing here is for code outside jobs/.
 */
#ifndef AC_JOBS_STAGES_H
#define AC_JOBS_STAGES_H

#include <stddef.h>

#include "compress/costmodel.h"
#include "engine/arch.h"
#include "jobs/stage.h"
#include "storage/strbuf.h"

/* Register "load" and "search" with the stage registry (jobs/stage.h). */
void stages_search_register(void);
void stage_calibrate_register(void);
void stage_rank_register(void);
void stage_prune_register(void);
void stage_distill_register(void);
void stage_evaluate_register(void);
void stage_measure_register(void);
void stage_export_register(void);

/* The parent's shape: load/arch.json when the load stage wrote one, else the spec's
 * model.path (shape only, no weights). a must not own memory. 0, or -1 with err. */
int stage_job_parent_arch(job_ctx *ctx, arch *a, char *err, size_t errlen);
/* The job's target from its spec (cm_target_default when the spec has none). 0, or -1. */
int stage_job_target(job_ctx *ctx, cm_target *t, char *err, size_t errlen);
/* The key of the parent's cached scores (stage_evaluate.c) appended to key: the tasks (a
 * task file by path with the sha-256 of its content now), limit, seed and task data
 * folder. 0, or -1 with err (a task file that cannot be read). */
int stage_eval_parent_key(const json_t *tasks, int limit, uint64_t seed, const char *dd, strbuf *key, char *err,
                          size_t errlen);

#endif
