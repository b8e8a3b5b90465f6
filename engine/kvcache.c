/* engine/kvcache.c — the cache of a sequence's past: per attention layer one key and one
 * value buffer of [B, max_T, Hkv*D] floats on the model's backend (2 * B * max_T *
 * sum_{attn layers} Hkv_l*D floats in all), per Mamba layer its conv history [B, K-1, cd]
 * and SSM state [B, H, P, S] (independent of length), with a host fill count per row.
 * eng_forward appends to it and checks its capacity; a reset zeroes the Mamba states.
 */
#include "engine/model.h"

#include <stdlib.h>
#include <string.h>

#include "engine/model_internal.h"

/* Floats of layer l's conv history and SSM state for B rows (0 without a Mamba mixer). */
static size_t conv_floats(const arch_layer *l, int B)
{
    const arch_mamba *mb = &l->mamba;
    return mb->n_heads ? (size_t)B * (size_t)(mb->conv_kernel - 1) * (size_t)arch_mamba_conv_dim(mb) : 0;
}

static size_t ssm_floats(const arch_layer *l, int B)
{
    const arch_mamba *mb = &l->mamba;
    return (size_t)B * (size_t)mb->n_heads * (size_t)mb->head_dim * (size_t)mb->d_state;
}

size_t eng_kv_bytes_for(const arch *a, int B, int max_T)
{
    size_t n = 0;
    for (int l = 0; l < a->n_layers; l++) {
        if (a->layers[l].n_heads)
            n += 2 * (size_t)B * (size_t)max_T * (size_t)a->layers[l].n_kv_heads * (size_t)a->head_dim;
        n += conv_floats(&a->layers[l], B) + ssm_floats(&a->layers[l], B);
    }
    return n * F4;
}

/* Allocate and zero layer l's Mamba states. 0, or -1 out of memory. */
static int states_new(eng_kv_cache *kv, int l)
{
    eng_backend *be = kv->m->be;
    const arch_layer *ly = &kv->m->a.layers[l];
    size_t cb = conv_floats(ly, kv->B) * F4, sb = ssm_floats(ly, kv->B) * F4;
    if (cb && !(kv->conv[l] = be->alloc(be, cb)))
        return -1;
    if (!(kv->ssm[l] = be->alloc(be, sb)))
        return -1;
    kv->bytes += cb + sb;
    if (cb)
        be->zero(be, kv->conv[l], cb);
    be->zero(be, kv->ssm[l], sb);
    return 0;
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
    kv->conv = calloc((size_t)(L ? L : 1), sizeof *kv->conv);
    kv->ssm = calloc((size_t)(L ? L : 1), sizeof *kv->ssm);
    if (!kv->len || !kv->k || !kv->v || !kv->conv || !kv->ssm) {
        eng_kv_free(kv);
        return NULL;
    }
    for (int l = 0; l < L; l++) {
        if (m->a.layers[l].mamba.n_heads && states_new(kv, l) != 0) {
            eng_kv_free(kv);
            return NULL;
        }
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
    eng_backend *be = kv->m->be;
    memset(kv->len, 0, sizeof *kv->len * (size_t)kv->B);
    for (int l = 0; l < kv->m->a.n_layers; l++) {
        const arch_layer *ly = &kv->m->a.layers[l];
        if (kv->conv[l])
            be->zero(be, kv->conv[l], conv_floats(ly, kv->B) * F4);
        if (kv->ssm[l])
            be->zero(be, kv->ssm[l], ssm_floats(ly, kv->B) * F4);
    }
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
    for (int l = 0; kv->conv && kv->ssm && l < m->a.n_layers; l++) {
        const arch_layer *ly = &m->a.layers[l];
        m->be->free(m->be, kv->conv[l], kv->conv[l] ? conv_floats(ly, kv->B) * F4 : 0);
        m->be->free(m->be, kv->ssm[l], kv->ssm[l] ? ssm_floats(ly, kv->B) * F4 : 0);
    }
    free(kv->conv);
    free(kv->ssm);
    free(kv->k);
    free(kv->v);
    free(kv->len);
    free(kv);
}
