/* engine/clock.h — the two clocks every timing in the project reads: monotonic wall
 * seconds and this process's CPU seconds (all threads). Seconds as doubles from an
 * arbitrary origin: only differences mean anything. No sleeping, no calendar time.
 */
#ifndef AC_ENGINE_CLOCK_H
#define AC_ENGINE_CLOCK_H

/* CLOCK_MONOTONIC in seconds. Cannot fail on Linux. */
double eng_wall_s(void);

/* CLOCK_PROCESS_CPUTIME_ID in seconds: CPU time of every thread of this process, so a
 * parallel region counts once per busy thread. Cannot fail on Linux. */
double eng_cpu_s(void);

#endif
