/* engine/tokenizer.c — byte-level BPE and SentencePiece-style BPE, encode and decode.
 * Merging uses a binary heap of candidate pairs ordered by (priority, position), so a
 * long text is O(n log n); priority is the merge rank (tok_add_merge) or, without merge
 * rules, the negated score of the merged piece (SentencePiece). No file I/O here.
 */
#include "engine/tokenizer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tok_internal.h"

const char *const TOK_REGEX_GPT2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char *const TOK_REGEX_LLAMA3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char *const TOK_REGEX_QWEN2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";


/* ---------- byte-level mapping (GPT-2 bytes_to_unicode) ---------- */

static pthread_once_t bl_once = PTHREAD_ONCE_INIT;
static uint32_t bl_cp[256];          /* byte -> code point */
static char bl_utf8[256][3];         /* byte -> UTF-8 of its code point */
static uint8_t bl_utf8_len[256];
static int16_t bl_rev[512];          /* code point (< 512) -> byte, -1 if none */

static int utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F)); return 4;
}

static void bl_build(void)
{
    int n = 0;
    for (int i = 0; i < 512; i++)
        bl_rev[i] = -1;
    for (int b = 0; b < 256; b++) {
        int direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        bl_cp[b] = direct ? (uint32_t)b : (uint32_t)(256 + n++);
        char tmp[4];
        bl_utf8_len[b] = (uint8_t)utf8_put(bl_cp[b], tmp);
        memcpy(bl_utf8[b], tmp, bl_utf8_len[b]);
        bl_rev[bl_cp[b]] = (int16_t)b;
    }
}

/* Length of the UTF-8 sequence at s (n bytes left); 0 if invalid. */
static int utf8_len_at(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    int len;
    uint32_t cp;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/* Decode one valid UTF-8 code point at s; sets *len. */
static uint32_t utf8_cp(const unsigned char *s, size_t n, int *len)
{
    int l = utf8_len_at(s, n);
    if (l <= 1) { *len = 1; return s[0]; }
    uint32_t cp = s[0] & (0xFF >> (l + 1));
    for (int i = 1; i < l; i++)
        cp = (cp << 6) | (s[i] & 0x3F);
    *len = l;
    return cp;
}

/* ---------- building ---------- */

tok_tokenizer *tok_new(tok_kind kind, int n_vocab)
{
    if (n_vocab <= 0 || n_vocab > (1 << 24) || (kind != TOK_BYTELEVEL && kind != TOK_SPM))
        return NULL;
    (void)pthread_once(&bl_once, bl_build);
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->kind = kind;
    t->n_vocab = n_vocab;
    t->cfg = (tok_config){.bos_id = -1, .eos_id = -1, .unk_id = -1, .pad_id = -1};
    t->piece = calloc((size_t)n_vocab, sizeof *t->piece);
    t->plen = calloc((size_t)n_vocab, sizeof *t->plen);
    t->score = calloc((size_t)n_vocab, sizeof *t->score);
    t->type = calloc((size_t)n_vocab, sizeof *t->type);
    if (!t->piece || !t->plen || !t->score || !t->type || tok_tables_init(t)) {
        tok_free(t);
        return NULL;
    }
    for (int i = 0; i < n_vocab; i++)
        t->type[i] = TOK_TYPE_NORMAL;
    return t;
}

void tok_free(tok_tokenizer *t)
{
    if (!t)
        return;
    if (t->piece)
        for (int i = 0; i < t->n_vocab; i++)
            free(t->piece[i]);
    free(t->piece); free(t->plen); free(t->score); free(t->type); free(t->special);
    tok_tables_free(t);
    for (int i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i]);
    free(t);
}

tok_config *tok_config_of(tok_tokenizer *t) { return &t->cfg; }
const tok_config *tok_cfg(const tok_tokenizer *t) { return &t->cfg; }
int tok_n_vocab(const tok_tokenizer *t) { return t->n_vocab; }
tok_kind tok_kind_of(const tok_tokenizer *t) { return t->kind; }

int tok_set_token(tok_tokenizer *t, int id, const char *piece, size_t len, float score, tok_type type)
{
    if (id < 0 || id >= t->n_vocab)
        return TOK_SET_BAD_ID;
    if (len > TOK_MAX_PIECE_BYTES)
        return TOK_SET_TOO_LONG;
    char *p = malloc(len + 1);
    if (!p)
        return TOK_SET_OOM;
    memcpy(p, piece, len);
    p[len] = '\0';
    if (t->plen[id] > 0)
        tok_htab_remove(t, id);   /* set again: the old piece no longer names this id */
    free(t->piece[id]);
    t->piece[id] = p;
    t->plen[id] = (uint32_t)len;
    t->score[id] = score;
    t->type[id] = (uint8_t)type;
    if (len > 0 && tok_htab_insert(t, id)) {
        t->plen[id] = 0;      /* not findable: keep the table consistent */
        return TOK_SET_OOM;
    }
    return 0;
}

int tok_add_merge(tok_tokenizer *t, const char *left, size_t llen, const char *right, size_t rlen)
{
    int a = tok_lookup(t, left, llen), b = tok_lookup(t, right, rlen);
    int rank = t->next_rank++;
    if (a < 0 || b < 0)
        return 1;
    char *cat = malloc(llen + rlen);
    if (!cat)
        return -1;
    memcpy(cat, left, llen);
    memcpy(cat + llen, right, rlen);
    int r = tok_lookup(t, cat, llen + rlen);
    free(cat);
    if (r < 0)
        return 1;
    return tok_merge_insert(t, a, b, rank, r);
}

int tok_add_pretok_regex(tok_tokenizer *t, const char *pattern, char *err, size_t errlen)
{
    if (t->n_re >= TOK_MAX_REGEX) {
        snprintf(err, errlen, "pre-tokenizer: more than %d regex splits", TOK_MAX_REGEX);
        return -1;
    }
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        snprintf(err, errlen, "pre-tokenizer regex at offset %zu: %s", (size_t)eo, (char *)msg);
        return -1;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);   /* optional speed-up; the interpreter is the fallback */
    t->re[t->n_re++] = re;
    return 0;
}

int tok_set_pretok_preset(tok_tokenizer *t, const char *name, char *err, size_t errlen)
{
    if (!strcmp(name, "gpt2"))
        return tok_add_pretok_regex(t, TOK_REGEX_GPT2, err, errlen);
    if (!strcmp(name, "llama3"))
        return tok_add_pretok_regex(t, TOK_REGEX_LLAMA3, err, errlen);
    if (!strcmp(name, "qwen2"))
        return tok_add_pretok_regex(t, TOK_REGEX_QWEN2, err, errlen);
    if (!strcmp(name, "smollm"))
        return tok_add_pretok_regex(t, "\\p{N}", err, errlen) || tok_add_pretok_regex(t, TOK_REGEX_GPT2, err, errlen)
                   ? -1 : 0;
    snprintf(err, errlen, "unknown pre-tokenizer \"%s\" (known: gpt2, llama3, qwen2, smollm)", name);
    return -1;
}

static int cmp_special_len_desc(const void *a, const void *b, void *ctx)
{
    const tok_tokenizer *t = ctx;
    uint32_t la = t->plen[*(const int *)a], lb = t->plen[*(const int *)b];
    return la < lb ? 1 : la > lb ? -1 : (*(const int *)a - *(const int *)b);
}

int tok_finalize(tok_tokenizer *t, char *err, size_t errlen)
{
    tok_config *c = &t->cfg;
    int ids[] = {c->bos_id, c->eos_id, c->unk_id, c->pad_id};
    for (int i = 0; i < 4; i++)
        if (ids[i] >= t->n_vocab || ids[i] < -1) {
            snprintf(err, errlen, "special token id %d is outside the vocabulary of %d", ids[i], t->n_vocab);
            return -1;
        }
    if ((c->add_bos && c->bos_id < 0) || (c->add_eos && c->eos_id < 0)) {
        snprintf(err, errlen, "tokenizer adds BOS/EOS but has no such token");
        return -1;
    }
    int missing = 0;
    for (int b = 0; b < 256; b++) {
        if (t->kind == TOK_BYTELEVEL) {
            t->byte_id[b] = tok_lookup(t, bl_utf8[b], bl_utf8_len[b]);
        } else {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_id[b] = tok_lookup(t, name, 6);
            if (t->byte_id[b] >= 0 && t->type[t->byte_id[b]] != TOK_TYPE_BYTE)
                t->byte_id[b] = -1;
        }
        missing += t->byte_id[b] < 0;
    }
    /* byte-level vocabularies may lack some byte symbols: see emit_symbols */
    if (t->kind == TOK_SPM && c->byte_fallback && missing) {
        snprintf(err, errlen, "byte fallback needs 256 <0xNN> tokens; %d are missing", missing);
        return -1;
    }
    free(t->special);
    t->n_special = 0;
    t->special = malloc((size_t)t->n_vocab * sizeof *t->special);
    if (!t->special) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memset(t->special_first, 0, sizeof t->special_first);
    for (int i = 0; i < t->n_vocab; i++)
        if ((t->type[i] == TOK_TYPE_CONTROL || t->type[i] == TOK_TYPE_USER_DEFINED) && t->plen[i] > 0) {
            t->special[t->n_special++] = i;
            t->special_first[(unsigned char)t->piece[i][0]] = 1;
        }
    qsort_r(t->special, (size_t)t->n_special, sizeof *t->special, cmp_special_len_desc, t);
    t->finalized = 1;
    return 0;
}

/* ---------- merging ---------- */

typedef struct { double prio; int left, llen, size; } mcand;

typedef struct {
    const tok_tokenizer *t;
    const char *buf;          /* the mapped text the symbols index */
    int *start, *len, *prev, *next, *id;
    mcand *heap;
    size_t nheap, capheap;
} merger;

static int cand_less(const mcand *a, const mcand *b)
{
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

static int heap_push(merger *m, mcand c)
{
    if (m->nheap == m->capheap) {
        size_t nc = m->capheap ? m->capheap * 2 : 64;
        mcand *h = realloc(m->heap, nc * sizeof *h);
        if (!h)
            return -1;
        m->heap = h;
        m->capheap = nc;
    }
    size_t i = m->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &m->heap[p]))
            break;
        m->heap[i] = m->heap[p];
        i = p;
    }
    m->heap[i] = c;
    return 0;
}

static mcand heap_pop(merger *m)
{
    mcand top = m->heap[0], last = m->heap[--m->nheap];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, s = i;
        const mcand *best = &last;
        if (l < m->nheap && cand_less(&m->heap[l], best)) { s = l; best = &m->heap[l]; }
        if (r < m->nheap && cand_less(&m->heap[r], best)) { s = r; }
        if (s == i)
            break;
        m->heap[i] = m->heap[s];
        i = s;
    }
    if (m->nheap)
        m->heap[i] = last;
    return top;
}

/* Candidate priority for merging symbol l with its right neighbour; 0 if none. */
static int pair_prio(merger *m, int l, double *prio, int *res)
{
    const tok_tokenizer *t = m->t;
    int r = m->next[l];
    if (r < 0)
        return 0;
    if (t->mcount || t->kind == TOK_BYTELEVEL) {
        if (m->id[l] < 0 || m->id[r] < 0)
            return 0;
        int rank = tok_merge_find(t, m->id[l], m->id[r], res);
        if (rank < 0)
            return 0;
        *prio = rank;
        return 1;
    }
    int id = tok_lookup(t, m->buf + m->start[l], (size_t)(m->len[l] + m->len[r]));
    if (id < 0 || (t->type[id] != TOK_TYPE_NORMAL && t->type[id] != TOK_TYPE_USER_DEFINED))
        return 0;
    *prio = -(double)t->score[id];
    *res = id;
    return 1;
}

static int try_pair(merger *m, int l)
{
    double prio;
    int res;
    if (l < 0 || !pair_prio(m, l, &prio, &res))
        return 0;
    mcand c = {prio, l, m->len[l], m->len[l] + m->len[m->next[l]]};
    return heap_push(m, c);
}

/* Merge n symbols (already set up in m) until no rule applies. */
static int merge_run(merger *m, int n)
{
    m->nheap = 0;
    for (int i = 0; i + 1 < n; i++)
        if (try_pair(m, i))
            return -1;
    while (m->nheap) {
        mcand c = heap_pop(m);
        int l = c.left, r = m->next[l];
        if (m->len[l] != c.llen || r < 0 || m->len[l] + m->len[r] != c.size)
            continue;
        double prio;
        int res;
        if (!pair_prio(m, l, &prio, &res) || prio != c.prio)
            continue;
        m->len[l] += m->len[r];
        m->id[l] = res;
        m->len[r] = 0;
        m->next[l] = m->next[r];
        if (m->next[r] >= 0)
            m->prev[m->next[r]] = l;
        if (try_pair(m, m->prev[l]) || try_pair(m, l))
            return -1;
    }
    return 0;
}

/* ---------- output buffer ---------- */

typedef struct { int *v; size_t n, cap; } idvec;

static int idvec_push(idvec *o, int id)
{
    if (o->n == o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 256;
        int *v = realloc(o->v, nc * sizeof *v);
        if (!v)
            return -1;
        o->v = v;
        o->cap = nc;
    }
    o->v[o->n++] = id;
    return 0;
}

typedef struct {
    merger m;
    int *arrays;              /* one block for start/len/prev/next/id */
    size_t cap_sym;
    char *mbuf;
    size_t cap_mbuf;
} workspace;

static int ws_reserve(workspace *w, size_t nsym, size_t nbytes)
{
    if (nsym > w->cap_sym) {
        int *a = realloc(w->arrays, nsym * 5 * sizeof *a);
        if (!a)
            return -1;
        w->arrays = a;
        w->cap_sym = nsym;
    }
    w->m.start = w->arrays; w->m.len = w->arrays + w->cap_sym; w->m.prev = w->arrays + 2 * w->cap_sym;
    w->m.next = w->arrays + 3 * w->cap_sym; w->m.id = w->arrays + 4 * w->cap_sym;
    if (nbytes > w->cap_mbuf) {
        char *b = realloc(w->mbuf, nbytes);
        if (!b)
            return -1;
        w->mbuf = b;
        w->cap_mbuf = nbytes;
    }
    w->m.buf = w->mbuf;
    return 0;
}

/* Emit the merged symbols of the merger (n initial symbols) into out. */
static int emit_symbols(const tok_tokenizer *t, workspace *w, int n, idvec *out)
{
    merger *m = &w->m;
    for (int i = 0; i >= 0 && i < n; i = m->next[i]) {
        if (m->id[i] >= 0) {
            if (idvec_push(out, m->id[i]))
                return -1;
            continue;
        }
        if (t->kind == TOK_SPM && t->cfg.byte_fallback) {
            for (int k = 0; k < m->len[i]; k++)
                if (idvec_push(out, t->byte_id[(unsigned char)m->buf[m->start[i] + k]]))
                    return -1;
        } else if (t->kind == TOK_SPM && t->cfg.unk_id >= 0) {
            if (idvec_push(out, t->cfg.unk_id))
                return -1;
        }
        /* byte-level: a byte symbol the vocabulary lacks is dropped, as HF tokenizers and
         * llama.cpp do (SmolLM2 has no symbol for 0x04, 0xC0, 0xF5..0xFF, ...) */
    }
    return 0;
}

/* Byte-level BPE of one pre-token. */
static int encode_bytelevel_piece(const tok_tokenizer *t, workspace *w, const unsigned char *s, size_t n, idvec *out)
{
    if (!n)
        return 0;
    if (ws_reserve(w, n, n * 2))
        return -1;
    merger *m = &w->m;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        m->start[i] = (int)off;
        m->len[i] = bl_utf8_len[s[i]];
        memcpy(w->mbuf + off, bl_utf8[s[i]], bl_utf8_len[s[i]]);
        off += bl_utf8_len[s[i]];
        m->prev[i] = (int)i - 1;
        m->next[i] = i + 1 < n ? (int)i + 1 : -1;
        m->id[i] = t->byte_id[s[i]];
    }
    if (t->cfg.ignore_merges) {
        int id = tok_lookup(t, w->mbuf, off);
        if (id >= 0)
            return idvec_push(out, id);
    }
    if (merge_run(m, (int)n))
        return -1;
    return emit_symbols(t, w, (int)n, out);
}

typedef struct { size_t off, len; } span;
typedef struct { span *v; size_t n, cap; } spanvec;

static int spanvec_push(spanvec *s, size_t off, size_t len)
{
    if (!len)
        return 0;
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 256;
        span *v = realloc(s->v, nc * sizeof *v);
        if (!v)
            return -1;
        s->v = v;
        s->cap = nc;
    }
    s->v[s->n++] = (span){off, len};
    return 0;
}

/* Split every span of `in` by regex `re` (matches and gaps both kept) into `out`.
 * Returns 0, -1 on OOM, -2 when PCRE2 fails to match (e.g. a resource limit). */
static int regex_split(pcre2_code *re, const char *text, const spanvec *in, spanvec *out)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md)
        return -1;
    int rc = 0;
    for (size_t k = 0; k < in->n && !rc; k++) {
        const unsigned char *s = (const unsigned char *)text + in->v[k].off;
        size_t n = in->v[k].len, pos = 0, at = 0;
        while (at < n && !rc) {
            int mr = pcre2_match(re, s, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
            if (mr == PCRE2_ERROR_NOMATCH)
                break;
            if (mr < 0) {
                rc = -2;    /* resource limit or internal error: never tokenize differently in silence */
                break;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me == ms) {   /* empty match: step one character */
                int l = utf8_len_at(s + ms, n - ms);
                at = ms + (l > 0 ? (size_t)l : 1);
                continue;
            }
            rc = spanvec_push(out, in->v[k].off + pos, ms - pos);
            if (!rc)
                rc = spanvec_push(out, in->v[k].off + ms, me - ms);
            pos = at = me;
        }
        if (!rc && pos < n)
            rc = spanvec_push(out, in->v[k].off + pos, n - pos);
    }
    pcre2_match_data_free(md);
    return rc;
}

static int encode_bytelevel(const tok_tokenizer *t, workspace *w, const char *text, size_t n, idvec *out)
{
    spanvec a = {0}, b = {0};
    int rc = spanvec_push(&a, 0, n);
    for (int r = 0; r < t->n_re && !rc; r++) {
        b.n = 0;
        rc = regex_split(t->re[r], text, &a, &b);
        spanvec tmp = a;
        a = b;
        b = tmp;
    }
    for (size_t k = 0; k < a.n && !rc; k++)
        rc = encode_bytelevel_piece(t, w, (const unsigned char *)text + a.v[k].off, a.v[k].len, out);
    free(a.v);
    free(b.v);
    return rc;
}

/* SentencePiece-style BPE over a whole segment (spaces escaped, optional dummy prefix). */
static int encode_spm(const tok_tokenizer *t, workspace *w, const char *text, size_t n, int prefix, idvec *out)
{
    size_t cap = (n + 1) * 3;
    if (ws_reserve(w, n + 1, cap))
        return -1;
    merger *m = &w->m;
    size_t off = 0;
    int ns = 0;
    for (size_t i = 0; i < n + (size_t)prefix;) {
        const unsigned char *s;
        size_t left;
        static const unsigned char space = ' ';
        if (prefix && i == 0) { s = &space; left = 1; }
        else { s = (const unsigned char *)text + i - (size_t)prefix; left = n - (i - (size_t)prefix); }
        int l = utf8_len_at(s, left);
        if (l <= 0)
            l = 1;
        m->start[ns] = (int)off;
        if (s[0] == ' ' && t->cfg.escape_spaces) {
            memcpy(w->mbuf + off, "\xE2\x96\x81", 3);
            m->len[ns] = 3;
        } else {
            memcpy(w->mbuf + off, s, (size_t)l);
            m->len[ns] = l;
        }
        off += (size_t)m->len[ns];
        int id = tok_lookup(t, w->mbuf + m->start[ns], (size_t)m->len[ns]);
        if (id >= 0 && t->type[id] != TOK_TYPE_NORMAL && t->type[id] != TOK_TYPE_USER_DEFINED)
            id = -1;
        m->id[ns] = id;
        m->prev[ns] = ns - 1;
        m->next[ns] = -1;
        if (ns > 0)
            m->next[ns - 1] = ns;
        ns++;
        i += (size_t)l;
    }
    if (merge_run(m, ns))
        return -1;
    return emit_symbols(t, w, ns, out);
}

/* Longest special token starting at text[i], or -1. */
/* The special token written at text[i], or -1. Byte-level text is valid UTF-8 and its
 * segments go to the pre-tokenizer's regex unchecked: a match must start and end at
 * character boundaries (a piece that is part of a character never cuts one). */
static int special_at(const tok_tokenizer *t, const char *text, size_t n, size_t i)
{
    int bl = t->kind == TOK_BYTELEVEL;
    if (!t->special_first[(unsigned char)text[i]] || (bl && ((unsigned char)text[i] & 0xc0) == 0x80))
        return -1;
    for (int k = 0; k < t->n_special; k++) {
        int id = t->special[k];
        size_t e = i + t->plen[id];
        if (t->plen[id] <= n - i && !memcmp(text + i, t->piece[id], t->plen[id]) &&
            !(bl && e < n && ((unsigned char)text[e] & 0xc0) == 0x80))
            return id;
    }
    return -1;
}

int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int add_special, int parse_special,
               int **ids, size_t *n, char *err, size_t errlen)
{
    *ids = NULL;
    *n = 0;
    if (!t->finalized) {
        snprintf(err, errlen, "tokenizer is not finalized");
        return -1;
    }
    if (len > TOK_MAX_TEXT_BYTES) {   /* its symbols are indexed by int */
        snprintf(err, errlen, "a text of %zu bytes is longer than the tokenizer takes at once (%zu bytes): "
                 "split it", len, (size_t)TOK_MAX_TEXT_BYTES);
        return -1;
    }
    if (t->kind == TOK_BYTELEVEL) {
        for (size_t i = 0; i < len;) {
            int l = utf8_len_at((const unsigned char *)text + i, len - i);
            if (l <= 0) {
                snprintf(err, errlen, "text is not valid UTF-8 at byte %zu", i);
                return -1;
            }
            i += (size_t)l;
        }
    }
    idvec out = {0};
    workspace w = {0};
    w.m.t = t;
    int rc = 0;
    char *pre = NULL;
    if (t->kind == TOK_BYTELEVEL && t->cfg.add_prefix_space && len && text[0] != ' ') {
        pre = malloc(len + 1);
        if (!pre) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        pre[0] = ' ';
        memcpy(pre + 1, text, len);
        text = pre;
        len++;
    }
    if (add_special && t->cfg.add_bos)
        rc = idvec_push(&out, t->cfg.bos_id);
    size_t seg = 0;
    for (size_t i = 0; i <= len && !rc;) {
        int sid = -1;
        if (i < len && parse_special && t->n_special)
            sid = special_at(t, text, len, i);
        if (sid < 0 && i < len) {
            i++;
            continue;
        }
        if (i > seg) {
            if (t->kind == TOK_BYTELEVEL)
                rc = encode_bytelevel(t, &w, text + seg, i - seg, &out);
            else
                rc = encode_spm(t, &w, text + seg, i - seg, seg == 0 && t->cfg.add_dummy_prefix, &out);
        }
        if (sid < 0)
            break;
        if (!rc)
            rc = idvec_push(&out, sid);
        i += t->plen[sid];
        seg = i;
    }
    if (!rc && add_special && t->cfg.add_eos)
        rc = idvec_push(&out, t->cfg.eos_id);
    free(w.arrays);
    free(w.mbuf);
    free(w.m.heap);
    free(pre);
    if (rc) {
        free(out.v);
        snprintf(err, errlen, rc == -2 ? "pre-tokenizer regex match failed" : "out of memory while encoding");
        return -1;
    }
    *ids = out.v;
    *n = out.n;
    return 0;
}

/* ---------- decoding ---------- */

int tok_token_text(const tok_tokenizer *t, int id, char *buf, size_t cap)
{
    if (id < 0 || id >= t->n_vocab)
        return -1;
    const char *p = t->piece[id] ? t->piece[id] : "";
    size_t n = t->plen[id], o = 0;
    int ty = t->type[id];
#define PUT(c) do { if (o < cap) buf[o] = (char)(c); o++; } while (0)
    if (ty == TOK_TYPE_CONTROL || (t->kind == TOK_BYTELEVEL && ty == TOK_TYPE_USER_DEFINED)) {
        for (size_t i = 0; i < n; i++)
            PUT(p[i]);
    } else if (t->kind == TOK_SPM && ty == TOK_TYPE_BYTE && n == 6 && !memcmp(p, "<0x", 3) && p[5] == '>') {
        unsigned v = 0;
        for (int i = 3; i < 5; i++) {
            char c = p[i];
            v = v * 16 + (unsigned)(c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                    : c >= 'a' && c <= 'f' ? c - 'a' + 10 : 0);
        }
        PUT(v);
    } else if (t->kind == TOK_SPM) {
        for (size_t i = 0; i < n;) {
            if (t->cfg.escape_spaces && n - i >= 3 && !memcmp(p + i, "\xE2\x96\x81", 3)) {
                PUT(' ');
                i += 3;
            } else {
                PUT(p[i]);
                i++;
            }
        }
    } else {
        for (size_t i = 0; i < n;) {
            int l;
            uint32_t cp = utf8_cp((const unsigned char *)p + i, n - i, &l);
            if (cp < 512 && bl_rev[cp] >= 0) {
                PUT(bl_rev[cp]);
            } else {
                for (int k = 0; k < l; k++)
                    PUT(p[i + (size_t)k]);
            }
            i += (size_t)l;
        }
    }
#undef PUT
    return (int)o;
}

int tok_decode(const tok_tokenizer *t, const int *ids, size_t n, int skip_special,
               char **out, size_t *out_len, char *err, size_t errlen)
{
    size_t cap = 64, len = 0;
    char *s = malloc(cap);
    int first = 1;
    if (!s)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        int id = ids[i];
        if (id < 0 || id >= t->n_vocab) {
            free(s);
            snprintf(err, errlen, "token id %d is outside the vocabulary of %d", id, t->n_vocab);
            return -1;
        }
        if (skip_special && t->type[id] == TOK_TYPE_CONTROL)
            continue;
        int need = tok_token_text(t, id, NULL, 0);
        if (len + (size_t)need + 1 > cap) {
            while (len + (size_t)need + 1 > cap)
                cap *= 2;
            char *ns = realloc(s, cap);
            if (!ns)
                goto oom;
            s = ns;
        }
        tok_token_text(t, id, s + len, (size_t)need);
        if (first && t->kind == TOK_SPM && t->cfg.add_dummy_prefix && need > 0 && s[len] == ' ') {
            memmove(s + len, s + len + 1, (size_t)need - 1);
            need--;
        }
        first = 0;
        len += (size_t)need;
    }
    s[len] = '\0';
    *out = s;
    *out_len = len;
    return 0;
oom:
    free(s);
    snprintf(err, errlen, "out of memory while decoding");
    return -1;
}

const char *tok_piece(const tok_tokenizer *t, int id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab)
        return NULL;
    if (len)
        *len = t->plen[id];
    return t->piece[id] ? t->piece[id] : "";
}

float tok_score(const tok_tokenizer *t, int id)
{
    return id >= 0 && id < t->n_vocab ? t->score[id] : 0.0f;
}

tok_type tok_type_of(const tok_tokenizer *t, int id)
{
    return id >= 0 && id < t->n_vocab ? (tok_type)t->type[id] : TOK_TYPE_UNUSED;
}
