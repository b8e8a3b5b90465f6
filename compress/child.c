/* compress/child.c — measuring programs run as children (child.h): the llama.cpp helper
 * and `autocompress measure`, one fresh process per serving, argv in, one JSON object out.
 */
#include "compress/child.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/clock.h"
#include "storage/fileio.h"

extern char **environ;

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

/* How often a child's run asks the measurement's cancel hook (ms_opts). */
#define CH_CANCEL_POLL_MS 100

/* How long a child whose output ended may take to exit before it is killed (s). */
#define CH_EXIT_GRACE_S 5
/* The most a child may write on stdout: its answer is one JSON object of kilobytes, and a
 * runaway child must not fill the server's memory. */
#define CH_MAX_OUTPUT ((size_t)64 << 20)

/* Start argv[0] with its stdout on out_fd and its stderr on err_fd, as *pid. The child
 * dies with the thread that started it (PR_SET_PDEATHSIG; that thread waits for the
 * child, so it outlives it otherwise): a worker killed mid-measurement (its server
 * killed, or its container) leaves no process serving on the cores the job's next
 * attempt measures on. The dead child is then a child of PID 1, which must reap it
 * (tini in the images, docker/Dockerfile). 0, or an errno value (the exec's own, when the
 * program could not be run). */
static int spawn_child(char *const argv[], int out_fd, int err_fd, pid_t *pid)
{
    int ep[2];
    if (pipe2(ep, O_CLOEXEC))
        return errno;
    pid_t parent = getpid();
    *pid = fork();
    if (*pid == 0) {
        /* Child: async-signal-safe calls only until exec. */
        int e = 0;
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent)
            _exit(127);
        /* the server and the worker agent block SIGTERM and SIGINT (they sigwait for them)
         * and ignore SIGPIPE: the child gets the defaults, so both signals stop it */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        if (dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0)
            e = errno;
        else
            execve(argv[0], argv, environ);
        if (!e)
            e = errno;
        ssize_t w = write(ep[1], &e, sizeof e);
        (void)w;
        _exit(127);
    }
    int e = *pid < 0 ? errno : 0;
    close(ep[1]);
    if (*pid > 0) {
        /* nothing arrives when the exec succeeded (the pipe closed with it) */
        ssize_t k;
        while ((k = read(ep[0], &e, sizeof e)) < 0 && errno == EINTR)
            ;
        if (k != (ssize_t)sizeof e)
            e = 0;
        else
            while (waitpid(*pid, NULL, 0) < 0 && errno == EINTR)
                ;
    }
    close(ep[0]);
    return e;
}

/* Append n bytes of buf to the text eb[*en] of capacity cap, keeping its tail (the
 * reason a child gives is its last line). */
static void keep_tail(char *eb, size_t cap, size_t *en, const char *buf, size_t n)
{
    if (n >= cap - 1) {
        memcpy(eb, buf + n - (cap - 1), cap - 1);
        *en = cap - 1;
    } else {
        if (*en + n >= cap) {
            size_t drop = *en + n - (cap - 1);
            memmove(eb, eb + drop, *en - drop);
            *en -= drop;
        }
        memcpy(eb + *en, buf, n);
        *en += n;
    }
    eb[*en] = 0;
}

int ch_run_json(const ch_kind *k, char *const argv[], const ms_opts *o, json_t **out, char *err, size_t errlen)
{
    *out = NULL;
    int po[2], pe[2];
    if (pipe2(po, O_CLOEXEC))
        FAIL("%s: pipe: %s", k->what, strerror(errno));
    if (pipe2(pe, O_CLOEXEC)) {
        close(po[0]);
        close(po[1]);
        FAIL("%s: pipe: %s", k->what, strerror(errno));
    }
    pid_t pid = -1;
    int rc = spawn_child(argv, po[1], pe[1], &pid);
    close(po[1]);
    close(pe[1]);
    if (rc) {
        close(po[0]);
        close(pe[0]);
        FAIL("%s %s: cannot start: %s", k->what, argv[0], strerror(rc));
    }
    char *ob = NULL, eb[2048] = "";
    size_t on = 0, ocap = 0, en = 0;
    int open_o = 1, open_e = 1, timed_out = 0, oom = 0, cancelled = 0, broken = 0, flood = 0;
    int poll_ms = o && o->cancelled ? CH_CANCEL_POLL_MS : 60000;
    double deadline = eng_wall_s() + k->timeout_s;
    while (open_o || open_e) {
        struct pollfd p[2] = {{.fd = open_o ? po[0] : -1, .events = POLLIN}, {.fd = open_e ? pe[0] : -1, .events = POLLIN}};
        double left = deadline - eng_wall_s();
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        if (ms_cancelled(o)) {
            cancelled = 1;
            break;
        }
        int n = poll(p, 2, left * 1000 > poll_ms ? poll_ms : (int)(left * 1000) + 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            broken = errno;
            break;
        }
        char buf[8192];
        if (open_o && p[0].revents) {
            ssize_t got = read(po[0], buf, sizeof buf);
            if (got <= 0) {
                open_o = 0;
            } else {
                deadline = eng_wall_s() + k->timeout_s;   /* a sign of life */
                if (on + (size_t)got > CH_MAX_OUTPUT) {
                    flood = 1;
                    break;
                }
                if (on + (size_t)got + 1 > ocap) {
                    size_t nc = (on + (size_t)got + 1) * 2;
                    char *nb = realloc(ob, nc);
                    if (!nb) {
                        oom = 1;
                        break;
                    }
                    ob = nb;
                    ocap = nc;
                }
                memcpy(ob + on, buf, (size_t)got);
                on += (size_t)got;
                ob[on] = 0;
            }
        }
        if (open_e && p[1].revents) {
            ssize_t got = read(pe[0], buf, sizeof buf);
            if (got <= 0) {
                open_e = 0;
            } else {
                deadline = eng_wall_s() + k->timeout_s;
                keep_tail(eb, sizeof eb, &en, buf, (size_t)got);
            }
        }
    }
    if (timed_out || oom || cancelled || broken || flood)
        kill(pid, SIGKILL);
    close(po[0]);
    close(pe[0]);
    /* its output ended: it exits now, or is made to (a child that closed its pipes and
     * lingers would hold the job without a deadline) */
    int status = 0, lingered = 0;
    double gone_by = eng_wall_s() + CH_EXIT_GRACE_S;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid || (w < 0 && errno != EINTR))
            break;
        if (w == 0 && eng_wall_s() > gone_by && !lingered) {
            lingered = 1;
            kill(pid, SIGKILL);
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* the last non-empty stderr line */
    while (en > 0 && (eb[en - 1] == '\n' || eb[en - 1] == '\r'))
        eb[--en] = 0;
    char *last = strrchr(eb, '\n');
    last = last ? last + 1 : eb;
    if (cancelled) {
        free(ob);
        FAIL("cancelled");
    }
    if (broken) {
        free(ob);
        FAIL("%s %s: reading its output failed: %s", k->what, argv[1], strerror(broken));
    }
    if (timed_out || oom || flood) {
        free(ob);
        if (timed_out)
            FAIL("%s %s: said nothing for %.0f s and was killed", k->what, argv[1], k->timeout_s);
        if (flood)
            FAIL("%s %s: wrote more than %zu MiB on its output and was killed", k->what, argv[1],
                 CH_MAX_OUTPUT >> 20);
        FAIL("%s %s: out of memory", k->what, argv[1]);
    }
    if (lingered) {
        free(ob);
        FAIL("%s %s: closed its output but did not exit within %d s, and was killed", k->what, argv[1],
             CH_EXIT_GRACE_S);
    }
    if (WIFSIGNALED(status)) {
        free(ob);
        FAIL("%s %s died with signal %d%s%s", k->what, argv[1], WTERMSIG(status), *last ? ": " : "", last);
    }
    json_error_t je;
    json_t *j = ob ? json_loads(ob, 0, &je) : NULL;
    free(ob);
    json_t *e = j ? json_object_get(j, "error") : NULL;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !json_is_object(j) || e) {
        if (json_is_string(e))
            snprintf(err, errlen, "%s: %s", k->engine, json_string_value(e));
        else
            snprintf(err, errlen, "%s %s failed (exit %d)%s%s", k->what, argv[1],
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1, *last ? ": " : "", last);
        json_decref(j);
        return -1;
    }
    *out = j;
    return 0;
}

static int executable(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0;
}

int ch_find_program(const char *env, const char *name, char *out, size_t cap)
{
    const char *given = env ? getenv(env) : NULL;
    if (given && *given) {
        snprintf(out, cap, "%s", given);
        return executable(out) ? 0 : -1;
    }
    char exe[PATH_MAX], dir[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -1;
    exe[n] = 0;
    fio_dir_of(exe, dir, sizeof dir);
    if (fio_path_join(out, cap, dir, name) == 0 && executable(out))
        return 0;
    char up[PATH_MAX];
    fio_dir_of(dir, up, sizeof up);
    if (fio_path_join(out, cap, up, name) == 0 && executable(out))
        return 0;
    return -1;
}
