/* jobs/job_ctx.h — the job context's layout, private to jobs/ (stages see only the
 * accessors in jobs/stage.h). One context lives for one worker run of one job.
 */
#ifndef AC_JOBS_JOB_CTX_H
#define AC_JOBS_JOB_CTX_H

#include <jansson.h>

#include "jobs/stage.h"
#include "storage/artstore.h"
#include "storage/store.h"

#define JOB_CTX_MAX_STATE 32

struct job_ctx {
    store *st;
    artstore *as;
    char id[48];
    json_t *spec;              /* borrowed from the job row for the run */
    char job_dir[4096];
    char stage_dir[4200];
    char stage[48];
    char out_path[4400];       /* buffer behind job_ctx_output's answer */
    double last_cancel_check;  /* monotonic s */
    int lost;                  /* the job is no longer running at this worker's attempt */
    int store_down;            /* a store write or read failed for a minute: the worker exits
                                  unfinished and its runner requeues the job (the job is not
                                  failed for the store's outage) */
    struct {
        char key[64];
        void *value;
        void (*free_fn)(void *);
    } state[JOB_CTX_MAX_STATE];
    int n_state;
};

/* Free every shared state value (reverse order of setting). */
void job_ctx_free_state(job_ctx *ctx);
/* 1 once a shutdown stop was signalled (SIGTERM), 1 once a cancel was seen. */
int job_ctx_stop_requested(void);
int job_ctx_cancel_requested(void);

#endif
