/* server/cli_model.c — `autocompress inspect | generate | perplexity`: look at a model,
 * sample text from it, and measure token-level perplexity on a text file (llama.cpp's
 * chunked method, or a sliding window). CPU backend; models load through storage/modelio, and generate / perplexity also
 * take a pruned or distilled snapshot folder (compress/prune.h prune_load_model).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/prune.h"
#include "engine/backend.h"
#include "engine/clock.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "server/cli.h"
#include "storage/archjson.h"
#include "storage/fileio.h"
#include "storage/modelio.h"

/* ---------- option parsing ---------- */

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "autocompress: %s: \"%s\" is not an integer in [%ld, %ld]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_double(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "autocompress: %s: \"%s\" is not a number in [%g, %g]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---------- inspect ---------- */

static void inspect_usage(FILE *f)
{
    fprintf(f, "usage: autocompress inspect MODEL [--json]\n"
               "  MODEL: HF directory, .safetensors (config.json beside it), .gguf, or llama2.c .bin\n"
               "  --json  print the arch JSON (DESIGN.md §10) only\n");
}

int cli_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int as_json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            as_json = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            inspect_usage(stdout);
            return 0;
        } else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else {
            fprintf(stderr, "autocompress inspect: %s \"%s\"\n",
                    argv[i][0] == '-' ? "unknown option" : "unexpected argument", argv[i]);
            inspect_usage(stderr);
            return 2;
        }
    }
    if (!path) {
        inspect_usage(stderr);
        return 2;
    }
    char err[512];
    mio_model m;
    if (mio_open(&m, path, NULL, err, sizeof err)) {
        fprintf(stderr, "autocompress inspect: %s\n", err);
        return 1;
    }
    if (as_json) {
        json_t *j = arch_to_json(&m.a);
        char *s = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        if (!s) {
            fprintf(stderr, "autocompress inspect: out of memory\n");
            json_decref(j);
            mio_close(&m);
            return 1;
        }
        printf("%s\n", s);
        free(s);
        json_decref(j);
        mio_close(&m);
        return 0;
    }
    const arch *a = &m.a;
    printf("model:       %s\nformat:      %s\n", path, mio_format_name(m.format));
    printf("family:      %s\nvocab:       %d\nhidden:      %d\nhead_dim:    %d\nlayers:      %d\n", a->family,
           a->vocab_size, a->hidden_size, a->head_dim, a->n_layers);
    printf("context:     %d\nrope_theta:  %g\nnorm_eps:    %g\ntied emb.:   %s\nqkv bias:    %s\n",
           a->max_position_embeddings, a->rope_theta, a->norm_eps, a->tie_word_embeddings ? "yes" : "no",
           a->attention_bias ? "yes" : "no");
    if (a->rope_scaling.type) {
        static const char *const names[] = {"none", "linear", "llama3", "dynamic"};
        printf("rope scale:  %s, factor %g\n", names[a->rope_scaling.type], a->rope_scaling.factor);
    }
    printf("\nlayer  source  heads  kv_heads  ffn_dim\n");
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        char h[16], kv[16], f[16];
        snprintf(h, sizeof h, "%d", l->n_heads);
        snprintf(kv, sizeof kv, "%d", l->n_kv_heads);
        snprintf(f, sizeof f, "%d", l->ffn_dim);
        printf("%5d  %6d  %5s  %8s  %7s\n", i, l->source_layer, l->n_heads ? h : "-", l->n_heads ? kv : "-",
               l->ffn_dim ? f : "-");
    }
    printf("\nparameters:  %lld\n", (long long)arch_params(a));
    /* weight bytes by stored dtype */
    const char *names[16];
    uint64_t bytes[16] = {0};
    int counts[16] = {0}, nd = 0;
    uint64_t total = 0;
    for (int i = 0; i < m.n_tensors; i++) {
        int k = 0;
        while (k < nd && strcmp(names[k], m.t[i].dtype))
            k++;
        if (k == nd && nd < 16)
            names[nd++] = m.t[i].dtype;
        if (k < nd) {
            bytes[k] += m.t[i].nbytes;
            counts[k]++;
        }
        total += m.t[i].nbytes;
    }
    printf("weights:     %llu bytes in %d tensors\n", (unsigned long long)total, m.n_tensors);
    for (int k = 0; k < nd; k++)
        printf("  %-6s %12llu bytes  %4d tensors\n", names[k], (unsigned long long)bytes[k], counts[k]);
    mio_close(&m);
    return 0;
}

/* ---------- shared loading ---------- */

typedef struct {
    eng_backend *be;
    eng_model m;
    tok_tokenizer *tok;
} loaded;

static int load(const char *path, const char *tokpath, int threads, loaded *L, const char *cmd)
{
    char err[512];
    memset(L, 0, sizeof *L);
    L->be = eng_backend_cpu_new(threads);
    if (!L->be) {
        fprintf(stderr, "autocompress %s: cannot create the CPU backend\n", cmd);
        return -1;
    }
    if (prune_load_model(path, tokpath, L->be, &L->m, &L->tok, err, sizeof err)) {
        fprintf(stderr, "autocompress %s: %s\n", cmd, err);
        eng_backend_free(L->be);
        return -1;
    }
    return 0;
}

static void unload(loaded *L)
{
    tok_free(L->tok);
    eng_model_free(&L->m);
    eng_backend_free(L->be);
}

/* ---------- generate ---------- */

static void generate_usage(FILE *f)
{
    fprintf(f, "usage: autocompress generate MODEL [--prompt TEXT] [--max-tokens N] [--temperature T]\n"
               "                                  [--top-p P] [--seed S] [--tokenizer PATH] [--threads N]\n"
               "  Prints the prompt and its continuation. Temperature 0 (default) is greedy; without a\n"
               "  prompt generation starts from BOS. Stops at EOS, N tokens or the context length.\n");
}

int cli_generate(int argc, char **argv)
{
    const char *path = NULL, *prompt = "", *tokpath = NULL;
    long max_tokens = 64, seed = 1234, threads = 0;
    double temperature = 0.0, top_p = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            generate_usage(stdout);
            return 0;
        } else if (!strcmp(o, "--prompt") && has)
            prompt = argv[++i];
        else if (!strcmp(o, "--tokenizer") && has)
            tokpath = argv[++i];
        else if (!strcmp(o, "--max-tokens") && has) {
            if (parse_long(o, argv[++i], 0, 1 << 20, &max_tokens)) return 2;
        } else if (!strcmp(o, "--seed") && has) {
            if (parse_long(o, argv[++i], 0, 0x7fffffffL, &seed)) return 2;
        } else if (!strcmp(o, "--threads") && has) {
            if (parse_long(o, argv[++i], 0, 1024, &threads)) return 2;
        } else if (!strcmp(o, "--temperature") && has) {
            if (parse_double(o, argv[++i], 0.0, 100.0, &temperature)) return 2;
        } else if (!strcmp(o, "--top-p") && has) {
            if (parse_double(o, argv[++i], 0.0, 1.0, &top_p)) return 2;
        } else if (o[0] != '-' && !path)
            path = o;
        else {
            fprintf(stderr, "autocompress generate: %s \"%s\"\n", o[0] == '-' ? "unknown option" : "unexpected argument",
                    o);
            generate_usage(stderr);
            return 2;
        }
    }
    if (!path) {
        generate_usage(stderr);
        return 2;
    }
    loaded L;
    if (load(path, tokpath, (int)threads, &L, "generate"))
        return 1;
    char err[512];
    int *ids = NULL, *seq = NULL, rc = 1;
    size_t n = 0, printed = 0;
    eng_kv_cache *kv = NULL;
    float *logits = NULL;
    const tok_config *tc = tok_cfg(L.tok);
    int V = L.m.a.vocab_size, ctx = L.m.a.max_position_embeddings;
    if (tok_encode(L.tok, prompt, strlen(prompt), 1, 1, &ids, &n, err, sizeof err)) {
        fprintf(stderr, "autocompress generate: %s\n", err);
        goto out;
    }
    if (n == 0 && tc->bos_id >= 0) {   /* empty prompt, tokenizer adds no BOS: start from BOS anyway */
        free(ids);
        ids = malloc(sizeof *ids);
        if (!ids) {
            fprintf(stderr, "autocompress generate: out of memory\n");
            goto out;
        }
        ids[0] = tc->bos_id;
        n = 1;
    }
    if (n == 0) {
        fprintf(stderr, "autocompress generate: the prompt is empty and the tokenizer has no BOS to start from\n");
        goto out;
    }
    if ((long)n + max_tokens > ctx)
        max_tokens = ctx - (long)n;
    if (max_tokens < 0) {
        fprintf(stderr, "autocompress generate: the prompt (%zu tokens) is longer than the context (%d)\n", n, ctx);
        goto out;
    }
    seq = malloc((n + (size_t)max_tokens + 1) * sizeof *seq);
    logits = malloc((size_t)V * sizeof *logits);
    kv = eng_kv_new(&L.m, 1, (int)n + (int)max_tokens + 1);
    if (!seq || !logits || !kv) {
        fprintf(stderr, "autocompress generate: out of memory\n");
        goto out;
    }
    memcpy(seq, ids, n * sizeof *seq);
    size_t len = n;
    uint64_t rng = (uint64_t)seed * 0x9E3779B97F4A7C15ULL + 1;
    double t0 = eng_wall_s(), t_prefill = 0;
    int produced = 0;
    const int *feed = ids;
    int feed_n = (int)n;
    for (long step = 0; step <= max_tokens; step++) {
        eng_fwd_args fa = {.tokens = feed, .B = 1, .T = feed_n, .kv = kv, .logits_mode = ENG_LOGITS_LAST,
                           .logits = logits};
        if (eng_forward(&L.m, &fa, err, sizeof err)) {
            fprintf(stderr, "autocompress generate: %s\n", err);
            goto out;
        }
        if (step == 0)
            t_prefill = eng_wall_s() - t0;
        /* print what is decodable so far */
        char *text;
        size_t tl;
        if (tok_decode(L.tok, seq, len, 1, &text, &tl, err, sizeof err)) {
            fprintf(stderr, "autocompress generate: %s\n", err);
            goto out;
        }
        if (tl > printed) {
            fwrite(text + printed, 1, tl - printed, stdout);
            fflush(stdout);
            printed = tl;
        }
        free(text);
        if (step == max_tokens)
            break;
        int next = eng_sample(logits, V, (float)temperature, (float)top_p, &rng);
        if (next < 0 || next >= V || next == tc->eos_id)
            break;
        seq[len++] = next;
        produced++;
        feed = &seq[len - 1];
        feed_n = 1;
    }
    /* the last token sampled was appended but not yet printed */
    char *text;
    size_t tl;
    if (tok_decode(L.tok, seq, len, 1, &text, &tl, err, sizeof err) == 0) {
        if (tl > printed)
            fwrite(text + printed, 1, tl - printed, stdout);
        free(text);
    }
    printf("\n");
    double el = eng_wall_s() - t0;
    fprintf(stderr, "[%zu prompt tokens, %d generated; prefill %.3f s, %.1f tokens/s decode]\n", n, produced,
            t_prefill, produced > 0 && el > t_prefill ? produced / (el - t_prefill) : 0.0);
    rc = 0;
out:
    free(ids);
    free(seq);
    free(logits);
    eng_kv_free(kv);
    unload(&L);
    return rc;
}

/* ---------- perplexity ---------- */

static void perplexity_usage(FILE *f)
{
    fprintf(f, "usage: autocompress perplexity MODEL --text FILE [--ctx N] [--stride N] [--chunks N]\n"
               "                                    [--tokenizer PATH] [--threads N] [--json]\n"
               "  Default (llama.cpp's method): non-overlapping chunks of N tokens (the first token of\n"
               "  each chunk replaced by BOS when the tokenizer adds one), scoring the second half\n"
               "  of each chunk. --stride S: sliding windows of N tokens advancing by S, every\n"
               "  token after the first scored once. --chunks limits the number of chunks/windows.\n");
}

/* Add -log p(target | logits row) for `count` rows of logits. */
static void score_rows(const float *logits, int V, const int *targets, int count, double *nll)
{
    for (int r = 0; r < count; r++) {
        const float *row = logits + (size_t)r * (size_t)V;
        float mx = row[0];
        for (int v = 1; v < V; v++)
            if (row[v] > mx)
                mx = row[v];
        double s = 0;
        for (int v = 0; v < V; v++)
            s += exp((double)row[v] - mx);
        *nll += log(s) + mx - row[targets[r]];
    }
}

int cli_perplexity(int argc, char **argv)
{
    const char *path = NULL, *text_path = NULL, *tokpath = NULL;
    long ctx = 512, stride = 0, max_chunks = 0, threads = 0;
    int as_json = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            perplexity_usage(stdout);
            return 0;
        } else if (!strcmp(o, "--text") && has)
            text_path = argv[++i];
        else if (!strcmp(o, "--tokenizer") && has)
            tokpath = argv[++i];
        else if (!strcmp(o, "--json"))
            as_json = 1;
        else if (!strcmp(o, "--ctx") && has) {
            if (parse_long(o, argv[++i], 2, 1 << 20, &ctx)) return 2;
        } else if (!strcmp(o, "--stride") && has) {
            if (parse_long(o, argv[++i], 1, 1 << 20, &stride)) return 2;
        } else if (!strcmp(o, "--chunks") && has) {
            if (parse_long(o, argv[++i], 0, 1 << 30, &max_chunks)) return 2;
        } else if (!strcmp(o, "--threads") && has) {
            if (parse_long(o, argv[++i], 0, 1024, &threads)) return 2;
        } else if (o[0] != '-' && !path)
            path = o;
        else {
            fprintf(stderr, "autocompress perplexity: %s \"%s\"\n",
                    o[0] == '-' ? "unknown option" : "unexpected argument", o);
            perplexity_usage(stderr);
            return 2;
        }
    }
    if (!path || !text_path) {
        perplexity_usage(stderr);
        return 2;
    }
    if (stride > ctx) {
        fprintf(stderr, "autocompress perplexity: --stride %ld exceeds --ctx %ld\n", stride, ctx);
        return 2;
    }
    size_t tlen;
    char rerr[512];
    char *text = fio_read_all(text_path, 0, &tlen, rerr, sizeof rerr);
    if (!text) {
        fprintf(stderr, "autocompress perplexity: %s\n", rerr);
        return 1;
    }
    loaded L;
    if (load(path, tokpath, (int)threads, &L, "perplexity")) {
        free(text);
        return 1;
    }
    char err[512];
    int *toks = NULL, rc = 1;
    size_t nt = 0;
    float *logits = NULL;
    int V = L.m.a.vocab_size;
    const tok_config *tc = tok_cfg(L.tok);
    if (ctx > L.m.a.max_position_embeddings) {
        fprintf(stderr, "autocompress perplexity: --ctx %ld exceeds the model's context %d\n", ctx,
                L.m.a.max_position_embeddings);
        goto out;
    }
    if (tok_encode(L.tok, text, tlen, 1, 0, &toks, &nt, err, sizeof err)) {
        fprintf(stderr, "autocompress perplexity: %s\n", err);
        goto out;
    }
    logits = malloc((size_t)ctx * (size_t)V * sizeof *logits);
    int *input = malloc((size_t)ctx * sizeof *input);
    if (!logits || !input) {
        free(input);
        fprintf(stderr, "autocompress perplexity: out of memory\n");
        goto out;
    }
    double nll = 0, t0 = eng_wall_s();
    long scored = 0, chunks = 0;
    if (!stride) {
        /* llama.cpp: chunk i = tokens[i*ctx, (i+1)*ctx), first token -> BOS, score j in [ctx/2, ctx-1) */
        long n_chunk = (long)nt / ctx;
        if (max_chunks > 0 && max_chunks < n_chunk)
            n_chunk = max_chunks;
        if (n_chunk < 1) {
            fprintf(stderr, "autocompress perplexity: %zu tokens are fewer than one chunk of %ld\n", nt, ctx);
            free(input);
            goto out;
        }
        int first = (int)(ctx / 2);
        for (long c = 0; c < n_chunk; c++) {
            memcpy(input, toks + c * ctx, (size_t)ctx * sizeof *input);
            if (tc->add_bos && tc->bos_id >= 0)
                input[0] = tc->bos_id;
            eng_fwd_args fa = {.tokens = input, .B = 1, .T = (int)ctx, .logits_mode = ENG_LOGITS_ALL, .logits = logits};
            if (eng_forward(&L.m, &fa, err, sizeof err)) {
                fprintf(stderr, "autocompress perplexity: %s\n", err);
                free(input);
                goto out;
            }
            int count = (int)ctx - 1 - first;
            score_rows(logits + (size_t)first * (size_t)V, V, toks + c * ctx + first + 1, count, &nll);
            scored += count;
            chunks++;
            if (!as_json)
                fprintf(stderr, "[%ld] %.4f\n", c + 1, exp(nll / (double)scored));
        }
    } else {
        /* sliding windows: window [b, b+ctx), targets not scored by an earlier window */
        long prev_end = 0;
        for (long b = 0; b < (long)nt - 1; b += stride) {
            long e = b + ctx < (long)nt ? b + ctx : (long)nt;
            long from = prev_end > b + 1 ? prev_end : b + 1;   /* first target position */
            eng_fwd_args fa = {.tokens = toks + b, .B = 1, .T = (int)(e - b), .logits_mode = ENG_LOGITS_ALL,
                               .logits = logits};
            if (eng_forward(&L.m, &fa, err, sizeof err)) {
                fprintf(stderr, "autocompress perplexity: %s\n", err);
                free(input);
                goto out;
            }
            if (e > from) {
                score_rows(logits + (size_t)(from - 1 - b) * (size_t)V, V, toks + from, (int)(e - from), &nll);
                scored += e - from;
            }
            prev_end = e;
            chunks++;
            if (max_chunks > 0 && chunks >= max_chunks)
                break;
            if (e == (long)nt)
                break;
        }
    }
    free(input);
    if (scored == 0) {
        fprintf(stderr, "autocompress perplexity: no tokens to score\n");
        goto out;
    }
    double mean = nll / (double)scored, el = eng_wall_s() - t0;
    if (as_json)
        printf("{\"ppl\": %.6f, \"mean_nll\": %.6f, \"tokens_scored\": %ld, \"text_tokens\": %zu, \"chunks\": %ld, "
               "\"ctx\": %ld, \"stride\": %ld, \"mode\": \"%s\", \"seconds\": %.2f}\n",
               exp(mean), mean, scored, nt, chunks, ctx, stride, stride ? "sliding" : "chunks", el);
    else
        printf("perplexity: %.4f  (mean NLL %.4f nats/token over %ld tokens; %ld %s of ctx %ld; %.1f s)\n", exp(mean),
               mean, scored, chunks, stride ? "windows" : "chunks", ctx, el);
    rc = 0;
out:
    free(text);
    free(toks);
    free(logits);
    unload(&L);
    return rc;
}
