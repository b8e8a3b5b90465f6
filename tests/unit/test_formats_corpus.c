/* tests/unit/test_formats_corpus.c — replays the fuzz corpora (tests/fuzz/corpus/<target>/:
 * seeds, hostile inputs and any crash inputs kept as regressions) through the libFuzzer
 * targets themselves, built here without libFuzzer, so `make test` (and its sanitizer
 * pass) guards them without clang. Also feeds every file truncated at each of 64 evenly
 * spread lengths (the tokenizer target checks decode(encode(x)) == x on each), under an
 * alarm so that a hang fails. Every tests/fuzz/fuzz_*.c must be listed below and every
 * corpus folder replayed: a new target that is not fails the test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
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
#define LLVMFuzzerTestOneInput fuzz_hfconfig
#include "../fuzz/fuzz_hfconfig.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_tokenizer_json
#include "../fuzz/fuzz_tokenizer_json.c"
#undef LLVMFuzzerTestOneInput

/* target name (tests/fuzz/fuzz_<name>.c, corpus tests/fuzz/corpus/<name>/) -> entry */
static const struct {
    const char *name;
    int (*fn)(const uint8_t *, size_t);
} targets[] = {
    {"safetensors", fuzz_safetensors}, {"gguf", fuzz_gguf},         {"llama2c", fuzz_llama2c},
    {"tokenizer", fuzz_tokenizer},     {"hfconfig", fuzz_hfconfig}, {"tokenizer_json", fuzz_tokenizer_json},
};
#define N_TARGETS (sizeof targets / sizeof targets[0])

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

static int listed(const char *name, size_t len)
{
    for (size_t i = 0; i < N_TARGETS; i++)
        if (strlen(targets[i].name) == len && !memcmp(targets[i].name, name, len))
            return 1;
    return 0;
}

/* Every fuzz_<name>.c and every corpus/<name>/ has its entry in targets[]. */
static void test_every_target_listed(void **state)
{
    (void)state;
    DIR *d = opendir("tests/fuzz");
    assert_non_null(d);
    struct dirent *e;
    int seen = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 7 && !strncmp(e->d_name, "fuzz_", 5) && !strcmp(e->d_name + l - 2, ".c")) {
            if (!listed(e->d_name + 5, l - 7))
                fail_msg("tests/fuzz/%s is not replayed: add it to targets[] in %s", e->d_name, __FILE__);
            seen++;
        }
    }
    closedir(d);
    assert_int_equal(seen, N_TARGETS);
    d = opendir("tests/fuzz/corpus");
    assert_non_null(d);
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' && !listed(e->d_name, strlen(e->d_name)))
            fail_msg("tests/fuzz/corpus/%s has no target in targets[]", e->d_name);
    closedir(d);
}

static void test_corpora(void **state)
{
    (void)state;
    alarm(120);   /* a hang (as a full piece table once gave) fails instead of stalling make test */
    for (size_t i = 0; i < N_TARGETS; i++) {
        print_message("replaying tests/fuzz/corpus/%s\n", targets[i].name);
        replay(targets[i].name, targets[i].fn);
    }
    tok_free(bl);   /* the tokenizer target's lazily built tokenizers */
    tok_free(spm);
    bl = spm = NULL;
    alarm(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_target_listed),
        cmocka_unit_test(test_corpora),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
