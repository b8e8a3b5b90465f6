/* tests/unit/test_fileio.c — storage/fileio.c's temporary names: fio_temp_name gives each
 * writer a name of its own, and fio_temp_stale tells the ones whose writer is gone (a
 * process that has exited) from this process's own, a live writer's and other names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "storage/fileio.h"

static void test_temp_stale(void **state)
{
    (void)state;
    char mine[256], name[256];
    assert_int_equal(fio_temp_name(mine, sizeof mine, "/data/jobs/j/export/model.gguf"), 0);
    const char *base = strrchr(mine, '/') + 1;
    assert_int_equal(fio_temp_stale(base), 0);   /* this process's own */
    pid_t gone = fork();
    assert_true(gone >= 0);
    if (gone == 0)
        _exit(0);
    assert_int_equal(waitpid(gone, NULL, 0), gone);
    snprintf(name, sizeof name, "model.gguf.tmp.%ld.0.0badf00d", (long)gone);
    assert_int_equal(fio_temp_stale(name), 1);   /* its writer has exited */
    snprintf(name, sizeof name, "model-hf.tmp.%ld.3.12345678", (long)gone);
    assert_int_equal(fio_temp_stale(name), 1);   /* a folder's name alike */
    snprintf(name, sizeof name, "x.tmp.1.tmp.%ld.0.1", (long)gone);
    assert_int_equal(fio_temp_stale(name), 1);   /* the last ".tmp." is the writer's */
    snprintf(name, sizeof name, "model.gguf.tmp.%ld.0.0badf00d", (long)getppid());
    assert_int_equal(fio_temp_stale(name), 0);   /* a live writer's */
    static const char *const others[] = {"model.gguf", "model.gguf.tmp", "a.tmp.x.1", "a.tmp.12", "a.tmp.-5.1.2",
                                         "a.tmp.0.1.2", "manifest.json"};
    for (size_t i = 0; i < sizeof others / sizeof *others; i++)
        if (fio_temp_stale(others[i]))
            fail_msg("%s is not a stale temporary", others[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_temp_stale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
