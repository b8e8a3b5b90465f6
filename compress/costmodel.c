/* compress/costmodel.c — the cost model's targets and predictions: the default target and
 * workload, linear interpolation between grid points, additive latency, itemized memory,
 * and the shape of a model or arch file. Pure lookups: nothing here runs the engine. The
 * tables' JSON is cm_tables.c, the on-disk calibration cache cm_cache.c.
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

#include "compress/costmodel_internal.h"
#include "storage/archjson.h"
#include "storage/hfconfig.h"
#include "storage/modelio.h"

/* ---------- target ---------- */

int cm_hidden_candidates_m(int C, int multiple, int out[4])
{
    int n = 0, m = multiple < 8 ? 8 : multiple;
    for (int j = 4; j < 8; j++) {
        int h = (C * j / 8) / m * m;
        if (h > 0 && h < C && (!n || out[n - 1] != h))
            out[n++] = h;
    }
    return n;
}

int cm_hidden_candidates(int C, int out[4])
{
    return cm_hidden_candidates_m(C, 8, out);
}

int cm_target_llamacpp(const cm_target *t)
{
    return !strcmp(t->engine, CM_ENGINE_LLAMACPP);
}

/* 1 when word w is one of the space-separated words of list. */
static int in_list(const char *w, const char *list)
{
    size_t n = strlen(w);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ' ');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        if (k == n && !strncmp(p, w, n))
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

json_t *cm_words_json(const char *list)
{
    json_t *a = json_array();
    for (const char *p = list; a && *p;) {
        const char *e = strchr(p, ' ');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        if (k && json_array_append_new(a, json_stringn(p, k))) {
            json_decref(a);
            return NULL;
        }
        if (!e)
            break;
        p = e + 1;
    }
    return a;
}

const char *cm_llamacpp_default_flash(const char *kv_type)
{
    return kv_type && (!strcmp(kv_type, "q8_0") || !strcmp(kv_type, "q4_0")) ? "on" : "off";
}

const char *cm_target_flash(const cm_target *t)
{
    return *t->flash_attention ? t->flash_attention : cm_llamacpp_default_flash(t->kv_cache_type);
}

int cm_batch_check(const char *engine, int batch, char *why, size_t whylen)
{
    if (!engine || strcmp(engine, CM_ENGINE_LLAMACPP) || batch <= CM_LLAMACPP_MAX_BATCH)
        return 0;
    snprintf(why, whylen, "llama.cpp serves at most %d requests at once (one sequence each), not %d",
             CM_LLAMACPP_MAX_BATCH, batch);
    return -1;
}

int cm_engine_check(const char *engine, const char *device, const char *precision, const char *kv_type, int threads,
                    const char *flash, const char **field, char *why, size_t whylen)
{
    const char *eng = engine && *engine ? engine : CM_ENGINE_AUTOCOMPRESS;
    *field = "engine";
    if (!strcmp(eng, CM_ENGINE_AUTOCOMPRESS)) {
        if (precision && !in_list(precision, CM_AUTOCOMPRESS_PRECISIONS)) {
            *field = "precision";
            snprintf(why, whylen, "\"%s\" is not a precision of the autocompress engine (%s)", precision,
                     CM_AUTOCOMPRESS_PRECISIONS);
            return -1;
        }
        if (kv_type) {
            *field = "kv_cache_type";
            snprintf(why, whylen, "only the llama.cpp engine takes a KV-cache type");
            return -1;
        }
        if (threads >= 0) {
            *field = "threads";
            snprintf(why, whylen, "only the llama.cpp engine takes a thread count");
            return -1;
        }
        if (flash) {
            *field = "flash_attention";
            snprintf(why, whylen, "only the llama.cpp engine takes a flash-attention setting");
            return -1;
        }
        return 0;
    }
    if (strcmp(eng, CM_ENGINE_LLAMACPP)) {
        snprintf(why, whylen, "unknown engine \"%s\" (autocompress, llama.cpp)", eng);
        return -1;
    }
    if (device && strcmp(device, "cpu")) {
        *field = "device";
        snprintf(why, whylen, "llama.cpp targets are served and measured on the CPU in this build (its measuring "
                 "helper offloads no layer to a GPU): use device cpu, or the autocompress engine on %s", device);
        return -1;
    }
    if (precision && !in_list(precision, CM_LLAMACPP_PRECISIONS)) {
        *field = "precision";
        snprintf(why, whylen, "\"%s\" is not a weight type llama.cpp serves here (%s)", precision,
                 CM_LLAMACPP_PRECISIONS);
        return -1;
    }
    if (kv_type && !in_list(kv_type, CM_LLAMACPP_KV_TYPES)) {
        *field = "kv_cache_type";
        snprintf(why, whylen, "\"%s\" is not a llama.cpp KV-cache type (%s)", kv_type, CM_LLAMACPP_KV_TYPES);
        return -1;
    }
    if (threads == 0 || threads > 1024) {
        *field = "threads";
        snprintf(why, whylen, "%d threads: must be 1..1024 (omit it for every online CPU)", threads);
        return -1;
    }
    if (flash && !in_list(flash, CM_LLAMACPP_FLASH_ATTN)) {
        *field = "flash_attention";
        snprintf(why, whylen, "\"%s\" is not a flash-attention setting (off, on)%s", flash,
                 !strcmp(flash, "auto") ? ": llama.cpp's auto turns it on only where every layer has one V width, "
                                          "so it would differ between the archs one search prices; name the one "
                                          "your server runs" : "");
        return -1;
    }
    if (flash && !strcmp(flash, "off") && !strcmp(cm_llamacpp_default_flash(kv_type), "on")) {
        *field = "flash_attention";
        snprintf(why, whylen, "llama.cpp needs flash attention for a quantized V cache (kv_cache_type %s)", kv_type);
        return -1;
    }
    return 0;
}

int cm_target_block(const cm_target *t, const arch *parent)
{
    if (!cm_target_llamacpp(t))
        return 1;
    const char *p = t->precision;
    if (!strcmp(p, "q8_0") || !strcmp(p, "q4_0"))
        return 32;
    if (!strcmp(p, "q4_k_m") || !strcmp(p, "q5_k_m") || !strcmp(p, "q6_k"))
        return parent && !cm_arch_fits_block(parent, 256, NULL, 0) ? 32 : 256;
    return 1;
}

int cm_arch_fits_block(const arch *a, int block, char *why, size_t whylen)
{
    if (block <= 1)
        return 1;
    if (a->hidden_size % block) {
        if (why)
            snprintf(why, whylen, "hidden size %d is not a multiple of %d", a->hidden_size, block);
        return 0;
    }
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *L = &a->layers[l];
        if ((L->n_heads * a->head_dim) % block) {
            if (why)
                snprintf(why, whylen, "layers[%d]: %d heads x head_dim %d = %d is not a multiple of %d", l,
                         L->n_heads, a->head_dim, L->n_heads * a->head_dim, block);
            return 0;
        }
        if (L->ffn_dim % block) {
            if (why)
                snprintf(why, whylen, "layers[%d]: ffn_dim %d is not a multiple of %d", l, L->ffn_dim, block);
            return 0;
        }
        if (arch_mamba_inner(&L->mamba) % block) {   /* out_proj's rows */
            if (why)
                snprintf(why, whylen, "layers[%d]: Mamba %d heads x head_dim %d = %d is not a multiple of %d", l,
                         L->mamba.n_heads, L->mamba.head_dim, arch_mamba_inner(&L->mamba), block);
            return 0;
        }
        const arch_moe *e = &L->moe;
        if (e->n_experts && (e->expert_ffn_dim % block || e->shared_ffn_dim % block || e->latent_dim % block)) {
            if (why)
                snprintf(why, whylen, "layers[%d]: expert widths %d (shared %d, latent %d) are not multiples of %d",
                         l, e->expert_ffn_dim, e->shared_ffn_dim, e->latent_dim, block);
            return 0;
        }
    }
    return 1;
}

void cm_target_default(cm_target *t)
{
    memset(t, 0, sizeof *t);
    snprintf(t->device, sizeof t->device, "cpu");
    snprintf(t->precision, sizeof t->precision, CM_AUTOCOMPRESS_DEFAULT_PRECISION);
    snprintf(t->engine, sizeof t->engine, CM_ENGINE_AUTOCOMPRESS);
    t->batch_size = CM_DEFAULT_BATCH;
    t->prompt_tokens = CM_DEFAULT_PROMPT_TOKENS;
    t->output_tokens = CM_DEFAULT_OUTPUT_TOKENS;
}

int cm_target_from_json(json_t *j, const char *ptr, cm_target *t, char *err, size_t errlen)
{
    static const char *const keys[] = {"device", "precision", "workload", "engine", "kv_cache_type", "threads",
                                       "flash_attention", "engine_build", NULL};
    static const char *const wkeys[] = {"batch_size", "prompt_tokens", "output_tokens", NULL};
    char at[96];
    memset(t, 0, sizeof *t);
    if (!json_is_object(j))
        FAIL("%s: must be an object", ptr);
    if (cmj_check_keys(j, ptr, keys, err, errlen))
        return -1;
    snprintf(t->engine, sizeof t->engine, CM_ENGINE_AUTOCOMPRESS);
    if (cmj_str(j, ptr, "device", 1, t->device, sizeof t->device, err, errlen) ||
        cmj_str(j, ptr, "engine", 0, t->engine, sizeof t->engine, err, errlen) ||
        cmj_str(j, ptr, "precision", 0, t->precision, sizeof t->precision, err, errlen) ||
        cmj_str(j, ptr, "kv_cache_type", 0, t->kv_cache_type, sizeof t->kv_cache_type, err, errlen) ||
        cmj_str(j, ptr, "flash_attention", 0, t->flash_attention, sizeof t->flash_attention, err, errlen) ||
        cmj_str(j, ptr, "engine_build", 0, t->engine_build, sizeof t->engine_build, err, errlen))
        return -1;
    int threads = -1;
    if (json_object_get(j, "threads") && cmj_i32(j, ptr, "threads", 1, 1024, 0, &threads, err, errlen))
        return -1;
    if (strcmp(t->device, "cpu") && strncmp(t->device, "cuda", 4))
        FAIL("%s/device: \"%s\" is not a device name (cpu, cuda:N)", ptr, t->device);
    const char *field;
    char why[160];
    if (cm_engine_check(t->engine, t->device, *t->precision ? t->precision : NULL,
                        *t->kv_cache_type ? t->kv_cache_type : NULL,
                        threads, *t->flash_attention ? t->flash_attention : NULL, &field, why, sizeof why))
        FAIL("%s/%s: %s", ptr, field, why);
    int llama = cm_target_llamacpp(t);
    if (!*t->precision)
        snprintf(t->precision, sizeof t->precision, "%s",
                 llama ? CM_LLAMACPP_DEFAULT_PRECISION : CM_AUTOCOMPRESS_DEFAULT_PRECISION);
    if (llama && !*t->kv_cache_type)
        snprintf(t->kv_cache_type, sizeof t->kv_cache_type, CM_LLAMACPP_DEFAULT_KV_TYPE);
    if (llama && !*t->flash_attention)
        snprintf(t->flash_attention, sizeof t->flash_attention, "%s", cm_llamacpp_default_flash(t->kv_cache_type));
    t->threads = threads > 0 ? threads : 0;
    json_t *w = json_object_get(j, "workload");
    snprintf(at, sizeof at, "%s/workload", ptr);
    if (!w)
        FAIL("%s: required", at);
    if (!json_is_object(w))
        FAIL("%s: must be an object", at);
    if (cmj_check_keys(w, at, wkeys, err, errlen) ||
        cmj_i32(w, at, "batch_size", 1, 4096, 1, &t->batch_size, err, errlen) ||
        cmj_i32(w, at, "prompt_tokens", 1, 1 << 20, 1, &t->prompt_tokens, err, errlen) ||
        cmj_i32(w, at, "output_tokens", 1, 1 << 20, 1, &t->output_tokens, err, errlen))
        return -1;
    if (cm_batch_check(t->engine, t->batch_size, why, sizeof why))
        FAIL("%s/batch_size: %s", at, why);
    return 0;
}

json_t *cm_target_to_json(const cm_target *t)
{
    json_t *o = json_pack("{s:s,s:s,s:s,s:{s:i,s:i,s:i}}", "device", t->device, "engine",
                          *t->engine ? t->engine : CM_ENGINE_AUTOCOMPRESS, "precision", t->precision, "workload",
                          "batch_size", t->batch_size, "prompt_tokens", t->prompt_tokens, "output_tokens",
                          t->output_tokens);
    if (!o)
        return NULL;
    int bad = 0;
    if (cm_target_llamacpp(t)) {
        bad |= json_object_set_new(o, "kv_cache_type", json_string(t->kv_cache_type));
        bad |= json_object_set_new(o, "flash_attention", json_string(cm_target_flash(t)));
        if (t->threads > 0)
            bad |= json_object_set_new(o, "threads", json_integer(t->threads));
    }
    if (*t->engine_build)
        bad |= json_object_set_new(o, "engine_build", json_string(t->engine_build));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ---------- interpolation ---------- */

/* Linear interpolation of y over sorted distinct xs (n >= 1) at x: exact on points,
 * between the bracketing pair inside, extrapolated from the outermost pair below the
 * smallest point (clamped at 0); beyond the largest point is refused (-1). */
static int interp(const double *xs, const double *ys, int n, double x, double *y)
{
    if (n == 1) {
        if (x != xs[0])
            return -1;
        *y = ys[0];
        return 0;
    }
    if (x > xs[n - 1] + 1e-9)
        return -1;
    int i = 1;
    while (i < n - 1 && xs[i] < x)
        i++;
    for (int k = 0; k < n; k++)
        if (xs[k] == x) {
            *y = ys[k];
            return 0;
        }
    double v = ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1]);
    *y = v < 0 ? 0 : v;
    return 0;
}

/* Values of one entry used by predictions, at the tables' workload. */
static void entry_values(const cm_tables *t, const cm_entry *pre, const cm_entry *dec, double v[3])
{
    double S = t->target.prompt_tokens, N = t->target.output_tokens;
    v[0] = pre->ms;
    /* sum_{c=S}^{S+N-1} (ms0 + slope*c) */
    v[1] = dec ? N * dec->ms0 + dec->ms_per_ctx * (N * S + N * (N - 1) / 2) : 0;
    v[2] = pre->workspace_bytes >= 0 ? (double)pre->workspace_bytes : 0;
}

static const cm_entry *find_decode(const cm_tables *t, const cm_entry *pre)
{
    for (int i = 0; i < t->n_decode; i++)
        if (cm_same_key(&t->decode[i], pre))
            return &t->decode[i];
    return NULL;
}

#define MAX_GRID 256

/* 1 when entry e prices moe's routing: the same top-k, or, for an MoE whose every expert runs
 * on every token (pruning caps top-k at the count kept), every entry so capped, whatever its
 * count (their cost grows with the count alike: each token runs all of them). */
static int moe_routing(const cm_entry *e, const arch_moe *moe)
{
    return moe->top_k >= moe->n_experts ? e->top_k >= e->n_experts : e->top_k == moe->top_k;
}

/* Grid points of one part at one hidden size along one axis, sorted by x:
 *   mlp: x = ffn_dim (nonzero dense entries); with moe, x = n_experts over the MoE entries
 *        of moe's routing (moe_routing) and widths;
 *   attention with mb (a Mamba-2 mixer): x = Mamba heads over the entries of mb's shape;
 *   attention axis 0: entries with n_kv_heads == nkv, x = n_heads;
 *   attention axis 1: entries with the same group size n_heads/n_kv_heads, x = n_kv_heads.
 * ys[j] are the entry values (prefill ms, decode ms over the workload, workspace). */
static int collect(const cm_tables *t, int part, int hidden, int axis, int nh, int nkv, const arch_moe *moe,
                   const arch_mamba *mb, double *xs, double ys[3][MAX_GRID])
{
    int n = 0;
    for (int i = 0; i < t->n_prefill && n < MAX_GRID; i++) {
        const cm_entry *e = &t->prefill[i];
        if (e->part != part || e->hidden_size != hidden)
            continue;
        double x;
        if (part == CM_ATTN && mb) {
            const arch_mamba *em = &e->mamba;
            if (!em->n_heads || em->head_dim != mb->head_dim || em->d_state != mb->d_state ||
                em->n_groups != mb->n_groups || em->conv_kernel != mb->conv_kernel)
                continue;
            x = em->n_heads;
        } else if (part == CM_MLP && moe) {
            if (!e->n_experts || !moe_routing(e, moe) || e->expert_ffn_dim != moe->expert_ffn_dim ||
                e->shared_ffn_dim != moe->shared_ffn_dim || e->latent_dim != moe->latent_dim)
                continue;
            x = e->n_experts;
        } else if (part == CM_MLP) {
            if (e->ffn_dim == 0)
                continue;
            x = e->ffn_dim;
        } else if (e->n_heads == 0) {
            continue;
        } else if (axis == 0) {
            if (e->n_kv_heads != nkv)
                continue;
            x = e->n_heads;
        } else {
            if ((int64_t)e->n_heads * nkv != (int64_t)nh * e->n_kv_heads)
                continue;
            x = e->n_kv_heads;
        }
        double v[3];
        entry_values(t, e, find_decode(t, e), v);
        int k = n++;
        while (k > 0 && xs[k - 1] > x) {   /* insertion sort by x */
            xs[k] = xs[k - 1];
            for (int j = 0; j < 3; j++)
                ys[j][k] = ys[j][k - 1];
            k--;
        }
        xs[k] = x;
        for (int j = 0; j < 3; j++)
            ys[j][k] = v[j];
    }
    return n;
}

/* Part cost at an exact calibrated hidden size. 0, or -1 outside the grid. */
static int part_at_hidden(const cm_tables *t, int part, int hidden, int nh, int nkv, int ffn, const arch_moe *moe,
                          const arch_mamba *mb, double out[3])
{
    double xs[MAX_GRID], ys[3][MAX_GRID];
    if ((part == CM_ATTN && nh == 0 && !mb) || (part == CM_MLP && ffn == 0 && !moe)) {
        /* Removed: an explicit size-0 entry if calibrated, else nothing runs. */
        for (int i = 0; i < t->n_prefill; i++) {
            const cm_entry *e = &t->prefill[i];
            if (e->part == part && e->hidden_size == hidden &&
                (part == CM_ATTN ? e->n_heads == 0 && e->mamba.n_heads == 0 : e->ffn_dim == 0 && e->n_experts == 0)) {
                entry_values(t, e, find_decode(t, e), out);
                return 0;
            }
        }
        out[0] = out[1] = out[2] = 0;
        return 0;
    }
    for (int axis = 0; axis < (part == CM_ATTN && !mb ? 2 : 1); axis++) {
        int n = collect(t, part, hidden, axis, nh, nkv, moe, mb, xs, ys);
        double x = part == CM_MLP ? (moe ? moe->n_experts : ffn) : mb ? mb->n_heads : axis == 0 ? nh : nkv;
        int ok = n > 0;
        for (int j = 0; ok && j < 3; j++)
            ok = !interp(xs, ys[j], n, x, &out[j]);
        if (ok)
            return 0;
    }
    return -1;
}

void cm_insert_distinct(int *w, int *n, int max, int x)
{
    int k = 0;
    while (k < *n && w[k] < x)
        k++;
    if ((k < *n && w[k] == x) || *n >= max)
        return;
    memmove(w + k + 1, w + k, sizeof *w * (size_t)(*n - k));
    w[k] = x;
    (*n)++;
}

int cm_moe_widths(const cm_tables *t, const arch_moe *moe, int *w, int max)
{
    int n = 0;
    for (int i = 0; i < t->n_prefill; i++) {
        const cm_entry *e = &t->prefill[i];
        if (e->part == CM_MLP && e->n_experts && moe_routing(e, moe) && e->shared_ffn_dim == moe->shared_ffn_dim &&
            e->latent_dim == moe->latent_dim)
            cm_insert_distinct(w, &n, max, e->expert_ffn_dim);
    }
    return n;
}

int cm_moe_shared_widths(const cm_tables *t, const arch_moe *moe, int *w, int max)
{
    int n = 0;
    for (int i = 0; i < t->n_prefill; i++) {
        const cm_entry *e = &t->prefill[i];
        if (e->part == CM_MLP && e->n_experts && e->latent_dim == moe->latent_dim && e->shared_ffn_dim)
            cm_insert_distinct(w, &n, max, e->shared_ffn_dim);
    }
    return n;
}

int cm_moe_latents(const cm_tables *t, const arch_moe *moe, int *w, int max)
{
    int n = 0;
    for (int i = 0; moe->latent_dim && i < t->n_prefill; i++) {
        const cm_entry *e = &t->prefill[i];
        if (e->part == CM_MLP && e->n_experts && e->latent_dim)
            cm_insert_distinct(w, &n, max, e->latent_dim);
    }
    return n;
}

/* An MoE at an exact calibrated hidden size and shared width: its expert width calibrated,
 * or between two calibrated widths, interpolated linearly between them (each over the expert
 * count). */
static int moe_at_hidden(const cm_tables *t, int hidden, const arch_moe *moe, double out[3])
{
    if (part_at_hidden(t, CM_MLP, hidden, 0, 0, 0, moe, NULL, out) == 0)
        return 0;
    int w[MAX_GRID], n = cm_moe_widths(t, moe, w, MAX_GRID), x = moe->expert_ffn_dim;
    for (int i = 1; i < n; i++) {
        if (!(w[i - 1] < x && x < w[i]))
            continue;
        arch_moe a = *moe, b = *moe;
        double ya[3], yb[3], f = (double)(x - w[i - 1]) / (w[i] - w[i - 1]);
        a.expert_ffn_dim = w[i - 1];
        b.expert_ffn_dim = w[i];
        if (part_at_hidden(t, CM_MLP, hidden, 0, 0, 0, &a, NULL, ya) ||
            part_at_hidden(t, CM_MLP, hidden, 0, 0, 0, &b, NULL, yb))
            return -1;
        for (int j = 0; j < 3; j++)
            out[j] = ya[j] + f * (yb[j] - ya[j]);
        return 0;
    }
    return -1;
}

/* The MoE fields a curve runs over: the shared expert's width, or the latent. */
enum { CURVE_SHARED, CURVE_LATENT };

static int curve_field(const cm_entry *e, int f)
{
    return f == CURVE_SHARED ? e->shared_ffn_dim : e->latent_dim;
}

/* A curve over field f (CURVE_SHARED or CURVE_LATENT): the costs of entries of one MoE shape
 * (count, width and top-k, and the other field) at hidden over their values of f, at value v
 * (interpolated linearly between calibrated ones). Into out for the first shape (of latent
 * `latent` for a shared curve: the shared expert runs on every token whatever the routing)
 * that has v0 among its values and brackets v, with at0 its costs at v0. 0, or -1. */
static int moe_curve(const cm_tables *t, int hidden, int f, int latent, int v0, int v, double out[3], double at0[3])
{
    for (int i = 0; i < t->n_prefill; i++) {
        const cm_entry *r = &t->prefill[i];
        if (r->part != CM_MLP || r->hidden_size != hidden || !r->n_experts || curve_field(r, f) != v0 ||
            (f == CURVE_SHARED && r->latent_dim != latent))
            continue;
        double lo_v[3], hi_v[3];
        int lo = -1, hi = -1;   /* the calibrated values around v at r's shape */
        for (int j = 0; j < t->n_prefill; j++) {
            const cm_entry *e = &t->prefill[j];
            if (e->part != CM_MLP || e->hidden_size != hidden || e->n_experts != r->n_experts ||
                e->top_k != r->top_k || e->expert_ffn_dim != r->expert_ffn_dim ||
                curve_field(e, !f) != curve_field(r, !f))   /* !f: the other field */
                continue;
            int x = curve_field(e, f);
            if (x <= v && (lo < 0 || x > lo)) {
                lo = x;
                entry_values(t, e, find_decode(t, e), lo_v);
            }
            if (x >= v && (hi < 0 || x < hi)) {
                hi = x;
                entry_values(t, e, find_decode(t, e), hi_v);
            }
        }
        if (lo < 0 || hi < 0)
            continue;
        double fr = hi > lo ? (double)(v - lo) / (hi - lo) : 0;
        entry_values(t, r, find_decode(t, r), at0);
        for (int j = 0; j < 3; j++)
            out[j] = lo_v[j] + fr * (hi_v[j] - lo_v[j]);
        return 0;
    }
    return -1;
}

/* out = base + (at - at0): a cost carried from a calibrated shape by a measured difference;
 * the workspace (out[2]) never below 0. */
static void add_difference(double out[3], const double base[3], const double at[3], const double at0[3])
{
    for (int j = 0; j < 3; j++)
        out[j] = base[j] + at[j] - at0[j];
    if (out[2] < 0)
        out[2] = 0;
}

/* An MoE at an exact calibrated hidden size. One whose shared expert is not calibrated at
 * its count and width: the cost at a shared width that is (s0) plus the difference the
 * calibration measured between s0 and its own shared width at another routed shape (the
 * grid's: the parent's experts, cal_grid_mlp). The shared expert runs on every token beside
 * the routed ones, so its cost adds; held-out validation measures what that misses. */
static int moe_shared_at_hidden(const cm_tables *t, int hidden, const arch_moe *moe, double out[3])
{
    if (moe_at_hidden(t, hidden, moe, out) == 0)
        return 0;
    for (int i = 0; moe->shared_ffn_dim && i < t->n_prefill; i++) {
        const cm_entry *e = &t->prefill[i];
        if (e->part != CM_MLP || e->hidden_size != hidden || !e->n_experts || e->latent_dim != moe->latent_dim ||
            !e->shared_ffn_dim || e->shared_ffn_dim == moe->shared_ffn_dim)
            continue;
        arch_moe b = *moe;
        b.shared_ffn_dim = e->shared_ffn_dim;
        double base[3], at_s[3], at_s0[3];
        if (moe_at_hidden(t, hidden, &b, base) ||
            moe_curve(t, hidden, CURVE_SHARED, moe->latent_dim, e->shared_ffn_dim, moe->shared_ffn_dim, at_s, at_s0))
            continue;
        add_difference(out, base, at_s, at_s0);
        return 0;
    }
    return -1;
}

/* A part at an exact calibrated hidden size. A LatentMoE whose latent is not calibrated at its
 * count, widths and shared width: the cost at a latent that is (d0, the parent's: the grid
 * prices every shape there) plus the difference the calibration measured between d0 and its
 * latent at the parent's shape (cal_grid_mlp's latent entries). The additive form assumes the
 * latent's share of the cost does not depend on the count or width; held-out validation
 * measures what that misses. */
static int at_hidden(const cm_tables *t, int part, int hidden, int nh, int nkv, int ffn, const arch_moe *moe,
                     const arch_mamba *mb, double out[3])
{
    if (part != CM_MLP || !moe)
        return part_at_hidden(t, part, hidden, nh, nkv, ffn, moe, mb, out);
    if (moe_shared_at_hidden(t, hidden, moe, out) == 0)
        return 0;
    int lat[MAX_GRID], nl = cm_moe_latents(t, moe, lat, MAX_GRID);
    for (int i = nl - 1; i >= 0; i--) {   /* the widest first: the parent's */
        if (lat[i] == moe->latent_dim)
            continue;
        arch_moe b = *moe;
        b.latent_dim = lat[i];
        double base[3], at_d[3], at_d0[3];
        if (moe_shared_at_hidden(t, hidden, &b, base) ||
            moe_curve(t, hidden, CURVE_LATENT, 0, lat[i], moe->latent_dim, at_d, at_d0))
            continue;
        add_difference(out, base, at_d, at_d0);
        return 0;
    }
    return -1;
}

/* Sorted distinct calibrated hidden sizes (from fixed/by_hidden). */
static int hidden_sizes(const cm_tables *t, int *hs)
{
    int n = 0;
    for (int i = 0; i < t->n_fixed && n < MAX_GRID; i++) {
        int h = t->fixed[i].hidden_size, k = n++;
        while (k > 0 && hs[k - 1] > h) {
            hs[k] = hs[k - 1];
            k--;
        }
        hs[k] = h;
    }
    return n;
}

/* Bracket hidden size h: lo/hi calibrated sizes and weight w of hi (exact: lo == hi). */
static int hidden_bracket(const cm_tables *t, int h, int *lo, int *hi, double *w)
{
    int hs[MAX_GRID], n = hidden_sizes(t, hs);
    for (int i = 0; i < n; i++)
        if (hs[i] == h) {
            *lo = *hi = h;
            *w = 0;
            return 0;
        }
    for (int i = 1; i < n; i++)
        if (hs[i - 1] < h && h < hs[i]) {
            *lo = hs[i - 1];
            *hi = hs[i];
            *w = (double)(h - *lo) / (*hi - *lo);
            return 0;
        }
    return -1;
}

static const cm_fixed *fixed_at(const cm_tables *t, int h);

/* Phase scales at hidden h (interpolated between calibrated hidden sizes). */
static void scales_at(const cm_tables *t, int lo, int hi, double w, double *sp, double *sd)
{
    const cm_fixed *a = fixed_at(t, lo), *b = fixed_at(t, hi);
    double pa = a && a->prefill_scale > 0 ? a->prefill_scale : 1, pb = b && b->prefill_scale > 0 ? b->prefill_scale : 1;
    double da = a && a->decode_scale > 0 ? a->decode_scale : 1, db = b && b->decode_scale > 0 ? b->decode_scale : 1;
    *sp = pa + w * (pb - pa);
    *sd = da + w * (db - da);
}

/* cm_part_cost, cm_moe_cost: one part (moe: an MoE MLP) at a hidden size. */
static int part_cost(const cm_tables *t, int part, int hidden, int n_heads, int n_kv_heads, int ffn_dim,
                     const arch_moe *moe, const arch_mamba *mb, double *prefill_ms, double *decode_ms,
                     double *workspace_bytes)
{
    int lo, hi;
    double w, a[3], b[3], sp, sd;
    if (hidden_bracket(t, hidden, &lo, &hi, &w))
        return -1;
    scales_at(t, lo, hi, w, &sp, &sd);
    if (at_hidden(t, part, lo, n_heads, n_kv_heads, ffn_dim, moe, mb, a))
        return -1;
    if (hi != lo) {
        if (at_hidden(t, part, hi, n_heads, n_kv_heads, ffn_dim, moe, mb, b))
            return -1;
        for (int j = 0; j < 3; j++)
            a[j] += w * (b[j] - a[j]);
    }
    if (prefill_ms)
        *prefill_ms = sp * a[0];
    if (decode_ms)
        *decode_ms = sd * a[1];
    if (workspace_bytes)
        *workspace_bytes = a[2];
    return 0;
}

int cm_part_cost(const cm_tables *t, int part, int hidden, int n_heads, int n_kv_heads, int ffn_dim,
                 double *prefill_ms, double *decode_ms, double *workspace_bytes)
{
    return part_cost(t, part, hidden, n_heads, n_kv_heads, ffn_dim, NULL, NULL, prefill_ms, decode_ms,
                     workspace_bytes);
}

int cm_mamba_cost(const cm_tables *t, int hidden, const arch_mamba *mb, double *prefill_ms, double *decode_ms,
                  double *workspace_bytes)
{
    if (!mb || mb->n_heads <= 0)
        return -1;
    return part_cost(t, CM_ATTN, hidden, 0, 0, 0, NULL, mb, prefill_ms, decode_ms, workspace_bytes);
}

double cm_cache_elems(const arch *a, int B, int T, double *state)
{
    double e = 0, s = 0;
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        if (l->n_heads)
            e += 2.0 * l->n_kv_heads * a->head_dim * B * (double)T;
        if (l->mamba.n_heads)
            s += (double)B * ((l->mamba.conv_kernel - 1) * (double)arch_mamba_conv_dim(&l->mamba) +
                              (double)l->mamba.n_heads * l->mamba.head_dim * l->mamba.d_state);
    }
    if (state)
        *state = s;
    return e + s;
}

int64_t cm_cache_bytes(const cm_memory *m, const arch *a, int B, int T)
{
    double st, all = cm_cache_elems(a, B, T, &st);
    if (!(all > 0))
        return 0;
    double sb = m->state_bytes_per_elem > 0 ? m->state_bytes_per_elem : m->kv_bytes_per_elem;
    return (int64_t)llround(m->kv_bytes_per_elem * (all - st) + sb * st) + m->kv_overhead_bytes;
}

int cm_moe_cost(const cm_tables *t, int hidden, const arch_moe *moe, double *prefill_ms, double *decode_ms,
                double *workspace_bytes)
{
    if (!moe || moe->n_experts <= 0)
        return -1;
    return part_cost(t, CM_MLP, hidden, 0, 0, 0, moe, NULL, prefill_ms, decode_ms, workspace_bytes);
}

static const cm_fixed *fixed_at(const cm_tables *t, int h)
{
    for (int i = 0; i < t->n_fixed; i++)
        if (t->fixed[i].hidden_size == h)
            return &t->fixed[i];
    return NULL;
}

/* Fixed costs at hidden h (interpolated): prefill ms, decode ms over N steps, workspace. */
int cm_fixed_cost(const cm_tables *t, int hidden, double *prefill_ms, double *decode_ms, double *workspace_bytes)
{
    int lo, hi;
    double w;
    if (hidden_bracket(t, hidden, &lo, &hi, &w))
        return -1;
    const cm_fixed *a = fixed_at(t, lo), *b = fixed_at(t, hi);
    double N = t->target.output_tokens;
    double pa = a->prefill_embed_ms + a->prefill_head_ms + a->prefill_other_ms;
    double pb = b->prefill_embed_ms + b->prefill_head_ms + b->prefill_other_ms;
    double da = N * (a->decode_embed_ms + a->decode_head_ms + a->decode_other_ms);
    double db = N * (b->decode_embed_ms + b->decode_head_ms + b->decode_other_ms);
    double sp, sd;
    scales_at(t, lo, hi, w, &sp, &sd);
    if (prefill_ms)
        *prefill_ms = sp * (pa + w * (pb - pa));
    if (decode_ms)
        *decode_ms = sd * (da + w * (db - da));
    if (workspace_bytes)
        *workspace_bytes = a->workspace_bytes + w * ((double)b->workspace_bytes - a->workspace_bytes);
    return 0;
}

int cm_predict(const cm_tables *t, const arch *a, cm_prediction *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (strcmp(a->family, t->family))
        FAIL("arch family \"%s\" differs from the tables' \"%s\"", a->family, t->family);
    if (a->vocab_size != t->vocab_size || a->head_dim != t->head_dim ||
        !!a->tie_word_embeddings != !!t->tie_word_embeddings || !!a->attention_bias != !!t->attention_bias)
        FAIL("arch globals (vocab_size %d, head_dim %d, tied %d, bias %d) differ from the tables' (%d, %d, %d, %d)",
             a->vocab_size, a->head_dim, a->tie_word_embeddings, a->attention_bias, t->vocab_size, t->head_dim,
             t->tie_word_embeddings, t->attention_bias);
    int C = a->hidden_size;
    char why[160];
    if (t->width_multiple > 1 && !cm_arch_fits_block(a, t->width_multiple, why, sizeof why))
        FAIL("%s: the target's weight type (%s) stores widths in blocks of %d, so the tables do not price it",
             why, t->target.precision, t->width_multiple);
    double pre, dec, ws;
    if (cm_fixed_cost(t, C, &pre, &dec, &ws))
        FAIL("hidden_size %d lies outside the calibrated hidden sizes", C);
    double ws_max = ws, ws_attn = ws, ws_mlp = ws, kv_elems = 0;
    double B = t->target.batch_size, T = t->target.prompt_tokens + t->target.output_tokens;
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        double lp, ld, lw;
        if (l->mamba.n_heads ? cm_mamba_cost(t, C, &l->mamba, &lp, &ld, &lw)
                             : cm_part_cost(t, CM_ATTN, C, l->n_heads, l->n_kv_heads, 0, &lp, &ld, &lw)) {
            if (l->mamba.n_heads)
                FAIL("layers[%d].mamba (%d heads of %d, state %d, %d groups, conv %d) lies outside the timing tables",
                     i, l->mamba.n_heads, l->mamba.head_dim, l->mamba.d_state, l->mamba.n_groups,
                     l->mamba.conv_kernel);
            FAIL("layers[%d].attention (%d heads, %d kv heads) lies outside the timing tables", i, l->n_heads,
                 l->n_kv_heads);
        }
        pre += lp;
        dec += ld;
        ws_max = lw > ws_max ? lw : ws_max;
        ws_attn = lw > ws_attn ? lw : ws_attn;
        if (l->moe.n_experts ? cm_moe_cost(t, C, &l->moe, &lp, &ld, &lw)
                             : cm_part_cost(t, CM_MLP, C, 0, 0, l->ffn_dim, &lp, &ld, &lw)) {
            if (l->moe.n_experts)
                FAIL("layers[%d].moe (%d experts, top %d, widths %d/%d, latent %d) lies outside the timing tables", i,
                     l->moe.n_experts, l->moe.top_k, l->moe.expert_ffn_dim, l->moe.shared_ffn_dim, l->moe.latent_dim);
            FAIL("layers[%d].mlp (ffn_dim %d) lies outside the timing tables", i, l->ffn_dim);
        }
        pre += lp;
        dec += ld;
        ws_max = lw > ws_max ? lw : ws_max;
        ws_mlp = lw > ws_mlp ? lw : ws_mlp;
    }
    kv_elems = cm_cache_elems(a, (int)B, (int)T, NULL);
    p->prefill_ms = pre;
    p->decode_ms = dec;
    p->decode_ms_per_token = dec / t->target.output_tokens;
    p->latency_ms = pre + dec;
    p->throughput_tps = dec > 0 ? B * t->target.output_tokens / dec * 1000.0 : 0;
    p->params = arch_params(a);
    double embed = (double)a->vocab_size * C * (a->tie_word_embeddings ? 1 : 2);
    double ebpp = t->mem.embed_bytes_per_param > 0 ? t->mem.embed_bytes_per_param : t->mem.weight_bytes_per_param;
    p->weights = (int64_t)llround(t->mem.weight_bytes_per_param * ((double)p->params - embed) + ebpp * embed) +
                 t->mem.weight_overhead_bytes;
    p->request_cache = cm_cache_bytes(&t->mem, a, (int)B, (int)T);
    if (t->mem.workspace_combine == CM_WS_SUM_MAXIMA)
        p->prefill_workspace = (int64_t)llround(ws_attn + ws_mlp - ws);
    else
        p->prefill_workspace = (int64_t)llround(ws_max);
    p->runtime_buffers = t->mem.runtime_bytes;
    p->total = p->weights + p->request_cache + p->prefill_workspace + p->runtime_buffers;
    p->naive_bytes = (int64_t)llround(t->mem.weight_bytes_per_param * (double)p->params +
                                      t->mem.kv_bytes_per_elem * kv_elems);
    return 0;
}

json_t *cm_prediction_to_json(const cm_prediction *p)
{
    return json_pack("{s:f,s:f,s:f,s:f,s:{s:I,s:I,s:I,s:I,s:I}}", "latency_ms", p->latency_ms, "prefill_ms",
                     p->prefill_ms, "decode_ms_per_token", p->decode_ms_per_token, "throughput_tokens_per_s",
                     p->throughput_tps, "memory_bytes", "weights", (json_int_t)p->weights, "request_cache",
                     (json_int_t)p->request_cache, "prefill_workspace", (json_int_t)p->prefill_workspace,
                     "runtime_buffers", (json_int_t)p->runtime_buffers, "total", (json_int_t)p->total);
}

/* ---------- arch from a model path ---------- */

int cm_load_arch(const char *path, arch *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    size_t n = strlen(path);
    struct stat st;
    if (n > 5 && !strcmp(path + n - 5, ".json") && !stat(path, &st) && S_ISREG(st.st_mode)) {
        /* a shape alone: an arch JSON (DESIGN.md §10) or an HF config.json */
        json_t *j = hfconfig_read_json(path, err, errlen);   /* NVIDIA's configs carry Infinity */
        if (!j)
            return -1;
        int rc;
        char e2[400];
        int shape = json_object_get(j, "layers") != NULL;
        if (shape)
            rc = arch_from_json(j, a, e2, sizeof e2);
        else
            rc = hfconfig_to_arch(j, a, e2, sizeof e2);
        json_decref(j);
        if (rc)   /* which of the two it was read as: the file may be named anything */
            FAIL("%s: %s: %s", path, shape ? "not an arch (DESIGN.md §10)" : "read as an HF config (no \"layers\": "
                 "not an arch)", e2);
        return 0;
    }
    /* a model in any format: the one probe and reader of storage/modelio (weights unread) */
    mio_model m;
    if (mio_open(&m, path, NULL, err, errlen)) {
        size_t k = strlen(err);   /* a shape alone is also taken here */
        if (strstr(err, "accepted: ") && k + 1 < errlen)
            snprintf(err + k, errlen - k, "; or a shape alone: an arch .json (DESIGN.md §10) or an HF config .json");
        return -1;
    }
    int rc = arch_copy(a, &m.a);
    mio_close(&m);
    if (rc)
        FAIL("%s: out of memory copying the shape", path);
    return 0;
}

