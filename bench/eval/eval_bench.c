/* bench/eval/eval_bench.c — evaluation throughput: scores a small seeded sample of each
 * of the eight benchmarks with the real model and prints items/s and tokens/s per task,
 * and the time a full eight-benchmark evaluation at 500 items per task (all where fewer)
 * would take at those rates. Not a test: it prints a table.
 *   eval_bench MODEL [--items N] [--threads N] [--data DIR] [--limit-full N]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/eval.h"
#include "compress/evaltasks.h"
#include "compress/prune.h"
#include "engine/backend.h"
#include "engine/clock.h"

static int arg_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    eng_blas_pick_kernel(argv);
    const char *model = NULL, *data = NULL;
    int items = 16, threads = 0, full = 500;
    for (int i = 1; i < argc; i++) {
        int bad = 0;
        if (!strcmp(argv[i], "--items") && i + 1 < argc)
            bad = arg_int(argv[++i], 1, 100000, &items);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            bad = arg_int(argv[++i], 0, 1024, &threads);
        else if (!strcmp(argv[i], "--limit-full") && i + 1 < argc)
            bad = arg_int(argv[++i], 1, 10000000, &full);
        else if (!strcmp(argv[i], "--data") && i + 1 < argc)
            data = argv[++i];
        else if (argv[i][0] != '-' && !model)
            model = argv[i];
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "usage: eval_bench MODEL [--items N] [--threads N] [--data DIR] [--limit-full N]\n");
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "usage: eval_bench MODEL [--items N] [--threads N] [--data DIR] [--limit-full N]\n");
        return 2;
    }
    char dbuf[1024];
    if (!data) {
        const char *sh = getenv("AC_SHARED");
        snprintf(dbuf, sizeof dbuf, "%s/data", sh && *sh ? sh : "../shared");
        data = dbuf;
    }
    eng_backend *be = eng_backend_cpu_new(threads);
    if (!be) {
        fprintf(stderr, "eval_bench: no CPU backend\n");
        return 1;
    }
    eng_model m;
    tok_tokenizer *tok = NULL;
    char err[1024];
    double t0 = eng_wall_s();
    if (prune_load_model(model, NULL, be, &m, &tok, err, sizeof err)) {
        fprintf(stderr, "eval_bench: %s\n", err);
        eng_backend_free(be);
        return 1;
    }
    double load_s = eng_wall_s() - t0;
    ev_engine eng = {.m = &m, .tok = tok};
    ev_model em;
    if (ev_engine_model(&eng, 0, &em, err, sizeof err)) {
        fprintf(stderr, "eval_bench: %s\n", err);
        return 1;
    }
    printf("eval_bench: %s on CPU, %d threads, %d items per task (seed 1234), model load %.1f s\n", model,
           be->threads, items, load_s);
    printf("%-16s %6s %8s %8s %9s %10s %11s %12s %12s\n", "task", "items", "wall_s", "cpu_s", "items/s", "tokens/s",
           "full items", "projected_s", "proj_cpu_s");
    double total_proj = 0.0, total_wall = 0.0, total_cpu = 0.0, total_pcpu = 0.0;
    int total_items = 0, rc = 0;
    for (int k = 0; ev_eight_tasks[k]; k++) {
        ev_task t;
        if (ev_task_load(ev_eight_tasks[k], data, NULL, &t, err, sizeof err)) {
            fprintf(stderr, "eval_bench: %s\n", err);
            rc = 1;
            continue;
        }
        int avail = t.n_items;
        ev_task_limit(&t, items, 1234);
        int64_t tok0 = eng.tokens_forwarded;
        ev_result r;
        double s0 = eng_wall_s(), c0 = eng_cpu_s();
        int e = ev_run_task(&em, &t, NULL, &r);
        double wall = eng_wall_s() - s0, cpu = eng_cpu_s() - c0;
        if (e) {
            fprintf(stderr, "eval_bench: %s: %s\n", t.name, r.error);
            rc = 1;
        } else {
            int nfull = avail < full ? avail : full;
            double ips = r.n / wall, proj = nfull / ips, pcpu = nfull * cpu / r.n;
            total_proj += proj;
            total_pcpu += pcpu;
            total_wall += wall;
            total_cpu += cpu;
            total_items += r.n;
            printf("%-16s %6d %8.2f %8.2f %9.3f %10.1f %11d %12.0f %12.0f\n", t.name, r.n, wall, cpu, ips,
                   (double)(eng.tokens_forwarded - tok0) / wall, nfull, proj, pcpu);
        }
        ev_result_free(&r);
        ev_task_free(&t);
    }
    printf("%-16s %6d %8.2f %8.2f %9.3f %10s %11s %12.0f %12.0f\n", "total", total_items, total_wall, total_cpu,
           total_wall > 0 ? total_items / total_wall : 0.0, "", "", total_proj, total_pcpu);
    printf("projected full evaluation (eight tasks, %d items each): %.1f min at the measured wall rate, "
           "%.1f CPU-min (process CPU time: what it takes with these threads on an unloaded machine)\n",
           full, total_proj / 60.0, total_pcpu / 60.0);
    ev_engine_free(&eng);
    eng_model_free(&m);
    tok_free(tok);
    eng_backend_free(be);
    return rc;
}
