/* compress/cal_validate.c — a calibration's held-out side: random archs measured as
 * complete models (each on a backend of its own, interleaved with the calibration
 * requests), the fit archs' phase correction, and the validation rows and error summary
 * (DESIGN.md §10). Shares the calibration state of calibrate.c (calibrate_internal.h).
 */
#include "compress/calibrate_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/clock.h"
#include "storage/archjson.h"

/* Correct the phase scales with the fit archs: random heterogeneous archs drawn like the
 * held-out ones and measured exactly like them. The calibration models repeat grid
 * layouts, and on CPU at batch 8 random off-grid archs ran a few percent slower than
 * their parts' sum scaled on the grid layouts (bench/results/costmodel_cpu.md). One
 * factor per phase, the median over every fit arch (all hidden sizes pooled, so a
 * few requests hit by a load burst do not move it) of measured over predicted phase
 * time, multiplies every hidden size's scale: the calibration models keep setting the
 * per-hidden-size level from their many requests. 0 or -1 (OOM, predict failure). */
int fit_scales(cm_tables *tb, const arch *fa, const ms_result *fr, int n, double *corr_p, double *corr_d,
               char *err, size_t errlen)
{
    return fit_scales_by_hidden(tb, fa, fr, n, INT_MAX, corr_p, corr_d, NULL, err, errlen);
}

/* Per hidden size (llama.cpp): there each hidden size's tables come from models served
 * apart in time, and a level error shared by all of one hidden size's models (a slow
 * stretch of the machine, or what repeated blocks miss at that width) showed on the
 * held-out archs of that hidden size alike: on SmolLM2 at q8_0 both archs at hidden 416
 * measured 0.80 and 0.82 of their prediction, both at 480 1.13 and 1.21. */
int fit_scales_by_hidden(cm_tables *tb, const arch *fa, const ms_result *fr, int n, int min_n, double *corr_p,
                         double *corr_d, json_t **by, char *err, size_t errlen)
{
    double *rp = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1) * 3);
    int *hid = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    double *rd = rp ? rp + (n > 0 ? n : 1) : NULL, *tmp = rp ? rp + 2 * (n > 0 ? n : 1) : NULL;
    int rc = rp && hid ? 0 : -1, k = 0;
    if (by)
        *by = NULL;
    if (rc)
        snprintf(err, errlen, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        cm_prediction p;
        if (fr[i].reps <= 0)
            continue;
        if (cm_predict(tb, &fa[i], &p, err, errlen))
            rc = -1;
        else if (p.prefill_ms > 0 && p.decode_ms > 0) {
            rp[k] = fr[i].prefill_ms / p.prefill_ms;
            rd[k] = fr[i].decode_ms / p.decode_ms;
            hid[k++] = fa[i].hidden_size;
        }
    }
    if (!rc) {
        memcpy(tmp, rp, sizeof(double) * (size_t)k);
        *corr_p = k ? ms_median(tmp, k) : 1;
        memcpy(tmp, rd, sizeof(double) * (size_t)k);
        *corr_d = k ? ms_median(tmp, k) : 1;
    }
    json_t *arr = by && !rc ? json_array() : NULL;
    for (int f = 0; f < tb->n_fixed && !rc; f++) {
        int m = 0;
        double cp = *corr_p, cd = *corr_d;
        for (int i = 0; i < k; i++)
            if (hid[i] == tb->fixed[f].hidden_size)
                tmp[m++] = rp[i];
        if (m >= min_n) {
            cp = ms_median(tmp, m);
            m = 0;
            for (int i = 0; i < k; i++)
                if (hid[i] == tb->fixed[f].hidden_size)
                    tmp[m++] = rd[i];
            cd = ms_median(tmp, m);
        }
        tb->fixed[f].prefill_scale *= cp;
        tb->fixed[f].decode_scale *= cd;
        if (arr && json_array_append_new(arr, json_pack("{s:i,s:i,s:f,s:f}", "hidden_size", tb->fixed[f].hidden_size,
                                                        "archs", m >= min_n ? m : 0, "prefill", cp, "decode", cd))) {
            snprintf(err, errlen, "out of memory");
            rc = -1;
        }
    }
    if (by && !rc)
        *by = arr;
    else
        json_decref(arr);
    free(rp);
    free(hid);
    return rc;
}

int fit_memory(cm_tables *tb, const arch *fa, const ms_result *fr, int n, int64_t *resid_bytes, char *err,
               size_t errlen)
{
    double *r = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    int rc = r ? 0 : -1, k = 0;
    if (rc)
        snprintf(err, errlen, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        cm_prediction p;
        if (fr[i].reps <= 0 || fr[i].peak_bytes <= 0)
            continue;
        if (cm_predict(tb, &fa[i], &p, err, errlen))
            rc = -1;
        else
            r[k++] = (double)(fr[i].peak_bytes - p.total);
    }
    double med = !rc && k ? ms_median(r, k) : 0;
    int64_t d = (int64_t)llround(med);
    *resid_bytes = 0;
    if (d > 0) {
        tb->mem.runtime_bytes += d;
        *resid_bytes = d;
    } else if (d < 0 && tb->mem.workspace_combine == CM_WS_MAX) {
        /* over-predicted: the largest part's workspace, measured on a model of more layers
         * than the whole archs hold, is what sets the total; every part's and the fixed
         * workspace lowered alike (none below 0) lowers that maximum by as much */
        for (int i = 0; i < tb->n_prefill; i++)
            tb->prefill[i].workspace_bytes = tb->prefill[i].workspace_bytes > -d ? tb->prefill[i].workspace_bytes + d : 0;
        for (int i = 0; i < tb->n_fixed; i++)
            tb->fixed[i].workspace_bytes = tb->fixed[i].workspace_bytes > -d ? tb->fixed[i].workspace_bytes + d : 0;
        *resid_bytes = d;
    }
    free(r);
    return rc;
}

static double pct_err(double pred, double meas)
{
    return meas > 0 ? 100.0 * fabs(pred - meas) / meas : 0;
}

/* A held-out arch under measurement: its own backend (its peak bytes are its own),
 * model, cache and the timed requests so far. */
typedef struct {
    eng_backend *be;
    eng_model m;
    eng_kv_cache *kv;
    int inited, n;
    double *lat, *pre, *dec;
} vmodel;

static void vmodel_close(vmodel *vm)
{
    if (vm->kv)
        eng_kv_free(vm->kv);
    if (vm->inited)
        eng_model_free(&vm->m);
    eng_backend_free(vm->be);
    free(vm->lat);
    free(vm->pre);
    free(vm->dec);
    memset(vm, 0, sizeof *vm);
}

/* Measure the held-out model's memory where it serves: in a fresh process of the built-in
 * engine, one request (ms_measure_fresh: on CPU that process's whole RSS high-water mark,
 * so the fit archs' residual puts the process's own memory in the runtime item), before
 * its copy here is built (a device then holds one more, not two); then build that copy,
 * whose requests are timed here beside the tables' own. 0 or -1. */
static int vmodel_open(cal_state *cs, const arch *va, vmodel *vm, ms_result *res, char *err, size_t errlen)
{
    char e2[256];
    int reps = cs->o->validate_reps > 0 ? cs->o->validate_reps : 3;
    memset(vm, 0, sizeof *vm);
    memset(res, 0, sizeof *res);
    vm->be = cal_backend_new(cs->t->device, cs->t->precision, cs->o->threads, e2, sizeof e2);
    if (!vm->be) {
        snprintf(err, errlen, "%s", e2);
        return -1;
    }
    vm->lat = calloc((size_t)reps, sizeof(double));
    vm->pre = calloc((size_t)reps, sizeof(double));
    vm->dec = calloc((size_t)reps, sizeof(double));
    if (!vm->lat || !vm->pre || !vm->dec) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    double t0 = eng_wall_s();
    ms_opts fo = {.warmup = 0, .reps = 1, .seed = cs->o->seed * 7919 + (uint64_t)cs->requests,
                  .cancelled = cs->stop.cancelled, .cancel_ud = cs->stop.cancel_ud, .threads = cs->o->threads};
    ms_result fr;
    if (ms_measure_fresh(va, NULL, cs->t, &fo, &fr, err, errlen))
        return -1;
    res->backend_peak_bytes = fr.backend_peak_bytes;
    res->rss_delta_bytes = fr.rss_delta_bytes;
    res->process_peak_bytes = fr.process_peak_bytes;
    res->peak_bytes = fr.peak_bytes;
    if (eng_model_init(&vm->m, va, vm->be, err, errlen))
        return -1;
    vm->inited = 1;
    res->weights_bytes = (int64_t)vm->be->cur_bytes;
    if (cali_randomize(cs, &vm->m, cs->o->seed * 7919 + (uint64_t)cs->requests, err, errlen))
        return -1;
    eng_model_const(&vm->m, 1);
    vm->kv = eng_kv_new(&vm->m, cs->t->batch_size, cs->t->prompt_tokens + cs->t->output_tokens);
    if (!vm->kv) {
        snprintf(err, errlen, "out of memory for the KV cache");
        return -1;
    }
    res->request_cache_bytes = (int64_t)vm->be->cur_bytes - res->weights_bytes;
    double p, d;
    if (ms_run_request(&vm->m, vm->kv, cs->t, &cs->rng, NULL, &cs->stop, &p, &d, err, errlen))   /* a warm-up */
        return -1;
    res->params = arch_params(va);
    cs->heldout_s += eng_wall_s() - t0;
    return cali_tick(cs, "held-out build + memory", err, errlen);
}

/* One timed request of the held-out model, right after one calibration request. */
static int vmodel_request(cal_state *cs, vmodel *vm, cal_model *cm, char *err, size_t errlen)
{
    double p, d;
    if (cali_request(cs, cm, 1, err, errlen) || cali_tick(cs, "calibration request", err, errlen))
        return -1;
    double t0 = eng_wall_s();
    if (ms_run_request(&vm->m, vm->kv, cs->t, &cs->rng, NULL, &cs->stop, &p, &d, err, errlen) ||
        cali_tick(cs, "held-out request", err, errlen))
        return -1;
    cs->heldout_s += eng_wall_s() - t0;
    vm->lat[vm->n] = p + d;
    vm->pre[vm->n] = p;
    vm->dec[vm->n] = d;
    vm->n++;
    return 0;
}

static void vmodel_result(const cal_state *cs, vmodel *vm, ms_result *res)
{
    res->reps = vm->n;
    res->latency_ms = ms_median(vm->lat, vm->n);
    res->latency_mad_ms = ms_mad(vm->lat, vm->n, res->latency_ms);
    res->prefill_ms = ms_median(vm->pre, vm->n);
    res->decode_ms = ms_median(vm->dec, vm->n);
    res->throughput_tps = res->decode_ms > 0 ? 1000.0 * cs->t->batch_size * cs->t->output_tokens / res->decode_ms : 0;
}

/* Measure every held-out arch: all are built first (memory measured one at a time),
 * then the timed requests go round-robin over the archs, each after a calibration
 * request, so every arch's samples and the tables' samples spread over the same period
 * (load drift on a shared machine hits both alike). 0 or -1. */
int validate_all(cal_state *cs, arch *varch, int n, cal_model *cms, int n_models_per_hidden, int n_hid,
                        ms_result *vres, char *err, size_t errlen)
{
    vmodel *vms = calloc((size_t)n, sizeof *vms);
    int reps = cs->o->validate_reps > 0 ? cs->o->validate_reps : 3, rc = -1, next = 0;
    if (!vms) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int v = 0; v < n; v++)
        if (vmodel_open(cs, &varch[v], &vms[v], &vres[v], err, errlen))
            goto out;
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < n; v++) {
            int h = v % n_hid;
            cal_model *cm = &cms[h * n_models_per_hidden + (next++ % n_models_per_hidden)];
            if (vmodel_request(cs, &vms[v], cm, err, errlen))
                goto out;
        }
    for (int v = 0; v < n; v++)
        vmodel_result(cs, &vms[v], &vres[v]);
    rc = 0;
out:
    for (int v = 0; v < n; v++)
        vmodel_close(&vms[v]);
    free(vms);
    return rc;
}


/* One held-out arch's validation row: predicted against measured, per phase and item. */
static json_t *validation_row(const cm_prediction *p, const arch *va, const ms_result *m, double le, double me,
                              double ne)
{
    char summary[1024];
    arch_summary(va, summary, sizeof summary);
    json_t *row = json_pack(
        "{s:o,s:s,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:I,s:I,s:o,s:f,s:f,s:f}", "arch", arch_to_json(va),
        "summary", summary, "params", (json_int_t)p->params, "predicted_latency_ms", p->latency_ms,
        "measured_latency_ms", m->latency_ms, "measured_latency_mad_ms", m->latency_mad_ms,
        "predicted_throughput_tokens_per_s", p->throughput_tps, "measured_throughput_tokens_per_s", m->throughput_tps,
        "latency_error_pct", le, "predicted_memory_bytes", (json_int_t)p->total, "measured_peak_memory_bytes",
        (json_int_t)m->peak_bytes, "measured_backend_peak_bytes", (json_int_t)m->backend_peak_bytes,
        "measured_rss_delta_bytes", (json_int_t)m->rss_delta_bytes, "naive_weights_plus_kv_bytes",
        (json_int_t)p->naive_bytes, "predicted_memory_items", cm_prediction_to_json(p), "memory_error_pct", me,
        "naive_memory_error_pct", ne, "predicted_backend_bytes_error_pct",
        pct_err((double)(p->weights + p->request_cache + p->prefill_workspace), (double)m->backend_peak_bytes));
    /* the phases apart, so a bias can be traced to prefill or decode */
    if (row && (json_object_set_new(row, "measured_prefill_ms", json_real(m->prefill_ms)) ||
                json_object_set_new(row, "measured_decode_ms", json_real(m->decode_ms)) ||
                json_object_set_new(row, "predicted_prefill_ms", json_real(p->prefill_ms)) ||
                json_object_set_new(row, "predicted_decode_ms", json_real(p->decode_ms)))) {
        json_decref(row);
        row = NULL;
    }
    return row;
}

json_t *cal_validation_json(const cm_tables *tb, const arch *varch, const ms_result *vres, int n_validate,
                            const cm_target *t, char *err, size_t errlen)
{
    json_t *rows = json_array();
    double lat_sum = 0, lat_max = 0, mem_sum = 0, mem_max = 0, naive_sum = 0, naive_max = 0;
    for (int v = 0; v < n_validate && rows; v++) {
        cm_prediction p;
        if (cm_predict(tb, &varch[v], &p, err, errlen)) {
            json_decref(rows);
            return NULL;
        }
        const ms_result *m = &vres[v];
        double le = pct_err(p.latency_ms, m->latency_ms), me = pct_err((double)p.total, (double)m->peak_bytes),
               ne = pct_err((double)p.naive_bytes, (double)m->peak_bytes);
        lat_sum += le;
        mem_sum += me;
        naive_sum += ne;
        lat_max = le > lat_max ? le : lat_max;
        mem_max = me > mem_max ? me : mem_max;
        naive_max = ne > naive_max ? ne : naive_max;
        json_t *row = validation_row(&p, &varch[v], m, le, me, ne);
        if (!row || json_array_append_new(rows, row)) {
            json_decref(rows);
            rows = NULL;
        }
    }
    if (!rows) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    int nv = n_validate > 0 ? n_validate : 1;
    json_t *v = json_pack("{s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:s,s:s,s:o}", "archs", n_validate, "latency_mape_pct",
                          lat_sum / nv, "latency_max_pct", lat_max, "memory_mape_pct", mem_sum / nv, "memory_max_pct",
                          mem_max, "naive_memory_mape_pct", naive_sum / nv, "naive_memory_max_pct", naive_max,
                          "measured_memory",
                          cm_target_llamacpp(t) ? "RSS high-water mark of a fresh llama.cpp process (ac-llama)"
                          : strcmp(t->device, "cpu")
                              ? "a fresh process of the built-in engine (autocompress measure): the device memory it "
                                "held (the engine's peak and what it keeps outside its accounting)"
                              : "the RSS high-water mark of a fresh process of the built-in engine (autocompress "
                                "measure) since it started",
                          "measured_latency",
                          cm_target_llamacpp(t) ? "the faster of two fresh llama.cpp processes (ac-llama), each the "
                                                  "median of its requests"
                                                : "median of the arch's requests, interleaved with the tables' requests",
                          "rows", rows);   /* rows stolen */
    if (!v)
        snprintf(err, errlen, "out of memory");
    return v;
}

/* The level of the archs a search compares, per phase: the median over the fit archs of
 * the mean of each one's two servings (as: a job's checks and measure stage take medians,
 * not the faster process) over the tables' prediction, into *lp, *ld. 0 (both 0 when there
 * are no fit archs), or -1 with err. */
static int fit_level(const cm_tables *tb, const arch *va, const ms_result *as, int from, int n, double *lp,
                     double *ld, char *err, size_t errlen)
{
    double rp[256], rd[256];
    int k = 0;
    *lp = *ld = 0;
    for (int v = from; v < from + n && k < 256; v++) {
        cm_prediction p;
        if (cm_predict(tb, &va[v], &p, err, errlen))
            return -1;
        double mp = (as[2 * v].prefill_ms + as[2 * v + 1].prefill_ms) / 2,
               md = (as[2 * v].decode_ms + as[2 * v + 1].decode_ms) / 2;
        if (p.prefill_ms > 0 && p.decode_ms > 0 && mp > 0 && md > 0) {
            rp[k] = mp / p.prefill_ms;
            rd[k++] = md / p.decode_ms;
        }
    }
    if (k) {
        *lp = ms_median(rp, k);
        *ld = ms_median(rd, k);
    }
    return 0;
}

/* The held-out archs as a job's search prices them (calibrate_internal.h). */
int cal_anchored_validation(cm_tables *tb, const arch *parent, const arch *va, const ms_result *as,
                            const ms_result *par, int n_par, int n, int n_fit, json_t *validation, char *err,
                            size_t errlen)
{
    cm_prediction pp;
    if (cm_predict(tb, parent, &pp, err, errlen))
        return -1;
    double lp[64], lpre[64], ldec[64];
    for (int k = 0; k < n_par && k < 64; k++) {
        lp[k] = par[k].latency_ms;
        lpre[k] = par[k].prefill_ms;
        ldec[k] = par[k].decode_ms;
    }
    n_par = n_par < 64 ? n_par : 64;
    json_t *pl = json_array();   /* in serving order: ms_median sorts lp */
    for (int k = 0; pl && k < n_par; k++)
        if (json_array_append_new(pl, json_real(lp[k]))) {
            json_decref(pl);
            pl = NULL;
        }
    double mp = ms_median(lpre, n_par), md = ms_median(ldec, n_par), ml = ms_median(lp, n_par);
    if (n_par < 1 || pp.prefill_ms <= 0 || pp.decode_ms <= 0 || mp <= 0 || md <= 0) {
        json_decref(pl);
        return 0;   /* nothing to scale by */
    }
    double sp = mp / pp.prefill_ms, sd = md / pp.decode_ms, fp, fd;
    if (fit_level(tb, va, as, n, n_fit, &fp, &fd, err, errlen)) {
        json_decref(pl);
        return -1;
    }
    tb->parent_bias_prefill = fp > 0 ? sp / fp : 0;
    tb->parent_bias_decode = fd > 0 ? sd / fd : 0;
    double far = CM_PARENT_BIAS_MAX, bx = tb->parent_bias_prefill, by = tb->parent_bias_decode;
    if ((bx > 0 && (bx > far || bx < 1 / far)) || (by > 0 && (by > far || by < 1 / far))) {
        json_decref(pl);
        snprintf(err, errlen,
                 "llama.cpp: the parent measured %.3gx (prefill) and %.3gx (decode) its prediction, the fit archs "
                 "%.3gx and %.3gx: the tables do not price the parent (its bias is beyond %gx)",
                 sp, sd, fp, fd, far);
        return -1;
    }
    double bp = tb->parent_bias_prefill > 0 ? tb->parent_bias_prefill : 1,
           bd = tb->parent_bias_decode > 0 ? tb->parent_bias_decode : 1;
    json_t *rows = json_object_get(validation, "rows");
    double sum = 0, max = 0;
    for (int v = 0; v < n; v++) {
        cm_prediction p;
        if (cm_predict(tb, &va[v], &p, err, errlen)) {
            json_decref(pl);
            return -1;
        }
        double pred = p.prefill_ms * sp / bp + p.decode_ms * sd / bd;
        double meas = (as[2 * v].latency_ms + as[2 * v + 1].latency_ms) / 2;
        double e = meas > 0 ? 100.0 * fabs(pred - meas) / meas : 0;
        sum += e;
        max = e > max ? e : max;
        json_t *a = json_pack("{s:f,s:f,s:f}", "predicted_latency_ms", pred, "measured_latency_ms", meas,
                              "latency_error_pct", e);
        if (!a || json_object_set_new(json_array_get(rows, (size_t)v), "anchored", a)) {
            json_decref(pl);
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    if (json_object_set_new(validation, "latency_anchored_mape_pct", json_real(n > 0 ? sum / n : 0)) ||
        json_object_set_new(validation, "latency_anchored_max_pct", json_real(max)) ||
        json_object_set_new(validation, "anchor",
                            json_pack("{s:f,s:f,s:o*,s:{s:f,s:f},s:s}", "parent_predicted_ms", pp.latency_ms,
                                      "parent_measured_ms", ml, "parent_process_latencies_ms", pl, "parent_bias",
                                      "prefill", bp, "decode", bd, "method",
                                      "the tables' phases scaled by the parent's measured (the median of its "
                                      "servings in this run, one before each slot of random archs) over predicted "
                                      "time, divided by the parent's bias (that ratio over the fit archs' median of "
                                      "measured, the mean of two servings, over predicted): in the calibration, the "
                                      "tables times the fit archs' level; against the mean of the arch's two servings"))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}
