/* tests/unit/test_engine_model.c — forward-path properties of the engine on tiny random
 * models: decode with a KV cache equals full recompute, right padding leaves other rows
 * alone, the workspace prediction equals the measured peak, accounting returns to zero,
 * tensor names and shapes round-trip, invalid input is refused with a reason.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <omp.h>

#include "engine/model.h"
#include "engine/rng.h"

/* A heterogeneous tiny arch: GQA, a layer without MLP, a layer without attention; with moe
 * == 1, a Qwen2-MoE whose layers 0 and 2 are mixtures of experts (one with a shared expert);
 * with moe == 2, a Nemotron-H hybrid "M*-M": Mamba-2 mixers of two shapes in layers 0 and 3;
 * with moe == 3, an OLMoE (q and k RMS-normed over their rows) with MoE layers 0 and 2;
 * with moe == 4, the hybrid of 2 whose layer 2 is a LatentMoE (experts in a latent of 10). */
static void tiny_arch_moe(arch *a, int tied, int bias, int moe)
{
    assert_int_equal(arch_init(a, 4), 0);
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = 37;
    a->hidden_size = 24;
    a->head_dim = 8;
    a->max_position_embeddings = 256;
    a->rope_theta = 10000;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = tied;
    a->attention_bias = bias;
    int cfg[4][3] = {{4, 2, 20}, {3, 3, 0}, {0, 0, 17}, {2, 1, 9}};
    for (int l = 0; l < 4; l++) {
        a->layers[l].source_layer = l;
        a->layers[l].n_heads = cfg[l][0];
        a->layers[l].n_kv_heads = cfg[l][1];
        a->layers[l].ffn_dim = cfg[l][2];
    }
    if (moe == 1) {
        snprintf(a->family, sizeof a->family, "qwen2_moe");
        a->layers[0].ffn_dim = a->layers[2].ffn_dim = 0;
        a->layers[0].moe = (arch_moe){.n_experts = 4, .top_k = 2, .expert_ffn_dim = 6, .shared_ffn_dim = 5};
        a->layers[2].moe = (arch_moe){.n_experts = 3, .top_k = 1, .expert_ffn_dim = 7, .norm_topk = 1};
    }
    if (moe == 3) {
        snprintf(a->family, sizeof a->family, "olmoe");
        a->attention_bias = 0;
        a->layers[0].ffn_dim = a->layers[2].ffn_dim = 0;
        a->layers[0].moe = (arch_moe){.n_experts = 4, .top_k = 2, .expert_ffn_dim = 6};
        a->layers[2].moe = (arch_moe){.n_experts = 3, .top_k = 1, .expert_ffn_dim = 7, .norm_topk = 1};
    }
    if (moe == 2 || moe == 4) {
        snprintf(a->family, sizeof a->family, "nemotron_h");
        a->attention_bias = 0;
        a->layers[0] = (arch_layer){.source_layer = 0, .mamba = {4, 6, 5, 2, 4}};
        a->layers[1].ffn_dim = 0;
        a->layers[3] = (arch_layer){.source_layer = 3, .mamba = {6, 2, 3, 3, 3}};
    }
    if (moe == 4)
        a->layers[2] = (arch_layer){.source_layer = 2, .moe = {.n_experts = 4, .top_k = 2, .expert_ffn_dim = 6,
                                    .shared_ffn_dim = 5, .norm_topk = 1, .sigmoid = 1, .n_group = 1,
                                    .topk_group = 1, .routed_scale = 2.5, .latent_dim = 10}};
}

static void tiny_arch(arch *a, int tied, int bias)
{
    tiny_arch_moe(a, tied, bias, 0);
}

/* A stop hook counting its questions; stops when the count starts negative. */
static int count_asks(void *ud)
{
    int *n = ud;
    return (*n)++ < 0;
}

/* Random weights are one splitmix64 stream of normals over the tensors in order (the
 * sequential draw below), whatever the thread count: eng_model_randomize fills them in
 * parallel pieces, here across a piece and a 2^20-value block of the embedding
 * (50000 x 24 values) and on the small tensors after it. */
static void test_randomize_one_stream(void **state)
{
    (void)state;
    arch a;
    tiny_arch_moe(&a, 0, 1, 1);
    a.vocab_size = 50000;
    const uint64_t seed = 11;
    const float std = 0.3f;
    int was = omp_get_max_threads();
    for (int threads = 1; threads <= 2; threads++) {
        omp_set_num_threads(threads);
        eng_backend *be = eng_backend_cpu_new(threads);
        eng_model m;
        char err[256];
        assert_int_equal(eng_model_init(&m, &a, be, err, sizeof err), 0);
        eng_model_randomize(&m, seed, std);
        uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
        size_t checked = 0, bad = 0;
        for (int i = 0; i < eng_model_tensor_count(&m); i++) {
            const char *name;
            int64_t shape[2];
            int nd;
            float *x;
            assert_int_equal(eng_model_tensor(&m, i, &name, shape, &nd, &x), 0);
            size_t n = (size_t)shape[0] * (size_t)(nd == 2 ? shape[1] : 1);
            float base = strstr(name, "norm") ? 1.0f : 0.0f;
            for (size_t j = 0; j < n; j++, checked++) {
                float want = base + std * (float)eng_rng_normal(&s);
                bad += memcmp(&want, &x[j], sizeof want) != 0;
            }
        }
        assert_true(checked > (size_t)1 << 20);
        assert_int_equal(bad, 0);
        /* asked after each 2^20 values: never stopping draws the same; stopping ends it */
        int asks[2] = {0, 0};
        eng_model_randomize(&m, seed + 1, std);
        assert_int_equal(eng_model_randomize_until(&m, seed, std, count_asks, &asks[0]), 0);
        assert_true(asks[0] >= 1 && (size_t)asks[0] <= checked >> 20);   /* at most one per 2^20 values */
        float *x0;
        assert_int_equal(eng_model_tensor(&m, 0, NULL, NULL, NULL, &x0), 0);
        uint64_t s1 = seed * 0x2545F4914F6CDD1Dull + 1;
        float w0 = 0.0f + std * (float)eng_rng_normal(&s1);
        assert_memory_equal(&w0, x0, sizeof w0);
        asks[1] = -1;   /* stop at the first question */
        assert_int_equal(eng_model_randomize_until(&m, seed, std, count_asks, &asks[1]), 1);
        eng_model_free(&m);
        eng_backend_free(be);
    }
    omp_set_num_threads(was);
    arch_free(&a);
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (e > d)
            d = e;
    }
    return d;
}

static void kv_decode_matches_full(int moe)
{
    arch a;
    tiny_arch_moe(&a, 0, 1, moe);
    eng_backend *be = eng_backend_cpu_new(2);
    eng_model m;
    char err[256];
    assert_int_equal(eng_model_init(&m, &a, be, err, sizeof err), 0);
    eng_model_randomize(&m, 7, 0.3f);
    enum { B = 2, T = 45, P = 36, CH = 5 };   /* prefill crosses an attention tile; a chunk with pos0 > 0 */
    int V = a.vocab_size;
    int toks[B * T];
    for (int i = 0; i < B * T; i++)
        toks[i] = (i * 7 + 3) % V;
    float *full = malloc(sizeof(float) * B * T * V), *last = malloc(sizeof(float) * B * V);
    eng_fwd_args fa = {.tokens = toks, .B = B, .T = T, .logits_mode = ENG_LOGITS_ALL, .logits = full};
    assert_int_equal(eng_forward(&m, &fa, err, sizeof err), 0);

    /* Prefill P tokens, then decode one token at a time; compare each step's logits. */
    eng_kv_cache *kv = eng_kv_new(&m, B, T);
    assert_non_null(kv);
    assert_int_equal(eng_kv_bytes(kv), eng_kv_bytes_for(&a, B, T));
    int pre[B * P];
    for (int b = 0; b < B; b++)
        memcpy(pre + b * P, toks + b * T, sizeof(int) * P);
    eng_fwd_args pa = {.tokens = pre, .B = B, .T = P, .kv = kv, .logits_mode = ENG_LOGITS_LAST, .logits = last};
    assert_int_equal(eng_forward(&m, &pa, err, sizeof err), 0);
    double worst = 0;
    for (int b = 0; b < B; b++)
        worst = fmax(worst, max_abs_diff(last + b * V, full + ((size_t)b * T + P - 1) * V, (size_t)V));
    int chunk[B * CH];
    for (int b = 0; b < B; b++)
        memcpy(chunk + b * CH, toks + b * T + P, sizeof(int) * CH);
    eng_fwd_args ca = {.tokens = chunk, .B = B, .T = CH, .kv = kv, .logits_mode = ENG_LOGITS_LAST, .logits = last};
    assert_int_equal(eng_forward(&m, &ca, err, sizeof err), 0);
    for (int b = 0; b < B; b++)
        worst = fmax(worst, max_abs_diff(last + b * V, full + ((size_t)b * T + P + CH - 1) * V, (size_t)V));
    for (int t = P + CH; t < T; t++) {
        int step[B];
        for (int b = 0; b < B; b++)
            step[b] = toks[b * T + t];
        eng_fwd_args da = {.tokens = step, .B = B, .T = 1, .kv = kv, .logits_mode = ENG_LOGITS_LAST, .logits = last};
        assert_int_equal(eng_forward(&m, &da, err, sizeof err), 0);
        for (int b = 0; b < B; b++)
            worst = fmax(worst, max_abs_diff(last + b * V, full + ((size_t)b * T + t) * V, (size_t)V));
    }
    assert_int_equal(eng_kv_len(kv, 0), T);
    print_message("KV decode vs full recompute: max |diff| %.2e\n", worst);
    assert_true(worst < 1e-4);
    /* The cache is full now: one more token is refused with a reason. */
    int one[B] = {1, 2};
    eng_fwd_args xa = {.tokens = one, .B = B, .T = 1, .kv = kv, .logits_mode = ENG_LOGITS_LAST, .logits = last};
    assert_int_equal(eng_forward(&m, &xa, err, sizeof err), -1);
    assert_non_null(strstr(err, "full"));
    eng_kv_reset(kv);
    assert_int_equal(eng_kv_len(kv, 1), 0);
    eng_kv_free(kv);
    eng_model_free(&m);
    assert_int_equal(be->cur_bytes, 0);
    eng_backend_free(be);
    arch_free(&a);
    free(full);
    free(last);
}

static void test_kv_decode_matches_full(void **state)
{
    (void)state;
    kv_decode_matches_full(0);
}

/* The experts run per token: prefill, chunks and single-token decode route alike. */
static void test_kv_decode_matches_full_moe(void **state)
{
    (void)state;
    kv_decode_matches_full(1);
}

/* LatentMoE routes per token like any MoE: prefill, chunks and decode agree. */
static void test_kv_decode_matches_full_latent(void **state)
{
    (void)state;
    kv_decode_matches_full(4);
}

/* The cache holds k after its norm (OLMoE's q_norm / k_norm run per token). */
static void test_kv_decode_matches_full_olmoe(void **state)
{
    (void)state;
    kv_decode_matches_full(3);
}

/* Prefill, chunks and single-token decode carry the Mamba-2 conv and SSM states. */
static void test_kv_decode_matches_full_hybrid(void **state)
{
    (void)state;
    kv_decode_matches_full(2);
}

static void padding_isolated(int moe)
{
    arch a;
    tiny_arch_moe(&a, 1, 0, moe);
    eng_backend *be = eng_backend_cpu_new(2);
    eng_model m;
    char err[256];
    assert_int_equal(eng_model_init(&m, &a, be, err, sizeof err), 0);
    eng_model_randomize(&m, 3, 0.3f);
    assert_int_equal(eng_model_enable_masks(&m), 0);   /* masks at 1.0 must not change anything */
    enum { T = 8 };
    int V = a.vocab_size;
    int row0[T] = {1, 5, 9, 2, 30, 30, 30, 30};          /* 4 valid tokens + padding */
    int batch[2 * T] = {1, 5, 9, 2, 11, 12, 13, 14, 4, 4, 8, 8, 15, 16, 23, 36};
    int lens[2] = {4, T};
    float *lb = malloc(sizeof(float) * 2 * T * V), *l1 = malloc(sizeof(float) * T * V);
    float last_b[2 * 37], last_1[37];
    eng_fwd_args fb = {.tokens = batch, .B = 2, .T = T, .lens = lens, .logits_mode = ENG_LOGITS_ALL, .logits = lb};
    assert_int_equal(eng_forward(&m, &fb, err, sizeof err), 0);
    int len1 = 4;
    eng_fwd_args f1 = {.tokens = row0, .B = 1, .T = T, .lens = &len1, .logits_mode = ENG_LOGITS_ALL, .logits = l1};
    assert_int_equal(eng_forward(&m, &f1, err, sizeof err), 0);
    /* Row 0's valid positions do not see its padding nor row 1. */
    assert_true(max_abs_diff(lb, l1, (size_t)4 * V) < 1e-5);
    /* LAST picks each row's last valid token. */
    eng_fwd_args fl = {.tokens = batch, .B = 2, .T = T, .lens = lens, .logits_mode = ENG_LOGITS_LAST, .logits = last_b};
    assert_int_equal(eng_forward(&m, &fl, err, sizeof err), 0);
    assert_true(max_abs_diff(last_b, lb + 3 * V, (size_t)V) < 1e-5);
    assert_true(max_abs_diff(last_b + V, lb + (size_t)(2 * T - 1) * V, (size_t)V) < 1e-5);
    /* Row 0 alone without padding gives the same last logits. */
    eng_fwd_args f2 = {.tokens = batch, .B = 1, .T = 4, .logits_mode = ENG_LOGITS_LAST, .logits = last_1};
    assert_int_equal(eng_forward(&m, &f2, err, sizeof err), 0);
    assert_true(max_abs_diff(last_1, lb + 3 * V, (size_t)V) < 1e-5);
    /* Changing row 1 and row 0's padding leaves row 0's valid logits bit-identical. */
    float *lb2 = malloc(sizeof(float) * 2 * T * V);
    batch[T + 3] = 0;
    batch[6] = 17;
    eng_fwd_args f3 = {.tokens = batch, .B = 2, .T = T, .lens = lens, .logits_mode = ENG_LOGITS_ALL, .logits = lb2};
    assert_int_equal(eng_forward(&m, &f3, err, sizeof err), 0);
    assert_memory_equal(lb, lb2, sizeof(float) * 4 * V);
    assert_true(max_abs_diff(lb + (size_t)T * V, lb2 + (size_t)T * V, (size_t)T * V) > 1e-4);
    free(lb2);
    eng_model_free(&m);
    assert_int_equal(be->cur_bytes, 0);
    eng_backend_free(be);
    arch_free(&a);
    free(lb);
    free(l1);
}

static void test_padding_isolated(void **state)
{
    (void)state;
    padding_isolated(0);
}

/* A row's padding never reaches its valid tokens through the conv or the scan either. */
static void test_padding_isolated_hybrid(void **state)
{
    (void)state;
    padding_isolated(2);
}

static void workspace_prediction_and_accounting(int moe)
{
    arch a;
    tiny_arch_moe(&a, 0, 0, moe);
    eng_backend *be = eng_backend_cpu_new(2);
    eng_model m;
    char err[256];
    assert_int_equal(eng_model_init(&m, &a, be, err, sizeof err), 0);
    assert_int_equal(be->cur_bytes, (size_t)arch_params(&a) * 4 + (size_t)a.head_dim / 2 * 4);
    eng_model_randomize(&m, 1, 0.2f);
    int toks[3 * 9];
    for (int i = 0; i < 27; i++)
        toks[i] = i % a.vocab_size;
    float *logits = malloc(sizeof(float) * 27 * a.vocab_size), *all = malloc(sizeof(float) * 27 * a.vocab_size);
    assert_non_null(logits);
    assert_non_null(all);
    /* ROWS: the logits of the positions asked for, in their order, are ALL's rows */
    int want[5] = {26, 0, 5, 13, 14};
    int modes[4] = {ENG_LOGITS_ALL, ENG_LOGITS_LAST, ENG_LOGITS_NONE, ENG_LOGITS_ROWS};
    for (int i = 0; i < 4; i++) {
        size_t base = be->cur_bytes;
        eng_backend_reset_peak(be);
        eng_fwd_args fa = {.tokens = toks, .B = 3, .T = 9, .logits_mode = modes[i], .logits = logits,
                           .logit_rows = want, .n_logit_rows = 5};
        assert_int_equal(eng_forward(&m, &fa, err, sizeof err), 0);
        assert_int_equal(be->cur_bytes, base);
        if (modes[i] == ENG_LOGITS_ALL)
            memcpy(all, logits, sizeof(float) * 27 * a.vocab_size);
        for (int k = 0; modes[i] == ENG_LOGITS_ROWS && k < 5; k++)
            for (int v = 0; v < a.vocab_size; v++)
                assert_float_equal(logits[(size_t)k * a.vocab_size + v], all[(size_t)want[k] * a.vocab_size + v],
                                   1e-5);
        print_message("mode %d: peak %zu predicted %zu\n", modes[i], be->peak_bytes - base,
                      eng_forward_workspace_bytes(&a, 3, 9, 0, modes[i], be->threads, 0));
        assert_int_equal(be->peak_bytes - base, eng_forward_workspace_bytes(&a, 3, 9, 0, modes[i], be->threads, 0));
    }
    /* With a cache: prediction includes the cache-sized attention scratch. */
    eng_kv_cache *kv = eng_kv_new(&m, 3, 32);
    size_t base = be->cur_bytes;
    eng_backend_reset_peak(be);
    eng_fwd_args fk = {.tokens = toks, .B = 3, .T = 9, .kv = kv, .logits_mode = ENG_LOGITS_LAST, .logits = logits};
    assert_int_equal(eng_forward(&m, &fk, err, sizeof err), 0);
    assert_int_equal(be->peak_bytes - base, eng_forward_workspace_bytes(&a, 3, 9, 32, ENG_LOGITS_LAST, be->threads, 0));
    eng_kv_free(kv);
    /* Training workspace (CE only) equals its prediction. */
    assert_int_equal(eng_model_enable_grads(&m), 0);
    int tg[27];
    for (int i = 0; i < 27; i++)
        tg[i] = (i + 1) % a.vocab_size;
    base = be->cur_bytes;
    eng_backend_reset_peak(be);
    eng_loss_spec ls = {.kind = ENG_LOSS_CE, .targets = tg};
    eng_loss_result lr;
    assert_int_equal(eng_forward_backward(&m, toks, 3, 9, &ls, ENG_GRAD_WEIGHTS, &lr, err, sizeof err), 0);
    assert_int_equal(be->peak_bytes - base, eng_train_workspace_bytes(&m, 3, 9, NULL, 0));
    assert_int_equal(lr.tokens, 27);
    assert_true(lr.loss > 0 && isfinite(lr.loss));
    /* KD (the model as its own teacher): the teacher pass adds its forward workspace. */
    eng_backend_reset_peak(be);
    eng_loss_spec kd = {.kind = ENG_LOSS_KD | ENG_LOSS_CE, .targets = tg, .teacher = &m, .temperature = 2.0f,
                        .kd_weight = 0.5f};
    assert_int_equal(eng_forward_backward(&m, toks, 3, 9, &kd, ENG_GRAD_WEIGHTS, &lr, err, sizeof err), 0);
    assert_int_equal(be->peak_bytes - base, eng_train_workspace_bytes(&m, 3, 9, &m, 0));
    assert_true(fabs(lr.kd) < 1e-6);   /* unmasked self-teacher */
    /* The intermediate-state loss needs a student cut from the teacher: not the model itself. */
    kd.hidden_weight = 1.0f;
    assert_int_equal(eng_forward_backward(&m, toks, 3, 9, &kd, ENG_GRAD_WEIGHTS, &lr, err, sizeof err), -1);
    assert_non_null(strstr(err, "not with masks, nor with the model as its own teacher"));
    /* A student of layers 1..3 (layer 0 removed), narrower: the teacher's layer outputs add to the
       workspace, as predicted; its loss is a cosine distance in (0, 2]. */
    arch sa;
    assert_int_equal(arch_copy(&sa, &a), 0);
    sa.hidden_size = a.hidden_size - 8;
    sa.n_layers = a.n_layers - 1;
    for (int l = 0; l < sa.n_layers; l++)
        sa.layers[l] = a.layers[l + 1];
    eng_model st;
    assert_int_equal(eng_model_init(&st, &sa, be, err, sizeof err), 0);
    eng_model_randomize(&st, 2, 0.2f);
    assert_int_equal(eng_model_enable_grads(&st), 0);
    base = be->cur_bytes;
    eng_backend_reset_peak(be);
    assert_int_equal(eng_forward_backward(&st, toks, 3, 9, &kd, ENG_GRAD_WEIGHTS, &lr, err, sizeof err), 0);
    assert_int_equal(be->peak_bytes - base, eng_train_workspace_bytes(&st, 3, 9, &m, 1));
    assert_true(lr.hidden > 0 && lr.hidden <= 2);
    /* a source layer the teacher lacks is refused, by name */
    st.a.layers[2].source_layer = a.n_layers;
    assert_int_equal(eng_forward_backward(&st, toks, 3, 9, &kd, ENG_GRAD_WEIGHTS, &lr, err, sizeof err), -1);
    assert_non_null(strstr(err, "student layer 2's source layer 4"));
    eng_model_free(&st);
    arch_free(&sa);
    eng_adamw *o = eng_adamw_new(&m);
    assert_non_null(o);
    eng_adamw_free(o);
    eng_model_free(&m);
    assert_int_equal(be->cur_bytes, 0);
    eng_backend_free(be);
    arch_free(&a);
    free(logits);
    free(all);
}

static void test_workspace_prediction_and_accounting(void **state)
{
    (void)state;
    workspace_prediction_and_accounting(0);
}

/* The experts' scratch (forward, and the backward's larger one) is in the prediction. */
static void test_workspace_prediction_moe(void **state)
{
    (void)state;
    workspace_prediction_and_accounting(1);
}

/* LatentMoE's latent buffers are in the forward and backward scratch the predictions count. */
static void test_workspace_prediction_latent(void **state)
{
    (void)state;
    workspace_prediction_and_accounting(4);
}

/* OLMoE's q/k norms: weights in the layout, their saved rstd in the training workspace. */
static void test_workspace_prediction_olmoe(void **state)
{
    (void)state;
    workspace_prediction_and_accounting(3);
}

/* The Mamba-2 scratch (the forward's in the mixer region, the backward's per call) and the
 * cache's conv and SSM states are in the predictions. */
static void test_workspace_prediction_hybrid(void **state)
{
    (void)state;
    workspace_prediction_and_accounting(2);
}

/* Grouped routing with more groups than 256: with one expert per group and as many groups
 * kept as experts chosen, the choice is plain top-k, so the logits equal one group's. */
static void test_moe_many_groups(void **state)
{
    (void)state;
    arch a[2];
    eng_model m[2];
    char err[256];
    eng_backend *be = eng_backend_cpu_new(1);
    float lg[2][3 * 16];
    int toks[3] = {1, 7, 12};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(arch_init(&a[i], 1), 0);
        snprintf(a[i].family, sizeof a[i].family, "nemotron_h");
        a[i].vocab_size = 16;
        a[i].hidden_size = 8;
        a[i].head_dim = 4;
        a[i].max_position_embeddings = 64;
        a[i].rope_theta = 10000;
        a[i].norm_eps = 1e-5;
        a[i].layers[0].moe = (arch_moe){.n_experts = 300, .top_k = 3, .expert_ffn_dim = 2, .norm_topk = 1,
                                        .sigmoid = 1, .n_group = i ? 300 : 1, .topk_group = i ? 3 : 1,
                                        .routed_scale = 2.0};
        assert_int_equal(eng_model_init(&m[i], &a[i], be, err, sizeof err), 0);
    }
    eng_model_randomize(&m[0], 5, 0.5f);
    assert_int_equal(m[0].n_params, m[1].n_params);
    be->copy(be, m[1].params, m[0].params, m[0].n_params * sizeof(float));
    for (int i = 0; i < 2; i++) {
        eng_fwd_args fa = {.tokens = toks, .B = 1, .T = 3, .logits_mode = ENG_LOGITS_ALL, .logits = lg[i]};
        assert_int_equal(eng_forward(&m[i], &fa, err, sizeof err), 0);
    }
    assert_memory_equal(lg[0], lg[1], sizeof lg[0]);
    for (int i = 0; i < 2; i++) {
        eng_model_free(&m[i]);
        arch_free(&a[i]);
    }
    eng_backend_free(be);
}

static void test_tensors_and_errors(void **state)
{
    (void)state;
    arch a;
    tiny_arch(&a, 0, 1);
    eng_backend *be = eng_backend_cpu_new(1);
    eng_model m;
    char err[256];
    assert_int_equal(eng_model_init(&m, &a, be, err, sizeof err), 0);
    int n = eng_model_tensor_count(&m);
    /* emb + L0 (norm, q,k,v, 3 bias, o, norm, g,u,d) + L1 attention (8) + L2 mlp (4) + L3 full (12) + norm + head */
    assert_int_equal(n, 1 + 12 + 8 + 4 + 12 + 1 + 1);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        const char *name;
        int64_t shape[2];
        int nd;
        float *d;
        assert_int_equal(eng_model_tensor(&m, i, &name, shape, &nd, &d), 0);
        total += shape[0] * (nd == 2 ? shape[1] : 1);
    }
    assert_int_equal(total, arch_params(&a));
    assert_int_equal(eng_model_tensor(&m, n, NULL, NULL, NULL, NULL), -1);
    float w[8 * 2 * 24];
    for (int i = 0; i < 8 * 2 * 24; i++)
        w[i] = (float)i;
    int64_t shp[2] = {2 * 8, 24}, bad[2] = {24, 24};
    assert_int_equal(eng_model_set_tensor(&m, "model.layers.0.self_attn.k_proj.weight", w, shp, 2, err, sizeof err), 0);
    float back[8 * 2 * 24];
    assert_int_equal(eng_model_get_tensor(&m, "model.layers.0.self_attn.k_proj.weight", back, 8 * 2 * 24), 8 * 2 * 24);
    assert_memory_equal(w, back, sizeof w);
    assert_int_equal(eng_model_set_tensor(&m, "model.layers.0.self_attn.k_proj.weight", w, bad, 2, err, sizeof err), -1);
    assert_non_null(strstr(err, "k_proj"));
    assert_non_null(strstr(err, "[16, 24]"));
    assert_int_equal(eng_model_set_tensor(&m, "model.layers.2.self_attn.q_proj.weight", w, shp, 2, err, sizeof err), -1);
    assert_int_equal(eng_model_get_tensor(&m, "model.layers.1.mlp.up_proj.weight", back, 10), -1);
    float one = 0;
    assert_int_equal(eng_model_get_tensor(&m, "model.norm.weight", back, 24), 24);
    one = back[5];
    assert_true(one == 1.0f);
    int toks[2] = {0, 99};
    eng_fwd_args fa = {.tokens = toks, .B = 1, .T = 2, .logits_mode = ENG_LOGITS_NONE};
    assert_int_equal(eng_forward(&m, &fa, err, sizeof err), -1);
    assert_non_null(strstr(err, "out of range"));
    /* logits asked for at a position outside the batch, or without the positions */
    toks[1] = 3;
    float lg[2 * 37];
    int far[1] = {2};
    eng_fwd_args fr = {.tokens = toks, .B = 1, .T = 2, .logits_mode = ENG_LOGITS_ROWS, .logits = lg,
                       .logit_rows = far, .n_logit_rows = 1};
    assert_int_equal(eng_forward(&m, &fr, err, sizeof err), -1);
    assert_non_null(strstr(err, "logit row 0 is position 2"));
    fr.logit_rows = NULL;
    assert_int_equal(eng_forward(&m, &fr, err, sizeof err), -1);
    assert_non_null(strstr(err, "without their positions"));
    eng_model_free(&m);
    assert_int_equal(be->cur_bytes, 0);
    /* Dynamic RoPE scaling past the trained length is refused, not silently wrong. */
    a.rope_scaling.type = ROPE_SCALING_DYNAMIC;
    a.rope_scaling.factor = 2.0;
    a.max_position_embeddings = 4;
    assert_int_equal(eng_model_init(&m, &a, be, err, sizeof err), 0);
    int five[5] = {1, 2, 3, 4, 5};
    eng_fwd_args dyn = {.tokens = five, .B = 1, .T = 5, .logits_mode = ENG_LOGITS_NONE};
    assert_int_equal(eng_forward(&m, &dyn, err, sizeof err), -1);
    assert_non_null(strstr(err, "not available"));
    dyn.T = 4;
    assert_int_equal(eng_forward(&m, &dyn, err, sizeof err), 0);
    eng_model_free(&m);
    /* Invalid arch is refused with the field named. */
    a.layers[0].n_kv_heads = 3;
    assert_int_equal(eng_model_init(&m, &a, be, err, sizeof err), -1);
    assert_non_null(strstr(err, "n_heads"));
    eng_backend_free(be);
    arch_free(&a);
}

static void test_stats_and_timings(void **state)
{
    (void)state;
    arch a;
    tiny_arch(&a, 1, 0);
    eng_backend *be = eng_backend_cpu_new(1);
    eng_model m;
    char err[256];
    assert_int_equal(eng_model_init(&m, &a, be, err, sizeof err), 0);
    eng_model_randomize(&m, 9, 0.3f);
    eng_act_stats *s = eng_stats_new(&m);
    assert_non_null(s);
    int toks[2 * 6] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    int lens[2] = {6, 3};
    double lns[8], fns[2];
    eng_fwd_args fa = {.tokens = toks, .B = 2, .T = 6, .lens = lens, .logits_mode = ENG_LOGITS_NONE,
                       .stats = s, .layer_ns = lns, .fixed_ns = fns};
    assert_int_equal(eng_forward(&m, &fa, err, sizeof err), 0);
    assert_int_equal(s->tokens, 9);
    assert_null(s->ffn_abs[1]);
    assert_null(s->head_norm[2]);
    for (int j = 0; j < 20; j++)
        assert_true(s->ffn_abs[0][j] > 0);
    for (int h = 0; h < 3; h++)
        assert_true(s->head_norm[1][h] > 0);
    assert_true(s->hidden_abs[0] > 0);
    assert_true(lns[0] > 0 && lns[1] > 0 && lns[3] == 0 && lns[4] == 0 && fns[0] > 0);
    /* Padding does not count: the same 9 valid tokens in separate calls give the same sums. */
    eng_act_stats *s2 = eng_stats_new(&m);
    int r0[6] = {1, 2, 3, 4, 5, 6}, r1[3] = {7, 8, 9};
    eng_fwd_args a0 = {.tokens = r0, .B = 1, .T = 6, .stats = s2}, a1 = {.tokens = r1, .B = 1, .T = 3, .stats = s2};
    assert_int_equal(eng_forward(&m, &a0, err, sizeof err), 0);
    assert_int_equal(eng_forward(&m, &a1, err, sizeof err), 0);
    for (int j = 0; j < 20; j++)
        assert_true(fabs(s->ffn_abs[0][j] - s2->ffn_abs[0][j]) < 1e-4 * (1 + fabs(s2->ffn_abs[0][j])));
    eng_stats_free(s, a.n_layers);
    eng_stats_free(s2, a.n_layers);
    eng_model_free(&m);
    eng_backend_free(be);
    arch_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_randomize_one_stream),
        cmocka_unit_test(test_kv_decode_matches_full),
        cmocka_unit_test(test_kv_decode_matches_full_moe),
        cmocka_unit_test(test_workspace_prediction_moe),
        cmocka_unit_test(test_padding_isolated),
        cmocka_unit_test(test_padding_isolated_hybrid),
        cmocka_unit_test(test_kv_decode_matches_full_hybrid),
        cmocka_unit_test(test_kv_decode_matches_full_olmoe),
        cmocka_unit_test(test_kv_decode_matches_full_latent),
        cmocka_unit_test(test_workspace_prediction_hybrid),
        cmocka_unit_test(test_workspace_prediction_olmoe),
        cmocka_unit_test(test_workspace_prediction_latent),
        cmocka_unit_test(test_moe_many_groups),
        cmocka_unit_test(test_workspace_prediction_and_accounting),
        cmocka_unit_test(test_tensors_and_errors),
        cmocka_unit_test(test_stats_and_timings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
