/* tests/unit/test_rank_perm.c — ranking on calibration tokens: the permuted parent
 * computes the same function (prefix permutation invariance); permutations sort by
 * score and keep query heads inside their KV group; the JSON artifact round-trips and
 * reapplies to the same weights; a prefix prune after ranking keeps the top-scored
 * units; the layer-skip scores (the layer, its attention, its MLP) equal the loss change
 * of actually removing it.
 * MoE (Qwen2-MoE): experts rank by routed output mass and move with their router rows;
 * pruning to the parent's own arch is the identity; expert pruning keeps the top experts;
 * each expert's units (and the shared expert's) rank by routed activation and move with
 * their rows and columns, and a student with narrower experts equals the ranked parent with
 * the cut units' down_proj columns zeroed; what cannot be cut from the parent is refused
 * with its field named.
 * LatentMoE (Nemotron-H): the latent's channels rank and move the same way, and a narrower
 * latent equals the ranked parent with the cut channels zeroed.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "compress/distill.h"
#include "compress/prune.h"
#include "compress/rank.h"

enum { V = 41, C = 24, D = 4, NL = 3, B = 2, T = 8 };

static void parent_arch(arch *a)
{
    assert_int_equal(arch_init(a, NL), 0);
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = V;
    a->hidden_size = C;
    a->head_dim = D;
    a->max_position_embeddings = 64;
    a->rope_theta = 10000.0;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = 0;
    int heads[NL] = {6, 4, 6}, kv[NL] = {2, 4, 3}, ffn[NL] = {20, 16, 12};
    for (int l = 0; l < NL; l++) {
        a->layers[l].source_layer = l;
        a->layers[l].n_heads = heads[l];
        a->layers[l].n_kv_heads = kv[l];
        a->layers[l].ffn_dim = ffn[l];
    }
}

static td_stream calib_stream(size_t n)
{
    td_stream s = {malloc(n * sizeof(int)), n};
    uint64_t x = 5;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        /* some structure: runs that repeat */
        s.ids[i] = (i % 5 == 0) ? 1 : (int)((x >> 33) % V);
    }
    return s;
}

static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void logits_of(eng_model *m, const int *tok, float *out)
{
    char err[256];
    eng_fwd_args fa = {.tokens = tok, .B = B, .T = T, .logits_mode = ENG_LOGITS_ALL, .logits = out};
    assert_int_equal(eng_forward(m, &fa, err, sizeof err), 0);
}

typedef struct {
    eng_backend *be;
    arch a;
    eng_model p;
    td_stream calib;
    rank_result r;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    char err[256];
    f->be = eng_backend_cpu_new(1);
    parent_arch(&f->a);
    if (eng_model_init(&f->p, &f->a, f->be, err, sizeof err))
        return -1;
    eng_model_randomize(&f->p, 3, 0.3f);
    f->calib = calib_stream(600);
    rank_opts o = {.tokens = 4 * B * T, .layer_tokens = 2 * B * T, .B = B, .T = T};
    if (rank_compute(&f->p, &f->calib, &o, &f->r, err, sizeof err)) {
        fprintf(stderr, "rank: %s\n", err);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    rank_free(&f->r);
    td_stream_free(&f->calib);
    eng_model_free(&f->p);
    arch_free(&f->a);
    eng_backend_free(f->be);
    free(f);
    return 0;
}

static void test_perms_sorted(void **state)
{
    fixture *f = *state;
    rank_result *r = &f->r;
    assert_int_equal(r->tokens, 4 * B * T);
    for (int i = 1; i < C; i++)
        assert_true(r->hidden_score[r->hidden_perm[i - 1]] >= r->hidden_score[r->hidden_perm[i]]);
    for (int l = 0; l < NL; l++) {
        rank_layer *L = &r->layers[l];
        for (int i = 1; i < L->ffn_dim; i++)
            assert_true(L->ffn_score[L->ffn_perm[i - 1]] >= L->ffn_score[L->ffn_perm[i]]);
        for (int g = 1; g < L->n_kv_heads; g++)
            assert_true(L->group_score[L->group_perm[g - 1]] >= L->group_score[L->group_perm[g]]);
        int grp = L->n_heads / L->n_kv_heads;
        for (int h = 0; h < L->n_heads; h++) {
            assert_int_equal(L->head_perm[h] / grp, L->group_perm[h / grp]);
            if (h % grp)
                assert_true(L->head_score[L->head_perm[h - 1]] >= L->head_score[L->head_perm[h]]);
        }
        /* scores are real activations: positive */
        assert_true(L->ffn_score[L->ffn_perm[0]] > 0);
        assert_true(L->head_score[L->head_perm[0]] > 0);
        assert_true(isfinite(L->skip_layer) && isfinite(L->skip_attn) && isfinite(L->skip_mlp));
    }
    assert_true(r->hidden_score[r->hidden_perm[0]] > 0);
    assert_true(r->base_loss > 0);
}

static void test_permuted_same_function(void **state)
{
    fixture *f = *state;
    char err[256];
    int tok[B * T];
    for (int i = 0; i < B * T; i++)
        tok[i] = f->calib.ids[100 + i];
    float *l0 = malloc(sizeof(float) * B * T * V), *l1 = malloc(sizeof(float) * B * T * V);
    logits_of(&f->p, tok, l0);
    eng_model q;
    /* a copy of the parent, permuted */
    assert_int_equal(prune_to_arch(&f->p, &f->a, &q, err, sizeof err), 0);
    assert_int_equal(rank_apply(&q, &f->r, err, sizeof err), 0);
    logits_of(&q, tok, l1);
    double e = rel_err(l1, l0, (size_t)B * T * V);
    printf("permuted parent vs parent: logits rel err %.3g\n", e);
    assert_true(e < 1e-5);
    /* the weights did move: the first FFN row of layer 0 is the top-ranked unit's */
    float *g0 = malloc(sizeof(float) * 20 * C), *g1 = malloc(sizeof(float) * 20 * C);
    assert_int_equal(eng_model_get_tensor(&f->p, "model.layers.0.mlp.gate_proj.weight", g0, 20 * C), 20 * C);
    assert_int_equal(eng_model_get_tensor(&q, "model.layers.0.mlp.gate_proj.weight", g1, 20 * C), 20 * C);
    int top = f->r.layers[0].ffn_perm[0], hc = f->r.hidden_perm[0];
    assert_true(g1[0] == g0[top * C + hc]);

    /* prefix prune of the ranked copy keeps the best half of layer 0's FFN */
    arch t;
    assert_int_equal(arch_copy(&t, &f->a), 0);
    t.layers[0].ffn_dim = 10;
    eng_model s;
    assert_int_equal(prune_to_arch(&q, &t, &s, err, sizeof err), 0);
    float *gs = malloc(sizeof(float) * 10 * C);
    assert_int_equal(eng_model_get_tensor(&s, "model.layers.0.mlp.gate_proj.weight", gs, 10 * C), 10 * C);
    for (int i = 0; i < 10; i++)
        for (int c = 0; c < C; c++)
            assert_true(gs[i * C + c] == g0[f->r.layers[0].ffn_perm[i] * C + f->r.hidden_perm[c]]);
    eng_model_free(&s);
    arch_free(&t);
    free(gs);
    free(g0);
    free(g1);
    free(l0);
    free(l1);
    eng_model_free(&q);
}

static void test_json_roundtrip(void **state)
{
    fixture *f = *state;
    char err[256], path[] = "/tmp/ac_rank_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(rank_save(&f->r, path, err, sizeof err), 0);
    rank_result r2;
    assert_int_equal(rank_load(path, &r2, err, sizeof err), 0);
    assert_int_equal(rank_check(&r2, &f->p, err, sizeof err), 0);
    assert_memory_equal(r2.hidden_perm, f->r.hidden_perm, C * sizeof(int));
    for (int l = 0; l < NL; l++) {
        assert_memory_equal(r2.layers[l].ffn_perm, f->r.layers[l].ffn_perm, f->a.layers[l].ffn_dim * sizeof(int));
        assert_memory_equal(r2.layers[l].head_perm, f->r.layers[l].head_perm, f->a.layers[l].n_heads * sizeof(int));
        assert_true(fabs(r2.layers[l].skip_layer - f->r.layers[l].skip_layer) < 1e-8);
    }
    /* the loaded ranking reorders a fresh copy to the very same weights */
    eng_model a1, a2;
    assert_int_equal(prune_to_arch(&f->p, &f->a, &a1, err, sizeof err), 0);
    assert_int_equal(prune_to_arch(&f->p, &f->a, &a2, err, sizeof err), 0);
    assert_int_equal(rank_apply(&a1, &f->r, err, sizeof err), 0);
    assert_int_equal(rank_apply(&a2, &r2, err, sizeof err), 0);
    float *h1 = malloc(a1.n_params * sizeof(float)), *h2 = malloc(a1.n_params * sizeof(float));
    f->be->to_host(f->be, h1, a1.params, a1.n_params * sizeof(float));
    f->be->to_host(f->be, h2, a2.params, a2.n_params * sizeof(float));
    assert_memory_equal(h1, h2, a1.n_params * sizeof(float));
    free(h1);
    free(h2);
    eng_model_free(&a1);
    eng_model_free(&a2);
    rank_free(&r2);
    /* a layer whose skip broke the model (an overflowing or NaN loss) is saved, and read
     * back in the same layer order: the old writer handed jansson the non-finite number and
     * the ranking could not be saved ("out of memory rendering the ranking") */
    int order[NL], order2[NL];
    double keep0 = f->r.layers[0].skip_layer, keep1 = f->r.layers[NL - 1].skip_layer;
    f->r.layers[0].skip_layer = INFINITY;
    f->r.layers[NL - 1].skip_layer = NAN;
    rank_layer_order(&f->r, order);
    assert_true((order[NL - 1] == 0 || order[NL - 1] == NL - 1) && (order[NL - 2] == 0 || order[NL - 2] == NL - 1));
    int saved = rank_save(&f->r, path, err, sizeof err);
    f->r.layers[0].skip_layer = keep0;
    f->r.layers[NL - 1].skip_layer = keep1;
    if (saved)
        fail_msg("rank_save: %s", err);
    if (rank_load(path, &r2, err, sizeof err))
        fail_msg("rank_load: %s", err);
    rank_layer_order(&r2, order2);
    assert_memory_equal(order, order2, sizeof order);
    rank_free(&r2);
    /* a text of 12 tokens ranks on one row of 11 (the shortest is RANK_MIN_SEQ + 1) */
    rank_opts ro;
    rank_opts_default(&ro);
    assert_int_equal(rank_opts_fit(&ro, 12, err, sizeof err), 0);
    assert_int_equal(ro.T, 11);
    assert_int_equal(ro.B, 1);
    rank_opts_default(&ro);
    assert_int_equal(rank_opts_fit(&ro, RANK_MIN_SEQ, err, sizeof err), -1);
    /* a broken permutation is refused */
    FILE *fp = fopen(path, "w");
    fputs("{\"version\":1,\"hidden_size\":2,\"hidden\":{\"score\":[1,2],\"perm\":[0,0]},\"layers\":[]}", fp);
    fclose(fp);
    assert_int_equal(rank_load(path, &r2, err, sizeof err), -1);
    assert_non_null(strstr(err, "permutation"));
    unlink(path);
}

static void test_layer_skip_matches_removal(void **state)
{
    fixture *f = *state;
    char err[256];
    for (int drop = 0; drop < NL; drop++) {
        arch t;
        assert_int_equal(arch_init(&t, NL - 1), 0);
        arch_layer *keep = t.layers;
        t = f->a;
        t.layers = keep;
        t.n_layers = NL - 1;
        for (int l = 0, k = 0; l < NL; l++)
            if (l != drop)
                t.layers[k++] = f->a.layers[l];
        eng_model s;
        assert_int_equal(prune_to_arch(&f->p, &t, &s, err, sizeof err), 0);
        double loss;
        assert_int_equal(distill_eval_loss(&s, &f->calib, B, T, f->r.layer_tokens, &loss, err, sizeof err), 0);
        double want = f->r.base_loss + f->r.layers[drop].skip_layer;
        printf("drop layer %d: pruned loss %.6f, base + skip score %.6f\n", drop, loss, want);
        assert_true(fabs(loss - want) < 1e-4 * (1 + fabs(want)));
        eng_model_free(&s);
        arch_free(&t);
    }
    /* the attention-only and MLP-only scores: the loss change of removing that block */
    for (int l = 0; l < NL; l++)
        for (int part = 0; part < 2; part++) {
            arch t;
            assert_int_equal(arch_copy(&t, &f->a), 0);
            if (part == 0)
                t.layers[l].n_heads = t.layers[l].n_kv_heads = 0;
            else
                t.layers[l].ffn_dim = 0;
            eng_model s;
            assert_int_equal(prune_to_arch(&f->p, &t, &s, err, sizeof err), 0);
            double loss;
            assert_int_equal(distill_eval_loss(&s, &f->calib, B, T, f->r.layer_tokens, &loss, err, sizeof err), 0);
            double want = f->r.base_loss + (part == 0 ? f->r.layers[l].skip_attn : f->r.layers[l].skip_mlp);
            printf("drop layer %d's %s: pruned loss %.6f, base + skip score %.6f\n", l, part ? "MLP" : "attention",
                   loss, want);
            assert_true(fabs(loss - want) < 1e-4 * (1 + fabs(want)));
            eng_model_free(&s);
            arch_free(&t);
        }
    double parent_loss;
    assert_int_equal(distill_eval_loss(&f->p, &f->calib, B, T, f->r.layer_tokens, &parent_loss, err, sizeof err), 0);
    assert_true(fabs(parent_loss - f->r.base_loss) < 1e-5 * (1 + parent_loss));
    int order[NL];
    rank_layer_order(&f->r, order);
    for (int i = 1; i < NL; i++)
        assert_true(f->r.layers[order[i - 1]].skip_layer <= f->r.layers[order[i]].skip_layer);
}

static void test_keep_kv(void **state)
{
    fixture *f = *state;
    char err[256];
    rank_opts o = {.tokens = B * T, .B = B, .T = T, .keep_kv = 1};
    rank_result r;
    assert_int_equal(rank_compute(&f->p, &f->calib, &o, &r, err, sizeof err), 0);
    assert_int_equal(r.layer_tokens, 0);
    for (int l = 0; l < NL; l++)
        for (int g = 0; g < r.layers[l].n_kv_heads; g++)
            assert_int_equal(r.layers[l].group_perm[g], g);
    rank_free(&r);
    /* too little calibration text is an error */
    td_stream tiny = {f->calib.ids, (size_t)T};
    assert_int_equal(rank_compute(&f->p, &tiny, &o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "calibration"));
}

/* FFN units in greedy OBS order: every layer's scores are the removal steps 0..F-1, the
 * permutation puts the last removed first, and the JSON keeps the order's name. */
static void test_ffn_obs(void **state)
{
    fixture *f = *state;
    char err[256];
    rank_opts o = {.tokens = B * T, .B = B, .T = T, .ffn_obs = 1, .obs_tokens = 512};
    rank_result r, back;
    if (rank_compute(&f->p, &f->calib, &o, &r, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(r.ffn_obs, 1);
    int differs = 0;
    for (int l = 0; l < NL; l++) {
        const rank_layer *L = &r.layers[l];
        int *seen = calloc((size_t)L->ffn_dim, sizeof *seen);
        for (int i = 0; i < L->ffn_dim; i++) {
            double st = L->ffn_score[i];
            assert_true(st >= 0 && st < L->ffn_dim && st == floor(st));
            seen[(int)st]++;
            assert_true(L->ffn_score[L->ffn_perm[i]] == L->ffn_dim - 1 - i);
            differs |= L->ffn_perm[i] != f->r.layers[l].ffn_perm[i];
        }
        for (int i = 0; i < L->ffn_dim; i++)
            assert_int_equal(seen[i], 1);
        free(seen);
    }
    assert_true(differs);   /* not the activation order */
    json_t *j = rank_to_json(&r);
    assert_string_equal(json_string_value(json_object_get(j, "ffn_order")), "obs");
    assert_int_equal(rank_from_json(j, &back, err, sizeof err), 0);
    assert_int_equal(back.ffn_obs, 1);
    json_decref(j);
    rank_free(&back);
    rank_free(&r);
}

/* Qwen2-MoE parent: MoE, dense, MoE (one with a shared expert). */
static void moe_arch(arch *a)
{
    parent_arch(a);
    snprintf(a->family, sizeof a->family, "qwen2_moe");
    a->attention_bias = 1;
    a->layers[0].ffn_dim = a->layers[2].ffn_dim = 0;
    a->layers[0].moe = (arch_moe){.n_experts = 6, .top_k = 2, .expert_ffn_dim = 8, .shared_ffn_dim = 10};
    a->layers[2].moe = (arch_moe){.n_experts = 5, .top_k = 2, .expert_ffn_dim = 6, .norm_topk = 1};
}

static void test_moe_experts(void **state)
{
    (void)state;
    char err[256];
    eng_backend *be = eng_backend_cpu_new(1);
    arch a;
    moe_arch(&a);
    eng_model p, q, s;
    assert_int_equal(eng_model_init(&p, &a, be, err, sizeof err), 0);
    eng_model_randomize(&p, 11, 0.3f);
    td_stream calib = calib_stream(600);
    rank_opts o = {.tokens = 4 * B * T, .layer_tokens = B * T, .B = B, .T = T};
    rank_result r;
    assert_int_equal(rank_compute(&p, &calib, &o, &r, err, sizeof err), 0);
    for (int l = 0; l < NL; l += 2) {
        rank_layer *L = &r.layers[l];
        assert_int_equal(L->n_experts, a.layers[l].moe.n_experts);
        double share = 0;
        for (int i = 0; i < L->n_experts; i++) {
            share += L->expert_share[i];
            if (i)
                assert_true(L->expert_score[L->expert_perm[i - 1]] >= L->expert_score[L->expert_perm[i]]);
        }
        assert_true(fabs(share - 1) < 1e-9);   /* every token fills top_k slots */
        assert_true(L->expert_score[L->expert_perm[0]] > 0);
    }
    int tok[B * T];
    for (int i = 0; i < B * T; i++)
        tok[i] = calib.ids[50 + i];
    float *l0 = malloc(sizeof(float) * B * T * V), *l1 = malloc(sizeof(float) * B * T * V);
    logits_of(&p, tok, l0);
    /* pruning to the parent's own arch is the identity */
    assert_int_equal(prune_to_arch(&p, &a, &q, err, sizeof err), 0);
    logits_of(&q, tok, l1);
    assert_memory_equal(l0, l1, sizeof(float) * B * T * V);
    /* the ranked copy computes the same function; the router's first row is the top expert's */
    assert_int_equal(rank_apply(&q, &r, err, sizeof err), 0);
    logits_of(&q, tok, l1);
    double e = rel_err(l1, l0, (size_t)B * T * V);
    printf("MoE permuted parent vs parent: logits rel err %.3g\n", e);
    assert_true(e < 1e-5);
    float r0[6 * C], r1[6 * C];
    assert_int_equal(eng_model_get_tensor(&p, "model.layers.0.mlp.gate.weight", r0, 6 * C), 6 * C);
    assert_int_equal(eng_model_get_tensor(&q, "model.layers.0.mlp.gate.weight", r1, 6 * C), 6 * C);
    for (int i = 0; i < 6; i++)
        assert_true(r1[i * C] == r0[r.layers[0].expert_perm[i] * C + r.hidden_perm[0]]);
    /* keep the top 3 experts of layer 0, top-1 routing in layer 2 of 2 experts */
    arch t;
    assert_int_equal(arch_copy(&t, &a), 0);
    t.layers[0].moe.n_experts = 3;
    t.layers[2].moe.n_experts = 2;
    t.layers[2].moe.top_k = 1;
    assert_int_equal(prune_to_arch(&q, &t, &s, err, sizeof err), 0);
    float x0[8 * C], x1[8 * C];
    int top = r.layers[0].expert_perm[1];
    char name[96];
    snprintf(name, sizeof name, "model.layers.0.mlp.experts.%d.up_proj.weight", top);
    assert_int_equal(eng_model_get_tensor(&p, name, x0, 8 * C), 8 * C);
    assert_int_equal(eng_model_get_tensor(&s, "model.layers.0.mlp.experts.1.up_proj.weight", x1, 8 * C), 8 * C);
    assert_true(x1[0] == x0[r.layers[0].unit_perm[top * 8] * C + r.hidden_perm[0]]);   /* its best unit first */
    assert_int_equal(eng_model_get_tensor(&s, "model.layers.0.mlp.experts.3.up_proj.weight", x1, 8 * C), -1);
    eng_model_free(&s);
    /* the ranking's JSON keeps the experts */
    json_t *j = rank_to_json(&r);
    rank_result r2;
    assert_int_equal(rank_from_json(j, &r2, err, sizeof err), 0);
    json_decref(j);
    assert_memory_equal(r2.layers[2].expert_perm, r.layers[2].expert_perm, 5 * sizeof(int));
    rank_free(&r2);
    /* refused: more experts, a larger top-k, other expert widths */
    t.layers[2].moe.n_experts = 6;
    assert_int_equal(prune_check(&a, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "layers[2].moe.n_experts"));
    t.layers[2].moe.n_experts = 5;
    t.layers[0].moe.top_k = 3;
    assert_int_equal(prune_check(&a, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "top_k"));
    t.layers[0].moe.top_k = 2;
    t.layers[0].moe.expert_ffn_dim = 9;
    assert_int_equal(prune_check(&a, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "layers[0].moe.expert_ffn_dim"));
    t.layers[0].moe.expert_ffn_dim = 8;
    t.layers[0].moe.shared_ffn_dim = 0;
    assert_int_equal(prune_check(&a, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "layers[0].moe.shared_ffn_dim"));
    arch_free(&t);
    rank_free(&r);
    free(l0);
    free(l1);
    eng_model_free(&q);
    eng_model_free(&p);
    td_stream_free(&calib);
    arch_free(&a);
    eng_backend_free(be);
}

/* Zero, in m (CPU backend: host memory), the down_proj columns of every unit at or past the
 * kept widths: layer 0's experts keep we0 units and its shared expert ws0, layer 2's we2. */
static void zero_cut_units(eng_model *m, int we0, int ws0, int we2)
{
    for (int i = 0; i < eng_model_tensor_count(m); i++) {
        const char *name;
        int64_t shape[2];
        int nd, layer, keep = -1;
        float *w;
        assert_int_equal(eng_model_tensor(m, i, &name, shape, &nd, &w), 0);
        if (sscanf(name, "model.layers.%d.", &layer) != 1 || !strstr(name, "down_proj"))
            continue;
        if (strstr(name, "mlp.experts."))
            keep = layer == 0 ? we0 : we2;
        else if (strstr(name, "shared_expert."))
            keep = ws0;
        for (int64_t r = 0; keep >= 0 && r < shape[0]; r++)
            for (int64_t c = keep; c < shape[1]; c++)
                w[r * shape[1] + c] = 0.0f;
    }
}

/* A parent of arch_fn's shape with random weights (seed), ranked on the calibration stream,
 * and its ranked copy q, which must compute the same function (f->e: the logits' relative
 * error on B x T tokens of the stream from tok_at, l0 the parent's logits, l1 q's). */
typedef struct {
    eng_backend *be;
    arch a;
    eng_model p, q;
    td_stream calib;
    rank_result r;
    int tok[B * T];
    float *l0, *l1;
    double e;
} ranked_fix;

static void ranked_open(ranked_fix *f, void (*arch_fn)(arch *), uint64_t seed, int tok_at)
{
    char err[256];
    f->be = eng_backend_cpu_new(1);
    arch_fn(&f->a);
    if (arch_validate(&f->a, err, sizeof err))
        fail_msg("arch: %s", err);
    assert_int_equal(eng_model_init(&f->p, &f->a, f->be, err, sizeof err), 0);
    eng_model_randomize(&f->p, seed, 0.3f);
    f->calib = calib_stream(600);
    rank_opts o = {.tokens = 4 * B * T, .B = B, .T = T};
    assert_int_equal(rank_compute(&f->p, &f->calib, &o, &f->r, err, sizeof err), 0);
    for (int i = 0; i < B * T; i++)
        f->tok[i] = f->calib.ids[tok_at + i];
    f->l0 = malloc(sizeof(float) * B * T * V);
    f->l1 = malloc(sizeof(float) * B * T * V);
    assert_true(f->l0 && f->l1);
    logits_of(&f->p, f->tok, f->l0);
    assert_int_equal(prune_to_arch(&f->p, &f->a, &f->q, err, sizeof err), 0);
    assert_int_equal(rank_apply(&f->q, &f->r, err, sizeof err), 0);
    logits_of(&f->q, f->tok, f->l1);
    f->e = rel_err(f->l1, f->l0, (size_t)B * T * V);
    assert_true(f->e < 1e-5);
}

static void ranked_close(ranked_fix *f)
{
    rank_free(&f->r);
    free(f->l0);
    free(f->l1);
    eng_model_free(&f->q);
    eng_model_free(&f->p);
    td_stream_free(&f->calib);
    arch_free(&f->a);
    eng_backend_free(f->be);
}

static void test_moe_expert_units(void **state)
{
    (void)state;
    char err[256];
    ranked_fix f;
    ranked_open(&f, moe_arch, 12, 70);   /* the ranked parent computes the same function */
    eng_model *p = &f.p, *q = &f.q, s;
    rank_result *r = &f.r;
    rank_layer *L0 = &r->layers[0], *L2 = &r->layers[2];
    assert_int_equal(L0->expert_ffn, 8);
    assert_int_equal(L0->shared_ffn, 10);
    assert_int_equal(L2->expert_ffn, 6);
    assert_int_equal(L2->shared_ffn, 0);
    for (int x = 0; x < 6; x++) {   /* each expert's units by falling score, each a permutation */
        const int *pu = L0->unit_perm + x * 8;
        const double *su = L0->unit_score + x * 8;
        int seen = 0;
        for (int u = 0; u < 8; u++) {
            seen |= 1 << pu[u];
            if (u)
                assert_true(su[pu[u - 1]] >= su[pu[u]]);
        }
        assert_int_equal(seen, 0xff);
        assert_true(su[pu[0]] > 0);   /* every expert is routed some tokens here */
    }
    for (int u = 1; u < 10; u++)
        assert_true(L0->shared_score[L0->shared_perm[u - 1]] >= L0->shared_score[L0->shared_perm[u]]);
    assert_true(L0->shared_score[L0->shared_perm[0]] > 0);
    /* each expert's first unit its best */
    float x0[8 * C], x1[8 * C];
    char name[96];
    int top = L0->expert_perm[0];
    snprintf(name, sizeof name, "model.layers.0.mlp.experts.%d.up_proj.weight", top);
    assert_int_equal(eng_model_get_tensor(p, name, x0, 8 * C), 8 * C);
    assert_int_equal(eng_model_get_tensor(q, "model.layers.0.mlp.experts.0.up_proj.weight", x1, 8 * C), 8 * C);
    for (int u = 0; u < 8; u++)
        assert_true(x1[u * C] == x0[L0->unit_perm[top * 8 + u] * C + r->hidden_perm[0]]);
    float s0[10 * C], s1[10 * C];
    assert_int_equal(eng_model_get_tensor(p, "model.layers.0.mlp.shared_expert.up_proj.weight", s0, 10 * C), 10 * C);
    assert_int_equal(eng_model_get_tensor(q, "model.layers.0.mlp.shared_expert.up_proj.weight", s1, 10 * C), 10 * C);
    assert_true(s1[0] == s0[L0->shared_perm[0] * C + r->hidden_perm[0]]);
    /* narrower experts (and shared expert) = the ranked parent with the cut units zeroed */
    arch t;
    assert_int_equal(arch_copy(&t, &f.a), 0);
    t.layers[0].moe.expert_ffn_dim = 5;
    t.layers[0].moe.shared_ffn_dim = 6;
    t.layers[2].moe.expert_ffn_dim = 3;
    assert_int_equal(prune_to_arch(q, &t, &s, err, sizeof err), 0);
    assert_int_equal(eng_model_get_tensor(&s, "model.layers.0.mlp.experts.0.up_proj.weight", x0, 8 * C), 5 * C);
    assert_memory_equal(x0, x1, sizeof(float) * 5 * C);   /* its best five units */
    logits_of(&s, f.tok, f.l0);
    zero_cut_units(q, 5, 6, 3);
    logits_of(q, f.tok, f.l1);
    double e = rel_err(f.l0, f.l1, (size_t)B * T * V);
    printf("narrower experts vs the parent with cut units zeroed: logits rel err %.3g\n", e);
    assert_true(e < 1e-5);
    eng_model_free(&s);
    /* the ranking's JSON keeps every order; one without expert units asks for a new ranking */
    json_t *j = rank_to_json(r);
    rank_result r2;
    assert_int_equal(rank_from_json(j, &r2, err, sizeof err), 0);
    assert_memory_equal(r2.layers[0].unit_perm, L0->unit_perm, 6 * 8 * sizeof(int));
    assert_memory_equal(r2.layers[2].unit_perm, L2->unit_perm, 5 * 6 * sizeof(int));
    assert_memory_equal(r2.layers[0].shared_perm, L0->shared_perm, 10 * sizeof(int));
    assert_int_equal(rank_check(&r2, p, err, sizeof err), 0);
    rank_free(&r2);
    json_t *ex = json_object_get(json_array_get(json_object_get(j, "layers"), 0), "experts");
    json_object_del(ex, "expert_ffn_dim");
    json_object_del(ex, "units");
    assert_int_equal(rank_from_json(j, &r2, err, sizeof err), 0);
    assert_int_equal(rank_check(&r2, p, err, sizeof err), -1);
    assert_non_null(strstr(err, "rank the parent again"));
    rank_free(&r2);
    json_decref(j);
    arch_free(&t);
    ranked_close(&f);
}

/* A Nemotron-H parent whose layer 2 is a LatentMoE (4 experts of 6 in a latent of 10, a shared
 * expert of 5), between Mamba mixers and attention. */
static void latent_arch(arch *a)
{
    parent_arch(a);
    arch_free(a);
    assert_int_equal(arch_init(a, 4), 0);
    snprintf(a->family, sizeof a->family, "nemotron_h");
    a->vocab_size = V;
    a->hidden_size = C;
    a->head_dim = 8;
    a->max_position_embeddings = 64;
    a->rope_theta = 10000.0;
    a->norm_eps = 1e-5;
    a->layers[0] = (arch_layer){.source_layer = 0, .mamba = {4, 6, 5, 2, 4}};
    a->layers[1] = (arch_layer){.source_layer = 1, .n_heads = 3, .n_kv_heads = 3};
    a->layers[2] = (arch_layer){.source_layer = 2, .moe = {.n_experts = 4, .top_k = 2, .expert_ffn_dim = 6,
                                .shared_ffn_dim = 5, .norm_topk = 1, .sigmoid = 1, .n_group = 1, .topk_group = 1,
                                .routed_scale = 2.5, .latent_dim = 10}};
    a->layers[3] = (arch_layer){.source_layer = 3, .mamba = {6, 2, 3, 3, 3}};
}

/* Zero, in m (CPU backend: host memory), the latent channels at or past `keep` of layer 2:
 * fc1_latent_proj's rows (the experts read 0 there) and fc2_latent_proj's columns (what they
 * write there is dropped). */
static void zero_cut_latent(eng_model *m, int keep)
{
    for (int i = 0; i < eng_model_tensor_count(m); i++) {
        const char *name;
        int64_t shape[2];
        int nd;
        float *w;
        assert_int_equal(eng_model_tensor(m, i, &name, shape, &nd, &w), 0);
        int in = !strcmp(name, "backbone.layers.2.mixer.fc1_latent_proj.weight");
        if (!in && strcmp(name, "backbone.layers.2.mixer.fc2_latent_proj.weight"))
            continue;
        for (int64_t r = 0; r < shape[0]; r++)
            for (int64_t c = 0; c < shape[1]; c++)
                if ((in ? r : c) >= keep)
                    w[r * shape[1] + c] = 0.0f;
    }
}

/* A LatentMoE's latent channels rank by their share of the experts' latent input plus their
 * share of the experts' weighted latent output, move with fc1's rows, the experts' up_proj
 * columns and down_proj rows and fc2's columns (the permuted parent computes the same
 * function), and a student with a narrower latent equals the ranked parent with the cut
 * channels zeroed on both sides; the JSON keeps the order; a ranking without it is refused,
 * and so are a wider latent and none. */
static void test_latent_channels(void **state)
{
    (void)state;
    char err[256];
    ranked_fix f;
    ranked_open(&f, latent_arch, 17, 50);
    printf("LatentMoE permuted parent vs parent: logits rel err %.3g\n", f.e);
    eng_model *p = &f.p, *q = &f.q, s;
    const rank_result *r = &f.r;
    const arch *a = &f.a;
    const rank_layer *L = &r->layers[2];
    assert_int_equal(L->latent, 10);
    double sum = 0;
    for (int j = 0; j < 10; j++) {
        sum += L->latent_score[j];
        if (j)
            assert_true(L->latent_score[L->latent_perm[j - 1]] >= L->latent_score[L->latent_perm[j]]);
    }
    assert_true(fabs(sum - 2) < 1e-9);   /* a share of each side */
    assert_true(L->latent_perm[0] != 0 || L->latent_perm[1] != 1);   /* random weights: not the identity */
    float f0[10 * C], f1[10 * C];
    const char *fc1 = "backbone.layers.2.mixer.fc1_latent_proj.weight";
    assert_int_equal(eng_model_get_tensor(p, fc1, f0, 10 * C), 10 * C);
    assert_int_equal(eng_model_get_tensor(q, fc1, f1, 10 * C), 10 * C);
    for (int j = 0; j < 10; j++)   /* row j of the ranked fc1 is the parent's row latent_perm[j] */
        assert_true(f1[j * C] == f0[L->latent_perm[j] * C + r->hidden_perm[0]]);
    /* a latent of 6: the ranked parent with channels 6.. zeroed on both sides */
    arch t;
    assert_int_equal(arch_copy(&t, a), 0);
    t.layers[2].moe.latent_dim = 6;
    assert_int_equal(prune_to_arch(q, &t, &s, err, sizeof err), 0);
    float *l2 = malloc(sizeof(float) * B * T * V);
    logits_of(&s, f.tok, f.l1);
    zero_cut_latent(q, 6);
    logits_of(q, f.tok, l2);
    double e = rel_err(f.l1, l2, (size_t)B * T * V);
    printf("latent 10 -> 6 vs the ranked parent with the cut channels zeroed: logits rel err %.3g\n", e);
    assert_true(e < 1e-5 && rel_err(f.l1, f.l0, (size_t)B * T * V) > 1e-3);
    float x0[6 * 10], x1[6 * 6];
    assert_int_equal(eng_model_get_tensor(q, "backbone.layers.2.mixer.experts.1.up_proj.weight", x0, 60), 60);
    assert_int_equal(eng_model_get_tensor(&s, "backbone.layers.2.mixer.experts.1.up_proj.weight", x1, 36), 36);
    for (int u = 0; u < 6; u++)
        for (int j = 0; j < 6; j++)
            assert_true(x1[u * 6 + j] == x0[u * 10 + j]);
    eng_model_free(&s);
    /* the ranking's JSON keeps the latent's order; one without it asks for a new ranking */
    json_t *j = rank_to_json(r);
    rank_result r2;
    assert_int_equal(rank_from_json(j, &r2, err, sizeof err), 0);
    assert_memory_equal(r2.layers[2].latent_perm, L->latent_perm, 10 * sizeof(int));
    assert_int_equal(rank_check(&r2, p, err, sizeof err), 0);
    rank_free(&r2);
    json_t *ex = json_object_get(json_array_get(json_object_get(j, "layers"), 2), "experts");
    assert_int_equal(json_object_del(ex, "latent_dim") | json_object_del(ex, "latent"), 0);
    assert_int_equal(rank_from_json(j, &r2, err, sizeof err), 0);
    assert_int_equal(rank_check(&r2, p, err, sizeof err), -1);
    assert_non_null(strstr(err, "rank the parent again"));
    rank_free(&r2);
    json_decref(j);
    /* refused: a wider latent, none */
    t.layers[2].moe.latent_dim = 11;
    assert_int_equal(prune_check(a, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "layers[2].moe.latent_dim"));
    t.layers[2].moe.latent_dim = 0;
    assert_int_equal(prune_check(a, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "layers[2].moe.latent_dim"));
    arch_free(&t);
    free(l2);
    ranked_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_perms_sorted),
        cmocka_unit_test(test_permuted_same_function),
        cmocka_unit_test(test_json_roundtrip),
        cmocka_unit_test(test_layer_skip_matches_removal),
        cmocka_unit_test(test_keep_kv),
        cmocka_unit_test(test_ffn_obs),
        cmocka_unit_test(test_moe_experts),
        cmocka_unit_test(test_moe_expert_units),
        cmocka_unit_test(test_latent_channels),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
