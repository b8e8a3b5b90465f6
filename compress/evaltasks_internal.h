/* compress/evaltasks_internal.h — what the task loaders share (evaltasks.c: helpers, the
 * tasks by name, sampling, fetching; evtasks_choice.c: multiple-choice families;
 * evtasks_text.c: LAMBADA, MMLU, SciQ, WikiText-2 and the generic JSONL): a growable
 * string, a task builder, a JSONL reader and field getters whose errors name file, line
 * and field. Not for code outside those files.
 */
#ifndef AC_COMPRESS_EVALTASKS_INTERNAL_H
#define AC_COMPRESS_EVALTASKS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <jansson.h>

#include "compress/evaltasks.h"

/* A growable string; oom is set (and later appends dropped) when memory runs out. */
typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

/* Items appended to t, growing its array. */
typedef struct {
    ev_task *t;
    int cap;
} task_builder;

/* One line of a text file, its line end cut off (line[n] is NUL; the text may hold other
 * NULs), numbered from 1: 0 to go on, nonzero (err set) to stop with that status. */
typedef int (*evt_line_fn)(void *u, char *line, size_t n, int lineno, char *err, size_t errlen);
/* One parsed JSONL row: 0 to go on, -1 (err set) to stop. */
typedef int (*jsonl_row_fn)(void *u, json_t *row, const char *path, int line, char *err, size_t errlen);

/* Append n bytes / a C string to b (sets b->oom instead of failing). */
void evt_sb_add(sbuf *b, const char *s, size_t n);
void evt_sb_puts(sbuf *b, const char *s);
/* b's text (NEW, NUL-terminated; b is reset), or NULL when it ran out of memory. */
char *evt_sb_take(sbuf *b);
/* a followed by b (NEW), or NULL on OOM. */
char *evt_cat2(const char *a, const char *b);
/* Append a zeroed item with n_choices choices from source line `line`; NULL on OOM. */
ev_item *evt_task_add(task_builder *tb, int n_choices, int line);
/* Set choice c of it to delim + text (copied). 0, or -1 on OOM. */
int evt_choice_set(ev_item *it, int c, const char *delim, const char *text);
/* Zero t and name it (name and source copied). */
void evt_task_init(ev_task *t, const char *name, ev_kind kind, int acc_norm, const char *source);
/* A task or label file, opened to read: a regular file (a FIFO or device swapped in after
 * the spec check is refused, never waited on) of at most EVT_MAX_FILE_BYTES. NULL with err. */
#define EVT_MAX_FILE_BYTES ((int64_t)256 << 20)
#define EVT_MAX_LINE_BYTES ((ssize_t)16 << 20)
FILE *evt_open(const char *path, char *err, size_t errlen);
/* Call fn for every line of a text file (lines of at most EVT_MAX_LINE_BYTES). 0, fn's
 * status when it stops, or -1 with err set when the file cannot be opened or read. */
int evt_lines_each(const char *path, evt_line_fn fn, void *u, char *err, size_t errlen);
/* Call fn for every non-blank line of a JSONL file. 0, or -1 with err naming the line. */
int evt_jsonl_each(const char *path, jsonl_row_fn fn, void *u, char *err, size_t errlen);
/* obj[key] as a string (borrowed) / an integer in [lo, hi]; NULL or -1 with err naming
 * file, line and field. */
const char *evt_get_str(json_t *obj, const char *key, const char *path, int line, char *err, size_t errlen);
int evt_get_int(json_t *obj, const char *key, int lo, int hi, const char *path, int line, int *out, char *err,
                size_t errlen);
/* "out of memory" at file:line into err; returns -1. */
int evt_oom_at(const char *path, int line, char *err, size_t errlen);

#endif
