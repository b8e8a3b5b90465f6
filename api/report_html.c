/* api/report_html.c — GET /v1/jobs/{id}/report.html: the job's report (DESIGN.md §10)
 * as one self-contained HTML page with inline SVG charts (per-layer kept FFN width and
 * heads, parent vs result; predicted vs measured cost per limit, as % of the limit;
 * accuracy per benchmark, parent vs result) and tables; sizes show exact bytes with the
 * binary unit beside them. Chart labels are laid out (rotated when they would touch) so
 * that none overlaps another. No JavaScript, no external resources. Renders whatever the
 * report holds so far; absent parts are said so.
 */
#include "api/report_html.h"

#include "api/api_internal.h"
#include "storage/strbuf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void sb_text(strbuf *b, const char *t)
{
    for (const char *p = t ? t : ""; *p; p++) {
        switch (*p) {
        case '&': strbuf_printf(b, "&amp;"); break;
        case '<': strbuf_printf(b, "&lt;"); break;
        case '>': strbuf_printf(b, "&gt;"); break;
        case '"': strbuf_printf(b, "&quot;"); break;
        case '\'': strbuf_printf(b, "&#39;"); break;
        default: strbuf_printf(b, "%c", *p);
        }
    }
}

static double num(json_t *j, double def)
{
    return json_is_number(j) ? json_number_value(j) : def;
}

/* A JSON value as display text (numbers with 4 significant digits). */
static void sb_value(strbuf *b, json_t *v)
{
    if (json_is_integer(v))
        strbuf_printf(b, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        strbuf_printf(b, "%.4g", json_real_value(v));
    else if (json_is_true(v))
        strbuf_printf(b, "yes");
    else if (json_is_false(v))
        strbuf_printf(b, "<b class=bad>no</b>");
    else if (json_is_string(v))
        sb_text(b, json_string_value(v));
    else
        strbuf_printf(b, "&mdash;");
}

/* The next cell of a table row: closes the one before and shows v as sb_value does. */
static void sb_cell(strbuf *b, json_t *v)
{
    strbuf_printf(b, "</td><td>");
    sb_value(b, v);
}

/* A table row of obj's members named in cols (NULL-terminated), each as sb_value shows it. */
static void sb_row(strbuf *b, json_t *obj, const char *const *cols)
{
    strbuf_printf(b, "<tr><td>");
    sb_value(b, json_object_get(obj, cols[0]));
    for (int i = 1; cols[i]; i++)
        sb_cell(b, json_object_get(obj, cols[i]));
    strbuf_printf(b, "</td></tr>\n");
}

/* v with thousands separators ("392,150,432", "-1,024") into buf. */
static void group_digits(long long v, char *buf, size_t len)
{
    char d[32];
    int n = snprintf(d, sizeof d, "%lld", v), neg = d[0] == '-';
    size_t o = 0;
    for (int i = 0; i < n && o + 1 < len; i++) {
        buf[o++] = d[i];
        int rest = n - 1 - i;   /* digits after this one */
        if (i >= neg && rest > 0 && rest % 3 == 0 && o + 1 < len)
            buf[o++] = ',';
    }
    if (len)
        buf[o] = '\0';
}

int api_fmt_bytes(double bytes, char *buf, size_t len)
{
    if (!(bytes >= 0) || bytes > 9.0e18)
        return -1;
    char exact[32];
    group_digits(llround(bytes), exact, sizeof exact);
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    static const int decimals[] = {1, 1, 2, 2, 2};
    int u = -1;
    double v = bytes;
    if (llround(bytes) >= 1024) {
        /* the largest unit the value reaches once rounded: 1048575 B is 1.0 MiB, not 1024.0 KiB */
        u = 0;
        v = bytes / 1024;
        while (u + 1 < 5 && round(v * pow(10, decimals[u])) / pow(10, decimals[u]) >= 1024) {
            v /= 1024;
            u++;
        }
    }
    int n = u < 0 ? snprintf(buf, len, "%s B", exact)
                  : snprintf(buf, len, "%s B (%.*f %s)", exact, decimals[u], v, units[u]);
    return n >= 0 && (size_t)n < len ? 0 : -1;
}

/* A byte count as "392,150,432 B (374.0 MiB)"; anything but a non-negative number as
 * sb_value shows it. */
static void sb_bytes(strbuf *b, json_t *v)
{
    char t[96];
    if (json_is_number(v) && api_fmt_bytes(json_number_value(v), t, sizeof t) == 0)
        strbuf_printf(b, "%s", t);
    else
        sb_value(b, v);
}

/* A count with thousands separators ("134,515,008"); other values as sb_value. */
static void sb_count(strbuf *b, json_t *v)
{
    char t[32];
    if (json_is_integer(v)) {
        group_digits((long long)json_integer_value(v), t, sizeof t);
        strbuf_printf(b, "%s", t);
    } else {
        sb_value(b, v);
    }
}

#define C_PARENT "#9aa5b1"
#define C_RESULT "#2f6fb0"
#define C_MEAS "#e07b39"

/* x-axis labels: font size and the width estimate of one character (0.62 em: a little
 * wider than the average glyph of common sans-serif faces, so estimates err large). */
#define LABEL_FS 10
#define LABEL_CHAR_PX (0.62 * LABEL_FS)
#define LABEL_MAX_CHARS 24

/* Code points of UTF-8 s. */
static int utf8_chars(const char *s)
{
    int n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        n += (*p & 0xC0) != 0x80;
    return n;
}

/* The bytes of s's first k code points. */
static size_t utf8_prefix(const char *s, int k)
{
    const unsigned char *p = (const unsigned char *)s;
    for (; *p; p++)
        if ((*p & 0xC0) != 0x80 && k-- == 0)
            break;
    return (size_t)(p - (const unsigned char *)s);
}

/* How the x-axis labels of a chart are laid out: horizontal and centred when the widest
 * fits its group with a gap; else rotated (-45 degrees, or -90 when the groups are too
 * narrow for slanted lines to clear each other), ending at the group's centre. */
typedef struct {
    int angle;           /* 0, -45 or -90 */
    int left, bottom;    /* margins the labels need (px) */
} label_layout;

static double label_px(const char *s)
{
    int n = utf8_chars(s ? s : "");
    return (n > LABEL_MAX_CHARS ? LABEL_MAX_CHARS : n) * LABEL_CHAR_PX;
}

static label_layout layout_labels(const char *const *labels, int n, int gw, int min_left, int min_bottom)
{
    label_layout L = {0, min_left, min_bottom};
    double maxw = 0;
    for (int i = 0; i < n; i++)
        maxw = fmax(maxw, label_px(labels[i]));
    if (maxw + 4 <= gw)
        return L;
    /* slanted lines gw apart are gw*sin(45) apart across: a line of text needs 1.4 em */
    L.angle = gw * M_SQRT1_2 >= 1.4 * LABEL_FS ? -45 : -90;
    double reach = 0;
    for (int i = 0; i < n; i++) {
        double w = label_px(labels[i]);
        if (L.angle == -45) {
            /* the label runs down-left from (left + i*gw + gw/2, axis + 10) */
            double need = M_SQRT1_2 * (w + 0.8 * LABEL_FS) - (i * gw + gw / 2.0) + 4;
            if (need > L.left)
                L.left = (int)ceil(need);
            reach = fmax(reach, 10 + M_SQRT1_2 * (w + 0.25 * LABEL_FS) + 6);
        } else {
            reach = fmax(reach, 10 + w + 6);
        }
    }
    if (reach > L.bottom)
        L.bottom = (int)ceil(reach);
    return L;
}

/* One x-axis label centred under the group at xc (axis at y axis). */
static void svg_label(strbuf *b, const char *label, const label_layout *L, double xc, int axis)
{
    const char *s = label ? label : "";
    int n = utf8_chars(s), cut = n > LABEL_MAX_CHARS;
    char shown[4 * LABEL_MAX_CHARS + 8];
    if (cut)
        snprintf(shown, sizeof shown, "%.*s\xe2\x80\xa6", (int)utf8_prefix(s, LABEL_MAX_CHARS - 1), s);
    if (L->angle == 0) {
        strbuf_printf(b, "<text x='%.1f' y='%d' font-size='%d' text-anchor='middle'>", xc, axis + 12, LABEL_FS);
    } else {
        /* -90: the glyphs stand left of the baseline; shift it so the column is centred */
        double x = L->angle == -90 ? xc + 0.3 * LABEL_FS : xc;
        strbuf_printf(b, "<text x='%.1f' y='%d' font-size='%d' text-anchor='end' transform='rotate(%d %.1f %d)'>", x,
                      axis + 10, LABEL_FS, L->angle, x, axis + 10);
    }
    if (cut) {
        sb_text(b, shown);
        strbuf_printf(b, "<title>");
        sb_text(b, s);
        strbuf_printf(b, "</title>");
    } else {
        sb_text(b, s);
    }
    strbuf_printf(b, "</text>");
}

/* Grouped bar chart: n groups of 2 bars (a, b) with labels; NaN values are skipped.
 * The x-axis labels never overlap (layout_labels) and the SVG is sized to hold them. */
static void svg_bars(strbuf *b, const char *title, const char *const *labels, const double *a, const double *bv, int n,
                     const char *la, const char *lb, const char *ca, const char *cb, double ref, const char *ref_label)
{
    double max = ref > 0 ? ref : 0;
    for (int i = 0; i < n; i++) {
        if (!isnan(a[i]) && a[i] > max)
            max = a[i];
        if (!isnan(bv[i]) && bv[i] > max)
            max = bv[i];
    }
    if (max <= 0)
        max = 1;
    const int H = 180, top = 24;
    int gw = n > 24 ? 18 : 40;
    label_layout L = layout_labels(labels, n, gw, 48, 36);
    int left = L.left, W = left + n * gw + 140;
    strbuf_printf(b, "<figure><figcaption>");
    sb_text(b, title);
    strbuf_printf(b, "</figcaption><svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' role='img'>", W,
              H + top + L.bottom);
    strbuf_printf(b, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='#444'/>", left, top + H, left + n * gw, top + H);
    strbuf_printf(b, "<text x='%d' y='%d' font-size='10' text-anchor='end'>%.4g</text>", left - 4, top + 4, max);
    strbuf_printf(b, "<text x='%d' y='%d' font-size='10' text-anchor='end'>0</text>", left - 4, top + H);
    for (int i = 0; i < n; i++) {
        int x = left + i * gw + 2, bw = (gw - 6) / 2;
        double v[2] = {a[i], bv[i]};
        const char *col[2] = {ca, cb};
        for (int k = 0; k < 2; k++) {
            if (isnan(v[k]))
                continue;
            int h = (int)lround(v[k] / max * H);
            strbuf_printf(b, "<rect x='%d' y='%d' width='%d' height='%d' fill='%s'><title>%.6g</title></rect>",
                      x + k * bw, top + H - h, bw, h, col[k], v[k]);
        }
        svg_label(b, labels[i], &L, left + i * gw + gw / 2.0, top + H);
    }
    if (ref > 0) {
        int y = top + H - (int)lround(ref / max * H);
        strbuf_printf(b, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='#c00' stroke-dasharray='4 3'/>", left, y,
                  left + n * gw, y);
        strbuf_printf(b, "<text x='%d' y='%d' font-size='10' fill='#c00'>", left + n * gw + 4, y + 3);
        sb_text(b, ref_label);
        strbuf_printf(b, "</text>");
    }
    int lx = left + n * gw + 10;
    strbuf_printf(b, "<rect x='%d' y='%d' width='10' height='10' fill='%s'/><text x='%d' y='%d' font-size='11'>", lx,
              top + 20, ca, lx + 14, top + 29);
    sb_text(b, la);
    strbuf_printf(b, "</text><rect x='%d' y='%d' width='10' height='10' fill='%s'/><text x='%d' y='%d' font-size='11'>",
              lx, top + 36, cb, lx + 14, top + 45);
    sb_text(b, lb);
    strbuf_printf(b, "</text></svg></figure>\n");
}

/* One per-layer field (layers[].obj.key) of the parent (by index) into p and of the result
 * (by source layer; a layer removed keeps 0) into r, n entries. 1 when any parent layer has it. */
static int layer_field(json_t *pl, json_t *rl, int have_result, size_t n, const char *obj, const char *key, double *p,
                       double *r)
{
    int any = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_object_get(json_array_get(pl, i), obj);
        p[i] = num(json_object_get(o, key), 0);
        any |= o != NULL && json_is_object(o);
        r[i] = have_result ? 0 : NAN;
    }
    size_t i;
    json_t *l;
    json_array_foreach(rl, i, l) {
        long long src = (long long)num(json_object_get(l, "source_layer"), -1);
        if (src >= 0 && (size_t)src < n)
            r[src] = num(json_object_get(json_object_get(l, obj), key), 0);
    }
    return any;
}

/* Per-layer kept FFN width and heads (and, where the parent has them, experts, the routed
 * experts' width, the shared expert's width and Mamba heads): parent vs result (by source
 * layer). */
static void layer_charts(strbuf *b, json_t *parent_arch, json_t *result_arch)
{
    json_t *pl = json_object_get(parent_arch, "layers"), *rl = json_object_get(result_arch, "layers");
    size_t n = json_array_size(pl);
    if (n == 0) {
        strbuf_printf(b, "<p>The parent's architecture is not in the report yet.</p>\n");
        return;
    }
    if (n > 256)
        n = 256;
    char (*lab)[16] = calloc(n, sizeof *lab);
    const char **labels = calloc(n, sizeof *labels);
    double *pv = calloc(n, sizeof *pv), *rv = calloc(n, sizeof *rv);
    if (!lab || !labels || !pv || !rv) {
        b->oom = 1;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(lab[i], sizeof lab[i], "%zu", i);
        labels[i] = lab[i];
    }
    static const struct {
        const char *obj, *key, *title;
        int always, valued;   /* valued: drawn only where some parent layer has the field above 0 */
    } charts[] = {
        {"mlp", "ffn_dim", "Kept FFN width per layer", 1, 0},
        {"attention", "n_heads", "Attention heads per layer", 1, 0},
        {"moe", "n_experts", "Experts kept per MoE layer", 0, 0},
        {"moe", "expert_ffn_dim", "Routed experts' width per MoE layer", 0, 0},
        {"moe", "shared_ffn_dim", "Shared expert's width per MoE layer", 0, 1},
        {"mamba", "n_heads", "Mamba heads per layer", 0, 0},
    };
    for (size_t c = 0; c < sizeof charts / sizeof charts[0]; c++) {
        int any = layer_field(pl, rl, result_arch != NULL, n, charts[c].obj, charts[c].key, pv, rv), valued = 0;
        for (size_t i = 0; i < n; i++)
            valued |= pv[i] > 0;
        if ((any && (valued || !charts[c].valued)) || charts[c].always)
            svg_bars(b, charts[c].title, labels, pv, rv, (int)n, "parent", "result", C_PARENT, C_RESULT, 0, "");
    }
out:
    free(lab);
    free(labels);
    free(pv);
    free(rv);
}

static void limits_section(strbuf *b, json_t *limits)
{
    size_t n = json_array_size(limits);
    strbuf_printf(b, "<h2>Limits</h2>\n");
    if (n == 0) {
        strbuf_printf(b, "<p>No limit rows yet (they are written when the job succeeds).</p>\n");
        return;
    }
    strbuf_printf(b, "<table><tr><th>limit</th><th>value</th><th>search aimed at</th><th>predicted</th>"
                 "<th>measured</th><th>holds (predicted)</th><th>holds (measured)</th></tr>\n");
    size_t i;
    json_t *r;
    if (n > 16)
        n = 16;
    const char *labels[16];
    double pred[16], meas[16];
    static const char *const cols[] = {"name", "limit", "aimed", "predicted", "measured", "holds_predicted",
                                       "holds", NULL};
    json_array_foreach(limits, i, r) {
        if (i >= n)
            break;
        sb_row(b, r, cols);
        double lim = num(json_object_get(r, "limit"), 0);
        labels[i] = json_is_string(json_object_get(r, "name")) ? json_string_value(json_object_get(r, "name")) : "?";
        pred[i] = lim > 0 && json_is_number(json_object_get(r, "predicted"))
                      ? 100.0 * num(json_object_get(r, "predicted"), 0) / lim : NAN;
        meas[i] = lim > 0 && json_is_number(json_object_get(r, "measured"))
                      ? 100.0 * num(json_object_get(r, "measured"), 0) / lim : NAN;
    }
    strbuf_printf(b, "</table>\n");
    svg_bars(b, "Predicted vs measured cost, % of each limit", labels, pred, meas, (int)n, "predicted", "measured",
             C_RESULT, C_MEAS, 100.0, "limit");
}

/* Milliseconds to a tenth, or a dash. */
static void sb_ms(strbuf *b, json_t *v)
{
    if (json_is_number(v))
        strbuf_printf(b, "%.1f", json_number_value(v));
    else
        strbuf_printf(b, "&mdash;");
}

/* What the search served (report.search.served): the parent at the anchor against the
 * calibration, the scales that moved the tables, and each arch served beside the parent
 * with its prediction at the anchor, and how many servings beside other work were set
 * aside. A search without an anchor says why. */
static void served_section(strbuf *b, json_t *search)
{
    if (!json_is_object(search))
        return;
    json_t *sv = json_object_get(search, "served"), *an = json_object_get(sv, "anchor");
    strbuf_printf(b, "<h2>Served during the search</h2>\n<p>");
    json_t *skipped = json_object_get(sv, "skipped");
    if (json_is_string(skipped)) {
        strbuf_printf(b, "No anchor: ");
        sb_text(b, json_string_value(skipped));
        strbuf_printf(b, ". The search used the tables as calibrated.</p>\n");
        return;
    }
    if (!json_is_object(an)) {
        strbuf_printf(b, "Nothing: the search used the tables as calibrated (constraints.served_check false, or "
                         "tables imported from an engine this server does not run).</p>\n");
        return;
    }
    json_t *eng = json_object_get(an, "engine");
    strbuf_printf(b, "The parent served in ");
    sb_ms(b, json_object_get(an, "parent_measured_ms"));
    strbuf_printf(b, " ms (");
    sb_text(b, json_is_string(eng) ? json_string_value(eng) : "llama.cpp");   /* engine: since the built-in one serves too */
    strbuf_printf(b, ") against ");
    sb_ms(b, json_object_get(an, "parent_predicted_ms"));
    strbuf_printf(b, " ms predicted by the calibration: the tables' prefill times were scaled by ");
    sb_value(b, json_object_get(an, "prefill_scale"));
    strbuf_printf(b, " and their decode times by ");
    sb_value(b, json_object_get(an, "decode_scale"));
    strbuf_printf(b, " before the search.");
    size_t aside = json_array_size(json_object_get(sv, "anchor_tries")),
           caside = json_array_size(json_object_get(sv, "check_tries"));
    if (aside || caside)
        strbuf_printf(b, " Served beside other work and set aside, then served again: %zu serving%s of the "
                         "parent at the anchor, %zu of the checks.",
                      aside, aside == 1 ? "" : "s", caside);
    strbuf_printf(b, "</p>\n");
    json_t *checks = json_object_get(sv, "checks");
    if (json_array_size(checks) == 0) {
        strbuf_printf(b, "<p>No arch was served beside it (the parent met the limits at the anchor, or the "
                         "method does not check its result).</p>\n");
        return;
    }
    strbuf_printf(b, "<table><tr><th>arch served</th><th>ratio to the parent</th><th>latency ms</th>"
                     "<th>predicted ms</th><th>peak memory</th></tr>\n");
    size_t i;
    json_t *c;
    json_array_foreach(checks, i, c) {
        strbuf_printf(b, "<tr><td>");
        sb_value(b, json_object_get(c, "arch"));
        sb_cell(b, json_object_get(c, "ratio_to_parent"));
        strbuf_printf(b, "</td><td>");
        sb_ms(b, json_object_get(c, "latency_ms"));
        strbuf_printf(b, "</td><td>");
        sb_ms(b, json_object_get(c, "predicted_latency_ms"));
        strbuf_printf(b, "</td><td>");
        sb_bytes(b, json_object_get(c, "peak_memory_bytes"));
        strbuf_printf(b, "</td></tr>\n");
    }
    strbuf_printf(b, "</table>\n");
}

/* The accuracy of one model on a benchmark (its member of "accuracy") and the accuracy's
 * standard error, as the next two cells. */
static void acc_cells(strbuf *b, json_t *acc)
{
    sb_cell(b, json_object_get(acc, "acc"));
    sb_cell(b, json_object_get(acc, "stderr"));
}

/* The member names of a, b and c (any may be NULL), each once, in the order first seen,
 * into out (at most max). Their count. */
static int union_keys(json_t *a, json_t *b, json_t *c, const char **out, int max)
{
    json_t *objs[] = {a, b, c};
    int n = 0;
    for (int o = 0; o < 3; o++) {
        const char *k;
        json_t *v;
        json_object_foreach(objs[o], k, v) {
            int seen = 0;
            for (int i = 0; i < n && !seen; i++)
                seen = !strcmp(out[i], k);
            if (!seen && n < max)
                out[n++] = k;
        }
    }
    return n;
}

/* Parent and result per benchmark; with evaluation.pruned also the pruned-only student
 * (pruned may be NULL), so the table shows what distillation recovered. */
static void accuracy_section(strbuf *b, json_t *parent, json_t *result, json_t *pruned)
{
    json_t *pa = json_object_get(parent, "accuracy"), *ra = json_object_get(result, "accuracy");
    json_t *qa = json_object_get(pruned, "accuracy");
    int with_pruned = json_object_size(qa) > 0;
    strbuf_printf(b, "<h2>Accuracy</h2>\n");
    if (json_object_size(pa) == 0 && json_object_size(ra) == 0) {
        strbuf_printf(b, "<p>No benchmark results in the report.</p>\n");
    } else {
        strbuf_printf(b, "<table><tr><th>benchmark</th><th>parent</th><th>&plusmn;</th>%s<th>result</th><th>&plusmn;</th>"
                     "<th>n</th></tr>\n",
                  with_pruned ? "<th>pruned only</th><th>&plusmn;</th>" : "");
        /* every benchmark any of them scored: one the parent failed still shows the result's */
        const char *labels[64];
        double pv[64], rv[64];
        int n = union_keys(pa, ra, with_pruned ? qa : NULL, labels, 64);
        for (int i = 0; i < n; i++) {
            json_t *v = json_object_get(pa, labels[i]), *r = json_object_get(ra, labels[i]);
            strbuf_printf(b, "<tr><td>");
            sb_text(b, labels[i]);
            acc_cells(b, v);
            if (with_pruned)
                acc_cells(b, json_object_get(qa, labels[i]));
            acc_cells(b, r);
            sb_cell(b, json_object_get(v ? v : r, "n"));
            strbuf_printf(b, "</td></tr>\n");
            pv[i] = num(json_object_get(v, "acc"), NAN);
            rv[i] = num(json_object_get(r, "acc"), NAN);
        }
        strbuf_printf(b, "<tr><td><b>average</b></td><td>");
        sb_value(b, json_object_get(parent, "average"));
        if (with_pruned) {
            strbuf_printf(b, "</td><td></td><td>");
            sb_value(b, json_object_get(pruned, "average"));
        }
        strbuf_printf(b, "</td><td></td><td>");
        sb_value(b, json_object_get(result, "average"));
        strbuf_printf(b, "</td><td></td><td></td></tr></table>\n");
        if (n > 0)
            svg_bars(b, "Accuracy per benchmark", labels, pv, rv, n, "parent", "result", C_PARENT, C_RESULT, 0, "");
    }
    json_t *pp = json_object_get(parent, "perplexity"), *rp = json_object_get(result, "perplexity");
    if (json_object_size(pp) || json_object_size(rp)) {
        json_t *qp = json_object_get(pruned, "perplexity");
        strbuf_printf(b, "<table><tr><th>perplexity</th><th>parent</th>%s<th>result</th></tr>\n",
                  with_pruned ? "<th>pruned only</th>" : "");
        const char *keys[64];
        int n = union_keys(pp, rp, with_pruned ? qp : NULL, keys, 64);
        for (int i = 0; i < n; i++) {
            strbuf_printf(b, "<tr><td>");
            sb_text(b, keys[i]);
            sb_cell(b, json_object_get(pp, keys[i]));
            if (with_pruned)
                sb_cell(b, json_object_get(qp, keys[i]));
            sb_cell(b, json_object_get(rp, keys[i]));
            strbuf_printf(b, "</td></tr>\n");
        }
        strbuf_printf(b, "</table>\n");
    }
}

/* Rows "label: value" of an object's members named in keys, each shown by show. */
static void kv_table(strbuf *b, const char *title, json_t *obj, const char *const *keys,
                     void (*show)(strbuf *, json_t *))
{
    strbuf_printf(b, "<h2>");
    sb_text(b, title);
    strbuf_printf(b, "</h2>\n");
    if (!json_is_object(obj)) {
        strbuf_printf(b, "<p>Not in the report yet.</p>\n");
        return;
    }
    strbuf_printf(b, "<table>\n");
    for (int i = 0; keys[i]; i++) {
        strbuf_printf(b, "<tr><td>");
        sb_text(b, keys[i]);
        strbuf_printf(b, "</td><td>");
        show(b, json_object_get(obj, keys[i]));
        strbuf_printf(b, "</td></tr>\n");
    }
    strbuf_printf(b, "</table>\n");
}

/* How the student was cut; after a least-squares reconstruction, each projection's
 * relative error against the parent's output before and after, per layer (one chart for
 * o_proj, one for down_proj). */
static void pruning_section(strbuf *b, json_t *pr)
{
    if (!json_is_object(pr))
        return;
    strbuf_printf(b, "<h2>Pruning</h2>\n<p>");
    if (!json_is_true(json_object_get(pr, "reconstruct"))) {
        strbuf_printf(b, "The student is the plain slice of the ranked parent (pruning.reconstruct is false).</p>\n");
        return;
    }
    json_t *ps = json_object_get(pr, "projections");
    size_t n = json_array_size(ps), refit = 0, i;
    json_t *p;
    json_array_foreach(ps, i, p)
        refit += json_is_true(json_object_get(p, "refit"));
    strbuf_printf(b, "Least-squares reconstruction on ");
    sb_count(b, json_object_get(pr, "tokens"));
    strbuf_printf(b, " calibration tokens (damp ");
    sb_value(b, json_object_get(pr, "damp"));
    strbuf_printf(b, ", ");
    sb_value(b, json_object_get(pr, "wall_s"));
    strbuf_printf(b, " s): %zu of %zu projections refit; the others read nothing pruned or gained nothing.</p>\n",
                  refit, n);
    /* a bar per layer, however many records a layer has (an MoE lists every expert's) */
    char (*lab)[24] = calloc(n ? n : 1, sizeof *lab);
    const char **labels = calloc(n ? n : 1, sizeof *labels);
    double *e0 = calloc(n ? n : 1, sizeof *e0), *e1 = calloc(n ? n : 1, sizeof *e1);
    if (!lab || !labels || !e0 || !e1) {
        b->oom = 1;
        goto out;
    }
    /* the output projections (attention's o_proj, a Mamba mixer's out_proj; the down_proj of
     * the MLP, the experts and the shared expert) and the input projections (q/k/v,
     * gate/up, in_proj, an MoE's router and experts), each chart a bar per layer: its
     * records' errors summed over their targets (a single record: its own ratio) */
    static const char *const titles[] = {"Relative reconstruction error of o_proj (out_proj: Mamba) per layer",
                                         "Relative reconstruction error of down_proj (the experts' and shared "
                                         "expert's too; summed) per layer",
                                         "Relative reconstruction error of the input projections (q/k/v, gate/up, in_proj, an "
                                         "MoE's router and experts; summed) per layer"};
    for (int k = 0; k < 3; k++) {
        int m = 0, cnt = 0;
        long long last = -1;
        double s0 = 0, s1 = 0, t = 0, r0 = NAN, r1 = NAN;
        for (i = 0; i <= n; i++) {
            p = i < n ? json_array_get(ps, i) : NULL;
            const char *pn = p ? json_string_value(json_object_get(p, "proj")) : NULL;
            size_t pl = pn ? strlen(pn) : 0;
            int kind = !pn ? -1
                       : !strcmp(pn, "o_proj") || !strcmp(pn, "out_proj") ? 0
                       : pl >= 9 && !strcmp(pn + pl - 9, "down_proj") ? 1 : 2;
            if (p && kind != k)
                continue;
            long long layer = p ? (long long)num(json_object_get(p, "layer"), -1) : -2;
            if (m > 0 && layer != last) {   /* the previous bar is complete */
                e0[m - 1] = cnt == 1 && !isnan(r0) ? r0 : t > 0 ? s0 / t : NAN;
                e1[m - 1] = cnt == 1 && !isnan(r1) ? r1 : t > 0 ? s1 / t : NAN;
            }
            if (!p)
                break;
            if (layer != last) {   /* a new bar */
                snprintf(lab[m], sizeof lab[m], "%lld", layer);
                labels[m] = lab[m];
                m++;
                last = layer;
                cnt = 0;
                s0 = s1 = t = 0;
            }
            cnt++;
            s0 += num(json_object_get(p, "error_before"), 0);
            s1 += num(json_object_get(p, "error_after"), 0);
            t += num(json_object_get(p, "target_sq"), 0);
            r0 = num(json_object_get(p, "rel_error_before"), NAN);
            r1 = num(json_object_get(p, "rel_error_after"), NAN);
        }
        if (m)
            svg_bars(b, titles[k], labels, e0, e1, m, "slice", "refit", C_PARENT, C_RESULT, 0, "");
    }
out:
    free(lab);
    free(labels);
    free(e0);
    free(e1);
}

char *api_report_html(json_t *r, size_t *len)
{
    strbuf b = {0};
    json_t *parent = json_object_get(r, "parent"), *result = json_object_get(r, "result");
    json_t *target = json_object_get(r, "target"), *wl = json_object_get(target, "workload");
    strbuf_printf(&b, "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>AutoCompress report ");
    sb_text(&b, json_string_value(json_object_get(r, "job_id")));
    strbuf_printf(&b, "</title><style>body{font-family:sans-serif;max-width:1100px;margin:1em auto;color:#222}"
                  "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;"
                  "text-align:right}td:first-child,th:first-child{text-align:left}.bad{color:#c00}"
                  "figure{margin:1em 0}figcaption{font-weight:bold}</style></head><body>\n");
    strbuf_printf(&b, "<h1>AutoCompress report</h1>\n<table>\n<tr><td>job</td><td>");
    sb_text(&b, json_string_value(json_object_get(r, "job_id")));
    strbuf_printf(&b, "</td></tr>\n<tr><td>status</td><td>");
    sb_text(&b, json_string_value(json_object_get(r, "status")));
    if (!json_is_true(json_object_get(r, "complete")))
        strbuf_printf(&b, " (partial report)");
    strbuf_printf(&b, "</td></tr>\n<tr><td>method</td><td>");
    sb_value(&b, json_object_get(r, "method"));
    strbuf_printf(&b, "</td></tr>\n<tr><td>target</td><td>");
    sb_value(&b, json_object_get(target, "device"));
    strbuf_printf(&b, " ");
    sb_value(&b, json_object_get(target, "precision"));
    strbuf_printf(&b, ", batch ");
    sb_value(&b, json_object_get(wl, "batch_size"));
    strbuf_printf(&b, ", prompt ");
    sb_value(&b, json_object_get(wl, "prompt_tokens"));
    strbuf_printf(&b, " + output ");
    sb_value(&b, json_object_get(wl, "output_tokens"));
    strbuf_printf(&b, " tokens</td></tr>\n<tr><td>calibration</td><td>");
    sb_value(&b, json_object_get(r, "calibration_id"));
    strbuf_printf(&b, "</td></tr>\n<tr><td>parameters</td><td>");
    sb_count(&b, json_object_get(parent, "params"));
    strbuf_printf(&b, " &rarr; ");
    sb_count(&b, json_object_get(result, "params"));
    strbuf_printf(&b, "</td></tr>\n</table>\n");

    limits_section(&b, json_object_get(r, "limits"));
    served_section(&b, json_object_get(r, "search"));
    strbuf_printf(&b, "<h2>Architecture</h2>\n");
    layer_charts(&b, json_object_get(parent, "arch"), json_object_get(result, "arch"));
    strbuf_printf(&b, "<p>hidden size: ");
    sb_value(&b, json_object_get(json_object_get(parent, "arch"), "hidden_size"));
    strbuf_printf(&b, " &rarr; ");
    sb_value(&b, json_object_get(json_object_get(result, "arch"), "hidden_size"));
    /* the result's arch is in the report once the job succeeded: before, a dash, not 0 layers */
    json_t *pl = json_object_get(json_object_get(parent, "arch"), "layers");
    json_t *rl = json_object_get(json_object_get(result, "arch"), "layers");
    strbuf_printf(&b, "; layers: ");
    if (json_is_array(pl))
        strbuf_printf(&b, "%zu", json_array_size(pl));
    else
        strbuf_printf(&b, "&mdash;");
    strbuf_printf(&b, " &rarr; ");
    if (json_is_array(rl))
        strbuf_printf(&b, "%zu", json_array_size(rl));
    else
        strbuf_printf(&b, "&mdash;");
    strbuf_printf(&b, "</p>\n");
    accuracy_section(&b, parent, result, json_object_get(r, "pruned"));
    pruning_section(&b, json_object_get(r, "pruning"));

    static const char *const mem_keys[] = {"naive_weights_plus_kv", "measured_peak", NULL};
    json_t *mem = json_object_get(r, "memory");
    kv_table(&b, "Memory", mem, mem_keys, sb_bytes);
    static const char *const item_keys[] = {"weights", "request_cache", "prefill_workspace", "runtime_buffers",
                                            "total", NULL};
    if (json_is_object(json_object_get(mem, "itemized")))
        kv_table(&b, "Itemized memory estimate", json_object_get(mem, "itemized"), item_keys, sb_bytes);
    static const char *const search_keys[] = {"selection_tokens", "iterations", "wall_s", NULL};
    kv_table(&b, "Architecture selection", json_object_get(r, "search"), search_keys, sb_value);
    static const char *const dist_keys[] = {"tokens", "steps", "final_kd_loss", "val_loss", "resumed_from_step",
                                            "wall_s", NULL};
    kv_table(&b, "Distillation", json_object_get(r, "distillation"), dist_keys, sb_value);

    strbuf_printf(&b, "<h2>Stages</h2>\n<table><tr><th>stage</th><th>wall s</th><th>attempt</th></tr>\n");
    size_t i;
    json_t *s;
    static const char *const stage_cols[] = {"name", "wall_s", "attempt", NULL};
    json_array_foreach(json_object_get(r, "stages"), i, s)
        sb_row(&b, s, stage_cols);
    strbuf_printf(&b, "</table>\n</body></html>\n");
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    *len = b.len;
    return b.s;
}

/* GET /v1/jobs/{id}/report.html: 200 text/html (the report so far, partial while the
 * job runs), 404 problem for an unknown job, 503 when the store cannot be read (as every
 * other route answers it), 500 when memory fails. */
void h_report_html(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp)
{
    (void)req;
    store_job j;
    int rc = store_job_get(ctx->st, params[0], &j);
    if (rc == 0 && strcmp(j.kind, "job") != 0) {
        store_job_clear(&j);
        rc = 1;
    }
    if (rc != 0) {
        api_problem(resp, rc == 1 ? 404 : 503, rc == 1 ? "not_found" : "store_unavailable",
                    rc == 1 ? "no such job" : "the job store could not be read", NULL);
        return;
    }
    json_t *r = json_is_object(j.report) ? json_deep_copy(j.report) : json_object();
    json_object_set_new(r, "job_id", json_string(j.id));
    json_object_set_new(r, "status", json_string(j.status));
    json_object_set_new(r, "complete", json_boolean(!strcmp(j.status, "succeeded")));
    json_object_set(r, "method", json_object_get(j.spec, "method"));
    json_object_set(r, "target", json_object_get(j.spec, "target"));
    store_job_clear(&j);
    size_t len = 0;
    char *html = r ? api_report_html(r, &len) : NULL;
    json_decref(r);
    if (!html) {
        api_problem(resp, 500, "internal", "out of memory rendering the report", NULL);
        return;
    }
    /* the page holds no script and loads nothing: a policy that says so, should an escape
     * ever be missed */
    api_resp_header(resp, "Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:");
    api_resp_header(resp, "X-Content-Type-Options", "nosniff");
    api_text(resp, 200, html, len, "text/html; charset=utf-8");
}
