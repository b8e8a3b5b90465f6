/* tests/tools/engine_oracle.c — drives the engine for the PyTorch oracle
 * (tests/oracle/test_engine_oracle.py): reads a tiny config, builds a random model (and a
 * random teacher of another shape), random masks, tokens and targets; runs forward
 * (logits) and forward+backward (CE+KD mix); writes every input and output to a record file.
 * Usage: engine_oracle CONFIG OUT.bin. Records: int32 name length, name, int32 ndim,
 * int64 shape[ndim], float32 data. Not part of the product.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"
#include "tests/tools/records.h"

static int put1(FILE *f, const char *name, const float *data, int64_t n)
{
    return put(f, name, data, 1, &n);
}

typedef struct {
    arch a, ta;
    int B, T, masks;
    unsigned long long seed;
    float temperature, kd_weight;
} cfg;

static int read_arch(FILE *f, arch *a, char *line, size_t len)
{
    int V, C, D, tied, bias, L, rs = 0;
    double theta, eps, fac = 0, lo = 0, hi = 0;
    int orig = 0;
    char family[ARCH_FAMILY_MAX] = "llama";
    if (!fgets(line, (int)len, f) ||
        sscanf(line, "%d %d %d %lf %lf %d %d %d %lf %lf %lf %d %d %31s", &V, &C, &D, &theta, &eps, &tied, &bias, &rs,
               &fac, &lo, &hi, &orig, &L, family) < 13)
        return -1;
    if (arch_init(a, L) != 0)
        return -1;
    snprintf(a->family, sizeof a->family, "%s", family);
    a->vocab_size = V;
    a->hidden_size = C;
    a->head_dim = D;
    a->rope_theta = theta;
    a->norm_eps = eps;
    a->tie_word_embeddings = tied;
    a->attention_bias = bias;
    a->max_position_embeddings = 4096;
    a->rope_scaling.type = (arch_rope_scaling_type)rs;
    a->rope_scaling.factor = fac;
    a->rope_scaling.low_freq_factor = lo;
    a->rope_scaling.high_freq_factor = hi;
    a->rope_scaling.original_max_position_embeddings = orig;
    for (int l = 0; l < L; l++) {
        arch_layer *y = &a->layers[l];
        if (!fgets(line, (int)len, f) ||
            sscanf(line, "%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %lf %d", &y->n_heads, &y->n_kv_heads, &y->ffn_dim,
                   &y->moe.n_experts, &y->moe.top_k, &y->moe.expert_ffn_dim, &y->moe.shared_ffn_dim, &y->moe.norm_topk,
                   &y->mamba.n_heads, &y->mamba.head_dim, &y->mamba.d_state, &y->mamba.n_groups,
                   &y->mamba.conv_kernel, &y->moe.sigmoid, &y->moe.n_group, &y->moe.topk_group,
                   &y->moe.routed_scale, &y->moe.latent_dim) < 3)
            return -1;
        a->layers[l].source_layer = l;
    }
    return 0;
}

/* Config: line 1 "B T masks seed temperature kd_weight", then the student arch, then the
 * teacher arch; an arch is "V C D theta eps tied bias rope_type factor low high orig L [family]"
 * followed by L lines "n_heads n_kv_heads ffn_dim [n_experts top_k expert_ffn_dim shared_ffn_dim
 * norm_topk [mamba_heads head_dim d_state n_groups conv_kernel [sigmoid n_group topk_group
 * routed_scale [latent_dim]]]]". */
static int read_cfg(const char *path, cfg *c)
{
    FILE *f = fopen(path, "r");
    char line[512];
    if (!f)
        return -1;
    int rc = -1;
    if (fgets(line, sizeof line, f) &&
        sscanf(line, "%d %d %d %llu %f %f", &c->B, &c->T, &c->masks, &c->seed, &c->temperature, &c->kd_weight) == 6 &&
        read_arch(f, &c->a, line, sizeof line) == 0 && read_arch(f, &c->ta, line, sizeof line) == 0)
        rc = 0;
    fclose(f);
    return rc;
}

static uint64_t rng_state;
static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: engine_oracle CONFIG OUT.bin\n");
        return 2;
    }
    cfg c;
    memset(&c, 0, sizeof c);
    if (read_cfg(argv[1], &c) != 0) {
        fprintf(stderr, "engine_oracle: cannot read config %s\n", argv[1]);
        return 2;
    }
    char err[256];
    eng_backend *be = eng_backend_cpu_new(1);
    eng_model m, t;
    if (!be || eng_model_init(&m, &c.a, be, err, sizeof err) != 0 || eng_model_init(&t, &c.ta, be, err, sizeof err) != 0) {
        fprintf(stderr, "engine_oracle: %s\n", err);
        return 1;
    }
    eng_model_randomize(&m, c.seed, 0.3f);
    eng_model_randomize(&t, c.seed + 1000, 0.3f);
    rng_state = c.seed * 2654435761ull + 7;
    int B = c.B, T = c.T, N = B * T, V = c.a.vocab_size, C = c.a.hidden_size;
    int *tokens = malloc(sizeof(int) * (size_t)N), *targets = malloc(sizeof(int) * (size_t)N);
    float *ftok = malloc(sizeof(float) * (size_t)N), *ftgt = malloc(sizeof(float) * (size_t)N);
    float *logits = malloc(sizeof(float) * (size_t)N * V);
    if (!tokens || !targets || !ftok || !ftgt || !logits)
        return 1;
    for (int i = 0; i < N; i++) {
        tokens[i] = (int)(urand() * V) % V;
        targets[i] = urand() < 0.2 ? -1 : (int)(urand() * V) % V;
        ftok[i] = (float)tokens[i];
        ftgt[i] = (float)targets[i];
    }
    targets[0] = 1 % V;
    ftgt[0] = (float)targets[0];
    if (eng_model_enable_grads(&m) != 0)
        return 1;
    if (c.masks) {
        if (eng_model_enable_masks(&m) != 0)
            return 1;
        for (size_t i = 0; i < m.masks->count; i++)
            m.masks->block[i] = (float)(0.5 + urand());
        float hc = 0;
        for (int i = 0; i < C; i++)
            hc += m.masks->hidden[i];
        m.masks->hidden_count = hc;
    }
    eng_fwd_args fa = {.tokens = tokens, .B = B, .T = T, .logits_mode = ENG_LOGITS_ALL, .logits = logits};
    if (eng_forward(&m, &fa, err, sizeof err) != 0) {
        fprintf(stderr, "engine_oracle: forward: %s\n", err);
        return 1;
    }
    eng_loss_spec ls = {.kind = ENG_LOSS_CE | ENG_LOSS_KD, .targets = targets, .teacher = &t,
                        .temperature = c.temperature, .kd_weight = c.kd_weight};
    eng_loss_result lr;
    int flags = ENG_GRAD_WEIGHTS | (c.masks ? ENG_GRAD_MASKS : 0);
    if (eng_forward_backward(&m, tokens, B, T, &ls, flags, &lr, err, sizeof err) != 0) {
        fprintf(stderr, "engine_oracle: forward_backward: %s\n", err);
        return 1;
    }
    FILE *f = fopen(argv[2], "wb");
    if (!f)
        return 1;
    int64_t lshape[3] = {B, T, V};
    float losses[3] = {(float)lr.loss, (float)lr.ce, (float)lr.kd};
    int bad = put_model(f, &m, "w.", 0) || put_model(f, &t, "t.", 0) || put_model(f, &m, "g.", 1) ||
              put1(f, "tokens", ftok, N) || put1(f, "targets", ftgt, N) || put(f, "logits", logits, 3, lshape) ||
              put1(f, "losses", losses, 3);
    if (c.masks) {
        float hc[2] = {m.masks->hidden_count, m.masks->g_hidden_count};
        bad = bad || put1(f, "mask.block", m.masks->block, (int64_t)m.masks->count) ||
              put1(f, "mask.grad", m.masks->grad_block, (int64_t)m.masks->count) || put1(f, "mask.hidden_count", hc, 2);
    }
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "engine_oracle: write failed\n");
        return 1;
    }
    eng_model_free(&m);
    eng_model_free(&t);
    if (be->cur_bytes != 0) {
        fprintf(stderr, "engine_oracle: %zu bytes still accounted after free\n", be->cur_bytes);
        return 1;
    }
    eng_backend_free(be);
    arch_free(&c.a);
    arch_free(&c.ta);
    free(tokens);
    free(targets);
    free(ftok);
    free(ftgt);
    free(logits);
    return 0;
}
