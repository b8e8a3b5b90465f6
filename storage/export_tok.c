/* storage/export_tok.c — the parent's tokenizer in the formats an export carries (see
 * export.h): tokenizer.json (HF `tokenizers`) from a GGUF byte-level BPE's metadata or
 * from a SentencePiece-style vocabulary (llama2.c tok*.bin, GGUF "llama"), and the
 * tokenizer files of an HF export whose parent is not an HF directory. Byte-level BPE
 * from anything but GGUF is refused: only GGUF carries its merge list.
 */
#include "storage/export_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "storage/fileio.h"
#include "storage/gguf.h"
#include "storage/tokload.h"

static json_t *bytelevel(int use_regex)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                     "trim_offsets", 1, "use_regex", use_regex);
}

/* HF pre_tokenizer for a llama.cpp pre-tokenizer name (tokload_gguf_pretok's preset);
 * NULL when it has none. */
static json_t *pretokenizer_for(const char *pre, int *ignore_merges)
{
    const char *preset = tokload_gguf_pretok(pre, ignore_merges);
    if (!preset)
        return NULL;
    if (!strcmp(preset, "gpt2"))
        return bytelevel(1);
    if (!strcmp(preset, "smollm"))
        return json_pack("{s:s, s:[{s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type", "Digits",
                         "individual_digits", 1, bytelevel(1));
    const char *re = !strcmp(preset, "llama3") ? TOK_REGEX_LLAMA3 : !strcmp(preset, "qwen2") ? TOK_REGEX_QWEN2 : NULL;
    if (!re)
        return NULL;
    return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type", "Split",
                     "pattern", "Regex", re, "behavior", "Isolated", "invert", 0, bytelevel(0));
}

/* String value of key into buf (NUL-terminated, cut to cap - 1 bytes); NULL when absent
 * or not a string. */
static const char *gguf_str_copy(const gguf_file *g, const char *key, char *buf, size_t cap)
{
    const char *s;
    size_t n;
    if (gguf_get_str(g, key, &s, &n) < 0)
        return NULL;
    snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), s);
    return buf;
}

/* Integer value of key; -1 when absent or not an integer. */
static int64_t gguf_int_or_neg(const gguf_file *g, const char *key)
{
    int64_t v;
    return gguf_get_int(g, key, &v) == 0 ? v : -1;
}

/* The piece that token-id key names, as a JSON string (tokens: the tokenizer.ggml.tokens
 * entry, n pieces); JSON null when absent or out of range. NEW reference. */
static json_t *token_json(const gguf_file *g, const char *key, int tokens, int64_t n)
{
    int64_t id = gguf_int_or_neg(g, key);
    const char *s;
    size_t len;
    if (id < 0 || id >= n || gguf_arr_str(g, tokens, (uint64_t)id, &s, &len) < 0)
        return json_null();
    json_t *j = json_stringn(s, len);
    return j ? j : json_null();
}

/* One TemplateProcessing element {"SpecialToken"|"Sequence": {id, type_id}} appended to arr. */
static int tp_add(json_t *arr, const char *kind, const char *id, int type_id)
{
    return json_array_append_new(arr, json_pack("{s:{s:s, s:i}}", kind, "id", id, "type_id", type_id));
}

/* The post-processor that adds BOS (bos != NULL) and/or EOS (eos != NULL) around each
 * sequence, as transformers writes it for Llama; pieces borrowed. Returns a NEW
 * reference (JSON null when it adds neither), or NULL on OOM. */
static json_t *template_processor(const char *bos, int64_t bos_id, const char *eos, int64_t eos_id)
{
    if (!bos && !eos)
        return json_null();
    json_t *single = json_array(), *pair = json_array(), *special = json_object();
    int bad = !single || !pair || !special;
    for (int k = 0; k < 3 && !bad; k++) {   /* single: A; pair: A, then B with type_id 1 */
        json_t *arr = k == 0 ? single : pair;
        if (bos)
            bad |= tp_add(arr, "SpecialToken", bos, k == 2);
        bad |= tp_add(arr, "Sequence", k == 2 ? "B" : "A", k == 2);
        if (eos)
            bad |= tp_add(arr, "SpecialToken", eos, k == 2);
    }
    if (!bad && bos)
        bad |= json_object_set_new(special, bos, json_pack("{s:s, s:[I], s:[s]}", "id", bos, "ids",
                                                           (json_int_t)bos_id, "tokens", bos));
    if (!bad && eos && (!bos || strcmp(bos, eos)))
        bad |= json_object_set_new(special, eos, json_pack("{s:s, s:[I], s:[s]}", "id", eos, "ids",
                                                           (json_int_t)eos_id, "tokens", eos));
    if (bad) {
        json_decref(single);
        json_decref(pair);
        json_decref(special);
        return NULL;
    }
    return json_pack("{s:s, s:o, s:o, s:o}", "type", "TemplateProcessing", "single", single, "pair", pair,
                     "special_tokens", special);
}

/* tokenizer_config.json as transformers' PreTrainedTokenizerFast reads it. Steals the
 * four token values (JSON strings or null; a NULL one makes the call fail). Returns a
 * NEW reference, or NULL on OOM. */
static json_t *tokenizer_config(int add_bos, int add_eos, json_t *bos, json_t *eos, json_t *unk, json_t *pad)
{
    return json_pack("{s:b, s:b, s:o, s:o, s:o, s:o, s:b, s:s}", "add_bos_token", add_bos, "add_eos_token", add_eos,
                     "bos_token", bos, "eos_token", eos, "unk_token", unk, "pad_token", pad,
                     "clean_up_tokenization_spaces", 0, "tokenizer_class", "PreTrainedTokenizerFast");
}

/* A GGUF byte-level BPE vocabulary: the tokens entry (n pieces) and merges entry, checked
 * to be string arrays. 0, or -1 with err. */
static int gguf_bpe_arrays(const gguf_file *g, const char *path, int *tokens, int64_t *n, int *merges,
                           int64_t *nm, char *err, size_t errlen)
{
    uint32_t tt, mt;
    uint64_t tn, mn;
    *tokens = gguf_get_arr(g, "tokenizer.ggml.tokens", &tt, &tn);
    *merges = gguf_get_arr(g, "tokenizer.ggml.merges", &mt, &mn);
    if (*tokens < 0 || tt != GGUF_T_STRING || tn == 0 || tn > INT32_MAX || *merges < 0 || mt != GGUF_T_STRING) {
        snprintf(err, errlen, "%s: tokenizer tokens or merges missing", path);
        return -1;
    }
    *n = (int64_t)tn;
    *nm = (int64_t)mn;
    return 0;
}

/* vocab (piece -> id) and added_tokens (control and user-defined pieces, by
 * tokenizer.ggml.token_type) into the objects given. 0, or -1 with err. */
static int gguf_bpe_vocab(const gguf_file *g, const char *path, int tokens, int64_t n, json_t *vocab,
                          json_t *added, char *err, size_t errlen)
{
    uint32_t tyt;
    uint64_t tyn;
    int types = gguf_get_arr(g, "tokenizer.ggml.token_type", &tyt, &tyn);
    if (types >= 0 && ((tyt != GGUF_T_I32 && tyt != GGUF_T_U32) || tyn != (uint64_t)n))
        types = -1;
    for (int64_t i = 0; i < n; i++) {
        const char *tok;
        size_t tlen;
        char key[1024];
        (void)gguf_arr_str(g, tokens, (uint64_t)i, &tok, &tlen);
        if (tlen >= sizeof key) {
            snprintf(err, errlen, "%s: token %lld longer than 1023 bytes", path, (long long)i);
            return -1;
        }
        memcpy(key, tok, tlen);
        key[tlen] = '\0';
        if (memchr(tok, '\0', tlen) || json_object_set_new(vocab, key, json_integer(i)) < 0) {
            snprintf(err, errlen, "%s: token %lld is not valid UTF-8 text", path, (long long)i);
            return -1;
        }
        int64_t ty = 1;
        if (types >= 0)
            (void)gguf_arr_int(g, types, (uint64_t)i, &ty);
        if (ty == 3 || ty == 4) {   /* control, user-defined */
            json_t *c = json_stringn(tok, tlen);
            json_t *a = c ? json_pack("{s:I, s:o, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)i, "content", c,
                                      "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", ty == 4,
                                      "special", ty == 3) : NULL;
            if (!a || json_array_append_new(added, a) < 0) {
                snprintf(err, errlen, "tokenizer.json: out of memory");
                return -1;
            }
        }
    }
    return 0;
}

/* The merges entry as the BPE model's "a b" strings, appended to arr. 0, or -1 with err. */
static int gguf_bpe_merges(const gguf_file *g, const char *path, int merges, int64_t nm, json_t *arr,
                           char *err, size_t errlen)
{
    for (int64_t i = 0; i < nm; i++) {
        const char *m;
        size_t ml;
        (void)gguf_arr_str(g, merges, (uint64_t)i, &m, &ml);
        json_t *s = json_stringn(m, ml);
        if (!s || json_array_append_new(arr, s) < 0) {
            snprintf(err, errlen, "%s: merge %lld is not valid UTF-8 text", path, (long long)i);
            return -1;
        }
    }
    return 0;
}

/* tokenizer_config.json for a GGUF byte-level BPE: special tokens by id, the chat template
 * whole. NEW reference, or NULL on OOM. */
static json_t *gguf_bpe_config(const gguf_file *g, int tokens, int64_t n)
{
    const char *ct;
    size_t cl;
    json_t *chat = gguf_get_str(g, "tokenizer.chat_template", &ct, &cl) == 0 ? json_stringn(ct, cl) : NULL;
    json_t *tc = tokenizer_config(gguf_int_or_neg(g, "tokenizer.ggml.add_bos_token") == 1,
                                  gguf_int_or_neg(g, "tokenizer.ggml.add_eos_token") == 1,
                                  token_json(g, "tokenizer.ggml.bos_token_id", tokens, n),
                                  token_json(g, "tokenizer.ggml.eos_token_id", tokens, n),
                                  token_json(g, "tokenizer.ggml.unknown_token_id", tokens, n),
                                  token_json(g, "tokenizer.ggml.padding_token_id", tokens, n));
    if (tc && chat)
        json_object_set_new(tc, "chat_template", chat);
    else
        json_decref(chat);
    return tc;
}

json_t *exp_tokenizer_json_from_gguf(const char *gguf_path, json_t **tok_config, char *err, size_t errlen)
{
    json_t *out = NULL, *vocab = NULL, *merges = NULL, *added = NULL, *pret = NULL;
    if (tok_config)
        *tok_config = NULL;
    gguf_file g;
    if (gguf_open(&g, gguf_path, err, errlen) < 0)
        return NULL;
    char model[64], pre[64];
    if (!gguf_str_copy(&g, "tokenizer.ggml.model", model, sizeof model)) {
        snprintf(err, errlen, "%s: no tokenizer.ggml.model", gguf_path);
        goto out;
    }
    if (strcmp(model, "gpt2") != 0) {
        snprintf(err, errlen, "%s: tokenizer model '%s' has no tokenizer.json conversion in this build "
                 "(byte-level BPE 'gpt2' only)", gguf_path, model);
        goto out;
    }
    if (!gguf_str_copy(&g, "tokenizer.ggml.pre", pre, sizeof pre))
        snprintf(pre, sizeof pre, "default");
    int ignore_merges = 0;
    if (!(pret = pretokenizer_for(pre, &ignore_merges))) {
        snprintf(err, errlen, "%s: pre-tokenizer '%s' has no tokenizer.json mapping in this build "
                 "(supported: %s)", gguf_path, pre, TOKLOAD_GGUF_PRETOKS);
        goto out;
    }
    int tokens, kmerges;
    int64_t n, nm;
    if (gguf_bpe_arrays(&g, gguf_path, &tokens, &n, &kmerges, &nm, err, errlen) < 0)
        goto out;
    vocab = json_object();
    merges = json_array();
    added = json_array();
    if (!vocab || !merges || !added)
        goto oom;
    if (gguf_bpe_vocab(&g, gguf_path, tokens, n, vocab, added, err, errlen) < 0 ||
        gguf_bpe_merges(&g, gguf_path, kmerges, nm, merges, err, errlen) < 0)
        goto out;
    int64_t bos = gguf_int_or_neg(&g, "tokenizer.ggml.bos_token_id");
    json_t *post;
    if (gguf_int_or_neg(&g, "tokenizer.ggml.add_bos_token") == 1 && bos >= 0 && bos < n) {
        const char *bp;
        size_t bl;
        (void)gguf_arr_str(&g, tokens, (uint64_t)bos, &bp, &bl);
        char *bs = strndup(bp, bl);
        post = bs ? template_processor(bs, bos, NULL, -1) : NULL;
        free(bs);
    } else {
        post = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1,
                         "trim_offsets", 0, "use_regex", 1);
    }
    json_t *model_obj = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE",
                                  "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                                  "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", ignore_merges,
                                  "vocab", vocab, "merges", merges);
    vocab = merges = NULL;
    out = json_pack("{s:s, s:n, s:n, s:o, s:n, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation", "padding",
                    "added_tokens", added, "normalizer", "pre_tokenizer", pret, "post_processor", post,
                    "decoder", json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1,
                                         "trim_offsets", 1, "use_regex", 1),
                    "model", model_obj);
    added = pret = NULL;
    if (!out)
        goto oom;
    if (tok_config)
        *tok_config = gguf_bpe_config(&g, tokens, n);
    goto out;
oom:
    snprintf(err, errlen, "tokenizer.json: out of memory");
out:
    json_decref(vocab);
    json_decref(merges);
    json_decref(added);
    json_decref(pret);
    gguf_close(&g);
    return out;
}

int exp_spm_pieces(const tok_tokenizer *t, char ***pieces, size_t **lens)
{
    int n = tok_n_vocab(t);
    const tok_config *c = tok_cfg(t);
    char **p = calloc((size_t)n, sizeof *p);
    size_t *l = calloc((size_t)n, sizeof *l);
    if (!p || !l)
        goto oom;
    for (int i = 0; i < n; i++) {
        size_t len;
        const char *s = tok_piece(t, i, &len);
        if (!s)
            s = "", len = 0;
        int esc = !c->escape_spaces && tok_type_of(t, i) == TOK_TYPE_NORMAL;
        size_t spaces = 0, o = 0;
        for (size_t k = 0; esc && k < len; k++)
            spaces += s[k] == ' ';
        if (!(p[i] = malloc(len + 2 * spaces + 1)))
            goto oom;
        for (size_t k = 0; k < len; k++) {
            if (esc && s[k] == ' ') {
                memcpy(p[i] + o, "\xe2\x96\x81", 3);
                o += 3;
            } else {
                p[i][o++] = s[k];
            }
        }
        p[i][o] = '\0';
        l[i] = o;
    }
    *pieces = p;
    *lens = l;
    return 0;
oom:
    exp_free_pieces(p, l, n);
    return -1;
}

void exp_free_pieces(char **p, size_t *l, int n)
{
    for (int i = 0; p && i < n; i++)
        free(p[i]);
    free(p);
    free(l);
}

/* A piece SentencePiece merges into and out of (not control, unknown, byte or unused). */
static int spm_mergeable(const tok_tokenizer *t, int id)
{
    tok_type ty = tok_type_of(t, id);
    return ty == TOK_TYPE_NORMAL || ty == TOK_TYPE_USER_DEFINED;
}

typedef struct {
    float score;          /* the merged piece's */
    int piece, left, right;
} spm_merge;

/* Higher score first; then as transformers' SentencePieceExtractor leaves ties (stable
 * sort over pieces in id order, each piece's splits by left id, then right id). */
static int spm_merge_cmp(const void *x, const void *y)
{
    const spm_merge *a = x, *b = y;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->piece != b->piece)
        return a->piece < b->piece ? -1 : 1;
    if (a->left != b->left)
        return a->left < b->left ? -1 : 1;
    return (a->right > b->right) - (a->right < b->right);
}

/* Every split of every mergeable piece into two mergeable pieces, at UTF-8 character
 * boundaries, sorted by spm_merge_cmp. *out NEW (free), *n its count. 0 or -1 (OOM). */
static int spm_merges(const tok_tokenizer *t, spm_merge **out, size_t *n)
{
    size_t cap = 0, cnt = 0;
    spm_merge *m = NULL;
    for (int id = 0; id < tok_n_vocab(t); id++) {
        size_t len;
        const char *s = tok_piece(t, id, &len);
        if (!s || !spm_mergeable(t, id))
            continue;
        for (size_t k = 1; k < len; k++) {
            if (((unsigned char)s[k] & 0xC0) == 0x80)
                continue;   /* inside a character */
            int l = tok_lookup(t, s, k), r = tok_lookup(t, s + k, len - k);
            if (l < 0 || r < 0 || !spm_mergeable(t, l) || !spm_mergeable(t, r))
                continue;
            if (cnt == cap) {
                size_t nc = cap ? cap * 2 : 1024;
                spm_merge *nm = realloc(m, nc * sizeof *nm);
                if (!nm) {
                    free(m);
                    return -1;
                }
                m = nm;
                cap = nc;
            }
            m[cnt++] = (spm_merge){tok_score(t, id), id, l, r};
        }
    }
    if (cnt)
        qsort(m, cnt, sizeof *m, spm_merge_cmp);
    *out = m;
    *n = cnt;
    return 0;
}

/* vocab (piece -> id) and added_tokens (control, unknown and user-defined pieces) of an
 * SPM tokenizer whose pieces are pc/pl, into the objects given. 0, or -1 with err (a
 * piece JSON cannot hold, two ids with one piece, OOM). */
static int spm_vocab(const tok_tokenizer *t, char **pc, const size_t *pl, json_t *vocab, json_t *added,
                     char *err, size_t errlen)
{
    for (int i = 0; i < tok_n_vocab(t); i++) {
        json_t *ps = json_stringn(pc[i], pl[i]);
        if (!ps || memchr(pc[i], '\0', pl[i])) {
            json_decref(ps);
            snprintf(err, errlen, "tokenizer.json: token %d is not UTF-8 text without NUL bytes; JSON cannot hold it", i);
            return -1;
        }
        json_decref(ps);
        json_t *dup = json_object_get(vocab, pc[i]);
        if (dup) {
            snprintf(err, errlen, "tokenizer.json: tokens %lld and %d are both \"%.40s\"; its vocab holds one id per piece",
                     (long long)json_integer_value(dup), i, pc[i]);
            return -1;
        }
        if (json_object_set_new(vocab, pc[i], json_integer(i)) < 0)
            goto oom;
        tok_type ty = tok_type_of(t, i);
        if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN || ty == TOK_TYPE_USER_DEFINED) {
            json_t *a = json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", i, "content", pc[i], "single_word", 0,
                                  "lstrip", 0, "rstrip", 0, "normalized", ty == TOK_TYPE_USER_DEFINED,
                                  "special", ty != TOK_TYPE_USER_DEFINED);
            if (!a || json_array_append_new(added, a) < 0)
                goto oom;
        }
    }
    return 0;
oom:
    snprintf(err, errlen, "tokenizer.json: out of memory");
    return -1;
}

/* The nm merges mg as the BPE model's entries, appended to arr: "left right", or
 * ["left", "right"] when some piece holds a space. 0, or -1 with err (OOM). */
static int spm_merges_json(const spm_merge *mg, size_t nm, char **pc, const size_t *pl, json_t *arr, char *err,
                           size_t errlen)
{
    int pairs = 0;
    for (size_t k = 0; k < nm; k++)
        pairs |= strchr(pc[mg[k].left], ' ') || strchr(pc[mg[k].right], ' ');
    for (size_t k = 0; k < nm; k++) {
        json_t *e;
        if (pairs) {
            e = json_pack("[s, s]", pc[mg[k].left], pc[mg[k].right]);
        } else {
            char *j = malloc(pl[mg[k].left] + pl[mg[k].right] + 2);
            if (j)
                snprintf(j, pl[mg[k].left] + pl[mg[k].right] + 2, "%s %s", pc[mg[k].left], pc[mg[k].right]);
            e = j ? json_string(j) : NULL;
            free(j);
        }
        if (!e || json_array_append_new(arr, e) < 0) {
            snprintf(err, errlen, "tokenizer.json: out of memory");
            return -1;
        }
    }
    return 0;
}

json_t *exp_tokenizer_json_spm(const tok_tokenizer *t, json_t **config_out, char *err, size_t errlen)
{
    if (config_out)
        *config_out = NULL;
    if (tok_kind_of(t) != TOK_SPM) {
        snprintf(err, errlen, "tokenizer.json: the tokenizer is not SentencePiece-style");
        return NULL;
    }
    int n = tok_n_vocab(t);
    const tok_config *c = tok_cfg(t);
    char **pc = NULL;
    size_t *pl = NULL, nm = 0;
    spm_merge *mg = NULL;
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array(), *out = NULL;
    json_t *norm = NULL, *dec = NULL, *post = NULL, *model = NULL;
    if (!vocab || !merges || !added || exp_spm_pieces(t, &pc, &pl) < 0 || spm_merges(t, &mg, &nm) < 0)
        goto oom;
    if (spm_vocab(t, pc, pl, vocab, added, err, errlen) < 0 ||
        spm_merges_json(mg, nm, pc, pl, merges, err, errlen) < 0)
        goto fail;
    /* Llama-2 as transformers' LlamaConverter writes it: "▁" prepended and spaces
     * escaped by the normalizer, no pre-tokenizer, byte fallback, and the decoder undoing
     * each step. */
    json_t *repl = json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "String", " ", "content",
                             "\xe2\x96\x81");
    norm = c->add_dummy_prefix ? json_pack("{s:s, s:[{s:s, s:s}, o]}", "type", "Sequence", "normalizers", "type",
                                           "Prepend", "prepend", "\xe2\x96\x81", repl) : repl;
    dec = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}]}", "type", "Sequence", "decoders", "type", "Replace",
                    "pattern", "String", "\xe2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse");
    if (dec && c->add_dummy_prefix &&
        json_array_append_new(json_object_get(dec, "decoders"),
                              json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip", "content", " ", "start", 1, "stop", 0)) < 0)
        goto oom;
    post = template_processor(c->add_bos ? pc[c->bos_id] : NULL, c->bos_id, c->add_eos ? pc[c->eos_id] : NULL,
                              c->eos_id);
    json_t *unk = c->unk_id >= 0 ? json_string(pc[c->unk_id]) : json_null();
    model = json_pack("{s:s, s:n, s:o, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout", "unk_token",
                      unk, "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 1, "byte_fallback",
                      c->byte_fallback, "ignore_merges", 0, "vocab", vocab, "merges", merges);
    vocab = merges = NULL;
    if (!norm || !dec || !post || !model)
        goto oom;
    out = json_pack("{s:s, s:n, s:n, s:o, s:o, s:n, s:o, s:o, s:o}", "version", "1.0", "truncation", "padding",
                    "added_tokens", added, "normalizer", norm, "pre_tokenizer", "post_processor", post, "decoder",
                    dec, "model", model);
    added = norm = post = dec = model = NULL;
    if (!out)
        goto oom;
    if (config_out) {
        json_t *tok[4];
        int ids[4] = {c->bos_id, c->eos_id, c->unk_id, c->pad_id};
        for (int k = 0; k < 4; k++)
            tok[k] = ids[k] >= 0 ? json_string(pc[ids[k]]) : json_null();
        if (!(*config_out = tokenizer_config(c->add_bos, c->add_eos, tok[0], tok[1], tok[2], tok[3])))
            goto oom;
    }
    goto done;
oom:
    snprintf(err, errlen, "tokenizer.json: out of memory");
fail:
    json_decref(out);
    out = NULL;
done:
    json_decref(vocab);
    json_decref(merges);
    json_decref(added);
    json_decref(norm);
    json_decref(dec);
    json_decref(post);
    json_decref(model);
    free(mg);
    exp_free_pieces(pc, pl, n);
    return out;
}

/* tokenizer.json and tokenizer_config.json (NEW in *tokj, *tokc) for a parent that is
 * not an HF directory, with its BOS/EOS ids in *bos, *eos (-1: none). 0 with *tokj NULL
 * and res->note saying why when its tokenizer cannot be carried over; -1 with err when
 * a GGUF parent cannot be read or converted. */
static int parent_tokenizer_json(const char *parent, const char *tok_path, int parent_gguf, json_t **tokj,
                                 json_t **tokc, int64_t *bos, int64_t *eos, exp_result *res, char *err,
                                 size_t errlen)
{
    char tmodel[64] = "", pre[64] = "default";
    *bos = *eos = -1;
    if (parent_gguf) {
        gguf_file g;
        if (gguf_open(&g, parent, err, errlen) < 0)
            return -1;
        (void)gguf_str_copy(&g, "tokenizer.ggml.model", tmodel, sizeof tmodel);
        (void)gguf_str_copy(&g, "tokenizer.ggml.pre", pre, sizeof pre);
        *bos = gguf_int_or_neg(&g, "tokenizer.ggml.bos_token_id");
        *eos = gguf_int_or_neg(&g, "tokenizer.ggml.eos_token_id");
        gguf_close(&g);
    }
    int ignore;
    if (!strcmp(tmodel, "gpt2") && !tokload_gguf_pretok(pre, &ignore)) {
        snprintf(res->note, sizeof res->note, "tokenizer not carried over: the GGUF parent's pre-tokenizer '%s' has "
                 "no tokenizer.json mapping in this build (%s)", pre, TOKLOAD_GGUF_PRETOKS);
        return 0;
    }
    if (!strcmp(tmodel, "gpt2"))   /* byte-level BPE: from the metadata, merges included */
        return (*tokj = exp_tokenizer_json_from_gguf(parent, tokc, err, errlen)) ? 0 : -1;
    /* SentencePiece-style vocabularies (llama2.c tok*.bin, GGUF "llama") through the
     * engine's tokenizer */
    char why[400];
    tok_tokenizer *t = exp_parent_tokenizer(parent, tok_path, why, sizeof why);
    if (t && tok_kind_of(t) == TOK_SPM) {
        *bos = tok_cfg(t)->bos_id;
        *eos = tok_cfg(t)->eos_id;
        *tokj = exp_tokenizer_json_spm(t, tokc, why, sizeof why);
    } else if (t) {
        snprintf(why, sizeof why, "its byte-level BPE tokenizer has a tokenizer.json conversion only from a "
                 "GGUF parent or an HF directory");
    }
    tok_free(t);
    if (!*tokj)
        snprintf(res->note, sizeof res->note, "tokenizer not carried over: %s", why);
    return 0;
}

/* tokenizer.json, tokenizer_config.json (given model_max_length) and
 * special_tokens_map.json (the string tokens of tokc) into dir. 0, or -1 with err. */
static int write_tokenizer_files(const char *dir, const json_t *tokj, json_t *tokc, int max_pos, char *err,
                                 size_t errlen)
{
    if (!tokc || json_object_set_new(tokc, "model_max_length", json_integer(max_pos)) < 0)
        goto oom;
    json_t *map = json_object();
    static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    for (size_t k = 0; map && k < sizeof keys / sizeof *keys; k++) {
        json_t *v = json_object_get(tokc, keys[k]);
        if (json_is_string(v) && json_object_set(map, keys[k], v) < 0) {
            json_decref(map);
            map = NULL;
        }
    }
    char path[4096];
    int wr = !map || fio_path_join(path, sizeof path, dir, "tokenizer.json") < 0 ||
             exp_write_json(path, tokj, err, errlen) < 0 ||
             fio_path_join(path, sizeof path, dir, "tokenizer_config.json") < 0 ||
             exp_write_json(path, tokc, err, errlen) < 0 ||
             fio_path_join(path, sizeof path, dir, "special_tokens_map.json") < 0 ||
             exp_write_json(path, map, err, errlen) < 0;
    json_decref(map);
    if (wr && !err[0])
        goto oom;
    return wr ? -1 : 0;
oom:
    snprintf(err, errlen, "HF export: out of memory writing the tokenizer files");
    return -1;
}

int exp_hf_tokenizer_files(const char *parent, const char *tok_path, int parent_gguf, int max_pos,
                           const char *dir, json_t *conf, exp_result *res, char *err, size_t errlen)
{
    json_t *tokj = NULL, *tokc = NULL;
    int64_t bos, eos;
    int rc = parent_tokenizer_json(parent, tok_path, parent_gguf, &tokj, &tokc, &bos, &eos, res, err, errlen);
    if (rc == 0 && tokj) {
        rc = write_tokenizer_files(dir, tokj, tokc, max_pos, err, errlen);
        if (rc == 0) {
            res->tokenizer = 1;
            if ((bos >= 0 && json_object_set_new(conf, "bos_token_id", json_integer(bos)) < 0) ||
                (eos >= 0 && json_object_set_new(conf, "eos_token_id", json_integer(eos)) < 0)) {
                snprintf(err, errlen, "HF export: out of memory writing the tokenizer files");
                rc = -1;
            }
        }
    }
    json_decref(tokj);
    json_decref(tokc);
    return rc;
}
