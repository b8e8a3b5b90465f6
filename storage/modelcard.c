/* storage/modelcard.c — renders MODEL_CARD.md from the arch and the job report.
 *
 * Text is built in a growing buffer; numbers are printed as the report holds them.
 * Absent values read "not measured" so the card never claims more than the job did.
 */
#include "storage/modelcard.h"
#include "storage/fileio.h"
#include "storage/strbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A JSON number (or "not measured") into buf. */
static const char *num(const json_t *v, char *buf, size_t n)
{
    if (json_is_integer(v))
        snprintf(buf, n, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, n, "%.4g", json_real_value(v));
    else if (json_is_boolean(v))
        snprintf(buf, n, "%s", json_is_true(v) ? "yes" : "no");
    else if (json_is_string(v))
        snprintf(buf, n, "%s", json_string_value(v));
    else
        snprintf(buf, n, "not measured");
    return buf;
}

static const json_t *get(const json_t *o, const char *k)
{
    return json_is_object(o) ? json_object_get(o, k) : NULL;
}

/* s as a Markdown code span on one line: fenced by one backtick more than its longest run
 * of backticks, control characters (a newline would end the span) shown as '?'. */
static void md_code(strbuf *b, const char *s)
{
    int run = 0, longest = 0;
    for (const char *p = s; *p; p++) {
        run = *p == '`' ? run + 1 : 0;
        longest = run > longest ? run : longest;
    }
    for (int i = 0; i <= longest; i++)
        strbuf_printf(b, "`");
    strbuf_printf(b, " ");
    for (const char *p = s; *p; p++)
        strbuf_printf(b, "%c", (unsigned char)*p < 0x20 || *p == 0x7f ? '?' : *p);
    strbuf_printf(b, " ");
    for (int i = 0; i <= longest; i++)
        strbuf_printf(b, "`");
}

/* s as Markdown text in a table cell or a sentence: the characters that make markup or end
 * a cell (\ | ` * < > [ ]) backslash-escaped, control characters shown as '?'. */
static void md_text(strbuf *b, const char *s)
{
    for (const char *p = s; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            strbuf_printf(b, "?");
        else
            strbuf_printf(b, "%s%c", strchr("\\|`*<>[]", *p) ? "\\" : "", *p);
    }
}

static void costs_row(strbuf *b, const char *label, const json_t *side)
{
    char x[64], y[64], z[64], w[64];
    const json_t *pr = get(side, "predicted"), *me = get(side, "measured");
    const json_t *pm = get(pr, "memory_bytes");
    strbuf_printf(b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", label,
              num(get(side, "params"), x, sizeof x),
              num(get(pr, "latency_ms"), y, sizeof y), num(get(me, "latency_ms"), z, sizeof z),
              num(get(pr, "throughput_tokens_per_s"), w, sizeof w),
              num(get(me, "throughput_tokens_per_s"), (char[64]){0}, 64),
              num(json_is_object(pm) ? get(pm, "total") : NULL, (char[64]){0}, 64),
              num(get(me, "peak_memory_bytes"), (char[64]){0}, 64));
}

char *mc_render(const arch *a, const json_t *report, const mc_info *info)
{
    strbuf b = {0};
    char t1[64], t2[64], t3[64], t4[64];
    const char *parent = info && info->parent ? info->parent : "unknown";
    strbuf_printf(&b, "# Compressed model (AutoCompress)\n\n");
    strbuf_printf(&b, "- **Parent:** ");
    md_code(&b, parent);
    strbuf_printf(&b, "\n");
    strbuf_printf(&b, "- **Class:** %s\n", info && info->model_class ? info->model_class : "not stated");
    strbuf_printf(&b, "- **Weights dtype:** %s\n", info && info->dtype ? info->dtype : "not stated");
    strbuf_printf(&b, "- **Formats:** %s\n", info && info->formats ? info->formats : "not stated");
    strbuf_printf(&b, "- **Tokenizer:** ");
    md_text(&b, info && info->tokenizer ? info->tokenizer : "not stated");   /* its note may name a file */
    strbuf_printf(&b, "\n");
    strbuf_printf(&b, "- **Parameters:** %lld\n", (long long)arch_params(a));
    const json_t *jid = get(report, "job_id"), *meth = get(report, "method");
    if (jid)
        strbuf_printf(&b, "- **Job:** %s\n", num(jid, t1, sizeof t1));
    if (meth)
        strbuf_printf(&b, "- **Method:** %s\n", num(meth, t1, sizeof t1));

    const json_t *target = get(report, "target");
    strbuf_printf(&b, "\n## Target\n\n");
    if (json_is_object(target)) {
        const json_t *wl = get(target, "workload");
        strbuf_printf(&b, "- device: %s\n- precision: %s\n", num(get(target, "device"), t1, sizeof t1),
                  num(get(target, "precision"), t2, sizeof t2));
        if (json_is_object(wl))
            strbuf_printf(&b, "- workload: batch %s, prompt %s tokens, output %s tokens\n",
                      num(get(wl, "batch_size"), t1, sizeof t1), num(get(wl, "prompt_tokens"), t2, sizeof t2),
                      num(get(wl, "output_tokens"), t3, sizeof t3));
    } else {
        strbuf_printf(&b, "No target recorded (exported outside a job).\n");
    }

    const json_t *limits = get(report, "limits");
    strbuf_printf(&b, "\n## Limits\n\n");
    if (json_is_array(limits) && json_array_size(limits) > 0) {
        strbuf_printf(&b, "| limit | value | predicted | measured | holds |\n|---|---|---|---|---|\n");
        size_t i;
        const json_t *l;
        json_array_foreach(limits, i, l)
            strbuf_printf(&b, "| %s | %s | %s | %s | %s |\n", num(get(l, "name"), t1, sizeof t1),
                      num(get(l, "limit"), t2, sizeof t2), num(get(l, "predicted"), t3, sizeof t3),
                      num(get(l, "measured"), t4, sizeof t4),
                      num(get(l, "holds"), (char[64]){0}, 64));
    } else {
        strbuf_printf(&b, "No limits recorded.\n");
    }

    strbuf_printf(&b, "\n## Architecture\n\n");
    strbuf_printf(&b, "hidden %d, head_dim %d, vocab %d, %d layers, rope_theta %g, norm_eps %g, %s embeddings\n\n",
              a->hidden_size, a->head_dim, a->vocab_size, a->n_layers, a->rope_theta, a->norm_eps,
              a->tie_word_embeddings ? "tied" : "untied");
    strbuf_printf(&b, "| layer | parent layer | query heads | KV heads | FFN width |\n|---|---|---|---|---|\n");
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        if (l->n_heads)
            strbuf_printf(&b, "| %d | %d | %d | %d | ", i, l->source_layer, l->n_heads, l->n_kv_heads);
        else
            strbuf_printf(&b, "| %d | %d | removed | removed | ", i, l->source_layer);
        if (l->ffn_dim)
            strbuf_printf(&b, "%d |\n", l->ffn_dim);
        else
            strbuf_printf(&b, "removed |\n");
    }

    strbuf_printf(&b, "\n## Costs\n\n");
    const json_t *par = get(report, "parent"), *res = get(report, "result");
    if (par || res) {
        strbuf_printf(&b, "| model | params | predicted latency ms | measured latency ms | predicted tok/s | "
                      "measured tok/s | predicted memory bytes | measured peak bytes |\n"
                      "|---|---|---|---|---|---|---|---|\n");
        costs_row(&b, "parent", par);
        costs_row(&b, "result", res);
    } else {
        strbuf_printf(&b, "No costs recorded (exported outside a job).\n");
    }
    const json_t *mem = get(report, "memory");
    if (json_is_object(mem)) {
        const json_t *it = get(mem, "itemized");
        strbuf_printf(&b, "\nMemory, itemized (bytes): weights %s, request cache %s, prefill workspace %s, "
                      "runtime buffers %s, total %s; naive weights+KV %s; measured peak %s.\n",
                  num(get(it, "weights"), t1, sizeof t1), num(get(it, "request_cache"), t2, sizeof t2),
                  num(get(it, "prefill_workspace"), t3, sizeof t3), num(get(it, "runtime_buffers"), t4, sizeof t4),
                  num(get(it, "total"), (char[64]){0}, 64), num(get(mem, "naive_weights_plus_kv"), (char[64]){0}, 64),
                  num(get(mem, "measured_peak"), (char[64]){0}, 64));
    }

    strbuf_printf(&b, "\n## Accuracy\n\n");
    const json_t *pacc = get(par, "accuracy"), *racc = get(res, "accuracy");
    if (json_is_object(racc) && json_object_size(racc) > 0) {
        strbuf_printf(&b, "| task | parent acc | parent acc_norm | result acc | result acc_norm | stderr | n |\n"
                      "|---|---|---|---|---|---|---|\n");
        const char *task;
        const json_t *r;
        json_object_foreach((json_t *)racc, task, r) {
            const json_t *p = get(pacc, task);
            strbuf_printf(&b, "| ");
            md_text(&b, task);
            strbuf_printf(&b, " | %s | %s | %s | %s | %s | %s |\n", num(get(p, "acc"), t1, sizeof t1),
                      num(get(p, "acc_norm"), t2, sizeof t2), num(get(r, "acc"), t3, sizeof t3),
                      num(get(r, "acc_norm"), t4, sizeof t4), num(get(r, "stderr"), (char[64]){0}, 64),
                      num(get(r, "n"), (char[64]){0}, 64));
        }
        strbuf_printf(&b, "\nAverage: parent %s, result %s.\n", num(get(par, "average"), t1, sizeof t1),
                  num(get(res, "average"), t2, sizeof t2));
    } else {
        strbuf_printf(&b, "Not measured.\n");
    }
    const json_t *ppl = get(res, "perplexity");
    if (json_is_object(ppl) && json_object_size(ppl) > 0) {
        const char *k;
        const json_t *v;
        strbuf_printf(&b, "\nPerplexity:");
        json_object_foreach((json_t *)ppl, k, v) {
            strbuf_printf(&b, " ");
            md_text(&b, k);
            strbuf_printf(&b, " parent %s, result %s;", num(get(get(par, "perplexity"), k), t1, sizeof t1),
                          num(v, t2, sizeof t2));
        }
        strbuf_printf(&b, "\n");
    }
    const json_t *se = get(report, "search"), *di = get(report, "distillation");
    if (se || di)
        strbuf_printf(&b, "\n## Budget\n\n- architecture-selection tokens: %s\n- distillation tokens: %s\n",
                  num(get(se, "selection_tokens"), t1, sizeof t1), num(get(di, "tokens"), t2, sizeof t2));
    strbuf_printf(&b, "\n## Loading\n\nThe weights are the parent's weights pruned to the architecture above "
                  "(and distilled when the job says so). Every file's sha-256 is listed in `SHA256SUMS` "
                  "(`sha256sum -c SHA256SUMS` checks them); `autocompress export --verify DIR` does the same.\n");
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

int mc_write(const char *path, const arch *a, const json_t *report, const mc_info *info,
             char *err, size_t errlen)
{
    char *text = mc_render(a, report, info);
    if (!text) {
        snprintf(err, errlen, "model card: out of memory");
        return -1;
    }
    char why[600];
    int rc = fio_write_atomic(path, text, strlen(text), why, sizeof why);
    free(text);
    if (rc < 0)
        snprintf(err, errlen, "model card: %s", why);
    return rc;
}
