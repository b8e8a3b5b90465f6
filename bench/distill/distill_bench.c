/* bench/distill/distill_bench.c — training tokens/s of one distillation step on
 * SmolLM2-135M shapes with random weights: teacher = the parent (hidden 576, 30 layers,
 * 9/3 heads, FFN 1536, vocab 49152, tied), student = the ~25% cheaper pruned arch
 * (hidden 512, FFN 1152). One step = teacher forward + student forward/backward on the
 * KD loss (T=1) + AdamW with clipping, the same step bench/distill/torch_step.py times
 * in PyTorch, run by the product's loop (distill_run, one micro-batch a step). Also measures the machine's two ceilings in the same run: sgemm GFLOP/s
 * (1024^3 through the backend) and STREAM-triad bandwidth; with --precision bf16 the
 * step's GEMMs run at bf16 (engine/cpu_mm16.h) and the bf16 GEMM ceiling is measured
 * beside the fp32 one, each through a backend of its own precision. Prints one JSON line.
 * --device cuda:N runs it on a GPU (the GEMM ceilings then through that device at 4096^3;
 * the host triad is left out: bench/gpu_check.sh measures the device's copy bandwidth).
 * Usage: distill_bench [--threads N] [--batch B] [--seq T] [--steps S] [--precision fp32|bf16|fp16]
 *                      [--device cpu|cuda:N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/calibrate.h"
#include "compress/distill.h"
#include "engine/ceilings.h"
#include "engine/clock.h"
#include "engine/devices.h"
#include "engine/model.h"
#include "engine/rng.h"

/* Each step's wall time, from the progress callback. */
typedef struct {
    double *t, last;
    int n;
} step_times;

static int on_step(void *ctx, const distill_progress *p)
{
    step_times *st = ctx;
    double now = eng_wall_s();
    st->t[st->n++] = now - st->last;
    st->last = now;
    (void)p;
    return 0;
}

/* The SmolLM2-135M shape with `hidden` and every layer's FFN set as given. */
static void smol_arch(arch *a, int hidden, int ffn)
{
    if (arch_preset(a, "smollm2-135m", 0) != 0) {
        fprintf(stderr, "distill_bench: out of memory\n");
        exit(1);
    }
    a->hidden_size = hidden;
    for (int l = 0; l < a->n_layers; l++)
        a->layers[l].ffn_dim = ffn;
}

int main(int argc, char **argv)
{
    eng_blas_pick_kernel(argv);
    int threads = 2, B = 1, T = 128, steps = 3;
    const char *precision = "fp32", *device = "cpu";
    for (int i = 1; i + 1 < argc; i += 2) {
        long v = strtol(argv[i + 1], NULL, 10);
        if (!strcmp(argv[i], "--precision"))
            precision = argv[i + 1];
        else if (!strcmp(argv[i], "--device"))
            device = argv[i + 1];
        else if (!strcmp(argv[i], "--threads"))
            threads = (int)v;
        else if (!strcmp(argv[i], "--batch"))
            B = (int)v;
        else if (!strcmp(argv[i], "--seq"))
            T = (int)v;
        else if (!strcmp(argv[i], "--steps"))
            steps = (int)v;
        else {
            fprintf(stderr, "usage: distill_bench [--threads N] [--batch B] [--seq T] [--steps S] "
                            "[--precision fp32|bf16|fp16] [--device cpu|cuda:N]\n");
            return 2;
        }
    }
    if (threads < 1 || B < 1 || T < 2 || steps < 1) {
        fprintf(stderr, "distill_bench: bad arguments\n");
        return 2;
    }
    char err[512];
    int cpu = !strcmp(device, "cpu");
    eng_backend *be = cal_backend_new(device, precision, threads, err, sizeof err);
    if (!be) {
        fprintf(stderr, "distill_bench: %s\n", err);
        return 1;
    }
    arch pa, sa;
    smol_arch(&pa, 576, 1536);
    smol_arch(&sa, 512, 1152);
    eng_model teacher, student;
    if (!be || eng_model_init(&teacher, &pa, be, err, sizeof err) ||
        eng_model_init(&student, &sa, be, err, sizeof err)) {
        fprintf(stderr, "distill_bench: %s\n", err);
        return 1;
    }
    eng_model_randomize(&teacher, 1, 0.02f);
    eng_model_randomize(&student, 2, 0.02f);
    /* the product's loop (compress/distill.h), one B x T micro-batch a step, step 0 a
     * warm-up; random tokens */
    td_stream train = {malloc(sizeof(int) * ((size_t)(steps + 1) * B * T + 1)), (size_t)(steps + 1) * B * T + 1};
    if (!train.ids) {
        fprintf(stderr, "distill_bench: out of memory\n");
        return 1;
    }
    uint64_t x = 7;
    for (size_t i = 0; i < train.n; i++)
        train.ids[i] = (int)(eng_xorshift64(&x) % 49152);
    distill_opts o;
    distill_opts_defaults(&o);
    o.B = B, o.T = T, o.accum = 1;
    o.tokens = (int64_t)(steps + 1) * B * T;
    o.eval_every = 0, o.ckpt_every = 0;
    step_times st = {.t = calloc((size_t)steps + 1, sizeof(double)), .last = eng_wall_s()};
    o.progress = on_step;
    o.progress_ctx = &st;
    distill_result res;
    if (!st.t || distill_run(&teacher, &student, &train, NULL, &o, &res, err, sizeof err) ||
        eng_backend_check(be, err, sizeof err)) {
        fprintf(stderr, "distill_bench: %s\n", st.t ? err : "out of memory");
        return 1;
    }
    double best = 1e30, total = 0, loss = res.final_loss;
    for (int i = 1; i <= steps; i++) {
        total += st.t[i];
        best = st.t[i] < best ? st.t[i] : best;
    }
    distill_result_free(&res);
    td_stream_free(&train);
    free(st.t);
    /* operand workspace + kept 16-bit weights (CPU) */
    size_t copies = cpu ? eng_backend_cpu_workspace_bytes(be) : 0;
    eng_rate gf = {0, 0}, g16 = {0, 0}, bw = {0, 0};   /* wall-clock rates, as the steps are timed */
    int n = cpu ? 1024 : 4096;
    eng_backend *b32 = cal_backend_new(device, "fp32", threads, err, sizeof err);
    if (!b32 || eng_ceil_gemm(b32, n, 3, &gf) != 0)
        fprintf(stderr, "distill_bench: sgemm ceiling: %s\n", b32 ? "out of memory" : err);   /* prints 0 */
    eng_backend_free(b32);
    if (strcmp(precision, "fp32") && eng_ceil_gemm(be, n, 3, &g16) != 0)
        fprintf(stderr, "distill_bench: %s GEMM: out of memory\n", precision);
    if (cpu && eng_ceil_triad((size_t)64 << 20, threads, 5, &bw) != 0)
        fprintf(stderr, "distill_bench: triad: out of memory\n");
    printf("{\"impl\": \"autocompress\", \"device\": \"%s\", \"precision\": \"%s\", \"gemm_kernel\": \"%s\", "
           "\"threads\": %d, "
           "\"batch\": %d, \"seq\": %d, \"steps\": %d, "
           "\"best_step_s\": %.4f, \"mean_step_s\": %.4f, \"tokens_per_s\": %.2f, \"mean_tokens_per_s\": %.2f, "
           "\"loss\": %.4f, \"student_params\": %lld, \"teacher_params\": %lld, "
           "\"sgemm_gflops\": %.1f, \"gemm16_gflops\": %.1f, \"triad_gbs\": %.2f, \"gemm16_copies_bytes\": %zu}\n",
           device, precision, cpu ? eng_backend_cpu_gemm_kernel(be) : "cuBLAS", threads, B, T, steps, best, total / steps, B * T / best, B * T * steps / total, loss,
           (long long)arch_params(&sa), (long long)arch_params(&pa), gf.wall, g16.wall, bw.wall, copies);
    eng_model_free(&student);
    eng_model_free(&teacher);
    arch_free(&pa);
    arch_free(&sa);
    eng_backend_free(be);
    return 0;
}
