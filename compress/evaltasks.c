/* compress/evaltasks.c — benchmark loaders and lm-evaluation-harness prompt templates:
 * the shared helpers, the built-in tasks by name, seeded sampling and task files by URL.
 * The loaders themselves are evtasks_choice.c and evtasks_text.c.
 *
 * Every loader reads its file fully, validates each row (errors name file, line and
 * field) and builds items; a bad row fails the task, never the process. Templates are
 * those of lm-evaluation-harness v0.4 (arc_easy.yaml, piqa.yaml, hellaswag utils,
 * winogrande partial scoring, boolq.yaml, openbookqa.yaml, lambada_openai.yaml,
 * mmlu default template, sciq.yaml, wikitext with wikitext_detokenizer).
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

#include "storage/fileio.h"
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "compress/csv.h"
#include "storage/fetch.h"
#include "engine/rng.h"

const char *const ev_eight_tasks[] = {"arc_easy", "arc_challenge", "piqa", "hellaswag", "winogrande",
                                      "boolq", "openbookqa", "lambada_openai", NULL};
const char *const ev_builtin_tasks[] = {"arc_easy", "arc_challenge", "piqa", "hellaswag", "winogrande",
                                        "boolq", "openbookqa", "lambada_openai", "mmlu", "sciq", "wikitext2",
                                        NULL};

/* ---- small helpers ---------------------------------------------------------------- */


void evt_sb_add(sbuf *b, const char *s, size_t n)
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

void evt_sb_puts(sbuf *b, const char *s) { evt_sb_add(b, s, strlen(s)); }

/* Returns the built string (ownership to caller) or NULL on OOM. */
char *evt_sb_take(sbuf *b)
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

char *evt_cat2(const char *a, const char *b)
{
    sbuf s = {0};
    evt_sb_puts(&s, a);
    evt_sb_puts(&s, b);
    return evt_sb_take(&s);
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


/* Append a new zeroed item with n choices; NULL on OOM. */
ev_item *evt_task_add(task_builder *tb, int n_choices, int line)
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
int evt_choice_set(ev_item *it, int c, const char *delim, const char *text)
{
    it->choices[c].cont = evt_cat2(delim, text);
    it->choices[c].norm_len = ev_utf8_len(text);
    return it->choices[c].cont ? 0 : -1;
}

void evt_task_init(ev_task *t, const char *name, ev_kind kind, int acc_norm, const char *source)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->report_acc_norm = acc_norm;
    snprintf(t->source, sizeof t->source, "%s", source);
}

/* ---- JSONL ------------------------------------------------------------------------ */


FILE *evt_open(const char *path, char *err, size_t errlen)
{
    return fio_fopen_regular(path, "a task file", EVT_MAX_FILE_BYTES, err, errlen);
}

int evt_lines_each(const char *path, evt_line_fn fn, void *u, char *err, size_t errlen)
{
    FILE *f = evt_open(path, err, errlen);
    if (!f)
        return -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int lineno = 0, rc = 0;
    while (!rc && (n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (n > EVT_MAX_LINE_BYTES) {
            snprintf(err, errlen, "%s:%d: a line of %zd bytes, more than the limit of %zd", path, lineno, n,
                     (ssize_t)EVT_MAX_LINE_BYTES);
            rc = -1;
            break;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        rc = fn(u, line, (size_t)n, lineno, err, errlen);
    }
    if (!rc && (ferror(f) || !feof(f))) {   /* a getline that ran out of memory ends short of the end */
        snprintf(err, errlen, "%s: read error after line %d", path, lineno);
        rc = -1;
    }
    free(line);
    fclose(f);
    return rc;
}

typedef struct {
    jsonl_row_fn fn;
    void *u;
    const char *path;
} jsonl_lines;

/* One line of a JSONL file: skipped when blank, else parsed and handed to the row function. */
static int jsonl_line(void *u, char *line, size_t n, int lineno, char *err, size_t errlen)
{
    const jsonl_lines *j = u;
    int blank = 1;
    for (size_t i = 0; i < n; i++)
        if (!isspace((unsigned char)line[i])) {
            blank = 0;
            break;
        }
    if (blank)
        return 0;
    json_error_t je;
    json_t *row = json_loadb(line, n, JSON_REJECT_DUPLICATES, &je);
    if (!row) {
        snprintf(err, errlen, "%s:%d: invalid JSON at column %d: %s", j->path, lineno, je.column, je.text);
        return -1;
    }
    if (!json_is_object(row)) {
        json_decref(row);
        snprintf(err, errlen, "%s:%d: expected a JSON object", j->path, lineno);
        return -1;
    }
    int rc = j->fn(j->u, row, j->path, lineno, err, errlen);
    json_decref(row);
    return rc;
}

int evt_jsonl_each(const char *path, jsonl_row_fn fn, void *u, char *err, size_t errlen)
{
    jsonl_lines j = {fn, u, path};
    return evt_lines_each(path, jsonl_line, &j, err, errlen);
}

/* Borrow string field `key` of obj (NUL-free check skipped: jansson strings may hold
 * NUL only with json_string_length; benchmark text never does). */
const char *evt_get_str(json_t *obj, const char *key, const char *path, int line, char *err, size_t errlen)
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

int evt_get_int(json_t *obj, const char *key, int lo, int hi, const char *path, int line, int *out,
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

int evt_oom_at(const char *path, int line, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s:%d: out of memory", path, line);
    return -1;
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
            int j = (int)(eng_splitmix64(&s) % (uint64_t)(i + 1));
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

int ev_fetch_url(const char *url, const char *sha256_hex, size_t max_bytes, const char *out_path, int allow_private,
                 char *err, size_t errlen)
{
    if (!sha256_hex || strlen(sha256_hex) != 64 || strspn(sha256_hex, "0123456789abcdefABCDEF") != 64) {
        snprintf(err, errlen, "%s: a sha256 (64 hex digits) is required to fetch a task by URL", url);
        return -1;
    }
    /* file:// too: the command line reads local files anyway; the evaluate stage refuses
     * every scheme but http(s) before it gets here */
    fetch_opts o = {.flags = FETCH_ALLOW_HTTP | FETCH_ALLOW_FILE | (allow_private ? FETCH_ALLOW_PRIVATE : 0u)};
    int64_t max = max_bytes > (size_t)INT64_MAX ? INT64_MAX : (int64_t)max_bytes;
    if (fetch_url(url, sha256_hex, max, out_path, &o, err, errlen) == FETCH_OK)
        return 0;
    char part[4200];
    if (snprintf(part, sizeof part, "%s.part", out_path) < (int)sizeof part)
        unlink(part);   /* tasks are small: no resume, nothing left behind */
    return -1;
}
