/* storage/utf8.c — checking and mending UTF-8 text (storage/utf8.h). */
#include "storage/utf8.h"

#include <stdlib.h>
#include <string.h>

int utf8_seq(const unsigned char *s)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    int n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    if ((n == 3 && c == 0xE0 && s[1] < 0xA0) || (n == 3 && c == 0xED && s[1] >= 0xA0) ||
        (n == 4 && c == 0xF0 && s[1] < 0x90) || (n == 4 && c == 0xF4 && s[1] >= 0x90))
        return 0;
    return n;
}

int utf8_valid(const char *s)
{
    const unsigned char *t = (const unsigned char *)s;
    while (*t) {
        int n = utf8_seq(t);
        if (!n)
            return 0;
        t += n;
    }
    return 1;
}

char *utf8_mended(const char *s, const char *rep)
{
    size_t len = strlen(s), rl = strlen(rep);
    char *out = malloc(len * (rl > 1 ? rl : 1) + 1), *o = out;
    if (!out)
        return NULL;
    const unsigned char *t = (const unsigned char *)s;
    while (*t) {
        int n = utf8_seq(t);
        if (n) {
            memcpy(o, t, (size_t)n);
            o += n;
            t += n;
        } else {
            memcpy(o, rep, rl);
            o += rl;
            t++;
        }
    }
    *o = 0;
    return out;
}

void utf8_clean(const char *in, char *out, size_t n, int controls)
{
    size_t k = 0;
    const unsigned char *s = (const unsigned char *)(in ? in : "");
    while (*s && k + 4 < n) {
        int len = utf8_seq(s);
        if (len == 0 || (controls && len == 1 && *s < 0x20)) {
            out[k++] = '?';
            s++;
            continue;
        }
        memcpy(out + k, s, (size_t)len);
        k += (size_t)len;
        s += len;
    }
    out[k] = 0;
}

void utf8_cut(char *dst, size_t n, const char *src)
{
    size_t len = strlen(src);
    if (len >= n) {
        len = n - 1;
        while (len > 0 && ((unsigned char)src[len] & 0xC0) == 0x80)
            len--;   /* src[len], the first byte left out, continues a character: leave it all out */
    }
    memcpy(dst, src, len);
    dst[len] = 0;
}
