/* storage/fileio.h — file I/O shared by every layer that touches files: read-only
 * memory maps for the model readers (safetensors, GGUF, llama2.c), whole-file reads,
 * atomic writes (temporary file, fsync, rename, fsync of the folder) so nothing
 * half-written is ever loaded, and the small path and folder helpers around them. What
 * the bytes mean is the caller's business.
 */
#ifndef AC_STORAGE_FMAP_H
#define AC_STORAGE_FMAP_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <jansson.h>

/* Map `path` read-only (MAP_PRIVATE). The file must be a regular file of at least
 * `min_len` bytes; otherwise err reads "PATH: not WHAT (too short: N bytes)" or "PATH: not
 * WHAT (a FIFO, not a regular file)" with `what` (e.g. "a GGUF file"), or "PATH: too short
 * (N bytes)" or "PATH: not a regular file (a FIFO)" when what is NULL. A FIFO or a device is
 * refused before anything is read from it (it never blocks the caller).
 * An empty file (allowed when min_len is 0) gives *map = NULL, *len = 0.
 * Returns 0 with a new map in *map and *len (release with fio_unmap), or -1 with a message
 * in err (*map = NULL, *len = 0, nothing held). */
int fio_map(const char *path, size_t min_len, const char *what, void **map, size_t *len, char *err,
              size_t errlen);

/* A read of a file map that survives the file shrinking under it. The map's length is the
 * file's at fio_map; if another process truncates or rewrites the file in place later, a
 * read past its new end raises SIGBUS, which would kill the process. Between
 * fio_guard_enter and fio_guard_leave a SIGBUS of this thread jumps back to the guard's
 * sigsetjmp (which returns 1) instead; elsewhere the handler that was there before acts.
 *
 *     fio_guard g;
 *     if (sigsetjmp(g.jb, 1))
 *         return <the file ended under the read>;   (the guard is already left)
 *     fio_guard_enter(&g);
 *     ... read the map ...
 *     fio_guard_leave(&g);
 */
typedef struct fio_guard {
    sigjmp_buf jb;
    struct fio_guard *prev;
} fio_guard;
void fio_guard_enter(fio_guard *g);
void fio_guard_leave(fio_guard *g);

/* What a file of mode m that is not a regular one is, for messages: "a FIFO", "a directory",
 * "a character device", "a block device", "a socket", or "not a plain file". */
const char *fio_file_kind(mode_t m);

/* Give back the pages of [p, p + n) inside the map (map, len) from fio_map, once a reader
 * has copied them out: a reader that converts a whole file into its own buffers then holds
 * one copy, not two (the map's pages count in the process's RSS). A later read of the range
 * faults the file's bytes back in. The readers release in steps of FIO_RELEASE_STEP bytes.
 * A NULL map (a memory image) is a no-op. */
#define FIO_RELEASE_STEP ((size_t)4 << 20)
void fio_map_release(const void *map, size_t len, const void *p, size_t n);

/* Unmap a map from fio_map. A NULL map is a no-op. */
void fio_unmap(void *map, size_t len);

/* Append " [PATH]" to the message already in err when it fits (for parse errors that do
 * not name the file). */
void fio_err_path(char *err, size_t errlen, const char *path);

/* Read all of `path`, a regular file, into a new NUL-terminated buffer (the NUL is not
 * counted in *len). A file of max_bytes bytes or more is refused (max_bytes 0: no limit), and
 * so is anything but a regular file (a FIFO, a device: nothing is read from it). Returns the
 * buffer (caller frees), or NULL with "PATH: <strerror>", "PATH: not a regular file (a
 * FIFO)", "PATH: larger than N bytes", "PATH: out of memory" or "PATH: read error" in err. */
char *fio_read_all(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);

/* A file named on a command line or in a server's own settings, read whole as fio_read_all
 * does, except that a pipe or FIFO (`<(zcat ...)`, a secret handed over by a pipe) is read
 * until its writer closes it. Devices and folders are refused as there. Never for files
 * inside a model folder or paths a client chose (a FIFO there would block). */
char *fio_read_input(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);

/* The name of a new temporary file beside path, "PATH.tmp.PID.N.R": N counts this
 * process's names, so that two threads writing the same path never share one, and R is
 * random, so that neither do processes of the same pid in other PID namespaces sharing
 * the folder. Create it with O_EXCL. 0, or -1 when it does not fit in n. */
int fio_temp_name(char *out, size_t n, const char *path);
/* 1 when name (a file or folder's name, no path) is a fio_temp_name whose writer is gone
 * (its PID names no process of this PID namespace): what a writer killed mid-write left.
 * 0 for any other name, this process's own, or a writer still alive. */
int fio_temp_stale(const char *name);

/* Write len bytes to `path` atomically: into a fio_temp_name file, fsync, rename over
 * path, fsync the folder. Two writers of one path, in threads or processes, each publish
 * whole contents. Returns 0, or -1 with "PATH: <what failed>: <strerror>" in err and the
 * temporary file removed. */
int fio_write_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen);

/* json_dumps(j, flags) plus a final newline, written with fio_write_atomic. j borrowed. */
int fio_write_json(const char *path, const json_t *j, size_t flags, char *err, size_t errlen);

/* The most bytes fio_load_json reads: configs, arch and manifest files, indexes. */
#define FIO_MAX_JSON_BYTES ((size_t)256 << 20)

/* JSON document in the regular file `path` (fio_read_all, then jansson with `flags`, e.g.
 * JSON_REJECT_DUPLICATES). Returns a NEW reference, or NULL with fio_read_all's message or
 * "PATH: <jansson's reason> (line N)" in err. */
json_t *fio_load_json(const char *path, size_t flags, char *err, size_t errlen);

/* write(2) until all n bytes are written (EINTR retried). 0, or -1 with errno (EIO when
 * write makes no progress). */
int fio_write_all(int fd, const void *buf, size_t n);

/* path opened for reading (O_CLOEXEC) if it is a regular file: anything else (a FIFO, a
 * device, a folder) is refused by stat(2) before it is opened, and what was opened is
 * checked again (it may have been swapped in between; opened O_NONBLOCK, so a FIFO swapped
 * in cannot block, then cleared). The descriptor with *st filled, or -1 with errno (EINVAL:
 * not a regular file) and "PATH: <strerror>", or "PATH: not WHAT (KIND, not a regular
 * file)" (what NULL: "PATH: not a regular file (KIND)") in err. */
int fio_open_regular(const char *path, const char *what, struct stat *st, char *err, size_t errlen);

/* An exclusive lock on the file at path (created empty when missing), across the
 * threads and processes that take it the same way: waits while another holds it. The
 * file a holder removed (fio_unlock_remove) while this one waited is not the lock any
 * more: it is opened again. The descriptor (the lock is held while it is open), or -1
 * with "PATH: <strerror>" in err. */
int fio_lock_file(const char *path, char *err, size_t errlen);
/* Remove the lock file at path and release the lock fd holds (fio_lock_file). */
void fio_unlock_remove(const char *path, int fd);

/* fio_open_regular as a stdio stream ("rb"), refused too when the file is larger than
 * max_bytes (0: no limit): "PATH: N bytes, more than the limit of M". NULL with err. */
FILE *fio_fopen_regular(const char *path, const char *what, int64_t max_bytes, char *err, size_t errlen);

/* Append the whole of regular file `src` to the open descriptor fd. 0, or -1 with errno
 * (EINVAL: src is not a regular file; fd then holds part of the copy; src's descriptor is
 * closed either way). */
int fio_copy_into(const char *src, int fd);

/* "DIR/NAME" into out (cap bytes). 0, or -1 when it does not fit. */
int fio_path_join(char *out, size_t cap, const char *dir, const char *name);

/* The folder holding path (what comes before its last '/'; "." when it has none) into
 * dir (n bytes, truncated when it does not fit). */
void fio_dir_of(const char *path, char *dir, size_t n);

/* What path names once every symlink is followed, also where its end does not exist
 * (yet): realpath of its deepest existing prefix plus the rest, a dangling link followed
 * to its target, "." and ".." taken as they come; a relative path from the working
 * folder. So a link pointing out of a folder is known as such whether or not its target
 * exists. 0, or -1 (a link loop, too long). */
int fio_resolve(const char *path, char *out, size_t n);
/* Bytes free for unprivileged writes on the file system holding dir; -1 when unknown. */
int64_t fio_free_bytes(const char *dir);

/* 1 when path is a regular file (fio_is_file) or a folder (fio_is_dir), links followed;
 * 0 otherwise, an absent path included. */
int fio_is_file(const char *path);
int fio_is_dir(const char *path);

/* 1 when s ends with suffix (a name and ".json"), else 0. */
int fio_has_suffix(const char *s, const char *suffix);

/* Drop every "dir/" from the text s, in place: a message about the server's files names
 * them relative to dir ("/srv/ac/jobs/j1/prune/x: ..." -> "prune/x: ..." for dir
 * "/srv/ac/jobs/j1"). A dir of "" or "/" changes nothing; trailing slashes of dir are
 * ignored. */
void fio_unprefix(char *s, const char *dir);

/* The names in folder dir except "." and "..", sorted by strcmp. Returns 0 with *names
 * (a NEW array of n NEW strings; fio_names_free) and *n, or -1 with errno (nothing held). */
int fio_list_dir(const char *dir, char ***names, size_t *n);
void fio_names_free(char **names, size_t n);

/* mkdir -p: dir and every missing folder above it (mode 0755). 0, or -1 with errno. */
int fio_mkdirs(const char *dir);

/* rm -rf: dir and everything under it (symlinks removed, not followed). Removes what
 * it can and goes on past failures. 0 when nothing is left (an absent dir included), or
 * -1 with errno of the last failure. */
int fio_remove_tree(const char *dir);

/* fsync a folder, so a rename or a new entry in it is durable. 0, or -1 with errno
 * (some file systems refuse fsync on folders: callers that only want a best effort
 * ignore it). fio_fsync_parent does it for the folder holding path. */
int fio_fsync_dir(const char *dir);
int fio_fsync_parent(const char *path);

#endif
