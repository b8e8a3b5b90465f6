/* server/cli_calibrate.c — `autocompress calibrate`: measure timing tables and the memory
 * model of a parent shape on a target (compress/calibrate.h), validate them on held-out
 * random archs, cache the result under the data dir and print it; or import tables
 * measured in another engine (docs/timing-tables.md). Weights are random: only the
 * shape matters, so --model reads the shape alone. The calibration itself is the job's
 * calibrate step (compress/steps.h step_calibrate). Progress goes to stderr
 * (server/progress.h: a bar on a terminal, plain lines elsewhere); -v adds a line per request.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "compress/calibrate.h"
#include "compress/costmodel.h"
#include "compress/steps.h"
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

static void on_aside(void *ud, const json_t *tried, const char *load)
{
    cal_display *d = ud;
    (void)tried;
    pb_notef(d->pb, "calibrate: made beside other work (%s): set aside, calibrating again", load);
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

typedef struct {
    const char *model, *arch_file, *import, *data_dir;
    int as_json, no_cache, hidden_set;   /* hidden_set: --hidden or --no-hidden was given */
    cm_target t;
    cal_opts o;
} calibrate_args;

/* --hidden H1,H2,...: up to 16 sizes. 0, or -1 after the message. */
static int parse_hidden(cli_parser *p, cal_opts *o)
{
    char buf[256];
    if (cli_str(p, buf, sizeof buf))
        return -1;
    o->n_hidden = 0;
    for (char *s = buf, *q; *s; s = q) {
        q = strchr(s, ',');
        if (q)
            *q++ = 0;
        else
            q = s + strlen(s);
        char *end;
        long v = strtol(s, &end, 10);
        if (o->n_hidden == 16 || end == s || *end || v < 8 || v > 1 << 16)
            return cli_fail(p, "--hidden: '%s' is not a list of at most 16 sizes from 8 to 65536", p->arg);
        o->hidden[o->n_hidden++] = (int)v;
    }
    return 0;
}

/* CLI_END with *a filled, or the exit status. */
static int calibrate_parse(int argc, char **argv, calibrate_args *a)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},     {"arch", required_argument, NULL, 'a'},
        {"import", required_argument, NULL, 'I'},    {"data-dir", required_argument, NULL, 'D'},
        {"json", no_argument, NULL, 'j'},            {"no-cache", no_argument, NULL, 'C'},
        {"no-hidden", no_argument, NULL, 'N'},       {"verbose", no_argument, NULL, 'v'},
        {"reps", required_argument, NULL, 'r'},      {"models", required_argument, NULL, 'M'},
        {"validate", required_argument, NULL, 'V'},  {"threads", required_argument, NULL, 't'},
        {"validate-reps", required_argument, NULL, 'R'}, {"fit", required_argument, NULL, 'f'},
        {"seed", required_argument, NULL, 's'},      {"hidden", required_argument, NULL, 'H'},
        CLI_TARGET_OPTIONS,                          {"help", no_argument, NULL, 'h'},
        {0}};
    memset(a, 0, sizeof *a);
    a->data_dir = getenv("AC_DATA_DIR");
    cm_target_default(&a->t);
    cal_opts_default(&a->o);
    cli_parser p;
    int c, seed;
    cli_init(&p, "calibrate", argc, argv, opts, "hv", usage);
    cli_set_target(&p, &a->t);
    while ((c = cli_next(&p)) > 0) {
        switch (c) {
        case 'm': a->model = p.arg; break;
        case 'a': a->arch_file = p.arg; break;
        case 'I': a->import = p.arg; break;
        case 'D': a->data_dir = p.arg; break;
        case 'j': a->as_json = 1; break;
        case 'C': a->no_cache = 1; break;
        case 'N': a->hidden_set = 1; a->o.n_hidden = 0; break;
        case 'v': a->o.verbose = 1; break;
        case 'r': cli_int(&p, 1, 1000, &a->o.reps); break;
        case 'M': cli_int(&p, 1, 8, &a->o.n_models); break;
        case 'V': cli_int(&p, 0, 1000, &a->o.validate); break;
        case 't': cli_int(&p, 1, 1024, &a->o.threads); break;
        case 'R': cli_int(&p, 1, 1000, &a->o.validate_reps); break;
        case 'f': cli_int(&p, 0, 1000, &a->o.fit); break;
        case 's':
            if (cli_int(&p, 0, 1 << 30, &seed) == 0)
                a->o.seed = (uint64_t)seed;
            break;
        case 'H': a->hidden_set = 1; parse_hidden(&p, &a->o); break;
        }
    }
    if (c != CLI_END)
        return cli_status(c);
    if (cli_no_more_operands(&p))
        return 2;
    if (!a->data_dir)
        a->data_dir = "var";
    if (!a->import && cli_model_or_arch(&p, a->model, a->arch_file))
        return 2;
    return CLI_END;
}

/* The calibrate step (or the cached calibration) with progress on stderr. NEW reference
 * or NULL with err. */
static json_t *calibrate_run(calibrate_args *ca, int *reused, char *err, size_t errlen)
{
    arch a;
    if (cm_load_arch(ca->model ? ca->model : ca->arch_file, &a, err, errlen))
        return NULL;
    cal_display disp = {pb_open(stderr, PB_AUTO), ca->o.verbose};
    ca->o.verbose = 0;   /* the display prints those lines, so they do not break the bar */
    ca->o.progress = on_progress;
    ca->o.aside = on_aside;
    ca->o.ud = &disp;
    /* without --hidden/--no-hidden: what a job with the default search space calibrates */
    json_t *cal = step_calibrate(ca->data_dir, &a, &ca->t, &ca->o, !ca->hidden_set, !ca->no_cache, reused, err,
                                 errlen);
    pb_end_stage(disp.pb, cal ? NULL : "failed");
    pb_close(disp.pb);
    arch_free(&a);
    return cal;
}

int cli_calibrate(int argc, char **argv)
{
    calibrate_args ca;
    int pr = calibrate_parse(argc, argv, &ca);
    if (pr != CLI_END)
        return pr;
    if (ca.import)
        return do_import(ca.import, ca.data_dir, ca.as_json);
    char err[1024];
    int reused;
    json_t *cal = calibrate_run(&ca, &reused, err, sizeof err);
    if (!cal) {
        fprintf(stderr, "calibrate: %s\n", err);
        return 1;
    }
    char note[600];
    if (cal_contended_note(cal, note, sizeof note))
        fprintf(stderr, "calibrate: warning: %s\n", note);
    if (ca.as_json) {
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
