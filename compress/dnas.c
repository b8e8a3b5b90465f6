/* compress/dnas.c — the supernet loop of the AutoCompress search: Gumbel-softmax
 * samples of the axis logits become soft prefix masks on the ranked parent, KD against
 * the unmasked parent plus the two-sided cost penalty give logit gradients, Adam moves
 * the logits, and the argmax is repaired against the cost tables at the end.
 * Weights stay the parent's during the search (no joint weight update).
 */
#include "compress/dnas.h"
#include "engine/clock.h"

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
    o->seed = 1234;
}

void dnas_result_free(dnas_result *r)
{
    arch_free(&r->arch);
    json_decref(r->distribution);
    memset(r, 0, sizeof *r);
}

void dnas_space_free(search_space *sp, search_costs *costs)
{
    free(sp->allowed_heads);
    free(sp->allowed_ffn);
    free(sp->moe);
    free(sp->mamba);
    sp->allowed_heads = sp->allowed_ffn = sp->moe = sp->mamba = NULL;
    for (int m = 0; m < SM_COUNT; m++) {
        free(costs->t[m].fixed);   /* one block per metric, see alloc_table */
        memset(&costs->t[m], 0, sizeof costs->t[m]);
    }
}

static int alloc_table(search_table *t, const search_space *sp, int with_ws)
{
    size_t nh = (size_t)sp->n_hidden, na = nh * sp->n_layers * sp->n_heads, nf = nh * sp->n_layers * sp->n_ffn;
    size_t n = nh + na + nf + (with_ws ? nh + na + nf : 0);
    double *b = calloc(n, sizeof *b);
    if (!b)
        return -1;
    t->fixed = b;
    t->attn = b + nh;
    t->ffn = t->attn + na;
    if (with_ws) {
        t->ws_fixed = t->ffn + nf;
        t->ws_attn = t->ws_fixed + nh;
        t->ws_ffn = t->ws_attn + na;
    }
    return 0;
}

/* An arch with the parent's globals, hidden size `hidden` and the given layers: ffn > 0 a
 * dense FFN, ffn < 0 an MoE of -ffn experts shaped as `moe` (top-k capped); with mb, heads
 * Mamba heads of mb's shape instead of attention. */
static int probe_arch(const arch *parent, int hidden, int n_layers, int heads, int kv, int ffn, const arch_moe *moe,
                      const arch_mamba *mb, arch *out)
{
    if (arch_init(out, n_layers) != 0)
        return -1;
    arch_layer *layers = out->layers;
    *out = *parent;
    out->layers = layers;
    out->n_layers = n_layers;
    out->hidden_size = hidden;
    for (int i = 0; i < n_layers; i++) {
        memset(&layers[i], 0, sizeof layers[i]);
        layers[i].source_layer = i;
        layers[i].n_heads = mb ? 0 : heads;
        layers[i].n_kv_heads = mb ? 0 : kv;
        if (mb && heads > 0) {
            layers[i].mamba = *mb;
            layers[i].mamba.n_heads = heads;
        }
        layers[i].ffn_dim = ffn > 0 ? ffn : 0;
        if (ffn < 0 && moe)
            layers[i].moe = arch_moe_keep(moe, -ffn);
    }
    return 0;
}

static int predict_probe(const cm_tables *tb, const arch *parent, int hidden, int n_layers, int heads, int kv,
                         int ffn, const arch_moe *moe, const arch_mamba *mb, cm_prediction *p, char *err,
                         size_t errlen)
{
    arch a;
    if (probe_arch(parent, hidden, n_layers, heads, kv, ffn, moe, mb, &a) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = cm_predict(tb, &a, p, err, errlen);
    arch_free(&a);
    return rc;
}

/* One part choice's costs at hidden size H (index hi), written for every layer of its kind
 * (attention: all; MLP: the MoE layers when moe, the others when not): `size` heads
 * (CM_ATTN, in KV groups of `group`), FFN width or expert count (CM_MLP), 0 = removed; pe is
 * the layerless model at H. Entry k of n choices. 0, or -1 with err when the calibration
 * does not cover it. */
static int part_costs(const cm_tables *tb, const search_space *sp, const arch *parent, int H, int part, int size,
                      const arch_moe *moe, const arch_mamba *mb, const cm_prediction *pe, search_costs *costs, int hi,
                      int k, int n, char *err, size_t errlen)
{
    double lat = 0, dec = 0, mem = 0, ws = 0, par = 0;
    int L = sp->n_layers, group = sp->group;
    if (size > 0) {
        int nh = part == CM_ATTN ? size : 0, nkv = part == CM_ATTN && !mb ? size / group : 0;
        int ffn = part == CM_MLP ? (moe ? -size : size) : 0;
        double pre_ms, dec_ms, ws_b;
        cm_prediction p1;
        arch_moe m1 = moe ? arch_moe_keep(moe, size) : (arch_moe){0};
        arch_mamba b1 = mb ? *mb : (arch_mamba){0};
        b1.n_heads = mb ? size : 0;
        int rc = moe ? cm_moe_cost(tb, H, &m1, &pre_ms, &dec_ms, &ws_b)
                 : mb ? cm_mamba_cost(tb, H, &b1, &pre_ms, &dec_ms, &ws_b)
                      : cm_part_cost(tb, part, H, nh, nkv, ffn, &pre_ms, &dec_ms, &ws_b);
        if (rc != 0 || predict_probe(tb, parent, H, 1, nh, nkv, ffn, moe, mb, &p1, err, errlen) != 0) {
            if (mb)
                snprintf(err, errlen, "the calibration does not cover a Mamba mixer of %d heads at hidden %d", size, H);
            else if (part == CM_ATTN)
                snprintf(err, errlen, "the calibration does not cover attention with %d heads at hidden %d", size, H);
            else if (moe)
                snprintf(err, errlen, "the calibration does not cover an MoE of %d experts at hidden %d", size, H);
            else
                snprintf(err, errlen, "the calibration does not cover an FFN of width %d at hidden %d", size, H);
            return -1;
        }
        lat = pre_ms + dec_ms;
        dec = dec_ms;
        ws = ws_b;
        mem = (double)(p1.weights + p1.request_cache - pe->weights - pe->request_cache);
        par = (double)(p1.params - pe->params);
    }
    for (int l = 0; l < L; l++) {
        if (part == CM_MLP && (sp->moe && sp->moe[l]) != (moe != NULL))
            continue;
        if (part == CM_ATTN && (sp->mamba && sp->mamba[l]) != (mb != NULL))
            continue;
        size_t i = ((size_t)hi * L + l) * n + k;
        double *t_lat = part == CM_ATTN ? costs->t[SM_LATENCY].attn : costs->t[SM_LATENCY].ffn;
        double *t_dec = part == CM_ATTN ? costs->t[SM_DECODE].attn : costs->t[SM_DECODE].ffn;
        double *t_mem = part == CM_ATTN ? costs->t[SM_MEMORY].attn : costs->t[SM_MEMORY].ffn;
        double *t_ws = part == CM_ATTN ? costs->t[SM_MEMORY].ws_attn : costs->t[SM_MEMORY].ws_ffn;
        double *t_par = part == CM_ATTN ? costs->t[SM_PARAMS].attn : costs->t[SM_PARAMS].ffn;
        t_lat[i] = lat;
        t_dec[i] = dec;
        t_mem[i] = mem;
        t_ws[i] = ws;
        t_par[i] = par;
    }
    return 0;
}

/* The cost tables of the space: per limit, the fixed cost at each hidden size and each
 * part choice's cost from the calibration (the parent's layer count copies). 0, or -1
 * with err. */
/* 1 when some layer of the kind (axis 1: Mamba when other, else attention; axis 2: MoE when
 * other, else a dense MLP) may take choice k of the heads or MLP list: a choice none may take
 * is never priced (a calibration need not cover it: a llama.cpp MoE calibration holds the
 * parent's heads and 2 experts or more). */
static int some_layer_allows(const search_space *sp, int axis, int k, int other)
{
    const unsigned char *ok = axis == 1 ? sp->allowed_heads : sp->allowed_ffn, *kind = axis == 1 ? sp->mamba : sp->moe;
    int n = axis == 1 ? sp->n_heads : sp->n_ffn;
    for (int l = 0; l < sp->n_layers; l++)
        if ((kind && kind[l]) == other && (!ok || ok[l * n + k]))
            return 1;
    return 0;
}

static int space_costs(const arch *parent, const cm_tables *tb, const dnas_limits *lim, const search_space *sp,
                       search_costs *costs, char *err, size_t errlen)
{
    const arch_moe *moe = arch_first_moe(parent, NULL);
    const arch_mamba *mb = arch_first_mamba(parent, NULL);
    costs->t[SM_LATENCY].active = lim->latency_ms > 0;
    costs->t[SM_LATENCY].limit = lim->latency_ms;
    costs->t[SM_DECODE].active = lim->throughput_tps > 0;
    if (lim->throughput_tps > 0)
        costs->t[SM_DECODE].limit = 1000.0 * tb->target.batch_size * tb->target.output_tokens / lim->throughput_tps;
    costs->t[SM_MEMORY].active = lim->memory_bytes > 0;
    costs->t[SM_MEMORY].limit = lim->memory_bytes;
    costs->t[SM_PARAMS].active = lim->params > 0;
    costs->t[SM_PARAMS].limit = lim->params;
    for (int m = 0; m < SM_COUNT; m++)
        if (alloc_table(&costs->t[m], sp, m == SM_MEMORY) != 0)
            goto oom;
    costs->t[SM_MEMORY].ws_sum_of_maxima = tb->mem.workspace_combine == CM_WS_SUM_MAXIMA;
    for (int hi = 0; hi < sp->n_hidden; hi++) {
        int H = sp->hidden[hi];
        cm_prediction pe;
        if (predict_probe(tb, parent, H, 0, 0, 0, 0, NULL, NULL, &pe, err, errlen) != 0)
            goto fail;
        costs->t[SM_LATENCY].fixed[hi] = pe.latency_ms;
        costs->t[SM_DECODE].fixed[hi] = pe.decode_ms;
        costs->t[SM_MEMORY].fixed[hi] = (double)(pe.weights + pe.request_cache + pe.runtime_buffers);
        costs->t[SM_MEMORY].ws_fixed[hi] = (double)pe.prefill_workspace;
        costs->t[SM_PARAMS].fixed[hi] = (double)pe.params;
        for (int k = 0; k < sp->n_heads; k++)
            if (sp->heads[k] >= 0 && some_layer_allows(sp, 1, k, 0) && part_costs(tb, sp, parent, H, CM_ATTN, sp->heads[k], NULL, NULL, &pe, costs, hi,
                                                k, sp->n_heads, err, errlen))
                goto fail;
        for (int k = 0; mb && k < sp->n_mam; k++)
            if (some_layer_allows(sp, 1, k, 1) && part_costs(tb, sp, parent, H, CM_ATTN, sp->mam[k], NULL, mb, &pe, costs, hi, k, sp->n_heads, err,
                           errlen))
                goto fail;
        for (int j = 0; j < sp->n_ffn; j++)
            if (sp->ffn[j] >= 0 && some_layer_allows(sp, 2, j, 0) && part_costs(tb, sp, parent, H, CM_MLP, sp->ffn[j], NULL, NULL, &pe, costs, hi, j,
                                              sp->n_ffn, err, errlen))
                goto fail;
        for (int j = 0; moe && j < sp->n_exp; j++)
            if (some_layer_allows(sp, 2, j, 1) && part_costs(tb, sp, parent, H, CM_MLP, sp->exp[j], moe, NULL, &pe, costs, hi, j, sp->n_ffn, err,
                           errlen))
                goto fail;
    }
    return 0;
oom:
    snprintf(err, errlen, "out of memory building the search space");
    return -1;
fail:
    return -1;
}

/* The global Mamba head axis: every multiple of the groups up to the parent's heads (evenly
 * spaced when more than the axis holds), the heads axis padded to its length. Every Mamba
 * layer of the parent must share one shape. 0, or -1 with err. */
static int mamba_axis(const arch *parent, search_space *sp, char *err, size_t errlen)
{
    int L = parent->n_layers, most;
    const arch_mamba *mb = arch_first_mamba(parent, &most);
    sp->mamba = calloc((size_t)L, 1);
    if (!sp->mamba) {
        snprintf(err, errlen, "out of memory building the search space");
        return -1;
    }
    sp->n_mam = 0;
    if (!mb)
        return 0;
    for (int l = 0; l < L; l++) {
        const arch_mamba *x = &parent->layers[l].mamba;
        sp->mamba[l] = x->n_heads > 0;
        if (x->n_heads && memcmp(x, mb, sizeof *x)) {
            snprintf(err, errlen, "layers[%d].mamba: %d heads differ from the first Mamba layer's %d; the search's "
                     "Mamba axis is one head count for every Mamba layer", l, x->n_heads, mb->n_heads);
            return -1;
        }
    }
    int G = mb->n_groups, steps = most / G, room = SEARCH_MAX_CHOICES - 1;
    for (int c = 1; c <= steps && c <= room; c++) {
        int m = G * (steps <= room ? c : (steps * c + room - 1) / room);
        if (!sp->n_mam || m > sp->mam[sp->n_mam - 1])
            sp->mam[sp->n_mam++] = m;
    }
    if (sp->n_mam > sp->n_heads) {
        for (int k = sp->n_heads; k < sp->n_mam; k++)
            sp->heads[k] = -1;   /* no attention choice here */
        sp->n_heads = sp->n_mam;
    }
    return 0;
}

/* The MoE layers' expert counts: every count up to the most (evenly spaced beyond the axis)
 * that the first MoE layer can keep (grouped: as many per group); not searched, the parent's
 * own (a llama.cpp calibration prices no single expert); 0 = MLP removed when zero; sp->moe
 * marks the MoE layers. 0, or -1 out of memory. */
static int expert_axis(const arch *parent, search_space *sp, int zero, int searched)
{
    int L = parent->n_layers, Emax = 0;
    sp->moe = calloc((size_t)(L > 0 ? L : 1), 1);
    if (!sp->moe)
        return -1;
    const arch_moe *first = arch_first_moe(parent, &Emax);
    arch_moe most = first ? *first : (arch_moe){0};   /* the first layer's routing, the most experts */
    most.n_experts = Emax;
    for (int l = 0; l < L; l++)
        sp->moe[l] = parent->layers[l].moe.n_experts > 0;
    sp->n_exp = 0;
    if (Emax && zero)
        sp->exp[sp->n_exp++] = 0;
    for (int e = 1; !searched && e <= Emax && sp->n_exp < SEARCH_MAX_CHOICES; e++)   /* the parent's, ascending */
        for (int l = 0; l < L; l++)
            if (parent->layers[l].moe.n_experts == e) {
                sp->exp[sp->n_exp++] = e;
                break;
            }
    if (!searched)
        return 0;
    int room = SEARCH_MAX_CHOICES - 1 - sp->n_exp, st = arch_moe_grouped(&most) ? most.n_group : 1;
    int steps = Emax / st < room ? Emax / st : room;
    for (int c = 1; c <= steps; c++) {
        int e = Emax / st <= room ? c * st : ((Emax * c + room - 1) / room + st - 1) / st * st;
        if ((!sp->n_exp || e > sp->exp[sp->n_exp - 1]) && arch_moe_count_ok(&most, e))
            sp->exp[sp->n_exp++] = e;
    }
    return 0;
}

int dnas_space_build(const arch *parent, const cm_tables *tb, const dnas_limits *lim, const dnas_axes *axes,
                     search_space *sp, search_costs *costs, char *err, size_t errlen)
{
    memset(sp, 0, sizeof *sp);
    memset(costs, 0, sizeof *costs);
    int L = parent->n_layers, C = parent->hidden_size, Hmax = 0, Fmax = 0, group = 0;
    if (L <= 0) {
        snprintf(err, errlen, "the parent has no layers to search");
        return -1;
    }
    for (int l = 0; l < L; l++) {
        const arch_layer *pl = &parent->layers[l];
        if (pl->n_heads > Hmax)
            Hmax = pl->n_heads;
        if (pl->ffn_dim > Fmax)
            Fmax = pl->ffn_dim;
        if (pl->n_heads) {
            int g = pl->n_heads / pl->n_kv_heads;
            if (group && g != group) {
                snprintf(err, errlen, "layers[%d]: query heads per KV head (%d) differ from earlier layers (%d); "
                         "the search needs one group size", l, g, group);
                return -1;
            }
            group = g;
        }
    }
    if (!group)
        group = 1;
    sp->n_layers = L;
    sp->group = group;
    sp->depth = axes->depth;
    /* Hidden candidates: eighths of the parent from one half up, multiples of 8, that the tables cover. */
    sp->n_hidden = 0;
    /* The target's weight type stores widths in blocks (tables' width_multiple): every
     * choice keeps to it, so the result never falls back to another type. */
    int block = tb->width_multiple > 1 ? tb->width_multiple : 1;
    int cands[4], n_cands = axes->hidden ? cm_hidden_candidates_m(C, block, cands) : 0;
    for (int j = 0; j < n_cands; j++) {
        cm_prediction p;
        char e2[256];
        if (predict_probe(tb, parent, cands[j], 0, 0, 0, 0, NULL, NULL, &p, e2, sizeof e2) != 0)
            continue;   /* not calibrated at this hidden size */
        sp->hidden[sp->n_hidden++] = cands[j];
    }
    sp->hidden[sp->n_hidden++] = C;
    /* Heads in KV groups; 0 = attention removed. */
    int zero_heads = (axes->heads || axes->depth) && !axes->no_removed_attention;
    int gap_heads = 0, gap_ffn = 0;   /* layers the parent left without attention (or Mamba) / an MLP */
    for (int l = 0; l < L; l++) {
        gap_heads |= !arch_layer_has_mixer(&parent->layers[l]);
        gap_ffn |= !arch_layer_has_mlp(&parent->layers[l]);
    }
    sp->n_heads = 0;
    if (zero_heads || Hmax == 0 || gap_heads)
        sp->heads[sp->n_heads++] = 0;
    for (int h = group; h <= Hmax && sp->n_heads < SEARCH_MAX_CHOICES; h += group)
        if ((h * parent->head_dim) % block == 0 || h == Hmax)
            sp->heads[sp->n_heads++] = h;
    /* FFN widths in sixteenths, multiples of 8 below the parent's; 0 = MLP removed. */
    int zero_ffn = (axes->ffn || axes->depth) && !axes->no_removed_mlp;
    sp->n_ffn = 0;
    if (zero_ffn || Fmax == 0 || gap_ffn)
        sp->ffn[sp->n_ffn++] = 0;
    for (int j = 1; j <= 16 && Fmax > 0; j++) {
        int f = j == 16 ? Fmax : (Fmax * j / 16) / 8 * 8;
        if (axes->ffn_multiple > 0 && j < 16)
            f = f / axes->ffn_multiple * axes->ffn_multiple;
        if (j < 16)
            f = f / block * block;
        if (f > 0 && (sp->n_ffn == 0 || f > sp->ffn[sp->n_ffn - 1]))
            sp->ffn[sp->n_ffn++] = f;
    }
    int nf_dense = sp->n_ffn, zero_exp = axes->depth && !axes->no_removed_mlp;   /* an MoE goes whole only with depth */
    if (expert_axis(parent, sp, zero_exp, axes->experts) != 0)
        goto oom;
    sp->tie_exp = axes->experts && axes->uniform_experts;
    for (int l = 0, e0 = 0; sp->tie_exp && l < L; l++) {
        int e = parent->layers[l].moe.n_experts;
        if (e && e0 && e != e0) {
            snprintf(err, errlen, "layers[%d].moe: %d experts differ from the first MoE layer's %d; the export "
                     "holds one expert count for every layer, and so does the search", l, e, e0);
            dnas_space_free(sp, costs);
            return -1;
        }
        e0 = e0 ? e0 : e;
    }
    if (sp->n_exp > sp->n_ffn) {
        for (int j = sp->n_ffn; j < sp->n_exp; j++)
            sp->ffn[j] = -1;   /* no dense choice here */
        sp->n_ffn = sp->n_exp;
    }
    if (mamba_axis(parent, sp, err, errlen) != 0) {
        dnas_space_free(sp, costs);
        return -1;
    }
    sp->allowed_heads = calloc((size_t)L * sp->n_heads, 1);
    sp->allowed_ffn = calloc((size_t)L * sp->n_ffn, 1);
    if (!sp->allowed_heads || !sp->allowed_ffn)
        goto oom;
    for (int l = 0; l < L; l++) {
        const arch_layer *pl = &parent->layers[l];
        for (int k = 0; k < sp->n_heads; k++) {
            int h = search_mixer_size(sp, l, k), ok;
            if (sp->mamba[l])   /* the global Mamba axis: a count per group, never 0 (the layer goes whole) */
                ok = h > 0 && (axes->mamba ? h <= pl->mamba.n_heads : h == pl->mamba.n_heads);
            else if (h < 0)
                ok = 0;
            else if (h == 0)   /* a layer without attention keeps none; one with it drops it where allowed */
                ok = pl->n_heads == 0 || zero_heads;
            else if (!axes->heads || axes->keep_query_heads)
                ok = h == pl->n_heads;
            else
                ok = h <= pl->n_heads;
            sp->allowed_heads[l * sp->n_heads + k] = (unsigned char)ok;
        }
        for (int j = 0; j < sp->n_ffn; j++) {
            int f = search_mlp_size(sp, l, j), mine = sp->moe[l] ? pl->moe.n_experts : pl->ffn_dim;
            int searched = sp->moe[l] ? axes->experts : axes->ffn, zero = sp->moe[l] ? zero_exp : zero_ffn;
            int ok = (sp->moe[l] || j < nf_dense) && f >= 0 &&
                     (f == 0 ? mine == 0 || zero : searched ? f <= mine : f == mine) &&
                     (!sp->moe[l] || f == 0 || f == mine || f >= axes->min_experts) &&
                     (!sp->moe[l] || f == 0 || arch_moe_count_ok(&pl->moe, f));   /* grouped: as many per group */
            sp->allowed_ffn[l * sp->n_ffn + j] = (unsigned char)ok;
        }
        if (pl->ffn_dim && !axes->ffn) {
            int found = 0;
            for (int j = 0; j < sp->n_ffn; j++)
                found |= sp->ffn[j] == pl->ffn_dim;
            if (!found) {
                snprintf(err, errlen, "layers[%d].ffn_dim %d is not on the search grid", l, pl->ffn_dim);
                dnas_space_free(sp, costs);
                return -1;
            }
        }
    }
    if (space_costs(parent, tb, lim, sp, costs, err, errlen) != 0) {
        dnas_space_free(sp, costs);
        return -1;
    }
    return 0;
oom:
    snprintf(err, errlen, "out of memory building the search space");
    dnas_space_free(sp, costs);
    return -1;
}

void dnas_describe_infeasible(const search_space *sp, const search_costs *costs, char *err, size_t errlen)
{
    search_choice c;
    if (search_choice_init(&c, sp) != 0) {
        snprintf(err, errlen, "no architecture in the search space meets the limits");
        return;
    }
    search_choice_cheapest(sp, &c);
    size_t off = 0;
    int n = snprintf(err, errlen, "no architecture in the search space meets the limits; the cheapest predicts");
    off = n > 0 ? (size_t)n : 0;
    for (int m = 0; m < SM_COUNT && off < errlen; m++) {
        const search_table *t = &costs->t[m];
        if (!t->active)
            continue;
        double v = search_choice_cost(sp, t, &c);
        n = snprintf(err + off, errlen - off, " %s %.6g (limit %.6g)%s", search_metric_names[m], v, t->limit,
                     v > t->limit ? " VIOLATED" : "");
        off += n > 0 ? (size_t)n : 0;
    }
    search_choice_free(&c);
}

/* Offsets of the mask arrays inside the masks block (device pointers on any backend). */
typedef struct {
    size_t hidden, *head, *ffn, *exp, attn_gate, mlp_gate;
} mask_offsets;

static int mask_offsets_init(const eng_model *m, mask_offsets *o)
{
    const eng_masks *k = m->masks;
    int L = m->a.n_layers;
    o->head = calloc((size_t)L * 3, sizeof(size_t));
    if (!o->head)
        return -1;
    o->ffn = o->head + L;
    o->exp = o->head + 2 * L;
    o->hidden = (size_t)(k->hidden - k->block);
    o->attn_gate = (size_t)(k->attn_gate - k->block);
    o->mlp_gate = (size_t)(k->mlp_gate - k->block);
    for (int l = 0; l < L; l++) {
        o->head[l] = k->head[l] ? (size_t)(k->head[l] - k->block) : (size_t)-1;
        o->ffn[l] = k->ffn[l] ? (size_t)(k->ffn[l] - k->block) : (size_t)-1;
        o->exp[l] = k->expert[l] ? (size_t)(k->expert[l] - k->block) : (size_t)-1;
    }
    return 0;
}

/* The routing groups whose experts a layer keeps as many of (grouped routing), else 1; a layer
 * without experts: 1. */
static int moe_groups(const arch_layer *l)
{
    return l->moe.n_experts && arch_moe_grouped(&l->moe) ? l->moe.n_group : 1;
}

/* Soft prefix masks from the probabilities: unit j kept with P(size > j). */
static void fill_masks(const search_dist *d, const eng_model *m, const mask_offsets *o, float *host)
{
    const search_space *sp = d->sp;
    int C = m->a.hidden_size;
    double count = 0;
    for (int c = 0; c < C; c++) {
        double v = 0;
        for (int h = 0; h < sp->n_hidden; h++)
            if (sp->hidden[h] > c)
                v += d->p_hidden[h];
        host[o->hidden + c] = (float)v;
        count += v;
    }
    m->masks->hidden_count = (float)count;
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
        if (o->ffn[l] != (size_t)-1)
            for (int j = 0; j < pl->ffn_dim; j++) {
                double v = 0;
                for (int k = 0; k < sp->n_ffn; k++)
                    if (sp->ffn[k] > j)
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
        host[o->attn_gate + l] = (float)d->p_keep[l * 2 + 1];
        host[o->mlp_gate + l] = (float)d->p_keep[l * 2 + 1];
    }
}

/* Chain mask gradients into probability gradients: dL/dp_k = sum_{j < size_k} dL/dm_j. */
static void masks_to_pgrad(search_dist *d, const eng_model *m, const mask_offsets *o, const float *g)
{
    const search_space *sp = d->sp;
    int C = m->a.hidden_size;
    double gcount = m->masks->g_hidden_count;
    double *cum = malloc(((size_t)C + 1) * sizeof *cum);
    if (!cum)
        return;
    cum[0] = 0;
    for (int c = 0; c < C; c++)
        cum[c + 1] = cum[c] + g[o->hidden + c] + gcount;   /* hidden_count = sum of the mask */
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
        if (o->ffn[l] != (size_t)-1)
            for (int k = 0; k < sp->n_ffn; k++) {
                double s = 0;
                for (int j = 0; j < sp->ffn[k] && j < pl->ffn_dim; j++)
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
        if (sp->depth)
            d->g_keep[l * 2 + 1] += g[o->attn_gate + l] + g[o->mlp_gate + l];
    }
}

static json_t *probs_json(const double *p, const int *sizes, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (sizes[i] >= 0)   /* an MLP axis longer than this layer's list */
            json_array_append_new(a, json_pack("{s:i,s:f}", "size", sizes[i], "p", p[i]));
    return a;
}

static json_t *distribution_json(const search_dist *d)
{
    const search_space *sp = d->sp;
    json_t *layers = json_array();
    for (int l = 0; layers && l < sp->n_layers; l++)
        json_array_append_new(layers, json_pack("{s:i,s:o,s:o,s:f}", "layer", l,
                                                sp->mamba && sp->mamba[l] ? "mamba_heads" : "heads",
                                                probs_json(d->p_heads + l * sp->n_heads, sp->mamba && sp->mamba[l]
                                                           ? sp->mam : sp->heads, sp->mamba && sp->mamba[l]
                                                           ? sp->n_mam : sp->n_heads),
                                                sp->moe && sp->moe[l] ? "experts" : "ffn",
                                                probs_json(d->p_ffn + l * sp->n_ffn, sp->moe && sp->moe[l] ? sp->exp
                                                           : sp->ffn, sp->moe && sp->moe[l] ? sp->n_exp : sp->n_ffn),
                                                "keep", d->p_keep[l * 2 + 1]));
    return json_pack("{s:o,s:o}", "hidden", probs_json(d->p_hidden, sp->hidden, sp->n_hidden), "layers", layers);
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

/* Decode argmax, repair against the tables, and confirm with the full prediction; when
 * the prediction disagrees with the additive tables (it adds terms the tables cannot
 * split), tighten that limit by the disagreement and repair again. With a check, the
 * arch the prediction accepts is then served (o->check) and judged against the served
 * limits (o->served_limits, else the search's): measured over one, the target is
 * tightened by the measured excess and the arch repaired again; measured within with
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
                  cm_predict(o->tables, &r->arch, &r->predicted, err, errlen) != 0 ? -1 : (o->check && r->arch.n_layers < 1);
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
            arch_free(&r->arch);
            r->arch = best;
            r->predicted = best_pred;
            memset(&best, 0, sizeof best);
            r->checked_within = 1;
            rc = 0;
            break;
        }
        if (!o->check || r->checks >= DNAS_CHECKS) {
            if (best.layers) {   /* the checks are spent: what was served within decides */
                arch_free(&r->arch);
                r->arch = best;
                r->predicted = best_pred;
                memset(&best, 0, sizeof best);
                r->checked_within = 1;
            }
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
            if (costs->t[k].active && measured[k] > served_lim[k] * 0.99)
                ok = 0;
        if (!ok) {   /* tighten the target (and the tables' limit) by the measured excess */
            for (int k = 0; k < SM_COUNT; k++)
                if (costs->t[k].active && measured[k] > served_lim[k] * 0.99) {
                    double f = served_lim[k] / measured[k] * 0.99;
                    target[k] *= f;
                    costs->t[k].limit *= f;
                }
            r->checked_within = 0;
            continue;
        }
        r->checked_within = 1;
        arch_free(&best);
        best = served;
        best_pred = served_pred;
        memset(&served, 0, sizeof served);
        if (arch_copy(&served, &best)) {
            snprintf(err, errlen, "out of memory");
            break;
        }
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
            arch_free(&r->arch);
            r->arch = best;
            r->predicted = best_pred;
            memset(&best, 0, sizeof best);
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
    search_choice_cheapest(sp, &c);
    int bad = 0;
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
    r->distribution = distribution_json(&w->d);
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
