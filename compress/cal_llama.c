/* compress/cal_llama.c — calibration inside llama.cpp: the same timing tables and memory
 * model as the built-in engine's calibration, measured by serving random GGUF models at
 * the target's weight type in llama.cpp (compress/llamacpp.h), one fresh process each.
 *
 * llama.cpp times whole requests only, so per-part costs come from repeated blocks (the
 * method Puzzletron uses in vLLM): for each hidden size a base model (the grid's smallest
 * attention and MLP, then an MLP-only layer, so that every model has layers of unequal V
 * width as pruned archs do and llama.cpp picks the same attention kernels for all), and
 * for each grid entry the base followed by N copies of a block holding the entry; the
 * entry's cost is the difference over N, per phase (prefill, and decode in context bins,
 * each bin the median of its steps). An MLP entry's block has no attention (llama.cpp's
 * deci graph runs such a layer); an attention entry's block keeps the smallest MLP (deci
 * cannot run attention without an MLP), whose cost is taken off. What the base costs
 * beyond its parts is the hidden size's fixed cost. Every model is served in two passes,
 * a fresh process each, and the smaller time of the two kept: a process is at times slow
 * as a whole, never fast; the hidden sizes' passes take turns. Before each timed step a
 * calibration model reads the bytes by which the parent outweighs it (`ac-llama bench
 * --flush`): its blocks then find the caches as the parent's do, whether the parent fits
 * the last-level cache or not (flushing the whole cache over-prices a model that fits).
 * Held-out and fit archs (complete models, timed as served) are served once per pass
 * too, the faster process kept.
 * Mixtral, Qwen2-MoE and OLMoE ("paired": llama.cpp's llama, qwen2moe and olmoe graphs
 * hold one shape, attention beside experts, for every layer of a model) are calibrated at
 * the parent's hidden size and heads, one block = one whole layer: a model per expert
 * block, a count at the parent's expert width or at a narrower one of cal_moe_widths (its
 * base one layer of that block), the layer priced whole on its expert entry (its attention
 * entry 0: the two are never apart in a model llama.cpp runs). Every model holds one
 * count and one width, as a GGUF of those families does.
 * Memory comes from llama.cpp's own buffers: weights from its model buffer (embedding and
 * layers fitted apart, since the quantizer may store the embedding in another type), the
 * KV cache from its KV buffer, and the rest of the fresh process's RSS high-water mark as
 * each part's workspace (the touched pages of the compute buffer llama.cpp reserves, and
 * the runtime), combined as the largest over the layers. Held-out random archs (and
 * fit archs for the phase scales) are complete models served the same way.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/calibrate_internal.h"
#include "compress/llamacpp.h"
#include "engine/clock.h"
#include "engine/rng.h"
#include "storage/export.h"
#include "storage/fileio.h"

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

#define LC_COPIES 10    /* N repeated blocks */
#define LC_BASE_SERVINGS 3   /* base servings per pass: its error enters every entry */
#define LC_BINS 4       /* decode context bins */
#define LC_FIT_PER_HIDDEN 3   /* fit archs per hidden size, at least */
#define LC_RETRIES 2    /* extra servings of an entry priced <= 0 (retry_implausible) */

/* One served model, reduced: median prefill, median per-step decode in each bin. */
typedef struct {
    double pre, bin[LC_BINS];
} lc_times;

typedef struct {
    const arch *parent;
    cm_target t;
    cal_opts o;
    int block, n_bins;
    int hybrid;                   /* one block per layer (nemotron_h, mamba2), else deci's layers */
    int paired;                   /* Mixtral, Qwen2-MoE, OLMoE: one shape, attention and experts,
                                     for every layer (llama.cpp's llama, qwen2moe, olmoe) */
    int eref;                     /* paired: the base's expert count ([eref] of fe, the parent's) */
    int attn;                     /* the base holds an attention layer (not mamba2's) */
    int hid[8], n_hid;
    int ah[64], akv[64], nA;      /* mixer grid codes (non-zero, quantizable; cal_mixer_apply):
                                     attention, and (m, -1) for m Mamba heads; [0] the base's
                                     attention when there is one */
    int fw[64], nF;               /* dense MLP widths (multiples of the block), ascending */
    int fe[64], nE;               /* MoE blocks: cal_moe_code grid codes (n experts of a width,
                                     0 the parent's; cal_mlp_apply) */
    int mref;                     /* a parent with Mamba: the mixer code ([mref] of ah) of the
                                     base's Mamba layer (the smallest head count); -1 none */
    char dir[4096], ppath[4400];  /* scratch folder; the parent's GGUF (the anchor) */
    int step, total;
    int retries;                  /* entries served again (retry_implausible), once each */
    int64_t requests;
    int n_models;
    dvec w_layer, w_embed, w_y, kv_x, kv_y;
    double t_start;
} lc_cal;

static void lcal_free(lc_cal *c)
{
    dvec *v[] = {&c->w_layer, &c->w_embed, &c->w_y, &c->kv_x, &c->kv_y};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        free(v[i]->v);
    if (*c->dir)
        (void)fio_remove_tree(c->dir);
}

/* How the calibration serves a model in llama.cpp: its warm-up, reps timed requests, the
 * weights' and prompts' seed, and the job's cancel hook (asked while the helper runs). */
static ms_opts serve_opts(const lc_cal *c, int reps, uint64_t seed)
{
    return (ms_opts){.warmup = c->o.warmup, .reps = reps, .seed = seed, .cancelled = c->o.cancelled,
                     .cancel_ud = c->o.ud};
}

static int tick(lc_cal *c, const char *what, char *err, size_t errlen)
{
    c->step++;
    if (c->o.progress && c->o.progress(c->o.ud, what, c->step, c->total))
        FAIL("cancelled");
    if (ms_quiet_cut(c->o.quiet))
        FAIL("made beside other work: set aside");
    return 0;
}

/* An arch at hidden h with n layers, each a mixer grid code (mh, mkv) and an MLP grid code
 * (mlp) of the parent's grids (cal_mixer_apply, cal_mlp_apply), the parent's globals. */
static int make_arch(const arch *parent, int h, int n, const int *mh, const int *mkv, const int *mlp, arch *out)
{
    arch_layer *ls = n > 0 ? calloc((size_t)n, sizeof *ls) : NULL;
    if (!ls)
        return -1;
    for (int i = 0; i < n; i++) {
        ls[i].source_layer = i < parent->n_layers ? i : parent->n_layers - 1;
        cal_mixer_apply(parent, mh[i], mkv[i], &ls[i]);
        cal_mlp_apply(parent, mlp[i], &ls[i]);
    }
    arch a = *parent;
    a.hidden_size = h;
    a.n_layers = n;
    a.layers = ls;
    int rc = arch_copy(out, &a);
    free(ls);
    return rc;
}

/* 1 when the grid point's layer (mixer code nh, nkv; MLP code ffn) quantizes at the block. */
static int code_fits(const lc_cal *c, int nh, int nkv, int ffn)
{
    arch_layer l;
    memset(&l, 0, sizeof l);
    cal_mixer_apply(c->parent, nh, nkv, &l);
    cal_mlp_apply(c->parent, ffn, &l);
    arch one = *c->parent;
    one.n_layers = 1;
    one.layers = &l;
    return cm_arch_fits_block(&one, c->block, NULL, 0);
}

/* The attention KV elements of a's request cache, and in *state the Mamba state's
 * (llama.cpp's RS buffer holds that in f32 beside the KV cache of the target's type). */
static double kv_elems(const arch *a, const cm_target *t, double *state)
{
    return cm_cache_elems(a, t->batch_size, t->prompt_tokens + t->output_tokens, state) - *state;
}

#define LC_STATE_BYTES 4.0   /* llama.cpp's recurrent state type: f32 */

/* Serve `a` once in llama.cpp (reps from o), reduce into *tm and the bench's fields into
 * *r (may be NULL), and record the memory samples. 0, or -1 with err. */
static int serve(lc_cal *c, const arch *a, int reps, int64_t flush, lc_times *tm, ms_result *r, int64_t *workspace,
                 char *err, size_t errlen)
{
    ms_opts mo = serve_opts(c, reps, c->o.seed + (uint64_t)c->n_models);
    lc_bench b;
    if (lc_measure_arch(a, &c->t, &mo, flush, c->dir, &b, err, errlen)) {
        char sum[512];   /* which model: the calibration serves hundreds */
        arch_summary(a, sum, sizeof sum);
        size_t n = strlen(err);
        snprintf(err + n, errlen > n ? errlen - n : 0, " (serving %s)", sum);
        return -1;
    }
    c->n_models++;
    c->requests += mo.warmup + reps;
    int N = b.n_steps, R = b.reps, rc = -1;
    double *x = calloc((size_t)R, sizeof(double));
    if (!x) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    for (int i = 0; i < R; i++)
        x[i] = b.prefill_ms[i];
    tm->pre = ms_median(x, R);
    /* decode: per context bin, the median of every step of every request in it (a step
     * preempted on a shared machine does not move it) */
    double *steps = calloc((size_t)R * (size_t)N, sizeof(double));
    if (!steps) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    for (int k = 0; k < c->n_bins; k++) {
        int s0 = k * N / c->n_bins, s1 = (k + 1) * N / c->n_bins, n = 0;
        for (int i = 0; i < R; i++)
            for (int st = s0; st < s1; st++)
                steps[n++] = b.decode_ms[(size_t)i * N + st];
        tm->bin[k] = ms_median(steps, n);
    }
    free(steps);
    if (r)
        lc_bench_result(&b, &c->t, r);
    /* What the process holds beyond weights and KV cache: the pages of llama.cpp's
     * compute buffer the requests touch (it reserves for a full ubatch) and the runtime
     * (libraries, threads, allocator). Measured per part; the tables' workspace. */
    if (workspace)
        *workspace = b.rss_peak - b.buf_model - b.buf_kv;
    double embed = (double)a->vocab_size * a->hidden_size * (a->tie_word_embeddings ? 1 : 2), st;
    double kv = kv_elems(a, &c->t, &st);
    if (cali_dvec_push(&c->w_layer, (double)arch_params(a) - embed) || cali_dvec_push(&c->w_embed, embed) ||
        cali_dvec_push(&c->w_y, (double)b.buf_model) || cali_dvec_push(&c->kv_x, kv) ||
        cali_dvec_push(&c->kv_y, (double)b.buf_kv - LC_STATE_BYTES * st)) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    rc = 0;
out:
    free(x);
    lc_bench_free(&b);
    return rc;
}

/* The grids the tables cover, cut to the weight type's block; the hidden sizes. */
static int setup(lc_cal *c, char *err, size_t errlen)
{
    const arch *p = c->parent;
    c->paired = arch_moe_family(p);
    char an[16], why[512];
    if (c->paired && exp_gguf_arch(p, an, sizeof an, why, sizeof why))
        FAIL("llama.cpp calibration: %s", why);
    if (!c->paired && strcmp(p->family, "llama") && strcmp(p->family, "nemotron_h") && strcmp(p->family, "mamba2"))
        FAIL("llama.cpp calibration: family \"%s\" is not built (llama, mixtral, qwen2_moe, olmoe, nemotron_h and "
             "mamba2 are)", p->family);
    c->hybrid = arch_hybrid(p);
    c->block = cm_target_block(&c->t, p);
    if (c->block > 1 && !cm_arch_fits_block(p, c->block, why, sizeof why) && c->block == 32)
        FAIL("llama.cpp at %s: the parent itself does not quantize (%s); choose f16, bf16 or f32", c->t.precision,
             why);
    int h[64], kv[64], f[64];
    int nA = cal_grid_attention(p, h, kv, 64), nF = cal_grid_mlp(p, f, 64, 1);
    if (c->paired) {   /* the parent's attention only: llama.cpp holds one head count per model */
        h[0] = p->layers[0].n_heads;
        kv[0] = p->layers[0].n_kv_heads;
        nA = 1;
    }
    for (int i = 0; i < nA; i++)
        if (h[i] > 0 && code_fits(c, h[i], kv[i], 0)) {
            c->ah[c->nA] = h[i];
            c->akv[c->nA++] = kv[i];
        }
    for (int i = 0; i < nF; i++) {
        if (f[i] < 0) {   /* experts of a width (llama.cpp's nemotron_h_moe holds 2 or more), and
                             the parent's experts beside a narrower shared expert or in a
                             narrower latent (one of each per model, as the GGUF holds them) */
            int ok = cal_moe_is_shared(f[i]) || cal_moe_is_latent(f[i]) || -f[i] % CAL_MOE_BASE >= 2;
            if (ok && code_fits(c, 0, 0, f[i]))
                c->fe[c->nE++] = f[i];
            continue;
        }
        int w = f[i] / c->block * c->block;
        if (w <= 0)
            continue;
        int dup = 0;
        for (int k = 0; k < c->nF; k++)
            dup |= c->fw[k] == w;
        if (!dup)
            c->fw[c->nF++] = w;
    }
    /* ascending, so [0] is the smallest */
    for (int i = 1; i < c->nF; i++)
        for (int k = i; k > 0 && c->fw[k - 1] > c->fw[k]; k--) {
            int t = c->fw[k];
            c->fw[k] = c->fw[k - 1];
            c->fw[k - 1] = t;
        }
    /* the base's attention: the smallest (its Mamba layer, mref below, is the smallest head
     * count; a Mamba entry's base holds the entry's, llama.cpp holding one per model) */
    int amin = -1;
    for (int i = 0; i < c->nA; i++)
        if (c->akv[i] >= 0 && (amin < 0 || c->ah[i] < c->ah[amin] || (c->ah[i] == c->ah[amin] && c->akv[i] < c->akv[amin])))
            amin = i;
    if (amin > 0) {
        int t = c->ah[0], u = c->akv[0];
        c->ah[0] = c->ah[amin];
        c->akv[0] = c->akv[amin];
        c->ah[amin] = t;
        c->akv[amin] = u;
    }
    c->mref = -1;   /* llama.cpp's nemotron_h needs a Mamba layer in every model */
    for (int i = 0; i < c->nA; i++)
        if (c->akv[i] < 0 && (c->mref < 0 || c->ah[i] < c->ah[c->mref]))
            c->mref = i;
    if (c->nF + c->nE + c->nA > 128)
        FAIL("llama.cpp calibration: %d grid entries per hidden size (at most 128)", c->nF + c->nE + c->nA);
    c->attn = amin >= 0;
    if (!c->attn && strcmp(p->family, "mamba2"))   /* nemotron_h makes a KV cache in any case */
        FAIL("llama.cpp calibration of a nemotron_h parent without attention layers is not built (llama.cpp's "
             "nemotron_h needs one in every model)");
    if (!c->hybrid && !c->paired && !c->nF)
        FAIL("llama.cpp at %s: no MLP size of the grid has widths in blocks of %d", c->t.precision, c->block);
    if (arch_first_moe(p, NULL) && !c->nE)
        FAIL("llama.cpp at %s: the parent's expert widths are not multiples of the weight type's block (%d)",
             c->t.precision, c->block);
    c->eref = -1;   /* paired: the base holds the parent's expert count */
    for (int i = 0; c->paired && i < c->nE; i++)
        if (c->fe[i] == cal_moe_code(p->layers[0].moe.n_experts, 0))
            c->eref = i;
    if (c->paired && (c->eref < 0 || !c->nA))
        FAIL("llama.cpp at %s: the parent's layer does not quantize in blocks of %d", c->t.precision, c->block);
    if (arch_first_mamba(p, NULL) && c->mref < 0)
        FAIL("llama.cpp at %s: no Mamba head count of the grid has d_inner in blocks of %d", c->t.precision,
             c->block);
    c->hid[c->n_hid++] = p->hidden_size;
    for (int i = 0; !c->paired && i < c->o.n_hidden && i < 16 && c->n_hid < 8; i++) {
        int w = c->o.hidden[i] / (c->block > 8 ? c->block : 8) * (c->block > 8 ? c->block : 8);
        int dup = w <= 0 || w >= p->hidden_size;
        for (int k = 0; k < c->n_hid; k++)
            dup |= c->hid[k] == w;
        if (!dup)
            c->hid[c->n_hid++] = w;
    }
    c->n_bins = c->t.output_tokens < LC_BINS ? c->t.output_tokens : LC_BINS;
    if (lc_scratch_dir(c->parent, c->dir, sizeof c->dir, err, errlen))
        return -1;
    /* the parent, served once before each slot of random archs: the level a job's search
     * anchors to (compress/servecheck.h), so the held-out rows check the prediction jobs make */
    ms_opts stop = serve_opts(c, 0, 1);
    return lc_write_random(p, &c->t, 1, c->dir, "anchor", c->ppath, sizeof c->ppath, NULL, &stop, err, errlen);
}

/* Least-squares line y = a + b x through (x[i], y[i]); one point: flat. */
static void line_fit(const double *x, const double *y, int n, double *a, double *b)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        sx += x[i];
        sy += y[i];
        sxx += x[i] * x[i];
        sxy += x[i] * y[i];
    }
    double d = n * sxx - sx * sx;
    *b = n > 1 && fabs(d) > 1e-12 ? (n * sxy - sx * sy) / d : 0;
    *a = n > 0 ? (sy - *b * sx) / n : 0;
}

/* Fill the entry of key `key` (prefill and decode) from the per-copy times d (prefill, bins). */
static void fill_entry(const lc_cal *c, cm_entry *pe, cm_entry *de, const cm_entry *key, const lc_times *d, int64_t ws,
                       int samples)
{
    *pe = *key;
    pe->ms = d->pre > 0 ? d->pre : 0;
    pe->workspace_bytes = ws;
    pe->samples = samples;
    *de = *pe;
    de->ms = 0;
    de->workspace_bytes = 0;
    double x[LC_BINS] = {0}, y[LC_BINS] = {0};
    int N = c->t.output_tokens;
    for (int k = 0; k < c->n_bins; k++) {
        int s0 = k * N / c->n_bins, s1 = (k + 1) * N / c->n_bins;
        de->ctx[k] = c->t.prompt_tokens + (s0 + s1 - 1) / 2;
        de->ctx_ms[k] = d->bin[k] > 0 ? d->bin[k] : 0;
        x[k] = de->ctx[k];
        y[k] = de->ctx_ms[k];
    }
    de->n_ctx = c->n_bins;
    line_fit(x, y, c->n_bins, &de->ms0, &de->ms_per_ctx);
    /* a noisy line may dip below 0 at an end: the tables' rule is >= 0 at every sampled
     * context, so it is the flat mean then */
    int neg = 0;
    for (int k = 0; k < c->n_bins; k++)
        neg |= de->ms0 + de->ms_per_ctx * de->ctx[k] < 0;
    if (neg) {
        double m = 0;
        for (int k = 0; k < c->n_bins; k++)
            m += y[k];
        de->ms0 = m / c->n_bins;
        de->ms_per_ctx = 0;
    }
}

static void diff_times(const lc_times *rep, const lc_times *base, const lc_times *minus, lc_times *out, int n_bins)
{
    out->pre = (rep->pre - base->pre) / LC_COPIES - (minus ? minus->pre : 0);
    for (int k = 0; k < n_bins; k++)
        out->bin[k] = (rep->bin[k] - base->bin[k]) / LC_COPIES - (minus ? minus->bin[k] : 0);
}

/* The models of one hidden size across the passes: the base's and each entry's times. */
typedef struct {
    lc_times base, rt[128], mbase[128];   /* mbase: a Mamba entry's own base */
    int64_t ws_base, ws[128], ws_mbase[128];
} lc_hid;

/* Per phase and bin, the smaller of two servings: a fresh process now and then is slow
 * as a whole (placement, a neighbour's burst), never fast. */
static void min2(lc_times *a, const lc_times *b, int n_bins)
{
    a->pre = b->pre < a->pre ? b->pre : a->pre;
    for (int k = 0; k < n_bins; k++)
        a->bin[k] = b->bin[k] < a->bin[k] ? b->bin[k] : a->bin[k];
}

/* Entries of a hidden size: the dense MLP widths, the expert counts, the mixers. */
static int n_entries(const lc_cal *c) { return c->nF + c->nE + c->nA; }

/* 1 when entry e is a Mamba mixer's other than the base's head count (mref): its model
 * needs a base of its own head count. */
static int own_base(const lc_cal *c, int e)
{
    int k = e - c->nF - c->nE;
    if (c->paired)   /* an expert count other than the base's: llama.cpp holds one per model */
        return e >= c->nF && k < 0 && e - c->nF != c->eref;
    return k >= 0 && c->akv[k] < 0 && k != c->mref;
}

/* 1 when entry e is served (paired: the attention entry is not: priced with the experts). */
static int served_entry(const lc_cal *c, int e) { return !c->paired || e < c->nF + c->nE; }

/* Layers of the base model: deci: the smallest attention and MLP, then an MLP-only layer
 * (so every calibration model has layers of unequal V width, as pruned archs do, and
 * llama.cpp picks the same attention kernels for all of them); one block per layer
 * (nemotron_h): the smallest attention alone, the smallest dense MLP alone if any, and a
 * Mamba layer if the parent has them: llama.cpp's nemotron_h needs one in every model, and
 * its head count is the model's, so a Mamba entry's base holds the entry's head count and
 * every other base the smallest (mref). */
static int base_layers(const lc_cal *c)
{
    return c->paired ? 1 : c->hybrid ? c->attn + (c->nF > 0) + (c->mref >= 0) : 2;
}

/* Layer l of the model of entry e as grid codes (e = -1: the base; e <= -2: the base of
 * Mamba entry -2 - e): the base's layers, then LC_COPIES blocks of the entry (deci: an
 * attention keeps the smallest MLP, since deci cannot run attention without one;
 * nemotron_h: each block alone). */
static void entry_layer(const lc_cal *c, int e, int l, int *mh, int *mkv, int *mlp)
{
    int nb = base_layers(c), own = e <= -2 ? -2 - e : e;
    *mh = *mkv = *mlp = 0;
    if (c->paired) {   /* every layer the parent's attention beside experts of one count */
        int k = l >= nb && e >= c->nF ? e - c->nF : own >= 0 && own_base(c, own) ? own - c->nF : c->eref;
        *mh = c->ah[0];
        *mkv = c->akv[0];
        *mlp = c->fe[k];
        return;
    }
    if (l < nb) {
        if (l == 0 && (!c->hybrid || c->attn)) {
            *mh = c->ah[0];
            *mkv = c->akv[0];
            *mlp = c->hybrid ? 0 : c->fw[0];
        } else if (!c->hybrid || (l == c->attn && c->nF)) {
            *mlp = c->fw[0];
        } else {   /* the hybrid's Mamba layer */
            int k = own >= 0 && own_base(c, own) ? own - c->nF - c->nE : c->mref;
            *mh = c->ah[k];
            *mkv = c->akv[k];
        }
        return;
    }
    if (e < c->nF) {
        *mlp = c->fw[e];
    } else if (e < c->nF + c->nE) {
        *mlp = c->fe[e - c->nF];
    } else {
        *mh = c->ah[e - c->nF - c->nE];
        *mkv = c->akv[e - c->nF - c->nE];
        *mlp = c->hybrid ? 0 : c->fw[0];
    }
}

/* Serve the model of entry e (-1: the base) at hidden H into *t (min with *t when again). */
static int serve_entry(lc_cal *c, int H, int e, int again, lc_times *t, int64_t *ws, char *err, size_t errlen)
{
    int nb = base_layers(c), n = e < 0 ? nb : nb + LC_COPIES, mh[3 + LC_COPIES], mkv[3 + LC_COPIES],
        mlp[3 + LC_COPIES];
    for (int l = 0; l < n; l++)
        entry_layer(c, e, l, &mh[l], &mkv[l], &mlp[l]);
    arch a;
    if (make_arch(c->parent, H, n, mh, mkv, mlp, &a))
        FAIL("out of memory");
    lc_times now;
    int64_t w;
    /* the bytes by which the parent outweighs this model, read before each step: the step
     * finds the caches as a step of the parent does (the models it prices are that size) */
    double bpw = lc_bytes_per_weight(c->t.precision);
    double over = ((double)arch_params(c->parent) - (double)arch_params(&a)) * bpw;
    int rc = serve(c, &a, c->o.reps, over > 0 ? (int64_t)over : 0, &now, NULL, &w, err, errlen);
    arch_free(&a);
    if (rc)
        return -1;
    if (again) {
        min2(t, &now, c->n_bins);
        *ws = w < *ws ? w : *ws;
    } else {
        *t = now;
        *ws = w;
    }
    return tick(c, e == -1 ? "llama.cpp base block" : e < 0 ? "llama.cpp Mamba bases" : e < c->nF ? "llama.cpp MLP blocks"
                : e < c->nF + c->nE ? "llama.cpp MoE blocks" : "llama.cpp mixer blocks", err, errlen);
}

/* One pass over the models of hidden size hid[hi] (base, MLP entries, attention
 * entries), each the smaller of its servings so far. The passes of all hidden sizes
 * alternate (cal_llama_run), so that a machine whose speed drifts during the run moves
 * every hidden size's tables alike, not one hidden size's all at once. */
static int pass_at(lc_cal *c, int hi, int pass, lc_hid *s, char *err, size_t errlen)
{
    int H = c->hid[hi], n = n_entries(c);
    /* An error in the base moves every entry of the hidden size, and an arch of L
     * layers sums 2L entries: it is served more often than the entries' models. */
    for (int b = 0; b < LC_BASE_SERVINGS; b++)
        if (serve_entry(c, H, -1, pass || b, &s->base, &s->ws_base, err, errlen))
            return -1;
    for (int e = 0; e < n; e++)
        if (!served_entry(c, e))
            s->ws[e] = s->ws_base;
        else if (serve_entry(c, H, e, pass, &s->rt[e], &s->ws[e], err, errlen) ||
            (own_base(c, e) && serve_entry(c, H, -2 - e, pass, &s->mbase[e], &s->ws_mbase[e], err, errlen)))
            return -1;
    return 0;
}

/* The cost of entry e of hidden size s: its model's time minus its reference's (its own
 * base or the shared one) over the copies, and for an attention entry of deci beside MLP
 * entries also minus the smallest MLP entry's cost (its blocks stand on one); zero for an
 * entry not served (paired: priced with the experts). The tables (tables_at) and the retry
 * of entries priced <= 0 (implausible) both read it, so they cannot disagree. */
static void entry_cost(const lc_cal *c, const lc_hid *s, int e, lc_times *d)
{
    lc_times mlp_min = {0};
    int mixer = e >= c->nF + c->nE;
    if (!served_entry(c, e)) {
        *d = mlp_min;
        return;
    }
    if (mixer && !c->hybrid && c->nF)
        entry_cost(c, s, 0, &mlp_min);
    diff_times(&s->rt[e], own_base(c, e) ? &s->mbase[e] : &s->base, mixer && !c->hybrid ? &mlp_min : NULL, d,
               c->n_bins);
}

/* The tables of hidden size hid[hi] from its models' times: each entry at its cost
 * (entry_cost), the base's own parts off the base's time as the fixed cost. */
static void tables_at(lc_cal *c, int hi, const lc_hid *s, cm_tables *tb)
{
    int H = c->hid[hi], n = n_entries(c), samples = 2 * c->o.reps;
    lc_times d;
    cm_entry *pe = &tb->prefill[tb->n_prefill], *de = &tb->decode[tb->n_decode];
    /* removed parts cost nothing in llama.cpp (the graph skips them) */
    lc_times zero = {0};
    cm_entry k0 = cal_entry_key(c->parent, CM_ATTN, H, 0, 0, 0), k1 = cal_entry_key(c->parent, CM_MLP, H, 0, 0, 0);
    fill_entry(c, pe++, de++, &k0, &zero, s->ws_base, 0);
    fill_entry(c, pe++, de++, &k1, &zero, s->ws_base, 0);
    for (int e = 0; e < n; e++) {
        int mixer = e >= c->nF + c->nE, k = e - c->nF - c->nE;
        entry_cost(c, s, e, &d);
        cm_entry key = mixer ? cal_entry_key(c->parent, CM_ATTN, H, c->ah[k], c->akv[k], 0)
                             : cal_entry_key(c->parent, CM_MLP, H, 0, 0, e < c->nF ? c->fw[e] : c->fe[e - c->nF]);
        fill_entry(c, pe++, de++, &key, &d, s->ws[e], served_entry(c, e) ? samples : 0);
    }
    int n_new = 2 + n;
    /* the base's own parts (its attention, its smallest MLPs: two in deci, none or one alone
     * in nemotron_h, and nemotron_h's Mamba layer; paired: its one layer, on the expert
     * entry of its count) off its time: the fixed cost of this hidden size */
    int n_mlp = c->paired ? 1 : c->hybrid ? c->nF > 0 : 2, at = 2 + c->nF + c->nE,
        mr = c->mref >= 0 ? at + c->mref : at, mi = c->paired ? 2 + c->nF + c->eref : 2;
    double na = !c->hybrid || c->attn;   /* mamba2's base has no attention */
    const cm_entry *pa = &tb->prefill[tb->n_prefill + at], *da = &tb->decode[tb->n_decode + at];
    const cm_entry *pm = &tb->prefill[tb->n_prefill + mi], *dm = &tb->decode[tb->n_decode + mi];
    const cm_entry *pr = &tb->prefill[tb->n_prefill + mr], *dr = &tb->decode[tb->n_decode + mr];
    double nr = c->mref >= 0;
    cm_fixed *fx = &tb->fixed[tb->n_fixed++];
    memset(fx, 0, sizeof *fx);
    fx->hidden_size = H;
    fx->prefill_other_ms = s->base.pre - na * pa->ms - n_mlp * pm->ms - nr * pr->ms;
    double sum = 0;
    for (int k = 0; k < c->n_bins; k++)
        sum += s->base.bin[k] - na * da->ctx_ms[k] - n_mlp * dm->ctx_ms[k] - nr * dr->ctx_ms[k];
    fx->decode_other_ms = sum / c->n_bins;
    fx->prefill_scale = fx->decode_scale = 1;
    fx->workspace_bytes = s->ws_base;
    tb->n_prefill += n_new;
    tb->n_decode += n_new;
}

/* Solve the 3x3 (or 2x2 with a single hidden size) least squares of the weights:
 * bytes = a * layer params + e * embedding params + b. */
static void weights_fit(const lc_cal *c, cm_memory *m)
{
    int n = c->w_y.n;
    double A[3][3] = {{0}}, r[3] = {0};
    int k = c->n_hid > 1 ? 3 : 2;
    for (int i = 0; i < n; i++) {
        double x[3] = {c->w_layer.v[i], 1, c->w_embed.v[i]};
        for (int p = 0; p < k; p++) {
            r[p] += x[p] * c->w_y.v[i];
            for (int q = 0; q < k; q++)
                A[p][q] += x[p] * x[q];
        }
    }
    /* Gaussian elimination (k <= 3, well conditioned after scaling by the diagonal) */
    double s[3];
    for (int p = 0; p < k; p++)
        s[p] = A[p][p] > 0 ? sqrt(A[p][p]) : 1;
    for (int p = 0; p < k; p++) {
        r[p] /= s[p];
        for (int q = 0; q < k; q++)
            A[p][q] /= s[p] * s[q];
    }
    for (int p = 0; p < k; p++) {
        double piv = A[p][p];
        if (fabs(piv) < 1e-12)
            continue;
        for (int q = p + 1; q < k; q++) {
            double f = A[q][p] / piv;
            for (int w = p; w < k; w++)
                A[q][w] -= f * A[p][w];
            r[q] -= f * r[p];
        }
    }
    double x[3] = {0, 0, 0};
    for (int p = k - 1; p >= 0; p--) {
        double v = r[p];
        for (int q = p + 1; q < k; q++)
            v -= A[p][q] * x[q];
        x[p] = fabs(A[p][p]) > 1e-12 ? v / A[p][p] : 0;
    }
    for (int p = 0; p < k; p++)
        x[p] /= s[p];
    m->weight_bytes_per_param = x[0] > 0 ? x[0] : 4;
    m->weight_overhead_bytes = (int64_t)llround(x[1]);
    m->embed_bytes_per_param = k == 3 && x[2] > 0 ? x[2] : 0;
}

static int build_memory(lc_cal *c, cm_tables *tb)
{
    weights_fit(c, &tb->mem);
    double a, b;
    line_fit(c->kv_x.v, c->kv_y.v, c->kv_x.n, &b, &a);
    tb->mem.kv_bytes_per_elem = a > 0 ? a : 2;
    tb->mem.state_bytes_per_elem = arch_first_mamba(c->parent, NULL) ? LC_STATE_BYTES : 0;
    tb->mem.kv_overhead_bytes = (int64_t)llround(b);
    tb->mem.workspace_combine = CM_WS_MAX;
    tb->mem.runtime_bytes = 0;   /* inside the per-part workspace (serve); fit_memory adds what whole archs show */
    return 0;
}

/* A random arch llama.cpp runs at the target's block: cal_random_arch at hidden h, widths
 * on the block; deci: layer 0 with attention, no attention without an MLP; nemotron_h and
 * mamba2: one Mamba head count and one expert count for the model (llama.cpp holds one of
 * each), and the blocks llama.cpp's graph needs in every model; paired: its depth and one
 * expert count, every layer the parent's otherwise. */
static int random_arch(lc_cal *c, uint64_t *rng, int h, arch *out)
{
    for (int tries = 0;; tries++) {   /* llama.cpp's nemotron_h needs a Mamba and an attention layer */
        if (cal_random_arch(c->parent, rng, out, 0))
            return -1;
        int n_attn = 0;
        for (int l = 0; l < out->n_layers; l++)
            n_attn += out->layers[l].n_heads > 0;
        if (c->mref < 0 || (arch_first_mamba(out, NULL) && (n_attn || !c->attn)) || tries == 64)
            break;
        arch_free(out);
    }
    out->hidden_size = h;
    if (c->paired) {   /* one shape for every layer: the parent's attention, one expert block */
        int code = c->fe[eng_xorshift64(rng) % (uint64_t)c->nE];
        for (int l = 0; l < out->n_layers; l++) {
            out->layers[l].n_heads = c->ah[0];
            out->layers[l].n_kv_heads = c->akv[0];
            cal_mlp_apply(c->parent, code, &out->layers[l]);
        }
        return 0;
    }
    int attn[64], mamba[64], na = 0, nm = 0, experts = 0;
    for (int k = 0; k < c->nA; k++) {
        if (c->akv[k] >= 0)
            attn[na++] = k;
        else
            mamba[nm++] = k;
    }
    int mh = nm ? c->ah[mamba[eng_xorshift64(rng) % (uint64_t)nm]] : 0;
    for (int l = 0; l < out->n_layers; l++) {
        arch_layer *L = &out->layers[l];
        if (L->n_heads && na && (L->n_heads * out->head_dim) % c->block) {
            int k = attn[eng_xorshift64(rng) % (uint64_t)na];
            L->n_heads = c->ah[k];
            L->n_kv_heads = c->akv[k];
        }
        if (L->mamba.n_heads)
            L->mamba.n_heads = mh;
        if (L->moe.n_experts) {
            if (!experts)
                experts = c->fe[eng_xorshift64(rng) % (uint64_t)c->nE];
            cal_mlp_apply(c->parent, experts, L);
        }
        if (!c->hybrid && l == 0 && !L->n_heads) {
            L->n_heads = c->ah[attn[na - 1]];
            L->n_kv_heads = c->akv[attn[na - 1]];
        }
        int w = L->ffn_dim / c->block * c->block;
        L->ffn_dim = L->ffn_dim && w < c->fw[0] ? c->fw[0] : w;
        if (!c->hybrid && L->n_heads && !L->ffn_dim)
            L->ffn_dim = c->fw[0];
    }
    return 0;
}

/* 1 when entry e of hidden size s measured no slower than its reference in some phase (its
 * cost would be clipped to 0: a process on its reference's side slow as a whole). */
static int implausible(const lc_cal *c, const lc_hid *s, int e)
{
    lc_times d;
    if (!served_entry(c, e))
        return 0;
    entry_cost(c, s, e, &d);
    int bad = d.pre <= 0;
    for (int k = 0; k < c->n_bins; k++)
        bad |= d.bin[k] <= 0;
    return bad;
}

/* Entry e of hidden size hid[h] served again with what its cost is measured against (its
 * own base or the shared one, and for an attention entry beside MLP entries the MLP entry
 * it stands on, rt[0]), each keeping the smaller time. 0, or -1 with err. */
static int serve_again(lc_cal *c, int h, lc_hid *s, int e, char *err, size_t errlen)
{
    int H = c->hid[h], own = own_base(c, e), on_mlp = e >= c->nF + c->nE && !c->hybrid && c->nF;
    c->total += 2 + on_mlp;
    if (serve_entry(c, H, e, 1, &s->rt[e], &s->ws[e], err, errlen) ||
        (own ? serve_entry(c, H, -2 - e, 1, &s->mbase[e], &s->ws_mbase[e], err, errlen)
             : serve_entry(c, H, -1, 1, &s->base, &s->ws_base, err, errlen)) ||
        (on_mlp && serve_entry(c, H, 0, 1, &s->rt[0], &s->ws[0], err, errlen)))
        return -1;
    return 0;
}

/* Serve the implausible entries (implausible) again (serve_again), up to LC_RETRIES times
 * each: with many entries (MoE blocks of several counts and widths) one of them now and
 * then meets a slow process on its reference's side (a process is at times slow as a
 * whole, never fast), and a block priced 0 is one the search would take for free. The
 * entries served again are counted in c->retries. 0, or -1 with err. */
static int retry_implausible(lc_cal *c, lc_hid *hs, char *err, size_t errlen)
{
    for (int h = 0; h < c->n_hid; h++)
        for (int e = 0; e < n_entries(c); e++) {
            if (!implausible(c, &hs[h], e))
                continue;
            c->retries++;
            for (int r = 0; r < LC_RETRIES && implausible(c, &hs[h], e); r++)
                if (serve_again(c, h, &hs[h], e, err, errlen))
                    return -1;
        }
    return 0;
}

/* Both passes of every hidden size's models in turn, the n random archs (va, in the
 * order given; held out, then fit) spread between them and each served once per pass:
 * like the tables' models, the faster of two fresh processes (a process is at times slow
 * as a whole, never fast) into vr, both servings into as[2i], as[2i + 1]. Before each
 * slot's random archs the parent is served once (par[], *n_par): the level a job's
 * anchor measures (compress/servecheck.h). The time spent on the random archs and the
 * parent is added to *wall. Then the entries priced <= 0 are served again
 * (retry_implausible). 0, or -1 with err. */
static int serve_passes(lc_cal *c, lc_hid *hs, const arch *va, ms_result *vr, ms_result *as, ms_result *par,
                        int *n_par, const int *order, int n, double *wall, char *err, size_t errlen)
{
    int reps = c->o.validate_reps > 0 ? c->o.validate_reps : 3;
    for (int slot = 0, v = 0; slot < 2 * c->n_hid; slot++) {
        int pass = slot / c->n_hid, h = slot % c->n_hid;
        if (pass_at(c, h, pass, &hs[h], err, errlen))
            return -1;
        double t0 = eng_wall_s();
        if (n > 0) {
            lc_bench pb;
            ms_opts po = serve_opts(c, reps, c->o.seed + 1);
            int prc = lc_bench_gguf(c->ppath, &c->t, &po, -1, &pb, err, errlen);
            if (prc == 0)
                lc_bench_result(&pb, &c->t, &par[(*n_par)++]);
            lc_bench_free(&pb);
            c->requests += c->o.warmup + reps;
            if (prc || tick(c, "llama.cpp parent (anchor)", err, errlen))
                return -1;
        }
        for (; v < (slot + 1) * 2 * n / (2 * c->n_hid); v++) {
            int i = order[v % n], again = v >= n;
            lc_times tm;
            ms_result r;
            if (serve(c, &va[i], reps, -1, &tm, &r, NULL, err, errlen) ||
                tick(c, i < c->o.validate ? "llama.cpp held-out archs" : "llama.cpp fit archs", err, errlen))
                return -1;
            if (!again || r.latency_ms < vr[i].latency_ms)
                vr[i] = r;
            as[2 * i + again] = r;
        }
        *wall += eng_wall_s() - t0;
    }
    return retry_implausible(c, hs, err, errlen);
}

json_t *cal_llama_run(const arch *parent, const cm_target *t, const cal_opts *o, const char *id, char *err,
                      size_t errlen)
{
    lc_cal c;
    memset(&c, 0, sizeof c);
    *err = 0;
    c.parent = parent;
    c.t = *t;
    c.o = *o;
    c.t_start = eng_wall_s();
    if (c.o.reps < 1 || c.o.warmup < 0) {
        snprintf(err, errlen, "calibration needs reps >= 1 and warmup >= 0");
        return NULL;
    }
    if (lc_target_resolve(&c.t, err, errlen))
        return NULL;
    cm_tables tb;
    memset(&tb, 0, sizeof tb);
    json_t *result = NULL;
    arch *va = NULL;
    ms_result *vr = NULL;
    lc_hid *hs = NULL;
    ms_result *as = NULL, par[64];   /* each random arch's two servings; the parent's servings */
    int n_par = 0;
    int n_fit = 0, n_all = 0;
    json_t *fit_hid = NULL;   /* the fit archs' phase factors per hidden size */
    if (setup(&c, err, errlen))
        goto out;
    /* fit archs: at least LC_FIT_PER_HIDDEN at each hidden size (fit_scales_by_hidden) */
    n_fit = o->fit > 0 ? (o->fit > LC_FIT_PER_HIDDEN * c.n_hid ? o->fit : LC_FIT_PER_HIDDEN * c.n_hid) : 0;
    n_all = o->validate + n_fit;
    int n_mb = 0;   /* the models served per hidden size and pass: entries, their own bases */
    for (int e = 0; e < n_entries(&c); e++)
        n_mb += served_entry(&c, e) + own_base(&c, e);
    c.total = 2 * (c.n_hid * (LC_BASE_SERVINGS + n_mb) + n_all) + (n_all ? 2 * c.n_hid : 0);
    int per = 2 + n_entries(&c);
    tb.prefill = calloc((size_t)(per * c.n_hid), sizeof *tb.prefill);
    tb.decode = calloc((size_t)(per * c.n_hid), sizeof *tb.decode);
    tb.fixed = calloc((size_t)c.n_hid, sizeof *tb.fixed);
    va = calloc((size_t)(n_all > 0 ? n_all : 1), sizeof *va);
    vr = calloc((size_t)(n_all > 0 ? n_all : 1), sizeof *vr);
    if (!tb.prefill || !tb.decode || !tb.fixed || !va || !vr) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    tb.target = c.t;
    snprintf(tb.family, sizeof tb.family, "%s", parent->family);
    tb.vocab_size = parent->vocab_size;
    tb.head_dim = parent->head_dim;
    tb.tie_word_embeddings = parent->tie_word_embeddings;
    tb.attention_bias = parent->attention_bias;
    snprintf(tb.source, sizeof tb.source, "llama.cpp");
    tb.width_multiple = c.block;
    /* The random archs (held out, then fit) are served between the hidden sizes' tables,
     * so that a machine whose speed drifts during the run (a shared or burstable host)
     * drifts under both alike. */
    uint64_t rng = (o->seed ? o->seed : 1) * 0x9E3779B97F4A7C15ull + 17;
    for (int v = 0; v < n_all; v++)
        if (random_arch(&c, &rng, c.hid[v % c.n_hid], &va[v])) {
            snprintf(err, errlen, "out of memory");
            goto out;
        }
    /* held-out and fit archs alternate (each list in its order) */
    int order[256], nh = 0, nf = 0;
    if (n_all > 256) {
        snprintf(err, errlen, "at most 256 held-out and fit archs");
        goto out;
    }
    for (int k = 0; k < n_all; k++)
        order[k] = (nf >= n_fit || (k % 2 == 0 && nh < o->validate)) ? nh++ : o->validate + nf++;
    double wall_random = 0;
    hs = calloc((size_t)c.n_hid, sizeof *hs);
    as = calloc((size_t)(2 * (n_all > 0 ? n_all : 1)), sizeof *as);
    if (!hs || !as) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    if (serve_passes(&c, hs, va, vr, as, par, &n_par, order, n_all, &wall_random, err, errlen))
        goto out;
    for (int h = 0; h < c.n_hid; h++)
        tables_at(&c, h, &hs[h], &tb);
    double wall_tables = eng_wall_s() - c.t_start - wall_random;
    build_memory(&c, &tb);
    double fit_p = 1, fit_d = 1;
    int64_t fit_mem = 0;
    if (n_fit && (fit_scales_by_hidden(&tb, va + o->validate, vr + o->validate, n_fit, LC_FIT_PER_HIDDEN - 1,
                                       &fit_p, &fit_d, &fit_hid, err, errlen) ||
                  fit_memory(&tb, va + o->validate, vr + o->validate, n_fit, &fit_mem, err, errlen)))
        goto out;
    snprintf(tb.id, sizeof tb.id, "%s", id);
    json_t *validation = cal_validation_json(&tb, va, vr, o->validate, &c.t, err, errlen);
    if (!validation)
        goto out;
    json_t *rows = json_object_get(validation, "rows");
    for (int v = 0; v < o->validate && v < (int)json_array_size(rows); v++)
        json_object_set_new(json_array_get(rows, v), "measured_process_latencies_ms",
                            json_pack("[f,f]", as[2 * v].latency_ms, as[2 * v + 1].latency_ms));
    if (cal_anchored_validation(&tb, parent, va, as, par, n_par, o->validate, n_fit, validation, err, errlen)) {
        json_decref(validation);
        goto out;
    }
    char hl[128] = "";
    for (int h = 0, n = 0; h < c.n_hid && n < 100; h++)
        n += snprintf(hl + n, sizeof hl - (size_t)n, "%s%d", h ? "," : "", c.hid[h]);
    lc_info in;
    json_t *tables = cm_tables_to_json(&tb), *target = cm_target_to_json(&c.t);
    cm_tables back;   /* what is written must read back (jobs and estimates parse it) */
    memset(&back, 0, sizeof back);
    if (tables && cm_tables_from_json(tables, "/tables", &back, err, errlen)) {
        json_decref(tables);
        json_decref(target);
        json_decref(validation);
        goto out;
    }
    cm_tables_free(&back);
    double now = eng_wall_s();
    if (tables && target && lc_probe(&in, err, errlen) == 0)
        result = json_pack("{s:s,s:s,s:o,s:s,s:i,s:f,s:o,s:o,s:{s:I,s:i,s:i,s:f,s:f,s:s,s:i,s:f,s:f,s:O*,s:I,s:s,s:i,s:i},"
                           "s:{s:s,s:s,s:s,s:s,s:s,s:s}}",
                           "id", id, "status", "succeeded", "target", target, "family", parent->family, "entries",
                           tb.n_prefill + tb.n_decode + 2 * tb.n_fixed, "wall_s", now - c.t_start, "tables", tables,
                           "validation", validation, "cost", "requests", (json_int_t)c.requests,
                           "calibration_models", c.n_models - n_all, "layers_per_model", 1 + LC_COPIES,
                           "tables_wall_s", wall_tables, "validation_wall_s", wall_random,
                           "hidden_sizes", hl, "fit_archs", n_fit, "fit_prefill_factor", fit_p, "fit_decode_factor",
                           fit_d, "fit_by_hidden", fit_hid, "fit_memory_bytes", (json_int_t)fit_mem, "method", "repeated blocks in llama.cpp (a base model vs base + N copies of a block)",
                           "repeated_copies", LC_COPIES, "retried_entries", c.retries, "engine", "name",
                           CM_ENGINE_LLAMACPP, "version", in.package_version, "ggml_commit", in.ggml_commit, "build_flags", in.build_flags,
                           "system_info", in.system_info, "engine_build", in.fingerprint);
    else {
        json_decref(tables);
        json_decref(target);
        json_decref(validation);
        if (!*err)
            snprintf(err, errlen, "out of memory");
    }
    if (!result && !*err)
        snprintf(err, errlen, "out of memory");
out:
    for (int v = 0; va && v < n_all; v++)
        arch_free(&va[v]);
    free(va);
    free(vr);
    free(hs);
    free(as);
    json_decref(fit_hid);
    cm_tables_free(&tb);
    lcal_free(&c);
    return result;
}
