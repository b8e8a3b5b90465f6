/* tests/tools/ac_s3.c — test helper: drive storage/s3.c from the command line.
 *   ac_s3 put URL KEY FILE            upload (multipart above $AC_S3_PART_MIB MiB, default 64) with the
 *                                     file's sha-256 as its x-amz-meta-sha256; prints the ETag
 *   ac_s3 head URL KEY                prints "SIZE ETAG SHA256" (SHA256 "-" when the object has none),
 *                                     exit 3 when there is no such object
 *   ac_s3 get URL KEY OFFSET LEN OUT  writes that byte range to OUT (appends); prints the byte count
 *   ac_s3 sweep URL KEYPREFIX AGE     aborts the multipart uploads under KEYPREFIX started AGE
 *                                     seconds ago or more; prints how many
 * URL is s3://BUCKET[/PREFIX]; the endpoint comes from $AWS_ENDPOINT_URL (http allowed),
 * credentials from the environment or $AC_S3_CREDENTIALS_FILE. Exit 1 with the error. */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/artstore.h"
#include "storage/s3.h"

static int to_file(void *user, const void *buf, size_t n)
{
    return fwrite(buf, 1, n, user) == n ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 4 || curl_global_init(CURL_GLOBAL_DEFAULT)) {
        fprintf(stderr, "usage: ac_s3 put|head|get URL KEY ...\n");
        return 2;
    }
    const char *mib = getenv("AC_S3_PART_MIB");
    s3_options o = {.allow_http = 1, .credentials_file = getenv("AC_S3_CREDENTIALS_FILE"),
                    .part_bytes = mib ? atoll(mib) * 1024 * 1024 : 0};
    char err[1024], etag[65];
    s3_client *c = s3_open(argv[2], &o, err, sizeof err);
    int rc = 1;
    if (!c) {
        fprintf(stderr, "ac_s3: %s\n", err);
    } else if (!strcmp(argv[1], "put") && argc == 5) {
        char hex[65];
        int64_t size = 0;
        /* a FIFO is s3_put_file's to refuse: it is not hashed first */
        int hashed = art_sha256_file(argv[4], hex, &size, err, sizeof err) == 0;
        if (s3_put_file(c, argv[3], argv[4], hashed ? hex : NULL, etag, err, sizeof err) == 0 &&
            printf("%s\n", etag) > 0)
            rc = 0;
        else
            fprintf(stderr, "ac_s3: %s\n", err);
    } else if (!strcmp(argv[1], "head") && argc == 4) {
        s3_object ob;
        int h = s3_head(c, argv[3], &ob, err, sizeof err);
        if (h == 0 && printf("%lld %s %s\n", (long long)ob.size_bytes, ob.etag, *ob.sha256 ? ob.sha256 : "-") > 0)
            rc = 0;
        else if (h == 1)
            rc = 3;
        else
            fprintf(stderr, "ac_s3: %s\n", err);
    } else if (!strcmp(argv[1], "sweep") && argc == 5) {
        int n = 0;
        if (s3_abort_stale_uploads(c, argv[3], atof(argv[4]), &n, err, sizeof err) == 0 && printf("%d\n", n) > 0)
            rc = 0;
        else
            fprintf(stderr, "ac_s3: %s\n", err);
    } else if (!strcmp(argv[1], "get") && argc == 7) {
        FILE *f = fopen(argv[6], "ab");
        int64_t got = 0;
        if (!f)
            fprintf(stderr, "ac_s3: %s: cannot open\n", argv[6]);
        else if (s3_get_range(c, argv[3], atoll(argv[4]), atoll(argv[5]), to_file, f, &got, err, sizeof err))
            fprintf(stderr, "ac_s3: %s\n", err);
        else
            rc = printf("%lld\n", (long long)got) > 0 ? 0 : 1;
        if (f && fclose(f)) {
            fprintf(stderr, "ac_s3: %s: write failed\n", argv[6]);
            rc = 1;
        }
    } else {
        fprintf(stderr, "usage: ac_s3 put|head|get URL KEY ...\n");
        rc = 2;
    }
    s3_close(c);
    curl_global_cleanup();
    return rc;
}
