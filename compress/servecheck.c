/* compress/servecheck.c — a search checked where the result will be served: the
 * parent's anchor and the checks of chosen archs in llama.cpp (servecheck.h).
 */
#include "compress/servecheck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compress/llamacpp.h"
#include "compress/measure.h"
#include "storage/fileio.h"

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

static const ms_opts serve_opts = {.warmup = 1, .reps = 3, .seed = 1};

int sc_open(sc_check *c, const arch *parent, const cm_target *t, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->t = *t;
    c->parent = parent;
    if (!cm_target_llamacpp(t))
        FAIL("a served check needs a llama.cpp target");
    if (lc_target_resolve(&c->t, err, errlen) || lc_scratch_dir(c->dir, sizeof c->dir, err, errlen))
        return -1;
    if (lc_write_random(parent, &c->t, 1, c->dir, "parent", c->ppath, sizeof c->ppath, NULL, err, errlen))
        return -1;
    c->doc = json_pack("{s:[]}", "checks");
    if (!c->doc)
        FAIL("out of memory");
    return 0;
}

int sc_anchor(sc_check *c, const cm_tables *tb, cm_tables *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    cm_prediction p;
    if (cm_predict(tb, c->parent, &p, err, errlen))
        return -1;
    lc_bench pb[SC_ROUNDS];
    int rc = lc_bench_alternating(c->ppath, NULL, &c->t, &serve_opts, SC_ROUNDS, pb, NULL, NULL, NULL, err, errlen);
    ms_result m;
    memset(&m, 0, sizeof m);
    json_t *lat = NULL;
    if (rc == 0) {
        lc_bench_median(pb, SC_ROUNDS, &c->t, &m);
        lat = lc_bench_latencies_json(pb, SC_ROUNDS, &c->t);
    }
    for (int k = 0; k < SC_ROUNDS; k++)
        lc_bench_free(&pb[k]);
    if (rc)
        return -1;
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
    json_t *a = json_pack("{s:f,s:f,s:f,s:f,s:f,s:o*,s:f,s:f,s:{s:f,s:f},s:s}", "parent_predicted_ms", p.latency_ms,
                          "parent_measured_ms", m.latency_ms, "parent_measured_prefill_ms", m.prefill_ms,
                          "parent_measured_decode_ms", m.decode_ms, "parent_predicted_decode_ms", p.decode_ms,
                          "process_latencies_ms", lat, "prefill_scale", sp, "decode_scale", sd, "parent_bias",
                          "prefill", bp, "decode", bd, "method",
                          "the parent (random weights at the target's type) in fresh llama.cpp processes, the median; "
                          "each phase of the tables scaled by measured over predicted, divided by the parent's bias "
                          "(its calibration's: the parent's ratio over the fit archs')");
    if (!a || json_object_set_new(c->doc, "anchor", a)) {
        cm_tables_free(out);
        FAIL("out of memory");
    }
    return 0;
}

int sc_measure(sc_check *c, const arch *a, const cm_prediction *pred, cm_prediction *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (c->parent_ms <= 0)
        FAIL("a served check needs the anchor first");
    char path[4400];
    int n = (int)json_array_size(json_object_get(c->doc, "checks"));
    if (lc_write_random(a, &c->t, 2 + (uint64_t)n, c->dir, "check", path, sizeof path, NULL, err, errlen))
        return -1;
    lc_bench pb[SC_ROUNDS], ab[SC_ROUNDS];
    int rc = lc_bench_alternating(c->ppath, path, &c->t, &serve_opts, SC_ROUNDS, pb, ab, NULL, NULL, err, errlen);
    (void)unlink(path);
    json_t *row = NULL;
    if (rc == 0) {
        double rl[SC_ROUNDS], rd[SC_ROUNDS];
        for (int k = 0; k < SC_ROUNDS; k++) {
            ms_result x, y;
            lc_bench_result(&ab[k], &c->t, &x);
            lc_bench_result(&pb[k], &c->t, &y);
            rl[k] = y.latency_ms > 0 ? x.latency_ms / y.latency_ms : 0;
            rd[k] = y.decode_ms > 0 ? x.decode_ms / y.decode_ms : 0;
        }
        ms_result med;
        lc_bench_median(ab, SC_ROUNDS, &c->t, &med);
        double ratio = ms_median(rl, SC_ROUNDS), dratio = ms_median(rd, SC_ROUNDS);
        m->latency_ms = ratio * c->parent_ms;
        m->decode_ms = dratio * c->parent_decode_ms;
        m->prefill_ms = m->latency_ms - m->decode_ms;
        m->decode_ms_per_token = c->t.output_tokens > 0 ? m->decode_ms / c->t.output_tokens : 0;
        m->throughput_tps = m->decode_ms > 0 ? 1000.0 * c->t.batch_size * c->t.output_tokens / m->decode_ms : 0;
        m->total = med.peak_bytes;
        m->params = arch_params(a);
        char summary[1024];
        arch_summary(a, summary, sizeof summary);
        row = json_pack("{s:s,s:f,s:f,s:f,s:I,s:o*,s:o*}", "arch", summary, "ratio_to_parent", ratio,
                        "latency_ms", m->latency_ms, "decode_ms", m->decode_ms, "peak_memory_bytes",
                        (json_int_t)m->total, "process_latencies_ms", lc_bench_latencies_json(ab, SC_ROUNDS, &c->t),
                        "parent_process_latencies_ms", lc_bench_latencies_json(pb, SC_ROUNDS, &c->t));
        if (row && pred) {
            json_object_set_new(row, "predicted_latency_ms", json_real(pred->latency_ms));
            json_object_set_new(row, "predicted_memory_bytes", json_integer(pred->total));
        }
        if (!row || json_array_append_new(json_object_get(c->doc, "checks"), row)) {
            snprintf(err, errlen, "out of memory");
            rc = -1;
        }
    }
    for (int k = 0; k < SC_ROUNDS; k++) {
        lc_bench_free(&pb[k]);
        lc_bench_free(&ab[k]);
    }
    return rc ? -1 : 0;
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
