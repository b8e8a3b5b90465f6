/* engine/model_internal.h — private to the model's files in engine/ (model.c, kvcache.c,
 * forward.c, backward.c, optim.c): the tensor table, the KV cache's fields, the forward
 * state shared by inference and training, and the workspace helpers. Nothing outside
 * engine/ includes it; engine/model.h is the public contract.
 */
#ifndef AC_ENGINE_MODEL_INTERNAL_H
#define AC_ENGINE_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"

#define F4 sizeof(float)

/* ---- tensor table (model.c) ------------------------------------------------------------ */

/* The role of a tensor in its layer (or the model); carve() points eng_layer views by it. */
enum { SL_EMB, SL_ANORM, SL_WQ, SL_WK, SL_WV, SL_BQ, SL_BK, SL_BV, SL_WO, SL_FNORM, SL_WG,
       SL_WU, SL_WD, SL_NORM, SL_LM, SL_ROUTER, SL_XG, SL_XU, SL_XD, SL_SG, SL_SU, SL_SD, SL_SGATE,
       SL_MIN, SL_MCONVW, SL_MCONVB, SL_MDTB, SL_MALOG, SL_MD, SL_MNORM, SL_MOUT, SL_RBIAS, SL_QNORM, SL_KNORM,
       SL_LATIN, SL_LATOUT };

typedef struct {
    char name[96];
    int64_t shape[2];
    int ndim, slot, layer;       /* layer -1: not in a layer */
    int expert;                  /* SL_XG/XU/XD: the expert's index in its layer */
    size_t off;                  /* float offset into params / grads */
} tensor_ent;

/* eng_model.impl. */
typedef struct {
    tensor_ent *tens;            /* HF order; tied lm_head has no entry */
    int n_tens;
    float *inv_freq;             /* device [D/2] */
    size_t inv_freq_bytes;
    size_t masks_bytes;
    float **xptr, **gxptr;       /* experts' weight and gradient views: 3 per expert, all layers */
} model_impl;

/* ---- KV cache (kvcache.c; forward.c appends to it) -------------------------------------- */

struct eng_kv_cache {
    eng_model *m;
    int B, max_T;
    int *len;                    /* host [B] */
    float **k, **v;              /* [n_layers] device [B, max_T, Hkv*D]; NULL where no attention */
    float **conv, **ssm;         /* [n_layers] device [B, K-1, cd] and [B, H, P, S]: a Mamba layer's
                                    conv history and SSM state (NULL elsewhere) */
    size_t bytes;
};

/* ---- shapes ------------------------------------------------------------------------------ */

static inline int imax(int a, int b) { return a > b ? a : b; }

typedef struct {
    int qd, kvd, f, hq;          /* maxima over layers: Hq*D, Hkv*D, F, Hq */
    int e;                       /* most experts in a layer (0: no MoE) */
} dims_max;

/* Heads of a layer's token mixer: attention query heads, or Mamba heads (0: removed). */
static inline int mixer_heads(const arch_layer *l) { return l->n_heads ? l->n_heads : l->mamba.n_heads; }

static inline dims_max max_dims(const arch *a)
{
    dims_max d = {0, 0, 0, 0, 0};
    for (int l = 0; l < a->n_layers; l++) {
        d.qd = imax(d.qd, a->layers[l].n_heads * a->head_dim);
        d.kvd = imax(d.kvd, a->layers[l].n_kv_heads * a->head_dim);
        d.f = imax(d.f, a->layers[l].ffn_dim);
        d.hq = imax(d.hq, mixer_heads(&a->layers[l]));
        d.e = imax(d.e, a->layers[l].moe.n_experts);
    }
    return d;
}

/* Tensor-table capacity for arch a (entries, not floats). */
static inline int table_cap(const arch *a)
{
    int cap = 3 + 14 * a->n_layers;
    for (int l = 0; l < a->n_layers; l++)
        cap += 3 * a->layers[l].moe.n_experts + 10;
    return cap;
}

/* ---- forward state (forward.c; backward.c runs the same forward with saved activations) -- */

/* One block's activations. Inference points these at shared scratch; training gives
 * every present block its own (the saved activations). */
typedef struct {
    float *rstd, *q, *k, *v, *o, *lse, *r, *y, *gate, *up;
    float *qrstd, *krstd;        /* q/k norms' rstd (arch_qk_norm; training only, else NULL) */
} blk_act;

typedef struct {
    int B, T, N;
    const int *tok_d, *pos_d, *pos0_d, *lens_d;   /* device */
    const int *lens_h;                            /* host [B] */
    eng_kv_cache *kv;                             /* NULL: S = T */
    const eng_masks *mk;                          /* NULL: plain model */
    float n_eff;
    float *xn, *om, *h, *stat;                    /* scratch */
    float *stat_host;
    float **xs;                                   /* residual chain: block i reads xs[i], writes xs[i+1] */
    blk_act *acts;                                /* per block (training) or NULL */
    blk_act tmp;                                  /* inference scratch */
    double *layer_ns, *fixed_ns;
    float **layer_out;                            /* optional [n_layers]: where non-NULL, a copy of
                                                     the stream [N,C] after that layer */
    eng_act_stats *stats;
    int oom;                                      /* an MoE block found no memory for its scratch */
    float *moe_f;                                 /* MoE scratch in the workspace (NULL: per call) */
    float *mamba_f;                               /* Mamba scratch in the workspace (NULL: per call) */
    int *moe_i;
} fwd_state;

/* A call's backend workspace: one float and one int allocation. */
typedef struct {
    float *f;
    size_t f_bytes;
    int *i;
    size_t i_bytes;
} ws_t;

/* Free both allocations (either may be NULL) and clear the pointers. */
void eng_ws_free(eng_backend *be, ws_t *w);

/* 0 when every token is in [0, V); else -1 naming the first one in err. */
int eng_check_tokens(const int *tokens, size_t n, int V, char *err, size_t errlen);

/* Upload tokens, positions, first positions and lengths into dev (host is the staging
 * copy, kept: lens_h points into it). ints: [tok N | pos N | pos0 B | lens B]. */
void eng_fwd_upload_ints(eng_backend *be, int *dev, int *host, const int *tokens, const int *lens,
                         const eng_kv_cache *kv, int B, int T);

/* Add per-group L2 norms of x [N, G*D] over st's valid rows to acc[G] (host doubles). */
void eng_stats_add(eng_model *m, fwd_state *st, double *acc, const float *x, int G, int D);

/* Bytes of eng_forward's workspace (see forward.c's header); with_masks adds the masked
 * head outputs. */
size_t eng_fwd_bytes(const arch *a, int B, int T, int kv_max_T, int logits_mode, int threads, int with_stats,
                     int with_masks);

/* Prepare the inference state: workspace, ints and scratch pointers. With mk == NULL the
 * model runs unmasked. host_ints holds 2*B*T + 2*B ints (borrowed for the call); xs1 is
 * the caller's one-entry residual chain; *head_base receives the LM head's scratch.
 * Returns 0, or -1 on out of memory (nothing left allocated). The caller runs
 * eng_fwd_layers and frees ws with eng_ws_free. */
int eng_fwd_setup(eng_model *m, fwd_state *st, ws_t *ws, int *host_ints, const int *tokens, int B, int T,
                  const int *lens, eng_kv_cache *kv, int logits_mode, eng_act_stats *stats,
                  const eng_masks *mk, float **xs1, float **head_base);

/* Embedding and all layers. Training (st->acts set): block i reads xs[i] and writes
 * xs[i+1], the final stream is xs[n_blocks]; inference updates xs[0] in place. */
void eng_fwd_layers(eng_model *m, fwd_state *st);

#endif
