/* engine/tok_table.c — the tokenizer's piece table (piece -> id) and merge table
 * ((left id, right id) -> rank, result), open addressing under hashes keyed per
 * tokenizer (tok_internal.h). No file I/O here.
 */
#include "engine/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* The tables' hashes are keyed by random numbers drawn per tokenizer, so that a vocabulary
 * or merge list written to collide (all its pieces in one probe run) cannot make loading
 * quadratic: SipHash-1-3 for pieces, a keyed 64-bit mix for merge pairs. */
static uint64_t rotl64(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

#define SIP_ROUND(v0, v1, v2, v3)                                                      \
    do {                                                                               \
        v0 += v1; v1 = rotl64(v1, 13); v1 ^= v0; v0 = rotl64(v0, 32);                  \
        v2 += v3; v3 = rotl64(v3, 16); v3 ^= v2;                                       \
        v0 += v3; v3 = rotl64(v3, 21); v3 ^= v0;                                       \
        v2 += v1; v1 = rotl64(v1, 17); v1 ^= v2; v2 = rotl64(v2, 32);                  \
    } while (0)

static uint32_t hash_bytes(const tok_tokenizer *t, const char *s, size_t n)
{
    uint64_t v0 = t->hkey[0] ^ 0x736f6d6570736575ULL, v1 = t->hkey[1] ^ 0x646f72616e646f6dULL;
    uint64_t v2 = t->hkey[0] ^ 0x6c7967656e657261ULL, v3 = t->hkey[1] ^ 0x7465646279746573ULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t m = 0;
        for (int b = 0; b < 8; b++)
            m |= (uint64_t)p[i + b] << (8 * b);
        v3 ^= m;
        SIP_ROUND(v0, v1, v2, v3);
        v0 ^= m;
    }
    uint64_t m = (uint64_t)n << 56;
    for (int b = 0; i + (size_t)b < n; b++)
        m |= (uint64_t)p[i + b] << (8 * b);
    v3 ^= m;
    SIP_ROUND(v0, v1, v2, v3);
    v0 ^= m;
    v2 ^= 0xff;
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    uint64_t h = v0 ^ v1 ^ v2 ^ v3;
    return (uint32_t)(h ^ (h >> 32));
}

static uint32_t hash_u64(const tok_tokenizer *t, uint64_t k)
{
    k ^= t->mseed;
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL; k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL; k ^= k >> 33;
    return (uint32_t)k;
}

/* The piece table is open addressing with linear probing: one entry for each distinct
 * piece some id holds, at most n_vocab in hcap >= 2 n_vocab slots, so every probe run
 * ends at an empty slot (the loops are bounded by hcap all the same). The entry holds the
 * id that took the piece last, as llama.cpp's lookup does; the other ids holding the same
 * piece hang from it in dup_next order (the later set first), so a vocabulary of many
 * copies of one piece costs one entry, and setting an id again unlinks it in O(1): its
 * entry passes to the next id of its chain, or is removed when it was alone. */
static uint32_t htab_slot(const tok_tokenizer *t, const char *s, size_t n)
{
    uint32_t mask = t->hcap - 1, i = hash_bytes(t, s, n) & mask;
    for (uint32_t probes = 0; probes < t->hcap; probes++, i = (i + 1) & mask) {
        int32_t id = t->htab[i];
        if (id < 0 || (t->plen[id] == n && !memcmp(t->piece[id], s, n)))
            return i;
    }
    return UINT32_MAX;   /* impossible: the table is never full */
}

int tok_lookup(const tok_tokenizer *t, const char *s, size_t n)
{
    uint32_t i = htab_slot(t, s, n);
    return i == UINT32_MAX ? -1 : t->htab[i];
}

int tok_htab_insert(tok_tokenizer *t, int id)
{
    uint32_t i = htab_slot(t, t->piece[id], t->plen[id]);
    if (i == UINT32_MAX)
        return -1;
    int32_t head = t->htab[i];
    t->dup_prev[id] = -1;
    t->dup_next[id] = head;
    if (head >= 0)
        t->dup_prev[head] = id;
    t->htab[i] = id;
    return 0;
}

/* An id inside a chain is unlinked; the head of a chain passes its entry to the next id.
 * The last id of a piece leaves a hole that later entries of the probe run move back
 * into when their home slot allows (backward-shift deletion), so no lookup stops early
 * at it. */
void tok_htab_remove(tok_tokenizer *t, int id)
{
    int32_t prev = t->dup_prev[id], next = t->dup_next[id];
    t->dup_prev[id] = t->dup_next[id] = -1;
    if (next >= 0)
        t->dup_prev[next] = prev;
    if (prev >= 0) {
        t->dup_next[prev] = next;
        return;
    }
    uint32_t mask = t->hcap - 1, i = htab_slot(t, t->piece[id], t->plen[id]);
    if (i == UINT32_MAX || t->htab[i] != id)
        return;   /* impossible: the head of a chain holds its piece's entry */
    if (next >= 0) {
        t->htab[i] = next;
        return;
    }
    for (uint32_t j = i, k = 0; k < t->hcap; k++) {
        j = (j + 1) & mask;
        int32_t o = t->htab[j];
        if (o < 0)
            break;
        uint32_t home = hash_bytes(t, t->piece[o], t->plen[o]) & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {   /* home at or before the hole */
            t->htab[i] = o;
            i = j;
        }
    }
    t->htab[i] = -1;
}

int tok_merge_find(const tok_tokenizer *t, int a, int b, int *res)
{
    if (!t->mcount)
        return -1;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t mask = t->mcap - 1, i = hash_u64(t, k) & mask;
    for (;;) {
        if (t->mrank[i] < 0)
            return -1;
        if (t->mkey[i] == k) {
            *res = t->mres[i];
            return t->mrank[i];
        }
        i = (i + 1) & mask;
    }
}

static int merge_grow(tok_tokenizer *t)
{
    uint32_t ncap = t->mcap ? t->mcap * 2 : 1024;
    uint64_t *k = malloc(ncap * sizeof *k);
    int32_t *r = malloc(ncap * sizeof *r), *s = malloc(ncap * sizeof *s);
    if (!k || !r || !s) {
        free(k); free(r); free(s);
        return -1;
    }
    for (uint32_t i = 0; i < ncap; i++)
        r[i] = -1;
    for (uint32_t i = 0; i < t->mcap; i++) {
        if (t->mrank[i] < 0)
            continue;
        uint32_t j = hash_u64(t, t->mkey[i]) & (ncap - 1);
        while (r[j] >= 0)
            j = (j + 1) & (ncap - 1);
        k[j] = t->mkey[i]; r[j] = t->mrank[i]; s[j] = t->mres[i];
    }
    free(t->mkey); free(t->mrank); free(t->mres);
    t->mkey = k; t->mrank = r; t->mres = s; t->mcap = ncap;
    return 0;
}

int tok_tables_init(tok_tokenizer *t)
{
    size_t n = (size_t)t->n_vocab;
    t->dup_next = malloc(n * sizeof *t->dup_next);
    t->dup_prev = malloc(n * sizeof *t->dup_prev);
    t->hcap = 16;
    while (t->hcap < (uint32_t)n * 2)
        t->hcap *= 2;
    t->htab = malloc(t->hcap * sizeof *t->htab);
    uint64_t key[3];
    if (!t->dup_next || !t->dup_prev || !t->htab || getrandom(key, sizeof key, 0) != (ssize_t)sizeof key)
        return -1;
    t->hkey[0] = key[0];
    t->hkey[1] = key[1];
    t->mseed = key[2];
    memset(t->htab, 0xFF, t->hcap * sizeof *t->htab);
    memset(t->dup_next, 0xFF, n * sizeof *t->dup_next);
    memset(t->dup_prev, 0xFF, n * sizeof *t->dup_prev);
    return 0;
}

void tok_tables_free(tok_tokenizer *t)
{
    free(t->dup_next); free(t->dup_prev); free(t->htab);
    free(t->mkey); free(t->mrank); free(t->mres);
}

int tok_merge_insert(tok_tokenizer *t, int a, int b, int rank, int res)
{
    if ((t->mcount + 1) * 2 > t->mcap && merge_grow(t))
        return -1;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t mask = t->mcap - 1, i = hash_u64(t, k) & mask;
    while (t->mrank[i] >= 0) {
        if (t->mkey[i] == k)
            return 0;          /* duplicate rule: the first (lower rank) stays */
        i = (i + 1) & mask;
    }
    t->mkey[i] = k; t->mrank[i] = rank; t->mres[i] = res;
    t->mcount++;
    return 0;
}
