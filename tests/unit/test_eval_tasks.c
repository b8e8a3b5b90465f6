/* tests/unit/test_eval_tasks.c — benchmark loaders on real rows of shared/data/eval:
 * the exact prompt strings and continuations lm-evaluation-harness builds for them
 * (hand-written below from the harness templates), MMLU few-shot assembly, the CSV
 * parser, the generic JSONL format, malformed-file errors naming file/line/field,
 * seeded sampling and the WikiText detokenizer. Needs $AC_SHARED/data (or ../shared/data).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "compress/csv.h"
#include "compress/evaltasks.h"
#include "jobs/stages.h"

static char data_dir[1024];

static const char *dpath(const char *rel)
{
    static char p[4][1200];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", data_dir, rel);
    return p[k];
}

static const char *ctx_of(const ev_item *it, int c)
{
    return it->choices[c].ctx ? it->choices[c].ctx : it->ctx;
}

/* Write text to a fresh temporary file; returns its path (static buffer). */
static const char *tmpfile_with(const char *text)
{
    static char path[4][64];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "/tmp/test_eval_tasks_XXXXXX");
    int fd = mkstemp(path[k]);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
    return path[k];
}

static void test_arc_easy_foundry(void **state)
{
    (void)state;
    ev_task t;
    char err[512];
    assert_int_equal(ev_task_load("arc_easy", data_dir, NULL, &t, err, sizeof err), 0);
    assert_int_equal(t.n_items, 1584);
    assert_int_equal(t.kind, EV_KIND_MC);
    assert_true(t.report_acc_norm);
    const ev_item *it = &t.items[0];
    assert_string_equal(ctx_of(it, 0), "Question: Which statement best explains why photosynthesis is the "
                                       "foundation of most food webs?\nAnswer:");
    assert_int_equal(it->n_choices, 4);
    assert_string_equal(it->choices[0].cont, " Sunlight is the source of energy for nearly all ecosystems.");
    assert_string_equal(it->choices[3].cont, " The producers in all ecosystems are plants.");
    assert_int_equal(it->choices[3].norm_len, (int)strlen("The producers in all ecosystems are plants."));
    assert_int_equal(it->gold, 0);
    assert_int_equal(it->line, 1);
    ev_task_free(&t);

    assert_int_equal(ev_task_load("arc_challenge", data_dir, NULL, &t, err, sizeof err), 0);
    assert_int_equal(t.n_items, 1172);
    assert_string_equal(t.items[0].ctx, "Question: An astronomer observes that a planet rotates faster after a "
                                        "meteorite impact. Which is the most likely effect of this increase in "
                                        "rotation?\nAnswer:");
    assert_string_equal(t.items[0].choices[2].cont, " Planetary days will become shorter.");
    assert_int_equal(t.items[0].gold, 2);
    ev_task_free(&t);
}

static void test_arc_ai2_numeric_labels(void **state)
{
    (void)state;
    ev_task t;
    char err[512];
    assert_int_equal(ev_load_arc(dpath("eval/arc_challenge/ARC-Challenge-Dev.jsonl"), "arc_challenge", &t, err,
                                 sizeof err), 0);
    assert_int_equal(t.n_items, 299);
    /* row 1 */
    assert_string_equal(t.items[0].ctx, "Question: Juan and LaKeisha roll a few objects down a ramp. They want to "
                                        "see which object rolls the farthest. What should they do so they can "
                                        "repeat their investigation?\nAnswer:");
    assert_string_equal(t.items[0].choices[3].cont, " Record the details of the investigation.");
    assert_int_equal(t.items[0].gold, 3);
    /* row 90 uses labels "1".."4" and answerKey "2" */
    const ev_item *it = &t.items[89];
    assert_int_equal(it->line, 90);
    assert_int_equal(it->gold, 1);
    assert_string_equal(it->choices[1].cont, " equal to the total mass of the products");
    ev_task_free(&t);
}

static void test_piqa(void **state)
{
    (void)state;
    ev_task t;
    char err[512];
    assert_int_equal(ev_task_load("piqa", data_dir, NULL, &t, err, sizeof err), 0);
    assert_int_equal(t.n_items, 1838);
    assert_string_equal(t.items[0].ctx, "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:");
    assert_int_equal(t.items[0].gold, 0);
    const ev_item *it = &t.items[1];
    assert_string_equal(it->ctx, "Question: dresser\nAnswer:");
    assert_string_equal(it->choices[0].cont, " replace drawer with bobby pin ");
    assert_string_equal(it->choices[1].cont, " finish, woodgrain with  bobby pin ");
    assert_int_equal(it->choices[1].norm_len, 34);
    assert_int_equal(it->gold, 1);
    ev_task_free(&t);
}

static void test_hellaswag(void **state)
{
    (void)state;
    ev_task t;
    char err[512];
    assert_int_equal(ev_task_load("hellaswag", data_dir, NULL, &t, err, sizeof err), 0);
    assert_int_equal(t.n_items, 6695);
    const ev_item *it = &t.items[0];
    assert_string_equal(it->ctx, "Roof shingle removal: A man is sitting on a roof. he");
    assert_string_equal(it->choices[0].cont, " is using wrap to wrap a pair of skis.");
    assert_string_equal(it->choices[3].cont, " starts pulling up roofing on a roof.");
    assert_int_equal(it->gold, 3);
    assert_int_equal(t.items[1].line, 7);
    assert_string_equal(t.items[1].ctx, "Clean and jerk: A lady walks to a barbell. She bends down and grabs the "
                                        "pole. the lady");
    assert_string_equal(t.items[1].choices[3].cont, " stands and lifts the weight over her head.");
    ev_task_free(&t);
}

static void test_winogrande_partial(void **state)
{
    (void)state;
    ev_task t;
    char err[512];
    assert_int_equal(ev_task_load("winogrande", data_dir, NULL, &t, err, sizeof err), 0);
    assert_int_equal(t.n_items, 1267);
    assert_false(t.report_acc_norm);
    const ev_item *it = &t.items[0];
    /* partial scoring: the option-filled prefix is the context, the shared rest the target */
    assert_string_equal(it->choices[0].ctx, "Sarah was a much better surgeon than Maria so Sarah");
    assert_string_equal(it->choices[1].ctx, "Sarah was a much better surgeon than Maria so Maria");
    assert_string_equal(it->choices[0].cont, " always got the easier cases.");
    assert_string_equal(it->choices[1].cont, " always got the easier cases.");
    assert_int_equal(it->gold, 1);
    ev_task_free(&t);

    /* the original release format gives the same strings */
    const char *p = tmpfile_with("{\"sentence\": \"Sarah was a much better surgeon than Maria so _ always got the "
                                 "easier cases.\", \"option1\": \"Sarah\", \"option2\": \"Maria\", \"answer\": \"2\"}\n");
    assert_int_equal(ev_load_winogrande(p, &t, err, sizeof err), 0);
    assert_string_equal(t.items[0].choices[1].ctx, "Sarah was a much better surgeon than Maria so Maria");
    assert_string_equal(t.items[0].choices[0].cont, " always got the easier cases.");
    assert_int_equal(t.items[0].gold, 1);
    ev_task_free(&t);
    unlink(p);
}

static void test_boolq(void **state)
{
    (void)state;
    ev_task t;
    char err[512];
    assert_int_equal(ev_task_load("boolq", data_dir, NULL, &t, err, sizeof err), 0);
    assert_int_equal(t.n_items, 3270);
    const ev_item *it = &t.items[1];
    const char *tail = "with about 80% of assessments falling in the first two brackets.\nQuestion: is house tax "
                       "and property tax are same?\nAnswer:";
    assert_int_equal(strncmp(it->ctx, "Property tax or 'house tax' is a local tax on buildings", 55), 0);
    size_t n = strlen(it->ctx), m = strlen(tail);
    assert_true(n > m);
    assert_string_equal(it->ctx + n - m, tail);
    assert_string_equal(it->choices[0].cont, " no");
    assert_string_equal(it->choices[1].cont, " yes");
    assert_int_equal(it->gold, 1);
    assert_int_equal(t.items[0].gold, 0);
    ev_task_free(&t);
}

static void test_openbookqa(void **state)
{
    (void)state;
    ev_task t;
    char err[512];
    assert_int_equal(ev_task_load("openbookqa", data_dir, NULL, &t, err, sizeof err), 0);
    assert_int_equal(t.n_items, 500);
    const ev_item *it = &t.items[0];
    assert_string_equal(it->ctx, "A person wants to start saving money so that they can afford a nice vacation at "
                                 "the end of the year. After looking over their budget and expenses, they decide "
                                 "the best way to save money is to");
    assert_string_equal(it->choices[1].cont, " quit eating lunch out");
    assert_int_equal(it->gold, 1);
    ev_task_free(&t);
}

static void test_lambada(void **state)
{
    (void)state;
    ev_task t;
    char err[512];
    assert_int_equal(ev_task_load("lambada_openai", data_dir, NULL, &t, err, sizeof err), 0);
    assert_int_equal(t.n_items, 5153);
    assert_int_equal(t.kind, EV_KIND_LOGLIK);
    const ev_item *it = &t.items[0];
    const char *tail = "his mouth curved in a confident grin, I don't care about";
    size_t n = strlen(it->ctx), m = strlen(tail);
    assert_string_equal(it->ctx + n - m, tail);
    assert_int_equal(strncmp(it->ctx, "In my palm is a clear stone, and inside it is a small ivory statuette. A "
                                      "guardian angel.\n\n\"Figured if", 92), 0);
    assert_string_equal(it->choices[0].cont, " signs");
    ev_task_free(&t);
}

/* SciQ from the support CSV: no distractors in this data (PROVENANCE.md), so each item
 * is the gold answer's log-likelihood under the harness's prompt. */
static void test_sciq(void **state)
{
    (void)state;
    ev_task t;
    char err[512];
    assert_int_equal(ev_task_load("sciq", data_dir, NULL, &t, err, sizeof err), 0);
    assert_string_equal(t.name, "sciq");
    assert_int_equal(t.n_items, 884);
    assert_int_equal(t.kind, EV_KIND_LOGLIK);
    assert_false(t.report_acc_norm);
    const ev_item *it = &t.items[0];
    assert_string_equal(it->ctx,
                        "Oxidants and Reductants Compounds that are capable of accepting electrons, such as O 2 or "
                        "F2, are calledoxidants (or oxidizing agents) because they can oxidize other compounds. In "
                        "the process of accepting electrons, an oxidant is reduced. Compounds that are capable of "
                        "donating electrons, such as sodium metal or cyclohexane (C6H12), are calledreductants (or "
                        "reducing agents) because they can cause the reduction of another compound. In the process "
                        "of donating electrons, a reductant is oxidized. These relationships are summarized in "
                        "Equation 3.30: Equation 3.30 Saylor URL: http://www. saylor. org/books.\n"
                        "Question: Compounds that are capable of accepting electrons, such as o 2 or f2, are called "
                        "what?\nAnswer:");
    assert_int_equal(it->n_choices, 1);
    assert_string_equal(it->choices[0].cont, " oxidants");
    assert_int_equal(it->choices[0].norm_len, 8);
    assert_int_equal(it->line, 2);   /* line 1 is the header */
    assert_string_equal(t.items[883].choices[0].cont, " sulfur dioxide (so2)");
    ev_task_free(&t);
}

/* SciQ in the full release's columns (any order, extra columns ignored): the harness's
 * multiple choice, [distractor1, distractor2, distractor3, correct_answer], gold 3,
 * support.lstrip(); a header with only some distractors is refused. */
static void test_sciq_multiple_choice(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_eval_sciq_XXXXXX", sub[128], csv[192];
    assert_non_null(mkdtemp(dir));
    snprintf(sub, sizeof sub, "%s/eval", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    snprintf(sub, sizeof sub, "%s/eval/sciq", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    snprintf(csv, sizeof csv, "%s/sciq_test_support.csv", sub);
    FILE *f = fopen(csv, "w");
    assert_non_null(f);
    fputs("question,distractor3,distractor1,distractor2,correct_answer,support,id\n"
          "\"What gas do plants take in?\",nitrogen,oxygen,helium,carbon dioxide,"
          "\"  Plants take in carbon dioxide.\",7\n"
          "What is H2O?,salt,sand,air,water,,8\n", f);
    assert_int_equal(fclose(f), 0);
    ev_task t;
    char err[512];
    assert_int_equal(ev_task_load("sciq", dir, NULL, &t, err, sizeof err), 0);
    assert_int_equal(t.kind, EV_KIND_MC);
    assert_true(t.report_acc_norm);
    assert_int_equal(t.n_items, 2);
    const ev_item *it = &t.items[0];
    assert_string_equal(it->ctx, "Plants take in carbon dioxide.\nQuestion: What gas do plants take in?\nAnswer:");
    assert_int_equal(it->n_choices, 4);
    assert_string_equal(it->choices[0].cont, " oxygen");
    assert_string_equal(it->choices[1].cont, " helium");
    assert_string_equal(it->choices[2].cont, " nitrogen");
    assert_string_equal(it->choices[3].cont, " carbon dioxide");
    assert_int_equal(it->choices[3].norm_len, 14);
    assert_int_equal(it->gold, 3);
    assert_string_equal(t.items[1].ctx, "\nQuestion: What is H2O?\nAnswer:");   /* empty support, as the harness */
    ev_task_free(&t);

    f = fopen(csv, "w");
    assert_non_null(f);
    fputs("question,distractor1,correct_answer,support\nq,a,b,c\n", f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(ev_task_load("sciq", dir, NULL, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "distractor2"));
    f = fopen(csv, "w");
    assert_non_null(f);
    fputs("question,correct_answer\nq,a\n", f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(ev_task_load("sciq", dir, NULL, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "support"));
    f = fopen(csv, "w");
    assert_non_null(f);
    fputs("question,correct_answer,support\nq,,s\n", f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(ev_task_load("sciq", dir, NULL, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, ":2: field 'correct_answer'"));
    assert_int_equal(unlink(csv), 0);
    assert_int_equal(rmdir(sub), 0);
    snprintf(sub, sizeof sub, "%s/eval", dir);
    assert_int_equal(rmdir(sub), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* Every built-in task name loads from the shared data. */
static void test_builtin_all_load(void **state)
{
    (void)state;
    for (int i = 0; ev_builtin_tasks[i]; i++) {
        ev_task t;
        char err[512] = "";
        if (ev_task_load(ev_builtin_tasks[i], data_dir, NULL, &t, err, sizeof err))
            fail_msg("%s: %s", ev_builtin_tasks[i], err);
        assert_true(t.n_items > 0);
        ev_task_free(&t);
    }
}

static void test_mmlu_fewshot(void **state)
{
    (void)state;
    ev_task t;
    char err[512];
    char hdr[256];
    assert_int_equal(ev_mmlu_header("high_school_us_history", hdr, sizeof hdr), 0);
    assert_string_equal(hdr, "The following are multiple choice questions (with answers) about high school us "
                             "history.\n\n");
    assert_int_equal(ev_load_mmlu(dpath("eval/mmlu"), 2, "abstract_algebra", &t, err, sizeof err), 0);
    assert_int_equal(t.n_groups, 1);
    assert_string_equal(t.groups[0], "abstract_algebra");
    assert_true(t.n_items > 50);
    const char *want =
        "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
        "Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field.\nA. 0\nB. 1\nC. 2\nD. 3\nAnswer: B\n\n"
        "Statement 1 | If aH is an element of a factor group, then |aH| divides |a|. Statement 2 | If H and K are "
        "subgroups of G then HK is a subgroup of G.\nA. True, True\nB. False, False\nC. True, False\n"
        "D. False, True\nAnswer: B\n\n"
        "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\nA. 0\nB. 4\nC. 2\n"
        "D. 6\nAnswer:";
    assert_string_equal(t.items[0].ctx, want);
    assert_string_equal(t.items[0].choices[0].cont, " A");
    assert_string_equal(t.items[0].choices[3].cont, " D");
    assert_int_equal(t.items[0].gold, 1);
    ev_task_free(&t);

    /* the default is 5-shot over all 57 subjects, each item's context has 5 answers */
    assert_int_equal(ev_task_load("mmlu", data_dir, NULL, &t, err, sizeof err), 0);
    assert_int_equal(t.n_groups, 57);
    assert_int_equal(t.n_fewshot, 5);
    int answers = 0;
    for (const char *p = t.items[0].ctx; (p = strstr(p, "\nAnswer: ")); p++)
        answers++;
    assert_int_equal(answers, 5);
    ev_task_free(&t);

    /* few-shot for tasks without a training split is refused, not ignored */
    ev_load_opts lo = {.n_fewshot = 3};
    assert_int_equal(ev_task_load("arc_easy", data_dir, &lo, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "few-shot"));
}

static void test_csv(void **state)
{
    (void)state;
    csv_table t;
    char err[256];
    const char *s = "a,\"b,1\",\"say \"\"hi\"\"\"\r\n\"multi\nline\",x,\n\nlast,row";
    assert_int_equal(csv_parse(s, strlen(s), &t, err, sizeof err), 0);
    assert_int_equal(t.n_records, 3);
    assert_int_equal(t.records[0].n_fields, 3);
    assert_string_equal(t.records[0].fields[1], "b,1");
    assert_string_equal(t.records[0].fields[2], "say \"hi\"");
    assert_string_equal(t.records[1].fields[0], "multi\nline");
    assert_string_equal(t.records[1].fields[2], "");
    assert_int_equal(t.records[1].line, 2);
    assert_int_equal(t.records[2].line, 5);
    assert_string_equal(t.records[2].fields[1], "row");
    csv_free(&t);
    const char *bad = "a,b\n\"open,c\n";
    assert_int_equal(csv_parse(bad, strlen(bad), &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "line 2"));
    const char *bad2 = "a,\"b\"x\n";
    assert_int_equal(csv_parse(bad2, strlen(bad2), &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "after a closing quote"));
    /* every MMLU test file parses into 6-field records */
    assert_int_equal(csv_parse_file(dpath("eval/mmlu/test/high_school_european_history_test.csv"), &t, err,
                                    sizeof err), 0);
    assert_true(t.n_records > 100);
    for (int i = 0; i < t.n_records; i++)
        assert_int_equal(t.records[i].n_fields, 6);
    csv_free(&t);
}

static void test_generic_jsonl(void **state)
{
    (void)state;
    ev_task t;
    char err[512];
    const char *p = tmpfile_with("{\"context\": \"2+2=\", \"choices\": [\" 4\", \" 5\"], \"gold\": 0}\n"
                                 "\n{\"context\": \"Sky is\", \"choices\": [\" blue\", \" green\", \" red\"], \"gold\": 0}\n");
    assert_int_equal(ev_load_jsonl(p, "mine", &t, err, sizeof err), 0);
    assert_string_equal(t.name, "mine");
    assert_int_equal(t.kind, EV_KIND_MC);
    assert_int_equal(t.n_items, 2);
    assert_int_equal(t.items[1].line, 3);
    assert_string_equal(t.items[1].choices[2].cont, " red");
    assert_int_equal(t.items[1].choices[2].norm_len, 3);   /* " red": lm-eval's len("red") after the delimiter */
    assert_string_equal(t.items[0].choices[0].cont, " 4");
    assert_int_equal(t.items[0].choices[0].norm_len, 1);
    ev_task_free(&t);
    unlink(p);

    p = tmpfile_with("{\"context\": \"Once upon a\", \"continuation\": \" time\"}\n");
    assert_int_equal(ev_load_jsonl(p, "ll", &t, err, sizeof err), 0);
    assert_int_equal(t.kind, EV_KIND_LOGLIK);
    assert_string_equal(t.items[0].choices[0].cont, " time");
    ev_task_free(&t);
    unlink(p);
}

/* Malformed rows: the error names the file, the line and the field. */
static void expect_error(const char *text, const char *want)
{
    ev_task t;
    char err[512];
    const char *p = tmpfile_with(text);
    assert_int_equal(ev_load_jsonl(p, "bad", &t, err, sizeof err), -1);
    char full[600];
    snprintf(full, sizeof full, "%s%s", p, want);
    if (!strstr(err, full))
        fail_msg("error '%s' lacks '%s'", err, full);
    assert_int_equal(t.n_items, 0);
    unlink(p);
}

static void test_malformed(void **state)
{
    (void)state;
    const char *ok = "{\"context\": \"a\", \"choices\": [\" b\", \" c\"], \"gold\": 1}\n";
    char buf[512];
    snprintf(buf, sizeof buf, "%s%s", ok, "{\"context\": \"a\", \"choices\": [\" b\", \" c\"], \"gold\": 2}\n");
    expect_error(buf, ":2: field 'gold'");
    snprintf(buf, sizeof buf, "%s%s", ok, "{\"context\": 5, \"choices\": [\" b\", \" c\"], \"gold\": 0}\n");
    expect_error(buf, ":2: field 'context'");
    snprintf(buf, sizeof buf, "%s%s%s", ok, ok, "{\"context\": \"a\", \"choices\": [\" b\", 3], \"gold\": 0}\n");
    expect_error(buf, ":3: field 'choices[1]'");
    snprintf(buf, sizeof buf, "%s%s", ok, "{\"context\": \"a\", \"continuation\": \" b\"}\n");
    expect_error(buf, ":2: field 'continuation'");
    snprintf(buf, sizeof buf, "%s%s", ok, "{\"context\": \"a\", \"choices\": [\" b\"], \"gold\": 0, \"x\": 1}\n");
    expect_error(buf, ":2: field 'x'");
    snprintf(buf, sizeof buf, "%s%s", ok, "{\"context\": \"a\", \"choices\n");
    expect_error(buf, ":2: invalid JSON");

    /* the benchmark loaders too */
    ev_task t;
    char err[512];
    const char *p = tmpfile_with("{\"query\": \"Question: q\", \"choices\": [\"a\", \"b\"], \"gold\": 0}\n"
                                 "{\"query\": \"Question: q\", \"choices\": [\"a\", \"b\"], \"gold\": 7}\n");
    assert_int_equal(ev_load_arc(p, "arc_easy", &t, err, sizeof err), -1);
    assert_non_null(strstr(err, ":2: field 'gold'"));
    unlink(p);
    p = tmpfile_with("ctx\n1\na\nb\nc\nd\nctx2\nX\na\nb\nc\nd\n");
    assert_int_equal(ev_load_hellaswag(p, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, ":8: field 'label'"));
    unlink(p);
    p = tmpfile_with("{\"question\": {\"stem\": \"s\", \"choices\": [{\"text\": \"a\", \"label\": \"A\"}, "
                     "{\"text\": \"b\", \"label\": \"B\"}]}, \"answerKey\": \"C\"}\n");
    assert_int_equal(ev_load_openbookqa(p, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, ":1: field 'answerKey'"));
    unlink(p);
    assert_int_equal(ev_task_load("no_such_task", data_dir, NULL, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "unknown task"));
}

/* A task file swapped for a FIFO is refused without waiting for a writer; a line past the
 * line limit is refused naming it. */
static void test_task_file_kinds(void **state)
{
    (void)state;
    char fifo[300], err[512];
    ev_task t;
    snprintf(fifo, sizeof fifo, "/tmp/test_eval_tasks_fifo_%d.jsonl", (int)getpid());
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(10);   /* the old open waited for a writer for ever */
    assert_int_equal(ev_load_jsonl(fifo, "fifo", &t, err, sizeof err), -1);
    alarm(0);
    assert_non_null(strstr(err, "not a task file"));
    unlink(fifo);
    size_t big = (size_t)17 << 20;
    char *line = malloc(big + 64);
    assert_non_null(line);
    int w = snprintf(line, 64, "{\"context\": \"");
    memset(line + w, 'x', big);
    snprintf(line + w + big, 64, "\", \"continuation\": \" y\"}\n");
    const char *p = tmpfile_with(line);
    free(line);
    assert_int_equal(ev_load_jsonl(p, "long", &t, err, sizeof err), -1);
    assert_non_null(strstr(err, ":1: a line of"));
    unlink(p);
}

/* The parent's cached scores are keyed on a task file's content: the same file edited
 * between two jobs is another task (its scores were reused for the old items). */
static void test_parent_key_follows_content(void **state)
{
    (void)state;
    const char *p = tmpfile_with("{\"context\": \"a\", \"choices\": [\" b\", \" c\"], \"gold\": 1}\n");
    char js[256], err[256];
    snprintf(js, sizeof js, "[\"arc_easy\", {\"name\": \"mine\", \"path\": \"%s\"}]", p);
    json_t *tasks = json_loads(js, 0, NULL);
    assert_non_null(tasks);
    strbuf k1 = {0}, k2 = {0}, k3 = {0};
    assert_int_equal(stage_eval_parent_key(tasks, 10, 7, "/data", &k1, err, sizeof err), 0);
    assert_int_equal(stage_eval_parent_key(tasks, 10, 7, "/data", &k2, err, sizeof err), 0);
    assert_string_equal(k1.s, k2.s);
    /* version 1's entries scored a JSONL choice's acc_norm with its leading space and
     * named the server's files: version 2 and later never reuse them */
    assert_true(strncmp(k1.s, "autocompress-eval-", 18) == 0 && atoi(k1.s + 18) >= 2);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("{\"context\": \"a\", \"choices\": [\" b\", \" c\"], \"gold\": 0}\n", f);   /* the answer changed */
    assert_int_equal(fclose(f), 0);
    assert_int_equal(stage_eval_parent_key(tasks, 10, 7, "/data", &k3, err, sizeof err), 0);
    assert_string_not_equal(k1.s, k3.s);
    unlink(p);
    strbuf k4 = {0};
    assert_int_equal(stage_eval_parent_key(tasks, 10, 7, "/data", &k4, err, sizeof err), -1);
    free(k1.s), free(k2.s), free(k3.s), free(k4.s);
    json_decref(tasks);
}

static void test_limit_seeded(void **state)
{
    (void)state;
    ev_task a, b, c;
    char err[512];
    assert_int_equal(ev_task_load("openbookqa", data_dir, NULL, &a, err, sizeof err), 0);
    assert_int_equal(ev_task_load("openbookqa", data_dir, NULL, &b, err, sizeof err), 0);
    assert_int_equal(ev_task_load("openbookqa", data_dir, NULL, &c, err, sizeof err), 0);
    assert_int_equal(ev_task_limit(&a, 50, 1234), 50);
    assert_int_equal(ev_task_limit(&b, 50, 1234), 50);
    assert_int_equal(ev_task_limit(&c, 50, 99), 50);
    int same = 1, diff = 0;
    for (int i = 0; i < 50; i++) {
        same &= a.items[i].line == b.items[i].line;
        diff += a.items[i].line != c.items[i].line;
        if (i)
            assert_true(a.items[i].line > a.items[i - 1].line);   /* file order kept */
    }
    assert_true(same);
    assert_true(diff > 0);
    assert_true(a.items[49].line > 100);   /* a sample, not the first 50 rows */
    ev_task_free(&a);
    ev_task_free(&b);
    ev_task_free(&c);
    /* MMLU: the limit applies per subject */
    assert_int_equal(ev_task_load("mmlu", data_dir, NULL, &a, err, sizeof err), 0);
    assert_int_equal(ev_task_limit(&a, 3, 1), 57 * 3);
    ev_task_free(&a);
}

static void test_wikitext(void **state)
{
    (void)state;
    char *d = ev_wikitext_detokenize(" = Robert Boulter = \n He had a guest @-@ starring role , in 2000 ( the "
                                     "Bill ) . It 's 1 @,@ 000 @.@ 5 N \n");
    assert_non_null(d);
    assert_string_equal(d, " = Robert Boulter =\nHe had a guest-starring role, in 2000 (the Bill). It's 1,000.5 N\n");
    free(d);
    ev_task t;
    char err[512];
    assert_int_equal(ev_task_load("wikitext2", data_dir, NULL, &t, err, sizeof err), 0);
    assert_int_equal(t.kind, EV_KIND_ROLLING);
    assert_true(t.n_items >= 50 && t.n_items <= 70);
    assert_int_equal(strncmp(t.items[0].choices[0].cont, " = Robert Boulter =\nRobert Boulter is an English film, "
                                                         "television and theatre actor.", 73), 0);
    assert_null(strchr(t.items[0].choices[0].cont, '\r'));
    assert_true(t.items[0].words > 100);
    assert_int_equal(t.items[0].bytes, (int64_t)strlen(t.items[0].choices[0].cont));
    assert_int_equal(ev_utf8_len("caf\xc3\xa9"), 4);
    ev_task_free(&t);
}

static void test_fetch_url(void **state)
{
    (void)state;
    char err[512];
    const char *src = tmpfile_with("{\"context\": \"a\", \"continuation\": \" b\"}\n");
    char url[128], out[128];
    snprintf(url, sizeof url, "file://%s", src);
    snprintf(out, sizeof out, "%s.out", src);
    /* sha256 of the line above; one digit off must be refused and leave no file */
    const char *good = "385f62b5f5a184bf90cd0634c92e13ca9c8bbe5f9f94803c5fa8562e61a53a53";
    char wrong[65];
    memcpy(wrong, good, 65);
    wrong[0] = '4';
    assert_int_equal(ev_fetch_url(url, wrong, 1 << 20, out, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "sha256 mismatch"));
    assert_int_equal(access(out, F_OK), -1);
    const char *real = good;
    assert_int_equal(ev_fetch_url(url, real, 1 << 20, out, 0, err, sizeof err), 0);
    ev_task t;
    assert_int_equal(ev_load_jsonl(out, "fetched", &t, err, sizeof err), 0);
    assert_int_equal(t.n_items, 1);
    ev_task_free(&t);
    unlink(out);
    assert_int_equal(ev_fetch_url(url, real, 10, out, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "limit"));
    assert_int_equal(ev_fetch_url(url, NULL, 1 << 20, out, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "sha256"));
    unlink(src);
}

int main(void)
{
    const char *sh = getenv("AC_SHARED");
    snprintf(data_dir, sizeof data_dir, "%s/data", sh && *sh ? sh : "../shared");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arc_easy_foundry), cmocka_unit_test(test_arc_ai2_numeric_labels),
        cmocka_unit_test(test_piqa),             cmocka_unit_test(test_hellaswag),
        cmocka_unit_test(test_winogrande_partial), cmocka_unit_test(test_boolq),
        cmocka_unit_test(test_openbookqa),       cmocka_unit_test(test_lambada),
        cmocka_unit_test(test_mmlu_fewshot),     cmocka_unit_test(test_csv),
        cmocka_unit_test(test_generic_jsonl),    cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_task_file_kinds),
        cmocka_unit_test(test_parent_key_follows_content),
        cmocka_unit_test(test_limit_seeded),     cmocka_unit_test(test_wikitext),
        cmocka_unit_test(test_fetch_url),        cmocka_unit_test(test_sciq),
        cmocka_unit_test(test_sciq_multiple_choice), cmocka_unit_test(test_builtin_all_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
