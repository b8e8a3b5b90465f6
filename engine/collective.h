/* engine/collective.h — collectives for data parallelism: ranks that sum buffers together.
 *
 * An eng_coll is one rank's handle on a group of `size` ranks. allreduce_sum turns a
 * buffer of fp32 floats on the rank's backend into the element-wise sum over the ranks,
 * with the same bits on every rank (the sum runs in rank order, 0 first), so ranks that
 * apply the same update stay identical. Every rank must call the same collectives in the
 * same order with the same lengths.
 *
 * The CPU implementation ("cpu-shm") joins processes of one machine through a shared
 * anonymous mapping made before they fork: a process-shared barrier and one staging slot
 * per rank. A rank that fails calls abort (its peers' next collective fails with its
 * reason); a rank that dies (SIGKILL) is noticed by its peers within a second; a
 * collective waits at most 600 s for a peer that is alive but silent.
 */
#ifndef AC_ENGINE_COLLECTIVE_H
#define AC_ENGINE_COLLECTIVE_H

#include <stddef.h>

#include "engine/backend.h"

#ifdef __cplusplus
extern "C" {   /* the CUDA backend's NCCL collective implements this interface */
#endif

typedef struct eng_coll eng_coll;
struct eng_coll {
    int rank, size;
    const char *kind;    /* "cpu-shm", "nccl" */
    /* In place: buf (n floats on be's device; be NULL: host memory) becomes the sum over
     * ranks. 0, or -1 with the reason in err (a peer aborted or died; out of time). */
    int (*allreduce_sum)(eng_coll *c, eng_backend *be, float *buf, size_t n, char *err, size_t errlen);
    /* Tell the peers this rank gives up, with why (their collectives then fail). */
    void (*abort)(eng_coll *c, const char *why);
    void (*free)(eng_coll *c);
    void *impl;
};

/* The shared state of a CPU group of `size` ranks (1..64), made in the parent before it
 * forks the ranks; each process (the parent too, if it is a rank) then joins it. NULL
 * with err (bad size, no memory for the mapping). Staging is `slot_floats` floats per
 * rank (0: 1 Mi floats); longer buffers go through in pieces. */
typedef struct eng_coll_group eng_coll_group;
eng_coll_group *eng_coll_cpu_group(int size, size_t slot_floats, char *err, size_t errlen);

/* This process as rank `rank` of g (each rank joins exactly once, after the fork). NULL
 * with err. The handle is freed with c->free; the group's mapping goes away with the last
 * process that holds it (and eng_coll_group_release in the parent that made it). */
eng_coll *eng_coll_cpu_join(eng_coll_group *g, int rank, char *err, size_t errlen);
void eng_coll_group_release(eng_coll_group *g);

#ifdef __cplusplus
}
#endif

#endif
