/* server/cli_health.c — `autocompress healthcheck`: asks a running server's /healthz (or
 * /readyz) and exits 0 when it answers 200, 1 otherwise with one line naming why. It is
 * the container health check (runtime images carry no curl): with no --url it finds the
 * server where `serve` would listen with the same settings (AC_LISTEN), a wildcard
 * address asked on loopback.
 */
#include <curl/curl.h>
#include <stdio.h>
#include <string.h>

#include "server/cli.h"
#include "server/cli_args.h"
#include "server/config.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: autocompress healthcheck [--url http://HOST:PORT] [--ready] [--timeout-s S]\n"
               "Exits 0 when the server answers GET /healthz (with --ready: /readyz, which also checks\n"
               "the job store and the artifact directory) with 200, else 1 with the reason on stderr.\n"
               "Default URL: where `autocompress serve` listens with the same settings (AC_LISTEN,\n"
               "default 127.0.0.1:8080; 0.0.0.0 and :: are asked on loopback). Timeout 5 s.\n");
}

/* The base URL `serve` would answer on with this environment. 0, or -1 with err. */
static int default_url(char *out, size_t n, char *err, size_t errlen)
{
    srv_config c;
    char *argv[] = {"healthcheck", NULL};
    if (srv_config_parse(1, argv, &c, err, errlen))
        return -1;
    const char *h = c.host;
    int v6 = strchr(h, ':') != NULL;
    if (!strcmp(h, "0.0.0.0") || !*h)
        h = "127.0.0.1";
    else if (!strcmp(h, "::"))
        h = "::1";
    int w = snprintf(out, n, v6 ? "http://[%s]:%d" : "http://%s:%d", h, c.port);
    srv_config_free(&c);
    if (w < 0 || (size_t)w >= n) {
        snprintf(err, errlen, "the listen address is too long");
        return -1;
    }
    return 0;
}

/* Keep the first bytes of the body (a problem's detail) for the message. */
typedef struct {
    char buf[512];
    size_t len;
} body_head;

static size_t keep(char *p, size_t size, size_t n, void *ud)
{
    body_head *b = ud;
    size_t k = size * n, room = sizeof b->buf - 1 - b->len;
    memcpy(b->buf + b->len, p, k < room ? k : room);
    b->len += k < room ? k : room;
    b->buf[b->len] = 0;
    return size * n;
}

int cli_healthcheck(int argc, char **argv)
{
    static const struct option opts[] = {{"url", required_argument, NULL, 'u'},
                                         {"ready", no_argument, NULL, 'r'},
                                         {"timeout-s", required_argument, NULL, 't'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    cli_parser p;
    cli_init(&p, "healthcheck", argc, argv, opts, NULL, usage);
    char base[1024] = "";
    int ready = 0, timeout_s = 5, c;
    while ((c = cli_next(&p)) > 0) {
        if (c == 'u')
            cli_str(&p, base, sizeof base);
        else if (c == 'r')
            ready = 1;
        else if (c == 't')
            cli_int(&p, 1, 300, &timeout_s);
    }
    if (c != CLI_END)
        return cli_status(c);
    if (cli_no_more_operands(&p))
        return 2;
    char err[512];
    if (!*base && default_url(base, sizeof base, err, sizeof err)) {
        fprintf(stderr, "healthcheck: %s\n", err);
        return 2;
    }
    if (strncmp(base, "http://", 7) && strncmp(base, "https://", 8)) {
        fprintf(stderr, "healthcheck: --url \"%s\" is not an http:// or https:// URL\n", base);
        return 2;
    }
    size_t bl = strlen(base);
    while (bl > 0 && base[bl - 1] == '/')
        base[--bl] = 0;
    char url[1100];
    snprintf(url, sizeof url, "%s%s", base, ready ? "/readyz" : "/healthz");
    if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
        fprintf(stderr, "healthcheck: libcurl could not start\n");
        return 1;
    }
    CURL *h = curl_easy_init();
    if (!h) {
        fprintf(stderr, "healthcheck: libcurl could not start\n");
        curl_global_cleanup();
        return 1;
    }
    body_head body = {.len = 0};
    body.buf[0] = 0;
    char cerr[CURL_ERROR_SIZE] = "";
    long code = 0;
    int ok = curl_easy_setopt(h, CURLOPT_URL, url) == CURLE_OK &&
             curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https") == CURLE_OK &&
             curl_easy_setopt(h, CURLOPT_TIMEOUT, (long)timeout_s) == CURLE_OK &&
             curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L) == CURLE_OK &&
             curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr) == CURLE_OK &&
             curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, keep) == CURLE_OK &&
             curl_easy_setopt(h, CURLOPT_WRITEDATA, &body) == CURLE_OK;
    CURLcode rc = ok ? curl_easy_perform(h) : CURLE_FAILED_INIT;
    if (rc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    curl_global_cleanup();
    if (rc != CURLE_OK) {
        fprintf(stderr, "healthcheck: %s: %s\n", url, *cerr ? cerr : curl_easy_strerror(rc));
        return 1;
    }
    if (code != 200) {
        for (char *q = body.buf; *q; q++)
            if (*q == '\n' || *q == '\r')
                *q = ' ';
        fprintf(stderr, "healthcheck: %s answered %ld: %s\n", url, code, body.buf);
        return 1;
    }
    return 0;
}
