/* tests/unit/test_cuda_model.c — the whole model on the CUDA backend against the CPU
 * backend, for each family the engine runs: a small heterogeneous Llama (removed
 * attention, removed MLP, GQA, head dim 8 as in stories260K), a Qwen2-MoE (softmax
 * routing, a shared expert, attention bias), an OLMoE (q/k RMS-normed over their rows)
 * and a Nemotron-H hybrid (Mamba-2 mixers of two shapes, attention, a sigmoid-routed
 * grouped LatentMoE with a shared expert), with identical random weights on both;
 * prefill logits, cache decode, forward+backward (CE and KD, weight and mask gradients:
 * experts and Mamba heads included) and an AdamW step. End-to-end tolerance 1e-4
 * relative to each tensor's max. Skips without a GPU.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/devices.h"
#include "engine/model.h"
#if defined(AC_CUDA) && AC_CUDA
#include "cuda/backend_cuda.h"
#endif

#define TOL 1e-4

static eng_backend *CPU, *GPU;

enum { FAM_LLAMA, FAM_QWEN2_MOE, FAM_OLMOE, FAM_NEMOTRON_H, N_FAM };
static const char *const FAM_NAME[N_FAM] = {"llama", "qwen2_moe", "olmoe", "nemotron_h"};
static const int FAM_ID[N_FAM] = {FAM_LLAMA, FAM_QWEN2_MOE, FAM_OLMOE, FAM_NEMOTRON_H};

static void make_arch(arch *a, int fam)
{
    int nl = fam == FAM_NEMOTRON_H ? 4 : 3;
    assert_int_equal(arch_init(a, nl), 0);
    snprintf(a->family, sizeof a->family, "%s", FAM_NAME[fam]);
    a->vocab_size = 97;
    a->hidden_size = 48;
    a->head_dim = 8;
    a->max_position_embeddings = 256;
    a->rope_theta = 10000.0;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = 1;
    arch_layer L[3] = {
        {.source_layer = 0, .n_heads = 6, .n_kv_heads = 2, .ffn_dim = 64},
        {.source_layer = 1, .n_heads = 0, .n_kv_heads = 0, .ffn_dim = 40},
        {.source_layer = 2, .n_heads = 4, .n_kv_heads = 4, .ffn_dim = 0},
    };
    if (fam == FAM_QWEN2_MOE || fam == FAM_OLMOE) {
        L[0].ffn_dim = L[1].ffn_dim = 0;
        L[0].moe = (arch_moe){.n_experts = 4, .top_k = 2, .expert_ffn_dim = 12,
                              .shared_ffn_dim = fam == FAM_QWEN2_MOE ? 10 : 0};
        L[1].moe = (arch_moe){.n_experts = 3, .top_k = 1, .expert_ffn_dim = 14, .norm_topk = 1};
        a->attention_bias = fam == FAM_QWEN2_MOE;
        a->tie_word_embeddings = 0;
    }
    if (fam == FAM_NEMOTRON_H) {
        /* "M*EM": Mamba (8 heads of 6, 2 groups), attention alone, LatentMoE, Mamba (4 of 12) */
        a->layers[0] = (arch_layer){.source_layer = 0, .mamba = {8, 6, 16, 2, 4}};
        a->layers[1] = (arch_layer){.source_layer = 1, .n_heads = 6, .n_kv_heads = 2};
        a->layers[2] = (arch_layer){.source_layer = 2, .moe = {.n_experts = 8, .top_k = 2, .expert_ffn_dim = 12,
                                    .shared_ffn_dim = 10, .norm_topk = 1, .sigmoid = 1, .n_group = 2,
                                    .topk_group = 1, .routed_scale = 2.5, .latent_dim = 24}};
        a->layers[3] = (arch_layer){.source_layer = 3, .mamba = {4, 12, 8, 1, 4}};
    } else {
        memcpy(a->layers, L, sizeof L);
    }
    char err[256];
    if (arch_validate(a, err, sizeof err) != 0)
        fail_msg("%s arch: %s", FAM_NAME[fam], err);
}

static double max_rel(const float *g, const float *c, size_t n)
{
    double dmax = 0, cmax = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)g[i] - c[i]);
        if (!(d <= dmax))
            dmax = d;
        if (fabs(c[i]) > cmax)
            cmax = fabs(c[i]);
    }
    return cmax > 0 ? dmax / cmax : dmax;
}

static int FAM = FAM_LLAMA;   /* the family the running test checks (its cmocka state) */

/* "family/what" for the families after the first (whose names stay as they were) */
static const char *fam_name(const char *what)
{
    static char buf[96];
    snprintf(buf, sizeof buf, "%s/%s", FAM_NAME[FAM], what);
    return buf;
}

static void check(const char *what, double err, double tol)
{
#if defined(AC_CUDA) && AC_CUDA
    const char *e = cu_backend_error(GPU);
    if (e[0])
        fail_msg("%s: CUDA error: %s", what, e);
#endif
    printf("CUDAMODEL %-38s %.3e %.0e\n", FAM == FAM_LLAMA ? what : fam_name(what), err, tol);
    if (!(err <= tol))
        fail_msg("%s %s: max relative error %.3e above %.0e", FAM_NAME[FAM], what, err, tol);
}

typedef struct {
    eng_model c, g;
    arch a;
} twins;

static void twins_init(twins *t)
{
    char err[256];
    make_arch(&t->a, FAM);
    if (eng_model_init(&t->c, &t->a, CPU, err, sizeof err) != 0)
        fail_msg("cpu model: %s", err);
    if (eng_model_init(&t->g, &t->a, GPU, err, sizeof err) != 0)
        fail_msg("cuda model: %s", err);
    eng_model_randomize(&t->c, 42, 0.2f);
    eng_model_randomize(&t->g, 42, 0.2f);
}

static void twins_free(twins *t)
{
    eng_model_free(&t->c);
    eng_model_free(&t->g);
    arch_free(&t->a);
}

static void tokens_fill(int *tok, int n, int V, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int)((seed >> 33) % (uint64_t)V);
    }
}

static void test_prefill_logits(void **state)
{
    FAM = *(const int *)*state;
    twins t;
    twins_init(&t);
    enum { B = 2, T = 19 };
    int V = t.a.vocab_size, tok[B * T], lens[B] = {19, 11};
    tokens_fill(tok, B * T, V, 7);
    float *lc = calloc((size_t)B * T * V, 4), *lg = calloc((size_t)B * T * V, 4);
    assert_non_null(lc);
    assert_non_null(lg);
    char err[256];
    eng_fwd_args a = {.tokens = tok, .B = B, .T = T, .lens = lens, .logits_mode = ENG_LOGITS_ALL, .logits = lc};
    assert_int_equal(eng_forward(&t.c, &a, err, sizeof err), 0);
    a.logits = lg;
    if (eng_forward(&t.g, &a, err, sizeof err) != 0)
        fail_msg("cuda forward: %s", err);
    /* compare valid rows only (padded rows are unspecified) */
    double e = 0;
    for (int b = 0; b < B; b++) {
        double eb = max_rel(lg + (size_t)b * T * V, lc + (size_t)b * T * V, (size_t)lens[b] * V);
        e = eb > e ? eb : e;
    }
    check("prefill_logits", e, TOL);
    free(lc);
    free(lg);
    twins_free(&t);
}

static void test_kv_decode(void **state)
{
    FAM = *(const int *)*state;
    twins t;
    twins_init(&t);
    /* a prefill over one scan chunk (ENG_SSM_CHUNK): the hybrid's GPU prefill takes the chunked
     * scan, and decode goes on from the state it leaves */
    enum { B = 2, P = 37, STEPS = 4 };
    int V = t.a.vocab_size, tok[B * P];
    tokens_fill(tok, B * P, V, 11);
    eng_kv_cache *kc = eng_kv_new(&t.c, B, 64), *kg = eng_kv_new(&t.g, B, 64);
    assert_non_null(kc);
    assert_non_null(kg);
    float *lc = calloc((size_t)B * V, 4), *lg = calloc((size_t)B * V, 4);
    assert_non_null(lc);
    assert_non_null(lg);
    char err[256];
    eng_fwd_args a = {.tokens = tok, .B = B, .T = P, .kv = kc, .logits_mode = ENG_LOGITS_LAST, .logits = lc};
    assert_int_equal(eng_forward(&t.c, &a, err, sizeof err), 0);
    a.kv = kg;
    a.logits = lg;
    if (eng_forward(&t.g, &a, err, sizeof err) != 0)
        fail_msg("cuda prefill: %s", err);
    check("kv_prefill_last_logits", max_rel(lg, lc, (size_t)B * V), TOL);
    for (int s = 0; s < STEPS; s++) {
        int next[B];
        for (int b = 0; b < B; b++)
            next[b] = eng_sample(lc + (size_t)b * V, V, 0.0f, 1.0f, NULL);
        eng_fwd_args d = {.tokens = next, .B = B, .T = 1, .kv = kc, .logits_mode = ENG_LOGITS_LAST, .logits = lc};
        assert_int_equal(eng_forward(&t.c, &d, err, sizeof err), 0);
        d.kv = kg;
        d.logits = lg;
        if (eng_forward(&t.g, &d, err, sizeof err) != 0)
            fail_msg("cuda decode: %s", err);
        char name[48];
        snprintf(name, sizeof name, "decode_step%d_logits", s);
        check(name, max_rel(lg, lc, (size_t)B * V), TOL);
    }
    assert_int_equal(eng_kv_len(kg, 0), P + STEPS);
    eng_kv_free(kc);
    eng_kv_free(kg);
    free(lc);
    free(lg);
    twins_free(&t);
}

/* Compare every weight gradient tensor, the mask gradients and the loss. */
static void compare_grads(twins *t, const char *tag)
{
    int n = eng_model_tensor_count(&t->c);
    size_t np = t->c.n_params;
    float *gc = malloc(np * 4), *gg = malloc(np * 4);
    assert_non_null(gc);
    assert_non_null(gg);
    CPU->to_host(CPU, gc, t->c.grads, np * 4);
    GPU->to_host(GPU, gg, t->g.grads, np * 4);
    char name[96];
    snprintf(name, sizeof name, "%s_weight_grads", tag);
    /* per tensor, so a small tensor's error is not hidden by a large one's scale */
    double worst = 0;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const char *tn;
        int64_t shape[2];
        int nd;
        float *dp;
        assert_int_equal(eng_model_tensor(&t->c, i, &tn, shape, &nd, &dp), 0);
        size_t cnt = (size_t)shape[0] * (size_t)(nd == 2 ? shape[1] : 1);
        off = (size_t)(dp - t->c.params);
        double e = max_rel(gg + off, gc + off, cnt);
        if (e > worst)
            worst = e;
        if (!(e <= TOL))
            printf("  grad %s: %.3e\n", tn, e);
    }
    check(name, worst, TOL);
    free(gc);
    free(gg);
    if (t->c.masks) {
        size_t cnt = t->c.masks->count;
        float *mc = malloc(cnt * 4), *mg = malloc(cnt * 4);
        assert_non_null(mc);
        assert_non_null(mg);
        CPU->to_host(CPU, mc, t->c.masks->grad_block, cnt * 4);
        GPU->to_host(GPU, mg, t->g.masks->grad_block, cnt * 4);
        snprintf(name, sizeof name, "%s_mask_grads", tag);
        check(name, max_rel(mg, mc, cnt), TOL);
        free(mc);
        free(mg);
        double hc = t->c.masks->g_hidden_count, hg = t->g.masks->g_hidden_count;
        snprintf(name, sizeof name, "%s_g_hidden_count", tag);
        check(name, fabs(hg - hc) / (fabs(hc) > 0 ? fabs(hc) : 1.0), TOL);
    }
}

static void test_train_step(void **state)
{
    FAM = *(const int *)*state;
    twins t, teacher;
    twins_init(&t);
    twins_init(&teacher);
    eng_model_randomize(&teacher.c, 99, 0.3f);
    eng_model_randomize(&teacher.g, 99, 0.3f);
    assert_int_equal(eng_model_enable_grads(&t.c), 0);
    assert_int_equal(eng_model_enable_grads(&t.g), 0);
    assert_int_equal(eng_model_enable_masks(&t.c), 0);
    assert_int_equal(eng_model_enable_masks(&t.g), 0);
    /* over one scan chunk (ENG_SSM_CHUNK): the hybrid's step runs the GPU's chunked scan both ways */
    enum { B = 2, T = 37 };
    int V = t.a.vocab_size, tok[B * T], tgt[B * T];
    tokens_fill(tok, B * T, V, 5);
    for (int i = 0; i < B * T; i++)
        tgt[i] = (i % T == T - 1) ? -1 : tok[i + 1];
    char err[256];
    eng_loss_result rc, rg;
    eng_model_zero_grads(&t.c);
    eng_model_zero_grads(&t.g);
    eng_loss_spec ce = {.kind = ENG_LOSS_CE, .targets = tgt};
    assert_int_equal(eng_forward_backward(&t.c, tok, B, T, &ce, ENG_GRAD_WEIGHTS | ENG_GRAD_MASKS, &rc, err, sizeof err), 0);
    if (eng_forward_backward(&t.g, tok, B, T, &ce, ENG_GRAD_WEIGHTS | ENG_GRAD_MASKS, &rg, err, sizeof err) != 0)
        fail_msg("cuda forward_backward: %s", err);
    check("ce_loss", fabs(rg.loss - rc.loss) / fabs(rc.loss), TOL);
    assert_int_equal(rg.tokens, rc.tokens);
    compare_grads(&t, "ce");

    eng_model_zero_grads(&t.c);
    eng_model_zero_grads(&t.g);
    eng_loss_spec kd = {.kind = ENG_LOSS_CE | ENG_LOSS_KD, .targets = tgt, .temperature = 2.0f, .kd_weight = 0.7f};
    kd.teacher = &teacher.c;
    assert_int_equal(eng_forward_backward(&t.c, tok, B, T, &kd, ENG_GRAD_WEIGHTS | ENG_GRAD_MASKS, &rc, err, sizeof err), 0);
    kd.teacher = &teacher.g;
    if (eng_forward_backward(&t.g, tok, B, T, &kd, ENG_GRAD_WEIGHTS | ENG_GRAD_MASKS, &rg, err, sizeof err) != 0)
        fail_msg("cuda forward_backward (kd): %s", err);
    check("kd_loss", fabs(rg.loss - rc.loss) / fabs(rc.loss), TOL);
    compare_grads(&t, "kd");

    eng_adamw *oc = eng_adamw_new(&t.c), *og = eng_adamw_new(&t.g);
    assert_non_null(oc);
    assert_non_null(og);
    double nc = eng_adamw_step(oc, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 0.5f);
    double ng = eng_adamw_step(og, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 0.5f);
    check("adamw_grad_norm", fabs(ng - nc) / nc, TOL);
    size_t np = t.c.n_params;
    float *pc = malloc(np * 4), *pg = malloc(np * 4);
    assert_non_null(pc);
    assert_non_null(pg);
    CPU->to_host(CPU, pc, t.c.params, np * 4);
    GPU->to_host(GPU, pg, t.g.params, np * 4);
    check("adamw_params", max_rel(pg, pc, np), TOL);
    free(pc);
    free(pg);
    eng_adamw_free(oc);
    eng_adamw_free(og);
    twins_free(&teacher);
    twins_free(&t);
}

static void test_no_leaks(void **state)
{
    (void)state;
    assert_int_equal(GPU->cur_bytes, 0);
    assert_int_equal(CPU->cur_bytes, 0);
}

int main(void)
{
    char err[256] = "";
    GPU = eng_backend_new("cuda:0", err, sizeof err);
    if (!GPU) {
        printf("SKIPPED: no CUDA device (%s)\n", err);
        return 0;
    }
    CPU = eng_backend_cpu_new(0);
    if (!CPU) {
        fprintf(stderr, "cpu backend: out of memory\n");
        return 1;
    }
    struct CMUnitTest tests[3 * N_FAM + 1];
    int n = 0;
    for (int f = 0; f < N_FAM; f++) {
        const struct CMUnitTest fam[3] = {
            cmocka_unit_test_prestate(test_prefill_logits, (void *)&FAM_ID[f]),
            cmocka_unit_test_prestate(test_kv_decode, (void *)&FAM_ID[f]),
            cmocka_unit_test_prestate(test_train_step, (void *)&FAM_ID[f]),
        };
        for (int i = 0; i < 3; i++) {
            tests[n] = fam[i];
            char *nm = malloc(64);
            assert_non_null(nm);
            snprintf(nm, 64, "%s_%s", fam[i].name, FAM_NAME[f]);
            tests[n++].name = nm;
        }
    }
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_no_leaks);
    int rc = _cmocka_run_group_tests("test_cuda_model", tests, (size_t)n, NULL, NULL);
    for (int i = 0; i < n - 1; i++)
        free((char *)tests[i].name);
    eng_backend_free(GPU);
    eng_backend_free(CPU);
    return rc;
}
