/* storage/export.c — what every export writer shares (see export_internal.h): dtype
 * names, the model's tensors read one at a time (eng_model_get_tensor: any backend), the
 * parent model's format and tokenizer, and the one JSON style of export files. The
 * writers are export_hf.c and export_gguf.c.
 */
#include "storage/export_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/fileio.h"
#include "storage/hfconfig.h"

int exp_dtype_parse(const char *s)
{
    if (!s)
        return -1;
    if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16"))
        return EXP_BF16;
    if (!strcmp(s, "fp16") || !strcmp(s, "f16") || !strcmp(s, "float16"))
        return EXP_FP16;
    if (!strcmp(s, "fp32") || !strcmp(s, "f32") || !strcmp(s, "float32"))
        return EXP_FP32;
    if (!strcmp(s, "q8_0"))
        return EXP_Q8_0;
    return -1;
}

const char *exp_dtype_name(exp_dtype d)
{
    switch (d) {
    case EXP_BF16: return "bf16";
    case EXP_FP16: return "fp16";
    case EXP_FP32: return "fp32";
    case EXP_Q8_0: return "q8_0";
    }
    return "?";
}

exp_result *exp_result_clear(exp_result *res, exp_result *scratch)
{
    if (!res)
        res = scratch;
    memset(res, 0, sizeof *res);
    return res;
}

int exp_write_json(const char *path, const json_t *j, char *err, size_t errlen)
{
    return fio_write_json(path, j, JSON_INDENT(2) | JSON_REAL_PRECISION(EXPORT_REAL_DIGITS), err, errlen);
}

int exp_list_tensors(const eng_model *m, exp_tensor **out, int *n, char *err, size_t errlen)
{
    int cnt = eng_model_tensor_count(m);
    if (cnt <= 0) {
        snprintf(err, errlen, "export: the model has no tensors");
        return -1;
    }
    exp_tensor *t = calloc((size_t)cnt, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "export: out of memory");
        return -1;
    }
    for (int i = 0; i < cnt; i++) {
        float *dev;
        if (eng_model_tensor(m, i, &t[i].name, t[i].shape, &t[i].ndim, &dev) < 0 || t[i].ndim < 1 ||
            t[i].ndim > 2) {
            snprintf(err, errlen, "export: cannot enumerate tensor %d", i);
            free(t);
            return -1;
        }
        t[i].numel = t[i].shape[0] * (t[i].ndim == 2 ? t[i].shape[1] : 1);
    }
    *out = t;
    *n = cnt;
    return 0;
}

float *exp_fetch_tensor(const eng_model *m, const exp_tensor *t, char *err, size_t errlen)
{
    float *buf = malloc((size_t)t->numel * sizeof *buf);
    if (!buf) {
        snprintf(err, errlen, "export: out of memory for tensor %s", t->name);
        return NULL;
    }
    if (eng_model_get_tensor(m, t->name, buf, t->numel) != t->numel) {
        snprintf(err, errlen, "export: cannot read tensor %s", t->name);
        free(buf);
        return NULL;
    }
    return buf;
}

mio_format exp_parent_format(const char *pp)
{
    mio_format f;
    char e[512];
    return pp && mio_probe(pp, &f, e, sizeof e) == 0 ? f : (mio_format)0;
}

tok_tokenizer *exp_parent_tokenizer(const char *parent, const char *tok_path, char *err, size_t errlen)
{
    mio_model mm;
    if (mio_open(&mm, parent, tok_path, err, errlen) < 0)
        return NULL;
    tok_tokenizer *t = mio_tokenizer(&mm, err, errlen);
    mio_close(&mm);
    return t;
}
