/* jobs/stage_prune.c — the "prune" stage: slices the ranked parent to the arch the
 * search chose (compress/prune.h) and writes the student as prune/student (a
 * storage/ckpt.h snapshot plus prune.json). Exact and deterministic: a restarted job
 * reruns it. An arch the parent cannot yield fails the job with the field at fault.
 */
#include <stdio.h>
#include <string.h>

#include "compress/steps.h"
#include "jobs/pstate.h"
#include "jobs/stage.h"
#include "jobs/stages.h"
#include "storage/archjson.h"

static int stage_prune_run(job_ctx *ctx, char *err, size_t errlen)
{
    eng_model *parent = ps_parent(ctx, 1, err, errlen);
    const arch *target = parent ? ps_arch(ctx, err, errlen) : NULL;
    if (!target)
        return -1;
    json_t *model = json_object_get(json_object_get(job_ctx_spec(ctx), "model"), "path");
    json_t *tokp = json_object_get(json_object_get(job_ctx_spec(ctx), "model"), "tokenizer");
    json_t *man = json_pack("{s:O*,s:O*,s:s,s:I,s:I}", "parent", model, "tokenizer", tokp, "ranking",
                            "../../rank/ranking.json", "parent_params", (json_int_t)arch_params(&parent->a), "params",
                            (json_int_t)arch_params(target));
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/student", job_ctx_stage_dir(ctx));
    int rc = man ? step_prune(parent, target, dir, man, err, errlen) : -1;
    if (!man)
        snprintf(err, errlen, "out of memory");
    json_decref(man);
    if (rc != 0)
        return -1;
    char summary[8192], msg[256];
    arch_summary(target, summary, sizeof summary);
    snprintf(msg, sizeof msg, "pruned to %lld parameters (parent %lld)", (long long)arch_params(target),
             (long long)arch_params(&parent->a));
    job_event(ctx, "prune.done", msg,
              json_pack("{s:s,s:I,s:I}", "arch", summary, "params", (json_int_t)arch_params(target), "parent_params",
                        (json_int_t)arch_params(&parent->a)));
    return 0;
}

void stage_prune_register(void)
{
    stage_register("prune", stage_prune_run);
}
