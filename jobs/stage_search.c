/* jobs/stage_search.c — the load and search stages. load opens the parent (failing
 * early on an unsupported family or a broken file) and records its arch; search runs the
 * spec's method (AutoCompress DNAS or the Minitron++ baseline) on the ranked parent with
 * the calibration tables and writes the chosen arch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/method.h"
#include "compress/rank.h"
#include "jobs/pstate.h"
#include "jobs/stages.h"
#include "storage/archjson.h"
#include "storage/export.h"

static int stage_load(job_ctx *ctx, char *err, size_t errlen)
{
    eng_model *m = ps_parent(ctx, 0, err, errlen);
    if (!m)
        return -1;
    json_t *ex = json_object_get(job_ctx_spec(ctx), "export"), *v;
    size_t i;
    char an[16], why[512];
    json_array_foreach(ex, i, v)   /* an MoE parent llama.cpp cannot hold: every result would fail at export */
        if (strcmp(m->a.family, "llama") && json_is_string(v) && !strcmp(json_string_value(v), "gguf") &&
            exp_gguf_arch(&m->a, an, sizeof an, why, sizeof why) != 0) {
            snprintf(err, errlen, "export gguf: the parent cannot be written as GGUF, so no pruned form of it can: %s",
                     why);
            return -1;
        }
    char summary[8192];
    arch_summary(&m->a, summary, sizeof summary);
    char msg[512];
    snprintf(msg, sizeof msg, "parent loaded: %d layers, hidden %d, %lld parameters", m->a.n_layers,
             m->a.hidden_size, (long long)arch_params(&m->a));
    job_event(ctx, "load.done", msg, json_pack("{s:s,s:I}", "arch", summary, "params", (json_int_t)arch_params(&m->a)));
    if (ps_write_json(ctx, "arch.json", arch_to_json(&m->a), err, errlen) != 0)
        return -1;
    return job_report_merge(ctx, json_pack("{s:{s:o,s:I}}", "parent", "arch", arch_to_json(&m->a), "params",
                                           (json_int_t)arch_params(&m->a))) == 0 ? 0 : -1;
}

static void on_event(void *ud, const char *type, const char *message, json_t *data)
{
    job_event(ud, type, message, data);
}

static void on_progress(void *ud, int64_t step, int64_t total)
{
    job_progress(ud, step, total);
}

static int stage_search(job_ctx *ctx, char *err, size_t errlen)
{
    const cm_tables *tables = ps_tables(ctx, err, errlen);
    eng_model *parent = tables ? ps_parent(ctx, 1, err, errlen) : NULL;
    const td_stream *train, *val;
    if (!parent || ps_text(ctx, "calibration", &train, &val, err, errlen) != 0)
        return -1;
    method_opts o;
    method_opts_default(&o);
    o.parent = parent;
    o.tables = tables;
    o.train = train;
    o.val = val;
    o.search_tokens = ps_int(ctx, "budgets.search_tokens", o.search_tokens);
    o.seed = (uint64_t)ps_int(ctx, "seed", (long long)o.seed);
    o.reconstruct = json_is_true(json_object_get(json_object_get(job_ctx_spec(ctx), "pruning"), "reconstruct"));
    o.event = on_event;
    o.progress = on_progress;
    o.cancelled = job_cancelled_hook;
    o.ud = ctx;
    /* anchored to the parent served now, the result checked there, unless the spec trusts
       the calibration as made (constraints.served_check false: reproducible from the seed) */
    if (!json_is_false(json_object_get(json_object_get(job_ctx_spec(ctx), "constraints"), "served_check")))
        o.served = method_served_target(tables);
    method_margin margin;
    ps_axes(ctx, &o.axes);
    ps_limits(ctx, &parent->a, tables, &o.axes, &o.limits, &margin);
    json_t *method = json_object_get(job_ctx_spec(ctx), "method");
    o.minitron = json_is_string(method) && !strcmp(json_string_value(method), "minitron");
    rank_result rk, *ranking = NULL;   /* Minitron++ drops layers in the ranking's order */
    if (o.minitron) {
        const char *rp = job_ctx_output(ctx, "rank", "ranking.json");
        if (!rp) {
            snprintf(err, errlen, "the ranking is missing: the rank stage must run first");
            return -1;
        }
        if (rank_load(rp, &rk, err, errlen) != 0)
            return -1;
        ranking = &rk;
    }
    arch chosen;
    json_t *doc;
    int rc = method_search(&o, ranking, &margin, &chosen, &doc, err, errlen);
    if (ranking)
        rank_free(ranking);
    if (rc != 0)
        return rc;
    rc = ps_write_json(ctx, "arch.json", arch_to_json(&chosen), err, errlen);
    if (rc == 0)
        rc = ps_write_json(ctx, "search.json", json_incref(doc), err, errlen);
    if (rc == 0) {
        char path[4400];
        snprintf(path, sizeof path, "%s/search.json", job_ctx_stage_dir(ctx));
        rc = job_publish(ctx, "search.json", path, "application/json", err, errlen);
    }
    static const char *const owned[] = {"search", NULL};
    if (rc == 0 && job_report_replace(ctx, owned,
                                      json_pack("{s:{s:O,s:O,s:O,s:I,s:O*,s:O*}}", "search", "selection_tokens",
                                                json_object_get(doc, "selection_tokens"), "wall_s",
                                                json_object_get(doc, "wall_s"), "iterations",
                                                json_object_get(doc, "iterations"), "seed", (json_int_t)o.seed,
                                                "aim", json_object_get(doc, "aim"), "served",
                                                json_object_get(doc, "served")))) {
        snprintf(err, errlen, "search: cannot merge the report");
        rc = -1;
    }
    json_decref(doc);
    arch_free(&chosen);
    return rc;
}

void stages_search_register(void)
{
    stage_register("load", stage_load);
    stage_register("search", stage_search);
}
