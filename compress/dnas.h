/* compress/dnas.h — the AutoCompress differentiable architecture search (DESIGN.md §4).
 *
 * The ranked parent becomes a supernet: every searchable axis (hidden size globally;
 * per layer attention heads in KV groups, FFN width, keep/remove) gets logits over its
 * candidate sizes; a Gumbel-softmax sample of them becomes soft prefix masks on the
 * ranked units. The loss is KD against the unmasked parent plus, for each limit, the
 * two-sided penalty on the expected cost under the timing tables and the itemized
 * memory model. At the end the argmax arch is repaired greedily against the same
 * tables so that it sits at, never over, every limit. The parent must already be ranked
 * (compress/rank): keeping width w keeps the first w units.
 */
#ifndef AC_COMPRESS_DNAS_H
#define AC_COMPRESS_DNAS_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "compress/costmodel.h"
#include "compress/search.h"
#include "compress/textdata.h"
#include "engine/model.h"

/* The limits of a spec; 0 = absent. */
typedef struct {
    double latency_ms;
    double throughput_tps;      /* floor on generated tokens/s at the workload's batch */
    double memory_bytes;
    double params;
} dnas_limits;

/* Which axes are searched (spec "search_space"). */
typedef struct {
    int hidden, heads, ffn, depth;
    int experts;                /* per-layer expert counts of MoE layers */
    int expert_widths;          /* per-layer routed-expert widths of MoE layers (those the tables price) */
    int shared_widths;          /* per-layer shared-expert widths of MoE layers (those the tables price) */
    int mamba;                  /* the Mamba head count (one for every Mamba layer) */
    int latent;                 /* LatentMoE: the latent width (one for every MoE layer; those the
                                   tables price), on the hidden axis (search_space.lat) */
    /* What the requested export formats can express (DESIGN.md §8); the search space
     * is cut to it so that export never has to change the chosen arch. */
    int keep_query_heads;       /* 1: query heads per layer stay the parent's (DeciLM) */
    int ffn_multiple;           /* > 0: FFN widths are multiples of it or the parent's (DeciLM: 256) */
    int no_removed_attention;   /* 1: attention goes only with its whole layer (GGUF) */
    int no_removed_mlp;         /* 1: the MLP goes only with its whole layer (GGUF) */
    int uniform_experts;        /* 1: one expert count for every MoE layer (GGUF: llama.cpp holds one) */
    int min_experts;            /* > 0: MoE layers keep at least this many experts (GGUF: 2) */
} dnas_axes;

/* Restrict axes to what every export format in `formats` ("hf", "deci", "gguf") can
 * express for `parent`. "deci" (DeciLM block_configs) keeps query heads and the hidden
 * size and uses FFN widths in multiples of 256. "hf" is LlamaForCausalLM for uniform
 * results and DeciLM otherwise: a hidden-only search stays uniform and is left alone;
 * with per-layer axes the DeciLM rules apply when the parent's FFN widths are multiples
 * of 256 (else DeciLM cannot hold any heterogeneous result and export reports it).
 * GGUF removes attention and MLP only with their layer. An MoE family's "hf" (its own class,
 * block_configs for what differs per layer) keeps query heads and the hidden size; its "gguf"
 * (one shape for every layer in llama.cpp) searches depth and one expert count for the model.
 * Nemotron-H's "hf" keeps the attention heads and MLP widths (one of each for the whole model)
 * and searches the hidden size, the Mamba head count and depth; its "gguf" one expert count.
 * A GGUF's MoE layers keep 2 experts or more (llama.cpp's graphs assert it). A Qwen2 parent
 * (q/k/v biases)'s "hf" is Qwen2ForCausalLM, one shape for every layer: only whole layers go
 * (its "deci" and "gguf" are refused by the spec check: neither can hold it). */
void dnas_axes_for_exports(dnas_axes *axes, const char *const *formats, int n, const arch *parent);

/* Progress of one iteration, for events. `arch_summary` is the current argmax arch. */
typedef struct {
    int iteration, iterations;
    double kd_loss, tau, penalty_weight;
    search_penalty pen;         /* gap, expected cost, multipliers per metric */
    int64_t tokens;
    const char *arch_summary;
} dnas_progress;

typedef int (*dnas_progress_fn)(void *ctx, const dnas_progress *p);   /* non-zero: cancel */

typedef struct {
    eng_model *parent;          /* ranked parent (teacher), borrowed */
    const cm_tables *tables;    /* calibration of the target, borrowed */
    dnas_limits limits;
    dnas_axes axes;
    const td_stream *data;      /* packed calibration/search tokens */
    int batch, seq;             /* search batch B x T */
    int64_t search_tokens;      /* architecture-selection token budget */
    double tau0, tau_min;       /* Gumbel temperature schedule (exponential anneal) */
    double lr;                  /* Adam step on the logits */
    double eta;                 /* multiplier ascent step */
    double lambda2_init;        /* starting quadratic multiplier (symmetric pull to the limit) */
    double warmup_frac;         /* share of iterations before the cost term ramps in */
    uint64_t seed;
    dnas_progress_fn progress;
    void *progress_ctx;
    /* The arch served where it will run (may be NULL; compress/servecheck.h): *measured
     * gets its latency_ms, decode_ms, total (peak bytes) and params as measured. The
     * repaired arch is checked up to DNAS_CHECKS times; a limit the measurement breaks
     * is tightened by the measured excess and the arch repaired again, one it meets with
     * 3% or more to spare is loosened by the room and the larger arch checked in turn (the
     * last arch measured within is kept). 0, or -1 with err. */
    int (*check)(void *ud, const arch *a, const cm_prediction *predicted, cm_prediction *measured, char *err,
                 size_t errlen);
    void *check_ud;
    /* What a served measurement must meet (fields 0: the search's limits): the limits as
     * given, less the measurement's own spread. `limits` is then the aim (less the
     * prediction's margin), and a measurement within with room left loosens it. */
    dnas_limits served_limits;
} dnas_opts;

#define DNAS_CHECKS 3

/* Defaults for the schedule knobs: tau 1 -> 0.1, Adam lr 0.1 on the logits, eta 0.3,
 * lambda2 from 3, 10% warm-up, batch 4 x 128 (method_run shrinks it for small budgets). */
void dnas_opts_defaults(dnas_opts *o);

typedef struct {
    arch arch;                  /* the chosen arch (owned) */
    cm_prediction predicted;    /* its predicted costs */
    int64_t selection_tokens;
    int iterations;
    double wall_s;
    int parent_feasible;        /* 1: the parent met every limit; arch is the parent's */
    json_t *distribution;       /* final probabilities per axis (new reference) */
    int checks;                 /* archs served by opts.check */
    int checked_within;         /* 1: the last check measured the returned arch within every limit */
    double final_gap[SM_COUNT]; /* E[cost]/limit - 1 at the last iteration (active limits) */
} dnas_result;

void dnas_result_free(dnas_result *r);

/* Build the search space and the per-part cost tables for `parent` from the tables and
 * the limits. Candidate sizes: hidden in eighths of the parent (those the tables
 * cover), heads in KV groups (0 allowed when depth or heads is searched), FFN width in
 * sixteenths (0 allowed likewise). Returns 0, or -1 with a reason. The out structures
 * own memory released by dnas_space_free. */
int dnas_space_build(const arch *parent, const cm_tables *tables, const dnas_limits *lim,
                     const dnas_axes *axes, search_space *sp, search_costs *costs, char *err, size_t errlen);
void dnas_space_free(search_space *sp, search_costs *costs);

/* Run the search. Returns 0 with r filled; 1 when cancelled through the progress
 * callback; -1 with a reason in err — an infeasible spec names the cheapest arch's
 * predicted costs. */
int dnas_run(const dnas_opts *o, dnas_result *r, char *err, size_t errlen);

/* Describe why limits fail for the cheapest choice: "latency_ms: cheapest 12.3 > limit 10".
 * Used by both search methods for the early infeasibility error. */
void dnas_describe_infeasible(const search_space *sp, const search_costs *costs, char *err, size_t errlen);

#endif
