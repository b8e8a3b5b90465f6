/* tests/unit/test_formats_gguf.c — GGUF reader on images built here: metadata access,
 * dequantization of F32/F16/BF16/Q8_0/Q4_0/Q4_1 against the block formulas, the llama
 * arch with per-layer arrays, the q/k RoPE un-permutation, and hostile files (every
 * truncation, bad magic/version/type, offsets past the end, overflowing dims). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "storage/gguf.h"
#include "storage/llama2c.h"
#include "storage/safetensors.h"

#include "gguf_image.h"

static void test_dequant(void **state)
{
    (void)state;
    float f32[32];
    uint16_t f16[32], bf16[32];
    uint8_t q8[34], q4_0[18], q4_1[20];
    for (int i = 0; i < 32; i++) {
        f32[i] = (float)i * 0.5f - 8.0f;
        f16[i] = st_f32_to_f16(f32[i]);
        bf16[i] = st_f32_to_bf16(f32[i]);
    }
    uint16_t d = st_f32_to_f16(0.25f), m = st_f32_to_f16(-1.0f);
    memcpy(q8, &d, 2);
    for (int j = 0; j < 32; j++) q8[2 + j] = (uint8_t)(int8_t)(j - 16);
    memcpy(q4_0, &d, 2);
    for (int j = 0; j < 16; j++) q4_0[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    memcpy(q4_1, &d, 2); memcpy(q4_1 + 2, &m, 2);
    for (int j = 0; j < 16; j++) q4_1[4 + j] = (uint8_t)(j | ((15 - j) << 4));
    tdesc ts[] = {
        {"a", 1, {32, 1}, GGML_F32, f32, sizeof f32}, {"b", 1, {32, 1}, GGML_F16, f16, sizeof f16},
        {"c", 1, {32, 1}, GGML_BF16, bf16, sizeof bf16}, {"d", 1, {32, 1}, GGML_Q8_0, q8, sizeof q8},
        {"e", 1, {32, 1}, GGML_Q4_0, q4_0, sizeof q4_0}, {"f", 1, {32, 1}, GGML_Q4_1, q4_1, sizeof q4_1},
    };
    buf kvs = {0};
    kv_str(&kvs, "general.name", "unit");
    buf img = build(&kvs, 1, ts, 6);
    gguf_file g;
    char err[256];
    assert_int_equal(gguf_open_mem(&g, img.p, img.n, err, sizeof err), 0);
    assert_int_equal(g.n_tensors, 6);
    float out[32];
    for (int t = 0; t < 3; t++) {
        assert_int_equal(gguf_read_f32(&g, t, out, 32, err, sizeof err), 0);
        for (int i = 0; i < 32; i++) assert_true(out[i] == f32[i]);   /* exactly representable */
    }
    assert_int_equal(gguf_read_f32(&g, 3, out, 32, err, sizeof err), 0);
    for (int j = 0; j < 32; j++) assert_true(out[j] == 0.25f * (float)(j - 16));
    assert_int_equal(gguf_read_f32(&g, 4, out, 32, err, sizeof err), 0);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == 0.25f * (float)(j - 8));
        assert_true(out[j + 16] == 0.25f * (float)(15 - j - 8));
    }
    assert_int_equal(gguf_read_f32(&g, 5, out, 32, err, sizeof err), 0);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == 0.25f * (float)j - 1.0f);
        assert_true(out[j + 16] == 0.25f * (float)(15 - j) - 1.0f);
    }
    assert_int_equal(gguf_read_f32(&g, 5, out, 31, err, sizeof err), -1);
    const char *s;
    size_t sl;
    assert_int_equal(gguf_get_str(&g, "general.name", &s, &sl), 0);
    assert_int_equal(sl, 4);
    assert_memory_equal(s, "unit", 4);
    gguf_close(&g);
    /* every truncation that cuts into data fails with a message, never a crash (the
     * last 12 bytes are alignment padding after the 20-byte Q4_1 block) */
    assert_int_equal(gguf_open_mem(&g, img.p, img.n - 12, err, sizeof err), 0);
    gguf_close(&g);
    for (size_t k = 0; k < img.n - 12; k++) {
        err[0] = '\0';
        assert_int_equal(gguf_open_mem(&g, img.p, k, err, sizeof err), -1);
        assert_true(err[0] != '\0');
    }
    free(img.p);
    free(kvs.p);
}

/* Tiny llama GGUF with per-layer head counts: layer 1 has no attention. */
static buf llama_image(int bad_ffn_array)
{
    static float wq[4 * 8 * 16], wk[2 * 8 * 16], emb[10 * 16], vec[16];
    for (size_t i = 0; i < sizeof wq / 4; i++) wq[i] = (float)i;
    for (size_t i = 0; i < sizeof wk / 4; i++) wk[i] = (float)i;
    buf kvs = {0};
    int32_t heads[2] = {4, 0}, kvh[2] = {2, 0}, ffn[3] = {32, 64, 1};
    kv_str(&kvs, "general.architecture", "llama");
    kv_u32(&kvs, "llama.block_count", 2);
    kv_u32(&kvs, "llama.embedding_length", 16);
    kv_u32(&kvs, "llama.context_length", 128);
    kv_f32(&kvs, "llama.rope.freq_base", 500000.0f);
    kv_f32(&kvs, "llama.attention.layer_norm_rms_epsilon", 1e-6f);
    kv_arr_i32(&kvs, "llama.attention.head_count", heads, 2);
    kv_arr_i32(&kvs, "llama.attention.head_count_kv", kvh, 2);
    kv_arr_i32(&kvs, "llama.feed_forward_length", ffn, bad_ffn_array ? 3 : 2);
    kv_u32(&kvs, "llama.rope.dimension_count", 8);
    tdesc ts[] = {
        {"token_embd.weight", 2, {16, 10}, GGML_F32, emb, sizeof emb},
        {"blk.0.attn_q.weight", 2, {16, 32}, GGML_F32, wq, sizeof wq},
        {"blk.0.attn_k.weight", 2, {16, 16}, GGML_F32, wk, sizeof wk},
        {"output_norm.weight", 1, {16, 1}, GGML_F32, vec, sizeof vec},
    };
    buf img = build(&kvs, 10, ts, 4);
    free(kvs.p);
    return img;
}

static void test_llama_arch_and_permutation(void **state)
{
    (void)state;
    buf img = llama_image(0);
    gguf_file g;
    arch a;
    char err[256], name[96];
    assert_int_equal(gguf_open_mem(&g, img.p, img.n, err, sizeof err), 0);
    assert_int_equal(gguf_arch(&g, &a, err, sizeof err), 0);
    assert_int_equal(a.n_layers, 2);
    assert_int_equal(a.hidden_size, 16);
    assert_int_equal(a.head_dim, 8);
    assert_int_equal(a.vocab_size, 10);
    assert_true(a.tie_word_embeddings);            /* no output.weight */
    assert_true(fabs(a.rope_theta - 500000.0) < 1e-6);
    assert_int_equal(a.layers[0].n_heads, 4);
    assert_int_equal(a.layers[0].n_kv_heads, 2);
    assert_int_equal(a.layers[0].ffn_dim, 32);
    assert_int_equal(a.layers[1].n_heads, 0);      /* attention removed */
    assert_int_equal(a.layers[1].ffn_dim, 64);
    int64_t shape[2];
    int nd, perm;
    assert_int_equal(gguf_hf_tensor(&g, &a, 1, name, sizeof name, shape, &nd, &perm), 0);
    assert_string_equal(name, "model.layers.0.self_attn.q_proj.weight");
    assert_int_equal(shape[0], 32);
    assert_int_equal(shape[1], 16);
    assert_int_equal(perm, 4);
    assert_int_equal(gguf_hf_tensor(&g, &a, 2, name, sizeof name, shape, &nd, &perm), 0);
    assert_int_equal(perm, 2);
    assert_int_equal(gguf_hf_tensor(&g, &a, 3, name, sizeof name, shape, &nd, &perm), 0);
    assert_string_equal(name, "model.norm.weight");
    /* un-permute q: HF row h*8 + p*4 + i comes from GGUF row h*8 + 2i + p */
    float q[32 * 16];
    assert_int_equal(gguf_read_f32(&g, 1, q, 32 * 16, err, sizeof err), 0);
    assert_int_equal(l2c_unpermute_rope_rows(q, 32, 16, 4), 0);
    for (int h = 0; h < 4; h++)
        for (int p = 0; p < 2; p++)
            for (int i = 0; i < 4; i++)
                assert_true(q[(h * 8 + p * 4 + i) * 16 + 3] == (float)((h * 8 + 2 * i + p) * 16 + 3));
    assert_int_equal(l2c_unpermute_rope_rows(q, 30, 16, 4), -1);
    arch_free(&a);
    gguf_close(&g);
    free(img.p);
    img = llama_image(1);
    assert_int_equal(gguf_open_mem(&g, img.p, img.n, err, sizeof err), 0);
    assert_int_equal(gguf_arch(&g, &a, err, sizeof err), -1);
    assert_non_null(strstr(err, "feed_forward_length"));
    gguf_close(&g);
    free(img.p);
}

static void test_hostile(void **state)
{
    (void)state;
    gguf_file g;
    char err[256];
    buf kvs = {0};
    static float w[32];
    tdesc t = {"w", 2, {32, 1}, GGML_F32, w, sizeof w};
    buf img = build(&kvs, 0, &t, 1);
    assert_int_equal(gguf_open_mem(&g, img.p, img.n, err, sizeof err), 0);
    gguf_close(&g);
    /* bad magic, version */
    buf b = {0};
    put(&b, img.p, img.n);
    b.p[0] = 'X';
    assert_int_equal(gguf_open_mem(&g, b.p, b.n, err, sizeof err), -1);
    assert_non_null(strstr(err, "magic"));
    memcpy(b.p, img.p, img.n);
    b.p[4] = 9;
    assert_int_equal(gguf_open_mem(&g, b.p, b.n, err, sizeof err), -1);
    assert_non_null(strstr(err, "version"));
    /* absurd tensor count */
    memcpy(b.p, img.p, img.n);
    memset(b.p + 8, 0xFF, 8);
    assert_int_equal(gguf_open_mem(&g, b.p, b.n, err, sizeof err), -1);
    /* layout after the 24-byte header: name(8+1) ndims(4) dims(16) type(4) offset(8) */
    size_t type_at = 24 + 9 + 4 + 16, off_at = type_at + 4, dim_at = 24 + 9 + 4;
    memcpy(b.p, img.p, img.n);
    b.p[type_at] = 77;
    assert_int_equal(gguf_open_mem(&g, b.p, b.n, err, sizeof err), -1);
    assert_non_null(strstr(err, "not supported"));
    memcpy(b.p, img.p, img.n);
    b.p[off_at] = 64;                              /* aligned, but past the end */
    assert_int_equal(gguf_open_mem(&g, b.p, b.n, err, sizeof err), -1);
    assert_non_null(strstr(err, "past the end"));
    memcpy(b.p, img.p, img.n);
    b.p[off_at] = 3;
    assert_int_equal(gguf_open_mem(&g, b.p, b.n, err, sizeof err), -1);
    assert_non_null(strstr(err, "aligned"));
    memcpy(b.p, img.p, img.n);
    memset(b.p + dim_at, 0xFF, 7);                 /* dim ~2^56 */
    assert_int_equal(gguf_open_mem(&g, b.p, b.n, err, sizeof err), -1);
    assert_non_null(strstr(err, "out of range"));
    memcpy(b.p, img.p, img.n);
    b.p[dim_at] = 33;                              /* F32 fine, but Q8_0 needs 32-multiples: use type */
    b.p[type_at] = GGML_Q8_0;
    assert_int_equal(gguf_open_mem(&g, b.p, b.n, err, sizeof err), -1);
    assert_non_null(strstr(err, "block size"));
    free(b.p);
    free(img.p);
    /* a string array whose count cannot fit */
    buf k2 = {0};
    str(&k2, "tokenizer.ggml.tokens"); u32(&k2, GGUF_T_ARRAY); u32(&k2, GGUF_T_STRING); u64(&k2, 1ULL << 40);
    img = build(&k2, 1, NULL, 0);
    assert_int_equal(gguf_open_mem(&g, img.p, img.n, err, sizeof err), -1);
    free(img.p);
    free(k2.p);
    free(kvs.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant),
        cmocka_unit_test(test_llama_arch_and_permutation),
        cmocka_unit_test(test_hostile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
