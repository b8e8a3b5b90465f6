/* jobs/stages_test.c — stages that exist only for tests of the service itself
 * (registered when AC_TEST_STAGES=1; a spec selects them with "x_test_pipeline").
 * They exercise cancellation, artifacts, crashes and failures without any model work.
 *   test_sleep     x_test_sleep_ms (default 2000) in 50 ms steps, progress, cancellable
 *   test_artifact  writes x_test_artifact_bytes (default 4 MiB) of seeded pseudo-random
 *                  bytes and publishes them as "blob.bin", plus "note.txt"
 *   test_crash     the worker aborts (SIGABRT: a crash the server must report)
 *   test_fail      returns a failure with a message (x_test_fail_message, default "test_fail
 *                  always fails"); with x_test_sleep_ms it first
 *                  blocks in one uninterrupted system call that long (as a stage blocked
 *                  in open() would), and a signal that ends it early is its failure
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/rng.h"
#include "jobs/stage.h"

static int64_t spec_int(job_ctx *ctx, const char *key, int64_t dflt)
{
    json_t *v = json_object_get(job_ctx_spec(ctx), key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

static int test_sleep(job_ctx *ctx, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    int64_t ms = spec_int(ctx, "x_test_sleep_ms", 2000);
    int64_t steps = ms / 50 > 0 ? ms / 50 : 1;
    job_event(ctx, "test.sleep", "sleeping", json_pack("{s:I}", "ms", (json_int_t)ms));
    for (int64_t i = 0; i < steps; i++) {
        if (job_cancelled(ctx))
            return 1;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (i % 10 == 0 || i + 1 == steps)
            job_progress(ctx, i + 1, steps);
    }
    return 0;
}

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Write `bytes` to dir/name atomically (tmp, fsync, rename) from a generator. */
static int write_file(job_ctx *ctx, const char *name, int64_t bytes, char *path, size_t pathlen,
                      char *err, size_t errlen)
{
    char tmp[4400];
    snprintf(path, pathlen, "%s/%s", job_ctx_stage_dir(ctx), name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull ^ (uint64_t)bytes;
    unsigned char buf[65536];
    int rc = 0;
    for (int64_t done = 0; done < bytes && rc == 0;) {
        size_t k = bytes - done < (int64_t)sizeof buf ? (size_t)(bytes - done) : sizeof buf;
        for (size_t i = 0; i < k; i++)
            buf[i] = (unsigned char)(eng_xorshift64(&x) >> 24);
        rc = write_all(fd, buf, k);
        done += (int64_t)k;
    }
    int ok = rc == 0 && fsync(fd) == 0;
    int e = errno;
    if (close(fd) < 0 && ok) {
        ok = 0;
        e = errno;
    }
    if (!ok || rename(tmp, path) < 0) {
        if (ok)
            e = errno;
        snprintf(err, errlen, "writing %s: %s", path, strerror(e));
        unlink(tmp);   /* a partial file must not hold the disk */
        return -1;
    }
    return 0;
}

static int test_artifact(job_ctx *ctx, char *err, size_t errlen)
{
    char path[4400];
    int64_t bytes = spec_int(ctx, "x_test_artifact_bytes", 4 << 20);
    if (write_file(ctx, "blob.bin", bytes, path, sizeof path, err, errlen) < 0 ||
        job_publish(ctx, "blob.bin", path, "application/octet-stream", err, errlen) < 0)
        return -1;
    if (write_file(ctx, "note.txt", 64, path, sizeof path, err, errlen) < 0 ||
        job_publish(ctx, "note.txt", path, "text/plain", err, errlen) < 0)
        return -1;
    return job_report_merge(ctx, json_pack("{s:{s:I}}", "test", "artifact_bytes", (json_int_t)bytes)) < 0 ? -1 : 0;
}

static int test_crash(job_ctx *ctx, char *err, size_t errlen)
{
    (void)ctx;
    (void)err;
    (void)errlen;
    abort();
}

static int test_fail(job_ctx *ctx, char *err, size_t errlen)
{
    int64_t ms = spec_int(ctx, "x_test_sleep_ms", 0);
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    if (ms > 0 && nanosleep(&ts, NULL) != 0) {
        snprintf(err, errlen, "blocked call: %s", strerror(errno));
        return -1;
    }
    const char *msg = json_string_value(json_object_get(job_ctx_spec(ctx), "x_test_fail_message"));
    snprintf(err, errlen, "%s", msg ? msg : "test_fail always fails");
    return -1;
}

void stages_register_test(void)
{
    stage_register("test_sleep", test_sleep);
    stage_register("test_artifact", test_artifact);
    stage_register("test_crash", test_crash);
    stage_register("test_fail", test_fail);
}
