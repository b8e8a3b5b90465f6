/* tests/unit/test_report_html.c — the report page (api/report_html.c) read at a glance:
 * sizes in bytes carry a binary-unit figure beside them (api_fmt_bytes), and the x-axis labels of every
 * bar chart neither overlap one another nor leave the SVG, whatever their length. The
 * geometry check reads the label positions, anchors and rotations out of the page and
 * intersects their boxes (glyph widths estimated at 0.6 em per character, with a 2 px
 * gap required between neighbours).
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

#include "api/report_html.h"

static const char *const eight[] = {"arc_challenge", "arc_easy", "boolq", "hellaswag", "lambada_openai",
                                    "openbookqa", "piqa", "winogrande"};

/* A report shaped like bench/results/smollm2-135m-cpu.json, with n_layers layers. NEW. */
static json_t *sample_report(int n_layers)
{
    json_t *pl = json_array(), *rl = json_array();
    for (int i = 0; i < n_layers; i++) {
        json_array_append_new(pl, json_pack("{s:{s:i},s:{s:i}}", "mlp", "ffn_dim", 1536, "attention", "n_heads", 9));
        if (i % 5 != 4)
            json_array_append_new(rl, json_pack("{s:i,s:{s:i},s:{s:i}}", "source_layer", i, "mlp", "ffn_dim",
                                                 1024 + i, "attention", "n_heads", 6));
    }
    json_t *pa = json_object(), *ra = json_object();
    for (int k = 0; k < 8; k++) {
        json_object_set_new(pa, eight[k], json_pack("{s:f,s:f,s:i}", "acc", 0.30 + 0.05 * k, "stderr", 0.03, "n", 200));
        json_object_set_new(ra, eight[k], json_pack("{s:f,s:f,s:i}", "acc", 0.25 + 0.04 * k, "stderr", 0.03, "n", 200));
    }
    json_t *r = json_pack("{s:s,s:s,s:b}", "job_id", "job_test", "status", "succeeded", "complete", 1);
    json_object_set_new(r, "parent", json_pack("{s:I,s:o,s:{s:i,s:o}}", "params", (json_int_t)134515008, "accuracy",
                                               pa, "arch", "hidden_size", 576, "layers", pl));
    json_object_set_new(r, "result", json_pack("{s:I,s:o,s:{s:i,s:o}}", "params", (json_int_t)98037576, "accuracy",
                                               ra, "arch", "hidden_size", 504, "layers", rl));
    json_object_set_new(r, "memory",
                        json_pack("{s:I,s:f,s:{s:I,s:I,s:I,s:I,s:I}}", "naive_weights_plus_kv",
                                  (json_int_t)1610612736, "measured_peak", 410925416.0, "itemized", "weights",
                                  (json_int_t)392150432, "request_cache", (json_int_t)10649600, "prefill_workspace",
                                  (json_int_t)1536, "runtime_buffers", (json_int_t)0, "total",
                                  (json_int_t)402801568));
    return r;
}

static char *render(json_t *r)
{
    size_t len = 0;
    char *html = api_report_html(r, &len);
    assert_non_null(html);
    assert_int_equal(strlen(html), len);
    return html;
}

/* The value cell of the table row named key, e.g. "<tr><td>weights</td><td>VALUE</td>". */
static void row_value(const char *html, const char *key, char *out, size_t outlen)
{
    char pat[128];
    snprintf(pat, sizeof pat, "<tr><td>%s</td><td>", key);
    const char *p = strstr(html, pat);
    assert_non_null(p);
    p += strlen(pat);
    const char *e = strstr(p, "</td>");
    assert_non_null(e);
    snprintf(out, outlen, "%.*s", (int)(e - p), p);
}

static void test_sizes(void **state)
{
    (void)state;
    json_t *r = sample_report(30);
    char *html = render(r);
    char v[256];
    row_value(html, "weights", v, sizeof v);
    assert_string_equal(v, "392,150,432 B (374.0 MiB)");
    row_value(html, "naive_weights_plus_kv", v, sizeof v);
    assert_string_equal(v, "1,610,612,736 B (1.50 GiB)");
    row_value(html, "measured_peak", v, sizeof v);   /* a real in the JSON: still bytes */
    assert_string_equal(v, "410,925,416 B (391.9 MiB)");
    row_value(html, "prefill_workspace", v, sizeof v);
    assert_string_equal(v, "1,536 B (1.5 KiB)");
    row_value(html, "runtime_buffers", v, sizeof v);
    assert_string_equal(v, "0 B");
    free(html);
    json_decref(r);
}

static void test_fmt_bytes(void **state)
{
    (void)state;
    static const struct {
        double bytes;
        const char *want;
    } cases[] = {
        {0, "0 B"},
        {1023, "1,023 B"},
        {1024, "1,024 B (1.0 KiB)"},
        {1048575, "1,048,575 B (1.0 MiB)"},   /* rounds up into the next unit, not "1024.0 KiB" */
        {392150432, "392,150,432 B (374.0 MiB)"},
        {1073741824, "1,073,741,824 B (1.00 GiB)"},
        {1099511627776.0, "1,099,511,627,776 B (1.00 TiB)"},
        {1536.4, "1,536 B (1.5 KiB)"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(api_fmt_bytes(cases[i].bytes, buf, sizeof buf), 0);
        assert_string_equal(buf, cases[i].want);
    }
    assert_int_equal(api_fmt_bytes(-1, buf, sizeof buf), -1);
    assert_int_equal(api_fmt_bytes(NAN, buf, sizeof buf), -1);
    assert_int_equal(api_fmt_bytes(392150432, buf, 8), -1);   /* does not fit */
}

/* ---- chart geometry --------------------------------------------------------------- */

typedef struct {
    double x[4], y[4];   /* corners of the label's box, in SVG coordinates */
} quad;

/* The numeric attribute NAME='V' inside [tag, end), or def. */
static double attr_num(const char *tag, const char *end, const char *name, double def)
{
    char pat[32];
    snprintf(pat, sizeof pat, " %s='", name);
    const char *p = strstr(tag, pat);
    if (!p || p >= end)
        return def;
    return strtod(p + strlen(pat), NULL);
}

/* The box of the x-axis <text> element whose content is label, inside the svg
 * [svg, svg_end): searched from the first bar on, past the y-axis labels ("0"). */
static quad label_box(const char *svg, const char *svg_end, const char *label)
{
    char pat[128];
    snprintf(pat, sizeof pat, ">%s</text>", label);
    const char *bars = strstr(svg, "<rect");
    assert_true(bars && bars < svg_end);
    const char *hit = strstr(bars, pat);
    if (!hit || hit >= svg_end)
        fail_msg("label %s is not in the chart", label);
    const char *tag = hit;
    while (tag > svg && strncmp(tag, "<text", 5))
        tag--;
    double x = attr_num(tag, hit, "x", NAN), y = attr_num(tag, hit, "y", NAN);
    double fs = attr_num(tag, hit, "font-size", 16);
    assert_false(isnan(x) || isnan(y));
    double w = 0.6 * fs * (double)strlen(label), x0 = x;
    const char *anchor = strstr(tag, "text-anchor='");
    if (anchor && anchor < hit) {
        anchor += strlen("text-anchor='");
        if (!strncmp(anchor, "middle", 6))
            x0 = x - w / 2;
        else if (!strncmp(anchor, "end", 3))
            x0 = x - w;
    }
    double ang = 0, cx = 0, cy = 0;
    const char *rot = strstr(tag, "rotate(");
    if (rot && rot < hit) {
        int got = sscanf(rot, "rotate(%lf %lf %lf)", &ang, &cx, &cy);
        assert_true(got == 1 || got == 3);
        if (got == 1)
            cx = cy = 0;
    }
    /* the glyph box, 1 px wider on every side: neighbours keep a 2 px gap */
    double lx[4] = {x0 - 1, x0 + w + 1, x0 + w + 1, x0 - 1};
    double ly[4] = {y - 0.8 * fs - 1, y - 0.8 * fs - 1, y + 0.25 * fs + 1, y + 0.25 * fs + 1};
    double c = cos(ang * M_PI / 180), s = sin(ang * M_PI / 180);
    quad q;
    for (int k = 0; k < 4; k++) {
        q.x[k] = cx + (lx[k] - cx) * c - (ly[k] - cy) * s;
        q.y[k] = cy + (lx[k] - cx) * s + (ly[k] - cy) * c;
    }
    return q;
}

/* 1 when the two convex quads overlap (separating-axis test on their edge normals). */
static int quads_overlap(const quad *a, const quad *b)
{
    const quad *qs[2] = {a, b};
    for (int which = 0; which < 2; which++) {
        const quad *q = qs[which];
        for (int e = 0; e < 4; e++) {
            double nx = -(q->y[(e + 1) % 4] - q->y[e]), ny = q->x[(e + 1) % 4] - q->x[e];
            double amin = INFINITY, amax = -INFINITY, bmin = INFINITY, bmax = -INFINITY;
            for (int k = 0; k < 4; k++) {
                double pa = a->x[k] * nx + a->y[k] * ny, pb = b->x[k] * nx + b->y[k] * ny;
                amin = fmin(amin, pa);
                amax = fmax(amax, pa);
                bmin = fmin(bmin, pb);
                bmax = fmax(bmax, pb);
            }
            if (amax <= bmin || bmax <= amin)
                return 0;
        }
    }
    return 1;
}

/* The svg of the figure captioned caption: [*svg, *end) and its width and height. */
static void find_chart(const char *html, const char *caption, const char **svg, const char **end, double *w, double *h)
{
    char pat[160];
    snprintf(pat, sizeof pat, "<figcaption>%s</figcaption>", caption);
    const char *f = strstr(html, pat);
    if (!f)
        fail_msg("no chart '%s'", caption);
    *svg = strstr(f, "<svg");
    assert_non_null(*svg);
    *end = strstr(*svg, "</svg>");
    assert_non_null(*end);
    const char *tag_end = strchr(*svg, '>');
    *w = attr_num(*svg, tag_end, "width", NAN);
    *h = attr_num(*svg, tag_end, "height", NAN);
    assert_false(isnan(*w) || isnan(*h));
}

/* Every label of the chart lies inside the SVG and below its x axis, and no two overlap. */
static void check_labels(const char *html, const char *caption, const char *const *labels, int n)
{
    const char *svg, *end;
    double W, H;
    find_chart(html, caption, &svg, &end, &W, &H);
    double axis_y = attr_num(strstr(svg, "<line"), end, "y1", NAN);
    assert_false(isnan(axis_y));
    quad *q = calloc((size_t)n, sizeof *q);
    assert_non_null(q);
    for (int i = 0; i < n; i++) {
        q[i] = label_box(svg, end, labels[i]);
        for (int k = 0; k < 4; k++)
            if (q[i].x[k] < 0 || q[i].x[k] > W || q[i].y[k] <= axis_y || q[i].y[k] > H)
                fail_msg("%s: label '%s' corner (%.1f, %.1f) outside the %gx%g svg or above the axis at y=%g",
                         caption, labels[i], q[i].x[k], q[i].y[k], W, H, axis_y);
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (quads_overlap(&q[i], &q[j]))
                fail_msg("%s: labels '%s' and '%s' overlap", caption, labels[i], labels[j]);
    free(q);
}

static void test_accuracy_labels(void **state)
{
    (void)state;
    json_t *r = sample_report(30);
    char *html = render(r);
    check_labels(html, "Accuracy per benchmark", eight, 8);
    free(html);
    json_decref(r);
}

/* A benchmark the parent has no score for (its task failed) but the result has still gets
 * its row, and its bar in the chart; so does a perplexity only the result has. */
static void test_accuracy_union(void **state)
{
    (void)state;
    json_t *r = sample_report(3);
    json_t *res = json_object_get(r, "result");
    json_object_set_new(json_object_get(res, "accuracy"), "my_task",
                        json_pack("{s:f,s:f,s:i}", "acc", 0.61, "stderr", 0.02, "n", 50));
    json_object_set_new(res, "perplexity", json_pack("{s:f}", "wikitext2", 31.5));
    char *html = render(r);
    const char *row = strstr(html, "<tr><td>my_task</td>");
    assert_non_null(row);
    assert_non_null(strstr(row, "0.61"));
    assert_non_null(strstr(html, "<tr><td>wikitext2</td>"));
    free(html);
    json_decref(r);
}

/* The pruning section: the refit count and one error chart per projection kind; a plain
 * slice says so. */
static void test_pruning_section(void **state)
{
    (void)state;
    json_t *r = sample_report(4);
    json_object_set_new(r, "pruning",
                        json_pack("{s:b,s:s,s:i,s:f,s:f,s:[{s:i,s:s,s:b,s:f,s:f},{s:i,s:s,s:b,s:f,s:f},"
                                  "{s:i,s:s,s:b,s:f,s:f}]}",
                                  "reconstruct", 1, "method", "least_squares", "tokens", 16384, "damp", 0.01,
                                  "wall_s", 12.5, "projections", "layer", 0, "proj", "o_proj", "refit", 0,
                                  "rel_error_before", 0.0, "rel_error_after", 0.0, "layer", 0, "proj", "down_proj",
                                  "refit", 1, "rel_error_before", 0.4, "rel_error_after", 0.1, "layer", 1, "proj",
                                  "o_proj", "refit", 1, "rel_error_before", 0.3, "rel_error_after", 0.2));
    json_t *ps = json_object_get(json_object_get(r, "pruning"), "projections");
    for (int k = 0; k < 2; k++)   /* layer 1's q_proj and k_proj: one bar of (1 + 3) / (4 + 4) before */
        json_array_append_new(ps, json_pack("{s:i,s:s,s:b,s:f,s:f,s:f}", "layer", 1, "proj", k ? "k_proj" : "q_proj",
                                            "refit", 1, "error_before", k ? 3.0 : 1.0, "error_after", 1.0,
                                            "target_sq", 4.0));
    char *html = render(r);
    assert_non_null(strstr(html, "4 of 5 projections refit"));
    assert_non_null(strstr(html, "Relative reconstruction error of the input projections"));
    assert_non_null(strstr(html, "<title>0.5</title>"));    /* (1 + 3) / 8 */
    assert_non_null(strstr(html, "<title>0.25</title>"));   /* (1 + 1) / 8 */
    assert_non_null(strstr(html, "Relative reconstruction error of o_proj (out_proj: Mamba) per layer"));
    assert_non_null(strstr(html, "Relative reconstruction error of down_proj (the experts&#39; and shared"));
    assert_non_null(strstr(html, "<title>0.4</title>"));
    free(html);
    json_object_set_new(json_object_get(r, "pruning"), "reconstruct", json_false());
    html = render(r);
    assert_non_null(strstr(html, "plain slice"));
    assert_null(strstr(html, "reconstruction error"));
    free(html);
    json_decref(r);
}

/* What the search served: the anchor's numbers, a row per check and the servings set
 * aside beside other work; a search without an anchor says why; a report without a
 * search has no such section. */
static void test_served_section(void **state)
{
    (void)state;
    json_t *r = sample_report(4);
    json_object_set_new(r, "search", json_pack("{s:i,s:{s:{s:s,s:f,s:f,s:f,s:f},s:[{s:s,s:f,s:f,s:f,s:i}]}}",
                                               "selection_tokens", 4096, "served", "anchor", "engine",
                                               "autocompress", "parent_measured_ms", 4222.5,
                                               "parent_predicted_ms", 4027.5, "prefill_scale", 0.75,
                                               "decode_scale", 1.25, "checks", "arch", "h576 | L0 a9/3 f1536",
                                               "ratio_to_parent", 0.5, "latency_ms", 2111.25,
                                               "predicted_latency_ms", 2342.5, "peak_memory_bytes", 1048576));
    char *html = render(r);
    const char *sec = strstr(html, "Served during the search");
    assert_non_null(sec);
    assert_non_null(strstr(sec, "The parent served in 4222.5 ms (autocompress) against 4027.5 ms predicted"));
    assert_non_null(strstr(sec, "scaled by 0.75 and their decode times by 1.25"));
    assert_non_null(strstr(sec, "<tr><td>h576 | L0 a9/3 f1536</td><td>0.5</td><td>2111.2</td><td>2342.5</td>"));
    assert_null(strstr(sec, "set aside"));
    free(html);
    json_t *sv = json_object_get(json_object_get(r, "search"), "served");
    json_object_set_new(sv, "anchor_tries", json_pack("[{},{}]"));
    json_object_set_new(sv, "check_tries", json_pack("[{}]"));
    html = render(r);
    assert_non_null(strstr(html, "set aside, then served again: 2 servings of the parent at the anchor, 1 of the "
                                 "checks."));
    free(html);
    json_object_set_new(json_object_get(r, "search"), "served", json_pack("{s:[],s:s}", "checks", "skipped",
                                                                        "no memory <here>"));
    html = render(r);
    assert_non_null(strstr(html, "No anchor: no memory &lt;here&gt;. The search used the tables as calibrated."));
    free(html);
    json_object_del(json_object_get(r, "search"), "served");
    html = render(r);
    assert_non_null(strstr(html, "used the tables as calibrated"));
    free(html);
    json_object_del(r, "search");
    html = render(r);
    assert_null(strstr(html, "Served during the search"));
    free(html);
    json_decref(r);
}

/* An MoE student's report lists every expert's input projections: 30 layers of 20 records
 * (600), the last layer's bar in the input-projection chart too. */
static void test_pruning_section_moe(void **state)
{
    (void)state;
    json_t *r = sample_report(4), *ps = json_array();
    for (int l = 0; l < 30; l++)
        for (int x = 0; x < 20; x++)
            json_array_append_new(ps, json_pack("{s:i,s:s,s:i,s:b,s:f,s:f,s:f}", "layer", l, "proj",
                                                "experts.gate_proj", "expert", x, "refit", 1, "error_before",
                                                l == 29 ? 2.3 : 1.0, "error_after", 0.5, "target_sq", 4.0));
    json_object_set_new(r, "pruning", json_pack("{s:b,s:s,s:o}", "reconstruct", 1, "method", "least_squares",
                                                "projections", ps));
    char *html = render(r);
    assert_non_null(strstr(html, "600 of 600 projections refit"));
    assert_non_null(strstr(html, "<title>0.25</title>"));   /* layers 0-28: 20 / 80 */
    assert_non_null(strstr(html, "<title>0.575</title>"));   /* layer 29: 46 / 80 */
    free(html);
    json_decref(r);
}

/* Output projections by any name chart as output projections: a Mamba mixer's out_proj
 * beside o_proj, an expert's down_proj (summed per layer) beside down_proj, none of them
 * in the input projections' chart; and past 16,384 records (a large MoE) the last layers
 * still have their bars. */
static void test_pruning_output_projections(void **state)
{
    (void)state;
    json_t *r = sample_report(4), *ps = json_array();
    /* 48 layers x 400 records: 19,200 */
    for (int l = 0; l < 48; l++)
        for (int x = 0; x < 398; x++)
            json_array_append_new(ps, json_pack("{s:i,s:s,s:i,s:b,s:f,s:f,s:f}", "layer", l, "proj",
                                                "experts.gate_proj", "expert", x, "refit", 1, "error_before", 1.0,
                                                "error_after", 0.5, "target_sq", 4.0));
    for (int l = 0; l < 48; l++) {
        json_array_append_new(ps, json_pack("{s:i,s:s,s:i,s:b,s:f,s:f,s:f}", "layer", l, "proj", "experts.down_proj",
                                            "expert", 0, "refit", 1, "error_before", 3.0, "error_after", 1.0,
                                            "target_sq", 10.0));
        json_array_append_new(ps, json_pack("{s:i,s:s,s:b,s:f,s:f,s:f}", "layer", l, "proj",
                                            l == 47 ? "out_proj" : "o_proj", "refit", 1, "error_before", 1.0,
                                            "error_after", 0.7, "target_sq", 10.0));
    }
    json_object_set_new(r, "pruning", json_pack("{s:b,s:s,s:o}", "reconstruct", 1, "method", "least_squares",
                                                "projections", ps));
    char *html = render(r);
    const char *o = strstr(html, "Relative reconstruction error of o_proj"),
               *d = strstr(html, "Relative reconstruction error of down_proj"),
               *in = strstr(html, "Relative reconstruction error of the input projections");
    assert_non_null(o);
    assert_non_null(d);
    assert_non_null(in);
    assert_true(o < d && d < in);
    /* the o_proj chart: layer 47's out_proj bar (0.1 before); the down_proj chart: 0.3 */
    assert_non_null(strstr(o, "<title>0.1</title>"));
    assert_true(strstr(o, "<title>0.3</title>") != NULL && strstr(o, "<title>0.3</title>") > d);
    /* the input chart holds only the gate projections (0.25) and reaches layer 47 */
    assert_null(strstr(in, "<title>0.3</title>"));
    assert_null(strstr(in, "<title>0.1</title>"));
    assert_non_null(strstr(in, ">47<"));
    free(html);
    json_decref(r);
}

/* An MoE parent's report charts the experts kept and the routed experts' width per layer
 * (a dense one's does not). */
static void test_layer_charts_moe(void **state)
{
    (void)state;
    json_t *r = sample_report(3);
    char *html = render(r);
    assert_null(strstr(html, "Experts kept per MoE layer"));
    free(html);
    json_t *pl = json_array(), *rl = json_array();
    for (int i = 0; i < 3; i++)
        json_array_append_new(pl, json_pack("{s:{s:i},s:{s:i,s:i,s:i}}", "attention", "n_heads", 9, "moe", "n_experts",
                                            8, "expert_ffn_dim", 128, "shared_ffn_dim", 0));
    json_array_append_new(rl, json_pack("{s:i,s:{s:i},s:{s:i,s:i}}", "source_layer", 0, "attention", "n_heads", 9,
                                        "moe", "n_experts", 6, "expert_ffn_dim", 96));
    json_array_append_new(rl, json_pack("{s:i,s:{s:i},s:{s:i,s:i}}", "source_layer", 2, "attention", "n_heads", 9,
                                        "moe", "n_experts", 8, "expert_ffn_dim", 32));
    json_object_set_new(json_object_get(json_object_get(r, "parent"), "arch"), "layers", pl);
    json_object_set_new(json_object_get(json_object_get(r, "result"), "arch"), "layers", rl);
    html = render(r);
    const char *e = strstr(html, "Experts kept per MoE layer"), *w = strstr(html, "Routed experts&#39; width per MoE layer");
    assert_non_null(e);
    assert_non_null(w);
    assert_non_null(strstr(e, "<title>6</title>"));
    assert_non_null(strstr(w, "<title>96</title>"));
    assert_non_null(strstr(w, "<title>32</title>"));
    assert_null(strstr(html, "Mamba heads per layer"));
    assert_null(strstr(html, "Shared expert&#39;s width per MoE layer"));   /* no shared expert in the parent */
    free(html);
    /* a parent with shared experts of 512 units, the result's narrowed to 384 in layer 2 */
    for (int i = 0; i < 3; i++)
        json_object_set_new(json_object_get(json_array_get(pl, (size_t)i), "moe"), "shared_ffn_dim", json_integer(512));
    json_object_set_new(json_object_get(json_array_get(rl, 0), "moe"), "shared_ffn_dim", json_integer(512));
    json_object_set_new(json_object_get(json_array_get(rl, 1), "moe"), "shared_ffn_dim", json_integer(384));
    html = render(r);
    const char *s = strstr(html, "Shared expert&#39;s width per MoE layer");
    assert_non_null(s);
    assert_non_null(strstr(s, "<title>384</title>"));
    free(html);
    json_decref(r);
}

/* Layer charts: 30 layers (two-digit labels at the wide spacing) and 120 layers
 * (three-digit labels at the narrow one). */
static void test_layer_labels(void **state)
{
    (void)state;
    static const int sizes[] = {30, 120};
    for (int s = 0; s < 2; s++) {
        int n = sizes[s];
        json_t *r = sample_report(n);
        char *html = render(r);
        char(*lab)[16] = calloc((size_t)n, sizeof *lab);
        const char **labels = calloc((size_t)n, sizeof *labels);
        assert_true(lab && labels);
        for (int i = 0; i < n; i++) {
            snprintf(lab[i], sizeof lab[i], "%d", i);
            labels[i] = lab[i];
        }
        check_labels(html, "Kept FFN width per layer", labels, n);
        check_labels(html, "Attention heads per layer", labels, n);
        free(lab);
        free(labels);
        free(html);
        json_decref(r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_fmt_bytes),
        cmocka_unit_test(test_accuracy_labels),
        cmocka_unit_test(test_accuracy_union),
        cmocka_unit_test(test_pruning_output_projections),
        cmocka_unit_test(test_layer_labels),
        cmocka_unit_test(test_pruning_section),
        cmocka_unit_test(test_served_section),
        cmocka_unit_test(test_pruning_section_moe),
        cmocka_unit_test(test_layer_charts_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
