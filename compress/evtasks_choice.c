/* compress/evtasks_choice.c — the multiple-choice benchmarks in their released formats,
 * with lm-evaluation-harness v0.4 templates: ARC (AI2 and foundry JSONL), OpenBookQA,
 * PIQA (JSONL + labels), HellaSwag (llama.cpp's 6-line text), WinoGrande (partial
 * scoring) and BoolQ. Each row is validated; errors name file, line and field.
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
    const char *stem = evt_get_str(q, "stem", path, line, err, errlen);
    const char *key = evt_get_str(row, "answerKey", path, line, err, errlen);
    if (!stem || !key)
        return -1;
    json_t *ch = json_object_get(q, "choices");
    if (!json_is_array(ch) || json_array_size(ch) < 2 || json_array_size(ch) > 8) {
        snprintf(err, errlen, "%s:%d: field 'question.choices': expected an array of 2..8 choices", path, line);
        return -1;
    }
    int n = (int)json_array_size(ch), gold = -1;
    ev_item *it = evt_task_add(&a->tb, n, line);
    if (!it)
        return evt_oom_at(path, line, err, errlen);
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
        const char *text = evt_get_str(e, "text", path, line, err, errlen);
        const char *label = evt_get_str(e, "label", path, line, err, errlen);
        if (!text || !label)
            return -1;
        if (!strcmp(label, k))
            gold = c;
        if (evt_choice_set(it, c, " ", text))
            return evt_oom_at(path, line, err, errlen);
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
        evt_sb_puts(&s, "Question: ");
        evt_sb_puts(&s, stem);
        evt_sb_puts(&s, "\nAnswer:");
        it->ctx = evt_sb_take(&s);
    }
    return it->ctx ? 0 : evt_oom_at(path, line, err, errlen);
}

/* llm-foundry format: {"query": "Question: ...", "choices": [str], "gold": int}. */
static int foundry_row(arc_ctx *a, json_t *row, const char *path, int line, char *err, size_t errlen)
{
    const char *query = evt_get_str(row, "query", path, line, err, errlen);
    if (!query)
        return -1;
    json_t *ch = json_object_get(row, "choices");
    if (!json_is_array(ch) || json_array_size(ch) < 2 || json_array_size(ch) > 8) {
        snprintf(err, errlen, "%s:%d: field 'choices': expected an array of 2..8 strings", path, line);
        return -1;
    }
    int n = (int)json_array_size(ch), gold;
    if (evt_get_int(row, "gold", 0, n - 1, path, line, &gold, err, errlen))
        return -1;
    ev_item *it = evt_task_add(&a->tb, n, line);
    if (!it)
        return evt_oom_at(path, line, err, errlen);
    it->gold = gold;
    for (int c = 0; c < n; c++) {
        json_t *e = json_array_get(ch, (size_t)c);
        if (!json_is_string(e)) {
            snprintf(err, errlen, "%s:%d: field 'choices[%d]': expected a string", path, line, c);
            return -1;
        }
        if (evt_choice_set(it, c, " ", json_string_value(e)))
            return evt_oom_at(path, line, err, errlen);
    }
    it->ctx = evt_cat2(query, "\nAnswer:");
    return it->ctx ? 0 : evt_oom_at(path, line, err, errlen);
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
    evt_task_init(t, name, EV_KIND_MC, 1, path);
    arc_ctx a = {.tb = {.t = t}, .obqa = obqa};
    if (evt_jsonl_each(path, arc_row, &a, err, errlen)) {
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
    const char *goal = evt_get_str(row, "goal", path, line, err, errlen);
    const char *s1 = goal ? evt_get_str(row, "sol1", path, line, err, errlen) : NULL;
    const char *s2 = s1 ? evt_get_str(row, "sol2", path, line, err, errlen) : NULL;
    if (!s2)
        return -1;
    ev_item *it = evt_task_add(tb, 2, line);
    if (!it)
        return evt_oom_at(path, line, err, errlen);
    sbuf s = {0};
    evt_sb_puts(&s, "Question: ");
    evt_sb_puts(&s, goal);
    evt_sb_puts(&s, "\nAnswer:");
    it->ctx = evt_sb_take(&s);
    if (!it->ctx || evt_choice_set(it, 0, " ", s1) || evt_choice_set(it, 1, " ", s2))
        return evt_oom_at(path, line, err, errlen);
    return 0;
}

int ev_load_piqa(const char *jsonl, const char *labels, ev_task *t, char *err, size_t errlen)
{
    evt_task_init(t, "piqa", EV_KIND_MC, 1, jsonl);
    task_builder tb = {.t = t};
    if (evt_jsonl_each(jsonl, piqa_row, &tb, err, errlen))
        goto fail;
    FILE *f = evt_open(labels, err, errlen);
    if (!f)
        goto fail;
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
    evt_task_init(t, "hellaswag", EV_KIND_MC, 1, path);
    task_builder tb = {.t = t};
    FILE *f = evt_open(path, err, errlen);
    if (!f)
        return -1;
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
        ev_item *it = evt_task_add(&tb, 4, start);
        if (!it || !(it->ctx = strdup(lines[0]))) {
            rc = evt_oom_at(path, start, err, errlen);
            break;
        }
        it->gold = lab[0] - '0';
        for (int c = 0; c < 4 && !rc; c++)
            if (evt_choice_set(it, c, " ", lines[2 + c]))
                rc = evt_oom_at(path, start, err, errlen);
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
        if (!(cont = evt_get_str(row, "continuation", path, line, err, errlen)) ||
            evt_get_int(row, "gold", 0, 1, path, line, &gold, err, errlen))
            return -1;
    } else {
        /* original: sentence with "_", option1, option2, answer "1"/"2" */
        const char *sent = evt_get_str(row, "sentence", path, line, err, errlen);
        const char *o1 = sent ? evt_get_str(row, "option1", path, line, err, errlen) : NULL;
        const char *o2 = o1 ? evt_get_str(row, "option2", path, line, err, errlen) : NULL;
        const char *ans = o2 ? evt_get_str(row, "answer", path, line, err, errlen) : NULL;
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
            evt_sb_add(&s, sent, (size_t)(us - sent));
            evt_sb_puts(&s, k ? o2 : o1);
            tmp_ctx[k] = evt_sb_take(&s);
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
    ev_item *it = (opts[0] && opts[1]) ? evt_task_add(tb, 2, line) : NULL;
    int rc = 0;
    if (!it) {
        rc = evt_oom_at(path, line, err, errlen);
    } else {
        it->gold = gold;
        sbuf s = {0};
        evt_sb_puts(&s, " ");
        evt_sb_add(&s, cont, cl);
        char *c0 = evt_sb_take(&s);
        for (int k = 0; k < 2 && !rc; k++) {
            it->choices[k].ctx = strdup(opts[k]);
            it->choices[k].cont = c0 ? strdup(c0) : NULL;
            it->choices[k].norm_len = c0 ? ev_utf8_len(c0 + 1) : 0;
            if (!it->choices[k].ctx || !it->choices[k].cont)
                rc = evt_oom_at(path, line, err, errlen);
        }
        free(c0);
    }
    free(tmp_ctx[0]);
    free(tmp_ctx[1]);
    return rc;
}

int ev_load_winogrande(const char *path, ev_task *t, char *err, size_t errlen)
{
    evt_task_init(t, "winogrande", EV_KIND_MC, 0, path);
    task_builder tb = {.t = t};
    if (evt_jsonl_each(path, wino_row, &tb, err, errlen)) {
        ev_task_free(t);
        return -1;
    }
    return 0;
}

/* ---- BoolQ ------------------------------------------------------------------------ */

static int boolq_row(void *u, json_t *row, const char *path, int line, char *err, size_t errlen)
{
    task_builder *tb = u;
    const char *passage = evt_get_str(row, "passage", path, line, err, errlen);
    const char *question = passage ? evt_get_str(row, "question", path, line, err, errlen) : NULL;
    if (!question)
        return -1;
    json_t *ans = json_object_get(row, "answer");
    if (!json_is_boolean(ans)) {
        snprintf(err, errlen, "%s:%d: field 'answer': expected true or false", path, line);
        return -1;
    }
    ev_item *it = evt_task_add(tb, 2, line);
    if (!it)
        return evt_oom_at(path, line, err, errlen);
    sbuf s = {0};
    evt_sb_puts(&s, passage);
    evt_sb_puts(&s, "\nQuestion: ");
    evt_sb_puts(&s, question);
    evt_sb_puts(&s, "?\nAnswer:");
    it->ctx = evt_sb_take(&s);
    it->gold = json_is_true(ans) ? 1 : 0;
    if (!it->ctx || evt_choice_set(it, 0, " ", "no") || evt_choice_set(it, 1, " ", "yes"))
        return evt_oom_at(path, line, err, errlen);
    return 0;
}

int ev_load_boolq(const char *path, ev_task *t, char *err, size_t errlen)
{
    evt_task_init(t, "boolq", EV_KIND_MC, 0, path);
    task_builder tb = {.t = t};
    if (evt_jsonl_each(path, boolq_row, &tb, err, errlen)) {
        ev_task_free(t);
        return -1;
    }
    return 0;
}

