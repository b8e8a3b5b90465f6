/* jobs/retention.h — artifact retention for a data directory: a cap on its total size
 * and on the age of finished jobs. Finished jobs (succeeded, failed, cancelled) are
 * removed whole — store rows, events, artifacts no other job references and the work
 * directory — oldest finished first; queued and running jobs are never touched. The
 * policy comes from the environment (AC_RETAIN_MAX_BYTES, AC_RETAIN_MAX_AGE_S; the
 * server's --retain-* flags set them for its workers). Workers enforce it when a job
 * starts and when it ends.
 */
#ifndef AC_JOBS_RETENTION_H
#define AC_JOBS_RETENTION_H

#include <stddef.h>
#include <stdint.h>

#include "storage/artstore.h"
#include "storage/store.h"

typedef struct {
    int64_t max_bytes;   /* cap on the data directory's disk usage; 0 = none */
    int64_t max_age_s;   /* finished jobs older than this go; 0 = none */
} retention_policy;

/* The policy in this process's environment (unset or invalid variables: no cap).
 * Returns 1 when some cap is set, else 0. */
int retention_from_env(retention_policy *p);

/* Disk usage of everything under dir (allocated blocks), in bytes; -1 when dir cannot
 * be opened. Entries removed during the walk, and folders that cannot be read, count
 * nothing. */
int64_t retention_dir_bytes(const char *dir);

/* Apply p to the data directory: first every finished job older than max_age_s, then
 * the oldest finished jobs while the directory is larger than max_bytes. keep_id (may
 * be NULL) is never removed. *removed gets the number of jobs removed. Returns 0 (also
 * when the cap cannot be met with what may be removed), or -1 with err when the store
 * failed or the directory's size cannot be measured (then no job is removed for size). */
int retention_enforce(store *st, artstore *as, const char *data_dir, const retention_policy *p,
                      const char *keep_id, int *removed, char *err, size_t errlen);

#endif
