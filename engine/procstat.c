/* engine/procstat.c — /proc/self/status and /proc/meminfo fields in bytes, /proc/stat's
 * CPU ticks, this process's CPU time (procstat.h). */
#include "engine/procstat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The "KEY:   N kB" line of the file at path, in bytes; -1 when unreadable or absent. */
static int64_t kb_line(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[256];
    int64_t v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            v = strtoll(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v < 0 ? -1 : v * 1024;
}

int64_t eng_proc_status_bytes(const char *key)
{
    return kb_line("/proc/self/status", key);
}

int64_t eng_mem_available_bytes(void)
{
    return kb_line("/proc/meminfo", "MemAvailable");
}

int eng_cpu_ticks_now(eng_cpu_ticks *t)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return -1;
    char line[512];
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    unsigned long long v[8] = {0};   /* user nice system idle iowait irq softirq steal */
    if (!ok || strncmp(line, "cpu ", 4) ||
        sscanf(line + 4, "%llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
               &v[7]) < 7)
        return -1;
    t->busy = v[0] + v[1] + v[2] + v[5] + v[6];
    t->idle = v[3] + v[4];
    t->steal = v[7];
    t->total = t->busy + t->idle + t->steal;
    return 0;
}

double eng_cpu_tick_hz(void)
{
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? (double)hz : 100.0;
}

double eng_proc_cpu_s(void)
{
    struct rusage self, kids;
    if (getrusage(RUSAGE_SELF, &self) || getrusage(RUSAGE_CHILDREN, &kids))
        return -1;
    return (double)self.ru_utime.tv_sec + self.ru_utime.tv_usec * 1e-6 + self.ru_stime.tv_sec +
           self.ru_stime.tv_usec * 1e-6 + kids.ru_utime.tv_sec + kids.ru_utime.tv_usec * 1e-6 +
           kids.ru_stime.tv_sec + kids.ru_stime.tv_usec * 1e-6;
}
