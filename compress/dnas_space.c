/* compress/dnas_space.c — the AutoCompress search space of a parent (compress/dnas.h):
 * the axes' candidate sizes (hidden, heads in KV groups, FFN widths, the Mamba head count,
 * expert counts), which of them each layer may take under the export formats' rules, and
 * the per-part cost tables of every choice, priced from the calibration (one-layer probes
 * against the layerless model). dnas.c runs the search over it.
 */
#include "compress/dnas.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
                      const arch_moe *moe_in, const arch_mamba *mb, const cm_prediction *pe, search_costs *costs, int hi,
                      int k, int n, char *err, size_t errlen)
{
    double lat = 0, dec = 0, mem = 0, ws = 0, par = 0;
    int L = sp->n_layers, group = sp->group;
    arch_moe mw = moe_in ? *moe_in : (arch_moe){0};   /* at choice k's expert and shared widths, hi's latent */
    if (moe_in && sp->expw[k])
        mw.expert_ffn_dim = sp->expw[k];
    if (moe_in && sp->lat[hi])
        mw.latent_dim = sp->lat[hi];
    if (moe_in && sp->shw[k])
        mw.shared_ffn_dim = sp->shw[k];
    const arch_moe *moe = moe_in ? &mw : NULL;
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
                snprintf(err, errlen, "the calibration does not cover an MoE of %d experts of %d units (shared expert "
                         "%d, latent %d) at hidden %d", size, moe->expert_ffn_dim, moe->shared_ffn_dim,
                         moe->latent_dim, H);
            else
                snprintf(err, errlen, "the calibration does not cover an FFN of width %d at hidden %d", size, H);
            return -1;
        }
        lat = pre_ms + dec_ms;
        dec = dec_ms;
        ws = ws_b;
        mem = (double)(p1.weights + p1.request_cache - pe->weights - pe->request_cache);
        if (p1.request_cache > 0 && pe->request_cache == 0)
            mem -= (double)tb->mem.kv_overhead_bytes;   /* the cache's intercept: once, in the fixed cost */
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
        /* with the KV cache's intercept, once (a choice keeping no cache layer is charged it
           too: the full prediction of the result decides) */
        costs->t[SM_MEMORY].fixed[hi] = (double)(pe.weights + pe.request_cache + pe.runtime_buffers) +
                                         (pe.request_cache == 0 ? (double)tb->mem.kv_overhead_bytes : 0);
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

/* The LatentMoE's latent on the hidden axis: every hidden size paired with each narrower
 * latent the tables price (a multiple of the target's block) and then with the parent's
 * (lat 0), when every MoE layer of the parent shares one latent (HF and GGUF hold one per
 * model). Leaves sp alone otherwise. 0, or -1 when the pairs overflow the axis. */
static int latent_pairs(const arch *parent, const cm_tables *tb, int block, search_space *sp)
{
    const arch_moe *first = arch_first_moe(parent, NULL);
    int D = first ? first->latent_dim : 0;
    for (int l = 0; D && l < parent->n_layers; l++)
        if (parent->layers[l].moe.n_experts && parent->layers[l].moe.latent_dim != D)
            return 0;
    int lt[SEARCH_MAX_CHOICES], nl = D ? cm_moe_latents(tb, first, lt, SEARCH_MAX_CHOICES) : 0, nd = 0, d[SEARCH_MAX_CHOICES];
    for (int i = 0; i < nl; i++)
        if (lt[i] < D && lt[i] % block == 0)
            d[nd++] = lt[i];
    if (!nd)
        return 0;
    if (sp->n_hidden * (nd + 1) > SEARCH_MAX_CHOICES)
        return -1;
    int h[SEARCH_MAX_CHOICES], nh = sp->n_hidden;
    memcpy(h, sp->hidden, sizeof *h * (size_t)nh);
    sp->n_hidden = 0;
    for (int i = 0; i < nh; i++)
        for (int j = 0; j <= nd; j++) {
            sp->hidden[sp->n_hidden] = h[i];
            sp->lat[sp->n_hidden++] = j < nd ? d[j] : 0;
        }
    return 0;
}

/* The hidden axis: eighths of the parent from one half up, multiples of 8 (and of block),
 * that the tables cover, then the parent's; with axes->latent each paired with the latents
 * (latent_pairs). 0, or -1 when the pairs overflow the axis. */
static int hidden_axis(const arch *parent, const cm_tables *tb, const dnas_axes *axes, int block, search_space *sp)
{
    int C = parent->hidden_size, cands[4], n_cands = axes->hidden ? cm_hidden_candidates_m(C, block, cands) : 0;
    sp->n_hidden = 0;
    for (int j = 0; j < n_cands; j++) {
        cm_prediction p;
        char e2[256];
        if (predict_probe(tb, parent, cands[j], 0, 0, 0, 0, NULL, NULL, &p, e2, sizeof e2) != 0)
            continue;   /* not calibrated at this hidden size */
        sp->hidden[sp->n_hidden++] = cands[j];
    }
    sp->hidden[sp->n_hidden++] = C;
    return axes->latent ? latent_pairs(parent, tb, block, sp) : 0;
}

/* The global Mamba head axis: every multiple of the groups up to the parent's heads (evenly
 * spaced when more than the axis holds) whose d_inner is a multiple of the target's weight
 * block, the parent's own always, the heads axis padded to its length. Every Mamba
 * layer of the parent must share one shape. 0, or -1 with err. */
static int mamba_axis(const arch *parent, int block, search_space *sp, char *err, size_t errlen)
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
        if ((m * mb->head_dim) % block && m != most)
            continue;   /* d_inner (out_proj's rows) off the target's weight blocks: not priced */
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

/* The widths the routed experts may take: those the tables price for the first MoE layer's
 * shape up to its width (which is among them), when searched and every MoE layer has that
 * width; else just the layer's own (0). Into w; the count. */
static int expert_widths(const arch *parent, const cm_tables *tb, int searched, int *w)
{
    const arch_moe *first = arch_first_moe(parent, NULL);
    int n = 0, uniform = first != NULL, cal[SEARCH_MAX_CHOICES];
    for (int l = 0; first && l < parent->n_layers; l++)
        uniform &= !parent->layers[l].moe.n_experts || parent->layers[l].moe.expert_ffn_dim == first->expert_ffn_dim;
    int nc = searched && uniform ? cm_moe_widths(tb, first, cal, SEARCH_MAX_CHOICES) : 0, own = 0;
    for (int i = 0; i < nc; i++)
        if (cal[i] < first->expert_ffn_dim)
            w[n++] = cal[i];
        else
            own |= cal[i] == first->expert_ffn_dim;
    if (!own)
        n = 0;   /* the tables do not price the parent's own width at this shape: widths stay */
    w[n++] = 0;
    return n;
}

/* The widths the shared expert may take: those the tables price for the first MoE layer's
 * shape below its own, when searched and every MoE layer has that shared width; and 0 (the
 * layer's own). Into w; the count. */
static int shared_widths(const arch *parent, const cm_tables *tb, int searched, int *w)
{
    const arch_moe *first = arch_first_moe(parent, NULL);
    int n = 0, uniform = first != NULL && first->shared_ffn_dim > 0, cal[SEARCH_MAX_CHOICES];
    for (int l = 0; uniform && l < parent->n_layers; l++)
        uniform &= !parent->layers[l].moe.n_experts || parent->layers[l].moe.shared_ffn_dim == first->shared_ffn_dim;
    int nc = searched && uniform ? cm_moe_shared_widths(tb, first, cal, SEARCH_MAX_CHOICES) : 0;
    for (int i = 0; i < nc; i++)
        if (cal[i] < first->shared_ffn_dim)
            w[n++] = cal[i];
    w[n++] = 0;
    return n;
}

/* Units of a choice (count x width + shared width, the layer's own widths for 0), for ordering. */
static long expert_units(const arch_moe *m, int count, int width, int shared)
{
    return (long)count * (width ? width : m->expert_ffn_dim) + (shared ? shared : m->shared_ffn_dim);
}

/* The MoE layers' choices: expert counts (every count up to the most, evenly spaced beyond
 * the axis, that the first MoE layer can keep, grouped: as many per group; not searched,
 * the parent's own: a llama.cpp calibration prices no single expert), each at every width
 * of expert_widths and every shared width of shared_widths, ascending in expert units
 * (counts thinned until they fit); 0 = MLP removed when zero; sp->moe marks the MoE layers.
 * 0, or -1 out of memory. */
static int expert_axis(const arch *parent, const cm_tables *tb, search_space *sp, int zero, int searched,
                       int widths_searched, int shared_searched)
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
    int cnt[SEARCH_MAX_CHOICES], nc = 0, w[SEARCH_MAX_CHOICES], nw = Emax ? expert_widths(parent, tb, widths_searched, w) : 0;
    int s[SEARCH_MAX_CHOICES], ns = Emax ? shared_widths(parent, tb, shared_searched, s) : 0;
    for (int e = 1; !searched && e <= Emax && nc < SEARCH_MAX_CHOICES; e++)   /* the parent's, ascending */
        for (int l = 0; l < L; l++)
            if (parent->layers[l].moe.n_experts == e) {
                cnt[nc++] = e;
                break;
            }
    int room = SEARCH_MAX_CHOICES - 1 - sp->n_exp, st = arch_moe_grouped(&most) ? most.n_group : 1;
    int steps = Emax / st < room ? Emax / st : room;
    for (int c = 1; searched && c <= steps; c++) {
        int e = Emax / st <= room ? c * st : ((Emax * c + room - 1) / room + st - 1) / st * st;
        if ((!nc || e > cnt[nc - 1]) && arch_moe_count_ok(&most, e))
            cnt[nc++] = e;
    }
    /* too many: counts thinned to 8 or fewer, then the widest narrower shared and routed widths
       dropped down to one narrower each (the layer's own kept), then counts thinned further, then
       the last narrower widths dropped */
    while (nc * nw * ns > room) {
        if (nc <= 8 && (ns > 2 || (nc == 1 && ns > 1))) {
            ns--;
            s[ns - 1] = 0;
        } else if (nc <= 8 && (nw > 2 || (nc == 1 && nw > 1))) {
            nw--;
            w[nw - 1] = 0;
        } else {   /* every other count, the most kept */
            int k = 0;
            for (int i = (nc - 1) % 2; i < nc; i += 2)
                cnt[k++] = cnt[i];
            nc = k;
        }
    }
    int base = sp->n_exp;
    for (int i = 0; i < nc; i++)
        for (int j = 0; j < nw * ns; j++) {   /* insertion by units, then count */
            int at = sp->n_exp++, wj = w[j / ns], sj = s[j % ns];
            long u = expert_units(&most, cnt[i], wj, sj), v;
            while (at > base && ((v = expert_units(&most, sp->exp[at - 1], sp->expw[at - 1], sp->shw[at - 1])) > u ||
                                 (v == u && sp->exp[at - 1] > cnt[i]))) {
                sp->exp[at] = sp->exp[at - 1];
                sp->expw[at] = sp->expw[at - 1];
                sp->shw[at] = sp->shw[at - 1];
                at--;
            }
            sp->exp[at] = cnt[i];
            sp->expw[at] = wj;
            sp->shw[at] = sj;
        }
    return 0;
}

/* The heads axis: 0 when `zero`, then every head count of whole KV groups (`group`) whose
 * rows fill the target's blocks (the parent's most, Hmax, always), evenly thinned, up to
 * Hmax, when more than the axis holds. */
static void heads_axis(const arch *parent, int Hmax, int group, int block, int zero, search_space *sp)
{
    sp->n_heads = 0;
    if (zero)
        sp->heads[sp->n_heads++] = 0;
    int n_cand = 0, room = SEARCH_MAX_CHOICES - sp->n_heads;
    for (int h = group; h <= Hmax; h += group)
        n_cand += (h * parent->head_dim) % block == 0 || h == Hmax;
    for (int h = group, i = 0, next = 0, taken = 0; h <= Hmax && taken < room; h += group) {
        if ((h * parent->head_dim) % block && h != Hmax)
            continue;
        if (n_cand <= room || i == next) {
            sp->heads[sp->n_heads++] = h;
            taken++;
            next = (int)(((long long)n_cand * (taken + 1) + room - 1) / room) - 1;
        }
        i++;
    }
}

int dnas_space_build(const arch *parent, const cm_tables *tb, const dnas_limits *lim, const dnas_axes *axes,
                     search_space *sp, search_costs *costs, char *err, size_t errlen)
{
    memset(sp, 0, sizeof *sp);
    memset(costs, 0, sizeof *costs);
    int L = parent->n_layers, Hmax = 0, Fmax = 0, group = 0;
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
    /* The target's weight type stores widths in blocks (tables' width_multiple): every
     * choice keeps to it, so the result never falls back to another type. */
    int block = tb->width_multiple > 1 ? tb->width_multiple : 1;
    if (hidden_axis(parent, tb, axes, block, sp) != 0) {
        snprintf(err, errlen, "too many (hidden size, latent) choices for the search");
        dnas_space_free(sp, costs);
        return -1;
    }
    /* Heads in KV groups; 0 = attention removed. */
    int zero_heads = (axes->heads || axes->depth) && !axes->no_removed_attention;
    int gap_heads = 0, gap_ffn = 0;   /* layers the parent left without attention (or Mamba) / an MLP */
    for (int l = 0; l < L; l++) {
        gap_heads |= !arch_layer_has_mixer(&parent->layers[l]);
        gap_ffn |= !arch_layer_has_mlp(&parent->layers[l]);
    }
    heads_axis(parent, Hmax, group, block, zero_heads || Hmax == 0 || gap_heads, sp);
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
    if (expert_axis(parent, tb, sp, zero_exp, axes->experts, axes->expert_widths, axes->shared_widths) != 0)
        goto oom;
    sp->tie_exp = (axes->experts || axes->expert_widths || axes->shared_widths) && axes->uniform_experts;
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
    if (mamba_axis(parent, block, sp, err, errlen) != 0) {
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
            int fw = search_mlp_width(sp, l, j), sw = search_mlp_shared(sp, l, j);
            int ok = (sp->moe[l] || j < nf_dense) && f >= 0 && fw <= pl->moe.expert_ffn_dim &&
                     sw <= pl->moe.shared_ffn_dim &&
                     (f == 0 ? mine == 0 || zero : searched ? f <= mine : f == mine) &&
                     (!sp->moe[l] || f == 0 || f == mine || f >= axes->min_experts) &&
                     (!sp->moe[l] || f == 0 || arch_moe_count_ok(&pl->moe, f));   /* grouped: as many per group */
            sp->allowed_ffn[l * sp->n_ffn + j] = (unsigned char)ok;
        }
        if (pl->n_heads && (!axes->heads || axes->keep_query_heads)) {
            int found = 0;
            for (int k = 0; k < sp->n_heads; k++)
                found |= sp->heads[k] == pl->n_heads;
            if (!found) {
                snprintf(err, errlen, "layers[%d].n_heads %d is not on the search grid", l, pl->n_heads);
                dnas_space_free(sp, costs);
                return -1;
            }
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
    if (search_choice_cheapest_layer(sp, costs, &c)) {
        search_choice_free(&c);
        snprintf(err, errlen, "no architecture in the search space keeps a layer");
        return;
    }
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
