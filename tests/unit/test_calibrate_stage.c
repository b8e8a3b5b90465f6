/* tests/unit/test_calibrate_stage.c — the calibrate stage of a job (jobs/stage_calibrate.c)
 * on stories260K: its calibration.json, which a restarted job trusts once the stage's
 * done marker is written, is durable before that: written whole under another name,
 * fsynced and renamed, its folder fsynced (tests/unit/fsync_log.h records which), and it
 * holds the timing tables the later stages read.
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

#include "jobs/pipeline.h"
#include "jobs/stages.h"
#include "storage/artstore.h"
#include "storage/fileio.h"
#include "storage/store.h"
#include "fsync_log.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ac-calstage-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return fio_remove_tree(dir);
}

static void test_calibration_durable(void **state)
{
    (void)state;
    char db[128], ad[128], err[512] = "", model[1024];
    snprintf(db, sizeof db, "%s/t.db", dir);
    snprintf(ad, sizeof ad, "%s/artifacts", dir);
    store *st = store_open(db, err, sizeof err);
    artstore *as = art_open(ad, err, sizeof err);
    assert_non_null(st);
    assert_non_null(as);
    stage_calibrate_register();
    const char *sh = getenv("AC_SHARED");
    snprintf(model, sizeof model, "%s/data/models/stories260K/stories260K.bin", sh ? sh : "../shared");
    store_job j;
    memset(&j, 0, sizeof j);
    assert_int_equal(store_new_id("job_", j.id, sizeof j.id), 0);
    snprintf(j.kind, sizeof j.kind, "job");
    snprintf(j.device, sizeof j.device, "cpu");
    j.spec = json_pack("{s:{s:s}, s:{s:s, s:{s:i, s:i, s:i}}, s:{s:b}}", "model", "path", model, "target", "device",
                       "cpu", "workload", "batch_size", 1, "prompt_tokens", 16, "output_tokens", 4, "search_space",
                       "hidden", 0);
    j.stages = json_pack("[s]", "calibrate");
    assert_int_equal(store_job_create(st, &j, NULL, NULL, NULL, 0, NULL, err, sizeof err), 0);
    store_job c;
    assert_int_equal(store_job_claim(st, &(store_claim){"cpu", 0, "test", 30}, &c), 0);
    store_job_clear(&c);
    g_nsynced = 0;
    if (job_run(st, as, dir, j.id, err, sizeof err))
        fail_msg("job_run: %s", err);
    char path[512], real[512];
    snprintf(path, sizeof path, "%s/jobs/%s/calibrate/calibration.json", dir, j.id);
    assert_non_null(realpath(path, real));
    /* the file fsynced under its temporary name (PATH.tmp.PID, then renamed) or its own,
     * and its folder after */
    char folder[512];
    snprintf(folder, sizeof folder, "%s", real);
    *strrchr(folder, '/') = 0;
    size_t n = strlen(real);
    int file_at = -1, folder_at = -1;
    for (int i = 0; i < g_nsynced; i++) {
        if (!strncmp(g_synced[i], real, n) && (!g_synced[i][n] || !strncmp(g_synced[i] + n, ".tmp.", 5)))
            file_at = i;
        if (!strcmp(g_synced[i], folder) && file_at >= 0)
            folder_at = i;
    }
    if (file_at < 0)
        fail_msg("%s was not fsynced", real);
    if (folder_at < 0)
        fail_msg("its folder %s was not fsynced after it", folder);
    json_error_t je;
    json_t *cal = json_load_file(path, 0, &je);
    assert_non_null(cal);
    assert_non_null(json_object_get(cal, "id"));
    json_decref(cal);
    store_job_clear(&j);
    art_close(as);
    store_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calibration_durable),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
