/* tests/unit/test_api_dispatch.c — the API layer without HTTP: route lookup (404, 405
 * with Allow, HEAD on GET routes, greedy artifact names), problem+json shape, job
 * creation with idempotency replay and mismatch, query-parameter bounds, ETag/304,
 * artifact downloads (Range 206/416, If-Range, If-None-Match, digest headers), a rotted
 * blob repaired while it downloads, and a download racing the job's DELETE, through api_dispatch on a real store and artifact
 * store in a temporary directory. The test's own open() lets the DELETE land between
 * the artifact's row being read and its content being opened; its own store_idem_get
 * (linked over the store's with --wrap) lets a DELETE land after a replay's look-up.
 */
/* ldflags: -Wl,--wrap=store_idem_get */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "api/api.h"
#include "tiny_model.h"
#include "storage/artstore.h"
#include "storage/store.h"

static char dir[64], models[128];
static api_ctx ctx;
static char *roots[1];

/* open(), for the product's code this test links too: when armed with a path and a job,
 * the first open of that path first deletes the job (finished, then removed as DELETE
 * does), as a DELETE on another thread may between a download's row read and its open. */
static char race_path[4096], race_job[48];

int open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    if (race_job[0] && !strcmp(path, race_path)) {
        char id[48], err[256];
        snprintf(id, sizeof id, "%s", race_job);
        race_job[0] = 0;
        if (store_job_finish(ctx.st, id, "cancelled", NULL, NULL) != 0 ||
            store_job_remove(ctx.st, ctx.as, id, 5, err, sizeof err) != 0)
            fprintf(stderr, "the racing delete of %s failed\n", id);
    }
    return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

/* store_idem_get, for the product's code (-Wl,--wrap): when armed with a job, a record
 * found is followed by that job's DELETE (finished, then removed, its idempotency records
 * with it), as a DELETE on another thread may land between a replay's look-up and its
 * answer. */
static char idem_race_job[48];
int __real_store_idem_get(store *st, const char *scope, const char *key, char sha256_out[65], int *resp_status,
                          char **resp_text);
int __wrap_store_idem_get(store *st, const char *scope, const char *key, char sha256_out[65], int *resp_status,
                          char **resp_text);
int __wrap_store_idem_get(store *st, const char *scope, const char *key, char sha256_out[65], int *resp_status,
                          char **resp_text)
{
    int rc = __real_store_idem_get(st, scope, key, sha256_out, resp_status, resp_text);
    if (rc == 0 && idem_race_job[0]) {
        char id[48], err[256];
        snprintf(id, sizeof id, "%s", idem_race_job);
        idem_race_job[0] = 0;
        if (store_job_finish(st, id, "cancelled", NULL, NULL) != 0 ||
            store_job_remove(st, ctx.as, id, 5, err, sizeof err) != 0)
            fprintf(stderr, "the racing delete of %s failed\n", id);
    }
    return rc;
}

/* Fake request headers and query: "name", "value" pairs. */
typedef struct {
    const char *const *hdrs;
    const char *const *query;
} kv;

static const char *find(const char *const *list, const char *key, int ci)
{
    for (int i = 0; list && list[i]; i += 2)
        if (ci ? !strcasecmp(list[i], key) : !strcmp(list[i], key))
            return list[i + 1];
    return NULL;
}
static const char *q_fn(void *h, const char *k) { return find(((kv *)h)->query, k, 0); }
static const char *h_fn(void *h, const char *k) { return find(((kv *)h)->hdrs, k, 1); }

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ac-api-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(models, sizeof models, "%s/models", dir);
    assert_int_equal(mkdir(models, 0755), 0);
    char p[256], err[256];
    snprintf(p, sizeof p, "%s/tiny.bin", models);
    assert_int_equal(tiny_l2c_write(p), 0);
    assert_int_equal(tiny_l2c_tok_write(models), 0);
    snprintf(p, sizeof p, "%s/calib.txt", models);
    FILE *cf = fopen(p, "w");
    assert_non_null(cf);
    assert_true(fputs("Once upon a time.\n", cf) >= 0);
    assert_int_equal(fclose(cf), 0);
    snprintf(p, sizeof p, "%s/t.db", dir);
    ctx.st = store_open(p, err, sizeof err);
    assert_non_null(ctx.st);
    snprintf(p, sizeof p, "%s/artifacts", dir);
    ctx.as = art_open(p, err, sizeof err);
    assert_non_null(ctx.as);
    roots[0] = models;
    ctx.roots = roots;
    ctx.n_roots = 1;
    ctx.data_dir = dir;
    ctx.max_wait_s = 5;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    art_close(ctx.as);
    store_close(ctx.st);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Dispatch method path with body/headers/query; resp must be freed by the caller. */
static void call(const char *method, const char *path, const char *body, const char *const *hdrs,
                 const char *const *query, api_resp *resp)
{
    kv h = {hdrs, query};
    char allow[128];
    api_resp_init(resp);
    int route = api_route_find(method, path, allow, sizeof allow);
    assert_true(route >= 0);
    api_req req = {method, path, q_fn, h_fn, &h, body ? body : "", body ? strlen(body) : 0, "req_test", 0};
    api_dispatch(&ctx, route, &req, resp);
}

static const char *header(const api_resp *r, const char *name)
{
    for (int i = 0; i < r->nhdr; i++)
        if (!strcasecmp(r->hdr[i].name, name))
            return r->hdr[i].value;
    return NULL;
}

static void test_routes(void **state)
{
    (void)state;
    char allow[128];
    assert_true(api_route_find("GET", "/v1/jobs", allow, sizeof allow) >= 0);
    assert_true(api_route_find("HEAD", "/v1/jobs/job_1", allow, sizeof allow) >= 0);
    assert_int_equal(api_route_find("GET", "/v1/jobz", allow, sizeof allow), -404);
    assert_int_equal(api_route_find("GET", "/v1/jobs/", allow, sizeof allow), -404);
    assert_int_equal(api_route_find("GET", "/v1/jobs/a/b/c", allow, sizeof allow), -404);
    assert_int_equal(api_route_find("PUT", "/v1/jobs", allow, sizeof allow), -405);
    assert_string_equal(allow, "GET, POST, HEAD");
    assert_int_equal(api_route_find("GET", "/v1/jobs/x/cancel", allow, sizeof allow), -405);
    assert_string_equal(allow, "POST");
    int r = api_route_find("GET", "/v1/jobs/x/artifacts/a/b", allow, sizeof allow);
    assert_true(r >= 0); /* greedy: the handler refuses the name with a 400 */
    assert_false(api_route_writes(r));
    assert_true(api_route_writes(api_route_find("DELETE", "/v1/jobs/x", allow, sizeof allow)));
    assert_true(api_route_has_body(api_route_find("POST", "/v1/jobs", allow, sizeof allow)));
    assert_false(api_route_has_body(api_route_find("POST", "/v1/jobs/x/cancel", allow, sizeof allow)));
}

static void test_problem_shape(void **state)
{
    (void)state;
    api_resp r;
    call("GET", "/v1/jobs/job_missing", NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 404);
    assert_string_equal(r.content_type, "application/problem+json");
    assert_string_equal(json_string_value(json_object_get(r.json, "code")), "not_found");
    assert_int_equal(json_integer_value(json_object_get(r.json, "status")), 404);
    assert_non_null(json_object_get(r.json, "type"));
    assert_non_null(json_object_get(r.json, "title"));
    assert_non_null(json_object_get(r.json, "detail"));
    api_resp_free(&r);
    const char *q[] = {"limit", "100000", NULL};
    call("GET", "/v1/jobs", NULL, NULL, q, &r);
    assert_int_equal(r.status, 400);
    json_t *e = json_array_get(json_object_get(r.json, "errors"), 0);
    assert_string_equal(json_string_value(json_object_get(e, "parameter")), "limit");
    api_resp_free(&r);
    const char *q2[] = {"limit", "-1", NULL};
    call("GET", "/v1/models", NULL, NULL, q2, &r);
    assert_int_equal(r.status, 400);
    api_resp_free(&r);
}

static void test_create_idempotent_etag(void **state)
{
    (void)state;
    const char *spec = "{\"model\":{\"path\":\"models/tiny.bin\"},\"data\":{\"calibration\":\"models/calib.txt\"},\"constraints\":{\"params\":10}}";
    const char *h[] = {"Idempotency-Key", "abc", NULL};
    api_resp r1, r2, r3;
    call("POST", "/v1/jobs", spec, h, NULL, &r1);
    assert_int_equal(r1.status, 201);
    const char *id = json_string_value(json_object_get(r1.json, "id"));
    assert_non_null(id);
    char loc[128];
    snprintf(loc, sizeof loc, "/v1/jobs/%s", id);
    assert_string_equal(header(&r1, "Location"), loc);
    /* the same body with other whitespace replays the stored response */
    call("POST", "/v1/jobs", "{ \"data\": {\"calibration\": \"models/calib.txt\"}, \"constraints\": {\"params\": 10}, \"model\": {\"path\": \"models/tiny.bin\"} }", h, NULL, &r2);
    assert_int_equal(r2.status, 201);
    assert_string_equal(header(&r2, "Idempotent-Replayed"), "true");
    assert_non_null(r2.text);
    assert_non_null(strstr(r2.text, id));
    api_resp_free(&r2);
    call("POST", "/v1/jobs", "{\"model\":{\"path\":\"models/tiny.bin\"},\"data\":{\"calibration\":\"models/calib.txt\"},\"constraints\":{\"params\":11}}", h, NULL, &r3);
    assert_int_equal(r3.status, 422);
    assert_string_equal(json_string_value(json_object_get(r3.json, "code")), "idempotency_key_reused");
    api_resp_free(&r3);
    /* GET with the ETag is a 304; a stale ETag gets the body */
    api_resp g;
    call("GET", loc, NULL, NULL, NULL, &g);
    assert_int_equal(g.status, 200);
    char etag[128];
    snprintf(etag, sizeof etag, "%s", header(&g, "ETag"));
    api_resp_free(&g);
    const char *inm[] = {"If-None-Match", etag, NULL};
    call("GET", loc, NULL, inm, NULL, &g);
    assert_int_equal(g.status, 304);
    assert_true(g.no_body);
    api_resp_free(&g);
    const char *stale[] = {"If-None-Match", "\"job_x.1\"", NULL};
    call("GET", loc, NULL, stale, NULL, &g);
    assert_int_equal(g.status, 200);
    api_resp_free(&g);
    /* a long-poll on an unchanged, running job parks instead of answering */
    const char *w[] = {"wait", "3", NULL};
    call("GET", loc, NULL, inm, w, &g);
    assert_true(g.wait_until > 0);
    api_resp_free(&g);
    api_resp_free(&r1);
}

/* A replay that a DELETE of its job overtakes (after the record was read) answers as a
 * replay of what was read, never 503; once the record is gone, the same key creates anew. */
static void test_replay_beside_delete(void **state)
{
    (void)state;
    const char *spec = "{\"model\":{\"path\":\"models/tiny.bin\"},\"data\":{\"calibration\":\"models/calib.txt\"},\"constraints\":{\"params\":12}}";
    const char *h[] = {"Idempotency-Key", "race-1", NULL};
    api_resp r1, r2, r3;
    call("POST", "/v1/jobs", spec, h, NULL, &r1);
    assert_int_equal(r1.status, 201);
    const char *id = json_string_value(json_object_get(r1.json, "id"));
    assert_non_null(id);
    snprintf(idem_race_job, sizeof idem_race_job, "%s", id);
    call("POST", "/v1/jobs", spec, h, NULL, &r2);
    assert_int_equal(idem_race_job[0], 0);   /* the DELETE ran after the look-up */
    if (r2.status != 201)
        fail_msg("the replay overtaken by a DELETE answered %d: %s", r2.status, r2.text ? r2.text : "");
    assert_string_equal(header(&r2, "Idempotent-Replayed"), "true");
    assert_non_null(strstr(r2.text, id));
    call("POST", "/v1/jobs", spec, h, NULL, &r3);   /* the key's record went with its job */
    assert_int_equal(r3.status, 201);
    assert_null(header(&r3, "Idempotent-Replayed"));
    assert_string_not_equal(json_string_value(json_object_get(r3.json, "id")), id);
    api_resp_free(&r1);
    api_resp_free(&r2);
    api_resp_free(&r3);
}

/* One published 1000-byte artifact ("first" + i % 26 at byte i) of a new job, its id into
 * id, its digest into sha, the download path into path. */
static void publish_blob(char first, char id[48], char sha[65], char *path, size_t pathlen)
{
    api_resp r;
    call("POST", "/v1/jobs", "{\"model\":{\"path\":\"models/tiny.bin\"},\"data\":{\"calibration\":\"models/calib.txt\"},\"constraints\":{\"params\":10}}", NULL, NULL, &r);
    snprintf(id, 48, "%s", json_string_value(json_object_get(r.json, "id")));
    api_resp_free(&r);
    char src[128];
    snprintf(src, sizeof src, "%s/blob2", dir);
    FILE *f = fopen(src, "w");
    assert_non_null(f);
    for (int i = 0; i < 1000; i++)
        fputc(first + i % 26, f);
    assert_int_equal(fclose(f), 0);
    store_artifact a = {0};
    char err[256];
    assert_int_equal(art_put(ctx.as, src, a.sha256, &a.size_bytes, err, sizeof err), 0);
    snprintf(a.job_id, sizeof a.job_id, "%s", id);
    snprintf(a.name, sizeof a.name, "blob.txt");
    snprintf(a.content_type, sizeof a.content_type, "text/plain");
    assert_int_equal(store_artifact_add(ctx.st, &a), 0);
    memcpy(sha, a.sha256, 65);
    snprintf(path, pathlen, "/v1/jobs/%s/artifacts/blob.txt", id);
}

/* Flip one byte of a stored blob in place (same size). */
static void flip_byte(const char *sha, long at)
{
    char p[4096];
    assert_int_equal(art_path(ctx.as, sha, p, sizeof p), 0);
    int fd = open(p, O_RDWR);
    assert_true(fd >= 0);
    char c;
    assert_int_equal(pread(fd, &c, 1, at), 1);
    c ^= 0x20;
    assert_int_equal(pwrite(fd, &c, 1, at), 1);
    assert_int_equal(close(fd), 0);
}

/* A blob corrupted after it was verified is never served as good: a download already
 * streaming stops before its last chunk, later requests are refused, and the scrub
 * finds what no request touched; publishing the same content again repairs it. */
static void test_artifact_corruption(void **state)
{
    (void)state;
    char id[48], sha[65], path[200];
    publish_blob('A', id, sha, path, sizeof path);
    api_resp r;
    call("GET", path, NULL, NULL, NULL, &r);   /* verified and cached by this open */
    assert_int_equal(r.status, 200);
    char buf[4096];
    flip_byte(sha, 700);                        /* while the download streams */
    ssize_t k = art_stream_read(r.stream, 0, buf, 512);
    assert_int_equal(k, 512);
    assert_int_equal(art_stream_read(r.stream, 512, buf, sizeof buf), -1);   /* the last chunk is held back */
    api_resp_free(&r);
    call("GET", path, NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 500);
    assert_non_null(strstr(json_string_value(json_object_get(r.json, "detail")), "failed its sha-256 check"));
    api_resp_free(&r);

    /* the scrub: a blob no request has opened since it rotted */
    char sha2[65], path2[200];
    publish_blob('a' + 1, id, sha2, path2, sizeof path2);
    int checked = 0, bad = 0;
    assert_int_equal(art_scrub(ctx.as, &checked, &bad), 0);
    assert_true(checked >= 1);
    assert_int_equal(bad, 0);
    flip_byte(sha2, 3);
    assert_int_equal(art_scrub(ctx.as, &checked, &bad), 0);
    assert_int_equal(bad, 1);
    call("GET", path2, NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 500);
    assert_non_null(strstr(json_string_value(json_object_get(r.json, "detail")), "failed its sha-256 check"));
    api_resp_free(&r);

    /* a rotted blob no request has opened: a HEAD answers from the store's row without
       reading it (it hashed the whole blob on the request thread), a part is checked whole
       before it goes out, a whole download is cut short before its last chunk */
    char sha4[65], path4[200];
    publish_blob('d', id, sha4, path4, sizeof path4);
    flip_byte(sha4, 900);
    call("HEAD", path4, NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    api_resp_free(&r);
    call("GET", path4, NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(art_stream_read(r.stream, 0, buf, 512), 512);
    assert_int_equal(art_stream_read(r.stream, 512, buf, sizeof buf), -1);
    api_resp_free(&r);
    call("GET", path4, NULL, NULL, NULL, &r);   /* set aside by the download that found it */
    assert_int_equal(r.status, 500);
    api_resp_free(&r);
    char sha5[65], path5[200];
    publish_blob('e', id, sha5, path5, sizeof path5);
    flip_byte(sha5, 10);
    const char *part[] = {"Range", "bytes=0-99", NULL};
    call("GET", path5, NULL, part, NULL, &r);
    assert_int_equal(r.status, 500);
    api_resp_free(&r);

    /* a job publishing content whose stored blob has rotted (same size, not yet found) repairs
       it: the stored copy was kept because its size matched, and the new job's download failed */
    char sha3[65], path3[200];
    publish_blob('c', id, sha3, path3, sizeof path3);
    flip_byte(sha3, 5);
    publish_blob('c', id, sha3, path3, sizeof path3);
    call("GET", path3, NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    api_resp_free(&r);
}

/* A download of a rotted blob that is repaired while it streams: a publish of the same
 * content sets the rotted file aside and stores a good copy under its name; the download,
 * finding at its end that what it read was bad, must not set aside the good copy (it sets
 * aside only the file it read). */
static void test_repair_during_download(void **state)
{
    (void)state;
    char id[48], sha[65], path[200], buf[4096];
    publish_blob('S', id, sha, path, sizeof path);
    flip_byte(sha, 700);
    api_resp r;
    call("GET", path, NULL, NULL, NULL, &r);   /* a whole download: hashed on the way */
    assert_int_equal(r.status, 200);
    assert_int_equal(art_stream_read(r.stream, 0, buf, 512), 512);
    char id2[48], sha2[65], path2[200];
    publish_blob('S', id2, sha2, path2, sizeof path2);   /* the repair */
    assert_string_equal(sha2, sha);
    assert_int_equal(art_stream_read(r.stream, 512, buf, sizeof buf), -1);   /* it read the rotted copy */
    api_resp_free(&r);
    call("GET", path2, NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    api_resp_free(&r);
    const char *part[] = {"Range", "bytes=0-99", NULL};   /* checked whole before it goes out */
    call("GET", path, NULL, part, NULL, &r);
    assert_int_equal(r.status, 206);
    api_resp_free(&r);
}

/* A download whose job is deleted between the artifact's row being read and its content
 * being opened: the artifact is gone, a 404, not a 500 that says the content is missing. */
static void test_artifact_get_beside_delete(void **state)
{
    (void)state;
    char id[48], sha[65], path[200];
    publish_blob('R', id, sha, path, sizeof path);
    assert_int_equal(art_path(ctx.as, sha, race_path, sizeof race_path), 0);
    snprintf(race_job, sizeof race_job, "%s", id);
    api_resp r;
    call("GET", path, NULL, NULL, NULL, &r);
    assert_int_equal(race_job[0], 0);   /* the delete ran */
    assert_int_equal(r.status, 404);
    assert_string_equal(json_string_value(json_object_get(r.json, "code")), "not_found");
    api_resp_free(&r);
    call("GET", path, NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 404);
    api_resp_free(&r);
}

static void test_artifact_ranges(void **state)
{
    (void)state;
    /* a finished job with one 1000-byte artifact */
    api_resp r;
    char id[48], sha[65], path[200], etag[80];
    publish_blob('a', id, sha, path, sizeof path);
    snprintf(etag, sizeof etag, "\"%s\"", sha);

    call("GET", path, NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(r.stream);
    assert_int_equal(r.len, 1000);
    assert_true(art_stream_verified(r.stream));   /* a whole download is hashed on the way */
    {   /* so it is read in order: a read out of order fails (it went out unchecked before) */
        char b[64];
        assert_int_equal(art_stream_read(r.stream, 512, b, sizeof b), -1);
        assert_true(art_stream_verified(r.stream));
    }
    assert_string_equal(header(&r, "ETag"), etag);
    assert_non_null(strstr(header(&r, "Repr-Digest"), "sha-256=:"));
    assert_string_equal(header(&r, "Content-Disposition"), "attachment; filename=\"blob.txt\"");
    api_resp_free(&r);
    struct { const char *range, *if_range; int status; long long off, len; } cases[] = {
        {"bytes=10-19", NULL, 206, 10, 10},
        {"bytes=990-", NULL, 206, 990, 10},
        {"bytes=-5", NULL, 206, 995, 5},
        {"bytes=-5000", NULL, 206, 0, 1000},
        {"bytes=900-5000", NULL, 206, 900, 100},
        {"bytes=1000-", NULL, 416, 0, 0},
        {"bytes=-0", NULL, 416, 0, 0},
        {"bytes=5-1", NULL, 200, 0, 1000},       /* malformed: ignored */
        {"bytes=0-1,4-5", NULL, 200, 0, 1000},   /* several ranges: whole */
        {"items=0-1", NULL, 200, 0, 1000},
        {"bytes=0-9", "\"other\"", 200, 0, 1000}, /* If-Range mismatch: whole */
        {"bytes=0-9", etag, 206, 0, 10},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *h[] = {"Range", cases[i].range, cases[i].if_range ? "If-Range" : NULL, cases[i].if_range, NULL};
        call("GET", path, NULL, h, NULL, &r);
        if (r.status != cases[i].status)
            fail_msg("Range %s: status %d, want %d", cases[i].range, r.status, cases[i].status);
        if (r.status != 416) {
            assert_int_equal(r.off, cases[i].off);
            assert_int_equal(r.len, cases[i].len);
        } else {
            assert_string_equal(header(&r, "Content-Range"), "bytes */1000");
        }
        api_resp_free(&r);
    }
    const char *inm[] = {"If-None-Match", etag, NULL};
    call("GET", path, NULL, inm, NULL, &r);
    assert_int_equal(r.status, 304);
    api_resp_free(&r);
    const char *bad[] = {"..", ".x", "a%2fb", "a b", NULL};
    for (int i = 0; bad[i]; i++) {
        char p[200];
        snprintf(p, sizeof p, "/v1/jobs/%s/artifacts/%s", id, bad[i]);
        call("GET", p, NULL, NULL, NULL, &r);
        assert_int_equal(r.status, 400);
        api_resp_free(&r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routes),
        cmocka_unit_test(test_problem_shape),
        cmocka_unit_test(test_create_idempotent_etag),
        cmocka_unit_test(test_replay_beside_delete),
        cmocka_unit_test(test_artifact_ranges),
        cmocka_unit_test(test_artifact_corruption),
        cmocka_unit_test(test_artifact_get_beside_delete),
        cmocka_unit_test(test_repair_during_download),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
