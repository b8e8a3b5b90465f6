/* compress/cal_grid.c — what a calibration measures: the part sizes the search can choose
 * (attention by KV group, FFN widths), the options' defaults, the hidden sizes a
 * hidden-size search needs, and random heterogeneous archs for held-out validation.
 * Nothing here runs the engine.
 */
#include "compress/calibrate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/measure.h"
#include "engine/devices.h"
#include "engine/rng.h"

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

/* The Mamba part of the mixer grid: codes (m, -1) for m Mamba heads, multiples of the
 * groups up to the most heads (every multiple, or sixteenths rounded up to one). */
static int grid_mamba(const arch *parent, int *heads, int *kv, int n, int max)
{
    int most;
    const arch_mamba *mb = arch_first_mamba(parent, &most);
    if (!mb)
        return n;
    int G = mb->n_groups, steps = most / G;
    for (int k = 1, last = 0; k <= 16 && n < max; k++) {
        int c = G * (steps <= 16 ? k : (steps * k + 15) / 16);
        if (c > most)
            break;
        if (c > last) {
            heads[n] = c;
            kv[n++] = -1;
        }
        last = c;
    }
    return n;
}

void cal_mixer_apply(const arch *parent, int nh, int nkv, arch_layer *l)
{
    const arch_mamba *mb = arch_first_mamba(parent, NULL);
    memset(&l->mamba, 0, sizeof l->mamba);
    l->n_heads = nkv >= 0 ? nh : 0;
    l->n_kv_heads = nkv >= 0 ? nkv : 0;
    if (nkv < 0 && nh > 0 && mb) {
        l->mamba = *mb;
        l->mamba.n_heads = nh;
    }
}

int cal_grid_attention(const arch *parent, int *heads, int *kv, int max)
{
    int H, KV, F, n = 0;
    parent_dims(parent, &H, &KV, &F);
    if (!H)
        return grid_mamba(parent, heads, kv, 0, max);
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
    return grid_mamba(parent, heads, kv, n, max);
}

void cal_mlp_apply(const arch *parent, int code, arch_layer *l)
{
    const arch_moe *e = arch_first_moe(parent, NULL);
    l->ffn_dim = code > 0 ? code : 0;
    memset(&l->moe, 0, sizeof l->moe);
    if (code < 0 && e && cal_moe_is_latent(code)) {
        l->moe = *e;
        l->moe.latent_dim = -code - CAL_MOE_LATENT;
    } else if (code < 0 && e && cal_moe_is_shared(code)) {
        l->moe = *e;
        l->moe.shared_ffn_dim = -code - CAL_MOE_SHARED;
    } else if (code < 0 && e) {
        l->moe = arch_moe_keep(e, -code % CAL_MOE_BASE);
        if (-code / CAL_MOE_BASE)
            l->moe.expert_ffn_dim = -code / CAL_MOE_BASE;
    }
}

int cal_moe_widths(int F, int w[3])
{
    int n = 0;
    for (int k = 1; k <= 3; k++) {
        int f = F * k / 4;
        f = F >= 64 ? f / 8 * 8 : f;
        if (f >= 1 && f < F && (!n || f > w[n - 1]))
            w[n++] = f;
    }
    return n;
}

cm_entry cal_entry_key(const arch *parent, int part, int hidden, int nh, int nkv, int ffn)
{
    cm_entry k;
    arch_layer l;
    memset(&k, 0, sizeof k);
    memset(&l, 0, sizeof l);
    k.part = part;
    k.hidden_size = hidden;
    if (part == CM_ATTN) {
        cal_mixer_apply(parent, nh, nkv, &l);
        k.n_heads = l.n_heads;
        k.n_kv_heads = l.n_kv_heads;
        k.mamba = l.mamba;
    } else {
        cal_mlp_apply(parent, ffn, &l);
        k.ffn_dim = l.ffn_dim;
        k.n_experts = l.moe.n_experts;
        k.top_k = l.moe.top_k;
        k.expert_ffn_dim = l.moe.expert_ffn_dim;
        k.shared_ffn_dim = l.moe.shared_ffn_dim;
        k.latent_dim = l.moe.latent_dim;
    }
    return k;
}

int cal_grid_mlp(const arch *parent, int *ffn, int max, int moe_widths)
{
    int H, KV, F, n = 0, most;
    parent_dims(parent, &H, &KV, &F);
    if (F) {
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
    }
    const arch_moe *e = arch_first_moe(parent, &most);
    int st = e && arch_moe_grouped(e) ? e->n_group : 1;   /* grouped routing: as many per group */
    int cnt[18], nc = 0;
    for (int k = 1, last = 0; e && k <= 16; k++) {
        int c = most <= 16 * st ? k * st : ((most * k + 15) / 16 + st - 1) / st * st;   /* every count, or sixteenths */
        if (c > most)
            break;
        if (c > last && (st == 1 || arch_moe_count_ok(e, c)))
            cnt[nc++] = c;
        last = c;
    }
    /* counts below the top-k (every expert runs: pruning caps top-k at the count) are priced
       along the capped counts, so the smallest count and the top-k are always among them */
    int kc = e ? (e->top_k + st - 1) / st * st : 0, ends[2] = {st, kc};
    for (int i = 0; e && i < 2; i++)
        if (ends[i] <= most && (st == 1 || arch_moe_count_ok(e, ends[i])))
            cm_insert_distinct(cnt, &nc, 18, ends[i]);
    /* narrower experts first (up to 5 of the counts, evenly spread, the most among them, and
       the smallest count and the top-k), then every count at the parent's width: the grid ends
       with the parent's own MLP */
    int w[3], nw = e && moe_widths ? cal_moe_widths(e->expert_ffn_dim, w) : 0, nar[7], nn = 0;
    for (int j = 0, take = nc < 5 ? nc : 5; nw && j < take; j++)
        cm_insert_distinct(nar, &nn, 7, cnt[take == 1 ? nc - 1 : j * (nc - 1) / (take - 1)]);
    for (int i = 0; nw && e && i < 2; i++)
        for (int j = 0; j < nc; j++)
            if (cnt[j] == ends[i])
                cm_insert_distinct(nar, &nn, 7, ends[i]);
    for (int i = 0; i < nw; i++)
        for (int j = 0; j < nn && n < max; j++)
            ffn[n++] = cal_moe_code(nar[j], w[i]);
    /* the shared expert at each narrower width, beside the parent's experts (the cost model
       adds its difference to any count and width: cm_moe_cost) */
    int s[3], ns = e && moe_widths && e->shared_ffn_dim ? cal_moe_widths(e->shared_ffn_dim, s) : 0;
    for (int i = 0; i < ns && n < max; i++)
        ffn[n++] = cal_moe_shared_code(s[i]);
    /* and each narrower latent (LatentMoE), beside the parent's experts: the cost model adds
       its difference likewise */
    int d[3], nd = e && moe_widths && e->latent_dim ? cal_moe_widths(e->latent_dim, d) : 0;
    for (int i = 0; i < nd && n < max; i++)
        ffn[n++] = cal_moe_latent_code(d[i]);
    for (int i = 0; i < nc && n < max; i++)
        ffn[n++] = cal_moe_code(cnt[i], 0);
    return n;
}

eng_backend *cal_backend_new(const char *device, const char *precision, int threads, char *err, size_t errlen)
{
    eng_backend *be;
    if (threads > 0 && !strcmp(device, "cpu")) {
        if (!(be = eng_backend_cpu_new(threads))) {
            snprintf(err, errlen, "out of memory creating the CPU backend");
            return NULL;
        }
    } else if (!(be = eng_backend_new(device, err, errlen))) {
        return NULL;
    }
    if (precision && *precision && strcmp(precision, "fp32")) {
        char why[256];
        if (eng_backend_set_precision(be, precision, why, sizeof why)) {
            snprintf(err, errlen, "%s on %s: %s", precision, device, why);
            eng_backend_free(be);
            return NULL;
        }
    }
    return be;
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
    o->quiet_tries = CAL_QUIET_TRIES;
    o->quiet_wait_s = MS_QUIET_WAIT_S;
}

void cal_opts_search_hidden(cal_opts *o, const arch *parent)
{
    int c[4], n = cm_hidden_candidates(parent->hidden_size, c);
    o->n_hidden = 0;
    for (int i = 0; i < n; i++)
        o->hidden[o->n_hidden++] = c[i];
}

int cal_random_arch(const arch *parent, uint64_t *rng, arch *out, int moe_widths)
{
    int H, KV, F;
    parent_dims(parent, &H, &KV, &F);
    int group = H && KV ? H / KV : 1, hybrid = arch_hybrid(parent);   /* blocks where the parent's are */
    arch_layer *tmp = calloc((size_t)(parent->n_layers > 0 ? parent->n_layers : 1), sizeof *tmp);
    if (!tmp)
        return -1;
    /* a LatentMoE: one latent for the whole arch (as HF and GGUF hold it), drawn only then so
       that other parents' draws stay as they were */
    const arch_moe *fm = arch_first_moe(parent, NULL);
    int dl[3], nd = fm && fm->latent_dim && moe_widths ? cal_moe_widths(fm->latent_dim, dl) : 0;
    int latent = nd ? (int)(eng_xorshift64(rng) % (uint64_t)(nd + 1)) : 0;
    latent = latent < nd ? dl[latent] : 0;   /* 0: the parent's */
    int n = 0;
    for (int i = 0; i < parent->n_layers; i++) {
        if (eng_xorshift64(rng) % 10 == 0 && parent->n_layers > 1)
            continue;   /* removed layer */
        arch_layer *l = &tmp[n];
        memset(l, 0, sizeof *l);
        l->source_layer = i;
        const arch_mamba *pm = &parent->layers[i].mamba;
        if (pm->n_heads && eng_xorshift64(rng) % 7 != 0) {   /* a Mamba layer: a head count per group */
            int per = pm->n_heads / pm->n_groups;
            cal_mixer_apply(parent, pm->n_groups * (1 + (int)(eng_xorshift64(rng) % (uint64_t)per)), -1, l);
        } else if (H && !pm->n_heads && (!hybrid || parent->layers[i].n_heads) && eng_xorshift64(rng) % 7 != 0) {
            if (eng_xorshift64(rng) % 5 == 0) {
                int k = 1 + (int)(eng_xorshift64(rng) % (uint64_t)group);
                l->n_heads = k * KV;
                l->n_kv_heads = KV;
            } else {
                int g = 1 + (int)(eng_xorshift64(rng) % (uint64_t)KV);
                l->n_heads = g * group;
                l->n_kv_heads = g;
            }
        }
        const arch_moe *pe = &parent->layers[i].moe;
        int mlp_here = !hybrid || parent->layers[i].ffn_dim > 0;
        if (pe->n_experts && (eng_xorshift64(rng) % 7 != 0 || l->n_heads == 0)) {
            int st = arch_moe_grouped(pe) ? pe->n_group : 1, c = st * (1 + (int)(eng_xorshift64(rng) %
                                                                                  (uint64_t)(pe->n_experts / st)));
            int w[3], nw = moe_widths ? cal_moe_widths(pe->expert_ffn_dim, w) : 0;
            int pick = nw ? (int)(eng_xorshift64(rng) % (uint64_t)(nw + 1)) : nw;   /* nw: the parent's width */
            cal_mlp_apply(parent, cal_moe_code(arch_moe_count_ok(pe, c) ? c : pe->n_experts, pick < nw ? w[pick] : 0), l);
            int sw[3], ns = moe_widths && pe->shared_ffn_dim ? cal_moe_widths(pe->shared_ffn_dim, sw) : 0;
            int sp = ns ? (int)(eng_xorshift64(rng) % (uint64_t)(ns + 1)) : ns;   /* ns: the parent's shared width */
            if (sp < ns)
                l->moe.shared_ffn_dim = sw[sp];
            if (latent && l->moe.latent_dim)
                l->moe.latent_dim = latent;
        } else if (F && mlp_here && !pe->n_experts && (eng_xorshift64(rng) % 7 != 0 || !arch_layer_has_mixer(l))) {
            int lo = F / 16 / 8, hi = F / 8;
            if (lo < 1)
                lo = 1;
            if (hi < lo)
                hi = lo;
            l->ffn_dim = 8 * (lo + (int)(eng_xorshift64(rng) % (uint64_t)(hi - lo + 1)));
            if (l->ffn_dim > F)
                l->ffn_dim = F;
        }
        if (!arch_layer_has_mixer(l) && !arch_layer_has_mlp(l))
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

