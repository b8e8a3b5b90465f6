/* tests/unit/test_formats_shrink_open.c — a model file cut short while it opens, between
 * its mapping and the parse of its header (a copy over it, another process rewriting it):
 * the open fails naming the file, it does not die of SIGBUS. This file defines mmap: the
 * store's calls (linked from the static library) come here, map as asked and, for the
 * file named g_shrink, then cut that file to g_shrink_to bytes, under a header that runs
 * past it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "storage/fileio.h"
#include "storage/gguf.h"
#include "storage/llama2c.h"
#include "storage/safetensors.h"

static char g_shrink[512];
static off_t g_shrink_to = 4096;

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    void *p = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    if (g_shrink[0] && fd >= 0 && p != MAP_FAILED) {
        char link[64], path[512];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t k = readlink(link, path, sizeof path - 1);
        if (k > 0) {
            path[k] = 0;
            if (!strcmp(path, g_shrink) && truncate(path, g_shrink_to) != 0)
                abort();
        }
    }
    return p;
}

static char tmpdir[] = "/tmp/ac_shrinkopen_XXXXXX";

static int setup(void **state)
{
    (void)state;
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return fio_remove_tree(tmpdir);
}

static void test_safetensors_cut_under_its_header(void **state)
{
    (void)state;
    enum { N = 300 };
    static float w[4];
    static char names[N][64];
    st_write_tensor t[N];
    for (int i = 0; i < N; i++) {   /* a header of about 30 KB: past the first page */
        snprintf(names[i], sizeof names[i], "model.layers.%d.a_rather_long_tensor_name.weight", i);
        t[i] = (st_write_tensor){names[i], w, {4}, 1};
    }
    char p[128], err[512] = "";
    snprintf(p, sizeof p, "%s/cut.safetensors", tmpdir);
    assert_int_equal(st_write(p, t, N, ST_F32, NULL, err, sizeof err), 0);
    char real[512];
    assert_non_null(realpath(p, real));
    snprintf(g_shrink, sizeof g_shrink, "%s", real);
    st_file f;
    int rc = st_open(&f, p, err, sizeof err);
    g_shrink[0] = 0;
    assert_int_equal(rc, -1);
    if (!strstr(err, "cut.safetensors") || !strstr(err, "ended"))
        fail_msg("the error does not say the file ended: \"%s\"", err);
}

/* a llama2.c checkpoint's header is its first 28 bytes: cut to nothing, its read faults */
static void test_llama2c_cut_under_its_header(void **state)
{
    (void)state;
    int32_t h[7] = {8, 16, 1, 2, 2, 32, 4};   /* dim, hidden, layers, heads, kv heads, vocab, seq */
    int64_t C = 8, F = 16, V = 32, D = 4, S = 4;
    int64_t floats = V * C + C + 4 * C * C + C + 3 * F * C + C + S * D;
    char p[128], err[512] = "";
    snprintf(p, sizeof p, "%s/cut.bin", tmpdir);
    FILE *fp = fopen(p, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(h, sizeof h, 1, fp), 1);
    float z = 0.5f;
    for (int64_t i = 0; i < floats; i++)
        assert_int_equal(fwrite(&z, 4, 1, fp), 1);
    assert_int_equal(fclose(fp), 0);
    l2c_file f;
    assert_int_equal(l2c_open(&f, p, err, sizeof err), 0);   /* the file as written opens */
    l2c_close(&f);
    char real[512];
    assert_non_null(realpath(p, real));
    snprintf(g_shrink, sizeof g_shrink, "%s", real);
    g_shrink_to = 0;
    int rc = l2c_open(&f, p, err, sizeof err);
    g_shrink[0] = 0;
    g_shrink_to = 4096;
    assert_int_equal(rc, -1);
    if (!strstr(err, "cut.bin") || !strstr(err, "ended"))
        fail_msg("the error does not say the file ended: \"%s\"", err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_cut_under_its_header),
        cmocka_unit_test(test_llama2c_cut_under_its_header),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
