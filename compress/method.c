/* compress/method.c — dispatch between the two search methods, the search document, and
 * what the export formats let both methods search (dnas_axes_for_exports). */
#include "compress/method.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/distill.h"
#include "compress/measure.h"
#include "compress/minitron.h"
#include "compress/prune.h"
#include "compress/reconstruct.h"
#include "compress/servecheck.h"
#include "storage/archjson.h"

static void emit(const method_opts *o, const char *type, const char *msg, json_t *data)
{
    if (o->event)
        o->event(o->ud, type, msg, data);
    else
        json_decref(data);
}

static json_t *penalty_json(const search_penalty *pen)
{
    json_t *obj = json_object();
    for (int m = 0; obj && m < SM_COUNT; m++)
        if (pen->lambda2[m] != 0 || pen->lambda1[m] != 0)
            json_object_set_new(obj, search_metric_names[m],
                                json_pack("{s:f,s:f,s:f,s:f}", "expected", pen->expected[m], "gap", pen->gap[m],
                                          "lambda1", pen->lambda1[m], "lambda2", pen->lambda2[m]));
    return obj;
}

typedef struct {
    const method_opts *o;
    int every;
} dnas_cb;

/* About 50 iteration events per search, plus the first and the last. */
static int on_dnas(void *c, const dnas_progress *p)
{
    dnas_cb *cb = c;
    const method_opts *o = cb->o;
    if (o->progress)
        o->progress(o->ud, p->iteration, p->iterations);
    if (p->iteration == 1 || p->iteration == p->iterations || p->iteration % cb->every == 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "iteration %d/%d: kd %.4f, tau %.3f", p->iteration, p->iterations, p->kd_loss, p->tau);
        emit(o, "search.iteration", msg,
             json_pack("{s:i,s:f,s:f,s:f,s:I,s:o,s:s}", "iteration", p->iteration, "kd_loss", p->kd_loss, "tau",
                       p->tau, "penalty_weight", p->penalty_weight, "tokens", (json_int_t)p->tokens, "limits",
                       penalty_json(&p->pen), "arch", p->arch_summary ? p->arch_summary : ""));
    }
    return o->cancelled ? o->cancelled(o->ud) : 0;
}

typedef struct {
    const method_opts *o;
    int64_t tokens;
    int trial;
} mn_cb;

/* A trial's reconstruction stops when the search is cancelled. */
static int on_recon(void *c, const recon_result *r, int done, int total)
{
    const method_opts *o = c;
    (void)r;
    (void)done;
    (void)total;
    return o->cancelled ? o->cancelled(o->ud) : 0;
}

/* A trial's distillation stops, at its next step, when the search is cancelled. */
static int on_trial_step(void *c, const distill_progress *p)
{
    const method_opts *o = c;
    (void)p;
    return o->cancelled ? o->cancelled(o->ud) : 0;
}

/* One Minitron++ trial: prune the ranked parent, distill briefly, validation loss. */
static int mn_trial(void *c, const arch *cand, double *val_loss, int64_t *tokens, char *err, size_t errlen)
{
    mn_cb *cb = c;
    const method_opts *o = cb->o;
    eng_model student;
    if (prune_to_arch(o->parent, cand, &student, err, errlen) != 0)
        return -1;
    if (o->reconstruct) {
        recon_opts ro;
        recon_opts_default(&ro);
        ro.progress = on_recon;
        ro.progress_ctx = (void *)o;
        recon_result rr;
        int rc = recon_run(o->parent, &student, o->train, &ro, &rr, err, errlen);
        if (rc >= 0)
            recon_result_free(&rr);
        if (rc != 0) {
            eng_model_free(&student);
            return rc;
        }
    }
    distill_opts d;
    distill_opts_defaults(&d);
    d.tokens = cb->tokens;
    d.eval_every = 0;
    d.ckpt_every = 0;
    d.seed = o->seed ? o->seed : d.seed;
    d.progress = on_trial_step;
    d.progress_ctx = (void *)o;
    distill_result r;
    int rc = distill_run(o->parent, &student, o->train, NULL, &d, &r, err, errlen);
    if (rc == 0) {
        *tokens = r.tokens;
        distill_result_free(&r);
        rc = distill_eval_loss(&student, o->val ? o->val : o->train, d.B, d.T, 16384, val_loss, err, errlen);
    } else if (rc == 1) {
        distill_result_free(&r);
    }
    eng_model_free(&student);
    if (rc == 0) {
        char summary[8192], msg[256];
        arch_summary(cand, summary, sizeof summary);
        snprintf(msg, sizeof msg, "candidate %d: validation loss %.4f after %lld tokens", ++cb->trial, *val_loss,
                 (long long)*tokens);
        emit(o, "search.candidate", msg,
             json_pack("{s:s,s:f,s:I}", "arch", summary, "val_loss", *val_loss, "tokens", (json_int_t)*tokens));
        if (o->progress)
            o->progress(o->ud, cb->trial, o->minitron_candidates > 0 ? o->minitron_candidates : 4);
        if (o->cancelled && o->cancelled(o->ud))
            return 1;
    }
    return rc;
}

void method_opts_default(method_opts *o)
{
    dnas_opts d;
    dnas_opts_defaults(&d);
    memset(o, 0, sizeof *o);
    o->axes.hidden = o->axes.heads = o->axes.ffn = o->axes.experts = o->axes.mamba = o->axes.depth = 1;
    o->axes.expert_widths = o->axes.shared_widths = o->axes.latent = 1;
    o->seed = d.seed;
    o->search_tokens = 2000000;
}

int method_check_feasible(const arch *parent, const cm_tables *tables, const dnas_limits *limits,
                          const dnas_axes *axes, char *err, size_t errlen)
{
    search_space sp;
    search_costs costs;
    if (dnas_space_build(parent, tables, limits, axes, &sp, &costs, err, errlen) != 0)
        return -1;
    search_choice c;
    int rc = -1;
    if (search_choice_init(&c, &sp) == 0) {
        rc = search_choice_cheapest_layer(&sp, &costs, &c) ? -1 : 0;
        for (int m = 0; m < SM_COUNT; m++)
            if (costs.t[m].active && search_choice_cost(&sp, &costs.t[m], &c) > costs.t[m].limit)
                rc = -1;
        search_choice_free(&c);
        if (rc != 0)
            dnas_describe_infeasible(&sp, &costs, err, errlen);
    } else {
        snprintf(err, errlen, "out of memory");
    }
    dnas_space_free(&sp, &costs);
    return rc;
}

static void tighten(const dnas_limits *limits, double latency_pct, double memory_pct, dnas_limits *out)
{
    double keep_t = 1.0 - latency_pct / 100.0, keep_m = 1.0 - memory_pct / 100.0;
    *out = *limits;
    out->latency_ms = limits->latency_ms * keep_t;
    out->throughput_tps = limits->throughput_tps / keep_t;
    out->memory_bytes = limits->memory_bytes * keep_m;
}

/* The calibration's largest held-out error for a quantity ("latency_max_pct"), within
 * [0, 50]; -1 when the calibration has no validation. */
static double validation_max_pct(json_t *validation, const char *key)
{
    json_t *n = json_object_get(validation, "archs"), *v = json_object_get(validation, key);
    if (!json_is_integer(n) || json_integer_value(n) < 1 || !json_is_number(v))
        return -1;
    double x = json_number_value(v);
    return x < 0 ? 0 : x > 50 ? 50 : x;
}

/* The median over the calibration's held-out archs of how far apart their two fresh
 * processes' latencies are, |a - b| / min(a, b) in percent, within [1, 10]; 3 without them. */
static double process_spread_pct(json_t *validation)
{
    json_t *rows = json_object_get(validation, "rows");
    size_t n = json_array_size(rows), k = 0;
    double *v = malloc(sizeof(double) * (n ? n : 1)), pct = 3;
    for (size_t i = 0; v && i < n; i++) {
        json_t *pl = json_object_get(json_array_get(rows, i), "measured_process_latencies_ms");
        double a = json_number_value(json_array_get(pl, 0)), b = json_number_value(json_array_get(pl, 1));
        if (json_array_size(pl) == 2 && a > 0 && b > 0)
            v[k++] = 100.0 * fabs(a - b) / (a < b ? a : b);
    }
    if (k)
        pct = ms_median(v, (int)k);
    free(v);
    return pct < 1 ? 1 : pct > 10 ? 10 : pct;
}

void method_aim(const arch *parent, const cm_tables *tables, const dnas_axes *axes, json_t *validation,
                double given_pct, const dnas_limits *limits, dnas_limits *aimed, method_margin *margin)
{
    memset(margin, 0, sizeof *margin);
    margin->given = *limits;
    margin->served_pct = process_spread_pct(validation);
    if (given_pct >= 0) {   /* the user's margin holds for a measurement too */
        margin->served_pct = given_pct > margin->served_pct ? given_pct : margin->served_pct;
        margin->latency_pct = margin->memory_pct = given_pct;
        snprintf(margin->source, sizeof margin->source, "spec");
        tighten(limits, given_pct, given_pct, aimed);
        return;
    }
    double lat = validation_max_pct(validation, "latency_anchored_max_pct");
    if (lat < 0)
        lat = validation_max_pct(validation, "latency_max_pct");
    double mem = validation_max_pct(validation, "memory_max_pct");
    if (lat < 0 || mem < 0) {
        snprintf(margin->source, sizeof margin->source, "none: the calibration has no held-out validation");
        *aimed = *limits;
        return;
    }
    margin->latency_pct = lat;
    margin->memory_pct = mem;
    snprintf(margin->source, sizeof margin->source, "calibration");
    tighten(limits, lat, mem, aimed);
    char scratch[512];
    if (parent && tables && axes && method_check_feasible(parent, tables, aimed, axes, scratch, sizeof scratch)) {
        *aimed = *limits;
        margin->latency_pct = margin->memory_pct = 0;
        snprintf(margin->source, sizeof margin->source,
                 "none: no arch of the search space meets the limits less the calibration's error");
    }
}

void method_served_limits(const method_margin *margin, dnas_limits *out)
{
    double keep = 1.0 - margin->served_pct / 100.0;
    memset(out, 0, sizeof *out);
    out->latency_ms = margin->given.latency_ms * keep;
    out->throughput_tps = margin->given.throughput_tps / keep;
    out->memory_bytes = margin->given.memory_bytes * (1.0 - margin->memory_pct / 100.0);
}

json_t *method_aim_json(const dnas_limits *aimed, const method_margin *margin)
{
    json_t *j = json_pack("{s:{s:f,s:f,s:f},s:s}", "margin", "latency_pct", margin->latency_pct, "memory_pct",
                          margin->memory_pct, "served_pct", margin->served_pct, "source", margin->source);
    if (!j)
        return NULL;
    if (aimed->latency_ms > 0)
        json_object_set_new(j, "latency_ms", json_real(aimed->latency_ms));
    if (aimed->throughput_tps > 0)
        json_object_set_new(j, "throughput_tokens_per_s", json_real(aimed->throughput_tps));
    if (aimed->memory_bytes > 0)
        json_object_set_new(j, "memory_gib", json_real(aimed->memory_bytes / 1073741824.0));
    return j;
}

/* A method's choice and what the search document says of it. */
typedef struct {
    arch arch;                  /* the chosen arch (owned) */
    cm_prediction predicted;
    int64_t selection_tokens;
    int iterations;
    int parent_feasible;
    double wall_s;
    json_t *extra;              /* the method's own members of the document (NEW) */
} found;

typedef struct {
    const method_opts *o;
    sc_check *sc;
} served_cb;

/* The engine a served check runs in, for messages. */
static const char *served_engine(const cm_target *t)
{
    return cm_target_llamacpp(t) ? "llama.cpp" : "the built-in engine";
}

/* Append to msg that the serving recorded in obj (its host_load) was beside other work. */
static void served_load_note(const json_t *obj, char *msg, size_t cap)
{
    char load[256];
    size_t n = strlen(msg);
    if (ms_host_load_note(json_object_get(obj, "host_load"), load, sizeof load))
        snprintf(msg + n, cap > n ? cap - n : 0, "; served beside other work (%s): slow and uneven", load);
}

/* DNAS's check: the arch served in the target engine beside the parent. */
static int on_check(void *c, const arch *a, const cm_prediction *pred, cm_prediction *m, char *err, size_t errlen)
{
    served_cb *cb = c;
    if (cb->o->cancelled && cb->o->cancelled(cb->o->ud)) {
        snprintf(err, errlen, "cancelled");
        return -1;
    }
    if (sc_measure(cb->sc, a, pred, m, err, errlen))
        return -1;
    char msg[512];
    snprintf(msg, sizeof msg, "served the chosen arch in %s: %.1f ms (predicted %.1f), %.1f MiB peak",
             served_engine(cb->o->served), m->latency_ms, pred->latency_ms, m->total / 1048576.0);
    json_t *checks = json_object_get(sc_doc(cb->sc), "checks"), *row = json_array_get(checks, json_array_size(checks) - 1);
    served_load_note(row, msg, sizeof msg);
    emit(cb->o, "search.check", msg, json_deep_copy(row));
    return 0;
}

/* The AutoCompress search (DNAS). 0 with *f filled, 1 when cancelled, -1 with a reason. */
static int run_dnas(const method_opts *o, sc_check *sc, const method_margin *margin, found *f, char *err,
                    size_t errlen)
{
    dnas_opts d;
    dnas_opts_defaults(&d);
    d.parent = o->parent;
    d.tables = o->tables;
    d.limits = o->limits;
    d.axes = o->axes;
    d.data = o->train;
    d.search_tokens = o->search_tokens;
    if (o->seed)
        d.seed = o->seed;
    if (o->eta > 0)
        d.eta = o->eta;
    if (o->lambda2_init > 0)
        d.lambda2_init = o->lambda2_init;
    if (o->lr > 0)
        d.lr = o->lr;
    /* The multipliers need a few hundred iterations to bring E[cost] to the limit:
     * spend a small budget on more, smaller batches (at least 32 tokens a row). */
    while ((int64_t)d.batch * d.seq * 256 > o->search_tokens && (d.batch > 1 || d.seq > 32)) {
        if (d.batch > 1)
            d.batch /= 2;
        else
            d.seq /= 2;
    }
    int iters = (int)(o->search_tokens / ((int64_t)d.batch * d.seq));
    dnas_cb cb = {o, iters > 50 ? iters / 50 : 1};
    d.progress = on_dnas;
    d.progress_ctx = &cb;
    served_cb scb = {o, sc};
    if (sc) {
        d.check = on_check;
        d.check_ud = &scb;
        if (margin)   /* a measurement is judged against the limits as given, less its own spread */
            method_served_limits(margin, &d.served_limits);
    }
    dnas_result r;
    int rc = dnas_run(&d, &r, err, errlen);
    if (rc != 0)
        return rc;
    json_t *gaps = json_object();
    for (int m = 0; m < SM_COUNT; m++)
        if (r.final_gap[m] != 0)
            json_object_set_new(gaps, search_metric_names[m], json_real(r.final_gap[m]));
    json_t *extra = json_pack("{s:O,s:o}", "distribution", r.distribution ? r.distribution : json_null(), "final_gap",
                              gaps);
    if (extra && r.checks)
        json_object_set_new(extra, "checks", json_pack("{s:i,s:b}", "served", r.checks, "last_within",
                                                        r.checked_within));
    *f = (found){r.arch, r.predicted, r.selection_tokens, r.iterations, r.parent_feasible, r.wall_s, extra};
    memset(&r.arch, 0, sizeof r.arch);   /* f holds it now */
    dnas_result_free(&r);
    return 0;
}

/* The Minitron++ baseline. 0 with *f filled, 1 when cancelled, -1 with a reason. */
static int run_minitron(const method_opts *o, found *f, char *err, size_t errlen)
{
    mn_cb cb = {o, o->search_tokens / 2 > 0 ? o->search_tokens / 2 : 1, 0};
    mn_opts m = {.parent = &o->parent->a, .layer_order = o->layer_order, .tables = o->tables,
                 .limits = o->limits, .axes = o->axes, .max_candidates = o->minitron_candidates,
                 .trial = mn_trial, .trial_ctx = &cb};
    mn_result r;
    int rc = mn_run(&m, &r, err, errlen);
    if (rc != 0)
        return rc;
    json_t *trials = json_array();
    for (int i = 0; i < r.n_trials; i++)
        json_array_append_new(trials, json_pack("{s:o,s:f}", "arch", arch_to_json(&r.trials[i]), "val_loss",
                                                r.trial_loss[i]));
    json_t *extra = json_pack("{s:o}", "trials", trials);
    *f = (found){r.arch, r.predicted, r.selection_tokens, r.n_trials, r.parent_feasible, r.wall_s, extra};
    memset(&r.arch, 0, sizeof r.arch);   /* f holds it now */
    mn_result_free(&r);
    return 0;
}

/* Run the method (DNAS checked through sc when not NULL). On 0, *chosen holds the arch
 * and *doc the search document; 1 when cancelled, -1 with a reason. */
static int method_run(const method_opts *o, sc_check *sc, const method_margin *margin, arch *chosen, json_t **doc,
                      char *err, size_t errlen)
{
    memset(chosen, 0, sizeof *chosen);
    *doc = NULL;
    found f;
    int rc = o->minitron ? run_minitron(o, &f, err, errlen) : run_dnas(o, sc, margin, &f, err, errlen);
    if (rc != 0)
        return rc;
    *chosen = f.arch;
    char summary[8192];
    arch_summary(chosen, summary, sizeof summary);
    *doc = json_pack("{s:s,s:o,s:s,s:I,s:i,s:f,s:b,s:o}", "method", o->minitron ? "minitron" : "autocompress", "arch",
                     arch_to_json(chosen), "summary", summary, "selection_tokens", (json_int_t)f.selection_tokens,
                     "iterations", f.iterations, "wall_s", f.wall_s, "parent_feasible", f.parent_feasible,
                     "predicted", cm_prediction_to_json(&f.predicted));
    if (!*doc) {
        json_decref(f.extra);
        arch_free(chosen);
        snprintf(err, errlen, "could not build the search document (out of memory, or a predicted cost is not finite)");
        return -1;
    }
    if (f.extra)
        json_object_update(*doc, f.extra);
    json_decref(f.extra);
    char msg[256];
    snprintf(msg, sizeof msg, "chose %s: predicted latency %.2f ms, memory %lld bytes, %lld parameters",
             f.parent_feasible ? "the parent (it meets every limit)" : "an architecture", f.predicted.latency_ms,
             (long long)f.predicted.total, (long long)f.predicted.params);
    emit(o, "search.done", msg, json_pack("{s:s}", "arch", summary));
    return 0;
}

int method_search(const method_opts *o, const rank_result *r, const method_margin *margin, arch *chosen,
                  json_t **doc, char *err, size_t errlen)
{
    method_opts run = *o;
    int *order = NULL;
    run.layer_order = NULL;
    if (o->minitron) {
        if (!r) {
            snprintf(err, errlen, "the ranking is missing: Minitron++ drops layers in its order");
            return -1;
        }
        order = malloc((size_t)(r->n_layers > 0 ? r->n_layers : 1) * sizeof *order);
        if (!order) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        rank_layer_order(r, order);
        run.layer_order = order;
    }
    sc_check sc;
    cm_tables anchored;
    memset(&sc, 0, sizeof sc);
    memset(&anchored, 0, sizeof anchored);
    int rc = 0, served = o->served != NULL;
    if (served) {
        char msg[768];
        snprintf(msg, sizeof msg, "serving the parent in %s: the tables' level at this machine's speed now",
                 served_engine(o->served));
        emit(o, "search.anchor", msg, NULL);
        rc = sc_open(&sc, &o->parent->a, o->served, o->cancelled, o->ud, err, errlen) ? -1 : 0;
        if (rc == 0)   /* the job's cancel stops a serving under way */
            rc = sc_anchor(&sc, o->tables, &anchored, err, errlen);
        if (rc == 1) {   /* no anchor here: the tables as calibrated decide, and the document says why */
            snprintf(msg, sizeof msg, "no anchor: %s; the search uses the tables as calibrated", err);
            emit(o, "search.anchor", msg, json_deep_copy(json_object_get(sc_doc(&sc), "anchor_tries")));
            if (json_object_set_new(sc_doc(&sc), "skipped", json_string(err))) {
                snprintf(err, errlen, "out of memory");
                rc = -1;
            } else {
                err[0] = 0;
                rc = 0;
                served = 0;
            }
        } else if (rc == 0) {
            run.tables = &anchored;
            json_t *an = json_object_get(sc_doc(&sc), "anchor");
            snprintf(msg, sizeof msg, "the parent served in %.1f ms against %.1f predicted: prefill x%.3f, decode x%.3f",
                     json_number_value(json_object_get(an, "parent_measured_ms")),
                     json_number_value(json_object_get(an, "parent_predicted_ms")),
                     json_number_value(json_object_get(an, "prefill_scale")),
                     json_number_value(json_object_get(an, "decode_scale")));
            served_load_note(an, msg, sizeof msg);
            size_t aside = json_array_size(json_object_get(sc_doc(&sc), "anchor_tries")), n = strlen(msg);
            if (aside)
                snprintf(msg + n, sizeof msg > n ? sizeof msg - n : 0,
                         "; %zu earlier serving%s beside other work set aside", aside, aside > 1 ? "s" : "");
            emit(o, "search.anchor", msg, json_deep_copy(an));
        }
    }
    if (rc == 0)
        rc = method_run(&run, served ? &sc : NULL, margin, chosen, doc, err, errlen);
    if (rc < 0 && o->cancelled && o->cancelled(o->ud))
        rc = 1;   /* a check stopped by the cancel */
    if (rc < 0 && served && run.tables == &anchored) {   /* say at which speed the tables were priced */
        json_t *an = json_object_get(sc_doc(&sc), "anchor");
        size_t n = strlen(err);
        snprintf(err + n, errlen > n ? errlen - n : 0,
                 " (priced at this machine's speed now: the parent served in %.3f ms against %.3f predicted by "
                 "the calibration)",
                 json_number_value(json_object_get(an, "parent_measured_ms")),
                 json_number_value(json_object_get(an, "parent_predicted_ms")));
    }
    free(order);
    if (rc == 0)
        json_object_set_new(*doc, "aim", method_aim_json(&o->limits, margin));
    if (rc == 0 && o->served)   /* the anchor and checks, or why the parent was not served */
        json_object_set(*doc, "served", sc_doc(&sc));
    cm_tables_free(&anchored);
    sc_close(&sc);
    return rc;
}

const cm_target *method_served_target(const cm_tables *tables)
{
    return strcmp(tables->source, "import") ? &tables->target : NULL;
}

void dnas_axes_for_exports(dnas_axes *axes, const char *const *formats, int n, const arch *parent)
{
    if (arch_hybrid(parent)) {
        /* NemotronHForCausalLM (storage/hfconfig_hybrid.c): one head count, one MLP width
           (expert counts in block_configs); hidden size, Mamba heads, experts and layers may
           change. llama.cpp's nemotron_h: per-layer heads and widths, one MoE shape. */
        for (int i = 0; i < n; i++) {
            if (!strcmp(formats[i], "hf")) {
                axes->heads = axes->ffn = 0;
                axes->keep_query_heads = 1;
            }
            if (!strcmp(formats[i], "gguf")) {   /* llama.cpp: per-layer heads and widths, one MoE shape */
                axes->uniform_experts = 1;
                axes->min_experts = 2;
                axes->no_removed_attention = 1;   /* its graph needs an attention layer (a KV cache) */
            }
        }
        return;
    }
    if (strcmp(parent->family, "llama")) {
        /* Mixtral / Qwen2-MoE configs (storage/hfconfig_moe.c): head_dim = hidden / heads and
           one query-head count for every layer; per-layer KV heads, MLPs and experts are
           block_configs. llama.cpp (storage/export_gguf_moe.c) holds one shape for every
           layer: whole layers may go, and one expert count serves every layer. */
        for (int i = 0; i < n; i++) {
            if (!strcmp(formats[i], "hf") || !strcmp(formats[i], "gguf")) {
                axes->keep_query_heads = 1;
                axes->hidden = 0;
            }
            if (!strcmp(formats[i], "gguf")) {
                axes->heads = axes->ffn = 0;
                axes->uniform_experts = 1;
                axes->min_experts = 2;
                axes->no_removed_attention = axes->no_removed_mlp = 1;
            }
        }
        return;
    }
    if (parent->attention_bias) {
        /* Qwen2 (q/k/v biases): HF states it as Qwen2ForCausalLM only, one shape for every
           layer (DeciLM would add an o_proj bias), with head_dim = hidden / heads in the
           transformers that read it; whole layers may go. No GGUF of it in this build (the
           spec check refuses "gguf", "deci" and a llama.cpp target for it). */
        for (int i = 0; i < n; i++)
            if (!strcmp(formats[i], "hf")) {
                axes->heads = axes->ffn = axes->hidden = 0;
                axes->keep_query_heads = 1;
                axes->no_removed_attention = axes->no_removed_mlp = 1;
            }
        return;
    }
    int ffn256 = 1;
    for (int l = 0; l < parent->n_layers; l++)
        if (parent->layers[l].ffn_dim % 256)
            ffn256 = 0;
    int per_layer = axes->heads || axes->ffn || axes->depth;
    for (int i = 0; i < n; i++) {
        int deci = !strcmp(formats[i], "deci") || (!strcmp(formats[i], "hf") && per_layer && ffn256);
        if (deci) {
            axes->keep_query_heads = 1;
            axes->hidden = 0;          /* DeciLM needs hidden = heads * head_dim */
            axes->ffn_multiple = 256;  /* its intermediate sizes are multiples of 256 */
        } else if (!strcmp(formats[i], "gguf")) {
            axes->no_removed_attention = 1;
            axes->no_removed_mlp = 1;
        }
    }
}
