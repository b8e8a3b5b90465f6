/* jobs/sched.c — the scheduler thread (sched.h). It polls every 50 ms (or when notified):
 * reap finished workers, escalate stale cancels, then claim queued jobs for free device
 * slots; every half second it reads its jobs' rows (a cancel recorded by another host's
 * API, a job another runner took over), renews its leases every lease_s / 4 and rescues
 * expired ones every second. Workers are forked with only async-signal-safe calls before
 * exec.
 */
#include "jobs/sched.h"
#include "compress/costmodel.h"
#include "engine/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CHILDREN 256

typedef struct {
    pid_t pid;
    char job_id[48];
    int device;
    int attempt;               /* the job's start this worker runs (store_job.attempts) */
    double cancel_at;          /* monotonic s of the cancel signal, 0 = none */
} child;

/* A worker that exited while the store could not record how: settled again later. */
typedef struct {
    child k;
    int status;
} exited;

struct sched {
    store *st;
    char *exe, *data_dir, *owner, *info;
    int lease_s, has_llamacpp, renew_failed;
    int (*probe_llamacpp)(void);
    double last_probe, probe_every_s;
    double last_renew, last_rescue, last_watch;
    char **devices;
    int n_devices, per_device, cancel_kill_ms, max_attempts;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int wake, stopping, exit_thread, halted;
    child kids[MAX_CHILDREN];
    int n_kids;
    exited unsettled[MAX_CHILDREN];   /* their jobs still "running" under this runner */
    int n_unsettled;
    double last_settle;
    pid_t server_pid;
};

const char *sched_signal_name(int sig, char *buf, size_t len)
{
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev)
        snprintf(buf, len, "SIG%s", abbrev);
    else
        snprintf(buf, len, "signal %d", sig);
    return buf;
}

/* Fork and exec a worker for job id; returns the pid or -1 (errno). Locked by caller. */
static pid_t spawn(sched *s, const char *id)
{
    char dir[4096], log[4200];
    snprintf(dir, sizeof dir, "%s/jobs/%s", s->data_dir, id);
    char jobs[4096];
    snprintf(jobs, sizeof jobs, "%s/jobs", s->data_dir);
    if ((mkdir(jobs, 0755) < 0 && errno != EEXIST) || (mkdir(dir, 0755) < 0 && errno != EEXIST))
        return -1;
    snprintf(log, sizeof log, "%s/worker.log", dir);
    int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logfd < 0)
        return -1;
    char *argv[] = {s->exe, "worker", "--job", (char *)id, "--data-dir", s->data_dir, NULL};
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* Child: async-signal-safe calls only until exec. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGPIPE, &dfl, NULL);
        setpgid(0, 0);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0)
            dup2(devnull, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        closefrom(3);
        execv(argv[0], argv);
        _exit(127);
    }
    int saved = errno;
    close(logfd);
    errno = saved;
    return pid;
}

/* Whether a job read as (status, owner, attempts) is still the start worker k was made
 * for: not once it went back to the queue, or runs under another runner or at another
 * attempt (claimed again since). A finished job still counts as k's: its worker may have
 * written the end itself and be on its way out. */
static int kid_owns(const sched *s, const child *k, const char *status, const char *owner, int attempts)
{
    if (!strcmp(status, "queued"))
        return 0;
    return strcmp(status, "running") || ((!owner[0] || !strcmp(owner, s->owner)) && attempts == k->attempt);
}

/* Record how worker k ended on its job: cancelled, requeued or failed (nothing when the
 * job is gone, or another runner's now). 0, or -1 when the store could not say or write
 * it: the job is still "running" under this runner, whose renewals keep its lease, and
 * must be settled again (settle_exited). */
static int on_exit_status(sched *s, const child *k, int status)
{
    store_job j;
    int got = store_job_get(s->st, k->job_id, &j);
    if (got != 0)
        return got < 0 ? -1 : 0;
    int rc = 0;
    /* a job another runner took over, or claimed again (our lease ran out), is settled by
     * the worker of that start */
    if (!strcmp(j.status, "running") && kid_owns(s, k, j.status, j.lease_owner, j.attempts)) {
        char reason[512], sig[32];
        const char *stage = j.stage[0] ? j.stage : "(before the first stage)";
        if (j.cancel_requested) {
            rc = store_job_finish_at(s->st, k->job_id, k->attempt, "cancelled", NULL, NULL);
        } else if (s->stopping) {
            rc = store_job_requeue_at(s->st, k->job_id, k->attempt,
                                      "worker stopped by server shutdown; will resume");
        } else {
            const char *code_name;
            if (WIFSIGNALED(status)) {
                snprintf(reason, sizeof reason, "worker killed by signal %d (%s) during stage %s",
                         WTERMSIG(status), sched_signal_name(WTERMSIG(status), sig, sizeof sig), stage);
                code_name = "worker_killed";
            } else {
                int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
                snprintf(reason, sizeof reason,
                         "worker exited with status %d without finishing the job, during stage %s (see jobs/%s/worker.log)",
                         code, stage, k->job_id);
                code_name = "worker_exited";
            }
            if (j.attempts < s->max_attempts) {
                char msg[700];
                snprintf(msg, sizeof msg, "%s; requeued to resume at stage %s (attempt %d of %d)", reason, stage,
                         j.attempts + 1, s->max_attempts);
                rc = store_job_requeue_at(s->st, k->job_id, k->attempt, msg);
            } else {
                rc = store_job_finish_at(s->st, k->job_id, k->attempt, "failed", code_name, reason);
            }
        }
    }
    store_job_clear(&j);
    return rc < 0 ? -1 : 0;   /* 1 and 2: the job was no longer ours to settle */
}

/* Keep k's exit for another try (the table is as large as the workers' own). Locked by
 * caller. */
static void keep_unsettled(sched *s, const child *k, int status)
{
    if (s->n_unsettled < MAX_CHILDREN)
        s->unsettled[s->n_unsettled++] = (exited){*k, status};
}

/* Every second, try again to settle the jobs of workers that exited while the store
 * failed. Locked by caller. */
static void settle_exited(sched *s)
{
    double now = eng_wall_s();
    if (s->n_unsettled == 0 || now - s->last_settle < 1.0)
        return;
    s->last_settle = now;
    for (int i = 0; i < s->n_unsettled;) {
        exited e = s->unsettled[i];
        pthread_mutex_unlock(&s->mu);
        int rc = on_exit_status(s, &e.k, e.status);
        pthread_mutex_lock(&s->mu);
        if (rc < 0) {
            i++;
            continue;
        }
        s->unsettled[i] = s->unsettled[--s->n_unsettled];
    }
}

/* Reap exited workers; locked by caller. */
static void reap(sched *s)
{
    for (int i = 0; i < s->n_kids;) {
        int status = 0;
        pid_t r = waitpid(s->kids[i].pid, &status, WNOHANG);
        if (r == s->kids[i].pid || (r < 0 && errno == ECHILD)) {
            child k = s->kids[i];
            s->kids[i] = s->kids[--s->n_kids];
            pthread_mutex_unlock(&s->mu);
            int rc = on_exit_status(s, &k, r < 0 ? 0 : status);
            pthread_mutex_lock(&s->mu);
            if (rc < 0)
                keep_unsettled(s, &k, r < 0 ? 0 : status);
            continue;
        }
        if (s->kids[i].cancel_at > 0 && eng_wall_s() - s->kids[i].cancel_at > s->cancel_kill_ms / 1000.0) {
            kill(-s->kids[i].pid, SIGKILL);
            kill(s->kids[i].pid, SIGKILL);
        }
        i++;
    }
}

/* The runner's registry row offers `engine` too, written now: other hosts' APIs sharing the
 * store then accept jobs in that engine for this runner's devices. Locked by caller. */
static void offer_engine(sched *s, const char *engine)
{
    json_t *info = s->info ? json_loads(s->info, 0, NULL) : NULL, *e;
    json_t *engines = json_object_get(info, "engines");
    size_t i;
    int have = 0;
    json_array_foreach(engines, i, e)
        have |= json_is_string(e) && !strcmp(json_string_value(e), engine);
    char *txt = NULL;
    if (json_is_array(engines) && !have && json_array_append_new(engines, json_string(engine)) == 0)
        txt = json_dumps(info, JSON_COMPACT);
    json_decref(info);
    if (!txt)
        return;   /* not registered, already offered, or out of memory: the next beat keeps the old row */
    free(s->info);
    s->info = txt;
    (void)store_runner_beat(s->st, s->owner, s->info);
}

static void claim(sched *s)
{
    /* llama.cpp installed after the start: the API accepts its jobs as soon as its helper
     * answers, so this runner takes them too rather than leave them queued, and says so in
     * the registry for the APIs on other hosts */
    if (!s->has_llamacpp && s->probe_llamacpp && eng_wall_s() - s->last_probe >= s->probe_every_s) {
        s->last_probe = eng_wall_s();
        s->has_llamacpp = s->probe_llamacpp();
        if (s->has_llamacpp)
            offer_engine(s, CM_ENGINE_LLAMACPP);
    }
    for (int d = 0; d < s->n_devices && !s->stopping && s->per_device > 0; d++) {
        for (;;) {
            int busy = 0;
            for (int i = 0; i < s->n_kids; i++)
                busy += s->kids[i].device == d;
            if (busy >= s->per_device || s->n_kids >= MAX_CHILDREN)
                break;
            store_job j;
            store_claim cl = {s->devices[d], s->has_llamacpp, s->owner, s->lease_s};
            int rc = store_job_claim(s->st, &cl, &j);
            if (rc != 0)
                break;
            pid_t pid = spawn(s, j.id);
            if (pid < 0) {
                char msg[256];
                snprintf(msg, sizeof msg, "could not start a worker process: %s", strerror(errno));
                store_job_finish(s->st, j.id, "failed", "worker_spawn", msg);
            } else {
                child *k = &s->kids[s->n_kids++];
                memset(k, 0, sizeof *k);
                k->pid = pid;
                k->device = d;
                k->attempt = j.attempts;
                snprintf(k->job_id, sizeof k->job_id, "%s", j.id);
                store_job_set_pid(s->st, j.id, (int)pid);
                /* A cancel that raced with the claim still reaches the worker. */
                if (store_job_cancel_requested(s->st, j.id) == 1) {
                    kill(pid, SIGUSR1);
                    k->cancel_at = eng_wall_s();
                }
            }
            store_job_clear(&j);
        }
    }
}

/* Read each worker's job: a cancel recorded in the store (perhaps by another host's API)
 * is signalled to the worker; a worker whose job is no longer this runner's start of it
 * (its lease ran out and the job was requeued, taken over, or claimed again, by this
 * runner too) is killed at once, so that no job runs twice. Locked by caller. */
static void watch(sched *s)
{
    for (int i = 0; i < s->n_kids; i++) {
        child *k = &s->kids[i];
        char status[16], owner[256];
        int cancel = 0, attempts = 0;
        if (store_job_runner(s->st, k->job_id, status, owner, &cancel, &attempts) != 0)
            continue;
        int lost = !kid_owns(s, k, status, owner, attempts);
        if (lost) {
            kill(-k->pid, SIGKILL);
            kill(k->pid, SIGKILL);
        } else if (cancel && k->cancel_at == 0 && !strcmp(status, "running")) {
            kill(k->pid, SIGUSR1);
            k->cancel_at = eng_wall_s();
        }
    }
}

/* Leases: renew this runner's (and its row in the runners registry), watch its workers,
 * rescue any runner's that ran out. Locked by caller. */
static void leases(sched *s)
{
    double now = eng_wall_s();
    double period = s->lease_s / 4.0 < STORE_RUNNER_BEAT_S ? s->lease_s / 4.0 : STORE_RUNNER_BEAT_S;
    /* a renew that failed (the store down) is tried again every half second, so that the
     * leases are fresh as soon as the store is back */
    if (now - s->last_renew >= (s->renew_failed ? 0.5 : period)) {
        s->last_renew = now;
        s->renew_failed = s->n_kids > 0 && store_lease_renew(s->st, s->owner, s->lease_s) < 0;
        if (s->info)
            (void)store_runner_beat(s->st, s->owner, s->info);
    }
    if (s->n_kids > 0 && now - s->last_watch >= 0.5) {
        s->last_watch = now;
        watch(s);
    }
    if (now - s->last_rescue >= 1.0 && !s->stopping) {
        s->last_rescue = now;
        int n = store_lease_rescue(s->st, s->max_attempts, s->owner);
        if (n > 0)
            s->wake = 1;   /* requeued jobs may be ours to claim */
    }
}

static void *loop(void *arg)
{
    sched *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->exit_thread) {
        reap(s);
        settle_exited(s);
        leases(s);
        claim(s);
        if (!s->wake) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        s->wake = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

sched *sched_start(const sched_config *cfg, char *err, size_t errlen)
{
    sched *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->st = cfg->st;
    s->exe = strdup(cfg->exe);
    s->data_dir = strdup(cfg->data_dir);
    s->owner = strdup(cfg->owner ? cfg->owner : "serve");
    s->info = cfg->info ? strdup(cfg->info) : NULL;
    s->lease_s = cfg->lease_s >= 2 ? cfg->lease_s : 30;
    s->has_llamacpp = cfg->has_llamacpp;
    s->probe_llamacpp = cfg->probe_llamacpp;
    s->last_probe = eng_wall_s();
    s->probe_every_s = cfg->probe_every_s > 0 ? cfg->probe_every_s : 10.0;
    s->n_devices = cfg->n_devices;
    s->per_device = cfg->per_device > 0 ? cfg->per_device : 0;
    s->cancel_kill_ms = cfg->cancel_kill_ms > 0 ? cfg->cancel_kill_ms : 10000;
    s->max_attempts = cfg->max_attempts > 1 ? cfg->max_attempts : 1;
    s->devices = calloc((size_t)cfg->n_devices + 1, sizeof *s->devices);
    int ok = s->exe && s->data_dir && s->owner && s->devices && (s->info || !cfg->info);
    for (int i = 0; ok && i < cfg->n_devices; i++)
        ok = (s->devices[i] = strdup(cfg->devices[i])) != NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->server_pid = getpid();
    if (!ok || pthread_create(&s->thread, NULL, loop, s) != 0) {
        snprintf(err, errlen, "cannot start the scheduler");
        for (int i = 0; s->devices && i < s->n_devices; i++)
            free(s->devices[i]);
        free(s->devices);
        free(s->exe);
        free(s->data_dir);
        free(s->owner);
        free(s->info);
        free(s);
        return NULL;
    }
    return s;
}

void sched_notify(sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->wake = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int sched_cancel(sched *s, const char *id)
{
    int hit = 0;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_kids; i++)
        if (!strcmp(s->kids[i].job_id, id)) {
            kill(s->kids[i].pid, SIGUSR1);
            if (s->kids[i].cancel_at == 0)
                s->kids[i].cancel_at = eng_wall_s();
            hit = 1;
        }
    pthread_mutex_unlock(&s->mu);
    return hit;
}

int sched_running(sched *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n_kids;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void sched_halt(sched *s, int grace_ms)
{
    if (!s || s->halted)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    for (int i = 0; i < s->n_kids; i++)
        kill(s->kids[i].pid, SIGTERM);
    pthread_mutex_unlock(&s->mu);
    double t0 = eng_wall_s();
    while (sched_running(s) > 0 && (eng_wall_s() - t0) * 1000 < grace_ms) {
        sched_notify(s);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_kids; i++) {
        kill(-s->kids[i].pid, SIGKILL);
        kill(s->kids[i].pid, SIGKILL);
    }
    pthread_mutex_unlock(&s->mu);
    while (sched_running(s) > 0 && (eng_wall_s() - t0) * 1000 < grace_ms + 5000) {
        sched_notify(s);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&s->mu);
    s->exit_thread = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    if (s->info)   /* its row goes before its name does */
        (void)store_runner_gone(s->st, s->owner);
    s->halted = 1;
}

void sched_stop(sched *s, int grace_ms)
{
    if (!s)
        return;
    sched_halt(s, grace_ms);
    for (int i = 0; i < s->n_devices; i++)
        free(s->devices[i]);
    free(s->devices);
    free(s->exe);
    free(s->data_dir);
    free(s->owner);
    free(s->info);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
