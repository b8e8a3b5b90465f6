/* compress/search.h — the architecture search's math: a relaxed distribution over every
 * searchable axis, the expected cost of that distribution under per-part cost tables,
 * the two-sided constraint penalty with multipliers by gradient ascent, argmax decoding
 * and the greedy repair that lands a decoded arch at (never over) every limit.
 *
 * Axes: the global hidden size, and per layer the attention head count (in KV-group
 * units, 0 = removed; a Mamba-2 layer's head count instead, one count for every Mamba
 * layer), the MLP's size (FFN width, or the expert count of an MoE layer; 0 = removed)
 * and keep/remove. Every axis is a
 * categorical choice over a candidate list; its relaxed probabilities turn into soft
 * prefix masks on ranked units (m_j = P(size > j)). This module knows tables and
 * probabilities only: the DNAS driver (compress/dnas.c) runs the supernet, and
 * compress/costmodel.c fills the tables from calibration.
 */
#ifndef AC_COMPRESS_SEARCH_H
#define AC_COMPRESS_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "engine/arch.h"

#define SEARCH_MAX_CHOICES 64

/* Limits the search can enforce. Each is an upper bound on an additive cost; a
 * throughput floor is expressed as a bound on decode time (see search_limit). */
enum { SM_LATENCY = 0, SM_DECODE, SM_MEMORY, SM_PARAMS, SM_COUNT };
extern const char *const search_metric_names[SM_COUNT];

/* Candidate sizes, shared by every layer (per layer, candidates above the parent
 * layer's own size are masked out by `allowed`). Lists are ascending; the last entry is
 * the parent's size. heads are query-head counts (multiples of the KV group size). */
typedef struct {
    int n_layers;
    int n_hidden, hidden[SEARCH_MAX_CHOICES];
    int lat[SEARCH_MAX_CHOICES];              /* LatentMoE: the latent of hidden choice h (0: each layer's
                                                 own). With narrower latents the hidden axis holds
                                                 (size, latent) pairs, ascending in size, then latent,
                                                 the parent's own latent last: one global axis */
    int n_heads, heads[SEARCH_MAX_CHOICES];   /* heads[0] == 0 when removal allowed */
    int n_ffn, ffn[SEARCH_MAX_CHOICES];       /* ffn[0] == 0 when removal allowed */
    int n_exp, exp[SEARCH_MAX_CHOICES];       /* MoE layers: expert counts (exp[0] == 0 when removal allowed) */
    int expw[SEARCH_MAX_CHOICES];             /* and the routed experts' width of choice j (0: the layer's
                                                 own) */
    int shw[SEARCH_MAX_CHOICES];              /* and its shared expert's width (0: the layer's own); the
                                                 choices ascend in expert units (count x width + shared) */
    unsigned char *moe;                       /* [n_layers] 1: layer l's MLP is an MoE; its MLP axis
                                                 chooses exp[j] (j < n_exp), else ffn[j] */
    int n_mam, mam[SEARCH_MAX_CHOICES];       /* Mamba layers: head counts (multiples of the groups) */
    unsigned char *mamba;                     /* [n_layers] 1: layer l's mixer is Mamba-2; its heads axis
                                                 chooses mam[k] (k < n_mam), else heads[k]. The Mamba
                                                 layers' heads axes are one global axis: tied logits,
                                                 probabilities and choices, moved together */
    int tie_exp;                              /* 1: the MoE layers' MLP axes are one global axis (one
                                                 expert count for the model: llama.cpp's GGUF), tied
                                                 as the Mamba layers' heads axes are */
    int group;                                /* query heads per KV head */
    int depth;                                /* 1: per-layer keep/remove is searched */
    unsigned char *allowed_heads;             /* [n_layers*n_heads] 1 = choice allowed */
    unsigned char *allowed_ffn;               /* [n_layers*n_ffn] */
} search_space;

/* Per-part costs of one metric (units: ms, bytes or parameters), for every hidden
 * candidate h, layer l and choice k:
 *   total = fixed[h] + sum_l keep_l * (attn[h,l,k_l] + ffn[h,l,j_l]) + W
 * with the activation workspace W (memory only; the ws_* arrays may be NULL) combined
 * the way the engine allocates it:
 *   per-layer buffers:  W = max(ws_fixed[h], max_l keep_l * max(ws_attn[h,l,k_l], ws_ffn[h,l,j_l]))
 *   sum of maxima:      W = ws_fixed[h] + max(0, max_l keep_l * (ws_attn[h,l,k_l] - ws_fixed[h]))
 *                                       + max(0, max_l keep_l * (ws_ffn[h,l,j_l] - ws_fixed[h]))
 * A removed layer costs nothing. */
typedef struct {
    int active;          /* 1: this limit is part of the spec */
    double limit;        /* upper bound on total */
    double *fixed;       /* [n_hidden] */
    double *attn;        /* [n_hidden * n_layers * n_heads] */
    double *ffn;         /* [n_hidden * n_layers * n_ffn] */
    double *ws_fixed;    /* [n_hidden] or NULL */
    double *ws_attn;     /* [n_hidden * n_layers * n_heads] or NULL */
    double *ws_ffn;      /* [n_hidden * n_layers * n_ffn] or NULL */
    int ws_sum_of_maxima;/* 1: the sum-of-maxima rule above, 0: per-layer buffers */
} search_table;

typedef struct {
    search_table t[SM_COUNT];
} search_costs;

/* A point of the relaxed search: logits per axis and the probabilities derived from
 * them. Layout: hidden [n_hidden]; heads [n_layers*n_heads]; ffn [n_layers*n_ffn];
 * keep [n_layers*2] (index 1 = keep). */
typedef struct {
    const search_space *sp;
    double *logit_hidden, *logit_heads, *logit_ffn, *logit_keep;
    double *p_hidden, *p_heads, *p_ffn, *p_keep;
    double *g_hidden, *g_heads, *g_ffn, *g_keep;   /* d objective / d p (accumulated) */
} search_dist;

/* Allocate a distribution for sp with all logits favouring the parent size slightly
 * (init_bias on the largest allowed choice). Returns 0, or -1 on OOM. */
int search_dist_init(search_dist *d, const search_space *sp, double init_bias);
void search_dist_free(search_dist *d);

/* p = softmax((logit + gumbel)/tau) over allowed choices; gumbel noise drawn from rng
 * when rng != NULL, else none. Clears the p-gradients. */
void search_dist_probs(search_dist *d, double tau, uint64_t *rng);

/* Expected cost of the metric table under d's probabilities (the hidden axis and each
 * layer's axes independent; the workspace max smoothed with a log-sum-exp whose scale
 * is the table's largest workspace entry / `smooth`, e.g. 50; 0 = hard max). If grad_scale != 0, adds grad_scale * dE/dp to d's
 * p-gradients. Returns E[cost]. */
double search_expected_cost(search_dist *d, const search_table *t, double smooth, double grad_scale);

/* Exact cost of a concrete choice (indices into the candidate lists; keep[l] 0/1). */
typedef struct {
    int hidden;            /* index into sp->hidden */
    int *heads, *ffn;      /* [n_layers] indices */
    int *keep;             /* [n_layers] 0/1 */
} search_choice;
int search_choice_init(search_choice *c, const search_space *sp);
void search_choice_free(search_choice *c);
double search_choice_cost(const search_space *sp, const search_table *t, const search_choice *c);

/* Multipliers of the two-sided penalty lambda1*gap + lambda2*gap^2, gap = E/limit - 1. */
typedef struct {
    double lambda1[SM_COUNT], lambda2[SM_COUNT];
    double gap[SM_COUNT], expected[SM_COUNT];
} search_penalty;

/* Add the penalty's gradient to d (via search_expected_cost) for every active limit,
 * then move the multipliers by gradient ascent with step eta (lambda1 += eta*gap,
 * lambda2 += eta*gap^2; lambda1 may go negative). Returns the penalty value. */
double search_penalty_step(search_penalty *pen, search_dist *d, const search_costs *c,
                           double smooth, double weight, double eta);

/* Chain the accumulated p-gradients through the softmax at temperature tau into logit
 * gradients (out arrays have the logits' layout), as d p_i / d z_j = p_i(δij - p_j)/tau. */
void search_dist_logit_grads(const search_dist *d, double tau, double *gz_hidden, double *gz_heads,
                             double *gz_ffn, double *gz_keep);

/* Argmax of the logits (allowed choices only) into c. */
void search_decode_argmax(const search_dist *d, search_choice *c);

/* Greedy repair with the exact tables: while any active limit is violated, apply the
 * one-step shrink (one axis one candidate down, or removing a layer) with the least
 * score loss per unit of normalized cost saved; then, while one exists, apply the grow
 * step with the most score gain per unit of cost that keeps every limit. `score` of a
 * choice is the logit (higher = preferred). Returns 0 when every limit holds, or -1 when
 * even the cheapest choice violates one (c then holds the cheapest choice). */
int search_repair(const search_dist *d, const search_costs *costs, search_choice *c);

/* The cheapest choice of the space for metric m (every axis at its smallest allowed
 * size, layers kept unless depth is searched). */
void search_choice_cheapest(const search_space *sp, search_choice *c);

/* The cheapest choice that makes a model: search_choice_cheapest, and when that keeps no
 * layer with anything in it, one layer at its smallest non-empty mixer or MLP (the one
 * adding least, summed over the active limits relative to each). 0, or -1 when no layer
 * can hold anything. */
int search_choice_cheapest_layer(const search_space *sp, const search_costs *costs, search_choice *c);
/* The parent: every axis at its largest allowed size, all layers kept. */
void search_choice_parent(const search_space *sp, search_choice *c);

/* The MLP size of choice j in layer l: an FFN width, or an MoE layer's expert count
 * (-1: no such choice in that layer's list). */
int search_mlp_size(const search_space *sp, int l, int j);
/* The routed experts' width of choice j in MoE layer l (0: the layer's own; 0 elsewhere). */
int search_mlp_width(const search_space *sp, int l, int j);
/* Its shared expert's width (0: the layer's own; 0 elsewhere). */
int search_mlp_shared(const search_space *sp, int l, int j);
/* The mixer size of choice k in layer l: attention heads, or a Mamba layer's head count
 * (-1: no such choice in that layer's list). */
int search_mixer_size(const search_space *sp, int l, int k);

/* Build the arch of a choice from the parent (same globals; hidden size, per-layer
 * heads/kv heads/ffn or expert count (top-k capped at it); removed layers absent,
 * source_layer kept). Returns 0 or -1. */
int search_choice_arch(const search_space *sp, const search_choice *c, const arch *parent, arch *out);

#endif
