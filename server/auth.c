/* server/auth.c — bearer token table (auth.h). Every check hashes the presented token
 * and compares it against every stored digest with CRYPTO_memcmp, without an early exit,
 * so timing reveals neither which token matched nor how much of it.
 */
#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    unsigned char digest[32];
    int read, write;
} token;

struct auth {
    token *t;
    int n;
};

static int sha256(const char *s, size_t n, unsigned char out[32])
{
    unsigned int len = 0;
    return EVP_Digest(s, n, out, &len, EVP_sha256(), NULL) && len == 32 ? 0 : -1;
}

auth *auth_load(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open the tokens file", path);
        return NULL;
    }
    auth *a = calloc(1, sizeof *a);
    char line[1024];
    int lineno = 0, ok = a != NULL;
    while (ok && fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = 0;
        char tok[600] = "", scopes[128] = "", extra[8] = "";
        int k = sscanf(line, "%599s %127s %7s", tok, scopes, extra);
        if (k <= 0)
            continue;
        if (k != 2 || strlen(tok) < 16) {
            snprintf(err, errlen, "%s:%d: expected 'TOKEN SCOPES' with a token of at least 16 characters", path, lineno);
            ok = 0;
            break;
        }
        token t = {{0}, 0, 0};
        for (char *s = scopes, *next; s && *s; s = next) {
            next = strchr(s, ',');
            if (next)
                *next++ = 0;
            if (!strcmp(s, "read"))
                t.read = 1;
            else if (!strcmp(s, "write"))
                t.write = 1;
            else {
                snprintf(err, errlen, "%s:%d: unknown scope '%s' (read, write)", path, lineno, s);
                ok = 0;
            }
        }
        token *nt = ok ? realloc(a->t, (size_t)(a->n + 1) * sizeof *nt) : NULL;
        if (!nt || sha256(tok, strlen(tok), t.digest) < 0) {
            if (ok)
                snprintf(err, errlen, "out of memory");
            ok = 0;
            break;
        }
        a->t = nt;
        a->t[a->n++] = t;
        OPENSSL_cleanse(tok, sizeof tok);
    }
    fclose(f);
    if (ok && a->n == 0) {
        snprintf(err, errlen, "%s: no tokens", path);
        ok = 0;
    }
    if (!ok) {
        auth_free(a);
        return NULL;
    }
    return a;
}

void auth_free(auth *a)
{
    if (!a)
        return;
    free(a->t);
    free(a);
}

int auth_check(const auth *a, const char *authorization, int need_write)
{
    if (!authorization || strncasecmp(authorization, "Bearer ", 7) != 0)
        return 401;
    const char *tok = authorization + 7;
    while (*tok == ' ')
        tok++;
    unsigned char d[32];
    if (!*tok || sha256(tok, strlen(tok), d) < 0)
        return 401;
    int found = -1;
    for (int i = 0; i < a->n; i++) {
        int eq = CRYPTO_memcmp(d, a->t[i].digest, 32) == 0;
        found = eq ? i : found; /* no early exit */
    }
    if (found < 0)
        return 401;
    int allowed = need_write ? a->t[found].write : a->t[found].read;
    return allowed ? 0 : 403;
}
