/* tests/unit/test_formats_corpus.c — replays the fuzz corpora (tests/fuzz/corpus/<target>/:
 * seeds and any crash inputs kept as regressions) through the same code as the libFuzzer
 * targets, so `make test` (and its sanitizer pass) guards them without clang's fuzzer.
 * Also feeds every seed truncated at each of 64 evenly spread lengths (the tokenizer
 * target checks decode(encode(x)) == x on each). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define LLVMFuzzerTestOneInput fuzz_safetensors
#include "../fuzz/fuzz_safetensors.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_gguf
#include "../fuzz/fuzz_gguf.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_llama2c
#include "../fuzz/fuzz_llama2c.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_tokenizer
#include "../fuzz/fuzz_tokenizer.c"
#undef LLVMFuzzerTestOneInput

#define REPLAY_MAX_BYTES (4u << 20)   /* larger corpus files are read up to here */

static void replay(const char *target, int (*fn)(const uint8_t *, size_t))
{
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fuzz/corpus/%s", target);
    DIR *d = opendir(dir);
    if (!d)
        fail_msg("%s: missing (run from the repository root)", dir);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        FILE *f = fopen(p, "rb");
        assert_non_null(f);
        uint8_t *buf = malloc(REPLAY_MAX_BYTES);
        assert_non_null(buf);
        size_t n = fread(buf, 1, REPLAY_MAX_BYTES, f);
        fclose(f);
        fn(buf, n);
        for (int k = 0; k < 64; k++) {
            size_t cut = n * (size_t)k / 64;
            uint8_t *c = malloc(cut ? cut : 1);   /* exact-size copy: reads past it are caught by ASan */
            assert_non_null(c);
            memcpy(c, buf, cut);
            fn(c, cut);
            free(c);
        }
        free(buf);
        files++;
    }
    closedir(d);
    assert_true(files > 0);
}

static void test_safetensors_corpus(void **state) { (void)state; replay("safetensors", fuzz_safetensors); }
static void test_gguf_corpus(void **state) { (void)state; replay("gguf", fuzz_gguf); }
static void test_llama2c_corpus(void **state) { (void)state; replay("llama2c", fuzz_llama2c); }
static void test_tokenizer_corpus(void **state)
{
    (void)state;
    replay("tokenizer", fuzz_tokenizer);
    tok_free(bl);
    tok_free(spm);
    bl = spm = NULL;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_corpus),
        cmocka_unit_test(test_gguf_corpus),
        cmocka_unit_test(test_llama2c_corpus),
        cmocka_unit_test(test_tokenizer_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
