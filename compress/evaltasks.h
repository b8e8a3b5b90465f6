/* compress/evaltasks.h — benchmark task loaders and prompt templates.
 *
 * Each loader reads a benchmark in its released format (shared/data/PROVENANCE.md) and
 * produces items whose context and continuation strings follow lm-evaluation-harness
 * templates exactly, so scores compare with published ones. Also: the generic JSONL
 * task format (docs/tasks.md), WikiText-2 documents for rolling perplexity, seeded item
 * sampling and fetching a task file by URL (size-limited, sha256-verified).
 * Errors name the file, the line and the field. This module runs no model.
 */
#ifndef AC_COMPRESS_EVALTASKS_H
#define AC_COMPRESS_EVALTASKS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    EV_KIND_MC = 0,      /* multiple choice: log-likelihood of each choice */
    EV_KIND_LOGLIK,      /* one continuation: log-likelihood and greedy match */
    EV_KIND_ROLLING      /* whole documents: rolling log-likelihood (perplexity) */
} ev_kind;

typedef struct {
    char *ctx;           /* owned; NULL: use the item's shared ctx */
    char *cont;          /* continuation including the target delimiter, e.g. " yes" (owned) */
    int norm_len;        /* characters (code points) of the choice without delimiter: acc_norm */
} ev_choice;

typedef struct {
    char *ctx;           /* shared context of all choices (owned), or NULL */
    int n_choices;
    ev_choice *choices;  /* [n_choices], owned */
    int gold;            /* index of the right choice (MC); 0 otherwise */
    int line;            /* 1-based line (or record) in the source file */
    int group;           /* index into the task's groups (MMLU subject), else 0 */
    int64_t words;       /* rolling: words as the harness counts them (re.split(r"\s+")) */
    int64_t bytes;       /* rolling: UTF-8 bytes of the document */
} ev_item;

/* Bytes in a task's name at most (the job spec's limit for a user's task). */
#define EV_TASK_NAME_MAX 64

typedef struct {
    char name[EV_TASK_NAME_MAX + 1];   /* "arc_easy", ..., or the user's task name */
    ev_kind kind;
    int report_acc_norm; /* the harness reports acc_norm for this task */
    int n_fewshot;       /* few-shot examples in each context */
    int n_items;
    ev_item *items;      /* owned */
    int n_groups;        /* > 0: per-group accuracy is reported (MMLU subjects) */
    char **groups;       /* [n_groups] names, owned */
    char source[512];    /* file or directory the items came from */
} ev_task;

typedef struct {
    int n_fewshot;       /* -1: task default (MMLU 5, others 0); only MMLU supports > 0 */
    const char *subjects;/* MMLU: comma-separated subject filter, NULL = all 57 */
} ev_load_opts;

/* Names of the built-in tasks, NULL-terminated: the eight, "mmlu", "sciq", "wikitext2". */
extern const char *const ev_builtin_tasks[];
/* The standard eight: arc_easy arc_challenge piqa hellaswag winogrande boolq openbookqa
 * lambada_openai (NULL-terminated). */
extern const char *const ev_eight_tasks[];

/* Load a built-in task by name from data_dir (the folder holding eval/ and text/, as in
 * shared/data). Returns 0, or -1 with "FILE:LINE: field 'F': reason" (or "unknown task")
 * in err and t empty. Free with ev_task_free. */
int ev_task_load(const char *name, const char *data_dir, const ev_load_opts *o, ev_task *t,
                 char *err, size_t errlen);

/* Individual loaders (the file formats of PROVENANCE.md); same contract as above.
 * name is the task name written into t. */
int ev_load_arc(const char *path, const char *name, ev_task *t, char *err, size_t errlen);
int ev_load_piqa(const char *jsonl, const char *labels, ev_task *t, char *err, size_t errlen);
int ev_load_hellaswag(const char *path, ev_task *t, char *err, size_t errlen);
int ev_load_winogrande(const char *path, ev_task *t, char *err, size_t errlen);
int ev_load_boolq(const char *path, ev_task *t, char *err, size_t errlen);
int ev_load_openbookqa(const char *path, ev_task *t, char *err, size_t errlen);
int ev_load_lambada(const char *path, ev_task *t, char *err, size_t errlen);
/* MMLU from mmlu_dir/{dev,test}/<subject>_{dev,test}.csv, n_fewshot (0..5) examples
 * from dev, in dev order (the harness's first_n sampler). One group per subject. */
int ev_load_mmlu(const char *mmlu_dir, int n_fewshot, const char *subjects, ev_task *t,
                 char *err, size_t errlen);
/* SciQ from a CSV with a header naming its columns (any order, others ignored):
 * question, correct_answer, support, and optionally distractor1..3 (all three or none).
 * The context is sciq.yaml's "{support.lstrip()}\nQuestion: {question}\nAnswer:".
 * With distractors: the harness's multiple choice, [distractor1, distractor2,
 * distractor3, correct_answer] with gold 3, acc and acc_norm. Without (the data in
 * shared/, PROVENANCE.md): one loglikelihood item per row, continuation
 * " {correct_answer}", so acc is the greedy match and the score does not compare with
 * published (multiple-choice) SciQ accuracy. */
int ev_load_sciq(const char *path, ev_task *t, char *err, size_t errlen);
/* WikiText-2 raw: CRLF/LF lines; a document starts at each top-level title line
 * (" = Title = ", not " = = ..."); the document is its lines joined with "\n",
 * detokenized as the harness's wikitext_detokenizer. */
int ev_load_wikitext(const char *raw_path, ev_task *t, char *err, size_t errlen);
/* The generic JSONL task format (docs/tasks.md): every line either
 * {"context": str, "choices": [str, ...], "gold": int} (multiple choice; choices are
 * appended to the context verbatim) or {"context": str, "continuation": str}
 * (log-likelihood); all lines of one file have the same shape. */
int ev_load_jsonl(const char *path, const char *name, ev_task *t, char *err, size_t errlen);

/* Harness MMLU header: "The following are multiple choice questions (with answers)
 * about {subject with '_' as ' '}.\n\n". Writes at most len bytes; returns 0, or -1
 * when it does not fit. */
int ev_mmlu_header(const char *subject, char *buf, size_t len);

/* Keep a reproducible random subset of at most `limit` items (per group when the task
 * has groups, as the harness limits each MMLU subject), chosen by a seeded shuffle and
 * kept in file order. limit <= 0 keeps everything. Returns the items kept. */
int ev_task_limit(ev_task *t, int limit, uint64_t seed);

/* Free everything t owns; t becomes empty. Safe on a zeroed task. */
void ev_task_free(ev_task *t);

/* The harness's wikitext_detokenizer applied to text. Returns a new malloc'd string,
 * or NULL on OOM / regex failure. */
char *ev_wikitext_detokenize(const char *text);

/* Number of Unicode code points in UTF-8 s (Python's len()). */
int ev_utf8_len(const char *s);

/* Download url into out_path (written to a temporary file, verified, then renamed) with
 * at most max_bytes; sha256_hex (64 hex digits) is required and checked. allow_private:
 * connections may go to non-public addresses (FETCH_ALLOW_PRIVATE: the command line, a
 * server started with --allow-private-model-hosts); else a URL or a redirect that leads
 * there is refused. Returns 0, or -1 with a reason (HTTP status, size limit, digest
 * mismatch, a refused address) in err. */
int ev_fetch_url(const char *url, const char *sha256_hex, size_t max_bytes, const char *out_path, int allow_private,
                 char *err, size_t errlen);

#endif
