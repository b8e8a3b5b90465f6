/* compress/search.c — relaxed distributions over the search axes, expected costs and
 * their gradients, the two-sided penalty, argmax decoding and greedy repair.
 * Pure arithmetic over tables (see search.h); no engine, no files.
 */
#include "compress/search.h"
#include "engine/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const search_metric_names[SM_COUNT] = {"latency_ms", "decode_ms", "memory_bytes", "params"};

static int allowed_head(const search_space *sp, int l, int k)
{
    return !sp->allowed_heads || sp->allowed_heads[l * sp->n_heads + k];
}

static int allowed_ffn(const search_space *sp, int l, int j)
{
    return !sp->allowed_ffn || sp->allowed_ffn[l * sp->n_ffn + j];
}

int search_dist_init(search_dist *d, const search_space *sp, double init_bias)
{
    memset(d, 0, sizeof *d);
    d->sp = sp;
    size_t nh = (size_t)sp->n_hidden, na = (size_t)sp->n_layers * sp->n_heads,
           nf = (size_t)sp->n_layers * sp->n_ffn, nk = (size_t)sp->n_layers * 2;
    size_t total = nh + na + nf + nk;
    double *block = calloc(3 * total, sizeof *block);
    if (!block)
        return -1;
    double *p = block;
    d->logit_hidden = p; p += nh;
    d->logit_heads = p; p += na;
    d->logit_ffn = p; p += nf;
    d->logit_keep = p; p += nk;
    d->p_hidden = p; p += nh;
    d->p_heads = p; p += na;
    d->p_ffn = p; p += nf;
    d->p_keep = p; p += nk;
    d->g_hidden = p; p += nh;
    d->g_heads = p; p += na;
    d->g_ffn = p; p += nf;
    d->g_keep = p;
    d->logit_hidden[sp->n_hidden - 1] = init_bias;
    for (int l = 0; l < sp->n_layers; l++) {
        for (int k = sp->n_heads - 1; k >= 0; k--)
            if (allowed_head(sp, l, k)) { d->logit_heads[l * sp->n_heads + k] = init_bias; break; }
        for (int j = sp->n_ffn - 1; j >= 0; j--)
            if (allowed_ffn(sp, l, j)) { d->logit_ffn[l * sp->n_ffn + j] = init_bias; break; }
        d->logit_keep[l * 2 + 1] = init_bias;
    }
    return 0;
}

void search_dist_free(search_dist *d)
{
    free(d->logit_hidden);
    memset(d, 0, sizeof *d);
}

/* Standard Gumbel noise from a xorshift64* state. */
static double gumbel(uint64_t *s)
{
    double u = eng_rng_unit(eng_xorshift64star(s));
    if (u < 1e-12)
        u = 1e-12;
    return -log(-log(u));
}

/* Softmax over n entries at temperature tau, skipping entries with ok[i] == 0. */
static void softmax_masked(const double *z, double *p, int n, const unsigned char *ok, double tau, uint64_t *rng)
{
    double mx = -INFINITY, tmp[SEARCH_MAX_CHOICES];
    for (int i = 0; i < n; i++) {
        tmp[i] = (ok && !ok[i]) ? -INFINITY : (z[i] + (rng ? gumbel(rng) : 0.0)) / tau;
        if (tmp[i] > mx)
            mx = tmp[i];
    }
    double s = 0;
    for (int i = 0; i < n; i++) {
        p[i] = isinf(tmp[i]) ? 0.0 : exp(tmp[i] - mx);
        s += p[i];
    }
    for (int i = 0; i < n; i++)
        p[i] /= s;
}

/* The first Mamba layer (its heads axis stands for all of them), or -1. */
static int first_mamba(const search_space *sp)
{
    for (int l = 0; sp->mamba && l < sp->n_layers; l++)
        if (sp->mamba[l])
            return l;
    return -1;
}

/* The first MoE layer when their MLP axes are one (tie_exp), or -1. */
static int first_moe(const search_space *sp)
{
    for (int l = 0; sp->tie_exp && sp->moe && l < sp->n_layers; l++)
        if (sp->moe[l])
            return l;
    return -1;
}

/* 1 when layer l's axis (1 heads, 2 MLP) is part of a global axis: the Mamba head count,
 * or the expert count when tied. */
static int global_axis(const search_space *sp, int axis, int l)
{
    if (axis == 1)
        return sp->mamba && sp->mamba[l];
    return axis == 2 && sp->tie_exp && sp->moe && sp->moe[l];
}

/* 1 when layer l's axis is a copy of a global axis (a layer of its kind after the first). */
static int tied(const search_space *sp, int axis, int l)
{
    return global_axis(sp, axis, l) && l != (axis == 1 ? first_mamba(sp) : first_moe(sp));
}

void search_dist_probs(search_dist *d, double tau, uint64_t *rng)
{
    const search_space *sp = d->sp;
    int fm = first_mamba(sp), fe = first_moe(sp);
    softmax_masked(d->logit_hidden, d->p_hidden, sp->n_hidden, NULL, tau, rng);
    for (int l = 0; l < sp->n_layers; l++) {
        if (tied(sp, 1, l))   /* one draw for the global Mamba axis */
            memcpy(d->p_heads + l * sp->n_heads, d->p_heads + fm * sp->n_heads, sizeof(double) * sp->n_heads);
        else
            softmax_masked(d->logit_heads + l * sp->n_heads, d->p_heads + l * sp->n_heads, sp->n_heads,
                           sp->allowed_heads ? sp->allowed_heads + l * sp->n_heads : NULL, tau, rng);
        if (tied(sp, 2, l))   /* one draw for the tied expert count */
            memcpy(d->p_ffn + l * sp->n_ffn, d->p_ffn + fe * sp->n_ffn, sizeof(double) * sp->n_ffn);
        else
            softmax_masked(d->logit_ffn + l * sp->n_ffn, d->p_ffn + l * sp->n_ffn, sp->n_ffn,
                           sp->allowed_ffn ? sp->allowed_ffn + l * sp->n_ffn : NULL, tau, rng);
        if (sp->depth) {
            softmax_masked(d->logit_keep + l * 2, d->p_keep + l * 2, 2, NULL, tau, rng);
        } else {
            d->p_keep[l * 2] = 0.0;
            d->p_keep[l * 2 + 1] = 1.0;
        }
    }
    size_t n = (size_t)sp->n_hidden + (size_t)sp->n_layers * (sp->n_heads + sp->n_ffn + 2);
    memset(d->g_hidden, 0, n * sizeof(double));
}

/* Smooth maximum s*log(sum exp(x/s)) at a fixed scale s (> 0; 0 = the hard max);
 * writes its gradient (softmax weights) to w. The scale must not depend on x, or the
 * weights would not be the gradient. */
static double smooth_max(const double *x, int n, double s, double *w)
{
    double mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > mx)
            mx = x[i];
    if (s <= 0) {
        int c = 0;
        for (int i = 0; i < n; i++)
            c += x[i] == mx;
        for (int i = 0; i < n; i++)
            w[i] = x[i] == mx ? 1.0 / c : 0.0;
        return mx;
    }
    double sum = 0;
    for (int i = 0; i < n; i++) {
        w[i] = exp((x[i] - mx) / s);
        sum += w[i];
    }
    for (int i = 0; i < n; i++)
        w[i] /= sum;
    return mx + s * log(sum);
}

static size_t idx3(const search_space *sp, int h, int l, int k, int n)
{
    return ((size_t)h * sp->n_layers + l) * n + k;
}

/* The smooth-max scale for hidden candidate h: the table's largest workspace entry /
 * smooth (fixed per table, so the softmax weights are the exact gradient). */
static double ws_scale(const search_space *sp, const search_table *t, int h, int NA, int NF, double smooth)
{
    double scale = fabs(t->ws_fixed[h]);
    for (size_t i = idx3(sp, h, 0, 0, NA); i < idx3(sp, h + 1, 0, 0, NA); i++)
        scale = fmax(scale, fabs(t->ws_attn[i]));
    for (size_t i = idx3(sp, h, 0, 0, NF); i < idx3(sp, h + 1, 0, 0, NF); i++)
        scale = fmax(scale, fabs(t->ws_ffn[i]));
    return smooth > 0 ? scale / smooth : 0;
}

double search_expected_cost(search_dist *d, const search_table *t, double smooth, double gs)
{
    const search_space *sp = d->sp;
    int L = sp->n_layers, NA = sp->n_heads, NF = sp->n_ffn;
    double total = 0;
    double *xs = NULL, *ws = NULL, *wa = NULL, *wf = NULL;
    if (t->ws_fixed) {
        xs = malloc((size_t)(L + 1) * 4 * sizeof *xs);
        if (!xs)
            return NAN;
        ws = xs + (L + 1);
        wa = ws + (L + 1);
        wf = wa + (L + 1);
    }
    for (int h = 0; h < sp->n_hidden; h++) {
        double ph = d->p_hidden[h];
        double inner = t->fixed ? t->fixed[h] : 0.0;
        for (int l = 0; l < L; l++) {
            const double *pa = d->p_heads + l * NA, *pf = d->p_ffn + l * NF;
            double pk = d->p_keep[l * 2 + 1], A = 0, F = 0;
            for (int k = 0; k < NA; k++)
                A += pa[k] * t->attn[idx3(sp, h, l, k, NA)];
            for (int j = 0; j < NF; j++)
                F += pf[j] * t->ffn[idx3(sp, h, l, j, NF)];
            inner += pk * (A + F);
            if (gs != 0) {
                d->g_keep[l * 2 + 1] += gs * ph * (A + F);
                for (int k = 0; k < NA; k++)
                    d->g_heads[l * NA + k] += gs * ph * pk * t->attn[idx3(sp, h, l, k, NA)];
                for (int j = 0; j < NF; j++)
                    d->g_ffn[l * NF + j] += gs * ph * pk * t->ffn[idx3(sp, h, l, j, NF)];
            }
        }
        if (t->ws_fixed && t->ws_sum_of_maxima) {
            /* W_h = ws_fixed + smax(0, pk_l*(WA_l - ws_fixed)) + smax(0, pk_l*(WF_l - ws_fixed)) */
            double scale = ws_scale(sp, t, h, NA, NF, smooth), w0 = t->ws_fixed[h];
            double *xa = xs, *xf = ws, *ga = wa, *gf = wf;   /* [L+1] each; element 0 is the 0 floor */
            double mw[SEARCH_MAX_CHOICES * 16], mf[SEARCH_MAX_CHOICES * 16];
            if (L + 1 > (int)(sizeof mw / sizeof mw[0])) {
                free(xs);
                return NAN;
            }
            xa[0] = xf[0] = 0;
            for (int l = 0; l < L; l++) {
                const double *pa = d->p_heads + l * NA, *pf = d->p_ffn + l * NF;
                double A = -w0, F = -w0, pk = d->p_keep[l * 2 + 1];
                for (int k = 0; k < NA; k++)
                    A += pa[k] * t->ws_attn[idx3(sp, h, l, k, NA)];
                for (int j = 0; j < NF; j++)
                    F += pf[j] * t->ws_ffn[idx3(sp, h, l, j, NF)];
                xa[l + 1] = pk * A;
                xf[l + 1] = pk * F;
                ga[l + 1] = A;   /* kept for the keep gradient */
                gf[l + 1] = F;
            }
            double Sa = smooth_max(xa, L + 1, scale, mw), Sf = smooth_max(xf, L + 1, scale, mf);
            inner += w0 + Sa + Sf;
            if (gs != 0) {
                for (int l = 0; l < L; l++) {
                    double pk = d->p_keep[l * 2 + 1], g = gs * ph;
                    d->g_keep[l * 2 + 1] += g * (mw[l + 1] * ga[l + 1] + mf[l + 1] * gf[l + 1]);
                    for (int k = 0; k < NA; k++)
                        d->g_heads[l * NA + k] += g * mw[l + 1] * pk * t->ws_attn[idx3(sp, h, l, k, NA)];
                    for (int j = 0; j < NF; j++)
                        d->g_ffn[l * NF + j] += g * mf[l + 1] * pk * t->ws_ffn[idx3(sp, h, l, j, NF)];
                }
            }
        } else if (t->ws_fixed) {
            /* W_h = smax(ws_fixed[h], pk_l * smax(WA_l, WF_l) for every layer) */
            double pair[2], pw[2], scale = ws_scale(sp, t, h, NA, NF, smooth);
            xs[0] = t->ws_fixed[h];
            for (int l = 0; l < L; l++) {
                const double *pa = d->p_heads + l * NA, *pf = d->p_ffn + l * NF;
                pair[0] = pair[1] = 0;
                for (int k = 0; k < NA; k++)
                    pair[0] += pa[k] * t->ws_attn[idx3(sp, h, l, k, NA)];
                for (int j = 0; j < NF; j++)
                    pair[1] += pf[j] * t->ws_ffn[idx3(sp, h, l, j, NF)];
                double m2 = smooth_max(pair, 2, scale, pw);
                wa[l + 1] = pw[0];
                wf[l + 1] = pw[1];
                xs[l + 1] = d->p_keep[l * 2 + 1] * m2;
                ws[l + 1] = m2;   /* kept for the keep gradient below */
            }
            double mw[SEARCH_MAX_CHOICES * 16];
            double *w = (L + 1 <= (int)(sizeof mw / sizeof mw[0])) ? mw : NULL;
            if (!w) {
                free(xs);
                return NAN;
            }
            double W = smooth_max(xs, L + 1, scale, w);
            inner += W;
            if (gs != 0) {
                for (int l = 0; l < L; l++) {
                    double pk = d->p_keep[l * 2 + 1], g = gs * ph * w[l + 1];
                    d->g_keep[l * 2 + 1] += g * ws[l + 1];
                    for (int k = 0; k < NA; k++)
                        d->g_heads[l * NA + k] += g * pk * wa[l + 1] * t->ws_attn[idx3(sp, h, l, k, NA)];
                    for (int j = 0; j < NF; j++)
                        d->g_ffn[l * NF + j] += g * pk * wf[l + 1] * t->ws_ffn[idx3(sp, h, l, j, NF)];
                }
            }
        }
        total += ph * inner;
        if (gs != 0)
            d->g_hidden[h] += gs * inner;
    }
    free(xs);
    return total;
}

int search_choice_init(search_choice *c, const search_space *sp)
{
    memset(c, 0, sizeof *c);
    int *b = calloc((size_t)sp->n_layers * 3 + 1, sizeof *b);
    if (!b)
        return -1;
    c->heads = b;
    c->ffn = b + sp->n_layers;
    c->keep = b + 2 * sp->n_layers;
    return 0;
}

void search_choice_free(search_choice *c)
{
    free(c->heads);
    memset(c, 0, sizeof *c);
}

double search_choice_cost(const search_space *sp, const search_table *t, const search_choice *c)
{
    int h = c->hidden, NA = sp->n_heads, NF = sp->n_ffn;
    double total = t->fixed ? t->fixed[h] : 0.0, w0 = t->ws_fixed ? t->ws_fixed[h] : 0.0;
    double wmax = w0, amax = 0, fmax_ = 0;
    for (int l = 0; l < sp->n_layers; l++) {
        if (!c->keep[l])
            continue;
        total += t->attn[idx3(sp, h, l, c->heads[l], NA)] + t->ffn[idx3(sp, h, l, c->ffn[l], NF)];
        if (t->ws_fixed) {
            double a = t->ws_attn[idx3(sp, h, l, c->heads[l], NA)], f = t->ws_ffn[idx3(sp, h, l, c->ffn[l], NF)];
            double m = a > f ? a : f;
            if (m > wmax)
                wmax = m;
            if (a - w0 > amax)
                amax = a - w0;
            if (f - w0 > fmax_)
                fmax_ = f - w0;
        }
    }
    if (!t->ws_fixed)
        return total;
    return total + (t->ws_sum_of_maxima ? w0 + amax + fmax_ : wmax);
}

double search_penalty_step(search_penalty *pen, search_dist *d, const search_costs *c, double smooth,
                           double weight, double eta)
{
    double value = 0;
    for (int m = 0; m < SM_COUNT; m++) {
        const search_table *t = &c->t[m];
        if (!t->active)
            continue;
        double e = search_expected_cost(d, t, smooth, 0.0);
        double gap = e / t->limit - 1.0;
        pen->expected[m] = e;
        pen->gap[m] = gap;
        value += weight * (pen->lambda1[m] * gap + pen->lambda2[m] * gap * gap);
        double gs = weight * (pen->lambda1[m] + 2.0 * pen->lambda2[m] * gap) / t->limit;
        if (gs != 0)
            search_expected_cost(d, t, smooth, gs);
        pen->lambda1[m] += eta * gap;
        pen->lambda2[m] += eta * gap * gap;
    }
    return value;
}

static void chain_softmax(const double *p, const double *gp, double *gz, int n, double tau)
{
    double dot = 0;
    for (int i = 0; i < n; i++)
        dot += gp[i] * p[i];
    for (int j = 0; j < n; j++)
        gz[j] = p[j] * (gp[j] - dot) / tau;
}

void search_dist_logit_grads(const search_dist *d, double tau, double *gz_hidden, double *gz_heads,
                             double *gz_ffn, double *gz_keep)
{
    const search_space *sp = d->sp;
    /* the global axes: every layer's gradient of its kind */
    double gm[SEARCH_MAX_CHOICES] = {0}, ge[SEARCH_MAX_CHOICES] = {0};
    for (int l = 0; l < sp->n_layers; l++) {
        for (int k = 0; global_axis(sp, 1, l) && k < sp->n_heads; k++)
            gm[k] += d->g_heads[l * sp->n_heads + k];
        for (int j = 0; global_axis(sp, 2, l) && j < sp->n_ffn; j++)
            ge[j] += d->g_ffn[l * sp->n_ffn + j];
    }
    chain_softmax(d->p_hidden, d->g_hidden, gz_hidden, sp->n_hidden, tau);
    for (int l = 0; l < sp->n_layers; l++) {
        chain_softmax(d->p_heads + l * sp->n_heads, global_axis(sp, 1, l) ? gm : d->g_heads + l * sp->n_heads,
                      gz_heads + l * sp->n_heads, sp->n_heads, tau);
        chain_softmax(d->p_ffn + l * sp->n_ffn, global_axis(sp, 2, l) ? ge : d->g_ffn + l * sp->n_ffn,
                      gz_ffn + l * sp->n_ffn, sp->n_ffn, tau);
        if (sp->depth)
            chain_softmax(d->p_keep + l * 2, d->g_keep + l * 2, gz_keep + l * 2, 2, tau);
        else
            gz_keep[l * 2] = gz_keep[l * 2 + 1] = 0;
    }
}

static int argmax_allowed(const double *z, int n, const unsigned char *ok)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if ((!ok || ok[i]) && (best < 0 || z[i] > z[best]))
            best = i;
    return best < 0 ? 0 : best;
}

void search_decode_argmax(const search_dist *d, search_choice *c)
{
    const search_space *sp = d->sp;
    c->hidden = argmax_allowed(d->logit_hidden, sp->n_hidden, NULL);
    for (int l = 0; l < sp->n_layers; l++) {
        c->heads[l] = argmax_allowed(d->logit_heads + l * sp->n_heads, sp->n_heads,
                                     sp->allowed_heads ? sp->allowed_heads + l * sp->n_heads : NULL);
        c->ffn[l] = argmax_allowed(d->logit_ffn + l * sp->n_ffn, sp->n_ffn,
                                   sp->allowed_ffn ? sp->allowed_ffn + l * sp->n_ffn : NULL);
        c->keep[l] = sp->depth ? d->logit_keep[l * 2 + 1] >= d->logit_keep[l * 2] : 1;
    }
}

void search_choice_cheapest(const search_space *sp, search_choice *c)
{
    c->hidden = 0;
    for (int l = 0; l < sp->n_layers; l++) {
        c->heads[l] = c->ffn[l] = sp->n_heads + sp->n_ffn;   /* sentinel, replaced below */
        for (int k = 0; k < sp->n_heads; k++)
            if (allowed_head(sp, l, k)) { c->heads[l] = k; break; }
        for (int j = 0; j < sp->n_ffn; j++)
            if (allowed_ffn(sp, l, j)) { c->ffn[l] = j; break; }
        c->keep[l] = !sp->depth;
    }
}

void search_choice_parent(const search_space *sp, search_choice *c)
{
    c->hidden = sp->n_hidden - 1;
    for (int l = 0; l < sp->n_layers; l++) {
        for (int k = sp->n_heads - 1; k >= 0; k--)
            if (allowed_head(sp, l, k)) { c->heads[l] = k; break; }
        for (int j = sp->n_ffn - 1; j >= 0; j--)
            if (allowed_ffn(sp, l, j)) { c->ffn[l] = j; break; }
        c->keep[l] = 1;
    }
}

/* One move of the repair: which axis, which layer, the new index. */
typedef struct {
    int axis;   /* 0 hidden, 1 heads, 2 ffn, 3 keep */
    int layer, to;
} move;

static int *move_slot(search_choice *c, const move *mv)
{
    switch (mv->axis) {
    case 0: return &c->hidden;
    case 1: return &c->heads[mv->layer];
    case 2: return &c->ffn[mv->layer];
    default: return &c->keep[mv->layer];
    }
}

/* Set the move's slot to v; a global axis sets every layer of its kind (the Mamba layers'
 * heads, the tied MoE layers' expert counts). */
static void move_set(const search_space *sp, search_choice *c, const move *mv, int v)
{
    if ((mv->axis == 1 || mv->axis == 2) && global_axis(sp, mv->axis, mv->layer)) {
        for (int l = 0; l < sp->n_layers; l++)
            if (global_axis(sp, mv->axis, l))
                *(mv->axis == 1 ? &c->heads[l] : &c->ffn[l]) = v;
        return;
    }
    *move_slot(c, mv) = v;
}

static double move_score(const search_dist *d, const search_choice *c, const move *mv)
{
    const search_space *sp = d->sp;
    switch (mv->axis) {
    case 0: return d->logit_hidden[mv->to] - d->logit_hidden[c->hidden];
    case 1: return d->logit_heads[mv->layer * sp->n_heads + mv->to] - d->logit_heads[mv->layer * sp->n_heads + c->heads[mv->layer]];
    case 2: return d->logit_ffn[mv->layer * sp->n_ffn + mv->to] - d->logit_ffn[mv->layer * sp->n_ffn + c->ffn[mv->layer]];
    default: return d->logit_keep[mv->layer * 2 + mv->to] - d->logit_keep[mv->layer * 2 + c->keep[mv->layer]];
    }
}

/* Neighbouring allowed index in direction dir (-1 smaller, +1 larger), or -1. */
static int next_index(const search_space *sp, int axis, int l, int from, int dir)
{
    if (axis == 0) {
        int to = from + dir;
        return (to >= 0 && to < sp->n_hidden) ? to : -1;
    }
    if (axis == 3) {
        int to = from + dir;
        return (sp->depth && to >= 0 && to <= 1) ? to : -1;
    }
    int n = axis == 1 ? sp->n_heads : sp->n_ffn;
    for (int to = from + dir; to >= 0 && to < n; to += dir)
        if (axis == 1 ? allowed_head(sp, l, to) : allowed_ffn(sp, l, to))
            return to;
    return -1;
}

static int feasible(const search_space *sp, const search_costs *costs, const search_choice *c, double *viol)
{
    int ok = 1;
    if (viol)
        *viol = 0;
    for (int m = 0; m < SM_COUNT; m++) {
        const search_table *t = &costs->t[m];
        if (!t->active)
            continue;
        double v = search_choice_cost(sp, t, c);
        if (v > t->limit) {
            ok = 0;
            if (viol)
                *viol += (v - t->limit) / t->limit;
        }
    }
    return ok;
}

/* Normalized cost summed over active limits (only violated ones when only_violated). */
static double norm_cost(const search_space *sp, const search_costs *costs, const search_choice *c, int only_violated)
{
    double s = 0;
    for (int m = 0; m < SM_COUNT; m++) {
        const search_table *t = &costs->t[m];
        if (!t->active)
            continue;
        double v = search_choice_cost(sp, t, c);
        if (!only_violated || v > t->limit)
            s += v / t->limit;
    }
    return s;
}

int search_choice_cheapest_layer(const search_space *sp, const search_costs *costs, search_choice *c)
{
    search_choice_cheapest(sp, c);
    for (int l = 0; l < sp->n_layers; l++)
        if (c->keep[l] && (search_mixer_size(sp, l, c->heads[l]) > 0 || search_mlp_size(sp, l, c->ffn[l]) > 0))
            return 0;
    /* every kept layer is empty (or depth removed them all): the one layer, at its smallest
     * non-empty mixer or MLP, that adds the least (summed over the limits, each relative
     * to its limit) */
    int best_l = -1, best_h = 0, best_f = 0;
    double best = INFINITY;
    for (int l = 0; l < sp->n_layers; l++) {
        int k0 = c->heads[l], j0 = c->ffn[l], keep0 = c->keep[l];
        for (int part = 0; part < 2; part++) {
            int n = part ? sp->n_ffn : sp->n_heads, pick = -1;
            if (global_axis(sp, part ? 2 : 1, l)) {
                /* a global axis (Mamba heads, tied expert counts) moves for all its layers at
                 * once: the layer keeps the axis's cheapest choice, when that has something */
                int cur = part ? j0 : k0;
                if ((part ? search_mlp_size(sp, l, cur) : search_mixer_size(sp, l, cur)) > 0)
                    pick = cur;
            }
            for (int i = 0; i < n && pick < 0 && !global_axis(sp, part ? 2 : 1, l); i++)
                if (part ? allowed_ffn(sp, l, i) && search_mlp_size(sp, l, i) > 0
                         : allowed_head(sp, l, i) && search_mixer_size(sp, l, i) > 0)
                    pick = i;
            if (pick < 0)
                continue;
            c->keep[l] = 1;
            c->heads[l] = part ? k0 : pick;
            c->ffn[l] = part ? pick : j0;
            double v = norm_cost(sp, costs, c, 0);
            if (v < best) {
                best = v, best_l = l, best_h = c->heads[l], best_f = c->ffn[l];
            }
            c->heads[l] = k0, c->ffn[l] = j0, c->keep[l] = keep0;
        }
    }
    if (best_l < 0)
        return -1;
    c->keep[best_l] = 1;
    c->heads[best_l] = best_h;
    c->ffn[best_l] = best_f;
    return 0;
}

/* Step *mv to the next move of one allowed index in direction dir (-1 smaller, +1 larger)
 * from c: the hidden size, then each kept layer's heads, then each kept layer's FFN
 * width, then each layer's keep flag. Start from {0, -1, 0}. 1, or 0 when none is left. */
static int next_move(const search_space *sp, search_choice *c, int dir, move *mv)
{
    for (;;) {
        if (++mv->layer >= (mv->axis == 0 ? 1 : sp->n_layers)) {
            if (++mv->axis == 4)
                return 0;
            mv->layer = -1;
            continue;
        }
        if ((mv->axis == 1 || mv->axis == 2) && tied(sp, mv->axis, mv->layer))
            continue;   /* a global axis moves at its first layer */
        if ((mv->axis == 1 || mv->axis == 2) && !c->keep[mv->layer] && !global_axis(sp, mv->axis, mv->layer))
            continue;
        mv->to = next_index(sp, mv->axis, mv->layer, *move_slot(c, mv), dir);
        if (mv->to >= 0)
            return 1;
    }
}

int search_repair(const search_dist *d, const search_costs *costs, search_choice *c)
{
    const search_space *sp = d->sp;
    /* Shrink until feasible. */
    for (;;) {
        if (feasible(sp, costs, c, NULL))
            break;
        double base = norm_cost(sp, costs, c, 1), best_ratio = INFINITY;
        move best = {-1, 0, 0};
        for (move mv = {0, -1, 0}; next_move(sp, c, -1, &mv);) {
            /* every smaller size of the axis, not only the next: a cost that is not monotone
               in the size (measured tables; an expert count's latency) must not stop the repair */
            for (move to = mv; to.to >= 0; to.to = to.axis == 3 ? -1 : next_index(sp, to.axis, to.layer, to.to, -1)) {
                int from = *move_slot(c, &to);
                double loss = -move_score(d, c, &to);
                move_set(sp, c, &to, to.to);
                double saved = base - norm_cost(sp, costs, c, 1);
                move_set(sp, c, &to, from);
                if (saved <= 1e-12)
                    continue;
                double ratio = loss / saved;
                if (ratio < best_ratio) {
                    best_ratio = ratio;
                    best = to;
                }
            }
        }
        if (best.axis < 0) {
            /* No single move saves (a smaller hidden size can price the kept layers
             * higher than a larger one, a layer measured at 0 saves nothing removed):
             * the cheapest choice, when it meets the limits, is where growing starts. */
            search_choice_cheapest(sp, c);
            if (!feasible(sp, costs, c, NULL))
                return -1;
            break;
        }
        move_set(sp, c, &best, best.to);
    }
    /* Grow while some step keeps every limit. */
    for (;;) {
        double base = norm_cost(sp, costs, c, 0), best_ratio = -INFINITY;
        move best = {-1, 0, 0};
        for (move mv = {0, -1, 0}; next_move(sp, c, +1, &mv);) {
            int l = mv.layer, from = *move_slot(c, &mv);
            double gain = move_score(d, c, &mv);
            /* A layer comes back at its smallest allowed widths (at a global axis's count
               where it has one); later steps widen it. */
            int sh = mv.axis == 3 ? c->heads[l] : 0, sf = mv.axis == 3 ? c->ffn[l] : 0;
            if (mv.axis == 3) {
                if (!global_axis(sp, 1, l))
                    c->heads[l] = next_index(sp, 1, l, -1, +1);
                if (!global_axis(sp, 2, l))
                    c->ffn[l] = next_index(sp, 2, l, -1, +1);
            }
            move_set(sp, c, &mv, mv.to);
            int ok = feasible(sp, costs, c, NULL);
            double added = norm_cost(sp, costs, c, 0) - base;
            move_set(sp, c, &mv, from);
            if (mv.axis == 3) {
                c->heads[l] = sh;
                c->ffn[l] = sf;
            }
            if (!ok)
                continue;
            double ratio = added > 1e-12 ? gain / added : INFINITY;
            if (ratio > best_ratio) {
                best_ratio = ratio;
                best = mv;
            }
        }
        if (best.axis < 0)
            break;
        if (best.axis == 3) {
            if (!global_axis(sp, 1, best.layer))
                c->heads[best.layer] = next_index(sp, 1, best.layer, -1, +1);
            if (!global_axis(sp, 2, best.layer))
                c->ffn[best.layer] = next_index(sp, 2, best.layer, -1, +1);
        }
        move_set(sp, c, &best, best.to);
    }
    return 0;
}

int search_mlp_size(const search_space *sp, int l, int j)
{
    if (sp->moe && sp->moe[l])
        return j < sp->n_exp ? sp->exp[j] : -1;
    return j < sp->n_ffn ? sp->ffn[j] : -1;
}

int search_mlp_width(const search_space *sp, int l, int j)
{
    return sp->moe && sp->moe[l] && j >= 0 && j < sp->n_exp ? sp->expw[j] : 0;
}

int search_mlp_shared(const search_space *sp, int l, int j)
{
    return sp->moe && sp->moe[l] && j >= 0 && j < sp->n_exp ? sp->shw[j] : 0;
}

int search_mixer_size(const search_space *sp, int l, int k)
{
    if (sp->mamba && sp->mamba[l])
        return k < sp->n_mam ? sp->mam[k] : -1;
    return k < sp->n_heads ? sp->heads[k] : -1;
}

int search_choice_arch(const search_space *sp, const search_choice *c, const arch *parent, arch *out)
{
    int kept = 0;
    for (int l = 0; l < sp->n_layers; l++)
        if (c->keep[l] && (search_mixer_size(sp, l, c->heads[l]) > 0 || search_mlp_size(sp, l, c->ffn[l]) > 0))
            kept++;
    arch tmp = *parent;
    tmp.layers = NULL;
    tmp.n_layers = 0;
    if (arch_init(out, kept) != 0)
        return -1;
    arch_layer *layers = out->layers;
    *out = tmp;
    out->layers = layers;
    out->n_layers = kept;
    out->hidden_size = sp->hidden[c->hidden];
    int latent = sp->lat[c->hidden];
    int i = 0;
    for (int l = 0; l < sp->n_layers; l++) {
        int h = search_mixer_size(sp, l, c->heads[l]), f = search_mlp_size(sp, l, c->ffn[l]);
        if (!c->keep[l] || (h <= 0 && f <= 0))
            continue;
        arch_layer *o = &out->layers[i++];
        memset(o, 0, sizeof *o);
        o->source_layer = parent->layers[l].source_layer;
        if (sp->mamba && sp->mamba[l]) {
            if (h > 0) {
                o->mamba = parent->layers[l].mamba;
                o->mamba.n_heads = h;
            }
        } else {
            o->n_heads = h > 0 ? h : 0;
            o->n_kv_heads = h > 0 ? h / sp->group : 0;
        }
        if (sp->moe && sp->moe[l]) {
            int w = search_mlp_width(sp, l, c->ffn[l]), s = search_mlp_shared(sp, l, c->ffn[l]);
            if (f > 0)
                o->moe = arch_moe_keep(&parent->layers[l].moe, f);
            if (f > 0 && w > 0)
                o->moe.expert_ffn_dim = w;
            if (f > 0 && s > 0)
                o->moe.shared_ffn_dim = s;
            if (f > 0 && latent > 0 && o->moe.latent_dim)
                o->moe.latent_dim = latent;
        } else {
            o->ffn_dim = f > 0 ? f : 0;
        }
    }
    return 0;
}
