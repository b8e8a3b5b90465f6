/* compress/reconstruct.c — the layer-by-layer least-squares refit of a pruned student
 * (compress/reconstruct.h). Two engine steppers, one per model, walk the same
 * calibration rows block by block; activations come to the host, where engine/linalg
 * accumulates X^T X and Y^T X in fp64 and solves in fp64, damped toward the slice. A
 * block's input projections (q/k/v, gate/up) share one solve: the map
 * M = (Xp^T Xs + lambda P)(Xs^T Xs + lambda I)^-1 from the student's normalized input Xs
 * to the parent's Xp, damped toward P, the kept channels' selection (M = P is the
 * slice), so each refit is W' = W_parent[rows] M.
 * A Mamba-2 mixer is refit the same way: in_proj's kept rows (the kept heads' z, x and dt
 * rows, every B and C row) by the input map, out_proj on the gated norm's output. An MoE
 * block's input projections (router, experts' gate/up, shared expert's gate/up and gate,
 * a latent's fc1, its kept latent rows) are refit by the same input map; where the experts
 * were narrowed, or their latent, each kept expert's down_proj is refit on the tokens the
 * student routes to it, its kept units' activations against the parent expert's output on
 * the same tokens (a LatentMoE's fc2_latent_proj stays the slice of its kept latent
 * columns), a narrowed shared
 * expert's on every token; or, with compensate, where the block lost experts or width, the
 * shared expert's down_proj against what the parent's block output leaves after the
 * student's routed experts (it takes up what the experts removed gave), and in a block
 * without a shared expert each kept expert's down_proj in turn, on its routed tokens, against
 * what the parent's block output leaves after the other kept experts.
 * Each finished layer is written to ckpt_dir as layer-NNNN.safetensors (its projections
 * and their outcome); a rerun loads those, replays the layers through both models (the
 * same kernels, so the same streams) and goes on with the first unfinished one.
 */
#include "compress/reconstruct.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/prune.h"
#include "engine/clock.h"
#include "engine/linalg.h"
#include "storage/archjson.h"
#include "storage/fileio.h"
#include "storage/safetensors.h"

const char *const recon_proj_names[RP_COUNT] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "in_proj", "out_proj", "router",
    "experts.gate_proj", "experts.up_proj", "shared_expert.gate_proj", "shared_expert.up_proj",
    "shared_expert_gate", "fc1_latent_proj", "experts.down_proj", "shared_expert.down_proj"};

void recon_proj_name(const arch *a, int l, int proj, char *out, size_t cap)
{
    int mlp = proj >= RP_GATE && proj <= RP_DOWN;
    if (arch_hybrid(a))
        snprintf(out, cap, "backbone.layers.%d.%s.%s.weight", l,
                 mlp && arch_layer_has_mixer(&a->layers[l]) ? "mlp" : "mixer", recon_proj_names[proj]);
    else
        snprintf(out, cap, "model.layers.%d.%s.%s.weight", l, mlp ? "mlp" : "self_attn", recon_proj_names[proj]);
}

void recon_opts_default(recon_opts *o)
{
    memset(o, 0, sizeof *o);
    o->tokens = 16384;
    o->T = 512;
    o->rows = 4;
    o->damp = 0.3;
    o->inputs = 1;
}

int recon_opts_fit(recon_opts *o, size_t n, char *err, size_t errlen)
{
    if (n < 8) {
        snprintf(err, errlen, "the calibration text holds only %zu tokens (reconstruction needs 8)", n);
        return -1;
    }
    if (n < (size_t)o->T)
        o->T = (int)n;
    if ((int64_t)n < o->tokens)
        o->tokens = (int64_t)n;
    if (o->tokens < o->T)
        o->tokens = o->T;
    return 0;
}

void recon_result_free(recon_result *r)
{
    if (r)
        free(r->p);
}

typedef struct {
    eng_model *P, *S;
    eng_stepper *sp, *ss;
    prune_select sel;
    const recon_opts *o;
    recon_result *r;
    int cap;                     /* r->p capacity */
    size_t N;
    int maxd, maxo;              /* widest refit input, widest refit output */
    float *X, *Xs, *Xp;          /* [N, maxd] projection input; [N, C'], [N, C] normalized inputs */
    float *Y, *T;                /* [N, C] parent projection output; [N, maxo] targets */
    float *W, *Wn, *Wp, *M;      /* [C', maxo] x2 (every refit matrix has C' on one side), [maxo, C]
                                    parent rows, [C, C'] input map */
    float *Wfull;                /* [widest parent input projection, C] */
    float *P0;                   /* [C, C'] the kept channels' selection */
    double *G, *R;               /* [maxd, maxd], [max(C' x maxd, C x C')] */
    int diverged;                /* the student's stream is no longer the parent's restricted to sel */
    int done, total;
} rc_state;

static int stopped(rc_state *s)
{
    return s->o->progress && s->o->progress(s->o->progress_ctx, s->r, s->done, s->total);
}

static int push(rc_state *s, const recon_proj *p)
{
    if (s->r->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        recon_proj *q = realloc(s->r->p, sizeof *q * (size_t)cap);
        if (!q)
            return -1;
        s->r->p = q;
        s->cap = cap;
    }
    s->r->p[s->r->n++] = *p;
    return 0;
}

/* The output projection's input width in the model of shape a: Hq*D, a Mamba mixer's H*P,
 * or F (0 where removed). */
static int in_width(const arch *a, int layer, int part)
{
    const arch_layer *l = &a->layers[layer];
    if (part == ENG_PART_ATTN)
        return l->mamba.n_heads ? arch_mamba_inner(&l->mamba) : l->n_heads * a->head_dim;
    return l->ffn_dim;
}

/* 1 when the part is an MoE: experts kept or dropped whole, only its input projections refit. */
static int moe_part(const arch *a, int layer, int part)
{
    return part == ENG_PART_MLP && a->layers[layer].moe.n_experts > 0;
}

/* 1 when student layer i's MoE keeps other experts, top_k, widths or latent than parent layer
 * src's (or is gone). */
static int moe_changed(const arch *pa, int src, const arch *sa, int i)
{
    const arch_layer *p = &pa->layers[src], *t = &sa->layers[i];
    return !t->moe.n_experts || t->moe.n_experts != p->moe.n_experts || t->moe.top_k != p->moe.top_k ||
           t->moe.expert_ffn_dim != p->moe.expert_ffn_dim || t->moe.shared_ffn_dim != p->moe.shared_ffn_dim ||
           t->moe.latent_dim != p->moe.latent_dim;
}

static double sum_sq(const float *x, size_t n)
{
    double t = 0;
    for (size_t k = 0; k < n; k++)
        t += (double)x[k] * x[k];
    return t;
}

/* Measure the student's projection `name` (rp->proj of layer rp->layer, [c, d]) on X [N, d]
 * against T [N, c]; with Wn (may be NULL), install Wn when it lowers the error. Fills
 * rp's errors and refit flag. 0, or -1 with a reason. */
static int try_weights(rc_state *s, recon_proj *rp, const char *name, const float *X, const float *T, size_t N,
                       const float *Wn, char *err, size_t errlen)
{
    int d = rp->in_dim, c = rp->out_dim;
    if (eng_model_get_tensor(s->S, name, s->W, (int64_t)c * d) != (int64_t)c * d) {
        snprintf(err, errlen, "reconstruct: the student lacks %s", name);
        return -1;
    }
    rp->target_sq = sum_sq(T, N * (size_t)c);
    rp->err_before = rp->err_after = eng_la_sq_residual(X, N, d, s->W, c, T, c);
    double e = Wn ? eng_la_sq_residual(X, N, d, Wn, c, T, c) : 0;
    if (rp->err_before < 0 || e < 0) {
        snprintf(err, errlen, "reconstruct: out of host memory");
        return -1;
    }
    if (Wn && e < rp->err_before) {
        int64_t shape[2] = {c, d};
        if (eng_model_set_tensor(s->S, name, Wn, shape, 2, err, errlen) != 0)
            return -1;
        rp->err_after = e;
        rp->refit = 1;
    }
    if (push(s, rp) != 0) {
        snprintf(err, errlen, "reconstruct: out of host memory");
        return -1;
    }
    return 0;
}

/* The student's projection `name` ([c, d] = rp's out and in) refit by damped least squares
 * from X [N, d] to T [N, c]. 0, 1 when stopped, -1. */
static int solve_output(rc_state *s, recon_proj *rp, const char *name, const float *X, const float *T, size_t N,
                        char *err, size_t errlen)
{
    int d = rp->in_dim, c = rp->out_dim;
    memset(s->G, 0, sizeof(double) * (size_t)d * d);
    memset(s->R, 0, sizeof(double) * (size_t)c * d);
    eng_la_gram(s->G, X, N, d);
    if (stopped(s))
        return 1;
    eng_la_cross(s->R, T, c, c, X, d, N);
    /* damped toward the slice: the solve moves it only as far as the data supports */
    if (eng_model_get_tensor(s->S, name, s->W, (int64_t)c * d) != (int64_t)c * d) {
        snprintf(err, errlen, "reconstruct: the student lacks %s", name);
        return -1;
    }
    int rc = eng_la_ridge(s->G, s->R, s->W, d, c, s->o->damp, s->Wn, &rp->lambda);
    if (rc < 0) {
        snprintf(err, errlen, "reconstruct: out of host memory");
        return -1;
    }
    return try_weights(s, rp, name, X, T, N, rc == 0 ? s->Wn : NULL, err, errlen);   /* rc 1: the slice stays */
}

/* The output projection (o_proj / down_proj) from s->X (its input) against the parent's
 * output s->Y at the kept hidden channels. */
static int refit_output(rc_state *s, recon_proj *rp, char *err, size_t errlen)
{
    int c = rp->out_dim, C = s->P->a.hidden_size;
    for (size_t n = 0; n < s->N; n++)
        for (int j = 0; j < c; j++)
            s->T[n * c + j] = s->Y[n * C + s->sel.hidden[j]];
    char name[96];
    recon_proj_name(&s->S->a, rp->layer, rp->proj, name, sizeof name);
    if (!rp->pruned)
        return try_weights(s, rp, name, s->X, s->T, s->N, NULL, err, errlen);
    return solve_output(s, rp, name, s->X, s->T, s->N, err, errlen);
}

/* Where student layer i's experts are narrower than parent layer src's, or read and write a
 * narrower latent: each kept expert's down_proj from its kept units' activations (student
 * stream s->Xs, the tokens the student routes to it) to the parent expert's output on the
 * same tokens (parent stream s->Xp), at the kept channels (of the hidden size, or of a
 * LatentMoE's latent: its experts write the latent); without compensation,
 * a narrowed shared expert's likewise on every token (its output before its gate). 0, 1 when
 * stopped, -1. */
static int refit_expert_outputs(rc_state *s, int i, int src, char *err, size_t errlen)
{
    const arch_moe *se = &s->S->a.layers[i].moe, *pe = &s->P->a.layers[src].moe;
    const prune_layer_sel *l = &s->sel.layers[i];
    int C = s->P->a.hidden_size, c = s->S->a.hidden_size;
    int *rows = malloc(sizeof(int) * s->N);
    float *Yp = malloc(sizeof(float) * s->N * (size_t)(pe->latent_dim > C ? pe->latent_dim : C));
    int rc = rows && Yp ? 0 : -1;
    if (rc)
        snprintf(err, errlen, "reconstruct: out of host memory");
    int first = se->expert_ffn_dim < pe->expert_ffn_dim || se->latent_dim < pe->latent_dim
                    ? 0 : se->n_experts;   /* the shared expert is e == n_experts */
    int last = !s->o->compensate && se->shared_ffn_dim < pe->shared_ffn_dim ? se->n_experts : se->n_experts - 1;
    for (int e = first; rc == 0 && e <= last; e++) {
        int sh = e == se->n_experts, x = sh ? -1 : e, lat = !sh && pe->latent_dim;
        int D = lat ? pe->latent_dim : C, cw = lat ? se->latent_dim : c;
        const char *name = eng_model_expert_down(s->S, i, x);
        int n = eng_moe_expert_io(s->S, i, x, s->Xs, (int)s->N, NULL, 0, rows, s->X, NULL, NULL);
        if (!name || n < 0 || (n > 0 && eng_moe_expert_io(s->P, src, sh ? -1 : l->exp[e], s->Xp, (int)s->N, rows, n,
                                                           NULL, NULL, Yp, NULL) != n)) {
            snprintf(err, errlen, "reconstruct: layer %d expert %d: out of memory running the experts", i, x);
            rc = -1;
            break;
        }
        for (int r = 0; r < n; r++)
            for (int j = 0; j < cw; j++)
                s->T[(size_t)r * cw + j] = Yp[(size_t)r * D + (!lat ? s->sel.hidden[j] : l->lat ? l->lat[j] : j)];
        recon_proj rp = {.layer = i, .source_layer = src, .proj = sh ? RP_SDOWN : RP_XDOWN, .expert = x,
                         .in_dim = sh ? se->shared_ffn_dim : se->expert_ffn_dim, .out_dim = cw, .pruned = 1};
        rc = n > 0 ? solve_output(s, &rp, name, s->X, s->T, (size_t)n, err, errlen) : 0;
    }
    free(rows);
    free(Yp);
    return rc;
}

/* With compensation, where student layer i's MoE lost experts, routed width or top-k, or its
 * shared expert narrowed: the shared expert's down_proj, on every token, from its units'
 * activations times its gate (student stream s->Xs) to what the parent's block output (parent stream s->Xp)
 * leaves after the student's routed experts, at the kept channels. So the shared expert
 * takes up what the removed experts, and the tokens routed elsewhere without them, no longer
 * give, as far as its units span it. 0, 1 when stopped, -1. */
static int refit_shared_output(rc_state *s, int i, int src, char *err, size_t errlen)
{
    const arch_moe *se = &s->S->a.layers[i].moe;
    int C = s->P->a.hidden_size, c = s->S->a.hidden_size, N = (int)s->N;
    const char *name = eng_model_expert_down(s->S, i, -1);
    int *rows = malloc(sizeof(int) * s->N);
    float *Yp = s->Y, *Ys = malloc(sizeof(float) * s->N * (size_t)c), *gs = malloc(sizeof(float) * s->N);
    int rc = rows && Ys && gs ? 0 : -1;
    if (rc)
        snprintf(err, errlen, "reconstruct: out of host memory");
    else if (!name || eng_moe_block(s->P, src, s->Xp, N, 1, Yp, NULL) != 0 ||
             eng_moe_block(s->S, i, s->Xs, N, 0, Ys, gs) != 0 ||
             eng_moe_expert_io(s->S, i, -1, s->Xs, N, NULL, 0, rows, s->X, NULL, NULL) != N) {
        snprintf(err, errlen, "reconstruct: layer %d: out of memory running the MoE block", i);
        rc = -1;
    }
    for (size_t n = 0; rc == 0 && n < s->N; n++) {
        for (int j = 0; j < c; j++)
            s->T[n * (size_t)c + (size_t)j] =
                Yp[n * (size_t)C + (size_t)s->sel.hidden[j]] - Ys[n * (size_t)c + (size_t)j];
        for (int u = 0; u < se->shared_ffn_dim; u++)
            s->X[n * (size_t)se->shared_ffn_dim + (size_t)u] *= gs[n];
    }
    if (rc == 0) {
        recon_proj rp = {.layer = i, .source_layer = src, .proj = RP_SDOWN, .expert = -1,
                         .in_dim = se->shared_ffn_dim, .out_dim = c, .pruned = 1};
        rc = stopped(s) ? 1 : solve_output(s, &rp, name, s->X, s->T, s->N, err, errlen);
    }
    free(rows);
    free(Ys);
    free(gs);
    return rc;
}

/* With compensation, where student layer i's MoE has no shared expert (Mixtral, OLMoE) and lost
 * experts, routed width or top-k: its kept experts' down_proj, one after another (a single
 * block coordinate descent sweep), each on the tokens the student routes to it, from its units'
 * activations times the routing weight to what the parent's block output (parent stream
 * s->Xp) leaves after the student's other routed experts as they are then, at the kept
 * channels. So the experts kept take up what the removed ones gave, as far as their units
 * span it, and each step can only lower the block's error on those tokens. 0, 1 when stopped,
 * -1. */
static int refit_routed_outputs(rc_state *s, int i, int src, char *err, size_t errlen)
{
    const arch_moe *se = &s->S->a.layers[i].moe;
    int C = s->P->a.hidden_size, c = s->S->a.hidden_size, N = (int)s->N, F = se->expert_ffn_dim;
    int *rows = malloc(sizeof(int) * s->N);
    float *Yp = s->Y, *Ys = malloc(sizeof(float) * s->N * (size_t)c), *Ye = malloc(sizeof(float) * s->N * (size_t)c);
    float *w = malloc(sizeof(float) * s->N);
    int rc = rows && Ys && Ye && w ? 0 : -1;
    if (rc)
        snprintf(err, errlen, "reconstruct: out of host memory");
    else if (eng_moe_block(s->P, src, s->Xp, N, 1, Yp, NULL) != 0) {
        snprintf(err, errlen, "reconstruct: layer %d: out of memory running the MoE block", i);
        rc = -1;
    }
    for (int x = 0; rc == 0 && x < se->n_experts; x++) {
        const char *name = eng_model_expert_down(s->S, i, x);
        int n = name && eng_moe_block(s->S, i, s->Xs, N, 0, Ys, NULL) == 0
                    ? eng_moe_expert_io(s->S, i, x, s->Xs, N, NULL, 0, rows, s->X, Ye, w) : -1;
        if (n < 0) {
            snprintf(err, errlen, "reconstruct: layer %d expert %d: out of memory running the experts", i, x);
            rc = -1;
            break;
        }
        for (int r = 0; r < n; r++) {   /* the parent's block less the others: less all, plus this one's share */
            size_t t = (size_t)rows[r];
            for (int j = 0; j < c; j++)
                s->T[(size_t)r * c + j] = Yp[t * C + (size_t)s->sel.hidden[j]] - Ys[t * c + j] + w[r] * Ye[(size_t)r * c + j];
            for (int u = 0; u < F; u++)
                s->X[(size_t)r * F + u] *= w[r];
        }
        recon_proj rp = {.layer = i, .source_layer = src, .proj = RP_XDOWN, .expert = x, .in_dim = F, .out_dim = c,
                         .pruned = 1};
        rc = stopped(s) ? 1 : n > 0 ? solve_output(s, &rp, name, s->X, s->T, (size_t)n, err, errlen) : 0;
    }
    free(rows);
    free(Ys);
    free(Ye);
    free(w);
    return rc;
}

/* The parent rows a student input projection keeps: [rows] into out, the count returned.
 * in_proj: z and x of the kept heads (head h is parent head mh[h]), every B and C row, dt
 * of the kept heads, in the student's order. */
static int kept_rows(const rc_state *s, int i, int proj, int *out)
{
    const prune_layer_sel *l = &s->sel.layers[i];
    int D = s->P->a.head_dim, n = 0;
    if (proj == RP_IN) {
        const arch_mamba *m = &s->P->a.layers[l->src].mamba;
        int P = m->head_dim, di = arch_mamba_inner(m), bc = 2 * m->n_groups * m->d_state;
        for (int part = 0; part < 2; part++)   /* z, then x */
            for (int h = 0; h < l->nm; h++)
                for (int j = 0; j < P; j++)
                    out[n++] = part * di + l->mh[h] * P + j;
        for (int k = 0; k < bc; k++)
            out[n++] = 2 * di + k;
        for (int h = 0; h < l->nm; h++)
            out[n++] = 2 * di + bc + l->mh[h];
        return n;
    }
    if (proj == RP_Q)
        for (int h = 0; h < l->nq; h++)
            for (int j = 0; j < D; j++)
                out[n++] = l->q[h] * D + j;
    else if (proj == RP_K || proj == RP_V)
        for (int g = 0; g < l->nkv; g++)
            for (int j = 0; j < D; j++)
                out[n++] = l->kv[g] * D + j;
    else
        for (int u = 0; u < l->nffn; u++)
            out[n++] = l->ffn[u];
    return n;
}

/* The map M = (Xp^T Xs + lambda P)(Xs^T Xs + lambda I)^-1 from the student's normalized
 * block input s->Xs to the parent's s->Xp, damped toward P, the kept channels' selection
 * (M = P gives the slice), into s->M. 0, 1 when the solve failed (the slices stay) or the
 * run was stopped (*stop set), -1 with a reason. */
static int input_map(rc_state *s, double *lambda, int *stop, char *err, size_t errlen)
{
    int C = s->P->a.hidden_size, c = s->S->a.hidden_size;
    memset(s->G, 0, sizeof(double) * (size_t)c * c);
    memset(s->R, 0, sizeof(double) * (size_t)C * c);
    eng_la_gram(s->G, s->Xs, s->N, c);
    if ((*stop = stopped(s)))
        return 1;
    eng_la_cross(s->R, s->Xp, C, C, s->Xs, c, s->N);
    memset(s->P0, 0, sizeof(float) * (size_t)C * c);
    for (int j = 0; j < c; j++)
        s->P0[(size_t)s->sel.hidden[j] * c + j] = 1.0f;
    int rc = eng_la_ridge(s->G, s->R, s->P0, c, C, s->o->damp, s->M, lambda);
    if (rc < 0)
        snprintf(err, errlen, "reconstruct: out of host memory");
    return rc;
}

/* One input projection `name` of student layer i: the parent's `pname` (prow rows of C),
 * its rows[0..n) kept; W' = W_parent[rows] M (when solved) against the targets
 * Xp W_parent[rows]^T. 0, 1 when stopped, -1. */
static int refit_input(rc_state *s, recon_proj *rp, const char *name, const char *pname, int64_t prow,
                       const int *rows, int n, int solved, char *err, size_t errlen)
{
    int C = s->P->a.hidden_size, c = s->S->a.hidden_size;
    if (eng_model_get_tensor(s->P, pname, s->Wfull, prow * C) != prow * C) {
        snprintf(err, errlen, "reconstruct: cannot read the parent's %s", pname);
        return -1;
    }
    for (int k = 0; k < n; k++)   /* the parent's kept rows */
        memcpy(s->Wp + (size_t)k * C, s->Wfull + (size_t)rows[k] * C, sizeof(float) * (size_t)C);
    eng_la_apply(s->Xp, s->N, C, s->Wp, n, s->T);
    if (solved)
        eng_la_matmul(s->Wp, s->M, s->Wn, n, c, C);
    rp->in_dim = c;
    rp->out_dim = n;
    rp->pruned = 1;
    if (try_weights(s, rp, name, s->Xs, s->T, s->N, solved ? s->Wn : NULL, err, errlen) != 0)
        return -1;
    return stopped(s);
}

/* The block's input projections (q/k/v or gate/up, a Mamba mixer's in_proj) of student
 * layer i, cut from parent layer src, by the input map. */
static int refit_inputs(rc_state *s, int i, int src, int part, char *err, size_t errlen)
{
    double lambda = 0;
    int stop = 0, rc = input_map(s, &lambda, &stop, err, errlen);
    if (rc < 0 || stop)
        return rc;
    const arch_layer *pl = &s->P->a.layers[src];
    int mamba = part == ENG_PART_ATTN && pl->mamba.n_heads;
    int first = mamba ? RP_IN : part == ENG_PART_ATTN ? RP_Q : arch_mlp_gated(&s->P->a) ? RP_GATE : RP_UP;
    int last = mamba ? RP_IN : part == ENG_PART_ATTN ? RP_V : RP_UP;
    int *rows = malloc(sizeof(int) * (size_t)s->maxo);
    if (!rows) {
        snprintf(err, errlen, "reconstruct: out of host memory");
        return -1;
    }
    int solved = rc == 0;
    rc = 0;
    char name[96], pname[96];
    for (int proj = first; rc == 0 && proj <= last; proj++) {
        int n = kept_rows(s, i, proj, rows);
        int64_t prow = proj == RP_IN ? arch_mamba_in_rows(&pl->mamba) : proj == RP_Q ? pl->n_heads * s->P->a.head_dim
                     : proj <= RP_V ? pl->n_kv_heads * s->P->a.head_dim : pl->ffn_dim;
        recon_proj_name(&s->P->a, src, proj, pname, sizeof pname);
        recon_proj_name(&s->S->a, i, proj, name, sizeof name);
        recon_proj rp = {.layer = i, .source_layer = src, .proj = proj, .expert = -1, .lambda = lambda};
        rc = refit_input(s, &rp, name, pname, prow, rows, n, solved, err, errlen);
    }
    free(rows);
    return rc;
}

/* Student layer i's MoE block (cut from parent layer src) by the input map: the router
 * (its kept experts' rows), each kept expert's and the shared expert's input projections
 * and the shared expert's gate, each against the same projection of the parent's. */
static int refit_moe_inputs(rc_state *s, int i, int src, char *err, size_t errlen)
{
    double lambda = 0;
    int stop = 0, rc = input_map(s, &lambda, &stop, err, errlen);
    if (rc < 0 || stop)
        return rc;
    int solved = rc == 0;
    int ns = eng_model_moe_inputs(s->S, i, NULL, 0), np = eng_model_moe_inputs(s->P, src, NULL, 0);
    eng_moe_input *si = calloc((size_t)ns + 1, sizeof *si), *pi = calloc((size_t)np + 1, sizeof *pi);
    int *rows = malloc(sizeof(int) * (size_t)s->maxo);
    rc = si && pi && rows ? 0 : -1;
    if (rc != 0)
        snprintf(err, errlen, "reconstruct: out of host memory");
    if (rc == 0) {
        eng_model_moe_inputs(s->S, i, si, ns);
        eng_model_moe_inputs(s->P, src, pi, np);
    }
    const prune_layer_sel *l = &s->sel.layers[i];
    for (int k = 0; rc == 0 && k < ns; k++) {
        int pe = si[k].expert >= 0 ? l->exp[si[k].expert] : -1, j = 0;
        while (j < np && (pi[j].kind != si[k].kind || pi[j].expert != pe))
            j++;
        int n = (int)si[k].rows;
        if (j == np || (si[k].kind == ENG_MOE_ROUTER ? n != l->nexp : pi[j].rows < n)) {
            snprintf(err, errlen, "reconstruct: the parent's layer %d has no projection like the student's %s", src,
                     si[k].name);
            rc = -1;
            break;
        }
        int xk = si[k].kind, unit = xk == ENG_MOE_XGATE || xk == ENG_MOE_XUP, shared = xk == ENG_MOE_SGATE || xk == ENG_MOE_SUP;
        for (int r = 0; r < n; r++)   /* the router's kept experts' rows, an expert's kept units', all of the others */
            rows[r] = xk == ENG_MOE_ROUTER ? l->exp[r]
                    : unit && l->ef ? l->ef[(size_t)si[k].expert * l->nef + r]
                    : shared && l->sf ? l->sf[r] : xk == ENG_MOE_LATENT && l->lat ? l->lat[r] : r;
        recon_proj rp = {.layer = i, .source_layer = src, .proj = RP_ROUTER + si[k].kind, .expert = si[k].expert,
                         .lambda = lambda};
        rc = refit_input(s, &rp, si[k].name, pi[j].name, pi[j].rows, rows, n, solved, err, errlen);
    }
    free(si);
    free(pi);
    free(rows);
    return rc;
}

/* One block (part) of student layer i, cut from parent layer src. replay: only advance
 * both streams (the layer's outcome is already known). 0, 1 when stopped, -1. */
static int block(rc_state *s, int i, int src, int part, int replay, char *err, size_t errlen)
{
    if (moe_part(&s->P->a, src, part)) {   /* an MoE: its inputs refit where the stream differs, narrowed experts' outputs */
        int kept = moe_part(&s->S->a, i, part), inputs = kept && s->o->inputs && s->diverged && !replay;
        const arch_moe *sm = &s->S->a.layers[i].moe, *pm = &s->P->a.layers[src].moe;
        int comp = s->o->compensate && kept && !replay && moe_changed(&s->P->a, src, &s->S->a, i);
        int shared = comp && sm->shared_ffn_dim, routed = comp && !sm->shared_ffn_dim && !pm->latent_dim;
        comp = shared || routed;   /* a LatentMoE without a shared expert: nothing compensates */
        int narrow = kept && !replay && !routed &&
                     (sm->expert_ffn_dim < pm->expert_ffn_dim || sm->latent_dim < pm->latent_dim ||
                      (!s->o->compensate && sm->shared_ffn_dim < pm->shared_ffn_dim));
        eng_step_capture pc = {.norm_in = s->Xp}, sc = {.norm_in = s->Xs};
        if (eng_stepper_block(s->sp, src, part, 1, inputs || narrow || comp ? &pc : NULL, err, errlen) != 0)
            return -1;
        if (inputs || narrow || comp) {
            int rc = stopped(s) ? 1 : eng_stepper_block(s->ss, i, part, 0, &sc, err, errlen) != 0 ? -1
                   : inputs ? refit_moe_inputs(s, i, src, err, errlen) : 0;
            if (rc == 0 && narrow)
                rc = refit_expert_outputs(s, i, src, err, errlen);
            if (rc == 0 && shared)   /* last: it fits what the routed experts, as refit, leave */
                rc = refit_shared_output(s, i, src, err, errlen);
            if (rc == 0 && routed)   /* in place of the narrowed experts' own fits */
                rc = refit_routed_outputs(s, i, src, err, errlen);
            if (rc != 0)
                return rc;
        }
        s->diverged |= moe_changed(&s->P->a, src, &s->S->a, i);
        return kept && eng_stepper_block(s->ss, i, part, 1, NULL, err, errlen) != 0 ? -1 : 0;
    }
    int p_in = in_width(&s->P->a, src, part), t_in = in_width(&s->S->a, i, part);
    if (!p_in)
        return 0;
    if (!t_in) {
        s->diverged = 1;
        return eng_stepper_block(s->sp, src, part, 1, NULL, err, errlen);
    }
    int inputs = s->o->inputs && s->diverged;   /* the block reads a stream unlike the parent's */
    int mamba = part == ENG_PART_ATTN && s->P->a.layers[src].mamba.n_heads;
    int out = mamba ? RP_OUT : part == ENG_PART_ATTN ? RP_O : RP_DOWN;
    recon_proj rp = {.layer = i, .source_layer = src, .proj = out, .expert = -1,
                     .in_dim = t_in, .out_dim = s->S->a.hidden_size, .pruned = t_in < p_in || s->diverged};
    s->diverged |= rp.pruned;
    if (replay)
        return eng_stepper_block(s->sp, src, part, 1, NULL, err, errlen) ||
               eng_stepper_block(s->ss, i, part, 1, NULL, err, errlen) ? -1 : 0;
    eng_step_capture pc = {.norm_in = inputs ? s->Xp : NULL, .proj_out = s->Y}, sc = {.norm_in = s->Xs};
    if (eng_stepper_block(s->sp, src, part, 1, &pc, err, errlen) != 0)
        return -1;
    if (stopped(s))
        return 1;
    if (inputs) {
        if (eng_stepper_block(s->ss, i, part, 0, &sc, err, errlen) != 0)
            return -1;
        int rc = refit_inputs(s, i, src, part, err, errlen);
        if (rc != 0)
            return rc;
    }
    /* unpruned: one pass both reads the input and advances (the weights stay) */
    sc = (eng_step_capture){.proj_in = s->X};
    if (eng_stepper_block(s->ss, i, part, !rp.pruned, &sc, err, errlen) != 0)
        return -1;
    if (stopped(s))
        return 1;
    int rc = refit_output(s, &rp, err, errlen);
    if (rc != 0)
        return rc;
    return rp.pruned ? eng_stepper_block(s->ss, i, part, 1, NULL, err, errlen) : 0;
}

/* Parent layers between the previous kept one and src: run whole; the student lost them. */
static int skip_parent_layers(rc_state *s, int from, int to, char *err, size_t errlen)
{
    for (int l = from; l < to; l++)
        for (int part = 0; part < 2; part++)
            if (in_width(&s->P->a, l, part) || moe_part(&s->P->a, l, part)) {
                s->diverged = 1;
                if (eng_stepper_block(s->sp, l, part, 1, NULL, err, errlen) != 0)
                    return -1;
            }
    return 0;
}

/* ---- checkpoints -------------------------------------------------------------------------- */

/* A number as JSON holds it: null when not finite (activations that overflowed), which
 * num_in reads back as NaN. */
static json_t *num_out(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

static int num_in(const json_t *v, double *x)
{
    if (json_is_null(v))
        *x = NAN;
    else if (json_is_number(v))
        *x = json_number_value(v);
    else
        return -1;
    return 0;
}

static json_t *proj_json(const recon_proj *p)
{
    double rel0 = p->target_sq > 0 ? p->err_before / p->target_sq : 0;
    double rel1 = p->target_sq > 0 ? p->err_after / p->target_sq : 0;
    json_t *j = json_pack("{s:i,s:i,s:s,s:i,s:i,s:b,s:b,s:o,s:o,s:o,s:o,s:o,s:o}", "layer", p->layer, "source_layer",
                          p->source_layer, "proj", recon_proj_names[p->proj], "in", p->in_dim, "out", p->out_dim,
                          "pruned", p->pruned, "refit", p->refit, "error_before", num_out(p->err_before),
                          "error_after", num_out(p->err_after), "target_sq", num_out(p->target_sq),
                          "rel_error_before", num_out(rel0), "rel_error_after", num_out(rel1), "lambda",
                          num_out(p->lambda));
    if (j && p->expert >= 0 && json_object_set_new(j, "expert", json_integer(p->expert)) != 0) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static int proj_from_json(json_t *j, recon_proj *p)
{
    const char *proj = NULL;
    int pruned = 0, refit_ = 0;
    memset(p, 0, sizeof *p);
    p->expert = -1;
    json_t *eb, *ea, *ts, *la;
    if (json_unpack(j, "{s:i,s:i,s:s,s:i,s:i,s:b,s:b,s:o,s:o,s:o,s:o}", "layer", &p->layer, "source_layer",
                    &p->source_layer, "proj", &proj, "in", &p->in_dim, "out", &p->out_dim, "pruned", &pruned,
                    "refit", &refit_, "error_before", &eb, "error_after", &ea, "target_sq", &ts, "lambda", &la) ||
        num_in(eb, &p->err_before) || num_in(ea, &p->err_after) || num_in(ts, &p->target_sq) ||
        num_in(la, &p->lambda))
        return -1;
    p->proj = -1;
    for (int k = 0; k < RP_COUNT; k++)
        if (!strcmp(proj, recon_proj_names[k]))
            p->proj = k;
    if (p->proj < 0)
        return -1;
    json_t *e = json_object_get(j, "expert");
    if (e && (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > 1 << 20))
        return -1;
    p->expert = e ? (int)json_integer_value(e) : -1;
    p->pruned = pruned;
    p->refit = refit_;
    return 0;
}

static void layer_path(char *buf, size_t n, const char *dir, int i)
{
    snprintf(buf, n, "%s/layer-%04d.safetensors", dir, i);
}

/* Write layer i's projections as they are now (those named by recon_proj_name, an MoE's
 * inputs and its experts' outputs) and the outcomes pushed since first. */
static int save_layer(rc_state *s, int i, int first, char *err, size_t errlen)
{
    int nm = eng_model_moe_inputs(s->S, i, NULL, 0), nx = s->S->a.layers[i].moe.n_experts;
    int cap = RP_ROUTER + nm + nx + (nx > 0), n = 0, rc = -1;   /* the experts' outputs, then the shared one's */
    st_write_tensor *t = calloc((size_t)cap, sizeof *t);
    char (*names)[96] = calloc((size_t)cap, sizeof *names);
    float **bufs = calloc((size_t)cap, sizeof *bufs);
    eng_moe_input *mi = calloc((size_t)nm + 1, sizeof *mi);
    if (!t || !names || !bufs || !mi)
        goto out;
    eng_model_moe_inputs(s->S, i, mi, nm);
    for (int k = 0; k < cap; k++) {
        if (k < RP_ROUTER)
            recon_proj_name(&s->S->a, i, k, names[n], sizeof names[n]);
        else if (k < RP_ROUTER + nm)
            snprintf(names[n], sizeof names[n], "%s", mi[k - RP_ROUTER].name);
        else {   /* the experts' down projections, then the shared expert's (-1) */
            int x = k - RP_ROUTER - nm < nx ? k - RP_ROUTER - nm : -1;
            const char *xd = eng_model_expert_down(s->S, i, x);
            snprintf(names[n], sizeof names[n], "%s", xd ? xd : "");
        }
        const char *name;
        int64_t shape[2];
        int ndim;
        float *dev;
        int j;
        for (j = eng_model_tensor_count(s->S) - 1; j >= 0; j--)
            if (eng_model_tensor(s->S, j, &name, shape, &ndim, &dev) == 0 && !strcmp(name, names[n]))
                break;
        if (j < 0)
            continue;   /* a removed part */
        bufs[n] = malloc(sizeof(float) * (size_t)(shape[0] * shape[1]));
        if (!bufs[n] || eng_model_get_tensor(s->S, names[n], bufs[n], shape[0] * shape[1]) < 0)
            goto out;
        t[n] = (st_write_tensor){.name = names[n], .data = bufs[n], .shape = {shape[0], shape[1]}, .ndim = 2};
        n++;
    }
    json_t *outcomes = json_array();
    for (int k = first; outcomes && k < s->r->n; k++)
        if (json_array_append_new(outcomes, proj_json(&s->r->p[k])) != 0) {
            json_decref(outcomes);
            outcomes = NULL;
        }
    char *text = outcomes ? json_dumps(outcomes, JSON_COMPACT) : NULL;
    json_decref(outcomes);
    json_t *meta = text ? json_pack("{s:s}", "projections", text) : NULL;
    free(text);
    char path[4200];
    layer_path(path, sizeof path, s->o->ckpt_dir, i);
    if (meta)
        rc = st_write(path, t, n, ST_F32, meta, err, errlen);
    json_decref(meta);
out:
    if (rc != 0 && !err[0])
        snprintf(err, errlen, "reconstruct: out of memory writing layer %d's checkpoint", i);
    for (int k = 0; bufs && k < cap; k++)
        free(bufs[k]);
    free(bufs);
    free(names);
    free(t);
    free(mi);
    return rc;
}

/* Load layer i's checkpoint into the student and its outcomes into r. 1 when there is
 * none, 0 when loaded, -1 when it exists but cannot be used. */
static int load_layer(rc_state *s, int i, char *err, size_t errlen)
{
    char path[4200];
    layer_path(path, sizeof path, s->o->ckpt_dir, i);
    if (!fio_is_file(path))
        return 1;
    st_file f;
    if (st_open(&f, path, err, errlen) != 0)
        return -1;
    int rc = 0;
    for (int k = 0; rc == 0 && k < f.n; k++) {
        float *buf = malloc(sizeof(float) * (size_t)(f.t[k].numel > 0 ? f.t[k].numel : 1));
        rc = !buf || st_read_f32(&f, k, buf, f.t[k].numel, err, errlen) ||
             eng_model_set_tensor(s->S, f.t[k].name, buf, f.t[k].shape, f.t[k].ndim, err, errlen) ? -1 : 0;
        free(buf);
    }
    const char *text = json_string_value(json_object_get(f.metadata, "projections"));
    json_t *arr = rc == 0 && text ? json_loads(text, 0, NULL) : NULL;
    if (rc == 0 && !json_is_array(arr))
        rc = -1;
    for (size_t k = 0; rc == 0 && k < json_array_size(arr); k++) {
        recon_proj p;
        rc = proj_from_json(json_array_get(arr, k), &p) || push(s, &p) ? -1 : 0;
    }
    json_decref(arr);
    st_close(&f);
    if (rc != 0 && !err[0])
        snprintf(err, errlen, "%s: not a reconstruction checkpoint of this student", path);
    return rc;
}

/* What the checkpoints depend on: options (the MoE compensation too), tokens and both
 * shapes. */
static json_t *ckpt_key(const rc_state *s, const int *tokens)
{
    char hex[32];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)td_ids_hash(tokens, s->N));
    return json_pack("{s:s,s:I,s:i,s:i,s:f,s:b,s:b,s:s,s:o,s:o}", "format", "autocompress-reconstruct-5", "tokens",
                     (json_int_t)s->N, "seq_len", s->r->T, "rows", s->o->rows, "damp", s->o->damp, "inputs",
                     s->o->inputs, "compensate", s->o->compensate, "token_hash", hex,
                     "parent", arch_to_json(&s->P->a), "student", arch_to_json(&s->S->a));
}

/* Make ckpt_dir hold checkpoints of this run only: a key of other options or another
 * student clears it. 0, or -1 with a reason. */
static int ckpt_open(rc_state *s, const int *tokens, char *err, size_t errlen)
{
    const char *dir = s->o->ckpt_dir;
    char path[4200];
    snprintf(path, sizeof path, "%s/reconstruct.json", dir);
    json_t *key = ckpt_key(s, tokens);
    if (!key) {
        snprintf(err, errlen, "reconstruct: out of memory");
        return -1;
    }
    char e[256];
    json_t *have = fio_is_file(path) ? fio_load_json(path, 0, e, sizeof e) : NULL;
    int same = have && json_equal(have, key);
    json_decref(have);
    int rc = 0;
    if (!same) {
        if ((fio_is_dir(dir) && fio_remove_tree(dir) != 0) || fio_mkdirs(dir) != 0) {
            snprintf(err, errlen, "%s: %s", dir, strerror(errno));
            rc = -1;
        } else {
            rc = fio_write_json(path, key, JSON_SORT_KEYS, err, errlen);
        }
    }
    json_decref(key);
    return rc;
}

/* ---- the run ---------------------------------------------------------------------------- */

/* The most rows of an MoE block's input projections (router, experts, shared expert, latent). */
static size_t moe_rows(const arch_moe *e)
{
    int r = e->n_experts;
    r = e->expert_ffn_dim > r ? e->expert_ffn_dim : r;
    r = e->shared_ffn_dim > r ? e->shared_ffn_dim : r;
    return (size_t)(e->latent_dim > r ? e->latent_dim : r);
}

static int state_alloc(rc_state *s, char *err, size_t errlen)
{
    const arch *pa = &s->P->a, *sa = &s->S->a;
    size_t C = (size_t)pa->hidden_size, c = (size_t)sa->hidden_size, D = (size_t)pa->head_dim;
    size_t maxd = c, maxo = c, maxp = 1, cw = c;   /* cw: the widest refit output side (a latent's) */
    for (int l = 0; l < sa->n_layers; l++) {   /* a Mamba mixer: out_proj reads H*P, in_proj writes more rows */
        const arch_layer *y = &sa->layers[l];
        size_t q = y->mamba.n_heads ? (size_t)arch_mamba_inner(&y->mamba) : (size_t)y->n_heads * D;
        size_t f = (size_t)y->ffn_dim, r = y->mamba.n_heads ? (size_t)arch_mamba_in_rows(&y->mamba) : 0;
        maxd = q > maxd ? q : maxd;
        maxd = f > maxd ? f : maxd;
        maxo = r > maxo ? r : maxo;
        maxo = moe_rows(&y->moe) > maxo ? moe_rows(&y->moe) : maxo;
        maxd = (size_t)y->moe.expert_ffn_dim > maxd ? (size_t)y->moe.expert_ffn_dim : maxd;   /* an expert's down_proj */
        maxd = (size_t)y->moe.shared_ffn_dim > maxd ? (size_t)y->moe.shared_ffn_dim : maxd;
        cw = (size_t)y->moe.latent_dim > cw ? (size_t)y->moe.latent_dim : cw;
    }
    maxo = maxd > maxo ? maxd : maxo;
    for (int l = 0; l < pa->n_layers; l++) {
        const arch_layer *y = &pa->layers[l];
        size_t q = y->mamba.n_heads ? (size_t)arch_mamba_in_rows(&y->mamba) : (size_t)y->n_heads * D, f = (size_t)y->ffn_dim;
        maxp = q > maxp ? q : maxp;
        maxp = f > maxp ? f : maxp;
        maxp = moe_rows(&y->moe) > maxp ? moe_rows(&y->moe) : maxp;
    }
    s->maxd = (int)maxd;
    s->maxo = (int)maxo;
    size_t nr = cw * maxd > C * c ? cw * maxd : C * c;
    s->X = malloc(sizeof(float) * s->N * maxd);
    s->Xs = malloc(sizeof(float) * s->N * c);
    s->Xp = malloc(sizeof(float) * s->N * C);
    s->Y = malloc(sizeof(float) * s->N * C);
    s->T = malloc(sizeof(float) * s->N * maxo);
    s->W = malloc(sizeof(float) * cw * maxo);
    s->Wn = malloc(sizeof(float) * cw * maxo);
    s->Wp = malloc(sizeof(float) * maxo * C);
    s->M = malloc(sizeof(float) * C * c);
    s->Wfull = malloc(sizeof(float) * maxp * C);
    s->P0 = malloc(sizeof(float) * C * c);
    s->G = malloc(sizeof(double) * maxd * maxd);
    s->R = malloc(sizeof(double) * nr);
    if (!s->X || !s->Xs || !s->Xp || !s->Y || !s->T || !s->W || !s->Wn || !s->Wp || !s->M || !s->Wfull || !s->P0 ||
        !s->G || !s->R) {
        snprintf(err, errlen, "reconstruct: out of host memory for %zu calibration tokens", s->N);
        return -1;
    }
    return 0;
}

static void state_free(rc_state *s)
{
    eng_stepper_free(s->sp);
    eng_stepper_free(s->ss);
    prune_select_free(&s->sel);
    float *f[] = {s->X, s->Xs, s->Xp, s->Y, s->T, s->W, s->Wn, s->Wp, s->M, s->Wfull, s->P0};
    for (size_t k = 0; k < sizeof f / sizeof f[0]; k++)
        free(f[k]);
    free(s->G);
    free(s->R);
}

int recon_run(eng_model *parent, eng_model *student, const td_stream *text, const recon_opts *o, recon_result *r,
              char *err, size_t errlen)
{
    double t0 = eng_wall_s();
    memset(r, 0, sizeof *r);
    err[0] = 0;
    recon_opts fit = *o;
    if (recon_opts_fit(&fit, text->n, err, errlen) != 0)
        return -1;
    rc_state s = {.P = parent, .S = student, .o = &fit, .r = r, .total = student->a.n_layers};
    r->T = fit.T;
    r->B = (int)(fit.tokens / fit.T);
    s.N = (size_t)r->B * r->T;
    r->tokens = (int64_t)s.N;
    int rc = prune_select_prefix(&parent->a, &student->a, &s.sel, err, errlen);
    if (rc == 0)
        rc = state_alloc(&s, err, errlen);
    if (rc == 0 && fit.ckpt_dir)
        rc = ckpt_open(&s, text->ids, err, errlen);
    if (rc == 0) {
        s.sp = eng_stepper_new(parent, text->ids, r->B, r->T, fit.rows, err, errlen);
        s.ss = s.sp ? eng_stepper_new(student, text->ids, r->B, r->T, fit.rows, err, errlen) : NULL;
        rc = s.ss ? 0 : -1;
    }
    s.diverged = s.sel.n_hidden < parent->a.hidden_size;
    int prev = -1, replay = fit.ckpt_dir != NULL;
    for (int i = 0; rc == 0 && i < student->a.n_layers; i++) {
        int src = student->a.layers[i].source_layer, first = r->n;
        if (replay) {
            rc = load_layer(&s, i, err, errlen);
            replay = rc == 0;
            r->resumed_layers += replay;
            if (rc == 1)
                rc = 0;
        }
        if (rc == 0)
            rc = skip_parent_layers(&s, prev + 1, src, err, errlen);
        for (int part = 0; rc == 0 && part < 2; part++)
            rc = block(&s, i, src, part, replay, err, errlen);
        prev = src;
        if (rc == 0 && fit.ckpt_dir && !replay)
            rc = save_layer(&s, i, first, err, errlen);
        s.done = i + 1;
        if (rc == 0 && stopped(&s))
            rc = 1;
    }
    state_free(&s);
    r->wall_s = eng_wall_s() - t0;
    if (rc < 0) {
        recon_result_free(r);
        memset(r, 0, sizeof *r);
    }
    return rc;
}

json_t *recon_result_json(const recon_result *r, const recon_opts *o)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < r->n; i++)
        json_array_append_new(arr, proj_json(&r->p[i]));
    return arr ? json_pack("{s:I,s:i,s:i,s:f,s:b,s:f,s:i,s:o}", "tokens", (json_int_t)r->tokens, "sequences", r->B,
                           "seq_len", r->T, "damp", o->damp, "inputs", o->inputs, "wall_s", r->wall_s,
                           "resumed_layers", r->resumed_layers, "projections", arr)
               : NULL;
}
