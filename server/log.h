/* server/log.h — structured logging: one JSON object per line on stderr, written with a
 * single write(2) so lines from concurrent threads never interleave. Fields "ts" (Unix
 * seconds, fractional) and "level" are added to every line.
 */
#ifndef AC_SERVER_LOG_H
#define AC_SERVER_LOG_H

#include <stdint.h>
#include <jansson.h>

/* Log the object (stolen) with level "info" | "warn" | "error". Never fails visibly. */
void log_json(const char *level, json_t *fields);
/* Log {"msg": formatted text}. */
void log_msg(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The access-log line of one request, formatted by hand (it runs for every request):
 * method and the path of uri (before '?') escaped, status, bytes sent, duration, request id
 * ("-" when empty), the client's address, "answered_by":"libmicrohttpd" when by_library,
 * and "terminated":term unless term is NULL. Level "error" for a 5xx. */
void log_access(const char *method, const char *uri, int status, uint64_t bytes, double dur_s,
                const char *request_id, const char *remote, int by_library, const char *term);

#endif
