/* tests/unit/test_distill_dp.c — data-parallel distillation on CPU processes: two ranks
 * (forked processes joined by the CPU collective) distil the same student as one process
 * does on the same global batch: the same loss curve within fp32 reduction-order
 * tolerance, the same final weights within tolerance, and the two ranks' weights the same
 * bits. Steps with an uneven share (3 micro-batches on 2 ranks) and a short last step
 * are in it. The all-reduce itself sums in rank order with slots smaller than the buffer.
 * A rank that dies makes its peer's next collective fail at once, naming it, instead of
 * hanging; a rank that gives up makes its peer fail with its reason.
 *
 * The forking tests run first: the processes fork before any OpenMP thread exists.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "compress/distill.h"
#include "compress/prune.h"
#include "engine/clock.h"
#include "engine/collective.h"
#include "engine/rng.h"
#include "tests/tools/records.h"

enum { V = 29, C = 16, D = 4, NL = 3, MAXP = 1 << 16, MAXSTEPS = 64 };

/* What each rank leaves for the parent: its final weights and loss curve. */
typedef struct {
    int done, steps;
    size_t n_params;
    double curve[MAXSTEPS];
    float params[MAXP];
} rank_out;

static rank_out *shared_out;   /* [2] in a shared mapping */
static rank_out dp0;           /* rank 0's result (the parent) */

static void parent_arch(arch *a)
{
    assert_int_equal(oracle_arch(a, V, C, D, NL), 0);
    a->tie_word_embeddings = 1;
    for (int l = 0; l < NL; l++)
        a->layers[l] = (arch_layer){.source_layer = l, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 24};
}

static td_stream stream(size_t n, uint64_t seed)
{
    td_stream s = {malloc(n * sizeof(int)), n};
    for (size_t i = 0; i < n; i++)
        s.ids[i] = (int)(eng_splitmix64(&seed) % V);
    return s;
}

static void opts(distill_opts *o)
{
    distill_opts_defaults(o);
    o->B = 2;
    o->T = 16;
    o->accum = 3;          /* 3 micro-batches a step: rank 0 runs 2, rank 1 runs 1 */
    o->tokens = 1000;      /* 96 tokens a step: 10 full steps and one of 40 (2 rows of 16, 1 row of 8) */
    o->lr = 3e-3f;
    o->lr_min = 3e-4f;
    o->warmup_steps = 3;
    o->val_tokens = 64;
    o->eval_every = 4;
    o->ckpt_every = 0;
}

/* Distil a fresh student of the random parent, as rank c (NULL: alone), into *out. */
static int distil(eng_coll *c, rank_out *out, char *err, size_t errlen)
{
    eng_backend *be = eng_backend_cpu_new(1);
    arch pa, sa;
    parent_arch(&pa);
    assert_int_equal(arch_copy(&sa, &pa), 0);
    sa.n_layers = 2;
    sa.layers[0] = (arch_layer){.source_layer = 0, .n_heads = 2, .n_kv_heads = 1, .ffn_dim = 12};
    sa.layers[1] = (arch_layer){.source_layer = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 12};
    eng_model parent, student;
    if (!be || eng_model_init(&parent, &pa, be, err, errlen))
        return -1;
    eng_model_randomize(&parent, 21, 0.4f);
    if (prune_to_arch(&parent, &sa, &student, err, errlen))
        return -1;
    td_stream train = stream(5000, 1), val = stream(400, 2);
    distill_opts o;
    opts(&o);
    o.coll = c;
    distill_result r;
    int rc = distill_run(&parent, &student, &train, &val, &o, &r, err, errlen);
    if (rc == 0) {
        out->steps = (int)r.steps;
        for (int64_t i = 0; i < r.steps && i < MAXSTEPS; i++)
            out->curve[i] = r.loss_curve[i];
        out->n_params = student.n_params;
        if (student.n_params <= MAXP)
            memcpy(out->params, student.params, student.n_params * sizeof(float));
        out->done = 1;
        distill_result_free(&r);
    }
    td_stream_free(&train);
    td_stream_free(&val);
    eng_model_free(&student);
    eng_model_free(&parent);
    arch_free(&pa);
    arch_free(&sa);
    eng_backend_free(be);
    return rc;
}

/* Two ranks: this process is rank 0, a forked child rank 1. */
static void test_two_ranks(void **state)
{
    (void)state;
    char err[512];
    shared_out = mmap(NULL, 2 * sizeof(rank_out), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(shared_out != MAP_FAILED);
    eng_coll_group *g = eng_coll_cpu_group(2, 256, err, sizeof err);   /* slots far smaller than the grads */
    assert_non_null(g);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        eng_coll *c = eng_coll_cpu_join(g, 1, err, sizeof err);
        int rc = c ? distil(c, &shared_out[1], err, sizeof err) : -1;
        if (rc)
            fprintf(stderr, "rank 1: %s\n", err);
        _exit(rc == 0 ? 0 : 1);
    }
    eng_coll *c = eng_coll_cpu_join(g, 0, err, sizeof err);
    assert_non_null(c);
    int rc = distil(c, &dp0, err, sizeof err);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (rc)
        fail_msg("rank 0: %s", err);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    c->free(c);
    eng_coll_group_release(g);
    const rank_out *r1 = &shared_out[1];
    assert_true(dp0.done && r1->done);
    assert_int_equal(dp0.steps, 11);
    assert_int_equal(r1->steps, 11);
    assert_true(dp0.n_params <= MAXP && dp0.n_params == r1->n_params);
    /* the ranks applied the same updates to the same weights */
    assert_memory_equal(dp0.params, r1->params, dp0.n_params * sizeof(float));
    for (int i = 0; i < dp0.steps; i++)
        assert_true(dp0.curve[i] == r1->curve[i]);
}

/* Rank 1 in a forked child: joins g, then gives up with `why` and stays alive 3 s when
 * why is set, else exits at once. The child's pid. */
static pid_t peer(eng_coll_group *g, const char *why)
{
    char err[512];
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        eng_coll *c = eng_coll_cpu_join(g, 1, err, sizeof err);
        if (c && why) {
            c->abort(c, why);
            sleep(3);   /* alive: the peer must fail from the abort, not from a dead pid */
        }
        _exit(c ? 0 : 1);
    }
    return pid;
}

/* Rank 0's all-reduce after peer(g, why): it fails within a few seconds; err names why. */
static void expect_failed_reduce(eng_coll_group *g, pid_t pid, const char *want1, const char *want2)
{
    char err[512];
    eng_coll *c = eng_coll_cpu_join(g, 0, err, sizeof err);
    assert_non_null(c);
    float x[4] = {1, 2, 3, 4};
    double t0 = eng_wall_s();
    assert_int_equal(c->allreduce_sum(c, NULL, x, 4, err, sizeof err), -1);
    assert_true(eng_wall_s() - t0 < 5);
    assert_non_null(strstr(err, want1));
    assert_non_null(strstr(err, want2));
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    c->free(c);
    eng_coll_group_release(g);
}

/* A rank that is gone (here: exits right after joining, before rank 0 joins) fails its
 * peer's next collective within about a second, naming the rank. */
static void test_dead_peer(void **state)
{
    (void)state;
    char err[512];
    eng_coll_group *g = eng_coll_cpu_group(2, 0, err, sizeof err);
    assert_non_null(g);
    pid_t pid = peer(g, NULL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    expect_failed_reduce(g, pid, "rank 1", "gone");
}

/* A rank that gives up: its peer's collective fails with the reason. */
static void test_abort_reason(void **state)
{
    (void)state;
    char err[512];
    eng_coll_group *g = eng_coll_cpu_group(2, 0, err, sizeof err);
    assert_non_null(g);
    expect_failed_reduce(g, peer(g, "training batch failed"), "rank 1 gave up", "training batch failed");
}

/* One process on the same global batch: the same curve and weights within fp32
 * reduction-order tolerance (the ranks add two partial gradients where one process
 * accumulates into one buffer). Runs after the forking tests. */
static void test_equals_one_process(void **state)
{
    (void)state;
    char err[512];
    static rank_out one;
    assert_true(dp0.done);
    assert_int_equal(distil(NULL, &one, err, sizeof err), 0);
    assert_int_equal(one.steps, dp0.steps);
    double worst_loss = 0, worst_w = 0, scale = 0;
    for (int i = 0; i < one.steps; i++) {
        double d = fabs(one.curve[i] - dp0.curve[i]) / fabs(one.curve[i]);
        worst_loss = d > worst_loss ? d : worst_loss;
    }
    for (size_t i = 0; i < one.n_params; i++) {
        double d = fabs((double)one.params[i] - dp0.params[i]);
        worst_w = d > worst_w ? d : worst_w;
        scale = fabs(one.params[i]) > scale ? fabs(one.params[i]) : scale;
    }
    printf("2 ranks vs 1 process: loss curve worst rel diff %.3g over %d steps (%.4f -> %.4f), weights worst abs "
           "diff %.3g (largest weight %.3g)\n",
           worst_loss, one.steps, one.curve[0], one.curve[one.steps - 1], worst_w, scale);
    assert_true(one.curve[one.steps - 1] < one.curve[0]);   /* it learned */
    assert_true(worst_loss < 1e-4);
    assert_true(worst_w < 1e-4 * scale);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks),
        cmocka_unit_test(test_dead_peer),
        cmocka_unit_test(test_abort_reason),
        cmocka_unit_test(test_equals_one_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
