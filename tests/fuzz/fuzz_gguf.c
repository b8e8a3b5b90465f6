/* tests/fuzz/fuzz_gguf.c — libFuzzer target: parse a GGUF image, derive the arch (llama, or
 * the MoE and Mamba-2 families of storage/gguf_families.c) and every tensor's HF parts,
 * dequantize every (small enough) tensor and each stacked part, and build + run the tokenizer
 * from metadata.
 * Besides crashes and sanitizer reports, a special token id that differs from the
 * file's value is a bug. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "storage/gguf.h"
#include "storage/gguf_families.h"
#include "storage/tokload.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file g;
    char err[256];
    if (gguf_open_mem(&g, data, size, err, sizeof err))
        return 0;
    arch a;
    if (gguf_arch(&g, &a, err, sizeof err) == 0) {
        for (int i = 0; i < g.n_tensors; i++) {
            gguf_hf_part *p;
            int np;
            if (gguf_hf_parts(&g, &a, i, &p, &np, err, sizeof err) != 0)
                continue;
            if (np > 1 && g.t[i].numel <= (1 << 20)) {   /* the last expert of a stack */
                float *out = malloc((size_t)(g.t[i].numel / np + 1) * sizeof *out);
                if (out)
                    (void)gguf_read_f32_sub(&g, i, np - 1, np, out, g.t[i].numel / np + 1, err, sizeof err);
                free(out);
            }
            free(p);
        }
        arch_free(&a);
    }
    for (int i = 0; i < g.n_tensors; i++) {
        if (g.t[i].numel > (1 << 20))
            continue;
        float *out = malloc((size_t)g.t[i].numel * sizeof *out);
        if (out)
            (void)gguf_read_f32(&g, i, out, g.t[i].numel, err, sizeof err);
        free(out);
    }
    tok_tokenizer *t = tokload_gguf(&g, err, sizeof err);
    if (t) {
        /* property: an accepted special id is the file's value, not a truncation of it */
        const tok_config *c = tok_cfg(t);
        int64_t v;
        if ((!gguf_get_int(&g, "tokenizer.ggml.bos_token_id", &v) && v != c->bos_id) ||
            (!gguf_get_int(&g, "tokenizer.ggml.eos_token_id", &v) && v != c->eos_id) ||
            (!gguf_get_int(&g, "tokenizer.ggml.unknown_token_id", &v) && v != c->unk_id) ||
            (!gguf_get_int(&g, "tokenizer.ggml.padding_token_id", &v) && v != c->pad_id))
            abort();
        static const char text[] = "Hello  world 123 <|im_start|> caf\xC3\xA9\n";
        int *ids;
        size_t n, dl;
        char *dec;
        if (tok_encode(t, text, sizeof text - 1, 1, 1, &ids, &n, err, sizeof err) == 0) {
            if (tok_decode(t, ids, n, 0, &dec, &dl, err, sizeof err) == 0)
                free(dec);
            free(ids);
        }
        tok_free(t);
    }
    gguf_close(&g);
    return 0;
}
