/* server/log.h — structured logging: one JSON object per line on stderr, written with a
 * single write(2) so lines from concurrent threads never interleave. Fields "ts" (Unix
 * seconds, fractional) and "level" are added to every line.
 */
#ifndef AC_SERVER_LOG_H
#define AC_SERVER_LOG_H

#include <jansson.h>

/* Log the object (stolen) with level "info" | "warn" | "error". Never fails visibly. */
void log_json(const char *level, json_t *fields);
/* Log {"msg": formatted text}. */
void log_msg(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
