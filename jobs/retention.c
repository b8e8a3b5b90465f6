/* jobs/retention.c — size and age caps on a data directory (retention.h). Sizes are the
 * allocated blocks of every file under the directory (SQLite files, artifact blobs,
 * work directories, calibration cache); removal goes through store_job_delete so the
 * store stays consistent, then unreferenced blobs and the job's directory go.
 */
#include "jobs/retention.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "storage/fileio.h"

static int64_t env_i64(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    return (*end || errno == ERANGE || x < 0) ? 0 : (int64_t)x;
}

int retention_from_env(retention_policy *p)
{
    p->max_bytes = env_i64("AC_RETAIN_MAX_BYTES");
    p->max_age_s = env_i64("AC_RETAIN_MAX_AGE_S");
    return p->max_bytes > 0 || p->max_age_s > 0;
}

/* Folders deeper than this below the data directory are not descended into (each level
 * holds a descriptor open); what they hold goes uncounted. */
#define DU_MAX_DEPTH 64

/* Allocated bytes of the entries under the folder open as dfd (closed here), by relative
 * calls, so no path length limits it. An entry removed while it walks (another worker
 * clearing checkpoints) counts nothing, as does a folder that cannot be opened: the walk
 * goes on rather than leave the whole size unknown. */
static int64_t du_fd(int dfd, int depth)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return 0;
    }
    int64_t total = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        struct stat sb;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        total += (int64_t)sb.st_blocks * 512;
        if (S_ISDIR(sb.st_mode) && depth < DU_MAX_DEPTH) {
            int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0)
                total += du_fd(sub, depth + 1);
        }
    }
    closedir(d);
    return total;
}

int64_t retention_dir_bytes(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return -1;
    if (fstat(fd, &sb) < 0) {
        close(fd);
        return -1;
    }
    return (int64_t)sb.st_blocks * 512 + du_fd(fd, 0);
}

/* Remove one terminal job; 1 removed, 0 not removable (no longer terminal), -1 error. */
static int remove_job(store *st, artstore *as, const char *data_dir, const char *id)
{
    char e[512];
    int rc = store_job_remove(st, as, id, -1, e, sizeof e);   /* in the background: it may wait */
    if (rc != 0)
        return rc < 0 ? -1 : 0;
    char dir[4400];
    snprintf(dir, sizeof dir, "%s/jobs/%s", data_dir, id);
    (void)fio_remove_tree(dir);   /* best effort: what cannot be removed stays (and counts) */
    return 1;
}

typedef struct {
    char id[48];
    int64_t finished_at, seq;
} cand;

static int by_finished(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->finished_at != y->finished_at)   /* Unix seconds: ties are common */
        return x->finished_at < y->finished_at ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Every terminal job and calibration (except keep_id), oldest finished first. */
static int candidates(store *st, const char *keep_id, cand **out, int *n)
{
    static const char *const kinds[] = {"job", "calibration"};
    cand *c = NULL;
    int cn = 0, cap = 0;
    for (int k = 0; k < 2; k++) {
        char after[48] = "";
        for (;;) {
            store_job *jobs = NULL;
            int jn = 0, more = 0;
            if (store_job_list(st, kinds[k], after[0] ? after : NULL, 500, &jobs, &jn, &more) != 0) {
                free(c);
                return -1;
            }
            for (int i = 0; i < jn; i++) {
                const char *s = jobs[i].status;
                int terminal = !strcmp(s, "succeeded") || !strcmp(s, "failed") || !strcmp(s, "cancelled");
                if (!terminal || (keep_id && !strcmp(jobs[i].id, keep_id)))
                    continue;
                if (cn == cap) {
                    cap = cap ? cap * 2 : 64;
                    cand *g = realloc(c, (size_t)cap * sizeof *c);
                    if (!g) {
                        store_job_list_free(jobs, jn);
                        free(c);
                        return -1;
                    }
                    c = g;
                }
                snprintf(c[cn].id, sizeof c[cn].id, "%s", jobs[i].id);
                c[cn].finished_at = jobs[i].finished_at;
                c[cn].seq = jobs[i].seq;
                cn++;
            }
            if (jn > 0)
                snprintf(after, sizeof after, "%s", jobs[jn - 1].id);
            store_job_list_free(jobs, jn);
            if (!more || jn == 0)
                break;
        }
    }
    if (cn > 1)
        qsort(c, (size_t)cn, sizeof *c, by_finished);
    *out = c;
    *n = cn;
    return 0;
}

int retention_enforce(store *st, artstore *as, const char *data_dir, const retention_policy *p,
                      const char *keep_id, int *removed, char *err, size_t errlen)
{
    *removed = 0;
    if (p->max_bytes <= 0 && p->max_age_s <= 0)
        return 0;
    cand *c = NULL;
    int n = 0;
    if (candidates(st, keep_id, &c, &n) != 0) {
        snprintf(err, errlen, "retention: listing finished jobs failed");
        return -1;
    }
    int64_t now = (int64_t)time(NULL);
    int i = 0, rc = 0;
    if (p->max_age_s > 0)
        for (; i < n && c[i].finished_at > 0 && now - c[i].finished_at > p->max_age_s; i++) {
            int r = remove_job(st, as, data_dir, c[i].id);
            if (r < 0) {
                rc = -1;
                break;
            }
            *removed += r;
        }
    if (rc != 0)
        snprintf(err, errlen, "retention: removing job %s failed", c[i].id);
    if (rc == 0 && p->max_bytes > 0)
        for (; i < n; i++) {
            /* an unknown size is not one over the cap */
            int64_t used = retention_dir_bytes(data_dir);
            if (used < 0) {
                snprintf(err, errlen, "retention: cannot measure the data directory %s: %s", data_dir,
                         strerror(errno));
                rc = -1;
                break;
            }
            if (used <= p->max_bytes)
                break;
            int r = remove_job(st, as, data_dir, c[i].id);
            if (r < 0) {
                snprintf(err, errlen, "retention: removing job %s failed", c[i].id);
                rc = -1;
                break;
            }
            *removed += r;
        }
    free(c);
    return rc;
}
