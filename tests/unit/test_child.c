/* tests/unit/test_child.c — a measuring child's time limit is on its silence, not its
 * run (compress/child.h): a child that writes a newline now and then (the heartbeat of
 * `autocompress measure --json` and of the llama.cpp helper while they serve) may run
 * longer than the limit and its JSON after the newlines is read; a silent one is killed
 * when the limit is up, and the error says how long it was silent. A child flooding its
 * output is killed at a cap.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "compress/child.h"
#include "engine/clock.h"

static const ch_kind KIND = {.what = "test child", .engine = "test", .timeout_s = 1.0};

/* 2.4 s in all, a newline every 0.4 s, then the object: longer than the limit, never
 * silent for it */
static void test_heartbeat_keeps_it_alive(void **state)
{
    (void)state;
    char *argv[] = {"/bin/sh", "-c", "for i in 1 2 3 4 5 6; do echo; sleep 0.4; done; echo '{\"ok\": 7}'", NULL};
    json_t *j = NULL;
    char err[512] = "";
    double t0 = eng_wall_s();
    if (ch_run_json(&KIND, argv, NULL, &j, err, sizeof err))
        fail_msg("ch_run_json: %s", err);
    assert_true(eng_wall_s() - t0 > KIND.timeout_s);
    assert_int_equal(json_integer_value(json_object_get(j, "ok")), 7);
    json_decref(j);
}

/* silent for 3 s: killed after the limit, long before it would have answered */
static void test_silence_is_killed(void **state)
{
    (void)state;
    char *argv[] = {"/bin/sh", "-c", "echo; sleep 3; echo '{}'", NULL};
    json_t *j = NULL;
    char err[512] = "";
    double t0 = eng_wall_s();
    assert_int_equal(ch_run_json(&KIND, argv, NULL, &j, err, sizeof err), -1);
    assert_true(eng_wall_s() - t0 < 2.5);
    assert_null(j);
    assert_non_null(strstr(err, "said nothing for 1 s and was killed"));
}

/* a runaway child that floods its output is killed at the cap, not read into memory */
static void test_flood_is_killed(void **state)
{
    (void)state;
    char *argv[] = {"/bin/sh", "-c", "yes ' ' | head -c 100000000; echo '{}'", NULL};
    json_t *j = NULL;
    char err[512] = "";
    assert_int_equal(ch_run_json(&KIND, argv, NULL, &j, err, sizeof err), -1);
    assert_null(j);
    assert_non_null(strstr(err, "wrote more than 64 MiB on its output and was killed"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heartbeat_keeps_it_alive),
        cmocka_unit_test(test_silence_is_killed),
        cmocka_unit_test(test_flood_is_killed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
