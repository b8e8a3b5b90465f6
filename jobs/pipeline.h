/* jobs/pipeline.h — what a job runs and how a worker runs it: the ordered stage list a
 * spec implies, and the loop that runs a claimed job's stages from the first unfinished
 * one, recording each transition durably in the store. Signals from the server (cancel,
 * shutdown) arrive through job_signal_*; stages see them via job_cancelled().
 */
#ifndef AC_JOBS_PIPELINE_H
#define AC_JOBS_PIPELINE_H

#include <stddef.h>
#include <jansson.h>

#include "storage/artstore.h"
#include "storage/store.h"

/* The stage names (a NEW json array) a job of `kind` ("job" | "calibration") with the
 * validated spec runs: calibration jobs run ["calibrate"]; jobs run load, calibrate,
 * rank, search, prune, distill, evaluate (omitted when evaluation.tasks is empty),
 * measure, export (omitted when export is empty) — or spec.x_test_pipeline when present. */
json_t *job_pipeline_for(const char *kind, json_t *spec);

/* Run the job `id` (already claimed: status running) in this process: every stage from
 * stage_index on, then a terminal state (or back to queued when stopped by a shutdown).
 * data_dir holds jobs/<id>/<stage>/ work directories. Returns 0 when the job's outcome
 * was recorded (whatever it is), -1 with err when the store itself failed. */
int job_run(store *st, artstore *as, const char *data_dir, const char *id, char *err, size_t errlen);

#endif
