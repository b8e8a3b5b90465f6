/* jobs/stage_distill.c — the "distill" stage: logit KD of prune/student from the ranked
 * parent on the spec's distillation text for budgets.distill_tokens tokens
 * (compress/distill.h). Checkpoints go to distill/ckpt; a restarted job resumes from
 * the newest one to the same loss curve. Progress events carry tokens, loss, tokens/s
 * and ETA; cancellation is checked after every step. The result is distill/student.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compress/distill.h"
#include "compress/prune.h"
#include "compress/steps.h"
#include "jobs/job_ctx.h"
#include "jobs/pstate.h"
#include "jobs/stage.h"
#include "jobs/stages.h"
#include "storage/fileio.h"

#define DISTILL_DEFAULT_TOKENS 1000000

/* The stage's part of the report, replaced whole when it runs again. */
static const char *const DISTILL_OWNS[] = {"distillation", NULL};

typedef struct {
    job_ctx *ctx;
    int64_t every;
} dcb;

static int on_progress(void *c, const distill_progress *p)
{
    dcb *cb = c;
    job_progress(cb->ctx, p->step, p->steps);
    if (p->step == 1 || p->step == p->steps || p->step % cb->every == 0 || p->has_val) {
        char msg[256];
        snprintf(msg, sizeof msg, "step %lld/%lld: %lld/%lld tokens, loss %.4f, %.0f tokens/s, ETA %.0f s",
                 (long long)p->step, (long long)p->steps, (long long)p->tokens, (long long)p->total_tokens, p->loss,
                 p->tokens_per_s, p->eta_s);
        json_t *d = json_pack("{s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:f}", "step", (json_int_t)p->step, "steps",
                              (json_int_t)p->steps, "tokens", (json_int_t)p->tokens, "total_tokens",
                              (json_int_t)p->total_tokens, "loss", p->loss, "lr", p->lr, "grad_norm", p->grad_norm,
                              "tokens_per_s", p->tokens_per_s, "eta_s", p->eta_s, "kd", p->kd);
        if (d && p->has_val)
            json_object_set_new(d, "val_loss", json_real(p->val_loss));
        job_event(cb->ctx, "distill.progress", msg, d);
    }
    if (!job_cancelled(cb->ctx))
        return 0;
    /* a server shutting down: the job resumes later, from a checkpoint saved here */
    return job_ctx_stop_requested() && !job_ctx_cancel_requested() ? DISTILL_STOP_SAVE : 1;
}

static int stage_distill_run(job_ctx *ctx, char *err, size_t errlen)
{
    /* A zero budget (a latency-only result, or the slice with reconstruction alone): no
     * distilled student; the later stages take prune/student. */
    if (ps_int(ctx, "budgets.distill_tokens", DISTILL_DEFAULT_TOKENS) == 0) {
        const char *why = "budgets.distill_tokens is 0: the pruned student is the result";
        job_event(ctx, "distill.skipped", why, NULL);
        if (job_report_replace(ctx, DISTILL_OWNS, json_pack("{s:{s:i,s:s}}", "distillation", "tokens", 0, "skipped",
                                                            why))) {
            snprintf(err, errlen, "distill: cannot merge the report");
            return -1;
        }
        return 0;
    }
    eng_model *parent = ps_parent(ctx, 1, err, errlen);
    const td_stream *train, *val;
    if (!parent || ps_text(ctx, "distillation", &train, &val, err, errlen) != 0)
        return -1;
    const char *sdir = job_ctx_output(ctx, "prune", "student");
    if (!sdir) {
        snprintf(err, errlen, "distill: the pruned student is missing: the prune stage must run first");
        return -1;
    }
    eng_model student;
    if (prune_load_dir(sdir, parent->be, &student, NULL, err, errlen) != 0)
        return -1;
    distill_opts o;
    distill_opts_defaults(&o);
    o.tokens = ps_int(ctx, "budgets.distill_tokens", DISTILL_DEFAULT_TOKENS);
    o.seed = (uint64_t)ps_int(ctx, "seed", (long long)o.seed);
    int64_t steps = distill_steps(o.tokens, o.B, o.T, o.accum);
    o.warmup_steps = steps / 20 < 100 ? (steps / 20 > 0 ? steps / 20 : 1) : 100;
    o.eval_every = steps / 10 > 50 ? (int)(steps / 10) : 50;
    /* a checkpoint every tenth of the run (at least every 5 steps), so a crash loses
     * little even in a short run */
    o.ckpt_every = steps / 10 > 5 ? (int)(steps / 10) : 5;
    char ck[4096], out[4096];
    snprintf(ck, sizeof ck, "%s/%s", job_ctx_stage_dir(ctx), STAGE_DISTILL_CKPT);
    snprintf(out, sizeof out, "%s/student", job_ctx_stage_dir(ctx));
    o.ckpt_dir = ck;
    /* a run this job began under another build's defaults resumes on its own schedule */
    float lr0 = o.lr, lr_min0 = o.lr_min;
    int64_t warm0 = o.warmup_steps;
    int taken = distill_resume_schedule(&o, err, errlen);
    if (taken < 0) {
        eng_model_free(&student);
        return -1;
    }
    if (taken && o.lr != lr0) {
        char note[200];
        snprintf(note, sizeof note, "resuming on the schedule the run began with: lr %g -> %g, %lld warm-up steps",
                 (double)o.lr, (double)o.lr_min, (long long)o.warmup_steps);
        job_event(ctx, "distill.schedule", note, NULL);
    }
    dcb cb = {ctx, steps / 50 > 1 ? steps / 50 : 1};
    o.progress = on_progress;
    o.progress_ctx = &cb;
    json_t *model = json_object_get(json_object_get(job_ctx_spec(ctx), "model"), "path");
    json_t *man = json_pack("{s:O*}", "parent", model);
    distill_result r = {0};
    int rc = man ? step_distill(parent, &student, train, val, &o, out, man, &r, err, errlen) : -1;
    if (rc < 0 && r.checkpoint_refused && fio_remove_tree(ck) == 0) {
        /* another run's checkpoint (a build with other options, an edited data file): this
           job's distillation starts over, on this build's schedule, rather than failing for good */
        job_event(ctx, "distill.restarted", err, NULL);
        o.lr = lr0, o.lr_min = lr_min0, o.warmup_steps = warm0;
        rc = step_distill(parent, &student, train, val, &o, out, man, &r, err, errlen);
    }
    if (!man)
        snprintf(err, errlen, "out of memory");
    json_decref(man);
    eng_model_free(&student);
    if (rc == 1)
        distill_result_free(&r);
    if (rc != 0)
        return rc;
    json_t *d = json_pack("{s:I,s:f,s:I,s:I,s:I,s:f,s:f,s:I}", "tokens", (json_int_t)r.tokens, "wall_s", r.wall_s,
                          "steps", (json_int_t)r.steps, "resumed_from_step", (json_int_t)r.resumed_from, "seed",
                          (json_int_t)o.seed, "lr", (double)o.lr, "lr_min", (double)o.lr_min, "warmup_steps",
                          (json_int_t)o.warmup_steps);
    if (d && isfinite(r.final_loss))   /* none when no step ran: absent, not a perfect 0 */
        json_object_set_new(d, "final_kd_loss", json_real(r.final_loss));
    if (d && isfinite(r.final_val_loss))
        json_object_set_new(d, "val_loss", json_real(r.final_val_loss));
    if (job_report_replace(ctx, DISTILL_OWNS, json_pack("{s:o}", "distillation", d))) {
        snprintf(err, errlen, "distill: cannot merge the report");
        distill_result_free(&r);
        return -1;
    }
    char msg[256];
    snprintf(msg, sizeof msg, "distilled on %lld tokens in %lld steps, final loss %.4f", (long long)r.tokens,
             (long long)r.steps, r.final_loss);
    job_event(ctx, "distill.done", msg, NULL);
    distill_result_free(&r);
    return 0;
}

void stage_distill_register(void)
{
    stage_register("distill", stage_distill_run);
}
