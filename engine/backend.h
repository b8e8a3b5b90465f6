/* engine/backend.h — the backend interface: a table of function pointers that model
 * code calls for every allocation and every numerical op. The CPU backend
 * (engine/backend_cpu.c) is the reference; the CUDA backend (cuda/) implements the same
 * table. Buffers are device memory of the backend; fp32 unless an op says otherwise.
 * Allocation is accounted (current and peak bytes) so memory predictions can be
 * checked against measurement.
 *
 * Conventions for the ops below: every tensor is dense row-major; shapes are given in
 * brackets with the fastest index last. N is a row count (tokens, B*T). "acc" means the
 * op ADDS into that output (+=), "out" means it overwrites. Integer arrays (tokens,
 * positions, lengths, targets) are device int32. Scalars passed as `const float *..._dev`
 * live in device memory (mask gates); plain float scalars are host values. Ops are
 * asynchronous on a device backend; sync() waits; results read with to_host are ready
 * after it (to_host itself synchronizes). No op allocates unless its comment says so.
 * A backend is driven by one host thread at a time (the accounting is not atomic).
 */
#ifndef AC_ENGINE_BACKEND_H
#define AC_ENGINE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {   /* the CUDA backend (C++) calls the C functions below */
#endif

typedef struct eng_backend eng_backend;

/* Query rows per attention tile in the CPU backend (its attention scratch per thread is
 * ENG_CPU_ATTN_ROWS x S floats). */
#define ENG_CPU_ATTN_ROWS 32

struct eng_backend {
    const char *name;            /* "cpu", "cuda:0" */
    int threads;                 /* CPU worker threads (0 = default) */
    size_t cur_bytes, peak_bytes;/* accounted device bytes */
    int host_memory;             /* 1: buffers are host memory the caller may read and write
                                    directly (the CPU backend); 0: device memory, only through
                                    to_device / to_host */
    void *impl;                  /* backend private state */
    void *checks;                /* the op check's state (eng_backend_check_ops), else NULL */

    /* Memory. alloc returns NULL on failure (nothing accounted). Allocations are
     * 64-byte aligned and NOT zeroed. free(NULL, 0) is a no-op; `bytes` must be the
     * size passed to alloc. */
    void *(*alloc)(eng_backend *be, size_t bytes);
    void (*free)(eng_backend *be, void *p, size_t bytes);
    void (*to_device)(eng_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*to_host)(eng_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*copy)(eng_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(eng_backend *be, void *dst, size_t bytes);
    void (*sync)(eng_backend *be);
    /* Release impl and the struct itself (called by eng_backend_free). */
    void (*destroy)(eng_backend *be);

    /* ---- dense algebra ------------------------------------------------------------
     * gemm: C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C.
     *   ta = 0: A is stored [M,K] with row stride lda (>= K); ta = 1: A stored [K,M], lda >= M.
     *   tb = 0: B is stored [K,N] with row stride ldb (>= N); tb = 1: B stored [N,K], ldb >= K.
     *   C has row stride ldc (>= N). beta = 0 ignores C's old contents (even NaN).
     * A linear layer y = x W^T (W [out,in] as in HF) is gemm(0,1, N,out,in, 1, x,in, W,in, 0, y,out). */
    void (*gemm)(eng_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

    /* ---- normalization --------------------------------------------------------------
     * rmsnorm_fwd: for each row n of x[N,C]:
     *   rstd[n] = 1 / sqrt(sum_c x[n,c]^2 / n_eff + eps);  y[n,c] = x[n,c] * rstd[n] * w[c].
     *   n_eff is the divisor (C for a plain model; the hidden mask's kept count otherwise).
     *   y [N,C] out (may not alias x); rstd [N] out (may be NULL when not needed).
     * rmsnorm_bwd: given dy [N,C], x, w, rstd from the forward:
     *   dx [N,C] acc:  dx += rstd*w*dy - x * rstd^3 / n_eff * sum_c(dy*w*x)
     *   dw [C]   acc (may be NULL):  dw += sum_n dy * x * rstd
     *   d_neff [1] acc (device scalar, may be NULL):
     *            d_neff += sum_n rstd^3 * sum_c(x^2) / (2 n_eff^2) * sum_c(dy*w*x)  */
    void (*rmsnorm_fwd)(eng_backend *be, float *y, float *rstd, const float *x, const float *w,
                        int N, int C, float n_eff, float eps);
    void (*rmsnorm_bwd)(eng_backend *be, float *dx, float *dw, float *d_neff, const float *dy,
                        const float *x, const float *w, const float *rstd, int N, int C, float n_eff);

    /* ---- rotary position embedding (HF rotate_half layout) -------------------------
     * x [N,H,D] in place; pos [N] (device int) the absolute position of each row;
     * inv_freq [D/2] (device). For i < D/2, angle = pos*inv_freq[i]:
     *   fwd: (x1, x2) = (x[i], x[i+D/2]) -> (x1 cos - x2 sin, x2 cos + x1 sin)
     *   bwd: the transpose (rotation by -angle), applied to a gradient in place.        */
    void (*rope_fwd)(eng_backend *be, float *x, const int *pos, const float *inv_freq, int N, int H, int D);
    void (*rope_bwd)(eng_backend *be, float *dx, const int *pos, const float *inv_freq, int N, int H, int D);

    /* ---- causal grouped-query attention ---------------------------------------------
     * q [B,T,Hq,D] (T new queries per row), k, v [B,S,Hkv,D] (the whole key/value
     * sequence of each row: a KV cache of capacity S, or the prompt itself with S = T).
     * pos0 [B] (device int): position of row b's first query (= tokens already cached).
     * lens [B] (device int): valid queries of row b (right padding beyond them).
     * Query t of row b (t < lens[b]) attends keys j <= pos0[b] + t; its head h uses KV
     * head h / (Hq/Hkv). scale multiplies q.k (usually 1/sqrt(D)).
     *   out [B,T,Hq,D] out; padded queries (t >= lens[b]) get 0.
     *   lse [B,T,Hq] out (may be NULL): log-sum-exp of the scaled scores, for backward.
     * Implementations must not materialize [B,Hq,T,S] scores (CPU: per-thread tiles of
     * ENG_CPU_ATTN_ROWS x S floats, allocated through be->alloc for the duration of the
     * call: threads * ENG_CPU_ATTN_ROWS * S * 4 bytes).
     * attn_bwd: given dout [B,T,Hq,D] and the forward's q, k, v, out, lse:
     *   dq [B,T,Hq,D] out, dk [B,S,Hkv,D] out, dv [B,S,Hkv,D] out (positions no query
     *   attended get 0; padded queries contribute nothing). CPU scratch: two tiles per
     *   thread (threads * 2 * ENG_CPU_ATTN_ROWS * S * 4 bytes), through be->alloc.      */
    void (*attn_fwd)(eng_backend *be, float *out, float *lse, const float *q, const float *k,
                     const float *v, const int *pos0, const int *lens,
                     int B, int T, int S, int Hq, int Hkv, int D, float scale);
    void (*attn_bwd)(eng_backend *be, float *dq, float *dk, float *dv, const float *dout,
                     const float *q, const float *k, const float *v, const float *out,
                     const float *lse, const int *pos0, const int *lens,
                     int B, int T, int S, int Hq, int Hkv, int D, float scale);

    /* ---- SwiGLU -----------------------------------------------------------------------
     * fwd: h[i] = silu(gate[i]) * up[i] over n elements (h out, may not alias inputs).
     * bwd: dgate[i] = dh*up*silu'(gate), dup[i] = dh*silu(gate) (both out).            */
    void (*swiglu_fwd)(eng_backend *be, float *h, const float *gate, const float *up, size_t n);
    void (*swiglu_bwd)(eng_backend *be, float *dgate, float *dup, const float *dh,
                       const float *gate, const float *up, size_t n);

    /* ---- embedding -------------------------------------------------------------------
     * fwd: out[n,:] = table[tokens[n],:]   (table [V,C], out [N,C] out).
     * bwd: dtable[tokens[n],:] += dout[n,:]  (acc; repeated tokens sum).
     * Tokens must be in [0,V) (the model checks on the host first).                   */
    void (*embed_fwd)(eng_backend *be, float *out, const float *table, const int *tokens, int N, int C);
    void (*embed_bwd)(eng_backend *be, float *dtable, const float *dout, const int *tokens, int N, int C);

    /* ---- losses over R rows of V logits ------------------------------------------------
     * xent: softmax cross-entropy. targets [R] (device int, -1 = ignored row).
     *   loss [R] out: -log softmax(logits)[target] (0 for ignored rows).
     *   dlogits [R,V] acc (may be NULL: forward only): += dscale * (softmax - onehot);
     *   ignored rows get nothing.
     * kl: KL(teacher || student) at temperature tau, scaled by tau^2:
     *   p = softmax(t_logits/tau), q = softmax(s_logits/tau),
     *   loss [R] out: tau^2 * sum_v p (log p - log q);
     *   dlogits [R,V] acc (may be NULL): += dscale * tau * (q - p)   (d loss / d s_logits).
     *   rows with targets[r] == -1 count as ignored here too when `targets` is non-NULL. */
    void (*xent)(eng_backend *be, float *loss, float *dlogits, float dscale,
                 const float *logits, const int *targets, int R, int V);
    void (*kl)(eng_backend *be, float *loss, float *dlogits, float dscale, const float *s_logits,
               const float *t_logits, const int *targets, int R, int V, float tau);
    /* cosd: cosine distance of hidden states seen through per-channel weights w [C] (a norm's
     * weight: the intermediate-state loss of distillation compares what the next block reads):
     *   a [R,C] (rows of stride C), b [R,ldb] (its first C columns, ldb >= C); x = a*w, y = b*w;
     *   loss [R] out: 1 - x.y / (|x| |y|), 0 where either is zero;
     *   da [R,C] acc (may be NULL: forward only): += dscale * d loss / d a
     *     = dscale * w * (cos * x / |x|^2 - y / (|x| |y|)); zero rows get nothing. */
    void (*cosd)(eng_backend *be, float *loss, float *da, float dscale, const float *a, const float *b, int ldb,
                 const float *w, int R, int C);

    /* ---- elementwise and reductions ---------------------------------------------------- */
    void (*add)(eng_backend *be, float *y, const float *a, const float *b, size_t n); /* y = a + b (y may alias) */
    void (*axpy)(eng_backend *be, float *y, float alpha, const float *x, size_t n);   /* y += alpha*x */
    void (*axpy_dev)(eng_backend *be, float *y, const float *alpha_dev, const float *x, size_t n); /* y += (*alpha_dev)*x */
    void (*scale)(eng_backend *be, float *x, float alpha, size_t n);                  /* x *= alpha */
    void (*fill)(eng_backend *be, float *x, float value, size_t n);                   /* x[:] = value */
    void (*dot_acc)(eng_backend *be, float *out_dev, const float *a, const float *b, size_t n); /* *out_dev += sum a*b */
    /* Group mask: x, y [N, G*D]; m [G]. fwd: y[n,g,d] = x[n,g,d] * m[g] (y may alias x).
     * bwd: dx = dy * m (out; may alias dy); dm [G] acc (may be NULL) += sum_{n,d} dy*x.
     * The hidden mask is G = C, D = 1; head masks G = Hq, D = head_dim; FFN masks D = 1. */
    void (*mask_fwd)(eng_backend *be, float *y, const float *x, const float *m, int N, int G, int D);
    void (*mask_bwd)(eng_backend *be, float *dx, float *dm, const float *dy, const float *x,
                     const float *m, int N, int G, int D);
    void (*bias_add)(eng_backend *be, float *y, const float *b, int N, int M);  /* y[N,M] += b[M] per row */
    void (*colsum_acc)(eng_backend *be, float *out, const float *x, int N, int M); /* out[M] += sum_n x[n,:] */
    /* out[G] acc: += sum_n ||x[n,g,:]||_2 over x [N,G*D] (D = 1: sum of |x|). For ranking statistics. */
    void (*group_norm_sum)(eng_backend *be, float *out, const float *x, int N, int G, int D);
    double (*sumsq)(eng_backend *be, const float *x, size_t n);   /* host result: sum x^2 (synchronizes) */

    /* ---- rows (mixture-of-experts routing: each expert runs one GEMM on its tokens) --------
     * gather_rows: out[i,:] = w[i] * x[idx[i],:] for i < n (out [n,C] out, may not alias x).
     * scatter_rows_acc: y[idx[i],:] += w[i] * x[i,:] (acc); the idx of one call are distinct.
     *   idx [n] device int; w [n] device float, NULL: every w[i] = 1.
     * rows_dot: out[i] = sum_c a[i,c] * b[i,c] over [n,C] rows (out [n]). */
    void (*gather_rows)(eng_backend *be, float *out, const float *x, const int *idx, const float *w, int n, int C);
    void (*scatter_rows_acc)(eng_backend *be, float *y, const float *x, const int *idx, const float *w, int n,
                             int C);
    void (*rows_dot)(eng_backend *be, float *out, const float *a, const float *b, int n, int C);

    /* ---- Mamba-2 mixer (arch_mamba; engine/mamba.c) ------------------------------------
     * Shapes of one layer: H heads of P channels, G groups, state size S (d_state), conv
     * kernel K; di = H*P, cd = di + 2*G*S (the xBC channels: x [di], then B [G*S], then C
     * [G*S]); rows are [B, T] token-major. lens [B] (device int): valid tokens of a row
     * (right padding beyond them; NULL: all T).
     * ssm_conv_fwd: depthwise causal conv with bias, then SiLU, over xbc_in [B,T,cd]:
     *   pre[t,c] = bias[c] + sum_k w[c,k] * in[t-(K-1)+k, c], where in[<0] is the row's
     *   history: state [B, K-1, cd] (oldest first), or zeros when state is NULL;
     *   y [B,T,cd] out = silu(pre). With a state, it is updated to the K-1 inputs before
     *   position lens[b] of the history followed by the row's valid inputs.
     * ssm_conv_bwd (no history: training): dx [B,T,cd] out; dw [cd,K] and dbias [cd] acc.
     * ssm_scan_fwd: per row, head h (group g = h / (H/G)) and step t < lens[b]:
     *   dt = softplus(dt_raw[t,h] + dt_bias[h]), A = -exp(A_log[h]),
     *   s = exp(dt*A) * s + dt * x[t,h,:] (outer) B[t,g,:]; s [P,S] is state[b,h] ([B,H,P,S]
     *   in/out: the state before the first step, zeros for a fresh start), left holding the
     *   state after lens[b] steps;
     *   y[t,h,p] out = sum_s s[p,s] * C[t,g,s] + Dskip[h] * x[t,h,p]; padded steps: y = 0.
     *   x, B, C are read from xbc [B,T,cd]; dt_raw [B,T,H]; y [B,T,di].
     *   ckpt (may be NULL) [B, ceil(T/chunk), H, P, S] out: the state before every chunk of
     *   `chunk` steps, for the backward.
     * ssm_scan_bwd (training, zero start): given dy [B,T,di] and the forward's inputs and
     *   ckpt: dxbc [B,T,cd] out, ddt_raw [B,T,H] out, ddt_bias, dA_log, dD [H] acc. It
     *   recomputes each chunk's states from its checkpoint into scratch of
     *   B * H * (chunk + 2) * P * S floats (the caller's).
     * gated_norm_fwd: g = y * silu(z) over [N, di], then RMS-normalized within each of G
     *   groups of di/G channels: rstd [N,G] out = 1/sqrt(mean(g^2) + eps); out [N,di] =
     *   g * rstd * w.
     * gated_norm_bwd: given dout: dy [N,di] out, dz [N,di] out, dw [di] acc (may be NULL). */
    void (*ssm_conv_fwd)(eng_backend *be, float *y, const float *x, const float *w, const float *bias,
                         float *state, const int *lens, int B, int T, int cd, int K);
    void (*ssm_conv_bwd)(eng_backend *be, float *dx, float *dw, float *dbias, const float *dy, const float *x,
                         const float *w, const float *bias, int B, int T, int cd, int K);
    void (*ssm_scan_fwd)(eng_backend *be, float *y, float *ckpt, const float *xbc, const float *dt_raw,
                         const float *dt_bias, const float *A_log, const float *Dskip, float *state,
                         const int *lens, int B, int T, int H, int P, int G, int S, int chunk);
    void (*ssm_scan_bwd)(eng_backend *be, float *dxbc, float *ddt_raw, float *ddt_bias, float *dA_log,
                         float *dD, const float *dy, const float *xbc, const float *dt_raw, const float *dt_bias,
                         const float *A_log, const float *Dskip, const float *ckpt, float *scratch,
                         int B, int T, int H, int P, int G, int S, int chunk);
    void (*gated_norm_fwd)(eng_backend *be, float *out, float *rstd, const float *y, const float *z,
                           const float *w, int N, int di, int G, float eps);
    void (*gated_norm_bwd)(eng_backend *be, float *dy, float *dz, float *dw, const float *dout, const float *y,
                           const float *z, const float *w, const float *rstd, int N, int di, int G);
    /* Squared ReLU (nemotron_h's MLP): fwd h = max(u, 0)^2 (out); bwd du = dh * 2 max(u, 0) (out,
     * may alias dh). */
    void (*relu2_fwd)(eng_backend *be, float *h, const float *u, size_t n);
    void (*relu2_bwd)(eng_backend *be, float *du, const float *dh, const float *u, size_t n);

    /* ---- optimizer ---------------------------------------------------------------------
     * AdamW over n parameters, decoupled weight decay, with g' = g * gscale:
     *   m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2;
     *   p -= lr * ( (m/bc1) / (sqrt(v/bc2) + eps) + wd * p )
     * where bc1 = 1 - b1^t, bc2 = 1 - b2^t are passed by the caller. p, m, v updated in place. */
    void (*adamw)(eng_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                  float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float gscale);
};

/* The op check of debug runs: in a build with -DAC_CHECK_OPS (make CHECK_OPS=1), or with
 * AC_CHECK_OPS=1 in the environment, every backend the constructors return has each op
 * wrapped so that after it the backend is synchronized and its first failure looked for
 * (eng_backend_check): a failing kernel names itself ("after op gemm") instead of
 * surfacing at a later sync. Slow (a sync per op); off by default.
 *   eng_backend_ops_checked: 1 when the check is on.
 *   eng_backend_check_ops: wraps be (when the check is on) and returns it; the
 *       constructors call it.
 *   eng_backend_failed_op: the first op after which a failure showed ("" when none or
 *       unchecked). */
int eng_backend_ops_checked(void);
eng_backend *eng_backend_check_ops(eng_backend *be);
const char *eng_backend_failed_op(const eng_backend *be);

/* Create the CPU backend with `threads` worker threads (0: all cores). Sets the OpenMP
 * thread count for the process (process-wide) and OpenBLAS to one thread: GEMMs are
 * split across the OpenMP threads so only one thread pool ever runs.
 * Returns a new backend, or NULL on OOM. Free with eng_backend_free. */
eng_backend *eng_backend_cpu_new(int threads);

/* GEMM precision of a CPU backend: "fp32" (OpenBLAS sgemm; the default), "bf16" or
 * "fp16": GEMM operands rounded to 16 bits and multiplied with fp32 accumulation into the
 * fp32 output (engine/cpu_mm16.h: oneDNN's matmul; the decode path of a few rows keeps
 * its streaming pass over fp32 weights, rounding them as they are read). Everything
 * else stays fp32: norms, attention, losses, master weights and optimizer state.
 * Returns 0, or -1 with the reason in err (unknown name; the type has no hardware kernel
 * on this CPU). */
int eng_backend_cpu_set_precision(eng_backend *be, const char *precision, char *err, size_t errlen);
const char *eng_backend_cpu_precision(const eng_backend *be);   /* "fp32", "bf16", "fp16" */
/* The first failure of a 16-bit GEMM since the precision was set ("" when none). */
const char *eng_backend_cpu_error(const eng_backend *be);
/* The GEMM kernel in use: oneDNN's implementation name at 16 bits, else the BLAS kernel. */
const char *eng_backend_cpu_gemm_kernel(const eng_backend *be);
/* At 16 bits: [p, p+n) floats are constant until the same call with on = 0, so GEMMs
 * reading weights from there round them once (cpu_mm16_const_begin); a no-op at fp32. */
void eng_backend_cpu_const(eng_backend *be, const float *p, size_t n, int on);
/* Bytes of the 16-bit operand workspace and kept copies (not in cur_bytes/peak_bytes);
 * 0 at fp32. */
size_t eng_backend_cpu_workspace_bytes(const eng_backend *be);
/* Whether this CPU runs `precision` ("bf16", "fp16") GEMMs on a oneDNN hardware kernel:
 * 0 with the kernel's name in kernel, or -1 with the reason in err. Creates no backend. */
int eng_cpu_gemm16_probe(const char *precision, char *kernel, size_t kernel_len, char *err, size_t errlen);
/* The version of the oneDNN library the 16-bit GEMMs run ("2.6.3"), written into buf;
 * returns buf. */
const char *eng_cpu_gemm16_version(char *buf, size_t len);

/* ---- the CPU backend's BLAS ---------------------------------------------------------
 * OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels from the CPU's model
 * number when the library loads. A CPU newer than the library (Emerald Rapids, model 207,
 * under OpenBLAS 0.3.21) falls back to a generic SSE3 kernel ("Prescott") that runs GEMMs
 * about 5x slower than the AVX-512 kernel the CPU can run. The choice is made before
 * main, so it can only be corrected for the next exec: eng_blas_pick_kernel does that. */

/* The kernel OpenBLAS runs ("SkylakeX", "Haswell", "Prescott", ...) and its build
 * configuration string. Never NULL. */
const char *eng_blas_kernel(void);
const char *eng_blas_config(void);

/* The kernel to ask OpenBLAS for (OPENBLAS_CORETYPE) when it detected `detected` on a CPU
 * with these features: "SkylakeX" (AVX-512 F/BW/DQ/VL) or "Haswell" (AVX2 and FMA) when
 * `detected` is a kernel older than the CPU's vector units (no AVX2), else NULL (keep). */
const char *eng_blas_kernel_for(const char *detected, int avx512, int avx2_fma);

/* Call first in main: when OPENBLAS_CORETYPE is unset and eng_blas_kernel_for says the
 * detected kernel is too old for this CPU, set OPENBLAS_CORETYPE and exec this program
 * again with the same arguments (the variable reaches every process it starts). Returns
 * only when nothing needs to change, or when the exec fails (a warning on stderr; the
 * program then runs on the slow kernel). Where the variable is set already, by the user
 * or by the first exec, it is left alone, so this never execs twice. */
void eng_blas_pick_kernel(char **argv);

/* How idle OpenMP threads wait between parallel regions, as the environment set it for this
 * process (libgomp reads it once, at load): "OMP_WAIT_POLICY=passive" (they sleep at once:
 * every region pays a wake-up, and decode, many small regions per token, runs at half
 * speed), "GOMP_SPINCOUNT=30000" (spin that long, then sleep), or "default" (libgomp's
 * own bounded spin). Both variables appear when both are set. Written into buf; returns buf. */
const char *eng_cpu_wait_policy(char *buf, size_t len);

/* The CPU backend's thread count when none is asked for: the processors this process may
 * run on (OpenMP's count, which follows the affinity mask and a container's CPU set). */
int eng_cpu_default_threads(void);

/* Free any backend (calls be->destroy). Safe on NULL. Leaked accounted bytes are the
 * caller's bug; tests check cur_bytes == 0 first. */
void eng_backend_free(eng_backend *be);

/* Reset the peak counter to the current bytes. */
void eng_backend_reset_peak(eng_backend *be);

#ifdef __cplusplus
}
#endif

#endif
