/* tests/unit/test_export_stage.c — the job's export stage end to end through job_run:
 * a pruned student snapshot (here stories260K, saved as prune/student) is exported in
 * the spec's formats; the HF tar and the GGUF are published with the sha-256 the
 * manifest, the events and the report state; the tar holds the HF directory whose own
 * SHA256SUMS verify and whose tokenizer.json (made from the llama2.c tok512.bin)
 * tokenizes as the parent's tokenizer does; an unexpressible request ("hf" = LlamaForCausalLM for a
 * heterogeneous arch) fails the job with a clear reason instead of changing the arch.
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

#include "compress/prune.h"
#include "engine/backend.h"
#include "jobs/pipeline.h"
#include "jobs/stage.h"
#include "storage/artstore.h"
#include "storage/ckpt.h"
#include "storage/export.h"
#include "storage/modelio.h"
#include "storage/tokload.h"
#include "storage/store.h"
#include "stage_fixture.h"

void stage_export_register(void);

static int setup(void **state)
{
    (void)state;
    stage_export_register();
    return stage_fixture_open("/tmp/ac-expstage-XXXXXX");
}

static int teardown(void **state)
{
    (void)state;
    return stage_fixture_close();
}

static const char *stories(void)
{
    static char p[1024];
    const char *sh = getenv("AC_SHARED");
    snprintf(p, sizeof p, "%s/data/models/stories260K/stories260K.bin", sh ? sh : "../shared");
    return p;
}

/* Create and claim a job exporting `formats`, with `m` saved as its prune/student. */
static void run_job(const char *formats_json, const eng_model *m, store_job *out)
{
    char err[512];
    store_job j;
    memset(&j, 0, sizeof j);
    store_new_id("job_", j.id, sizeof j.id);
    snprintf(j.kind, sizeof j.kind, "job");
    snprintf(j.device, sizeof j.device, "cpu");
    json_error_t je;
    j.spec = json_pack("{s:{s:s}, s:o, s:{s:s}}", "model", "path", stories(), "export",
                       json_loads(formats_json, 0, &je), "target", "device", "cpu");
    j.stages = json_pack("[s]", "export");
    assert_int_equal(store_job_create(st, &j, NULL, NULL, NULL, 0, NULL, err, sizeof err), 0);
    char sdir[512];
    snprintf(sdir, sizeof sdir, "%s/jobs/%s/prune/student", dir, j.id);
    char jd[512];
    snprintf(jd, sizeof jd, "%s/jobs", dir);
    mkdir(jd, 0755);
    snprintf(jd, sizeof jd, "%s/jobs/%s", dir, j.id);
    mkdir(jd, 0755);
    snprintf(jd, sizeof jd, "%s/jobs/%s/prune", dir, j.id);
    mkdir(jd, 0755);
    if (ckpt_save(m, sdir, err, sizeof err))
        fail_msg("ckpt_save: %s", err);
    store_job c;
    assert_int_equal(store_job_claim(st, &(store_claim){"cpu", 0, "test", 30}, &c), 0);
    assert_string_equal(c.id, j.id);
    store_job_clear(&c);
    if (job_run(st, as, dir, j.id, err, sizeof err))
        fail_msg("job_run: %s", err);
    assert_int_equal(store_job_get(st, j.id, out), 0);
    store_job_clear(&j);
}

static void test_export_stage_publishes(void **state)
{
    (void)state;
    char err[512];
    eng_backend *be = eng_backend_cpu_new(1);
    eng_model m;
    if (exp_load_model(stories(), be, &m, err, sizeof err))
        fail_msg("%s", err);
    store_job j;
    run_job("[\"hf\", \"gguf\"]", &m, &j);
    if (strcmp(j.status, "succeeded"))
        fail_msg("job %s: %s", j.status, j.error_message);
    store_artifact *a;
    int n;
    assert_int_equal(store_artifact_list(st, j.id, &a, &n), 0);
    int seen = 0;
    json_t *arts = json_object_get(json_object_get(j.report, "export"), "artifacts");
    assert_int_equal(json_array_size(arts), 2);
    for (int i = 0; i < n; i++) {
        char p[600], hex[65];
        int64_t size;
        if (!strcmp(a[i].name, "model-hf.tar") || !strcmp(a[i].name, "model.gguf")) {
            seen++;
            snprintf(p, sizeof p, "%s/jobs/%s/export/%s", dir, j.id, a[i].name);
            assert_int_equal(art_sha256_file(p, hex, &size, err, sizeof err), 0);
            assert_string_equal(hex, a[i].sha256);
            assert_int_equal(size, a[i].size_bytes);
            int found = 0;
            for (size_t k = 0; k < json_array_size(arts); k++) {
                json_t *e = json_array_get(arts, k);
                if (!strcmp(json_string_value(json_object_get(e, "name")), a[i].name)) {
                    assert_string_equal(json_string_value(json_object_get(e, "sha256")), hex);
                    found = 1;
                }
            }
            assert_true(found);
        }
    }
    assert_int_equal(seen, 2);
    free(a);
    /* The tar unpacks to a directory whose SHA256SUMS verify and that reloads exactly. */
    char cmd[2048], x[600];
    snprintf(x, sizeof x, "%s/x", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && tar -xf '%s/jobs/%s/export/model-hf.tar' -C '%s'", x, dir, j.id, x);
    assert_int_equal(system(cmd), 0);
    snprintf(x, sizeof x, "%s/x/model-hf", dir);
    assert_int_equal(exp_verify_dir(x, err, sizeof err), 0);
    eng_model b;
    if (exp_load_model(x, be, &b, err, sizeof err))
        fail_msg("reload: %s", err);
    assert_true(arch_equal(&m.a, &b.a));
    eng_model_free(&b);
    /* ... with the parent's tokenizer (llama2.c tok512.bin) as tokenizer.json: loaded
     * through the same path as every subcommand, it tokenizes as tok512.bin does. */
    for (size_t k = 0; k < json_array_size(arts); k++)
        assert_true(json_is_true(json_object_get(json_array_get(arts, k), "tokenizer")));
    tok_tokenizer *ht = NULL, *lt = NULL;
    if (mio_load_model(x, NULL, be, &b, &ht, err, sizeof err))
        fail_msg("reload with tokenizer: %s", err);
    eng_model_free(&b);
    char tp[1024];
    snprintf(tp, sizeof tp, "%s", stories());
    snprintf(strrchr(tp, '/') + 1, sizeof tp - (size_t)(strrchr(tp, '/') + 1 - tp), "tok512.bin");
    if (!(lt = tokload_llama2c(tp, 512, err, sizeof err)))
        fail_msg("%s", err);
    assert_int_equal(tok_n_vocab(ht), tok_n_vocab(lt));
    assert_int_equal(tok_cfg(ht)->bos_id, 1);
    assert_int_equal(tok_cfg(ht)->eos_id, 2);
    assert_int_equal(tok_cfg(ht)->add_bos, 1);
    static const char *const texts[] = {
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
        "  two leading spaces, a tab\tand a newline\nthen \"quotes\" and digits 1234567890!",
        "Zoë's café: naïve façade — 日本語 🤗", "", " ", "x",
    };
    for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
        int *a1, *a2;
        size_t n1, n2;
        assert_int_equal(tok_encode(lt, texts[k], strlen(texts[k]), 1, 0, &a1, &n1, err, sizeof err), 0);
        assert_int_equal(tok_encode(ht, texts[k], strlen(texts[k]), 1, 0, &a2, &n2, err, sizeof err), 0);
        if (n1 != n2 || (n1 && memcmp(a1, a2, n1 * sizeof *a1)))
            fail_msg("text %zu: tokenizer.json gives %zu ids, tok512.bin %zu (or different ids)", k, n2, n1);
        char *d;
        size_t dl;
        assert_int_equal(tok_decode(ht, a2, n2, 1, &d, &dl, err, sizeof err), 0);
        assert_int_equal(dl, strlen(texts[k]));
        assert_memory_equal(d, texts[k], dl);
        free(d);
        free(a1);
        free(a2);
    }
    tok_free(ht);
    tok_free(lt);
    store_job_clear(&j);

    /* "hf" of a heterogeneous arch means DeciLM; widths DeciLM cannot express (FFN not a
     * multiple of 256) fail the job with the reason, the arch untouched. */
    arch het;
    assert_int_equal(arch_copy(&het, &m.a), 0);
    het.layers[1].ffn_dim = 64;
    eng_model p;
    if (prune_to_arch(&m, &het, &p, err, sizeof err))
        fail_msg("prune: %s", err);
    run_job("[\"hf\"]", &p, &j);
    assert_string_equal(j.status, "failed");
    printf("hf export of a heterogeneous arch: %s\n", j.error_message);
    assert_non_null(strstr(j.error_message, "DeciLM"));
    store_job_clear(&j);
    eng_model_free(&p);
    arch_free(&het);
    eng_model_free(&m);
    eng_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_stage_publishes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
