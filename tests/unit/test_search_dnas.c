/* tests/unit/test_search_dnas.c — the DNAS search end to end on a tiny random model with
 * a real (small) calibration: a parent that meets the limits comes back whole, limits no
 * arch can meet fail early naming the cheapest costs, and a parameter limit at 60% of
 * the parent yields an arch under the limit and close to it, for both methods' shared
 * grid. Parameter limits are exact, so the assertions do not depend on timing noise.
 * A Mixtral parent: the search chooses an expert count per layer (top-k capped at it) under
 * the limit, and with expert widths an expert count and width per layer among the widths
 * the calibration priced; Minitron++ keeps one count (and width) in every layer. A Qwen2-MoE
 * parent: a shared-expert width per layer, priced from the calibration's shared entries. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "compress/calibrate.h"
#include "compress/dnas.h"
#include "compress/method.h"
#include "compress/minitron.h"
#include "compress/search.h"
#include "engine/rng.h"

typedef struct {
    eng_backend *be;
    eng_model parent;
    cm_tables tables;
    td_stream data;
} world;

static int setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    w->be = eng_backend_cpu_new(1);
    assert_non_null(w->be);
    arch a;
    assert_int_equal(arch_init(&a, 4), 0);
    snprintf(a.family, sizeof a.family, "llama");
    a.vocab_size = 96;
    a.hidden_size = 32;
    a.head_dim = 8;
    a.max_position_embeddings = 256;
    a.rope_theta = 10000;
    a.norm_eps = 1e-5;
    a.tie_word_embeddings = 1;
    for (int l = 0; l < 4; l++) {
        a.layers[l].source_layer = l;
        a.layers[l].n_heads = 4;
        a.layers[l].n_kv_heads = 2;
        a.layers[l].ffn_dim = 64;
    }
    char err[512];
    assert_int_equal(eng_model_init(&w->parent, &a, w->be, err, sizeof err), 0);
    eng_model_randomize(&w->parent, 7, 0.2f);
    cm_target t = {.device = "cpu", .precision = "fp32", .batch_size = 1, .prompt_tokens = 16, .output_tokens = 4};
    cal_opts o;
    cal_opts_default(&o);
    o.reps = 1;
    o.warmup = 0;
    o.n_models = 1;
    o.validate = 0;
    json_t *cal = cal_run(&a, &t, &o, err, sizeof err);
    if (!cal)
        fail_msg("calibration failed: %s", err);
    assert_int_equal(cm_calibration_tables(cal, &w->tables, err, sizeof err), 0);
    json_decref(cal);
    arch_free(&a);
    w->data.n = 4096;
    w->data.ids = malloc(w->data.n * sizeof(int));
    assert_non_null(w->data.ids);
    uint64_t s = 99;
    for (size_t i = 0; i < w->data.n; i++)
        w->data.ids[i] = (int)(eng_xorshift64star(&s) % 96);
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    world *w = *state;
    td_stream_free(&w->data);
    cm_tables_free(&w->tables);
    eng_model_free(&w->parent);
    eng_backend_free(w->be);
    free(w);
    return 0;
}

static void opts(world *w, dnas_opts *o)
{
    dnas_opts_defaults(o);
    o->parent = &w->parent;
    o->tables = &w->tables;
    o->axes.heads = o->axes.ffn = o->axes.depth = 1;
    o->data = &w->data;
    o->batch = 2;
    o->seq = 32;
    o->search_tokens = 2 * 32 * 12;
}

static void test_parent_meets_limits(void **state)
{
    world *w = *state;
    dnas_opts o;
    opts(w, &o);
    o.limits.params = 1e12;
    dnas_result r;
    char err[1024];
    assert_int_equal(dnas_run(&o, &r, err, sizeof err), 0);
    assert_true(r.parent_feasible);
    assert_true(arch_equal(&r.arch, &w->parent.a));
    assert_int_equal(r.selection_tokens, 0);
    dnas_result_free(&r);
}

static void test_infeasible_names_cheapest(void **state)
{
    world *w = *state;
    dnas_opts o;
    opts(w, &o);
    o.limits.params = 100;   /* below the embedding alone */
    dnas_result r;
    char err[1024] = "";
    assert_int_equal(dnas_run(&o, &r, err, sizeof err), -1);
    printf("error: %s\n", err);
    assert_non_null(strstr(err, "cheapest"));
    assert_non_null(strstr(err, "params"));
}

/* A limit that only the model without layers meets (the embedding and the final norm,
 * and a few parameters more): no check is served, and the search says no arch keeps a
 * layer, before spending its budget, rather than returning the empty model (the old
 * feasibility test priced the cheapest choice with depth searched as no layers at all). */
static void test_no_empty_model(void **state)
{
    world *w = *state;
    dnas_opts o;
    opts(w, &o);
    o.limits.params = 96 * 32 + 32 + 40;
    dnas_result r;
    char err[1024] = "";
    int rc = dnas_run(&o, &r, err, sizeof err);
    if (rc == 0)
        fail_msg("returned an arch of %d layers", r.arch.n_layers);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, "cheapest"));
    assert_int_equal(r.selection_tokens, 0);
    /* the job's early check says the same */
    char e2[512];
    assert_int_equal(method_check_feasible(&w->parent.a, &w->tables, &o.limits, &o.axes, e2, sizeof e2), -1);
}

static void test_params_limit_sits_at_limit(void **state)
{
    world *w = *state;
    dnas_opts o;
    opts(w, &o);
    double parent = (double)arch_params(&w->parent.a);
    o.limits.params = 0.6 * parent;
    dnas_result r;
    char err[1024];
    assert_int_equal(dnas_run(&o, &r, err, sizeof err), 0);
    double got = (double)arch_params(&r.arch);
    char s[1024];
    arch_summary(&r.arch, s, sizeof s);
    printf("chosen %s: %.0f params (limit %.0f, parent %.0f), %lld selection tokens\n", s, got, o.limits.params,
           parent, (long long)r.selection_tokens);
    printf("final expected-cost gap on params: %+.3f\n", r.final_gap[SM_PARAMS]);
    assert_false(r.parent_feasible);
    assert_true(got <= o.limits.params);
    assert_true((double)r.predicted.params <= o.limits.params);
    assert_true(got >= 0.9 * o.limits.params);   /* the grow step leaves little slack */
    assert_int_equal(r.selection_tokens, o.search_tokens);
    assert_int_equal(arch_validate(&r.arch, err, sizeof err), 0);
    dnas_result_free(&r);
}

/* A served check that measures `factor` times the tables' prediction (an engine the
 * tables under- or over-price), counting its calls; factor 0 fails. */
typedef struct {
    double factor;
    int calls;
    double first;   /* the first arch's measured latency */
    double memory_limit, params_limit;   /* bytes and parameters served at or under them: */
    double held_memory, held_params;     /* the largest such served (exact: as predicted) */
} fake_engine;

static int fake_check(void *ud, const arch *a, const cm_prediction *pred, cm_prediction *m, char *err, size_t errlen)
{
    fake_engine *f = ud;
    f->calls++;
    if (f->factor <= 0) {
        snprintf(err, errlen, "llama.cpp helper died");
        return -1;
    }
    *m = *pred;
    m->latency_ms = pred->latency_ms * f->factor;
    if (f->calls == 1)
        f->first = m->latency_ms;
    m->decode_ms = pred->decode_ms * f->factor;
    m->params = arch_params(a);
    if ((double)m->total <= f->memory_limit && (double)m->total > f->held_memory)
        f->held_memory = (double)m->total;
    if ((double)m->params <= f->params_limit && (double)m->params > f->held_params)
        f->held_params = (double)m->params;
    return 0;
}

/* The arch the prediction accepts is served; measured over the latency limit it is
 * repaired until a check holds (the tables 30% under the engine: two or three checks);
 * measured within with room (the tables 10% over the engine), the target is loosened and
 * the larger arch served in turn, the result measured within and no smaller than the
 * first; a failing check fails the search. */
static void test_served_check_repairs(void **state)
{
    world *w = *state;
    dnas_opts o;
    opts(w, &o);
    cm_prediction pp;
    char err[1024] = "";
    assert_int_equal(cm_predict(&w->tables, &w->parent.a, &pp, err, sizeof err), 0);
    o.check = fake_check;
    dnas_result r;
    /* at several limits, so that the first arch served sits at different distances under
     * its target (the space is discrete): each repair must bring the next one within */
    for (int i = 0; i < 6; i++) {
        o.limits.latency_ms = (0.6 + 0.05 * i) * pp.latency_ms;
        fake_engine slow = {.factor = 1.3};
        o.check_ud = &slow;
        assert_int_equal(dnas_run(&o, &r, err, sizeof err), 0);
        printf("tables 30%% under, limit %.2f of the parent: %d checks, predicted %.4f ms, measured %.4f ms, limit "
               "%.4f ms, within %d\n", 0.6 + 0.05 * i, r.checks, r.predicted.latency_ms, 1.3 * r.predicted.latency_ms,
               o.limits.latency_ms, r.checked_within);
        assert_int_equal(r.checks, slow.calls);
        assert_true(r.checks >= 2 && r.checks <= DNAS_CHECKS);
        assert_true(r.checked_within);
        assert_true(1.3 * r.predicted.latency_ms <= o.limits.latency_ms);
        dnas_result_free(&r);
    }
    o.limits.latency_ms = 0.75 * pp.latency_ms;

    fake_engine fast = {.factor = 0.9};
    o.check_ud = &fast;
    assert_int_equal(dnas_run(&o, &r, err, sizeof err), 0);
    printf("tables 10%% over: %d checks, first served %.4f ms, returned predicted %.4f measured %.4f ms, limit "
           "%.4f ms\n", r.checks, fast.first, r.predicted.latency_ms, 0.9 * r.predicted.latency_ms,
           o.limits.latency_ms);
    assert_int_equal(r.checks, fast.calls);
    assert_true(r.checks >= 2 && r.checks <= DNAS_CHECKS);
    assert_true(r.checked_within);
    assert_true(0.9 * r.predicted.latency_ms <= 0.99 * o.limits.latency_ms);
    assert_true(0.9 * r.predicted.latency_ms >= fast.first);
    dnas_result_free(&r);

    /* served 50x slower than predicted: no arch of the space meets the limit as served;
     * the last arch served comes back, marked as measured over it */
    fake_engine hopeless = {.factor = 50};
    o.check_ud = &hopeless;
    assert_int_equal(dnas_run(&o, &r, err, sizeof err), 0);
    printf("50x: %d checks, last within %d, %d layers\n", r.checks, r.checked_within, r.arch.n_layers);
    assert_true(r.checks >= 1 && r.checks <= DNAS_CHECKS);
    assert_false(r.checked_within);
    assert_true(r.arch.n_layers >= 1);
    assert_int_equal(arch_validate(&r.arch, err, sizeof err), 0);
    dnas_result_free(&r);

    fake_engine dead = {.factor = 0};
    o.check_ud = &dead;
    assert_int_equal(dnas_run(&o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "helper died"));
}

/* Memory and parameters are served exactly as predicted (the engine's byte accounting, a
 * count): an arch served at or under such a limit holds it, and the search never gives one
 * up for a smaller arch (a 1% slack meant for timings' noise made it drop archs served
 * within the last 1% of the limit). */
static void test_served_check_exact_limits(void **state)
{
    world *w = *state;
    dnas_opts o;
    opts(w, &o);
    cm_prediction pp;
    char err[1024] = "";
    assert_int_equal(cm_predict(&w->tables, &w->parent.a, &pp, err, sizeof err), 0);
    o.check = fake_check;
    int dropped = 0;
    for (int i = 0; i < 16; i++) {
        double frac = 0.55 + 0.02 * i;
        dnas_result r;
        fake_engine exact = {.factor = 1.0};
        o.check_ud = &exact;
        o.limits = (dnas_limits){0};
        if (i % 2) {
            /* the weights' share cut (the engine's scratch, larger in a sanitized build, stays) */
            o.limits.memory_bytes = exact.memory_limit = (double)pp.total - (1 - frac) * (double)pp.weights;
        } else {
            o.limits.params = exact.params_limit = frac * (double)pp.params;
        }
        if (dnas_run(&o, &r, err, sizeof err) != 0)
            fail_msg("%s limit %.2f of the parent: %s", i % 2 ? "memory" : "params", frac, err);
        double got = i % 2 ? (double)r.predicted.total : (double)r.predicted.params;
        double held = i % 2 ? exact.held_memory : exact.held_params;
        printf("exact %s limit %.2f of the parent: %d checks, kept %.0f, largest served within %.0f\n",
               i % 2 ? "memory" : "params", frac, r.checks, got, held);
        assert_true(r.checked_within && got <= (i % 2 ? o.limits.memory_bytes : o.limits.params));
        dropped += got < held;
        dnas_result_free(&r);
    }
    assert_int_equal(dropped, 0);
}

/* Minitron++ frontier: uniform, feasible, largest first. */
static void test_minitron_frontier(void **state)
{
    world *w = *state;
    mn_opts o = {.parent = &w->parent.a, .tables = &w->tables, .max_candidates = 3};
    o.axes.heads = o.axes.ffn = o.axes.depth = 1;
    o.limits.params = 0.6 * (double)arch_params(&w->parent.a);
    arch *c = NULL;
    int n = 0;
    char err[1024];
    assert_int_equal(mn_frontier(&o, &c, &n, err, sizeof err), 0);
    assert_true(n >= 1 && n <= 3);
    for (int i = 0; i < n; i++) {
        char sm[512];
        arch_summary(&c[i], sm, sizeof sm);
        printf("candidate %d: %s (%lld params)\n", i, sm, (long long)arch_params(&c[i]));
        if (i)
            assert_true(arch_params(&c[i]) <= arch_params(&c[i - 1]));
    }
    for (int i = 0; i < n; i++) {
        assert_true(arch_is_uniform(&c[i]));
        assert_true((double)arch_params(&c[i]) <= o.limits.params);
        arch_free(&c[i]);
    }
    free(c);
}

/* An export that keeps the query heads (DeciLM, an MoE family's own config): every
 * Minitron++ candidate keeps the parent's 4 per layer, as DNAS's space allows, however
 * tight the limit. The old frontier filtered heads only when the heads axis was off and
 * offered 2-head candidates the export then refused. */
static void test_minitron_keeps_query_heads(void **state)
{
    world *w = *state;
    mn_opts o = {.parent = &w->parent.a, .tables = &w->tables, .max_candidates = 4};
    o.axes.heads = o.axes.ffn = o.axes.depth = 1;
    o.axes.keep_query_heads = 1;
    o.limits.params = 0.5 * (double)arch_params(&w->parent.a);
    arch *c = NULL;
    int n = 0;
    char err[1024];
    assert_int_equal(mn_frontier(&o, &c, &n, err, sizeof err), 0);
    assert_true(n >= 1);
    for (int i = 0; i < n; i++) {
        char sm[512];
        arch_summary(&c[i], sm, sizeof sm);
        for (int l = 0; l < c[i].n_layers; l++)
            if (c[i].layers[l].n_heads != 4)
                fail_msg("candidate %d: %s", i, sm);
        arch_free(&c[i]);
    }
    free(c);
}

/* The memory tables price the parent's choice, and a choice with one layer removed, as
 * the full prediction does, when the KV cache's fitted line has an intercept (1 MB here):
 * the intercept is counted once, not once for each layer with a cache. */
static void test_memory_table_intercept(void **state)
{
    world *w = *state;
    int64_t b0 = w->tables.mem.kv_overhead_bytes;
    w->tables.mem.kv_overhead_bytes = 1000000;
    dnas_limits lim = {.memory_bytes = 1e12};
    dnas_axes ax = {.heads = 1, .ffn = 1, .depth = 1};
    search_space sp;
    search_costs costs;
    char err[512];
    if (dnas_space_build(&w->parent.a, &w->tables, &lim, &ax, &sp, &costs, err, sizeof err))
        fail_msg("search space: %s", err);
    search_choice c;
    assert_int_equal(search_choice_init(&c, &sp), 0);
    search_choice_parent(&sp, &c);
    for (int drop = -1; drop < 1; drop++) {
        if (drop >= 0)
            c.keep[drop] = 0;
        arch a;
        cm_prediction p;
        assert_int_equal(search_choice_arch(&sp, &c, &w->parent.a, &a), 0);
        assert_int_equal(cm_predict(&w->tables, &a, &p, err, sizeof err), 0);
        double table = search_choice_cost(&sp, &costs.t[SM_MEMORY], &c);
        if (fabs(table - (double)p.total) > 1e-6 * (double)p.total)
            fail_msg("%d layers: the tables price %.0f bytes, the prediction %lld", a.n_layers, table,
                     (long long)p.total);
        arch_free(&a);
    }
    search_choice_free(&c);
    dnas_space_free(&sp, &costs);
    w->tables.mem.kv_overhead_bytes = b0;
}

/* A parent of 3 layers of 4 heads and an MoE shaped as e (family fam), random weights, and
 * its calibration (one model, no held-out archs). */
static void moe_parent(world *w, const char *fam, arch_moe e, arch *a, eng_model *m, cm_tables *tb)
{
    assert_int_equal(arch_init(a, 3), 0);
    *a = (arch){.vocab_size = 96, .hidden_size = 32, .head_dim = 8, .max_position_embeddings = 256,
                .rope_theta = 10000, .norm_eps = 1e-5, .tie_word_embeddings = 1, .n_layers = 3, .layers = a->layers,
                .attention_bias = !strcmp(fam, "qwen2_moe")};
    snprintf(a->family, sizeof a->family, "%s", fam);
    for (int l = 0; l < 3; l++)
        a->layers[l] = (arch_layer){.source_layer = l, .n_heads = 4, .n_kv_heads = 2, .moe = e};
    char err[1024];
    assert_int_equal(eng_model_init(m, a, w->be, err, sizeof err), 0);
    eng_model_randomize(m, 5, 0.3f);
    cm_target t = {.device = "cpu", .precision = "fp32", .batch_size = 1, .prompt_tokens = 16, .output_tokens = 4};
    cal_opts co;
    cal_opts_default(&co);
    co.reps = 1;
    co.warmup = 0;
    co.n_models = 1;
    co.validate = 0;
    co.fit = 0;
    json_t *cal = cal_run(a, &t, &co, err, sizeof err);
    if (!cal)
        fail_msg("calibration failed: %s", err);
    assert_int_equal(cm_calibration_tables(cal, tb, err, sizeof err), 0);
    json_decref(cal);
}

/* Minitron++'s frontier under mo: at least one candidate, each within mo's parameter limit,
 * every MoE layer of a candidate shaped as its first (one count, width and shared width). */
static void uniform_frontier(const mn_opts *mo)
{
    char err[1024];
    arch *c = NULL;
    int n = 0;
    assert_int_equal(mn_frontier(mo, &c, &n, err, sizeof err), 0);
    assert_true(n >= 1);
    for (int i = 0; i < n; i++) {
        const arch_moe *f = &c[i].layers[0].moe;
        for (int l = 0; l < c[i].n_layers; l++) {
            const arch_moe *e = &c[i].layers[l].moe;
            assert_true(e->n_experts == f->n_experts && e->top_k == f->top_k &&
                        e->expert_ffn_dim == f->expert_ffn_dim && e->shared_ffn_dim == f->shared_ffn_dim &&
                        e->latent_dim == f->latent_dim);
        }
        assert_true(arch_params(&c[i]) <= mo->limits.params);
        arch_free(&c[i]);
    }
    free(c);
}

/* A ranked-free Mixtral parent of 3 layers, 6 experts (top 2) each, and its calibration. */
static void test_moe_expert_counts(void **state)
{
    world *w = *state;
    arch a;
    eng_model m;
    cm_tables tb;
    moe_parent(w, "mixtral", (arch_moe){.n_experts = 6, .top_k = 2, .expert_ffn_dim = 16, .norm_topk = 1}, &a, &m, &tb);
    char err[1024];
    dnas_opts o;
    opts(w, &o);
    o.parent = &m;
    o.tables = &tb;
    o.axes = (dnas_axes){.experts = 1};
    double parent = (double)arch_params(&a);
    o.limits.params = 0.7 * parent;
    dnas_result r;
    assert_int_equal(dnas_run(&o, &r, err, sizeof err), 0);
    char s[1024];
    arch_summary(&r.arch, s, sizeof s);
    printf("MoE: chosen %s: %.0f params (limit %.0f, parent %.0f)\n", s, (double)arch_params(&r.arch),
           o.limits.params, parent);
    assert_true(arch_params(&r.arch) <= o.limits.params && arch_params(&r.arch) >= 0.85 * o.limits.params);
    assert_int_equal(arch_validate(&r.arch, err, sizeof err), 0);
    int total = 0;
    for (int l = 0; l < r.arch.n_layers; l++) {
        const arch_layer *y = &r.arch.layers[l];
        assert_int_equal(y->n_heads, 4);   /* heads not searched */
        assert_int_equal(y->ffn_dim, 0);
        if (y->moe.n_experts) {
            assert_true(y->moe.n_experts <= 6);
            assert_int_equal(y->moe.top_k, y->moe.n_experts < 2 ? y->moe.n_experts : 2);
            assert_int_equal(y->moe.expert_ffn_dim, 16);
        }
        total += y->moe.n_experts;
    }
    assert_true(total < 18);
    json_t *layers = json_object_get(r.distribution, "layers");
    assert_non_null(json_object_get(json_array_get(layers, 0), "experts"));
    dnas_result_free(&r);
    /* Minitron++: one expert count for every layer */
    mn_opts mo = {.parent = &a, .tables = &tb, .max_candidates = 3, .limits = {.params = 0.7 * parent},
                  .axes = {.experts = 1}};
    uniform_frontier(&mo);
    /* expert widths too: the space pairs every count with the priced widths (4, 8, 12 and the
       parent's 16 units), ascending in expert units; both methods choose among them */
    search_space sp;
    search_costs costs;
    dnas_axes ax = {.experts = 1, .expert_widths = 1};
    assert_int_equal(dnas_space_build(&a, &tb, &o.limits, &ax, &sp, &costs, err, sizeof err), 0);
    assert_int_equal(sp.n_exp, 6 * 4);
    for (int j = 1; j < sp.n_exp; j++)
        assert_true(sp.exp[j - 1] * (sp.expw[j - 1] ? sp.expw[j - 1] : 16) <= sp.exp[j] * (sp.expw[j] ? sp.expw[j] : 16));
    assert_true(sp.exp[sp.n_exp - 1] == 6 && sp.expw[sp.n_exp - 1] == 0);   /* the parent's last */
    dnas_space_free(&sp, &costs);
    o.axes = ax;
    o.limits.params = 0.6 * parent;
    assert_int_equal(dnas_run(&o, &r, err, sizeof err), 0);
    arch_summary(&r.arch, s, sizeof s);
    printf("MoE with expert widths: chosen %s: %.0f params (limit %.0f)\n", s, (double)arch_params(&r.arch),
           o.limits.params);
    assert_true(arch_params(&r.arch) <= o.limits.params && arch_params(&r.arch) >= 0.85 * o.limits.params);
    assert_int_equal(arch_validate(&r.arch, err, sizeof err), 0);
    for (int l = 0; l < r.arch.n_layers; l++) {
        int fe = r.arch.layers[l].moe.expert_ffn_dim;
        assert_true(fe == 4 || fe == 8 || fe == 12 || fe == 16);
    }
    json_t *ch = json_object_get(json_array_get(json_object_get(r.distribution, "layers"), 0), "experts");
    int widths = 0;
    for (size_t i = 0; i < json_array_size(ch); i++)
        widths += json_object_get(json_array_get(ch, i), "width") != NULL;
    assert_int_equal(widths, 6 * 3);   /* the narrower choices name their width */
    dnas_result_free(&r);
    mo.axes = ax;
    mo.limits.params = 0.6 * parent;
    uniform_frontier(&mo);
    cm_tables_free(&tb);
    eng_model_free(&m);
    arch_free(&a);
}

/* A Qwen2-MoE parent with a shared expert (24 units beside 6 experts of 16): the calibration
 * prices the shared expert at 6, 12 and 18 units beside the parent's experts; the cost model
 * carries the measured difference to every count; the space pairs each count with every
 * shared width; DNAS chooses a shared width per layer among them and Minitron++ one for the
 * model. */
static void test_moe_shared_widths(void **state)
{
    world *w = *state;
    arch a;
    eng_model m;
    cm_tables tb;
    moe_parent(w, "qwen2_moe", (arch_moe){.n_experts = 6, .top_k = 2, .expert_ffn_dim = 16, .shared_ffn_dim = 24}, &a,
               &m, &tb);
    char err[1024];
    int sw[8], nsw = cm_moe_shared_widths(&tb, &a.layers[0].moe, sw, 8);
    assert_int_equal(nsw, 4);
    assert_true(sw[0] == 6 && sw[1] == 12 && sw[2] == 18 && sw[3] == 24);
    /* 3 experts with a 12-unit shared expert: priced at 24 units plus the difference measured
       between 24 and 12 beside the parent's 6 experts */
    arch_moe e3 = arch_moe_keep(&a.layers[0].moe, 3), e3s = e3, e6s = a.layers[0].moe;
    e3s.shared_ffn_dim = e6s.shared_ffn_dim = 12;
    double p3, d3, p3s, d3s, p6, d6, p6s, d6s;
    assert_int_equal(cm_moe_cost(&tb, 32, &e3, &p3, &d3, NULL), 0);
    assert_int_equal(cm_moe_cost(&tb, 32, &e3s, &p3s, &d3s, NULL), 0);
    assert_int_equal(cm_moe_cost(&tb, 32, &a.layers[0].moe, &p6, &d6, NULL), 0);
    assert_int_equal(cm_moe_cost(&tb, 32, &e6s, &p6s, &d6s, NULL), 0);
    assert_true(fabs(p3s - (p3 + p6s - p6)) < 1e-9 * (1 + fabs(p3)) && fabs(d3s - (d3 + d6s - d6)) < 1e-9 * (1 + fabs(d3)));
    arch_moe bad = e3;
    bad.shared_ffn_dim = 3;   /* below every calibrated shared width: outside the tables */
    assert_int_equal(cm_moe_cost(&tb, 32, &bad, &p3, &d3, NULL), -1);
    dnas_opts o;
    opts(w, &o);
    o.parent = &m;
    o.tables = &tb;
    double parent = (double)arch_params(&a);
    o.limits.params = 0.6 * parent;
    search_space sp;
    search_costs costs;
    dnas_axes ax = {.experts = 1, .shared_widths = 1};
    if (dnas_space_build(&a, &tb, &o.limits, &ax, &sp, &costs, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(sp.n_exp, 6 * 4);
    for (int j = 1; j < sp.n_exp; j++) {
        assert_int_equal(sp.expw[j], 0);
        assert_true(sp.exp[j - 1] * 16 + (sp.shw[j - 1] ? sp.shw[j - 1] : 24) <= sp.exp[j] * 16 + (sp.shw[j] ? sp.shw[j] : 24));
    }
    assert_true(sp.exp[sp.n_exp - 1] == 6 && sp.shw[sp.n_exp - 1] == 0);   /* the parent's last */
    dnas_space_free(&sp, &costs);
    /* not searched: the parent's shared width only */
    ax.shared_widths = 0;
    assert_int_equal(dnas_space_build(&a, &tb, &o.limits, &ax, &sp, &costs, err, sizeof err), 0);
    assert_int_equal(sp.n_exp, 6);
    for (int j = 0; j < sp.n_exp; j++)
        assert_int_equal(sp.shw[j], 0);
    dnas_space_free(&sp, &costs);
    ax.shared_widths = 1;
    o.axes = ax;
    dnas_result r;
    assert_int_equal(dnas_run(&o, &r, err, sizeof err), 0);
    char s[1024];
    arch_summary(&r.arch, s, sizeof s);
    printf("MoE with shared widths: chosen %s: %.0f params (limit %.0f)\n", s, (double)arch_params(&r.arch),
           o.limits.params);
    assert_true(arch_params(&r.arch) <= o.limits.params && arch_params(&r.arch) >= 0.85 * o.limits.params);
    assert_int_equal(arch_validate(&r.arch, err, sizeof err), 0);
    for (int l = 0; l < r.arch.n_layers; l++) {
        int fs = r.arch.layers[l].moe.shared_ffn_dim;
        assert_true(fs == 6 || fs == 12 || fs == 18 || fs == 24);
        assert_int_equal(r.arch.layers[l].moe.expert_ffn_dim, 16);
    }
    json_t *ch = json_object_get(json_array_get(json_object_get(r.distribution, "layers"), 0), "experts");
    int named = 0;
    for (size_t i = 0; i < json_array_size(ch); i++)
        named += json_object_get(json_array_get(ch, i), "shared_width") != NULL;
    assert_int_equal(named, 6 * 3);   /* the narrower choices name their shared width */
    dnas_result_free(&r);
    mn_opts mo = {.parent = &a, .tables = &tb, .max_candidates = 3, .limits = {.params = 0.6 * parent}, .axes = ax};
    uniform_frontier(&mo);
    cm_tables_free(&tb);
    eng_model_free(&m);
    arch_free(&a);
}

/* A LatentMoE parent (Nemotron 3 Super's shape: 4 experts of 8 units, top 2, sigmoid routing,
 * a shared expert, the experts in a latent of 16 of the hidden 32): the calibration prices the
 * latent at 4, 8 and 12 beside the parent's experts; the cost model carries the measured
 * difference to other counts; the hidden axis pairs the hidden size with each latent; DNAS
 * (on the latent masks' gradients) and Minitron++ choose one latent for the model. */
static void test_moe_latent_widths(void **state)
{
    world *w = *state;
    arch a;
    eng_model m;
    cm_tables tb;
    moe_parent(w, "nemotron_h",
               (arch_moe){.n_experts = 4, .top_k = 2, .expert_ffn_dim = 8, .shared_ffn_dim = 8, .norm_topk = 1,
                          .sigmoid = 1, .n_group = 1, .topk_group = 1, .routed_scale = 2.5f, .latent_dim = 16},
               &a, &m, &tb);
    char err[1024];
    int lt[8];
    assert_int_equal(cm_moe_latents(&tb, &a.layers[0].moe, lt, 8), 4);
    assert_true(lt[0] == 4 && lt[1] == 8 && lt[2] == 12 && lt[3] == 16);
    /* 2 experts in a latent of 8: priced at 16 plus the difference measured at the parent's 4 experts */
    arch_moe e2 = arch_moe_keep(&a.layers[0].moe, 2), e2l = e2, e4l = a.layers[0].moe;
    e2l.latent_dim = e4l.latent_dim = 8;
    double p2, d2, p2l, d2l, p4, d4, p4l, d4l;
    assert_int_equal(cm_moe_cost(&tb, 32, &e2, &p2, &d2, NULL), 0);
    assert_int_equal(cm_moe_cost(&tb, 32, &e2l, &p2l, &d2l, NULL), 0);
    assert_int_equal(cm_moe_cost(&tb, 32, &a.layers[0].moe, &p4, &d4, NULL), 0);
    assert_int_equal(cm_moe_cost(&tb, 32, &e4l, &p4l, &d4l, NULL), 0);
    assert_true(fabs(p2l - (p2 + p4l - p4)) < 1e-9 * (1 + fabs(p2)) && fabs(d2l - (d2 + d4l - d4)) < 1e-9 * (1 + fabs(d2)));
    arch_moe bad = e2;
    bad.latent_dim = 3;   /* below every calibrated latent: outside the tables */
    assert_int_equal(cm_moe_cost(&tb, 32, &bad, &p2, &d2, NULL), -1);
    dnas_opts o;
    opts(w, &o);
    o.parent = &m;
    o.tables = &tb;
    double parent = (double)arch_params(&a);
    o.limits.params = 0.9 * parent;
    search_space sp;
    search_costs costs;
    dnas_axes ax = {.latent = 1};
    if (dnas_space_build(&a, &tb, &o.limits, &ax, &sp, &costs, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(sp.n_hidden, 4);
    for (int h = 0; h < 4; h++) {
        assert_int_equal(sp.hidden[h], 32);
        assert_int_equal(sp.lat[h], h < 3 ? 4 * (h + 1) : 0);   /* the parent's last */
    }
    dnas_space_free(&sp, &costs);
    ax = (dnas_axes){.experts = 1};   /* not searched: the parent's latent only */
    assert_int_equal(dnas_space_build(&a, &tb, &o.limits, &ax, &sp, &costs, err, sizeof err), 0);
    assert_true(sp.n_hidden == 1 && sp.lat[0] == 0);
    dnas_space_free(&sp, &costs);
    o.axes = (dnas_axes){.latent = 1};
    dnas_result r;
    assert_int_equal(dnas_run(&o, &r, err, sizeof err), 0);
    char s[1024];
    arch_summary(&r.arch, s, sizeof s);
    printf("LatentMoE: chosen %s, latent %d: %.0f params (limit %.0f)\n", s, r.arch.layers[0].moe.latent_dim,
           (double)arch_params(&r.arch), o.limits.params);
    assert_true(arch_params(&r.arch) <= o.limits.params && arch_params(&r.arch) >= 0.8 * o.limits.params);
    assert_int_equal(arch_validate(&r.arch, err, sizeof err), 0);
    for (int l = 0; l < r.arch.n_layers; l++) {
        assert_true(r.arch.layers[l].moe.latent_dim < 16);
        assert_int_equal(r.arch.layers[l].moe.latent_dim, r.arch.layers[0].moe.latent_dim);
        assert_int_equal(r.arch.layers[l].moe.n_experts, 4);
    }
    json_t *hd = json_object_get(r.distribution, "hidden");
    int named = 0;
    for (size_t i = 0; i < json_array_size(hd); i++)
        named += json_object_get(json_array_get(hd, i), "latent_dim") != NULL;
    assert_int_equal(named, 3);   /* the narrower latents are named */
    dnas_result_free(&r);
    mn_opts mo = {.parent = &a, .tables = &tb, .max_candidates = 3, .limits = {.params = 0.9 * parent},
                  .axes = {.latent = 1}};
    arch *c = NULL;
    int n = 0;
    assert_int_equal(mn_frontier(&mo, &c, &n, err, sizeof err), 0);
    assert_true(n >= 1);
    assert_true(c[0].layers[0].moe.latent_dim < 16);   /* the parent's latent does not fit */
    for (int i = 0; i < n; i++)
        arch_free(&c[i]);
    free(c);
    uniform_frontier(&mo);
    cm_tables_free(&tb);
    eng_model_free(&m);
    arch_free(&a);
}

/* The aim's served margin: the median over the held-out archs of their two fresh processes'
 * spread (4%, 2%, 5% -> 4), a larger user margin instead, the limits as given kept; the
 * served limits take that spread off latency, and only memory's own error off memory. */
static void test_aim_served_margin(void **state)
{
    (void)state;
    json_t *v = json_pack("{s:i,s:f,s:f,s:[{s:[f,f]},{s:[f,f]},{s:[f,f]}]}", "archs", 3, "latency_anchored_max_pct",
                          20.0, "memory_max_pct", 1.0, "rows", "measured_process_latencies_ms", 100.0, 104.0,
                          "measured_process_latencies_ms", 51.0, 50.0, "measured_process_latencies_ms", 10.0, 10.5);
    assert_non_null(v);
    dnas_limits lim = {.latency_ms = 100}, aimed;
    method_margin mg;
    method_aim(NULL, NULL, NULL, v, -1, &lim, &aimed, &mg);
    assert_true(fabs(mg.served_pct - 4.0) < 1e-9);
    assert_true(fabs(mg.latency_pct - 20.0) < 1e-9 && fabs(aimed.latency_ms - 80.0) < 1e-9);
    assert_true(mg.given.latency_ms == 100);
    method_aim(NULL, NULL, NULL, v, 12, &lim, &aimed, &mg);
    assert_true(fabs(mg.served_pct - 12.0) < 1e-9 && fabs(aimed.latency_ms - 88.0) < 1e-9);
    method_aim(NULL, NULL, NULL, v, 2, &lim, &aimed, &mg);
    assert_true(fabs(mg.served_pct - 4.0) < 1e-9);
    method_aim(NULL, NULL, NULL, NULL, -1, &lim, &aimed, &mg);   /* no validation: 3% */
    assert_true(fabs(mg.served_pct - 3.0) < 1e-9 && aimed.latency_ms == 100);
    /* what a served check is judged against: latency less the process spread, memory less its
       own error only (a served peak is the byte accounting: at the memory limit the search took
       the latency spread off memory too and rejected an arch served at its exact prediction) */
    dnas_limits both = {.latency_ms = 100, .memory_bytes = 1000.0 * (1 << 20)}, served;
    method_aim(NULL, NULL, NULL, v, -1, &both, &aimed, &mg);
    method_served_limits(&mg, &served);
    assert_true(fabs(served.latency_ms - 96.0) < 1e-9);
    assert_true(fabs(served.memory_bytes - 990.0 * (1 << 20)) < 1e-3);   /* memory_max_pct 1% */
    method_aim(NULL, NULL, NULL, v, 12, &both, &aimed, &mg);   /* the user's margin: for both */
    method_served_limits(&mg, &served);
    assert_true(fabs(served.latency_ms - 88.0) < 1e-9 && fabs(served.memory_bytes - 880.0 * (1 << 20)) < 1e-3);
    json_decref(v);
}

/* What the export formats let the search change: a Llama parent's "hf" with per-layer axes
 * follows DeciLM (query heads and hidden size kept); a Qwen2 parent's (q/k/v biases) is
 * Qwen2ForCausalLM, one shape for every layer, so only whole layers may go. */
static void test_axes_for_exports(void **state)
{
    world *w = *state;
    arch p;
    assert_int_equal(arch_copy(&p, &w->parent.a), 0);
    for (int l = 0; l < p.n_layers; l++)
        p.layers[l].ffn_dim = 256;
    const char *hf[] = {"hf"};
    const dnas_axes all = {.hidden = 1, .heads = 1, .ffn = 1, .depth = 1};
    dnas_axes x = all;
    dnas_axes_for_exports(&x, hf, 1, &p);
    assert_true(x.heads && x.ffn && x.depth && !x.hidden && x.keep_query_heads && x.ffn_multiple == 256);
    p.attention_bias = 1;
    x = all;
    dnas_axes_for_exports(&x, hf, 1, &p);
    assert_true(!x.heads && !x.ffn && !x.hidden && x.depth && x.no_removed_attention && x.no_removed_mlp);
    arch_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parent_meets_limits),
        cmocka_unit_test(test_infeasible_names_cheapest),
        cmocka_unit_test(test_no_empty_model),
        cmocka_unit_test(test_params_limit_sits_at_limit),
        cmocka_unit_test(test_served_check_repairs),
        cmocka_unit_test(test_served_check_exact_limits),
        cmocka_unit_test(test_aim_served_margin),
        cmocka_unit_test(test_minitron_frontier),
        cmocka_unit_test(test_minitron_keeps_query_heads),
        cmocka_unit_test(test_memory_table_intercept),
        cmocka_unit_test(test_moe_expert_counts),
        cmocka_unit_test(test_moe_shared_widths),
        cmocka_unit_test(test_moe_latent_widths),
        cmocka_unit_test(test_axes_for_exports),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
