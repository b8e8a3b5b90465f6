/* tests/unit/test_formats_models.c — llama2.c reader (stories260K: arch, truncated and
 * hostile files), config.json parsing (Llama, Mistral, Qwen2 bias, rope scaling), and
 * modelio end to end: stories260K loads into the engine, is written back as an HF
 * directory (config.json + safetensors) and reloads with identical logits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "storage/hfconfig.h"
#include "storage/llama2c.h"
#include "storage/modelio.h"
#include "storage/safetensors.h"

static char stories[512], tok512[512], tmpdir[64];

static int setup(void **state)
{
    (void)state;
    const char *shared = getenv("AC_SHARED");
    snprintf(stories, sizeof stories, "%s/data/models/stories260K/stories260K.bin", shared ? shared : "../shared");
    snprintf(tok512, sizeof tok512, "%s/data/models/stories260K/tok512.bin", shared ? shared : "../shared");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ac_models_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    assert_true(len > 0);
    rewind(f);
    uint8_t *b = malloc((size_t)len + 64);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static void test_llama2c(void **state)
{
    (void)state;
    l2c_file f;
    arch a;
    char err[256];
    assert_int_equal(l2c_open(&f, stories, err, sizeof err), 0);
    assert_int_equal(l2c_arch(&f, &a, err, sizeof err), 0);
    assert_int_equal(a.hidden_size, 64);
    assert_int_equal(a.n_layers, 5);
    assert_int_equal(a.layers[0].n_heads, 8);
    assert_int_equal(a.layers[0].n_kv_heads, 4);
    assert_int_equal(a.layers[4].ffn_dim, 172);
    assert_int_equal(a.vocab_size, 512);
    assert_true(a.tie_word_embeddings);
    assert_int_equal(f.n, 47);
    arch_free(&a);
    l2c_close(&f);
    size_t n;
    uint8_t *b = slurp(stories, &n);
    assert_int_equal(l2c_open_mem(&f, b, n - 4, err, sizeof err), -1);
    assert_non_null(strstr(err, "truncated"));
    assert_int_equal(l2c_open_mem(&f, b, n + 4, err, sizeof err), -1);
    assert_non_null(strstr(err, "trailing"));
    for (size_t k = 0; k < 40; k++)
        assert_int_equal(l2c_open_mem(&f, b, k, err, sizeof err), -1);
    int32_t bad[][7] = {{64, 172, 5, 8, 3, 512, 512},           /* kv heads do not divide heads */
                        {64, 172, 5, 8, 4, INT32_MIN, 512},     /* vocab overflow */
                        {0x7fffffff, 172, 5, 8, 4, 512, 512},   /* huge dim */
                        {64, 172, -5, 8, 4, 512, 512}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t h[28 + 64] = {0};
        memcpy(h, bad[i], 28);
        assert_int_equal(l2c_open_mem(&f, h, sizeof h, err, sizeof err), -1);
        assert_non_null(strstr(err, "implausible"));
    }
    free(b);
}

/* A Mamba2ForCausalLM whose d_inner is no whole multiple of hidden (32 over 24, as a hidden
 * cut leaves it): its config.json, written with the export's digits, reads back the same. */
static void test_hfconfig_mamba2_expand(void **state)
{
    (void)state;
    arch a, b;
    char err[256];
    json_t *j = json_loads("{\"architectures\":[\"Mamba2ForCausalLM\"],\"vocab_size\":512,\"hidden_size\":24,"
                           "\"num_hidden_layers\":2,\"num_heads\":8,\"head_dim\":4,\"state_size\":16,"
                           "\"n_groups\":2,\"conv_kernel\":4,\"expand\":1.3333333333333333,"
                           "\"layer_norm_epsilon\":1e-05,\"tie_word_embeddings\":true}", 0, NULL);
    assert_non_null(j);
    if (hfconfig_to_arch(j, &a, err, sizeof err))
        fail_msg("%s", err);
    json_t *back = hfconfig_from_arch(&a, NULL, err, sizeof err);
    if (!back)
        fail_msg("%s", err);
    char *text = json_dumps(back, JSON_REAL_PRECISION(EXPORT_REAL_DIGITS));
    json_t *re = json_loads(text, 0, NULL);
    assert_non_null(re);
    if (hfconfig_to_arch(re, &b, err, sizeof err))
        fail_msg("%s: %s", text, err);
    assert_true(arch_equal(&a, &b));
    free(text);
    json_decref(re);
    json_decref(back);
    json_decref(j);
    arch_free(&a);
    arch_free(&b);
}

static void test_hfconfig(void **state)
{
    (void)state;
    arch a, b;
    char err[256];
    json_t *j = json_loads("{\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":151936,\"hidden_size\":896,"
                           "\"intermediate_size\":4864,\"num_hidden_layers\":24,\"num_attention_heads\":14,"
                           "\"num_key_value_heads\":2,\"max_position_embeddings\":32768,\"rope_theta\":1000000.0,"
                           "\"rms_norm_eps\":1e-06,\"tie_word_embeddings\":true,\"sliding_window\":32768,"
                           "\"use_sliding_window\":false}", 0, NULL);
    assert_int_equal(hfconfig_to_arch(j, &a, err, sizeof err), 0);
    assert_true(a.attention_bias);
    assert_int_equal(a.head_dim, 64);
    assert_int_equal(a.layers[23].n_kv_heads, 2);
    json_t *back = hfconfig_from_arch(&a, "bfloat16", err, sizeof err);
    assert_non_null(back);
    assert_string_equal(json_string_value(json_array_get(json_object_get(back, "architectures"), 0)),
                        "Qwen2ForCausalLM");
    assert_int_equal(hfconfig_to_arch(back, &b, err, sizeof err), 0);
    assert_true(arch_equal(&a, &b));
    json_decref(back);
    json_decref(j);
    arch_free(&b);
    /* non-uniform archs cannot be written as config.json */
    a.layers[3].ffn_dim = 100;
    assert_null(hfconfig_from_arch(&a, NULL, err, sizeof err));
    assert_non_null(strstr(err, "uniform"));
    arch_free(&a);
    j = json_loads("{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":128256,\"hidden_size\":2048,"
                   "\"intermediate_size\":8192,\"num_hidden_layers\":16,\"num_attention_heads\":32,"
                   "\"num_key_value_heads\":8,\"head_dim\":64,\"max_position_embeddings\":131072,"
                   "\"rope_theta\":500000.0,\"rms_norm_eps\":1e-05,\"tie_word_embeddings\":true,"
                   "\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
                   "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}}", 0, NULL);
    assert_int_equal(hfconfig_to_arch(j, &a, err, sizeof err), 0);
    assert_int_equal(a.rope_scaling.type, ROPE_SCALING_LLAMA3);
    assert_true(a.rope_scaling.factor == 32.0);
    assert_int_equal(a.rope_scaling.original_max_position_embeddings, 8192);
    back = hfconfig_from_arch(&a, NULL, err, sizeof err);
    assert_int_equal(hfconfig_to_arch(back, &b, err, sizeof err), 0);
    assert_true(arch_equal(&a, &b));
    json_decref(back);
    arch_free(&a);
    arch_free(&b);
    json_decref(j);
    /* a config without max_position_embeddings: transformers' default for its class */
    static const struct { const char *cls; int ctx; } absent[] = {
        {"LlamaForCausalLM", 2048}, {"MistralForCausalLM", 131072}, {"Qwen2ForCausalLM", 32768}};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++) {
        char cfg[400];
        snprintf(cfg, sizeof cfg, "{\"architectures\":[\"%s\"],\"hidden_size\":64,\"intermediate_size\":128,"
                 "\"num_hidden_layers\":2,\"num_attention_heads\":4}", absent[i].cls);
        j = json_loads(cfg, 0, NULL);
        assert_non_null(j);
        assert_int_equal(hfconfig_to_arch(j, &a, err, sizeof err), 0);
        assert_int_equal(a.max_position_embeddings, absent[i].ctx);
        arch_free(&a);
        json_decref(j);
    }
    static const struct { const char *cfg, *needle; } bad[] = {
        {"{\"architectures\":[\"GPT2LMHeadModel\"]}", "not supported"},
        {"{\"model_type\":\"mistral\",\"hidden_size\":4096,\"intermediate_size\":14336,\"num_hidden_layers\":32,"
         "\"num_attention_heads\":32,\"num_key_value_heads\":8,\"max_position_embeddings\":32768,"
         "\"sliding_window\":4096}", "sliding_window"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":3}", "num_key_value_heads"},
        {"{\"model_type\":\"llama\",\"hidden_size\":\"64\"}", "hidden_size"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
         "\"num_attention_heads\":4,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}", "yarn"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = json_loads(bad[i].cfg, 0, NULL);
        assert_non_null(j);
        assert_int_equal(hfconfig_to_arch(j, &a, err, sizeof err), -1);
        if (!strstr(err, bad[i].needle))
            fail_msg("config %zu: \"%s\" lacks \"%s\"", i, err, bad[i].needle);
        json_decref(j);
    }
}

/* DeciLMForCausalLM (Nemotron-NAS block_configs) as NVIDIA's Llama-3_1-Nemotron-51B
 * writes it, cut to four layers: per-layer KV heads (n_heads_in_group), per-layer FFN
 * widths (ffn_mult), attention or FFN removed (no_op); and our own source-layer record. */
static void test_hfconfig_decilm(void **state)
{
    (void)state;
    arch a;
    char err[256];
    static const char *const head =
        "{\"architectures\":[\"DeciLMForCausalLM\"],\"model_type\":\"nemotron-nas\",\"vocab_size\":128256,"
        "\"hidden_size\":8192,\"num_hidden_layers\":4,\"num_attention_heads\":64,\"intermediate_size\":null,"
        "\"num_key_value_heads\":null,\"max_position_embeddings\":131072,\"rope_theta\":500000.0,"
        "\"rms_norm_eps\":1e-05,\"tie_word_embeddings\":false,\"rope_scaling\":{\"factor\":8.0,"
        "\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,"
        "\"rope_type\":\"llama3\"},";
    static const char *const blocks =
        "\"block_configs\":["
        "{\"attention\":{\"n_heads_in_group\":8,\"no_op\":false,\"replace_with_linear\":false,\"sparsify\":null,"
        "\"num_sink_tokens\":null,\"window_length\":null,\"unshifted_sink\":false,"
        "\"use_prefill_window_in_sink_attention\":false},\"ffn\":{\"ffn_mult\":5.25,\"no_op\":false,"
        "\"replace_with_linear\":false,\"sparsify\":null}},"
        "{\"attention\":{\"n_heads_in_group\":64,\"no_op\":false},\"ffn\":{\"ffn_mult\":1.3125,\"no_op\":false}},"
        "{\"attention\":{\"n_heads_in_group\":null,\"no_op\":true},\"ffn\":{\"ffn_mult\":2.625,\"no_op\":false}},"
        "{\"attention\":{\"n_heads_in_group\":16,\"no_op\":false},\"ffn\":{\"ffn_mult\":null,\"no_op\":true}}]";
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s%s,\"autocompress_source_layers\":[0,3,5,7]}", head, blocks);
    json_t *j = json_loads(cfg, 0, NULL);
    assert_non_null(j);
    if (hfconfig_to_arch(j, &a, err, sizeof err))
        fail_msg("%s", err);
    json_decref(j);
    assert_int_equal(a.n_layers, 4);
    assert_int_equal(a.head_dim, 128);
    assert_int_equal(a.rope_scaling.type, ROPE_SCALING_LLAMA3);
    static const int want[4][4] = {{64, 8, 28672, 0}, {64, 1, 7168, 3}, {0, 0, 14336, 5}, {64, 4, 0, 7}};
    for (int l = 0; l < 4; l++) {
        assert_int_equal(a.layers[l].n_heads, want[l][0]);
        assert_int_equal(a.layers[l].n_kv_heads, want[l][1]);
        assert_int_equal(a.layers[l].ffn_dim, want[l][2]);
        assert_int_equal(a.layers[l].source_layer, want[l][3]);
    }
    assert_false(arch_is_uniform(&a));
    arch_free(&a);
    /* what the engine cannot run, or a config that does not add up, is refused by name */
    static const struct { const char *blocks, *needle; } bad[] = {
        {"\"block_configs\":[{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}}]", "block_configs"},
        {"\"block_configs\":[{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"no_op\":false,\"replace_with_linear\":true},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}}]", "replace_with_linear"},
        {"\"block_configs\":[{\"attention\":{\"n_heads_in_group\":8,\"window_length\":4096},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}}]", "window_length"},
        {"\"block_configs\":[{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":7},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}}]", "n_heads_in_group"},
        {"\"block_configs\":[{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}}]", "ffn_mult"},
        {"\"block_configs\":[{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"no_op\":true},\"ffn\":{\"no_op\":true}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}}]", "block_configs[1]"},
        {"\"block_configs\":[{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}},"
         "{\"attention\":{\"n_heads_in_group\":8},\"ffn\":{\"ffn_mult\":1.0}}],"
         "\"autocompress_source_layers\":[0,1]", "autocompress_source_layers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cfg, sizeof cfg, "%s%s}", head, bad[i].blocks);
        j = json_loads(cfg, 0, NULL);
        assert_non_null(j);
        assert_int_equal(hfconfig_to_arch(j, &a, err, sizeof err), -1);
        if (!strstr(err, bad[i].needle))
            fail_msg("DeciLM config %zu: \"%s\" lacks \"%s\"", i, err, bad[i].needle);
        json_decref(j);
    }
}

/* Logits of `ids` (all positions) into a new buffer. */
static float *logits_of(eng_model *m, const int *ids, int T)
{
    float *lg = malloc((size_t)T * (size_t)m->a.vocab_size * sizeof *lg);
    char err[256];
    assert_non_null(lg);
    eng_fwd_args fa = {.tokens = ids, .B = 1, .T = T, .logits_mode = ENG_LOGITS_ALL, .logits = lg};
    assert_int_equal(eng_forward(m, &fa, err, sizeof err), 0);
    return lg;
}

/* Write m as an HF directory under tmpdir/name with weights in dtype. */
static void write_hf_dir(eng_model *m, const char *name, st_dtype dt, char *dir, size_t dirlen)
{
    char err[256], p[256];
    snprintf(dir, dirlen, "%s/%s", tmpdir, name);
    snprintf(p, sizeof p, "mkdir -p %s", dir);
    assert_int_equal(system(p), 0);
    json_t *cfg = hfconfig_from_arch(&m->a, "float32", err, sizeof err);
    assert_non_null(cfg);
    snprintf(p, sizeof p, "%s/config.json", dir);
    assert_int_equal(json_dump_file(cfg, p, JSON_INDENT(2)), 0);
    json_decref(cfg);
    int n = eng_model_tensor_count(m);
    st_write_tensor *ts = calloc((size_t)n, sizeof *ts);
    float **bufs = calloc((size_t)n, sizeof *bufs);
    assert_non_null(ts);
    assert_non_null(bufs);
    for (int i = 0; i < n; i++) {
        const char *tn;
        int64_t sh[2];
        int nd;
        float *d;
        assert_int_equal(eng_model_tensor(m, i, &tn, sh, &nd, &d), 0);
        int64_t ne = sh[0] * (nd == 2 ? sh[1] : 1);
        bufs[i] = malloc((size_t)ne * sizeof(float));
        assert_int_equal(eng_model_get_tensor(m, tn, bufs[i], ne), ne);
        ts[i] = (st_write_tensor){.name = tn, .data = bufs[i], .shape = {sh[0], sh[1]}, .ndim = nd};
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(st_write(p, ts, n, dt, NULL, err, sizeof err), 0);
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(ts);
}

static void test_modelio_round_trip(void **state)
{
    (void)state;
    eng_backend *be = eng_backend_cpu_new(1);
    assert_non_null(be);
    eng_model m, h, hb;
    tok_tokenizer *tok = NULL;
    char err[512], dir[256];
    assert_int_equal(mio_load_model(stories, NULL, be, &m, &tok, err, sizeof err), 0);
    assert_non_null(tok);
    int ids[] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
    float *ref = logits_of(&m, ids, 10);
    write_hf_dir(&m, "hf32", ST_F32, dir, sizeof dir);
    assert_int_equal(mio_load_model(dir, tok512, be, &h, NULL, err, sizeof err), 0);
    float *got = logits_of(&h, ids, 10);
    for (int i = 0; i < 10 * 512; i++)
        assert_true(got[i] == ref[i]);
    free(got);
    eng_model_free(&h);
    write_hf_dir(&m, "hfbf16", ST_BF16, dir, sizeof dir);
    assert_int_equal(mio_load_model(dir, tok512, be, &hb, NULL, err, sizeof err), 0);
    got = logits_of(&hb, ids, 10);
    double maxd = 0;
    for (int i = 0; i < 10 * 512; i++)
        maxd = fmax(maxd, fabs((double)got[i] - ref[i]));
    assert_true(maxd < 0.25);   /* bf16 weights: close, not equal */
    assert_true(maxd > 0);
    free(got);
    /* not a model file; a directory whose tensor has the wrong shape; one with tensors missing */
    mio_model mm;
    assert_int_equal(mio_open(&mm, tok512, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "implausible header"));   /* a .bin that is a tokenizer */
    char p[300];
    snprintf(p, sizeof p, "%s/hf32/model.safetensors", tmpdir);
    float norm[64];
    for (int i = 0; i < 64; i++)
        norm[i] = 1;
    st_write_tensor only = {"model.norm.weight", norm, {1}, 1};
    assert_int_equal(st_write(p, &only, 1, ST_F32, NULL, err, sizeof err), 0);
    snprintf(p, sizeof p, "%s/hf32", tmpdir);
    eng_model bad;
    assert_int_equal(mio_load_model(p, tok512, be, &bad, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "model.norm.weight"));
    snprintf(p, sizeof p, "%s/hf32/model.safetensors", tmpdir);
    only.shape[0] = 64;
    assert_int_equal(st_write(p, &only, 1, ST_F32, NULL, err, sizeof err), 0);
    snprintf(p, sizeof p, "%s/hf32", tmpdir);
    assert_int_equal(mio_load_model(p, tok512, be, &bad, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "is missing"));
    free(ref);
    eng_model_free(&hb);
    eng_model_free(&m);
    tok_free(tok);
    eng_backend_free(be);
}

/* Mixtral and Qwen2-MoE config.json: the family's fields (defaults as transformers'), dense
 * layers by mlp_only_layers and decoder_sparse_step, per-layer experts through block_configs,
 * round trips, and what is refused. */
static void test_hfconfig_moe(void **state)
{
    (void)state;
    arch a, b;
    char err[256];
    json_t *j = json_loads("{\"architectures\":[\"MixtralForCausalLM\"],\"vocab_size\":32000,\"hidden_size\":4096,"
                           "\"intermediate_size\":14336,\"num_hidden_layers\":32,\"num_attention_heads\":32,"
                           "\"num_key_value_heads\":8,\"num_local_experts\":8,\"num_experts_per_tok\":2,"
                           "\"max_position_embeddings\":32768,\"rope_theta\":1e6,\"sliding_window\":null}", 0, NULL);
    assert_int_equal(hfconfig_to_arch(j, &a, err, sizeof err), 0);
    assert_string_equal(a.family, "mixtral");
    assert_int_equal(a.layers[31].moe.n_experts, 8);
    assert_int_equal(a.layers[31].moe.top_k, 2);
    assert_int_equal(a.layers[31].moe.expert_ffn_dim, 14336);
    assert_int_equal(a.layers[31].moe.norm_topk, 1);
    assert_int_equal(a.layers[31].ffn_dim, 0);
    assert_false(a.attention_bias);
    assert_int_equal(arch_params(&a), 46702792704LL);   /* Mixtral-8x7B's 46.7B */
    json_decref(j);
    /* per-layer experts and a removed attention: block_configs, read back the same */
    a.layers[3].moe.n_experts = 5;
    a.layers[7].moe.n_experts = 1;
    a.layers[7].moe.top_k = 1;
    a.layers[9].n_heads = a.layers[9].n_kv_heads = 0;
    a.layers[11].n_kv_heads = 4;
    json_t *back = hfconfig_from_arch(&a, "bfloat16", err, sizeof err);
    assert_non_null(back);
    assert_true(json_is_array(json_object_get(back, "block_configs")));
    assert_int_equal(hfconfig_to_arch(back, &b, err, sizeof err), 0);
    assert_true(arch_equal(&a, &b));
    json_decref(back);
    arch_free(&b);
    /* no attention layer left, no MoE left: block_configs still say it all */
    assert_int_equal(arch_copy(&b, &a), 0);
    for (int l = 0; l < b.n_layers; l++) {
        b.layers[l].n_heads = b.layers[l].n_kv_heads = 0;
        if (l % 2) {
            memset(&b.layers[l].moe, 0, sizeof b.layers[l].moe);
            b.layers[l].ffn_dim = 256;
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        back = hfconfig_from_arch(&b, NULL, err, sizeof err);
        if (!back)
            fail_msg("%s", err);
        arch c;
        assert_int_equal(hfconfig_to_arch(back, &c, err, sizeof err), 0);
        assert_true(arch_equal(&b, &c));
        arch_free(&c);
        json_decref(back);
        for (int l = 0; l < b.n_layers; l += 2) {   /* then no MoE either */
            memset(&b.layers[l].moe, 0, sizeof b.layers[l].moe);
            b.layers[l].ffn_dim = 512;
        }
    }
    arch_free(&b);
    a.layers[5].n_heads = 16;   /* per-layer query heads: not in these configs */
    a.layers[5].n_kv_heads = 4;
    assert_null(hfconfig_from_arch(&a, NULL, err, sizeof err));
    assert_non_null(strstr(err, "query-head"));
    arch_free(&a);
    /* Qwen2-MoE: transformers' defaults, dense layers by decoder_sparse_step / mlp_only_layers */
    j = json_loads("{\"model_type\":\"qwen2_moe\",\"vocab_size\":151936,\"hidden_size\":2048,\"num_hidden_layers\":4,"
                   "\"num_attention_heads\":16,\"num_key_value_heads\":16,\"decoder_sparse_step\":2,"
                   "\"tie_word_embeddings\":false}", 0, NULL);
    assert_int_equal(hfconfig_to_arch(j, &a, err, sizeof err), 0);
    assert_string_equal(a.family, "qwen2_moe");
    assert_true(a.attention_bias);
    assert_int_equal(a.layers[0].ffn_dim, 5632);
    assert_int_equal(a.layers[1].moe.n_experts, 60);
    assert_int_equal(a.layers[1].moe.top_k, 4);
    assert_int_equal(a.layers[1].moe.expert_ffn_dim, 1408);
    assert_int_equal(a.layers[1].moe.shared_ffn_dim, 5632);
    assert_int_equal(a.layers[1].moe.norm_topk, 0);
    back = hfconfig_from_arch(&a, NULL, err, sizeof err);
    assert_int_equal(json_integer_value(json_object_get(back, "decoder_sparse_step")), 2);
    assert_null(json_object_get(back, "block_configs"));
    assert_int_equal(hfconfig_to_arch(back, &b, err, sizeof err), 0);
    assert_true(arch_equal(&a, &b));
    json_decref(back);
    arch_free(&b);
    json_decref(j);
    a.layers[2].moe = a.layers[1].moe;   /* dense only at 0: mlp_only_layers */
    a.layers[2].ffn_dim = 0;
    back = hfconfig_from_arch(&a, NULL, err, sizeof err);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(back, "mlp_only_layers"), 0)), 0);
    assert_int_equal(hfconfig_to_arch(back, &b, err, sizeof err), 0);
    assert_true(arch_equal(&a, &b));
    json_decref(back);
    arch_free(&b);
    arch_free(&a);
    static const struct { const char *cfg, *needle; } bad[] = {
        {"{\"model_type\":\"qwen2_moe\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"num_experts\":4,\"num_experts_per_tok\":6}", "exceeds"},
        {"{\"model_type\":\"mixtral\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"num_local_experts\":\"8\"}", "MoE fields"},
        {"{\"model_type\":\"mixtral\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"block_configs\":[{\"attention\":{\"n_heads_in_group\":2},\"ffn\":{\"moe\":{\"num_local_experts\":2}}}]}",
         "block_configs"},
        {"{\"model_type\":\"mixtral\",\"hidden_size\":64,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
         "\"block_configs\":[{\"attention\":{\"n_heads_in_group\":2},\"ffn\":{\"moe\":{\"num_local_experts\":2}}}]}",
         "num_experts_per_tok"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = json_loads(bad[i].cfg, 0, NULL);
        assert_non_null(j);
        assert_int_equal(hfconfig_to_arch(j, &a, err, sizeof err), -1);
        if (!strstr(err, bad[i].needle))
            fail_msg("config %zu: \"%s\" lacks \"%s\"", i, err, bad[i].needle);
        json_decref(j);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2c),
        cmocka_unit_test(test_hfconfig),
        cmocka_unit_test(test_hfconfig_mamba2_expand),
        cmocka_unit_test(test_hfconfig_decilm),
        cmocka_unit_test(test_hfconfig_moe),
        cmocka_unit_test(test_modelio_round_trip),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
