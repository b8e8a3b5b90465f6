/* tests/unit/test_engine_ceilings.c — the shared bench helpers: the "smollm2-135m" arch
 * preset (the published shape and parameter count, a custom depth, unknown names) and
 * the machine ceilings on the CPU backend (small sizes: positive, finite rates; buffers
 * returned to the backend).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/ceilings.h"
#include "engine/model.h"

static void test_preset_smollm2(void **state)
{
    (void)state;
    arch a;
    char err[256];
    assert_int_equal(arch_preset(&a, "smollm2-135m", 0), 0);
    assert_int_equal(arch_validate(&a, err, sizeof err), 0);
    assert_string_equal(a.family, "llama");
    assert_int_equal(a.n_layers, 30);
    assert_int_equal(a.hidden_size, 576);
    assert_int_equal(a.vocab_size, 49152);
    assert_int_equal(a.head_dim, 64);
    assert_int_equal(a.max_position_embeddings, 8192);
    assert_true(a.rope_theta == 100000.0 && a.norm_eps == 1e-5 && a.tie_word_embeddings == 1);
    assert_true(arch_is_uniform(&a));
    assert_int_equal(a.layers[29].source_layer, 29);
    assert_int_equal(a.layers[0].n_heads, 9);
    assert_int_equal(a.layers[0].n_kv_heads, 3);
    assert_int_equal(a.layers[0].ffn_dim, 1536);
    assert_true(arch_params(&a) == 134515008);   /* SmolLM2-135M's published count */
    arch_free(&a);

    assert_int_equal(arch_preset(&a, "smollm2-135m", 2), 0);
    assert_int_equal(a.n_layers, 2);
    assert_int_equal(a.layers[1].source_layer, 1);
    arch_free(&a);

    assert_int_equal(arch_preset(&a, "gpt-5", 0), -1);
    assert_int_equal(a.n_layers, 0);
    assert_null(a.layers);
    assert_int_equal(arch_preset(&a, NULL, 0), -1);
}

static void test_ceilings_cpu(void **state)
{
    (void)state;
    eng_backend *be = eng_backend_cpu_new(1);
    assert_non_null(be);
    eng_rate r;
    assert_int_equal(eng_ceil_gemm(be, 64, 2, &r), 0);
    assert_true(r.wall > 0 && isfinite(r.wall));
    assert_true(r.cpu > 0 && isfinite(r.cpu));
    assert_int_equal(eng_ceil_copy(be, (size_t)1 << 20, 3, &r), 0);
    assert_true(r.wall > 0 && isfinite(r.wall));
    assert_int_equal(be->cur_bytes, 0);
    assert_int_equal(eng_ceil_triad((size_t)1 << 18, 1, 2, &r), 0);
    assert_true(r.wall > 0 && isfinite(r.wall));
    assert_true(r.cpu > 0 && isfinite(r.cpu));
    eng_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preset_smollm2),
        cmocka_unit_test(test_ceilings_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
