/* server/cli_export.c — `autocompress export`: write a model as an HF directory (and
 * optionally its .tar; LlamaForCausalLM or DeciLMForCausalLM) or a GGUF file, optionally sliced to an arch first; or verify an
 * exported directory's SHA256SUMS. The same storage/export.c code runs as the job's
 * export stage (jobs/stage_export.c). Prints a JSON manifest (path, size, sha-256).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compress/prune.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "server/cli.h"
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

int cli_export(int argc, char **argv)
{
    const char *model = NULL, *out = NULL, *format = "hf", *dtype_s = "bf16", *arch_path = NULL;
    const char *parent = NULL, *report_path = NULL, *tar_path = NULL, *name = NULL, *verify = NULL;
    const char *tokenizer = NULL;
    int64_t shard = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
#define OPT(flag, var) if (!strcmp(a, flag)) { if (!v) { fprintf(stderr, "export: %s needs a value\n", flag); return 2; } var = v; i++; continue; }
        OPT("--out", out)
        OPT("--format", format)
        OPT("--dtype", dtype_s)
        OPT("--arch", arch_path)
        OPT("--parent", parent)
        OPT("--tokenizer", tokenizer)
        OPT("--report", report_path)
        OPT("--tar", tar_path)
        OPT("--name", name)
        OPT("--verify", verify)
#undef OPT
        if (!strcmp(a, "--shard-bytes") && v) {
            char *end;
            shard = strtoll(v, &end, 10);
            if (*end || shard <= 0) {
                fprintf(stderr, "export: --shard-bytes must be a positive integer\n");
                return 2;
            }
            i++;
            continue;
        }
        if (a[0] == '-' || model) {
            fprintf(stderr, "export: %s '%s'\n", a[0] == '-' ? "unknown option" : "unexpected argument", a);
            usage(stderr);
            return 2;
        }
        model = a;
    }
    char err[1024] = "";
    if (verify) {
        if (exp_verify_dir(verify, err, sizeof err) < 0) {
            fprintf(stderr, "export: %s\n", err);
            return 1;
        }
        printf("{\"verified\": true, \"path\": \"%s\"}\n", verify);
        return 0;
    }
    if (!model || !out) {
        usage(stderr);
        return 2;
    }
    int gguf = !strcmp(format, "gguf");
    if (!gguf && strcmp(format, "hf") && strcmp(format, "deci")) {
        fprintf(stderr, "export: --format must be hf, deci or gguf\n");
        return 2;
    }
    int dt = exp_dtype_parse(dtype_s);
    if (dt < 0 || (!gguf && dt == EXP_Q8_0)) {
        fprintf(stderr, "export: dtype '%s' is not available for %s\n", dtype_s, format);
        return 2;
    }
    json_t *report = NULL;
    if (report_path) {
        json_error_t je;
        if (!(report = json_load_file(report_path, JSON_REJECT_DUPLICATES, &je))) {
            fprintf(stderr, "export: %s: %s\n", report_path, je.text);
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
    if (exp_load_model(model, be, &m, err, sizeof err) < 0) {
        fprintf(stderr, "export: %s\n", err);
        goto out;
    }
    have_m = 1;
    eng_model *src = &m;
    if (arch_path) {
        size_t len;
        char *text = fio_read_all(arch_path, 0, &len, err, sizeof err);
        arch target;
        if (!text) {
            fprintf(stderr, "export: cannot read %s\n", arch_path);
            goto out;
        }
        int r = arch_from_json_text(text, len, &target, err, sizeof err);
        free(text);
        if (r < 0) {
            fprintf(stderr, "export: %s: %s\n", arch_path, err);
            goto out;
        }
        r = prune_to_arch(&m, &target, &pruned, err, sizeof err);
        arch_free(&target);
        if (r < 0) {
            fprintf(stderr, "export: %s\n", err);
            goto out;
        }
        have_p = 1;
        src = &pruned;
    }
    exp_opts o = {.dtype = (exp_dtype)dt, .shard_bytes = shard, .parent_path = parent ? parent : model,
                  .parent_tokenizer = tokenizer,
                  .report = report, .name = name,
                  .hf_class = !strcmp(format, "deci") ? "deci" : "llama"};
    exp_result res;
    manifest = json_object();
    json_t *files = json_array();
    json_object_set_new(manifest, "files", files);
    if (gguf) {
        if (exp_gguf_write(src, out, &o, &res, err, sizeof err) < 0) {
            fprintf(stderr, "export: %s\n", err);
            goto out;
        }
        json_t *e = file_entry(out, err, sizeof err);
        if (!e) {
            fprintf(stderr, "export: %s\n", err);
            goto out;
        }
        json_array_append_new(files, e);
    } else {
        if (exp_hf_write(src, out, &o, &res, err, sizeof err) < 0) {
            fprintf(stderr, "export: %s\n", err);
            goto out;
        }
        json_object_set_new(manifest, "directory", json_string(out));
        json_object_set_new(manifest, "shards", json_integer(res.n_shards));
        if (tar_path) {
            const char *base = strrchr(out, '/');
            base = base && base[1] ? base + 1 : out;
            tar_writer *t = tar_open(tar_path, (int64_t)time(NULL), err, sizeof err);
            if (!t || tar_add_tree(t, base, out, err, sizeof err) < 0) {
                tar_abort(t);
                fprintf(stderr, "export: %s\n", err);
                goto out;
            }
            if (tar_close(t, err, sizeof err) < 0) {
                fprintf(stderr, "export: %s\n", err);
                goto out;
            }
            json_t *e = file_entry(tar_path, err, sizeof err);
            if (!e) {
                fprintf(stderr, "export: %s\n", err);
                goto out;
            }
            json_array_append_new(files, e);
        }
    }
    json_object_set_new(manifest, "format", json_string(format));
    json_object_set_new(manifest, "class", json_string(res.model_class));
    json_object_set_new(manifest, "dtype", json_string(exp_dtype_name((exp_dtype)dt)));
    json_object_set_new(manifest, "tokenizer", json_boolean(res.tokenizer));
    if (res.note[0])
        json_object_set_new(manifest, "note", json_string(res.note));
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
    if (be)
        eng_backend_free(be);
    return rc;
}
