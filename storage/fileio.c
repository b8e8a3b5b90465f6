/* storage/fileio.c — file maps, reads, atomic writes and path helpers (see fileio.h). */
#include "storage/fileio.h"

#include <ctype.h>
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

const char *fio_file_kind(mode_t m)
{
    return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a plain file";
}

/* err for path, which is not a regular file (mode m). */
static void not_regular(const char *path, const char *what, mode_t m, char *err, size_t errlen)
{
    if (what)
        snprintf(err, errlen, "%s: not %s (%s, not a regular file)", path, what, fio_file_kind(m));
    else
        snprintf(err, errlen, "%s: not a regular file (%s)", path, fio_file_kind(m));
}

FILE *fio_fopen_regular(const char *path, const char *what, int64_t max_bytes, char *err, size_t errlen)
{
    struct stat st;
    int fd = fio_open_regular(path, what, &st, err, errlen);
    if (fd < 0)
        return NULL;
    if (max_bytes > 0 && st.st_size > max_bytes) {
        snprintf(err, errlen, "%s: %lld bytes, more than the limit of %lld", path, (long long)st.st_size,
                 (long long)max_bytes);
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

int fio_lock_file(const char *path, char *err, size_t errlen)
{
    for (;;) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            return -1;
        }
        int rc;
        while ((rc = flock(fd, LOCK_EX)) < 0 && errno == EINTR)
            ;
        struct stat held, named;
        if (rc < 0 || fstat(fd, &held) < 0) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        if (stat(path, &named) == 0 && named.st_ino == held.st_ino && named.st_dev == held.st_dev)
            return fd;
        close(fd);   /* removed (or replaced) by the holder before this one got it */
    }
}

void fio_unlock_remove(const char *path, int fd)
{
    (void)unlink(path);   /* first: a waiter that then gets the lock sees it is gone */
    close(fd);
}

int fio_open_regular(const char *path, const char *what, struct stat *st, char *err, size_t errlen)
{
    if (stat(path, st)) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        errno = e;
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        not_regular(path, what, st->st_mode, err, errlen);
        errno = EINVAL;
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        errno = e;
        return -1;
    }
    int fl;
    if (fstat(fd, st) || (fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        close(fd);
        errno = e;
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        not_regular(path, what, st->st_mode, err, errlen);
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

int fio_map(const char *path, size_t min_len, const char *what, void **map, size_t *len, char *err,
              size_t errlen)
{
    *map = NULL;
    *len = 0;
    struct stat st;
    int fd = fio_open_regular(path, what, &st, err, errlen);
    if (fd < 0)
        return -1;
    if ((size_t)st.st_size < min_len) {
        if (what)
            snprintf(err, errlen, "%s: not %s (too short: %lld bytes)", path, what, (long long)st.st_size);
        else
            snprintf(err, errlen, "%s: too short (%lld bytes)", path, (long long)st.st_size);
        close(fd);
        return -1;
    }
    if (st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            snprintf(err, errlen, "%s: mmap: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        *map = m;
        *len = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

static __thread fio_guard *cur_guard;   /* this thread's innermost guard */
static struct sigaction before_guards;   /* the SIGBUS handler ours replaced */
static pthread_mutex_t guard_mu = PTHREAD_MUTEX_INITIALIZER;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    fio_guard *g = cur_guard;
    if (g) {
        cur_guard = g->prev;
        siglongjmp(g->jb, 1);
    }
    /* not a guarded read: what was there before ours acts */
    if ((before_guards.sa_flags & SA_SIGINFO) && before_guards.sa_sigaction) {
        before_guards.sa_sigaction(sig, si, uc);
    } else if (before_guards.sa_handler != SIG_DFL && before_guards.sa_handler != SIG_IGN) {
        before_guards.sa_handler(sig);
    } else if (before_guards.sa_handler == SIG_DFL) {
        signal(SIGBUS, SIG_DFL);   /* a fault repeats on return and ends the process as it would have */
        if (si && si->si_code <= 0)
            raise(SIGBUS);        /* sent, not a fault: it does not repeat */
    }
}

void fio_guard_enter(fio_guard *g)
{
    /* ours, or put back: another handler (a test harness's) may have replaced it since */
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) == 0 && !((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigbus)) {
        pthread_mutex_lock(&guard_mu);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, NULL, &now) == 0 && !((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigbus))
            (void)sigaction(SIGBUS, &sa, &before_guards);
        pthread_mutex_unlock(&guard_mu);
    }
    g->prev = cur_guard;
    atomic_signal_fence(memory_order_seq_cst);
    cur_guard = g;
    atomic_signal_fence(memory_order_seq_cst);
}

void fio_guard_leave(fio_guard *g)
{
    atomic_signal_fence(memory_order_seq_cst);
    cur_guard = g->prev;
    atomic_signal_fence(memory_order_seq_cst);
}

void fio_map_release(const void *map, size_t len, const void *p, size_t n)
{
    if (!map || !n)
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), m0 = (uintptr_t)map, m1 = m0 + len;
    uintptr_t lo = (uintptr_t)p & ~(page - 1), hi = ((uintptr_t)p + n + page - 1) & ~(page - 1);
    m1 = (m1 + page - 1) & ~(page - 1);   /* the map's last page is whole */
    lo = lo < m0 ? m0 : lo;
    hi = hi > m1 ? m1 : hi;
    if (lo < hi)   /* advice only: a refusal leaves the pages resident, the bytes as they were */
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void fio_unmap(void *map, size_t len)
{
    if (map)
        munmap(map, len);
}

void fio_err_path(char *err, size_t errlen, const char *path)
{
    size_t n = strlen(err);
    if (n + 1 < errlen)
        snprintf(err + n, errlen - n, " [%s]", path);
}

/* All of fd (path's, closed here) into a new NUL-terminated buffer, at most max_bytes. */
static char *read_fd_all(int fd, const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen)
{
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    for (;;) {
        if (n == cap) {
            if (max_bytes && cap >= max_bytes) {
                snprintf(err, errlen, "%s: larger than %zu bytes", path, max_bytes);
                goto fail;
            }
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                snprintf(err, errlen, "%s: out of memory", path);
                goto fail;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) {
                snprintf(err, errlen, "%s: read error", path);
                goto fail;
            }
            break;
        }
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
fail:
    fclose(f);
    free(buf);
    return NULL;
}

char *fio_read_all(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen)
{
    struct stat st;
    int fd = fio_open_regular(path, NULL, &st, err, errlen);
    if (fd < 0)
        return NULL;
    if (max_bytes && (uint64_t)st.st_size >= max_bytes) {
        snprintf(err, errlen, "%s: larger than %zu bytes", path, max_bytes);
        close(fd);
        return NULL;
    }
    return read_fd_all(fd, path, max_bytes, len, err, errlen);
}

char *fio_read_input(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISFIFO(st.st_mode)) {   /* a pipe the user gave: read until its writer closes */
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            return NULL;
        }
        return read_fd_all(fd, path, max_bytes, len, err, errlen);
    }
    return fio_read_all(path, max_bytes, len, err, errlen);
}

int fio_temp_name(char *out, size_t n, const char *path)
{
    static unsigned counter;
    unsigned k = __atomic_fetch_add(&counter, 1u, __ATOMIC_RELAXED), nonce = 0;
    if (getrandom(&nonce, sizeof nonce, GRND_NONBLOCK) != (ssize_t)sizeof nonce)
        nonce = 0;   /* the name stays unique in this process */
    int w = snprintf(out, n, "%s.tmp.%ld.%u.%08x", path, (long)getpid(), k, nonce);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

int fio_temp_stale(const char *name)
{
    const char *t = NULL;
    for (const char *p = strstr(name, ".tmp."); p; p = strstr(p + 1, ".tmp."))
        t = p;   /* the last: PATH itself may hold ".tmp." */
    if (!t)
        return 0;
    char *end;
    errno = 0;
    long pid = strtol(t + 5, &end, 10);
    if (errno || end == t + 5 || *end != '.' || pid <= 0 || pid == (long)getpid())
        return 0;
    return kill((pid_t)pid, 0) < 0 && errno == ESRCH;
}

int fio_write_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen)
{
    char tmp[4200];
    if (fio_temp_name(tmp, sizeof tmp, path)) {
        snprintf(err, errlen, "%s: path too long", path);
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    if (fio_write_all(fd, data, len)) {
        snprintf(err, errlen, "%s: write: %s", tmp, strerror(errno));
        goto fail;
    }
    if (fsync(fd)) {
        snprintf(err, errlen, "%s: fsync: %s", tmp, strerror(errno));
        goto fail;
    }
    int rc = close(fd);
    fd = -1;
    if (rc) {
        snprintf(err, errlen, "%s: close: %s", tmp, strerror(errno));
        goto fail;
    }
    if (rename(tmp, path)) {
        snprintf(err, errlen, "%s: rename: %s", path, strerror(errno));
        goto fail;
    }
    (void)fio_fsync_parent(path);   /* best effort */
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    return -1;
}

int fio_mkdirs(const char *dir)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s", dir) >= sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

static int remove_failures, remove_errno;

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    if (remove(path) < 0 && errno != ENOENT) {
        remove_failures++;
        remove_errno = errno;
    }
    return 0;
}

int fio_remove_tree(const char *dir)
{
    struct stat st;
    if (lstat(dir, &st) < 0)
        return errno == ENOENT ? 0 : -1;
    /* nftw takes no user pointer: the failure count is process-wide state, so removals
       are serialized */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    remove_failures = 0;
    remove_errno = 0;
    int rc = nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    int failures = remove_failures, e = remove_errno;
    pthread_mutex_unlock(&mu);
    if (rc != 0 && !e)
        e = errno;
    if (rc != 0 || failures) {
        errno = e;
        return -1;
    }
    return 0;
}

int fio_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int fio_fsync_parent(const char *path)
{
    char dir[4096];
    if ((size_t)snprintf(dir, sizeof dir, "%s", path) >= sizeof dir) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return fio_fsync_dir(dirname(dir));
}

int fio_write_json(const char *path, const json_t *j, size_t flags, char *err, size_t errlen)
{
    char *text = json_dumps(j, flags);
    if (!text) {
        snprintf(err, errlen, "%s: out of memory (or a value that is not finite) serializing JSON", path);
        return -1;
    }
    size_t n = strlen(text);
    char *buf = realloc(text, n + 2);
    if (!buf) {
        free(text);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    buf[n] = '\n';
    buf[n + 1] = 0;
    int rc = fio_write_atomic(path, buf, n + 1, err, errlen);
    free(buf);
    return rc;
}

json_t *fio_load_json(const char *path, size_t flags, char *err, size_t errlen)
{
    size_t n;
    char *text = fio_read_all(path, FIO_MAX_JSON_BYTES, &n, err, errlen);
    if (!text)
        return NULL;
    json_error_t je;
    json_t *j = json_loadb(text, n, flags, &je);
    free(text);
    if (!j)
        snprintf(err, errlen, "%s: %s (line %d)", path, je.text, je.line);
    return j;
}

int fio_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int fio_copy_into(const char *src, int fd)
{
    struct stat st;
    char why[64];
    int in = fio_open_regular(src, NULL, &st, why, sizeof why);
    if (in < 0)
        return -1;
    char buf[1 << 16];
    int rc = 0;
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? -1 : 0;
            break;
        }
        if (fio_write_all(fd, buf, (size_t)r)) {
            rc = -1;
            break;
        }
    }
    int e = errno;
    close(in);
    errno = e;
    return rc;
}

int fio_path_join(char *out, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

void fio_dir_of(const char *path, char *dir, size_t n)
{
    snprintf(dir, n, "%s", path);
    char *s = strrchr(dir, '/');
    if (s)
        *s = '\0';
    else
        snprintf(dir, n, ".");
}

int fio_is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* fio_resolve of an absolute path, depth links and folders deep. */
static int resolve_at(const char *p, char *out, size_t n, int depth)
{
    char real[PATH_MAX];
    if (realpath(p, real))
        return snprintf(out, n, "%s", real) >= (int)n ? -1 : 0;
    if (depth > 40 || strlen(p) >= PATH_MAX)
        return -1;
    struct stat lst;
    char next[2 * PATH_MAX];
    if (lstat(p, &lst) == 0 && S_ISLNK(lst.st_mode)) {
        char t[PATH_MAX];
        ssize_t k = readlink(p, t, sizeof t - 1);
        if (k < 0)
            return -1;
        t[k] = 0;
        if (t[0] == '/') {
            snprintf(next, sizeof next, "%s", t);
        } else {
            const char *slash = strrchr(p, '/');
            snprintf(next, sizeof next, "%.*s/%s", (int)(slash - p), p, t);
        }
        return resolve_at(next, out, n, depth + 1);
    }
    const char *slash = strrchr(p, '/');
    if (!slash)
        return -1;
    const char *base = slash + 1;
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%.*s", slash == p ? 1 : (int)(slash - p), p);
    if (resolve_at(parent, next, sizeof next, depth + 1))
        return -1;
    if (!strcmp(base, "..")) {
        char *s2 = strrchr(next, '/');
        if (s2)
            *(s2 == next ? s2 + 1 : s2) = 0;
        return snprintf(out, n, "%s", next) >= (int)n ? -1 : 0;
    }
    if (!base[0] || !strcmp(base, "."))
        return snprintf(out, n, "%s", next) >= (int)n ? -1 : 0;
    return snprintf(out, n, "%s/%s", strcmp(next, "/") ? next : "", base) >= (int)n ? -1 : 0;
}

int fio_resolve(const char *path, char *out, size_t n)
{
    if (path[0] == '/')
        return resolve_at(path, out, n, 0);
    char cwd[PATH_MAX], abs[2 * PATH_MAX];
    if (!getcwd(cwd, sizeof cwd) || snprintf(abs, sizeof abs, "%s/%s", cwd, path) >= (int)sizeof abs)
        return -1;
    return resolve_at(abs, out, n, 0);
}

int64_t fio_free_bytes(const char *dir)
{
    struct statvfs v;
    return statvfs(dir, &v) == 0 ? (int64_t)v.f_bavail * (int64_t)v.f_frsize : -1;
}

int fio_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int fio_has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

void fio_unprefix(char *s, const char *dir)
{
    if (!s || !dir)
        return;
    size_t n = strlen(dir);
    while (n > 0 && dir[n - 1] == '/')
        n--;
    if (n == 0)
        return;
    for (char *p = s; (p = strchr(p, dir[0])) != NULL;) {
        /* dir itself, not the end of a longer path ("/x/srv/ac/...") nor the start of one ("/srv/ac2/...") */
        int starts = p == s || !(isalnum((unsigned char)p[-1]) || strchr("/._-~", p[-1]));
        if (starts && !strncmp(p, dir, n) && p[n] == '/')
            memmove(p, p + n + 1, strlen(p + n + 1) + 1);
        else
            p++;
    }
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int fio_list_dir(const char *dir, char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    char **v = NULL;
    size_t k = 0, cap = 0;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (k == cap) {
            size_t nc = cap ? cap * 2 : 16;
            char **nv = realloc(v, nc * sizeof *nv);
            if (!nv)
                goto oom;
            v = nv;
            cap = nc;
        }
        if (!(v[k] = strdup(e->d_name)))
            goto oom;
        k++;
    }
    int e_read = errno;
    closedir(d);
    if (e_read) {
        fio_names_free(v, k);
        errno = e_read;
        return -1;
    }
    if (k)
        qsort(v, k, sizeof *v, cmp_names);
    *names = v;
    *n = k;
    return 0;
oom:
    closedir(d);
    fio_names_free(v, k);
    errno = ENOMEM;
    return -1;
}

void fio_names_free(char **names, size_t n)
{
    for (size_t i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
}
