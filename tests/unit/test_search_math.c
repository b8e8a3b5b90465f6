/* tests/unit/test_search_math.c — the search's arithmetic: expected-cost gradients
 * against finite differences (through the softmax into the logits), the two-sided
 * penalty's multipliers, argmax decoding, and greedy repair on random monotone tables. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "compress/search.h"

static uint64_t rng_state = 88172645463325252ULL;
static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (rng_state >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct {
    search_space sp;
    search_costs costs;
    double *buf;
} fixture;

/* Random tables, increasing in every choice (bigger part, bigger cost), part 0 free. */
static void make_fixture_mode(fixture *f, int L, int depth, int with_ws, int summax)
{
    memset(f, 0, sizeof *f);
    search_space *sp = &f->sp;
    sp->n_layers = L;
    sp->n_hidden = 3; sp->hidden[0] = 64; sp->hidden[1] = 96; sp->hidden[2] = 128;
    sp->n_heads = 4; for (int k = 0; k < 4; k++) sp->heads[k] = 2 * k;
    sp->n_ffn = 5; for (int j = 0; j < 5; j++) sp->ffn[j] = 64 * j;
    sp->group = 2;
    sp->depth = depth;
    size_t na = (size_t)3 * L * 4, nf = (size_t)3 * L * 5;
    f->buf = calloc(SM_COUNT * (3 + na + nf + 3 + na + nf), sizeof(double));
    assert_non_null(f->buf);
    double *p = f->buf;
    for (int m = 0; m < SM_COUNT; m++) {
        search_table *t = &f->costs.t[m];
        t->fixed = p; p += 3;
        t->attn = p; p += na;
        t->ffn = p; p += nf;
        for (int h = 0; h < 3; h++) {
            t->fixed[h] = (1 + h) * (1 + urand());
            for (int l = 0; l < L; l++) {
                double acc = 0;
                for (int k = 0; k < 4; k++) {
                    acc += k ? (0.5 + urand()) * (1 + h) : 0;
                    t->attn[((size_t)h * L + l) * 4 + k] = acc;
                }
                acc = 0;
                for (int j = 0; j < 5; j++) {
                    acc += j ? (0.5 + urand()) * (1 + h) : 0;
                    t->ffn[((size_t)h * L + l) * 5 + j] = acc;
                }
            }
        }
        if (with_ws && m == SM_MEMORY) {
            t->ws_sum_of_maxima = summax;
            t->ws_fixed = p; p += 3;
            t->ws_attn = p; p += na;
            t->ws_ffn = p; p += nf;
            for (int h = 0; h < 3; h++) {
                t->ws_fixed[h] = 2.0 + h;
                for (int l = 0; l < L; l++) {
                    for (int k = 0; k < 4; k++) t->ws_attn[((size_t)h * L + l) * 4 + k] = k * (1 + urand()) * (1 + h);
                    for (int j = 0; j < 5; j++) t->ws_ffn[((size_t)h * L + l) * 5 + j] = j * (0.5 + urand()) * (1 + h);
                }
            }
        }
    }
}

static void make_fixture(fixture *f, int L, int depth, int with_ws)
{
    make_fixture_mode(f, L, depth, with_ws, 0);
}

static double objective(search_dist *d, const search_table *t, double tau)
{
    search_dist_probs(d, tau, NULL);
    return search_expected_cost(d, t, 20.0, 0.0);
}

static void check_grad(int depth, int with_ws, int summax)
{
    fixture f;
    make_fixture_mode(&f, 5, depth, with_ws, summax);
    search_dist d;
    assert_int_equal(search_dist_init(&d, &f.sp, 0.0), 0);
    size_t n = 3 + 5 * (4 + 5 + 2);
    for (size_t i = 0; i < n; i++)
        d.logit_hidden[i] = urand() * 2 - 1;
    const search_table *t = &f.costs.t[SM_MEMORY];
    double tau = 0.7;
    search_dist_probs(&d, tau, NULL);
    search_expected_cost(&d, t, 20.0, 1.0);
    double *gz = calloc(n, sizeof *gz);
    assert_non_null(gz);
    search_dist_logit_grads(&d, tau, gz, gz + 3, gz + 3 + 20, gz + 3 + 20 + 25);
    double maxerr = 0;
    for (size_t i = 0; i < n; i++) {
        if (!depth && i >= 3 + 45)
            continue;
        double z = d.logit_hidden[i], h = 1e-5;
        d.logit_hidden[i] = z + h;
        double fp = objective(&d, t, tau);
        d.logit_hidden[i] = z - h;
        double fm = objective(&d, t, tau);
        d.logit_hidden[i] = z;
        double fd = (fp - fm) / (2 * h);
        double err = fabs(fd - gz[i]) / fmax(1e-3, fabs(fd));
        if (err > maxerr)
            maxerr = err;
    }
    printf("max relative gradient error (depth=%d ws=%d sum-of-maxima=%d): %.2e\n", depth, with_ws, summax, maxerr);
    assert_true(maxerr < 1e-5);
    free(gz);
    search_dist_free(&d);
    free(f.buf);
}

static void test_grad_additive(void **state) { (void)state; check_grad(0, 0, 0); }
static void test_grad_depth_workspace(void **state) { (void)state; check_grad(1, 1, 0); }
static void test_grad_workspace_sum_of_maxima(void **state) { (void)state; check_grad(1, 1, 1); }

/* Expected cost under a one-hot distribution equals the exact cost of that choice. */
static void test_expected_matches_exact_at_one_hot(void **state)
{
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
    fixture f;
    make_fixture_mode(&f, 4, 1, 1, mode);
    search_dist d;
    assert_int_equal(search_dist_init(&d, &f.sp, 0.0), 0);
    search_choice c;
    assert_int_equal(search_choice_init(&c, &f.sp), 0);
    for (int trial = 0; trial < 20; trial++) {
        size_t n = 3 + 4 * 11;
        for (size_t i = 0; i < n; i++)
            d.logit_hidden[i] = urand() * 40;
        search_dist_probs(&d, 1e-3, NULL);
        search_decode_argmax(&d, &c);
        for (int m = 0; m < SM_COUNT; m++) {
            double e = search_expected_cost(&d, &f.costs.t[m], 1e9, 0.0);
            double x = search_choice_cost(&f.sp, &f.costs.t[m], &c);
            assert_true(fabs(e - x) <= 1e-6 * fmax(1, x));
        }
    }
    search_choice_free(&c);
    search_dist_free(&d);
    free(f.buf);
    }
}

/* Repair lands inside every limit, sits close to one (no grow step left), and reports
 * infeasibility with the cheapest choice. */
static void test_repair_random(void **state)
{
    (void)state;
    for (int trial = 0; trial < 200; trial++) {
        fixture f;
        int L = 2 + trial % 7;
        make_fixture_mode(&f, L, trial % 2, trial % 3 == 0, trial % 5 == 0);
        search_dist d;
        assert_int_equal(search_dist_init(&d, &f.sp, 0.0), 0);
        search_choice c, parent;
        assert_int_equal(search_choice_init(&c, &f.sp), 0);
        assert_int_equal(search_choice_init(&parent, &f.sp), 0);
        search_choice_parent(&f.sp, &parent);
        size_t n = 3 + (size_t)L * 11;
        for (size_t i = 0; i < n; i++)
            d.logit_hidden[i] = urand() * 4 - 2;
        int act[2] = {(int)(urand() * SM_COUNT), (int)(urand() * SM_COUNT)};
        for (int m = 0; m < SM_COUNT; m++)
            f.costs.t[m].active = 0;
        for (int a = 0; a < 2; a++) {
            search_table *t = &f.costs.t[act[a]];
            t->active = 1;
            t->limit = search_choice_cost(&f.sp, t, &parent) * (0.2 + 0.7 * urand());
        }
        search_decode_argmax(&d, &c);
        int rc = search_repair(&d, &f.costs, &c);
        if (rc == 0) {
            for (int m = 0; m < SM_COUNT; m++)
                if (f.costs.t[m].active)
                    assert_true(search_choice_cost(&f.sp, &f.costs.t[m], &c) <= f.costs.t[m].limit);
        } else {
            search_choice cheap;
            assert_int_equal(search_choice_init(&cheap, &f.sp), 0);
            search_choice_cheapest(&f.sp, &cheap);
            int violated = 0;
            for (int m = 0; m < SM_COUNT; m++)
                if (f.costs.t[m].active && search_choice_cost(&f.sp, &f.costs.t[m], &cheap) > f.costs.t[m].limit)
                    violated = 1;
            assert_true(violated);
            search_choice_free(&cheap);
        }
        search_choice_free(&c);
        search_choice_free(&parent);
        search_dist_free(&d);
        free(f.buf);
    }
}

/* A global axis over layers 0, 2 and 4: the Mamba layers' heads axes (the Mamba head count),
 * or the MoE layers' MLP axes tied (one expert count for the model, as llama.cpp's GGUF
 * holds). The Gumbel-noised probabilities are one draw for all of them (another layer's
 * axis its own); the logit gradient of each is the whole axis's (the finite difference
 * through the first one, which the others copy); repair moves them together, so every
 * decoded and repaired choice has one size on the axis. */
static void check_global_axis(int experts)
{
    int n_axis = experts ? 5 : 4;   /* the axis's choices: MLP widths / head counts */
    for (int trial = 0; trial < 50; trial++) {
        fixture f;
        make_fixture_mode(&f, 5, trial % 2, trial % 3 == 0, trial % 5 == 0);
        unsigned char kind[5] = {1, 0, 1, 0, 1};
        if (experts) {
            f.sp.moe = kind;
            f.sp.tie_exp = 1;
            f.sp.n_exp = 5;
            for (int j = 0; j < 5; j++)
                f.sp.exp[j] = 2 * j;
        } else {
            f.sp.mamba = kind;
            f.sp.n_mam = 4;
            for (int k = 0; k < 4; k++)
                f.sp.mam[k] = 2 * (k + 1);
        }
        search_dist d;
        assert_int_equal(search_dist_init(&d, &f.sp, 0.0), 0);
        size_t n = 3 + 5 * (4 + 5 + 2);
        for (size_t i = 0; i < n; i++)
            d.logit_hidden[i] = urand() * 4 - 2;
        double *logit = experts ? d.logit_ffn : d.logit_heads;
        for (int l = 2; l < 5; l += 2)   /* the optimizer keeps tied logits equal */
            memcpy(logit + l * n_axis, logit, n_axis * sizeof(double));
        uint64_t rng = 1234 + (uint64_t)trial;
        search_dist_probs(&d, 0.8, &rng);
        const double *p = experts ? d.p_ffn : d.p_heads;
        for (int l = 2; l < 5; l += 2)
            assert_memory_equal(p + l * n_axis, p, n_axis * sizeof(double));
        assert_memory_not_equal(p + n_axis, p, n_axis * sizeof(double));   /* layer 1: its own draw */
        const search_table *t = &f.costs.t[SM_LATENCY];
        search_dist_probs(&d, 0.8, NULL);
        search_expected_cost(&d, t, 20.0, 1.0);
        double gz[3 + 5 * 11];
        search_dist_logit_grads(&d, 0.8, gz, gz + 3, gz + 3 + 20, gz + 3 + 45);
        const double *g = experts ? gz + 3 + 20 : gz + 3;
        for (int k = 0; k < n_axis; k++) {
            double z = logit[k], h = 1e-5;
            logit[k] = z + h;
            double fp = objective(&d, t, 0.8);
            logit[k] = z - h;
            double fm = objective(&d, t, 0.8);
            logit[k] = z;
            double fd = (fp - fm) / (2 * h);
            assert_true(fabs(fd - g[k]) <= 1e-5 * fmax(1e-3, fabs(fd)));
            assert_true(g[2 * n_axis + k] == g[k] && g[4 * n_axis + k] == g[k]);
        }
        search_choice c, parent;
        assert_int_equal(search_choice_init(&c, &f.sp), 0);
        assert_int_equal(search_choice_init(&parent, &f.sp), 0);
        search_choice_parent(&f.sp, &parent);
        t = &f.costs.t[SM_MEMORY];
        for (int m = 0; m < SM_COUNT; m++)
            f.costs.t[m].active = m == SM_MEMORY;
        f.costs.t[SM_MEMORY].limit = search_choice_cost(&f.sp, t, &parent) * (0.3 + 0.6 * urand());
        search_decode_argmax(&d, &c);
        const int *ch = experts ? c.ffn : c.heads;
        assert_true(ch[0] == ch[2] && ch[2] == ch[4]);
        if (search_repair(&d, &f.costs, &c) == 0)
            assert_true(search_choice_cost(&f.sp, t, &c) <= f.costs.t[SM_MEMORY].limit);
        assert_true(ch[0] == ch[2] && ch[2] == ch[4]);
        search_choice_free(&c);
        search_choice_free(&parent);
        search_dist_free(&d);
        free(f.buf);
    }
}

static void test_mamba_axis_tied(void **state) { (void)state; check_global_axis(0); }
static void test_expert_axis_tied(void **state) { (void)state; check_global_axis(1); }

/* With limits the parent meets, repair grows every axis back to the parent. */
static void test_repair_parent_when_feasible(void **state)
{
    (void)state;
    fixture f;
    make_fixture(&f, 6, 1, 1);
    search_dist d;
    assert_int_equal(search_dist_init(&d, &f.sp, 0.0), 0);
    search_choice c, parent;
    assert_int_equal(search_choice_init(&c, &f.sp), 0);
    assert_int_equal(search_choice_init(&parent, &f.sp), 0);
    search_choice_parent(&f.sp, &parent);
    f.costs.t[SM_LATENCY].active = 1;
    f.costs.t[SM_LATENCY].limit = search_choice_cost(&f.sp, &f.costs.t[SM_LATENCY], &parent);
    search_choice_cheapest(&f.sp, &c);
    for (int l = 0; l < 6; l++)
        c.keep[l] = 1;
    assert_int_equal(search_repair(&d, &f.costs, &c), 0);
    assert_int_equal(c.hidden, parent.hidden);
    for (int l = 0; l < 6; l++) {
        assert_int_equal(c.heads[l], parent.heads[l]);
        assert_int_equal(c.ffn[l], parent.ffn[l]);
        assert_int_equal(c.keep[l], 1);
    }
    search_choice_free(&c);
    search_choice_free(&parent);
    search_dist_free(&d);
    free(f.buf);
}

/* One layer of one head count (2, one KV group), hidden sizes 64, 128, ... and FFN widths
 * 64, 128, ...: the tables written by hand index them. */
static void one_layer_space(search_space *sp, int n_hidden, int n_ffn)
{
    memset(sp, 0, sizeof *sp);
    sp->n_layers = 1;
    sp->n_hidden = n_hidden;
    for (int h = 0; h < n_hidden; h++)
        sp->hidden[h] = 64 * (h + 1);
    sp->n_heads = 1;
    sp->heads[0] = 2;
    sp->n_ffn = n_ffn;
    for (int j = 0; j < n_ffn; j++)
        sp->ffn[j] = 64 * (j + 1);
    sp->group = 2;
}

/* Costs with a latency limit only, every metric reading the same hand-written tables. */
static void latency_costs(search_costs *costs, double limit, double *fixed, double *attn, double *ffn)
{
    memset(costs, 0, sizeof *costs);
    costs->t[SM_LATENCY] = (search_table){.active = 1, .limit = limit, .fixed = fixed, .attn = attn, .ffn = ffn};
    for (int m = 1; m < SM_COUNT; m++)
        costs->t[m] = (search_table){.fixed = fixed, .attn = attn, .ffn = ffn};
}

/* A cost that is not monotone in the size (a measured expert count's latency): from the
 * parent (3.1), the next size down costs 3.0 and the one below it 3.2, both over the limit
 * 2.0; the repair must reach size 1 (1.0) rather than give up. */
static void test_repair_jumps_non_monotone(void **state)
{
    (void)state;
    search_space sp;
    one_layer_space(&sp, 1, 5);
    double fixed = 0.1, attn = 0, ffn[5] = {0.5, 1.0, 3.2, 3.0, 3.1};
    search_costs costs;
    latency_costs(&costs, 2.0, &fixed, &attn, ffn);
    search_dist d;
    assert_int_equal(search_dist_init(&d, &sp, 0.0), 0);
    search_choice c;
    assert_int_equal(search_choice_init(&c, &sp), 0);
    search_choice_parent(&sp, &c);
    assert_int_equal(c.ffn[0], 4);
    assert_int_equal(search_repair(&d, &costs, &c), 0);
    assert_true(search_choice_cost(&sp, &costs.t[SM_LATENCY], &c) <= 2.0);
    assert_int_equal(c.ffn[0], 1);   /* and grown back as far as the limit allows */
    search_choice_free(&c);
    search_dist_free(&d);
}

/* Stuck for single moves, feasible for the cheapest: at the larger hidden size the layer is
 * priced 0 (a measured entry clamped at 0 by noise) and the fixed cost is over the limit;
 * the smaller hidden size alone prices the layer above the limit, and removing the layer
 * alone saves nothing. The cheapest choice (smaller hidden, no layer) meets the limit, so
 * the repair must not report the space infeasible. */
static void test_repair_when_single_moves_stall(void **state)
{
    (void)state;
    search_space sp;
    one_layer_space(&sp, 2, 1);
    sp.depth = 1;
    double fixed[2] = {1.75, 2.3}, attn[2] = {1.0, 0.0}, ffn[2] = {0.0, 0.0};
    search_costs costs;
    latency_costs(&costs, 2.2, fixed, attn, ffn);
    search_dist d;
    assert_int_equal(search_dist_init(&d, &sp, 0.0), 0);
    search_choice c;
    assert_int_equal(search_choice_init(&c, &sp), 0);
    search_choice_parent(&sp, &c);
    assert_true(search_choice_cost(&sp, &costs.t[SM_LATENCY], &c) > 2.2);
    assert_int_equal(search_repair(&d, &costs, &c), 0);
    assert_true(search_choice_cost(&sp, &costs.t[SM_LATENCY], &c) <= 2.2);
    search_choice_free(&c);
    search_dist_free(&d);
}

/* The cheapest choice that makes a model, in a space of two Mamba layers and no MLPs with
 * depth searched: the cheapest alone removes both layers; the one kept takes the global
 * Mamba axis's cheapest count (the tied layers stay equal). A first version skipped global
 * axes and found no layer that could hold anything. */
static void test_cheapest_layer_global_axis(void **state)
{
    (void)state;
    search_space sp;
    memset(&sp, 0, sizeof sp);
    sp.n_layers = 2;
    sp.n_hidden = 1;
    sp.hidden[0] = 64;
    unsigned char kind[2] = {1, 1};
    sp.mamba = kind;
    sp.n_mam = sp.n_heads = 2;
    sp.mam[0] = 2, sp.mam[1] = 4;
    sp.heads[0] = sp.heads[1] = -1;
    sp.n_ffn = 1;
    sp.ffn[0] = 0;
    sp.group = 1;
    sp.depth = 1;
    double fixed = 0.1, attn[4] = {1.0, 2.0, 0.5, 1.5}, ffn[2] = {0, 0};
    search_costs costs;
    latency_costs(&costs, 10.0, &fixed, attn, ffn);
    search_choice c;
    assert_int_equal(search_choice_init(&c, &sp), 0);
    assert_int_equal(search_choice_cheapest_layer(&sp, &costs, &c), 0);
    assert_int_equal(c.keep[0] + c.keep[1], 1);
    assert_int_equal(c.keep[1], 1);                       /* the cheaper layer */
    assert_true(c.heads[0] == 0 && c.heads[1] == 0);      /* the axis's cheapest, on both */
    search_choice_free(&c);
}

/* Multipliers: lambda1 follows the sign of the gap (and may go negative), lambda2 grows. */
static void test_penalty_multipliers(void **state)
{
    (void)state;
    fixture f;
    make_fixture(&f, 3, 0, 0);
    search_dist d;
    assert_int_equal(search_dist_init(&d, &f.sp, 0.0), 0);
    search_dist_probs(&d, 1.0, NULL);
    search_penalty pen;
    memset(&pen, 0, sizeof pen);
    search_table *t = &f.costs.t[SM_PARAMS];
    t->active = 1;
    double e = search_expected_cost(&d, t, 0, 0);
    t->limit = e * 2;   /* under the limit: gap = -0.5 */
    search_penalty_step(&pen, &d, &f.costs, 0, 1.0, 0.1);
    assert_true(fabs(pen.gap[SM_PARAMS] + 0.5) < 1e-12);
    assert_true(pen.lambda1[SM_PARAMS] < 0);
    assert_true(pen.lambda2[SM_PARAMS] > 0);
    search_dist_free(&d);
    free(f.buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_additive),
        cmocka_unit_test(test_grad_depth_workspace),
        cmocka_unit_test(test_grad_workspace_sum_of_maxima),
        cmocka_unit_test(test_expected_matches_exact_at_one_hot),
        cmocka_unit_test(test_repair_random),
        cmocka_unit_test(test_mamba_axis_tied),
        cmocka_unit_test(test_repair_parent_when_feasible),
        cmocka_unit_test(test_repair_jumps_non_monotone),
        cmocka_unit_test(test_repair_when_single_moves_stall),
        cmocka_unit_test(test_cheapest_layer_global_axis),
        cmocka_unit_test(test_expert_axis_tied),
        cmocka_unit_test(test_penalty_multipliers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
