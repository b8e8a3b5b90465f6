/* server/cli_measure.c — `autocompress measure`: serve a model, or an arch with random
 * weights, in the built-in engine in this process, and print what it measured: latency,
 * tokens/s and the process's peak memory. Jobs measure the built-in engine through it, a
 * fresh process per serving (compress/measure.h ms_measure_fresh), and a user can run it
 * to check a report's numbers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "compress/costmodel.h"
#include "compress/measure.h"
#include "engine/clock.h"
#include "server/cli.h"
#include "server/cli_args.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: autocompress measure (--model PATH | --arch FILE) [--device cpu] [--precision fp32]\n"
               "                            [--batch B] [--prompt S] [--output N] [--warmup N] [--reps N]\n"
               "                            [--seed S] [--threads N] [--json]\n"
               "Serves B requests of S prompt tokens and N greedy output tokens in the built-in engine, in this\n"
               "process: the model at PATH loaded as generate loads it, or the arch in FILE with random\n"
               "weights (timings and memory do not depend on weight values). After the warm-up requests\n"
               "(default 1) it times --reps requests (default 3) and prints their median latency and\n"
               "tokens/s, and the peak memory: on the CPU the process's RSS high-water mark since it\n"
               "started (program, libraries, threads, the load and the requests), on a GPU the device memory\n"
               "the engine held. --json prints the measured object of the report (after a newline a second\n"
               "while it serves: a sign of life for a process watching this one). --threads: the CPU's worker\n"
               "threads (default every core this process may use). Defaults: batch 1, prompt 256, output 64,\n"
               "seed 1.\n");
}

typedef struct {
    const char *model, *arch_file;
    int as_json;
    ms_opts o;
    cm_target t;
} measure_args;

static int measure_parse(int argc, char **argv, measure_args *a)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'}, {"arch", required_argument, NULL, 'a'},
        {"warmup", required_argument, NULL, 'w'}, {"reps", required_argument, NULL, 'r'},
        {"seed", required_argument, NULL, 's'}, {"threads", required_argument, NULL, 'T'},
        {"json", no_argument, NULL, 'j'},
        CLI_TARGET_OPTIONS, {"help", no_argument, NULL, 'h'}, {0}};
    memset(a, 0, sizeof *a);
    a->o = (ms_opts){.warmup = 1, .reps = 3, .seed = 1};
    cm_target_default(&a->t);
    cli_parser p;
    int c;
    cli_init(&p, "measure", argc, argv, opts, NULL, usage);
    cli_set_target(&p, &a->t);
    while ((c = cli_next(&p)) > 0) {
        switch (c) {
        case 'm': a->model = p.arg; break;
        case 'a': a->arch_file = p.arg; break;
        case 'w': cli_int(&p, 0, 100, &a->o.warmup); break;
        case 'r': cli_int(&p, 1, 1000, &a->o.reps); break;
        case 's': cli_u64(&p, &a->o.seed); break;
        case 'T': cli_int(&p, 0, 4096, &a->o.threads); break;
        case 'j': a->as_json = 1; break;
        }
    }
    if (c != CLI_END)
        return cli_status(c);
    if (cli_no_more_operands(&p))
        return 2;
    if (cli_model_or_arch(&p, a->model, a->arch_file))
        return 2;
    if (cm_target_llamacpp(&a->t)) {
        fprintf(stderr, "measure: serves the built-in engine; a llama.cpp target is measured in llama.cpp "
                        "(ac-llama bench, or llama-bench on the exported GGUF)\n");
        return 2;
    }
    if (a->o.seed == 0)
        a->o.seed = 1;
    return CLI_END;
}

/* With --json, a newline on stdout at most once a second while the model is drawn and
 * served (asked as the measurement's cancel hook, which it never says): the sign of life
 * a parent watching this process waits for (compress/child.h), whitespace before the
 * JSON object. */
static int heartbeat(void *ud)
{
    double *last = ud, now = eng_wall_s();
    if (now - *last >= 1.0) {
        *last = now;
        if (fputc('\n', stdout) != EOF)
            (void)fflush(stdout);
    }
    return 0;
}

int cli_measure(int argc, char **argv)
{
    measure_args ma;
    int pr = measure_parse(argc, argv, &ma);
    if (pr != CLI_END)
        return pr;
    double beat = eng_wall_s();
    if (ma.as_json) {
        ma.o.cancelled = heartbeat;
        ma.o.cancel_ud = &beat;
    }
    char err[1024];
    json_t *m = ms_measure_process(ma.model, ma.arch_file, &ma.t, &ma.o, err, sizeof err);
    if (!m) {
        fprintf(stderr, "measure: %s\n", err);
        return 1;
    }
    if (ma.as_json) {
        json_dumpf(m, stdout, JSON_COMPACT | JSON_SORT_KEYS);
        printf("\n");
    } else {
        json_t *pp = json_object_get(m, "process_peak_bytes");
        printf("params             %lld (%s weights)\n", (long long)json_integer_value(json_object_get(m, "params")),
               json_string_value(json_object_get(m, "weights")));
        printf("load               %.1f ms\n", json_number_value(json_object_get(m, "load_ms")));
        printf("latency            %.2f ms (prefill %.2f ms, decode %.3f ms/token; median of %d)\n",
               json_number_value(json_object_get(m, "latency_ms")), json_number_value(json_object_get(m, "prefill_ms")),
               json_number_value(json_object_get(m, "decode_ms_per_token")),
               (int)json_integer_value(json_object_get(m, "reps")));
        printf("throughput         %.1f tokens/s\n", json_number_value(json_object_get(m, "throughput_tokens_per_s")));
        printf("peak memory        %.1f MiB%s\n",
               json_integer_value(json_object_get(m, "peak_memory_bytes")) / 1048576.0,
               json_is_integer(pp) ? " (the process's RSS high-water mark)" : " (device memory)");
        printf("  engine's buffers %.1f MiB (weights %.1f MiB, request cache %.1f MiB)\n",
               json_integer_value(json_object_get(m, "backend_peak_bytes")) / 1048576.0,
               json_integer_value(json_object_get(m, "weights_bytes")) / 1048576.0,
               json_integer_value(json_object_get(m, "request_cache_bytes")) / 1048576.0);
    }
    json_decref(m);
    if (fflush(stdout) != 0) {
        perror("measure: stdout");
        return 1;
    }
    return 0;
}
