/* tests/unit/test_formats_hostile.c — hostile model and tokenizer files, found by fuzzing
 * and by hand: each is refused with an error that names the cause, in bounded time
 * (an alarm turns a hang into a failure) and bounded memory (peak RSS from getrusage).
 * The same files, where small, are in the fuzz corpora (tests/fuzz/make_seeds.py). FIFOs and
 * devices where a model folder holds files are refused by name, never read. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "storage/archjson.h"
#include "storage/ckpt.h"
#include "storage/fileio.h"
#include "storage/gguf.h"
#include "storage/hfconfig.h"
#include "storage/modelio.h"
#include "storage/safetensors.h"
#include "storage/tokload.h"

#include "gguf_image.h"
#include "tiny_model.h"

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ac_hostile_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static long peak_rss_mib(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? -1 : ru.ru_maxrss / 1024;   /* Linux: KiB */
}

/* mio_load_model (or, for a snapshot folder, ckpt_load) on `path` fails naming `needle`,
 * and peak RSS grows by < 128 MiB. Runs in a child process, whose peak starts at the RSS
 * it forks with, so that one check's peak does not hide the next. */
static void expect_refused_load(const char *path, int snapshot, const char *needle)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        eng_backend *be = eng_backend_cpu_new(1);
        eng_model m;
        char err[512] = "";
        long before = peak_rss_mib();
        if (!be || (snapshot ? ckpt_load(path, be, &m, err, sizeof err)
                             : mio_load_model(path, NULL, be, &m, NULL, err, sizeof err)) != -1) {
            fprintf(stderr, "%s: loaded (or no backend)\n", path);
            _exit(1);
        }
        long grew = peak_rss_mib() - before;
        if (!strstr(err, needle)) {
            fprintf(stderr, "%s: error \"%s\" lacks \"%s\"\n", path, err, needle);
            _exit(2);
        }
        if (grew > 128) {
            fprintf(stderr, "%s: refused (%s), but peak RSS grew by %ld MiB first\n", path, err, grew);
            _exit(3);
        }
        eng_backend_free(be);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* A 1 GiB model claimed by a few hundred bytes: hidden 2048, 4 layers of 16 heads and
 * FFN 5632, vocabulary 32000 (270M parameters). The weights are checked against the
 * claim before the engine allocates (and zeroes) it. Here as config.json. */
static void test_config_claims_beyond_weights(void **state)
{
    (void)state;
    char dir[128], p[192];
    snprintf(dir, sizeof dir, "%s/hf", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(p, sizeof p, "%s/config.json", dir);
    const char *cfg = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":2048,\"intermediate_size\":5632,"
                      "\"num_hidden_layers\":4,\"num_attention_heads\":16,\"vocab_size\":32000,"
                      "\"tie_word_embeddings\":true}";
    write_file(p, cfg, strlen(cfg));
    /* the one tensor present has the claimed shape: only the others are missing */
    static const char hdr[] = "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[2048],\"data_offsets\":[0,8192]}}";
    size_t hl = sizeof hdr - 1, n = 8 + hl + 8192;
    uint8_t *st = calloc(1, n);
    assert_non_null(st);
    for (int i = 0; i < 8; i++)
        st[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(st + 8, hdr, hl);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_file(p, st, n);
    free(st);
    expect_refused_load(dir, 0, "model.embed_tokens.weight is missing");
}

/* The same claim as a snapshot folder (prune --out, a distilled student): arch.json and a
 * model.safetensors of no tensors. */
static void test_snapshot_claims_beyond_weights(void **state)
{
    (void)state;
    char dir[128], p[192], err[256];
    snprintf(dir, sizeof dir, "%s/snap", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    json_t *cfg = json_pack("{s:[s],s:i,s:i,s:i,s:i,s:i,s:b}", "architectures", "LlamaForCausalLM", "hidden_size",
                            2048, "intermediate_size", 5632, "num_hidden_layers", 4, "num_attention_heads", 16,
                            "vocab_size", 32000, "tie_word_embeddings", 1);
    arch a;
    assert_int_equal(hfconfig_to_arch(cfg, &a, err, sizeof err), 0);
    json_decref(cfg);
    json_t *aj = arch_to_json(&a);
    arch_free(&a);
    snprintf(p, sizeof p, "%s/arch.json", dir);
    assert_int_equal(json_dump_file(aj, p, 0), 0);
    json_decref(aj);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_file(p, "\x02\0\0\0\0\0\0\0{}", 10);
    expect_refused_load(dir, 1, "is missing");
}

/* A weight that is NaN or infinite (a damaged file, an fp16 conversion that overflowed)
 * is refused at load naming the tensor, rather than spread through every activation and
 * score into a pruned model. llama2.c's first tensor is the token embedding. */
static void test_non_finite_weights(void **state)
{
    (void)state;
    static const uint32_t bad[] = {0x7fc00000u, 0x7f800000u, 0xff800000u};   /* NaN, +Inf, -Inf */
    for (int i = 0; i < 3; i++) {
        char p[192], err[512] = "";
        snprintf(p, sizeof p, "%s/nonfinite%d.bin", tmpdir, i);
        assert_int_equal(tiny_l2c_write(p), 0);
        FILE *f = fopen(p, "r+b");
        assert_non_null(f);
        assert_int_equal(fseek(f, 28 + 4 * 5, SEEK_SET), 0);
        assert_int_equal(fwrite(&bad[i], 4, 1, f), 1);
        assert_int_equal(fclose(f), 0);
        eng_backend *be = eng_backend_cpu_new(1);
        assert_non_null(be);
        eng_model m;
        assert_int_equal(mio_load_model(p, NULL, be, &m, NULL, err, sizeof err), -1);
        if (!strstr(err, "model.embed_tokens.weight") || !strstr(err, "element 5") ||
            !strstr(err, i == 0 ? "NaN" : "infinite"))
            fail_msg("%s: \"%s\"", p, err);
        eng_backend_free(be);
    }
}

/* The same claim as metadata-only GGUF: keys, no tensors. */
static void test_gguf_claims_beyond_weights(void **state)
{
    (void)state;
    char p[192];
    buf kvs = {0};
    kv_str(&kvs, "general.architecture", "llama");
    kv_u32(&kvs, "llama.block_count", 4);
    kv_u32(&kvs, "llama.embedding_length", 2048);
    kv_u32(&kvs, "llama.attention.head_count", 16);
    kv_u32(&kvs, "llama.feed_forward_length", 5632);
    kv_u32(&kvs, "llama.vocab_size", 32000);
    buf img = build(&kvs, 6, NULL, 0);
    snprintf(p, sizeof p, "%s/meta_only.gguf", tmpdir);
    write_file(p, img.p, img.n);
    expect_refused_load(p, 0, "model.embed_tokens.weight is missing");
    free(img.p);
    free(kvs.p);
}

/* Header values out of range are refused naming the key: a context of 2^40 was taken as 0 and
 * reported as "max_position_embeddings: 0 must be positive", a vocabulary of 2^23 as 0, and 0
 * blocks was accepted and reported as a bad head_dim. */
static void test_gguf_values_out_of_range(void **state)
{
    (void)state;
    static const struct { const char *key; uint64_t v; const char *needle; } cases[] = {
        {"llama.context_length", 1ull << 40, "llama.context_length is not an integer in [1, 2^30)"},
        {"llama.vocab_size", 1u << 23, "a vocabulary of 8388608 tokens"},
        {"llama.block_count", 0, "llama.block_count missing or out of range [1, 1024]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char p[192];
        buf kvs = {0};
        int n = 0;
        kv_str(&kvs, "general.architecture", "llama"), n++;
        if (strcmp(cases[i].key, "llama.block_count"))
            kv_u32(&kvs, "llama.block_count", 2), n++;
        kv_u32(&kvs, "llama.embedding_length", 64), n++;
        kv_u32(&kvs, "llama.attention.head_count", 4), n++;
        kv_u32(&kvs, "llama.feed_forward_length", 128), n++;
        kv_u64(&kvs, cases[i].key, cases[i].v), n++;
        buf img = build(&kvs, n, NULL, 0);
        snprintf(p, sizeof p, "%s/range%zu.gguf", tmpdir, i);
        write_file(p, img.p, img.n);
        expect_refused_load(p, 0, cases[i].needle);
        free(img.p);
        free(kvs.p);
    }
}

/* A key written twice (the first copy won) and an alignment that is not an integer (32 was
 * used) are refused, as llama.cpp refuses them. */
static void test_gguf_duplicate_and_mistyped_keys(void **state)
{
    (void)state;
    for (int dup = 1; dup >= 0; dup--) {
        char p[192];
        buf kvs = {0};
        kv_str(&kvs, "general.architecture", "llama");
        kv_u32(&kvs, "llama.block_count", 2);
        kv_u32(&kvs, "llama.embedding_length", 64);
        kv_u32(&kvs, "llama.attention.head_count", 4);
        kv_u32(&kvs, "llama.feed_forward_length", 128);
        if (dup)
            kv_str(&kvs, "general.architecture", "deci");
        else
            kv_str(&kvs, "general.alignment", "32");
        buf img = build(&kvs, 6, NULL, 0);
        snprintf(p, sizeof p, "%s/keys%d.gguf", tmpdir, dup);
        write_file(p, img.p, img.n);
        expect_refused_load(p, 0, dup ? "key general.architecture appears more than once"
                                    : "general.alignment is not an integer");
        free(img.p);
        free(kvs.p);
    }
}

/* A GGUF of metadata only whose alignment (64 KiB) puts the aligned end of its header past
 * the end of the 4 KiB file: nothing lies there to read, and opening it reads only the
 * file (it read up to the alignment, past the map, and crashed). In a child, so that a
 * crash is seen as one. */
static void test_gguf_alignment_past_the_end(void **state)
{
    (void)state;
    buf kvs = {0};
    kv_u32(&kvs, "general.alignment", 65536);
    char *fill = malloc(4019);
    assert_non_null(fill);
    memset(fill, 'a', 4018);
    fill[4018] = 0;
    kv_str(&kvs, "x", fill);
    free(fill);
    buf img = build(&kvs, 2, NULL, 0);
    assert_int_equal(img.n, 4096);
    char p[192];
    snprintf(p, sizeof p, "%s/aligned.gguf", tmpdir);
    write_file(p, img.p, img.n);
    free(img.p);
    free(kvs.p);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        gguf_file g;
        char err[512] = "";
        if (gguf_open(&g, p, err, sizeof err)) {
            fprintf(stderr, "%s: %s\n", p, err);
            _exit(1);
        }
        int ok = g.n_tensors == 0 && gguf_find(&g, "x") >= 0;
        gguf_close(&g);
        _exit(ok ? 0 : 2);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* A safetensors and a GGUF file cut short under their readers: the GGUF's metadata still
 * reads, and a tensor read is an error naming the tensor, also after a test harness (or any code) replaced the SIGBUS handler since the first guarded
 * read (it was installed once, and the second truncation then killed the process). */
static void test_shrinking_safetensors_and_gguf(void **state)
{
    (void)state;
    enum { N = 1 << 20 };
    float *w = calloc(N, sizeof(float)), *out = malloc(N * sizeof(float));
    assert_true(w && out);
    char err[512], p[192];
    for (int round = 0; round < 2; round++) {
        if (round)
            signal(SIGBUS, SIG_DFL);   /* as cmocka does around each test */
        snprintf(p, sizeof p, "%s/shrink%d.safetensors", tmpdir, round);
        st_write_tensor t = {"w", w, {N}, 1};
        assert_int_equal(st_write(p, &t, 1, ST_F32, NULL, err, sizeof err), 0);
        st_file f;
        assert_int_equal(st_open(&f, p, err, sizeof err), 0);
        assert_int_equal(truncate(p, 4096), 0);
        assert_int_equal(st_read_f32(&f, 0, out, N, err, sizeof err), -1);
        if (!strstr(err, "the file ended under it"))
            fail_msg("safetensors, round %d: \"%s\"", round, err);
        st_close(&f);
        buf kvs = {0};
        kv_str(&kvs, "general.architecture", "llama");
        char *desc = malloc(20000);   /* metadata past the first pages */
        assert_non_null(desc);
        memset(desc, 'x', 19999);
        desc[19999] = 0;
        kv_str(&kvs, "general.description", desc);
        free(desc);
        tdesc td = {"w", 1, {N, 0}, 0 /* F32 */, w, (size_t)N * 4};
        buf img = build(&kvs, 2, &td, 1);
        snprintf(p, sizeof p, "%s/shrink%d.gguf", tmpdir, round);
        write_file(p, img.p, img.n);
        free(img.p);
        free(kvs.p);
        gguf_file g;
        assert_int_equal(gguf_open(&g, p, err, sizeof err), 0);
        assert_int_equal(truncate(p, 4096), 0);
        /* metadata reads after the open come from its copy (they faulted in the map) */
        const char *d;
        size_t dl;
        assert_int_equal(gguf_get_str(&g, "general.description", &d, &dl), 0);
        assert_int_equal(dl, 19999);
        assert_int_equal(d[dl - 1], 'x');
        assert_int_equal(gguf_read_f32(&g, 0, out, N, err, sizeof err), -1);
        if (!strstr(err, "the file ended under it"))
            fail_msg("GGUF, round %d: \"%s\"", round, err);
        gguf_close(&g);
    }
    free(w);
    free(out);
}

/* A byte-level GGUF tokenizer of 8 tokens whose special id `key` holds `v` (64 bits). */
static buf gguf_tokenizer_image(const char *key, uint32_t type, uint64_t v)
{
    static const char *toks[] = {"a", "b", "c", "d", "e", "f", "<s>", "</s>"};
    buf kvs = {0};
    kv_str(&kvs, "tokenizer.ggml.model", "gpt2");
    kv_arr_str(&kvs, "tokenizer.ggml.tokens", toks, 8);
    kv_arr_str(&kvs, "tokenizer.ggml.merges", NULL, 0);
    str(&kvs, key); u32(&kvs, type); u64(&kvs, v);
    buf img = build(&kvs, 4, NULL, 0);
    free(kvs.p);
    return img;
}

/* Token ids are range-checked as the 64-bit values in the file: 2^32 + 5 is not 5. */
static void test_gguf_token_ids_beyond_int(void **state)
{
    (void)state;
    static const struct { const char *key; uint32_t type; uint64_t v; const char *shown; } cases[] = {
        {"tokenizer.ggml.bos_token_id", GGUF_T_U64, (1ULL << 32) + 5, "4294967301"},
        {"tokenizer.ggml.eos_token_id", GGUF_T_I64, (uint64_t)(-(int64_t)(1ULL << 32) + 1), "-4294967295"},
        {"tokenizer.ggml.padding_token_id", GGUF_T_U64, 1ULL << 31, "2147483648"},
        {"tokenizer.ggml.unknown_token_id", GGUF_T_U64, (1ULL << 63) + 5, "not an integer"},   /* > INT64_MAX */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        buf img = gguf_tokenizer_image(cases[i].key, cases[i].type, cases[i].v);
        gguf_file g;
        char err[256] = "";
        assert_int_equal(gguf_open_mem(&g, img.p, img.n, err, sizeof err), 0);
        tok_tokenizer *t = tokload_gguf(&g, err, sizeof err);
        if (t)
            fail_msg("%s = %s: accepted (bos %d, eos %d, pad %d)", cases[i].key, cases[i].shown, tok_cfg(t)->bos_id,
                     tok_cfg(t)->eos_id, tok_cfg(t)->pad_id);
        if (!strstr(err, cases[i].key) || !strstr(err, cases[i].shown))
            fail_msg("%s: error \"%s\" does not name the key and %s", cases[i].key, err, cases[i].shown);
        gguf_close(&g);
        free(img.p);
    }
    /* in range it loads, and the id is the one given */
    buf img = gguf_tokenizer_image("tokenizer.ggml.bos_token_id", GGUF_T_U64, 6);
    gguf_file g;
    char err[256];
    assert_int_equal(gguf_open_mem(&g, img.p, img.n, err, sizeof err), 0);
    tok_tokenizer *t = tokload_gguf(&g, err, sizeof err);
    assert_non_null(t);
    assert_int_equal(tok_cfg(t)->bos_id, 6);
    tok_free(t);
    gguf_close(&g);
    free(img.p);
}

/* A minimal byte-level tokenizer.json at `path` with `extra` (a JSON member list, may be
 * "") inside model.vocab after "a" and "b", and `added` as added_tokens. */
static void write_tokenizer_json(const char *path, const char *extra, const char *added)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1%s%s},\"merges\":[]},"
               "\"added_tokens\":[%s],\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}",
            *extra ? "," : "", extra, added);
    assert_int_equal(fclose(f), 0);
}

/* A token longer than the per-token limit is refused as such, not as out of memory:
 * in tokenizer.json (vocab key, added token), GGUF and llama2.c tokenizers. */
static void test_token_over_size_limit(void **state)
{
    (void)state;
    size_t big = TOK_MAX_PIECE_BYTES + 1;
    char *piece = malloc(big + 1), *json = malloc(big + 64), p[192], err[256] = "";
    assert_non_null(piece);
    assert_non_null(json);
    memset(piece, 'x', big);
    piece[big] = '\0';
    snprintf(p, sizeof p, "%s/big_token.json", tmpdir);
    snprintf(json, big + 64, "\"%s\":2", piece);
    write_tokenizer_json(p, json, "");
    assert_null(tokload_hf_json(p, err, sizeof err));
    if (!strstr(err, "over the limit") || !strstr(err, "1048577 bytes"))
        fail_msg("vocab: error \"%s\" does not name the size limit", err);
    snprintf(json, big + 64, "{\"id\":2,\"content\":\"%s\"}", piece);
    write_tokenizer_json(p, "", json);
    assert_null(tokload_hf_json(p, err, sizeof err));
    if (!strstr(err, "over the limit"))
        fail_msg("added_tokens: error \"%s\" does not name the size limit", err);
    const char *toks[] = {"a", "b", piece};
    buf kvs = {0};
    kv_str(&kvs, "tokenizer.ggml.model", "gpt2");
    kv_arr_str(&kvs, "tokenizer.ggml.tokens", toks, 3);
    kv_arr_str(&kvs, "tokenizer.ggml.merges", NULL, 0);
    buf img = build(&kvs, 3, NULL, 0);
    gguf_file g;
    assert_int_equal(gguf_open_mem(&g, img.p, img.n, err, sizeof err), 0);
    assert_null(tokload_gguf(&g, err, sizeof err));
    if (!strstr(err, "token 2") || !strstr(err, "over the limit"))
        fail_msg("GGUF: error \"%s\" does not name the token and the size limit", err);
    gguf_close(&g);
    free(img.p);
    free(kvs.p);
    /* llama2.c tokenizers keep their own limit of 4096 bytes */
    buf l2 = {0};
    u32(&l2, 5000);
    for (int i = 0; i < 3; i++) {
        float score = 0;
        uint32_t n = i == 2 ? 5000 : 1;
        put(&l2, &score, 4);
        u32(&l2, n);
        put(&l2, piece, n);
    }
    assert_null(tokload_llama2c_mem(l2.p, l2.n, 3, err, sizeof err));
    if (!strstr(err, "token 2") || !strstr(err, "over the limit of 4096"))
        fail_msg("llama2.c: error \"%s\" does not name the token and the size limit", err);
    free(l2.p);
    free(json);
    free(piece);
}

/* A vocab mapping 18 keys to one id never finished loading (every key took a table
 * slot); now it is refused, naming the id. Alarm: a hang fails. */
static void test_tokenizer_json_duplicate_ids(void **state)
{
    (void)state;
    char extra[512] = "", p[192], err[256] = "";
    size_t o = 0;
    for (int i = 0; i < 18; i++)
        o += (size_t)snprintf(extra + o, sizeof extra - o, "%s\"k%02d\":2", i ? "," : "", i);
    snprintf(p, sizeof p, "%s/dup_ids.json", tmpdir);
    write_tokenizer_json(p, extra, "");
    alarm(20);
    tok_tokenizer *t = tokload_hf_json(p, err, sizeof err);
    alarm(0);
    if (t)
        fail_msg("accepted a vocab with 18 keys for id 2");
    if (!strstr(err, "same id 2"))
        fail_msg("error \"%s\" does not name the shared id", err);
    /* an added token may restate a vocab entry's id (tokenizers write them so) */
    write_tokenizer_json(p, "\"<s>\":2", "{\"id\":2,\"content\":\"<s>\",\"special\":true}");
    t = tokload_hf_json(p, err, sizeof err);
    if (!t)
        fail_msg("added token restating a vocab id: %s", err);
    assert_int_equal(tok_lookup(t, "<s>", 3), 2);
    assert_int_equal(tok_type_of(t, 2), TOK_TYPE_CONTROL);
    tok_free(t);
}

/* A FIFO or a device where a model directory holds a file: refused naming it, never opened
 * for a blocking read (the alarm turns a hang into a failure). The index of an HF folder,
 * a shard it names, a pruned folder's arch.json and model.safetensors, and /dev/zero given
 * as any file that is read whole. */
static void test_fifos_inside_model_dirs(void **state)
{
    (void)state;
    char d[160], p[224], err[512];
    static const char cfg[] = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":8,\"intermediate_size\":16,"
                              "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"vocab_size\":16}";
    eng_backend *be = eng_backend_cpu_new(1);
    eng_model m;
    alarm(20);
    /* the index is a FIFO */
    snprintf(d, sizeof d, "%s/fifo_index", tmpdir);
    assert_int_equal(mkdir(d, 0755), 0);
    snprintf(p, sizeof p, "%s/config.json", d);
    write_file(p, cfg, strlen(cfg));
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    write_file(p, "\x02\0\0\0\0\0\0\0{}", 10);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    assert_int_equal(mkfifo(p, 0644), 0);
    assert_int_equal(mio_load_model(d, NULL, be, &m, NULL, err, sizeof err), -1);
    if (!strstr(err, "model.safetensors.index.json: not a regular file (a FIFO)"))
        fail_msg("FIFO index: \"%s\"", err);
    /* a shard the index names is a FIFO */
    assert_int_equal(unlink(p), 0);
    static const char ix[] = "{\"weight_map\":{\"model.norm.weight\":\"model-00001-of-00001.safetensors\"}}";
    write_file(p, ix, strlen(ix));
    snprintf(p, sizeof p, "%s/model-00001-of-00001.safetensors", d);
    assert_int_equal(mkfifo(p, 0644), 0);
    assert_int_equal(mio_load_model(d, NULL, be, &m, NULL, err, sizeof err), -1);
    if (!strstr(err, "model-00001-of-00001.safetensors: not a regular file (a FIFO)"))
        fail_msg("FIFO shard: \"%s\"", err);
    /* a pruned folder's arch.json, then its weights */
    snprintf(d, sizeof d, "%s/fifo_ckpt", tmpdir);
    assert_int_equal(mkdir(d, 0755), 0);
    snprintf(p, sizeof p, "%s/arch.json", d);
    assert_int_equal(mkfifo(p, 0644), 0);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    write_file(p, "\x02\0\0\0\0\0\0\0{}", 10);
    assert_int_equal(ckpt_load(d, be, &m, err, sizeof err), -1);
    if (!strstr(err, "arch.json: not a regular file (a FIFO)"))
        fail_msg("FIFO arch.json: \"%s\"", err);
    /* a --tokenizer that is a FIFO, a folder or missing: named as the tokenizer's fault (it was
       \"MODEL: no tokenizer found at PATH (give one with --tokenizer)\", after every weight loaded) */
    const char *sh = getenv("AC_SHARED");
    char model[512], tp[224];
    snprintf(model, sizeof model, "%s/data/models/stories260K/stories260K.bin", sh ? sh : "../shared");
    snprintf(tp, sizeof tp, "%s/tok.fifo", tmpdir);
    assert_int_equal(mkfifo(tp, 0644), 0);
    tok_tokenizer *tk = NULL;
    assert_int_equal(mio_load_model(model, tp, be, &m, &tk, err, sizeof err), -1);
    assert_null(tk);
    if (!strstr(err, "tok.fifo: not a regular file") || strstr(err, "give one with --tokenizer"))
        fail_msg("FIFO tokenizer: \"%s\"", err);
    assert_int_equal(mio_load_model(model, tmpdir, be, &m, &tk, err, sizeof err), -1);
    assert_non_null(strstr(err, "a directory, not a tokenizer file"));
    snprintf(tp, sizeof tp, "%s/absent.bin", tmpdir);
    assert_int_equal(mio_load_model(model, tp, be, &m, &tk, err, sizeof err), -1);
    assert_non_null(strstr(err, "absent.bin: No such file or directory"));
    /* a model file cut short after it was opened (rewritten in place while a job loads it):
       the read of its tail raised SIGBUS and killed the process; now an error names it */
    char copy[224];
    snprintf(copy, sizeof copy, "%s/shrinking.bin", tmpdir);
    size_t mlen;
    char *bytes = fio_read_all(model, 0, &mlen, err, sizeof err);
    assert_non_null(bytes);
    write_file(copy, bytes, mlen);
    free(bytes);
    mio_model mm;
    assert_int_equal(mio_open(&mm, copy, NULL, err, sizeof err), 0);
    assert_int_equal(truncate(copy, 20000), 0);
    float *buf = malloc(sizeof(float) * (1 << 20));
    assert_non_null(buf);
    int failed = -1;
    for (int i = 0; i < mm.n_tensors && failed < 0; i++)
        if (mio_read_tensor(&mm, i, buf, 1 << 20, err, sizeof err))
            failed = i;
    if (failed < 0)
        fail_msg("every tensor of the shrunk file read");
    if (!strstr(err, "the file ended under it"))
        fail_msg("shrunk file: \"%s\"", err);
    free(buf);
    mio_close(&mm);
    /* whole-file reads of a device */
    size_t n;
    assert_null(fio_read_all("/dev/zero", 0, &n, err, sizeof err));
    if (!strstr(err, "/dev/zero: not a regular file (a character device)"))
        fail_msg("/dev/zero: \"%s\"", err);
    assert_null(fio_load_json("/dev/zero", 0, err, sizeof err));
    assert_non_null(strstr(err, "a character device"));
    /* what a user names on a command line may be a pipe (a secret, `<(zcat ...)`): read until
       its writer closes it (it was refused since fio_read_all holds to regular files) */
    char pipe_path[224];
    snprintf(pipe_path, sizeof pipe_path, "%s/secret.fifo", tmpdir);
    assert_int_equal(mkfifo(pipe_path, 0600), 0);
    fflush(NULL);
    pid_t writer = fork();
    assert_true(writer >= 0);
    if (writer == 0) {
        FILE *w = fopen(pipe_path, "w");
        _exit(w && fputs("access_key = a\nsecret_key = b\n", w) >= 0 && fclose(w) == 0 ? 0 : 1);
    }
    char *got = fio_read_input(pipe_path, 1 << 16, &n, err, sizeof err);
    assert_non_null(got);
    assert_string_equal(got, "access_key = a\nsecret_key = b\n");
    free(got);
    int ws;
    assert_int_equal(waitpid(writer, &ws, 0), writer);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    assert_null(fio_read_input("/dev/zero", 0, &n, err, sizeof err));
    assert_non_null(strstr(err, "a character device"));
    alarm(0);
    eng_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_claims_beyond_weights),
        cmocka_unit_test(test_gguf_claims_beyond_weights),
        cmocka_unit_test(test_snapshot_claims_beyond_weights),
        cmocka_unit_test(test_non_finite_weights),
        cmocka_unit_test(test_gguf_values_out_of_range),
        cmocka_unit_test(test_gguf_duplicate_and_mistyped_keys),
        cmocka_unit_test(test_gguf_alignment_past_the_end),
        cmocka_unit_test(test_shrinking_safetensors_and_gguf),
        cmocka_unit_test(test_gguf_token_ids_beyond_int),
        cmocka_unit_test(test_token_over_size_limit),
        cmocka_unit_test(test_tokenizer_json_duplicate_ids),
        cmocka_unit_test(test_fifos_inside_model_dirs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
