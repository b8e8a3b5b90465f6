/* tests/tools/records.h — the record file the oracle tools write for their PyTorch
 * checks (read by read_records in tests/oracle/test_prune_grad.py): per record int32
 * name length, name, int32 ndim, int64 shape[ndim], float32 data. Also the arch JSON
 * beside it. Header-only: static functions. Not part of the product.
 */
#ifndef AC_TESTS_TOOLS_RECORDS_H
#define AC_TESTS_TOOLS_RECORDS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "engine/model.h"
#include "storage/archjson.h"

static inline int put(FILE *f, const char *name, const float *data, int ndim, const int64_t *shape)
{
    int32_t n = (int32_t)strlen(name), nd = ndim;
    int64_t cnt = 1;
    for (int i = 0; i < ndim; i++)
        cnt *= shape[i];
    if (fwrite(&n, 4, 1, f) != 1 || fwrite(name, 1, (size_t)n, f) != (size_t)n || fwrite(&nd, 4, 1, f) != 1 ||
        (ndim && fwrite(shape, 8, (size_t)ndim, f) != (size_t)ndim) ||
        (cnt && fwrite(data, 4, (size_t)cnt, f) != (size_t)cnt))
        return -1;
    return 0;
}

static inline int put_model(FILE *f, const eng_model *m, const char *prefix, int grads)
{
    char nm[200];
    for (int i = 0; i < eng_model_tensor_count(m); i++) {
        const char *name;
        int64_t shape[2];
        int ndim;
        float *data;
        if (eng_model_tensor(m, i, &name, shape, &ndim, &data))
            return -1;
        int64_t n = ndim == 2 ? shape[0] * shape[1] : shape[0];
        float *h = malloc((size_t)n * sizeof *h);
        if (!h)
            return -1;
        const float *src = grads ? m->grads + (data - m->params) : data;
        m->be->to_host(m->be, h, src, (size_t)n * sizeof *h);
        snprintf(nm, sizeof nm, "%s%s", prefix, name);
        int rc = put(f, nm, h, ndim, shape);
        free(h);
        if (rc)
            return -1;
    }
    return 0;
}

static inline int write_arch(const char *path, const arch *a)
{
    json_t *j = arch_to_json(a);
    int rc = j ? json_dump_file(j, path, JSON_SORT_KEYS | JSON_INDENT(1)) : -1;
    json_decref(j);
    return rc;
}

/* OUT.parent.json and OUT.student.json beside the records. 0, or -1. */
static inline int write_archs(const char *out, const arch *parent, const arch *student)
{
    char path[4096];
    snprintf(path, sizeof path, "%s.parent.json", out);
    if (write_arch(path, parent))
        return -1;
    snprintf(path, sizeof path, "%s.student.json", out);
    return write_arch(path, student);
}

/* A small Llama-family parent shape for the oracles: vocab V, hidden C, head_dim D, n
 * layers (their parts left for the caller), 64 positions, RoPE theta 1e4, norm eps 1e-5.
 * 0, or -1 when out of memory. */
static inline int oracle_arch(arch *a, int V, int C, int D, int n)
{
    if (arch_init(a, n))
        return -1;
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = V;
    a->hidden_size = C;
    a->head_dim = D;
    a->max_position_embeddings = 64;
    a->rope_theta = 10000.0;
    a->norm_eps = 1e-5;
    return 0;
}

#endif
