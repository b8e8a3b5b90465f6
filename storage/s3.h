/* storage/s3.h — a client for S3-compatible object storage (AWS S3, and servers that speak
 * its API): upload a file (one PUT, or a multipart upload above the part size, aborted on
 * failure), read an object's size and ETag, and read a byte range. A request whose
 * transfer broke, or that S3 answered 5xx, 429, SlowDown or RequestTimeout, is sent again
 * (signed afresh) up to 4 times in all, 0.25, 0.5 and 1 s apart, unless part of its
 * answer was already handed to a reader. Requests are signed
 * with storage/sigv4.c, payloads hashed (x-amz-content-sha256), over libcurl. Secrets
 * are never written to logs or error messages. The artifact store uses it when the server
 * is given --artifacts s3://... (artstore.h, docs/artifacts-s3.md).
 */
#ifndef AC_STORAGE_S3_H
#define AC_STORAGE_S3_H

#include <stddef.h>
#include <stdint.h>

/* Where to connect and how, before s3_open reads the environment for what is unset. */
typedef struct {
    const char *endpoint;         /* "https://host[:port]"; NULL: $AWS_ENDPOINT_URL_S3, then
                                   * $AWS_ENDPOINT_URL, then https://s3.REGION.amazonaws.com */
    const char *region;           /* NULL: $AWS_REGION, then $AWS_DEFAULT_REGION, then us-east-1 */
    const char *credentials_file; /* NULL: $AWS_ACCESS_KEY_ID / $AWS_SECRET_ACCESS_KEY /
                                   * $AWS_SESSION_TOKEN; else a file of "access_key = ..",
                                   * "secret_key = ..", optional "session_token = .." lines
                                   * (aws_access_key_id / aws_secret_access_key /
                                   * aws_session_token also read), read again
                                   * before a request whenever the file changed
                                   * (temporary credentials an agent renews) */
    int64_t part_bytes;           /* multipart above this size, in parts of this size
                                   * (5 MiB .. 5 GiB); 0: 64 MiB */
    int allow_http;               /* 1: plain http:// endpoints (local servers, tests); requests
                                   * are path-style: ENDPOINT/BUCKET/key */
} s3_options;

typedef struct s3_client s3_client;

/* A client for the objects under url, "s3://BUCKET[/PREFIX]". Returns a NEW client, or
 * NULL with err naming what is wrong (a malformed URL or endpoint, no credentials, a part
 * size out of range, an unreadable credentials file). Free with s3_close. */
s3_client *s3_open(const char *url, const s3_options *o, char *err, size_t errlen);
void s3_close(s3_client *c);

/* Upload the regular file at path as PREFIX/key. sha256 (64 hex digits, else a refusal; may be NULL) is
 * stored with the object as its x-amz-meta-sha256 (s3_head reads it back). *etag (65 bytes,
 * may be NULL) receives the object's ETag without quotes. Parts are read, hashed and sent
 * one at a time (memory: one part). 0, or -1 with err (HTTP status and S3's error code, or
 * the transport's reason); a failed multipart upload is aborted so no parts are left
 * behind. A multipart upload whose Complete fails (e.g. its answer was lost, and the
 * retry found the upload gone) succeeds all the same when the object now holds this
 * upload's size and sha256. */
int s3_put_file(s3_client *c, const char *key, const char *path, const char *sha256, char *etag, char *err,
                size_t errlen);

/* Abort the multipart uploads under PREFIX/key_prefix that were started more than
 * older_than_s seconds ago: those a killed process left, whose parts are billed until they
 * are aborted (a live upload that old is not expected). Pages of 100, at most 20 of them
 * (a start-up's worth). Best effort per upload; *aborted counts those aborted. 0, or -1
 * with err when the uploads cannot be listed. */
int s3_abort_stale_uploads(s3_client *c, const char *key_prefix, double older_than_s, int *aborted, char *err,
                           size_t errlen);

/* What s3_head tells of an object. */
typedef struct {
    int64_t size_bytes;   /* -1: not given */
    char etag[65];        /* no quotes */
    char sha256[65];      /* its x-amz-meta-sha256 as s3_put_file stored it, lower case; "" without
                           * one (or one that is not 64 hex digits) */
} s3_object;

/* The object's size, ETag and stored sha-256 into *o (may be NULL). 0, 1 when there is no
 * such object, -1 with err. */
int s3_head(s3_client *c, const char *key, s3_object *o, char *err, size_t errlen);

/* Whether the bucket exists and these credentials may use it (HEAD of the bucket). 0, or
 * -1 with err ("no such bucket", HTTP 403, or the transport's reason). */
int s3_head_bucket(s3_client *c, char *err, size_t errlen);

/* Bytes [offset, offset + len) of the object, handed to sink as they arrive (sink returns
 * 0 to go on, nonzero to stop: then -1). *got (may be NULL) is the count delivered. 0, or -1
 * with err; asking past the end returns what exists. An endpoint that ignores the range
 * and answers the whole object (200) is an error, before any byte reaches sink (unless the
 * range starts at 0 and the object fits in it). */
typedef int (*s3_sink)(void *user, const void *buf, size_t n);
int s3_get_range(s3_client *c, const char *key, int64_t offset, int64_t len, s3_sink sink, void *user, int64_t *got,
                 char *err, size_t errlen);

#endif
