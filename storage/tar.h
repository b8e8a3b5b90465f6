/* storage/tar.h — a streaming POSIX ustar writer, used to package an exported HF
 * directory as one downloadable artifact and a stage's outputs for another host, and the
 * reader that unpacks the latter (regular files and folders only, never outside the
 * destination).
 *
 * Files are copied into the archive in fixed-size chunks (never read whole). Names longer
 * than 100 bytes are split into ustar's prefix/name fields (up to 255 bytes in all); a
 * file larger than ustar's 8 GiB octal limit gets a GNU base-256 size field, which GNU
 * tar and Python's tarfile read. The archive is written to "PATH.tmp", fsynced and
 * renamed on tar_close, so a half-written archive is never visible under PATH.
 */
#ifndef AC_STORAGE_TAR_H
#define AC_STORAGE_TAR_H

#include <stddef.h>
#include <stdint.h>

typedef struct tar_writer tar_writer;

/* Start an archive at `path` (written as path.tmp until tar_close). Every member gets
 * modification time `mtime` (Unix seconds; a fixed value makes archives reproducible).
 * Returns a new writer, or NULL with a reason in err. */
tar_writer *tar_open(const char *path, int64_t mtime, char *err, size_t errlen);

/* Append the regular file `src_path` as member `name` (mode 0644), streaming its bytes.
 * Returns 0, or -1 with a reason in err (name too long, unreadable file, write error,
 * the file changed size while being copied). After a failure call tar_abort. */
int tar_add_file(tar_writer *t, const char *name, const char *src_path, char *err, size_t errlen);
/* Ask fn(arg) before each MiB copied: nonzero fails the member being added with "cancelled"
 * in err (then tar_abort). fn NULL: never. */
void tar_set_cancel(tar_writer *t, int (*fn)(void *arg), void *arg);

/* Append a directory entry `name` (a trailing '/' is added). Returns 0 or -1. */
int tar_add_dir(tar_writer *t, const char *name, char *err, size_t errlen);

/* Append every regular file directly inside directory `dir` (sorted by name, no
 * recursion; sub-directories are an error) as "PREFIX/filename", after a directory entry
 * for PREFIX. Returns 0, or -1 with a reason in err. */
int tar_add_tree(tar_writer *t, const char *prefix, const char *dir, char *err, size_t errlen);

/* Append folder `dir` whole as PREFIX: its files and sub-folders, recursively, each
 * folder's names sorted, but for the entries directly inside dir named in skip
 * (NULL-terminated; NULL: none). Anything but regular files and folders (links, devices)
 * is an error. Returns 0, or -1 with a reason in err. */
int tar_add_all(tar_writer *t, const char *prefix, const char *dir, const char *const *skip, char *err,
                size_t errlen);
/* Unpack the archive read from fd into the existing folder dest: folders and regular
 * files (created, never overwritten), up to the closing zero block. A member named with
 * an absolute path or a "." or ".." component, another member type, a damaged header or a
 * truncated archive is an error. Each file, and each folder up to dest that got an entry,
 * is fsynced before the next member, so what it returned having unpacked survives a power
 * loss. Returns 0, or -1 with a reason in err (what was unpacked before stays: unpack into
 * a fresh folder). */
int tar_extract(int fd, const char *dest, char *err, size_t errlen);

/* Finish the archive (two zero blocks), fsync, rename path.tmp to path and free the
 * writer. Returns 0, or -1 with a reason in err (the temporary file is removed). The
 * writer is freed in both cases. */
int tar_close(tar_writer *t, char *err, size_t errlen);

/* Discard a partial archive: remove path.tmp and free the writer. Safe on NULL. */
void tar_abort(tar_writer *t);

#endif
