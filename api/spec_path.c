/* api/spec_path.c — server-path confinement for the spec validator (spec.h): a path an
 * API user names resolves only inside the configured roots, every symlink followed (a
 * dangling one too), and one answer for everything outside, whether it exists or not.
 * Nothing is opened here; the caller reads the resolved path.
 */
#include "api/spec.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/fileio.h"

static int under(const char *p, const char *root)
{
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/')
        return p[0] == '/';
    return !strncmp(p, root, n) && (p[n] == '/' || p[n] == 0);
}

static int under_any(const spec_env *env, const char *p)
{
    for (int i = 0; i < env->n_roots; i++)
        if (under(p, env->roots[i]))
            return 1;
    return 0;
}

/* Lexically normalize an absolute path (drop "." and empty components). */
static void lex_norm(const char *in, char *out, size_t n)
{
    size_t k = 0;
    const char *p = in;
    while (*p && k + 2 < n) {
        while (*p == '/')
            p++;
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0)
            break;
        if (!(len == 1 && p[0] == '.')) {
            if (k + 1 + len + 1 >= n)
                break;
            out[k++] = '/';
            memcpy(out + k, p, len);
            k += len;
        }
        p += len;
    }
    if (k == 0)
        out[k++] = '/';
    out[k] = 0;
}

static int has_dotdot(const char *path)
{
    const char *p = path;
    while (*p) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 2 && p[0] == '.' && p[1] == '.')
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

/* One answer for every path that is not the caller's to read, whether or not it exists. */
#define OUTSIDE_ROOTS "the path is outside the allowed roots (see --data-root)"

int spec_resolve_path(const spec_env *env, const char *path, char *out, size_t outlen,
                      char *msg, size_t msglen)
{
    if (!path[0]) {
        snprintf(msg, msglen, "the path is empty");
        return 422;
    }
    if (has_dotdot(path)) {
        snprintf(msg, msglen, "'..' is not allowed in server paths");
        return 403;
    }
    if (strlen(path) > 3000) {
        snprintf(msg, msglen, "the path is too long");
        return 422;
    }
    /* Candidates: an absolute path as is; a relative one against the data dir, then each
     * root. */
    char cand[8][4096];
    int nc = 0;
    if (path[0] == '/') {
        lex_norm(path, cand[nc++], sizeof cand[0]);
    } else {
        char base[4096], tmp[8192];
        if (env->data_dir && realpath(env->data_dir, base)) {
            snprintf(tmp, sizeof tmp, "%s/%s", base, path);
            lex_norm(tmp, cand[nc++], sizeof cand[0]);
        }
        for (int i = 0; i < env->n_roots && nc < 8; i++) {
            snprintf(tmp, sizeof tmp, "%s/%s", env->roots[i], path);
            lex_norm(tmp, cand[nc++], sizeof cand[0]);
        }
    }
    /* What decides is where a candidate resolves, links followed (dangling ones too): an
     * absolute path outside the roots gets the same 403 whether it exists or not, and one
     * that reaches a root through a link (a root that is itself a link, say) is inside. */
    int inside = 0, escaped = 0;
    for (int i = 0; i < nc; i++) {
        char real[PATH_MAX];
        struct stat lst;
        if (fio_resolve(cand[i], real, sizeof real) || !under_any(env, real)) {
            /* outside every root: directly, or through a link, existing or not; a relative
             * path's data-dir candidate counts only when something is there */
            if (path[0] == '/' || under_any(env, cand[i]) || lstat(cand[i], &lst) == 0)
                escaped = 1;
            continue;
        }
        inside = 1;
        struct stat st;
        if (stat(real, &st) != 0)
            continue;
        /* What is read is the real path, inside a root: also when the path reaches it
         * through a link to a root (a root that is itself a symlink, say). */
        if (access(real, R_OK) != 0) {
            snprintf(msg, msglen, "the path is not readable by the server: %s", strerror(errno));
            return 422;
        }
        if (snprintf(out, outlen, "%s", real) >= (int)outlen) {
            snprintf(msg, msglen, "the path is too long");
            return 422;
        }
        return 0;
    }
    if (escaped || !inside) {
        snprintf(msg, msglen, OUTSIDE_ROOTS);
        return 403;
    }
    snprintf(msg, msglen, "no such file or directory inside the allowed roots");
    return 422;
}

/* 1 when path resolves (links followed, dangling ones too) inside one of the roots. */
static int inside_roots(const spec_env *env, const char *path)
{
    char real[PATH_MAX];
    return fio_resolve(path, real, sizeof real) == 0 && under_any(env, real);
}

/* The names storage/modelio reads beside a model file: its config (safetensors) and the
 * tokenizers it looks for (tokenizer.json; llama2.c's tok<vocab>.bin or tokenizer.bin). */
static int read_beside_file(const char *name)
{
    if (!strcmp(name, "config.json") || !strcmp(name, "tokenizer.json") || !strcmp(name, "tokenizer.bin") ||
        !strcmp(name, "tokenizer_config.json") || !strcmp(name, "special_tokens_map.json"))   /* read with it */
        return 1;
    size_t n = strlen(name), k = 3;
    if (n < 8 || strncmp(name, "tok", 3) || strcmp(name + n - 4, ".bin"))
        return 0;
    while (k < n - 4 && name[k] >= '0' && name[k] <= '9')
        k++;
    return k == n - 4;
}

int spec_model_confined(const spec_env *env, const char *path, char *bad, size_t badlen)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return 0;
    int folder = S_ISDIR(st.st_mode);
    char dir[PATH_MAX], **names;
    size_t n;
    if (folder)
        snprintf(dir, sizeof dir, "%s", path);
    else
        fio_dir_of(path, dir, sizeof dir);
    if (fio_list_dir(*dir ? dir : "/", &names, &n))
        return 0;   /* a folder that cannot be listed cannot be read as a model either: the probe says so */
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char p[PATH_MAX + 256];
        struct stat lst;
        if ((!folder && !read_beside_file(names[i])) || fio_path_join(p, sizeof p, dir, names[i]) ||
            lstat(p, &lst) != 0 || !S_ISLNK(lst.st_mode))
            continue;
        if (!inside_roots(env, p)) {
            snprintf(bad, badlen, "%s", names[i]);
            rc = -1;
        }
    }
    fio_names_free(names, n);
    return rc;
}

const char *spec_file_kind(const char *resolved)
{
    struct stat st;
    if (stat(resolved, &st))
        return "missing";
    return S_ISREG(st.st_mode) ? NULL : fio_file_kind(st.st_mode);
}
