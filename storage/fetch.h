/* storage/fetch.h — downloads by URL (libcurl, sha-256 by OpenSSL) and the server's model
 * fetcher. fetch_url is the one downloader every layer uses: resumable from OUT.part,
 * size-limited, sha-256 verified, fsynced and renamed into place, so a half-downloaded
 * file is never seen under its final name. https always, with the peer's certificate and
 * host name always verified (against the system CA store or a caller's PEM bundle); http
 * and file:// only when the caller allows them. The model fetcher is one background
 * thread per server process that downloads the models registered by URL (store state
 * "fetching"), one at a time.
 */
#ifndef AC_STORAGE_FETCH_H
#define AC_STORAGE_FETCH_H

#include <stddef.h>
#include <stdint.h>

#include "storage/artstore.h"
#include "storage/store.h"

/* fetch_url results. */
#define FETCH_OK         0
#define FETCH_FAILED    -1  /* permanent (HTTP 4xx, size limit, digest mismatch, bad URL, a TLS
                               * certificate that cannot be verified): .part removed */
#define FETCH_RETRY     -2  /* transient (network, HTTP 5xx, dropped connection): .part kept for resume */
#define FETCH_CANCELLED -3  /* the progress callback asked to stop: .part kept for resume */
#define FETCH_BUSY      -4  /* another download (another process) holds the .part: left to it */

/* fetch_opts.flags */
#define FETCH_ALLOW_HTTP 1u /* plain http:// (tests, trusted networks) */
#define FETCH_ALLOW_FILE 2u /* file:// (local command-line use only; the server never sets it) */
#define FETCH_ALLOW_PRIVATE 4u /* connections to non-public addresses (loopback, RFC 1918, link-local,
                                * ULA ...; fetch_addr_non_public): local command-line use, tests,
                                * private mirrors. Without it every connection, redirects
                                * included, must go to a public address. */

/* Progress: bytes in the file so far and the expected total (-1 unknown). Return nonzero
 * to cancel. Called from the downloading thread at least once a second while it runs. */
typedef int (*fetch_progress_fn)(void *user, int64_t done_bytes, int64_t total_bytes);

typedef struct {
    unsigned flags;              /* FETCH_ALLOW_* */
    fetch_progress_fn progress;  /* may be NULL */
    void (*transfer_starts)(void *user);   /* may be NULL: called as the network transfer begins
                                  * (after an earlier .part was read back and hashed) */
    void *user;
    long connect_timeout_s;      /* 0: 30 */
    long stall_timeout_s;        /* abort (FETCH_RETRY) when less than 1 KiB/s arrives over this
                                  * long; 0: 60 */
    const char *ca_file;         /* PEM bundle of the CAs https trusts in place of the system
                                  * store (CURLOPT_CAINFO, no CA path); NULL: the system store */
    /* outputs */
    char sha256[65];             /* hex digest of the file (on FETCH_OK) */
    int64_t bytes;               /* its size (on FETCH_OK) */
    int64_t resumed_from;        /* bytes of an earlier .part that were kept (0: from scratch) */
    int tls_unverified;          /* 1 when it failed because the peer's certificate could not be
                                  * verified or the trusted CAs could not be loaded */
} fetch_opts;

struct sockaddr;
/* 1 when the address is not on the public internet (IPv4: this network, 10/8, 100.64/10,
 * 127/8, 169.254/16, 172.16/12, 192.0.0/24, 192.168/16, 198.18/15, multicast and reserved;
 * IPv6: ::, ::1, fc00::/7, fe80::/10, fec0::/10, ff00::/8, 64:ff9b:1::/48, Teredo 2001::/32,
 * documentation 2001:db8::/32, and the IPv4-mapped, IPv4-compatible, NAT64 and 6to4 forms of
 * the IPv4 ones),
 * else 0. */
int fetch_addr_non_public(const struct sockaddr *sa);

/* A guard on the connections one curl handle makes, redirects included: unless
 * allow_private, a connection to a non-public address (fetch_addr_non_public) is refused
 * (the transfer ends CURLE_COULDNT_CONNECT) and the address is kept in refused. Checked
 * per connection, after name resolution, so a host name that resolves, or later
 * re-resolves, to the server's own network is caught. fetch_url and the webhook sender
 * use it. */
typedef struct {
    int allow_private;
    char refused[64];   /* the address a connection was refused to ("": none) */
} fetch_guard;
/* Install g (borrowed for the handle's transfers) on curl, a CURL *; clears g->refused.
 * Returns 0, or -1 when libcurl refuses the options. */
int fetch_guard_install(void *curl, fetch_guard *g);
/* For a refusal's message: "; a proxy is set in the environment, and this may be its
 * address" when one is (libcurl connects to it, and the guard judges that address), else "". */
const char *fetch_guard_proxy_note(void);
/* 1 when url's host is, as written, a non-public address: an IPv4 or [IPv6] literal that
 * fetch_addr_non_public refuses, or localhost (and *.localhost); else 0, also when the URL
 * does not parse. For an early, clear refusal only: host names are judged per connection,
 * by the guard. */
int fetch_url_host_non_public(const char *url);

/* Download url into out_path: bytes go to "out_path.part" (locked against a concurrent
 * download of the same file); an existing .part is hashed and continued with a Range
 * request, and restarted from byte 0 when the server answers 200 instead of 206. At most
 * max_bytes (a larger Content-Length is refused before any byte is written). When
 * sha256_hex (64 hex digits) is given the result must match it: on a mismatch the .part
 * is removed (after one fresh retry when the mismatch followed a resume) and err names
 * both digests. On success the file is fsynced and renamed to out_path (the folder is
 * fsynced too). opts may be NULL (https only, no progress, the system CAs); its outputs
 * are filled. A certificate that cannot be verified (unknown issuer, self-signed, wrong
 * host, expired) or a CA bundle that cannot be loaded is FETCH_FAILED with
 * opts->tls_unverified set and err saying which CAs it was checked against; a broken TLS
 * handshake is FETCH_RETRY. Returns FETCH_OK, or FETCH_FAILED / FETCH_RETRY /
 * FETCH_CANCELLED / FETCH_BUSY with a reason in err. Call curl_global_init once per process before
 * the first call. */
/* url as it may be shown (a model's url in the API, every message about its download):
 * each query parameter's value replaced by REDACTED, a parameter without a value by
 * REDACTED, the fragment dropped; a presigned URL (S3's X-Amz-Signature, a token=) carries
 * its secret there, and models are listed to every reader. Cut to fit n bytes. */
void fetch_url_shown(const char *url, char *out, size_t n);

int fetch_url(const char *url, const char *sha256_hex, int64_t max_bytes, const char *out_path,
              fetch_opts *opts, char *err, size_t errlen);

/* The file name a model URL is cached under: the last path segment (query and fragment
 * dropped), which must end in .gguf or .bin and contain only letters, digits, '.', '_'
 * and '-'. Writes it into out and returns the model format ("gguf" or "llama2c"), or NULL
 * with a reason in err. */
const char *fetch_model_file_name(const char *url, char *out, size_t outlen, char *err, size_t errlen);

/* Check that path is a readable PEM file holding at least one X.509 certificate (what
 * fetch_opts.ca_file needs). Returns 0, or -1 with a reason naming path in err. */
int fetch_check_ca_file(const char *path, char *err, size_t errlen);

/* Where a download into out_path keeps what it has so far (out_path.part). 0, or -1 when
 * it does not fit in n bytes. */
int fetch_part_path(const char *out_path, char *buf, size_t n);

/* The cache path of a model: DATA_DIR/models/SHA256/FILE. Returns 0, or -1 when out is
 * too short. */
int fetch_model_path(const char *data_dir, const char *sha256_hex, const char *file, char *out,
                     size_t outlen);

/* ---- the model fetcher (storage/fetch_service.c) ---------------------------------------- */

typedef struct fetch_service fetch_service;

/* Start the fetcher thread: it downloads every model in status "fetching" (in turn, in
 * registration order, including those a previous server left half-done, resumed from
 * their .part; a download that has run for its turn, 120 s, while other models wait gives
 * way, keeps its .part and resumes at its next turn), checks
 * that the file opens as a model, and marks it ready or failed (with the reason);
 * transient failures are retried with backoff before the model fails (a certificate
 * that cannot be verified fails at once, and without a ca_file its reason suggests
 * --models-ca-file). flags are FETCH_ALLOW_HTTP and FETCH_ALLOW_PRIVATE or 0 (file:// is
 * never allowed here);
 * max_model_bytes caps every download; ca_file is the PEM bundle every https download
 * trusts in place of the system store (NULL: the system store; copied, and checked with
 * fetch_check_ca_file). With as (borrowed, may be NULL) writing through to a remote
 * store, a ready model is also put there, for the worker agents of other hosts. At most
 * one fetcher runs per process. Returns a new handle
 * (fetch_service_stop), or NULL with a reason in err. */
fetch_service *fetch_service_start(store *st, artstore *as, unsigned flags, int64_t max_model_bytes,
                                   const char *ca_file, char *err, size_t errlen);
/* The length of a download's turn while other models wait (seconds > 0; else the
 * default, 120 s). */
void fetch_service_set_turn(fetch_service *fs, double seconds);
/* Stop the thread: an unfinished download keeps its .part and its model stays
 * "fetching", so the next start resumes it. NULL is a no-op. */
void fetch_service_stop(fetch_service *fs);
/* The policy of the fetcher running in this process: 0 with *flags and *max_model_bytes,
 * or -1 when none runs (registration by URL is then unavailable). */
int fetch_service_policy(unsigned *flags, int64_t *max_model_bytes);
/* Wake the fetcher now (a model was registered); it also polls the store every second. */
void fetch_service_kick(void);

#endif
