/* storage/fetch_service.c — the model fetcher (see fetch.h): one thread that downloads
 * every model registered by URL in turn with fetch_url, checks that each opens as the
 * model its name says, puts it into a remote artifact store when there is one, and
 * records it ready or failed. It downloads one model at a time and polls the store once a
 * second; it never holds a store transaction while bytes arrive.
 */
#include "storage/fetch.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/clock.h"
#include "storage/artstore.h"
#include "storage/fileio.h"
#include "storage/modelio.h"

/* ---- the model fetcher ------------------------------------------------------------- */

struct fetch_service {
    store *st;
    artstore *as;        /* NULL, or where a ready model is also put when it is remote */
    unsigned flags;
    int64_t max_bytes;
    char *ca_file;       /* NULL: the system CA store */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, kicked;
    double turn_s;       /* how long one download runs while others wait (under mu) */
    /* the model being fetched (written by the fetcher thread only) */
    char id[48];
    int64_t last_seq;    /* its registration order: the next turn goes to the one after */
    double last_report, turn_start, last_wait_check;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static fetch_service *g_service;   /* the fetcher of this process, or NULL */

enum { FETCH_ATTEMPTS = 4 };
/* A download's turn: after this long it gives way to any other model waiting, keeping
 * its .part, and is resumed when its turn comes round again. A URL that drips bytes too
 * slowly to finish but fast enough never to stall then holds up nobody else. */
#define FETCH_TURN_S 120.0

static int stopping(fetch_service *fs)
{
    pthread_mutex_lock(&fs->mu);
    int s = fs->stop;
    pthread_mutex_unlock(&fs->mu);
    return s;
}

/* Sleep up to seconds, waking early on a kick or stop. Returns 1 when stopping. */
static int nap(fetch_service *fs, double seconds)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    long long ns = until.tv_nsec + (long long)(seconds * 1e9);
    until.tv_sec += (time_t)(ns / 1000000000LL);
    until.tv_nsec = (long)(ns % 1000000000LL);
    pthread_mutex_lock(&fs->mu);
    while (!fs->stop && !fs->kicked)
        if (pthread_cond_timedwait(&fs->cv, &fs->mu, &until) == ETIMEDOUT)
            break;
    fs->kicked = 0;
    int s = fs->stop;
    pthread_mutex_unlock(&fs->mu);
    return s;
}

/* nap for the whole of seconds, however often the fetcher is kicked meanwhile: a backoff
 * that a registration (any client's POST /v1/models) must not cut short. 1 when stopping. */
static int backoff(fetch_service *fs, double seconds)
{
    for (double until = eng_wall_s() + seconds; eng_wall_s() < until;)
        if (nap(fs, until - eng_wall_s()))
            return 1;
    return stopping(fs);
}

static int on_progress(void *user, int64_t done, int64_t total)
{
    fetch_service *fs = user;
    if (stopping(fs))
        return 1;
    double now = eng_wall_s();
    if (now - fs->last_report >= 0.25) {
        fs->last_report = now;
        (void)store_model_fetch_progress(fs->st, fs->id, done, total);   /* best effort */
    }
    pthread_mutex_lock(&fs->mu);
    double turn = fs->turn_s;
    pthread_mutex_unlock(&fs->mu);
    if (now - fs->turn_start >= turn && now - fs->last_wait_check >= 1.0) {
        fs->last_wait_check = now;
        if (store_model_fetch_waiting(fs->st, fs->id) == 1)
            return 1;   /* cancelled for another's turn: the .part stays, the model fetching */
    }
    return 0;
}

/* A turn counts from the transfer: hashing what an earlier turn left in the .part (as long
 * as the disk takes) is not the turn's time, or a large part would be cancelled while it is
 * read back, every turn. */
static void on_transfer_starts(void *user)
{
    fetch_service *fs = user;
    if (fs->turn_start > 1e299)   /* the turn's first transfer; a retry's does not restart it */
        fs->turn_start = eng_wall_s();
}

/* The downloaded file must open as a model. 0, or -1 with err. */
static int check_model(const store_model *m, char *err, size_t errlen)
{
    mio_model *mm = malloc(sizeof *mm);
    if (!mm) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    char why[512] = "";
    int rc = mio_open(mm, m->path, m->tokenizer[0] ? m->tokenizer : NULL, why, sizeof why);
    if (rc == 0) {
        /* the probe is the truth: the name only chose where to store it */
        const char *got = mio_format_name(mm->format);
        if (strcmp(got, m->format)) {
            snprintf(err, errlen, "the downloaded file is a %s model, not the %s its name says", got, m->format);
            rc = -1;
        }
        mio_close(mm);
    } else {
        snprintf(err, errlen, "the downloaded file is not a readable model: %.400s", why);
    }
    free(mm);
    return rc;
}

/* A model verified ready: with a remote artifact store, also put there by its sha-256, so
 * that worker agents on other hosts take their copy from there (jobs/pipeline.c): ready
 * means ready wherever its jobs may run. The upload is tried FETCH_ATTEMPTS times, 2, 4
 * and 8 s apart; when it still fails the model is recorded failed with the store's reason,
 * its file kept (registering it again checks that file and tries the upload again). A
 * stop between attempts leaves it fetching. Then recorded ready (or failed, with bad's
 * reason). */
static void fetch_ready(fetch_service *fs, const store_model *m, int bad, int64_t size, const char *why)
{
    char hex[65] = "", err[1024] = "", msg[1400];
    int64_t put_size = 0;
    /* stored here once (hashed), then only the upload is tried again */
    int stored = !bad && fs->as && art_has_remote(fs->as) ? art_put(fs->as, m->path, hex, &put_size, err, sizeof err)
                 : 0;
    for (int attempt = 1; stored != 0; attempt++) {
        if (attempt == FETCH_ATTEMPTS) {
            snprintf(msg, sizeof msg, "the model was downloaded and verified, but the artifact store that other "
                     "hosts read it from did not take it (register it again to retry; the download is kept): %s",
                     err);
            (void)store_model_fetch_done(fs->st, m->id, "failed", 0, msg);
            return;
        }
        if (backoff(fs, (double)(1 << attempt)))
            return;
        stored = art_has(fs->as, hex, put_size) ? art_push_remote(fs->as, hex, put_size, err, sizeof err)
                                                : art_put(fs->as, m->path, hex, &put_size, err, sizeof err);
    }
    (void)store_model_fetch_done(fs->st, m->id, bad ? "failed" : "ready", size, why);
}

/* A model registered again under another file name after it failed with its download
 * kept (fetch_ready): that download, in the same DATA/models/SHA folder, is moved to the
 * new path, where fetch_one finds it and checks it as an earlier run's. */
static void adopt_kept(const char *path)
{
    char dir[4096];
    struct stat sb;
    if (lstat(path, &sb) == 0 || errno != ENOENT)
        return;
    fio_dir_of(path, dir, sizeof dir);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char old[4400];
        if (e->d_name[0] == '.' || fio_has_suffix(e->d_name, ".part") || strstr(e->d_name, ".tmp.") ||
            snprintf(old, sizeof old, "%s/%s", dir, e->d_name) >= (int)sizeof old || lstat(old, &sb) < 0 ||
            !S_ISREG(sb.st_mode))
            continue;
        if (rename(old, path) == 0)
            break;
    }
    if (d)
        closedir(d);
}

/* Fetch one model to a final state (or leave it fetching when stopping). */
static void fetch_one(fetch_service *fs, const store_model *m)
{
    char err[1024] = "";
    snprintf(fs->id, sizeof fs->id, "%s", m->id);
    fs->last_seq = m->seq;
    fs->last_report = fs->last_wait_check = 0;
    fs->turn_start = 1e300;   /* not yet: the turn starts with the first transfer */
    int64_t limit = fs->max_bytes;
    if (m->size_bytes >= 0 && m->size_bytes < limit)
        limit = m->size_bytes;
    struct stat sb;
    adopt_kept(m->path);
    if (stat(m->path, &sb) == 0) {   /* done by an earlier run that stopped before recording it */
        char hex[65], why[256];
        int64_t size = 0;
        int ok = art_sha256_file(m->path, hex, &size, why, sizeof why) == 0 && !strcasecmp(hex, m->sha256);
        if (ok) {
            int bad = check_model(m, err, sizeof err);
            if (bad)
                unlink(m->path);
            fetch_ready(fs, m, bad, size, err);
            return;
        }
        unlink(m->path);
    }
    char folder[4096];
    snprintf(folder, sizeof folder, "%s", m->path);
    if (fio_mkdirs(dirname(folder)) < 0) {
        snprintf(err, sizeof err, "cannot create the model cache folder for %.600s: %s", m->path, strerror(errno));
        (void)store_model_fetch_done(fs->st, m->id, "failed", 0, err);
        return;
    }
    int rc = FETCH_FAILED;
    for (int attempt = 1; attempt <= FETCH_ATTEMPTS; attempt++) {
        fetch_opts o;
        memset(&o, 0, sizeof o);
        o.flags = fs->flags & (FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE);
        o.progress = on_progress;
        o.transfer_starts = on_transfer_starts;
        o.user = fs;
        o.ca_file = fs->ca_file;
        rc = fetch_url(m->url, m->sha256, limit, m->path, &o, err, sizeof err);
        if (rc == FETCH_FAILED && o.tls_unverified && !fs->ca_file) {
            size_t n = strlen(err);
            snprintf(err + n, sizeof err - n, "; if the model host's certificate comes from a private or corporate"
                                              " CA, start the server with --models-ca-file PATH (a PEM bundle)");
        }
        if (rc == FETCH_OK) {
            int bad = check_model(m, err, sizeof err);
            if (bad)
                unlink(m->path);
            fetch_ready(fs, m, bad, o.bytes, err);
            return;
        }
        if (rc == FETCH_BUSY) {   /* another process downloads it: not an attempt of ours */
            (void)nap(fs, 2.0);
            return;               /* it stays fetching; its next turn looks again */
        }
        if (rc != FETCH_RETRY || attempt == FETCH_ATTEMPTS)
            break;
        if (backoff(fs, (double)(1 << attempt)))   /* 2, 4, 8 s */
            return;
    }
    if (rc == FETCH_CANCELLED || stopping(fs))
        return;   /* stays "fetching": its next turn, or the next start, resumes from the .part */
    /* failed: what its attempts left goes (registering it again starts over), so URLs
     * that always break off cannot fill the disk with parts */
    char part[sizeof m->path + 8];
    if (fetch_part_path(m->path, part, sizeof part) == 0 && unlink(part) < 0 && errno != ENOENT)
        fprintf(stderr, "fetch: cannot remove %s: %s\n", part, strerror(errno));
    (void)store_model_fetch_done(fs->st, m->id, "failed", 0, err);
}

static void *fetch_main(void *arg)
{
    fetch_service *fs = arg;
    for (;;) {
        if (stopping(fs))
            break;
        store_model *m = malloc(sizeof *m);
        int rc = m ? store_model_next_fetch(fs->st, fs->last_seq, m) : -1;
        if (rc == 0)
            fetch_one(fs, m);
        free(m);
        if (rc != 0 && nap(fs, 1.0))
            break;
    }
    return NULL;
}

fetch_service *fetch_service_start(store *st, artstore *as, unsigned flags, int64_t max_model_bytes,
                                   const char *ca_file, char *err, size_t errlen)
{
    if (ca_file && fetch_check_ca_file(ca_file, err, errlen) < 0)
        return NULL;
    pthread_mutex_lock(&g_mu);
    if (g_service) {
        pthread_mutex_unlock(&g_mu);
        snprintf(err, errlen, "a model fetcher already runs in this process");
        return NULL;
    }
    fetch_service *fs = calloc(1, sizeof *fs);
    if (!fs) {
        pthread_mutex_unlock(&g_mu);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    fs->st = st;
    fs->as = as;
    fs->flags = flags & (FETCH_ALLOW_HTTP | FETCH_ALLOW_PRIVATE);
    fs->max_bytes = max_model_bytes;
    fs->turn_s = FETCH_TURN_S;
    if (ca_file && !(fs->ca_file = strdup(ca_file))) {
        free(fs);
        pthread_mutex_unlock(&g_mu);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&fs->mu, NULL);
    pthread_cond_init(&fs->cv, NULL);
    int e = pthread_create(&fs->thread, NULL, fetch_main, fs);
    if (e) {
        pthread_cond_destroy(&fs->cv);
        pthread_mutex_destroy(&fs->mu);
        free(fs->ca_file);
        free(fs);
        pthread_mutex_unlock(&g_mu);
        snprintf(err, errlen, "cannot start the model fetcher: %s", strerror(e));
        return NULL;
    }
    g_service = fs;
    pthread_mutex_unlock(&g_mu);
    return fs;
}

void fetch_service_stop(fetch_service *fs)
{
    if (!fs)
        return;
    pthread_mutex_lock(&g_mu);
    if (g_service == fs)
        g_service = NULL;
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_lock(&fs->mu);
    fs->stop = 1;
    pthread_cond_broadcast(&fs->cv);
    pthread_mutex_unlock(&fs->mu);
    pthread_join(fs->thread, NULL);
    pthread_cond_destroy(&fs->cv);
    pthread_mutex_destroy(&fs->mu);
    free(fs->ca_file);
    free(fs);
}

void fetch_service_set_turn(fetch_service *fs, double seconds)
{
    pthread_mutex_lock(&fs->mu);
    fs->turn_s = seconds > 0 ? seconds : FETCH_TURN_S;
    pthread_mutex_unlock(&fs->mu);
}

int fetch_service_policy(unsigned *flags, int64_t *max_model_bytes)
{
    pthread_mutex_lock(&g_mu);
    int rc = -1;
    if (g_service) {
        *flags = g_service->flags;
        *max_model_bytes = g_service->max_bytes;
        rc = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

void fetch_service_kick(void)
{
    pthread_mutex_lock(&g_mu);
    if (g_service) {
        pthread_mutex_lock(&g_service->mu);
        g_service->kicked = 1;
        pthread_cond_signal(&g_service->cv);
        pthread_mutex_unlock(&g_service->mu);
    }
    pthread_mutex_unlock(&g_mu);
}
