/* server/cli_worker.c — `autocompress worker --job ID --data-dir DIR`: one job's pipeline
 * in its own process, started by the server's scheduler. SIGUSR1 asks it to cancel,
 * SIGTERM to stop at the next check (the job goes back to the queue). Exit status 0 when
 * the job's outcome was recorded, 1 when the store failed, 2 on usage errors.
 */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "jobs/pipeline.h"
#include "jobs/stage.h"
#include "server/cli.h"
#include "server/config.h"
#include "server/cli_args.h"
#include "storage/artstore.h"
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
    fprintf(f, "usage: autocompress worker --job ID [--data-dir DIR]\n");
}

int cli_worker(int argc, char **argv)
{
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

    char path[PATH_MAX + 64], err[1024] = "";
    snprintf(path, sizeof path, "%s/autocompress.db", data_dir);
    store *st = store_open(path, err, sizeof err);
    if (!st) {
        fprintf(stderr, "autocompress worker: %s\n", err);
        return 1;
    }
    /* the artifact store as the server opens it: its settings come through the environment */
    srv_config cfg;
    char *cargv[] = {"worker", NULL};
    artstore *as = NULL;
    if (srv_config_parse(1, cargv, &cfg, err, sizeof err) == 0) {
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
