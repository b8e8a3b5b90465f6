/* api/report_html.h — the job report as one self-contained HTML page (report_html.c).
 * Rendering is a pure function of the report JSON, so tests check the page without a
 * server or a store; the handler for GET /v1/jobs/{id}/report.html wraps it.
 */
#ifndef AC_API_REPORT_HTML_H
#define AC_API_REPORT_HTML_H

#include <stddef.h>

#include <jansson.h>

/* The page for report r (borrowed): the job report of DESIGN.md §10 plus the members
 * job_id, status, complete, method and target that the handler adds from the job row.
 * Absent parts render as "not in the report yet". Returns a NEW NUL-terminated string
 * (free() it) with its length in *len, or NULL when out of memory. */
char *api_report_html(json_t *r, size_t *len);

/* A byte count for people: exact bytes with thousands separators, and from 1024 B on
 * the largest binary unit the rounded value reaches beside them: "512 B",
 * "392,150,432 B (374.0 MiB)", "1,610,612,736 B (1.50 GiB)" (KiB and MiB with one
 * decimal, GiB and up with two). Writes into buf (len bytes); returns 0, or -1 for a
 * negative, NaN or too large value or a buffer too small (buf then holds no promise). */
int api_fmt_bytes(double bytes, char *buf, size_t len);

#endif
