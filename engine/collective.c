/* engine/collective.c — the CPU collective (see collective.h): ranks in processes of one
 * machine, a shared anonymous mapping, a process-shared barrier, rank-ordered sums.
 *
 * allreduce of n floats, piece by piece (a piece is at most one slot):
 *   1. every rank copies its piece into its own slot;            barrier
 *   2. rank r sums segment r of the piece over the slots, in rank order, into slot 0
 *      (segments are disjoint, so no two ranks touch the same float);  barrier
 *   3. every rank copies slot 0 back into its buffer;            barrier
 * so every rank gets the same bits, and the sum's order never depends on timing.
 */
#include "engine/collective.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 64

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size, arrived, aborted;
    unsigned gen;
    pid_t pid[MAX_RANKS];
    char why[256];
    size_t slot_floats;
    /* then size slots of slot_floats floats, 64-byte aligned */
} shm_hdr;

struct eng_coll_group {
    shm_hdr *h;
    size_t bytes;
};

typedef struct {
    shm_hdr *h;
    size_t bytes;
    double timeout_s;
} cpu_coll;

static size_t hdr_bytes(void)
{
    return (sizeof(shm_hdr) + 63) & ~(size_t)63;
}

static float *slot(shm_hdr *h, int r)
{
    return (float *)((char *)h + hdr_bytes()) + (size_t)r * h->slot_floats;
}

eng_coll_group *eng_coll_cpu_group(int size, size_t slot_floats, char *err, size_t errlen)
{
    if (size < 1 || size > MAX_RANKS) {
        snprintf(err, errlen, "%d ranks: a CPU group holds 1 to %d", size, MAX_RANKS);
        return NULL;
    }
    if (!slot_floats)
        slot_floats = (size_t)1 << 20;
    slot_floats = (slot_floats + 15) & ~(size_t)15;
    size_t bytes = hdr_bytes() + (size_t)size * slot_floats * sizeof(float);
    eng_coll_group *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "shared mapping of %zu bytes for %d ranks: %s", bytes, size, strerror(errno));
        free(g);
        return NULL;
    }
    shm_hdr *h = p;   /* the mapping comes zeroed */
    pthread_mutexattr_t ma;
    pthread_condattr_t ca;
    int e = pthread_mutexattr_init(&ma);
    if (!e)
        e = pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    if (!e)
        e = pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    if (!e)
        e = pthread_mutex_init(&h->mu, &ma);
    if (!e)
        e = pthread_condattr_init(&ca);
    if (!e)
        e = pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    if (!e)
        e = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (!e)
        e = pthread_cond_init(&h->cv, &ca);
    if (e) {
        snprintf(err, errlen, "process-shared barrier: %s", strerror(e));
        munmap(p, bytes);
        free(g);
        return NULL;
    }
    h->size = size;
    h->slot_floats = slot_floats;
    g->h = h;
    g->bytes = bytes;
    return g;
}

void eng_coll_group_release(eng_coll_group *g)
{
    if (g) {
        munmap(g->h, g->bytes);
        free(g);
    }
}

/* A peer that joined and is gone (exited, killed, or a zombie nobody waited for). */
static int peer_gone(pid_t pid)
{
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 1;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close = strrchr(buf, ')');
    return close && (close[2] == 'Z' || close[2] == 'X');
}

/* A rank died holding the mutex: the group is over; name the rank when it can be found. */
static void died_inside(shm_hdr *h)
{
    h->aborted = 1;
    snprintf(h->why, sizeof h->why, "a rank died inside a collective");
    for (int r = 0; r < h->size; r++)
        if (peer_gone(h->pid[r])) {
            snprintf(h->why, sizeof h->why, "rank %d (pid %d) is gone (it died inside a collective)", r,
                     (int)h->pid[r]);
            break;
        }
}

static int lock(shm_hdr *h)
{
    int e = pthread_mutex_lock(&h->mu);
    if (e == EOWNERDEAD) {   /* a rank died holding it: the group is over */
        died_inside(h);
        pthread_mutex_consistent(&h->mu);
        e = 0;
    }
    return e;
}

/* Wait for every rank. 0, or -1 with err. */
static int barrier(eng_coll *c, char *err, size_t errlen)
{
    cpu_coll *cc = c->impl;
    shm_hdr *h = cc->h;
    if (lock(h)) {
        snprintf(err, errlen, "collective: cannot lock the shared barrier");
        return -1;
    }
    unsigned gen = h->gen;
    int rc = 0;
    if (!h->aborted && ++h->arrived == h->size) {
        h->arrived = 0;
        h->gen++;
        pthread_cond_broadcast(&h->cv);
    } else {
        struct timespec start;
        clock_gettime(CLOCK_MONOTONIC, &start);
        while (!h->aborted && h->gen == gen) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            double waited = (double)(ts.tv_sec - start.tv_sec) + 1e-9 * (double)(ts.tv_nsec - start.tv_nsec);
            if (waited > cc->timeout_s) {
                h->aborted = 1;
                snprintf(h->why, sizeof h->why, "rank %d waited %.0f s for its peers", c->rank, waited);
                break;
            }
            for (int r = 0; r < h->size; r++)
                if (r != c->rank && peer_gone(h->pid[r])) {
                    h->aborted = 1;
                    snprintf(h->why, sizeof h->why, "rank %d (pid %d) is gone", r, (int)h->pid[r]);
                }
            if (h->aborted)
                break;
            ts.tv_sec += 1;
            int e = pthread_cond_timedwait(&h->cv, &h->mu, &ts);
            if (e == EOWNERDEAD) {
                died_inside(h);
                pthread_mutex_consistent(&h->mu);
            }
        }
    }
    if (h->aborted) {
        snprintf(err, errlen, "collective (rank %d of %d): %s", c->rank, h->size, h->why);
        pthread_cond_broadcast(&h->cv);
        rc = -1;
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static int cpu_allreduce(eng_coll *c, eng_backend *be, float *buf, size_t n, char *err, size_t errlen)
{
    cpu_coll *cc = c->impl;
    shm_hdr *h = cc->h;
    if (h->size == 1)
        return 0;
    float *mine = slot(h, c->rank), *sum = slot(h, 0);
    for (size_t off = 0; off < n; off += h->slot_floats) {
        size_t len = n - off < h->slot_floats ? n - off : h->slot_floats;
        if (be)
            be->to_host(be, mine, buf + off, len * sizeof(float));
        else
            memcpy(mine, buf + off, len * sizeof(float));
        if (barrier(c, err, errlen))
            return -1;
        size_t lo = len * (size_t)c->rank / (size_t)h->size, hi = len * (size_t)(c->rank + 1) / (size_t)h->size;
        for (size_t i = lo; i < hi; i++) {
            float s = sum[i];
            for (int r = 1; r < h->size; r++)
                s += slot(h, r)[i];
            sum[i] = s;
        }
        if (barrier(c, err, errlen))
            return -1;
        if (be)
            be->to_device(be, buf + off, sum, len * sizeof(float));
        else
            memcpy(buf + off, sum, len * sizeof(float));
        if (barrier(c, err, errlen))
            return -1;
    }
    return 0;
}

static void cpu_abort(eng_coll *c, const char *why)
{
    cpu_coll *cc = c->impl;
    shm_hdr *h = cc->h;
    if (lock(h))
        return;
    if (!h->aborted) {
        h->aborted = 1;
        snprintf(h->why, sizeof h->why, "rank %d gave up: %s", c->rank, why);
    }
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static void cpu_free(eng_coll *c)
{
    if (c) {
        free(c->impl);
        free(c);
    }
}

eng_coll *eng_coll_cpu_join(eng_coll_group *g, int rank, char *err, size_t errlen)
{
    if (!g || rank < 0 || rank >= g->h->size) {
        snprintf(err, errlen, "rank %d: the group has %d ranks", rank, g ? g->h->size : 0);
        return NULL;
    }
    eng_coll *c = calloc(1, sizeof *c);
    cpu_coll *cc = calloc(1, sizeof *cc);
    if (!c || !cc) {
        free(c);
        free(cc);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    cc->h = g->h;
    cc->bytes = g->bytes;
    cc->timeout_s = 600;
    c->rank = rank;
    c->size = g->h->size;
    c->kind = "cpu-shm";
    c->allreduce_sum = cpu_allreduce;
    c->abort = cpu_abort;
    c->free = cpu_free;
    c->impl = cc;
    if (lock(g->h) == 0) {
        g->h->pid[rank] = getpid();
        pthread_mutex_unlock(&g->h->mu);
    }
    return c;
}
