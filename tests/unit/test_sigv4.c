/* tests/unit/test_sigv4.c — storage/sigv4.c against AWS's published Signature Version 4
 * examples for S3 ("Examples: Signature Calculations in AWS Signature Version 4", the
 * header and query-string forms, example bucket and keys) and the signing-key example of
 * the general SigV4 documentation; then the inputs it must refuse. The expected
 * signatures are AWS's, copied from those pages, never computed here.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "storage/artstore.h"
#include "storage/sigv4.h"

static const sigv4_creds S3 = {"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", NULL, "us-east-1",
                               "s3"};
#define HOST "examplebucket.s3.amazonaws.com"
#define DATE "20130524T000000Z"

/* The Signature= value of the Authorization line in hdrs. */
static void signature_of(const char *hdrs, char sig[65])
{
    const char *p = strstr(hdrs, "Signature=");
    assert_non_null(p);
    memcpy(sig, p + 10, 64);
    sig[64] = 0;
}

static void sign(const sigv4_request *r, char *hdrs, size_t n, char *canon, size_t cn)
{
    char err[256] = "";
    int rc = sigv4_sign_headers(&S3, r, hdrs, n, canon, cn, err, sizeof err);
    if (rc)
        fail_msg("%s", err);
}

static void test_signing_key(void **state)
{
    (void)state;
    unsigned char k[32];
    char hex[65];
    assert_int_equal(sigv4_signing_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215", "us-east-1", "iam", k), 0);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", k[i]);
    assert_string_equal(hex, "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d");
}

/* GET Object with a Range header: the canonical request and the signature. */
static void test_get_object(void **state)
{
    (void)state;
    sigv4_pair h[] = {{"Host", HOST}, {"Range", "bytes=0-9"}};
    sigv4_request r = {"GET", "/test.txt", NULL, 0, h, 2, SIGV4_EMPTY_SHA256, DATE};
    char hdrs[1024], canon[1024], sig[65];
    sign(&r, hdrs, sizeof hdrs, canon, sizeof canon);
    assert_string_equal(canon, "GET\n/test.txt\n\n"
                               "host:examplebucket.s3.amazonaws.com\n"
                               "range:bytes=0-9\n"
                               "x-amz-content-sha256:" SIGV4_EMPTY_SHA256 "\n"
                               "x-amz-date:20130524T000000Z\n\n"
                               "host;range;x-amz-content-sha256;x-amz-date\n" SIGV4_EMPTY_SHA256);
    signature_of(hdrs, sig);
    assert_string_equal(sig, "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
    assert_non_null(strstr(hdrs, "Authorization: AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/"
                                 "s3/aws4_request,SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"));
    assert_non_null(strstr(hdrs, "\nx-amz-date: 20130524T000000Z\n"));
    assert_non_null(strstr(hdrs, "\nx-amz-content-sha256: " SIGV4_EMPTY_SHA256 "\n"));
    assert_null(strstr(hdrs, "secret"));
    assert_null(strstr(hdrs, S3.secret_key));
}

/* PUT Object: a '$' in the key, a Date and a storage-class header, the body's digest. */
static void test_put_object(void **state)
{
    (void)state;
    char body_sha[65];
    art_sha256_buf("Welcome to Amazon S3.", 21, body_sha);
    assert_string_equal(body_sha, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
    sigv4_pair h[] = {{"Host", HOST},
                      {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                      {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
                      {"x-amz-date", DATE},
                      {"x-amz-content-sha256", body_sha}};
    sigv4_request r = {"PUT", "/test$file.text", NULL, 0, h, 5, body_sha, DATE};
    char hdrs[1024], canon[1024], sig[65];
    sign(&r, hdrs, sizeof hdrs, canon, sizeof canon);
    assert_non_null(strstr(canon, "PUT\n/test%24file.text\n\ndate:Fri, 24 May 2013 00:00:00 GMT\n"));
    assert_non_null(strstr(canon, "\ndate;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class\n"));
    signature_of(hdrs, sig);
    assert_string_equal(sig, "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
    /* the caller's own x-amz-* headers are not sent twice */
    assert_null(strstr(hdrs, "\nx-amz-date:"));
}

/* GET Bucket Lifecycle: a query key without a value. */
static void test_get_lifecycle(void **state)
{
    (void)state;
    sigv4_pair h[] = {{"Host", HOST}};
    sigv4_pair q[] = {{"lifecycle", ""}};
    sigv4_request r = {"GET", "/", q, 1, h, 1, SIGV4_EMPTY_SHA256, DATE};
    char hdrs[1024], canon[1024], sig[65];
    sign(&r, hdrs, sizeof hdrs, canon, sizeof canon);
    assert_non_null(strstr(canon, "GET\n/\nlifecycle=\n"));
    signature_of(hdrs, sig);
    assert_string_equal(sig, "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

/* GET Bucket (list objects): query parameters given out of order are sorted. */
static void test_list_objects(void **state)
{
    (void)state;
    sigv4_pair h[] = {{"Host", HOST}};
    sigv4_pair q[] = {{"prefix", "J"}, {"max-keys", "2"}};
    sigv4_request r = {"GET", "/", q, 2, h, 1, SIGV4_EMPTY_SHA256, DATE};
    char hdrs[1024], canon[1024], sig[65];
    sign(&r, hdrs, sizeof hdrs, canon, sizeof canon);
    assert_non_null(strstr(canon, "GET\n/\nmax-keys=2&prefix=J\n"));
    signature_of(hdrs, sig);
    assert_string_equal(sig, "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

/* The query-string form: a presigned GET valid for a day. */
static void test_presigned_url(void **state)
{
    (void)state;
    sigv4_pair h[] = {{"Host", HOST}, {"Range", "bytes=0-9"}};   /* only host is signed */
    sigv4_request r = {"GET", "/test.txt", NULL, 0, h, 2, NULL, DATE};
    char url[1024], err[256] = "";
    assert_int_equal(sigv4_presign_url(&S3, &r, "https://" HOST, 86400, url, sizeof url, err, sizeof err), 0);
    assert_string_equal(url, "https://examplebucket.s3.amazonaws.com/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
                             "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
                             "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
                             "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404");
}

/* Blanks in header values are trimmed and collapsed; duplicate headers join by ','; a
 * session token is signed and sent; each changes the signature. */
static void test_canonical_forms(void **state)
{
    (void)state;
    sigv4_pair h[] = {{"Host", HOST}, {"X-Meta", "  a   b  "}, {"x-meta", "c"}};
    sigv4_request r = {"GET", "/a b/c+d", NULL, 0, h, 3, SIGV4_UNSIGNED, DATE};
    char hdrs[1024], canon[1024], err[256];
    sign(&r, hdrs, sizeof hdrs, canon, sizeof canon);
    assert_non_null(strstr(canon, "GET\n/a%20b/c%2Bd\n"));
    assert_non_null(strstr(canon, "\nx-meta:a b,c\n"));
    assert_non_null(strstr(canon, "\nUNSIGNED-PAYLOAD"));
    sigv4_creds t = S3;
    t.session_token = "TOKEN/xyz";
    char h2[1024];
    assert_int_equal(sigv4_sign_headers(&t, &r, h2, sizeof h2, canon, sizeof canon, err, sizeof err), 0);
    assert_non_null(strstr(canon, "\nx-amz-security-token:TOKEN/xyz\n"));
    assert_non_null(strstr(h2, "\nx-amz-security-token: TOKEN/xyz\n"));
    char s1[65], s2[65];
    signature_of(hdrs, s1);
    signature_of(h2, s2);
    assert_string_not_equal(s1, s2);
}

static void test_refusals(void **state)
{
    (void)state;
    char out[1024], err[256];
    sigv4_pair host[] = {{"Host", HOST}};
    sigv4_pair none[] = {{"Range", "bytes=0-9"}};
    sigv4_pair crlf[] = {{"Host", HOST}, {"X-A", "v\r\nInjected: 1"}};
    sigv4_request r = {"GET", "/x", NULL, 0, none, 1, NULL, DATE};
    assert_int_equal(sigv4_sign_headers(&S3, &r, out, sizeof out, NULL, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "host"));
    r.headers = host;
    r.amz_date = "2013-05-24";
    assert_int_equal(sigv4_sign_headers(&S3, &r, out, sizeof out, NULL, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "YYYYMMDDTHHMMSSZ"));
    r.amz_date = DATE;
    r.headers = crlf;
    r.n_headers = 2;
    assert_int_equal(sigv4_sign_headers(&S3, &r, out, sizeof out, NULL, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "malformed"));
    r.headers = host;
    r.n_headers = 1;
    assert_int_equal(sigv4_sign_headers(&S3, &r, out, 40, NULL, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "buffer"));
    sigv4_creds nokey = S3;
    nokey.secret_key = "";
    assert_int_equal(sigv4_sign_headers(&nokey, &r, out, sizeof out, NULL, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "secret key"));
    assert_int_equal(sigv4_presign_url(&S3, &r, "https://" HOST, 604801, out, sizeof out, err, sizeof err), -1);
    assert_non_null(strstr(err, "604800"));
    assert_int_equal(sigv4_presign_url(&S3, &r, "ftp://" HOST, 60, out, sizeof out, err, sizeof err), -1);
    r.path = "x";
    assert_int_equal(sigv4_sign_headers(&S3, &r, out, sizeof out, NULL, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "'/'"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_signing_key),   cmocka_unit_test(test_get_object),
        cmocka_unit_test(test_put_object),    cmocka_unit_test(test_get_lifecycle),
        cmocka_unit_test(test_list_objects),  cmocka_unit_test(test_presigned_url),
        cmocka_unit_test(test_canonical_forms), cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
