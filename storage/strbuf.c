/* storage/strbuf.c — see strbuf.h. */
#include "storage/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void strbuf_printf(strbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
}

void json_ptr_join(char *out, size_t n, const char *parent, const char *key)
{
    if (!n)
        return;
    int w = snprintf(out, n, "%s/", parent);
    size_t k = w < 0 ? 0 : (size_t)w < n ? (size_t)w : n - 1;
    for (const char *p = key; *p && k + 3 < n; p++) {
        if (*p == '~' || *p == '/') {
            out[k++] = '~';
            out[k++] = *p == '~' ? '0' : '1';
        } else {
            out[k++] = *p;
        }
    }
    out[k] = 0;
}
