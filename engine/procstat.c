/* engine/procstat.c — /proc/self/status fields in bytes (procstat.h). */
#include "engine/procstat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
