/* storage/export_hf.c — the HF directory writer (see export.h): config.json (class by
 * export_decilm.c), generation_config.json, safetensors shards with their index, the
 * parent's tokenizer files (copied from an HF parent, else made by export_tok.c),
 * MODEL_CARD.md and SHA256SUMS. The directory is assembled under a name of its own beside
 * it (fio_temp_name) and renamed when complete; shards go through storage/safetensors.c
 * with one shard's tensors in host memory at a time.
 */
#include "storage/export_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/fileio.h"
#include "storage/modelcard.h"
#include "storage/safetensors.h"

#define DEFAULT_SHARD_BYTES ((int64_t)5 << 30)

static const char *const HF_TOKENIZER_FILES[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "tokenizer.model", "added_tokens.json", "chat_template.jinja",
};

/* Which tensors go in which shard, in enumeration order: a shard closes when the next
 * tensor would take it past the limit. */
typedef struct {
    exp_tensor *t;      /* every tensor (owned) */
    int n;
    int *shard_of;      /* [n] shard index of each tensor (owned) */
    int n_shards;
    int64_t total_bytes;
} shard_plan;

static void shard_plan_free(shard_plan *p)
{
    free(p->t);
    free(p->shard_of);
}

/* Plan the shards of m stored in elem_bytes per value, at most limit_bytes each (a
 * larger tensor gets a shard of its own). 0, or -1 with err (nothing held). */
static int shard_plan_make(const eng_model *m, int64_t elem_bytes, int64_t limit_bytes, shard_plan *p, char *err,
                           size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (exp_list_tensors(m, &p->t, &p->n, err, errlen) < 0)
        return -1;
    if (!(p->shard_of = calloc((size_t)p->n, sizeof *p->shard_of))) {
        shard_plan_free(p);
        snprintf(err, errlen, "export: out of memory");
        return -1;
    }
    int ns = 0;
    int64_t cur = 0;
    for (int i = 0; i < p->n; i++) {
        int64_t b = p->t[i].numel * elem_bytes;
        if (cur > 0 && cur + b > limit_bytes) {
            ns++;
            cur = 0;
        }
        p->shard_of[i] = ns;
        cur += b;
        p->total_bytes += b;
    }
    p->n_shards = ns + 1;
    return 0;
}

/* Write shard s of the plan as dir/fname (its tensors read into host memory, ws holding
 * room for all of them) and record each tensor's file in wmap. 0, or -1 with err. */
static int write_shard(const eng_model *m, const shard_plan *p, int s, const char *dir, const char *fname,
                       st_dtype sd, json_t *meta, json_t *wmap, st_write_tensor *ws, const exp_opts *o, char *err,
                       size_t errlen)
{
    char path[4096];
    if (fio_path_join(path, sizeof path, dir, fname) < 0) {
        snprintf(err, errlen, "export: path too long");
        return -1;
    }
    int k = 0, failed = 0;
    for (int i = 0; i < p->n && !failed; i++) {
        if (p->shard_of[i] != s)
            continue;
        if (o->cancelled && o->cancelled(o->cancel_arg)) {
            snprintf(err, errlen, "export cancelled");
            failed = 1;
            break;
        }
        float *d = exp_fetch_tensor(m, &p->t[i], err, errlen);
        if (!d) {
            failed = 1;
            break;
        }
        ws[k].name = p->t[i].name;
        ws[k].data = d;
        ws[k].ndim = p->t[i].ndim;
        ws[k].shape[0] = p->t[i].shape[0];
        ws[k].shape[1] = p->t[i].shape[1];
        if (fio_has_suffix(p->t[i].name, ".conv1d.weight")) {   /* Mamba-2's depthwise conv: [cd, 1, K] */
            ws[k].ndim = 3;
            ws[k].shape[1] = 1;
            ws[k].shape[2] = p->t[i].shape[1];
        }
        k++;
        if (json_object_set_new(wmap, p->t[i].name, json_string(fname)) < 0)
            failed = 1;
    }
    if (!failed && st_write(path, ws, k, sd, meta, err, errlen) < 0)
        failed = 1;
    for (int i = 0; i < k; i++)
        free((void *)ws[i].data);
    return failed ? -1 : 0;
}

/* model.safetensors, or model-NNNNN-of-NNNNN.safetensors with
 * model.safetensors.index.json, in o->dtype. *n_shards gets the count. 0, or -1 with err. */
static int write_shards(const eng_model *m, const char *dir, const exp_opts *o, int *n_shards,
                        char *err, size_t errlen)
{
    st_dtype sd = o->dtype == EXP_FP32 ? ST_F32 : o->dtype == EXP_FP16 ? ST_F16 : ST_BF16;
    int64_t limit = o->shard_bytes > 0 ? o->shard_bytes : DEFAULT_SHARD_BYTES;
    shard_plan p;
    if (shard_plan_make(m, (int64_t)st_dtype_size(sd), limit, &p, err, errlen) < 0)
        return -1;
    int rc = -1, ns = p.n_shards;
    json_t *meta = json_pack("{s:s}", "format", "pt");
    json_t *wmap = json_object();
    st_write_tensor *ws = calloc((size_t)p.n, sizeof *ws);
    if (!meta || !wmap || !ws) {
        snprintf(err, errlen, "export: out of memory");
        goto out;
    }
    for (int s = 0; s < ns; s++) {
        char fname[128];
        if (ns == 1)
            snprintf(fname, sizeof fname, "model.safetensors");
        else
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, ns);
        if (write_shard(m, &p, s, dir, fname, sd, meta, wmap, ws, o, err, errlen) < 0)
            goto out;
    }
    if (ns > 1) {
        char path[4096];
        json_t *idx = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)p.total_bytes,
                                "weight_map", wmap);
        if (!idx || fio_path_join(path, sizeof path, dir, "model.safetensors.index.json") < 0 ||
            exp_write_json(path, idx, err, errlen) < 0) {
            json_decref(idx);
            if (!err[0])
                snprintf(err, errlen, "export: cannot write the shard index");
            goto out;
        }
        json_decref(idx);
    }
    *n_shards = ns;
    rc = 0;
out:
    json_decref(meta);
    json_decref(wmap);
    free(ws);
    shard_plan_free(&p);
    return rc;
}

/* Copy src to dst (created, fsynced) inside the directory being assembled. */
static int copy_file(const char *src, const char *dst, char *err, size_t errlen)
{
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        snprintf(err, errlen, "export: create %s: %s", dst, strerror(errno));
        return -1;
    }
    int rc = fio_copy_into(src, out) < 0 || fsync(out) < 0 ? -1 : 0;
    if (close(out) < 0)
        rc = -1;
    if (rc < 0)
        snprintf(err, errlen, "export: copy %s -> %s: %s", src, dst, strerror(errno));
    return rc;
}

/* The parent's config.json or generation_config.json; NULL when absent or unreadable. */
static json_t *load_json_file(const char *path)
{
    char why[512];
    return fio_load_json(path, JSON_REJECT_DUPLICATES, why, sizeof why);
}

/* The class that states m's arch: as o->hf_class asks ("llama": uniform only; "deci":
 * DeciLM even for a uniform arch), else by exp_hf_class. 0, or -1 with err. */
static int hf_choose_class(const arch *a, const char *asked, const json_t *pconf, char *cls, size_t cap,
                           char *err, size_t errlen)
{
    if (asked && strcmp(a->family, "llama")) {   /* "hf" (asked "llama") is the family's own class here */
        if (!strcmp(asked, "deci")) {
            snprintf(err, errlen, "HF export: a %s model is written in its own family's class (\"hf\"); DeciLM "
                     "does not hold experts", a->family);
            return -1;
        }
        return exp_hf_class(a, pconf, cls, cap, err, errlen);
    }
    if (asked && !strcmp(asked, "llama") && !arch_is_uniform(a)) {
        snprintf(err, errlen, "HF export: LlamaForCausalLM holds uniform layers only and this arch differs "
                 "per layer or removes parts; export it as \"deci\" or \"gguf\"");
        return -1;
    }
    if (asked && !strcmp(asked, "deci")) {
        if (exp_decilm_check(a, err, errlen) < 0)
            return -1;
        snprintf(cls, cap, "DeciLMForCausalLM");
        return 0;
    }
    return exp_hf_class(a, pconf, cls, cap, err, errlen);
}

/* Start the export of dir: refuse a non-empty dir (an empty one is replaced by the final
 * rename), and create the assembly folder beside it, a name of its own (fio_temp_name:
 * two exports of one dir never share one; its name into partial). 0, or -1 with err. */
static int hf_begin_dir(const char *dir, char *partial, size_t cap, char *err, size_t errlen)
{
    if (fio_is_dir(dir)) {
        char **names;
        size_t n_names = 0;
        if (fio_list_dir(dir, &names, &n_names) == 0)
            fio_names_free(names, n_names);
        if (n_names > 0) {
            snprintf(err, errlen, "HF export: %s exists and is not empty", dir);
            return -1;
        }
    }
    char base[4096];
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')   /* "out/": beside out, not inside it */
        n--;
    if (n < sizeof base)
        snprintf(base, sizeof base, "%.*s", (int)n, dir);
    if (n >= sizeof base || fio_temp_name(partial, cap, base)) {
        snprintf(err, errlen, "HF export: path too long");
        return -1;
    }
    if (mkdir(partial, 0755) < 0) {
        snprintf(err, errlen, "HF export: mkdir %s: %s", partial, strerror(errno));
        return -1;
    }
    return 0;
}

/* An HF parent's tokenizer files copied into dir as they are, and its
 * generation_config.json read into *gen (NEW, NULL when it has none). 0, or -1 with err. */
static int hf_copy_parent_files(const char *parent, const char *dir, exp_result *res, json_t **gen, char *err,
                                size_t errlen)
{
    char src[4096], dst[4096];
    for (size_t i = 0; i < sizeof HF_TOKENIZER_FILES / sizeof *HF_TOKENIZER_FILES; i++) {
        if (fio_path_join(src, sizeof src, parent, HF_TOKENIZER_FILES[i]) < 0 || !fio_is_file(src))
            continue;
        if (fio_path_join(dst, sizeof dst, dir, HF_TOKENIZER_FILES[i]) < 0 || copy_file(src, dst, err, errlen) < 0)
            return -1;
        res->tokenizer = 1;
    }
    if (fio_path_join(src, sizeof src, parent, "generation_config.json") == 0 && fio_is_file(src))
        *gen = load_json_file(src);
    if (!res->tokenizer)
        snprintf(res->note, sizeof res->note, "the parent directory holds no tokenizer files");
    return 0;
}

/* config.json, and generation_config.json: the parent's (gen, borrowed) or one naming
 * conf's BOS/EOS ids. 0, or -1 with err. */
static int hf_write_configs(const char *dir, const json_t *conf, const json_t *gen, char *err, size_t errlen)
{
    char path[4096];
    if (fio_path_join(path, sizeof path, dir, "config.json") < 0 || exp_write_json(path, conf, err, errlen) < 0)
        return -1;
    json_t *own = NULL;
    if (!gen) {
        gen = own = json_pack("{s:b}", "_from_model_config", 1);
        json_t *b = json_object_get(conf, "bos_token_id"), *e = json_object_get(conf, "eos_token_id");
        if (own && b)
            json_object_set(own, "bos_token_id", b);
        if (own && e)
            json_object_set(own, "eos_token_id", e);
    }
    int rc = !gen || fio_path_join(path, sizeof path, dir, "generation_config.json") < 0 ||
             exp_write_json(path, gen, err, errlen) < 0 ? -1 : 0;
    json_decref(own);
    if (rc < 0 && !err[0])
        snprintf(err, errlen, "HF export: out of memory");
    return rc;
}

/* MODEL_CARD.md in dir for the export described by o, cls and res. 0, or -1 with err. */
static int hf_write_card(const eng_model *m, const exp_opts *o, const char *cls, int parent_hf,
                         const exp_result *res, const char *dir, char *err, size_t errlen)
{
    char tokline[600], path[4096];
    if (res->tokenizer)
        snprintf(tokline, sizeof tokline, "%s", parent_hf ? "included (the parent directory's tokenizer files)"
                 : "included (tokenizer.json, tokenizer_config.json, special_tokens_map.json)");
    else
        snprintf(tokline, sizeof tokline, "not included: %s", res->note);
    mc_info info = {.parent = o->parent_path ? o->parent_path : "unknown", .model_class = cls,
                    .dtype = exp_dtype_name(o->dtype), .formats = "HF directory (config.json + safetensors)",
                    .tokenizer = tokline};
    if (fio_path_join(path, sizeof path, dir, "MODEL_CARD.md") < 0)
        return -1;
    return mc_write(path, &m->a, o->report, &info, err, errlen);
}

int exp_hf_write(const eng_model *m, const char *dir, const exp_opts *o, exp_result *res,
                 char *err, size_t errlen)
{
    exp_result scratch;
    res = exp_result_clear(res, &scratch);
    err[0] = '\0';
    if (o->dtype == EXP_Q8_0) {
        snprintf(err, errlen, "HF export: dtype q8_0 is GGUF only (HF: bf16, fp16, fp32)");
        return -1;
    }
    const char *pp = o->parent_path;
    mio_format pf = exp_parent_format(pp);
    int parent_hf = pf == MIO_HF_DIR;
    json_t *pconf = NULL, *conf = NULL, *gen = NULL;
    char ppath[4096], partial[4096], cls[64];
    int rc = -1, made = 0;
    if (parent_hf && fio_path_join(ppath, sizeof ppath, pp, "config.json") == 0 && fio_is_file(ppath))
        pconf = load_json_file(ppath);
    if (hf_choose_class(&m->a, o->hf_class, pconf, cls, sizeof cls, err, errlen) < 0 ||
        !(conf = exp_hf_config(&m->a, cls, o->dtype, pconf, err, errlen)) ||
        hf_begin_dir(dir, partial, sizeof partial, err, errlen) < 0)
        goto out;
    made = 1;
    snprintf(res->model_class, sizeof res->model_class, "%s", cls);
    /* Tokenizer files; an HF parent's token ids came into conf with its config.json. */
    int tok = 0;
    if (parent_hf)
        tok = hf_copy_parent_files(pp, partial, res, &gen, err, errlen);
    else if (pp)
        tok = exp_hf_tokenizer_files(pp, o->parent_tokenizer, pf == MIO_GGUF, m->a.max_position_embeddings,
                                     partial, conf, res, err, errlen);
    else
        snprintf(res->note, sizeof res->note, "no parent given: no tokenizer files");
    if (tok < 0 || hf_write_configs(partial, conf, gen, err, errlen) < 0 ||
        write_shards(m, partial, o, &res->n_shards, err, errlen) < 0 ||
        hf_write_card(m, o, cls, parent_hf, res, partial, err, errlen) < 0 || exp_write_sums(partial, err, errlen) < 0)
        goto out;
    if (rename(partial, dir) < 0) {
        snprintf(err, errlen, "HF export: rename %s -> %s: %s", partial, dir, strerror(errno));
        goto out;
    }
    (void)fio_fsync_parent(dir);   /* the rename durable (best effort, as fio_write_atomic) */
    made = 0;
    rc = 0;
out:
    if (made)
        (void)fio_remove_tree(partial);
    json_decref(pconf);
    json_decref(conf);
    json_decref(gen);
    return rc;
}
