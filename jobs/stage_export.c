/* jobs/stage_export.c — the "export" stage: the job's final model (distill/student, else
 * prune/student) written in every format the spec's "export" names — "hf"
 * (LlamaForCausalLM when uniform, else DeciLM block_configs), "deci" (DeciLM always),
 * "gguf" (llama.cpp) — with the same storage/export.c code as `autocompress export`.
 * HF directories are published as .tar; each artifact's size, sha-256 and whether it
 * carries the parent's tokenizer go into export/manifest.json (also published), the events and the report. Weights: bf16,
 * except the GGUF of a llama.cpp target: the measure stage's model.gguf at the target's
 * weight type, byte for byte the file that was served and measured.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "jobs/stage.h"
#include "jobs/stages.h"
#include "storage/artstore.h"
#include "storage/ckpt.h"
#include "storage/export.h"
#include "storage/fileio.h"
#include "storage/tar.h"

/* A report-shaped object for the model card from what earlier stages wrote. NEW ref. */
static json_t *card_report(job_ctx *ctx)
{
    json_t *spec = job_ctx_spec(ctx);
    json_t *r = json_pack("{s:s}", "job_id", job_ctx_id(ctx));
    if (!r)
        return NULL;
    const char *keys[] = {"method", "target", NULL};
    for (int i = 0; keys[i]; i++) {
        json_t *v = json_object_get(spec, keys[i]);
        if (v)
            json_object_set(r, keys[i], v);
    }
    static const char *const files[][2] = {{"measure", "measure.json"}, {"evaluate", "eval.json"},
                                           {"search", "search.json"}};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        const char *p = job_ctx_output(ctx, files[i][0], files[i][1]);
        json_error_t je;
        json_t *j = p ? json_load_file(p, 0, &je) : NULL;
        if (json_is_object(j))
            json_object_update_missing(r, j);
        json_decref(j);
    }
    return r;
}

static json_t *publish(job_ctx *ctx, const char *name, const char *path, const char *type, const char *format,
                       const char *cls, char *err, size_t errlen)
{
    char hex[65];
    int64_t size;
    if (art_sha256_file(path, hex, &size, err, errlen) < 0 || job_publish(ctx, name, path, type, err, errlen) < 0)
        return NULL;
    json_t *e = json_pack("{s:s, s:s, s:s, s:I, s:s}", "name", name, "format", format, "class", cls,
                          "size", (json_int_t)size, "sha256", hex);
    if (e) {
        char msg[256];
        snprintf(msg, sizeof msg, "exported %s (%s, %lld bytes)", name, cls, (long long)size);
        job_event(ctx, "export.artifact", msg, json_deep_copy(e));
    }
    return e;
}

/* src copied to dst (replaced). 0, or -1 with err. */
static int copy_file(const char *src, const char *dst, char *err, size_t errlen)
{
    char tmp[4500];
    if (fio_temp_name(tmp, sizeof tmp, dst)) {
        snprintf(err, errlen, "export: %s: path too long", dst);
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "export: %s: %s", tmp, strerror(errno));
        return -1;
    }
    int rc = fio_copy_into(src, fd);
    if (rc == 0 && fsync(fd))
        rc = -1;
    if (close(fd))
        rc = -1;
    if (rc == 0 && rename(tmp, dst))
        rc = -1;
    if (rc == 0)
        (void)fio_fsync_parent(dst);   /* the rename durable (best effort, as fio_write_atomic) */
    if (rc) {
        snprintf(err, errlen, "export: cannot copy %s to %s: %s", src, dst, strerror(errno));
        (void)unlink(tmp);
    }
    return rc;
}

static int stage_export_run(job_ctx *ctx, char *err, size_t errlen)
{
    json_t *spec = job_ctx_spec(ctx);
    json_t *formats = json_object_get(spec, "export");
    if (!json_is_array(formats) || json_array_size(formats) == 0)
        return 0;
    const char *src = job_ctx_output(ctx, "distill", "student");
    char srcbuf[4096];
    if (!src)
        src = job_ctx_output(ctx, "prune", "student");
    if (!src) {
        snprintf(err, errlen, "export: no model to export: neither distill/student nor prune/student exists");
        return -1;
    }
    snprintf(srcbuf, sizeof srcbuf, "%s", src);   /* job_ctx_output's buffer is reused */
    const char *parent = json_string_value(json_object_get(json_object_get(spec, "model"), "path"));
    const char *parent_tok = json_string_value(json_object_get(json_object_get(spec, "model"), "tokenizer"));
    eng_backend *be = eng_backend_cpu_new(0);    /* export only reads weights: host memory */
    if (!be) {
        snprintf(err, errlen, "export: out of memory");
        return -1;
    }
    eng_model m;
    if (ckpt_load(srcbuf, be, &m, err, errlen) < 0) {
        eng_backend_free(be);
        return -1;
    }
    json_t *report = card_report(ctx), *arts = json_array();
    int rc = -1;
    size_t n = json_array_size(formats);
    const char *dir = job_ctx_stage_dir(ctx);
    job_progress(ctx, 0, (int64_t)n);
    for (size_t i = 0; i < n; i++) {
        if (job_cancelled(ctx)) {
            rc = 1;
            goto out;
        }
        const char *f = json_string_value(json_array_get(formats, i));
        if (!f)
            continue;
        exp_opts o = {.dtype = EXP_BF16, .parent_path = parent, .parent_tokenizer = parent_tok, .report = report,
                      .name = job_ctx_id(ctx), .cancelled = job_cancelled_hook, .cancel_arg = ctx};   /* seen per tensor */
        exp_result res;
        char path[4400], tarp[4400], name[64];
        json_t *e = NULL;
        const char *served = !strcmp(f, "gguf") ? job_ctx_output(ctx, "measure", "model.gguf") : NULL;
        if (served) {
            /* a llama.cpp target: the file the measure stage served, at the target's type */
            snprintf(path, sizeof path, "%s/model.gguf", dir);
            if (copy_file(served, path, err, errlen) < 0 ||
                exp_gguf_arch(&m.a, res.model_class, sizeof res.model_class, err, errlen) < 0)
                goto out;
            res.tokenizer = o.parent_path != NULL;
            res.note[0] = 0;
            e = publish(ctx, "model.gguf", path, "application/octet-stream", f, res.model_class, err, errlen);
        } else if (!strcmp(f, "gguf")) {
            snprintf(path, sizeof path, "%s/model.gguf", dir);
            if (exp_gguf_write(&m, path, &o, &res, err, errlen) < 0)
                goto out;
            e = publish(ctx, "model.gguf", path, "application/octet-stream", f, res.model_class, err, errlen);
        } else if (!strcmp(f, "hf") || !strcmp(f, "deci")) {
            /* "hf": LlamaForCausalLM when uniform, DeciLM block_configs otherwise (DESIGN.md §8). */
            o.hf_class = !strcmp(f, "hf") ? NULL : "deci";
            snprintf(name, sizeof name, "model-%s", f);
            snprintf(path, sizeof path, "%s/%s", dir, name);
            snprintf(tarp, sizeof tarp, "%s/%s.tar", dir, name);
            if (fio_remove_tree(path) < 0) {
                snprintf(err, errlen, "export: cannot clear %s from an earlier attempt", path);
                goto out;
            }
            if (exp_hf_write(&m, path, &o, &res, err, errlen) < 0)
                goto out;
            tar_writer *t = tar_open(tarp, 0, err, errlen);
            if (!t)
                goto out;
            tar_set_cancel(t, job_cancelled_hook, ctx);   /* and per MiB archived */
            if (tar_add_tree(t, name, path, err, errlen) < 0) {
                tar_abort(t);
                goto out;
            }
            if (tar_close(t, err, errlen) < 0)
                goto out;
            snprintf(name + strlen(name), sizeof name - strlen(name), ".tar");
            e = publish(ctx, name, tarp, "application/x-tar", f, res.model_class, err, errlen);
        } else {
            snprintf(err, errlen, "export: format '%s' is not available in this build", f);
            goto out;
        }
        if (!e || json_object_set_new(e, "tokenizer", json_boolean(res.tokenizer)) < 0)
            goto out;
        if (res.note[0])
            json_object_set_new(e, "note", json_string(res.note));
        json_array_append_new(arts, e);
        job_progress(ctx, (int64_t)i + 1, (int64_t)n);
    }
    char mpath[4400];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    json_t *man = json_pack("{s:s, s:O}", "job_id", job_ctx_id(ctx), "artifacts", arts);
    if (!man || fio_write_json(mpath, man, JSON_INDENT(2) | JSON_SORT_KEYS, err, errlen) < 0) {
        if (!man)
            snprintf(err, errlen, "export: out of memory");
        json_decref(man);
        goto out;
    }
    json_decref(man);
    if (job_publish(ctx, "export-manifest.json", mpath, "application/json", err, errlen) < 0)
        goto out;
    static const char *const owned[] = {"export", NULL};
    if (job_report_replace(ctx, owned, json_pack("{s:{s:O}}", "export", "artifacts", arts))) {
        snprintf(err, errlen, "export: cannot merge the report");
        goto out;
    }
    rc = 0;
out:
    if (rc < 0 && job_cancelled(ctx))
        rc = 1;   /* stopped for the cancel: cancelled, not failed */
    json_decref(arts);
    json_decref(report);
    eng_model_free(&m);
    eng_backend_free(be);
    return rc;
}

void stage_export_register(void)
{
    stage_register("export", stage_export_run);
}
