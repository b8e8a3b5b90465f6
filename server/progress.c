/* server/progress.c — the CLI progress display (progress.h). On a terminal: "\r" + line +
 * "\033[K", redrawn at most every PB_REDRAW_S, truncated to the terminal width (never
 * wrapped). The rate is a bias-corrected exponential moving average over time: a sample
 * every PB_SAMPLE_S or more weighted 1 - exp(-dt/PB_TAU_S), divided by the total weight,
 * so it is the rate since the stage began for its first ~PB_TAU_S, a steady rate is shown
 * exactly and a change shows within ~PB_TAU_S. ETA = units left / rate ("ETA --" before).
 */
#include "server/progress.h"
#include "engine/clock.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define PB_REDRAW_S 0.1       /* bar: minimum seconds between redraws */
#define PB_SAMPLE_S 0.25      /* minimum seconds between rate samples */
#define PB_TAU_S 10.0         /* time constant of the rate average */
#define PB_INTERVAL_S 10.0    /* plain: default seconds between lines within a 10% step */
#define PB_LINE_MAX 1024
#define PB_TAIL_COLS 48       /* bar: columns kept for percent, counts, rate and ETA */

struct progress_bar {
    FILE *out;               /* borrowed */
    int bar;                 /* 1: redraw in place; 0: plain lines */
    int width;               /* columns override (0: ask) */
    double interval_s;
    double (*now)(void *ud);
    void *now_ud;
    /* the current stage */
    int active;
    char stage[64], unit[24], extra[256];
    int64_t done, total;     /* done < 0: the stage has no counts (yet) */
    double t0;               /* stage start (first update) */
    int64_t done0;           /* counting start: done and time there (average rate) */
    double count_t0;
    double rate;             /* units/s, smoothed (ema / weight); valid when have_rate */
    double ema, weight;      /* the average's sum and its total weight */
    int have_rate;
    double sample_t;
    int64_t sample_done;
    /* output state */
    int drawn;               /* bar: a bar line is on screen */
    double last_draw;
    double last_line;        /* plain */
    int last_decile;         /* plain: 10% step of the last line (-1: none) */
};

static double mono_now(void *ud)
{
    (void)ud;
    return eng_wall_s();
}

progress_bar *pb_open(FILE *out, int mode)
{
    progress_bar *pb = calloc(1, sizeof *pb);
    if (!pb)
        return NULL;
    pb->out = out;
    pb->interval_s = PB_INTERVAL_S;
    pb->now = mono_now;
    pb->last_decile = -1;
    const char *env = getenv("AC_PROGRESS");
    if (mode == PB_AUTO && env && !strcmp(env, "bar"))
        mode = PB_BAR;
    else if (mode == PB_AUTO && env && !strcmp(env, "plain"))
        mode = PB_PLAIN;
    if (mode == PB_AUTO) {
        int fd = out ? fileno(out) : -1;
        const char *term = getenv("TERM");
        pb->bar = fd >= 0 && isatty(fd) && !(term && !strcmp(term, "dumb"));
    } else {
        pb->bar = mode == PB_BAR;
    }
    return pb;
}

int pb_is_bar(const progress_bar *pb) { return pb ? pb->bar : 0; }

void pb_set_clock(progress_bar *pb, double (*now)(void *ud), void *ud)
{
    if (pb && now) {
        pb->now = now;
        pb->now_ud = ud;
    }
}

void pb_set_width(progress_bar *pb, int columns)
{
    if (pb)
        pb->width = columns > 0 ? columns : 0;
}

void pb_set_interval(progress_bar *pb, double seconds)
{
    if (pb && seconds > 0)
        pb->interval_s = seconds;
}

/* ---- formatting -------------------------------------------------------------------- */

/* Copy src into dst (cap bytes), control characters (newlines, ESC, ...) as spaces. */
static void copy_clean(char *dst, size_t cap, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < cap; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = c < 0x20 || c == 0x7f ? ' ' : (char)c;
    }
    dst[i] = '\0';
}

/* Append formatted text to buf (length *len, capacity cap); silently truncates. */
static void add(char *buf, size_t *len, size_t cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void add(char *buf, size_t *len, size_t cap, const char *fmt, ...)
{
    if (*len + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

/* Counts: exact below a million, then M/G with three significant digits. */
static void fmt_count(char *b, size_t cap, int64_t n)
{
    double x = (double)n;
    if (n < 1000000)
        snprintf(b, cap, "%lld", (long long)n);
    else if (x < 1e9)
        snprintf(b, cap, "%.2fM", x / 1e6);
    else
        snprintf(b, cap, "%.2fG", x / 1e9);
}

static void fmt_rate(char *b, size_t cap, double r)
{
    if (r < 10)
        snprintf(b, cap, "%.2f", r);
    else if (r < 100)
        snprintf(b, cap, "%.1f", r);
    else if (r < 1e5)
        snprintf(b, cap, "%.0f", r);
    else if (r < 1e6)
        snprintf(b, cap, "%.1fk", r / 1e3);
    else
        snprintf(b, cap, "%.2fM", r / 1e6);
}

/* Durations: "42s" ("4.2s" when tenths), "5m12s", "2h05m". */
static void fmt_dur(char *b, size_t cap, double s, int tenths)
{
    if (!(s >= 0))
        s = 0;
    if (s < 60) {
        if (tenths)
            snprintf(b, cap, "%.1fs", s);
        else
            snprintf(b, cap, "%.0fs", s);
        return;
    }
    long long t = (long long)(s + 0.5);
    if (t < 3600)
        snprintf(b, cap, "%lldm%02llds", t / 60, t % 60);
    else
        snprintf(b, cap, "%lldh%02lldm", t / 3600, (t % 3600) / 60);
}

static int columns(const progress_bar *pb)
{
    int c = pb->width;
    if (c <= 0) {
        struct winsize ws;
        int fd = fileno(pb->out);
        if (fd >= 0 && ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
            c = ws.ws_col;
    }
    if (c <= 0) {
        const char *e = getenv("COLUMNS");
        char *end;
        long v = e ? strtol(e, &end, 10) : 0;
        if (e && end != e && !*end && v > 0 && v < 10000)
            c = (int)v;
    }
    if (c <= 0)
        c = 80;
    return c < 20 ? 20 : c;
}

/* Cut line to at most max bytes, never inside a UTF-8 sequence. */
static void truncate_line(char *line, size_t max)
{
    size_t n = strlen(line);
    if (n <= max)
        return;
    n = max;
    while (n > 0 && ((unsigned char)line[n] & 0xC0) == 0x80)
        n--;
    line[n] = '\0';
}

/* Average rate over the stage so far (0 when no time has passed). */
static double avg_rate(const progress_bar *pb, double now)
{
    double el = now - pb->count_t0;
    return el > 0 && pb->done >= 0 && pb->done >= pb->done0 ? (double)(pb->done - pb->done0) / el : 0.0;
}

static double percent(const progress_bar *pb)
{
    double p = 100.0 * (double)pb->done / (double)pb->total;
    return p < 0 ? 0 : p > 100 ? 100 : p;
}

/* The bar line; a finished stage (outcome "done", "failed", ...; NULL while running) shows
 * its elapsed time and average rate instead of the ETA, and an outcome other than "done". */
static void compose_bar(const progress_bar *pb, double now, const char *outcome, char *line, size_t cap)
{
    char d[32], t[32], r[32], dur[32], tail[256] = "";
    size_t tl = 0, len = 0;
    const char *sp = pb->unit[0] ? " " : "";
    int counted = pb->done >= 0, bounded = counted && pb->total > 0;
    fmt_count(d, sizeof d, pb->done);
    if (bounded) {
        fmt_count(t, sizeof t, pb->total);
        add(tail, &tl, sizeof tail, " %5.1f%% %s/%s%s%s", percent(pb), d, t, sp, pb->unit);
    } else if (counted) {
        add(tail, &tl, sizeof tail, " %s%s%s", d, sp, pb->unit);
    }
    int finished = outcome != NULL;
    double rate = finished ? avg_rate(pb, now) : pb->rate;
    if (counted && ((finished && rate > 0) || (!finished && pb->have_rate))) {
        fmt_rate(r, sizeof r, rate);
        add(tail, &tl, sizeof tail, "  %s%s%s/s", r, sp, pb->unit);
    }
    if (finished) {
        fmt_dur(dur, sizeof dur, now - pb->t0, 1);
        add(tail, &tl, sizeof tail, "%s%s  in %s", strcmp(outcome, "done") ? "  " : "",
            strcmp(outcome, "done") ? outcome : "", dur);
    } else if (bounded) {
        if (pb->have_rate && pb->rate > 0) {
            fmt_dur(dur, sizeof dur, (double)(pb->total > pb->done ? pb->total - pb->done : 0) / pb->rate, 0);
            add(tail, &tl, sizeof tail, "  ETA %s", dur);
        } else {
            add(tail, &tl, sizeof tail, "  ETA --");
        }
    }
    int cols = columns(pb);
    add(line, &len, cap, "%s", pb->stage);
    if (bounded) {
        int bw = cols - 1 - (int)strlen(pb->stage) - 3 - PB_TAIL_COLS;   /* steady: not from tl */
        bw = bw < 10 ? 10 : bw > 40 ? 40 : bw;
        int fill = (int)(bw * percent(pb) / 100.0 + 1e-9);
        add(line, &len, cap, " [");
        for (int i = 0; i < bw; i++)
            add(line, &len, cap, "%c", i < fill ? '#' : '.');
        add(line, &len, cap, "]");
    }
    add(line, &len, cap, "%s", tail);
    if (pb->extra[0])
        add(line, &len, cap, "  %s", pb->extra);
    truncate_line(line, (size_t)cols - 1);
}

/* A plain log line: "[12:01:02] distill 42% 1234/2940 tok 310 tok/s ETA 5m12s extra". */
static void compose_plain(const progress_bar *pb, double now, const char *outcome, char *line, size_t cap)
{
    char ts[16] = "??:??:??", d[32], t[32], r[32], dur[32];
    size_t len = 0;
    time_t wall = time(NULL);
    struct tm tm;
    if (localtime_r(&wall, &tm))
        strftime(ts, sizeof ts, "%H:%M:%S", &tm);
    const char *sp = pb->unit[0] ? " " : "";
    int counted = pb->done >= 0, bounded = counted && pb->total > 0;
    int finished = outcome != NULL;
    add(line, &len, cap, "[%s] %s%s%s", ts, pb->stage, finished ? " " : "", finished ? outcome : "");
    fmt_count(d, sizeof d, pb->done);
    if (bounded) {
        fmt_count(t, sizeof t, pb->total);
        add(line, &len, cap, " %d%% %s/%s%s%s", (int)percent(pb), d, t, sp, pb->unit);
    } else if (counted) {
        add(line, &len, cap, " %s%s%s", d, sp, pb->unit);
    }
    if (finished) {
        double rate = avg_rate(pb, now);
        fmt_dur(dur, sizeof dur, now - pb->t0, 1);
        add(line, &len, cap, " in %s", dur);
        if (rate > 0) {
            fmt_rate(r, sizeof r, rate);
            add(line, &len, cap, " (%s%s%s/s)", r, sp, pb->unit);
        }
    } else {
        if (counted && pb->have_rate) {
            fmt_rate(r, sizeof r, pb->rate);
            add(line, &len, cap, " %s%s%s/s", r, sp, pb->unit);
        }
        if (bounded) {
            if (pb->have_rate && pb->rate > 0) {
                fmt_dur(dur, sizeof dur, (double)(pb->total > pb->done ? pb->total - pb->done : 0) / pb->rate, 0);
                add(line, &len, cap, " ETA %s", dur);
            } else {
                add(line, &len, cap, " ETA --");
            }
        }
    }
    if (pb->extra[0])
        add(line, &len, cap, " %s", pb->extra);
}

/* ---- output ------------------------------------------------------------------------ */

/* Write pb's line at now in its style: a bar over the terminal's current line (kept,
 * with a newline, once outcome ends the stage), plain text as a line of its own.
 * outcome is NULL while the stage runs. */
static void put_line(progress_bar *pb, double now, const char *outcome)
{
    char line[PB_LINE_MAX];
    line[0] = '\0';
    if (pb->bar) {
        compose_bar(pb, now, outcome, line, sizeof line);
        fprintf(pb->out, "\r%s\033[K%s", line, outcome ? "\n" : "");
    } else {
        compose_plain(pb, now, outcome, line, sizeof line);
        fprintf(pb->out, "%s\n", line);
    }
    fflush(pb->out);
}

static void draw_bar(progress_bar *pb, double now)
{
    put_line(pb, now, NULL);
    pb->drawn = 1;
    pb->last_draw = now;
}

static void emit_plain(progress_bar *pb, double now)
{
    put_line(pb, now, NULL);
    pb->last_line = now;
    pb->last_decile = pb->total > 0 ? (int)(percent(pb) / 10.0) : -1;
}

static void finish_stage(progress_bar *pb, double now, const char *outcome)
{
    if (!pb->active)
        return;
    char word[32];
    copy_clean(word, sizeof word, outcome && *outcome ? outcome : "done");
    put_line(pb, now, word);
    pb->active = 0;
    pb->drawn = 0;
}

void pb_update(progress_bar *pb, const char *stage, int64_t done, int64_t total, const char *unit,
               const char *extra)
{
    if (!pb)
        return;
    double now = pb->now(pb->now_ud);
    char name[sizeof pb->stage];
    copy_clean(name, sizeof name, stage ? stage : "");
    int first = !pb->active || strcmp(name, pb->stage) != 0;
    if (first) {
        finish_stage(pb, now, NULL);
        memcpy(pb->stage, name, sizeof name);
        pb->active = 1;
        pb->t0 = now;
        pb->count_t0 = now;
        pb->done0 = done;
        pb->have_rate = 0;
        pb->rate = pb->ema = pb->weight = 0;
        pb->sample_t = now;
        pb->sample_done = done;
        pb->last_decile = -1;
    } else if (pb->sample_done < 0) {   /* counting starts: the average covers the whole stage */
        pb->sample_t = now;
        pb->sample_done = done;
        pb->done0 = 0;
    } else if (done < pb->sample_done) {   /* went backwards: the old rate means nothing */
        pb->have_rate = 0;
        pb->rate = pb->ema = pb->weight = 0;
        pb->sample_t = now;
        pb->sample_done = done;
        pb->done0 = done;
        pb->count_t0 = now;
    } else if (now - pb->sample_t >= PB_SAMPLE_S) {
        double dt = now - pb->sample_t, inst = (double)(done - pb->sample_done) / dt;
        double a = 1.0 - exp(-dt / PB_TAU_S);
        pb->ema += a * (inst - pb->ema);
        pb->weight += a * (1.0 - pb->weight);
        pb->rate = pb->ema / pb->weight;
        pb->have_rate = 1;
        pb->sample_t = now;
        pb->sample_done = done;
    }
    int reached = total > 0 && done >= total && pb->done < total;
    pb->done = done;
    pb->total = total;
    copy_clean(pb->unit, sizeof pb->unit, unit);
    copy_clean(pb->extra, sizeof pb->extra, extra);
    if (pb->bar) {
        if (first || reached || now - pb->last_draw >= PB_REDRAW_S)
            draw_bar(pb, now);
    } else {
        int decile = total > 0 ? (int)(percent(pb) / 10.0) : -1;
        if (first || decile > pb->last_decile || now - pb->last_line >= pb->interval_s)
            emit_plain(pb, now);
    }
}

void pb_note(progress_bar *pb, const char *line)
{
    FILE *out = pb ? pb->out : stderr;
    if (!line)
        return;
    if (pb && pb->bar && pb->drawn)
        fputs("\r\033[K", out);
    size_t n = strlen(line);
    fputs(line, out);
    if (n == 0 || line[n - 1] != '\n')
        fputc('\n', out);
    if (pb && pb->bar && pb->drawn)
        draw_bar(pb, pb->now(pb->now_ud));
    else
        fflush(out);
}

void pb_notef(progress_bar *pb, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n >= 0)
        pb_note(pb, buf);
}

void pb_end_stage(progress_bar *pb, const char *outcome)
{
    if (pb)
        finish_stage(pb, pb->now(pb->now_ud), outcome);
}

void pb_close(progress_bar *pb)
{
    if (!pb)
        return;
    finish_stage(pb, pb->now(pb->now_ud), NULL);
    free(pb);
}
