/* server/cli_prune.c — `autocompress prune MODEL --arch ARCH.json --out DIR`: rank the
 * parent on calibration text (or reuse a saved ranking), permute it so every narrower
 * choice is a prefix, slice it to the target arch and write a pruned model directory
 * (compress/prune.h) with ranking.json beside it. The job's rank and prune stages run
 * the same compress/ code. Prints a JSON summary on stdout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "compress/prune.h"
#include "compress/rank.h"
#include "compress/textdata.h"
#include "engine/backend.h"
#include "engine/clock.h"
#include "engine/tokenizer.h"
#include "server/cli.h"
#include "server/cli_args.h"
#include "storage/archjson.h"

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
            "  --ranking FILE       reuse a saved ranking instead of --calib\n"
            "  --keep-kv            rank query heads inside fixed KV groups only\n"
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

int cli_prune(int argc, char **argv)
{
    const char *model = NULL, *arch_path = NULL, *out = NULL, *calib = NULL, *ranking = NULL, *tokp = NULL;
    rank_opts rd;
    rank_opts_default(&rd);
    int64_t calib_tokens = rd.tokens, layer_tokens = rd.layer_tokens, B = rd.B, T = rd.T, threads = 0, seed = 1234;
    int keep_kv = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *num = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--keep-kv")) {
            keep_kv = 1;
            continue;
        } else if (a[0] != '-') {
            if (model) {
                fprintf(stderr, "prune: unexpected argument '%s'\n", a);
                return 2;
            }
            model = a;
            continue;
        }
        if (!strcmp(a, "--arch"))
            arch_path = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--calib"))
            calib = v;
        else if (!strcmp(a, "--ranking"))
            ranking = v;
        else if (!strcmp(a, "--tokenizer"))
            tokp = v;
        else if (!strcmp(a, "--calib-tokens"))
            num = &calib_tokens;
        else if (!strcmp(a, "--layer-tokens"))
            num = &layer_tokens;
        else if (!strcmp(a, "--batch"))
            num = &B;
        else if (!strcmp(a, "--seq"))
            num = &T;
        else if (!strcmp(a, "--threads"))
            num = &threads;
        else if (!strcmp(a, "--seed"))
            num = &seed;
        else {
            fprintf(stderr, "prune: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "prune: %s needs a value\n", a);
            return 2;
        }
        if (num && cli_parse_i64(v, num)) {
            fprintf(stderr, "prune: %s: '%s' is not a non-negative integer\n", a, v);
            return 2;
        }
        i++;
    }
    if (!model || !arch_path || !out) {
        usage(stderr);
        return 2;
    }
    if (!calib && !ranking) {
        fprintf(stderr, "prune: needs calibration text (--calib FILE) or a saved ranking (--ranking FILE)\n");
        return 2;
    }
    if (B < 1 || T < 2 || B > 4096 || T > 1 << 20 || calib_tokens < 1 || threads > 1024) {
        fprintf(stderr, "prune: --batch, --seq, --calib-tokens or --threads out of range\n");
        return 2;
    }
    char err[1024];
    arch target;
    json_error_t je;
    json_t *aj = json_load_file(arch_path, JSON_REJECT_DUPLICATES, &je);
    if (!aj) {
        fprintf(stderr, "prune: %s:%d: %s\n", arch_path, je.line, je.text);
        return 1;
    }
    int rc = arch_from_json(aj, &target, err, sizeof err);
    json_decref(aj);
    if (rc) {
        fprintf(stderr, "prune: %s: %s\n", arch_path, err);
        return 1;
    }
    int status = 1;
    double t0 = eng_wall_s();
    eng_backend *be = eng_backend_cpu_new((int)threads);
    eng_model parent = {0}, student = {0};
    int have_parent = 0, have_student = 0;
    tok_tokenizer *tok = NULL;
    rank_result r = {0};
    td_docs docs = {0};
    td_stream cal = {0};
    json_t *man = NULL;
    if (!be) {
        fprintf(stderr, "prune: cannot create the CPU backend\n");
        goto done;
    }
    if (prune_load_model(model, tokp, be, &parent, calib ? &tok : NULL, err, sizeof err)) {
        fprintf(stderr, "prune: %s: %s\n", model, err);
        goto done;
    }
    have_parent = 1;
    if (prune_check(&parent.a, &target, err, sizeof err)) {
        fprintf(stderr, "prune: %s cannot be cut from %s: %s\n", arch_path, model, err);
        goto done;
    }
    double t_rank = eng_wall_s();
    if (ranking) {
        if (rank_load(ranking, &r, err, sizeof err) || rank_check(&r, &parent, err, sizeof err)) {
            fprintf(stderr, "prune: ranking %s: %s\n", ranking, err);
            goto done;
        }
    } else {
        if (td_read_docs(calib, TD_FMT_AUTO, &docs, err, sizeof err)) {
            fprintf(stderr, "prune: %s\n", err);
            goto done;
        }
        const tok_config *tc = tok_cfg(tok);
        int64_t need = calib_tokens > layer_tokens ? calib_tokens : layer_tokens;
        td_pack_opts po = {.seed = (uint64_t)seed, .sep_token = tc->bos_id >= 0 ? tc->bos_id : tc->eos_id,
                           .max_tokens = (size_t)(need + T + 1)};
        if (td_pack(&docs, td_encode_tok, tok, &po, &cal, NULL, err, sizeof err)) {
            fprintf(stderr, "prune: %s: %s\n", calib, err);
            goto done;
        }
        if (cal.n < (size_t)need + 1)
            fprintf(stderr, "prune: note: %s holds %zu tokens, fewer than the %lld asked; windows repeat\n", calib,
                    cal.n, (long long)need);
        rank_opts ro = {.tokens = calib_tokens, .layer_tokens = layer_tokens, .B = (int)B, .T = (int)T,
                        .keep_kv = keep_kv, .progress = on_rank_progress};
        if (rank_opts_fit(&ro, cal.n, err, sizeof err)) {
            fprintf(stderr, "prune: %s: %s\n", calib, err);
            goto done;
        }
        if (rank_compute(&parent, &cal, &ro, &r, err, sizeof err) != 0) {
            fprintf(stderr, "prune: ranking: %s\n", err);
            goto done;
        }
    }
    t_rank = eng_wall_s() - t_rank;
    if (rank_apply(&parent, &r, err, sizeof err) || prune_to_arch(&parent, &target, &student, err, sizeof err)) {
        fprintf(stderr, "prune: %s\n", err);
        goto done;
    }
    have_student = 1;
    char rpath[4096];
    if ((size_t)snprintf(rpath, sizeof rpath, "%s/ranking.json", out) >= sizeof rpath) {
        fprintf(stderr, "prune: --out path too long\n");
        goto done;
    }
    man = json_pack("{s:s,s:s*,s:s*,s:s,s:I,s:I,s:I,s:I,s:b}", "parent", model, "tokenizer", tokp, "calibration",
                    calib, "ranking", "ranking.json", "calibration_tokens", (json_int_t)r.tokens, "layer_tokens",
                    (json_int_t)r.layer_tokens, "parent_params", (json_int_t)arch_params(&parent.a),
                    "params", (json_int_t)arch_params(&target), "keep_kv", r.keep_kv);
    if (!man)
        snprintf(err, sizeof err, "out of memory");
    if (!man || prune_save_dir(&student, out, man, err, sizeof err) || rank_save(&r, rpath, err, sizeof err)) {
        fprintf(stderr, "prune: %s: %s\n", out, err);
        goto done;
    }
    char summary[4096];
    arch_summary(&target, summary, sizeof summary);
    json_t *res = json_pack("{s:s,s:s,s:I,s:I,s:f,s:I,s:f,s:f}", "out", out, "arch", summary, "parent_params",
                            (json_int_t)arch_params(&parent.a), "params", (json_int_t)arch_params(&target),
                            "base_loss", r.base_loss, "calibration_tokens", (json_int_t)r.tokens, "rank_s", t_rank,
                            "wall_s", eng_wall_s() - t0);
    char *text = res ? json_dumps(res, JSON_SORT_KEYS) : NULL;
    if (text)
        printf("%s\n", text);
    free(text);
    json_decref(res);
    status = 0;
done:
    json_decref(man);
    td_stream_free(&cal);
    td_docs_free(&docs);
    rank_free(&r);
    if (tok)
        tok_free(tok);
    if (have_student)
        eng_model_free(&student);
    if (have_parent)
        eng_model_free(&parent);
    if (be)
        eng_backend_free(be);
    arch_free(&target);
    return status;
}
