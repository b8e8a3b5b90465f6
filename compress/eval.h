/* compress/eval.h — scoring tasks the way lm-evaluation-harness does.
 *
 * The task logic (tokenizing context/continuation pairs as the harness's _encode_pair,
 * left truncation to the model's context, rolling windows for perplexity, acc,
 * acc_norm, stderr, perplexities, the summary table and JSON) runs against a small
 * model interface: "log-likelihood and greedy flag of continuation tokens given context
 * tokens" over a batch of requests. ev_engine_* plugs the engine (engine/model.h) and
 * tokenizer (engine/tokenizer.h) into that interface.
 */
#ifndef AC_COMPRESS_EVAL_H
#define AC_COMPRESS_EVAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "compress/evaltasks.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

/* One scoring request: context tokens then continuation tokens. The scorer fills ll
 * (sum of log P(cont[i] | ctx, cont[<i]) in nats) and greedy (1 when every cont token is
 * the argmax of its position). n_ctx >= 1, n_cont >= 1, n_ctx + n_cont - 1 <= max_len. */
typedef struct {
    const int *ctx;
    int n_ctx;
    const int *cont;
    int n_cont;
    double ll;
    int greedy;
} ev_request;

/* Score n requests (in any order internally). Returns 0, or -1 with a reason in err. */
typedef int (*ev_loglik_fn)(void *user, ev_request *reqs, int n, char *err, size_t errlen);

/* Tokenize len bytes of text without special tokens. *ids is NEW (malloc; caller
 * frees; may be NULL when *n == 0). Returns 0, or -1 with a reason. */
typedef int (*ev_tokenize_fn)(void *user, const char *text, size_t len, int **ids, int *n, char *err,
                              size_t errlen);

typedef struct {
    ev_tokenize_fn tokenize;
    ev_loglik_fn loglik;
    void *user;          /* passed to both */
    int prefix_token;    /* BOS/EOS: the context of an empty-context request and of
                            the first rolling window (harness prefix_token_id) */
    int add_bos;         /* 1: prefix_token also starts every non-empty context */
    int max_len;         /* model context length (tokens of one forward) */
} ev_model;

/* Progress/cancel hook: called between chunks with items done/total. A nonzero return
 * stops the run (ev_run_task returns 1). */
typedef int (*ev_progress_fn)(void *user, const char *task, int64_t done, int64_t total);

/* Per-item hook (the harness's --log_samples): the item, and for each of its requests
 * (choices; rolling windows) the log-likelihood and greedy flag. */
typedef void (*ev_sample_fn)(void *user, const ev_task *t, const ev_item *it, const double *ll,
                             const int *greedy, int n_requests);

typedef struct {
    int limit;           /* items per task (per MMLU subject); <= 0: all */
    uint64_t seed;       /* sampling seed for limit */
    int chunk_items;     /* items per scorer call (0: 64) */
    ev_progress_fn progress;
    void *progress_user;
    ev_sample_fn sample;
    void *sample_user;
} ev_opts;

typedef struct {
    char name[96];
    int n;
    double acc, acc_stderr;
} ev_group_result;

typedef struct {
    char task[EV_TASK_NAME_MAX + 1];
    char source[512];
    ev_kind kind;
    int ok;                  /* 0: error holds why the task could not run */
    char error[1024];
    int n;                   /* items scored */
    int n_available;         /* items in the source before the limit */
    int n_fewshot;
    int truncated;           /* items whose context was left-truncated to max_len */
    int64_t requests;        /* log-likelihood requests scored */
    int64_t tokens;          /* context + continuation tokens over all requests */
    double wall_s;
    int has_acc, has_acc_norm, has_ppl, has_rolling;
    double acc, acc_stderr;
    double acc_norm, acc_norm_stderr;
    double perplexity;       /* LOGLIK: exp(-mean ll per item), harness "perplexity" */
    double word_perplexity, byte_perplexity, bits_per_byte, token_perplexity;   /* ROLLING */
    int n_groups;            /* MMLU: per-subject results; acc is their macro average */
    ev_group_result *groups; /* owned */
} ev_result;

/* Sample standard error of a mean of 0/1 (or real) values: sample std (ddof 1)/sqrt(n). */
double ev_stderr(const double *x, int n);

/* Index of the largest ll[i] / norm[i] (norm == NULL: of ll); ties go to the first, as
 * numpy.argmax. */
int ev_argmax_norm(const double *ll, const int *norm, int n);

/* Harness _encode_pair: trailing whitespace of ctx moves to the continuation;
 * whole = tok(ctx + cont), ctx_ids = tok(ctx), cont_ids = whole[len(ctx_ids):]
 * (empty ctx: ctx_ids = [prefix_token]); with add_bos, prefix_token starts ctx_ids.
 * *ctx_ids and *cont_ids are NEW. Returns 0, or -1 (tokenizer error, empty
 * continuation) with err. */
int ev_encode_pair(const ev_model *m, const char *ctx, const char *cont, int **ctx_ids, int *n_ctx,
                   int **cont_ids, int *n_cont, char *err, size_t errlen);

/* Harness get_rolling_token_windows(context_len=1) + make_disjoint_window over n
 * tokens: window w predicts tokens [pred_start[w], pred_start[w] + pred_len[w]) given
 * the ctx_len[w] tokens before them (the first window's context is the prefix token,
 * ctx_start = -1). Returns the window count (arrays NEW), or -1 on OOM. */
int ev_rolling_windows(int n_tokens, int max_len, int **ctx_start, int **ctx_len, int **pred_start,
                       int **pred_len);

/* Run one loaded task (already limited) on model m. Returns 0 with r filled (r->ok = 1),
 * 1 when the progress hook cancelled, or -1 with r->error set (scorer or tokenizer
 * failure). r owns its groups: free with ev_result_free. */
int ev_run_task(const ev_model *m, const ev_task *t, const ev_opts *o, ev_result *r);

/* Load (built-in name, or a path ending in .jsonl), limit and run one task; a load
 * failure is recorded in r (ok = 0) and returns -1. Other tasks of a run are unaffected. */
int ev_run_named(const ev_model *m, const char *task, const char *data_dir, const ev_load_opts *lo,
                 const ev_opts *o, ev_result *r);

void ev_result_free(ev_result *r);

/* The folder holding the built-in tasks' data (eval/ and text/), the same for jobs and
 * for `autocompress eval`: $AC_EVAL_DATA, else $AC_SHARED/data, else server_data_dir's
 * data/ root when it holds eval/ (where `make run` copies the benchmarks; NULL: skip),
 * else "data". Returns buf or a static string. */
const char *ev_data_dir(const char *server_data_dir, char *buf, size_t len);

/* JSON of one result: {"task","ok","n",..."acc","acc_stderr",...} (NEW reference). */
json_t *ev_result_json(const ev_result *r);

/* JSON of a run: {"tasks": {name: result...}, "accuracy": {name: {acc, acc_norm?,
 * stderr, n}}, "average": mean acc over tasks with acc, "perplexity": {...}} as in the
 * report (DESIGN.md §10). NEW reference, NULL on OOM. */
json_t *ev_results_json(const ev_result *r, int n);

/* Print the summary table (one row per task, MMLU subjects when verbose). */
void ev_print_table(FILE *f, const ev_result *r, int n, int verbose);

/* ---- the engine behind ev_model ------------------------------------------------------
 * Requests whose model input (ctx + cont[:-1]) is identical share one row (MMLU's " A"
 * .. " D", BoolQ's " no"/" yes": the context is computed once); rows are sorted by
 * length and packed into right-padded batches (lens) under a token and a logits-memory
 * budget; eng_forward(ENG_LOGITS_ALL) then log-softmax in double at the continuation
 * positions (ENG_LOGITS_LAST when every row of a batch scores one token: MMLU,
 * BoolQ, most LAMBADA words). A row too long for the logits budget runs alone in chunks through a KV
 * cache (same result, bounded memory). */
typedef struct {
    eng_model *m;                 /* borrowed */
    const tok_tokenizer *tok;     /* borrowed */
    int max_batch_tokens;         /* B x T per forward (0: 4096) */
    size_t max_logit_bytes;       /* host logits of one forward (0: 256 MiB) */
    int64_t forwards, rows, shared, tokens_forwarded;   /* statistics, accumulated */
    float *logits;                /* host logits buffer, reused across batches (owned) */
    size_t logits_floats;
} ev_engine;

/* Free what e owns (the logits buffer); the model and tokenizer stay the caller's. */
void ev_engine_free(ev_engine *e);

/* Fill out (tokenize/loglik/user = e) for e->m and e->tok. prefix_token = BOS (else EOS);
 * add_bos from the tokenizer's config; max_len = min(max_len, the model's
 * max_position_embeddings) (max_len <= 0: min(2048, the model's)). Returns 0, or -1
 * when the tokenizer has neither BOS nor EOS or its vocabulary exceeds the model's. */
int ev_engine_model(ev_engine *e, int max_len, ev_model *out, char *err, size_t errlen);

#endif
