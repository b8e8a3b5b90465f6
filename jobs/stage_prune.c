/* jobs/stage_prune.c — the "prune" stage: slices the ranked parent to the arch the
 * search chose (compress/prune.h), reconstructs the slice by least squares on the spec's
 * calibration text when pruning.reconstruct says so (compress/reconstruct.h), and
 * writes the student as prune/student (a storage/ckpt.h snapshot plus prune.json).
 * Finished layers of the reconstruction are kept in prune/reconstruct, so a restarted
 * job goes on after the last one, to the same bytes; each layer is an event, and a
 * cancel is seen between the steps of a layer. An arch the parent cannot yield fails the
 * job with the field at fault.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compress/steps.h"
#include "jobs/pstate.h"
#include "jobs/stage.h"
#include "jobs/stages.h"
#include "storage/archjson.h"

typedef struct {
    job_ctx *ctx;
    int shown;               /* layers announced */
    int seen;                /* projections announced */
} pcb;

static int on_progress(void *c, const recon_result *r, int done, int total)
{
    pcb *cb = c;
    job_progress(cb->ctx, done, total);
    if (done > cb->shown) {
        json_t *layer = json_array();
        double before = 0, after = 0, target = 0;
        for (; layer && cb->seen < r->n; cb->seen++) {
            const recon_proj *p = &r->p[cb->seen];
            before += p->err_before;
            after += p->err_after;
            target += p->target_sq;
            double t = p->target_sq > 0 ? p->target_sq : 1;
            double e0 = p->err_before / t, e1 = p->err_after / t;   /* null when not finite, as the report */
            json_array_append_new(layer, json_pack("{s:s,s:b,s:o,s:o}", "proj", recon_proj_names[p->proj], "refit",
                                                   p->refit, "rel_error_before", isfinite(e0) ? json_real(e0) : json_null(),
                                                   "rel_error_after", isfinite(e1) ? json_real(e1) : json_null()));
        }
        char msg[256];
        snprintf(msg, sizeof msg, "reconstructed layer %d/%d: relative error %.4f -> %.4f", done, total,
                 target > 0 ? before / target : 0, target > 0 ? after / target : 0);
        job_event(cb->ctx, "prune.reconstruct.layer", msg,
                  json_pack("{s:i,s:i,s:o*}", "layer", done - 1, "layers", total, "projections", layer));
        cb->shown = done;
    }
    return job_cancelled(cb->ctx);
}

static int stage_prune_run(job_ctx *ctx, char *err, size_t errlen)
{
    eng_model *parent = ps_parent(ctx, 1, err, errlen);
    const arch *target = parent ? ps_arch(ctx, err, errlen) : NULL;
    if (!target)
        return -1;
    json_t *spec = job_ctx_spec(ctx);
    json_t *rec = json_object_get(json_object_get(spec, "pruning"), "reconstruct");
    int reconstruct = json_is_true(rec);   /* the spec's, defaults filled in (api/spec.c) */
    const td_stream *train = NULL, *val;
    if (reconstruct && ps_text(ctx, "calibration", &train, &val, err, errlen) != 0)
        return -1;
    json_t *model = json_object_get(json_object_get(spec, "model"), "path");
    json_t *tokp = json_object_get(json_object_get(spec, "model"), "tokenizer");
    json_t *man = json_pack("{s:O*,s:O*,s:s,s:I,s:I}", "parent", model, "tokenizer", tokp, "ranking",
                            "../../rank/ranking.json", "parent_params", (json_int_t)arch_params(&parent->a), "params",
                            (json_int_t)arch_params(target));
    char dir[4096], ck[4096];
    snprintf(dir, sizeof dir, "%s/student", job_ctx_stage_dir(ctx));
    snprintf(ck, sizeof ck, "%s/%s", job_ctx_stage_dir(ctx), STAGE_PRUNE_RECON);
    recon_opts ro;
    recon_opts_default(&ro);
    pcb cb = {ctx, 0, 0};
    ro.ckpt_dir = ck;
    ro.progress = on_progress;
    ro.progress_ctx = &cb;
    recon_result rr = {0};
    int rc = man ? step_prune(parent, target, dir, man, train, reconstruct ? &ro : NULL, &rr, err, errlen) : -1;
    if (!man)
        snprintf(err, errlen, "out of memory");
    json_decref(man);
    if (rc != 0) {
        recon_result_free(&rr);
        return rc;
    }
    json_t *pr = reconstruct ? recon_result_json(&rr, &ro) : json_object();
    if (pr) {
        json_object_set_new(pr, "reconstruct", json_boolean(reconstruct));
        json_object_set_new(pr, "method", json_string(reconstruct ? "least_squares" : "slice"));
    }
    static const char *const owned[] = {"pruning", NULL};
    rc = job_report_replace(ctx, owned, json_pack("{s:o*}", "pruning", pr));
    recon_result_free(&rr);
    if (rc) {
        snprintf(err, errlen, "prune: cannot merge the report");
        return -1;
    }
    char summary[8192], msg[256];
    arch_summary(target, summary, sizeof summary);
    snprintf(msg, sizeof msg, "pruned to %lld parameters (parent %lld)%s", (long long)arch_params(target),
             (long long)arch_params(&parent->a), reconstruct ? ", reconstructed by least squares" : "");
    job_event(ctx, "prune.done", msg,
              json_pack("{s:s,s:I,s:I,s:b}", "arch", summary, "params", (json_int_t)arch_params(target),
                        "parent_params", (json_int_t)arch_params(&parent->a), "reconstruct", reconstruct));
    return 0;
}

void stage_prune_register(void)
{
    stage_register("prune", stage_prune_run);
}
