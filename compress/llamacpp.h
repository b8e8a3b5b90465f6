/* compress/llamacpp.h — llama.cpp as a target engine: the measurement helper `ac-llama`
 * (llamacpp/ac_llama.c, linked to the libllama of the pinned llama-cpp-python package)
 * run in a fresh process per model, GGUF files at the target's weight type (quantized by
 * llama.cpp's own quantizer), and the timings and buffers llama.cpp reports. One model per
 * process: the idle thread pools of other contexts in one process steal the cores.
 * docs/llamacpp.md says how the helper times a request.
 */
#ifndef AC_COMPRESS_LLAMACPP_H
#define AC_COMPRESS_LLAMACPP_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "compress/costmodel.h"
#include "compress/measure.h"
#include "engine/arch.h"
#include "engine/model.h"

/* What `ac-llama info` says about the llama.cpp build, and where the helper is. */
typedef struct {
    char helper[4096];          /* path of the helper program */
    char ggml_version[64], ggml_commit[64];
    char package_version[32];   /* llama-cpp-python version that built it */
    char build_flags[256];      /* CMAKE_ARGS of that build */
    char system_info[512];      /* llama_print_system_info: the CPU features it uses */
    char fingerprint[64];       /* "llama.cpp <pkg> <commit> <sha8 of flags and system info>" */
} lc_info;

/* Find the helper (AC_LLAMA_HELPER, else `ac-llama` beside this program or one folder
 * up) and ask it about its build. Returns 0, or -1 with the reason ("llama.cpp is not
 * installed ...: scripts/llamacpp.sh install") in err. Cached after the first success;
 * a failed answer for 10 s, unless another helper file is found at the path since.
 * Thread-safe: one helper at a time is asked, and the other callers wait for it. */
int lc_probe(lc_info *info, char *err, size_t errlen);

/* The engine object of /v1/engines for llama.cpp: {name, present, version, ...,
 * precisions, kv_cache_types} (present false with "reason" when the helper is missing).
 * New reference; NULL on OOM. */
json_t *lc_engine_json(void);

/* Complete a llama.cpp target where it is measured: threads 0 -> the online CPUs, and
 * engine_build <- the helper's fingerprint. A target of another engine is left alone.
 * Returns 0, or -1 with err (llama.cpp absent). */
int lc_target_resolve(cm_target *t, char *err, size_t errlen);

/* Write `dst` at weight type `type` (a CM_LLAMACPP_PRECISIONS word) from the F32 GGUF
 * `src`: a copy for f32, else llama.cpp's quantizer with `threads`. *fallbacks (may be
 * NULL) gets how many tensors llama.cpp stored in a fallback type. stop (may be NULL):
 * its cancel hook (measure.h) kills the quantizer (err "cancelled"). 0, or -1 with err. */
int lc_quantize(const char *src, const char *dst, const char *type, int threads, int *fallbacks, const ms_opts *stop,
                char *err, size_t errlen);

/* One model served by llama.cpp: per-request phase times and llama.cpp's buffers. */
typedef struct {
    int reps, n_steps;
    double *prefill_ms;         /* [reps] */
    double *decode_ms;          /* [reps * n_steps]: step i of request r at [r * n_steps + i] */
    int64_t n_params, model_bytes;
    int64_t buf_model, buf_kv, buf_compute, buf_output;   /* llama.cpp's own buffers (bytes) */
    int64_t rss_before_load, rss_peak;                    /* the helper process */
    double load_ms;
    int threads, n_ctx;
} lc_bench;

void lc_bench_free(lc_bench *b);

/* Serve the GGUF at `path` in a fresh helper process at t (threads, batch, prompt and
 * output tokens, KV type) with o's warm-up, reps and seed. flush >= 0: that many bytes
 * (at most four times the last-level cache: more evicts nothing more) read before each
 * timed step (`ac-llama bench --flush`), for calibration's
 * repeated-block models, which price the blocks of models larger than themselves; a
 * served model is timed with flush -1 (nothing read). o's cancel hook (measure.h) kills
 * the helper when it says stop: -1 with err "cancelled". 0, or -1 with err. */
int lc_bench_gguf(const char *path, const cm_target *t, const ms_opts *o, int64_t flush, lc_bench *b, char *err,
                  size_t errlen);

/* Serve the GGUF files a and b (b may be NULL) `rounds` times each, every serving a
 * fresh process, alternating a b a b (a machine whose speed drifts moves both alike),
 * with o's warm-up and requests: benches into ab[rounds] and bb[rounds] (free each with
 * lc_bench_free, also after a failure). tick (may be NULL) runs after each round with
 * the rounds done; a non-zero return stops there and is returned; o's cancel hook stops
 * within a serving (1). 0, tick's return, 1 stopped, or -1 with err. */
int lc_bench_alternating(const char *a, const char *b, const cm_target *t, const ms_opts *o, int rounds,
                         lc_bench *ab, lc_bench *bb, int (*tick)(void *ud, int done), void *ud, char *err,
                         size_t errlen);

/* Each of n benches' median request latency, as a NEW JSON array (NULL on OOM). */
json_t *lc_bench_latencies_json(const lc_bench *b, int n, const cm_target *t);

/* The process of median latency among n benches: its index, and its §10 fields in *r,
 * except the peak memory, which is the highest any of them reached (a limit's ceiling). */
int lc_bench_median(const lc_bench *b, int n, const cm_target *t, ms_result *r);

/* About how many bytes llama.cpp stores per weight at weight type `precision` (f32 4,
 * q8_0 34/32, q4_k_m's mix about 4.9 bits ...); 4 for a name it does not know. */
double lc_bytes_per_weight(const char *precision);

/* The §10 measured fields of a bench: medians over reps; peak_bytes = the helper's RSS
 * high-water mark, backend_peak_bytes = llama.cpp's buffers, rss_delta = peak minus RSS
 * before loading. */
void lc_bench_result(const lc_bench *b, const cm_target *t, ms_result *r);

/* Write `a` with random weights (seed) as a GGUF at the target's weight type into dir
 * (an existing scratch folder) as NAME.gguf; path (cap bytes) gets the file. Refuses an
 * arch llama.cpp's graphs cannot run (storage/export's rules) and one whose widths the
 * weight type cannot store (*fallbacks > 0 reported, not refused: calibration prices
 * it). stop (may be NULL): its cancel hook (measure.h) stops the drawing and the
 * quantizer (err "cancelled"). 0, or -1 with err. */
int lc_write_random(const arch *a, const cm_target *t, uint64_t seed, const char *dir, const char *name,
                    char *path, size_t cap, int *fallbacks, const ms_opts *stop, char *err, size_t errlen);

/* lc_write_random then lc_bench_gguf, the file removed afterwards. 0, or -1 with err. */
int lc_measure_arch(const arch *a, const cm_target *t, const ms_opts *o, int64_t flush, const char *dir, lc_bench *b,
                    char *err, size_t errlen);

/* A scratch folder for llama.cpp's model files of archs up to `largest`: under
 * AC_SCRATCH, else /dev/shm when writable and with room for them (no disk writeback
 * competing with the timed requests), else TMPDIR or /tmp; mkdtemp into out, with a
 * marker naming this process. Folders there whose owner died without removing them are
 * removed first. 0, or -1 with err. Remove it with fio_remove_tree. */
int lc_scratch_dir(const arch *largest, char *out, size_t cap, char *err, size_t errlen);

#endif
