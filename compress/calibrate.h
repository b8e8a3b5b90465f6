/* compress/calibrate.h — calibration: time the real engine on the target for every
 * part size the search can choose and build the timing tables and memory model of
 * compress/costmodel.h, then validate them on random heterogeneous archs held out from
 * table construction. Calibration models sweep the grid (each layer a different grid
 * point), so one request times many entries. Results are cached under the data dir.
 */
#ifndef AC_COMPRESS_CALIBRATE_H
#define AC_COMPRESS_CALIBRATE_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "compress/costmodel.h"
#include "compress/measure.h"
#include "engine/arch.h"
#include "engine/backend.h"

typedef struct {
    int reps;               /* timed requests per calibration model (default 3) */
    int warmup;             /* untimed requests per model first (default 1) */
    int n_models;           /* calibration models with different grid layouts (default 2) */
    int n_layers;           /* layers per calibration model (default: the parent's) */
    int n_hidden;           /* extra hidden sizes (0: only the parent's) */
    int hidden[16];         /* their values (each < parent hidden, multiple of 8) */
    int validate;           /* held-out random archs (default 10; 0 = none) */
    int validate_reps;      /* timed requests per held-out (and fit) arch (default 3) */
    int fit;                /* random archs, measured like the held-out ones, whose median
                               measured/predicted ratio corrects the phase scales (default 6,
                               spread over the hidden sizes; 0: no correction) */
    uint64_t seed;          /* weights, prompts, held-out archs (default 1) */
    int threads;            /* CPU worker threads (0: the backend's default, all cores) */
    int verbose;            /* progress lines on stderr */
    /* Optional progress hook: returns non-zero to cancel (calibration then fails with
     * "cancelled"). step counts requests. */
    int (*progress)(void *ud, const char *what, int step, int total);
    /* Optional, with the same ud: non-zero cancels too, asked where no request ends for
     * seconds: while a model's random weights are drawn and between the decode steps of
     * each request (the built-in engine), while a llama.cpp helper serves
     * (ms_opts.cancelled). */
    int (*cancelled)(void *ud);
    /* Optional, with the same ud: told of each calibration set aside because other work
     * kept the machine busy meanwhile (quiet_tries below); tried is its entry of the
     * result's calibration_tries (borrowed), load what other work took meanwhile
     * (ms_host_load_note's words). */
    void (*aside)(void *ud, const json_t *tried, const char *load);
    void *ud;
    /* Calibrations in all while each one is judged contended (compress/measure.h
     * ms_run_quiet; default CAL_QUIET_TRIES; <= 1 keeps the first), and the longest wait
     * for a quiet second before the next (default MS_QUIET_WAIT_S). */
    int quiet_tries;
    double quiet_wait_s;
    /* cal_run's own (callers leave it NULL): the try under way, which stops at its next
     * step once it is judged beside other work (ms_quiet_cut) and is set aside so. */
    ms_quiet_state *quiet;
} cal_opts;
/* A calibration takes minutes on a real parent: once more at most. */
#define CAL_QUIET_TRIES 2

/* Defaults above. */
void cal_opts_default(cal_opts *o);

/* Add the hidden sizes a hidden-size search of `parent` may choose (cm_hidden_candidates)
 * to o: what a job with the default search space calibrates, and so what `autocompress
 * calibrate` and POST /v1/calibrations calibrate unless told otherwise. */
void cal_opts_search_hidden(cal_opts *o, const arch *parent);

/* The backend for device (CPU with `threads` workers when threads > 0) running its GEMMs
 * at `precision` ("fp32", "bf16", "fp16"; NULL or "" is fp32): what the built-in engine
 * is calibrated and measured on. NULL with err (device absent, precision not available
 * there). */
eng_backend *cal_backend_new(const char *device, const char *precision, int threads, char *err, size_t errlen);

/* The candidate grids derived from the parent (what the tables cover):
 *   attention: (g*group, g) for KV groups g = 1..KV, and (k*KV, KV) for k = 1..group,
 *              where KV and group are the parent's (largest) KV heads and group size;
 *   mlp: widths k*F/8 (k = 1..8, multiples of 8) plus the low end F/32; for a parent with
 *        MoE layers then (with moe_widths) up to 5 of the expert counts below (the most among
 *        them) at each narrower width of cal_moe_widths, then the codes of n experts (n = 1..,
 *        up to the most experts, at most 16 points) at the parent's expert width
 *        (cal_moe_code): the last code is the parent's MLP; with moe_widths and a shared
 *        expert, the parent's MoE with its shared expert at each narrower width of
 *        cal_moe_widths comes before those (cal_moe_shared_code), and with moe_widths and a
 *        latent (LatentMoE), the parent's MoE at each narrower latent of cal_moe_widths
 *        after the shared ones (cal_moe_latent_code);
 *   for a parent with Mamba-2 layers the attention grid goes on with the codes (m, -1) for m
 *   Mamba heads (multiples of the groups, at most 16 points), see cal_mixer_apply;
 *   removed parts (size 0) for both.
 * Writes at most max entries into heads/kv (attention) or ffn; returns the count. */
int cal_grid_attention(const arch *parent, int *heads, int *kv, int max);
/* A mixer grid point into layer l's mixer fields: nkv >= 0 attention of nh query and nkv
 * KV heads (0, 0: none); nkv < 0 a Mamba-2 mixer of nh heads shaped as the parent's first
 * Mamba layer. */
void cal_mixer_apply(const arch *parent, int nh, int nkv, arch_layer *l);
int cal_grid_mlp(const arch *parent, int *ffn, int max, int moe_widths);

/* The narrower routed-expert widths a calibration prices besides an expert width F: F/4,
 * F/2 and 3F/4 (multiples of 8 from F = 64 on), distinct, ascending, below F; the count. */
int cal_moe_widths(int F, int w[3]);

/* MLP grid codes of MoE blocks: -(width * CAL_MOE_BASE + n) for n experts of `width` units
 * (0: the parent's width), the parent's shared expert; -(CAL_MOE_SHARED + s) the parent's
 * first MoE layer with its shared expert s units wide (cal_moe_shared_code);
 * -(CAL_MOE_LATENT + d) that layer with its latent d channels wide (cal_moe_latent_code). */
#define CAL_MOE_BASE 8192
#define CAL_MOE_SHARED (1 << 30)
#define CAL_MOE_LATENT ((1 << 30) + (1 << 29))
static inline int cal_moe_code(int n, int width) { return -(width * CAL_MOE_BASE + n); }
static inline int cal_moe_shared_code(int s) { return -(CAL_MOE_SHARED + s); }
static inline int cal_moe_latent_code(int d) { return -(CAL_MOE_LATENT + d); }
static inline int cal_moe_is_latent(int code) { return code <= -CAL_MOE_LATENT; }
static inline int cal_moe_is_shared(int code) { return code <= -CAL_MOE_SHARED && code > -CAL_MOE_LATENT; }

/* An MLP grid code into layer l's MLP fields: code > 0 a dense FFN of that width; code < 0
 * an MoE (cal_moe_code) shaped as parent's first MoE layer (widths, norm_topk; top_k capped
 * at the expert count); 0 none. */
void cal_mlp_apply(const arch *parent, int code, arch_layer *l);

/* The timing-table entry key (part, hidden size and the part's shape; no times) of a grid
 * point: part CM_ATTN the mixer code (nh, nkv) (cal_mixer_apply), CM_MLP the MLP code ffn
 * (cal_mlp_apply). */
cm_entry cal_entry_key(const arch *parent, int part, int hidden, int nh, int nkv, int ffn);

/* Calibrate `parent`'s family and shape on target t using backend device t->device.
 * Returns a NEW reference to the calibration object of DESIGN.md §10 (id, status
 * "succeeded", target, family, entries, wall_s, tables, validation) with its extras
 * (docs/timing-tables.md; host_load: the machine's load from other work meanwhile,
 * compress/measure.h), or NULL with a reason in err (device absent, out of memory,
 * engine failure, cancelled). A calibration judged contended is set aside and made again
 * after a wait for a quiet second, o->quiet_tries in all; a try but the last stops at
 * its first step judged contended on the load so far (ms_quiet_cut). Each one set aside
 * is in calibration_tries ({host_load, wall_s, cut_short, and for a try made whole
 * latency_mape_pct, memory_mape_pct}) and the last one made is returned, its host_load
 * contended when all were. */
json_t *cal_run(const arch *parent, const cm_target *t, const cal_opts *o, char *err, size_t errlen);

/* A cached calibration for (t, parent) under data_dir if present and not made beside other
 * work (its host_load contended), else run and save it. *reused says which. Same return
 * contract as cal_run. */
json_t *cal_get_or_run(const char *data_dir, const arch *parent, const cm_target *t, const cal_opts *o,
                       int *reused, char *err, size_t errlen);

/* When calibration cal was made beside other work (its host_load contended): 1 and what
 * that means for its timings, and that it is not reused, in msg; else 0. */
int cal_contended_note(const json_t *cal, char *msg, size_t cap);

/* A random heterogeneous arch derived from parent (per-layer heads in KV-group units,
 * FFN widths in multiples of 8, expert counts, with moe_widths expert and shared-expert
 * widths of cal_moe_widths too, removed attention / MLP / layers), reproducible from *rng. Returns 0
 * or -1 (OOM). */
int cal_random_arch(const arch *parent, uint64_t *rng, arch *out, int moe_widths);

#endif
