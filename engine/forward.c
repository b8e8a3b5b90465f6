/* engine/forward.c — inference: embedding, attention (or Mamba-2, engine/mamba.c) and MLP
 * blocks (SwiGLU, squared ReLU, or experts: engine/moe.c) with masks, the LM head, prefill and
 * decode through a cache, and the ranking statistics. Training runs
 * the same blocks (eng_fwd_setup, eng_fwd_layers) with saved activations: backward.c.
 *
 * Memory (floats are 4 bytes; N = B*T; qd = max_l Hq*D, kvd = max_l Hkv*D, F = max_l F_l,
 * Hm = max_l Hq; R = rows of the LM head at once). eng_forward holds one workspace for the
 * call, freed before return:
 *   N*(3C + 1) + max(N*(2qd + 2kvd), Mamba) + max(3N*F, MoE) floats (x, xn, y, rstd; the mixer
 *   region: q, o, k, v, or the largest Mamba-2 mixer's scratch, engine/mamba.c; the MLP region:
 *   gate, up, h, or the largest MoE block's scratch floats and ints, engine/moe.c)
 *   + R*(2C + V) for the head (R = B for LOGITS_LAST, min(N, ENG_LOGIT_CHUNK_ROWS) for ALL and ROWS,
 *   0 for NONE) + max(C, Hm, F) when stats are collected (+ N*qd when masks are enabled:
 *   the masked head outputs), + ints 2N + 2B (tokens, positions, first positions, lengths),
 *   + inside attention: threads * ENG_CPU_ATTN_ROWS * S floats of tile scratch (S = T, or
 *   max_T with a cache; CPU backend). eng_forward_workspace_bytes computes exactly this sum;
 *   the tests check it against the measured peak.
 * Statistics: hidden_abs sums both norm outputs of a layer (attention and MLP input).
 */
#include "engine/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/clock.h"
#include "engine/model_internal.h"
#include "engine/mamba.h"
#include "engine/moe.h"

/* ---- statistics ---------------------------------------------------------------------- */

eng_act_stats *eng_stats_new(const eng_model *m)
{
    const arch *a = &m->a;
    int L = a->n_layers;
    eng_act_stats *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->ffn_abs = calloc((size_t)(L ? L : 1), sizeof *s->ffn_abs);
    s->head_norm = calloc((size_t)(L ? L : 1), sizeof *s->head_norm);
    s->hidden_abs = calloc((size_t)a->hidden_size, sizeof *s->hidden_abs);
    s->expert_mass = calloc((size_t)(L ? L : 1), sizeof *s->expert_mass);
    s->expert_tokens = calloc((size_t)(L ? L : 1), sizeof *s->expert_tokens);
    s->expert_unit = calloc((size_t)(L ? L : 1), sizeof *s->expert_unit);
    s->shared_unit = calloc((size_t)(L ? L : 1), sizeof *s->shared_unit);
    s->latent_abs = calloc((size_t)(L ? L : 1), sizeof *s->latent_abs);
    size_t widest = 1;
    for (int l = 0; l < L; l++) {
        const arch_moe *e = &a->layers[l].moe;
        size_t w = (size_t)(e->expert_ffn_dim > e->shared_ffn_dim ? e->expert_ffn_dim : e->shared_ffn_dim);
        w = (size_t)e->latent_dim > w ? (size_t)e->latent_dim : w;
        widest = e->n_experts && w > widest ? w : widest;
    }
    s->unit_host = malloc(widest * sizeof(float));
    int bad = !s->ffn_abs || !s->head_norm || !s->hidden_abs || !s->expert_mass || !s->expert_tokens ||
              !s->expert_unit || !s->shared_unit || !s->latent_abs || !s->unit_host;
    for (int l = 0; !bad && l < L; l++) {
        const arch_moe *m = &a->layers[l].moe;
        size_t e = (size_t)m->n_experts;
        if (e && (!(s->expert_mass[l] = calloc(e, sizeof(double))) || !(s->expert_tokens[l] = calloc(e, sizeof(double))) ||
                  !(s->expert_unit[l] = calloc(e * (size_t)m->expert_ffn_dim, sizeof(double)))))
            bad = 1;
        if (e && m->shared_ffn_dim && !(s->shared_unit[l] = calloc((size_t)m->shared_ffn_dim, sizeof(double))))
            bad = 1;
        if (e && m->latent_dim && !(s->latent_abs[l] = calloc(2 * (size_t)m->latent_dim, sizeof(double))))
            bad = 1;
        if (a->layers[l].ffn_dim && !(s->ffn_abs[l] = calloc((size_t)a->layers[l].ffn_dim, sizeof(double))))
            bad = 1;
        if (mixer_heads(&a->layers[l]) && !(s->head_norm[l] = calloc((size_t)mixer_heads(&a->layers[l]), sizeof(double))))
            bad = 1;
    }
    if (bad) {
        eng_stats_free(s, L);
        return NULL;
    }
    return s;
}

void eng_stats_free(eng_act_stats *s, int n_layers)
{
    if (!s)
        return;
    for (int l = 0; l < n_layers; l++) {
        if (s->ffn_abs)
            free(s->ffn_abs[l]);
        if (s->head_norm)
            free(s->head_norm[l]);
        if (s->expert_mass)
            free(s->expert_mass[l]);
        if (s->expert_tokens)
            free(s->expert_tokens[l]);
        if (s->expert_unit)
            free(s->expert_unit[l]);
        if (s->shared_unit)
            free(s->shared_unit[l]);
        if (s->latent_abs)
            free(s->latent_abs[l]);
    }
    free(s->expert_unit);
    free(s->shared_unit);
    free(s->latent_abs);
    free(s->unit_host);
    free(s->expert_mass);
    free(s->expert_tokens);
    free(s->ffn_abs);
    free(s->head_norm);
    free(s->hidden_abs);
    free(s);
}

/* ---- blocks ---------------------------------------------------------------------------- */

void eng_stats_add(eng_model *m, fwd_state *st, double *acc, const float *x, int G, int D)
{
    eng_backend *be = m->be;
    be->zero(be, st->stat, F4 * (size_t)G);
    size_t row = (size_t)G * D;
    for (int b = 0; b < st->B; b++) {
        int len = st->lens_h ? st->lens_h[b] : st->T;
        if (len > 0)
            be->group_norm_sum(be, st->stat, x + (size_t)b * st->T * row, len, G, D);
    }
    be->to_host(be, st->stat_host, st->stat, F4 * (size_t)G);
    for (int g = 0; g < G; g++)
        acc[g] += st->stat_host[g];
}

/* x_out = (x_in + gate*y) * hidden   (masks), or x_in + y. Saves r when asked. */
static void residual(eng_model *m, fwd_state *st, float *x_out, const float *x_in, const float *y,
                     const float *gate_dev, float *r_save)
{
    eng_backend *be = m->be;
    size_t n = (size_t)st->N * m->a.hidden_size;
    if (!st->mk) {
        be->add(be, x_out, x_in, y, n);
        return;
    }
    if (x_out != x_in)
        be->copy(be, x_out, x_in, n * F4);
    be->axpy_dev(be, x_out, gate_dev, y, n);
    if (r_save)
        be->copy(be, r_save, x_out, n * F4);
    be->mask_fwd(be, x_out, x_out, st->mk->hidden, st->N, m->a.hidden_size, 1);
}

static void linear(eng_backend *be, float *y, const float *x, const float *W, const float *b,
                   int N, int out, int in)
{
    be->gemm(be, 0, 1, N, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
    if (b)
        be->bias_add(be, y, b, N, out);
}

static void attn_block(eng_model *m, fwd_state *st, int l, const float *x_in, float *x_out, blk_act *A)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    const eng_layer *L = &m->layers[l];
    model_impl *im = m->impl;
    int N = st->N, C = a->hidden_size, D = a->head_dim;
    int Hq = a->layers[l].n_heads, Hkv = a->layers[l].n_kv_heads, qd = Hq * D, kvd = Hkv * D;
    be->rmsnorm_fwd(be, st->xn, A->rstd, x_in, L->attn_norm, N, C, st->n_eff, (float)a->norm_eps);
    if (st->stats)
        eng_stats_add(m, st, st->stats->hidden_abs, st->xn, C, 1);
    linear(be, A->q, st->xn, L->wq, L->bq, N, qd, C);
    linear(be, A->k, st->xn, L->wk, L->bk, N, kvd, C);
    linear(be, A->v, st->xn, L->wv, L->bv, N, kvd, C);
    if (L->q_norm) {   /* OLMoE: q and k normalized over their whole rows (A->o: free until attention) */
        be->rmsnorm_fwd(be, A->o, A->qrstd, A->q, L->q_norm, N, qd, (float)qd, (float)a->norm_eps);
        be->copy(be, A->q, A->o, F4 * (size_t)N * qd);
        be->rmsnorm_fwd(be, A->o, A->krstd, A->k, L->k_norm, N, kvd, (float)kvd, (float)a->norm_eps);
        be->copy(be, A->k, A->o, F4 * (size_t)N * kvd);
    }
    if (arch_rope(a)) {
        be->rope_fwd(be, A->q, st->pos_d, im->inv_freq, N, Hq, D);
        be->rope_fwd(be, A->k, st->pos_d, im->inv_freq, N, Hkv, D);
    }
    const float *K = A->k, *V = A->v;
    int S = st->T;
    if (st->kv) {
        eng_kv_cache *kv = st->kv;
        for (int b = 0; b < st->B; b++) {
            size_t dst = ((size_t)b * kv->max_T + kv->len[b]) * kvd, src = (size_t)b * st->T * kvd;
            be->copy(be, kv->k[l] + dst, A->k + src, F4 * (size_t)st->T * kvd);
            be->copy(be, kv->v[l] + dst, A->v + src, F4 * (size_t)st->T * kvd);
        }
        K = kv->k[l];
        V = kv->v[l];
        S = kv->max_T;
    }
    be->attn_fwd(be, A->o, A->lse, A->q, K, V, st->pos0_d, st->lens_d, st->B, st->T, S, Hq, Hkv, D,
                 (float)(1.0 / sqrt((double)D)));
    if (st->stats)
        eng_stats_add(m, st, st->stats->head_norm[l], A->o, Hq, D);
    const float *om = A->o;
    if (st->mk) {
        be->mask_fwd(be, st->om, A->o, st->mk->head[l], N, Hq, D);
        om = st->om;
    }
    linear(be, A->y, om, L->wo, NULL, N, C, qd);
    residual(m, st, x_out, x_in, A->y, st->mk ? st->mk->attn_gate + l : NULL, A->r);
}

/* A Mamba-2 mixer in the token mixer's place (engine/mamba.c). */
static void mamba_block(eng_model *m, fwd_state *st, int l, const float *x_in, float *x_out, blk_act *A)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    int N = st->N, C = a->hidden_size;
    be->rmsnorm_fwd(be, st->xn, A->rstd, x_in, m->layers[l].attn_norm, N, C, st->n_eff, (float)a->norm_eps);
    if (st->stats)
        eng_stats_add(m, st, st->stats->hidden_abs, st->xn, C, 1);
    if (eng_mamba_fwd(m, st, l, st->xn, A->y, st->mamba_f) != 0) {
        st->oom = 1;
        be->zero(be, A->y, F4 * (size_t)N * C);
    }
    residual(m, st, x_out, x_in, A->y, st->mk ? st->mk->attn_gate + l : NULL, A->r);
}

static void mlp_block(eng_model *m, fwd_state *st, int l, const float *x_in, float *x_out, blk_act *A)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    const eng_layer *L = &m->layers[l];
    int N = st->N, C = a->hidden_size, F = a->layers[l].ffn_dim;
    be->rmsnorm_fwd(be, st->xn, A->rstd, x_in, L->ffn_norm, N, C, st->n_eff, (float)a->norm_eps);
    if (st->stats)
        eng_stats_add(m, st, st->stats->hidden_abs, st->xn, C, 1);
    if (a->layers[l].moe.n_experts) {
        if (eng_moe_fwd(m, l, st->mk, st->xn, A->y, N, st->stats, st->moe_f, st->moe_i) != 0) {
            st->oom = 1;
            be->zero(be, A->y, F4 * (size_t)N * C);
        }
        residual(m, st, x_out, x_in, A->y, st->mk ? st->mk->mlp_gate + l : NULL, A->r);
        return;
    }
    linear(be, A->up, st->xn, L->w_up, NULL, N, F, C);
    if (arch_mlp_gated(a)) {
        linear(be, A->gate, st->xn, L->w_gate, NULL, N, F, C);
        be->swiglu_fwd(be, st->h, A->gate, A->up, (size_t)N * F);
    } else {
        be->relu2_fwd(be, st->h, A->up, (size_t)N * F);
    }
    if (st->stats)
        eng_stats_add(m, st, st->stats->ffn_abs[l], st->h, F, 1);
    if (st->mk)
        be->mask_fwd(be, st->h, st->h, st->mk->ffn[l], N, F, 1);
    linear(be, A->y, st->h, L->w_down, NULL, N, C, F);
    residual(m, st, x_out, x_in, A->y, st->mk ? st->mk->mlp_gate + l : NULL, A->r);
}

void eng_fwd_layers(eng_model *m, fwd_state *st)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    double e0 = 0;
    if (st->fixed_ns) {
        be->sync(be);
        e0 = eng_wall_s();
    }
    be->embed_fwd(be, st->xs[0], m->tok_emb, st->tok_d, st->N, a->hidden_size);
    if (st->mk)
        be->mask_fwd(be, st->xs[0], st->xs[0], st->mk->hidden, st->N, a->hidden_size, 1);
    if (st->fixed_ns) {
        be->sync(be);
        st->fixed_ns[0] = (eng_wall_s() - e0) * 1e9;
    }
    int blk = 0;
    for (int l = 0; l < a->n_layers; l++) {
        for (int part = 0; part < 2; part++) {
            int present = part == 0 ? arch_layer_has_mixer(&a->layers[l]) : arch_layer_has_mlp(&a->layers[l]);
            double t0 = 0;
            if (st->layer_ns) {
                be->sync(be);
                t0 = eng_wall_s();
            }
            if (present) {
                blk_act *A = st->acts ? &st->acts[blk] : &st->tmp;
                float *xin = st->acts ? st->xs[blk] : st->xs[0], *xout = st->acts ? st->xs[blk + 1] : st->xs[0];
                if (part == 1)
                    mlp_block(m, st, l, xin, xout, A);
                else if (a->layers[l].mamba.n_heads)
                    mamba_block(m, st, l, xin, xout, A);
                else
                    attn_block(m, st, l, xin, xout, A);
                blk++;
            }
            if (st->layer_ns) {
                be->sync(be);
                st->layer_ns[2 * l + part] = present ? (eng_wall_s() - t0) * 1e9 : 0;
            }
        }
        if (st->layer_out && st->layer_out[l])
            be->copy(be, st->layer_out[l], st->acts ? st->xs[blk] : st->xs[0], F4 * (size_t)st->N * a->hidden_size);
    }
}

static int head_rows(int B, int N, int logits_mode)
{
    if (logits_mode == ENG_LOGITS_LAST)
        return B;
    if (logits_mode == ENG_LOGITS_ALL || logits_mode == ENG_LOGITS_ROWS)
        return N < ENG_LOGIT_CHUNK_ROWS ? N : ENG_LOGIT_CHUNK_ROWS;
    return 0;
}

/* The MLP region: the dense SwiGLU's gate, up and h (N*F each), or, sharing it, the
 * largest MoE block's scratch (its floats, then its ints). */
static size_t mlp_floats(const arch *a, size_t N, dims_max d)
{
    size_t dense = 3 * N * (size_t)d.f, moe = eng_moe_scratch_floats(a, (int)N, 0);
    moe += moe ? eng_moe_scratch_ints(a, (int)N) : 0;
    return dense > moe ? dense : moe;
}

/* The token mixer's region: attention's q, o, k and v, or, sharing it, the largest Mamba
 * mixer's scratch (engine/mamba.c). */
static size_t mixer_floats(const arch *a, int B, int T, dims_max d)
{
    size_t attn = (size_t)B * T * (2 * (size_t)d.qd + 2 * (size_t)d.kvd), mamba = eng_mamba_fwd_floats(a, B, T);
    return attn > mamba ? attn : mamba;
}

/* Float count of the inference workspace (excluding ints and attention scratch). */
static size_t fwd_floats(const arch *a, int B, int T, int logits_mode, int with_stats, int with_masks)
{
    dims_max d = max_dims(a);
    size_t N = (size_t)B * T, C = (size_t)a->hidden_size;
    size_t n = N * (3 * C + 1) + mixer_floats(a, B, T, d) + mlp_floats(a, N, d);
    size_t R = (size_t)head_rows(B, (int)N, logits_mode);
    n += R * (2 * C + (size_t)a->vocab_size);
    if (with_stats)
        n += (size_t)imax(a->hidden_size, imax(d.hq, d.f));
    if (with_masks)
        n += N * (size_t)d.qd;
    return n;
}

size_t eng_fwd_bytes(const arch *a, int B, int T, int kv_max_T, int logits_mode, int threads, int with_stats,
                     int with_masks)
{
    size_t S = (size_t)(kv_max_T > 0 ? kv_max_T : T);
    int attn = 0;
    for (int l = 0; l < a->n_layers; l++)
        attn |= a->layers[l].n_heads > 0;
    size_t tiles = attn ? (size_t)(threads > 0 ? threads : 1) * ENG_CPU_ATTN_ROWS * S * F4 : 0;
    return fwd_floats(a, B, T, logits_mode, with_stats, with_masks) * F4 +
           (2 * (size_t)B * T + 2 * (size_t)B) * sizeof(int) + tiles;
}

size_t eng_forward_workspace_bytes(const arch *a, int B, int T, int kv_max_T, int logits_mode,
                                   int threads, int with_stats)
{
    return eng_fwd_bytes(a, B, T, kv_max_T, logits_mode, threads, with_stats, 0);
}

/* ---- workspace and setup --------------------------------------------------------------- */

void eng_ws_free(eng_backend *be, ws_t *w)
{
    be->free(be, w->f, w->f ? w->f_bytes : 0);
    be->free(be, w->i, w->i ? w->i_bytes : 0);
    w->f = NULL;
    w->i = NULL;
}

void eng_fwd_upload_ints(eng_backend *be, int *dev, int *host, const int *tokens, const int *lens,
                         const eng_kv_cache *kv, int B, int T)
{
    int N = B * T;
    memcpy(host, tokens, sizeof(int) * (size_t)N);
    for (int b = 0; b < B; b++) {
        int past = kv ? kv->len[b] : 0;
        for (int t = 0; t < T; t++)
            host[N + b * T + t] = past + t;
        host[2 * N + b] = past;
        host[2 * N + B + b] = lens ? lens[b] : T;
    }
    be->to_device(be, dev, host, sizeof(int) * (size_t)(2 * N + 2 * B));
}

int eng_check_tokens(const int *tokens, size_t n, int V, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V) {
            snprintf(err, errlen, "token %d at index %zu is out of range [0, %d)", tokens[i], i, V);
            return -1;
        }
    return 0;
}

int eng_fwd_setup(eng_model *m, fwd_state *st, ws_t *ws, int *host_ints, const int *tokens, int B, int T,
                  const int *lens, eng_kv_cache *kv, int logits_mode, eng_act_stats *stats,
                  const eng_masks *mk, float **xs1, float **head_base)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    dims_max d = max_dims(a);
    size_t N = (size_t)B * T, C = (size_t)a->hidden_size;
    memset(st, 0, sizeof *st);
    memset(ws, 0, sizeof *ws);
    ws->f_bytes = fwd_floats(a, B, T, logits_mode, stats != NULL, mk != NULL) * F4;
    ws->i_bytes = sizeof(int) * (2 * N + 2 * (size_t)B);
    ws->f = be->alloc(be, ws->f_bytes);
    ws->i = be->alloc(be, ws->i_bytes);
    if (!ws->f || !ws->i) {
        eng_ws_free(be, ws);
        return -1;
    }
    eng_fwd_upload_ints(be, ws->i, host_ints, tokens, lens, kv, B, T);
    st->B = B;
    st->T = T;
    st->N = (int)N;
    st->tok_d = ws->i;
    st->pos_d = ws->i + N;
    st->pos0_d = ws->i + 2 * N;
    st->lens_d = ws->i + 2 * N + B;
    st->lens_h = host_ints + 2 * N + B;
    st->kv = kv;
    st->mk = mk;
    st->n_eff = mk ? mk->hidden_count : (float)a->hidden_size;
    float *p = ws->f;
    float *x = p; p += N * C;
    st->xn = p; p += N * C;
    st->tmp.y = p; p += N * C;
    st->tmp.rstd = p; p += N;
    st->tmp.q = p;
    st->tmp.o = p + N * (size_t)d.qd;
    st->tmp.k = p + 2 * N * (size_t)d.qd;
    st->tmp.v = p + 2 * N * (size_t)d.qd + N * (size_t)d.kvd;
    st->mamba_f = eng_mamba_fwd_floats(a, B, T) ? p : NULL;   /* a Mamba mixer's scratch shares attention's */
    p += mixer_floats(a, B, T, d);
    st->tmp.gate = p;
    st->tmp.up = p + N * (size_t)d.f;
    st->h = p + 2 * N * (size_t)d.f;
    if (eng_moe_scratch_floats(a, (int)N, 0)) {   /* an MoE block's scratch shares the dense MLP's */
        st->moe_f = p;
        st->moe_i = (int *)(p + eng_moe_scratch_floats(a, (int)N, 0));
    }
    p += mlp_floats(a, N, d);
    if (mk) {
        st->om = p;
        p += N * (size_t)d.qd;
    }
    if (stats) {
        st->stat = p;
        p += (size_t)imax(a->hidden_size, imax(d.hq, d.f));
    }
    *head_base = p;
    xs1[0] = x;
    st->xs = xs1;
    st->stats = stats;
    return 0;
}

/* The final norm and LM head on r rows of the stream x [r,C]: hn [r,C], lg [r,V] (device). */
static void head_logits(eng_model *m, const float *x, int r, float n_eff, float *hn, float *lg)
{
    const arch *a = &m->a;
    int C = a->hidden_size, V = a->vocab_size;
    m->be->rmsnorm_fwd(m->be, hn, NULL, x, m->final_norm, r, C, n_eff, (float)a->norm_eps);
    m->be->gemm(m->be, 0, 1, r, V, C, 1.0f, hn, C, m->lm_head, C, 0.0f, lg, V);
}

/* ROWS: the logits of the positions rows[0..n) of the final stream x [N,C], gathered R at
 * a time into the head's first R*C floats (the head is ALL's: R*(2C+V)). */
static void lm_head_rows(eng_model *m, fwd_state *st, const float *x, float *head, const int *rows, int n,
                         float *logits_host, float n_eff)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    int C = a->hidden_size, V = a->vocab_size, R = head_rows(st->B, st->N, ENG_LOGITS_ROWS);
    float *xg = head, *hn = head + (size_t)R * C, *lg = hn + (size_t)R * C;
    for (int r0 = 0; r0 < n; r0 += R) {
        int r = n - r0 < R ? n - r0 : R;
        for (int i = 0; i < r; i++)
            be->copy(be, xg + (size_t)i * C, x + (size_t)rows[r0 + i] * C, F4 * (size_t)C);
        head_logits(m, xg, r, n_eff, hn, lg);
        be->to_host(be, logits_host + (size_t)r0 * V, lg, F4 * (size_t)r * V);
    }
}

/* Logits for rows of the final stream x [N,C]: LAST gathers each row's last valid token. */
static void lm_head(eng_model *m, fwd_state *st, const float *x, float *head, int logits_mode,
                    float *logits_host, float n_eff)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    int C = a->hidden_size, V = a->vocab_size, B = st->B, T = st->T;
    if (logits_mode == ENG_LOGITS_LAST) {
        float *xg = head, *hn = head + (size_t)B * C, *lg = hn + (size_t)B * C;
        for (int b = 0; b < B; b++) {
            int last = st->lens_h[b] - 1;
            if (last < 0)
                be->zero(be, xg + (size_t)b * C, F4 * (size_t)C);
            else
                be->copy(be, xg + (size_t)b * C, x + ((size_t)b * T + last) * C, F4 * (size_t)C);
        }
        head_logits(m, xg, B, n_eff, hn, lg);
        be->to_host(be, logits_host, lg, F4 * (size_t)B * V);
        for (int b = 0; b < B; b++)
            if (st->lens_h[b] <= 0)
                memset(logits_host + (size_t)b * V, 0, F4 * (size_t)V);
    } else if (logits_mode == ENG_LOGITS_ALL) {
        int N = st->N, R = head_rows(B, N, logits_mode);
        float *hn = head + (size_t)R * C, *lg = hn + (size_t)R * C;
        for (int r0 = 0; r0 < N; r0 += R) {
            int r = N - r0 < R ? N - r0 : R;
            head_logits(m, x + (size_t)r0 * C, r, n_eff, hn, lg);
            be->to_host(be, logits_host + (size_t)r0 * V, lg, F4 * (size_t)r * V);
        }
    }
}

/* Everything eng_forward refuses before it allocates: empty batch, missing logits buffer,
 * tokens or lengths out of range, a cache of another model or batch or without room,
 * dynamic RoPE past its table. 0, or -1 with the reason in err. */
static int fwd_check_args(const eng_model *m, const eng_fwd_args *args, char *err, size_t errlen)
{
    const arch *a = &m->a;
    int B = args->B, T = args->T;
    if (B <= 0 || T <= 0) {
        snprintf(err, errlen, "forward: batch %d x %d tokens is empty", B, T);
        return -1;
    }
    if (args->logits_mode != ENG_LOGITS_NONE && !args->logits) {
        snprintf(err, errlen, "forward: logits requested without an output buffer");
        return -1;
    }
    if (args->logits_mode == ENG_LOGITS_ROWS) {
        if (args->n_logit_rows < 0 || (args->n_logit_rows > 0 && !args->logit_rows)) {
            snprintf(err, errlen, "forward: %d logit rows asked without their positions", args->n_logit_rows);
            return -1;
        }
        for (int i = 0; i < args->n_logit_rows; i++)
            if (args->logit_rows[i] < 0 || args->logit_rows[i] >= B * T) {
                snprintf(err, errlen, "forward: logit row %d is position %d, outside the batch's %d", i,
                         args->logit_rows[i], B * T);
                return -1;
            }
    }
    if (eng_check_tokens(args->tokens, (size_t)B * T, a->vocab_size, err, errlen) != 0)
        return -1;
    for (int b = 0; args->lens && b < B; b++)
        if (args->lens[b] < 0 || args->lens[b] > T) {
            snprintf(err, errlen, "forward: lens[%d] = %d is out of range [0, %d]", b, args->lens[b], T);
            return -1;
        }
    eng_kv_cache *kv = args->kv;
    if (kv) {
        if (kv->m != m || kv->B != B) {
            snprintf(err, errlen, "forward: KV cache was made for another model or batch (%d rows, got %d)", kv->B, B);
            return -1;
        }
        for (int b = 0; b < B; b++)
            if (kv->len[b] + T > kv->max_T) {
                snprintf(err, errlen, "forward: KV cache full (row %d holds %d of %d positions, %d more asked)", b,
                         kv->len[b], kv->max_T, T);
                return -1;
            }
    }
    if (a->rope_scaling.type == ROPE_SCALING_DYNAMIC) {
        int past = 0;
        for (int b = 0; kv && b < B; b++)
            past = imax(past, kv->len[b]);
        if (past + T > a->max_position_embeddings) {
            snprintf(err, errlen, "forward: dynamic RoPE scaling beyond max_position_embeddings (%d) is not "
                     "available in this build", a->max_position_embeddings);
            return -1;
        }
    }
    return 0;
}

int eng_forward(eng_model *m, const eng_fwd_args *args, char *err, size_t errlen)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    int B = args->B, T = args->T;
    eng_kv_cache *kv = args->kv;
    if (fwd_check_args(m, args, err, errlen) != 0)
        return -1;
    int *host_ints = malloc(sizeof(int) * (size_t)(2 * B * T + 2 * B));
    if (!host_ints) {
        snprintf(err, errlen, "forward: out of host memory");
        return -1;
    }
    fwd_state st;
    ws_t ws;
    float *xs1[1], *head;
    if (eng_fwd_setup(m, &st, &ws, host_ints, args->tokens, B, T, args->lens, kv, args->logits_mode, args->stats,
                      m->masks, xs1, &head) != 0) {
        free(host_ints);
        snprintf(err, errlen, "forward: out of device memory for the workspace of %d x %d tokens", B, T);
        return -1;
    }
    float *stat_host = NULL;
    if (args->stats) {
        dims_max d = max_dims(a);
        stat_host = malloc(F4 * (size_t)imax(a->hidden_size, imax(d.hq, d.f)));
        if (!stat_host) {
            eng_ws_free(be, &ws);
            free(host_ints);
            snprintf(err, errlen, "forward: out of host memory");
            return -1;
        }
        st.stat_host = stat_host;
    }
    st.layer_ns = args->layer_ns;
    st.fixed_ns = args->fixed_ns;
    eng_fwd_layers(m, &st);
    if (st.oom) {
        eng_ws_free(be, &ws);
        free(stat_host);
        free(host_ints);
        snprintf(err, errlen, "forward: out of memory for the scratch of an MoE or Mamba block of %d x %d tokens", B,
                 T);
        return -1;
    }
    double t0 = eng_wall_s();
    if (args->logits_mode == ENG_LOGITS_ROWS)
        lm_head_rows(m, &st, st.xs[0], head, args->logit_rows, args->n_logit_rows, args->logits, st.n_eff);
    else
        lm_head(m, &st, st.xs[0], head, args->logits_mode, args->logits, st.n_eff);
    if (args->fixed_ns) {
        be->sync(be);
        args->fixed_ns[1] = (eng_wall_s() - t0) * 1e9;
    }
    if (args->stats) {
        int64_t n = 0;
        for (int b = 0; b < B; b++)
            n += st.lens_h[b];
        args->stats->tokens += n;
    }
    if (kv)
        for (int b = 0; b < B; b++)
            kv->len[b] += st.lens_h[b];
    eng_ws_free(be, &ws);
    free(stat_host);
    free(host_ints);
    return 0;
}

/* ---- block by block ---------------------------------------------------------------------- */

struct eng_stepper {
    eng_model *m;
    int B, T, rows;              /* rows: sequences per pass (the workspace's batch) */
    const int *tokens;           /* borrowed host [B*T] */
    float *stream;               /* device [B*T, C]: the residual stream between blocks */
    fwd_state st;
    ws_t ws;
    int *host_ints;              /* staging for one pass: 2*rows*T + 2*rows */
    float *xs1[1], *head;
    float *logit_ws;             /* device: eng_stepper_loss's rows (made on first use) */
    size_t logit_bytes;
};

void eng_stepper_free(eng_stepper *s)
{
    if (!s)
        return;
    eng_backend *be = s->m->be;
    eng_ws_free(be, &s->ws);
    if (s->logit_ws)
        be->free(be, s->logit_ws, s->logit_bytes);
    if (s->stream)
        be->free(be, s->stream, F4 * (size_t)s->B * s->T * s->m->a.hidden_size);
    free(s->host_ints);
    free(s);
}

/* Point the state at sequences [b0, b0 + nb) of the batch: their tokens and positions
 * uploaded, N rows. */
static void stepper_bind(eng_stepper *s, int b0, int nb)
{
    eng_backend *be = s->m->be;
    int T = s->T, n = nb * T;
    int *dev = s->ws.i;
    eng_fwd_upload_ints(be, dev, s->host_ints, s->tokens + (size_t)b0 * T, NULL, NULL, nb, T);
    fwd_state *st = &s->st;
    st->B = nb;
    st->N = n;
    st->tok_d = dev;
    st->pos_d = dev + n;
    st->pos0_d = dev + 2 * n;
    st->lens_d = dev + 2 * n + nb;
    st->lens_h = s->host_ints + 2 * n + nb;
}

eng_stepper *eng_stepper_new(eng_model *m, const int *tokens, int B, int T, int rows, char *err, size_t errlen)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    if (B <= 0 || T <= 0) {
        snprintf(err, errlen, "stepper: batch %d x %d tokens is empty", B, T);
        return NULL;
    }
    if (eng_check_tokens(tokens, (size_t)B * T, a->vocab_size, err, errlen) != 0)
        return NULL;
    if (a->rope_scaling.type == ROPE_SCALING_DYNAMIC && T > a->max_position_embeddings) {
        snprintf(err, errlen, "stepper: dynamic RoPE scaling beyond max_position_embeddings (%d) is not "
                 "available in this build", a->max_position_embeddings);
        return NULL;
    }
    rows = rows <= 0 || rows > B ? B : rows;
    eng_stepper *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "stepper: out of host memory");
        return NULL;
    }
    s->m = m;
    s->B = B;
    s->T = T;
    s->rows = rows;
    s->tokens = tokens;
    s->host_ints = malloc(sizeof(int) * (size_t)(2 * rows * T + 2 * rows));
    s->stream = be->alloc(be, F4 * (size_t)B * T * a->hidden_size);
    if (!s->host_ints || !s->stream ||
        eng_fwd_setup(m, &s->st, &s->ws, s->host_ints, tokens, rows, T, NULL, NULL, ENG_LOGITS_NONE, NULL, NULL,
                      s->xs1, &s->head) != 0) {
        eng_stepper_free(s);
        snprintf(err, errlen, "stepper: out of memory for %d x %d tokens", B, T);
        return NULL;
    }
    size_t C = (size_t)a->hidden_size;
    for (int b0 = 0; b0 < B; b0 += rows) {
        int nb = B - b0 < rows ? B - b0 : rows;
        stepper_bind(s, b0, nb);
        be->embed_fwd(be, s->stream + (size_t)b0 * T * C, m->tok_emb, s->st.tok_d, nb * T, a->hidden_size);
    }
    return s;
}

int eng_stepper_block(eng_stepper *s, int layer, int part, int advance, const eng_step_capture *cap, char *err,
                      size_t errlen)
{
    eng_model *m = s->m;
    eng_backend *be = m->be;
    const arch *a = &m->a;
    if (layer < 0 || layer >= a->n_layers || (part != ENG_PART_ATTN && part != ENG_PART_MLP)) {
        snprintf(err, errlen, "stepper: no block %d.%d in a model of %d layers", layer, part, a->n_layers);
        return -1;
    }
    const arch_layer *al = &a->layers[layer];
    if (part == ENG_PART_MLP && al->moe.n_experts && cap && cap->proj_in) {
        snprintf(err, errlen, "stepper: layer %d's MLP is a mixture of experts: its projection inputs are not "
                 "captured in this build", layer);
        return -1;
    }
    int in = part == ENG_PART_ATTN ? (al->mamba.n_heads ? arch_mamba_inner(&al->mamba) : al->n_heads * a->head_dim)
                                   : al->ffn_dim;
    if (in == 0 && !(part == ENG_PART_MLP && al->moe.n_experts) && !(part == ENG_PART_ATTN && al->mamba.n_heads)) {
        snprintf(err, errlen, "stepper: layer %d has no %s", layer, part == ENG_PART_ATTN ? "attention" : "MLP");
        return -1;
    }
    size_t C = (size_t)a->hidden_size, T = (size_t)s->T;
    float *scratch = s->xs1[0];   /* the workspace's own stream [rows*T, C], unused otherwise */
    for (int b0 = 0; b0 < s->B; b0 += s->rows) {
        int nb = s->B - b0 < s->rows ? s->B - b0 : s->rows;
        stepper_bind(s, b0, nb);
        float *x = s->stream + (size_t)b0 * T * C, *out = advance ? x : scratch;
        if (part == ENG_PART_ATTN && al->mamba.n_heads)
            mamba_block(m, &s->st, layer, x, out, &s->st.tmp);
        else if (part == ENG_PART_ATTN)
            attn_block(m, &s->st, layer, x, out, &s->st.tmp);
        else
            mlp_block(m, &s->st, layer, x, out, &s->st.tmp);
        size_t n = (size_t)nb * T, row0 = (size_t)b0 * T;
        if (cap && cap->norm_in)
            be->to_host(be, cap->norm_in + row0 * C, s->st.xn, F4 * n * C);
        const float *pin = part == ENG_PART_MLP ? s->st.h
                         : al->mamba.n_heads ? eng_mamba_out_input(m, &s->st, layer) : s->st.tmp.o;
        if (cap && cap->proj_in && !pin) {
            snprintf(err, errlen, "stepper: layer %d's Mamba mixer ran without the workspace's scratch", layer);
            return -1;
        }
        if (cap && cap->proj_in)
            be->to_host(be, cap->proj_in + row0 * in, pin, F4 * n * (size_t)in);
        if (cap && cap->proj_out)
            be->to_host(be, cap->proj_out + row0 * C, s->st.tmp.y, F4 * n * C);
    }
    be->sync(be);
    if (s->st.oom) {
        s->st.oom = 0;
        snprintf(err, errlen, "stepper: out of memory for the scratch of layer %d's MoE or Mamba block", layer);
        return -1;
    }
    return 0;
}

void eng_stepper_stream(eng_stepper *s, float *dev, int to_stepper)
{
    eng_backend *be = s->m->be;
    size_t bytes = F4 * (size_t)s->B * s->T * s->m->a.hidden_size;
    if (to_stepper)
        be->copy(be, s->stream, dev, bytes);
    else
        be->copy(be, dev, s->stream, bytes);
}

int eng_stepper_run(eng_stepper *s, int l0, int l1, int skip, char *err, size_t errlen)
{
    const arch *a = &s->m->a;
    for (int l = l0; l < l1; l++)
        for (int part = 0; part < 2; part++) {
            int has = part == ENG_PART_ATTN ? arch_layer_has_mixer(&a->layers[l]) : arch_layer_has_mlp(&a->layers[l]);
            if (has && !(l == l0 && (skip >> part & 1)) && eng_stepper_block(s, l, part, 1, NULL, err, errlen))
                return -1;
        }
    return 0;
}

int eng_stepper_loss(eng_stepper *s, const int *targets, double *sum, char *err, size_t errlen)
{
    eng_model *m = s->m;
    eng_backend *be = m->be;
    const arch *a = &m->a;
    int C = a->hidden_size, V = a->vocab_size, N = s->B * s->T;
    int R = N < ENG_LOGIT_CHUNK_ROWS ? N : ENG_LOGIT_CHUNK_ROWS;
    if (!s->logit_ws) {   /* R rows: normed stream, logits, losses, targets */
        s->logit_bytes = F4 * (size_t)R * ((size_t)C + V + 2);
        s->logit_ws = be->alloc(be, s->logit_bytes);
        if (!s->logit_ws) {
            snprintf(err, errlen, "stepper: out of memory for the logits of %d rows", R);
            return -1;
        }
    }
    float *hn = s->logit_ws, *lg = hn + (size_t)R * C, *loss = lg + (size_t)R * V, *host = malloc(F4 * (size_t)R);
    int *tg = (int *)(loss + R);
    if (!host) {
        snprintf(err, errlen, "stepper: out of host memory");
        return -1;
    }
    double total = 0;
    for (int r0 = 0; r0 < N; r0 += R) {
        int r = N - r0 < R ? N - r0 : R;
        head_logits(m, s->stream + (size_t)r0 * C, r, s->st.n_eff, hn, lg);
        be->to_device(be, tg, targets + r0, sizeof(int) * (size_t)r);
        be->xent(be, loss, NULL, 0.0f, lg, tg, r, V);
        be->to_host(be, host, loss, F4 * (size_t)r);
        for (int i = 0; i < r; i++)   /* in row order: the same sum on every backend's threads */
            total += host[i];
    }
    free(host);
    *sum = total;
    return 0;
}

int eng_forward_loss(eng_model *m, const int *tokens, const int *targets, int B, int T, double *sum, char *err,
                     size_t errlen)
{
    if (m->masks) {
        snprintf(err, errlen, "forward loss: the model has search masks enabled (a loss of the masked model "
                 "goes through eng_forward)");
        return -1;
    }
    eng_stepper *s = eng_stepper_new(m, tokens, B, T, B, err, errlen);
    if (!s)
        return -1;
    int rc = eng_stepper_run(s, 0, m->a.n_layers, 0, err, errlen) || eng_stepper_loss(s, targets, sum, err, errlen)
                 ? -1 : 0;
    eng_stepper_free(s);
    return rc;
}
