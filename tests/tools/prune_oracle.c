/* tests/tools/prune_oracle.c — drives ranking, pruning and one distillation step for the
 * PyTorch oracle (tests/oracle/test_prune_grad.py): a random heterogeneous GQA parent is
 * ranked on random calibration tokens, permuted, pruned to a smaller heterogeneous arch
 * (narrower hidden, fewer KV groups, fewer heads per group, narrower and removed MLP,
 * removed attention, a removed layer), then the student's CE+KD loss against the parent
 * and its weight gradients are computed. Writes OUT.bin (records: int32 name length,
 * name, int32 ndim, int64 shape[ndim], float32 data) and OUT.parent.json /
 * OUT.student.json (arch JSON). Usage: prune_oracle OUT [seed [student_hidden [kd [hw]]]]:
 * kd 1 mixes the KD loss (teacher = the ranked parent), 0 uses CE only; hw > 0 adds the
 * intermediate-state loss at that weight (eng_loss_spec.hidden_weight). Not part of
 * the product.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "compress/prune.h"
#include "compress/rank.h"
#include "storage/archjson.h"
#include "engine/rng.h"
#include "tests/tools/records.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: prune_oracle OUT [seed [student_hidden [kd [hw]]]]\n");
        return 2;
    }
    unsigned long long seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    long hidden = argc > 3 ? strtol(argv[3], NULL, 10) : 20;
    int kd = argc > 4 ? (int)strtol(argv[4], NULL, 10) : 1;
    float hw = argc > 5 ? strtof(argv[5], NULL) : 0.0f;
    enum { V = 53, C = 32, D = 8, NL = 4, B = 2, T = 9 };
    char err[512];
    arch pa, sa;
    if (oracle_arch(&pa, V, C, D, NL))
        return 1;
    pa.tie_word_embeddings = 0;
    pa.attention_bias = 1;
    int heads[NL] = {6, 4, 6, 4}, kv[NL] = {2, 2, 3, 1}, ffn[NL] = {40, 24, 30, 36};
    for (int l = 0; l < NL; l++)
        pa.layers[l] = (arch_layer){.source_layer = l, .n_heads = heads[l], .n_kv_heads = kv[l], .ffn_dim = ffn[l]};
    if (arch_copy(&sa, &pa))
        return 1;
    sa.hidden_size = (int)hidden;
    sa.n_layers = 3;
    sa.layers[0] = (arch_layer){.source_layer = 0, .n_heads = 2, .n_kv_heads = 1, .ffn_dim = 17}; /* 1 of 2 groups, 2 of 3 heads */
    sa.layers[1] = (arch_layer){.source_layer = 2, .n_heads = 0, .n_kv_heads = 0, .ffn_dim = 9};  /* attention removed */
    sa.layers[2] = (arch_layer){.source_layer = 3, .n_heads = 4, .n_kv_heads = 1, .ffn_dim = 0};  /* MLP removed */
    /* parent layer 1 removed */

    eng_backend *be = eng_backend_cpu_new(1);
    eng_model parent, student;
    if (!be || eng_model_init(&parent, &pa, be, err, sizeof err)) {
        fprintf(stderr, "prune_oracle: %s\n", err);
        return 1;
    }
    eng_model_randomize(&parent, seed, 0.3f);
    int n_cal = 400;
    td_stream cal = {malloc(sizeof(int) * (size_t)n_cal), (size_t)n_cal};
    uint64_t x = seed * 7919 + 1;
    for (int i = 0; i < n_cal; i++)
        cal.ids[i] = (int)(eng_xorshift64star(&x) % V);
    rank_opts ro = {.tokens = 4 * B * T, .layer_tokens = B * T, .B = B, .T = T};
    rank_result r;
    if (rank_compute(&parent, &cal, &ro, &r, err, sizeof err) || rank_apply(&parent, &r, err, sizeof err) ||
        prune_to_arch(&parent, &sa, &student, err, sizeof err) || eng_model_enable_grads(&student)) {
        fprintf(stderr, "prune_oracle: %s\n", err);
        return 1;
    }
    int tok[B * T], tgt[B * T];
    float ftok[B * T], ftgt[B * T];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int)(eng_xorshift64star(&x) % V);
        tgt[i] = (int)(eng_xorshift64star(&x) % V);
        ftok[i] = (float)tok[i];
        ftgt[i] = (float)tgt[i];
    }
    eng_loss_spec ls = {.kind = kd ? ENG_LOSS_CE | ENG_LOSS_KD : ENG_LOSS_CE, .targets = tgt,
                        .teacher = kd ? &parent : NULL, .temperature = 2.0f, .kd_weight = kd ? 0.6f : 0.0f,
                        .hidden_weight = hw};
    eng_loss_result lr;
    eng_model_zero_grads(&student);
    if (eng_forward_backward(&student, tok, B, T, &ls, ENG_GRAD_WEIGHTS, &lr, err, sizeof err)) {
        fprintf(stderr, "prune_oracle: forward_backward: %s\n", err);
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s.bin", argv[1]);
    FILE *f = fopen(path, "wb");
    float meta[7] = {(float)lr.loss, (float)lr.ce, (float)lr.kd, ls.temperature, ls.kd_weight, hw, (float)lr.hidden};
    int64_t n = B * T, shp[2] = {B, T}, n_meta = 7;
    if (!f || put(f, "tokens", ftok, 2, shp) || put(f, "targets", ftgt, 1, &n) || put(f, "loss", meta, 1, &n_meta) ||
        put_model(f, &parent, "parent.", 0) || put_model(f, &student, "student.", 0) ||
        put_model(f, &student, "grad.", 1) || fclose(f)) {
        fprintf(stderr, "prune_oracle: cannot write %s\n", path);
        return 1;
    }
    if (write_archs(argv[1], &pa, &sa))
        return 1;
    printf("loss %.6f (ce %.6f, kd %.6f, hidden %.6f)\n", lr.loss, lr.ce, lr.kd, lr.hidden);
    rank_free(&r);
    td_stream_free(&cal);
    eng_model_free(&student);
    eng_model_free(&parent);
    arch_free(&pa);
    arch_free(&sa);
    eng_backend_free(be);
    return 0;
}
