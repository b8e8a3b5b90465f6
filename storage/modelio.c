/* storage/modelio.c — format detection and loading of parent models into the engine.
 * Weights are converted one tensor at a time through a host buffer the size of the
 * largest tensor, so peak host memory is one tensor beyond the engine's own copy.
 */
#include "storage/modelio.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/fileio.h"
#include "storage/gguf_families.h"
#include "storage/hfconfig.h"
#include "storage/tokload.h"

const char *mio_format_name(mio_format f)
{
    switch (f) {
    case MIO_HF_DIR: return "hf";
    case MIO_SAFETENSORS: return "safetensors";
    case MIO_GGUF: return "gguf";
    case MIO_LLAMA2C: return "llama2c";
    }
    return "?";
}

static int grow(mio_model *m, int n)
{
    m->t = calloc((size_t)(n ? n : 1), sizeof *m->t);
    return m->t ? 0 : -1;
}

/* A Nemotron-H checkpoint's tensor name as the engine spells it: transformers' newer saves use
 * "model." for "backbone.", NVIDIA's older ones "embedding" for "embeddings". */
static void nemotron_name(char *out, size_t cap, const char *name)
{
    const char *rest = !strncmp(name, "model.", 6) ? name + 6 : !strncmp(name, "backbone.", 9) ? name + 9 : NULL;
    if (!rest) {
        snprintf(out, cap, "%s", name);
        return;
    }
    snprintf(out, cap, "backbone.%s", !strcmp(rest, "embedding.weight") ? "embeddings.weight" : rest);
}

static int open_safetensors(mio_model *m, const char *weights, const char *dir, char *err, size_t errlen)
{
    char cfg[PATH_MAX];
    if (fio_path_join(cfg, sizeof cfg, dir, "config.json") || !fio_is_file(cfg)) {
        snprintf(err, errlen, "%s: no config.json beside the weights", dir);
        return -1;
    }
    if (hfconfig_load(cfg, &m->a, err, errlen) || st_open(&m->st, weights, err, errlen))
        return -1;
    if (grow(m, m->st.n))
        goto oom;
    for (int i = 0; i < m->st.n; i++) {
        const st_tensor *s = &m->st.t[i];
        mio_tensor *t = &m->t[m->n_tensors];
        if (strstr(s->name, "rotary_emb.inv_freq"))
            continue;   /* recomputed by the engine */
        int hybrid = arch_hybrid(&m->a);
        if (hybrid && !strncmp(s->name, "mtp.", 4))
            continue;   /* Nemotron's multi-token-prediction head: not part of the model served */
        /* [n, 1, k]: a depthwise conv's weight (Mamba-2's conv1d), held as [n, k] */
        int conv = s->ndim == 3 && s->shape[1] == 1;
        if ((s->ndim < 1 || s->ndim > 2) && !conv) {
            snprintf(err, errlen, "%s: tensor %s has %d dimensions", weights, s->name, s->ndim);
            return -1;
        }
        if (hybrid)   /* one spelling of Nemotron-H's names: backbone.*, backbone.embeddings */
            nemotron_name(t->name, sizeof t->name, s->name);
        else
            snprintf(t->name, sizeof t->name, "%s", s->name);
        t->ndim = conv ? 2 : s->ndim;
        t->shape[0] = s->shape[0];
        t->shape[1] = conv ? s->shape[2] : s->ndim == 2 ? s->shape[1] : 0;
        t->dtype = st_dtype_name(s->dtype);
        t->nbytes = s->end - s->begin;
        t->src = i;
        m->n_tensors++;
    }
    if (fio_path_join(m->tok_path, sizeof m->tok_path, dir, "tokenizer.json"))
        m->tok_path[0] = '\0';
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
    return -1;
}

/* GGUF tensor i's HF tensors (np parts) appended to m's table (room made by open_gguf). */
static void gguf_parts_into(mio_model *m, int i, const gguf_hf_part *p, int np)
{
    for (int k = 0; k < np; k++) {
        mio_tensor *t = &m->t[m->n_tensors++];
        snprintf(t->name, sizeof t->name, "%s", p[k].name);
        memcpy(t->shape, p[k].shape, sizeof t->shape);
        t->ndim = p[k].ndim;
        t->permute_heads = p[k].permute_heads;
        t->neg_exp = p[k].neg_exp;
        t->sub = p[k].sub;
        t->n_sub = p[k].n_sub;
        t->dtype = gguf_type_name(m->gg.t[i].type);
        t->nbytes = m->gg.t[i].nbytes / (uint64_t)p[k].n_sub;
        t->src = i;
    }
}

static int open_gguf(mio_model *m, char *err, size_t errlen)
{
    if (gguf_open(&m->gg, m->path, err, errlen) || gguf_arch(&m->gg, &m->a, err, errlen))
        return -1;
    int64_t total = 0;   /* HF tensors: a stacked expert tensor holds one per expert */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < m->gg.n_tensors; i++) {
            gguf_hf_part *p;
            int np;
            char why[256];
            int rc = gguf_hf_parts(&m->gg, &m->a, i, &p, &np, why, sizeof why);
            if (rc < 0) {
                snprintf(err, errlen, "%s: %s", m->path, why);
                return -1;
            }
            if (rc > 0)
                continue;
            if (pass == 0)
                total += np;
            else
                gguf_parts_into(m, i, p, np);
            free(p);
        }
        if (pass == 0 && (total > (1 << 24) || grow(m, (int)total))) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    m->tok_path[0] = '\0';
    return 0;
}

static int open_llama2c(mio_model *m, const char *tokenizer_path, char *err, size_t errlen)
{
    if (l2c_open(&m->l2, m->path, err, errlen) || l2c_arch(&m->l2, &m->a, err, errlen))
        return -1;
    if (grow(m, m->l2.n)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < m->l2.n; i++) {
        const l2c_tensor *s = &m->l2.t[i];
        mio_tensor *t = &m->t[m->n_tensors++];
        snprintf(t->name, sizeof t->name, "%s", s->name);
        t->ndim = s->ndim;
        t->shape[0] = s->shape[0];
        t->shape[1] = s->shape[1];
        t->dtype = "F32";
        t->nbytes = (uint64_t)(s->shape[0] * (s->ndim == 2 ? s->shape[1] : 1)) * 4;
        t->src = i;
    }
    if (!tokenizer_path) {
        char dir[PATH_MAX], name[64];
        fio_dir_of(m->path, dir, sizeof dir);
        snprintf(name, sizeof name, "tok%d.bin", m->a.vocab_size);
        if (fio_path_join(m->tok_path, sizeof m->tok_path, dir, name) || !fio_is_file(m->tok_path))
            if (fio_path_join(m->tok_path, sizeof m->tok_path, dir, "tokenizer.bin"))
                m->tok_path[0] = '\0';
    }
    return 0;
}

int mio_probe(const char *path, mio_format *fmt, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st)) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        char w[PATH_MAX];
        if (fio_path_join(w, sizeof w, path, "config.json") || !fio_is_file(w) ||
            ((fio_path_join(w, sizeof w, path, "model.safetensors.index.json") || !fio_is_file(w)) &&
             (fio_path_join(w, sizeof w, path, "model.safetensors") || !fio_is_file(w)))) {
            snprintf(err, errlen, "%s: not a model directory (it needs config.json and model.safetensors or "
                                  "model.safetensors.index.json); accepted: %s", path, MIO_FORMATS);
            return -1;
        }
        *fmt = MIO_HF_DIR;
        return 0;
    }
    if (!S_ISREG(st.st_mode)) {
        /* never opened: a FIFO or a device could block the reader or never end */
        snprintf(err, errlen, "%s: not a regular file (%s); accepted: %s", path,
                 S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket"
                 : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a special file", MIO_FORMATS);
        return -1;
    }
    unsigned char head[28] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    ssize_t got = fd >= 0 ? read(fd, head, sizeof head) : -1;
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (got < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        return -1;
    }
    uint64_t hlen = 0;
    memcpy(&hlen, head, 8);
    l2c_header h;
    char why[256];
    if (got >= 4 && !memcmp(head, "GGUF", 4))
        *fmt = MIO_GGUF;
    else if (got >= 9 && head[8] == '{' && hlen >= 2 && hlen <= (uint64_t)st.st_size - 8)
        *fmt = MIO_SAFETENSORS;
    else if (got == 28 && !l2c_header_check(head, (uint64_t)st.st_size, &h, why, sizeof why))
        *fmt = MIO_LLAMA2C;
    else if (got >= 0 && strlen(path) > 4 && fio_has_suffix(path, ".bin")) {
        /* named as a llama2.c checkpoint: say what is wrong with it */
        snprintf(err, errlen, "%s: %s", path, got == 28 ? why : "shorter than the 28-byte llama2.c header");
        return -1;
    } else {
        snprintf(err, errlen, "%s: not a model in a supported format; accepted: %s", path, MIO_FORMATS);
        return -1;
    }
    return 0;
}

int mio_open(mio_model *m, const char *path, const char *tokenizer_path, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    int rc = -1;
    if (snprintf(m->path, sizeof m->path, "%s", path) >= (int)sizeof m->path) {
        snprintf(err, errlen, "model path too long");
        return -1;
    }
    mio_format f;
    if (mio_probe(path, &f, err, errlen))
        return -1;
    m->format = f;
    char dir[PATH_MAX];
    fio_dir_of(path, dir, sizeof dir);
    switch (f) {
    case MIO_HF_DIR: rc = open_safetensors(m, path, path, err, errlen); break;
    case MIO_SAFETENSORS: rc = open_safetensors(m, path, dir, err, errlen); break;
    case MIO_GGUF: rc = open_gguf(m, err, errlen); break;
    case MIO_LLAMA2C: rc = open_llama2c(m, tokenizer_path, err, errlen); break;
    }
    if (!rc && tokenizer_path && snprintf(m->tok_path, sizeof m->tok_path, "%s", tokenizer_path) >= (int)sizeof m->tok_path) {
        snprintf(err, errlen, "tokenizer path too long");
        rc = -1;
    }
    m->tok_given = tokenizer_path != NULL;
    if (rc)
        mio_close(m);
    return rc;
}

void mio_close(mio_model *m)
{
    if (m->format == MIO_GGUF)
        gguf_close(&m->gg);
    else if (m->format == MIO_LLAMA2C)
        l2c_close(&m->l2);
    else if (m->format)
        st_close(&m->st);
    arch_free(&m->a);
    free(m->t);
    memset(m, 0, sizeof *m);
}

static int64_t numel_of(const mio_tensor *t)
{
    return t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
}

int mio_read_tensor(const mio_model *m, int i, float *out, int64_t n, char *err, size_t errlen)
{
    if (i < 0 || i >= m->n_tensors) {
        snprintf(err, errlen, "tensor index %d out of range", i);
        return -1;
    }
    const mio_tensor *t = &m->t[i];
    switch (m->format) {
    case MIO_GGUF:
        if (gguf_read_f32_sub(&m->gg, t->src, t->n_sub > 1 ? t->sub : 0, t->n_sub > 1 ? t->n_sub : 1, out, n, err,
                              errlen))
            return -1;
        for (int64_t k = 0; t->neg_exp && k < numel_of(t); k++) {
            if (!(out[k] < 0)) {
                snprintf(err, errlen, "%s: llama.cpp stores -exp(A_log), which is negative; found %g", t->name,
                         (double)out[k]);
                return -1;
            }
            out[k] = logf(-out[k]);
        }
        if (t->permute_heads &&
            l2c_unpermute_rope_rows(out, t->shape[0], t->ndim == 2 ? t->shape[1] : 1, t->permute_heads)) {
            snprintf(err, errlen, "%s: %lld rows do not split into %d RoPE heads", t->name, (long long)t->shape[0],
                     t->permute_heads);
            return -1;
        }
        return 0;
    case MIO_LLAMA2C:
        return l2c_read_f32(&m->l2, t->src, out, n, err, errlen);
    default:
        return st_read_f32(&m->st, t->src, out, n, err, errlen);
    }
}

/* Position of `name` in want[] through `order` (indices sorted by name), or -1. */
static int find_desc(const eng_tensor_desc *want, const int *order, int n, const char *name)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(want[order[mid]].name, name);
        if (!c)
            return order[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static int cmp_desc_name(const void *a, const void *b, void *ctx)
{
    const eng_tensor_desc *d = ctx;
    return strcmp(d[*(const int *)a].name, d[*(const int *)b].name);
}

/* "[rows, cols]" or "[n]" into b. */
static void shape_str(char *b, size_t n, const int64_t *shape, int ndim)
{
    if (ndim == 2)
        snprintf(b, n, "[%lld, %lld]", (long long)shape[0], (long long)shape[1]);
    else
        snprintf(b, n, "[%lld]", (long long)shape[0]);
}

int mio_check(const mio_model *m, const arch *a, char *err, size_t errlen)
{
    eng_tensor_desc *want;
    int ne = eng_arch_tensors(a, &want, err, errlen), rc = -1, have = 0;
    if (ne < 0)
        return -1;
    int *order = malloc((size_t)(ne ? ne : 1) * sizeof *order);
    char *seen = calloc((size_t)(ne ? ne : 1), 1);
    if (!order || !seen) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    for (int k = 0; k < ne; k++)
        order[k] = k;
    qsort_r(order, (size_t)ne, sizeof *order, cmp_desc_name, want);
    for (int i = 0; i < m->n_tensors; i++) {
        const mio_tensor *t = &m->t[i];
        if (a->tie_word_embeddings && !strcmp(t->name, "lm_head.weight"))
            continue;   /* tied: the embedding is the head */
        int k = find_desc(want, order, ne, t->name);
        if (k < 0) {
            snprintf(err, errlen, "%s: tensor %s does not belong to the model's arch", m->path, t->name);
            goto out;
        }
        if (seen[k]) {
            snprintf(err, errlen, "%s: tensor %s appears twice", m->path, t->name);
            goto out;
        }
        const eng_tensor_desc *w = &want[k];
        if (t->ndim != w->ndim || t->shape[0] != w->shape[0] || (w->ndim == 2 && t->shape[1] != w->shape[1])) {
            char got[48], need[48];
            shape_str(got, sizeof got, t->shape, t->ndim);
            shape_str(need, sizeof need, w->shape, w->ndim);
            snprintf(err, errlen, "%s: tensor %s has shape %s where the arch needs %s", m->path, t->name, got, need);
            goto out;
        }
        seen[k] = 1;
        have++;
    }
    for (int k = 0; k < ne; k++)
        if (!seen[k]) {
            snprintf(err, errlen, "%s: tensor %s is missing (the file holds %d of the %d tensors its arch needs)",
                     m->path, want[k].name, have, ne);
            goto out;
        }
    rc = 0;
out:
    free(want);
    free(order);
    free(seen);
    return rc;
}

/* One tensor of an open model file, read straight into the model (eng_model_fill_tensor). */
typedef struct {
    const mio_model *m;
    int i;
} mio_source;

static int mio_fill(void *ud, float *dst, int64_t n, char *err, size_t errlen)
{
    const mio_source *s = ud;
    return mio_read_tensor(s->m, s->i, dst, n, err, errlen);
}

int mio_load(const mio_model *m, eng_model *em, char *err, size_t errlen)
{
    if (mio_check(m, &em->a, err, errlen))
        return -1;
    for (int i = 0; i < m->n_tensors; i++) {
        const mio_tensor *t = &m->t[i];
        if (em->a.tie_word_embeddings && !strcmp(t->name, "lm_head.weight"))
            continue;   /* tied: the embedding is the head */
        mio_source src = {.m = m, .i = i};
        if (eng_model_fill_tensor(em, t->name, t->shape, t->ndim, mio_fill, &src, err, errlen))
            return -1;
    }
    return 0;
}

int mio_tokenizer_found(const mio_model *m, char *err, size_t errlen)
{
    if (m->format == MIO_GGUF && !m->tok_path[0]) {
        if (gguf_find(&m->gg, "tokenizer.ggml.model") >= 0 && gguf_find(&m->gg, "tokenizer.ggml.tokens") >= 0)
            return 0;
        snprintf(err, errlen, "%s: no tokenizer found (the GGUF holds no tokenizer.ggml.model and tokens; give one "
                 "with --tokenizer)", m->path);
        return -1;
    }
    struct stat st;
    if (m->tok_given && !fio_is_file(m->tok_path)) {   /* the caller's: what is wrong with it */
        int gone = stat(m->tok_path, &st) != 0;
        snprintf(err, errlen, "tokenizer %s: %s%s%s", m->tok_path,
                 gone ? strerror(errno) : S_ISDIR(st.st_mode) ? "a directory, not a tokenizer file" : "not a regular file (",
                 gone || S_ISDIR(st.st_mode) ? "" : fio_file_kind(st.st_mode), gone || S_ISDIR(st.st_mode) ? "" : ")");
        return -1;
    }
    if (!m->tok_path[0] || !fio_is_file(m->tok_path)) {
        snprintf(err, errlen, "%s: no tokenizer found%s%s (give one with --tokenizer)", m->path,
                 m->tok_path[0] ? " at " : "", m->tok_path);
        return -1;
    }
    return 0;
}

tok_tokenizer *mio_tokenizer(const mio_model *m, char *err, size_t errlen)
{
    if (mio_tokenizer_found(m, err, errlen))
        return NULL;
    if (m->format == MIO_GGUF && !m->tok_path[0])
        return tokload_gguf(&m->gg, err, errlen);
    size_t n = strlen(m->tok_path);
    if (n > 5 && !strcmp(m->tok_path + n - 5, ".json"))
        return tokload_hf_json(m->tok_path, err, errlen);
    if (n > 5 && !strcmp(m->tok_path + n - 5, ".gguf")) {
        gguf_file g;
        if (gguf_open(&g, m->tok_path, err, errlen))
            return NULL;
        tok_tokenizer *t = tokload_gguf(&g, err, errlen);
        gguf_close(&g);
        return t;
    }
    return tokload_llama2c(m->tok_path, m->a.vocab_size, err, errlen);
}

int mio_load_model(const char *path, const char *tokenizer_path, eng_backend *be, eng_model *em,
                   tok_tokenizer **tok, char *err, size_t errlen)
{
    mio_model m;
    if (tok)
        *tok = NULL;
    if (mio_open(&m, path, tokenizer_path, err, errlen))
        return -1;
    /* the weights present must match the claimed shape before the claim is allocated; the
       tokenizer is read first, so that a wrong one is said before the weights load */
    if (mio_check(&m, &m.a, err, errlen) || (tok && !(*tok = mio_tokenizer(&m, err, errlen))) ||
        eng_model_init(em, &m.a, be, err, errlen)) {
        if (tok) {
            tok_free(*tok);
            *tok = NULL;
        }
        mio_close(&m);
        return -1;
    }
    if (mio_load(&m, em, err, errlen)) {
        if (tok) {
            tok_free(*tok);
            *tok = NULL;
        }
        eng_model_free(em);
        mio_close(&m);
        return -1;
    }
    if (tok && tok_n_vocab(*tok) > em->a.vocab_size) {
        snprintf(err, errlen, "%s: tokenizer has %d tokens but the model only %d", path, tok_n_vocab(*tok),
                 em->a.vocab_size);
        tok_free(*tok);
        *tok = NULL;
        eng_model_free(em);
        mio_close(&m);
        return -1;
    }
    mio_close(&m);
    return 0;
}
