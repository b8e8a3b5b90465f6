/* jobs/stage_calibrate.c — the "calibrate" stage: timing tables and memory model of the
 * parent's shape on the job's target, reused from the data dir's calibration cache when
 * one exists for the same device, precision, family, shape and workload. Writes
 * calibration.json (published as timing_tables.json) and merges calibration_id plus the
 * validation summary into the report. The parent's shape comes from load/arch.json when
 * the load stage wrote one, else from the spec's arch (a calibration of an arch) or its
 * model.path (shape only).
 */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compress/calibrate.h"
#include "compress/costmodel.h"
#include "compress/steps.h"
#include "jobs/pstate.h"
#include "jobs/stage.h"
#include "jobs/stages.h"
#include "storage/archjson.h"
#include "storage/fileio.h"
#include "engine/clock.h"


int stage_job_parent_arch(job_ctx *ctx, arch *a, char *err, size_t errlen)
{
    const char *p = job_ctx_output(ctx, "load", "arch.json");
    if (p)
        return cm_load_arch(p, a, err, errlen);
    json_t *aj = json_object_get(job_ctx_spec(ctx), "arch");   /* a calibration of an arch */
    if (json_is_object(aj))
        return arch_from_json(aj, a, err, errlen);
    json_t *path = json_object_get(json_object_get(job_ctx_spec(ctx), "model"), "path");
    if (!json_is_string(path)) {
        snprintf(err, errlen, "calibrate: the parent's shape is unknown (no load/arch.json, arch or model.path)");
        return -1;
    }
    return cm_load_arch(json_string_value(path), a, err, errlen);
}

int stage_job_target(job_ctx *ctx, cm_target *t, char *err, size_t errlen)
{
    json_t *tj = json_object_get(job_ctx_spec(ctx), "target");
    if (tj)
        return cm_target_from_json(tj, "/target", t, err, errlen);
    cm_target_default(t);
    return 0;
}

static int progress_hook(void *ud, const char *what, int step, int total)
{
    job_ctx *ctx = ud;
    (void)what;
    job_progress(ctx, step, total);
    return job_cancelled(ctx);
}

/* A calibration set aside because other work kept the machine busy: an event. */
static void aside_hook(void *ud, const json_t *tried, const char *load)
{
    char msg[400];
    snprintf(msg, sizeof msg, "calibrated beside other work (%s): set aside, calibrating again", load);
    job_event(ud, "calibrate.contended", msg, json_deep_copy(tried));
}

static int stage_calibrate_run(job_ctx *ctx, char *err, size_t errlen)
{
    arch a;
    cm_target t;
    char data_dir[4096], path[4400];
    if (stage_job_parent_arch(ctx, &a, err, errlen))
        return -1;
    if (stage_job_target(ctx, &t, err, errlen) || stage_job_data_dir(ctx, data_dir, sizeof data_dir)) {
        arch_free(&a);
        if (!*err)
            snprintf(err, errlen, "calibrate: job directory path too long");
        return -1;
    }
    cal_opts o;
    cal_opts_default(&o);
    o.progress = progress_hook;
    o.cancelled = job_cancelled_hook;
    o.aside = aside_hook;
    o.ud = ctx;
    /* a hidden-size search needs a table per candidate hidden size; a calibration
     * request (no search space) calibrates what a default job searches */
    json_t *hs = json_object_get(json_object_get(job_ctx_spec(ctx), "search_space"), "hidden");
    double t0 = eng_wall_s();
    int reused = 0;
    json_t *cal = step_calibrate(data_dir, &a, &t, &o, !json_is_false(hs), 1, &reused, err, errlen);
    arch_free(&a);
    if (!cal)
        return job_cancelled(ctx) ? 1 : -1;
    double wall = eng_wall_s() - t0;
    int n = snprintf(path, sizeof path, "%s/calibration.json", job_ctx_stage_dir(ctx));
    int rc = -1;
    /* written whole and fsynced before the stage's done marker: a restarted job trusts it */
    if (n < 0 || (size_t)n >= sizeof path) {
        snprintf(err, errlen, "calibrate: stage directory path too long");
    } else if (!fio_write_json(path, cal, JSON_INDENT(1) | JSON_SORT_KEYS, err, errlen) &&
               !job_publish(ctx, "timing_tables.json", path, "application/json", err, errlen)) {
        json_t *v = json_object_get(cal, "validation");
        const char *id = json_string_value(json_object_get(cal, "id"));
        job_event(ctx, "calibrate.done", reused ? "reused a cached calibration" : "calibrated the target",
                  json_pack("{s:s,s:b,s:O?,s:f}", "calibration_id", id, "reused", reused, "entries",
                            json_object_get(cal, "entries"), "wall_s", wall));
        char note[600];
        if (cal_contended_note(cal, note, sizeof note))
            job_event(ctx, "calibrate.contended", note, json_deep_copy(json_object_get(cal, "host_load")));
        json_t *summary = json_pack("{s:O?,s:O?,s:O?,s:O?,s:O?,s:O?,s:O?}", "archs", json_object_get(v, "archs"),
                                    "latency_mape_pct", json_object_get(v, "latency_mape_pct"), "latency_max_pct",
                                    json_object_get(v, "latency_max_pct"), "memory_mape_pct",
                                    json_object_get(v, "memory_mape_pct"), "memory_max_pct",
                                    json_object_get(v, "memory_max_pct"), "naive_memory_mape_pct",
                                    json_object_get(v, "naive_memory_mape_pct"), "host_load",
                                    json_object_get(cal, "host_load"));
        static const char *const owned[] = {"calibration_id", "calibration_validation", NULL};
        rc = job_report_replace(ctx, owned, json_pack("{s:s,s:o?}", "calibration_id", id, "calibration_validation",
                                                      summary));
        if (rc)
            snprintf(err, errlen, "calibrate: cannot merge the report");
    }
    json_decref(cal);
    return rc;
}

void stage_calibrate_register(void)
{
    stage_register("calibrate", stage_calibrate_run);
}
