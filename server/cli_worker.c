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

int cli_worker(int argc, char **argv)
{
    const char *job = NULL, *data_dir = "./var";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--job") && i + 1 < argc)
            job = argv[++i];
        else if (!strcmp(argv[i], "--data-dir") && i + 1 < argc)
            data_dir = argv[++i];
        else {
            fprintf(stderr, "autocompress worker: %s '%s'\n", !strcmp(argv[i], "--job") || !strcmp(argv[i], "--data-dir")
                                                                ? "a value is missing after" : "unknown option",
                    argv[i]);
            fprintf(stderr, "usage: autocompress worker --job ID [--data-dir DIR]\n");
            return 2;
        }
    }
    if (!job) {
        fprintf(stderr, "usage: autocompress worker --job ID [--data-dir DIR]\n");
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
    snprintf(path, sizeof path, "%s/artifacts", data_dir);
    artstore *as = art_open(path, err, sizeof err);
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
