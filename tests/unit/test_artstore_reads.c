/* tests/unit/test_artstore_reads.c — what the artifact store (storage/artstore.h) does when
 * a blob cannot be read (EIO from a failing disk, a read that fails for want of memory):
 * the content is not known to be bad, so the blob is not set aside as corrupt, neither when
 * it is opened for a download nor by the scrub; and art_put names a failed read of its own
 * copy as one, not as the source changing. This file defines pread, so the store's calls
 * (linked from the static library) come here: it fails them with EIO for files whose path
 * holds g_fail, and passes the rest to the kernel. Also: the temporary files of writers
 * killed mid-copy are swept (art_sweep_temp, and each scrub), and no one else's; a FIFO
 * where a blob belongs is never waited on.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "storage/artstore.h"
#include "storage/fileio.h"

static char g_fail[80];

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    if (g_fail[0]) {
        char link[64], path[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t k = readlink(link, path, sizeof path - 1);
        if (k > 0) {
            path[k] = 0;
            if (strstr(path, g_fail)) {
                errno = EIO;
                return -1;
            }
        }
    }
    return syscall(SYS_pread64, fd, buf, n, off);
}

static char g_dir[] = "/tmp/ac_artreads_XXXXXX";

static int setup(void **state)
{
    (void)state;
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return fio_remove_tree(g_dir);
}

/* A store under g_dir/name holding one blob of 3 MiB; its digest into hex. With
 * `unmarked`, the mark art_put left on the file (its content checked) is removed, as on a
 * blob stored before the mark existed. */
static artstore *store_with_blob(const char *name, int unmarked, char hex[65], int64_t *size)
{
    char dir[256], src[256], err[512] = "";
    snprintf(dir, sizeof dir, "%s/%s", g_dir, name);
    snprintf(src, sizeof src, "%s/%s.src", g_dir, name);
    FILE *f = fopen(src, "w");
    assert_non_null(f);
    for (int i = 0; i < 3 << 20; i++)
        fputc(i * 7 + (int)strlen(name), f);
    assert_int_equal(fclose(f), 0);
    artstore *as = art_open(dir, err, sizeof err);
    assert_non_null(as);
    assert_int_equal(art_put(as, src, hex, size, err, sizeof err), 0);
    assert_int_equal(*size, 3 << 20);
    char blob[4096];
    assert_int_equal(art_path(as, hex, blob, sizeof blob), 0);
    if (unmarked && removexattr(blob, "user.autocompress.verified") < 0)
        assert_true(errno == ENODATA || errno == ENOTSUP);
    art_close(as);
    /* a new handle: nothing is remembered as verified */
    as = art_open(dir, err, sizeof err);
    assert_non_null(as);
    return as;
}

static void test_open_unreadable_keeps_blob(void **state)
{
    (void)state;
    char hex[65], err[512] = "";
    int64_t size = 0;
    artstore *as = store_with_blob("open", 1, hex, &size);
    snprintf(g_fail, sizeof g_fail, "%s", hex);
    int fd = art_open_blob(as, hex, size, 1, err, sizeof err);
    g_fail[0] = 0;
    assert_int_equal(fd, -1);
    assert_non_null(strstr(err, "could not be read"));
    assert_null(strstr(err, "set aside"));
    /* still there, and whole */
    assert_true(art_has(as, hex, size));
    fd = art_open_blob(as, hex, size, 1, err, sizeof err);
    assert_true(fd >= 0);
    close(fd);
    art_close(as);
}

/* What art_put published was checked as it was stored, and the file says so: another
 * process (a fresh handle here) opening it for a ranged download does not read it whole
 * again (here every read of it would fail). Where the file system keeps no user
 * attributes there is nothing to check. */
static void test_put_mark_spares_rehash(void **state)
{
    (void)state;
    char hex[65], err[512] = "", blob[4096];
    int64_t size = 0;
    artstore *as = store_with_blob("marked", 0, hex, &size);
    assert_int_equal(art_path(as, hex, blob, sizeof blob), 0);
    char v[128];
    if (getxattr(blob, "user.autocompress.verified", v, sizeof v) < 0 && errno == ENOTSUP) {
        art_close(as);
        skip();
    }
    snprintf(g_fail, sizeof g_fail, "%s", hex);
    int fd = art_open_blob(as, hex, size, 1, err, sizeof err);
    g_fail[0] = 0;
    if (fd < 0)
        fail_msg("%s", err);
    close(fd);
    /* a change of the content (its mtime) is not covered by the mark: hashed again */
    struct timespec ts[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
    assert_int_equal(utimensat(AT_FDCWD, blob, ts, 0), 0);
    art_close(as);
    char dir[256];
    snprintf(dir, sizeof dir, "%s/marked", g_dir);
    as = art_open(dir, err, sizeof err);
    assert_non_null(as);
    snprintf(g_fail, sizeof g_fail, "%s", hex);
    fd = art_open_blob(as, hex, size, 1, err, sizeof err);
    g_fail[0] = 0;
    assert_int_equal(fd, -1);
    assert_non_null(strstr(err, "could not be read"));
    art_close(as);
}

static void test_scrub_unreadable_keeps_blob(void **state)
{
    (void)state;
    char hex[65];
    int64_t size = 0;
    artstore *as = store_with_blob("scrub", 1, hex, &size);
    int checked = -1, bad = -1;
    snprintf(g_fail, sizeof g_fail, "%s", hex);
    assert_int_equal(art_scrub(as, &checked, &bad), 0);
    g_fail[0] = 0;
    assert_int_equal(bad, 0);
    assert_int_equal(checked, 0);
    assert_true(art_has(as, hex, size));
    /* readable again: checked, and sound */
    assert_int_equal(art_scrub(as, &checked, &bad), 0);
    assert_int_equal(checked, 1);
    assert_int_equal(bad, 0);
    art_close(as);
}

/* A FIFO where a blob belongs (the store's folder is shared, and someone put one there):
 * a download's open and the scrub pass over it at once, not waiting on it for a writer.
 * In a child with an alarm, so that a wait ends the test rather than hang it. */
static void test_fifo_blob_never_waits(void **state)
{
    (void)state;
    char hex[65], path[4096];
    int64_t size = 0;
    artstore *as = store_with_blob("fifo", 1, hex, &size);
    assert_int_equal(art_path(as, hex, path, sizeof path), 0);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0644), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(10);
        char err[512] = "";
        int checked = -1, bad = -1;
        int fd = art_open_blob(as, hex, size, 1, err, sizeof err);
        if (fd >= 0 || !strstr(err, "not a regular file"))
            _exit(1);
        if (art_scrub(as, &checked, &bad) || checked != 0)
            _exit(2);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    art_close(as);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_put_unreadable_copy_named(void **state)
{
    (void)state;
    char dir[256], src[256], hex[65], err[512] = "";
    snprintf(dir, sizeof dir, "%s/put", g_dir);
    snprintf(src, sizeof src, "%s/put.src", g_dir);
    FILE *f = fopen(src, "w");
    assert_non_null(f);
    assert_int_equal(fputs("a blob whose copy cannot be read back", f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    artstore *as = art_open(dir, err, sizeof err);
    assert_non_null(as);
    int64_t size = 0;
    snprintf(g_fail, sizeof g_fail, ".tmp.");   /* the store's own copy, before it is published */
    int rc = art_put(as, src, hex, &size, err, sizeof err);
    g_fail[0] = 0;
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, "read failed"));
    assert_null(strstr(err, "changed while"));
    assert_false(art_has(as, hex, size));
    art_close(as);
}

/* A file of n bytes at dir/name, last modified age_s ago. */
static void temp_file(const char *dir, const char *name, int n, int age_s)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++)
        fputc('t', f);
    assert_int_equal(fclose(f), 0);
    struct timespec t[2] = {{time(NULL) - age_s, 0}, {time(NULL) - age_s, 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
}

static int exists(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void test_sweep_dead_writers_temp(void **state)
{
    (void)state;
    char hex[65], sub[256], name[128];
    int64_t size = 0;
    artstore *as = store_with_blob("sweep", 1, hex, &size);
    snprintf(sub, sizeof sub, "%s/sweep/sha256/%.2s", g_dir, hex);
    pid_t dead = fork();
    assert_true(dead >= 0);
    if (dead == 0)
        _exit(0);
    assert_int_equal(waitpid(dead, NULL, 0), dead);
    /* a killed art_put's copy and a killed fetch's, an hour old: swept */
    snprintf(name, sizeof name, "%s.tmp.%d", hex, (int)dead);
    temp_file(sub, name, 100000, 3600);
    snprintf(name, sizeof name, "%s.fetch.%d.3", hex, (int)dead);
    temp_file(sub, name, 5000, 3600);
    /* kept: a dead writer's file touched a minute ago, a live writer's, an unknown name */
    temp_file(sub, "notes.txt", 10, 3600);
    char recent[128], live[128];
    snprintf(recent, sizeof recent, "%.64s.tmp.%d", hex, (int)dead);
    snprintf(live, sizeof live, "%s.tmp.%d", hex, (int)getpid());
    temp_file(sub, live, 10, 3600);
    int64_t files = -1, bytes = -1;
    assert_int_equal(art_sweep_temp(as, &files, &bytes), 0);
    assert_int_equal(files, 2);
    assert_true(bytes >= 100000 + 5000);
    snprintf(name, sizeof name, "%s.tmp.%d", hex, (int)dead);
    assert_false(exists(sub, name));
    assert_true(exists(sub, live));
    assert_true(exists(sub, "notes.txt"));
    temp_file(sub, recent, 10, 60);
    assert_int_equal(art_sweep_temp(as, &files, &bytes), 0);
    assert_int_equal(files, 0);
    assert_true(exists(sub, recent));
    /* the blob itself is untouched, and a scrub sweeps too */
    assert_true(art_has(as, hex, size));
    temp_file(sub, recent, 10, 3600);
    int checked = 0, bad = 0;
    assert_int_equal(art_scrub(as, &checked, &bad), 0);
    assert_int_equal(checked, 1);
    assert_false(exists(sub, recent));
    art_close(as);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_unreadable_keeps_blob),
        cmocka_unit_test(test_put_mark_spares_rehash),
        cmocka_unit_test(test_scrub_unreadable_keeps_blob),
        cmocka_unit_test(test_fifo_blob_never_waits),
        cmocka_unit_test(test_put_unreadable_copy_named),
        cmocka_unit_test(test_sweep_dead_writers_temp),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
