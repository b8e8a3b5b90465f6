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
#include "compress/textdata.h"
#include "engine/backend.h"
#include "engine/clock.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "server/cli.h"
#include "server/cli_args.h"
#include "storage/archjson.h"
#include "storage/fileio.h"
#include "storage/modelio.h"

/* ---------- inspect ---------- */

static void inspect_usage(FILE *f)
{
    fprintf(f, "usage: autocompress inspect MODEL [--json]\n"
               "  MODEL: HF directory, .safetensors (config.json beside it), .gguf, or llama2.c .bin\n"
               "  --json  print the arch JSON (DESIGN.md §10) only\n");
}

int cli_inspect(int argc, char **argv)
{
    static const struct option opts[] = {{"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {0}};
    cli_parser p;
    int as_json = 0, c;
    cli_init(&p, "inspect", argc, argv, opts, NULL, inspect_usage);
    while ((c = cli_next(&p)) > 0)
        as_json = 1;   /* 'j', the only option */
    if (c != CLI_END)
        return cli_status(c);
    const char *path = cli_operand(&p);
    if (cli_no_more_operands(&p))
        return 2;
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

typedef struct {
    const char *path, *prompt, *tokpath;
    long max_tokens, seed, threads;
    double temperature, top_p;
} generate_args;

/* CLI_END with *a filled, or the exit status (0 after --help, 2 on bad usage). */
static int generate_parse(int argc, char **argv, generate_args *a)
{
    static const struct option opts[] = {
        {"prompt", required_argument, NULL, 'p'},      {"tokenizer", required_argument, NULL, 'k'},
        {"max-tokens", required_argument, NULL, 'n'},  {"seed", required_argument, NULL, 's'},
        {"threads", required_argument, NULL, 'j'},     {"temperature", required_argument, NULL, 't'},
        {"top-p", required_argument, NULL, 'P'},       {"help", no_argument, NULL, 'h'},
        {0}};
    *a = (generate_args){.prompt = "", .max_tokens = 64, .seed = 1234, .temperature = 0.0, .top_p = 1.0};
    cli_parser p;
    int c;
    cli_init(&p, "generate", argc, argv, opts, NULL, generate_usage);
    while ((c = cli_next(&p)) > 0) {
        switch (c) {
        case 'p': a->prompt = p.arg; break;
        case 'k': a->tokpath = p.arg; break;
        case 'n': cli_long(&p, 0, 1 << 20, &a->max_tokens); break;
        case 's': cli_long(&p, 0, 0x7fffffffL, &a->seed); break;
        case 'j': cli_long(&p, 0, 1024, &a->threads); break;
        case 't': cli_num(&p, 0.0, 100.0, &a->temperature); break;
        case 'P': cli_num(&p, 0.0, 1.0, &a->top_p); break;
        }
    }
    if (c != CLI_END)
        return cli_status(c);
    a->path = cli_operand(&p);
    if (cli_no_more_operands(&p))
        return 2;
    if (!a->path) {
        generate_usage(stderr);
        return 2;
    }
    return CLI_END;
}

int cli_generate(int argc, char **argv)
{
    generate_args a;
    int pr = generate_parse(argc, argv, &a);
    if (pr != CLI_END)
        return pr;
    long max_tokens = a.max_tokens;   /* cut to the context below */
    loaded L;
    if (load(a.path, a.tokpath, (int)a.threads, &L, "generate"))
        return 1;
    char err[512];
    int *ids = NULL, *seq = NULL, rc = 1;
    size_t n = 0, printed = 0;
    eng_kv_cache *kv = NULL;
    float *logits = NULL;
    const tok_config *tc = tok_cfg(L.tok);
    int V = L.m.a.vocab_size, ctx = L.m.a.max_position_embeddings;
    if (tok_encode(L.tok, a.prompt, strlen(a.prompt), 1, 1, &ids, &n, err, sizeof err)) {
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
    uint64_t rng = (uint64_t)a.seed * 0x9E3779B97F4A7C15ULL + 1;
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
        int next = eng_sample(logits, V, (float)a.temperature, (float)a.top_p, &rng);
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

typedef struct {
    const char *path, *text_path, *tokpath;
    long ctx, stride, max_chunks, threads;
    int as_json;
} perplexity_args;

/* CLI_END with *a filled, or the exit status. */
static int perplexity_parse(int argc, char **argv, perplexity_args *a)
{
    static const struct option opts[] = {
        {"text", required_argument, NULL, 't'},   {"tokenizer", required_argument, NULL, 'k'},
        {"json", no_argument, NULL, 'J'},         {"ctx", required_argument, NULL, 'c'},
        {"stride", required_argument, NULL, 's'}, {"chunks", required_argument, NULL, 'n'},
        {"threads", required_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'},
        {0}};
    *a = (perplexity_args){.ctx = 512};
    cli_parser p;
    int c;
    cli_init(&p, "perplexity", argc, argv, opts, NULL, perplexity_usage);
    while ((c = cli_next(&p)) > 0) {
        switch (c) {
        case 't': a->text_path = p.arg; break;
        case 'k': a->tokpath = p.arg; break;
        case 'J': a->as_json = 1; break;
        case 'c': cli_long(&p, 2, 1 << 20, &a->ctx); break;
        case 's': cli_long(&p, 1, 1 << 20, &a->stride); break;
        case 'n': cli_long(&p, 0, 1 << 30, &a->max_chunks); break;
        case 'j': cli_long(&p, 0, 1024, &a->threads); break;
        }
    }
    if (c != CLI_END)
        return cli_status(c);
    a->path = cli_operand(&p);
    if (cli_no_more_operands(&p))
        return 2;
    if (!a->path || !a->text_path) {
        perplexity_usage(stderr);
        return 2;
    }
    if (a->stride > a->ctx) {
        fprintf(stderr, "autocompress perplexity: --stride %ld exceeds --ctx %ld\n", a->stride, a->ctx);
        return 2;
    }
    return CLI_END;
}

typedef struct {
    double nll;            /* summed over the scored tokens (nats) */
    long scored, chunks;
} ppl_sum;

/* llama.cpp: chunk i = tokens[i*ctx, (i+1)*ctx), first token -> BOS, score j in
 * [ctx/2, ctx-1) (the loss taken in the engine: eng_forward_loss). 0, or -1 after printing
 * the reason. */
static int ppl_chunks(loaded *L, const perplexity_args *a, const int *toks, size_t nt, ppl_sum *s)
{
    const tok_config *tc = tok_cfg(L->tok);
    int first = (int)(a->ctx / 2);
    long ctx = a->ctx, n_chunk = (long)nt / ctx;
    char err[512];
    if (a->max_chunks > 0 && a->max_chunks < n_chunk)
        n_chunk = a->max_chunks;
    if (n_chunk < 1) {
        fprintf(stderr, "autocompress perplexity: %zu tokens are fewer than one chunk of %ld\n", nt, ctx);
        return -1;
    }
    int *input = malloc((size_t)ctx * sizeof *input), *target = malloc((size_t)ctx * sizeof *target);
    if (!input || !target) {
        free(input);
        free(target);
        fprintf(stderr, "autocompress perplexity: out of memory\n");
        return -1;
    }
    for (long c = 0; c < n_chunk; c++) {
        memcpy(input, toks + c * ctx, (size_t)ctx * sizeof *input);
        if (tc->add_bos && tc->bos_id >= 0)
            input[0] = tc->bos_id;
        for (long j = 0; j < ctx; j++)
            target[j] = j >= first && j < ctx - 1 ? toks[c * ctx + j + 1] : -1;
        double nll;
        if (eng_forward_loss(&L->m, input, target, 1, (int)ctx, &nll, err, sizeof err)) {
            fprintf(stderr, "autocompress perplexity: %s\n", err);
            free(input);
            free(target);
            return -1;
        }
        s->nll += nll;
        s->scored += (int)ctx - 1 - first;
        s->chunks++;
        if (!a->as_json)
            fprintf(stderr, "[%ld] %.4f\n", c + 1, exp(s->nll / (double)s->scored));
    }
    free(input);
    free(target);
    return 0;
}

/* Sliding windows [b, b+ctx) advancing by the stride, each target scored by the first
 * window that reaches it. 0, or -1 after printing the reason. */
static int ppl_sliding(loaded *L, const perplexity_args *a, const int *toks, size_t nt, ppl_sum *s)
{
    long prev_end = 0;
    char err[512];
    int *target = malloc((size_t)a->ctx * sizeof *target);
    if (!target) {
        fprintf(stderr, "autocompress perplexity: out of memory\n");
        return -1;
    }
    for (long b = 0; b < (long)nt - 1; b += a->stride) {
        long e = b + a->ctx < (long)nt ? b + a->ctx : (long)nt;
        long from = prev_end > b + 1 ? prev_end : b + 1;   /* first target position */
        for (long p = 0; p < e - b; p++)   /* position p predicts token b + p + 1 */
            target[p] = b + p + 1 >= from && b + p + 1 < e ? toks[b + p + 1] : -1;
        double nll;
        if (eng_forward_loss(&L->m, toks + b, target, 1, (int)(e - b), &nll, err, sizeof err)) {
            fprintf(stderr, "autocompress perplexity: %s\n", err);
            free(target);
            return -1;
        }
        if (e > from) {
            s->nll += nll;
            s->scored += e - from;
        }
        prev_end = e;
        s->chunks++;
        if ((a->max_chunks > 0 && s->chunks >= a->max_chunks) || e == (long)nt)
            break;
    }
    free(target);
    return 0;
}

static void ppl_print(const perplexity_args *a, const ppl_sum *s, size_t nt, double el)
{
    double mean = s->nll / (double)s->scored;
    if (a->as_json)
        printf("{\"ppl\": %.6f, \"mean_nll\": %.6f, \"tokens_scored\": %ld, \"text_tokens\": %zu, \"chunks\": %ld, "
               "\"ctx\": %ld, \"stride\": %ld, \"mode\": \"%s\", \"seconds\": %.2f}\n",
               exp(mean), mean, s->scored, nt, s->chunks, a->ctx, a->stride, a->stride ? "sliding" : "chunks", el);
    else
        printf("perplexity: %.4f  (mean NLL %.4f nats/token over %ld tokens; %ld %s of ctx %ld; %.1f s)\n", exp(mean),
               mean, s->scored, s->chunks, a->stride ? "windows" : "chunks", a->ctx, el);
}

int cli_perplexity(int argc, char **argv)
{
    perplexity_args a;
    int pr = perplexity_parse(argc, argv, &a);
    if (pr != CLI_END)
        return pr;
    size_t tlen;
    char err[512];
    char *text = fio_read_input(a.text_path, (size_t)TD_MAX_FILE_BYTES, &tlen, err, sizeof err);
    if (!text) {
        fprintf(stderr, "autocompress perplexity: %s\n", err);
        return 1;
    }
    loaded L;
    if (load(a.path, a.tokpath, (int)a.threads, &L, "perplexity")) {
        free(text);
        return 1;
    }
    int *toks = NULL, rc = 1;
    size_t nt = 0;
    ppl_sum sum = {0};
    if (a.ctx > L.m.a.max_position_embeddings) {
        fprintf(stderr, "autocompress perplexity: --ctx %ld exceeds the model's context %d\n", a.ctx,
                L.m.a.max_position_embeddings);
        goto out;
    }
    if (tok_encode(L.tok, text, tlen, 1, 0, &toks, &nt, err, sizeof err)) {
        fprintf(stderr, "autocompress perplexity: %s\n", err);
        goto out;
    }
    double t0 = eng_wall_s();
    if ((a.stride ? ppl_sliding : ppl_chunks)(&L, &a, toks, nt, &sum))
        goto out;
    if (sum.scored == 0) {
        fprintf(stderr, "autocompress perplexity: no tokens to score\n");
        goto out;
    }
    ppl_print(&a, &sum, nt, eng_wall_s() - t0);
    rc = 0;
out:
    free(text);
    free(toks);
    unload(&L);
    return rc;
}
