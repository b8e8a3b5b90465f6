/* tests/unit/fsync_log.h — a test's own fsync: it records the path of each descriptor
 * synced (as /proc/self/fd names it), then syncs it. A test executable that includes this
 * (once) overrides libc's fsync for the product's code it links from the static library,
 * so durability claims ("written, fsynced, renamed, folder fsynced") can be checked.
 */
#ifndef AC_TESTS_FSYNC_LOG_H
#define AC_TESTS_FSYNC_LOG_H

#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static char g_synced[256][512];
static int g_nsynced;

int fsync(int fd)
{
    char link[64], p[512];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, p, sizeof p - 1);
    if (k > 0 && g_nsynced < 256) {
        p[k] = 0;
        snprintf(g_synced[g_nsynced++], sizeof g_synced[0], "%s", p);
    }
    return (int)syscall(SYS_fsync, fd);
}

#endif
