/* tests/unit/tiny_model.h — the smallest files the model format probe (storage/modelio.h
 * mio_probe) takes for each format, for tests that need a model path but not a model:
 * a llama2.c checkpoint (dim 8, 1 layer, vocab 32, context 512, zero weights) and a placeholder for its
 * tokenizer, a GGUF magic, an HF directory with config.json and model.safetensors. Header-only: static functions.
 */
#ifndef AC_TESTS_TINY_MODEL_H
#define AC_TESTS_TINY_MODEL_H

#include <stdint.h>
#include <stdio.h>

/* A llama2.c .bin whose header matches its length (28 bytes + 2,968 floats: the weights, and
 * freq_cis for its context of 512 tokens). 0, or -1. */
static inline int tiny_l2c_write(const char *path)
{
    const int32_t h[7] = {8, 16, 1, 2, 2, 32, 512};   /* dim, hidden, layers, heads, kv, vocab, seq */
    static const float zeros[2968];
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(h, sizeof h, 1, f) == 1 && fwrite(zeros, sizeof zeros, 1, f) == 1;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* A placeholder tok32.bin in folder dir, where the loader looks for tiny_l2c_write's
 * tokenizer (vocab 32): a job's spec check finds it; nothing reads it. 0, or -1. */
static inline int tiny_l2c_tok_write(const char *dir)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/tok32.bin", dir);
    FILE *f = fopen(p, "wb");
    return f && fclose(f) == 0 ? 0 : -1;
}

/* A file that starts with the GGUF magic (the probe's view; it does not parse). 0, or -1. */
static inline int tiny_gguf_magic_write(const char *path)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fputs("GGUF\3\0\0\0", f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

#endif
