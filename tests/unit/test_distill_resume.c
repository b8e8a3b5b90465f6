/* tests/unit/test_distill_resume.c — distillation of a pruned student from a random
 * parent: the loss falls; the token budget is honoured exactly (a short last step);
 * the schedule warms up and decays; a run stopped after a checkpoint and resumed in a
 * fresh student gives the same loss curve and weights as one run straight through; a
 * checkpoint written with other options is refused; a half-written one is ignored.
 */
#include <math.h>
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

#include "compress/distill.h"
#include "compress/prune.h"
#include "storage/fileio.h"

enum { V = 29, C = 16, D = 4, NL = 3 };

static char dir[] = "/tmp/ac_distill_XXXXXX";

static void parent_arch(arch *a)
{
    assert_int_equal(arch_init(a, NL), 0);
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = V;
    a->hidden_size = C;
    a->head_dim = D;
    a->max_position_embeddings = 64;
    a->rope_theta = 10000.0;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = 1;
    for (int l = 0; l < NL; l++)
        a->layers[l] = (arch_layer){.source_layer = l, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 24};
}

static void student_arch(const arch *p, arch *t)
{
    assert_int_equal(arch_copy(t, p), 0);
    t->n_layers = 2;
    t->layers[0] = (arch_layer){.source_layer = 0, .n_heads = 2, .n_kv_heads = 1, .ffn_dim = 12};
    t->layers[1] = (arch_layer){.source_layer = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 12};
}

typedef struct {
    eng_backend *be;
    arch pa, sa;
    eng_model parent;
    td_stream train, val;
} fixture;

static td_stream stream(size_t n, uint64_t seed)
{
    td_stream s = {malloc(n * sizeof(int)), n};
    uint64_t x = seed;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        s.ids[i] = (int)((x >> 33) % V);
    }
    return s;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    char err[256];
    f->be = eng_backend_cpu_new(1);
    parent_arch(&f->pa);
    student_arch(&f->pa, &f->sa);
    if (eng_model_init(&f->parent, &f->pa, f->be, err, sizeof err))
        return -1;
    eng_model_randomize(&f->parent, 21, 0.4f);
    f->train = stream(5000, 1);
    f->val = stream(400, 2);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    eng_model_free(&f->parent);
    td_stream_free(&f->train);
    td_stream_free(&f->val);
    arch_free(&f->pa);
    arch_free(&f->sa);
    eng_backend_free(f->be);
    free(f);
    return 0;
}

static void new_student(fixture *f, eng_model *s)
{
    char err[256];
    assert_int_equal(prune_to_arch(&f->parent, &f->sa, s, err, sizeof err), 0);
}

typedef struct {
    int64_t calls, last_tokens, vals, ckpts;
    double first_loss;
} seen;

static int on_progress(void *ctx, const distill_progress *p)
{
    seen *s = ctx;
    if (s->calls == 0)
        s->first_loss = p->loss;
    s->calls++;
    assert_true(p->tokens > s->last_tokens);
    s->last_tokens = p->tokens;
    s->vals += p->has_val;
    s->ckpts += p->checkpointed;
    assert_true(isfinite(p->loss) && p->tokens_per_s > 0);
    return 0;
}

static void base_opts(distill_opts *o)
{
    distill_opts_defaults(o);
    o->B = 2;
    o->T = 16;
    o->accum = 2;
    o->lr = 3e-3f;
    o->lr_min = 3e-4f;
    o->warmup_steps = 3;
    o->val_tokens = 64;
    o->eval_every = 4;
}

static void test_budget_and_learning(void **state)
{
    fixture *f = *state;
    char err[256];
    distill_opts o;
    base_opts(&o);
    o.tokens = 1000;   /* 64 tokens per step: 15 full steps and one of 40 */
    seen s = {0};
    o.progress = on_progress;
    o.progress_ctx = &s;
    eng_model st;
    new_student(f, &st);
    double before;
    assert_int_equal(distill_eval_loss(&st, &f->val, 2, 16, 64, &before, err, sizeof err), 0);
    distill_result r;
    int rc = distill_run(&f->parent, &st, &f->train, &f->val, &o, &r, err, sizeof err);
    if (rc)
        fprintf(stderr, "distill: %s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(r.steps, 16);
    assert_int_equal(distill_steps(1000, 2, 16, 2), 16);
    assert_int_equal(r.tokens, 1000);
    assert_int_equal(s.last_tokens, 1000);
    assert_int_equal(s.calls, 16);
    assert_int_equal(s.vals, 4);   /* steps 4, 8, 12, 16 */
    printf("KD loss first step %.4f, last %.4f; val CE %.4f -> %.4f\n", s.first_loss, r.final_loss, before,
           r.final_val_loss);
    assert_true(r.final_loss < s.first_loss);
    assert_true(isfinite(r.final_val_loss));
    distill_result_free(&r);
    eng_model_free(&st);
    /* the schedule */
    assert_true(fabs(distill_lr(&o, 0, 16) - 1e-3) < 1e-9);
    assert_true(fabs(distill_lr(&o, 2, 16) - 3e-3) < 1e-9);
    assert_true(fabs(distill_lr(&o, 15, 16) - 3e-4) < 1e-9);
    assert_true(distill_lr(&o, 9, 16) < distill_lr(&o, 5, 16));
}

/* A learning rate far too high makes the loss overflow: the run stops at that step,
 * saying so, instead of training on and handing back a student of NaN weights. */
static void test_divergence_stops(void **state)
{
    fixture *f = *state;
    char err[256] = "";
    distill_opts o;
    base_opts(&o);
    o.tokens = 1000;
    o.lr = 1e30f;
    o.lr_min = 1e29f;
    o.warmup_steps = 0;
    eng_model st;
    new_student(f, &st);
    distill_result r;
    int rc = distill_run(&f->parent, &st, &f->train, NULL, &o, &r, err, sizeof err);
    if (rc == 0)
        distill_result_free(&r);
    assert_int_equal(rc, -1);
    if (!strstr(err, "diverged"))
        fail_msg("err: %s", err);
    eng_model_free(&st);
}

/* The seed orders the text: two seeds distil on different batches and end elsewhere;
 * one seed twice ends bit for bit the same. */
static void test_seed_orders_the_text(void **state)
{
    fixture *f = *state;
    char err[256];
    float *w[3];
    size_t n = 0;
    for (int k = 0; k < 3; k++) {
        distill_opts o;
        base_opts(&o);
        o.tokens = 4 * 64;
        o.eval_every = 0;
        o.seed = k == 2 ? 7 : 1234;
        eng_model st;
        new_student(f, &st);
        distill_result r;
        if (distill_run(&f->parent, &st, &f->train, NULL, &o, &r, err, sizeof err))
            fail_msg("distill: %s", err);
        distill_result_free(&r);
        n = st.n_params;
        w[k] = malloc(n * sizeof(float));
        assert_non_null(w[k]);
        st.be->to_host(st.be, w[k], st.params, n * sizeof(float));
        eng_model_free(&st);
    }
    assert_memory_equal(w[0], w[1], n * sizeof(float));
    assert_true(memcmp(w[0], w[2], n * sizeof(float)) != 0);
    for (int k = 0; k < 3; k++)
        free(w[k]);
}

/* The two students' weights are equal, byte for byte. */
static void assert_same_weights(fixture *f, const eng_model *x, const eng_model *y)
{
    assert_int_equal(x->n_params, y->n_params);
    float *wx = malloc(x->n_params * sizeof(float)), *wy = malloc(y->n_params * sizeof(float));
    assert_non_null(wx);
    assert_non_null(wy);
    f->be->to_host(f->be, wx, x->params, x->n_params * sizeof(float));
    f->be->to_host(f->be, wy, y->params, y->n_params * sizeof(float));
    assert_memory_equal(wx, wy, x->n_params * sizeof(float));
    free(wx);
    free(wy);
}

/* The options of the resume tests' runs: 12 steps, a checkpoint every 2 in ckdir, 2 kept. */
static void run_opts(distill_opts *o, const char *ckdir)
{
    base_opts(o);
    o->tokens = 12 * 64;
    o->ckpt_every = 2;
    o->keep_ckpts = 2;
    o->ckpt_dir = ckdir;
}

static void run_to(fixture *f, const char *ckdir, int64_t stop_after, int want_rc, distill_result *r, eng_model *st)
{
    char err[256];
    distill_opts o;
    run_opts(&o, ckdir);
    o.stop_after = stop_after;
    int rc = distill_run(&f->parent, st, &f->train, &f->val, &o, r, err, sizeof err);
    if (rc != want_rc)
        fprintf(stderr, "distill rc %d: %s\n", rc, err);
    assert_int_equal(rc, want_rc);
}

/* The backend's allocations of the size of one copy of a student's weights, counted. */
static void *(*real_alloc)(eng_backend *be, size_t bytes);
static const eng_model *counted;
static int params_allocs;

static void *counting_alloc(eng_backend *be, size_t bytes)
{
    params_allocs += bytes == counted->n_params * sizeof(float);
    return real_alloc(be, bytes);
}

static void count_params_allocs(eng_backend *be)
{
    real_alloc = be->alloc;
    be->alloc = counting_alloc;
    params_allocs = 0;
}

static void test_resume_same_curve(void **state)
{
    fixture *f = *state;
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/straight", dir);
    snprintf(b, sizeof b, "%s/killed", dir);
    eng_model s1, s2, s3;
    distill_result r1, r2, r3;
    new_student(f, &s1);
    counted = &s1;
    count_params_allocs(f->be);
    run_to(f, a, 0, 0, &r1, &s1);
    assert_int_equal(r1.steps, 12);
    int allocs_straight = params_allocs;

    new_student(f, &s2);
    run_to(f, b, 7, 1, &r2, &s2);   /* stops after step 7; newest checkpoint is step 6 */
    assert_int_equal(r2.steps, 7);
    assert_int_equal(distill_latest_checkpoint(b), 6);
    eng_model_free(&s2);
    /* a half-written checkpoint (no DONE) must be ignored */
    char junk[700];
    snprintf(junk, sizeof junk, "%s/step-0000000008", b);
    assert_int_equal(mkdir(junk, 0755), 0);

    new_student(f, &s3);             /* a fresh process: pruned again from the parent */
    counted = &s3;
    params_allocs = 0;
    run_to(f, b, 0, 0, &r3, &s3);
    f->be->alloc = real_alloc;
    assert_int_equal(r3.resumed_from, 6);
    /* the checkpoint's weights go straight into the student: no second copy of it at the
     * resume (the old load made one beside the weights, gradients and optimizer state) */
    if (params_allocs > allocs_straight)
        fail_msg("the resumed run allocated %d blocks of the student's size, the straight run %d", params_allocs,
                 allocs_straight);
    assert_int_equal(r3.steps, 12);
    assert_int_equal(r3.tokens, 12 * 64);
    for (int i = 0; i < 12; i++) {
        if (r1.loss_curve[i] != r3.loss_curve[i])
            fprintf(stderr, "step %d: straight %.9g resumed %.9g\n", i + 1, r1.loss_curve[i], r3.loss_curve[i]);
        assert_true(r1.loss_curve[i] == r3.loss_curve[i]);
    }
    printf("loss at step 12: straight %.9g, killed at 7 + resumed from 6: %.9g\n", r1.loss_curve[11],
           r3.loss_curve[11]);
    assert_same_weights(f, &s1, &s3);
    /* only keep_ckpts complete checkpoints remain */
    char p[700];
    snprintf(p, sizeof p, "%s/step-0000000012/DONE", b);
    assert_int_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/step-0000000006", b);
    assert_int_not_equal(access(p, F_OK), 0);

    /* other options: the checkpoint is refused */
    char err[256];
    distill_opts o;
    run_opts(&o, b);
    o.lr = 1e-2f;
    eng_model s4;
    new_student(f, &s4);
    distill_result r4;
    assert_int_equal(distill_run(&f->parent, &s4, &f->train, &f->val, &o, &r4, err, sizeof err), -1);
    assert_non_null(strstr(err, "other distillation options"));
    assert_int_equal(r4.checkpoint_refused, 1);   /* a job's stage starts over on this */
    eng_model_free(&s4);
    /* the same options on other text (the data file edited before the resume): refused */
    o.lr = 3e-3f;
    td_stream other = stream(5000, 3);
    new_student(f, &s4);
    assert_int_equal(distill_run(&f->parent, &s4, &other, &f->val, &o, &r4, err, sizeof err), -1);
    assert_non_null(strstr(err, "other text"));
    assert_int_equal(r4.checkpoint_refused, 1);
    eng_model_free(&s4);
    td_stream_free(&other);
    /* another teacher of the same shape (the parent's file replaced before the resume):
     * refused; the old record compared its size only */
    eng_model t2;
    assert_int_equal(eng_model_init(&t2, &f->pa, f->be, err, sizeof err), 0);
    eng_model_randomize(&t2, 99, 0.4f);
    new_student(f, &s4);
    assert_int_equal(distill_run(&t2, &s4, &f->train, &f->val, &o, &r4, err, sizeof err), -1);
    assert_non_null(strstr(err, "another teacher"));
    assert_int_equal(r4.checkpoint_refused, 1);
    eng_model_free(&s4);
    eng_model_free(&t2);
    /* another starting student of the same shape (the prune stage run again on changed
     * input): refused, where the old record let the checkpoint overwrite it */
    new_student(f, &s4);
    float w;
    f->be->to_host(f->be, &w, s4.params, sizeof w);
    w += 0.5f;
    f->be->to_device(f->be, s4.params, &w, sizeof w);
    assert_int_equal(distill_run(&f->parent, &s4, &f->train, &f->val, &o, &r4, err, sizeof err), -1);
    assert_non_null(strstr(err, "another starting student"));
    assert_int_equal(r4.checkpoint_refused, 1);
    eng_model_free(&s4);
    /* a resume that finds the run finished (killed after its last checkpoint) reports the
     * validation loss the run ended with */
    new_student(f, &s4);
    assert_int_equal(distill_run(&f->parent, &s4, &f->train, &f->val, &o, &r4, err, sizeof err), 0);
    assert_int_equal(r4.resumed_from, 12);
    assert_true(isfinite(r3.final_val_loss) && r4.final_val_loss == r3.final_val_loss);
    distill_result_free(&r4);
    eng_model_free(&s4);
    distill_result_free(&r1);
    distill_result_free(&r2);
    distill_result_free(&r3);
    eng_model_free(&s1);
    eng_model_free(&s3);
}

static int stop_at_7(void *ctx, const distill_progress *p)
{
    return p->step == 7 ? *(int *)ctx : 0;
}

/* A run asked to stop (a server shutting down) between checkpoints saves one where it
 * stopped, and the resumed run ends on the weights of one never stopped. */
static void test_stop_saves_where_it_stopped(void **state)
{
    fixture *f = *state;
    char a[600], b[600], err[256];
    snprintf(a, sizeof a, "%s/stop-straight", dir);
    snprintf(b, sizeof b, "%s/stopped", dir);
    eng_model s1, s2, s3;
    distill_result r1, r2, r3;
    new_student(f, &s1);
    run_to(f, a, 0, 0, &r1, &s1);
    distill_opts o;
    run_opts(&o, b);
    o.progress = stop_at_7;
    int how = 1;   /* a cancel: nothing saved, the newest checkpoint is step 6 */
    o.progress_ctx = &how;
    new_student(f, &s2);
    assert_int_equal(distill_run(&f->parent, &s2, &f->train, &f->val, &o, &r2, err, sizeof err), 1);
    assert_int_equal(distill_latest_checkpoint(b), 6);
    distill_result_free(&r2);
    eng_model_free(&s2);
    assert_int_equal(fio_remove_tree(b), 0);
    how = DISTILL_STOP_SAVE;   /* a shutdown */
    new_student(f, &s2);
    assert_int_equal(distill_run(&f->parent, &s2, &f->train, &f->val, &o, &r2, err, sizeof err), 1);
    assert_int_equal(r2.steps, 7);
    assert_int_equal(distill_latest_checkpoint(b), 7);
    new_student(f, &s3);
    run_to(f, b, 0, 0, &r3, &s3);
    assert_int_equal(r3.resumed_from, 7);
    for (int i = 0; i < 12; i++)
        assert_true(r1.loss_curve[i] == r3.loss_curve[i]);
    assert_same_weights(f, &s1, &s3);
    distill_result_free(&r1);
    distill_result_free(&r2);
    distill_result_free(&r3);
    eng_model_free(&s1);
    eng_model_free(&s2);
    eng_model_free(&s3);
}

/* A run killed under one schedule and resumed by a build whose defaults differ: the
 * checkpoint is refused with the new schedule, and distill_resume_schedule takes the one it
 * began with, so the resumed run ends on the weights of a run never stopped. */
static void test_resume_schedule_of_checkpoint(void **state)
{
    fixture *f = *state;
    char a[600], b[600], err[256];
    snprintf(a, sizeof a, "%s/sched_straight", dir);
    snprintf(b, sizeof b, "%s/sched_killed", dir);
    eng_model s1, s2, s3;
    distill_result r1, r2, r3;
    new_student(f, &s1);
    run_to(f, a, 0, 0, &r1, &s1);
    new_student(f, &s2);
    run_to(f, b, 7, 1, &r2, &s2);
    eng_model_free(&s2);
    distill_opts o;   /* run_to's options under other defaults */
    run_opts(&o, b);
    o.lr = 1e-2f;
    o.lr_min = 1e-3f;
    o.warmup_steps = 5;
    new_student(f, &s3);
    assert_int_equal(distill_run(&f->parent, &s3, &f->train, &f->val, &o, &r3, err, sizeof err), -1);
    assert_non_null(strstr(err, "other distillation options"));
    assert_int_equal(distill_resume_schedule(&o, err, sizeof err), 1);
    assert_true(o.lr == 3e-3f && o.lr_min == 3e-4f && o.warmup_steps == 3);   /* base_opts' */
    if (distill_run(&f->parent, &s3, &f->train, &f->val, &o, &r3, err, sizeof err))
        fail_msg("resume: %s", err);
    assert_int_equal(r3.resumed_from, 6);
    assert_same_weights(f, &s1, &s3);
    /* no checkpoint: nothing taken */
    snprintf(a, sizeof a, "%s/sched_none", dir);
    o.ckpt_dir = a;
    o.lr = 1e-2f;
    assert_int_equal(distill_resume_schedule(&o, err, sizeof err), 0);
    assert_true(o.lr == 1e-2f);
    distill_result_free(&r1);
    distill_result_free(&r2);
    distill_result_free(&r3);
    eng_model_free(&s1);
    eng_model_free(&s3);
}

int main(void)
{
    if (!mkdtemp(dir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_and_learning),
        cmocka_unit_test(test_divergence_stops),
        cmocka_unit_test(test_resume_same_curve),
        cmocka_unit_test(test_stop_saves_where_it_stopped),
        cmocka_unit_test(test_seed_orders_the_text),
        cmocka_unit_test(test_resume_schedule_of_checkpoint),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return rc;
}
