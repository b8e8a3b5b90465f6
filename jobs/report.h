/* jobs/report.h — the job's final report (DESIGN.md §10): assembled once every stage of a
 * job has succeeded from what the stages merged into the report and the files they
 * wrote, then published as the artifact report.json. Limits: it reads only the
 * job directory and the store; a missing stage output leaves that part of the report
 * absent (e.g. no evaluate stage: empty accuracy), never invented.
 */
#ifndef AC_JOBS_REPORT_H
#define AC_JOBS_REPORT_H

#include <stddef.h>

#include "jobs/stage.h"

/* Complete the report of the job behind ctx: job_id, method, target, the chosen arch,
 * one entry per spec limit {name, limit, predicted, measured, holds, holds_predicted}
 * and the parent's/result's predictions, merged into the stored report; then write the
 * whole report to <job>/report/report.json and publish it as "report.json".
 * Returns 0, or -1 with a reason in err (the job should fail: its report is its
 * product). */
int job_report_finalize(job_ctx *ctx, char *err, size_t errlen);

/* The limit rows of a report from the spec's constraints and the result's predicted
 * and measured objects (borrowed); a row also gets "aimed", the value the search aimed
 * at, when the search's aim object (borrowed, may be NULL; jobs/pstate.h ps_aim_json)
 * names that limit. Returns a NEW array (empty when no limit applies). */
json_t *job_report_limits(json_t *constraints, json_t *result_predicted, json_t *result_measured,
                          long long result_params, json_t *aim);

#endif
