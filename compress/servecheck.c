/* compress/servecheck.c — a search checked where the result will be served: the
 * parent's anchor and the checks of chosen archs, in llama.cpp or the built-in engine
 * (servecheck.h).
 */
#include "compress/servecheck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compress/llamacpp.h"
#include "compress/measure.h"
#include "engine/devices.h"
#include "storage/fileio.h"

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

/* How a check serves each model: a warm-up, 3 requests; the weights' seed and c's cancel
 * hook. */
static ms_opts serve_opts(const sc_check *c, uint64_t seed)
{
    return (ms_opts){.warmup = 1, .reps = 3, .seed = seed, .cancelled = c->cancelled, .cancel_ud = c->cancel_ud};
}

int sc_open(sc_check *c, const arch *parent, const cm_target *t, int (*cancelled)(void *ud), void *cancel_ud,
            char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->t = *t;
    c->parent = parent;
    c->cancelled = cancelled;
    c->cancel_ud = cancel_ud;
    c->quiet_wait_s = MS_QUIET_WAIT_S;
    ms_opts stop = serve_opts(c, 1);
    c->builtin = !cm_target_llamacpp(t);
    if (!c->builtin &&
        (lc_target_resolve(&c->t, err, errlen) || lc_scratch_dir(parent, c->dir, sizeof c->dir, err, errlen) ||
         lc_write_random(parent, &c->t, 1, c->dir, "parent", c->ppath, sizeof c->ppath, NULL, &stop, err, errlen)))
        return -1;
    c->doc = json_pack("{s:[],s:[]}", "checks", "check_tries");
    if (!c->doc)
        FAIL("out of memory");
    return 0;
}

/* The parent served at the anchor, SC_ROUNDS fresh processes (fewer when ms_rounds_tick
 * cuts the try short: MS_RUN_CUT): *m the median serving, *lat each serving's latency. 0,
 * MS_RUN_CUT, or -1 with err. */
static int serve_parent(sc_check *c, ms_quiet_state *qs, ms_result *m, json_t **lat, char *err,
                        size_t errlen)
{
    memset(m, 0, sizeof *m);
    *lat = NULL;
    ms_opts o = serve_opts(c, 1);
    ms_rounds rd = {qs, SC_ROUNDS, 0};
    int rc = 0;
    if (c->builtin) {
        ms_result pr[SC_ROUNDS];
        for (int k = 0; k < SC_ROUNDS && !rc; k++) {
            if (ms_measure_fresh(c->parent, NULL, &c->t, &o, &pr[k], err, errlen))
                return -1;
            rc = ms_rounds_tick(&rd, k + 1);
        }
        ms_results_median(pr, rd.done, m);
        *lat = ms_results_latencies_json(pr, rd.done);
        return rc;
    }
    lc_bench pb[SC_ROUNDS];
    rc = lc_bench_alternating(c->ppath, NULL, &c->t, &o, SC_ROUNDS, pb, NULL, ms_rounds_tick, &rd, err, errlen);
    if (rc == 0 || rc == MS_RUN_CUT) {
        lc_bench_median(pb, rd.done, &c->t, m);
        *lat = lc_bench_latencies_json(pb, rd.done, &c->t);
    }
    for (int k = 0; k < SC_ROUNDS; k++)
        lc_bench_free(&pb[k]);
    return rc == 0 || rc == MS_RUN_CUT ? rc : -1;
}

/* How the anchor and each check measure again beside other work (ms_run_quiet), a try
 * cut short once it is contended (state). */
static ms_quiet_opts quiet_opts(const sc_check *c, ms_quiet_state *state)
{
    return (ms_quiet_opts){.threads = ms_target_threads(&c->t), .tries = MS_QUIET_TRIES, .wait_s = c->quiet_wait_s,
                           .cancelled = c->cancelled, .cancel_ud = c->cancel_ud, .state = state};
}

/* The anchor's servings under ms_run_quiet: the latest's median, process latencies and
 * the document's array of servings set aside. */
typedef struct {
    sc_check *c;
    ms_result m;
    json_t *lat, *tries;
    ms_quiet_state qs;
} anchor_run;

static int anchor_serve(void *ud, char *err, size_t errlen)
{
    anchor_run *r = ud;
    json_decref(r->lat);
    return serve_parent(r->c, &r->qs, &r->m, &r->lat, err, errlen);
}

static int anchor_aside(void *ud, const ms_host_load *load, char *err, size_t errlen)
{
    anchor_run *r = ud;
    json_t *t = json_pack("{s:f,s:o*,s:o}", "parent_measured_ms", r->m.latency_ms, "process_latencies_ms", r->lat,
                          "host_load", ms_host_load_json(load));
    r->lat = NULL;
    if (!t || json_array_append_new(r->tries, t))
        FAIL("out of memory");
    return 0;
}

/* Serve the parent until a serving is not contended (sc_anchor): *m, *lat (serve_parent's)
 * and *load that serving's; each contended one joins the document's "anchor_tries". 0; 1
 * with the reason in err when every serving was contended; -1 with err. */
static int serve_parent_quiet(sc_check *c, ms_result *m, json_t **lat, ms_host_load *load, char *err, size_t errlen)
{
    anchor_run r = {.c = c, .tries = json_array()};
    if (!r.tries || json_object_set_new(c->doc, "anchor_tries", r.tries))
        FAIL("out of memory");
    ms_quiet_opts q = quiet_opts(c, &r.qs);
    int rc = ms_run_quiet(&q, anchor_serve, anchor_aside, &r, load, err, errlen);
    if (rc == 0) {
        *m = r.m;
        *lat = r.lat;
        return 0;
    }
    if (rc != 2 || anchor_aside(&r, load, err, errlen)) {
        json_decref(r.lat);
        return -1;   /* err: why, or "cancelled" */
    }
    char note[256] = "";
    (void)ms_host_load_note(json_object_get(json_array_get(r.tries, MS_QUIET_TRIES - 1), "host_load"), note,
                            sizeof note);
    snprintf(err, errlen,
             "the parent was served beside other work each of %d times, waiting up to %.0f s for a quiet "
             "second between them (the last time %s), so this machine's speed now is unknown",
             MS_QUIET_TRIES, c->quiet_wait_s, note);
    return 1;
}

int sc_anchor(sc_check *c, const cm_tables *tb, cm_tables *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    c->parent_ms = c->parent_prefill_ms = c->parent_decode_ms = 0;   /* no checks on an earlier anchor */
    (void)json_object_del(c->doc, "anchor");
    cm_prediction p;
    if (cm_predict(tb, c->parent, &p, err, errlen))
        return -1;
    /* the built-in engine serves on the search's own device, beside its parent and supernet:
       where the free memory cannot hold another parent, it is not served */
    int64_t avail = c->builtin ? eng_device_free_bytes(c->t.device) : -1;
    if (avail >= 0 && p.total > avail) {
        snprintf(err, errlen, "serving the parent beside the search needs about %.2f GiB, %s has %.2f GiB available",
                 p.total / 1073741824.0, c->t.device, avail / 1073741824.0);
        return 1;
    }
    ms_result m;
    json_t *lat;
    ms_host_load load;
    int rc = serve_parent_quiet(c, &m, &lat, &load, err, errlen);
    if (rc)
        return rc;
    if (m.prefill_ms <= 0 || m.decode_ms <= 0 || p.prefill_ms <= 0 || p.decode_ms <= 0) {
        json_decref(lat);
        FAIL("anchor: the parent's phases measured %.3f + %.3f ms against %.3f + %.3f predicted", m.prefill_ms,
             m.decode_ms, p.prefill_ms, p.decode_ms);
    }
    c->parent_ms = m.latency_ms;
    c->parent_prefill_ms = m.prefill_ms;
    c->parent_decode_ms = m.decode_ms;
    /* the parent's own distance from the tables, as its calibration measured it against the
     * archs a search compares, is not the machine's: only the rest moves the tables */
    double bp = tb->parent_bias_prefill > 0 ? tb->parent_bias_prefill : 1,
           bd = tb->parent_bias_decode > 0 ? tb->parent_bias_decode : 1;
    double sp = m.prefill_ms / p.prefill_ms / bp, sd = m.decode_ms / p.decode_ms / bd;
    if (cm_tables_copy(out, tb)) {
        json_decref(lat);
        FAIL("out of memory");
    }
    cm_tables_rescale(out, sp, sd);
    const char *how = c->builtin ? "the parent (random weights) in fresh processes of the built-in engine "
                                   "(autocompress measure) on the target's device, the median"
                            : "the parent (random weights at the target's type) in fresh llama.cpp processes, "
                              "the median";
    char method[512];
    snprintf(method, sizeof method,
             "%s; each phase of the tables scaled by measured over predicted, divided by the parent's bias "
             "(its calibration's: the parent's ratio over the fit archs'; 1 without one)",
             how);
    json_t *a = json_pack("{s:s,s:f,s:f,s:f,s:f,s:f,s:o*,s:f,s:f,s:{s:f,s:f},s:s,s:o*}", "engine",
                          c->builtin ? CM_ENGINE_AUTOCOMPRESS : CM_ENGINE_LLAMACPP, "parent_predicted_ms", p.latency_ms,
                          "parent_measured_ms", m.latency_ms, "parent_measured_prefill_ms", m.prefill_ms,
                          "parent_measured_decode_ms", m.decode_ms, "parent_predicted_decode_ms", p.decode_ms,
                          "process_latencies_ms", lat, "prefill_scale", sp, "decode_scale", sd, "parent_bias",
                          "prefill", bp, "decode", bd, "method", method, "host_load", ms_host_load_json(&load));
    if (!a || json_object_set_new(c->doc, "anchor", a)) {
        cm_tables_free(out);
        FAIL("out of memory");
    }
    return 0;
}

/* Serve `a` (seed: its random weights) and the parent SC_ROUNDS times each, alternating a
 * round of the parent then one of a: ar[k] and pr[k] the k-th servings, *n of them (fewer
 * than SC_ROUNDS when the try is cut short: MS_RUN_CUT). 0, MS_RUN_CUT, or -1 with err. */
static int serve_pair(sc_check *c, ms_quiet_state *qs, const arch *a, uint64_t seed, ms_result *ar,
                      ms_result *pr, int *n, char *err, size_t errlen)
{
    ms_opts op = serve_opts(c, 1), oa = serve_opts(c, seed);
    ms_rounds rd = {qs, SC_ROUNDS, 0};
    int rc = 0;
    *n = 0;
    if (c->builtin) {
        for (int k = 0; k < SC_ROUNDS && !rc; k++) {
            if (ms_measure_fresh(c->parent, NULL, &c->t, &op, &pr[k], err, errlen) ||
                ms_measure_fresh(a, NULL, &c->t, &oa, &ar[k], err, errlen))
                return -1;
            rc = ms_rounds_tick(&rd, k + 1);
        }
        *n = rd.done;
        return rc;
    }
    char path[4400];
    if (lc_write_random(a, &c->t, seed, c->dir, "check", path, sizeof path, NULL, &oa, err, errlen))
        return -1;
    lc_bench pb[SC_ROUNDS], ab[SC_ROUNDS];
    rc = lc_bench_alternating(c->ppath, path, &c->t, &op, SC_ROUNDS, pb, ab, ms_rounds_tick, &rd, err, errlen);
    (void)unlink(path);
    int ok = rc == 0 || rc == MS_RUN_CUT;
    for (int k = 0; k < SC_ROUNDS; k++) {
        if (ok && k < rd.done) {
            lc_bench_result(&ab[k], &c->t, &ar[k]);
            lc_bench_result(&pb[k], &c->t, &pr[k]);
        }
        lc_bench_free(&pb[k]);
        lc_bench_free(&ab[k]);
    }
    *n = ok ? rd.done : 0;
    return ok ? rc : -1;
}

/* A check's servings under ms_run_quiet: the arch, its weights' seed, the latest rounds
 * (n of them). */
typedef struct {
    sc_check *c;
    const arch *a;
    uint64_t seed;
    ms_result ar[SC_ROUNDS], pr[SC_ROUNDS];
    int n;
    ms_quiet_state qs;
} check_run;

static int check_serve(void *ud, char *err, size_t errlen)
{
    check_run *r = ud;
    return serve_pair(r->c, &r->qs, r->a, r->seed, r->ar, r->pr, &r->n, err, errlen);
}

/* A check's servings beside other work join the document's "check_tries". */
static int check_aside(void *ud, const ms_host_load *load, char *err, size_t errlen)
{
    check_run *r = ud;
    char summary[1024];
    arch_summary(r->a, summary, sizeof summary);
    json_t *t = json_pack("{s:s,s:o*,s:o*,s:o}", "arch", summary, "process_latencies_ms",
                          ms_results_latencies_json(r->ar, r->n), "parent_process_latencies_ms",
                          ms_results_latencies_json(r->pr, r->n), "host_load", ms_host_load_json(load));
    if (!t || json_array_append_new(json_object_get(r->c->doc, "check_tries"), t))
        FAIL("out of memory");
    return 0;
}

int sc_measure(sc_check *c, const arch *a, const cm_prediction *pred, cm_prediction *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (c->parent_ms <= 0)
        FAIL("a served check needs the anchor first");
    int n = (int)json_array_size(json_object_get(c->doc, "checks"));
    check_run r = {.c = c, .a = a, .seed = 2 + (uint64_t)n};
    ms_quiet_opts q = quiet_opts(c, &r.qs);
    ms_host_load load;
    int rc = ms_run_quiet(&q, check_serve, check_aside, &r, &load, err, errlen);
    if (rc == 1 || rc < 0)
        return -1;   /* err: why, or "cancelled" */
    const ms_result *ar = r.ar, *pr = r.pr;   /* the last servings: not contended, or every try was */
    double rl[SC_ROUNDS], rd[SC_ROUNDS];
    for (int k = 0; k < SC_ROUNDS; k++) {
        rl[k] = pr[k].latency_ms > 0 ? ar[k].latency_ms / pr[k].latency_ms : 0;
        rd[k] = pr[k].decode_ms > 0 ? ar[k].decode_ms / pr[k].decode_ms : 0;
    }
    ms_result am;   /* the highest peak of a's servings: the measure stage's rule, which the report judges */
    ms_results_median(ar, SC_ROUNDS, &am);
    double ratio = ms_median(rl, SC_ROUNDS), dratio = ms_median(rd, SC_ROUNDS);
    m->latency_ms = ratio * c->parent_ms;
    m->decode_ms = dratio * c->parent_decode_ms;
    m->prefill_ms = m->latency_ms - m->decode_ms;
    m->decode_ms_per_token = c->t.output_tokens > 0 ? m->decode_ms / c->t.output_tokens : 0;
    m->throughput_tps = m->decode_ms > 0 ? 1000.0 * c->t.batch_size * c->t.output_tokens / m->decode_ms : 0;
    m->total = am.peak_bytes;
    m->params = arch_params(a);
    char summary[1024];
    arch_summary(a, summary, sizeof summary);
    json_t *row = json_pack("{s:s,s:f,s:f,s:f,s:I,s:o*,s:o*,s:o*}", "arch", summary, "ratio_to_parent", ratio,
                            "latency_ms", m->latency_ms, "decode_ms", m->decode_ms, "peak_memory_bytes",
                            (json_int_t)m->total, "process_latencies_ms", ms_results_latencies_json(ar, SC_ROUNDS),
                            "parent_process_latencies_ms", ms_results_latencies_json(pr, SC_ROUNDS), "host_load",
                            ms_host_load_json(&load));
    if (row && pred) {
        json_object_set_new(row, "predicted_latency_ms", json_real(pred->latency_ms));
        json_object_set_new(row, "predicted_memory_bytes", json_integer(pred->total));
    }
    if (!row || json_array_append_new(json_object_get(c->doc, "checks"), row))
        FAIL("out of memory");
    return 0;
}

json_t *sc_doc(const sc_check *c)
{
    return c->doc;
}

void sc_close(sc_check *c)
{
    if (*c->dir)
        (void)fio_remove_tree(c->dir);
    json_decref(c->doc);
    memset(c, 0, sizeof *c);
}
