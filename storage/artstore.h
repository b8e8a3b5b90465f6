/* storage/artstore.h — the content-addressed artifact store: bytes live under
 * ROOT/sha256/<first two hex>/<hex>, written as a temporary file, fsynced and renamed, so
 * nothing half-written is ever served. Blobs are immutable; the same content is stored
 * once. A blob is verified against its name (sha-256) the first time this process serves
 * it and again whenever its inode changed; a whole-blob download is hashed as it streams
 * and a periodic scrub re-hashes everything; a blob that fails is set aside. Metadata (names, jobs) lives in the job store, not here.
 */
#ifndef AC_STORAGE_ARTSTORE_H
#define AC_STORAGE_ARTSTORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct artstore artstore;

/* Open (creating) the store rooted at dir. Returns a new handle (art_close), or NULL
 * with a reason in err. */
artstore *art_open(const char *dir, char *err, size_t errlen);
void art_close(artstore *as);

/* Back the store with S3-compatible object storage at url ("s3://BUCKET[/PREFIX]"; the
 * endpoint, region and credentials as storage/s3.h reads them, credentials_file NULL or ""
 * for the environment's). From then on art_put also uploads each blob (as
 * PREFIX/sha256/<hex>, skipped when already there) and fails when the upload does, and
 * art_open_blob fetches a blob that is missing here, checked against its name before it
 * is used: the local directory is a cache of the remote. Objects are never deleted
 * remotely (several servers may share a bucket: expire them with a lifecycle rule).
 * Checks that the bucket answers. 0, or -1 with err (the store is then unchanged). */
int art_attach_remote(artstore *as, const char *url, const char *credentials_file, int allow_http, char *err,
                      size_t errlen);
/* 1 when the store writes through to a remote one (art_attach_remote), so that what it
 * holds can be read on other hosts. */
int art_has_remote(const artstore *as);
/* The multipart uploads to the remote store (art_attach_remote) that killed writers left,
 * started more than a day ago (ART_STALE_UPLOAD_S), aborted: their parts are billed until
 * then. *aborted counts them. 0 (also without a remote store), or -1 with err. */
#define ART_STALE_UPLOAD_S 86400.0
int art_remote_sweep_uploads(artstore *as, int *aborted, char *err, size_t errlen);

/* The remote copy of a blob stored here (size_bytes bytes) made sure of, as art_put does
 * after storing: uploaded unless the remote holds it at its size and sha-256. For a retry
 * after art_put stored the blob but its upload failed, without hashing it again. 0 (also
 * without a remote store), or -1 with err. */
int art_push_remote(artstore *as, const char *hex, int64_t size_bytes, char *err, size_t errlen);

/* sha-256 of a file as 64 lowercase hex digits, and its size. Returns 0, or -1 with err. */
int art_sha256_file(const char *path, char hex[65], int64_t *size_bytes, char *err, size_t errlen);
/* Lowercase hex of n bytes into hex (2n + 1 bytes, NUL-terminated): digests, random ids. */
void art_hex(const unsigned char *bytes, size_t n, char *hex);
/* sha-256 of a buffer as hex. */
void art_sha256_buf(const void *buf, size_t len, char hex[65]);
/* Base64 of the raw 32-byte digest named by hex (for Repr-Digest), into out (>= 45). */
int art_sha256_b64(const char hex[65], char *out, size_t outlen);

/* Add the file at src (left in place) to the store: hashed, then hard-linked or copied
 * to a temporary name, fsynced and renamed into place. Content already stored is hashed
 * again and kept only if intact; a stored copy that rotted is set aside (art_quarantine)
 * and replaced by this one. Returns 0 with the digest and size, or -1 with err. */
int art_put(artstore *as, const char *src, char hex[65], int64_t *size_bytes, char *err, size_t errlen);
/* Open a blob for reading. With verify, the first open in this process re-hashes it and
 * refuses a blob whose content no longer matches its name, unless the file carries the
 * mark art_put and the scrub leave on content they checked (an xattr naming the digest
 * with the file's size and mtime then; a changed file is hashed again). Without verify
 * (a HEAD, which sends no byte, or a whole download, which art_stream_new hashes on the
 * way and cuts short on a mismatch) only its presence and size are checked, so no request
 * thread reads a large blob through before answering. Returns an fd (caller closes), or -1 with err (missing,
 * size mismatch, corrupt, or unreadable: a read error sets nothing aside). */
int art_open_blob(artstore *as, const char *hex, int64_t expected_size, int verify, char *err, size_t errlen);
/* For a HEAD: art_open_blob without verify, except that a blob missing here is not fetched
 * from the remote store (art_attach_remote) but asked for there: ART_REMOTE_ONLY when the
 * remote object has expected_size bytes and no other sha-256 stored beside it (a GET then
 * fetches and checks it). An fd, ART_REMOTE_ONLY, or -1 with err. */
#define ART_REMOTE_ONLY (-2)
int art_peek_blob(artstore *as, const char *hex, int64_t expected_size, char *err, size_t errlen);
/* The store's publish lock (a flock on DIR/.publish.lock, across the server's threads and
 * its worker processes): shared while a publisher makes sure its blob is there and records
 * the row that references it, exclusive while a deleter finds the blobs no row references
 * any more and unlinks them. Without it a delete could unlink a blob that a job had just
 * found already stored, and the job's new row would point at nothing. Waits up to wait_s
 * seconds (< 0: until held); returns the descriptor (art_unlock), or -2 when others still
 * hold it after wait_s, or -1, with err. */
int art_lock(artstore *as, int exclusive, double wait_s, char *err, size_t errlen);
void art_unlock(int fd);
/* 1 when the blob hex is stored here with size_bytes bytes, else 0 (not opened). */
int art_has(artstore *as, const char *hex, int64_t size_bytes);

/* Move a blob that failed its digest check aside (<hex>.corrupt, kept for inspection):
 * later opens fail saying so. fd is the file that was read and failed: only that file is
 * set aside, never a good copy a publish stored under the name since. Returns 0, or -1. */
int art_quarantine(artstore *as, const char *hex, int fd);

/* Re-hash every blob; each that no longer matches its name is set aside (art_quarantine).
 * *checked and *bad count them; a blob that cannot be read is in neither (not known to be
 * bad, it is read again on the next pass). Returns 0, or -1 when the store cannot be listed. */
int art_scrub(artstore *as, int *checked, int *bad);

/* Remove the temporary files that writers killed mid-copy left in the store (their process
 * gone and the file untouched for 10 minutes); art_scrub does it too. *files and *bytes
 * count what went. Returns 0, or -1 when the store cannot be listed. */
int art_sweep_temp(artstore *as, int64_t *files, int64_t *bytes);

/* Streaming bytes [off, off + len) of the blob hex (size bytes) from fd (stolen). When the
 * range is the whole blob its bytes are hashed on the way, and the last chunk is held back
 * unless the digest matches: a blob corrupted after it was verified ends the transfer
 * with an error (and is set aside) instead of going out as good. fd may be -1 for a
 * stream that is never read (a HEAD's; a read then fails). NEW, or NULL on OOM (fd then
 * still the caller's). */
typedef struct art_stream art_stream;
art_stream *art_stream_new(artstore *as, const char *hex, int fd, int64_t off, int64_t len, int64_t size);
/* Up to max bytes at pos (0 = off) into buf: the count, 0 past the end, or -1 on a read
 * error or a digest mismatch. */
ssize_t art_stream_read(art_stream *s, uint64_t pos, char *buf, size_t max);
/* 1 while the stream is checking the digest (whole blob, read in order). */
int art_stream_verified(const art_stream *s);
void art_stream_free(art_stream *s);

/* Remove a blob (no longer referenced). Returns 0, or -1 when it could not be removed. */
int art_remove(artstore *as, const char *hex);
/* The blob's path into out. Returns 0, or -1 when hex is not a sha-256 or out is short. */
int art_path(artstore *as, const char *hex, char *out, size_t outlen);

#endif
