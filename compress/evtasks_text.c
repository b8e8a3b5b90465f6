/* compress/evtasks_text.c — the benchmarks scored on a continuation or a text, and the
 * user's own tasks: LAMBADA (OpenAI), MMLU (5-shot from dev, the harness's template),
 * SciQ, WikiText-2 (rolling perplexity with the harness's detokenizer) and the generic
 * JSONL task format of docs/tasks.md.
 */
#include "compress/evaltasks.h"
#include "compress/evaltasks_internal.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "compress/csv.h"

/* ---- LAMBADA (OpenAI) ------------------------------------------------------------- */

static int lambada_row(void *u, json_t *row, const char *path, int line, char *err, size_t errlen)
{
    task_builder *tb = u;
    char *ctx = NULL, *cont = NULL;
    if (json_object_get(row, "text") && !json_object_get(row, "context")) {
        /* original: text; context = all but the last ' '-separated word */
        const char *text = evt_get_str(row, "text", path, line, err, errlen);
        if (!text)
            return -1;
        const char *sp = strrchr(text, ' ');
        if (!sp) {
            snprintf(err, errlen, "%s:%d: field 'text': no space-separated last word", path, line);
            return -1;
        }
        ctx = strndup(text, (size_t)(sp - text));
        cont = strdup(sp);
    } else {
        const char *c = evt_get_str(row, "context", path, line, err, errlen);
        const char *w = c ? evt_get_str(row, "continuation", path, line, err, errlen) : NULL;
        if (!w)
            return -1;
        size_t cl = strlen(c);
        if (cl > 0 && c[cl - 1] == ' ')
            cl--;                       /* the space belongs to the target " word" */
        ctx = strndup(c, cl);
        cont = evt_cat2(" ", w[0] == ' ' ? w + 1 : w);
    }
    ev_item *it = evt_task_add(tb, 1, line);
    if (!it || !ctx || !cont) {
        free(ctx);
        free(cont);
        return evt_oom_at(path, line, err, errlen);
    }
    it->ctx = ctx;
    it->choices[0].cont = cont;
    it->choices[0].norm_len = ev_utf8_len(cont + 1);
    return 0;
}

int ev_load_lambada(const char *path, ev_task *t, char *err, size_t errlen)
{
    evt_task_init(t, "lambada_openai", EV_KIND_LOGLIK, 0, path);
    task_builder tb = {.t = t};
    if (evt_jsonl_each(path, lambada_row, &tb, err, errlen)) {
        ev_task_free(t);
        return -1;
    }
    return 0;
}

/* ---- MMLU ------------------------------------------------------------------------- */

int ev_mmlu_header(const char *subject, char *buf, size_t len)
{
    sbuf s = {0};
    evt_sb_puts(&s, "The following are multiple choice questions (with answers) about ");
    for (const char *p = subject; *p; p++)
        evt_sb_add(&s, *p == '_' ? " " : p, 1);
    evt_sb_puts(&s, ".\n\n");
    char *h = evt_sb_take(&s);
    if (!h)
        return -1;
    int rc = strlen(h) + 1 <= len ? 0 : -1;
    if (!rc)
        memcpy(buf, h, strlen(h) + 1);
    free(h);
    return rc;
}

/* "{q.strip()}\nA. {a}\nB. {b}\nC. {c}\nD. {d}\nAnswer:" */
static void mmlu_question(sbuf *s, char **f)
{
    const char *q = f[0];
    size_t ql = strlen(q);
    while (ql > 0 && isspace((unsigned char)*q)) {
        q++;
        ql--;
    }
    while (ql > 0 && isspace((unsigned char)q[ql - 1]))
        ql--;
    evt_sb_add(s, q, ql);
    static const char *const L[4] = {"\nA. ", "\nB. ", "\nC. ", "\nD. "};
    for (int k = 0; k < 4; k++) {
        evt_sb_puts(s, L[k]);
        evt_sb_puts(s, f[1 + k]);
    }
    evt_sb_puts(s, "\nAnswer:");
}

static int mmlu_check(const char *path, const csv_record *r, char *err, size_t errlen)
{
    if (r->n_fields != 6) {
        snprintf(err, errlen, "%s:%d: expected 6 fields (question, A, B, C, D, answer), got %d", path, r->line,
                 r->n_fields);
        return -1;
    }
    const char *a = r->fields[5];
    if (!(a[0] >= 'A' && a[0] <= 'D' && a[1] == '\0')) {
        snprintf(err, errlen, "%s:%d: field 'answer' (column 6): expected A..D, got '%.20s'", path, r->line, a);
        return -1;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int subject_wanted(const char *subjects, const char *s)
{
    if (!subjects || !*subjects)
        return 1;
    size_t n = strlen(s);
    for (const char *p = subjects; *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !strncmp(p, s, n))
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

int ev_load_mmlu(const char *mmlu_dir, int n_fewshot, const char *subjects, ev_task *t, char *err, size_t errlen)
{
    evt_task_init(t, "mmlu", EV_KIND_MC, 0, mmlu_dir);
    t->n_fewshot = n_fewshot;
    if (n_fewshot < 0 || n_fewshot > 5) {
        snprintf(err, errlen, "mmlu: num_fewshot %d: the dev split holds 5 examples per subject", n_fewshot);
        return -1;
    }
    char dpath[1024];
    snprintf(dpath, sizeof dpath, "%s/test", mmlu_dir);
    DIR *d = opendir(dpath);
    if (!d) {
        snprintf(err, errlen, "%s: %s", dpath, strerror(errno));
        return -1;
    }
    char **subs = NULL;
    int ns = 0, cap = 0, rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l <= 9 || strcmp(de->d_name + l - 9, "_test.csv"))
            continue;
        char *s = strndup(de->d_name, l - 9);
        if (!s || (ns == cap && !(cap = cap ? cap * 2 : 64, subs = realloc(subs, (size_t)cap * sizeof *subs)))) {
            free(s);
            rc = -1;
            snprintf(err, errlen, "%s: out of memory", dpath);
            break;
        }
        if (!subject_wanted(subjects, s)) {
            free(s);
            continue;
        }
        subs[ns++] = s;
    }
    closedir(d);
    if (rc) {
        for (int i = 0; i < ns; i++)
            free(subs[i]);
        free(subs);
        return -1;
    }
    if (ns == 0) {
        free(subs);
        snprintf(err, errlen, "%s: no <subject>_test.csv files%s%s", dpath, subjects ? " matching " : "",
                 subjects ? subjects : "");
        return -1;
    }
    qsort(subs, (size_t)ns, sizeof *subs, cmp_str);
    t->groups = subs;
    t->n_groups = ns;
    task_builder tb = {.t = t};
    for (int g = 0; g < ns && !rc; g++) {
        char path[1200];
        csv_table dev = {0}, test = {0};
        snprintf(path, sizeof path, "%s/dev/%s_dev.csv", mmlu_dir, subs[g]);
        if (n_fewshot > 0 && csv_parse_file(path, &dev, err, errlen)) {
            rc = -1;
            break;
        }
        for (int i = 0; i < dev.n_records && !rc; i++)
            rc = mmlu_check(path, &dev.records[i], err, errlen);
        if (!rc && dev.n_records < n_fewshot) {
            snprintf(err, errlen, "%s: %d rows, %d few-shot examples asked", path, dev.n_records, n_fewshot);
            rc = -1;
        }
        /* the shared prefix: header + few-shot examples */
        sbuf pre = {0};
        char hdr[512];
        if (!rc && ev_mmlu_header(subs[g], hdr, sizeof hdr)) {
            snprintf(err, errlen, "mmlu: subject name too long: %s", subs[g]);
            rc = -1;
        }
        if (!rc) {
            evt_sb_puts(&pre, hdr);
            for (int k = 0; k < n_fewshot; k++) {
                mmlu_question(&pre, dev.records[k].fields);
                evt_sb_puts(&pre, " ");
                evt_sb_puts(&pre, dev.records[k].fields[5]);
                evt_sb_puts(&pre, "\n\n");
            }
        }
        csv_free(&dev);
        snprintf(path, sizeof path, "%s/test/%s_test.csv", mmlu_dir, subs[g]);
        if (!rc && csv_parse_file(path, &test, err, errlen))
            rc = -1;
        for (int i = 0; i < test.n_records && !rc; i++) {
            csv_record *r = &test.records[i];
            if ((rc = mmlu_check(path, r, err, errlen)))
                break;
            ev_item *it = evt_task_add(&tb, 4, r->line);
            if (!it) {
                rc = evt_oom_at(path, r->line, err, errlen);
                break;
            }
            sbuf s = {0};
            if (pre.s)
                evt_sb_add(&s, pre.s, pre.n);
            mmlu_question(&s, r->fields);
            it->ctx = evt_sb_take(&s);
            it->gold = r->fields[5][0] - 'A';
            it->group = g;
            static const char *const letters[4] = {"A", "B", "C", "D"};
            for (int c = 0; c < 4 && !rc; c++)
                if (evt_choice_set(it, c, " ", letters[c]))
                    rc = evt_oom_at(path, r->line, err, errlen);
            if (!it->ctx && !rc)
                rc = evt_oom_at(path, r->line, err, errlen);
        }
        if (pre.oom && !rc)
            rc = evt_oom_at(path, 0, err, errlen);
        free(pre.s);
        csv_free(&test);
    }
    if (rc)
        ev_task_free(t);
    return rc;
}

/* ---- SciQ ------------------------------------------------------------------------- */

/* Column of the header named name, or -1. */
static int csv_column(const csv_record *hdr, const char *name)
{
    for (int c = 0; c < hdr->n_fields; c++)
        if (!strcmp(hdr->fields[c], name))
            return c;
    return -1;
}

int ev_load_sciq(const char *path, ev_task *t, char *err, size_t errlen)
{
    evt_task_init(t, "sciq", EV_KIND_MC, 1, path);
    csv_table tab = {0};
    if (csv_parse_file(path, &tab, err, errlen))
        return -1;
    int rc = 0;
    if (tab.n_records == 0) {
        snprintf(err, errlen, "%s: empty (expected a header row)", path);
        rc = -1;
        goto out;
    }
    const csv_record *hdr = &tab.records[0];
    for (int a = 0; a < hdr->n_fields && !rc; a++)
        for (int b = a + 1; b < hdr->n_fields; b++)
            if (!strcmp(hdr->fields[a], hdr->fields[b])) {
                snprintf(err, errlen, "%s:%d: header: column '%s' twice", path, hdr->line, hdr->fields[a]);
                rc = -1;
                break;
            }
    static const char *const need[] = {"question", "correct_answer", "support"};
    static const char *const dnames[] = {"distractor1", "distractor2", "distractor3"};
    int col[3], dcol[3], nd = 0;
    for (int k = 0; k < 3 && !rc; k++)
        if ((col[k] = csv_column(hdr, need[k])) < 0) {
            snprintf(err, errlen, "%s:%d: header: no '%s' column (need question, correct_answer, support)", path,
                     hdr->line, need[k]);
            rc = -1;
        }
    for (int k = 0; k < 3 && !rc; k++)
        nd += (dcol[k] = csv_column(hdr, dnames[k])) >= 0;
    if (!rc && nd != 0 && nd != 3)
        for (int k = 0; k < 3 && !rc; k++)
            if (dcol[k] < 0) {
                snprintf(err, errlen, "%s:%d: header: no '%s' column (all three distractors, or none)", path,
                         hdr->line, dnames[k]);
                rc = -1;
            }
    if (rc)
        goto out;
    int mc = nd == 3;
    if (!mc) {
        t->kind = EV_KIND_LOGLIK;   /* the gold answer alone: greedy acc and perplexity */
        t->report_acc_norm = 0;
    }
    task_builder tb = {.t = t};
    for (int i = 1; i < tab.n_records && !rc; i++) {
        const csv_record *r = &tab.records[i];
        if (r->n_fields != hdr->n_fields) {
            snprintf(err, errlen, "%s:%d: %d fields, the header has %d", path, r->line, r->n_fields, hdr->n_fields);
            rc = -1;
            break;
        }
        for (int k = 0; k < 2 && !rc; k++)   /* support may be empty, as in the release */
            if (!*r->fields[col[k]]) {
                snprintf(err, errlen, "%s:%d: field '%s': empty", path, r->line, need[k]);
                rc = -1;
            }
        for (int k = 0; k < 3 && mc && !rc; k++)
            if (!*r->fields[dcol[k]]) {
                snprintf(err, errlen, "%s:%d: field '%s': empty", path, r->line, dnames[k]);
                rc = -1;
            }
        if (rc)
            break;
        ev_item *it = evt_task_add(&tb, mc ? 4 : 1, r->line);
        if (!it) {
            rc = evt_oom_at(path, r->line, err, errlen);
            break;
        }
        /* sciq.yaml: "{{support.lstrip()}}\nQuestion: {{question}}\nAnswer:" */
        const char *sup = r->fields[col[2]];
        while (isspace((unsigned char)*sup))
            sup++;
        sbuf s = {0};
        evt_sb_puts(&s, sup);
        evt_sb_puts(&s, "\nQuestion: ");
        evt_sb_puts(&s, r->fields[col[0]]);
        evt_sb_puts(&s, "\nAnswer:");
        it->ctx = evt_sb_take(&s);
        /* doc_to_choice [distractor1, distractor2, distractor3, correct_answer], target 3 */
        int c = 0;
        for (int k = 0; mc && k < 3 && !rc; k++)
            rc = evt_choice_set(it, c++, " ", r->fields[dcol[k]]);
        if (!rc)
            rc = evt_choice_set(it, c, " ", r->fields[col[1]]);
        it->gold = mc ? 3 : 0;
        if (rc || !it->ctx)
            rc = evt_oom_at(path, r->line, err, errlen);
    }
    if (!rc && t->n_items == 0) {
        snprintf(err, errlen, "%s: no rows after the header", path);
        rc = -1;
    }
out:
    csv_free(&tab);
    if (rc)
        ev_task_free(t);
    return rc;
}

/* ---- WikiText-2 ------------------------------------------------------------------- */

/* One regex substitution (global). Returns a new string or NULL. */
static char *re_sub(const char *pattern, const char *repl, char *in)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
    if (!re)
        return NULL;
    size_t inlen = strlen(in), outlen = inlen * 2 + 64;
    char *out = malloc(outlen);
    int rc = -1;
    for (int attempt = 0; out && attempt < 2; attempt++) {
        PCRE2_SIZE ol = outlen;
        rc = pcre2_substitute(re, (PCRE2_SPTR)in, inlen, 0,
                              PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_OVERFLOW_LENGTH, NULL, NULL,
                              (PCRE2_SPTR)repl, PCRE2_ZERO_TERMINATED, (PCRE2_UCHAR *)out, &ol);
        if (rc != PCRE2_ERROR_NOMEMORY)
            break;
        free(out);
        outlen = ol + 1;
        out = malloc(outlen);
    }
    pcre2_code_free(re);
    if (rc < 0) {
        free(out);
        return NULL;
    }
    return out;
}

/* Replace every occurrence of a with b (literal). Returns a new string or NULL. */
static char *str_replace_all(const char *in, const char *a, const char *b)
{
    sbuf s = {0};
    size_t al = strlen(a);
    const char *p = in, *q;
    while ((q = strstr(p, a))) {
        evt_sb_add(&s, p, (size_t)(q - p));
        evt_sb_puts(&s, b);
        p = q + al;
    }
    evt_sb_puts(&s, p);
    return evt_sb_take(&s);
}

char *ev_wikitext_detokenize(const char *text)
{
    /* lm-eval tasks/wikitext/preprocess_wikitext.py, in order */
    static const struct {
        int regex;
        const char *a, *b;
    } steps[] = {
        {0, "s '", "s'"},
        {1, "/' [0-9]/", "/'[0-9]/"},
        {0, " @-@ ", "-"},
        {0, " @,@ ", ","},
        {0, " @.@ ", "."},
        {0, " : ", ": "},
        {0, " ; ", "; "},
        {0, " . ", ". "},
        {0, " ! ", "! "},
        {0, " ? ", "? "},
        {0, " , ", ", "},
        {1, "\\(\\s*([^\\)]*?)\\s*\\)", "($1)"},
        {1, "\\[\\s*([^\\]]*?)\\s*\\]", "[$1]"},
        {1, "{\\s*([^}]*?)\\s*}", "{$1}"},
        {1, "\\\"\\s*([^\\\"]*?)\\s*\\\"", "\"$1\""},
        {1, "'\\s*([^']*?)\\s*'", "'$1'"},
        {0, "= = = =", "===="},
        {0, "= = =", "==="},
        {0, "= =", "=="},
        {0, " \xc2\xb0 ", "\xc2\xb0"},
        {0, " \n", "\n"},
        {0, "\n ", "\n"},
        {0, " N ", " 1 "},
        {0, " 's", "'s"},
    };
    char *cur = strdup(text);
    for (size_t i = 0; cur && i < sizeof steps / sizeof steps[0]; i++) {
        char *next = steps[i].regex ? re_sub(steps[i].a, steps[i].b, cur) : str_replace_all(cur, steps[i].a, steps[i].b);
        free(cur);
        cur = next;
    }
    return cur;
}

/* Words as the harness counts them: len(re.split(r"\s+", doc)). */
static int64_t count_words(const char *s)
{
    int64_t n = 1;
    int in_space = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int sp = *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\f' || *p == '\v';
        if (sp && !in_space)
            n++;
        in_space = sp;
    }
    return n;
}

static int wikitext_add_doc(task_builder *tb, sbuf *doc, int line, const char *path, char *err, size_t errlen)
{
    if (doc->oom)
        return evt_oom_at(path, line, err, errlen);
    if (doc->n == 0)
        return 0;
    char *d = ev_wikitext_detokenize(doc->s);
    doc->n = 0;
    if (!d)
        return evt_oom_at(path, line, err, errlen);
    ev_item *it = evt_task_add(tb, 1, line);
    if (!it) {
        free(d);
        return evt_oom_at(path, line, err, errlen);
    }
    it->ctx = strdup("");
    it->choices[0].cont = d;
    it->choices[0].norm_len = ev_utf8_len(d);
    it->words = count_words(d);
    it->bytes = (int64_t)strlen(d);
    return it->ctx ? 0 : evt_oom_at(path, line, err, errlen);
}

typedef struct {
    task_builder tb;
    sbuf doc;                   /* the document being read */
    int doc_line;               /* the line it starts on */
    const char *path;
} wikitext_reader;

/* A title line (" = Title = ", not a " = = section") ends the document before it; every
 * line belongs to the current one. */
static int wikitext_line(void *u, char *line, size_t n, int lineno, char *err, size_t errlen)
{
    wikitext_reader *w = u;
    int rc = 0;
    if (n >= 4 && !strncmp(line, " = ", 3) && strncmp(line, " = = ", 5) != 0) {
        rc = wikitext_add_doc(&w->tb, &w->doc, w->doc_line, w->path, err, errlen);
        w->doc_line = lineno;
    }
    evt_sb_add(&w->doc, line, n);
    evt_sb_puts(&w->doc, "\n");
    return rc;
}

int ev_load_wikitext(const char *raw_path, ev_task *t, char *err, size_t errlen)
{
    evt_task_init(t, "wikitext2", EV_KIND_ROLLING, 0, raw_path);
    wikitext_reader w = {.tb = {.t = t}, .doc_line = 1, .path = raw_path};
    int rc = evt_lines_each(raw_path, wikitext_line, &w, err, errlen);
    if (!rc)
        rc = wikitext_add_doc(&w.tb, &w.doc, w.doc_line, raw_path, err, errlen);
    free(w.doc.s);
    if (!rc && t->n_items == 0) {
        snprintf(err, errlen, "%s: no documents", raw_path);
        rc = -1;
    }
    if (rc)
        ev_task_free(t);
    return rc;
}

/* ---- generic JSONL ---------------------------------------------------------------- */

typedef struct {
    task_builder tb;
    int kind;   /* -1 unknown yet */
} jsonl_ctx;

static int generic_row(void *u, json_t *row, const char *path, int line, char *err, size_t errlen)
{
    jsonl_ctx *g = u;
    const char *key;
    json_t *v;
    json_object_foreach(row, key, v) {
        if (strcmp(key, "context") && strcmp(key, "choices") && strcmp(key, "gold") && strcmp(key, "continuation")) {
            snprintf(err, errlen, "%s:%d: field '%s': unknown field (allowed: context, choices, gold, continuation)",
                     path, line, key);
            return -1;
        }
    }
    const char *ctx = evt_get_str(row, "context", path, line, err, errlen);
    if (!ctx)
        return -1;
    int kind = json_object_get(row, "choices") ? EV_KIND_MC : EV_KIND_LOGLIK;
    if (g->kind >= 0 && kind != g->kind) {
        snprintf(err, errlen, "%s:%d: field '%s': this file's first item is %s, this one is not", path, line,
                 kind == EV_KIND_MC ? "choices" : "continuation",
                 g->kind == EV_KIND_MC ? "multiple choice" : "a loglikelihood item");
        return -1;
    }
    g->kind = kind;
    if (kind == EV_KIND_LOGLIK) {
        if (json_object_get(row, "gold")) {
            snprintf(err, errlen, "%s:%d: field 'gold': only with 'choices'", path, line);
            return -1;
        }
        const char *cont = evt_get_str(row, "continuation", path, line, err, errlen);
        if (!cont)
            return -1;
        if (!*cont) {
            snprintf(err, errlen, "%s:%d: field 'continuation': empty", path, line);
            return -1;
        }
        ev_item *it = evt_task_add(&g->tb, 1, line);
        if (!it || !(it->ctx = strdup(ctx)) || !(it->choices[0].cont = strdup(cont)))
            return evt_oom_at(path, line, err, errlen);
        it->choices[0].norm_len = ev_utf8_len(cont);
        return 0;
    }
    if (json_object_get(row, "continuation")) {
        snprintf(err, errlen, "%s:%d: field 'continuation': not allowed with 'choices'", path, line);
        return -1;
    }
    json_t *ch = json_object_get(row, "choices");
    if (!json_is_array(ch) || json_array_size(ch) < 2 || json_array_size(ch) > 64) {
        snprintf(err, errlen, "%s:%d: field 'choices': expected an array of 2..64 strings", path, line);
        return -1;
    }
    int n = (int)json_array_size(ch), gold;
    if (evt_get_int(row, "gold", 0, n - 1, path, line, &gold, err, errlen))
        return -1;
    for (int c = 0; c < n; c++)
        if (!json_is_string(json_array_get(ch, (size_t)c)) || !*json_string_value(json_array_get(ch, (size_t)c))) {
            snprintf(err, errlen, "%s:%d: field 'choices[%d]': expected a non-empty string", path, line, c);
            return -1;
        }
    ev_item *it = evt_task_add(&g->tb, n, line);
    if (!it || !(it->ctx = strdup(ctx)))
        return evt_oom_at(path, line, err, errlen);
    it->gold = gold;
    for (int c = 0; c < n; c++) {
        /* a leading space is the harness's target delimiter: acc_norm counts the text after it */
        const char *s = json_string_value(json_array_get(ch, (size_t)c));
        int delim = s[0] == ' ' && s[1];
        if (evt_choice_set(it, c, delim ? " " : "", s + delim))
            return evt_oom_at(path, line, err, errlen);
    }
    return 0;
}

int ev_load_jsonl(const char *path, const char *name, ev_task *t, char *err, size_t errlen)
{
    evt_task_init(t, name, EV_KIND_MC, 1, path);
    jsonl_ctx g = {.tb = {.t = t}, .kind = -1};
    if (evt_jsonl_each(path, generic_row, &g, err, errlen)) {
        ev_task_free(t);
        return -1;
    }
    if (t->n_items == 0) {
        snprintf(err, errlen, "%s: no items", path);
        ev_task_free(t);
        return -1;
    }
    t->kind = (ev_kind)g.kind;
    t->report_acc_norm = g.kind == EV_KIND_MC;
    return 0;
}

