/* compress/prune.c — checking a target arch against its parent and gathering the
 * target's tensors from the parent's by index maps. Works tensor by tensor through host
 * copies (one parent tensor and one target tensor alive at a time), so it runs on any
 * backend. The Llama, MoE and Nemotron-H families' tensor names are known.
 */
#include "compress/prune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compress/textdata.h"
#include "storage/fileio.h"
#include "storage/ckpt.h"
#include "storage/hfconfig.h"
#include "storage/modelio.h"

void prune_select_free(prune_select *s)
{
    if (!s)
        return;
    free(s->hidden);
    for (int i = 0; i < s->n_layers && s->layers; i++) {
        free(s->layers[i].q);
        free(s->layers[i].kv);
        free(s->layers[i].ffn);
        free(s->layers[i].exp);
        free(s->layers[i].mh);
        free(s->layers[i].ef);
        free(s->layers[i].sf);
        free(s->layers[i].lat);
    }
    free(s->layers);
    memset(s, 0, sizeof *s);
}

/* 1 when a and b are the same number to float precision. */
static int same_f32(double a, double b) { return fabs(a - b) <= 1e-6 * fmax(fabs(a), fabs(b)); }

int prune_check(const arch *p, const arch *t, char *err, size_t errlen)
{
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)
    char verr[256];
    if (arch_validate(t, verr, sizeof verr))
        BAD("target arch: %s", verr);
    if (strcmp(p->family, t->family))
        BAD("family: target \"%s\" differs from the parent's \"%s\"", t->family, p->family);
    if (p->vocab_size != t->vocab_size)
        BAD("vocab_size: target %d differs from the parent's %d", t->vocab_size, p->vocab_size);
    if (p->head_dim != t->head_dim)
        BAD("head_dim: target %d differs from the parent's %d (head_dim is not prunable)", t->head_dim, p->head_dim);
    if (p->tie_word_embeddings != t->tie_word_embeddings)
        BAD("tie_word_embeddings: target %d differs from the parent's %d", t->tie_word_embeddings, p->tie_word_embeddings);
    if (p->attention_bias != t->attention_bias)
        BAD("attention_bias: target %d differs from the parent's %d", t->attention_bias, p->attention_bias);
    /* equal to float precision: a GGUF parent stores them as f32 (1e-5 is 9.99999975e-06 there),
       an arch written from its HF checkpoint as the decimal; a GGUF's llama3 factors are
       fitted back from its f32 rope_freqs */
    if (!arch_rope_same(p, t, 1e-5))
        BAD("rope_theta/rope_scaling: target differs from the parent's");
    if (!same_f32(p->norm_eps, t->norm_eps))
        BAD("norm_eps: target %.9g differs from the parent's %.9g", t->norm_eps, p->norm_eps);
    if (t->hidden_size > p->hidden_size)
        BAD("hidden_size: %d is wider than the parent's %d", t->hidden_size, p->hidden_size);
    int prev = -1;
    for (int i = 0; i < t->n_layers; i++) {
        const arch_layer *tl = &t->layers[i];
        if (tl->source_layer < 0 || tl->source_layer >= p->n_layers)
            BAD("layers[%d].source_layer: %d is not a parent layer (parent has %d)", i, tl->source_layer, p->n_layers);
        if (tl->source_layer <= prev)
            BAD("layers[%d].source_layer: %d does not follow %d (source layers must increase)", i, tl->source_layer, prev);
        prev = tl->source_layer;
        const arch_layer *pl = &p->layers[tl->source_layer];
        const arch_mamba *tm = &tl->mamba, *pm = &pl->mamba;
        if (tm->n_heads) {
            if (!pm->n_heads)
                BAD("layers[%d].mamba: parent layer %d has no Mamba mixer", i, tl->source_layer);
            if (tm->n_heads > pm->n_heads)
                BAD("layers[%d].mamba.n_heads: %d is more than parent layer %d's %d", i, tm->n_heads,
                    tl->source_layer, pm->n_heads);
            if (tm->head_dim != pm->head_dim || tm->d_state != pm->d_state || tm->n_groups != pm->n_groups ||
                tm->conv_kernel != pm->conv_kernel)
                BAD("layers[%d].mamba: head_dim, d_state, n_groups and conv_kernel must be parent layer %d's "
                    "(%d, %d, %d, %d): only Mamba heads are pruned in this build", i, tl->source_layer, pm->head_dim,
                    pm->d_state, pm->n_groups, pm->conv_kernel);
        }
        const arch_moe *te = &tl->moe, *pe = &pl->moe;
        if (te->n_experts) {
            if (!pe->n_experts)
                BAD("layers[%d].moe: parent layer %d has no experts", i, tl->source_layer);
            if (te->n_experts > pe->n_experts)
                BAD("layers[%d].moe.n_experts: %d is more than parent layer %d's %d", i, te->n_experts,
                    tl->source_layer, pe->n_experts);
            if (te->top_k > pe->top_k)
                BAD("layers[%d].moe.top_k: %d is more than parent layer %d's %d", i, te->top_k, tl->source_layer,
                    pe->top_k);
            if (te->expert_ffn_dim > pe->expert_ffn_dim)
                BAD("layers[%d].moe.expert_ffn_dim: %d is wider than parent layer %d's %d", i, te->expert_ffn_dim,
                    tl->source_layer, pe->expert_ffn_dim);
            if (te->shared_ffn_dim > pe->shared_ffn_dim || (pe->shared_ffn_dim && !te->shared_ffn_dim))
                BAD("layers[%d].moe.shared_ffn_dim: %d; parent layer %d's shared expert is %d wide (a shared "
                    "expert is kept, narrowed or not, and none is added)", i, te->shared_ffn_dim, tl->source_layer,
                    pe->shared_ffn_dim);
            if (te->norm_topk != pe->norm_topk)
                BAD("layers[%d].moe.norm_topk: differs from parent layer %d's", i, tl->source_layer);
            if (te->sigmoid != pe->sigmoid || te->routed_scale != pe->routed_scale)
                BAD("layers[%d].moe: routing differs from parent layer %d's", i, tl->source_layer);
            if (te->latent_dim > pe->latent_dim || (pe->latent_dim > 0) != (te->latent_dim > 0))
                BAD("layers[%d].moe.latent_dim: %d; parent layer %d's experts run in a latent of %d (a latent is "
                    "kept, narrowed or not, and none is added)", i, te->latent_dim, tl->source_layer, pe->latent_dim);
            /* grouped routing: the groups stay, each keeping as many experts (and two at least where
               groups are dropped: a group's score is the sum of its two best, as HF computes it) */
            if (te->n_group != pe->n_group || te->topk_group != pe->topk_group)
                BAD("layers[%d].moe: n_group/topk_group %d/%d differ from parent layer %d's %d/%d", i, te->n_group,
                    te->topk_group, tl->source_layer, pe->n_group, pe->topk_group);
            if (!arch_moe_count_ok(pe, te->n_experts))
                BAD("layers[%d].moe.n_experts: %d; parent layer %d routes in %d groups, which keep as many experts "
                    "each (a multiple of %d%s)", i, te->n_experts, tl->source_layer, pe->n_group, pe->n_group,
                    pe->topk_group < pe->n_group ? ", two at least per group" : "");
        }
        if (tl->n_heads > 0) {
            if (pl->n_heads == 0)
                BAD("layers[%d].n_heads: parent layer %d has no attention", i, tl->source_layer);
            if (tl->n_kv_heads > pl->n_kv_heads)
                BAD("layers[%d].n_kv_heads: %d is more than parent layer %d's %d", i, tl->n_kv_heads,
                    tl->source_layer, pl->n_kv_heads);
            int pr = pl->n_heads / pl->n_kv_heads, tr = tl->n_heads / tl->n_kv_heads;
            if (tl->n_heads % tl->n_kv_heads)
                BAD("layers[%d].n_heads: %d is not a multiple of n_kv_heads %d", i, tl->n_heads, tl->n_kv_heads);
            if (tr > pr)
                BAD("layers[%d]: %d query heads per KV head is more than parent layer %d's %d "
                    "(n_heads %d, n_kv_heads %d)", i, tr, tl->source_layer, pr, tl->n_heads, tl->n_kv_heads);
        }
        if (tl->ffn_dim > pl->ffn_dim)
            BAD("layers[%d].ffn_dim: %d is wider than parent layer %d's %d", i, tl->ffn_dim, tl->source_layer, pl->ffn_dim);
    }
    return 0;
#undef BAD
}

static int *iota_new(int n)
{
    int *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    if (v)
        for (int i = 0; i < n; i++)
            v[i] = i;
    return v;
}

int prune_select_prefix(const arch *p, const arch *t, prune_select *sel, char *err, size_t errlen)
{
    memset(sel, 0, sizeof *sel);
    if (prune_check(p, t, err, errlen))
        return -1;
    sel->n_hidden = t->hidden_size;
    sel->hidden = iota_new(t->hidden_size);
    sel->layers = calloc((size_t)(t->n_layers > 0 ? t->n_layers : 1), sizeof *sel->layers);
    if (!sel->hidden || !sel->layers)
        goto oom;
    sel->n_layers = t->n_layers;
    for (int i = 0; i < t->n_layers; i++) {
        const arch_layer *tl = &t->layers[i], *pl = &p->layers[tl->source_layer];
        prune_layer_sel *ls = &sel->layers[i];
        ls->src = tl->source_layer;
        if (tl->n_heads > 0) {
            int pr = pl->n_heads / pl->n_kv_heads, tr = tl->n_heads / tl->n_kv_heads;
            ls->nkv = tl->n_kv_heads;
            ls->nq = tl->n_heads;
            ls->kv = iota_new(ls->nkv);
            ls->q = malloc((size_t)ls->nq * sizeof *ls->q);
            if (!ls->kv || !ls->q)
                goto oom;
            /* query head j of kept group g is parent head g*pr + j (HF repeat_kv order) */
            for (int g = 0; g < ls->nkv; g++)
                for (int j = 0; j < tr; j++)
                    ls->q[g * tr + j] = g * pr + j;
        }
        if (tl->ffn_dim > 0) {
            ls->nffn = tl->ffn_dim;
            ls->ffn = iota_new(ls->nffn);
            if (!ls->ffn)
                goto oom;
        }
        if (tl->moe.n_experts > 0) {   /* the first experts (of every routing group) */
            int G = arch_moe_grouped(&pl->moe) ? pl->moe.n_group : 1, tg = tl->moe.n_experts / G;
            int pg = pl->moe.n_experts / G;
            ls->nexp = tl->moe.n_experts;
            if (!(ls->exp = malloc((size_t)ls->nexp * sizeof *ls->exp)))
                goto oom;
            for (int g = 0; g < G; g++)
                for (int j = 0; j < tg; j++)
                    ls->exp[g * tg + j] = g * pg + j;
        }
        if (tl->mamba.n_heads > 0) {   /* the first heads of every group */
            int G = tl->mamba.n_groups, tg = tl->mamba.n_heads / G, pg = pl->mamba.n_heads / G;
            ls->nm = tl->mamba.n_heads;
            if (!(ls->mh = malloc((size_t)ls->nm * sizeof *ls->mh)))
                goto oom;
            for (int g = 0; g < G; g++)
                for (int j = 0; j < tg; j++)
                    ls->mh[g * tg + j] = g * pg + j;
        }
    }
    return 0;
oom:
    prune_select_free(sel);
    snprintf(err, errlen, "out of memory building the pruning selection");
    return -1;
}

/* One axis of a gather: out index i reads source index map[i/blk]*blk + i%blk
 * (map NULL: identity). */
typedef struct {
    const int *map;
    int blk;
} axis_map;

static inline int64_t axis_src(const axis_map *a, int64_t i)
{
    if (!a->map)
        return i;
    return (int64_t)a->map[i / a->blk] * a->blk + i % a->blk;
}

typedef enum {
    T_EMB, T_LMHEAD, T_FNORM, T_ANORM, T_MNORM, T_Q, T_K, T_V, T_QB, T_KB, T_VB, T_O, T_GATE, T_UP, T_DOWN,
    T_ROUTER, T_XG, T_XU, T_XD, T_SG, T_SU, T_SD, T_SGATE,
    T_MIN, T_MCONVW, T_MCONVB, T_MHEAD, T_MGNORM, T_MOUT, T_RBIAS, T_LATIN, T_LATOUT
} tkind;

/* Nemotron-H's names after "backbone.layers.L." (the block norm is the layer's only one). */
static const struct {
    const char *suffix;
    tkind kind;
} hybrid_names[] = {
    {"norm.weight", T_ANORM},              {"mixer.q_proj.weight", T_Q},      {"mixer.k_proj.weight", T_K},
    {"mixer.v_proj.weight", T_V},          {"mixer.o_proj.weight", T_O},      {"mixer.up_proj.weight", T_UP},
    {"mixer.down_proj.weight", T_DOWN},    {"mixer.in_proj.weight", T_MIN},   {"mixer.conv1d.weight", T_MCONVW},
    {"mixer.conv1d.bias", T_MCONVB},       {"mixer.dt_bias", T_MHEAD},        {"mixer.A_log", T_MHEAD},
    {"mixer.D", T_MHEAD},                  {"mixer.norm.weight", T_MGNORM},   {"mixer.out_proj.weight", T_MOUT},
    {"mixer.gate.weight", T_ROUTER},       {"mixer.gate.e_score_correction_bias", T_RBIAS},
    {"mixer.shared_experts.up_proj.weight", T_SU}, {"mixer.shared_experts.down_proj.weight", T_SD},
    {"mixer.fc1_latent_proj.weight", T_LATIN},    {"mixer.fc2_latent_proj.weight", T_LATOUT},
};

/* A Mamba layer's kept rows of in_proj (in_rows: z, x, B, C, dt) or of the conv (x, B, C)
 * in the parent's numbering: the kept heads' P rows of z and x, every row of B and C, the
 * kept heads' dt rows. A NEW array, or NULL out of memory. */
static int *mamba_rows(const arch_mamba *pm, const prune_layer_sel *ls, int in_rows)
{
    int P = pm->head_dim, GS = pm->n_groups * pm->d_state, dip = pm->n_heads * P, dit = ls->nm * P;
    int n = in_rows ? 2 * dit + 2 * GS + ls->nm : dit + 2 * GS, k = 0;
    int *r = malloc((size_t)n * sizeof *r);
    if (!r)
        return NULL;
    int base = in_rows ? dip : 0;   /* where x starts in the parent (after z in in_proj) */
    for (int part = in_rows ? 0 : 1; part < 2; part++)   /* z (in_proj only), then x */
        for (int h = 0; h < ls->nm; h++)
            for (int p = 0; p < P; p++)
                r[k++] = (part ? base : 0) + ls->mh[h] * P + p;
    for (int i = 0; i < 2 * GS; i++)
        r[k++] = base + dip + i;
    for (int h = 0; in_rows && h < ls->nm; h++)
        r[k++] = base + dip + 2 * GS + ls->mh[h];
    return r;
}

static const struct {
    const char *suffix;
    tkind kind;
} layer_names[] = {
    {"input_layernorm.weight", T_ANORM},     {"post_attention_layernorm.weight", T_MNORM},
    {"self_attn.q_proj.weight", T_Q},        {"self_attn.k_proj.weight", T_K},
    {"self_attn.v_proj.weight", T_V},        {"self_attn.q_proj.bias", T_QB},
    {"self_attn.k_proj.bias", T_KB},         {"self_attn.v_proj.bias", T_VB},
    {"self_attn.q_norm.weight", T_QB},       {"self_attn.k_norm.weight", T_KB},   /* OLMoE: per q/k channel */
    {"self_attn.o_proj.weight", T_O},        {"mlp.gate_proj.weight", T_GATE},
    {"mlp.up_proj.weight", T_UP},            {"mlp.down_proj.weight", T_DOWN},
    {"block_sparse_moe.gate.weight", T_ROUTER}, {"mlp.gate.weight", T_ROUTER},
    {"mlp.shared_expert.gate_proj.weight", T_SG}, {"mlp.shared_expert.up_proj.weight", T_SU},
    {"mlp.shared_expert.down_proj.weight", T_SD}, {"mlp.shared_expert_gate.weight", T_SGATE},
};

/* An expert's tensor: "<moe>.experts.<e>.<w>" with <moe> Mixtral's block_sparse_moe or
 * Qwen2-MoE's mlp, <w> w1/w3/w2 or gate/up/down_proj. */
static const struct {
    const char *suffix;
    tkind kind;
} expert_names[] = {
    {"w1.weight", T_XG}, {"w3.weight", T_XU}, {"w2.weight", T_XD},
    {"gate_proj.weight", T_XG}, {"up_proj.weight", T_XU}, {"down_proj.weight", T_XD},
};

/* rest (after "model.layers.L.") as an expert tensor: kind, expert index, its "<moe>." prefix
 * length and "<w>" suffix. 0, or -1 when it is none. */
static int parse_expert(const char *rest, tkind *kind, int *expert, int *prefix_len, const char **suffix)
{
    static const char *const moes[] = {"block_sparse_moe.experts.", "mlp.experts."};
    for (size_t m = 0; m < 2; m++) {
        size_t n = strlen(moes[m]);
        if (strncmp(rest, moes[m], n))
            continue;
        char *end;
        long e = strtol(rest + n, &end, 10);
        if (end == rest + n || *end != '.' || e < 0 || e > 4096)
            return -1;
        for (size_t i = 0; i < sizeof expert_names / sizeof *expert_names; i++)
            if (!strcmp(end + 1, expert_names[i].suffix)) {
                *kind = expert_names[i].kind;
                *expert = (int)e;
                *prefix_len = (int)(n - strlen("experts."));
                *suffix = expert_names[i].suffix;
                return 0;
            }
        return -1;
    }
    return -1;
}

/* Parse an HF tensor name into a kind and layer (-1 for globals), and the name of the
 * tensor it comes from in the parent (layer ls->src, expert ls->exp[e]) into pname.
 * 0, or -1 if unknown. */
static int parse_name(const char *name, const prune_select *sel, tkind *kind, int *layer, int *expert, char *pname,
                      size_t cap)
{
    *layer = *expert = -1;
    snprintf(pname, cap, "%s", name);
    if (!strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "backbone.embeddings.weight")) {
        *kind = T_EMB;
        return 0;
    }
    if (!strcmp(name, "lm_head.weight")) {
        *kind = T_LMHEAD;
        return 0;
    }
    if (!strcmp(name, "model.norm.weight") || !strcmp(name, "backbone.norm_f.weight")) {
        *kind = T_FNORM;
        return 0;
    }
    static const char hpre[] = "backbone.layers.";
    if (!strncmp(name, hpre, sizeof hpre - 1)) {
        char *e;
        long l = strtol(name + sizeof hpre - 1, &e, 10);
        if (e == name + sizeof hpre - 1 || *e != '.' || l < 0 || l >= sel->n_layers)
            return -1;
        for (size_t i = 0; i < sizeof hybrid_names / sizeof *hybrid_names; i++)
            if (!strcmp(e + 1, hybrid_names[i].suffix)) {
                *kind = hybrid_names[i].kind;
                *layer = (int)l;
                snprintf(pname, cap, "backbone.layers.%d.%s", sel->layers[l].src, hybrid_names[i].suffix);
                return 0;
            }
        static const char xp[] = "mixer.experts.";   /* Nemotron-H's experts: up_proj, down_proj */
        char *end2;
        long x = strncmp(e + 1, xp, sizeof xp - 1) ? -1 : strtol(e + 1 + sizeof xp - 1, &end2, 10);
        if (x < 0 || x >= sel->layers[l].nexp || *end2 != '.')
            return -1;
        if (strcmp(end2 + 1, "up_proj.weight") && strcmp(end2 + 1, "down_proj.weight"))
            return -1;
        *kind = end2[1] == 'u' ? T_XU : T_XD;
        *layer = (int)l;
        *expert = (int)x;
        snprintf(pname, cap, "backbone.layers.%d.mixer.experts.%d.%s", sel->layers[l].src, sel->layers[l].exp[x],
                 end2 + 1);
        return 0;
    }
    static const char pre[] = "model.layers.";
    if (strncmp(name, pre, sizeof pre - 1))
        return -1;
    char *end;
    long l = strtol(name + sizeof pre - 1, &end, 10);
    if (end == name + sizeof pre - 1 || *end != '.' || l < 0 || l > 1 << 20)
        return -1;
    if (l >= sel->n_layers)
        return -1;
    const prune_layer_sel *ls = &sel->layers[l];
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++)
        if (!strcmp(end + 1, layer_names[i].suffix)) {
            *kind = layer_names[i].kind;
            *layer = (int)l;
            snprintf(pname, cap, "model.layers.%d.%s", ls->src, layer_names[i].suffix);
            return 0;
        }
    int e, plen;
    const char *suffix;
    if (parse_expert(end + 1, kind, &e, &plen, &suffix) || e >= ls->nexp)
        return -1;
    *layer = (int)l;
    *expert = e;
    snprintf(pname, cap, "model.layers.%d.%.*sexperts.%d.%s", ls->src, plen, end + 1, ls->exp[e], suffix);
    return 0;
}

/* The gather of one tensor of kind k: its row and column maps and the parent tensor's shape;
 * mrows: the Mamba layer's in_proj or conv rows (mamba_rows) for T_MIN, T_MCONVW, T_MCONVB;
 * x: the target expert of T_XG, T_XU, T_XD. */
static void gather_axes(tkind k, const arch *pa, const prune_select *sel, const prune_layer_sel *ls,
                        const int *mrows, int x, axis_map *rows, axis_map *cols, int64_t *src_rows, int64_t *src_cols)
{
    const arch_layer *pl = ls ? &pa->layers[ls->src] : NULL;
    const int64_t C = pa->hidden_size, D = pa->head_dim;
    const axis_map hid = {sel->hidden, 1}, none = {NULL, 1};
    const axis_map eu = {ls && ls->ef && x >= 0 ? ls->ef + (size_t)x * ls->nef : NULL, 1}, su = {ls ? ls->sf : NULL, 1};
    const axis_map lat = {ls ? ls->lat : NULL, 1};
    *rows = *cols = none;
    *src_cols = 1;
    switch (k) {
    case T_EMB: case T_LMHEAD: *cols = hid; *src_rows = pa->vocab_size; *src_cols = C; break;
    case T_FNORM: case T_ANORM: case T_MNORM: *rows = hid; *src_rows = C; break;
    case T_Q: *rows = (axis_map){ls->q, (int)D}; *cols = hid; *src_rows = pl->n_heads * D; *src_cols = C; break;
    case T_K: case T_V: *rows = (axis_map){ls->kv, (int)D}; *cols = hid; *src_rows = pl->n_kv_heads * D; *src_cols = C; break;
    case T_QB: *rows = (axis_map){ls->q, (int)D}; *src_rows = pl->n_heads * D; break;
    case T_KB: case T_VB: *rows = (axis_map){ls->kv, (int)D}; *src_rows = pl->n_kv_heads * D; break;
    case T_O: *rows = hid; *cols = (axis_map){ls->q, (int)D}; *src_rows = C; *src_cols = pl->n_heads * D; break;
    case T_GATE: case T_UP: *rows = (axis_map){ls->ffn, 1}; *cols = hid; *src_rows = pl->ffn_dim; *src_cols = C; break;
    case T_DOWN: *rows = hid; *cols = (axis_map){ls->ffn, 1}; *src_rows = C; *src_cols = pl->ffn_dim; break;
    case T_ROUTER: *rows = (axis_map){ls->exp, 1}; *cols = hid; *src_rows = pl->moe.n_experts; *src_cols = C; break;
    case T_RBIAS: *rows = (axis_map){ls->exp, 1}; *src_rows = pl->moe.n_experts; break;
    /* a LatentMoE's experts read and write the latent's kept channels, not the hidden size's */
    case T_XG: case T_XU:
        *rows = eu, *cols = pl->moe.latent_dim ? lat : hid, *src_rows = pl->moe.expert_ffn_dim;
        *src_cols = arch_moe_io(&pl->moe, (int)C);
        break;
    case T_XD:
        *rows = pl->moe.latent_dim ? lat : hid, *cols = eu, *src_rows = arch_moe_io(&pl->moe, (int)C);
        *src_cols = pl->moe.expert_ffn_dim;
        break;
    case T_LATIN: *rows = lat; *cols = hid; *src_rows = pl->moe.latent_dim; *src_cols = C; break;
    case T_LATOUT: *rows = hid; *cols = lat; *src_rows = C; *src_cols = pl->moe.latent_dim; break;
    case T_SG: case T_SU: *rows = su; *cols = hid; *src_rows = pl->moe.shared_ffn_dim; *src_cols = C; break;
    case T_SD: *rows = hid; *cols = su; *src_rows = C; *src_cols = pl->moe.shared_ffn_dim; break;
    case T_SGATE: *cols = hid; *src_rows = 1; *src_cols = C; break;
    case T_MIN:
        *rows = (axis_map){mrows, 1}, *cols = hid, *src_cols = C;
        *src_rows = arch_mamba_in_rows(&pl->mamba);
        break;
    case T_MCONVW: case T_MCONVB:
        *rows = (axis_map){mrows, 1}, *src_rows = arch_mamba_conv_dim(&pl->mamba);
        *src_cols = k == T_MCONVW ? pl->mamba.conv_kernel : 1;
        break;
    case T_MHEAD: *rows = (axis_map){ls->mh, 1}; *src_rows = pl->mamba.n_heads; break;
    case T_MGNORM: *rows = (axis_map){ls->mh, pl->mamba.head_dim}; *src_rows = arch_mamba_inner(&pl->mamba); break;
    case T_MOUT:
        *rows = hid, *cols = (axis_map){ls->mh, pl->mamba.head_dim}, *src_rows = C;
        *src_cols = arch_mamba_inner(&pl->mamba);
        break;
    }
}

/* A selection that every gather can follow: 0, or -1 with err naming what is out of range. */
static int check_select(const arch *pa, const arch *target, const prune_select *sel, char *err, size_t errlen)
{
    if (sel->n_layers != target->n_layers || sel->n_hidden != target->hidden_size) {
        snprintf(err, errlen, "pruning selection does not match the target arch");
        return -1;
    }
    for (int i = 0; i < sel->n_hidden; i++)
        if (sel->hidden[i] < 0 || sel->hidden[i] >= pa->hidden_size) {
            snprintf(err, errlen, "hidden channel %d is not a parent channel", sel->hidden[i]);
            return -1;
        }
    for (int l = 0; l < sel->n_layers; l++) {
        const prune_layer_sel *ls = &sel->layers[l];
        if (ls->src < 0 || ls->src >= pa->n_layers) {
            snprintf(err, errlen, "layers[%d]: source layer %d out of range", l, ls->src);
            return -1;
        }
        const arch_layer *pl = &pa->layers[ls->src];
        for (int i = 0; i < ls->nq; i++)
            if (ls->q[i] < 0 || ls->q[i] >= pl->n_heads || (ls->nkv && ls->q[i] / (pl->n_heads / pl->n_kv_heads) !=
                                                          ls->kv[i / (ls->nq / ls->nkv)])) {
                snprintf(err, errlen, "layers[%d]: query head %d is not in its KV group", l, ls->q[i]);
                return -1;
            }
        for (int i = 0; i < ls->nkv; i++)
            if (ls->kv[i] < 0 || ls->kv[i] >= pl->n_kv_heads) {
                snprintf(err, errlen, "layers[%d]: KV head %d out of range", l, ls->kv[i]);
                return -1;
            }
        for (int i = 0; i < ls->nffn; i++)
            if (ls->ffn[i] < 0 || ls->ffn[i] >= pl->ffn_dim) {
                snprintf(err, errlen, "layers[%d]: FFN unit %d out of range", l, ls->ffn[i]);
                return -1;
            }
        for (int i = 0; i < ls->nexp; i++)
            if (ls->exp[i] < 0 || ls->exp[i] >= pl->moe.n_experts) {
                snprintf(err, errlen, "layers[%d]: expert %d out of range", l, ls->exp[i]);
                return -1;
            }
        for (int i = 0; ls->ef && i < ls->nexp * ls->nef; i++)
            if (ls->ef[i] < 0 || ls->ef[i] >= pl->moe.expert_ffn_dim) {
                snprintf(err, errlen, "layers[%d]: expert unit %d out of range", l, ls->ef[i]);
                return -1;
            }
        for (int i = 0; ls->sf && i < ls->nsf; i++)
            if (ls->sf[i] < 0 || ls->sf[i] >= pl->moe.shared_ffn_dim) {
                snprintf(err, errlen, "layers[%d]: shared expert unit %d out of range", l, ls->sf[i]);
                return -1;
            }
        if (ls->lat && ls->nlat < target->layers[l].moe.latent_dim) {
            snprintf(err, errlen, "layers[%d]: %d latent channels selected for a latent of %d", l, ls->nlat,
                     target->layers[l].moe.latent_dim);
            return -1;
        }
        for (int i = 0; ls->lat && i < ls->nlat; i++)
            if (ls->lat[i] < 0 || ls->lat[i] >= pl->moe.latent_dim) {
                snprintf(err, errlen, "layers[%d]: latent channel %d out of range", l, ls->lat[i]);
                return -1;
            }
        int G = pl->mamba.n_groups;
        for (int i = 0; i < ls->nm; i++)   /* a head stays in its group: B and C are the group's */
            if (ls->mh[i] < 0 || ls->mh[i] >= pl->mamba.n_heads ||
                ls->mh[i] / (pl->mamba.n_heads / G) != i / (ls->nm / G)) {
                snprintf(err, errlen, "layers[%d]: Mamba head %d is not in its group", l, ls->mh[i]);
                return -1;
            }
    }
    return 0;
}

int prune_gather(const eng_model *parent, const arch *target, const prune_select *sel,
                 eng_model *out, char *err, size_t errlen)
{
    const arch *pa = &parent->a;
    if (check_select(pa, target, sel, err, errlen) || eng_model_init(out, target, parent->be, err, errlen))
        return -1;
    eng_backend *be = parent->be;
    float *src = NULL, *dst = NULL;
    int *mrows = NULL;
    int64_t src_cap = 0, dst_cap = 0;
    int nt = eng_model_tensor_count(out);
    for (int ti = 0; ti < nt; ti++) {
        const char *name;
        int64_t shape[2];
        int ndim;
        float *dev;
        if (eng_model_tensor(out, ti, &name, shape, &ndim, &dev)) {
            snprintf(err, errlen, "tensor %d: enumeration failed", ti);
            goto fail;
        }
        tkind kind;
        int layer, expert;
        char pname[160];
        if (parse_name(name, sel, &kind, &layer, &expert, pname, sizeof pname)) {
            snprintf(err, errlen, "tensor %s: not known to pruning", name);
            goto fail;
        }
        axis_map rows, cols;
        int64_t src_rows = 0, src_cols = 1;
        free(mrows);
        mrows = NULL;
        if ((kind == T_MIN || kind == T_MCONVW || kind == T_MCONVB) &&
            !(mrows = mamba_rows(&pa->layers[sel->layers[layer].src].mamba, &sel->layers[layer], kind == T_MIN)))
            goto oom;
        gather_axes(kind, pa, sel, layer >= 0 ? &sel->layers[layer] : NULL, mrows, expert, &rows, &cols, &src_rows,
                    &src_cols);
        int64_t src_n = src_rows * src_cols;
        if (src_n > src_cap) {
            free(src);
            src = malloc((size_t)src_n * sizeof *src);
            src_cap = src ? src_n : 0;
            if (!src)
                goto oom;
        }
        int64_t got = eng_model_get_tensor(parent, pname, src, src_n);
        if (got != src_n) {
            snprintf(err, errlen, "parent tensor %s: %s (expected %lld elements, got %lld)", pname,
                     got < 0 ? "absent" : "wrong size", (long long)src_n, (long long)got);
            goto fail;
        }
        int64_t out_rows = shape[0], out_cols = ndim == 2 ? shape[1] : 1;
        int64_t out_n = out_rows * out_cols;
        if (out_n > dst_cap) {
            free(dst);
            dst = malloc((size_t)out_n * sizeof *dst);
            dst_cap = dst ? out_n : 0;
            if (!dst)
                goto oom;
        }
        for (int64_t i = 0; i < out_rows; i++) {
            int64_t si = axis_src(&rows, i);
            if (si >= src_rows) {
                snprintf(err, errlen, "tensor %s: row %lld maps outside the parent's %lld", name,
                         (long long)i, (long long)src_rows);
                goto fail;
            }
            const float *srow = src + si * src_cols;
            float *drow = dst + i * out_cols;
            if (!cols.map && out_cols <= src_cols) {
                memcpy(drow, srow, (size_t)out_cols * sizeof *drow);
                continue;
            }
            for (int64_t j = 0; j < out_cols; j++) {
                int64_t sj = axis_src(&cols, j);
                if (sj >= src_cols) {
                    snprintf(err, errlen, "tensor %s: column %lld maps outside the parent's %lld", name,
                             (long long)j, (long long)src_cols);
                    goto fail;
                }
                drow[j] = srow[sj];
            }
        }
        if ((kind == T_FNORM || kind == T_ANORM || kind == T_MNORM) && target->hidden_size < pa->hidden_size) {
            /* RMSNorm over C' of the C channels: the kept channels carry nearly all of the
               stream's energy, so the student's rms is sqrt(C/C') times the parent's; the gain
               gives it back (the student then equals the parent with the cut channels zeroed,
               the search's masked model) */
            float g = (float)sqrt((double)pa->hidden_size / target->hidden_size);
            for (int64_t i = 0; i < out_n; i++)
                dst[i] *= g;
        }
        be->to_device(be, dev, dst, (size_t)out_n * sizeof *dst);
    }
    free(src);
    free(dst);
    free(mrows);
    return 0;
oom:
    snprintf(err, errlen, "out of memory gathering tensors");
fail:
    free(src);
    free(dst);
    free(mrows);
    eng_model_free(out);
    return -1;
}

int prune_to_arch(const eng_model *parent, const arch *target, eng_model *out, char *err, size_t errlen)
{
    prune_select sel;
    if (prune_select_prefix(&parent->a, target, &sel, err, errlen))
        return -1;
    int rc = prune_gather(parent, target, &sel, out, err, errlen);
    prune_select_free(&sel);
    return rc;
}

/* ---- pruned model directories ------------------------------------------------------ */

static int write_json(const char *path, json_t *j, char *err, size_t errlen)
{
    char *text = json_dumps(j, JSON_SORT_KEYS | JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    if (!text) {
        snprintf(err, errlen, "out of memory rendering %s", path);
        return -1;
    }
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        free(text);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    t2[n] = '\n';
    t2[n + 1] = 0;
    int rc = fio_write_atomic(path, t2, n + 1, err, errlen);
    free(t2);
    return rc;
}

int prune_save_dir(const eng_model *m, const char *dir, json_t *manifest, char *err, size_t errlen)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path) {
        snprintf(err, errlen, "%s: path too long", dir);
        return -1;
    }
    if (ckpt_save(m, dir, err, errlen))
        return -1;
    char cerr[256];
    json_t *cfg = arch_is_uniform(&m->a) || arch_hybrid(&m->a)
                      ? hfconfig_from_arch(&m->a, "float32", cerr, sizeof cerr) : NULL;
    if (cfg) {
        int rc = write_json(path, cfg, err, errlen);
        json_decref(cfg);
        if (rc)
            return -1;
    } else {
        unlink(path);   /* a stale config from an earlier save would lie */
    }
    if (manifest) {
        snprintf(path, sizeof path, "%s/prune.json", dir);
        if (write_json(path, manifest, err, errlen))
            return -1;
    }
    return 0;
}

int prune_is_dir(const char *path)
{
    char p[4096];
    struct stat st;
    if (stat(path, &st) || !S_ISDIR(st.st_mode))
        return 0;
    snprintf(p, sizeof p, "%s/arch.json", path);
    if (stat(p, &st))
        return 0;
    snprintf(p, sizeof p, "%s/model.safetensors", path);
    return stat(p, &st) == 0;
}

int prune_load_dir(const char *dir, eng_backend *be, eng_model *m, json_t **manifest, char *err, size_t errlen)
{
    if (manifest)
        *manifest = NULL;
    if (ckpt_load(dir, be, m, err, errlen))
        return -1;
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/prune.json", dir);
    if (manifest && stat(path, &st) == 0 && !(*manifest = fio_load_json(path, JSON_REJECT_DUPLICATES, err, errlen))) {
        eng_model_free(m);   /* a manifest there but unreadable: its parent and tokenizer are unknown */
        return -1;
    }
    return 0;
}

/* How many snapshot folders a tokenizer is looked for through: a pruned model distilled, pruned
 * again and so on; more is a loop of manifests. */
#define PRUNE_PARENT_DEPTH 16

/* The tokenizer of snapshot folder `path` (manifest `man`): `given`, else the one a manifest
 * names, opened with the first parent that is a model rather than another snapshot folder (a
 * distilled or pruned student pruned again), whose manifest is followed in turn. NULL with a
 * reason. */
static tok_tokenizer *dir_tokenizer(const char *path, const json_t *man, const char *given, char *err,
                                    size_t errlen)
{
    char at[4096], src[4096];
    snprintf(at, sizeof at, "%s", path);
    src[0] = 0;
    if (given)
        snprintf(src, sizeof src, "%s", given);
    json_t *own = NULL;   /* the manifest read along the chain */
    tok_tokenizer *tok = NULL;
    for (int depth = 0;; depth++) {
        const char *name = json_string_value(json_object_get(man, "tokenizer"));
        const char *parent = json_string_value(json_object_get(man, "parent"));
        if (!src[0] && name && snprintf(src, sizeof src, "%s", name) >= (int)sizeof src) {
            snprintf(err, errlen, "%s: prune.json's tokenizer path is too long", at);
            break;
        }
        if (!parent) {
            if (src[0])
                snprintf(err, errlen, "%s: prune.json names no parent to open the tokenizer %s with", at, src);
            else
                snprintf(err, errlen, "%s: no tokenizer (prune.json names no parent; pass a tokenizer path)", at);
            break;
        }
        if (prune_is_dir(parent)) {   /* a snapshot itself: its manifest says where the tokenizer is */
            char mp[4200];
            snprintf(mp, sizeof mp, "%s/prune.json", parent);
            if (depth + 1 >= PRUNE_PARENT_DEPTH) {
                snprintf(err, errlen, "%s: more than %d snapshot folders in a row name their parents (a loop?); "
                                      "pass a tokenizer path", path, PRUNE_PARENT_DEPTH);
                break;
            }
            json_t *next = fio_is_file(mp) ? fio_load_json(mp, JSON_REJECT_DUPLICATES, err, errlen) : json_object();
            if (!next)
                break;
            snprintf(at, sizeof at, "%s", parent);   /* before the manifest holding it goes */
            json_decref(own);
            own = next;
            man = own;
            continue;
        }
        mio_model mm;
        if (mio_open(&mm, parent, src[0] ? src : NULL, err, errlen) == 0) {
            tok = mio_tokenizer(&mm, err, errlen);
            mio_close(&mm);
        }
        break;
    }
    json_decref(own);
    return tok;
}

int prune_load_model(const char *path, const char *tokenizer_path, eng_backend *be, eng_model *m,
                     tok_tokenizer **tok, char *err, size_t errlen)
{
    if (tok)
        *tok = NULL;
    if (!prune_is_dir(path))
        return mio_load_model(path, tokenizer_path, be, m, tok, err, errlen);
    json_t *man = NULL;
    if (prune_load_dir(path, be, m, &man, err, errlen))
        return -1;
    if (tok && !(*tok = dir_tokenizer(path, man, tokenizer_path, err, errlen))) {
        json_decref(man);
        eng_model_free(m);
        return -1;
    }
    json_decref(man);
    return 0;
}
