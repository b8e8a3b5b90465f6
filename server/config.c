/* server/config.c — flags and environment for `autocompress serve` (config.h). */
#include "server/config.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "compress/costmodel.h"
#include "compress/llamacpp.h"
#include "engine/devices.h"
#include "server/log.h"

void srv_config_usage(FILE *f)
{
    fprintf(f,
            "usage: autocompress serve [options]\n"
            "  --listen HOST:PORT       AC_LISTEN            default 127.0.0.1:8080 (port 0: any free port)\n"
            "  --data-dir DIR           AC_DATA_DIR          default ./var (SQLite store, artifacts, job dirs)\n"
            "  --store URI|FILE         AC_STORE             the job store: postgresql://USER@HOST/DB (libpq's URI;\n"
            "                                                the database must exist), shared with workers on\n"
            "                                                other hosts, or an SQLite file (default:\n"
            "                                                DATA/autocompress.db)\n"
            "  --workers N              AC_WORKERS           concurrent worker processes per device (1; 0: this\n"
            "                                                server runs no jobs, `autocompress worker` agents do)\n"
            "  --lease-s N              AC_LEASE_S           a running job's lease (30): renewed while its worker\n"
            "                                                lives; a job whose lease ran out (its runner died or\n"
            "                                                lost the store) is requeued by any other runner\n"
            "  --max-attempts N         AC_MAX_ATTEMPTS      worker starts per job (3): a crashed or killed worker's\n"
            "                                                job, or one a dead server left running, is requeued\n"
            "                                                and resumes at its unfinished stage until its starts\n"
            "                                                are spent (1: fail at once)\n"
            "  --tokens-file PATH       AC_TOKENS_FILE       bearer tokens 'TOKEN read,write' per line (none: open)\n"
            "  --data-root DIR          AC_DATA_ROOTS (a:b)  roots for server paths in specs, repeatable\n"
            "                                                (default DATA/models and DATA/data)\n"
            "  --devices LIST           AC_DEVICES           devices to schedule on, e.g. cpu,cuda:0 (all present)\n"
            "  --threads N              AC_HTTP_THREADS      HTTP thread pool size (online cores, at least 2)\n"
            "  --handler-threads N      AC_HTTP_HANDLER_THREADS threads that run the requests which may wait\n"
            "                                                (a lock, a child process, a file hashed), off the\n"
            "                                                HTTP threads (8)\n"
            "  --max-connections N      AC_MAX_CONNECTIONS   (1024)\n"
            "  --per-ip-connections N   AC_PER_IP_CONNECTIONS connections one client address may hold\n"
            "                                                (a quarter of --max-connections)\n"
            "  --timeout-s N            AC_TIMEOUT_S         idle connection timeout (30)\n"
            "  --request-deadline-s N   AC_REQUEST_DEADLINE_S a request must arrive whole (request line,\n"
            "                                                headers, body) within N s of its connection\n"
            "                                                opening or its previous response ending, or the\n"
            "                                                connection is closed; trickling bytes does not\n"
            "                                                extend it (30; 0: none)\n"
            "  --body-limit BYTES       AC_BODY_LIMIT        request body limit (1048576)\n"
            "  --conn-memory BYTES      AC_CONN_MEMORY       per-connection memory limit (65536)\n"
            "  --max-wait-s N           AC_MAX_WAIT_S        cap on ?wait= long-polls (60)\n"
            "  --max-suspended N        AC_MAX_SUSPENDED     cap on parked long-polls (1024)\n"
            "  --shutdown-grace-s N     AC_SHUTDOWN_GRACE_S  time workers get to stop on SIGTERM (10)\n"
            "  --webhook-secret-file P  AC_WEBHOOK_SECRET_FILE signing key (whsec_BASE64); enables callback_url\n"
            "  --webhook-retry-s N      AC_WEBHOOK_RETRY_S   first webhook retry delay, doubling (5)\n"
            "  --allow-private-webhook-hosts AC_ALLOW_PRIVATE_WEBHOOK_HOSTS=1 deliver webhooks to loopback,\n"
            "                                                private and link-local addresses too; without it a\n"
            "                                                callback_url must reach a public address\n"
            "  --retain-max-bytes N     AC_RETAIN_MAX_BYTES  cap on the data dir's size: finished jobs are\n"
            "                                                removed, oldest first, never a running one (0: none)\n"
            "  --retain-max-age-s N     AC_RETAIN_MAX_AGE_S  remove finished jobs older than N s (0: none)\n"
            "  --scrub-interval-s N     AC_SCRUB_INTERVAL_S  re-hash every stored artifact every N s and set aside\n"
            "                                                those that no longer match (86400; 0: never)\n"
            "  --max-model-bytes N      AC_MAX_MODEL_BYTES   cap on a model fetched by URL (68719476736 = 64 GiB)\n"
            "  --allow-http-models      AC_ALLOW_HTTP_MODELS=1 accept plain http:// model URLs, not only https://\n"
            "                                                (tests and trusted networks)\n"
            "  --allow-private-model-hosts AC_ALLOW_PRIVATE_MODEL_HOSTS=1 let model and task downloads connect\n"
            "                                                to loopback, private and link-local addresses; without\n"
            "                                                it every connection, redirects included, must go to a\n"
            "                                                public address (tests, private mirrors)\n"
            "  --models-ca-file PATH    AC_MODELS_CA_FILE    PEM bundle of the CAs model downloads trust, in place\n"
            "                                                of the system store (private hosts, TLS inspection)\n"
            "  --artifacts s3://B/P     AC_ARTIFACTS         keep artifacts in S3-compatible storage too (the local\n"
            "                                                store caches them); endpoint and region from\n"
            "                                                AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL and AWS_REGION\n"
            "                                                (default AWS, us-east-1)\n"
            "  --s3-credentials-file P  AC_S3_CREDENTIALS_FILE access_key = / secret_key = lines (default: the\n"
            "                                                AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY variables)\n"
            "  --s3-allow-http          AC_S3_ALLOW_HTTP=1   accept a plain http:// S3 endpoint (local servers)\n"
            "  --print-routes           print the served routes and exit\n");
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno == ERANGE || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int set_listen(srv_config *c, const char *v)
{
    const char *colon = strrchr(v, ':');
    if (!colon)
        return -1;
    long port;
    if (parse_long(colon + 1, 0, 65535, &port) < 0)
        return -1;
    size_t hl = (size_t)(colon - v);
    const char *h = v;
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof c->host)
        return -1;
    memcpy(c->host, h, hl);
    c->host[hl] = 0;
    c->port = (int)port;
    return 0;
}

static int add_root(srv_config *c, const char *v)
{
    if (c->n_roots == SRV_MAX_ROOTS || !*v)
        return -1;
    c->roots[c->n_roots] = strdup(v);
    return c->roots[c->n_roots] ? (c->n_roots++, 0) : -1;
}

/* Apply one setting by its flag name (without "--"). 0, or -1 when the value is bad. */
static int apply(srv_config *c, const char *name, const char *v)
{
    long x;
#define NUM(flag, field, lo, hi)                                   \
    if (!strcmp(name, flag)) {                                     \
        if (parse_long(v, lo, hi, &x) < 0)                         \
            return -1;                                             \
        c->field = (__typeof__(c->field))x;                        \
        return 0;                                                  \
    }
    if (!strcmp(name, "listen"))
        return set_listen(c, v);
    if (!strcmp(name, "data-dir"))
        return snprintf(c->data_dir, sizeof c->data_dir, "%s", v) < (int)sizeof c->data_dir && *v ? 0 : -1;
    if (!strcmp(name, "tokens-file"))
        return snprintf(c->tokens_file, sizeof c->tokens_file, "%s", v) < (int)sizeof c->tokens_file ? 0 : -1;
    if (!strcmp(name, "webhook-secret-file"))
        return snprintf(c->webhook_secret_file, sizeof c->webhook_secret_file, "%s", v) <
                       (int)sizeof c->webhook_secret_file ? 0 : -1;
    if (!strcmp(name, "models-ca-file"))
        return snprintf(c->models_ca_file, sizeof c->models_ca_file, "%s", v) < (int)sizeof c->models_ca_file && *v
                   ? 0 : -1;
    if (!strcmp(name, "data-root"))
        return add_root(c, v);
    if (!strcmp(name, "store"))
        return snprintf(c->store, sizeof c->store, "%s", v) < (int)sizeof c->store ? 0 : -1;
    if (!strcmp(name, "artifacts"))
        return snprintf(c->artifacts, sizeof c->artifacts, "%s", v) < (int)sizeof c->artifacts &&
                       (!*v || !strncmp(v, "s3://", 5)) ? 0 : -1;
    if (!strcmp(name, "s3-credentials-file"))
        return snprintf(c->s3_credentials_file, sizeof c->s3_credentials_file, "%s", v) <
                       (int)sizeof c->s3_credentials_file ? 0 : -1;
    if (!strcmp(name, "devices"))
        return snprintf(c->devices, sizeof c->devices, "%s", v) < (int)sizeof c->devices ? 0 : -1;
    NUM("workers", workers, 0, 64)
    NUM("lease-s", lease_s, 2, 86400)
    NUM("max-attempts", max_attempts, 1, 100)
    NUM("threads", threads, 1, 256)
    NUM("handler-threads", handler_threads, 1, 256)
    NUM("max-connections", max_connections, 1, 100000)
    NUM("per-ip-connections", per_ip_connections, 1, 100000)
    NUM("timeout-s", timeout_s, 1, 3600)
    NUM("request-deadline-s", request_deadline_s, 0, 3600)
    NUM("body-limit", body_limit_bytes, 1024, 1L << 30)
    NUM("conn-memory", conn_memory_bytes, 8192, 16L << 20)
    NUM("max-wait-s", max_wait_s, 0, 3600)
    NUM("max-suspended", max_suspended, 0, 100000)
    NUM("shutdown-grace-s", shutdown_grace_s, 0, 3600)
    NUM("webhook-retry-s", webhook_retry_s, 1, 3600)
    NUM("retain-max-bytes", retain_max_bytes, 0, 0x7fffffffffffffffL)
    NUM("retain-max-age-s", retain_max_age_s, 0, 0x7fffffffffffffffL)
    NUM("scrub-interval-s", scrub_interval_s, 0, 1L << 30)
    NUM("max-model-bytes", max_model_bytes, 1, 0x7fffffffffffffffL)
    NUM("allow-http-models", allow_http_models, 0, 1)
    NUM("allow-private-model-hosts", allow_private_model_hosts, 0, 1)
    NUM("allow-private-webhook-hosts", allow_private_webhook_hosts, 0, 1)
    NUM("s3-allow-http", s3_allow_http, 0, 1)
#undef NUM
    return -2;
}

int srv_config_parse(int argc, char **argv, srv_config *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "127.0.0.1");
    c->port = 8080;
    snprintf(c->data_dir, sizeof c->data_dir, "./var");
    c->workers = 1;
    c->lease_s = 30;
    c->max_attempts = 3;
    c->scrub_interval_s = 86400;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    c->threads = cores < 2 ? 2 : (int)cores;
    c->handler_threads = 8;
    c->max_connections = 1024;
    c->per_ip_connections = 0; /* unset: derived from max_connections below */
    c->timeout_s = 30;
    c->request_deadline_s = 30;
    c->body_limit_bytes = 1 << 20;
    c->conn_memory_bytes = 64 << 10;
    c->max_wait_s = 60;
    c->max_suspended = 1024;
    c->shutdown_grace_s = 10;
    c->webhook_retry_s = 5;
    c->max_model_bytes = 64L << 30;

    static const struct { const char *env, *flag; } envs[] = {
        {"AC_LISTEN", "listen"}, {"AC_DATA_DIR", "data-dir"}, {"AC_WORKERS", "workers"}, {"AC_MAX_ATTEMPTS", "max-attempts"},
        {"AC_TOKENS_FILE", "tokens-file"}, {"AC_DEVICES", "devices"}, {"AC_HTTP_THREADS", "threads"},
        {"AC_HTTP_HANDLER_THREADS", "handler-threads"},
        {"AC_MAX_CONNECTIONS", "max-connections"}, {"AC_PER_IP_CONNECTIONS", "per-ip-connections"},
        {"AC_TIMEOUT_S", "timeout-s"}, {"AC_REQUEST_DEADLINE_S", "request-deadline-s"}, {"AC_BODY_LIMIT", "body-limit"}, {"AC_CONN_MEMORY", "conn-memory"},
        {"AC_MAX_WAIT_S", "max-wait-s"}, {"AC_MAX_SUSPENDED", "max-suspended"},
        {"AC_SHUTDOWN_GRACE_S", "shutdown-grace-s"}, {"AC_WEBHOOK_SECRET_FILE", "webhook-secret-file"},
        {"AC_WEBHOOK_RETRY_S", "webhook-retry-s"}, {"AC_RETAIN_MAX_BYTES", "retain-max-bytes"},
        {"AC_RETAIN_MAX_AGE_S", "retain-max-age-s"}, {"AC_SCRUB_INTERVAL_S", "scrub-interval-s"}, {"AC_MAX_MODEL_BYTES", "max-model-bytes"},
        {"AC_ALLOW_HTTP_MODELS", "allow-http-models"}, {"AC_MODELS_CA_FILE", "models-ca-file"},
        {"AC_ALLOW_PRIVATE_MODEL_HOSTS", "allow-private-model-hosts"},
        {"AC_ALLOW_PRIVATE_WEBHOOK_HOSTS", "allow-private-webhook-hosts"},
        {"AC_ARTIFACTS", "artifacts"}, {"AC_S3_CREDENTIALS_FILE", "s3-credentials-file"}, {"AC_STORE", "store"},
        {"AC_LEASE_S", "lease-s"},
        {"AC_S3_ALLOW_HTTP", "s3-allow-http"},
    };
    for (size_t i = 0; i < sizeof envs / sizeof envs[0]; i++) {
        const char *v = getenv(envs[i].env);
        if (v && *v && apply(c, envs[i].flag, v) != 0) {
            snprintf(err, errlen, "%s: invalid value '%s'", envs[i].env, v);
            return -1;
        }
    }
    const char *roots = getenv("AC_DATA_ROOTS");
    if (roots && *roots) {
        char buf[8192];
        snprintf(buf, sizeof buf, "%s", roots);
        for (char *s = buf, *next; s && *s; s = next) {
            next = strchr(s, ':');
            if (next)
                *next++ = 0;
            if (*s && add_root(c, s) < 0) {
                snprintf(err, errlen, "AC_DATA_ROOTS: too many roots");
                return -1;
            }
        }
    }
    int env_roots = c->n_roots;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            srv_config_usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--print-routes")) {
            c->print_routes = 1;
            continue;
        }
        if (!strcmp(a, "--allow-http-models")) {
            c->allow_http_models = 1;
            continue;
        }
        if (!strcmp(a, "--allow-private-model-hosts")) {
            c->allow_private_model_hosts = 1;
            continue;
        }
        if (!strcmp(a, "--allow-private-webhook-hosts")) {
            c->allow_private_webhook_hosts = 1;
            continue;
        }
        if (!strcmp(a, "--s3-allow-http")) {
            c->s3_allow_http = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument '%s'", a);
            return -1;
        }
        const char *name = a + 2, *val = NULL;
        char nbuf[64];
        const char *eq = strchr(name, '=');
        if (eq) {
            snprintf(nbuf, sizeof nbuf, "%.*s", (int)(eq - name), name);
            name = nbuf;
            val = eq + 1;
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            srv_config probe = *c;   /* a copy: is the name known at all? */
            if (apply(&probe, name, "") == -2)
                snprintf(err, errlen, "unknown option %s (see --help)", a);
            else
                snprintf(err, errlen, "%s needs a value", a);
            return -1;
        }
        if (!strcmp(name, "data-root") && env_roots > 0) {
            /* flags replace the environment's roots */
            for (int k = 0; k < c->n_roots; k++)
                free(c->roots[k]);
            c->n_roots = 0;
            env_roots = 0;
        }
        int rc = apply(c, name, val);
        if (rc == -2) {
            snprintf(err, errlen, "unknown option --%s (see --help)", name);
            return -1;
        }
        if (rc < 0) {
            snprintf(err, errlen, "--%s: invalid value '%s'", name, val);
            return -1;
        }
    }
    if (c->per_ip_connections == 0)
        c->per_ip_connections = c->max_connections >= 4 ? c->max_connections / 4 : 1;
    /* the workers (separate processes) read the retention caps from the environment */
    char num[32];
    snprintf(num, sizeof num, "%ld", c->retain_max_bytes);
    if (setenv("AC_RETAIN_MAX_BYTES", num, 1) != 0) {
        snprintf(err, errlen, "setenv: %s", strerror(errno));
        return -1;
    }
    snprintf(num, sizeof num, "%ld", c->retain_max_age_s);
    /* and the job and artifact stores' settings, to open them as the server does */
    if (setenv("AC_RETAIN_MAX_AGE_S", num, 1) != 0 || setenv("AC_ARTIFACTS", c->artifacts, 1) != 0 ||
        setenv("AC_STORE", c->store, 1) != 0 ||
        setenv("AC_S3_CREDENTIALS_FILE", c->s3_credentials_file, 1) != 0 ||
        setenv("AC_S3_ALLOW_HTTP", c->s3_allow_http ? "1" : "0", 1) != 0 ||
        setenv("AC_ALLOW_PRIVATE_MODEL_HOSTS", c->allow_private_model_hosts ? "1" : "0", 1) != 0) {   /* task downloads */
        snprintf(err, errlen, "setenv: %s", strerror(errno));
        return -1;
    }
    return 0;
}

artstore *srv_artifacts_open(const srv_config *c, const char *data_dir, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/artifacts", data_dir);
    artstore *as = art_open(path, err, errlen);
    if (as && *c->artifacts && art_attach_remote(as, c->artifacts, c->s3_credentials_file, c->s3_allow_http, err,
                                                 errlen)) {
        art_close(as);
        return NULL;
    }
    return as;
}

store *srv_store_open(const srv_config *c, const char *data_dir, char *err, size_t errlen)
{
    char path[4200];
    if (*c->store)
        return store_open(c->store, err, errlen);
    snprintf(path, sizeof path, "%s/autocompress.db", data_dir);
    return store_open(path, err, errlen);
}

int srv_runner_name(const char *kind, const char *data_dir, char *out, size_t n)
{
    char host[256] = "", real[4096];
    if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "localhost");
    if (!realpath(data_dir, real))
        snprintf(real, sizeof real, "%s", data_dir);
    return snprintf(out, n, "%s/%s/%s", kind, host, real) < (int)n ? 0 : -1;
}

int srv_pick_devices(const char *list, char names[][32], int max, char *err, size_t errlen)
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
        if (eng_device_name(s, names[n], 32, why, sizeof why) < 0 || !eng_device_exists(names[n], why, sizeof why)) {
            snprintf(err, errlen, "--devices: %.40s: %.200s", s, why);
            return -1;
        }
        n++;   /* under its one name: "cuda" is cuda:0, as the jobs that name it */
    }
    return n;
}

char *srv_runner_info(char names[][32], int n, int per_device, int has_llamacpp)
{
    json_t *devs = json_array(), *info;
    int count = eng_device_count();
    for (int i = 0; i < count; i++) {
        eng_device_info d;
        for (int k = 0; k < n && eng_device_get(i, &d) == 0; k++)
            if (!strcmp(d.name, names[k]))
                json_array_append_new(devs, api_device_json(&d));
    }
    info = json_pack("{s:o,s:[s],s:i}", "devices", devs, "engines", CM_ENGINE_AUTOCOMPRESS, "workers_per_device",
                     per_device);
    if (info && has_llamacpp)
        json_array_append_new(json_object_get(info, "engines"), json_string(CM_ENGINE_LLAMACPP));
    char *text = info ? json_dumps(info, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(info);
    return text;
}

void srv_config_free(srv_config *c)
{
    for (int i = 0; i < c->n_roots; i++)
        free(c->roots[i]);
    c->n_roots = 0;
}

static void *deadline_thread(void *arg)
{
    long s = (long)(intptr_t)arg;
    struct timespec ts = {s, 0};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    log_msg("error", "shutdown did not finish within %ld s; exiting now (running jobs resume after restart)", s);
    _exit(1);
    return NULL;
}

void srv_shutdown_deadline(long seconds)
{
    pthread_t t;
    if (pthread_create(&t, NULL, deadline_thread, (void *)(intptr_t)seconds) == 0)
        pthread_detach(t);
}

int srv_has_llamacpp(void)
{
    lc_info lc;
    char err[256];
    return lc_probe(&lc, err, sizeof err) == 0;
}
