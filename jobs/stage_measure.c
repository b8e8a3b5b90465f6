/* jobs/stage_measure.c — the "measure" stage: serve the job's workload on the target
 * with the parent's and the result's shapes and merge predicted vs measured latency,
 * throughput and peak memory into the report, with the itemized and the naive memory
 * estimate beside them. The result's shape is the first arch.json found in distill/,
 * prune/, search/. Writes measure.json (the same fragment, read by the export stage); the
 * limit rows are the report's (jobs/report.c computes them from these predicted/measured
 * objects).
 * Each model is served in three fresh processes, parent and result alternating, the
 * median kept, the highest peak memory taken and every process's latency shown: the
 * parent with random weights (latency and memory do not depend on weight values), the
 * result as the user serves it. In the built-in engine that is `autocompress measure`
 * loading the job's checkpoint; in llama.cpp the GGUF the job exports (its own weights at
 * the target's weight type, written here as model.gguf), and the report's "engine" names
 * the engine, its version and build, the weight type and how many tensors fell back.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "compress/costmodel.h"
#include "compress/llamacpp.h"
#include "compress/measure.h"
#include "engine/devices.h"
#include "jobs/pstate.h"
#include "jobs/stage.h"
#include "jobs/stages.h"
#include "storage/archjson.h"
#include "storage/ckpt.h"
#include "storage/export.h"
#include "storage/fileio.h"

/* ---------- llama.cpp: the GGUF the user downloads, served where they serve ---------- */

/* The job's final weights as a GGUF at the target's weight type, path in out (the
 * stage's model.gguf, which the export stage publishes). *fallbacks from the quantizer.
 * 0, or -1 with err; 1 when there are no weights (a search-only job). */
static int write_result_gguf(job_ctx *ctx, const cm_target *t, char *out, size_t cap, int *fallbacks,
                             char *note, size_t notelen, char *err, size_t errlen)
{
    const char *src = job_ctx_output(ctx, "distill", "student");
    if (!src)
        src = job_ctx_output(ctx, "prune", "student");
    if (!src)
        return 1;
    char dir[4096], f32[4400];
    snprintf(dir, sizeof dir, "%s", src);
    json_t *model = json_object_get(job_ctx_spec(ctx), "model");
    exp_opts o = {.dtype = EXP_FP32, .parent_path = json_string_value(json_object_get(model, "path")),
                  .parent_tokenizer = json_string_value(json_object_get(model, "tokenizer")),
                  .name = job_ctx_id(ctx)};
    snprintf(f32, sizeof f32, "%s/model.f32.gguf", job_ctx_stage_dir(ctx));
    snprintf(out, cap, "%s/model.gguf", job_ctx_stage_dir(ctx));
    eng_backend *be = eng_backend_cpu_new(t->threads);
    if (!be) {
        snprintf(err, errlen, "measure: out of memory");
        return -1;
    }
    eng_model m;
    exp_result res;
    memset(&res, 0, sizeof res);
    int rc = ckpt_load(dir, be, &m, err, errlen);
    if (rc == 0) {
        char e2[512];
        rc = exp_gguf_write(&m, f32, &o, &res, e2, sizeof e2);
        if (rc && o.parent_path) {   /* a vocabulary GGUF cannot carry: time the weights alone */
            o.parent_path = NULL;
            snprintf(note, notelen, "served without the parent's vocabulary (%s)", e2);
            rc = exp_gguf_write(&m, f32, &o, &res, err, errlen);
        } else if (rc) {
            snprintf(err, errlen, "%s", e2);
        }
        eng_model_free(&m);
    }
    eng_backend_free(be);
    if (rc == 0)
        rc = lc_quantize(f32, out, t->precision, t->threads, fallbacks,
                         &(ms_opts){.cancelled = job_cancelled_hook, .cancel_ud = ctx}, err, errlen);
    (void)unlink(f32);
    /* on disk before it is timed: the kernel's writeback would run on the timed cores */
    int fd = rc == 0 ? open(out, O_RDONLY | O_CLOEXEC) : -1;
    if (rc == 0 && (fd < 0 || fsync(fd))) {
        snprintf(err, errlen, "measure: %s: %s", out, strerror(errno));
        rc = -1;
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

/* The engine object of the report: name, version, build, weight type, KV type, threads. */
static json_t *engine_json(const cm_target *t, int fallbacks, const char *note)
{
    lc_info in;
    char e[256];
    if (lc_probe(&in, e, sizeof e))
        return NULL;
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:i,s:i,s:s}", "name", CM_ENGINE_LLAMACPP, "version",
                          in.package_version, "commit", in.ggml_commit, "precision", t->precision, "kv_cache_type",
                          t->kv_cache_type, "flash_attention",
                          cm_target_flash(t),
                          "threads", t->threads, "fallback_tensors", fallbacks, "engine_build", in.fingerprint);
    if (o && note && *note)
        json_object_set_new(o, "note", json_string(note));
    return o;
}

#define LC_ROUNDS 3     /* fresh processes per model, the models alternating */
#define LC_REQUESTS 3   /* timed requests per process, after one warm-up */

/* What this stage writes in the report, replaced whole when it runs again (after a
 * takeover): a try set aside, a prediction or a llama.cpp buffer list one run made and the
 * next did not must not stay. The parent's params are the search's too, and the same. */
static const char *const MEASURE_OWNS[] = {
    "engine", "measure_tries", "memory", "parent.measured", "parent.weights", "parent.predicted",
    "parent.naive_weights_plus_kv_bytes", "result.params", "result.measured", "result.weights", "result.predicted",
    "result.naive_weights_plus_kv_bytes", NULL};

/* Predicted (from tb) and measured objects of arch a from its n servings rr, each in a
 * fresh process: the serving of median latency, the highest peak of any, every serving's
 * latency beside it and how they were made (how). weights: what the model served held.
 * *med gets the median serving's index. NULL on OOM. */
static json_t *measured_json(const cm_tables *tb, const arch *a, const ms_result *rr, int n, const char *weights,
                             const char *how, const cm_target *t, int *med)
{
    cm_prediction p;
    char e2[256];
    int have_pred = tb && cm_predict(tb, a, &p, e2, sizeof e2) == 0;
    ms_result m;
    *med = ms_results_median(rr, n, &m);
    json_t *meas = ms_result_to_json(&m, t), *lat = ms_results_latencies_json(rr, n);
    if (meas) {
        json_object_set_new(meas, "process_latencies_ms", lat);
        json_object_set_new(meas, "method", json_string(how));
    } else {
        json_decref(lat);
    }
    json_t *out = json_pack("{s:I,s:o,s:s}", "params", (json_int_t)arch_params(a), "measured", meas, "weights",
                            weights);
    if (out && have_pred) {
        json_object_set_new(out, "predicted", cm_prediction_to_json(&p));
        json_object_set_new(out, "naive_weights_plus_kv_bytes", json_integer(p.naive_bytes));
    }
    return out;
}

/* measured_json of llama.cpp's benches b, with the buffers of the median process. */
static json_t *llama_measured(const cm_tables *tb, const arch *a, const lc_bench *b, int n, int exported,
                              const cm_target *t)
{
    ms_result rr[LC_ROUNDS];
    for (int k = 0; k < n; k++)
        lc_bench_result(&b[k], t, &rr[k]);
    char how[200];
    snprintf(how, sizeof how,
             "the median of %d fresh llama.cpp processes (ac-llama), parent and result alternating; each process "
             "a warm-up and the median of %d requests",
             LC_ROUNDS, LC_REQUESTS);
    int m;
    json_t *out = measured_json(tb, a, rr, n, exported ? "the exported GGUF" : "random", how, t, &m);
    json_t *meas = json_object_get(out, "measured");
    if (meas)
        json_object_set_new(meas, "llama_cpp_buffers",
                            json_pack("{s:I,s:I,s:I,s:I}", "model", (json_int_t)b[m].buf_model, "kv",
                                      (json_int_t)b[m].buf_kv, "compute", (json_int_t)b[m].buf_compute, "output",
                                      (json_int_t)b[m].buf_output));
    return out;
}

/* Where a measurement's rounds stand: the job, and the rounds (ms_rounds_tick's). */
typedef struct {
    job_ctx *ctx;
    ms_rounds r;
} rounds;

/* After each round: 1 cancelled; MS_RUN_CUT when the rounds so far were beside other work
 * and another try follows (the rest would be set aside with them); else 0. */
static int round_done(void *ud, int done)
{
    rounds *r = ud;
    job_progress(r->ctx, done, LC_ROUNDS);
    if (job_cancelled(r->ctx))
        return 1;
    return ms_rounds_tick(&r->r, done);
}

/* The parent (random weights at the target's type, in a scratch folder) and the result
 * (the GGUF at gguf, random weights when gguf is "" (a search-only job); none when
 * result is NULL) served LC_ROUNDS times each in fresh
 * processes, alternating A B A B: a machine whose speed drifts moves both alike. *pj and
 * *rj get their objects. 0; 1 cancelled; MS_RUN_CUT (qs: fewer rounds, beside other
 * work); -1 with err. */
static int measure_llama(job_ctx *ctx, ms_quiet_state *qs, const cm_tables *tb, const arch *parent,
                         const arch *result, const char *gguf, const cm_target *t, json_t **pj, json_t **rj,
                         char *err, size_t errlen)
{
    rounds rd = {ctx, {qs, LC_ROUNDS, 0}};
    char dir[4096], ppath[4400], rpath[4400];
    lc_bench pb[LC_ROUNDS], rb[LC_ROUNDS];
    memset(pb, 0, sizeof pb);
    memset(rb, 0, sizeof rb);
    if (lc_scratch_dir(parent, dir, sizeof dir, err, errlen))
        return -1;
    ms_opts o = {.warmup = 1, .reps = LC_REQUESTS, .seed = 1, .cancelled = job_cancelled_hook, .cancel_ud = ctx};
    int rc = lc_write_random(parent, t, 1, dir, "parent", ppath, sizeof ppath, NULL, &o, err, errlen) ? -1 : 0;
    if (rc == 0 && result && !*gguf)
        rc = lc_write_random(result, t, 2, dir, "result", rpath, sizeof rpath, NULL, &o, err, errlen) ? -1 : 0;
    else
        snprintf(rpath, sizeof rpath, "%s", gguf);
    if (rc == 0)
        rc = lc_bench_alternating(ppath, result ? rpath : NULL, t, &o, LC_ROUNDS, pb, result ? rb : NULL, round_done,
                                  &rd, err, errlen);
    if (rc == 0 || rc == MS_RUN_CUT) {
        *pj = llama_measured(tb, parent, pb, rd.r.done, 0, t);
        *rj = result ? llama_measured(tb, result, rb, rd.r.done, *gguf != 0, t) : NULL;
        if (!*pj || (result && !*rj)) {
            snprintf(err, errlen, "measure: out of memory");
            rc = -1;
        }
    }
    for (int k = 0; k < LC_ROUNDS; k++) {
        lc_bench_free(&pb[k]);
        lc_bench_free(&rb[k]);
    }
    (void)fio_remove_tree(dir);
    return rc;
}

/* The built-in engine: the parent (random weights) and the result (the job's checkpoint
 * at student, loaded as a user serves it; random weights of result when student is NULL,
 * a search-only job; none when result is NULL) served LC_ROUNDS times each in fresh
 * processes (autocompress measure), alternating A B A B. *pj and *rj get their objects.
 * 0; 1 cancelled; MS_RUN_CUT (qs: fewer rounds, beside other work); -1 with err. */
static int measure_builtin(job_ctx *ctx, ms_quiet_state *qs, const cm_tables *tb, const arch *parent,
                           const arch *result, const char *student, const cm_target *t, json_t **pj, json_t **rj,
                           char *err, size_t errlen)
{
    ms_result pr[LC_ROUNDS], rr[LC_ROUNDS];
    ms_opts o = {.warmup = 1, .reps = LC_REQUESTS, .seed = 1, .cancelled = job_cancelled_hook, .cancel_ud = ctx};
    rounds rd = {ctx, {qs, LC_ROUNDS, 0}};
    int rc = 0;
    for (int k = 0; k < LC_ROUNDS && !rc; k++) {
        if (ms_measure_fresh(parent, NULL, t, &o, &pr[k], err, errlen) ||
            (result && ms_measure_fresh(student ? NULL : result, student, t, &o, &rr[k], err, errlen)))
            return job_cancelled(ctx) ? 1 : -1;
        rc = round_done(&rd, k + 1);
        if (rc == 1)
            return 1;
    }
    char how[400];
    snprintf(how, sizeof how,
             "the median of %d fresh processes of the built-in engine (autocompress measure), parent and result "
             "alternating; each process a warm-up and the median of %d requests; memory the highest of the "
             "processes' peaks (on the CPU each process's RSS high-water mark since it started)",
             LC_ROUNDS, LC_REQUESTS);
    int m;
    *pj = measured_json(tb, parent, pr, rd.r.done, "random", how, t, &m);
    *rj = result ? measured_json(tb, result, rr, rd.r.done, student ? "the job's checkpoint" : "random", how, t, &m)
                 : NULL;
    if (!*pj || (result && !*rj)) {
        snprintf(err, errlen, "measure: out of memory");
        return -1;
    }
    return rc;
}

/* One measurement of the parent and the result in the target's engine (ms_run_quiet's
 * run), the latest objects in pj and rj; the measurements set aside in `aside`. */
typedef struct {
    job_ctx *ctx;
    int builtin;                    /* 1: the built-in engine; 0: llama.cpp */
    const char *student;            /* the built-in engine's result checkpoint (NULL: random) */
    const cm_tables *tb;            /* NULL: no predicted side */
    const arch *parent, *result;    /* result NULL: none */
    const char *gguf;               /* measure_llama's */
    const cm_target *t;
    json_t *pj, *rj, *aside;
    ms_quiet_state qs;              /* ms_run_quiet's: where the try stands */
} measure_run;

static int measure_pair(void *ud, char *err, size_t errlen)
{
    measure_run *r = ud;
    json_decref(r->pj);
    json_decref(r->rj);
    r->pj = r->rj = NULL;
    job_progress(r->ctx, 0, LC_ROUNDS);
    if (!r->builtin)
        return measure_llama(r->ctx, &r->qs, r->tb, r->parent, r->result, r->gguf, r->t, &r->pj, &r->rj, err,
                             errlen);
    return measure_builtin(r->ctx, &r->qs, r->tb, r->parent, r->result, r->student, r->t, &r->pj, &r->rj, err,
                           errlen);
}

/* A measurement beside other work: its latencies and load join r->aside, and an event says
 * it is measured again. */
static int measure_aside(void *ud, const ms_host_load *load, char *err, size_t errlen)
{
    measure_run *r = ud;
    json_t *hl = ms_host_load_json(load), *lat = json_object_get(json_object_get(r->rj, "measured"), "latency_ms");
    /* a try cut short (ms_quiet_cut) made fewer processes than LC_ROUNDS */
    size_t procs = json_array_size(json_object_get(json_object_get(r->pj, "measured"), "process_latencies_ms"));
    json_t *row = json_pack("{s:O,s:O*,s:I,s:O}", "parent_latency_ms",
                            json_object_get(json_object_get(r->pj, "measured"), "latency_ms"), "result_latency_ms",
                            lat, "processes", (json_int_t)procs, "host_load", hl);
    char note[300] = "", msg[500];
    (void)ms_host_load_note(hl, note, sizeof note);
    json_decref(hl);
    if (!row || json_array_append_new(r->aside, row)) {
        snprintf(err, errlen, "measure: out of memory");
        return -1;
    }
    snprintf(msg, sizeof msg,
             "measured beside other work: %s; set aside, measuring again after a quiet second (%.0f s at most)",
             note, MS_QUIET_WAIT_S);
    job_event(r->ctx, "measure.contended", msg, json_deep_copy(row));
    return 0;
}

/* measure_pair until other work did not slow it (ms_run_quiet): 0 with r->pj and r->rj
 * the kept measurement and *load its load (contended when every try was); 1 cancelled;
 * -1 with err. */
static int measure_quiet(measure_run *r, ms_host_load *load, char *err, size_t errlen)
{
    ms_quiet_opts q = {.threads = ms_target_threads(r->t), .tries = MS_QUIET_TRIES, .wait_s = MS_QUIET_WAIT_S,
                       .cancelled = job_cancelled_hook, .cancel_ud = r->ctx, .state = &r->qs};
    int rc = ms_run_quiet(&q, measure_pair, measure_aside, r, load, err, errlen);
    return rc == 2 ? 0 : rc;
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
    /* the level the search priced at: its anchor (the parent served then) */
    const char *sp = job_ctx_output(ctx, "search", "search.json");
    json_t *sdoc = sp && have_tb ? json_load_file(sp, 0, NULL) : NULL;
    json_t *an = json_object_get(json_object_get(sdoc, "served"), "anchor");
    if (an)
        cm_tables_rescale(&tb, json_number_value(json_object_get(an, "prefill_scale")),
                          json_number_value(json_object_get(an, "decode_scale")));
    json_decref(sdoc);
    err[0] = 0;
    int rc = -1;
    json_t *pj = NULL, *rj = NULL;
    int llama = cm_target_llamacpp(&t);
    json_t *engine = NULL;
    char gguf[4400] = "", note[600] = "";
    int fallbacks = 0;
    if (llama) {
        if (lc_target_resolve(&t, err, errlen))
            goto out;
        int w = have_result ? write_result_gguf(ctx, &t, gguf, sizeof gguf, &fallbacks, note, sizeof note, err,
                                                errlen)
                            : 1;
        if (w < 0)
            goto out;
        if (w > 0)
            gguf[0] = 0;
        engine = engine_json(&t, fallbacks, note);
    }
    const char *stp = job_ctx_output(ctx, "distill", "student");
    if (!stp)
        stp = job_ctx_output(ctx, "prune", "student");
    char student[4096] = "";   /* a copy: the next job_ctx_output reuses its buffer */
    if (stp)
        snprintf(student, sizeof student, "%s", stp);
    measure_run mr = {.ctx = ctx, .builtin = !llama, .student = *student ? student : NULL, .tb = have_tb ? &tb : NULL,
                      .parent = &parent, .result = have_result ? &result : NULL, .gguf = gguf, .t = &t,
                      .aside = json_array()};
    ms_host_load load;
    int q = mr.aside ? measure_quiet(&mr, &load, err, errlen) : -1;
    pj = mr.pj;
    rj = mr.rj;
    if (!mr.aside)
        snprintf(err, errlen, "measure: out of memory");
    if (q == 1 || q < 0) {
        rc = q;
        json_decref(mr.aside);
        goto out;
    }
    job_progress(ctx, 2, 2);
    /* the machine's load from other work over both measurements (they alternate) */
    json_t *hl = ms_host_load_json(&load);
    json_object_set(json_object_get(pj, "measured"), "host_load", hl);
    if (rj)
        json_object_set(json_object_get(rj, "measured"), "host_load", hl);
    char load_note[300], msg[600];
    if (ms_host_load_note(hl, load_note, sizeof load_note)) {
        snprintf(msg, sizeof msg,
                 "measured beside other work at each of %d tries, waiting up to %.0f s for a quiet second between "
                 "them: %s; these timings are slow and uneven",
                 MS_QUIET_TRIES, MS_QUIET_WAIT_S, load_note);
        job_event(ctx, "measure.contended", msg, json_deep_copy(hl));
    }
    json_decref(hl);
    json_t *frag = json_pack("{s:O}", "parent", pj);
    if (frag && engine)
        json_object_set(frag, "engine", engine);
    if (frag && json_array_size(mr.aside))
        json_object_set(frag, "measure_tries", mr.aside);
    json_decref(mr.aside);
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
    rc = job_report_replace(ctx, MEASURE_OWNS, frag) ? -1 : 0;   /* steals the other */
    if (rc)
        snprintf(err, errlen, "measure: cannot merge the report");
out:
    json_decref(engine);
    json_decref(pj);
    json_decref(rj);
    if (have_tb)
        cm_tables_free(&tb);
    arch_free(&parent);
    if (have_result)
        arch_free(&result);
    return rc;
}

void stage_measure_register(void)
{
    stage_register("measure", stage_measure_run);
}
