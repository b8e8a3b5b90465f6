/* tests/unit/test_measure_fresh.c — a built-in measurement in a fresh process
 * (compress/measure.h ms_measure_fresh) hands the child its arch in a temporary file under
 * TMPDIR, named for the process and its PID namespace. A file left by a process of this
 * namespace that died is swept before the next one is written; a live process's file is
 * kept, and so is one of another PID namespace (a TMPDIR shared with other containers),
 * whose pid means nothing here. The measurement itself leaves no file behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compress/costmodel.h"
#include "compress/measure.h"
#include "engine/arch.h"
#include "storage/fileio.h"

static void touch(const char *dir, const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    assert_int_equal(fclose(f), 0);
}

static int present(const char *dir, const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void test_sweep_by_namespace(void **state)
{
    (void)state;
    char dir[] = "/tmp/ac_msfresh_XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(setenv("TMPDIR", dir, 1), 0);
    struct stat st;
    assert_int_equal(stat("/proc/self/ns/pid", &st), 0);
    unsigned long ns = (unsigned long)st.st_ino;
    pid_t dead = fork();   /* a pid of this namespace whose process is gone */
    assert_true(dead >= 0);
    if (dead == 0)
        _exit(0);
    assert_int_equal(waitpid(dead, NULL, 0), dead);
    char mine[128], theirs[128], live[128];
    snprintf(mine, sizeof mine, "ac-measure-%ld-%lu-aaaaaa.json", (long)dead, ns);
    snprintf(theirs, sizeof theirs, "ac-measure-%ld-%lu-bbbbbb.json", (long)dead, ns + 1);
    snprintf(live, sizeof live, "ac-measure-%ld-%lu-cccccc.json", (long)getpid(), ns);
    touch(dir, mine);
    touch(dir, theirs);
    touch(dir, live);

    arch a;
    assert_int_equal(arch_init(&a, 1), 0);
    snprintf(a.family, sizeof a.family, "llama");
    a.vocab_size = 64;
    a.hidden_size = 32;
    a.head_dim = 8;
    a.max_position_embeddings = 64;
    a.rope_theta = 10000;
    a.norm_eps = 1e-5f;
    a.tie_word_embeddings = 1;
    a.layers[0] = (arch_layer){.source_layer = 0, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 64};
    cm_target t;
    cm_target_default(&t);
    t.prompt_tokens = 8;
    t.output_tokens = 2;
    ms_opts o = {.warmup = 0, .reps = 1, .seed = 1, .threads = 1};
    ms_result r;
    char err[1024];
    if (ms_measure_fresh(&a, NULL, &t, &o, &r, err, sizeof err))
        fail_msg("ms_measure_fresh: %s", err);
    assert_true(r.latency_ms > 0);
    assert_false(present(dir, mine));
    assert_true(present(dir, theirs));
    assert_true(present(dir, live));
    int n = 0;   /* the three planted, less the swept one: the run's own file is gone */
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(n, 2);
    arch_free(&a);
    assert_int_equal(fio_remove_tree(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sweep_by_namespace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
