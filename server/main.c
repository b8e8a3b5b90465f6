/* server/main.c — process entry: dispatches `autocompress SUBCOMMAND ...` to the
 * subcommands declared in server/cli.h. No logic lives here. */
#include <stdio.h>
#include <string.h>

#include "engine/backend.h"
#include "server/cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"serve", cli_serve, "run the REST server"},
    {"worker", cli_worker, "run one job's pipeline (started by the server)"},
    {"run", cli_run, "run a job spec without a server, artifacts to a directory"},
    {"inspect", cli_inspect, "print a model's architecture, parameters and weight bytes"},
    {"generate", cli_generate, "generate text from a model"},
    {"perplexity", cli_perplexity, "perplexity of a model on a text file"},
    {"eval", cli_eval, "evaluate a model on benchmark tasks"},
    {"calibrate", cli_calibrate, "measure timing tables and the memory model on a target"},
    {"estimate", cli_estimate, "predict an architecture's latency, throughput and memory"},
    {"measure", cli_measure, "measure a model's latency, throughput and memory, served in this process"},
    {"prune", cli_prune, "rank and prune a model to a target architecture"},
    {"distill", cli_distill, "distill a pruned student from its parent"},
    {"search", cli_search, "search an architecture under deployment limits"},
    {"export", cli_export, "export a model as an HF directory or GGUF"},
    {"healthcheck", cli_healthcheck, "exit 0 when a running server answers /healthz (container checks)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: autocompress COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`autocompress COMMAND --help` describes each command's options.\n");
}

int main(int argc, char **argv)
{
    eng_blas_pick_kernel(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "autocompress: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
