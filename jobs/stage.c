/* jobs/stage.c — the stage registry and the job context stages run in (jobs/stage.h).
 * The registry is a fixed table filled before a worker runs; the context forwards
 * events, progress, artifacts and report fragments to the store, one transaction each.
 */
#include "jobs/stage.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "jobs/job_ctx.h"
#include "storage/fileio.h"
#include "jobs/pipeline.h"
#include "engine/clock.h"

#define MAX_STAGES 64

static struct {
    char name[48];
    stage_fn run;
} registry[MAX_STAGES];
static int n_registered;

int stage_register(const char *name, stage_fn run)
{
    if (!name || !run || strlen(name) >= sizeof registry[0].name)
        return -1;
    for (int i = 0; i < n_registered; i++)
        if (!strcmp(registry[i].name, name)) {
            registry[i].run = run;
            return 0;
        }
    if (n_registered == MAX_STAGES)
        return -1;
    snprintf(registry[n_registered].name, sizeof registry[0].name, "%s", name);
    registry[n_registered].run = run;
    n_registered++;
    return 0;
}

stage_fn stage_lookup(const char *name)
{
    for (int i = 0; i < n_registered; i++)
        if (!strcmp(registry[i].name, name))
            return registry[i].run;
    return NULL;
}

int stages_test_enabled(void)
{
    const char *v = getenv("AC_TEST_STAGES");
    return v && !strcmp(v, "1");
}

/* ---- signals ----------------------------------------------------------------------- */

static volatile sig_atomic_t sig_cancel, sig_stop;

void job_signal_cancel(void) { sig_cancel = 1; }
void job_signal_stop(void) { sig_stop = 1; }
int job_ctx_stop_requested(void) { return sig_stop != 0; }

/* ---- context ----------------------------------------------------------------------- */

const char *job_ctx_id(const job_ctx *ctx) { return ctx->id; }
json_t *job_ctx_spec(const job_ctx *ctx) { return ctx->spec; }
const char *job_ctx_dir(const job_ctx *ctx) { return ctx->job_dir; }
const char *job_ctx_stage_dir(const job_ctx *ctx) { return ctx->stage_dir; }

const char *job_ctx_output(job_ctx *ctx, const char *stage, const char *name)
{
    if (!stage || !name || strstr(stage, "..") || strstr(name, "..") || strchr(stage, '/'))
        return NULL;
    int n = snprintf(ctx->out_path, sizeof ctx->out_path, "%s/%s/%s", ctx->job_dir, stage, name);
    if (n < 0 || (size_t)n >= sizeof ctx->out_path || access(ctx->out_path, F_OK) != 0)
        return NULL;
    return ctx->out_path;
}

void job_ctx_set_state(job_ctx *ctx, const char *key, void *value, void (*free_fn)(void *))
{
    for (int i = 0; i < ctx->n_state; i++)
        if (!strcmp(ctx->state[i].key, key)) {
            if (ctx->state[i].free_fn && ctx->state[i].value != value)
                ctx->state[i].free_fn(ctx->state[i].value);
            ctx->state[i].value = value;
            ctx->state[i].free_fn = free_fn;
            return;
        }
    if (ctx->n_state == JOB_CTX_MAX_STATE || strlen(key) >= sizeof ctx->state[0].key) {
        fprintf(stderr, "job_ctx_set_state: no room for '%s'\n", key);
        if (free_fn)
            free_fn(value);
        return;
    }
    snprintf(ctx->state[ctx->n_state].key, sizeof ctx->state[0].key, "%s", key);
    ctx->state[ctx->n_state].value = value;
    ctx->state[ctx->n_state].free_fn = free_fn;
    ctx->n_state++;
}

void *job_ctx_get_state(job_ctx *ctx, const char *key)
{
    for (int i = 0; i < ctx->n_state; i++)
        if (!strcmp(ctx->state[i].key, key))
            return ctx->state[i].value;
    return NULL;
}

void job_ctx_free_state(job_ctx *ctx)
{
    for (int i = ctx->n_state - 1; i >= 0; i--)
        if (ctx->state[i].free_fn)
            ctx->state[i].free_fn(ctx->state[i].value);
    ctx->n_state = 0;
}

static job_observer_fn observer;
static void *observer_ud;

void job_set_observer(job_observer_fn fn, void *ud)
{
    observer = fn;
    observer_ud = ud;
}

void job_observe_stage(job_ctx *ctx, const char *type)
{
    if (observer)
        observer(observer_ud, ctx->stage, type, ctx->stage, -1, -1);
}

void job_ctx_unprefix(const job_ctx *ctx, char *s)
{
    char data[sizeof ctx->job_dir];
    snprintf(data, sizeof data, "%s", ctx->job_dir);   /* <data>/jobs/<id> */
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(data, '/');
        if (!slash || slash == data) {
            data[0] = 0;
            break;
        }
        *slash = 0;
    }
    fio_unprefix(s, ctx->job_dir);
    fio_unprefix(s, data);
}

int job_event(job_ctx *ctx, const char *type, const char *message, json_t *data)
{
    char *msg = strdup(message ? message : "");
    if (msg)
        job_ctx_unprefix(ctx, msg);
    int rc = store_event_append(ctx->st, ctx->id, type, msg ? msg : "", data);
    free(msg);
    json_decref(data);
    ctx->lost |= rc == STORE_FENCED;
    if (observer)
        observer(observer_ud, ctx->stage, type, message ? message : "", -1, -1);
    return rc;
}

int job_progress(job_ctx *ctx, int64_t step, int64_t total_steps)
{
    int rc = store_job_progress(ctx->st, ctx->id, step, total_steps);
    ctx->lost |= rc == STORE_FENCED;
    if (observer)
        observer(observer_ud, ctx->stage, NULL, NULL, step, total_steps);
    return rc;
}

int job_cancelled(job_ctx *ctx)
{
    if (sig_cancel || sig_stop || ctx->lost)
        return 1;
    /* The signal is the fast path; the store is the truth (also without a server). A job
     * no longer running at this attempt (its lease ran out) stops this worker as a cancel
     * would, and the worker's writes to it are fenced off (store_fence_job). */
    double now = eng_wall_s();
    if (now - ctx->last_cancel_check >= 0.25) {
        ctx->last_cancel_check = now;
        int w = store_job_watch(ctx->st, ctx->id);
        if (w == 1)
            sig_cancel = 1;
        else if (w == STORE_FENCED)
            ctx->lost = 1;
    }
    return sig_cancel != 0 || ctx->lost;
}

int job_cancelled_hook(void *ctx)
{
    return job_cancelled(ctx);
}

int job_ctx_cancel_requested(void) { return sig_cancel != 0; }

int job_artifact_name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > 200 || name[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

int job_publish(job_ctx *ctx, const char *name, const char *path, const char *content_type,
                char *err, size_t errlen)
{
    if (!job_artifact_name_ok(name)) {
        snprintf(err, errlen, "invalid artifact name '%s' (use [A-Za-z0-9._-], not starting with '.')",
                 name ? name : "");
        return -1;
    }
    store_artifact a;
    memset(&a, 0, sizeof a);
    snprintf(a.job_id, sizeof a.job_id, "%s", ctx->id);
    snprintf(a.name, sizeof a.name, "%s", name);
    snprintf(a.stage, sizeof a.stage, "%s", ctx->stage);
    snprintf(a.content_type, sizeof a.content_type, "%s",
             content_type ? content_type : "application/octet-stream");
    int rc = store_artifact_publish(ctx->st, ctx->as, path, &a, err, errlen);
    ctx->lost |= rc == STORE_FENCED;
    return rc == 0 ? 0 : -1;
}

const char *const stage_resume_folders[] = {STAGE_DISTILL_CKPT, STAGE_PRUNE_RECON, NULL};

#define STORE_RETRIES 60

int job_store_retry(int *tries)
{
    if (++*tries > STORE_RETRIES || job_ctx_stop_requested())
        return 0;
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    return 1;
}

int job_report_merge(job_ctx *ctx, json_t *fragment)
{
    return job_report_replace(ctx, NULL, fragment);
}

int job_report_replace(job_ctx *ctx, const char *const *owned, json_t *fragment)
{
    if (!json_is_object(fragment)) {
        json_decref(fragment);
        return -1;
    }
    int rc, tries = 0;
    while ((rc = store_report_merge(ctx->st, ctx->id, owned, fragment)) < 0 && job_store_retry(&tries))
        ;
    ctx->store_down |= rc < 0 && !job_ctx_stop_requested();   /* a stop cut the retries short */
    json_decref(fragment);
    ctx->lost |= rc == STORE_FENCED;
    return rc == 0 ? 0 : -1;
}
