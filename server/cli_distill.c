/* server/cli_distill.c — `autocompress distill --parent MODEL --student DIR --data FILE
 * --tokens N`: logit distillation of a pruned student (a directory written by
 * `autocompress prune`, or any loadable model) from its parent on packed text, with
 * checkpoints under DIR/checkpoints that a rerun of the same command resumes from. The
 * result goes to DIR/distilled (or --out) as a pruned model directory; a JSON summary
 * (parent, pruned-only and distilled validation loss, tokens, tokens/s) on stdout;
 * progress on stderr (server/progress.h: a bar on a terminal, plain lines elsewhere).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "compress/distill.h"
#include "compress/prune.h"
#include "compress/textdata.h"
#include "engine/backend.h"
#include "engine/tokenizer.h"
#include "server/cli.h"
#include "server/cli_args.h"
#include "server/progress.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: autocompress distill --parent MODEL --student DIR --data FILE --tokens N [options]\n\n"
            "Distills the student from the parent (KL at a temperature, optionally mixed with CE) on\n"
            "FILE (.txt/.raw paragraphs, c4 .jsonl, TinyStories). Rerunning the same command resumes\n"
            "from the newest checkpoint.\n"
            "  --out DIR2           where the distilled model goes (default DIR/distilled)\n"
            "  --ckpt-dir D         checkpoints (default DIR/checkpoints); --ckpt-every N (default 50)\n"
            "  --batch B --seq T --accum A   micro-batch, sequence length, accumulation (4 x 128 x 1)\n"
            "  --lr X --lr-min X --warmup N  schedule (1e-3 -> 1e-4, 10 warm-up steps)\n"
            "  --weight-decay X --clip X     AdamW weight decay (0.01), gradient clip (1.0)\n"
            "  --temperature X --kd-weight X KD temperature (1), KD share of the loss (1 = pure KD)\n"
            "  --eval-every N --val-tokens N validation (every 50 steps, 4096 tokens)\n"
            "  --val-fraction X              share of documents held out (default 0.1)\n"
            "  --seed N --threads N --tokenizer PATH\n"
            "  --max-steps N                 stop after step N (exit 0, \"complete\": false; rerun resumes)\n");
}

static int parse_f(const char *s, double *v)
{
    char *end;
    double x = strtod(s, &end);
    if (end == s || *end || !isfinite(x) || x < 0)
        return -1;
    *v = x;
    return 0;
}

typedef struct {
    const distill_opts *o;
    progress_bar *pb;
} distill_display;

/* Tokens as the progress, the step's numbers as its text; validation and checkpoints as
 * log lines. */
static int on_progress(void *ctx, const distill_progress *p)
{
    const distill_display *d = ctx;
    char parts[64] = "", extra[200];
    if (d->o->kd_weight > 0 && d->o->kd_weight < 1)
        snprintf(parts, sizeof parts, " (kd %.4f ce %.4f)", p->kd, p->ce);
    snprintf(extra, sizeof extra, "step %lld/%lld loss %.4f%s lr %.2e |g| %.3f", (long long)p->step,
             (long long)p->steps, p->loss, parts, p->lr, p->grad_norm);
    pb_update(d->pb, "distill", p->tokens, p->total_tokens, "tok", extra);
    if (p->has_val)
        pb_notef(d->pb, "distill: step %lld validation loss %.4f%s", (long long)p->step, p->val_loss,
                 p->checkpointed ? " [checkpoint]" : "");
    else if (p->checkpointed)
        pb_notef(d->pb, "distill: step %lld loss %.4f [checkpoint]", (long long)p->step, p->loss);
    return 0;
}

int cli_distill(int argc, char **argv)
{
    const char *parent_path = NULL, *student_path = NULL, *data = NULL, *out = NULL, *ckdir = NULL, *tokp = NULL;
    int64_t tokens = 0, threads = 0, max_steps = 0, seed = 1234;
    distill_opts o;
    distill_opts_defaults(&o);
    int64_t B = o.B, T = o.T, accum = o.accum, warmup = o.warmup_steps, eval_every = o.eval_every,
            val_tokens = o.val_tokens, ckpt_every = o.ckpt_every;
    double lr = o.lr, lr_min = o.lr_min, wd = o.weight_decay, clip = o.clip, temp = o.temperature,
           kdw = o.kd_weight, val_frac = 0.1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *num = NULL;
        double *fl = NULL;
        const char **str = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--parent")) str = &parent_path;
        else if (!strcmp(a, "--student")) str = &student_path;
        else if (!strcmp(a, "--data")) str = &data;
        else if (!strcmp(a, "--out")) str = &out;
        else if (!strcmp(a, "--ckpt-dir")) str = &ckdir;
        else if (!strcmp(a, "--tokenizer")) str = &tokp;
        else if (!strcmp(a, "--tokens")) num = &tokens;
        else if (!strcmp(a, "--batch")) num = &B;
        else if (!strcmp(a, "--seq")) num = &T;
        else if (!strcmp(a, "--accum")) num = &accum;
        else if (!strcmp(a, "--warmup")) num = &warmup;
        else if (!strcmp(a, "--eval-every")) num = &eval_every;
        else if (!strcmp(a, "--val-tokens")) num = &val_tokens;
        else if (!strcmp(a, "--ckpt-every")) num = &ckpt_every;
        else if (!strcmp(a, "--threads")) num = &threads;
        else if (!strcmp(a, "--seed")) num = &seed;
        else if (!strcmp(a, "--max-steps")) num = &max_steps;
        else if (!strcmp(a, "--lr")) fl = &lr;
        else if (!strcmp(a, "--lr-min")) fl = &lr_min;
        else if (!strcmp(a, "--weight-decay")) fl = &wd;
        else if (!strcmp(a, "--clip")) fl = &clip;
        else if (!strcmp(a, "--temperature")) fl = &temp;
        else if (!strcmp(a, "--kd-weight")) fl = &kdw;
        else if (!strcmp(a, "--val-fraction")) fl = &val_frac;
        else {
            fprintf(stderr, "distill: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "distill: %s needs a value\n", a);
            return 2;
        }
        if (str)
            *str = v;
        if (num && cli_parse_i64(v, num)) {
            fprintf(stderr, "distill: %s: '%s' is not a non-negative integer\n", a, v);
            return 2;
        }
        if (fl && parse_f(v, fl)) {
            fprintf(stderr, "distill: %s: '%s' is not a non-negative number\n", a, v);
            return 2;
        }
        i++;
    }
    if (!parent_path || !student_path || !data || tokens <= 0) {
        usage(stderr);
        return 2;
    }
    if (B < 1 || T < 2 || accum < 1 || B > 4096 || T > 1 << 20 || accum > 1 << 20 || threads > 1024 ||
        kdw > 1 || !(temp > 0) || val_frac >= 1) {
        fprintf(stderr, "distill: an option is out of range (batch, seq, accum >= 1; 0 <= kd-weight <= 1; "
                        "temperature > 0; val-fraction < 1)\n");
        return 2;
    }
    o.tokens = tokens;
    o.B = (int)B;
    o.T = (int)T;
    o.accum = (int)accum;
    o.lr = (float)lr;
    o.lr_min = (float)lr_min;
    o.warmup_steps = warmup;
    o.weight_decay = (float)wd;
    o.clip = (float)clip;
    o.temperature = (float)temp;
    o.kd_weight = (float)kdw;
    o.eval_every = (int)eval_every;
    o.val_tokens = val_tokens;
    o.ckpt_every = (int)ckpt_every;
    o.seed = (uint64_t)seed;
    o.stop_after = max_steps;
    distill_display disp = {&o, NULL};
    o.progress = on_progress;
    o.progress_ctx = &disp;
    char ck[4096], outp[4096], err[1024];
    if (!ckdir) {
        snprintf(ck, sizeof ck, "%s/checkpoints", student_path);
        ckdir = ck;
    }
    if (!out) {
        snprintf(outp, sizeof outp, "%s/distilled", student_path);
        out = outp;
    }
    o.ckpt_dir = o.ckpt_every > 0 ? ckdir : NULL;

    int status = 1;
    eng_backend *be = eng_backend_cpu_new((int)threads);
    eng_model parent = {0}, student = {0};
    int have_p = 0, have_s = 0;
    tok_tokenizer *tok = NULL;
    td_docs docs = {0};
    td_stream train = {0}, val = {0};
    distill_result res = {0};
    json_t *man = NULL, *summary = NULL;
    if (!be) {
        fprintf(stderr, "distill: cannot create the CPU backend\n");
        goto done;
    }
    if (prune_load_model(parent_path, tokp, be, &parent, &tok, err, sizeof err)) {
        fprintf(stderr, "distill: parent %s: %s\n", parent_path, err);
        goto done;
    }
    have_p = 1;
    if (prune_load_model(student_path, NULL, be, &student, NULL, err, sizeof err)) {
        fprintf(stderr, "distill: student %s: %s\n", student_path, err);
        goto done;
    }
    have_s = 1;
    if (student.a.vocab_size != parent.a.vocab_size) {
        fprintf(stderr, "distill: student vocab %d differs from the parent's %d\n", student.a.vocab_size,
                parent.a.vocab_size);
        goto done;
    }
    if (td_read_docs(data, TD_FMT_AUTO, &docs, err, sizeof err)) {
        fprintf(stderr, "distill: %s\n", err);
        goto done;
    }
    const tok_config *tc = tok_cfg(tok);
    td_pack_opts po = {.seed = (uint64_t)seed, .val_fraction = val_frac,
                       .sep_token = tc->bos_id >= 0 ? tc->bos_id : tc->eos_id};
    if (td_pack(&docs, td_encode_tok, tok, &po, &train, &val, err, sizeof err)) {
        fprintf(stderr, "distill: %s: %s\n", data, err);
        goto done;
    }
    fprintf(stderr, "distill: %s: %zu documents, %zu training and %zu validation tokens; budget %lld tokens "
                    "(%.2f epochs)\n",
            data, docs.n, train.n, val.n, (long long)tokens, (double)tokens / (double)(train.n ? train.n : 1));
    int has_val = val.n > (size_t)T;
    double vp = NAN, vs0 = NAN;
    if (has_val && (distill_eval_loss(&parent, &val, o.B, o.T, o.val_tokens, &vp, err, sizeof err) ||
                    distill_eval_loss(&student, &val, o.B, o.T, o.val_tokens, &vs0, err, sizeof err))) {
        fprintf(stderr, "distill: validation: %s\n", err);
        goto done;
    }
    if (has_val)
        fprintf(stderr, "distill: validation loss parent %.4f, student before distillation %.4f\n", vp, vs0);
    disp.pb = pb_open(stderr, PB_AUTO);
    int rc = distill_run(&parent, &student, &train, has_val ? &val : NULL, &o, &res, err, sizeof err);
    pb_end_stage(disp.pb, rc < 0 ? "failed" : rc == 1 ? "stopped" : NULL);
    pb_close(disp.pb);
    if (rc < 0) {
        fprintf(stderr, "distill: %s\n", err);
        goto done;
    }
    if (rc == 1) {
        fprintf(stderr, "distill: stopped after step %lld of %lld; rerun the same command to resume from %s\n",
                (long long)res.steps, (long long)distill_steps(tokens, o.B, o.T, o.accum), ckdir);
        summary = json_pack("{s:b,s:I,s:I,s:I,s:s}", "complete", 0, "steps", (json_int_t)res.steps, "tokens",
                            (json_int_t)res.tokens, "budget", (json_int_t)tokens, "checkpoints", ckdir);
        char *t = summary ? json_dumps(summary, JSON_SORT_KEYS) : NULL;
        if (t)
            printf("%s\n", t);
        free(t);
        status = 0;
        goto done;
    }
    double vs1 = NAN;
    if (has_val && distill_eval_loss(&student, &val, o.B, o.T, o.val_tokens, &vs1, err, sizeof err)) {
        fprintf(stderr, "distill: validation: %s\n", err);
        goto done;
    }
    man = json_pack("{s:s,s:s*,s:s,s:I,s:I}", "parent", parent_path, "tokenizer", tokp, "distilled_from",
                    student_path, "distill_tokens", (json_int_t)res.tokens, "distill_steps", (json_int_t)res.steps);
    if (!man || prune_save_dir(&student, out, man, err, sizeof err)) {
        fprintf(stderr, "distill: %s: %s\n", out, man ? err : "out of memory");
        goto done;
    }
    summary = json_pack("{s:b,s:s,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:I}", "complete", 1, "out", out, "tokens",
                        (json_int_t)res.tokens,
                        "budget", (json_int_t)tokens, "steps", (json_int_t)res.steps, "final_loss",
                        isfinite(res.final_loss) ? res.final_loss : -1.0, "val_loss_parent", has_val ? vp : -1.0,
                        "val_loss_pruned", has_val ? vs0 : -1.0, "val_loss_distilled", has_val ? vs1 : -1.0,
                        "wall_s", res.wall_s, "tokens_per_s",
                        res.wall_s > 0 ? (double)res.tokens_run / res.wall_s : 0.0, "resumed_from",
                        (json_int_t)res.resumed_from);
    char *text = summary ? json_dumps(summary, JSON_SORT_KEYS) : NULL;
    if (text)
        printf("%s\n", text);
    free(text);
    status = 0;
done:
    json_decref(summary);
    json_decref(man);
    distill_result_free(&res);
    td_stream_free(&train);
    td_stream_free(&val);
    td_docs_free(&docs);
    if (tok)
        tok_free(tok);
    if (have_s)
        eng_model_free(&student);
    if (have_p)
        eng_model_free(&parent);
    if (be)
        eng_backend_free(be);
    return status;
}
