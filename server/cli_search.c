/* server/cli_search.c — `autocompress search MODEL --latency-ms X ...`: calibrate the
 * target (or reuse a cached calibration), rank the parent on calibration text and run
 * either search method, printing the chosen arch, its predicted costs and the
 * selection tokens. The job's calibrate, rank and search stages run the same code.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/calibrate.h"
#include "compress/method.h"
#include "compress/rank.h"
#include "engine/devices.h"
#include "server/cli.h"
#include "storage/archjson.h"
#include "storage/modelio.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: autocompress search MODEL LIMIT... [options]\n\n"
            "Searches the pruned architecture of MODEL that meets every LIMIT on the target.\n"
            "limits (at least one):\n"
            "  --latency-ms X        one request: prefill + every decode step\n"
            "  --throughput X        generated tokens/s at the batch\n"
            "  --memory-gib X        peak memory while serving the workload\n"
            "  --params N            parameter count\n"
            "options:\n"
            "  --margin-pct X        aim X%% under latency/memory (over throughput); default: the\n"
            "                        calibration's largest held-out error, 0 when it has none\n"
            "  --method M            autocompress (default) | minitron\n"
            "  --device D            cpu (default) | cuda:N\n"
            "  --batch B --prompt S --output N   workload (default 1, 256, 64)\n"
            "  --axes LIST           searched axes, comma separated: hidden,heads,ffn,depth (default all, as jobs)\n"
            "  --calib FILE          calibration text (required)\n"
            "  --search-tokens N     architecture-selection budget (default 262144)\n"
            "  --rank-tokens N       ranking tokens (default 32768, as jobs)\n"
            "  --data-dir DIR        calibration cache (default ./var)\n"
            "  --tokenizer PATH      tokenizer override\n"
            "  --seed N              search seed (default 1234)\n"
            "  --eta X --lambda2 X --lr X   DNAS multiplier step, starting quadratic multiplier, logit step\n"
            "  --out FILE            write the chosen arch JSON there\n"
            "  --json                print the whole search document on stdout\n");
}

static void on_event(void *ud, const char *type, const char *message, json_t *data)
{
    (void)ud;
    fprintf(stderr, "%s: %s\n", type, message);
    json_decref(data);
}

static int encode_cb(void *c, const char *text, size_t len, int **ids, size_t *n, char *err, size_t errlen)
{
    return tok_encode(c, text, len, 0, 0, ids, n, err, errlen);
}

int cli_search(int argc, char **argv)
{
    static const struct option opts[] = {
        {"latency-ms", 1, 0, 'L'}, {"throughput", 1, 0, 'P'}, {"memory-gib", 1, 0, 'M'}, {"params", 1, 0, 'N'},
        {"method", 1, 0, 'm'}, {"device", 1, 0, 'd'}, {"batch", 1, 0, 'b'}, {"prompt", 1, 0, 's'},
        {"output", 1, 0, 'o'}, {"axes", 1, 0, 'a'}, {"calib", 1, 0, 'c'}, {"search-tokens", 1, 0, 't'},
        {"rank-tokens", 1, 0, 'r'}, {"data-dir", 1, 0, 'D'}, {"tokenizer", 1, 0, 'k'}, {"seed", 1, 0, 'S'},
        {"out", 1, 0, 'O'}, {"json", 0, 0, 'j'}, {"eta", 1, 0, 'e'}, {"lambda2", 1, 0, 'l'}, {"lr", 1, 0, 'R'}, {"margin-pct", 1, 0, 'g'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    method_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.search_tokens = 262144;
    mo.axes.hidden = mo.axes.heads = mo.axes.ffn = mo.axes.depth = 1;   /* every axis, as a job's default */
    mo.seed = 1234;
    cm_target t;
    cm_target_default(&t);
    const char *calib = NULL, *data_dir = "./var", *tokp = NULL, *out = NULL;
    rank_opts ro;
    rank_opts_default(&ro);
    int64_t rank_tokens = ro.tokens;
    double margin_pct = -1;   /* -1: the calibration's */
    int json_out = 0, c;
    char *end;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        double v = optarg ? strtod(optarg, &end) : 0;
        if (optarg && strchr("LPMNbsotrSelR", c) && (end == optarg || *end || v <= 0)) {
            fprintf(stderr, "search: option -%c needs a positive number, not '%s'\n", c, optarg);
            return 2;
        }
        switch (c) {
        case 'L': mo.limits.latency_ms = v; break;
        case 'P': mo.limits.throughput_tps = v; break;
        case 'M': mo.limits.memory_bytes = v * 1073741824.0; break;
        case 'N': mo.limits.params = v; break;
        case 'm':
            if (strcmp(optarg, "autocompress") && strcmp(optarg, "minitron")) {
                fprintf(stderr, "search: --method must be autocompress or minitron\n");
                return 2;
            }
            mo.minitron = !strcmp(optarg, "minitron");
            break;
        case 'd': snprintf(t.device, sizeof t.device, "%s", optarg); break;
        case 'b': t.batch_size = (int)v; break;
        case 's': t.prompt_tokens = (int)v; break;
        case 'o': t.output_tokens = (int)v; break;
        case 'a':
            memset(&mo.axes, 0, sizeof mo.axes);
            for (char *s = optarg; *s;) {
                size_t n = strcspn(s, ",");
                if (n == 6 && !strncmp(s, "hidden", 6)) mo.axes.hidden = 1;
                else if (n == 5 && !strncmp(s, "heads", 5)) mo.axes.heads = 1;
                else if (n == 3 && !strncmp(s, "ffn", 3)) mo.axes.ffn = 1;
                else if (n == 5 && !strncmp(s, "depth", 5)) mo.axes.depth = 1;
                else {
                    fprintf(stderr, "search: unknown axis '%.*s' (hidden, heads, ffn, depth)\n", (int)n, s);
                    return 2;
                }
                s += n + (s[n] == ',');
            }
            break;
        case 'c': calib = optarg; break;
        case 't': mo.search_tokens = (int64_t)v; break;
        case 'r': rank_tokens = (int64_t)v; break;
        case 'D': data_dir = optarg; break;
        case 'k': tokp = optarg; break;
        case 'S': mo.seed = (uint64_t)v; break;
        case 'O': out = optarg; break;
        case 'j': json_out = 1; break;
        case 'e': mo.eta = v; break;
        case 'l': mo.lambda2_init = v; break;
        case 'R': mo.lr = v; break;
        case 'g':
            if (end == optarg || *end || v < 0 || v > 50) {
                fprintf(stderr, "search: --margin-pct must be a number from 0 to 50, not '%s'\n", optarg);
                return 2;
            }
            margin_pct = v;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc - 1 || !calib) {
        usage(stderr);
        return 2;
    }
    if (!(mo.limits.latency_ms > 0 || mo.limits.throughput_tps > 0 || mo.limits.memory_bytes > 0 ||
          mo.limits.params > 0)) {
        fprintf(stderr, "search: give at least one limit (--latency-ms, --throughput, --memory-gib, --params)\n");
        return 2;
    }
    char err[1024] = "";
    int rc = 1;
    eng_backend *be = eng_backend_new(t.device, err, sizeof err);
    eng_model parent;
    tok_tokenizer *tok = NULL;
    td_docs docs = {0};
    td_stream train = {0}, val = {0};
    json_t *cal = NULL, *doc = NULL;
    cm_tables tables;
    memset(&tables, 0, sizeof tables);
    rank_result rk;
    memset(&rk, 0, sizeof rk);
    int *order = NULL, loaded = 0;
    arch chosen = {0};
    if (!be)
        goto out;
    if (mio_load_model(argv[optind], tokp, be, &parent, &tok, err, sizeof err) != 0)
        goto out;
    loaded = 1;
    cal_opts co;
    cal_opts_default(&co);
    if (mo.axes.hidden)
        cal_opts_search_hidden(&co, &parent.a);   /* tables at the hidden sizes it may choose */
    co.verbose = 1;
    int reused = 0;
    cal = cal_get_or_run(data_dir, &parent.a, &t, &co, &reused, err, sizeof err);
    if (!cal || cm_calibration_tables(cal, &tables, err, sizeof err) != 0)
        goto out;
    fprintf(stderr, "search: calibration %s (%s)\n", json_string_value(json_object_get(cal, "id")),
            reused ? "reused" : "measured");
    if (td_read_docs(calib, TD_FMT_AUTO, &docs, err, sizeof err) != 0)
        goto out;
    td_pack_opts po = {.seed = 1234, .val_fraction = 0.05, .sep_token = tok_config_of(tok)->bos_id,
                       .max_tokens = 8u << 20};
    if (td_pack(&docs, encode_cb, tok, &po, &train, &val, err, sizeof err) != 0)
        goto out;
    ro.tokens = rank_tokens;
    if (rank_opts_fit(&ro, train.n, err, sizeof err) != 0)
        goto out;
    if (rank_compute(&parent, &train, &ro, &rk, err, sizeof err) != 0 || rank_apply(&parent, &rk, err, sizeof err) != 0)
        goto out;
    order = malloc((size_t)parent.a.n_layers * sizeof *order);
    if (!order) {
        snprintf(err, sizeof err, "out of memory");
        goto out;
    }
    rank_layer_order(&rk, order);
    method_margin margin;
    dnas_limits given = mo.limits;
    method_aim(&parent.a, &tables, &mo.axes, json_object_get(cal, "validation"), margin_pct, &given, &mo.limits,
               &margin);
    fprintf(stderr, "search: aiming %.2f%% under latency, %.2f%% under memory (margin: %s)\n", margin.latency_pct,
            margin.memory_pct, margin.source);
    mo.parent = &parent;
    mo.tables = &tables;
    mo.train = &train;
    mo.val = &val;
    mo.layer_order = order;
    mo.event = on_event;
    int r = method_run(&mo, &chosen, &doc, err, sizeof err);
    if (r != 0)
        goto out;
    json_object_set_new(doc, "aim", method_aim_json(&mo.limits, &margin));
    if (out) {
        json_t *aj = arch_to_json(&chosen);
        if (!aj || json_dump_file(aj, out, JSON_INDENT(2) | JSON_SORT_KEYS) != 0) {
            snprintf(err, sizeof err, "cannot write %s", out);
            json_decref(aj);
            goto out;
        }
        json_decref(aj);
    }
    if (json_out) {
        json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_SORT_KEYS);
        fputc('\n', stdout);
    } else {
        json_t *p = json_object_get(doc, "predicted");
        printf("method:           %s\n", mo.minitron ? "minitron" : "autocompress");
        printf("arch:             %s\n", json_string_value(json_object_get(doc, "summary")));
        printf("params:           %lld\n", (long long)arch_params(&chosen));
        printf("latency_ms:       %.3f\n", json_number_value(json_object_get(p, "latency_ms")));
        printf("throughput_tok/s: %.2f\n", json_number_value(json_object_get(p, "throughput_tokens_per_s")));
        printf("memory_bytes:     %lld\n",
               (long long)json_integer_value(json_object_get(json_object_get(p, "memory_bytes"), "total")));
        printf("selection_tokens: %lld\n", (long long)json_integer_value(json_object_get(doc, "selection_tokens")));
        printf("wall_s:           %.1f\n", json_number_value(json_object_get(doc, "wall_s")));
    }
    rc = 0;
out:
    if (rc != 0)
        fprintf(stderr, "search: %s\n", err[0] ? err : "failed");
    arch_free(&chosen);
    json_decref(doc);
    json_decref(cal);
    free(order);
    rank_free(&rk);
    cm_tables_free(&tables);
    td_stream_free(&train);
    td_stream_free(&val);
    td_docs_free(&docs);
    tok_free(tok);
    if (loaded)
        eng_model_free(&parent);
    eng_backend_free(be);
    return rc;
}
