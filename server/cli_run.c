/* server/cli_run.c — `autocompress run SPEC.json --out DIR`: one job without a server.
 * The spec is validated exactly as POST /v1/jobs does (server paths may lie anywhere
 * unless --data-root confines them), the job is recorded in DIR/autocompress.db and run
 * in this process, and its artifacts are linked into DIR/. Prints the final job as JSON
 * on stdout; stage progress and events go to stderr (server/progress.h: a bar on a
 * terminal, plain lines elsewhere). Exits 0 when it succeeded, 1 when it failed or was
 * cancelled (Ctrl-C), 2 on bad input.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/spec.h"
#include "jobs/pipeline.h"
#include "jobs/stage.h"
#include "server/cli.h"
#include "server/cli_args.h"
#include "server/progress.h"
#include "storage/artstore.h"
#include "storage/store.h"

static void on_int(int sig)
{
    (void)sig;
    job_signal_cancel();
}

/* The job's progress and events, as the pipeline reports them (jobs/stage.h observer):
 * a stage shows from "stage.started" (or its first report, where the pipeline does not
 * announce stages); events are log lines above the bar. */
typedef struct {
    progress_bar *pb;
    json_t *stages;   /* the job's stage names (borrowed) */
    char stage[48];
} run_display;

static void on_job(void *ud, const char *stage, const char *type, const char *message, int64_t step,
                   int64_t total)
{
    run_display *d = ud;
    int fresh = strcmp(stage, d->stage) != 0;
    if (fresh)
        snprintf(d->stage, sizeof d->stage, "%s", stage);
    char extra[48] = "";
    size_t n = json_array_size(d->stages);
    for (size_t i = 0; i < n; i++) {
        const char *name = json_string_value(json_array_get(d->stages, i));
        if (name && !strcmp(name, stage))
            snprintf(extra, sizeof extra, "stage %zu/%zu", i + 1, n);
    }
    if (!type) {
        pb_update(d->pb, stage, step, total, NULL, extra);
        return;
    }
    if (!strcmp(type, "stage.started")) {
        pb_update(d->pb, stage, -1, 0, NULL, extra);
        return;
    }
    if (!strcmp(type, "stage.completed")) {
        pb_end_stage(d->pb, NULL);
        return;
    }
    if (fresh && stage[0])
        pb_update(d->pb, stage, -1, 0, NULL, extra);
    pb_notef(d->pb, "%s: %s", type, message);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: autocompress run SPEC.json [--out DIR] [--data-root DIR]...\n"
               "  --out DIR        job store, work directories and artifacts (default ./autocompress-run)\n"
               "  --data-root DIR  confine server paths in the spec to DIR (repeatable; default: none)\n");
}

typedef struct {
    const char *spec_path, *out;
    char *roots[16];   /* owned, resolved */
    int n_roots;
} run_args;

static void args_free(run_args *a)
{
    for (int i = 0; i < a->n_roots; i++)
        free(a->roots[i]);
}

/* CLI_END with *a filled (free with args_free), or the exit status. */
static int run_parse(int argc, char **argv, run_args *a)
{
    static const struct option opts[] = {{"out", required_argument, NULL, 'o'},
                                         {"data-root", required_argument, NULL, 'r'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    *a = (run_args){.out = "./autocompress-run"};
    cli_parser p;
    int c;
    char real[PATH_MAX];
    cli_init(&p, "run", argc, argv, opts, NULL, usage);
    while ((c = cli_next(&p)) > 0) {
        if (c == 'o')
            a->out = p.arg;
        else if (a->n_roots == 16)
            cli_fail(&p, "at most 16 --data-root folders");
        else if (!realpath(p.arg, real))
            cli_fail(&p, "--data-root %s: %s", p.arg, strerror(errno));
        else if (!(a->roots[a->n_roots++] = strdup(real)))
            cli_fail(&p, "out of memory");
    }
    if (c == CLI_END) {
        a->spec_path = cli_operand(&p);
        if (cli_no_more_operands(&p))
            c = CLI_EXIT_USAGE;
        else if (!a->spec_path) {
            usage(stderr);
            c = CLI_EXIT_USAGE;
        }
    }
    if (c == CLI_END && a->n_roots == 0 && !(a->roots[a->n_roots++] = strdup("/")))
        c = CLI_EXIT_USAGE;
    if (c != CLI_END)
        args_free(a);
    return c == CLI_END ? CLI_END : cli_status(c);
}

/* The spec in `in` (stolen) validated as POST /v1/jobs validates it. NEW reference, or
 * NULL after the messages. */
static json_t *spec_check(const run_args *a, store *st, json_t *in)
{
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) {
        json_decref(in);
        return NULL;
    }
    spec_env env = {(char **)a->roots, a->n_roots, cwd, st, stages_test_enabled(), 0, 0}; /* no server: no webhooks */
    int vstatus = 0;
    json_t *errors = NULL;
    json_t *spec = spec_validate(in, &env, &vstatus, &errors);
    json_decref(in);
    size_t i;
    json_t *e;
    if (!spec)
        json_array_foreach(errors, i, e) {
            const char *ptr = json_string_value(json_object_get(e, "pointer"));
            fprintf(stderr, "autocompress run: %s: %s\n", ptr && ptr[0] ? ptr : "(root)",
                    json_string_value(json_object_get(e, "message")));
        }
    json_decref(errors);
    return spec;
}

/* Run the claimed job in this process with the progress display; Ctrl-C cancels it. */
static void run_job(store *st, artstore *as, const char *out, store_job *j)
{
    char err[1024] = "";
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_int;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    stages_register_builtin();
    if (stages_test_enabled())
        stages_register_test();
    /* the user's own job on the user's machine: task downloads may reach its network, as
       `autocompress eval`'s do (a server decides with --allow-private-model-hosts) */
    (void)setenv("AC_ALLOW_PRIVATE_MODEL_HOSTS", "1", 0);
    run_display disp = {pb_open(stderr, PB_AUTO), j->stages, ""};
    if (disp.pb)
        job_set_observer(on_job, &disp);
    int jr = job_run(st, as, out, j->id, err, sizeof err);
    job_set_observer(NULL, NULL);
    store_job fin;
    int have_fin = store_job_get(st, j->id, &fin) == 0;
    int ok = have_fin && !strcmp(fin.status, "succeeded");
    /* the stage shown ends as the job did ("failed", "cancelled", "queued": stopped) when
     * it is the job's last; a stage that never reported may have come after it */
    pb_end_stage(disp.pb, ok || (have_fin && strcmp(fin.stage, disp.stage)) ? NULL : have_fin ? fin.status : "failed");
    if (have_fin && !ok)
        pb_notef(disp.pb, "autocompress run: job %s %s in stage %s%s%s", fin.id, fin.status, fin.stage,
                 fin.error_message[0] ? ": " : "", fin.error_message);
    pb_close(disp.pb);
    if (jr < 0)
        fprintf(stderr, "autocompress run: %s\n", err);
    if (have_fin)
        store_job_clear(&fin);
}

/* Link the job's artifacts into out and print the final job. The exit status: 0 when
 * it succeeded, else 1. */
static int run_print(store *st, artstore *as, const char *out, const char *id)
{
    store_job fin;
    if (store_job_get(st, id, &fin) != 0)
        return 1;
    json_t *arts = json_array();
    store_artifact *a = NULL;
    int n = 0;
    if (store_artifact_list(st, id, &a, &n) == 0) {
        for (int i = 0; i < n; i++) {
            char blob[PATH_MAX], dst[PATH_MAX + 300];
            snprintf(dst, sizeof dst, "%s/%s", out, a[i].name);
            unlink(dst);
            if (art_path(as, a[i].sha256, blob, sizeof blob) == 0 && link(blob, dst) == 0)
                json_array_append_new(arts, json_string(dst));
        }
        free(a);
    }
    json_t *o = json_pack("{s:s,s:s,s:s,s:o,s:o,s:O}", "id", fin.id, "status", fin.status, "stage", fin.stage, "error",
                          fin.error_code[0] ? json_pack("{s:s,s:s}", "code", fin.error_code, "message",
                                                        fin.error_message)
                                            : json_null(),
                          "artifacts", arts, "report", fin.report);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (text)
        printf("%s\n", text);
    free(text);
    json_decref(o);
    int status = !strcmp(fin.status, "succeeded") ? 0 : 1;
    store_job_clear(&fin);
    return status;
}

/* Record the job (spec stolen) in st and claim it. 0, or -1 after the message. */
static int job_record(store *st, json_t *spec, store_job *j)
{
    char err[1024] = "";
    memset(j, 0, sizeof *j);
    if (store_new_id("job_", j->id, sizeof j->id) < 0) {
        fprintf(stderr, "autocompress run: no random id\n");
        json_decref(spec);
        return -1;
    }
    snprintf(j->kind, sizeof j->kind, "job");
    snprintf(j->device, sizeof j->device, "%s",
             json_string_value(json_object_get(json_object_get(spec, "target"), "device")));
    snprintf(j->name, sizeof j->name, "%s", json_string_value(json_object_get(spec, "name")));
    j->spec = spec;
    j->stages = job_pipeline_for("job", spec);
    store_job claimed;
    if (store_job_create(st, j, NULL, NULL, NULL, 0, NULL, err, sizeof err) < 0 ||
        store_job_claim(st, &(store_claim){j->device, 1, "run", 86400}, &claimed) != 0) {
        fprintf(stderr, "autocompress run: recording the job failed: %s\n", err);
        return -1;
    }
    store_job_clear(&claimed);
    return 0;
}

int cli_run(int argc, char **argv)
{
    run_args a;
    int status = run_parse(argc, argv, &a);
    if (status != CLI_END)
        return status;
    status = 2;
    char path[PATH_MAX + 64], err[1024] = "";
    store *st = NULL;
    artstore *as = NULL;
    json_error_t je;
    json_t *in = json_load_file(a.spec_path, JSON_REJECT_DUPLICATES, &je), *spec;
    if (!in) {
        fprintf(stderr, "autocompress run: %s:%d:%d: %s\n", a.spec_path, je.line, je.column, je.text);
        goto out;
    }
    if (mkdir(a.out, 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "autocompress run: --out %s: %s\n", a.out, strerror(errno));
        json_decref(in);
        goto out;
    }
    snprintf(path, sizeof path, "%s/autocompress.db", a.out);
    if (!(st = store_open(path, err, sizeof err))) {
        fprintf(stderr, "autocompress run: %s\n", err);
        json_decref(in);
        goto out;
    }
    if (!(spec = spec_check(&a, st, in)))
        goto out;
    status = 1;
    snprintf(path, sizeof path, "%s/artifacts", a.out);
    if (!(as = art_open(path, err, sizeof err))) {
        fprintf(stderr, "autocompress run: %s\n", err);
        json_decref(spec);
        goto out;
    }
    store_job j;
    if (job_record(st, spec, &j) == 0) {
        run_job(st, as, a.out, &j);
        status = run_print(st, as, a.out, j.id);
    }
    store_job_clear(&j);
out:
    art_close(as);
    store_close(st);
    args_free(&a);
    return status;
}
