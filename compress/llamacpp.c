/* compress/llamacpp.c — llama.cpp through its measurement helper: finding and asking
 * `ac-llama`, one fresh helper process per model (argv in, one JSON object out), random
 * GGUF models at the target's weight type, and the measured fields from its numbers.
 */
#include "compress/llamacpp.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compress/child.h"
#include "engine/backend.h"
#include "engine/clock.h"
#include "engine/devices.h"
#include "storage/export.h"
#include "storage/fileio.h"

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

/* The helper: its messages, and the longest it may say nothing (it writes a newline a
 * second as it loads, serves and quantizes). Its `info` answers in a second: an API
 * request waits on it, so a hung one is given up after a minute. */
static const ch_kind LC_HELPER = {.what = "llama.cpp helper", .engine = "llama.cpp", .timeout_s = 1800.0};
static const ch_kind LC_INFO = {.what = "llama.cpp helper", .engine = "llama.cpp", .timeout_s = 60.0};

static int run_helper(char *const argv[], const ms_opts *o, json_t **out, char *err, size_t errlen)
{
    return ch_run_json(&LC_HELPER, argv, o, out, err, errlen);
}

static int find_helper(char *out, size_t cap)
{
    return ch_find_program("AC_LLAMA_HELPER", "ac-llama", out, cap);
}

static void copy_str(json_t *j, const char *k, char *out, size_t cap)
{
    json_t *v = json_object_get(j, k);
    snprintf(out, cap, "%s", json_is_string(v) ? json_string_value(v) : "unknown");
}

/* Ask the helper at info->helper about its build; info's other fields from its answer. */
static int ask_helper(lc_info *info, char *err, size_t errlen)
{
    char *argv[] = {info->helper, "info", NULL};
    json_t *j;
    if (ch_run_json(&LC_INFO, argv, NULL, &j, err, errlen))
        return -1;
    copy_str(j, "ggml_version", info->ggml_version, sizeof info->ggml_version);
    copy_str(j, "ggml_commit", info->ggml_commit, sizeof info->ggml_commit);
    copy_str(j, "package_version", info->package_version, sizeof info->package_version);
    copy_str(j, "build_flags", info->build_flags, sizeof info->build_flags);
    copy_str(j, "system_info", info->system_info, sizeof info->system_info);
    json_decref(j);
    char key[1024];
    int n = snprintf(key, sizeof key, "%s|%s|%s|%s", info->ggml_commit, info->package_version, info->build_flags,
                     info->system_info);
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)key, (size_t)(n < 0 ? 0 : n >= (int)sizeof key ? (int)sizeof key - 1 : n), md);
    snprintf(info->fingerprint, sizeof info->fingerprint, "llama.cpp %.12s %.12s %02x%02x%02x%02x",
             info->package_version, info->ggml_commit, md[0], md[1], md[2], md[3]);
    return 0;
}

/* How long a helper that failed to answer is taken at its word: the API's request threads
 * and a runner's engine probe (every 10 s) ask, and each question would start a helper,
 * for up to a minute when it hangs. A helper installed or rebuilt since (another file at
 * its path) is asked at once. */
#define LC_PROBE_RETRY_S 10.0

/* The helper's answer: kept once it has given one, its failure for LC_PROBE_RETRY_S. One
 * question at a time: threads that ask while it is out wait for its answer. */
static pthread_mutex_t g_probe_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_probe_cv = PTHREAD_COND_INITIALIZER;
static struct {
    int asking, state;          /* state 1 answered, -1 failed, 0 not asked */
    lc_info info;
    char err[512];
    double failed_at;
    struct stat file;           /* the helper that failed */
} g_probe;

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

int lc_probe(lc_info *info, char *err, size_t errlen)
{
    memset(info, 0, sizeof *info);
    pthread_mutex_lock(&g_probe_mu);
    while (g_probe.asking)
        pthread_cond_wait(&g_probe_cv, &g_probe_mu);
    if (g_probe.state == 1) {
        *info = g_probe.info;
        pthread_mutex_unlock(&g_probe_mu);
        return 0;
    }
    struct stat file;
    if (find_helper(info->helper, sizeof info->helper) || stat(info->helper, &file)) {
        pthread_mutex_unlock(&g_probe_mu);
        FAIL("llama.cpp is not installed here: no executable ac-llama helper (AC_LLAMA_HELPER, or beside the "
             "autocompress binary); install it with scripts/llamacpp.sh install, then make");
    }
    if (g_probe.state == -1 && eng_wall_s() - g_probe.failed_at < LC_PROBE_RETRY_S &&
        same_file(&file, &g_probe.file)) {
        snprintf(err, errlen, "%s", g_probe.err);
        pthread_mutex_unlock(&g_probe_mu);
        return -1;
    }
    g_probe.asking = 1;
    pthread_mutex_unlock(&g_probe_mu);
    int rc = ask_helper(info, err, errlen);
    pthread_mutex_lock(&g_probe_mu);
    g_probe.asking = 0;
    g_probe.state = rc == 0 ? 1 : -1;
    if (rc == 0) {
        g_probe.info = *info;
    } else {
        snprintf(g_probe.err, sizeof g_probe.err, "%s", err);
        g_probe.failed_at = eng_wall_s();
        g_probe.file = file;
    }
    pthread_cond_broadcast(&g_probe_cv);
    pthread_mutex_unlock(&g_probe_mu);
    return rc;
}

json_t *lc_engine_json(void)
{
    lc_info in;
    char e[512];
    int ok = lc_probe(&in, e, sizeof e) == 0;
    json_t *o = json_pack("{s:s,s:b,s:o,s:o,s:o,s:s}", "name", CM_ENGINE_LLAMACPP, "present", ok, "precisions",
                          cm_words_json(CM_LLAMACPP_PRECISIONS), "kv_cache_types", cm_words_json(CM_LLAMACPP_KV_TYPES),
                          "flash_attention", cm_words_json(CM_LLAMACPP_FLASH_ATTN), "default_precision",
                          CM_LLAMACPP_DEFAULT_PRECISION);
    if (!o)
        return NULL;
    int bad = 0;
    if (ok) {
        bad |= json_object_set_new(o, "version", json_string(in.package_version));
        bad |= json_object_set_new(o, "ggml_version", json_string(in.ggml_version));
        bad |= json_object_set_new(o, "commit", json_string(in.ggml_commit));
        bad |= json_object_set_new(o, "build_flags", json_string(in.build_flags));
        bad |= json_object_set_new(o, "system_info", json_string(in.system_info));
        bad |= json_object_set_new(o, "engine_build", json_string(in.fingerprint));
    } else {
        bad |= json_object_set_new(o, "reason", json_string(e));
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int lc_target_resolve(cm_target *t, char *err, size_t errlen)
{
    if (!cm_target_llamacpp(t))
        return 0;
    lc_info in;
    if (lc_probe(&in, err, errlen))
        return -1;
    if (t->threads <= 0)   /* every CPU this process may run on, not the host's count */
        t->threads = eng_cpu_cores();
    snprintf(t->engine_build, sizeof t->engine_build, "%s", in.fingerprint);
    return 0;
}

/* ---------- quantizing and serving ---------- */

/* Remove the helper's partial outputs of dst (DST.tmp-PID, renamed to dst when it
 * finishes): a helper killed mid-quantization (a cancel, a lost lease, a shutdown) leaves
 * one, which would otherwise stay in the stage's folder and be shipped with its outputs. */
static void drop_partials(const char *dst)
{
    char dir[4096], pre[512], **names;
    size_t n;
    const char *slash = strrchr(dst, '/');
    fio_dir_of(dst, dir, sizeof dir);
    if (snprintf(pre, sizeof pre, "%s.tmp-", slash ? slash + 1 : dst) >= (int)sizeof pre ||
        fio_list_dir(*dir ? dir : "/", &names, &n))
        return;
    for (size_t i = 0; i < n; i++) {
        char p[4600];
        if (!strncmp(names[i], pre, strlen(pre)) && !fio_path_join(p, sizeof p, dir, names[i]))
            (void)unlink(p);   /* best effort: what stays is only disk */
    }
    fio_names_free(names, n);
}

int lc_quantize(const char *src, const char *dst, const char *type, int threads, int *fallbacks, const ms_opts *stop,
                char *err, size_t errlen)
{
    if (fallbacks)
        *fallbacks = 0;
    if (!strcmp(type, "f32")) {
        if (!strcmp(src, dst))
            return 0;
        if (rename(src, dst))
            FAIL("%s: %s", dst, strerror(errno));
        return 0;
    }
    lc_info in;
    if (lc_probe(&in, err, errlen))
        return -1;
    char th[16];
    snprintf(th, sizeof th, "%d", threads > 0 ? threads : 1);
    char *argv[] = {in.helper, "quantize", (char *)src, (char *)dst, (char *)type, "--threads", th, NULL};
    json_t *j;
    drop_partials(dst);   /* an earlier attempt's */
    if (run_helper(argv, stop, &j, err, errlen)) {
        drop_partials(dst);
        return -1;
    }
    json_t *fb = json_object_get(j, "fallbacks");
    if (fallbacks && json_is_integer(fb))
        *fallbacks = (int)json_integer_value(fb);
    json_decref(j);
    return 0;
}

void lc_bench_free(lc_bench *b)
{
    free(b->prefill_ms);
    free(b->decode_ms);
    memset(b, 0, sizeof *b);
}

static int64_t jint(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : json_is_number(v) ? (int64_t)json_number_value(v) : -1;
}

/* Parse the helper's bench object into b. 0, or -1 with err. */
static int parse_bench(json_t *j, const cm_target *t, lc_bench *b, char *err, size_t errlen)
{
    json_t *reps = json_object_get(j, "reps"), *buf = json_object_get(j, "buffers");
    int R = json_is_array(reps) ? (int)json_array_size(reps) : 0, N = t->output_tokens;
    if (R <= 0 || !json_is_object(buf))
        FAIL("llama.cpp helper: bench output without reps or buffers");
    b->prefill_ms = calloc((size_t)R, sizeof(double));
    b->decode_ms = calloc((size_t)R * (size_t)N, sizeof(double));
    if (!b->prefill_ms || !b->decode_ms)
        FAIL("out of memory");
    b->reps = R;
    b->n_steps = N;
    for (int r = 0; r < R; r++) {
        json_t *rep = json_array_get(reps, (size_t)r), *dec = json_object_get(rep, "decode_ms");
        json_t *pre = json_object_get(rep, "prefill_ms");
        if (!json_is_number(pre) || !json_is_array(dec) || (int)json_array_size(dec) != N)
            FAIL("llama.cpp helper: request %d has no prefill time or not %d decode steps", r, N);
        b->prefill_ms[r] = json_number_value(pre);
        for (int i = 0; i < N; i++) {
            json_t *v = json_array_get(dec, (size_t)i);
            if (!json_is_number(v))
                FAIL("llama.cpp helper: request %d step %d is not a number", r, i);
            b->decode_ms[(size_t)r * N + i] = json_number_value(v);
        }
    }
    b->n_params = jint(j, "n_params");
    b->model_bytes = jint(j, "model_bytes");
    b->buf_model = jint(buf, "model");
    b->buf_kv = jint(buf, "kv");
    b->buf_compute = jint(buf, "compute");
    b->buf_output = jint(buf, "output");
    b->rss_before_load = jint(j, "rss_before_load");
    b->rss_peak = jint(j, "rss_peak");
    b->threads = (int)jint(j, "threads");
    b->n_ctx = (int)jint(j, "n_ctx");
    json_t *lm = json_object_get(j, "load_ms");
    b->load_ms = json_is_number(lm) ? json_number_value(lm) : 0;
    if (b->model_bytes <= 0 || b->buf_kv < 0 || b->buf_compute < 0 || b->rss_peak <= 0)
        FAIL("llama.cpp helper: bench output without model size, buffers or RSS");
    if (b->buf_output < 0)
        b->buf_output = 0;
    return 0;
}

double lc_bytes_per_weight(const char *precision)
{
    static const struct {
        const char *name;
        double bytes;
    } types[] = {{"f32", 4}, {"f16", 2}, {"bf16", 2}, {"q8_0", 34.0 / 32}, {"q4_0", 18.0 / 32},
                 {"q4_k_m", 4.89 / 8}, {"q5_k_m", 5.70 / 8}, {"q6_k", 210.0 / 256}};
    for (size_t i = 0; precision && i < sizeof types / sizeof *types; i++)
        if (!strcmp(types[i].name, precision))
            return types[i].bytes;
    return 4;
}

/* The bytes read before each step to leave the caches as a larger model's would: at most
 * four times the last-level cache (64 MiB at least, 256 MiB when its size is unknown),
 * since reading more evicts nothing more and only takes time. */
static int64_t flush_capped(int64_t flush)
{
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0)
        llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
    int64_t cap = llc > 0 ? 4 * (int64_t)llc : (int64_t)256 << 20;
    if (cap < ((int64_t)64 << 20))
        cap = (int64_t)64 << 20;
    return flush > cap ? cap : flush;
}

int lc_bench_gguf(const char *path, const cm_target *t, const ms_opts *o, int64_t flush, lc_bench *b, char *err,
                  size_t errlen)
{
    memset(b, 0, sizeof *b);
    lc_info in;
    if (lc_probe(&in, err, errlen))
        return -1;
    char th[16], fl[32];
    ms_args a;
    ms_args_of(t, o, &a);
    snprintf(th, sizeof th, "%d", t->threads > 0 ? t->threads : eng_cpu_cores());
    snprintf(fl, sizeof fl, "%lld", (long long)(flush > 0 ? flush_capped(flush) : 0));
    char *argv[] = {in.helper, "bench", (char *)path, "--threads", th, "--batch", a.batch, "--prompt", a.prompt,
                    "--output", a.output, "--warmup", a.warmup, "--reps", a.reps, "--kv-type",
                    *t->kv_cache_type ? (char *)t->kv_cache_type : "f16", "--seed", a.seed, "--flash-attn",
                    (char *)cm_target_flash(t), flush >= 0 ? "--flush" : NULL, fl, NULL};
    json_t *j;
    if (run_helper(argv, o, &j, err, errlen))
        return -1;
    int rc = parse_bench(j, t, b, err, errlen);
    json_decref(j);
    if (rc)
        lc_bench_free(b);
    return rc;
}

void lc_bench_result(const lc_bench *b, const cm_target *t, ms_result *r)
{
    memset(r, 0, sizeof *r);
    int R = b->reps, N = b->n_steps;
    double *lat = calloc((size_t)R, sizeof(double)), *pre = calloc((size_t)R, sizeof(double)),
           *dec = calloc((size_t)R, sizeof(double));
    if (lat && pre && dec) {
        for (int i = 0; i < R; i++) {
            double d = 0;
            for (int k = 0; k < N; k++)
                d += b->decode_ms[(size_t)i * N + k];
            pre[i] = b->prefill_ms[i];
            dec[i] = d;
            lat[i] = pre[i] + d;
        }
        r->reps = R;
        r->latency_ms = ms_median(lat, R);
        r->latency_mad_ms = ms_mad(lat, R, r->latency_ms);
        r->prefill_ms = ms_median(pre, R);
        r->decode_ms = ms_median(dec, R);
    }
    free(lat);
    free(pre);
    free(dec);
    r->throughput_tps = r->decode_ms > 0 ? 1000.0 * t->batch_size * t->output_tokens / r->decode_ms : 0;
    r->params = b->n_params;
    r->weights_bytes = b->model_bytes;
    r->request_cache_bytes = b->buf_kv;
    r->backend_peak_bytes = b->buf_model + b->buf_kv + b->buf_compute + b->buf_output;
    r->rss_delta_bytes = b->rss_before_load > 0 ? b->rss_peak - b->rss_before_load : -1;
    r->peak_bytes = b->rss_peak;
    r->process_peak_bytes = b->rss_peak;   /* a fresh process too: its whole RSS high-water mark */
}

int lc_bench_alternating(const char *a, const char *b, const cm_target *t, const ms_opts *o, int rounds,
                         lc_bench *ab, lc_bench *bb, int (*tick)(void *ud, int done), void *ud, char *err,
                         size_t errlen)
{
    memset(ab, 0, sizeof *ab * (size_t)rounds);
    if (bb)
        memset(bb, 0, sizeof *bb * (size_t)rounds);
    for (int k = 0; k < rounds; k++) {
        if (lc_bench_gguf(a, t, o, -1, &ab[k], err, errlen) || (b && lc_bench_gguf(b, t, o, -1, &bb[k], err, errlen)))
            return ms_cancelled(o) ? 1 : -1;   /* o's hook stopped a serving (err "cancelled") */
        int stop = tick ? tick(ud, k + 1) : 0;
        if (stop)
            return stop;
    }
    return 0;
}

json_t *lc_bench_latencies_json(const lc_bench *b, int n, const cm_target *t)
{
    ms_result rr[64];
    n = n < 64 ? n : 64;
    for (int k = 0; k < n; k++)
        lc_bench_result(&b[k], t, &rr[k]);
    return ms_results_latencies_json(rr, n);
}

int lc_bench_median(const lc_bench *b, int n, const cm_target *t, ms_result *r)
{
    ms_result rr[64];
    n = n < 64 ? n : 64;
    for (int k = 0; k < n; k++)
        lc_bench_result(&b[k], t, &rr[k]);
    return ms_results_median(rr, n, r);
}

/* ---------- random models ---------- */

/* This process's owner line for a scratch folder: its pid and pid namespace, so that a
 * sweep judges only folders of processes it can see. */
static void owner_line(char *out, size_t n)
{
    char ns[64] = "";
    ssize_t k = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    ns[k > 0 ? k : 0] = 0;
    snprintf(out, n, "%ld %s\n", (long)getpid(), ns);
}

/* Remove the scratch folders under base whose owner (the marker file "owner") died
 * without removing them: a worker killed mid-measurement (a cancel's SIGKILL, a lost
 * lease) leaves its model files behind, in memory under /dev/shm. Best effort. */
static void sweep_scratch(const char *base)
{
    char **names;
    size_t n;
    if (fio_list_dir(base, &names, &n) < 0)
        return;
    char mine[128];
    owner_line(mine, sizeof mine);
    const char *my_ns = strchr(mine, ' ');
    for (size_t i = 0; i < n; i++) {
        char dir[4096], marker[4200], line[128] = "";
        if (strncmp(names[i], "ac-llama-", 9) || snprintf(dir, sizeof dir, "%s/%s", base, names[i]) >= (int)sizeof dir)
            continue;
        snprintf(marker, sizeof marker, "%s/owner", dir);
        int fd = open(marker, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        ssize_t k = fd >= 0 ? read(fd, line, sizeof line - 1) : -1;
        if (fd >= 0)
            close(fd);
        line[k > 0 ? k : 0] = 0;
        long pid = strtol(line, NULL, 10);
        const char *ns = strchr(line, ' ');
        if (pid <= 0 || !ns || !my_ns || strcmp(ns, my_ns))
            continue;   /* no marker, or another pid namespace's: not ours to judge */
        if (kill((pid_t)pid, 0) < 0 && errno == ESRCH)
            (void)fio_remove_tree(dir);
    }
    fio_names_free(names, n);
}

int lc_scratch_dir(const arch *largest, char *out, size_t cap, char *err, size_t errlen)
{
    /* Memory-backed when the machine has it: the kernel writing back hundreds of MB of
     * just-written model files would run on the cores the next measurement times. But
     * only with room for the files (an f32 model, its quantized copy and the quantizer's
     * temporary): a container's /dev/shm is often 64 MiB. */
    int64_t need = 3 * arch_params(largest) * 4 + (256LL << 20);
    if (fio_is_dir("/dev/shm"))
        sweep_scratch("/dev/shm");   /* first: dead workers' folders must not make it look full */
    const char *tmp = getenv("AC_SCRATCH");
    if (!tmp || !*tmp)
        tmp = fio_is_dir("/dev/shm") && access("/dev/shm", W_OK) == 0 && fio_free_bytes("/dev/shm") >= need
                  ? "/dev/shm" : getenv("TMPDIR");
    const char *base = tmp && *tmp ? tmp : "/tmp";
    if (strcmp(base, "/dev/shm"))
        sweep_scratch(base);
    int n = snprintf(out, cap, "%s/ac-llama-XXXXXX", base);
    if (n < 0 || (size_t)n >= cap)
        FAIL("scratch folder path too long");
    if (!mkdtemp(out))
        FAIL("%s: %s", out, strerror(errno));
    char marker[4200], line[128];
    snprintf(marker, sizeof marker, "%s/owner", out);
    owner_line(line, sizeof line);
    if (fio_write_atomic(marker, line, strlen(line), err, errlen) < 0) {
        (void)fio_remove_tree(out);
        return -1;
    }
    return 0;
}

int lc_write_random(const arch *a, const cm_target *t, uint64_t seed, const char *dir, const char *name,
                    char *path, size_t cap, int *fallbacks, const ms_opts *stop, char *err, size_t errlen)
{
    char an[16], f32[4096], file[256];
    if (fallbacks)
        *fallbacks = 0;
    if (exp_gguf_arch(a, an, sizeof an, err, errlen))
        return -1;
    snprintf(file, sizeof file, "%s.f32.gguf", name);
    if (fio_path_join(f32, sizeof f32, dir, file))
        FAIL("scratch path too long");
    snprintf(file, sizeof file, "%s.gguf", name);
    if (fio_path_join(path, cap, dir, file))
        FAIL("scratch path too long");
    eng_backend *be = eng_backend_cpu_new(t->threads > 0 ? t->threads : 0);
    if (!be)
        FAIL("out of memory (CPU backend)");
    eng_model m;
    int rc = -1;
    if (eng_model_init(&m, a, be, err, errlen) == 0) {
        int drawn = eng_model_randomize_until(&m, seed ? seed : 1, 0.02f, stop ? stop->cancelled : NULL,
                                              stop ? stop->cancel_ud : NULL);
        if (drawn == 0) {
            exp_opts eo = {.dtype = EXP_FP32, .name = "autocompress-timing"};
            exp_result res;
            memset(&res, 0, sizeof res);
            rc = exp_gguf_write(&m, f32, &eo, &res, err, errlen);
        } else {
            snprintf(err, errlen, drawn > 0 ? "cancelled" : "out of memory drawing random weights");
        }
        eng_model_free(&m);
    }
    eng_backend_free(be);
    if (rc == 0)
        rc = lc_quantize(f32, path, t->precision, t->threads, fallbacks, stop, err, errlen);
    if (strcmp(f32, path))
        (void)unlink(f32);
    return rc;
}

int lc_measure_arch(const arch *a, const cm_target *t, const ms_opts *o, int64_t flush, const char *dir, lc_bench *b,
                    char *err, size_t errlen)
{
    char path[4096];
    memset(b, 0, sizeof *b);
    if (lc_write_random(a, t, o && o->seed ? o->seed : 1, dir, "timing", path, sizeof path, NULL, o, err, errlen))
        return -1;
    int rc = lc_bench_gguf(path, t, o, flush, b, err, errlen);
    (void)unlink(path);
    return rc;
}
