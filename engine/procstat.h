/* engine/procstat.h — this process's memory as Linux reports it in /proc/self/status:
 * the one reader for the measure code and the llama.cpp helper.
 */
#ifndef AC_ENGINE_PROCSTAT_H
#define AC_ENGINE_PROCSTAT_H

#include <stdint.h>

/* The "KEY:   N kB" line of /proc/self/status (e.g. "VmRSS", "VmHWM") in bytes; -1 when
 * unreadable or absent. */
int64_t eng_proc_status_bytes(const char *key);

#endif
