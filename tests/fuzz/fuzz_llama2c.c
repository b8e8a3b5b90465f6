/* tests/fuzz/fuzz_llama2c.c — libFuzzer target: the same bytes as a llama2.c checkpoint
 * (header, exact length, tensors read with the RoPE un-permutation) and as a llama2.c
 * tokenizer file (then encode and decode a short text). */
#include <stdint.h>
#include <stdlib.h>

#include "storage/llama2c.h"
#include "storage/tokload.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    l2c_file f;
    char err[256];
    if (l2c_open_mem(&f, data, size, err, sizeof err) == 0) {
        arch a;
        if (l2c_arch(&f, &a, err, sizeof err) == 0)
            arch_free(&a);
        for (int i = 0; i < f.n; i++) {
            int64_t numel = f.t[i].shape[0] * (f.t[i].ndim == 2 ? f.t[i].shape[1] : 1);
            if (numel > (1 << 20))
                continue;
            float *out = malloc((size_t)numel * sizeof *out);
            if (out)
                (void)l2c_read_f32(&f, i, out, numel, err, sizeof err);
            free(out);
        }
        l2c_close(&f);
    }
    int n_vocab = size > 0 ? 3 + data[0] : 3;
    tok_tokenizer *t = tokload_llama2c_mem(data, size, n_vocab, err, sizeof err);
    if (t) {
        static const char text[] = "Once upon a time \xF0\x9F\xA4\x97 \xFF";
        int *ids;
        size_t n, dl;
        char *dec;
        if (tok_encode(t, text, sizeof text - 1, 1, 1, &ids, &n, err, sizeof err) == 0) {
            if (tok_decode(t, ids, n, 1, &dec, &dl, err, sizeof err) == 0)
                free(dec);
            free(ids);
        }
        tok_free(t);
    }
    return 0;
}
