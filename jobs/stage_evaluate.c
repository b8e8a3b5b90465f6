/* jobs/stage_evaluate.c — the pipeline's "evaluate" stage: the spec's evaluation tasks
 * scored on the parent and on the result (distill/student, else prune/student) with the
 * same code as `autocompress eval` (compress/eval), and with evaluation.pruned the
 * pruned-only student as well. Writes evaluate/eval.json (published as an artifact) and
 * merges {parent|result|pruned: {accuracy, average, perplexity}} into the report. A
 * task that fails to load is recorded with its error; the others still run.
 * Built-in task data is read from $AC_EVAL_DATA (else $AC_SHARED/data, else the data
 * dir's data/, else ./data). The parent's scores are cached in the data dir (see
 * parent_cache_path): every job on the same parent and tasks scores it once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "compress/eval.h"
#include "compress/evaltasks.h"
#include "compress/prune.h"
#include "compress/steps.h"
#include "jobs/pstate.h"
#include "jobs/stage.h"
#include "jobs/stages.h"
#include "storage/artstore.h"
#include "storage/fileio.h"
#include "storage/strbuf.h"

typedef struct {
    job_ctx *ctx;
    const char *which;   /* "parent" | "result" */
    int64_t done_before, total;
} eval_cb;

static int on_progress(void *user, const char *task, int64_t done, int64_t total)
{
    eval_cb *cb = user;
    (void)total;
    job_progress(cb->ctx, cb->done_before + done, cb->total);
    if (done == total) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: %s scored (%lld items)", cb->which, task, (long long)done);
        job_event(cb->ctx, "evaluate.task", msg, NULL);
    }
    return job_cancelled(cb->ctx);
}

static const char *data_dir(job_ctx *ctx, char *buf, size_t len)
{
    char server[4096];
    snprintf(server, sizeof server, "%s/../..", job_ctx_dir(ctx));   /* the server's data dir */
    return ev_data_dir(server, buf, len);
}

/* One task reference of the spec: a name, {name?, path} or {name?, url, sha256}. The
 * fetched file (if any) goes into the stage directory. *ref is the name or file to
 * load, *display its report name. Returns 0, or -1 with err. */
static int task_ref(job_ctx *ctx, json_t *t, size_t i, char *ref, size_t reflen, char *display, size_t dlen,
                    char *err, size_t errlen)
{
    if (json_is_string(t)) {
        snprintf(ref, reflen, "%s", json_string_value(t));
        snprintf(display, dlen, "%s", json_string_value(t));
        return 0;
    }
    const char *name = json_string_value(json_object_get(t, "name"));
    const char *path = json_string_value(json_object_get(t, "path"));
    const char *url = json_string_value(json_object_get(t, "url"));
    const char *sha = json_string_value(json_object_get(t, "sha256"));
    snprintf(display, dlen, "%s", name ? name : "task");
    if (path) {
        snprintf(ref, reflen, "%s", path);
        return 0;
    }
    if (url) {
        if (strncmp(url, "https://", 8) && strncmp(url, "http://", 7)) {
            /* file:// and friends would read the server's files around the allowed roots */
            snprintf(err, errlen, "/evaluation/tasks/%zu/url: only http and https URLs", i);
            return -1;
        }
        int n = snprintf(ref, reflen, "%s/task-%zu.jsonl", job_ctx_stage_dir(ctx), i);
        if (n < 0 || (size_t)n >= reflen) {
            snprintf(err, errlen, "/evaluation/tasks/%zu: stage path too long", i);
            return -1;
        }
        if (access(ref, R_OK) == 0)
            return 0;   /* fetched and verified by an earlier run of this stage */
        step_eval_opts d;
        step_eval_default(&d);
        /* the server's policy for its downloads (serve exports it to its workers) */
        const char *ap = getenv("AC_ALLOW_PRIVATE_MODEL_HOSTS");
        return ev_fetch_url(url, sha, d.max_task_bytes, ref, ap && !strcmp(ap, "1"), err, errlen);
    }
    snprintf(err, errlen, "/evaluation/tasks/%zu: a task is a name or an object with path or url", i);
    return -1;
}

/* ---------- the parent's scores, cached ----------
 * They depend only on the parent, the task references, limit, seed and the task data
 * folder (and on how scoring works: the version in the key, raised whenever it
 * changes), so they live in <data>/evalcache/ (jobs/pstate.h ps_cache_path). A task by
 * URL is pinned by its sha256, which is part of the reference; a task file by path, by
 * the sha-256 of what it holds now. */
int stage_eval_parent_key(const json_t *tasks, int limit, uint64_t seed, const char *dd, strbuf *key, char *err,
                          size_t errlen)
{
    char *tj = json_dumps(tasks, JSON_COMPACT | JSON_SORT_KEYS);
    if (!tj) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    strbuf_printf(key, "autocompress-eval-2\nlimit %d seed %llu\ntasks %s\ndata %s\n", limit,
                  (unsigned long long)seed, tj, dd);
    free(tj);
    size_t i;
    json_t *t;
    json_array_foreach(tasks, i, t) {
        const char *p = json_string_value(json_object_get(t, "path"));
        char hex[65];
        int64_t size;
        if (!p)
            continue;
        if (art_sha256_file(p, hex, &size, err, errlen) < 0)
            return -1;
        strbuf_printf(key, "file %zu %s\n", i, hex);   /* an edited file is another task */
    }
    if (key->oom)
        snprintf(err, errlen, "out of memory");
    return key->oom ? -1 : 0;
}

static int parent_cache_path(job_ctx *ctx, json_t *tasks, int limit, uint64_t seed, const char *dd, char *path,
                             size_t len)
{
    strbuf key = {0};
    char err[256];
    int rc = stage_eval_parent_key(tasks, limit, seed, dd, &key, err, sizeof err) == 0
                 ? ps_cache_path(ctx, "evalcache", key.s, NULL, path, len) : -1;
    free(key.s);
    return rc;
}

/* 1 when every task of a run (ev_results_json's) was scored: a task that failed (its data
 * missing, its download refused) is no score of the parent's for a later job. */
static int run_whole(const json_t *run)
{
    json_t *tasks = json_object_get(run, "tasks"), *t;
    const char *k;
    if (!json_is_object(tasks) || !json_object_size(tasks))
        return 0;
    json_object_foreach(tasks, k, t)
        if (!json_is_true(json_object_get(t, "ok")))
            return 0;
    return 1;
}

/* The cached parent run at path (NEW), or NULL when absent, unreadable or not whole. */
static json_t *parent_cache_get(const char *path)
{
    json_error_t je;
    json_t *j = access(path, R_OK) == 0 ? json_load_file(path, 0, &je) : NULL;
    if (j && (!json_is_object(json_object_get(j, "accuracy")) || !run_whole(j))) {
        json_decref(j);
        j = NULL;
    }
    return j;
}

/* Keep a parent run for later jobs; a failure only costs the next job the run. */
static void parent_cache_put(job_ctx *ctx, const char *path, const json_t *run)
{
    char e[512];
    if (fio_write_json(path, run, JSON_INDENT(1), e, sizeof e)) {
        char msg[600];
        snprintf(msg, sizeof msg, "the parent's scores were not cached: %s", e);
        job_event(ctx, "evaluate.cache_failed", msg, NULL);
    }
}

/* Score every task on one model; returns the run's JSON (NEW) or NULL when cancelled
 * (*cancelled = 1) or out of memory. */
static json_t *eval_model(job_ctx *ctx, const char *which, eng_model *m, tok_tokenizer *tok, json_t *tasks,
                          int limit, uint64_t seed, int64_t step0, int64_t total, int *cancelled, char *err,
                          size_t errlen)
{
    ev_engine eng = {.m = m, .tok = tok};
    ev_model em;
    if (ev_engine_model(&eng, 0, &em, err, errlen))
        return NULL;
    size_t n = json_array_size(tasks);
    ev_result *res = calloc(n ? n : 1, sizeof *res);
    if (!res) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    char dbuf[1024];
    const char *dd = data_dir(ctx, dbuf, sizeof dbuf);
    eval_cb cb = {ctx, which, step0, total};
    ev_opts o = {.limit = limit, .seed = seed, .progress = on_progress, .progress_user = &cb};
    ev_load_opts lo = {.n_fewshot = -1};
    *cancelled = 0;
    for (size_t i = 0; i < n && !*cancelled; i++) {
        char ref[4200], display[EV_TASK_NAME_MAX + 1], e[1024];
        if (task_ref(ctx, json_array_get(tasks, i), i, ref, sizeof ref, display, sizeof display, e, sizeof e)) {
            snprintf(res[i].task, sizeof res[i].task, "%s", display);
            snprintf(res[i].error, sizeof res[i].error, "%s", e);
            continue;
        }
        int rc = ev_run_named(&em, ref, dd, &lo, &o, &res[i]);
        snprintf(res[i].task, sizeof res[i].task, "%s", display);
        /* the built-in tasks' files named as under the data folder ("eval/piqa/..."), as
         * the job's own files: the server's paths are not its client's business */
        fio_unprefix(res[i].source, dd);
        fio_unprefix(res[i].error, dd);
        job_ctx_unprefix(ctx, res[i].source);
        job_ctx_unprefix(ctx, res[i].error);
        if (rc == 1)
            *cancelled = 1;
        else if (rc) {
            char msg[1200];
            snprintf(msg, sizeof msg, "%s: %s: %.1000s", which, display, res[i].error);
            job_event(ctx, "evaluate.task_failed", msg, NULL);
        }
        cb.done_before += res[i].n;
    }
    json_t *j = *cancelled ? NULL : ev_results_json(res, (int)n);
    if (j)
        json_object_set_new(j, "engine", json_pack("{s:I,s:I,s:I}", "forwards", (json_int_t)eng.forwards, "rows",
                                                   (json_int_t)eng.rows, "tokens", (json_int_t)eng.tokens_forwarded));
    else if (!*cancelled)
        snprintf(err, errlen, "out of memory");
    for (size_t i = 0; i < n; i++)
        ev_result_free(&res[i]);
    free(res);
    ev_engine_free(&eng);
    return j;
}

/* Score a saved student snapshot (prune/student, distill/student) like eval_model. */
static json_t *eval_dir(job_ctx *ctx, const char *which, const char *dir, eng_backend *be, tok_tokenizer *tok,
                        json_t *tasks, int limit, uint64_t seed, int64_t step0, int64_t total, int *cancelled,
                        char *err, size_t errlen)
{
    eng_model student;
    if (prune_load_dir(dir, be, &student, NULL, err, errlen))
        return NULL;
    json_t *j = eval_model(ctx, which, &student, tok, tasks, limit, seed, step0, total, cancelled, err, errlen);
    eng_model_free(&student);
    return j;
}

/* Items the run will score (for progress): limit per task, all when unknown. */
static int64_t planned_items(json_t *tasks, int limit)
{
    int64_t per = limit > 0 ? limit : 1000;
    return per * (int64_t)(json_array_size(tasks) ? json_array_size(tasks) : 1);
}

static int stage_evaluate(job_ctx *ctx, char *err, size_t errlen)
{
    json_t *ev = json_object_get(job_ctx_spec(ctx), "evaluation");
    json_t *tasks = json_object_get(ev, "tasks");
    if (!json_is_array(tasks) || json_array_size(tasks) == 0) {
        job_event(ctx, "evaluate.skipped", "no evaluation tasks in the spec", NULL);
        return 0;
    }
    json_t *jl = json_object_get(ev, "limit"), *js = json_object_get(ev, "seed");
    step_eval_opts d;
    step_eval_default(&d);
    int limit = json_is_integer(jl) ? (int)json_integer_value(jl) : 500;   /* the spec's default */
    uint64_t seed = json_is_integer(js) ? (uint64_t)json_integer_value(js) : d.seed;

    eng_model *parent = ps_parent(ctx, 0, err, errlen);
    tok_tokenizer *tok = parent ? ps_tokenizer(ctx, err, errlen) : NULL;
    if (!parent || !tok)
        return -1;
    const char *sdir = job_ctx_output(ctx, "distill", "student");
    char sbuf[4400];
    if (sdir) {
        snprintf(sbuf, sizeof sbuf, "%s", sdir);
    } else if ((sdir = job_ctx_output(ctx, "prune", "student"))) {
        snprintf(sbuf, sizeof sbuf, "%s", sdir);
    } else {
        sbuf[0] = '\0';
    }
    /* evaluation.pruned: the pruned-only student too, when distillation made another one */
    const char *pdir = json_is_true(json_object_get(ev, "pruned")) && job_ctx_output(ctx, "distill", "student")
                           ? job_ctx_output(ctx, "prune", "student")
                           : NULL;
    int64_t per_model = planned_items(tasks, limit),
            total = per_model * ((sbuf[0] ? 2 : 1) + (pdir ? 1 : 0));
    int cancelled = 0;
    char dbuf[1024], cpath[4400];
    int cacheable = parent_cache_path(ctx, tasks, limit, seed, data_dir(ctx, dbuf, sizeof dbuf), cpath,
                                      sizeof cpath) == 0;
    json_t *pj = cacheable ? parent_cache_get(cpath) : NULL;
    if (pj) {
        const char *slash = strrchr(cpath, '/');   /* the entry, not the server's path to it */
        job_event(ctx, "evaluate.parent_reused", "the parent's scores come from an earlier job (evalcache)",
                  json_pack("{s:s}", "cache", slash ? slash + 1 : cpath));
    } else {
        pj = eval_model(ctx, "parent", parent, tok, tasks, limit, seed, 0, total, &cancelled, err, errlen);
        if (!pj)
            return cancelled ? 1 : -1;
        if (cacheable && run_whole(pj))
            parent_cache_put(ctx, cpath, pj);
    }
    json_t *rj = NULL, *prj = NULL;
    if (sbuf[0]) {
        rj = eval_dir(ctx, "result", sbuf, parent->be, tok, tasks, limit, seed, per_model, total, &cancelled, err,
                      errlen);
        if (rj && pdir)
            prj = eval_dir(ctx, "pruned", pdir, parent->be, tok, tasks, limit, seed, 2 * per_model, total,
                           &cancelled, err, errlen);
        if (!rj || (pdir && !prj)) {
            json_decref(pj);
            json_decref(rj);
            return cancelled ? 1 : -1;
        }
    } else {
        job_event(ctx, "evaluate.no_result", "no pruned or distilled student in this job: the parent only", NULL);
    }
    json_t *doc = json_pack("{s:O,s:i,s:I}", "tasks", tasks, "limit", limit, "seed", (json_int_t)seed);
    json_t *report = json_object();
    if (!doc || !report) {
        json_decref(doc);
        json_decref(report);
        json_decref(pj);
        json_decref(rj);
        json_decref(prj);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const char *names[3] = {"parent", "result", "pruned"};
    json_t *runs[3] = {pj, rj, prj};
    for (int k = 0; k < 3; k++) {
        if (!runs[k])
            continue;
        json_t *part = json_pack("{s:O,s:O,s:O}", "accuracy", json_object_get(runs[k], "accuracy"), "average",
                                 json_object_get(runs[k], "average"), "perplexity",
                                 json_object_get(runs[k], "perplexity"));
        json_object_set_new(report, names[k], part);
        json_object_set_new(doc, names[k], runs[k]);   /* steals */
    }
    char path[4400];
    snprintf(path, sizeof path, "%s/eval.json", job_ctx_stage_dir(ctx));
    if (ps_write_json(ctx, "eval.json", doc, err, errlen) ||   /* steals doc */
        job_publish(ctx, "eval.json", path, "application/json", err, errlen)) {
        json_decref(report);
        return -1;
    }
    static const char *const owned[] = {"parent.accuracy", "parent.average", "parent.perplexity", "result.accuracy",
                                        "result.average", "result.perplexity", "pruned", NULL};
    if (job_report_replace(ctx, owned, report)) {   /* steals */
        snprintf(err, errlen, "merging the evaluation into the report failed");
        return -1;
    }
    job_event(ctx, "evaluate.done", "evaluation written to eval.json", NULL);
    return 0;
}

void stage_evaluate_register(void)
{
    stage_register("evaluate", stage_evaluate);
}
