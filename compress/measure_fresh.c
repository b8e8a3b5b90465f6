/* compress/measure_fresh.c — the built-in engine measured where it serves: in a fresh
 * process of its own (`autocompress measure`), as llama.cpp is measured in fresh helper
 * processes. The process's own memory counts: its program, libraries, thread stacks and
 * BLAS buffers, the model's load, not only what the model added to a long-lived worker.
 */
#include "compress/measure.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compress/calibrate.h"
#include "compress/child.h"
#include "compress/prune.h"
#include "engine/clock.h"
#include "storage/archjson.h"

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

/* ---------- in the measuring process ---------- */

json_t *ms_measure_process(const char *model_path, const char *arch_path, const cm_target *t, const ms_opts *o,
                           char *err, size_t errlen)
{
    ms_result r;
    memset(&r, 0, sizeof r);
    eng_backend *be = cal_backend_new(t->device, t->precision, o ? o->threads : 0, err, errlen);
    if (!be)
        return NULL;
    int is_cpu = be->host_memory;
    int64_t rss0 = ms_rss_bytes();
    double t0 = eng_wall_s();
    eng_model m;
    int rc = -1;
    if (model_path) {
        rc = prune_load_model(model_path, NULL, be, &m, NULL, err, errlen);
    } else {
        arch a;
        if (cm_load_arch(arch_path, &a, err, errlen) == 0) {
            rc = ms_random_model(be, &a, o, &m, err, errlen);
            arch_free(&a);
        }
    }
    if (rc) {
        eng_backend_free(be);
        return NULL;
    }
    double load_ms = (eng_wall_s() - t0) * 1000.0;
    rc = ms_measure_model(&m, rss0, t, o, &r, err, errlen);
    eng_model_free(&m);
    eng_backend_free(be);
    if (rc)
        return NULL;
    r.process_peak_bytes = is_cpu ? ms_rss_peak_bytes() : -1;
    if (is_cpu && r.process_peak_bytes > r.peak_bytes)
        r.peak_bytes = r.process_peak_bytes;   /* the whole process: what a limit on the host is about */
    json_t *out = ms_result_to_json(&r, t);
    if (out && (json_object_set_new(out, "params", json_integer(r.params)) ||
                json_object_set_new(out, "weights_bytes", json_integer(r.weights_bytes)) ||
                json_object_set_new(out, "request_cache_bytes", json_integer(r.request_cache_bytes)) ||
                json_object_set_new(out, "rss_before_model_bytes", json_integer(rss0)) ||
                json_object_set_new(out, "load_ms", json_real(load_ms)) ||
                json_object_set_new(out, "weights", json_string(model_path ? "loaded" : "random")))) {
        json_decref(out);
        out = NULL;
    }
    if (!out)
        snprintf(err, errlen, "out of memory");
    return out;
}

/* ---------- from the process that asks ---------- */

/* The longest one measuring process may run (a served request of a large model on a
 * loaded host is minutes). */
static const ch_kind MS_CHILD = {.what = "measuring process", .engine = "autocompress measure", .timeout_s = 1800.0};

static int num(const json_t *j, const char *k, double *v)
{
    json_t *x = json_object_get(j, k);
    if (json_is_null(x) && !strcmp(k, "process_peak_bytes")) {   /* not a CPU's */
        *v = -1;
        return 0;
    }
    if (!json_is_number(x))
        return -1;
    *v = json_number_value(x);
    return 0;
}

/* ms_measure_process's object into *r. 0, or -1 naming the field missing. */
static int result_from_json(const json_t *j, const cm_target *t, ms_result *r, char *err, size_t errlen)
{
    static const char *keys[] = {"latency_ms", "latency_mad_ms", "prefill_ms", "decode_ms_per_token",
                                 "throughput_tokens_per_s", "peak_memory_bytes", "backend_peak_bytes",
                                 "rss_delta_bytes", "process_peak_bytes", "reps", "params", "weights_bytes",
                                 "request_cache_bytes"};
    double v[13];
    for (int i = 0; i < 13; i++)
        if (num(j, keys[i], &v[i]))
            FAIL("measuring process: its answer has no number \"%s\"", keys[i]);
    memset(r, 0, sizeof *r);
    r->latency_ms = v[0];
    r->latency_mad_ms = v[1];
    r->prefill_ms = v[2];
    r->decode_ms = v[3] * (t->output_tokens > 0 ? t->output_tokens : 1);
    r->throughput_tps = v[4];
    r->peak_bytes = (int64_t)v[5];
    r->backend_peak_bytes = (int64_t)v[6];
    r->rss_delta_bytes = (int64_t)v[7];
    r->process_peak_bytes = (int64_t)v[8];
    r->reps = (int)v[9];
    r->params = (int64_t)v[10];
    r->weights_bytes = (int64_t)v[11];
    r->request_cache_bytes = (int64_t)v[12];
    return 0;
}

/* This process's PID namespace (the inode of /proc/self/ns/pid; 0 when unknown): a pid is
 * this process's to judge only within it. */
static unsigned long pid_ns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long)st.st_ino : 0;
}

/* Remove dir's ac-measure-PID-NS-*.json files of this PID namespace whose process is gone
 * (killed while its child measured: the file outlived it). A TMPDIR shared with other
 * containers holds their files too, whose pids mean nothing here: they are left alone. */
static void sweep_arch_tmp(const char *dir)
{
    unsigned long ns = pid_ns();
    DIR *d = opendir(dir);
    if (!d || !ns) {
        if (d)
            closedir(d);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        long pid;
        unsigned long their_ns;
        int at = 0;
        if (sscanf(e->d_name, "ac-measure-%ld-%lu-%n", &pid, &their_ns, &at) != 2 || at == 0 || pid <= 0 ||
            their_ns != ns || !strstr(e->d_name + at, ".json") || (kill((pid_t)pid, 0) != 0 ? errno != ESRCH : 1))
            continue;
        (void)unlinkat(dirfd(d), e->d_name, 0);   /* another sweep may have taken it */
    }
    closedir(d);
}

/* a as an arch JSON file under TMPDIR (or /tmp), named for this process: its path in out.
 * 0, or -1 with err. */
static int write_arch_tmp(const arch *a, char *out, size_t cap, char *err, size_t errlen)
{
    const char *dir = getenv("TMPDIR");
    dir = dir && *dir ? dir : "/tmp";
    sweep_arch_tmp(dir);
    if (snprintf(out, cap, "%s/ac-measure-%ld-%lu-XXXXXX.json", dir, (long)getpid(), pid_ns()) >= (int)cap)
        FAIL("measure: the temporary folder's path is too long");
    int fd = mkstemps(out, 5);
    if (fd < 0)
        FAIL("measure: %s: %s", out, strerror(errno));
    json_t *j = arch_to_json(a);
    int bad = !j || json_dumpfd(j, fd, JSON_COMPACT) != 0;
    json_decref(j);
    if (close(fd) != 0)
        bad = 1;
    if (bad) {
        snprintf(err, errlen, "measure: cannot write the arch to %s", out);
        (void)unlink(out);
        return -1;
    }
    return 0;
}

int ms_measure_fresh(const arch *a, const char *model_path, const cm_target *t, const ms_opts *o, ms_result *r,
                     char *err, size_t errlen)
{
    char bin[4096], archf[4200] = "";
    memset(r, 0, sizeof *r);
    if (ch_find_program("AC_AUTOCOMPRESS_BIN", "autocompress", bin, sizeof bin))
        FAIL("measure: no autocompress program to measure in a fresh process (AC_AUTOCOMPRESS_BIN, or "
             "beside this program or one folder above it)");
    if (!model_path && write_arch_tmp(a, archf, sizeof archf, err, errlen))
        return -1;
    ms_args w;
    ms_args_of(t, o, &w);
    char T[16];
    snprintf(T, sizeof T, "%d", o && o->threads > 0 ? o->threads : 0);
    char *argv[] = {bin, "measure", model_path ? "--model" : "--arch", model_path ? (char *)model_path : archf,
                    "--device", (char *)t->device, "--precision", (char *)(*t->precision ? t->precision : "fp32"),
                    "--batch", w.batch, "--prompt", w.prompt, "--output", w.output, "--warmup", w.warmup, "--reps",
                    w.reps, "--seed", w.seed, "--threads", T, "--json", NULL};
    json_t *j = NULL;
    int rc = ch_run_json(&MS_CHILD, argv, o, &j, err, errlen);
    if (*archf)
        (void)unlink(archf);
    if (rc == 0)
        rc = result_from_json(j, t, r, err, errlen);
    json_decref(j);
    return rc;
}
