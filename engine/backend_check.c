/* engine/backend_check.c — the op check of debug runs (see backend.h eng_backend_check_ops):
 * every op of a backend is wrapped so that after it returns the backend is synchronized
 * and asked for its first failure (eng_backend_check). A failing kernel then names itself:
 * the first op after which the backend reports an error is kept and printed, and
 * eng_backend_check's message says "after op NAME". The wrappers replace the backend's
 * function pointers in place (the backend's own state, impl and byte counts, stays where
 * callers read it); the original table is kept in be->checks.
 */
#include "engine/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/devices.h"

typedef struct {
    eng_backend orig;        /* the backend's own function table */
    char op[32];             /* the first op after which a failure showed, "" while none */
} chk_state;

#define CHK(be) ((chk_state *)(be)->checks)

static void after(eng_backend *be, const char *op)
{
    chk_state *c = CHK(be);
    char err[512];
    if (c->op[0] || !eng_backend_check(be, err, sizeof err))
        return;
    snprintf(c->op, sizeof c->op, "%s", op);
    fprintf(stderr, "engine: %s failed (op check): %s\n", op, err);
}

/* One wrapper per op: call the backend's own, then check. */
#define CHECKED(name, params, args)                                                                          \
    static void chk_##name params                                                                            \
    {                                                                                                        \
        CHK(be)->orig.name args;                                                                             \
        after(be, #name);                                                                                    \
    }
#define CHECKED_R(type, name, params, args)                                                                  \
    static type chk_##name params                                                                            \
    {                                                                                                        \
        type r = CHK(be)->orig.name args;                                                                    \
        after(be, #name);                                                                                    \
        return r;                                                                                            \
    }

CHECKED_R(void *, alloc, (eng_backend *be, size_t bytes), (be, bytes))
CHECKED(free, (eng_backend *be, void *p, size_t bytes), (be, p, bytes))
CHECKED(to_device, (eng_backend *be, void *dst, const void *host_src, size_t bytes), (be, dst, host_src, bytes))
CHECKED(to_host, (eng_backend *be, void *host_dst, const void *src, size_t bytes), (be, host_dst, src, bytes))
CHECKED(copy, (eng_backend *be, void *dst, const void *src, size_t bytes), (be, dst, src, bytes))
CHECKED(zero, (eng_backend *be, void *dst, size_t bytes), (be, dst, bytes))
CHECKED(gemm,
        (eng_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
        int ldb, float beta, float *C, int ldc),
        (be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
CHECKED(rmsnorm_fwd,
        (eng_backend *be, float *y, float *rstd, const float *x, const float *w, int N, int C, float n_eff,
        float eps),
        (be, y, rstd, x, w, N, C, n_eff, eps))
CHECKED(rmsnorm_bwd,
        (eng_backend *be, float *dx, float *dw, float *d_neff, const float *dy, const float *x, const float *w,
        const float *rstd, int N, int C, float n_eff),
        (be, dx, dw, d_neff, dy, x, w, rstd, N, C, n_eff))
CHECKED(rope_fwd,
        (eng_backend *be, float *x, const int *pos, const float *inv_freq, int N, int H, int D),
        (be, x, pos, inv_freq, N, H, D))
CHECKED(rope_bwd,
        (eng_backend *be, float *dx, const int *pos, const float *inv_freq, int N, int H, int D),
        (be, dx, pos, inv_freq, N, H, D))
CHECKED(attn_fwd,
        (eng_backend *be, float *out, float *lse, const float *q, const float *k, const float *v, const int *pos0,
        const int *lens, int B, int T, int S, int Hq, int Hkv, int D, float scale),
        (be, out, lse, q, k, v, pos0, lens, B, T, S, Hq, Hkv, D, scale))
CHECKED(attn_bwd,
        (eng_backend *be, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
        const float *v, const float *out, const float *lse, const int *pos0, const int *lens, int B, int T, int S,
        int Hq, int Hkv, int D, float scale),
        (be, dq, dk, dv, dout, q, k, v, out, lse, pos0, lens, B, T, S, Hq, Hkv, D, scale))
CHECKED(swiglu_fwd, (eng_backend *be, float *h, const float *gate, const float *up, size_t n), (be, h, gate, up, n))
CHECKED(swiglu_bwd,
        (eng_backend *be, float *dgate, float *dup, const float *dh, const float *gate, const float *up, size_t n),
        (be, dgate, dup, dh, gate, up, n))
CHECKED(embed_fwd,
        (eng_backend *be, float *out, const float *table, const int *tokens, int N, int C),
        (be, out, table, tokens, N, C))
CHECKED(embed_bwd,
        (eng_backend *be, float *dtable, const float *dout, const int *tokens, int N, int C),
        (be, dtable, dout, tokens, N, C))
CHECKED(xent,
        (eng_backend *be, float *loss, float *dlogits, float dscale, const float *logits, const int *targets, int R,
        int V),
        (be, loss, dlogits, dscale, logits, targets, R, V))
CHECKED(kl,
        (eng_backend *be, float *loss, float *dlogits, float dscale, const float *s_logits, const float *t_logits,
        const int *targets, int R, int V, float tau),
        (be, loss, dlogits, dscale, s_logits, t_logits, targets, R, V, tau))
CHECKED(add, (eng_backend *be, float *y, const float *a, const float *b, size_t n), (be, y, a, b, n))
CHECKED(axpy, (eng_backend *be, float *y, float alpha, const float *x, size_t n), (be, y, alpha, x, n))
CHECKED(axpy_dev,
        (eng_backend *be, float *y, const float *alpha_dev, const float *x, size_t n),
        (be, y, alpha_dev, x, n))
CHECKED(scale, (eng_backend *be, float *x, float alpha, size_t n), (be, x, alpha, n))
CHECKED(fill, (eng_backend *be, float *x, float value, size_t n), (be, x, value, n))
CHECKED(dot_acc,
        (eng_backend *be, float *out_dev, const float *a, const float *b, size_t n),
        (be, out_dev, a, b, n))
CHECKED(mask_fwd,
        (eng_backend *be, float *y, const float *x, const float *m, int N, int G, int D),
        (be, y, x, m, N, G, D))
CHECKED(mask_bwd,
        (eng_backend *be, float *dx, float *dm, const float *dy, const float *x, const float *m, int N, int G, int D),
        (be, dx, dm, dy, x, m, N, G, D))
CHECKED(bias_add, (eng_backend *be, float *y, const float *b, int N, int M), (be, y, b, N, M))
CHECKED(colsum_acc, (eng_backend *be, float *out, const float *x, int N, int M), (be, out, x, N, M))
CHECKED(group_norm_sum, (eng_backend *be, float *out, const float *x, int N, int G, int D), (be, out, x, N, G, D))
CHECKED(gather_rows,
        (eng_backend *be, float *out, const float *x, const int *idx, const float *w, int n, int C),
        (be, out, x, idx, w, n, C))
CHECKED(scatter_rows_acc,
        (eng_backend *be, float *y, const float *x, const int *idx, const float *w, int n, int C),
        (be, y, x, idx, w, n, C))
CHECKED(cosd, (eng_backend *be, float *loss, float *da, float dscale, const float *a, const float *b, int ldb,
              const float *w, int R, int C), (be, loss, da, dscale, a, b, ldb, w, R, C))
CHECKED(rows_dot, (eng_backend *be, float *out, const float *a, const float *b, int n, int C), (be, out, a, b, n, C))
CHECKED_R(double, sumsq, (eng_backend *be, const float *x, size_t n), (be, x, n))
CHECKED(adamw,
        (eng_backend *be, float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
        float eps, float wd, float bc1, float bc2, float gscale),
        (be, p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, gscale))
CHECKED(ssm_conv_fwd,
        (eng_backend *be, float *y, const float *x, const float *w, const float *bias, float *state,
        const int *lens, int B, int T, int cd, int K),
        (be, y, x, w, bias, state, lens, B, T, cd, K))
CHECKED(ssm_conv_bwd,
        (eng_backend *be, float *dx, float *dw, float *dbias, const float *dy, const float *x, const float *w,
        const float *bias, int B, int T, int cd, int K),
        (be, dx, dw, dbias, dy, x, w, bias, B, T, cd, K))
CHECKED(ssm_scan_fwd,
        (eng_backend *be, float *y, float *ckpt, const float *xbc, const float *dt_raw, const float *dt_bias,
        const float *A_log, const float *Dskip, float *state, const int *lens, int B, int T, int H, int P, int G,
        int S, int chunk),
        (be, y, ckpt, xbc, dt_raw, dt_bias, A_log, Dskip, state, lens, B, T, H, P, G, S, chunk))
CHECKED(ssm_scan_bwd,
        (eng_backend *be, float *dxbc, float *ddt_raw, float *ddt_bias, float *dA_log, float *dD, const float *dy,
        const float *xbc, const float *dt_raw, const float *dt_bias, const float *A_log, const float *Dskip,
        const float *ckpt, float *scratch, int B, int T, int H, int P, int G, int S, int chunk),
        (be, dxbc, ddt_raw, ddt_bias, dA_log, dD, dy, xbc, dt_raw, dt_bias, A_log, Dskip, ckpt, scratch, B, T, H, P,
        G, S, chunk))
CHECKED(gated_norm_fwd,
        (eng_backend *be, float *out, float *rstd, const float *y, const float *z, const float *w, int N, int di,
        int G, float eps),
        (be, out, rstd, y, z, w, N, di, G, eps))
CHECKED(gated_norm_bwd,
        (eng_backend *be, float *dy, float *dz, float *dw, const float *dout, const float *y, const float *z,
        const float *w, const float *rstd, int N, int di, int G),
        (be, dy, dz, dw, dout, y, z, w, rstd, N, di, G))
CHECKED(relu2_fwd, (eng_backend *be, float *h, const float *u, size_t n), (be, h, u, n))
CHECKED(relu2_bwd, (eng_backend *be, float *du, const float *dh, const float *u, size_t n), (be, du, dh, u, n))

static void chk_destroy(eng_backend *be)
{
    void (*destroy)(eng_backend *) = CHK(be)->orig.destroy;
    free(be->checks);
    be->checks = NULL;
    destroy(be);
}

int eng_backend_ops_checked(void)
{
#ifdef AC_CHECK_OPS
    return 1;
#else
    const char *e = getenv("AC_CHECK_OPS");
    return e && *e && strcmp(e, "0");
#endif
}

eng_backend *eng_backend_check_ops(eng_backend *be)
{
    if (!be || be->checks || !eng_backend_ops_checked())
        return be;
    chk_state *c = calloc(1, sizeof *c);
    if (!c)
        return be;   /* unchecked, as without the switch */
    c->orig = *be;
    be->checks = c;
    be->alloc = chk_alloc;
    be->free = chk_free;
    be->to_device = chk_to_device;
    be->to_host = chk_to_host;
    be->copy = chk_copy;
    be->zero = chk_zero;
    be->gemm = chk_gemm;
    be->rmsnorm_fwd = chk_rmsnorm_fwd;
    be->rmsnorm_bwd = chk_rmsnorm_bwd;
    be->rope_fwd = chk_rope_fwd;
    be->rope_bwd = chk_rope_bwd;
    be->attn_fwd = chk_attn_fwd;
    be->attn_bwd = chk_attn_bwd;
    be->swiglu_fwd = chk_swiglu_fwd;
    be->swiglu_bwd = chk_swiglu_bwd;
    be->embed_fwd = chk_embed_fwd;
    be->embed_bwd = chk_embed_bwd;
    be->xent = chk_xent;
    be->kl = chk_kl;
    be->cosd = chk_cosd;
    be->add = chk_add;
    be->axpy = chk_axpy;
    be->axpy_dev = chk_axpy_dev;
    be->scale = chk_scale;
    be->fill = chk_fill;
    be->dot_acc = chk_dot_acc;
    be->mask_fwd = chk_mask_fwd;
    be->mask_bwd = chk_mask_bwd;
    be->bias_add = chk_bias_add;
    be->colsum_acc = chk_colsum_acc;
    be->group_norm_sum = chk_group_norm_sum;
    be->sumsq = chk_sumsq;
    be->adamw = chk_adamw;
    be->gather_rows = chk_gather_rows;
    be->scatter_rows_acc = chk_scatter_rows_acc;
    be->rows_dot = chk_rows_dot;
    /* ops a backend may lack (the model refuses the layers that need them) stay absent */
#define OPT(name) be->name = be->name ? chk_##name : NULL
    OPT(ssm_conv_fwd);
    OPT(ssm_conv_bwd);
    OPT(ssm_scan_fwd);
    OPT(ssm_scan_bwd);
    OPT(gated_norm_fwd);
    OPT(gated_norm_bwd);
    OPT(relu2_fwd);
    OPT(relu2_bwd);
#undef OPT
    be->destroy = chk_destroy;
    return be;
}

const char *eng_backend_failed_op(const eng_backend *be)
{
    return be && be->checks ? ((const chk_state *)be->checks)->op : "";
}
