/* storage/strbuf.h — a growable text buffer for documents built by printf pieces
 * (report pages, model cards, cache keys). Out of memory is sticky: every later append
 * is a no-op and the caller checks `oom` once at the end.
 */
#ifndef AC_STORAGE_STRBUF_H
#define AC_STORAGE_STRBUF_H

#include <stddef.h>

typedef struct {
    char *s;      /* NUL-terminated text once anything was appended (NULL before); owned */
    size_t len, cap;
    int oom;      /* 1 after a failed append: s holds what came before, free it */
} strbuf;

/* Append the formatted text to b, growing it; on failure set b->oom. */
void strbuf_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The JSON Pointer (RFC 6901) of member `key` under pointer `parent` into out (n bytes):
 * "PARENT/KEY" with '~' written "~0" and '/' "~1"; cut to fit. */
void json_ptr_join(char *out, size_t n, const char *parent, const char *key);

#endif
