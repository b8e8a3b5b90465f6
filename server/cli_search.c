/* server/cli_search.c — `autocompress search MODEL --latency-ms X ...`: calibrate the
 * target (or reuse a cached calibration), rank the parent on calibration text and run
 * either search method, printing the chosen arch, its predicted costs and the
 * selection tokens. Each step is the one the job's calibrate, rank and search stages
 * take (compress/steps.h, compress/method.h method_search); this file only parses,
 * strings them together and prints.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/method.h"
#include "compress/steps.h"
#include "engine/devices.h"
#include "server/cli.h"
#include "server/cli_args.h"
#include "storage/archjson.h"
#include "storage/fileio.h"
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
            "  --no-served-check     search with the tables as calibrated: no anchor on the parent\n"
            "                        served now, no check of the result (as constraints.served_check)\n"
            "  --method M            autocompress (default) | minitron\n"
            "  --reconstruct         Minitron++ trials reconstruct each candidate before distilling it\n"
            "  --device D            cpu (default) | cuda:N;  --precision P  fp32 (default)\n"
            "  --batch B --prompt S --output N   workload (default 1, 256, 64)\n"
            "  --axes LIST           searched axes, comma separated: hidden,heads,ffn,experts,\n"
            "                        expert_widths,shared_expert_widths,latent_widths,\n"
            "                        mamba_heads,depth\n"
            "                        (default all, as jobs)\n"
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

typedef struct {
    const char *model, *calib, *data_dir, *tokp, *out;
    method_opts mo;      /* limits as given, axes, method, budget, seed, DNAS overrides */
    cm_target t;
    rank_opts ro;
    double margin_pct;   /* -1: the calibration's */
    int json_out;
    int no_served;       /* --no-served-check */
} search_args;

/* --axes hidden,heads,ffn,experts,expert_widths,shared_expert_widths,latent_widths,mamba_heads,depth.
 * 0, or -1 after the message. */
static int parse_axes(cli_parser *p, dnas_axes *axes)
{
    memset(axes, 0, sizeof *axes);
    for (const char *s = p->arg; *s;) {
        size_t n = strcspn(s, ",");
        if (n == 6 && !strncmp(s, "hidden", 6))
            axes->hidden = 1;
        else if (n == 5 && !strncmp(s, "heads", 5))
            axes->heads = 1;
        else if (n == 3 && !strncmp(s, "ffn", 3))
            axes->ffn = 1;
        else if (n == 7 && !strncmp(s, "experts", 7))
            axes->experts = 1;
        else if (n == 13 && !strncmp(s, "expert_widths", 13))
            axes->expert_widths = 1;
        else if (n == 20 && !strncmp(s, "shared_expert_widths", 20))
            axes->shared_widths = 1;
        else if (n == 13 && !strncmp(s, "latent_widths", 13))
            axes->latent = 1;
        else if (n == 11 && !strncmp(s, "mamba_heads", 11))
            axes->mamba = 1;
        else if (n == 5 && !strncmp(s, "depth", 5))
            axes->depth = 1;
        else
            return cli_fail(p, "unknown axis '%.*s' (hidden, heads, ffn, experts, expert_widths, "
                            "shared_expert_widths, latent_widths, mamba_heads, depth)", (int)n, s);
        s += n + (s[n] == ',');
    }
    return 0;
}

/* One option of search's own (the target options are cli_args'). */
static void search_opt(cli_parser *p, int c, search_args *a)
{
    method_opts *mo = &a->mo;
    double v = 0;
    if (c < 128 && strchr("LPMNelR", c) && cli_positive(p, &v))
        return;
    int64_t n = 0;
    switch (c) {
    case 'L': mo->limits.latency_ms = v; break;
    case 'P': mo->limits.throughput_tps = v; break;
    case 'M': mo->limits.memory_bytes = v * 1073741824.0; break;
    case 'N': mo->limits.params = v; break;
    /* counts and the seed are integers, in the bounds a job's spec gives them */
    case 't':
        if (cli_i64(p, 1, 1000000000000LL, &n) == 0)
            mo->search_tokens = n;
        break;
    case 'r':
        if (cli_i64(p, 1, 1000000000000LL, &n) == 0)
            a->ro.tokens = n;
        break;
    case 'S':
        if (cli_i64(p, 0, INT32_MAX, &n) == 0)
            mo->seed = (uint64_t)n;
        break;
    case 'e': mo->eta = v; break;
    case 'l': mo->lambda2_init = v; break;
    case 'R': mo->lr = v; break;
    case 'm':
        if (strcmp(p->arg, "autocompress") && strcmp(p->arg, "minitron"))
            cli_fail(p, "--method must be autocompress or minitron");
        mo->minitron = !strcmp(p->arg, "minitron");
        break;
    case 'a': parse_axes(p, &mo->axes); break;
    case 'c': a->calib = p->arg; break;
    case 'D': a->data_dir = p->arg; break;
    case 'k': a->tokp = p->arg; break;
    case 'O': a->out = p->arg; break;
    case 'j': a->json_out = 1; break;
    case 'g': cli_num(p, 0, 50, &a->margin_pct); break;
    case 'X': mo->reconstruct = 1; break;
    case 'Z': a->no_served = 1; break;
    }
}

/* CLI_END with *a filled, or the exit status. */
static int search_parse(int argc, char **argv, search_args *a)
{
    static const struct option opts[] = {
        {"latency-ms", required_argument, NULL, 'L'}, {"throughput", required_argument, NULL, 'P'},
        {"memory-gib", required_argument, NULL, 'M'}, {"params", required_argument, NULL, 'N'},
        {"method", required_argument, NULL, 'm'},     {"axes", required_argument, NULL, 'a'},
        {"calib", required_argument, NULL, 'c'},      {"search-tokens", required_argument, NULL, 't'},
        {"rank-tokens", required_argument, NULL, 'r'}, {"data-dir", required_argument, NULL, 'D'},
        {"tokenizer", required_argument, NULL, 'k'},  {"seed", required_argument, NULL, 'S'},
        {"out", required_argument, NULL, 'O'},        {"json", no_argument, NULL, 'j'},
        {"eta", required_argument, NULL, 'e'},        {"lambda2", required_argument, NULL, 'l'},
        {"lr", required_argument, NULL, 'R'},         {"margin-pct", required_argument, NULL, 'g'},
        {"reconstruct", no_argument, NULL, 'X'},     {"no-served-check", no_argument, NULL, 'Z'},
        CLI_TARGET_OPTIONS,                           {"help", no_argument, NULL, 'h'},
        {0}};
    memset(a, 0, sizeof *a);
    method_opts_default(&a->mo);
    a->mo.search_tokens = 262144;   /* a quick search by hand; a job's budget is method_opts_default's */
    cm_target_default(&a->t);
    rank_opts_default(&a->ro);
    a->data_dir = "./var";
    a->margin_pct = -1;
    cli_parser p;
    int c;
    cli_init(&p, "search", argc, argv, opts, NULL, usage);
    cli_set_target(&p, &a->t);
    while ((c = cli_next(&p)) > 0)
        search_opt(&p, c, a);
    if (c != CLI_END)
        return cli_status(c);
    a->model = cli_operand(&p);
    if (cli_no_more_operands(&p))
        return 2;
    if (!a->model || !a->calib) {
        usage(stderr);
        return 2;
    }
    const dnas_limits *l = &a->mo.limits;
    if (!(l->latency_ms > 0 || l->throughput_tps > 0 || l->memory_bytes > 0 || l->params > 0)) {
        fprintf(stderr, "search: give at least one limit (--latency-ms, --throughput, --memory-gib, --params)\n");
        return 2;
    }
    return CLI_END;
}

/* What the search runs on: the ranked parent, its calibration and text. */
typedef struct {
    eng_backend *be;
    eng_model parent;
    int loaded;
    tok_tokenizer *tok;
    json_t *cal;
    cm_tables tables;
    td_stream train, val;
    rank_result rk;
} search_inputs;

static void inputs_free(search_inputs *in)
{
    json_decref(in->cal);
    rank_free(&in->rk);
    cm_tables_free(&in->tables);
    td_stream_free(&in->train);
    td_stream_free(&in->val);
    tok_free(in->tok);
    if (in->loaded)
        eng_model_free(&in->parent);
    eng_backend_free(in->be);
}

/* The calibrate and rank steps of a job, in this process: load the parent, calibrate
 * (or reuse), pack the calibration text, rank and permute the parent. 0, or -1 with err. */
static int search_inputs_build(const search_args *a, search_inputs *in, char *err, size_t errlen)
{
    memset(in, 0, sizeof *in);
    if (!(in->be = eng_backend_new(a->t.device, err, errlen)))
        return -1;
    if (mio_load_model(a->model, a->tokp, in->be, &in->parent, &in->tok, err, errlen) != 0)
        return -1;
    in->loaded = 1;
    cal_opts co;
    cal_opts_default(&co);
    co.verbose = 1;
    int reused = 0;
    in->cal = step_calibrate(a->data_dir, &in->parent.a, &a->t, &co, a->mo.axes.hidden, 1, &reused, err, errlen);
    if (!in->cal || cm_calibration_tables(in->cal, &in->tables, err, errlen) != 0)
        return -1;
    fprintf(stderr, "search: calibration %s (%s)\n", json_string_value(json_object_get(in->cal, "id")),
            reused ? "reused" : "measured");
    char note[600];
    if (cal_contended_note(in->cal, note, sizeof note))
        fprintf(stderr, "search: warning: %s\n", note);
    td_pack_opts po;
    step_text_default(&po, in->tok);
    if (step_text(a->calib, in->tok, &po, &in->train, &in->val, NULL, err, errlen) != 0)
        return -1;
    if (step_rank(&in->parent, &in->train, &a->ro, &in->rk, err, errlen) != 0)
        return -1;
    return rank_apply(&in->parent, &in->rk, err, errlen);
}

static void search_print(const search_args *a, json_t *doc, const arch *chosen)
{
    if (a->json_out) {
        json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_SORT_KEYS);
        fputc('\n', stdout);
        return;
    }
    json_t *p = json_object_get(doc, "predicted");
    printf("method:           %s\n", a->mo.minitron ? "minitron" : "autocompress");
    printf("arch:             %s\n", json_string_value(json_object_get(doc, "summary")));
    printf("params:           %lld\n", (long long)arch_params(chosen));
    printf("latency_ms:       %.3f\n", json_number_value(json_object_get(p, "latency_ms")));
    printf("throughput_tok/s: %.2f\n", json_number_value(json_object_get(p, "throughput_tokens_per_s")));
    printf("memory_bytes:     %lld\n",
           (long long)json_integer_value(json_object_get(json_object_get(p, "memory_bytes"), "total")));
    printf("selection_tokens: %lld\n", (long long)json_integer_value(json_object_get(doc, "selection_tokens")));
    printf("wall_s:           %.1f\n", json_number_value(json_object_get(doc, "wall_s")));
    json_t *sv = json_object_get(doc, "served"), *an = json_object_get(sv, "anchor"),
           *checks = json_object_get(sv, "checks");
    size_t aside = json_array_size(json_object_get(sv, "anchor_tries"));
    if (an)
        printf("anchor:           parent served in %.1f ms, predicted %.1f by the calibration%s\n",
               json_number_value(json_object_get(an, "parent_measured_ms")),
               json_number_value(json_object_get(an, "parent_predicted_ms")),
               aside ? " (earlier servings beside other work set aside)" : "");
    else if (json_is_string(json_object_get(sv, "skipped")))
        printf("anchor:           none: %s\n", json_string_value(json_object_get(sv, "skipped")));
    for (size_t i = 0; i < json_array_size(checks); i++) {
        json_t *c = json_array_get(checks, i);
        printf("served check %zu:   %.1f ms (predicted %.1f), %s\n", i + 1,
               json_number_value(json_object_get(c, "latency_ms")),
               json_number_value(json_object_get(c, "predicted_latency_ms")),
               json_string_value(json_object_get(c, "arch")));
    }
}

int cli_search(int argc, char **argv)
{
    search_args a;
    int pr = search_parse(argc, argv, &a);
    if (pr != CLI_END)
        return pr;
    if (a.out) {   /* a path the arch cannot be written to is said now, not after the search */
        char dir[4096];
        fio_dir_of(a.out, dir, sizeof dir);
        if (!fio_is_dir(dir) || fio_is_dir(a.out)) {
            fprintf(stderr, "search: --out %s: %s\n", a.out,
                    fio_is_dir(a.out) ? "a folder (give a file name)" : "its folder does not exist");
            return 2;
        }
    }
    char err[1024] = "";
    int rc = 1;
    search_inputs in;
    arch chosen = {0};
    json_t *doc = NULL;
    if (search_inputs_build(&a, &in, err, sizeof err) != 0)
        goto out;
    method_opts mo = a.mo;
    mo.parent = &in.parent;
    mo.tables = &in.tables;
    mo.train = &in.train;
    mo.val = &in.val;
    mo.event = on_event;
    if (!a.no_served)   /* anchored to the parent served now, the result checked there */
        mo.served = method_served_target(&in.tables);
    method_margin margin;
    method_aim(&in.parent.a, &in.tables, &mo.axes, json_object_get(in.cal, "validation"), a.margin_pct,
               &a.mo.limits, &mo.limits, &margin);
    fprintf(stderr, "search: aiming %.2f%% under latency, %.2f%% under memory (margin: %s)\n", margin.latency_pct,
            margin.memory_pct, margin.source);
    if (method_search(&mo, &in.rk, &margin, &chosen, &doc, err, sizeof err) != 0)
        goto out;
    if (a.out) {
        json_t *aj = arch_to_json(&chosen);
        int bad = !aj || fio_write_json(a.out, aj, JSON_INDENT(2) | JSON_SORT_KEYS, err, sizeof err) != 0;
        json_decref(aj);
        if (bad) {
            if (!aj)
                snprintf(err, sizeof err, "out of memory");
            search_print(&a, doc, &chosen);   /* the result is not lost with the file */
            goto out;
        }
    }
    search_print(&a, doc, &chosen);
    rc = 0;
out:
    if (rc != 0)
        fprintf(stderr, "search: %s\n", err[0] ? err : "failed");
    arch_free(&chosen);
    json_decref(doc);
    inputs_free(&in);
    return rc;
}
