/* storage/store.h — the durable job store: jobs (and calibrations, which are jobs of
 * kind "calibration"), events, artifact metadata, idempotency keys and registered models.
 * Two backends behind this one interface: SQLite in WAL mode (synchronous=FULL), a file
 * under the data directory (the default), and PostgreSQL (a postgresql:// URI), which
 * workers on other hosts share. Every state change is one transaction, so a job is always
 * in exactly one durable state; a terminal state also queues its webhook (outbox) in that
 * transaction. Schema changes are numbered migrations, the same in both dialects, applied
 * at open. Thread-safe: each thread gets its own connection; several processes (server
 * and workers) share the database.
 */
#ifndef AC_STORAGE_STORE_H
#define AC_STORAGE_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

typedef struct store store;

/* One job row. json members are NEW references owned by the struct (store_job_clear). */
typedef struct {
    int64_t seq;                 /* insertion order (list cursor) */
    char id[48];                 /* "job_..." or "cal_..." */
    char kind[16];               /* "job" | "calibration" */
    char status[16];             /* queued | running | succeeded | failed | cancelled */
    char device[32];
    char name[132];
    json_t *spec;                /* validated, normalized spec */
    json_t *stages;              /* array of stage names, in order */
    int stage_index;             /* first stage not done */
    char stage[48];              /* current (or last) stage; "" before the first */
    int64_t step, total_steps;   /* progress of `stage` */
    char error_code[48];         /* "" unless failed */
    char error_message[1024];
    json_t *report;              /* object merged by stages */
    int cancel_requested;
    int worker_pid;              /* 0 when no worker */
    int attempts;                /* times a worker was started */
    int64_t version;             /* bumps on every change: the ETag */
    int64_t created_at, started_at, finished_at, updated_at; /* Unix s, 0 = unset */
    char engine[16];             /* the target's serving engine: "autocompress" | "llama.cpp" */
    char lease_owner[256];       /* the runner holding a running job ("" otherwise) */
    int64_t lease_expires_at;    /* Unix s its lease runs out; 0 = none */
} store_job;

/* Who claims a job and for how long (store_job_claim). */
typedef struct {
    const char *device;          /* the device the job targets ("cpu", "cuda:0") */
    int has_llamacpp;            /* 1: this runner can also run llama.cpp-target jobs */
    const char *owner;           /* the runner: "serve/HOST/DATA_DIR" or "worker/HOST/DATA_DIR" */
    int lease_s;                 /* the lease it holds, renewed by store_lease_renew */
} store_claim;

typedef struct {
    int64_t seq;
    char id[32];                 /* "evt_<seq>" */
    char job_id[48];
    char type[64];
    char *message;               /* malloc'd */
    json_t *data;                /* NEW ref or NULL */
    int64_t created_at;
} store_event;

typedef struct {
    char id[48];                 /* "art_..." */
    char job_id[48];
    char name[256];
    char stage[48];
    char sha256[65];             /* hex */
    int64_t size_bytes;
    char content_type[128];
    int64_t created_at;
} store_artifact;

typedef struct {
    int64_t seq;
    char id[48];                 /* "mdl_..." */
    char path[4096];             /* resolved server path (for a URL model: its cache path) */
    char tokenizer[4096];        /* "" when none */
    char name[132];
    char format[16];             /* "hf" | "gguf" | "llama2c" */
    int64_t created_at;
    /* registration by URL (storage/fetch.h); a path-registered model is "ready" with "" */
    char status[12];             /* "fetching" | "ready" | "failed"; "" on add = "ready" */
    char url[2100];
    char sha256[65];             /* expected digest, lowercase hex */
    int64_t size_bytes;          /* declared size (a download larger fails); -1 none */
    int64_t bytes_done;          /* downloaded so far */
    int64_t bytes_total;         /* expected total; -1 unknown */
    char error[1024];            /* why it failed; "" otherwise */
    int64_t updated_at;
} store_model;

/* Open the store at target: a PostgreSQL URI (postgresql://... or postgres://..., libpq's
 * form; the database must exist) or else an SQLite file (created if needed, WAL set).
 * Applies the migrations the database lacks. Returns a new store (store_close), or NULL
 * with a reason in err (a URI's password never appears in it). */
store *store_open(const char *target, char *err, size_t errlen);
/* target as logs may show it: a URI's password replaced by "***", into out (n bytes). */
void store_target_for_logs(const char *target, char *out, size_t n);
/* "sqlite" or "postgresql". */
const char *store_backend(store *st);
/* Close every connection this store opened in this process. */
void store_close(store *st);
/* The schema version after migrations (the number of the last migration applied). */
int store_schema_version(store *st);

/* A fresh id: prefix + 24 random hex digits, into out (>= 32 bytes). Returns 0 or -1. */
int store_new_id(const char *prefix, char *out, size_t outlen);
/* Unix seconds now. */
int64_t store_now(void);

void store_job_clear(store_job *j);
void store_event_clear(store_event *e);

/* Insert job j (id, kind, status "queued", device, name, spec, stages set by the caller;
 * created_at kept when set, else now; version set here) with a "job.created" event, and — when idem_key is non-NULL
 * — the idempotency record (scope, key, body sha-256, response status and text) in the
 * same transaction. Returns 0; 1 when the idempotency key already exists (nothing
 * inserted; read it with store_idem_get); -1 with err on failure. */
int store_job_create(store *st, store_job *j, const char *idem_scope, const char *idem_key,
                     const char *body_sha256, int resp_status, const char *resp_text,
                     char *err, size_t errlen);
/* Look up an idempotency record. Returns 0 and fills the outputs (*resp_text malloc'd,
 * caller frees), 1 when absent, -1 on error. */
int store_idem_get(store *st, const char *scope, const char *key, char sha256_out[65],
                   int *resp_status, char **resp_text);

/* Read a job. Returns 0 (out filled; store_job_clear it), 1 when absent, -1 on error. */
int store_job_get(store *st, const char *id, store_job *out);
/* A cheap read of version and status (for ETags and long-polls). 0, 1 absent, -1 error. */
int store_job_version(store *st, const char *id, int64_t *version, char status[16]);
/* List jobs of `kind`, newest first, strictly after the job `after` (NULL: from the
 * newest), at most `limit`. Returns 0 with *out (malloc'd array of n jobs; free each with
 * store_job_clear then free the array) and *has_more; 1 when `after` does not exist;
 * -1 on error. */
int store_job_list(store *st, const char *kind, const char *after, int limit,
                   store_job **out, int *n, int *has_more);
void store_job_list_free(store_job *jobs, int n);

/* Scheduler: atomically move the oldest queued job on cl->device whose engine this runner
 * has to running (attempts+1, started_at, the runner's lease, "job.started" event). Two
 * runners never claim one job (PostgreSQL: FOR UPDATE SKIP LOCKED; SQLite: the write
 * lock). Returns 0 with the job in out, 1 when none is queued, -1 on error. */
int store_job_claim(store *st, const store_claim *cl, store_job *out);
/* Renew the lease of every job `owner` is running, to lease_s from now. Returns how many
 * jobs it holds, or -1. */
int store_lease_renew(store *st, const char *owner, int lease_s);
/* The rescuer: every running job whose lease ran out (its runner died or lost the
 * database) is settled as store_recover settles them, failing with code lease_expired
 * when its starts are spent. Jobs leased by `self` (the caller's runner) are left alone:
 * a live runner settles its own workers' jobs, and after a store outage longer than the
 * lease it renews them rather than requeue jobs its workers are still running. A lease
 * renewed between the rescuer's read and its write holds. Returns how many changed, or
 * -1. */
int store_lease_rescue(store *st, int max_attempts, const char *self);
/* Fencing a worker. A worker runs one attempt of one job: the `attempts` its runner's
 * claim left. When that runner loses the lease (it stopped renewing; the store was out of
 * its reach) the job is requeued and perhaps claimed again, by another runner or the
 * same, and the old attempt's worker may still be running. After store_fence_job(st, id,
 * attempt), every write this handle makes to job id — stage begin and done, progress,
 * report, events, artifacts, finish, requeue — lands only while the job is running at
 * that attempt; otherwise it changes nothing and returns STORE_FENCED. Set once, before
 * the handle is used by other threads. */
#define STORE_FENCED 2
void store_fence_job(store *st, const char *id, int attempt);
/* A worker's look at its running job, in one query: 1 when a cancel was asked for it;
 * else STORE_FENCED once the handle's fence on it no longer holds (the job is not
 * running at the fenced attempt); else 0 (also with no fence); -1 on error. */
int store_job_watch(store *st, const char *id);
/* Record the worker's pid on a running job. Returns 0 or -1. */
int store_job_set_pid(store *st, const char *id, int pid);
/* Worker: stage number `index` (name) begins: sets stage and progress 0/0, event
 * "stage.started". Returns 0, STORE_FENCED or -1. */
int store_job_stage_begin(store *st, const char *id, int index, const char *name);
/* Worker: this host runs the finished stages from `index` on again (their outputs ran
 * elsewhere and cannot be had here): stage_index goes back to index, so that the job's
 * progress is what this run has done, and a host taking the job over next resumes from
 * there rather than mix these outputs with the first run's. Returns 0 (also when
 * stage_index was not above index), STORE_FENCED or -1. */
int store_job_rewind(store *st, const char *id, int index);
/* Progress of the current stage (no event). Returns 0, STORE_FENCED or -1. */
int store_job_progress(store *st, const char *id, int64_t step, int64_t total);
/* Stage number `index` finished: stage_index = index+1, report.stages gets
 * {name, wall_s, attempt}, event "stage.completed". Returns 0, STORE_FENCED or -1. */
int store_job_stage_done(store *st, const char *id, int index, const char *name, double wall_s);
/* Move a non-terminal job to a terminal status ("succeeded", "failed", "cancelled") with
 * an optional error (code, message may be NULL) and event "job.<status>". Returns 0;
 * 1 when the job was already terminal (unchanged); STORE_FENCED; -1 on error. */
int store_job_finish(store *st, const char *id, const char *status, const char *code,
                     const char *message);
/* Put a running job back in the queue (worker gone without a terminal state: server
 * restart or shutdown), keeping stage_index so it resumes at the first unfinished stage;
 * event "job.requeued" with `reason`. Returns 0, 1 when not running, STORE_FENCED, -1 on
 * error. */
int store_job_requeue(store *st, const char *id, const char *reason);
/* store_job_finish and store_job_requeue of attempt `attempt` only (0: any): STORE_FENCED
 * when the job is no longer running at it. A runner settling a worker it started passes
 * the attempt it read, so that a job another runner has claimed since is left alone. */
int store_job_finish_at(store *st, const char *id, int attempt, const char *status, const char *code,
                        const char *message);
int store_job_requeue_at(store *st, const char *id, int attempt, const char *reason);
/* At a runner's start, every job it (owner: the same name as its claims) left running
 * when it died, and any left without a lease by an older server: a pending cancel is
 * finished, a job that has had max_attempts worker starts fails (code server_lost), the
 * rest are requeued to resume at their stage. Jobs other runners hold are left to their
 * leases. Returns how many were handled, or -1. */
int store_recover(store *st, const char *owner, int max_attempts);
/* Cancel: a queued job becomes cancelled at once; a running one gets cancel_requested
 * (event "job.cancel_requested"); a terminal one is unchanged. Returns 0 (out filled
 * with the job afterwards), 1 when absent, -1 on error. */
int store_job_cancel(store *st, const char *id, store_job *out);
/* A runner's cheap look at its job: status, lease owner, whether a cancel was asked and
 * how many starts it has had (the attempt of its latest claim). 0, 1 absent, -1 error. */
int store_job_runner(store *st, const char *id, char status[16], char owner[256], int *cancel_requested,
                     int *attempts);
/* 1 when cancellation was requested for job id, 0 when not, -1 on error. */
int store_job_cancel_requested(store *st, const char *id);
/* Delete a terminal job with its events, artifacts and idempotency records. The sha-256
 * of each artifact no other job references is appended to *orphans (a malloc'd array of
 * malloc'd strings; caller frees). Returns 0, 1 absent, 2 not terminal, -1 error. */
int store_job_delete(store *st, const char *id, char ***orphans, int *n_orphans);
/* Merge `fragment` (borrowed object) into the job's report, recursively, after deleting
 * the members at the dotted paths of `clear` (NULL-terminated; NULL: none), in one
 * transaction: a stage run again replaces what it wrote before rather than leave members
 * its new run did not write. 0, STORE_FENCED or -1. */
int store_report_merge(store *st, const char *id, const char *const *clear, json_t *fragment);
/* Count jobs per status into out[5] (queued, running, succeeded, failed, cancelled). */
int store_job_counts(store *st, int64_t out[5]);

/* Append an event (data borrowed, may be NULL). Returns 0, STORE_FENCED or -1. */
int store_event_append(store *st, const char *job_id, const char *type, const char *message,
                       json_t *data);
/* Events of a job with seq > after_seq, oldest first, at most limit. Returns 0 with
 * *out (malloc'd; store_event_clear each, then free) and *has_more, or -1. */
int store_event_list(store *st, const char *job_id, int64_t after_seq, int limit,
                     store_event **out, int *n, int *has_more);
void store_event_list_free(store_event *ev, int n);

/* Record an artifact (replacing one of the same name on that job) with event
 * "artifact.published" in one transaction. a->id is assigned here. Returns 0,
 * STORE_FENCED or -1. */
int store_artifact_add(store *st, store_artifact *a);

struct artstore;
/* Publish the file src as a's bytes: into as (art_put, which fills a->sha256 and
 * a->size_bytes; the copy outside any lock), then, under as's publish lock held shared, the
 * blob made sure of (put again if a delete took it meanwhile) and the row recorded
 * (store_artifact_add). 0, or -1 or STORE_FENCED with err. */
int store_artifact_publish(store *st, struct artstore *as, const char *src, store_artifact *a, char *err,
                           size_t errlen);
/* store_job_delete and the removal of the blobs it leaves unreferenced, under as's publish
 * lock held exclusive, so that no publisher records a row for a blob in between (its row
 * would point at nothing); the lock is waited for up to wait_s seconds (< 0: until held).
 * Returns 0, 1 absent, 2 not terminal, 3 the lock still held after wait_s, -1 with err. */
int store_job_remove(store *st, struct artstore *as, const char *id, double wait_s, char *err, size_t errlen);
/* 0 found (out filled), 1 absent, -1 error. */
int store_artifact_get(store *st, const char *job_id, const char *name, store_artifact *out);
/* All artifacts of a job, by name. 0 with *out malloc'd (free it), -1 on error. */
int store_artifact_list(store *st, const char *job_id, store_artifact **out, int *n);

/* Register a model (id, created_at, updated_at assigned here; status "" means "ready").
 * 0 or -1. */
int store_model_add(store *st, store_model *m);
/* Register a model to fetch by URL (status "fetching"; id and times assigned here) unless
 * a model with the same sha256 exists: then m is overwritten with that model, and when it
 * had failed it is first reset to "fetching" with m's url, name, tokenizer and
 * size_bytes (*restarted = 1). One transaction. Returns 0 (inserted), 1 (existing model
 * in m), -1 on error. */
int store_model_add_fetch(store *st, store_model *m, int *restarted);
/* The model registered with this sha256 (lowercase hex). 0 found, 1 absent, -1 error. */
int store_model_get_sha(store *st, const char *sha256_hex, store_model *out);
/* The next model in status "fetching" after the one registered as after_seq, in
 * registration order and round again from the oldest (after_seq 0: the oldest). 0 found
 * (out filled), 1 none, -1 error. */
int store_model_next_fetch(store *st, int64_t after_seq, store_model *out);
/* 1 when a model other than id is "fetching" (waiting for the fetcher), 0 when none, -1. */
int store_model_fetch_waiting(store *st, const char *id);
/* Download progress of a fetching model (no-op on other states). 0 or -1. */
int store_model_fetch_progress(store *st, const char *id, int64_t bytes_done, int64_t bytes_total);
/* End a fetch: status "ready" (bytes_done = bytes_total = bytes) or "failed" with error.
 * Only a model still "fetching" changes. Returns 0, 1 when it was not fetching, -1. */
int store_model_fetch_done(store *st, const char *id, const char *status, int64_t bytes,
                           const char *error);
/* 0 found, 1 absent, -1 error. */
int store_model_get(store *st, const char *id, store_model *out);
/* Newest first, after `after`; same contract as store_job_list (free the array). */
int store_model_list(store *st, const char *after, int limit, store_model **out, int *n,
                     int *has_more);

/* One pending webhook delivery (the outbox row). payload is malloc'd. */
typedef struct {
    char id[48];                 /* "msg_...": the webhook-id header */
    char job_id[48];
    char url[2100];
    char type[48];               /* "job.succeeded" | "job.failed" | "job.cancelled" */
    char *payload;
    int attempts;                /* deliveries tried so far */
} store_webhook;

/* Pending webhooks whose next attempt is due at `now`, oldest first, at most limit.
 * 0 with *out (free with store_webhook_list_free), -1 on error. store_job_finish adds
 * the rows (same transaction) for jobs whose spec has a callback_url. */
int store_webhook_due(store *st, int64_t now, int limit, store_webhook **out, int *n);
void store_webhook_list_free(store_webhook *w, int n);
/* Record one attempt: delivered, or failed for good (give_up), or retry at next_at.
 * Delivered/failed also append "webhook.delivered"/"webhook.failed" to the job's
 * events. 0 or -1. */
int store_webhook_result(store *st, const char *id, const char *job_id, int delivered, int give_up,
                         int64_t next_at, const char *error);

/* A runner writes its registry row at least this often (s), and one not seen for
 * STORE_RUNNER_FRESH_S is taken to be gone. */
#define STORE_RUNNER_BEAT_S 10
#define STORE_RUNNER_FRESH_S 60

/* The runners registry: each runner (a server that runs jobs, a worker agent) says what
 * it offers as a JSON object info (borrowed text: {"devices": [...], "engines": [...],
 * "workers_per_device": N}), when it starts and with each lease renewal. 0 or -1. */
int store_runner_beat(store *st, const char *name, const char *info);
/* A runner that stops removes its row. 0 or -1. */
int store_runner_gone(store *st, const char *name);
/* The runners seen after seen_after (Unix s), by name: a NEW array of {name, seen_at,
 * info}, or NULL on error. */
json_t *store_runners(store *st, int64_t seen_after);

/* A number that changes whenever another connection (any process) committed to the
 * database since this thread's previous call; used to wake long-polls. -1 on error. */
int64_t store_data_version(store *st);

#endif
