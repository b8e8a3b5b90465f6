/* storage/sigv4.h — AWS Signature Version 4 for S3-compatible object stores: the
 * Authorization header of a request and presigned query URLs, computed here (OpenSSL
 * HMAC-SHA256) so that the same code signs for every libcurl version, with
 * x-amz-content-sha256 always among the signed headers. Pure functions: no I/O, no clock
 * (the caller passes the request time), no credentials kept. Checked against AWS's
 * published examples (tests/unit/test_sigv4.c). Not the transport: that is the caller's.
 */
#ifndef AC_STORAGE_SIGV4_H
#define AC_STORAGE_SIGV4_H

#include <stddef.h>

/* The sha-256 of an empty payload, and the marker for a payload that is not hashed. */
#define SIGV4_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define SIGV4_UNSIGNED "UNSIGNED-PAYLOAD"

typedef struct {
    const char *access_key;      /* AKIA... */
    const char *secret_key;
    const char *session_token;   /* NULL or "": none (temporary credentials send it as
                                  * x-amz-security-token, signed) */
    const char *region;          /* "us-east-1" */
    const char *service;         /* "s3" */
} sigv4_creds;

/* One header or query parameter, unencoded (the signer encodes). */
typedef struct {
    const char *name;
    const char *value;
} sigv4_pair;

/* A request to sign. path is the object's path as unencoded bytes ("/bucket/a b.txt";
 * each segment is percent-encoded once, '/' kept); query holds n_query parameters
 * (a key alone, as "?uploads", has value ""), headers n_headers request headers, which
 * must include host; the signer adds x-amz-date, x-amz-content-sha256 and, with a
 * session token, x-amz-security-token when they are absent. amz_date is the request's
 * time as YYYYMMDDTHHMMSSZ (UTC). payload_sha256 is the body's hex digest,
 * SIGV4_EMPTY_SHA256 for none, or SIGV4_UNSIGNED. */
typedef struct {
    const char *method;
    const char *path;
    const sigv4_pair *query;
    int n_query;
    const sigv4_pair *headers;
    int n_headers;
    const char *payload_sha256;
    const char *amz_date;
} sigv4_request;

/* The headers to send with req: "Authorization: AWS4-HMAC-SHA256 Credential=...,
 * SignedHeaders=..., Signature=..." and the ones the signer added (x-amz-date,
 * x-amz-content-sha256, x-amz-security-token), each "Name: value", written to out as
 * lines ended by "\n" (at most outlen bytes with the NUL). When canonical is not NULL the
 * canonical request is copied there too (canonical_len bytes; for diagnostics and tests).
 * Returns 0, or -1 with err naming what is wrong (a missing field, a malformed date, a
 * header without a name, too small a buffer, out of memory). */
int sigv4_sign_headers(const sigv4_creds *cr, const sigv4_request *req, char *out, size_t outlen, char *canonical,
                       size_t canonical_len, char *err, size_t errlen);

/* A presigned URL for req: scheme_host ("https://bucket.s3.amazonaws.com") + the encoded
 * path + req's query and the X-Amz-* authentication parameters, valid expires_s seconds
 * (1..604800) from amz_date. Only host is signed among headers (req->headers must hold
 * it); the payload is UNSIGNED-PAYLOAD. Returns 0, or -1 with err as above. */
int sigv4_presign_url(const sigv4_creds *cr, const sigv4_request *req, const char *scheme_host, long expires_s,
                      char *out, size_t outlen, char *err, size_t errlen);

/* s percent-encoded as SigV4 and S3 want it on the wire: unreserved bytes (A-Z a-z 0-9
 * - _ . ~) kept, '/' kept when keep_slash, every other byte %XX. NEW string (caller
 * frees), NULL when out of memory. */
char *sigv4_encode(const char *s, int keep_slash);

/* The SigV4 signing key for (secret, yyyymmdd, region, service) into key[32]. 0, or -1. */
int sigv4_signing_key(const char *secret, const char *yyyymmdd, const char *region, const char *service,
                      unsigned char key[32]);

#endif
