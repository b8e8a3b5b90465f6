/* tests/tools/recon_oracle.c — drives the least-squares reconstruction for the PyTorch
 * oracle (tests/oracle/test_prune_reconstruct.py): a random GQA parent is pruned to a
 * student of the chosen case and reconstructed on random calibration rows. Writes
 * OUT.bin (tests/tools/records.h: tokens, parent.*, before.* (the slice), after.*),
 * OUT.parent.json / OUT.student.json (arch JSON) and OUT.recon.json (the outcome).
 * Usage: recon_oracle OUT CASE [CKPT_DIR [KILL_AFTER]], CASE one of ffn, heads, kv,
 * mixed, or hybrid (a Nemotron-H parent "M*M-": Mamba-2 mixers of 4 heads of 4 in 2 groups,
 * state 4, conv 4; attention of 8 heads in 4 KV groups, no RoPE; a squared-ReLU MLP of 40;
 * the student keeps hidden 24, 2 Mamba heads (one per group), 4 query heads and an MLP of
 * 20), or moe (a Qwen2-MoE parent: every layer attention and an MoE of 6 experts of 12, top 2,
 * with a shared expert of 16, layer 1 norm_topk_prob; the student keeps hidden 24, 4, 6, 3
 * and 5 experts, and one query head per KV group; layer 0's experts keep 8 units and its shared
 * expert 10, layer 2's experts 6), or hybrid_moe (a Nemotron-H parent "*E*E":
 * attention as above, MoE layers of 9 and 6 squared-ReLU experts of 12, top 2, sigmoid routing
 * in 3 groups of which 2 chosen, routed scale 2.5, a shared expert of 10, the last one a
 * LatentMoE of latent 16; the student keeps hidden 24, one query head per KV group, 6 experts
 * (two per group) of 8 units and a shared expert of 7 in layer 1, and all 6, of 6 units, in a
 * latent of 12, in layer 3), or mixtral (the moe case's parent and student without the shared
 * expert, every router renormalized, no attention bias); CASE+comp (moe+comp, mixtral+comp,
 * hybrid_moe+comp): the same with recon_opts.compensate on;
 * with CKPT_DIR the run keeps and resumes its layers there; KILL_AFTER k sends
 * the process SIGKILL once k layers are done. Not part of the product.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "compress/prune.h"
#include "compress/reconstruct.h"
#include "engine/rng.h"
#include "tests/tools/records.h"

enum { V = 61, C = 32, D = 8, NL = 4, B = 6, T = 40 };

static int kill_after = -1;

static int on_progress(void *ctx, const recon_result *r, int done, int total)
{
    (void)ctx;
    (void)r;
    (void)total;
    if (kill_after >= 0 && done >= kill_after)
        raise(SIGKILL);
    return 0;
}

/* The student of each case; parent layers have 8 heads in 4 KV groups (2 per group)
 * except layer 2 (8 heads, 2 groups) and FFN widths 48, 40, 56, 44. */
static int student_of(const char *name, const arch *pa, arch *sa)
{
    if (arch_copy(sa, pa))
        return -1;
    if (!strcmp(name, "ffn")) {
        for (int l = 0; l < NL; l++)
            sa->layers[l].ffn_dim = pa->layers[l].ffn_dim / 2;
    } else if (!strcmp(name, "heads")) {   /* query heads per group 2 -> 1, groups kept */
        for (int l = 0; l < NL; l++)
            sa->layers[l].n_heads = sa->layers[l].n_kv_heads;
    } else if (!strcmp(name, "kv")) {      /* whole KV groups removed */
        sa->layers[0].n_kv_heads = 2, sa->layers[0].n_heads = 4;
        sa->layers[2].n_kv_heads = 1, sa->layers[2].n_heads = 4;
    } else if (!strcmp(name, "hybrid")) {
        sa->hidden_size = 24;
        for (int l = 0; l < NL; l++) {
            arch_layer *y = &sa->layers[l];
            if (y->mamba.n_heads)
                y->mamba.n_heads = 2;
            if (y->n_heads)
                y->n_heads = y->n_kv_heads;
            y->ffn_dim /= 2;
        }
    } else if (!strcmp(name, "hybrid_moe")) {
        sa->hidden_size = 24;
        for (int l = 0; l < NL; l++)
            sa->layers[l].n_heads = sa->layers[l].n_kv_heads;
        sa->layers[1].moe.n_experts = 6;
        sa->layers[1].moe.expert_ffn_dim = 8;   /* narrower experts, the latent one's too */
        sa->layers[1].moe.shared_ffn_dim = 7;
        sa->layers[3].moe.expert_ffn_dim = 6;
        sa->layers[3].moe.latent_dim = 12;   /* and a narrower latent */
    } else if (!strcmp(name, "moe") || !strcmp(name, "mixtral")) {
        sa->hidden_size = 24;
        static const int kept[NL] = {4, 6, 3, 5};
        for (int l = 0; l < NL; l++) {
            sa->layers[l].moe.n_experts = kept[l];
            sa->layers[l].n_heads = sa->layers[l].n_kv_heads;
        }
        sa->layers[0].moe.expert_ffn_dim = 8;   /* narrower experts, and shared expert */
        if (pa->layers[0].moe.shared_ffn_dim)
            sa->layers[0].moe.shared_ffn_dim = 10;
        sa->layers[2].moe.expert_ffn_dim = 6;
    } else if (!strcmp(name, "mixed")) {   /* hidden 24, a layer removed, parts removed */
        sa->hidden_size = 24;
        sa->n_layers = 3;
        sa->layers[0] = (arch_layer){.source_layer = 0, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 30};
        sa->layers[1] = (arch_layer){.source_layer = 2, .n_heads = 0, .n_kv_heads = 0, .ffn_dim = 20};
        sa->layers[2] = (arch_layer){.source_layer = 3, .n_heads = 6, .n_kv_heads = 3, .ffn_dim = 0};
    } else {
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: recon_oracle OUT CASE [CKPT_DIR [KILL_AFTER]]\n");
        return 2;
    }
    const char *ckpt = argc > 3 ? argv[3] : NULL;
    kill_after = argc > 4 ? (int)strtol(argv[4], NULL, 10) : -1;
    char cs[64];   /* CASE+comp: the MoE cases with compensate on */
    snprintf(cs, sizeof cs, "%s", argv[2]);
    char *plus = strstr(cs, "+comp");
    int compensate = plus && !plus[5];
    if (compensate)
        *plus = 0;
    argv[2] = cs;
    char err[512];
    arch pa, sa;
    if (oracle_arch(&pa, V, C, D, NL))
        return 1;
    int kv[NL] = {4, 4, 2, 4}, ffn[NL] = {48, 40, 56, 44};
    for (int l = 0; l < NL; l++)
        pa.layers[l] = (arch_layer){.source_layer = l, .n_heads = 8, .n_kv_heads = kv[l], .ffn_dim = ffn[l]};
    if (!strcmp(argv[2], "hybrid")) {   /* "M*M-" */
        snprintf(pa.family, sizeof pa.family, "nemotron_h");
        for (int l = 0; l < NL; l++) {
            arch_layer y = {.source_layer = l};
            if (l == 0 || l == 2)
                y.mamba = (arch_mamba){.n_heads = 4, .head_dim = 4, .d_state = 4, .n_groups = 2, .conv_kernel = 4};
            else if (l == 1)
                y.n_heads = 8, y.n_kv_heads = 4;
            else
                y.ffn_dim = 40;
            pa.layers[l] = y;
        }
    }
    if (!strcmp(argv[2], "hybrid_moe")) {   /* "*E*E" */
        snprintf(pa.family, sizeof pa.family, "nemotron_h");
        for (int l = 0; l < NL; l++) {
            arch_layer y = {.source_layer = l};
            if (l % 2 == 0)
                y.n_heads = 8, y.n_kv_heads = 4;
            else
                y.moe = (arch_moe){.n_experts = l == 1 ? 9 : 6, .top_k = 2, .expert_ffn_dim = 12, .shared_ffn_dim = 10,
                                   .norm_topk = 1, .sigmoid = 1, .n_group = 3, .topk_group = 2,
                                   .routed_scale = 2.5, .latent_dim = l == 3 ? 16 : 0};
            pa.layers[l] = y;
        }
    }
    if (!strcmp(argv[2], "moe") || !strcmp(argv[2], "mixtral")) {
        int mixtral = !strcmp(argv[2], "mixtral");
        snprintf(pa.family, sizeof pa.family, mixtral ? "mixtral" : "qwen2_moe");
        pa.attention_bias = !mixtral;
        for (int l = 0; l < NL; l++) {
            pa.layers[l].ffn_dim = 0;
            pa.layers[l].moe = (arch_moe){.n_experts = 6, .top_k = 2, .expert_ffn_dim = 12,
                                          .shared_ffn_dim = mixtral ? 0 : 16, .norm_topk = mixtral || l == 1};
        }
    }
    if (student_of(argv[2], &pa, &sa)) {
        fprintf(stderr, "recon_oracle: unknown case '%s' (ffn, heads, kv, mixed, hybrid, moe, mixtral, hybrid_moe)\n", argv[2]);
        return 2;
    }
    eng_backend *be = eng_backend_cpu_new(1);
    eng_model parent, student;
    if (!be || eng_model_init(&parent, &pa, be, err, sizeof err)) {
        fprintf(stderr, "recon_oracle: %s\n", err);
        return 1;
    }
    eng_model_randomize(&parent, 17, 0.3f);
    td_stream cal = {malloc(sizeof(int) * B * T), (size_t)B * T};
    uint64_t x = 4242;
    for (int i = 0; i < B * T; i++)
        cal.ids[i] = (int)(eng_xorshift64star(&x) % V);
    recon_opts o;
    recon_opts_default(&o);
    o.tokens = B * T;
    o.T = T;
    o.rows = 4;   /* two passes per block, the second one short */
    o.ckpt_dir = ckpt;
    o.compensate = compensate;
    o.progress = on_progress;
    recon_result r;
    char path[4096];
    snprintf(path, sizeof path, "%s.bin", argv[1]);
    FILE *f = fopen(path, "wb");
    float ftok[B * T];
    for (int i = 0; i < B * T; i++)
        ftok[i] = (float)cal.ids[i];
    int64_t shp[2] = {B, T};
    if (!f || prune_to_arch(&parent, &sa, &student, err, sizeof err) || put(f, "tokens", ftok, 2, shp) ||
        put_model(f, &parent, "parent.", 0) || put_model(f, &student, "before.", 0)) {
        fprintf(stderr, "recon_oracle: %s\n", err);
        return 1;
    }
    if (recon_run(&parent, &student, &cal, &o, &r, err, sizeof err) != 0) {
        fprintf(stderr, "recon_oracle: reconstruct: %s\n", err);
        return 1;
    }
    json_t *rj = recon_result_json(&r, &o);
    if (put_model(f, &student, "after.", 0) || fclose(f) || !rj) {
        fprintf(stderr, "recon_oracle: cannot write %s\n", path);
        return 1;
    }
    snprintf(path, sizeof path, "%s.recon.json", argv[1]);
    if (json_dump_file(rj, path, JSON_SORT_KEYS | JSON_INDENT(1)))
        return 1;
    if (write_archs(argv[1], &pa, &sa))
        return 1;
    json_decref(rj);
    recon_result_free(&r);
    td_stream_free(&cal);
    eng_model_free(&student);
    eng_model_free(&parent);
    arch_free(&pa);
    arch_free(&sa);
    eng_backend_free(be);
    return 0;
}
