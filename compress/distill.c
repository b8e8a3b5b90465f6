/* compress/distill.c — the distillation loop, its schedule, validation and checkpoints.
 *
 * Checkpoint layout: <ckpt_dir>/step-NNNNNNNNNN/ holding a storage/ckpt.h snapshot of the
 * student (arch.json + model.safetensors, F32), optim.safetensors (AdamW m and v as
 * 1-D tensors "m", "v" over the model's parameter block), state.json (step, tokens, data cursor, RNG, AdamW
 * t, the loss curve so far and the options that must match to resume) and DONE. A
 * folder is built as step-N.tmp, every file fsynced, renamed, then DONE written
 * atomically; a folder without DONE is ignored and removed.
 */
#include "compress/distill.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>

#include "engine/clock.h"
#include "engine/rng.h"
#include "storage/ckpt.h"
#include "storage/fileio.h"
#include "storage/safetensors.h"

void distill_opts_defaults(distill_opts *o)
{
    memset(o, 0, sizeof *o);
    o->B = 4;
    o->T = 128;
    o->accum = 1;
    o->lr = 3e-4f;   /* bench/results/prune_recovery-lr.md: a pruned student recovers further than at 1e-3 */
    o->lr_min = 3e-5f;
    o->warmup_steps = 10;
    o->beta1 = 0.9f;
    o->beta2 = 0.95f;
    o->eps = 1e-8f;
    o->weight_decay = 0.01f;
    o->clip = 1.0f;
    o->temperature = 1.0f;
    o->kd_weight = 1.0f;
    o->eval_every = 50;
    o->val_tokens = 4096;
    o->ckpt_every = 50;
    o->keep_ckpts = 2;
    o->seed = ENG_DEFAULT_SEED;
}

void distill_result_free(distill_result *r)
{
    if (!r)
        return;
    free(r->loss_curve);
    memset(r, 0, sizeof *r);
}

int64_t distill_steps(int64_t tokens, int B, int T, int accum)
{
    int64_t per = (int64_t)B * T * accum;
    if (per <= 0 || tokens <= 0)
        return 0;
    return (tokens + per - 1) / per;
}

double distill_lr(const distill_opts *o, int64_t s, int64_t steps)
{
    if (o->warmup_steps > 0 && s < o->warmup_steps)
        return o->lr * (double)(s + 1) / (double)o->warmup_steps;
    int64_t decay = steps - o->warmup_steps;
    if (decay <= 1)
        return o->lr;
    double p = (double)(s - o->warmup_steps) / (double)(decay - 1);
    if (p > 1)
        p = 1;
    return o->lr_min + 0.5 * (o->lr - o->lr_min) * (1 + cos(M_PI * p));
}

/* ---- evaluation ------------------------------------------------------------------ */

int distill_eval_loss(eng_model *m, const td_stream *s, int B, int T, int64_t tokens, double *loss,
                      char *err, size_t errlen)
{
    if (!s || s->n < (size_t)T + 1) {
        snprintf(err, errlen, "evaluation stream has %zu tokens, fewer than T+1 = %d", s ? s->n : 0, T + 1);
        return -1;
    }
    /* never wrap around: at most the windows the stream holds */
    int64_t windows = (int64_t)((s->n - 1) / (size_t)T);
    int64_t want = (tokens + T - 1) / T;
    if (want < 1)
        want = 1;
    if (want > windows)
        want = windows;
    int rows = B < want ? B : (int)want;
    int *tok = malloc((size_t)rows * T * sizeof *tok), *tgt = malloc((size_t)rows * T * sizeof *tgt);
    if (!tok || !tgt) {
        free(tok);
        free(tgt);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    uint64_t cursor = 0;
    double total = 0;
    int64_t count = 0, done = 0;
    int rc = 0;
    while (done < want && !rc) {
        int b = (int)(want - done < rows ? want - done : rows);
        double sum = 0;
        if (td_batch(s, &cursor, b, T, tok, tgt)) {
            snprintf(err, errlen, "evaluation batch failed");
            rc = -1;
            break;
        }
        if (eng_forward_loss(m, tok, tgt, b, T, &sum, err, errlen)) {
            rc = -1;
            break;
        }
        total += sum;
        count += (int64_t)b * T;
        done += b;
    }
    free(tok);
    free(tgt);
    if (!rc)
        *loss = total / (double)count;
    return rc;
}

/* ---- checkpoints ------------------------------------------------------------------ */

static int step_dir(char *buf, size_t len, const char *dir, int64_t step, const char *suffix)
{
    return (size_t)snprintf(buf, len, "%s/step-%010lld%s", dir, (long long)step, suffix) >= len ? -1 : 0;
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Steps of complete checkpoints in dir, ascending; *n their count. Removes folders
 * left without DONE (a checkpoint interrupted while being written). */
static int64_t *list_checkpoints(const char *dir, int *n, int clean)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    int64_t *v = NULL;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "step-", 5))
            continue;
        char *end;
        long long s = strtoll(e->d_name + 5, &end, 10);
        char path[4096], done[4200];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path)
            continue;
        snprintf(done, sizeof done, "%s/DONE", path);
        if (*end != 0 || s <= 0 || !file_exists(done)) {
            if (clean)
                (void)fio_remove_tree(path);
            continue;
        }
        if (*n == cap) {
            cap = cap ? cap * 2 : 8;
            int64_t *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv)
                break;
            v = nv;
        }
        v[(*n)++] = s;
    }
    closedir(d);
    for (int i = 1; i < *n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            int64_t t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v;
}

int64_t distill_latest_checkpoint(const char *dir)
{
    int n;
    int64_t *v = list_checkpoints(dir, &n, 0);
    int64_t s = n > 0 ? v[n - 1] : 0;
    free(v);
    return s;
}

/* Checkpoint `step` of ckpt_dir: its folder into dir[4096] and its state.json (NEW), or
 * NULL with err. */
static json_t *load_state(const char *ckpt_dir, int64_t step, char *dir, char *err, size_t errlen)
{
    char path[4300];
    if (step_dir(dir, 4096, ckpt_dir, step, "")) {
        snprintf(err, errlen, "checkpoint path too long");
        return NULL;
    }
    snprintf(path, sizeof path, "%s/state.json", dir);
    json_error_t je;
    json_t *state = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!state)
        snprintf(err, errlen, "%s: %s", path, je.text);
    return state;
}

int distill_resume_schedule(distill_opts *o, char *err, size_t errlen)
{
    int64_t step = o->ckpt_dir ? distill_latest_checkpoint(o->ckpt_dir) : 0;
    if (step <= 0)
        return 0;
    char dir[4096];
    json_t *state = load_state(o->ckpt_dir, step, dir, err, errlen);
    if (!state)
        return -1;
    json_t *op = json_object_get(state, "options"), *lr = json_object_get(op, "lr"),
           *lr_min = json_object_get(op, "lr_min"), *warm = json_object_get(op, "warmup_steps");
    int rc = -1;
    if (!json_is_number(lr) || !json_is_number(lr_min) || !json_is_integer(warm)) {
        snprintf(err, errlen, "%s/state.json: its options hold no learning-rate schedule", dir);
    } else {
        o->lr = (float)json_number_value(lr);
        o->lr_min = (float)json_number_value(lr_min);
        o->warmup_steps = json_integer_value(warm);
        rc = 1;
    }
    json_decref(state);
    return rc;
}

/* Options that must be equal for a checkpoint to continue the same run. */
static json_t *opts_fingerprint(const distill_opts *o, const eng_model *student)
{
    json_t *f = json_pack("{s:I,s:i,s:i,s:i,s:f,s:f,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:I}", "tokens",
                     (json_int_t)o->tokens, "B", o->B, "T", o->T, "accum", o->accum, "lr", (double)o->lr,
                     "lr_min", (double)o->lr_min, "warmup_steps", (json_int_t)o->warmup_steps, "beta1",
                     (double)o->beta1, "beta2", (double)o->beta2, "weight_decay", (double)o->weight_decay,
                     "clip", (double)o->clip, "temperature", (double)o->temperature, "kd_weight",
                     (double)o->kd_weight, "eps", (double)o->eps, "n_params", (json_int_t)student->n_params,
                     "seed", (json_int_t)(o->seed & 0x7fffffffffffffffull));
    /* only when used, so that checkpoints written before the option existed still resume */
    if (f && o->hidden_weight > 0 && json_object_set_new(f, "hidden_weight", json_real(o->hidden_weight))) {
        json_decref(f);
        return NULL;
    }
    return f;
}

typedef struct {
    int64_t step, tokens;
    uint64_t cursor, rng;
    double *curve;          /* [step] */
    double last_val;        /* the last validation loss (NaN: none yet) */
    const json_t *data;     /* what the run reads (data_fingerprint) */
} run_state;

/* A 64-bit hash of m's weights (their bits, in order), read to the host in pieces of 16
 * MiB. 0, or -1 out of memory. */
static int weights_hash(const eng_model *m, uint64_t *out)
{
    const size_t piece = (size_t)1 << 22;
    size_t cap = m->n_params < piece ? m->n_params : piece;
    uint32_t *buf = malloc((cap ? cap : 1) * sizeof *buf);
    if (!buf)
        return -1;
    uint64_t h = 1469598103934665603ull;
    for (size_t off = 0; off < m->n_params; off += cap) {
        size_t k = m->n_params - off < cap ? m->n_params - off : cap;
        m->be->to_host(m->be, buf, m->params + off, k * sizeof *buf);
        for (size_t i = 0; i < k; i++)
            h = (h ^ buf[i]) * 1099511628211ull;
    }
    free(buf);
    *out = h;
    return 0;
}

/* What the run reads, besides its options: the train and validation token streams (their
 * lengths and hashes), the teacher (its size and weights) and the student it starts from
 * (its weights). A checkpoint written for other text (a data file edited or replaced
 * before the resume), another teacher (the parent's file replaced by another of its
 * shape) or another starting student (the stages before it run again on changed input)
 * is another run's. */
static json_t *data_fingerprint(const td_stream *train, const td_stream *val, const eng_model *teacher,
                                const eng_model *student)
{
    char th[32], vh[32], wt[32], ws[32];
    uint64_t ht, hs;
    if (weights_hash(teacher, &ht) || weights_hash(student, &hs))
        return NULL;
    snprintf(th, sizeof th, "%016llx", (unsigned long long)td_ids_hash(train->ids, train->n));
    snprintf(vh, sizeof vh, "%016llx", (unsigned long long)(val ? td_ids_hash(val->ids, val->n) : 0));
    snprintf(wt, sizeof wt, "%016llx", (unsigned long long)ht);
    snprintf(ws, sizeof ws, "%016llx", (unsigned long long)hs);
    return json_pack("{s:I,s:s,s:I,s:s,s:I,s:s,s:s}", "train_tokens", (json_int_t)train->n, "train_hash", th,
                     "val_tokens", (json_int_t)(val ? val->n : 0), "val_hash", vh, "teacher_params",
                     (json_int_t)teacher->n_params, "teacher_weights", wt, "student_start", ws);
}

/* Whether a checkpoint's record of what its run read (rec) fits this run's (cur): every
 * item it holds is the same here. A record from before an item was kept lacks it. */
static int data_fits(const json_t *rec, const json_t *cur)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)rec, k, v)
        if (!json_equal(v, json_object_get(cur, k)))
            return 0;
    return 1;
}

static int save_checkpoint(const distill_opts *o, eng_model *student, eng_adamw *opt, const run_state *rs,
                           char *err, size_t errlen)
{
    char tmp[4096], fin[4096], path[4300];
    if (step_dir(tmp, sizeof tmp, o->ckpt_dir, rs->step, ".tmp") || step_dir(fin, sizeof fin, o->ckpt_dir, rs->step, "")) {
        snprintf(err, errlen, "checkpoint path too long");
        return -1;
    }
    (void)fio_remove_tree(tmp);
    (void)fio_remove_tree(fin);
    if (fio_mkdirs(tmp)) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    int rc = -1;
    float *mv = NULL;
    json_t *state = NULL, *curve = NULL;
    char *text = NULL;
    if (ckpt_save(student, tmp, err, errlen))
        goto out;
    mv = malloc(2 * student->n_params * sizeof *mv);
    if (!mv || eng_adamw_state(opt, mv, mv + student->n_params)) {
        snprintf(err, errlen, "optimizer state export failed");
        goto out;
    }
    st_write_tensor ov[2] = {{.name = "m", .data = mv, .ndim = 1, .shape = {(int64_t)student->n_params}},
                             {.name = "v", .data = mv + student->n_params, .ndim = 1,
                              .shape = {(int64_t)student->n_params}}};
    snprintf(path, sizeof path, "%s/optim.safetensors", tmp);
    if (st_write(path, ov, 2, ST_F32, NULL, err, errlen))
        goto out;
    curve = json_array();
    for (int64_t i = 0; curve && i < rs->step; i++)
        json_array_append_new(curve, json_real(rs->curve[i]));
    char rng_hex[32], cur_hex[32];
    snprintf(rng_hex, sizeof rng_hex, "%016llx", (unsigned long long)rs->rng);
    snprintf(cur_hex, sizeof cur_hex, "%llu", (unsigned long long)rs->cursor);
    state = json_pack("{s:i,s:I,s:I,s:s,s:s,s:I,s:o*,s:o*,s:O*}", "version", 1, "step", (json_int_t)rs->step,
                      "tokens", (json_int_t)rs->tokens, "cursor", cur_hex, "rng", rng_hex, "adam_t",
                      (json_int_t)eng_adamw_t(opt), "loss_curve", curve, "options", opts_fingerprint(o, student),
                      "data", rs->data);
    curve = NULL;
    if (state && isfinite(rs->last_val) && json_object_set_new(state, "val_loss", json_real(rs->last_val)))
        json_decref(state), state = NULL;
    text = state ? json_dumps(state, JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) : NULL;
    if (!text) {
        snprintf(err, errlen, "out of memory rendering checkpoint state");
        goto out;
    }
    snprintf(path, sizeof path, "%s/state.json", tmp);
    if (fio_write_atomic(path, text, strlen(text), err, errlen))
        goto out;
    if (rename(tmp, fin)) {
        snprintf(err, errlen, "%s: rename: %s", fin, strerror(errno));
        goto out;
    }
    (void)fio_fsync_dir(o->ckpt_dir);   /* best effort */
    snprintf(path, sizeof path, "%s/DONE", fin);
    if (fio_write_atomic(path, "done\n", 5, err, errlen))
        goto out;
    rc = 0;
    /* drop old checkpoints beyond keep_ckpts */
    int n;
    int64_t *steps = list_checkpoints(o->ckpt_dir, &n, 0);
    int keep = o->keep_ckpts > 0 ? o->keep_ckpts : 1;
    for (int i = 0; i + keep < n; i++) {
        char old[4096];
        if (!step_dir(old, sizeof old, o->ckpt_dir, steps[i], ""))
            (void)fio_remove_tree(old);
    }
    free(steps);
out:
    if (rc)
        (void)fio_remove_tree(tmp);
    free(mv);
    free(text);
    json_decref(curve);
    json_decref(state);
    return rc;
}

static int load_checkpoint(const distill_opts *o, int64_t step, eng_model *student, eng_adamw *opt,
                           run_state *rs, int64_t max_steps, size_t train_n, char *err, size_t errlen)
{
    char dir[4096];
    json_t *state = load_state(o->ckpt_dir, step, dir, err, errlen);
    if (!state)
        return -1;
    int rc = -1;
    st_file so = {0};
    int so_open = 0;
    float *buf = NULL;
    json_t *fp = opts_fingerprint(o, student), *data = json_object_get(state, "data");
    if (!fp || !json_equal(fp, json_object_get(state, "options"))) {
        snprintf(err, errlen, "%s: written with other distillation options or another student shape; "
                 "use a fresh checkpoint folder", dir);
        rc = fp ? -2 : -1;
        goto out;
    }
    if (data && !data_fits(data, rs->data)) {   /* checkpoints before the record have none */
        snprintf(err, errlen, "%s: written for other text, another teacher or another starting student (the data "
                 "file, the parent or the pruned student changed since); use a fresh checkpoint folder", dir);
        rc = -2;
        goto out;
    }
    rs->step = json_integer_value(json_object_get(state, "step"));
    rs->tokens = json_integer_value(json_object_get(state, "tokens"));
    const char *cur = json_string_value(json_object_get(state, "cursor"));
    const char *rng = json_string_value(json_object_get(state, "rng"));
    json_t *curve = json_object_get(state, "loss_curve"), *vl = json_object_get(state, "val_loss");
    int64_t per_step = (int64_t)o->B * o->T * o->accum;
    char *cur_end = NULL, *rng_end = NULL;
    errno = 0;
    if (cur)
        rs->cursor = strtoull(cur, &cur_end, 10);
    if (rng)
        rs->rng = strtoull(rng, &rng_end, 16);
    if (rs->step != step || rs->step > max_steps || !cur || !rng || !*cur || *cur_end || !*rng || *rng_end ||
        errno || rs->cursor >= train_n || !json_is_array(curve) || (int64_t)json_array_size(curve) != step ||
        rs->tokens != (step * per_step < o->tokens ? step * per_step : o->tokens) ||
        json_integer_value(json_object_get(state, "adam_t")) != step) {
        snprintf(err, errlen, "%s/state.json: inconsistent checkpoint state", dir);
        goto out;
    }
    rs->last_val = json_is_number(vl) ? json_number_value(vl) : NAN;
    for (int64_t i = 0; i < step; i++)
        rs->curve[i] = json_number_value(json_array_get(curve, (size_t)i));
    int lw = ckpt_load_into(dir, student, err, errlen);
    if (lw) {
        rc = lw;   /* -2: another student shape, refused before anything was read */
        goto out;
    }
    char path[4300];
    snprintf(path, sizeof path, "%s/optim.safetensors", dir);
    if (st_open(&so, path, err, errlen))
        goto out;
    so_open = 1;
    int km = st_find(&so, "m"), kv = st_find(&so, "v");
    int64_t np = (int64_t)student->n_params;
    if (km < 0 || kv < 0 || so.t[km].numel != np || so.t[kv].numel != np) {
        snprintf(err, errlen, "%s: optimizer state does not match the student", path);
        goto out;
    }
    free(buf);
    buf = malloc(2 * student->n_params * sizeof *buf);
    if (!buf) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    if (st_read_f32(&so, km, buf, np, err, errlen) || st_read_f32(&so, kv, buf + np, np, err, errlen))
        goto out;
    if (eng_adamw_restore(opt, json_integer_value(json_object_get(state, "adam_t")), buf, buf + np)) {
        snprintf(err, errlen, "%s: optimizer restore failed", path);
        goto out;
    }
    rc = 0;
out:
    if (so_open)
        st_close(&so);
    free(buf);
    json_decref(fp);
    json_decref(state);
    return rc;
}

/* ---- the loop ---------------------------------------------------------------------- */

/* One step's loss sums over its micro-batches (all ranks' once reduced) and their count. */
typedef struct {
    double loss, kd, ce, hidden;
    int n;
} step_stats;

/* Sum the step's gradients and loss sums over the ranks. */
static int reduce_step(eng_coll *c, eng_model *student, step_stats *st, char *err, size_t errlen)
{
    float sums[4] = {(float)st->loss, (float)st->kd, (float)st->ce, (float)st->hidden};
    if (c->allreduce_sum(c, student->be, student->grads, student->n_params, err, errlen) ||
        c->allreduce_sum(c, NULL, sums, 4, err, errlen))
        return -1;
    st->loss = sums[0], st->kd = sums[1], st->ce = sums[2], st->hidden = sums[3];
    return 0;
}

/* Rank 0's stop decision, seen by every rank. */
static int share_stop(eng_coll *c, int *stop, char *err, size_t errlen)
{
    float f = c->rank == 0 && *stop ? 1.0f : 0.0f;
    if (c->allreduce_sum(c, NULL, &f, 1, err, errlen))
        return -1;
    *stop = f != 0.0f;
    return 0;
}

/* One step's micro-batches: full B x T, then r/T rows of T, then one row of the rest.
 * With ranks, micro-batch i runs on rank i mod size (every rank reads every batch, so
 * the data cursor moves the same everywhere); the gradients and loss sums are then
 * summed over the ranks, so the step sees the same global batch as one process. */
static int step_micro_batches(eng_model *student, const td_stream *train, const distill_opts *o,
                              const eng_loss_spec *ls, run_state *rs, int64_t step_tokens, int *tok, int *tgt,
                              step_stats *st, char *err, size_t errlen)
{
    int rank = o->coll ? o->coll->rank : 0, size = o->coll ? o->coll->size : 1;
    memset(st, 0, sizeof *st);
    for (int64_t done_tok = 0; done_tok < step_tokens; st->n++) {
        int64_t r = step_tokens - done_tok;
        int b = 1, t = (int)(r < o->T ? r : o->T);
        if (r >= (int64_t)o->B * o->T)
            b = o->B;
        else if (r >= o->T)
            b = (int)(r / o->T);
        if (td_batch(train, &rs->cursor, b, t, tok, tgt)) {
            snprintf(err, errlen, "training batch failed");
            return -1;
        }
        done_tok += (int64_t)b * t;
        if (st->n % size != rank)
            continue;
        eng_loss_result lr;
        if (eng_forward_backward(student, tok, b, t, ls, ENG_GRAD_WEIGHTS, &lr, err, errlen))
            return -1;
        st->loss += lr.loss;
        st->kd += lr.kd;
        st->ce += lr.ce;
        st->hidden += lr.hidden;
    }
    return size > 1 ? reduce_step(o->coll, student, st, err, errlen) : 0;
}

/* Rank 0 after step rs->step of steps: validation when due (a loss that is not finite
 * fails the run: never checkpointed, never delivered), the checkpoint when due, then the
 * progress callback, whose answer goes to *stop. 0, or -1 with err. */
static int step_end(const distill_opts *o, eng_model *student, eng_adamw *opt, const td_stream *val, run_state *rs,
                    int64_t steps, distill_progress *p, int *stop, char *err, size_t errlen)
{
    if (val && val->n > (size_t)o->T && ((o->eval_every > 0 && rs->step % o->eval_every == 0) || rs->step == steps)) {
        if (distill_eval_loss(student, val, o->B, o->T, o->val_tokens, &rs->last_val, err, errlen))
            return -1;
        if (!isfinite(rs->last_val)) {
            snprintf(err, errlen, "distillation diverged: the validation loss is %s at step %lld of %lld",
                     isnan(rs->last_val) ? "NaN" : "infinite", (long long)rs->step, (long long)steps);
            return -1;
        }
        p->has_val = 1;
        p->val_loss = rs->last_val;
    }
    if (o->ckpt_dir && o->ckpt_every > 0 && (rs->step % o->ckpt_every == 0 || rs->step == steps)) {
        if (save_checkpoint(o, student, opt, rs, err, errlen))
            return -1;
        p->checkpointed = 1;
    }
    *stop = o->progress ? o->progress(o->progress_ctx, p) : 0;
    return 0;
}

int distill_run(eng_model *teacher, eng_model *student, const td_stream *train, const td_stream *val,
                const distill_opts *o, distill_result *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (o->tokens <= 0 || o->B <= 0 || o->T <= 0 || o->accum <= 0) {
        snprintf(err, errlen, "distillation needs tokens, B, T and accum > 0");
        return -1;
    }
    if (train->n < (size_t)o->T + 1) {
        snprintf(err, errlen, "training stream has %zu tokens, fewer than T+1 = %d", train->n, o->T + 1);
        return -1;
    }
    if (teacher->a.vocab_size != student->a.vocab_size) {
        snprintf(err, errlen, "teacher vocab %d differs from the student's %d", teacher->a.vocab_size,
                 student->a.vocab_size);
        return -1;
    }
    int rank = o->coll ? o->coll->rank : 0;
    int64_t steps = distill_steps(o->tokens, o->B, o->T, o->accum);
    int64_t per_step = (int64_t)o->B * o->T * o->accum;
    run_state rs = {.rng = o->seed ? o->seed : 1, .last_val = NAN};
    /* what the run reads, for its checkpoints (a run without them, a search trial's, skips
       hashing the weights) */
    json_t *data = o->ckpt_dir ? data_fingerprint(train, val, teacher, student) : json_object();
    rs.data = data;
    /* the seed picks where in the text the first batch starts; the batches then run on in
       order, wrapping (td_batch): two seeds distil on differently ordered text, one seed
       twice on the same (a resumed run takes the cursor from its checkpoint) */
    rs.cursor = eng_xorshift64(&rs.rng) % (uint64_t)(train->n - (size_t)o->T);
    rs.curve = calloc((size_t)steps + 1, sizeof *rs.curve);
    int *tok = malloc((size_t)o->B * o->T * sizeof *tok), *tgt = malloc((size_t)o->B * o->T * sizeof *tgt);
    eng_adamw *opt = NULL;
    int rc = -1;
    if (!data || !rs.curve || !tok || !tgt || eng_model_enable_grads(student) || !(opt = eng_adamw_new(student))) {
        snprintf(err, errlen, "out of memory setting up distillation");
        goto done;
    }
    if (o->ckpt_dir) {
        if (fio_mkdirs(o->ckpt_dir)) {
            snprintf(err, errlen, "%s: %s", o->ckpt_dir, strerror(errno));
            goto done;
        }
        int n;
        int64_t *have = list_checkpoints(o->ckpt_dir, &n, rank == 0);   /* one rank cleans */
        int64_t last = n > 0 ? have[n - 1] : 0;
        free(have);
        if (last > 0) {
            int lc = load_checkpoint(o, last, student, opt, &rs, steps, train->n, err, errlen);
            if (lc) {
                out->checkpoint_refused = lc == -2;
                goto done;
            }
            out->resumed_from = last;
        }
    }
    eng_loss_spec ls = {.kind = o->kd_weight >= 1.0f ? ENG_LOSS_KD : (ENG_LOSS_KD | ENG_LOSS_CE),
                        .targets = tgt,
                        .teacher = teacher,
                        .temperature = o->temperature,
                        .kd_weight = o->kd_weight,
                        .hidden_weight = o->hidden_weight};
    if (o->kd_weight <= 0.0f)
        ls.kind = ENG_LOSS_CE;
    /* the teacher is only read: a 16-bit backend rounds its weights once for the run */
    eng_model_const(teacher, 1);
    double t0 = eng_wall_s();
    int64_t tokens0 = rs.tokens;
    while (rs.step < steps) {
        int64_t left = o->tokens - rs.tokens;
        int64_t step_tokens = left < per_step ? left : per_step;
        step_stats stats;
        eng_model_zero_grads(student);
        /* the student's weights hold still until the optimizer step */
        eng_model_const(student, 1);
        int mb = step_micro_batches(student, train, o, &ls, &rs, step_tokens, tok, tgt, &stats, err, errlen);
        eng_model_const(student, 0);
        if (mb)
            goto done;
        double lrate = distill_lr(o, rs.step, steps);
        /* a gradient that is not finite is not applied (eng_adamw_step): the step fails */
        double gnorm = eng_adamw_step(opt, (float)lrate, o->beta1, o->beta2, o->eps, o->weight_decay, o->clip,
                                      1.0f / (float)stats.n);
        if (!isfinite(stats.loss) || !isfinite(stats.hidden) || !isfinite(gnorm)) {
            /* every rank sees the same reduced loss and gradient, and stops alike */
            double bad = !isfinite(stats.loss) ? stats.loss : !isfinite(stats.hidden) ? stats.hidden : gnorm;
            snprintf(err, errlen, "distillation diverged: the %s is %s at step %lld of %lld (learning rate %.3g); "
                     "lower the learning rate", !isfinite(stats.loss) ? "loss" : !isfinite(stats.hidden)
                     ? "intermediate-state loss" : "gradient norm", isnan(bad) ? "NaN" : "infinite",
                     (long long)rs.step + 1, (long long)steps, lrate);
            goto done;
        }
        rs.tokens += step_tokens;
        rs.curve[rs.step] = stats.loss / stats.n;
        rs.step++;
        distill_progress p = {.step = rs.step, .steps = steps, .tokens = rs.tokens, .total_tokens = o->tokens,
                              .loss = stats.loss / stats.n, .kd = stats.kd / stats.n, .ce = stats.ce / stats.n,
                              .hidden = stats.hidden / stats.n,
                              .lr = lrate, .grad_norm = gnorm};
        double el = eng_wall_s() - t0;
        p.tokens_per_s = el > 0 ? (double)(rs.tokens - tokens0) / el : 0;
        p.eta_s = p.tokens_per_s > 0 ? (double)(o->tokens - rs.tokens) / p.tokens_per_s : 0;
        /* rank 0 validates, checkpoints and reports (the ranks' weights are the same) */
        int stop = 0;
        if (rank == 0 && step_end(o, student, opt, val, &rs, steps, &p, &stop, err, errlen))
            goto done;
        int save_on_stop = stop == DISTILL_STOP_SAVE;   /* rank 0's: it saves */
        if (o->coll && o->coll->size > 1 && share_stop(o->coll, &stop, err, errlen))
            goto done;
        if ((stop || (o->stop_after > 0 && rs.step >= o->stop_after)) && rs.step < steps) {
            /* asked to stop for a shutdown: the run goes on from here, not from the last
               periodic checkpoint (up to a tenth of the run back); a cancel, and stop_after
               (which stands for a kill), save nothing */
            if (stop && save_on_stop && rank == 0 && o->ckpt_dir && o->ckpt_every > 0 && rs.step % o->ckpt_every != 0 &&
                save_checkpoint(o, student, opt, &rs, err, errlen))
                goto done;
            rc = 1;
            break;
        }
    }
    if (rc != 1)
        rc = 0;
    out->steps = rs.step;
    out->tokens = rs.tokens;
    out->tokens_run = rs.tokens - tokens0;
    out->final_loss = rs.step > 0 ? rs.curve[rs.step - 1] : NAN;
    out->final_val_loss = rs.last_val;
    out->wall_s = eng_wall_s() - t0;
    out->loss_curve = rs.curve;
    rs.curve = NULL;
done:
    eng_model_const(teacher, 0);
    if (rc < 0 && o->coll && o->coll->size > 1)
        o->coll->abort(o->coll, err);   /* the peers fail at their next collective instead of waiting */
    free(rs.curve);
    free(tok);
    free(tgt);
    json_decref(data);
    if (opt)
        eng_adamw_free(opt);
    return rc;
}
