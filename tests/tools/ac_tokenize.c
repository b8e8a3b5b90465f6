/* tests/tools/ac_tokenize.c — oracle helper: tokenize texts with the engine tokenizer.
 *   ac_tokenize gguf FILE.gguf | hf tokenizer.json | l2c tok.bin N_VOCAB
 * reads a JSON array of strings on stdin and prints a JSON array of objects
 * {"ids": [...], "decoded": "..."} (encode without BOS/EOS, special tokens parsed;
 * decode of those ids). Exit 1 with a message on any error. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/gguf.h"
#include "storage/tokload.h"

int main(int argc, char **argv)
{
    char err[512];
    gguf_file g = {0};
    tok_tokenizer *t = NULL;
    if (argc >= 3 && !strcmp(argv[1], "gguf")) {
        if (gguf_open(&g, argv[2], err, sizeof err) == 0)
            t = tokload_gguf(&g, err, sizeof err);
    } else if (argc >= 3 && !strcmp(argv[1], "hf")) {
        t = tokload_hf_json(argv[2], err, sizeof err);
    } else if (argc >= 4 && !strcmp(argv[1], "l2c")) {
        t = tokload_llama2c(argv[2], (int)strtol(argv[3], NULL, 10), err, sizeof err);
    } else {
        fprintf(stderr, "usage: ac_tokenize gguf FILE | hf tokenizer.json | l2c tok.bin N_VOCAB < texts.json\n");
        return 2;
    }
    if (!t) {
        fprintf(stderr, "ac_tokenize: %s\n", err);
        return 1;
    }
    json_error_t je;
    json_t *in = json_loadf(stdin, JSON_ALLOW_NUL, &je), *out = json_array();
    if (!json_is_array(in) || !out) {
        fprintf(stderr, "ac_tokenize: stdin must be a JSON array of strings (%s)\n", je.text);
        return 1;
    }
    size_t i;
    json_t *x;
    json_array_foreach(in, i, x) {
        int *ids;
        size_t n, dl;
        char *dec;
        if (tok_encode(t, json_string_value(x), json_string_length(x), 0, 1, &ids, &n, err, sizeof err) ||
            tok_decode(t, ids, n, 0, &dec, &dl, err, sizeof err)) {
            fprintf(stderr, "ac_tokenize: text %zu: %s\n", i, err);
            return 1;
        }
        json_t *arr = json_array();
        for (size_t k = 0; k < n; k++)
            json_array_append_new(arr, json_integer(ids[k]));
        json_array_append_new(out, json_pack("{s:o,s:s%}", "ids", arr, "decoded", dec, dl));
        free(ids);
        free(dec);
    }
    json_dumpf(out, stdout, JSON_COMPACT);
    putchar('\n');
    json_decref(in);
    json_decref(out);
    tok_free(t);
    gguf_close(&g);
    return 0;
}
