/* compress/prune.h — exact slicing of a parent model into a narrower or shallower one.
 *
 * One gather serves both ranking (reordering units in place: every unit kept, in a new
 * order) and pruning (keeping a prefix of the ranked units): a selection names, for the
 * hidden channels and for each target layer, which parent units land where. Pruning
 * assumes the parent is already permuted by compress/rank (keeping width w = keeping
 * the first w units); it never reranks. Llama family, the MoE families (experts kept or
 * dropped with their router rows, every kept expert cut to the layer's expert width, each by
 * its own unit order, and the shared expert to its width) and
 * Nemotron-H (Mamba heads kept the same number per group, with their z, x and dt rows of
 * in_proj, conv channels of x, dt_bias, A_log, D, gated-norm weights and out_proj columns;
 * B, C, head_dim and the state size are not pruned).
 */
#ifndef AC_COMPRESS_PRUNE_H
#define AC_COMPRESS_PRUNE_H

#include <stddef.h>
#include <jansson.h>

#include "engine/model.h"
#include "engine/tokenizer.h"

/* Which parent units make up each unit of the target. Index arrays are owned by the
 * selection (prune_select_free). q[i] is a parent query head, kv[i] a parent KV head,
 * ffn[i] a parent FFN unit, hidden[i] a parent hidden channel. */
typedef struct {
    int src;                 /* parent layer */
    int nq, nkv, nffn, nexp, nm;
    int *q, *kv, *ffn;       /* [nq], [nkv], [nffn]; NULL when 0 */
    int *exp;                /* [nexp] parent experts (MoE layers); NULL when 0 */
    int *mh;                 /* [nm] parent Mamba heads (Mamba layers; target head h of group g is
                                parent head mh[h], in group g too); NULL when 0 */
    int nef, nsf;            /* expert and shared-expert units kept (0 with ef / sf NULL) */
    int *ef;                 /* [nexp*nef]: unit u of target expert e is unit ef[e*nef + u] of parent
                                expert exp[e]; NULL: the first units of each */
    int *sf;                 /* [nsf] the shared expert's units; NULL: its first units */
    int nlat;                /* a LatentMoE's latent channels kept (0 with lat NULL) */
    int *lat;                /* [nlat] the latent channels (parent numbering); NULL: the first */
} prune_layer_sel;

typedef struct {
    int n_hidden;
    int *hidden;             /* [n_hidden] */
    int n_layers;
    prune_layer_sel *layers; /* [n_layers] */
} prune_select;

void prune_select_free(prune_select *s);

/* Check that `target` can be cut from `parent` (same family, vocab, head_dim, tying,
 * bias, RoPE and norm settings; hidden and every layer's widths no wider than the source
 * layer's; KV heads no more than the parent's and query heads per KV head no more than
 * the parent's group; source layers in range and strictly increasing; attention / MLP
 * present in the parent where the target keeps them; an MoE layer keeps no more experts than
 * its source, a top_k no larger than its source's, expert and shared widths and a latent no
 * wider than its source's (a shared expert is kept, narrowed or not; a latent too) and the
 * same norm_topk; a Mamba layer keeps no more heads than its source, with its head_dim, state
 * size, groups and conv kernel). Returns 0, or -1 with a message
 * naming the offending field ("layers[2].ffn_dim: 900 is wider than parent layer 3's
 * 768") in err. */
int prune_check(const arch *parent, const arch *target, char *err, size_t errlen);

/* The prefix selection of `target` from a ranked parent: the first hidden channels, the
 * first kv groups of each layer and the first n_heads/n_kv_heads query heads within
 * each kept group, the first ffn units, the first experts, the first latent channels, the
 * first Mamba heads of each group. Runs prune_check first. Returns 0 with *sel
 * filled (free with prune_select_free), or -1 with a reason in err. */
int prune_select_prefix(const arch *parent, const arch *target, prune_select *sel,
                        char *err, size_t errlen);

/* Build model `out` of shape `target` on the parent's backend, every tensor gathered
 * from the parent through `sel` (rows/columns picked exactly, no arithmetic). out must
 * be uninitialized; on success the caller frees it with eng_model_free. Returns 0, or
 * -1 with a reason (a tensor the gather does not know, out of memory) in err. */
int prune_gather(const eng_model *parent, const arch *target, const prune_select *sel,
                 eng_model *out, char *err, size_t errlen);

/* prune_select_prefix + prune_gather: the pruned model for `target`. Same contract as
 * prune_gather. */
int prune_to_arch(const eng_model *parent, const arch *target, eng_model *out,
                  char *err, size_t errlen);

/* ---- pruned model directories --------------------------------------------------------
 * A storage/ckpt.h snapshot (arch.json + model.safetensors, F32, HF names) plus
 * DIR/prune.json   manifest: {"parent": path, "tokenizer": path|null, ...}
 * DIR/config.json  HF config, only when the arch is uniform or a Nemotron-H whose blocks of a
 *                  kind share one shape (then DIR is an HF dir too)
 * A heterogeneous arch has no HF config form; load DIR with prune_load_dir or
 * storage/ckpt.h's ckpt_load. */

/* Save m into dir (created if missing) with `manifest` (borrowed object, may be NULL)
 * as prune.json. Files are written atomically. 0, or -1 with a reason. */
int prune_save_dir(const eng_model *m, const char *dir, json_t *manifest, char *err, size_t errlen);

/* 1 if path is a directory holding arch.json and model.safetensors, else 0. */
int prune_is_dir(const char *path);

/* Load dir into m (uninitialized) on be; *manifest (may be NULL) gets a NEW reference to
 * prune.json's object (or NULL when absent; a prune.json that is not a regular file of
 * JSON fails the load). 0, or -1 with a reason (nothing to free). */
int prune_load_dir(const char *dir, eng_backend *be, eng_model *m, json_t **manifest, char *err, size_t errlen);

/* Load any model: a pruned directory (tokenizer from its manifest's "tokenizer" or
 * "parent", through parents that are pruned directories themselves, up to 16) or whatever
 * storage/modelio reads (HF dir, safetensors, GGUF, llama2.c).
 * tokenizer_path overrides where the tokenizer comes from; tok may be NULL. On success
 * m (and *tok) belong to the caller. Returns 0, or -1 with a reason and nothing to free. */
int prune_load_model(const char *path, const char *tokenizer_path, eng_backend *be, eng_model *m,
                     tok_tokenizer **tok, char *err, size_t errlen);

#endif
