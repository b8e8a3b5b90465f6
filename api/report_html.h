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

#endif
