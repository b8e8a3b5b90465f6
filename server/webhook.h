/* server/webhook.h — delivers the webhook outbox (storage/store.h): a thread that POSTs
 * each due terminal-job event to its callback_url with libcurl, signed per the Standard
 * Webhooks scheme (webhook-id, webhook-timestamp, webhook-signature "v1,BASE64(HMAC-
 * SHA256(secret, id.timestamp.body))"), retrying failures with exponential backoff
 * (retry_s, 2*retry_s, ... capped at an hour; 8 attempts), each poll's due webhooks side
 * by side (a receiver that never answers delays no other). Receivers must be on public
 * addresses unless the server allows its own network. At least once: a delivery
 * interrupted by a crash is sent again after restart.
 */
#ifndef AC_SERVER_WEBHOOK_H
#define AC_SERVER_WEBHOOK_H

#include <stddef.h>

#include "storage/store.h"

typedef struct webhook_sender webhook_sender;

/* Read the signing secret from path: "whsec_BASE64" (Standard Webhooks) or raw text.
 * Returns the key length (> 0) with the key in out, or -1 with err. */
int webhook_load_secret(const char *path, unsigned char *out, size_t outlen, char *err, size_t errlen);
/* The signature header value for one message into out. Returns 0 or -1. */
int webhook_sign(const unsigned char *key, size_t keylen, const char *msg_id, long long ts, const char *body,
                 char *out, size_t outlen);
/* Start the sender (st borrowed; key copied). Unless allow_private, every delivery must
 * connect to a public address: one to loopback, a private or link-local network or the
 * like fails for good at once, naming the address (fetch_guard). curl_global_init must
 * have run. Returns a new sender, or NULL with err. */
webhook_sender *webhook_start(store *st, const unsigned char *key, size_t keylen, int retry_s, int allow_private,
                              char *err, size_t errlen);
/* Stop: the deliveries in flight are cut short (their webhooks stay pending and are sent
 * again after the restart); frees w. */
void webhook_stop(webhook_sender *w);

#endif
