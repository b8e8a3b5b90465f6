/* compress/rank.h — Minitron-style importance ranking on calibration text and the
 * permutation that makes every narrower choice a prefix (DESIGN.md §4).
 *
 * Scores: FFN unit = mean |silu(gate)*up|; query head = mean L2 norm of its attention
 * output, KV group = sum over its query heads; expert (MoE layers) = its routed output
 * mass, the L2 norm of its output summed over the tokens routed to it, per token; Mamba head =
 * mean L2 norm of its gated-norm output (what out_proj reads of it), ranked inside its group
 * (a group's B and C serve its heads, so every group keeps the same count); LatentMoE latent
 * channel = its share of the mean |x| of the experts' latent input (fc1_latent_proj's output)
 * plus its share of the mean |x| of their weighted latent sum (what fc2_latent_proj reads): a
 * channel the experts neither read nor write is dropped first; hidden channel = mean |x| of the
 * normalized layer inputs; layer = calibration loss increase when its attention, its MLP
 * or both are skipped (gates at 0). Permutations sort units by descending score (ties by
 * index); query heads are sorted inside their KV group, groups by group score.
 * With ffn_obs the FFN units are ordered by greedy OBS instead (rank_obs_ffn).
 * A ranking is saved as JSON (scores + permutations) and reused for the same parent.
 */
#ifndef AC_COMPRESS_RANK_H
#define AC_COMPRESS_RANK_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "engine/model.h"
#include "compress/textdata.h"

typedef struct {
    int n_heads, n_kv_heads, ffn_dim;   /* the parent layer's widths */
    double *ffn_score;                  /* [ffn_dim] */
    int *ffn_perm;                      /* [ffn_dim]: position i holds parent unit ffn_perm[i] */
    double *head_score;                 /* [n_heads] */
    int *head_perm;                     /* [n_heads]: group-consistent (see rank_apply) */
    double *group_score;                /* [n_kv_heads] */
    int *group_perm;                    /* [n_kv_heads] */
    int n_experts;                      /* MoE layers: the parent layer's experts */
    int n_egroups;                      /* their routing groups (grouped sigmoid routing; else 1) */
    double *expert_score;               /* [n_experts] */
    int *expert_perm;                   /* [n_experts]: sorted inside their routing group, groups in place */
    double *expert_share;               /* [n_experts]: share of routed token slots */
    int expert_ffn, shared_ffn;         /* MoE layers: the parent's expert and shared-expert widths */
    double *unit_score;                 /* [n_experts*expert_ffn]: expert x's unit u at x*expert_ffn + u,
                                           experts in the parent's numbering */
    int *unit_perm;                     /* [n_experts*expert_ffn]: each expert's units by falling score */
    double *shared_score;               /* [shared_ffn] */
    int *shared_perm;                   /* [shared_ffn] */
    int latent;                         /* LatentMoE layers: the parent's latent width (else 0) */
    double *latent_score;               /* [latent] */
    int *latent_perm;                   /* [latent]: latent channels by falling score */
    int n_mamba, n_mgroups;             /* Mamba layers: the parent layer's heads and groups */
    double *mamba_score;                /* [n_mamba] */
    int *mamba_perm;                    /* [n_mamba]: heads sorted inside their group, groups in place */
    double skip_attn, skip_mlp, skip_layer;  /* loss increase (nats/token) when skipped */
} rank_layer;

typedef struct {
    int hidden_size, n_layers;
    double *hidden_score;               /* [hidden_size] */
    int *hidden_perm;                   /* [hidden_size] */
    rank_layer *layers;                 /* [n_layers] */
    double base_loss;                   /* calibration CE of the unmasked parent */
    int64_t tokens;                     /* tokens behind the activation scores */
    int64_t layer_tokens;               /* tokens behind the layer scores (0: not computed) */
    int keep_kv;                        /* 1: KV heads were held fixed (heads ranked inside groups only) */
    int ffn_obs;                        /* 1: FFN units in greedy OBS order (rank_obs_ffn) */
} rank_result;

typedef struct {
    int64_t tokens;         /* activation-statistics tokens */
    int64_t layer_tokens;   /* tokens for the layer-skip losses (0: skip that part) */
    int B, T;               /* batch rows and sequence length of calibration forwards */
    int keep_kv;            /* 1: rank query heads inside fixed KV groups only */
    int ffn_obs;            /* 1: order dense FFN units by greedy OBS (rank_obs_ffn) */
    int64_t obs_tokens;     /* calibration tokens behind its Grams */
    /* optional progress: called after every forward with (done, total forwards); a
     * non-zero return stops the ranking (rank_compute then returns 1) */
    int (*progress)(void *ctx, int64_t done, int64_t total);
    void *progress_ctx;
} rank_opts;

/* The ranking's defaults, the same for jobs and the prune/search commands: 4 rows of up
 * to 256 tokens per calibration forward, 32768 statistics tokens, 2048 tokens for each
 * layer-skip loss. No progress callback. */
void rank_opts_default(rank_opts *o);

/* The shortest sequence (tokens per row) a ranking forwards. */
#define RANK_MIN_SEQ 8

/* Fit o to a calibration stream of n tokens: shorter forwards (one row) when the text is
 * shorter than a window, token counts capped by the text. Returns 0, or -1 with a reason
 * when the text is too short to rank on (under RANK_MIN_SEQ + 1 tokens). */
int rank_opts_fit(rank_opts *o, size_t n, char *err, size_t errlen);

/* Run the parent on `calib` (from its start) and score every unit. Enables masks on m
 * when layer scores are asked for (left at 1.0 afterwards). Returns 0 with *out filled
 * (free with rank_free); 1 when stopped by the progress callback, or -1 with a reason
 * (stream too short, forward failure) in err; nothing to free on 1 or -1. */
int rank_compute(eng_model *m, const td_stream *calib, const rank_opts *o, rank_result *out,
                 char *err, size_t errlen);
void rank_free(rank_result *r);

/* FFN units by ZipLM's greedy OBS rule instead of activations (compress/rank_obs.c): for
 * every dense FFN layer of m, the Gram of down_proj's inputs on o->obs_tokens tokens of
 * `text` (sequences of 512, from its start), then the greedy removal order; each unit's
 * ffn_score becomes the step that removed it (0 = first; later = more important), so
 * rank_sort puts the last removed first. MoE layers keep their activation scores.
 * progress (o's) is called after each layer with (done + layers so far, total).
 * 0 (r->ffn_obs set), 1 when stopped, or -1 with a reason. */
int rank_obs_ffn(eng_model *m, const td_stream *text, const rank_opts *o, rank_result *r, int64_t done, int64_t total,
                 char *err, size_t errlen);

/* The greedy OBS removal order of the F input columns of W [C, F] (fp32, row-major) under
 * the Gram G [F, F] (damped by 1% of its mean diagonal): step[j] = the step removing
 * column j (0..F-1). 0; 1 when G is not positive definite; -1 out of memory. */
int rank_obs_order(const double *G, const float *W, int C, int F, double *step);

/* 0 if r was computed for a model of m's shape, else -1 with the mismatch in err. */
int rank_check(const rank_result *r, const eng_model *m, char *err, size_t errlen);

/* Reorder m's weights in place by r's permutations (hidden channels across every
 * tensor, KV groups with their query heads, query heads within groups, FFN units,
 * experts with their router rows, each expert's units and the shared expert's, a LatentMoE's
 * latent channels, Mamba heads within groups).
 * The model computes the same function afterwards (up to float summation order).
 * Masks, when enabled, are not reordered: they must be all 1.0 (as rank_compute leaves
 * them). Apply a ranking once: a second rank_apply permutes again. Returns 0, or -1 with
 * a reason in err (shape mismatch, out of memory). */
int rank_apply(eng_model *m, const rank_result *r, char *err, size_t errlen);

/* JSON form: {"version":1, "hidden_size", "n_layers", "tokens", "layer_tokens", "keep_kv", "ffn_order",
 * "base_loss", "hidden": {"score":[], "perm":[]}, "layers": [{"n_heads", "n_kv_heads",
 * "ffn_dim", "ffn": {"score", "perm"}, "heads": {"score", "perm"}, "groups": {"score",
 * "perm"}, "skip": {"attention", "mlp", "layer"}, MoE layers "experts": {"n_experts",
 * "score_perm", "share", "expert_ffn_dim", "units": [{"score", "perm"} per expert, parent
 * numbering], "shared_ffn_dim", "shared": {"score", "perm"} (with a shared expert), "latent_dim", "latent":
 * {"score", "perm"} (LatentMoE)}, Mamba layers "mamba": {"n_heads", "n_groups", "score_perm"}}]}. rank_to_json returns a NEW
 * reference (NULL on OOM); rank_from_json checks every permutation is one. */
json_t *rank_to_json(const rank_result *r);

/* A layer-skip loss as JSON can hold it: itself when finite; one that overflowed or is
 * NaN (skipping the layer broke the model: rank_layer_order puts it last) as 1e300, which
 * keeps that order. */
double rank_skip_finite(double x);
int rank_from_json(json_t *j, rank_result *out, char *err, size_t errlen);

/* Save atomically (temp file, fsync, rename) / load. 0, or -1 with a reason. */
int rank_save(const rank_result *r, const char *path, char *err, size_t errlen);
int rank_load(const char *path, rank_result *out, char *err, size_t errlen);

/* Layers ordered by ascending importance (skip_layer), into order[n_layers]: the ones a
 * depth-pruned arch should drop first. Falls back to layer index when not computed. */
void rank_layer_order(const rank_result *r, int *order);

#endif
