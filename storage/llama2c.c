/* storage/llama2c.c — llama2.c legacy .bin reader. Validates the header against sane
 * limits and the exact file length before any tensor offset is computed, so truncated
 * or hostile files fail with a message instead of reading past the end.
 */
#include "storage/llama2c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/fileio.h"

static int add_tensor(l2c_file *f, uint64_t *off, const char *name, int64_t rows, int64_t cols, int permute)
{
    l2c_tensor *t = &f->t[f->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->ndim = cols ? 2 : 1;
    if (!cols)
        t->shape[1] = 0;
    t->offset = *off;
    t->permute_heads = permute;
    *off += (uint64_t)rows * (uint64_t)(cols ? cols : 1) * 4;
    return 0;
}

int l2c_header_check(const void *head, uint64_t file_len, l2c_header *H, char *err, size_t errlen)
{
    if (file_len < 28) {
        snprintf(err, errlen, "llama2.c checkpoint: %llu bytes is shorter than the 28-byte header",
                 (unsigned long long)file_len);
        return -1;
    }
    int32_t h[7];
    memcpy(h, head, sizeof h);
    memset(H, 0, sizeof *H);
    H->dim = h[0]; H->hidden_dim = h[1]; H->n_layers = h[2]; H->n_heads = h[3]; H->n_kv_heads = h[4];
    H->shared_classifier = h[5] > 0;
    H->vocab_size = h[5] > 0 ? h[5] : (h[5] == INT32_MIN ? 0 : -h[5]);
    H->seq_len = h[6];
    if (H->dim <= 0 || H->dim > 65536 || H->hidden_dim <= 0 || H->hidden_dim > (1 << 20) || H->n_layers <= 0 ||
        H->n_layers > 1024 || H->n_heads <= 0 || H->n_heads > 1024 || H->n_kv_heads <= 0 ||
        H->n_kv_heads > H->n_heads || H->n_heads % H->n_kv_heads || H->dim % H->n_heads ||
        (H->dim / H->n_heads) % 2 || H->vocab_size <= 0 || H->vocab_size > (1 << 22) || H->seq_len <= 0 ||
        H->seq_len > (1 << 24)) {
        snprintf(err, errlen,
                 "llama2.c checkpoint: implausible header (dim %d, hidden %d, layers %d, heads %d, kv heads %d, "
                 "vocab %d, seq_len %d)",
                 h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
        return -1;
    }
    int64_t C = H->dim, F = H->hidden_dim, L = H->n_layers, V = H->vocab_size, D = C / H->n_heads;
    int64_t KV = (int64_t)H->n_kv_heads * D;
    /* expected floats: emb + per-layer + final + freq_cis + optional classifier */
    uint64_t per_layer = (uint64_t)(C + C * C + 2 * KV * C + C * C + C + 3 * F * C);
    uint64_t total = (uint64_t)(V * C) + (uint64_t)L * per_layer + (uint64_t)C + (uint64_t)H->seq_len * (uint64_t)D +
                     (H->shared_classifier ? 0 : (uint64_t)(V * C));
    if (28 + total * 4 != file_len) {
        snprintf(err, errlen, "llama2.c checkpoint: the header implies %llu bytes but the file has %llu (%s)",
                 (unsigned long long)(28 + total * 4), (unsigned long long)file_len,
                 28 + total * 4 > file_len ? "truncated" : "trailing data");
        return -1;
    }
    return 0;
}

static int parse(l2c_file *f, char *err, size_t errlen)
{
    l2c_header *H = &f->h;
    if (l2c_header_check(f->base, f->len, H, err, errlen))
        return -1;
    int64_t C = H->dim, F = H->hidden_dim, L = H->n_layers, V = H->vocab_size, D = C / H->n_heads;
    int64_t KV = (int64_t)H->n_kv_heads * D;
    f->t = calloc((size_t)(L * 9 + 3), sizeof *f->t);
    if (!f->t) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* offsets follow the file order: emb, rms_att[L], wq[L], wk[L], wv[L], wo[L], rms_ffn[L], w1[L], w2[L], w3[L], rms_final */
    uint64_t off = 28;
    char name[96];
    add_tensor(f, &off, "model.embed_tokens.weight", V, C, 0);
    static const struct { const char *fmt; int kind; } order[] = {
        {"model.layers.%d.input_layernorm.weight", 0}, {"model.layers.%d.self_attn.q_proj.weight", 1},
        {"model.layers.%d.self_attn.k_proj.weight", 2}, {"model.layers.%d.self_attn.v_proj.weight", 3},
        {"model.layers.%d.self_attn.o_proj.weight", 4}, {"model.layers.%d.post_attention_layernorm.weight", 0},
        {"model.layers.%d.mlp.gate_proj.weight", 5}, {"model.layers.%d.mlp.down_proj.weight", 6},
        {"model.layers.%d.mlp.up_proj.weight", 5},
    };
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++)
        for (int l = 0; l < L; l++) {
            snprintf(name, sizeof name, order[k].fmt, l);
            switch (order[k].kind) {
            case 0: add_tensor(f, &off, name, C, 0, 0); break;
            case 1: add_tensor(f, &off, name, C, C, H->n_heads); break;
            case 2: add_tensor(f, &off, name, KV, C, H->n_kv_heads); break;
            case 3: add_tensor(f, &off, name, KV, C, 0); break;
            case 4: add_tensor(f, &off, name, C, C, 0); break;
            case 5: add_tensor(f, &off, name, F, C, 0); break;
            default: add_tensor(f, &off, name, C, F, 0); break;
            }
        }
    add_tensor(f, &off, "model.norm.weight", C, 0, 0);
    off += (uint64_t)H->seq_len * (uint64_t)D * 4;   /* freq_cis_real, freq_cis_imag: recomputed by the engine */
    if (!H->shared_classifier)
        add_tensor(f, &off, "lm_head.weight", V, C, 0);
    return 0;
}

int l2c_open_mem(l2c_file *f, const void *buf, size_t len, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->base = buf;
    f->len = len;
    if (parse(f, err, errlen)) {
        l2c_close(f);
        return -1;
    }
    return 0;
}

int l2c_open(l2c_file *f, const char *path, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    void *m;
    size_t len;
    if (fio_map(path, 28, "a llama2.c checkpoint", &m, &len, err, errlen))
        return -1;
    f->map = m;
    f->base = m;
    f->len = len;
    fio_guard guard;
    if (sigsetjmp(guard.jb, 1)) {
        snprintf(err, errlen, "%s: llama2.c checkpoint: the file ended under its header (cut short or rewritten "
                 "while it opened)", path);
        l2c_close(f);
        return -1;
    }
    fio_guard_enter(&guard);
    int rc = parse(f, err, errlen);
    fio_guard_leave(&guard);
    if (rc) {
        fio_err_path(err, errlen, path);
        l2c_close(f);
        return -1;
    }
    return 0;
}

void l2c_close(l2c_file *f)
{
    fio_unmap(f->map, f->len);
    free(f->t);
    memset(f, 0, sizeof *f);
}

int l2c_arch(const l2c_file *f, arch *a, char *err, size_t errlen)
{
    const l2c_header *H = &f->h;
    if (arch_init(a, H->n_layers)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = H->vocab_size;
    a->hidden_size = H->dim;
    a->head_dim = H->dim / H->n_heads;
    a->max_position_embeddings = H->seq_len;
    a->rope_theta = 10000.0;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = H->shared_classifier;
    for (int l = 0; l < H->n_layers; l++) {
        a->layers[l].source_layer = l;
        a->layers[l].n_heads = H->n_heads;
        a->layers[l].n_kv_heads = H->n_kv_heads;
        a->layers[l].ffn_dim = H->hidden_dim;
    }
    if (arch_validate(a, err, errlen)) {
        arch_free(a);
        return -1;
    }
    return 0;
}

int l2c_unpermute_rope_rows(float *w, int64_t rows, int64_t cols, int n_heads)
{
    if (n_heads <= 0 || rows % (2 * n_heads))
        return -1;
    int64_t D = rows / n_heads, half = D / 2;
    float *tmp = malloc((size_t)(D * cols) * sizeof *tmp);
    if (!tmp)
        return -1;
    for (int h = 0; h < n_heads; h++) {
        float *head = w + (int64_t)h * D * cols;
        for (int64_t i = 0; i < half; i++)
            for (int p = 0; p < 2; p++)
                memcpy(tmp + (p * half + i) * cols, head + (2 * i + p) * cols, (size_t)cols * sizeof *tmp);
        memcpy(head, tmp, (size_t)(D * cols) * sizeof *tmp);
    }
    free(tmp);
    return 0;
}

int l2c_read_f32(const l2c_file *f, int i, float *out, int64_t n, char *err, size_t errlen)
{
    if (i < 0 || i >= f->n) {
        snprintf(err, errlen, "tensor index %d out of range", i);
        return -1;
    }
    const l2c_tensor *t = &f->t[i];
    int64_t numel = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
    if (n < numel) {
        snprintf(err, errlen, "%s: output buffer too small", t->name);
        return -1;
    }
    fio_guard g;
    if (sigsetjmp(g.jb, 1)) {
        snprintf(err, errlen, "%s: the file ended under it (truncated or rewritten while it was read)", t->name);
        return -1;
    }
    fio_guard_enter(&g);
    for (int64_t k0 = 0; k0 < numel; k0 += (int64_t)FIO_RELEASE_STEP / 4) {   /* pages given back as copied */
        int64_t k1 = k0 + (int64_t)FIO_RELEASE_STEP / 4 < numel ? k0 + (int64_t)FIO_RELEASE_STEP / 4 : numel;
        memcpy(out + k0, f->base + t->offset + 4 * k0, (size_t)(k1 - k0) * 4);
        fio_map_release(f->map, f->len, f->base + t->offset + 4 * k0, (size_t)(k1 - k0) * 4);
    }
    fio_guard_leave(&g);
    if (t->permute_heads && l2c_unpermute_rope_rows(out, t->shape[0], t->shape[1], t->permute_heads)) {
        snprintf(err, errlen, "%s: cannot undo the RoPE row order", t->name);
        return -1;
    }
    return 0;
}
