/* compress/measure.c — real requests on the engine: prefill + greedy decode, timed with
 * a monotonic clock, memory from the backend's accounting and /proc/self (CPU).
 * Prompts are random tokens: timings do not depend on token values.
 */
#include "compress/measure.h"

#include "engine/devices.h"
#include "engine/procstat.h"
#include "engine/rng.h"
#include "engine/clock.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

/* Nanoseconds on the project's one monotonic clock. */
static double now_ns(void)
{
    return eng_wall_s() * 1e9;
}

int ms_trace_init(ms_trace *tr, int n_layers, int n_steps)
{
    memset(tr, 0, sizeof *tr);
    tr->n_layers = n_layers;
    tr->n_steps = n_steps;
    size_t L2 = (size_t)(n_layers > 0 ? n_layers : 1) * 2;
    tr->prefill_layer_ns = calloc(L2, sizeof(double));
    tr->decode_layer_ns = calloc(L2 * (size_t)n_steps, sizeof(double));
    tr->decode_fixed_ns = calloc(2 * (size_t)n_steps, sizeof(double));
    tr->decode_wall_ns = calloc((size_t)n_steps, sizeof(double));
    if (!tr->prefill_layer_ns || !tr->decode_layer_ns || !tr->decode_fixed_ns || !tr->decode_wall_ns) {
        ms_trace_free(tr);
        return -1;
    }
    return 0;
}

void ms_trace_free(ms_trace *tr)
{
    free(tr->prefill_layer_ns);
    free(tr->decode_layer_ns);
    free(tr->decode_fixed_ns);
    free(tr->decode_wall_ns);
    memset(tr, 0, sizeof *tr);
}

static void argmax_rows(const float *logits, int B, int V, int *out)
{
    for (int b = 0; b < B; b++) {
        const float *r = logits + (size_t)b * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (r[v] > r[best])
                best = v;
        out[b] = best;
    }
}

int ms_cancelled(const ms_opts *o)
{
    return o && o->cancelled && o->cancelled(o->cancel_ud) ? 1 : 0;
}

int ms_run_request(eng_model *m, eng_kv_cache *kv, const cm_target *t, uint64_t *rng, ms_trace *tr,
                   const ms_opts *o, double *prefill_ms, double *decode_ms, char *err, size_t errlen)
{
    int B = t->batch_size, S = t->prompt_tokens, N = t->output_tokens, V = m->a.vocab_size;
    int L = m->a.n_layers;
    int *tokens = malloc(sizeof(int) * (size_t)B * S), *next = malloc(sizeof(int) * (size_t)B);
    float *logits = malloc(sizeof(float) * (size_t)B * V);
    int rc = -1;
    if (!tokens || !next || !logits) {
        snprintf(err, errlen, "out of memory for a request of %d×%d tokens", B, S);
        goto out;
    }
    for (size_t i = 0; i < (size_t)B * S; i++)
        tokens[i] = (int)(eng_xorshift64(rng) % (uint64_t)V);
    eng_kv_reset(kv);
    eng_fwd_args fa;
    memset(&fa, 0, sizeof fa);
    fa.tokens = tokens;
    fa.B = B;
    fa.T = S;
    fa.kv = kv;
    fa.logits_mode = ENG_LOGITS_LAST;
    fa.logits = logits;
    if (tr) {
        fa.layer_ns = tr->prefill_layer_ns;
        fa.fixed_ns = tr->prefill_fixed_ns;
    }
    double t0 = now_ns();
    if (eng_forward(m, &fa, err, errlen))
        goto out;
    argmax_rows(logits, B, V, next);
    double t1 = now_ns();
    if (tr)
        tr->prefill_wall_ns = t1 - t0;
    fa.T = 1;
    fa.tokens = next;
    double asked_ns = 0;   /* the cancel hook's own time, not the decode's */
    for (int s = 0; s < N; s++) {
        if (o && o->cancelled) {
            double a0 = now_ns();
            if (ms_cancelled(o)) {
                snprintf(err, errlen, "cancelled");
                goto out;
            }
            asked_ns += now_ns() - a0;
        }
        double s0 = now_ns();
        if (tr) {
            fa.layer_ns = tr->decode_layer_ns + (size_t)s * L * 2;
            fa.fixed_ns = tr->decode_fixed_ns + (size_t)s * 2;
        }
        if (eng_forward(m, &fa, err, errlen))
            goto out;
        argmax_rows(logits, B, V, next);
        if (tr)
            tr->decode_wall_ns[s] = now_ns() - s0;
    }
    double t2 = now_ns();
    *prefill_ms = (t1 - t0) / 1e6;
    *decode_ms = (t2 - t1 - asked_ns) / 1e6;
    rc = 0;
out:
    free(tokens);
    free(next);
    free(logits);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double ms_median(double *x, int n)
{
    if (n <= 0)
        return 0;
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

double ms_mad(const double *x, int n, double median)
{
    double *d = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!d)
        return 0;
    for (int i = 0; i < n; i++)
        d[i] = fabs(x[i] - median);
    double r = ms_median(d, n);
    free(d);
    return r;
}

void ms_host_mark_now(ms_host_mark *m, int threads)
{
    memset(m, 0, sizeof *m);
    m->threads = threads > 0 ? threads : 0;
    m->own_cpu_s = eng_proc_cpu_s();
    m->ok = eng_cpu_ticks_now(&m->ticks) == 0 && m->own_cpu_s >= 0;
    m->wall_s = eng_wall_s();
}

void ms_host_load_since(const ms_host_mark *m, ms_host_load *out)
{
    memset(out, 0, sizeof *out);
    ms_host_mark now;
    ms_host_mark_now(&now, 0);
    out->wall_s = now.wall_s - m->wall_s;
    out->too_short = out->wall_s < MS_HOST_MIN_S;
    /* signed: a counter can go backwards (iowait; a CPU taken offline drops its counts) */
    int64_t total = (int64_t)(now.ticks.total - m->ticks.total), busy = (int64_t)(now.ticks.busy - m->ticks.busy),
            steal = (int64_t)(now.ticks.steal - m->ticks.steal);
    double hz = eng_cpu_tick_hz();
    if (!m->ok || !now.ok || total <= 0 || busy < 0 || steal < 0 || out->wall_s <= 0)
        return;
    double own = (now.own_cpu_s - m->own_cpu_s) * hz;   /* in ticks */
    long cores = lround((double)total / hz / out->wall_s);
    out->known = 1;
    out->others_cpu_pct = busy > own ? 100.0 * ((double)busy - own) / (double)total : 0;
    out->steal_pct = 100.0 * (double)steal / (double)total;
    out->cores = cores < 1 ? 1 : cores > 65536 ? 65536 : (int)cores;
    out->threads = m->threads > 0 && m->threads < out->cores ? m->threads : out->cores;
}

int ms_host_contended(const ms_host_load *l)
{
    if (!l->known || l->too_short)
        return 0;
    double others = (l->others_cpu_pct + l->steal_pct) / 100.0 * l->cores;   /* cores kept busy */
    return others >= l->cores - l->threads + MS_HOST_SLACK_CORES;
}

int ms_target_threads(const cm_target *t)
{
    if (cm_target_llamacpp(t))
        return t->threads;
    return strcmp(t->device, "cpu") ? 1 : 0;
}

json_t *ms_host_load_json(const ms_host_load *l)
{
    if (!l->known)
        return json_pack("{s:b,s:f}", "known", 0, "wall_s", l->wall_s);
    return json_pack("{s:b,s:f,s:f,s:i,s:i,s:f,s:b,s:b,s:s}", "known", 1, "others_cpu_pct", l->others_cpu_pct,
                     "steal_pct", l->steal_pct, "cores", l->cores, "threads", l->threads, "wall_s", l->wall_s,
                     "too_short", l->too_short, "contended", ms_host_contended(l), "method",
                     "/proc/stat: all processes' CPU time less this one's and its waited-for children's, and the "
                     "hypervisor's steal, each as a share of all cores' time over the stretch; contended when, "
                     "over 1 s or more, they kept more cores busy than the measurement's threads left idle, by a "
                     "quarter core or more");
}

int ms_host_load_note(const json_t *hl, char *buf, size_t cap)
{
    if (!json_is_true(json_object_get(hl, "contended")))
        return 0;
    snprintf(buf, cap, "other processes took %.0f%% of the cores' time and the hypervisor %.0f%% (over %.0f s)",
             json_number_value(json_object_get(hl, "others_cpu_pct")),
             json_number_value(json_object_get(hl, "steal_pct")), json_number_value(json_object_get(hl, "wall_s")));
    return 1;
}

/* Wait for a second in which other work leaves the measurement's cores to this process,
 * q->wait_s at most, asking q's cancel hook every 50 ms: 0 (quiet, or the wait is over),
 * 1 cancelled. */
static int wait_quiet(const ms_quiet_opts *q)
{
    double start = eng_wall_s();
    for (;;) {
        ms_host_mark mark;
        ms_host_mark_now(&mark, q->threads);
        ms_host_load l;
        do {
            if (q->cancelled && q->cancelled(q->cancel_ud))
                return 1;
            struct timespec ts = {0, 50 * 1000 * 1000};
            (void)nanosleep(&ts, NULL);   /* cut short by a signal: the load's own clock decides */
            ms_host_load_since(&mark, &l);
        } while (l.too_short);
        if (!ms_host_contended(&l) || eng_wall_s() - start >= q->wait_s)
            return 0;
    }
}

int ms_quiet_cut(ms_quiet_state *s)
{
    if (!s || s->last)
        return 0;
    ms_host_load l;
    ms_host_load_since(&s->mark, &l);
    if (!s->cut && ms_host_contended(&l)) {
        s->cut = 1;
        s->load = l;
    }
    return s->cut;
}

int ms_rounds_tick(void *rounds, int done)
{
    ms_rounds *r = rounds;
    r->done = done;
    return done < r->total && ms_quiet_cut(r->qs) ? MS_RUN_CUT : 0;
}

int ms_run_quiet(const ms_quiet_opts *q, int (*run)(void *ud, char *err, size_t errlen),
                 int (*aside)(void *ud, const ms_host_load *load, char *err, size_t errlen), void *ud,
                 ms_host_load *load, char *err, size_t errlen)
{
    for (int k = 0;; k++) {
        if (k > 0 && wait_quiet(q)) {
            snprintf(err, errlen, "cancelled");
            return 1;
        }
        ms_host_mark mark;
        ms_host_mark_now(&mark, q->threads);
        if (q->state)
            *q->state = (ms_quiet_state){.mark = mark, .last = k + 1 >= q->tries};
        int rc = run(ud, err, errlen);
        if (rc && rc != MS_RUN_CUT)
            return rc;
        if (rc == MS_RUN_CUT && q->state)
            *load = q->state->load;   /* what cut it */
        else
            ms_host_load_since(&mark, load);
        if (rc != MS_RUN_CUT && !ms_host_contended(load))
            return 0;
        if (k + 1 >= q->tries)
            return 2;
        if (aside(ud, load, err, errlen))
            return -1;
    }
}

void ms_args_of(const cm_target *t, const ms_opts *o, ms_args *a)
{
    snprintf(a->batch, sizeof a->batch, "%d", t->batch_size);
    snprintf(a->prompt, sizeof a->prompt, "%d", t->prompt_tokens);
    snprintf(a->output, sizeof a->output, "%d", t->output_tokens);
    snprintf(a->warmup, sizeof a->warmup, "%d", o && o->warmup >= 0 ? o->warmup : 1);
    snprintf(a->reps, sizeof a->reps, "%d", o && o->reps > 0 ? o->reps : 3);
    snprintf(a->seed, sizeof a->seed, "%llu", (unsigned long long)(o && o->seed ? o->seed : 1));
}

int64_t ms_rss_bytes(void)
{
    return eng_proc_status_bytes("VmRSS");
}

int64_t ms_rss_peak_bytes(void)
{
    return eng_proc_status_bytes("VmHWM");
}

int ms_rss_reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f)
        return -1;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* Shared by both entry points: warm-up, timed reps, medians, backend peak. */
static int measure_loop(eng_model *m, const cm_target *t, const ms_opts *o, ms_result *r, char *err, size_t errlen)
{
    eng_backend *be = m->be;
    int reps = o && o->reps > 0 ? o->reps : 3, warm = o && o->warmup >= 0 ? o->warmup : 1;
    uint64_t rng = (o && o->seed ? o->seed : 1) * 0x2545F4914F6CDD1DULL;
    size_t before = be->cur_bytes;
    eng_backend_reset_peak(be);
    eng_kv_cache *kv = eng_kv_new(m, t->batch_size, t->prompt_tokens + t->output_tokens);
    if (!kv)
        FAIL("out of memory for the KV cache (batch %d, %d positions)", t->batch_size,
             t->prompt_tokens + t->output_tokens);
    r->request_cache_bytes = (int64_t)(be->cur_bytes - before);
    double *lat = calloc((size_t)reps, sizeof(double)), *pre = calloc((size_t)reps, sizeof(double)),
           *dec = calloc((size_t)reps, sizeof(double));
    int rc = -1;
    if (!lat || !pre || !dec) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    for (int i = 0; i < warm + reps; i++) {
        double p, d;
        if (ms_cancelled(o)) {
            snprintf(err, errlen, "cancelled");
            goto out;
        }
        if (ms_run_request(m, kv, t, &rng, NULL, o, &p, &d, err, errlen))
            goto out;
        if (i >= warm) {
            pre[i - warm] = p;
            dec[i - warm] = d;
            lat[i - warm] = p + d;
        }
    }
    r->reps = reps;
    r->latency_ms = ms_median(lat, reps);
    r->latency_mad_ms = ms_mad(lat, reps, r->latency_ms);
    r->prefill_ms = ms_median(pre, reps);
    r->decode_ms = ms_median(dec, reps);
    r->throughput_tps = r->decode_ms > 0 ? 1000.0 * t->batch_size * t->output_tokens / r->decode_ms : 0;
    r->backend_peak_bytes = (int64_t)be->peak_bytes;
    rc = 0;
out:
    free(lat);
    free(pre);
    free(dec);
    eng_kv_free(kv);
    return rc;
}

void ms_peak_open(eng_backend *be)
{
    if (strcmp(be->name, "cpu") != 0)
        (void)eng_backend_runtime_bytes(be);   /* a GPU's pool slack counts from here */
}

void ms_peak_close(eng_backend *be, int64_t rss0, int64_t hwm, ms_result *r)
{
    r->backend_peak_bytes = (int64_t)be->peak_bytes;
    r->rss_delta_bytes = hwm >= 0 && rss0 >= 0 ? hwm - rss0 : -1;
    r->peak_bytes = r->rss_delta_bytes > r->backend_peak_bytes ? r->rss_delta_bytes : r->backend_peak_bytes;
    int64_t rt = strcmp(be->name, "cpu") ? eng_backend_runtime_bytes(be) : -1;   /* context, workspaces, slack */
    if (rt > 0)
        r->peak_bytes = r->backend_peak_bytes + rt;
}

int ms_measure_model(eng_model *m, int64_t rss0, const cm_target *t, const ms_opts *o, ms_result *r, char *err,
                     size_t errlen)
{
    eng_backend *be = m->be;
    r->params = arch_params(&m->a);
    r->weights_bytes = (int64_t)be->cur_bytes;
    r->process_peak_bytes = -1;
    eng_model_const(m, 1);   /* served: the weights hold still (eng_model_free ends it) */
    ms_peak_open(be);
    int rc = measure_loop(m, t, o, r, err, errlen);
    if (rc == 0)
        ms_peak_close(be, rss0, be->host_memory && rss0 >= 0 ? ms_rss_peak_bytes() : -1, r);
    return rc;
}

int ms_random_model(eng_backend *be, const arch *a, const ms_opts *o, eng_model *m, char *err, size_t errlen)
{
    if (eng_model_init(m, a, be, err, errlen))
        return -1;
    int drawn = eng_model_randomize_until(m, o && o->seed ? o->seed : 1, 0.02f, o ? o->cancelled : NULL,
                                          o ? o->cancel_ud : NULL);
    if (drawn) {
        eng_model_free(m);
        FAIL("%s", drawn > 0 ? "cancelled" : "out of memory drawing random weights");
    }
    return 0;
}

int ms_measure_arch(eng_backend *be, const arch *a, const cm_target *t, const ms_opts *o, ms_result *r,
                    char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    if (be->cur_bytes != 0)
        FAIL("measurement needs an idle backend (%zu bytes still allocated)", be->cur_bytes);
    int64_t rss0 = be->host_memory ? ms_rss_bytes() : -1;
    if (rss0 >= 0 && ms_rss_reset_peak() != 0)
        rss0 = -1;
    eng_model m;
    if (ms_random_model(be, a, o, &m, err, errlen))
        return -1;
    int rc = ms_measure_model(&m, rss0, t, o, r, err, errlen);
    eng_model_free(&m);
    return rc;
}

json_t *ms_result_to_json(const ms_result *r, const cm_target *t)
{
    return json_pack("{s:f,s:f,s:I,s:I,s:I,s:o,s:f,s:f,s:f,s:i}", "latency_ms", r->latency_ms,
                     "throughput_tokens_per_s", r->throughput_tps, "peak_memory_bytes", (json_int_t)r->peak_bytes,
                     "backend_peak_bytes", (json_int_t)r->backend_peak_bytes, "rss_delta_bytes",
                     (json_int_t)r->rss_delta_bytes, "process_peak_bytes",
                     r->process_peak_bytes > 0 ? json_integer(r->process_peak_bytes) : json_null(), "prefill_ms",
                     r->prefill_ms, "decode_ms_per_token", r->decode_ms / (t->output_tokens > 0 ? t->output_tokens : 1),
                     "latency_mad_ms", r->latency_mad_ms, "reps", r->reps);
}

int ms_results_median(const ms_result *rr, int n, ms_result *r)
{
    int idx[64];
    n = n < 64 ? n : 64;
    for (int k = 0; k < n; k++) {
        idx[k] = k;
        for (int j = k; j > 0 && rr[idx[j - 1]].latency_ms > rr[idx[j]].latency_ms; j--) {
            int x = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = x;
        }
    }
    int m = n > 0 ? idx[n / 2] : 0;
    if (n > 0)
        *r = rr[m];
    else
        memset(r, 0, sizeof *r);
    /* memory is a ceiling: the highest peak any of the servings reached, not the median one's */
    for (int k = 0; k < n; k++) {
        if (rr[k].peak_bytes > r->peak_bytes)
            r->peak_bytes = rr[k].peak_bytes;
        if (rr[k].process_peak_bytes > r->process_peak_bytes)
            r->process_peak_bytes = rr[k].process_peak_bytes;
    }
    return m;
}

json_t *ms_results_latencies_json(const ms_result *r, int n)
{
    json_t *j = json_array();
    for (int k = 0; j && k < n; k++)
        if (json_array_append_new(j, json_real(r[k].latency_ms))) {
            json_decref(j);
            return NULL;
        }
    return j;
}
