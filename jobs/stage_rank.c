/* jobs/stage_rank.c — the "rank" stage: Minitron-style importance of the parent's FFN
 * units, heads (by KV group), hidden channels and layers on the spec's calibration text
 * (compress/rank.h). Writes rank/ranking.json (published as ranking.json); later stages
 * reuse it through ps_parent(ctx, 1, ...) instead of ranking again. Deterministic, so a
 * restarted job simply reruns it, and a later job on the same parent and calibration
 * text reuses the data dir's cached ranking.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compress/method.h"
#include "compress/rank.h"
#include "compress/steps.h"
#include "jobs/pstate.h"
#include "jobs/stage.h"
#include "jobs/stages.h"

static int on_progress(void *c, int64_t done, int64_t total)
{
    job_ctx *ctx = c;
    job_progress(ctx, done, total);
    return job_cancelled(ctx);
}

static int stage_rank_run(job_ctx *ctx, char *err, size_t errlen)
{
    if (job_ctx_get_state(ctx, "parent_ranked")) {
        snprintf(err, errlen, "rank: the parent in memory is already permuted by an earlier ranking");
        return -1;
    }
    eng_model *m = ps_parent(ctx, 0, err, errlen);
    if (!m)
        return -1;
    /* Limits no arch of the space can meet fail here, before the (long) ranking. */
    if (job_ctx_output(ctx, "calibrate", "calibration.json")) {
        const cm_tables *tables = ps_tables(ctx, err, errlen);
        if (!tables)
            return -1;
        dnas_limits lim;
        dnas_axes axes;
        method_margin margin;
        ps_axes(ctx, &axes);
        ps_limits(ctx, &m->a, tables, &axes, &lim, &margin);
        if (method_check_feasible(&m->a, tables, &lim, &axes, err, errlen) != 0)
            return -1;
    }
    const td_stream *train, *val;
    if (!m || ps_text(ctx, "calibration", &train, &val, err, errlen) != 0)
        return -1;
    rank_opts o;
    rank_opts_default(&o);
    o.progress = on_progress;
    o.progress_ctx = ctx;
    char why[256];   /* fitted here for the cache key; step_rank's own fit then changes nothing */
    if (rank_opts_fit(&o, train->n, why, sizeof why)) {
        snprintf(err, errlen, "rank: %s", why);
        return -1;
    }
    /* The ranking depends only on the parent, the calibration text and these options:
     * an earlier job's is reused (<data>/rankcache/, jobs/pstate.h ps_cache_path). */
    char key[256], cpath[4400];
    snprintf(key, sizeof key, "autocompress-rank-2 tokens %lld layer_tokens %lld B %d T %d", (long long)o.tokens,
             (long long)o.layer_tokens, o.B, o.T);
    json_t *cal_text = json_object_get(json_object_get(job_ctx_spec(ctx), "data"), "calibration");
    int cacheable = json_is_string(cal_text) &&
                    ps_cache_path(ctx, "rankcache", key, json_string_value(cal_text), cpath, sizeof cpath) == 0;
    rank_result r;
    /* a cached ranking of another shape (not this parent after all) is ranked again */
    int rc, reused = cacheable && access(cpath, R_OK) == 0 && step_rank_load(cpath, m, &r, err, errlen) == 0;
    if (!reused) {
        err[0] = 0;
        rc = step_rank(m, train, &o, &r, err, errlen);
        if (rc != 0)
            return rc;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/ranking.json", job_ctx_stage_dir(ctx));
    rc = rank_save(&r, path, err, errlen);
    if (rc == 0 && cacheable && !reused) {
        char e[512];
        if (rank_save(&r, cpath, e, sizeof e)) {
            char msg[600];
            snprintf(msg, sizeof msg, "the ranking was not cached: %s", e);
            job_event(ctx, "rank.cache_failed", msg, NULL);
        }
    }
    if (rc == 0 && reused)
        job_event(ctx, "rank.reused", "the ranking comes from an earlier job on this parent and text (rankcache)",
                  json_pack("{s:s}", "cache", cpath));
    if (rc == 0)
        rc = job_publish(ctx, "ranking.json", path, "application/json", err, errlen) != 0 ? -1 : 0;
    if (rc == 0) {
        int *order = malloc(sizeof(int) * (size_t)(r.n_layers > 0 ? r.n_layers : 1));
        json_t *lo = json_array(), *skip = json_array();
        for (int l = 0; order && l < r.n_layers; l++)
            json_array_append_new(skip, json_real(rank_skip_finite(r.layers[l].skip_layer)));
        if (order) {
            rank_layer_order(&r, order);
            for (int l = 0; l < r.n_layers; l++)
                json_array_append_new(lo, json_integer(order[l]));
        }
        free(order);
        char msg[256];
        snprintf(msg, sizeof msg, "ranked on %lld calibration tokens (layer scores on %lld); calibration loss %.4f",
                 (long long)r.tokens, (long long)r.layer_tokens, r.base_loss);
        job_event(ctx, "rank.done", msg,
                  json_pack("{s:I,s:I,s:f,s:O,s:O}", "tokens", (json_int_t)r.tokens, "layer_tokens",
                            (json_int_t)r.layer_tokens, "base_loss", r.base_loss, "layer_skip_loss", skip,
                            "layer_order", lo));
        static const char *const owned[] = {"ranking", NULL};
        if (job_report_replace(ctx, owned,
                               json_pack("{s:{s:I,s:I,s:f,s:o,s:o}}", "ranking", "tokens", (json_int_t)r.tokens,
                                         "layer_tokens", (json_int_t)r.layer_tokens, "calibration_loss",
                                         r.base_loss, "layer_skip_loss", skip, "layer_order", lo))) {
            snprintf(err, errlen, "rank: cannot merge the report");
            rc = -1;
        }
    }
    rank_free(&r);
    return rc;
}

void stage_rank_register(void)
{
    stage_register("rank", stage_rank_run);
}
