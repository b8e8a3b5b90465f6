/* jobs/stages_builtin.c — the one place where this build's real stages are registered.
 * Workers call stages_register_builtin() before running a job; a stage name without a
 * registration makes a job fail with "stage <name> is not available in this build".
 */
#include "jobs/stage.h"
#include "jobs/stages.h"


void stages_register_builtin(void)
{
    stages_search_register();   /* load, search */
    stage_calibrate_register();
    stage_rank_register();
    stage_prune_register();
    stage_distill_register();
    stage_evaluate_register();
    stage_measure_register();
    stage_export_register();
}
