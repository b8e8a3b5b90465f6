/* compress/eval.c — lm-evaluation-harness scoring over the ev_model interface.
 *
 * Requests are built per chunk of items (tokenized as the harness's _encode_pair,
 * left-truncated as its HFLM does), handed to the scorer in one call so it can batch
 * and share work, then reduced to acc / acc_norm / stderr / perplexities. Limits:
 * rolling perplexity uses disjoint windows (context_len 1) as the harness does.
 */
#include "compress/eval.h"
#include "engine/clock.h"
#include "storage/fileio.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ---- small pieces ------------------------------------------------------------------ */

double ev_stderr(const double *x, int n)
{
    if (n < 2)
        return 0.0;
    double mean = 0.0;
    for (int i = 0; i < n; i++)
        mean += x[i];
    mean /= n;
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (x[i] - mean) * (x[i] - mean);
    return sqrt(ss / (n - 1)) / sqrt((double)n);
}

int ev_argmax_norm(const double *ll, const int *norm, int n)
{
    int best = 0;
    double bv = -INFINITY;
    for (int i = 0; i < n; i++) {
        double v = norm ? ll[i] / (double)(norm[i] > 0 ? norm[i] : 1) : ll[i];
        if (i == 0 || v > bv) {
            bv = v;
            best = i;
        }
    }
    return best;
}

int ev_encode_pair(const ev_model *m, const char *ctx, const char *cont, int **ctx_ids, int *n_ctx,
                   int **cont_ids, int *n_cont, char *err, size_t errlen)
{
    *ctx_ids = *cont_ids = NULL;
    *n_ctx = *n_cont = 0;
    size_t cl = strlen(ctx), k = cl;
    int bos = m->add_bos ? 1 : 0;
    int *c = NULL, *w = NULL, nc = 0, nw = 0;
    if (cl == 0) {
        /* harness: context_enc = [prefix_token_id], continuation_enc = tok(continuation) */
        if (m->tokenize(m->user, cont, strlen(cont), &w, &nw, err, errlen))
            return -1;
        c = malloc(sizeof *c);
        if (!c) {
            free(w);
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        c[0] = m->prefix_token;
        nc = 1;
        goto done;
    }
    while (k > 0 && isspace((unsigned char)ctx[k - 1]))
        k--;
    size_t contl = strlen(cont);
    char *whole = malloc(cl + contl + 1);
    if (!whole) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(whole, ctx, cl);
    memcpy(whole + cl, cont, contl + 1);
    int *ct = NULL, *wt = NULL, nct = 0, nwt = 0;
    if (m->tokenize(m->user, ctx, k, &ct, &nct, err, errlen)) {
        free(whole);
        return -1;
    }
    if (m->tokenize(m->user, whole, cl + contl, &wt, &nwt, err, errlen)) {
        free(whole);
        free(ct);
        return -1;
    }
    free(whole);
    nc = nct + bos;
    nw = nwt - nct;
    c = malloc((size_t)(nc > 0 ? nc : 1) * sizeof *c);
    w = malloc((size_t)(nw > 0 ? nw : 1) * sizeof *w);
    if (!c || !w) {
        free(ct);
        free(wt);
        free(c);
        free(w);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (bos)
        c[0] = m->prefix_token;
    if (nct)
        memcpy(c + bos, ct, (size_t)nct * sizeof *c);
    if (nw > 0)
        memcpy(w, wt + nct, (size_t)nw * sizeof *w);
    free(ct);
    free(wt);
    if (nc == 0) {
        /* a whitespace-only context: the prefix token stands in for it */
        c[0] = m->prefix_token;
        nc = 1;
    }
done:
    if (nw <= 0) {
        free(c);
        free(w);
        snprintf(err, errlen, "continuation tokenizes to nothing");
        return -1;
    }
    *ctx_ids = c;
    *n_ctx = nc;
    *cont_ids = w;
    *n_cont = nw;
    return 0;
}

int ev_rolling_windows(int n_tokens, int max_len, int **ctx_start, int **ctx_len, int **pred_start, int **pred_len)
{
    *ctx_start = *ctx_len = *pred_start = *pred_len = NULL;
    if (n_tokens <= 0 || max_len < 1)
        return 0;
    int cap = n_tokens / max_len + 2;
    int *cs = malloc((size_t)cap * sizeof *cs), *cl = malloc((size_t)cap * sizeof *cl);
    int *ps = malloc((size_t)cap * sizeof *ps), *pl = malloc((size_t)cap * sizeof *pl);
    if (!cs || !cl || !ps || !pl) {
        free(cs);
        free(cl);
        free(ps);
        free(pl);
        return -1;
    }
    int w = 0;
    int first = n_tokens < max_len ? n_tokens : max_len;
    cs[w] = -1;        /* the prefix token */
    cl[w] = 1;
    ps[w] = 0;
    pl[w] = first;
    w++;
    int predicted = first;
    while (predicted < n_tokens) {
        int wpl = n_tokens - predicted < max_len ? n_tokens - predicted : max_len;
        int end = predicted + wpl;
        /* input = tokens[end - max_len - 1 : end - 1]; disjoint: ctx = input[: max_len - (wpl - 1)] */
        cs[w] = end - max_len - 1;
        cl[w] = max_len + 1 - wpl;
        ps[w] = end - wpl;
        pl[w] = wpl;
        w++;
        predicted += wpl;
    }
    *ctx_start = cs;
    *ctx_len = cl;
    *pred_start = ps;
    *pred_len = pl;
    return w;
}

/* ---- request building ---------------------------------------------------------------- */

typedef struct {
    ev_request *reqs;
    int n, cap;
    void **owned;      /* token buffers to free after the chunk */
    int n_owned, cap_owned;
} req_list;

static int own(req_list *l, void *p)
{
    if (l->n_owned == l->cap_owned) {
        int nc = l->cap_owned ? l->cap_owned * 2 : 256;
        void **no = realloc(l->owned, (size_t)nc * sizeof *no);
        if (!no)
            return -1;
        l->owned = no;
        l->cap_owned = nc;
    }
    l->owned[l->n_owned++] = p;
    return 0;
}

/* Add a request, left-truncating (ctx + cont)[:-1] to max_len as the harness does:
 * inp = (ctx + cont)[-(max_len + 1):][:-1]. Sets *trunc when tokens were dropped. */
static int add_req(req_list *l, const int *ctx, int n_ctx, const int *cont, int n_cont, int max_len, int *trunc)
{
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 256;
        ev_request *nr = realloc(l->reqs, (size_t)nc * sizeof *nr);
        if (!nr)
            return -1;
        l->reqs = nr;
        l->cap = nc;
    }
    if (n_ctx + n_cont > max_len + 1) {
        *trunc = 1;
        if (n_cont >= max_len + 1) {
            /* continuation alone overflows: keep its last max_len tokens, preceded by
             * the token before them (only the scored tail counts) */
            int keep = max_len;
            ctx = cont + (n_cont - keep - 1);
            n_ctx = 1;
            cont = cont + (n_cont - keep);
            n_cont = keep;
        } else {
            int drop = n_ctx + n_cont - (max_len + 1);
            ctx += drop;
            n_ctx -= drop;
        }
    }
    ev_request *r = &l->reqs[l->n++];
    r->ctx = ctx;
    r->n_ctx = n_ctx;
    r->cont = cont;
    r->n_cont = n_cont;
    r->ll = 0.0;
    r->greedy = 0;
    return 0;
}

static void req_list_reset(req_list *l)
{
    for (int i = 0; i < l->n_owned; i++)
        free(l->owned[i]);
    l->n_owned = 0;
    l->n = 0;
}

static void req_list_free(req_list *l)
{
    req_list_reset(l);
    free(l->reqs);
    free(l->owned);
    memset(l, 0, sizeof *l);
}

/* ---- running a task ---------------------------------------------------------------- */

void ev_result_free(ev_result *r)
{
    if (!r)
        return;
    free(r->groups);
    r->groups = NULL;
    r->n_groups = 0;
}

static void result_init(ev_result *r, const ev_task *t)
{
    memset(r, 0, sizeof *r);
    snprintf(r->task, sizeof r->task, "%s", t->name);
    snprintf(r->source, sizeof r->source, "%s", t->source);
    r->kind = t->kind;
    r->n_fewshot = t->n_fewshot;
}

/* Per-item outcomes and running sums of one task run (ev_run_task). */
typedef struct {
    double *acc, *accn, *ll_item;
    double sum_ll;
    int64_t sum_words, sum_bytes, sum_pred_tokens;
} run_acc;

/* Queue the scoring requests of item it into rl: rolling windows over its text, or one
 * request per choice. 0, or -1 with r->error. */
static int item_requests(const ev_model *m, const ev_task *t, const ev_item *it, req_list *rl, run_acc *ra,
                         ev_result *r)
{
    int trunc = 0;
    char e[256];
    if (t->kind == EV_KIND_ROLLING) {
        const char *doc = it->choices[0].cont;
        int *toks = NULL, nt = 0;
        if (m->tokenize(m->user, doc, strlen(doc), &toks, &nt, e, sizeof e)) {
            snprintf(r->error, sizeof r->error, "%.400s:%d: tokenizer: %.300s", t->source, it->line, e);
            return -1;
        }
        int *pre = malloc(sizeof *pre);
        if (!pre || own(rl, toks) || own(rl, pre)) {
            free(toks);
            free(pre);
            snprintf(r->error, sizeof r->error, "out of memory");
            return -1;
        }
        pre[0] = m->prefix_token;
        int *cs, *cl, *ps, *pl;
        int nw = ev_rolling_windows(nt, m->max_len, &cs, &cl, &ps, &pl);
        if (nw < 0) {
            snprintf(r->error, sizeof r->error, "out of memory");
            return -1;
        }
        int rc = 0;
        for (int w = 0; w < nw && !rc; w++)
            if (add_req(rl, cs[w] < 0 ? pre : toks + cs[w], cl[w], toks + ps[w], pl[w], m->max_len, &trunc)) {
                snprintf(r->error, sizeof r->error, "out of memory");
                rc = -1;
            }
        free(cs);
        free(cl);
        free(ps);
        free(pl);
        ra->sum_words += it->words;
        ra->sum_bytes += it->bytes;
        ra->sum_pred_tokens += nt;
        r->truncated += trunc;
        return rc;
    }
    for (int c = 0; c < it->n_choices; c++) {
        const char *ctx = it->choices[c].ctx ? it->choices[c].ctx : it->ctx;
        int *ci, *wi, nci, nwi;
        if (ev_encode_pair(m, ctx ? ctx : "", it->choices[c].cont, &ci, &nci, &wi, &nwi, e, sizeof e)) {
            snprintf(r->error, sizeof r->error, "%.400s:%d: choice %d: %.300s", t->source, it->line, c, e);
            return -1;
        }
        if (own(rl, ci) || own(rl, wi) || add_req(rl, ci, nci, wi, nwi, m->max_len, &trunc)) {
            snprintf(r->error, sizeof r->error, "out of memory");
            return -1;
        }
    }
    r->truncated += trunc;
    return 0;
}

/* Item i's outcome from its nq scored requests rq. */
static void item_outcome(const ev_task *t, int i, const ev_request *rq, int nq, const ev_opts *o, run_acc *ra)
{
    const ev_item *it = &t->items[i];
    if (o && o->sample) {
        double sll[64];
        int sg[64];
        int ns = nq < 64 ? nq : 64;
        for (int q = 0; q < ns; q++) {
            sll[q] = rq[q].ll;
            sg[q] = rq[q].greedy;
        }
        o->sample(o->sample_user, t, it, sll, sg, ns);
    }
    if (t->kind == EV_KIND_MC) {
        double ll[64];
        int norm[64];
        int nc = it->n_choices < 64 ? it->n_choices : 64;
        for (int c = 0; c < nc; c++) {
            ll[c] = rq[c].ll;
            norm[c] = it->choices[c].norm_len;
        }
        ra->acc[i] = ev_argmax_norm(ll, NULL, nc) == it->gold;
        ra->accn[i] = ev_argmax_norm(ll, norm, nc) == it->gold;
        return;
    }
    double s = 0.0;
    int greedy = 1;
    for (int q = 0; q < nq; q++) {
        s += rq[q].ll;
        greedy &= rq[q].greedy ? 1 : 0;
    }
    ra->ll_item[i] = s;
    ra->acc[i] = greedy;
    ra->sum_ll += s;
}

/* MMLU-style groups: accuracy per group and their macro average (with the standard
 * error of a mean of independent estimates). 0, or -1 on OOM. */
static int summarize_groups(const ev_task *t, const run_acc *ra, ev_result *r)
{
    int n = t->n_items;
    r->groups = calloc((size_t)t->n_groups, sizeof *r->groups);
    double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    if (!r->groups || !x) {
        free(x);
        snprintf(r->error, sizeof r->error, "out of memory");
        return -1;
    }
    r->n_groups = t->n_groups;
    double macro = 0.0, var = 0.0;
    int k = 0;
    for (int g = 0; g < t->n_groups; g++) {
        ev_group_result *gr = &r->groups[g];
        snprintf(gr->name, sizeof gr->name, "%s", t->groups[g]);
        int m_ = 0;
        for (int i = 0; i < n; i++)
            if (t->items[i].group == g)
                x[m_++] = ra->acc[i];
        gr->n = m_;
        double s = 0.0;
        for (int i = 0; i < m_; i++)
            s += x[i];
        gr->acc = m_ ? s / m_ : 0.0;
        gr->acc_stderr = ev_stderr(x, m_);
        if (m_ > 0) {
            macro += gr->acc;
            var += gr->acc_stderr * gr->acc_stderr;
            k++;
        }
    }
    free(x);
    r->acc = k ? macro / k : 0.0;
    r->acc_stderr = k ? sqrt(var) / k : 0.0;
    return 0;
}

/* The task's metrics from the items' outcomes. 0, or -1 with r->error. */
static double mean_of(const double *x, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += x[i];
    return n ? s / n : 0.0;
}

static int summarize(const ev_task *t, const run_acc *ra, ev_result *r)
{
    int n = t->n_items;
    if (t->kind == EV_KIND_MC || t->kind == EV_KIND_LOGLIK) {
        r->has_acc = 1;
        r->acc = mean_of(ra->acc, n);
        r->acc_stderr = ev_stderr(ra->acc, n);
    }
    if (t->kind == EV_KIND_MC && t->report_acc_norm) {
        r->has_acc_norm = 1;
        r->acc_norm = mean_of(ra->accn, n);
        r->acc_norm_stderr = ev_stderr(ra->accn, n);
    }
    if (t->kind == EV_KIND_LOGLIK) {
        /* exp of a mean summed log-likelihood below -709 overflows (long continuations):
           no perplexity then, rather than one JSON cannot hold */
        r->perplexity = n ? exp(-mean_of(ra->ll_item, n)) : 0.0;
        r->has_ppl = isfinite(r->perplexity);
    }
    if (t->kind == EV_KIND_ROLLING) {
        r->has_rolling = 1;
        r->word_perplexity = ra->sum_words ? exp(-ra->sum_ll / (double)ra->sum_words) : 0.0;
        r->byte_perplexity = ra->sum_bytes ? exp(-ra->sum_ll / (double)ra->sum_bytes) : 0.0;
        r->bits_per_byte = ra->sum_bytes ? -ra->sum_ll / (double)ra->sum_bytes / log(2.0) : 0.0;
        r->token_perplexity = ra->sum_pred_tokens ? exp(-ra->sum_ll / (double)ra->sum_pred_tokens) : 0.0;
        r->has_rolling = isfinite(r->word_perplexity) && isfinite(r->byte_perplexity) &&
                         isfinite(r->token_perplexity);
    }
    if (t->n_groups > 0 && t->kind == EV_KIND_MC)
        return summarize_groups(t, ra, r);
    return 0;
}

int ev_run_task(const ev_model *m, const ev_task *t, const ev_opts *o, ev_result *r)
{
    result_init(r, t);
    r->n_available = t->n_items;
    if (m->max_len < 2) {
        snprintf(r->error, sizeof r->error, "model context length %d is too small", m->max_len);
        return -1;
    }
    int chunk = o && o->chunk_items > 0 ? o->chunk_items : 64;
    int n = t->n_items;
    if (n == 0) {   /* an empty data file (a failed copy) is not a measured 0 */
        snprintf(r->error, sizeof r->error, "the task has no items");
        return -1;
    }
    run_acc ra = {calloc((size_t)(n ? n : 1), sizeof(double)), calloc((size_t)(n ? n : 1), sizeof(double)),
                  calloc((size_t)(n ? n : 1), sizeof(double)), 0.0, 0, 0, 0};
    req_list rl = {0};
    int *item_first = malloc((size_t)(chunk + 1) * sizeof *item_first);   /* first request of each item */
    int rc = 0;
    double t0 = eng_wall_s();
    if (!ra.acc || !ra.accn || !ra.ll_item || !item_first) {
        snprintf(r->error, sizeof r->error, "out of memory");
        rc = -1;
    }
    /* items in chunks: queue their requests, score them in one batch, take outcomes */
    for (int i0 = 0; i0 < n && !rc; i0 += chunk) {
        int i1 = i0 + chunk < n ? i0 + chunk : n;
        req_list_reset(&rl);
        for (int i = i0; i < i1 && !rc; i++) {
            item_first[i - i0] = rl.n;
            rc = item_requests(m, t, &t->items[i], &rl, &ra, r);
        }
        if (rc)
            break;
        item_first[i1 - i0] = rl.n;
        char e[512];
        if (rl.n > 0 && m->loglik(m->user, rl.reqs, rl.n, e, sizeof e)) {
            snprintf(r->error, sizeof r->error, "scoring failed: %.480s", e);
            rc = -1;
            break;
        }
        for (int q = 0; q < rl.n; q++) {
            r->requests++;
            r->tokens += rl.reqs[q].n_ctx + rl.reqs[q].n_cont;
            if (!isfinite(rl.reqs[q].ll) && !rc) {   /* a broken model's NaN is no score, and no choice */
                snprintf(r->error, sizeof r->error, "the model gave a log-likelihood of %g (not a finite "
                         "number) in items %d-%d: no score", rl.reqs[q].ll, i0 + 1, i1);
                rc = -1;
            }
        }
        if (rc)
            break;
        for (int i = i0; i < i1; i++)
            item_outcome(t, i, rl.reqs + item_first[i - i0], item_first[i - i0 + 1] - item_first[i - i0], o, &ra);
        r->n = i1;
        if (o && o->progress && o->progress(o->progress_user, t->name, i1, n)) {
            rc = 1;
            snprintf(r->error, sizeof r->error, "cancelled");
        }
    }
    if (!rc) {
        r->n = n;
        r->wall_s = eng_wall_s() - t0;
        rc = summarize(t, &ra, r);
        r->ok = rc == 0;
    }
    if (rc)
        r->wall_s = eng_wall_s() - t0;
    free(ra.acc);
    free(ra.accn);
    free(ra.ll_item);
    free(item_first);
    req_list_free(&rl);
    return rc;
}

const char *ev_data_dir(const char *server_data_dir, char *buf, size_t len)
{
    const char *d = getenv("AC_EVAL_DATA");
    if (d && *d)
        return d;
    const char *sh = getenv("AC_SHARED");
    if (sh && *sh) {
        snprintf(buf, len, "%s/data", sh);
        return buf;
    }
    struct stat sb;
    if (server_data_dir && snprintf(buf, len, "%s/data/eval", server_data_dir) < (int)len && stat(buf, &sb) == 0 &&
        S_ISDIR(sb.st_mode)) {
        buf[strlen(buf) - 5] = 0;   /* drop "/eval" */
        return buf;
    }
    return "data";
}

int ev_run_named(const ev_model *m, const char *task, const char *data_dir, const ev_load_opts *lo,
                 const ev_opts *o, ev_result *r)
{
    ev_task t;
    char err[512], name[EV_TASK_NAME_MAX + 1];
    int rc;
    if (fio_has_suffix(task, ".jsonl")) {
        /* a user task is named after its file: /x/support.jsonl -> "support", cut (if
         * longer than a name may be) before a whole UTF-8 character */
        const char *base = strrchr(task, '/');
        base = base ? base + 1 : task;
        size_t len = strlen(base) - 6 < EV_TASK_NAME_MAX ? strlen(base) - 6 : EV_TASK_NAME_MAX;
        while (len > 0 && ((unsigned char)base[len] & 0xC0) == 0x80)
            len--;
        snprintf(name, sizeof name, "%.*s", (int)len, base);
        rc = ev_load_jsonl(task, name, &t, err, sizeof err);
    } else {
        snprintf(name, sizeof name, "%s", task);
        rc = ev_task_load(task, data_dir, lo, &t, err, sizeof err);
    }
    if (rc) {
        memset(r, 0, sizeof *r);
        snprintf(r->task, sizeof r->task, "%s", name);
        snprintf(r->error, sizeof r->error, "%s", err);
        return -1;
    }
    int avail = t.n_items;
    ev_task_limit(&t, o ? o->limit : 0, o ? o->seed : 0);
    rc = ev_run_task(m, &t, o, r);
    r->n_available = avail;
    ev_task_free(&t);
    return rc;
}

/* ---- output -------------------------------------------------------------------------- */

static const char *kind_name(ev_kind k)
{
    return k == EV_KIND_MC ? "multiple_choice" : k == EV_KIND_LOGLIK ? "loglikelihood" : "loglikelihood_rolling";
}

json_t *ev_result_json(const ev_result *r)
{
    json_t *j = json_object();
    if (!j)
        return NULL;
    int bad = 0;
    bad |= json_object_set_new(j, "task", json_string(r->task));
    bad |= json_object_set_new(j, "ok", json_boolean(r->ok));
    if (!r->ok) {
        bad |= json_object_set_new(j, "error", json_string(r->error));
        if (bad) {
            json_decref(j);
            return NULL;
        }
        return j;
    }
    bad |= json_object_set_new(j, "source", json_string(r->source));
    bad |= json_object_set_new(j, "output_type", json_string(kind_name(r->kind)));
    bad |= json_object_set_new(j, "n", json_integer(r->n));
    bad |= json_object_set_new(j, "n_available", json_integer(r->n_available));
    bad |= json_object_set_new(j, "num_fewshot", json_integer(r->n_fewshot));
    bad |= json_object_set_new(j, "truncated", json_integer(r->truncated));
    bad |= json_object_set_new(j, "requests", json_integer(r->requests));
    bad |= json_object_set_new(j, "tokens", json_integer(r->tokens));
    bad |= json_object_set_new(j, "wall_s", json_real(r->wall_s));
    if (r->has_acc) {
        bad |= json_object_set_new(j, "acc", json_real(r->acc));
        bad |= json_object_set_new(j, "acc_stderr", json_real(r->acc_stderr));
    }
    if (r->has_acc_norm) {
        bad |= json_object_set_new(j, "acc_norm", json_real(r->acc_norm));
        bad |= json_object_set_new(j, "acc_norm_stderr", json_real(r->acc_norm_stderr));
    }
    if (r->has_ppl)
        bad |= json_object_set_new(j, "perplexity", json_real(r->perplexity));
    if (r->has_rolling) {
        bad |= json_object_set_new(j, "word_perplexity", json_real(r->word_perplexity));
        bad |= json_object_set_new(j, "byte_perplexity", json_real(r->byte_perplexity));
        bad |= json_object_set_new(j, "bits_per_byte", json_real(r->bits_per_byte));
        bad |= json_object_set_new(j, "token_perplexity", json_real(r->token_perplexity));
    }
    if (r->n_groups > 0) {
        json_t *g = json_object();
        bad |= !g;
        for (int i = 0; g && i < r->n_groups; i++)
            bad |= json_object_set_new(g, r->groups[i].name,
                                       json_pack("{s:i,s:f,s:f}", "n", r->groups[i].n, "acc", r->groups[i].acc,
                                                 "acc_stderr", r->groups[i].acc_stderr));
        bad |= json_object_set_new(j, "subjects", g);
        bad |= json_object_set_new(j, "aggregation", json_string("macro average over subjects"));
    }
    if (bad) {
        json_decref(j);
        return NULL;
    }
    return j;
}

json_t *ev_results_json(const ev_result *r, int n)
{
    json_t *root = json_object(), *tasks = json_object(), *accj = json_object(), *ppl = json_object();
    if (!root || !tasks || !accj || !ppl) {
        json_decref(root);
        json_decref(tasks);
        json_decref(accj);
        json_decref(ppl);
        return NULL;
    }
    int bad = 0, k = 0;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        bad |= json_object_set_new(tasks, r[i].task, ev_result_json(&r[i]));
        if (!r[i].ok)
            continue;
        if (r[i].has_acc) {
            json_t *a = json_pack("{s:f,s:f,s:i}", "acc", r[i].acc, "stderr", r[i].acc_stderr, "n", r[i].n);
            if (a && r[i].has_acc_norm) {
                bad |= json_object_set_new(a, "acc_norm", json_real(r[i].acc_norm));
                bad |= json_object_set_new(a, "acc_norm_stderr", json_real(r[i].acc_norm_stderr));
            }
            bad |= json_object_set_new(accj, r[i].task, a);
            sum += r[i].acc;
            k++;
        }
        if (r[i].has_ppl)
            bad |= json_object_set_new(ppl, r[i].task, json_real(r[i].perplexity));
        if (r[i].has_rolling)
            bad |= json_object_set_new(ppl, r[i].task, json_real(r[i].word_perplexity));
    }
    bad |= json_object_set_new(root, "tasks", tasks);
    bad |= json_object_set_new(root, "accuracy", accj);
    bad |= json_object_set_new(root, "average", k ? json_real(sum / k) : json_null());
    bad |= json_object_set_new(root, "perplexity", ppl);
    if (bad) {
        json_decref(root);
        return NULL;
    }
    return root;
}

void ev_print_table(FILE *f, const ev_result *r, int n, int verbose)
{
    fprintf(f, "%-16s %6s %7s %7s %8s %7s %10s %5s %8s\n", "task", "n", "acc", "±", "acc_norm", "±", "ppl",
            "trunc", "items/s");
    for (int i = 0; i < n; i++) {
        const ev_result *x = &r[i];
        if (!x->ok) {
            fprintf(f, "%-16s ERROR: %s\n", x->task, x->error);
            continue;
        }
        char a[16] = "-", as[16] = "", an[16] = "-", ans[16] = "", p[16] = "-";
        if (x->has_acc) {
            snprintf(a, sizeof a, "%.4f", x->acc);
            snprintf(as, sizeof as, "%.4f", x->acc_stderr);
        }
        if (x->has_acc_norm) {
            snprintf(an, sizeof an, "%.4f", x->acc_norm);
            snprintf(ans, sizeof ans, "%.4f", x->acc_norm_stderr);
        }
        if (x->has_ppl)
            snprintf(p, sizeof p, "%.3f", x->perplexity);
        if (x->has_rolling)
            snprintf(p, sizeof p, "%.3f", x->word_perplexity);
        fprintf(f, "%-16s %6d %7s %7s %8s %7s %10s %5d %8.2f\n", x->task, x->n, a, as, an, ans, p, x->truncated,
                x->wall_s > 0 ? x->n / x->wall_s : 0.0);
        if (x->has_rolling)
            fprintf(f, "%-16s word_perplexity %.4f  byte_perplexity %.4f  bits_per_byte %.4f  token_perplexity %.4f\n",
                    "", x->word_perplexity, x->byte_perplexity, x->bits_per_byte, x->token_perplexity);
        if (verbose)
            for (int g = 0; g < x->n_groups; g++)
                fprintf(f, "  %-40s %5d %7.4f %7.4f\n", x->groups[g].name, x->groups[g].n, x->groups[g].acc,
                        x->groups[g].acc_stderr);
    }
}

