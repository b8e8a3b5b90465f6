/* tests/fuzz/fuzz_safetensors.c — libFuzzer target: parse a safetensors image and convert
 * every (small enough) tensor to fp32. Any crash, leak or sanitizer report is a bug, and
 * so is an accepted file in which two tensors share bytes (checked pair by pair). */
#include <stdint.h>
#include <stdlib.h>

#include "storage/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_file f;
    char err[256];
    if (st_open_mem(&f, data, size, err, sizeof err))
        return 0;
    for (int i = 0; i < f.n; i++)
        for (int j = i + 1; j < f.n; j++) {
            const st_tensor *a = &f.t[i], *b = &f.t[j];
            if (a->shard == b->shard && a->begin < a->end && b->begin < b->end && a->begin < b->end &&
                b->begin < a->end)
                abort();   /* accepted with overlapping tensors */
        }
    for (int i = 0; i < f.n; i++) {
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
