/* engine/procstat.h — memory and CPU time as Linux reports them: this process's memory
 * in /proc/self/status (the one reader for the measure code and the llama.cpp helper),
 * the machine's in /proc/meminfo, the machine's CPU time in /proc/stat and this
 * process's in getrusage.
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

/* The machine's CPU time so far, all cores together, in clock ticks (/proc/stat's "cpu"
 * line): busy (user, nice, system, irq, softirq; guests are inside user), idle (idle,
 * iowait), steal (taken by the hypervisor), and their sum. */
typedef struct {
    uint64_t busy, idle, steal, total;
} eng_cpu_ticks;

/* 0 with *t filled, or -1 when /proc/stat cannot be read. */
int eng_cpu_ticks_now(eng_cpu_ticks *t);

/* The clock ticks per second of those counts (sysconf(_SC_CLK_TCK), 100 when unknown). */
double eng_cpu_tick_hz(void);

/* CPU seconds (user + system) this process has used, its waited-for children's included;
 * -1 when unknown. */
double eng_proc_cpu_s(void);

#endif
