/* jobs/pstate.c — lazily built, job-wide shared state for the stages (see pstate.h). */
#include "jobs/pstate.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compress/calibrate.h"
#include "compress/costmodel.h"
#include "compress/method.h"
#include "compress/rank.h"
#include "compress/steps.h"
#include "engine/devices.h"
#include "storage/archjson.h"
#include "storage/artstore.h"
#include "storage/fileio.h"
#include "storage/modelio.h"
#include "storage/strbuf.h"

static json_t *spec_path(job_ctx *ctx, const char *path)
{
    json_t *j = job_ctx_spec(ctx);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *s = buf, *dot; j && s; s = dot ? dot + 1 : NULL) {
        dot = strchr(s, '.');
        if (dot)
            *dot = 0;
        j = json_object_get(j, s);
    }
    return j;
}

long long ps_int(job_ctx *ctx, const char *path, long long def)
{
    json_t *j = spec_path(ctx, path);
    return json_is_integer(j) ? json_integer_value(j) : def;
}

static double spec_num(job_ctx *ctx, const char *path)
{
    json_t *j = spec_path(ctx, path);
    return json_is_number(j) ? json_number_value(j) : 0.0;
}

int ps_target(job_ctx *ctx, cm_target *t, char *err, size_t errlen)
{
    json_t *tj = spec_path(ctx, "target");
    if (!tj) {
        snprintf(err, errlen, "the spec has no target");
        return -1;
    }
    return cm_target_from_json(tj, "/target", t, err, errlen);
}

void ps_limits(job_ctx *ctx, const arch *parent, const cm_tables *tables, const dnas_axes *axes, dnas_limits *lim,
               method_margin *margin)
{
    dnas_limits given = {.latency_ms = spec_num(ctx, "constraints.latency_ms"),
                         .throughput_tps = spec_num(ctx, "constraints.throughput_tokens_per_s"),
                         .memory_bytes = spec_num(ctx, "constraints.memory_gib") * 1073741824.0,
                         .params = spec_num(ctx, "constraints.params")};
    json_t *pct = spec_path(ctx, "constraints.margin_pct");
    const char *path = job_ctx_output(ctx, "calibrate", "calibration.json");
    json_t *cal = path ? json_load_file(path, JSON_REJECT_DUPLICATES, NULL) : NULL;
    method_aim(parent, tables, axes, json_object_get(cal, "validation"), json_is_number(pct) ? json_number_value(pct) : -1,
               &given, lim, margin);
    json_decref(cal);
}

void ps_axes(job_ctx *ctx, dnas_axes *a)
{
    memset(a, 0, sizeof *a);
    a->hidden = json_is_true(spec_path(ctx, "search_space.hidden"));
    a->heads = json_is_true(spec_path(ctx, "search_space.heads"));
    a->ffn = json_is_true(spec_path(ctx, "search_space.ffn"));
    a->experts = json_is_true(spec_path(ctx, "search_space.experts"));
    a->expert_widths = json_is_true(spec_path(ctx, "search_space.expert_widths"));
    a->shared_widths = json_is_true(spec_path(ctx, "search_space.shared_expert_widths"));
    a->latent = json_is_true(spec_path(ctx, "search_space.latent_widths"));
    a->mamba = json_is_true(spec_path(ctx, "search_space.mamba_heads"));
    a->depth = json_is_true(spec_path(ctx, "search_space.depth"));
    /* The search space is cut to what the requested exports can express (DESIGN.md §8). */
    json_t *ex = spec_path(ctx, "export");
    const char *formats[8];
    int n = 0;
    size_t i;
    json_t *v;
    json_array_foreach(ex, i, v)
        if (json_is_string(v) && n < 7)
            formats[n++] = json_string_value(v);
    /* llama.cpp serves the GGUF export: its graphs' rules hold whatever else is exported */
    json_t *eng = spec_path(ctx, "target.engine");
    if (json_is_string(eng) && !strcmp(json_string_value(eng), CM_ENGINE_LLAMACPP))
        formats[n++] = "gguf";
    char err[256];
    eng_model *m = ps_parent(ctx, 0, err, sizeof err);
    if (m)
        dnas_axes_for_exports(a, formats, n, &m->a);
}

static void free_backend(void *p) { eng_backend_free(p); }
static void free_tok(void *p) { tok_free(p); }
static void free_model(void *p)
{
    eng_model_free(p);
    free(p);
}
static void free_stream(void *p)
{
    td_stream_free(p);
    free(p);
}
static void free_tables(void *p)
{
    cm_tables_free(p);
    free(p);
}
static void free_arch(void *p)
{
    arch_free(p);
    free(p);
}

/* The precision of the job's own backend: ranking, distillation and evaluation run at the
 * precision the built-in engine will serve at; a llama.cpp target's weight types are not
 * the engine's, so fp32 there. */
static const char *ps_precision(job_ctx *ctx)
{
    json_t *eng = spec_path(ctx, "target.engine"), *prec = spec_path(ctx, "target.precision");
    int builtin = !json_is_string(eng) || !strcmp(json_string_value(eng), CM_ENGINE_AUTOCOMPRESS);
    return builtin && json_is_string(prec) ? json_string_value(prec) : "fp32";
}

eng_backend *ps_backend(job_ctx *ctx, char *err, size_t errlen)
{
    eng_backend *be = job_ctx_get_state(ctx, "backend");
    if (be)
        return be;
    json_t *dev = spec_path(ctx, "target.device");
    be = cal_backend_new(json_is_string(dev) ? json_string_value(dev) : "cpu", ps_precision(ctx), 0, err, errlen);
    if (be)
        job_ctx_set_state(ctx, "backend", be, free_backend);
    return be;
}

/* Load parent and tokenizer together (one open of the model file). */
static int load_parent(job_ctx *ctx, char *err, size_t errlen)
{
    eng_backend *be = ps_backend(ctx, err, errlen);
    if (!be)
        return -1;
    json_t *path = spec_path(ctx, "model.path"), *tokp = spec_path(ctx, "model.tokenizer");
    if (!json_is_string(path)) {
        snprintf(err, errlen, "the spec names no model path");
        return -1;
    }
    eng_model *m = calloc(1, sizeof *m);
    tok_tokenizer *tok = NULL;
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (mio_load_model(json_string_value(path), json_is_string(tokp) ? json_string_value(tokp) : NULL, be, m, &tok,
                       err, errlen) != 0) {
        free(m);
        return -1;
    }
    job_ctx_set_state(ctx, "parent", m, free_model);
    job_ctx_set_state(ctx, "tokenizer", tok, free_tok);
    return 0;
}

tok_tokenizer *ps_tokenizer(job_ctx *ctx, char *err, size_t errlen)
{
    tok_tokenizer *t = job_ctx_get_state(ctx, "tokenizer");
    if (!t && load_parent(ctx, err, errlen) == 0)
        t = job_ctx_get_state(ctx, "tokenizer");
    return t;
}

eng_model *ps_parent(job_ctx *ctx, int ranked, char *err, size_t errlen)
{
    eng_model *m = job_ctx_get_state(ctx, "parent");
    if (!m) {
        if (load_parent(ctx, err, errlen) != 0)
            return NULL;
        m = job_ctx_get_state(ctx, "parent");
    }
    if (ranked && !job_ctx_get_state(ctx, "parent_ranked")) {
        const char *rp = job_ctx_output(ctx, "rank", "ranking.json");
        if (!rp) {
            snprintf(err, errlen, "the ranking is missing: the rank stage must run first");
            return NULL;
        }
        rank_result r;
        if (step_rank_load(rp, m, &r, err, errlen) != 0)
            return NULL;
        int rc = rank_apply(m, &r, err, errlen);
        rank_free(&r);
        if (rc != 0)
            return NULL;
        job_ctx_set_state(ctx, "parent_ranked", m, NULL);
    }
    return m;
}

int ps_text(job_ctx *ctx, const char *which, const td_stream **train, const td_stream **val, char *err,
            size_t errlen)
{
    char ktrain[64], kval[64], path[64];
    snprintf(ktrain, sizeof ktrain, "text.%s.train", which);
    snprintf(kval, sizeof kval, "text.%s.val", which);
    *train = job_ctx_get_state(ctx, ktrain);
    *val = job_ctx_get_state(ctx, kval);
    if (*train)
        return 0;
    snprintf(path, sizeof path, "data.%s", which);
    json_t *p = spec_path(ctx, path);
    if (!json_is_string(p) && !strcmp(which, "distillation"))
        p = spec_path(ctx, "data.calibration");   /* distil on the calibration text by default */
    if (!json_is_string(p)) {
        snprintf(err, errlen, "the spec names no data.%s text", which);
        return -1;
    }
    tok_tokenizer *tok = ps_tokenizer(ctx, err, errlen);
    if (!tok)
        return -1;
    td_stream *tr = calloc(1, sizeof *tr), *va = calloc(1, sizeof *va);
    td_pack_opts o;
    step_text_default(&o, tok);
    int rc = (tr && va) ? step_text(json_string_value(p), tok, &o, tr, va, NULL, err, errlen) : -1;
    if (rc != 0) {
        if (!tr || !va)
            snprintf(err, errlen, "out of memory");
        free(tr);
        free(va);
        return -1;
    }
    job_ctx_set_state(ctx, ktrain, tr, free_stream);
    job_ctx_set_state(ctx, kval, va, free_stream);
    *train = tr;
    *val = va;
    return 0;
}

const cm_tables *ps_tables(job_ctx *ctx, char *err, size_t errlen)
{
    cm_tables *t = job_ctx_get_state(ctx, "tables");
    if (t)
        return t;
    const char *path = job_ctx_output(ctx, "calibrate", "calibration.json");
    if (!path) {
        snprintf(err, errlen, "the calibration is missing: the calibrate stage must run first");
        return NULL;
    }
    json_error_t je;
    json_t *cal = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!cal) {
        snprintf(err, errlen, "%s: %s", path, je.text);
        return NULL;
    }
    t = calloc(1, sizeof *t);
    int rc = t ? cm_calibration_tables(cal, t, err, errlen) : -1;   /* tables with their target */
    json_decref(cal);
    if (rc != 0) {
        free(t);
        return NULL;
    }
    job_ctx_set_state(ctx, "tables", t, free_tables);
    return t;
}

const arch *ps_arch(job_ctx *ctx, char *err, size_t errlen)
{
    arch *a = job_ctx_get_state(ctx, "arch");
    if (a)
        return a;
    const char *path = job_ctx_output(ctx, "search", "arch.json");
    if (!path) {
        snprintf(err, errlen, "the chosen architecture is missing: the search stage must run first");
        return NULL;
    }
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        snprintf(err, errlen, "%s: %s", path, je.text);
        return NULL;
    }
    a = calloc(1, sizeof *a);
    int rc = a ? arch_from_json(j, a, err, errlen) : -1;
    json_decref(j);
    if (rc != 0) {
        free(a);
        return NULL;
    }
    job_ctx_set_state(ctx, "arch", a, free_arch);
    return a;
}

int ps_write_json(job_ctx *ctx, const char *name, json_t *doc, char *err, size_t errlen)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", job_ctx_stage_dir(ctx), name);
    if (!doc) {
        snprintf(err, errlen, "out of memory building %s", name);
        return -1;
    }
    int rc = fio_write_json(path, doc, JSON_INDENT(2) | JSON_SORT_KEYS, err, errlen);
    json_decref(doc);
    return rc;
}

/* ---------- content-keyed caches in the data dir ---------- */

int stage_job_data_dir(job_ctx *ctx, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s/../..", job_ctx_dir(ctx));
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* Files up to this size are keyed by their content: texts, tokenizers, task files and
 * small models get copied, re-extracted or re-downloaded with new modification times,
 * and hashing them costs well under a second. Larger files by path, size and mtime. */
#define HASH_KEY_MAX_BYTES ((int64_t)256 << 20)

/* One file's line: "NAME size sha256:HEX" for a file hashed by content (name: its name
 * in a folder, "" at the top), else "PATH size mtime". 0, or -1 when it cannot be read. */
static int file_print(strbuf *b, const char *path, const char *name, const struct stat *st)
{
    if ((int64_t)st->st_size <= HASH_KEY_MAX_BYTES) {
        char hex[65], why[256];
        int64_t size = 0;
        if (art_sha256_file(path, hex, &size, why, sizeof why) != 0)
            return -1;
        strbuf_printf(b, "%s %lld sha256:%s\n", name, (long long)size, hex);
    } else {
        strbuf_printf(b, "%s %lld %lld.%09ld\n", path, (long long)st->st_size, (long long)st->st_mtim.tv_sec,
                      st->st_mtim.tv_nsec);
    }
    return 0;
}

/* Append the key lines (file_print) of a file, or of every regular file directly in a
 * folder (sorted by name; hidden ones left out), to b. 0, or -1 when the path cannot be
 * resolved, listed or read. */
static int fingerprint(strbuf *b, const char *path)
{
    char real[PATH_MAX];
    struct stat st;
    if (!realpath(path, real) || stat(real, &st))
        return -1;
    if (!S_ISDIR(st.st_mode))
        return file_print(b, real, "", &st);
    char **names;
    size_t n;
    if (fio_list_dir(real, &names, &n))
        return -1;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char p[PATH_MAX + 256];
        snprintf(p, sizeof p, "%s/%s", real, names[i]);
        if (names[i][0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode))
            rc = file_print(b, p, names[i], &st);
    }
    fio_names_free(names, n);
    return rc;
}

int ps_cache_path(job_ctx *ctx, const char *kind, const char *key, const char *extra_path, char *path,
                  size_t len)
{
    json_t *mp = spec_path(ctx, "model.path"), *tp = spec_path(ctx, "model.tokenizer");
    char data[4096];
    if (!json_is_string(mp) || stage_job_data_dir(ctx, data, sizeof data))
        return -1;
    strbuf b = {0};
    strbuf_printf(&b, "%s\n%s\n", kind, key);
    if (strcmp(ps_precision(ctx), "fp32"))   /* scores and rankings computed at 16 bits are their own */
        strbuf_printf(&b, "precision %s\n", ps_precision(ctx));
    int rc = (extra_path && fingerprint(&b, extra_path)) || fingerprint(&b, json_string_value(mp)) ||
                     (json_is_string(tp) && fingerprint(&b, json_string_value(tp))) || b.oom
                 ? -1
                 : 0;
    if (!rc) {
        char hex[65];
        art_sha256_buf(b.s, b.len, hex);
        int n = snprintf(path, len, "%s/%s", data, kind);
        if (n < 0 || (size_t)n >= len || (mkdir(path, 0755) && errno != EEXIST))
            rc = -1;
        else {
            n = snprintf(path, len, "%s/%s/%s.json", data, kind, hex);
            rc = n < 0 || (size_t)n >= len ? -1 : 0;
        }
    }
    free(b.s);
    return rc;
}
