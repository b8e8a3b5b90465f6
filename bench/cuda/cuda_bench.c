/* bench/cuda/cuda_bench.c — GPU measurements for bench/gpu_check.sh: the two ceilings
 * (GEMM TFLOP/s, device copy GB/s), prefill and decode tokens/s of a SmolLM2-135M-shaped
 * model (or of any arch JSON with random weights: --arch, e.g. the Nemotron-H-shaped
 * hybrids beside this file) with their share of those ceilings, and a real checkpoint
 * (stories260K) run on a device against the CPU backend. Prints "KEY value" lines. Also
 * runs on "cpu" (for checking the tool itself). Not part of the product.
 * Usage: cuda_bench ceilings|model|compare [--device D] [--prec fp32|bf16] [--T n]
 *        [--steps n] [--layers n] [--batch n] [--model PATH] [--arch FILE] [--train]
 *        [--scan auto|recurrent]
 * --train: also a training step's tokens/s (forward + backward of CE) on the prompt.
 * --scan recurrent: the Mamba-2 scan step by step at prefill and in training too (the
 * default, auto, runs rows of a chunk or more in the chunked form), for comparing the two.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ceilings.h"
#include "engine/clock.h"
#include "engine/devices.h"
#include "engine/model.h"
#include "storage/archjson.h"
#include "storage/fileio.h"
#include "storage/modelio.h"
#if defined(AC_CUDA) && AC_CUDA
#include "cuda/backend_cuda.h"
#endif

typedef struct {
    const char *device, *prec, *model, *arch, *scan;
    int T, steps, layers, batch, train;
} opts;

static int parse_int(const char *s, int *out)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!s[0] || *end || v <= 0 || v > 1 << 24)
        return -1;
    *out = (int)v;
    return 0;
}

static int set_prec(eng_backend *be, const char *prec)
{
    char err[256];
    if (eng_backend_set_precision(be, prec, err, sizeof err) != 0) {
        fprintf(stderr, "cuda_bench: %s\n", err);
        return -1;
    }
    return 0;
}

/* The CUDA backend's scan form (cuda/backend_cuda.h); "auto" on any backend. */
static int set_scan(eng_backend *be, const char *scan)
{
    if (!strcmp(scan, "auto"))
        return 0;
#if defined(AC_CUDA) && AC_CUDA
    if (!strcmp(scan, "recurrent") && cu_backend_set_scan(be, CU_SCAN_RECURRENT) == 0)
        return 0;
#else
    (void)be;
#endif
    fprintf(stderr, "cuda_bench: --scan %s: not a scan form of this backend (auto, or recurrent on CUDA)\n", scan);
    return -1;
}

/* ---- ceilings -------------------------------------------------------------------- */

static int run_ceilings(const opts *o)
{
    char err[256];
    eng_backend *be = eng_backend_new(o->device, err, sizeof err);
    if (!be) {
        fprintf(stderr, "cuda_bench: %s\n", err);
        return 1;
    }
    /* copy bandwidth: device to device, counted as bytes read + bytes written */
    size_t bytes = strncmp(o->device, "cuda", 4) == 0 ? (size_t)512 << 20 : (size_t)64 << 20;
    eng_rate bw;
    if (eng_ceil_copy(be, bytes, 10, &bw) != 0) {
        fprintf(stderr, "cuda_bench: cannot allocate 2 x %zu bytes\n", bytes);
        eng_backend_free(be);
        return 1;
    }
    printf("copy_GBps %.1f\n", bw.wall);
#if defined(AC_CUDA) && AC_CUDA
    if (strncmp(o->device, "cuda", 4) == 0) {
        int n = 8192;
        double f32 = cu_gemm_tflops(be, CU_PREC_FP32, n, n, n, 10, err, sizeof err);
        if (f32 < 0)
            fprintf(stderr, "cuda_bench: fp32 gemm: %s\n", err);
        double b16 = cu_gemm_tflops(be, CU_PREC_BF16, n, n, n, 20, err, sizeof err);
        if (b16 < 0)
            fprintf(stderr, "cuda_bench: bf16 gemm: %s\n", err);
        printf("gemm_fp32_TFLOPs %.2f\n", f32);
        printf("gemm_bf16_TFLOPs %.2f\n", b16);
        eng_backend_free(be);
        return f32 > 0 && b16 > 0 ? 0 : 1;
    }
#endif
    /* any backend: through its gemm op, fp32 */
    eng_rate gf;
    if (eng_ceil_gemm(be, 1024, 5, &gf) != 0) {
        fprintf(stderr, "cuda_bench: out of memory\n");
        eng_backend_free(be);
        return 1;
    }
    printf("gemm_fp32_TFLOPs %.3f\n", gf.wall / 1e3);
    eng_backend_free(be);
    return 0;
}

/* ---- SmolLM2-135M-shaped model --------------------------------------------------- */

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Matmul weights one token passes through: projections, the routed experts it runs
 * (top_k of them), shared experts, latent projections, router, Mamba in/out projections,
 * and the LM head. */
static double active_linear(const arch *a)
{
    double C = a->hidden_size, D = a->head_dim, g = arch_mlp_gated(a) ? 3.0 : 2.0, lin = C * a->vocab_size;
    for (int l = 0; l < a->n_layers; l++) {
        const arch_layer *L = &a->layers[l];
        const arch_mamba *m = &L->mamba;
        const arch_moe *e = &L->moe;
        lin += C * D * (2.0 * L->n_heads + 2.0 * L->n_kv_heads) + g * C * L->ffn_dim;
        if (m->n_heads)
            lin += C * (2.0 * arch_mamba_inner(m) + arch_mamba_conv_dim(m) + m->n_heads);
        if (e->n_experts)
            lin += C * e->n_experts + e->top_k * g * arch_moe_io(e, (int)C) * e->expert_ffn_dim +
                   g * C * e->shared_ffn_dim + 2.0 * C * e->latent_dim;
    }
    return lin;
}

static int load_arch(const opts *o, arch *a)
{
    if (!o->arch)
        return arch_preset(a, "smollm2-135m", o->layers) == 0 ? 0 : (fprintf(stderr, "cuda_bench: out of memory\n"), -1);
    char err[256];
    size_t n = 0;
    char *text = fio_read_all(o->arch, 1 << 20, &n, err, sizeof err);
    if (!text) {
        fprintf(stderr, "cuda_bench: %s\n", err);
        return -1;
    }
    int rc = arch_from_json_text(text, n, a, err, sizeof err);
    free(text);
    if (rc != 0)
        fprintf(stderr, "cuda_bench: %s: %s\n", o->arch, err);
    return rc;
}

static int run_model(const opts *o)
{
    char err[256];
    eng_backend *be = eng_backend_new(o->device, err, sizeof err);
    if (!be) {
        fprintf(stderr, "cuda_bench: %s\n", err);
        return 1;
    }
    if (set_prec(be, o->prec) != 0 || set_scan(be, o->scan) != 0)
        return 1;
    arch a;
    eng_model m;
    if (load_arch(o, &a) != 0)
        return 1;
    if (eng_model_init(&m, &a, be, err, sizeof err) != 0) {
        fprintf(stderr, "cuda_bench: model: %s\n", err);
        return 1;
    }
    eng_model_randomize(&m, 1, 0.02f);
    int B = o->batch, T = o->T, V = a.vocab_size, C = a.hidden_size;
    eng_kv_cache *kv = eng_kv_new(&m, B, T + o->steps + 1);
    int *tok = malloc(sizeof(int) * (size_t)B * T);
    float *logits = malloc(sizeof(float) * (size_t)B * V);
    double *runs = malloc(sizeof(double) * (size_t)(o->steps > 5 ? o->steps : 5));
    if (!kv || !tok || !logits || !runs) {
        fprintf(stderr, "cuda_bench: out of memory\n");
        return 1;
    }
    for (int i = 0; i < B * T; i++)
        tok[i] = (int)((i * 7919u + 13u) % (unsigned)V);
    /* prefill: median of 5 after one warm-up */
    for (int r = -1; r < 5; r++) {
        eng_kv_reset(kv);
        eng_fwd_args fa = {.tokens = tok, .B = B, .T = T, .kv = kv, .logits_mode = ENG_LOGITS_LAST, .logits = logits};
        be->sync(be);
        double t0 = eng_wall_s();
        if (eng_forward(&m, &fa, err, sizeof err) != 0) {
            fprintf(stderr, "cuda_bench: prefill: %s\n", err);
            return 1;
        }
        be->sync(be);
        if (r >= 0)
            runs[r] = eng_wall_s() - t0;
    }
    qsort(runs, 5, sizeof *runs, cmp_double);
    double prefill_s = runs[2];
    /* decode: steps single-token forwards after the prompt (the last prefill's cache) */
    int *next = malloc(sizeof(int) * (size_t)B);
    if (!next)
        return 1;
    for (int s = 0; s < o->steps; s++) {
        for (int b = 0; b < B; b++)
            next[b] = eng_sample(logits + (size_t)b * V, V, 0.0f, 1.0f, NULL);
        eng_fwd_args fd = {.tokens = next, .B = B, .T = 1, .kv = kv, .logits_mode = ENG_LOGITS_LAST, .logits = logits};
        double t0 = eng_wall_s();
        if (eng_forward(&m, &fd, err, sizeof err) != 0) {
            fprintf(stderr, "cuda_bench: decode: %s\n", err);
            return 1;
        }
        be->sync(be);
        runs[s] = eng_wall_s() - t0;
    }
    qsort(runs, (size_t)o->steps, sizeof *runs, cmp_double);
    double step_s = runs[o->steps / 2];
    /* work: matmul FLOPs 2 * (active matmul weights) per token, plus causal attention
     * 2 * 2 * Hq*D * (keys per query) per token and layer (the Mamba scan's few FLOPs
     * per token are left out) */
    double lin = active_linear(&a);
    double attn_pf = 0;
    for (int l = 0; l < a.n_layers; l++)
        attn_pf += 4.0 * a.layers[l].n_heads * a.head_dim * (T + 1) / 2.0;   /* mean keys per query */
    double pf_flops = (double)B * T * (2.0 * lin + attn_pf);
    printf("params %lld\n", (long long)arch_params(&a));
    printf("prefill_tokens_per_s %.1f\n", B * T / prefill_s);
    printf("prefill_ms %.3f\n", prefill_s * 1e3);
    printf("prefill_TFLOPs %.3f\n", pf_flops / prefill_s / 1e12);
    /* decode bytes per step: every active weight once (fp32) + the KV cache read + the
     * Mamba states read and written */
    double kv_bytes = 0;
    for (int l = 0; l < a.n_layers; l++) {
        const arch_mamba *mb = &a.layers[l].mamba;
        kv_bytes += 2.0 * 4.0 * B * (T + o->steps / 2.0) * a.layers[l].n_kv_heads * a.head_dim;
        kv_bytes += 2.0 * 4.0 * B * ((double)arch_mamba_inner(mb) * mb->d_state +
                                     (double)arch_mamba_conv_dim(mb) * (mb->conv_kernel > 0 ? mb->conv_kernel - 1 : 0));
    }
    double w_bytes = 4.0 * (lin + (double)C * (2 * a.n_layers + 1));
    printf("decode_tokens_per_s %.1f\n", B / step_s);
    printf("decode_ms_per_step %.3f\n", step_s * 1e3);
    printf("decode_GBps %.1f\n", (w_bytes + kv_bytes) / step_s / 1e9);
    printf("peak_bytes %zu\n", be->peak_bytes);
    /* a training step (forward + backward of next-token CE, weight gradients) on the same
     * B x T tokens: median of 3 after one warm-up; 3 x the forward's matmul FLOPs */
    if (o->train) {
        int *tgt = malloc(sizeof(int) * (size_t)B * T);
        if (!tgt || eng_model_enable_grads(&m) != 0) {
            fprintf(stderr, "cuda_bench: train: out of memory\n");
            return 1;
        }
        for (int i = 0; i < B * T; i++)
            tgt[i] = (i % T == T - 1) ? -1 : tok[i + 1];
        eng_loss_spec ce = {.kind = ENG_LOSS_CE, .targets = tgt};
        eng_loss_result lr;
        for (int r = -1; r < 3; r++) {
            eng_model_zero_grads(&m);
            be->sync(be);
            double t0 = eng_wall_s();
            if (eng_forward_backward(&m, tok, B, T, &ce, ENG_GRAD_WEIGHTS, &lr, err, sizeof err) != 0) {
                fprintf(stderr, "cuda_bench: train: %s\n", err);
                return 1;
            }
            be->sync(be);
            if (r >= 0)
                runs[r] = eng_wall_s() - t0;
        }
        qsort(runs, 3, sizeof *runs, cmp_double);
        printf("train_tokens_per_s %.1f\n", B * T / runs[1]);
        printf("train_TFLOPs %.3f\n", 3.0 * pf_flops / runs[1] / 1e12);
        free(tgt);
    }
    if (eng_backend_check(be, err, sizeof err) != 0) {
        fprintf(stderr, "cuda_bench: %s\n", err);
        return 1;
    }
    free(next);
    free(runs);
    free(tok);
    free(logits);
    eng_kv_free(kv);
    eng_model_free(&m);
    arch_free(&a);
    eng_backend_free(be);
    return 0;
}

/* ---- a real checkpoint on a device vs the CPU ------------------------------------- */

/* Greedy-generate n tokens from BOS (token 1) with a KV cache; logits of every step
 * into lg [n, V]. Returns 0 or -1. */
static int greedy(eng_model *m, int n, int *out, float *lg, char *err, size_t errlen)
{
    int V = m->a.vocab_size, cur = 1;
    eng_kv_cache *kv = eng_kv_new(m, 1, n + 1);
    if (!kv) {
        snprintf(err, errlen, "kv cache: out of memory");
        return -1;
    }
    for (int s = 0; s < n; s++) {
        eng_fwd_args f = {.tokens = &cur, .B = 1, .T = 1, .kv = kv, .logits_mode = ENG_LOGITS_LAST,
                          .logits = lg + (size_t)s * V};
        if (eng_forward(m, &f, err, errlen) != 0) {
            eng_kv_free(kv);
            return -1;
        }
        cur = out[s] = eng_sample(lg + (size_t)s * V, V, 0.0f, 1.0f, NULL);
    }
    eng_kv_free(kv);
    return 0;
}

static int run_compare(const opts *o)
{
    char err[256];
    eng_backend *cpu = eng_backend_cpu_new(0), *dev = eng_backend_new(o->device, err, sizeof err);
    if (!cpu || !dev) {
        fprintf(stderr, "cuda_bench: %s\n", dev ? "cpu backend: out of memory" : err);
        return 1;
    }
    eng_model mc, md;
    if (mio_load_model(o->model, NULL, cpu, &mc, NULL, err, sizeof err) != 0 ||
        mio_load_model(o->model, NULL, dev, &md, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "cuda_bench: %s: %s\n", o->model, err);
        return 1;
    }
    int n = o->steps, V = mc.a.vocab_size;
    int *tc = malloc(sizeof(int) * (size_t)n), *td = malloc(sizeof(int) * (size_t)n);
    float *lc = malloc(sizeof(float) * (size_t)n * V), *ld = malloc(sizeof(float) * (size_t)n * V);
    if (!tc || !td || !lc || !ld)
        return 1;
    if (greedy(&mc, n, tc, lc, err, sizeof err) != 0 || greedy(&md, n, td, ld, err, sizeof err) != 0) {
        fprintf(stderr, "cuda_bench: generate: %s\n", err);
        return 1;
    }
    int same = 0;
    while (same < n && tc[same] == td[same])
        same++;
    /* compare logits over the common prefix (after it the inputs differ) */
    double dmax = 0, cmax = 0;
    for (size_t i = 0; i < (size_t)(same < n ? same + 1 : n) * V; i++) {
        double d = fabs((double)ld[i] - lc[i]);
        if (!(d <= dmax))
            dmax = d;
        if (fabs(lc[i]) > cmax)
            cmax = fabs(lc[i]);
    }
    /* a full-sequence prefill on the device against the CPU's decode logits */
    float *lp = malloc(sizeof(float) * (size_t)n * V);
    int *seq = malloc(sizeof(int) * (size_t)n);
    if (!lp || !seq)
        return 1;
    seq[0] = 1;
    for (int i = 1; i < n; i++)
        seq[i] = tc[i - 1];
    eng_fwd_args f = {.tokens = seq, .B = 1, .T = n, .logits_mode = ENG_LOGITS_ALL, .logits = lp};
    if (eng_forward(&md, &f, err, sizeof err) != 0) {
        fprintf(stderr, "cuda_bench: prefill: %s\n", err);
        return 1;
    }
    double pmax = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        double d = fabs((double)lp[i] - lc[i]);
        if (!(d <= pmax))
            pmax = d;
    }
    if (eng_backend_check(dev, err, sizeof err) != 0) {
        fprintf(stderr, "cuda_bench: %s\n", err);
        return 1;
    }
    printf("model_tokens %d\n", n);
    printf("greedy_tokens_equal %d\n", same);
    printf("decode_logits_max_rel_err %.3e\n", cmax > 0 ? dmax / cmax : dmax);
    printf("prefill_logits_max_rel_err %.3e\n", cmax > 0 ? pmax / cmax : pmax);
    free(lp);
    free(seq);
    free(tc);
    free(td);
    free(lc);
    free(ld);
    eng_model_free(&mc);
    eng_model_free(&md);
    eng_backend_free(cpu);
    eng_backend_free(dev);
    return same == n ? 0 : 1;
}

int main(int argc, char **argv)
{
    eng_blas_pick_kernel(argv);
    opts o = {.device = "cuda:0", .prec = "fp32", .model = NULL, .arch = NULL, .scan = "auto", .T = 512, .steps = 64, .layers = 30, .batch = 1};
    if (argc < 2) {
        fprintf(stderr, "usage: cuda_bench ceilings|model|compare [--device D] [--prec fp32|bf16] [--T n] "
                        "[--steps n] [--layers n] [--batch n] [--model PATH] [--arch FILE] [--train] "
                        "[--scan auto|recurrent]\n");
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(k, "--train") == 0) {   /* a flag: no value */
            o.train = 1;
            continue;
        }
        int bad = !v;
        if (!bad && strcmp(k, "--device") == 0)
            o.device = v;
        else if (!bad && strcmp(k, "--prec") == 0)
            o.prec = v;
        else if (!bad && strcmp(k, "--model") == 0)
            o.model = v;
        else if (!bad && strcmp(k, "--arch") == 0)
            o.arch = v;
        else if (!bad && strcmp(k, "--scan") == 0)
            o.scan = v;
        else if (!bad && strcmp(k, "--T") == 0)
            bad = parse_int(v, &o.T);
        else if (!bad && strcmp(k, "--steps") == 0)
            bad = parse_int(v, &o.steps);
        else if (!bad && strcmp(k, "--layers") == 0)
            bad = parse_int(v, &o.layers);
        else if (!bad && strcmp(k, "--batch") == 0)
            bad = parse_int(v, &o.batch);
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "cuda_bench: bad option %s\n", k);
            return 2;
        }
        i++;
    }
    if (strcmp(argv[1], "ceilings") == 0)
        return run_ceilings(&o);
    if (strcmp(argv[1], "model") == 0)
        return run_model(&o);
    if (strcmp(argv[1], "compare") == 0) {
        if (!o.model) {
            fprintf(stderr, "cuda_bench: compare needs --model PATH\n");
            return 2;
        }
        return run_compare(&o);
    }
    fprintf(stderr, "cuda_bench: unknown command %s\n", argv[1]);
    return 2;
}
