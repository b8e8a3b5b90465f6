/* server/webhook.c — the webhook sender thread (webhook.h). Up to 16 deliveries are in
 * flight at once on one libcurl multi handle, and the outbox is polled every 200 ms while
 * they run, so a receiver that never answers holds up no other; http and https only, no
 * redirects, 5 s to connect and 10 s in all per attempt, connections to non-public
 * addresses only when the server allows them (fetch_guard). The store records each
 * attempt in one transaction as it ends; one whose outcome it could not record is held
 * back until its next attempt would be due. A stop cuts the deliveries in flight short.
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
#include <unistd.h>

#include "engine/clock.h"
#include "server/log.h"
#include "storage/fetch.h"

#define MAX_ATTEMPTS 8
#define IN_FLIGHT 16   /* deliveries side by side */

struct webhook_sender {
    store *st;
    unsigned char key[256];
    size_t keylen;
    int retry_s;
    int allow_private;   /* receivers on loopback, private and link-local addresses */
    pthread_t thread;
    pthread_mutex_t mu;
    CURLM *m;            /* the deliveries in flight; curl_multi_wakeup ends its wait on a stop */
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

/* One delivery in flight: its webhook, easy handle, headers and connection guard. A slot
 * never moves while its transfer runs (the handle holds the guard's address). */
typedef struct {
    int used;
    store_webhook wh;   /* owns wh.payload */
    CURL *c;
    struct curl_slist *hdrs;
    fetch_guard guard;
    char err[300];
    int result;         /* 1 delivered (2xx); 0 failed, to retry; -1 failed for good */
} flight;

static int stop_requested(webhook_sender *w)
{
    pthread_mutex_lock(&w->mu);
    int s = w->stop;
    pthread_mutex_unlock(&w->mu);
    return s;
}

/* Set up f's attempt on a new easy handle. 0, or -1 with f->err. */
static int flight_prepare(webhook_sender *w, flight *f)
{
    const store_webhook *wh = &f->wh;
    long long ts = (long long)time(NULL);
    char sig[64], h_id[80], h_ts[64], h_sig[96];
    if (webhook_sign(w->key, w->keylen, wh->id, ts, wh->payload, sig, sizeof sig) < 0) {
        snprintf(f->err, sizeof f->err, "signing failed");
        return -1;
    }
    snprintf(h_id, sizeof h_id, "webhook-id: %s", wh->id);
    snprintf(h_ts, sizeof h_ts, "webhook-timestamp: %lld", ts);
    snprintf(h_sig, sizeof h_sig, "webhook-signature: %s", sig);
    const char *lines[] = {"Content-Type: application/json", "User-Agent: autocompress-webhooks/1", h_id, h_ts, h_sig};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        struct curl_slist *t = curl_slist_append(f->hdrs, lines[i]);
        if (!t) {
            snprintf(f->err, sizeof f->err, "out of memory");
            return -1;
        }
        f->hdrs = t;
    }
    f->guard.allow_private = w->allow_private;
    if (!(f->c = curl_easy_init()) || fetch_guard_install(f->c, &f->guard) < 0 ||
        curl_easy_setopt(f->c, CURLOPT_URL, wh->url) || curl_easy_setopt(f->c, CURLOPT_PROTOCOLS_STR, "http,https") ||
        curl_easy_setopt(f->c, CURLOPT_FOLLOWLOCATION, 0L) || curl_easy_setopt(f->c, CURLOPT_NOSIGNAL, 1L) ||
        curl_easy_setopt(f->c, CURLOPT_CONNECTTIMEOUT_MS, 5000L) || curl_easy_setopt(f->c, CURLOPT_TIMEOUT_MS, 10000L) ||
        curl_easy_setopt(f->c, CURLOPT_HTTPHEADER, f->hdrs) || curl_easy_setopt(f->c, CURLOPT_POSTFIELDS, wh->payload) ||
        curl_easy_setopt(f->c, CURLOPT_POSTFIELDSIZE, (long)strlen(wh->payload)) ||
        curl_easy_setopt(f->c, CURLOPT_WRITEFUNCTION, discard) || curl_multi_add_handle(w->m, f->c) != CURLM_OK) {
        snprintf(f->err, sizeof f->err, "libcurl could not start the delivery");
        return -1;
    }
    return 0;
}

/* Free what f holds (its handle leaves the multi handle first). */
static void flight_free(webhook_sender *w, flight *f)
{
    if (f->c) {
        curl_multi_remove_handle(w->m, f->c);
        curl_easy_cleanup(f->c);
    }
    curl_slist_free_all(f->hdrs);
    free(f->wh.payload);
    memset(f, 0, sizeof *f);
}

/* The outcome of f's finished transfer (rc its result). */
static void flight_outcome(flight *f, CURLcode rc)
{
    long code = 0;
    curl_easy_getinfo(f->c, CURLINFO_RESPONSE_CODE, &code);
    if (rc == CURLE_COULDNT_CONNECT && f->guard.refused[0]) {
        char addr[sizeof f->guard.refused];
        memcpy(addr, f->guard.refused, sizeof addr);
        snprintf(f->err, sizeof f->err, "refused to connect to %s, which is not a public address (a server delivers "
                 "to its own network with --allow-private-webhook-hosts%s)", addr, fetch_guard_proxy_note());
        f->result = -1;
    } else if (rc != CURLE_OK) {
        snprintf(f->err, sizeof f->err, "%s", curl_easy_strerror(rc));
    } else if (code < 200 || code > 299) {
        snprintf(f->err, sizeof f->err, "HTTP %ld", code);
    } else {
        f->result = 1;
    }
}

/* Webhooks whose outcome could not be recorded (the store busy or away) are held back
 * here until their next attempt would be due, rather than sent again at every poll. */
#define HELD_MAX 64
typedef struct {
    char id[48];
    double until;   /* monotonic s */
} held;

static int is_held(const held *h, int n, const char *id, double now)
{
    for (int i = 0; i < n; i++)
        if (h[i].until > now && !strcmp(h[i].id, id))
            return 1;
    return 0;
}

static void hold(held *h, int *n, const char *id, double until)
{
    int slot = 0;
    if (*n < HELD_MAX)
        slot = (*n)++;
    else
        for (int i = 1; i < *n; i++)   /* full: the entry that expires first goes */
            if (h[i].until < h[slot].until)
                slot = i;
    snprintf(h[slot].id, sizeof h[slot].id, "%s", id);
    h[slot].until = until;
}

/* Record f's attempt (and log it); one the store could not record is held back. */
static void record(webhook_sender *w, flight *f, held *h, int *n_held)
{
    int ok = f->result == 1, attempt_no = f->wh.attempts + 1;
    int give_up = f->result < 0 || (!ok && attempt_no >= MAX_ATTEMPTS);
    long long delay = (long long)w->retry_s << (attempt_no - 1 < 12 ? attempt_no - 1 : 12);
    if (delay > 3600)
        delay = 3600;
    if (store_webhook_result(w->st, f->wh.id, f->wh.job_id, ok, give_up, store_now() + delay, ok ? NULL : f->err) < 0) {
        hold(h, n_held, f->wh.id, eng_wall_s() + (double)delay);
        log_json("warn", json_pack("{s:s,s:s,s:s,s:b,s:I}", "msg",
                                   "webhook outcome not recorded (the store is unavailable); held back", "id",
                                   f->wh.id, "job_id", f->wh.job_id, "delivered", ok, "retry_in_s", (json_int_t)delay));
    }
    log_json(ok ? "info" : "warn",
             json_pack("{s:s,s:s,s:s,s:s,s:i,s:s}", "msg", ok ? "webhook delivered" : "webhook attempt failed", "id",
                       f->wh.id, "job_id", f->wh.job_id, "type", f->wh.type, "attempt", attempt_no, "error", f->err));
}

/* Start the due webhooks that are neither in flight nor held back, in free slots. */
static void take_due(webhook_sender *w, flight *fl, int *nfl, held *h, int *n_held)
{
    store_webhook *due = NULL;
    int n = 0;
    if (store_webhook_due(w->st, store_now(), IN_FLIGHT + *nfl, &due, &n) != 0)
        return;
    double now = eng_wall_s();
    for (int i = 0; i < n; i++) {
        int busy = is_held(h, *n_held, due[i].id, now), slot = -1;
        for (int k = 0; k < IN_FLIGHT && !busy; k++) {
            busy = fl[k].used && !strcmp(fl[k].wh.id, due[i].id);
            if (!fl[k].used && slot < 0)
                slot = k;
        }
        if (busy || slot < 0) {
            free(due[i].payload);
            continue;
        }
        flight *f = &fl[slot];
        memset(f, 0, sizeof *f);
        f->used = 1;
        f->wh = due[i];   /* takes the payload */
        (*nfl)++;
        if (flight_prepare(w, f) < 0) {   /* a failed attempt, recorded as one */
            record(w, f, h, n_held);
            flight_free(w, f);
            (*nfl)--;
        }
    }
    free(due);
}

/* libcurl's multi interface failed (out of memory, an internal error): said, the deliveries
 * in flight dropped (they stay pending in the store and are taken again), a pause, and the
 * loop goes on; it used to end, and every later webhook waited for a restart. */
static void multi_failed(webhook_sender *w, flight *fl, int *nfl, const char *call, CURLMcode mc)
{
    log_json("error", json_pack("{s:s,s:s,s:s}", "msg", "webhook sender: libcurl failed; the deliveries in flight "
                                "are sent again", "call", call, "error", curl_multi_strerror(mc)));
    for (int i = 0; i < IN_FLIGHT; i++)
        if (fl[i].used)
            flight_free(w, &fl[i]);
    *nfl = 0;
    for (int i = 0; i < 20 && !stop_requested(w); i++)
        usleep(50 * 1000);
}

static void *loop(void *arg)
{
    webhook_sender *w = arg;
    flight fl[IN_FLIGHT];
    memset(fl, 0, sizeof fl);
    int nfl = 0, n_held = 0;
    held held_back[HELD_MAX];
    double last_poll = -1;
    while (!stop_requested(w)) {
        double now = eng_wall_s();
        if (nfl < IN_FLIGHT && (last_poll < 0 || now - last_poll >= 0.2)) {
            last_poll = now;
            take_due(w, fl, &nfl, held_back, &n_held);
        }
        int running = 0, left = 0;
        CURLMcode mc = nfl > 0 ? curl_multi_perform(w->m, &running) : CURLM_OK;
        if (mc != CURLM_OK) {
            multi_failed(w, fl, &nfl, "curl_multi_perform", mc);
            continue;
        }
        for (CURLMsg *msg; (msg = curl_multi_info_read(w->m, &left));) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            for (int i = 0; i < IN_FLIGHT; i++)
                if (fl[i].used && fl[i].c == msg->easy_handle) {
                    flight_outcome(&fl[i], msg->data.result);
                    record(w, &fl[i], held_back, &n_held);
                    flight_free(w, &fl[i]);
                    nfl--;
                    break;
                }
        }
        /* sleeps until a transfer needs attention, the next poll is due, or a stop */
        if ((mc = curl_multi_poll(w->m, NULL, 0, 200, NULL)) != CURLM_OK)
            multi_failed(w, fl, &nfl, "curl_multi_poll", mc);
    }
    /* a stop cuts the deliveries in flight short: they stay pending, sent after the restart */
    for (int i = 0; i < IN_FLIGHT; i++)
        if (fl[i].used)
            flight_free(w, &fl[i]);
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
    if (!(w->m = curl_multi_init())) {
        snprintf(err, errlen, "cannot set up the webhook sender (libcurl)");
        pthread_mutex_destroy(&w->mu);
        free(w);
        return NULL;
    }
    if (pthread_create(&w->thread, NULL, loop, w) != 0) {
        snprintf(err, errlen, "cannot start the webhook thread");
        curl_multi_cleanup(w->m);
        pthread_mutex_destroy(&w->mu);
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
    pthread_mutex_unlock(&w->mu);
    curl_multi_wakeup(w->m);
    pthread_join(w->thread, NULL);
    curl_multi_cleanup(w->m);
    pthread_mutex_destroy(&w->mu);
    OPENSSL_cleanse(w->key, sizeof w->key);
    free(w);
}
