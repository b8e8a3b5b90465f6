/* engine/arch.c — lifetime, validation and parameter counting for the arch descriptor.
 * No I/O here: JSON lives in storage/archjson.c, model formats in storage/.
 */
#include "engine/arch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int arch_init(arch *a, int n_layers)
{
    memset(a, 0, sizeof *a);
    if (n_layers < 0)
        return -1;
    if (n_layers > 0) {
        a->layers = calloc((size_t)n_layers, sizeof *a->layers);
        if (!a->layers)
            return -1;
    }
    a->n_layers = n_layers;
    return 0;
}

int arch_preset(arch *a, const char *name, int n_layers)
{
    memset(a, 0, sizeof *a);
    if (!name || strcmp(name, "smollm2-135m") != 0)
        return -1;
    if (arch_init(a, n_layers > 0 ? n_layers : 30) != 0)
        return -1;
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = 49152;
    a->hidden_size = 576;
    a->head_dim = 64;
    a->max_position_embeddings = 8192;
    a->rope_theta = 100000.0;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = 1;
    for (int l = 0; l < a->n_layers; l++)
        a->layers[l] = (arch_layer){.source_layer = l, .n_heads = 9, .n_kv_heads = 3, .ffn_dim = 1536};
    return 0;
}

void arch_free(arch *a)
{
    if (!a)
        return;
    free(a->layers);
    a->layers = NULL;
    a->n_layers = 0;
}

int arch_copy(arch *dst, const arch *src)
{
    *dst = *src;
    dst->layers = NULL;
    if (src->n_layers > 0) {
        dst->layers = malloc((size_t)src->n_layers * sizeof *dst->layers);
        if (!dst->layers)
            return -1;
        memcpy(dst->layers, src->layers, (size_t)src->n_layers * sizeof *dst->layers);
    }
    return 0;
}

int arch_rope_scaling_same(const arch_rope_scaling *a, const arch_rope_scaling *b, double rel)
{
#define SAME(x, y) (fabs((x) - (y)) <= rel * fmax(fabs(x), fabs(y)))
    return a->type == b->type && SAME(a->factor, b->factor) && SAME(a->low_freq_factor, b->low_freq_factor) &&
           SAME(a->high_freq_factor, b->high_freq_factor) &&
           a->original_max_position_embeddings == b->original_max_position_embeddings;
#undef SAME
}

int arch_rope_same(const arch *a, const arch *b, double rel)
{
    const arch_rope_scaling *x = &a->rope_scaling, *y = &b->rope_scaling;
    if (x->type != y->type || a->head_dim != b->head_dim || a->head_dim <= 0 || a->head_dim > 2048 ||
        fabs(a->rope_theta - b->rope_theta) > rel * fmax(fabs(a->rope_theta), fabs(b->rope_theta)))
        return 0;
    if (x->type != ROPE_SCALING_LLAMA3)
        return arch_rope_scaling_same(x, y, rel);
    double ra[1024], rb[1024];   /* what llama.cpp and the engine compute from them */
    arch_rope_factors(a, ra);
    arch_rope_factors(b, rb);
    for (int i = 0; i < a->head_dim / 2; i++)
        if (fabs(ra[i] - rb[i]) > rel * fmax(fabs(ra[i]), fabs(rb[i])))
            return 0;
    return 1;
}

/* Field by field: the structs' padding bytes are whatever their last copy left there. */
static int moe_equal(const arch_moe *x, const arch_moe *y)
{
    return x->n_experts == y->n_experts && x->top_k == y->top_k && x->expert_ffn_dim == y->expert_ffn_dim &&
           x->shared_ffn_dim == y->shared_ffn_dim && x->norm_topk == y->norm_topk && x->sigmoid == y->sigmoid &&
           x->n_group == y->n_group && x->topk_group == y->topk_group && x->routed_scale == y->routed_scale &&
           x->latent_dim == y->latent_dim;
}

static int mamba_equal(const arch_mamba *x, const arch_mamba *y)
{
    return x->n_heads == y->n_heads && x->head_dim == y->head_dim && x->d_state == y->d_state &&
           x->n_groups == y->n_groups && x->conv_kernel == y->conv_kernel;
}

int arch_equal(const arch *a, const arch *b)
{
    if (strcmp(a->family, b->family) || a->vocab_size != b->vocab_size ||
        a->hidden_size != b->hidden_size || a->head_dim != b->head_dim ||
        a->max_position_embeddings != b->max_position_embeddings ||
        a->rope_theta != b->rope_theta || a->norm_eps != b->norm_eps ||
        a->tie_word_embeddings != b->tie_word_embeddings ||
        a->attention_bias != b->attention_bias || a->n_layers != b->n_layers ||
        !arch_rope_scaling_same(&a->rope_scaling, &b->rope_scaling, 0))
        return 0;
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *x = &a->layers[i], *y = &b->layers[i];
        if (x->source_layer != y->source_layer || x->n_heads != y->n_heads ||
            x->n_kv_heads != y->n_kv_heads || x->ffn_dim != y->ffn_dim ||
            !moe_equal(&x->moe, &y->moe) || !mamba_equal(&x->mamba, &y->mamba))
            return 0;
    }
    return 1;
}

int arch_mlp_gated(const arch *a) { return strcmp(a->family, "nemotron_h") != 0; }

int arch_rope(const arch *a) { return strcmp(a->family, "nemotron_h") != 0; }

int arch_qk_norm(const arch *a) { return !strcmp(a->family, "olmoe"); }

/* frequency i's wavelength without scaling, in positions */
static double rope_wavelength(const arch *a, int i)
{
    return 2.0 * M_PI * pow(a->rope_theta, (2.0 * i) / a->head_dim);
}

void arch_rope_factors(const arch *a, double *r)
{
    const arch_rope_scaling *rs = &a->rope_scaling;
    for (int i = 0; i < a->head_dim / 2; i++) {
        r[i] = 1.0;
        if (rs->type == ROPE_SCALING_LINEAR && rs->factor > 0) {
            r[i] = rs->factor;
        } else if (rs->type == ROPE_SCALING_LLAMA3 && rs->factor > 0) {
            double old = rs->original_max_position_embeddings, wl = rope_wavelength(a, i);
            double lo_wl = old / rs->low_freq_factor, hi_wl = old / rs->high_freq_factor;
            if (wl > lo_wl) {
                r[i] = rs->factor;
            } else if (wl >= hi_wl) {
                double s = (old / wl - rs->low_freq_factor) / (rs->high_freq_factor - rs->low_freq_factor);
                r[i] = 1.0 / ((1 - s) / rs->factor + s);
            }
        }
    }
}

int arch_rope_fit_llama3(arch *a, const float *r, char *err, size_t errlen)
{
    int half = a->head_dim / 2;
    if (half < 1) {
        snprintf(err, errlen, "rope factors: the head size is %d", a->head_dim);
        return -1;
    }
    double factor = 1.0;
    for (int i = 0; i < half; i++) {
        if (!(r[i] >= 1.0 - 1e-6) || !isfinite(r[i])) {
            snprintf(err, errlen, "rope factors: factor %d is %g (llama3 scaling only lengthens wavelengths)", i,
                     (double)r[i]);
            return -1;
        }
        factor = fmax(factor, r[i]);
    }
    a->rope_scaling = (arch_rope_scaling){0};
    if (factor <= 1.0 + 1e-6)
        return 0;
    /* in u = 1/wavelength: the factor below u0, 1 above u1, and between them the smooth
     * part s = (u - u0) / (u1 - u0), s = (1/r - 1/factor) / (1 - 1/factor), a line in u */
    double sx = 0, sy = 0, sxx = 0, sxy = 0, u_lo = 0, u_hi = INFINITY;
    int n = 0;
    for (int i = 0; i < half; i++) {
        double u = 1.0 / rope_wavelength(a, i), rel = r[i] / factor;
        if (rel >= 1 - 1e-6) {
            u_lo = fmax(u_lo, u);          /* the factor's region: at or below u0 */
        } else if (r[i] <= 1 + 1e-6) {
            u_hi = fmin(u_hi, u);          /* unscaled: at or above u1 */
        } else {
            double s = (1.0 / r[i] - 1.0 / factor) / (1.0 - 1.0 / factor);
            sx += u, sy += s, sxx += u * u, sxy += u * s, n++;
        }
    }
    double u0, u1;
    if (n >= 2) {
        double A = (n * sxy - sx * sy) / (n * sxx - sx * sx), B = (sy - A * sx) / n;
        u0 = -B / A, u1 = (1 - B) / A;
    } else if (n == 1) {                   /* one smoothed frequency: an edge at a neighbour's */
        u1 = isfinite(u_hi) ? u_hi : 2 * sx;
        u0 = (sx - sy * u1) / (1 - sy);
        if (u0 < u_lo) {                   /* past the factor's region: anchor there instead */
            u0 = u_lo;
            u1 = u0 + (sx - u0) / sy;
        }
    } else {                               /* a step: any edges between the two regions */
        u0 = u_lo;
        u1 = isfinite(u_hi) ? u_hi : u_lo * 2;
    }
    arch_rope_scaling fit = {ROPE_SCALING_LLAMA3, factor, 8192.0 * u0, 8192.0 * u1, 8192};
    if (!(fit.low_freq_factor > 0) || !(fit.high_freq_factor > fit.low_freq_factor)) {
        snprintf(err, errlen, "rope factors: no llama3 scaling has these (low/high frequency factors %g, %g)",
                 fit.low_freq_factor, fit.high_freq_factor);
        return -1;
    }
    a->rope_scaling = fit;
    double *back = malloc((size_t)half * sizeof *back);
    if (!back) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    arch_rope_factors(a, back);
    for (int i = 0; i < half; i++)
        if (fabs(back[i] - r[i]) > 1e-5 * r[i]) {
            snprintf(err, errlen, "rope factors: no llama3 scaling gives them (factor %d is %g; the closest llama3 "
                     "scaling, factor %g, gives %g)", i, (double)r[i], factor, back[i]);
            free(back);
            a->rope_scaling = (arch_rope_scaling){0};
            return -1;
        }
    free(back);
    return 0;
}

int arch_moe_family(const arch *a)
{
    return !strcmp(a->family, "mixtral") || !strcmp(a->family, "qwen2_moe") || !strcmp(a->family, "olmoe");
}

int arch_hybrid(const arch *a) { return !strcmp(a->family, "nemotron_h") || !strcmp(a->family, "mamba2"); }

/* A layer's Mamba-2 mixer: absent (all zero), or every dimension in range with the heads
 * split evenly over the groups, and no attention beside it. */
static int mamba_validate(const arch_layer *l, int i, int hybrid, const char *family, char *err, size_t errlen)
{
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)
    const arch_mamba *m = &l->mamba;
    if (!m->n_heads) {
        if (m->head_dim || m->d_state || m->n_groups || m->conv_kernel)
            BAD("layers[%d].mamba: fields set without heads", i);
        return 0;
    }
    if (!hybrid)
        BAD("layers[%d]: mamba blocks are not supported by family \"%s\"", i, family);
    if (m->n_heads < 0 || m->n_heads > 4096)
        BAD("layers[%d].mamba.n_heads: %d is out of range [0, 4096]", i, m->n_heads);
    if (m->head_dim < 1 || m->head_dim > 1024)
        BAD("layers[%d].mamba.head_dim: %d is out of range [1, 1024]", i, m->head_dim);
    if (m->d_state < 1 || m->d_state > 1024)
        BAD("layers[%d].mamba.d_state: %d is out of range [1, 1024]", i, m->d_state);
    if (m->n_groups < 1 || m->n_heads % m->n_groups)
        BAD("layers[%d].mamba.n_groups: %d must divide n_heads=%d", i, m->n_groups, m->n_heads);
    if (m->conv_kernel < 1 || m->conv_kernel > 16)
        BAD("layers[%d].mamba.conv_kernel: %d is out of range [1, 16]", i, m->conv_kernel);
    if (l->n_heads)
        BAD("layers[%d]: a layer holds attention or a mamba mixer, not both", i);
    return 0;
#undef BAD
}

/* A layer's routing fields: sigmoid routing (with its groups and scale) in nemotron_h, softmax
 * routing (those fields zero) elsewhere. */
static int moe_routing_validate(const arch_moe *e, int i, int hybrid, char *err, size_t errlen)
{
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)
    if (!e->n_experts)
        return 0;
    if (!hybrid) {
        if (e->sigmoid || e->n_group || e->topk_group || e->routed_scale != 0 || e->latent_dim)
            BAD("layers[%d].moe: sigmoid routing (groups, routed scale) and latent experts belong to nemotron_h", i);
        return 0;
    }
    if (e->sigmoid != 1)
        BAD("layers[%d].moe: nemotron_h routes by sigmoid scores", i);
    if (e->n_group < 1 || e->n_experts % e->n_group)
        BAD("layers[%d].moe.n_group: %d must divide n_experts=%d", i, e->n_group, e->n_experts);
    if (e->topk_group < 1 || e->topk_group > e->n_group)
        BAD("layers[%d].moe.topk_group: %d must be in [1, n_group=%d]", i, e->topk_group, e->n_group);
    if (e->top_k > e->topk_group * (e->n_experts / e->n_group))
        BAD("layers[%d].moe.top_k: %d is more than the %d experts of the kept groups", i, e->top_k,
            e->topk_group * (e->n_experts / e->n_group));
    if (!(e->routed_scale > 0 && e->routed_scale < 1e6))
        BAD("layers[%d].moe.routed_scaling_factor: must be positive", i);
    if (e->latent_dim < 0 || e->latent_dim > 65536)
        BAD("layers[%d].moe.latent_dim: %d is out of range [0, 65536]", i, e->latent_dim);
    return 0;
#undef BAD
}

int arch_validate(const arch *a, char *err, size_t errlen)
{
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)
    int moe_family = arch_moe_family(a);
    int hybrid = arch_hybrid(a), mamba_only = !strcmp(a->family, "mamba2");
    if (strcmp(a->family, "llama") != 0 && !moe_family && !hybrid)
        BAD("family: unsupported family \"%s\" (supported: llama, mixtral, qwen2_moe, olmoe, nemotron_h, "
            "mamba2)",
            a->family);
    if (a->vocab_size <= 0 || a->vocab_size > (1 << 22))
        BAD("vocab_size: %d is out of range [1, 4194304]", a->vocab_size);
    if (a->hidden_size <= 0 || a->hidden_size > (1 << 16))
        BAD("hidden_size: %d is out of range [1, 65536]", a->hidden_size);
    if (a->head_dim <= 0 || a->head_dim > 1024 || a->head_dim % 2)
        BAD("head_dim: %d must be even and in [2, 1024]", a->head_dim);
    if (a->max_position_embeddings <= 0)
        BAD("max_position_embeddings: %d must be positive", a->max_position_embeddings);
    if (!(a->rope_theta > 0))
        BAD("rope_theta: must be positive");
    if (!(a->norm_eps > 0 && a->norm_eps < 1))
        BAD("norm_eps: must be in (0, 1)");
    if (a->n_layers < 0 || a->n_layers > 1024)
        BAD("layers: %d layers is out of range [0, 1024]", a->n_layers);
    if (hybrid && a->attention_bias)
        BAD("attention_bias: nemotron_h attention carries no bias");
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        if (l->source_layer < 0)
            BAD("layers[%d].source_layer: %d is negative", i, l->source_layer);
        if (l->n_heads < 0 || l->n_heads > 1024)
            BAD("layers[%d].attention.n_heads: %d is out of range [0, 1024]", i, l->n_heads);
        if (l->n_heads > 0) {
            if (l->n_kv_heads <= 0 || l->n_kv_heads > l->n_heads)
                BAD("layers[%d].attention.n_kv_heads: %d must be in [1, n_heads=%d]", i, l->n_kv_heads, l->n_heads);
            if (l->n_heads % l->n_kv_heads)
                BAD("layers[%d].attention.n_heads: %d is not a multiple of n_kv_heads=%d", i, l->n_heads, l->n_kv_heads);
        } else if (l->n_kv_heads != 0) {
            BAD("layers[%d].attention.n_kv_heads: must be 0 when attention is removed", i);
        }
        if (l->ffn_dim < 0 || l->ffn_dim > (1 << 20))
            BAD("layers[%d].mlp.ffn_dim: %d is out of range [0, 1048576]", i, l->ffn_dim);
        if (mamba_validate(l, i, hybrid, a->family, err, errlen) != 0)
            return -1;
        if (mamba_only && (l->n_heads || arch_layer_has_mlp(l)))
            BAD("layers[%d]: family \"mamba2\" holds Mamba-2 mixers only (attention and MLPs: nemotron_h)", i);
        const arch_moe *e = &l->moe;
        if (moe_routing_validate(e, i, hybrid, err, errlen) != 0)
            return -1;
        if (e->n_experts && !moe_family && !hybrid)
            BAD("layers[%d]: moe blocks are not supported by family \"%s\"", i, a->family);
        if (e->n_experts < 0 || e->n_experts > 4096)
            BAD("layers[%d].moe.n_experts: %d is out of range [0, 4096]", i, e->n_experts);
        if (e->n_experts) {
            if (l->ffn_dim)
                BAD("layers[%d]: a layer holds a dense MLP or an MoE, not both", i);
            if (e->top_k < 1 || e->top_k > e->n_experts)
                BAD("layers[%d].moe.top_k: %d must be in [1, n_experts=%d]", i, e->top_k, e->n_experts);
            if (e->expert_ffn_dim < 1 || e->expert_ffn_dim > (1 << 20))
                BAD("layers[%d].moe.expert_ffn_dim: %d is out of range [1, 1048576]", i, e->expert_ffn_dim);
            if (e->shared_ffn_dim < 0 || e->shared_ffn_dim > (1 << 20))
                BAD("layers[%d].moe.shared_ffn_dim: %d is out of range [0, 1048576]", i, e->shared_ffn_dim);
            if (e->shared_ffn_dim && strcmp(a->family, "qwen2_moe") && !hybrid)
                BAD("layers[%d].moe.shared_ffn_dim: family \"%s\" has no shared expert", i, a->family);
            if (e->norm_topk != 0 && e->norm_topk != 1)
                BAD("layers[%d].moe.norm_topk: must be 0 or 1", i);
        } else if (e->top_k || e->expert_ffn_dim || e->shared_ffn_dim || e->norm_topk || e->sigmoid || e->n_group ||
                   e->topk_group || e->routed_scale != 0 || e->latent_dim) {
            BAD("layers[%d].moe: fields set without experts", i);
        }
    }
    return 0;
#undef BAD
}

int64_t arch_params(const arch *a)
{
    int64_t C = a->hidden_size, D = a->head_dim;
    int64_t n = (int64_t)a->vocab_size * C;          /* embedding */
    if (!a->tie_word_embeddings)
        n += (int64_t)a->vocab_size * C;             /* lm_head */
    n += C;                                          /* final norm */
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        if (l->n_heads > 0) {
            int64_t q = l->n_heads * D, kv = l->n_kv_heads * D;
            n += C;                                  /* attention norm */
            n += C * q + 2 * C * kv + q * C;         /* q, k, v, o */
            if (a->attention_bias)
                n += q + 2 * kv;
            if (arch_qk_norm(a))
                n += q + kv;                         /* q_norm, k_norm */
        }
        if (l->ffn_dim > 0)   /* ffn norm, gate (SwiGLU), up, down */
            n += C + (arch_mlp_gated(a) ? 3 : 2) * C * (int64_t)l->ffn_dim;
        if (l->mamba.n_heads > 0) {
            const arch_mamba *m = &l->mamba;
            int64_t di = arch_mamba_inner(m), cd = arch_mamba_conv_dim(m), H = m->n_heads;
            n += C + C * (di + cd + H);              /* norm, in_proj (z, xBC, dt) */
            n += cd * (m->conv_kernel + 1);          /* conv1d weight and bias */
            n += 3 * H + di + di * C;                /* dt_bias, A_log, D, gated norm, out_proj */
        }
        if (l->moe.n_experts > 0) {
            const arch_moe *e = &l->moe;
            int64_t mats = e->sigmoid ? 2 : 3;       /* squared-ReLU experts: up, down */
            n += C + (int64_t)e->n_experts * C;      /* ffn norm, router */
            n += e->sigmoid ? e->n_experts : 0;      /* the choice's correction bias */
            n += (int64_t)e->n_experts * mats * arch_moe_io(e, (int)C) * e->expert_ffn_dim;
            n += 2 * C * (int64_t)e->latent_dim;     /* fc1_latent_proj, fc2_latent_proj */
            if (e->shared_ffn_dim > 0)               /* shared expert (and Qwen2-MoE's gate row) */
                n += mats * C * (int64_t)e->shared_ffn_dim + (e->sigmoid ? 0 : C);
        }
    }
    return n;
}

const arch_moe *arch_first_moe(const arch *a, int *most)
{
    const arch_moe *first = NULL;
    int m = 0;
    for (int i = 0; i < a->n_layers; i++) {
        const arch_moe *e = &a->layers[i].moe;
        if (e->n_experts && !first)
            first = e;
        m = e->n_experts > m ? e->n_experts : m;
    }
    if (most)
        *most = m;
    return first;
}

const arch_mamba *arch_first_mamba(const arch *a, int *most)
{
    const arch_mamba *first = NULL;
    int m = 0;
    for (int i = 0; i < a->n_layers; i++) {
        const arch_mamba *x = &a->layers[i].mamba;
        if (x->n_heads && !first)
            first = x;
        m = x->n_heads > m ? x->n_heads : m;
    }
    if (most)
        *most = m;
    return first;
}

arch_moe arch_moe_keep(const arch_moe *e, int n)
{
    arch_moe k = *e;
    k.n_experts = n;
    k.top_k = e->top_k < n ? e->top_k : n;
    if (e->sigmoid && e->n_group > 1 && n % e->n_group == 0) {   /* as many in every group */
        int per = n / e->n_group;
        k.top_k = k.top_k < e->topk_group * per ? k.top_k : e->topk_group * per;
    }
    return k;
}

int arch_is_uniform(const arch *a)
{
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i], *f = &a->layers[0];
        if (l->n_heads == 0 || !arch_layer_has_mlp(l) || l->n_heads != f->n_heads ||
            l->n_kv_heads != f->n_kv_heads || l->ffn_dim != f->ffn_dim || memcmp(&l->moe, &f->moe, sizeof l->moe))
            return 0;
    }
    return 1;
}

size_t arch_summary(const arch *a, char *buf, size_t len)
{
    size_t need = 0;
    int n = snprintf(buf, len, "h%d", a->hidden_size);
    need += n > 0 ? (size_t)n : 0;
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        char part[64];
        if (l->n_heads)
            n = snprintf(part, sizeof part, " | L%d a%d/%d f", l->source_layer, l->n_heads, l->n_kv_heads);
        else if (l->mamba.n_heads)
            n = snprintf(part, sizeof part, " | L%d m%dx%d f", l->source_layer, l->mamba.n_heads, l->mamba.head_dim);
        else
            n = snprintf(part, sizeof part, " | L%d a- f", l->source_layer);
        if (l->ffn_dim)
            snprintf(part + n, sizeof part - (size_t)n, "%d", l->ffn_dim);
        else if (l->moe.n_experts && l->moe.shared_ffn_dim)   /* +s: the shared expert's width */
            snprintf(part + n, sizeof part - (size_t)n, "e%d/%dx%d+s%d", l->moe.n_experts, l->moe.top_k,
                     l->moe.expert_ffn_dim, l->moe.shared_ffn_dim);
        else if (l->moe.n_experts)
            snprintf(part + n, sizeof part - (size_t)n, "e%d/%dx%d", l->moe.n_experts, l->moe.top_k,
                     l->moe.expert_ffn_dim);
        else
            snprintf(part + n, sizeof part - (size_t)n, "-");
        size_t pl = strlen(part);
        if (need + pl < len)
            memcpy(buf + need, part, pl + 1);
        need += pl;
    }
    return need + 1;
}
