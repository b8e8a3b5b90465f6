/* api/spec_model.c — the model a spec names (spec_internal.h): by server path (its
 * files confined to the roots, its format probed), by registered id, or by the url and
 * sha-256 it was registered with; and what a job asks of it, checked when the job is
 * submitted rather than when a stage fails: a tokenizer, a context that holds the
 * workload, exports that can hold its family.
 */
#include "api/spec_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/costmodel.h"
#include "storage/modelio.h"
#include "storage/strbuf.h"

const char *spec_model_format(const char *resolved, char *why, size_t whylen)
{
    mio_format f;
    char err[1024];
    if (mio_probe(resolved, &f, err, sizeof err)) {
        /* the resolved path is the server's business: name the file by its last component */
        const char *colon = strstr(err, ": ");
        const char *slash = strrchr(resolved, '/');
        snprintf(why, whylen, "%s%s", slash ? slash + 1 : resolved, colon ? colon : err);
        return NULL;
    }
    return mio_format_name(f);
}

/* A model named by server path: obj.path (a model in a format the probe knows) and
 * obj.tokenizer (a regular file), resolved into out with the format. */
static void model_path(vctx *v, json_t *obj, const char *ptr, json_t *out)
{
    spec_path_field(v, obj, ptr, "path", 1, 0, out);
    spec_path_field(v, obj, ptr, "tokenizer", 0, 1, out);
    json_t *p = json_object_get(out, "path");
    char why[1024], at[256], bad[256];
    json_ptr_join(at, sizeof at, ptr, "path");
    /* the loader reads a model's files by name, links followed: none may lead out */
    if (p && spec_model_confined(v->env, json_string_value(p), bad, sizeof bad)) {
        spec_fault(v, 403, at, "the model's file %s is a link that leads outside the allowed roots (see --data-root)",
              bad);
        return;
    }
    const char *fmt = p ? spec_model_format(json_string_value(p), why, sizeof why) : NULL;
    if (p && !fmt)
        spec_fault(v, 422, at, "%s", why);
    else if (fmt)
        json_object_set_new(out, "format", json_string(fmt));
}

void spec_check_model_path(const spec_env *env, json_t *obj, const char *ptr, json_t *out, json_t *errors,
                           int *status)
{
    vctx v = {errors, *status, env};
    model_path(&v, obj, ptr, out);
    *status = v.status;
}

/* ---- sections ---------------------------------------------------------------------- */

/* A registered model a job can use: ready (a URL model still fetching or failed is a
 * 422 naming its state). 1 usable, 0 not (fault recorded at ptr). */
static int model_usable(vctx *v, const store_model *sm, const char *ptr)
{
    if (!sm->status[0] || !strcmp(sm->status, "ready"))
        return 1;
    if (!strcmp(sm->status, "fetching")) {
        if (sm->bytes_total > 0)
            spec_fault(v, 422, ptr, "model %s is still fetching (%lld of %lld bytes); retry when its status is ready",
                  sm->id, (long long)sm->bytes_done, (long long)sm->bytes_total);
        else
            spec_fault(v, 422, ptr, "model %s is still fetching (%lld bytes so far); retry when its status is ready",
                  sm->id, (long long)sm->bytes_done);
    } else {
        spec_fault(v, 422, ptr, "model %s failed to fetch: %.300s (register its url again to retry)", sm->id, sm->error);
    }
    return 0;
}

/* The normalized model reference of a registered model into out. */
static void model_ref_out(json_t *out, const store_model *sm)
{
    json_object_set_new(out, "id", json_string(sm->id));
    json_object_set_new(out, "path", json_string(sm->path));
    if (sm->tokenizer[0])
        json_object_set_new(out, "tokenizer", json_string(sm->tokenizer));
    json_object_set_new(out, "format", json_string(sm->format));
}

json_t *spec_check_model(vctx *v, json_t *in)
{
    json_t *m = spec_member(v, in, "", "model", JSON_OBJECT, 1);
    if (!m)
        return NULL;
    json_t *out = json_object();
    int has_path = json_object_get(m, "path") != NULL, has_id = json_object_get(m, "id") != NULL,
        has_url = json_object_get(m, "url") != NULL;
    if (has_path + has_id + has_url != 1) {
        spec_fault(v, 422, "/model", "give exactly one of path, id or url");
        return out;
    }
    if (has_url) {
        /* a URL is fetched by registering it (POST /v1/models, in the background); a job
         * may name it by URL + sha256 once that model is ready */
        static const char *const keys[] = {"url", "sha256", NULL};
        spec_only_keys(v, m, "/model", keys);
        json_t *url = spec_string_field(v, m, "/model", "url", 2048, 1);
        json_t *sha = spec_string_field(v, m, "/model", "sha256", 64, 0);
        if (!url)
            return out;
        char hex[65] = "";
        const char *sv = sha ? json_string_value(sha) : "";
        if (strlen(sv) == 64 && strspn(sv, "0123456789abcdefABCDEF") == 64) {
            for (int i = 0; i <= 64; i++)
                hex[i] = (char)tolower((unsigned char)sv[i]);
        } else if (sha) {
            spec_fault(v, 422, "/model/sha256", "must be 64 hex digits (the sha-256 of the model file)");
            return out;
        }
        store_model *sm = hex[0] && v->env->st ? malloc(sizeof *sm) : NULL;
        int rc = sm ? store_model_get_sha(v->env->st, hex, sm) : 1;
        if (rc != 0) {
            free(sm);
            spec_fault(v, 422, "/model/url", "models are fetched by URL through POST /v1/models {url, sha256}; register "
                                        "it there, then reference it by id (or by this url and its sha256) once "
                                        "its status is ready");
            return out;
        }
        if (model_usable(v, sm, "/model/url"))
            model_ref_out(out, sm);
        free(sm);
        return out;
    }
    if (has_id) {
        static const char *const keys[] = {"id", NULL};
        spec_only_keys(v, m, "/model", keys);
        json_t *id = spec_string_field(v, m, "/model", "id", 64, 1);
        if (!id)
            return out;
        store_model sm;
        int rc = v->env->st ? store_model_get(v->env->st, json_string_value(id), &sm) : 1;
        if (rc != 0) {
            spec_fault(v, 422, "/model/id", "no registered model %s (POST /v1/models first)", json_string_value(id));
            return out;
        }
        if (!model_usable(v, &sm, "/model/id"))
            return out;
        model_ref_out(out, &sm);
        return out;
    }
    static const char *const keys[] = {"path", "tokenizer", NULL};
    spec_only_keys(v, m, "/model", keys);
    model_path(v, m, "/model", out);
    return out;
}

/* What a job asks of the model it names (resolved into model, by path or as registered),
 * now rather than after the calibration: a tokenizer, given or found where the loader
 * looks (beside it, or a GGUF's own), for its calibration, distillation and evaluation
 * text (else a 422 at /model/tokenizer); a context that holds the target's workload
 * (else a 422 at /target/workload); for a Qwen2, exports that can hold it. */
/* A Qwen2 parent (q/k/v biases): what the exports of this build can hold of it. HF writes it
 * as Qwen2ForCausalLM only, one shape for every layer, so the search may only remove whole
 * layers (compress/method.c); DeciLM would give o_proj a bias, and GGUF (so llama.cpp) has
 * no Qwen2 here. Faults for what would fail at the export after the whole job. */
static void check_qwen2_exports(vctx *v, json_t *in, json_t *out)
{
    json_t *ex = json_object_get(in, "export");
    size_t i;
    json_t *f;
    json_array_foreach(ex, i, f) {
        const char *name = json_string_value(f);
        char p[64];
        spec_ptr_index(p, sizeof p, "/export", i);
        if (name && (!strcmp(name, "gguf") || !strcmp(name, "deci")))
            spec_fault(v, 422, p, "a Qwen2 model (q/k/v biases) cannot be written as %s in this build: export it as "
                  "\"hf\" (Qwen2ForCausalLM)", !strcmp(name, "gguf") ? "GGUF" : "DeciLM (whose attention_bias "
                  "also gives o_proj a bias)");
    }
    const char *eng = json_string_value(json_object_get(json_object_get(out, "target"), "engine"));
    if (eng && !strcmp(eng, CM_ENGINE_LLAMACPP))
        spec_fault(v, 422, "/target/engine", "llama.cpp serves the GGUF export, which this build cannot write for a Qwen2 "
                                        "model (q/k/v biases)");
    int hf = 0;
    json_array_foreach(json_object_get(out, "export"), i, f)
        hf |= json_is_string(f) && !strcmp(json_string_value(f), "hf");
    if (hf && json_is_false(json_object_get(json_object_get(out, "search_space"), "depth")))
        spec_fault(v, 422, "/search_space/depth", "a Qwen2 model (q/k/v biases) is exported to HF as Qwen2ForCausalLM, one "
                                             "shape for every layer: only whole layers can go, and depth is off");
}

void spec_check_model_use(vctx *v, json_t *in, json_t *out)
{
    json_t *model = json_object_get(out, "model"), *target = json_object_get(out, "target");
    const char *path = json_string_value(json_object_get(model, "path")),
               *tok = json_string_value(json_object_get(model, "tokenizer"));
    if (!path || !json_object_get(model, "format"))
        return;   /* already refused */
    mio_model mm;
    char err[1024];
    if (mio_open(&mm, path, tok, err, sizeof err))
        return;   /* a model that does not open fails its load stage, which says why */
    int found = mio_tokenizer_found(&mm, err, sizeof err) == 0;
    int gguf = mm.format == MIO_GGUF, qwen2 = mm.a.attention_bias && !strcmp(mm.a.family, "llama");
    /* linear RoPE scaling stretches the positions the model was trained on by its factor
       (configs keep the original max_position_embeddings beside it); llama3's is the
       extended context already, and dynamic scaling stops at it (engine/forward.c) */
    double context = mm.a.max_position_embeddings *
                     (mm.a.rope_scaling.type == ROPE_SCALING_LINEAR && mm.a.rope_scaling.factor > 1
                          ? mm.a.rope_scaling.factor : 1.0);
    mio_close(&mm);
    /* the job measures, and delivers a model for, requests of this length: one past the
       model's context is a workload it cannot serve */
    json_t *wl = json_object_get(target, "workload");
    json_int_t len = json_integer_value(json_object_get(wl, "prompt_tokens")) +
                     json_integer_value(json_object_get(wl, "output_tokens"));
    if (context > 0 && (double)len > context)
        spec_fault(v, 422, "/target/workload", "prompt_tokens + output_tokens = %lld is past the model's context of %.0f "
              "tokens (its max_position_embeddings, times a linear RoPE scaling's factor): the model cannot serve "
              "such requests", (long long)len, context);
    if (qwen2)
        check_qwen2_exports(v, in, out);
    if (found)
        return;
    const char *slash = strrchr(path, '/'), *id = json_string_value(json_object_get(model, "id"));
    char what[256];   /* the server's paths are its own business: the model by its last component */
    if (tok)
        snprintf(what, sizeof what, "its tokenizer %s is gone", strrchr(tok, '/') ? strrchr(tok, '/') + 1 : tok);
    else
        snprintf(what, sizeof what, "it has no tokenizer %s", gguf ? "in its metadata" : "beside it");
    if (id)   /* registered: the tokenizer comes with the registration */
        spec_fault(v, 422, "/model/tokenizer",
              "model %s (%s): %s, and a job tokenizes its calibration and evaluation text: register it again with "
              "its tokenizer (POST /v1/models {path, tokenizer})", id, slash ? slash + 1 : path, what);
    else
        spec_fault(v, 422, "/model/tokenizer",
              "%s: %s, and a job tokenizes its calibration and evaluation text: give model.tokenizer",
              slash ? slash + 1 : path, what);
}
