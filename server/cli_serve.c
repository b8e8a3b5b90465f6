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

/* Devices to schedule on: the configured list (each must exist) or every device. */
static int pick_devices(const char *list, char names[][32], int max, char *err, size_t errlen)
{
    int n = 0;
    if (!list[0]) {
        int count = eng_device_count();
        for (int i = 0; i < count && n < max; i++) {
            eng_device_info d;
            if (eng_device_get(i, &d) == 0)
                snprintf(names[n++], 32, "%s", d.name);
        }
        return n;
    }
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *s = buf, *next; s && *s && n < max; s = next) {
        next = strchr(s, ',');
        if (next)
            *next++ = 0;
        char why[200];
        if (!eng_device_exists(s, why, sizeof why)) {
            snprintf(err, errlen, "--devices: %.40s: %.200s", s, why);
            return -1;
        }
        snprintf(names[n++], 32, "%.31s", s);
    }
    return n;
}

/* Ends the process if a graceful stop has not finished within *arg seconds. */
static void *shutdown_watchdog(void *arg)
{
    long s = *(const long *)arg;
    struct timespec ts = {s, 0};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    log_msg("error", "shutdown did not finish within %ld s; exiting now (running jobs resume after restart)", s);
    _exit(1);
    return NULL;
}

int cli_serve(int argc, char **argv)
{
    srv_config cfg;
    char err[512] = "";
    int rc = srv_config_parse(argc, argv, &cfg, err, sizeof err);
    if (rc != 0) {
        if (rc < 0)
            fprintf(stderr, "autocompress serve: %s\n", err);
        return rc < 0 ? 2 : 0;
    }
    if (cfg.print_routes) {
        api_routes_print(stdout);
        srv_config_free(&cfg);
        return 0;
    }
    int status = 1;
    store *st = NULL;
    artstore *as = NULL;
    auth *au = NULL;
    sched *sc = NULL;
    http_server *hs = NULL;
    webhook_sender *wh = NULL;
    fetch_service *fetcher = NULL;
    scrubber *scrub = NULL;
    unsigned char wh_key[256];
    int wh_keylen = 0;
    char *roots[SRV_MAX_ROOTS] = {0};
    int n_roots = 0;
    char data_dir[PATH_MAX], path[PATH_MAX + 64];

    if (fio_mkdirs(cfg.data_dir) < 0 || !realpath(cfg.data_dir, data_dir)) {
        fprintf(stderr, "autocompress serve: --data-dir %s: %s\n", cfg.data_dir, strerror(errno));
        goto out;
    }
    if (cfg.n_roots == 0) {
        snprintf(path, sizeof path, "%s/models", data_dir);
        cfg.roots[cfg.n_roots++] = strdup(path);
        snprintf(path, sizeof path, "%s/data", data_dir);
        cfg.roots[cfg.n_roots++] = strdup(path);
    }
    for (int i = 0; i < cfg.n_roots; i++) {
        char real[PATH_MAX];
        if (!cfg.roots[i] || fio_mkdirs(cfg.roots[i]) < 0 || !realpath(cfg.roots[i], real) || !(roots[n_roots] = strdup(real))) {
            fprintf(stderr, "autocompress serve: --data-root %s: %s\n", cfg.roots[i] ? cfg.roots[i] : "?", strerror(errno));
            goto out;
        }
        n_roots++;
    }
    if (cfg.tokens_file[0] && !(au = auth_load(cfg.tokens_file, err, sizeof err))) {
        fprintf(stderr, "autocompress serve: %s\n", err);
        goto out;
    }
    if (cfg.webhook_secret_file[0] &&
        (wh_keylen = webhook_load_secret(cfg.webhook_secret_file, wh_key, sizeof wh_key, err, sizeof err)) <= 0) {
        fprintf(stderr, "autocompress serve: %s\n", err);
        goto out;
    }
    if (cfg.models_ca_file[0] && fetch_check_ca_file(cfg.models_ca_file, err, sizeof err) < 0) {
        fprintf(stderr, "autocompress serve: --models-ca-file: %s\n", err);
        goto out;
    }
    snprintf(path, sizeof path, "%s/autocompress.db", data_dir);
    if (!(st = store_open(path, err, sizeof err))) {
        fprintf(stderr, "autocompress serve: %s\n", err);
        goto out;
    }
    snprintf(path, sizeof path, "%s/artifacts", data_dir);
    if (!(as = art_open(path, err, sizeof err))) {
        fprintf(stderr, "autocompress serve: %s\n", err);
        goto out;
    }
    snprintf(path, sizeof path, "%s/jobs", data_dir);
    if (fio_mkdirs(path) < 0) {
        fprintf(stderr, "autocompress serve: %s: %s\n", path, strerror(errno));
        goto out;
    }
    int recovered = store_recover(st, cfg.max_attempts > 1 ? cfg.max_attempts : 1);
    if (recovered < 0) {
        fprintf(stderr, "autocompress serve: recovering running jobs failed\n");
        goto out;
    }
    if (recovered > 0)
        log_json("warn", json_pack("{s:s,s:i}", "msg", "requeued jobs a previous server left running", "jobs", recovered));

    char devs[16][32];
    int n_dev = pick_devices(cfg.devices, devs, 16, err, sizeof err);
    if (n_dev <= 0) {
        fprintf(stderr, "autocompress serve: %s\n", n_dev < 0 ? err : "no devices");
        goto out;
    }
    const char *dev_ptrs[16];
    for (int i = 0; i < n_dev; i++)
        dev_ptrs[i] = devs[i];
    char exe[PATH_MAX];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (el <= 0) {
        fprintf(stderr, "autocompress serve: cannot find my own executable\n");
        goto out;
    }
    exe[el] = 0;

    /* Block the shutdown signals in every thread; main waits for them below. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    json_object_seed(0);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "autocompress serve: libcurl initialisation failed\n");
        goto out;
    }
    if (wh_keylen > 0 && !(wh = webhook_start(st, wh_key, (size_t)wh_keylen, cfg.webhook_retry_s, err, sizeof err))) {
        fprintf(stderr, "autocompress serve: %s\n", err);
        goto out;
    }

    /* Models registered by URL download in the background; any left "fetching" by a
     * previous server resume from their .part now. */
    const char *ca_file = cfg.models_ca_file[0] ? cfg.models_ca_file : NULL;
    if (!(fetcher = fetch_service_start(st, cfg.allow_http_models ? FETCH_ALLOW_HTTP : 0, cfg.max_model_bytes, ca_file,
                                        err, sizeof err))) {
        fprintf(stderr, "autocompress serve: %s\n", err);
        goto out;
    }
    if (!(scrub = scrub_start(as, cfg.scrub_interval_s, err, sizeof err)) && err[0]) {
        fprintf(stderr, "autocompress serve: %s\n", err);
        goto out;
    }
    log_msg("info", "model fetcher on (https%s, at most %ld bytes a model, CAs: %s)",
            cfg.allow_http_models ? " and http" : "", cfg.max_model_bytes, ca_file ? ca_file : "system store");

    sched_config sc_cfg = {st, exe, data_dir, dev_ptrs, n_dev, cfg.workers, 10000, cfg.max_attempts};
    if (!(sc = sched_start(&sc_cfg, err, sizeof err))) {
        fprintf(stderr, "autocompress serve: %s\n", err);
        goto out;
    }
    api_ctx api = {
        .st = st, .as = as, .sched = sc, .data_dir = data_dir, .roots = roots, .n_roots = n_roots,
        .test_stages = stages_test_enabled(), .webhooks = wh != NULL, .max_wait_s = cfg.max_wait_s,
        .started_at = store_now(),
    };
    if (!(hs = http_start(&cfg, &api, au, err, sizeof err))) {
        fprintf(stderr, "autocompress serve: %s\n", err);
        goto out;
    }
    json_t *roots_j = json_array();
    for (int i = 0; i < n_roots; i++)
        json_array_append_new(roots_j, json_string(roots[i]));
    json_t *devs_j = json_array();
    for (int i = 0; i < n_dev; i++)
        json_array_append_new(devs_j, json_string(devs[i]));
    log_json("info", json_pack("{s:s,s:s,s:i,s:s,s:o,s:o,s:i,s:i,s:b,s:b,s:i,s:s,s:i,s:i,s:i}", "msg", "listening",
                               "host", cfg.host, "port", http_port(hs), "data_dir", data_dir, "data_roots", roots_j,
                               "devices", devs_j, "workers_per_device", cfg.workers, "http_threads", cfg.threads,
                               "auth", au != NULL, "test_stages", api.test_stages,
                               "schema_version", store_schema_version(st), "libmicrohttpd", http_library_version(),
                               "max_connections", cfg.max_connections, "per_ip_connections", cfg.per_ip_connections,
                               "request_deadline_s", cfg.request_deadline_s));
    if (wh)
        log_msg("info", "webhooks on (signed, retried from %d s)", cfg.webhook_retry_s);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0)
        ;
    log_json("info", json_pack("{s:s,s:s}", "msg", "shutting down", "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"));
    /* The stop has a deadline too: a request or a worker that never returns cannot keep
     * the server alive (jobs left running resume after restart). */
    static long deadline_s;
    deadline_s = cfg.shutdown_grace_s + 15;
    pthread_t watchdog;
    if (pthread_create(&watchdog, NULL, shutdown_watchdog, &deadline_s) == 0)
        pthread_detach(watchdog);
    api.shutting_down = 1;
    http_quiesce(hs);
    sched_stop(sc, cfg.shutdown_grace_s * 1000);
    sc = NULL;
    api.sched = NULL;
    http_stop(hs);
    hs = NULL;
    log_msg("info", "stopped");
    status = 0;
out:
    if (hs)
        http_stop(hs);
    if (sc)
        sched_stop(sc, 0);
    webhook_stop(wh); /* after the workers: their final states may still queue webhooks */
    fetch_service_stop(fetcher); /* an unfinished download resumes at the next start */
    scrub_stop(scrub);           /* before the store it reads */
    curl_global_cleanup();
    OPENSSL_cleanse(wh_key, sizeof wh_key);
    art_close(as);
    store_close(st);
    auth_free(au);
    for (int i = 0; i < n_roots; i++)
        free(roots[i]);
    srv_config_free(&cfg);
    return status;
}
