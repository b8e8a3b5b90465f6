/* engine/model.h — a Llama-family model on a backend: weights, forward (prefill and
 * decode with a KV cache), backward for weights and search masks, losses, AdamW.
 *
 * Weights use the Hugging Face layout and names ("model.layers.3.mlp.up_proj.weight",
 * RoPE as rotate_half over the two halves of each head). Loaders in storage/ convert
 * other layouts (GGUF, llama2.c) before calling eng_model_set_tensor. Every layer may
 * have its own heads / KV heads / FFN width, or none (removed part). This module knows
 * nothing about files, JSON or HTTP.
 */
#ifndef AC_ENGINE_MODEL_H
#define AC_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/arch.h"
#include "engine/backend.h"

/* Views into the model's single parameter block (device memory of the backend).
 * Shapes are [out, in] row-major as in HF. NULL where the part is removed. */
typedef struct {
    float *attn_norm;            /* [C] */
    float *wq, *wk, *wv;         /* [Hq*D, C], [Hkv*D, C], [Hkv*D, C] */
    float *bq, *bk, *bv;         /* [Hq*D], [Hkv*D], [Hkv*D]; NULL unless attention_bias */
    float *q_norm, *k_norm;      /* [Hq*D], [Hkv*D]; NULL unless arch_qk_norm */
    float *wo;                   /* [C, Hq*D] */
    float *ffn_norm;             /* [C] */
    float *w_gate, *w_up;        /* [F, C] */
    float *w_down;               /* [C, F] */
    /* mixture of experts (arch_moe; NULL without): router [E, C]; experts[3e + 0/1/2] the
     * gate [Fe, C], up [Fe, C] and down [C, Fe] of expert e; the shared expert [Fs, C],
     * [Fs, C], [C, Fs] and its gate [1, C] (qwen2_moe). ffn_norm is the block's norm. */
    float *router;
    float *router_bias;          /* [E] the choice's correction bias (sigmoid routing; NULL otherwise) */
    float *lat_in, *lat_out;     /* [latent, C], [C, latent]: LatentMoE's projections (NULL without) */
    float **experts;             /* squared-ReLU experts (sigmoid routing): experts[3e] NULL */
    float *sh_gate, *sh_up, *sh_down, *sh_router;
    /* Mamba-2 mixer (arch_mamba; NULL without), attn_norm its block's norm: in_proj
     * [di + cd + H, C] (rows z, xBC, dt), conv_w [cd, K], conv_b [cd], dt_bias, A_log,
     * Dskip [H], m_norm [di] (the gated norm's weight), out_proj [C, di]. */
    float *in_proj, *conv_w, *conv_b, *dt_bias, *A_log, *Dskip, *m_norm, *out_proj;
} eng_layer;

/* Multiplicative masks used by ranking and search (all 1.0 = the plain model).
 * One backend allocation; grads (same layout) are filled by eng_forward_backward
 * when ENG_GRAD_MASKS is asked for.
 *   hidden[C]            scales the residual stream after the embedding and after every
 *                        residual add; RMSNorm divides by hidden_count, C by default
 *                        (the search keeps C: a student sliced to C' channels with its
 *                        norm gains scaled by sqrt(C/C'), as pruning does, computes this
 *                        masked model; another count prices the slice without that scale).
 *   head[l][Hq_l]        scales each query head's attention output before o_proj (a Mamba
 *                        layer: each Mamba head's gated-norm output before out_proj).
 *   ffn[l][F_l]          scales each gated intermediate unit before down_proj; an MoE layer:
 *                        unit u of every routed expert alike (F_l = expert_ffn_dim; each
 *                        expert's units ranked by its own order), the shared expert unmasked.
 *   attn_gate[l], mlp_gate[l]  scale the block's residual contribution (depth); attn_gate
 *                        gates the layer's token mixer, attention or Mamba.
 *   expert[l][E_l]       scales each expert's output (MoE layers), after the block.
 *   shared[l][S_l]       scales each unit of the layer's shared expert before its down
 *                        projection (MoE layers with one; S_l = shared_ffn_dim).
 *   latent[l][Lt_l]      scales each latent channel of a LatentMoE layer on both sides: the
 *                        experts' input (after fc1_latent_proj) and their weighted sum
 *                        (before fc2_latent_proj). 0/1 values compute the model whose latent
 *                        keeps the channels at 1 (pruning cuts fc1's rows and fc2's columns).
 * Block order: hidden, then per layer head and ffn, then attn_gate, mlp_gate, then per
 * MoE layer its expert masks, then per shared expert its unit masks, then per LatentMoE
 * layer its latent masks. */
typedef struct {
    float *block, *grad_block;   /* one allocation each, count floats */
    size_t count;
    float *hidden, *g_hidden;
    float **head, **g_head;      /* [n_layers] pointers (NULL where removed) */
    float **ffn, **g_ffn;
    float *attn_gate, *g_attn_gate;   /* [n_layers] */
    float *mlp_gate, *g_mlp_gate;     /* [n_layers] */
    float **expert, **g_expert;  /* [n_layers] pointers to [E_l] (NULL without MoE): scales each
                                    expert's routing weight, after the top-k choice */
    float **shared, **g_shared;  /* [n_layers] pointers to [S_l] (NULL without a shared expert) */
    float **latent, **g_latent;  /* [n_layers] pointers to [Lt_l] (NULL without a latent) */
    float hidden_count;          /* RMSNorm's divisor; C by default. Host value. */
    float g_hidden_count;        /* d loss / d hidden_count (host), from backward */
} eng_masks;

typedef struct eng_model {
    arch a;                      /* owned copy of the shape */
    eng_backend *be;             /* borrowed */
    float *params;               /* one backend allocation of n_params floats */
    size_t n_params;
    float *grads;                /* NULL until eng_model_enable_grads */
    float *tok_emb;              /* [V, C] */
    float *final_norm;           /* [C] */
    float *lm_head;              /* [V, C]; == tok_emb when tied */
    eng_layer *layers, *glayers; /* [n_layers]; glayers views into grads */
    float *g_tok_emb, *g_final_norm, *g_lm_head;
    eng_masks *masks;            /* NULL until eng_model_enable_masks */
    void *impl;                  /* tensor table etc., private (engine/model_internal.h) */
} eng_model;

/* Allocate a model of shape `a` on `be` with zeroed weights (norm weights 1).
 * Returns 0, or -1 with a message in err (invalid arch, out of memory).
 * The model copies `a`; free with eng_model_free. */
int eng_model_init(eng_model *m, const arch *a, eng_backend *be, char *err, size_t errlen);
void eng_model_free(eng_model *m);

/* Fill random weights (normal, std) from seed; for tests, oracles and measurements. */
void eng_model_randomize(eng_model *m, uint64_t seed, float std);

/* eng_model_randomize that asks stop(ud) (may be NULL) after each 2^20 values drawn:
 * 0 drawn, 1 when it said stop (the weights then part drawn), -1 out of memory (none
 * drawn). */
int eng_model_randomize_until(eng_model *m, uint64_t seed, float std, int (*stop)(void *ud), void *ud);

/* Copy host fp32 data into the tensor named by its HF name, checking the shape and that
 * every value is finite (a NaN or an infinity is refused, naming the element). Returns 0,
 * or -1 naming the tensor and the fault in err. */
int eng_model_set_tensor(eng_model *m, const char *hf_name, const float *data,
                         const int64_t *shape, int ndim, char *err, size_t errlen);

/* Fill the tensor named by its HF name (shape checked as eng_model_set_tensor) by
 * fill(ud, dst, n, err, errlen), which writes its n floats at dst and returns 0, or -1 with
 * err. On a backend whose buffers are host memory dst is the tensor itself, so a loader
 * holds no second copy of the largest tensor; otherwise a host buffer, uploaded after.
 * Every value is then checked finite as eng_model_set_tensor checks. Returns 0, or -1 with
 * fill's reason, the shape's or the value's in err (the tensor's contents are then
 * undefined: a loader frees the model). */
typedef int (*eng_fill_fn)(void *ud, float *dst, int64_t n, char *err, size_t errlen);
int eng_model_fill_tensor(eng_model *m, const char *hf_name, const int64_t *shape, int ndim, eng_fill_fn fill,
                          void *ud, char *err, size_t errlen);

/* One tensor of an arch's layout: HF name, shape [out, in] (shape[1] = 0 when 1-D). */
typedef struct {
    char name[96];
    int64_t shape[2];
    int ndim;
} eng_tensor_desc;

/* The tensors a model of shape `a` holds, in HF order (tied lm_head omitted), as
 * eng_model_init would lay them out but without allocating any weights: for checking a
 * file against its claimed shape first. Returns the count and sets *out to a NEW array
 * (free it), or -1 with a reason (invalid arch, out of memory) and *out NULL. */
int eng_arch_tensors(const arch *a, eng_tensor_desc **out, char *err, size_t errlen);

/* Tensor enumeration in HF order and names (tied lm_head omitted). Returns the count;
 * eng_model_tensor fills name (borrowed, valid while m lives), shape, ndim and the
 * device pointer of tensor i. Returns 0, or -1 when i is out of range. */
int eng_model_tensor_count(const eng_model *m);
int eng_model_tensor(const eng_model *m, int i, const char **name, int64_t shape[2], int *ndim, float **data);

/* The projections of layer l's MoE block that read the block's normalized input [N, C],
 * in HF order: the router, each expert's gate and up projections (behind a latent, the
 * latent's fc1_latent_proj instead: the experts read the latent), the shared expert's gate
 * and up projections and its gate. kind tells them apart, expert is the expert's index in
 * its layer (-1 for the others), rows the projection's output rows. */
enum { ENG_MOE_ROUTER, ENG_MOE_XGATE, ENG_MOE_XUP, ENG_MOE_SGATE, ENG_MOE_SUP, ENG_MOE_SGATEW, ENG_MOE_LATENT };
typedef struct {
    const char *name;            /* borrowed, valid while the model lives */
    int kind, expert;
    int64_t rows;
} eng_moe_input;

/* Fill out[0..cap) with layer l's MoE input projections; returns how many the layer has
 * (0: not an MoE layer, or no such layer), which may exceed cap. */
int eng_model_moe_inputs(const eng_model *m, int l, eng_moe_input *out, int cap);

/* The name of expert x's output projection in MoE layer l (x -1: the shared expert's;
 * borrowed), or NULL. */
const char *eng_model_expert_down(const eng_model *m, int l, int x);

/* Expert x of MoE layer l on rows of the normalized block input xn [N, C] (host): with rows
 * NULL, the rows the router sends to it (written to routed, capacity N; their count is n;
 * x -1: the shared expert, every row, its output before its gate);
 * on those rows (or rows[0..n)) its units' activations h [n, F] (before down_proj, F its
 * width), its output y [n, D] (D: the latent, else C; before the routing weight) and, where
 * the router chose the rows (rows NULL, x >= 0), the routing weight each row gives it w [n]
 * (after renormalization and routed scaling); any of them may be NULL. Returns the row
 * count, or -1 (no such expert, out of memory). */
int eng_moe_expert_io(eng_model *m, int l, int x, const float *xn, int N, const int *rows, int n, int *routed,
                      float *h, float *y, float *w);

/* MoE layer l on rows of the normalized block input xn [N, C] (host): its output y [N, C];
 * shared 0: without its shared expert (the routed experts' weighted sum, through a
 * LatentMoE's latent projections), and gate [N] (may be NULL) the weight the shared expert's
 * output takes on each row (Qwen2-MoE's sigmoid gate; 1 where there is no gate or no shared
 * expert). 0, or -1 (not an MoE layer, out of memory). */
int eng_moe_block(eng_model *m, int l, const float *xn, int N, int shared, float *y, float *gate);

/* Copy a tensor (by HF name) to host memory `out` (its element count must fit `n`).
 * Returns the element count, or -1 when absent. */
int64_t eng_model_get_tensor(const eng_model *m, const char *hf_name, float *out, int64_t n);

/* Gradients and masks are allocated on demand (accounted on the backend). 0 or -1. */
int eng_model_enable_grads(eng_model *m);
int eng_model_enable_masks(eng_model *m);   /* masks set to 1.0 */
void eng_model_zero_grads(eng_model *m);     /* weight and mask grads */

/* m's weights hold still (on = 1) until eng_model_const(m, 0): served, scored, or a
 * frozen teacher. A 16-bit backend then rounds each weight matrix once and keeps the copy
 * (eng_backend_const). Nothing may write the weights in between; eng_model_free ends it. */
void eng_model_const(eng_model *m, int on);

/* KV cache for batch B and up to max_T positions per row. NULL on OOM. */
typedef struct eng_kv_cache eng_kv_cache;
eng_kv_cache *eng_kv_new(eng_model *m, int B, int max_T);
void eng_kv_reset(eng_kv_cache *kv);
int eng_kv_len(const eng_kv_cache *kv, int b);   /* positions filled in row b */
size_t eng_kv_bytes(const eng_kv_cache *kv);
void eng_kv_free(eng_kv_cache *kv);

/* Activation statistics for ranking, accumulated over forwards (host memory,
 * allocated by eng_stats_new for the model's shape). Sums over valid tokens:
 *   ffn_abs[l][F_l]    sum |silu(gate)*up|
 *   head_norm[l][Hq_l] sum of the L2 norm of each head's attention output
 *   hidden_abs[C]      sum |x| of each layer's normalized input, all layers
 *   expert_mass[l][E_l]   sum over the tokens routed to each expert of the L2 norm of the
 *                      expert's output (before its routing weight); MoE layers only
 *   expert_tokens[l][E_l] tokens routed to each expert
 *   expert_unit[l][E_l*Fe_l] sum over the tokens routed to expert x of |unit u's activation|
 *                      (squared ReLU, or silu(gate)*up), at [x*Fe_l + u]
 *   shared_unit[l][Fs_l]  sum |unit activation| of the shared expert, every token
 *   latent_abs[l][2*D_l]  LatentMoE layers (latent D_l): sum |x| of each latent channel of the
 *                      experts' input (fc1_latent_proj's output) at [j], and of their weighted
 *                      sum (what fc2_latent_proj reads) at [D_l + j]; NULL for other layers
 *   tokens             number of tokens accumulated
 * unit_host: host staging for one expert's unit sums or a latent's (the widest). */
typedef struct {
    double **ffn_abs, **head_norm, *hidden_abs;
    double **expert_mass, **expert_tokens;
    double **expert_unit, **shared_unit, **latent_abs;
    float *unit_host;
    int64_t tokens;
} eng_act_stats;
eng_act_stats *eng_stats_new(const eng_model *m);
void eng_stats_free(eng_act_stats *s, int n_layers);

enum { ENG_LOGITS_NONE = 0, ENG_LOGITS_ALL = 1, ENG_LOGITS_LAST = 2, ENG_LOGITS_ROWS = 3 };

typedef struct {
    const int *tokens;      /* [B*T] host */
    int B, T;
    const int *lens;        /* [B] valid tokens per row (right padding); NULL: all T */
    eng_kv_cache *kv;       /* NULL: positions start at 0, nothing cached */
    int logits_mode;        /* ENG_LOGITS_* */
    float *logits;          /* host: [B,T,V] (ALL), [B,V] (LAST: each row's last valid) or
                               [n_logit_rows,V] (ROWS) */
    const int *logit_rows;  /* ROWS: the positions b*T + t whose logits are wanted, in order
                               (the LM head runs on those alone: a scorer's continuations) */
    int n_logit_rows;
    double *layer_ns;       /* optional [n_layers*2]: attention, mlp wall ns (synced) */
    double *fixed_ns;       /* optional [2]: embedding, final norm + lm head */
    eng_act_stats *stats;   /* optional: accumulate ranking statistics */
} eng_fwd_args;

/* Run the model (masks applied when enabled). With kv, appends T tokens to each row at
 * positions eng_kv_len(kv, b)... Returns 0, or -1 with a reason (token out of range,
 * cache full, out of memory). */
int eng_forward(eng_model *m, const eng_fwd_args *args, char *err, size_t errlen);

enum { ENG_LOSS_CE = 1, ENG_LOSS_KD = 2 };
enum { ENG_GRAD_WEIGHTS = 1, ENG_GRAD_MASKS = 2 };

typedef struct {
    int kind;                   /* ENG_LOSS_CE, ENG_LOSS_KD, or both (mixed) */
    const int *targets;         /* [B*T] next-token targets, -1 = ignored (CE) */
    eng_model *teacher;         /* KD: teacher run on the same tokens (no grads); the
                                   model itself may be its teacher: it then runs unmasked */
    float temperature;          /* KD: softmax temperature (loss scaled by T^2) */
    float kd_weight;            /* mixed: loss = kd_weight*KD + (1-kd_weight)*CE */
    float hidden_weight;        /* > 0 (KD only): add the intermediate-state loss, the mean over
                                   the student's layers and tokens of the cosine distance between
                                   its stream after layer l and the teacher's after layer
                                   a.layers[l].source_layer, on the teacher's first hidden_size
                                   channels (the teacher is the ranked parent the student was cut
                                   from; every row counts, ignored targets too), both weighted
                                   per channel by the norm weight of the teacher's block that
                                   reads that stream (what the cosine loss on norm outputs
                                   compares, without the student's norm weight in the
                                   gradient); weighted per call so that it contributes hidden_weight
                                   times the logit loss (the balancing Megatron's Minitron
                                   distillation uses) */
} eng_loss_spec;

typedef struct {
    double loss, ce, kd;        /* mean per counted token: loss is the logit loss (CE, KD, mixed) */
    double hidden;              /* hidden_weight > 0: the mean (norm-weighted) cosine distance,
                                   before hidden_weight's scaling */
    int64_t tokens;             /* counted tokens */
} eng_loss_result;

/* Forward + loss + backward on tokens [B,T]; gradients ACCUMULATE into m->grads and/or
 * mask grads (zero them with eng_model_zero_grads). Loss is the mean over counted
 * tokens. Returns 0, or -1 with a reason. */
int eng_forward_backward(eng_model *m, const int *tokens, int B, int T, const eng_loss_spec *loss,
                         int grad_flags, eng_loss_result *out, char *err, size_t errlen);

/* AdamW over all weights. State is owned by the optimizer object. */
typedef struct eng_adamw eng_adamw;
eng_adamw *eng_adamw_new(eng_model *m);
/* One step with lr; clips the global grad norm to clip (<=0: none); returns the
 * pre-clip norm. grad_scale multiplies grads first (1/accumulation steps). A norm that is
 * NaN or infinite is returned without a step: weights, moments and step count stay. */
double eng_adamw_step(eng_adamw *o, float lr, float beta1, float beta2, float eps,
                      float weight_decay, float clip, float grad_scale);
/* Optimizer state for checkpoints: step count and the m, v buffers (host copies). */
int64_t eng_adamw_t(const eng_adamw *o);
int eng_adamw_state(eng_adamw *o, float *m_host, float *v_host);       /* export, n_params each */
int eng_adamw_restore(eng_adamw *o, int64_t t, const float *m_host, const float *v_host);
void eng_adamw_free(eng_adamw *o);

/* Sampling from logits [V] (host): temperature 0 = greedy (argmax); else softmax at
 * temperature then nucleus top_p (1.0 = off). rng is an eng_xorshift64 state (engine/rng.h). */
int eng_sample(const float *logits, int V, float temperature, float top_p, uint64_t *rng);

/* ---- additions by the engine (CPU path); existing declarations above are unchanged ---- */

/* Rows of logits computed at once (forward ALL mode and the training loss): the device
 * holds at most ENG_LOGIT_CHUNK_ROWS x V logits (plus as many teacher logits and
 * logit gradients in training). */
#define ENG_LOGIT_CHUNK_ROWS 256

/* RoPE inverse frequencies [head_dim/2] for `a` (host), with linear or llama3 scaling
 * applied as in HF transformers. "dynamic" scaling is the unscaled table (exact up to
 * max_position_embeddings; longer contexts are not supported). Returns 0. */
int eng_rope_inv_freq(const arch *a, float *out);

/* Bytes eng_forward allocates on the backend for a call of B rows x T tokens
 * (everything freed before it returns; see forward.c's header for the items), for an
 * unmasked model of shape `a`: kv_max_T is the cache capacity when a cache is used
 * (0: none), threads the backend's thread count, with_stats 1 when statistics are
 * collected. The attention term is the CPU backend's (threads x ENG_CPU_ATTN_ROWS x S
 * floats); another backend's own attention scratch differs. The KV cache itself is
 * eng_kv_bytes_for; weights are arch_params * 4 (+ head_dim/2 floats of RoPE table). */
size_t eng_forward_workspace_bytes(const arch *a, int B, int T, int kv_max_T, int logits_mode,
                                   int threads, int with_stats);

/* Bytes of a KV cache for B rows and max_T positions (what eng_kv_new allocates). */
size_t eng_kv_bytes_for(const arch *a, int B, int max_T);

/* Peak bytes eng_forward_backward allocates for B x T tokens (saved activations,
 * backward scratch, loss chunk buffers, and the larger of the attention tiles and the KD
 * teacher's forward workspace), for this model's current state (masks enabled or not)
 * and the CPU backend. teacher: the KD teacher, NULL without KD; hidden: 1 with the
 * intermediate-state loss (eng_loss_spec.hidden_weight > 0). */
size_t eng_train_workspace_bytes(const eng_model *m, int B, int T, const eng_model *teacher, int hidden);

/* ---- block by block (reconstruction after pruning) -------------------------------------
 * A stepper holds the residual stream of a fixed batch of token rows and runs the model's
 * blocks on it one at a time, unmasked and without a cache, with the same kernels as
 * eng_forward: the caller can read a block's projection input and output, change the
 * block's weights, then apply it. Memory: the stream (B*T*C floats) plus eng_forward's
 * workspace for `rows` sequences of T. */
typedef struct eng_stepper eng_stepper;
enum { ENG_PART_ATTN = 0, ENG_PART_MLP = 1 };

/* Embed tokens [B*T] (borrowed: they must outlive the stepper) as B sequences of T
 * tokens, processed `rows` sequences at a time (<= 0 or > B: all at once). NULL with a
 * reason (empty batch, token out of range, out of memory). Free with eng_stepper_free. */
eng_stepper *eng_stepper_new(eng_model *m, const int *tokens, int B, int T, int rows, char *err, size_t errlen);

/* What a block pass copies to the host (any may be NULL), for B*T rows: the block's
 * normalized input (RMSNorm output) [B*T, C]; the projection's input (ATTN: the heads'
 * outputs before o_proj [B*T, Hq*D], a Mamba-2 mixer's gated-norm output before out_proj
 * [B*T, H*P]; MLP: the gated units before down_proj [B*T, F]; not an MoE's);
 * its output before the residual add [B*T, C]. */
typedef struct {
    float *norm_in, *proj_in, *proj_out;
} eng_step_capture;

/* Run block (layer, part) on the current stream with the model's current weights,
 * copying what cap asks for (cap may be NULL). advance = 1 adds the block to the stream;
 * 0 leaves the stream as it was. 0, or -1 with a reason (no such block). */
int eng_stepper_block(eng_stepper *s, int layer, int part, int advance, const eng_step_capture *cap, char *err,
                      size_t errlen);
void eng_stepper_free(eng_stepper *s);

/* Copy the stepper's stream [B*T, C] to the device buffer dev (to_stepper 0) or from it
 * (1): a caller keeps the stream at a block boundary and runs several continuations from
 * it. */
void eng_stepper_stream(eng_stepper *s, float *dev, int to_stepper);

/* Run layers [l0, l1) whole on the stream (advancing it), the blocks a layer has, except
 * that layer l0 leaves out what skip says (bit 0: its mixer, attention or Mamba; bit 1: its
 * MLP). 0, or -1 with a reason. */
int eng_stepper_run(eng_stepper *s, int l0, int l1, int skip, char *err, size_t errlen);

/* The final norm, LM head and softmax cross-entropy (the backend's xent) on the current
 * stream against targets [B*T] (host; -1: a row not counted): *sum the rows' losses,
 * summed in row order. 0, or -1 with a reason (out of memory). */
int eng_stepper_loss(eng_stepper *s, const int *targets, double *sum, char *err, size_t errlen);

/* The summed next-token cross-entropy of the model (no search masks) on B sequences of T
 * tokens against targets [B*T] (host; -1: not counted): a forward whose loss is taken on
 * the device (eng_stepper_loss), no logits returned. 0, or -1 with a reason. */
int eng_forward_loss(eng_model *m, const int *tokens, const int *targets, int B, int T, double *sum, char *err,
                     size_t errlen);

#endif
