/* jobs/stage_measure.c — the "measure" stage: serve the job's workload on the target
 * with the parent's and the result's shapes (random weights: latency and memory do not
 * depend on weight values) and merge predicted vs measured latency, throughput and peak
 * memory into the report, with the itemized and the naive memory estimate beside them.
 * The result's shape is the first arch.json found in distill/, prune/, search/. Writes
 * measure.json (the same fragment, read by the export stage); the limit rows are the
 * report's (jobs/report.c computes them from these predicted/measured objects).
 */
#include <stdio.h>
#include <string.h>

#include "compress/costmodel.h"
#include "compress/measure.h"
#include "engine/devices.h"
#include "jobs/pstate.h"
#include "jobs/stage.h"
#include "jobs/stages.h"
#include "storage/archjson.h"

/* from jobs/stage_calibrate.c */

/* Predicted and measured objects of one arch; NULL with err on failure. */
static json_t *measure_one(eng_backend *be, const cm_tables *tb, const arch *a, const cm_target *t, char *err,
                           size_t errlen)
{
    cm_prediction p;
    ms_result r;
    ms_opts o = {.warmup = 1, .reps = 3, .seed = 1};
    int have_pred = tb && cm_predict(tb, a, &p, err, errlen) == 0;
    if (ms_measure_arch(be, a, t, &o, &r, err, errlen))
        return NULL;
    json_t *out = json_pack("{s:I,s:o}", "params", (json_int_t)arch_params(a), "measured", ms_result_to_json(&r, t));
    if (out && have_pred) {
        json_object_set_new(out, "predicted", cm_prediction_to_json(&p));
        json_object_set_new(out, "naive_weights_plus_kv_bytes", json_integer(p.naive_bytes));
    }
    return out;
}

static int stage_measure_run(job_ctx *ctx, char *err, size_t errlen)
{
    arch parent, result;
    cm_target t;
    char data_dir[4096];
    memset(&result, 0, sizeof result);
    if (stage_job_parent_arch(ctx, &parent, err, errlen))
        return -1;
    if (stage_job_target(ctx, &t, err, errlen) || stage_job_data_dir(ctx, data_dir, sizeof data_dir)) {
        arch_free(&parent);
        return -1;
    }
    const char *stages[] = {"distill", "prune", "search"};
    int have_result = 0;
    for (int i = 0; i < 3 && !have_result; i++) {
        const char *p = job_ctx_output(ctx, stages[i], "arch.json");
        if (p) {
            if (cm_load_arch(p, &result, err, errlen)) {
                arch_free(&parent);
                return -1;
            }
            have_result = 1;
        }
    }
    /* Tables of this target for the predicted side: the job's own calibration (the one
     * the search used), else a cached one that covers the parent. */
    cm_tables tb;
    int have_tb = 0;
    const char *calp = job_ctx_output(ctx, "calibrate", "calibration.json");
    json_t *cal = calp ? json_load_file(calp, 0, NULL) : cm_calibration_find(data_dir, &t, &parent);
    if (cal) {
        have_tb = cm_calibration_tables(cal, &tb, err, errlen) == 0;
        json_decref(cal);
    }
    err[0] = 0;
    int rc = -1;
    json_t *pj = NULL, *rj = NULL;
    eng_backend *be = eng_backend_new(t.device, err, errlen);
    if (!be)
        goto out;
    job_progress(ctx, 0, have_result ? 2 : 1);
    pj = measure_one(be, have_tb ? &tb : NULL, &parent, &t, err, errlen);
    if (!pj)
        goto out;
    if (job_cancelled(ctx)) {
        rc = 1;
        goto out;
    }
    job_progress(ctx, 1, have_result ? 2 : 1);
    if (have_result) {
        rj = measure_one(be, have_tb ? &tb : NULL, &result, &t, err, errlen);
        if (!rj)
            goto out;
        job_progress(ctx, 2, 2);
    }
    json_t *frag = json_pack("{s:O}", "parent", pj);
    if (rj) {
        json_object_set(frag, "result", rj);
        json_t *pred = json_object_get(rj, "predicted"), *meas = json_object_get(rj, "measured");
        if (pred)
            json_object_set_new(frag, "memory",
                                json_pack("{s:O,s:O,s:O}", "itemized", json_object_get(pred, "memory_bytes"),
                                          "naive_weights_plus_kv", json_object_get(rj, "naive_weights_plus_kv_bytes"),
                                          "measured_peak", json_object_get(meas, "peak_memory_bytes")));
    }
    job_event(ctx, "measure.done", "measured parent and result on the target", NULL);
    if (!frag) {
        snprintf(err, errlen, "measure: out of memory");
        goto out;
    }
    json_incref(frag);
    if (ps_write_json(ctx, "measure.json", frag, err, errlen)) {   /* steals one reference */
        json_decref(frag);
        goto out;
    }
    rc = job_report_merge(ctx, frag) ? -1 : 0;   /* steals the other */
    if (rc)
        snprintf(err, errlen, "measure: cannot merge the report");
out:
    json_decref(pj);
    json_decref(rj);
    if (have_tb)
        cm_tables_free(&tb);
    eng_backend_free(be);
    arch_free(&parent);
    if (have_result)
        arch_free(&result);
    return rc;
}

void stage_measure_register(void)
{
    stage_register("measure", stage_measure_run);
}
