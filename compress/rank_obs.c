/* compress/rank_obs.c — FFN units ordered by ZipLM's greedy OBS rule (rank_opts.ffn_obs,
 * `prune --ffn-obs`): per layer, the Gram H = XᵀX of down_proj's inputs X on calibration text
 * (the parent, block by block: eng_stepper), then units removed one at a time, each the
 * column j of W = down_proj with the least ‖W[:,j]‖² / [H⁻¹]ⱼⱼ (the output error its
 * removal costs once the other columns are refit), W and H⁻¹ updated after each
 * (W -= W[:,j] H⁻¹[j,:] / H⁻¹ⱼⱼ; H⁻¹ -= H⁻¹[:,j] H⁻¹[j,:] / H⁻¹ⱼⱼ), H damped by 1% of its
 * mean diagonal. The removal order is a full order, so it is a ranking: a unit's score is
 * the step that removed it (later = more important) and every width keeps a prefix.
 */
#include "compress/rank.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/reconstruct.h"
#include "engine/linalg.h"

#define OBS_DAMP 0.01

/* Swap units a and b of the first k: rows of Wt [F, C], rows and columns of Hi [F, F]. */
static void swap_units(double *Wt, double *Hi, int *unit, int F, int C, int k, int a, int b)
{
    if (a == b)
        return;
    for (int c = 0; c < C; c++) {
        double t = Wt[(size_t)a * C + c];
        Wt[(size_t)a * C + c] = Wt[(size_t)b * C + c];
        Wt[(size_t)b * C + c] = t;
    }
    for (int i = 0; i < k; i++) {
        double t = Hi[(size_t)i * F + a];
        Hi[(size_t)i * F + a] = Hi[(size_t)i * F + b];
        Hi[(size_t)i * F + b] = t;
    }
    for (int j = 0; j < k; j++) {
        double t = Hi[(size_t)a * F + j];
        Hi[(size_t)a * F + j] = Hi[(size_t)b * F + j];
        Hi[(size_t)b * F + j] = t;
    }
    int t = unit[a];
    unit[a] = unit[b];
    unit[b] = t;
}

int rank_obs_order(const double *G, const float *W, int C, int F, double *step)
{
    double *Hi = malloc(sizeof(double) * (size_t)F * F), *Wt = malloc(sizeof(double) * (size_t)F * C);
    int *unit = malloc(sizeof(int) * (size_t)F);
    if (!Hi || !Wt || !unit) {
        free(Hi);
        free(Wt);
        free(unit);
        return -1;
    }
    memcpy(Hi, G, sizeof(double) * (size_t)F * F);
    int rc = eng_la_spd_inverse(Hi, F, OBS_DAMP, NULL);
    for (int j = 0; j < F; j++) {
        unit[j] = j;
        for (int c = 0; c < C; c++)
            Wt[(size_t)j * C + c] = W[(size_t)c * F + j];
    }
    /* the alive units are the first k rows (and columns) of Wt and Hi: the one removed is
       swapped to position k - 1 after its update */
    for (int k = F; rc == 0 && k > 0; k--) {
        int best = 0;
        double bs = INFINITY;
        for (int j = 0; j < k; j++) {
            double w2 = 0;
            for (int c = 0; c < C; c++)
                w2 += Wt[(size_t)j * C + c] * Wt[(size_t)j * C + c];
            double s = w2 / Hi[(size_t)j * F + j];
            if (s < bs) {
                bs = s;
                best = j;
            }
        }
        step[unit[best]] = F - k;
        const double *hj = Hi + (size_t)best * F, *wj = Wt + (size_t)best * C;
        double inv = 1.0 / hj[best];
#pragma omp parallel for schedule(static)
        for (int i = 0; i < k; i++) {
            if (i == best)
                continue;
            double f = Hi[(size_t)i * F + best] * inv;
            double *hi = Hi + (size_t)i * F, *wi = Wt + (size_t)i * C;
            for (int c = 0; c < C; c++)
                wi[c] -= f * wj[c];
            for (int j = 0; j < k; j++)
                hi[j] -= f * hj[j];
        }
        swap_units(Wt, Hi, unit, F, C, k, best, k - 1);
    }
    free(Hi);
    free(Wt);
    free(unit);
    return rc;
}

int rank_obs_ffn(eng_model *m, const td_stream *text, const rank_opts *o, rank_result *r, int64_t done, int64_t total,
                 char *err, size_t errlen)
{
    const arch *a = &m->a;
    int T = text->n < 512 ? (int)text->n : 512, B = (int)(o->obs_tokens / T);
    if (B < 1)
        B = 1;
    if ((size_t)B * T > text->n)
        B = (int)(text->n / T);
    int Fmax = 0, C = a->hidden_size;
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].ffn_dim > Fmax && a->layers[l].moe.n_experts == 0)
            Fmax = a->layers[l].ffn_dim;
    if (Fmax == 0)
        return 0;
    size_t N = (size_t)B * T;
    float *X = malloc(sizeof(float) * N * Fmax), *W = malloc(sizeof(float) * (size_t)C * Fmax);
    double *G = malloc(sizeof(double) * (size_t)Fmax * Fmax);
    eng_stepper *s = X && W && G ? eng_stepper_new(m, text->ids, B, T, 4, err, errlen) : NULL;
    int rc = s ? 0 : -1;
    if (!X || !W || !G)
        snprintf(err, errlen, "out of memory for the OBS ranking (%zu x %d activations)", N, Fmax);
    for (int l = 0; rc == 0 && l < a->n_layers; l++) {
        const arch_layer *L = &a->layers[l];
        if (arch_layer_has_mixer(L) && eng_stepper_block(s, l, ENG_PART_ATTN, 1, NULL, err, errlen))
            rc = -1;
        if (rc || !arch_layer_has_mlp(L))
            continue;
        int F = L->moe.n_experts ? 0 : L->ffn_dim;
        eng_step_capture cap = {.proj_in = F ? X : NULL};
        if (eng_stepper_block(s, l, ENG_PART_MLP, 1, &cap, err, errlen)) {
            rc = -1;
            break;
        }
        if (!F)
            continue;
        char name[128];
        recon_proj_name(a, l, RP_DOWN, name, sizeof name);
        if (eng_model_get_tensor(m, name, W, (int64_t)C * F) != (int64_t)C * F) {
            snprintf(err, errlen, "layers[%d]: no %s of %d x %d for the OBS ranking", l, name, C, F);
            rc = -1;
            break;
        }
        memset(G, 0, sizeof(double) * (size_t)F * F);
        eng_la_gram(G, X, N, F);
        int orc = rank_obs_order(G, W, C, F, r->layers[l].ffn_score);
        if (orc) {
            snprintf(err, errlen, "layers[%d]: %s", l, orc < 0 ? "out of memory in the OBS ranking"
                     : "the FFN's input Gram is not positive definite (no calibration signal)");
            rc = -1;
        }
        if (o->progress && rc == 0 && o->progress(o->progress_ctx, done + l + 1, total))
            rc = 1;
    }
    eng_stepper_free(s);
    free(X);
    free(W);
    free(G);
    if (rc == 0)
        r->ffn_obs = 1;
    return rc;
}
