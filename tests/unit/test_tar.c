/* tests/unit/test_tar.c — the ustar reader against the writer (storage/tar.c): a folder
 * tree packed with tar_add_all unpacks to the same files byte for byte (nested folders,
 * an empty file, a file longer than the copy chunk, a hidden file); Python's tarfile reads
 * the same archive; and hostile or broken archives are refused naming the fault: a member
 * climbing out with "..", an absolute name, a symbolic link, a damaged checksum, an
 * archive cut short, a base-256 size near 2^64 or negative. What it unpacks is durable
 * before it returns: every file and every folder it wrote into is fsynced
 * (tests/unit/fsync_log.h records which), for a job that fetched a stage's outputs trusts
 * them after a power loss; so is the folder an archive is renamed into.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/fileio.h"
#include "storage/tar.h"
#include "fsync_log.h"

static char dir[64];

static int synced(const char *path)
{
    char real[512];
    if (!realpath(path, real))
        return 0;
    for (int i = 0; i < g_nsynced; i++)
        if (!strcmp(g_synced[i], real))
            return 1;
    return 0;
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ac-tar-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return fio_remove_tree(dir);
}

static void put(const char *rel, size_t n, unsigned seed)
{
    char path[512], parent[512], err[256];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    fio_dir_of(path, parent, sizeof parent);
    assert_int_equal(fio_mkdirs(parent), 0);
    unsigned char *b = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)((i * 2654435761u + seed) >> 13);
    assert_int_equal(fio_write_atomic(path, b, n, err, sizeof err), 0);
    free(b);
}

static void same_file(const char *a, const char *b)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    if (system(cmd) != 0)
        fail_msg("%s and %s differ", a, b);
}

static void test_roundtrip(void **state)
{
    (void)state;
    put("src/calibration.json", 1234, 1);
    put("src/.done", 0, 2);
    put("src/student/model.safetensors", (3u << 20) + 77, 3);   /* past the 1 MiB copy chunk */
    put("src/student/deep/config.json", 511, 4);
    put("src/reconstruct/layer-0000.safetensors", 100, 5);   /* skipped: named at the top */
    put("src/student/reconstruct/kept.bin", 10, 6);          /* kept: the name deeper down */
    char src[128], archive[128], out[128], err[512] = "";
    snprintf(src, sizeof src, "%s/src", dir);
    snprintf(archive, sizeof archive, "%s/a.tar", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    tar_writer *t = tar_open(archive, 0, err, sizeof err);
    assert_non_null(t);
    static const char *const skip[] = {"reconstruct", NULL};
    assert_int_equal(tar_add_all(t, "prune", src, skip, err, sizeof err), 0);
    g_nsynced = 0;
    assert_int_equal(tar_close(t, err, sizeof err), 0);
    assert_true(synced(dir));   /* the archive's rename into place is durable too */
    char cmd[900];
    snprintf(cmd, sizeof cmd, "python3 -c 'import tarfile,sys; n=sorted(tarfile.open(sys.argv[1]).getnames()); "
             "sys.exit(n != [\"prune\", \"prune/.done\", \"prune/calibration.json\", \"prune/student\", "
             "\"prune/student/deep\", \"prune/student/deep/config.json\", \"prune/student/model.safetensors\", "
             "\"prune/student/reconstruct\", \"prune/student/reconstruct/kept.bin\"])' %s",
             archive);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(mkdir(out, 0755), 0);
    int fd = open(archive, O_RDONLY);
    assert_true(fd >= 0);
    g_nsynced = 0;
    if (tar_extract(fd, out, err, sizeof err) != 0)
        fail_msg("tar_extract: %s", err);
    close(fd);
    static const char *files[] = {"calibration.json", ".done", "student/model.safetensors", "student/deep/config.json"};
    for (int i = 0; i < 4; i++) {
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/prune/%s", out, files[i]);
        same_file(a, b);
        if (!synced(b))
            fail_msg("%s was not fsynced", b);
    }
    static const char *dirs[] = {"", "/prune", "/prune/student", "/prune/student/deep"};
    for (int i = 0; i < 4; i++) {
        char d[512];
        snprintf(d, sizeof d, "%s%s", out, dirs[i]);
        if (!synced(d))
            fail_msg("the folder %s was not fsynced", d);
    }
}

/* A one-member archive whose header is built here: name, type, size, and a checksum that
 * is right unless bad_sum; then `data` padded, then the closing blocks unless cut. */
static void raw_archive(const char *path, const char *name, char type, const char *data, int bad_sum, int cut)
{
    unsigned char h[512];
    memset(h, 0, sizeof h);
    snprintf((char *)h, 100, "%s", name);
    snprintf((char *)h + 100, 8, "%07o", 0644);
    snprintf((char *)h + 124, 12, "%011o", (unsigned)strlen(data));
    snprintf((char *)h + 136, 12, "%011o", 0);
    h[156] = (unsigned char)type;
    if (type == '2')
        snprintf((char *)h + 157, 100, "/etc/passwd");
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum + (bad_sum ? 1 : 0));
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(h, 1, 512, f);
    unsigned char block[512] = {0};
    memcpy(block, data, strlen(data));
    fwrite(block, 1, cut ? 100 : 512, f);
    if (!cut) {
        memset(block, 0, sizeof block);
        fwrite(block, 1, 512, f);
        fwrite(block, 1, 512, f);
    }
    fclose(f);
}

static void expect_refused(const char *name, char type, int bad_sum, int cut, const char *why)
{
    char archive[128], out[128], err[512] = "";
    snprintf(archive, sizeof archive, "%s/bad.tar", dir);
    snprintf(out, sizeof out, "%s/bad", dir);
    assert_int_equal(fio_remove_tree(out), 0);
    assert_int_equal(mkdir(out, 0755), 0);
    raw_archive(archive, name, type, "hello", bad_sum, cut);
    int fd = open(archive, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(tar_extract(fd, out, err, sizeof err), -1);
    close(fd);
    if (!strstr(err, why))
        fail_msg("'%s' (type %c): the reason '%s' does not say '%s'", name, type, err, why);
    char escaped[256];
    snprintf(escaped, sizeof escaped, "%s/x", dir);
    assert_false(fio_is_file(escaped));   /* nothing landed beside the destination */
}

static void test_hostile(void **state)
{
    (void)state;
    char ok_dir[128], archive[128], err[512] = "";
    snprintf(ok_dir, sizeof ok_dir, "%s/good", dir);
    snprintf(archive, sizeof archive, "%s/good.tar", dir);
    assert_int_equal(mkdir(ok_dir, 0755), 0);
    raw_archive(archive, "a/b.txt", '0', "hello", 0, 0);   /* the builder itself is right */
    int fd = open(archive, O_RDONLY);
    assert_int_equal(tar_extract(fd, ok_dir, err, sizeof err), 0);
    close(fd);
    expect_refused("../x", '0', 0, 0, "outside the destination");
    expect_refused("a/../../x", '0', 0, 0, "outside the destination");
    expect_refused("/tmp/x", '0', 0, 0, "outside the destination");
    expect_refused("link", '2', 0, 0, "neither a file nor a folder");
    expect_refused("a.txt", '0', 1, 0, "damaged header");
    expect_refused("a.txt", '0', 0, 1, "ends inside a member");
}

/* Rewrite the size field (12 bytes at 124) of the archive's first header, checksum redone. */
static void patch_size(const char *path, const unsigned char field[12])
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    unsigned char h[512];
    assert_int_equal(fread(h, 1, 512, f), 512);
    memcpy(h + 124, field, 12);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    assert_int_equal(fseek(f, 0, SEEK_SET), 0);
    assert_int_equal(fwrite(h, 1, 512, f), 512);
    assert_int_equal(fclose(f), 0);
}

/* GNU base-256 sizes: one near 2^64 (size + padding wraps to 0, so the member would be
 * taken as empty and its data read as the next headers) and a negative one are refused;
 * the member's true size in base-256 still extracts. */
static void test_size_fields(void **state)
{
    (void)state;
    static const unsigned char huge[12] = {0x80, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    static const unsigned char negative[12] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFB};
    static const unsigned char five[12] = {0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5};
    const unsigned char *fields[] = {huge, negative, five};
    for (int i = 0; i < 3; i++) {
        char archive[128], out[128], err[512] = "", got[160];
        snprintf(archive, sizeof archive, "%s/size%d.tar", dir, i);
        snprintf(out, sizeof out, "%s/size%d", dir, i);
        assert_int_equal(mkdir(out, 0755), 0);
        raw_archive(archive, "m.txt", '0', "hello", 0, 0);
        patch_size(archive, fields[i]);
        int fd = open(archive, O_RDONLY);
        assert_true(fd >= 0);
        int rc = tar_extract(fd, out, err, sizeof err);
        close(fd);
        snprintf(got, sizeof got, "%s/m.txt", out);
        if (i < 2) {
            assert_int_equal(rc, -1);
            assert_non_null(strstr(err, "damaged header"));
            assert_false(fio_is_file(got));
        } else {
            if (rc)
                fail_msg("tar_extract: %s", err);
            struct stat sb;
            assert_int_equal(stat(got, &sb), 0);
            assert_int_equal(sb.st_size, 5);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_size_fields),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
