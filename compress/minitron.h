/* compress/minitron.h — the Minitron++ baseline (DESIGN.md §4): the same ranking, cost
 * model and limits as the AutoCompress search, but uniform per-layer dimensions.
 * Enumerate uniform (hidden, heads, FFN width, depth) candidates, keep the feasible ones
 * on the limit frontier (no other feasible candidate is at least as large on every
 * axis), prune each, distill each briefly and keep the best by validation loss. The
 * short distillations are its architecture-selection tokens.
 */
#ifndef AC_COMPRESS_MINITRON_H
#define AC_COMPRESS_MINITRON_H

#include <stddef.h>
#include <stdint.h>

#include "compress/costmodel.h"
#include "compress/dnas.h"

/* Train and validate one candidate: prune the ranked parent to `candidate`, distill it
 * with the trial budget and return its validation loss and the tokens it forwarded.
 * Returns 0, 1 when cancelled, or -1 with a reason. */
typedef int (*mn_trial_fn)(void *ctx, const arch *candidate, double *val_loss, int64_t *tokens,
                           char *err, size_t errlen);

typedef struct {
    const arch *parent;         /* ranked parent's arch */
    const int *layer_order;     /* [n_layers] least important first (rank_layer_order) */
    const cm_tables *tables;
    dnas_limits limits;
    dnas_axes axes;
    int max_candidates;         /* how many frontier candidates get a trial (default 4) */
    mn_trial_fn trial;
    void *trial_ctx;
} mn_opts;

typedef struct {
    arch arch;                  /* the winner (owned) */
    cm_prediction predicted;
    double val_loss;
    int64_t selection_tokens;
    int n_trials;
    int parent_feasible;
    double wall_s;
    arch *trials;               /* [n_trials] candidates tried, in order (owned) */
    double *trial_loss;         /* [n_trials] */
} mn_result;

void mn_result_free(mn_result *r);

/* The uniform candidate of (hidden, heads, ffn, experts, ewidth, swidth, mamba, depth): the
 * `depth` most important layers kept in their order, each with `heads` query heads (heads/group
 * KV heads), dense layers with FFN width `ffn`, MoE layers with `experts` experts (top-k capped
 * at it; the same count in every layer, as Minitron prunes experts) of `ewidth` units each and
 * a shared expert (where the layer has one) of `swidth` (0: the layer's own widths), Mamba
 * layers with `mamba` heads.
 * A nemotron_h layer keeps only the blocks its parent layer has. Returns 0 or -1 (OOM). */
int mn_uniform_arch(const arch *parent, const int *layer_order, int hidden, int heads, int ffn, int experts,
                    int ewidth, int swidth, int mamba, int depth, arch *out);

/* Frontier candidates, best first (largest predicted parameter count), at most `max`.
 * *out is a new array of n archs (free each with arch_free, then the array).
 * Returns 0 (n may be 0: nothing feasible, err then explains) or -1 with a reason. */
int mn_frontier(const mn_opts *o, arch **out, int *n, char *err, size_t errlen);

/* The baseline end to end. Returns 0 with r filled, 1 when cancelled, -1 with a reason
 * (an infeasible spec names the cheapest uniform candidate's predicted costs); r holds
 * nothing to free unless 0. */
int mn_run(const mn_opts *o, mn_result *r, char *err, size_t errlen);

#endif
