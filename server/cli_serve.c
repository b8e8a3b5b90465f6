/* server/cli_serve.c — `autocompress serve`: open the store (recovering jobs a dead
 * server left running), start the scheduler and the HTTP daemon, then wait for SIGTERM
 * or SIGINT and shut down in order: stop accepting, answer long-polls, let workers reach
 * a durable state, finish in-flight requests.
 */
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/api.h"
#include "storage/fileio.h"
#include "engine/devices.h"
#include "jobs/sched.h"
#include "jobs/stage.h"
#include "server/auth.h"
#include "server/cli.h"
#include "server/config.h"
#include "server/http.h"
#include "server/log.h"
#include "server/scrub.h"
#include "server/webhook.h"
#include "storage/artstore.h"
#include "storage/fetch.h"
#include "storage/store.h"

/* Everything a running server holds, opened by serve_open and serve_start and released
 * by serve_close in the reverse order. */
typedef struct {
    srv_config cfg;
    store *st;
    artstore *as;
    auth *au;
    sched *sc;
    http_server *hs;
    webhook_sender *wh;
    fetch_service *fetcher;
    scrubber *scrub;
    unsigned char wh_key[256];
    int wh_keylen;
    char *roots[SRV_MAX_ROOTS];
    int n_roots;
    char data_dir[PATH_MAX];
    char runner[PATH_MAX + 320];   /* the name this server claims jobs under */
    char devs[16][32];
    int n_dev;
    char exe[PATH_MAX];
    api_ctx api;
    sigset_t sigs;
} serve_state;

#define SERVE_FAIL(...) do { fprintf(stderr, "autocompress serve: " __VA_ARGS__); return -1; } while (0)

/* The data directory, its roots, the secrets and CA file, the store (with the jobs a dead
 * server left running recovered) and the artifact store. 0, or -1 having said why. */
static int serve_open(serve_state *S)
{
    srv_config *cfg = &S->cfg;
    char err[512] = "", path[PATH_MAX + 64];
    if (fio_mkdirs(cfg->data_dir) < 0 || !realpath(cfg->data_dir, S->data_dir))
        SERVE_FAIL("--data-dir %s: %s\n", cfg->data_dir, strerror(errno));
    if (cfg->n_roots == 0) {
        snprintf(path, sizeof path, "%s/models", S->data_dir);
        cfg->roots[cfg->n_roots++] = strdup(path);
        snprintf(path, sizeof path, "%s/data", S->data_dir);
        cfg->roots[cfg->n_roots++] = strdup(path);
    }
    for (int i = 0; i < cfg->n_roots; i++) {
        char real[PATH_MAX];
        if (!cfg->roots[i] || fio_mkdirs(cfg->roots[i]) < 0 || !realpath(cfg->roots[i], real) ||
            !(S->roots[S->n_roots] = strdup(real)))
            SERVE_FAIL("--data-root %s: %s\n", cfg->roots[i] ? cfg->roots[i] : "?", strerror(errno));
        S->n_roots++;
    }
    if (cfg->tokens_file[0] && !(S->au = auth_load(cfg->tokens_file, err, sizeof err)))
        SERVE_FAIL("%s\n", err);
    if (cfg->webhook_secret_file[0] &&
        (S->wh_keylen = webhook_load_secret(cfg->webhook_secret_file, S->wh_key, sizeof S->wh_key, err, sizeof err)) <= 0)
        SERVE_FAIL("%s\n", err);
    if (cfg->models_ca_file[0] && fetch_check_ca_file(cfg->models_ca_file, err, sizeof err) < 0)
        SERVE_FAIL("--models-ca-file: %s\n", err);
    if (!(S->st = srv_store_open(cfg, S->data_dir, err, sizeof err)))
        SERVE_FAIL("%s\n", err);
    if (srv_runner_name("serve", S->data_dir, S->runner, sizeof S->runner) < 0)
        SERVE_FAIL("--data-dir %s: path too long\n", S->data_dir);
    if (!(S->as = srv_artifacts_open(cfg, S->data_dir, err, sizeof err)))
        SERVE_FAIL("%s\n", err);
    int64_t swept = 0, swept_bytes = 0;
    if (art_sweep_temp(S->as, &swept, &swept_bytes) == 0 && swept > 0)
        log_msg("info", "artifact store: removed %lld temporary files (%lld bytes) that killed writers left",
                (long long)swept, (long long)swept_bytes);
    int aborted = 0;
    if (art_remote_sweep_uploads(S->as, &aborted, err, sizeof err) < 0)
        log_msg("warn", "artifact store: the bucket's unfinished uploads could not be listed: %s", err);
    else if (aborted > 0)
        log_msg("info", "artifact store: aborted %d multipart uploads that killed writers left in the bucket",
                aborted);
    snprintf(path, sizeof path, "%s/jobs", S->data_dir);
    if (fio_mkdirs(path) < 0)
        SERVE_FAIL("%s: %s\n", path, strerror(errno));
    int recovered = store_recover(S->st, S->runner, cfg->max_attempts > 1 ? cfg->max_attempts : 1);
    if (recovered < 0)
        SERVE_FAIL("recovering running jobs failed\n");
    if (recovered > 0)
        log_json("warn", json_pack("{s:s,s:i}", "msg", "requeued jobs a previous server left running", "jobs", recovered));
    int n_dev = srv_pick_devices(cfg->devices, S->devs, 16, err, sizeof err);
    if (n_dev <= 0)
        SERVE_FAIL("%s\n", n_dev < 0 ? err : "no devices");
    S->n_dev = n_dev;
    ssize_t el = readlink("/proc/self/exe", S->exe, sizeof S->exe - 1);
    if (el <= 0)
        SERVE_FAIL("cannot find my own executable\n");
    S->exe[el] = 0;
    return 0;
}

/* The shutdown signals blocked in every thread (main waits for them), then the services:
 * webhooks, the model fetcher, the artifact scrub, the scheduler and the HTTP daemon.
 * 0, or -1 having said why. */
static int serve_start(serve_state *S)
{
    srv_config *cfg = &S->cfg;
    char err[512] = "";
    sigemptyset(&S->sigs);
    sigaddset(&S->sigs, SIGTERM);
    sigaddset(&S->sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &S->sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    json_object_seed(0);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        SERVE_FAIL("libcurl initialisation failed\n");
    if (S->wh_keylen > 0 &&
        !(S->wh = webhook_start(S->st, S->wh_key, (size_t)S->wh_keylen, cfg->webhook_retry_s,
                                 cfg->allow_private_webhook_hosts, err, sizeof err)))
        SERVE_FAIL("%s\n", err);
    /* Models registered by URL download in the background; any left "fetching" by a
     * previous server resume from their .part now. */
    const char *ca_file = cfg->models_ca_file[0] ? cfg->models_ca_file : NULL;
    unsigned fflags = (cfg->allow_http_models ? FETCH_ALLOW_HTTP : 0u) |
                      (cfg->allow_private_model_hosts ? FETCH_ALLOW_PRIVATE : 0u);
    if (!(S->fetcher = fetch_service_start(S->st, S->as, fflags, cfg->max_model_bytes, ca_file, err, sizeof err)))
        SERVE_FAIL("%s\n", err);
    if (!(S->scrub = scrub_start(S->as, cfg->scrub_interval_s, err, sizeof err)) && err[0])
        SERVE_FAIL("%s\n", err);
    log_msg("info", "model fetcher on (https%s, at most %ld bytes a model, CAs: %s, %s)",
            cfg->allow_http_models ? " and http" : "", cfg->max_model_bytes, ca_file ? ca_file : "system store",
            cfg->allow_private_model_hosts ? "private addresses too" : "public addresses only");
    const char *dev_ptrs[16];
    for (int i = 0; i < S->n_dev; i++)
        dev_ptrs[i] = S->devs[i];
    int has_llamacpp = srv_has_llamacpp();
    /* a server that runs jobs is a runner other servers sharing the store can see */
    char *info = cfg->workers > 0 ? srv_runner_info(S->devs, S->n_dev, cfg->workers, has_llamacpp) : NULL;
    sched_config sc_cfg = {S->st, S->exe, S->data_dir, dev_ptrs, S->n_dev, cfg->workers, 10000, cfg->max_attempts,
                           S->runner, cfg->lease_s, has_llamacpp, info, srv_has_llamacpp, 0};
    S->sc = sched_start(&sc_cfg, err, sizeof err);
    free(info);
    if (!S->sc)
        SERVE_FAIL("%s\n", err);
    S->api = (api_ctx){
        .st = S->st, .as = S->as, .sched = S->sc, .data_dir = S->data_dir, .roots = S->roots,
        .n_roots = S->n_roots, .test_stages = stages_test_enabled(), .webhooks = S->wh != NULL,
        .webhook_private_hosts = cfg->allow_private_webhook_hosts,
        .max_wait_s = cfg->max_wait_s, .started_at = store_now(), .runner = cfg->workers > 0 ? S->runner : NULL,
    };
    if (!(S->hs = http_start(cfg, &S->api, S->au, err, sizeof err)))
        SERVE_FAIL("%s\n", err);
    json_t *roots_j = json_array();
    for (int i = 0; i < S->n_roots; i++)
        json_array_append_new(roots_j, json_string(S->roots[i]));
    json_t *devs_j = json_array();
    for (int i = 0; i < S->n_dev; i++)
        json_array_append_new(devs_j, json_string(S->devs[i]));
    char store_name[1024];
    store_target_for_logs(cfg->store[0] ? cfg->store : "sqlite", store_name, sizeof store_name);
    log_json("info", json_pack("{s:s,s:s,s:i,s:s,s:o,s:o,s:i,s:i,s:b,s:b,s:i,s:s,s:i,s:i,s:i,s:s,s:s}", "msg", "listening",
                               "host", cfg->host, "port", http_port(S->hs), "data_dir", S->data_dir, "data_roots",
                               roots_j, "devices", devs_j, "workers_per_device", cfg->workers, "http_threads",
                               cfg->threads, "auth", S->au != NULL, "test_stages", S->api.test_stages,
                               "schema_version", store_schema_version(S->st), "libmicrohttpd", http_library_version(),
                               "max_connections", cfg->max_connections, "per_ip_connections", cfg->per_ip_connections,
                               "request_deadline_s", cfg->request_deadline_s, "store", store_name, "runner",
                               S->runner));
    if (S->wh)
        log_msg("info", "webhooks on (signed, retried from %d s, %s)", cfg->webhook_retry_s,
                cfg->allow_private_webhook_hosts ? "private addresses too" : "public addresses only");
    return 0;
}

/* A graceful stop after signal sig: no new connections, long-polls answered, workers
 * stopped at a durable point. It has a deadline too: a request or a worker that never
 * returns cannot keep the server alive (jobs left running resume after restart). */
static void serve_stop(serve_state *S, int sig)
{
    log_json("info", json_pack("{s:s,s:s}", "msg", "shutting down", "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"));
    srv_shutdown_deadline(S->cfg.shutdown_grace_s + 15);
    S->api.shutting_down = 1;
    http_quiesce(S->hs);
    /* requests still in flight may reach the scheduler: it is halted now and freed only
     * once the HTTP threads are gone (serve_close) */
    sched_halt(S->sc, S->cfg.shutdown_grace_s * 1000);
    http_stop(S->hs);
    S->hs = NULL;
    log_msg("info", "stopped");
}

static void serve_close(serve_state *S)
{
    if (S->hs)
        http_stop(S->hs);
    S->api.sched = NULL;
    sched_stop(S->sc, 0);
    S->sc = NULL;
    webhook_stop(S->wh);            /* after the workers: their final states may still queue webhooks */
    fetch_service_stop(S->fetcher); /* an unfinished download resumes at the next start */
    scrub_stop(S->scrub);           /* before the store it reads */
    curl_global_cleanup();
    OPENSSL_cleanse(S->wh_key, sizeof S->wh_key);
    art_close(S->as);
    store_close(S->st);
    auth_free(S->au);
    for (int i = 0; i < S->n_roots; i++)
        free(S->roots[i]);
    srv_config_free(&S->cfg);
}

int cli_serve(int argc, char **argv)
{
    static serve_state S;   /* large, and the HTTP threads hold &S.api until the end */
    char err[512] = "";
    int rc = srv_config_parse(argc, argv, &S.cfg, err, sizeof err);
    if (rc != 0) {
        if (rc < 0)
            fprintf(stderr, "autocompress serve: %s\n", err);
        return rc < 0 ? 2 : 0;
    }
    if (S.cfg.print_routes) {
        api_routes_print(stdout);
        srv_config_free(&S.cfg);
        return 0;
    }
    int status = 1;
    if (serve_open(&S) == 0 && serve_start(&S) == 0) {
        int sig = 0;
        while (sigwait(&S.sigs, &sig) != 0)
            ;
        serve_stop(&S, sig);
        status = 0;
    }
    serve_close(&S);
    return status;
}
