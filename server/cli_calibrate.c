/* server/cli_calibrate.c — `autocompress calibrate`: measure timing tables and the memory
 * model of a parent shape on a target (compress/calibrate.h), validate them on held-out
 * random archs, cache the result under the data dir and print it; or import tables
 * measured in another engine (docs/timing-tables.md). Weights are random: only the
 * shape matters, so --model reads the shape alone. Progress goes to stderr
 * (server/progress.h: a bar on a terminal, plain lines elsewhere); -v adds a line per request.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "compress/calibrate.h"
#include "compress/costmodel.h"
#include "server/cli.h"
#include "server/cli_args.h"
#include "server/progress.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: autocompress calibrate (--model PATH | --arch FILE) [--device cpu] [--batch B]\n"
            "                              [--prompt S] [--output N] [--precision fp32] [--json]\n"
            "                              [--reps R] [--models K] [--validate V] [--validate-reps R] [--fit F]\n"
            "                              [--hidden H1,H2,... | --no-hidden] [--seed N] [--threads T]\n"
            "                              [--data-dir DIR]\n"
            "                              [--no-cache] [-v]\n"
            "       autocompress calibrate --import TABLES.json [--data-dir DIR] [--json]\n"
            "Times every part size the search can choose (attention per head/KV-head count, FFN per\n"
            "width, removed parts) for the prefill of B×S tokens and the N decode steps, plus fixed\n"
            "costs; itemizes memory from the engine's byte accounting; validates on V held-out random\n"
            "archs (default 10); F random fit archs (default 6) correct the phase scales\n"
            "(docs/timing-tables.md). Defaults: batch 1, prompt 256, output 64, and the hidden sizes a\n"
            "hidden-size search may choose (4/8..7/8 of the parent's; --no-hidden: the parent's only),\n"
            "as a job with the default spec calibrates, so the two share one cached calibration in\n"
            "DIR/calibrations/ (DIR: --data-dir, $AC_DATA_DIR, or ./var); reused unless --no-cache.\n");
}

static void print_summary(json_t *cal)
{
    json_t *v = json_object_get(cal, "validation"), *cost = json_object_get(cal, "cost");
    printf("calibration %s  entries %lld  wall %.1f s", json_string_value(json_object_get(cal, "id")),
           (long long)json_integer_value(json_object_get(cal, "entries")),
           json_number_value(json_object_get(cal, "wall_s")));
    if (cost)
        printf("  (requests %lld, tables %.1f s, validation %.1f s)",
               (long long)json_integer_value(json_object_get(cost, "requests")),
               json_number_value(json_object_get(cost, "tables_wall_s")),
               json_number_value(json_object_get(cost, "validation_wall_s")));
    printf("\n");
    if (!v || json_integer_value(json_object_get(v, "archs")) == 0)
        return;
    printf("%-4s %10s %10s %7s %12s %12s %7s %8s  %s\n", "#", "pred_ms", "meas_ms", "err%", "pred_MiB", "meas_MiB",
           "err%", "naive%", "arch");
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(v, "rows"), i, r) {
        printf("%-4zu %10.1f %10.1f %7.2f %12.1f %12.1f %7.2f %8.2f  %s\n", i,
               json_number_value(json_object_get(r, "predicted_latency_ms")),
               json_number_value(json_object_get(r, "measured_latency_ms")),
               json_number_value(json_object_get(r, "latency_error_pct")),
               json_integer_value(json_object_get(r, "predicted_memory_bytes")) / 1048576.0,
               json_integer_value(json_object_get(r, "measured_peak_memory_bytes")) / 1048576.0,
               json_number_value(json_object_get(r, "memory_error_pct")),
               json_number_value(json_object_get(r, "naive_memory_error_pct")),
               json_string_value(json_object_get(r, "summary")));
    }
    printf("latency MAPE %.2f%% (max %.2f%%)  memory MAPE %.2f%% (max %.2f%%)  naive weights+KV MAPE %.2f%%\n",
           json_number_value(json_object_get(v, "latency_mape_pct")),
           json_number_value(json_object_get(v, "latency_max_pct")),
           json_number_value(json_object_get(v, "memory_mape_pct")),
           json_number_value(json_object_get(v, "memory_max_pct")),
           json_number_value(json_object_get(v, "naive_memory_mape_pct")));
}

typedef struct {
    progress_bar *pb;
    int verbose;   /* -v: a log line per request (what the library printed itself before) */
} cal_display;

static int on_progress(void *ud, const char *what, int step, int total)
{
    cal_display *d = ud;
    if (d->verbose)
        pb_notef(d->pb, "calibrate: %s (%d/%d)", what, step, total);
    pb_update(d->pb, "calibrate", step, total, "req", what);
    return 0;
}

/* --import: validate a timing-tables document and store it as a calibration. */
static int do_import(const char *path, const char *data_dir, int as_json)
{
    json_error_t je;
    char err[512];
    json_t *doc = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!doc) {
        fprintf(stderr, "calibrate: %s:%d: %s\n", path, je.line, je.text);
        return 1;
    }
    cm_tables tb;
    if (cm_tables_import(doc, &tb, err, sizeof err)) {
        fprintf(stderr, "calibrate: %s: %s\n", path, err);
        json_decref(doc);
        return 1;
    }
    /* id: content hash of the canonical document */
    char *text = json_dumps(doc, JSON_SORT_KEYS | JSON_COMPACT);
    unsigned long long h = 1469598103934665603ULL;
    for (const char *p = text; p && *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    free(text);
    char id[40];
    snprintf(id, sizeof id, "cal_%016llx", h);
    json_t *tables = cm_tables_to_json(&tb), *target = cm_target_to_json(&tb.target);
    json_t *cal = tables && target ? json_pack("{s:s,s:s,s:o,s:s,s:i,s:f,s:o,s:s,s:{s:i}}", "id", id, "status",
                                               "succeeded", "target", target, "family", tb.family, "entries",
                                               tb.n_prefill + tb.n_decode + 2 * tb.n_fixed, "wall_s", 0.0,
                                               "tables", tables, "source", "import", "validation", "archs", 0)
                                   : NULL;
    cm_tables_free(&tb);
    json_decref(doc);
    if (!cal) {
        if (!(tables && target)) {   /* json_pack was not called: nothing stolen */
            json_decref(tables);
            json_decref(target);
        }
        fprintf(stderr, "calibrate: out of memory\n");
        return 1;
    }
    if (cm_calibration_save(data_dir, cal, err, sizeof err)) {
        fprintf(stderr, "calibrate: %s\n", err);
        json_decref(cal);
        return 1;
    }
    if (as_json) {
        json_dumpf(cal, stdout, JSON_INDENT(2) | JSON_SORT_KEYS);
        printf("\n");
    } else {
        printf("imported %s as %s\n", path, id);
    }
    json_decref(cal);
    return 0;
}

int cli_calibrate(int argc, char **argv)
{
    const char *model = NULL, *arch_file = NULL, *import = NULL, *data_dir = getenv("AC_DATA_DIR");
    int as_json = 0, no_cache = 0, hidden_set = 0;
    cm_target t;
    cal_opts o;
    cm_target_default(&t);
    cal_opts_default(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            as_json = 1;
        } else if (!strcmp(a, "--no-cache")) {
            no_cache = 1;
        } else if (!strcmp(a, "--no-hidden")) {
            hidden_set = 1;
            o.n_hidden = 0;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            o.verbose = 1;
        } else if (!v) {
            bad = 1;
        } else {
            i++;
            if (!strcmp(a, "--model"))
                model = v;
            else if (!strcmp(a, "--arch"))
                arch_file = v;
            else if (!strcmp(a, "--import"))
                import = v;
            else if (!strcmp(a, "--data-dir"))
                data_dir = v;
            else if (cli_target_opt(a, v, &t, &bad))   /* --device, --precision, --batch, --prompt, --output */
                ;
            else if (!strcmp(a, "--reps"))
                bad = cli_parse_int(v, 1, 1000, &o.reps);
            else if (!strcmp(a, "--models"))
                bad = cli_parse_int(v, 1, 8, &o.n_models);
            else if (!strcmp(a, "--validate"))
                bad = cli_parse_int(v, 0, 1000, &o.validate);
            else if (!strcmp(a, "--threads"))
                bad = cli_parse_int(v, 1, 1024, &o.threads);
            else if (!strcmp(a, "--validate-reps"))
                bad = cli_parse_int(v, 1, 1000, &o.validate_reps);
            else if (!strcmp(a, "--fit"))
                bad = cli_parse_int(v, 0, 1000, &o.fit);
            else if (!strcmp(a, "--seed")) {
                int s;
                bad = cli_parse_int(v, 0, 1 << 30, &s);
                o.seed = (uint64_t)s;
            } else if (!strcmp(a, "--hidden")) {
                char buf[256];
                snprintf(buf, sizeof buf, "%s", v);
                o.n_hidden = 0;
                hidden_set = 1;
                for (char *p = buf, *q; p && *p && !bad; p = q) {
                    q = strchr(p, ',');
                    if (q)
                        *q++ = 0;
                    bad = o.n_hidden == 16 || cli_parse_int(p, 8, 1 << 16, &o.hidden[o.n_hidden++]);
                }
            } else
                bad = 1;
        }
        if (bad) {
            fprintf(stderr, "calibrate: bad or unknown option %s%s%s\n", a, v ? " " : "", v ? v : "");
            usage(stderr);
            return 2;
        }
    }
    if (!data_dir)
        data_dir = "var";
    if (import)
        return do_import(import, data_dir, as_json);
    if (!!model == !!arch_file) {
        fprintf(stderr, "calibrate: give exactly one of --model PATH and --arch FILE\n");
        usage(stderr);
        return 2;
    }
    char err[1024];
    arch a;
    if (cm_load_arch(model ? model : arch_file, &a, err, sizeof err)) {
        fprintf(stderr, "calibrate: %s\n", err);
        return 1;
    }
    if (!hidden_set)
        cal_opts_search_hidden(&o, &a);   /* what a job with the default search space calibrates */
    json_t *cal;
    int reused = 0;
    cal_display disp = {pb_open(stderr, PB_AUTO), o.verbose};
    o.verbose = 0;   /* the display prints those lines, so they do not break the bar */
    o.progress = on_progress;
    o.ud = &disp;
    if (no_cache) {
        cal = cal_run(&a, &t, &o, err, sizeof err);
        if (cal && cm_calibration_save(data_dir, cal, err, sizeof err)) {
            json_decref(cal);
            cal = NULL;
        }
    } else {
        cal = cal_get_or_run(data_dir, &a, &t, &o, &reused, err, sizeof err);
    }
    pb_end_stage(disp.pb, cal ? NULL : "failed");
    pb_close(disp.pb);
    arch_free(&a);
    if (!cal) {
        fprintf(stderr, "calibrate: %s\n", err);
        return 1;
    }
    if (as_json) {
        json_object_set_new(cal, "reused", json_boolean(reused));
        json_dumpf(cal, stdout, JSON_INDENT(2) | JSON_SORT_KEYS);
        printf("\n");
    } else {
        if (reused)
            printf("(reused cached calibration)\n");
        print_summary(cal);
    }
    json_decref(cal);
    return 0;
}
