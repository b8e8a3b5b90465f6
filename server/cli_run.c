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

static int usage(void)
{
    fprintf(stderr, "usage: autocompress run SPEC.json [--out DIR] [--data-root DIR]...\n"
                    "  --out DIR        job store, work directories and artifacts (default ./autocompress-run)\n"
                    "  --data-root DIR  confine server paths in the spec to DIR (repeatable; default: none)\n");
    return 2;
}

int cli_run(int argc, char **argv)
{
    const char *spec_path = NULL, *out = "./autocompress-run";
    char *roots[16];
    int n_roots = 0, status = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--data-root") && i + 1 < argc && n_roots < 16) {
            char real[PATH_MAX];
            if (!realpath(argv[i + 1], real)) {
                fprintf(stderr, "autocompress run: --data-root %s: %s\n", argv[i + 1], strerror(errno));
                goto out;
            }
            roots[n_roots++] = strdup(real);
            i++;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        } else if (argv[i][0] != '-' && !spec_path)
            spec_path = argv[i];
        else {
            fprintf(stderr, "autocompress run: %s '%s'\n",
                    argv[i][0] == '-' ? (!strcmp(argv[i], "--out") || !strcmp(argv[i], "--data-root")
                                             ? "a value is missing after" : "unknown option")
                                      : "unexpected argument", argv[i]);
            return usage();
        }
    }
    if (!spec_path)
        return usage();
    if (n_roots == 0)
        roots[n_roots++] = strdup("/");
    json_error_t je;
    json_t *in = json_load_file(spec_path, JSON_REJECT_DUPLICATES, &je);
    if (!in) {
        fprintf(stderr, "autocompress run: %s:%d:%d: %s\n", spec_path, je.line, je.column, je.text);
        goto out;
    }
    if (mkdir(out, 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "autocompress run: --out %s: %s\n", out, strerror(errno));
        json_decref(in);
        goto out;
    }
    char path[PATH_MAX + 64], err[1024] = "", cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) {
        json_decref(in);
        goto out;
    }
    snprintf(path, sizeof path, "%s/autocompress.db", out);
    store *st = store_open(path, err, sizeof err);
    if (!st) {
        fprintf(stderr, "autocompress run: %s\n", err);
        json_decref(in);
        goto out;
    }
    spec_env env = {roots, n_roots, cwd, st, stages_test_enabled(), 0}; /* no server: no webhooks */
    int vstatus = 0;
    json_t *errors = NULL;
    json_t *spec = spec_validate(in, &env, &vstatus, &errors);
    json_decref(in);
    if (!spec) {
        size_t i;
        json_t *e;
        json_array_foreach(errors, i, e)
            fprintf(stderr, "autocompress run: %s: %s\n",
                    json_string_value(json_object_get(e, "pointer"))[0] ? json_string_value(json_object_get(e, "pointer")) : "(root)",
                    json_string_value(json_object_get(e, "message")));
        json_decref(errors);
        store_close(st);
        goto out;
    }
    snprintf(path, sizeof path, "%s/artifacts", out);
    artstore *as = art_open(path, err, sizeof err);
    store_job j;
    memset(&j, 0, sizeof j);
    if (!as || store_new_id("job_", j.id, sizeof j.id) < 0) {
        fprintf(stderr, "autocompress run: %s\n", as ? "no random id" : err);
        json_decref(spec);
        art_close(as);
        store_close(st);
        status = 1;
        goto out;
    }
    snprintf(j.kind, sizeof j.kind, "job");
    snprintf(j.device, sizeof j.device, "%s", json_string_value(json_object_get(json_object_get(spec, "target"), "device")));
    snprintf(j.name, sizeof j.name, "%s", json_string_value(json_object_get(spec, "name")));
    j.spec = spec;
    j.stages = job_pipeline_for("job", spec);
    status = 1;
    store_job claimed;
    if (store_job_create(st, &j, NULL, NULL, NULL, 0, NULL, err, sizeof err) < 0 ||
        store_job_claim(st, j.device, &claimed) != 0) {
        fprintf(stderr, "autocompress run: recording the job failed: %s\n", err);
    } else {
        store_job_clear(&claimed);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_int;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        stages_register_builtin();
        if (stages_test_enabled())
            stages_register_test();
        run_display disp = {pb_open(stderr, PB_AUTO), j.stages, ""};
        if (disp.pb)
            job_set_observer(on_job, &disp);
        int jr = job_run(st, as, out, j.id, err, sizeof err);
        job_set_observer(NULL, NULL);
        store_job fin;
        int have_fin = store_job_get(st, j.id, &fin) == 0;
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
        if (have_fin) {
            json_t *arts = json_array();
            store_artifact *a = NULL;
            int n = 0;
            if (store_artifact_list(st, j.id, &a, &n) == 0) {
                for (int i = 0; i < n; i++) {
                    char blob[PATH_MAX], dst[PATH_MAX + 300];
                    snprintf(dst, sizeof dst, "%s/%s", out, a[i].name);
                    unlink(dst);
                    if (art_path(as, a[i].sha256, blob, sizeof blob) == 0 && link(blob, dst) == 0)
                        json_array_append_new(arts, json_string(dst));
                }
                free(a);
            }
            json_t *o = json_pack("{s:s,s:s,s:s,s:o,s:o,s:O}", "id", fin.id, "status", fin.status, "stage", fin.stage,
                                  "error", fin.error_code[0] ? json_pack("{s:s,s:s}", "code", fin.error_code, "message", fin.error_message) : json_null(),
                                  "artifacts", arts, "report", fin.report);
            char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
            if (text)
                printf("%s\n", text);
            free(text);
            json_decref(o);
            status = !strcmp(fin.status, "succeeded") ? 0 : 1;
            store_job_clear(&fin);
        }
    }
    store_job_clear(&j);
    art_close(as);
    store_close(st);
out:
    for (int i = 0; i < n_roots; i++)
        free(roots[i]);
    return status;
}
