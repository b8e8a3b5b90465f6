/* storage/utf8.h — UTF-8 as the service stores and shows text that may not be valid: a
 * message cut at a byte limit inside a character, a path of other bytes quoted in an
 * error. JSON (jansson) and PostgreSQL refuse such text, so it is checked and mended
 * here, in one place.
 */
#ifndef AC_STORAGE_UTF8_H
#define AC_STORAGE_UTF8_H

#include <stddef.h>

/* Length of the valid UTF-8 sequence at s (1-4), or 0 when it is not one: overlong forms,
 * surrogates and code points past U+10FFFF are not. s is NUL-terminated. */
int utf8_seq(const unsigned char *s);

/* 1 when s is valid UTF-8 throughout. */
int utf8_valid(const char *s);

/* A malloc'd copy of s with each byte outside a valid sequence replaced by rep (U+FFFD as
 * "\xef\xbf\xbd", or "?"). NULL on OOM. */
char *utf8_mended(const char *s, const char *rep);

/* Copy in to out (capacity n > 4; what does not fit is left out), each byte outside a
 * valid sequence replaced by '?', and each control byte too where `controls`. */
void utf8_clean(const char *in, char *out, size_t n, int controls);

/* src copied into dst (capacity n > 0); cut where it does not fit at the start of a
 * character, never inside one, so that valid text stays valid. */
void utf8_cut(char *dst, size_t n, const char *src);

#endif
