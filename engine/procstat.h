/* engine/procstat.h — memory as Linux reports it: this process's in /proc/self/status
 * (the one reader for the measure code and the llama.cpp helper) and the machine's in
 * /proc/meminfo.
 */
#ifndef AC_ENGINE_PROCSTAT_H
#define AC_ENGINE_PROCSTAT_H

#include <stdint.h>

/* The "KEY:   N kB" line of /proc/self/status (e.g. "VmRSS", "VmHWM") in bytes; -1 when
 * unreadable or absent. */
int64_t eng_proc_status_bytes(const char *key);

/* The memory the kernel can give new allocations without swapping (/proc/meminfo's
 * MemAvailable) in bytes; -1 when unreadable or absent. */
int64_t eng_mem_available_bytes(void);

#endif
