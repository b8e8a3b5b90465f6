/* tests/unit/test_webhook_sender.c — the webhook sender outlives a failure of libcurl's
 * multi interface: a job's webhook is queued by its end, libcurl fails the sender's first
 * transfers (this test's curl_multi_perform, linked over libcurl's with --wrap, answers
 * CURLM_OUT_OF_MEMORY twice), and the webhook is still delivered to a local receiver, once,
 * and recorded as delivered. The sender used to end its thread at the first such failure,
 * and no webhook was sent again until a restart.
 */
/* ldflags: -Wl,--wrap=curl_multi_perform */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/webhook.h"
#include "storage/fileio.h"
#include "storage/store.h"

static int fail_left;   /* curl_multi_perform calls still to fail */

CURLMcode __real_curl_multi_perform(CURLM *m, int *running);
CURLMcode __wrap_curl_multi_perform(CURLM *m, int *running);
CURLMcode __wrap_curl_multi_perform(CURLM *m, int *running)
{
    if (__atomic_load_n(&fail_left, __ATOMIC_SEQ_CST) > 0) {
        __atomic_sub_fetch(&fail_left, 1, __ATOMIC_SEQ_CST);
        *running = 0;
        return CURLM_OUT_OF_MEMORY;
    }
    return __real_curl_multi_perform(m, running);
}

/* A receiver that answers every request 204 and counts them. */
typedef struct {
    int fd, port, requests, stop;
    pthread_t th;
} receiver;

static void *serve(void *arg)
{
    receiver *r = arg;
    while (!__atomic_load_n(&r->stop, __ATOMIC_SEQ_CST)) {
        int c = accept(r->fd, NULL, NULL);
        if (c < 0)
            continue;
        char buf[8192];
        size_t got = 0;
        ssize_t k;
        /* the head, then the body its Content-Length names */
        while (got < sizeof buf - 1 && (k = read(c, buf + got, sizeof buf - 1 - got)) > 0) {
            got += (size_t)k;
            buf[got] = 0;
            char *end = strstr(buf, "\r\n\r\n"), *cl = strcasestr(buf, "Content-Length:");
            if (end && (!cl || (size_t)(end + 4 - buf) + (size_t)atol(cl + 15) <= got))
                break;
        }
        __atomic_add_fetch(&r->requests, 1, __ATOMIC_SEQ_CST);
        static const char ok[] = "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n";
        if (write(c, ok, sizeof ok - 1) < 0)
            fprintf(stderr, "receiver: write failed\n");
        close(c);
    }
    return NULL;
}

static void receiver_start(receiver *r)
{
    memset(r, 0, sizeof *r);
    r->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(r->fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    assert_int_equal(bind(r->fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(r->fd, 8), 0);
    assert_int_equal(getsockname(r->fd, (struct sockaddr *)&a, &al), 0);
    r->port = ntohs(a.sin_port);
    struct timeval tv = {0, 100 * 1000};   /* accept wakes to see a stop */
    assert_int_equal(setsockopt(r->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    assert_int_equal(pthread_create(&r->th, NULL, serve, r), 0);
}

static void receiver_stop(receiver *r)
{
    __atomic_store_n(&r->stop, 1, __ATOMIC_SEQ_CST);
    pthread_join(r->th, NULL);
    close(r->fd);
}

static void test_outlives_multi_failure(void **state)
{
    (void)state;
    char dir[] = "/tmp/ac_webhook_XXXXXX", db[128], err[512];
    assert_non_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/t.db", dir);
    store *st = store_open(db, err, sizeof err);
    assert_non_null(st);
    receiver r;
    receiver_start(&r);
    store_job j;
    memset(&j, 0, sizeof j);
    assert_int_equal(store_new_id("job_", j.id, sizeof j.id), 0);
    snprintf(j.kind, sizeof j.kind, "job");
    snprintf(j.device, sizeof j.device, "hook-dev");
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/hook", r.port);
    j.spec = json_pack("{s:s}", "callback_url", url);
    j.stages = json_array();
    assert_int_equal(store_job_create(st, &j, NULL, NULL, NULL, 0, NULL, err, sizeof err), 0);
    store_claim cl = {"hook-dev", 0, "test-runner", 30};
    store_job c;
    assert_int_equal(store_job_claim(st, &cl, &c), 0);
    store_job_clear(&c);
    fail_left = 2;
    assert_int_equal(store_job_finish(st, j.id, "succeeded", NULL, NULL), 0);
    static const unsigned char key[32] = {1, 2, 3};
    webhook_sender *w = webhook_start(st, key, sizeof key, 1, 1, err, sizeof err);
    assert_non_null(w);
    int delivered = 0;
    for (int i = 0; i < 200 && !delivered; i++) {   /* 10 s */
        usleep(50 * 1000);
        store_webhook *due;
        int n = 0;
        assert_int_equal(store_webhook_due(st, store_now() + 100000, 10, &due, &n), 0);
        delivered = n == 0;   /* delivered webhooks are no longer pending */
        store_webhook_list_free(due, n);
    }
    webhook_stop(w);
    receiver_stop(&r);
    if (!delivered)
        fail_msg("the webhook was not delivered after libcurl failed (%d requests reached the receiver)", r.requests);
    assert_int_equal(fail_left, 0);   /* the failures happened */
    assert_int_equal(r.requests, 1);
    store_job_clear(&j);
    store_close(st);
    assert_int_equal(fio_remove_tree(dir), 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outlives_multi_failure),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
