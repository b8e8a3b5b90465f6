/* storage/ckpt.c — arch.json + fp32 model.safetensors snapshots of an engine model. */
#include "storage/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/archjson.h"
#include "storage/fileio.h"
#include "storage/safetensors.h"

int ckpt_save(const eng_model *m, const char *dir, char *err, size_t errlen)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    int n = eng_model_tensor_count(m);
    st_write_tensor *ts = calloc((size_t)n, sizeof *ts);
    float **bufs = calloc((size_t)n, sizeof *bufs);
    int rc = -1;
    if (!ts || !bufs) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        const char *name;
        int64_t shape[2];
        int ndim;
        float *dev;
        if (eng_model_tensor(m, i, &name, shape, &ndim, &dev) != 0) {
            snprintf(err, errlen, "tensor %d could not be enumerated", i);
            goto out;
        }
        int64_t numel = ndim == 2 ? shape[0] * shape[1] : shape[0];
        bufs[i] = malloc((size_t)numel * sizeof(float));
        if (!bufs[i]) {
            snprintf(err, errlen, "out of memory copying %s", name);
            goto out;
        }
        m->be->to_host(m->be, bufs[i], dev, (size_t)numel * sizeof(float));
        ts[i].name = name;
        ts[i].data = bufs[i];
        ts[i].ndim = ndim;
        ts[i].shape[0] = shape[0];
        ts[i].shape[1] = ndim == 2 ? shape[1] : 0;
    }
    /* the weights carry their arch too: a save cut short between the two files (new
     * weights beside an older arch.json) is then refused at load, never taken as a model */
    json_t *aj = arch_to_json(&m->a);
    char *text = aj ? json_dumps(aj, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_t *meta = text ? json_pack("{s:s}", CKPT_ARCH_KEY, text) : NULL;
    free(text);
    if (!meta) {
        json_decref(aj);
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_write(path, ts, n, ST_F32, meta, err, errlen) != 0) {
        json_decref(meta);
        json_decref(aj);
        goto out;
    }
    json_decref(meta);
    snprintf(path, sizeof path, "%s/arch.json", dir);
    rc = fio_write_json(path, aj, JSON_INDENT(1) | JSON_SORT_KEYS, err, errlen);
    json_decref(aj);
out:
    for (int i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(ts);
    return rc;
}

/* The arch the weights were saved with (in their metadata), when they carry one, is the
 * arch.json beside them (aj). 0, or -1 with err. */
static int same_arch(const st_file *f, const json_t *aj, const char *path, char *err, size_t errlen)
{
    const char *text = json_string_value(json_object_get(f->metadata, CKPT_ARCH_KEY));
    if (!text)
        return 0;   /* a snapshot from before the weights carried it */
    json_t *saved = json_loads(text, 0, NULL);
    int same = saved && json_equal(saved, aj);
    json_decref(saved);
    if (!same)
        snprintf(err, errlen, "%s: the weights were saved with another arch than the arch.json beside them (a save "
                 "cut short between the two files?): save the snapshot again", path);
    return same ? 0 : -1;
}

/* Every tensor arch a holds is in f with its shape. 0, or -1 naming the first that is not. */
static int tensors_present(const st_file *f, const arch *a, const char *path, char *err, size_t errlen)
{
    eng_tensor_desc *want;
    int n = eng_arch_tensors(a, &want, err, errlen), rc = 0;
    if (n < 0)
        return -1;
    for (int i = 0; i < n && rc == 0; i++) {
        int k = st_find(f, want[i].name);
        if (k < 0) {
            snprintf(err, errlen, "%s: tensor %s is missing", path, want[i].name);
            rc = -1;
        } else if (f->t[k].ndim != want[i].ndim || f->t[k].shape[0] != want[i].shape[0] ||
                   (want[i].ndim == 2 && f->t[k].shape[1] != want[i].shape[1])) {
            snprintf(err, errlen, "%s: tensor %s does not have the shape arch.json gives it", path, want[i].name);
            rc = -1;
        }
    }
    free(want);
    return rc;
}

/* One tensor of an open checkpoint, read straight into the model (eng_model_fill_tensor). */
typedef struct {
    const st_file *f;
    int k;
} st_source;

static int st_fill(void *ud, float *dst, int64_t n, char *err, size_t errlen)
{
    const st_source *s = ud;
    return st_read_f32(s->f, s->k, dst, n, err, errlen);
}

/* Open dir's snapshot: its arch (into a) and its weights (f), every tensor of the arch
 * present with its shape and the weights' own arch, when they carry one, arch.json's.
 * 0 (arch_free a, st_close f), or -1 with nothing open. */
static int open_checked(const char *dir, arch *a, st_file *f, char *path, size_t plen, char *err, size_t errlen)
{
    snprintf(path, plen, "%s/arch.json", dir);
    json_t *aj = fio_load_json(path, JSON_REJECT_DUPLICATES, err, errlen);
    if (!aj)
        return -1;
    char e2[512];
    if (arch_from_json(aj, a, e2, sizeof e2) != 0) {
        json_decref(aj);
        snprintf(err, errlen, "%s: %s", path, e2);
        return -1;
    }
    snprintf(path, plen, "%s/model.safetensors", dir);
    if (st_open(f, path, err, errlen) != 0) {
        json_decref(aj);
        arch_free(a);
        return -1;
    }
    int rc = same_arch(f, aj, path, err, errlen);
    json_decref(aj);
    if (rc == 0)
        rc = tensors_present(f, a, path, err, errlen);
    if (rc != 0) {
        st_close(f);
        arch_free(a);
    }
    return rc;
}

/* Read every tensor of m from f, straight into m. 0, or -1 with a reason. */
static int fill_all(eng_model *m, const st_file *f, const char *path, char *err, size_t errlen)
{
    int n = eng_model_tensor_count(m);
    for (int i = 0; i < n; i++) {
        const char *name;
        int64_t shape[2];
        int ndim;
        float *dev;
        if (eng_model_tensor(m, i, &name, shape, &ndim, &dev) != 0) {
            snprintf(err, errlen, "tensor %d could not be enumerated", i);
            return -1;
        }
        st_source src = {.f = f, .k = st_find(f, name)};
        if (src.k < 0) {
            snprintf(err, errlen, "%s: tensor %s is missing", path, name);
            return -1;
        }
        if (eng_model_fill_tensor(m, name, f->t[src.k].shape, f->t[src.k].ndim, st_fill, &src, err, errlen))
            return -1;
    }
    return 0;
}

int ckpt_load(const char *dir, eng_backend *be, eng_model *m, char *err, size_t errlen)
{
    char path[4096];
    arch a;
    st_file f;
    /* every tensor of the claimed shape is in the file before the claim is allocated: a
     * small folder claiming a large model is refused without zeroing its size first */
    if (open_checked(dir, &a, &f, path, sizeof path, err, errlen))
        return -1;
    int rc = eng_model_init(m, &a, be, err, errlen);
    arch_free(&a);
    if (rc == 0 && (rc = fill_all(m, &f, path, err, errlen)) != 0)
        eng_model_free(m);
    st_close(&f);
    return rc;
}

int ckpt_load_into(const char *dir, eng_model *m, char *err, size_t errlen)
{
    char path[4096];
    arch a;
    st_file f;
    if (open_checked(dir, &a, &f, path, sizeof path, err, errlen))
        return -1;
    int rc = 0;
    if (!arch_equal(&a, &m->a)) {
        snprintf(err, errlen, "%s: holds another model shape than the one it is loaded into", dir);
        rc = -2;
    }
    arch_free(&a);
    if (rc == 0)
        rc = fill_all(m, &f, path, err, errlen);
    st_close(&f);
    return rc;
}
