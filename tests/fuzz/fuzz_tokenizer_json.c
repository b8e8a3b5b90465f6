/* tests/fuzz/fuzz_tokenizer_json.c — libFuzzer target: bytes as an HF tokenizer.json
 * through the loader (storage/tokload.c, read from a memfd so the file path is the real
 * one), then encode and decode a short text. Besides crashes, hangs and sanitizer
 * reports, an accepted tokenizer in which a token's own piece does not find a token with
 * that piece is a bug (the piece table lost or kept a stale entry). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "storage/tokload.h"

/* The loaded tokenizer's every piece finds a token with the same piece. */
static void tokjson_check_table(const tok_tokenizer *t)
{
    for (int id = 0; id < tok_n_vocab(t); id++) {
        size_t n, m;
        const char *p = tok_piece(t, id, &n);
        if (!n)
            continue;
        int got = tok_lookup(t, p, n);
        const char *q = got >= 0 ? tok_piece(t, got, &m) : NULL;
        if (!q || m != n || memcmp(p, q, n))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("tokenizer.json", MFD_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            close(fd);
            return 0;
        }
        done += (size_t)w;
    }
    char path[64], err[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    tok_tokenizer *t = tokload_hf_json(path, err, sizeof err);
    close(fd);
    if (!t)
        return 0;
    tokjson_check_table(t);
    static const char text[] = "Hello  world 123 <s> caf\xC3\xA9\n\xF0\x9F\xA4\x97";
    int *ids;
    size_t n, dl;
    char *dec;
    if (tok_encode(t, text, sizeof text - 1, 1, 1, &ids, &n, err, sizeof err) == 0) {
        if (tok_decode(t, ids, n, 1, &dec, &dl, err, sizeof err) == 0)
            free(dec);
        free(ids);
    }
    tok_free(t);
    return 0;
}
