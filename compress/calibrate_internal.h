/* compress/calibrate_internal.h — the calibration state shared by calibrate.c (tables
 * from calibration models) and cal_validate.c (held-out and fit archs). Not for code
 * outside those two files.
 */
#ifndef AC_COMPRESS_CALIBRATE_INTERNAL_H
#define AC_COMPRESS_CALIBRATE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "compress/calibrate.h"
#include "compress/measure.h"
#include "engine/model.h"

#define MAX_ENTRIES 256
#define MAX_BINS 4

/* ---------- growable sample vectors ---------- */

typedef struct {
    double *v;
    int n, cap;
} dvec;

/* ---------- calibration state ---------- */

typedef struct {
    cm_entry key;                 /* part, hidden, size */
    dvec pre;                     /* prefill ns */
    dvec dec[MAX_BINS];           /* decode ns per context bin */
    int64_t ws;                   /* workspace bytes from the probe */
} acc_entry;

typedef struct {
    int hidden;
    dvec pre_embed, pre_head, pre_other, dec_embed, dec_head, dec_other;
    int64_t ws;
} acc_fixed;

typedef struct {
    arch a;
    eng_model m;
    eng_kv_cache *kv;
    int *attn_entry, *mlp_entry;  /* [L] index into entries */
    int fixed;                    /* index into fixed */
    int index;                    /* in the calibration model array */
    int inited;
    int requests;
} cal_model;

typedef struct {
    const cm_target *t;
    const cal_opts *o;
    ms_opts stop;                 /* o's cancel hook, asked between decode steps of every request */
    const arch *parent;           /* the MLP grid codes' MoE shape (cal_mlp_apply) */
    eng_backend *be;
    acc_entry e[MAX_ENTRIES];
    int n_e;
    acc_fixed f[17];
    int n_f;
    int n_bins;
    /* memory fits: (params, bytes) and (kv elems, bytes) pairs */
    dvec w_x, w_y, kv_x, kv_y, runtime;
    dvec req_model, req_pre, req_dec;   /* timed calibration requests: model, phase walls (ms) */
    ms_trace tr;
    int ws_combine;               /* CM_WS_* found by the probes */
    uint64_t rng;
    int step, total;
    int64_t requests;
    double heldout_s;             /* wall time spent building and serving held-out archs */
} cal_state;

/* Append x (0, or -1 on OOM); median of the samples (and their MAD when mad != NULL). */
int cali_dvec_push(dvec *d, double x);
double cali_dvec_median(dvec *d, double *mad);
/* The lower median of the samples (0 when there are none). */
double cali_lower_median(dvec *d);
/* Random weights for a calibration model (std 0.02 from seed), asking o's cancel hook as
 * they are drawn. 0, or -1 with err "cancelled" or out of memory. */
int cali_randomize(cal_state *cs, eng_model *m, uint64_t seed, char *err, size_t errlen);
/* One unit of progress; non-zero (err "cancelled") when the progress hook asks to stop. */
int cali_tick(cal_state *cs, const char *what, char *err, size_t errlen);
/* One request on calibration model cm; record: its timings feed the tables. 0, or -1. */
int cali_request(cal_state *cs, cal_model *cm, int record, char *err, size_t errlen);

/* Measure the n random archs varch (held out, then fit) as complete models, their
 * requests interleaved with the calibration models' timed ones, into vres. 0, or -1. */
int validate_all(cal_state *cs, arch *varch, int n, cal_model *cms, int n_models_per_hidden, int n_hid,
                 ms_result *vres, char *err, size_t errlen);
/* Correct the tables' phase scales by the median measured/predicted ratio of the n fit
 * archs fa (measured as fr); the factors into corr_p and corr_d. 0, or -1. */
int fit_scales(cm_tables *tb, const arch *fa, const ms_result *fr, int n, double *corr_p, double *corr_d,
               char *err, size_t errlen);
/* The same per hidden size: a calibrated hidden size with at least min_n fit archs of its
 * own gets their median ratios, the others the pooled ones (into corr_p, corr_d). *by
 * (may be NULL) gets a NEW array [{hidden_size, archs, prefill, decode}]. 0, or -1. */
int fit_scales_by_hidden(cm_tables *tb, const arch *fa, const ms_result *fr, int n, int min_n, double *corr_p,
                         double *corr_d, json_t **by, char *err, size_t errlen);

/* A llama.cpp calibration's held-out archs as a job's search prices them
 * (compress/servecheck.h): the tables' prediction with each phase scaled by the parent's
 * measured over predicted time (the median of its n_par servings in the run, par) divided
 * by the parent's bias, against the mean of the arch's two servings (as[2v], as[2v + 1]: a
 * job's check and measure stage take medians, not the faster process). The bias, which
 * jobs divide their anchor by (tb->parent_bias_*, set here), is the parent's ratio over
 * the fit archs' level (the median over va[n .. n + n_fit) of the same ratio): the parent,
 * the arch with the most layers and the largest parts, sits further from the tables than
 * the archs a search compares (bench/results/llamacpp_target-avx512.md: 42% at q4_0
 * against 4% for the held-out archs), and scaling them all by it over-prices them; without
 * fit archs the bias is 1. The n held-out rows of validation get "anchored", the summary
 * latency_anchored_mape_pct, latency_anchored_max_pct and the parent's level ("anchor").
 * 0, or -1 with err. */
int cal_anchored_validation(cm_tables *tb, const arch *parent, const arch *va, const ms_result *as,
                            const ms_result *par, int n_par, int n, int n_fit, json_t *validation, char *err,
                            size_t errlen);
/* What the memory items miss on whole archs: the median over the n fit archs fa (measured
 * as fr) of measured peak minus predicted total, added to tb's runtime_bytes when positive;
 * when negative (an over-prediction) and workspaces combine as a maximum, taken off every
 * part's and fixed workspace (none below 0: the maximum drops by as much); returned in
 * *resid_bytes (negative when taken off). For
 * engines whose memory is read from outside (llama.cpp's RSS), where per-part workspace
 * measured on repeated-block models misses part of a whole model's. 0, or -1. */
int fit_memory(cm_tables *tb, const arch *fa, const ms_result *fr, int n, int64_t *resid_bytes, char *err,
               size_t errlen);
/* The validation object of DESIGN.md §10 (NEW) for the first n_validate archs: each
 * predicted by tb against its measurement. NULL with err on failure. */
json_t *cal_validation_json(const cm_tables *tb, const arch *varch, const ms_result *vres, int n_validate,
                            const cm_target *t, char *err, size_t errlen);

/* Calibration inside llama.cpp (compress/cal_llama.c): the calibration document of
 * cal_run for a llama.cpp target, under `id`. NULL with err. */
json_t *cal_llama_run(const arch *parent, const cm_target *t, const cal_opts *o, const char *id, char *err,
                      size_t errlen);

#endif
