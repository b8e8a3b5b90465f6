/* tests/unit/test_distill_textdata.c — reading calibration/distillation text in every
 * format, seeded packing into train/validation streams, batching with a cursor, and
 * the atomic file write (also from two threads at once). Uses a byte-per-token encoder so
 * counts are checkable.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "compress/textdata.h"
#include "storage/fileio.h"

static char dir[] = "/tmp/ac_td_XXXXXX";

static void write_file(const char *name, const char *text, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

static int byte_enc(void *ctx, const char *text, size_t len, int **ids, size_t *n, char *err, size_t errlen)
{
    (void)ctx;
    (void)err;
    (void)errlen;
    *ids = malloc((len ? len : 1) * sizeof **ids);
    if (!*ids)
        return -1;
    for (size_t i = 0; i < len; i++)
        (*ids)[i] = (unsigned char)text[i];
    *n = len;
    return 0;
}

static void test_plain_paragraphs(void **state)
{
    (void)state;
    char path[512], err[256];
    write_file("a.txt", "first line\r\nsame doc\r\n\r\n\r\nsecond doc\n\nthird", path, sizeof path);
    td_docs d;
    assert_int_equal(td_read_docs(path, TD_FMT_AUTO, &d, err, sizeof err), 0);
    assert_int_equal(d.n, 3);
    assert_string_equal(d.text[0], "first line\nsame doc");
    assert_string_equal(d.text[1], "second doc");
    assert_string_equal(d.text[2], "third");
    assert_int_equal(td_detect_format(path), TD_FMT_PLAIN);
    td_docs_free(&d);
}

static void test_jsonl(void **state)
{
    (void)state;
    char path[512], err[256];
    write_file("c4.jsonl", "{\"text\":\"one\\ntwo\",\"url\":\"x\"}\n\n{\"text\":\"three\"}\n", path, sizeof path);
    td_docs d;
    assert_int_equal(td_read_docs(path, TD_FMT_AUTO, &d, err, sizeof err), 0);
    assert_int_equal(d.n, 2);
    assert_string_equal(d.text[0], "one\ntwo");
    assert_string_equal(d.text[1], "three");
    td_docs_free(&d);
    write_file("bad.jsonl", "{\"text\":\"ok\"}\n{\"txt\":\"no\"}\n", path, sizeof path);
    assert_int_equal(td_read_docs(path, TD_FMT_AUTO, &d, err, sizeof err), -1);
    assert_non_null(strstr(err, ":2:"));
    write_file("bad2.jsonl", "{\"text\":\"ok\"}\n{broken\n", path, sizeof path);
    assert_int_equal(td_read_docs(path, TD_FMT_AUTO, &d, err, sizeof err), -1);
    assert_non_null(strstr(err, "bad JSON"));
}

static void test_stories(void **state)
{
    (void)state;
    char path[512], err[256];
    write_file("s.txt", "Once upon a time.\n\nThe end.\n<|endoftext|>\nSecond story.\n<|endoftext|>\n", path, sizeof path);
    td_docs d;
    assert_int_equal(td_read_docs(path, TD_FMT_AUTO, &d, err, sizeof err), 0);
    assert_int_equal(d.n, 2);
    assert_string_equal(d.text[0], "Once upon a time.\n\nThe end.");
    assert_string_equal(d.text[1], "Second story.");
    td_docs_free(&d);
    assert_int_equal(td_read_docs("/nonexistent/file.txt", TD_FMT_AUTO, &d, err, sizeof err), -1);
    write_file("empty.txt", "\n\n  \n", path, sizeof path);
    assert_int_equal(td_read_docs(path, TD_FMT_AUTO, &d, err, sizeof err), -1);
    assert_non_null(strstr(err, "no documents"));
}

static void test_shared_tinystories(void **state)
{
    (void)state;
    const char *shared = getenv("AC_SHARED");
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/data/text/tinystories/validation_100.txt", shared ? shared : "../shared");
    if (access(path, R_OK)) {
        snprintf(path, sizeof path, "/work/shared/data/text/tinystories/validation_100.txt");
        if (access(path, R_OK))
            skip();
    }
    td_docs d;
    assert_int_equal(td_read_docs(path, TD_FMT_AUTO, &d, err, sizeof err), 0);
    assert_true(d.n >= 99 && d.n <= 101);
    for (size_t i = 0; i < d.n; i++)
        assert_null(strstr(d.text[i], "endoftext"));
    td_docs_free(&d);
}

static void make_docs(td_docs *d, int n)
{
    d->n = (size_t)n;
    d->text = calloc((size_t)n, sizeof *d->text);
    d->len = calloc((size_t)n, sizeof *d->len);
    for (int i = 0; i < n; i++) {
        char buf[64];
        snprintf(buf, sizeof buf, "doc%02d-%.*s", i, i % 7 + 1, "abcdefgh");
        d->text[i] = strdup(buf);
        d->len[i] = strlen(buf);
    }
}

static void test_pack_split_seed(void **state)
{
    (void)state;
    td_docs d;
    make_docs(&d, 40);
    size_t bytes = 0;
    for (size_t i = 0; i < d.n; i++)
        bytes += d.len[i];
    td_pack_opts o = {.seed = 7, .val_fraction = 0.1, .sep_token = 300};
    td_stream tr, va, tr2, va2, tr3, va3;
    char err[256];
    assert_int_equal(td_pack(&d, byte_enc, NULL, &o, &tr, &va, err, sizeof err), 0);
    /* every byte lands in exactly one stream, one separator per document */
    assert_int_equal(tr.n + va.n, bytes + d.n);
    size_t seps = 0;
    for (size_t i = 0; i < va.n; i++)
        seps += va.ids[i] == 300;
    assert_int_equal(seps, 4);
    assert_int_equal(tr.ids[0], 300);
    assert_int_equal(td_pack(&d, byte_enc, NULL, &o, &tr2, &va2, err, sizeof err), 0);
    assert_int_equal(tr.n, tr2.n);
    assert_memory_equal(tr.ids, tr2.ids, tr.n * sizeof(int));
    o.seed = 8;
    assert_int_equal(td_pack(&d, byte_enc, NULL, &o, &tr3, &va3, err, sizeof err), 0);
    assert_true(tr.n != tr3.n || memcmp(tr.ids, tr3.ids, tr.n * sizeof(int)) != 0);
    td_stream_free(&tr2);
    td_stream_free(&va2);
    td_stream_free(&tr3);
    td_stream_free(&va3);
    /* token cap */
    o.max_tokens = 50;
    assert_int_equal(td_pack(&d, byte_enc, NULL, &o, &tr2, NULL, err, sizeof err), 0);
    assert_int_equal(tr2.n, 50);
    td_stream_free(&tr2);
    td_stream_free(&tr);
    td_stream_free(&va);
    td_docs_free(&d);
    /* a single document: the last tokens are held out */
    make_docs(&d, 1);
    o.max_tokens = 0;
    o.val_fraction = 0.25;
    o.sep_token = -1;
    assert_int_equal(td_pack(&d, byte_enc, NULL, &o, &tr, &va, err, sizeof err), 0);
    assert_int_equal(tr.n + va.n, d.len[0]);
    assert_int_equal(va.n, d.len[0] / 4);
    assert_int_equal(va.ids[va.n - 1], (unsigned char)d.text[0][d.len[0] - 1]);
    td_stream_free(&tr);
    td_stream_free(&va);
    td_docs_free(&d);
}

typedef struct {
    int calls;
    size_t longest;
    int ends_ok;   /* every piece but the last ended as `cut` says */
    size_t left;
    int cut;       /* '\n': after a newline; ' ': before a space; 'u': at a UTF-8 character's start */
} enc_seen;

static int seen_enc(void *ctx, const char *text, size_t len, int **ids, size_t *n, char *err, size_t errlen)
{
    enc_seen *e = ctx;
    e->calls++;
    e->longest = len > e->longest ? len : e->longest;
    e->left -= len;
    if (e->left > 0 && (e->cut == '\n'  ? text[len - 1] != '\n'
                        : e->cut == ' ' ? text[len] != ' '
                                        : ((unsigned char)text[len] & 0xc0) == 0x80))
        e->ends_ok = 0;
    return byte_enc(NULL, text, len, ids, n, err, errlen);
}

/* A document of 40 MiB (a file with no blank line) is encoded in pieces of at most 16 MiB,
 * each cut after a newline, every byte once; with a token cap, only until the cap. */
static void test_long_document(void **state)
{
    (void)state;
    size_t len = (size_t)40 << 20;
    char *text = malloc(len);
    assert_non_null(text);
    for (size_t i = 0; i < len; i++)
        text[i] = i % 1000 == 999 ? '\n' : (char)('a' + i % 26);
    size_t one = len;
    td_docs d = {&text, &one, 1};
    td_pack_opts o = {.seed = 1, .sep_token = -1};
    td_stream tr, va;
    char err[256];
    enc_seen e = {.ends_ok = 1, .left = len, .cut = '\n'};
    assert_int_equal(td_pack(&d, seen_enc, &e, &o, &tr, &va, err, sizeof err), 0);
    assert_int_equal(tr.n, len);
    for (size_t i = 0; i < len; i += 4099)
        assert_int_equal(tr.ids[i], (unsigned char)text[i]);
    assert_int_equal(e.calls, 3);
    assert_true(e.longest <= ((size_t)16 << 20) && e.ends_ok);
    td_stream_free(&tr);
    td_stream_free(&va);
    o.max_tokens = 1000;
    e = (enc_seen){.ends_ok = 1, .left = len, .cut = '\n'};
    assert_int_equal(td_pack(&d, seen_enc, &e, &o, &tr, NULL, err, sizeof err), 0);
    assert_int_equal(tr.n, 1000);
    assert_int_equal(e.calls, 1);
    td_stream_free(&tr);
    /* no newline: cut before a space; no space either: at a character's start ("é" is 2 bytes,
     * 3 "é" then "a": no cut point lines up with 16 MiB by chance) */
    o.max_tokens = 0;
    for (int mode = 0; mode < 2; mode++) {
        for (size_t i = 0; i < len; i++)
            text[i] = mode == 0 ? (i % 10 == 9 ? ' ' : 'w') : (char)"\xc3\xa9\xc3\xa9\xc3\xa9" "a"[i % 7];
        e = (enc_seen){.ends_ok = 1, .left = len, .cut = mode == 0 ? ' ' : 'u'};
        assert_int_equal(td_pack(&d, seen_enc, &e, &o, &tr, NULL, err, sizeof err), 0);
        assert_int_equal(tr.n, len);
        assert_true(e.calls == 3 && e.ends_ok);
        td_stream_free(&tr);
    }
    free(text);
}

static void test_batch_cursor(void **state)
{
    (void)state;
    int ids[10];
    for (int i = 0; i < 10; i++)
        ids[i] = i;
    td_stream s = {ids, 10};
    int tok[8], tgt[8];
    uint64_t cur = 0;
    assert_int_equal(td_batch(&s, &cur, 2, 4, tok, tgt), 0);
    int e_tok[8] = {0, 1, 2, 3, 4, 5, 6, 7}, e_tgt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_memory_equal(tok, e_tok, sizeof tok);
    assert_memory_equal(tgt, e_tgt, sizeof tgt);
    assert_int_equal(cur, 8);
    /* next window would pass the end: wraps to 0 */
    assert_int_equal(td_batch(&s, &cur, 1, 4, tok, tgt), 0);
    assert_int_equal(tok[0], 0);
    assert_int_equal(tgt[3], 4);
    assert_int_equal(cur, 4);
    assert_int_equal(td_batch(&s, &cur, 1, 10, tok, NULL), -1);
}

static void test_write_atomic(void **state)
{
    (void)state;
    char path[512], err[256], buf[64] = {0};
    snprintf(path, sizeof path, "%s/atomic.json", dir);
    assert_int_equal(fio_write_atomic(path, "{\"a\":1}", 7, err, sizeof err), 0);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(buf, 1, sizeof buf, f), 7);
    fclose(f);
    assert_string_equal(buf, "{\"a\":1}");
    char **names;
    size_t n;
    assert_int_equal(fio_list_dir(dir, &names, &n), 0);
    for (size_t i = 0; i < n; i++)
        if (strstr(names[i], "atomic.json.tmp"))
            fail_msg("a temporary file was left: %s", names[i]);
    fio_names_free(names, n);
    assert_int_equal(fio_write_atomic("/nonexistent/dir/x", "a", 1, err, sizeof err), -1);
}

#define RACE_BYTES (256 << 10)
#define RACE_WRITES 40

static char race_path[512];
static int race_done;

/* Writes race_path RACE_WRITES times, all bytes its own letter; the count of failures. */
static void *race_writer(void *arg)
{
    char *buf = malloc(RACE_BYTES), err[256];
    intptr_t failed = 0;
    if (!buf)
        return (void *)(intptr_t)RACE_WRITES;
    memset(buf, (int)(intptr_t)arg, RACE_BYTES);
    for (int i = 0; i < RACE_WRITES; i++)
        failed += fio_write_atomic(race_path, buf, RACE_BYTES, err, sizeof err) != 0;
    free(buf);
    __atomic_fetch_add(&race_done, 1, __ATOMIC_SEQ_CST);
    return (void *)failed;
}

/* Two threads of one process (an API's request threads importing one calibration) write
 * the same path at once: every write succeeds, and what the path holds is always one
 * write whole, never a mix or a cut. */
static void test_write_atomic_threads(void **state)
{
    (void)state;
    snprintf(race_path, sizeof race_path, "%s/race.bin", dir);
    pthread_t a, b;
    assert_int_equal(pthread_create(&a, NULL, race_writer, (void *)(intptr_t)'a'), 0);
    assert_int_equal(pthread_create(&b, NULL, race_writer, (void *)(intptr_t)'b'), 0);
    int torn = 0;
    char *got = malloc(RACE_BYTES + 1);
    assert_non_null(got);
    for (int last = 0; !last;) {   /* while they write, and once after */
        last = __atomic_load_n(&race_done, __ATOMIC_SEQ_CST) == 2;
        FILE *f = fopen(race_path, "rb");
        if (!f) {
            assert_false(last);   /* not written yet */
            sched_yield();
            continue;
        }
        size_t k = fread(got, 1, RACE_BYTES + 1, f);
        fclose(f);
        if (k != RACE_BYTES || (got[0] != 'a' && got[0] != 'b') || memchr(got, got[0] == 'a' ? 'b' : 'a', k) ||
            memchr(got, 0, k))
            torn++;
    }
    free(got);
    void *fa, *fb;
    assert_int_equal(pthread_join(a, &fa), 0);
    assert_int_equal(pthread_join(b, &fb), 0);
    assert_int_equal((intptr_t)fa, 0);
    assert_int_equal((intptr_t)fb, 0);
    assert_int_equal(torn, 0);
}

static void test_remove_tree(void **state)
{
    (void)state;
    char root[512], p[700];
    snprintf(root, sizeof root, "%s/tree", dir);
    snprintf(p, sizeof p, "%s/a/b/c", root);
    assert_int_equal(fio_mkdirs(p), 0);
    snprintf(p, sizeof p, "%s/a/b/c/f.bin", root);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fclose(f);
    /* a link to a file outside the tree goes, its target stays */
    char outside[512], link[700];
    snprintf(outside, sizeof outside, "%s/outside.txt", dir);
    f = fopen(outside, "wb");
    assert_non_null(f);
    fclose(f);
    snprintf(link, sizeof link, "%s/a/link", root);
    assert_int_equal(symlink(outside, link), 0);
    assert_int_equal(fio_remove_tree(root), 0);
    assert_int_not_equal(access(root, F_OK), 0);
    assert_int_equal(access(outside, F_OK), 0);
    assert_int_equal(fio_remove_tree(root), 0);   /* absent: nothing to do */
}

int main(void)
{
    if (!mkdtemp(dir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_paragraphs), cmocka_unit_test(test_jsonl),
        cmocka_unit_test(test_stories),          cmocka_unit_test(test_shared_tinystories),
        cmocka_unit_test(test_pack_split_seed),  cmocka_unit_test(test_batch_cursor),
        cmocka_unit_test(test_write_atomic),     cmocka_unit_test(test_write_atomic_threads),
        cmocka_unit_test(test_remove_tree),      cmocka_unit_test(test_long_document),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return rc;
}
