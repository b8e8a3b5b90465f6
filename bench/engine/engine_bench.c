/* bench/engine/engine_bench.c — engine speed on a SmolLM2-135M-shaped model with random
 * weights (hidden 576, 30 layers, 9/3 heads, head_dim 64, FFN 1536, vocab 49152, tied):
 * prefill tokens/s (batch 1 and 8 x 512), decode tokens/s (batch 1 and 8 after a 128-token
 * prompt), training-step tokens/s (CE, forward+backward+AdamW), for a model with Mamba-2
 * mixers the selective-state scan of one mixer at batch 1 and its share of the prefill,
 * plus the machine's ceilings
 * measured in the same run: sgemm GFLOP/s on a large square GEMM and memory bandwidth (triad).
 * Usage: engine_bench [--threads N] [--quick] [--precision fp32|bf16|fp16] [--model PATH]. Prints
 * "name value unit" lines. --model: that model's weights and shape instead (any format the
 * product loads; a mixture of experts counts the parameters a token runs through, its router
 * and top-k experts, for FLOP/s and weight bytes). At bf16/fp16 every GEMM runs at that precision (engine/cpu_mm16.h) and the
 * 16-bit GEMM ceiling is measured beside sgemm (which runs on a fp32 backend of its own).
 * Times are process CPU seconds (CLOCK_PROCESS_CPUTIME_ID), robust to a shared, oversubscribed
 * machine for single-threaded runs; wall-clock rates are printed beside as NAME_wall.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ceilings.h"
#include "engine/clock.h"
#include "engine/devices.h"
#include "engine/model.h"
#include "storage/export.h"

/* A timing: CPU seconds and wall seconds; best keeps the smallest CPU time. */
typedef struct {
    double cpu, wall;
} tm_t;

static tm_t tm_start(void)
{
    tm_t t = {eng_cpu_s(), eng_wall_s()};
    return t;
}

static tm_t tm_since(tm_t t0)
{
    tm_t t = {eng_cpu_s() - t0.cpu, eng_wall_s() - t0.wall};
    return t;
}

static double last_wall;   /* wall seconds of the best run of the last bench_* call */

static void die(const char *what, const char *err)
{
    fprintf(stderr, "engine_bench: %s: %s\n", what, err);
    exit(1);
}

/* Prefill B x T (LOGITS_LAST) tokens/s, best of reps. */
static double bench_prefill(eng_model *m, int B, int T, int reps)
{
    char err[256];
    int *tok = malloc(sizeof(int) * (size_t)B * T);
    float *logits = malloc(sizeof(float) * (size_t)B * m->a.vocab_size);
    if (!tok || !logits)
        die("prefill", "out of memory");
    for (int i = 0; i < B * T; i++)
        tok[i] = (i * 7919 + 13) % m->a.vocab_size;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        eng_fwd_args fa = {.tokens = tok, .B = B, .T = T, .logits_mode = ENG_LOGITS_LAST, .logits = logits};
        tm_t t0 = tm_start();
        if (eng_forward(m, &fa, err, sizeof err) != 0)
            die("prefill", err);
        tm_t dt = tm_since(t0);
        if (dt.cpu < best) {
            best = dt.cpu;
            last_wall = dt.wall;
        }
    }
    free(tok);
    free(logits);
    return (double)B * T / best;
}

/* Decode: prompt of P tokens per row, then steps greedy tokens; tokens/s of the decode phase. */
static double bench_decode(eng_model *m, int B, int P, int steps)
{
    char err[256];
    int V = m->a.vocab_size;
    eng_kv_cache *kv = eng_kv_new(m, B, P + steps);
    int *tok = malloc(sizeof(int) * (size_t)B * P);
    float *logits = malloc(sizeof(float) * (size_t)B * V);
    if (!kv || !tok || !logits)
        die("decode", "out of memory");
    for (int i = 0; i < B * P; i++)
        tok[i] = (i * 31 + 5) % V;
    eng_fwd_args pa = {.tokens = tok, .B = B, .T = P, .kv = kv, .logits_mode = ENG_LOGITS_LAST, .logits = logits};
    if (eng_forward(m, &pa, err, sizeof err) != 0)
        die("decode prefill", err);
    int next[64];
    tm_t t0 = tm_start();
    for (int s = 0; s < steps; s++) {
        for (int b = 0; b < B; b++)
            next[b] = eng_sample(logits + (size_t)b * V, V, 0.0f, 1.0f, NULL);
        eng_fwd_args da = {.tokens = next, .B = B, .T = 1, .kv = kv, .logits_mode = ENG_LOGITS_LAST, .logits = logits};
        if (eng_forward(m, &da, err, sizeof err) != 0)
            die("decode", err);
    }
    tm_t dt = tm_since(t0);
    last_wall = dt.wall;
    eng_kv_free(kv);
    free(tok);
    free(logits);
    return (double)B * steps / dt.cpu;
}

/* The selective-state scan of the first Mamba layer's shape (ssm_scan_fwd) over B x T steps
 * of random inputs, best of reps: CPU seconds per call (last_wall its wall seconds); *flop
 * the multiply-adds counted as 2 per state element per step (the update and the readout). */
static double bench_scan(eng_model *m, int B, int T, int reps, double *flop)
{
    const arch_mamba *mb = NULL;
    for (int l = 0; l < m->a.n_layers && !mb; l++)
        mb = m->a.layers[l].mamba.n_heads ? &m->a.layers[l].mamba : NULL;
    if (!mb)
        return 0;
    eng_backend *be = m->be;
    int H = mb->n_heads, P = mb->head_dim, G = mb->n_groups, S = mb->d_state, di = H * P, cd = di + 2 * G * S;
    size_t nx = (size_t)B * T * cd, nd = (size_t)B * T * H, ny = (size_t)B * T * di, ns = (size_t)B * H * P * S;
    float *hx = malloc(sizeof(float) * (nx + nd + 3 * (size_t)H));
    float *x = be->alloc(be, sizeof(float) * (nx + nd + 3 * (size_t)H)), *y = be->alloc(be, sizeof(float) * ny),
          *st = be->alloc(be, sizeof(float) * ns);
    if (!hx || !x || !y || !st)
        die("scan", "out of memory");
    unsigned r = 1;
    for (size_t i = 0; i < nx + nd; i++) {
        r = r * 1103515245u + 12345u;
        hx[i] = (float)((r >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
    for (int h = 0; h < H; h++) {   /* dt_bias, A_log, D */
        hx[nx + nd + h] = -2.0f;
        hx[nx + nd + H + h] = (float)h / H;
        hx[nx + nd + 2 * H + h] = 1.0f;
    }
    be->to_device(be, x, hx, sizeof(float) * (nx + nd + 3 * (size_t)H));
    const float *dt = x + nx, *dtb = dt + nd;
    double best = 1e30;
    for (int k = 0; k < reps; k++) {
        be->zero(be, st, sizeof(float) * ns);
        be->sync(be);
        tm_t t0 = tm_start();
        be->ssm_scan_fwd(be, y, NULL, x, dt, dtb, dtb + H, dtb + 2 * H, st, NULL, B, T, H, P, G, S, 32);
        be->sync(be);
        tm_t d = tm_since(t0);
        if (d.cpu < best) {
            best = d.cpu;
            last_wall = d.wall;
        }
    }
    be->free(be, x, sizeof(float) * (nx + nd + 3 * (size_t)H));
    be->free(be, y, sizeof(float) * ny);
    be->free(be, st, sizeof(float) * ns);
    free(hx);
    *flop = 4.0 * B * T * H * P * S;
    return best;
}

static double bench_train(eng_model *m, int B, int T, int steps)
{
    char err[256];
    int V = m->a.vocab_size;
    if (eng_model_enable_grads(m) != 0)
        die("train", "out of memory for gradients");
    eng_adamw *o = eng_adamw_new(m);
    int *tok = malloc(sizeof(int) * (size_t)B * T), *tg = malloc(sizeof(int) * (size_t)B * T);
    if (!o || !tok || !tg)
        die("train", "out of memory");
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 131 + 7) % V;
        tg[i] = (i * 131 + 138) % V;
    }
    eng_loss_spec ls = {.kind = ENG_LOSS_CE, .targets = tg};
    eng_loss_result lr;
    double best = 1e30;
    for (int s = 0; s < steps; s++) {
        tm_t t0 = tm_start();
        eng_model_zero_grads(m);
        if (eng_forward_backward(m, tok, B, T, &ls, ENG_GRAD_WEIGHTS, &lr, err, sizeof err) != 0)
            die("train", err);
        eng_adamw_step(o, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1.0f);
        tm_t dt = tm_since(t0);
        if (dt.cpu < best) {
            best = dt.cpu;
            last_wall = dt.wall;
        }
    }
    eng_adamw_free(o);
    free(tok);
    free(tg);
    return (double)B * T / best;
}

int main(int argc, char **argv)
{
    eng_blas_pick_kernel(argv);
    int threads = 0, quick = 0;
    const char *precision = "fp32", *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0 || v > 1024) {
                fprintf(stderr, "engine_bench: bad --threads\n");
                return 2;
            }
            threads = (int)v;
        } else if (strcmp(argv[i], "--precision") == 0 && i + 1 < argc) {
            precision = argv[++i];
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
            model = argv[++i];
        } else {
            fprintf(stderr, "usage: engine_bench [--threads N] [--quick] [--precision fp32|bf16|fp16] [--model PATH]\n");
            return 2;
        }
    }
    eng_backend *be = eng_backend_cpu_new(threads);
    if (!be)
        die("backend", "out of memory");
    printf("threads %d\n", be->threads);
    eng_rate gf, bw;
    if (eng_ceil_gemm(be, quick ? 1024 : 2048, 3, &gf) != 0)
        fprintf(stderr, "engine_bench: sgemm: out of memory\n");   /* prints 0, as before */
    printf("sgemm_gflops %.1f GFLOP/s\n", gf.cpu);
    printf("sgemm_gflops_wall %.1f GFLOP/s\n", gf.wall);
    if (eng_ceil_triad((size_t)(quick ? 16 : 64) << 20, be->threads, 5, &bw) != 0)
        fprintf(stderr, "engine_bench: triad: out of memory\n");
    printf("triad_bandwidth %.2f GB/s\n", bw.cpu);
    printf("triad_bandwidth_wall %.2f GB/s\n", bw.wall);
    char err[256];
    if (eng_backend_set_precision(be, precision, err, sizeof err))
        die("precision", err);
    printf("precision %s\n", precision);
    printf("gemm_kernel %s\n", eng_backend_cpu_gemm_kernel(be));
    if (strcmp(precision, "fp32")) {
        eng_rate g16;
        if (eng_ceil_gemm(be, quick ? 1024 : 2048, 3, &g16) != 0)
            die("16-bit GEMM ceiling", "out of memory");
        printf("gemm16_gflops %.1f GFLOP/s\n", g16.cpu);
        printf("gemm16_gflops_wall %.1f GFLOP/s\n", g16.wall);
    }
    fflush(stdout);

    arch a;
    eng_model m;
    if (model) {
        if (exp_load_model(model, be, &m, err, sizeof err) != 0)
            die(model, err);
        if (arch_copy(&a, &m.a) != 0)
            die("arch", "out of memory");
    } else {
        if (arch_preset(&a, "smollm2-135m", 0) != 0)
            die("arch", "out of memory");
        if (eng_model_init(&m, &a, be, err, sizeof err) != 0)
            die("model", err);
        eng_model_randomize(&m, 1, 0.02f);
    }
    /* the parameters a token runs through: an MoE layer's top-k experts, not all */
    double active = (double)m.n_params;
    for (int l = 0; l < a.n_layers; l++) {
        const arch_moe *e = &a.layers[l].moe;
        active -= (double)(e->n_experts - e->top_k) * 3.0 * a.hidden_size * e->expert_ffn_dim;
    }
    double weight_bytes = active * 4;
    printf("params %zu\n", m.n_params);
    printf("active_params %.0f\n", active);
    /* FLOPs per token for the projections (2 * non-embedding active params) */
    double flop_tok = 2.0 * (active - (double)a.vocab_size * a.hidden_size - a.hidden_size);
    int T = quick ? 128 : 512;
    eng_model_const(&m, 1);   /* served as the product serves it: the weights hold still */
    bench_prefill(&m, 1, 64, 1);   /* warm-up */
    double p1 = bench_prefill(&m, 1, T, quick ? 1 : 2);
    printf("prefill_b1 %.1f tok/s (T=%d; %.1f GFLOP/s in projections)\n", p1, T, p1 * flop_tok / 1e9);
    printf("prefill_b1_wall %.1f tok/s\n", T / last_wall);
    fflush(stdout);
    double p1_wall = last_wall, scan_flop = 0, sc = bench_scan(&m, 1, T, 3, &scan_flop);
    if (sc > 0) {   /* the scan's share of the prefill: every Mamba layer runs one */
        int nm = 0;
        for (int l = 0; l < a.n_layers; l++)
            nm += a.layers[l].mamba.n_heads > 0;
        printf("ssm_scan_b1 %.2f ms per Mamba layer (T=%d; %.1f GFLOP/s, %.0f%% of sgemm)\n", sc * 1e3, T,
               scan_flop / sc / 1e9, 100 * scan_flop / sc / 1e9 / gf.cpu);
        printf("ssm_scan_b1_wall %.2f ms per Mamba layer, x %d layers = %.0f%% of prefill_b1_wall\n", last_wall * 1e3,
               nm, 100 * nm * last_wall / p1_wall);
        fflush(stdout);
    }
    double p8 = bench_prefill(&m, 8, T, 1);
    printf("prefill_b8 %.1f tok/s (T=%d; %.1f GFLOP/s in projections)\n", p8, T, p8 * flop_tok / 1e9);
    printf("prefill_b8_wall %.1f tok/s\n", 8.0 * T / last_wall);
    fflush(stdout);
    int steps = quick ? 8 : 32;
    double d1 = bench_decode(&m, 1, 128, steps);
    printf("decode_b1 %.2f tok/s (prompt 128, %d steps; %.2f GB/s of weights read)\n", d1, steps, d1 * weight_bytes / 1e9);
    printf("decode_b1_wall %.2f tok/s\n", steps / last_wall);
    fflush(stdout);
    double d8 = bench_decode(&m, 8, 128, steps);
    printf("decode_b8 %.2f tok/s (prompt 128, %d steps)\n", d8, steps);
    printf("decode_b8_wall %.2f tok/s\n", 8.0 * steps / last_wall);
    fflush(stdout);
    int TB = quick ? 1 : 4, TT = quick ? 64 : 256;
    eng_model_const(&m, 0);   /* training writes them */
    double tr = bench_train(&m, TB, TT, quick ? 1 : 2);
    printf("train_step %.1f tok/s (B=%d T=%d, CE, fwd+bwd+AdamW)\n", tr, TB, TT);
    printf("train_step_wall %.1f tok/s\n", (double)TB * TT / last_wall);
    printf("peak_bytes %zu\n", be->peak_bytes);
    eng_model_free(&m);
    arch_free(&a);
    eng_backend_free(be);
    return 0;
}
