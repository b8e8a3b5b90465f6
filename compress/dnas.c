/* compress/dnas.c — the supernet loop of the AutoCompress search: Gumbel-softmax
 * samples of the axis logits become soft prefix masks on the ranked parent, KD against
 * the unmasked parent plus the two-sided cost penalty give logit gradients, Adam moves
 * the logits, and the argmax is repaired against the cost tables at the end.
 * Weights stay the parent's during the search (no joint weight update).
 */
#include "compress/dnas.h"
#include "engine/clock.h"
#include "engine/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void dnas_opts_defaults(dnas_opts *o)
{
    memset(o, 0, sizeof *o);
    o->batch = 4;
    o->seq = 128;
    o->tau0 = 1.0;
    o->tau_min = 0.1;
    o->lr = 0.1;
    o->eta = 0.3;
    o->lambda2_init = 3.0;
    o->warmup_frac = 0.1;
    o->seed = ENG_DEFAULT_SEED;
}

void dnas_result_free(dnas_result *r)
{
    arch_free(&r->arch);
    json_decref(r->distribution);
    memset(r, 0, sizeof *r);
}

/* Offsets of the mask arrays inside the masks block (device pointers on any backend). */
typedef struct {
    size_t hidden, *head, *ffn, *exp, *sh, *lat, attn_gate, mlp_gate;
} mask_offsets;

static int mask_offsets_init(const eng_model *m, mask_offsets *o)
{
    const eng_masks *k = m->masks;
    int L = m->a.n_layers;
    o->head = calloc((size_t)L * 5, sizeof(size_t));
    if (!o->head)
        return -1;
    o->ffn = o->head + L;
    o->exp = o->head + 2 * L;
    o->sh = o->head + 3 * L;
    o->lat = o->head + 4 * L;
    o->hidden = (size_t)(k->hidden - k->block);
    o->attn_gate = (size_t)(k->attn_gate - k->block);
    o->mlp_gate = (size_t)(k->mlp_gate - k->block);
    for (int l = 0; l < L; l++) {
        o->head[l] = k->head[l] ? (size_t)(k->head[l] - k->block) : (size_t)-1;
        o->ffn[l] = k->ffn[l] ? (size_t)(k->ffn[l] - k->block) : (size_t)-1;
        o->exp[l] = k->expert[l] ? (size_t)(k->expert[l] - k->block) : (size_t)-1;
        o->sh[l] = k->shared[l] ? (size_t)(k->shared[l] - k->block) : (size_t)-1;
        o->lat[l] = k->latent[l] ? (size_t)(k->latent[l] - k->block) : (size_t)-1;
    }
    return 0;
}

/* The routing groups whose experts a layer keeps as many of (grouped routing), else 1; a layer
 * without experts: 1. */
static int moe_groups(const arch_layer *l)
{
    return l->moe.n_experts && arch_moe_grouped(&l->moe) ? l->moe.n_group : 1;
}

/* The routed experts' width of MoE choice k in parent layer pl. */
static int moe_width(const search_space *sp, const arch_layer *pl, int k)
{
    return sp->expw[k] ? sp->expw[k] : pl->moe.expert_ffn_dim;
}

/* The shared expert's width of MoE choice k in parent layer pl (0 when the choice removes the MLP). */
static int moe_shared(const search_space *sp, const arch_layer *pl, int k)
{
    return !sp->exp[k] ? 0 : sp->shw[k] ? sp->shw[k] : pl->moe.shared_ffn_dim;
}

/* The latent of hidden choice h in parent layer pl (a LatentMoE layer). */
static int moe_latent(const search_space *sp, const arch_layer *pl, int h)
{
    return sp->lat[h] ? sp->lat[h] : pl->moe.latent_dim;
}

/* Soft prefix masks from the probabilities: unit j kept with P(size > j). */
static void fill_masks(const search_dist *d, const eng_model *m, const mask_offsets *o, float *host)
{
    const search_space *sp = d->sp;
    int C = m->a.hidden_size;
    for (int c = 0; c < C; c++) {
        double v = 0;
        for (int h = 0; h < sp->n_hidden; h++)
            if (sp->hidden[h] > c)
                v += d->p_hidden[h];
        host[o->hidden + c] = (float)v;
    }
    /* RMSNorm keeps dividing by C: the masked stream is the student whose norm gains pruning
       scales by sqrt(C/C') (prune_gather) */
    m->masks->hidden_count = (float)C;
    for (int l = 0; l < sp->n_layers; l++) {
        const arch_layer *pl = &m->a.layers[l];
        if (o->head[l] != (size_t)-1 && sp->mamba && sp->mamba[l]) {
            /* ranked inside their group: head h is position h % per of its group, kept with
               P(count / groups > position) */
            int G = pl->mamba.n_groups, per = pl->mamba.n_heads / G;
            for (int q = 0; q < pl->mamba.n_heads; q++) {
                double v = 0;
                for (int k = 0; k < sp->n_mam; k++)
                    if (sp->mam[k] / G > q % per)
                        v += d->p_heads[l * sp->n_heads + k];
                host[o->head[l] + q] = (float)v;
            }
        } else if (o->head[l] != (size_t)-1) {
            for (int q = 0; q < pl->n_heads; q++) {
                double v = 0;
                for (int k = 0; k < sp->n_heads; k++)
                    if (sp->heads[k] > q)
                        v += d->p_heads[l * sp->n_heads + k];
                host[o->head[l] + q] = (float)v;
            }
        }
        if (o->ffn[l] != (size_t)-1 && pl->ffn_dim)
            for (int j = 0; j < pl->ffn_dim; j++) {
                double v = 0;
                for (int k = 0; k < sp->n_ffn; k++)
                    if (sp->ffn[k] > j)
                        v += d->p_ffn[l * sp->n_ffn + k];
                host[o->ffn[l] + j] = (float)v;
            }
        /* the routed experts' units (each expert ranked by its own order): unit j kept with
           P(width > j); the removed MoE's choice leaves them to the expert masks */
        for (int j = 0; o->ffn[l] != (size_t)-1 && !pl->ffn_dim && j < pl->moe.expert_ffn_dim; j++) {
            double v = 0;
            for (int k = 0; k < sp->n_exp; k++)
                if (!sp->exp[k] || moe_width(sp, pl, k) > j)
                    v += d->p_ffn[l * sp->n_ffn + k];
            host[o->ffn[l] + j] = (float)v;
        }
        /* ranked experts: expert e kept with P(count > e); with grouped routing the j-th of each
           group with P(count / groups > j) (ranked inside their groups, pruned as many per group) */
        for (int e = 0, G = moe_groups(pl), per = pl->moe.n_experts / G; o->exp[l] != (size_t)-1 &&
                                                                         e < pl->moe.n_experts; e++) {
            double v = 0;
            for (int k = 0; k < sp->n_exp; k++)
                if (sp->exp[k] / G > e % per)
                    v += d->p_ffn[l * sp->n_ffn + k];
            host[o->exp[l] + e] = (float)v;
        }
        /* the shared expert's units (ranked): unit j kept with P(shared width > j); a removed MLP
           removes it too */
        for (int j = 0; o->sh[l] != (size_t)-1 && j < pl->moe.shared_ffn_dim; j++) {
            double v = 0;
            for (int k = 0; k < sp->n_exp; k++)
                if (moe_shared(sp, pl, k) > j)
                    v += d->p_ffn[l * sp->n_ffn + k];
            host[o->sh[l] + j] = (float)v;
        }
        /* the latent's channels (ranked), on the hidden axis: channel j kept with P(latent > j) */
        for (int j = 0; o->lat[l] != (size_t)-1 && j < pl->moe.latent_dim; j++) {
            double v = 0;
            for (int h = 0; h < sp->n_hidden; h++)
                if (moe_latent(sp, pl, h) > j)
                    v += d->p_hidden[h];
            host[o->lat[l] + j] = (float)v;
        }
        host[o->attn_gate + l] = (float)d->p_keep[l * 2 + 1];
        host[o->mlp_gate + l] = (float)d->p_keep[l * 2 + 1];
    }
}

/* Chain mask gradients into probability gradients: dL/dp_k = sum_{j < size_k} dL/dm_j. */
static void masks_to_pgrad(search_dist *d, const eng_model *m, const mask_offsets *o, const float *g)
{
    const search_space *sp = d->sp;
    int C = m->a.hidden_size;
    double *cum = malloc(((size_t)C + 1) * sizeof *cum);
    if (!cum)
        return;
    cum[0] = 0;
    for (int c = 0; c < C; c++)
        cum[c + 1] = cum[c] + g[o->hidden + c];
    for (int h = 0; h < sp->n_hidden; h++)
        d->g_hidden[h] += cum[sp->hidden[h] > C ? C : sp->hidden[h]];
    free(cum);
    for (int l = 0; l < sp->n_layers; l++) {
        const arch_layer *pl = &m->a.layers[l];
        if (o->head[l] != (size_t)-1 && sp->mamba && sp->mamba[l]) {
            int G = pl->mamba.n_groups, per = pl->mamba.n_heads / G;
            for (int k = 0; k < sp->n_mam; k++) {
                double s = 0;
                for (int q = 0; q < pl->mamba.n_heads; q++)
                    if (q % per < sp->mam[k] / G)
                        s += g[o->head[l] + q];
                d->g_heads[l * sp->n_heads + k] += s;
            }
        } else if (o->head[l] != (size_t)-1) {
            for (int k = 0; k < sp->n_heads; k++) {
                double s = 0;
                for (int q = 0; q < sp->heads[k] && q < pl->n_heads; q++)
                    s += g[o->head[l] + q];
                d->g_heads[l * sp->n_heads + k] += s;
            }
        }
        if (o->ffn[l] != (size_t)-1 && pl->ffn_dim)
            for (int k = 0; k < sp->n_ffn; k++) {
                double s = 0;
                for (int j = 0; j < sp->ffn[k] && j < pl->ffn_dim; j++)
                    s += g[o->ffn[l] + j];
                d->g_ffn[l * sp->n_ffn + k] += s;
            }
        for (int k = 0; o->ffn[l] != (size_t)-1 && !pl->ffn_dim && k < sp->n_exp; k++) {
            double s = 0;
            for (int j = 0, w = sp->exp[k] ? moe_width(sp, pl, k) : pl->moe.expert_ffn_dim; j < w; j++)
                s += g[o->ffn[l] + j];
            d->g_ffn[l * sp->n_ffn + k] += s;
        }
        for (int k = 0, G = moe_groups(pl), per = pl->moe.n_experts / G; o->exp[l] != (size_t)-1 && k < sp->n_exp;
             k++) {
            double s = 0;
            for (int e = 0; e < pl->moe.n_experts; e++)
                if (e % per < sp->exp[k] / G)
                    s += g[o->exp[l] + e];
            d->g_ffn[l * sp->n_ffn + k] += s;
        }
        for (int k = 0; o->sh[l] != (size_t)-1 && k < sp->n_exp; k++) {
            double s = 0;
            for (int j = 0, w = moe_shared(sp, pl, k); j < w; j++)
                s += g[o->sh[l] + j];
            d->g_ffn[l * sp->n_ffn + k] += s;
        }
        for (int h = 0; o->lat[l] != (size_t)-1 && h < sp->n_hidden; h++) {
            double s = 0;
            for (int j = 0, w = moe_latent(sp, pl, h); j < w; j++)
                s += g[o->lat[l] + j];
            d->g_hidden[h] += s;
        }
        if (sp->depth)
            d->g_keep[l * 2 + 1] += g[o->attn_gate + l] + g[o->mlp_gate + l];
    }
}

/* widths, shared: an MoE layer's expert and shared-expert widths beside its counts (NULL
 * elsewhere; 0: its own); latent: the hidden axis's latents (NULL without; 0: the parent's). */
static json_t *probs_json(const double *p, const int *sizes, const int *widths, const int *shared, const int *latent,
                          int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        if (sizes[i] < 0)   /* an MLP axis longer than this layer's list */
            continue;
        json_t *o = json_pack("{s:i,s:f}", "size", sizes[i], "p", p[i]);
        if (!o || (widths && widths[i] && json_object_set_new(o, "width", json_integer(widths[i]))) ||
            (shared && shared[i] && json_object_set_new(o, "shared_width", json_integer(shared[i]))) ||
            (latent && latent[i] && json_object_set_new(o, "latent_dim", json_integer(latent[i])))) {
            json_decref(o);
            json_decref(a);
            return NULL;
        }
        if (json_array_append_new(a, o)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* The final probabilities per axis, as the search document's "distribution": new
 * reference, NULL on OOM. */
static json_t *distribution_json(const search_dist *d)
{
    const search_space *sp = d->sp;
    json_t *layers = json_array();
    for (int l = 0; layers && l < sp->n_layers; l++) {
        int mam = sp->mamba && sp->mamba[l], moe = sp->moe && sp->moe[l];
        /* json_pack steals both axes, and fails when either is NULL */
        json_t *layer = json_pack("{s:i,s:o,s:o,s:f}", "layer", l, mam ? "mamba_heads" : "heads",
                                  probs_json(d->p_heads + l * sp->n_heads, mam ? sp->mam : sp->heads, NULL, NULL, NULL,
                                             mam ? sp->n_mam : sp->n_heads),
                                  moe ? "experts" : "ffn",
                                  probs_json(d->p_ffn + l * sp->n_ffn, moe ? sp->exp : sp->ffn, moe ? sp->expw : NULL,
                                             moe ? sp->shw : NULL, NULL, moe ? sp->n_exp : sp->n_ffn),
                                  "keep", d->p_keep[l * 2 + 1]);
        if (!layer || json_array_append_new(layers, layer)) {
            json_decref(layers);
            return NULL;
        }
    }
    return json_pack("{s:o,s:o}", "hidden", probs_json(d->p_hidden, sp->hidden, NULL, NULL, sp->lat, sp->n_hidden), "layers",
                     layers);
}

/* Over which limits do the costs x (latency, decode, bytes, params) go? Each one's table
 * limit is tightened by the excess times `more` (< 1, so that the repair moves). 1 when
 * every active limit holds. */
static int within(search_costs *costs, const double *limits, const double *x, double more)
{
    int ok = 1;
    for (int m = 0; m < SM_COUNT; m++) {
        search_table *t = &costs->t[m];
        if (t->active && x[m] > limits[m]) {
            ok = 0;
            t->limit *= limits[m] / x[m] * more;
        }
    }
    return ok;
}

/* The result becomes *best, the last arch a check measured within every limit (moved). */
static void take_best(dnas_result *r, arch *best, const cm_prediction *pred)
{
    arch_free(&r->arch);
    r->arch = *best;
    r->predicted = *pred;
    memset(best, 0, sizeof *best);
    r->checked_within = 1;
}

/* The share of a served limit a check's measurement may reach and hold: timings carry the
 * serving's noise, so they must come in 1% under; memory and parameters are read without it
 * (the built-in engine's byte accounting, which the measure stage reproduces; llama.cpp's
 * buffers; a count), and the served memory limit already takes memory's own error off
 * (method_served_limits). */
static double served_slack(int k)
{
    return k == SM_MEMORY || k == SM_PARAMS ? 1.0 : 0.99;
}

/* Decode argmax, repair against the tables, and confirm with the full prediction; when
 * the prediction disagrees with the additive tables (it adds terms the tables cannot
 * split), tighten that limit by the disagreement and repair again. With a check, the
 * arch the prediction accepts is then served (o->check) and judged against the served
 * limits (o->served_limits, else the search's): measured over one, the target is
 * tightened to the served arch's prediction less the measured excess and the arch
 * repaired again; measured within with
 * room left and a check to spare, the target is loosened by the room (the search's aim
 * carries the prediction's margin, which a measurement no longer needs) and the larger
 * arch served in turn, the last arch served within being kept should it not hold. After
 * DNAS_CHECKS checks the last arch served within (or, none being, the prediction) decides. */
static int decode_and_repair(const search_dist *d, search_costs *costs, const dnas_opts *o, const arch *parent,
                             dnas_result *r, char *err, size_t errlen)
{
    const search_space *sp = d->sp;
    search_choice c;
    if (search_choice_init(&c, sp) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    double limits[SM_COUNT], target[SM_COUNT], served_lim[SM_COUNT];
    for (int m = 0; m < SM_COUNT; m++) {
        limits[m] = target[m] = costs->t[m].limit;
        served_lim[m] = limits[m];
    }
    if (o->served_limits.latency_ms > 0)
        served_lim[SM_LATENCY] = o->served_limits.latency_ms;
    if (o->served_limits.throughput_tps > 0)   /* the decode table is in ms: the floor's ceiling */
        served_lim[SM_DECODE] = limits[SM_DECODE] * o->limits.throughput_tps / o->served_limits.throughput_tps;
    if (o->served_limits.memory_bytes > 0)
        served_lim[SM_MEMORY] = o->served_limits.memory_bytes;
    int rc = -1;
    arch served, best;          /* the last arch a check served; the last one served within */
    cm_prediction served_pred, best_pred;
    memset(&served, 0, sizeof served);
    memset(&best, 0, sizeof best);
    for (int attempt = 0; attempt < 8 + 3 * DNAS_CHECKS; attempt++) {
        search_decode_argmax(d, &c);
        int bad = search_repair(d, costs, &c) != 0, repaired = !bad;
        if (!bad) {
            arch_free(&r->arch);
            bad = search_choice_arch(sp, &c, parent, &r->arch) != 0 ||
                  cm_predict(o->tables, &r->arch, &r->predicted, err, errlen) != 0 ? -1 : r->arch.n_layers < 1;
        }
        /* A target tightened by the checks until no arch of the space (or none with a layer
         * left) meets it: the space cannot hold the limit as served. The last arch served
         * within, else the last served, is returned (checked_within 0 for the latter; the
         * measure stage reports it). */
        if (bad && r->checks > 0) {
            arch_free(&r->arch);
            r->checked_within = best.layers != NULL;
            r->arch = best.layers ? best : served;
            r->predicted = best.layers ? best_pred : served_pred;
            memset(best.layers ? &best : &served, 0, sizeof served);
            err[0] = 0;
            rc = 0;
            break;
        }
        if (bad) {
            if (bad > 0 && !repaired)
                dnas_describe_infeasible(sp, costs, err, errlen);
            else if (bad > 0)
                snprintf(err, errlen, "no architecture that keeps a layer meets the limits");
            break;
        }
        double actual[SM_COUNT] = {r->predicted.latency_ms, r->predicted.decode_ms, (double)r->predicted.total,
                                   (double)r->predicted.params};
        if (!within(costs, target, actual, 0.999))
            continue;
        if (best.layers && arch_equal(&r->arch, &best)) {   /* loosened, and nothing larger fits */
            take_best(r, &best, &best_pred);
            rc = 0;
            break;
        }
        if (!o->check || r->checks >= DNAS_CHECKS) {
            if (best.layers)   /* the checks are spent: what was served within decides */
                take_best(r, &best, &best_pred);
            rc = 0;
            break;
        }
        cm_prediction m;
        if (o->check(o->check_ud, &r->arch, &r->predicted, &m, err, errlen))
            break;
        r->checks++;
        arch_free(&served);
        if (arch_copy(&served, &r->arch)) {
            snprintf(err, errlen, "out of memory");
            break;
        }
        served_pred = r->predicted;
        double measured[SM_COUNT] = {m.latency_ms, m.decode_ms, (double)m.total, (double)m.params};
        int ok = 1, room = 0;
        for (int k = 0; k < SM_COUNT; k++)
            if (costs->t[k].active && measured[k] > served_lim[k] * served_slack(k))
                ok = 0;
        if (!ok) {   /* tighten the target (and the tables' limit) by the measured excess */
            for (int k = 0; k < SM_COUNT; k++)
                if (costs->t[k].active && measured[k] > served_lim[k] * served_slack(k)) {
                    /* to the served arch's own prediction times the excess: the space is
                     * discrete, so the arch may sit well under the target, and the target
                     * times the excess could let the next arch measure over again */
                    double f = served_lim[k] / measured[k] * 0.99;
                    double to = actual[k] > 0 && actual[k] < target[k] ? actual[k] * f : target[k] * f;
                    costs->t[k].limit *= to / target[k];
                    target[k] = to;
                }
            r->checked_within = 0;
            continue;
        }
        r->checked_within = 1;
        arch_free(&best);
        if (arch_copy(&best, &served)) {
            snprintf(err, errlen, "out of memory");
            break;
        }
        best_pred = served_pred;
        /* within: loosen by the room a measured limit leaves (3% or more), while a check
           remains to serve the larger arch */
        for (int k = 0; r->checks < DNAS_CHECKS && k < SM_COUNT; k++)
            if (costs->t[k].active && k != SM_PARAMS && measured[k] > 0 && measured[k] < served_lim[k] * 0.97) {
                double f = served_lim[k] / measured[k] * 0.99;
                target[k] *= f;
                costs->t[k].limit *= f;
                room = 1;
            }
        if (!room) {
            take_best(r, &best, &best_pred);
            rc = 0;
            break;
        }
    }
    if (rc != 0 && !err[0])
        snprintf(err, errlen, "the repaired architecture still violates a limit under the full prediction");
    arch_free(&served);
    arch_free(&best);
    for (int m = 0; m < SM_COUNT; m++)
        costs->t[m].limit = limits[m];
    search_choice_free(&c);
    return rc;
}

/* 1 (r filled) when the parent itself meets every limit, 0 when not, -1 on error. */
static int parent_feasible(const dnas_opts *o, const search_costs *costs, dnas_result *r, char *err, size_t errlen)
{
    const arch *pa = &o->parent->a;
    cm_prediction pp;
    if (cm_predict(o->tables, pa, &pp, err, errlen) != 0)
        return -1;
    double actual[SM_COUNT] = {pp.latency_ms, pp.decode_ms, (double)pp.total, (double)pp.params};
    for (int m = 0; m < SM_COUNT; m++)
        if (costs->t[m].active && actual[m] > costs->t[m].limit)
            return 0;
    if (arch_copy(&r->arch, pa) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    r->predicted = pp;
    r->parent_feasible = 1;
    r->distribution = json_object();
    return 1;
}

/* 0 when the cheapest choice of the space meets every limit; else -1 with err naming
 * the cheapest costs (a limit no arch of the space can meet). */
static int cheapest_feasible(const search_space *sp, const search_costs *costs, char *err, size_t errlen)
{
    search_choice c;
    if (search_choice_init(&c, sp) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int bad = search_choice_cheapest_layer(sp, costs, &c) != 0;
    for (int m = 0; m < SM_COUNT; m++)
        if (costs->t[m].active && search_choice_cost(sp, &costs->t[m], &c) > costs->t[m].limit)
            bad = 1;
    search_choice_free(&c);
    if (bad)
        dnas_describe_infeasible(sp, costs, err, errlen);
    return bad ? -1 : 0;
}

/* The relaxed search's working set: the masked student, the distribution over choices,
 * host copies of masks and their gradients, Adam's moments on the logits. */
typedef struct {
    search_space sp;
    search_costs costs;
    eng_model student;
    search_dist d;
    mask_offsets mo;
    float *mhost, *ghost;
    double *adam;                /* [3 * nlog]: first and second moments, then the gradient */
    size_t nmask, nlog;
    int *tokens, *targets;
    search_penalty pen;
} dnas_work;

static void work_free(dnas_work *w)
{
    free(w->mo.head);
    free(w->mhost);
    free(w->ghost);
    free(w->adam);
    free(w->tokens);
    search_dist_free(&w->d);
    if (w->student.be)
        eng_model_free(&w->student);
    dnas_space_free(&w->sp, &w->costs);
}

/* The student (a copy of the parent with masks on), the distribution and buffers. */
static int work_init(const dnas_opts *o, dnas_work *w, char *err, size_t errlen)
{
    const arch *pa = &o->parent->a;
    eng_backend *be = o->parent->be;
    if (eng_model_init(&w->student, pa, be, err, errlen) != 0)
        return -1;
    be->copy(be, w->student.params, o->parent->params, o->parent->n_params * sizeof(float));
    if (eng_model_enable_masks(&w->student) != 0 || mask_offsets_init(&w->student, &w->mo) != 0 ||
        search_dist_init(&w->d, &w->sp, 0.5) != 0) {
        snprintf(err, errlen, "out of memory enabling the search masks");
        return -1;
    }
    w->nmask = w->student.masks->count;
    w->nlog = (size_t)w->sp.n_hidden + (size_t)w->sp.n_layers * (w->sp.n_heads + w->sp.n_ffn + 2);
    w->mhost = malloc(w->nmask * sizeof *w->mhost);
    w->ghost = malloc(w->nmask * sizeof *w->ghost);
    w->adam = calloc(w->nlog * 3, sizeof *w->adam);
    w->tokens = malloc((size_t)o->batch * o->seq * 2 * sizeof *w->tokens);
    if (!w->mhost || !w->ghost || !w->adam || !w->tokens) {
        snprintf(err, errlen, "out of memory during the search");
        return -1;
    }
    w->targets = w->tokens + (size_t)o->batch * o->seq;
    for (int m = 0; m < SM_COUNT; m++)
        w->pen.lambda2[m] = o->lambda2_init;   /* start with a symmetric pull toward the limit */
    return 0;
}

/* One iteration at temperature tau: sample masks, distil through them, move the
 * penalty multipliers and take an Adam step on the logits. 0, or -1 with err. */
static int search_step(const dnas_opts *o, dnas_work *w, int it, double tau, double weight, uint64_t *rng,
                       uint64_t *cursor, eng_loss_result *lr, char *err, size_t errlen)
{
    eng_backend *be = o->parent->be;
    search_dist *d = &w->d;
    search_dist_probs(d, tau, rng);
    fill_masks(d, &w->student, &w->mo, w->mhost);
    be->to_device(be, w->student.masks->block, w->mhost, w->nmask * sizeof(float));
    eng_model_zero_grads(&w->student);
    if (td_batch(o->data, cursor, o->batch, o->seq, w->tokens, w->targets) != 0) {
        snprintf(err, errlen, "the calibration text has fewer than %d tokens", o->seq + 1);
        return -1;
    }
    eng_loss_spec loss = {.kind = ENG_LOSS_KD, .targets = w->targets, .teacher = o->parent,
                          .temperature = 1.0f, .kd_weight = 1.0f};
    if (eng_forward_backward(&w->student, w->tokens, o->batch, o->seq, &loss, ENG_GRAD_MASKS, lr, err, errlen) != 0)
        return -1;
    be->to_host(be, w->ghost, w->student.masks->grad_block, w->nmask * sizeof(float));
    masks_to_pgrad(d, &w->student, &w->mo, w->ghost);
    search_penalty_step(&w->pen, d, &w->costs, 50.0, weight, weight > 0 ? o->eta : 0.0);
    const search_space *sp = &w->sp;
    double *gz = w->adam + 2 * w->nlog;
    search_dist_logit_grads(d, tau, gz, gz + sp->n_hidden, gz + sp->n_hidden + (size_t)sp->n_layers * sp->n_heads,
                            gz + sp->n_hidden + (size_t)sp->n_layers * (sp->n_heads + sp->n_ffn));
    /* Adam on the logits (the logits block is contiguous in search_dist). */
    double b1 = 0.9, b2 = 0.999, bc1 = 1 - pow(b1, it + 1), bc2 = 1 - pow(b2, it + 1);
    double *m1 = w->adam, *m2 = w->adam + w->nlog;
    for (size_t i = 0; i < w->nlog; i++) {
        m1[i] = b1 * m1[i] + (1 - b1) * gz[i];
        m2[i] = b2 * m2[i] + (1 - b2) * gz[i] * gz[i];
        d->logit_hidden[i] -= o->lr * (m1[i] / bc1) / (sqrt(m2[i] / bc2) + 1e-8);
    }
    return 0;
}

/* Report iteration it to o->progress with the argmax arch so far. Non-zero: stop. */
static int report_progress(const dnas_opts *o, dnas_work *w, int it, int iters, double tau, double weight,
                           const eng_loss_result *lr, const dnas_result *r)
{
    char summary[4096] = "";
    search_choice c;
    arch a;
    if (search_choice_init(&c, &w->sp) == 0) {
        search_decode_argmax(&w->d, &c);
        if (search_choice_arch(&w->sp, &c, &o->parent->a, &a) == 0) {
            arch_summary(&a, summary, sizeof summary);
            arch_free(&a);
        }
        search_choice_free(&c);
    }
    dnas_progress p = {.iteration = it + 1, .iterations = iters, .kd_loss = lr->kd, .tau = tau,
                       .penalty_weight = weight, .pen = w->pen, .tokens = r->selection_tokens,
                       .arch_summary = summary};
    return o->progress(o->progress_ctx, &p);
}

int dnas_run(const dnas_opts *o, dnas_result *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    err[0] = 0;
    double t0 = eng_wall_s();
    const arch *pa = &o->parent->a;
    static const dnas_work zero;
    dnas_work *w = malloc(sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    *w = zero;
    if (dnas_space_build(pa, o->tables, &o->limits, &o->axes, &w->sp, &w->costs, err, errlen) != 0) {
        free(w);
        return -1;
    }
    int rc = parent_feasible(o, &w->costs, r, err, errlen);
    if (rc != 0) {   /* the parent itself, or an error */
        rc = rc > 0 ? 0 : -1;
        goto out;
    }
    rc = -1;
    if (cheapest_feasible(&w->sp, &w->costs, err, errlen) != 0)
        goto out;
    if (!o->data || o->batch <= 0 || o->seq <= 0) {
        snprintf(err, errlen, "the search needs calibration tokens and a positive batch");
        goto out;
    }
    if (work_init(o, w, err, errlen) != 0)
        goto out;
    int64_t per_it = (int64_t)o->batch * o->seq;
    int iters = (int)(o->search_tokens / per_it);
    if (iters < 1)
        iters = 1;
    int warm = (int)(o->warmup_frac * iters);
    double decay = iters > 1 ? log(o->tau_min / o->tau0) / (iters - 1) : 0;
    uint64_t rng = o->seed ? o->seed : 1, cursor = 0;
    for (int it = 0; it < iters; it++) {
        double tau = o->tau0 * exp(decay * it);
        double weight = it < warm ? 0.0 : fmin(1.0, (double)(it - warm + 1) / (0.2 * iters + 1));
        eng_loss_result lr;
        if (search_step(o, w, it, tau, weight, &rng, &cursor, &lr, err, errlen) != 0)
            goto out;
        r->selection_tokens += per_it;
        for (int m = 0; m < SM_COUNT; m++)
            r->final_gap[m] = w->pen.gap[m];
        r->iterations = it + 1;
        if (o->progress && report_progress(o, w, it, iters, tau, weight, &lr, r)) {
            rc = 1;
            goto out;
        }
    }
    search_dist_probs(&w->d, o->tau_min, NULL);
    if (!(r->distribution = distribution_json(&w->d))) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    if (decode_and_repair(&w->d, &w->costs, o, pa, r, err, errlen) != 0)
        goto out;
    rc = 0;
out:
    if (rc == 0)
        r->wall_s = eng_wall_s() - t0;
    if (rc < 0) {
        arch_free(&r->arch);
        json_decref(r->distribution);
        r->distribution = NULL;
    }
    work_free(w);
    free(w);
    return rc;
}
