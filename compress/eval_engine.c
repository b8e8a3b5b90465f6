/* compress/eval_engine.c — the engine behind the scoring interface of eval.h: tokenizing
 * with the model's tokenizer, and log-likelihoods of continuation tokens from batched
 * forwards, rows of equal input scored once, long rows in chunks through the KV cache.
 */
#include "compress/eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the engine behind ev_model ------------------------------------------------------ */

static int eng_tokenize(void *user, const char *text, size_t len, int **ids, int *n, char *err, size_t errlen)
{
    ev_engine *e = user;
    size_t cnt = 0;
    *ids = NULL;
    *n = 0;
    if (len == 0)
        return 0;
    if (tok_encode(e->tok, text, len, 0, 0, ids, &cnt, err, errlen))
        return -1;
    if (cnt > (size_t)INT32_MAX / 2) {
        free(*ids);
        *ids = NULL;
        snprintf(err, errlen, "text of %zu tokens is too long", cnt);
        return -1;
    }
    *n = (int)cnt;
    return 0;
}

/* One model row: input tokens (ctx + cont[:-1]) shared by the requests pointing at it. */
typedef struct {
    int req;          /* the first request with this input: its tokens define the row */
    int len;          /* input length */
    int tail;         /* its scored positions, the last: its requests' longest continuation */
    uint64_t hash;
    int next;         /* hash chain */
} eng_row;

static int row_tok(const ev_request *q, int i)
{
    return i < q->n_ctx ? q->ctx[i] : q->cont[i - q->n_ctx];
}

static uint64_t row_hash(const ev_request *q)
{
    uint64_t h = 1469598103934665603ULL;
    int len = q->n_ctx + q->n_cont - 1;
    for (int i = 0; i < len; i++) {
        h ^= (uint64_t)(uint32_t)row_tok(q, i);
        h *= 1099511628211ULL;
    }
    return h ^ (uint64_t)len;
}

static int same_input(const ev_request *a, const ev_request *b)
{
    int len = a->n_ctx + a->n_cont - 1;
    if (len != b->n_ctx + b->n_cont - 1)
        return 0;
    for (int i = 0; i < len; i++)
        if (row_tok(a, i) != row_tok(b, i))
            return 0;
    return 1;
}

static int cmp_row_len_desc(const void *x, const void *y, void *base)
{
    const eng_row *rows = base;
    const eng_row *a = &rows[*(const int *)x], *b = &rows[*(const int *)y];
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;
    return (a->req > b->req) - (a->req < b->req);
}

/* One position's logits l[V]: log-sum-exp's parts (max, log of the shifted sum) and the
 * first maximum (as torch argmax: the greedy token). */
typedef struct {
    double mx, lse;
    int am;
} pos_norm;

static pos_norm position_norm(const float *l, int V)
{
    float mx = l[0];
    int am = 0;
    for (int v = 1; v < V; v++)
        if (l[v] > mx) {
            mx = l[v];
            am = v;
        }
    double s = 0.0;
    for (int v = 0; v < V; v++)
        s += exp((double)l[v] - (double)mx);
    return (pos_norm){.mx = mx, .lse = log(s), .am = am};
}

/* Add continuation token tgt, predicted by logits l with norm pn, to q's score. */
static void score_add(ev_request *q, const float *l, pos_norm pn, int tgt)
{
    q->ll += (double)l[tgt] - pn.mx - pn.lse;
    if (pn.am != tgt)
        q->greedy = 0;
}

/* Score request q against logits lg[len, V] of its row (row position p predicts p+1). */
static void score_from_logits(ev_request *q, const float *lg, int len, int V)
{
    q->ll = 0.0;
    q->greedy = 1;
    for (int j = 0; j < q->n_cont; j++) {
        const float *l = lg + (size_t)(len - q->n_cont + j) * V;
        score_add(q, l, position_norm(l, V), q->cont[j]);
    }
}

/* Long row alone, in chunks through a KV cache so logits stay within budget: each
 * chunk's scored positions are added to its members' scores as it comes (in position
 * order, as score_from_logits adds them), so no more than one chunk's logits is held. */
static int eng_row_chunked(ev_engine *e, ev_request *reqs, const int *members, int n_members, int len,
                           int tail, int chunk, char *err, size_t errlen)
{
    int V = e->m->a.vocab_size;
    const ev_request *q0 = &reqs[members[0]];
    int *toks = malloc((size_t)len * sizeof *toks);
    float *lg = malloc((size_t)chunk * V * sizeof *lg);
    eng_kv_cache *kv = eng_kv_new(e->m, 1, len);
    int rc = -1;
    if (!toks || !lg || !kv) {
        snprintf(err, errlen, "out of memory for a %d-token row", len);
        goto out;
    }
    for (int i = 0; i < len; i++)
        toks[i] = row_tok(q0, i);
    for (int k = 0; k < n_members; k++) {
        reqs[members[k]].ll = 0.0;
        reqs[members[k]].greedy = 1;
    }
    for (int p0 = 0; p0 < len; p0 += chunk) {
        int T = len - p0 < chunk ? len - p0 : chunk;
        eng_fwd_args a = {.tokens = toks + p0, .B = 1, .T = T, .kv = kv, .logits_mode = ENG_LOGITS_ALL, .logits = lg};
        if (eng_forward(e->m, &a, err, errlen))
            goto out;
        e->forwards++;
        e->tokens_forwarded += T;
        for (int t = 0; t < T; t++) {
            int p = p0 + t;
            if (p < len - tail)
                continue;
            const float *l = lg + (size_t)t * V;
            pos_norm pn = position_norm(l, V);
            for (int k = 0; k < n_members; k++) {
                ev_request *q = &reqs[members[k]];
                int j = p - (len - q->n_cont);
                if (j >= 0)
                    score_add(q, l, pn, q->cont[j]);
            }
        }
    }
    rc = 0;
out:
    if (kv)
        eng_kv_free(kv);
    free(toks);
    free(lg);
    return rc;
}

static int eng_loglik(void *user, ev_request *reqs, int n, char *err, size_t errlen)
{
    ev_engine *e = user;
    int V = e->m->a.vocab_size;
    size_t logit_cap = e->max_logit_bytes ? e->max_logit_bytes : ((size_t)256 << 20);
    int tok_cap = e->max_batch_tokens > 0 ? e->max_batch_tokens : 4096;
    int max_rows_logits = (int)(logit_cap / ((size_t)V * sizeof(float)));
    if (max_rows_logits < 1)
        max_rows_logits = 1;
    /* 1. rows: identical inputs share one */
    int nb = 1;
    while (nb < 2 * n)
        nb <<= 1;
    eng_row *rows = malloc((size_t)n * sizeof *rows);
    int *bucket = malloc((size_t)nb * sizeof *bucket);
    int *row_of = malloc((size_t)n * sizeof *row_of);
    int *order = malloc((size_t)n * sizeof *order);
    int *members = malloc((size_t)n * sizeof *members);   /* requests grouped by row */
    int *mstart = malloc((size_t)(n + 1) * sizeof *mstart);
    int *toks = NULL, *lens = NULL, *pos = NULL;
    float *logits = NULL;   /* e->logits, borrowed */
    int rc = -1, nr = 0;
    if (!rows || !bucket || !row_of || !order || !members || !mstart) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    for (int i = 0; i < nb; i++)
        bucket[i] = -1;
    for (int i = 0; i < n; i++) {
        ev_request *q = &reqs[i];
        if (q->n_ctx < 1 || q->n_cont < 1) {
            snprintf(err, errlen, "request %d has %d context and %d continuation tokens", i, q->n_ctx, q->n_cont);
            goto out;
        }
        uint64_t h = row_hash(q);
        int b = (int)(h & (uint64_t)(nb - 1)), r;
        for (r = bucket[b]; r >= 0; r = rows[r].next)
            if (rows[r].hash == h && same_input(&reqs[rows[r].req], q))
                break;
        if (r < 0) {
            r = nr++;
            rows[r] = (eng_row){.req = i, .len = q->n_ctx + q->n_cont - 1, .tail = q->n_cont, .hash = h,
                                .next = bucket[b]};
            bucket[b] = r;
        } else {
            e->shared++;
            rows[r].tail = q->n_cont > rows[r].tail ? q->n_cont : rows[r].tail;
        }
        row_of[i] = r;
    }
    /* members of each row, contiguous */
    for (int r = 0; r <= nr; r++)
        mstart[r] = 0;
    for (int i = 0; i < n; i++)
        mstart[row_of[i] + 1]++;
    for (int r = 0; r < nr; r++)
        mstart[r + 1] += mstart[r];
    for (int r = 0; r < nr; r++)
        order[r] = mstart[r];               /* per-row cursor */
    for (int i = 0; i < n; i++)
        members[order[row_of[i]]++] = i;
    /* 2. longest rows first, packed into batches */
    for (int r = 0; r < nr; r++)
        order[r] = r;
    qsort_r(order, (size_t)nr, sizeof *order, cmp_row_len_desc, rows);
    e->rows += nr;
    for (int i0 = 0; i0 < nr;) {
        int T = rows[order[i0]].len;
        if (T > max_rows_logits) {
            int r = order[i0];
            if (eng_row_chunked(e, reqs, members + mstart[r], mstart[r + 1] - mstart[r], T, rows[r].tail,
                                max_rows_logits, err, errlen))
                goto out;
            i0++;
            continue;
        }
        /* rows while the tokens fit (within the logits budget too, as when every position's
         * logits came back: larger batches measured slower on the CPU) */
        int B = 1, n_scored = rows[order[i0]].tail;
        while (i0 + B < nr && B < 256 && (B + 1) * T <= tok_cap && (B + 1) * T <= max_rows_logits)
            n_scored += rows[order[i0 + B++]].tail;
        size_t need = (size_t)n_scored * V;
        free(toks);
        free(lens);
        free(pos);
        toks = calloc((size_t)B * T, sizeof *toks);
        lens = malloc((size_t)B * sizeof *lens);
        pos = malloc((size_t)n_scored * sizeof *pos);
        if (need > e->logits_floats) {
            free(e->logits);
            e->logits = malloc(need * sizeof *e->logits);
            e->logits_floats = e->logits ? need : 0;
        }
        logits = e->logits;
        if (!toks || !lens || !pos || !logits) {
            snprintf(err, errlen, "out of memory for a batch of %d x %d", B, T);
            goto out;
        }
        for (int b = 0, k = 0; b < B; b++) {
            const eng_row *row = &rows[order[i0 + b]];
            const ev_request *q = &reqs[row->req];
            for (int t = 0; t < row->len; t++)
                toks[(size_t)b * T + t] = row_tok(q, t);
            lens[b] = row->len;
            for (int t = row->len - row->tail; t < row->len; t++)
                pos[k++] = b * T + t;
        }
        eng_fwd_args a = {.tokens = toks, .B = B, .T = T, .lens = lens,
                          .logits_mode = ENG_LOGITS_ROWS, .logits = logits,
                          .logit_rows = pos, .n_logit_rows = n_scored};
        if (eng_forward(e->m, &a, err, errlen))
            goto out;
        e->forwards++;
        e->tokens_forwarded += (int64_t)B * T;
        for (int b = 0, off = 0; b < B; b++) {   /* row b's logits: its tail, at off */
            int r = order[i0 + b];
            for (int k = mstart[r]; k < mstart[r + 1]; k++)
                score_from_logits(&reqs[members[k]], logits + (size_t)off * V, rows[r].tail, V);
            off += rows[r].tail;
        }
        i0 += B;
    }
    rc = 0;
out:
    free(rows);
    free(bucket);
    free(row_of);
    free(order);
    free(members);
    free(mstart);
    free(toks);
    free(lens);
    free(pos);
    return rc;
}

void ev_engine_free(ev_engine *e)
{
    if (!e)
        return;
    free(e->logits);
    e->logits = NULL;
    e->logits_floats = 0;
}

int ev_engine_model(ev_engine *e, int max_len, ev_model *out, char *err, size_t errlen)
{
    const tok_config *c = tok_cfg(e->tok);
    memset(out, 0, sizeof *out);
    if (tok_n_vocab(e->tok) > e->m->a.vocab_size) {
        snprintf(err, errlen, "tokenizer has %d tokens, the model %d", tok_n_vocab(e->tok), e->m->a.vocab_size);
        return -1;
    }
    int prefix = c->bos_id >= 0 ? c->bos_id : c->eos_id;
    if (prefix < 0) {
        snprintf(err, errlen, "tokenizer has neither a BOS nor an EOS token to stand for an empty context");
        return -1;
    }
    int mp = e->m->a.max_position_embeddings > 0 ? e->m->a.max_position_embeddings : 2048;
    out->tokenize = eng_tokenize;
    out->loglik = eng_loglik;
    out->user = e;
    out->prefix_token = prefix;
    out->add_bos = c->add_bos && c->bos_id >= 0;
    out->max_len = max_len > 0 ? (max_len < mp ? max_len : mp) : (mp < 2048 ? mp : 2048);
    return 0;
}
