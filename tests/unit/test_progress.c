/* tests/unit/test_progress.c — the CLI progress display (server/progress.c) driven by an
 * injected clock into an open_memstream: the bar redraws with "\r" and clear-to-EOL, shows
 * percent and an ETA that is right for a steady rate, redraws at most ~10 times a second,
 * keeps notes intact, truncates to the width (also inside UTF-8 text) and does not let an
 * early burst dominate the rate; plain mode writes a line at a stage's start and end, at
 * 10% steps and otherwise at most one per interval.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/progress.h"

typedef struct {
    FILE *f;
    char *buf;
    size_t len;
    double t;   /* the fake clock, seconds */
} sink;

static double fake_now(void *ud) { return ((sink *)ud)->t; }

static progress_bar *open_sink(sink *s, int mode, int width)
{
    memset(s, 0, sizeof *s);
    s->f = open_memstream(&s->buf, &s->len);
    assert_non_null(s->f);
    progress_bar *pb = pb_open(s->f, mode);
    assert_non_null(pb);
    pb_set_clock(pb, fake_now, s);
    pb_set_width(pb, width);
    return pb;
}

/* The text written so far (NUL-terminated, owned by s). */
static const char *text(sink *s)
{
    assert_int_equal(fflush(s->f), 0);
    return s->buf;
}

static void close_sink(sink *s)
{
    fclose(s->f);
    free(s->buf);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + strlen(needle), needle))
        n++;
    return n;
}

/* The last bar drawn: the text after the last "\r" up to its "\033[K". */
static void last_bar(const char *all, char *out, size_t cap)
{
    const char *r = strrchr(all, '\r');
    assert_non_null(r);
    const char *e = strstr(r, "\033[K");
    assert_non_null(e);
    size_t n = (size_t)(e - r - 1);
    assert_true(n < cap);
    memcpy(out, r + 1, n);
    out[n] = '\0';
}

static void test_bar_steady_rate_eta(void **state)
{
    (void)state;
    sink s;
    progress_bar *pb = open_sink(&s, PB_BAR, 120);
    assert_true(pb_is_bar(pb));
    char line[512];
    pb_update(pb, "distill", 0, 32200, "tok", NULL);
    last_bar(text(&s), line, sizeof line);
    assert_non_null(strstr(line, "ETA --"));   /* no rate yet */
    assert_non_null(strstr(line, "distill ["));
    /* 100 tok/s for 10 s, one update a second: 1000 done, 31200 left -> 312 s */
    for (int i = 1; i <= 10; i++) {
        s.t = i;
        pb_update(pb, "distill", 100 * i, 32200, "tok", "loss 2.31");
    }
    last_bar(text(&s), line, sizeof line);
    assert_non_null(strstr(line, "  3.1% 1000/32200 tok"));
    assert_non_null(strstr(line, "  100 tok/s"));
    assert_non_null(strstr(line, "ETA 5m12s"));
    assert_non_null(strstr(line, "loss 2.31"));
    assert_non_null(strstr(line, "[#.......")); /* 3.1% of the bar */
    /* the rate follows a change (EMA over time): 4x faster for a minute */
    for (int i = 1; i <= 60; i++) {
        s.t = 10 + i;
        pb_update(pb, "distill", 1000 + 400 * i, 32200, "tok", NULL);
    }
    last_bar(text(&s), line, sizeof line);
    assert_non_null(strstr(line, "25000/32200 tok"));
    assert_non_null(strstr(line, "ETA 18s"));    /* 7200 left at ~400/s (EMA within 0.3%) */
    pb_close(pb);
    /* the finished line stays, with the elapsed time and the average rate */
    const char *all = text(&s);
    assert_non_null(strstr(all, "in 1m10s\033[K\n"));
    assert_non_null(strstr(all, " 357 tok/s  in 1m10s"));   /* 25000 tok / 70 s */
    close_sink(&s);
}

static void test_bar_rate_limit(void **state)
{
    (void)state;
    sink s;
    progress_bar *pb = open_sink(&s, PB_BAR, 80);
    for (int i = 0; i < 100; i++) {
        s.t = 0.001 * i;
        pb_update(pb, "evaluate", i, 1000, "item", NULL);
    }
    int draws = count(text(&s), "\r");
    assert_true(draws >= 1 && draws <= 2);
    /* a stage's last unit always draws, however soon */
    s.t = 0.1005;
    pb_update(pb, "evaluate", 999, 1000, "item", NULL);
    s.t = 0.101;
    pb_update(pb, "evaluate", 1000, 1000, "item", NULL);
    char line[256];
    last_bar(text(&s), line, sizeof line);
    assert_non_null(strstr(line, "100.0% 1000/1000 item"));
    pb_close(pb);
    close_sink(&s);
}

static void test_bar_stage_change_and_width(void **state)
{
    (void)state;
    sink s;
    progress_bar *pb = open_sink(&s, PB_BAR, 40);
    char extra[300];
    memset(extra, 'x', sizeof extra - 1);
    extra[sizeof extra - 1] = '\0';
    pb_update(pb, "calibrate", 10, 100, "req", extra);
    s.t = 5;
    pb_update(pb, "calibrate", 100, 100, "req", extra);
    s.t = 6;
    pb_update(pb, "rank", 0, 0, NULL, "naïve résumé ééééééééééééééééééééééééééééé");   /* unknown total */
    const char *all = text(&s);
    /* every drawn line fits in 39 columns, never wraps */
    int lines = 0;
    for (const char *r = strchr(all, '\r'); r; r = strchr(r + 1, '\r')) {
        const char *e = strstr(r, "\033[K");
        assert_non_null(e);
        assert_true(e - r - 1 <= 39);
        assert_null(memchr(r + 1, '\n', (size_t)(e - r - 1)));
        lines++;
    }
    assert_int_equal(lines, 4);   /* calibrate x2, its finished line, rank */
    /* the finished stage's line stays on screen with its elapsed time */
    assert_non_null(strstr(all, "calibrate ["));
    const char *fin = strstr(all, "\033[K\n");
    assert_non_null(fin);
    const char *fin_start = fin;
    while (fin_start > all && fin_start[-1] != '\r')
        fin_start--;
    assert_true(strstr(fin_start, "100.0%") && strstr(fin_start, "100.0%") < fin);
    char line[256];
    last_bar(all, line, sizeof line);
    assert_null(strchr(line, '%'));      /* no percent, bar or ETA without a total */
    assert_null(strstr(line, "ETA"));
    assert_null(strchr(line, '['));
    /* truncation never splits a UTF-8 character: every lead byte has its continuations */
    size_t n = strlen(line);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)line[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
        assert_true(i + k <= n);
        for (size_t j = 1; j < k; j++)
            assert_int_equal((unsigned char)line[i + j] & 0xC0, 0x80);
        i += k;
    }
    assert_true(n <= 39);
    pb_close(pb);
    /* rank's finished line, with a newline, after the close */
    all = text(&s);
    assert_int_equal(all[strlen(all) - 1], '\n');
    assert_int_equal(count(all, "\033[K\n"), 2);
    close_sink(&s);
}

static void test_note_intact(void **state)
{
    (void)state;
    sink s;
    progress_bar *pb = open_sink(&s, PB_BAR, 80);
    pb_update(pb, "distill", 5, 10, "step", NULL);
    size_t before = strlen(text(&s));
    pb_note(pb, "distill: step 5 validation loss 1.2345");
    pb_notef(pb, "distill: %s %d\n", "checkpoint", 5);   /* newline not doubled */
    const char *after = text(&s) + before;
    const char *want = "\r\033[Kdistill: step 5 validation loss 1.2345\n\r";
    assert_memory_equal(after, want, strlen(want));
    assert_non_null(strstr(after, "\r\033[Kdistill: checkpoint 5\n\rdistill ["));
    /* the bar is back after each note */
    char line[256];
    last_bar(after, line, sizeof line);
    assert_non_null(strstr(line, "50.0% 5/10 step"));
    pb_close(pb);
    close_sink(&s);

    /* a stage without counts redraws as exactly its name after a note */
    pb = open_sink(&s, PB_BAR, 80);
    pb_update(pb, "load", -1, 0, NULL, NULL);
    pb_note(pb, "load.done: parent loaded");
    assert_string_equal(text(&s), "\rload\033[K\r\033[Kload.done: parent loaded\n\rload\033[K");
    pb_close(pb);
    close_sink(&s);

    pb = open_sink(&s, PB_PLAIN, 0);
    pb_update(pb, "distill", 5, 10, "step", NULL);
    pb_note(pb, "distill: step 5 validation loss 1.2345");
    assert_non_null(strstr(text(&s), "\ndistill: step 5 validation loss 1.2345\n"));
    assert_null(strchr(text(&s), '\r'));
    pb_close(pb);
    close_sink(&s);
}

/* The number of (non-empty) lines of text matching the regex re. */
static int count_matching(const char *all, const char *re)
{
    regex_t rx;
    assert_int_equal(regcomp(&rx, re, REG_EXTENDED | REG_NOSUB), 0);
    int n = 0;
    char *copy = strdup(all);
    assert_non_null(copy);
    for (char *l = copy; *l;) {
        char *nl = strchr(l, '\n');
        if (nl)
            *nl = '\0';
        if (*l)
            n += regexec(&rx, l, 0, NULL, 0) == 0;
        l = nl ? nl + 1 : l + strlen(l);
    }
    free(copy);
    regfree(&rx);
    return n;
}

static void test_plain_interval(void **state)
{
    (void)state;
    sink s;
    progress_bar *pb = open_sink(&s, PB_PLAIN, 0);
    assert_false(pb_is_bar(pb));
    /* 60 s within the first 10% step: a line at the start, then one per 10 s interval */
    double line_at[32];
    int lines = 0;
    size_t len = 0;
    for (int i = 0; i <= 120; i++) {
        s.t = 0.5 * i;
        pb_update(pb, "distill", 10 * i, 100000, "tok", NULL);
        size_t now_len = strlen(text(&s));
        if (now_len != len) {
            assert_true(lines < 32);
            line_at[lines++] = s.t;
            len = now_len;
        }
    }
    assert_int_equal(lines, 7);   /* t = 0, 10, ..., 60 */
    assert_true(line_at[0] == 0.0);
    for (int i = 1; i < lines; i++)
        assert_true(line_at[i] - line_at[i - 1] >= 10.0);
    s.t = 61;
    pb_end_stage(pb, NULL);
    const char *all = text(&s);
    assert_null(strchr(all, '\r'));
    assert_null(strchr(all, '\033'));
    assert_int_equal(count_matching(all, "^\\[[0-9]{2}:[0-9]{2}:[0-9]{2}\\] distill 0% 0/100000 tok ETA --$"), 1);
    assert_int_equal(count_matching(all, "^\\[[0-9]{2}:[0-9]{2}:[0-9]{2}\\] distill 0% 600/100000 tok 20.0 tok/s ETA 1h22m$"), 1);
    assert_int_equal(count_matching(all, "^\\[[0-9:]{8}\\] distill done 1% 1200/100000 tok in 1m01s \\(19.7 tok/s\\)$"), 1);
    assert_int_equal(count_matching(all, ".*"), 8);
    pb_close(pb);   /* nothing more: the stage is already finished */
    assert_int_equal(count_matching(text(&s), ".*"), 8);
    close_sink(&s);
}

static void test_plain_steps(void **state)
{
    (void)state;
    sink s;
    progress_bar *pb = open_sink(&s, PB_PLAIN, 0);
    for (int i = 0; i <= 100; i++) {
        s.t = 0.01 * i;
        pb_update(pb, "evaluate", i, 100, "item", "arc_easy");
    }
    s.t = 2;
    pb_update(pb, "measure", 0, 2, NULL, NULL);   /* a new stage: evaluate's end line, then measure's start */
    pb_close(pb);
    const char *all = text(&s);
    /* start (0%), each 10% step, then the end line */
    assert_int_equal(count_matching(all, "\\] evaluate [0-9]+% [0-9]+/100 item.* arc_easy$"), 11);
    for (int p = 10; p <= 100; p += 10) {
        char re[64];
        snprintf(re, sizeof re, "\\] evaluate %d%% %d/100 item", p, p);
        assert_int_equal(count_matching(all, re), 1);
    }
    assert_int_equal(count_matching(all, "\\] evaluate done 100% 100/100 item in 2.0s \\(50.0 item/s\\) arc_easy$"), 1);
    assert_int_equal(count_matching(all, "\\] measure 0% 0/2 ETA --$"), 1);
    assert_int_equal(count_matching(all, "\\] measure done 0% 0/2 in 0.0s$"), 1);
    close_sink(&s);

    /* a stage without counts (done < 0), then counts: the average covers the whole stage */
    pb = open_sink(&s, PB_PLAIN, 0);
    pb_update(pb, "load", -1, 0, NULL, "reading");
    s.t = 3;
    pb_update(pb, "load", 0, 10, "part", NULL);
    s.t = 4;
    pb_update(pb, "load", 10, 10, "part", NULL);
    pb_close(pb);
    all = text(&s);
    assert_int_equal(count_matching(all, "\\] load reading$"), 1);
    assert_int_equal(count_matching(all, "\\] load done 100% 10/10 part in 4.0s \\(2.50 part/s\\)$"), 1);
    close_sink(&s);

    /* an outcome other than success names itself, in both modes */
    pb = open_sink(&s, PB_PLAIN, 0);
    pb_update(pb, "distill", 3, 10, "step", NULL);
    s.t = 2;
    pb_end_stage(pb, "failed");
    assert_int_equal(count_matching(text(&s), "\\] distill failed 30% 3/10 step in 2.0s$"), 1);
    pb_close(pb);
    close_sink(&s);
    pb = open_sink(&s, PB_BAR, 80);
    pb_update(pb, "distill", 3, 10, "step", NULL);
    s.t = 2;
    pb_end_stage(pb, "cancelled");
    assert_non_null(strstr(text(&s), " 30.0% 3/10 step  cancelled  in 2.0s\033[K\n"));
    pb_close(pb);
    close_sink(&s);
}

/* A burst at the start does not dominate: early on the rate is close to the rate since
 * the stage began (the average is bias-corrected), not the first sample's. */
static void test_rate_early_burst(void **state)
{
    (void)state;
    sink s;
    progress_bar *pb = open_sink(&s, PB_BAR, 100);
    pb_update(pb, "rank", 0, 100, NULL, NULL);
    s.t = 0.3;
    pb_update(pb, "rank", 30, 100, NULL, NULL);   /* 100/s for 0.3 s */
    s.t = 5;
    pb_update(pb, "rank", 31, 100, NULL, NULL);   /* then 1 in 4.7 s: 6.2/s since the start */
    char line[256];
    last_bar(text(&s), line, sizeof line);
    /* weights 1-exp(-0.03) and 1-exp(-0.47): (2.955 + 0.375 (0.213 - 2.955)) / 0.393 = 4.90 */
    assert_non_null(strstr(line, " 31/100  4.90/s  ETA 14s"));
    pb_close(pb);
    close_sink(&s);
}

static void test_auto_mode(void **state)
{
    (void)state;
    sink s;
    unsetenv("AC_PROGRESS");
    progress_bar *pb = open_sink(&s, PB_AUTO, 0);
    assert_false(pb_is_bar(pb));   /* a memstream is no terminal */
    pb_close(pb);
    close_sink(&s);
    setenv("AC_PROGRESS", "bar", 1);
    pb = open_sink(&s, PB_AUTO, 0);
    assert_true(pb_is_bar(pb));
    pb_close(pb);
    close_sink(&s);
    pb = open_sink(&s, PB_PLAIN, 0);   /* an explicit mode wins over the environment */
    assert_false(pb_is_bar(pb));
    pb_close(pb);
    close_sink(&s);
    unsetenv("AC_PROGRESS");
    /* NULL is a no-op everywhere */
    pb_update(NULL, "x", 1, 2, NULL, NULL);
    pb_end_stage(NULL, "failed");
    pb_close(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bar_steady_rate_eta), cmocka_unit_test(test_bar_rate_limit),
        cmocka_unit_test(test_bar_stage_change_and_width), cmocka_unit_test(test_note_intact),
        cmocka_unit_test(test_plain_interval), cmocka_unit_test(test_plain_steps),
        cmocka_unit_test(test_rate_early_burst), cmocka_unit_test(test_auto_mode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
