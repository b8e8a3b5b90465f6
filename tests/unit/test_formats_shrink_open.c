/* tests/unit/test_formats_shrink_open.c — a model file cut short while it opens, between
 * its mapping and the parse of its header (a copy over it, another process rewriting it):
 * the open fails naming the file, it does not die of SIGBUS. This file defines mmap: the
 * store's calls (linked from the static library) come here, map as asked and, for the
 * file named g_shrink, then cut that file to 4096 bytes, under a header that runs past it.
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
#include "storage/safetensors.h"

static char g_shrink[512];

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    void *p = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    if (g_shrink[0] && fd >= 0 && p != MAP_FAILED) {
        char link[64], path[512];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t k = readlink(link, path, sizeof path - 1);
        if (k > 0) {
            path[k] = 0;
            if (!strcmp(path, g_shrink) && truncate(path, 4096) != 0)
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_cut_under_its_header),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
