/* server/cli_args.h — number parsing shared by the subcommands' option handling. Each
 * accepts a whole decimal string only (no trailing characters, no overflow). */
#ifndef AC_SERVER_CLI_ARGS_H
#define AC_SERVER_CLI_ARGS_H

#include <stdint.h>

#include "compress/costmodel.h"

/* Parse s into *out within [lo, hi]. Returns 0, or -1 (nothing written) when s is not
 * a decimal integer in range. */
int cli_parse_long(const char *s, long lo, long hi, long *out);
int cli_parse_int(const char *s, int lo, int hi, int *out);
/* A non-negative 64-bit count. 0, or -1. */
int cli_parse_i64(const char *s, int64_t *out);

/* The target options shared by calibrate and estimate: --device, --precision, --batch,
 * --prompt, --output with value v. Returns 1 when opt is one of them (*bad set to 1 when
 * v does not fit), 0 when it is not a target option. */
int cli_target_opt(const char *opt, const char *v, cm_target *t, int *bad);

#endif
