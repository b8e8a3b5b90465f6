/* storage/export_gguf.c — the GGUF writer (see export.h): llama.cpp's `llama`
 * architecture for a uniform arch, `deci` with per-layer arrays otherwise; q/k rows
 * permuted for llama.cpp's interleaved RoPE; tokenizer metadata copied byte for byte from
 * a GGUF parent or built from a SentencePiece-style one. Tensors stream one at a time
 * through storage/gguf_write.c.
 */
#include "storage/export_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "storage/gguf.h"
#include "storage/export_gguf_hybrid.h"
#include "storage/export_gguf_moe.h"
#include "storage/gguf_write.h"

int exp_gguf_arch(const arch *a, char *arch_name, size_t cap, char *err, size_t errlen)
{
    if (a->rope_scaling.type == ROPE_SCALING_LLAMA3 && strcmp(a->family, "llama")) {
        snprintf(err, errlen, "GGUF export: llama3 RoPE scaling is carried (as rope_freqs.weight) for the llama "
                 "family only, not %s", a->family);
        return -1;
    }
    if (arch_moe_family(a))
        return exp_gguf_moe_arch(a, arch_name, cap, err, errlen);
    if (arch_hybrid(a))
        return exp_gguf_hybrid_arch(a, arch_name, cap, err, errlen);
    if (strcmp(a->family, "llama") != 0) {
        snprintf(err, errlen, "GGUF export: family '%s' is not supported (llama, mixtral, qwen2_moe, olmoe, nemotron_h, "
                 "mamba2)",
                 a->family);
        return -1;
    }
    if (a->attention_bias) {
        snprintf(err, errlen, "GGUF export: q/k/v biases (Qwen2-style) are not available in this build");
        return -1;
    }
    if (a->rope_scaling.type == ROPE_SCALING_DYNAMIC) {
        snprintf(err, errlen, "GGUF export: dynamic RoPE scaling has no llama.cpp equivalent for llama/deci");
        return -1;
    }
    if (a->n_layers == 0) {
        snprintf(err, errlen, "GGUF export: the arch has no layers");
        return -1;
    }
    if (arch_is_uniform(a)) {
        snprintf(arch_name, cap, "llama");
        return 0;
    }
    /* llama.cpp's llama arch sizes every layer's tensors from layer 0's values
     * (LLAMA_LOAD_LOCALS), so heterogeneous layers need `deci` (src/models/deci.cpp). */
    if (a->layers[0].n_heads == 0) {
        snprintf(err, errlen, "GGUF export: layer 0 has no attention; llama.cpp derives head size and "
                 "RoPE dimensions from layer 0's head count and would load this arch without attention");
        return -1;
    }
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        if (l->n_heads > 0 && l->ffn_dim == 0) {
            snprintf(err, errlen, "GGUF export: layer %d keeps attention but removes the MLP; llama.cpp's "
                     "deci graph skips such a layer entirely (its attention output is dropped), so it "
                     "cannot run this arch", i);
            return -1;
        }
        if (l->n_heads == 0 && l->ffn_dim == 0) {
            snprintf(err, errlen, "GGUF export: layer %d has neither attention nor MLP", i);
            return -1;
        }
    }
    snprintf(arch_name, cap, "deci");
    return 0;
}

int exp_permute_rows(float *w, int n_heads, int64_t rows, int64_t cols)
{
    if (n_heads <= 0 || rows % n_heads)
        return -1;
    int64_t D = rows / n_heads;
    if (D % 2)
        return -1;
    float *tmp = malloc((size_t)(D * cols) * sizeof *tmp);
    if (!tmp)
        return -1;
    for (int h = 0; h < n_heads; h++) {
        float *blk = w + (int64_t)h * D * cols;
        memcpy(tmp, blk, (size_t)(D * cols) * sizeof *tmp);
        for (int64_t j = 0; j < D / 2; j++)
            for (int t = 0; t < 2; t++)
                memcpy(blk + (2 * j + t) * cols, tmp + (t * (D / 2) + j) * cols, (size_t)cols * sizeof *tmp);
    }
    free(tmp);
    return 0;
}

static ggw_type weight_type(exp_dtype d)
{
    return d == EXP_FP32 ? GGW_F32 : d == EXP_FP16 ? GGW_F16 : d == EXP_Q8_0 ? GGW_Q8_0 : GGW_BF16;
}

static uint32_t gguf_file_type(exp_dtype d)
{
    switch (d) {
    case EXP_FP32: return 0;
    case EXP_FP16: return 1;
    case EXP_Q8_0: return 7;
    case EXP_BF16: return 32;
    }
    return 0;
}

/* general.* and the architecture's keys (per-layer arrays for `deci`). Returns nonzero
 * when a key could not be added (OOM). */
static int gguf_put_arch(ggw *w, const arch *a, const char *an, const exp_opts *o)
{
    char key[128];
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", an, suffix), key)
    int bad = 0;
    bad |= ggw_kv_str(w, "general.architecture", an);
    bad |= ggw_kv_str(w, "general.name", o->name ? o->name : "autocompress-export");
    bad |= ggw_kv_u32(w, "general.file_type", gguf_file_type(o->dtype));
    bad |= ggw_kv_u32(w, K("context_length"), (uint32_t)a->max_position_embeddings);
    bad |= ggw_kv_u32(w, K("embedding_length"), (uint32_t)a->hidden_size);
    bad |= ggw_kv_u32(w, K("block_count"), (uint32_t)a->n_layers);
    bad |= ggw_kv_u32(w, K("vocab_size"), (uint32_t)a->vocab_size);
    bad |= ggw_kv_f32(w, K("rope.freq_base"), (float)a->rope_theta);
    bad |= ggw_kv_f32(w, K("attention.layer_norm_rms_epsilon"), (float)a->norm_eps);
    bad |= ggw_kv_u32(w, K("attention.key_length"), (uint32_t)a->head_dim);
    bad |= ggw_kv_u32(w, K("attention.value_length"), (uint32_t)a->head_dim);
    bad |= ggw_kv_u32(w, K("rope.dimension_count"), (uint32_t)a->head_dim);
    if (a->rope_scaling.type == ROPE_SCALING_LINEAR) {
        bad |= ggw_kv_str(w, K("rope.scaling.type"), "linear");
        bad |= ggw_kv_f32(w, K("rope.scaling.factor"), (float)a->rope_scaling.factor);
    }
    if (arch_hybrid(a))
        return bad | exp_gguf_hybrid_keys(w, a, an);
    if (strcmp(a->family, "llama"))
        return bad | exp_gguf_moe_keys(w, a, an);
    if (!strcmp(an, "llama")) {
        bad |= ggw_kv_u32(w, K("feed_forward_length"), (uint32_t)a->layers[0].ffn_dim);
        bad |= ggw_kv_u32(w, K("attention.head_count"), (uint32_t)a->layers[0].n_heads);
        bad |= ggw_kv_u32(w, K("attention.head_count_kv"), (uint32_t)a->layers[0].n_kv_heads);
        return bad;
    }
    int32_t *arr = malloc((size_t)a->n_layers * sizeof *arr);
    if (!arr)
        bad = 1;
    for (int f = 0; f < 3 && !bad; f++) {
        for (int i = 0; i < a->n_layers; i++)
            arr[i] = f == 0 ? a->layers[i].ffn_dim : f == 1 ? a->layers[i].n_heads : a->layers[i].n_kv_heads;
        const char *k = f == 0 ? "feed_forward_length" : f == 1 ? "attention.head_count" : "attention.head_count_kv";
        bad |= ggw_kv_arr_i32(w, K(k), arr, (size_t)a->n_layers);
    }
#undef K
    free(arr);
    return bad;
}

/* A GGUF parent's tokenizer.* keys copied into w byte for byte, after checking that its
 * vocabulary has the model's size. Returns 0, 1 when a key could not be added (OOM), or
 * -1 with err. */
static int gguf_copy_tokenizer(ggw *w, const char *parent, int vocab, char *err, size_t errlen)
{
    gguf_file g;
    if (gguf_open(&g, parent, err, errlen) < 0)
        return -1;
    uint32_t tt;
    uint64_t ntok = 0;
    if (gguf_get_arr(&g, "tokenizer.ggml.tokens", &tt, &ntok) < 0 || ntok != (uint64_t)vocab) {
        snprintf(err, errlen, "GGUF export: parent tokenizer has %llu tokens, model vocab is %d",
                 (unsigned long long)ntok, vocab);
        gguf_close(&g);
        return -1;
    }
    int bad = 0;
    for (int i = 0; i < g.n_kv; i++) {
        const gguf_kv *kv = &g.kv[i];
        const void *raw;
        size_t len;
        if (kv->key_len < 10 || memcmp(kv->key, "tokenizer.", 10) || gguf_kv_raw(&g, i, &raw, &len) < 0)
            continue;
        char *key = strndup(kv->key, kv->key_len);
        bad |= !key || ggw_kv_raw(w, key, kv->type, raw, len);
        free(key);
    }
    gguf_close(&g);
    return bad ? 1 : 0;
}

/* GGUF tokenizer metadata from a non-GGUF parent through the engine's tokenizer API:
 * SentencePiece-style vocabularies (llama2.c, HF byte-fallback BPE) as llama.cpp's
 * "llama" model. Byte-level BPE needs the merge list, which the API does not expose. */
static int gguf_tokenizer_from_api(ggw *w, const char *parent, const char *tok_path, int vocab, char *err,
                                   size_t errlen)
{
    tok_tokenizer *t = exp_parent_tokenizer(parent, tok_path, err, errlen);
    if (!t)
        return -1;
    int rc = -1, n = tok_n_vocab(t);
    char **pieces = NULL;
    size_t *lens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    if (tok_kind_of(t) != TOK_SPM) {
        snprintf(err, errlen, "GGUF export: the parent's byte-level BPE tokenizer can be carried into GGUF only "
                 "from a GGUF parent in this build (its merge list is not available otherwise)");
        goto out;
    }
    if (n != vocab) {
        snprintf(err, errlen, "GGUF export: parent tokenizer has %d tokens, model vocab is %d", n, vocab);
        goto out;
    }
    const tok_config *c = tok_cfg(t);
    scores = calloc((size_t)n, sizeof *scores);
    types = calloc((size_t)n, sizeof *types);
    if (!scores || !types || exp_spm_pieces(t, &pieces, &lens) < 0)
        goto oom;
    for (int i = 0; i < n; i++) {
        scores[i] = tok_score(t, i);
        types[i] = (int32_t)tok_type_of(t, i);
    }
    int bad = 0;
    bad |= ggw_kv_str(w, "tokenizer.ggml.model", "llama");
    bad |= ggw_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)pieces, lens, (size_t)n);
    bad |= ggw_kv_arr_f32(w, "tokenizer.ggml.scores", scores, (size_t)n);
    bad |= ggw_kv_arr_i32(w, "tokenizer.ggml.token_type", types, (size_t)n);
    if (c->bos_id >= 0)
        bad |= ggw_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_id);
    if (c->eos_id >= 0)
        bad |= ggw_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_id);
    if (c->unk_id >= 0)
        bad |= ggw_kv_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)c->unk_id);
    if (c->pad_id >= 0)
        bad |= ggw_kv_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)c->pad_id);
    bad |= ggw_kv_bool(w, "tokenizer.ggml.add_bos_token", c->add_bos);
    bad |= ggw_kv_bool(w, "tokenizer.ggml.add_eos_token", c->add_eos);
    bad |= ggw_kv_bool(w, "tokenizer.ggml.add_space_prefix", c->add_dummy_prefix);
    if (bad)
        goto oom;
    rc = 0;
    goto out;
oom:
    snprintf(err, errlen, "GGUF export: out of memory building tokenizer metadata");
out:
    exp_free_pieces(pieces, lens, n);
    free(scores);
    free(types);
    tok_free(t);
    return rc;
}

/* Declare every tensor of t (1-D ones, the norms, stay F32 as llama.cpp's converter keeps
 * them), then write the file: each tensor read, its q/k rows permuted, converted. 0, or
 * -1 with err. */
static int gguf_put_tensors(ggw *w, const eng_model *m, const exp_tensor *t, int n, exp_dtype dtype,
                            const char *path, char *err, size_t errlen)
{
    const arch *a = &m->a;
    ggw_type wt = weight_type(dtype);
    for (int i = 0; i < n; i++) {
        char gn[96];
        int ph;
        if (gguf_name_for_hf(a, t[i].name, gn, sizeof gn, &ph) < 0) {
            snprintf(err, errlen, "GGUF export: tensor %s has no GGUF name", t[i].name);
            return -1;
        }
        int64_t ne[2] = {t[i].ndim == 2 ? t[i].shape[1] : t[i].shape[0], t[i].shape[0]};
        ggw_type tt = t[i].ndim == 1 ? GGW_F32 : wt;
        if (tt == GGW_Q8_0 && ne[0] % GGW_QK8_0)
            tt = GGW_F16;   /* rows not divisible into Q8_0 blocks: llama.cpp's quantizer falls back too */
        if (ggw_tensor(w, gn, ne, t[i].ndim, tt, err, errlen) < 0)
            return -1;
    }
    /* llama3 RoPE scaling: llama.cpp's llama and deci graphs take it from this tensor
     * alone (each frequency divided by its factor), as its own converter writes it */
    int half = a->head_dim / 2;
    float rf[512];
    int rope_freqs = a->rope_scaling.type == ROPE_SCALING_LLAMA3 && half <= 512;
    if (rope_freqs) {
        double r[512];
        arch_rope_factors(a, r);
        for (int i = 0; i < half; i++)
            rf[i] = (float)r[i];
        int64_t ne[1] = {half};
        if (ggw_tensor(w, "rope_freqs.weight", ne, 1, GGW_F32, err, errlen) < 0)
            return -1;
    }
    if (ggw_begin(w, path, err, errlen) < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        char gn[96];
        int ph;
        gguf_name_for_hf(a, t[i].name, gn, sizeof gn, &ph);
        float *d = exp_fetch_tensor(m, &t[i], err, errlen);
        if (!d)
            return -1;
        if (ph > 0 && exp_permute_rows(d, ph, t[i].shape[0], t[i].ndim == 2 ? t[i].shape[1] : 1) < 0) {
            snprintf(err, errlen, "GGUF export: cannot permute %s for %d heads", t[i].name, ph);
            free(d);
            return -1;
        }
        int wr = ggw_write_tensor(w, d, t[i].numel, err, errlen);
        free(d);
        if (wr < 0)
            return -1;
    }
    if (rope_freqs && ggw_write_tensor(w, rf, half, err, errlen) < 0)
        return -1;
    return ggw_finish(w, err, errlen);
}

int exp_gguf_write(const eng_model *m, const char *path, const exp_opts *o, exp_result *res,
                   char *err, size_t errlen)
{
    exp_result scratch;
    res = exp_result_clear(res, &scratch);
    const arch *a = &m->a;
    char an[16];
    if (exp_gguf_arch(a, an, sizeof an, err, errlen) < 0)
        return -1;
    snprintf(res->model_class, sizeof res->model_class, "%s", an);
    ggw *w = ggw_new();
    if (!w) {
        snprintf(err, errlen, "GGUF export: out of memory");
        return -1;
    }
    ggw_set_cancel(w, o->cancelled, o->cancel_arg);
    exp_tensor *t = NULL;
    int n = 0, rc = -1;
    const char *pp = o->parent_path;
    int bad = gguf_put_arch(w, a, an, o);
    if (exp_parent_format(pp) == MIO_GGUF) {
        int r = gguf_copy_tokenizer(w, pp, a->vocab_size, err, errlen);
        if (r < 0)
            goto out;
        bad |= r;
        res->tokenizer = 1;
    } else if (pp) {
        if (gguf_tokenizer_from_api(w, pp, o->parent_tokenizer, a->vocab_size, err, errlen) < 0)
            goto out;
        res->tokenizer = 1;
    } else {
        /* llama.cpp's vocabulary-less model: it loads and runs token ids (timing models). */
        bad |= ggw_kv_str(w, "tokenizer.ggml.model", "none");
        snprintf(res->note, sizeof res->note, "no parent given: the file carries no vocabulary "
                 "(tokenizer.ggml.model \"none\": llama.cpp runs it on token ids only)");
    }
    if (bad) {
        snprintf(err, errlen, "GGUF export: metadata out of memory or duplicate key");
        goto out;
    }
    if (arch_hybrid(a)) {
        if (exp_gguf_hybrid_tensors(w, m, weight_type(o->dtype), path, err, errlen) < 0)
            goto out;
    } else if (strcmp(a->family, "llama")) {
        if (exp_gguf_moe_tensors(w, m, an, weight_type(o->dtype), path, err, errlen) < 0)
            goto out;
    } else if (exp_list_tensors(m, &t, &n, err, errlen) < 0 ||
               gguf_put_tensors(w, m, t, n, o->dtype, path, err, errlen) < 0) {
        goto out;
    }
    rc = 0;
out:
    free(t);
    ggw_free(w);
    return rc;
}
