/* tests/unit/test_prune_slice.c — pruning is exact slicing: pruning to the parent's own
 * arch reproduces its logits, and reconstruction leaves such a student bit-identical; pruning to a smaller heterogeneous arch (narrower hidden,
 * fewer KV groups, fewer query heads per group, narrower FFN, a removed layer, removed
 * attention / MLP) computes exactly what the parent computes with the matching masks;
 * targets the parent cannot yield are clear errors naming the field; a pruned model
 * directory saves and loads back bit-exact (config.json only for uniform archs).
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

#include "compress/prune.h"
#include "compress/reconstruct.h"

enum { V = 37, C = 24, D = 4, NL = 3, B = 2, T = 7 };

static void parent_arch(arch *a, int tie, int bias)
{
    assert_int_equal(arch_init(a, NL), 0);
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = V;
    a->hidden_size = C;
    a->head_dim = D;
    a->max_position_embeddings = 64;
    a->rope_theta = 10000.0;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = tie;
    a->attention_bias = bias;
    int heads[NL] = {6, 4, 6}, kv[NL] = {2, 4, 3}, ffn[NL] = {20, 16, 12};
    for (int l = 0; l < NL; l++) {
        a->layers[l].source_layer = l;
        a->layers[l].n_heads = heads[l];
        a->layers[l].n_kv_heads = kv[l];
        a->layers[l].ffn_dim = ffn[l];
    }
}

static void make_tokens(int *tok)
{
    uint64_t s = 99;
    for (int i = 0; i < B * T; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int)((s >> 33) % V);
    }
}

static void logits_of(eng_model *m, const int *tok, float *out)
{
    char err[256];
    eng_fwd_args fa = {.tokens = tok, .B = B, .T = T, .logits_mode = ENG_LOGITS_ALL, .logits = out};
    int rc = eng_forward(m, &fa, err, sizeof err);
    if (rc)
        fprintf(stderr, "forward: %s\n", err);
    assert_int_equal(rc, 0);
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

static void identity_case(int tie, int bias)
{
    eng_backend *be = eng_backend_cpu_new(1);
    assert_non_null(be);
    arch a;
    parent_arch(&a, tie, bias);
    eng_model p, q;
    char err[256];
    assert_int_equal(eng_model_init(&p, &a, be, err, sizeof err), 0);
    eng_model_randomize(&p, 7, 0.2f);
    assert_int_equal(prune_to_arch(&p, &a, &q, err, sizeof err), 0);
    assert_int_equal(q.n_params, p.n_params);
    int tok[B * T];
    make_tokens(tok);
    float *lp = malloc(sizeof(float) * B * T * V), *lq = malloc(sizeof(float) * B * T * V);
    logits_of(&p, tok, lp);
    logits_of(&q, tok, lq);
    double e = rel_err(lq, lp, (size_t)B * T * V);
    printf("identity prune (tie %d, bias %d): logits rel err %.3g\n", tie, bias, e);
    assert_true(e < 1e-6);
    /* nothing pruned, nothing refit: the same logits to the bit */
    td_stream cal = {malloc(sizeof(int) * 96), 96};
    for (int i = 0; i < 96; i++)
        cal.ids[i] = (i * 7 + 3) % V;
    recon_opts ro;
    recon_opts_default(&ro);
    ro.T = 16;
    recon_result rr;
    assert_int_equal(recon_run(&p, &q, &cal, &ro, &rr, err, sizeof err), 0);
    assert_int_equal(rr.n, 2 * NL);
    for (int i = 0; i < rr.n; i++)
        assert_true(!rr.p[i].pruned && !rr.p[i].refit && rr.p[i].err_after == rr.p[i].err_before);
    float *lr = malloc(sizeof(float) * B * T * V);
    logits_of(&q, tok, lr);
    assert_memory_equal(lr, lq, sizeof(float) * B * T * V);
    free(lr);
    /* an error that overflowed is reported (null), not dropped from the report with the
     * projections after it (the old writer's json_pack refused it) */
    rr.p[0].err_before = NAN;
    rr.p[1].err_after = INFINITY;
    json_t *rj = recon_result_json(&rr, &ro);
    assert_non_null(rj);
    json_t *pj = json_object_get(rj, "projections");
    assert_int_equal(json_array_size(pj), rr.n);
    assert_true(json_is_null(json_object_get(json_array_get(pj, 0), "error_before")));
    assert_true(json_is_null(json_object_get(json_array_get(pj, 1), "error_after")));
    json_decref(rj);
    recon_result_free(&rr);
    td_stream_free(&cal);
    free(lp);
    free(lq);
    eng_model_free(&q);
    eng_model_free(&p);
    arch_free(&a);
    eng_backend_free(be);
}

static void test_identity(void **state)
{
    (void)state;
    identity_case(0, 0);
    identity_case(1, 0);
    identity_case(0, 1);
}

static void set_floats(eng_model *m, float *dev, int n, int keep)
{
    float *h = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int i = 0; i < n; i++)
        h[i] = i < keep ? 1.0f : 0.0f;
    m->be->to_device(m->be, dev, h, sizeof(float) * (size_t)n);
    free(h);
}

/* The pruned model equals the parent under prefix masks, its RMSNorms still dividing by the
 * parent's C (the search's masked model): pruning scales the norm gains by sqrt(C/C'). */
static void test_prune_equals_masks(void **state)
{
    (void)state;
    eng_backend *be = eng_backend_cpu_new(1);
    arch a, t;
    parent_arch(&a, 0, 1);
    a.norm_eps = 1e-12;   /* eps is added to the mean square, which the two divide by different counts */
    char err[256];
    assert_int_equal(arch_copy(&t, &a), 0);
    t.hidden_size = 16;
    t.n_layers = 2;
    /* layer 0: one of two KV groups, one of three query heads per group kept */
    t.layers[0] = (arch_layer){.source_layer = 0, .n_heads = 1, .n_kv_heads = 1, .ffn_dim = 11};
    /* parent layer 1 removed; layer 2: two of three groups, MLP removed */
    t.layers[1] = (arch_layer){.source_layer = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 0};
    eng_model p, q;
    assert_int_equal(eng_model_init(&p, &a, be, err, sizeof err), 0);
    eng_model_randomize(&p, 11, 0.3f);
    int rc = prune_to_arch(&p, &t, &q, err, sizeof err);
    if (rc)
        fprintf(stderr, "prune: %s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(q.n_params, (size_t)arch_params(&t));

    assert_int_equal(eng_model_enable_masks(&p), 0);
    eng_masks *mk = p.masks;
    set_floats(&p, mk->hidden, C, 16);
    /* layer 0: query heads 0 (group 0) kept; group 1 (heads 3..5) and heads 1,2 off */
    set_floats(&p, mk->head[0], 6, 1);
    set_floats(&p, mk->ffn[0], 20, 11);
    set_floats(&p, mk->attn_gate + 1, 1, 0);
    set_floats(&p, mk->mlp_gate + 1, 1, 0);
    set_floats(&p, mk->head[2], 6, 4);
    set_floats(&p, mk->mlp_gate + 2, 1, 0);

    int tok[B * T];
    make_tokens(tok);
    float *lp = malloc(sizeof(float) * B * T * V), *lq = malloc(sizeof(float) * B * T * V);
    logits_of(&p, tok, lp);
    logits_of(&q, tok, lq);
    double e = rel_err(lq, lp, (size_t)B * T * V);
    printf("pruned vs masked parent: logits rel err %.3g\n", e);
    assert_true(e < 1e-5);
    /* and the masks matter: the unmasked parent differs */
    set_floats(&p, mk->block, (int)mk->count, (int)mk->count);
    logits_of(&p, tok, lp);
    assert_true(rel_err(lq, lp, (size_t)B * T * V) > 1e-3);
    free(lp);
    free(lq);
    eng_model_free(&q);
    eng_model_free(&p);
    arch_free(&t);
    arch_free(&a);
    eng_backend_free(be);
}

static void expect_error(const arch *a, const arch *t, const char *needle)
{
    char err[256] = "";
    assert_int_equal(prune_check(a, t, err, sizeof err), -1);
    if (!strstr(err, needle))
        fprintf(stderr, "error \"%s\" lacks \"%s\"\n", err, needle);
    assert_non_null(strstr(err, needle));
}

/* A Llama-3 parent read from a GGUF holds its llama3 RoPE scaling as fitted back from the
 * f32 factors of rope_freqs.weight; a target arch written from the HF config holds the
 * exact decimals (32, 1, 4, 8192). They are the same scaling: prune_check takes the target
 * (the old byte comparison refused it), and arch_equal does not depend on the structs'
 * padding bytes. */
static void test_rope_scaling_fitted(void **state)
{
    (void)state;
    arch a, t;
    parent_arch(&a, 0, 0);
    a.rope_theta = 500000;
    a.rope_scaling = (arch_rope_scaling){.type = ROPE_SCALING_LLAMA3, .factor = 32, .low_freq_factor = 1,
                                         .high_freq_factor = 4, .original_max_position_embeddings = 8192};
    assert_int_equal(arch_copy(&t, &a), 0);
    double r[256];
    float rf[256];
    arch_rope_factors(&a, r);
    for (int i = 0; i < a.head_dim / 2; i++)
        rf[i] = (float)r[i];
    char err[256];
    assert_int_equal(arch_rope_fit_llama3(&a, rf, err, sizeof err), 0);
    if (prune_check(&a, &t, err, sizeof err))
        fail_msg("prune_check: %s (fitted %.9g %.9g %.9g %d)", err, a.rope_scaling.factor,
                 a.rope_scaling.low_freq_factor, a.rope_scaling.high_freq_factor,
                 a.rope_scaling.original_max_position_embeddings);
    t.rope_scaling.factor = 16;
    expect_error(&a, &t, "rope_scaling");
    /* padding: one arch's scaling and experts built over 0xAA bytes, the other's over zeros */
    arch_rope_scaling x, y;
    memset(&x, 0xAA, sizeof x);
    memset(&y, 0, sizeof y);
    x.type = y.type = ROPE_SCALING_LINEAR;
    x.factor = y.factor = 2;
    x.low_freq_factor = y.low_freq_factor = x.high_freq_factor = y.high_freq_factor = 0;
    x.original_max_position_embeddings = y.original_max_position_embeddings = 0;
    arch_free(&t);
    assert_int_equal(arch_copy(&t, &a), 0);
    a.rope_scaling = x;
    t.rope_scaling = y;
    arch_moe *m = &a.layers[0].moe;
    memset(m, 0xAA, sizeof *m);
    m->n_experts = m->top_k = m->expert_ffn_dim = m->shared_ffn_dim = m->norm_topk = 0;
    m->sigmoid = m->n_group = m->topk_group = m->latent_dim = 0;
    m->routed_scale = 0;
    assert_true(arch_equal(&a, &t));
    arch_free(&t);
    arch_free(&a);
}

static void test_errors(void **state)
{
    (void)state;
    arch a, t;
    parent_arch(&a, 0, 0);
    char err[256];
    assert_int_equal(prune_check(&a, &a, err, sizeof err), 0);

    assert_int_equal(arch_copy(&t, &a), 0);
    t.hidden_size = C + 8;
    expect_error(&a, &t, "hidden_size");
    arch_free(&t);

    assert_int_equal(arch_copy(&t, &a), 0);
    t.layers[1].ffn_dim = 17;
    expect_error(&a, &t, "layers[1].ffn_dim");
    arch_free(&t);

    assert_int_equal(arch_copy(&t, &a), 0);
    t.layers[0].n_kv_heads = 3;   /* parent has 2 */
    t.layers[0].n_heads = 3;
    expect_error(&a, &t, "layers[0].n_kv_heads");
    arch_free(&t);

    assert_int_equal(arch_copy(&t, &a), 0);
    t.layers[1].n_heads = 8;       /* 2 per KV head with 4 KV heads; parent has 1 per KV head */
    expect_error(&a, &t, "query heads per KV head");
    arch_free(&t);

    assert_int_equal(arch_copy(&t, &a), 0);
    t.layers[2].source_layer = 5;
    expect_error(&a, &t, "layers[2].source_layer");
    arch_free(&t);

    assert_int_equal(arch_copy(&t, &a), 0);
    t.layers[2].source_layer = 1;
    expect_error(&a, &t, "must increase");
    arch_free(&t);

    assert_int_equal(arch_copy(&t, &a), 0);
    t.vocab_size = V + 1;
    expect_error(&a, &t, "vocab_size");
    arch_free(&t);

    assert_int_equal(arch_copy(&t, &a), 0);
    t.head_dim = 2;
    expect_error(&a, &t, "head_dim");
    arch_free(&t);

    /* attention kept where the parent has none */
    arch p2;
    assert_int_equal(arch_copy(&p2, &a), 0);
    p2.layers[1].n_heads = 0;
    p2.layers[1].n_kv_heads = 0;
    expect_error(&p2, &a, "has no attention");
    arch_free(&p2);
    arch_free(&a);
}

static void test_dir_roundtrip(void **state)
{
    (void)state;
    eng_backend *be = eng_backend_cpu_new(1);
    arch a, t;
    parent_arch(&a, 1, 0);
    assert_int_equal(arch_copy(&t, &a), 0);
    t.layers[1].ffn_dim = 8;   /* heterogeneous */
    char err[256], dir[] = "/tmp/ac_prune_dir_XXXXXX", path[600];
    assert_non_null(mkdtemp(dir));
    eng_model p, q, r;
    assert_int_equal(eng_model_init(&p, &a, be, err, sizeof err), 0);
    eng_model_randomize(&p, 5, 0.2f);
    assert_int_equal(prune_to_arch(&p, &t, &q, err, sizeof err), 0);
    json_t *man = json_pack("{s:s}", "parent", "/nonexistent/parent.bin");
    assert_int_equal(prune_save_dir(&q, dir, man, err, sizeof err), 0);
    assert_true(prune_is_dir(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_not_equal(access(path, F_OK), 0);   /* no HF form for a heterogeneous arch */
    json_t *back = NULL;
    assert_int_equal(prune_load_dir(dir, be, &r, &back, err, sizeof err), 0);
    assert_true(arch_equal(&r.a, &t));
    assert_string_equal(json_string_value(json_object_get(back, "parent")), "/nonexistent/parent.bin");
    float *w1 = malloc(q.n_params * sizeof(float)), *w2 = malloc(r.n_params * sizeof(float));
    assert_int_equal(q.n_params, r.n_params);
    be->to_host(be, w1, q.params, q.n_params * sizeof(float));
    be->to_host(be, w2, r.params, r.n_params * sizeof(float));
    assert_memory_equal(w1, w2, q.n_params * sizeof(float));
    eng_model_free(&r);
    /* a tokenizer is asked for but the parent is absent: a clear error, nothing leaked */
    tok_tokenizer *tok = NULL;
    assert_int_equal(prune_load_model(dir, NULL, be, &r, &tok, err, sizeof err), -1);
    assert_null(tok);
    assert_int_equal(prune_load_model(dir, NULL, be, &r, NULL, err, sizeof err), 0);
    eng_model_free(&r);
    /* a manifest cut short fails the load naming it (it was read as no manifest: "names no parent") */
    char mp[640];
    snprintf(mp, sizeof mp, "%s/prune.json", dir);
    FILE *f = fopen(mp, "w");
    assert_non_null(f);
    assert_true(fputs("{\"parent\": \"/nonexistent/par", f) >= 0);
    assert_int_equal(fclose(f), 0);
    json_t *none = NULL;
    assert_int_equal(prune_load_dir(dir, be, &r, &none, err, sizeof err), -1);
    assert_null(none);
    assert_non_null(strstr(err, "prune.json: "));
    assert_null(strstr(err, "names no parent"));
    /* uniform: config.json appears */
    for (int l = 0; l < NL; l++)
        t.layers[l] = (arch_layer){.source_layer = l, .n_heads = 2, .n_kv_heads = 2, .ffn_dim = 12};
    assert_true(arch_is_uniform(&t));
    eng_model u;
    assert_int_equal(prune_to_arch(&p, &t, &u, err, sizeof err), 0);
    assert_int_equal(prune_save_dir(&u, dir, NULL, err, sizeof err), 0);
    assert_int_equal(access(path, F_OK), 0);
    eng_model_free(&u);
    free(w1);
    free(w2);
    json_decref(man);
    json_decref(back);
    eng_model_free(&q);
    eng_model_free(&p);
    arch_free(&t);
    arch_free(&a);
    eng_backend_free(be);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* A snapshot whose parent is itself a snapshot (a pruned or distilled student pruned again):
 * the tokenizer is looked for through the parents' manifests; manifests that name each other
 * fail with a clear error instead of looping, and one naming a missing model names it. */
static void test_dir_parent_chain(void **state)
{
    (void)state;
    eng_backend *be = eng_backend_cpu_new(1);
    arch a;
    parent_arch(&a, 1, 0);
    char err[512], da[] = "/tmp/ac_prune_chain_a_XXXXXX", db[] = "/tmp/ac_prune_chain_b_XXXXXX";
    assert_non_null(mkdtemp(da));
    assert_non_null(mkdtemp(db));
    eng_model p, r;
    assert_int_equal(eng_model_init(&p, &a, be, err, sizeof err), 0);
    eng_model_randomize(&p, 5, 0.2f);
    json_t *ma = json_pack("{s:s}", "parent", db), *mb = json_pack("{s:s}", "parent", da);
    assert_int_equal(prune_save_dir(&p, da, ma, err, sizeof err), 0);
    assert_int_equal(prune_save_dir(&p, db, mb, err, sizeof err), 0);
    tok_tokenizer *tok = NULL;
    assert_int_equal(prune_load_model(da, NULL, be, &r, &tok, err, sizeof err), -1);
    assert_null(tok);
    assert_non_null(strstr(err, "a loop?"));
    /* b's parent a model that is not there: the error names it, two folders up */
    json_decref(mb);
    mb = json_pack("{s:s}", "parent", "/nonexistent/parent.bin");
    assert_int_equal(prune_save_dir(&p, db, mb, err, sizeof err), 0);
    assert_int_equal(prune_load_model(da, NULL, be, &r, &tok, err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/parent.bin"));
    /* b without a manifest: nothing names a tokenizer, and the error says which folder */
    char mp[600];
    snprintf(mp, sizeof mp, "%s/prune.json", db);
    assert_int_equal(unlink(mp), 0);
    assert_int_equal(prune_load_model(da, NULL, be, &r, &tok, err, sizeof err), -1);
    assert_non_null(strstr(err, db));
    assert_non_null(strstr(err, "names no parent"));
    json_decref(ma);
    json_decref(mb);
    eng_model_free(&p);
    arch_free(&a);
    eng_backend_free(be);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", da, db);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_prune_equals_masks),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_rope_scaling_fitted),
        cmocka_unit_test(test_dir_roundtrip),
        cmocka_unit_test(test_dir_parent_chain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
