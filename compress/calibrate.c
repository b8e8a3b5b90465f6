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
#include "compress/calibrate_internal.h"
#include "compress/costmodel_internal.h"
#include "compress/llamacpp.h"
#include "engine/clock.h"

int cali_dvec_push(dvec *d, double x)
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

double cali_dvec_median(dvec *d, double *mad)
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


static cm_entry entry_key(cal_state *cs, int part, int hidden, int nh, int nkv, int ffn)
{
    return cal_entry_key(cs->parent, part, hidden, nh, nkv, ffn);
}

static int find_entry(cal_state *cs, int part, int hidden, int nh, int nkv, int ffn)
{
    cm_entry want = entry_key(cs, part, hidden, nh, nkv, ffn);
    for (int i = 0; i < cs->n_e; i++)
        if (cm_same_key(&cs->e[i].key, &want))
            return i;
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
    e->key = entry_key(cs, part, hidden, nh, nkv, ffn);
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
    return cm_cache_elems(a, t->batch_size, t->prompt_tokens + t->output_tokens, NULL);
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

/* At 16 bits the CPU backend keeps a rounded copy of each weight matrix of a served
 * model, made at its first request (engine/cpu_mm16.h) and held outside the backend's
 * byte count: weight bytes all the same. kept_bytes is that outside memory now (0 on
 * other backends and at fp32); count_kept adds what a model's first request made of it
 * to that model's weight-bytes sample (the newest), so weight_bytes_per_param fits 4 + 2
 * at bf16 on the CPU, measured. */
static size_t kept_bytes(const cal_state *cs)
{
    return strcmp(cs->be->name, "cpu") ? 0 : eng_backend_cpu_workspace_bytes(cs->be);
}

static void count_kept(cal_state *cs, size_t kept0)
{
    size_t k = kept_bytes(cs);
    if (k > kept0 && cs->w_y.n > 0)
        cs->w_y.v[cs->w_y.n - 1] += (double)(k - kept0);
}

/* Build model of shape a (owned by cm afterwards) on be, record its weight and KV bytes. */
static int model_build(cal_state *cs, cal_model *cm, eng_backend *be, int randomize, char *err, size_t errlen)
{
    size_t b0 = be->cur_bytes;
    if (eng_model_init(&cm->m, &cm->a, be, err, errlen))
        return -1;
    cm->inited = 1;
    size_t b1 = be->cur_bytes;
    if (randomize && cali_randomize(cs, &cm->m, cs->o->seed + (uint64_t)cs->requests, err, errlen))
        return -1;
    eng_model_const(&cm->m, 1);   /* served as the engine serves: weights held still */
    cm->kv = eng_kv_new(&cm->m, cs->t->batch_size, cs->t->prompt_tokens + cs->t->output_tokens);
    if (!cm->kv) {
        snprintf(err, errlen, "out of memory for the KV cache");
        return -1;
    }
    size_t b2 = be->cur_bytes;
    if (cali_dvec_push(&cs->w_x, (double)arch_params(&cm->a)) || cali_dvec_push(&cs->w_y, (double)(b1 - b0)) ||
        cali_dvec_push(&cs->kv_x, kv_elems(&cm->a, cs->t)) || cali_dvec_push(&cs->kv_y, (double)(b2 - b1))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

int cali_randomize(cal_state *cs, eng_model *m, uint64_t seed, char *err, size_t errlen)
{
    int rc = eng_model_randomize_until(m, seed, 0.02f, cs->o->cancelled, cs->o->ud);
    if (rc)
        snprintf(err, errlen, "%s", rc > 0 ? "cancelled" : "out of memory drawing random weights");
    return rc ? -1 : 0;
}

int cali_tick(cal_state *cs, const char *what, char *err, size_t errlen)
{
    cs->step++;
    if (cs->o->verbose)
        fprintf(stderr, "calibrate: %s (%d/%d)\n", what, cs->step, cs->total);
    if (cs->o->progress && cs->o->progress(cs->o->ud, what, cs->step, cs->total)) {
        snprintf(err, errlen, "cancelled");
        return -1;
    }
    if (ms_quiet_cut(cs->o->quiet)) {
        snprintf(err, errlen, "made beside other work: set aside");
        return -1;
    }
    return 0;
}

/* One traced request on a calibration model; samples go to the accumulators. */
int cali_request(cal_state *cs, cal_model *cm, int record, char *err, size_t errlen)
{
    double p, d;
    int L = cm->a.n_layers, N = cs->t->output_tokens;
    if (ms_run_request(&cm->m, cm->kv, cs->t, &cs->rng, &cs->tr, &cs->stop, &p, &d, err, errlen))
        return -1;
    cs->requests++;
    cm->requests++;
    if (!record)
        return 0;
    if (cali_dvec_push(&cs->req_model, cm->index) || cali_dvec_push(&cs->req_pre, p) || cali_dvec_push(&cs->req_dec, d)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    ms_trace *tr = &cs->tr;
    acc_fixed *f = &cs->f[cm->fixed];
    double sum = 0;
    int rc = 0;
    for (int i = 0; i < L; i++) {
        rc |= cali_dvec_push(&cs->e[cm->attn_entry[i]].pre, tr->prefill_layer_ns[2 * i]);
        rc |= cali_dvec_push(&cs->e[cm->mlp_entry[i]].pre, tr->prefill_layer_ns[2 * i + 1]);
        sum += tr->prefill_layer_ns[2 * i] + tr->prefill_layer_ns[2 * i + 1];
    }
    rc |= cali_dvec_push(&f->pre_embed, tr->prefill_fixed_ns[0]);
    rc |= cali_dvec_push(&f->pre_head, tr->prefill_fixed_ns[1]);
    rc |= cali_dvec_push(&f->pre_other, tr->prefill_wall_ns - sum - tr->prefill_fixed_ns[0] - tr->prefill_fixed_ns[1]);
    for (int s = 0; s < N; s++) {
        int bin = s * cs->n_bins / N;
        const double *ln = tr->decode_layer_ns + (size_t)s * L * 2, *fx = tr->decode_fixed_ns + (size_t)s * 2;
        sum = 0;
        for (int i = 0; i < L; i++) {
            rc |= cali_dvec_push(&cs->e[cm->attn_entry[i]].dec[bin], ln[2 * i]);
            rc |= cali_dvec_push(&cs->e[cm->mlp_entry[i]].dec[bin], ln[2 * i + 1]);
            sum += ln[2 * i] + ln[2 * i + 1];
        }
        rc |= cali_dvec_push(&f->dec_embed, fx[0]);
        rc |= cali_dvec_push(&f->dec_head, fx[1]);
        rc |= cali_dvec_push(&f->dec_other, tr->decode_wall_ns[s] - sum - fx[0] - fx[1]);
    }
    if (rc) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* The mixer grid's choices: its nA entries and a removed mixer, except for a parent without
 * MLPs (mamba2), whose layer without a mixer would be empty: an arch prices that by leaving the
 * layer out, so the entry is never needed (and no calibration model could time it). */
static int mixer_choices(int nA, int nF) { return nF ? nA + 1 : nA; }

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
    int nA1 = mixer_choices(nA, nF), nF1 = nF + 1;   /* last choice = removed */
    int stride = 1;                   /* a stride prime to nF1: the MLP choices of L >= nF1 layers cover the grid */
    for (int c = 7; c > 1 && stride == 1; c -= 2)
        if (nF1 % c)
            stride = c;
    /* the attention offset that puts no removed attention beside a removed MLP (such a
       layer would be empty), so that both removed entries are timed */
    int shift = 0;
    for (int sh = 0; sh < nA1; sh++) {
        int clash = 0;
        for (int i = 0; i < L; i++)
            clash |= (i + 3 * k + sh) % nA1 == nA && (i * stride + 5 * k + 1) % nF1 == nF;
        if (!clash) {
            shift = sh;
            break;
        }
    }
    for (int i = 0; i < L; i++) {
        int ai = (i + 3 * k + shift) % nA1, fi = (i * stride + 5 * k + 1) % nF1;
        if (ai == nA && fi == nF)
            fi = (fi + 1 + k) % nF;
        arch_layer *l = &cm->a.layers[i];
        memset(l, 0, sizeof *l);
        l->source_layer = i;
        cal_mixer_apply(parent, ai < nA ? ah[ai] : 0, ai < nA ? akv[ai] : 0, l);
        cal_mlp_apply(parent, fi < nF ? fw[fi] : 0, l);
        cm->attn_entry[i] = add_entry(cs, CM_ATTN, hidden, ai < nA ? ah[ai] : 0, ai < nA ? akv[ai] : 0, 0);
        cm->mlp_entry[i] = add_entry(cs, CM_MLP, hidden, 0, 0, fi < nF ? fw[fi] : 0);
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
    arch_layer l[2];
    memset(l, 0, sizeof l);
    cal_mixer_apply(parent, part == CM_ATTN || part == 2 ? nh : 0, part == CM_ATTN || part == 2 ? nkv : 0, &l[0]);
    cal_mlp_apply(parent, part == CM_MLP || part == 2 ? ffn : 0, &l[0]);
    a.hidden_size = hidden;
    a.n_layers = part < 0 ? 0 : 1;
    a.layers = part < 0 ? NULL : l;
    int gh[64], gk[64], ng = part == CM_ATTN && nkv < 0 ? cal_grid_attention(parent, gh, gk, 64) : 0;
    if (ng > 0 && gk[0] > 0) {
        /* A Mamba mixer beside the parent's attention: the engine holds one mixer region (the
           larger) and adds the attention's tiles while it runs, so the entry is probed with the
           smallest attention in a second layer and its workspace carries them (a Mamba-only arch
           is priced the tiles too: on the safe side). */
        cal_mixer_apply(parent, gh[0], gk[0], &l[1]);
        a.n_layers = 2;
    }
    int64_t ws = -1;
    double p, d;
    if (arch_copy(&cm.a, &a)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (model_build(cs, &cm, cs->be, 0, err, errlen) == 0) {
        size_t base = cs->be->cur_bytes, kept0 = kept_bytes(cs);
        eng_backend_reset_peak(cs->be);
        if (ms_run_request(&cm.m, cm.kv, cs->t, &cs->rng, NULL, &cs->stop, &p, &d, err, errlen) == 0) {
            ws = (int64_t)(cs->be->peak_bytes - base);
            count_kept(cs, kept0);
        }
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
        p->ms = cali_dvec_median(&a->pre, &p->mad_ms) / 1e6;
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
            d->ctx_ms[d->n_ctx] = cali_dvec_median(&a->dec[b], &d->ctx_mad_ms[d->n_ctx]) / 1e6;
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
        f->prefill_embed_ms = cali_dvec_median(&a->pre_embed, &mad) / 1e6;
        f->prefill_head_ms = cali_dvec_median(&a->pre_head, &mad) / 1e6;
        f->prefill_other_ms = cali_dvec_median(&a->pre_other, &mad) / 1e6;
        f->decode_embed_ms = cali_dvec_median(&a->dec_embed, &mad) / 1e6;
        f->decode_head_ms = cali_dvec_median(&a->dec_head, &mad) / 1e6;
        f->decode_other_ms = cali_dvec_median(&a->dec_other, &mad) / 1e6;
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
    tb->mem.runtime_bytes = cs->runtime.n ? (int64_t)llround(cali_dvec_median(&cs->runtime, &mad)) : 0;
    if (tb->mem.runtime_bytes < 0)
        tb->mem.runtime_bytes = 0;
    return 0;
}

/* Runtime (non-backend) bytes of model cm. CPU: RSS high water over one request above
 * the RSS before the model was built, minus the backend bytes the model accounts. A GPU:
 * the backend's own measure of what it holds outside its accounting (CUDA context,
 * cuBLAS workspace, 16-bit operand copies, pool slack) over one request. */
static int runtime_sample(cal_state *cs, cal_model *cm, int64_t rss0, char *err, size_t errlen)
{
    if (strcmp(cs->be->name, "cpu")) {
        double p, d;
        eng_backend_reset_peak(cs->be);
        ms_peak_open(cs->be);
        if (ms_run_request(&cm->m, cm->kv, cs->t, &cs->rng, NULL, &cs->stop, &p, &d, err, errlen))
            return -1;
        int64_t rt = eng_backend_runtime_bytes(cs->be);
        if (rt >= 0 && cali_dvec_push(&cs->runtime, (double)rt)) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        return 0;
    }
    size_t kept0 = kept_bytes(cs);
    if (rss0 < 0 || ms_rss_reset_peak())
        return 0;
    size_t base = cs->be->cur_bytes;
    eng_backend_reset_peak(cs->be);
    double p, d;
    if (ms_run_request(&cm->m, cm->kv, cs->t, &cs->rng, NULL, &cs->stop, &p, &d, err, errlen))
        return -1;
    count_kept(cs, kept0);
    int64_t hwm = ms_rss_peak_bytes();
    int64_t model_bytes = cs->w_y.v[cs->w_y.n - 1] + cs->kv_y.v[cs->kv_y.n - 1];
    int64_t ws = (int64_t)(cs->be->peak_bytes - base);
    if (hwm >= 0 && cali_dvec_push(&cs->runtime, (double)(hwm - rss0 - model_bytes - ws))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* Lower median of d (1 when empty): noise on a machine only ever adds time, so with an
 * even count the smaller middle value is the robust one. Reorders d. */
double cali_lower_median(dvec *d)
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
                rc |= cali_dvec_push(&rp, cs->req_pre.v[i] / p.prefill_ms);
            if (p.decode_ms > 0)
                rc |= cali_dvec_push(&rd, cs->req_dec.v[i] / p.decode_ms);
        }
        if (!rc) {
            tb->fixed[f].prefill_scale = cali_lower_median(&rp);
            tb->fixed[f].decode_scale = cali_lower_median(&rd);
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

/* One calibration run, phase by phase (cal_run). */
typedef struct {
    const arch *parent;
    const cm_target *t;
    cal_opts o;
    cal_state *cs;
    int ah[64], akv[64], fw[64], nA, nF;   /* the part grids */
    int hid[17], n_hid;                    /* calibrated hidden sizes, the parent's first */
    int L;                                 /* layers per calibration model */
    cal_model *cms;
    int n_cms;
    int n_fit, n_all, n_probe;             /* random archs: o.validate held out, then n_fit */
    arch *varch;
    ms_result *vres;
    cm_tables tb;
    double t_start, wall_tables, fit_p, fit_d;
    int64_t fit_mem;                       /* the fit archs' memory residual (fit_memory) */
    char id[40];
} cal_run_ctx;

/* Options, grids, hidden sizes, the calibration models' shape and the progress total. */
static int run_setup(cal_run_ctx *r, char *err, size_t errlen)
{
    cal_opts *o = &r->o;
    if (o->reps < 1)
        o->reps = 1;
    if (o->n_models < 1)
        o->n_models = 1;
    if (o->n_models > 8)
        o->n_models = 8;
    if (o->warmup < 0)
        o->warmup = 0;
    if (arch_validate(r->parent, err, errlen))
        return -1;
    r->t_start = eng_wall_s();
    r->fit_p = r->fit_d = 1;
    cal_state *cs = r->cs = calloc(1, sizeof *cs);
    if (!cs) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    cs->t = r->t;
    cs->parent = r->parent;
    cs->o = o;
    cs->stop = (ms_opts){.cancelled = o->cancelled, .cancel_ud = o->ud};
    cs->rng = o->seed * 0x9E3779B97F4A7C15ULL + 1;
    cs->n_bins = r->t->output_tokens < MAX_BINS ? r->t->output_tokens : MAX_BINS;
    char e2[256];
    cs->be = cal_backend_new(r->t->device, r->t->precision, o->threads, e2, sizeof e2);
    if (!cs->be) {
        snprintf(err, errlen, "%s", e2);
        return -1;
    }
    r->nA = cal_grid_attention(r->parent, r->ah, r->akv, 64);
    r->nF = cal_grid_mlp(r->parent, r->fw, 64, 1);
    r->hid[r->n_hid++] = r->parent->hidden_size;
    for (int i = 0; i < o->n_hidden && i < 16; i++)
        if (o->hidden[i] > 0 && o->hidden[i] != r->parent->hidden_size)
            r->hid[r->n_hid++] = o->hidden[i];
    int L = r->parent->n_layers;
    if (L < r->nA + 1)
        L = r->nA + 1;
    if (L < r->nF + 1)
        L = r->nF + 1;
    if (o->n_layers > 0)
        L = o->n_layers > L ? o->n_layers : L;
    r->L = L;
    r->n_cms = r->n_hid * o->n_models;
    r->cms = calloc((size_t)r->n_cms, sizeof *r->cms);
    if (!r->cms || ms_trace_init(&cs->tr, L, r->t->output_tokens)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    r->n_fit = o->fit > 0 ? o->fit : 0;
    r->n_all = o->validate + r->n_fit;
    /* progress total: probes, warm-ups, timed requests, held-out and fit requests */
    r->n_probe = r->n_hid * (r->nA + r->nF + 2);
    int val_req = r->n_all * (o->validate_reps > 0 ? o->validate_reps : 3);
    cs->total = r->n_probe + r->n_cms * (o->warmup + 1) + (r->n_all ? 2 * val_req + r->n_all : r->n_cms * o->reps);
    if (r->n_all && val_req < r->n_cms * o->reps)
        cs->total += r->n_cms * o->reps - val_req;
    return 0;
}

/* Phase 1: workspace probes (small models, nothing else allocated), then how the engine
 * combines parts' workspace: a layer holding both of the largest parts is compared with
 * the two rules (measured per hidden size; the majority decides). */
static int run_probes(cal_run_ctx *r, char *err, size_t errlen)
{
    cal_state *cs = r->cs;
    const int *hid = r->hid, *ah = r->ah, *akv = r->akv, *fw = r->fw;
    int nA = r->nA, nF = r->nF;
    for (int h = 0; h < r->n_hid; h++) {
        acc_fixed *f = &cs->f[cs->n_f++];
        memset(f, 0, sizeof *f);
        f->hidden = hid[h];
        f->ws = probe_workspace(cs, r->parent, hid[h], -1, 0, 0, 0, err, errlen);
        if (f->ws < 0 || cali_tick(cs, "workspace probe", err, errlen))
            return -1;
        for (int i = 0; i < mixer_choices(nA, nF); i++) {
            int nh = i < nA ? ah[i] : 0, nk = i < nA ? akv[i] : 0;
            int ei = add_entry(cs, CM_ATTN, hid[h], nh, nk, 0);
            if (ei < 0) {
                snprintf(err, errlen, "too many timing-table entries");
                return -1;
            }
            cs->e[ei].ws = nh ? probe_workspace(cs, r->parent, hid[h], CM_ATTN, nh, nk, 0, err, errlen) : f->ws;
            if (cs->e[ei].ws < 0 || (nh && cali_tick(cs, "workspace probe", err, errlen)))
                return -1;
        }
        for (int i = 0; i < nF + 1; i++) {
            int fd = i < nF ? fw[i] : 0;
            int ei = add_entry(cs, CM_MLP, hid[h], 0, 0, fd);
            if (ei < 0) {
                snprintf(err, errlen, "too many timing-table entries");
                return -1;
            }
            cs->e[ei].ws = fd ? probe_workspace(cs, r->parent, hid[h], CM_MLP, 0, 0, fd, err, errlen) : f->ws;
            if (cs->e[ei].ws < 0 || (fd && cali_tick(cs, "workspace probe", err, errlen)))
                return -1;
        }
    }
    int votes_sum = 0, votes_max = 0, va = nA - 1;
    while (va > 0 && akv[va] < 0)
        va--;   /* the largest attention (a Mamba entry's probe holds an attention layer too) */
    for (int h = 0; h < r->n_hid && nA && nF; h++) {
        int ea = find_entry(cs, CM_ATTN, hid[h], ah[va], akv[va], 0);
        int ef = find_entry(cs, CM_MLP, hid[h], 0, 0, fw[nF - 1]);
        int64_t both = probe_workspace(cs, r->parent, hid[h], 2, ah[va], akv[va], fw[nF - 1], err, errlen);
        if (both < 0 || cali_tick(cs, "workspace probe", err, errlen))
            return -1;
        int64_t w0 = cs->f[h].ws, wa = cs->e[ea].ws, wf = cs->e[ef].ws;
        int64_t as_max = wa > wf ? wa : wf, as_sum = wa + wf - w0;
        if (llabs(both - as_sum) < llabs(both - as_max))
            votes_sum++;
        else
            votes_max++;
    }
    cs->ws_combine = votes_sum > votes_max ? CM_WS_SUM_MAXIMA : CM_WS_MAX;
    return 0;
}

/* Phase 2: calibration models: build, runtime-bytes sample, warm up. */
static int run_models(cal_run_ctx *r, char *err, size_t errlen)
{
    cal_state *cs = r->cs;
    for (int h = 0; h < r->n_hid; h++)
        for (int k = 0; k < r->o.n_models; k++) {
            cal_model *cm = &r->cms[h * r->o.n_models + k];
            int64_t rss0 = ms_rss_bytes();
            cm->index = h * r->o.n_models + k;
            if (layout_model(cs, cm, r->parent, r->hid[h], k, r->L, r->ah, r->akv, r->nA, r->fw, r->nF, err, errlen) ||
                model_build(cs, cm, cs->be, 1, err, errlen))
                return -1;
            cm->fixed = h;
            if (runtime_sample(cs, cm, rss0, err, errlen))
                return -1;
            for (int w = 0; w < r->o.warmup + 1; w++)
                if (cali_request(cs, cm, 0, err, errlen) || cali_tick(cs, "warm-up", err, errlen))
                    return -1;
        }
    return 0;
}

/* Phase 3: the random archs (held out, then fit), each at a calibrated hidden size,
 * measured interleaved with the calibration models' timed requests; then the rest of
 * the timed requests. */
static int run_timed(cal_run_ctx *r, char *err, size_t errlen)
{
    cal_state *cs = r->cs;
    if (r->n_all > 0) {
        r->vres = calloc((size_t)r->n_all, sizeof *r->vres);
        r->varch = calloc((size_t)r->n_all, sizeof *r->varch);
        if (!r->vres || !r->varch) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        /* two streams, so the held-out archs do not depend on the fit count */
        uint64_t vr = r->o.seed * 0xD1B54A32D192ED03ULL + 7, fr = r->o.seed * 0xA24BAED4963EE407ULL + 3;
        for (int vi = 0; vi < r->n_all; vi++) {
            if (cal_random_arch(r->parent, vi < r->o.validate ? &vr : &fr, &r->varch[vi], 1)) {
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            r->varch[vi].hidden_size = r->hid[(vi < r->o.validate ? vi : vi - r->o.validate) % r->n_hid];
        }
        if (validate_all(cs, r->varch, r->n_all, r->cms, r->o.n_models, r->n_hid, r->vres, err, errlen))
            return -1;
    }
    for (int i = 0; i < r->n_cms; i++)
        while (r->cms[i].requests < r->o.warmup + 1 + r->o.reps)
            if (cali_request(cs, &r->cms[i], 1, err, errlen) || cali_tick(cs, "calibration request", err, errlen))
                return -1;
    return 0;
}

/* Phase 4: the tables from the medians, the phase scales, the fit archs' corrections: of
 * the timings, and of the memory, whose residual over the fit archs (each measured in a
 * fresh serving process) brings the process's own memory into the runtime item: its
 * program, libraries and threads, which the calibrating process's RSS growth leaves out.
 * Without fit archs the runtime item lacks it, and the held-out rows show so. */
static int run_tables(cal_run_ctx *r, char *err, size_t errlen)
{
    r->wall_tables = eng_wall_s() - r->t_start;
    if (build_tables(r->cs, r->parent, &r->tb, err, errlen) || phase_scales(r->cs, &r->tb, r->cms, r->n_cms, err, errlen) ||
        (r->n_fit && (fit_scales(&r->tb, r->varch + r->o.validate, r->vres + r->o.validate, r->n_fit, &r->fit_p,
                                 &r->fit_d, err, errlen) ||
                      fit_memory(&r->tb, r->varch + r->o.validate, r->vres + r->o.validate, r->n_fit, &r->fit_mem,
                                 err, errlen))))
        return -1;
    cal_id(r->t, r->parent, &r->o, r->id);
    snprintf(r->tb.id, sizeof r->tb.id, "%s", r->id);
    return 0;
}

/* Phase 5: the held-out archs predicted by the tables: the validation object (NEW), or
 * NULL with err. */
static json_t *run_validation(cal_run_ctx *r, char *err, size_t errlen)
{
    return cal_validation_json(&r->tb, r->varch, r->vres, r->o.validate, r->t, err, errlen);
}

/* Phase 6: the calibration document (NEW), validation stolen; NULL on OOM. */
static json_t *run_result(cal_run_ctx *r, json_t *validation, char *err, size_t errlen)
{
    char hidden_list[256];
    int hl = 0;
    hidden_list[0] = 0;
    for (int h = 0; h < r->n_hid && hl < 200; h++)
        hl += snprintf(hidden_list + hl, sizeof hidden_list - (size_t)hl, "%s%d", h ? "," : "", r->hid[h]);
    json_t *tables = cm_tables_to_json(&r->tb), *target = cm_target_to_json(r->t), *result = NULL;
    double now = eng_wall_s();
    if (tables && target && validation)
        result = json_pack("{s:s,s:s,s:o,s:s,s:i,s:f,s:o,s:o,s:{s:I,s:i,s:i,s:f,s:f,s:s,s:i,s:i,s:f,s:f,s:I}}", "id", r->id,
                           "status", "succeeded", "target", target, "family", r->parent->family, "entries",
                           r->tb.n_prefill + r->tb.n_decode + 2 * r->tb.n_fixed, "wall_s", now - r->t_start, "tables",
                           tables, "validation", validation, "cost", "requests", (json_int_t)r->cs->requests,
                           "calibration_models", r->n_cms, "layers_per_model", r->L, "tables_wall_s",
                           r->wall_tables - r->cs->heldout_s, "validation_wall_s",
                           r->cs->heldout_s + (now - r->t_start - r->wall_tables), "hidden_sizes", hidden_list,
                           "probe_models", r->n_probe, "fit_archs", r->n_fit, "fit_prefill_factor", r->fit_p,
                           "fit_decode_factor", r->fit_d, "fit_memory_bytes", (json_int_t)r->fit_mem);
    else {   /* json_pack was not called: nothing stolen */
        json_decref(tables);
        json_decref(target);
        json_decref(validation);
    }
    char wait[128];
    if (result && !cm_target_llamacpp(r->t) && strcmp(r->t->device, "cpu") == 0 &&
        json_object_set_new(result, "cpu", json_pack("{s:s,s:s,s:s,s:s}", "blas_kernel", eng_blas_kernel(), "blas_config",
                                                     eng_blas_config(), "wait_policy",
                                                     eng_cpu_wait_policy(wait, sizeof wait), "gemm_kernel",
                                                     eng_cpu_gemm_kernel(r->t->precision))) != 0) {
        json_decref(result);
        result = NULL;
    }
    if (!result)
        snprintf(err, errlen, "out of memory");
    return result;
}

static void run_free(cal_run_ctx *r)
{
    for (int v = 0; v < r->n_all && r->varch; v++)
        arch_free(&r->varch[v]);
    free(r->varch);
    free(r->vres);
    for (int i = 0; r->cms && i < r->n_cms; i++)
        model_free(&r->cms[i]);
    free(r->cms);
    cm_tables_free(&r->tb);
    if (r->cs) {
        eng_backend_free(r->cs->be);
        state_free(r->cs);
        free(r->cs);
    }
}

/* One calibration, without the judgment of the machine's load (cal_run). */
static json_t *run_once(const arch *parent, const cm_target *t, const cal_opts *o, char *err, size_t errlen)
{
    static cal_run_ctx zero;
    cal_run_ctx *r = malloc(sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    *r = zero;
    r->parent = parent;
    r->t = t;
    r->o = *o;
    json_t *result = NULL;
    if (cm_target_llamacpp(t)) {
        cal_id(t, parent, &r->o, r->id);
        result = cal_llama_run(parent, t, &r->o, r->id, err, errlen);
    } else {
        if (!run_setup(r, err, errlen) && !run_probes(r, err, errlen) && !run_models(r, err, errlen) &&
            !run_timed(r, err, errlen) && !run_tables(r, err, errlen)) {
            json_t *validation = run_validation(r, err, errlen);
            if (validation)
                result = run_result(r, validation, err, errlen);
        }
        run_free(r);
    }
    free(r);
    /* where it was measured, from the target it holds (another engine's resolved there):
     * a covering lookup reuses it only there */
    char env[1024], e2[256] = "";
    cm_target done;
    if (result && (cm_target_from_json(json_object_get(result, "target"), "/target", &done, e2, sizeof e2) ||
                   (cm_calibration_env(&done, o->threads, env, sizeof env),
                    json_object_set_new(result, "env", json_string(env))))) {
        json_decref(result);
        snprintf(err, errlen, "calibration: %s", e2[0] ? e2 : "out of memory");
        return NULL;
    }
    return result;
}

/* cal_run's calibrations under ms_run_quiet: the last one made (NULL for a try cut
 * short), those set aside, the try under way. */
typedef struct {
    const arch *parent;
    const cm_target *t;
    const cal_opts *o;
    json_t *cal, *tries;
    ms_quiet_state state;
} quiet_cal;

static int quiet_run(void *ud, char *err, size_t errlen)
{
    quiet_cal *q = ud;
    q->cal = run_once(q->parent, q->t, q->o, err, errlen);
    return q->cal ? 0 : q->state.cut ? MS_RUN_CUT : -1;
}

/* A try set aside joins the tries: its load, its wall time and held-out errors (a try cut
 * short has neither errors nor tables: cut_short, and the wall time until it stopped). */
static int quiet_aside(void *ud, const ms_host_load *load, char *err, size_t errlen)
{
    quiet_cal *q = ud;
    json_t *v = json_object_get(q->cal, "validation");
    json_t *tried = json_pack("{s:o,s:o*,s:b,s:O*,s:O*}", "host_load", ms_host_load_json(load), "wall_s",
                              q->cal ? json_incref(json_object_get(q->cal, "wall_s")) : json_real(load->wall_s),
                              "cut_short", q->cal == NULL, "latency_mape_pct", json_object_get(v, "latency_mape_pct"),
                              "memory_mape_pct", json_object_get(v, "memory_mape_pct"));
    json_decref(q->cal);
    q->cal = NULL;
    if (!tried || json_array_append_new(q->tries, tried)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    char note[256] = "";
    (void)ms_host_load_note(json_object_get(tried, "host_load"), note, sizeof note);
    if (q->o->verbose)
        fprintf(stderr, "calibrate: set aside, made beside other work (%s); calibrating again\n", note);
    if (q->o->aside)
        q->o->aside(q->o->ud, tried, note);
    return 0;
}

json_t *cal_run(const arch *parent, const cm_target *t, const cal_opts *opts, char *err, size_t errlen)
{
    cal_opts o;
    if (opts)
        o = *opts;
    else
        cal_opts_default(&o);
    quiet_cal q = {.parent = parent, .t = t, .o = &o, .tries = json_array()};
    if (!q.tries) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    o.quiet = &q.state;
    ms_quiet_opts qo = {.threads = cm_target_llamacpp(t) ? t->threads : o.threads,
                        .tries = o.quiet_tries > 1 ? o.quiet_tries : 1,
                        .wait_s = o.quiet_wait_s,
                        .cancelled = o.cancelled,
                        .cancel_ud = o.ud,
                        .state = &q.state};
    ms_host_load load;
    int rc = ms_run_quiet(&qo, quiet_run, quiet_aside, &q, &load, err, errlen);
    if ((rc == 0 || rc == 2) &&
        (json_object_set_new(q.cal, "host_load", ms_host_load_json(&load)) ||
         (json_array_size(q.tries) && json_object_set(q.cal, "calibration_tries", q.tries)))) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    }
    if (rc != 0 && rc != 2) {
        json_decref(q.cal);
        q.cal = NULL;
    }
    json_decref(q.tries);
    return q.cal;
}

int cal_contended_note(const json_t *cal, char *msg, size_t cap)
{
    char load[256];
    if (!ms_host_load_note(json_object_get(cal, "host_load"), load, sizeof load))
        return 0;
    size_t made = 1 + json_array_size(json_object_get(cal, "calibration_tries"));
    snprintf(msg, cap,
             "calibrated beside other work%s: %s; timings taken so are slow and uneven, and the tables' level and "
             "their held-out errors with them. The calibration is kept for this run and not reused: the next one "
             "on this target calibrates again",
             made > 1 ? ", each time it was made" : "", load);
    return 1;
}

json_t *cal_get_or_run(const char *data_dir, const arch *parent, const cm_target *target, const cal_opts *o,
                       int *reused, char *err, size_t errlen)
{
    char id[40], e2[256];
    cm_target resolved = *target, *t = &resolved;
    *reused = 0;
    if (lc_target_resolve(t, err, errlen))   /* another engine's build is part of the key */
        return NULL;
    cal_id(t, parent, o, id);
    json_t *cal = cm_calibration_load(data_dir, id, e2, sizeof e2);
    if (cal) {
        cm_tables tb;
        if (cm_calibration_reusable(cal) && !cm_calibration_tables(cal, &tb, e2, sizeof e2)) {
            cm_tables_free(&tb);
            *reused = 1;
            return cal;
        }
        json_decref(cal);   /* unreadable, or made beside other work: calibrate again */
    }
    cal = cal_run(parent, t, o, err, errlen);
    if (cal && cm_calibration_save(data_dir, cal, err, errlen)) {
        json_decref(cal);
        return NULL;
    }
    return cal;
}
