/* compress/evaltasks.c — benchmark loaders and lm-evaluation-harness prompt templates.
 *
 * Every loader reads its file fully, validates each row (errors name file, line and
 * field) and builds items; a bad row fails the task, never the process. Templates are
 * those of lm-evaluation-harness v0.4 (arc_easy.yaml, piqa.yaml, hellaswag utils,
 * winogrande partial scoring, boolq.yaml, openbookqa.yaml, lambada_openai.yaml,
 * mmlu default template, sciq.yaml, wikitext with wikitext_detokenizer).
 */
#include "compress/evaltasks.h"

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
#include "storage/fetch.h"

const char *const ev_eight_tasks[] = {"arc_easy", "arc_challenge", "piqa", "hellaswag", "winogrande",
                                      "boolq", "openbookqa", "lambada_openai", NULL};
const char *const ev_builtin_tasks[] = {"arc_easy", "arc_challenge", "piqa", "hellaswag", "winogrande",
                                        "boolq", "openbookqa", "lambada_openai", "mmlu", "sciq", "wikitext2",
                                        NULL};

/* ---- small helpers ---------------------------------------------------------------- */

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void sb_puts(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* Returns the built string (ownership to caller) or NULL on OOM. */
static char *sb_take(sbuf *b)
{
    if (b->oom || !b->s) {
        if (!b->oom && !b->s)
            return strdup("");
        free(b->s);
        return NULL;
    }
    char *s = b->s;
    memset(b, 0, sizeof *b);
    return s;
}

static char *cat2(const char *a, const char *b)
{
    sbuf s = {0};
    sb_puts(&s, a);
    sb_puts(&s, b);
    return sb_take(&s);
}

int ev_utf8_len(const char *s)
{
    int n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if ((*p & 0xC0) != 0x80)
            n++;
    return n;
}

static void item_free(ev_item *it)
{
    free(it->ctx);
    for (int c = 0; c < it->n_choices; c++) {
        free(it->choices[c].ctx);
        free(it->choices[c].cont);
    }
    free(it->choices);
    memset(it, 0, sizeof *it);
}

void ev_task_free(ev_task *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n_items; i++)
        item_free(&t->items[i]);
    free(t->items);
    for (int g = 0; g < t->n_groups; g++)
        free(t->groups[g]);
    free(t->groups);
    memset(t, 0, sizeof *t);
}

typedef struct {
    ev_task *t;
    int cap;
} task_builder;

/* Append a new zeroed item with n choices; NULL on OOM. */
static ev_item *task_add(task_builder *tb, int n_choices, int line)
{
    ev_task *t = tb->t;
    if (t->n_items == tb->cap) {
        int nc = tb->cap ? tb->cap * 2 : 256;
        ev_item *ni = realloc(t->items, (size_t)nc * sizeof *ni);
        if (!ni)
            return NULL;
        t->items = ni;
        tb->cap = nc;
    }
    ev_item *it = &t->items[t->n_items];
    memset(it, 0, sizeof *it);
    it->choices = calloc((size_t)(n_choices > 0 ? n_choices : 1), sizeof *it->choices);
    if (!it->choices)
        return NULL;
    it->n_choices = n_choices;
    it->line = line;
    t->n_items++;
    return it;
}

/* Set choice c of it: continuation = delim + text; norm_len = characters of text. */
static int choice_set(ev_item *it, int c, const char *delim, const char *text)
{
    it->choices[c].cont = cat2(delim, text);
    it->choices[c].norm_len = ev_utf8_len(text);
    return it->choices[c].cont ? 0 : -1;
}

static void task_init(ev_task *t, const char *name, ev_kind kind, int acc_norm, const char *source)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->report_acc_norm = acc_norm;
    snprintf(t->source, sizeof t->source, "%s", source);
}

/* ---- JSONL ------------------------------------------------------------------------ */

typedef int (*jsonl_row_fn)(void *u, json_t *row, const char *path, int line, char *err, size_t errlen);

/* Call fn for every non-blank line of a JSONL file. Returns 0, or -1 with err set. */
static int jsonl_each(const char *path, jsonl_row_fn fn, void *u, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int lineno = 0, rc = 0;
    while ((n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        int blank = 1;
        for (ssize_t i = 0; i < n; i++)
            if (!isspace((unsigned char)line[i])) {
                blank = 0;
                break;
            }
        if (blank)
            continue;
        json_error_t je;
        json_t *row = json_loadb(line, (size_t)n, JSON_REJECT_DUPLICATES, &je);
        if (!row) {
            snprintf(err, errlen, "%s:%d: invalid JSON at column %d: %s", path, lineno, je.column, je.text);
            rc = -1;
            break;
        }
        if (!json_is_object(row)) {
            json_decref(row);
            snprintf(err, errlen, "%s:%d: expected a JSON object", path, lineno);
            rc = -1;
            break;
        }
        rc = fn(u, row, path, lineno, err, errlen);
        json_decref(row);
        if (rc)
            break;
    }
    if (!rc && ferror(f)) {
        snprintf(err, errlen, "%s: read error", path);
        rc = -1;
    }
    free(line);
    fclose(f);
    return rc;
}

/* Borrow string field `key` of obj (NUL-free check skipped: jansson strings may hold
 * NUL only with json_string_length; benchmark text never does). */
static const char *get_str(json_t *obj, const char *key, const char *path, int line, char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        snprintf(err, errlen, "%s:%d: field '%s': missing", path, line, key);
        return NULL;
    }
    if (!json_is_string(v)) {
        snprintf(err, errlen, "%s:%d: field '%s': expected a string", path, line, key);
        return NULL;
    }
    return json_string_value(v);
}

static int get_int(json_t *obj, const char *key, int lo, int hi, const char *path, int line, int *out,
                   char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        snprintf(err, errlen, "%s:%d: field '%s': missing", path, line, key);
        return -1;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        snprintf(err, errlen, "%s:%d: field '%s': expected an integer in %d..%d", path, line, key, lo, hi);
        return -1;
    }
    *out = (int)json_integer_value(v);
    return 0;
}

static int oom_at(const char *path, int line, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s:%d: out of memory", path, line);
    return -1;
}

/* ---- ARC and OpenBookQA ----------------------------------------------------------- */

typedef struct {
    task_builder tb;
    int obqa;   /* OpenBookQA: context is the bare stem */
} arc_ctx;

/* AI2 format: {"question": {"stem", "choices": [{"text","label"}]}, "answerKey"}. */
static int ai2_row(arc_ctx *a, json_t *row, const char *path, int line, char *err, size_t errlen)
{
    json_t *q = json_object_get(row, "question");
    if (!json_is_object(q)) {
        snprintf(err, errlen, "%s:%d: field 'question': expected an object", path, line);
        return -1;
    }
    const char *stem = get_str(q, "stem", path, line, err, errlen);
    const char *key = get_str(row, "answerKey", path, line, err, errlen);
    if (!stem || !key)
        return -1;
    json_t *ch = json_object_get(q, "choices");
    if (!json_is_array(ch) || json_array_size(ch) < 2 || json_array_size(ch) > 8) {
        snprintf(err, errlen, "%s:%d: field 'question.choices': expected an array of 2..8 choices", path, line);
        return -1;
    }
    int n = (int)json_array_size(ch), gold = -1;
    ev_item *it = task_add(&a->tb, n, line);
    if (!it)
        return oom_at(path, line, err, errlen);
    /* answerKey may carry stray spaces (OpenBookQA); labels "A".. or "1".. */
    char k[8];
    size_t kl = 0;
    for (const char *p = key; *p && kl + 1 < sizeof k; p++)
        if (!isspace((unsigned char)*p))
            k[kl++] = *p;
    k[kl] = '\0';
    for (int c = 0; c < n; c++) {
        json_t *e = json_array_get(ch, (size_t)c);
        char fld[48];
        snprintf(fld, sizeof fld, "question.choices[%d]", c);
        if (!json_is_object(e)) {
            snprintf(err, errlen, "%s:%d: field '%s': expected an object", path, line, fld);
            return -1;
        }
        const char *text = get_str(e, "text", path, line, err, errlen);
        const char *label = get_str(e, "label", path, line, err, errlen);
        if (!text || !label)
            return -1;
        if (!strcmp(label, k))
            gold = c;
        if (choice_set(it, c, " ", text))
            return oom_at(path, line, err, errlen);
    }
    if (gold < 0) {
        snprintf(err, errlen, "%s:%d: field 'answerKey': '%s' is not one of the choice labels", path, line, key);
        return -1;
    }
    it->gold = gold;
    if (a->obqa) {
        it->ctx = strdup(stem);          /* openbookqa.yaml: doc_to_text "question_stem" */
    } else {
        sbuf s = {0};                    /* arc_easy.yaml: "Question: {{question}}\nAnswer:" */
        sb_puts(&s, "Question: ");
        sb_puts(&s, stem);
        sb_puts(&s, "\nAnswer:");
        it->ctx = sb_take(&s);
    }
    return it->ctx ? 0 : oom_at(path, line, err, errlen);
}

/* llm-foundry format: {"query": "Question: ...", "choices": [str], "gold": int}. */
static int foundry_row(arc_ctx *a, json_t *row, const char *path, int line, char *err, size_t errlen)
{
    const char *query = get_str(row, "query", path, line, err, errlen);
    if (!query)
        return -1;
    json_t *ch = json_object_get(row, "choices");
    if (!json_is_array(ch) || json_array_size(ch) < 2 || json_array_size(ch) > 8) {
        snprintf(err, errlen, "%s:%d: field 'choices': expected an array of 2..8 strings", path, line);
        return -1;
    }
    int n = (int)json_array_size(ch), gold;
    if (get_int(row, "gold", 0, n - 1, path, line, &gold, err, errlen))
        return -1;
    ev_item *it = task_add(&a->tb, n, line);
    if (!it)
        return oom_at(path, line, err, errlen);
    it->gold = gold;
    for (int c = 0; c < n; c++) {
        json_t *e = json_array_get(ch, (size_t)c);
        if (!json_is_string(e)) {
            snprintf(err, errlen, "%s:%d: field 'choices[%d]': expected a string", path, line, c);
            return -1;
        }
        if (choice_set(it, c, " ", json_string_value(e)))
            return oom_at(path, line, err, errlen);
    }
    it->ctx = cat2(query, "\nAnswer:");
    return it->ctx ? 0 : oom_at(path, line, err, errlen);
}

static int arc_row(void *u, json_t *row, const char *path, int line, char *err, size_t errlen)
{
    arc_ctx *a = u;
    if (json_object_get(row, "query"))
        return foundry_row(a, row, path, line, err, errlen);
    return ai2_row(a, row, path, line, err, errlen);
}

static int load_ai2(const char *path, const char *name, int obqa, ev_task *t, char *err, size_t errlen)
{
    task_init(t, name, EV_KIND_MC, 1, path);
    arc_ctx a = {.tb = {.t = t}, .obqa = obqa};
    if (jsonl_each(path, arc_row, &a, err, errlen)) {
        ev_task_free(t);
        return -1;
    }
    return 0;
}

int ev_load_arc(const char *path, const char *name, ev_task *t, char *err, size_t errlen)
{
    return load_ai2(path, name, 0, t, err, errlen);
}

int ev_load_openbookqa(const char *path, ev_task *t, char *err, size_t errlen)
{
    return load_ai2(path, "openbookqa", 1, t, err, errlen);
}

/* ---- PIQA ------------------------------------------------------------------------- */

static int piqa_row(void *u, json_t *row, const char *path, int line, char *err, size_t errlen)
{
    task_builder *tb = u;
    const char *goal = get_str(row, "goal", path, line, err, errlen);
    const char *s1 = goal ? get_str(row, "sol1", path, line, err, errlen) : NULL;
    const char *s2 = s1 ? get_str(row, "sol2", path, line, err, errlen) : NULL;
    if (!s2)
        return -1;
    ev_item *it = task_add(tb, 2, line);
    if (!it)
        return oom_at(path, line, err, errlen);
    sbuf s = {0};
    sb_puts(&s, "Question: ");
    sb_puts(&s, goal);
    sb_puts(&s, "\nAnswer:");
    it->ctx = sb_take(&s);
    if (!it->ctx || choice_set(it, 0, " ", s1) || choice_set(it, 1, " ", s2))
        return oom_at(path, line, err, errlen);
    return 0;
}

int ev_load_piqa(const char *jsonl, const char *labels, ev_task *t, char *err, size_t errlen)
{
    task_init(t, "piqa", EV_KIND_MC, 1, jsonl);
    task_builder tb = {.t = t};
    if (jsonl_each(jsonl, piqa_row, &tb, err, errlen))
        goto fail;
    FILE *f = fopen(labels, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", labels, strerror(errno));
        goto fail;
    }
    char buf[64];
    int n = 0, bad = 0;
    while (fgets(buf, sizeof buf, f)) {
        size_t l = strlen(buf);
        while (l > 0 && (buf[l - 1] == '\n' || buf[l - 1] == '\r' || buf[l - 1] == ' '))
            buf[--l] = '\0';
        if (l == 0)
            continue;
        if (n >= t->n_items) {
            n++;
            continue;
        }
        if (strcmp(buf, "0") && strcmp(buf, "1")) {
            snprintf(err, errlen, "%s:%d: label: expected 0 or 1, got '%s'", labels, n + 1, buf);
            bad = 1;
            break;
        }
        t->items[n++].gold = buf[0] - '0';
    }
    fclose(f);
    if (bad)
        goto fail;
    if (n != t->n_items) {
        snprintf(err, errlen, "%s: %d labels for %d rows of %s", labels, n, t->n_items, jsonl);
        goto fail;
    }
    return 0;
fail:
    ev_task_free(t);
    return -1;
}

/* ---- HellaSwag (llama.cpp text format: 6 lines per task) ------------------------- */

int ev_load_hellaswag(const char *path, ev_task *t, char *err, size_t errlen)
{
    task_init(t, "hellaswag", EV_KIND_MC, 1, path);
    task_builder tb = {.t = t};
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char *lines[6] = {0};
    size_t caps[6] = {0};
    int lineno = 0, rc = 0;
    for (;;) {
        int got = 0, start = lineno + 1;
        for (; got < 6; got++) {
            ssize_t n = getline(&lines[got], &caps[got], f);
            if (n < 0)
                break;
            lineno++;
            while (n > 0 && (lines[got][n - 1] == '\n' || lines[got][n - 1] == '\r'))
                lines[got][--n] = '\0';
        }
        if (got == 0)
            break;
        if (got < 6) {
            snprintf(err, errlen, "%s:%d: truncated task: %d of 6 lines (context, label, 4 endings)", path, start, got);
            rc = -1;
            break;
        }
        const char *lab = lines[1];
        if (!(lab[0] >= '0' && lab[0] <= '3' && lab[1] == '\0')) {
            snprintf(err, errlen, "%s:%d: field 'label': expected 0..3, got '%.20s'", path, start + 1, lab);
            rc = -1;
            break;
        }
        ev_item *it = task_add(&tb, 4, start);
        if (!it || !(it->ctx = strdup(lines[0]))) {
            rc = oom_at(path, start, err, errlen);
            break;
        }
        it->gold = lab[0] - '0';
        for (int c = 0; c < 4 && !rc; c++)
            if (choice_set(it, c, " ", lines[2 + c]))
                rc = oom_at(path, start, err, errlen);
        if (rc)
            break;
    }
    for (int i = 0; i < 6; i++)
        free(lines[i]);
    fclose(f);
    if (rc)
        ev_task_free(t);
    return rc;
}

/* ---- WinoGrande (partial scoring) ------------------------------------------------- */

static int wino_row(void *u, json_t *row, const char *path, int line, char *err, size_t errlen)
{
    task_builder *tb = u;
    const char *opts[2];
    const char *cont;
    int gold;
    char *tmp_ctx[2] = {0};
    if (json_object_get(row, "context_options")) {
        /* llm-foundry: context_options [2], continuation, gold */
        json_t *co = json_object_get(row, "context_options");
        if (!json_is_array(co) || json_array_size(co) != 2 || !json_is_string(json_array_get(co, 0)) ||
            !json_is_string(json_array_get(co, 1))) {
            snprintf(err, errlen, "%s:%d: field 'context_options': expected an array of 2 strings", path, line);
            return -1;
        }
        opts[0] = json_string_value(json_array_get(co, 0));
        opts[1] = json_string_value(json_array_get(co, 1));
        if (!(cont = get_str(row, "continuation", path, line, err, errlen)) ||
            get_int(row, "gold", 0, 1, path, line, &gold, err, errlen))
            return -1;
    } else {
        /* original: sentence with "_", option1, option2, answer "1"/"2" */
        const char *sent = get_str(row, "sentence", path, line, err, errlen);
        const char *o1 = sent ? get_str(row, "option1", path, line, err, errlen) : NULL;
        const char *o2 = o1 ? get_str(row, "option2", path, line, err, errlen) : NULL;
        const char *ans = o2 ? get_str(row, "answer", path, line, err, errlen) : NULL;
        if (!ans)
            return -1;
        const char *us = strchr(sent, '_');
        if (!us) {
            snprintf(err, errlen, "%s:%d: field 'sentence': no '_' blank", path, line);
            return -1;
        }
        if (strcmp(ans, "1") && strcmp(ans, "2")) {
            snprintf(err, errlen, "%s:%d: field 'answer': expected \"1\" or \"2\"", path, line);
            return -1;
        }
        gold = ans[0] - '1';
        for (int k = 0; k < 2; k++) {
            sbuf s = {0};
            sb_add(&s, sent, (size_t)(us - sent));
            sb_puts(&s, k ? o2 : o1);
            tmp_ctx[k] = sb_take(&s);
        }
        opts[0] = tmp_ctx[0];
        opts[1] = tmp_ctx[1];
        cont = us + 1;
        while (isspace((unsigned char)*cont))
            cont++;
    }
    /* harness doc_to_target: sentence[idx+1:].strip(), joined with target_delimiter " " */
    size_t cl = strlen(cont);
    while (cl > 0 && isspace((unsigned char)cont[cl - 1]))
        cl--;
    while (cl > 0 && isspace((unsigned char)*cont)) {
        cont++;
        cl--;
    }
    ev_item *it = (opts[0] && opts[1]) ? task_add(tb, 2, line) : NULL;
    int rc = 0;
    if (!it) {
        rc = oom_at(path, line, err, errlen);
    } else {
        it->gold = gold;
        sbuf s = {0};
        sb_puts(&s, " ");
        sb_add(&s, cont, cl);
        char *c0 = sb_take(&s);
        for (int k = 0; k < 2 && !rc; k++) {
            it->choices[k].ctx = strdup(opts[k]);
            it->choices[k].cont = c0 ? strdup(c0) : NULL;
            it->choices[k].norm_len = c0 ? ev_utf8_len(c0 + 1) : 0;
            if (!it->choices[k].ctx || !it->choices[k].cont)
                rc = oom_at(path, line, err, errlen);
        }
        free(c0);
    }
    free(tmp_ctx[0]);
    free(tmp_ctx[1]);
    return rc;
}

int ev_load_winogrande(const char *path, ev_task *t, char *err, size_t errlen)
{
    task_init(t, "winogrande", EV_KIND_MC, 0, path);
    task_builder tb = {.t = t};
    if (jsonl_each(path, wino_row, &tb, err, errlen)) {
        ev_task_free(t);
        return -1;
    }
    return 0;
}

/* ---- BoolQ ------------------------------------------------------------------------ */

static int boolq_row(void *u, json_t *row, const char *path, int line, char *err, size_t errlen)
{
    task_builder *tb = u;
    const char *passage = get_str(row, "passage", path, line, err, errlen);
    const char *question = passage ? get_str(row, "question", path, line, err, errlen) : NULL;
    if (!question)
        return -1;
    json_t *ans = json_object_get(row, "answer");
    if (!json_is_boolean(ans)) {
        snprintf(err, errlen, "%s:%d: field 'answer': expected true or false", path, line);
        return -1;
    }
    ev_item *it = task_add(tb, 2, line);
    if (!it)
        return oom_at(path, line, err, errlen);
    sbuf s = {0};
    sb_puts(&s, passage);
    sb_puts(&s, "\nQuestion: ");
    sb_puts(&s, question);
    sb_puts(&s, "?\nAnswer:");
    it->ctx = sb_take(&s);
    it->gold = json_is_true(ans) ? 1 : 0;
    if (!it->ctx || choice_set(it, 0, " ", "no") || choice_set(it, 1, " ", "yes"))
        return oom_at(path, line, err, errlen);
    return 0;
}

int ev_load_boolq(const char *path, ev_task *t, char *err, size_t errlen)
{
    task_init(t, "boolq", EV_KIND_MC, 0, path);
    task_builder tb = {.t = t};
    if (jsonl_each(path, boolq_row, &tb, err, errlen)) {
        ev_task_free(t);
        return -1;
    }
    return 0;
}

/* ---- LAMBADA (OpenAI) ------------------------------------------------------------- */

static int lambada_row(void *u, json_t *row, const char *path, int line, char *err, size_t errlen)
{
    task_builder *tb = u;
    char *ctx = NULL, *cont = NULL;
    if (json_object_get(row, "text") && !json_object_get(row, "context")) {
        /* original: text; context = all but the last ' '-separated word */
        const char *text = get_str(row, "text", path, line, err, errlen);
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
        const char *c = get_str(row, "context", path, line, err, errlen);
        const char *w = c ? get_str(row, "continuation", path, line, err, errlen) : NULL;
        if (!w)
            return -1;
        size_t cl = strlen(c);
        if (cl > 0 && c[cl - 1] == ' ')
            cl--;                       /* the space belongs to the target " word" */
        ctx = strndup(c, cl);
        cont = cat2(" ", w[0] == ' ' ? w + 1 : w);
    }
    ev_item *it = task_add(tb, 1, line);
    if (!it || !ctx || !cont) {
        free(ctx);
        free(cont);
        return oom_at(path, line, err, errlen);
    }
    it->ctx = ctx;
    it->choices[0].cont = cont;
    it->choices[0].norm_len = ev_utf8_len(cont + 1);
    return 0;
}

int ev_load_lambada(const char *path, ev_task *t, char *err, size_t errlen)
{
    task_init(t, "lambada_openai", EV_KIND_LOGLIK, 0, path);
    task_builder tb = {.t = t};
    if (jsonl_each(path, lambada_row, &tb, err, errlen)) {
        ev_task_free(t);
        return -1;
    }
    return 0;
}

/* ---- MMLU ------------------------------------------------------------------------- */

int ev_mmlu_header(const char *subject, char *buf, size_t len)
{
    sbuf s = {0};
    sb_puts(&s, "The following are multiple choice questions (with answers) about ");
    for (const char *p = subject; *p; p++)
        sb_add(&s, *p == '_' ? " " : p, 1);
    sb_puts(&s, ".\n\n");
    char *h = sb_take(&s);
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
    sb_add(s, q, ql);
    static const char *const L[4] = {"\nA. ", "\nB. ", "\nC. ", "\nD. "};
    for (int k = 0; k < 4; k++) {
        sb_puts(s, L[k]);
        sb_puts(s, f[1 + k]);
    }
    sb_puts(s, "\nAnswer:");
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
    task_init(t, "mmlu", EV_KIND_MC, 0, mmlu_dir);
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
            sb_puts(&pre, hdr);
            for (int k = 0; k < n_fewshot; k++) {
                mmlu_question(&pre, dev.records[k].fields);
                sb_puts(&pre, " ");
                sb_puts(&pre, dev.records[k].fields[5]);
                sb_puts(&pre, "\n\n");
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
            ev_item *it = task_add(&tb, 4, r->line);
            if (!it) {
                rc = oom_at(path, r->line, err, errlen);
                break;
            }
            sbuf s = {0};
            if (pre.s)
                sb_add(&s, pre.s, pre.n);
            mmlu_question(&s, r->fields);
            it->ctx = sb_take(&s);
            it->gold = r->fields[5][0] - 'A';
            it->group = g;
            static const char *const letters[4] = {"A", "B", "C", "D"};
            for (int c = 0; c < 4 && !rc; c++)
                if (choice_set(it, c, " ", letters[c]))
                    rc = oom_at(path, r->line, err, errlen);
            if (!it->ctx && !rc)
                rc = oom_at(path, r->line, err, errlen);
        }
        if (pre.oom && !rc)
            rc = oom_at(path, 0, err, errlen);
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
    task_init(t, "sciq", EV_KIND_MC, 1, path);
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
        ev_item *it = task_add(&tb, mc ? 4 : 1, r->line);
        if (!it) {
            rc = oom_at(path, r->line, err, errlen);
            break;
        }
        /* sciq.yaml: "{{support.lstrip()}}\nQuestion: {{question}}\nAnswer:" */
        const char *sup = r->fields[col[2]];
        while (isspace((unsigned char)*sup))
            sup++;
        sbuf s = {0};
        sb_puts(&s, sup);
        sb_puts(&s, "\nQuestion: ");
        sb_puts(&s, r->fields[col[0]]);
        sb_puts(&s, "\nAnswer:");
        it->ctx = sb_take(&s);
        /* doc_to_choice [distractor1, distractor2, distractor3, correct_answer], target 3 */
        int c = 0;
        for (int k = 0; mc && k < 3 && !rc; k++)
            rc = choice_set(it, c++, " ", r->fields[dcol[k]]);
        if (!rc)
            rc = choice_set(it, c, " ", r->fields[col[1]]);
        it->gold = mc ? 3 : 0;
        if (rc || !it->ctx)
            rc = oom_at(path, r->line, err, errlen);
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
        sb_add(&s, p, (size_t)(q - p));
        sb_puts(&s, b);
        p = q + al;
    }
    sb_puts(&s, p);
    return sb_take(&s);
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
        return oom_at(path, line, err, errlen);
    if (doc->n == 0)
        return 0;
    char *d = ev_wikitext_detokenize(doc->s);
    doc->n = 0;
    if (!d)
        return oom_at(path, line, err, errlen);
    ev_item *it = task_add(tb, 1, line);
    if (!it) {
        free(d);
        return oom_at(path, line, err, errlen);
    }
    it->ctx = strdup("");
    it->choices[0].cont = d;
    it->choices[0].norm_len = ev_utf8_len(d);
    it->words = count_words(d);
    it->bytes = (int64_t)strlen(d);
    return it->ctx ? 0 : oom_at(path, line, err, errlen);
}

int ev_load_wikitext(const char *raw_path, ev_task *t, char *err, size_t errlen)
{
    task_init(t, "wikitext2", EV_KIND_ROLLING, 0, raw_path);
    task_builder tb = {.t = t};
    FILE *f = fopen(raw_path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", raw_path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int lineno = 0, doc_line = 1, rc = 0;
    sbuf doc = {0};
    while ((n = getline(&line, &cap, f)) >= 0 && !rc) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        int title = n >= 4 && !strncmp(line, " = ", 3) && strncmp(line, " = = ", 5) != 0;
        if (title) {
            rc = wikitext_add_doc(&tb, &doc, doc_line, raw_path, err, errlen);
            doc_line = lineno;
        }
        sb_add(&doc, line, (size_t)n);
        sb_puts(&doc, "\n");
    }
    if (!rc)
        rc = wikitext_add_doc(&tb, &doc, doc_line, raw_path, err, errlen);
    free(doc.s);
    free(line);
    fclose(f);
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
    const char *ctx = get_str(row, "context", path, line, err, errlen);
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
        const char *cont = get_str(row, "continuation", path, line, err, errlen);
        if (!cont)
            return -1;
        if (!*cont) {
            snprintf(err, errlen, "%s:%d: field 'continuation': empty", path, line);
            return -1;
        }
        ev_item *it = task_add(&g->tb, 1, line);
        if (!it || !(it->ctx = strdup(ctx)) || !(it->choices[0].cont = strdup(cont)))
            return oom_at(path, line, err, errlen);
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
    if (get_int(row, "gold", 0, n - 1, path, line, &gold, err, errlen))
        return -1;
    for (int c = 0; c < n; c++)
        if (!json_is_string(json_array_get(ch, (size_t)c)) || !*json_string_value(json_array_get(ch, (size_t)c))) {
            snprintf(err, errlen, "%s:%d: field 'choices[%d]': expected a non-empty string", path, line, c);
            return -1;
        }
    ev_item *it = task_add(&g->tb, n, line);
    if (!it || !(it->ctx = strdup(ctx)))
        return oom_at(path, line, err, errlen);
    it->gold = gold;
    for (int c = 0; c < n; c++)
        if (choice_set(it, c, "", json_string_value(json_array_get(ch, (size_t)c))))
            return oom_at(path, line, err, errlen);
    return 0;
}

int ev_load_jsonl(const char *path, const char *name, ev_task *t, char *err, size_t errlen)
{
    task_init(t, name, EV_KIND_MC, 1, path);
    jsonl_ctx g = {.tb = {.t = t}, .kind = -1};
    if (jsonl_each(path, generic_row, &g, err, errlen)) {
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

/* ---- by name ---------------------------------------------------------------------- */

int ev_task_load(const char *name, const char *data_dir, const ev_load_opts *o, ev_task *t, char *err,
                 size_t errlen)
{
    memset(t, 0, sizeof *t);
    int shots = o ? o->n_fewshot : -1;
    if (shots > 0 && strcmp(name, "mmlu")) {
        snprintf(err, errlen, "%s: few-shot is not available for this task in this build (no training split "
                 "in the data); use 0", name);
        return -1;
    }
    char p[1024], q[1024];
#define DATA(rel) (snprintf(p, sizeof p, "%s/%s", data_dir, rel), p)
    if (!strcmp(name, "arc_easy"))
        return ev_load_arc(DATA("eval/arc_easy/arc_easy_test.llmfoundry.shared.jsonl"), name, t, err, errlen);
    if (!strcmp(name, "arc_challenge"))
        return ev_load_arc(DATA("eval/arc_challenge/arc_challenge_test.llmfoundry.jsonl"), name, t, err, errlen);
    if (!strcmp(name, "piqa")) {
        snprintf(q, sizeof q, "%s/eval/piqa/valid-labels.lst", data_dir);
        return ev_load_piqa(DATA("eval/piqa/valid.jsonl"), q, t, err, errlen);
    }
    if (!strcmp(name, "hellaswag"))
        return ev_load_hellaswag(DATA("eval/hellaswag/hellaswag_val.shared.txt"), t, err, errlen);
    if (!strcmp(name, "winogrande"))
        return ev_load_winogrande(DATA("eval/winogrande/winogrande_dev.llmfoundry.jsonl"), t, err, errlen);
    if (!strcmp(name, "boolq"))
        return ev_load_boolq(DATA("eval/boolq/dev.jsonl"), t, err, errlen);
    if (!strcmp(name, "openbookqa"))
        return ev_load_openbookqa(DATA("eval/openbookqa/test.jsonl"), t, err, errlen);
    if (!strcmp(name, "lambada_openai") || !strcmp(name, "lambada"))
        return ev_load_lambada(DATA("eval/lambada/lambada_openai_test.llmfoundry.jsonl"), t, err, errlen);
    if (!strcmp(name, "mmlu"))
        return ev_load_mmlu(DATA("eval/mmlu"), shots < 0 ? 5 : shots, o ? o->subjects : NULL, t, err, errlen);
    if (!strcmp(name, "sciq"))
        return ev_load_sciq(DATA("eval/sciq/sciq_test_support.csv"), t, err, errlen);
    if (!strcmp(name, "wikitext2") || !strcmp(name, "wikitext"))
        return ev_load_wikitext(DATA("text/wikitext-2-raw/wiki.test.raw"), t, err, errlen);
#undef DATA
    snprintf(err, errlen, "unknown task '%s' (built-in: arc_easy arc_challenge piqa hellaswag winogrande boolq "
             "openbookqa lambada_openai mmlu sciq wikitext2; or a .jsonl file)", name);
    return -1;
}

/* ---- sampling --------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int ev_task_limit(ev_task *t, int limit, uint64_t seed)
{
    if (limit <= 0 || t->n_items == 0)
        return t->n_items;
    int ng = t->n_groups > 0 ? t->n_groups : 1;
    char *keep = calloc((size_t)t->n_items, 1);
    int *idx = malloc((size_t)t->n_items * sizeof *idx);
    if (!keep || !idx) {
        free(keep);
        free(idx);
        return t->n_items;   /* nothing dropped on OOM: more items, never wrong ones */
    }
    for (int g = 0; g < ng; g++) {
        int n = 0;
        for (int i = 0; i < t->n_items; i++)
            if (t->n_groups == 0 || t->items[i].group == g)
                idx[n++] = i;
        uint64_t s = seed ^ (0x51ED270B27AD1F2DULL * (uint64_t)(g + 1));
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(splitmix64(&s) % (uint64_t)(i + 1));
            int tmp = idx[i];
            idx[i] = idx[j];
            idx[j] = tmp;
        }
        int k = n < limit ? n : limit;
        qsort(idx, (size_t)k, sizeof *idx, cmp_int);
        for (int i = 0; i < k; i++)
            keep[idx[i]] = 1;
    }
    int w = 0;
    for (int i = 0; i < t->n_items; i++) {
        if (keep[i])
            t->items[w++] = t->items[i];
        else
            item_free(&t->items[i]);
    }
    t->n_items = w;
    free(keep);
    free(idx);
    return w;
}

/* ---- fetch by URL ----------------------------------------------------------------- */

int ev_fetch_url(const char *url, const char *sha256_hex, size_t max_bytes, const char *out_path, char *err,
                 size_t errlen)
{
    if (!sha256_hex || strlen(sha256_hex) != 64 || strspn(sha256_hex, "0123456789abcdefABCDEF") != 64) {
        snprintf(err, errlen, "%s: a sha256 (64 hex digits) is required to fetch a task by URL", url);
        return -1;
    }
    /* file:// too: the command line reads local files anyway; the evaluate stage refuses
     * every scheme but http(s) before it gets here */
    fetch_opts o = {.flags = FETCH_ALLOW_HTTP | FETCH_ALLOW_FILE};
    int64_t max = max_bytes > (size_t)INT64_MAX ? INT64_MAX : (int64_t)max_bytes;
    if (fetch_url(url, sha256_hex, max, out_path, &o, err, errlen) == FETCH_OK)
        return 0;
    char part[4200];
    if (snprintf(part, sizeof part, "%s.part", out_path) < (int)sizeof part)
        unlink(part);   /* tasks are small: no resume, nothing left behind */
    return -1;
}
