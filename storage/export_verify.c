/* storage/export_verify.c — an export's digests and loading it back (see export.h):
 * SHA256SUMS written over a directory's regular files (sha256sum -c reads it), every
 * listed file checked against it, and the model loader that refuses a damaged export
 * before reading it.
 */
#include "storage/export_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/artstore.h"
#include "storage/fileio.h"
#include "storage/strbuf.h"

int exp_write_sums(const char *dir, char *err, size_t errlen)
{
    char **names;
    size_t n;
    if (fio_list_dir(dir, &names, &n) < 0) {
        snprintf(err, errlen, "SHA256SUMS: open %s: %s", dir, strerror(errno));
        return -1;
    }
    strbuf sums = {0};
    int rc = -1;
    for (size_t i = 0; i < n; i++) {
        char p[4096], hex[65];
        int64_t size;
        if (names[i][0] == '.' || !strcmp(names[i], "SHA256SUMS") || fio_has_suffix(names[i], ".tmp") ||
            fio_path_join(p, sizeof p, dir, names[i]) < 0 || !fio_is_file(p))
            continue;
        if (art_sha256_file(p, hex, &size, err, errlen) < 0)
            goto out;
        strbuf_printf(&sums, "%s  %s\n", hex, names[i]);
    }
    char path[4096], why[600];
    if (sums.oom || fio_path_join(path, sizeof path, dir, "SHA256SUMS") < 0) {
        snprintf(err, errlen, "SHA256SUMS: out of memory or path too long");
        goto out;
    }
    if (fio_write_atomic(path, sums.s ? sums.s : "", sums.len, why, sizeof why) < 0) {
        snprintf(err, errlen, "SHA256SUMS: %s", why);
        goto out;
    }
    rc = 0;
out:
    free(sums.s);
    fio_names_free(names, n);
    return rc;
}

int exp_verify_file(const char *path, const char *hex, int64_t size, char *err, size_t errlen)
{
    char got[65];
    int64_t gsize;
    if (art_sha256_file(path, got, &gsize, err, errlen) < 0)
        return -1;
    if (size >= 0 && gsize != size) {
        snprintf(err, errlen, "%s: %lld bytes, expected %lld (truncated or corrupted)", path,
                 (long long)gsize, (long long)size);
        return -1;
    }
    if (strcmp(got, hex) != 0) {
        snprintf(err, errlen, "%s: sha-256 mismatch (file corrupted or truncated)", path);
        return -1;
    }
    return 0;
}

int exp_verify_dir(const char *dir, char *err, size_t errlen)
{
    char path[4096];
    if (fio_path_join(path, sizeof path, dir, "SHA256SUMS") < 0) {
        snprintf(err, errlen, "verify: path too long");
        return -1;
    }
    /* a regular file, read whole (a FIFO would block, a read error would pass for its end) */
    char why[4200];
    size_t len = 0;
    char *text = fio_read_all(path, 16u << 20, &len, why, sizeof why);
    if (!text) {
        snprintf(err, errlen, "verify: %s", why);
        return -1;
    }
    if (strlen(text) != len) {
        snprintf(err, errlen, "verify: %s: holds a NUL byte", path);
        free(text);
        return -1;
    }
    int rc = 0, lines = 0;
    for (char *line = text, *next; rc == 0 && *line; line = next) {
        char *nl = strchr(line, '\n');
        next = nl ? nl + 1 : line + strlen(line);
        if (nl)
            *nl = '\0';
        size_t l = strlen(line);
        if (l < 67 || line[64] != ' ' || line[65] != ' ' || strchr(line + 66, '/')) {
            snprintf(err, errlen, "verify: %s: malformed line %d", path, lines + 1);
            rc = -1;
            break;
        }
        line[64] = '\0';
        char p[4096];
        if (fio_path_join(p, sizeof p, dir, line + 66) < 0 || !fio_is_file(p)) {
            snprintf(err, errlen, "verify: %s is missing", line + 66);
            rc = -1;
            break;
        }
        rc = exp_verify_file(p, line, -1, err, errlen);
        lines++;
    }
    free(text);
    if (rc == 0 && lines == 0) {
        snprintf(err, errlen, "verify: %s lists no files", path);
        rc = -1;
    }
    return rc;
}

int exp_load_model(const char *path, eng_backend *be, eng_model *m, char *err, size_t errlen)
{
    char sums[4096];
    if (fio_is_dir(path) && fio_path_join(sums, sizeof sums, path, "SHA256SUMS") == 0 && fio_is_file(sums) &&
        exp_verify_dir(path, err, errlen) < 0)
        return -1;
    return mio_load_model(path, NULL, be, m, NULL, err, errlen);
}
