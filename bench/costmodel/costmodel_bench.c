/* bench/costmodel/costmodel_bench.c — the cost model's benchmark: calibrates a
 * SmolLM2-135M-shaped parent on a device at each batch size, prints the held-out
 * validation table (predicted vs measured latency and peak memory, MAPE, naive estimate
 * beside), the calibration cost, the estimate speed, and the machine's two ceilings
 * (GEMM GFLOP/s and memory-copy GB/s through the same backend) measured in the same run.
 * Markdown on stdout and, with --out, into a file. Runs unchanged with --device cuda:0.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compress/calibrate.h"
#include "compress/costmodel.h"
#include "engine/clock.h"
#include "engine/devices.h"
#include "storage/archjson.h"

static int smollm_parent(arch *a)
{
    if (arch_init(a, 30))
        return -1;
    snprintf(a->family, sizeof a->family, "llama");
    a->vocab_size = 49152;
    a->hidden_size = 576;
    a->head_dim = 64;
    a->max_position_embeddings = 8192;
    a->rope_theta = 100000;
    a->norm_eps = 1e-5;
    a->tie_word_embeddings = 1;
    for (int i = 0; i < 30; i++) {
        a->layers[i].source_layer = i;
        a->layers[i].n_heads = 9;
        a->layers[i].n_kv_heads = 3;
        a->layers[i].ffn_dim = 1536;
    }
    return 0;
}

/* GEMM GFLOP/s (n×n×n, best of reps) and copy GB/s (read + write, best of reps). */
static int ceilings(const char *device, int threads, double *gflops, double *gbps, char *err, size_t errlen)
{
    eng_backend *be = cal_backend_new(device, NULL, threads, err, errlen);
    if (!be)
        return -1;
    int n = strcmp(device, "cpu") ? 4096 : 1024;
    size_t mb = (size_t)256 << 20;
    float *a = be->alloc(be, sizeof(float) * (size_t)n * n), *b = be->alloc(be, sizeof(float) * (size_t)n * n),
          *c = be->alloc(be, sizeof(float) * (size_t)n * n);
    char *x = be->alloc(be, mb), *y = be->alloc(be, mb);
    int rc = -1;
    if (!a || !b || !c || !x || !y) {
        snprintf(err, errlen, "out of memory for the ceiling buffers");
        goto out;
    }
    be->zero(be, a, sizeof(float) * (size_t)n * n);
    be->zero(be, b, sizeof(float) * (size_t)n * n);
    be->zero(be, x, mb);
    be->zero(be, y, mb);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        be->sync(be);
        double t0 = eng_wall_s();
        be->gemm(be, 0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        be->sync(be);
        double t = eng_wall_s() - t0;
        best = t < best ? t : best;
    }
    *gflops = 2.0 * n * (double)n * n / best / 1e9;
    best = 1e30;
    for (int r = 0; r < 5; r++) {
        be->sync(be);
        double t0 = eng_wall_s();
        be->copy(be, y, x, mb);
        be->sync(be);
        double t = eng_wall_s() - t0;
        best = t < best ? t : best;
    }
    *gbps = 2.0 * (double)mb / best / 1e9;
    rc = 0;
out:
    be->free(be, a, a ? sizeof(float) * (size_t)n * n : 0);
    be->free(be, b, b ? sizeof(float) * (size_t)n * n : 0);
    be->free(be, c, c ? sizeof(float) * (size_t)n * n : 0);
    be->free(be, x, x ? mb : 0);
    be->free(be, y, y ? mb : 0);
    eng_backend_free(be);
    return rc;
}

static void out2(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out2(FILE *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    if (f) {
        va_start(ap, fmt);
        vfprintf(f, fmt, ap);
        va_end(ap);
    }
    fflush(stdout);
}

int main(int argc, char **argv)
{
    eng_blas_pick_kernel(argv);
    const char *device = "cpu", *out_path = NULL, *batches = "1,8";
    int S = 256, N = 64, validate = 10, vreps = 3, reps = 3, models = 2, threads = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--device"))
            device = argv[i + 1];
        else if (!strcmp(argv[i], "--out"))
            out_path = argv[i + 1];
        else if (!strcmp(argv[i], "--batch"))
            batches = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt"))
            S = (int)strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--output"))
            N = (int)strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--validate"))
            validate = (int)strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--validate-reps"))
            vreps = (int)strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--reps"))
            reps = (int)strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--threads"))
            threads = (int)strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--models"))
            models = (int)strtol(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "usage: costmodel_bench [--device cpu] [--batch 1,8] [--prompt 256] [--output 64]\n"
                            "       [--validate 10] [--validate-reps 3] [--reps 3] [--models 2] [--threads T] [--out FILE.md]\n");
            return 2;
        }
    }
    if (S < 1 || N < 1 || validate < 1 || vreps < 1 || reps < 1 || models < 1) {
        fprintf(stderr, "costmodel_bench: bad numbers\n");
        return 2;
    }
    FILE *f = NULL;
    if (out_path && !(f = fopen(out_path, "w"))) {
        perror(out_path);
        return 1;
    }
    char err[1024], host[128] = "?";
    gethostname(host, sizeof host);
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    double gf = 0, gb = 0;
    if (ceilings(device, threads, &gf, &gb, err, sizeof err)) {
        fprintf(stderr, "costmodel_bench: %s\n", err);
        return 1;
    }
    eng_device_info info;
    memset(&info, 0, sizeof info);
    for (int i = 0; i < eng_device_count(); i++) {
        eng_device_info d;
        if (!eng_device_get(i, &d) && !strcmp(d.name, device))
            info = d;
    }
    out2(f, "# Cost model on %s (%s)\n\n", device, info.description[0] ? info.description : "?");
    out2(f, "Host %s, %s, %d cores; load average at start: ", host, date, info.cores);
    FILE *la = fopen("/proc/loadavg", "r");
    char lbuf[64] = "?";
    if (la) {
        if (!fgets(lbuf, sizeof lbuf, la))
            snprintf(lbuf, sizeof lbuf, "?");
        fclose(la);
        lbuf[strcspn(lbuf, "\n")] = 0;
    }
    out2(f, "%s.\n\n", lbuf);
    out2(f, "Backend threads: %d (0 = all cores, the default).\n\n", threads);
    out2(f, "Machine ceilings (same run, same backend): GEMM %.1f GFLOP/s (fp32, best of 5), memory copy %.1f GB/s "
            "(read+write, 256 MiB, best of 5).\n\n",
         gf, gb);
    out2(f, "Parent: SmolLM2-135M shape (hidden 576, 30 layers, 9 heads / 3 KV heads, head_dim 64, FFN 1536, vocab "
            "49152, tied), random weights, fp32. Workload: prompt %d + output %d tokens. Held-out archs: %d random "
            "heterogeneous (per-layer heads in KV groups, FFN widths in multiples of 8, removed attention/MLP/layers), "
            "%d timed requests each, interleaved with the calibration requests.\n\n",
         S, N, validate, vreps);
    arch parent;
    if (smollm_parent(&parent)) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    char blist[64];
    snprintf(blist, sizeof blist, "%s", batches);
    int status = 0;
    for (char *p = blist, *q; p && *p; p = q) {
        q = strchr(p, ',');
        if (q)
            *q++ = 0;
        cm_target t;
        memset(&t, 0, sizeof t);
        snprintf(t.device, sizeof t.device, "%s", device);
        snprintf(t.precision, sizeof t.precision, "fp32");
        t.batch_size = (int)strtol(p, NULL, 10);
        t.prompt_tokens = S;
        t.output_tokens = N;
        cal_opts o;
        cal_opts_default(&o);
        o.reps = reps;
        o.n_models = models;
        o.validate = validate;
        o.validate_reps = vreps;
        o.verbose = 1;
        o.threads = threads;
        json_t *cal = cal_run(&parent, &t, &o, err, sizeof err);
        if (!cal) {
            fprintf(stderr, "costmodel_bench: batch %d: %s\n", t.batch_size, err);
            status = 1;
            continue;
        }
        json_t *v = json_object_get(cal, "validation"), *cost = json_object_get(cal, "cost");
        out2(f, "## Batch %d\n\n", t.batch_size);
        out2(f, "Calibration: %lld entries, %lld requests on %d calibration models (%d layers each) + %d probe "
                "models, wall %.1f s (tables %.1f s, interleaved held-out and fit archs %.1f s). %d fit archs "
                "corrected the phase scales by %.3f (prefill) and %.3f (decode).\n\n",
             (long long)json_integer_value(json_object_get(cal, "entries")),
             (long long)json_integer_value(json_object_get(cost, "requests")),
             (int)json_integer_value(json_object_get(cost, "calibration_models")),
             (int)json_integer_value(json_object_get(cost, "layers_per_model")),
             (int)json_integer_value(json_object_get(cost, "probe_models")),
             json_number_value(json_object_get(cal, "wall_s")), json_number_value(json_object_get(cost, "tables_wall_s")),
             json_number_value(json_object_get(cost, "validation_wall_s")),
             (int)json_integer_value(json_object_get(cost, "fit_archs")),
             json_number_value(json_object_get(cost, "fit_prefill_factor")),
             json_number_value(json_object_get(cost, "fit_decode_factor")));
        out2(f, "| # | params (M) | pred ms | meas ms (MAD) | lat err %% | prefill pred / meas ms | decode pred / meas ms "
                "| pred tok/s | meas tok/s | pred MiB | meas MiB (backend / RSS) | mem err %% | naive MiB | naive err %% "
                "| arch |\n");
        out2(f, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        size_t i;
        json_t *r;
        json_array_foreach(json_object_get(v, "rows"), i, r) {
            out2(f, "| %zu | %.1f | %.1f | %.1f (%.1f) | %.2f | %.1f / %.1f | %.1f / %.1f | %.1f | %.1f | %.1f | %.1f (%.1f / "
                    "%.1f) | %.2f | %.1f | %.1f | `%s` |\n",
                 i, json_integer_value(json_object_get(r, "params")) / 1e6,
                 json_number_value(json_object_get(r, "predicted_latency_ms")),
                 json_number_value(json_object_get(r, "measured_latency_ms")),
                 json_number_value(json_object_get(r, "measured_latency_mad_ms")),
                 json_number_value(json_object_get(r, "latency_error_pct")),
                 json_number_value(json_object_get(r, "predicted_prefill_ms")),
                 json_number_value(json_object_get(r, "measured_prefill_ms")),
                 json_number_value(json_object_get(r, "predicted_decode_ms")),
                 json_number_value(json_object_get(r, "measured_decode_ms")),
                 json_number_value(json_object_get(r, "predicted_throughput_tokens_per_s")),
                 json_number_value(json_object_get(r, "measured_throughput_tokens_per_s")),
                 json_integer_value(json_object_get(r, "predicted_memory_bytes")) / 1048576.0,
                 json_integer_value(json_object_get(r, "measured_peak_memory_bytes")) / 1048576.0,
                 json_integer_value(json_object_get(r, "measured_backend_peak_bytes")) / 1048576.0,
                 json_integer_value(json_object_get(r, "measured_rss_delta_bytes")) / 1048576.0,
                 json_number_value(json_object_get(r, "memory_error_pct")),
                 json_integer_value(json_object_get(r, "naive_weights_plus_kv_bytes")) / 1048576.0,
                 json_number_value(json_object_get(r, "naive_memory_error_pct")),
                 json_string_value(json_object_get(r, "summary")));
        }
        double lm = json_number_value(json_object_get(v, "latency_mape_pct")),
               lx = json_number_value(json_object_get(v, "latency_max_pct")),
               mm = json_number_value(json_object_get(v, "memory_mape_pct")),
               mx = json_number_value(json_object_get(v, "memory_max_pct"));
        out2(f, "\n**Batch %d: latency MAPE %.2f%% (max %.2f%%) [target ≤5%% / ≤10%%: %s]; memory MAPE %.2f%% (max "
                "%.2f%%) [target ≤3%% / ≤5%%: %s]; naive weights+KV MAPE %.2f%% (max %.2f%%).**\n\n",
             t.batch_size, lm, lx, lm <= 5 && lx <= 10 ? "met" : "MISSED", mm, mx, mm <= 3 && mx <= 5 ? "met" : "MISSED",
             json_number_value(json_object_get(v, "naive_memory_mape_pct")),
             json_number_value(json_object_get(v, "naive_memory_max_pct")));
        json_t *mem = json_object_get(json_object_get(cal, "tables"), "memory");
        out2(f, "Memory model: %.1f bytes/param + %lld, KV %.1f bytes/element + %lld, workspace rule `%s`, runtime "
                "buffers %.1f MiB.\n\n",
             json_number_value(json_object_get(mem, "weight_bytes_per_param")),
             (long long)json_integer_value(json_object_get(mem, "weight_overhead_bytes")),
             json_number_value(json_object_get(mem, "kv_bytes_per_element")),
             (long long)json_integer_value(json_object_get(mem, "kv_overhead_bytes")),
             json_string_value(json_object_get(mem, "workspace_combine")),
             json_integer_value(json_object_get(mem, "runtime_bytes")) / 1048576.0);
        /* estimate speed: the table lookups, and the whole estimate path from a cached file */
        cm_tables tb;
        if (!cm_calibration_tables(cal, &tb, err, sizeof err)) {
            cm_prediction pr;
            int n = 2000;
            double t0 = eng_wall_s();
            for (int k = 0; k < n; k++)
                if (cm_predict(&tb, &parent, &pr, err, sizeof err))
                    break;
            double per = (eng_wall_s() - t0) / n * 1e3;
            char dir[] = "/tmp/ac_cmbench_XXXXXX";
            double est_ms = -1;
            if (mkdtemp(dir) && !cm_calibration_save(dir, cal, err, sizeof err)) {
                json_t *e = NULL;
                t0 = eng_wall_s();
                cm_estimate(&parent, &t, dir, &e, err, sizeof err);
                est_ms = (eng_wall_s() - t0) * 1e3;
                json_decref(e);
                char path[256];
                cm_calibration_path(dir, json_string_value(json_object_get(cal, "id")), path, sizeof path);
                unlink(path);
                snprintf(path, sizeof path, "%s/calibrations", dir);
                rmdir(path);
                rmdir(dir);
            }
            out2(f, "Estimate speed (30-layer parent): %.3f ms per prediction from loaded tables; %.1f ms for the "
                    "whole POST /v1/estimates path (read + validate the cached calibration, predict).\n\n",
                 per, est_ms);
            cm_tables_free(&tb);
        }
        json_decref(cal);
    }
    arch_free(&parent);
    if (f)
        fclose(f);
    return status;
}
