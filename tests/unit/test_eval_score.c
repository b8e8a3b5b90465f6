/* tests/unit/test_eval_score.c — the scoring logic of compress/eval.c against a fake
 * model (byte tokenizer, scripted log-likelihoods): acc / acc_norm arithmetic and
 * stderr, the harness's _encode_pair (trailing context whitespace moves to the
 * continuation, BOS, empty contexts), left truncation and its count, rolling windows,
 * perplexities, MMLU macro averaging, cancellation, a scorer failure, and the JSON.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compress/eval.h"

/* ---- the fake model ------------------------------------------------------------------ */

typedef struct {
    int calls, requests;
    double per_token;          /* ll = per_token * n_cont (when no script) */
    int fail;
    int greedy_all;
    int check_text;            /* verify every request's tokens are bytes of known text */
    int max_seen;              /* longest n_ctx + n_cont - 1 */
} fake;

static int byte_tokenize(void *user, const char *text, size_t len, int **ids, int *n, char *err, size_t errlen)
{
    (void)user;
    (void)err;
    (void)errlen;
    *ids = malloc((len ? len : 1) * sizeof **ids);
    if (!*ids)
        return -1;
    for (size_t i = 0; i < len; i++)
        (*ids)[i] = (unsigned char)text[i];
    *n = (int)len;
    return 0;
}

static int fake_loglik(void *user, ev_request *reqs, int n, char *err, size_t errlen)
{
    fake *f = user;
    f->calls++;
    if (f->fail) {
        snprintf(err, errlen, "device lost");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        f->requests++;
        int in = reqs[i].n_ctx + reqs[i].n_cont - 1;
        if (in > f->max_seen)
            f->max_seen = in;
        reqs[i].ll = f->per_token * reqs[i].n_cont;
        reqs[i].greedy = f->greedy_all;
    }
    return 0;
}

static ev_model fake_model(fake *f, int max_len)
{
    ev_model m = {.tokenize = byte_tokenize, .loglik = fake_loglik, .user = f, .prefix_token = 1,
                  .add_bos = 0, .max_len = max_len};
    return m;
}

/* ---- building tasks in memory -------------------------------------------------------- */

static void add_item(ev_task *t, const char *ctx, int n, const char *const *conts, const int *norms, int gold,
                     int group)
{
    t->items = realloc(t->items, (size_t)(t->n_items + 1) * sizeof *t->items);
    assert_non_null(t->items);
    ev_item *it = &t->items[t->n_items++];
    memset(it, 0, sizeof *it);
    it->ctx = strdup(ctx);
    it->n_choices = n;
    it->choices = calloc((size_t)n, sizeof *it->choices);
    for (int c = 0; c < n; c++) {
        it->choices[c].cont = strdup(conts[c]);
        it->choices[c].norm_len = norms[c];
    }
    it->gold = gold;
    it->line = t->n_items;
    it->group = group;
}

static void test_acc_norm_arithmetic(void **state)
{
    (void)state;
    /* ll = -0.5 per continuation token (bytes): " a" -1.0, " bbbb" -2.5, " cc" -1.5, " d" -1.0 */
    ev_task t = {.kind = EV_KIND_MC, .report_acc_norm = 1};
    snprintf(t.name, sizeof t.name, "toy");
    const char *c1[] = {" a", " bbbb"};
    const int n1[] = {1, 4};
    add_item(&t, "Q1", 2, c1, n1, 1, 0);   /* acc: picks 0 (wrong); norm: -1/1 vs -2.5/4 -> 1 (right) */
    const char *c2[] = {" cc", " d"};
    const int n2[] = {2, 1};
    add_item(&t, "Q2", 2, c2, n2, 0, 0);   /* acc: -1.5 vs -1.0 -> 1 (wrong); norm: -0.75 vs -1.0 -> 0 (right) */
    const char *c3[] = {" e", " ff", " g"};
    const int n3[] = {1, 2, 1};
    add_item(&t, "Q3", 3, c3, n3, 0, 0);   /* acc: tie -1.0/-1.0 -> first (0, right); norm: -1,-0.75,-1 -> 1 (wrong) */
    fake f = {.per_token = -0.5};
    ev_model m = fake_model(&f, 64);
    ev_result r;
    assert_int_equal(ev_run_task(&m, &t, NULL, &r), 0);
    assert_true(r.ok);
    assert_int_equal(r.n, 3);
    assert_int_equal(f.requests, 7);
    assert_true(r.has_acc && r.has_acc_norm && !r.has_ppl);
    assert_true(fabs(r.acc - 1.0 / 3) < 1e-12);
    assert_true(fabs(r.acc_norm - 2.0 / 3) < 1e-12);
    /* sample std (ddof 1) of {0,0,1} is sqrt(1/3); / sqrt(3) = 1/3 */
    assert_true(fabs(r.acc_stderr - 1.0 / 3) < 1e-12);
    assert_true(fabs(r.acc_norm_stderr - 1.0 / 3) < 1e-12);
    json_t *j = ev_result_json(&r);
    assert_non_null(j);
    assert_true(fabs(json_real_value(json_object_get(j, "acc_norm")) - 2.0 / 3) < 1e-12);
    assert_int_equal(json_integer_value(json_object_get(j, "n")), 3);
    json_decref(j);
    ev_result_free(&r);
    ev_task_free(&t);

    double x[4] = {1, 1, 0, 1};
    assert_true(fabs(ev_stderr(x, 4) - sqrt(0.1875 * 4 / 3) / 2) < 1e-12);
    double ll[3] = {-3.0, -2.0, -2.0};
    int norm[3] = {1, 4, 1};
    assert_int_equal(ev_argmax_norm(ll, NULL, 3), 1);
    assert_int_equal(ev_argmax_norm(ll, norm, 3), 1);   /* -3, -0.5, -2 */
}

static void test_encode_pair(void **state)
{
    (void)state;
    fake f = {0};
    ev_model m = fake_model(&f, 64);
    int *c, *w, nc, nw;
    char err[128];
    /* trailing whitespace of the context moves to the continuation */
    assert_int_equal(ev_encode_pair(&m, "Answer: ", "B", &c, &nc, &w, &nw, err, sizeof err), 0);
    assert_int_equal(nc, 7);
    assert_int_equal(c[6], ':');
    assert_int_equal(nw, 2);
    assert_int_equal(w[0], ' ');
    assert_int_equal(w[1], 'B');
    free(c);
    free(w);
    /* empty context: the prefix token */
    assert_int_equal(ev_encode_pair(&m, "", " x", &c, &nc, &w, &nw, err, sizeof err), 0);
    assert_int_equal(nc, 1);
    assert_int_equal(c[0], 1);
    assert_int_equal(nw, 2);
    free(c);
    free(w);
    /* add_bos: the prefix starts every context */
    m.add_bos = 1;
    assert_int_equal(ev_encode_pair(&m, "ab", " c", &c, &nc, &w, &nw, err, sizeof err), 0);
    assert_int_equal(nc, 3);
    assert_int_equal(c[0], 1);
    assert_int_equal(c[1], 'a');
    free(c);
    free(w);
    assert_int_equal(ev_encode_pair(&m, "ab", "", &c, &nc, &w, &nw, err, sizeof err), -1);
    assert_non_null(strstr(err, "nothing"));
}

static void test_truncation(void **state)
{
    (void)state;
    ev_task t = {.kind = EV_KIND_MC, .report_acc_norm = 1};
    snprintf(t.name, sizeof t.name, "long");
    const char *c[] = {" xy", " z"};
    const int n[] = {2, 1};
    add_item(&t, "0123456789", 2, c, n, 0, 0);   /* 10 + 3 tokens: input 12 > 8 */
    add_item(&t, "01", 2, c, n, 0, 0);           /* fits */
    fake f = {.per_token = -1.0};
    ev_model m = fake_model(&f, 8);
    ev_result r;
    assert_int_equal(ev_run_task(&m, &t, NULL, &r), 0);
    assert_int_equal(r.truncated, 1);
    assert_true(f.max_seen <= 8);
    assert_int_equal(f.max_seen, 8);
    /* "0123456789"+" xy": 13 tokens, 9 kept (8 inputs + the last target); +" z": 12 -> 9;
     * "01"+" xy": 5; "01"+" z": 4 */
    assert_int_equal(r.tokens, 9 + 9 + 5 + 4);
    ev_result_free(&r);
    ev_task_free(&t);
}

static void test_rolling(void **state)
{
    (void)state;
    int *cs, *cl, *ps, *pl;
    int nw = ev_rolling_windows(10, 4, &cs, &cl, &ps, &pl);
    assert_int_equal(nw, 3);
    int want[3][4] = {{-1, 1, 0, 4}, {3, 1, 4, 4}, {5, 3, 8, 2}};
    for (int w = 0; w < 3; w++) {
        assert_int_equal(cs[w], want[w][0]);
        assert_int_equal(cl[w], want[w][1]);
        assert_int_equal(ps[w], want[w][2]);
        assert_int_equal(pl[w], want[w][3]);
        /* every window's model input (context + predicted[:-1]) fits max_len */
        assert_true(cl[w] + pl[w] - 1 <= 4);
    }
    free(cs);
    free(cl);
    free(ps);
    free(pl);
    assert_int_equal(ev_rolling_windows(3, 4, &cs, &cl, &ps, &pl), 1);
    assert_int_equal(pl[0], 3);
    free(cs);
    free(cl);
    free(ps);
    free(pl);

    /* perplexities: ll = -1 nat per predicted token */
    ev_task t = {.kind = EV_KIND_ROLLING};
    snprintf(t.name, sizeof t.name, "wiki");
    const char *doc[] = {"ab cd\nefgh ij"};   /* 13 bytes, 3 words */
    const int nn[] = {13};
    add_item(&t, "", 1, doc, nn, 0, 0);
    t.items[0].words = 3;
    t.items[0].bytes = 13;
    fake f = {.per_token = -1.0};
    ev_model m = fake_model(&f, 4);
    ev_result r;
    assert_int_equal(ev_run_task(&m, &t, NULL, &r), 0);
    assert_true(r.has_rolling);
    assert_int_equal(r.requests, 4);   /* 13 tokens in windows of 4 */
    assert_true(fabs(r.word_perplexity - exp(13.0 / 3)) < 1e-9);
    assert_true(fabs(r.byte_perplexity - exp(1.0)) < 1e-9);
    assert_true(fabs(r.bits_per_byte - 1.0 / log(2.0)) < 1e-9);
    assert_true(fabs(r.token_perplexity - exp(1.0)) < 1e-9);
    ev_result_free(&r);
    ev_task_free(&t);
}

static void test_loglik_task(void **state)
{
    (void)state;
    ev_task t = {.kind = EV_KIND_LOGLIK};
    snprintf(t.name, sizeof t.name, "lambada_toy");
    const char *c1[] = {" dog"};
    const int n1[] = {3};
    add_item(&t, "the", 1, c1, n1, 0, 0);
    add_item(&t, "a", 1, c1, n1, 0, 0);
    fake f = {.per_token = -0.25, .greedy_all = 1};
    ev_model m = fake_model(&f, 64);
    ev_result r;
    assert_int_equal(ev_run_task(&m, &t, NULL, &r), 0);
    assert_true(r.has_acc && r.has_ppl && !r.has_acc_norm);
    assert_true(fabs(r.acc - 1.0) < 1e-12);
    assert_true(fabs(r.perplexity - exp(1.0)) < 1e-12);   /* mean ll = -4 * 0.25 */
    ev_result_free(&r);
    ev_task_free(&t);
}

/* A model that gives NaN fails the task with the reason (it used to "score" the share of
 * gold answers at choice 0); a perplexity that overflows is left out rather than making the
 * results unwritable; a task with no items is not a measured 0. */
static void test_nonfinite_and_empty(void **state)
{
    (void)state;
    ev_task t = {.kind = EV_KIND_MC};
    snprintf(t.name, sizeof t.name, "toy");
    const char *c[] = {" a", " b"};
    const int n[] = {1, 1};
    add_item(&t, "q", 2, c, n, 0, 0);
    fake f = {.per_token = NAN};
    ev_model m = fake_model(&f, 64);
    ev_result r;
    assert_int_equal(ev_run_task(&m, &t, NULL, &r), -1);
    assert_false(r.ok);
    assert_non_null(strstr(r.error, "not a finite number"));
    ev_result_free(&r);
    ev_task_free(&t);

    ev_task l = {.kind = EV_KIND_LOGLIK};
    snprintf(l.name, sizeof l.name, "long_toy");
    const char *c1[] = {" a long continuation of many bytes"};
    const int n1[] = {34};
    add_item(&l, "ctx", 1, c1, n1, 0, 0);
    f = (fake){.per_token = -30.0};   /* 34 tokens: -1020, exp(1020) overflows */
    m = fake_model(&f, 64);
    assert_int_equal(ev_run_task(&m, &l, NULL, &r), 0);
    assert_true(r.ok && r.has_acc && !r.has_ppl);
    json_t *j = ev_result_json(&r);
    assert_non_null(j);
    assert_null(json_object_get(j, "perplexity"));
    json_decref(j);
    ev_result_free(&r);
    ev_task_free(&l);

    ev_task e = {.kind = EV_KIND_MC};
    snprintf(e.name, sizeof e.name, "empty");
    assert_int_equal(ev_run_task(&m, &e, NULL, &r), -1);
    assert_false(r.ok);
    assert_non_null(strstr(r.error, "no items"));
    ev_result_free(&r);
}

static void test_groups_macro(void **state)
{
    (void)state;
    ev_task t = {.kind = EV_KIND_MC, .n_groups = 2};
    snprintf(t.name, sizeof t.name, "mmlu");
    t.groups = calloc(2, sizeof *t.groups);
    t.groups[0] = strdup("anatomy");
    t.groups[1] = strdup("virology");
    /* " A" and " BB": ll -1 vs -1.5 per token at -0.5: the model always picks choice 0 */
    const char *c[] = {" A", " BB"};
    const int n[] = {1, 2};
    add_item(&t, "q", 2, c, n, 0, 0);
    add_item(&t, "q", 2, c, n, 0, 0);
    add_item(&t, "q", 2, c, n, 0, 1);
    add_item(&t, "q", 2, c, n, 1, 1);
    add_item(&t, "q", 2, c, n, 1, 1);
    add_item(&t, "q", 2, c, n, 1, 1);
    fake f = {.per_token = -0.5};
    ev_model m = fake_model(&f, 64);
    ev_result r;
    assert_int_equal(ev_run_task(&m, &t, NULL, &r), 0);
    assert_int_equal(r.n_groups, 2);
    assert_true(fabs(r.groups[0].acc - 1.0) < 1e-12);
    assert_true(fabs(r.groups[1].acc - 0.25) < 1e-12);
    assert_true(fabs(r.acc - 0.625) < 1e-12);   /* macro, not the micro 0.5 */
    assert_false(r.has_acc_norm);
    double se1 = sqrt(0.25 * 0.75 * 4 / 3) / 2;
    assert_true(fabs(r.acc_stderr - sqrt(se1 * se1) / 2) < 1e-12);
    json_t *j = ev_results_json(&r, 1);
    assert_non_null(j);
    assert_true(fabs(json_real_value(json_object_get(j, "average")) - 0.625) < 1e-12);
    assert_non_null(json_object_get(json_object_get(json_object_get(j, "tasks"), "mmlu"), "subjects"));
    json_decref(j);
    ev_result_free(&r);
    ev_task_free(&t);
}

/* A task name of 64 bytes (the spec's limit), multi-byte characters to the end, is kept
 * whole in the results: cut short inside a character, it was invalid UTF-8 and the
 * results could not be written at all. */
static void test_long_task_name(void **state)
{
    (void)state;
    char name[EV_TASK_NAME_MAX + 1] = "a";
    for (int i = 0; i < 21; i++)
        memcpy(name + 1 + 3 * i, "\xe2\x82\xac", 4);   /* U+20AC, and the NUL after the last */
    assert_int_equal(strlen(name), 64);
    ev_result r;
    memset(&r, 0, sizeof r);
    memcpy(r.task, name, sizeof name);
    r.ok = 1;
    r.n = 1;
    r.has_acc = 1;
    r.acc = 1.0;
    json_t *j = ev_results_json(&r, 1);
    assert_non_null(j);
    assert_non_null(json_object_get(json_object_get(j, "tasks"), name));
    json_decref(j);
}

static int cancel_after_first(void *user, const char *task, int64_t done, int64_t total)
{
    (void)task;
    (void)total;
    int *calls = user;
    (*calls)++;
    return done >= 2;
}

static void test_cancel_and_failure(void **state)
{
    (void)state;
    ev_task t = {.kind = EV_KIND_MC};
    snprintf(t.name, sizeof t.name, "toy");
    const char *c[] = {" a", " b"};
    const int n[] = {1, 1};
    for (int i = 0; i < 6; i++)
        add_item(&t, "q", 2, c, n, 0, 0);
    fake f = {.per_token = -1};
    ev_model m = fake_model(&f, 64);
    int calls = 0;
    ev_opts o = {.chunk_items = 2, .progress = cancel_after_first, .progress_user = &calls};
    ev_result r;
    assert_int_equal(ev_run_task(&m, &t, &o, &r), 1);
    assert_int_equal(calls, 1);
    assert_int_equal(f.calls, 1);   /* stopped before scoring the rest */
    assert_false(r.ok);
    ev_result_free(&r);
    f.fail = 1;
    assert_int_equal(ev_run_task(&m, &t, NULL, &r), -1);
    assert_false(r.ok);
    assert_non_null(strstr(r.error, "device lost"));
    json_t *j = ev_result_json(&r);
    assert_false(json_is_true(json_object_get(j, "ok")));
    json_decref(j);
    ev_result_free(&r);
    ev_task_free(&t);

    /* a task that cannot load is reported, the next one still runs */
    f.fail = 0;
    ev_result rs[2];
    assert_int_equal(ev_run_named(&m, "/nonexistent/x.jsonl", ".", NULL, NULL, &rs[0]), -1);
    assert_false(rs[0].ok);
    assert_non_null(strstr(rs[0].error, "/nonexistent/x.jsonl"));
    ev_result_free(&rs[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_acc_norm_arithmetic), cmocka_unit_test(test_encode_pair),
        cmocka_unit_test(test_truncation),          cmocka_unit_test(test_rolling),
        cmocka_unit_test(test_loglik_task),         cmocka_unit_test(test_groups_macro),
        cmocka_unit_test(test_nonfinite_and_empty),
        cmocka_unit_test(test_cancel_and_failure),  cmocka_unit_test(test_long_task_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
