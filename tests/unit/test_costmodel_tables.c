/* tests/unit/test_costmodel_tables.c — the cost model's lookups on synthetic tables:
 * exact values on grid points, linear interpolation between them (parts and hidden
 * sizes), decode integrated over the growing context, additivity of a whole arch,
 * itemized memory with both workspace rules, JSON round trip, and the import format
 * rejecting malformed tables with the JSON pointer of the fault.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/calibrate_internal.h"
#include "compress/costmodel.h"
#include "storage/archjson.h"

#define B_ 2
#define S_ 16
#define N_ 8

/* Synthetic tables at hidden 64 and 128: attention (h, kv) for kv-groups of 2 and kv
 * fixed at 2; mlp widths 32, 64, 128. Times are simple functions of the size so the
 * expected values are computable: prefill ms = hidden/64 * (1 + size/10), decode step
 * = hidden/64 * (0.1*size/10 + 0.001*ctx). Workspace = 1000*size + 100 (+ hidden). */
static double pre_ms(int hidden, double size) { return hidden / 64.0 * (1 + size / 10); }
static double dec0(int hidden, double size) { return hidden / 64.0 * 0.01 * size; }
static double dslope(int hidden) { return hidden / 64.0 * 0.001; }

static void put(cm_entry *e, int part, int hidden, int h, int kv, int f)
{
    memset(e, 0, sizeof *e);
    e->part = part;
    e->hidden_size = hidden;
    e->n_heads = h;
    e->n_kv_heads = kv;
    e->ffn_dim = f;
}

static void make_tables(cm_tables *t)
{
    static const int ah[] = {2, 4, 4}, akv[] = {1, 2, 2}, fw[] = {32, 64, 128};
    static const int ah2[] = {2, 4}, akv2[] = {2, 2};
    memset(t, 0, sizeof *t);
    snprintf(t->target.device, sizeof t->target.device, "cpu");
    snprintf(t->target.precision, sizeof t->target.precision, "fp32");
    t->target.batch_size = B_;
    t->target.prompt_tokens = S_;
    t->target.output_tokens = N_;
    snprintf(t->family, sizeof t->family, "llama");
    t->vocab_size = 256;
    t->head_dim = 16;
    t->tie_word_embeddings = 1;
    t->prefill = calloc(32, sizeof(cm_entry));
    t->decode = calloc(32, sizeof(cm_entry));
    t->fixed = calloc(2, sizeof(cm_fixed));
    assert_non_null(t->prefill);
    assert_non_null(t->decode);
    assert_non_null(t->fixed);
    int hs[2] = {64, 128};
    for (int k = 0; k < 2; k++) {
        int H = hs[k];
        /* attention: (2,1), (4,2) [group 2] and (2,2) [kv fixed at 2] */
        int atts[3][2] = {{ah[0], akv[0]}, {ah[1], akv[1]}, {ah2[0], akv2[0]}};
        for (int i = 0; i < 3; i++) {
            cm_entry *p = &t->prefill[t->n_prefill++], *d = &t->decode[t->n_decode++];
            double size = atts[i][0] + 0.5 * atts[i][1];
            put(p, CM_ATTN, H, atts[i][0], atts[i][1], 0);
            p->ms = pre_ms(H, size);
            p->workspace_bytes = 1000 * (int64_t)(2 * atts[i][0] + 2 * atts[i][1]) + 100 + H;
            *d = *p;
            d->ms0 = dec0(H, size);
            d->ms_per_ctx = dslope(H);
            d->n_ctx = 1;
            d->ctx[0] = S_;
            d->ctx_ms[0] = d->ms0 + d->ms_per_ctx * S_;
        }
        for (int i = 0; i < 3; i++) {
            cm_entry *p = &t->prefill[t->n_prefill++], *d = &t->decode[t->n_decode++];
            put(p, CM_MLP, H, 0, 0, fw[i]);
            p->ms = pre_ms(H, fw[i]);
            p->workspace_bytes = 1000 * (int64_t)fw[i] + 100 + H;
            *d = *p;
            d->ms0 = dec0(H, fw[i]);
            d->ms_per_ctx = dslope(H);
            d->n_ctx = 1;
            d->ctx[0] = S_;
            d->ctx_ms[0] = d->ms0 + d->ms_per_ctx * S_;
        }
        cm_fixed *f = &t->fixed[t->n_fixed++];
        f->hidden_size = H;
        f->prefill_embed_ms = 0.5;
        f->prefill_head_ms = 1.5 * H / 64;
        f->prefill_other_ms = 0.25;
        f->decode_embed_ms = 0.01;
        f->decode_head_ms = 0.1 * H / 64;
        f->decode_other_ms = 0.02;
        f->workspace_bytes = 100 + H;
    }
    (void)ah2;
    (void)akv2;
    t->mem.weight_bytes_per_param = 4;
    t->mem.weight_overhead_bytes = 32;
    t->mem.kv_bytes_per_elem = 4;
    t->mem.kv_overhead_bytes = 0;
    t->mem.runtime_bytes = 5000;
    t->mem.workspace_combine = CM_WS_MAX;
}

/* Decode over the workload for an entry with intercept a and slope b. */
static double dec_total(double a, double b)
{
    return N_ * a + b * (N_ * (double)S_ + N_ * (N_ - 1) / 2.0);
}

static void make_arch(arch *a, int hidden, int n, const int (*layers)[3])
{
    assert_int_equal(arch_init(a, n), 0);
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = 256;
    a->hidden_size = hidden;
    a->head_dim = 16;
    a->max_position_embeddings = 1024;
    a->rope_theta = 10000;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = 1;
    for (int i = 0; i < n; i++) {
        a->layers[i].source_layer = i;
        a->layers[i].n_heads = layers[i][0];
        a->layers[i].n_kv_heads = layers[i][1];
        a->layers[i].ffn_dim = layers[i][2];
    }
}

static void test_exact_on_grid(void **state)
{
    (void)state;
    cm_tables t;
    make_tables(&t);
    double p, d, w;
    assert_int_equal(cm_part_cost(&t, CM_MLP, 64, 0, 0, 64, &p, &d, &w), 0);
    assert_true(fabs(p - pre_ms(64, 64)) < 1e-12);
    assert_true(fabs(d - dec_total(dec0(64, 64), dslope(64))) < 1e-12);
    assert_true(fabs(w - (64000 + 164)) < 1e-9);
    assert_int_equal(cm_part_cost(&t, CM_ATTN, 128, 4, 2, 0, &p, &d, &w), 0);
    assert_true(fabs(p - pre_ms(128, 5)) < 1e-12);
    /* removed parts cost nothing when the tables have no size-0 entry */
    assert_int_equal(cm_part_cost(&t, CM_MLP, 64, 0, 0, 0, &p, &d, &w), 0);
    assert_true(p == 0 && d == 0 && w == 0);
    cm_tables_free(&t);
}

static void test_interpolation(void **state)
{
    (void)state;
    cm_tables t;
    make_tables(&t);
    double p, d, w;
    /* between 64 and 128: linear */
    assert_int_equal(cm_part_cost(&t, CM_MLP, 64, 0, 0, 96, &p, &d, &w), 0);
    assert_true(fabs(p - 0.5 * (pre_ms(64, 64) + pre_ms(64, 128))) < 1e-12);
    assert_true(fabs(w - (96000 + 164)) < 1e-9);
    /* below the smallest width: extrapolated from the two smallest points */
    assert_int_equal(cm_part_cost(&t, CM_MLP, 64, 0, 0, 16, &p, NULL, NULL), 0);
    assert_true(fabs(p - pre_ms(64, 16)) < 1e-12);
    /* beyond the largest width: refused */
    assert_int_equal(cm_part_cost(&t, CM_MLP, 64, 0, 0, 256, &p, NULL, NULL), -1);
    /* attention with kv fixed at 2: heads 2 -> 4 on the same-kv axis, 3 heads is off-grid
     * (not a valid arch, but the axis is linear) */
    assert_int_equal(cm_part_cost(&t, CM_ATTN, 64, 3, 2, 0, &p, NULL, NULL), 0);
    assert_true(fabs(p - 0.5 * (pre_ms(64, 3) + pre_ms(64, 5))) < 1e-12);
    /* (6, 3) lies on the group-2 axis beyond kv 2: refused; (1, 1)... no entry with kv 1
     * other than (2,1), and the group axis needs h/kv == 2: refused */
    assert_int_equal(cm_part_cost(&t, CM_ATTN, 64, 6, 3, 0, &p, NULL, NULL), -1);
    assert_int_equal(cm_part_cost(&t, CM_ATTN, 64, 1, 1, 0, &p, NULL, NULL), -1);
    /* hidden 96 between the calibrated 64 and 128 */
    assert_int_equal(cm_part_cost(&t, CM_MLP, 96, 0, 0, 64, &p, NULL, NULL), 0);
    assert_true(fabs(p - 0.5 * (pre_ms(64, 64) + pre_ms(128, 64))) < 1e-12);
    assert_int_equal(cm_part_cost(&t, CM_MLP, 256, 0, 0, 64, &p, NULL, NULL), -1);
    cm_tables_free(&t);
}

static void test_additive_prediction(void **state)
{
    (void)state;
    cm_tables t;
    make_tables(&t);
    static const int layers[4][3] = {{4, 2, 128}, {2, 1, 0}, {0, 0, 32}, {2, 2, 64}};
    arch a;
    make_arch(&a, 64, 4, layers);
    cm_prediction p;
    char err[256];
    assert_int_equal(cm_predict(&t, &a, &p, err, sizeof err), 0);
    double pre = 0.5 + 1.5 + 0.25, dec = N_ * (0.01 + 0.1 + 0.02);
    double sizes_attn[] = {5, 2.5, -1, 3}, sizes_mlp[] = {128, -1, 32, 64};
    for (int i = 0; i < 4; i++) {
        if (sizes_attn[i] >= 0) {
            pre += pre_ms(64, sizes_attn[i]);
            dec += dec_total(dec0(64, sizes_attn[i]), dslope(64));
        }
        if (sizes_mlp[i] >= 0) {
            pre += pre_ms(64, sizes_mlp[i]);
            dec += dec_total(dec0(64, sizes_mlp[i]), dslope(64));
        }
    }
    assert_true(fabs(p.prefill_ms - pre) < 1e-9);
    assert_true(fabs(p.decode_ms - dec) < 1e-9);
    assert_true(fabs(p.latency_ms - (pre + dec)) < 1e-9);
    assert_true(fabs(p.throughput_tps - B_ * N_ / dec * 1000) < 1e-6);
    assert_true(fabs(p.decode_ms_per_token - dec / N_) < 1e-12);
    /* memory items */
    assert_int_equal(p.params, arch_params(&a));
    assert_int_equal(p.weights, 4 * p.params + 32);
    int64_t kv = 4LL * 2 * (2 + 1 + 2) * 16 * B_ * (S_ + N_);
    assert_int_equal(p.request_cache, kv);
    /* max rule: the largest single part (mlp 128) */
    assert_int_equal(p.prefill_workspace, 128000 + 164);
    assert_int_equal(p.runtime_buffers, 5000);
    assert_int_equal(p.total, p.weights + p.request_cache + p.prefill_workspace + p.runtime_buffers);
    assert_int_equal(p.naive_bytes, 4 * p.params + kv);
    /* sum-of-maxima rule: W0 + (attn max - W0) + (mlp max - W0) */
    t.mem.workspace_combine = CM_WS_SUM_MAXIMA;
    assert_int_equal(cm_predict(&t, &a, &p, err, sizeof err), 0);
    assert_int_equal(p.prefill_workspace, 164 + 12000 + 128000);
    /* the sum of parts is additive: adding a layer adds exactly its entries */
    static const int more[5][3] = {{4, 2, 128}, {2, 1, 0}, {0, 0, 32}, {2, 2, 64}, {2, 1, 32}};
    arch a2;
    cm_prediction p2;
    make_arch(&a2, 64, 5, more);
    assert_int_equal(cm_predict(&t, &a2, &p2, err, sizeof err), 0);
    assert_true(fabs(p2.prefill_ms - p.prefill_ms - pre_ms(64, 2.5) - pre_ms(64, 32)) < 1e-9);
    /* outside the tables: named */
    a2.layers[4].ffn_dim = 512;
    assert_int_equal(cm_predict(&t, &a2, &p2, err, sizeof err), -1);
    assert_non_null(strstr(err, "layers[4].mlp"));
    a2.layers[4].ffn_dim = 32;
    a2.vocab_size = 300;
    assert_int_equal(cm_predict(&t, &a2, &p2, err, sizeof err), -1);
    arch_free(&a);
    arch_free(&a2);
    cm_tables_free(&t);
}

/* Phase scales multiply every time of their phase, parts and fixed alike, so a whole
 * arch scales exactly and stays additive. */
static void test_phase_scales(void **state)
{
    (void)state;
    cm_tables t;
    make_tables(&t);
    static const int layers[2][3] = {{4, 2, 128}, {2, 1, 32}};
    arch a;
    make_arch(&a, 64, 2, layers);
    cm_prediction p, q;
    char err[256];
    assert_int_equal(cm_predict(&t, &a, &p, err, sizeof err), 0);
    t.fixed[0].prefill_scale = 1.25;
    t.fixed[0].decode_scale = 0.5;
    assert_int_equal(cm_predict(&t, &a, &q, err, sizeof err), 0);
    assert_true(fabs(q.prefill_ms - 1.25 * p.prefill_ms) < 1e-9);
    assert_true(fabs(q.decode_ms - 0.5 * p.decode_ms) < 1e-9);
    double pp, dd;
    assert_int_equal(cm_part_cost(&t, CM_MLP, 64, 0, 0, 128, &pp, &dd, NULL), 0);
    assert_true(fabs(pp - 1.25 * pre_ms(64, 128)) < 1e-12);
    assert_int_equal(q.total, p.total);   /* memory is not scaled */
    arch_free(&a);
    cm_tables_free(&t);
}

/* The anchor's tables: a deep copy (the original unchanged after the copy is rescaled)
 * whose phases, rescaled, predict every arch's phases times the factors, at every hidden
 * size, and the same memory. */
static void test_copy_rescale(void **state)
{
    (void)state;
    cm_tables t, u;
    make_tables(&t);
    t.fixed[1].decode_scale = 1.5;
    assert_int_equal(cm_tables_copy(&u, &t), 0);
    assert_ptr_not_equal(u.fixed, t.fixed);
    cm_tables_rescale(&u, 1.2, 0.8);
    static const int layers[2][3] = {{4, 2, 128}, {2, 1, 32}};
    char err[256];
    for (int h = 64; h <= 96; h += 16) {
        arch a;
        make_arch(&a, h, 2, layers);
        cm_prediction p, q;
        assert_int_equal(cm_predict(&t, &a, &p, err, sizeof err), 0);
        assert_int_equal(cm_predict(&u, &a, &q, err, sizeof err), 0);
        assert_true(fabs(q.prefill_ms - 1.2 * p.prefill_ms) < 1e-9 * p.prefill_ms);
        assert_true(fabs(q.decode_ms - 0.8 * p.decode_ms) < 1e-9 * p.decode_ms);
        assert_int_equal(q.total, p.total);
        arch_free(&a);
    }
    assert_true(t.fixed[1].decode_scale == 1.5 && fabs(u.fixed[1].decode_scale - 1.2) < 1e-12);
    cm_tables_free(&u);
    cm_tables_free(&t);
}

static void test_json_round_trip(void **state)
{
    (void)state;
    cm_tables t, u;
    make_tables(&t);
    t.mem.workspace_combine = CM_WS_SUM_MAXIMA;
    t.fixed[1].decode_scale = 1.5;
    json_t *j = cm_tables_to_json(&t);
    assert_non_null(j);
    char err[256];
    u.target = t.target;
    if (cm_tables_from_json(j, "/tables", &u, err, sizeof err))
        fail_msg("%s", err);
    static const int layers[3][3] = {{4, 2, 96}, {2, 2, 0}, {2, 1, 40}};
    arch a;
    make_arch(&a, 96, 3, layers);
    cm_prediction p, q;
    assert_int_equal(cm_predict(&t, &a, &p, err, sizeof err), 0);
    assert_int_equal(cm_predict(&u, &a, &q, err, sizeof err), 0);
    assert_true(fabs(p.latency_ms - q.latency_ms) < 1e-9 * p.latency_ms);
    assert_int_equal(p.total, q.total);
    assert_int_equal(u.mem.workspace_combine, CM_WS_SUM_MAXIMA);
    assert_true(u.parent_bias_prefill == 0 && u.parent_bias_decode == 0);   /* none written, none read */
    assert_null(json_object_get(j, "parent_bias"));
    json_decref(j);
    cm_tables_free(&u);
    /* a llama.cpp calibration's parent bias travels with its tables (a job's anchor reads it) */
    t.parent_bias_prefill = 1.25;
    t.parent_bias_decode = 0.875;
    j = cm_tables_to_json(&t);
    u.target = t.target;
    if (cm_tables_from_json(j, "/tables", &u, err, sizeof err))
        fail_msg("%s", err);
    assert_true(u.parent_bias_prefill == 1.25 && u.parent_bias_decode == 0.875);
    json_decref(j);
    arch_free(&a);
    cm_tables_free(&t);
    cm_tables_free(&u);
}

/* The import document for the synthetic tables, to be mutated by the cases below. */
static json_t *import_doc(void)
{
    cm_tables t;
    make_tables(&t);
    json_t *doc = json_pack("{s:s,s:o,s:o}", "format", "autocompress.timing-tables/1", "target",
                            cm_target_to_json(&t.target), "tables", cm_tables_to_json(&t));
    cm_tables_free(&t);
    assert_non_null(doc);
    return doc;
}

static void expect_reject(json_t *doc, const char *pointer)
{
    cm_tables t;
    char err[512];
    assert_int_equal(cm_tables_import(doc, &t, err, sizeof err), -1);
    if (!strstr(err, pointer))
        fail_msg("expected pointer %s in: %s", pointer, err);
    assert_null(t.prefill);
    json_decref(doc);
}

static void test_import_accepts_and_rejects(void **state)
{
    (void)state;
    cm_tables t;
    char err[512];
    json_t *doc = import_doc();
    if (cm_tables_import(doc, &t, err, sizeof err))
        fail_msg("%s", err);
    assert_string_equal(t.source, "import");
    assert_int_equal(t.n_prefill, 12);
    cm_tables_free(&t);
    json_decref(doc);

    doc = import_doc();
    json_object_set_new(doc, "format", json_string("v0"));
    expect_reject(doc, "/format");

    doc = import_doc();
    json_object_del(doc, "target");
    expect_reject(doc, "/target: required");

    doc = import_doc();
    json_object_set_new(json_object_get(json_object_get(doc, "target"), "workload"), "batch_size", json_integer(0));
    expect_reject(doc, "/target/workload/batch_size");

    doc = import_doc();
    json_object_set_new(json_array_get(json_object_get(json_object_get(doc, "tables"), "prefill"), 3), "ms",
                        json_string("fast"));
    expect_reject(doc, "/tables/prefill/3/ms");

    doc = import_doc();
    json_object_set_new(json_array_get(json_object_get(json_object_get(doc, "tables"), "prefill"), 1), "ms",
                        json_real(-1));
    expect_reject(doc, "/tables/prefill/1/ms");

    doc = import_doc();
    json_object_set_new(json_array_get(json_object_get(json_object_get(doc, "tables"), "prefill"), 0), "part",
                        json_string("moe"));
    expect_reject(doc, "/tables/prefill/0/part");

    doc = import_doc();
    json_object_set_new(json_array_get(json_object_get(json_object_get(doc, "tables"), "prefill"), 2), "speed",
                        json_integer(1));
    expect_reject(doc, "/tables/prefill/2/speed: unknown key");

    doc = import_doc(); /* duplicate entry */
    json_t *pre = json_object_get(json_object_get(doc, "tables"), "prefill");
    json_array_append_new(pre, json_deep_copy(json_array_get(pre, 0)));
    expect_reject(doc, "/tables/prefill/12: duplicate of /tables/prefill/0");

    doc = import_doc(); /* heads not a multiple of kv heads */
    json_object_set_new(json_array_get(json_object_get(json_object_get(doc, "tables"), "prefill"), 1), "n_heads",
                        json_integer(3));
    expect_reject(doc, "/tables/prefill/1/n_kv_heads");

    doc = import_doc(); /* contexts and ms of different lengths */
    json_t *d0 = json_array_get(json_object_get(json_object_get(doc, "tables"), "decode"), 4);
    json_object_set_new(d0, "ms", json_pack("[f,f]", 0.1, 0.2));
    expect_reject(doc, "/tables/decode/4/ms");

    doc = import_doc(); /* decreasing contexts */
    d0 = json_array_get(json_object_get(json_object_get(doc, "tables"), "decode"), 0);
    json_object_del(d0, "ms_at_context_0");
    json_object_del(d0, "ms_per_context");
    json_object_set_new(d0, "contexts", json_pack("[i,i]", 20, 10));
    json_object_set_new(d0, "ms", json_pack("[f,f]", 0.1, 0.2));
    json_object_set_new(d0, "mad_ms", json_pack("[f,f]", 0.0, 0.0));
    expect_reject(doc, "/tables/decode/0/contexts/1");

    doc = import_doc(); /* a prefill entry without its decode entry */
    json_array_remove(json_object_get(json_object_get(doc, "tables"), "decode"), 5);
    expect_reject(doc, "/tables/prefill/5: no decode entry");

    doc = import_doc();
    json_object_del(json_object_get(json_object_get(doc, "tables"), "memory"), "runtime_bytes");
    expect_reject(doc, "/tables/memory/runtime_bytes: required");

    doc = import_doc();
    json_object_set_new(json_object_get(json_object_get(doc, "tables"), "memory"), "workspace_combine",
                        json_string("min"));
    expect_reject(doc, "/tables/memory/workspace_combine");

    doc = import_doc(); /* a hidden size with entries but no fixed costs */
    json_array_remove(json_object_get(json_object_get(json_object_get(doc, "tables"), "fixed"), "by_hidden"), 1);
    expect_reject(doc, "/tables/prefill/6/hidden_size: 128 has no entry in fixed/by_hidden");

    doc = import_doc();
    json_object_set_new(json_object_get(json_object_get(doc, "tables"), "shape"), "tie_word_embeddings",
                        json_integer(1));
    expect_reject(doc, "/tables/shape/tie_word_embeddings");

    doc = import_doc();
    json_object_set_new(json_object_get(doc, "tables"), "parent_bias", json_pack("{s:f,s:f}", "prefill", 0.0, "decode", 1.0));
    expect_reject(doc, "/tables/parent_bias: both phases must lie in [0.1, 10]");

    doc = import_doc();   /* a bias no calibration can write: the anchor would scale by it unchecked */
    json_object_set_new(json_object_get(doc, "tables"), "parent_bias", json_pack("{s:f,s:f}", "prefill", 1.0, "decode", 1e-300));
    expect_reject(doc, "/tables/parent_bias: both phases must lie in [0.1, 10]");

    doc = import_doc();
    json_object_set_new(json_object_get(doc, "tables"), "parent_bias", json_pack("{s:f}", "prefill", 1.0));
    expect_reject(doc, "/tables/parent_bias/decode: required");

    doc = json_array();
    expect_reject(doc, "must be a JSON object");
}

/* The decode fit: least squares through the points, never negative at a sampled context. */
static void test_decode_fit(void **state)
{
    (void)state;
    cm_entry e;
    memset(&e, 0, sizeof e);
    e.n_ctx = 3;
    e.ctx[0] = 100;
    e.ctx[1] = 110;
    e.ctx[2] = 120;
    e.ctx_ms[0] = 1.0;
    e.ctx_ms[1] = 1.1;
    e.ctx_ms[2] = 1.2;
    cm_entry_fit_decode(&e);
    assert_true(fabs(e.ms_per_ctx - 0.01) < 1e-12);
    assert_true(fabs(e.ms0 - 0.0) < 1e-9);
    /* noise on a near-zero part: falls back to the flat mean */
    e.ctx_ms[0] = 0.002;
    e.ctx_ms[1] = 0.0;
    e.ctx_ms[2] = 0.0;
    cm_entry_fit_decode(&e);
    for (int k = 0; k < 3; k++)
        assert_true(e.ms0 + e.ms_per_ctx * e.ctx[k] >= 0);
    assert_true(e.ms_per_ctx == 0);
}

static void test_target_parse(void **state)
{
    (void)state;
    cm_target t;
    char err[256];
    json_t *j = json_pack("{s:s,s:{s:i,s:i,s:i}}", "device", "cpu", "workload", "batch_size", 8, "prompt_tokens", 256,
                          "output_tokens", 64);
    assert_int_equal(cm_target_from_json(j, "/target", &t, err, sizeof err), 0);
    assert_string_equal(t.precision, "fp32");
    assert_int_equal(t.batch_size, 8);
    json_object_set_new(j, "device", json_string("tpu"));
    assert_int_equal(cm_target_from_json(j, "/target", &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "/target/device"));
    json_decref(j);
}

/* fit_memory: what the tables miss on whole archs (measured peak minus predicted, median
 * over the fit archs) goes into runtime_bytes; an over-prediction comes off the workspaces
 * when they combine as a maximum, else changes nothing; an unmeasured arch is left out. */
static void test_fit_memory(void **state)
{
    (void)state;
    cm_tables t;
    make_tables(&t);
    static const int la[2][3] = {{4, 2, 64}, {2, 1, 32}}, lb[3][3] = {{2, 1, 128}, {4, 2, 32}, {0, 0, 64}};
    arch fa[3];
    make_arch(&fa[0], 64, 2, la);
    make_arch(&fa[1], 128, 3, lb);
    make_arch(&fa[2], 64, 3, lb);
    cm_prediction p[3];
    char err[256];
    ms_result fr[3];
    memset(fr, 0, sizeof fr);
    static const int64_t extra[3] = {3000, 5000, 4000};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cm_predict(&t, &fa[i], &p[i], err, sizeof err), 0);
        fr[i].reps = 1;
        fr[i].peak_bytes = p[i].total + extra[i];
    }
    int64_t resid = -1;
    assert_int_equal(fit_memory(&t, fa, fr, 3, &resid, err, sizeof err), 0);
    assert_int_equal(resid, 4000);
    assert_int_equal(t.mem.runtime_bytes, 5000 + 4000);
    cm_prediction q;
    assert_int_equal(cm_predict(&t, &fa[1], &q, err, sizeof err), 0);
    assert_int_equal(q.total, p[1].total + 4000);
    /* over-predicted (negative residuals; an unmeasured arch left out): with workspaces
     * combined as a maximum, taken off the workspaces, so each arch's prediction drops by
     * the median over-prediction */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cm_predict(&t, &fa[i], &p[i], err, sizeof err), 0);
        fr[i].peak_bytes = p[i].total - 1000 * (i + 1);
    }
    fr[2].reps = 0;
    fr[2].peak_bytes = q.total + 1000000;
    assert_int_equal(fit_memory(&t, fa, fr, 3, &resid, err, sizeof err), 0);
    assert_int_equal(resid, -1500);
    assert_int_equal(t.mem.runtime_bytes, 9000);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cm_predict(&t, &fa[i], &q, err, sizeof err), 0);
        assert_int_equal(q.total, p[i].total - 1500);
    }
    /* summed maxima: an over-prediction is left alone */
    t.mem.workspace_combine = CM_WS_SUM_MAXIMA;
    assert_int_equal(cm_predict(&t, &fa[0], &p[0], err, sizeof err), 0);
    fr[0].peak_bytes = fr[1].peak_bytes = p[0].total - 800;
    fr[1].reps = 0;
    assert_int_equal(fit_memory(&t, fa, fr, 2, &resid, err, sizeof err), 0);
    assert_int_equal(resid, 0);
    assert_int_equal(cm_predict(&t, &fa[0], &q, err, sizeof err), 0);
    assert_int_equal(q.total, p[0].total);
    for (int i = 0; i < 3; i++)
        arch_free(&fa[i]);
    cm_tables_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_on_grid),     cmocka_unit_test(test_interpolation),
        cmocka_unit_test(test_additive_prediction), cmocka_unit_test(test_phase_scales),
        cmocka_unit_test(test_json_round_trip),   cmocka_unit_test(test_decode_fit),
        cmocka_unit_test(test_import_accepts_and_rejects), cmocka_unit_test(test_target_parse),
        cmocka_unit_test(test_fit_memory),        cmocka_unit_test(test_copy_rescale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
