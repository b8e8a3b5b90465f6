/* jobs/stage.h — the contract between the job pipeline and its stages.
 *
 * A job runs an ordered list of stages (load → calibrate → rank → search → prune →
 * distill → evaluate → measure → export). Each stage is one function with the
 * signature below. A stage reads the job's spec and earlier stages' outputs, writes its
 * own outputs as files under its stage directory, publishes the ones users download as
 * artifacts, records events and progress, and checks for cancellation between steps.
 * A stage that completes is marked done durably; a restarted job resumes at the first
 * stage not done (a stage may resume from its own checkpoints inside its directory).
 */
#ifndef AC_JOBS_STAGE_H
#define AC_JOBS_STAGE_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

typedef struct job_ctx job_ctx;

/* Returns 0 on success; -1 on failure with a message in err (becomes the job's error);
 * 1 when it stopped because the job was cancelled. */
typedef int (*stage_fn)(job_ctx *ctx, char *err, size_t errlen);

typedef struct {
    const char *name;      /* "load", "calibrate", ... */
    stage_fn run;
} stage_def;

/* Register a stage implementation under a name (call before workers run; later
 * registrations of the same name replace earlier ones, so tests may register
 * test-only stages). Returns 0, or -1 when the table is full. */
int stage_register(const char *name, stage_fn run);
/* Look up a stage; NULL when this build has none of that name. */
stage_fn stage_lookup(const char *name);

/* The job context (implemented in jobs/). All strings are borrowed from ctx. */
const char *job_ctx_id(const job_ctx *ctx);
json_t *job_ctx_spec(const job_ctx *ctx);          /* borrowed, validated spec */
const char *job_ctx_dir(const job_ctx *ctx);       /* the job's work directory */
const char *job_ctx_stage_dir(const job_ctx *ctx); /* this stage's directory (created) */
/* Path of a file another stage wrote ("<jobdir>/<stage>/<name>"); NULL if absent. */
const char *job_ctx_output(job_ctx *ctx, const char *stage, const char *name);
/* Shared in-process state between stages of one worker run (e.g. the loaded parent):
 * set steals nothing (caller keeps ownership; free_fn called at worker exit). */
void job_ctx_set_state(job_ctx *ctx, const char *key, void *value, void (*free_fn)(void *));
void *job_ctx_get_state(job_ctx *ctx, const char *key);

/* Name the server's files in text s (in place) relative to the job's folder, and any
 * other file of its data directory relative to that: what a job's client reads (its
 * events and its error) never holds the server's own paths. */
void job_ctx_unprefix(const job_ctx *ctx, char *s);

/* Append an event (type like "search.iteration", message with the server's paths made
 * relative (job_ctx_unprefix), optional data: stolen). */
int job_event(job_ctx *ctx, const char *type, const char *message, json_t *data);
/* Update progress of the current stage. */
int job_progress(job_ctx *ctx, int64_t step, int64_t total_steps);
/* An in-process observer of the job this process runs (`autocompress run` draws its
 * progress display with it): called after each job_progress (type NULL, message NULL)
 * and each job_event (step and total -1) with the current stage's name; strings are
 * borrowed for the call. One per process; fn NULL removes it. Workers set none. */
typedef void (*job_observer_fn)(void *ud, const char *stage, const char *type, const char *message,
                                int64_t step, int64_t total_steps);
void job_set_observer(job_observer_fn fn, void *ud);
/* For jobs/pipeline.c: tell the observer (only; the store records stages itself) that the
 * current stage began (type "stage.started") or completed ("stage.completed"). */
void job_observe_stage(job_ctx *ctx, const char *type);
/* 1 when cancellation was requested (or a stop, or the job is no longer running at this
 * worker's attempt: its lease ran out); stages check it between steps. */
int job_cancelled(job_ctx *ctx);
/* job_cancelled for a callback whose user data is the job_ctx (a cancel hook). */
int job_cancelled_hook(void *ctx);
/* Publish a finished file under the stage directory as a downloadable artifact
 * (sha-256 computed, metadata committed). Returns 0, or -1 with a reason in err. */
int job_publish(job_ctx *ctx, const char *name, const char *path, const char *content_type,
                char *err, size_t errlen);
/* Folders inside a stage's folder that only that stage reads, to resume itself after a
 * kill: distill's checkpoints, prune's finished reconstruction layers. Once the stage is
 * finished they are left out of the outputs shared with other hosts and removed (a
 * distillation's hold several copies of the student and its optimizer state).
 * stage_resume_folders is NULL-terminated. */
#define STAGE_DISTILL_CKPT "ckpt"
#define STAGE_PRUNE_RECON "reconstruct"
extern const char *const stage_resume_folders[];

/* After a store write failed: wait a second and say whether to try again (for a minute,
 * and not once the worker was asked to stop). For writes that are idempotent. */
int job_store_retry(int *tries);
/* Merge a JSON object into the job's report (stolen), tried again while the store is
 * unavailable (job_store_retry). 0, or -1: the stage must fail rather than finish with a
 * report that lacks its part. */
int job_report_merge(job_ctx *ctx, json_t *fragment);
/* job_report_merge, first deleting the members at the dotted paths of `owned`
 * (NULL-terminated), in one transaction: a stage whose members depend on its run (keys
 * present one time, absent the next) names everything it writes, so that its run after a
 * restart leaves nothing of the one before. */
int job_report_replace(job_ctx *ctx, const char *const *owned, json_t *fragment);

/* The one place real stages hook in (jobs/stages_builtin.c): registers every stage this
 * build has. Workers call it at start. */
void stages_register_builtin(void);
/* Test-only stages (test_sleep, test_artifact, test_crash, test_fail; jobs/stages_test.c).
 * Workers call it only when the environment has AC_TEST_STAGES=1. */
void stages_register_test(void);
/* 1 when AC_TEST_STAGES=1 is set in this process's environment (test stages allowed). */
int stages_test_enabled(void);

/* Async-signal-safe: ask the running job to cancel (SIGUSR1) or stop for a shutdown
 * (SIGTERM); stages notice at their next job_cancelled() check. */
void job_signal_cancel(void);
void job_signal_stop(void);

/* Artifact names: 1..200 chars of [A-Za-z0-9._-], not starting with '.'. 1 if valid. */
int job_artifact_name_ok(const char *name);

#endif
