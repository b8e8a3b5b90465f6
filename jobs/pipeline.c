/* jobs/pipeline.c — a job's stage list and the worker loop that runs it (pipeline.h).
 * Every transition (stage started, stage done, terminal state) is one store transaction,
 * so a worker killed at any point leaves the job resumable at its first unfinished stage.
 * A transition the store cannot take (a PostgreSQL server restarting) is tried again for
 * a minute before the worker gives up. A stage's outputs are files in the job directory
 * of the host that ran it, marked done there (STAGE/.done); with a remote artifact store
 * they are also published as the artifact stage-outputs.STAGE.tar. A job resumed on
 * another host fetches the outputs of its finished stages from there, or, where none were
 * published, runs those stages again.
 */
#include "jobs/pipeline.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "jobs/job_ctx.h"
#include "jobs/report.h"
#include "jobs/retention.h"
#include "jobs/stage.h"
#include "storage/artstore.h"
#include "storage/fetch.h"
#include "storage/fileio.h"
#include "storage/tar.h"
#include "engine/clock.h"

json_t *job_pipeline_for(const char *kind, json_t *spec)
{
    json_t *list = json_array();
    if (!list)
        return NULL;
    json_t *test = json_object_get(spec, "x_test_pipeline");
    if (json_is_array(test)) {
        size_t i;
        json_t *v;
        json_array_foreach(test, i, v) json_array_append(list, v);
        return list;
    }
    if (!strcmp(kind, "calibration")) {
        json_array_append_new(list, json_string("calibrate"));
        return list;
    }
    json_t *tasks = json_object_get(json_object_get(spec, "evaluation"), "tasks");
    json_t *exp = json_object_get(spec, "export");
    static const char *const all[] = {"load", "calibrate", "rank", "search", "prune",
                                      "distill", "evaluate", "measure", "export"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (!strcmp(all[i], "evaluate") && json_is_array(tasks) && json_array_size(tasks) == 0)
            continue;
        if (!strcmp(all[i], "export") && json_is_array(exp) && json_array_size(exp) == 0)
            continue;
        json_array_append_new(list, json_string(all[i]));
    }
    return list;
}

static int mkdir_one(const char *p)
{
    return mkdir(p, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

/* A stage's folder, made, or as an earlier attempt left it less the temporary files and
 * folders of writers that are gone (a runner killed mid-write: its exports, snapshots and
 * copies under fio_temp_name names), which nothing else would remove and a shared
 * stage's tar would carry. 0, or -1 when it cannot be made. */
static int stage_dir_ready(const char *dir)
{
    if (mkdir_one(dir) < 0)
        return -1;
    char **names;
    size_t n = 0;
    if (fio_list_dir(dir, &names, &n) < 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char p[4400];
        if (fio_temp_stale(names[i]) && fio_path_join(p, sizeof p, dir, names[i]) == 0 && fio_remove_tree(p) < 0)
            fprintf(stderr, "worker: cannot remove %s, left by an earlier attempt\n", p);
    }
    fio_names_free(names, n);
    return 0;
}

/* store_job_finish, tried again while the store is unavailable. 0, 1 (already terminal),
 * STORE_FENCED or -1. */
static int finish(store *st, const char *id, const char *status, const char *code, const char *message)
{
    int rc, tries = 0;
    while ((rc = store_job_finish(st, id, status, code, message)) < 0 && job_store_retry(&tries))
        ;
    if (rc == STORE_FENCED)
        fprintf(stderr, "worker: job %s is no longer running at this worker's attempt (its lease ran out); "
                "not recorded as %s\n", id, status);
    return rc;
}

/* The job is no longer running at this worker's attempt: its runner's lease ran out and
 * the job went back to the queue (and perhaps to another runner) or was settled. Said in
 * the worker's log; nothing is written to the job, which is no longer this worker's. */
static void say_lost(const job_ctx *ctx)
{
    fprintf(stderr, "worker: job %s is no longer running at this worker's attempt (its lease ran out); "
            "stopping during stage %s without writing to it\n", ctx->id, ctx->stage[0] ? ctx->stage : "-");
}

/* Record the end of a run that stopped early: cancelled, or back to the queue when a
 * shutdown (not a cancel) stopped it; nothing when the job is no longer this worker's. */
static int finish_stopped(job_ctx *ctx, store *st, const char *id, const char *stage)
{
    if (ctx->lost) {
        say_lost(ctx);
        return 0;
    }
    if (job_ctx_stop_requested() && !job_ctx_cancel_requested() && store_job_cancel_requested(st, id) != 1) {
        char why[160];
        snprintf(why, sizeof why, "worker stopped by server shutdown during stage %s; will resume", stage);
        return store_job_requeue(st, id, why) < 0 ? -1 : 0;
    }
    return finish(st, id, "cancelled", NULL, NULL) < 0 ? -1 : 0;
}

/* With a remote artifact store: publish the finished stage's folder (ctx->stage_dir, its
 * .done marker included, its resume folders not) as artifact stage-outputs.STAGE.tar, for
 * a host that takes the job over. A failure costs only that stage's rerun there: it is an
 * event, not an error. */
static void share_stage(job_ctx *ctx, const char *name)
{
    if (!art_has_remote(ctx->as))
        return;
    char path[sizeof ctx->job_dir + 80], art[80], err[1024] = "";
    snprintf(path, sizeof path, "%s/.%s.outputs.tar", ctx->job_dir, name);
    snprintf(art, sizeof art, "stage-outputs.%s.tar", name);
    tar_writer *t = tar_open(path, 0, err, sizeof err);
    int ok = t != NULL;
    if (ok && tar_add_all(t, name, ctx->stage_dir, stage_resume_folders, err, sizeof err) < 0) {
        tar_abort(t);
        ok = 0;
    }
    ok = ok && tar_close(t, err, sizeof err) == 0 && job_publish(ctx, art, path, "application/x-tar", err, sizeof err) == 0;
    unlink(path);
    if (!ok)
        job_event(ctx, "stage.outputs_unshared", err, json_pack("{s:s}", "stage", name));
}

/* A stage recorded finished never runs again here (its .done marker is there): what it kept
 * only to resume goes. A folder that cannot be removed only takes room: an event says so. */
static void drop_resume_folders(job_ctx *ctx)
{
    for (int i = 0; stage_resume_folders[i]; i++) {
        char p[sizeof ctx->stage_dir + 64];
        snprintf(p, sizeof p, "%s/%s", ctx->stage_dir, stage_resume_folders[i]);
        if (fio_is_dir(p) && fio_remove_tree(p) < 0) {
            char msg[sizeof p + 128];
            snprintf(msg, sizeof msg, "could not remove %s: %s", p, strerror(errno));
            job_event(ctx, "stage.scratch_kept", msg, NULL);
        }
    }
}

/* The outputs of finished stage `name`, published by the host that ran it (share_stage),
 * unpacked into this job directory, done. 0, or -1 when none were published or they
 * cannot be had (said in an event): the stage then runs again here. */
static int fetch_stage(job_ctx *ctx, const char *name)
{
    store_artifact a;
    char art[80], err[1024] = "", tmp[sizeof ctx->job_dir + 80], dir[sizeof ctx->job_dir + 80];
    char got[sizeof tmp + 80];
    snprintf(art, sizeof art, "stage-outputs.%s.tar", name);
    if (!art_has_remote(ctx->as) || store_artifact_get(ctx->st, ctx->id, art, &a) != 0)
        return -1;
    snprintf(tmp, sizeof tmp, "%s/.%s.fetch", ctx->job_dir, name);
    snprintf(dir, sizeof dir, "%s/%s", ctx->job_dir, name);
    snprintf(got, sizeof got, "%s/%s", tmp, name);
    int fd = -1, rc = -1;
    if (fio_remove_tree(tmp) < 0 || mkdir(tmp, 0755) < 0)
        snprintf(err, sizeof err, "%.900s: %s", tmp, strerror(errno));
    else if ((fd = art_open_blob(ctx->as, a.sha256, a.size_bytes, 1, err, sizeof err)) >= 0 &&
             tar_extract(fd, tmp, err, sizeof err) == 0) {
        if (fio_remove_tree(dir) < 0 || rename(got, dir) < 0 || fio_fsync_dir(ctx->job_dir) < 0)
            snprintf(err, sizeof err, "%.900s: %s", dir, strerror(errno));
        else
            rc = 0;
    }
    if (fd >= 0)
        close(fd);
    (void)fio_remove_tree(tmp);
    char msg[1400];
    if (rc == 0)
        snprintf(msg, sizeof msg, "the outputs of stage %s came from the host that ran it (%s)", name, art);
    else
        snprintf(msg, sizeof msg, "the outputs of stage %s could not be fetched (%s): running it again", name, err);
    job_event(ctx, rc == 0 ? "job.stage_fetched" : "job.stage_unfetched", msg,
              json_pack("{s:s,s:s,s:I}", "stage", name, "sha256", a.sha256, "size_bytes", (json_int_t)a.size_bytes));
    return rc;
}

/* A model registered by URL is read from this host's own copy, DATA/models/SHA/FILE as
 * the fetcher lays it out: on the host whose server fetched it that is the fetched file;
 * a worker agent elsewhere takes it from the artifact store (where the fetcher put it)
 * the first time. This run's spec then names that copy. 0, or -1 with err. */
static int localize_model(job_ctx *ctx, const char *data_dir, char *err, size_t errlen)
{
    json_t *mj = json_object_get(ctx->spec, "model");
    const char *id = json_string_value(json_object_get(mj, "id"));
    const char *path = json_string_value(json_object_get(mj, "path"));
    if (!id || !path)
        return 0;   /* a model by path: every host reads it there */
    store_model *m = malloc(sizeof *m);
    int got, tries = 0;
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    while ((got = store_model_get(ctx->st, id, m)) < 0 && job_store_retry(&tries))
        ;
    if (got < 0) {
        snprintf(err, errlen, "model %s: the model registry could not be read", id);
        ctx->store_down = 1;
        free(m);
        return -1;
    }
    if (got != 0 || !m->url[0] || !m->sha256[0]) {
        free(m);
        return 0;   /* registered by path, or an id the spec check already judged */
    }
    const char *file = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    char local[4400], dir[4400], blob[4400], tmp[4500];
    snprintf(local, sizeof local, "%s/models/%s/%s", data_dir, m->sha256, file);
    fio_dir_of(local, dir, sizeof dir);
    int rc = 0;
    if (strcmp(local, path) && !fio_is_file(local)) {
        int fd = -1, out = -1;
        rc = -1;
        if (fio_temp_name(tmp, sizeof tmp, local)) {
            snprintf(err, errlen, "%.4300s: path too long", local);
        } else if (!art_has_remote(ctx->as)) {
            char shown[sizeof m->url + 64];
            fetch_url_shown(m->url, shown, sizeof shown);   /* a presigned URL's secret stays out of the job */
            snprintf(err, errlen, "model %s (%s) was fetched on the API's host into %s: this host has no copy, and "
                     "no shared artifact store (--artifacts s3://...) to take one from", id, shown, path);
        } else if ((fd = art_open_blob(ctx->as, m->sha256, m->bytes_total, 1, err, errlen)) >= 0) {
            /* the blob is here now, checked against its name: copied beside its final name, then renamed */
            if (art_path(ctx->as, m->sha256, blob, sizeof blob) == 0 && fio_mkdirs(dir) == 0 &&
                (out = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) >= 0 &&
                fio_copy_into(blob, out) == 0 && fsync(out) == 0)
                rc = 0;
            if ((out >= 0 && close(out) < 0) || (rc == 0 && rename(tmp, local) < 0))
                rc = -1;
            if (rc < 0) {
                snprintf(err, errlen, "copying model %s to %.3000s: %s", id, local, strerror(errno));
                unlink(tmp);
            }
            close(fd);
        }
        if (rc == 0) {
            char msg[600];
            snprintf(msg, sizeof msg, "model %s taken from the artifact store into this host's copy", id);
            job_event(ctx, "model.localized", msg,
                      json_pack("{s:s,s:s,s:s}", "model", id, "sha256", m->sha256, "path", local));
        }
    }
    if (rc == 0)
        json_object_set_new(mj, "path", json_string(local));
    free(m);
    return rc;
}

/* The first stage to run here: the job's first unfinished one, or an earlier finished
 * one whose outputs this host lacks (it ran elsewhere) and cannot fetch, announced with
 * an event. */
static size_t first_stage_here(job_ctx *ctx, const store_job *job)
{
    size_t start = (size_t)job->stage_index;
    for (size_t i = 0; i < start; i++) {
        const char *name = json_string_value(json_array_get(job->stages, i));
        char done[4200];
        snprintf(done, sizeof done, "%s/%s/.done", ctx->job_dir, name ? name : "?");
        if (!fio_is_file(done) && !(name && fetch_stage(ctx, name) == 0 && fio_is_file(done))) {
            char msg[300];
            snprintf(msg, sizeof msg, "the outputs of stage %s and after are not on this host (it ran elsewhere): "
                     "running again from it", name ? name : "?");
            job_event(ctx, "job.stages_rerun", msg, json_pack("{s:s,s:i,s:i}", "from", name ? name : "?", "index",
                                                              (int)i, "resume_at", (int)start));
            return i;
        }
    }
    return start;
}

/* Stage `name` failed with serr: the job fails, as disk_full when the data directory's disk
 * is (the stage's partial outputs then go, so that the store can record the failure),
 * else stage_failed. 0, or -1 when the store could not record it. */
static int fail_stage(job_ctx *ctx, store *st, const char *id, const char *name, const char *serr)
{
    char msg[1400], why[1024];
    long long avail = (long long)fio_free_bytes(ctx->job_dir);
    int full = strstr(serr, "No space left") != NULL || (avail >= 0 && avail < (1LL << 20));
    snprintf(why, sizeof why, "%s", serr[0] ? serr : "no reason given");
    job_ctx_unprefix(ctx, why);
    if (full) {
        (void)fio_remove_tree(ctx->stage_dir);
        snprintf(msg, sizeof msg, "stage %s failed: the data directory's disk is full (%lld bytes were free; lower "
                 "the retention cap or free space, then resubmit): %s", name, avail, why);
    } else {
        snprintf(msg, sizeof msg, "stage %s failed: %s", name, why);
    }
    return finish(st, id, "failed", full ? "disk_full" : "stage_failed", msg) < 0 ? -1 : 0;
}

/* store_job_rewind to stage `first`, tried again while the store is unavailable. */
static int rewind_to(store *st, const char *id, size_t first)
{
    int tries = 0, rc;
    while ((rc = store_job_rewind(st, id, (int)first)) < 0 && job_store_retry(&tries))
        ;
    return rc;
}

/* Apply the data dir's retention policy (if any), never touching job `id`. */
static void retain(job_ctx *ctx, const char *data_dir, const char *id)
{
    retention_policy rp;
    if (!retention_from_env(&rp))
        return;
    int removed = 0;
    char rerr[256] = "", msg[320];
    if (retention_enforce(ctx->st, ctx->as, data_dir, &rp, id, &removed, rerr, sizeof rerr) != 0)
        job_event(ctx, "retention.failed", rerr, NULL);
    else if (removed > 0) {
        snprintf(msg, sizeof msg, "retention removed %d finished job(s) from the data directory", removed);
        job_event(ctx, "retention", msg, json_pack("{s:i,s:I,s:I}", "removed", removed, "max_bytes",
                                                   (json_int_t)rp.max_bytes, "max_age_s", (json_int_t)rp.max_age_s));
    }
}

int job_run(store *st, artstore *as, const char *data_dir, const char *id, char *err, size_t errlen)
{
    store_job job;
    int rc = store_job_get(st, id, &job);
    if (rc != 0) {
        snprintf(err, errlen, rc == 1 ? "job %s does not exist" : "reading job %s failed", id);
        return -1;
    }
    if (strcmp(job.status, "running") != 0) {
        snprintf(err, errlen, "job %s is %s, not running", id, job.status);
        store_job_clear(&job);
        return -1;
    }
    /* this worker's writes land only while the job is running at the attempt it was
     * started for (the claim counted it) */
    store_fence_job(st, id, job.attempts);
    static job_ctx ctx; /* large; one per worker process */
    memset(&ctx, 0, sizeof ctx);
    ctx.st = st;
    ctx.as = as;
    ctx.spec = job.spec;
    snprintf(ctx.id, sizeof ctx.id, "%s", id);
    char jobs_dir[4096];
    snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", data_dir);
    snprintf(ctx.job_dir, sizeof ctx.job_dir, "%s/jobs/%s", data_dir, id);
    if (mkdir_one(data_dir) < 0 || mkdir_one(jobs_dir) < 0 || mkdir_one(ctx.job_dir) < 0) {
        snprintf(err, errlen, "%s: %s", ctx.job_dir, strerror(errno));
        store_job_finish(st, id, "failed", "internal", err);
        store_job_clear(&job);
        return 0;
    }
    int result = 0;
    char merr[4400] = "";
    if (localize_model(&ctx, data_dir, merr, sizeof merr) < 0) {
        result = ctx.store_down ? -1 : finish(st, id, "failed", "model_unavailable", merr) < 0 ? -1 : 0;
        if (ctx.store_down)
            snprintf(err, errlen, "%s", merr);
        store_job_clear(&job);
        return result;
    }
    retain(&ctx, data_dir, id);
    size_t n = json_array_size(job.stages), first = first_stage_here(&ctx, &job);
    const char *last = "";
    int rewound = first < (size_t)job.stage_index ? rewind_to(st, id, first) : 0;
    if (rewound != 0) {
        ctx.lost = rewound == STORE_FENCED;
        result = ctx.lost ? finish_stopped(&ctx, st, id, "") : -1;
        snprintf(err, errlen, "recording the rerun of the finished stages failed");
        goto out;
    }
    for (size_t i = first; i < n; i++) {
        const char *name = json_string_value(json_array_get(job.stages, i));
        last = name ? name : "?";
        if (job_cancelled(&ctx)) {
            result = finish_stopped(&ctx, st, id, last);
            goto out;
        }
        stage_fn fn = name ? stage_lookup(name) : NULL;
        if (!fn) {
            char msg[200];
            snprintf(msg, sizeof msg, "stage %s is not available in this build", last);
            result = finish(st, id, "failed", "stage_unavailable", msg) < 0 ? -1 : 0;
            goto out;
        }
        snprintf(ctx.stage, sizeof ctx.stage, "%s", name);
        snprintf(ctx.stage_dir, sizeof ctx.stage_dir, "%s/%s", ctx.job_dir, name);
        int tries = 0, rc_store;
        while ((rc_store = store_job_stage_begin(st, id, (int)i, name)) < 0 && job_store_retry(&tries))
            ;
        if (rc_store == STORE_FENCED) {
            ctx.lost = 1;
            result = finish_stopped(&ctx, st, id, name);
            goto out;
        }
        if (stage_dir_ready(ctx.stage_dir) < 0 || rc_store < 0) {
            result = -1;
            snprintf(err, errlen, "starting stage %s failed", name);
            goto out;
        }
        job_observe_stage(&ctx, "stage.started");
        char serr[1024] = "";
        double t0 = eng_wall_s();
        int r = fn(&ctx, serr, sizeof serr);
        double wall = eng_wall_s() - t0;
        if (r == 0) {
            char done[sizeof ctx.stage_dir + 8];
            snprintf(done, sizeof done, "%s/.done", ctx.stage_dir);
            tries = 0;
            if (fio_write_atomic(done, "", 0, serr, sizeof serr) < 0)   /* a resume here then runs it again */
                job_event(&ctx, "stage.unmarked", serr, NULL);
            share_stage(&ctx, name);
            while ((rc_store = store_job_stage_done(st, id, (int)i, name, wall)) < 0 && job_store_retry(&tries))
                ;
            if (rc_store == STORE_FENCED) {
                ctx.lost = 1;
                result = finish_stopped(&ctx, st, id, name);
                goto out;
            }
            if (rc_store < 0) {
                snprintf(err, errlen, "recording stage %s failed", name);
                result = -1;
                goto out;
            }
            job_observe_stage(&ctx, "stage.completed");
            drop_resume_folders(&ctx);
        } else if (ctx.store_down) {   /* not the stage's failure: the runner requeues the job */
            snprintf(err, errlen, "stage %s: the store was out of reach for a minute: %s", name, serr);
            result = -1;
            goto out;
        } else if (r == 1 || job_cancelled(&ctx) || ctx.lost) {
            /* a stage that fails once a cancel (or a shutdown) was asked for failed because
             * of it, e.g. a system call the stop signal interrupted (EINTR) */
            result = finish_stopped(&ctx, st, id, name);
            goto out;
        } else {
            result = fail_stage(&ctx, st, id, name, serr);
            goto out;
        }
    }
    if (!strcmp(job.kind, "job") && !json_object_get(job.spec, "x_test_pipeline")) {   /* its report is a product */
        char rerr[1024] = "";
        int assembled = job_report_finalize(&ctx, rerr, sizeof rerr);
        if (assembled != 0 && ctx.store_down) {
            snprintf(err, errlen, "assembling the report: the store was out of reach for a minute: %s", rerr);
            result = -1;
            goto out;
        } else if (assembled != 0) {
            char msg[1200];
            snprintf(msg, sizeof msg, "assembling the report failed: %s", rerr);
            result = finish(st, id, "failed", "stage_failed", msg) < 0 ? -1 : 0;
            goto out;
        }
    }
    /* the new artifacts may have crossed the cap: enforce it before the job is seen
     * finished, so a client that sees it succeeded sees the data dir within the cap */
    retain(&ctx, data_dir, id);
    result = finish(st, id, "succeeded", NULL, NULL) < 0 ? -1 : 0;
out:
    if (result < 0 && !err[0])
        snprintf(err, errlen, "store update failed during stage %s", last);
    job_ctx_free_state(&ctx);
    store_job_clear(&job);
    return result;
}
