/* compress/rank.c — activation-importance scores from calibration forwards, layer
 * importance from gated-off forwards, the sorting permutations, their application to
 * the weights (through prune_gather, so reordering and slicing share one code path),
 * and the JSON artifact. Calibration batches are read from the stream's start, so the
 * same stream and options give the same ranking.
 */
#include "compress/rank.h"
#include "storage/fileio.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/prune.h"

void rank_free(rank_result *r)
{
    if (!r)
        return;
    free(r->hidden_score);
    free(r->hidden_perm);
    for (int l = 0; l < r->n_layers && r->layers; l++) {
        rank_layer *L = &r->layers[l];
        free(L->ffn_score);
        free(L->ffn_perm);
        free(L->head_score);
        free(L->head_perm);
        free(L->group_score);
        free(L->group_perm);
        free(L->expert_score);
        free(L->expert_perm);
        free(L->expert_share);
        free(L->unit_score);
        free(L->unit_perm);
        free(L->shared_score);
        free(L->shared_perm);
        free(L->latent_score);
        free(L->latent_perm);
        free(L->mamba_score);
        free(L->mamba_perm);
    }
    free(r->layers);
    memset(r, 0, sizeof *r);
}

/* Allocate r's arrays for shape a (scores zeroed, permutations identity). */
static int rank_alloc(rank_result *r, const arch *a)
{
    memset(r, 0, sizeof *r);
    r->hidden_size = a->hidden_size;
    r->n_layers = a->n_layers;
    r->hidden_score = calloc((size_t)a->hidden_size, sizeof(double));
    r->hidden_perm = calloc((size_t)a->hidden_size, sizeof(int));
    r->layers = calloc((size_t)(a->n_layers > 0 ? a->n_layers : 1), sizeof *r->layers);
    if (!r->hidden_score || !r->hidden_perm || !r->layers)
        return -1;
    for (int c = 0; c < a->hidden_size; c++)
        r->hidden_perm[c] = c;
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *al = &a->layers[l];
        rank_layer *L = &r->layers[l];
        L->n_heads = al->n_heads;
        L->n_kv_heads = al->n_heads ? al->n_kv_heads : 0;
        L->ffn_dim = al->ffn_dim;
        L->n_experts = al->moe.n_experts;
        size_t ne = (size_t)(L->n_experts > 0 ? L->n_experts : 1);
        L->expert_score = calloc(ne, sizeof(double));
        L->expert_perm = calloc(ne, sizeof(int));
        L->expert_share = calloc(ne, sizeof(double));
        if (!L->expert_score || !L->expert_perm || !L->expert_share)
            return -1;
        for (int i = 0; i < L->n_experts; i++)
            L->expert_perm[i] = i;
        L->expert_ffn = L->n_experts ? al->moe.expert_ffn_dim : 0;
        L->shared_ffn = L->n_experts ? al->moe.shared_ffn_dim : 0;
        size_t nu = (size_t)L->n_experts * (size_t)L->expert_ffn, ns = (size_t)L->shared_ffn;
        L->unit_score = calloc(nu ? nu : 1, sizeof(double));
        L->unit_perm = calloc(nu ? nu : 1, sizeof(int));
        L->shared_score = calloc(ns ? ns : 1, sizeof(double));
        L->shared_perm = calloc(ns ? ns : 1, sizeof(int));
        if (!L->unit_score || !L->unit_perm || !L->shared_score || !L->shared_perm)
            return -1;
        for (size_t i = 0; i < nu; i++)
            L->unit_perm[i] = (int)(i % (size_t)L->expert_ffn);
        for (size_t i = 0; i < ns; i++)
            L->shared_perm[i] = (int)i;
        L->latent = L->n_experts ? al->moe.latent_dim : 0;
        L->latent_score = calloc((size_t)(L->latent > 0 ? L->latent : 1), sizeof(double));
        L->latent_perm = calloc((size_t)(L->latent > 0 ? L->latent : 1), sizeof(int));
        if (!L->latent_score || !L->latent_perm)
            return -1;
        for (int i = 0; i < L->latent; i++)
            L->latent_perm[i] = i;
        L->n_egroups = arch_moe_grouped(&al->moe) ? al->moe.n_group : 1;
        L->n_mamba = al->mamba.n_heads;
        L->n_mgroups = al->mamba.n_heads ? al->mamba.n_groups : 0;
        L->mamba_score = calloc((size_t)(L->n_mamba > 0 ? L->n_mamba : 1), sizeof(double));
        L->mamba_perm = calloc((size_t)(L->n_mamba > 0 ? L->n_mamba : 1), sizeof(int));
        if (!L->mamba_score || !L->mamba_perm)
            return -1;
        for (int i = 0; i < L->n_mamba; i++)
            L->mamba_perm[i] = i;
        size_t nf = (size_t)(L->ffn_dim > 0 ? L->ffn_dim : 1), nh = (size_t)(L->n_heads > 0 ? L->n_heads : 1),
               ng = (size_t)(L->n_kv_heads > 0 ? L->n_kv_heads : 1);
        L->ffn_score = calloc(nf, sizeof(double));
        L->ffn_perm = calloc(nf, sizeof(int));
        L->head_score = calloc(nh, sizeof(double));
        L->head_perm = calloc(nh, sizeof(int));
        L->group_score = calloc(ng, sizeof(double));
        L->group_perm = calloc(ng, sizeof(int));
        if (!L->ffn_score || !L->ffn_perm || !L->head_score || !L->head_perm || !L->group_score || !L->group_perm)
            return -1;
        for (int i = 0; i < L->ffn_dim; i++)
            L->ffn_perm[i] = i;
        for (int i = 0; i < L->n_heads; i++)
            L->head_perm[i] = i;
        for (int i = 0; i < L->n_kv_heads; i++)
            L->group_perm[i] = i;
    }
    return 0;
}

/* Sort idx[0..n) by descending score[idx], ties by ascending index (insertion-stable
 * merge via qsort on pairs). */
typedef struct {
    double s;
    int i;
} scored;

static int cmp_scored(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->s > y->s)
        return -1;
    if (x->s < y->s)
        return 1;
    return (x->i > y->i) - (x->i < y->i);
}

static int sort_desc(const double *score, const int *idx, int n, int *out)
{
    if (n <= 0)
        return 0;
    scored *v = malloc((size_t)n * sizeof *v);
    if (!v)
        return -1;
    for (int k = 0; k < n; k++) {
        v[k].i = idx ? idx[k] : k;
        v[k].s = score[v[k].i];
        if (isnan(v[k].s))
            v[k].s = -INFINITY;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_scored);
    for (int k = 0; k < n; k++)
        out[k] = v[k].i;
    free(v);
    return 0;
}

/* Permutations from the scores in r (group sums recomputed from head scores). */
static int rank_sort(rank_result *r)
{
    if (sort_desc(r->hidden_score, NULL, r->hidden_size, r->hidden_perm))
        return -1;
    for (int l = 0; l < r->n_layers; l++) {
        rank_layer *L = &r->layers[l];
        if (sort_desc(L->ffn_score, NULL, L->ffn_dim, L->ffn_perm))
            return -1;
        /* experts in their routing groups: a group's membership is part of the routing, so an
           expert moved to another group would change the model */
        for (int g = 0, per = L->n_experts / L->n_egroups; L->n_experts && g < L->n_egroups; g++) {
            int members[4096];   /* <= n_experts <= 4096 (arch_validate) */
            for (int j = 0; j < per; j++)
                members[j] = g * per + j;
            if (sort_desc(L->expert_score, members, per, L->expert_perm + g * per))
                return -1;
        }
        for (int x = 0; x < L->n_experts; x++) {   /* each expert's units, in its own order */
            size_t at = (size_t)x * L->expert_ffn;
            if (sort_desc(L->unit_score + at, NULL, L->expert_ffn, L->unit_perm + at))
                return -1;
        }
        if (sort_desc(L->shared_score, NULL, L->shared_ffn, L->shared_perm) ||
            sort_desc(L->latent_score, NULL, L->latent, L->latent_perm))
            return -1;
        for (int g = 0, per = L->n_mgroups ? L->n_mamba / L->n_mgroups : 0; g < L->n_mgroups; g++) {
            int members[4096];   /* <= n_heads <= 4096 (arch_validate) */
            for (int j = 0; j < per; j++)
                members[j] = g * per + j;
            if (sort_desc(L->mamba_score, members, per, L->mamba_perm + g * per))
                return -1;
        }
        if (L->n_heads == 0)
            continue;
        int grp = L->n_heads / L->n_kv_heads;
        for (int g = 0; g < L->n_kv_heads; g++) {
            L->group_score[g] = 0;
            for (int j = 0; j < grp; j++)
                L->group_score[g] += L->head_score[g * grp + j];
        }
        if (r->keep_kv) {
            for (int g = 0; g < L->n_kv_heads; g++)
                L->group_perm[g] = g;
        } else if (sort_desc(L->group_score, NULL, L->n_kv_heads, L->group_perm)) {
            return -1;
        }
        int *members = malloc((size_t)grp * sizeof *members);
        if (!members)
            return -1;
        for (int g = 0; g < L->n_kv_heads; g++) {
            int pg = L->group_perm[g];
            for (int j = 0; j < grp; j++)
                members[j] = pg * grp + j;
            if (sort_desc(L->head_score, members, grp, L->head_perm + g * grp)) {
                free(members);
                return -1;
            }
        }
        free(members);
    }
    return 0;
}

/* The layer-skip losses (base_loss; each layer's skip_attn, skip_mlp, skip_layer) on
 * n_batches calibration batches, block by block (eng_stepper): the stream at each layer's
 * input is kept, so a variant runs only the layers from the one it leaves out, about half
 * the model on average where a masked forward of the whole model ran before. Each batch's
 * variants tick *done. 0, 1 when the progress callback stops it, or -1 with err. */
static int skip_losses(eng_model *m, const td_stream *calib, const rank_opts *o, int n_batches, int *tok, int *tgt,
                       rank_result *out, int64_t *done, int64_t total, char *err, size_t errlen)
{
    const arch *a = &m->a;
    eng_backend *be = m->be;
    int L = a->n_layers;
    int64_t per = (int64_t)o->B * o->T;
    size_t bytes = sizeof(float) * (size_t)per * (size_t)a->hidden_size;
    double *sum = calloc((size_t)(3 * L + 1), sizeof *sum);   /* [which * L + l], base at 3L */
    float *keep = be->alloc(be, bytes);
    eng_stepper *s = NULL;
    int rc = -1;
    uint64_t cursor = 0;
    if (!sum || !keep) {
        snprintf(err, errlen, "out of memory for the layer-skip losses");
        goto done;
    }
    for (int b = 0; b < n_batches; b++) {
        if (td_batch(calib, &cursor, o->B, o->T, tok, tgt)) {
            snprintf(err, errlen, "calibration stream too short (%zu tokens) for T=%d", calib->n, o->T);
            goto done;
        }
        if (!(s = eng_stepper_new(m, tok, o->B, o->T, o->B, err, errlen)))
            goto done;
        for (int l = 0; l < L; l++) {
            eng_stepper_stream(s, keep, 0);   /* layer l's input */
            for (int which = 0; which < 3; which++) {   /* leave out (skip bits which + 1): mixer, MLP, both */
                if ((which == 0 && !arch_layer_has_mixer(&a->layers[l])) ||
                    (which == 1 && !arch_layer_has_mlp(&a->layers[l]))) {
                    ++*done;
                    continue;
                }
                eng_stepper_stream(s, keep, 1);
                double ce;
                if (eng_stepper_run(s, l, L, which + 1, err, errlen) || eng_stepper_loss(s, tgt, &ce, err, errlen))
                    goto done;
                sum[which * L + l] += ce;
                if (o->progress && o->progress(o->progress_ctx, ++*done, total)) {
                    rc = 1;
                    goto done;
                }
            }
            eng_stepper_stream(s, keep, 1);   /* on to layer l + 1's input */
            if (eng_stepper_run(s, l, l + 1, 0, err, errlen))
                goto done;
        }
        double ce;
        if (eng_stepper_loss(s, tgt, &ce, err, errlen))
            goto done;
        sum[3 * L] += ce;
        eng_stepper_free(s);
        s = NULL;
        if (o->progress && o->progress(o->progress_ctx, ++*done, total)) {
            rc = 1;
            goto done;
        }
    }
    double count = (double)per * n_batches;
    out->base_loss = sum[3 * L] / count;
    for (int l = 0; l < L; l++) {
        rank_layer *R = &out->layers[l];
        R->skip_attn = arch_layer_has_mixer(&a->layers[l]) ? sum[l] / count - out->base_loss : 0;
        R->skip_mlp = arch_layer_has_mlp(&a->layers[l]) ? sum[L + l] / count - out->base_loss : 0;
        R->skip_layer = sum[2 * L + l] / count - out->base_loss;
    }
    out->layer_tokens = per * n_batches;
    rc = 0;
done:
    eng_stepper_free(s);
    if (keep)
        be->free(be, keep, bytes);
    free(sum);
    return rc;
}

void rank_opts_default(rank_opts *o)
{
    memset(o, 0, sizeof *o);
    o->tokens = 32768;
    o->layer_tokens = 2048;
    o->obs_tokens = 16384;
    o->B = 4;
    o->T = 256;
}

int rank_opts_fit(rank_opts *o, size_t n, char *err, size_t errlen)
{
    if (n < (size_t)o->T + 1) {
        o->T = n > 1 ? (int)n - 1 : 0;
        o->B = 1;
    }
    if (o->T < RANK_MIN_SEQ) {
        snprintf(err, errlen, "the calibration text holds only %zu tokens", n);
        return -1;
    }
    if ((int64_t)n < o->tokens)
        o->tokens = (int64_t)n;
    if ((int64_t)n < o->layer_tokens)
        o->layer_tokens = (int64_t)n;
    if ((int64_t)n < o->obs_tokens)
        o->obs_tokens = (int64_t)n;
    return 0;
}

/* A LatentMoE layer's latent channel scores from its sums (eng_act_stats.latent_abs): each
 * channel's share of the input side's total plus its share of the output side's. */
static void latent_scores(rank_layer *L, const double *sums)
{
    double in = 0, out = 0;
    for (int j = 0; sums && j < L->latent; j++)
        in += sums[j], out += sums[L->latent + j];
    for (int j = 0; sums && j < L->latent; j++)
        L->latent_score[j] = (in > 0 ? sums[j] / in : 0) + (out > 0 ? sums[L->latent + j] / out : 0);
}

int rank_compute(eng_model *m, const td_stream *calib, const rank_opts *o, rank_result *out, char *err,
                 size_t errlen)
{
    const arch *a = &m->a;
    if (o->B <= 0 || o->T <= 0 || o->tokens <= 0) {
        snprintf(err, errlen, "ranking needs B, T and tokens > 0");
        return -1;
    }
    if (calib->n < (size_t)o->T + 1) {
        snprintf(err, errlen, "calibration stream has %zu tokens, fewer than T+1 = %d", calib->n, o->T + 1);
        return -1;
    }
    if (rank_alloc(out, a)) {
        rank_free(out);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    out->keep_kv = o->keep_kv;
    int64_t per = (int64_t)o->B * o->T;
    int n_stat = (int)((o->tokens + per - 1) / per);
    int n_layer_b = o->layer_tokens > 0 ? (int)((o->layer_tokens + per - 1) / per) : 0;
    int64_t total_fwd = n_stat + (n_layer_b ? (int64_t)n_layer_b * (1 + 3 * a->n_layers) : 0) +
                        (o->ffn_obs ? a->n_layers : 0), done = 0;
    int *tok = malloc((size_t)per * sizeof *tok), *tgt = malloc((size_t)per * sizeof *tgt);
    eng_act_stats *st = eng_stats_new(m);
    if (!tok || !tgt || !st) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    uint64_t cursor = 0;
    for (int b = 0; b < n_stat; b++) {
        if (td_batch(calib, &cursor, o->B, o->T, tok, NULL)) {
            snprintf(err, errlen, "calibration batch failed");
            goto fail;
        }
        eng_fwd_args fa = {.tokens = tok, .B = o->B, .T = o->T, .logits_mode = ENG_LOGITS_NONE, .stats = st};
        if (eng_forward(m, &fa, err, errlen))
            goto fail;
        if (o->progress && o->progress(o->progress_ctx, ++done, total_fwd))
            goto stopped;
    }
    double inv = st->tokens > 0 ? 1.0 / (double)st->tokens : 0;
    out->tokens = st->tokens;
    for (int c = 0; c < a->hidden_size; c++)
        out->hidden_score[c] = st->hidden_abs[c] * inv;
    for (int l = 0; l < a->n_layers; l++) {
        rank_layer *L = &out->layers[l];
        for (int i = 0; i < L->ffn_dim; i++)
            L->ffn_score[i] = st->ffn_abs[l][i] * inv;
        for (int i = 0; i < L->n_heads; i++)
            L->head_score[i] = st->head_norm[l][i] * inv;
        for (int i = 0; i < L->n_mamba; i++)
            L->mamba_score[i] = st->head_norm[l][i] * inv;
        double slots = 0;
        for (int i = 0; i < L->n_experts; i++)
            slots += st->expert_tokens[l][i];
        for (int i = 0; i < L->n_experts; i++) {
            L->expert_score[i] = st->expert_mass[l][i] * inv;
            L->expert_share[i] = slots > 0 ? st->expert_tokens[l][i] / slots : 0;
        }
        for (size_t i = 0; i < (size_t)L->n_experts * L->expert_ffn; i++)
            L->unit_score[i] = st->expert_unit[l][i] * inv;
        for (int i = 0; i < L->shared_ffn; i++)
            L->shared_score[i] = st->shared_unit[l][i] * inv;
        latent_scores(L, st->latent_abs[l]);
    }
    if (n_layer_b) {
        int rc = skip_losses(m, calib, o, n_layer_b, tok, tgt, out, &done, total_fwd, err, errlen);
        if (rc == 1)
            goto stopped;
        if (rc)
            goto fail;
    }
    if (o->ffn_obs) {
        int rc = rank_obs_ffn(m, calib, o, out, done, total_fwd, err, errlen);
        if (rc == 1)
            goto stopped;
        if (rc)
            goto fail;
    }
    if (rank_sort(out)) {
        snprintf(err, errlen, "out of memory sorting");
        goto fail;
    }
    eng_stats_free(st, a->n_layers);
    free(tok);
    free(tgt);
    return 0;
stopped:
    eng_stats_free(st, a->n_layers);
    free(tok);
    free(tgt);
    rank_free(out);
    return 1;
fail:
    if (st)
        eng_stats_free(st, a->n_layers);
    free(tok);
    free(tgt);
    rank_free(out);
    return -1;
}

int rank_check(const rank_result *r, const eng_model *m, char *err, size_t errlen)
{
    const arch *a = &m->a;
    if (r->hidden_size != a->hidden_size || r->n_layers != a->n_layers) {
        snprintf(err, errlen, "ranking is for hidden %d x %d layers, model has %d x %d", r->hidden_size,
                 r->n_layers, a->hidden_size, a->n_layers);
        return -1;
    }
    for (int l = 0; l < a->n_layers; l++) {
        const rank_layer *L = &r->layers[l];
        const arch_layer *al = &a->layers[l];
        if (L->n_experts &&
            (L->expert_ffn != al->moe.expert_ffn_dim || L->shared_ffn != al->moe.shared_ffn_dim)) {
            snprintf(err, errlen, "ranking layer %d orders experts of %d units (shared %d), the model's have %d (%d)%s",
                     l, L->expert_ffn, L->shared_ffn, al->moe.expert_ffn_dim, al->moe.shared_ffn_dim,
                     L->expert_ffn ? "" : ": a ranking without expert units, rank the parent again");
            return -1;
        }
        if (L->n_experts && L->latent != al->moe.latent_dim) {
            snprintf(err, errlen, "ranking layer %d orders a latent of %d channels, the model's experts have %d%s", l,
                     L->latent, al->moe.latent_dim, L->latent ? "" : ": a ranking without latent channels, rank the "
                     "parent again");
            return -1;
        }
        if (L->ffn_dim != al->ffn_dim || L->n_heads != al->n_heads || L->n_experts != al->moe.n_experts ||
            (al->n_heads && L->n_kv_heads != al->n_kv_heads) || L->n_mamba != al->mamba.n_heads ||
            (L->n_mamba && L->n_mgroups != al->mamba.n_groups)) {
            snprintf(err, errlen, "ranking layer %d (heads %d/%d, ffn %d) does not match the model's (%d/%d, %d)",
                     l, L->n_heads, L->n_kv_heads, L->ffn_dim, al->n_heads, al->n_kv_heads, al->ffn_dim);
            return -1;
        }
    }
    return 0;
}

static int *dup_ints(const int *v, int n)
{
    int *c = malloc((size_t)(n > 0 ? n : 1) * sizeof *c);
    if (c && n > 0)
        memcpy(c, v, (size_t)n * sizeof *c);
    return c;
}

int rank_apply(eng_model *m, const rank_result *r, char *err, size_t errlen)
{
    if (rank_check(r, m, err, errlen))
        return -1;
    prune_select sel = {0};
    sel.n_hidden = r->hidden_size;
    sel.n_layers = r->n_layers;
    sel.hidden = dup_ints(r->hidden_perm, r->hidden_size);
    sel.layers = calloc((size_t)(r->n_layers > 0 ? r->n_layers : 1), sizeof *sel.layers);
    if (!sel.hidden || !sel.layers)
        goto oom;
    for (int l = 0; l < r->n_layers; l++) {
        const rank_layer *L = &r->layers[l];
        prune_layer_sel *ls = &sel.layers[l];
        ls->src = l;
        ls->nq = L->n_heads;
        ls->nkv = L->n_heads ? L->n_kv_heads : 0;
        ls->nffn = L->ffn_dim;
        ls->q = dup_ints(L->head_perm, ls->nq);
        ls->kv = dup_ints(L->group_perm, ls->nkv);
        ls->ffn = dup_ints(L->ffn_perm, ls->nffn);
        ls->nexp = L->n_experts;
        ls->exp = dup_ints(L->expert_perm, ls->nexp);
        ls->nef = L->n_experts ? L->expert_ffn : 0;   /* target expert e is parent expert exp[e] */
        ls->nsf = L->shared_ffn;
        ls->ef = malloc(sizeof(int) * ((size_t)ls->nexp * ls->nef + 1));
        ls->sf = dup_ints(L->shared_perm, ls->nsf);
        for (int e = 0; ls->ef && ls->exp && e < ls->nexp; e++)
            memcpy(ls->ef + (size_t)e * ls->nef, L->unit_perm + (size_t)ls->exp[e] * ls->nef, sizeof(int) * (size_t)ls->nef);
        if (!ls->ef || !ls->sf)
            goto oom;
        ls->nm = L->n_mamba;
        ls->mh = dup_ints(L->mamba_perm, ls->nm);
        ls->nlat = L->latent;
        ls->lat = dup_ints(L->latent_perm, ls->nlat);
        if (!ls->q || !ls->kv || !ls->ffn || !ls->exp || !ls->mh || !ls->lat)
            goto oom;
    }
    eng_model tmp;
    int rc = prune_gather(m, &m->a, &sel, &tmp, err, errlen);
    prune_select_free(&sel);
    if (rc)
        return -1;
    if (tmp.n_params != m->n_params) {
        eng_model_free(&tmp);
        snprintf(err, errlen, "permuted model has %zu parameters, parent %zu", tmp.n_params, m->n_params);
        return -1;
    }
    m->be->copy(m->be, m->params, tmp.params, m->n_params * sizeof(float));
    eng_model_free(&tmp);
    return 0;
oom:
    prune_select_free(&sel);
    snprintf(err, errlen, "out of memory");
    return -1;
}

void rank_layer_order(const rank_result *r, int *order)
{
    double *s = malloc((size_t)(r->n_layers > 0 ? r->n_layers : 1) * sizeof *s);
    if (!s || !r->layer_tokens) {
        for (int l = 0; l < r->n_layers; l++)
            order[l] = l;
        free(s);
        return;
    }
    for (int l = 0; l < r->n_layers; l++)
        s[l] = -r->layers[l].skip_layer;   /* descending of -x = ascending of x */
    if (sort_desc(s, NULL, r->n_layers, order))
        for (int l = 0; l < r->n_layers; l++)
            order[l] = l;
    free(s);
}

/* ---- JSON ------------------------------------------------------------------------ */

static json_t *dbl_array(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_real(isfinite(v[i]) ? v[i] : 0.0))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *int_array(const int *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(v[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *score_perm(const double *s, const int *p, int n)
{
    return json_pack("{s:o*,s:o*}", "score", dbl_array(s, n), "perm", int_array(p, n));
}

/* A MoE layer's "experts" object. NEW reference, NULL out of memory. */
static json_t *experts_json(const rank_layer *L)
{
    json_t *units = json_array();
    for (int x = 0; units && x < L->n_experts; x++) {
        size_t at = (size_t)x * L->expert_ffn;
        if (json_array_append_new(units, score_perm(L->unit_score + at, L->unit_perm + at, L->expert_ffn))) {
            json_decref(units);
            units = NULL;
        }
    }
    json_t *o = json_pack("{s:i,s:i,s:o*,s:o*,s:i,s:o*,s:i}", "n_experts", L->n_experts, "n_groups", L->n_egroups,
                          "score_perm", score_perm(L->expert_score, L->expert_perm, L->n_experts), "share",
                          dbl_array(L->expert_share, L->n_experts), "expert_ffn_dim", L->expert_ffn, "units", units,
                          "shared_ffn_dim", L->shared_ffn);
    if (o && ((L->shared_ffn &&
               json_object_set_new(o, "shared", score_perm(L->shared_score, L->shared_perm, L->shared_ffn))) ||
              (L->latent && (json_object_set_new(o, "latent_dim", json_integer(L->latent)) ||
                             json_object_set_new(o, "latent", score_perm(L->latent_score, L->latent_perm, L->latent)))))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* A layer-skip loss as JSON holds it (finite): one that overflowed or is NaN (skipping the
 * layer broke the model: rank_layer_order puts it last, most important) as 1e300, beyond any
 * loss, which keeps that order when read back (DBL_MAX itself, written at the file's
 * precision, rounds up past the largest double and does not read back). */
double rank_skip_finite(double x)
{
    return isfinite(x) ? x : x < 0 ? -1e300 : 1e300;
}

json_t *rank_to_json(const rank_result *r)
{
    json_t *layers = json_array();
    if (!layers)
        return NULL;
    for (int l = 0; l < r->n_layers; l++) {
        const rank_layer *L = &r->layers[l];
        json_t *o = json_pack("{s:i,s:i,s:i,s:o*,s:o*,s:o*,s:{s:f,s:f,s:f}}", "n_heads", L->n_heads, "n_kv_heads",
                              L->n_kv_heads, "ffn_dim", L->ffn_dim, "ffn",
                              score_perm(L->ffn_score, L->ffn_perm, L->ffn_dim), "heads",
                              score_perm(L->head_score, L->head_perm, L->n_heads), "groups",
                              score_perm(L->group_score, L->group_perm, L->n_kv_heads), "skip", "attention",
                              rank_skip_finite(L->skip_attn), "mlp", rank_skip_finite(L->skip_mlp), "layer",
                              rank_skip_finite(L->skip_layer));
        if (o && L->n_experts && json_object_set_new(o, "experts", experts_json(L))) {
            json_decref(o);
            o = NULL;
        }
        if (o && L->n_mamba &&
            json_object_set_new(o, "mamba", json_pack("{s:i,s:i,s:o*}", "n_heads", L->n_mamba, "n_groups",
                                                      L->n_mgroups, "score_perm",
                                                      score_perm(L->mamba_score, L->mamba_perm, L->n_mamba)))) {
            json_decref(o);
            o = NULL;
        }
        if (!o || json_array_append_new(layers, o)) {
            json_decref(layers);
            return NULL;
        }
    }
    return json_pack("{s:i,s:i,s:i,s:I,s:I,s:b,s:s,s:f,s:o*,s:o}", "version", 1, "hidden_size", r->hidden_size,
                     "n_layers", r->n_layers, "tokens", (json_int_t)r->tokens, "layer_tokens",
                     (json_int_t)r->layer_tokens, "keep_kv", r->keep_kv, "ffn_order",
                     r->ffn_obs ? "obs" : "activation", "base_loss",
                     isfinite(r->base_loss) ? r->base_loss : 0.0, "hidden",
                     score_perm(r->hidden_score, r->hidden_perm, r->hidden_size), "layers", layers);
}

/* Read {"score":[n], "perm":[n]} into s and p, checking p is a permutation of 0..n-1. */
static int read_score_perm(json_t *o, int n, double *s, int *p, const char *where, char *err, size_t errlen)
{
    json_t *js = json_object_get(o, "score"), *jp = json_object_get(o, "perm");
    if (!json_is_array(js) || !json_is_array(jp) || (int)json_array_size(js) != n || (int)json_array_size(jp) != n) {
        snprintf(err, errlen, "%s: score/perm must be arrays of %d", where, n);
        return -1;
    }
    unsigned char *seen = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!seen) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        json_t *x = json_array_get(js, (size_t)i), *y = json_array_get(jp, (size_t)i);
        if (!json_is_number(x) || !json_is_integer(y) || json_integer_value(y) < 0 || json_integer_value(y) >= n ||
            seen[json_integer_value(y)]) {
            free(seen);
            snprintf(err, errlen, "%s: entry %d is not a number / not a permutation index", where, i);
            return -1;
        }
        s[i] = json_number_value(x);
        p[i] = (int)json_integer_value(y);
        seen[p[i]] = 1;
    }
    free(seen);
    return 0;
}

/* Layer l's "experts" object into L (allocated for it): the experts' order and shares, each
 * expert's unit order and the shared expert's. 0, or -1 with err. */
static int read_experts(json_t *ex, rank_layer *L, int l, char *err, size_t errlen)
{
    char where[64];
    json_t *sh = json_object_get(ex, "share");
    snprintf(where, sizeof where, "layers[%d].experts", l);
    if (read_score_perm(json_object_get(ex, "score_perm"), L->n_experts, L->expert_score, L->expert_perm, where, err,
                        errlen))
        return -1;
    for (int i = 0, per = L->n_experts / L->n_egroups; i < L->n_experts; i++) {
        L->expert_share[i] = json_number_value(json_array_get(sh, (size_t)i));
        if (L->expert_perm[i] / per != i / per) {
            snprintf(err, errlen, "layers[%d].experts: expert %d is not in routing group %d", l, L->expert_perm[i],
                     i / per);
            return -1;
        }
    }
    json_t *units = json_object_get(ex, "units");
    if (L->expert_ffn && (int)json_array_size(units) != L->n_experts) {
        snprintf(err, errlen, "layers[%d].experts.units: must hold one order per expert", l);
        return -1;
    }
    for (int x = 0; L->expert_ffn && x < L->n_experts; x++) {
        size_t at = (size_t)x * L->expert_ffn;
        snprintf(where, sizeof where, "layers[%d].experts.units[%d]", l, x);
        if (read_score_perm(json_array_get(units, (size_t)x), L->expert_ffn, L->unit_score + at, L->unit_perm + at,
                            where, err, errlen))
            return -1;
    }
    snprintf(where, sizeof where, "layers[%d].experts.shared", l);
    if (L->shared_ffn && read_score_perm(json_object_get(ex, "shared"), L->shared_ffn, L->shared_score,
                                         L->shared_perm, where, err, errlen))
        return -1;
    snprintf(where, sizeof where, "layers[%d].experts.latent", l);
    return L->latent && read_score_perm(json_object_get(ex, "latent"), L->latent, L->latent_score, L->latent_perm,
                                        where, err, errlen) ? -1 : 0;
}

int rank_from_json(json_t *j, rank_result *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    json_t *layers = json_object_get(j, "layers");
    json_t *hidden = json_object_get(j, "hidden");
    json_int_t ver = json_integer_value(json_object_get(j, "version"));
    json_int_t C = json_integer_value(json_object_get(j, "hidden_size"));
    if (ver != 1 || !json_is_array(layers) || !json_is_object(hidden) || C <= 0 || C > (1 << 16) ||
        json_array_size(layers) > (1 << 12)) {
        snprintf(err, errlen, "ranking: not a version-1 ranking object");
        return -1;
    }
    arch a;
    if (arch_init(&a, (int)json_array_size(layers))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    a.hidden_size = (int)C;
    for (int l = 0; l < a.n_layers; l++) {
        json_t *o = json_array_get(layers, (size_t)l);
        json_int_t h = json_integer_value(json_object_get(o, "n_heads"));
        json_int_t kv = json_integer_value(json_object_get(o, "n_kv_heads"));
        json_int_t f = json_integer_value(json_object_get(o, "ffn_dim"));
        if (h < 0 || kv < 0 || f < 0 || h > 4096 || f > (1 << 22) || (h > 0 && (kv == 0 || h % kv))) {
            arch_free(&a);
            snprintf(err, errlen, "ranking: layers[%d] has invalid widths", l);
            return -1;
        }
        a.layers[l].n_heads = (int)h;
        a.layers[l].n_kv_heads = (int)kv;
        a.layers[l].ffn_dim = (int)f;
        json_t *ex = json_object_get(o, "experts"), *eg = json_object_get(ex, "n_groups");
        json_int_t e = json_integer_value(json_object_get(ex, "n_experts")), ng = eg ? json_integer_value(eg) : 1;
        if (e < 0 || e > 4096 || ng < 1 || (e && e % ng)) {
            arch_free(&a);
            snprintf(err, errlen, "ranking: layers[%d] has an invalid expert or group count", l);
            return -1;
        }
        json_t *ef = json_object_get(ex, "expert_ffn_dim"), *sf = json_object_get(ex, "shared_ffn_dim");
        json_int_t fe = ef ? json_integer_value(ef) : 0, fs = sf ? json_integer_value(sf) : 0;
        json_int_t lt = json_integer_value(json_object_get(ex, "latent_dim"));
        if (fe < 0 || fs < 0 || fe > (1 << 20) || fs > (1 << 20) || (e && ef && fe < 1) || lt < 0 || lt > 65536) {
            arch_free(&a);
            snprintf(err, errlen, "ranking: layers[%d].experts has invalid unit counts", l);
            return -1;
        }
        a.layers[l].moe.n_experts = (int)e;
        a.layers[l].moe.expert_ffn_dim = (int)fe;   /* 0 when absent: rank_check asks for a new ranking */
        a.layers[l].moe.shared_ffn_dim = (int)fs;
        a.layers[l].moe.latent_dim = (int)lt;   /* 0 when absent: rank_check asks for a new ranking */
        if (ng > 1)   /* grouped routing (rank_init reads the groups from it) */
            a.layers[l].moe.sigmoid = 1, a.layers[l].moe.n_group = (int)ng;
        json_t *mo = json_object_get(o, "mamba");
        json_int_t mh = json_integer_value(json_object_get(mo, "n_heads")), mg = json_integer_value(json_object_get(mo, "n_groups"));
        if (mh < 0 || mh > 4096 || (mh && (mg < 1 || mh % mg))) {
            arch_free(&a);
            snprintf(err, errlen, "ranking: layers[%d] has invalid Mamba heads or groups", l);
            return -1;
        }
        a.layers[l].mamba.n_heads = (int)mh;
        a.layers[l].mamba.n_groups = (int)mg;
    }
    int rc = rank_alloc(out, &a);
    arch_free(&a);
    if (rc) {
        rank_free(out);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    out->tokens = json_integer_value(json_object_get(j, "tokens"));
    out->layer_tokens = json_integer_value(json_object_get(j, "layer_tokens"));
    out->keep_kv = json_is_true(json_object_get(j, "keep_kv"));
    const char *fo = json_string_value(json_object_get(j, "ffn_order"));
    out->ffn_obs = fo && !strcmp(fo, "obs");
    out->base_loss = json_number_value(json_object_get(j, "base_loss"));
    if (read_score_perm(hidden, out->hidden_size, out->hidden_score, out->hidden_perm, "hidden", err, errlen))
        goto fail;
    for (int l = 0; l < out->n_layers; l++) {
        rank_layer *L = &out->layers[l];
        json_t *o = json_array_get(layers, (size_t)l);
        char where[64];
        snprintf(where, sizeof where, "layers[%d].ffn", l);
        if (read_score_perm(json_object_get(o, "ffn"), L->ffn_dim, L->ffn_score, L->ffn_perm, where, err, errlen))
            goto fail;
        snprintf(where, sizeof where, "layers[%d].heads", l);
        if (read_score_perm(json_object_get(o, "heads"), L->n_heads, L->head_score, L->head_perm, where, err, errlen))
            goto fail;
        snprintf(where, sizeof where, "layers[%d].groups", l);
        if (read_score_perm(json_object_get(o, "groups"), L->n_kv_heads, L->group_score, L->group_perm, where, err,
                            errlen))
            goto fail;
        if (L->n_heads) {
            int grp = L->n_heads / L->n_kv_heads;
            for (int i = 0; i < L->n_heads; i++)
                if (L->head_perm[i] / grp != L->group_perm[i / grp]) {
                    snprintf(err, errlen, "layers[%d].heads: head %d is not in KV group %d", l, L->head_perm[i],
                             L->group_perm[i / grp]);
                    goto fail;
                }
        }
        if (L->n_experts && read_experts(json_object_get(o, "experts"), L, l, err, errlen))
            goto fail;
        if (L->n_mamba) {
            snprintf(where, sizeof where, "layers[%d].mamba", l);
            if (read_score_perm(json_object_get(json_object_get(o, "mamba"), "score_perm"), L->n_mamba, L->mamba_score,
                                L->mamba_perm, where, err, errlen))
                goto fail;
            int per = L->n_mamba / L->n_mgroups;
            for (int i = 0; i < L->n_mamba; i++)
                if (L->mamba_perm[i] / per != i / per) {
                    snprintf(err, errlen, "layers[%d].mamba: head %d is not in group %d", l, L->mamba_perm[i], i / per);
                    goto fail;
                }
        }
        json_t *sk = json_object_get(o, "skip");
        L->skip_attn = json_number_value(json_object_get(sk, "attention"));
        L->skip_mlp = json_number_value(json_object_get(sk, "mlp"));
        L->skip_layer = json_number_value(json_object_get(sk, "layer"));
    }
    return 0;
fail:
    rank_free(out);
    return -1;
}

int rank_save(const rank_result *r, const char *path, char *err, size_t errlen)
{
    json_t *j = rank_to_json(r);
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    json_decref(j);
    if (!text) {
        snprintf(err, errlen, "out of memory rendering the ranking");
        return -1;
    }
    int rc = fio_write_atomic(path, text, strlen(text), err, errlen);
    free(text);
    return rc;
}

int rank_load(const char *path, rank_result *out, char *err, size_t errlen)
{
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        memset(out, 0, sizeof *out);
        snprintf(err, errlen, "%s:%d: %s", path, je.line, je.text);
        return -1;
    }
    int rc = rank_from_json(j, out, err, errlen);
    json_decref(j);
    return rc;
}
