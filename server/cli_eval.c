/* server/cli_eval.c — `autocompress eval MODEL --tasks ...`: load a model (any format
 * storage/modelio reads, or a pruned or distilled snapshot folder), score benchmark tasks as lm-evaluation-harness does
 * (compress/eval), print a table and optionally write the results as JSON.
 * `--dump-prompts FILE` writes the exact context/continuation strings instead of
 * scoring (no model is loaded), for checking templates against other implementations.
 * Progress per task goes to stderr (server/progress.h: a bar on a terminal, plain lines
 * elsewhere); the table and --json output are unchanged.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "compress/eval.h"
#include "compress/evaltasks.h"
#include "compress/prune.h"
#include "compress/steps.h"
#include "engine/backend.h"
#include "engine/clock.h"
#include "engine/model.h"
#include "server/cli.h"
#include "server/cli_args.h"
#include "server/progress.h"
#include "storage/fileio.h"
#include "storage/modelio.h"

#define EV_MAX_TASKS 64

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
    char tmpl[] = "/tmp/ac-eval-task-XXXXXX.jsonl";   /* the suffix makes it a task file to the evaluator */
    int fd = url ? mkstemps(tmpl, 6) : -1;
    if (fd < 0) {
        free(url);
        snprintf(err, errlen, "cannot create a temporary file: %s", strerror(errno));
        return -1;
    }
    close(fd);
    if (ev_fetch_url(url, h + 8, max_bytes, tmpl, 1, err, errlen)) {   /* the user's own network */
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

/* CLI_END with *a filled, or the exit status. */
static int eval_parse(int argc, char **argv, eval_args *a)
{
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
    step_eval_opts d;
    step_eval_default(&d);
    *a = (eval_args){.limit = d.limit, .seed = d.seed, .fewshot = d.n_fewshot, .max_task_bytes = d.max_task_bytes};
    snprintf(a->tasks_arg, sizeof a->tasks_arg, "eight");
    cli_parser p;
    int c;
    int64_t bytes;
    cli_init(&p, "eval", argc, argv, opts, "t:l:s:k:S:d:T:j:L:b:m:o:D:Y:vh", eval_usage);
    while ((c = cli_next(&p)) > 0) {
        switch (c) {
        case 't': cli_str(&p, a->tasks_arg, sizeof a->tasks_arg); break;
        case 'l': cli_int(&p, 0, 100000000, &a->limit); break;
        case 's': cli_u64(&p, &a->seed); break;
        case 'k': cli_int(&p, 0, 5, &a->fewshot); break;
        case 'S': a->subjects = p.arg; break;
        case 'd': a->data = p.arg; break;
        case 'T': a->tokenizer = p.arg; break;
        case 'j': cli_int(&p, 0, 4096, &a->threads); break;
        case 'L': cli_int(&p, 2, 1 << 20, &a->max_len); break;
        case 'b': cli_int(&p, 1, 1 << 24, &a->batch_tokens); break;
        case 'm':
            if (cli_i64(&p, 1, (int64_t)1 << 40, &bytes) == 0)
                a->max_task_bytes = (size_t)bytes;
            break;
        case 'o': a->json_out = p.arg; break;
        case 'D': a->dump = p.arg; break;
        case 'Y': a->samples = p.arg; break;
        case 'v': a->verbose = 1; break;
        }
    }
    if (c != CLI_END)
        return cli_status(c);
    a->model = cli_operand(&p);
    if (cli_no_more_operands(&p))
        return 2;
    if (!a->model && !a->dump) {
        eval_usage(stderr);
        return 2;
    }
    return CLI_END;
}

/* The tasks of --tasks: names or files, URL tasks fetched into temporary files. */
typedef struct {
    char *names[EV_MAX_TASKS];          /* what ev_run_named loads (borrowed from tasks_arg or fetched) */
    char *fetched_path[EV_MAX_TASKS];   /* owned; removed by tasks_free */
    char *fetched_name[EV_MAX_TASKS];   /* owned: a URL task's name */
    int n;
} eval_tasks;

static void tasks_free(eval_tasks *t)
{
    for (int i = 0; i < t->n; i++) {
        if (t->fetched_path[i])
            unlink(t->fetched_path[i]);
        free(t->fetched_path[i]);
        free(t->fetched_name[i]);
    }
}

/* Expand and fetch. 0, or the exit status (2 for a bad list, 1 for a failed fetch). */
static int tasks_resolve(eval_args *a, eval_tasks *t)
{
    memset(t, 0, sizeof *t);
    t->n = expand_tasks(a->tasks_arg, t->names, EV_MAX_TASKS);
    if (t->n <= 0) {
        fprintf(stderr, "eval: --tasks names no tasks (or more than %d)\n", EV_MAX_TASKS);
        t->n = 0;
        return 2;
    }
    for (int i = 0; i < t->n; i++) {
        const char *nm = t->names[i];
        if (strncmp(nm, "http://", 7) && strncmp(nm, "https://", 8) && strncmp(nm, "file://", 7))
            continue;
        char err[1024];
        if (fetch_task(nm, a->max_task_bytes, &t->fetched_path[i], &t->fetched_name[i], err, sizeof err)) {
            fprintf(stderr, "eval: %s\n", err);
            return 1;
        }
        t->names[i] = t->fetched_path[i];
    }
    return 0;
}

/* Score every task with a progress stage each; res[i] gets task i's result. Returns
 * the number of tasks that failed. */
static int score_tasks(const eval_args *a, const ev_model *em, const eval_tasks *t, const char *data_dir,
                       FILE *samples, ev_result *res)
{
    ev_load_opts lo = {.n_fewshot = a->fewshot, .subjects = a->subjects};
    eval_progress prog = {NULL, "", 0, t->n};
    ev_opts eo = {.limit = a->limit, .seed = a->seed, .progress = progress_show, .progress_user = &prog};
    if (samples) {
        eo.sample = sample_write;
        eo.sample_user = samples;
    }
    int failed = 0;
    prog.pb = pb_open(stderr, PB_AUTO);
    for (int i = 0; i < t->n; i++) {
        ev_load_opts lo_i = lo;   /* --num-fewshot is MMLU's (the others have no training split here) */
        if (strcmp(t->names[i], "mmlu"))
            lo_i.n_fewshot = -1;
        const char *slash = strrchr(t->names[i], '/');
        prog.label = t->fetched_name[i] ? t->fetched_name[i] : slash ? slash + 1 : t->names[i];
        prog.index = i;
        progress_show(&prog, t->names[i], -1, 0);   /* loading and tokenizing count as the task's time */
        int r = ev_run_named(em, t->names[i], data_dir, &lo_i, &eo, &res[i]);
        pb_end_stage(prog.pb, r ? "failed" : NULL);
        if (t->fetched_name[i])
            snprintf(res[i].task, sizeof res[i].task, "%s", t->fetched_name[i]);
        if (r) {
            failed++;
            pb_notef(prog.pb, "eval: %s: %s", res[i].task, res[i].error);
        }
    }
    pb_close(prog.pb);
    return failed;
}

/* The table on stdout and, with --json, the results file. 0, or 1 when it could not
 * be written. */
static int eval_report(const eval_args *a, const ev_engine *eng, const ev_model *em, int threads,
                       const ev_result *res, int n, double wall)
{
    int64_t items = 0;
    for (int i = 0; i < n; i++)
        items += res[i].ok ? res[i].n : 0;
    printf("model %s  limit %d  seed %llu  threads %d\n", a->model, a->limit, (unsigned long long)a->seed, threads);
    ev_print_table(stdout, res, n, a->verbose);
    printf("%lld items in %.1f s (%.2f items/s); %lld forwards, %lld rows (%lld requests shared a row), %lld tokens\n",
           (long long)items, wall, wall > 0 ? items / wall : 0.0, (long long)eng->forwards, (long long)eng->rows,
           (long long)eng->shared, (long long)eng->tokens_forwarded);
    if (!a->json_out)
        return 0;
    json_t *j = ev_results_json(res, n);
    if (j) {
        json_object_set_new(j, "model", json_string(a->model));
        json_object_set_new(j, "limit", json_integer(a->limit));
        json_object_set_new(j, "seed", json_integer((json_int_t)a->seed));
        json_object_set_new(j, "max_length", json_integer(em->max_len));
        json_object_set_new(j, "threads", json_integer(threads));
        json_object_set_new(j, "wall_s", json_real(wall));
        json_object_set_new(j, "items_per_s", json_real(wall > 0 ? items / wall : 0.0));
        json_object_set_new(j, "engine", json_pack("{s:I,s:I,s:I,s:I}", "forwards", (json_int_t)eng->forwards,
                                                   "rows", (json_int_t)eng->rows, "shared_requests",
                                                   (json_int_t)eng->shared, "tokens", (json_int_t)eng->tokens_forwarded));
    }
    char err[4400] = "out of memory";
    int rc = !j || fio_write_json(a->json_out, j, JSON_INDENT(2) | JSON_SORT_KEYS, err, sizeof err);
    if (rc)
        fprintf(stderr, "eval: writing %s failed: %s\n", a->json_out, err);
    json_decref(j);
    return rc ? 1 : 0;
}

/* Load the model, score the tasks and report. The exit status. */
static int eval_model(const eval_args *a, const eval_tasks *t, const char *data_dir)
{
    eng_backend *be = eng_backend_cpu_new(a->threads);
    if (!be) {
        fprintf(stderr, "eval: cannot create the CPU backend\n");
        return 1;
    }
    eng_model m;
    tok_tokenizer *tok = NULL;
    char err[1024];
    double t0 = eng_wall_s();
    if (prune_load_model(a->model, a->tokenizer, be, &m, &tok, err, sizeof err)) {
        fprintf(stderr, "eval: %s\n", err);
        eng_backend_free(be);
        return 1;
    }
    int rc = 1;
    ev_engine eng = {.m = &m, .tok = tok, .max_batch_tokens = a->batch_tokens};
    ev_model em;
    ev_result *res = NULL;
    FILE *samples = NULL;
    if (ev_engine_model(&eng, a->max_len, &em, err, sizeof err)) {
        fprintf(stderr, "eval: %s\n", err);
        goto out;
    }
    double t_loaded = eng_wall_s();
    fprintf(stderr, "eval: %s loaded in %.1f s (vocab %d, max_length %d, bos %s), data %s\n", a->model,
            t_loaded - t0, m.a.vocab_size, em.max_len, em.add_bos ? "yes" : "no", data_dir);
    if (!(res = calloc((size_t)t->n, sizeof *res)))
        goto out;
    if (a->samples && !(samples = fopen(a->samples, "w"))) {
        fprintf(stderr, "eval: %s: %s\n", a->samples, strerror(errno));
        goto out;
    }
    int failed = score_tasks(a, &em, t, data_dir, samples, res);
    rc = 0;
    if (samples && fclose(samples)) {
        fprintf(stderr, "eval: writing %s failed\n", a->samples);
        rc = 1;
    }
    samples = NULL;
    if (eval_report(a, &eng, &em, be->threads, res, t->n, eng_wall_s() - t_loaded) || failed)
        rc = 1;
out:
    if (samples)
        fclose(samples);
    for (int i = 0; res && i < t->n; i++)
        ev_result_free(&res[i]);
    free(res);
    ev_engine_free(&eng);
    eng_model_free(&m);
    tok_free(tok);
    eng_backend_free(be);
    return rc;
}

int cli_eval(int argc, char **argv)
{
    eval_args a;
    int rc = eval_parse(argc, argv, &a);
    if (rc != CLI_END)
        return rc;
    char dbuf[1024];
    const char *data_dir = a.data ? a.data : default_data_dir(dbuf, sizeof dbuf);
    eval_tasks t;
    rc = tasks_resolve(&a, &t);
    if (rc == 0)
        rc = a.dump ? dump_prompts(&a, t.names, t.n, data_dir) : eval_model(&a, &t, data_dir);
    tasks_free(&t);
    return rc;
}
