/* server/cli_args.c — decimal option values for the subcommands. */
#include "server/cli_args.h"

#include <errno.h>
#include <stdlib.h>

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
