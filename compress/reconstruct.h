/* compress/reconstruct.h — least-squares reconstruction of a pruned student: layer by
 * layer, the calibration text runs through the dense (ranked) parent and through the
 * student as refit so far, and every projection whose inputs differ from the parent's —
 * o_proj after removed heads or KV groups, down_proj after removed FFN units, and any
 * projection downstream of something pruned, q/k/v and gate/up included (they read the
 * pruned residual stream; an MoE block's router, experts' and shared expert's input
 * projections likewise) — is refit by least squares against the parent's output on the
 * same tokens (its kept rows, and the kept hidden channels), damped toward the slice W0:
 * W' = (Y^T X + lambda W0)(X^T X + lambda I)^-1, lambda = damp * mean diag(X^T X), the
 * minimum of |X W'^T - Y|^2 + lambda |W' - W0|^2. A refit is kept only when it lowers
 * that projection's squared error on those tokens. A student cut to the parent's own
 * arch is left bit-identical.
 */
#ifndef AC_COMPRESS_RECONSTRUCT_H
#define AC_COMPRESS_RECONSTRUCT_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "compress/textdata.h"
#include "engine/model.h"

struct recon_result;

typedef struct {
    int64_t tokens;          /* calibration tokens: B sequences of T from the text's start */
    int T;                   /* sequence length */
    int rows;                /* sequences per engine pass (bounds the workspace) */
    double damp;             /* lambda as a share of the Gram matrix's mean diagonal */
    int inputs;              /* also refit q/k/v and gate/up (1), or only o_proj and down_proj */
    int compensate;          /* 1: an MoE block that lost experts or width refits its shared expert's
                                down_proj to the parent block's output less the student's routed
                                experts, or without a shared expert (and a latent) each kept
                                expert's down_proj on its tokens to the parent block's output less
                                the other kept experts; 0: a narrowed shared expert's to its
                                parent's own output, narrowed experts' to their parent's */
    const char *ckpt_dir;    /* finished layers are kept here and resumed from; NULL: none */
    /* optional: called between the steps of every layer with the outcomes so far (r->n
     * projections, in layer order), finished layers and layers; nonzero stops the run
     * (finished layers stay in ckpt_dir) */
    int (*progress)(void *ctx, const struct recon_result *r, int done, int total);
    void *progress_ctx;
} recon_opts;

/* 16,384 tokens as 32 x 512, 4 sequences per pass, damp 0.3 (bench/results/
 * prune_recovery.md: smaller damping overfits 16k tokens), inputs refit too, experts not
 * compensated (bench/results/prune_recovery-moe-compensation.md), no checkpoints. */
void recon_opts_default(recon_opts *o);

/* Fit o to a text of n tokens: shorter sequences (one) when the text is shorter than T,
 * fewer sequences when it is shorter than o->tokens. 0, or -1 with a reason when the
 * text holds fewer than 8 tokens. */
int recon_opts_fit(recon_opts *o, size_t n, char *err, size_t errlen);

/* The projections, in the order a layer refits them: attention, the MLP, a Mamba-2 mixer's
 * in_proj (z, x, B, C and dt rows: one map of the block's input) and out_proj; an MoE
 * block's inputs (engine/model.h's eng_moe_input kinds, in that order from RP_ROUTER):
 * the router, each expert's gate and up projections, the shared expert's gate and up
 * projections and its gate, a latent MoE's fc1_latent_proj; then, where the experts were
 * narrowed, each kept expert's down projection (RP_XDOWN), and a narrowed shared expert's
 * (RP_SDOWN). */
enum { RP_Q, RP_K, RP_V, RP_O, RP_GATE, RP_UP, RP_DOWN, RP_IN, RP_OUT, RP_ROUTER, RP_XGATE, RP_XUP, RP_SGATE,
       RP_SUP, RP_SGATEW, RP_LATIN, RP_XDOWN, RP_SDOWN, RP_COUNT };
extern const char *const recon_proj_names[RP_COUNT];   /* "q_proj" ... "out_proj", "router", "experts.gate_proj" ... */

/* The engine's name of projection proj (< RP_ROUTER) of layer l in a model of shape a
 * (engine/model.c): model.layers.l.self_attn.* and .mlp.*, or Nemotron-H's and Mamba-2's
 * backbone.layers.l.mixer.* (a layer holding a mixer and an MLP names the MLP's mlp.*). */
void recon_proj_name(const arch *a, int l, int proj, char *out, size_t cap);

/* One projection's outcome. Errors are sums of squares over the calibration tokens and
 * the projection's kept outputs; target_sq is the parent output's own sum of squares. */
typedef struct {
    int layer, source_layer;
    int proj;                /* RP_* */
    int expert;              /* RP_XGATE, RP_XUP, RP_XDOWN: the expert's index in the student's layer; else -1 */
    int in_dim, out_dim;     /* the refit matrix is [out_dim, in_dim] */
    int pruned;              /* 1: inputs or upstream differ from the parent's */
    int refit;               /* 1: the least-squares weights replaced the slice */
    double err_before, err_after, target_sq, lambda;
} recon_proj;

typedef struct recon_result {
    recon_proj *p;           /* [n], in layer order */
    int n;
    int64_t tokens;          /* B * T used */
    int B, T;
    int resumed_layers;      /* layers taken from ckpt_dir */
    double wall_s;
} recon_result;

/* Reconstruct student (cut from `parent` by compress/prune.h's prefix selection; both on
 * one backend) in place. parent is run, not changed. *r is filled on 0 and 1 (free with
 * recon_result_free). Returns 0 when every layer is done, 1 when stopped by o->progress
 * (the student then holds a partial refit: discard it; ckpt_dir resumes), -1 with a
 * reason (text too short, out of memory, a checkpoint that cannot be written). */
int recon_run(eng_model *parent, eng_model *student, const td_stream *text, const recon_opts *o, recon_result *r,
              char *err, size_t errlen);

/* {"tokens", "sequences", "seq_len", "damp", "inputs", "wall_s", "resumed_layers", "projections":
 * [{"layer", "source_layer", "proj", "in", "out", "pruned", "refit", "error_before",
 * "error_after", "rel_error_before", "rel_error_after", "lambda"} and "expert" for an
 * expert's projections]}: NEW reference, or
 * NULL when out of memory. */
json_t *recon_result_json(const recon_result *r, const recon_opts *o);

void recon_result_free(recon_result *r);

#endif
