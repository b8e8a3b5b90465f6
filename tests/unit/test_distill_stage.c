/* tests/unit/test_distill_stage.c — the job's distill stage through job_run (after its rank
 * stage; the pruned student is the parent itself), resumed onto a
 * checkpoint another run wrote (here one of other options, as a build with other defaults
 * leaves): the stage says so in a distill.restarted event and distils this job from the
 * start, rather than failing the job for good.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/backend.h"
#include "jobs/pipeline.h"
#include "jobs/stage.h"
#include "jobs/stages.h"
#include "storage/artstore.h"
#include "storage/ckpt.h"
#include "storage/fileio.h"
#include "storage/modelio.h"
#include "storage/store.h"
#include "stage_fixture.h"

static int setup(void **state)
{
    (void)state;
    stage_rank_register();
    stage_distill_register();
    return stage_fixture_open("/tmp/ac-diststage-XXXXXX");
}

static int teardown(void **state)
{
    (void)state;
    return stage_fixture_close();
}

static void shared_path(char *out, size_t n, const char *rel)
{
    const char *sh = getenv("AC_SHARED");
    snprintf(out, n, "%s/data/%s", sh ? sh : "../shared", rel);
}

/* A job of stages rank and distill on stories260K (model) with text for both, created in
 * the store; clear j after. */
static void new_job(store_job *j, const char *model, const char *text)
{
    char err[512];
    memset(j, 0, sizeof *j);
    store_new_id("job_", j->id, sizeof j->id);
    snprintf(j->kind, sizeof j->kind, "job");
    snprintf(j->device, sizeof j->device, "cpu");
    j->spec = json_pack("{s:{s:s}, s:{s:s,s:s}, s:{s:i}, s:{s:s}}", "model", "path", model, "data", "calibration",
                        text, "distillation", text, "budgets", "distill_tokens", 2048, "target", "device", "cpu");
    j->stages = json_pack("[s,s]", "rank", "distill");
    if (store_job_create(st, j, NULL, NULL, NULL, 0, NULL, err, sizeof err))
        fail_msg("store_job_create: %s", err);
}

static void test_other_runs_checkpoint(void **state)
{
    (void)state;
    char err[512], model[1024], text[1024], path[600];
    shared_path(model, sizeof model, "models/stories260K/stories260K.bin");
    shared_path(text, sizeof text, "text/tinystories/validation_100.txt");
    eng_backend *be = eng_backend_cpu_new(1);
    eng_model m;
    if (mio_load_model(model, NULL, be, &m, NULL, err, sizeof err))
        fail_msg("%s", err);
    store_job j;
    new_job(&j, model, text);
    /* the pruned student (the parent itself) and another run's checkpoint at step 1 */
    snprintf(path, sizeof path, "%s/jobs/%s/prune/student", dir, j.id);
    assert_int_equal(fio_mkdirs(path), 0);
    if (ckpt_save(&m, path, err, sizeof err))
        fail_msg("ckpt_save: %s", err);
    snprintf(path, sizeof path, "%s/jobs/%s/distill/%s/step-0000000001", dir, j.id, STAGE_DISTILL_CKPT);
    assert_int_equal(fio_mkdirs(path), 0);
    static const char other[] = "{\"version\": 1, \"step\": 1, \"options\": {\"B\": 99, \"lr\": 0.001, "
                                "\"lr_min\": 0.0001, \"warmup_steps\": 1}}";
    char f[700];
    snprintf(f, sizeof f, "%s/state.json", path);
    assert_int_equal(fio_write_atomic(f, other, sizeof other - 1, err, sizeof err), 0);
    snprintf(f, sizeof f, "%s/DONE", path);
    assert_int_equal(fio_write_atomic(f, "done\n", 5, err, sizeof err), 0);
    store_job c;
    assert_int_equal(store_job_claim(st, &(store_claim){"cpu", 0, "test", 30}, &c), 0);
    store_job_clear(&c);
    if (job_run(st, as, dir, j.id, err, sizeof err))
        fail_msg("job_run: %s", err);
    store_job got;
    assert_int_equal(store_job_get(st, j.id, &got), 0);
    if (strcmp(got.status, "succeeded"))
        fail_msg("the job %s: %s", got.status, got.error_message);
    store_event *ev = NULL;
    int n = 0, more = 0, restarted = 0;
    assert_int_equal(store_event_list(st, j.id, 0, 1000, &ev, &n, &more), 0);
    for (int i = 0; i < n; i++)
        restarted += !strcmp(ev[i].type, "distill.restarted");
    assert_int_equal(restarted, 1);
    store_event_list_free(ev, n);
    /* this job's own run, on this build's schedule: its learning rate, not the other run's */
    json_t *d = json_object_get(got.report, "distillation");
    assert_true(json_real_value(json_object_get(d, "lr")) < 0.0009);
    assert_int_equal(json_integer_value(json_object_get(d, "resumed_from_step")), 0);
    store_job_clear(&got);
    store_job_clear(&j);
    eng_model_free(&m);
    eng_backend_free(be);
}

/* A stage failing on one of the job's own files (a pruned student whose arch.json is not
 * JSON): the job's error names the file in the job's folder ("prune/student/arch.json"),
 * not by the server's path to it. */
static void test_error_names_job_files(void **state)
{
    (void)state;
    char err[512], model[1024], text[1024], path[600];
    shared_path(model, sizeof model, "models/stories260K/stories260K.bin");
    shared_path(text, sizeof text, "text/tinystories/validation_100.txt");
    store_job j;
    new_job(&j, model, text);
    snprintf(path, sizeof path, "%s/jobs/%s/prune/student", dir, j.id);
    assert_int_equal(fio_mkdirs(path), 0);
    snprintf(path, sizeof path, "%s/jobs/%s/prune/student/arch.json", dir, j.id);
    assert_int_equal(fio_write_atomic(path, "{not json", 9, err, sizeof err), 0);
    store_job c;
    assert_int_equal(store_job_claim(st, &(store_claim){"cpu", 0, "test", 30}, &c), 0);
    store_job_clear(&c);
    (void)job_run(st, as, dir, j.id, err, sizeof err);
    store_job got;
    assert_int_equal(store_job_get(st, j.id, &got), 0);
    assert_string_equal(got.status, "failed");
    if (!strstr(got.error_message, "prune/student/arch.json") || strstr(got.error_message, dir))
        fail_msg("the job's error: %s", got.error_message);
    store_job_clear(&got);
    store_job_clear(&j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_other_runs_checkpoint),
        cmocka_unit_test(test_error_names_job_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
