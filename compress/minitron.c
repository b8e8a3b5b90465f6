/* compress/minitron.c — the Minitron++ baseline: uniform candidates from the same grid
 * as the AutoCompress search (dnas_space_build), priced by the same cost model,
 * frontier selection, and a short distillation trial of each through a callback.
 */
#include "compress/minitron.h"
#include "engine/clock.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    int hidden, heads, ffn, experts, ewidth, swidth, mamba, depth;   /* ewidth, swidth: the routed and shared
                                                                        experts' widths (0: the parent's) */
    int latent;                                                      /* LatentMoE's latent (0: the parent's) */
    int64_t params;
    int feasible;
} mn_cand;

void mn_result_free(mn_result *r)
{
    arch_free(&r->arch);
    for (int i = 0; i < r->n_trials; i++)
        arch_free(&r->trials[i]);
    free(r->trials);
    free(r->trial_loss);
    memset(r, 0, sizeof *r);
}

int mn_uniform_arch(const arch *parent, const int *layer_order, int hidden, int heads, int ffn, int experts,
                    int ewidth, int swidth, int mamba, int depth, arch *out)
{
    int L = parent->n_layers;
    if (depth < 0 || depth > L)
        return -1;
    unsigned char *keep = calloc((size_t)L, 1);
    if (!keep)
        return -1;
    for (int i = L - depth; i < L; i++)        /* the `depth` most important layers */
        keep[layer_order ? layer_order[i] : i] = 1;
    if (arch_init(out, depth) != 0) {
        free(keep);
        return -1;
    }
    arch_layer *layers = out->layers;
    *out = *parent;
    out->layers = layers;
    out->n_layers = depth;
    out->hidden_size = hidden;
    int group = 1, hybrid = arch_hybrid(parent);   /* blocks where the parent's are */
    for (int l = 0; l < L; l++)
        if (parent->layers[l].n_heads) {
            group = parent->layers[l].n_heads / parent->layers[l].n_kv_heads;
            break;
        }
    int i = 0;
    for (int l = 0; l < L; l++) {
        if (!keep[l])
            continue;
        const arch_layer *pl = &parent->layers[l];
        arch_layer *o = &layers[i++];
        memset(o, 0, sizeof *o);
        o->source_layer = pl->source_layer;
        if (pl->mamba.n_heads) {
            o->mamba = pl->mamba;
            o->mamba.n_heads = mamba;
        } else if (pl->n_heads || !hybrid) {
            o->n_heads = heads;
            o->n_kv_heads = heads / group;
        }
        if (pl->moe.n_experts) {
            o->moe = arch_moe_keep(&pl->moe, experts);
            o->moe.expert_ffn_dim = ewidth > 0 ? ewidth : pl->moe.expert_ffn_dim;
            if (swidth > 0 && pl->moe.shared_ffn_dim)
                o->moe.shared_ffn_dim = swidth;
        } else if (pl->ffn_dim || !hybrid)
            o->ffn_dim = ffn;
    }
    free(keep);
    return 0;
}

/* A uniform candidate's latent: every LatentMoE layer of a (0: the parent's, left alone). */
static void set_latent(arch *a, int latent)
{
    for (int l = 0; latent > 0 && l < a->n_layers; l++)
        if (a->layers[l].moe.latent_dim)
            a->layers[l].moe.latent_dim = latent;
}

/* The first attention layer's query heads (0: none). */
static int first_heads(const arch *parent)
{
    for (int l = 0; l < parent->n_layers; l++)
        if (parent->layers[l].n_heads)
            return parent->layers[l].n_heads;
    return 0;
}

static int cand_cmp(const void *a, const void *b)
{
    const mn_cand *x = a, *y = b;
    return (y->params > x->params) - (y->params < x->params);
}

static int meets(const dnas_limits *lim, const cm_prediction *p)
{
    if (lim->latency_ms > 0 && p->latency_ms > lim->latency_ms)
        return 0;
    if (lim->throughput_tps > 0 && p->throughput_tps < lim->throughput_tps)
        return 0;
    if (lim->memory_bytes > 0 && (double)p->total > lim->memory_bytes)
        return 0;
    if (lim->params > 0 && (double)p->params > lim->params)
        return 0;
    return 1;
}

/* 1 when the axes allow (dense width f, expert count e): a kind not searched keeps the
 * parent's own size (its first layer of that kind, as for the heads); every MoE layer can keep
 * e experts. */
static int uniform_mlp_allowed(const arch *parent, const dnas_axes *axes, int f, int e)
{
    int seen_f = 0, seen_e = 0;
    for (int l = 0; l < parent->n_layers; l++) {
        const arch_layer *y = &parent->layers[l];
        if (!axes->ffn && y->ffn_dim && !seen_f++ && y->ffn_dim != f)
            return 0;
        if (!axes->experts && y->moe.n_experts && !seen_e++ && y->moe.n_experts != e)
            return 0;
        if (y->moe.n_experts && e > 0 && !arch_moe_count_ok(&y->moe, e))
            return 0;   /* grouped routing: as many per group */
        if (y->moe.n_experts && e > 0 && e < axes->min_experts && e != y->moe.n_experts)
            return 0;   /* GGUF: llama.cpp's graphs need 2 or more */
    }
    return 1;
}

/* 1 when the uniform head count sp->heads[k] and dense width sp->ffn[j] are allowed in
 * every layer that takes them (mn_uniform_arch), as the space allows them to DNAS: an
 * export that keeps the query heads (DeciLM, an MoE family's own config), a width off a
 * layer's grid, a part a heterogeneous parent's layer lacks. */
static int uniform_parts_allowed(const search_space *sp, const arch *parent, int attn, int k, int dense, int j)
{
    int hybrid = arch_hybrid(parent);
    for (int l = 0; l < parent->n_layers; l++) {
        const arch_layer *pl = &parent->layers[l];
        if (attn && !pl->mamba.n_heads && (pl->n_heads || !hybrid) && !sp->allowed_heads[l * sp->n_heads + k])
            return 0;
        if (dense && !pl->moe.n_experts && (pl->ffn_dim || !hybrid) && !sp->allowed_ffn[l * sp->n_ffn + j])
            return 0;
    }
    return 1;
}

/* Keep, in text, the predicted costs of the infeasible candidate closest to the limits. */
static void note_violation(const dnas_limits *lim, const cm_prediction *p, double *best, char *text, size_t cap)
{
    double v = 0;
    if (lim->latency_ms > 0)
        v += p->latency_ms / lim->latency_ms;
    if (lim->memory_bytes > 0)
        v += (double)p->total / lim->memory_bytes;
    if (lim->params > 0)
        v += (double)p->params / lim->params;
    if (lim->throughput_tps > 0)
        v += lim->throughput_tps / p->throughput_tps;
    if (*best < 0 || v < *best) {
        *best = v;
        snprintf(text, cap, "latency_ms %.4g, throughput_tokens_per_s %.4g, memory_bytes %lld, params %lld",
                 p->latency_ms, p->throughput_tps, (long long)p->total, (long long)p->params);
    }
}

int mn_frontier(const mn_opts *o, arch **out, int *n_out, char *err, size_t errlen)
{
    *out = NULL;
    *n_out = 0;
    search_space sp;
    search_costs costs;
    if (dnas_space_build(o->parent, o->tables, &o->limits, &o->axes, &sp, &costs, err, errlen) != 0)
        return -1;
    int L = o->parent->n_layers, min_depth = o->axes.depth ? (L + 1) / 2 : L;
    int dense = 0, moe = 0, attn = 0, mamba = 0, own_mamba = 0;
    for (int l = 0; l < L; l++) {
        const arch_layer *pl = &o->parent->layers[l];
        dense |= pl->ffn_dim > 0;
        moe |= pl->moe.n_experts > 0;
        attn |= pl->n_heads > 0;
        mamba |= pl->mamba.n_heads > 0;
        own_mamba = own_mamba ? own_mamba : pl->mamba.n_heads;
    }
    /* dense widths, expert counts, attention and Mamba heads searched apart: each kind uniform
       across its layers */
    int nF = dense ? sp.n_ffn : 1, nE = moe ? sp.n_exp : 1, nA = attn ? sp.n_heads : 1, nM = mamba ? sp.n_mam : 1;
    size_t cap = (size_t)sp.n_hidden * nA * nF * nE * nM * (L - min_depth + 1);
    mn_cand *c = calloc(cap ? cap : 1, sizeof *c);
    if (!c) {
        dnas_space_free(&sp, &costs);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t n = 0;
    double best_violation = -1;
    char cheapest[512] = "";
    for (size_t i = 0; i < cap / (size_t)(L - min_depth + 1); i++)
        for (int depth = min_depth; depth <= L; depth++) {
            size_t r = i;
            int x = (int)(r % (size_t)nE), hi, k, j, q;
            r /= (size_t)nE;
            q = (int)(r % (size_t)nM), r /= (size_t)nM;
            j = (int)(r % (size_t)nF), r /= (size_t)nF;
            k = (int)(r % (size_t)nA), hi = (int)(r / (size_t)nA);
            int h = attn ? sp.heads[k] : 0, f = dense ? sp.ffn[j] : 0, e = moe ? sp.exp[x] : 0, mh = mamba ? sp.mam[q] : 0;
            int ew = moe ? sp.expw[x] : 0, sw = moe ? sp.shw[x] : 0;
            if ((attn && h <= 0) || (dense && f <= 0) || (moe && e <= 0))
                continue;   /* uniform candidates keep every part of every kept layer */
            if ((!o->axes.heads && attn && h != first_heads(o->parent)) || (!o->axes.mamba && mh != own_mamba))
                continue;
            if (!uniform_mlp_allowed(o->parent, &o->axes, f, e) || !uniform_parts_allowed(&sp, o->parent, attn, k, dense, j))
                continue;
            arch a;
            cm_prediction p;
            char e2[256];
            if (mn_uniform_arch(o->parent, o->layer_order, sp.hidden[hi], h, f, e, ew, sw, mh, depth, &a) != 0)
                continue;
            set_latent(&a, sp.lat[hi]);   /* the hidden axis's latent (one for the model anyway) */
            int rc = cm_predict(o->tables, &a, &p, e2, sizeof e2);
            arch_free(&a);
            if (rc != 0)
                continue;
            mn_cand *y = &c[n++];
            *y = (mn_cand){.hidden = sp.hidden[hi], .heads = h, .ffn = f, .experts = e, .ewidth = ew, .swidth = sw,
                           .mamba = mh, .latent = sp.lat[hi],
                           .depth = depth, .params = p.params, .feasible = meets(&o->limits, &p)};
            if (!y->feasible)
                note_violation(&o->limits, &p, &best_violation, cheapest, sizeof cheapest);
        }
    /* Keep the feasible candidates no other feasible candidate dominates. */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!c[i].feasible)
            continue;
        int dominated = 0;
        for (size_t j = 0; j < n && !dominated; j++) {
            if (j == i || !c[j].feasible)
                continue;
            int wj = c[j].ewidth ? c[j].ewidth : INT_MAX, wi = c[i].ewidth ? c[i].ewidth : INT_MAX;
            int sj = c[j].swidth ? c[j].swidth : INT_MAX, si = c[i].swidth ? c[i].swidth : INT_MAX;
            int lj = c[j].latent ? c[j].latent : INT_MAX, li = c[i].latent ? c[i].latent : INT_MAX;
            if (c[j].hidden >= c[i].hidden && c[j].heads >= c[i].heads && c[j].ffn >= c[i].ffn &&
                c[j].experts >= c[i].experts && wj >= wi && sj >= si && lj >= li && c[j].mamba >= c[i].mamba &&
                c[j].depth >= c[i].depth &&
                (c[j].hidden > c[i].hidden || c[j].heads > c[i].heads || c[j].ffn > c[i].ffn ||
                 c[j].experts > c[i].experts || wj > wi || sj > si || lj > li || c[j].mamba > c[i].mamba ||
                 c[j].depth > c[i].depth))
                dominated = 1;
        }
        if (!dominated)
            c[m++] = c[i];
    }
    dnas_space_free(&sp, &costs);
    if (m == 0) {
        snprintf(err, errlen, "no uniform architecture meets the limits; the closest predicts %s", cheapest);
        free(c);
        return 0;
    }
    qsort(c, m, sizeof *c, cand_cmp);
    int want = o->max_candidates > 0 ? o->max_candidates : 4;
    if ((size_t)want > m)
        want = (int)m;
    arch *arr = calloc((size_t)want, sizeof *arr);
    if (!arr) {
        free(c);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < want; i++)
        if (mn_uniform_arch(o->parent, o->layer_order, c[i].hidden, c[i].heads, c[i].ffn, c[i].experts, c[i].ewidth,
                            c[i].swidth, c[i].mamba, c[i].depth, &arr[i]) == 0) {
            set_latent(&arr[i], c[i].latent);
        } else {
            for (int k = 0; k < i; k++)
                arch_free(&arr[k]);
            free(arr);
            free(c);
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    free(c);
    *out = arr;
    *n_out = want;
    return 0;
}

int mn_run(const mn_opts *o, mn_result *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    double t0 = eng_wall_s();
    cm_prediction pp;
    if (cm_predict(o->tables, o->parent, &pp, err, errlen) != 0)
        return -1;
    if (meets(&o->limits, &pp)) {
        if (arch_copy(&r->arch, o->parent) != 0)
            return -1;
        r->predicted = pp;
        r->parent_feasible = 1;
        return 0;
    }
    arch *cands = NULL;
    int n = 0;
    if (mn_frontier(o, &cands, &n, err, errlen) != 0)
        return -1;
    if (n == 0)
        return -1;   /* err says why */
    r->trials = cands;
    r->n_trials = n;
    r->trial_loss = calloc((size_t)n, sizeof *r->trial_loss);
    if (!r->trial_loss) {
        mn_result_free(r);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int best = -1;
    for (int i = 0; i < n; i++) {
        int64_t tokens = 0;
        int rc = o->trial(o->trial_ctx, &cands[i], &r->trial_loss[i], &tokens, err, errlen);
        r->selection_tokens += tokens;
        if (rc != 0) {   /* failed, or cancelled: r holds nothing then either */
            mn_result_free(r);
            return rc;
        }
        if (best < 0 || r->trial_loss[i] < r->trial_loss[best])
            best = i;
    }
    if (arch_copy(&r->arch, &cands[best]) != 0 || cm_predict(o->tables, &r->arch, &r->predicted, err, errlen) != 0) {
        mn_result_free(r);
        return -1;
    }
    r->val_loss = r->trial_loss[best];
    r->wall_s = eng_wall_s() - t0;
    return 0;
}
