/* server/cli_worker.c — `autocompress worker`, in two forms.
 *   worker --job ID --data-dir DIR: one job's pipeline in its own process, started by a
 *     runner's scheduler. SIGUSR1 asks it to cancel, SIGTERM to stop at the next check
 *     (the job goes back to the queue). Exit status 0 when the job's outcome was recorded,
 *     1 when the store failed, 2 on usage errors.
 *   worker --store postgresql://... --devices LIST [--data-dir DIR]: a worker agent, the
 *     runner of a host without the API. It claims jobs for its devices straight from the
 *     shared store under a lease (jobs/sched.h) and runs each as above, until SIGTERM or
 *     SIGINT (its jobs then go back to the queue and resume where another runner claims
 *     them). It takes serve's store, artifact, device and worker options.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jobs/pipeline.h"
#include "jobs/sched.h"
#include "jobs/stage.h"
#include "server/log.h"
#include "server/cli.h"
#include "server/config.h"
#include "server/cli_args.h"
#include "storage/artstore.h"
#include "storage/fileio.h"
#include "storage/store.h"

static void on_cancel(int sig)
{
    (void)sig;
    job_signal_cancel();
}

static void on_stop(int sig)
{
    (void)sig;
    job_signal_stop();
}

static void usage(FILE *f)
{
    fprintf(f, "usage: autocompress worker --job ID [--data-dir DIR]      (one job, as a runner starts it)\n"
               "       autocompress worker [--store URI] [--devices LIST] [--workers N] [--data-dir DIR]\n"
               "                           [--lease-s N] [--max-attempts N] [--artifacts s3://B/P] ...\n"
               "  a worker agent: claims queued jobs for its devices from the store (a postgresql:// URI\n"
               "  shared with the API on another host, AC_STORE) and runs each in a worker process until\n"
               "  SIGTERM; the options and AC_* variables are serve's (autocompress serve --help)\n");
}

/* The worker agent: a scheduler without the HTTP server. 0 after a graceful stop, 1 when
 * it could not start (said why), 2 on usage errors. */
static int worker_agent(int argc, char **argv)
{
    srv_config cfg;
    char err[1024] = "";
    int rc = srv_config_parse(argc, argv, &cfg, err, sizeof err);
    if (rc != 0) {
        if (rc < 0)
            fprintf(stderr, "autocompress worker: %s\n", err);
        return rc < 0 ? 2 : 0;
    }
    char data_dir[PATH_MAX], runner[PATH_MAX + 320], exe[PATH_MAX], devs[16][32];
    const char *dev_ptrs[16];
    store *st = NULL;
    sched *sc = NULL;
    int status = 1;
    if (fio_mkdirs(cfg.data_dir) < 0 || !realpath(cfg.data_dir, data_dir)) {
        fprintf(stderr, "autocompress worker: --data-dir %s: %s\n", cfg.data_dir, strerror(errno));
        goto out;
    }
    int n_dev = srv_pick_devices(cfg.devices, devs, 16, err, sizeof err);
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n_dev <= 0 || el <= 0 || srv_runner_name("worker", data_dir, runner, sizeof runner) < 0) {
        fprintf(stderr, "autocompress worker: %s\n", n_dev < 0 ? err : n_dev == 0 ? "no devices" : "cannot name myself");
        goto out;
    }
    exe[el] = 0;
    if (!(st = srv_store_open(&cfg, data_dir, err, sizeof err))) {
        fprintf(stderr, "autocompress worker: %s\n", err);
        goto out;
    }
    int recovered = store_recover(st, runner, cfg.max_attempts);
    if (recovered < 0) {
        fprintf(stderr, "autocompress worker: recovering my running jobs failed\n");
        goto out;
    }
    for (int i = 0; i < n_dev; i++)
        dev_ptrs[i] = devs[i];
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    int has_llamacpp = srv_has_llamacpp();
    int slots = cfg.workers > 0 ? cfg.workers : 1;
    char *info = srv_runner_info(devs, n_dev, slots, has_llamacpp);
    sched_config sc_cfg = {st, exe, data_dir, dev_ptrs, n_dev, slots, 10000, cfg.max_attempts, runner, cfg.lease_s,
                           has_llamacpp, info, srv_has_llamacpp, 0};
    if (!info)
        snprintf(err, sizeof err, "out of memory");
    sc = info ? sched_start(&sc_cfg, err, sizeof err) : NULL;
    free(info);
    if (!sc) {
        fprintf(stderr, "autocompress worker: %s\n", err);
        goto out;
    }
    char store_name[1024];
    store_target_for_logs(cfg.store[0] ? cfg.store : "sqlite", store_name, sizeof store_name);
    json_t *devs_j = json_array();
    for (int i = 0; i < n_dev; i++)
        json_array_append_new(devs_j, json_string(devs[i]));
    log_json("info", json_pack("{s:s,s:s,s:s,s:s,s:o,s:i,s:i,s:b,s:i}", "msg", "worker agent ready", "runner", runner,
                               "store", store_name, "data_dir", data_dir, "devices", devs_j, "workers_per_device",
                               sc_cfg.per_device, "lease_s", cfg.lease_s, "llama.cpp", has_llamacpp, "requeued",
                               recovered));
    int sig = 0;
    while (sigwait(&sigs, &sig) != 0)
        ;
    log_msg("info", "worker agent stopping (%s): running jobs go back to the queue", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    srv_shutdown_deadline(cfg.shutdown_grace_s + 15);   /* the scheduler may be stuck in a store call */
    sched_stop(sc, cfg.shutdown_grace_s * 1000);
    status = 0;
out:
    store_close(st);
    srv_config_free(&cfg);
    return status;
}

int cli_worker(int argc, char **argv)
{
    int agent = 1;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--job") || !strncmp(argv[i], "--job=", 6))
            agent = 0;
    if (agent)
        return worker_agent(argc, argv);

    static const struct option opts[] = {{"job", required_argument, NULL, 'j'},
                                         {"data-dir", required_argument, NULL, 'D'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    const char *job = NULL, *data_dir = "./var";
    cli_parser p;
    int c;
    cli_init(&p, "worker", argc, argv, opts, NULL, usage);
    while ((c = cli_next(&p)) > 0) {
        if (c == 'j')
            job = p.arg;
        else
            data_dir = p.arg;
    }
    if (c != CLI_END)
        return cli_status(c);
    if (cli_no_more_operands(&p))
        return 2;
    if (!job) {
        usage(stderr);
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_cancel;
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    /* the job and artifact stores as the runner opens them: their settings come through
     * the environment */
    char err[1024] = "";
    srv_config cfg;
    char *cargv[] = {"worker", NULL};
    store *st = NULL;
    artstore *as = NULL;
    if (srv_config_parse(1, cargv, &cfg, err, sizeof err) == 0) {
        if ((st = srv_store_open(&cfg, data_dir, err, sizeof err)))
            as = srv_artifacts_open(&cfg, data_dir, err, sizeof err);
        srv_config_free(&cfg);
    }
    if (!as) {
        fprintf(stderr, "autocompress worker: %s\n", err);
        store_close(st);
        return 1;
    }
    stages_register_builtin();
    if (stages_test_enabled())
        stages_register_test();
    fprintf(stderr, "autocompress worker: running %s\n", job);
    int rc = job_run(st, as, data_dir, job, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "autocompress worker: %s\n", err);
    art_close(as);
    store_close(st);
    return rc < 0 ? 1 : 0;
}
