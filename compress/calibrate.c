/* compress/calibrate.c — builds timing tables and the memory model by running the
 * engine: calibration models whose layers sweep the part grid (timed per part by
 * eng_forward's layer_ns/fixed_ns), one-layer probe models for workspace bytes, and
 * held-out random archs measured interleaved with the calibration requests so that
 * machine load drifts hit tables and validation alike. Medians everywhere.
 */
#include "compress/calibrate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compress/measure.h"
#include "engine/devices.h"
#include "engine/model.h"
#include "storage/archjson.h"
#include "engine/clock.h"

#define MAX_ENTRIES 256
#define MAX_BINS 4

/* ---------- growable sample vectors ---------- */

typedef struct {
    double *v;
    int n, cap;
} dvec;

static int dvec_push(dvec *d, double x)
{
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 16;
        double *v = realloc(d->v, sizeof(double) * (size_t)cap);
        if (!v)
            return -1;
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n++] = x;
    return 0;
}

static double dvec_median(dvec *d, double *mad)
{
    double *tmp = malloc(sizeof(double) * (size_t)(d->n ? d->n : 1));
    if (!tmp) {
        *mad = 0;
        return 0;
    }
    memcpy(tmp, d->v, sizeof(double) * (size_t)d->n);
    double m = ms_median(tmp, d->n);
    *mad = ms_mad(tmp, d->n, m);
    free(tmp);
    return m;
}

static uint64_t xs64(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ULL;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* ---------- grids ---------- */

static void parent_dims(const arch *p, int *H, int *KV, int *F)
{
    *H = *KV = *F = 0;
    for (int i = 0; i < p->n_layers; i++) {
        const arch_layer *l = &p->layers[i];
        if (l->n_heads > *H) {
            *H = l->n_heads;
            *KV = l->n_kv_heads;
        }
        *F = l->ffn_dim > *F ? l->ffn_dim : *F;
    }
}

int cal_grid_attention(const arch *parent, int *heads, int *kv, int max)
{
    int H, KV, F, n = 0;
    parent_dims(parent, &H, &KV, &F);
    if (!H)
        return 0;
    int group = H / KV;
    for (int g = 1; g <= KV && n < max; g++) {
        heads[n] = g * group;
        kv[n++] = g;
    }
    for (int k = 1; k <= group && n < max; k++) {
        int dup = 0;
        for (int i = 0; i < n; i++)
            dup |= heads[i] == k * KV && kv[i] == KV;
        if (!dup) {
            heads[n] = k * KV;
            kv[n++] = KV;
        }
    }
    return n;
}

int cal_grid_mlp(const arch *parent, int *ffn, int max)
{
    int H, KV, F, n = 0;
    parent_dims(parent, &H, &KV, &F);
    if (!F)
        return 0;
    int low = (F / 32) / 8 * 8;
    if (low < 8)
        low = F < 8 ? F : 8;
    if (n < max)
        ffn[n++] = low;
    for (int k = 1; k <= 8 && n < max; k++) {
        int f = k == 8 ? F : (F * k / 8) / 8 * 8;
        if (f > ffn[n - 1])
            ffn[n++] = f;
    }
    return n;
}

eng_backend *cal_backend_new(const char *device, int threads, char *err, size_t errlen)
{
    if (threads > 0 && !strcmp(device, "cpu")) {
        eng_backend *be = eng_backend_cpu_new(threads);
        if (!be)
            snprintf(err, errlen, "out of memory creating the CPU backend");
        return be;
    }
    return eng_backend_new(device, err, errlen);
}

void cal_opts_default(cal_opts *o)
{
    memset(o, 0, sizeof *o);
    o->reps = 3;
    o->warmup = 1;
    o->n_models = 2;
    o->validate = 10;
    o->validate_reps = 3;
    o->fit = 6;
    o->seed = 1;
}

void cal_opts_search_hidden(cal_opts *o, const arch *parent)
{
    int c[4], n = cm_hidden_candidates(parent->hidden_size, c);
    o->n_hidden = 0;
    for (int i = 0; i < n; i++)
        o->hidden[o->n_hidden++] = c[i];
}

int cal_random_arch(const arch *parent, uint64_t *rng, arch *out)
{
    int H, KV, F;
    parent_dims(parent, &H, &KV, &F);
    int group = H && KV ? H / KV : 1;
    arch_layer *tmp = calloc((size_t)(parent->n_layers > 0 ? parent->n_layers : 1), sizeof *tmp);
    if (!tmp)
        return -1;
    int n = 0;
    for (int i = 0; i < parent->n_layers; i++) {
        if (xs64(rng) % 10 == 0 && parent->n_layers > 1)
            continue;   /* removed layer */
        arch_layer *l = &tmp[n];
        memset(l, 0, sizeof *l);
        l->source_layer = i;
        if (H && xs64(rng) % 7 != 0) {
            if (xs64(rng) % 5 == 0) {
                int k = 1 + (int)(xs64(rng) % (uint64_t)group);
                l->n_heads = k * KV;
                l->n_kv_heads = KV;
            } else {
                int g = 1 + (int)(xs64(rng) % (uint64_t)KV);
                l->n_heads = g * group;
                l->n_kv_heads = g;
            }
        }
        if (F && (xs64(rng) % 7 != 0 || l->n_heads == 0)) {
            int lo = F / 16 / 8, hi = F / 8;
            if (lo < 1)
                lo = 1;
            if (hi < lo)
                hi = lo;
            l->ffn_dim = 8 * (lo + (int)(xs64(rng) % (uint64_t)(hi - lo + 1)));
            if (l->ffn_dim > F)
                l->ffn_dim = F;
        }
        if (!l->n_heads && !l->ffn_dim)
            continue;
        n++;
    }
    if (n == 0) {
        tmp[0] = parent->layers[0];
        tmp[0].source_layer = 0;
        n = 1;
    }
    arch a = *parent;
    a.n_layers = n;
    a.layers = tmp;
    int rc = arch_copy(out, &a);
    free(tmp);
    return rc;
}

/* ---------- calibration state ---------- */

typedef struct {
    cm_entry key;                 /* part, hidden, size */
    dvec pre;                     /* prefill ns */
    dvec dec[MAX_BINS];           /* decode ns per context bin */
    int64_t ws;                   /* workspace bytes from the probe */
} acc_entry;

typedef struct {
    int hidden;
    dvec pre_embed, pre_head, pre_other, dec_embed, dec_head, dec_other;
    int64_t ws;
} acc_fixed;

typedef struct {
    arch a;
    eng_model m;
    eng_kv_cache *kv;
    int *attn_entry, *mlp_entry;  /* [L] index into entries */
    int fixed;                    /* index into fixed */
    int index;                    /* in the calibration model array */
    int inited;
    int requests;
} cal_model;

typedef struct {
    const cm_target *t;
    const cal_opts *o;
    eng_backend *be;
    acc_entry e[MAX_ENTRIES];
    int n_e;
    acc_fixed f[17];
    int n_f;
    int n_bins;
    /* memory fits: (params, bytes) and (kv elems, bytes) pairs */
    dvec w_x, w_y, kv_x, kv_y, runtime;
    dvec req_model, req_pre, req_dec;   /* timed calibration requests: model, phase walls (ms) */
    ms_trace tr;
    int ws_combine;               /* CM_WS_* found by the probes */
    uint64_t rng;
    int step, total;
    int64_t requests;
    double heldout_s;             /* wall time spent building and serving held-out archs */
} cal_state;

static int find_entry(cal_state *cs, int part, int hidden, int nh, int nkv, int ffn)
{
    for (int i = 0; i < cs->n_e; i++) {
        const cm_entry *k = &cs->e[i].key;
        if (k->part == part && k->hidden_size == hidden && k->n_heads == nh && k->n_kv_heads == nkv &&
            k->ffn_dim == ffn)
            return i;
    }
    return -1;
}

static int add_entry(cal_state *cs, int part, int hidden, int nh, int nkv, int ffn)
{
    int i = find_entry(cs, part, hidden, nh, nkv, ffn);
    if (i >= 0)
        return i;
    if (cs->n_e == MAX_ENTRIES)
        return -1;
    acc_entry *e = &cs->e[cs->n_e];
    memset(e, 0, sizeof *e);
    e->key.part = part;
    e->key.hidden_size = hidden;
    e->key.n_heads = nh;
    e->key.n_kv_heads = nkv;
    e->key.ffn_dim = ffn;
    e->ws = -1;
    return cs->n_e++;
}

static void state_free(cal_state *cs)
{
    for (int i = 0; i < cs->n_e; i++) {
        free(cs->e[i].pre.v);
        for (int b = 0; b < MAX_BINS; b++)
            free(cs->e[i].dec[b].v);
    }
    for (int i = 0; i < cs->n_f; i++) {
        acc_fixed *f = &cs->f[i];
        free(f->pre_embed.v);
        free(f->pre_head.v);
        free(f->pre_other.v);
        free(f->dec_embed.v);
        free(f->dec_head.v);
        free(f->dec_other.v);
    }
    free(cs->w_x.v);
    free(cs->w_y.v);
    free(cs->kv_x.v);
    free(cs->kv_y.v);
    free(cs->runtime.v);
    free(cs->req_model.v);
    free(cs->req_pre.v);
    free(cs->req_dec.v);
    ms_trace_free(&cs->tr);
}

static double kv_elems(const arch *a, const cm_target *t)
{
    double e = 0;
    for (int i = 0; i < a->n_layers; i++)
        if (a->layers[i].n_heads)
            e += 2.0 * a->layers[i].n_kv_heads * a->head_dim * t->batch_size *
                 (double)(t->prompt_tokens + t->output_tokens);
    return e;
}

static void model_free(cal_model *cm)
{
    if (cm->kv)
        eng_kv_free(cm->kv);
    if (cm->inited)
        eng_model_free(&cm->m);
    arch_free(&cm->a);
    free(cm->attn_entry);
    free(cm->mlp_entry);
    memset(cm, 0, sizeof *cm);
}

/* Build model of shape a (owned by cm afterwards) on be, record its weight and KV bytes. */
static int model_build(cal_state *cs, cal_model *cm, eng_backend *be, int randomize, char *err, size_t errlen)
{
    size_t b0 = be->cur_bytes;
    if (eng_model_init(&cm->m, &cm->a, be, err, errlen))
        return -1;
    cm->inited = 1;
    size_t b1 = be->cur_bytes;
    if (randomize)
        eng_model_randomize(&cm->m, cs->o->seed + (uint64_t)cs->requests, 0.02f);
    cm->kv = eng_kv_new(&cm->m, cs->t->batch_size, cs->t->prompt_tokens + cs->t->output_tokens);
    if (!cm->kv) {
        snprintf(err, errlen, "out of memory for the KV cache");
        return -1;
    }
    size_t b2 = be->cur_bytes;
    if (dvec_push(&cs->w_x, (double)arch_params(&cm->a)) || dvec_push(&cs->w_y, (double)(b1 - b0)) ||
        dvec_push(&cs->kv_x, kv_elems(&cm->a, cs->t)) || dvec_push(&cs->kv_y, (double)(b2 - b1))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

static int tick(cal_state *cs, const char *what, char *err, size_t errlen)
{
    cs->step++;
    if (cs->o->verbose)
        fprintf(stderr, "calibrate: %s (%d/%d)\n", what, cs->step, cs->total);
    if (cs->o->progress && cs->o->progress(cs->o->ud, what, cs->step, cs->total)) {
        snprintf(err, errlen, "cancelled");
        return -1;
    }
    return 0;
}

/* One traced request on a calibration model; samples go to the accumulators. */
static int cal_request(cal_state *cs, cal_model *cm, int record, char *err, size_t errlen)
{
    double p, d;
    int L = cm->a.n_layers, N = cs->t->output_tokens;
    if (ms_run_request(&cm->m, cm->kv, cs->t, &cs->rng, &cs->tr, &p, &d, err, errlen))
        return -1;
    cs->requests++;
    cm->requests++;
    if (!record)
        return 0;
    if (dvec_push(&cs->req_model, cm->index) || dvec_push(&cs->req_pre, p) || dvec_push(&cs->req_dec, d)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    ms_trace *tr = &cs->tr;
    acc_fixed *f = &cs->f[cm->fixed];
    double sum = 0;
    int rc = 0;
    for (int i = 0; i < L; i++) {
        rc |= dvec_push(&cs->e[cm->attn_entry[i]].pre, tr->prefill_layer_ns[2 * i]);
        rc |= dvec_push(&cs->e[cm->mlp_entry[i]].pre, tr->prefill_layer_ns[2 * i + 1]);
        sum += tr->prefill_layer_ns[2 * i] + tr->prefill_layer_ns[2 * i + 1];
    }
    rc |= dvec_push(&f->pre_embed, tr->prefill_fixed_ns[0]);
    rc |= dvec_push(&f->pre_head, tr->prefill_fixed_ns[1]);
    rc |= dvec_push(&f->pre_other, tr->prefill_wall_ns - sum - tr->prefill_fixed_ns[0] - tr->prefill_fixed_ns[1]);
    for (int s = 0; s < N; s++) {
        int bin = s * cs->n_bins / N;
        const double *ln = tr->decode_layer_ns + (size_t)s * L * 2, *fx = tr->decode_fixed_ns + (size_t)s * 2;
        sum = 0;
        for (int i = 0; i < L; i++) {
            rc |= dvec_push(&cs->e[cm->attn_entry[i]].dec[bin], ln[2 * i]);
            rc |= dvec_push(&cs->e[cm->mlp_entry[i]].dec[bin], ln[2 * i + 1]);
            sum += ln[2 * i] + ln[2 * i + 1];
        }
        rc |= dvec_push(&f->dec_embed, fx[0]);
        rc |= dvec_push(&f->dec_head, fx[1]);
        rc |= dvec_push(&f->dec_other, tr->decode_wall_ns[s] - sum - fx[0] - fx[1]);
    }
    if (rc) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* Calibration model k at hidden size `hidden`: layer i takes attention choice and MLP
 * choice from rotating offsets so that every grid point (removed included) appears. */
static int layout_model(cal_state *cs, cal_model *cm, const arch *parent, int hidden, int k, int L, const int *ah,
                        const int *akv, int nA, const int *fw, int nF, char *err, size_t errlen)
{
    arch a = *parent;
    a.hidden_size = hidden;
    a.n_layers = 0;
    a.layers = NULL;
    if (arch_copy(&cm->a, &a) || arch_init(&cm->a, L)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    cm->a.hidden_size = hidden;
    cm->attn_entry = calloc((size_t)L, sizeof(int));
    cm->mlp_entry = calloc((size_t)L, sizeof(int));
    if (!cm->attn_entry || !cm->mlp_entry) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* Copy the globals (arch_init zeroed them). */
    arch_layer *layers = cm->a.layers;
    cm->a = *parent;
    cm->a.hidden_size = hidden;
    cm->a.n_layers = L;
    cm->a.layers = layers;
    int nA1 = nA + 1, nF1 = nF + 1;   /* last choice = removed */
    for (int i = 0; i < L; i++) {
        int ai = (i + 3 * k) % nA1, fi = (i * 7 + 5 * k + 1) % nF1;
        if (ai == nA && fi == nF)
            fi = (fi + 1 + k) % nF;
        arch_layer *l = &cm->a.layers[i];
        memset(l, 0, sizeof *l);
        l->source_layer = i;
        l->n_heads = ai < nA ? ah[ai] : 0;
        l->n_kv_heads = ai < nA ? akv[ai] : 0;
        l->ffn_dim = fi < nF ? fw[fi] : 0;
        cm->attn_entry[i] = add_entry(cs, CM_ATTN, hidden, l->n_heads, l->n_kv_heads, 0);
        cm->mlp_entry[i] = add_entry(cs, CM_MLP, hidden, 0, 0, l->ffn_dim);
        if (cm->attn_entry[i] < 0 || cm->mlp_entry[i] < 0) {
            snprintf(err, errlen, "too many timing-table entries (max %d)", MAX_ENTRIES);
            return -1;
        }
    }
    if (arch_validate(&cm->a, err, errlen))
        return -1;
    return 0;
}

/* Workspace probe: a model of 0 layers (part < 0) or 1 layer holding one part (CM_ATTN,
 * CM_MLP) or both (part 2), one request; returns the peak bytes above weights + KV
 * cache, or -1 with err. */
static int64_t probe_workspace(cal_state *cs, const arch *parent, int hidden, int part, int nh, int nkv, int ffn,
                               char *err, size_t errlen)
{
    cal_model cm;
    memset(&cm, 0, sizeof cm);
    arch a = *parent;
    arch_layer l;
    memset(&l, 0, sizeof l);
    l.n_heads = part == CM_ATTN || part == 2 ? nh : 0;
    l.n_kv_heads = part == CM_ATTN || part == 2 ? nkv : 0;
    l.ffn_dim = part == CM_MLP || part == 2 ? ffn : 0;
    a.hidden_size = hidden;
    a.n_layers = part < 0 ? 0 : 1;
    a.layers = part < 0 ? NULL : &l;
    int64_t ws = -1;
    double p, d;
    if (arch_copy(&cm.a, &a)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (model_build(cs, &cm, cs->be, 0, err, errlen) == 0) {
        size_t base = cs->be->cur_bytes;
        eng_backend_reset_peak(cs->be);
        if (ms_run_request(&cm.m, cm.kv, cs->t, &cs->rng, NULL, &p, &d, err, errlen) == 0)
            ws = (int64_t)(cs->be->peak_bytes - base);
    }
    model_free(&cm);
    return ws;
}

/* Least squares y = a*x + b over pairs; one distinct x: b = 0. */
static void fit_xy(const dvec *x, const dvec *y, double *a, double *b)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int n = x->n;
    for (int i = 0; i < n; i++) {
        sx += x->v[i];
        sy += y->v[i];
        sxx += x->v[i] * x->v[i];
        sxy += x->v[i] * y->v[i];
    }
    double den = n * sxx - sx * sx;
    if (n < 2 || fabs(den) < 1e-6 * (sxx > 1 ? sxx : 1)) {
        *a = sx > 0 ? sy / sx : 0;
        *b = 0;
        return;
    }
    *a = (n * sxy - sx * sy) / den;
    *b = (sy - *a * sx) / n;
}

/* Assemble cm_tables from the accumulators. */
static int build_tables(cal_state *cs, const arch *parent, cm_tables *tb, char *err, size_t errlen)
{
    memset(tb, 0, sizeof *tb);
    tb->target = *cs->t;
    snprintf(tb->family, sizeof tb->family, "%s", parent->family);
    snprintf(tb->source, sizeof tb->source, "autocompress");
    tb->vocab_size = parent->vocab_size;
    tb->head_dim = parent->head_dim;
    tb->tie_word_embeddings = parent->tie_word_embeddings;
    tb->attention_bias = parent->attention_bias;
    tb->prefill = calloc((size_t)cs->n_e, sizeof(cm_entry));
    tb->decode = calloc((size_t)cs->n_e, sizeof(cm_entry));
    tb->fixed = calloc((size_t)cs->n_f, sizeof(cm_fixed));
    if (!tb->prefill || !tb->decode || !tb->fixed) {
        cm_tables_free(tb);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int S = cs->t->prompt_tokens, N = cs->t->output_tokens;
    for (int i = 0; i < cs->n_e; i++) {
        acc_entry *a = &cs->e[i];
        if (a->pre.n == 0) {
            cm_tables_free(tb);
            snprintf(err, errlen, "internal: entry %d was never timed", i);
            return -1;
        }
        cm_entry *p = &tb->prefill[tb->n_prefill++], *d = &tb->decode[tb->n_decode++];
        *p = a->key;
        p->ms = dvec_median(&a->pre, &p->mad_ms) / 1e6;
        p->mad_ms /= 1e6;
        p->workspace_bytes = a->ws;
        p->samples = a->pre.n;
        *d = a->key;
        d->workspace_bytes = -1;
        d->samples = 0;
        for (int b = 0; b < cs->n_bins; b++) {
            int s0 = (b * N + cs->n_bins - 1) / cs->n_bins, s1 = ((b + 1) * N + cs->n_bins - 1) / cs->n_bins;
            if (a->dec[b].n == 0 || s1 <= s0)
                continue;
            d->ctx[d->n_ctx] = S + (s0 + s1 - 1) / 2;
            d->ctx_ms[d->n_ctx] = dvec_median(&a->dec[b], &d->ctx_mad_ms[d->n_ctx]) / 1e6;
            d->ctx_mad_ms[d->n_ctx] /= 1e6;
            d->samples += a->dec[b].n;
            d->n_ctx++;
        }
        cm_entry_fit_decode(d);
    }
    for (int i = 0; i < cs->n_f; i++) {
        acc_fixed *a = &cs->f[i];
        cm_fixed *f = &tb->fixed[tb->n_fixed++];
        double mad;
        f->hidden_size = a->hidden;
        f->prefill_embed_ms = dvec_median(&a->pre_embed, &mad) / 1e6;
        f->prefill_head_ms = dvec_median(&a->pre_head, &mad) / 1e6;
        f->prefill_other_ms = dvec_median(&a->pre_other, &mad) / 1e6;
        f->decode_embed_ms = dvec_median(&a->dec_embed, &mad) / 1e6;
        f->decode_head_ms = dvec_median(&a->dec_head, &mad) / 1e6;
        f->decode_other_ms = dvec_median(&a->dec_other, &mad) / 1e6;
        f->workspace_bytes = a->ws > 0 ? a->ws : 0;
        f->prefill_scale = f->decode_scale = 1;   /* set by phase_scales */
    }
    tb->mem.workspace_combine = cs->ws_combine;
    double a, b;
    fit_xy(&cs->w_x, &cs->w_y, &a, &b);
    tb->mem.weight_bytes_per_param = a;
    tb->mem.weight_overhead_bytes = (int64_t)llround(b);
    fit_xy(&cs->kv_x, &cs->kv_y, &a, &b);
    tb->mem.kv_bytes_per_elem = a > 0 ? a : 4;
    tb->mem.kv_overhead_bytes = (int64_t)llround(b);
    double mad;
    tb->mem.runtime_bytes = cs->runtime.n ? (int64_t)llround(dvec_median(&cs->runtime, &mad)) : 0;
    if (tb->mem.runtime_bytes < 0)
        tb->mem.runtime_bytes = 0;
    return 0;
}

/* Runtime (non-backend) bytes of model cm on CPU: RSS high water over one request above
 * the RSS before the model was built, minus the backend bytes the model accounts. */
static int runtime_sample(cal_state *cs, cal_model *cm, int64_t rss0, char *err, size_t errlen)
{
    if (strcmp(cs->be->name, "cpu") || rss0 < 0 || ms_rss_reset_peak())
        return 0;
    size_t base = cs->be->cur_bytes;
    eng_backend_reset_peak(cs->be);
    double p, d;
    if (ms_run_request(&cm->m, cm->kv, cs->t, &cs->rng, NULL, &p, &d, err, errlen))
        return -1;
    int64_t hwm = ms_rss_peak_bytes();
    int64_t model_bytes = cs->w_y.v[cs->w_y.n - 1] + cs->kv_y.v[cs->kv_y.n - 1];
    int64_t ws = (int64_t)(cs->be->peak_bytes - base);
    if (hwm >= 0 && dvec_push(&cs->runtime, (double)(hwm - rss0 - model_bytes - ws))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* Lower median of d (1 when empty): noise on a machine only ever adds time, so with an
 * even count the smaller middle value is the robust one. Reorders d. */
static double lower_median(dvec *d)
{
    if (d->n == 0)
        return 1;
    ms_median(d->v, d->n);   /* sorts */
    return d->v[(d->n - 1) / 2];
}

/* Phase scales per hidden size: the lower median over timed calibration requests of the
 * phase's wall time over what the (unscaled) tables predict for that calibration model. */
static int phase_scales(cal_state *cs, cm_tables *tb, cal_model *cms, int n_cms, char *err, size_t errlen)
{
    for (int f = 0; f < tb->n_fixed; f++) {
        dvec rp = {0}, rd = {0};
        int rc = 0;
        for (int i = 0; i < cs->req_model.n && !rc; i++) {
            cal_model *cm = &cms[(int)cs->req_model.v[i]];
            if ((int)cs->req_model.v[i] >= n_cms || cm->a.hidden_size != tb->fixed[f].hidden_size)
                continue;
            cm_prediction p;
            if (cm_predict(tb, &cm->a, &p, err, errlen)) {
                rc = -1;
                break;
            }
            if (p.prefill_ms > 0)
                rc |= dvec_push(&rp, cs->req_pre.v[i] / p.prefill_ms);
            if (p.decode_ms > 0)
                rc |= dvec_push(&rd, cs->req_dec.v[i] / p.decode_ms);
        }
        if (!rc) {
            tb->fixed[f].prefill_scale = lower_median(&rp);
            tb->fixed[f].decode_scale = lower_median(&rd);
        }
        free(rp.v);
        free(rd.v);
        if (rc) {
            if (!*err)
                snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    return 0;
}

/* Correct the phase scales with the fit archs: random heterogeneous archs drawn like the
 * held-out ones and measured exactly like them. The calibration models repeat grid
 * layouts, and on CPU at batch 8 random off-grid archs ran a few percent slower than
 * their parts' sum scaled on the grid layouts (bench/results/costmodel_cpu.md). One
 * factor per phase, the median over every fit arch (all hidden sizes pooled, so a
 * few requests hit by a load burst do not move it) of measured over predicted phase
 * time, multiplies every hidden size's scale: the calibration models keep setting the
 * per-hidden-size level from their many requests. 0 or -1 (OOM, predict failure). */
static int fit_scales(cm_tables *tb, const arch *fa, const ms_result *fr, int n, double *corr_p, double *corr_d,
                      char *err, size_t errlen)
{
    double *rp = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    double *rd = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    int rc = rp && rd ? 0 : -1, k = 0;
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
            rd[k++] = fr[i].decode_ms / p.decode_ms;
        }
    }
    *corr_p = !rc && k ? ms_median(rp, k) : 1;
    *corr_d = !rc && k ? ms_median(rd, k) : 1;
    for (int f = 0; f < tb->n_fixed && !rc; f++) {
        tb->fixed[f].prefill_scale *= *corr_p;
        tb->fixed[f].decode_scale *= *corr_d;
    }
    free(rp);
    free(rd);
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

/* Build the held-out model and measure its memory with one request run alone: backend
 * peak, and on CPU the RSS high water above the RSS before the build. 0 or -1. */
static int vmodel_open(cal_state *cs, const arch *va, vmodel *vm, ms_result *res, char *err, size_t errlen)
{
    char e2[256];
    int reps = cs->o->validate_reps > 0 ? cs->o->validate_reps : 3;
    memset(vm, 0, sizeof *vm);
    memset(res, 0, sizeof *res);
    vm->be = cal_backend_new(cs->t->device, cs->o->threads, e2, sizeof e2);
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
    int is_cpu = !strcmp(vm->be->name, "cpu");
    double t0 = eng_wall_s();
    int64_t rss0 = is_cpu ? ms_rss_bytes() : -1;
    if (eng_model_init(&vm->m, va, vm->be, err, errlen))
        return -1;
    vm->inited = 1;
    res->weights_bytes = (int64_t)vm->be->cur_bytes;
    eng_model_randomize(&vm->m, cs->o->seed * 7919 + (uint64_t)cs->requests, 0.02f);
    vm->kv = eng_kv_new(&vm->m, cs->t->batch_size, cs->t->prompt_tokens + cs->t->output_tokens);
    if (!vm->kv) {
        snprintf(err, errlen, "out of memory for the KV cache");
        return -1;
    }
    res->request_cache_bytes = (int64_t)vm->be->cur_bytes - res->weights_bytes;
    double p, d;
    eng_backend_reset_peak(vm->be);
    int have_rss = is_cpu && rss0 >= 0 && ms_rss_reset_peak() == 0;
    if (ms_run_request(&vm->m, vm->kv, cs->t, &cs->rng, NULL, &p, &d, err, errlen))
        return -1;
    res->backend_peak_bytes = (int64_t)vm->be->peak_bytes;
    int64_t hwm = have_rss ? ms_rss_peak_bytes() : -1;
    res->rss_delta_bytes = hwm >= 0 ? hwm - rss0 : -1;
    res->peak_bytes = res->rss_delta_bytes > res->backend_peak_bytes ? res->rss_delta_bytes : res->backend_peak_bytes;
    res->params = arch_params(va);
    cs->heldout_s += eng_wall_s() - t0;
    return tick(cs, "held-out build + memory", err, errlen);
}

/* One timed request of the held-out model, right after one calibration request. */
static int vmodel_request(cal_state *cs, vmodel *vm, cal_model *cm, char *err, size_t errlen)
{
    double p, d;
    if (cal_request(cs, cm, 1, err, errlen) || tick(cs, "calibration request", err, errlen))
        return -1;
    double t0 = eng_wall_s();
    if (ms_run_request(&vm->m, vm->kv, cs->t, &cs->rng, NULL, &p, &d, err, errlen) ||
        tick(cs, "held-out request", err, errlen))
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
static int validate_all(cal_state *cs, arch *varch, int n, cal_model *cms, int n_models_per_hidden, int n_hid,
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

/* The calibration id: the content key of (target, parent), extended by the extra hidden
 * sizes and an explicit CPU thread count when there are any (those tables are another
 * calibration). */
static void cal_id(const cm_target *t, const arch *parent, const cal_opts *o, char id[40])
{
    cm_calibration_id(t, parent, id);
    if (!o || (o->n_hidden <= 0 && o->threads <= 0))
        return;
    char buf[256];
    int n = snprintf(buf, sizeof buf, "%s|t%d", id, o->threads);
    for (int i = 0; i < o->n_hidden && i < 16 && n > 0 && n < (int)sizeof buf - 12; i++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "|h%d", o->hidden[i]);
    unsigned long long h = 1469598103934665603ULL;
    for (const char *p = buf; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    snprintf(id, 40, "cal_%016llx", h);
}

json_t *cal_run(const arch *parent, const cm_target *t, const cal_opts *opts, char *err, size_t errlen)
{
    cal_opts o;
    if (opts)
        o = *opts;
    else
        cal_opts_default(&o);
    if (o.reps < 1)
        o.reps = 1;
    if (o.n_models < 1)
        o.n_models = 1;
    if (o.n_models > 8)
        o.n_models = 8;
    if (o.warmup < 0)
        o.warmup = 0;
    if (arch_validate(parent, err, errlen))
        return NULL;
    if (strcmp(t->precision, "fp32")) {
        snprintf(err, errlen, "precision %s is not available in this build (the engine runs fp32)", t->precision);
        return NULL;
    }
    double t_start = eng_wall_s();
    cal_state *cs = calloc(1, sizeof *cs);
    if (!cs) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    cs->t = t;
    cs->o = &o;
    cs->rng = o.seed * 0x9E3779B97F4A7C15ULL + 1;
    cs->n_bins = t->output_tokens < MAX_BINS ? t->output_tokens : MAX_BINS;
    json_t *result = NULL, *rows = NULL;
    cal_model *cms = NULL;
    cm_tables tb;
    memset(&tb, 0, sizeof tb);
    int n_cms = 0;
    char e2[256];
    cs->be = cal_backend_new(t->device, o.threads, e2, sizeof e2);
    if (!cs->be) {
        snprintf(err, errlen, "%s", e2);
        free(cs);
        return NULL;
    }
    int ah[64], akv[64], fw[64];
    int nA = cal_grid_attention(parent, ah, akv, 64), nF = cal_grid_mlp(parent, fw, 64);
    int hid[17], n_hid = 0;
    hid[n_hid++] = parent->hidden_size;
    for (int i = 0; i < o.n_hidden && i < 16; i++)
        if (o.hidden[i] > 0 && o.hidden[i] != parent->hidden_size)
            hid[n_hid++] = o.hidden[i];
    int L = parent->n_layers;
    if (L < nA + 1)
        L = nA + 1;
    if (L < nF + 1)
        L = nF + 1;
    if (o.n_layers > 0)
        L = o.n_layers > L ? o.n_layers : L;
    n_cms = n_hid * o.n_models;
    cms = calloc((size_t)n_cms, sizeof *cms);
    if (!cms || ms_trace_init(&cs->tr, L, t->output_tokens)) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    /* random archs measured like the held-out ones: o.validate held out, then n_fit that
     * set the phase scales (fit_scales) */
    int n_fit = o.fit > 0 ? o.fit : 0, n_all = o.validate + n_fit;
    /* progress total: probes, warm-ups, timed requests, held-out and fit requests */
    int n_probe = n_hid * (nA + nF + 2);
    int val_req = n_all * (o.validate_reps > 0 ? o.validate_reps : 3);
    cs->total = n_probe + n_cms * (o.warmup + 1) + (n_all ? 2 * val_req + n_all : n_cms * o.reps);
    if (n_all && val_req < n_cms * o.reps)
        cs->total += n_cms * o.reps - val_req;
    /* 1. workspace probes (small models, nothing else allocated) */
    for (int h = 0; h < n_hid; h++) {
        acc_fixed *f = &cs->f[cs->n_f++];
        memset(f, 0, sizeof *f);
        f->hidden = hid[h];
        f->ws = probe_workspace(cs, parent, hid[h], -1, 0, 0, 0, err, errlen);
        if (f->ws < 0 || tick(cs, "workspace probe", err, errlen))
            goto out;
        for (int i = 0; i < nA + 1; i++) {
            int nh = i < nA ? ah[i] : 0, nk = i < nA ? akv[i] : 0;
            int ei = add_entry(cs, CM_ATTN, hid[h], nh, nk, 0);
            if (ei < 0) {
                snprintf(err, errlen, "too many timing-table entries");
                goto out;
            }
            cs->e[ei].ws = nh ? probe_workspace(cs, parent, hid[h], CM_ATTN, nh, nk, 0, err, errlen) : f->ws;
            if (cs->e[ei].ws < 0 || (nh && tick(cs, "workspace probe", err, errlen)))
                goto out;
        }
        for (int i = 0; i < nF + 1; i++) {
            int fd = i < nF ? fw[i] : 0;
            int ei = add_entry(cs, CM_MLP, hid[h], 0, 0, fd);
            if (ei < 0) {
                snprintf(err, errlen, "too many timing-table entries");
                goto out;
            }
            cs->e[ei].ws = fd ? probe_workspace(cs, parent, hid[h], CM_MLP, 0, 0, fd, err, errlen) : f->ws;
            if (cs->e[ei].ws < 0 || (fd && tick(cs, "workspace probe", err, errlen)))
                goto out;
        }
    }
    /* How the engine combines parts' workspace: probe a layer holding both of the largest
     * parts and compare with the two rules (measured, per hidden size; all must agree). */
    int votes_sum = 0, votes_max = 0;
    for (int h = 0; h < n_hid && nA && nF; h++) {
        int ea = find_entry(cs, CM_ATTN, hid[h], ah[nA - 1], akv[nA - 1], 0);
        int ef = find_entry(cs, CM_MLP, hid[h], 0, 0, fw[nF - 1]);
        int64_t both = probe_workspace(cs, parent, hid[h], 2, ah[nA - 1], akv[nA - 1], fw[nF - 1], err, errlen);
        if (both < 0 || tick(cs, "workspace probe", err, errlen))
            goto out;
        int64_t w0 = cs->f[h].ws, wa = cs->e[ea].ws, wf = cs->e[ef].ws;
        int64_t as_max = wa > wf ? wa : wf, as_sum = wa + wf - w0;
        if (llabs(both - as_sum) < llabs(both - as_max))
            votes_sum++;
        else
            votes_max++;
    }
    cs->ws_combine = votes_sum > votes_max ? CM_WS_SUM_MAXIMA : CM_WS_MAX;
    /* 2. calibration models: build, runtime-bytes sample, warm up */
    for (int h = 0; h < n_hid; h++)
        for (int k = 0; k < o.n_models; k++) {
            cal_model *cm = &cms[h * o.n_models + k];
            int64_t rss0 = ms_rss_bytes();
            cm->index = h * o.n_models + k;
            if (layout_model(cs, cm, parent, hid[h], k, L, ah, akv, nA, fw, nF, err, errlen) ||
                model_build(cs, cm, cs->be, 1, err, errlen))
                goto out;
            cm->fixed = h;
            if (runtime_sample(cs, cm, rss0, err, errlen))
                goto out;
            for (int w = 0; w < o.warmup + 1; w++)
                if (cal_request(cs, cm, 0, err, errlen) || tick(cs, "warm-up", err, errlen))
                    goto out;
        }
    /* 3. timed requests, interleaved with the random archs' (held-out, then fit) */
    ms_result *vres = NULL;
    arch *varch = NULL;
    if (n_all > 0) {
        vres = calloc((size_t)n_all, sizeof *vres);
        varch = calloc((size_t)n_all, sizeof *varch);
        if (!vres || !varch) {
            free(vres);
            free(varch);
            snprintf(err, errlen, "out of memory");
            goto out;
        }
        /* two streams, so the held-out archs do not depend on the fit count */
        uint64_t vr = o.seed * 0xD1B54A32D192ED03ULL + 7, fr = o.seed * 0xA24BAED4963EE407ULL + 3;
        int vi;
        for (vi = 0; vi < n_all; vi++) {
            if (cal_random_arch(parent, vi < o.validate ? &vr : &fr, &varch[vi])) {
                snprintf(err, errlen, "out of memory");
                break;
            }
            /* random archs live at a calibrated hidden size */
            varch[vi].hidden_size = hid[(vi < o.validate ? vi : vi - o.validate) % n_hid];
        }
        if (vi < n_all || validate_all(cs, varch, n_all, cms, o.n_models, n_hid, vres, err, errlen)) {
            for (int i = 0; i < n_all; i++)
                arch_free(&varch[i]);
            free(vres);
            free(varch);
            goto out;
        }
    }
    for (int i = 0; i < n_cms; i++)
        while (cms[i].requests < o.warmup + 1 + o.reps)
            if (cal_request(cs, &cms[i], 1, err, errlen) || tick(cs, "calibration request", err, errlen)) {
                for (int v = 0; v < n_all && varch; v++)
                    arch_free(&varch[v]);
                free(vres);
                free(varch);
                goto out;
            }
    double wall_tables = eng_wall_s() - t_start, fit_p = 1, fit_d = 1;
    /* 4. tables, then predictions of the held-out archs */
    if (build_tables(cs, parent, &tb, err, errlen) || phase_scales(cs, &tb, cms, n_cms, err, errlen) ||
        (n_fit && fit_scales(&tb, varch + o.validate, vres + o.validate, n_fit, &fit_p, &fit_d, err, errlen))) {
        for (int v = 0; v < n_all && varch; v++)
            arch_free(&varch[v]);
        free(vres);
        free(varch);
        goto out;
    }
    char id[40];
    cal_id(t, parent, &o, id);
    snprintf(tb.id, sizeof tb.id, "%s", id);
    rows = json_array();
    double lat_sum = 0, lat_max = 0, mem_sum = 0, mem_max = 0, naive_sum = 0, naive_max = 0;
    int vfail = !rows;
    for (int v = 0; v < o.validate && !vfail; v++) {
        cm_prediction p;
        if (cm_predict(&tb, &varch[v], &p, err, errlen)) {
            vfail = 1;
            break;
        }
        const ms_result *r = &vres[v];
        double le = pct_err(p.latency_ms, r->latency_ms), me = pct_err((double)p.total, (double)r->peak_bytes),
               ne = pct_err((double)p.naive_bytes, (double)r->peak_bytes);
        lat_sum += le;
        mem_sum += me;
        naive_sum += ne;
        lat_max = le > lat_max ? le : lat_max;
        mem_max = me > mem_max ? me : mem_max;
        naive_max = ne > naive_max ? ne : naive_max;
        char summary[1024];
        arch_summary(&varch[v], summary, sizeof summary);
        json_t *row = json_pack(
            "{s:o,s:s,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:I,s:I,s:o,s:f,s:f,s:f}", "arch",
            arch_to_json(&varch[v]), "summary", summary, "params", (json_int_t)p.params, "predicted_latency_ms",
            p.latency_ms, "measured_latency_ms", r->latency_ms, "measured_latency_mad_ms", r->latency_mad_ms,
            "predicted_throughput_tokens_per_s", p.throughput_tps, "measured_throughput_tokens_per_s",
            r->throughput_tps, "latency_error_pct", le, "predicted_memory_bytes", (json_int_t)p.total,
            "measured_peak_memory_bytes", (json_int_t)r->peak_bytes, "measured_backend_peak_bytes",
            (json_int_t)r->backend_peak_bytes, "measured_rss_delta_bytes", (json_int_t)r->rss_delta_bytes,
            "naive_weights_plus_kv_bytes", (json_int_t)p.naive_bytes, "predicted_memory_items",
            cm_prediction_to_json(&p), "memory_error_pct", me, "naive_memory_error_pct", ne,
            "predicted_backend_bytes_error_pct",
            pct_err((double)(p.weights + p.request_cache + p.prefill_workspace), (double)r->backend_peak_bytes));
        /* the phases apart, so a bias can be traced to prefill or decode */
        if (row && (json_object_set_new(row, "measured_prefill_ms", json_real(r->prefill_ms)) ||
                    json_object_set_new(row, "measured_decode_ms", json_real(r->decode_ms)) ||
                    json_object_set_new(row, "predicted_prefill_ms", json_real(p.prefill_ms)) ||
                    json_object_set_new(row, "predicted_decode_ms", json_real(p.decode_ms)))) {
            json_decref(row);
            row = NULL;
        }
        if (!row || json_array_append_new(rows, row))
            vfail = 1;
    }
    for (int v = 0; v < n_all && varch; v++)
        arch_free(&varch[v]);
    free(vres);
    free(varch);
    if (vfail) {
        if (!*err)
            snprintf(err, errlen, "out of memory");
        goto out;
    }
    int nv = o.validate > 0 ? o.validate : 1;
    json_t *tables = cm_tables_to_json(&tb), *target = cm_target_to_json(t);
    json_t *validation = json_pack("{s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:s,s:o}", "archs", o.validate, "latency_mape_pct",
                                   lat_sum / nv, "latency_max_pct", lat_max, "memory_mape_pct", mem_sum / nv,
                                   "memory_max_pct", mem_max, "naive_memory_mape_pct", naive_sum / nv,
                                   "naive_memory_max_pct", naive_max, "measured_memory",
                                   strcmp(t->device, "cpu")
                                       ? "backend peak bytes (device allocations the engine accounts)"
                                       : "max(backend peak bytes, process RSS high-water delta)",
                                   "rows", rows);
    rows = NULL;   /* stolen by json_pack */
    char hidden_list[256];
    int hl = 0;
    hidden_list[0] = 0;
    for (int h = 0; h < n_hid && hl < 200; h++)
        hl += snprintf(hidden_list + hl, sizeof hidden_list - (size_t)hl, "%s%d", h ? "," : "", hid[h]);
    result = tables && target && validation
                 ? json_pack("{s:s,s:s,s:o,s:s,s:i,s:f,s:o,s:o,s:{s:I,s:i,s:i,s:f,s:f,s:s,s:i,s:i,s:f,s:f}}", "id", id,
                             "status", "succeeded", "target", target, "family", parent->family, "entries",
                             tb.n_prefill + tb.n_decode + 2 * tb.n_fixed, "wall_s", eng_wall_s() - t_start, "tables",
                             tables, "validation", validation, "cost", "requests", (json_int_t)cs->requests,
                             "calibration_models", n_cms, "layers_per_model", L, "tables_wall_s",
                             wall_tables - cs->heldout_s, "validation_wall_s",
                             cs->heldout_s + (eng_wall_s() - t_start - wall_tables), "hidden_sizes", hidden_list,
                             "probe_models", n_probe, "fit_archs", n_fit, "fit_prefill_factor", fit_p,
                             "fit_decode_factor", fit_d)
                 : NULL;
    if (!(tables && target && validation)) {   /* json_pack was not called: nothing stolen */
        json_decref(tables);
        json_decref(target);
        json_decref(validation);
    }
    if (!result)
        snprintf(err, errlen, "out of memory");
out:
    json_decref(rows);
    for (int i = 0; cms && i < n_cms; i++)
        model_free(&cms[i]);
    free(cms);
    cm_tables_free(&tb);
    eng_backend_free(cs->be);
    state_free(cs);
    free(cs);
    return result;
}

json_t *cal_get_or_run(const char *data_dir, const arch *parent, const cm_target *t, const cal_opts *o,
                       int *reused, char *err, size_t errlen)
{
    char id[40], e2[256];
    cal_id(t, parent, o, id);
    *reused = 0;
    json_t *cal = cm_calibration_load(data_dir, id, e2, sizeof e2);
    if (cal) {
        cm_tables tb;
        if (!cm_calibration_tables(cal, &tb, e2, sizeof e2)) {
            cm_tables_free(&tb);
            *reused = 1;
            return cal;
        }
        json_decref(cal);   /* unreadable cache entry: calibrate again */
    }
    cal = cal_run(parent, t, o, err, errlen);
    if (cal && cm_calibration_save(data_dir, cal, err, errlen)) {
        json_decref(cal);
        return NULL;
    }
    return cal;
}
