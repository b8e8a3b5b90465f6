/* api/api_internal.h — helpers shared by the resource files of api/ (not for other
 * layers): query parsing, body parsing, rendering and the handlers the route table uses.
 */
#ifndef AC_API_API_INTERNAL_H
#define AC_API_API_INTERNAL_H

#include "api/api.h"
#include "api/spec.h"

typedef void (*api_handler)(api_ctx *ctx, const api_req *req, const char *const *params, api_resp *resp);

/* The list cursor ?after= for ids with this prefix ("job_"): *out = NULL when absent,
 * else the borrowed value. 0, or -1 with a 400 problem when it is not prefix + 24 lowercase
 * hex digits (an id of another shape can name nothing in the list). */
int api_query_cursor(const api_req *req, const char *prefix, const char **out, api_resp *resp);
/* The 422 problem for a well-formed cursor that names no item of the list. */
void api_cursor_not_found(api_resp *resp, const char *what);
/* An integer query parameter in [lo, hi] (dflt when absent). 0, or -1 with a 400 problem. */
int api_query_int(const api_req *req, const char *key, long long lo, long long hi, long long dflt,
                  long long *out, api_resp *resp);
/* Parse the JSON body, any JSON value (duplicate keys rejected). NEW reference, or NULL
 * with a problem: 400 invalid_json for a body that is not JSON, 422 unprocessable_json
 * for JSON holding U+0000 or an integer beyond 64 bits. */
json_t *api_parse_body(const api_req *req, api_resp *resp);
/* Set a JSON body (stolen) with status. */
void api_json(api_resp *resp, int status, json_t *body);
/* A 200 list page {object: "list", data, has_more, first_id, last_id}: data (an array)
 * is stolen; the ids are copied, and NULL ones (an empty page) become null. */
void api_list(api_resp *resp, json_t *data, int has_more, const char *first_id, const char *last_id);
/* Set a text body with status: text (len bytes, malloc'd) is stolen; content_type is a
 * static string. */
void api_text(api_resp *resp, int status, char *text, size_t len, const char *content_type);
/* The problem for a request the spec validator refused: the first fault in detail, every
 * fault in errors (stolen); code path_forbidden (403), invalid_spec (400) or
 * unprocessable_spec (422). what names the request ("spec", "estimate request"). */
void api_spec_problem(api_resp *resp, const char *what, int status, json_t *errors);
/* The spec environment for validation. */
spec_env api_spec_env(api_ctx *ctx);

/* Resource handlers (api_jobs.c, api_misc.c, report_html.c). */
void h_report_html(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_jobs_list(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_jobs_create(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_jobs_get(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_jobs_delete(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_jobs_cancel(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_cal_cancel(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_events_list(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_report_get(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_artifacts_list(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_artifact_get(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_models_list(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_models_create(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_models_get(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_cal_list(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_cal_create(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_cal_get(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_estimates(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_devices(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_engines(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_healthz(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_readyz(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_metrics(api_ctx *, const api_req *, const char *const *, api_resp *);
void h_openapi(api_ctx *, const api_req *, const char *const *, api_resp *);

#endif
