/* engine/clock.c — wall and process-CPU clocks (see clock.h). */
#include "engine/clock.h"

#include <time.h>

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double eng_wall_s(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

double eng_cpu_s(void)
{
    return clock_s(CLOCK_PROCESS_CPUTIME_ID);
}
