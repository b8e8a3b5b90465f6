/* tests/unit/test_fileio.c — storage/fileio.c's temporary names: fio_temp_name gives each
 * writer a name of its own, and fio_temp_stale tells the ones whose writer is gone (a
 * process that has exited) from this process's own, a live writer's and other names;
 * fio_unprefix makes a message's paths under a folder relative to it.
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

/* Every "dir/" of the text goes, wherever it is; a longer path that merely contains or
 * starts like dir stays whole. */
static void test_unprefix(void **state)
{
    (void)state;
    static const struct {
        const char *dir, *in, *out;
    } cases[] = {
        {"/srv/ac/jobs/j1", "/srv/ac/jobs/j1/prune/x.json: bad", "prune/x.json: bad"},
        {"/srv/ac/", "a /srv/ac/m/1 and '/srv/ac/m/2'", "a m/1 and 'm/2'"},
        {"/srv/ac", "/srv/ac2/x /x/srv/ac/y /srv/ac", "/srv/ac2/x /x/srv/ac/y /srv/ac"},
        {"/srv/ac", "(/srv/ac/a):/srv/ac/b", "(a):b"},
        {"/", "/etc/passwd", "/etc/passwd"},
        {"", "/etc/passwd", "/etc/passwd"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char s[128];
        snprintf(s, sizeof s, "%s", cases[i].in);
        fio_unprefix(s, cases[i].dir);
        if (strcmp(s, cases[i].out))
            fail_msg("\"%s\" under \"%s\": \"%s\", not \"%s\"", cases[i].in, cases[i].dir, s, cases[i].out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_temp_stale),
        cmocka_unit_test(test_unprefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
