/* server/cli_args.c — the subcommands' option parser (see cli_args.h): getopt_long with
 * the error reporting turned off and done here, exact long names, ranged numbers. */
#include "server/cli_args.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void cli_init(cli_parser *p, const char *cmd, int argc, char **argv, const struct option *opts,
              const char *shortopts, void (*usage)(FILE *f))
{
    memset(p, 0, sizeof *p);
    p->cmd = cmd;
    p->argc = argc;
    p->argv = argv;
    p->opts = opts;
    p->usage = usage;
    snprintf(p->shortopts, sizeof p->shortopts, ":%s", shortopts ? shortopts : "h");
    optind = 0;   /* glibc: a full restart of the scan (permutation state included) */
    opterr = 0;
}

void cli_set_target(cli_parser *p, cm_target *t)
{
    p->target = t;
}

int cli_fail(cli_parser *p, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", p->cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    p->failed = 1;
    return -1;
}

/* An unknown option: its name (up to any '='), then the usage. */
static int unknown(cli_parser *p, const char *text)
{
    fprintf(stderr, "%s: unknown option '%.*s'\n", p->cmd, (int)strcspn(text, "="), text);
    if (p->usage)
        p->usage(stderr);
    return CLI_EXIT_USAGE;
}

/* The argv element of the long option getopt_long just returned. */
static const char *long_element(const cli_parser *p, int idx)
{
    int separate = p->opts[idx].has_arg == required_argument && optarg && optind >= 2 && optarg == p->argv[optind - 1];
    return p->argv[optind - (separate ? 2 : 1)];
}

/* 1 when text ("--name" or "--name=v") names option idx exactly, not as a prefix. */
static int exact(const cli_parser *p, int idx, const char *text)
{
    size_t n = strlen(p->opts[idx].name);
    return !strncmp(text, "--", 2) && !strncmp(text + 2, p->opts[idx].name, n) && (text[2 + n] == 0 || text[2 + n] == '=');
}

static int target_opt(cli_parser *p, int c)
{
    cm_target *t = p->target;
    switch (c) {
    case CLI_OPT_DEVICE: return cli_str(p, t->device, sizeof t->device);
    case CLI_OPT_PRECISION: p->precision_given = 1; return cli_str(p, t->precision, sizeof t->precision);
    case CLI_OPT_BATCH: return cli_int(p, 1, 4096, &t->batch_size);
    case CLI_OPT_PROMPT: return cli_int(p, 1, 1 << 20, &t->prompt_tokens);
    case CLI_OPT_ENGINE: return cli_str(p, t->engine, sizeof t->engine);
    case CLI_OPT_KV_TYPE: p->kv_given = 1; return cli_str(p, t->kv_cache_type, sizeof t->kv_cache_type);
    case CLI_OPT_ENGINE_THREADS: p->threads_given = 1; return cli_int(p, 1, 1024, &t->threads);
    case CLI_OPT_FLASH_ATTN:
        p->flash_given = 1;
        return cli_str(p, t->flash_attention, sizeof t->flash_attention);
    default: return cli_int(p, 1, 1 << 20, &t->output_tokens);
    }
}

/* After the last option: the engine's defaults and the combination's check. */
static int target_finish(cli_parser *p)
{
    cm_target *t = p->target;
    int llama = cm_target_llamacpp(t);
    if (llama && !p->precision_given)
        snprintf(t->precision, sizeof t->precision, CM_LLAMACPP_DEFAULT_PRECISION);
    if (llama && !p->kv_given)
        snprintf(t->kv_cache_type, sizeof t->kv_cache_type, CM_LLAMACPP_DEFAULT_KV_TYPE);
    const char *field;
    char why[160];
    if (cm_engine_check(t->engine, t->device, t->precision, p->kv_given ? t->kv_cache_type : NULL,
                        p->threads_given ? t->threads : -1, p->flash_given ? t->flash_attention : NULL, &field, why,
                        sizeof why)) {
        cli_fail(p, "--%s: %s", !strcmp(field, "kv_cache_type") ? "kv-cache-type"
                                : !strcmp(field, "threads") ? "engine-threads"
                                : !strcmp(field, "flash_attention") ? "flash-attention" : field, why);
        return CLI_EXIT_USAGE;
    }
    if (cm_batch_check(t->engine, t->batch_size, why, sizeof why)) {
        cli_fail(p, "--batch: %s", why);
        return CLI_EXIT_USAGE;
    }
    if (llama && !p->flash_given)
        snprintf(t->flash_attention, sizeof t->flash_attention, "%s", cm_llamacpp_default_flash(t->kv_cache_type));
    return CLI_END;
}

int cli_next(cli_parser *p)
{
    for (;;) {
        if (p->failed)
            return CLI_EXIT_USAGE;
        int idx = -1;
        int c = getopt_long(p->argc, p->argv, p->shortopts, p->opts, &idx);
        p->arg = optarg;
        if (c == -1)
            return p->target ? target_finish(p) : CLI_END;
        const char *text = optind >= 1 && optind <= p->argc ? p->argv[optind - 1] : "";
        if (c == '?') {
            if (optopt && strncmp(text, "--", 2)) {   /* an unknown short option */
                char s[3] = {'-', (char)optopt, 0};
                return unknown(p, s);
            }
            for (int i = 0; optopt && p->opts[i].name; i++)   /* "--json=x": a value where none goes */
                if (p->opts[i].val == optopt && exact(p, i, text)) {
                    cli_fail(p, "--%s takes no value", p->opts[i].name);
                    return CLI_EXIT_USAGE;
                }
            return unknown(p, text);
        }
        if (c == ':') {
            for (int i = 0; p->opts[i].name; i++)
                if (p->opts[i].val == optopt && exact(p, i, text)) {
                    cli_fail(p, "--%s needs a value", p->opts[i].name);
                    return CLI_EXIT_USAGE;
                }
            if (strncmp(text, "--", 2)) {
                cli_fail(p, "-%c needs a value", optopt);
                return CLI_EXIT_USAGE;
            }
            return unknown(p, text);   /* an abbreviation of an option that takes a value */
        }
        if (idx >= 0) {
            const char *el = long_element(p, idx);
            if (!exact(p, idx, el))
                return unknown(p, el);
            snprintf(p->name, sizeof p->name, "--%s", p->opts[idx].name);
        } else {
            snprintf(p->name, sizeof p->name, "-%c", c);
        }
        if (c == 'h') {
            if (p->usage)
                p->usage(stdout);
            return CLI_EXIT_OK;
        }
        if (p->target && c >= CLI_OPT_DEVICE && c < CLI_OPT_OWN) {
            target_opt(p, c);
            continue;
        }
        return c;
    }
}

int cli_status(int c)
{
    return c == CLI_EXIT_OK ? 0 : 2;
}

const char *cli_operand(cli_parser *p)
{
    return optind < p->argc ? p->argv[optind++] : NULL;
}

int cli_no_more_operands(cli_parser *p)
{
    if (optind >= p->argc)
        return 0;
    return cli_fail(p, "unexpected argument '%s'", p->argv[optind]);
}

int cli_model_or_arch(cli_parser *p, const char *model, const char *arch_file)
{
    if (!!model != !!arch_file)
        return 0;
    fprintf(stderr, "%s: give exactly one of --model PATH and --arch FILE\n", p->cmd);
    if (p->usage)
        p->usage(stderr);
    return -1;
}

/* ---------- values ---------- */

static int bad_integer(cli_parser *p, long long lo, long long hi)
{
    if (hi == INT64_MAX)
        return cli_fail(p, "%s: '%s' is not an integer of at least %lld", p->name, p->arg, lo);
    return cli_fail(p, "%s: '%s' is not an integer from %lld to %lld", p->name, p->arg, lo, hi);
}

int cli_i64(cli_parser *p, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = p->arg ? strtoll(p->arg, &end, 10) : 0;
    if (!p->arg || errno || end == p->arg || *end || v < lo || v > hi)
        return bad_integer(p, lo, hi);
    *out = v;
    return 0;
}

int cli_long(cli_parser *p, long lo, long hi, long *out)
{
    int64_t v;
    if (cli_i64(p, lo, hi, &v))
        return -1;
    *out = (long)v;
    return 0;
}

int cli_int(cli_parser *p, int lo, int hi, int *out)
{
    int64_t v;
    if (cli_i64(p, lo, hi, &v))
        return -1;
    *out = (int)v;
    return 0;
}

int cli_u64(cli_parser *p, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = p->arg && p->arg[0] != '-' ? strtoull(p->arg, &end, 10) : 0;
    if (!p->arg || p->arg[0] == '-' || errno || end == p->arg || *end)
        return cli_fail(p, "%s: '%s' is not a non-negative integer", p->name, p->arg);
    *out = v;
    return 0;
}

/* strtod over the whole value, finite. 0, or -1 (nothing printed). */
static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || errno || end == s || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

int cli_num(cli_parser *p, double lo, double hi, double *out)
{
    double v;
    if (parse_double(p->arg, &v) || v < lo || v > hi) {
        if (isinf(hi))
            return cli_fail(p, "%s: '%s' is not a number of at least %g", p->name, p->arg, lo);
        return cli_fail(p, "%s: '%s' is not a number from %g to %g", p->name, p->arg, lo, hi);
    }
    *out = v;
    return 0;
}

int cli_positive(cli_parser *p, double *out)
{
    double v;
    if (parse_double(p->arg, &v) || !(v > 0))
        return cli_fail(p, "%s: '%s' is not a number above 0", p->name, p->arg);
    *out = v;
    return 0;
}

int cli_str(cli_parser *p, char *buf, size_t len)
{
    if (snprintf(buf, len, "%s", p->arg ? p->arg : "") >= (int)len)
        return cli_fail(p, "%s: '%.40s...' is longer than %zu characters", p->name, p->arg, len - 1);
    return 0;
}
