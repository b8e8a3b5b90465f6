/* tests/tools/export_interop.c — the engine side of the export interop oracles: load a
 * model (GGUF, llama2.c or HF dir), optionally slice it to an arch (prefix pruning),
 * export it, and report what the engine computes on given token ids: greedy
 * continuation, chunked perplexity (llama.cpp's llama-perplexity convention: each chunk
 * of CTX tokens scores its second half) and raw logits. Token ids come from a text file
 * of whitespace-separated integers, so tokenization stays on the peer's side.
 *
 *   export_interop MODEL [--arch A.json] [--no-vocab] [--gguf OUT --dtype D] [--hf DIR --dtype D]
 *                  [--greedy IDS N] [--ppl IDS CTX CHUNKS] [--logits IDS OUT.f32]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/prune.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "storage/archjson.h"
#include "storage/export.h"

static int *read_ids(const char *path, int *n)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    int cap = 1024, k = 0;
    int *ids = malloc((size_t)cap * sizeof *ids);
    long v;
    while (ids && fscanf(f, "%ld", &v) == 1) {
        if (k == cap) {
            cap *= 2;
            int *ni = realloc(ids, (size_t)cap * sizeof *ni);
            if (!ni) {
                free(ids);
                ids = NULL;
                break;
            }
            ids = ni;
        }
        ids[k++] = (int)v;
    }
    fclose(f);
    *n = k;
    return ids;
}

/* A positive decimal integer argument, or exit with usage status 2. */
static int pos_int(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v <= 0 || v > (1 << 20)) {
        fprintf(stderr, "not a positive integer: %s\n", s);
        exit(2);
    }
    return (int)v;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static int greedy(eng_model *m, const int *prompt, int np, int n_new)
{
    char err[512];
    int V = m->a.vocab_size;
    float *logits = malloc((size_t)V * sizeof *logits);
    eng_kv_cache *kv = eng_kv_new(m, 1, np + n_new + 1);
    if (!logits || !kv) {
        fprintf(stderr, "out of memory\n");
        return -1;
    }
    eng_fwd_args a = {.tokens = prompt, .B = 1, .T = np, .kv = kv, .logits_mode = ENG_LOGITS_LAST, .logits = logits};
    printf("greedy:");
    for (int s = 0; s < n_new; s++) {
        if (eng_forward(m, &a, err, sizeof err) < 0) {
            fprintf(stderr, "forward: %s\n", err);
            return -1;
        }
        static int tok;
        tok = argmax(logits, V);
        printf(" %d", tok);
        a.tokens = &tok;
        a.T = 1;
    }
    printf("\n");
    eng_kv_free(kv);
    free(logits);
    return 0;
}

static int perplexity(eng_model *m, const int *ids, int n, int ctx, int chunks)
{
    char err[512];
    int V = m->a.vocab_size;
    float *logits = malloc((size_t)ctx * (size_t)V * sizeof *logits);
    if (!logits)
        return -1;
    double nll = 0;
    long count = 0;
    int done = 0;
    for (int c = 0; c < chunks && (c + 1) * ctx <= n; c++) {
        const int *t = ids + (size_t)c * ctx;
        eng_fwd_args a = {.tokens = t, .B = 1, .T = ctx, .logits_mode = ENG_LOGITS_ALL, .logits = logits};
        if (eng_forward(m, &a, err, sizeof err) < 0) {
            fprintf(stderr, "forward: %s\n", err);
            free(logits);
            return -1;
        }
        for (int j = ctx / 2; j < ctx - 1; j++) {
            const float *l = logits + (size_t)j * V;
            float mx = l[argmax(l, V)];
            double s = 0;
            for (int v = 0; v < V; v++)
                s += exp((double)l[v] - mx);
            nll += log(s) + mx - l[t[j + 1]];
            count++;
        }
        done++;
    }
    printf("ppl: chunks=%d tokens=%ld nll=%.6f ppl=%.6f\n", done, count, nll / count, exp(nll / count));
    free(logits);
    return 0;
}

static int dump_logits(eng_model *m, const int *ids, int n, const char *out)
{
    char err[512];
    size_t cnt = (size_t)n * (size_t)m->a.vocab_size;
    float *logits = malloc(cnt * sizeof *logits);
    eng_fwd_args a = {.tokens = ids, .B = 1, .T = n, .logits_mode = ENG_LOGITS_ALL, .logits = logits};
    if (!logits || eng_forward(m, &a, err, sizeof err) < 0) {
        fprintf(stderr, "forward: %s\n", logits ? err : "out of memory");
        free(logits);
        return -1;
    }
    FILE *f = fopen(out, "wb");
    int rc = f && fwrite(logits, sizeof *logits, cnt, f) == cnt ? 0 : -1;
    if (f && fclose(f) != 0)
        rc = -1;
    free(logits);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: export_interop MODEL [options] (see the file header)\n");
        return 2;
    }
    char err[1024];
    eng_backend *be = eng_backend_cpu_new(0);
    eng_model m, p;
    if (!be || exp_load_model(argv[1], be, &m, err, sizeof err) < 0) {
        fprintf(stderr, "load %s: %s\n", argv[1], be ? err : "no backend");
        return 1;
    }
    eng_model *cur = &m;
    const char *dtype = "fp32";
    int no_vocab = 0;   /* GGUF without a vocabulary (a parent without tokenizer files) */
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--no-vocab")) {
            no_vocab = 1;
        } else if (!strcmp(o, "--dtype") && i + 1 < argc) {
            dtype = argv[++i];
        } else if (!strcmp(o, "--arch") && i + 1 < argc) {
            FILE *f = fopen(argv[++i], "rb");
            char buf[1 << 16];
            size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
            if (f)
                fclose(f);
            arch a;
            if (!len || arch_from_json_text(buf, len, &a, err, sizeof err) < 0 ||
                prune_to_arch(cur, &a, &p, err, sizeof err) < 0) {
                fprintf(stderr, "arch %s: %s\n", argv[i], len ? err : "unreadable");
                return 1;
            }
            arch_free(&a);
            cur = &p;
        } else if ((!strcmp(o, "--gguf") || !strcmp(o, "--hf")) && i + 1 < argc) {
            exp_opts eo = {.dtype = (exp_dtype)exp_dtype_parse(dtype), .parent_path = no_vocab ? NULL : argv[1]};
            exp_result r;
            int rc = !strcmp(o, "--gguf") ? exp_gguf_write(cur, argv[i + 1], &eo, &r, err, sizeof err)
                                          : exp_hf_write(cur, argv[i + 1], &eo, &r, err, sizeof err);
            if (rc < 0) {
                fprintf(stderr, "export: %s\n", err);
                printf("export-refused: %s\n", err);
                if (cur == &p)
                    eng_model_free(&p);
                eng_model_free(&m);
                eng_backend_free(be);
                return 3;
            }
            printf("exported: %s class=%s\n", argv[i + 1], r.model_class);
            i++;
        } else if (!strcmp(o, "--greedy") && i + 2 < argc) {
            int n;
            int *ids = read_ids(argv[i + 1], &n);
            if (!ids || greedy(cur, ids, n, pos_int(argv[i + 2])) < 0)
                return 1;
            free(ids);
            i += 2;
        } else if (!strcmp(o, "--ppl") && i + 3 < argc) {
            int n;
            int *ids = read_ids(argv[i + 1], &n);
            if (!ids || perplexity(cur, ids, n, pos_int(argv[i + 2]), pos_int(argv[i + 3])) < 0)
                return 1;
            free(ids);
            i += 3;
        } else if (!strcmp(o, "--logits") && i + 2 < argc) {
            int n;
            int *ids = read_ids(argv[i + 1], &n);
            if (!ids || dump_logits(cur, ids, n, argv[i + 2]) < 0)
                return 1;
            free(ids);
            i += 2;
        } else {
            fprintf(stderr, "unknown option %s\n", o);
            return 2;
        }
    }
    if (cur == &p)
        eng_model_free(&p);
    eng_model_free(&m);
    eng_backend_free(be);
    return 0;
}
