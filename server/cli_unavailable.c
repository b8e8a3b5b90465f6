/* server/cli_unavailable.c — weak fallbacks for subcommands whose implementation is not
 * part of this build. Each says so plainly and exits 2; a file defining the real
 * subcommand (strong symbol) replaces it at link time. */
#include <stdio.h>

#include "server/cli.h"

#define UNAVAILABLE(fn, what)                                                           \
    __attribute__((weak)) int fn(int argc, char **argv)                                 \
    {                                                                                   \
        (void)argc;                                                                     \
        (void)argv;                                                                     \
        fprintf(stderr, "autocompress: '%s' is not available in this build\n", what);   \
        return 2;                                                                       \
    }

UNAVAILABLE(cli_serve, "serve")
UNAVAILABLE(cli_worker, "worker")
UNAVAILABLE(cli_run, "run")
UNAVAILABLE(cli_inspect, "inspect")
UNAVAILABLE(cli_generate, "generate")
UNAVAILABLE(cli_perplexity, "perplexity")
UNAVAILABLE(cli_eval, "eval")
UNAVAILABLE(cli_calibrate, "calibrate")
UNAVAILABLE(cli_estimate, "estimate")
UNAVAILABLE(cli_prune, "prune")
UNAVAILABLE(cli_distill, "distill")
UNAVAILABLE(cli_search, "search")
UNAVAILABLE(cli_export, "export")
