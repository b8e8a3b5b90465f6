/* tests/unit/test_formats_safetensors.c — safetensors: write/read round trips in F32,
 * F16 and BF16, scalar conversions at the edges, sharded index, and hostile headers
 * (truncation, offsets past the end, overflowing shapes, bad dtypes, overlaps), and a
 * sharded set of 2 x 100k tensors that must open in n log n (quadratic checks took
 * minutes; the alarm turns that into a failure without timing anything). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "storage/safetensors.h"

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ac_st_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_conversions(void **state)
{
    (void)state;
    assert_true(st_f16_to_f32(0x3C00) == 1.0f);
    assert_true(st_f16_to_f32(0xC000) == -2.0f);
    assert_true(st_f16_to_f32(0x7BFF) == 65504.0f);
    assert_true(st_f16_to_f32(0x0001) == ldexpf(1.0f, -24));         /* smallest subnormal */
    assert_true(isinf(st_f16_to_f32(0x7C00)));
    assert_true(isnan(st_f16_to_f32(0x7E00)));
    assert_int_equal(st_f32_to_f16(1.0f), 0x3C00);
    assert_int_equal(st_f32_to_f16(65504.0f), 0x7BFF);
    assert_int_equal(st_f32_to_f16(1e6f), 0x7C00);                   /* overflow -> inf */
    assert_int_equal(st_f32_to_f16(ldexpf(1.0f, -24)), 0x0001);
    assert_int_equal(st_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3C00); /* tie -> even */
    assert_int_equal(st_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3C02);
    assert_int_equal(st_f32_to_bf16(1.0f), 0x3F80);
    assert_true(st_bf16_to_f32(0x3F80) == 1.0f);
    assert_true(isnan(st_bf16_to_f32(st_f32_to_bf16(NAN))));
    /* every finite half survives f16 -> f32 -> f16 */
    for (uint32_t h = 0; h < 0x10000; h++)
        if ((h & 0x7C00) != 0x7C00)
            assert_int_equal(st_f32_to_f16(st_f16_to_f32((uint16_t)h)), h);
}

static void round_trip(st_dtype dt, float tol)
{
    float a[6] = {1.5f, -2.25f, 3.0f, 0.1f, -1e-3f, 100.0f}, b[4] = {7, 8, 9, 10};
    st_write_tensor ts[2] = {{"model.a", a, {2, 3}, 2}, {"model.b", b, {4}, 1}};
    char path[128], err[256];
    snprintf(path, sizeof path, "%s/rt.safetensors", tmpdir);
    json_t *meta = json_pack("{s:s}", "format", "pt");
    assert_int_equal(st_write(path, ts, 2, dt, meta, err, sizeof err), 0);
    json_decref(meta);
    st_file f;
    assert_int_equal(st_open(&f, path, err, sizeof err), 0);
    assert_int_equal(f.n, 2);
    int ia = st_find(&f, "model.a"), ib = st_find(&f, "model.b");
    assert_true(ia >= 0 && ib >= 0);
    assert_int_equal(f.t[ia].dtype, dt);
    assert_int_equal(f.t[ia].ndim, 2);
    assert_int_equal(f.t[ia].shape[1], 3);
    assert_string_equal(json_string_value(json_object_get(f.metadata, "format")), "pt");
    float out[6];
    assert_int_equal(st_read_f32(&f, ia, out, 6, err, sizeof err), 0);
    for (int i = 0; i < 6; i++)
        assert_true(fabsf(out[i] - a[i]) <= tol * fabsf(a[i]));
    assert_int_equal(st_read_f32(&f, ib, out, 3, err, sizeof err), -1);   /* buffer too small */
    st_close(&f);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    assert_int_not_equal(access(tmp, F_OK), 0);   /* no temporary left behind */
}

static void test_round_trips(void **state)
{
    (void)state;
    round_trip(ST_F32, 0.0f);
    round_trip(ST_F16, 1e-3f);
    round_trip(ST_BF16, 8e-3f);
}

/* A safetensors image from a header string and `data_len` zero bytes of data. */
static size_t image(uint8_t *buf, size_t cap, const char *hdr, size_t data_len)
{
    size_t hl = strlen(hdr);
    assert_true(8 + hl + data_len <= cap);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    memset(buf + 8 + hl, 0, data_len);
    return 8 + hl + data_len;
}

static void expect_bad(const char *hdr, size_t data_len, const char *needle)
{
    uint8_t buf[4096];
    char err[256] = "";
    size_t n = image(buf, sizeof buf, hdr, data_len);
    st_file f;
    assert_int_equal(st_open_mem(&f, buf, n, err, sizeof err), -1);
    if (!strstr(err, needle))
        fail_msg("header %s: error \"%s\" lacks \"%s\"", hdr, err, needle);
}

static void test_hostile_headers(void **state)
{
    (void)state;
    uint8_t buf[4096];
    char err[256];
    st_file f;
    /* a valid one first */
    size_t n = image(buf, sizeof buf, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16);
    assert_int_equal(st_open_mem(&f, buf, n, err, sizeof err), 0);
    st_close(&f);
    /* every truncation of it fails cleanly */
    for (size_t k = 0; k < n; k++)
        assert_int_equal(st_open_mem(&f, buf, k, err, sizeof err), -1);
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,32]}}", 16, "past the end");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", 16, "do not hold");
    expect_bad("{\"w\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16, "not supported");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,16]}}", 16,
               "overflows");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 16, "shape[0]");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 16, "begin <= end");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 16, "overlap");
    /* an empty tensor sorted between two overlapping ones hides nothing */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":[0,256]},"
               "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[64,64]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":[128,384]}}", 384,
               "\"a\" and \"b\" overlap");
    /* empty tensors anywhere (inside others too) are fine */
    n = image(buf, sizeof buf, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                               "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
                               "\"y\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[16,16]},"
                               "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}", 32);
    assert_int_equal(st_open_mem(&f, buf, n, err, sizeof err), 0);
    st_close(&f);
    expect_bad("[1,2]", 0, "not a JSON object");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 8, "dimensions");
    /* header length beyond the file */
    memset(buf, 0xFF, 8);
    assert_int_equal(st_open_mem(&f, buf, 64, err, sizeof err), -1);
    assert_non_null(strstr(err, "header length"));
}

static void test_sharded_index(void **state)
{
    (void)state;
    float a[2] = {1, 2}, b[3] = {3, 4, 5};
    st_write_tensor ta = {"x.a", a, {2}, 1}, tb = {"x.b", b, {3}, 1};
    char p[192], err[256];
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", tmpdir);
    assert_int_equal(st_write(p, &ta, 1, ST_F32, NULL, err, sizeof err), 0);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", tmpdir);
    assert_int_equal(st_write(p, &tb, 1, ST_BF16, NULL, err, sizeof err), 0);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", tmpdir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"metadata\":{},\"weight_map\":{\"x.a\":\"model-00001-of-00002.safetensors\","
               "\"x.b\":\"model-00002-of-00002.safetensors\"}}");
    assert_int_equal(fclose(f), 0);
    st_file s;
    assert_int_equal(st_open(&s, tmpdir, err, sizeof err), 0);   /* directory -> index */
    assert_int_equal(s.n_shards, 2);
    float out[3];
    int ib = st_find(&s, "x.b");
    assert_int_equal(st_read_f32(&s, ib, out, 3, err, sizeof err), 0);
    assert_true(out[0] == 3 && out[2] == 5);
    st_close(&s);
    /* an index naming a tensor its shard lacks, and a shard path escaping the folder */
    f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"weight_map\":{\"x.c\":\"model-00001-of-00002.safetensors\"}}");
    assert_int_equal(fclose(f), 0);
    assert_int_equal(st_open(&s, p, err, sizeof err), -1);
    assert_non_null(strstr(err, "x.c"));
    f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"weight_map\":{\"x.a\":\"../etc/passwd\"}}");
    assert_int_equal(fclose(f), 0);
    assert_int_equal(st_open(&s, p, err, sizeof err), -1);
    assert_non_null(strstr(err, "plain file name"));
}

/* Write `path`: a safetensors file of n empty F32 tensors named <prefix><i>. */
static void write_empty_shard(const char *path, const char *prefix, int n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    size_t cap = (size_t)n * 96 + 64, len = 0;
    char *h = malloc(cap);
    assert_non_null(h);
    h[len++] = '{';
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(h + len, cap - len, "%s\"%s%d\":{\"dtype\":\"F32\",\"shape\":[0],"
                                "\"data_offsets\":[0,0]}", i ? "," : "", prefix, i);
    h[len++] = '}';
    uint64_t hl = len;
    assert_int_equal(fwrite(&hl, 8, 1, f), 1);
    assert_int_equal(fwrite(h, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    free(h);
}

static void test_sharded_many_tensors(void **state)
{
    (void)state;
    enum { N = 100000 };
    char d[128], p[192], err[256];
    snprintf(d, sizeof d, "%s/many", tmpdir);
    assert_int_equal(mkdir(d, 0755), 0);
    snprintf(p, sizeof p, "%s/s1.safetensors", d);
    write_empty_shard(p, "a.", N);
    snprintf(p, sizeof p, "%s/s2.safetensors", d);
    write_empty_shard(p, "b.", N);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"weight_map\":{");
    for (int i = 0; i < N; i++)
        fprintf(f, "%s\"a.%d\":\"s1.safetensors\",\"b.%d\":\"s2.safetensors\"", i ? "," : "", i, i);
    fprintf(f, "}}");
    assert_int_equal(fclose(f), 0);
    st_file s;
    alarm(60);   /* n log n opens this in about a second; the quadratic checks took minutes */
    assert_int_equal(st_open(&s, d, err, sizeof err), 0);
    alarm(0);
    assert_int_equal(s.n, 2 * N);
    int k = st_find(&s, "b.77777");
    assert_true(k >= 0);
    assert_string_equal(s.t[k].name, "b.77777");
    assert_int_equal(s.t[k].shard, 1);
    assert_int_equal(st_find(&s, "c.1"), -1);
    st_close(&s);
    /* the same name in both shards is still refused */
    snprintf(p, sizeof p, "%s/s2.safetensors", d);
    write_empty_shard(p, "a.", 3);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"weight_map\":{\"a.1\":\"s1.safetensors\",\"a.2\":\"s2.safetensors\"}}");
    assert_int_equal(fclose(f), 0);
    assert_int_equal(st_open(&s, d, err, sizeof err), -1);
    assert_non_null(strstr(err, "appears in two shards"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_hostile_headers),
        cmocka_unit_test(test_sharded_index),
        cmocka_unit_test(test_sharded_many_tensors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
