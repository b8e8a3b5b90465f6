/* engine/moe.c — the mixture-of-experts MLP (arch_moe): softmax router with top-k choice
 * (renormalized when norm_topk), or Nemotron-H's sigmoid router (correction bias for the choice,
 * grouped top-k, routed scale); SwiGLU or squared-ReLU experts each run as one GEMM over the
 * tokens routed to it (gathered rows, results scattered back with their routing weights), the
 * Qwen2-MoE shared expert with its sigmoid gate (Nemotron-H's ungated), the search's masks
 * (experts, routed units, shared-expert units), the ranking statistics, and the backward of all
 * of it. The routing itself (softmax, top-k, per-expert token lists) runs
 * on the host over the [N, E] router logits; the GEMMs and row moves run on the backend.
 * Training saves nothing of the block but its input: the backward routes and runs the experts
 * again (eng_moe_bwd), so a block costs two expert passes and no [N*k, F] activations.
 *
 * LatentMoE (arch_moe.latent_dim, Nemotron 3 Super): the experts read the block's input projected
 * to the latent (fc1_latent_proj) and their weighted sum is projected back (fc2_latent_proj);
 * the router and the shared expert read the full width.
 *
 * Memory: floats N*(E + k + 1 + 2C' + 3F + 2Lt) forward, + N*(2C' + 3F + E + 2Lt) in backward
 * (F = max of the expert and shared widths, Lt the latent (0 without), C' = max(C, Lt)), ints
 * N*(k + 1); host arrays of the same order. Inference
 * passes its share of the forward workspace (eng_fwd_setup holds it for the call); the
 * training forward and the backward allocate theirs per call (the backward's, the larger:
 * eng_moe_bwd_scratch_bytes).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/moe.h"

#include "engine/model_internal.h"

static int moe_width(const arch_moe *e)
{
    return e->expert_ffn_dim > e->shared_ffn_dim ? e->expert_ffn_dim : e->shared_ffn_dim;
}

static size_t scratch_floats(const arch_moe *e, size_t N, size_t C, int train)
{
    size_t F = (size_t)moe_width(e), E = (size_t)e->n_experts, k = (size_t)e->top_k, Lt = (size_t)e->latent_dim;
    size_t Cm = C > Lt ? C : Lt;
    size_t n = N * (E + k + 1 + 2 * Cm + 3 * F + 2 * Lt);
    if (train)
        n += N * (2 * Cm + 3 * F + E + 2 * Lt);
    return n;
}

size_t eng_moe_scratch_floats(const arch *a, int N, int train)
{
    size_t best = 0;
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].moe.n_experts) {
            size_t b = scratch_floats(&a->layers[l].moe, (size_t)N, (size_t)a->hidden_size, train);
            best = b > best ? b : best;
        }
    return best;
}

size_t eng_moe_scratch_ints(const arch *a, int N)
{
    size_t best = 0;
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].moe.n_experts) {
            size_t b = (size_t)N * ((size_t)a->layers[l].moe.top_k + 1);
            best = b > best ? b : best;
        }
    return best;
}

size_t eng_moe_bwd_scratch_bytes(const arch *a, int N)
{
    size_t best = 0;
    for (int l = 0; l < a->n_layers; l++) {
        const arch_moe *e = &a->layers[l].moe;
        if (!e->n_experts)
            continue;
        size_t b = scratch_floats(e, (size_t)N, (size_t)a->hidden_size, 1) * F4 +
                   (size_t)N * ((size_t)e->top_k + 1) * sizeof(int);
        best = b > best ? b : best;
    }
    return best;
}

/* One call's routing and buffers. */
typedef struct {
    int N, C, E, k, F;
    int D;                       /* the routed experts' width: the latent, else C */
    /* host */
    float *prob;                 /* [N, E] softmax of the router logits */
    int *sel;                    /* [N, k] chosen experts, by falling probability */
    float *wraw;                 /* [N, k] routing weights (renormalized when norm_topk) */
    float *mask;                 /* [E] expert masks (1 without masks) */
    float *bias;                 /* [E] the choice's correction bias (sigmoid routing) */
    float *gscore;               /* [E] group scores of one row (grouped routing; n_group <= E) */
    int *cnt, *off;              /* [E] tokens per expert, offset of its list */
    int *order;                  /* [N*k] token rows, grouped by expert; then [N] identity */
    int *slot;                   /* [N*k] (row*k + slot) of each list entry */
    float *wl;                   /* [N*k] weight of each list entry: wraw * mask */
    float *hbuf;                 /* [max(N*k, N*E, 2N)] host staging */
    double *dp;                  /* [k] */
    /* device */
    float *dev;
    size_t dev_bytes;
    int *idev;
    size_t idev_bytes;
    int borrowed;                /* dev and idev are the caller's (inference workspace) */
    float *logits, *wl_d, *sg, *X, *Y, *g, *u, *h;   /* forward; X, Y [N, max(C, D)] */
    float *XL, *YL;                                 /* [N, D] latent input and output (LatentMoE) */
    float *dY, *dX, *dh, *dg, *du, *dlog;           /* backward */
    float *dYL, *dXL;                               /* [N, D] their gradients (LatentMoE) */
} moe_call;

static void call_free(eng_backend *be, moe_call *c)
{
    if (!c->borrowed) {
        be->free(be, c->dev, c->dev ? c->dev_bytes : 0);
        be->free(be, c->idev, c->idev ? c->idev_bytes : 0);
    }
    free(c->prob);
    free(c->sel);
    free(c->wraw);
    free(c->mask);
    free(c->bias);
    free(c->gscore);
    free(c->cnt);
    free(c->off);
    free(c->order);
    free(c->slot);
    free(c->wl);
    free(c->hbuf);
    free(c->dp);
}

/* Host arrays, and the device scratch: fdev/idev when given (borrowed), else allocated. */
static int call_alloc(eng_model *m, moe_call *c, int l, int N, int train, float *fdev, int *idev)
{
    eng_backend *be = m->be;
    const arch_moe *e = &m->a.layers[l].moe;
    memset(c, 0, sizeof *c);
    c->N = N;
    c->C = m->a.hidden_size;
    c->E = e->n_experts;
    c->k = e->top_k;
    c->F = moe_width(e);
    c->D = arch_moe_io(e, c->C);
    size_t nk = (size_t)N * c->k, ne = (size_t)N * c->E;
    c->prob = malloc(F4 * ne);
    c->sel = malloc(sizeof(int) * nk);
    c->wraw = malloc(F4 * nk);
    c->mask = malloc(F4 * (size_t)c->E);
    c->bias = malloc(F4 * (size_t)c->E);
    c->gscore = malloc(F4 * (size_t)c->E);
    c->cnt = calloc((size_t)c->E, sizeof(int));
    c->off = calloc((size_t)c->E, sizeof(int));
    c->order = malloc(sizeof(int) * (nk + (size_t)N));
    c->slot = malloc(sizeof(int) * nk);
    c->wl = malloc(F4 * nk);
    size_t hb = nk > ne ? nk : ne;
    c->hbuf = malloc(F4 * (hb > 2 * (size_t)N ? hb : 2 * (size_t)N));
    c->dp = malloc(sizeof(double) * (size_t)c->k);
    c->dev_bytes = scratch_floats(e, (size_t)N, (size_t)c->C, train) * F4;
    c->idev_bytes = sizeof(int) * (nk + (size_t)N);
    c->borrowed = fdev && idev;
    c->dev = c->borrowed ? fdev : be->alloc(be, c->dev_bytes);
    c->idev = c->borrowed ? idev : be->alloc(be, c->idev_bytes);
    if (!c->prob || !c->sel || !c->wraw || !c->mask || !c->bias || !c->gscore || !c->cnt || !c->off || !c->order || !c->slot || !c->wl ||
        !c->hbuf || !c->dp || !c->dev || !c->idev) {
        call_free(be, c);
        return -1;
    }
    size_t n = (size_t)N, C = (size_t)(c->C > c->D ? c->C : c->D), F = (size_t)c->F, Lt = (size_t)e->latent_dim;
    float *p = c->dev;
    c->logits = p; p += n * c->E;
    c->wl_d = p; p += nk;
    c->sg = p; p += n;
    c->X = p; p += n * C;
    c->Y = p; p += n * C;
    c->g = p; p += n * F;
    c->u = p; p += n * F;
    c->h = p; p += n * F;
    c->XL = p; p += n * Lt;
    c->YL = p; p += n * Lt;
    if (train) {
        c->dY = p; p += n * C;
        c->dX = p; p += n * C;
        c->dh = p; p += n * F;
        c->dg = p; p += n * F;
        c->du = p; p += n * F;
        c->dYL = p; p += n * Lt;
        c->dXL = p; p += n * Lt;
        c->dlog = p;
    }
    return 0;
}

/* Sigmoid routing (Nemotron-H): prob <- sigmoid(logits); per row the choice by biased scores
 * in the best groups, the weights from the unbiased scores (normalized when norm_topk, then
 * times routed_scale). Fills sel, wraw and the per-expert counts. */
static void route_sigmoid(const arch_moe *e, moe_call *c, const float *bias)
{
    int N = c->N, E = c->E, k = c->k, ng = e->n_group, per = E / ng;
    for (int n = 0; n < N; n++) {
        float *p = c->prob + (size_t)n * E;
        for (int x = 0; x < E; x++)
            p[x] = (float)(1.0 / (1.0 + exp(-(double)p[x])));
        float *ch = c->hbuf;   /* biased scores, experts of dropped groups at -inf */
        for (int x = 0; x < E; x++)
            ch[x] = p[x] + (bias ? bias[x] : 0.0f);
        if (e->topk_group < ng) {
            float *gs = c->gscore;   /* group scores: the sum of each group's two best */
            for (int g = 0; g < ng; g++) {
                float a = -INFINITY, b = -INFINITY;
                for (int x = g * per; x < (g + 1) * per; x++)
                    if (ch[x] > a) {
                        b = a;
                        a = ch[x];
                    } else if (ch[x] > b) {
                        b = ch[x];
                    }
                gs[g] = per > 1 ? a + b : a;
            }
            for (int t = 0; t < ng - e->topk_group; t++) {   /* drop the worst groups */
                int worst = -1;
                for (int g = 0; g < ng; g++)
                    if (gs[g] != INFINITY && (worst < 0 || gs[g] < gs[worst]))
                        worst = g;
                gs[worst] = INFINITY;
                for (int x = worst * per; x < (worst + 1) * per; x++)
                    ch[x] = -INFINITY;
            }
        }
        int *s = c->sel + (size_t)n * k;
        float *w = c->wraw + (size_t)n * k;
        double sum = 0;
        for (int j = 0; j < k; j++) {   /* the largest biased score not yet taken, lower index on ties */
            int best = -1;
            for (int x = 0; x < E; x++) {
                int taken = 0;
                for (int i = 0; i < j; i++)
                    taken |= s[i] == x;
                if (!taken && (best < 0 || ch[x] > ch[best]))
                    best = x;
            }
            s[j] = best;
            w[j] = p[best];
            sum += p[best];
            c->cnt[best]++;
        }
        for (int j = 0; j < k; j++)
            w[j] = (float)((e->norm_topk ? w[j] / (sum + 1e-20) : w[j]) * e->routed_scale);
    }
}

/* Router logits of xn [N, C], softmax (or sigmoid routing), top-k, per-expert lists; uploads
 * the lists, their weights and the identity rows. */
static void route(eng_model *m, int l, const eng_masks *mk, const float *xn, moe_call *c)
{
    eng_backend *be = m->be;
    const eng_layer *L = &m->layers[l];
    const arch_moe *e = &m->a.layers[l].moe;
    int N = c->N, E = c->E, k = c->k, C = c->C;
    be->gemm(be, 0, 1, N, E, C, 1.0f, xn, C, L->router, C, 0.0f, c->logits, E);
    be->to_host(be, c->prob, c->logits, F4 * (size_t)N * E);
    if (L->router_bias)
        be->to_host(be, c->bias, L->router_bias, F4 * (size_t)E);
    if (mk)
        be->to_host(be, c->mask, mk->expert[l], F4 * (size_t)E);
    else
        for (int x = 0; x < E; x++)
            c->mask[x] = 1.0f;
    memset(c->cnt, 0, sizeof(int) * (size_t)E);
    if (e->sigmoid)
        route_sigmoid(e, c, L->router_bias ? c->bias : NULL);
    for (int n = 0; !e->sigmoid && n < N; n++) {
        float *p = c->prob + (size_t)n * E;
        double mx = p[0], z = 0;
        for (int x = 1; x < E; x++)
            mx = p[x] > mx ? p[x] : mx;
        for (int x = 0; x < E; x++)
            z += exp((double)p[x] - mx);
        for (int x = 0; x < E; x++)
            p[x] = (float)(exp((double)p[x] - mx) / z);
        int *s = c->sel + (size_t)n * k;
        float *w = c->wraw + (size_t)n * k;
        double sum = 0;
        for (int j = 0; j < k; j++) {   /* k passes: the largest not yet taken, lower index on ties */
            int best = -1;
            for (int x = 0; x < E; x++) {
                int taken = 0;
                for (int i = 0; i < j; i++)
                    taken |= s[i] == x;
                if (!taken && (best < 0 || p[x] > p[best]))
                    best = x;
            }
            s[j] = best;
            w[j] = p[best];
            sum += p[best];
            c->cnt[best]++;
        }
        if (e->norm_topk)
            for (int j = 0; j < k; j++)
                w[j] = (float)(w[j] / sum);
    }
    for (int x = 0, o = 0; x < E; x++) {
        c->off[x] = o;
        o += c->cnt[x];
    }
    int *fill = (int *)c->hbuf;   /* per-expert fill counters, for now */
    memset(fill, 0, sizeof(int) * (size_t)E);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            int x = c->sel[(size_t)n * k + j], at = c->off[x] + fill[x]++;
            c->order[at] = n;
            c->slot[at] = n * k + j;
            c->wl[at] = c->wraw[(size_t)n * k + j] * c->mask[x];
        }
    for (int n = 0; n < N; n++)
        c->order[(size_t)N * k + n] = n;
    be->to_device(be, c->idev, c->order, sizeof(int) * ((size_t)N * k + N));
    be->to_device(be, c->wl_d, c->wl, F4 * (size_t)N * k);
}

/* One expert on n gathered rows X [n, C] into Y [n, C] (g, u, h kept): SwiGLU, or squared ReLU
 * of up alone when wg is NULL (Nemotron-H). C: its width (the latent for LatentMoE's experts).
 * um [F]: unit masks (NULL: none). */
static void expert_fwd(eng_backend *be, moe_call *c, const float *wg, const float *wu, const float *wd, int F,
                       int n, int C, const float *um)
{
    be->gemm(be, 0, 1, n, F, C, 1.0f, c->X, C, wu, C, 0.0f, c->u, F);
    if (wg) {
        be->gemm(be, 0, 1, n, F, C, 1.0f, c->X, C, wg, C, 0.0f, c->g, F);
        be->swiglu_fwd(be, c->h, c->g, c->u, (size_t)n * F);
    } else {
        be->relu2_fwd(be, c->h, c->u, (size_t)n * F);
    }
    if (um)   /* the search's unit masks: h keeps the masked units */
        be->mask_fwd(be, c->h, c->h, um, n, F, 1);
    be->gemm(be, 0, 1, n, C, F, 1.0f, c->h, F, wd, F, 0.0f, c->Y, C);
}

/* The shared expert's gate for every row: sg [N] = sigmoid(xn . w), device and host (hbuf). */
static void shared_gate(eng_backend *be, moe_call *c, const float *xn, const float *w)
{
    int N = c->N;
    be->gemm(be, 0, 1, N, 1, c->C, 1.0f, xn, c->C, w, c->C, 0.0f, c->sg, 1);
    be->to_host(be, c->hbuf, c->sg, F4 * (size_t)N);
    for (int n = 0; n < N; n++)
        c->hbuf[n] = (float)(1.0 / (1.0 + exp(-(double)c->hbuf[n])));
    be->to_device(be, c->sg, c->hbuf, F4 * (size_t)N);
}

/* acc[F] += the column sums of |x| over the n rows of x [n, F], summed on the device into
 * tmp [F] (dead space). */
static void add_col_sums(eng_backend *be, eng_act_stats *st, double *acc, float *tmp, const float *x, int n, int F)
{
    be->zero(be, tmp, F4 * (size_t)F);
    be->group_norm_sum(be, tmp, x, n, F, 1);
    be->to_host(be, st->unit_host, tmp, F4 * (size_t)F);
    for (int u = 0; u < F; u++)
        acc[u] += st->unit_host[u];
}

/* acc[F] += the column sums of |h| over the first n rows of c->h [n, F] (c->u is dead after
 * the expert and holds the device sums). */
static void add_unit_sums(eng_backend *be, moe_call *c, eng_act_stats *st, double *acc, int n, int F)
{
    add_col_sums(be, st, acc, c->u, c->h, n, F);
}

static void add_stats(eng_backend *be, moe_call *c, eng_act_stats *st, int l, int x, int F)
{
    int n = c->cnt[x];
    add_unit_sums(be, c, st, st->expert_unit[l] + (size_t)x * F, n, F);
    be->rows_dot(be, c->g, c->Y, c->Y, n, c->D);   /* g is dead after the expert; a latent expert's own output */
    be->to_host(be, c->hbuf, c->g, F4 * (size_t)n);
    double s = 0;
    for (int i = 0; i < n; i++)
        s += sqrt((double)c->hbuf[i]);
    st->expert_mass[l][x] += s;
    st->expert_tokens[l][x] += n;
}

/* The block on device rows xn [N, C] into y [N, C]; shared 0: without the shared expert, its
 * gate per row written to gate_host [N] (1 where it has none; may be NULL). */
static int moe_forward(eng_model *m, int l, const eng_masks *mk, const float *xn, float *y, int N,
                       eng_act_stats *stats, float *fws, int *iws, int shared, float *gate_host)
{
    eng_backend *be = m->be;
    const eng_layer *L = &m->layers[l];
    const arch_moe *e = &m->a.layers[l].moe;
    moe_call c;
    if (call_alloc(m, &c, l, N, 0, fws, iws) != 0)
        return -1;
    route(m, l, mk, xn, &c);
    int C = c.C, D = c.D, F = e->expert_ffn_dim;
    const float *um = mk ? mk->ffn[l] : NULL, *lm = mk && L->lat_in ? mk->latent[l] : NULL;
    const float *src = xn;   /* what the experts read and where their sum goes: the latent, else the block */
    float *dst = y;
    be->zero(be, y, F4 * (size_t)N * C);
    if (L->lat_in) {
        be->gemm(be, 0, 1, N, D, C, 1.0f, xn, C, L->lat_in, C, 0.0f, c.XL, D);
        if (stats)   /* the latent's input channels; YL is not written yet */
            add_col_sums(be, stats, stats->latent_abs[l], c.YL, c.XL, N, D);
        if (lm)   /* the search's latent masks, on the experts' input and (below) on their sum */
            be->mask_fwd(be, c.XL, c.XL, lm, N, D, 1);
        be->zero(be, c.YL, F4 * (size_t)N * D);
        src = c.XL;
        dst = c.YL;
    }
    for (int x = 0; x < c.E; x++) {
        int n = c.cnt[x];
        if (!n)
            continue;
        const int *rows = c.idev + c.off[x];
        be->gather_rows(be, c.X, src, rows, NULL, n, D);
        expert_fwd(be, &c, L->experts[3 * x], L->experts[3 * x + 1], L->experts[3 * x + 2], F, n, D, um);
        be->scatter_rows_acc(be, dst, c.Y, rows, c.wl_d + c.off[x], n, D);
        if (stats)
            add_stats(be, &c, stats, l, x, F);
    }
    if (L->lat_out) {
        if (lm)
            be->mask_fwd(be, c.YL, c.YL, lm, N, D, 1);
        be->gemm(be, 0, 1, N, C, D, 1.0f, c.YL, D, L->lat_out, D, 0.0f, y, C);
        if (stats)   /* its output channels; the experts are done with XL */
            add_col_sums(be, stats, stats->latent_abs[l] + D, c.XL, c.YL, N, D);
    }
    if (!shared && gate_host) {
        int gated = e->shared_ffn_dim && L->sh_router;
        if (gated)
            shared_gate(be, &c, xn, L->sh_router);
        for (int n = 0; n < N; n++)
            gate_host[n] = gated ? c.hbuf[n] : 1.0f;
    }
    if (e->shared_ffn_dim && shared) {   /* Qwen2-MoE's gated by sigmoid of its own row; Nemotron-H's added as it is */
        const int *ident = c.idev + (size_t)N * c.k;
        if (L->sh_router)
            shared_gate(be, &c, xn, L->sh_router);
        be->copy(be, c.X, xn, F4 * (size_t)N * C);
        expert_fwd(be, &c, L->sh_gate, L->sh_up, L->sh_down, e->shared_ffn_dim, N, C, mk ? mk->shared[l] : NULL);
        be->scatter_rows_acc(be, y, c.Y, ident, L->sh_router ? c.sg : NULL, N, C);
        if (stats)
            add_unit_sums(be, &c, stats, stats->shared_unit[l], N, e->shared_ffn_dim);
    }
    call_free(be, &c);
    return 0;
}

int eng_moe_fwd(eng_model *m, int l, const eng_masks *mk, const float *xn, float *y, int N, eng_act_stats *stats,
                float *fws, int *iws)
{
    return moe_forward(m, l, mk, xn, y, N, stats, fws, iws, 1, NULL);
}

int eng_moe_block(eng_model *m, int l, const float *xn, int N, int shared, float *y, float *gate)
{
    eng_backend *be = m->be;
    const arch_moe *e = l >= 0 && l < m->a.n_layers ? &m->a.layers[l].moe : NULL;
    if (!e || !e->n_experts || N <= 0)
        return -1;
    size_t bytes = F4 * (size_t)N * m->a.hidden_size;
    float *xd = be->alloc(be, bytes), *yd = be->alloc(be, bytes);
    int rc = xd && yd ? 0 : -1;
    if (rc == 0) {
        be->to_device(be, xd, xn, bytes);
        rc = moe_forward(m, l, NULL, xd, yd, N, NULL, NULL, NULL, shared, gate);
    }
    if (rc == 0)
        be->to_host(be, y, yd, bytes);
    be->free(be, xd, xd ? bytes : 0);
    be->free(be, yd, yd ? bytes : 0);
    return rc;
}

int eng_moe_expert_io(eng_model *m, int l, int x, const float *xn, int N, const int *rows, int n, int *routed,
                      float *h, float *y, float *w)
{
    eng_backend *be = m->be;
    const eng_layer *L = &m->layers[l];
    const arch_moe *e = l >= 0 && l < m->a.n_layers ? &m->a.layers[l].moe : NULL;
    moe_call c;
    if (!e || x < -1 || x >= e->n_experts || (x < 0 && !e->shared_ffn_dim) || N <= 0 ||
        call_alloc(m, &c, l, N, 0, NULL, NULL) != 0)
        return -1;
    int shared = x < 0, C = c.C, D = shared ? c.C : c.D, F = shared ? e->shared_ffn_dim : e->expert_ffn_dim, rc = -1;
    float *xd = be->alloc(be, F4 * (size_t)N * C);
    if (!xd)
        goto done;
    be->to_device(be, xd, xn, F4 * (size_t)N * C);
    for (int i = 0; rows && i < n; i++)
        if (rows[i] < 0 || rows[i] >= N)
            goto done;
    if (!rows && shared) {
        n = N;
        for (int i = 0; i < N; i++)
            routed[i] = i;
        rows = routed;
    } else if (!rows) {
        route(m, l, NULL, xd, &c);
        n = c.cnt[x];
        memcpy(routed, c.order + c.off[x], sizeof(int) * (size_t)n);
        if (w)
            memcpy(w, c.wl + c.off[x], sizeof(float) * (size_t)n);
        rows = routed;
    }
    if (n > 0) {
        be->to_device(be, c.idev, rows, sizeof(int) * (size_t)n);
        be->gather_rows(be, c.X, xd, c.idev, NULL, n, C);
        if (L->lat_in && !shared) {   /* only the chosen rows into the latent */
            be->gemm(be, 0, 1, n, D, C, 1.0f, c.X, C, L->lat_in, C, 0.0f, c.XL, D);
            be->copy(be, c.X, c.XL, F4 * (size_t)n * D);
        }
        if (shared)
            expert_fwd(be, &c, L->sh_gate, L->sh_up, L->sh_down, F, n, D, NULL);
        else
            expert_fwd(be, &c, L->experts[3 * x], L->experts[3 * x + 1], L->experts[3 * x + 2], F, n, D, NULL);
        if (h)
            be->to_host(be, h, c.h, F4 * (size_t)n * F);
        if (y)
            be->to_host(be, y, c.Y, F4 * (size_t)n * D);
    }
    rc = n;
done:
    be->free(be, xd, xd ? F4 * (size_t)N * C : 0);
    call_free(be, &c);
    return rc;
}

/* Backward of one expert on n rows (SwiGLU, or squared ReLU when wg is NULL): X, g, u, h from
 * expert_fwd; dY [n, C] the gradient of its (weighted) output. Accumulates weight grads (Gu
 * NULL: none) and writes dX [n, C]. C: its width, as in expert_fwd. um: its unit masks (as in
 * expert_fwd), their gradient accumulated into gum (may be NULL). */
static void expert_bwd(eng_backend *be, moe_call *c, const float *wg, const float *wu, const float *wd, float *Gg,
                       float *Gu, float *Gd, int F, int n, int C, const float *um, float *gum)
{
    be->gemm(be, 0, 0, n, F, C, 1.0f, c->dY, C, wd, F, 0.0f, c->dh, F);
    if (Gd)
        be->gemm(be, 1, 0, C, F, n, 1.0f, c->dY, C, c->h, F, 1.0f, Gd, F);   /* h as masked */
    if (um) {   /* the unmasked h (into dg, free until the activation's backward) for the masks' gradient */
        if (wg)
            be->swiglu_fwd(be, c->dg, c->g, c->u, (size_t)n * F);
        else
            be->relu2_fwd(be, c->dg, c->u, (size_t)n * F);
        be->mask_bwd(be, c->dh, gum, c->dh, c->dg, um, n, F, 1);
    }
    if (wg)
        be->swiglu_bwd(be, c->dg, c->du, c->dh, c->g, c->u, (size_t)n * F);
    else
        be->relu2_bwd(be, c->du, c->dh, c->u, (size_t)n * F);
    if (Gu) {
        if (wg)
            be->gemm(be, 1, 0, F, C, n, 1.0f, c->dg, F, c->X, C, 1.0f, Gg, C);
        be->gemm(be, 1, 0, F, C, n, 1.0f, c->du, F, c->X, C, 1.0f, Gu, C);
    }
    if (wg)
        be->gemm(be, 0, 0, n, C, F, 1.0f, c->dg, F, wg, C, 0.0f, c->dX, C);
    be->gemm(be, 0, 0, n, C, F, 1.0f, c->du, F, wu, C, wg ? 1.0f : 0.0f, c->dX, C);
}

/* d loss / d router logits from d loss / d routing weight (per row and slot, in dw [N*k]):
 * through the renormalization (norm_topk) and the softmax. Into hbuf [N, E]. */
static void router_grad(const arch_moe *e, moe_call *c, const float *dw)
{
    int N = c->N, E = c->E, k = c->k;
    for (int n = 0; e->sigmoid && n < N; n++) {   /* w_j = scale * s_j (/ sum of the chosen s) */
        const float *p = c->prob + (size_t)n * E, *w = c->wraw + (size_t)n * k, *g = dw + (size_t)n * k;
        const int *s = c->sel + (size_t)n * k;
        float *dl = c->hbuf + (size_t)n * E;
        double S = 1e-20, gw = 0;
        for (int j = 0; j < k; j++) {
            S += p[s[j]];
            gw += (double)g[j] * w[j];
        }
        memset(dl, 0, F4 * (size_t)E);   /* the choice has no gradient; unchosen scores none */
        for (int j = 0; j < k; j++) {
            double ds = e->norm_topk ? e->routed_scale / S * ((double)g[j] - gw / e->routed_scale)
                                     : e->routed_scale * (double)g[j];
            dl[s[j]] = (float)(ds * p[s[j]] * (1.0 - p[s[j]]));
        }
    }
    for (int n = 0; !e->sigmoid && n < N; n++) {
        const float *p = c->prob + (size_t)n * E, *w = c->wraw + (size_t)n * k, *g = dw + (size_t)n * k;
        const int *s = c->sel + (size_t)n * k;
        float *dl = c->hbuf + (size_t)n * E;
        double *dp = c->dp, S = 0, gw = 0;
        for (int j = 0; j < k; j++) {
            S += p[s[j]];
            gw += (double)g[j] * w[j];
        }
        for (int j = 0; j < k; j++)
            dp[j] = e->norm_topk ? ((double)g[j] - gw) / S : g[j];
        double dot = 0;
        for (int j = 0; j < k; j++)
            dot += dp[j] * p[s[j]];
        for (int x = 0; x < E; x++)
            dl[x] = (float)(-(double)p[x] * dot);
        for (int j = 0; j < k; j++)
            dl[s[j]] += (float)(p[s[j]] * dp[j]);
    }
}

int eng_moe_bwd(eng_model *m, int l, const eng_masks *mk, const float *xn, const float *dy, float *dxn, int N,
                int gw, int gm)
{
    eng_backend *be = m->be;
    const eng_layer *L = &m->layers[l];
    eng_layer *G = &m->glayers[l];
    const arch_moe *e = &m->a.layers[l].moe;
    moe_call c;
    if (call_alloc(m, &c, l, N, 1, NULL, NULL) != 0)
        return -1;
    route(m, l, mk, xn, &c);
    int C = c.C, D = c.D, F = e->expert_ffn_dim, E = c.E, k = c.k;
    const float *um = mk ? mk->ffn[l] : NULL, *lm = mk && L->lat_in ? mk->latent[l] : NULL;
    float *gum = um && gm ? m->masks->g_ffn[l] : NULL, *glm = lm && gm ? m->masks->g_latent[l] : NULL;
    float *dw = malloc(F4 * (size_t)N * k);
    double *dmask = calloc((size_t)E, sizeof *dmask);
    if (!dw || !dmask) {
        free(dw);
        free(dmask);
        call_free(be, &c);
        return -1;
    }
    be->zero(be, dxn, F4 * (size_t)N * C);
    const float *src = xn, *dsum = dy;   /* the experts' input and their sum's gradient (latent, else the block's) */
    float *dsrc = dxn;
    if (L->lat_in) {   /* LatentMoE: y = (m * sum of weighted experts on m * x fc1^T) fc2^T, m the latent masks */
        be->gemm(be, 0, 1, N, D, C, 1.0f, xn, C, L->lat_in, C, 0.0f, c.XL, D);
        be->gemm(be, 0, 0, N, D, C, 1.0f, dy, C, L->lat_out, D, 0.0f, c.dYL, D);
        if (lm) {   /* the experts read m * XL; their sum's gradient is m * (dy fc2) */
            be->mask_fwd(be, c.XL, c.XL, lm, N, D, 1);
            be->mask_fwd(be, c.dYL, c.dYL, lm, N, D, 1);
        }
        be->zero(be, c.YL, F4 * (size_t)N * D);
        be->zero(be, c.dXL, F4 * (size_t)N * D);
        src = c.XL;
        dsum = c.dYL;
        dsrc = c.dXL;
    }
    for (int x = 0; x < E; x++) {
        int n = c.cnt[x];
        if (!n)
            continue;
        const int *rows = c.idev + c.off[x];
        float **W = L->experts + 3 * x, **GW = gw ? G->experts + 3 * x : NULL;
        be->gather_rows(be, c.X, src, rows, NULL, n, D);
        expert_fwd(be, &c, W[0], W[1], W[2], F, n, D, um);
        if (L->lat_in)   /* the latent sum again, for fc2's gradient */
            be->scatter_rows_acc(be, c.YL, c.Y, rows, c.wl_d + c.off[x], n, D);
        be->gather_rows(be, c.dY, dsum, rows, NULL, n, D);
        be->rows_dot(be, c.dlog, c.dY, c.Y, n, D);   /* d loss / d (its weight) per row */
        be->to_host(be, c.hbuf, c.dlog, F4 * (size_t)n);
        for (int i = 0; i < n; i++) {
            int at = c.off[x] + i;
            dw[c.slot[at]] = c.hbuf[i] * c.mask[x];
            dmask[x] += (double)c.hbuf[i] * c.wraw[c.slot[at]];
        }
        be->gather_rows(be, c.dY, dsum, rows, c.wl_d + c.off[x], n, D);
        expert_bwd(be, &c, W[0], W[1], W[2], GW ? GW[0] : NULL, GW ? GW[1] : NULL, GW ? GW[2] : NULL, F, n, D, um,
                   gum);   /* W[0] NULL: relu2 */
        be->scatter_rows_acc(be, dsrc, c.dX, rows, NULL, n, D);
    }
    if (lm) {   /* the masks' gradient from both sides, and the gradients past them */
        be->gemm(be, 0, 0, N, D, C, 1.0f, dy, C, L->lat_out, D, 0.0f, c.dYL, D);   /* d loss / d (m * YL) */
        be->mask_bwd(be, c.dYL, glm, c.dYL, c.YL, lm, N, D, 1);
        be->mask_fwd(be, c.YL, c.YL, lm, N, D, 1);                                  /* what fc2 read */
        be->gemm(be, 0, 1, N, D, C, 1.0f, xn, C, L->lat_in, C, 0.0f, c.XL, D);     /* XL unmasked */
        be->mask_bwd(be, c.dXL, glm, c.dXL, c.XL, lm, N, D, 1);                     /* d loss / d XL */
    }
    if (L->lat_in) {
        if (gw) {
            be->gemm(be, 1, 0, C, D, N, 1.0f, dy, C, c.YL, D, 1.0f, G->lat_out, D);
            be->gemm(be, 1, 0, D, C, N, 1.0f, c.dXL, D, xn, C, 1.0f, G->lat_in, C);
        }
        be->gemm(be, 0, 0, N, C, D, 1.0f, c.dXL, D, L->lat_in, C, 1.0f, dxn, C);
    }
    router_grad(e, &c, dw);
    be->to_device(be, c.dlog, c.hbuf, F4 * (size_t)N * E);
    if (gw)
        be->gemm(be, 1, 0, E, C, N, 1.0f, c.dlog, E, xn, C, 1.0f, G->router, C);
    be->gemm(be, 0, 0, N, C, E, 1.0f, c.dlog, E, L->router, C, 1.0f, dxn, C);
    const float *sm = mk ? mk->shared[l] : NULL;   /* the shared expert's unit masks and their gradient */
    float *gsm = sm && gm ? m->masks->g_shared[l] : NULL;
    if (e->shared_ffn_dim && !L->sh_router) {   /* Nemotron-H: the shared expert added as it is */
        be->copy(be, c.X, xn, F4 * (size_t)N * C);
        expert_fwd(be, &c, NULL, L->sh_up, L->sh_down, e->shared_ffn_dim, N, C, sm);
        be->copy(be, c.dY, dy, F4 * (size_t)N * C);
        expert_bwd(be, &c, NULL, L->sh_up, L->sh_down, NULL, gw ? G->sh_up : NULL, gw ? G->sh_down : NULL,
                   e->shared_ffn_dim, N, C, sm, gsm);
        be->add(be, dxn, dxn, c.dX, (size_t)N * C);
    } else if (e->shared_ffn_dim) {
        const int *ident = c.idev + (size_t)N * k;
        int S = e->shared_ffn_dim;
        shared_gate(be, &c, xn, L->sh_router);
        be->copy(be, c.X, xn, F4 * (size_t)N * C);
        expert_fwd(be, &c, L->sh_gate, L->sh_up, L->sh_down, S, N, C, sm);
        be->rows_dot(be, c.dlog, dy, c.Y, N, C);     /* d loss / d gate value */
        float *dsg = c.hbuf + (size_t)N;              /* hbuf[0, N) holds the gate values */
        be->to_host(be, dsg, c.dlog, F4 * (size_t)N);
        for (int n = 0; n < N; n++)
            dsg[n] *= c.hbuf[n] * (1.0f - c.hbuf[n]);
        be->to_device(be, c.dlog, dsg, F4 * (size_t)N);
        if (gw)
            be->gemm(be, 1, 0, 1, C, N, 1.0f, c.dlog, 1, xn, C, 1.0f, G->sh_router, C);
        be->gemm(be, 0, 0, N, C, 1, 1.0f, c.dlog, 1, L->sh_router, C, 1.0f, dxn, C);
        be->gather_rows(be, c.dY, dy, ident, c.sg, N, C);
        expert_bwd(be, &c, L->sh_gate, L->sh_up, L->sh_down, gw ? G->sh_gate : NULL, gw ? G->sh_up : NULL,
                   gw ? G->sh_down : NULL, S, N, C, sm, gsm);
        be->add(be, dxn, dxn, c.dX, (size_t)N * C);
    }
    if (gm && mk) {
        be->to_host(be, c.hbuf, m->masks->g_expert[l], F4 * (size_t)E);
        for (int x = 0; x < E; x++)
            c.hbuf[x] += (float)dmask[x];
        be->to_device(be, m->masks->g_expert[l], c.hbuf, F4 * (size_t)E);
    }
    free(dw);
    free(dmask);
    call_free(be, &c);
    return 0;
}
