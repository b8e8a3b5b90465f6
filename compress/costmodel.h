/* compress/costmodel.h — the cost model: predicted latency, throughput and itemized
 * memory of an arch on a target, from timing tables measured by calibration
 * (compress/calibrate.h) on that target or imported from another serving engine.
 * Predictions are table lookups (no engine runs); this module knows no engine.
 *
 * Definitions (used everywhere, DESIGN.md §10):
 *   request      B rows of `prompt_tokens` prompt tokens: one prefill of the B×S tokens
 *                (logits of each row's last token), then `output_tokens` decode steps of
 *                one token per row over a growing context S, S+1, ..., S+N-1.
 *   latency_ms   wall time of one request: prefill + every decode step.
 *   throughput   generated tokens per second at batch B during decode:
 *                B * output_tokens / (sum of decode-step times).
 *   memory       peak bytes while serving the request: weights + request cache (KV for
 *                B×(S+N) positions, Mamba conv and SSM states) + prefill workspace + runtime
 *                buffers.
 */
#ifndef AC_COMPRESS_COSTMODEL_H
#define AC_COMPRESS_COSTMODEL_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "engine/arch.h"

/* ---------- target ---------- */

typedef struct {
    char device[32];        /* "cpu", "cuda:0" */
    char precision[16];     /* autocompress: "fp32" (the engine's only precision on CPU);
                               llama.cpp: the GGUF weight type (CM_LLAMACPP_PRECISIONS) */
    int batch_size;         /* B */
    int prompt_tokens;      /* S */
    int output_tokens;      /* N */
    char engine[16];        /* serving engine: "autocompress" (also when empty) or "llama.cpp" */
    char kv_cache_type[8];  /* llama.cpp: KV cache type (CM_LLAMACPP_KV_TYPES); "" otherwise */
    int threads;            /* llama.cpp: threads (0 = every online CPU, resolved when measured) */
    char flash_attention[8];/* llama.cpp: "on" or "off" (CM_LLAMACPP_FLASH_ATTN); "" otherwise */
    char engine_build[64];  /* the engine's version and build fingerprint, set where it is
                               measured (calibration); part of a calibration's key, so a
                               calibration never serves another engine build; "" = none */
} cm_target;

/* Engine names and what each takes (space-separated lists). */
#define CM_ENGINE_AUTOCOMPRESS "autocompress"
#define CM_ENGINE_LLAMACPP "llama.cpp"
#define CM_AUTOCOMPRESS_PRECISIONS "fp32 bf16 fp16"
#define CM_AUTOCOMPRESS_DEFAULT_PRECISION "fp32"
#define CM_LLAMACPP_PRECISIONS "f32 f16 bf16 q8_0 q4_0 q4_k_m q5_k_m q6_k"
#define CM_LLAMACPP_KV_TYPES "f16 f32 bf16 q8_0 q4_0"
#define CM_LLAMACPP_DEFAULT_PRECISION "f16"
#define CM_LLAMACPP_DEFAULT_KV_TYPE "f16"
/* Flash attention, as the server runs it: "off" (llama-cpp-python's default) or "on"
 * (llama-server -fa on; a quantized V cache needs it). llama.cpp's "auto" is not one: it
 * turns it on only for archs whose layers share one V width, so one search would price
 * two kernels. Default: "on" with a quantized KV cache, else "off". */
#define CM_LLAMACPP_FLASH_ATTN "off on"
const char *cm_llamacpp_default_flash(const char *kv_type);
/* The flash-attention setting target t runs: its own, else the default for its KV type. */
const char *cm_target_flash(const cm_target *t);

/* 1 when t is served by llama.cpp. */
int cm_target_llamacpp(const cm_target *t);

/* The most requests llama.cpp serves at once: a batch is that many sequences, and the
 * pinned llama.cpp holds at most 256 (its LLAMA_MAX_SEQ: a context for more is refused). */
#define CM_LLAMACPP_MAX_BATCH 256

/* 0 when engine (NULL or "": autocompress) can serve a batch of `batch` requests at once,
 * else -1 with the reason in why. */
int cm_batch_check(const char *engine, int batch, char *why, size_t whylen);

/* Check an engine / device / precision / KV type / threads / flash-attention combination
 * (device, precision, kv_type, flash may be NULL = not checked / the engine's default;
 * threads < 0 = not given). llama.cpp is measured on the CPU only: its helper offloads
 * no layer to a GPU, so a llama.cpp target on a GPU is refused rather than priced and
 * measured on the CPU. Returns 0, or -1 with the field at fault ("engine", "device",
 * "precision", "kv_cache_type", "threads", "flash_attention") in *field and the reason in
 * why. One vocabulary for the spec validator and the target parsers. */
int cm_engine_check(const char *engine, const char *device, const char *precision, const char *kv_type, int threads,
                    const char *flash,
                    const char **field, char *why, size_t whylen);

/* The words of one of the lists above as a JSON array of strings, for the answers that
 * show an engine's vocabulary. New reference; NULL on OOM. */
json_t *cm_words_json(const char *list);

/* The width every weight matrix's input dimension must be a multiple of for the target's
 * weight type to store it in that type: 32 for q8_0 / q4_0, 256 for the K-quants, 1
 * otherwise (f32, f16, bf16 and the built-in engine). When the parent (may be NULL) itself
 * has widths that are not multiples of 256, a K-quant target gets 32: llama.cpp stores
 * those matrices in its 32-wide fallback type for the parent too, and calibration prices
 * that by measurement. Calibration grids and the search keep to the block. */
int cm_target_block(const cm_target *t, const arch *parent);
/* 1 when every weight matrix of `a` has an input width that is a multiple of `block`
 * (hidden size; each attention's n_heads*head_dim; each FFN width; each Mamba mixer's
 * d_inner, out_proj's input; each MoE's expert, shared-expert and latent widths), else 0
 * with the first offender named in why (may be NULL). */
int cm_arch_fits_block(const arch *a, int block, char *why, size_t whylen);

/* The workload every entry point assumes when a spec or command names none (the job
 * spec's documented defaults), so that a default job and a default `autocompress
 * calibrate` share one cached calibration. */
#define CM_DEFAULT_BATCH 1
#define CM_DEFAULT_PROMPT_TOKENS 256
#define CM_DEFAULT_OUTPUT_TOKENS 64

/* The reduced hidden sizes a hidden-size search may choose for a parent of width C:
 * eighths of C from one half up (4/8 .. 7/8), multiples of 8, ascending, distinct, into
 * out. Returns how many (at most 4). Calibration times these; the search offers those
 * the tables cover, plus C itself. */
int cm_hidden_candidates(int C, int out[4]);
/* The same, each rounded down to a multiple of `multiple` (>= 8; cm_target_block). */
int cm_hidden_candidates_m(int C, int multiple, int out[4]);

/* The default target: "cpu", "fp32" and the default workload. */
void cm_target_default(cm_target *t);

/* Parse a target object {device, precision?, workload:{batch_size, prompt_tokens,
 * output_tokens}} (borrowed). Unknown keys and bad values are errors naming the JSON
 * pointer under `ptr` (e.g. "/target"). Defaults: precision "fp32". Returns 0 or -1. */
int cm_target_from_json(json_t *j, const char *ptr, cm_target *t, char *err, size_t errlen);
/* New reference; NULL on OOM. */
json_t *cm_target_to_json(const cm_target *t);
/* 1 when tables measured on target a price target b: the same device, engine, precision,
 * KV-cache type, threads, engine build and workload; else 0. */
int cm_target_same(const cm_target *a, const cm_target *b);

/* ---------- timing tables ---------- */

enum { CM_ATTN = 0, CM_MLP = 1 };

#define CM_MAX_CTX 8

/* One timing-table entry: a layer part of one size at one hidden size.
 * Prefill entries: ms = time of the part on the B×S prefill; workspace_bytes = the
 * engine's activation workspace while that part runs (bytes, -1 if unknown).
 * Decode entries: step time at context c is ms0 + ms_per_ctx * c (least-squares fit of
 * the n_ctx sampled points ctx[] / ctx_ms[]). mad_ms is the median absolute deviation. */
typedef struct {
    int part;                   /* CM_ATTN or CM_MLP */
    int hidden_size;
    int n_heads, n_kv_heads;    /* attention (0, 0 = removed) */
    int ffn_dim;                /* mlp (0 = removed) */
    int n_experts, top_k, expert_ffn_dim, shared_ffn_dim;   /* an MoE mlp (n_experts > 0; ffn_dim 0):
                                   n_experts experts of top_k routing, the layer's widths */
    int latent_dim;             /* the MoE's latent (LatentMoE; 0 without) */
    arch_mamba mamba;           /* a Mamba-2 mixer in the attention's part (mamba.n_heads > 0;
                                   n_heads, n_kv_heads 0): its heads and shape */
    double ms, mad_ms;          /* prefill */
    int64_t workspace_bytes;    /* prefill */
    double ms0, ms_per_ctx;     /* decode fit */
    int n_ctx;
    int ctx[CM_MAX_CTX];
    double ctx_ms[CM_MAX_CTX], ctx_mad_ms[CM_MAX_CTX];
    int samples;                /* timed samples behind the medians */
} cm_entry;

/* Costs outside the layers, per hidden size. "other" = wall time of the phase minus the
 * layers' and the embedding/head entries (loop, sampling, synchronisation).
 * prefill_scale / decode_scale multiply every time of their phase (parts and fixed):
 * the median ratio, over the calibration requests, of a whole phase's wall time to the
 * sum of its entries' medians. It carries what medians of parts leave out of a whole
 * request (preemption on a shared machine, effects between parts); 1 on a quiet one. */
typedef struct {
    int hidden_size;
    double prefill_embed_ms, prefill_head_ms, prefill_other_ms;
    double decode_embed_ms, decode_head_ms, decode_other_ms;   /* per decode step */
    double prefill_scale, decode_scale;                        /* 1 = none */
    int64_t workspace_bytes;    /* prefill workspace outside the layers (logits, residual) */
} cm_fixed;

/* Memory model coefficients, measured by calibration from the engine's byte accounting.
 *   weights   = weight_bytes_per_param * (params - embedding params)
 *               + embed_bytes_per_param * embedding params + weight_overhead_bytes
 *   cache     = kv_bytes_per_elem * (attention KV elements) + state_bytes_per_elem * (Mamba
 *               conv and SSM state elements) + kv_overhead_bytes (cm_cache_elems; the state
 *               at kv_bytes_per_elem when state_bytes_per_elem is 0: llama.cpp keeps the
 *               recurrent state in f32 beside an f16 KV cache, this engine both in fp32)
 *   workspace, from the prefill entries' workspace_bytes (each measured on a one-layer
 *               probe holding only that part, so it includes the fixed workspace W0 of
 *               the zero-layer probe, fixed.workspace_bytes), by the combination rule
 *               calibration found in the engine's accounting:
 *     CM_WS_MAX        max(W0, max_l max(ws_attn(l), ws_mlp(l)))   (buffers per layer)
 *     CM_WS_SUM_MAXIMA W0 + max_l (ws_attn(l) - W0) + max_l (ws_mlp(l) - W0)
 *                      (one workspace sized by the largest part of each kind)
 *   runtime   = runtime_bytes (process memory outside the backend's accounting: BLAS
 *               buffers, allocator slack; CPU: RSS high-water delta minus backend peak) */
enum { CM_WS_MAX = 0, CM_WS_SUM_MAXIMA = 1 };

typedef struct {
    int workspace_combine;      /* CM_WS_* */
    double weight_bytes_per_param;
    double embed_bytes_per_param;   /* embedding (and untied LM head) bytes per parameter when
                                       the engine stores them in another type (llama.cpp's
                                       quantizer does); 0 = weight_bytes_per_param */
    int64_t weight_overhead_bytes;
    double kv_bytes_per_elem;
    double state_bytes_per_elem;    /* the Mamba state's (0 = kv_bytes_per_elem) */
    int64_t kv_overhead_bytes;
    int64_t runtime_bytes;
} cm_memory;

typedef struct {
    char id[40];                /* "cal_" + 16 hex digits of the content key */
    cm_target target;
    char family[ARCH_FAMILY_MAX];
    int vocab_size, head_dim, tie_word_embeddings, attention_bias;
    int n_prefill, n_decode, n_fixed;
    cm_entry *prefill, *decode;
    cm_fixed *fixed;
    cm_memory mem;
    char source[32];            /* "autocompress" (calibrated here) or "import" */
    int width_multiple;         /* every weight matrix's input width must be a multiple of it
                                   (cm_target_block; 1 or 0 = any): archs off it are outside
                                   the tables, and the search keeps to it */
    double parent_bias_prefill, parent_bias_decode;
                                /* llama.cpp calibrations: per phase, the parent's measured over
                                   predicted time relative to the fit archs' (0 = 1): how much
                                   further the served parent sits from the tables than the
                                   archs a search compares; an anchor (compress/servecheck.h)
                                   divides the parent's ratio by it; within CM_PARENT_BIAS_MAX
                                   of 1 either way */
} cm_tables;

/* The most a parent bias may differ from 1, as a factor either way: further, the tables do
 * not price the parent, and a calibration that finds it fails. */
#define CM_PARENT_BIAS_MAX 10.0

void cm_tables_free(cm_tables *t);   /* frees arrays; safe on a zeroed struct */
/* A deep copy of src into dst (free with cm_tables_free). 0, or -1 on OOM (dst zeroed). */
int cm_tables_copy(cm_tables *dst, const cm_tables *src);
/* Multiply every time of each phase by its factor (the fixed entries' phase scales):
 * the tables' level moved to a machine measured faster or slower than at calibration. */
void cm_tables_rescale(cm_tables *t, double prefill, double decode);

/* Tables <-> JSON (the "tables" object of a calibration, docs/timing-tables.md).
 * cm_tables_to_json: new reference, NULL on OOM.
 * cm_tables_from_json: strict (unknown keys, wrong types, impossible values, duplicate
 * entries, decode entries without a matching prefill entry are refused); every fault
 * is reported as "POINTER: reason" under `ptr`. Returns 0, or -1 (t zeroed). */
json_t *cm_tables_to_json(const cm_tables *t);
int cm_tables_from_json(json_t *j, const char *ptr, cm_tables *t, char *err, size_t errlen);

/* Import a document {format:"autocompress.timing-tables/1", target, family, vocab_size,
 * head_dim, tie_word_embeddings, tables} measured in another engine (borrowed).
 * Same error contract as cm_tables_from_json, pointers from the document root. */
int cm_tables_import(json_t *doc, cm_tables *t, char *err, size_t errlen);

/* ---------- keys and the on-disk cache ---------- */

/* Content key of a calibration: sha-256 over device, precision, family, the shape
 * globals (vocab, head_dim, tie, bias), the hidden sizes and the largest part sizes of
 * `a` (the parent), and the workload. id gets "cal_" + 16 hex digits. */
void cm_calibration_id(const cm_target *t, const arch *a, char id[40]);

/* What besides the model's shape a calibration's tables hold for: device, precision, and
 * the engine's kernel, thread count (threads: the built-in CPU engine's, 0 for its
 * default), wait policy, KV type, flash attention, build and calibration method. Kept in
 * the calibration as "env"; a covering calibration (cm_calibration_find) must have this
 * process's. */
void cm_calibration_env(const cm_target *t, int threads, char *buf, size_t cap);

/* Path "<data_dir>/calibrations/<id>.json" into buf. Returns 0, or -1 if too long. */
int cm_calibration_path(const char *data_dir, const char *id, char *buf, size_t len);

/* Load a calibration object (the whole §10 object, new reference) by id; NULL with a
 * reason in err when absent or unreadable. */
json_t *cm_calibration_load(const char *data_dir, const char *id, char *err, size_t errlen);

/* Write a calibration object atomically (temp file, fsync, rename) under its "id".
 * Returns 0, or -1 with a reason. */
int cm_calibration_save(const char *data_dir, json_t *cal, char *err, size_t errlen);

/* Parse a calibration object's target and tables into t (id copied; source "import"
 * when the calibration says so, else "autocompress"). 0, or -1 with a pointer-named
 * reason. */
int cm_calibration_tables(json_t *cal, cm_tables *t, char *err, size_t errlen);

/* Whether the cache may hand out calibration cal: status "succeeded", and not made beside
 * other work (its host_load contended: such tables serve only the run that made them). */
int cm_calibration_reusable(const json_t *cal);

/* Find a cached calibration whose tables cover `a` on target t (same device,
 * precision, workload, family and globals; every part size of a inside the grids), one
 * cm_calibration_reusable. Returns a new reference to the calibration object, or NULL
 * when none. */
json_t *cm_calibration_find(const char *data_dir, const cm_target *t, const arch *a);

/* ---------- prediction ---------- */

typedef struct {
    double prefill_ms;          /* one prefill of B×S */
    double decode_ms;           /* all N decode steps */
    double decode_ms_per_token; /* decode_ms / N (one step, B tokens) */
    double latency_ms;          /* prefill_ms + decode_ms */
    double throughput_tps;      /* B*N / decode_ms * 1000 */
    int64_t weights, request_cache, prefill_workspace, runtime_buffers, total;  /* bytes */
    int64_t naive_bytes;        /* weights + KV at the engine's precision, nothing else */
    int64_t params;
} cm_prediction;

/* Predict the cost of `a` at the tables' target. Off-grid sizes interpolate linearly
 * between the two nearest grid entries (exact on grid points), hidden sizes likewise
 * between calibrated hidden sizes. Returns 0, or -1 with a reason when `a` lies outside
 * the tables (family/globals differ, a size beyond the grid). */
int cm_predict(const cm_tables *t, const arch *a, cm_prediction *p, char *err, size_t errlen);

/* Cost of one part at a hidden size (what cm_predict sums): prefill ms, decode ms summed
 * over the workload's N steps (both with the phase scales applied), and the part's
 * prefill workspace bytes as its one-layer probe measured them (W0 included; combine
 * parts by t->mem.workspace_combine). size = ffn_dim for CM_MLP; for CM_ATTN n_heads
 * with n_kv_heads. Any output pointer may be NULL. Returns 0, or -1 outside the tables. */
int cm_part_cost(const cm_tables *t, int part, int hidden, int n_heads, int n_kv_heads, int ffn_dim,
                 double *prefill_ms, double *decode_ms, double *workspace_bytes);
/* The same for an MoE MLP of shape `moe` (n_experts > 0): interpolated over the expert
 * count between entries of the same top_k and widths, and linearly between the two
 * calibrated expert widths around moe's. A shared-expert width the tables hold at other
 * routed shapes only (the calibration prices narrower shared experts beside the parent's
 * experts): the cost at a calibrated shared width plus the difference measured between the
 * two widths there. 0, or -1 outside the tables. */
int cm_moe_cost(const cm_tables *t, int hidden, const arch_moe *moe, double *prefill_ms, double *decode_ms,
                double *workspace_bytes);

/* x into the ascending distinct list w[0..*n) of at most max (left alone when full). */
void cm_insert_distinct(int *w, int *n, int max, int x);

/* The routed-expert widths the tables price for MoE blocks shaped as `moe` (its top_k, shared
 * and latent widths), ascending and distinct, into w[0..max); returns their count. */
int cm_moe_widths(const cm_tables *t, const arch_moe *moe, int *w, int max);
/* The shared-expert widths the tables price for MoE blocks of moe's latent (at any routed
 * shape; cm_moe_cost carries them to the others), ascending and distinct; the count. */
int cm_moe_shared_widths(const cm_tables *t, const arch_moe *moe, int *w, int max);
/* The latent widths (ascending, distinct, at most max) the tables price for a LatentMoE
 * (moe->latent_dim > 0): every latent of an MoE entry; 0 for an MoE without a latent. A
 * latent below the parent's is priced as the parent's shape's difference (at_hidden). */
int cm_moe_latents(const cm_tables *t, const arch_moe *moe, int *w, int max);

/* The same as cm_moe_cost for a Mamba-2 mixer of shape `mb` (n_heads > 0): interpolated over
 * the head count between entries of the same head_dim, state size, groups and conv kernel.
 * 0, or -1 outside. */

int cm_mamba_cost(const cm_tables *t, int hidden, const arch_mamba *mb, double *prefill_ms, double *decode_ms,
                  double *workspace_bytes);

/* Elements of a's request cache for B rows of T positions: keys and values of every
 * attention layer (2 * Hkv * head_dim * B * T) and the conv history and SSM state of every
 * Mamba layer (B * ((K-1) * conv_dim + H * head_dim * d_state), independent of T). With
 * state non-NULL it receives the Mamba part, which the sum includes. */
double cm_cache_elems(const arch *a, int B, int T, double *state);

/* The request cache's bytes under memory model m (CM memory: cache). */
int64_t cm_cache_bytes(const cm_memory *m, const arch *a, int B, int T);

/* Costs outside the layers at a hidden size (interpolated): prefill ms, decode ms over
 * the N steps, prefill workspace bytes. Returns 0, or -1 outside the tables. */
int cm_fixed_cost(const cm_tables *t, int hidden, double *prefill_ms, double *decode_ms, double *workspace_bytes);

/* Refit a decode entry's line (ms0, ms_per_ctx) through its sampled points. */
void cm_entry_fit_decode(cm_entry *e);

/* The §10 "predicted" object {latency_ms, prefill_ms, decode_ms_per_token,
 * throughput_tokens_per_s, memory_bytes{weights, request_cache, prefill_workspace,
 * runtime_buffers, total}}. New reference, NULL on OOM. */
json_t *cm_prediction_to_json(const cm_prediction *p);

/* The arch of a model or arch file (shape only, no weights read): an arch JSON file
 * (DESIGN.md §10) or an HF config.json, or a model in any format storage/modelio reads
 * (its one probe decides). a must not own memory. Returns 0, or -1 with a reason naming
 * the path (for a file in no known format, the formats accepted). */
int cm_load_arch(const char *path, arch *a, char *err, size_t errlen);

/* What an estimate found: a prediction, no calibration for the target and shape (err
 * names the one to run), tables that do not cover the arch, or a failure (memory). */
typedef enum { CM_EST_OK = 0, CM_EST_UNCALIBRATED, CM_EST_UNCOVERED, CM_EST_FAILED } cm_est_status;

/* Predict arch a (borrowed) on target tg from a calibration cached under data_dir: the
 * estimate object of DESIGN.md §10 into *out (NEW) with CM_EST_OK, else NULL and a
 * reason in err. Reading the request and choosing HTTP statuses is the API's. */
cm_est_status cm_estimate(const arch *a, const cm_target *tg, const char *data_dir, json_t **out, char *err,
                          size_t errlen);

#endif
