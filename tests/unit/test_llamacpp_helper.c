/* tests/unit/test_llamacpp_helper.c — how a llama.cpp measurement ends when its cancel
 * hook says stop (compress/llamacpp.h, ms_opts): the helper process serving the model is
 * killed within about the hook's polling period, the bench fails with "cancelled", and no
 * helper is left running. The helper here is a stand-in script (AC_LLAMA_HELPER) that
 * answers `info` and, for `bench`, writes its pid and sleeps a minute: the real helper
 * serves one model for seconds, or minutes on a loaded host, and a cancel or a shutdown
 * must not wait for it. Nor may the helper outlive the process that started it: a worker
 * killed mid-measurement (its server killed, or its container) must not leave llama.cpp
 * serving on the cores the job's next attempt measures on. A helper that cannot say
 * what it is (`info` fails) is asked once for every request that needs the answer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compress/llamacpp.h"
#include "engine/arch.h"
#include "compress/measure.h"
#include "engine/clock.h"
#include "storage/fileio.h"

static char g_dir[] = "/tmp/ac_lchelper_XXXXXX";
static char g_pidfile[256];

/* Write the stand-in helper; `note` (a comment line) makes another file of it. Its `info`
 * fails, noting its pid in info.calls, while info.fail exists. */
static int write_helper(const char *note)
{
    char helper[256];
    snprintf(helper, sizeof helper, "%s/ac-llama", g_dir);
    FILE *f = fopen(helper, "w");
    if (!f)
        return -1;
    fprintf(f,
            "#!/bin/sh\n"
            "# %s\n"
            "case \"$1\" in\n"
            "info) [ -e %s/info.fail ] && { echo $$ >> %s/info.calls; sleep 0.3; echo 'no backend' >&2; exit 3; };"
            " grep -E '^Sig(Blk|Ign)' /proc/self/status > %s.sig;"
            " echo '{\"ggml_version\":\"stand-in\",\"ggml_commit\":\"0\",\"package_version\":\"0\","
            "\"build_flags\":\"\",\"system_info\":\"\"}' ;;\n"
            "bench) [ \"$2\" = /lingers.gguf ] && { exec >&- 2>&-; exec sleep 60; };"
            " echo \"$@\" > %s.args; echo $$ > %s.tmp && mv %s.tmp %s; exec sleep 60 ;;\n"
            "quantize) echo partial > \"$3.tmp-$$\"; echo $$ > %s.tmp && mv %s.tmp %s; exec sleep 60 ;;\n"
            "*) echo \"unknown command $1\" >&2; exit 2 ;;\n"
            "esac\n",
            note, g_dir, g_dir, g_pidfile, g_pidfile, g_pidfile, g_pidfile, g_pidfile, g_pidfile, g_pidfile,
            g_pidfile);
    if (fclose(f) || chmod(helper, 0755))
        return -1;
    return setenv("AC_LLAMA_HELPER", helper, 1);
}

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(g_dir))
        return -1;
    snprintf(g_pidfile, sizeof g_pidfile, "%s/bench.pid", g_dir);
    return write_helper("first");
}

static int teardown(void **state)
{
    (void)state;
    return fio_remove_tree(g_dir);
}

/* Stop once the stand-in has started serving (its pid file is there) and `after` seconds
 * have passed since. */
typedef struct {
    double started, after;
    int calls;
} stop_later;

static int stop_when_serving(void *ud)
{
    stop_later *s = ud;
    s->calls++;
    if (s->started == 0 && access(g_pidfile, F_OK) == 0)
        s->started = eng_wall_s();
    return s->started > 0 && eng_wall_s() - s->started >= s->after;
}

/* An f32 target of a few tokens on one thread: what the stand-in is asked to serve. */
static cm_target small_target(void)
{
    cm_target t;
    memset(&t, 0, sizeof t);
    snprintf(t.device, sizeof t.device, "cpu");
    snprintf(t.precision, sizeof t.precision, "f32");
    t.batch_size = 1;
    t.prompt_tokens = 8;
    t.output_tokens = 4;
    t.threads = 1;
    return t;
}

static void test_cancel_kills_helper(void **state)
{
    (void)state;
    cm_target t = small_target();
    stop_later s = {0, 0.3, 0};
    ms_opts o = {.warmup = 1, .reps = 3, .seed = 1, .cancelled = stop_when_serving, .cancel_ud = &s};
    lc_bench b;
    char err[512] = "";
    double t0 = eng_wall_s();
    assert_int_equal(lc_bench_gguf("/nonexistent.gguf", &t, &o, -1, &b, err, sizeof err), -1);
    double took = eng_wall_s() - t0;
    assert_string_equal(err, "cancelled");
    assert_true(s.started > 0);
    assert_true(s.calls >= 2);
    /* the helper would sleep 60 s: it was killed, and reaped */
    assert_true(took < 10);
    FILE *f = fopen(g_pidfile, "r");
    assert_non_null(f);
    int pid = 0;
    assert_int_equal(fscanf(f, "%d", &pid), 1);
    fclose(f);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, 0), -1);
    assert_int_equal(errno, ESRCH);
    lc_bench_free(&b);
}

/* The cache flush before each step is capped at a few times the last-level cache: reading
 * more evicts nothing more, and a large parent's weight bytes (a 70B model's) would take
 * minutes per step, or pass the helper's 64 GiB limit and fail every serving. */
static void test_flush_capped(void **state)
{
    (void)state;
    cm_target t = small_target();
    unlink(g_pidfile);
    stop_later s = {0, 0.1, 0};
    ms_opts o = {.warmup = 1, .reps = 3, .seed = 1, .cancelled = stop_when_serving, .cancel_ud = &s};
    lc_bench b;
    char err[512] = "", args[600], line[1024] = "";
    assert_int_equal(lc_bench_gguf("/nonexistent.gguf", &t, &o, (int64_t)280 << 30, &b, err, sizeof err), -1);
    lc_bench_free(&b);
    snprintf(args, sizeof args, "%s.args", g_pidfile);
    FILE *f = fopen(args, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    const char *fl = strstr(line, "--flush ");
    assert_non_null(fl);
    long long n = atoll(fl + 8);
    assert_true(n >= (64LL << 20) && n <= (16LL << 30));
}

/* A quantization cancelled mid-way leaves no partial output beside its destination (the
 * helper writes DST.tmp-PID and renames it when done), nor does one an earlier, killed
 * attempt left there. */
static void test_cancelled_quantize_leaves_nothing(void **state)
{
    (void)state;
    char dst[300], stale[320], err[512];
    snprintf(dst, sizeof dst, "%s/model.gguf", g_dir);
    snprintf(stale, sizeof stale, "%s.tmp-99999999", dst);
    FILE *f = fopen(stale, "w");
    assert_non_null(f);
    assert_int_equal(fclose(f), 0);
    (void)unlink(g_pidfile);
    stop_later sl = {0, 0.2, 0};
    ms_opts stop = {.cancelled = stop_when_serving, .cancel_ud = &sl};
    assert_int_equal(lc_quantize("/in.gguf", dst, "q8_0", 1, NULL, &stop, err, sizeof err), -1);
    assert_string_equal(err, "cancelled");
    assert_true(sl.started > 0);   /* it was quantizing, its partial file written */
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, "model.gguf"))
            fail_msg("left beside the destination: %s", e->d_name);
    closedir(d);
    (void)unlink(g_pidfile);
}

/* A helper that closes its output and lingers is killed once its grace is over, not
 * waited for without a deadline (the job would hang with it). */
static void test_lingering_helper_killed(void **state)
{
    (void)state;
    cm_target t = small_target();
    lc_bench b;
    char err[512] = "";
    double t0 = eng_wall_s();
    assert_int_equal(lc_bench_gguf("/lingers.gguf", &t, NULL, -1, &b, err, sizeof err), -1);
    lc_bench_free(&b);
    double took = eng_wall_s() - t0;
    if (!strstr(err, "did not exit"))
        fail_msg("err: %s", err);
    assert_true(took < 15);
}

static int read_pidfile(void)
{
    FILE *f = fopen(g_pidfile, "r");
    int pid = 0;
    if (f && fscanf(f, "%d", &pid) != 1)
        pid = 0;
    if (f)
        fclose(f);
    return pid;
}

static void test_helper_dies_with_its_process(void **state)
{
    (void)state;
    /* orphans are reparented to this process, so the test sees how the helper ends */
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    unlink(g_pidfile);
    pid_t w = fork();
    assert_true(w >= 0);
    if (w == 0) {
        /* the worker: a bench with no cancel hook, which waits for the helper */
        cm_target t;
        memset(&t, 0, sizeof t);
        snprintf(t.device, sizeof t.device, "cpu");
        snprintf(t.precision, sizeof t.precision, "f32");
        t.batch_size = t.prompt_tokens = t.output_tokens = t.threads = 1;
        ms_opts o = {.warmup = 1, .reps = 3, .seed = 1};
        lc_bench b;
        char err[512];
        lc_bench_gguf("/nonexistent.gguf", &t, &o, -1, &b, err, sizeof err);
        _exit(0);
    }
    double t0 = eng_wall_s();
    int hp = 0;
    while ((hp = read_pidfile()) == 0 && eng_wall_s() - t0 < 20)
        usleep(10000);
    assert_int_equal(kill(w, SIGKILL), 0);
    int st = 0;
    assert_int_equal(waitpid(w, &st, 0), w);
    assert_true(hp > 0);
    /* the helper, now this process's child, must be gone at once, not sleep its minute */
    pid_t r = 0;
    t0 = eng_wall_s();
    while ((r = waitpid(hp, &st, WNOHANG)) == 0 && eng_wall_s() - t0 < 3)
        usleep(10000);
    if (r == 0) {
        kill(hp, SIGKILL);
        waitpid(hp, NULL, 0);
    }
    assert_int_equal(r, hp);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
}

static void *probe_thread(void *arg)
{
    char err[512];
    lc_info info;
    *(int *)arg = lc_probe(&info, err, sizeof err);
    return NULL;
}

/* A helper that fails to answer `info` is asked once, not once per question: the API's
 * request threads ask about llama.cpp on every request that names it. Threads asking
 * together wait for the one question out, and later ones get its answer (for 10 s). A
 * helper file replaced since is asked at once: the next test, test_helper_signals_default,
 * needs the rewritten one's answer. */
static void test_probe_failure_asked_once(void **state)
{
    (void)state;
    char fail[300], calls[300], err[512] = "";
    snprintf(fail, sizeof fail, "%s/info.fail", g_dir);
    snprintf(calls, sizeof calls, "%s/info.calls", g_dir);
    FILE *f = fopen(fail, "w");
    assert_non_null(f);
    assert_int_equal(fclose(f), 0);
    pthread_t t[3];
    int rc[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&t[i], NULL, probe_thread, &rc[i]), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pthread_join(t[i], NULL), 0);
        assert_int_equal(rc[i], -1);
    }
    lc_info info;
    assert_int_equal(lc_probe(&info, err, sizeof err), -1);
    assert_non_null(strstr(err, "no backend"));
    f = fopen(calls, "r");
    assert_non_null(f);
    char line[64];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n++;
    assert_int_equal(fclose(f), 0);
    assert_int_equal(n, 1);
    assert_int_equal(unlink(fail), 0);
    assert_int_equal(write_helper("rebuilt"), 0);
}

/* The server and the worker agent block SIGTERM and SIGINT in every thread (they take them
 * with sigwait) and ignore SIGPIPE; a helper that inherited that could not be stopped by
 * either signal, and would not die writing to a closed pipe. The stand-in is a dash script
 * and dash clears its blocked set when it starts, so what this sees fail is the ignored
 * SIGPIPE; the real helper is a C program and would keep both. */
static void test_helper_signals_default(void **state)
{
    (void)state;
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    assert_int_equal(pthread_sigmask(SIG_BLOCK, &block, &old), 0);
    void (*pipe_was)(int) = signal(SIGPIPE, SIG_IGN);
    lc_info info;
    char err[512] = "", path[300];
    int rc = lc_probe(&info, err, sizeof err);
    signal(SIGPIPE, pipe_was);
    assert_int_equal(pthread_sigmask(SIG_SETMASK, &old, NULL), 0);
    assert_int_equal(rc, 0);
    snprintf(path, sizeof path, "%s.sig", g_pidfile);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[128];
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        /* SigBlk and SigIgn are hex masks (bit n-1 for signal n): neither SIGINT, SIGPIPE
         * nor SIGTERM in them. (What the environment ignored besides, glibc's reserved
         * real-time signals among them, may stay.) */
        const char *hex = strchr(line, ':');
        unsigned long long mask = hex ? strtoull(hex + 1, NULL, 16) : ~0ull;
        unsigned long long ours = (1ull << (SIGINT - 1)) | (1ull << (SIGPIPE - 1)) | (1ull << (SIGTERM - 1));
        if (mask & ours)
            fail_msg("the helper started with %s", line);
        seen++;
    }
    fclose(f);
    assert_int_equal(seen, 2);
}

/* A job's measurement serves the model in three fresh processes and reports the one of
 * median latency, but memory is a ceiling: the highest peak any of them reached. */
static void test_median_keeps_highest_peak(void **state)
{
    (void)state;
    static const double pre[3][1] = {{10}, {20}, {30}}, dec[3][1] = {{1}, {1}, {1}};
    static const int64_t peak[3] = {100 << 20, 200 << 20, 300 << 20};
    lc_bench b[3];
    memset(b, 0, sizeof b);
    for (int k = 0; k < 3; k++) {
        b[k].reps = 1;
        b[k].n_steps = 1;
        b[k].prefill_ms = (double *)pre[k];
        b[k].decode_ms = (double *)dec[k];
        b[k].rss_peak = peak[k];
    }
    cm_target t;
    cm_target_default(&t);
    ms_result r;
    assert_int_equal(lc_bench_median(b, 3, &t, &r), 1);
    assert_true(r.latency_ms == 21.0);
    assert_int_equal(r.peak_bytes, 300 << 20);
}

/* Scratch folders: each names its owner; one left by a process that died (a worker killed
 * mid-measurement) is removed by the next one made there, while a live owner's, and a
 * folder without a marker, stay. */
static void test_scratch_folders_of_dead_owners(void **state)
{
    (void)state;
    char base[] = "/tmp/ac-scratch-XXXXXX", dead[4200], live[4200], bare[4200], mine[4096], err[256];
    assert_non_null(mkdtemp(base));
    setenv("AC_SCRATCH", base, 1);
    pid_t gone = fork();
    assert_true(gone >= 0);
    if (gone == 0)
        _exit(0);
    assert_int_equal(waitpid(gone, NULL, 0), gone);
    char ns[64] = "", line[128];
    ssize_t k = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    ns[k > 0 ? k : 0] = 0;
    const struct { char *dir; const char *name; long pid; } f[] = {
        {dead, "ac-llama-dead00", (long)gone}, {live, "ac-llama-live00", (long)getpid()}, {bare, "ac-llama-bare00", 0}};
    for (int i = 0; i < 3; i++) {
        snprintf(f[i].dir, 4200, "%s/%s", base, f[i].name);
        assert_int_equal(mkdir(f[i].dir, 0755), 0);
        if (f[i].pid) {
            char marker[4300];
            snprintf(marker, sizeof marker, "%s/owner", f[i].dir);
            snprintf(line, sizeof line, "%ld %s\n", f[i].pid, ns);
            assert_int_equal(fio_write_atomic(marker, line, strlen(line), err, sizeof err), 0);
        }
    }
    arch a;
    assert_int_equal(arch_init(&a, 1), 0);
    a.hidden_size = 8;
    a.vocab_size = 16;
    assert_int_equal(lc_scratch_dir(&a, mine, sizeof mine, err, sizeof err), 0);
    arch_free(&a);
    assert_false(fio_is_dir(dead));
    assert_true(fio_is_dir(live));
    assert_true(fio_is_dir(bare));
    assert_int_equal(strncmp(mine, base, strlen(base)), 0);
    char marker[4200];
    snprintf(marker, sizeof marker, "%s/owner", mine);
    assert_true(fio_is_file(marker));
    unsetenv("AC_SCRATCH");
    assert_int_equal(fio_remove_tree(base), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_failure_asked_once),  /* first: lc_probe keeps an answer */
        cmocka_unit_test(test_helper_signals_default),    /* second: the first answer that succeeds */
        cmocka_unit_test(test_cancel_kills_helper),
        cmocka_unit_test(test_helper_dies_with_its_process),
        cmocka_unit_test(test_median_keeps_highest_peak),
        cmocka_unit_test(test_flush_capped),
        cmocka_unit_test(test_lingering_helper_killed),
        cmocka_unit_test(test_cancelled_quantize_leaves_nothing),
        cmocka_unit_test(test_scratch_folders_of_dead_owners),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
