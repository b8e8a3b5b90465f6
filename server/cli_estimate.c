/* server/cli_estimate.c — `autocompress estimate`: predicted latency, throughput and
 * itemized memory of an arch on a target from a cached calibration (the same code path
 * as POST /v1/estimates), or from a calibration/tables file given with --calibration.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "compress/costmodel.h"
#include "server/cli.h"
#include "server/cli_args.h"
#include "storage/archjson.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: autocompress estimate (--arch FILE | --model PATH) [--device cpu] [--precision fp32]\n"
               "                             [--batch B] [--prompt S] [--output N] [--data-dir DIR]\n"
               "                             [--calibration FILE] [--json]\n"
               "Prints the estimate object (DESIGN.md §10). Without --calibration it looks for a cached\n"
               "calibration covering the arch in DIR/calibrations (DIR: --data-dir, $AC_DATA_DIR or ./var)\n"
               "and fails with the calibration to run when none does. Defaults: batch 1, prompt 256, output 64.\n");
}

static void print_human(json_t *est)
{
    json_t *p = json_object_get(est, "predicted"), *m = json_object_get(p, "memory_bytes");
    printf("calibration        %s\n", json_string_value(json_object_get(est, "calibration_id")));
    printf("params             %lld\n", (long long)json_integer_value(json_object_get(est, "params")));
    printf("latency            %.2f ms (prefill %.2f ms, decode %.3f ms/token)\n",
           json_number_value(json_object_get(p, "latency_ms")), json_number_value(json_object_get(p, "prefill_ms")),
           json_number_value(json_object_get(p, "decode_ms_per_token")));
    printf("throughput         %.1f tokens/s\n", json_number_value(json_object_get(p, "throughput_tokens_per_s")));
    const char *items[] = {"weights", "request_cache", "prefill_workspace", "runtime_buffers", "total"};
    for (int i = 0; i < 5; i++)
        printf("memory %-18s %12lld bytes (%.1f MiB)\n", items[i],
               (long long)json_integer_value(json_object_get(m, items[i])),
               json_integer_value(json_object_get(m, items[i])) / 1048576.0);
    printf("naive weights+KV   %12lld bytes\n",
           (long long)json_integer_value(json_object_get(est, "naive_weights_plus_kv_bytes")));
}

/* Estimate against an explicit calibration (or import document) file. */
static json_t *estimate_from_file(const char *path, const arch *a, const cm_target *t, char *err, size_t errlen)
{
    json_error_t je;
    json_t *doc = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!doc) {
        snprintf(err, errlen, "%s:%d: %s", path, je.line, je.text);
        return NULL;
    }
    cm_tables tb;
    int rc = json_object_get(doc, "format") ? cm_tables_import(doc, &tb, err, errlen)
                                            : cm_calibration_tables(doc, &tb, err, errlen);
    json_decref(doc);
    if (rc)
        return NULL;
    json_t *out = NULL;
    cm_prediction p;
    if (!cm_target_same(&tb.target, t)) {   /* engine, precision, threads ... as a cached calibration */
        json_t *have = cm_target_to_json(&tb.target), *want = cm_target_to_json(t);
        char *hs = have ? json_dumps(have, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        char *ws = want ? json_dumps(want, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        snprintf(err, errlen, "%s was calibrated for the target %s, not %s", path, hs ? hs : "?", ws ? ws : "?");
        free(hs);
        free(ws);
        json_decref(have);
        json_decref(want);
    } else if (!cm_predict(&tb, a, &p, err, errlen)) {
        out = json_pack("{s:s,s:o,s:I,s:o,s:I}", "calibration_id", tb.id[0] ? tb.id : "import", "arch",
                        arch_to_json(a), "params", (json_int_t)p.params, "predicted", cm_prediction_to_json(&p),
                        "naive_weights_plus_kv_bytes", (json_int_t)p.naive_bytes);
        if (!out)
            snprintf(err, errlen, "out of memory");
    }
    cm_tables_free(&tb);
    return out;
}

typedef struct {
    const char *model, *arch_file, *cal_file, *data_dir;
    int as_json;
    cm_target t;
} estimate_args;

/* CLI_END with *a filled, or the exit status. */
static int estimate_parse(int argc, char **argv, estimate_args *a)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'}, {"arch", required_argument, NULL, 'a'},
        {"calibration", required_argument, NULL, 'c'}, {"data-dir", required_argument, NULL, 'D'},
        {"json", no_argument, NULL, 'j'}, CLI_TARGET_OPTIONS, {"help", no_argument, NULL, 'h'}, {0}};
    memset(a, 0, sizeof *a);
    a->data_dir = getenv("AC_DATA_DIR");
    cm_target_default(&a->t);
    cli_parser p;
    int c;
    cli_init(&p, "estimate", argc, argv, opts, NULL, usage);
    cli_set_target(&p, &a->t);
    while ((c = cli_next(&p)) > 0) {
        switch (c) {
        case 'm': a->model = p.arg; break;
        case 'a': a->arch_file = p.arg; break;
        case 'c': a->cal_file = p.arg; break;
        case 'D': a->data_dir = p.arg; break;
        case 'j': a->as_json = 1; break;
        }
    }
    if (c != CLI_END)
        return cli_status(c);
    if (cli_no_more_operands(&p))
        return 2;
    if (cli_model_or_arch(&p, a->model, a->arch_file))
        return 2;
    if (!a->data_dir)
        a->data_dir = "var";
    return CLI_END;
}

int cli_estimate(int argc, char **argv)
{
    estimate_args ea;
    int pr = estimate_parse(argc, argv, &ea);
    if (pr != CLI_END)
        return pr;
    char err[1024];
    arch a;
    if (cm_load_arch(ea.model ? ea.model : ea.arch_file, &a, err, sizeof err)) {
        fprintf(stderr, "estimate: %s\n", err);
        return 1;
    }
    json_t *est;
    if (ea.cal_file)
        est = estimate_from_file(ea.cal_file, &a, &ea.t, err, sizeof err);
    else
        cm_estimate(&a, &ea.t, ea.data_dir, &est, err, sizeof err);
    arch_free(&a);
    if (!est) {
        fprintf(stderr, "estimate: %s\n", err);
        return 1;
    }
    if (ea.as_json) {
        json_dumpf(est, stdout, JSON_INDENT(2) | JSON_SORT_KEYS);
        printf("\n");
    } else {
        print_human(est);
    }
    json_decref(est);
    return 0;
}
