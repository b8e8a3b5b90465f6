/* server/cli_args.h — the one option parser of the subcommands: getopt_long over each
 * command's table of long options, with exact names only (no abbreviations), the same
 * messages everywhere ("CMD: unknown option '--x'", "CMD: --x needs a value", exit
 * status 2), numbers checked against ranges, --help, and the target options
 * (--device --precision --batch --prompt --output) that calibrate, estimate and search
 * share. Not reentrant: getopt_long's state is global, one parse at a time.
 */
#ifndef AC_SERVER_CLI_ARGS_H
#define AC_SERVER_CLI_ARGS_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "compress/costmodel.h"

/* What cli_next returns besides an option's value (always > 0). */
enum {
    CLI_END = -1,          /* no more options; operands follow (cli_operand) */
    CLI_EXIT_OK = -2,      /* --help printed the usage on stdout: exit 0 */
    CLI_EXIT_USAGE = -3,   /* a message went to stderr: exit 2 */
};

/* Option values above every character: the target options, then the commands' own. */
enum {
    CLI_OPT_DEVICE = 0x100, CLI_OPT_PRECISION, CLI_OPT_BATCH, CLI_OPT_PROMPT, CLI_OPT_OUTPUT, CLI_OPT_ENGINE,
    CLI_OPT_KV_TYPE, CLI_OPT_ENGINE_THREADS, CLI_OPT_FLASH_ATTN, CLI_OPT_OWN = 0x120
};

/* The target options, for a command's option table (handled by cli_next once
 * cli_set_target names the cm_target they fill). */
#define CLI_TARGET_OPTIONS                                                                                       \
    {"device", required_argument, NULL, CLI_OPT_DEVICE}, {"precision", required_argument, NULL, CLI_OPT_PRECISION}, \
        {"batch", required_argument, NULL, CLI_OPT_BATCH}, {"prompt", required_argument, NULL, CLI_OPT_PROMPT},     \
        {"output", required_argument, NULL, CLI_OPT_OUTPUT}, {"engine", required_argument, NULL, CLI_OPT_ENGINE},   \
        {"kv-cache-type", required_argument, NULL, CLI_OPT_KV_TYPE},                                             \
        {"engine-threads", required_argument, NULL, CLI_OPT_ENGINE_THREADS},                                     \
        {"flash-attention", required_argument, NULL, CLI_OPT_FLASH_ATTN}

typedef struct {
    const char *cmd;                 /* message prefix: "prune" */
    int argc;
    char **argv;                     /* argv[0] is the command's name */
    const struct option *opts;       /* ends with {0}; "help" maps to 'h' */
    char shortopts[64];              /* ":" then the short options */
    void (*usage)(FILE *f);
    cm_target *target;               /* filled by the target options (NULL: none) */
    int precision_given, kv_given, threads_given, flash_given;
    const char *arg;                 /* the current option's value (NULL when it takes none) */
    char name[64];                   /* the current option as written: "--limit", "-v" */
    int failed;                      /* a message was printed: cli_next returns CLI_EXIT_USAGE */
} cli_parser;

/* Start parsing argv (argv[0]: the command) against opts and the short options (NULL:
 * "h"). usage prints the command's usage; --help (value 'h') prints it on stdout. */
void cli_init(cli_parser *p, const char *cmd, int argc, char **argv, const struct option *opts,
              const char *shortopts, void (*usage)(FILE *f));
/* Fill *t from --device, --precision, --batch (1..4096), --prompt and --output
 * (1..2^20 tokens), --engine (autocompress, llama.cpp), --kv-cache-type,
 * --engine-threads and --flash-attention (llama.cpp); t keeps its values for the options not given. The
 * combination is checked (cm_engine_check) when the options end; a llama.cpp target
 * without --precision gets llama.cpp's default weight type. */
void cli_set_target(cli_parser *p, cm_target *t);

/* The next option's value (> 0; p->arg holds its argument), or CLI_END, CLI_EXIT_OK or
 * CLI_EXIT_USAGE (after an unknown option, a missing value, a value a cli_* helper
 * refused or cli_fail). Prints the message itself. */
int cli_next(cli_parser *p);
/* The exit status for a cli_next result that ended the loop other than with CLI_END:
 * 0 for CLI_EXIT_OK, else 2. */
int cli_status(int c);

/* The next operand (a non-option argument) or NULL when there is none. */
const char *cli_operand(cli_parser *p);
/* 0 when every operand has been taken, else -1 after "CMD: unexpected argument 'x'". */
int cli_no_more_operands(cli_parser *p);

/* After the options: 0 when exactly one of --model (model) and --arch (arch_file) was
 * given, else -1 after "CMD: give exactly one of --model PATH and --arch FILE" and the
 * usage on stderr. */
int cli_model_or_arch(cli_parser *p, const char *model, const char *arch_file);

/* Print "CMD: " and the message on stderr and mark the parse failed. Returns -1. */
int cli_fail(cli_parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The current option's value as a whole decimal number in [lo, hi], into *out. 0, or -1
 * (message printed, parse failed, *out untouched). */
int cli_int(cli_parser *p, int lo, int hi, int *out);
int cli_long(cli_parser *p, long lo, long hi, long *out);
int cli_i64(cli_parser *p, int64_t lo, int64_t hi, int64_t *out);
int cli_u64(cli_parser *p, uint64_t *out);
/* A finite number in [lo, hi] (strtod syntax), or one above 0 (cli_positive). */
int cli_num(cli_parser *p, double lo, double hi, double *out);
int cli_positive(cli_parser *p, double *out);
/* A copy of the value into buf; fails when it does not fit. */
int cli_str(cli_parser *p, char *buf, size_t len);

#endif
