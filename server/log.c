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
