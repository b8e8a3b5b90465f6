/* server/config.h — `autocompress serve` settings: embedded defaults, then environment
 * variables, then command-line flags (each flag has an AC_* equivalent; see
 * srv_config_usage). Nothing is read from a config file.
 */
#ifndef AC_SERVER_CONFIG_H
#define AC_SERVER_CONFIG_H

#include "storage/artstore.h"
#include "storage/store.h"
#include <stddef.h>
#include <stdio.h>

#define SRV_MAX_ROOTS 16

typedef struct {
    char host[256];              /* listen address (IPv4/IPv6 literal or name) */
    int port;                    /* 0 = any free port (logged) */
    char data_dir[4096];
    char store[1024];            /* "" = SQLite DATA/autocompress.db; a postgresql:// URI or an SQLite file */
    int workers;                 /* concurrent workers per device; 0 = this process runs no jobs */
    int lease_s;                 /* a running job's lease, renewed while its worker lives */
    int max_attempts;            /* worker starts per job before a crash fails it (>= 1) */
    char tokens_file[4096];      /* "" = no auth */
    char *roots[SRV_MAX_ROOTS];  /* --data-root (malloc'd); none = DATA/models, DATA/data */
    int n_roots;
    char devices[512];           /* comma-separated; "" = every device present */
    int threads;                 /* HTTP thread pool size */
    int handler_threads;         /* threads for the requests that may wait (api_route_blocking) */
    int max_connections;
    int per_ip_connections;      /* default: a quarter of max_connections, so one address never takes all */
    int timeout_s;               /* idle timeout (libmicrohttpd's; reset by every byte) */
    int request_deadline_s;      /* a request must arrive whole this long after its connection
                                    opened or its previous response ended; 0 = none */
    size_t body_limit_bytes, conn_memory_bytes;
    int max_wait_s, max_suspended, shutdown_grace_s;
    char webhook_secret_file[4096]; /* "" = webhooks off (callback_url refused) */
    int webhook_retry_s;         /* first retry delay; doubles per attempt */
    int allow_private_webhook_hosts; /* webhooks may go to non-public addresses (tests, receivers inside the network) */
    int print_routes;
    long retain_max_bytes;       /* data dir size cap (finished jobs go, oldest first); 0 = none */
    long retain_max_age_s;       /* finished jobs older than this go; 0 = none */
    long scrub_interval_s;       /* seconds between artifact scrubs; 0 = none */
    long max_model_bytes;        /* cap on a model download (POST /v1/models with url) */
    int allow_http_models;       /* accept http:// model URLs (tests, trusted networks) */
    int allow_private_model_hosts; /* downloads may connect to non-public addresses (tests, private mirrors) */
    char models_ca_file[4096];   /* PEM bundle model downloads trust instead of the system store; "" = system */
    char artifacts[1024];        /* "" = local only; "s3://BUCKET[/PREFIX]": the local store caches it */
    char s3_credentials_file[4096]; /* "" = AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY */
    int s3_allow_http;           /* plain http:// S3 endpoints (local servers, tests) */
} srv_config;

/* Fill c from defaults, the environment and argv. Returns 0, 1 when --help was printed,
 * or -1 with a message in err. srv_config_free releases the roots. The retention caps
 * are also exported to this process's environment (AC_RETAIN_MAX_BYTES,
 * AC_RETAIN_MAX_AGE_S) so the worker processes it starts apply them (jobs/retention.h). */
int srv_config_parse(int argc, char **argv, srv_config *c, char *err, size_t errlen);
void srv_config_free(srv_config *c);

/* The artifact store of data_dir (DATA/artifacts), backed by c->artifacts when set (see
 * art_attach_remote). The server and its workers open it the same way. NEW store, or NULL
 * with err. */
artstore *srv_artifacts_open(const srv_config *c, const char *data_dir, char *err, size_t errlen);
void srv_config_usage(FILE *f);
/* The job store: c->store, or else the SQLite file DATA/autocompress.db. The server, its
 * workers and the worker agents open it the same way. NEW store, or NULL with err. */
store *srv_store_open(const srv_config *c, const char *data_dir, char *err, size_t errlen);
/* Devices to schedule on: the comma-separated list (each must exist) or, when it is
 * empty, every device present, into names (at most max). Returns how many, or -1 with
 * err naming the device that does not exist. */
int srv_pick_devices(const char *list, char names[][32], int max, char *err, size_t errlen);
/* What a runner offers, for the runners registry (store_runner_beat): its devices
 * (names, n of them) as /v1/devices renders them, its engines and workers per device.
 * A malloc'd JSON text, or NULL on OOM. */
char *srv_runner_info(char names[][32], int n, int per_device, int has_llamacpp);
/* 1 when llama.cpp's helper answers here (lc_probe), else 0: what a runner claims by. */
int srv_has_llamacpp(void);
/* The name a runner claims jobs under (store_claim.owner): "KIND/HOST/DATA_DIR", stable
 * across restarts of the same runner. 0, or -1 when it does not fit out. */
int srv_runner_name(const char *kind, const char *data_dir, char *out, size_t n);
/* A graceful stop's deadline, for serve and the worker agent: a detached thread ends the
 * process (exit status 1, with a log line) if it is still alive `seconds` from now. A
 * stop stuck behind a store that stopped answering (a request, a lease renewal) cannot
 * keep the process alive; jobs left running resume after restart, or on another runner
 * once their lease runs out. */
void srv_shutdown_deadline(long seconds);

#endif
