/* compress/cm_cache.c — calibrations on disk: their ids (target, shape, options), the
 * cache under DATA/calibrations/ (written atomically), the lookup of one that covers an
 * arch, and the estimate built from it. What HTTP status an outcome gets is the API's.
 */
#include "compress/costmodel.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/sha.h>

#include "compress/costmodel_internal.h"
#include "compress/llamacpp.h"
#include "engine/backend.h"
#include "engine/devices.h"
#include "storage/archjson.h"
#include "storage/fileio.h"

/* ---------- ids and the cache ---------- */

/* What besides the model's shape a calibration's tables hold for, appended to buf (at most
 * cap bytes): its length. threads: the built-in CPU engine's (0: eng_cpu_default_threads). */
static int env_suffix(const cm_target *t, int threads, char *buf, size_t cap)
{
    int n = 0;
    buf[0] = 0;
    /* The CPU's tables hold for the BLAS kernel that measured them (a generic one runs GEMMs
     * about 5x slower than the AVX-512 one on the same CPU), and for its thread count. */
    if (!cm_target_llamacpp(t) && strcmp(t->device, "cpu") == 0) {
        char wait[128];   /* and for the way idle threads wait (sleeping at once halves decode) */
        n += snprintf(buf + n, cap - (size_t)n, "|blas%s|%s|cores%d", eng_blas_kernel(),
                      eng_cpu_wait_policy(wait, sizeof wait), threads > 0 ? threads : eng_cpu_default_threads());
        /* at 16 bits, for oneDNN's kernel and version too */
        char ver[32];
        if (strcmp(t->precision, "fp32") && n > 0 && (size_t)n < cap)
            n += snprintf(buf + n, cap - (size_t)n, "|gemm%s|dnnl%s", eng_cpu_gemm_kernel(t->precision),
                          eng_cpu_gemm16_version(ver, sizeof ver));
    }
    /* The built-in engine's memory model counts a fresh serving process's whole memory (fp1),
     * not what a model added to a long-lived one: tables made the old way are not reused. */
    if (!cm_target_llamacpp(t) && n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "|fp1");
    /* Another engine keys its name, KV type, threads, flash attention and build too, and
     * the version of its calibration method (rb3: repeated-block models read the parent's
     * extra bytes before each step, the hidden sizes' passes in turn; rb5: the parent
     * served between the random archs, whose held-out rows are also checked as anchored
     * searches price them, and the fit archs' phase factors per hidden size; rb6: MoE blocks
     * at narrower expert widths too, entries priced 0 or less served again, and the
     * parent's bias over the fit archs), so that tables an older method made are not
     * reused. */
    if (cm_target_llamacpp(t) && n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "|%s|kv%s|T%d|fa%s|%s|rb6", t->engine, t->kv_cache_type,
                      t->threads, cm_target_flash(t), t->engine_build);
    /* the shape-dependent methods' version (the markers cm_calibration_id adds for MoE,
     * LatentMoE and Mamba grids): raised with any of them, so that a covering lookup does
     * not reuse a grid an older method made */
    if (n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "|m1");
    return n < 0 ? 0 : (size_t)n < cap ? n : (int)cap - 1;
}

void cm_calibration_env(const cm_target *t, int threads, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "v1|%s|%s", t->device, t->precision);
    if (n > 0 && (size_t)n < cap)
        env_suffix(t, threads, buf + n, cap - (size_t)n);
}

void cm_calibration_id(const cm_target *t, const arch *a, char id[40])
{
    int maxh = 0, maxkv = 0, maxf = 0;
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        maxh = l->n_heads > maxh ? l->n_heads : maxh;
        maxkv = l->n_kv_heads > maxkv ? l->n_kv_heads : maxkv;
        maxf = l->ffn_dim > maxf ? l->ffn_dim : maxf;
    }
    char buf[512];
    int n = snprintf(buf, sizeof buf, "v1|%s|%s|%s|V%d|C%d|D%d|tie%d|bias%d|H%d|KV%d|F%d|B%d|S%d|N%d", t->device,
                     t->precision, a->family, a->vocab_size, a->hidden_size, a->head_dim, a->tie_word_embeddings,
                     a->attention_bias, maxh, maxkv, maxf, t->batch_size, t->prompt_tokens, t->output_tokens);
    if (n > 0 && (size_t)n < sizeof buf)
        n += env_suffix(t, 0, buf + n, sizeof buf - (size_t)n);
    /* MoE: the most experts, and the first MoE layer's top-k and widths (the grid's shape;
     * w2: the grid prices narrower experts too; w3: and narrower shared experts; w4: in
     * llama.cpp's nemotron_h too; kc: the smallest count and the top-k at every width, which
     * price the counts below the top-k). A new marker here raises env_suffix's "m". */
    int maxe;
    const arch_moe *e = arch_first_moe(a, &maxe);
    if (e && n > 0 && (size_t)n < sizeof buf)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "|E%d|k%d|Fe%d|Fs%d|nt%d%s|kc", maxe, e->top_k, e->expert_ffn_dim,
                      e->shared_ffn_dim, e->norm_topk,
                      !e->shared_ffn_dim                             ? "|w2"
                      : cm_target_llamacpp(t) && !arch_moe_family(a) ? "|w4"
                                                                     : "|w3");
    if (e && e->sigmoid && n > 0 && (size_t)n < sizeof buf)   /* Nemotron-H's router */
        n += snprintf(buf + n, sizeof buf - (size_t)n, "|sg|g%d|tg%d|rs%.9g", e->n_group, e->topk_group,
                      e->routed_scale);
    if (e && e->latent_dim && n > 0 && (size_t)n < sizeof buf)   /* LatentMoE (lw: narrower latents priced too) */
        n += snprintf(buf + n, sizeof buf - (size_t)n, "|lt%d|lw", e->latent_dim);
    /* Mamba-2: the most heads and the first Mamba layer's shape (the grid's) */
    int most;
    const arch_mamba *mb = arch_first_mamba(a, &most);
    if (mb && n > 0 && (size_t)n < sizeof buf)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "|M%d|P%d|S%d|G%d|K%d", most, mb->head_dim, mb->d_state,
                      mb->n_groups, mb->conv_kernel);
    if (n >= (int)sizeof buf)
        n = (int)sizeof buf - 1;
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)buf, (size_t)(n < 0 ? 0 : n), md);
    int o = snprintf(id, 40, "cal_");
    for (int i = 0; i < 8; i++)
        o += snprintf(id + o, (size_t)(40 - o), "%02x", md[i]);
}

int cm_calibration_path(const char *data_dir, const char *id, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s/calibrations/%s.json", data_dir, id);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

json_t *cm_calibration_load(const char *data_dir, const char *id, char *err, size_t errlen)
{
    char path[4096];
    json_error_t je;
    if (strncmp(id, "cal_", 4) || strchr(id, '/') || strchr(id, '.')) {
        snprintf(err, errlen, "%s: not a calibration id", id);
        return NULL;
    }
    if (cm_calibration_path(data_dir, id, path, sizeof path)) {
        snprintf(err, errlen, "data directory path too long");
        return NULL;
    }
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        snprintf(err, errlen, "%s: %s", path, je.text);
    return j;
}

int cm_calibration_save(const char *data_dir, json_t *cal, char *err, size_t errlen)
{
    char dir[4096], path[4096];
    json_t *idj = json_object_get(cal, "id");
    if (!json_is_string(idj))
        FAIL("calibration has no id");
    int n = snprintf(dir, sizeof dir, "%s/calibrations", data_dir);
    if (n < 0 || (size_t)n >= sizeof dir || cm_calibration_path(data_dir, json_string_value(idj), path, sizeof path))
        FAIL("data directory path too long");
    if (fio_mkdirs(dir))
        FAIL("%s: %s", dir, strerror(errno));
    if (fio_write_json(path, cal, JSON_INDENT(1) | JSON_SORT_KEYS, err, errlen))
        return -1;
    return 0;
}

/* Parse target and tables of a calibration object. 0 or -1. */
int cm_calibration_tables(json_t *cal, cm_tables *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    cm_target tg;
    if (!json_is_object(cal))
        FAIL("calibration: must be an object");
    if (cm_target_from_json(json_object_get(cal, "target"), "/target", &tg, err, errlen))
        return -1;
    t->target = tg;
    if (cm_tables_from_json(json_object_get(cal, "tables"), "/tables", t, err, errlen))
        return -1;
    json_t *idj = json_object_get(cal, "id");
    if (json_is_string(idj))
        snprintf(t->id, sizeof t->id, "%s", json_string_value(idj));
    json_t *src = json_object_get(cal, "source");   /* "import": measured in another engine */
    if (json_is_string(src) && !strcmp(json_string_value(src), "import"))
        snprintf(t->source, sizeof t->source, "import");
    return 0;
}

int cm_target_same(const cm_target *a, const cm_target *b)
{
    return !strcmp(a->device, b->device) && !strcmp(a->precision, b->precision) &&
           cm_target_llamacpp(a) == cm_target_llamacpp(b) && !strcmp(a->kv_cache_type, b->kv_cache_type) &&
           a->threads == b->threads && !strcmp(a->engine_build, b->engine_build) &&
           a->batch_size == b->batch_size && a->prompt_tokens == b->prompt_tokens &&
           a->output_tokens == b->output_tokens;
}

static int succeeded(const json_t *cal)
{
    json_t *st = json_object_get(cal, "status");
    return json_is_string(st) && !strcmp(json_string_value(st), "succeeded");
}

int cm_calibration_reusable(const json_t *cal)
{
    return succeeded(cal) && !json_is_true(json_object_get(json_object_get(cal, "host_load"), "contended"));
}

static int usable(const json_t *cal, int contended)
{
    return contended ? succeeded(cal) : cm_calibration_reusable(cal);
}

/* 1 when cal was measured where this process would measure it now (its "env", from
 * cm_calibration_env, is env), was imported from another engine (its tables are what
 * that engine measured), or was made by a worker agent for this server (from_agent: the
 * agents serve its jobs; docs/fleet.md). A calibration without an env is from before it
 * was kept: not reused, as its kernel, threads and method are unknown. */
static int same_env(const json_t *cal, const char *env)
{
    const char *src = json_string_value(json_object_get(cal, "source")),
               *its = json_string_value(json_object_get(cal, "env"));
    return (src && !strcmp(src, "import")) || json_is_true(json_object_get(cal, "from_agent")) ||
           (its && !strcmp(its, env));
}

/* cm_calibration_find, also handing out calibrations made beside other work with
 * contended set. */
static json_t *find_covering(const char *data_dir, const cm_target *t, const arch *a, int contended)
{
    char dir[4096], e[256];
    int n = snprintf(dir, sizeof dir, "%s/calibrations", data_dir);
    if (n < 0 || (size_t)n >= sizeof dir)
        return NULL;
    /* The parent's own id first (the common case), then any covering calibration. */
    char id[40], env[1024];
    cm_calibration_id(t, a, id);
    cm_calibration_env(t, 0, env, sizeof env);
    json_t *cal = cm_calibration_load(data_dir, id, e, sizeof e);
    if (cal) {
        if (usable(cal, contended) && same_env(cal, env))
            return cal;
        json_decref(cal);
    }
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    struct dirent *de;
    json_t *found = NULL;
    while (!found && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (strncmp(de->d_name, "cal_", 4) || len < 6 || strcmp(de->d_name + len - 5, ".json") || len - 5 >= 40)
            continue;
        char cid[40];
        snprintf(cid, sizeof cid, "%.*s", (int)(len - 5), de->d_name);
        cal = cm_calibration_load(data_dir, cid, e, sizeof e);
        if (!cal)
            continue;
        cm_tables tb;
        cm_prediction p;
        if (usable(cal, contended) && same_env(cal, env) && !cm_calibration_tables(cal, &tb, e, sizeof e)) {
            if (cm_target_same(&tb.target, t) && !cm_predict(&tb, a, &p, e, sizeof e))
                found = cal;
            cm_tables_free(&tb);
        }
        if (!found)
            json_decref(cal);
    }
    closedir(d);
    return found;
}

json_t *cm_calibration_find(const char *data_dir, const cm_target *t, const arch *a)
{
    return find_covering(data_dir, t, a, 0);
}

/* ---------- POST /v1/estimates ---------- */

cm_est_status cm_estimate(const arch *a, const cm_target *tg, const char *data_dir, json_t **out, char *err,
                          size_t errlen)
{
    *out = NULL;
    cm_target resolved = *tg;   /* another engine: its threads and the build installed here */
    if (lc_target_resolve(&resolved, err, errlen))
        return CM_EST_UNCOVERED;
    tg = &resolved;
    /* No calibration at a block type prices widths off the block (the weight type cannot
     * store them): say so, rather than ask for a calibration that would not cover it. */
    int block = cm_target_block(tg, a);
    char why[160];
    if (block > 1 && !cm_arch_fits_block(a, block, why, sizeof why)) {
        snprintf(err, errlen, "%s at %s stores rows in blocks of %d: %s", tg->engine, tg->precision, block, why);
        return CM_EST_UNCOVERED;
    }
    json_t *cal = cm_calibration_find(data_dir, tg, a);
    if (!cal) {
        char id[40];
        cm_calibration_id(tg, a, id);
        json_t *busy = find_covering(data_dir, tg, a, 1);   /* one not reused: say why */
        int contended = busy != NULL;
        json_decref(busy);
        snprintf(err, errlen,
                 "no calibration covers this arch on target %s/%s (batch %d, prompt %d, output %d): run calibration "
                 "%s first (POST /v1/calibrations with this arch and target, or `autocompress calibrate`)%s",
                 tg->device, tg->precision, tg->batch_size, tg->prompt_tokens, tg->output_tokens, id,
                 contended ? "; the one cached was made beside other work and is not reused" : "");
        return CM_EST_UNCALIBRATED;
    }
    cm_tables tb;
    cm_prediction p;
    memset(&tb, 0, sizeof tb);
    cm_est_status rc = CM_EST_UNCOVERED;
    if (!cm_calibration_tables(cal, &tb, err, errlen) && !cm_predict(&tb, a, &p, err, errlen)) {
        json_t *pj = cm_prediction_to_json(&p), *arj = arch_to_json(a);
        *out = pj && arj ? json_pack("{s:s,s:O,s:I,s:O,s:I}", "calibration_id", tb.id, "arch", arj, "params",
                                     (json_int_t)p.params, "predicted", pj, "naive_weights_plus_kv_bytes",
                                     (json_int_t)p.naive_bytes)
                         : NULL;
        json_decref(pj);
        json_decref(arj);
        rc = *out ? CM_EST_OK : CM_EST_FAILED;
        if (!*out)
            snprintf(err, errlen, "out of memory");
    }
    cm_tables_free(&tb);
    json_decref(cal);
    return rc;
}

