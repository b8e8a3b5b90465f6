/* compress/measure.h — measuring an arch on a target: build it (random or given
 * weights), serve real requests (prefill of B×S tokens, then N decode steps with greedy
 * sampling) and report median latency, tokens/s and peak memory. Peak memory is the
 * backend's byte accounting (device memory); on CPU the process RSS high-water delta is
 * reported beside it. Calibration (compress/calibrate.c) uses the same request loop.
 */
#ifndef AC_COMPRESS_MEASURE_H
#define AC_COMPRESS_MEASURE_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "compress/costmodel.h"
#include "engine/model.h"
#include "engine/procstat.h"

/* Per-step timings of one request (optional; arrays owned by the trace).
 *   prefill_layer_ns [L*2]      attention, mlp of each layer during the prefill
 *   prefill_fixed_ns [2]        embedding, final norm + LM head
 *   prefill_wall_ns             the prefill's wall time (forward + sampling)
 *   decode_layer_ns  [N*L*2]    per decode step
 *   decode_fixed_ns  [N*2]
 *   decode_wall_ns   [N] */
typedef struct {
    int n_layers, n_steps;
    double *prefill_layer_ns, prefill_fixed_ns[2], prefill_wall_ns;
    double *decode_layer_ns, *decode_fixed_ns, *decode_wall_ns;
} ms_trace;

/* Allocate a trace for L layers and N steps. Returns 0 or -1 (OOM). */
int ms_trace_init(ms_trace *tr, int n_layers, int n_steps);
void ms_trace_free(ms_trace *tr);

typedef struct {
    int warmup;          /* untimed requests first (default 1) */
    int reps;            /* timed requests (default 3) */
    uint64_t seed;       /* weights and prompts */
    /* Optional: non-zero stops the measurement, which then fails with err "cancelled".
     * Asked while the random weights are drawn (after each 2^20 values), before every
     * request and between its decode steps; while a llama.cpp helper serves
     * (compress/llamacpp.h), every 100 ms, and the helper is killed when it says stop.
     * A served model's request can take seconds, many on a loaded host: a cancel or a
     * shutdown must not wait for the rest of the measurement. */
    int (*cancelled)(void *ud);
    void *cancel_ud;
    int threads;         /* ms_measure_fresh on the CPU: the process's worker threads (0: every
                            core it may use, as the built-in engine serves) */
} ms_opts;

/* The workload of t and the serving counts of o (warm-up 1, 3 requests and seed 1 by
 * default) as a measuring child's arguments spell them: the llama.cpp helper's and
 * `autocompress measure`'s. */
typedef struct {
    char batch[16], prompt[16], output[16], warmup[16], reps[16], seed[24];
} ms_args;
void ms_args_of(const cm_target *t, const ms_opts *o, ms_args *a);

/* o's cancel hook asked now: 1 when it says stop, else 0 (also without o or a hook). */
int ms_cancelled(const ms_opts *o);

/* One request on model m at target t (B, S, N): random prompt tokens from *rng, a
 * prefill (logits of each row's last token), greedy next tokens, N decode steps.
 * kv must hold B rows of S+N positions; it is reset first. tr (optional) receives the
 * engine's per-part timings. *prefill_ms / *decode_ms get wall times (decode: all N
 * steps). stop (may be NULL): its cancel hook is asked before each decode step (its own
 * time kept out of the decode's), and the request then fails with err "cancelled".
 * Returns 0, or -1 with the engine's reason in err. */
int ms_run_request(eng_model *m, eng_kv_cache *kv, const cm_target *t, uint64_t *rng, ms_trace *tr,
                   const ms_opts *stop, double *prefill_ms, double *decode_ms, char *err, size_t errlen);

typedef struct {
    int reps;
    double latency_ms, latency_mad_ms;   /* median and MAD over reps */
    double prefill_ms, decode_ms;        /* medians */
    double throughput_tps;               /* B*N / median decode time */
    int64_t params;
    int64_t weights_bytes;               /* backend bytes of the model */
    int64_t request_cache_bytes;         /* backend bytes of the KV cache */
    int64_t backend_peak_bytes;          /* backend peak while serving (model + cache + workspace) */
    int64_t rss_delta_bytes;             /* CPU: process RSS high water minus RSS before the model; -1 if unknown */
    int64_t peak_bytes;                  /* what the memory limit is about: max(backend peak, RSS delta);
                                            measured in a fresh process on CPU (ms_measure_fresh), the
                                            whole process's RSS high-water mark */
    int64_t process_peak_bytes;          /* a fresh process on CPU (the built-in engine's, llama.cpp's): its
                                            RSS high-water mark since it started; -1 otherwise */
} ms_result;

/* Measure arch `a` with random weights on backend be (the target's device).
 * Returns 0, or -1 with a reason (invalid arch, out of memory, engine failure). */
int ms_measure_arch(eng_backend *be, const arch *a, const cm_target *t, const ms_opts *o, ms_result *r,
                    char *err, size_t errlen);

/* Model m of shape a on be with random weights (o's seed, 1 without; o's cancel hook asked
 * while they are drawn): what a measurement serves where weight values do not matter.
 * 0, or -1 with err ("cancelled", or why), nothing left allocated. */
int ms_random_model(eng_backend *be, const arch *a, const ms_opts *o, eng_model *m, char *err, size_t errlen);

/* Serve model m (built or loaded on its backend, nothing else allocated there) as
 * ms_measure_arch serves: rss0 is the process's RSS before the model was built (-1:
 * unknown), against which the RSS high-water mark counts. 0, or -1 with err. */
int ms_measure_model(eng_model *m, int64_t rss0, const cm_target *t, const ms_opts *o, ms_result *r, char *err,
                     size_t errlen);

/* The built-in engine measured in a fresh process of its own, as the user serves it:
 * `autocompress measure` (AC_AUTOCOMPRESS_BIN, else the autocompress program beside this
 * one or one folder above it) serving arch a with random weights (model_path NULL), or the
 * model at model_path loaded from its files (compress/prune.h prune_load_model; a NULL).
 * With o's warm-up, requests and seed; o's cancel hook kills the process. On CPU
 * r->peak_bytes is that process's whole RSS high-water mark (program, libraries, threads,
 * the load and the requests); on a GPU the backend's peak plus what it holds outside its
 * accounting, as ms_peak_close. 0, or -1 with err. */
int ms_measure_fresh(const arch *a, const char *model_path, const cm_target *t, const ms_opts *o, ms_result *r,
                     char *err, size_t errlen);

/* The measurement ms_measure_fresh asks for, made in this process (the `measure`
 * command): load the model at model_path, or build the arch at arch_path with random
 * weights (o's seed), on the target's backend, serve it (ms_measure_model) and return the
 * §10 measured object (ms_result_to_json) with params, weights_bytes,
 * request_cache_bytes, rss_before_model_bytes, load_ms and weights ("loaded" or
 * "random"). NEW reference, or NULL with err. */
json_t *ms_measure_process(const char *model_path, const char *arch_path, const cm_target *t, const ms_opts *o,
                           char *err, size_t errlen);

/* Of n servings of one model (at most 64 count): the one of median latency into *r, with
 * the highest peak (and process peak) any of them reached: a limit's ceiling. Returns the
 * index of the median one. */
int ms_results_median(const ms_result *rr, int n, ms_result *r);

/* Each of n servings' latency, as a NEW JSON array (NULL on OOM). */
json_t *ms_results_latencies_json(const ms_result *r, int n);

/* The measured peak of requests on be, one rule for every measurement: ms_peak_open before
 * the requests (a GPU's pool high water starts there), ms_peak_close after them: it fills
 * backend_peak_bytes, rss_delta_bytes (hwm - rss0: the RSS high water above the RSS before
 * the model; -1 when either is -1) and peak_bytes: on CPU the larger of the two, on a GPU
 * the backend's peak plus the memory it holds outside its accounting (the process's CUDA
 * context, workspaces, the pool's slack: eng_backend_runtime_bytes), which the memory
 * model's runtime item predicts. */
void ms_peak_open(eng_backend *be);
void ms_peak_close(eng_backend *be, int64_t rss0, int64_t hwm, ms_result *r);

/* The §10 "measured" object {latency_ms, throughput_tokens_per_s, peak_memory_bytes,
 * backend_peak_bytes, rss_delta_bytes, process_peak_bytes (null unless measured in a fresh
 * process on CPU), prefill_ms, decode_ms_per_token, latency_mad_ms, reps}.
 * New reference, NULL on OOM. */
json_t *ms_result_to_json(const ms_result *r, const cm_target *t);

/* Process memory (Linux /proc/self): current RSS and high-water mark in bytes; -1 when
 * unreadable. ms_rss_reset_peak resets the high-water mark to the current RSS
 * (returns 0, or -1 when the kernel refuses). */
int64_t ms_rss_bytes(void);
int64_t ms_rss_peak_bytes(void);
int ms_rss_reset_peak(void);

/* The machine's load from other work over a stretch of measuring (a calibration, a
 * served check, the measure stage). Timings taken beside other work are slow and
 * uneven: on a 2-core machine beside a 2-thread job, llama.cpp's threads wait on each
 * other in a spin and a calibration that takes 37 s alone was at 36% after 15 minutes
 * (docs/llamacpp.md). From /proc/stat: everything's CPU time less this process's (and
 * its waited-for children's: llama.cpp helpers), and the time a hypervisor stole, each a
 * share of all cores' time. */
typedef struct {
    int ok, threads;
    eng_cpu_ticks ticks;
    double own_cpu_s, wall_s;
} ms_host_mark;

typedef struct {
    int known;               /* 0 where /proc/stat or this process's CPU time is unreadable,
                                or its counts went backwards (CPU hotplug) */
    double others_cpu_pct;   /* other processes' CPU time, % of all cores' time */
    double steal_pct;        /* taken by the hypervisor, % of all cores' time */
    double wall_s;
    int cores, threads;      /* the machine's; the measurement's (all cores when 0 was given) */
    int too_short;           /* under MS_HOST_MIN_S: its 10 ms ticks are too coarse to judge */
} ms_host_load;

/* A measurement is contended when, over MS_HOST_MIN_S or more, other work (and the
 * hypervisor) kept more cores busy than the measurement's threads left idle, by
 * MS_HOST_SLACK_CORES or more: its threads then wait for cores (spin-waiting ones for
 * each other). It is said in the results and an event. */
#define MS_HOST_MIN_S 1.0
#define MS_HOST_SLACK_CORES 0.25

/* Start a stretch whose measurement runs `threads` threads (0: all cores). */
void ms_host_mark_now(ms_host_mark *m, int threads);
void ms_host_load_since(const ms_host_mark *m, ms_host_load *out);
int ms_host_contended(const ms_host_load *l);
/* The threads a measurement on target t runs: llama.cpp's t->threads; the built-in
 * engine's 0 on the CPU (its backend takes every core) and 1 on a GPU (the host thread
 * that launches its kernels: other work on the other cores does not slow it). */
int ms_target_threads(const cm_target *t);
/* {known, others_cpu_pct, steal_pct, cores, threads, wall_s, too_short, contended,
 * method}, or {known: false, wall_s}. NEW reference, NULL on OOM. */
json_t *ms_host_load_json(const ms_host_load *l);
/* When host load hl (ms_host_load_json's object) was contended: 1 and "other processes
 * took X% of the cores' time and the hypervisor Y% (over Z s)" in buf; else 0. */
int ms_host_load_note(const json_t *hl, char *buf, size_t cap);

/* A measurement other work must not slow (a search's anchor, the measure stage):
 * run(ud, err, errlen) (0; 1 cancelled; -1 with err; MS_RUN_CUT) is judged by the
 * machine's load over it (ms_host_contended, `threads` as ms_host_mark_now's). While it is
 * contended and runs remain, aside(ud, &load, err, errlen) (0, or -1 with err) sets its
 * results aside, then the function waits for a second in which other work leaves the
 * measurement's cores to it (wait_s at most, asking cancelled(cancel_ud), which may be
 * NULL, every 50 ms) and runs it again, `tries` runs in all. A run too short to judge
 * (under MS_HOST_MIN_S) is not contended. *load: the last run's. 0 when the last run was
 * not contended; 2 when every run was (the last run's results stand, not set aside); 1
 * cancelled; -1 with err.
 * A run made of steps (fresh processes, a calibration's requests) is judged on the load
 * so far too: with q->state set, it may ask ms_quiet_cut(state) between its steps and, on
 * 1, stop and return MS_RUN_CUT with its results so far, which are set aside with the
 * load judged then. So other work early in a try costs a wait and a new try at once,
 * where the whole try might have come out quiet enough; the last try is never cut. */
#define MS_QUIET_TRIES 3
#define MS_QUIET_WAIT_S 30.0
#define MS_RUN_CUT 3
typedef struct {
    ms_host_mark mark;   /* the run's start */
    int last;            /* 1 on the last try */
    int cut;             /* ms_quiet_cut said 1 during this run */
    ms_host_load load;   /* the load it judged then: the load of the try set aside */
} ms_quiet_state;
typedef struct {
    int threads, tries;
    double wait_s;
    int (*cancelled)(void *ud);
    void *cancel_ud;
    ms_quiet_state *state;   /* NULL: runs are judged whole */
} ms_quiet_opts;
/* 1 when the run that s describes is not its ms_run_quiet's last try and the load since
 * its start is judged contended (s->cut and s->load are set): the run should stop. 0
 * otherwise, also for a NULL s. */
int ms_quiet_cut(ms_quiet_state *s);
/* A run made of `total` rounds of fresh processes: after round `done` (1-based) it is
 * recorded, and MS_RUN_CUT is returned when rounds remain and ms_quiet_cut(qs) says the
 * run will be set aside; else 0. ms_rounds_tick(&r, done) fits lc_bench_alternating's
 * tick. */
typedef struct {
    ms_quiet_state *qs;
    int total, done;
} ms_rounds;
int ms_rounds_tick(void *rounds, int done);
int ms_run_quiet(const ms_quiet_opts *q, int (*run)(void *ud, char *err, size_t errlen),
                 int (*aside)(void *ud, const ms_host_load *load, char *err, size_t errlen), void *ud,
                 ms_host_load *load, char *err, size_t errlen);

/* Median and median absolute deviation of x[n] (x is reordered). */
double ms_median(double *x, int n);
double ms_mad(const double *x, int n, double median);

#endif
