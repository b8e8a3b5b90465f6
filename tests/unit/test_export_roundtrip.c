/* tests/unit/test_export_roundtrip.c — export round trips and refusals on tiny random
 * models: HF fp32 reloads to bit-identical logits, HF bf16 reloads to exactly the
 * bf16-rounded model's logits, DeciLM block_configs reload to the same heterogeneous arch
 * and logits, uniform GGUF (q/k permuted for llama.cpp) reloads exactly; archs a format
 * cannot express are refused with a reason; SHA256SUMS catches a flipped byte and a
 * truncation; the GGUF writer's metadata and tensors read back through storage/gguf.h;
 * the ustar writer's headers are well-formed; the model card states what it was given.
 * An export renamed into place is durable: the folder it was renamed into is fsynced
 * (fsync_log.h records it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "storage/ckpt.h"
#include "storage/export.h"
#include "storage/fileio.h"
#include "storage/gguf.h"
#include "storage/gguf_write.h"
#include "storage/hfconfig.h"
#include "storage/modelcard.h"
#include "storage/modelio.h"
#include "storage/safetensors.h"
#include "storage/tar.h"
#include "fsync_log.h"

static char tmpdir[256];
static eng_backend *be;

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_export_XXXXXX");
    if (!mkdtemp(tmpdir))
        return -1;
    be = eng_backend_cpu_new(1);
    return be ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        return -1;
    eng_backend_free(be);
    return 0;
}

/* 1 when the export folder tmpdir was fsynced since g_nsynced was last reset. */
static int folder_synced(void)
{
    char real[512];
    if (!realpath(tmpdir, real))
        return 0;
    for (int i = 0; i < g_nsynced; i++)
        if (!strcmp(g_synced[i], real))
            return 1;
    return 0;
}

static void path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmpdir, name);
}

/* A tiny llama arch; layers given as (heads, kv, ffn) triples. */
static void make_arch(arch *a, int hidden, int head_dim, int n, const int (*l)[3], int tied)
{
    assert_int_equal(arch_init(a, n), 0);
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = 96;
    a->hidden_size = hidden;
    a->head_dim = head_dim;
    a->max_position_embeddings = 64;
    a->rope_theta = 10000.0;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = tied;
    for (int i = 0; i < n; i++) {
        a->layers[i].source_layer = 2 * i;
        a->layers[i].n_heads = l[i][0];
        a->layers[i].n_kv_heads = l[i][1];
        a->layers[i].ffn_dim = l[i][2];
    }
}

static const int TOKENS[] = {1, 5, 9, 33, 2, 70, 71, 12, 90, 3, 44, 8};
#define NT ((int)(sizeof TOKENS / sizeof *TOKENS))

static float *logits_of(eng_model *m)
{
    char err[256];
    float *lg = malloc((size_t)NT * m->a.vocab_size * sizeof *lg);
    assert_non_null(lg);
    eng_fwd_args a = {.tokens = TOKENS, .B = 1, .T = NT, .logits_mode = ENG_LOGITS_ALL, .logits = lg};
    assert_int_equal(eng_forward(m, &a, err, sizeof err), 0);
    return lg;
}

static void random_model(eng_model *m, const arch *a, uint64_t seed)
{
    char err[256];
    assert_int_equal(eng_model_init(m, a, be, err, sizeof err), 0);
    eng_model_randomize(m, seed, 0.2f);
}

/* Export to HF in dtype, reload, return the reloaded model. */
static void hf_roundtrip(eng_model *m, exp_dtype dt, const char *name, eng_model *back, exp_result *res)
{
    char dir[512], err[512];
    path(dir, sizeof dir, name);
    exp_opts o = {.dtype = dt};
    g_nsynced = 0;
    int rc = exp_hf_write(m, dir, &o, res, err, sizeof err);
    if (rc)
        fail_msg("export: %s", err);
    assert_true(folder_synced());   /* the rename of the assembly folder to DIR survives a power loss */
    rc = exp_load_model(dir, be, back, err, sizeof err);
    if (rc)
        fail_msg("reload: %s", err);
}

static void test_hf_fp32_exact(void **state)
{
    (void)state;
    static const int L[][3] = {{4, 2, 48}, {4, 2, 48}};
    arch a;
    make_arch(&a, 32, 8, 2, L, 0);
    eng_model m, b;
    random_model(&m, &a, 7);
    exp_result r;
    hf_roundtrip(&m, EXP_FP32, "hf32", &b, &r);
    assert_string_equal(r.model_class, "LlamaForCausalLM");
    assert_int_equal(r.n_shards, 1);
    assert_true(arch_equal(&m.a, &b.a));
    float *x = logits_of(&m), *y = logits_of(&b);
    assert_memory_equal(x, y, (size_t)NT * a.vocab_size * sizeof *x);
    free(x);
    free(y);
    eng_model_free(&b);
    eng_model_free(&m);
    arch_free(&a);
}

static void test_hf_bf16_sharded(void **state)
{
    (void)state;
    static const int L[][3] = {{4, 4, 40}, {4, 4, 40}, {4, 4, 40}};
    arch a;
    make_arch(&a, 32, 8, 3, L, 1);
    eng_model m, b, rounded;
    random_model(&m, &a, 11);
    /* The reference: the same model with every weight rounded to bf16 in memory. */
    random_model(&rounded, &a, 11);
    int n = eng_model_tensor_count(&rounded);
    for (int i = 0; i < n; i++) {
        const char *name;
        int64_t shape[2];
        int nd;
        float *dev;
        assert_int_equal(eng_model_tensor(&rounded, i, &name, shape, &nd, &dev), 0);
        int64_t cnt = shape[0] * (nd == 2 ? shape[1] : 1);
        float *h = malloc((size_t)cnt * sizeof *h);
        assert_int_equal(eng_model_get_tensor(&rounded, name, h, cnt), cnt);
        for (int64_t k = 0; k < cnt; k++)
            h[k] = st_bf16_to_f32(st_f32_to_bf16(h[k]));
        char err[256];
        assert_int_equal(eng_model_set_tensor(&rounded, name, h, shape, nd, err, sizeof err), 0);
        free(h);
    }
    char dir[512], err[512];
    path(dir, sizeof dir, "hfbf16");
    exp_opts o = {.dtype = EXP_BF16, .shard_bytes = 4096};   /* forces several shards */
    exp_result r;
    assert_int_equal(exp_hf_write(&m, dir, &o, &r, err, sizeof err), 0);
    assert_true(r.n_shards > 1);
    char idx[600];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    assert_int_equal(access(idx, R_OK), 0);
    assert_int_equal(exp_load_model(dir, be, &b, err, sizeof err), 0);
    float *x = logits_of(&rounded), *y = logits_of(&b), *z = logits_of(&m);
    assert_memory_equal(x, y, (size_t)NT * a.vocab_size * sizeof *x);
    double maxd = 0;
    for (int i = 0; i < NT * a.vocab_size; i++)
        maxd = fmax(maxd, fabs(z[i] - y[i]));
    assert_true(maxd > 0 && maxd < 0.1);   /* bf16 rounding moves logits a little, not a lot */
    free(x);
    free(y);
    free(z);
    eng_model_free(&b);
    eng_model_free(&rounded);
    eng_model_free(&m);
    arch_free(&a);
}

static void test_decilm_roundtrip(void **state)
{
    (void)state;
    /* Fixed query heads (4), per-layer KV heads, FFN widths in multiples of 256,
     * one attention-free layer and one MLP-free layer. */
    static const int L[][3] = {{4, 2, 256}, {4, 1, 512}, {0, 0, 256}, {4, 4, 0}};
    arch a;
    make_arch(&a, 32, 8, 4, L, 1);
    eng_model m, b;
    random_model(&m, &a, 5);
    exp_result r;
    hf_roundtrip(&m, EXP_FP32, "deci", &b, &r);
    assert_string_equal(r.model_class, "DeciLMForCausalLM");
    assert_true(arch_equal(&m.a, &b.a));
    float *x = logits_of(&m), *y = logits_of(&b);
    assert_memory_equal(x, y, (size_t)NT * a.vocab_size * sizeof *x);
    free(y);
    eng_model_free(&b);
    /* Every subcommand loads through storage/modelio: the same arch and logits there. */
    char err[512], dir[512];
    path(dir, sizeof dir, "deci");
    if (mio_load_model(dir, NULL, be, &b, NULL, err, sizeof err))
        fail_msg("mio_load_model: %s", err);
    assert_true(arch_equal(&m.a, &b.a));
    y = logits_of(&b);
    assert_memory_equal(x, y, (size_t)NT * a.vocab_size * sizeof *x);
    free(x);
    free(y);
    /* The config in the readers' terms. */
    char p[600];
    snprintf(p, sizeof p, "%s/deci/config.json", tmpdir);
    json_error_t je;
    json_t *c = json_load_file(p, 0, &je);
    assert_non_null(c);
    assert_string_equal(json_string_value(json_object_get(c, "model_type")), "nemotron-nas");
    assert_int_equal(json_integer_value(json_object_get(c, "num_attention_heads")), 4);
    json_t *bc = json_object_get(c, "block_configs");
    assert_int_equal(json_array_size(bc), 4);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(json_array_get(bc, 1), "attention"),
                                                        "n_heads_in_group")), 4);
    assert_true(json_is_true(json_object_get(json_object_get(json_array_get(bc, 2), "attention"), "no_op")));
    assert_true(json_is_null(json_object_get(json_object_get(json_array_get(bc, 3), "ffn"), "ffn_mult")));
    double mult = json_number_value(json_object_get(json_object_get(json_array_get(bc, 1), "ffn"), "ffn_mult"));
    assert_int_equal(hfconfig_decilm_intermediate_size(mult, 32), 512);
    json_decref(c);
    eng_model_free(&b);
    eng_model_free(&m);
    arch_free(&a);
}

static void test_gguf_llama_exact(void **state)
{
    (void)state;
    static const int L[][3] = {{4, 2, 64}, {4, 2, 64}};
    arch a;
    make_arch(&a, 32, 8, 2, L, 0);
    eng_model m, b;
    random_model(&m, &a, 3);
    char f[512], err[512];
    path(f, sizeof f, "u.gguf");
    exp_opts o = {.dtype = EXP_FP32};
    exp_result r;
    g_nsynced = 0;
    assert_int_equal(exp_gguf_write(&m, f, &o, &r, err, sizeof err), 0);
    assert_true(folder_synced());   /* the rename into place survives a power loss */
    assert_string_equal(r.model_class, "llama");
    if (exp_load_model(f, be, &b, err, sizeof err))
        fail_msg("reload: %s", err);
    float *x = logits_of(&m), *y = logits_of(&b);
    assert_memory_equal(x, y, (size_t)NT * a.vocab_size * sizeof *x);
    free(x);
    free(y);
    eng_model_free(&b);
    /* Heterogeneous: `deci` with per-layer arrays, checked through the GGUF reader. */
    static const int H[][3] = {{4, 2, 64}, {2, 1, 32}, {0, 0, 48}};
    arch h;
    make_arch(&h, 32, 8, 3, H, 1);
    h.layers[2].n_heads = 0;
    char an[16];
    assert_int_equal(exp_gguf_arch(&h, an, sizeof an, err, sizeof err), 0);
    assert_string_equal(an, "deci");
    eng_model hm;
    random_model(&hm, &h, 9);
    path(f, sizeof f, "h.gguf");
    assert_int_equal(exp_gguf_write(&hm, f, &o, &r, err, sizeof err), 0);
    gguf_file g;
    assert_int_equal(gguf_open(&g, f, err, sizeof err), 0);
    uint32_t ty;
    uint64_t n;
    assert_true(gguf_get_arr(&g, "deci.attention.head_count", &ty, &n) >= 0);
    assert_int_equal(n, 3);
    int kv = gguf_find(&g, "deci.attention.head_count");
    int64_t v;
    assert_int_equal(gguf_arr_int(&g, kv, 1, &v), 0);
    assert_int_equal(v, 2);
    kv = gguf_find(&g, "deci.feed_forward_length");
    assert_int_equal(gguf_arr_int(&g, kv, 2, &v), 0);
    assert_int_equal(v, 48);
    for (int i = 0; i < g.n_tensors; i++)
        assert_null(strstr(g.t[i].name, "blk.2.attn"));   /* removed attention has no tensors */
    gguf_close(&g);
    /* ... and the engine reloads it: same per-layer shape, bit-identical fp32 logits. */
    if (exp_load_model(f, be, &b, err, sizeof err))
        fail_msg("reload deci: %s", err);
    assert_int_equal(b.a.n_layers, hm.a.n_layers);
    for (int l = 0; l < h.n_layers; l++) {
        assert_int_equal(b.a.layers[l].n_heads, hm.a.layers[l].n_heads);
        assert_int_equal(b.a.layers[l].n_kv_heads, hm.a.layers[l].n_kv_heads);
        assert_int_equal(b.a.layers[l].ffn_dim, hm.a.layers[l].ffn_dim);
    }
    x = logits_of(&hm);
    y = logits_of(&b);
    assert_memory_equal(x, y, (size_t)NT * h.vocab_size * sizeof *x);
    free(x);
    free(y);
    eng_model_free(&b);
    eng_model_free(&hm);
    arch_free(&h);
    eng_model_free(&m);
    arch_free(&a);
}

/* llama3 RoPE scaling (Llama 3.1 and later) goes into GGUF as llama.cpp reads it, the
 * tensor rope_freqs.weight of one factor per frequency, and a GGUF with that tensor loads
 * with the same scaling: the reloaded model's logits are the exported model's. Two
 * scalings: one frequency smoothed, and two. */
static void test_gguf_llama3_rope(void **state)
{
    (void)state;
    static const int L[][3] = {{2, 1, 48}, {2, 1, 48}};
    static const double cfg[][4] = {{8, 1, 4, 32}, {16, 1, 8, 256}};   /* factor, low, high, original */
    for (int c = 0; c < 2; c++) {
        arch a;
        make_arch(&a, 32, 16, 2, L, 0);
        a.rope_scaling = (arch_rope_scaling){ROPE_SCALING_LLAMA3, cfg[c][0], cfg[c][1], cfg[c][2], (int)cfg[c][3]};
        eng_model m, b;
        random_model(&m, &a, 5 + (uint64_t)c);
        char f[512], err[512];
        path(f, sizeof f, "rope3.gguf");
        exp_opts o = {.dtype = EXP_FP32};
        exp_result r;
        if (exp_gguf_write(&m, f, &o, &r, err, sizeof err))
            fail_msg("export: %s", err);
        gguf_file g;
        assert_int_equal(gguf_open(&g, f, err, sizeof err), 0);
        int rf = gguf_tensor_index(&g, "rope_freqs.weight");
        if (rf < 0)
            fail_msg("scaling %d: the GGUF has no rope_freqs.weight (llama.cpp would run it unscaled)", c);
        float got[8];
        double want[8];
        assert_int_equal(g.t[rf].ne[0], 8);
        assert_int_equal(gguf_read_f32(&g, rf, got, 8, err, sizeof err), 0);
        arch_rope_factors(&a, want);
        for (int i = 0; i < 8; i++)
            assert_float_equal(got[i], want[i], 1e-6 * want[i]);
        assert_float_equal(got[7], cfg[c][0], 1e-6);   /* the longest wavelengths: the factor */
        assert_float_equal(got[0], 1.0, 1e-6);         /* the shortest: unscaled */
        gguf_close(&g);
        if (exp_load_model(f, be, &b, err, sizeof err))
            fail_msg("reload: %s", err);
        assert_int_equal(b.a.rope_scaling.type, ROPE_SCALING_LLAMA3);
        assert_float_equal(b.a.rope_scaling.factor, cfg[c][0], 1e-6);
        double back[8];
        arch_rope_factors(&b.a, back);
        for (int i = 0; i < 8; i++)
            assert_float_equal(back[i], want[i], 1e-5 * want[i]);
        float *x = logits_of(&m), *y = logits_of(&b);
        double worst = 0, scale = 0;
        for (int i = 0; i < NT * a.vocab_size; i++)
            worst = fmax(worst, fabs(x[i] - y[i])), scale = fmax(scale, fabs(x[i]));
        if (worst > 1e-5 * scale)
            fail_msg("scaling %d: the reloaded GGUF's logits differ by %g (scale %g)", c, worst, scale);
        free(x);
        free(y);
        eng_model_free(&b);
        eng_model_free(&m);
        arch_free(&a);
    }
    /* factors that no llama3 scaling gives are refused, naming why */
    arch a;
    make_arch(&a, 32, 16, 2, L, 0);
    float odd[8] = {1, 3, 2, 8, 8, 8, 8, 8}, shrink[8] = {1, 1, 0.5f, 1, 1, 1, 1, 1};
    char err[256];
    assert_int_equal(arch_rope_fit_llama3(&a, odd, err, sizeof err), -1);
    assert_non_null(strstr(err, "no llama3 scaling"));
    assert_int_equal(arch_rope_fit_llama3(&a, shrink, err, sizeof err), -1);
    assert_int_equal(a.rope_scaling.type, ROPE_SCALING_NONE);
    arch_free(&a);
}

/* Two exports of one destination at once (two CLI runs, or a job's stale runner beside
 * the one that took it over): each writes a file or folder of its own and renames it into
 * place, so the destination ends as one of them whole. */
typedef struct {
    eng_model *m;
    const char *dest;
    int hf;
    pthread_barrier_t *go;
    int rc;
    char err[512];
} export_run;

static void *export_thread(void *arg)
{
    export_run *x = arg;
    exp_opts o = {.dtype = EXP_FP32};
    exp_result r;
    pthread_barrier_wait(x->go);
    x->rc = x->hf ? exp_hf_write(x->m, x->dest, &o, &r, x->err, sizeof x->err)
                  : exp_gguf_write(x->m, x->dest, &o, &r, x->err, sizeof x->err);
    return NULL;
}

static void test_concurrent_exports(void **state)
{
    (void)state;
    static const int L[][3] = {{8, 4, 512}, {8, 4, 512}, {8, 4, 512}, {8, 4, 512}};
    arch a;
    make_arch(&a, 256, 32, 4, L, 0);
    a.vocab_size = 2048;   /* a few MB each, so that the two writes overlap */
    eng_model m[2];
    random_model(&m[0], &a, 21);
    random_model(&m[1], &a, 22);
    float *want[2] = {logits_of(&m[0]), logits_of(&m[1])};
    size_t nl = (size_t)NT * a.vocab_size * sizeof(float);
    for (int hf = 0; hf < 2; hf++) {
        char dest[512], err[512];
        path(dest, sizeof dest, hf ? "both-hf" : "both.gguf");
        for (int round = 0; round < 3; round++) {
            pthread_barrier_t go;
            pthread_barrier_init(&go, NULL, 2);
            export_run x[2] = {{&m[0], dest, hf, &go, 0, ""}, {&m[1], dest, hf, &go, 0, ""}};
            pthread_t th[2];
            for (int i = 0; i < 2; i++)
                assert_int_equal(pthread_create(&th[i], NULL, export_thread, &x[i]), 0);
            for (int i = 0; i < 2; i++)
                pthread_join(th[i], NULL);
            pthread_barrier_destroy(&go);
            /* a GGUF is replaced by either; an HF folder is taken by the first, and the other
             * finds it there (its folder of its own then goes) */
            if (!hf && (x[0].rc || x[1].rc))
                fail_msg("GGUF round %d: an export failed: %s / %s", round, x[0].err, x[1].err);
            if (hf && x[0].rc && x[1].rc)
                fail_msg("HF round %d: both exports failed: %s / %s", round, x[0].err, x[1].err);
            eng_model b;
            if (exp_load_model(dest, be, &b, err, sizeof err))
                fail_msg("%s round %d: the destination does not load: %s", hf ? "HF" : "GGUF", round, err);
            float *got = logits_of(&b);
            int same0 = !memcmp(got, want[0], nl), same1 = !memcmp(got, want[1], nl);
            if (!same0 && !same1)
                fail_msg("%s round %d: the destination is neither export whole", hf ? "HF" : "GGUF", round);
            if (hf && (same0 ? x[0].rc : x[1].rc))
                fail_msg("HF round %d: the folder holds the export that failed", round);
            free(got);
            eng_model_free(&b);
            if (hf)
                assert_int_equal(fio_remove_tree(dest), 0);
        }
        /* nothing of theirs is left beside the destination */
        char **names;
        size_t n = 0;
        assert_int_equal(fio_list_dir(tmpdir, &names, &n), 0);
        for (size_t i = 0; i < n; i++)
            if (strstr(names[i], ".tmp") || strstr(names[i], ".partial"))
                fail_msg("left behind: %s", names[i]);
        fio_names_free(names, n);
    }
    free(want[0]);
    free(want[1]);
    eng_model_free(&m[0]);
    eng_model_free(&m[1]);
    arch_free(&a);
}

/* A GGUF written at a lower precision keeps an MoE router in F32, as llama.cpp's converter
 * and quantizer do (routing decides which experts run: a rounded router routes tokens
 * elsewhere than the parent); the experts take the type asked for. */
static void test_gguf_router_f32(void **state)
{
    (void)state;
    arch a;
    static const int L[][3] = {{4, 2, 0}, {4, 2, 0}};
    make_arch(&a, 64, 16, 2, L, 0);
    snprintf(a.family, sizeof a.family, "mixtral");
    for (int l = 0; l < 2; l++)
        a.layers[l].moe = (arch_moe){.n_experts = 4, .top_k = 2, .expert_ffn_dim = 64, .norm_topk = 1};
    eng_model m;
    random_model(&m, &a, 31);
    static const exp_dtype types[] = {EXP_Q8_0, EXP_FP16, EXP_BF16};
    static const uint32_t ggml_type[] = {8, 1, 30};
    for (int k = 0; k < 3; k++) {
        char f[512], err[512];
        path(f, sizeof f, "router.gguf");
        exp_opts o = {.dtype = types[k]};
        exp_result r;
        if (exp_gguf_write(&m, f, &o, &r, err, sizeof err))
            fail_msg("export: %s", err);
        gguf_file g;
        assert_int_equal(gguf_open(&g, f, err, sizeof err), 0);
        int seen = 0;
        for (int i = 0; i < g.n_tensors; i++) {
            if (strstr(g.t[i].name, "ffn_gate_inp")) {
                if (g.t[i].type != 0)
                    fail_msg("%s: %s is stored as ggml type %u, not F32", exp_dtype_name(types[k]), g.t[i].name,
                             g.t[i].type);
                seen++;
            } else if (strstr(g.t[i].name, "ffn_up_exps")) {
                assert_int_equal(g.t[i].type, ggml_type[k]);
            }
        }
        assert_int_equal(seen, 2);
        gguf_close(&g);
    }
    eng_model_free(&m);
    arch_free(&a);
}

/* A cancel asked before each tensor stops an export there: -1 with "cancelled", nothing
 * under the destination's name, no temporary file left; HF, GGUF and an MoE's GGUF alike. */
static int cancel_after(void *arg)
{
    int *left = arg;
    return --*left < 0;
}

static void test_export_cancel(void **state)
{
    (void)state;
    static const int L[][3] = {{4, 2, 64}, {4, 2, 64}, {4, 2, 64}};
    arch a, e;
    make_arch(&a, 32, 8, 3, L, 0);
    make_arch(&e, 32, 8, 3, L, 0);
    snprintf(e.family, sizeof e.family, "mixtral");
    for (int l = 0; l < 3; l++) {
        e.layers[l].ffn_dim = 0;
        e.layers[l].moe = (arch_moe){.n_experts = 4, .top_k = 2, .expert_ffn_dim = 32, .norm_topk = 1};
    }
    eng_model m[2];
    random_model(&m[0], &a, 41);
    random_model(&m[1], &e, 42);
    for (int k = 0; k < 3; k++) {
        int left = 5;   /* five tensors, then the cancel */
        exp_opts o = {.dtype = EXP_BF16, .cancelled = cancel_after, .cancel_arg = &left};
        exp_result r;
        char dest[512], err[512] = "";
        path(dest, sizeof dest, k == 0 ? "cancel-hf" : "cancel.gguf");
        int rc = k == 0 ? exp_hf_write(&m[0], dest, &o, &r, err, sizeof err)
                        : exp_gguf_write(&m[k - 1], dest, &o, &r, err, sizeof err);
        assert_int_equal(rc, -1);
        if (!strstr(err, "cancelled"))
            fail_msg("export %d: %s", k, err);
        assert_true(left < 0);   /* asked until it said stop */
        assert_int_equal(access(dest, F_OK), -1);
        char **names;
        size_t n = 0;
        assert_int_equal(fio_list_dir(tmpdir, &names, &n), 0);
        for (size_t i = 0; i < n; i++)
            if (strstr(names[i], "cancel") && strstr(names[i], ".tmp"))
                fail_msg("export %d left %s", k, names[i]);
        fio_names_free(names, n);
    }
    eng_model_free(&m[0]);
    eng_model_free(&m[1]);
    arch_free(&a);
    arch_free(&e);
}

static void test_refusals(void **state)
{
    (void)state;
    char err[512], cls[64], an[16];
    arch a;
    static const int Q[][3] = {{4, 2, 256}, {2, 1, 256}};     /* per-layer query heads */
    make_arch(&a, 32, 8, 2, Q, 1);
    assert_int_equal(exp_hf_class(&a, NULL, cls, sizeof cls, err, sizeof err), -1);
    assert_non_null(strstr(err, "query heads"));
    assert_int_equal(exp_gguf_arch(&a, an, sizeof an, err, sizeof err), 0);   /* GGUF can */
    arch_free(&a);
    static const int B[][3] = {{4, 2, 256}, {4, 1, 512}};     /* per-layer shapes of a Qwen2 (q/k/v biases) */
    make_arch(&a, 32, 8, 2, B, 1);
    a.attention_bias = 1;
    assert_int_equal(exp_hf_class(&a, NULL, cls, sizeof cls, err, sizeof err), -1);
    assert_non_null(strstr(err, "o_proj"));
    arch_free(&a);
    static const int U[][3] = {{2, 1, 256}, {2, 1, 256}};     /* a uniform Qwen2 whose heads * head_dim != hidden */
    make_arch(&a, 32, 8, 2, U, 1);
    a.attention_bias = 1;
    assert_int_equal(exp_hf_class(&a, NULL, cls, sizeof cls, err, sizeof err), -1);
    assert_non_null(strstr(err, "derives head_dim"));
    a.layers[0].n_heads = a.layers[1].n_heads = 4;
    assert_int_equal(exp_hf_class(&a, NULL, cls, sizeof cls, err, sizeof err), 0);
    assert_string_equal(cls, "Qwen2ForCausalLM");
    arch_free(&a);
    static const int F[][3] = {{4, 2, 300}, {4, 1, 256}};     /* width not a DeciLM ffn_mult */
    make_arch(&a, 32, 8, 2, F, 1);
    assert_int_equal(exp_hf_class(&a, NULL, cls, sizeof cls, err, sizeof err), -1);
    assert_non_null(strstr(err, "ffn_mult"));
    arch_free(&a);
    static const int Z[][3] = {{0, 0, 64}, {4, 2, 64}};       /* layer 0 without attention */
    make_arch(&a, 32, 8, 2, Z, 1);
    assert_int_equal(exp_gguf_arch(&a, an, sizeof an, err, sizeof err), -1);
    assert_non_null(strstr(err, "layer 0"));
    arch_free(&a);
    static const int N[][3] = {{4, 2, 64}, {4, 2, 0}};        /* attention without MLP */
    make_arch(&a, 32, 8, 2, N, 1);
    assert_int_equal(exp_gguf_arch(&a, an, sizeof an, err, sizeof err), -1);
    assert_non_null(strstr(err, "removes the MLP"));
    eng_model m;
    random_model(&m, &a, 1);
    char f[512];
    path(f, sizeof f, "refused.gguf");
    exp_opts o = {.dtype = EXP_Q8_0};
    assert_int_equal(exp_gguf_write(&m, f, &o, NULL, err, sizeof err), -1);
    assert_int_equal(access(f, F_OK), -1);                    /* nothing written */
    path(f, sizeof f, "refused_hf");
    assert_int_equal(exp_hf_write(&m, f, &o, NULL, err, sizeof err), -1);   /* q8_0 is GGUF only */
    assert_non_null(strstr(err, "q8_0"));
    eng_model_free(&m);
    arch_free(&a);
    /* a nemotron_h without Mamba layers: llama.cpp's graph reads ssm.* and makes a
     * recurrent-state buffer in any case (it fails an assertion without one) */
    make_arch(&a, 32, 8, 2, Q, 1);
    snprintf(a.family, sizeof a.family, "nemotron_h");
    a.layers[0].ffn_dim = 0;
    a.layers[1].n_heads = a.layers[1].n_kv_heads = 0;
    assert_int_equal(exp_gguf_arch(&a, an, sizeof an, err, sizeof err), -1);
    assert_non_null(strstr(err, "no Mamba layer"));
    a.layers[1].mamba = (arch_mamba){.n_heads = 4, .head_dim = 8, .d_state = 16, .n_groups = 1, .conv_kernel = 4};
    a.layers[1].ffn_dim = 0;
    if (exp_gguf_arch(&a, an, sizeof an, err, sizeof err) != 0)
        fail_msg("nemotron_h with a Mamba layer: %s", err);
    /* one expert: llama.cpp asserts more experts than expert groups */
    a.layers[0].n_heads = a.layers[0].n_kv_heads = 0;
    a.layers[0].moe = (arch_moe){.n_experts = 1, .top_k = 1, .expert_ffn_dim = 32, .norm_topk = 1, .sigmoid = 1,
                                 .n_group = 1, .topk_group = 1, .routed_scale = 1};
    assert_int_equal(exp_gguf_arch(&a, an, sizeof an, err, sizeof err), -1);
    assert_non_null(strstr(err, "2 or more"));
    a.layers[0].moe.n_experts = 2;
    assert_int_equal(exp_gguf_arch(&a, an, sizeof an, err, sizeof err), -1);   /* no attention now */
    assert_non_null(strstr(err, "no attention layer"));
    arch_free(&a);
}

static void test_ffn_mult(void **state)
{
    (void)state;
    assert_true(hfconfig_decilm_ffn_mult(1536, 576) == 4.0);
    assert_int_equal(hfconfig_decilm_intermediate_size(4.0, 576), 1536);
    assert_int_equal(hfconfig_decilm_intermediate_size(1.95, 16384), 21504);   /* Nemotron Ultra layer */
    assert_true(hfconfig_decilm_ffn_mult(1000, 576) < 0);
    for (int f = 256; f <= 8192; f += 256) {
        double m = hfconfig_decilm_ffn_mult(f, 576);
        assert_true(m > 0);
        assert_int_equal(hfconfig_decilm_intermediate_size(m, 576), f);
    }
}

static void flip_byte(const char *p, long off)
{
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, off, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, off, SEEK_SET), 0);
    fputc(c ^ 0x01, f);
    fclose(f);
}

static void test_digest_detects_damage(void **state)
{
    (void)state;
    static const int L[][3] = {{4, 2, 32}};
    arch a;
    make_arch(&a, 32, 8, 1, L, 1);
    eng_model m, b;
    random_model(&m, &a, 2);
    char dir[512], st[600], err[512];
    path(dir, sizeof dir, "digest");
    exp_opts o = {.dtype = EXP_FP16};
    assert_int_equal(exp_hf_write(&m, dir, &o, NULL, err, sizeof err), 0);
    assert_int_equal(exp_verify_dir(dir, err, sizeof err), 0);
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    struct stat sb;
    assert_int_equal(stat(st, &sb), 0);
    flip_byte(st, sb.st_size - 3);
    assert_int_equal(exp_verify_dir(dir, err, sizeof err), -1);
    assert_non_null(strstr(err, "mismatch"));
    assert_int_equal(exp_load_model(dir, be, &b, err, sizeof err), -1);   /* reload refuses it */
    flip_byte(st, sb.st_size - 3);
    assert_int_equal(exp_verify_dir(dir, err, sizeof err), 0);
    assert_int_equal(truncate(st, sb.st_size - 100), 0);
    assert_int_equal(exp_verify_dir(dir, err, sizeof err), -1);
    /* a SHA256SUMS that is a FIFO (or a folder) is refused, not read from: the FIFO
     * would block the verifier for good (alarm: the test dies rather than hang) */
    char sums[600];
    snprintf(sums, sizeof sums, "%s/SHA256SUMS", dir);
    assert_int_equal(unlink(sums), 0);
    assert_int_equal(mkfifo(sums, 0644), 0);
    alarm(20);
    assert_int_equal(exp_verify_dir(dir, err, sizeof err), -1);
    alarm(0);
    assert_non_null(strstr(err, "not a regular file"));
    assert_int_equal(unlink(sums), 0);
    assert_int_equal(mkdir(sums, 0755), 0);
    assert_int_equal(exp_verify_dir(dir, err, sizeof err), -1);
    assert_non_null(strstr(err, "not a regular file"));
    assert_int_equal(rmdir(sums), 0);
    eng_model_free(&m);
    arch_free(&a);
}

static void test_gguf_writer_readback(void **state)
{
    (void)state;
    char f[512], err[512];
    path(f, sizeof f, "w.gguf");
    ggw *w = ggw_new();
    assert_non_null(w);
    assert_int_equal(ggw_kv_str(w, "general.architecture", "llama"), 0);
    assert_int_equal(ggw_kv_u32(w, "x.u32", 123456), 0);
    assert_int_equal(ggw_kv_f32(w, "x.f32", 0.25f), 0);
    int32_t arr[3] = {5, -6, 7};
    assert_int_equal(ggw_kv_arr_i32(w, "x.arr", arr, 3), 0);
    const char *ss[2] = {"ab", "\xc4\xa0z"};
    size_t sl[2] = {2, 3};
    assert_int_equal(ggw_kv_arr_str(w, "x.strs", ss, sl, 2), 0);
    assert_int_equal(ggw_kv_u32(w, "x.u32", 1), -1);                 /* duplicate key */
    int64_t ne[2] = {64, 3}, bad[2] = {40, 2};
    assert_int_equal(ggw_tensor(w, "q8", bad, 2, GGW_Q8_0, err, sizeof err), -1);
    assert_int_equal(ggw_tensor(w, "f32", ne, 2, GGW_F32, err, sizeof err), 0);
    assert_int_equal(ggw_tensor(w, "f16", ne, 2, GGW_F16, err, sizeof err), 0);
    assert_int_equal(ggw_tensor(w, "bf16", ne, 2, GGW_BF16, err, sizeof err), 0);
    assert_int_equal(ggw_tensor(w, "q8", ne, 2, GGW_Q8_0, err, sizeof err), 0);
    float x[192];
    for (int i = 0; i < 192; i++)
        x[i] = sinf((float)i * 0.37f) * (1.0f + (float)(i % 7));
    assert_int_equal(ggw_begin(w, f, err, sizeof err), 0);
    for (int t = 0; t < 4; t++)
        assert_int_equal(ggw_write_tensor(w, x, 192, err, sizeof err), 0);
    assert_int_equal(ggw_write_tensor(w, x, 192, err, sizeof err), -1);  /* no tensor left */
    assert_int_equal(ggw_finish(w, err, sizeof err), 0);
    ggw_free(w);
    gguf_file g;
    if (gguf_open(&g, f, err, sizeof err))
        fail_msg("%s", err);
    int64_t v;
    assert_int_equal(gguf_get_int(&g, "x.u32", &v), 0);
    assert_int_equal(v, 123456);
    double d;
    assert_int_equal(gguf_get_float(&g, "x.f32", &d), 0);
    assert_true(d == 0.25);
    int k = gguf_find(&g, "x.arr");
    assert_int_equal(gguf_arr_int(&g, k, 1, &v), 0);
    assert_int_equal(v, -6);
    const char *s;
    size_t len;
    k = gguf_find(&g, "x.strs");
    assert_int_equal(gguf_arr_str(&g, k, 1, &s, &len), 0);
    assert_int_equal(len, 3);
    assert_memory_equal(s, "\xc4\xa0z", 3);
    assert_int_equal(g.n_tensors, 4);
    float y[192];
    double tol[4] = {0, 1e-2, 8e-2, 0};
    for (int t = 0; t < 4; t++) {
        assert_int_equal(gguf_read_f32(&g, t, y, 192, err, sizeof err), 0);
        for (int i = 0; i < 192; i++) {
            double lim = tol[t];
            if (t == 3) {                      /* Q8_0: half a step of its block's scale */
                float amax = 0;
                for (int j = i / 32 * 32; j < i / 32 * 32 + 32; j++)
                    amax = fmaxf(amax, fabsf(x[j]));
                lim = amax / 127.0 * 0.51 + 1e-3 * amax;
            } else if (t > 0) {
                lim *= fabs(x[i]) + 1e-3;
            }
            assert_true(fabs(y[i] - x[i]) <= lim);
        }
    }
    gguf_close(&g);
}

static void test_tar_headers(void **state)
{
    (void)state;
    char dir[512], a[600], b[600], t[512], err[512];
    path(dir, sizeof dir, "tree");
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(a, sizeof a, "%s/a.txt", dir);
    snprintf(b, sizeof b, "%s/b.bin", dir);
    FILE *f = fopen(a, "w");
    fputs("hello", f);
    fclose(f);
    f = fopen(b, "w");
    for (int i = 0; i < 1000; i++)
        fputc(i & 0xff, f);
    fclose(f);
    path(t, sizeof t, "out.tar");
    tar_writer *w = tar_open(t, 1700000000, err, sizeof err);
    assert_non_null(w);
    assert_int_equal(tar_add_tree(w, "model", dir, err, sizeof err), 0);
    char longname[200];                        /* 150 bytes: needs ustar's prefix field */
    memset(longname, 'x', sizeof longname);
    memcpy(longname, "deep/", 5);
    longname[70] = '/';
    longname[150] = '\0';
    assert_int_equal(tar_add_file(w, longname, a, err, sizeof err), 0);
    assert_int_equal(tar_close(w, err, sizeof err), 0);
    f = fopen(t, "rb");
    assert_non_null(f);
    unsigned char buf[8192];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    /* dir + a (1 data block) + b (2 blocks) + long (1 block) + 2 zero blocks */
    assert_int_equal(n, 512 * (1 + 2 + 3 + 2 + 2));
    size_t offs[4] = {0, 512, 1536, 3072};
    const char *names[3] = {"model/", "model/a.txt", "model/b.bin"};
    for (int i = 0; i < 4; i++) {
        unsigned char *h = buf + offs[i];
        assert_memory_equal(h + 257, "ustar", 6);
        unsigned sum = 0;
        for (int j = 0; j < 512; j++)
            sum += (j >= 148 && j < 156) ? ' ' : h[j];
        assert_int_equal(strtoul((char *)h + 148, NULL, 8), sum);
        if (i < 3)
            assert_string_equal((char *)h, names[i]);
    }
    assert_int_equal(strtoul((char *)buf + 1536 + 124, NULL, 8), 1000);
    assert_memory_equal(buf + 1024, "hello", 5);
    assert_int_equal(strnlen((char *)buf + 3072 + 345, 155), 70);   /* prefix field */
    assert_memory_equal(buf + 3072 + 345, "deep/", 5);
    for (size_t i = n - 1024; i < n; i++)
        assert_int_equal(buf[i], 0);
}

static void test_model_card(void **state)
{
    (void)state;
    static const int L[][3] = {{4, 2, 64}, {0, 0, 32}};
    arch a;
    make_arch(&a, 32, 8, 2, L, 1);
    json_error_t je;
    json_t *rep = json_loads("{\"job_id\":\"job_x\",\"target\":{\"device\":\"cpu\",\"precision\":\"fp32\"},"
                             "\"limits\":[{\"name\":\"latency_ms\",\"limit\":41.0,\"predicted\":39.7,"
                             "\"measured\":40.2,\"holds\":true}],\"result\":{\"accuracy\":{\"arc_easy\":"
                             "{\"acc\":0.5,\"acc_norm\":0.55,\"stderr\":0.02,\"n\":500}}}}", 0, &je);
    assert_non_null(rep);
    mc_info info = {.parent = "parent.gguf", .model_class = "DeciLMForCausalLM", .dtype = "bf16", .formats = "HF",
                    .tokenizer = "not included: no parent given"};
    char *s = mc_render(&a, rep, &info);
    assert_non_null(s);
    assert_non_null(strstr(s, "parent.gguf"));
    assert_non_null(strstr(s, "- **Tokenizer:** not included: no parent given\n"));
    assert_non_null(strstr(s, "| latency_ms | 41 | 39.7 | 40.2 | yes |"));
    assert_non_null(strstr(s, "| 1 | 2 | removed | removed | 32 |"));
    assert_non_null(strstr(s, "| arc_easy | not measured | not measured | 0.5 | 0.55 |"));
    free(s);
    s = mc_render(&a, NULL, &info);
    assert_non_null(strstr(s, "No limits recorded."));
    assert_non_null(strstr(s, "Not measured."));
    free(s);
    /* text from outside (a parent path, a task file's name) stays text: a path with
     * backticks and a newline keeps its code span on its one line, a task name with '|'
     * and markup keeps its table row */
    json_t *rep2 = json_loads("{\"result\":{\"accuracy\":{\"my|task <b>*x*</b>\":{\"acc\":0.5}}}}", 0, &je);
    assert_non_null(rep2);
    info.parent = "models/a`b``c\n# Injected heading\n.gguf";
    s = mc_render(&a, rep2, &info);
    assert_non_null(s);
    assert_non_null(strstr(s, "- **Parent:** ``` models/a`b``c?# Injected heading?.gguf ```\n"));
    assert_null(strstr(s, "\n# Injected"));
    assert_non_null(strstr(s, "| my\\|task \\<b\\>\\*x\\*\\</b\\> | not measured |"));
    free(s);
    info.parent = "p```````````````q";   /* a run of 15: a fence of 16 */
    s = mc_render(&a, NULL, &info);
    assert_non_null(s);
    assert_non_null(strstr(s, "- **Parent:** ```````````````` p```````````````q ````````````````\n"));
    free(s);
    json_decref(rep2);
    json_decref(rep);
    arch_free(&a);
}

/* A GGUF carrying only tokenizer metadata (byte-level BPE, 4 tokens, 1 merge). */
static void tok_gguf(const char *f, const char *pre, int add_bos)
{
    char err[256];
    ggw *w = ggw_new();
    const char *toks[4] = {"<|begin_of_text|>", "a", "b", "ab"};
    size_t tl[4] = {17, 1, 1, 2};
    const char *merges[1] = {"a b"};
    size_t ml[1] = {3};
    int32_t types[4] = {3, 1, 1, 1};
    assert_int_equal(ggw_kv_str(w, "tokenizer.ggml.model", "gpt2"), 0);
    assert_int_equal(ggw_kv_str(w, "tokenizer.ggml.pre", pre), 0);
    assert_int_equal(ggw_kv_arr_str(w, "tokenizer.ggml.tokens", toks, tl, 4), 0);
    assert_int_equal(ggw_kv_arr_i32(w, "tokenizer.ggml.token_type", types, 4), 0);
    assert_int_equal(ggw_kv_arr_str(w, "tokenizer.ggml.merges", merges, ml, 1), 0);
    assert_int_equal(ggw_kv_u32(w, "tokenizer.ggml.bos_token_id", 0), 0);
    assert_int_equal(ggw_kv_bool(w, "tokenizer.ggml.add_bos_token", add_bos), 0);
    assert_int_equal(ggw_kv_str(w, "tokenizer.chat_template", "{{ messages }}"), 0);
    assert_int_equal(ggw_begin(w, f, err, sizeof err), 0);
    assert_int_equal(ggw_finish(w, err, sizeof err), 0);
    ggw_free(w);
}

static void test_tokenizer_json(void **state)
{
    (void)state;
    char f[512], err[512];
    path(f, sizeof f, "tok.gguf");
    tok_gguf(f, "llama-bpe", 1);
    json_t *tc = NULL;
    json_t *t = exp_tokenizer_json_from_gguf(f, &tc, err, sizeof err);
    if (!t)
        fail_msg("%s", err);
    json_t *model = json_object_get(t, "model");
    assert_string_equal(json_string_value(json_object_get(model, "type")), "BPE");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(model, "vocab"), "ab")), 3);
    assert_string_equal(json_string_value(json_array_get(json_object_get(model, "merges"), 0)), "a b");
    assert_true(json_is_true(json_object_get(model, "ignore_merges")));      /* Llama-3 */
    json_t *pre = json_array_get(json_object_get(json_object_get(t, "pre_tokenizer"), "pretokenizers"), 0);
    assert_string_equal(json_string_value(json_object_get(pre, "type")), "Split");
    json_t *post = json_object_get(t, "post_processor");
    assert_string_equal(json_string_value(json_object_get(post, "type")), "TemplateProcessing");
    json_t *sp = json_object_get(json_object_get(post, "special_tokens"), "<|begin_of_text|>");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(sp, "ids"), 0)), 0);
    json_t *added = json_object_get(t, "added_tokens");
    assert_int_equal(json_array_size(added), 1);                            /* the control token */
    assert_true(json_is_true(json_object_get(json_array_get(added, 0), "special")));
    assert_non_null(tc);
    assert_string_equal(json_string_value(json_object_get(tc, "bos_token")), "<|begin_of_text|>");
    assert_true(json_is_true(json_object_get(tc, "add_bos_token")));
    assert_string_equal(json_string_value(json_object_get(tc, "chat_template")), "{{ messages }}");
    json_decref(t);
    json_decref(tc);
    /* Qwen2-MoE's GGUFs: Llama-3's split with digits one at a time, merges kept */
    tok_gguf(f, "qwen2", 0);
    t = exp_tokenizer_json_from_gguf(f, &tc, err, sizeof err);
    if (!t)
        fail_msg("qwen2: %s", err);
    assert_false(json_is_true(json_object_get(json_object_get(t, "model"), "ignore_merges")));
    pre = json_array_get(json_object_get(json_object_get(t, "pre_tokenizer"), "pretokenizers"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(pre, "pattern"), "Regex")),
                        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
    json_decref(t);
    json_decref(tc);
    tok_gguf(f, "deepseek-coder", 0);                                       /* no mapping: refused */
    assert_null(exp_tokenizer_json_from_gguf(f, &tc, err, sizeof err));
    assert_non_null(strstr(err, "deepseek-coder"));
    assert_null(tc);
    /* ... and an HF export from such a parent goes without a tokenizer, saying why */
    static const int L[][3] = {{4, 2, 64}};
    arch a;
    make_arch(&a, 32, 8, 1, L, 1);
    eng_model m;
    random_model(&m, &a, 4);
    char dir[512], tj[600];
    path(dir, sizeof dir, "hf-untok");
    exp_opts o = {.dtype = EXP_FP32, .parent_path = f};
    exp_result r;
    err[0] = 0;
    if (exp_hf_write(&m, dir, &o, &r, err, sizeof err))
        fail_msg("an HF export whose parent's tokenizer has no conversion failed: %s", err);
    assert_int_equal(r.tokenizer, 0);
    assert_non_null(strstr(r.note, "deepseek-coder"));
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    assert_int_equal(access(tj, F_OK), -1);
    eng_model_free(&m);
    arch_free(&a);
}

static void copy_file(const char *from, const char *to)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp '%.600s' '%.600s'", from, to);
    assert_int_equal(system(cmd), 0);
}

/* A snapshot saved over another and cut short between its two files: the new weights
 * beside the older arch.json (here: layers that came from other parent layers, so every
 * shape matches) are refused, not loaded as a model they are not. Whole, it loads back
 * bit-exact. */
static void test_snapshot_half_saved(void **state)
{
    (void)state;
    static const int L[][3] = {{4, 2, 32}, {4, 2, 32}};
    arch a, b;
    make_arch(&a, 32, 8, 2, L, 1);
    make_arch(&b, 32, 8, 2, L, 1);
    b.layers[0].source_layer = 5;
    b.layers[1].source_layer = 7;
    eng_model ma, mb, back;
    random_model(&ma, &a, 3);
    random_model(&mb, &b, 4);
    char dir[512], old_arch[600], arch_path[600], err[512];
    path(dir, sizeof dir, "snap");
    snprintf(arch_path, sizeof arch_path, "%s/arch.json", dir);
    path(old_arch, sizeof old_arch, "snap-old-arch.json");
    assert_int_equal(ckpt_save(&ma, dir, err, sizeof err), 0);
    copy_file(arch_path, old_arch);
    assert_int_equal(ckpt_save(&mb, dir, err, sizeof err), 0);
    assert_int_equal(ckpt_load(dir, be, &back, err, sizeof err), 0);
    assert_int_equal(back.a.layers[1].source_layer, 7);
    float *x = logits_of(&mb), *y = logits_of(&back);
    assert_memory_equal(x, y, (size_t)NT * b.vocab_size * sizeof *x);
    free(x);
    free(y);
    eng_model_free(&back);
    copy_file(old_arch, arch_path);   /* as a save of mb over ma leaves it if cut short */
    assert_int_equal(ckpt_load(dir, be, &back, err, sizeof err), -1);
    assert_non_null(strstr(err, "another arch"));
    eng_model_free(&ma);
    eng_model_free(&mb);
    arch_free(&a);
    arch_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_fp32_exact),
        cmocka_unit_test(test_hf_bf16_sharded),
        cmocka_unit_test(test_decilm_roundtrip),
        cmocka_unit_test(test_gguf_llama_exact),
        cmocka_unit_test(test_gguf_llama3_rope),
        cmocka_unit_test(test_concurrent_exports),
        cmocka_unit_test(test_gguf_router_f32),
        cmocka_unit_test(test_export_cancel),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_ffn_mult),
        cmocka_unit_test(test_digest_detects_damage),
        cmocka_unit_test(test_snapshot_half_saved),
        cmocka_unit_test(test_gguf_writer_readback),
        cmocka_unit_test(test_tar_headers),
        cmocka_unit_test(test_model_card),
        cmocka_unit_test(test_tokenizer_json),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
