/* storage/export.c — HF directory and GGUF export (see export.h).
 *
 * Tensors are read from the model one at a time (eng_model_get_tensor: works for any
 * backend). HF shards go through storage/safetensors.c (one shard's tensors held in host
 * memory while it is written); GGUF streams tensor by tensor through gguf_write.c. The
 * HF directory is assembled under "DIR.partial" and renamed when complete. A GGUF
 * parent's metadata is scanned by a small raw reader here because the tokenizer keys are
 * copied byte for byte.
 */
#include "storage/export.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/artstore.h"
#include "storage/fileio.h"
#include "storage/gguf.h"
#include "storage/hfconfig.h"
#include "storage/modelio.h"
#include "engine/tokenizer.h"
#include "storage/gguf_write.h"
#include "storage/modelcard.h"
#include "storage/safetensors.h"
#include "storage/strbuf.h"

#define DEFAULT_SHARD_BYTES ((int64_t)5 << 30)

int exp_dtype_parse(const char *s)
{
    if (!s)
        return -1;
    if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16"))
        return EXP_BF16;
    if (!strcmp(s, "fp16") || !strcmp(s, "f16") || !strcmp(s, "float16"))
        return EXP_FP16;
    if (!strcmp(s, "fp32") || !strcmp(s, "f32") || !strcmp(s, "float32"))
        return EXP_FP32;
    if (!strcmp(s, "q8_0"))
        return EXP_Q8_0;
    return -1;
}

const char *exp_dtype_name(exp_dtype d)
{
    switch (d) {
    case EXP_BF16: return "bf16";
    case EXP_FP16: return "fp16";
    case EXP_FP32: return "fp32";
    case EXP_Q8_0: return "q8_0";
    }
    return "?";
}

static const char *torch_dtype(exp_dtype d)
{
    return d == EXP_FP32 ? "float32" : d == EXP_FP16 ? "float16" : "bfloat16";
}

/* ------------------------------------------------------------------ files */

/* Write a JSON document atomically (2-space indent, keys in insertion order). */
static int write_json(const char *path, const json_t *j, char *err, size_t errlen)
{
    return fio_write_json(path, j, JSON_INDENT(2) | JSON_REAL_PRECISION(15), err, errlen);
}

/* Copy src to dst (created, fsynced) inside the directory being assembled. */
static int copy_file(const char *src, const char *dst, char *err, size_t errlen)
{
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        snprintf(err, errlen, "export: create %s: %s", dst, strerror(errno));
        return -1;
    }
    int rc = fio_copy_into(src, out) < 0 || fsync(out) < 0 ? -1 : 0;
    if (close(out) < 0)
        rc = -1;
    if (rc < 0)
        snprintf(err, errlen, "export: copy %s -> %s: %s", src, dst, strerror(errno));
    return rc;
}

/* ------------------------------------------------------- GGUF metadata */

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

/* ---------------------------------------------------- tokenizer.json */

static const char *const REGEX_LLAMA3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static json_t *bytelevel(int use_regex)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                     "trim_offsets", 1, "use_regex", use_regex);
}

/* HF pre_tokenizer for a llama.cpp pre-tokenizer name; NULL when unknown. */
static json_t *pretokenizer_for(const char *pre, int *ignore_merges)
{
    *ignore_merges = 0;
    if (!strcmp(pre, "gpt2") || !strcmp(pre, "default"))
        return bytelevel(1);
    if (!strcmp(pre, "smollm"))
        return json_pack("{s:s, s:[{s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type", "Digits",
                         "individual_digits", 1, bytelevel(1));
    if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) {
        *ignore_merges = 1;
        return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence", "pretokenizers",
                         "type", "Split", "pattern", "Regex", REGEX_LLAMA3, "behavior", "Isolated",
                         "invert", 0, bytelevel(0));
    }
    return NULL;
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
                 "(supported: gpt2, smollm, llama-bpe)", gguf_path, pre);
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

/* The pieces of an SPM tokenizer as llama.cpp and HF spell them: a space in a normal
 * piece is U+2581 (llama2.c's export turned those back into spaces). On success *pieces
 * (n NEW NUL-terminated strings; free_pieces) and *lens; returns 0, or -1 on OOM. */
static int spm_pieces(const tok_tokenizer *t, char ***pieces, size_t **lens)
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
    for (int i = 0; p && i < n; i++)
        free(p[i]);
    free(p);
    free(l);
    return -1;
}

static void free_pieces(char **p, size_t *l, int n)
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
    if (!vocab || !merges || !added || spm_pieces(t, &pc, &pl) < 0 || spm_merges(t, &mg, &nm) < 0)
        goto oom;
    for (int i = 0; i < n; i++) {
        json_t *ps = json_stringn(pc[i], pl[i]);
        if (!ps || memchr(pc[i], '\0', pl[i])) {
            json_decref(ps);
            snprintf(err, errlen, "tokenizer.json: token %d is not UTF-8 text without NUL bytes; JSON cannot hold it", i);
            goto fail;
        }
        json_decref(ps);
        json_t *dup = json_object_get(vocab, pc[i]);
        if (dup) {
            snprintf(err, errlen, "tokenizer.json: tokens %lld and %d are both \"%.40s\"; its vocab holds one id per piece",
                     (long long)json_integer_value(dup), i, pc[i]);
            goto fail;
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
    int pairs = 0;   /* merges as "left right" unless a piece holds a space */
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
        if (!e || json_array_append_new(merges, e) < 0)
            goto oom;
    }
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
    free_pieces(pc, pl, n);
    return out;
}

/* The parent's tokenizer, as the subcommands load it (tok_path: a file overriding the
 * one found beside the parent; may be NULL). Returns a NEW tokenizer, or NULL with err. */
static tok_tokenizer *parent_tokenizer(const char *parent, const char *tok_path, char *err, size_t errlen)
{
    mio_model mm;
    if (mio_open(&mm, parent, tok_path, err, errlen) < 0)
        return NULL;
    tok_tokenizer *t = mio_tokenizer(&mm, err, errlen);
    mio_close(&mm);
    return t;
}

/* ---------------------------------------------------------- HF config */

static int first_attention_heads(const arch *a)
{
    for (int i = 0; i < a->n_layers; i++)
        if (a->layers[i].n_heads > 0)
            return a->layers[i].n_heads;
    return 0;
}

static const char *parent_class(const json_t *pc)
{
    const json_t *ar = json_object_get(pc, "architectures");
    return json_is_array(ar) && json_array_size(ar) == 1 ? json_string_value(json_array_get(ar, 0)) : NULL;
}

static int hf_decilm_check(const arch *a, char *err, size_t errlen);

int exp_hf_class(const arch *a, const json_t *parent_config, char *cls, size_t cap, char *err, size_t errlen)
{
    if (strcmp(a->family, "llama") != 0) {
        snprintf(err, errlen, "HF export: family '%s' is not supported (llama only)", a->family);
        return -1;
    }
    if (a->n_layers > 0 && arch_is_uniform(a)) {
        const char *pcls = parent_class(parent_config);
        if (a->attention_bias)
            snprintf(cls, cap, "Qwen2ForCausalLM");
        else if (pcls && !strcmp(pcls, "MistralForCausalLM"))
            snprintf(cls, cap, "%s", pcls);
        else
            snprintf(cls, cap, "LlamaForCausalLM");
        return 0;
    }
    if (hf_decilm_check(a, err, errlen) < 0)
        return -1;
    snprintf(cls, cap, "DeciLMForCausalLM");
    return 0;
}

static int hf_decilm_check(const arch *a, char *err, size_t errlen)
{
    int H = first_attention_heads(a);
    if (H == 0) {
        snprintf(err, errlen, "HF export: no layer keeps attention; DeciLM needs num_attention_heads "
                 "from at least one attention layer");
        return -1;
    }
    if (a->head_dim * H != a->hidden_size) {
        snprintf(err, errlen, "HF export: DeciLM derives head_dim as hidden_size/num_attention_heads "
                 "(%d/%d), but the arch has head_dim %d", a->hidden_size, H, a->head_dim);
        return -1;
    }
    if (a->rope_scaling.type == ROPE_SCALING_DYNAMIC) {
        snprintf(err, errlen, "HF export: dynamic RoPE scaling is not expressible for DeciLM in this build");
        return -1;
    }
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        if (l->n_heads > 0 && l->n_heads != H) {
            snprintf(err, errlen, "HF export: layer %d has %d query heads but layer with attention before it "
                     "has %d; DeciLM block_configs (n_heads_in_group) fix the query head count for every "
                     "layer, so per-layer query heads are only expressible in GGUF", i, l->n_heads, H);
            return -1;
        }
        if (l->ffn_dim > 0 && hfconfig_decilm_ffn_mult(l->ffn_dim, a->hidden_size) < 0) {
            snprintf(err, errlen, "HF export: layer %d ffn_dim %d cannot be written as DeciLM ffn_mult "
                     "(readers round int(2*ffn_mult*%d/3) up to a multiple of 256)", i, l->ffn_dim,
                     a->hidden_size);
            return -1;
        }
        if (l->n_heads == 0 && l->ffn_dim == 0) {
            snprintf(err, errlen, "HF export: layer %d has neither attention nor MLP (a removed layer "
                     "must be absent from the arch)", i);
            return -1;
        }
    }
    return 0;
}

static json_t *rope_scaling_json(const arch *a)
{
    const arch_rope_scaling *r = &a->rope_scaling;
    switch (r->type) {
    case ROPE_SCALING_NONE: return json_null();
    case ROPE_SCALING_LINEAR: return json_pack("{s:s, s:f}", "rope_type", "linear", "factor", r->factor);
    case ROPE_SCALING_DYNAMIC: return json_pack("{s:s, s:f}", "rope_type", "dynamic", "factor", r->factor);
    case ROPE_SCALING_LLAMA3:
        return json_pack("{s:f, s:f, s:f, s:i, s:s}", "factor", r->factor, "high_freq_factor", r->high_freq_factor,
                         "low_freq_factor", r->low_freq_factor, "original_max_position_embeddings",
                         r->original_max_position_embeddings, "rope_type", "llama3");
    }
    return json_null();
}

static int set(json_t *o, const char *k, json_t *v)
{
    return v ? json_object_set_new(o, k, v) : -1;
}

json_t *exp_hf_config(const arch *a, const char *cls, exp_dtype dtype, const json_t *parent_config,
                      char *err, size_t errlen)
{
    int deci = !strcmp(cls, "DeciLMForCausalLM");
    json_t *c;
    int rc = 0;
    if (!deci) {
        /* Uniform: storage/hfconfig.c writes the class fields; the parent's own class name
         * (Mistral) is kept when it describes the same layout. */
        if (!(c = hfconfig_from_arch(a, torch_dtype(dtype), err, errlen)))
            return NULL;
        if (!strcmp(cls, "MistralForCausalLM")) {
            rc |= set(c, "architectures", json_pack("[s]", cls));
            rc |= set(c, "model_type", json_string("mistral"));
        }
    } else {
        c = json_object();
        if (!c)
            goto oom;
        int H = first_attention_heads(a);
        rc |= set(c, "architectures", json_pack("[s]", cls));
        rc |= set(c, "model_type", json_string("nemotron-nas"));
        rc |= set(c, "hidden_size", json_integer(a->hidden_size));
        rc |= set(c, "num_hidden_layers", json_integer(a->n_layers));
        rc |= set(c, "num_attention_heads", json_integer(H));
        rc |= set(c, "head_dim", json_integer(a->head_dim));
        rc |= set(c, "vocab_size", json_integer(a->vocab_size));
        rc |= set(c, "max_position_embeddings", json_integer(a->max_position_embeddings));
        rc |= set(c, "rms_norm_eps", json_real(a->norm_eps));
        rc |= set(c, "rope_theta", json_real(a->rope_theta));
        rc |= set(c, "rope_scaling", rope_scaling_json(a));
        rc |= set(c, "tie_word_embeddings", json_boolean(a->tie_word_embeddings));
        rc |= set(c, "attention_bias", json_boolean(a->attention_bias));
        rc |= set(c, "hidden_act", json_string("silu"));
        rc |= set(c, "torch_dtype", json_string(torch_dtype(dtype)));
        rc |= set(c, "use_cache", json_true());
        /* Nemotron-NAS schema (nvidia/Llama-3_1-Nemotron-51B-Instruct block_config.py; read
         * by vLLM nemotron_nas.py and llama.cpp conversion/deci.py). The class code is
         * NVIDIA's: transformers fetches it (trust_remote_code) from the auto_map repo. */
        rc |= set(c, "intermediate_size", json_null());
        rc |= set(c, "num_key_value_heads", json_null());
        rc |= set(c, "auto_map", json_pack("{s:s, s:s}",
            "AutoConfig", "nvidia/Llama-3_1-Nemotron-51B-Instruct--configuration_decilm.DeciLMConfig",
            "AutoModelForCausalLM", "nvidia/Llama-3_1-Nemotron-51B-Instruct--modeling_decilm.DeciLMForCausalLM"));
        json_t *blocks = json_array();
        if (!blocks)
            goto oom;
        for (int i = 0; i < a->n_layers; i++) {
            const arch_layer *l = &a->layers[i];
            json_t *att = json_pack("{s:o, s:b, s:n, s:b, s:n, s:b, s:b, s:n}",
                "n_heads_in_group", l->n_heads ? json_integer(l->n_heads / l->n_kv_heads) : json_null(),
                "no_op", l->n_heads == 0, "num_sink_tokens", "replace_with_linear", 0, "sparsify",
                "unshifted_sink", 0, "use_prefill_window_in_sink_attention", 0, "window_length");
            double m = l->ffn_dim ? hfconfig_decilm_ffn_mult(l->ffn_dim, a->hidden_size) : -1;
            json_t *ffn = json_pack("{s:o, s:b, s:b, s:n}",
                "ffn_mult", l->ffn_dim ? json_real(m) : json_null(), "no_op", l->ffn_dim == 0,
                "replace_with_linear", 0, "sparsify");
            json_t *b = att && ffn ? json_pack("{s:o, s:o}", "attention", att, "ffn", ffn) : NULL;
            if (!b || json_array_append_new(blocks, b) < 0) {
                json_decref(blocks);
                goto oom;
            }
        }
        rc |= set(c, "block_configs", blocks);
    }
    rc |= set(c, "mlp_bias", json_false());
    rc |= set(c, "attention_dropout", json_real(0.0));
    rc |= set(c, "initializer_range", json_real(0.02));
    rc |= set(c, "pretraining_tp", json_integer(1));
    json_t *src = json_array();
    for (int i = 0; src && i < a->n_layers; i++)
        rc |= json_array_append_new(src, json_integer(a->layers[i].source_layer));
    rc |= set(c, "autocompress_source_layers", src);
    const json_t *v;
    if ((v = json_object_get(parent_config, "bos_token_id")))
        rc |= json_object_set(c, "bos_token_id", (json_t *)v);
    if ((v = json_object_get(parent_config, "eos_token_id")))
        rc |= json_object_set(c, "eos_token_id", (json_t *)v);
    if (rc)
        goto oom;
    return c;
oom:
    json_decref(c);
    snprintf(err, errlen, "config.json: out of memory");
    return NULL;
}

/* ------------------------------------------------------------- tensors */

typedef struct {
    const char *name;     /* borrowed from the model */
    int64_t shape[2];
    int ndim;
    int64_t numel;
} tinfo;

static int list_tensors(const eng_model *m, tinfo **out, int *n, char *err, size_t errlen)
{
    int cnt = eng_model_tensor_count(m);
    if (cnt <= 0) {
        snprintf(err, errlen, "export: the model has no tensors");
        return -1;
    }
    tinfo *t = calloc((size_t)cnt, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "export: out of memory");
        return -1;
    }
    for (int i = 0; i < cnt; i++) {
        float *dev;
        if (eng_model_tensor(m, i, &t[i].name, t[i].shape, &t[i].ndim, &dev) < 0 || t[i].ndim < 1 ||
            t[i].ndim > 2) {
            snprintf(err, errlen, "export: cannot enumerate tensor %d", i);
            free(t);
            return -1;
        }
        t[i].numel = t[i].shape[0] * (t[i].ndim == 2 ? t[i].shape[1] : 1);
    }
    *out = t;
    *n = cnt;
    return 0;
}

static float *fetch_tensor(const eng_model *m, const tinfo *t, char *err, size_t errlen)
{
    float *buf = malloc((size_t)t->numel * sizeof *buf);
    if (!buf) {
        snprintf(err, errlen, "export: out of memory for tensor %s", t->name);
        return NULL;
    }
    if (eng_model_get_tensor(m, t->name, buf, t->numel) != t->numel) {
        snprintf(err, errlen, "export: cannot read tensor %s", t->name);
        free(buf);
        return NULL;
    }
    return buf;
}

/* ------------------------------------------------------------ HF directory */

static const char *const HF_TOKENIZER_FILES[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "tokenizer.model", "added_tokens.json", "chat_template.jinja",
};

/* The parent's format by the one model probe (storage/modelio.h); 0 without a parent or
 * when it is in no model format. */
static mio_format parent_format(const char *pp)
{
    mio_format f;
    char e[512];
    return pp && mio_probe(pp, &f, e, sizeof e) == 0 ? f : (mio_format)0;
}

static int write_shards(const eng_model *m, const char *dir, const exp_opts *o, int *n_shards,
                        char *err, size_t errlen)
{
    tinfo *t = NULL;
    int n = 0;
    if (list_tensors(m, &t, &n, err, errlen) < 0)
        return -1;
    st_dtype sd = o->dtype == EXP_FP32 ? ST_F32 : o->dtype == EXP_FP16 ? ST_F16 : ST_BF16;
    int64_t esz = (int64_t)st_dtype_size(sd);
    int64_t limit = o->shard_bytes > 0 ? o->shard_bytes : DEFAULT_SHARD_BYTES;
    /* Plan shards in enumeration order. */
    int *shard_of = calloc((size_t)n, sizeof *shard_of);
    if (!shard_of) {
        free(t);
        snprintf(err, errlen, "export: out of memory");
        return -1;
    }
    int ns = 0;
    int64_t cur = 0, total = 0;
    for (int i = 0; i < n; i++) {
        int64_t b = t[i].numel * esz;
        if (cur > 0 && cur + b > limit) {
            ns++;
            cur = 0;
        }
        shard_of[i] = ns;
        cur += b;
        total += b;
    }
    ns++;
    int rc = -1;
    json_t *meta = json_pack("{s:s}", "format", "pt");
    json_t *wmap = json_object();
    st_write_tensor *ws = calloc((size_t)n, sizeof *ws);
    if (!meta || !wmap || !ws) {
        snprintf(err, errlen, "export: out of memory");
        goto out;
    }
    for (int s = 0; s < ns; s++) {
        char fname[128], path[4096];
        if (ns == 1)
            snprintf(fname, sizeof fname, "model.safetensors");
        else
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, ns);
        if (fio_path_join(path, sizeof path, dir, fname) < 0) {
            snprintf(err, errlen, "export: path too long");
            goto out;
        }
        int k = 0, failed = 0;
        for (int i = 0; i < n && !failed; i++) {
            if (shard_of[i] != s)
                continue;
            float *d = fetch_tensor(m, &t[i], err, errlen);
            if (!d) {
                failed = 1;
                break;
            }
            ws[k].name = t[i].name;
            ws[k].data = d;
            ws[k].ndim = t[i].ndim;
            ws[k].shape[0] = t[i].shape[0];
            ws[k].shape[1] = t[i].shape[1];
            k++;
            if (json_object_set_new(wmap, t[i].name, json_string(fname)) < 0)
                failed = 1;
        }
        if (!failed && st_write(path, ws, k, sd, meta, err, errlen) < 0)
            failed = 1;
        for (int i = 0; i < k; i++)
            free((void *)ws[i].data);
        if (failed)
            goto out;
    }
    if (ns > 1) {
        char path[4096];
        json_t *idx = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total, "weight_map", wmap);
        if (!idx || fio_path_join(path, sizeof path, dir, "model.safetensors.index.json") < 0 ||
            write_json(path, idx, err, errlen) < 0) {
            json_decref(idx);
            if (!err[0])
                snprintf(err, errlen, "export: cannot write the shard index");
            goto out;
        }
        json_decref(idx);
    }
    *n_shards = ns;
    rc = 0;
out:
    json_decref(meta);
    json_decref(wmap);
    free(ws);
    free(shard_of);
    free(t);
    return rc;
}

/* The parent's config.json or generation_config.json; NULL when absent or unreadable. */
static json_t *load_json_file(const char *path)
{
    char why[512];
    return fio_load_json(path, JSON_REJECT_DUPLICATES, why, sizeof why);
}

int exp_hf_write(const eng_model *m, const char *dir, const exp_opts *o, exp_result *res,
                 char *err, size_t errlen)
{
    exp_result dummy;
    if (!res)
        res = &dummy;
    memset(res, 0, sizeof *res);
    err[0] = '\0';
    if (o->dtype == EXP_Q8_0) {
        snprintf(err, errlen, "HF export: dtype q8_0 is GGUF only (HF: bf16, fp16, fp32)");
        return -1;
    }
    const char *pp = o->parent_path;
    mio_format pf = parent_format(pp);
    int parent_hf = pf == MIO_HF_DIR, parent_gguf = pf == MIO_GGUF;
    json_t *pconf = NULL, *conf = NULL, *tokj = NULL, *tokc = NULL, *gen = NULL;
    char ppath[4096], partial[4096], path[4096], cls[64];
    int rc = -1, made = 0;
    if (parent_hf && fio_path_join(ppath, sizeof ppath, pp, "config.json") == 0 && fio_is_file(ppath))
        pconf = load_json_file(ppath);
    if (o->hf_class && !strcmp(o->hf_class, "llama") && !arch_is_uniform(&m->a)) {
        snprintf(err, errlen, "HF export: LlamaForCausalLM holds uniform layers only and this arch differs "
                 "per layer or removes parts; export it as \"deci\" or \"gguf\"");
        goto out;
    }
    if (o->hf_class && !strcmp(o->hf_class, "deci")) {
        if (hf_decilm_check(&m->a, err, errlen) < 0)   /* DeciLM asked for: also for uniform archs */
            goto out;
        snprintf(cls, sizeof cls, "DeciLMForCausalLM");
    } else if (exp_hf_class(&m->a, pconf, cls, sizeof cls, err, errlen) < 0) {
        goto out;
    }
    if (!(conf = exp_hf_config(&m->a, cls, o->dtype, pconf, err, errlen)))
        goto out;
    if (fio_is_dir(dir)) {
        char **names;
        size_t n_names = 0;
        if (fio_list_dir(dir, &names, &n_names) == 0)
            fio_names_free(names, n_names);
        if (n_names > 0) {
            snprintf(err, errlen, "HF export: %s exists and is not empty", dir);
            goto out;
        }
        rmdir(dir);
    }
    if (snprintf(partial, sizeof partial, "%s.partial", dir) >= (int)sizeof partial) {
        snprintf(err, errlen, "HF export: path too long");
        goto out;
    }
    (void)fio_remove_tree(partial);
    if (mkdir(partial, 0755) < 0) {
        snprintf(err, errlen, "HF export: mkdir %s: %s", partial, strerror(errno));
        goto out;
    }
    made = 1;
    snprintf(res->model_class, sizeof res->model_class, "%s", cls);
    /* Tokenizer files and token ids. */
    json_t *bos = NULL, *eos = NULL;
    if (parent_hf) {
        for (size_t i = 0; i < sizeof HF_TOKENIZER_FILES / sizeof *HF_TOKENIZER_FILES; i++) {
            char src[4096];
            if (fio_path_join(src, sizeof src, pp, HF_TOKENIZER_FILES[i]) < 0 || !fio_is_file(src))
                continue;
            if (fio_path_join(path, sizeof path, partial, HF_TOKENIZER_FILES[i]) < 0 ||
                copy_file(src, path, err, errlen) < 0)
                goto out;
            res->tokenizer = 1;
        }
        char src[4096];
        if (fio_path_join(src, sizeof src, pp, "generation_config.json") == 0 && fio_is_file(src))
            gen = load_json_file(src);
        bos = json_object_get(pconf, "bos_token_id");
        eos = json_object_get(pconf, "eos_token_id");
        if (!res->tokenizer)
            snprintf(res->note, sizeof res->note, "the parent directory holds no tokenizer files");
    } else if (pp) {
        /* A GGUF byte-level BPE from its metadata (merges included); SentencePiece-style
         * vocabularies (llama2.c tok*.bin, GGUF "llama") through the engine's tokenizer. */
        char tmodel[64] = "";
        int64_t b = -1, e = -1;
        if (parent_gguf) {
            gguf_file g;
            if (gguf_open(&g, pp, err, errlen) < 0)
                goto out;
            (void)gguf_str_copy(&g, "tokenizer.ggml.model", tmodel, sizeof tmodel);
            b = gguf_int_or_neg(&g, "tokenizer.ggml.bos_token_id");
            e = gguf_int_or_neg(&g, "tokenizer.ggml.eos_token_id");
            gguf_close(&g);
        }
        if (!strcmp(tmodel, "gpt2")) {
            if (!(tokj = exp_tokenizer_json_from_gguf(pp, &tokc, err, errlen)))
                goto out;
        } else {
            char why[400];
            tok_tokenizer *t = parent_tokenizer(pp, o->parent_tokenizer, why, sizeof why);
            if (t && tok_kind_of(t) == TOK_SPM) {
                b = tok_cfg(t)->bos_id;
                e = tok_cfg(t)->eos_id;
                tokj = exp_tokenizer_json_spm(t, &tokc, why, sizeof why);
            } else if (t) {
                snprintf(why, sizeof why, "its byte-level BPE tokenizer has a tokenizer.json conversion only from a "
                         "GGUF parent or an HF directory");
            }
            tok_free(t);
            if (!tokj)
                snprintf(res->note, sizeof res->note, "tokenizer not carried over: %s", why);
        }
        if (tokj) {
            if (!tokc || json_object_set_new(tokc, "model_max_length", json_integer(m->a.max_position_embeddings)) < 0)
                goto oom_tok;
            json_t *map = json_object();
            static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
            for (size_t k = 0; map && k < sizeof keys / sizeof *keys; k++) {
                json_t *v = json_object_get(tokc, keys[k]);
                if (json_is_string(v) && json_object_set(map, keys[k], v) < 0) {
                    json_decref(map);
                    map = NULL;
                }
            }
            int wr = !map || fio_path_join(path, sizeof path, partial, "tokenizer.json") < 0 ||
                     write_json(path, tokj, err, errlen) < 0 ||
                     fio_path_join(path, sizeof path, partial, "tokenizer_config.json") < 0 ||
                     write_json(path, tokc, err, errlen) < 0 ||
                     fio_path_join(path, sizeof path, partial, "special_tokens_map.json") < 0 ||
                     write_json(path, map, err, errlen) < 0;
            json_decref(map);
            if (wr) {
                if (!err[0])
                    goto oom_tok;
                goto out;
            }
            res->tokenizer = 1;
            if (b >= 0 && json_object_set_new(conf, "bos_token_id", json_integer(b)) < 0)
                goto oom_tok;
            if (e >= 0 && json_object_set_new(conf, "eos_token_id", json_integer(e)) < 0)
                goto oom_tok;
        }
    } else {
        snprintf(res->note, sizeof res->note, "no parent given: no tokenizer files");
    }
    if (bos)
        json_object_set(conf, "bos_token_id", bos);
    if (eos)
        json_object_set(conf, "eos_token_id", eos);
    if (fio_path_join(path, sizeof path, partial, "config.json") < 0 || write_json(path, conf, err, errlen) < 0)
        goto out;
    if (!gen) {
        gen = json_pack("{s:b}", "_from_model_config", 1);
        json_t *b = json_object_get(conf, "bos_token_id"), *e = json_object_get(conf, "eos_token_id");
        if (gen && b)
            json_object_set(gen, "bos_token_id", b);
        if (gen && e)
            json_object_set(gen, "eos_token_id", e);
    }
    if (!gen || fio_path_join(path, sizeof path, partial, "generation_config.json") < 0 ||
        write_json(path, gen, err, errlen) < 0) {
        if (!err[0])
            snprintf(err, errlen, "HF export: out of memory");
        goto out;
    }
    if (write_shards(m, partial, o, &res->n_shards, err, errlen) < 0)
        goto out;
    char tokline[600];
    if (res->tokenizer)
        snprintf(tokline, sizeof tokline, "%s", parent_hf ? "included (the parent directory's tokenizer files)"
                 : "included (tokenizer.json, tokenizer_config.json, special_tokens_map.json)");
    else
        snprintf(tokline, sizeof tokline, "not included: %s", res->note);
    mc_info info = {.parent = pp ? pp : "unknown", .model_class = cls, .dtype = exp_dtype_name(o->dtype),
                    .formats = "HF directory (config.json + safetensors)", .tokenizer = tokline};
    if (fio_path_join(path, sizeof path, partial, "MODEL_CARD.md") < 0 ||
        mc_write(path, &m->a, o->report, &info, err, errlen) < 0)
        goto out;
    if (exp_write_sums(partial, err, errlen) < 0)
        goto out;
    if (rename(partial, dir) < 0) {
        snprintf(err, errlen, "HF export: rename %s -> %s: %s", partial, dir, strerror(errno));
        goto out;
    }
    made = 0;
    rc = 0;
    goto out;
oom_tok:
    snprintf(err, errlen, "HF export: out of memory writing the tokenizer files");
out:
    if (made)
        (void)fio_remove_tree(partial);
    json_decref(pconf);
    json_decref(conf);
    json_decref(tokj);
    json_decref(tokc);
    json_decref(gen);
    return rc;
}

/* ---------------------------------------------------------------- GGUF */

int exp_gguf_arch(const arch *a, char *arch_name, size_t cap, char *err, size_t errlen)
{
    if (strcmp(a->family, "llama") != 0) {
        snprintf(err, errlen, "GGUF export: family '%s' is not supported (llama only)", a->family);
        return -1;
    }
    if (a->attention_bias) {
        snprintf(err, errlen, "GGUF export: q/k/v biases (Qwen2-style) are not available in this build");
        return -1;
    }
    if (a->rope_scaling.type == ROPE_SCALING_DYNAMIC) {
        snprintf(err, errlen, "GGUF export: dynamic RoPE scaling has no llama.cpp equivalent for llama/deci");
        return -1;
    }
    if (a->n_layers == 0) {
        snprintf(err, errlen, "GGUF export: the arch has no layers");
        return -1;
    }
    if (arch_is_uniform(a)) {
        snprintf(arch_name, cap, "llama");
        return 0;
    }
    /* llama.cpp's llama arch sizes every layer's tensors from layer 0's values
     * (LLAMA_LOAD_LOCALS), so heterogeneous layers need `deci` (src/models/deci.cpp). */
    if (a->layers[0].n_heads == 0) {
        snprintf(err, errlen, "GGUF export: layer 0 has no attention; llama.cpp derives head size and "
                 "RoPE dimensions from layer 0's head count and would load this arch without attention");
        return -1;
    }
    for (int i = 0; i < a->n_layers; i++) {
        const arch_layer *l = &a->layers[i];
        if (l->n_heads > 0 && l->ffn_dim == 0) {
            snprintf(err, errlen, "GGUF export: layer %d keeps attention but removes the MLP; llama.cpp's "
                     "deci graph skips such a layer entirely (its attention output is dropped), so it "
                     "cannot run this arch", i);
            return -1;
        }
        if (l->n_heads == 0 && l->ffn_dim == 0) {
            snprintf(err, errlen, "GGUF export: layer %d has neither attention nor MLP", i);
            return -1;
        }
    }
    snprintf(arch_name, cap, "deci");
    return 0;
}

/* HF name -> GGUF name; *perm_heads > 0 when the rows must be permuted for llama.cpp's
 * interleaved RoPE. Returns 0, or -1 for an unknown name. */
static int gguf_name(const arch *a, const char *hf, char *out, size_t cap, int *perm_heads)
{
    *perm_heads = 0;
    if (!strcmp(hf, "model.embed_tokens.weight"))
        return snprintf(out, cap, "token_embd.weight") < 0 ? -1 : 0;
    if (!strcmp(hf, "model.norm.weight"))
        return snprintf(out, cap, "output_norm.weight") < 0 ? -1 : 0;
    if (!strcmp(hf, "lm_head.weight"))
        return snprintf(out, cap, "output.weight") < 0 ? -1 : 0;
    int layer, pos = 0;
    if (sscanf(hf, "model.layers.%d.%n", &layer, &pos) != 1 || pos == 0 || layer < 0 || layer >= a->n_layers)
        return -1;
    static const struct { const char *hf, *gg; int perm; } map[] = {
        {"input_layernorm.weight", "attn_norm.weight", 0},
        {"self_attn.q_proj.weight", "attn_q.weight", 1},
        {"self_attn.k_proj.weight", "attn_k.weight", 2},
        {"self_attn.v_proj.weight", "attn_v.weight", 0},
        {"self_attn.o_proj.weight", "attn_output.weight", 0},
        {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
        {"mlp.gate_proj.weight", "ffn_gate.weight", 0},
        {"mlp.up_proj.weight", "ffn_up.weight", 0},
        {"mlp.down_proj.weight", "ffn_down.weight", 0},
    };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (!strcmp(hf + pos, map[i].hf)) {
            if (map[i].perm == 1)
                *perm_heads = a->layers[layer].n_heads;
            else if (map[i].perm == 2)
                *perm_heads = a->layers[layer].n_kv_heads;
            return snprintf(out, cap, "blk.%d.%s", layer, map[i].gg) < 0 ? -1 : 0;
        }
    return -1;
}

/* rotate_half layout -> interleaved pairs, as convert_hf_to_gguf's permute():
 * new row h*D + 2j + t takes old row h*D + t*D/2 + j. */
static int permute_rows(float *w, int n_heads, int64_t rows, int64_t cols)
{
    if (n_heads <= 0 || rows % n_heads)
        return -1;
    int64_t D = rows / n_heads;
    if (D % 2)
        return -1;
    float *tmp = malloc((size_t)(D * cols) * sizeof *tmp);
    if (!tmp)
        return -1;
    for (int h = 0; h < n_heads; h++) {
        float *blk = w + (int64_t)h * D * cols;
        memcpy(tmp, blk, (size_t)(D * cols) * sizeof *tmp);
        for (int64_t j = 0; j < D / 2; j++)
            for (int t = 0; t < 2; t++)
                memcpy(blk + (2 * j + t) * cols, tmp + (t * (D / 2) + j) * cols, (size_t)cols * sizeof *tmp);
    }
    free(tmp);
    return 0;
}

static uint32_t gguf_file_type(exp_dtype d)
{
    switch (d) {
    case EXP_FP32: return 0;
    case EXP_FP16: return 1;
    case EXP_Q8_0: return 7;
    case EXP_BF16: return 32;
    }
    return 0;
}


/* GGUF tokenizer metadata from a non-GGUF parent through the engine's tokenizer API:
 * SentencePiece-style vocabularies (llama2.c, HF byte-fallback BPE) as llama.cpp's
 * "llama" model. Byte-level BPE needs the merge list, which the API does not expose. */
static int gguf_tokenizer_from_api(ggw *w, const char *parent, const char *tok_path, int vocab, char *err,
                                   size_t errlen)
{
    tok_tokenizer *t = parent_tokenizer(parent, tok_path, err, errlen);
    if (!t)
        return -1;
    int rc = -1, n = tok_n_vocab(t);
    char **pieces = NULL;
    size_t *lens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    if (tok_kind_of(t) != TOK_SPM) {
        snprintf(err, errlen, "GGUF export: the parent's byte-level BPE tokenizer can be carried into GGUF only "
                 "from a GGUF parent in this build (its merge list is not available otherwise)");
        goto out;
    }
    if (n != vocab) {
        snprintf(err, errlen, "GGUF export: parent tokenizer has %d tokens, model vocab is %d", n, vocab);
        goto out;
    }
    const tok_config *c = tok_cfg(t);
    scores = calloc((size_t)n, sizeof *scores);
    types = calloc((size_t)n, sizeof *types);
    if (!scores || !types || spm_pieces(t, &pieces, &lens) < 0)
        goto oom;
    for (int i = 0; i < n; i++) {
        scores[i] = tok_score(t, i);
        types[i] = (int32_t)tok_type_of(t, i);
    }
    int bad = 0;
    bad |= ggw_kv_str(w, "tokenizer.ggml.model", "llama");
    bad |= ggw_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)pieces, lens, (size_t)n);
    bad |= ggw_kv_arr_f32(w, "tokenizer.ggml.scores", scores, (size_t)n);
    bad |= ggw_kv_arr_i32(w, "tokenizer.ggml.token_type", types, (size_t)n);
    if (c->bos_id >= 0)
        bad |= ggw_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_id);
    if (c->eos_id >= 0)
        bad |= ggw_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_id);
    if (c->unk_id >= 0)
        bad |= ggw_kv_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)c->unk_id);
    if (c->pad_id >= 0)
        bad |= ggw_kv_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)c->pad_id);
    bad |= ggw_kv_bool(w, "tokenizer.ggml.add_bos_token", c->add_bos);
    bad |= ggw_kv_bool(w, "tokenizer.ggml.add_eos_token", c->add_eos);
    bad |= ggw_kv_bool(w, "tokenizer.ggml.add_space_prefix", c->add_dummy_prefix);
    if (bad)
        goto oom;
    rc = 0;
    goto out;
oom:
    snprintf(err, errlen, "GGUF export: out of memory building tokenizer metadata");
out:
    free_pieces(pieces, lens, n);
    free(scores);
    free(types);
    tok_free(t);
    return rc;
}

int exp_gguf_write(const eng_model *m, const char *path, const exp_opts *o, exp_result *res,
                   char *err, size_t errlen)
{
    exp_result dummy;
    if (!res)
        res = &dummy;
    memset(res, 0, sizeof *res);
    const arch *a = &m->a;
    char an[16];
    if (exp_gguf_arch(a, an, sizeof an, err, errlen) < 0)
        return -1;
    snprintf(res->model_class, sizeof res->model_class, "%s", an);
    ggw *w = ggw_new();
    tinfo *t = NULL;
    int n = 0, rc = -1;
    gguf_file g;
    int have_g = 0;
    int32_t *arr = NULL;
    if (!w) {
        snprintf(err, errlen, "GGUF export: out of memory");
        return -1;
    }
    const char *pp = o->parent_path;
    if (parent_format(pp) == MIO_GGUF) {
        if (gguf_open(&g, pp, err, errlen) < 0)
            goto out;
        have_g = 1;
    }
    char key[128];
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", an, suffix), key)
    int bad = 0;
    bad |= ggw_kv_str(w, "general.architecture", an);
    bad |= ggw_kv_str(w, "general.name", o->name ? o->name : "autocompress-export");
    bad |= ggw_kv_u32(w, "general.file_type", gguf_file_type(o->dtype));
    bad |= ggw_kv_u32(w, K("context_length"), (uint32_t)a->max_position_embeddings);
    bad |= ggw_kv_u32(w, K("embedding_length"), (uint32_t)a->hidden_size);
    bad |= ggw_kv_u32(w, K("block_count"), (uint32_t)a->n_layers);
    bad |= ggw_kv_u32(w, K("vocab_size"), (uint32_t)a->vocab_size);
    bad |= ggw_kv_f32(w, K("rope.freq_base"), (float)a->rope_theta);
    bad |= ggw_kv_f32(w, K("attention.layer_norm_rms_epsilon"), (float)a->norm_eps);
    bad |= ggw_kv_u32(w, K("attention.key_length"), (uint32_t)a->head_dim);
    bad |= ggw_kv_u32(w, K("attention.value_length"), (uint32_t)a->head_dim);
    bad |= ggw_kv_u32(w, K("rope.dimension_count"), (uint32_t)a->head_dim);
    if (a->rope_scaling.type == ROPE_SCALING_LINEAR) {
        bad |= ggw_kv_str(w, K("rope.scaling.type"), "linear");
        bad |= ggw_kv_f32(w, K("rope.scaling.factor"), (float)a->rope_scaling.factor);
    }
    if (!strcmp(an, "llama")) {
        bad |= ggw_kv_u32(w, K("feed_forward_length"), (uint32_t)a->layers[0].ffn_dim);
        bad |= ggw_kv_u32(w, K("attention.head_count"), (uint32_t)a->layers[0].n_heads);
        bad |= ggw_kv_u32(w, K("attention.head_count_kv"), (uint32_t)a->layers[0].n_kv_heads);
    } else {
        if (!(arr = malloc((size_t)a->n_layers * sizeof *arr)))
            bad = 1;
        for (int f = 0; f < 3 && !bad; f++) {
            for (int i = 0; i < a->n_layers; i++)
                arr[i] = f == 0 ? a->layers[i].ffn_dim : f == 1 ? a->layers[i].n_heads : a->layers[i].n_kv_heads;
            const char *k = f == 0 ? "feed_forward_length" : f == 1 ? "attention.head_count" : "attention.head_count_kv";
            bad |= ggw_kv_arr_i32(w, K(k), arr, (size_t)a->n_layers);
        }
    }
#undef K
    if (have_g) {
        uint32_t tt;
        uint64_t ntok = 0;
        if (gguf_get_arr(&g, "tokenizer.ggml.tokens", &tt, &ntok) < 0 || ntok != (uint64_t)a->vocab_size) {
            snprintf(err, errlen, "GGUF export: parent tokenizer has %llu tokens, model vocab is %d",
                     (unsigned long long)ntok, a->vocab_size);
            goto out;
        }
        for (int i = 0; i < g.n_kv; i++) {
            const gguf_kv *kv = &g.kv[i];
            const void *raw;
            size_t len;
            if (kv->key_len < 10 || memcmp(kv->key, "tokenizer.", 10) || gguf_kv_raw(&g, i, &raw, &len) < 0)
                continue;
            char *key = strndup(kv->key, kv->key_len);
            bad |= !key || ggw_kv_raw(w, key, kv->type, raw, len);
            free(key);
        }
        res->tokenizer = 1;
    } else if (pp) {
        if (gguf_tokenizer_from_api(w, pp, o->parent_tokenizer, a->vocab_size, err, errlen) < 0)
            goto out;
        res->tokenizer = 1;
    } else {
        snprintf(res->note, sizeof res->note, "no parent given: the file carries no tokenizer metadata "
                 "(llama.cpp cannot load it; the engine can)");
    }
    if (bad) {
        snprintf(err, errlen, "GGUF export: metadata out of memory or duplicate key");
        goto out;
    }
    if (list_tensors(m, &t, &n, err, errlen) < 0)
        goto out;
    /* Declare tensors: 1-D (norms) stay F32 as llama.cpp's converter keeps them. */
    ggw_type wt = o->dtype == EXP_FP32 ? GGW_F32 : o->dtype == EXP_FP16 ? GGW_F16
                : o->dtype == EXP_Q8_0 ? GGW_Q8_0 : GGW_BF16;
    for (int i = 0; i < n; i++) {
        char gn[96];
        int ph;
        if (gguf_name(a, t[i].name, gn, sizeof gn, &ph) < 0) {
            snprintf(err, errlen, "GGUF export: tensor %s has no GGUF name", t[i].name);
            goto out;
        }
        int64_t ne[2] = {t[i].ndim == 2 ? t[i].shape[1] : t[i].shape[0], t[i].shape[0]};
        ggw_type tt = t[i].ndim == 1 ? GGW_F32 : wt;
        if (tt == GGW_Q8_0 && ne[0] % GGW_QK8_0)
            tt = GGW_F16;   /* rows not divisible into Q8_0 blocks: llama.cpp's quantizer falls back too */
        if (ggw_tensor(w, gn, ne, t[i].ndim, tt, err, errlen) < 0)
            goto out;
    }
    if (ggw_begin(w, path, err, errlen) < 0)
        goto out;
    for (int i = 0; i < n; i++) {
        char gn[96];
        int ph;
        gguf_name(a, t[i].name, gn, sizeof gn, &ph);
        float *d = fetch_tensor(m, &t[i], err, errlen);
        if (!d)
            goto out;
        if (ph > 0 && permute_rows(d, ph, t[i].shape[0], t[i].ndim == 2 ? t[i].shape[1] : 1) < 0) {
            snprintf(err, errlen, "GGUF export: cannot permute %s for %d heads", t[i].name, ph);
            free(d);
            goto out;
        }
        int wr = ggw_write_tensor(w, d, t[i].numel, err, errlen);
        free(d);
        if (wr < 0)
            goto out;
    }
    if (ggw_finish(w, err, errlen) < 0)
        goto out;
    rc = 0;
out:
    free(arr);
    free(t);
    if (have_g)
        gguf_close(&g);
    ggw_free(w);
    return rc;
}

/* -------------------------------------------------------------- digests */

int exp_write_sums(const char *dir, char *err, size_t errlen)
{
    char **names;
    size_t n;
    if (fio_list_dir(dir, &names, &n) < 0) {
        snprintf(err, errlen, "SHA256SUMS: open %s: %s", dir, strerror(errno));
        return -1;
    }
    strbuf sums = {0};
    int rc = -1;
    for (size_t i = 0; i < n; i++) {
        char p[4096], hex[65];
        int64_t size;
        if (names[i][0] == '.' || !strcmp(names[i], "SHA256SUMS") || fio_has_suffix(names[i], ".tmp") ||
            fio_path_join(p, sizeof p, dir, names[i]) < 0 || !fio_is_file(p))
            continue;
        if (art_sha256_file(p, hex, &size, err, errlen) < 0)
            goto out;
        strbuf_printf(&sums, "%s  %s\n", hex, names[i]);
    }
    char path[4096], why[600];
    if (sums.oom || fio_path_join(path, sizeof path, dir, "SHA256SUMS") < 0) {
        snprintf(err, errlen, "SHA256SUMS: out of memory or path too long");
        goto out;
    }
    if (fio_write_atomic(path, sums.s ? sums.s : "", sums.len, why, sizeof why) < 0) {
        snprintf(err, errlen, "SHA256SUMS: %s", why);
        goto out;
    }
    rc = 0;
out:
    free(sums.s);
    fio_names_free(names, n);
    return rc;
}

int exp_verify_file(const char *path, const char *hex, int64_t size, char *err, size_t errlen)
{
    char got[65];
    int64_t gsize;
    if (art_sha256_file(path, got, &gsize, err, errlen) < 0)
        return -1;
    if (size >= 0 && gsize != size) {
        snprintf(err, errlen, "%s: %lld bytes, expected %lld (truncated or corrupted)", path,
                 (long long)gsize, (long long)size);
        return -1;
    }
    if (strcmp(got, hex) != 0) {
        snprintf(err, errlen, "%s: sha-256 mismatch (file corrupted or truncated)", path);
        return -1;
    }
    return 0;
}

int exp_verify_dir(const char *dir, char *err, size_t errlen)
{
    char path[4096];
    if (fio_path_join(path, sizeof path, dir, "SHA256SUMS") < 0) {
        snprintf(err, errlen, "verify: path too long");
        return -1;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "verify: %s: %s", path, strerror(errno));
        return -1;
    }
    char line[4096];
    int rc = 0, lines = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        size_t l = strlen(line);
        if (l && line[l - 1] == '\n')
            line[--l] = '\0';
        if (l < 67 || line[64] != ' ' || line[65] != ' ' || strchr(line + 66, '/')) {
            snprintf(err, errlen, "verify: %s: malformed line %d", path, lines + 1);
            rc = -1;
            break;
        }
        line[64] = '\0';
        char p[4096];
        if (fio_path_join(p, sizeof p, dir, line + 66) < 0 || !fio_is_file(p)) {
            snprintf(err, errlen, "verify: %s is missing", line + 66);
            rc = -1;
            break;
        }
        rc = exp_verify_file(p, line, -1, err, errlen);
        lines++;
    }
    fclose(f);
    if (rc == 0 && lines == 0) {
        snprintf(err, errlen, "verify: %s lists no files", path);
        rc = -1;
    }
    return rc;
}

/* ------------------------------------------------------------- loading */

int exp_load_model(const char *path, eng_backend *be, eng_model *m, char *err, size_t errlen)
{
    char sums[4096];
    if (fio_is_dir(path) && fio_path_join(sums, sizeof sums, path, "SHA256SUMS") == 0 && fio_is_file(sums) &&
        exp_verify_dir(path, err, errlen) < 0)
        return -1;
    return mio_load_model(path, NULL, be, m, NULL, err, errlen);
}
