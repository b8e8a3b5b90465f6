/* server/log.c — JSON lines on stderr (see log.h). */
#include "server/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void log_json(const char *level, json_t *fields)
{
    if (!fields)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    json_object_set_new(fields, "ts", json_real((double)ts.tv_sec + ts.tv_nsec * 1e-9));
    json_object_set_new(fields, "level", json_string(level));
    char *line = json_dumps(fields, JSON_COMPACT | JSON_REAL_PRECISION(16));
    json_decref(fields);
    if (!line)
        return;
    size_t n = strlen(line);
    line[n] = '\n';
    const char *p = line;
    size_t left = n + 1;
    while (left) {
        ssize_t w = write(2, p, left);
        if (w <= 0)
            break;
        p += w;
        left -= (size_t)w;
    }
    free(line);
}

void log_msg(const char *level, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    log_json(level, json_pack("{s:s}", "msg", buf));
}

/* in, up to `stop` (0: its end), as the inside of a JSON string into out (n bytes): quotes
 * and backslashes escaped, control and non-ASCII bytes as \u00XX; cut to fit. */
static void log_escape(const char *in, char stop, char *out, size_t n)
{
    size_t k = 0;
    for (const char *p = in ? in : ""; *p && *p != stop && k + 8 < n; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') {
            out[k++] = '\\';
            out[k++] = (char)c;
        } else if (c < 0x20 || c >= 0x7f) {
            k += (size_t)snprintf(out + k, n - k, "\\u%04x", c);
        } else {
            out[k++] = (char)c;
        }
    }
    out[k] = 0;
}

void log_access(const char *method, const char *uri, int status, uint64_t bytes, double dur_s,
                const char *request_id, const char *remote, int by_library, const char *term)
{
    char path[600], meth[120];
    log_escape(uri, '?', path, sizeof path);
    log_escape(method, 0, meth, sizeof meth);   /* a client's method is any token, quotes included */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char line[1024];
    int n = snprintf(line, sizeof line,
                     "{\"ts\":%lld.%06ld,\"level\":\"%s\",\"msg\":\"request\",\"method\":\"%s\",\"path\":\"%s\","
                     "\"status\":%d,\"bytes\":%llu,\"duration_ms\":%.3f,\"request_id\":\"%s\",\"remote\":\"%s\"%s%s%s%s}\n",
                     (long long)ts.tv_sec, ts.tv_nsec / 1000, status >= 500 ? "error" : "info", meth, path, status,
                     (unsigned long long)bytes, dur_s * 1000.0, request_id && request_id[0] ? request_id : "-", remote,
                     by_library ? ",\"answered_by\":\"libmicrohttpd\"" : "", term ? ",\"terminated\":\"" : "",
                     term ? term : "", term ? "\"" : "");
    if (n > 0) {
        ssize_t w = write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)w;
    }
}
