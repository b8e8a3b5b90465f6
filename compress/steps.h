/* compress/steps.h — the method's steps as the job's stages (jobs/stage_*.c) and the
 * subcommands (server/cli_*.c) both run them: packing text, calibrating a target for a
 * search, ranking, pruning into a directory, distilling into one. One implementation
 * per step; the defaults stay in the modules' *_default(s) functions (and in
 * step_text_default for packing). Where results go, progress and events stay with the
 * caller.
 */
#ifndef AC_COMPRESS_STEPS_H
#define AC_COMPRESS_STEPS_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "compress/calibrate.h"
#include "compress/distill.h"
#include "compress/rank.h"
#include "compress/reconstruct.h"
#include "compress/textdata.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

/* How a job packs its calibration and distillation text: document order seed 1234,
 * 5% of the documents held out, each document after the tokenizer's BOS (none when it
 * has no BOS; none either when tok is NULL, for a caller that sets it once the tokenizer
 * is loaded), at most 8 Mi training tokens. */
void step_text_default(td_pack_opts *o, const tok_tokenizer *tok);

/* Read the documents of path (any compress/textdata.h format) and pack them with tok
 * (no special tokens) under o into train and val (val may be NULL: everything trains).
 * *n_docs (may be NULL) gets the document count. 0 with the streams filled (free with
 * td_stream_free), or -1 with a reason and nothing to free. */
int step_text(const char *path, const tok_tokenizer *tok, const td_pack_opts *o, td_stream *train, td_stream *val,
              size_t *n_docs, char *err, size_t errlen);

/* The calibration of parent's shape on target t: with search_hidden, at the hidden sizes
 * a hidden-size search may choose as well (cal_opts_search_hidden, added to a copy of
 * o). reuse: take a cached one from data_dir when there is one (*reused says so), else
 * calibrate and save it there. NEW reference, or NULL with a reason. */
json_t *step_calibrate(const char *data_dir, const arch *parent, const cm_target *t, const cal_opts *o,
                       int search_hidden, int reuse, int *reused, char *err, size_t errlen);

/* Rank m on text with o fitted to the text's length (rank_opts_fit). Same contract as
 * rank_compute: 0 with *r filled, 1 when stopped by o's progress callback, -1 with a
 * reason. m's weights are not permuted (rank_apply does that). */
int step_rank(eng_model *m, const td_stream *text, const rank_opts *o, rank_result *r, char *err, size_t errlen);

/* Load a saved ranking (rank_save) and check it was computed for m's shape. 0 with *r
 * filled (free with rank_free), or -1 with a reason and nothing to free. */
int step_rank_load(const char *path, const eng_model *m, rank_result *r, char *err, size_t errlen);

/* Slice the ranked parent to target, reconstruct it on text when ro is given (compress/
 * reconstruct.h; NULL: the plain slice), and save the student as a pruned model
 * directory (compress/prune.h) with manifest (borrowed, may be NULL) as prune.json, which
 * gets "reconstruction": the outcome (recon_result_json), or false. *rr (may be NULL
 * without ro) is filled on 0 and 1 (free with recon_result_free). 0 when saved, 1 when
 * stopped by ro's progress callback (nothing saved; ro->ckpt_dir resumes), -1 with a
 * reason (an arch the parent cannot yield names the field at fault). */
int step_prune(eng_model *ranked, const arch *target, const char *dir, json_t *manifest, const td_stream *text,
               const recon_opts *ro, recon_result *rr, char *err, size_t errlen);

/* 1 when val (may be NULL) is long enough to validate on: more than one window of o's. */
int step_distill_has_val(const td_stream *val, const distill_opts *o);

/* Distill student from teacher on train (validating on val when step_distill_has_val),
 * then save it into out_dir as a pruned model directory whose prune.json is manifest
 * (borrowed, may be NULL: {}) plus distill_tokens and distill_steps. Returns 0 when the
 * budget was spent and the student saved, 1 when stopped (by the progress callback or
 * o->stop_after; nothing saved; the newest checkpoint resumes), -1 with a reason. *r is
 * filled on 0 and 1 (free with distill_result_free). */
int step_distill(eng_model *teacher, eng_model *student, const td_stream *train, const td_stream *val,
                 const distill_opts *o, const char *out_dir, json_t *manifest, distill_result *r, char *err,
                 size_t errlen);

/* The evaluation defaults of the evaluate stage and `autocompress eval`: every item of
 * each task (limit 0; a job's spec asks for 500 unless told), sampling seed 1234, each
 * task's own few-shot count (-1), task files fetched by URL up to 64 MiB. */
typedef struct {
    int limit;
    uint64_t seed;
    int n_fewshot;
    size_t max_task_bytes;
} step_eval_opts;
void step_eval_default(step_eval_opts *o);

#endif
