/* server/http.h — the HTTP daemon: libmicrohttpd with an internal poll() thread per
 * pool thread, explicit connection / per-IP / idle-timeout / memory limits, a deadline
 * for each request to arrive whole, early rejection (414/431 by size, ambiguous framing,
 * auth, 404/405, 413 by Content-Length, 415) on the first callback, a capped body
 * buffer, long-polls parked with suspend/resume (woken when the store changes or their
 * wait ends), X-Request-Id on every response we write and one JSON access-log line per
 * request. What libmicrohttpd answers itself (it never reaches us) is in docs/http.md.
 */
#ifndef AC_SERVER_HTTP_H
#define AC_SERVER_HTTP_H

#include <stddef.h>

#include "api/api.h"
#include "server/auth.h"
#include "server/config.h"

typedef struct http_server http_server;

/* Start listening. api and auth (NULL: open) are borrowed and must outlive the server.
 * Returns a new server, or NULL with err. */
http_server *http_start(const srv_config *cfg, api_ctx *api, const auth *au, char *err, size_t errlen);
/* The bound port (useful with port 0). */
int http_port(http_server *h);
/* The libmicrohttpd version linked at run time, e.g. "0.9.75" (static storage). */
const char *http_library_version(void);
/* Stop accepting connections and answer every parked long-poll now. */
void http_quiesce(http_server *h);
/* Finish in-flight requests, stop the threads, free h. */
void http_stop(http_server *h);

#endif
