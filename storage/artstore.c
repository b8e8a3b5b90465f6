/* storage/artstore.c — content-addressed blobs (see artstore.h). Hashing uses OpenSSL's
 * EVP sha-256 over 1 MiB reads; copies fall back from link(2) to read/write when the
 * source is on another file system.
 */
#include "storage/artstore.h"
#include "storage/fileio.h"
#include "storage/s3.h"
#include "storage/store.h"
#include "engine/clock.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

/* A blob this process has hashed, and the inode state it had then: a blob whose inode,
 * size, mtime or ctime changed since is hashed again. */
typedef struct {
    char hex[65];
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
} verified_blob;

struct artstore {
    char *dir;
    pthread_mutex_t mu;
    verified_blob *verified;
    int nverified, cap;
    s3_client *remote;           /* NULL: local only */
    unsigned long fetches;       /* temporary-name counter for remote fetches (under mu) */
};

static void persist_verified(artstore *as, int fd, const char *hex);

static int same_state(const verified_blob *v, const struct stat *sb)
{
    return v->ino == sb->st_ino && v->size == sb->st_size && v->mtime.tv_sec == sb->st_mtim.tv_sec &&
           v->mtime.tv_nsec == sb->st_mtim.tv_nsec && v->ctime.tv_sec == sb->st_ctim.tv_sec &&
           v->ctime.tv_nsec == sb->st_ctim.tv_nsec;
}

static int is_hex64(const char *h)
{
    if (!h || strlen(h) != 64)
        return 0;
    for (int i = 0; i < 64; i++)
        if (!((h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'f')))
            return 0;
    return 1;
}

artstore *art_open(const char *dir, char *err, size_t errlen)
{
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/sha256", dir);
    if (fio_mkdirs(sub) < 0) {
        snprintf(err, errlen, "%s: %s", sub, strerror(errno));
        return NULL;
    }
    artstore *as = calloc(1, sizeof *as);
    if (!as || !(as->dir = strdup(dir))) {
        free(as);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&as->mu, NULL);
    return as;
}

void art_close(artstore *as)
{
    if (!as)
        return;
    pthread_mutex_destroy(&as->mu);
    s3_close(as->remote);
    free(as->verified);
    free(as->dir);
    free(as);
}

int art_path(artstore *as, const char *hex, char *out, size_t outlen)
{
    if (!is_hex64(hex))
        return -1;
    int n = snprintf(out, outlen, "%s/sha256/%.2s/%s", as->dir, hex, hex);
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

void art_hex(const unsigned char *bytes, size_t n, char *hex)
{
    static const char h[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = h[bytes[i] >> 4];
        hex[2 * i + 1] = h[bytes[i] & 15];
    }
    hex[2 * n] = 0;
}

void art_sha256_buf(const void *buf, size_t len, char hex[65])
{
    unsigned char d[32];
    unsigned int dl = 0;
    if (!EVP_Digest(buf, len, d, &dl, EVP_sha256(), NULL) || dl != 32)
        memset(d, 0, sizeof d);
    art_hex(d, 32, hex);
}

/* Hash an open fd from offset 0. 0, or -1 with errno when the file could not be read
 * (which says nothing about its content). */
static int sha256_fd(int fd, char hex[65], int64_t *size)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
        EVP_MD_CTX_free(ctx);
        errno = ENOMEM;
        return -1;
    }
    size_t cap = 1 << 20;
    unsigned char *buf = malloc(cap);
    int64_t total = 0;
    int rc = buf ? 0 : -1, saved = buf ? 0 : ENOMEM;
    while (rc == 0) {
        ssize_t k = pread(fd, buf, cap, total);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            saved = errno;
            rc = -1;
            break;
        }
        if (k == 0)
            break;
        if (!EVP_DigestUpdate(ctx, buf, (size_t)k))
            rc = -1;
        total += k;
    }
    unsigned char d[32];
    unsigned int dl = 0;
    if (rc == 0 && (!EVP_DigestFinal_ex(ctx, d, &dl) || dl != 32))
        rc = -1;
    if (rc == 0) {
        art_hex(d, 32, hex);
        *size = total;
    }
    free(buf);
    EVP_MD_CTX_free(ctx);
    if (rc)
        errno = saved ? saved : EIO;
    return rc;
}

int art_sha256_file(const char *path, char hex[65], int64_t *size_bytes, char *err, size_t errlen)
{
    struct stat st;
    int fd = fio_open_regular(path, NULL, &st, err, errlen);
    if (fd < 0)
        return -1;
    int rc = sha256_fd(fd, hex, size_bytes);
    if (rc < 0)
        snprintf(err, errlen, "%s: read failed: %s", path, strerror(errno));
    close(fd);
    return rc;
}

int art_sha256_b64(const char hex[65], char *out, size_t outlen)
{
    if (!is_hex64(hex) || outlen < 45)
        return -1;
    unsigned char d[32];
    for (int i = 0; i < 32; i++) {
        int hi = hex[2 * i] <= '9' ? hex[2 * i] - '0' : hex[2 * i] - 'a' + 10;
        int lo = hex[2 * i + 1] <= '9' ? hex[2 * i + 1] - '0' : hex[2 * i + 1] - 'a' + 10;
        d[i] = (unsigned char)(hi * 16 + lo);
    }
    return EVP_EncodeBlock((unsigned char *)out, d, 32) == 44 ? 0 : -1;
}

/* ---- the remote copy (S3-compatible): written through, read through ------------------ */

static void remote_key(const char *hex, char key[80])
{
    snprintf(key, 80, "sha256/%s", hex);
}

/* After a local commit: the object is uploaded unless the remote holds it at this size
 * with this sha-256 stored beside it (x-amz-meta-sha256, as s3_put_file writes it). An
 * object of another size or sha-256, or without one (written by another tool), is
 * replaced: its key names content it may not hold. */
static int remote_put(artstore *as, const char *hex, int64_t size, char *err, size_t errlen)
{
    if (!as->remote)
        return 0;
    char key[80], path[4096], e[1024];
    s3_object have;
    remote_key(hex, key);
    int h = s3_head(as->remote, key, &have, e, sizeof e);
    if (h == 0 && have.size_bytes == size && !strcmp(have.sha256, hex))
        return 0;
    if (art_path(as, hex, path, sizeof path) < 0 || s3_put_file(as->remote, key, path, hex, NULL, e, sizeof e)) {
        snprintf(err, errlen, "artifact %s was stored here but not uploaded: %s", hex, e);
        return -1;
    }
    return 0;
}

int art_remote_sweep_uploads(artstore *as, int *aborted, char *err, size_t errlen)
{
    *aborted = 0;
    return as->remote ? s3_abort_stale_uploads(as->remote, "sha256/", ART_STALE_UPLOAD_S, aborted, err, errlen) : 0;
}

int art_push_remote(artstore *as, const char *hex, int64_t size_bytes, char *err, size_t errlen)
{
    if (!art_has(as, hex, size_bytes)) {
        snprintf(err, errlen, "artifact %s is not stored here", hex);
        return -1;
    }
    return remote_put(as, hex, size_bytes, err, errlen);
}

typedef struct {
    int fd;
    EVP_MD_CTX *md;
} fetch_sink;

static int fetch_write(void *user, const void *buf, size_t n)
{
    fetch_sink *f = user;
    return fio_write_all(f->fd, buf, n) < 0 || EVP_DigestUpdate(f->md, buf, n) != 1;
}

/* A blob missing here: its remote object copied in under a temporary name, checked
 * against its name and size, fsynced and renamed into place. One copy at a time, across
 * the server's threads and its workers (the lock file <hex>.fetching): the others wait
 * for it and find the blob here, or, when it failed, its reason (written into the lock
 * file, taken for ART_FETCH_FAILED_S) instead of failing the same way one after another.
 * 0, or -1 with err. */
#define ART_FETCH_FAILED_S 10.0
static int remote_fetch(artstore *as, const char *hex, int64_t size, char *err, size_t errlen)
{
    char key[80], dst[4096], dir[4096], tmp[4300], lockp[4300], e[1024];
    remote_key(hex, key);
    if (art_path(as, hex, dst, sizeof dst) < 0)
        return -1;
    snprintf(dir, sizeof dir, "%s/sha256/%.2s", as->dir, hex);
    pthread_mutex_lock(&as->mu);
    unsigned long k = ++as->fetches;
    pthread_mutex_unlock(&as->mu);
    snprintf(tmp, sizeof tmp, "%s.fetch.%ld.%lu", dst, (long)getpid(), k);
    snprintf(lockp, sizeof lockp, "%s.fetching", dst);
    if (fio_mkdirs(dir) < 0) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    int lk = fio_lock_file(lockp, err, errlen);
    if (lk < 0)
        return -1;
    struct stat have, ls;
    if (stat(dst, &have) == 0) {   /* copied in by the one this waited for (art_open_blob checks it) */
        fio_unlock_remove(lockp, lk);
        return 0;
    }
    /* the fetch this one waited for failed a moment ago: its reason, not the same wait again */
    char prev[1024];
    ssize_t pn = fstat(lk, &ls) == 0 && ls.st_size > 0 && (double)time(NULL) - (double)ls.st_mtime < ART_FETCH_FAILED_S
                     ? pread(lk, prev, sizeof prev - 1, 0) : 0;
    if (pn > 0) {
        prev[pn] = 0;
        snprintf(err, errlen, "%s", prev);
        close(lk);
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    fetch_sink f = {fd, EVP_MD_CTX_new()};
    int64_t got = 0;
    int rc = -1;
    if (fd < 0 || !f.md || EVP_DigestInit_ex(f.md, EVP_sha256(), NULL) != 1) {
        snprintf(err, errlen, "%s: %s", tmp, fd < 0 ? strerror(errno) : "out of memory");
    } else if (size > 0 && s3_get_range(as->remote, key, 0, size, fetch_write, &f, &got, e, sizeof e)) {
        snprintf(err, errlen, "artifact content %s is missing here and could not be fetched: %s", hex, e);
    } else {
        unsigned char d[32];
        unsigned int dl = 0;
        char got_hex[65];
        if (EVP_DigestFinal_ex(f.md, d, &dl) != 1 || dl != 32)
            d[0] = (unsigned char)~d[0];
        art_hex(d, 32, got_hex);
        if (got != size || strcmp(got_hex, hex))
            snprintf(err, errlen, "artifact content %s fetched from the remote store does not match its name "
                                  "(%lld bytes, sha-256 %s): not used", hex, (long long)got, got_hex);
        else if (fsync(fd) < 0)
            snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        else {
            persist_verified(as, fd, hex);   /* hashed as it was written */
            if (rename(tmp, dst) < 0 || fio_fsync_dir(dir) < 0)
                snprintf(err, errlen, "%s: %s", dst, strerror(errno));
            else
                rc = 0;
        }
    }
    if (fd >= 0)
        close(fd);
    if (rc)
        unlink(tmp);
    EVP_MD_CTX_free(f.md);
    if (rc == 0) {
        fio_unlock_remove(lockp, lk);
    } else {   /* the reason, for those waiting (the lock file stays; the sweep removes it) */
        if (ftruncate(lk, 0) < 0 || pwrite(lk, err, strlen(err), 0) < 0)
            (void)0;   /* best effort: a waiter then tries again itself */
        close(lk);
    }
    return rc;
}

int art_has_remote(const artstore *as)
{
    return as->remote != NULL;
}

int art_attach_remote(artstore *as, const char *url, const char *credentials_file, int allow_http, char *err,
                      size_t errlen)
{
    s3_options o = {.credentials_file = credentials_file && *credentials_file ? credentials_file : NULL,
                    .allow_http = allow_http};
    s3_client *c = s3_open(url, &o, err, errlen);
    if (!c)
        return -1;
    char e[1024];
    if (s3_head_bucket(c, e, sizeof e)) {
        snprintf(err, errlen, "%s: %s", url, e);
        s3_close(c);
        return -1;
    }
    s3_close(as->remote);
    as->remote = c;
    return 0;
}

int art_put(artstore *as, const char *src, char hex[65], int64_t *size_bytes, char *err, size_t errlen)
{
    if (art_sha256_file(src, hex, size_bytes, err, errlen) < 0)
        return -1;
    char dst[4096], dir[4096], tmp[4200];
    if (art_path(as, hex, dst, sizeof dst) < 0) {
        snprintf(err, errlen, "artifact path too long");
        return -1;
    }
    snprintf(dir, sizeof dir, "%s/sha256/%.2s", as->dir, hex);
    if (fio_mkdirs(dir) < 0) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    struct stat sb;
    int have_fd = open(dst, O_RDONLY | O_CLOEXEC | O_NONBLOCK);   /* a FIFO there must not block */
    if (have_fd >= 0 && fstat(have_fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == *size_bytes) {
        char have[65];
        int64_t n = 0;
        if (sha256_fd(have_fd, have, &n) < 0) {
            /* unread (EIO): not known to be bad, so not set aside */
            snprintf(err, errlen, "%s: %s", dst, strerror(errno));
            close(have_fd);
            return -1;
        }
        if (n == *size_bytes && !strcmp(have, hex)) {
            close(have_fd);
            return remote_put(as, hex, *size_bytes, err, errlen); /* the same content, stored intact */
        }
        (void)art_quarantine(as, hex, have_fd);   /* a stored copy that lost its content: set aside, then replaced */
    }
    if (have_fd >= 0)
        close(have_fd);
    if (fio_temp_name(tmp, sizeof tmp, dst)) {
        snprintf(err, errlen, "%s: path too long", dst);
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    if (fio_copy_into(src, fd) < 0 || fsync(fd) < 0) {
        snprintf(err, errlen, "copying %s: %s", src, strerror(errno));
        close(fd);
        unlink(tmp);
        return -1;
    }
    if (close(fd) < 0) {
        snprintf(err, errlen, "copying %s: %s", src, strerror(errno));
        unlink(tmp);
        return -1;
    }
    /* The copy must still be what was hashed (the source may have changed meanwhile). */
    char check[65] = "";
    int64_t sz = 0;
    if (art_sha256_file(tmp, check, &sz, err, errlen) < 0) {
        unlink(tmp);
        return -1;
    }
    if (strcmp(check, hex) != 0) {
        snprintf(err, errlen, "%s changed while it was being published", src);
        unlink(tmp);
        return -1;
    }
    int vfd = open(tmp, O_RDONLY | O_CLOEXEC);   /* just hashed: the content is hex's */
    if (vfd >= 0) {
        persist_verified(as, vfd, hex);
        close(vfd);
    }
    if (rename(tmp, dst) < 0 || fio_fsync_dir(dir) < 0) {
        snprintf(err, errlen, "%s: %s", dst, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return remote_put(as, hex, *size_bytes, err, errlen);
}

static int is_verified(artstore *as, const char *hex, const struct stat *sb)
{
    int v = 0;
    pthread_mutex_lock(&as->mu);
    for (int i = 0; i < as->nverified && !v; i++)
        v = !strcmp(as->verified[i].hex, hex) && same_state(&as->verified[i], sb);
    pthread_mutex_unlock(&as->mu);
    return v;
}

static void forget_verified(artstore *as, const char *hex)
{
    pthread_mutex_lock(&as->mu);
    for (int i = 0; i < as->nverified; i++)
        if (!strcmp(as->verified[i].hex, hex)) {
            as->verified[i] = as->verified[--as->nverified];
            break;
        }
    pthread_mutex_unlock(&as->mu);
}

static void mark_verified(artstore *as, const char *hex, const struct stat *sb)
{
    forget_verified(as, hex);
    pthread_mutex_lock(&as->mu);
    if (as->nverified == as->cap) {
        int nc = as->cap ? 2 * as->cap : 64;
        void *p = realloc(as->verified, (size_t)nc * sizeof *as->verified);
        if (!p) {
            pthread_mutex_unlock(&as->mu);
            return;
        }
        as->verified = p;
        as->cap = nc;
    }
    verified_blob *v = &as->verified[as->nverified++];
    memcpy(v->hex, hex, 65);
    v->ino = sb->st_ino;
    v->size = sb->st_size;
    v->mtime = sb->st_mtim;
    v->ctime = sb->st_ctim;
    pthread_mutex_unlock(&as->mu);
}

/* A blob's content checked against its name, said on the file itself for the store's other
 * processes and later runs (the server answering ranged downloads of what a worker
 * published would otherwise hash a multi-GB blob in a request thread): the name, and the
 * inode's size and mtime then, which a change of its content changes. Not its ctime,
 * which setting the attribute changes. Best effort: a file system without user xattrs
 * keeps only each process's own record (is_verified). The scrub hashes regardless. */
#define VERIFIED_XATTR "user.autocompress.verified"

static int verified_text(const char *hex, const struct stat *sb, char *out, size_t n)
{
    return snprintf(out, n, "%s %lld %lld.%09ld", hex, (long long)sb->st_size, (long long)sb->st_mtim.tv_sec,
                    (long)sb->st_mtim.tv_nsec);
}

/* Say on fd's file that its content is hex's, and record it in this process (after: the
 * attribute moves the file's ctime). */
static void persist_verified(artstore *as, int fd, const char *hex)
{
    struct stat sb;
    char v[128];
    if (fstat(fd, &sb) < 0)
        return;
    int n = verified_text(hex, &sb, v, sizeof v);
    (void)fsetxattr(fd, VERIFIED_XATTR, v, (size_t)n, 0);
    if (fstat(fd, &sb) == 0)
        mark_verified(as, hex, &sb);
}

/* 1 when fd's file says it was checked as hex's content, as it is now (sb). */
static int persisted_verified(int fd, const char *hex, const struct stat *sb)
{
    char want[128], got[128];
    int n = verified_text(hex, sb, want, sizeof want);
    ssize_t k = fgetxattr(fd, VERIFIED_XATTR, got, sizeof got);
    return k == n && !memcmp(want, got, (size_t)n);
}

/* The name a blob that failed its digest check is moved to. */
static int quarantine_path(artstore *as, const char *hex, char *out, size_t n)
{
    char p[4096];
    return art_path(as, hex, p, sizeof p) < 0 || snprintf(out, n, "%s.corrupt", p) >= (int)n ? -1 : 0;
}

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

int art_quarantine(artstore *as, const char *hex, int fd)
{
    char p[4096], q[4200];
    struct stat bad, now;
    if (art_path(as, hex, p, sizeof p) < 0 || quarantine_path(as, hex, q, sizeof q) < 0 || fstat(fd, &bad) < 0)
        return -1;
    forget_verified(as, hex);
    /* a publish may have repaired it since it was read: a good copy under its name stays */
    if (stat(p, &now) < 0)
        return errno == ENOENT ? 0 : -1;
    if (!same_file(&now, &bad))
        return 0;
    if (rename(p, q) < 0)
        return errno == ENOENT ? 0 : -1;
    /* a repair that landed between that look and the rename goes back under its name */
    if (stat(q, &now) == 0 && !same_file(&now, &bad) && renameat2(AT_FDCWD, q, AT_FDCWD, p, RENAME_NOREPLACE) < 0 &&
        errno != EEXIST)
        return -1;
    return 0;
}

int art_peek_blob(artstore *as, const char *hex, int64_t expected_size, char *err, size_t errlen)
{
    char path[4096], key[80], e[1024];
    struct stat sb;
    if (!as->remote || art_path(as, hex, path, sizeof path) < 0 || lstat(path, &sb) == 0 || errno != ENOENT)
        return art_open_blob(as, hex, expected_size, 0, err, errlen);
    s3_object o;
    remote_key(hex, key);
    int h = s3_head(as->remote, key, &o, e, sizeof e);
    if (h == 0 && o.size_bytes == expected_size && (!*o.sha256 || !strcmp(o.sha256, hex)))
        return ART_REMOTE_ONLY;
    if (h == 0)
        snprintf(err, errlen, "artifact content %s in the remote store does not match its name (%lld bytes, "
                              "sha-256 %s)", hex, (long long)o.size_bytes, *o.sha256 ? o.sha256 : "not stored");
    else if (h == 1)
        snprintf(err, errlen, "artifact content %s is missing here and from the remote store", hex);
    else
        snprintf(err, errlen, "artifact content %s is missing here and the remote store did not answer: %s", hex, e);
    return -1;
}

int art_open_blob(artstore *as, const char *hex, int64_t expected_size, int verify, char *err, size_t errlen)
{
    char path[4096];
    if (art_path(as, hex, path, sizeof path) < 0) {
        snprintf(err, errlen, "not a sha-256 digest");
        return -1;
    }
    struct stat sb;
    char why[64];
    int fd = fio_open_regular(path, NULL, &sb, why, sizeof why);
    if (fd < 0 && errno == ENOENT && as->remote) {
        if (remote_fetch(as, hex, expected_size, err, errlen))
            return -1;
        fd = fio_open_regular(path, NULL, &sb, why, sizeof why);
    }
    if (fd < 0) {
        char q[4200];
        struct stat qs;
        if (errno == ENOENT && !quarantine_path(as, hex, q, sizeof q) && !stat(q, &qs))
            snprintf(err, errlen, "artifact content %s failed its sha-256 check and was set aside", hex);
        else if (errno == EINVAL)
            snprintf(err, errlen, "artifact content %s is not a regular file in the store", hex);
        else
            snprintf(err, errlen, "artifact content %s is missing: %s", hex, strerror(errno));
        return -1;
    }
    if (sb.st_size != expected_size) {
        snprintf(err, errlen, "artifact content %s has the wrong size", hex);
        close(fd);
        return -1;
    }
    if (!verify || is_verified(as, hex, &sb))
        return fd;
    if (persisted_verified(fd, hex, &sb)) {
        mark_verified(as, hex, &sb);
    } else {
        char got[65];
        int64_t sz;
        if (sha256_fd(fd, got, &sz) < 0) {
            /* unread: not known to be bad, so not set aside */
            snprintf(err, errlen, "artifact content %s could not be read: %s", hex, strerror(errno));
            close(fd);
            return -1;
        }
        if (strcmp(got, hex) != 0) {
            snprintf(err, errlen, "artifact content %s is corrupt (sha-256 mismatch); it was set aside", hex);
            (void)art_quarantine(as, hex, fd);
            close(fd);
            return -1;
        }
        persist_verified(as, fd, hex);
    }
    return fd;
}

int art_lock(artstore *as, int exclusive, double wait_s, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/.publish.lock", as->dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    int op = exclusive ? LOCK_EX : LOCK_SH, rc;
    double until = wait_s >= 0 ? eng_wall_s() + wait_s : 0;
    while ((rc = flock(fd, op | (wait_s >= 0 ? LOCK_NB : 0))) < 0 &&
           (errno == EINTR || (errno == EWOULDBLOCK && wait_s >= 0 && eng_wall_s() < until)))
        if (errno == EWOULDBLOCK)
            usleep(20 * 1000);
    if (rc < 0) {
        int busy = errno == EWOULDBLOCK;
        if (busy)
            snprintf(err, errlen, "the artifact store is busy publishing (the lock was held past %.0f s)", wait_s);
        else
            snprintf(err, errlen, "%s: flock: %s", path, strerror(errno));
        close(fd);
        return busy ? -2 : -1;
    }
    return fd;
}

void art_unlock(int fd)
{
    if (fd >= 0)
        close(fd);   /* releases the flock */
}

int art_has(artstore *as, const char *hex, int64_t size_bytes)
{
    char path[4096];
    struct stat sb;
    return art_path(as, hex, path, sizeof path) == 0 && stat(path, &sb) == 0 && S_ISREG(sb.st_mode) &&
           sb.st_size == size_bytes;
}

int art_remove(artstore *as, const char *hex)
{
    char path[4096];
    if (art_path(as, hex, path, sizeof path) < 0)
        return -1;
    if (unlink(path) < 0 && errno != ENOENT)
        return -1;
    char q[4200];
    if (!quarantine_path(as, hex, q, sizeof q))
        (void)unlink(q);   /* a set-aside copy goes with its last reference */
    forget_verified(as, hex);
    return 0;
}

/* ---- streaming with verification ---------------------------------------------------- */

struct art_stream {
    artstore *as;
    char hex[65];
    int fd;
    int64_t off, len;
    int verify;              /* the whole blob: hash it on the way */
    uint64_t hashed;         /* bytes hashed so far (positions must come in order) */
    EVP_MD_CTX *md;
};

art_stream *art_stream_new(artstore *as, const char *hex, int fd, int64_t off, int64_t len, int64_t size)
{
    art_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->as = as;
    snprintf(s->hex, sizeof s->hex, "%s", hex);
    s->fd = fd;
    s->off = off;
    s->len = len;
    s->verify = off == 0 && len == size && len > 0;
    if (s->verify && (!(s->md = EVP_MD_CTX_new()) || !EVP_DigestInit_ex(s->md, EVP_sha256(), NULL))) {
        EVP_MD_CTX_free(s->md);
        free(s);
        return NULL;
    }
    return s;
}

ssize_t art_stream_read(art_stream *s, uint64_t pos, char *buf, size_t max)
{
    if (pos >= (uint64_t)s->len)
        return 0;
    size_t want = (uint64_t)s->len - pos < max ? (size_t)((uint64_t)s->len - pos) : max;
    ssize_t k;
    do
        k = pread(s->fd, buf, want, s->off + (off_t)pos);
    while (k < 0 && errno == EINTR);
    if (k <= 0)
        return -1;   /* an error, or the blob shrank under us */
    if (s->verify && pos != s->hashed)
        return -1;   /* out of order: a whole download is checked on the way, so it is read in order or not at all */
    if (s->verify) {
        if (!EVP_DigestUpdate(s->md, buf, (size_t)k))
            return -1;
        s->hashed += (uint64_t)k;
        if (s->hashed == (uint64_t)s->len) {
            /* the last chunk goes out only when the whole blob matches its name */
            unsigned char d[32];
            unsigned dl = 0;
            char got[65];
            if (!EVP_DigestFinal_ex(s->md, d, &dl) || dl != 32)
                return -1;
            for (int i = 0; i < 32; i++)
                snprintf(got + 2 * i, 3, "%02x", d[i]);
            if (strcmp(got, s->hex)) {
                (void)art_quarantine(s->as, s->hex, s->fd);
                return -1;
            }
        }
    }
    return k;
}

int art_stream_verified(const art_stream *s)
{
    return s->verify;
}

void art_stream_free(art_stream *s)
{
    if (!s)
        return;
    if (s->fd >= 0)
        close(s->fd);
    EVP_MD_CTX_free(s->md);
    free(s);
}

/* ---- scrub and sweep ------------------------------------------------------------------- */

/* Call fn on every entry of every ROOT/sha256/<two hex> folder (the folder's path and the
 * entry's name). 0, or -1 when the store cannot be listed. */
static int walk_store(artstore *as, void (*fn)(artstore *, const char *, const char *, void *), void *ud)
{
    char top[4096];
    snprintf(top, sizeof top, "%s/sha256", as->dir);
    DIR *d = opendir(top);
    if (!d)
        return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strlen(e->d_name) != 2 || !strchr("0123456789abcdef", e->d_name[0]) ||
            !strchr("0123456789abcdef", e->d_name[1]))
            continue;
        char sub[4200];
        if (fio_path_join(sub, sizeof sub, top, e->d_name) < 0)
            continue;
        DIR *d2 = opendir(sub);
        if (!d2)
            continue;
        struct dirent *f;
        while ((f = readdir(d2)))
            if (f->d_name[0] != '.')
                fn(as, sub, f->d_name, ud);
        closedir(d2);
    }
    closedir(d);
    return 0;
}

typedef struct {
    int checked, bad;
    int64_t swept, swept_bytes;
} walk_counts;

/* A temporary file of a writer that is gone: <hex>.tmp.<pid>.<n> (art_put) or
 * <hex>.fetch.<pid>.<n> (remote_fetch), its process no longer alive and the file untouched
 * for ART_STALE_TEMP_S (the age also covers a writer in another PID namespace that shares
 * the folder). A writer killed mid-copy leaves one, and nothing else removes it; so are
 * the lock files of fetches (<hex>.fetching, sweep_fetch_lock). */
#define ART_STALE_TEMP_S 600

/* A fetch's lock file (remote_fetch) that no fetch holds and nobody touched for
 * ART_STALE_TEMP_S: removed while locked, so that a fetch starting meanwhile opens afresh. */
static void sweep_fetch_lock(const char *path, walk_counts *c)
{
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    struct stat sb;
    if (fd < 0)
        return;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
        store_now() - sb.st_mtime >= ART_STALE_TEMP_S && unlink(path) == 0)
        c->swept++;
    close(fd);
}

static void sweep_one(artstore *as, const char *sub, const char *name, void *ud)
{
    (void)as;
    walk_counts *c = ud;
    const char *dot = strchr(name, '.');
    if (!dot || dot - name != 64)
        return;
    if (!strcmp(dot, ".fetching")) {
        char path[4400];
        if (fio_path_join(path, sizeof path, sub, name) == 0)
            sweep_fetch_lock(path, c);
        return;
    }
    const char *num = !strncmp(dot, ".tmp.", 5) ? dot + 5 : !strncmp(dot, ".fetch.", 7) ? dot + 7 : NULL;
    char *end;
    long pid = num ? strtol(num, &end, 10) : 0;
    if (!num || pid <= 0 || end == num || (kill((pid_t)pid, 0) == 0 || errno != ESRCH))
        return;
    char path[4400];
    struct stat sb;
    if (fio_path_join(path, sizeof path, sub, name) < 0 || lstat(path, &sb) < 0 || !S_ISREG(sb.st_mode) ||
        store_now() - sb.st_mtime < ART_STALE_TEMP_S)
        return;
    if (unlink(path) == 0) {
        c->swept++;
        c->swept_bytes += (int64_t)sb.st_blocks * 512;
    }
}

static void scrub_one(artstore *as, const char *sub, const char *name, void *ud)
{
    walk_counts *c = ud;
    if (!is_hex64(name)) {
        sweep_one(as, sub, name, ud);
        return;
    }
    if (strncmp(name, sub + strlen(sub) - 2, 2))
        return;   /* not where its name puts it: not a blob of this store */
    char path[4400], got[65];
    if (fio_path_join(path, sizeof path, sub, name) < 0)
        return;
    struct stat sb;
    char why[64];
    int64_t sz;
    int fd = fio_open_regular(path, NULL, &sb, why, sizeof why);
    if (fd < 0)
        return;   /* removed meanwhile, or not a file: not a blob to check */
    if (sha256_fd(fd, got, &sz) < 0) {
        close(fd);
        return;   /* unread: not known to be bad; the next pass reads it again */
    }
    c->checked++;
    if (!strcmp(got, name)) {
        persist_verified(as, fd, name);
    } else {
        c->bad++;
        (void)art_quarantine(as, name, fd);
    }
    close(fd);
}

int art_scrub(artstore *as, int *checked, int *bad)
{
    walk_counts c = {0, 0, 0, 0};
    int rc = walk_store(as, scrub_one, &c);
    *checked = c.checked;
    *bad = c.bad;
    return rc;
}

int art_sweep_temp(artstore *as, int64_t *files, int64_t *bytes)
{
    walk_counts c = {0, 0, 0, 0};
    int rc = walk_store(as, sweep_one, &c);
    *files = c.swept;
    *bytes = c.swept_bytes;
    return rc;
}
