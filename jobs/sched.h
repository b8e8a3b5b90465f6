/* jobs/sched.h — the scheduler: a thread in a runner (the server, or a worker agent on
 * another host) that claims queued jobs for its devices and runs each in its own worker
 * process (`EXE worker --job ID --data-dir D`), at most `per_device` at a time per
 * device. It holds a lease on each job it runs and renews it while the worker lives; it
 * rescues jobs whose lease ran out (any runner's); it reaps workers and turns a worker
 * that died without recording an outcome into a requeued or failed job naming the signal
 * or exit status and the stage; and it passes cancels recorded in the store to its
 * workers. Workers die with their runner (PR_SET_PDEATHSIG), so a restarted runner can
 * requeue whatever it left running (store_recover), and another runner takes over a
 * dead one's jobs when their leases run out.
 */
#ifndef AC_JOBS_SCHED_H
#define AC_JOBS_SCHED_H

#include <stddef.h>

#include "storage/store.h"

typedef struct sched sched;

typedef struct {
    store *st;                 /* borrowed; outlives the scheduler */
    const char *exe;           /* the autocompress binary to exec for workers */
    const char *data_dir;      /* passed to workers */
    const char *const *devices;/* device names to schedule on */
    int n_devices;
    int per_device;            /* concurrent workers per device; 0 = claim nothing (an API-only server) */
    int cancel_kill_ms;        /* SIGKILL a worker this long after a cancel signal */
    int max_attempts;          /* worker starts per job: a worker that dies is requeued (resuming at
                                  its unfinished stage) until this many ran; 0 or 1 = fail at once */
    const char *owner;         /* the runner's name (srv_runner_name): its claims and leases */
    int lease_s;               /* lease on a running job; renewed every lease_s / 4 */
    int has_llamacpp;          /* claim llama.cpp-target jobs too */
    const char *info;          /* what the runner offers (store_runner_beat), registered while the
                                  scheduler runs; NULL: not registered (a server that runs no jobs) */
    int (*probe_llamacpp)(void);  /* while has_llamacpp is 0, asked again every probe_every_s (1: now
                                     it is; a helper installed after the start: from then on the
                                     runner's registry row offers llama.cpp too); NULL: never */
    double probe_every_s;      /* 0: every 10 s */
} sched_config;

/* Start the scheduler thread (the config's strings are copied). Returns a new scheduler,
 * or NULL with err. */
sched *sched_start(const sched_config *cfg, char *err, size_t errlen);
/* Wake the scheduler (a job was queued). Never blocks. */
void sched_notify(sched *s);
/* Deliver a cancel to the worker running job id (SIGUSR1). Returns 1 when a worker was
 * signalled, 0 when the job has no worker here. */
int sched_cancel(sched *s, const char *id);
/* Workers currently running. */
int sched_running(sched *s);
/* Halt: no new workers; SIGTERM running ones so they reach a durable state (a stage
 * boundary: requeued to resume), wait up to grace_ms, then SIGKILL the rest and requeue
 * their jobs; join the thread. s stays valid: sched_notify, sched_cancel and
 * sched_running may still be called (by requests still in flight) and do nothing more.
 * A second halt is a no-op. */
void sched_halt(sched *s, int grace_ms);
/* sched_halt (when not halted yet), then free s: once nothing else can call it. */
void sched_stop(sched *s, int grace_ms);

/* "SIGKILL", "SIGSEGV", ... for a signal number ("signal N" otherwise) into buf. */
const char *sched_signal_name(int sig, char *buf, size_t len);

#endif
