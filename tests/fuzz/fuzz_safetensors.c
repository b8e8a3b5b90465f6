/* tests/fuzz/fuzz_safetensors.c — libFuzzer target: parse safetensors images and convert
 * every (small enough) tensor to fp32. The input is one image, or up to 8 shards of one
 * model separated by FUZZ_ST_SHARD_SEP. Any crash, leak or sanitizer report is a bug,
 * and so is an accepted file in which two tensors share bytes (checked pair by pair) or
 * a tensor that st_find does not find by its name. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "storage/safetensors.h"

#define FUZZ_ST_SHARD_SEP "\n--next shard--\n"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char sep[] = FUZZ_ST_SHARD_SEP;
    const void *bufs[8];
    size_t lens[8];
    int n = 0;
    const uint8_t *p = data, *end = data + size, *q;
    while (n < 7 && (q = memmem(p, (size_t)(end - p), sep, sizeof sep - 1))) {
        bufs[n] = p;
        lens[n++] = (size_t)(q - p);
        p = q + sizeof sep - 1;
    }
    bufs[n] = p;
    lens[n++] = (size_t)(end - p);
    st_file f;
    char err[256];
    if (st_open_mem_shards(&f, bufs, lens, n, err, sizeof err))
        return 0;
    for (int i = 0; i < f.n; i++)
        for (int j = i + 1; j < f.n; j++) {
            const st_tensor *a = &f.t[i], *b = &f.t[j];
            if (a->shard == b->shard && a->begin < a->end && b->begin < b->end && a->begin < b->end &&
                b->begin < a->end)
                abort();   /* accepted with overlapping tensors */
        }
    for (int i = 0; i < f.n; i++) {
        if (st_find(&f, f.t[i].name) != i)
            abort();   /* names must be unique and found */
        if (f.t[i].numel > (1 << 20))
            continue;
        float *out = malloc((size_t)(f.t[i].numel ? f.t[i].numel : 1) * sizeof *out);
        if (out && st_read_f32(&f, i, out, f.t[i].numel, err, sizeof err) == 0 && f.t[i].numel > 0)
            out[0] += 1.0f;
        free(out);
    }
    st_close(&f);
    return 0;
}
