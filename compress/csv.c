/* compress/csv.c — RFC-4180 CSV parsing into an in-memory table (see csv.h).
 *
 * A small state machine over the buffer: each field is accumulated into a growable
 * byte buffer, each record into a growable array of fields. Quotes are only special
 * at the start of a field (RFC 4180); "" inside a quoted field is one quote.
 */
#include "compress/csv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *b;
    size_t n, cap;
} csv_buf;

static int buf_push(csv_buf *s, char c)
{
    if (s->n + 1 >= s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        char *nb = realloc(s->b, cap);
        if (!nb)
            return -1;
        s->b = nb;
        s->cap = cap;
    }
    s->b[s->n++] = c;
    return 0;
}

/* Append the current field (steals a copy of s) to record r. */
static int record_push(csv_record *r, int *cap, csv_buf *s)
{
    if (r->n_fields == *cap) {
        int nc = *cap ? *cap * 2 : 8;
        char **nf = realloc(r->fields, (size_t)nc * sizeof *nf);
        if (!nf)
            return -1;
        r->fields = nf;
        *cap = nc;
    }
    char *f = malloc(s->n + 1);
    if (!f)
        return -1;
    if (s->n)
        memcpy(f, s->b, s->n);
    f[s->n] = '\0';
    r->fields[r->n_fields++] = f;
    s->n = 0;
    return 0;
}

static void record_free(csv_record *r)
{
    for (int i = 0; i < r->n_fields; i++)
        free(r->fields[i]);
    free(r->fields);
    r->fields = NULL;
    r->n_fields = 0;
}

static int table_push(csv_table *t, int *cap, csv_record *r)
{
    if (t->n_records == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        csv_record *nr = realloc(t->records, (size_t)nc * sizeof *nr);
        if (!nr)
            return -1;
        t->records = nr;
        *cap = nc;
    }
    t->records[t->n_records++] = *r;
    memset(r, 0, sizeof *r);
    return 0;
}

void csv_free(csv_table *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n_records; i++)
        record_free(&t->records[i]);
    free(t->records);
    t->records = NULL;
    t->n_records = 0;
}

int csv_parse(const char *buf, size_t len, csv_table *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    csv_buf s = {0};
    csv_record r = {0};
    int rcap = 0, tcap = 0, line = 1, start_line = 1;
    size_t i = 0;
    const char *why = NULL;
    int field_started = 0;   /* something (even an empty quoted field) was read */

    while (i < len) {
        char c = buf[i];
        if (!field_started && r.n_fields == 0 && s.n == 0 && (c == '\n' || (c == '\r' && i + 1 < len && buf[i + 1] == '\n'))) {
            /* blank line between records */
            i += c == '\r' ? 2 : 1;
            line++;
            start_line = line;
            continue;
        }
        if (c == '"' && s.n == 0 && !field_started) {
            /* quoted field */
            int qline = line;
            i++;
            for (;;) {
                if (i >= len) {
                    snprintf(err, errlen, "line %d: unterminated quoted field", qline);
                    goto fail;
                }
                if (buf[i] == '"') {
                    if (i + 1 < len && buf[i + 1] == '"') {
                        if (buf_push(&s, '"'))
                            goto oom;
                        i += 2;
                        continue;
                    }
                    i++;
                    break;
                }
                if (buf[i] == '\n')
                    line++;
                if (buf_push(&s, buf[i]))
                    goto oom;
                i++;
            }
            field_started = 1;
            if (i < len && buf[i] != ',' && buf[i] != '\n' && !(buf[i] == '\r' && i + 1 < len && buf[i + 1] == '\n')) {
                why = "text after a closing quote";
                goto bad;
            }
            continue;
        }
        if (c == ',') {
            if (record_push(&r, &rcap, &s))
                goto oom;
            field_started = 0;
            i++;
            continue;
        }
        if (c == '\n' || (c == '\r' && i + 1 < len && buf[i + 1] == '\n')) {
            if (record_push(&r, &rcap, &s))
                goto oom;
            r.line = start_line;
            if (table_push(t, &tcap, &r))
                goto oom;
            rcap = 0;
            field_started = 0;
            i += c == '\r' ? 2 : 1;
            line++;
            start_line = line;
            continue;
        }
        if (c == '"' && !field_started) {
            why = "quote inside an unquoted field";
            goto bad;
        }
        if (field_started) {
            why = "text after a closing quote";
            goto bad;
        }
        if (buf_push(&s, c))
            goto oom;
        i++;
    }
    if (field_started || s.n > 0 || r.n_fields > 0) {
        if (record_push(&r, &rcap, &s))
            goto oom;
        r.line = start_line;
        if (table_push(t, &tcap, &r))
            goto oom;
    }
    free(s.b);
    return 0;
bad:
    snprintf(err, errlen, "line %d: %s", line, why);
    goto fail;
oom:
    snprintf(err, errlen, "line %d: out of memory", line);
fail:
    free(s.b);
    record_free(&r);
    csv_free(t);
    return -1;
}

int csv_parse_file(const char *path, csv_table *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char *data = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 > cap) {
            size_t nc = cap ? cap * 2 : 131072;
            char *nd = realloc(data, nc);
            if (!nd) {
                free(data);
                fclose(f);
                snprintf(err, errlen, "%s: out of memory", path);
                return -1;
            }
            data = nd;
            cap = nc;
        }
        size_t got = fread(data + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int rerr = ferror(f);
    fclose(f);
    if (rerr) {
        free(data);
        snprintf(err, errlen, "%s: read error", path);
        return -1;
    }
    char e[256];
    int rc = csv_parse(data, n, t, e, sizeof e);
    free(data);
    if (rc)
        snprintf(err, errlen, "%s: %s", path, e);
    return rc;
}
