/* server/webhook.c — the webhook sender thread (webhook.h). One libcurl easy handle,
 * reused; http and https only, no redirects, 5 s to connect and 10 s in all per attempt,
 * connections to non-public addresses only when the server allows them (fetch_guard).
 * The outbox is polled every 200 ms; the store records each attempt in one transaction.
 */
#include "server/webhook.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/log.h"
#include "storage/fetch.h"

#define MAX_ATTEMPTS 8

struct webhook_sender {
    store *st;
    unsigned char key[256];
    size_t keylen;
    int retry_s;
    int allow_private;   /* receivers on loopback, private and link-local addresses */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
};

int webhook_load_secret(const char *path, unsigned char *out, size_t outlen, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open the webhook secret file", path);
        return -1;
    }
    char buf[512] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        buf[--n] = 0;
    if (!strncmp(buf, "whsec_", 6)) {
        size_t bl = strlen(buf + 6);
        if (bl == 0 || bl % 4 || bl / 4 * 3 > outlen) {
            snprintf(err, errlen, "%s: malformed whsec_ secret", path);
            return -1;
        }
        int k = EVP_DecodeBlock(out, (const unsigned char *)buf + 6, (int)bl);
        if (k <= 0) {
            snprintf(err, errlen, "%s: malformed whsec_ secret", path);
            return -1;
        }
        k -= (buf[6 + bl - 1] == '=') + (buf[6 + bl - 2] == '=');
        return k;
    }
    if (n < 16 || n > outlen) {
        snprintf(err, errlen, "%s: the secret must be 16 to %zu bytes (or whsec_BASE64)", path, outlen);
        return -1;
    }
    memcpy(out, buf, n);
    return (int)n;
}

int webhook_sign(const unsigned char *key, size_t keylen, const char *msg_id, long long ts, const char *body,
                 char *out, size_t outlen)
{
    size_t bl = strlen(body), il = strlen(msg_id);
    size_t total = il + 32 + bl;
    char *content = malloc(total);
    if (!content)
        return -1;
    int hl = snprintf(content, total, "%s.%lld.", msg_id, ts);
    if (hl < 0 || (size_t)hl + bl >= total) {
        free(content);
        return -1;
    }
    memcpy(content + hl, body, bl);
    unsigned char mac[32];
    unsigned int ml = 0;
    unsigned char *r = HMAC(EVP_sha256(), key, (int)keylen, (unsigned char *)content, (size_t)hl + bl, mac, &ml);
    free(content);
    if (!r || ml != 32 || outlen < 3 + 45)
        return -1;
    memcpy(out, "v1,", 3);
    return EVP_EncodeBlock((unsigned char *)out + 3, mac, 32) == 44 ? 0 : -1;
}

static size_t discard(char *p, size_t size, size_t n, void *ud)
{
    (void)p;
    (void)ud;
    return size * n;
}

/* One attempt. Returns 1 on a 2xx; 0 otherwise with a reason in err, or -1 when trying
 * again cannot help (the receiver's address is not public and the server does not allow
 * those). */
static int deliver(webhook_sender *w, CURL *c, const store_webhook *wh, char *err, size_t errlen)
{
    long long ts = (long long)time(NULL);
    char sig[64], h_id[80], h_ts[64], h_sig[96];
    if (webhook_sign(w->key, w->keylen, wh->id, ts, wh->payload, sig, sizeof sig) < 0) {
        snprintf(err, errlen, "signing failed");
        return 0;
    }
    snprintf(h_id, sizeof h_id, "webhook-id: %s", wh->id);
    snprintf(h_ts, sizeof h_ts, "webhook-timestamp: %lld", ts);
    snprintf(h_sig, sizeof h_sig, "webhook-signature: %s", sig);
    struct curl_slist *hdrs = NULL, *t;
    const char *lines[] = {"Content-Type: application/json", "User-Agent: autocompress-webhooks/1", h_id, h_ts, h_sig};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        t = curl_slist_append(hdrs, lines[i]);
        if (!t) {
            curl_slist_free_all(hdrs);
            snprintf(err, errlen, "out of memory");
            return 0;
        }
        hdrs = t;
    }
    curl_easy_reset(c);
    fetch_guard guard = {.allow_private = w->allow_private};
    if (fetch_guard_install(c, &guard) < 0) {
        curl_slist_free_all(hdrs);
        snprintf(err, errlen, "libcurl rejected an option");
        return 0;
    }
    curl_easy_setopt(c, CURLOPT_URL, wh->url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, wh->payload);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(wh->payload));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    CURLcode rc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(hdrs);
    if (rc == CURLE_COULDNT_CONNECT && guard.refused[0]) {
        snprintf(err, errlen, "refused to connect to %s, which is not a public address (a server delivers to its own "
                 "network with --allow-private-webhook-hosts%s)", guard.refused, fetch_guard_proxy_note());
        return -1;
    }
    if (rc != CURLE_OK) {
        snprintf(err, errlen, "%s", curl_easy_strerror(rc));
        return 0;
    }
    if (code < 200 || code > 299) {
        snprintf(err, errlen, "HTTP %ld", code);
        return 0;
    }
    return 1;
}

static void *loop(void *arg)
{
    webhook_sender *w = arg;
    CURL *c = curl_easy_init();
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        pthread_mutex_unlock(&w->mu);
        store_webhook *due = NULL;
        int n = 0;
        if (c && store_webhook_due(w->st, store_now(), 16, &due, &n) == 0) {
            for (int i = 0; i < n; i++) {
                char err[300] = "";
                int r = deliver(w, c, &due[i], err, sizeof err), ok = r == 1;
                int attempt = due[i].attempts + 1;
                int give_up = r < 0 || (!ok && attempt >= MAX_ATTEMPTS);
                long long delay = (long long)w->retry_s << (attempt - 1 < 12 ? attempt - 1 : 12);
                if (delay > 3600)
                    delay = 3600;
                store_webhook_result(w->st, due[i].id, due[i].job_id, ok, give_up, store_now() + delay, ok ? NULL : err);
                log_json(ok ? "info" : "warn",
                         json_pack("{s:s,s:s,s:s,s:s,s:i,s:s}", "msg", ok ? "webhook delivered" : "webhook attempt failed",
                                   "id", due[i].id, "job_id", due[i].job_id, "type", due[i].type, "attempt", attempt,
                                   "error", err));
            }
            store_webhook_list_free(due, n);
        }
        pthread_mutex_lock(&w->mu);
        if (w->stop)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    pthread_mutex_unlock(&w->mu);
    if (c)
        curl_easy_cleanup(c);
    return NULL;
}

webhook_sender *webhook_start(store *st, const unsigned char *key, size_t keylen, int retry_s, int allow_private,
                              char *err, size_t errlen)
{
    webhook_sender *w = calloc(1, sizeof *w);
    if (!w || keylen == 0 || keylen > sizeof w->key) {
        free(w);
        snprintf(err, errlen, "bad webhook key");
        return NULL;
    }
    w->st = st;
    memcpy(w->key, key, keylen);
    w->keylen = keylen;
    w->retry_s = retry_s > 0 ? retry_s : 1;
    w->allow_private = allow_private;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, loop, w) != 0) {
        snprintf(err, errlen, "cannot start the webhook thread");
        free(w);
        return NULL;
    }
    return w;
}

void webhook_stop(webhook_sender *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    OPENSSL_cleanse(w->key, sizeof w->key);
    free(w);
}
