/* server/scrub.c — the periodic artifact scrub (scrub.h): one thread that sleeps on a
 * condition variable between passes, so a stop is prompt.
 */
#include "server/scrub.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/log.h"

struct scrubber {
    artstore *as;
    long interval_s;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
};

static void *run(void *arg)
{
    scrubber *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += s->interval_s;
        while (!s->stop && pthread_cond_timedwait(&s->cv, &s->mu, &until) != ETIMEDOUT)
            ;
        if (s->stop)
            break;
        pthread_mutex_unlock(&s->mu);
        int checked = 0, bad = 0;
        if (art_scrub(s->as, &checked, &bad) != 0)
            log_msg("error", "artifact scrub: the store could not be listed");
        else
            log_msg(bad ? "error" : "info", "artifact scrub: %d blobs re-hashed, %d no longer matched their "
                    "sha-256 and were set aside", checked, bad);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

scrubber *scrub_start(artstore *as, long interval_s, char *err, size_t errlen)
{
    err[0] = 0;
    if (interval_s <= 0)
        return NULL;
    scrubber *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->as = as;
    s->interval_s = interval_s;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int rc = pthread_create(&s->th, NULL, run, s);
    if (rc) {
        snprintf(err, errlen, "artifact scrub thread: %s", strerror(rc));
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return NULL;
    }
    return s;
}

void scrub_stop(scrubber *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
