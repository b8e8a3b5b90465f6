/* storage/tokload.c — tokenizer builders for llama2.c tok*.bin, GGUF metadata and HF
 * tokenizer.json. Everything read is bounds-checked; the tokenizer itself (merging,
 * pre-tokenization) lives in engine/tokenizer.c.
 */
#include "storage/tokload.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/fileio.h"

static int is_byte_piece(const char *p, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    return n == 6 && !memcmp(p, "<0x", 3) && p[5] == '>' && strchr(hex, p[3]) && strchr(hex, p[4]) && p[3] && p[4];
}

/* tok_set_token with its failure in words: `what` names the file kind in the message.
 * Returns 0, or -1 with err set. */
static int set_token(tok_tokenizer *t, const char *what, int id, const char *s, size_t len, float score,
                     tok_type ty, char *err, size_t errlen)
{
    int rc = tok_set_token(t, id, s, len, score, ty);
    if (rc == TOK_SET_TOO_LONG)
        snprintf(err, errlen, "%s: token %d is %zu bytes, over the limit of %u bytes per token", what, id, len,
                 TOK_MAX_PIECE_BYTES);
    else if (rc == TOK_SET_BAD_ID)
        snprintf(err, errlen, "%s: token id %d is outside the vocabulary of %d", what, id, tok_n_vocab(t));
    else if (rc)
        snprintf(err, errlen, "out of memory");
    return rc ? -1 : 0;
}

/* ---------- llama2.c ---------- */

/* How a builder ends: t finalized (tok_finalize), or NULL with a reason, t freed. */
static tok_tokenizer *finalized(tok_tokenizer *t, char *err, size_t errlen)
{
    if (tok_finalize(t, err, errlen)) {
        tok_free(t);
        return NULL;
    }
    return t;
}

tok_tokenizer *tokload_llama2c_mem(const void *buf, size_t len, int n_vocab, char *err, size_t errlen)
{
    const uint8_t *p = buf;
    size_t pos = 4;
    int n_bytes = 0;
    if (len < 4 || n_vocab < 3 || (len - 4) / 8 < (size_t)n_vocab) {   /* 8 bytes a token at least */
        snprintf(err, errlen, "llama2.c tokenizer: too short (%zu bytes) for a vocabulary of %d", len, n_vocab);
        return NULL;
    }
    tok_tokenizer *t = tok_new(TOK_SPM, n_vocab);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n_vocab; i++) {
        float score;
        int32_t n;
        if (len - pos < 8) {
            snprintf(err, errlen, "llama2.c tokenizer: truncated at token %d of %d", i, n_vocab);
            goto fail;
        }
        memcpy(&score, p + pos, 4);
        memcpy(&n, p + pos + 4, 4);
        pos += 8;
        if (n < 0 || (size_t)n > len - pos) {
            snprintf(err, errlen, "llama2.c tokenizer: token %d has length %d beyond the file", i, n);
            goto fail;
        }
        if (n > 4096) {
            snprintf(err, errlen, "llama2.c tokenizer: token %d is %d bytes, over the limit of 4096 bytes", i, n);
            goto fail;
        }
        const char *s = (const char *)p + pos;
        tok_type ty = i == 0 ? TOK_TYPE_UNKNOWN : i <= 2 ? TOK_TYPE_CONTROL
                      : is_byte_piece(s, (size_t)n) ? TOK_TYPE_BYTE : TOK_TYPE_NORMAL;
        n_bytes += ty == TOK_TYPE_BYTE;
        if (set_token(t, "llama2.c tokenizer", i, s, (size_t)n, score, ty, err, errlen))
            goto fail;
        pos += (size_t)n;
    }
    if (pos != len) {   /* the file is not the model's vocabulary: it tokenized with the first entries only */
        snprintf(err, errlen, "llama2.c tokenizer: %zu bytes follow the model's %d tokens (a tokenizer of a larger "
                 "vocabulary, or not a tokenizer)", len - pos, n_vocab);
        goto fail;
    }
    tok_config *c = tok_config_of(t);
    c->unk_id = 0;
    c->bos_id = 1;
    c->eos_id = 2;
    c->add_bos = 1;
    c->add_dummy_prefix = 1;
    c->escape_spaces = 0;   /* llama2.c's export turned U+2581 back into spaces */
    c->byte_fallback = n_bytes == 256;   /* else unknown bytes become <unk> */
    return finalized(t, err, errlen);
fail:
    tok_free(t);
    return NULL;
}

tok_tokenizer *tokload_llama2c(const char *path, int n_vocab, char *err, size_t errlen)
{
    size_t len;
    char *buf = fio_read_all(path, (size_t)64 << 20, &len, err, errlen);
    if (!buf)
        return NULL;
    tok_tokenizer *t = tokload_llama2c_mem(buf, len, n_vocab, err, errlen);
    free(buf);
    if (!t)
        fio_err_path(err, errlen, path);
    return t;
}

/* ---------- GGUF ---------- */

const char *tokload_gguf_pretok(const char *pre, int *ignore_merges)
{
    static const struct { const char *gguf, *preset; int ignore_merges; } map[] = {
        {"default", "gpt2", 0},   {"gpt-2", "gpt2", 0},     {"gpt2", "gpt2", 0},          {"olmo", "gpt2", 0},
        {"smollm", "smollm", 0},  {"starcoder", "smollm", 0}, {"refact", "smollm", 0},
        {"llama-bpe", "llama3", 1}, {"llama3", "llama3", 1}, {"llama-v3", "llama3", 1},  {"qwen2", "qwen2", 0},
    };
    *ignore_merges = 0;
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (!strcmp(pre, map[i].gguf)) {
            *ignore_merges = map[i].ignore_merges;
            return map[i].preset;
        }
    return NULL;
}

/* Pre-tokenizer for a GGUF tokenizer.ggml.pre name (n bytes). */
static int gguf_pretok(tok_tokenizer *t, const char *pre, size_t n, char *err, size_t errlen)
{
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(n < 63 ? n : 63), pre);
    int ignore = 0;
    const char *preset = tokload_gguf_pretok(name, &ignore);
    if (!preset) {
        snprintf(err, errlen, "GGUF tokenizer.ggml.pre \"%s\" is not supported (%s)", name, TOKLOAD_GGUF_PRETOKS);
        return -1;
    }
    tok_config_of(t)->ignore_merges = ignore;
    return tok_set_pretok_preset(t, preset, err, errlen);
}

tok_tokenizer *tokload_gguf(const gguf_file *g, char *err, size_t errlen)
{
    const char *model, *pre = "default";
    size_t ml, pl = 7;
    uint32_t ty;
    uint64_t n;
    if (gguf_get_str(g, "tokenizer.ggml.model", &model, &ml)) {
        snprintf(err, errlen, "GGUF: no tokenizer (tokenizer.ggml.model is missing)");
        return NULL;
    }
    tok_kind kind;
    if (ml == 5 && !memcmp(model, "llama", 5))
        kind = TOK_SPM;
    else if (ml == 4 && !memcmp(model, "gpt2", 4))
        kind = TOK_BYTELEVEL;
    else {
        snprintf(err, errlen, "GGUF: tokenizer model \"%.*s\" is not supported (llama, gpt2)", (int)(ml < 32 ? ml : 32),
                 model);
        return NULL;
    }
    int kt = gguf_get_arr(g, "tokenizer.ggml.tokens", &ty, &n);
    if (kt < 0 || ty != GGUF_T_STRING || n == 0 || n > (1 << 22)) {
        snprintf(err, errlen, "GGUF: tokenizer.ggml.tokens missing or not a string array of sane length");
        return NULL;
    }
    uint32_t sty = 0, tty = 0;
    uint64_t sn = 0, tn = 0;
    int ks = gguf_get_arr(g, "tokenizer.ggml.scores", &sty, &sn);
    int ktt = gguf_get_arr(g, "tokenizer.ggml.token_type", &tty, &tn);
    if ((ks >= 0 && (sn != n || sty == GGUF_T_STRING)) || (ktt >= 0 && (tn != n || tty == GGUF_T_STRING))) {
        snprintf(err, errlen, "GGUF: tokenizer scores/token_type do not match the %llu tokens", (unsigned long long)n);
        return NULL;
    }
    tok_tokenizer *t = tok_new(kind, (int)n);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t l;
        double score = 0;
        int64_t tt = TOK_TYPE_NORMAL;
        if (gguf_arr_str(g, kt, i, &s, &l) || (ks >= 0 && gguf_arr_float(g, ks, i, &score)) ||
            (ktt >= 0 && gguf_arr_int(g, ktt, i, &tt))) {
            snprintf(err, errlen, "GGUF: tokenizer entry %llu unreadable", (unsigned long long)i);
            goto fail;
        }
        if (tt < 1 || tt > 6)
            tt = TOK_TYPE_NORMAL;
        if (set_token(t, "GGUF", (int)i, s, l, (float)score, (tok_type)tt, err, errlen))
            goto fail;
    }
    tok_config *c = tok_config_of(t);
    int64_t v;
    /* special ids: range-checked as the file's 64-bit values, only then made int */
    static const char *const id_keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                          "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"};
    int *id_dst[] = {&c->bos_id, &c->eos_id, &c->unk_id, &c->pad_id};
    for (int i = 0; i < 4; i++) {
        if (gguf_find(g, id_keys[i]) < 0)
            continue;
        if (gguf_get_int(g, id_keys[i], &v)) {
            snprintf(err, errlen, "GGUF: %s is not an integer token id", id_keys[i]);
            goto fail;
        }
        if (v < -1 || v >= (int64_t)n) {
            snprintf(err, errlen, "GGUF: %s = %lld is outside the vocabulary of %llu tokens", id_keys[i],
                     (long long)v, (unsigned long long)n);
            goto fail;
        }
        *id_dst[i] = (int)v;
    }
    if (kind == TOK_SPM) {
        c->add_bos = 1;
        c->add_dummy_prefix = 1;
        c->escape_spaces = 1;
        c->byte_fallback = 1;
        if (!gguf_get_int(g, "tokenizer.ggml.add_space_prefix", &v)) c->add_dummy_prefix = v != 0;
    } else {
        int km = gguf_get_arr(g, "tokenizer.ggml.merges", &ty, &n);
        if (km < 0 || ty != GGUF_T_STRING) {
            snprintf(err, errlen, "GGUF: byte-level BPE without tokenizer.ggml.merges");
            goto fail;
        }
        for (uint64_t i = 0; i < n; i++) {
            const char *s, *sp;
            size_t l;
            if (gguf_arr_str(g, km, i, &s, &l) || !(sp = memchr(s, ' ', l))) {
                snprintf(err, errlen, "GGUF: merge %llu is not \"left right\"", (unsigned long long)i);
                goto fail;
            }
            if (tok_add_merge(t, s, (size_t)(sp - s), sp + 1, l - (size_t)(sp - s) - 1) < 0) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
        }
        (void)gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pl);
        if (gguf_pretok(t, pre, pl, err, errlen))
            goto fail;
    }
    if (!gguf_get_int(g, "tokenizer.ggml.add_bos_token", &v)) c->add_bos = v != 0;
    if (!gguf_get_int(g, "tokenizer.ggml.add_eos_token", &v)) c->add_eos = v != 0;
    if (c->add_bos && c->bos_id < 0) c->add_bos = 0;
    if (c->add_eos && c->eos_id < 0) c->add_eos = 0;
    return finalized(t, err, errlen);
fail:
    tok_free(t);
    return NULL;
}

/* ---------- HF tokenizer.json ---------- */

/* Apply one pre-tokenizer object; *bytelevel set when a ByteLevel step is present. */
static int hf_pretok(tok_tokenizer *t, json_t *p, int *bytelevel, char *err, size_t errlen)
{
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) {
        snprintf(err, errlen, "tokenizer.json: pre_tokenizer without a type");
        return -1;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(p, "pretokenizers");
        size_t i;
        json_t *x;
        json_array_foreach(arr, i, x)
            if (hf_pretok(t, x, bytelevel, err, errlen))
                return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        *bytelevel = 1;
        if (json_is_true(json_object_get(p, "add_prefix_space")))
            tok_config_of(t)->add_prefix_space = 1;
        json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur))
            return tok_add_pretok_regex(t, TOK_REGEX_GPT2, err, errlen);
        return 0;
    }
    if (!strcmp(type, "Digits"))
        return tok_add_pretok_regex(t, json_is_true(json_object_get(p, "individual_digits")) ? "\\p{N}" : "\\p{N}+",
                                    err, errlen);
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        if (!re || !beh || strcmp(beh, "Isolated") || json_is_true(json_object_get(p, "invert"))) {
            snprintf(err, errlen, "tokenizer.json: only Split with a Regex pattern and Isolated behaviour is supported");
            return -1;
        }
        return tok_add_pretok_regex(t, re, err, errlen);
    }
    snprintf(err, errlen, "tokenizer.json: pre_tokenizer \"%s\" is not supported", type);
    return -1;
}

/* A merges[] entry: "left right" (split at the first space) or ["left", "right"].
 * Pointers borrow from x. Returns 0, or -1 for any other shape. */
static int merge_pair(json_t *x, const char **a, size_t *al, const char **b, size_t *bl)
{
    if (json_is_string(x)) {
        const char *s = json_string_value(x), *sp = strchr(s, ' ');
        if (!sp)
            return -1;
        *a = s; *al = (size_t)(sp - s); *b = sp + 1; *bl = strlen(sp + 1);
        return 0;
    }
    if (json_is_array(x) && json_array_size(x) == 2 && json_is_string(json_array_get(x, 0)) &&
        json_is_string(json_array_get(x, 1))) {
        *a = json_string_value(json_array_get(x, 0)); *al = strlen(*a);
        *b = json_string_value(json_array_get(x, 1)); *bl = strlen(*b);
        return 0;
    }
    return -1;
}

/* SentencePiece-style scores rebuilt from the merge order (tokenizer.json keeps no
 * scores): the first rule that yields a piece gives it -rank, pieces no rule yields score
 * below every rule. Score-driven merging (a GGUF "llama" vocabulary written from this
 * tokenizer) then merges as the rules do. Returns n NEW floats, or NULL on OOM; malformed
 * rules are left for the caller to report. */
static float *spm_scores(json_t *vocab, json_t *merges, int n)
{
    float *sc = malloc((size_t)n * sizeof *sc);
    char *buf = NULL;
    size_t cap = 0, i;
    json_t *x;
    if (!sc)
        return NULL;
    float floor = -(float)json_array_size(merges) - 1.0f;
    for (int k = 0; k < n; k++)
        sc[k] = 1.0f;   /* unset */
    json_array_foreach(merges, i, x) {
        const char *a, *b;
        size_t al, bl;
        if (merge_pair(x, &a, &al, &b, &bl))
            continue;
        if (al + bl + 1 > cap) {
            char *nb = realloc(buf, al + bl + 1);
            if (!nb) {
                free(buf);
                free(sc);
                return NULL;
            }
            buf = nb;
            cap = al + bl + 1;
        }
        memcpy(buf, a, al);
        memcpy(buf + al, b, bl);
        buf[al + bl] = '\0';
        json_t *id = json_object_get(vocab, buf);
        if (json_is_integer(id) && json_integer_value(id) < n && sc[json_integer_value(id)] > 0)
            sc[json_integer_value(id)] = -(float)i;
    }
    for (int k = 0; k < n; k++)
        if (sc[k] > 0)
            sc[k] = floor;
    free(buf);
    return sc;
}

/* `name` in the directory of `path` into out; -1 when it does not fit. */
static int sibling(char *out, size_t cap, const char *path, const char *name)
{
    char dir[PATH_MAX];
    fio_dir_of(path, dir, sizeof dir);
    return fio_path_join(out, cap, dir, name);
}

/* The piece a tokenizer_config.json / special_tokens_map.json entry names: a string or
 * an AddedToken object {"content": ...}; NULL when absent or null. */
static const char *token_name(json_t *v)
{
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_string_value(v);
}

/* BOS/EOS ids the tokenizer.json left unset (its post-processor adds none), from the files
 * HF keeps beside it, first naming wins: tokenizer_config.json and special_tokens_map.json
 * (bos_token / eos_token by piece), then the model's config.json (bos_token_id /
 * eos_token_id; a list names its first). Only the ids are set: whether encode adds a BOS
 * stays the post-processor's decision, as in HF. Returns 0, or -1 with the file and the
 * entry at fault in err. */
static int hf_sibling_ids(tok_tokenizer *t, const char *path, char *err, size_t errlen)
{
    static const char *const files[] = {"tokenizer_config.json", "special_tokens_map.json", "config.json"};
    tok_config *c = tok_config_of(t);
    int *ids[2] = {&c->bos_id, &c->eos_id};
    for (size_t f = 0; f < sizeof files / sizeof *files && (c->bos_id < 0 || c->eos_id < 0); f++) {
        char p[PATH_MAX];
        if (sibling(p, sizeof p, path, files[f]) || !fio_is_file(p))
            continue;
        json_t *j = fio_load_json(p, 0, err, errlen);
        if (!j)
            return -1;
        if (!json_is_object(j)) {
            snprintf(err, errlen, "%s: not a JSON object", p);
            json_decref(j);
            return -1;
        }
        for (int k = 0; k < 2; k++) {
            if (*ids[k] >= 0)
                continue;
            if (f < 2) {
                const char *key = k ? "eos_token" : "bos_token", *name = token_name(json_object_get(j, key));
                if (!name)
                    continue;
                if ((*ids[k] = tok_lookup(t, name, strlen(name))) < 0) {
                    snprintf(err, errlen, "%s: %s \"%.64s\" is not in the vocabulary", p, key, name);
                    json_decref(j);
                    return -1;
                }
                continue;
            }
            const char *key = k ? "eos_token_id" : "bos_token_id";
            json_t *v = json_object_get(j, key);
            if (json_is_array(v))
                v = json_array_get(v, 0);
            if (!v || json_is_null(v))
                continue;
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= tok_n_vocab(t)) {
                snprintf(err, errlen, "%s: %s %lld is not an id of the %d-token vocabulary", p, key,
                         json_is_integer(v) ? (long long)json_integer_value(v) : -1LL, tok_n_vocab(t));
                json_decref(j);
                return -1;
            }
            *ids[k] = (int)json_integer_value(v);
        }
        json_decref(j);
    }
    return 0;
}

/* How a tokenizer.json's normalizer and model decide its kind: SentencePiece style (*spm)
 * with byte fallback, or a normalizer that writes spaces as U+2581 "▁" (Llama-2's Prepend +
 * Replace). Beside a byte-level BPE only NFC (Qwen2's; a Sequence of NFC only, or of
 * nothing) is taken, and not applied: text already in NFC, nearly all text, tokenizes as
 * with it. Any other would change the tokens, and is refused. 0, or -1 with err. */
static int hf_normalizer(json_t *norm, json_t *model, const char *path, int *spm, char *err, size_t errlen)
{
    char *norm_text = norm && !json_is_null(norm) ? json_dumps(norm, JSON_COMPACT) : NULL;
    *spm = json_is_true(json_object_get(model, "byte_fallback")) || (norm_text && strstr(norm_text, "\xe2\x96\x81"));
    free(norm_text);
    const char *nt = json_string_value(json_object_get(norm, "type"));
    int nfc = nt && !strcmp(nt, "NFC");
    if (nt && !strcmp(nt, "Sequence")) {
        json_t *each = json_object_get(norm, "normalizers");
        size_t k;
        json_t *m;
        nfc = json_is_array(each);
        json_array_foreach(each, k, m)
            nfc &= json_is_string(json_object_get(m, "type")) &&
                   !strcmp(json_string_value(json_object_get(m, "type")), "NFC");
    }
    if (!*spm && norm && !json_is_null(norm) && !nfc) {
        snprintf(err, errlen, "%s: normalizer \"%s\" is not supported for a byte-level BPE (NFC is)", path,
                 nt ? nt : "?");
        return -1;
    }
    return 0;
}

tok_tokenizer *tokload_hf_json(const char *path, char *err, size_t errlen)
{
    json_t *j = fio_load_json(path, 0, err, errlen);
    tok_tokenizer *t = NULL;
    float *scores = NULL;
    if (!j)
        return NULL;
    json_t *model = json_object_get(j, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!mtype || strcmp(mtype, "BPE") || !json_is_object(vocab) || !json_is_array(merges)) {
        snprintf(err, errlen, "%s: model type \"%s\" is not supported (BPE with vocab and merges)", path,
                 mtype ? mtype : "?");
        goto fail;
    }
    /* size: max id over vocab and added tokens */
    int64_t maxid = -1;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 22)) {
            snprintf(err, errlen, "%s: vocab entry \"%s\" has a bad id", path, k);
            goto fail;
        }
        if (json_integer_value(v) > maxid) maxid = json_integer_value(v);
    }
    json_t *added = json_object_get(j, "added_tokens");
    size_t i;
    json_t *x;
    json_array_foreach(added, i, x) {
        json_t *id = json_object_get(x, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 22) ||
            !json_is_string(json_object_get(x, "content"))) {
            snprintf(err, errlen, "%s: added_tokens[%zu] needs an id and content", path, i);
            goto fail;
        }
        if (json_integer_value(id) > maxid) maxid = json_integer_value(id);
    }
    json_t *pre = json_object_get(j, "pre_tokenizer");
    json_t *norm = json_object_get(j, "normalizer");
    int spm = 0;
    if (hf_normalizer(norm, model, path, &spm, err, errlen))
        goto fail;
    t = tok_new(spm ? TOK_SPM : TOK_BYTELEVEL, (int)maxid + 1);
    if (!t) {
        snprintf(err, errlen, "out of memory or empty vocabulary");
        goto fail;
    }
    if (spm && !(scores = spm_scores(vocab, merges, (int)maxid + 1)))
        goto oom;
    /* one key per id: two keys for one id have no single meaning (added tokens may
     * restate a vocab entry below) */
    unsigned char *taken = calloc((size_t)maxid + 1, 1);
    if (!taken)
        goto oom;
    json_object_foreach(vocab, k, v) {
        int id = (int)json_integer_value(v);
        size_t l = strlen(k);
        tok_type ty = spm && is_byte_piece(k, l) ? TOK_TYPE_BYTE : TOK_TYPE_NORMAL;
        if (taken[id]) {
            snprintf(err, errlen, "%s: vocab maps \"%.64s\" and \"%.64s\" to the same id %d", path,
                     tok_piece(t, id, NULL), k, id);
            free(taken);
            goto fail;
        }
        taken[id] = 1;
        if (set_token(t, path, id, k, l, scores ? scores[id] : 0.0f, ty, err, errlen)) {
            free(taken);
            goto fail;
        }
    }
    free(taken);
    json_array_foreach(added, i, x) {
        const char *content = json_string_value(json_object_get(x, "content"));
        tok_type ty = json_is_true(json_object_get(x, "special")) ? TOK_TYPE_CONTROL : TOK_TYPE_USER_DEFINED;
        if (set_token(t, path, (int)json_integer_value(json_object_get(x, "id")), content, strlen(content), 0.0f, ty,
                      err, errlen))
            goto fail;
    }
    json_array_foreach(merges, i, x) {
        const char *a, *b;
        size_t al, bl;
        if (merge_pair(x, &a, &al, &b, &bl)) {
            snprintf(err, errlen, "%s: merges[%zu] is neither \"left right\" nor a pair of strings", path, i);
            goto fail;
        }
        if (tok_add_merge(t, a, al, b, bl) < 0)
            goto oom;
    }
    tok_config *c = tok_config_of(t);
    c->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (unk)
        c->unk_id = tok_lookup(t, unk, strlen(unk));
    if (spm) {
        c->escape_spaces = 1;
        c->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
        /* Llama-2 style normalizer: Prepend("▁") then Replace(" ", "▁") */
        char *ns = json_dumps(norm, JSON_COMPACT);
        c->add_dummy_prefix = ns && strstr(ns, "\"Prepend\"") != NULL;
        free(ns);
        if (pre && !json_is_null(pre)) {
            snprintf(err, errlen, "%s: a SentencePiece-style BPE with a pre_tokenizer is not supported", path);
            goto fail;
        }
    } else {
        int bytelevel = 0;
        if (pre && !json_is_null(pre) && hf_pretok(t, pre, &bytelevel, err, errlen))
            goto fail;
        if (!bytelevel) {
            snprintf(err, errlen, "%s: BPE without ByteLevel pre-tokenizer or byte fallback is not supported", path);
            goto fail;
        }
    }
    /* BOS/EOS from the post-processor template ("single": [SpecialToken, Sequence, SpecialToken?]) */
    json_t *single = json_object_get(json_object_get(j, "post_processor"), "single");
    if (json_is_array(single) && json_array_size(single) >= 1) {
        size_t last = json_array_size(single) - 1;
        json_t *first = json_object_get(json_array_get(single, 0), "SpecialToken");
        json_t *end = json_object_get(json_array_get(single, last), "SpecialToken");
        const char *fid = json_string_value(json_object_get(first, "id"));
        const char *eid = last ? json_string_value(json_object_get(end, "id")) : NULL;
        if (fid && (c->bos_id = tok_lookup(t, fid, strlen(fid))) >= 0)
            c->add_bos = 1;
        if (eid && (c->eos_id = tok_lookup(t, eid, strlen(eid))) >= 0)
            c->add_eos = 1;
    }
    if (hf_sibling_ids(t, path, err, errlen) || tok_finalize(t, err, errlen))
        goto fail;
    free(scores);
    json_decref(j);
    return t;
oom:
    snprintf(err, errlen, "out of memory");
fail:
    free(scores);
    tok_free(t);
    json_decref(j);
    return NULL;
}
