/* server/cli_args.c — decimal option values for the subcommands. */
#include "server/cli_args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int cli_parse_int(const char *s, int lo, int hi, int *out)
{
    long v;
    if (cli_parse_long(s, lo, hi, &v) != 0)
        return -1;
    *out = (int)v;
    return 0;
}

int cli_parse_i64(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0)
        return -1;
    *out = v;
    return 0;
}

int cli_target_opt(const char *opt, const char *v, cm_target *t, int *bad)
{
    if (!strcmp(opt, "--device"))
        *bad = snprintf(t->device, sizeof t->device, "%s", v) >= (int)sizeof t->device;
    else if (!strcmp(opt, "--precision"))
        *bad = snprintf(t->precision, sizeof t->precision, "%s", v) >= (int)sizeof t->precision;
    else if (!strcmp(opt, "--batch"))
        *bad = cli_parse_int(v, 1, 4096, &t->batch_size) != 0;
    else if (!strcmp(opt, "--prompt"))
        *bad = cli_parse_int(v, 1, 1 << 20, &t->prompt_tokens) != 0;
    else if (!strcmp(opt, "--output"))
        *bad = cli_parse_int(v, 1, 1 << 20, &t->output_tokens) != 0;
    else
        return 0;
    return 1;
}
