/* api/spec.c — constraint spec v1 validation and normalization (spec.h). Each check
 * appends {pointer, message} and raises the response status by severity (403 path
 * confinement > 400 shape and types > 422 values), so one response lists every fault.
 * Limits here are sanity bounds for a single-host service, documented in openapi.yaml.
 * Server paths are confined to the roots by spec_path.c.
 */
#include "api/spec.h"
#include "api/spec_internal.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "compress/costmodel.h"
#include "compress/evaltasks.h"
#include "compress/llamacpp.h"
#include "engine/devices.h"
#include "engine/rng.h"
#include "storage/strbuf.h"
#include "storage/fileio.h"
#include "storage/fetch.h"
#include "storage/archjson.h"
#include "storage/modelio.h"


static int severity(int status)
{
    return status == 403 ? 3 : status == 400 ? 2 : 1;
}

void spec_fault(vctx *v, int status, const char *pointer, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_fault_append(v->errors, pointer, msg);
    if (!v->status || severity(status) > severity(v->status))
        v->status = status;
}

void spec_ptr_index(char *out, size_t n, const char *parent, size_t i)
{
    snprintf(out, n, "%s/%zu", parent, i);
}

/* Unknown keys of obj are 400 faults. */
void spec_only_keys(vctx *v, json_t *obj, const char *ptr, const char *const *allowed)
{
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val) {
        int ok = 0;
        for (int i = 0; allowed[i] && !ok; i++)
            ok = !strcmp(key, allowed[i]);
        if (!ok) {
            char p[512];
            json_ptr_join(p, sizeof p, ptr, key);
            spec_fault(v, 400, p, "unknown field '%s'", key);
        }
    }
}

/* Member `key` of obj when it has type `type`; NULL (and a 400 fault when present with
 * another type, or required and missing). */
json_t *spec_member(vctx *v, json_t *obj, const char *ptr, const char *key, json_type type,
                      int required)
{
    char p[512];
    json_ptr_join(p, sizeof p, ptr, key);
    json_t *m = json_object_get(obj, key);
    if (!m) {
        if (required)
            spec_fault(v, 400, p, "required field is missing");
        return NULL;
    }
    json_int_t ignored;
    int ok = json_typeof(m) == type || (type == JSON_REAL && json_is_integer(m)) ||
             (type == JSON_INTEGER && spec_json_int(m, &ignored)) || (type == JSON_TRUE && json_is_boolean(m));
    if (!ok && type == JSON_INTEGER && spec_json_big_int(m)) {   /* an integer to JSON Schema: out of range, not mistyped */
        spec_fault(v, 422, p, "%.17g is beyond the integers this field holds (magnitude below 2^53)", json_real_value(m));
        return NULL;
    }
    if (!ok) {
        const char *want = type == JSON_OBJECT ? "an object" : type == JSON_ARRAY ? "an array" :
                           type == JSON_STRING ? "a string" : type == JSON_INTEGER ? "an integer" :
                           type == JSON_REAL ? "a number" : "a boolean";
        spec_fault(v, 400, p, "must be %s", want);
        return NULL;
    }
    return m;
}

int spec_json_int(const json_t *j, json_int_t *out)
{
    if (json_is_integer(j)) {
        *out = json_integer_value(j);
        return 1;
    }
    double x = json_real_value(j);
    if (!json_is_real(j) || x != floor(x) || fabs(x) >= 9007199254740992.0)
        return 0;
    *out = (json_int_t)x;
    return 1;
}

int spec_json_big_int(const json_t *j)
{
    double x = json_real_value(j);
    return json_is_real(j) && x == floor(x) && fabs(x) >= 9007199254740992.0;
}

static double num(json_t *j)
{
    return json_is_integer(j) ? (double)json_integer_value(j) : json_real_value(j);
}

/* The value of a member that spec_member() accepted as an integer (an integer or an
 * integral real). */
static json_int_t int_value(json_t *j)
{
    json_int_t x = 0;
    (void)spec_json_int(j, &x);
    return x;
}

/* An integer member in [lo, hi]; dflt when absent; stores into out (normalized). */
static void int_field(vctx *v, json_t *obj, const char *ptr, const char *key, json_int_t lo,
                      json_int_t hi, json_int_t dflt, int required, json_t *out)
{
    json_t *m = spec_member(v, obj, ptr, key, JSON_INTEGER, required);
    if (!m) {
        if (!json_object_get(obj, key) && !required && out)
            json_object_set_new(out, key, json_integer(dflt));
        return;
    }
    json_int_t x = int_value(m);
    if (x < lo || x > hi) {
        char p[512];
        json_ptr_join(p, sizeof p, ptr, key);
        spec_fault(v, 422, p, "must be between %lld and %lld (got %lld)", (long long)lo, (long long)hi,
              (long long)x);
        return;
    }
    if (out)
        json_object_set_new(out, key, json_integer(x));
}

static int utf8_ok_len(json_t *s, size_t maxlen)
{
    /* jansson guarantees valid UTF-8; reject embedded NULs and overlong values. */
    size_t n = json_string_length(s);
    return strlen(json_string_value(s)) == n && n <= maxlen;
}

json_t *spec_string_field(vctx *v, json_t *obj, const char *ptr, const char *key, size_t maxlen,
                            int required)
{
    json_t *m = spec_member(v, obj, ptr, key, JSON_STRING, required);
    if (m && !utf8_ok_len(m, maxlen)) {
        char p[512];
        json_ptr_join(p, sizeof p, ptr, key);
        spec_fault(v, 422, p, "must be at most %zu bytes of UTF-8, without NUL bytes", maxlen);
        return NULL;
    }
    return m;
}

static int one_of(const char *s, const char *const *list)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(s, list[i]))
            return 1;
    return 0;
}

/* ---- paths ------------------------------------------------------------------------- */

/* A path-valued string member: resolved and stored into out[key]. want_file: it must
 * name a regular file (never a FIFO or device, which could block the reader). */
void spec_path_field(vctx *v, json_t *obj, const char *ptr, const char *key, int required, int want_file,
                       json_t *out)
{
    json_t *m = spec_string_field(v, obj, ptr, key, 3000, required);
    if (!m)
        return;
    char p[512], resolved[4096], msg[256];
    json_ptr_join(p, sizeof p, ptr, key);
    int rc = spec_resolve_path(v->env, json_string_value(m), resolved, sizeof resolved, msg, sizeof msg);
    if (rc) {
        spec_fault(v, rc, p, "%s", msg);
        return;
    }
    const char *kind = want_file ? spec_file_kind(resolved) : NULL;
    if (kind) {
        spec_fault(v, 422, p, "not a regular file (%s)", kind);
        return;
    }
    json_object_set_new(out, key, json_string(resolved));
}

/* The device `name` as a live runner sharing the store offers it (a worker agent on
 * another host: storage/store.h's runners registry), and in *llamacpp whether a runner
 * with that device also has llama.cpp. A NEW reference, or NULL when none offers it. */
static json_t *fleet_device(vctx *v, const char *name, int *llamacpp)
{
    *llamacpp = 0;
    json_t *runners = v->env->st ? store_runners(v->env->st, store_now() - STORE_RUNNER_FRESH_S) : NULL;
    json_t *found = NULL, *r, *d, *e;
    size_t i, k, m;
    json_array_foreach(runners, i, r) {
        json_t *info = json_object_get(r, "info");
        json_array_foreach(json_object_get(info, "devices"), k, d) {
            if (!json_is_string(json_object_get(d, "id")) || strcmp(json_string_value(json_object_get(d, "id")), name))
                continue;
            if (!found)
                found = json_incref(d);
            json_array_foreach(json_object_get(info, "engines"), m, e)
                *llamacpp |= json_is_string(e) && !strcmp(json_string_value(e), CM_ENGINE_LLAMACPP);
        }
    }
    json_decref(runners);
    return found;
}

/* 1 when the engine of a (valid) target can run on device: the built-in engine always,
 * llama.cpp when its helper answers here (lc_probe, cached once it has) or a runner
 * sharing the store has it with that device. Else a 422 at /target/engine with the
 * reason, so that no job or calibration queues for an engine that cannot run. The one
 * presence check of every route that takes a target. */
static int engine_present(vctx *v, const char *engine, const char *device)
{
    if (strcmp(engine, CM_ENGINE_LLAMACPP))
        return 1;
    lc_info info;
    char err[512];
    if (lc_probe(&info, err, sizeof err) == 0)
        return 1;
    int fleet = 0;
    json_decref(fleet_device(v, device, &fleet));
    if (fleet)
        return 1;
    spec_fault(v, 422, "/target/engine", "%s; no worker agent sharing the store has it either", err);
    return 0;
}

/* The serving engine of target t: engine, precision, kv_cache_type and threads checked
 * together by cm_engine_check (the one vocabulary of valid combinations; a fault names
 * /target/<field>), then the engine's presence. Fills out with the engine always and
 * its defaults: precision fp32 (autocompress), f16 weights and KV cache (llama.cpp),
 * threads when given. */
static void check_engine(vctx *v, json_t *t, json_t *out, const char *device)
{
    json_t *eng = spec_string_field(v, t, "/target", "engine", 64, 0);
    json_t *prec = spec_string_field(v, t, "/target", "precision", 64, 0);
    json_t *kv = spec_string_field(v, t, "/target", "kv_cache_type", 64, 0);
    json_t *th = spec_member(v, t, "/target", "threads", JSON_INTEGER, 0);
    json_t *fa = spec_string_field(v, t, "/target", "flash_attention", 16, 0);
    if (json_object_get(t, "engine_build"))
        spec_fault(v, 422, "/target/engine_build", "read-only: the server sets it to the build of the engine that measures");
    static const char *const fields[] = {"engine", "precision", "kv_cache_type", "threads", "flash_attention", NULL};
    json_t *got[] = {eng, prec, kv, th, fa};
    for (int i = 0; fields[i]; i++)
        if (json_object_get(t, fields[i]) && !got[i])
            return;   /* a shape fault already reported: the combination means nothing */
    const char *engine = eng ? json_string_value(eng) : CM_ENGINE_AUTOCOMPRESS;
    if (!*engine) {   /* the C target's "" means autocompress; a request names an engine */
        spec_fault(v, 422, "/target/engine", "must name an engine (autocompress, llama.cpp)");
        return;
    }
    json_int_t x = th ? int_value(th) : -1;
    int threads = !th ? -1 : x < 0 ? 0 : x > 1025 ? 1025 : (int)x;
    const char *field;
    char why[256], at[64];
    if (cm_engine_check(engine, device, prec ? json_string_value(prec) : NULL, kv ? json_string_value(kv) : NULL, threads,
                        fa ? json_string_value(fa) : NULL, &field, why, sizeof why)) {
        snprintf(at, sizeof at, "/target/%s", field);
        if (!strcmp(field, "threads") && x != threads && !strcmp(engine, CM_ENGINE_LLAMACPP))
            snprintf(why, sizeof why, "%lld threads: must be 1..1024 (omit it for every online CPU)", (long long)x);
        spec_fault(v, 422, at, "%s", why);
        return;
    }
    int llama = !strcmp(engine, CM_ENGINE_LLAMACPP);
    json_object_set_new(out, "engine", json_string(llama ? CM_ENGINE_LLAMACPP : CM_ENGINE_AUTOCOMPRESS));
    const char *dflt = llama ? CM_LLAMACPP_DEFAULT_PRECISION : CM_AUTOCOMPRESS_DEFAULT_PRECISION;
    json_object_set_new(out, "precision", json_string(prec ? json_string_value(prec) : dflt));
    if (llama) {
        const char *kvt = kv ? json_string_value(kv) : CM_LLAMACPP_DEFAULT_KV_TYPE;
        json_object_set_new(out, "kv_cache_type", json_string(kvt));
        json_object_set_new(out, "flash_attention",
                            json_string(fa ? json_string_value(fa) : cm_llamacpp_default_flash(kvt)));
        if (th)
            json_object_set_new(out, "threads", json_integer(threads));
    }
    engine_present(v, llama ? CM_ENGINE_LLAMACPP : CM_ENGINE_AUTOCOMPRESS, device);
}

static json_t *check_target(vctx *v, json_t *in, double *device_gib)
{
    json_t *out = json_object();
    json_t *t = spec_member(v, in, "", "target", JSON_OBJECT, 0);
    json_t *empty = json_object();
    if (!t)
        t = empty;
    static const char *const keys[] = {"device", "engine", "precision", "kv_cache_type", "threads",
                                       "flash_attention", "engine_build", "workload", NULL};
    spec_only_keys(v, t, "/target", keys);
    json_t *dev = spec_string_field(v, t, "/target", "device", 31, 0);
    const char *device = dev ? json_string_value(dev) : "cpu";
    char name[40];
    snprintf(name, sizeof name, "%s", device);
    char why[256] = "";
    *device_gib = 0;
    json_t *remote = NULL;   /* the device as a worker agent on another host offers it */
    int fleet_llamacpp, local = 0;
    if (!json_object_get(t, "device") || dev) {
        /* its one name, the one runners claim by: "cuda" and "cuda:00" are cuda:0 */
        if (eng_device_name(device, name, sizeof name, why, sizeof why) < 0) {
            spec_fault(v, 422, "/target/device", "unknown device '%s': %s", device, why);
        } else if ((local = eng_device_exists(name, why, sizeof why))) {
            int n = eng_device_count();
            for (int i = 0; i < n; i++) {
                eng_device_info info;
                if (eng_device_get(i, &info) == 0 && !strcmp(info.name, name))
                    *device_gib = (double)info.memory_bytes / (1024.0 * 1024 * 1024);
            }
        } else if ((remote = fleet_device(v, name, &fleet_llamacpp))) {
            *device_gib = (double)json_integer_value(json_object_get(remote, "memory_bytes")) / (1024.0 * 1024 * 1024);
            why[0] = 0;
        } else {
            spec_fault(v, 422, "/target/device", "unknown device '%s': %s; no worker agent sharing the store offers it",
                  device, why);
        }
    }
    json_object_set_new(out, "device", json_string(name));
    check_engine(v, t, out, name);
    json_t *prec = json_object_get(out, "precision"), *eng = json_object_get(out, "engine");
    if (!why[0] && prec && eng && !strcmp(json_string_value(eng), CM_ENGINE_AUTOCOMPRESS)) {
        const char *p = json_string_value(prec);
        int offered = 0;
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(remote, "precisions"), i, x) offered |= !strcmp(json_string_value(x), p);
        if (remote && !offered)
            spec_fault(v, 422, "/target/precision", "%s on %s: the worker agents that have it offer only the precisions "
                  "of /v1/devices", p, name);
        else if (!remote && eng_device_precision(name, p, why, sizeof why))
            spec_fault(v, 422, "/target/precision", "%s on %s: %s", p, name, why);
    }
    json_decref(remote);
    json_t *w = spec_member(v, t, "/target", "workload", JSON_OBJECT, 0);
    json_t *wo = json_object();
    if (!w)
        w = empty;
    static const char *const wkeys[] = {"batch_size", "prompt_tokens", "output_tokens", NULL};
    spec_only_keys(v, w, "/target/workload", wkeys);
    int_field(v, w, "/target/workload", "batch_size", 1, 4096, CM_DEFAULT_BATCH, 0, wo);
    int_field(v, w, "/target/workload", "prompt_tokens", 1, 1 << 20, CM_DEFAULT_PROMPT_TOKENS, 0, wo);
    int_field(v, w, "/target/workload", "output_tokens", 1, 1 << 20, CM_DEFAULT_OUTPUT_TOKENS, 0, wo);
    json_t *pt = json_object_get(wo, "prompt_tokens"), *ot = json_object_get(wo, "output_tokens");
    if (pt && ot && json_integer_value(pt) + json_integer_value(ot) > (1 << 20))
        spec_fault(v, 422, "/target/workload", "prompt_tokens + output_tokens exceeds 1048576");
    json_t *bs = json_object_get(wo, "batch_size");
    if (eng && bs && cm_batch_check(json_string_value(eng), (int)json_integer_value(bs), why, sizeof why))
        spec_fault(v, 422, "/target/workload/batch_size", "%s", why);
    json_object_set_new(out, "workload", wo);
    json_decref(empty);
    return out;
}

static json_t *check_constraints(vctx *v, json_t *in, double device_gib)
{
    json_t *c = spec_member(v, in, "", "constraints", JSON_OBJECT, 1);
    json_t *out = json_object();
    if (!c)
        return out;
    static const char *const keys[] = {"latency_ms", "throughput_tokens_per_s", "memory_gib", "params", "margin_pct",
                                       "served_check", NULL};
    spec_only_keys(v, c, "/constraints", keys);
    int any = 0;
    for (int i = 0; i < 3; i++) {
        json_t *m = spec_member(v, c, "/constraints", keys[i], JSON_REAL, 0);
        if (!m)
            continue;
        any = 1;
        double x = num(m);
        char p[128];
        json_ptr_join(p, sizeof p, "/constraints", keys[i]);
        if (!(x > 0) || !isfinite(x) || x > 1e9) {
            spec_fault(v, 422, p, "must be a positive number no larger than 1e9");
            continue;
        }
        if (i == 2 && device_gib > 0 && x > device_gib)
            spec_fault(v, 422, p, "%.3g GiB exceeds the target device's memory (%.3g GiB)", x, device_gib);
        json_object_set_new(out, keys[i], json_real(x));
    }
    json_t *pm = spec_member(v, c, "/constraints", "params", JSON_INTEGER, 0);
    if (pm) {
        any = 1;
        if (int_value(pm) < 1)
            spec_fault(v, 422, "/constraints/params", "must be a positive integer");
        else
            json_object_set_new(out, "params", json_integer(int_value(pm)));
    }
    json_t *mg = spec_member(v, c, "/constraints", "margin_pct", JSON_REAL, 0);
    if (mg) {
        double x = num(mg);
        if (!(x >= 0 && x <= 50))
            spec_fault(v, 422, "/constraints/margin_pct", "must be between 0 and 50 (percent of each measured limit)");
        else
            json_object_set_new(out, "margin_pct", json_real(x));
    }
    json_t *sc = spec_member(v, c, "/constraints", "served_check", JSON_TRUE, 0);
    if (sc)
        json_object_set_new(out, "served_check", json_boolean(json_is_true(sc)));
    if (!any && (json_object_size(c) == 0 || mg || sc))
        spec_fault(v, 422, "/constraints", "give at least one of latency_ms, throughput_tokens_per_s, memory_gib, params");
    return out;
}

static json_t *check_search_space(vctx *v, json_t *in)
{
    static const char *const keys[] = {"hidden",      "heads",       "ffn",   "experts", "expert_widths",
                                       "shared_expert_widths", "latent_widths", "mamba_heads", "depth", NULL};
    json_t *s = spec_member(v, in, "", "search_space", JSON_OBJECT, 0);
    json_t *out = json_object();
    if (s)
        spec_only_keys(v, s, "/search_space", keys);
    int any = 0;
    for (int i = 0; keys[i]; i++) {
        json_t *b = s ? spec_member(v, s, "/search_space", keys[i], JSON_TRUE, 0) : NULL;
        int on = b ? json_is_true(b) : 1;
        any |= on;
        json_object_set_new(out, keys[i], json_boolean(on));
    }
    if (!any)
        spec_fault(v, 422, "/search_space", "every axis is switched off: nothing could be pruned");
    return out;
}

static json_t *check_budgets(vctx *v, json_t *in)
{
    json_t *b = spec_member(v, in, "", "budgets", JSON_OBJECT, 0);
    json_t *empty = json_object(), *out = json_object();
    static const char *const keys[] = {"search_tokens", "distill_tokens", NULL};
    spec_only_keys(v, b ? b : empty, "/budgets", keys);
    int_field(v, b ? b : empty, "/budgets", "search_tokens", 1, 1000000000000LL, 2000000, 0, out);
    int_field(v, b ? b : empty, "/budgets", "distill_tokens", 0, 1000000000000LL, 10000000, 0, out);
    json_decref(empty);
    return out;
}

/* pruning: {reconstruct} — least-squares reconstruction of the slice. Unless told, on
 * only when nothing is distilled after it (budgets already normalized): measured on
 * SmolLM2, it lowers the pruned-only perplexity and the distilled one rises
 * (bench/results/prune_recovery.md). */
static json_t *check_pruning(vctx *v, json_t *in, json_t *budgets)
{
    static const char *const keys[] = {"reconstruct", NULL};
    json_t *p = spec_member(v, in, "", "pruning", JSON_OBJECT, 0);
    if (p)
        spec_only_keys(v, p, "/pruning", keys);
    json_t *r = p ? spec_member(v, p, "/pruning", "reconstruct", JSON_TRUE, 0) : NULL;
    int distilled = json_integer_value(json_object_get(budgets, "distill_tokens")) > 0;
    return json_pack("{s:b}", "reconstruct", r ? json_is_true(r) : !distilled);
}

/* data: the calibration text is required (text_read: the job's stages read it: rank,
 * search, reconstruction and, without its own text, distillation), so that a job without it
 * is refused here and not at its rank stage, after its calibration. */
static json_t *check_data(vctx *v, json_t *in, int text_read)
{
    json_t *d = spec_member(v, in, "", "data", JSON_OBJECT, 0);
    json_t *out = json_object();
    if (text_read && !json_object_get(d, "calibration"))
        spec_fault(v, 422, "/data/calibration", "required: the job ranks, searches and distils on this text");
    if (!d)
        return out;
    static const char *const keys[] = {"calibration", "distillation", NULL};
    spec_only_keys(v, d, "/data", keys);
    spec_path_field(v, d, "/data", "calibration", 0, 1, out);
    spec_path_field(v, d, "/data", "distillation", 0, 1, out);
    return out;
}

static const char *const known_tasks[] = {"arc_easy", "arc_challenge", "piqa", "hellaswag", "winogrande",
                                          "boolq", "openbookqa", "lambada_openai", "mmlu", "sciq",
                                          "wikitext2", NULL};

/* The name a normalized evaluation task goes by: a benchmark's own, or a user task's. */
static const char *task_name(json_t *t)
{
    return json_is_string(t) ? json_string_value(t) : json_string_value(json_object_get(t, "name"));
}

static json_t *check_evaluation(vctx *v, json_t *in)
{
    json_t *e = spec_member(v, in, "", "evaluation", JSON_OBJECT, 0);
    json_t *empty = json_object(), *out = json_object();
    if (!e)
        e = empty;
    static const char *const keys[] = {"tasks", "limit", "seed", "pruned", NULL};
    spec_only_keys(v, e, "/evaluation", keys);
    json_t *tasks = spec_member(v, e, "/evaluation", "tasks", JSON_ARRAY, 0);
    json_t *tout = json_array();
    size_t i;
    json_t *t;
    if (tasks && json_array_size(tasks) > 64)
        spec_fault(v, 422, "/evaluation/tasks", "at most 64 tasks");
    else if (tasks) {
        json_array_foreach(tasks, i, t) {
            char p[128];
            spec_ptr_index(p, sizeof p, "/evaluation/tasks", i);
            if (json_is_string(t)) {
                if (!one_of(json_string_value(t), known_tasks))
                    spec_fault(v, 422, p, "unknown task '%s' (known: arc_easy, arc_challenge, piqa, hellaswag, "
                                     "winogrande, boolq, openbookqa, lambada_openai, mmlu, sciq, wikitext2; "
                                     "or {\"name\", \"path\"} for a JSONL task)", json_string_value(t));
                else
                    json_array_append(tout, t);
            } else if (json_is_object(t)) {
                static const char *const tk[] = {"name", "path", NULL};
                spec_only_keys(v, t, p, tk);
                json_t *to = json_object();
                json_t *nm = spec_string_field(v, t, p, "name", EV_TASK_NAME_MAX, 1);
                if (nm)
                    json_object_set(to, "name", nm);
                spec_path_field(v, t, p, "path", 1, 1, to);
                const char *rp = json_string_value(json_object_get(to, "path"));
                if (rp && !fio_has_suffix(rp, ".jsonl")) {   /* the evaluator knows a task file by it */
                    char pp[160];
                    json_ptr_join(pp, sizeof pp, p, "path");
                    spec_fault(v, 422, pp, "a task file is JSON Lines named *.jsonl (as the file it resolves to is "
                                      "named: links are followed)");
                }
                json_array_append_new(tout, to);
            } else {
                spec_fault(v, 400, p, "must be a task name or an object {name, path}");
            }
        }
        /* results are keyed by the task's name: two tasks of one name would be one */
        for (size_t a = 0; a < json_array_size(tout); a++)
            for (size_t b = a + 1; b < json_array_size(tout); b++) {
                const char *na = task_name(json_array_get(tout, a)), *nb = task_name(json_array_get(tout, b));
                if (na && nb && !strcmp(na, nb)) {
                    char p[128];
                    spec_ptr_index(p, sizeof p, "/evaluation/tasks", b);
                    spec_fault(v, 422, p, "duplicate task name '%s' (results are keyed by name)", nb);
                }
            }
    }
    json_object_set_new(out, "tasks", tout);
    int_field(v, e, "/evaluation", "limit", 1, 10000000, 500, 0, out);
    int_field(v, e, "/evaluation", "seed", 0, INT32_MAX, ENG_DEFAULT_SEED, 0, out);
    json_t *pr = spec_member(v, e, "/evaluation", "pruned", JSON_TRUE, 0);
    json_object_set_new(out, "pruned", json_boolean(pr && json_is_true(pr)));
    json_decref(empty);
    return out;
}

static json_t *check_export(vctx *v, json_t *in)
{
    json_t *e = spec_member(v, in, "", "export", JSON_ARRAY, 0);
    json_t *out = json_array();
    if (!e) {
        if (!json_object_get(in, "export"))
            json_array_append_new(out, json_string("hf"));
        return out;
    }
    static const char *const formats[] = {"hf", "deci", "gguf", NULL};
    size_t i;
    json_t *f;
    json_array_foreach(e, i, f) {
        char p[64];
        spec_ptr_index(p, sizeof p, "/export", i);
        if (!json_is_string(f)) {
            spec_fault(v, 400, p, "must be a string");
            continue;
        }
        if (!one_of(json_string_value(f), formats)) {
            spec_fault(v, 422, p, "unknown export format '%s' (hf, deci, gguf)", json_string_value(f));
            continue;
        }
        for (size_t k = 0; k < json_array_size(out); k++)
            if (json_equal(json_array_get(out, k), f))
                spec_fault(v, 422, p, "duplicate export format");
        json_array_append(out, f);
    }
    return out;
}

static json_t *check_metadata(vctx *v, json_t *in)
{
    json_t *m = spec_member(v, in, "", "metadata", JSON_OBJECT, 0);
    json_t *out = json_object();
    if (!m)
        return out;
    if (json_object_size(m) > 16)
        spec_fault(v, 422, "/metadata", "at most 16 pairs (got %zu)", json_object_size(m));
    const char *k;
    json_t *val;
    json_object_foreach(m, k, val) {
        char p[512];
        json_ptr_join(p, sizeof p, "/metadata", k);
        if (strlen(k) == 0 || strlen(k) > 64)
            spec_fault(v, 422, p, "keys are 1 to 64 bytes of UTF-8");
        else if (!json_is_string(val))
            spec_fault(v, 400, p, "must be a string");
        else if (!utf8_ok_len(val, 512))
            spec_fault(v, 422, p, "values are at most 512 bytes of UTF-8, without NUL bytes");
        else
            json_object_set(out, k, val);
    }
    return out;
}

static void check_test_fields(vctx *v, json_t *in, json_t *out)
{
    static const char *const tk[] = {"x_test_pipeline", "x_test_sleep_ms", "x_test_artifact_bytes",
                                     "x_test_fail_message", NULL};
    int any = 0;
    for (int i = 0; tk[i]; i++)
        any |= json_object_get(in, tk[i]) != NULL;
    if (!any)
        return;
    if (!v->env->test_stages) {
        for (int i = 0; tk[i]; i++)
            if (json_object_get(in, tk[i])) {
                char p[64];
                json_ptr_join(p, sizeof p, "", tk[i]);
                spec_fault(v, 400, p, "unknown field '%s'", tk[i]);
            }
        return;
    }
    json_t *pl = spec_member(v, in, "", "x_test_pipeline", JSON_ARRAY, 0);
    if (pl) {
        if (json_array_size(pl) < 1 || json_array_size(pl) > 16)
            spec_fault(v, 422, "/x_test_pipeline", "1 to 16 stage names");
        size_t i;
        json_t *s;
        json_array_foreach(pl, i, s) {
            char p[64];
            spec_ptr_index(p, sizeof p, "/x_test_pipeline", i);
            if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) > 40)
                spec_fault(v, 400, p, "must be a stage name");
        }
        json_object_set(out, "x_test_pipeline", pl);
    }
    int_field(v, in, "", "x_test_sleep_ms", 0, 600000, 0, 0, NULL);
    int_field(v, in, "", "x_test_artifact_bytes", 0, 256 << 20, 0, 0, NULL);
    json_t *msg = spec_string_field(v, in, "", "x_test_fail_message", 4000, 0);
    if (msg)
        json_object_set(out, "x_test_fail_message", msg);
    for (int i = 1; tk[i]; i++) {
        json_t *x = json_object_get(in, tk[i]);
        if (json_is_integer(x))
            json_object_set(out, tk[i], x);
    }
}

static void check_name(vctx *v, json_t *in, json_t *out)
{
    json_t *n = spec_string_field(v, in, "", "name", 128, 0);
    json_object_set_new(out, "name", json_string(n ? json_string_value(n) : ""));
}

static json_t *finish(vctx *v, json_t *out, int *status, json_t **errors)
{
    if (json_array_size(v->errors) > 0 || v->status) {   /* a fault counts even if listing it ran out of memory */
        json_decref(out);
        *status = v->status;
        *errors = v->errors;
        return NULL;
    }
    json_decref(v->errors);
    *status = 0;
    *errors = NULL;
    return out;
}

json_t *spec_validate(json_t *in, const spec_env *env, int *status, json_t **errors)
{
    vctx v = {json_array(), 0, env};
    json_t *out = json_object();
    if (!json_is_object(in)) {
        spec_fault(&v, 400, "", "the spec must be a JSON object");
        return finish(&v, out, status, errors);
    }
    static const char *const keys[] = {"name", "model", "target", "constraints", "method", "search_space",
                                       "pruning", "budgets", "seed", "data", "evaluation", "export",
                                       "callback_url", "metadata", "x_test_pipeline", "x_test_sleep_ms",
                                       "x_test_artifact_bytes", "x_test_fail_message", NULL};
    spec_only_keys(&v, in, "", keys);
    check_name(&v, in, out);
    json_object_set_new(out, "model", spec_check_model(&v, in));
    double device_gib = 0;
    json_object_set_new(out, "target", check_target(&v, in, &device_gib));
    json_object_set_new(out, "constraints", check_constraints(&v, in, device_gib));
    json_t *method = spec_string_field(&v, in, "", "method", 32, 0);
    static const char *const methods[] = {"autocompress", "minitron", NULL};
    if (method && !one_of(json_string_value(method), methods))
        spec_fault(&v, 422, "/method", "must be autocompress or minitron");
    json_object_set_new(out, "method", json_string(method ? json_string_value(method) : "autocompress"));
    json_object_set_new(out, "search_space", check_search_space(&v, in));
    json_object_set_new(out, "budgets", check_budgets(&v, in));
    json_object_set_new(out, "pruning", check_pruning(&v, in, json_object_get(out, "budgets")));
    /* the search's and distillation's draws (DNAS samples, Minitron++ trials' and the final
     * distillation's text order): another seed repeats the job as an independent run */
    int_field(&v, in, "", "seed", 1, INT32_MAX, ENG_DEFAULT_SEED, 0, out);
    json_object_set_new(out, "data", check_data(&v, in, !json_object_get(in, "x_test_pipeline")));
    json_object_set_new(out, "evaluation", check_evaluation(&v, in));
    json_object_set_new(out, "export", check_export(&v, in));
    if (!json_object_get(in, "x_test_pipeline"))   /* a test pipeline reads no text and serves nothing */
        spec_check_model_use(&v, in, out);
    if (json_object_get(in, "callback_url")) {
        json_t *cb = spec_string_field(&v, in, "", "callback_url", 2048, 0);
        const char *u = cb ? json_string_value(cb) : NULL;
        int url_ok = u && (!strncmp(u, "http://", 7) || !strncmp(u, "https://", 8)) && strlen(u) > 8;
        for (const char *p = u; url_ok && *p; p++)
            url_ok = (unsigned char)*p > 0x20 && (unsigned char)*p < 0x7f;
        const char *host = url_ok ? u + (u[4] == 's' ? 8 : 7) : NULL;
        if (cb && !url_ok)
            spec_fault(&v, 422, "/callback_url", "must be an http:// or https:// URL without spaces");
        else if (cb && memchr(host, '@', strcspn(host, "/?#")))   /* the spec is shown to every reader */
            spec_fault(&v, 422, "/callback_url", "credentials in the URL (user@host) are refused: they would be stored and "
                                            "shown with the job (the receiver verifies the webhook-signature header)");
        else if (cb && !env->webhooks)
            spec_fault(&v, 422, "/callback_url", "webhook delivery is off on this server (start it with --webhook-secret-file)");
        else if (cb && !env->webhook_private_hosts && fetch_url_host_non_public(u))
            spec_fault(&v, 422, "/callback_url", "names a loopback, private or link-local address: this server delivers "
                                            "webhooks to public addresses only (start it with "
                                            "--allow-private-webhook-hosts to allow its own network)");
        else if (cb)
            json_object_set(out, "callback_url", cb);
    }
    json_object_set_new(out, "metadata", check_metadata(&v, in));
    check_test_fields(&v, in, out);
    return finish(&v, out, status, errors);
}

/* Exactly one of in.model (checked as for jobs) and in.arch (an arch document, DESIGN.md
 * §10), into out: what estimates and calibrations are made of. */
static void check_model_or_arch(vctx *v, json_t *in, json_t *out)
{
    json_t *aj = json_object_get(in, "arch");
    if (!!aj == !!json_object_get(in, "model")) {
        spec_fault(v, 422, "", "give exactly one of \"arch\" and \"model\"");
    } else if (aj) {
        arch a;
        char e2[400];
        if (!json_is_object(aj))
            spec_fault(v, 400, "/arch", "must be an object");
        else if (arch_from_json(aj, &a, e2, sizeof e2)) {
            /* "/pointer: message" from the arch reader becomes a pointer under /arch */
            const char *sep = e2[0] == '/' ? strstr(e2, ": ") : NULL;
            char at[200];
            snprintf(at, sizeof at, "/arch%.*s", sep ? (int)(sep - e2) : 0, e2);
            spec_fault(v, 422, at, "%s", sep ? sep + 2 : e2);
        } else {
            arch_free(&a);
            json_object_set(out, "arch", aj);
        }
    } else {
        json_object_set_new(out, "model", spec_check_model(v, in));
    }
}

json_t *spec_validate_estimate(json_t *in, const spec_env *env, int *status, json_t **errors)
{
    vctx v = {json_array(), 0, env};
    json_t *out = json_object();
    if (!json_is_object(in)) {
        spec_fault(&v, 400, "", "the request must be a JSON object");
        return finish(&v, out, status, errors);
    }
    static const char *const keys[] = {"model", "arch", "target", NULL};
    spec_only_keys(&v, in, "", keys);
    check_model_or_arch(&v, in, out);
    if (!json_object_get(in, "target"))
        spec_fault(&v, 400, "/target", "required field is missing");
    double device_gib = 0;
    json_object_set_new(out, "target", check_target(&v, in, &device_gib));
    return finish(&v, out, status, errors);
}

json_t *spec_validate_calibration(json_t *in, const spec_env *env, int *status, json_t **errors)
{
    vctx v = {json_array(), 0, env};
    json_t *out = json_object();
    if (!json_is_object(in)) {
        spec_fault(&v, 400, "", "the request must be a JSON object");
        return finish(&v, out, status, errors);
    }
    static const char *const keys[] = {"name", "model", "arch", "target", "metadata", "x_test_pipeline",
                                       "x_test_sleep_ms", "x_test_artifact_bytes", "x_test_fail_message", NULL};
    spec_only_keys(&v, in, "", keys);
    check_name(&v, in, out);
    check_model_or_arch(&v, in, out);
    double device_gib = 0;
    json_object_set_new(out, "target", check_target(&v, in, &device_gib));
    json_object_set_new(out, "metadata", check_metadata(&v, in));
    check_test_fields(&v, in, out);
    return finish(&v, out, status, errors);
}
