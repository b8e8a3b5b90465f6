/* tests/unit/test_costmodel_calibrate.c — calibration on the real CPU engine with tiny
 * configs: the grid is covered, the memory items predicted from the calibrated model
 * equal the engine's byte accounting on held-out random archs (weights, KV cache and
 * backend peak exactly), the validation block has the §10 shape, and the estimate
 * path answers 409 before and 200 after a calibration is cached; a search's anchor and
 * check serve in the built-in engine and scale the tables to the parent as served.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <omp.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compress/calibrate.h"
#include "compress/dnas.h"
#include "compress/costmodel.h"
#include "compress/measure.h"
#include "compress/method.h"
#include "compress/servecheck.h"
#include "engine/clock.h"
#include "engine/devices.h"
#include "engine/model.h"
#include "storage/archjson.h"

static void tiny_parent(arch *a, int L)
{
    assert_int_equal(arch_init(a, L), 0);
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = 256;
    a->hidden_size = 64;
    a->head_dim = 16;
    a->max_position_embeddings = 1024;
    a->rope_theta = 10000;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = 1;
    for (int i = 0; i < L; i++) {
        a->layers[i].source_layer = i;
        a->layers[i].n_heads = 4;
        a->layers[i].n_kv_heads = 2;
        a->layers[i].ffn_dim = 128;
    }
}

/* tiny_parent's L layers at width `hidden`: 8 query heads in 4 KV groups, FFN 4 x hidden
 * (a parent whose requests take long enough to judge the machine's load over). */
static void wide_parent(arch *a, int L, int hidden)
{
    tiny_parent(a, L);
    a->hidden_size = hidden;
    a->head_dim = hidden / 8;
    for (int i = 0; i < L; i++) {
        a->layers[i].n_heads = 8;
        a->layers[i].n_kv_heads = 4;
        a->layers[i].ffn_dim = 4 * hidden;
    }
}

/* A LatentMoE parent (Nemotron 3 Super's shape): layers 0 and 2 are attention and an MoE of 4
 * experts (top 2, sigmoid routing, a shared expert) in a latent of 32, the others dense. */
static void tiny_latent_parent(arch *a, int L)
{
    tiny_parent(a, L);
    snprintf(a->family, sizeof a->family, "nemotron_h");
    for (int i = 0; i < L; i += 2) {
        a->layers[i].ffn_dim = 0;
        a->layers[i].moe = (arch_moe){.n_experts = 4, .top_k = 2, .expert_ffn_dim = 32, .shared_ffn_dim = 48,
                                      .sigmoid = 1, .n_group = 1, .topk_group = 1, .routed_scale = 2.5f,
                                      .norm_topk = 1, .latent_dim = 32};
    }
}

/* A Qwen2-MoE parent: layers 0 and 2 are MoEs of 4 experts (top 2, a shared expert), the
 * others dense. */
static void tiny_moe_parent(arch *a, int L)
{
    tiny_parent(a, L);
    snprintf(a->family, sizeof a->family, "qwen2_moe");
    a->attention_bias = 1;
    for (int i = 0; i < L; i += 2) {
        a->layers[i].ffn_dim = 0;
        a->layers[i].moe = (arch_moe){.n_experts = 4, .top_k = 2, .expert_ffn_dim = 32, .shared_ffn_dim = 48};
    }
}

static cm_target tiny_target(void)
{
    cm_target t;
    memset(&t, 0, sizeof t);
    snprintf(t.device, sizeof t.device, "cpu");
    snprintf(t.precision, sizeof t.precision, "fp32");
    t.batch_size = 2;
    t.prompt_tokens = 12;
    t.output_tokens = 5;
    return t;
}

static void test_grids(void **state)
{
    (void)state;
    arch p;
    tiny_parent(&p, 3);
    p.layers[0].n_heads = 9;
    p.layers[0].n_kv_heads = 3;
    p.layers[0].ffn_dim = 1536;
    int h[16], kv[16], f[16];
    int na = cal_grid_attention(&p, h, kv, 16), nf = cal_grid_mlp(&p, f, 16, 1);
    /* kv groups (3,1) (6,2) (9,3) then kv fixed at 3: (3,3) (6,3) */
    assert_int_equal(na, 5);
    assert_int_equal(h[0], 3);
    assert_int_equal(kv[0], 1);
    assert_int_equal(h[2], 9);
    assert_int_equal(kv[2], 3);
    assert_int_equal(h[3], 3);
    assert_int_equal(kv[3], 3);
    /* 48 (F/32), then eighths 192 ... 1536 */
    assert_int_equal(nf, 9);
    assert_int_equal(f[0], 48);
    assert_int_equal(f[1], 192);
    assert_int_equal(f[8], 1536);
    arch_free(&p);
    /* an MoE of 4 experts of 32 units and a shared expert of 48: 5 of the counts at 8, 16 and 24
       units, the 4 experts beside a shared expert of 12, 24 and 36, then every count at 32 */
    tiny_moe_parent(&p, 2);
    int g[64], ng = cal_grid_mlp(&p, g, 64, 1), dense = 0;
    while (g[dense] > 0)
        dense++;
    assert_int_equal(ng - dense, 3 * 4 + 3 + 4);
    arch_layer l;
    cal_mlp_apply(&p, g[dense], &l);
    assert_true(l.moe.n_experts == 1 && l.moe.expert_ffn_dim == 8 && l.moe.top_k == 1 && l.moe.shared_ffn_dim == 48);
    cal_mlp_apply(&p, g[dense + 7], &l);
    assert_true(l.moe.n_experts == 4 && l.moe.expert_ffn_dim == 16 && l.moe.top_k == 2);
    for (int i = 0; i < 3; i++) {
        assert_true(cal_moe_is_shared(g[dense + 12 + i]));
        cal_mlp_apply(&p, g[dense + 12 + i], &l);
        assert_true(l.moe.n_experts == 4 && l.moe.top_k == 2 && l.moe.expert_ffn_dim == 32 &&
                    l.moe.shared_ffn_dim == 12 * (i + 1));
    }
    cal_mlp_apply(&p, g[ng - 1], &l);
    assert_true(l.moe.n_experts == 4 && l.moe.expert_ffn_dim == 32 && l.moe.shared_ffn_dim == 48);
    assert_int_equal(cal_grid_mlp(&p, g, 64, 0) - dense, 4);   /* no narrower experts (llama.cpp's grid) */
    arch_free(&p);
    /* 128 experts, top 8 (counts in sixteenths, 8 ... 128): the smallest count and the top-k
       at every width too, so that the counts below the top-k are priced */
    tiny_moe_parent(&p, 2);
    p.layers[0].moe = (arch_moe){.n_experts = 128, .top_k = 8, .expert_ffn_dim = 32};
    ng = cal_grid_mlp(&p, g, 64, 1);
    int ones = 0, eights = 0;
    for (int i = 0; i < ng; i++) {
        if (g[i] >= 0)
            continue;
        cal_mlp_apply(&p, g[i], &l);
        ones += l.moe.n_experts == 1 && l.moe.top_k == 1;
        eights += l.moe.n_experts == 8 && l.moe.top_k == 8;
    }
    assert_int_equal(ones, 4);     /* at 8, 16, 24 and 32 units */
    assert_int_equal(eights, 4);
    arch_free(&p);
    /* a LatentMoE: the parent's experts in a latent of 8, 16 and 24 of 32, after the shared widths */
    tiny_latent_parent(&p, 2);
    ng = cal_grid_mlp(&p, g, 64, 1);
    for (dense = 0; g[dense] > 0; dense++)
        ;
    assert_int_equal(ng - dense, 3 * 4 + 3 + 3 + 4);
    for (int i = 0; i < 3; i++) {
        int code = g[dense + 15 + i];
        assert_true(cal_moe_is_latent(code) && !cal_moe_is_shared(code));
        assert_true(cal_moe_is_shared(g[dense + 12 + i]) && !cal_moe_is_latent(g[dense + 12 + i]));
        cal_mlp_apply(&p, code, &l);
        assert_true(l.moe.n_experts == 4 && l.moe.expert_ffn_dim == 32 && l.moe.shared_ffn_dim == 48 &&
                    l.moe.latent_dim == 8 * (i + 1));
        assert_int_equal(cal_entry_key(&p, CM_MLP, 64, 0, 0, code).latent_dim, 8 * (i + 1));
    }
    cal_mlp_apply(&p, g[ng - 1], &l);
    assert_int_equal(l.moe.latent_dim, 32);
    arch_free(&p);
}

/* A quick calibration of p on t: one rep, one model per size, `validate` held-out archs
 * served once, `fit` fit archs (-1: the default). Fails the test when it cannot run. */
static json_t *quick_calibration(const arch *p, const cm_target *t, int validate, int fit)
{
    cal_opts o;
    cal_opts_default(&o);
    o.reps = 1;
    o.n_models = 1;
    o.validate = validate;
    o.validate_reps = 1;
    if (fit >= 0)
        o.fit = fit;
    char err[512];
    json_t *cal = cal_run(p, t, &o, err, sizeof err);
    if (!cal)
        fail_msg("cal_run: %s", err);
    return cal;
}

/* A quick calibration of p on t (validate held-out archs), its tables in *tb and a served
 * check of p on them opened in *sc; the calibration, to free. */
static json_t *open_served_check(const arch *p, const cm_target *t, int validate, cm_tables *tb, sc_check *sc)
{
    char err[512];
    json_t *cal = quick_calibration(p, t, validate, -1);
    if (cm_calibration_tables(cal, tb, err, sizeof err))
        fail_msg("tables: %s", err);
    if (sc_open(sc, p, &tb->target, NULL, NULL, err, sizeof err))
        fail_msg("open: %s", err);
    return cal;
}

static void memory_matches_engine_accounting(int moe)
{
    arch p;
    if (moe == 2)
        tiny_latent_parent(&p, 4);
    else if (moe)
        tiny_moe_parent(&p, 4);
    else
        tiny_parent(&p, 4);
    cm_target t = tiny_target();
    char err[512];
    json_t *cal = quick_calibration(&p, &t, 3, -1);
    /* the §10 shape */
    assert_string_equal(json_string_value(json_object_get(cal, "status")), "succeeded");
    assert_int_equal(strncmp(json_string_value(json_object_get(cal, "id")), "cal_", 4), 0);
    json_t *v = json_object_get(cal, "validation");
    assert_int_equal(json_integer_value(json_object_get(v, "archs")), 3);
    assert_int_equal(json_array_size(json_object_get(v, "rows")), 3);
    assert_true(json_is_number(json_object_get(v, "latency_mape_pct")));
    assert_true(json_is_number(json_object_get(v, "naive_memory_mape_pct")));
    cm_tables tb;
    if (cm_calibration_tables(cal, &tb, err, sizeof err))
        fail_msg("tables: %s", err);
    /* grid: 3 attention sizes + removed, 4 mlp widths (8, 32, 64, ..., 128) + removed */
    int h[64], kv[64], f[64];
    int na = cal_grid_attention(&p, h, kv, 64), nf = cal_grid_mlp(&p, f, 64, 1);
    assert_int_equal(tb.n_prefill, na + 1 + nf + 1);
    assert_int_equal(json_integer_value(json_object_get(cal, "entries")), 2 * (na + nf + 2) + 2);
    for (int i = 0; i < tb.n_prefill; i++)
        assert_true(tb.prefill[i].samples > 0);
    /* every held-out row: predicted backend bytes equal the measured backend peak */
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(v, "rows"), i, r) {
        json_t *items = json_object_get(json_object_get(r, "predicted_memory_items"), "memory_bytes");
        int64_t pred = json_integer_value(json_object_get(items, "weights")) +
                       json_integer_value(json_object_get(items, "request_cache")) +
                       json_integer_value(json_object_get(items, "prefill_workspace"));
        assert_int_equal(pred, json_integer_value(json_object_get(r, "measured_backend_peak_bytes")));
    }
    /* independent archs measured here, item by item */
    eng_backend *be = eng_backend_new("cpu", err, sizeof err);
    assert_non_null(be);
    uint64_t rng = 12345;
    int latents = 0;
    for (int k = 0; k < 4; k++) {
        arch a;
        assert_int_equal(cal_random_arch(&p, &rng, &a, 1), 0);
        cm_prediction pr;
        ms_result mr;
        ms_opts mo = {.warmup = 0, .reps = 1, .seed = 3};
        if (cm_predict(&tb, &a, &pr, err, sizeof err))
            fail_msg("predict: %s", err);
        if (ms_measure_arch(be, &a, &t, &mo, &mr, err, sizeof err))
            fail_msg("measure: %s", err);
        assert_int_equal(pr.weights, mr.weights_bytes);
        assert_int_equal(pr.request_cache, mr.request_cache_bytes);
        size_t ws = eng_forward_workspace_bytes(&a, t.batch_size, t.prompt_tokens,
                                                t.prompt_tokens + t.output_tokens, ENG_LOGITS_LAST,
                                                omp_get_max_threads(), 0);
        if (moe == 2) {
            /* an MoE whose shared expert and experts are both narrower than the grid's: the
               additive rule prices the experts' scratch at max(widths) of the shapes it adds,
               so it may state a few floats a row more than the engine takes, never less */
            int64_t over = pr.weights + pr.request_cache + pr.prefill_workspace - mr.backend_peak_bytes;
            assert_true(over >= 0 && over <= 3 * 32 * 4 * t.batch_size * t.prompt_tokens);
            assert_true(pr.prefill_workspace >= (int64_t)ws);
        } else {
            assert_int_equal(pr.weights + pr.request_cache + pr.prefill_workspace, mr.backend_peak_bytes);
            /* and the engine's own formula for the forward workspace agrees */
            assert_int_equal(pr.prefill_workspace, (int64_t)ws);
        }
        assert_int_equal(be->cur_bytes, 0);
        assert_true(mr.latency_ms > 0);
        latents += a.layers[0].moe.latent_dim && a.layers[0].moe.latent_dim < 32;
        arch_free(&a);
    }
    if (moe == 2)   /* the independent archs drew narrower latents too (one per arch) */
        assert_true(latents > 0);
    if (moe == 2) {   /* narrower latents: 8, 16 and 24 of 32 priced at the parent's shape, and at any other
                         shape as its cost at 32 plus the difference measured there */
        int lt[8];
        assert_int_equal(cm_moe_latents(&tb, &p.layers[0].moe, lt, 8), 4);
        assert_true(lt[0] == 8 && lt[1] == 16 && lt[2] == 24 && lt[3] == 32);
        arch_moe full = p.layers[0].moe, two = full, two16 = full, four16 = full, four12 = full, four8 = full;
        two.n_experts = two16.n_experts = 2;
        two16.latent_dim = four16.latent_dim = 16;
        four12.latent_dim = 12;
        four8.latent_dim = 8;
        double c[6][3];
        const arch_moe *ms[6] = {&full, &two, &two16, &four16, &four12, &four8};
        for (int i = 0; i < 6; i++)
            assert_int_equal(cm_moe_cost(&tb, p.hidden_size, ms[i], &c[i][0], &c[i][1], &c[i][2]), 0);
        for (int j = 0; j < 3; j++) {
            double add = c[1][j] + c[3][j] - c[0][j], mid = (c[3][j] + c[5][j]) / 2;
            assert_true(fabs(c[2][j] - (add > 0 || j < 2 ? add : 0)) <= 1e-9 * fabs(c[0][j]) + 1e-9);
            assert_true(fabs(c[4][j] - mid) <= 1e-9 * fabs(c[0][j]) + 1e-9);
        }
        arch_moe wide = full;
        wide.latent_dim = 40;   /* wider than any priced */
        assert_int_equal(cm_moe_cost(&tb, p.hidden_size, &wide, NULL, NULL, NULL), -1);
    }
    if (moe == 1) {   /* an entry per expert count, top-k capped at it; a per-layer MoE arch is priced */
        for (int e = 1; e <= 4; e++) {
            arch_moe m = p.layers[0].moe;
            m.n_experts = e;
            m.top_k = e < 2 ? e : 2;
            double pre, dec;
            assert_int_equal(cm_moe_cost(&tb, p.hidden_size, &m, &pre, &dec, NULL), 0);
            assert_true(pre > 0 && dec > 0);
        }
        arch_moe k3 = p.layers[0].moe;
        k3.top_k = 3;   /* no entry of top-3 routing */
        assert_int_equal(cm_moe_cost(&tb, p.hidden_size, &k3, NULL, NULL, NULL), -1);
        /* narrower experts: 8, 16 and 24 of 32 units priced; between two, linear */
        int w[8];
        assert_int_equal(cm_moe_widths(&tb, &p.layers[0].moe, w, 8), 4);
        assert_int_equal(w[0], 8);
        assert_int_equal(w[2], 24);
        assert_int_equal(w[3], 32);
        double c[3][2];
        for (int i = 0; i < 3; i++) {
            arch_moe m = p.layers[0].moe;
            m.n_experts = 3;   /* an uncalibrated count at the narrower widths: interpolated in both */
            m.expert_ffn_dim = 16 + 4 * i;
            assert_int_equal(cm_moe_cost(&tb, p.hidden_size, &m, &c[i][0], &c[i][1], NULL), 0);
        }
        assert_true(fabs(c[1][0] - (c[0][0] + c[2][0]) / 2) <= 1e-9 * c[1][0]);
        assert_true(fabs(c[1][1] - (c[0][1] + c[2][1]) / 2) <= 1e-9 * c[1][1]);
        arch_moe wide = p.layers[0].moe;
        wide.expert_ffn_dim = 40;   /* wider than any priced */
        assert_int_equal(cm_moe_cost(&tb, p.hidden_size, &wide, NULL, NULL, NULL), -1);
    }
    eng_backend_free(be);
    cm_tables_free(&tb);
    json_decref(cal);
    arch_free(&p);
}

static void test_memory_matches_engine_accounting(void **state)
{
    (void)state;
    memory_matches_engine_accounting(0);
}

/* The same for a mixture-of-experts parent: the grid's expert counts, the held-out archs'
 * per-layer expert counts, the experts' scratch in the workspace. */
static void test_memory_matches_engine_accounting_moe(void **state)
{
    (void)state;
    memory_matches_engine_accounting(1);
}

/* And for a LatentMoE parent: narrower latents in the grid and in the independent archs. */
static void test_memory_matches_engine_accounting_latent(void **state)
{
    (void)state;
    memory_matches_engine_accounting(2);
}

/* A parent that routes each token to 4 of 16 experts: counts below the top-k (every kept
 * expert runs on every token, top-k capped at the count) are priced at every width, between
 * the grid's capped counts (1 and 4), and the search space of counts and widths is priced
 * whole. They were outside the tables at the narrower widths, which only hold top-4 counts
 * there: the held-out archs and the search failed on them. */
static void test_counts_below_top_k(void **state)
{
    (void)state;
    arch p;
    tiny_moe_parent(&p, 2);
    for (int l = 0; l < 2; l += 2)
        p.layers[l].moe = (arch_moe){.n_experts = 16, .top_k = 4, .expert_ffn_dim = 32, .shared_ffn_dim = 0};
    cm_target t = tiny_target();
    json_t *cal = quick_calibration(&p, &t, 4, -1);
    char err[512];
    cm_tables tb;
    assert_int_equal(cm_calibration_tables(cal, &tb, err, sizeof err), 0);
    for (int w = 8; w <= 32; w += 8)
        for (int e = 1; e <= 16; e++) {
            arch_moe m = arch_moe_keep(&p.layers[0].moe, e);
            m.expert_ffn_dim = w;
            double pre, dec;
            if (cm_moe_cost(&tb, p.hidden_size, &m, &pre, &dec, NULL) != 0)
                fail_msg("%d experts (top %d) of %d units: outside the tables", e, m.top_k, w);
        }
    double c[4];
    for (int e = 1; e <= 4; e++) {
        arch_moe m = arch_moe_keep(&p.layers[0].moe, e);
        m.expert_ffn_dim = 16;
        assert_int_equal(cm_moe_cost(&tb, p.hidden_size, &m, &c[e - 1], NULL, NULL), 0);
    }
    /* 2 and 3 experts at 16 units: on the line between the calibrated 1 and 4 */
    assert_true(fabs(c[1] - (c[0] + (c[3] - c[0]) / 3)) <= 1e-9 * c[3]);
    dnas_limits lim = {.params = 0.7 * (double)arch_params(&p)};
    dnas_axes ax = {.experts = 1, .expert_widths = 1};
    search_space sp;
    search_costs costs;
    if (dnas_space_build(&p, &tb, &lim, &ax, &sp, &costs, err, sizeof err))
        fail_msg("search space: %s", err);
    dnas_space_free(&sp, &costs);
    cm_tables_free(&tb);
    json_decref(cal);
    arch_free(&p);
}

/* A Nemotron-H parent whose Mamba mixers have 6 heads of 16 (d_inner 96), priced for a
 * target storing widths in blocks of 32 (a quantized llama.cpp weight type): the Mamba axis
 * holds only the head counts whose d_inner fills whole blocks (2, 4, 6), and the space is
 * priced whole. The old axis held every count, and the space failed on 1 head (d_inner 16),
 * which the tables cannot price. */
static void test_mamba_axis_in_blocks(void **state)
{
    (void)state;
    arch p;
    tiny_parent(&p, 3);
    snprintf(p.family, sizeof p.family, "nemotron_h");
    p.layers[0] = (arch_layer){.source_layer = 0, .mamba = {6, 16, 8, 1, 4}};
    p.layers[2] = (arch_layer){.source_layer = 2, .mamba = {6, 16, 8, 1, 4}};
    p.layers[1].ffn_dim = 0;
    cm_target t = tiny_target();
    json_t *cal = quick_calibration(&p, &t, 0, -1);
    char err[512];
    cm_tables tb;
    assert_int_equal(cm_calibration_tables(cal, &tb, err, sizeof err), 0);
    tb.width_multiple = 32;
    dnas_limits lim = {.params = 0.8 * (double)arch_params(&p)};
    dnas_axes ax = {.mamba = 1};
    search_space sp;
    search_costs costs;
    if (dnas_space_build(&p, &tb, &lim, &ax, &sp, &costs, err, sizeof err))
        fail_msg("search space: %s", err);
    assert_true(sp.n_mam >= 1);
    for (int k = 0; k < sp.n_mam; k++)
        if (sp.mam[k] * 16 % 32)
            fail_msg("Mamba heads %d: d_inner %d is off the blocks of 32", sp.mam[k], sp.mam[k] * 16);
    assert_int_equal(sp.mam[sp.n_mam - 1], 6);
    dnas_space_free(&sp, &costs);
    cm_tables_free(&tb);
    json_decref(cal);
    arch_free(&p);
}

/* A parent of 64 heads in 64 KV groups, with depth searched (so a 0 choice too): the heads
 * axis is thinned evenly to what it holds and keeps the parent's 64, so an export that keeps
 * the query heads still finds them. The old axis stopped at 63 and left such a layer no
 * choice but to drop its attention. */
static void test_heads_axis_keeps_parent(void **state)
{
    (void)state;
    arch p;
    tiny_parent(&p, 2);
    p.hidden_size = 128;
    p.head_dim = 2;
    for (int l = 0; l < 2; l++)
        p.layers[l].n_heads = p.layers[l].n_kv_heads = 64;
    cm_target t = tiny_target();
    json_t *cal = quick_calibration(&p, &t, 0, -1);
    char err[512];
    cm_tables tb;
    assert_int_equal(cm_calibration_tables(cal, &tb, err, sizeof err), 0);
    dnas_limits lim = {.params = 0.8 * (double)arch_params(&p)};
    dnas_axes ax = {.heads = 1, .depth = 1, .keep_query_heads = 1};
    search_space sp;
    search_costs costs;
    if (dnas_space_build(&p, &tb, &lim, &ax, &sp, &costs, err, sizeof err))
        fail_msg("search space: %s", err);
    assert_int_equal(sp.heads[0], 0);
    assert_int_equal(sp.heads[sp.n_heads - 1], 64);
    for (int k = 1; k < sp.n_heads; k++)
        assert_true(sp.heads[k] > sp.heads[k - 1]);
    int allowed = 0;
    for (int k = 0; k < sp.n_heads; k++)
        allowed += sp.allowed_heads[k] && sp.heads[k] == 64;
    assert_int_equal(allowed, 1);
    dnas_space_free(&sp, &costs);
    cm_tables_free(&tb);
    json_decref(cal);
    arch_free(&p);
}

/* Fit archs (random archs that set the phase scales) are counted in the cost, drawn
 * from their own stream (the held-out archs are the same with or without them), and
 * every validation row carries its phases apart, adding up to the request. */
static void test_fit_archs(void **state)
{
    (void)state;
    arch p;
    tiny_parent(&p, 4);
    cm_target t = tiny_target();
    json_t *cal[2];
    for (int k = 0; k < 2; k++) {
        cal[k] = quick_calibration(&p, &t, 2, k ? 2 : 0);   /* 2 fit archs in all */
        json_t *cost = json_object_get(cal[k], "cost");
        assert_int_equal(json_integer_value(json_object_get(cost, "fit_archs")), k ? 2 : 0);
        double fp = json_number_value(json_object_get(cost, "fit_prefill_factor"));
        double fd = json_number_value(json_object_get(cost, "fit_decode_factor"));
        if (k)
            assert_true(fp > 0 && fd > 0);
        else   /* no fit archs: no correction */
            assert_true(fp == 1.0 && fd == 1.0);
        size_t i;
        json_t *r;
        json_array_foreach(json_object_get(json_object_get(cal[k], "validation"), "rows"), i, r) {
            double pp = json_number_value(json_object_get(r, "predicted_prefill_ms"));
            double pd = json_number_value(json_object_get(r, "predicted_decode_ms"));
            double mp = json_number_value(json_object_get(r, "measured_prefill_ms"));
            double md = json_number_value(json_object_get(r, "measured_decode_ms"));
            assert_true(pp > 0 && pd > 0 && mp > 0 && md > 0);
            assert_true(fabs(pp + pd - json_number_value(json_object_get(r, "predicted_latency_ms"))) < 1e-6 * (pp + pd));
        }
    }
    /* the held-out archs' memory is measured in fresh serving processes: with fit archs the
       runtime item takes in the process's own memory (program, libraries, threads: MiBs on
       a model of KiBs) and the held-out archs are predicted within a few percent; without
       them it is left out, and the held-out rows show it */
    json_t *v0 = json_object_get(cal[0], "validation"), *v1 = json_object_get(cal[1], "validation");
    int64_t fm = json_integer_value(json_object_get(json_object_get(cal[1], "cost"), "fit_memory_bytes"));
    print_message("fit memory residual %.1f MiB; held-out memory max error %.1f%% with it, %.1f%% without\n",
                  fm / 1048576.0, json_number_value(json_object_get(v1, "memory_max_pct")),
                  json_number_value(json_object_get(v0, "memory_max_pct")));
    assert_true(fm > (1 << 20));
    assert_true(json_number_value(json_object_get(v1, "memory_max_pct")) < 10);
    assert_true(json_number_value(json_object_get(v0, "memory_max_pct")) > 20);
    json_t *r0 = json_object_get(v0, "rows");
    json_t *r1 = json_object_get(v1, "rows");
    assert_int_equal(json_array_size(r0), 2);
    assert_int_equal(json_array_size(r1), 2);
    for (size_t i = 0; i < 2; i++)
        assert_string_equal(json_string_value(json_object_get(json_array_get(r0, i), "summary")),
                            json_string_value(json_object_get(json_array_get(r1, i), "summary")));
    json_decref(cal[0]);
    json_decref(cal[1]);
    arch_free(&p);
}

/* The built-in engine's anchor and check (compress/servecheck.h): tables made on a host
 * twice as fast in prefill and four times in decode as this one are scaled to the parent
 * as served now, exactly (no parent bias: 1); a check prices an arch from its ratios to
 * the parent at the anchor's level and carries its own peak; imported tables are not
 * served here. */
static void test_served_anchor_builtin(void **state)
{
    (void)state;
    arch p;
    tiny_parent(&p, 4);
    cm_target t = tiny_target();
    char err[512];
    json_t *cal = quick_calibration(&p, &t, 2, -1);
    cm_tables tb, anchored;
    if (cm_calibration_tables(cal, &tb, err, sizeof err))
        fail_msg("tables: %s", err);
    assert_ptr_equal(method_served_target(&tb), &tb.target);
    cm_tables_rescale(&tb, 0.5, 0.25);
    sc_check sc;
    if (sc_open(&sc, &p, &tb.target, NULL, NULL, err, sizeof err) || sc_anchor(&sc, &tb, &anchored, err, sizeof err))
        fail_msg("anchor: %s", err);
    json_t *an = json_object_get(sc_doc(&sc), "anchor");
    assert_string_equal(json_string_value(json_object_get(an, "engine")), "autocompress");
    double mp = json_number_value(json_object_get(an, "parent_measured_prefill_ms"));
    double md = json_number_value(json_object_get(an, "parent_measured_decode_ms"));
    assert_true(mp > 0 && md > 0);
    assert_true(json_number_value(json_object_get(an, "parent_measured_ms")) > 0);   /* medians, each its own */
    cm_prediction pp, pa;
    assert_int_equal(cm_predict(&tb, &p, &pp, err, sizeof err), 0);
    assert_int_equal(cm_predict(&anchored, &p, &pa, err, sizeof err), 0);
    assert_true(fabs(pa.prefill_ms - mp) < 1e-6 * mp && fabs(pa.decode_ms - md) < 1e-6 * md);
    assert_true(fabs(json_number_value(json_object_get(an, "prefill_scale")) - mp / pp.prefill_ms) < 1e-6 * mp / pp.prefill_ms);
    assert_int_equal(pa.total, pp.total);   /* memory is not a speed */
    /* a check: the arch at the anchor's level, its own peak */
    uint64_t rng = 99;
    arch a;
    assert_int_equal(cal_random_arch(&p, &rng, &a, 1), 0);
    cm_prediction pred, m;
    assert_int_equal(cm_predict(&anchored, &a, &pred, err, sizeof err), 0);
    if (sc_measure(&sc, &a, &pred, &m, err, sizeof err))
        fail_msg("check: %s", err);
    json_t *row = json_array_get(json_object_get(sc_doc(&sc), "checks"), 0);
    assert_non_null(row);
    double ratio = json_number_value(json_object_get(row, "ratio_to_parent"));
    double pm = json_number_value(json_object_get(an, "parent_measured_ms"));
    assert_true(ratio > 0 && fabs(m.latency_ms - ratio * pm) < 1e-6 * m.latency_ms);
    assert_int_equal(json_array_size(json_object_get(row, "process_latencies_ms")), SC_ROUNDS);
    assert_int_equal(json_array_size(json_object_get(row, "parent_process_latencies_ms")), SC_ROUNDS);
    assert_int_equal(m.params, arch_params(&a));
    assert_true(m.total >= pred.weights + pred.request_cache);
    sc_close(&sc);
    /* a parent this machine's memory cannot serve beside the search: not served (1), said why */
    cm_tables huge;
    assert_int_equal(cm_tables_copy(&huge, &tb), 0);
    huge.mem.weight_bytes_per_param *= 1e9;
    cm_prediction ph;
    assert_int_equal(cm_predict(&huge, &p, &ph, err, sizeof err), 0);
    assert_true(ph.total > eng_device_free_bytes("cpu"));
    if (sc_open(&sc, &p, &tb.target, NULL, NULL, err, sizeof err))
        fail_msg("open: %s", err);
    cm_tables unused;
    assert_int_equal(sc_anchor(&sc, &huge, &unused, err, sizeof err), 1);
    assert_non_null(strstr(err, "GiB available"));
    assert_null(json_object_get(sc_doc(&sc), "anchor"));
    sc_close(&sc);
    cm_tables_free(&huge);
    /* tables measured in another engine: no anchor here */
    json_object_set_new(cal, "source", json_string("import"));
    cm_tables imp;
    if (cm_calibration_tables(cal, &imp, err, sizeof err))
        fail_msg("tables: %s", err);
    assert_null(method_served_target(&imp));
    cm_tables_free(&imp);
    arch_free(&a);
    cm_tables_free(&anchored);
    cm_tables_free(&tb);
    json_decref(cal);
    arch_free(&p);
}

/* A cancel hook that says stop at its stop_at-th question (never when 0), counting them. */
typedef struct {
    int calls, stop_at;
} stop_counter;

static int stop_when(void *ud)
{
    stop_counter *c = ud;
    c->calls++;
    return c->stop_at > 0 && c->calls >= c->stop_at;
}

/* A measurement asks its cancel hook before every request and before every decode step,
 * and stops at once when it says so: err "cancelled", nothing left allocated. A served
 * check's anchor and check (fresh processes, the hook asked while each serves: the
 * process is killed when it says stop, compress/child.h) stop too and record nothing. (A cancel or shutdown
 * waited for the rest of a measurement: seconds per request for a served SmolLM2, minutes
 * on a loaded host.) */
static void test_measure_cancel(void **state)
{
    (void)state;
    arch p;
    tiny_parent(&p, 2);
    cm_target t = tiny_target();
    char err[512];
    eng_backend *be = eng_backend_new("cpu", err, sizeof err);
    assert_non_null(be);
    const int N = t.output_tokens, asks = 1 + N;   /* per request: before it, before each step */
    stop_counter never = {0, 0};
    ms_result r;
    ms_opts o = {.warmup = 1, .reps = 2, .seed = 3, .cancelled = stop_when, .cancel_ud = &never};
    if (ms_measure_arch(be, &p, &t, &o, &r, err, sizeof err))
        fail_msg("measure: %s", err);
    assert_int_equal(never.calls, 3 * asks);
    assert_true(r.latency_ms > 0);
    int stops[] = {1, 2 + N / 2, asks + 1, 3 * asks};   /* before any request, mid-decode, request 2, last step */
    for (size_t i = 0; i < sizeof stops / sizeof *stops; i++) {
        stop_counter c = {0, stops[i]};
        o.cancel_ud = &c;
        err[0] = 0;
        assert_int_equal(ms_measure_arch(be, &p, &t, &o, &r, err, sizeof err), -1);
        assert_string_equal(err, "cancelled");
        assert_int_equal(c.calls, stops[i]);
        assert_int_equal(be->cur_bytes, 0);
    }
    /* served checks (fresh processes, the hook asked while each serves): the anchor stops
       and anchors nothing */
    cm_tables tb, anchored;
    sc_check sc;
    json_t *cal = open_served_check(&p, &t, 2, &tb, &sc);
    stop_counter c = {0, 1};
    sc.cancelled = stop_when;   /* what sc_open's hook arguments set */
    sc.cancel_ud = &c;
    assert_int_equal(sc_anchor(&sc, &tb, &anchored, err, sizeof err), -1);
    assert_string_equal(err, "cancelled");
    assert_int_equal(c.calls, 1);
    assert_null(json_object_get(sc_doc(&sc), "anchor"));
    /* anchored (every serving asked), then a check stopped at its first question: no row */
    c = (stop_counter){0, 0};
    if (sc_anchor(&sc, &tb, &anchored, err, sizeof err))
        fail_msg("anchor: %s", err);
    assert_true(c.calls >= SC_ROUNDS);
    c = (stop_counter){0, 1};
    cm_prediction m;
    assert_int_equal(sc_measure(&sc, &p, NULL, &m, err, sizeof err), -1);
    assert_string_equal(err, "cancelled");
    assert_int_equal(c.calls, 1);
    assert_int_equal(json_array_size(json_object_get(sc_doc(&sc), "checks")), 0);
    sc_close(&sc);
    cm_tables_free(&anchored);
    cm_tables_free(&tb);
    json_decref(cal);
    eng_backend_free(be);
    arch_free(&p);
}

/* The built-in engine's calibration asks its cancel hook inside its work, not only between
 * requests: while each model's random weights are drawn, before every decode step of
 * every request (a calibration model of a real parent takes seconds per request) and while
 * a held-out arch's fresh process measures its memory. Stopped at the first or a middle
 * question, it fails at once with err "cancelled". */
static void test_calibrate_cancel(void **state)
{
    (void)state;
    arch p;
    tiny_parent(&p, 2);
    cm_target t = tiny_target();
    cal_opts o;
    cal_opts_default(&o);
    o.reps = 1;
    o.n_models = 1;
    o.validate = 2;
    o.validate_reps = 1;
    o.cancelled = stop_when;
    stop_counter never = {0, 0};
    o.ud = &never;
    char err[512];
    json_t *cal = cal_run(&p, &t, &o, err, sizeof err);
    if (!cal)
        fail_msg("cal_run: %s", err);
    /* two held-out archs alone ask before every step of their requests, one at least each */
    assert_true(never.calls >= 2 * (1 + o.validate_reps) * t.output_tokens);
    json_decref(cal);
    int stops[] = {1, never.calls / 2};   /* the held-out archs' fresh processes ask as time passes, so
                                             how many questions a run asks varies */
    for (size_t i = 0; i < sizeof stops / sizeof *stops; i++) {
        stop_counter c = {0, stops[i]};
        o.ud = &c;
        err[0] = 0;
        assert_null(cal_run(&p, &t, &o, err, sizeof err));
        assert_string_equal(err, "cancelled");
        assert_int_equal(c.calls, stops[i]);
    }
    arch_free(&p);
}

/* A child process that spins (about one core busy) for up to `seconds`, or until
 * spinner_stop. */
/* A process spinning for `seconds`; pin_last: on the last core this process may use. */
static pid_t spinner_start_on(double seconds, int pin_last)
{
    pid_t kid = fork();
    assert_true(kid >= 0);
    if (kid == 0) {
        cpu_set_t may, one;   /* the last core it may use: a serving pinned to the first has its own */
        int last = -1;
        if (pin_last && sched_getaffinity(0, sizeof may, &may) == 0)
            for (int c = 0; c < CPU_SETSIZE; c++)
                if (CPU_ISSET(c, &may))
                    last = c;
        CPU_ZERO(&one);
        if (last > 0) {
            CPU_SET(last, &one);
            if (sched_setaffinity(0, sizeof one, &one) != 0)
                _exit(3);
        }
        double t0 = eng_wall_s();
        volatile double x = 0;
        while (eng_wall_s() - t0 < seconds)
            x += 1;
        _exit(0);
    }
    return kid;
}

static pid_t spinner_start(double seconds)
{
    return spinner_start_on(seconds, 0);
}

static void spinner_stop(pid_t kid)
{
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
}

/* The machine's load from other work: a process spinning beside a stretch of measuring
 * (not this one's, not yet waited for) is counted, about one core's share, and makes a
 * stretch on every core contended; what contended means on other shapes of load and for
 * the threads each target's measurement runs; a calibration records its own stretch's
 * load. */
static void test_host_load(void **state)
{
    (void)state;
    ms_host_mark mark;
    ms_host_mark_now(&mark, 0);
    pid_t kid = spinner_start(5);
    usleep(1200 * 1000);
    ms_host_load load;
    ms_host_load_since(&mark, &load);
    spinner_stop(kid);
    assert_int_equal(load.known, 1);
    assert_true(load.cores >= 1);
    assert_true(load.wall_s >= 1.19 && !load.too_short);
    assert_int_equal(load.threads, load.cores);   /* 0: every core */
    /* the spinning child: about one core, less what a hypervisor stole from it */
    assert_true(load.others_cpu_pct + load.steal_pct >= 0.6 * 100.0 / load.cores);
    assert_true(load.others_cpu_pct <= 100.0 + 1e-9 && load.steal_pct >= 0);
    assert_true(ms_host_contended(&load));
    /* the rule: others' busy cores against the cores the measurement leaves idle */
    ms_host_load h = {.known = 1, .others_cpu_pct = 12.5, .wall_s = 5, .cores = 16, .threads = 2};
    assert_false(ms_host_contended(&h));   /* 2 cores busy, 14 idle */
    h.threads = 16;
    assert_true(ms_host_contended(&h));    /* every core the measurement's */
    h.others_cpu_pct = 1.0;                /* 0.16 of a core: within the slack */
    assert_false(ms_host_contended(&h));
    h.steal_pct = 1.0;                     /* the hypervisor's share counts alike */
    assert_true(ms_host_contended(&h));
    cm_target tg = tiny_target();          /* the threads each target's measurement runs */
    assert_int_equal(ms_target_threads(&tg), 0);   /* the CPU backend: every core */
    snprintf(tg.device, sizeof tg.device, "cuda:0");
    assert_int_equal(ms_target_threads(&tg), 1);   /* a GPU: the host thread that launches */
    h.threads = ms_target_threads(&tg);
    assert_false(ms_host_contended(&h));   /* others and the hypervisor on 0.32 of 16 cores */
    h.others_cpu_pct = 95.0;
    assert_true(ms_host_contended(&h));    /* on 15.36: the 15 it leaves and a quarter more */
    h.threads = 16;
    h.others_cpu_pct = 1.0;
    h.too_short = 1;                       /* ticks too coarse to judge */
    assert_false(ms_host_contended(&h));
    h.too_short = 0;
    h.known = 0;
    assert_false(ms_host_contended(&h));
    json_t *hl = ms_host_load_json(&load);
    char note[256] = "";
    assert_int_equal(ms_host_load_note(hl, note, sizeof note), 1);
    assert_non_null(strstr(note, "other processes took"));
    assert_true(json_is_true(json_object_get(hl, "contended")));
    json_decref(hl);
    /* a calibration carries its stretch's load; a contended one says so in a note */
    arch p;
    tiny_parent(&p, 2);
    cm_target t = tiny_target();
    json_t *cal = quick_calibration(&p, &t, 0, -1);
    json_t *cl = json_object_get(cal, "host_load");
    assert_true(json_is_number(json_object_get(cl, "others_cpu_pct")));
    assert_true(json_is_boolean(json_object_get(cl, "contended")));
    json_object_set_new(cl, "contended", json_true());
    char msg[600];
    assert_int_equal(cal_contended_note(cal, msg, sizeof msg), 1);
    assert_non_null(strstr(msg, "calibrated beside other work: other processes took"));
    assert_non_null(strstr(msg, "not reused"));
    json_object_set_new(cl, "contended", json_false());
    assert_int_equal(cal_contended_note(cal, msg, sizeof msg), 0);
    json_decref(cal);
    arch_free(&p);
}

/* ms_run_quiet's run and aside for the test: a run sleeps 1.05 s (long enough to judge,
 * none of the machine's CPU its own), returns at once (quick) or fails; the first aside
 * stops the spinner when asked to; a cancel hook that says stop once a run was set aside. */
typedef struct {
    int runs, asides, fail, quick, stop_spinner, cancel_after_aside;
    pid_t kid;
} quiet_probe;

static int probe_run(void *ud, char *err, size_t errlen)
{
    quiet_probe *p = ud;
    p->runs++;
    if (p->fail) {
        snprintf(err, errlen, "the run failed");
        return -1;
    }
    if (!p->quick)
        usleep(1050 * 1000);
    return 0;
}

static int probe_aside(void *ud, const ms_host_load *load, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    quiet_probe *p = ud;
    assert_true(ms_host_contended(load));
    p->asides++;
    if (p->stop_spinner && p->kid > 0) {
        spinner_stop(p->kid);
        p->kid = 0;
    }
    return 0;
}

static int probe_cancelled(void *ud)
{
    quiet_probe *p = ud;
    return p->cancel_after_aside && p->asides > 0;
}

/* ms_run_quiet: a run beside a spinning process is set aside and run again after a wait,
 * `tries` runs in all, the last one's results standing (2); a run after the other work
 * stopped is kept (0); a cancel in the wait stops it (1); a failed run's error is
 * returned; a run too short to judge is kept at once. */
static void test_run_quiet(void **state)
{
    (void)state;
    char err[256] = "";
    ms_host_load load;
    quiet_probe p = {0};
    ms_quiet_opts q = {.threads = 0, .tries = 3, .wait_s = 0.5, .cancelled = probe_cancelled, .cancel_ud = &p};
    p.kid = spinner_start(600);
    assert_int_equal(ms_run_quiet(&q, probe_run, probe_aside, &p, &load, err, sizeof err), 2);
    assert_int_equal(p.runs, 3);
    assert_int_equal(p.asides, 2);   /* the last run's results stand */
    assert_true(ms_host_contended(&load));
    p = (quiet_probe){.stop_spinner = 1, .kid = p.kid};
    assert_int_equal(ms_run_quiet(&q, probe_run, probe_aside, &p, &load, err, sizeof err), 0);
    assert_int_equal(p.runs, 2);
    assert_int_equal(p.asides, 1);
    assert_false(ms_host_contended(&load));
    assert_true(load.known && !load.too_short);
    p = (quiet_probe){.cancel_after_aside = 1, .kid = spinner_start(600)};
    assert_int_equal(ms_run_quiet(&q, probe_run, probe_aside, &p, &load, err, sizeof err), 1);
    assert_string_equal(err, "cancelled");
    assert_int_equal(p.runs, 1);
    p.fail = 1;
    p.cancel_after_aside = 0;
    assert_int_equal(ms_run_quiet(&q, probe_run, probe_aside, &p, &load, err, sizeof err), -1);
    assert_string_equal(err, "the run failed");
    p = (quiet_probe){.quick = 1, .kid = p.kid};
    assert_int_equal(ms_run_quiet(&q, probe_run, probe_aside, &p, &load, err, sizeof err), 0);
    assert_int_equal(p.runs, 1);
    assert_true(load.too_short);
    spinner_stop(p.kid);
}

/* A run of two 1.05 s steps that asks ms_quiet_cut between them: steps[k] the steps the
 * k-th run made. */
typedef struct {
    ms_quiet_state *qs;
    int runs, asides, steps[4];
} cut_probe;

static int cut_run(void *ud, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    cut_probe *p = ud;
    int k = p->runs++;
    for (int s = 0; s < 2; s++) {
        usleep(1050 * 1000);
        p->steps[k]++;
        if (s == 0 && ms_quiet_cut(p->qs))
            return MS_RUN_CUT;
    }
    return 0;
}

static int cut_aside(void *ud, const ms_host_load *load, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    assert_true(ms_host_contended(load));   /* the load that cut it, not one taken after */
    ((cut_probe *)ud)->asides++;
    return 0;
}

/* A run beside a spinning process stops at its first step and is set aside (MS_RUN_CUT),
 * but the last try is never cut: its results stand (2). No state, no cut. */
static void test_run_quiet_cut(void **state)
{
    (void)state;
    char err[256] = "";
    ms_host_load load;
    ms_quiet_state qs;
    cut_probe p = {.qs = &qs};
    ms_quiet_opts q = {.threads = 0, .tries = 2, .wait_s = 0.3, .state = &qs};
    pid_t kid = spinner_start(600);
    assert_int_equal(ms_run_quiet(&q, cut_run, cut_aside, &p, &load, err, sizeof err), 2);
    assert_int_equal(p.runs, 2);
    assert_int_equal(p.asides, 1);
    assert_int_equal(p.steps[0], 1);
    assert_int_equal(p.steps[1], 2);   /* the last try runs whole */
    assert_true(qs.last);
    assert_int_equal(ms_quiet_cut(NULL), 0);
    spinner_stop(kid);
}

/* A cancel hook that never cancels and stops the spinner kid once the check's document
 * has a serving set aside in its array `tries`. */
typedef struct {
    const sc_check *sc;
    pid_t kid;
    const char *tries;
} spin_stop;

static int stop_spinner_after_try(void *ud)
{
    spin_stop *s = ud;
    if (s->kid > 0 && json_array_size(json_object_get(sc_doc(s->sc), s->tries)) > 0) {
        spinner_stop(s->kid);
        s->kid = 0;
    }
    return 0;
}

/* The anchor does not take the machine's speed from a serving beside other work: with a
 * process spinning through every serving it serves the parent MS_QUIET_TRIES times, sets
 * each aside and anchors nothing (1, err says why, no check may use it); with one that
 * stops after the first serving, it waits for a quiet second and anchors on the next; a
 * check is served again the same way; the last try runs all SC_ROUNDS processes (a try
 * cut short once contended: test_run_quiet_cut).
 * The parent's decode is lengthened until a serving is long enough to judge here. */
/* The cores this test process may use, put back after a test pinned it (also when its
 * assertions end it early: later tests count every core). */
static cpu_set_t all_cpus;
static int have_all_cpus;

static int restore_cpus(void **state)
{
    (void)state;
    if (have_all_cpus && sched_setaffinity(0, sizeof all_cpus, &all_cpus) != 0)
        return -1;
    have_all_cpus = 0;
    return 0;
}

static void test_served_anchor_contended(void **state)
{
    (void)state;
    arch p;
    wide_parent(&p, 4, 512);
    cm_target t = tiny_target();
    t.batch_size = 1;
    char err[512];
    cm_tables tb, anchored;
    sc_check sc;
    json_t *cal = open_served_check(&p, &t, 0, &tb, &sc);
    assert_true(sc.quiet_wait_s == MS_QUIET_WAIT_S);
    sc.quiet_wait_s = 1;
    /* the servings (fresh processes, which take the cores they may run on) on the first
       core: the spinner on the last then takes its share of the machine (which the
       built-in engine's judgment counts whole) without the spin-waits of a thread pool it
       would share cores with, which slow a serving tenfold */
    cpu_set_t first;
    assert_int_equal(sched_getaffinity(0, sizeof all_cpus, &all_cpus), 0);
    have_all_cpus = 1;
    CPU_ZERO(&first);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all_cpus)) {
            CPU_SET(c, &first);
            break;
        }
    assert_int_equal(sched_setaffinity(0, sizeof first, &first), 0);
    for (;;) {   /* quiet: each serving a judged one */
        if (sc_anchor(&sc, &tb, &anchored, err, sizeof err))
            fail_msg("anchor: %s", err);
        cm_tables_free(&anchored);
        json_t *hl = json_object_get(json_object_get(sc_doc(&sc), "anchor"), "host_load");
        assert_true(json_is_true(json_object_get(hl, "known")));
        if (!json_is_true(json_object_get(hl, "too_short")))
            break;
        assert_true(sc.t.output_tokens < 512);
        sc.t.output_tokens *= 2;   /* the serving's own target: decode steps per request */
    }
    assert_true(sc.parent_ms > 0);
    /* contended at every serving: no anchor */
    pid_t kid = spinner_start_on(600, 1);
    int rc = sc_anchor(&sc, &tb, &anchored, err, sizeof err);
    spinner_stop(kid);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "served beside other work each of 3 times"));
    assert_non_null(strstr(err, "other processes took"));
    assert_null(json_object_get(sc_doc(&sc), "anchor"));
    json_t *tries = json_object_get(sc_doc(&sc), "anchor_tries");
    assert_int_equal(json_array_size(tries), MS_QUIET_TRIES);
    for (size_t k = 0; k < MS_QUIET_TRIES; k++) {
        json_t *tr = json_array_get(tries, k);
        assert_true(json_number_value(json_object_get(tr, "parent_measured_ms")) > 0);
        assert_true(json_is_true(json_object_get(json_object_get(tr, "host_load"), "contended")));
        /* judged between its processes (cut short once a stretch long enough to judge was
           contended: here a process may be shorter), but the last try runs whole */
        size_t procs = json_array_size(json_object_get(tr, "process_latencies_ms"));
        if (k + 1 < MS_QUIET_TRIES)
            assert_true(procs >= 1 && procs <= SC_ROUNDS);
        else
            assert_int_equal(procs, SC_ROUNDS);
    }
    cm_prediction m;
    assert_int_equal(sc_measure(&sc, &p, NULL, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "needs the anchor first"));
    /* contended at the first serving only: the second anchors */
    spin_stop s = {&sc, spinner_start_on(600, 1), "anchor_tries"};
    sc.cancelled = stop_spinner_after_try;   /* what sc_open's hook arguments set */
    sc.cancel_ud = &s;
    rc = sc_anchor(&sc, &tb, &anchored, err, sizeof err);
    if (s.kid > 0)
        spinner_stop(s.kid);
    if (rc)
        fail_msg("anchor after a contended serving: %d %s", rc, err);
    /* set aside at least once (fresh processes make a serving long enough for other
       background work to count too: a second try may be set aside as well), then kept */
    tries = json_object_get(sc_doc(&sc), "anchor_tries");
    assert_true(json_array_size(tries) >= 1 && json_array_size(tries) < MS_QUIET_TRIES);
    assert_true(json_is_true(json_object_get(json_object_get(json_array_get(tries, 0), "host_load"), "contended")));
    json_t *an = json_object_get(sc_doc(&sc), "anchor");
    assert_non_null(an);
    assert_true(json_is_false(json_object_get(json_object_get(an, "host_load"), "contended")));
    assert_true(sc.parent_ms > 0);
    /* a check contended at its first servings: served again, the second kept */
    assert_int_equal(json_array_size(json_object_get(sc_doc(&sc), "check_tries")), 0);
    s = (spin_stop){&sc, spinner_start_on(600, 1), "check_tries"};
    rc = sc_measure(&sc, &p, NULL, &m, err, sizeof err);
    if (s.kid > 0)
        spinner_stop(s.kid);
    if (rc)
        fail_msg("check after a contended serving: %s", err);
    tries = json_object_get(sc_doc(&sc), "check_tries");
    assert_true(json_array_size(tries) >= 1 && json_array_size(tries) < MS_QUIET_TRIES);
    assert_true(json_is_true(json_object_get(json_object_get(json_array_get(tries, 0), "host_load"), "contended")));
    size_t procs = json_array_size(json_object_get(json_array_get(tries, 0), "process_latencies_ms"));
    assert_true(procs >= 1 && procs <= SC_ROUNDS);
    json_t *row = json_array_get(json_object_get(sc_doc(&sc), "checks"), 0);
    assert_non_null(row);
    assert_true(json_is_false(json_object_get(json_object_get(row, "host_load"), "contended")));
    assert_true(m.latency_ms > 0);
    sc_close(&sc);
    cm_tables_free(&anchored);
    cm_tables_free(&tb);
    json_decref(cal);
    arch_free(&p);
}

/* cal_get_or_run under dir calibrates (not beside other work), then reuses that. */
static void calibrated_then_reused(const char *dir, const arch *p, const cm_target *t, const cal_opts *o)
{
    char err[512];
    int reused = -1;
    json_t *cal = cal_get_or_run(dir, p, t, o, &reused, err, sizeof err);
    if (!cal)
        fail_msg("calibrate: %s", err);
    assert_int_equal(reused, 0);
    assert_true(json_is_false(json_object_get(json_object_get(cal, "host_load"), "contended")));
    json_decref(cal);
    cal = cal_get_or_run(dir, p, t, o, &reused, err, sizeof err);
    assert_non_null(cal);
    assert_int_equal(reused, 1);
    json_decref(cal);
}

/* The processes spinning beside a calibration (cal_opts.aside stops them when asked) and
 * the calibrations set aside. */
typedef struct {
    pid_t kids[8];
    int n, asides, stop_at_aside;
} cal_spin;

static void cal_spin_start(cal_spin *c, int n, int stop_at_aside)
{
    *c = (cal_spin){.n = n, .stop_at_aside = stop_at_aside};
    for (int i = 0; i < n; i++)
        c->kids[i] = spinner_start(600);
}

static void cal_spin_stop(cal_spin *c)
{
    for (int i = 0; i < c->n; i++)
        spinner_stop(c->kids[i]);
    c->n = 0;
}

static void cal_spin_aside(void *ud, const json_t *tried, const char *load)
{
    cal_spin *c = ud;
    assert_non_null(strstr(load, "other processes took"));
    assert_true(json_is_true(json_object_get(json_object_get(tried, "host_load"), "contended")));
    c->asides++;
    if (c->stop_at_aside)
        cal_spin_stop(c);
}

/* A calibration made beside other work is made again, and one made so each time is not
 * reused. The calibration runs on one thread beside one spinning process more than the
 * machine has cores, so each of its stretches is judged contended (others keep 1.5 of 2
 * cores busy where its thread leaves 1); the parent's decode is lengthened until a quiet
 * calibration is long enough to judge here.
 * - Spinning throughout: CAL_QUIET_TRIES calibrations, the first set aside (in
 *   calibration_tries and told to the aside hook), the last returned with a contended
 *   host_load and a note that says it is not reused.
 * - Cached so, it is not reused: an estimate finds no calibration and says why, the next
 *   cal_get_or_run calibrates again (quiet now), and the one after that reuses the quiet
 *   one, as does the estimate.
 * - Spinning until the first is set aside: the second is kept, not contended. */
static void test_calibrate_contended(void **state)
{
    (void)state;
    char dir[] = "/tmp/ac_cal_contended_XXXXXX";
    assert_non_null(mkdtemp(dir));
    arch p;
    wide_parent(&p, 2, 256);
    cm_target t = tiny_target();
    t.batch_size = 1;
    t.output_tokens = 32;
    cal_opts o;
    cal_opts_default(&o);
    assert_int_equal(o.quiet_tries, CAL_QUIET_TRIES);
    assert_true(o.quiet_wait_s == MS_QUIET_WAIT_S);
    o.reps = 1;
    o.n_models = 1;
    o.validate = 2;
    o.validate_reps = 1;
    o.threads = eng_cpu_default_threads();   /* given, as estimates serve (their env's cores) */
    o.quiet_wait_s = 0.5;
    o.aside = cal_spin_aside;
    cal_spin spin = {0};
    o.ud = &spin;
    char err[512];
    json_t *cal;
    for (;;) {   /* quiet: long enough to judge */
        cal = cal_run(&p, &t, &o, err, sizeof err);
        if (!cal)
            fail_msg("cal_run: %s", err);
        json_t *hl = json_object_get(cal, "host_load");
        assert_true(json_is_false(json_object_get(hl, "contended")));
        assert_null(json_object_get(cal, "calibration_tries"));
        if (!json_is_true(json_object_get(hl, "too_short")))
            break;
        json_decref(cal);
        assert_true(t.output_tokens < 1024);
        t.output_tokens *= 2;
    }
    json_decref(cal);
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    assert_true(cores >= 1 && cores < 8);
    /* contended each time */
    cal_spin_start(&spin, cores + 1, 0);
    cal = cal_run(&p, &t, &o, err, sizeof err);
    cal_spin_stop(&spin);
    if (!cal)
        fail_msg("cal_run: %s", err);
    assert_int_equal(spin.asides, CAL_QUIET_TRIES - 1);
    assert_true(json_is_true(json_object_get(json_object_get(cal, "host_load"), "contended")));
    json_t *tries = json_object_get(cal, "calibration_tries");
    assert_int_equal(json_array_size(tries), CAL_QUIET_TRIES - 1);
    json_t *tried = json_array_get(tries, 0);
    assert_true(json_is_true(json_object_get(json_object_get(tried, "host_load"), "contended")));
    assert_true(json_number_value(json_object_get(tried, "wall_s")) >= 1);
    /* stopped at its first step judged contended (the last try runs whole) */
    assert_true(json_is_true(json_object_get(tried, "cut_short")));
    assert_null(json_object_get(tried, "latency_mape_pct"));
    assert_true(json_is_number(json_object_get(json_object_get(cal, "validation"), "latency_mape_pct")));
    print_message("calibration at %d decode steps beside %d spinners: set aside after %.2f s, kept after %.2f s "
                  "(others %.0f%% of the cores)\n",
                  t.output_tokens, cores + 1, json_number_value(json_object_get(tried, "wall_s")),
                  json_number_value(json_object_get(cal, "wall_s")),
                  json_number_value(json_object_get(json_object_get(cal, "host_load"), "others_cpu_pct")));
    char msg[600];
    assert_int_equal(cal_contended_note(cal, msg, sizeof msg), 1);
    assert_non_null(strstr(msg, "each time it was made"));
    assert_non_null(strstr(msg, "not reused"));
    /* cached so: calibrated again, then the quiet one reused */
    if (cm_calibration_save(dir, cal, err, sizeof err))
        fail_msg("save: %s", err);
    json_decref(cal);
    json_t *est = NULL;   /* nor does an estimate use it */
    assert_int_equal(cm_estimate(&p, &t, dir, &est, err, sizeof err), CM_EST_UNCALIBRATED);
    assert_null(est);
    assert_non_null(strstr(err, "made beside other work and is not reused"));
    calibrated_then_reused(dir, &p, &t, &o);
    if (cm_estimate(&p, &t, dir, &est, err, sizeof err) != CM_EST_OK)
        fail_msg("estimate: %s", err);
    json_decref(est);
    /* contended until the first is set aside: the second kept */
    cal_spin_start(&spin, cores + 1, 1);
    cal = cal_run(&p, &t, &o, err, sizeof err);
    cal_spin_stop(&spin);
    if (!cal)
        fail_msg("cal_run: %s", err);
    assert_int_equal(spin.asides, 1);
    assert_int_equal(json_array_size(json_object_get(cal, "calibration_tries")), 1);
    assert_true(json_is_false(json_object_get(json_object_get(cal, "host_load"), "contended")));
    assert_int_equal(cal_contended_note(cal, msg, sizeof msg), 0);
    json_decref(cal);
    arch_free(&p);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_estimate_needs_calibration(void **state)
{
    (void)state;
    char dir[] = "/tmp/ac_costmodel_XXXXXX";
    assert_non_null(mkdtemp(dir));
    arch p;
    tiny_parent(&p, 2);
    cm_target t = tiny_target();
    char err[512];
    json_t *est = NULL;
    assert_int_equal(cm_estimate(&p, &t, dir, &est, err, sizeof err), CM_EST_UNCALIBRATED);
    assert_null(est);
    char id[40];
    cm_calibration_id(&t, &p, id);
    assert_non_null(strstr(err, id));
    /* calibrate (cached), then the same request answers */
    cal_opts o;
    cal_opts_default(&o);
    o.reps = 1;
    o.n_models = 1;
    o.validate = 0;
    calibrated_then_reused(dir, &p, &t, &o);
    if (cm_estimate(&p, &t, dir, &est, err, sizeof err) != CM_EST_OK)
        fail_msg("estimate: %s", err);
    assert_string_equal(json_string_value(json_object_get(est, "calibration_id")), id);
    json_t *pred = json_object_get(est, "predicted");
    assert_true(json_number_value(json_object_get(pred, "latency_ms")) > 0);
    assert_int_equal(json_integer_value(json_object_get(est, "params")), arch_params(&p));
    json_t *mem = json_object_get(pred, "memory_bytes");
    assert_true(json_integer_value(json_object_get(mem, "total")) >
                json_integer_value(json_object_get(est, "naive_weights_plus_kv_bytes")));
    json_decref(est);
    /* a pruned arch is covered by the parent's calibration */
    p.layers[1].n_heads = 0;
    p.layers[1].n_kv_heads = 0;
    p.layers[0].ffn_dim = 40;
    if (cm_estimate(&p, &t, dir, &est, err, sizeof err) != CM_EST_OK)
        fail_msg("estimate (pruned): %s", err);
    json_decref(est);
    /* but only where it was measured: the same calibration made on another thread count
     * (or BLAS kernel, wait policy, llama.cpp build, flash attention ...), or by a build
     * that did not record where, covers nothing here */
    char path[4096], env[1024];
    assert_int_equal(cm_calibration_path(dir, id, path, sizeof path), 0);
    json_t *cal = cm_calibration_load(dir, id, err, sizeof err);
    assert_non_null(cal);
    cm_calibration_env(&t, 0, env, sizeof env);
    assert_string_equal(json_string_value(json_object_get(cal, "env")), env);
    cm_calibration_env(&t, eng_cpu_default_threads() + 3, env, sizeof env);
    json_object_set_new(cal, "env", json_string(env));
    assert_int_equal(cm_calibration_save(dir, cal, err, sizeof err), 0);
    assert_int_equal(cm_estimate(&p, &t, dir, &est, err, sizeof err), CM_EST_UNCALIBRATED);
    json_object_del(cal, "env");
    assert_int_equal(cm_calibration_save(dir, cal, err, sizeof err), 0);
    assert_int_equal(cm_estimate(&p, &t, dir, &est, err, sizeof err), CM_EST_UNCALIBRATED);
    json_decref(cal);
    arch_free(&p);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* One peak rule for every measurement: on CPU the larger of the backend's peak and the RSS
 * high water above the RSS before the model; an unknown RSS leaves the backend's. */
static void test_peak_rule(void **state)
{
    (void)state;
    char err[256];
    eng_backend *be = eng_backend_new("cpu", err, sizeof err);
    assert_non_null(be);
    void *buf = be->alloc(be, 1 << 20);
    assert_non_null(buf);
    be->free(be, buf, 1 << 20);
    int64_t bp = (int64_t)be->peak_bytes;
    assert_true(bp >= 1 << 20);
    ms_result r;
    ms_peak_open(be);
    ms_peak_close(be, 1000, 1000 + 3 * bp, &r);
    assert_int_equal(r.backend_peak_bytes, bp);
    assert_int_equal(r.rss_delta_bytes, 3 * bp);
    assert_int_equal(r.peak_bytes, 3 * bp);
    ms_peak_close(be, 1000, 1000 + bp / 2, &r);
    assert_int_equal(r.peak_bytes, bp);
    ms_peak_close(be, -1, 5 * bp, &r);
    assert_int_equal(r.rss_delta_bytes, -1);
    assert_int_equal(r.peak_bytes, bp);
    eng_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grids),
        cmocka_unit_test(test_peak_rule),
        cmocka_unit_test(test_memory_matches_engine_accounting),
        cmocka_unit_test(test_memory_matches_engine_accounting_moe),
        cmocka_unit_test(test_memory_matches_engine_accounting_latent),
        cmocka_unit_test(test_counts_below_top_k),
        cmocka_unit_test(test_mamba_axis_in_blocks),
        cmocka_unit_test(test_heads_axis_keeps_parent),
        cmocka_unit_test(test_fit_archs),
        cmocka_unit_test(test_served_anchor_builtin),
        cmocka_unit_test(test_run_quiet),
        cmocka_unit_test(test_run_quiet_cut),
        cmocka_unit_test_teardown(test_served_anchor_contended, restore_cpus),
        cmocka_unit_test(test_measure_cancel),
        cmocka_unit_test(test_calibrate_cancel),
        cmocka_unit_test(test_calibrate_contended),
        cmocka_unit_test(test_host_load),
        cmocka_unit_test(test_estimate_needs_calibration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
