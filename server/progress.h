/* server/progress.h — the progress display of long CLI work (run, calibrate, distill,
 * eval): on a terminal one line redrawn in place (stage, bar, percent, counts, rate, ETA),
 * elsewhere plain timestamped log lines. One display per stream; not thread-safe (call it
 * from one thread). The rate is a bias-corrected exponential moving average over time
 * (see progress.c); AC_PROGRESS=bar|plain in the environment overrides PB_AUTO's choice.
 */
#ifndef AC_SERVER_PROGRESS_H
#define AC_SERVER_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct progress_bar progress_bar;

enum {
    PB_AUTO = 0,   /* bar when out is a terminal and TERM is not "dumb" (AC_PROGRESS=bar|plain overrides) */
    PB_BAR = 1,    /* always redraw in place */
    PB_PLAIN = 2   /* always plain log lines */
};

/* A display writing to `out` (borrowed; usually stderr) in `mode`. Returns a NEW display
 * (free with pb_close), or NULL when out of memory. */
progress_bar *pb_open(FILE *out, int mode);

/* 1 when the display redraws a bar in place, 0 when it writes plain lines (or pb is NULL). */
int pb_is_bar(const progress_bar *pb);

/* Tests and tuning. pb_set_clock: now(ud) returns seconds on a monotonic scale (default:
 * CLOCK_MONOTONIC); call before the first update. pb_set_width: terminal columns (0: ask
 * the terminal, then $COLUMNS, then 80). pb_set_interval: seconds between plain lines
 * within a 10% step (default 10). All are no-ops on NULL. */
void pb_set_clock(progress_bar *pb, double (*now)(void *ud), void *ud);
void pb_set_width(progress_bar *pb, int columns);
void pb_set_interval(progress_bar *pb, double seconds);

/* Progress of `stage` (borrowed, copied): `done` of `total` units (total <= 0: unknown,
 * no bar, percent or ETA; done < 0: no counts at all, the stage name and extra only),
 * `unit` ("tok", "item"; NULL or "" for none), `extra` a short free text shown last (NULL
 * for none; truncated first when the line is too wide). A new stage name finishes the
 * previous stage: its final line stays, with its elapsed time and average rate.
 * Bar: redraws at most 10 times a second (always at a stage's first update and when done
 * reaches total). Plain: a line at a stage's first update, when a new 10% step is reached,
 * and otherwise at most one per interval. Output errors are ignored; NULL pb is a no-op. */
void pb_update(progress_bar *pb, const char *stage, int64_t done, int64_t total, const char *unit,
               const char *extra);

/* A log line (borrowed; a newline is added if missing) printed intact: on a terminal the
 * bar is cleared first and redrawn after it. With NULL pb the line goes to stderr. */
void pb_note(progress_bar *pb, const char *line);
/* printf-style pb_note. */
void pb_notef(progress_bar *pb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Finish the current stage now: its final line with the elapsed time and `outcome` (NULL
 * or "done" for success; a word such as "failed" or "cancelled" otherwise, borrowed). A
 * no-op without a stage. The next pb_update starts a stage even under the same name. */
void pb_end_stage(progress_bar *pb, const char *outcome);

/* Finish the current stage ("done") and free the display (out stays open). NULL is a no-op. */
void pb_close(progress_bar *pb);

#endif
