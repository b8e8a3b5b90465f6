/* compress/steps.c — the steps shared by the job's stages and the subcommands (see
 * steps.h): glue over textdata, calibrate, rank, prune and distill, no policy of its own
 * beyond step_text_default. */
#include "compress/steps.h"

#include <stdio.h>
#include <string.h>

#include "compress/prune.h"
#include "engine/rng.h"

void step_text_default(td_pack_opts *o, const tok_tokenizer *tok)
{
    memset(o, 0, sizeof *o);
    o->seed = ENG_DEFAULT_SEED;
    o->val_fraction = 0.05;
    o->sep_token = tok ? tok_cfg(tok)->bos_id : -1;
    o->max_tokens = 8u << 20;
}

int step_text(const char *path, const tok_tokenizer *tok, const td_pack_opts *o, td_stream *train, td_stream *val,
              size_t *n_docs, char *err, size_t errlen)
{
    td_docs docs;
    if (td_read_docs(path, TD_FMT_AUTO, &docs, err, errlen) != 0)
        return -1;
    if (n_docs)
        *n_docs = docs.n;
    int rc = td_pack(&docs, td_encode_tok, (void *)tok, o, train, val, err, errlen);
    td_docs_free(&docs);
    return rc;
}

json_t *step_calibrate(const char *data_dir, const arch *parent, const cm_target *t, const cal_opts *o,
                       int search_hidden, int reuse, int *reused, char *err, size_t errlen)
{
    cal_opts co = *o;
    if (search_hidden)
        cal_opts_search_hidden(&co, parent);
    *reused = 0;
    if (reuse)
        return cal_get_or_run(data_dir, parent, t, &co, reused, err, errlen);
    json_t *cal = cal_run(parent, t, &co, err, errlen);
    if (cal && cm_calibration_save(data_dir, cal, err, errlen)) {
        json_decref(cal);
        cal = NULL;
    }
    return cal;
}

int step_rank(eng_model *m, const td_stream *text, const rank_opts *o, rank_result *r, char *err, size_t errlen)
{
    rank_opts fit = *o;
    if (rank_opts_fit(&fit, text->n, err, errlen) != 0)
        return -1;
    return rank_compute(m, text, &fit, r, err, errlen);
}

int step_rank_load(const char *path, const eng_model *m, rank_result *r, char *err, size_t errlen)
{
    if (rank_load(path, r, err, errlen) != 0)
        return -1;
    if (rank_check(r, m, err, errlen) != 0) {
        rank_free(r);
        return -1;
    }
    return 0;
}

int step_prune(eng_model *ranked, const arch *target, const char *dir, json_t *manifest, const td_stream *text,
               const recon_opts *ro, recon_result *rr, char *err, size_t errlen)
{
    eng_model student;
    if (prune_to_arch(ranked, target, &student, err, errlen) != 0)
        return -1;
    int rc = ro ? recon_run(ranked, &student, text, ro, rr, err, errlen) : 0;
    json_t *man = rc != 0 ? NULL : manifest ? json_deep_copy(manifest) : json_object();
    if (rc == 0) {
        json_t *rj = ro ? recon_result_json(rr, ro) : json_false();
        if (!man || !rj || json_object_set_new(man, "reconstruction", rj) != 0) {
            snprintf(err, errlen, "out of memory");
            rc = -1;
        }
    }
    if (rc == 0)
        rc = prune_save_dir(&student, dir, man, err, errlen);
    json_decref(man);
    if (rc < 0 && ro && rr) {
        recon_result_free(rr);
        memset(rr, 0, sizeof *rr);
    }
    eng_model_free(&student);
    return rc;
}

int step_distill_has_val(const td_stream *val, const distill_opts *o)
{
    return val && val->n > (size_t)o->T;
}

int step_distill(eng_model *teacher, eng_model *student, const td_stream *train, const td_stream *val,
                 const distill_opts *o, const char *out_dir, json_t *manifest, distill_result *r, char *err,
                 size_t errlen)
{
    int rc = distill_run(teacher, student, train, step_distill_has_val(val, o) ? val : NULL, o, r, err, errlen);
    if (rc != 0)
        return rc;
    json_t *man = manifest ? json_deep_copy(manifest) : json_object();
    if (!man || json_object_set_new(man, "distill_tokens", json_integer(r->tokens)) ||
        json_object_set_new(man, "distill_steps", json_integer(r->steps))) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    } else {
        rc = prune_save_dir(student, out_dir, man, err, errlen);
    }
    json_decref(man);
    if (rc != 0)
        distill_result_free(r);
    return rc;
}

void step_eval_default(step_eval_opts *o)
{
    o->limit = 0;
    o->seed = ENG_DEFAULT_SEED;
    o->n_fewshot = -1;
    o->max_task_bytes = (size_t)64 << 20;
}
