/* server/auth.h — optional bearer tokens with read and write scopes, loaded from a file
 * of lines "TOKEN SCOPES" (SCOPES: read, write or read,write; '#' starts a comment).
 * Tokens are kept only as sha-256 digests and compared in constant time.
 */
#ifndef AC_SERVER_AUTH_H
#define AC_SERVER_AUTH_H

#include <stddef.h>

typedef struct auth auth;

/* Load tokens from path. Returns a new table (auth_free), or NULL with err (unreadable
 * file, bad line, no tokens). */
auth *auth_load(const char *path, char *err, size_t errlen);
void auth_free(auth *a);
/* Check an Authorization header value for a route needing write (1) or read (0).
 * Returns 0 when allowed, 401 when the token is missing or unknown, 403 when it lacks
 * the scope. */
int auth_check(const auth *a, const char *authorization, int need_write);

#endif
