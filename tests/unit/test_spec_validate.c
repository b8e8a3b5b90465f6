/* tests/unit/test_spec_validate.c — the constraint spec v1 validator (api/spec.c):
 * defaults, unknown fields, types, ranges, contradictions, devices, the status ranking
 * (403 > 400 > 422), server-path confinement (`..`, outside, symlink escape, missing) and
 * the target's engine (combinations, defaults, llama.cpp absent: a helper that does not
 * exist, then a fake one that answers `info`, in that order: a success is cached).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/spec.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "storage/export.h"
#include "storage/store.h"
#include "engine/devices.h"
#include "tiny_model.h"

static char dir[PATH_MAX], models[PATH_MAX + 16], data[PATH_MAX + 16];
static char *roots[2];

static void touch(const char *path)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("x", f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    char tmpl[] = "/tmp/ac-spec-XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    assert_non_null(realpath(tmpl, dir));
    snprintf(models, sizeof models, "%s/models", dir);
    snprintf(data, sizeof data, "%s/data", dir);
    assert_int_equal(mkdir(models, 0755), 0);
    assert_int_equal(mkdir(data, 0755), 0);
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/tiny.bin", models);
    assert_int_equal(tiny_l2c_write(p), 0);
    assert_int_equal(tiny_l2c_tok_write(models), 0);
    snprintf(p, sizeof p, "%s/m.gguf", models);
    assert_int_equal(tiny_gguf_magic_write(p), 0);
    snprintf(p, sizeof p, "%s/notes.txt", models);
    touch(p);
    snprintf(p, sizeof p, "%s/hf", models);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/hf/config.json", models);
    touch(p);
    snprintf(p, sizeof p, "%s/hf/model.safetensors", models);
    touch(p);
    snprintf(p, sizeof p, "%s/text.txt", data);
    touch(p);
    snprintf(p, sizeof p, "%s/task.jsonl", data);
    touch(p);
    snprintf(p, sizeof p, "%s/notes.jsonl", models);
    touch(p);
    snprintf(p, sizeof p, "%s/secret.bin", dir); /* outside both roots */
    touch(p);
    char target[PATH_MAX + 64];
    snprintf(target, sizeof target, "%s/secret.bin", dir);
    snprintf(p, sizeof p, "%s/escape.bin", models);
    assert_int_equal(symlink(target, p), 0);
    snprintf(p, sizeof p, "%s/inside.bin", models);
    assert_int_equal(symlink("tiny.bin", p), 0);
    roots[0] = models;
    roots[1] = data;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static spec_env env_of(int test_stages)
{
    spec_env e = {roots, 2, dir, NULL, test_stages, 0, 0};
    return e;
}

/* Validate a JSON text; returns the normalized spec or NULL with status and errors. */
static json_t *run(const char *text, int test_stages, int *status, json_t **errors)
{
    json_error_t je;
    json_t *in = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!in)
        fail_msg("bad test JSON: %s: %s", text, je.text);
    spec_env env = env_of(test_stages);
    json_t *out = spec_validate(in, &env, status, errors);
    json_decref(in);
    return out;
}

static int has_pointer(json_t *errors, const char *ptr)
{
    size_t i;
    json_t *e;
    json_array_foreach(errors, i, e) if (!strcmp(json_string_value(json_object_get(e, "pointer")), ptr)) return 1;
    return 0;
}

static void expect_fault(const char *text, int want_status, const char *ptr)
{
    int status = 0;
    json_t *errors = NULL;
    json_t *out = run(text, 0, &status, &errors);
    if (out) {
        json_decref(out);
        fail_msg("accepted: %s", text);
    }
    if (status != want_status || !has_pointer(errors, ptr)) {
        char *e = json_dumps(errors, 0);
        print_error("spec %s\n  want %d at %s, got %d: %s\n", text, want_status, ptr, status, e);
        free(e);
        json_decref(errors);
        fail();
    }
    json_decref(errors);
}

#define MODEL_ONLY "\"model\":{\"path\":\"models/tiny.bin\"}"
/* a model and the calibration text every job reads */
#define OK_MODEL "\"model\":{\"path\":\"models/tiny.bin\"},\"data\":{\"calibration\":\"data/text.txt\"}"

static void test_defaults(void **state)
{
    (void)state;
    int status;
    json_t *errors;
    json_t *s = run("{" OK_MODEL ",\"constraints\":{\"latency_ms\":40}}", 0, &status, &errors);
    assert_non_null(s);
    json_t *t = json_object_get(s, "target");
    assert_string_equal(json_string_value(json_object_get(t, "device")), "cpu");
    assert_string_equal(json_string_value(json_object_get(t, "precision")), "fp32");
    assert_string_equal(json_string_value(json_object_get(t, "engine")), "autocompress");
    assert_null(json_object_get(t, "kv_cache_type"));
    assert_null(json_object_get(t, "threads"));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(t, "workload"), "prompt_tokens")), 256);
    assert_string_equal(json_string_value(json_object_get(s, "method")), "autocompress");
    assert_true(json_is_true(json_object_get(json_object_get(s, "search_space"), "depth")));
    /* a distilled job's default: the plain slice (distillation ends better from it) */
    assert_true(json_is_false(json_object_get(json_object_get(s, "pruning"), "reconstruct")));
    assert_int_equal(json_array_size(json_object_get(s, "export")), 1);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(s, "budgets"), "search_tokens")), 2000000);
    assert_int_equal(json_integer_value(json_object_get(s, "seed")), 1234);
    char want[PATH_MAX + 32];
    snprintf(want, sizeof want, "%s/tiny.bin", models);
    json_t *m = json_object_get(s, "model");
    assert_string_equal(json_string_value(json_object_get(m, "path")), want);
    assert_string_equal(json_string_value(json_object_get(m, "format")), "llama2c");
    assert_null(json_object_get(s, "x_test_pipeline"));
    json_decref(s);
    /* nothing distilled after pruning: the slice is reconstructed unless told not to */
    s = run("{" OK_MODEL ",\"constraints\":{\"latency_ms\":40},\"budgets\":{\"distill_tokens\":0}}", 0, &status,
            &errors);
    assert_non_null(s);
    assert_true(json_is_true(json_object_get(json_object_get(s, "pruning"), "reconstruct")));
    json_decref(s);
    /* served checks: on unless the spec turns them off (kept as given) */
    s = run("{" OK_MODEL ",\"constraints\":{\"latency_ms\":40,\"served_check\":false}}", 0, &status, &errors);
    assert_non_null(s);
    assert_true(json_is_false(json_object_get(json_object_get(s, "constraints"), "served_check")));
    json_decref(s);
}

static void test_full_spec(void **state)
{
    (void)state;
    int status;
    json_t *errors;
    json_t *s = run("{\"name\":\"npc\",\"model\":{\"path\":\"models/hf\"},"
                    "\"target\":{\"device\":\"cpu\",\"precision\":\"fp32\",\"workload\":{\"batch_size\":4,"
                    "\"prompt_tokens\":1024,\"output_tokens\":128}},"
                    "\"constraints\":{\"latency_ms\":750,\"memory_gib\":1,\"throughput_tokens_per_s\":10,\"params\":1000},"
                    "\"method\":\"minitron\",\"search_space\":{\"hidden\":false,\"depth\":true},"
                    "\"pruning\":{\"reconstruct\":false},"
                    "\"budgets\":{\"search_tokens\":10,\"distill_tokens\":0},\"seed\":7,"
                    "\"data\":{\"calibration\":\"data/text.txt\"},"
                    "\"evaluation\":{\"tasks\":[\"arc_easy\",{\"name\":\"mine\",\"path\":\"data/task.jsonl\"}],\"limit\":5,\"seed\":1},"
                    "\"export\":[\"gguf\",\"deci\"],\"metadata\":{\"team\":\"npc\"}}",
                    0, &status, &errors);
    if (!s) {
        char *e = json_dumps(errors, 0);
        fail_msg("rejected: %s", e);
    }
    assert_string_equal(json_string_value(json_object_get(json_object_get(s, "model"), "format")), "hf");
    assert_false(json_is_true(json_object_get(json_object_get(s, "search_space"), "hidden")));
    assert_true(json_is_true(json_object_get(json_object_get(s, "search_space"), "ffn")));
    assert_true(json_is_false(json_object_get(json_object_get(s, "pruning"), "reconstruct")));
    assert_int_equal(json_array_size(json_object_get(json_object_get(s, "evaluation"), "tasks")), 2);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(s, "budgets"), "distill_tokens")), 0);
    assert_int_equal(json_integer_value(json_object_get(s, "seed")), 7);
    json_decref(s);
}

static void test_shape_faults(void **state)
{
    (void)state;
    expect_fault("[]", 400, "");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"colour\":1}", 400, "/colour");
    expect_fault("{\"constraints\":{\"latency_ms\":1}}", 400, "/model");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"pruning\":{\"reconstruct\":1}}", 400,
                 "/pruning/reconstruct");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"pruning\":{\"obs\":true}}", 400, "/pruning/obs");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"pruning\":true}", 400, "/pruning");
    expect_fault("{" OK_MODEL "}", 400, "/constraints");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":\"1\"}}", 400, "/constraints/latency_ms");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"params\":1.5}}", 400, "/constraints/params");
    /* an integral real beyond 2^53 is an integer to JSON Schema: out of range, not mistyped */
    expect_fault("{" OK_MODEL ",\"constraints\":{\"params\":1e19}}", 422, "/constraints/params");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"params\":9007199254740992.0}}", 422, "/constraints/params");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"target\":{\"gpu\":1}}", 400, "/target/gpu");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"target\":{\"workload\":[]}}", 400, "/target/workload");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"export\":\"hf\"}", 400, "/export");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"search_space\":{\"ffn\":1}}", 400, "/search_space/ffn");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"metadata\":{\"a/b\":2}}", 400, "/metadata/a~1b");
    /* test-only fields exist only when enabled */
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"x_test_pipeline\":[\"test_sleep\"]}", 400, "/x_test_pipeline");
}

static void test_value_faults(void **state)
{
    (void)state;
    expect_fault("{" OK_MODEL ",\"constraints\":{}}", 422, "/constraints");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":0}}", 422, "/constraints/latency_ms");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"memory_gib\":-2}}", 422, "/constraints/memory_gib");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"memory_gib\":100000}}", 422, "/constraints/memory_gib");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"params\":0}}", 422, "/constraints/params");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1,\"margin_pct\":60}}", 422, "/constraints/margin_pct");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1,\"margin_pct\":-1}}", 422, "/constraints/margin_pct");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"margin_pct\":5}}", 422, "/constraints");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1,\"margin_pct\":\"5\"}}", 400, "/constraints/margin_pct");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1,\"served_check\":1}}", 400, "/constraints/served_check");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"served_check\":false}}", 422, "/constraints");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"target\":{\"device\":\"tpu\"}}", 422, "/target/device");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"target\":{\"device\":\"cuda:99\"}}", 422, "/target/device");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"target\":{\"precision\":\"fp8\"}}", 422, "/target/precision");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"target\":{\"workload\":{\"batch_size\":0}}}", 422,
                 "/target/workload/batch_size");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"target\":{\"workload\":{\"prompt_tokens\":1000000,"
                 "\"output_tokens\":100000}}}", 422, "/target/workload");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"method\":\"random\"}", 422, "/method");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"search_space\":{\"hidden\":false,\"heads\":false,"
                 "\"ffn\":false,\"experts\":false,\"expert_widths\":false,\"shared_expert_widths\":false,"
                 "\"latent_widths\":false,\"mamba_heads\":false,\"depth\":false}}", 422, "/search_space");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"budgets\":{\"search_tokens\":0}}", 422, "/budgets/search_tokens");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"seed\":0}", 422, "/seed");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"seed\":\"7\"}", 400, "/seed");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"evaluation\":{\"tasks\":[\"piqa\",\"piqa\"]}}", 422,
                 "/evaluation/tasks/1");
    /* a job's model by URL: a digest that is not one is named as such, at its own pointer */
    expect_fault("{\"model\":{\"url\":\"https://models.example/m.gguf\",\"sha256\":\"abc\"},"
                 "\"constraints\":{\"latency_ms\":1}}", 422, "/model/sha256");
    /* results are keyed by name: two tasks of one name, whatever their files, are refused */
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"evaluation\":{\"tasks\":[{\"name\":\"x\","
                 "\"path\":\"data/task.jsonl\"},{\"name\":\"x\",\"path\":\"models/notes.jsonl\"}]}}", 422,
                 "/evaluation/tasks/1");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"evaluation\":{\"tasks\":[\"arc_easy\",{\"name\":"
                 "\"arc_easy\",\"path\":\"data/task.jsonl\"}]}}", 422, "/evaluation/tasks/1");
    /* every job reads its calibration text: a job without one is refused (a test pipeline,
     * which reads none, is not: test_test_fields) */
    expect_fault("{" MODEL_ONLY ",\"constraints\":{\"latency_ms\":1}}", 422, "/data/calibration");
    expect_fault("{" MODEL_ONLY ",\"constraints\":{\"latency_ms\":1},\"data\":{\"distillation\":\"data/text.txt\"}}",
                 422, "/data/calibration");
    /* a task file is known to the evaluator by its name: another name is refused here, not
     * after hours of work at the evaluate stage */
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"evaluation\":{\"tasks\":[{\"name\":\"t\","
                 "\"path\":\"data/text.txt\"}]}}", 422, "/evaluation/tasks/0/path");
    /* a name of 64 bytes is a valid one, multi-byte characters and all; 65 is not */
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"evaluation\":{\"tasks\":[{\"name\":"
                 "\"ab\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac"
                 "\u20ac\u20ac\u20ac\u20ac\",\"path\":\"data/task.jsonl\"}]}}", 422, "/evaluation/tasks/0/name");
    {
        int status = 0;
        json_t *errors = NULL;
        json_t *ok = run("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"evaluation\":{\"tasks\":[{\"name\":"
                         "\"a\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac"
                         "\u20ac\u20ac\u20ac\u20ac\",\"path\":\"data/task.jsonl\"}]}}", 0, &status, &errors);
        assert_non_null(ok);
        json_decref(ok);
    }
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"evaluation\":{\"limit\":-4}}", 422, "/evaluation/limit");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"export\":[\"gguf\",\"gguf\"]}", 422, "/export/1");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"callback_url\":\"https://x\"}", 422, "/callback_url");
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"metadata\":{\"1\":\"\",\"2\":\"\",\"3\":\"\",\"4\":\"\","
                 "\"5\":\"\",\"6\":\"\",\"7\":\"\",\"8\":\"\",\"9\":\"\",\"10\":\"\",\"11\":\"\",\"12\":\"\",\"13\":\"\","
                 "\"14\":\"\",\"15\":\"\",\"16\":\"\",\"17\":\"\"}}", 422, "/metadata");
    expect_fault("{\"model\":{\"id\":\"mdl_x\"},\"constraints\":{\"latency_ms\":1}}", 422, "/model/id");
    expect_fault("{\"model\":{},\"constraints\":{\"latency_ms\":1}}", 422, "/model");
    expect_fault("{\"model\":{\"path\":\"models/hf\",\"id\":\"mdl_x\"},\"constraints\":{\"latency_ms\":1}}", 422, "/model");
    expect_fault("{\"model\":{\"path\":\"data/text.txt\"},\"constraints\":{\"latency_ms\":1}}", 422, "/model/path");
}

static void test_paths(void **state)
{
    (void)state;
    /* a workload the model's context cannot hold (tiny.bin: 512 tokens) */
    expect_fault("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"target\":{\"workload\":{\"prompt_tokens\":500,"
                 "\"output_tokens\":13}}}", 422, "/target/workload");
    int st0;
    json_t *e0;
    json_t *fits = run("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"target\":{\"workload\":{\"prompt_tokens\":500,"
                       "\"output_tokens\":12}}}", 0, &st0, &e0);
    assert_non_null(fits);
    json_decref(fits);
    expect_fault("{\"model\":{\"path\":\"models/none.bin\"},\"constraints\":{\"latency_ms\":1}}", 422, "/model/path");
    expect_fault("{\"model\":{\"path\":\"models/../models/tiny.bin\"},\"constraints\":{\"latency_ms\":1}}", 403, "/model/path");
    expect_fault("{\"model\":{\"path\":\"/etc/passwd\"},\"constraints\":{\"latency_ms\":1}}", 403, "/model/path");
    expect_fault("{\"model\":{\"path\":\"secret.bin\"},\"constraints\":{\"latency_ms\":1}}", 403, "/model/path");
    expect_fault("{\"model\":{\"path\":\"models/escape.bin\"},\"constraints\":{\"latency_ms\":1}}", 403, "/model/path");
    expect_fault("{" MODEL_ONLY ",\"constraints\":{\"latency_ms\":1},\"data\":{\"calibration\":\"data/text.txt\","
                 "\"distillation\":\"/tmp/../etc\"}}", 403,
                 "/data/distillation");
    /* a symlink that stays inside a root is fine; absolute paths inside a root are fine */
    char text[PATH_MAX * 2];
    snprintf(text, sizeof text, "{\"model\":{\"path\":\"%s/inside.bin\"},\"constraints\":{\"latency_ms\":1},"
             "\"data\":{\"calibration\":\"data/text.txt\"}}", models);
    int status;
    json_t *errors;
    json_t *s = run(text, 0, &status, &errors);
    assert_non_null(s);
    char want[PATH_MAX + 32];
    snprintf(want, sizeof want, "%s/tiny.bin", models);
    assert_string_equal(json_string_value(json_object_get(json_object_get(s, "model"), "path")), want);
    json_decref(s);
    /* relative to a root as well as to the data dir */
    spec_env env = env_of(0);
    char out[PATH_MAX], msg[256];
    assert_int_equal(spec_resolve_path(&env, "text.txt", out, sizeof out, msg, sizeof msg), 0);
    assert_int_equal(spec_resolve_path(&env, "", out, sizeof out, msg, sizeof msg), 422);
    assert_int_equal(spec_resolve_path(&env, "..", out, sizeof out, msg, sizeof msg), 403);
    char hf[PATH_MAX + 64];
    snprintf(hf, sizeof hf, "%s/hf", models);
    /* an absolute path that reaches a root through a link to it is inside */
    char via[PATH_MAX + 64], linked[PATH_MAX + 128];
    snprintf(via, sizeof via, "%s/via", dir);
    assert_int_equal(symlink(models, via), 0);
    snprintf(linked, sizeof linked, "%s/tiny.bin", via);
    assert_int_equal(spec_resolve_path(&env, linked, out, sizeof out, msg, sizeof msg), 0);
    snprintf(want, sizeof want, "%s/tiny.bin", models);
    assert_string_equal(out, want);
    snprintf(linked, sizeof linked, "%s/missing.bin", via);
    assert_int_equal(spec_resolve_path(&env, linked, out, sizeof out, msg, sizeof msg), 422);
    char why[1024];
    assert_string_equal(spec_model_format(hf, why, sizeof why), "hf");
    assert_null(spec_model_format(models, why, sizeof why));
    assert_non_null(strstr(why, "accepted:"));
}

/* A Qwen2 parent (q/k/v biases): GGUF and DeciLM cannot hold it, so those exports are a 422
 * at once (they failed at the export stage, after the whole job); its HF export is one
 * shape for every layer, so a search without depth has nothing to change. */
/* A 2-layer arch of context ctx (q/k/v biases with bias), for the caller to change and
 * write_hf as an HF directory models/NAME (which frees it). */
static void small_arch(arch *a, int ctx, int bias)
{
    assert_int_equal(arch_init(a, 2), 0);
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = 96;
    a->hidden_size = 32;
    a->head_dim = 8;
    a->max_position_embeddings = ctx;
    a->rope_theta = 10000;
    a->norm_eps = 1e-6;
    a->tie_word_embeddings = 1;
    a->attention_bias = bias;
    for (int l = 0; l < 2; l++)
        a->layers[l] = (arch_layer){.source_layer = l, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 64};
}

static void write_hf(const char *name, arch *a)
{
    eng_backend *be = eng_backend_cpu_new(1);
    assert_non_null(be);
    eng_model m;
    char err[512], qdir[PATH_MAX + 64];
    assert_int_equal(eng_model_init(&m, a, be, err, sizeof err), 0);
    snprintf(qdir, sizeof qdir, "%s/%s", models, name);
    exp_opts o = {.dtype = EXP_FP32};
    if (exp_hf_write(&m, qdir, &o, NULL, err, sizeof err))
        fail_msg("exp_hf_write: %s", err);
    eng_model_free(&m);
    eng_backend_free(be);
    arch_free(a);
}

/* Linear RoPE scaling stretches the context its config states (4 x 100 tokens here). */
static void test_context_linear_rope(void **state)
{
    (void)state;
    arch a;
    small_arch(&a, 100, 0);
    a.rope_scaling.type = ROPE_SCALING_LINEAR;
    a.rope_scaling.factor = 4;
    write_hf("linear", &a);
#define LINEAR "\"model\":{\"path\":\"models/linear\",\"tokenizer\":\"models/tok32.bin\"},\"data\":{\"calibration\":" \
               "\"data/text.txt\"},\"constraints\":{\"params\":1000}"
    expect_fault("{" LINEAR ",\"target\":{\"workload\":{\"prompt_tokens\":390,\"output_tokens\":11}}}", 422,
                 "/target/workload");
    int st;
    json_t *e;
    json_t *ok = run("{" LINEAR ",\"target\":{\"workload\":{\"prompt_tokens\":390,\"output_tokens\":10}}}", 0,
                     &st, &e);
    if (!ok) {
        char *t = json_dumps(e, 0);
        fail_msg("refused: %s", t);
    }
    json_decref(ok);
#undef LINEAR
}

static void test_qwen2_exports(void **state)
{
    (void)state;
    arch a;
    small_arch(&a, 4096, 1);
    write_hf("qwen2", &a);
#define QWEN2 "\"model\":{\"path\":\"models/qwen2\",\"tokenizer\":\"models/tok32.bin\"},\"data\":{\"calibration\":" \
              "\"data/text.txt\"},\"constraints\":{\"params\":1000}"
    expect_fault("{" QWEN2 ",\"export\":[\"gguf\"]}", 422, "/export/0");
    expect_fault("{" QWEN2 ",\"export\":[\"hf\",\"deci\"]}", 422, "/export/1");
    expect_fault("{" QWEN2 ",\"search_space\":{\"depth\":false}}", 422, "/search_space/depth");
    int st;
    json_t *e;
    json_t *ok = run("{" QWEN2 ",\"export\":[\"hf\"]}", 0, &st, &e);
    if (!ok) {
        char *t = json_dumps(e, 0);
        fail_msg("refused: %s", t);
    }
    json_decref(ok);
#undef QWEN2
}

static void test_ranking_and_all_faults(void **state)
{
    (void)state;
    int status;
    json_t *errors;
    json_t *s = run("{\"model\":{\"path\":\"/etc/passwd\"},\"constraints\":{\"latency_ms\":-1},\"junk\":true}", 0,
                    &status, &errors);
    assert_null(s);
    assert_int_equal(status, 403);
    assert_true(has_pointer(errors, "/model/path"));
    assert_true(has_pointer(errors, "/constraints/latency_ms"));
    assert_true(has_pointer(errors, "/junk"));
    json_decref(errors);
    s = run("{" OK_MODEL ",\"constraints\":{\"latency_ms\":-1},\"junk\":true}", 0, &status, &errors);
    assert_null(s);
    assert_int_equal(status, 400);
    json_decref(errors);
}

/* A fault whose message or pointer is cut inside a multi-byte character (a key of 200 "€", 600
 * bytes, beyond the message's 512) was dropped by jansson as invalid UTF-8 while its status
 * stood: with no fault listed, the spec was accepted. Each is listed now, cut at a character. */
static void test_faults_cut_inside_a_character(void **state)
{
    (void)state;
    char key[700] = "", text[1600];
    for (int i = 0; i < 200; i++)
        strcat(key, "\xe2\x82\xac");   /* U+20AC */
    const char *where[] = {"{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"%s\":1}",
                           "{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"metadata\":{\"%s\":\"v\"}}",
                           "{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"evaluation\":{\"tasks\":[\"arc_easy\",\"%s\"]}}",
                           "{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"export\":[\"gguf\",\"%s\"]}"};
    for (size_t w = 0; w < sizeof where / sizeof *where; w++) {
        snprintf(text, sizeof text, where[w], key);
        int status = 0;
        json_t *errors = NULL, *out = run(text, 0, &status, &errors);
        if (out) {
            json_decref(out);
            fail_msg("accepted the spec of case %zu", w);
        }
        assert_true(status == 400 || status == 422);
        assert_true(json_array_size(errors) >= 1);
        const char *m = json_string_value(json_object_get(json_array_get(errors, 0), "message"));
        const char *ptr = json_string_value(json_object_get(json_array_get(errors, 0), "pointer"));
        assert_non_null(m);
        assert_non_null(ptr);
        json_decref(errors);
    }
    /* beside a 422 fault, the 400 one is listed too and decides the status */
    snprintf(text, sizeof text, "{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"method\":\"bogus\",\"%s\":1}", key);
    int status = 0;
    json_t *errors = NULL;
    assert_null(run(text, 0, &status, &errors));
    assert_int_equal(status, 400);
    assert_true(has_pointer(errors, "/method"));
    assert_int_equal(json_array_size(errors), 2);
    json_decref(errors);
}

static void test_test_fields(void **state)
{
    (void)state;
    int status;
    json_t *errors;
    json_t *s = run("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"x_test_pipeline\":[\"test_sleep\"],"
                    "\"x_test_sleep_ms\":5}", 1, &status, &errors);
    assert_non_null(s);
    assert_int_equal(json_array_size(json_object_get(s, "x_test_pipeline")), 1);
    assert_int_equal(json_integer_value(json_object_get(s, "x_test_sleep_ms")), 5);
    json_decref(s);
    s = run("{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"x_test_pipeline\":[]}", 1, &status, &errors);
    assert_null(s);
    assert_int_equal(status, 422);
    json_decref(errors);
}

static void test_callback_url(void **state)
{
    (void)state;
    spec_env env = env_of(0);
    env.webhooks = 1;
    int status;
    json_t *errors;
    json_t *in = json_loads("{" OK_MODEL ",\"constraints\":{\"params\":1},\"callback_url\":\"https://ci.example.com/h?a=1\"}", 0, NULL);
    json_t *s = spec_validate(in, &env, &status, &errors);
    json_decref(in);
    assert_non_null(s);
    assert_string_equal(json_string_value(json_object_get(s, "callback_url")), "https://ci.example.com/h?a=1");
    json_decref(s);
    const char *bad[] = {"ftp://x/y", "https://", "http://a b", "javascript:alert(1)", "http://10.0.0.7:8080/h",
                         "https://[::1]/h", "http://localhost/h", "https://u:p@ci.example.com/h", NULL};
    for (int i = 0; bad[i]; i++) {
        json_t *b = json_pack("{s:{s:s},s:{s:i},s:s}", "model", "path", "models/tiny.bin", "constraints", "params", 1,
                              "callback_url", bad[i]);
        s = spec_validate(b, &env, &status, &errors);
        json_decref(b);
        assert_null(s);
        assert_int_equal(status, 422);
        assert_true(has_pointer(errors, "/callback_url"));
        json_decref(errors);
    }
    env.webhook_private_hosts = 1;   /* a server that delivers inside its own network */
    in = json_loads("{" OK_MODEL ",\"constraints\":{\"params\":1},\"callback_url\":\"http://10.0.0.7:8080/h\"}", 0, NULL);
    s = spec_validate(in, &env, &status, &errors);
    json_decref(in);
    assert_non_null(s);
    json_decref(s);
}

static void test_calibration_request(void **state)
{
    (void)state;
    spec_env env = env_of(0);
    int status;
    json_t *errors;
    json_t *in = json_loads("{\"model\":{\"path\":\"models/m.gguf\"},\"target\":{\"device\":\"cpu\"}}", 0, NULL);
    json_t *s = spec_validate_calibration(in, &env, &status, &errors);
    json_decref(in);
    assert_non_null(s);
    assert_string_equal(json_string_value(json_object_get(json_object_get(s, "model"), "format")), "gguf");
    json_decref(s);
    in = json_loads("{\"model\":{\"path\":\"models/m.gguf\"},\"constraints\":{\"latency_ms\":1}}", 0, NULL);
    s = spec_validate_calibration(in, &env, &status, &errors);
    json_decref(in);
    assert_null(s);
    assert_int_equal(status, 400);
    assert_true(has_pointer(errors, "/constraints"));
    json_decref(errors);
}

#define WITH_TARGET(t) "{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"target\":" t "}"

/* A 16-bit precision of the built-in engine is taken exactly where the device runs it
 * (the CPU: where oneDNN has a kernel for it), else it is a fault naming the device. */
static void test_precision_on_device(void **state)
{
    (void)state;
    static const char *const precs[] = {"bf16", "fp16"};
    for (int i = 0; i < 2; i++) {
        char text[512], why[256];
        snprintf(text, sizeof text, WITH_TARGET("{\"device\":\"cpu\",\"precision\":\"%s\"}"), precs[i]);
        int status;
        json_t *errors = NULL, *s = run(text, 0, &status, &errors);
        if (eng_device_precision("cpu", precs[i], why, sizeof why) == 0) {
            assert_non_null(s);
            json_t *t = json_object_get(s, "target");
            assert_string_equal(json_string_value(json_object_get(t, "precision")), precs[i]);
            json_decref(s);
        } else {
            assert_null(s);
            json_t *e = json_array_get(errors, 0);
            assert_int_equal(status, 422);
            assert_string_equal(json_string_value(json_object_get(e, "pointer")), "/target/precision");
            assert_non_null(strstr(json_string_value(json_object_get(e, "message")), why));
            json_decref(errors);
        }
    }
}

/* Combinations the engines do not take: each a fault at the field, whether or not
 * llama.cpp is installed (the vocabulary is checked before the engine's presence). */
static void test_engine_faults(void **state)
{
    (void)state;
    expect_fault(WITH_TARGET("{\"engine\":\"nonsense\"}"), 422, "/target/engine");
    expect_fault(WITH_TARGET("{\"engine\":\"vllm\",\"precision\":\"fp32\"}"), 422, "/target/engine");
    expect_fault(WITH_TARGET("{\"engine\":\"autocompress\",\"precision\":\"q8_0\"}"), 422, "/target/precision");
    expect_fault(WITH_TARGET("{\"precision\":\"f16\"}"), 422, "/target/precision");
    expect_fault(WITH_TARGET("{\"engine\":\"llama.cpp\",\"precision\":\"q3_k\"}"), 422, "/target/precision");
    expect_fault(WITH_TARGET("{\"engine\":\"llama.cpp\",\"precision\":\"fp32\"}"), 422, "/target/precision");
    expect_fault(WITH_TARGET("{\"kv_cache_type\":\"f16\"}"), 422, "/target/kv_cache_type");
    expect_fault(WITH_TARGET("{\"engine\":\"llama.cpp\",\"kv_cache_type\":\"q2_k\"}"), 422, "/target/kv_cache_type");
    expect_fault(WITH_TARGET("{\"engine\":\"llama.cpp\",\"threads\":0}"), 422, "/target/threads");
    expect_fault(WITH_TARGET("{\"engine\":\"llama.cpp\",\"threads\":-3}"), 422, "/target/threads");
    expect_fault(WITH_TARGET("{\"engine\":\"llama.cpp\",\"threads\":1025}"), 422, "/target/threads");
    expect_fault(WITH_TARGET("{\"engine\":\"llama.cpp\",\"threads\":5000000000}"), 422, "/target/threads");
    expect_fault(WITH_TARGET("{\"threads\":4}"), 422, "/target/threads");
    expect_fault(WITH_TARGET("{\"engine\":\"llama.cpp\",\"threads\":\"4\"}"), 400, "/target/threads");
    expect_fault(WITH_TARGET("{\"engine\":\"llama.cpp\",\"threads\":2.5}"), 400, "/target/threads");
    expect_fault(WITH_TARGET("{\"engine\":7}"), 400, "/target/engine");
    expect_fault(WITH_TARGET("{\"engine_build\":\"llama.cpp x\"}"), 422, "/target/engine_build");
    expect_fault(WITH_TARGET("{\"engine\":\"\"}"), 422, "/target/engine");
    expect_fault(WITH_TARGET("{\"engine\":\"llama.cpp\",\"precision\":\"\"}"), 422, "/target/precision");
    /* the message names what the engine takes */
    int status;
    json_t *errors;
    assert_null(run(WITH_TARGET("{\"engine\":\"llama.cpp\",\"precision\":\"q3_k\"}"), 0, &status, &errors));
    const char *msg = json_string_value(json_object_get(json_array_get(errors, 0), "message"));
    assert_non_null(strstr(msg, "q4_k_m"));
    json_decref(errors);
}

/* The same target through the three routes that take one: every one refuses it with the
 * same pointer, status and message. */
static void expect_engine_absent(const char *target)
{
    char text[1024];
    spec_env env = env_of(0);
    const char *bodies[3] = {"{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"target\":%s}",
                             "{" MODEL_ONLY ",\"target\":%s}", "{" MODEL_ONLY ",\"target\":%s}"};
    for (int route = 0; route < 3; route++) {
        snprintf(text, sizeof text, bodies[route], target);
        json_t *in = json_loads(text, 0, NULL), *errors = NULL;
        assert_non_null(in);
        int status = 0;
        json_t *s = route == 0 ? spec_validate(in, &env, &status, &errors)
                    : route == 1 ? spec_validate_calibration(in, &env, &status, &errors)
                                 : spec_validate_estimate(in, &env, &status, &errors);
        json_decref(in);
        assert_null(s);
        assert_int_equal(status, 422);
        assert_true(has_pointer(errors, "/target/engine"));
        const char *msg = json_string_value(json_object_get(json_array_get(errors, 0), "message"));
        if (!strstr(msg, "not installed"))
            fail_msg("route %d: %s", route, msg);
        json_decref(errors);
    }
}

/* llama.cpp not installed (a helper that is not there): a valid llama.cpp target is a 422
 * at /target/engine when it is posted; the built-in engine is unaffected. Runs before any
 * successful probe (lc_probe caches one). */
static void test_engine_absent(void **state)
{
    (void)state;
    assert_int_equal(setenv("AC_LLAMA_HELPER", "/nonexistent/ac-llama", 1), 0);
    expect_engine_absent("{\"engine\":\"llama.cpp\"}");
    expect_engine_absent("{\"engine\":\"llama.cpp\",\"precision\":\"q4_k_m\",\"threads\":2}");
    int status;
    json_t *errors;
    json_t *s = run(WITH_TARGET("{\"engine\":\"autocompress\",\"precision\":\"fp32\"}"), 0, &status, &errors);
    assert_non_null(s);
    json_decref(s);
}

/* llama.cpp installed (a fake helper that answers `info`): a valid target is normalized
 * with the engine's defaults, f16 weights and KV cache, and threads only when given. */
static void test_engine_llamacpp(void **state)
{
    (void)state;
    char helper[PATH_MAX + 32];
    snprintf(helper, sizeof helper, "%s/ac-llama", dir);
    FILE *f = fopen(helper, "w");
    assert_non_null(f);
    fputs("#!/bin/sh\necho '{\"ggml_version\":\"0.0.1\",\"ggml_commit\":\"test\",\"package_version\":\"0.0-test\","
          "\"build_flags\":\"\",\"system_info\":\"test\"}'\n", f);
    fclose(f);
    assert_int_equal(chmod(helper, 0755), 0);
    assert_int_equal(setenv("AC_LLAMA_HELPER", helper, 1), 0);
    int status;
    json_t *errors;
    json_t *s = run(WITH_TARGET("{\"engine\":\"llama.cpp\"}"), 0, &status, &errors);
    if (!s) {
        char *e = json_dumps(errors, 0);
        fail_msg("rejected: %s", e);
    }
    json_t *t = json_object_get(s, "target");
    assert_string_equal(json_string_value(json_object_get(t, "engine")), "llama.cpp");
    assert_string_equal(json_string_value(json_object_get(t, "precision")), "f16");
    assert_string_equal(json_string_value(json_object_get(t, "kv_cache_type")), "f16");
    assert_null(json_object_get(t, "threads"));
    assert_null(json_object_get(t, "engine_build"));
    assert_string_equal(json_string_value(json_object_get(t, "device")), "cpu");
    json_decref(s);
    s = run(WITH_TARGET("{\"engine\":\"llama.cpp\",\"precision\":\"q4_k_m\",\"kv_cache_type\":\"q8_0\","
                        "\"threads\":3,\"workload\":{\"batch_size\":2}}"), 0, &status, &errors);
    assert_non_null(s);
    t = json_object_get(s, "target");
    assert_string_equal(json_string_value(json_object_get(t, "precision")), "q4_k_m");
    assert_string_equal(json_string_value(json_object_get(t, "kv_cache_type")), "q8_0");
    assert_int_equal(json_integer_value(json_object_get(t, "threads")), 3);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(t, "workload"), "batch_size")), 2);
    json_decref(s);
    /* the combination is still checked once the engine is here */
    expect_fault(WITH_TARGET("{\"engine\":\"llama.cpp\",\"precision\":\"bf16\",\"kv_cache_type\":\"f8\"}"), 422,
                 "/target/kv_cache_type");
}

/* Validate text against a store that holds one worker agent offering cuda:0 with engines
 * (a JSON list's items); the normalized spec, or NULL with *status and *errors. */
static json_t *run_with_gpu_agent(store *st, const char *engines, const char *text, int *status, json_t **errors)
{
    char info[512];
    snprintf(info, sizeof info, "{\"devices\":[{\"id\":\"cuda:0\",\"memory_bytes\":85899345920,\"precisions\":"
             "[\"fp32\",\"bf16\"]}],\"engines\":[%s],\"workers_per_device\":1}", engines);
    assert_int_equal(store_runner_beat(st, "worker/gpuhost/data", info), 0);
    json_t *in = json_loads(text, 0, NULL);
    assert_non_null(in);
    spec_env env = env_of(0);
    env.st = st;
    *status = 0;
    *errors = NULL;
    json_t *out = spec_validate(in, &env, status, errors);
    json_decref(in);
    return out;
}

/* A device is stored under its one name: "cuda", "cuda:00" and "cuda:000" are cuda:0, so a
 * job names the device runners claim by (a job queued as "cuda:00" was never claimed).
 * Here a worker agent sharing the store offers cuda:0. */
static void test_device_names_canonical(void **state)
{
    (void)state;
    char db[PATH_MAX + 16], err[256];
    snprintf(db, sizeof db, "%s/runners.db", dir);
    store *st = store_open(db, err, sizeof err);
    assert_non_null(st);
    static const char *const names[] = {"cuda", "cuda:0", "cuda:00", "cuda:000"};
    int status;
    json_t *errors;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"target\":{\"device\":\"%s\"}}",
                 names[i]);
        json_t *out = run_with_gpu_agent(st, "\"autocompress\"", text, &status, &errors);
        if (!out) {
            char *e = json_dumps(errors, 0);
            fail_msg("%s: %d %s", names[i], status, e);
        }
        assert_string_equal(json_string_value(json_object_get(json_object_get(out, "target"), "device")), "cuda:0");
        json_decref(out);
    }
    /* llama.cpp is measured on the CPU only (its helper offloads no layer to a GPU): a
     * llama.cpp target on a GPU is refused, even where an agent with that GPU has llama.cpp,
     * rather than priced and measured on the CPU and reported as the GPU's */
    json_t *out = run_with_gpu_agent(st, "\"autocompress\",\"llama.cpp\"",
                                     "{" OK_MODEL ",\"constraints\":{\"latency_ms\":1},\"target\":{\"device\":"
                                     "\"cuda:0\",\"engine\":\"llama.cpp\",\"precision\":\"q8_0\"}}", &status, &errors);
    if (out)
        fail_msg("a llama.cpp target on cuda:0 was accepted");
    assert_int_equal(status, 422);
    assert_true(has_pointer(errors, "/target/device"));
    json_decref(errors);
    store_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_full_spec),
        cmocka_unit_test(test_precision_on_device),
        cmocka_unit_test(test_shape_faults),
        cmocka_unit_test(test_value_faults),
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_qwen2_exports),
        cmocka_unit_test(test_context_linear_rope),
        cmocka_unit_test(test_ranking_and_all_faults),
        cmocka_unit_test(test_faults_cut_inside_a_character),
        cmocka_unit_test(test_test_fields),
        cmocka_unit_test(test_callback_url),
        cmocka_unit_test(test_calibration_request),
        cmocka_unit_test(test_engine_faults),
        cmocka_unit_test(test_engine_absent),
        cmocka_unit_test(test_engine_llamacpp),
        cmocka_unit_test(test_device_names_canonical),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
