/* llamacpp/ac_llama.c — `ac-llama`, the project's binding to real llama.cpp: a small
 * program linked to the libllama of the pinned llama-cpp-python package, run by the
 * product in a fresh process per model (compress/llamacpp.c). One JSON object on stdout;
 * on failure also "ac-llama: <reason>" on stderr and exit 1 (2 for usage).
 *
 *   ac-llama info
 *       {engine, ggml_version, ggml_commit, system_info, package, package_version, build_flags}
 *   ac-llama quantize IN.gguf OUT.gguf TYPE [--threads N]
 *       llama.cpp's quantizer (TYPE f16 bf16 q8_0 q4_0 q4_k_m q5_k_m q6_k); OUT appears whole
 *       or not at all. {type, bytes, seconds, fallbacks} (tensors stored in a fallback type)
 *   ac-llama bench MODEL.gguf [--threads N] [--batch B] [--prompt S] [--output N]
 *                  [--warmup W] [--reps R] [--kv-type T] [--seed X] [--mmap] [--cold | --flush BYTES]
 *                  [--flash-attn on|off|auto] [--verbose]
 *       Requests the way llama-bench times them: W untimed then R timed requests, the
 *       cache cleared before each; a request is a prefill of B rows of S random tokens
 *       (logits of each row's last token, greedy argmax) then N decode steps of one token
 *       per row, each step timed on the project's monotonic clock around llama_decode,
 *       llama_synchronize and the argmax. CPU only; weights read into llama.cpp's buffers
 *       (--mmap maps the file instead). {model, threads, batch, prompt, output,
 *       kv_type, n_ctx, n_params, model_bytes, n_vocab, buffers{model, kv, compute,
 *       output}, rss_before_load, rss_after_load, rss_peak, load_ms, reps[{prefill_ms,
 *       decode_ms[N]}], flush_bytes}; buffers are llama.cpp's own, read from its log lines.
 *       --cold flushes the CPU caches before each timed llama_decode (each thread reads
 *       its share of a buffer twice the last-level cache, outside the timer; the RSS
 *       figures leave the buffer out): a model smaller than the cache is then timed with
 *       its weights streaming from memory, as a served model larger than the cache has
 *       them. --flush BYTES reads a buffer of BYTES instead (0: none): the weights a
 *       larger model would stream between two steps of this one. Calibration's
 *       repeated-block models take the bytes by which the parent outweighs them, so each
 *       step finds the caches as it would in the parent (where a model fits the cache, as
 *       SmolLM2 fits a 260 MiB one, flushing it all would over-price it); served models
 *       are timed without either. --flash-attn: llama.cpp's flash attention (default
 *       auto, llama.cpp's own: on only where every layer has one V width; a quantized V
 *       cache forces it on).
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/clock.h"
#include "engine/procstat.h"
#include "engine/rng.h"
#include "ggml.h"
#include "llama.h"

#ifndef AC_LLAMA_PACKAGE_VERSION
#define AC_LLAMA_PACKAGE_VERSION "unknown"
#endif
#ifndef AC_LLAMA_BUILD_FLAGS
#define AC_LLAMA_BUILD_FLAGS "unknown"
#endif

/* ---------- output ---------- */

static int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ac-llama: %s\n", msg);
    json_t *o = json_pack("{s:s}", "error", msg);
    if (o) {
        char *s = json_dumps(o, JSON_COMPACT);
        if (s)
            printf("%s\n", s);
        free(s);
        json_decref(o);
    }
    return code;
}

static int emit(json_t *o)
{
    if (!o)
        return fail(1, "out of memory");
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s)
        return fail(1, "out of memory");
    int ok = printf("%s\n", s) > 0 && fflush(stdout) == 0;
    free(s);
    return ok ? 0 : 1;
}

/* ---------- llama.cpp's log: buffers and fallbacks ---------- */

static struct {
    int verbose;
    double model_mib, kv_mib, compute_mib, output_mib;
    int fallbacks, fallback_total, fallback_lines;
    char line[4096];
    size_t len;
} g_log;

static double mib_after(const char *line, const char *key)
{
    const char *p = strstr(line, key);
    if (!p)
        return -1;
    p += strlen(key);
    char *end;
    double v = strtod(p, &end);
    return end == p ? -1 : v;
}

static void log_line(const char *line)
{
    double v;
    if ((v = mib_after(line, "model buffer size =")) >= 0)
        g_log.model_mib += v;
    else if ((v = mib_after(line, "KV buffer size =")) >= 0 || (v = mib_after(line, "RS buffer size =")) >= 0)
        g_log.kv_mib += v;
    else if ((v = mib_after(line, "compute buffer size =")) >= 0)
        g_log.compute_mib += v;
    else if ((v = mib_after(line, "output buffer size =")) >= 0)
        g_log.output_mib += v;
    const char *f = strstr(line, "tensor(s) required fallback quantization");
    if (f) {
        const char *w = strstr(line, "WARNING:");
        int a = 0, b = 0;
        if (w && sscanf(w, "WARNING: %d of %d", &a, &b) == 2) {
            g_log.fallbacks = a;
            g_log.fallback_total = b;
        }
    }
    if (strstr(line, "not divisible by") && strstr(line, "required for type"))
        g_log.fallback_lines++;
}

/* llama.cpp logs in pieces; whole lines are parsed. */
/* A newline on stdout at most once a second, between timed steps and as llama.cpp logs
 * (a model's load and a quantization log every tensor): the sign of life the parent waits
 * for (compress/child.h); JSON allows the whitespace before the object. */
static void heartbeat(void)
{
    static double last;
    double now = eng_wall_s();
    if (now - last >= 1.0) {
        last = now;
        if (fputc('\n', stdout) != EOF)
            (void)fflush(stdout);
    }
}

static void on_log(enum ggml_log_level level, const char *text, void *ud)
{
    (void)level;
    (void)ud;
    heartbeat();
    if (g_log.verbose)
        fputs(text, stderr);
    for (const char *p = text; *p; p++) {
        if (*p == '\n' || g_log.len + 1 >= sizeof g_log.line) {
            g_log.line[g_log.len] = 0;
            log_line(g_log.line);
            g_log.len = 0;
            if (*p == '\n')
                continue;
        }
        g_log.line[g_log.len++] = *p;
    }
}

/* ---------- small helpers ---------- */

/* A positive int option value in [lo, hi]; -1 when it is not one. */
static int parse_int(const char *s, int lo, int hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    return (int)v;
}

/* A regular, readable GGUF file (magic checked), or a reason in why. */
static int check_gguf(const char *path, char *why, size_t n)
{
    struct stat st;
    if (stat(path, &st)) {
        snprintf(why, n, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, n, "%s: not a regular file", path);
        return -1;
    }
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    if (!f) {
        snprintf(why, n, "%s: %s", path, strerror(errno));
        return -1;
    }
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    if (got != 4 || memcmp(magic, "GGUF", 4)) {
        snprintf(why, n, "%s: not a GGUF file (no GGUF magic)", path);
        return -1;
    }
    return 0;
}

static const struct {
    const char *name;
    enum llama_ftype ftype;
} FTYPES[] = {{"f16", LLAMA_FTYPE_MOSTLY_F16},       {"bf16", LLAMA_FTYPE_MOSTLY_BF16},
              {"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},     {"q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},
              {"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M}, {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M},
              {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K}};

static const struct {
    const char *name;
    enum ggml_type type;
} KVTYPES[] = {{"f16", GGML_TYPE_F16}, {"f32", GGML_TYPE_F32}, {"bf16", GGML_TYPE_BF16},
               {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0}};

/* ---------- cache flush (--cold) ---------- */

static struct {
    unsigned char *buf;
    size_t bytes;
    int threads;
} g_flush;

typedef struct {
    const unsigned char *p;
    size_t n;
    unsigned sum;
} flush_part;

/* The last-level cache this machine's CPU 0 sees (sysfs, as the kernel reports it to
 * this guest; sysconf's figure may be the host package's), else 32 MiB. */
static size_t llc_bytes(void)
{
    size_t best = 0;
    for (int i = 0; i < 8; i++) {
        char path[96], buf[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        char *got = fgets(buf, sizeof buf, f);
        fclose(f);
        char *end;
        unsigned long long v = got ? strtoull(buf, &end, 10) : 0;
        if (!v)
            continue;
        if (*end == 'K')
            v <<= 10;
        else if (*end == 'M')
            v <<= 20;
        if (v > best)
            best = (size_t)v;
    }
#ifdef _SC_LEVEL3_CACHE_SIZE
    if (!best) {
        long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
        best = v > 0 ? (size_t)v : 0;
    }
#endif
    return best ? best : (size_t)32 << 20;
}

/* Twice the last-level cache, 8 MiB .. 512 MiB (or `bytes` when not -1), touched once (so that reading it later
 * reads memory, not the shared zero page). 0, or -1 (out of memory). */
static int flush_init(int threads, long long bytes)
{
    size_t n = 2 * llc_bytes();
    n = n < ((size_t)8 << 20) ? (size_t)8 << 20 : n > ((size_t)512 << 20) ? (size_t)512 << 20 : n;
    if (bytes >= 0)   /* --flush: exactly that many (page-rounded); none for 0 */
        n = ((size_t)bytes + 4095) & ~(size_t)4095;
    if (!n)
        return 0;
    g_flush.buf = malloc(n);
    if (!g_flush.buf)
        return -1;
    memset(g_flush.buf, 1, n);
    g_flush.bytes = n;
    g_flush.threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    return 0;
}

static void *flush_run(void *arg)
{
    flush_part *fp = arg;
    unsigned s = 0;
    for (size_t i = 0; i < fp->n; i += 64)
        s += fp->p[i];
    fp->sum = s;
    return NULL;
}

static volatile unsigned g_flush_sink;

/* Read the buffer, a share per thread (each core's private caches and the shared one
 * end up holding the buffer, not the model). Reads only: no dirty lines to write back
 * inside the next timed step. A thread that cannot start leaves its share to this one. */
static void flush_caches(void)
{
    if (!g_flush.buf)
        return;
    pthread_t th[64];
    flush_part part[64];
    int n = g_flush.threads, started[64] = {0};
    size_t share = g_flush.bytes / (size_t)n;
    for (int i = 0; i < n; i++) {
        part[i] = (flush_part){g_flush.buf + (size_t)i * share, i == n - 1 ? g_flush.bytes - (size_t)i * share : share,
                               0};
        started[i] = i > 0 && pthread_create(&th[i], NULL, flush_run, &part[i]) == 0;
    }
    for (int i = 0; i < n; i++)
        if (!started[i])
            flush_run(&part[i]);
    unsigned s = 0;
    for (int i = 0; i < n; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        s += part[i].sum;
    }
    g_flush_sink = s;
}

/* ---------- info ---------- */

static int cmd_info(void)
{
    char sys[1024];
    snprintf(sys, sizeof sys, "%s", llama_print_system_info());
    for (size_t n = strlen(sys); n > 0 && (sys[n - 1] == ' ' || sys[n - 1] == '|' || sys[n - 1] == '\n'); n--)
        sys[n - 1] = 0;
    return emit(json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s}", "engine", "llama.cpp", "ggml_version", ggml_version(),
                          "ggml_commit", ggml_commit(), "system_info", sys, "package", "llama-cpp-python",
                          "package_version", AC_LLAMA_PACKAGE_VERSION, "build_flags", AC_LLAMA_BUILD_FLAGS));
}

/* ---------- quantize ---------- */

static int cmd_quantize(int argc, char **argv)
{
    if (argc < 3)
        return fail(2, "usage: ac-llama quantize IN.gguf OUT.gguf TYPE [--threads N]");
    const char *in = argv[0], *out = argv[1], *type = argv[2];
    int threads = 0;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            if ((threads = parse_int(argv[++i], 1, 1024)) < 0)
                return fail(2, "--threads %s: not a count 1..1024", argv[i]);
        } else {
            return fail(2, "quantize: unknown option %s", argv[i]);
        }
    }
    int k = -1;
    for (size_t i = 0; i < sizeof FTYPES / sizeof *FTYPES; i++)
        if (!strcmp(FTYPES[i].name, type))
            k = (int)i;
    if (k < 0)
        return fail(2, "quantize: unknown type %s (f16 bf16 q8_0 q4_0 q4_k_m q5_k_m q6_k)", type);
    char why[600];
    if (check_gguf(in, why, sizeof why))
        return fail(1, "%s", why);
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp-%d", out, (int)getpid()) >= (int)sizeof tmp)
        return fail(1, "%s: path too long", out);
    struct llama_model_quantize_params qp = llama_model_quantize_default_params();
    qp.nthread = threads;
    qp.ftype = FTYPES[k].ftype;
    double t0 = eng_wall_s();
    uint32_t rc = llama_model_quantize(in, tmp, &qp);
    double dt = eng_wall_s() - t0;
    if (rc) {
        (void)unlink(tmp);
        return fail(1, "quantize %s to %s failed (llama.cpp status %u)", in, type, rc);
    }
    struct stat st;
    if (stat(tmp, &st) || rename(tmp, out)) {
        int e = errno;
        (void)unlink(tmp);
        return fail(1, "%s: %s", out, strerror(e));
    }
    int fb = g_log.fallbacks > g_log.fallback_lines ? g_log.fallbacks : g_log.fallback_lines;
    return emit(json_pack("{s:s,s:I,s:f,s:i}", "type", type, "bytes", (json_int_t)st.st_size, "seconds", dt,
                          "fallbacks", fb));
}

/* ---------- bench ---------- */

typedef struct {
    int threads, batch, prompt, output, warmup, reps, mmap, cold;
    long long flush;   /* --flush BYTES; -1: not given */
    int flash;         /* LLAMA_FLASH_ATTN_TYPE_* */
    const char *kv;
    uint64_t seed;
} bench_opts;

static int parse_bench(int argc, char **argv, bench_opts *o)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    *o = (bench_opts){.threads = n > 0 ? (int)n : 1, .batch = 1, .prompt = 256, .output = 64, .warmup = 1,
                      .reps = 3, .flush = -1, .flash = LLAMA_FLASH_ATTN_TYPE_AUTO, .kv = "f16", .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *dst = NULL, lo = 1, hi = 1 << 20;
        if (!strcmp(a, "--verbose")) {
            g_log.verbose = 1;
            continue;
        }
        if (!strcmp(a, "--mmap")) {
            o->mmap = 1;
            continue;
        }
        if (!strcmp(a, "--cold")) {
            o->cold = 1;
            continue;
        }
        if (!v)
            return fail(2, "bench: %s needs a value", a);
        if (!strcmp(a, "--threads")) {
            dst = &o->threads;
            hi = 1024;
        } else if (!strcmp(a, "--batch")) {
            dst = &o->batch;
            hi = 4096;
        } else if (!strcmp(a, "--prompt")) {
            dst = &o->prompt;
        } else if (!strcmp(a, "--output")) {
            dst = &o->output;
        } else if (!strcmp(a, "--warmup")) {
            dst = &o->warmup;
            lo = 0;
            hi = 1000;
        } else if (!strcmp(a, "--reps")) {
            dst = &o->reps;
            hi = 1000;
        } else if (!strcmp(a, "--kv-type")) {
            o->kv = v;
        } else if (!strcmp(a, "--flash-attn")) {
            if (!strcmp(v, "on"))
                o->flash = LLAMA_FLASH_ATTN_TYPE_ENABLED;
            else if (!strcmp(v, "off"))
                o->flash = LLAMA_FLASH_ATTN_TYPE_DISABLED;
            else if (!strcmp(v, "auto"))
                o->flash = LLAMA_FLASH_ATTN_TYPE_AUTO;
            else
                return fail(2, "--flash-attn %s: not on, off or auto", v);
        } else if (!strcmp(a, "--flush")) {
            char *end;
            errno = 0;
            long long b = strtoll(v, &end, 10);
            if (errno || end == v || *end || b < 0 || b > (1LL << 36))
                return fail(2, "--flush %s: not a byte count 0..64 GiB", v);
            o->flush = b;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end)
                return fail(2, "--seed %s: not a number", v);
            o->seed = s;
        } else {
            return fail(2, "bench: unknown option %s", a);
        }
        if (dst && (*dst = parse_int(v, lo, hi)) < 0)
            return fail(2, "%s %s: not a number in %d..%d", a, v, lo, hi);
        i++;
    }
    /* the context holds every sequence's prompt and output: it must fit llama.cpp's counts */
    if ((int64_t)o->batch * (o->prompt + o->output) > INT32_MAX)
        return fail(2, "--batch %d x (--prompt %d + --output %d): a context of more than %d tokens", o->batch,
                    o->prompt, o->output, INT32_MAX);
    return 0;
}

/* Greedy argmax of row i's logits. */
static llama_token argmax(struct llama_context *ctx, int i, int n_vocab)
{
    const float *l = llama_get_logits_ith(ctx, i);
    if (!l)
        return -1;
    int best = 0;
    for (int k = 1; k < n_vocab; k++)
        if (l[k] > l[best])
            best = k;
    return best;
}

static void batch_add(struct llama_batch *b, llama_token t, llama_pos pos, llama_seq_id seq, int logits)
{
    int i = b->n_tokens++;
    b->token[i] = t;
    b->pos[i] = pos;
    b->n_seq_id[i] = 1;
    b->seq_id[i][0] = seq;
    b->logits[i] = (int8_t)logits;
}

/* One request: prefill then output steps; times into pre and dec[output]. 0, or -1. */
static int request(struct llama_context *ctx, const bench_opts *o, int n_vocab, uint64_t seed, struct llama_batch *b,
                   llama_token *next, double *pre, double *dec)
{
    llama_memory_clear(llama_get_memory(ctx), true);
    uint64_t s = seed;
    b->n_tokens = 0;
    for (int r = 0; r < o->batch; r++)
        for (int p = 0; p < o->prompt; p++)
            batch_add(b, (llama_token)(eng_splitmix64(&s) % (uint64_t)n_vocab), p, r, p == o->prompt - 1);
    flush_caches();
    double t0 = eng_wall_s();
    if (llama_decode(ctx, *b))
        return -1;
    llama_synchronize(ctx);
    for (int r = 0; r < o->batch; r++)
        if ((next[r] = argmax(ctx, (r + 1) * o->prompt - 1, n_vocab)) < 0)
            return -1;
    *pre = (eng_wall_s() - t0) * 1000;
    heartbeat();
    for (int i = 0; i < o->output; i++) {
        b->n_tokens = 0;
        for (int r = 0; r < o->batch; r++)
            batch_add(b, next[r], o->prompt + i, r, 1);
        flush_caches();
        t0 = eng_wall_s();
        if (llama_decode(ctx, *b))
            return -1;
        llama_synchronize(ctx);
        for (int r = 0; r < o->batch; r++)
            if ((next[r] = argmax(ctx, r, n_vocab)) < 0)
                return -1;
        dec[i] = (eng_wall_s() - t0) * 1000;
        heartbeat();
    }
    return 0;
}

static int cmd_bench(int argc, char **argv)
{
    if (argc < 1)
        return fail(2, "usage: ac-llama bench MODEL.gguf [options]");
    bench_opts o;
    int rc = parse_bench(argc, argv, &o);
    if (rc)
        return rc;
    const char *path = argv[0];
    int kv = -1;
    for (size_t i = 0; i < sizeof KVTYPES / sizeof *KVTYPES; i++)
        if (!strcmp(KVTYPES[i].name, o.kv))
            kv = (int)i;
    if (kv < 0)
        return fail(2, "--kv-type %s: not one of f16 f32 bf16 q8_0 q4_0", o.kv);
    int quantized_kv = KVTYPES[kv].type == GGML_TYPE_Q8_0 || KVTYPES[kv].type == GGML_TYPE_Q4_0;
    if (quantized_kv && o.flash == LLAMA_FLASH_ATTN_TYPE_DISABLED)
        return fail(2, "--flash-attn off: a quantized V cache (--kv-type %s) needs flash attention", o.kv);
    char why[600];
    if (check_gguf(path, why, sizeof why))
        return fail(1, "%s", why);
    int64_t rss0 = eng_proc_status_bytes("VmRSS");
    /* before the model, so that every RSS figure after it holds the buffer whole */
    if (o.cold && o.flush >= 0)
        return fail(2, "bench: --cold and --flush are one choice: give one");
    if ((o.cold || o.flush >= 0) && flush_init(o.threads, o.flush))
        return fail(1, "out of memory (the cache-flush buffer)");
    int64_t fb = (int64_t)g_flush.bytes;
    double t0 = eng_wall_s();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    /* Weights read into llama.cpp's buffers: the RSS is then exactly its buffers plus the
     * runtime. Mapped (--mmap), the repacked tensors' file pages stay untouched and the
     * "model buffer" lines count them twice; the resident set is the same either way. */
    mp.load_mode = o.mmap ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
    struct llama_model *model = llama_model_load_from_file(path, mp);
    if (!model)
        return fail(1, "%s: llama.cpp could not load the model (see --verbose)", path);
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(o.batch * (o.prompt + o.output));
    cp.n_seq_max = (uint32_t)o.batch;
    cp.n_threads = cp.n_threads_batch = o.threads;
    if ((uint32_t)(o.batch * o.prompt) > cp.n_batch)
        cp.n_batch = (uint32_t)(o.batch * o.prompt);
    cp.type_k = cp.type_v = KVTYPES[kv].type;
    cp.flash_attn_type = quantized_kv ? LLAMA_FLASH_ATTN_TYPE_ENABLED : o.flash;   /* a quantized V cache needs it */
    cp.no_perf = true;
    struct llama_context *ctx = n_vocab > 0 ? llama_init_from_model(model, cp) : NULL;
    if (!ctx) {
        llama_model_free(model);
        return fail(1, "%s: llama.cpp could not create a context (n_ctx %u, kv %s%s)", path, cp.n_ctx, o.kv,
                    n_vocab > 0 ? "" : ", no vocabulary size");
    }
    double load_ms = (eng_wall_s() - t0) * 1000;
    int64_t rss1 = eng_proc_status_bytes("VmRSS");
    rss1 -= rss1 >= fb ? fb : 0;
    struct llama_batch b = llama_batch_init(o.batch * o.prompt, 0, 1);
    llama_token *next = calloc((size_t)o.batch, sizeof *next);
    double *dec = calloc((size_t)o.output, sizeof *dec);
    json_t *reps = json_array();
    rc = 0;
    if (!next || !dec || !reps)
        rc = fail(1, "out of memory");
    for (int r = 0; rc == 0 && r < o.warmup + o.reps; r++) {
        double pre;
        if (request(ctx, &o, n_vocab, o.seed + (uint64_t)r * 0x9E3779B97F4A7C15ull, &b, next, &pre, dec)) {
            rc = fail(1, "%s: llama_decode failed in request %d", path, r);
            break;
        }
        if (r < o.warmup)
            continue;
        json_t *d = json_array();
        for (int i = 0; d && i < o.output; i++)
            if (json_array_append_new(d, json_real(dec[i])))
                d = NULL;
        if (!d || json_array_append_new(reps, json_pack("{s:f,s:o}", "prefill_ms", pre, "decode_ms", d)))
            rc = fail(1, "out of memory");
    }
    uint32_t n_ctx = llama_n_ctx(ctx);
    int64_t n_params = (int64_t)llama_model_n_params(model), mbytes = (int64_t)llama_model_size(model);
    llama_batch_free(b);
    free(next);
    free(dec);
    llama_free(ctx);
    llama_model_free(model);
    int64_t hwm = eng_proc_status_bytes("VmHWM");
    hwm -= hwm >= fb ? fb : 0;
    free(g_flush.buf);
    g_flush.buf = NULL;
    if (rc) {
        json_decref(reps);
        return rc;
    }
    const double MiB = 1024.0 * 1024.0;
    return emit(json_pack(
        "{s:s,s:i,s:i,s:i,s:i,s:s,s:i,s:I,s:I,s:i,s:{s:I,s:I,s:I,s:I},s:I,s:I,s:I,s:f,s:o,s:I}", "model", path, "threads",
        o.threads, "batch", o.batch, "prompt", o.prompt, "output", o.output, "kv_type", o.kv, "n_ctx", (int)n_ctx,
        "n_params", (json_int_t)n_params, "model_bytes", (json_int_t)mbytes, "n_vocab", n_vocab, "buffers", "model",
        (json_int_t)(g_log.model_mib * MiB + 0.5), "kv", (json_int_t)(g_log.kv_mib * MiB + 0.5), "compute",
        (json_int_t)(g_log.compute_mib * MiB + 0.5), "output", (json_int_t)(g_log.output_mib * MiB + 0.5),
        "rss_before_load", (json_int_t)rss0, "rss_after_load", (json_int_t)rss1, "rss_peak", (json_int_t)hwm,
        "load_ms", load_ms, "reps", reps, "flush_bytes", fb));
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return fail(2, "usage: ac-llama info | quantize IN OUT TYPE | bench MODEL [options]");
    llama_log_set(on_log, NULL);
    llama_backend_init();
    int rc;
    if (!strcmp(argv[1], "info"))
        rc = cmd_info();
    else if (!strcmp(argv[1], "quantize"))
        rc = cmd_quantize(argc - 2, argv + 2);
    else if (!strcmp(argv[1], "bench"))
        rc = cmd_bench(argc - 2, argv + 2);
    else
        rc = fail(2, "unknown subcommand %s (info, quantize, bench)", argv[1]);
    llama_backend_free();
    return rc;
}
