/* server/cli_export.c — `autocompress export`: write a model as an HF directory (and
 * optionally its .tar; LlamaForCausalLM or DeciLMForCausalLM) or a GGUF file, optionally sliced to an arch first; or verify an
 * exported directory's SHA256SUMS. The same storage/export.c code runs as the job's
 * export stage (jobs/stage_export.c). Prints a JSON manifest (path, size, sha-256).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compress/prune.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "server/cli.h"
#include "server/cli_args.h"
#include "storage/archjson.h"
#include "storage/artstore.h"
#include "storage/export.h"
#include "storage/fileio.h"
#include "storage/tar.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: autocompress export MODEL --out PATH [options]\n"
            "       autocompress export --verify DIR\n\n"
            "MODEL is a GGUF file, a llama2.c .bin or an HF directory.\n"
            "  --format F           hf (LlamaForCausalLM: uniform archs), deci (DeciLMForCausalLM\n"
            "                       block_configs) or gguf (llama.cpp); as the job spec's \"export\"\n"
            "  --dtype D            bf16 (default), fp16, fp32; GGUF also q8_0\n"
            "  --arch ARCH.json     slice the model to this arch first (prefix pruning)\n"
            "  --parent PATH        where tokenizer files come from (default: MODEL)\n"
            "  --tokenizer PATH     the parent's tokenizer file when it is not beside it\n"
            "  --report R.json      job report for MODEL_CARD.md\n"
            "  --tar FILE           also package the HF directory as FILE (ustar)\n"
            "  --shard-bytes N      largest safetensors shard (default 5 GiB)\n"
            "  --name NAME          model name in GGUF metadata\n");
}

static json_t *file_entry(const char *path, char *err, size_t errlen)
{
    char hex[65];
    int64_t size;
    if (art_sha256_file(path, hex, &size, err, errlen) < 0)
        return NULL;
    return json_pack("{s:s, s:I, s:s}", "path", path, "size", (json_int_t)size, "sha256", hex);
}

typedef struct {
    const char *model, *out, *format, *dtype_s, *arch_path, *parent, *report_path, *tar_path, *name, *verify,
        *tokenizer;
    int64_t shard;
    int gguf, dtype;   /* derived from format, dtype_s */
} export_args;

/* 1 when path is folder dir or inside it (both as fio_resolve makes them), else 0. */
static int within(const char *path, const char *dir)
{
    char rp[PATH_MAX], rd[PATH_MAX];
    if (fio_resolve(path, rp, sizeof rp) || fio_resolve(dir, rd, sizeof rd))
        return 0;
    size_t n = strlen(rd);
    return !strncmp(rp, rd, n) && (rp[n] == 0 || rp[n] == '/');
}

/* The outputs never replace the input, and the archive is not written into the folder it
 * packs (it would pack its own half-written self). 0, or -1 after the message. */
static int check_paths(const export_args *a)
{
    char model[PATH_MAX], out[PATH_MAX];
    if (realpath(a->model, model) && realpath(a->out, out) && !strcmp(model, out)) {
        fprintf(stderr, "export: --out %s is the model being exported: choose another path\n", a->out);
        return -1;
    }
    if (a->tar_path && within(a->tar_path, a->out)) {
        fprintf(stderr, "export: --tar %s is inside the exported folder %s: put the archive elsewhere\n", a->tar_path,
                a->out);
        return -1;
    }
    return 0;
}

/* CLI_END with *a filled and checked, or the exit status. */
static int export_parse(int argc, char **argv, export_args *a)
{
    static const struct option opts[] = {
        {"out", required_argument, NULL, 'o'},       {"format", required_argument, NULL, 'f'},
        {"dtype", required_argument, NULL, 'd'},     {"arch", required_argument, NULL, 'a'},
        {"parent", required_argument, NULL, 'p'},    {"tokenizer", required_argument, NULL, 'k'},
        {"report", required_argument, NULL, 'r'},    {"tar", required_argument, NULL, 't'},
        {"name", required_argument, NULL, 'n'},      {"verify", required_argument, NULL, 'V'},
        {"shard-bytes", required_argument, NULL, 's'}, {"help", no_argument, NULL, 'h'},
        {0}};
    *a = (export_args){.format = "hf", .dtype_s = "bf16"};
    cli_parser p;
    int c;
    cli_init(&p, "export", argc, argv, opts, NULL, usage);
    while ((c = cli_next(&p)) > 0) {
        switch (c) {
        case 'o': a->out = p.arg; break;
        case 'f': a->format = p.arg; break;
        case 'd': a->dtype_s = p.arg; break;
        case 'a': a->arch_path = p.arg; break;
        case 'p': a->parent = p.arg; break;
        case 'k': a->tokenizer = p.arg; break;
        case 'r': a->report_path = p.arg; break;
        case 't': a->tar_path = p.arg; break;
        case 'n': a->name = p.arg; break;
        case 'V': a->verify = p.arg; break;
        case 's': cli_i64(&p, 1, INT64_MAX, &a->shard); break;
        }
    }
    if (c != CLI_END)
        return cli_status(c);
    a->model = cli_operand(&p);
    if (cli_no_more_operands(&p))
        return 2;
    if (a->verify)
        return CLI_END;
    if (!a->model || !a->out) {
        usage(stderr);
        return 2;
    }
    a->gguf = !strcmp(a->format, "gguf");
    if (!a->gguf && strcmp(a->format, "hf") && strcmp(a->format, "deci")) {
        fprintf(stderr, "export: --format must be hf, deci or gguf\n");
        return 2;
    }
    a->dtype = exp_dtype_parse(a->dtype_s);
    if (a->dtype < 0 || (!a->gguf && a->dtype == EXP_Q8_0)) {
        fprintf(stderr, "export: dtype '%s' is not available for %s\n", a->dtype_s, a->format);
        return 2;
    }
    return check_paths(a) ? 2 : CLI_END;
}

/* *pruned: m sliced to the arch in path (prefix pruning). 0, or -1 after the message. */
static int slice_to_arch(const eng_model *m, const char *path, eng_model *pruned)
{
    char err[1024];
    size_t len;
    char *text = fio_read_input(path, (size_t)16 << 20, &len, err, sizeof err);
    arch target;
    if (!text) {
        fprintf(stderr, "export: --arch: %s\n", err);
        return -1;
    }
    int r = arch_from_json_text(text, len, &target, err, sizeof err);
    free(text);
    if (r < 0) {
        fprintf(stderr, "export: %s: %s\n", path, err);
        return -1;
    }
    r = prune_to_arch(m, &target, pruned, err, sizeof err);
    arch_free(&target);
    if (r < 0)
        fprintf(stderr, "export: %s\n", err);
    return r < 0 ? -1 : 0;
}

/* Package the HF directory out as tar_path (ustar, named by out's last component) and
 * add it to files. 0, or -1 with err. */
static int write_tar(const char *out, const char *tar_path, json_t *files, char *err, size_t errlen)
{
    const char *base = strrchr(out, '/');
    base = base && base[1] ? base + 1 : out;
    tar_writer *t = tar_open(tar_path, (int64_t)time(NULL), err, errlen);
    if (!t || tar_add_tree(t, base, out, err, errlen) < 0) {
        tar_abort(t);
        return -1;
    }
    if (tar_close(t, err, errlen) < 0)
        return -1;
    json_t *e = file_entry(tar_path, err, errlen);
    if (!e)
        return -1;
    json_array_append_new(files, e);
    return 0;
}

/* Write src in a's format; the manifest (NEW) or NULL with err. */
static json_t *export_write(const export_args *a, const eng_model *src, json_t *report, char *err, size_t errlen)
{
    exp_opts o = {.dtype = (exp_dtype)a->dtype, .shard_bytes = a->shard, .parent_path = a->parent ? a->parent : a->model,
                  .parent_tokenizer = a->tokenizer, .report = report, .name = a->name,
                  .hf_class = !strcmp(a->format, "deci") ? "deci" : "llama"};
    exp_result res;
    json_t *manifest = json_object(), *files = json_array();
    json_object_set_new(manifest, "files", files);
    if (a->gguf) {
        json_t *e = exp_gguf_write(src, a->out, &o, &res, err, errlen) < 0 ? NULL : file_entry(a->out, err, errlen);
        if (!e)
            goto fail;
        json_array_append_new(files, e);
    } else {
        if (exp_hf_write(src, a->out, &o, &res, err, errlen) < 0)
            goto fail;
        json_object_set_new(manifest, "directory", json_string(a->out));
        json_object_set_new(manifest, "shards", json_integer(res.n_shards));
        if (a->tar_path && write_tar(a->out, a->tar_path, files, err, errlen) < 0)
            goto fail;
    }
    json_object_set_new(manifest, "format", json_string(a->format));
    json_object_set_new(manifest, "class", json_string(res.model_class));
    json_object_set_new(manifest, "dtype", json_string(exp_dtype_name((exp_dtype)a->dtype)));
    json_object_set_new(manifest, "tokenizer", json_boolean(res.tokenizer));
    if (res.note[0])
        json_object_set_new(manifest, "note", json_string(res.note));
    return manifest;
fail:
    json_decref(manifest);
    return NULL;
}

int cli_export(int argc, char **argv)
{
    export_args a;
    int pr = export_parse(argc, argv, &a);
    if (pr != CLI_END)
        return pr;
    char err[1024] = "";
    if (a.verify) {
        if (exp_verify_dir(a.verify, err, sizeof err) < 0) {
            fprintf(stderr, "export: %s\n", err);
            return 1;
        }
        json_t *ok = json_pack("{s:b,s:s}", "verified", 1, "path", a.verify);
        char *text = ok ? json_dumps(ok, JSON_SORT_KEYS) : NULL;   /* the path escaped as JSON */
        json_decref(ok);
        if (!text) {
            fprintf(stderr, "export: out of memory\n");
            return 1;
        }
        printf("%s\n", text);
        free(text);
        return 0;
    }
    json_t *report = NULL;
    if (a.report_path) {
        json_error_t je;
        if (!(report = json_load_file(a.report_path, JSON_REJECT_DUPLICATES, &je))) {
            fprintf(stderr, "export: %s: %s\n", a.report_path, je.text);
            return 1;
        }
    }
    int rc = 1;
    eng_backend *be = eng_backend_cpu_new(0);
    eng_model m, pruned;
    int have_m = 0, have_p = 0;
    json_t *manifest = NULL;
    if (!be) {
        fprintf(stderr, "export: out of memory\n");
        goto out;
    }
    if (exp_load_model(a.model, be, &m, err, sizeof err) < 0) {
        fprintf(stderr, "export: %s\n", err);
        goto out;
    }
    have_m = 1;
    if (a.arch_path) {
        if (slice_to_arch(&m, a.arch_path, &pruned))
            goto out;
        have_p = 1;
    }
    if (!(manifest = export_write(&a, have_p ? &pruned : &m, report, err, sizeof err))) {
        fprintf(stderr, "export: %s\n", err);
        goto out;
    }
    char *s = json_dumps(manifest, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (s) {
        printf("%s\n", s);
        free(s);
    }
    rc = 0;
out:
    json_decref(manifest);
    json_decref(report);
    if (have_p)
        eng_model_free(&pruned);
    if (have_m)
        eng_model_free(&m);
    eng_backend_free(be);
    return rc;
}
