/* storage/fetch_addr.c — which addresses the product's outgoing connections may reach
 * (fetch.h): the public-address rule, the per-connection guard that fetch_url and the
 * webhook sender install on their curl handles, the early judgement of a URL's host, and
 * how a URL is shown (its query's secrets hidden).
 */
#include "storage/fetch.h"

#include <curl/curl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

/* 1 when the IPv4 address a (host order) is not on the public internet: this network, RFC
 * 1918, shared (CGNAT), loopback, link-local (cloud metadata services at 169.254.169.254),
 * IETF protocol assignments, benchmarking, multicast, reserved and broadcast. */
static int v4_non_public(uint32_t a)
{
    static const struct { uint32_t net, mask; } blocks[] = {
        {0x00000000, 0xff000000}, {0x0a000000, 0xff000000}, {0x64400000, 0xffc00000}, {0x7f000000, 0xff000000},
        {0xa9fe0000, 0xffff0000}, {0xac100000, 0xfff00000}, {0xc0000000, 0xffffff00}, {0xc0a80000, 0xffff0000},
        {0xc6120000, 0xfffe0000}, {0xe0000000, 0xe0000000},
    };
    for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++)
        if ((a & blocks[i].mask) == blocks[i].net)
            return 1;
    return 0;
}

int fetch_addr_non_public(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return v4_non_public(ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr));
    if (sa->sa_family != AF_INET6)
        return 1;
    const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff},
                         nat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0},
                         compat[12] = {0},                               /* ::a.b.c.d; :: and ::1 too */
                         nat64_local[6] = {0, 0x64, 0xff, 0x9b, 0, 1},   /* 64:ff9b:1::/48 */
                         teredo[4] = {0x20, 0x01, 0, 0}, doc[4] = {0x20, 0x01, 0x0d, 0xb8};
    if (!memcmp(b, mapped, 12) || !memcmp(b, nat64, 12) || !memcmp(b, compat, 12))   /* an IPv4 address inside */
        return v4_non_public((uint32_t)b[12] << 24 | (uint32_t)b[13] << 16 | (uint32_t)b[14] << 8 | b[15]);
    if (b[0] == 0x20 && b[1] == 0x02)   /* 6to4: 2002:a.b.c.d::/48 */
        return v4_non_public((uint32_t)b[2] << 24 | (uint32_t)b[3] << 16 | (uint32_t)b[4] << 8 | b[5]);
    if (!memcmp(b, nat64_local, 6) || !memcmp(b, teredo, 4) || !memcmp(b, doc, 4))
        return 1;
    /* ULA fc00::/7, link-local fe80::/10, site-local fec0::/10, multicast ff00::/8 */
    return (b[0] & 0xfe) == 0xfc || (b[0] == 0xfe && (b[1] & 0x80) == 0x80) || b[0] == 0xff;
}

/* curl's socket for each connection it makes, redirects included: refused (CURL_SOCKET_BAD,
 * the address kept in g->refused) when it goes to a non-public address and the caller does
 * not allow those, so a URL, or a redirect, cannot reach the server's own network. */
static curl_socket_t guard_opensocket(void *u, curlsocktype purpose, struct curl_sockaddr *a)
{
    fetch_guard *g = u;
    if (purpose == CURLSOCKTYPE_IPCXN && !g->allow_private && fetch_addr_non_public(&a->addr)) {
        const void *in = a->addr.sa_family == AF_INET ? (const void *)&((struct sockaddr_in *)&a->addr)->sin_addr
                                                      : (const void *)&((struct sockaddr_in6 *)&a->addr)->sin6_addr;
        if (!inet_ntop(a->addr.sa_family, in, g->refused, sizeof g->refused))
            snprintf(g->refused, sizeof g->refused, "a non-public address");
        return CURL_SOCKET_BAD;
    }
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

int fetch_url_host_non_public(const char *url)
{
    const char *p = strstr(url, "://");
    if (!p)
        return 0;
    p += 3;
    size_t n = strcspn(p, "/?#");
    const char *at = memchr(p, '@', n);   /* user:password@ */
    while (at) {
        n -= (size_t)(at + 1 - p);
        p = at + 1;
        at = memchr(p, '@', n);
    }
    char host[256];
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    if (n > 0 && *p == '[') {
        const char *e = memchr(p, ']', n);
        if (!e || (size_t)(e - p - 1) >= sizeof host)
            return 0;
        memcpy(host, p + 1, (size_t)(e - p - 1));
        host[e - p - 1] = 0;
        host[strcspn(host, "%")] = 0;   /* a zone id: fe80::1%eth0 */
        ss.ss_family = AF_INET6;
        return inet_pton(AF_INET6, host, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1 &&
               fetch_addr_non_public((struct sockaddr *)&ss);
    }
    const char *colon = memchr(p, ':', n);
    size_t hl = colon ? (size_t)(colon - p) : n;
    if (hl >= sizeof host)
        return 0;
    memcpy(host, p, hl);
    host[hl] = 0;
    if (hl > 0 && host[hl - 1] == '.')
        host[--hl] = 0;
    /* "localhost" and its subdomains resolve to loopback (RFC 6761; libcurl does so itself) */
    if (!strcasecmp(host, "localhost") || (hl > 10 && !strcasecmp(host + hl - 10, ".localhost")))
        return 1;
    ss.ss_family = AF_INET;
    return inet_pton(AF_INET, host, &((struct sockaddr_in *)&ss)->sin_addr) == 1 &&
           fetch_addr_non_public((struct sockaddr *)&ss);
}

const char *fetch_guard_proxy_note(void)
{
    return getenv("https_proxy") || getenv("HTTPS_PROXY") || getenv("http_proxy") || getenv("ALL_PROXY") ||
                   getenv("all_proxy")
               ? "; a proxy is set in the environment, and this may be its address"
               : "";
}

int fetch_guard_install(void *curl, fetch_guard *g)
{
    g->refused[0] = 0;
    return curl_easy_setopt(curl, CURLOPT_OPENSOCKETFUNCTION, guard_opensocket) ||
                   curl_easy_setopt(curl, CURLOPT_OPENSOCKETDATA, g)
               ? -1
               : 0;
}

void fetch_url_shown(const char *url, char *out, size_t n)
{
    if (!n)
        return;
    size_t k = 0;
#define PUT(str, len) do { size_t l_ = (len); if (k + l_ >= n) l_ = n - 1 - k; memcpy(out + k, (str), l_); \
        k += l_; } while (0)
    const char *q = url + strcspn(url, "?#");
    PUT(url, (size_t)(q - url));
    if (*q == '?') {
        PUT("?", 1);
        const char *p = q + 1;
        while (*p && *p != '#') {
            size_t len = strcspn(p, "&#"), name = strcspn(p, "=&#");
            if (name < len) {   /* name=value: the name stays */
                PUT(p, name + 1);
                PUT("REDACTED", 8);
            } else if (len) {   /* a bare parameter may be the secret itself */
                PUT("REDACTED", 8);
            }
            p += len;
            if (*p == '&') {
                PUT("&", 1);
                p++;
            }
        }
    }
#undef PUT
    out[k] = 0;
}
