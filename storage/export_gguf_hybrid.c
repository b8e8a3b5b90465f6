/* storage/export_gguf_hybrid.c — GGUF of the Mamba-2 families as llama.cpp reads them: Nemotron-H
 * (its `nemotron_h` and `nemotron_h_moe` architectures, src/models/nemotron-h.cpp) and Mamba-2
 * (`mamba2`, src/models/mamba2.cpp: the same Mamba layers and ssm.* keys, no attention or
 * feed-forward keys). Nemotron-H: every layer one block behind
 * blk.N.attn_norm; a layer is a Mamba-2 mixer where its attention.head_count_kv and
 * feed_forward_length entries are both 0, attention where only the latter is, a feed-forward
 * block (a dense squared-ReLU MLP, or in nemotron_h_moe an MoE) otherwise. The Mamba shape
 * (ssm.*) is one for the model, so is the MoE's; feed-forward widths and KV heads are per
 * layer. Mamba tensors: ssm_in [z | xBC | dt], ssm_conv1d {K, conv_dim} with its bias,
 * ssm_dt.bias, ssm_a = -exp(A_log) and ssm_d as {1, H}, ssm_norm {d_inner/G, G}, ssm_out. MoE:
 * ffn_gate_inp, exp_probs_b.bias (the correction bias), experts stacked into ffn_{up,down}_exps,
 * the shared expert ffn_{up,down}_shexp; LatentMoE's projections ffn_latent_{down,up} with
 * moe_latent_size. No RoPE in this family, so q and k go unpermuted.
 */
#include "storage/export_gguf_hybrid.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/export_internal.h"
#include "storage/gguf_write.h"

/* How a tensor's values are written: as they are, -exp of each (A from A_log, kept F32), or kept
 * F32 (the conv and the SSM vectors, as llama.cpp's converter keeps them). */
enum { PLAIN = 0, NEG_EXP = 1, KEEP_F32 = 2 };

int exp_gguf_hybrid_arch(const arch *a, char *arch_name, size_t cap, char *err, size_t errlen)
{
    const arch_mamba *mb = arch_first_mamba(a, NULL);
    const arch_moe *moe = arch_first_moe(a, NULL);
    if (a->n_layers == 0) {
        snprintf(err, errlen, "GGUF export: the arch has no layers");
        return -1;
    }
    if (moe && moe->n_experts < 2) {   /* it asserts more experts than groups (one group at least) */
        snprintf(err, errlen, "GGUF export: %d expert; llama.cpp's nemotron_h_moe needs 2 or more", moe->n_experts);
        return -1;
    }
    if (!mb) {   /* it reads the ssm.* keys and makes a recurrent-state buffer in any case */
        snprintf(err, errlen, "GGUF export: the arch has no Mamba layer; llama.cpp's nemotron_h needs one");
        return -1;
    }
    int attn = 0;
    for (int l = 0; l < a->n_layers; l++)
        attn += a->layers[l].n_heads > 0;
    if (!attn && !strcmp(a->family, "nemotron_h")) {   /* and a KV cache: it fails an assertion without */
        snprintf(err, errlen, "GGUF export: the arch has no attention layer; llama.cpp's nemotron_h needs one");
        return -1;
    }
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *y = &a->layers[l];
        int blocks = (y->n_heads > 0) + (y->mamba.n_heads > 0) + arch_layer_has_mlp(y);
        if (blocks != 1) {
            snprintf(err, errlen, "GGUF export: layer %d holds %d blocks; llama.cpp's nemotron_h holds one per layer",
                     l, blocks);
            return -1;
        }
        if (y->mamba.n_heads && memcmp(&y->mamba, mb, sizeof *mb)) {
            snprintf(err, errlen, "GGUF export: layer %d's Mamba shape differs from the first Mamba layer's; "
                     "llama.cpp's nemotron_h holds one (ssm.*)", l);
            return -1;
        }
        if (moe && y->ffn_dim) {
            snprintf(err, errlen, "GGUF export: layer %d is a dense MLP beside MoE layers; llama.cpp's "
                     "nemotron_h_moe makes every feed-forward layer an MoE", l);
            return -1;
        }
        if (y->moe.n_experts && memcmp(&y->moe, moe, sizeof *moe)) {
            snprintf(err, errlen, "GGUF export: layer %d's MoE differs from the first MoE layer's; llama.cpp "
                     "holds one expert count and width", l);
            return -1;
        }
    }
    if (moe && moe->n_group > 1 && moe->topk_group < moe->n_group && moe->n_group >= moe->n_experts) {
        snprintf(err, errlen, "GGUF export: llama.cpp needs fewer expert groups than experts");
        return -1;
    }
    int mamba_only = !strcmp(a->family, "mamba2");
    snprintf(arch_name, cap, "%s", mamba_only ? "mamba2" : moe ? "nemotron_h_moe" : "nemotron_h");
    return 0;
}

int exp_gguf_hybrid_keys(ggw *w, const arch *a, const char *an)
{
    char key[128];
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", an, suffix), key)
    int L = a->n_layers, bad = 0, heads = 1;
    const arch_mamba *mb = arch_first_mamba(a, NULL);
    const arch_moe *moe = arch_first_moe(a, NULL);
    for (int l = 0; l < L; l++)
        if (a->layers[l].n_heads) {
            heads = a->layers[l].n_heads;
            break;
        }
    int blocks = strcmp(an, "mamba2") != 0;   /* mamba2: Mamba mixers only, the ssm.* keys and the rms epsilon */
    int32_t *ff = malloc((size_t)L * sizeof *ff), *kv = malloc((size_t)L * sizeof *kv), *hq = malloc((size_t)L * sizeof *hq);
    if (!ff || !kv || !hq)
        bad = 1;
    for (int l = 0; !bad && l < L; l++) {
        const arch_layer *y = &a->layers[l];
        ff[l] = y->moe.n_experts ? y->moe.expert_ffn_dim : y->ffn_dim;
        kv[l] = y->n_kv_heads;
        hq[l] = y->n_heads ? y->n_heads : heads;   /* nonzero everywhere: llama.cpp reads layer 0's */
    }
    if (!bad && blocks) {
        bad |= ggw_kv_arr_i32(w, K("feed_forward_length"), ff, (size_t)L);
        bad |= ggw_kv_arr_i32(w, K("attention.head_count_kv"), kv, (size_t)L);
        bad |= ggw_kv_arr_i32(w, K("attention.head_count"), hq, (size_t)L);
    }
    free(ff);
    free(kv);
    free(hq);
    if (blocks)
        bad |= ggw_kv_f32(w, K("attention.layer_norm_epsilon"), (float)a->norm_eps);
    if (mb) {
        bad |= ggw_kv_u32(w, K("ssm.conv_kernel"), (uint32_t)mb->conv_kernel);
        bad |= ggw_kv_u32(w, K("ssm.state_size"), (uint32_t)mb->d_state);
        bad |= ggw_kv_u32(w, K("ssm.group_count"), (uint32_t)mb->n_groups);
        bad |= ggw_kv_u32(w, K("ssm.inner_size"), (uint32_t)arch_mamba_inner(mb));
        bad |= ggw_kv_u32(w, K("ssm.time_step_rank"), (uint32_t)mb->n_heads);
    }
    if (moe) {
        int grouped = moe->n_group > 1 && moe->topk_group < moe->n_group;
        bad |= ggw_kv_u32(w, K("expert_count"), (uint32_t)moe->n_experts);
        bad |= ggw_kv_u32(w, K("expert_used_count"), (uint32_t)moe->top_k);
        bad |= ggw_kv_u32(w, K("expert_feed_forward_length"), (uint32_t)moe->expert_ffn_dim);
        bad |= ggw_kv_u32(w, K("expert_shared_feed_forward_length"), (uint32_t)moe->shared_ffn_dim);
        bad |= ggw_kv_u32(w, K("expert_shared_count"), moe->shared_ffn_dim ? 1u : 0u);
        bad |= ggw_kv_bool(w, K("expert_weights_norm"), moe->norm_topk);
        bad |= ggw_kv_f32(w, K("expert_weights_scale"), (float)moe->routed_scale);
        bad |= ggw_kv_u32(w, K("expert_group_count"), grouped ? (uint32_t)moe->n_group : 1u);
        bad |= ggw_kv_u32(w, K("expert_group_used_count"), grouped ? (uint32_t)moe->topk_group : 1u);
        bad |= ggw_kv_u32(w, K("expert_gating_func"), 2u);   /* sigmoid */
        if (moe->latent_dim)
            bad |= ggw_kv_u32(w, K("moe_latent_size"), (uint32_t)moe->latent_dim);
    }
#undef K
    return bad;
}

/* The tensors in llama.cpp's names, in order. Returns the count written into t. */
static int hy_tensors(const arch *a, exp_gtensor *t)
{
    int64_t C = a->hidden_size, V = a->vocab_size, D = a->head_dim;
    int n = 0;
    char g[96], h[128];
    exp_gtensor_add(t, &n, "token_embd.weight", C, V, 0, "backbone.embeddings.weight", 0);
    exp_gtensor_add(t, &n, "output_norm.weight", C, 0, 0, "backbone.norm_f.weight", 0);
    exp_gtensor_add(t, &n, "output.weight", C, V, 0,
                    a->tie_word_embeddings ? "backbone.embeddings.weight" : "lm_head.weight", 0);
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *y = &a->layers[l];
#define T(gg, n0, n1, n2, hh, stack, xf) do { snprintf(g, sizeof g, "blk.%d.%s", l, gg); \
        snprintf(h, sizeof h, "backbone.layers.%d.%s", l, hh); exp_gtensor_add(t, &n, g, n0, n1, n2, h, stack); \
        t[n - 1].neg_exp = (xf) == NEG_EXP; t[n - 1].f32 = (xf) != PLAIN; } while (0)
        T("attn_norm.weight", C, 0, 0, "norm.weight", 0, PLAIN);
        if (y->mamba.n_heads) {
            const arch_mamba *mb = &y->mamba;
            int64_t H = mb->n_heads, di = arch_mamba_inner(mb), cd = arch_mamba_conv_dim(mb);
            T("ssm_in.weight", C, di + cd + H, 0, "mixer.in_proj.weight", 0, PLAIN);
            T("ssm_conv1d.weight", mb->conv_kernel, cd, 0, "mixer.conv1d.weight", 0, KEEP_F32);
            T("ssm_conv1d.bias", cd, 0, 0, "mixer.conv1d.bias", 0, PLAIN);
            T("ssm_dt.bias", H, 0, 0, "mixer.dt_bias", 0, PLAIN);
            T("ssm_a", 1, H, 0, "mixer.A_log", 0, NEG_EXP);
            T("ssm_d", 1, H, 0, "mixer.D", 0, KEEP_F32);
            T("ssm_norm.weight", di / mb->n_groups, mb->n_groups, 0, "mixer.norm.weight", 0, KEEP_F32);
            T("ssm_out.weight", di, C, 0, "mixer.out_proj.weight", 0, PLAIN);
        } else if (y->n_heads) {
            int64_t Q = (int64_t)y->n_heads * D, KVD = (int64_t)y->n_kv_heads * D;
            T("attn_q.weight", C, Q, 0, "mixer.q_proj.weight", 0, PLAIN);
            T("attn_k.weight", C, KVD, 0, "mixer.k_proj.weight", 0, PLAIN);
            T("attn_v.weight", C, KVD, 0, "mixer.v_proj.weight", 0, PLAIN);
            T("attn_output.weight", Q, C, 0, "mixer.o_proj.weight", 0, PLAIN);
        } else if (y->moe.n_experts) {
            const arch_moe *e = &y->moe;
            int64_t io = arch_moe_io(e, (int)C);   /* the experts' width (LatentMoE: the latent) */
            T("ffn_gate_inp.weight", C, e->n_experts, 0, "mixer.gate.weight", 0, KEEP_F32);   /* as llama.cpp keeps it */
            T("exp_probs_b.bias", e->n_experts, 0, 0, "mixer.gate.e_score_correction_bias", 0, PLAIN);
            if (e->latent_dim) {
                T("ffn_latent_down.weight", C, io, 0, "mixer.fc1_latent_proj.weight", 0, PLAIN);
                T("ffn_latent_up.weight", io, C, 0, "mixer.fc2_latent_proj.weight", 0, PLAIN);
            }
            T("ffn_up_exps.weight", io, e->expert_ffn_dim, e->n_experts, "mixer.experts.%d.up_proj.weight", 1, PLAIN);
            T("ffn_down_exps.weight", e->expert_ffn_dim, io, e->n_experts, "mixer.experts.%d.down_proj.weight", 1, PLAIN);
            if (e->shared_ffn_dim) {
                T("ffn_up_shexp.weight", C, e->shared_ffn_dim, 0, "mixer.shared_experts.up_proj.weight", 0, PLAIN);
                T("ffn_down_shexp.weight", e->shared_ffn_dim, C, 0, "mixer.shared_experts.down_proj.weight", 0, PLAIN);
            }
        } else {
            T("ffn_up.weight", C, y->ffn_dim, 0, "mixer.up_proj.weight", 0, PLAIN);
            T("ffn_down.weight", y->ffn_dim, C, 0, "mixer.down_proj.weight", 0, PLAIN);
        }
#undef T
    }
    return n;
}

int exp_gguf_hybrid_tensors(ggw *w, const eng_model *m, int wt, const char *path, char *err, size_t errlen)
{
    const arch *a = &m->a;
    exp_gtensor *t = calloc((size_t)(3 + 9 * a->n_layers), sizeof *t);
    if (!t) {
        snprintf(err, errlen, "GGUF export: out of memory");
        return -1;
    }
    int rc = exp_gguf_write_list(w, m, t, hy_tensors(a, t), wt, path, err, errlen);
    free(t);
    return rc;
}
