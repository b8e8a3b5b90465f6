/* server/cli_distill.c — `autocompress distill --parent MODEL --student DIR --data FILE
 * --tokens N`: logit distillation of a pruned student (a directory written by
 * `autocompress prune`, or any loadable model) from its parent on packed text (with
 * --hidden-weight, on the intermediate states too: the parent then takes the order of
 * DIR/ranking.json), with
 * checkpoints under DIR/checkpoints that a rerun of the same command resumes from. The
 * result goes to DIR/distilled (or --out) as a pruned model directory; a JSON summary
 * (parent, pruned-only and distilled validation loss, tokens, tokens/s) on stdout;
 * progress on stderr (server/progress.h: a bar on a terminal, plain lines elsewhere).
 * Packing and the distill step itself are the job's (compress/steps.h).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <jansson.h>

#include "compress/calibrate.h"
#include "compress/prune.h"
#include "compress/rank.h"
#include "compress/steps.h"
#include "engine/backend.h"
#include "engine/collective.h"
#include "engine/devices.h"
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
            "  --lr X --lr-min X --warmup N  schedule (3e-4 -> 3e-5, 10 warm-up steps)\n"
            "  --weight-decay X --clip X     AdamW weight decay (0.01), gradient clip (1.0)\n"
            "  --temperature X --kd-weight X KD temperature (1), KD share of the loss (1 = pure KD)\n"
            "  --hidden-weight X             add the intermediate-state loss (cosine distance of each\n"
            "                                layer's output to its source layer's in the parent, on the\n"
            "                                channels the student kept) at X times the logit loss (0: off);\n"
            "                                needs DIR/ranking.json (written by autocompress prune)\n"
            "  --eval-every N --val-tokens N validation (every 50 steps, 4096 tokens)\n"
            "  --val-fraction X              share of documents held out (default 0.1)\n"
            "  --seed N --threads N --tokenizer PATH\n"
            "  --ranks N                     data parallel: N processes share each step's micro-batches\n"
            "                                (--accum of them), gradients summed; the same result as one\n"
            "                                process; --threads is per rank (default: the cores / N)\n"
            "  --device D                    cpu (default), cuda:N, or cuda with --ranks: rank r on cuda:r,\n"
            "                                gradients summed by NCCL\n"
            "  --max-steps N                 stop after step N (exit 0, \"complete\": false; rerun resumes)\n");
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
    if (d->o->hidden_weight > 0)
        snprintf(parts + strlen(parts), sizeof parts - strlen(parts), " hidden %.4f", p->hidden);
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

typedef struct {
    const char *parent, *student, *data, *out, *ckdir, *tokp;
    distill_opts o;      /* distill_opts_defaults, then the flags */
    double val_fraction;
    int threads, ranks;
    const char *device;  /* "cpu" (default), "cuda" (rank r on cuda:r), "cuda:N" */
    char ck[4096], outp[4096];
} distill_args;

/* One option; the value checks print their own message. */
static void distill_opt(cli_parser *p, int c, distill_args *a)
{
    distill_opts *o = &a->o;
    double v;
    if (c < 128 && strchr("LmdcTkwH", c)) {   /* the real-valued ones */
        if (cli_num(p, 0, HUGE_VAL, &v))
            return;
        switch (c) {
        case 'L': o->lr = (float)v; break;
        case 'm': o->lr_min = (float)v; break;
        case 'd': o->weight_decay = (float)v; break;
        case 'c': o->clip = (float)v; break;
        case 'T': o->temperature = (float)v; break;
        case 'k': o->kd_weight = (float)v; break;
        case 'H': o->hidden_weight = (float)v; break;
        case 'w': a->val_fraction = v; break;
        }
        return;
    }
    switch (c) {
    case 'p': a->parent = p->arg; break;
    case 's': a->student = p->arg; break;
    case 'D': a->data = p->arg; break;
    case 'o': a->out = p->arg; break;
    case 'C': a->ckdir = p->arg; break;
    case 'z': a->tokp = p->arg; break;
    case 'n': cli_i64(p, 0, INT64_MAX, &o->tokens); break;
    case 'b': cli_int(p, 1, 4096, &o->B); break;
    case 'q': cli_int(p, 2, 1 << 20, &o->T); break;
    case 'a': cli_int(p, 1, 1 << 20, &o->accum); break;
    case 'W': cli_i64(p, 0, INT64_MAX, &o->warmup_steps); break;
    case 'e': cli_int(p, 0, INT32_MAX, &o->eval_every); break;
    case 'V': cli_i64(p, 0, INT64_MAX, &o->val_tokens); break;
    case 'E': cli_int(p, 0, INT32_MAX, &o->ckpt_every); break;
    case 'j': cli_int(p, 0, 1024, &a->threads); break;
    case 'R': cli_int(p, 1, 64, &a->ranks); break;
    case 'G': a->device = p->arg; break;
    case 'S': cli_u64(p, &o->seed); break;
    case 'M': cli_i64(p, 0, INT64_MAX, &o->stop_after); break;
    }
}

/* CLI_END with *a filled (paths defaulted), or the exit status. */
static int distill_parse(int argc, char **argv, distill_args *a)
{
    static const struct option opts[] = {
        {"parent", required_argument, NULL, 'p'},       {"student", required_argument, NULL, 's'},
        {"data", required_argument, NULL, 'D'},         {"out", required_argument, NULL, 'o'},
        {"ckpt-dir", required_argument, NULL, 'C'},     {"tokenizer", required_argument, NULL, 'z'},
        {"tokens", required_argument, NULL, 'n'},       {"batch", required_argument, NULL, 'b'},
        {"seq", required_argument, NULL, 'q'},          {"accum", required_argument, NULL, 'a'},
        {"warmup", required_argument, NULL, 'W'},       {"eval-every", required_argument, NULL, 'e'},
        {"val-tokens", required_argument, NULL, 'V'},   {"ckpt-every", required_argument, NULL, 'E'},
        {"threads", required_argument, NULL, 'j'},      {"seed", required_argument, NULL, 'S'},
        {"max-steps", required_argument, NULL, 'M'},    {"lr", required_argument, NULL, 'L'},
        {"lr-min", required_argument, NULL, 'm'},       {"weight-decay", required_argument, NULL, 'd'},
        {"clip", required_argument, NULL, 'c'},         {"temperature", required_argument, NULL, 'T'},
        {"kd-weight", required_argument, NULL, 'k'},    {"val-fraction", required_argument, NULL, 'w'},
        {"ranks", required_argument, NULL, 'R'},        {"device", required_argument, NULL, 'G'},
        {"hidden-weight", required_argument, NULL, 'H'},
        {"help", no_argument, NULL, 'h'},               {0}};
    memset(a, 0, sizeof *a);
    a->ranks = 1;
    a->device = "cpu";
    distill_opts_defaults(&a->o);
    a->val_fraction = 0.1;   /* the command holds out more than a job (step_text_default) */
    cli_parser p;
    int c;
    cli_init(&p, "distill", argc, argv, opts, NULL, usage);
    while ((c = cli_next(&p)) > 0)
        distill_opt(&p, c, a);
    if (c != CLI_END)
        return cli_status(c);
    if (cli_no_more_operands(&p))
        return 2;
    if (!a->parent || !a->student || !a->data || a->o.tokens <= 0) {
        usage(stderr);
        return 2;
    }
    if (a->o.kd_weight > 1 || !(a->o.temperature > 0) || a->val_fraction >= 1 ||
        (a->o.hidden_weight > 0 && a->o.kd_weight <= 0)) {
        fprintf(stderr, "distill: an option is out of range (0 <= kd-weight <= 1; temperature > 0; "
                        "val-fraction < 1; hidden-weight needs kd-weight > 0)\n");
        return 2;
    }
    if (!a->ckdir) {
        snprintf(a->ck, sizeof a->ck, "%s/checkpoints", a->student);
        a->ckdir = a->ck;
    }
    if (!a->out) {
        snprintf(a->outp, sizeof a->outp, "%s/distilled", a->student);
        a->out = a->outp;
    }
    a->o.ckpt_dir = a->o.ckpt_every > 0 ? a->ckdir : NULL;
    return CLI_END;
}

/* The models and the text. */
typedef struct {
    eng_backend *be;
    eng_model parent, student;
    int have_p, have_s;
    tok_tokenizer *tok;
    td_stream train, val;
    eng_coll *dev_coll;  /* a GPU rank's NCCL collective (owned), else NULL */
} distill_inputs;

static void inputs_free(distill_inputs *in)
{
    td_stream_free(&in->train);
    td_stream_free(&in->val);
    tok_free(in->tok);
    if (in->have_s)
        eng_model_free(&in->student);
    if (in->have_p)
        eng_model_free(&in->parent);
    if (in->dev_coll)
        in->dev_coll->free(in->dev_coll);
    eng_backend_free(in->be);
}

/* The intermediate-state loss compares the student's channels with the teacher's first ones:
 * the parent is put in the order the student was cut in (DIR/ranking.json; the same function).
 * A student whose embeddings are not the parent's first channels then (distilled before, or
 * cut from another parent) gets a warning. 0, or -1 after the message. */
static int teacher_ranked(const distill_args *a, distill_inputs *in, int quiet)
{
    char path[4096], err[512];
    rank_result r;
    if ((size_t)snprintf(path, sizeof path, "%s/ranking.json", a->student) >= sizeof path)
        snprintf(err, sizeof err, "%s: path too long", a->student);
    else if (step_rank_load(path, &in->parent, &r, err, sizeof err) == 0)   /* for this parent's shape */
        err[0] = 0;
    if (err[0]) {
        fprintf(stderr, "distill: --hidden-weight needs the ranking the student was cut with: %s\n", err);
        return -1;
    }
    int rc = rank_apply(&in->parent, &r, err, sizeof err);
    rank_free(&r);
    if (rc) {
        fprintf(stderr, "distill: %s: %s\n", path, err);
        return -1;
    }
    const eng_model *s = &in->student, *p = &in->parent;
    int C = s->a.hidden_size, pC = p->a.hidden_size, V = s->a.vocab_size, same = C <= pC, R = 256;
    float *es = same ? malloc(sizeof(float) * (size_t)R * C) : NULL;
    float *ep = same ? malloc(sizeof(float) * (size_t)R * pC) : NULL;
    if (same && (!es || !ep)) {
        free(es);
        free(ep);
        fprintf(stderr, "distill: out of memory\n");
        return -1;
    }
    for (int v0 = 0; same && v0 < V; v0 += R) {   /* R rows of each table at a time */
        int n = V - v0 < R ? V - v0 : R;
        in->be->to_host(in->be, es, s->tok_emb + (size_t)v0 * C, sizeof(float) * (size_t)n * C);
        in->be->to_host(in->be, ep, p->tok_emb + (size_t)v0 * pC, sizeof(float) * (size_t)n * pC);
        for (int v = 0; v < n && same; v++)
            same = !memcmp(es + (size_t)v * C, ep + (size_t)v * pC, sizeof(float) * (size_t)C);
    }
    free(es);
    free(ep);
    if (!same && !quiet)
        fprintf(stderr, "distill: warning: the student's embeddings are not the ranked parent's first %d channels "
                        "(distilled before, or cut from another parent): the intermediate-state loss assumes they "
                        "are\n", C);
    return 0;
}

/* Load parent, tokenizer and student; pack the text. As a rank of the CPU group cpu
 * (NULL: alone), on the rank's device, with the collective for its buffers in a->o.coll.
 * 0, or -1 after the message. */
static int inputs_load(distill_args *a, distill_inputs *in, int quiet, eng_coll *cpu)
{
    char err[1024], dev[32];
    memset(in, 0, sizeof *in);
    if (cpu && !strcmp(a->device, "cuda"))
        snprintf(dev, sizeof dev, "cuda:%d", cpu->rank);   /* one process per GPU */
    else
        snprintf(dev, sizeof dev, "%s", a->device);
    if (!(in->be = cal_backend_new(dev, NULL, a->threads, err, sizeof err))) {
        fprintf(stderr, "distill: %s\n", err);
        return -1;
    }
    if (cpu) {
        in->dev_coll = eng_coll_device_new(cpu, in->be, err, sizeof err);
        if (!in->dev_coll && err[0]) {
            fprintf(stderr, "distill: rank %d: %s\n", cpu->rank, err);
            return -1;
        }
        a->o.coll = in->dev_coll ? in->dev_coll : cpu;
    }
    if (prune_load_model(a->parent, a->tokp, in->be, &in->parent, &in->tok, err, sizeof err)) {
        fprintf(stderr, "distill: parent %s: %s\n", a->parent, err);
        return -1;
    }
    in->have_p = 1;
    if (prune_load_model(a->student, NULL, in->be, &in->student, NULL, err, sizeof err)) {
        fprintf(stderr, "distill: student %s: %s\n", a->student, err);
        return -1;
    }
    in->have_s = 1;
    if (in->student.a.vocab_size != in->parent.a.vocab_size) {
        fprintf(stderr, "distill: student vocab %d differs from the parent's %d\n", in->student.a.vocab_size,
                in->parent.a.vocab_size);
        return -1;
    }
    if (a->o.hidden_weight > 0 && teacher_ranked(a, in, quiet))
        return -1;
    /* documents after BOS (else EOS), the whole text (no cap), --seed's order */
    const tok_config *tc = tok_cfg(in->tok);
    td_pack_opts po;
    size_t n_docs = 0;
    step_text_default(&po, in->tok);
    po.seed = a->o.seed;
    po.val_fraction = a->val_fraction;
    po.sep_token = tc->bos_id >= 0 ? tc->bos_id : tc->eos_id;
    po.max_tokens = 0;
    if (step_text(a->data, in->tok, &po, &in->train, &in->val, &n_docs, err, sizeof err)) {
        fprintf(stderr, "distill: %s: %s\n", a->data, err);
        return -1;
    }
    if (!quiet)
        fprintf(stderr, "distill: %s: %zu documents, %zu training and %zu validation tokens; budget %lld tokens "
                        "(%.2f epochs)\n",
            a->data, n_docs, in->train.n, in->val.n, (long long)a->o.tokens,
            (double)a->o.tokens / (double)(in->train.n ? in->train.n : 1));
    return 0;
}

static void print_json(json_t *j)
{
    char *t = j ? json_dumps(j, JSON_SORT_KEYS) : NULL;
    if (t)
        printf("%s\n", t);
    free(t);
    json_decref(j);
}

/* Rank r (> 0) of a data-parallel run: the same models, text and options, no output of
 * its own (rank 0 reports, checkpoints and writes the result). The exit status. */
static int run_rank(distill_args *a, eng_coll *c)
{
    distill_inputs in;
    distill_result res = {0};
    char err[1024];
    int rc = inputs_load(a, &in, 1, c);
    if (rc == 0) {
        a->o.progress = NULL;
        rc = distill_run(&in.parent, &in.student, &in.train, step_distill_has_val(&in.val, &a->o) ? &in.val : NULL,
                         &a->o, &res, err, sizeof err);
        if (rc < 0)
            fprintf(stderr, "distill: rank %d: %s\n", c->rank, err);
    } else {
        c->abort(c, "could not load its inputs");
    }
    distill_result_free(&res);
    inputs_free(&in);
    return rc < 0 ? 1 : 0;
}

/* Fork ranks 1..N-1 (before this process starts any thread) and join as rank 0. Returns
 * rank 0's handle, or NULL after the message; *kids gets the children's pids. */
static eng_coll *start_ranks(distill_args *a, pid_t *kids, eng_coll_group **gp)
{
    char err[512];
    if (a->threads == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        a->threads = cores > a->ranks ? (int)(cores / a->ranks) : 1;
    }
    eng_coll_group *g = *gp = eng_coll_cpu_group(a->ranks, 0, err, sizeof err);
    if (!g) {
        fprintf(stderr, "distill: %s\n", err);
        return NULL;
    }
    /* rank 0 joins first, so that a rank it cannot start is a reason the ranks already
     * started are given at their first collective (they wait for every rank otherwise) */
    eng_coll *c = eng_coll_cpu_join(g, 0, err, sizeof err);
    if (!c) {
        fprintf(stderr, "distill: %s\n", err);
        return NULL;
    }
    fflush(NULL);
    for (int r = 1; r < a->ranks; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            char why[160];
            snprintf(why, sizeof why, "rank %d could not be started: %s", r, strerror(errno));
            fprintf(stderr, "distill: cannot start rank %d: %s\n", r, strerror(errno));
            c->abort(c, why);
            c->free(c);
            return NULL;
        }
        if (pid == 0) {
            eng_coll *k = eng_coll_cpu_join(g, r, err, sizeof err);
            _exit(k ? run_rank(a, k) : 1);
        }
        kids[r] = pid;
    }
    fprintf(stderr, "distill: %d ranks (processes) of %d threads each\n", a->ranks, a->threads);
    return c;
}

/* Wait for ranks 1..N-1; 0 when each exited 0. */
static int wait_ranks(const distill_args *a, const pid_t *kids, eng_coll *c, int failed)
{
    if (failed && c)
        c->abort(c, "rank 0 failed");
    int bad = 0;
    for (int r = 1; r < a->ranks; r++) {
        int st;
        if (kids[r] <= 0)
            continue;
        if (waitpid(kids[r], &st, 0) != kids[r] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            if (!failed)
                fprintf(stderr, "distill: rank %d failed\n", r);
            bad = 1;
        }
    }
    return bad;
}

int cli_distill(int argc, char **argv)
{
    distill_args a;
    int pr = distill_parse(argc, argv, &a);
    if (pr != CLI_END)
        return pr;
    pid_t kids[64] = {0};
    eng_coll_group *group = NULL;
    eng_coll *coll = NULL;
    if (a.ranks > 1 && !(coll = start_ranks(&a, kids, &group))) {
        wait_ranks(&a, kids, NULL, 1);
        eng_coll_group_release(group);
        return 1;
    }
    distill_display disp = {&a.o, NULL};
    a.o.progress = on_progress;
    a.o.progress_ctx = &disp;
    int status = 1;
    char err[1024];
    distill_inputs in;
    distill_result res = {0};
    if (inputs_load(&a, &in, 0, coll))
        goto done;
    int has_val = step_distill_has_val(&in.val, &a.o);
    double vp = NAN, vs0 = NAN, vs1 = NAN;
    if (has_val && (distill_eval_loss(&in.parent, &in.val, a.o.B, a.o.T, a.o.val_tokens, &vp, err, sizeof err) ||
                    distill_eval_loss(&in.student, &in.val, a.o.B, a.o.T, a.o.val_tokens, &vs0, err, sizeof err))) {
        fprintf(stderr, "distill: validation: %s\n", err);
        goto done;
    }
    if (has_val)
        fprintf(stderr, "distill: validation loss parent %.4f, student before distillation %.4f\n", vp, vs0);
    json_t *man = json_pack("{s:s,s:s*,s:s}", "parent", a.parent, "tokenizer", a.tokp, "distilled_from", a.student);
    if (!man) {
        fprintf(stderr, "distill: out of memory\n");
        goto done;
    }
    disp.pb = pb_open(stderr, PB_AUTO);
    int rc = step_distill(&in.parent, &in.student, &in.train, &in.val, &a.o, a.out, man, &res, err, sizeof err);
    json_decref(man);
    pb_end_stage(disp.pb, rc < 0 ? "failed" : rc == 1 ? "stopped" : NULL);
    pb_close(disp.pb);
    if (rc < 0) {
        fprintf(stderr, "distill: %s\n", err);
        goto done;
    }
    if (rc == 1) {
        fprintf(stderr, "distill: stopped after step %lld of %lld; rerun the same command to resume from %s\n",
                (long long)res.steps, (long long)distill_steps(a.o.tokens, a.o.B, a.o.T, a.o.accum), a.ckdir);
        print_json(json_pack("{s:b,s:I,s:I,s:I,s:s}", "complete", 0, "steps", (json_int_t)res.steps, "tokens",
                             (json_int_t)res.tokens, "budget", (json_int_t)a.o.tokens, "checkpoints", a.ckdir));
        status = 0;
        goto done;
    }
    if (has_val && distill_eval_loss(&in.student, &in.val, a.o.B, a.o.T, a.o.val_tokens, &vs1, err, sizeof err)) {
        fprintf(stderr, "distill: validation: %s\n", err);
        goto done;
    }
    print_json(json_pack("{s:b,s:s,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:f}", "complete", 1, "out", a.out, "tokens",
                         (json_int_t)res.tokens, "budget", (json_int_t)a.o.tokens, "steps", (json_int_t)res.steps,
                         "final_loss", isfinite(res.final_loss) ? res.final_loss : -1.0, "val_loss_parent",
                         has_val ? vp : -1.0, "val_loss_pruned", has_val ? vs0 : -1.0, "val_loss_distilled",
                         has_val ? vs1 : -1.0, "wall_s", res.wall_s, "tokens_per_s",
                         res.wall_s > 0 ? (double)res.tokens_run / res.wall_s : 0.0, "resumed_from",
                         (json_int_t)res.resumed_from, "hidden_weight", (double)a.o.hidden_weight));
    status = 0;
done:
    distill_result_free(&res);
    inputs_free(&in);
    if (a.ranks > 1) {
        if (wait_ranks(&a, kids, coll, status != 0))
            status = 1;
        coll->free(coll);
        eng_coll_group_release(group);
    }
    return status;
}
