/* compress/method.h — one entry point for both search methods, shared by the job's
 * search stage and `autocompress search`: AutoCompress (DNAS, compress/dnas.h) or the
 * Minitron++ baseline (compress/minitron.h, whose candidates are pruned and distilled
 * briefly here), with events, progress and cancellation through callbacks, and the
 * search document (chosen arch, predicted costs, selection tokens, distribution or
 * trials) every consumer reads.
 */
#ifndef AC_COMPRESS_METHOD_H
#define AC_COMPRESS_METHOD_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "compress/dnas.h"
#include "compress/rank.h"

typedef struct {
    eng_model *parent;              /* ranked parent (teacher), borrowed */
    const cm_tables *tables;
    const td_stream *train, *val;   /* calibration text */
    dnas_limits limits;
    dnas_axes axes;
    int minitron;                   /* 0: AutoCompress DNAS, 1: Minitron++ */
    int64_t search_tokens;          /* DNAS budget; each Minitron++ trial distils half of it */
    int minitron_candidates;        /* frontier candidates trialled (default 4) */
    int reconstruct;                /* Minitron++ trials: reconstruct each pruned candidate
                                       (compress/reconstruct.h, on train) before distilling,
                                       as the prune stage does the final student when the spec
                                       asks (default 0: the trials distil, and distillation
                                       ends better from the plain slice) */
    const int *layer_order;         /* [n_layers] least important first (Minitron++ depth) */
    uint64_t seed;
    double eta, lambda2_init, lr;   /* DNAS schedule overrides (0: dnas_opts_defaults) */
    const cm_target *served;        /* the target to serve on (method_served_target):
                                       method_search anchors the tables to the parent served
                                       there now and serves the archs DNAS settles on
                                       (compress/servecheck.h); NULL: none */
    /* Callbacks (any may be NULL). event: type, message and data (stolen). progress:
     * step of total. cancelled: non-zero stops the search (return 1). */
    void (*event)(void *ud, const char *type, const char *message, json_t *data);
    void (*progress)(void *ud, int64_t step, int64_t total);
    int (*cancelled)(void *ud);
    void *ud;
} method_opts;

/* Defaults: every axis searched, AutoCompress DNAS, dnas_opts_defaults' seed, a budget
 * of 2,000,000 selection tokens (a job's budgets.search_tokens), trials not
 * reconstructed, no callbacks. The
 * parent, tables, text, limits and layer order must still be set. */
void method_opts_default(method_opts *o);

/* Fail fast, before any model work: 0 when some arch of the search space (as the axes
 * and exports cut it) meets every limit, else -1 with the cheapest arch's predicted
 * costs in err (also -1 when the space cannot be built). */
int method_check_feasible(const arch *parent, const cm_tables *tables, const dnas_limits *limits,
                          const dnas_axes *axes, char *err, size_t errlen);

/* The aim under the measured limits. The search lands on the archs with the least
 * predicted slack, so a cost model right on average still returns results measured
 * over the limit; the search therefore aims under latency and throughput by
 * margin.latency_pct and under memory by memory_pct (params is exact). given_pct >= 0
 * (the user's margin) sets both (source "spec"); given_pct < 0 takes the largest error
 * the calibration measured on its held-out archs for each quantity (for latency the
 * error of the anchored predictions when the calibration measured them, as a search
 * anchored to the parent predicts; validation:
 * the calibration's "validation" object, borrowed, may be NULL; source "calibration"),
 * or 0 when there is no validation, or when no arch of the space meets the tightened
 * limits (source "none: ..."; a later feasibility check then names the limits as
 * given). Fills *aimed from *limits. */
typedef struct {
    double latency_pct, memory_pct;
    char source[112];
    dnas_limits given;          /* the limits as given */
    double served_pct;          /* a served check's margin under them: the calibration's two fresh
                                   processes' spread (median over its held-out archs), 1..10%; 3%
                                   without one; the user's margin when that is larger */
} method_margin;
void method_aim(const arch *parent, const cm_tables *tables, const dnas_axes *axes, json_t *validation,
                double given_pct, const dnas_limits *limits, dnas_limits *aimed, method_margin *margin);
/* The limits a served check's measurement is judged against: the limits as given, less the
 * spread of such a measurement. Latency and throughput: served_pct (two processes' latencies
 * differ by it on the same arch). Memory: memory_pct only (the user's margin, or the largest
 * error of the calibration's held-out memory predictions), not served_pct: a served peak is
 * the engine's byte accounting, which the host's speed does not move. */
void method_served_limits(const method_margin *margin, dnas_limits *out);
/* The aim as JSON: {margin: {latency_pct, memory_pct, served_pct}, source, latency_ms?,
 * throughput_tokens_per_s?, memory_gib?}. New reference (NULL: no memory). */
json_t *method_aim_json(const dnas_limits *aimed, const method_margin *margin);

/* The target a search with these tables serves its anchor and checks on (method_opts.
 * served): theirs when they were measured here, by calibration in the built-in engine or
 * in llama.cpp; NULL for tables imported from an engine this product does not run. */
const cm_target *method_served_target(const cm_tables *tables);

/* The search step as the job's search stage and `autocompress search` both take it:
 * o->limits already hold the aim (method_aim) and margin says how it was picked. With
 * o->served, the tables are first anchored to the parent served on that target (unless
 * sc_anchor finds the machine cannot hold the parent beside the search: the document's
 * served.skipped says so and the tables as calibrated decide), both
 * methods search with the anchored tables, and DNAS's result is served before it is
 * returned (repaired when measured over the aim); the document's "served" holds the
 * anchor and every check (Minitron++'s result is not checked: its candidates are whole
 * uniform archs trialled by distillation, with no repair step to take a measurement). For
 * Minitron++ the layer order (least important first) comes from the ranking r
 * (borrowed; may be NULL for DNAS), not from o->layer_order. The aim (method_aim_json)
 * goes into the document as "aim". On 0, *chosen holds the arch (free with arch_free)
 * and *doc a NEW search document {method, arch, summary, selection_tokens, iterations,
 * wall_s, parent_feasible, predicted, distribution | trials, final_gap, aim, served?}.
 * Returns 1 when cancelled, -1 with a reason (an infeasible spec names the cheapest
 * costs). */
int method_search(const method_opts *o, const rank_result *r, const method_margin *margin, arch *chosen,
                  json_t **doc, char *err, size_t errlen);

#endif
