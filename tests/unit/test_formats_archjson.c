/* tests/unit/test_formats_archjson.c — the arch JSON form: round trip, removed parts as
 * null, and strict errors that carry the JSON pointer of the fault. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "storage/archjson.h"

static const char *doc_example =
    "{\"family\": \"llama\", \"vocab_size\": 49152, \"hidden_size\": 576, \"head_dim\": 64,"
    " \"max_position_embeddings\": 8192, \"rope_theta\": 100000.0, \"rope_scaling\": null,"
    " \"norm_eps\": 1e-5, \"tie_word_embeddings\": true, \"layers\": ["
    " {\"source_layer\": 0, \"attention\": {\"n_heads\": 9, \"n_kv_heads\": 3}, \"mlp\": {\"ffn_dim\": 1536}},"
    " {\"source_layer\": 1, \"attention\": null, \"mlp\": {\"ffn_dim\": 768}},"
    " {\"source_layer\": 3, \"attention\": {\"n_heads\": 6, \"n_kv_heads\": 2}, \"mlp\": null}]}";

static void test_parse_doc_example(void **state)
{
    (void)state;
    arch a;
    char err[256] = "";
    assert_int_equal(arch_from_json_text(doc_example, strlen(doc_example), &a, err, sizeof err), 0);
    assert_string_equal(a.family, "llama");
    assert_int_equal(a.vocab_size, 49152);
    assert_int_equal(a.n_layers, 3);
    assert_int_equal(a.layers[0].n_heads, 9);
    assert_int_equal(a.layers[0].n_kv_heads, 3);
    assert_int_equal(a.layers[1].n_heads, 0);
    assert_int_equal(a.layers[1].ffn_dim, 768);
    assert_int_equal(a.layers[2].source_layer, 3);
    assert_int_equal(a.layers[2].ffn_dim, 0);
    assert_true(a.tie_word_embeddings);
    assert_true(a.rope_theta == 100000.0);
    assert_true(a.norm_eps == 1e-5);
    arch_free(&a);
}

static void test_round_trip(void **state)
{
    (void)state;
    arch a, b;
    char err[256] = "";
    assert_int_equal(arch_from_json_text(doc_example, strlen(doc_example), &a, err, sizeof err), 0);
    a.rope_scaling.type = ROPE_SCALING_LLAMA3;
    a.rope_scaling.factor = 8.0;
    a.rope_scaling.low_freq_factor = 1.0;
    a.rope_scaling.high_freq_factor = 4.0;
    a.rope_scaling.original_max_position_embeddings = 8192;
    a.attention_bias = 1;
    json_t *j = arch_to_json(&a);
    assert_non_null(j);
    /* removed parts are null, not absent */
    json_t *l1 = json_array_get(json_object_get(j, "layers"), 1);
    assert_true(json_is_null(json_object_get(l1, "attention")));
    char *text = json_dumps(j, JSON_SORT_KEYS);
    assert_non_null(text);
    assert_int_equal(arch_from_json_text(text, strlen(text), &b, err, sizeof err), 0);
    assert_true(arch_equal(&a, &b));
    free(text);
    json_decref(j);
    arch_free(&a);
    arch_free(&b);
}

/* Parse `doc_example` with `from` replaced by `to`; expect failure with `pointer` in err. */
static void expect_error(const char *from, const char *to, const char *pointer)
{
    char buf[2048], err[256] = "";
    const char *p = strstr(doc_example, from);
    assert_non_null(p);
    size_t pre = (size_t)(p - doc_example);
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)pre, doc_example, to, p + strlen(from));
    arch a;
    assert_int_equal(arch_from_json_text(buf, strlen(buf), &a, err, sizeof err), -1);
    if (!strstr(err, pointer))
        fail_msg("error \"%s\" does not name %s", err, pointer);
    assert_null(a.layers);
}

static void test_errors_name_pointer(void **state)
{
    (void)state;
    expect_error("\"n_heads\": 6, \"n_kv_heads\": 2", "\"n_heads\": 6, \"n_kv_heads\": 4",
                 "/layers/2/attention/n_kv_heads");
    expect_error("\"ffn_dim\": 768", "\"ffn_dim\": 768, \"width\": 3", "/layers/1/mlp/width: unknown key");
    expect_error("\"norm_eps\"", "\"bogus\": 1, \"norm_eps\"", "/bogus: unknown key");
    /* a key holding '/' or '~' is one pointer token, escaped (RFC 6901) */
    expect_error("\"norm_eps\"", "\"a/b~c\": 1, \"norm_eps\"", "/a~1b~0c: unknown key");
    expect_error("\"vocab_size\": 49152", "\"vocab_size\": \"big\"", "/vocab_size: must be an integer");
    expect_error("\"hidden_size\": 576,", "", "/hidden_size: required");
    expect_error("\"attention\": null, ", "", "/layers/1/attention: required");
    expect_error("\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2}",
                 "/rope_scaling/type");
    expect_error("\"head_dim\": 64", "\"head_dim\": 63", "/head_dim");
    expect_error("\"family\": \"llama\"", "\"family\": \"gpt2\"", "/family");
    expect_error("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1", "/tie_word_embeddings");
    expect_error("\"mlp\": {\"ffn_dim\": 1536}", "\"mlp\": {\"ffn_dim\": 1536}, \"mlp\": null", "duplicate");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_doc_example),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_errors_name_pointer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
