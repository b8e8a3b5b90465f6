/* engine/mamba.c — the Mamba-2 mixer (arch_mamba, family nemotron_h): in_proj to z, xBC and dt
 * (three GEMMs over the weight's row blocks), the depthwise causal conv and SiLU over xBC, the
 * selective-state scan (dt = softplus(dt + dt_bias), A = -exp(A_log), the D skip), the gated
 * RMSNorm by groups, the head masks of the search and out_proj; with a cache, the conv and SSM
 * states carry a sequence from one call to the next (decode). dt is not clamped: the
 * time_step_limit (0, inf) of the checkpoints, as the fused kernels that serve them run it.
 * Training saves only the block's input; the backward runs the mixer again with the scan's
 * checkpoints every ENG_SSM_CHUNK steps and goes back through it.
 *
 * Memory (floats; N = B*T, di = H*P, cd = di + 2*G*S, nc = ceil(T/ENG_SSM_CHUNK)): forward
 * N*(3 di + 2 cd + H + G) + B*H*P*S; backward that + B*nc*H*P*S (checkpoints) + N*(3 di +
 * 2 cd + H) (gradients) + B*H*(ENG_SSM_CHUNK + 2)*P*S (the scan's recompute) + 3H + cd*(K+1)
 * (parameter gradients of frozen weights, discarded).
 */
#include "engine/mamba.h"

#include <string.h>

typedef struct {
    int H, P, G, S, K, di, cd;
} mdims;

static mdims dims_of(const arch_mamba *mb)
{
    return (mdims){mb->n_heads, mb->head_dim, mb->n_groups, mb->d_state, mb->conv_kernel, arch_mamba_inner(mb),
                   arch_mamba_conv_dim(mb)};
}

static size_t fwd_floats(mdims d, size_t B, size_t T)
{
    size_t N = B * T;
    return N * (3 * (size_t)d.di + 2 * (size_t)d.cd + (size_t)d.H + (size_t)d.G) + B * d.H * d.P * d.S;
}

/* Where the parameter gradients of the scan and conv go when the weights are frozen. */
static size_t sink_floats(mdims d)
{
    return 3 * (size_t)d.H + (size_t)d.cd * (d.K + 1);
}

static size_t bwd_floats(mdims d, size_t B, size_t T)
{
    size_t N = B * T, hps = (size_t)d.H * d.P * d.S, nc = (T + ENG_SSM_CHUNK - 1) / ENG_SSM_CHUNK;
    return fwd_floats(d, B, T) + B * nc * hps + N * (3 * (size_t)d.di + 2 * (size_t)d.cd + (size_t)d.H) +
           B * (ENG_SSM_CHUNK + 2) * hps + sink_floats(d);
}

size_t eng_mamba_fwd_floats(const arch *a, int B, int T)
{
    size_t best = 0;
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].mamba.n_heads) {
            size_t n = fwd_floats(dims_of(&a->layers[l].mamba), (size_t)B, (size_t)T);
            best = n > best ? n : best;
        }
    return best;
}

size_t eng_mamba_bwd_bytes(const arch *a, int B, int T)
{
    size_t best = 0;
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].mamba.n_heads) {
            size_t n = bwd_floats(dims_of(&a->layers[l].mamba), (size_t)B, (size_t)T) * F4;
            best = n > best ? n : best;
        }
    return best;
}

/* The forward's buffers, carved from one scratch block. */
typedef struct {
    float *z, *xbcp, *dt, *xbc, *yv, *g, *grstd, *state;
} mfwd;

static mfwd carve_fwd(float *p, mdims d, size_t B, size_t T)
{
    size_t N = B * T;
    mfwd f;
    f.z = p; p += N * d.di;
    f.xbcp = p; p += N * d.cd;
    f.dt = p; p += N * d.H;
    f.xbc = p; p += N * d.cd;
    f.yv = p; p += N * d.di;
    f.g = p; p += N * d.di;
    f.grstd = p; p += N * d.G;
    f.state = p;
    return f;
}

static void linear(eng_backend *be, float *y, const float *x, const float *W, int N, int out, int in)
{
    be->gemm(be, 0, 1, N, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
}

/* Everything up to the gated norm's output f->g (before the head masks). state: the SSM
 * state to continue (the cache's), or NULL to start from zeros in f->state; conv_state the
 * conv history or NULL; ckpt the scan's checkpoints or NULL. */
static void mixer_fwd(eng_model *m, const fwd_state *st, int l, const float *xn, mfwd *f, float *conv_state,
                      float *state, float *ckpt)
{
    eng_backend *be = m->be;
    const eng_layer *L = &m->layers[l];
    mdims d = dims_of(&m->a.layers[l].mamba);
    int N = st->N, C = m->a.hidden_size;
    linear(be, f->z, xn, L->in_proj, N, d.di, C);
    linear(be, f->xbcp, xn, L->in_proj + (size_t)d.di * C, N, d.cd, C);
    linear(be, f->dt, xn, L->in_proj + (size_t)(d.di + d.cd) * C, N, d.H, C);
    be->ssm_conv_fwd(be, f->xbc, f->xbcp, L->conv_w, L->conv_b, conv_state, st->lens_d, st->B, st->T, d.cd, d.K);
    if (!state) {
        state = f->state;
        be->zero(be, state, F4 * (size_t)st->B * d.H * d.P * d.S);
    }
    be->ssm_scan_fwd(be, f->yv, ckpt, f->xbc, f->dt, L->dt_bias, L->A_log, L->Dskip, state, st->lens_d, st->B,
                     st->T, d.H, d.P, d.G, d.S, ENG_SSM_CHUNK);
    be->gated_norm_fwd(be, f->g, f->grstd, f->yv, f->z, L->m_norm, N, d.di, d.G, (float)m->a.norm_eps);
}

int eng_mamba_fwd(eng_model *m, fwd_state *st, int l, const float *xn, float *y, float *ws)
{
    eng_backend *be = m->be;
    mdims d = dims_of(&m->a.layers[l].mamba);
    size_t bytes = fwd_floats(d, (size_t)st->B, (size_t)st->T) * F4;
    float *own = ws ? NULL : be->alloc(be, bytes);
    if (!ws && !own)
        return -1;
    mfwd f = carve_fwd(ws ? ws : own, d, (size_t)st->B, (size_t)st->T);
    eng_kv_cache *kv = st->kv;
    mixer_fwd(m, st, l, xn, &f, kv ? kv->conv[l] : NULL, kv ? kv->ssm[l] : NULL, NULL);
    if (st->stats)
        eng_stats_add(m, st, st->stats->head_norm[l], f.g, d.H, d.P);
    if (st->mk)
        be->mask_fwd(be, f.g, f.g, st->mk->head[l], st->N, d.H, d.P);
    linear(be, y, f.g, m->layers[l].out_proj, st->N, m->a.hidden_size, d.di);
    be->free(be, own, own ? bytes : 0);
    return 0;
}

const float *eng_mamba_out_input(const eng_model *m, const fwd_state *st, int l)
{
    if (!st->mamba_f)
        return NULL;
    return carve_fwd(st->mamba_f, dims_of(&m->a.layers[l].mamba), (size_t)st->B, (size_t)st->T).g;
}

int eng_mamba_bwd(eng_model *m, fwd_state *st, int l, const float *xn, const float *dy, float *dxn, int gw, int gm)
{
    eng_backend *be = m->be;
    const eng_layer *L = &m->layers[l];
    eng_layer *Gr = &m->glayers[l];
    mdims d = dims_of(&m->a.layers[l].mamba);
    size_t B = (size_t)st->B, T = (size_t)st->T, N = B * T, hps = (size_t)d.H * d.P * d.S;
    size_t nc = (T + ENG_SSM_CHUNK - 1) / ENG_SSM_CHUNK, bytes = bwd_floats(d, B, T) * F4;
    int C = m->a.hidden_size;
    float *p = be->alloc(be, bytes);
    if (!p)
        return -1;
    mfwd f = carve_fwd(p, d, B, T);
    float *ckpt = p + fwd_floats(d, B, T), *dg = ckpt + B * nc * hps, *dyv = dg + N * d.di, *dz = dyv + N * d.di;
    float *dxbc = dz + N * d.di, *dxbcp = dxbc + N * d.cd, *ddt = dxbcp + N * d.cd, *scan = ddt + N * d.H;
    mixer_fwd(m, st, l, xn, &f, NULL, NULL, ckpt);
    const float *gr = f.g;
    if (st->mk) {   /* out_proj read the masked output: dyv holds it for the moment */
        be->mask_fwd(be, dyv, f.g, st->mk->head[l], (int)N, d.H, d.P);
        gr = dyv;
    }
    if (gw)
        be->gemm(be, 1, 0, C, d.di, (int)N, 1.0f, dy, C, gr, d.di, 1.0f, Gr->out_proj, d.di);
    be->gemm(be, 0, 0, (int)N, d.di, C, 1.0f, dy, C, L->out_proj, d.di, 0.0f, dg, d.di);
    if (st->mk)
        be->mask_bwd(be, dg, gm ? m->masks->g_head[l] : NULL, dg, f.g, st->mk->head[l], (int)N, d.H, d.P);
    be->gated_norm_bwd(be, dyv, dz, gw ? Gr->m_norm : NULL, dg, f.yv, f.z, L->m_norm, f.grstd, (int)N, d.di, d.G);
    float *sink = scan + B * (ENG_SSM_CHUNK + 2) * hps;
    float *gdtb = gw ? Gr->dt_bias : sink, *galog = gw ? Gr->A_log : sink + d.H, *gd = gw ? Gr->Dskip : sink + 2 * d.H;
    be->ssm_scan_bwd(be, dxbc, ddt, gdtb, galog, gd, dyv, f.xbc, f.dt, L->dt_bias, L->A_log, L->Dskip, ckpt, scan,
                     (int)B, (int)T, d.H, d.P, d.G, d.S, ENG_SSM_CHUNK);
    float *gcw = gw ? Gr->conv_w : sink + 3 * d.H, *gcb = gw ? Gr->conv_b : gcw + (size_t)d.cd * d.K;
    be->ssm_conv_bwd(be, dxbcp, gcw, gcb, dxbc, f.xbcp, L->conv_w, L->conv_b, (int)B, (int)T, d.cd, d.K);
    const float *dparts[3] = {dz, dxbcp, ddt};
    int rows[3] = {d.di, d.cd, d.H};
    size_t r0 = 0;
    for (int i = 0; i < 3; i++) {
        if (gw)
            be->gemm(be, 1, 0, rows[i], C, (int)N, 1.0f, dparts[i], rows[i], xn, C, 1.0f, Gr->in_proj + r0 * C, C);
        be->gemm(be, 0, 0, (int)N, C, rows[i], 1.0f, dparts[i], rows[i], L->in_proj + r0 * C, C, i ? 1.0f : 0.0f, dxn,
                 C);
        r0 += (size_t)rows[i];
    }
    be->free(be, p, bytes);
    return 0;
}
