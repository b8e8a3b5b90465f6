/* engine/kvcache.c — the KV cache of attention layers: per layer one key and one value
 * buffer of [B, max_T, Hkv*D] floats on the model's backend (2 * B * max_T *
 * sum_{attn layers} Hkv_l*D floats in all), with a host fill count per row. It holds
 * positions only; eng_forward appends to it and checks its capacity.
 */
#include "engine/model.h"

#include <stdlib.h>
#include <string.h>

#include "engine/model_internal.h"

size_t eng_kv_bytes_for(const arch *a, int B, int max_T)
{
    size_t n = 0;
    for (int l = 0; l < a->n_layers; l++)
        if (a->layers[l].n_heads)
            n += 2 * (size_t)B * (size_t)max_T * (size_t)a->layers[l].n_kv_heads * (size_t)a->head_dim;
    return n * F4;
}

eng_kv_cache *eng_kv_new(eng_model *m, int B, int max_T)
{
    if (B <= 0 || max_T <= 0)
        return NULL;
    eng_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv)
        return NULL;
    int L = m->a.n_layers;
    kv->m = m;
    kv->B = B;
    kv->max_T = max_T;
    kv->len = calloc((size_t)B, sizeof *kv->len);
    kv->k = calloc((size_t)(L ? L : 1), sizeof *kv->k);
    kv->v = calloc((size_t)(L ? L : 1), sizeof *kv->v);
    if (!kv->len || !kv->k || !kv->v) {
        eng_kv_free(kv);
        return NULL;
    }
    for (int l = 0; l < L; l++) {
        if (!m->a.layers[l].n_heads)
            continue;
        size_t b = F4 * (size_t)B * (size_t)max_T * (size_t)m->a.layers[l].n_kv_heads * (size_t)m->a.head_dim;
        kv->k[l] = m->be->alloc(m->be, b);
        if (kv->k[l])
            kv->bytes += b;
        kv->v[l] = m->be->alloc(m->be, b);
        if (kv->v[l])
            kv->bytes += b;
        if (!kv->k[l] || !kv->v[l]) {
            eng_kv_free(kv);
            return NULL;
        }
    }
    return kv;
}

void eng_kv_reset(eng_kv_cache *kv)
{
    memset(kv->len, 0, sizeof *kv->len * (size_t)kv->B);
}

int eng_kv_len(const eng_kv_cache *kv, int b)
{
    return b >= 0 && b < kv->B ? kv->len[b] : -1;
}

size_t eng_kv_bytes(const eng_kv_cache *kv)
{
    return kv->bytes;
}

void eng_kv_free(eng_kv_cache *kv)
{
    if (!kv)
        return;
    eng_model *m = kv->m;
    for (int l = 0; kv->k && l < m->a.n_layers; l++) {
        size_t b = F4 * (size_t)kv->B * (size_t)kv->max_T * (size_t)m->a.layers[l].n_kv_heads * (size_t)m->a.head_dim;
        m->be->free(m->be, kv->k[l], kv->k[l] ? b : 0);
        if (kv->v)
            m->be->free(m->be, kv->v[l], kv->v[l] ? b : 0);
    }
    free(kv->k);
    free(kv->v);
    free(kv->len);
    free(kv);
}
