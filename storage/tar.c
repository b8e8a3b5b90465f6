/* storage/tar.c — streaming POSIX ustar writer and reader (see tar.h).
 *
 * Layout: per member a 512-byte header, the data padded to 512 bytes; two zero blocks
 * close the archive. Only regular files and directories are written or read.
 */
#include "storage/tar.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/fileio.h"

#define TAR_BLOCK 512
#define TAR_CHUNK (1 << 20)

struct tar_writer {
    int fd;
    int64_t mtime;
    char *path, *tmp;
    unsigned char *buf;      /* TAR_CHUNK bytes for copying */
    int (*cancelled)(void *arg);
    void *cancel_arg;
};

void tar_set_cancel(tar_writer *t, int (*fn)(void *arg), void *arg)
{
    t->cancelled = fn;
    t->cancel_arg = arg;
}

/* Octal field of width w (w-1 digits + NUL). Returns -1 when the value does not fit. */
static int put_octal(char *field, size_t w, uint64_t v)
{
    field[w - 1] = '\0';
    for (size_t i = w - 1; i-- > 0;) {
        field[i] = (char)('0' + (v & 7));
        v >>= 3;
    }
    return v ? -1 : 0;
}

/* GNU base-256 for sizes past the 11-digit octal limit: high bit set, big-endian. */
static void put_base256(char *field, size_t w, uint64_t v)
{
    memset(field, 0, w);
    for (size_t i = w; i-- > 1;) {
        field[i] = (char)(v & 0xff);
        v >>= 8;
    }
    field[0] = (char)0x80;
}

/* Split name into ustar name (<=100) and prefix (<=155) at a '/'. */
static int split_name(const char *name, char out_name[100], char out_prefix[155])
{
    size_t n = strlen(name);
    memset(out_name, 0, 100);
    memset(out_prefix, 0, 155);
    if (n == 0)
        return -1;
    if (n <= 100) {
        memcpy(out_name, name, n);
        return 0;
    }
    for (size_t i = n; i-- > 0;) {
        if (name[i] != '/')
            continue;
        size_t plen = i, nlen = n - i - 1;
        if (plen <= 155 && nlen <= 100 && nlen > 0) {
            memcpy(out_prefix, name, plen);
            memcpy(out_name, name + i + 1, nlen);
            return 0;
        }
    }
    return -1;
}

static int write_header(tar_writer *t, const char *name, char type, uint64_t size, int mode,
                        char *err, size_t errlen)
{
    unsigned char h[TAR_BLOCK];
    memset(h, 0, sizeof h);
    char nm[100], prefix[155];
    if (split_name(name, nm, prefix) < 0) {
        snprintf(err, errlen, "tar: member name '%s' does not fit ustar (100+155 bytes)", name);
        return -1;
    }
    memcpy(h + 0, nm, 100);
    put_octal((char *)h + 100, 8, (uint64_t)mode);
    put_octal((char *)h + 108, 8, 0);
    put_octal((char *)h + 116, 8, 0);
    if (put_octal((char *)h + 124, 12, size) < 0)
        put_base256((char *)h + 124, 12, size);
    if (put_octal((char *)h + 136, 12, t->mtime < 0 ? 0 : (uint64_t)t->mtime) < 0) {
        snprintf(err, errlen, "tar: mtime out of range");
        return -1;
    }
    h[156] = (unsigned char)type;
    memcpy(h + 257, "ustar", 6);     /* magic "ustar\0" */
    memcpy(h + 263, "00", 2);        /* version */
    memcpy(h + 265, "root", 4);      /* uname */
    memcpy(h + 297, "root", 4);      /* gname */
    memcpy(h + 345, prefix, 155);
    memset(h + 148, ' ', 8);         /* checksum computed with its own field as spaces */
    unsigned sum = 0;
    for (int i = 0; i < TAR_BLOCK; i++)
        sum += h[i];
    put_octal((char *)h + 148, 7, sum);
    h[155] = ' ';
    if (fio_write_all(t->fd, h, sizeof h) < 0) {
        snprintf(err, errlen, "tar: write %s: %s", t->tmp, strerror(errno));
        return -1;
    }
    return 0;
}

tar_writer *tar_open(const char *path, int64_t mtime, char *err, size_t errlen)
{
    tar_writer *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "tar: out of memory");
        return NULL;
    }
    t->fd = -1;
    t->mtime = mtime;
    size_t n = strlen(path);
    t->path = strdup(path);
    t->tmp = malloc(n + 64);
    t->buf = malloc(TAR_CHUNK);
    if (!t->path || !t->tmp || !t->buf || fio_temp_name(t->tmp, n + 64, path) < 0) {
        snprintf(err, errlen, "tar: out of memory");
        goto fail;
    }
    /* a name of its own: two writers of one path never write into one file */
    t->fd = open(t->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (t->fd < 0) {
        snprintf(err, errlen, "tar: create %s: %s", t->tmp, strerror(errno));
        goto fail;
    }
    return t;
fail:
    free(t->path);
    free(t->tmp);
    free(t->buf);
    free(t);
    return NULL;
}

static int pad_block(tar_writer *t, uint64_t size, char *err, size_t errlen)
{
    static const unsigned char zeros[TAR_BLOCK];
    size_t rem = (size_t)(size % TAR_BLOCK);
    if (rem && fio_write_all(t->fd, zeros, TAR_BLOCK - rem) < 0) {
        snprintf(err, errlen, "tar: write %s: %s", t->tmp, strerror(errno));
        return -1;
    }
    return 0;
}

int tar_add_file(tar_writer *t, const char *name, const char *src_path, char *err, size_t errlen)
{
    int fd = open(src_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "tar: open %s: %s", src_path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "tar: %s is not a regular file", src_path);
        close(fd);
        return -1;
    }
    uint64_t size = (uint64_t)st.st_size, copied = 0;
    if (write_header(t, name, '0', size, 0644, err, errlen) < 0) {
        close(fd);
        return -1;
    }
    while (copied < size) {
        if (t->cancelled && t->cancelled(t->cancel_arg)) {
            snprintf(err, errlen, "tar: cancelled");
            close(fd);
            return -1;
        }
        size_t want = size - copied < TAR_CHUNK ? (size_t)(size - copied) : TAR_CHUNK;
        ssize_t r = read(fd, t->buf, want);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            snprintf(err, errlen, "tar: read %s: %s", src_path,
                     r < 0 ? strerror(errno) : "file shrank while being archived");
            close(fd);
            return -1;
        }
        if (fio_write_all(t->fd, t->buf, (size_t)r) < 0) {
            snprintf(err, errlen, "tar: write %s: %s", t->tmp, strerror(errno));
            close(fd);
            return -1;
        }
        copied += (uint64_t)r;
    }
    close(fd);
    return pad_block(t, size, err, errlen);
}

int tar_add_dir(tar_writer *t, const char *name, char *err, size_t errlen)
{
    size_t n = strlen(name);
    char *d = malloc(n + 2);
    if (!d) {
        snprintf(err, errlen, "tar: out of memory");
        return -1;
    }
    memcpy(d, name, n);
    d[n] = '/';
    d[n + 1] = '\0';
    if (n > 0 && name[n - 1] == '/')
        d[n] = '\0';
    int rc = write_header(t, d, '5', 0, 0755, err, errlen);
    free(d);
    return rc;
}

static int named(const char *const *names, const char *name)
{
    for (int i = 0; names && names[i]; i++)
        if (!strcmp(names[i], name))
            return 1;
    return 0;
}

/* The folder dir as PREFIX: its regular files, and with `recursive` its sub-folders
 * whole (tar_add_tree, tar_add_all), but for the entries named in skip (NULL: none). */
static int add_folder(tar_writer *t, const char *prefix, const char *dir, int recursive, const char *const *skip,
                      char *err, size_t errlen)
{
    char **names;
    size_t n;
    if (fio_list_dir(dir, &names, &n) < 0) {
        snprintf(err, errlen, "tar: open directory %s: %s", dir, strerror(errno));
        return -1;
    }
    int rc = -1;
    if (tar_add_dir(t, prefix, err, errlen) < 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        char src[4096], member[1024];
        if (named(skip, names[i]))
            continue;
        int a = snprintf(src, sizeof src, "%s/%s", dir, names[i]);
        int b = snprintf(member, sizeof member, "%s/%s", prefix, names[i]);
        if (a < 0 || (size_t)a >= sizeof src || b < 0 || (size_t)b >= sizeof member) {
            snprintf(err, errlen, "tar: path too long: %s/%s", dir, names[i]);
            goto out;
        }
        struct stat st;
        int r = -1;
        if ((recursive ? lstat(src, &st) : stat(src, &st)) < 0)   /* a whole tree keeps no links */
            snprintf(err, errlen, "tar: %s: %s", src, strerror(errno));
        else if (S_ISREG(st.st_mode))
            r = tar_add_file(t, member, src, err, errlen);
        else if (S_ISDIR(st.st_mode) && recursive)
            r = add_folder(t, member, src, 1, NULL, err, errlen);
        else
            snprintf(err, errlen, "tar: %s is not a regular file%s", src,
                     recursive ? " or a folder" : " (sub-directories are not packaged)");
        if (r < 0)
            goto out;
    }
    rc = 0;
out:
    fio_names_free(names, n);
    return rc;
}

int tar_add_tree(tar_writer *t, const char *prefix, const char *dir, char *err, size_t errlen)
{
    return add_folder(t, prefix, dir, 0, NULL, err, errlen);
}

int tar_add_all(tar_writer *t, const char *prefix, const char *dir, const char *const *skip, char *err,
                size_t errlen)
{
    return add_folder(t, prefix, dir, 1, skip, err, errlen);
}

static void tar_free(tar_writer *t)
{
    if (t->fd >= 0)
        close(t->fd);
    free(t->path);
    free(t->tmp);
    free(t->buf);
    free(t);
}

int tar_close(tar_writer *t, char *err, size_t errlen)
{
    static const unsigned char zeros[2 * TAR_BLOCK];
    int rc = -1;
    if (fio_write_all(t->fd, zeros, sizeof zeros) < 0) {
        snprintf(err, errlen, "tar: write %s: %s", t->tmp, strerror(errno));
    } else if (fsync(t->fd) < 0) {
        snprintf(err, errlen, "tar: fsync %s: %s", t->tmp, strerror(errno));
    } else if (close(t->fd) < 0) {
        t->fd = -1;
        snprintf(err, errlen, "tar: close %s: %s", t->tmp, strerror(errno));
    } else {
        t->fd = -1;
        if (rename(t->tmp, t->path) < 0) {
            snprintf(err, errlen, "tar: rename %s: %s", t->tmp, strerror(errno));
        } else {
            (void)fio_fsync_parent(t->path);   /* the rename durable (best effort, as fio_write_atomic) */
            rc = 0;
        }
    }
    if (rc < 0)
        unlink(t->tmp);
    tar_free(t);
    return rc;
}

void tar_abort(tar_writer *t)
{
    if (!t)
        return;
    if (t->fd >= 0) {
        close(t->fd);
        t->fd = -1;
    }
    unlink(t->tmp);
    tar_free(t);
}

/* ---- the reader ------------------------------------------------------------------------ */

/* Read exactly n bytes. 0, or -1 (errno; 0 at a premature end of the stream). */
static int read_full(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = 0;
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* A numeric header field: octal digits (space or NUL ended) or GNU base-256, positive
 * (first byte 0x80) and below 2^62, so that a size plus its padding cannot wrap. */
static int get_number(const unsigned char *f, size_t w, uint64_t *out)
{
    uint64_t v = 0;
    if (f[0] & 0x80) {
        if (f[0] != 0x80)
            return -1;   /* negative, or bits beyond the field's width */
        for (size_t i = 1; i < w; i++) {
            if (v >> 54)
                return -1;
            v = v << 8 | f[i];
        }
        *out = v;
        return 0;
    }
    size_t i = 0;
    while (i < w && f[i] == ' ')
        i++;
    for (; i < w && f[i] >= '0' && f[i] <= '7'; i++) {
        if (v >> 60)
            return -1;
        v = v << 3 | (uint64_t)(f[i] - '0');
    }
    if (i < w && f[i] != 0 && f[i] != ' ')
        return -1;
    *out = v;
    return 0;
}

/* A member name that stays inside the destination: relative, no "." or ".." component. */
static int name_safe(const char *name)
{
    if (!name[0] || name[0] == '/')
        return 0;
    for (const char *s = name; *s;) {
        const char *e = strchr(s, '/');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.') || (len == 0 && e && e[1]))
            return 0;
        s += len + (e ? 1 : 0);
    }
    return 1;
}

/* Copy size bytes of member data from fd to a new file at path, then skip the padding. */
static int extract_file(int fd, const char *path, uint64_t size, unsigned char *buf, char *err, size_t errlen)
{
    int out = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out < 0) {
        snprintf(err, errlen, "tar: create %s: %s", path, strerror(errno));
        return -1;
    }
    uint64_t left = size + (TAR_BLOCK - size % TAR_BLOCK) % TAR_BLOCK, data = size;
    int rc = 0;
    while (left > 0 && rc == 0) {
        size_t k = left < TAR_CHUNK ? (size_t)left : TAR_CHUNK;
        if (read_full(fd, buf, k) < 0) {
            snprintf(err, errlen, "tar: %s", errno ? strerror(errno) : "the archive ends inside a member");
            rc = -1;
        } else if (data > 0 && fio_write_all(out, buf, data < k ? (size_t)data : k) < 0) {
            snprintf(err, errlen, "tar: write %s: %s", path, strerror(errno));
            rc = -1;
        }
        data -= data < k ? data : k;
        left -= k;
    }
    if (rc == 0 && fsync(out) < 0) {
        snprintf(err, errlen, "tar: fsync %s: %s", path, strerror(errno));
        rc = -1;
    }
    if (close(out) < 0 && rc == 0) {
        snprintf(err, errlen, "tar: close %s: %s", path, strerror(errno));
        rc = -1;
    }
    return rc;
}

/* Make dir's new entries durable: dir itself, and each folder from it up to dest (any of
 * them may be new). 0, or -1 with err. */
static int sync_up_to(const char *dir, const char *dest, char *err, size_t errlen)
{
    char d[4400];
    snprintf(d, sizeof d, "%s", dir);
    size_t stop = strlen(dest);
    for (;;) {
        if (fio_fsync_dir(d) < 0) {
            snprintf(err, errlen, "tar: fsync %s: %s", d, strerror(errno));
            return -1;
        }
        char *slash = strrchr(d, '/');
        if (strlen(d) <= stop || !slash)
            return 0;
        *slash = 0;
    }
}

int tar_extract(int fd, const char *dest, char *err, size_t errlen)
{
    unsigned char *buf = malloc(TAR_CHUNK);
    if (!buf) {
        snprintf(err, errlen, "tar: out of memory");
        return -1;
    }
    int rc = -1;
    for (;;) {
        unsigned char h[TAR_BLOCK];
        if (read_full(fd, h, sizeof h) < 0) {
            snprintf(err, errlen, "tar: %s", errno ? strerror(errno) : "the archive ends without its closing blocks");
            break;
        }
        int zero = 1;
        for (int i = 0; i < TAR_BLOCK && zero; i++)
            zero = h[i] == 0;
        if (zero) {
            rc = 0;
            break;
        }
        uint64_t sum = 0, want, size;
        for (int i = 0; i < TAR_BLOCK; i++)
            sum += i >= 148 && i < 156 ? ' ' : h[i];
        char name[260];
        snprintf(name, sizeof name, "%.155s%s%.100s", (const char *)h + 345, h[345] ? "/" : "", (const char *)h);
        size_t nl = strlen(name);
        while (nl > 1 && name[nl - 1] == '/')   /* a folder's trailing slash */
            name[--nl] = 0;
        if (get_number(h + 148, 8, &want) < 0 || want != sum || get_number(h + 124, 12, &size) < 0) {
            snprintf(err, errlen, "tar: a damaged header (member '%s')", name);
            break;
        }
        if (!name_safe(name)) {
            snprintf(err, errlen, "tar: member '%s' would land outside the destination", name);
            break;
        }
        char path[4400];
        if (snprintf(path, sizeof path, "%s/%s", dest, name) >= (int)sizeof path) {
            snprintf(err, errlen, "tar: path too long: %s/%s", dest, name);
            break;
        }
        char dir[4400];
        fio_dir_of(path, dir, sizeof dir);
        if (h[156] == '5') {
            if (fio_mkdirs(path) < 0) {
                snprintf(err, errlen, "tar: mkdir %s: %s", path, strerror(errno));
                break;
            }
            if (sync_up_to(path, dest, err, errlen) < 0)
                break;
        } else if (h[156] == '0' || h[156] == 0) {
            if (fio_mkdirs(dir) < 0) {
                snprintf(err, errlen, "tar: mkdir %s: %s", dir, strerror(errno));
                break;
            }
            if (extract_file(fd, path, size, buf, err, errlen) < 0 || sync_up_to(dir, dest, err, errlen) < 0)
                break;
        } else {
            snprintf(err, errlen, "tar: member '%s' is neither a file nor a folder (type '%c')", name, h[156]);
            break;
        }
    }
    free(buf);
    return rc;
}
