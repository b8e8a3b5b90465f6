/* server/cli_prune.c — `autocompress prune MODEL --arch ARCH.json --out DIR`: rank the
 * parent on calibration text (or reuse a saved ranking), permute it so every narrower
 * choice is a prefix, slice it to the target arch, reconstruct the slice by least squares
 * on the calibration text (compress/reconstruct.h) and write a pruned model directory
 * (compress/prune.h) with ranking.json beside it. The text, rank and prune steps are the
 * job's (compress/steps.h); this file parses, strings them together and prints a JSON
 * summary on stdout.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jansson.h>

#include "compress/prune.h"
#include "compress/steps.h"
#include "engine/backend.h"
#include "engine/clock.h"
#include "engine/tokenizer.h"
#include "server/cli.h"
#include "server/cli_args.h"
#include "storage/archjson.h"
#include "storage/fileio.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: autocompress prune MODEL --arch ARCH.json --out DIR [options]\n\n"
            "Ranks MODEL's FFN units, attention heads (by KV group), hidden channels and layers on\n"
            "calibration text, permutes it and slices it to ARCH (DESIGN.md §10 JSON). DIR gets\n"
            "model.safetensors, arch.json, ranking.json, prune.json (and config.json when uniform).\n"
            "  --calib FILE         calibration text (.txt/.raw paragraphs, c4 .jsonl, TinyStories)\n"
            "  --calib-tokens N     activation-statistics tokens (default 32768, as jobs)\n"
            "  --layer-tokens N     tokens for the layer-skip losses (default 2048; 0: skip)\n"
            "  --ranking FILE       reuse a saved ranking (then --calib serves reconstruction only)\n"
            "  --recon-tokens N     least-squares reconstruction tokens (default 16384, as jobs)\n"
            "  --no-reconstruct     keep the plain slice (reconstruction needs --calib)\n"
            "  --recon-outputs-only refit o_proj and down_proj only, not q/k/v and gate/up\n"
            "  --compensate-experts an MoE layer that lost experts refits its shared expert's down_proj\n"
            "                       to the parent block's output less the routed experts; without a\n"
            "                       shared expert, each kept expert's down_proj to it less the other\n"
            "                       experts (off by default: docs/pruning.md section 2)\n"
            "  --keep-kv            rank query heads inside fixed KV groups only\n"
            "  --ffn-obs            order FFN units by ZipLM's greedy OBS rule on down_proj's input\n"
            "                       Grams (16384 tokens) instead of their mean activation\n"
            "  --batch B --seq T    calibration forward shape (default 4 x 256)\n"
            "  --tokenizer PATH     tokenizer override for MODEL\n"
            "  --seed N             document order of the calibration text (default 1234)\n"
            "  --threads N          CPU threads (default: all cores)\n");
}

static int on_rank_progress(void *ctx, int64_t done, int64_t total)
{
    (void)ctx;
    if (done == total || done % 16 == 0)
        fprintf(stderr, "prune: ranking forward %lld/%lld\n", (long long)done, (long long)total);
    return 0;
}

static int on_recon_progress(void *ctx, const recon_result *r, int done, int total)
{
    int *shown = ctx;
    if (done > *shown) {
        *shown = done;
        fprintf(stderr, "prune: reconstructed layer %d/%d (%d projections)\n", done, total, r->n);
    }
    return 0;
}

typedef struct {
    const char *model, *arch_path, *out, *calib, *ranking, *tokp;
    rank_opts ro;       /* tokens (--calib-tokens), layer_tokens, B, T, keep_kv */
    recon_opts rc;      /* tokens (--recon-tokens) */
    td_pack_opts po;    /* the document order's seed */
    int threads, reconstruct, recon_shown;
} prune_args;

/* CLI_END with *a filled, or the exit status. */
static int prune_parse(int argc, char **argv, prune_args *a)
{
    static const struct option opts[] = {
        {"arch", required_argument, NULL, 'a'},         {"out", required_argument, NULL, 'o'},
        {"calib", required_argument, NULL, 'c'},        {"ranking", required_argument, NULL, 'r'},
        {"tokenizer", required_argument, NULL, 'k'},    {"calib-tokens", required_argument, NULL, 'n'},
        {"layer-tokens", required_argument, NULL, 'l'}, {"batch", required_argument, NULL, 'b'},
        {"seq", required_argument, NULL, 's'},          {"threads", required_argument, NULL, 'j'},
        {"seed", required_argument, NULL, 'S'},         {"keep-kv", no_argument, NULL, 'K'},
        {"recon-tokens", required_argument, NULL, 'R'}, {"no-reconstruct", no_argument, NULL, 'N'},
        {"recon-outputs-only", no_argument, NULL, 'O'}, {"ffn-obs", no_argument, NULL, 'F'},
        {"compensate-experts", no_argument, NULL, 'E'}, {"help", no_argument, NULL, 'h'},
        {0}};
    memset(a, 0, sizeof *a);
    rank_opts_default(&a->ro);
    a->ro.progress = on_rank_progress;
    recon_opts_default(&a->rc);
    a->rc.progress = on_recon_progress;
    a->rc.progress_ctx = &a->recon_shown;
    a->reconstruct = 1;
    step_text_default(&a->po, NULL);
    cli_parser p;
    int c;
    int64_t seed;
    cli_init(&p, "prune", argc, argv, opts, NULL, usage);
    while ((c = cli_next(&p)) > 0) {
        switch (c) {
        case 'a': a->arch_path = p.arg; break;
        case 'o': a->out = p.arg; break;
        case 'c': a->calib = p.arg; break;
        case 'r': a->ranking = p.arg; break;
        case 'k': a->tokp = p.arg; break;
        case 'n': cli_i64(&p, 1, INT64_MAX, &a->ro.tokens); break;
        case 'l': cli_i64(&p, 0, INT64_MAX, &a->ro.layer_tokens); break;
        case 'b': cli_int(&p, 1, 4096, &a->ro.B); break;
        case 's': cli_int(&p, RANK_MIN_SEQ, 1 << 20, &a->ro.T); break;
        case 'j': cli_int(&p, 0, 1024, &a->threads); break;
        case 'S':
            if (cli_i64(&p, 0, INT64_MAX, &seed) == 0)
                a->po.seed = (uint64_t)seed;
            break;
        case 'K': a->ro.keep_kv = 1; break;
        case 'F': a->ro.ffn_obs = 1; break;
        case 'R': cli_i64(&p, 1, INT64_MAX, &a->rc.tokens); break;
        case 'N': a->reconstruct = 0; break;
        case 'O': a->rc.inputs = 0; break;
        case 'E': a->rc.compensate = 1; break;
        }
    }
    if (c != CLI_END)
        return cli_status(c);
    a->model = cli_operand(&p);
    if (cli_no_more_operands(&p))
        return 2;
    if (!a->model || !a->arch_path || !a->out) {
        usage(stderr);
        return 2;
    }
    if (!a->calib && !a->ranking) {
        fprintf(stderr, "prune: needs calibration text (--calib FILE) or a saved ranking (--ranking FILE)\n");
        return 2;
    }
    return CLI_END;
}

/* The target arch from its JSON file. 0, or -1 after the message. */
static int load_target(const char *path, arch *target)
{
    char err[1024];
    json_error_t je;
    json_t *aj = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!aj) {
        fprintf(stderr, "prune: %s:%d: %s\n", path, je.line, je.text);
        return -1;
    }
    int rc = arch_from_json(aj, target, err, sizeof err);
    json_decref(aj);
    if (rc)
        fprintf(stderr, "prune: %s: %s\n", path, err);
    return rc ? -1 : 0;
}

/* --calib's text as one stream, no validation, documents after BOS (else EOS), as long
 * as ranking and reconstruction read. 0, or -1 after the message. */
static int prune_text(const prune_args *a, const tok_tokenizer *tok, td_stream *cal)
{
    char err[1024];
    const tok_config *tc = tok_cfg(tok);
    int64_t need = a->ranking ? 0 : a->ro.tokens > a->ro.layer_tokens ? a->ro.tokens : a->ro.layer_tokens;
    if (a->reconstruct && a->rc.tokens > need)
        need = a->rc.tokens;
    td_pack_opts po = a->po;
    po.val_fraction = 0;
    po.sep_token = tc->bos_id >= 0 ? tc->bos_id : tc->eos_id;
    po.max_tokens = (size_t)(need + a->ro.T + 1);
    if (step_text(a->calib, tok, &po, cal, NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "prune: %s: %s\n", a->calib, err);
        return -1;
    }
    if (cal->n < (size_t)need + 1)
        fprintf(stderr, "prune: note: %s holds %zu tokens, fewer than the %lld asked; windows repeat\n", a->calib,
                cal->n, (long long)need);
    return 0;
}

/* The ranking: --ranking's, checked against the parent, or the rank step on the text.
 * 0, or -1 after the message. */
static int prune_rank(const prune_args *a, eng_model *parent, const td_stream *cal, rank_result *r)
{
    char err[1024];
    if (a->ranking) {
        if (step_rank_load(a->ranking, parent, r, err, sizeof err)) {
            fprintf(stderr, "prune: ranking %s: %s\n", a->ranking, err);
            return -1;
        }
        return 0;
    }
    int rc = step_rank(parent, cal, &a->ro, r, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "prune: ranking: %s\n", err);
    return rc ? -1 : 0;
}

/* DIR: the pruned model (the prune step, reconstructed on cal unless told not to) with
 * prune.json, and ranking.json. 0, or -1 after the message. */
static int prune_write(const prune_args *a, eng_model *parent, const arch *target, const rank_result *r,
                       const td_stream *cal, recon_result *rr)
{
    char rpath[4096], err[1024];
    if ((size_t)snprintf(rpath, sizeof rpath, "%s/ranking.json", a->out) >= sizeof rpath) {
        fprintf(stderr, "prune: --out path too long\n");
        return -1;
    }
    json_t *man = json_pack("{s:s,s:s*,s:s*,s:s,s:I,s:I,s:I,s:I,s:b}", "parent", a->model, "tokenizer", a->tokp,
                            "calibration", a->calib, "ranking", "ranking.json", "calibration_tokens",
                            (json_int_t)r->tokens, "layer_tokens", (json_int_t)r->layer_tokens, "parent_params",
                            (json_int_t)arch_params(&parent->a), "params", (json_int_t)arch_params(target), "keep_kv",
                            r->keep_kv);
    if (!man)
        snprintf(err, sizeof err, "out of memory");
    const recon_opts *ro = a->reconstruct && cal ? &a->rc : NULL;
    int rc = !man || step_prune(parent, target, a->out, man, cal, ro, rr, err, sizeof err) ||
             rank_save(r, rpath, err, sizeof err);
    json_decref(man);
    if (rc)
        fprintf(stderr, "prune: %s: %s\n", a->out, err);
    return rc ? -1 : 0;
}

static void prune_print(const prune_args *a, const eng_model *parent, const arch *target, const rank_result *r,
                        const recon_result *rr, double rank_s, double wall_s)
{
    char summary[4096];
    arch_summary(target, summary, sizeof summary);
    json_t *res = json_pack("{s:s,s:s,s:I,s:I,s:f,s:I,s:f,s:f}", "out", a->out, "arch", summary, "parent_params",
                            (json_int_t)arch_params(&parent->a), "params", (json_int_t)arch_params(target),
                            "base_loss", r->base_loss, "calibration_tokens", (json_int_t)r->tokens, "rank_s", rank_s,
                            "wall_s", wall_s);
    if (res)
        json_object_set_new(res, "reconstruction", rr ? recon_result_json(rr, &a->rc) : json_false());
    char *text = res ? json_dumps(res, JSON_SORT_KEYS) : NULL;
    if (text)
        printf("%s\n", text);
    free(text);
    json_decref(res);
}

/* --out is written into: a new folder, an empty one, or an earlier prune's output (its
 * files replaced). Never the model's own folder, nor another folder with files in it,
 * which would be mixed with the snapshot (an HF folder's config.json replaced or
 * removed). Checked before any work. 0, or -1 after the message. */
static int check_out(const prune_args *a)
{
    struct stat st;
    if (stat(a->out, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        fprintf(stderr, "prune: --out %s: %s\n", a->out, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "prune: --out %s exists and is not a folder\n", a->out);
        return -1;
    }
    char out[PATH_MAX], model[PATH_MAX], mdir[PATH_MAX], manifest[PATH_MAX + 16];
    if (realpath(a->out, out) && realpath(a->model, model)) {
        fio_dir_of(model, mdir, sizeof mdir);
        if (!strcmp(out, model) || !strcmp(out, mdir)) {
            fprintf(stderr, "prune: --out %s is the folder of the model being pruned: choose another\n", a->out);
            return -1;
        }
    }
    snprintf(manifest, sizeof manifest, "%s/prune.json", a->out);
    if (prune_is_dir(a->out) && fio_is_file(manifest))
        return 0;   /* an earlier prune's output: replaced */
    char **names;
    size_t n;
    if (fio_list_dir(a->out, &names, &n) < 0) {
        fprintf(stderr, "prune: --out %s: %s\n", a->out, strerror(errno));
        return -1;
    }
    fio_names_free(names, n);
    if (n > 0) {
        fprintf(stderr, "prune: --out %s is a folder with other files in it (not an earlier prune's output): "
                        "choose a new or empty folder\n", a->out);
        return -1;
    }
    return 0;
}

int cli_prune(int argc, char **argv)
{
    prune_args a;
    int pr = prune_parse(argc, argv, &a);
    if (pr != CLI_END)
        return pr;
    if (check_out(&a))
        return 2;
    arch target;
    if (load_target(a.arch_path, &target))
        return 1;
    char err[1024];
    int status = 1, have_parent = 0, have_rank = 0, have_recon = 0;
    double t0 = eng_wall_s(), t_rank = 0;
    eng_backend *be = eng_backend_cpu_new(a.threads);
    eng_model parent = {0};
    tok_tokenizer *tok = NULL;
    rank_result r = {0};
    recon_result rr = {0};
    td_stream cal = {0};
    if (!be) {
        fprintf(stderr, "prune: cannot create the CPU backend\n");
        goto done;
    }
    if (prune_load_model(a.model, a.tokp, be, &parent, a.calib ? &tok : NULL, err, sizeof err)) {
        fprintf(stderr, "prune: %s: %s\n", a.model, err);
        goto done;
    }
    have_parent = 1;
    if (prune_check(&parent.a, &target, err, sizeof err)) {
        fprintf(stderr, "prune: %s cannot be cut from %s: %s\n", a.arch_path, a.model, err);
        goto done;
    }
    if (a.calib && prune_text(&a, tok, &cal))
        goto done;
    if (!a.calib && a.reconstruct)
        fprintf(stderr, "prune: note: no calibration text (--calib): the slice is not reconstructed\n");
    t_rank = eng_wall_s();
    if (prune_rank(&a, &parent, &cal, &r))
        goto done;
    have_rank = 1;
    t_rank = eng_wall_s() - t_rank;
    if (rank_apply(&parent, &r, err, sizeof err)) {
        fprintf(stderr, "prune: %s\n", err);
        goto done;
    }
    if (prune_write(&a, &parent, &target, &r, a.calib ? &cal : NULL, &rr))
        goto done;
    have_recon = a.calib && a.reconstruct;
    prune_print(&a, &parent, &target, &r, have_recon ? &rr : NULL, t_rank, eng_wall_s() - t0);
    status = 0;
done:
    if (have_recon)
        recon_result_free(&rr);
    if (have_rank)
        rank_free(&r);
    td_stream_free(&cal);
    tok_free(tok);
    if (have_parent)
        eng_model_free(&parent);
    eng_backend_free(be);
    arch_free(&target);
    return status;
}
