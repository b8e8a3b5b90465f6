/* tests/unit/test_load_memory.c — loading a model holds one copy of its weights. A
 * process that loads a checkpoint (safetensors, the job's own format), an HF export (bf16
 * safetensors) or a GGUF into the CPU backend must not peak at the file's pages plus a
 * staging copy of the largest tensor plus the weights: the served process would need twice
 * the memory a limit was checked against. Each load runs in a child of its own, its RSS
 * high-water mark reset before it, and its growth must stay within the model's weights and
 * a few MiB.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "engine/procstat.h"
#include "storage/ckpt.h"
#include "storage/export.h"
#include "storage/modelio.h"

#define SLACK_BYTES (12 << 20)   /* the readers' chunk of file pages, the loader's tables */

static char tmpdir[256];
static int64_t weight_bytes;

/* vocab 16384 x hidden 512 (a 32 MiB embedding, the largest tensor), one layer: 44 MB */
static void make_arch(arch *a)
{
    assert_int_equal(arch_init(a, 1), 0);
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = 16384;
    a->hidden_size = 512;
    a->head_dim = 64;
    a->max_position_embeddings = 256;
    a->rope_theta = 10000.0;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = 1;
    a->layers[0].n_heads = 8;
    a->layers[0].n_kv_heads = 8;
    a->layers[0].ffn_dim = 1024;
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_load_memory_XXXXXX");
    if (!mkdtemp(tmpdir))
        return -1;
    eng_backend *be = eng_backend_cpu_new(1);
    arch a;
    make_arch(&a);
    eng_model m;
    char err[512], p[512];
    if (!be || eng_model_init(&m, &a, be, err, sizeof err))
        return -1;
    arch_free(&a);
    eng_model_randomize(&m, 7, 0.02f);
    weight_bytes = (int64_t)m.n_params * 4;
    exp_opts hf = {.dtype = EXP_BF16}, gg = {.dtype = EXP_FP32};
    exp_result r;
    snprintf(p, sizeof p, "%s/ckpt", tmpdir);
    int rc = ckpt_save(&m, p, err, sizeof err);
    snprintf(p, sizeof p, "%s/hf", tmpdir);
    rc = rc ? rc : exp_hf_write(&m, p, &hf, &r, err, sizeof err);
    snprintf(p, sizeof p, "%s/model.gguf", tmpdir);
    rc = rc ? rc : exp_gguf_write(&m, p, &gg, &r, err, sizeof err);
    if (rc)
        fprintf(stderr, "setup: %s\n", err);
    eng_model_free(&m);
    eng_backend_free(be);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

enum { LOAD_CKPT, LOAD_MODEL };

/* The RSS high-water growth of a child that loads `name` (under tmpdir) the given way:
 * the bytes, or -1 where the kernel cannot reset the mark (the test then skips). */
static int64_t load_growth(int how, const char *name)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        char p[512], err[512];
        snprintf(p, sizeof p, "%s/%s", tmpdir, name);
        eng_backend *be = eng_backend_cpu_new(1);
        int64_t rss0 = eng_proc_status_bytes("VmRSS"), growth = -1;
        int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
        int reset = fd >= 0 && write(fd, "5", 1) == 1;
        if (fd >= 0)
            close(fd);
        if (be && rss0 > 0 && reset) {
            eng_model m;
            int rc = how == LOAD_CKPT ? ckpt_load(p, be, &m, err, sizeof err)
                                      : mio_load_model(p, NULL, be, &m, NULL, err, sizeof err);
            if (rc) {
                fprintf(stderr, "load %s: %s\n", p, err);
                _exit(2);
            }
            growth = eng_proc_status_bytes("VmHWM") - rss0;
        }
        _exit(write(fds[1], &growth, sizeof growth) == (ssize_t)sizeof growth ? 0 : 3);
    }
    close(fds[1]);
    int64_t growth = -2;
    ssize_t k = read(fds[0], &growth, sizeof growth);
    close(fds[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(k, (ssize_t)sizeof growth);
    return growth;
}

static void check(int how, const char *name)
{
    int64_t g = load_growth(how, name);
    if (g == -1)
        skip();
    printf("# %s: high water grew %.1f MiB for %.1f MiB of weights\n", name, g / 1048576.0,
           weight_bytes / 1048576.0);
    assert_true(g >= weight_bytes - SLACK_BYTES);   /* the weights are there: the reading is live */
    assert_true(g <= weight_bytes + SLACK_BYTES);
}

static void test_checkpoint(void **state)
{
    (void)state;
    check(LOAD_CKPT, "ckpt");
}

static void test_hf_bf16(void **state)
{
    (void)state;
    check(LOAD_MODEL, "hf");
}

static void test_gguf(void **state)
{
    (void)state;
    check(LOAD_MODEL, "model.gguf");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint),
        cmocka_unit_test(test_hf_bf16),
        cmocka_unit_test(test_gguf),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
