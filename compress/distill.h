/* compress/distill.h — knowledge distillation of a pruned student from its parent.
 *
 * Logit KD (KL at a temperature, optionally mixed with the LM loss, and optionally with
 * the intermediate-state loss: engine/model.h eng_loss_spec.hidden_weight) on packed token
 * streams; AdamW with linear warm-up and cosine decay, global-norm clipping, gradient
 * accumulation; validation loss every N steps; checkpoints every N steps that a killed
 * run resumes from to the same loss curve. The token budget is honoured exactly: the
 * last step is shortened to the tokens left. Checkpoints are folders (one per step, see
 * distill.c) of safetensors files and state.json, marked DONE when complete.
 */
#ifndef AC_COMPRESS_DISTILL_H
#define AC_COMPRESS_DISTILL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/collective.h"
#include "engine/model.h"
#include "compress/textdata.h"

typedef struct {
    int64_t step, steps;            /* steps done / planned */
    int64_t tokens, total_tokens;   /* training tokens done / budget */
    double loss, kd, ce;            /* this step's mean training loss (and parts): the logit loss */
    double hidden;                  /* hidden_weight > 0: its mean cosine distance (engine/model.h) */
    double lr, grad_norm;
    double tokens_per_s, eta_s;     /* since this run (re)started */
    int has_val;                    /* 1: val_loss was measured at this step */
    double val_loss;                /* student CE on the validation stream */
    int checkpointed;               /* 1: a checkpoint was completed at this step */
} distill_progress;

/* Called after every step; a non-zero return stops the run: DISTILL_STOP_SAVE (a shutdown;
 * the run is to go on later) after saving a checkpoint where it stopped, any other (a
 * cancel) at once. */
#define DISTILL_STOP_SAVE 2
typedef int (*distill_progress_fn)(void *ctx, const distill_progress *p);

typedef struct {
    int64_t tokens;          /* budget: input tokens trained on (exact) */
    int B, T, accum;         /* micro-batch rows, sequence length, micro-batches per step */
    float lr, lr_min;        /* peak and final learning rate */
    int64_t warmup_steps;
    float beta1, beta2, eps, weight_decay, clip;
    float temperature;       /* KD temperature */
    float kd_weight;         /* 1: pure KD; <1 mixes (1-kd_weight) of CE */
    float hidden_weight;     /* > 0: the intermediate-state loss at this weight (eng_loss_spec;
                                the teacher must be the ranked parent the student was cut from) */
    int eval_every;          /* steps between validation losses (0: only at the end) */
    int64_t val_tokens;      /* validation tokens per measurement */
    int ckpt_every;          /* steps between checkpoints (0: none) */
    int keep_ckpts;          /* completed checkpoints kept (>= 1) */
    const char *ckpt_dir;    /* folder for checkpoints (created); NULL: none */
    uint64_t seed;           /* where in the text the first batch starts (then in order,
                                wrapping); the RNG is saved in checkpoints */
    int64_t stop_after;      /* > 0: stop after this step as if killed (tests) */
    eng_coll *coll;          /* data parallelism: this process is one rank of coll (NULL:
                              * alone). Every rank runs distill_run on the same models,
                              * streams and options; the step's micro-batches are shared
                              * out (i mod size), gradients summed; rank 0 validates,
                              * checkpoints and reports progress (its stop reaches all). */
    distill_progress_fn progress;
    void *progress_ctx;
} distill_opts;

typedef struct {
    int64_t steps, tokens;          /* done, over the whole run including before resume */
    int64_t resumed_from;           /* step the run resumed from (0: fresh) */
    int64_t tokens_run;             /* tokens trained by this process (after the resume) */
    double final_loss, final_val_loss;
    double wall_s;                  /* this process's part */
    double *loss_curve;             /* [steps] training loss per step (owned) */
    int checkpoint_refused;         /* 1 with a failure: the checkpoint found is another run's
                                     * (other options, text, teacher or starting student), nothing ran */
} distill_result;

/* Defaults: B 4, T 128, accum 1, lr 3e-4 -> 3e-5, warm-up 10 steps, AdamW (0.9, 0.95,
 * 1e-8, wd 0.01), clip 1.0, temperature 1, pure KD, no intermediate-state loss, eval every 50 steps on 4096
 * tokens, checkpoint every 50 keeping 2, seed 1234. tokens must still be set. */
void distill_opts_defaults(distill_opts *o);

/* Distill `student` (trained in place; grads enabled here) from `teacher` (only run
 * forward) on `train`, validating on `val` (may be NULL). With ckpt_dir, resumes from
 * its newest complete checkpoint when one exists (refusing one written with different
 * options or another student shape). Returns 0 when the budget is spent, 1 when stopped
 * by the progress callback (with DISTILL_STOP_SAVE a checkpoint is saved where it stopped)
 * or stop_after (as a kill: the newest periodic checkpoint stays resumable), -1
 * with a reason in err. *out is filled on 0 and 1 (free with distill_result_free). */
int distill_run(eng_model *teacher, eng_model *student, const td_stream *train, const td_stream *val,
                const distill_opts *o, distill_result *out, char *err, size_t errlen);
void distill_result_free(distill_result *r);

/* Mean next-token cross-entropy (nats/token) of m on the first `tokens` tokens of s
 * (rounded up to whole B x T windows, at least one). Returns 0, or -1 with a reason. */
int distill_eval_loss(eng_model *m, const td_stream *s, int B, int T, int64_t tokens, double *loss,
                      char *err, size_t errlen);

/* Planned steps for a budget: ceil(tokens / (B*T*accum)). */
int64_t distill_steps(int64_t tokens, int B, int T, int accum);

/* Learning rate at step s (0-based) of `steps`: linear warm-up to lr, cosine to lr_min. */
double distill_lr(const distill_opts *o, int64_t s, int64_t steps);

/* The learning-rate schedule (lr, lr_min, warmup_steps) of the newest complete checkpoint in
 * o->ckpt_dir into o, so that a run begun with other defaults (an older build's) resumes on
 * the schedule it began with instead of being refused: 1 when taken, 0 when o->ckpt_dir
 * holds no checkpoint, -1 with err (an unreadable checkpoint). */
int distill_resume_schedule(distill_opts *o, char *err, size_t errlen);

/* Newest complete checkpoint step in dir (0 when none). */
int64_t distill_latest_checkpoint(const char *dir);

#endif
