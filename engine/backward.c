/* engine/backward.c — training: forward with saved activations, CE and KD losses over
 * chunks of LM-head rows, and the backward of every block into weight and mask gradients.
 * Gradients accumulate; eng_forward_backward never steps the weights (optim.c does).
 *
 * Memory: one workspace held for the call, freed before return (eng_train_workspace_bytes
 * computes exactly this; N = B*T, qd/kvd/F the maxima over layers, R = min(N,
 * ENG_LOGIT_CHUNK_ROWS)): residual chain (blocks+1) * N*C; per attention block N*(1 + 2 Hq*D
 * + 2 Hkv*D + Hq + C) (rstd, q, o, k, v, lse, y), per MLP block N*(1 + 2F_l + C) (rstd,
 * gate, up, y), per MoE or Mamba-2 block N*(1 + C) (rstd, y: their backward runs them again
 * from the block's input, with scratch of its own: eng_moe_bwd_scratch_bytes,
 * eng_mamba_bwd_bytes), each + N*C (r) when masks are enabled; backward scratch N*(4C + max(3qd +
 * 2kvd, 3F)) + 1; loss chunks R*(2C + 1 + 2V) (+ R*V teacher logits and N*C_teacher teacher
 * stream with KD; + L*N*C_teacher teacher layer outputs and N row losses with the
 * intermediate-state loss, L the student's layers) + 2R; ints 3N + 2B; attention tile
 * scratch threads * 2 * ENG_CPU_ATTN_ROWS * T (backward; the forward's is half). With KD the
 * teacher's forward runs first while this workspace is held; the peak takes the larger of it
 * and the backward's attention tiles.
 */
#include "engine/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model_internal.h"
#include "engine/mamba.h"
#include "engine/moe.h"

static int count_blocks(const arch *a)
{
    int n = 0;
    for (int l = 0; l < a->n_layers; l++)
        n += arch_layer_has_mixer(&a->layers[l]) + arch_layer_has_mlp(&a->layers[l]);
    return n;
}

typedef struct {
    size_t saved, scratch, loss;  /* floats */
} train_sizes;

static train_sizes train_floats(const arch *a, int B, int T, int with_masks, int teacher_C, int hidden)
{
    dims_max d = max_dims(a);
    size_t N = (size_t)B * T, C = (size_t)a->hidden_size, V = (size_t)a->vocab_size;
    train_sizes s = {0, 0, 0};
    int nb = count_blocks(a);
    s.saved = (size_t)(nb + 1) * N * C;                    /* residual chain */
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *ly = &a->layers[l];
        size_t qd = (size_t)ly->n_heads * a->head_dim, kvd = (size_t)ly->n_kv_heads * a->head_dim;
        if (ly->n_heads)
            s.saved += N * (1 + 2 * qd + 2 * kvd + (size_t)ly->n_heads + (with_masks ? 2 * C : C) +
                            (arch_qk_norm(a) ? 2 : 0));
        if (ly->ffn_dim)
            s.saved += N * (1 + 2 * (size_t)ly->ffn_dim + (with_masks ? 2 * C : C));
        if (ly->moe.n_experts)   /* rstd and y: the backward routes and runs the experts again */
            s.saved += N * (1 + (with_masks ? 2 * C : C));
        if (ly->mamba.n_heads)   /* rstd and y: the backward runs the mixer again */
            s.saved += N * (1 + (with_masks ? 2 * C : C));
    }
    /* backward scratch: dx, dyb, xn, dxn [N,C] + max(attention: om, dO, dq (qd), dk, dv (kvd);
     * mlp: z, zm, dz (F)) + the masked head output of the forward (qd, masks) */
    size_t attn = 3 * (size_t)d.qd + 2 * (size_t)d.kvd, mlp = 3 * (size_t)d.f;
    s.scratch = N * (4 * C + (attn > mlp ? attn : mlp)) + 1;
    size_t R = (size_t)(N < ENG_LOGIT_CHUNK_ROWS ? N : ENG_LOGIT_CHUNK_ROWS);
    s.loss = R * (2 * C + 1 + (teacher_C ? 3 : 2) * V) + 2 * R;
    s.loss += N * (size_t)teacher_C;                       /* teacher's normed final stream */
    if (hidden)                                            /* teacher's layer outputs, row losses */
        s.loss += (size_t)a->n_layers * N * (size_t)teacher_C + N;
    return s;
}

size_t eng_train_workspace_bytes(const eng_model *m, int B, int T, const eng_model *teacher, int hidden)
{
    train_sizes s = train_floats(&m->a, B, T, m->masks != NULL, teacher ? teacher->a.hidden_size : 0,
                                 teacher && hidden);
    size_t N = (size_t)B * T, attn = 0;
    int threads = m->be->threads > 0 ? m->be->threads : 1;
    for (int l = 0; l < m->a.n_layers; l++)
        attn |= m->a.layers[l].n_heads > 0;
    size_t held = (s.saved + s.scratch + s.loss) * F4 + sizeof(int) * (3 * N + 2 * (size_t)B);
    /* on top of it, at different times: the backward's attention tiles (threads x 2 x
     * ENG_CPU_ATTN_ROWS x T floats; the forward's are half), or the teacher's forward */
    size_t extra = attn ? (size_t)threads * 2 * ENG_CPU_ATTN_ROWS * T * F4 : 0;
    size_t moe = eng_moe_bwd_scratch_bytes(&m->a, B * T);   /* an MoE block's backward (its forward's is less) */
    extra = moe > extra ? moe : extra;
    size_t mamba = eng_mamba_bwd_bytes(&m->a, B, T);        /* a Mamba block's backward (likewise) */
    extra = mamba > extra ? mamba : extra;
    if (teacher) {
        size_t tw = eng_fwd_bytes(&teacher->a, B, T, 0, ENG_LOGITS_NONE, threads, 0, teacher != m && teacher->masks);
        extra = tw > extra ? tw : extra;
    }
    return held + extra;
}

/* y[N,out] = x[N,in] W^T backward: dW[out,in] += dy^T x (if dW); dx = dy W (+ beta dx). */
static void linear_bwd(eng_backend *be, float *dx, float beta, float *dW, const float *dy, const float *x,
                       const float *W, int N, int out, int in)
{
    if (dW)
        be->gemm(be, 1, 0, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW, in);
    if (dx)
        be->gemm(be, 0, 0, N, in, out, 1.0f, dy, out, W, in, beta, dx, in);
}

typedef struct {
    float *dx, *dyb, *xn, *dxn, *big;   /* big: block-specific scratch */
    float *d_neff;                      /* device scalar */
    int gw, gm;                         /* weight grads, mask grads wanted */
    int oom;                            /* an MoE block found no memory for its scratch */
} bwd_state;

/* Backward of the residual update and hidden mask: dx holds d x_out on entry and
 * d r (== d x_in along the skip path) on exit; returns the block output's gradient. */
static const float *residual_bwd(eng_model *m, fwd_state *st, bwd_state *bs, blk_act *A,
                                 const float *gate_dev, float *g_gate_dev)
{
    eng_backend *be = m->be;
    size_t n = (size_t)st->N * m->a.hidden_size;
    if (!st->mk)
        return bs->dx;
    be->mask_bwd(be, bs->dx, bs->gm ? m->masks->g_hidden : NULL, bs->dx, A->r, st->mk->hidden, st->N,
                 m->a.hidden_size, 1);
    if (bs->gm)
        be->dot_acc(be, g_gate_dev, bs->dx, A->y, n);
    be->zero(be, bs->dyb, n * F4);
    be->axpy_dev(be, bs->dyb, gate_dev, bs->dx, n);
    return bs->dyb;
}

/* d (the gradient at a normalized q or k, [N, W]) becomes the gradient at the projection's
 * output: the projection xn W^T (+ b) is recomputed into raw, the norm's backward written into
 * draw (both [N, W] scratch) and copied back; dnw (may be NULL) accumulates the norm weight's. */
static void qk_norm_bwd(eng_backend *be, float *d, float *raw, float *draw, const float *xn, const float *Wp,
                        const float *b, const float *nw, float *dnw, const float *rstd, int N, int W, int C)
{
    be->gemm(be, 0, 1, N, W, C, 1.0f, xn, C, Wp, C, 0.0f, raw, W);
    if (b)
        be->bias_add(be, raw, b, N, W);
    be->zero(be, draw, F4 * (size_t)N * W);
    be->rmsnorm_bwd(be, draw, dnw, NULL, d, raw, nw, rstd, N, W, (float)W);
    be->copy(be, d, draw, F4 * (size_t)N * W);
}

static void attn_bwd_block(eng_model *m, fwd_state *st, bwd_state *bs, int l, const float *x_in, blk_act *A)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    const eng_layer *L = &m->layers[l];
    eng_layer *G = &m->glayers[l];
    model_impl *im = m->impl;
    int N = st->N, C = a->hidden_size, D = a->head_dim;
    int Hq = a->layers[l].n_heads, Hkv = a->layers[l].n_kv_heads, qd = Hq * D, kvd = Hkv * D;
    const float *dy = residual_bwd(m, st, bs, A, st->mk ? st->mk->attn_gate + l : NULL,
                                   bs->gm ? m->masks->g_attn_gate + l : NULL);
    float *om = bs->big, *dO = om + (size_t)N * qd, *dq = dO + (size_t)N * qd;
    float *dk = dq + (size_t)N * qd, *dv = dk + (size_t)N * kvd;
    const float *omr = A->o;
    if (st->mk) {
        be->mask_fwd(be, om, A->o, st->mk->head[l], N, Hq, D);
        omr = om;
    }
    linear_bwd(be, dO, 0.0f, bs->gw ? G->wo : NULL, dy, omr, L->wo, N, C, qd);
    if (st->mk)
        be->mask_bwd(be, dO, bs->gm ? m->masks->g_head[l] : NULL, dO, A->o, st->mk->head[l], N, Hq, D);
    be->attn_bwd(be, dq, dk, dv, dO, A->q, A->k, A->v, A->o, A->lse, st->pos0_d, st->lens_d, st->B, st->T, st->T,
                 Hq, Hkv, D, (float)(1.0 / sqrt((double)D)));
    if (arch_rope(a)) {
        be->rope_bwd(be, dq, st->pos_d, im->inv_freq, N, Hq, D);
        be->rope_bwd(be, dk, st->pos_d, im->inv_freq, N, Hkv, D);
    }
    be->rmsnorm_fwd(be, bs->xn, NULL, x_in, L->attn_norm, N, C, st->n_eff, (float)a->norm_eps);
    if (L->q_norm) {   /* through the q/k norms: the projections again into om, their gradients into dO */
        qk_norm_bwd(be, dq, om, dO, bs->xn, L->wq, L->bq, L->q_norm, bs->gw ? G->q_norm : NULL, A->qrstd, N, qd, C);
        qk_norm_bwd(be, dk, om, dO, bs->xn, L->wk, L->bk, L->k_norm, bs->gw ? G->k_norm : NULL, A->krstd, N, kvd, C);
    }
    if (bs->gw && L->bq) {
        be->colsum_acc(be, G->bq, dq, N, qd);
        be->colsum_acc(be, G->bk, dk, N, kvd);
        be->colsum_acc(be, G->bv, dv, N, kvd);
    }
    linear_bwd(be, bs->dxn, 0.0f, bs->gw ? G->wq : NULL, dq, bs->xn, L->wq, N, qd, C);
    linear_bwd(be, bs->dxn, 1.0f, bs->gw ? G->wk : NULL, dk, bs->xn, L->wk, N, kvd, C);
    linear_bwd(be, bs->dxn, 1.0f, bs->gw ? G->wv : NULL, dv, bs->xn, L->wv, N, kvd, C);
    be->rmsnorm_bwd(be, bs->dx, bs->gw ? G->attn_norm : NULL, bs->gm ? bs->d_neff : NULL, bs->dxn, x_in,
                    L->attn_norm, A->rstd, N, C, st->n_eff);
}

static void mamba_bwd_block(eng_model *m, fwd_state *st, bwd_state *bs, int l, const float *x_in, blk_act *A)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    const eng_layer *L = &m->layers[l];
    int N = st->N, C = a->hidden_size;
    const float *dy = residual_bwd(m, st, bs, A, st->mk ? st->mk->attn_gate + l : NULL,
                                   bs->gm ? m->masks->g_attn_gate + l : NULL);
    be->rmsnorm_fwd(be, bs->xn, NULL, x_in, L->attn_norm, N, C, st->n_eff, (float)a->norm_eps);
    if (eng_mamba_bwd(m, st, l, bs->xn, dy, bs->dxn, bs->gw, bs->gm) != 0) {
        bs->oom = 1;
        be->zero(be, bs->dxn, F4 * (size_t)N * C);
    }
    be->rmsnorm_bwd(be, bs->dx, bs->gw ? m->glayers[l].attn_norm : NULL, bs->gm ? bs->d_neff : NULL, bs->dxn, x_in,
                    L->attn_norm, A->rstd, N, C, st->n_eff);
}

static void mlp_bwd_block(eng_model *m, fwd_state *st, bwd_state *bs, int l, const float *x_in, blk_act *A)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    const eng_layer *L = &m->layers[l];
    eng_layer *G = &m->glayers[l];
    int N = st->N, C = a->hidden_size, F = a->layers[l].ffn_dim;
    const float *dy = residual_bwd(m, st, bs, A, st->mk ? st->mk->mlp_gate + l : NULL,
                                   bs->gm ? m->masks->g_mlp_gate + l : NULL);
    if (a->layers[l].moe.n_experts) {
        be->rmsnorm_fwd(be, bs->xn, NULL, x_in, L->ffn_norm, N, C, st->n_eff, (float)a->norm_eps);
        if (eng_moe_bwd(m, l, st->mk, bs->xn, dy, bs->dxn, N, bs->gw, bs->gm) != 0) {
            bs->oom = 1;
            be->zero(be, bs->dxn, F4 * (size_t)N * C);
        }
        be->rmsnorm_bwd(be, bs->dx, bs->gw ? G->ffn_norm : NULL, bs->gm ? bs->d_neff : NULL, bs->dxn, x_in,
                        L->ffn_norm, A->rstd, N, C, st->n_eff);
        return;
    }
    float *z = bs->big, *zm = z + (size_t)N * F, *dz = zm + (size_t)N * F;
    int gated = arch_mlp_gated(a);
    if (gated)
        be->swiglu_fwd(be, z, A->gate, A->up, (size_t)N * F);
    else
        be->relu2_fwd(be, z, A->up, (size_t)N * F);
    const float *zr = z;
    if (st->mk) {
        be->mask_fwd(be, zm, z, st->mk->ffn[l], N, F, 1);
        zr = zm;
    }
    linear_bwd(be, dz, 0.0f, bs->gw ? G->w_down : NULL, dy, zr, L->w_down, N, C, F);
    if (st->mk)
        be->mask_bwd(be, dz, bs->gm ? m->masks->g_ffn[l] : NULL, dz, z, st->mk->ffn[l], N, F, 1);
    float *dgate = z, *dup = zm;   /* z and zm are dead now */
    if (gated)
        be->swiglu_bwd(be, dgate, dup, dz, A->gate, A->up, (size_t)N * F);
    else
        be->relu2_bwd(be, dup, dz, A->up, (size_t)N * F);
    be->rmsnorm_fwd(be, bs->xn, NULL, x_in, L->ffn_norm, N, C, st->n_eff, (float)a->norm_eps);
    if (gated)
        linear_bwd(be, bs->dxn, 0.0f, bs->gw ? G->w_gate : NULL, dgate, bs->xn, L->w_gate, N, F, C);
    linear_bwd(be, bs->dxn, gated ? 1.0f : 0.0f, bs->gw ? G->w_up : NULL, dup, bs->xn, L->w_up, N, F, C);
    be->rmsnorm_bwd(be, bs->dx, bs->gw ? G->ffn_norm : NULL, bs->gm ? bs->d_neff : NULL, bs->dxn, x_in,
                    L->ffn_norm, A->rstd, N, C, st->n_eff);
}

/* Teacher pass: its normed final stream [N,C] into out (device, on the student's backend);
 * with layer_out ([t's n_layers], NULL entries skipped), its stream after those layers too. */
static int teacher_final(eng_model *t, const int *tokens, int B, int T, int unmasked, float *out,
                         float **layer_out, char *err, size_t errlen)
{
    int *host_ints = malloc(sizeof(int) * (size_t)(2 * B * T + 2 * B));
    if (!host_ints) {
        snprintf(err, errlen, "teacher forward: out of host memory");
        return -1;
    }
    fwd_state st;
    ws_t ws;
    float *xs1[1], *head;
    const eng_masks *mk = unmasked ? NULL : t->masks;
    if (eng_fwd_setup(t, &st, &ws, host_ints, tokens, B, T, NULL, NULL, ENG_LOGITS_NONE, NULL, mk, xs1, &head) != 0) {
        free(host_ints);
        snprintf(err, errlen, "teacher forward: out of device memory for %d x %d tokens", B, T);
        return -1;
    }
    st.layer_out = layer_out;
    eng_fwd_layers(t, &st);
    if (st.oom) {
        eng_ws_free(t->be, &ws);
        free(host_ints);
        snprintf(err, errlen, "teacher forward: out of memory for the expert scratch of %d x %d tokens", B, T);
        return -1;
    }
    t->be->rmsnorm_fwd(t->be, out, NULL, st.xs[0], t->final_norm, st.N, t->a.hidden_size, st.n_eff,
                       (float)t->a.norm_eps);
    eng_ws_free(t->be, &ws);
    free(host_ints);
    return 0;
}

/* Everything eng_forward_backward refuses before it allocates: no loss, CE without
 * targets, a KD teacher that does not fit, an intermediate-state loss without KD, with masks,
 * with the model as its own teacher, a narrower teacher or a source layer it lacks, a negative
 * hidden_weight, gradients not enabled, tokens or targets out of range, dynamic RoPE past its
 * table, every target ignored. Sets *count to the counted
 * tokens. 0, or -1 with the reason in err. */
static int train_check(const eng_model *m, const int *tokens, int B, int T, const eng_loss_spec *loss,
                       int grad_flags, int64_t *count, char *err, size_t errlen)
{
    const arch *a = &m->a;
    int V = a->vocab_size;
    size_t N = (size_t)B * T;
    int want_ce = (loss->kind & ENG_LOSS_CE) != 0, want_kd = (loss->kind & ENG_LOSS_KD) != 0;
    if (B <= 0 || T <= 0 || (!want_ce && !want_kd)) {
        snprintf(err, errlen, "forward_backward: empty batch or no loss selected");
        return -1;
    }
    if (want_ce && !loss->targets) {
        snprintf(err, errlen, "forward_backward: CE loss needs targets");
        return -1;
    }
    if (want_kd && (!loss->teacher || loss->teacher->a.vocab_size != V || loss->teacher->be != m->be ||
                    !(loss->temperature > 0))) {
        snprintf(err, errlen, "forward_backward: KD needs a teacher with the same vocabulary on the same backend "
                              "and a positive temperature");
        return -1;
    }
    if (loss->hidden_weight > 0) {
        const eng_model *t = loss->teacher;
        if (!want_kd) {
            snprintf(err, errlen, "forward_backward: the intermediate-state loss needs KD (a teacher)");
            return -1;
        }
        if (t == m || m->masks) {
            snprintf(err, errlen, "forward_backward: the intermediate-state loss is for a student cut from its "
                                  "teacher: not with masks, nor with the model as its own teacher");
            return -1;
        }
        if (t->a.hidden_size < a->hidden_size) {
            snprintf(err, errlen, "forward_backward: the intermediate-state loss: the teacher's %d channels are "
                     "fewer than the student's %d", t->a.hidden_size, a->hidden_size);
            return -1;
        }
        for (int l = 0; l < a->n_layers; l++)
            if (a->layers[l].source_layer < 0 || a->layers[l].source_layer >= t->a.n_layers ||
                (l > 0 && a->layers[l].source_layer <= a->layers[l - 1].source_layer)) {
                snprintf(err, errlen, "forward_backward: the intermediate-state loss: student layer %d's source "
                         "layer %d is not a teacher layer after the previous one's (teacher has %d)", l,
                         a->layers[l].source_layer, t->a.n_layers);
                return -1;
            }
    } else if (loss->hidden_weight < 0 || loss->hidden_weight != loss->hidden_weight) {
        snprintf(err, errlen, "forward_backward: hidden_weight must be >= 0");
        return -1;
    }
    if ((grad_flags & ENG_GRAD_WEIGHTS) && !m->grads) {
        snprintf(err, errlen, "forward_backward: weight gradients asked but not enabled");
        return -1;
    }
    if ((grad_flags & ENG_GRAD_MASKS) && !m->masks) {
        snprintf(err, errlen, "forward_backward: mask gradients asked but masks are not enabled");
        return -1;
    }
    if (eng_check_tokens(tokens, N, V, err, errlen) != 0)
        return -1;
    if (a->rope_scaling.type == ROPE_SCALING_DYNAMIC && T > a->max_position_embeddings) {
        snprintf(err, errlen, "forward_backward: dynamic RoPE scaling beyond max_position_embeddings (%d) is not "
                 "available in this build", a->max_position_embeddings);
        return -1;
    }
    int64_t n = 0;
    for (size_t i = 0; i < N; i++) {
        if (loss->targets && loss->targets[i] >= V) {
            snprintf(err, errlen, "target %d at index %zu is out of range [-1, %d)", loss->targets[i], i, V);
            return -1;
        }
        n += loss->targets ? loss->targets[i] >= 0 : 1;
    }
    if (n == 0) {
        snprintf(err, errlen, "forward_backward: every target is ignored (-1)");
        return -1;
    }
    *count = n;
    return 0;
}

/* A training call's buffers: the backend workspace (saved | scratch | loss) and the host
 * arrays, with the pointers carved out of them. */
typedef struct {
    ws_t ws;
    int *host_ints;              /* host [3N + 2B]: tokens, positions, pos0, lens, targets */
    blk_act *acts;               /* [nb] saved activations per present block */
    float **xs;                  /* [nb + 1] residual chain */
    float *loss_host;            /* host [2 * ENG_LOGIT_CHUNK_ROWS] */
    int nb;                      /* present blocks */
    bwd_state bs;
    int R;                       /* rows per loss chunk */
    float *hn, *dhn, *rstd_c;    /* [R,C], [R,C], [R]: final norm of a chunk */
    float *lg, *dlg, *tlg;       /* [R,V]: logits, their gradient, teacher logits (KD) */
    float *thn;                  /* [N,C_teacher]: teacher's normed final stream (KD) */
    float *loss_ce, *loss_kd;    /* [R] per-row losses */
    float *tlay;                 /* [L,N,C_teacher]: the teacher's stream after student layer l's source
                                    layer (intermediate-state loss; NULL without) */
    float *loss_h;               /* [N] per-row cosine distances (likewise) */
    float **tlay_at;             /* host [teacher's n_layers]: where each teacher layer's output goes */
    const float **tread;         /* host [L]: the teacher's norm weight that reads student layer l's
                                    source layer's output (the channel weights of its loss) */
} train_ws;

static void train_free(eng_backend *be, train_ws *w)
{
    eng_ws_free(be, &w->ws);
    free(w->host_ints);
    free(w->acts);
    free(w->xs);
    free(w->loss_host);
    free(w->tlay_at);
    free(w->tread);
}

/* Allocate the workspace for B x T tokens (teacher width tC, 0 without KD; tL the teacher's
 * layers with the intermediate-state loss, else 0). 0, or -1 with the reason in err and nothing
 * left allocated. */
static int train_alloc(eng_model *m, train_ws *w, int B, int T, int tC, int tL, char *err, size_t errlen)
{
    eng_backend *be = m->be;
    size_t N = (size_t)B * T;
    train_sizes sz = train_floats(&m->a, B, T, m->masks != NULL, tC, tL > 0);
    memset(w, 0, sizeof *w);
    w->ws.f_bytes = (sz.saved + sz.scratch + sz.loss) * F4;
    w->ws.i_bytes = sizeof(int) * (3 * N + 2 * (size_t)B);
    w->host_ints = malloc(w->ws.i_bytes);
    w->nb = count_blocks(&m->a);
    w->acts = calloc((size_t)(w->nb ? w->nb : 1), sizeof *w->acts);
    w->xs = calloc((size_t)w->nb + 1, sizeof *w->xs);
    w->loss_host = malloc(sizeof(float) * 2 * ENG_LOGIT_CHUNK_ROWS);
    w->tlay_at = tL > 0 ? calloc((size_t)tL, sizeof *w->tlay_at) : NULL;
    w->tread = tL > 0 ? calloc((size_t)(m->a.n_layers ? m->a.n_layers : 1), sizeof *w->tread) : NULL;
    w->ws.f = be->alloc(be, w->ws.f_bytes);
    w->ws.i = be->alloc(be, w->ws.i_bytes);
    int lists = tL == 0 || (w->tlay_at && w->tread);
    if (!w->host_ints || !w->acts || !w->xs || !w->loss_host || !lists || !w->ws.f || !w->ws.i) {
        train_free(be, w);
        snprintf(err, errlen, "forward_backward: out of memory for %d x %d tokens (%zu workspace bytes)", B, T,
                 (size_t)((sz.saved + sz.scratch + sz.loss) * F4));
        return -1;
    }
    return 0;
}

/* Carve the float workspace in train_floats' order: saved (residual chain, then each
 * block's activations) | backward scratch | loss chunk buffers (| the intermediate-state
 * loss's, with hidden). */
static void train_carve(eng_model *m, train_ws *w, int B, int T, int tC, int hidden)
{
    const arch *a = &m->a;
    size_t N = (size_t)B * T, C = (size_t)a->hidden_size, V = (size_t)a->vocab_size;
    float *p = w->ws.f;
    for (int i = 0; i <= w->nb; i++) {
        w->xs[i] = p;
        p += N * C;
    }
    int blk = 0;
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *ly = &a->layers[l];
        size_t qd = (size_t)ly->n_heads * a->head_dim, kvd = (size_t)ly->n_kv_heads * a->head_dim;
        if (ly->n_heads) {
            blk_act *A = &w->acts[blk++];
            A->rstd = p; p += N;
            A->q = p; p += N * qd;
            A->o = p; p += N * qd;
            A->k = p; p += N * kvd;
            A->v = p; p += N * kvd;
            A->lse = p; p += N * (size_t)ly->n_heads;
            A->y = p; p += N * C;
            if (arch_qk_norm(a)) {
                A->qrstd = p; p += N;
                A->krstd = p; p += N;
            }
            if (m->masks) {
                A->r = p;
                p += N * C;
            }
        }
        if (ly->mamba.n_heads || ly->moe.n_experts) {   /* the mixer's, then the MLP's (one per layer) */
            blk_act *A = &w->acts[blk++];
            A->rstd = p; p += N;
            A->y = p; p += N * C;
            if (m->masks) {
                A->r = p;
                p += N * C;
            }
        }
        if (ly->ffn_dim) {
            blk_act *A = &w->acts[blk++];
            A->rstd = p; p += N;
            A->gate = p; p += N * (size_t)ly->ffn_dim;
            A->up = p; p += N * (size_t)ly->ffn_dim;
            A->y = p; p += N * C;
            if (m->masks) {
                A->r = p;
                p += N * C;
            }
        }
    }
    dims_max d = max_dims(a);
    bwd_state *bs = &w->bs;
    bs->dx = p; p += N * C;
    bs->dyb = p; p += N * C;
    bs->xn = p; p += N * C;
    bs->dxn = p; p += N * C;
    bs->d_neff = p; p += 1;
    bs->big = p;
    {
        size_t attn = 3 * (size_t)d.qd + 2 * (size_t)d.kvd, mlp = 3 * (size_t)d.f;
        p += N * (attn > mlp ? attn : mlp);
    }
    w->R = (int)(N < ENG_LOGIT_CHUNK_ROWS ? N : ENG_LOGIT_CHUNK_ROWS);
    size_t R = (size_t)w->R;
    w->hn = p; p += R * C;
    w->dhn = p; p += R * C;
    w->rstd_c = p; p += R;
    w->lg = p; p += R * V;
    w->dlg = p; p += R * V;
    if (tC) {
        w->tlg = p; p += R * V;
        w->thn = p; p += N * (size_t)tC;
    }
    w->loss_ce = p; p += R;
    w->loss_kd = p; p += R;
    if (hidden) {
        w->tlay = p; p += (size_t)a->n_layers * N * (size_t)tC;
        w->loss_h = p;
        for (int l = 0; l < a->n_layers; l++)
            w->tlay_at[a->layers[l].source_layer] = w->tlay + (size_t)l * N * tC;
    }
}

/* Upload tokens and targets (ints: tokens N | pos N | pos0 B | lens B | targets N), point
 * the forward state at the saved activations and run every layer. Returns the device
 * targets. */
static const int *train_forward(eng_model *m, train_ws *w, fwd_state *st, const int *tokens,
                                const int *targets, int B, int T)
{
    eng_backend *be = m->be;
    size_t N = (size_t)B * T;
    int *ints = w->ws.i, *host = w->host_ints;
    eng_fwd_upload_ints(be, ints, host, tokens, NULL, NULL, B, T);
    int *tgt_d = ints + 2 * N + 2 * B;
    for (size_t i = 0; i < N; i++)
        host[2 * N + 2 * B + i] = targets ? targets[i] : 0;
    be->to_device(be, tgt_d, host + 2 * N + 2 * B, sizeof(int) * N);

    memset(st, 0, sizeof *st);
    st->B = B;
    st->T = T;
    st->N = (int)N;
    st->tok_d = ints;
    st->pos_d = ints + N;
    st->pos0_d = ints + 2 * N;
    st->lens_d = ints + 2 * N + B;
    st->lens_h = host + 2 * N + B;
    st->mk = m->masks;
    st->n_eff = m->masks ? m->masks->hidden_count : (float)m->a.hidden_size;
    st->xn = w->bs.xn;
    st->om = w->bs.big;       /* forward-only use; backward rewrites it */
    st->h = w->bs.big;
    st->xs = w->xs;
    st->acts = w->acts;
    eng_fwd_layers(m, st);
    return tgt_d;
}

/* Add a chunk's r per-row losses (device) to *acc, one row at a time, through host. */
static void chunk_sum_add(double *acc, eng_backend *be, float *host, const float *dev, int r)
{
    be->to_host(be, host, dev, F4 * (size_t)r);
    for (int i = 0; i < r; i++)
        *acc += host[i];
}

/* Loss and head backward, chunk by chunk of R rows: final norm, LM head, CE and/or KD
 * (weighted w_ce/count, w_kd/count), then d lm_head, d final_norm and d x into bs.dx.
 * Adds the summed per-token losses to *sum_ce and *sum_kd. */
static void train_loss_bwd(eng_model *m, train_ws *w, const fwd_state *st, const eng_loss_spec *loss,
                           const int *tgt_d, double w_ce, double w_kd, int64_t count, double *sum_ce,
                           double *sum_kd)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    int C = a->hidden_size, V = a->vocab_size;
    int want_ce = (loss->kind & ENG_LOSS_CE) != 0, want_kd = (loss->kind & ENG_LOSS_KD) != 0;
    bwd_state *bs = &w->bs;
    size_t N = (size_t)st->N, R = (size_t)w->R;
    const float *xf = w->xs[w->nb];
    be->zero(be, bs->dx, N * C * F4);
    if (bs->gm)
        be->zero(be, bs->d_neff, F4);
    for (size_t r0 = 0; r0 < N; r0 += R) {
        int r = (int)(N - r0 < R ? N - r0 : R);
        be->rmsnorm_fwd(be, w->hn, w->rstd_c, xf + r0 * C, m->final_norm, r, C, st->n_eff, (float)a->norm_eps);
        be->gemm(be, 0, 1, r, V, C, 1.0f, w->hn, C, m->lm_head, C, 0.0f, w->lg, V);
        be->zero(be, w->dlg, (size_t)r * V * F4);
        const int *tg = loss->targets ? tgt_d + r0 : NULL;
        if (want_ce)
            be->xent(be, w->loss_ce, w->dlg, (float)(w_ce / count), w->lg, tg, r, V);
        if (want_kd) {
            eng_model *t = loss->teacher;
            int tC = t->a.hidden_size;
            be->gemm(be, 0, 1, r, V, tC, 1.0f, w->thn + r0 * tC, tC, t->lm_head, tC, 0.0f, w->tlg, V);
            be->kl(be, w->loss_kd, w->dlg, (float)(w_kd / count), w->lg, w->tlg, tg, r, V, loss->temperature);
        }
        if (want_ce)
            chunk_sum_add(sum_ce, be, w->loss_host, w->loss_ce, r);
        if (want_kd)
            chunk_sum_add(sum_kd, be, w->loss_host, w->loss_kd, r);
        if (bs->gw)
            be->gemm(be, 1, 0, V, C, r, 1.0f, w->dlg, V, w->hn, C, 1.0f, m->g_lm_head, C);
        be->gemm(be, 0, 0, r, C, V, 1.0f, w->dlg, V, m->lm_head, C, 0.0f, w->dhn, C);
        be->rmsnorm_bwd(be, bs->dx + r0 * C, bs->gw ? m->g_final_norm : NULL, bs->gm ? bs->d_neff : NULL, w->dhn,
                        xf + r0 * C, m->final_norm, w->rstd_c, r, C, st->n_eff);
    }
}

/* The norm weight [C_t] of the teacher's first block after its layer j (its final norm after
 * the last): the weights through which the teacher reads that layer's output. */
static const float *teacher_reader(const eng_model *t, int j)
{
    for (int k = j + 1; k < t->a.n_layers; k++) {
        if (arch_layer_has_mixer(&t->a.layers[k]))
            return t->layers[k].attn_norm;
        if (arch_layer_has_mlp(&t->a.layers[k]))
            return t->layers[k].ffn_norm;
    }
    return t->final_norm;
}

/* The intermediate-state loss (eng_loss_spec.hidden_weight): the sum over the student's
 * layers and rows of the cosine distance between its stream after layer l and the teacher's
 * after layer l's source (w->tlay, teacher width tC), both seen through the norm weight the
 * teacher reads that stream with (w->tread). Synchronizes. */
static double hidden_loss_sum(eng_model *m, train_ws *w, const fwd_state *st, int tC)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    size_t N = (size_t)st->N, R = 2 * ENG_LOGIT_CHUNK_ROWS;
    double sum = 0;
    int blk = 0;
    for (int l = 0; l < a->n_layers; l++) {
        blk += arch_layer_has_mixer(&a->layers[l]) + arch_layer_has_mlp(&a->layers[l]);
        be->cosd(be, w->loss_h, NULL, 0.0f, w->xs[blk], w->tlay + (size_t)l * N * tC, tC, w->tread[l], (int)N,
                 a->hidden_size);
        for (size_t r0 = 0; r0 < N; r0 += R)
            chunk_sum_add(&sum, be, w->loss_host, w->loss_h + r0, (int)(N - r0 < R ? N - r0 : R));
    }
    return sum;
}

/* Layers in reverse from bs.dx, then the hidden mask after the embedding (h0 = emb *
 * hidden), the embedding's gradient and d hidden_count. hscale > 0: each layer's output
 * first gets hscale times the gradient of its intermediate-state rows (teacher width tC). */
static void train_layers_bwd(eng_model *m, train_ws *w, fwd_state *st, float hscale, int tC)
{
    eng_backend *be = m->be;
    const arch *a = &m->a;
    int C = a->hidden_size;
    bwd_state *bs = &w->bs;
    int blk = w->nb;
    for (int l = a->n_layers - 1; l >= 0; l--) {
        if (hscale > 0)   /* xs[blk] is layer l's output */
            be->cosd(be, w->loss_h, bs->dx, hscale, w->xs[blk], w->tlay + (size_t)l * st->N * tC, tC, w->tread[l],
                     st->N, C);
        if (arch_layer_has_mlp(&a->layers[l])) {
            blk--;
            mlp_bwd_block(m, st, bs, l, w->xs[blk], &w->acts[blk]);
        }
        if (a->layers[l].mamba.n_heads) {
            blk--;
            mamba_bwd_block(m, st, bs, l, w->xs[blk], &w->acts[blk]);
        }
        if (a->layers[l].n_heads) {
            blk--;
            attn_bwd_block(m, st, bs, l, w->xs[blk], &w->acts[blk]);
        }
    }
    if (st->mk) {
        be->embed_fwd(be, bs->xn, m->tok_emb, st->tok_d, st->N, C);
        be->mask_bwd(be, bs->dx, bs->gm ? m->masks->g_hidden : NULL, bs->dx, bs->xn, st->mk->hidden, st->N, C, 1);
    }
    if (bs->gw)
        be->embed_bwd(be, m->g_tok_emb, bs->dx, st->tok_d, st->N, C);
    if (bs->gm) {
        float dn = 0;
        be->to_host(be, &dn, bs->d_neff, F4);
        m->masks->g_hidden_count += dn;
    }
}

int eng_forward_backward(eng_model *m, const int *tokens, int B, int T, const eng_loss_spec *loss,
                         int grad_flags, eng_loss_result *out, char *err, size_t errlen)
{
    eng_backend *be = m->be;
    memset(out, 0, sizeof *out);
    int64_t count = 0;
    if (train_check(m, tokens, B, T, loss, grad_flags, &count, err, errlen) != 0)
        return -1;
    int want_ce = (loss->kind & ENG_LOSS_CE) != 0, want_kd = (loss->kind & ENG_LOSS_KD) != 0;
    double w_kd = want_ce && want_kd ? loss->kd_weight : want_kd ? 1.0 : 0.0, w_ce = 1.0 - w_kd;
    int tC = want_kd ? loss->teacher->a.hidden_size : 0, hidden = loss->hidden_weight > 0;

    train_ws w;
    if (train_alloc(m, &w, B, T, tC, hidden ? loss->teacher->a.n_layers : 0, err, errlen) != 0)
        return -1;
    train_carve(m, &w, B, T, tC, hidden);
    for (int l = 0; hidden && l < m->a.n_layers; l++)
        w.tread[l] = teacher_reader(loss->teacher, m->a.layers[l].source_layer);
    w.bs.gw = (grad_flags & ENG_GRAD_WEIGHTS) != 0;
    w.bs.gm = (grad_flags & ENG_GRAD_MASKS) != 0;

    int rc = 0;
    if (want_kd) {
        eng_model *t = loss->teacher;
        rc = teacher_final(t, tokens, B, T, t == m, w.thn, w.tlay_at, err, errlen);
    }
    if (rc == 0) {
        fwd_state st;
        const int *tgt_d = train_forward(m, &w, &st, tokens, loss->targets, B, T);
        double sum_ce = 0, sum_kd = 0, sum_h = hidden && !st.oom ? hidden_loss_sum(m, &w, &st, tC) : 0;
        train_loss_bwd(m, &w, &st, loss, tgt_d, w_ce, w_kd, count, &sum_ce, &sum_kd);
        /* the intermediate-state term contributes hidden_weight times the logit loss (its weight
           taken from this call's values, held constant for the gradient) */
        double logit = (w_ce * sum_ce + w_kd * sum_kd) / count;
        float hscale = sum_h > 0 ? (float)(loss->hidden_weight * logit / sum_h) : 0.0f;
        if (!st.oom)
            train_layers_bwd(m, &w, &st, hscale, tC);
        be->sync(be);
        if (st.oom || w.bs.oom) {
            snprintf(err, errlen, "forward_backward: out of memory for the expert scratch of %d x %d tokens", B, T);
            rc = -1;
        }
        out->tokens = count;
        out->ce = sum_ce / count;
        out->kd = sum_kd / count;
        out->loss = w_ce * out->ce + w_kd * out->kd;
        out->hidden = hidden ? sum_h / ((double)m->a.n_layers * st.N) : 0;
    }
    train_free(be, &w);
    return rc;
}
