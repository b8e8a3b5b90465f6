/* jobs/report.c — assemble and publish a succeeded job's final report (report.h).
 * The stages merge their parts as they run (calibration id, ranking, search and
 * distillation summaries, accuracy, predicted vs measured costs); this file adds the
 * parts that need several stages at once (the limit rows, the chosen arch) and writes
 * the whole document as the artifact report.json. Values it cannot find stay absent.
 */
#include "jobs/report.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jobs/job_ctx.h"
#include "storage/fileio.h"
#include "storage/store.h"

static json_t *load_json(job_ctx *ctx, const char *stage, const char *name)
{
    const char *p = job_ctx_output(ctx, stage, name);
    return p ? json_load_file(p, JSON_REJECT_DUPLICATES, NULL) : NULL;
}

static double num_or(json_t *j, double def)
{
    return json_is_number(j) ? json_number_value(j) : def;
}

/* What each limit's value is, measured the way the measure stage measures it. */
static const char *limit_basis(const char *name)
{
    if (!strcmp(name, "latency_ms"))
        return "one request's end-to-end time at the target's workload (prefill and every decode step), the median "
               "of the requests served, in the target engine at the target precision";
    if (!strcmp(name, "throughput_tokens_per_s"))
        return "generated tokens per second of decode: batch x output tokens over the median decode time (the "
               "prefill is not counted)";
    if (!strcmp(name, "memory_gib"))
        return "peak memory while serving, GiB, the highest of the model's fresh serving processes: in llama.cpp "
               "the process's peak RSS; in the built-in engine (autocompress measure) on the CPU the process's RSS "
               "high-water mark since it started (program, libraries, threads, the model's load and the requests), "
               "on a GPU the device memory the engine held";
    return "the parameter count of the chosen arch (exact)";
}

/* One limit row; predicted/measured <= 0 mean unknown (null: no real measurement is 0).
 * upper: the value must not exceed the limit (latency, memory, params); else it must
 * reach it (throughput). */
static json_t *limit_row(const char *name, double limit, double predicted, double measured, int upper, json_t *aim)
{
    json_t *row = json_pack("{s:s,s:f,s:s}", "name", name, "limit", limit, "basis", limit_basis(name));
    if (!row)
        return NULL;
    json_t *aimed = json_object_get(aim, name);
    if (json_is_number(aimed))
        json_object_set_new(row, "aimed", json_real(json_number_value(aimed)));
    json_object_set_new(row, "predicted", predicted > 0 ? json_real(predicted) : json_null());
    json_object_set_new(row, "measured", measured > 0 ? json_real(measured) : json_null());
    json_object_set_new(row, "holds_predicted",
                        predicted <= 0 ? json_null() : json_boolean(upper ? predicted <= limit : predicted >= limit));
    json_object_set_new(row, "holds",
                        measured <= 0 ? json_null() : json_boolean(upper ? measured <= limit : measured >= limit));
    return row;
}

json_t *job_report_limits(json_t *constraints, json_t *pred, json_t *meas, long long result_params, json_t *aim)
{
    json_t *rows = json_array();
    if (!rows)
        return NULL;
    json_t *c;
    if ((c = json_object_get(constraints, "latency_ms")) && json_is_number(c))
        json_array_append_new(rows, limit_row("latency_ms", json_number_value(c),
                                              num_or(json_object_get(pred, "latency_ms"), -1),
                                              num_or(json_object_get(meas, "latency_ms"), -1), 1, aim));
    if ((c = json_object_get(constraints, "throughput_tokens_per_s")) && json_is_number(c))
        json_array_append_new(rows, limit_row("throughput_tokens_per_s", json_number_value(c),
                                              num_or(json_object_get(pred, "throughput_tokens_per_s"), -1),
                                              num_or(json_object_get(meas, "throughput_tokens_per_s"), -1), 0, aim));
    if ((c = json_object_get(constraints, "memory_gib")) && json_is_number(c)) {
        const double gib = 1073741824.0;
        double p = num_or(json_object_get(json_object_get(pred, "memory_bytes"), "total"), -1);
        double m = num_or(json_object_get(meas, "peak_memory_bytes"), -1);
        json_array_append_new(rows, limit_row("memory_gib", json_number_value(c), p < 0 ? -1 : p / gib,
                                              m < 0 ? -1 : m / gib, 1, aim));
    }
    if ((c = json_object_get(constraints, "params")) && json_is_number(c))
        /* the parameter count of the chosen arch is exact: predicted and measured agree */
        json_array_append_new(rows, limit_row("params", json_number_value(c), (double)result_params,
                                              (double)result_params, 1, NULL));
    return rows;
}

int job_report_finalize(job_ctx *ctx, char *err, size_t errlen)
{
    store_job j;
    if (store_job_get(ctx->st, ctx->id, &j) != 0) {
        snprintf(err, errlen, "report: reading job %s failed", ctx->id);
        return -1;
    }
    json_t *rep = json_is_object(j.report) ? j.report : NULL;
    json_t *result = json_object_get(rep, "result");
    json_t *frag = json_object();
    json_object_set_new(frag, "job_id", json_string(ctx->id));
    json_object_set(frag, "method", json_object_get(ctx->spec, "method"));
    json_object_set(frag, "target", json_object_get(ctx->spec, "target"));

    /* The chosen arch and its prediction from the search stage. */
    json_t *arch = load_json(ctx, "search", "arch.json");
    json_t *search = load_json(ctx, "search", "search.json");
    json_t *rfrag = json_object();
    if (arch)
        json_object_set(rfrag, "arch", arch);
    json_t *pred = json_object_get(result, "predicted");
    if (!pred && search)
        json_object_set(rfrag, "predicted", (pred = json_object_get(search, "predicted")));
    if (search && json_object_get(search, "parent_feasible"))
        json_object_set(frag, "parent_feasible", json_object_get(search, "parent_feasible"));
    json_t *meas = json_object_get(result, "measured");
    long long params = (long long)num_or(json_object_get(result, "params"), -1);
    json_object_set_new(frag, "limits",
                        job_report_limits(json_object_get(ctx->spec, "constraints"), pred, meas, params,
                                          json_object_get(search, "aim")));
    json_object_set_new(frag, "result", rfrag);
    int rc = job_report_merge(ctx, frag);   /* steals frag; tried again while the store is out */
    json_decref(arch);
    json_decref(search);
    store_job_clear(&j);
    if (rc != 0) {
        snprintf(err, errlen, "report: merging into the stored report failed");
        return -1;
    }

    /* The whole report as an artifact, under <job>/report/. */
    if (store_job_get(ctx->st, ctx->id, &j) != 0) {
        snprintf(err, errlen, "report: reading job %s failed", ctx->id);
        return -1;
    }
    snprintf(ctx->stage, sizeof ctx->stage, "report");
    snprintf(ctx->stage_dir, sizeof ctx->stage_dir, "%s/report", ctx->job_dir);
    char path[4400];
    snprintf(path, sizeof path, "%s/report.json", ctx->stage_dir);
    json_t *doc = json_deep_copy(j.report);
    store_job_clear(&j);
    if (!json_is_object(doc)) {
        json_decref(doc);
        snprintf(err, errlen, "report: the stored report is not an object");
        return -1;
    }
    json_object_set_new(doc, "status", json_string("succeeded"));
    json_object_set_new(doc, "complete", json_true());
    rc = -1;
    if (mkdir(ctx->stage_dir, 0755) < 0 && errno != EEXIST)
        snprintf(err, errlen, "report: %s: %s", ctx->stage_dir, strerror(errno));
    else if (fio_write_json(path, doc, JSON_INDENT(2) | JSON_SORT_KEYS, err, errlen) == 0 &&
             job_publish(ctx, "report.json", path, "application/json", err, errlen) == 0)
        rc = 0;
    json_decref(doc);
    if (rc == 0)
        job_event(ctx, "report.done", "report assembled and published as report.json", NULL);
    return rc;
}
