/* server/cli_eval.c — `autocompress eval MODEL --tasks ...`: load a model (any format
 * storage/modelio reads), score benchmark tasks as lm-evaluation-harness does
 * (compress/eval), print a table and optionally write the results as JSON.
 * `--dump-prompts FILE` writes the exact context/continuation strings instead of
 * scoring (no model is loaded), for checking templates against other implementations.
 * Progress per task goes to stderr (server/progress.h: a bar on a terminal, plain lines
 * elsewhere); the table and --json output are unchanged.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "compress/eval.h"
#include "compress/evaltasks.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "server/cli.h"
#include "server/cli_args.h"
#include "server/progress.h"
#include "storage/modelio.h"

#define EV_MAX_TASKS 64
#define EV_DEFAULT_MAX_TASK_BYTES ((size_t)64 << 20)

static void eval_usage(FILE *f)
{
    fprintf(f,
            "usage: autocompress eval MODEL [options]\n"
            "  MODEL                 .gguf, llama2.c .bin, HF directory or .safetensors\n"
            "  --tasks LIST          comma-separated: arc_easy arc_challenge piqa hellaswag winogrande\n"
            "                        boolq openbookqa lambada_openai mmlu sciq wikitext2, 'eight' (the first\n"
            "                        eight), 'all', a .jsonl task file (docs/tasks.md), or\n"
            "                        URL#sha256=HEX (fetched, size-limited, verified)   [eight]\n"
            "  --limit N             items per task (per MMLU subject), seeded sample  [all]\n"
            "  --seed S              sampling seed                                     [1234]\n"
            "  --num-fewshot K       MMLU few-shot examples from dev                   [5]\n"
            "  --subjects LIST       MMLU subjects (comma-separated)                   [all 57]\n"
            "  --data DIR            folder holding eval/ and text/   [$AC_EVAL_DATA, $AC_SHARED/data,\n"
            "                        ${AC_DATA_DIR:-var}/data, data: as jobs do]\n"
            "  --tokenizer PATH      tokenizer file overriding the model's\n"
            "  --threads N           CPU threads                                       [all]\n"
            "  --max-length N        model context for scoring (left truncation)      [min(2048, model)]\n"
            "  --batch-tokens N      tokens per forward batch                          [4096]\n"
            "  --max-task-bytes N    size limit for tasks fetched by URL               [64 MiB]\n"
            "  --json PATH           write results as JSON (atomically)\n"
            "  --dump-prompts PATH   write each item's context/continuations as JSONL and exit\n"
            "  --log-samples PATH    write each scored item's log-likelihoods as JSONL\n"
            "  --verbose             per-subject MMLU rows\n");
}

typedef struct {
    const char *model, *tokenizer, *data, *json_out, *dump, *subjects, *samples;
    char tasks_arg[4096];
    int limit, threads, max_len, batch_tokens, fewshot, verbose;
    uint64_t seed;
    size_t max_task_bytes;
} eval_args;

static const char *default_data_dir(char *buf, size_t len)
{
    const char *d = getenv("AC_DATA_DIR");
    return ev_data_dir(d && *d ? d : "var", buf, len);
}

/* Split the --tasks list into names (expanding eight/all). Returns the count or -1. */
static int expand_tasks(char *list, char **names, int cap)
{
    int n = 0;
    for (char *tok = list; tok && *tok;) {
        char *comma = strchr(tok, ',');
        if (comma)
            *comma = '\0';
        const char *const *group = !strcmp(tok, "eight") ? ev_eight_tasks : !strcmp(tok, "all") ? ev_builtin_tasks : NULL;
        if (group) {
            for (int i = 0; group[i]; i++) {
                if (n == cap)
                    return -1;
                names[n++] = (char *)group[i];
            }
        } else if (*tok) {
            if (n == cap)
                return -1;
            names[n++] = tok;
        }
        tok = comma ? comma + 1 : NULL;
    }
    return n;
}

/* A URL task: fetch into a temporary file; *path gets a malloc'd path. */
static int fetch_task(const char *spec, size_t max_bytes, char **path, char **name, char *err, size_t errlen)
{
    const char *h = strstr(spec, "#sha256=");
    if (!h) {
        snprintf(err, errlen, "%s: a task URL needs #sha256=HEX (64 hex digits) after it", spec);
        return -1;
    }
    char *url = strndup(spec, (size_t)(h - spec));
    char tmpl[] = "/tmp/ac-eval-task-XXXXXX";
    int fd = url ? mkstemp(tmpl) : -1;
    if (fd < 0) {
        free(url);
        snprintf(err, errlen, "cannot create a temporary file: %s", strerror(errno));
        return -1;
    }
    close(fd);
    if (ev_fetch_url(url, h + 8, max_bytes, tmpl, err, errlen)) {
        unlink(tmpl);
        free(url);
        return -1;
    }
    const char *base = strrchr(url, '/');
    base = base ? base + 1 : url;
    size_t bl = strcspn(base, ".?#");
    *name = strndup(base, bl ? bl : strlen(base));
    *path = strdup(tmpl);
    free(url);
    if (!*name || !*path) {
        unlink(tmpl);
        free(*name);
        free(*path);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

static int dump_prompts(const eval_args *a, char **names, int n, const char *data_dir)
{
    FILE *f = fopen(a->dump, "w");
    if (!f) {
        fprintf(stderr, "eval: %s: %s\n", a->dump, strerror(errno));
        return 1;
    }
    int rc = 0;
    ev_load_opts lo = {.n_fewshot = a->fewshot, .subjects = a->subjects};
    for (int i = 0; i < n && !rc; i++) {
        ev_task t;
        char err[1024];
        ev_load_opts lo_i = lo;
        if (strcmp(names[i], "mmlu"))
            lo_i.n_fewshot = -1;
        int lr = strstr(names[i], ".jsonl") ? ev_load_jsonl(names[i], names[i], &t, err, sizeof err)
                                            : ev_task_load(names[i], data_dir, &lo_i, &t, err, sizeof err);
        if (lr) {
            fprintf(stderr, "eval: %s\n", err);
            rc = 1;
            break;
        }
        ev_task_limit(&t, a->limit, a->seed);
        for (int k = 0; k < t.n_items && !rc; k++) {
            const ev_item *it = &t.items[k];
            json_t *reqs = json_array();
            for (int c = 0; reqs && c < it->n_choices; c++) {
                const char *ctx = it->choices[c].ctx ? it->choices[c].ctx : it->ctx;
                json_array_append_new(reqs, json_pack("{s:s,s:s,s:i}", "context", ctx ? ctx : "", "continuation",
                                                      it->choices[c].cont, "norm_len", it->choices[c].norm_len));
            }
            json_t *o = json_pack("{s:s,s:i,s:i,s:o}", "task", t.name, "line", it->line, "gold", it->gold,
                                  "requests", reqs);
            if (o && t.n_groups > 0)
                json_object_set_new(o, "group", json_string(t.groups[it->group]));
            if (o && t.kind == EV_KIND_ROLLING) {
                json_object_set_new(o, "words", json_integer(it->words));
                json_object_set_new(o, "bytes", json_integer(it->bytes));
            }
            char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
            if (!s || fprintf(f, "%s\n", s) < 0)
                rc = 1;
            free(s);
            json_decref(o);
        }
        ev_task_free(&t);
    }
    if (fclose(f) && !rc)
        rc = 1;
    if (rc)
        fprintf(stderr, "eval: writing %s failed\n", a->dump);
    return rc;
}

/* Progress of the task being scored: one display stage per task, from its loading on. */
typedef struct {
    progress_bar *pb;
    const char *label;   /* the task's name as the user knows it (borrowed) */
    int index, n;        /* task being scored (0-based) of n */
} eval_progress;

static int progress_show(void *user, const char *task, int64_t done, int64_t total)
{
    eval_progress *p = user;
    char extra[32];
    (void)task;
    snprintf(extra, sizeof extra, "task %d/%d", p->index + 1, p->n);
    pb_update(p->pb, p->label, done, total, "item", extra);
    return 0;
}

/* --log-samples: one JSON line per scored item. */
static void sample_write(void *user, const ev_task *t, const ev_item *it, const double *ll, const int *greedy,
                         int n)
{
    FILE *f = user;
    json_t *lls = json_array(), *gs = json_array();
    for (int i = 0; lls && gs && i < n; i++) {
        json_array_append_new(lls, json_real(ll[i]));
        json_array_append_new(gs, json_boolean(greedy[i]));
    }
    json_t *o = json_pack("{s:s,s:i,s:i,s:o,s:o}", "task", t->name, "line", it->line, "gold", it->gold, "ll", lls,
                          "greedy", gs);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (s)
        fprintf(f, "%s\n", s);
    free(s);
    json_decref(o);
}

static int write_json_atomic(const char *path, json_t *j)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    int rc = json_dumpf(j, f, JSON_INDENT(2) | JSON_SORT_KEYS) ? -1 : 0;
    if (!rc && fputc('\n', f) == EOF)
        rc = -1;
    if (!rc && (fflush(f) || fsync(fileno(f))))
        rc = -1;
    if (fclose(f))
        rc = -1;
    if (!rc && rename(tmp, path))
        rc = -1;
    if (rc)
        unlink(tmp);
    return rc;
}

int cli_eval(int argc, char **argv)
{
    eval_args a = {.limit = 0, .seed = 1234, .fewshot = -1, .max_task_bytes = EV_DEFAULT_MAX_TASK_BYTES};
    snprintf(a.tasks_arg, sizeof a.tasks_arg, "eight");
    static const struct option opts[] = {
        {"tasks", required_argument, 0, 't'},       {"limit", required_argument, 0, 'l'},
        {"seed", required_argument, 0, 's'},        {"num-fewshot", required_argument, 0, 'k'},
        {"subjects", required_argument, 0, 'S'},    {"data", required_argument, 0, 'd'},
        {"tokenizer", required_argument, 0, 'T'},   {"threads", required_argument, 0, 'j'},
        {"max-length", required_argument, 0, 'L'},  {"batch-tokens", required_argument, 0, 'b'},
        {"max-task-bytes", required_argument, 0, 'm'}, {"json", required_argument, 0, 'o'},
        {"dump-prompts", required_argument, 0, 'D'}, {"verbose", no_argument, 0, 'v'},
        {"log-samples", required_argument, 0, 'Y'},
        {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
    optind = 1;
    int c;
    long v;
    while ((c = getopt_long(argc, argv, "t:l:s:k:S:d:T:j:L:b:m:o:D:Y:vh", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            if (snprintf(a.tasks_arg, sizeof a.tasks_arg, "%s", optarg) >= (int)sizeof a.tasks_arg) {
                fprintf(stderr, "eval: --tasks too long\n");
                return 2;
            }
            break;
        case 'l':
            if (cli_parse_long(optarg, 0, 100000000, &v))
                goto bad;
            a.limit = (int)v;
            break;
        case 's': {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end)
                goto bad;
            a.seed = s;
            break;
        }
        case 'k':
            if (cli_parse_long(optarg, 0, 5, &v))
                goto bad;
            a.fewshot = (int)v;
            break;
        case 'S': a.subjects = optarg; break;
        case 'd': a.data = optarg; break;
        case 'T': a.tokenizer = optarg; break;
        case 'j':
            if (cli_parse_long(optarg, 0, 4096, &v))
                goto bad;
            a.threads = (int)v;
            break;
        case 'L':
            if (cli_parse_long(optarg, 2, 1 << 20, &v))
                goto bad;
            a.max_len = (int)v;
            break;
        case 'b':
            if (cli_parse_long(optarg, 1, 1 << 24, &v))
                goto bad;
            a.batch_tokens = (int)v;
            break;
        case 'm':
            if (cli_parse_long(optarg, 1, 1L << 40, &v))
                goto bad;
            a.max_task_bytes = (size_t)v;
            break;
        case 'o': a.json_out = optarg; break;
        case 'D': a.dump = optarg; break;
        case 'Y': a.samples = optarg; break;
        case 'v': a.verbose = 1; break;
        case 'h': eval_usage(stdout); return 0;
        default: eval_usage(stderr); return 2;
        }
        continue;
    bad:
        for (int i = 0; opts[i].name; i++)
            if (opts[i].val == c) {
                fprintf(stderr, "eval: invalid value '%s' for --%s\n", optarg, opts[i].name);
                break;
            }
        return 2;
    }
    if (optind < argc)
        a.model = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "eval: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!a.model && !a.dump) {
        eval_usage(stderr);
        return 2;
    }
    char dbuf[1024];
    const char *data_dir = a.data ? a.data : default_data_dir(dbuf, sizeof dbuf);
    char *names[EV_MAX_TASKS];
    char *fetched_path[EV_MAX_TASKS] = {0}, *fetched_name[EV_MAX_TASKS] = {0};
    int n = expand_tasks(a.tasks_arg, names, EV_MAX_TASKS);
    if (n <= 0) {
        fprintf(stderr, "eval: --tasks names no tasks (or more than %d)\n", EV_MAX_TASKS);
        return 2;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (strncmp(names[i], "http://", 7) && strncmp(names[i], "https://", 8) && strncmp(names[i], "file://", 7))
            continue;
        char err[1024];
        if (fetch_task(names[i], a.max_task_bytes, &fetched_path[i], &fetched_name[i], err, sizeof err)) {
            fprintf(stderr, "eval: %s\n", err);
            rc = 1;
            goto cleanup;
        }
        names[i] = fetched_path[i];
    }
    if (a.dump) {
        rc = dump_prompts(&a, names, n, data_dir);
        goto cleanup;
    }

    eng_backend *be = eng_backend_cpu_new(a.threads);
    if (!be) {
        fprintf(stderr, "eval: cannot create the CPU backend\n");
        rc = 1;
        goto cleanup;
    }
    eng_model m;
    tok_tokenizer *tok = NULL;
    char err[1024];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t0 = (double)ts.tv_sec + 1e-9 * ts.tv_nsec;
    if (mio_load_model(a.model, a.tokenizer, be, &m, &tok, err, sizeof err)) {
        fprintf(stderr, "eval: %s\n", err);
        eng_backend_free(be);
        rc = 1;
        goto cleanup;
    }
    ev_engine eng = {.m = &m, .tok = tok, .max_batch_tokens = a.batch_tokens};
    ev_model em;
    if (ev_engine_model(&eng, a.max_len, &em, err, sizeof err)) {
        fprintf(stderr, "eval: %s\n", err);
        rc = 1;
        goto free_model;
    }
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t_loaded = (double)ts.tv_sec + 1e-9 * ts.tv_nsec;
    fprintf(stderr, "eval: %s loaded in %.1f s (vocab %d, max_length %d, bos %s), data %s\n", a.model,
            t_loaded - t0, m.a.vocab_size, em.max_len, em.add_bos ? "yes" : "no", data_dir);
    ev_result *res = calloc((size_t)n, sizeof *res);
    if (!res) {
        rc = 1;
        goto free_model;
    }
    ev_load_opts lo = {.n_fewshot = a.fewshot, .subjects = a.subjects};
    eval_progress prog = {NULL, "", 0, n};
    ev_opts eo = {.limit = a.limit, .seed = a.seed, .progress = progress_show, .progress_user = &prog};
    FILE *samples = NULL;
    if (a.samples) {
        samples = fopen(a.samples, "w");
        if (!samples) {
            fprintf(stderr, "eval: %s: %s\n", a.samples, strerror(errno));
            free(res);
            rc = 1;
            goto free_model;
        }
        eo.sample = sample_write;
        eo.sample_user = samples;
    }
    int failed = 0;
    prog.pb = pb_open(stderr, PB_AUTO);
    for (int i = 0; i < n; i++) {
        ev_load_opts lo_i = lo;   /* --num-fewshot is MMLU's (the others have no training split here) */
        if (strcmp(names[i], "mmlu"))
            lo_i.n_fewshot = -1;
        const char *slash = strrchr(names[i], '/');
        prog.label = fetched_name[i] ? fetched_name[i] : slash ? slash + 1 : names[i];
        prog.index = i;
        progress_show(&prog, names[i], -1, 0);   /* loading and tokenizing count as the task's time */
        int r = ev_run_named(&em, names[i], data_dir, &lo_i, &eo, &res[i]);
        pb_end_stage(prog.pb, r ? "failed" : NULL);
        if (fetched_name[i])
            snprintf(res[i].task, sizeof res[i].task, "%s", fetched_name[i]);
        if (r) {
            failed++;
            pb_notef(prog.pb, "eval: %s: %s", res[i].task, res[i].error);
        }
    }
    pb_close(prog.pb);
    if (samples && fclose(samples)) {
        fprintf(stderr, "eval: writing %s failed\n", a.samples);
        rc = 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double wall = (double)ts.tv_sec + 1e-9 * ts.tv_nsec - t_loaded;
    int64_t items = 0;
    for (int i = 0; i < n; i++)
        items += res[i].ok ? res[i].n : 0;
    printf("model %s  limit %d  seed %llu  threads %d\n", a.model, a.limit, (unsigned long long)a.seed,
           be->threads);
    ev_print_table(stdout, res, n, a.verbose);
    printf("%lld items in %.1f s (%.2f items/s); %lld forwards, %lld rows (%lld requests shared a row), %lld tokens\n",
           (long long)items, wall, wall > 0 ? items / wall : 0.0, (long long)eng.forwards, (long long)eng.rows,
           (long long)eng.shared, (long long)eng.tokens_forwarded);
    if (a.json_out) {
        json_t *j = ev_results_json(res, n);
        if (j) {
            json_object_set_new(j, "model", json_string(a.model));
            json_object_set_new(j, "limit", json_integer(a.limit));
            json_object_set_new(j, "seed", json_integer((json_int_t)a.seed));
            json_object_set_new(j, "max_length", json_integer(em.max_len));
            json_object_set_new(j, "threads", json_integer(be->threads));
            json_object_set_new(j, "wall_s", json_real(wall));
            json_object_set_new(j, "items_per_s", json_real(wall > 0 ? items / wall : 0.0));
            json_object_set_new(j, "engine", json_pack("{s:I,s:I,s:I,s:I}", "forwards", (json_int_t)eng.forwards,
                                                       "rows", (json_int_t)eng.rows, "shared_requests",
                                                       (json_int_t)eng.shared, "tokens", (json_int_t)eng.tokens_forwarded));
        }
        if (!j || write_json_atomic(a.json_out, j)) {
            fprintf(stderr, "eval: writing %s failed\n", a.json_out);
            rc = 1;
        }
        json_decref(j);
    }
    for (int i = 0; i < n; i++)
        ev_result_free(&res[i]);
    free(res);
    if (failed)
        rc = 1;
free_model:
    ev_engine_free(&eng);
    eng_model_free(&m);
    tok_free(tok);
    eng_backend_free(be);
cleanup:
    for (int i = 0; i < n; i++) {
        if (fetched_path[i])
            unlink(fetched_path[i]);
        free(fetched_path[i]);
        free(fetched_name[i]);
    }
    return rc;
}
