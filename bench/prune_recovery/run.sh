#!/bin/bash
# bench/prune_recovery/run.sh — what least-squares reconstruction (compress/reconstruct.h)
# buys after pruning: SmolLM2-135M cut to the 30%-cheaper arch of
# bench/results/smollm2-135m-cpu (hidden 504, 27 layers) and to a uniform arch of half
# its parameters, each as the plain slice and reconstructed; WikiText-2 perplexity
# (llama.cpp's chunk method) and the eight-benchmark average, pruned only and after
# each distillation budget, with the wall time of each step. One ranking (on the
# calibration text, as jobs rank) serves every student. Writes
# bench/results/prune_recovery.md.
#
# Knobs (environment): MODEL, CALIB (ranking and reconstruction text), DATA (distillation
# text), DISTILL (space-separated token budgets, default "32768 262144"), STUDENTS (the
# students distilled at the first budget, default all four), LONG (the students that
# get the budgets above the first one, default "a30-ls a30-slice"), TASKS,
# EVAL_LIMIT (200), PPL_CHUNKS (16), THREADS (all cores), OUT (work folder, kept: a rerun
# reuses what is there), ARCHS (default "a30 a50") and METHODS (default "slice ls lso":
# the pruned-only students made), PRUNED_EVAL (1; 0: pruned-only students get the
# perplexity alone), RES (the table written).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/prune_recovery/smollm2.sh
DATA=${DATA:-$CALIB}
DISTILL=${DISTILL:-32768 262144}
STUDENTS=${STUDENTS:-a30-ls a30-slice a50-ls a50-slice}
LONG=${LONG:-a30-ls a30-slice}
OUT=${OUT:-/tmp/ac-prune-recovery}
RES=${RES:-bench/results/prune_recovery.md}
ARCHS=${ARCHS:-a30 a50}
METHODS=${METHODS:-slice ls lso}
PRUNED_EVAL=${PRUNED_EVAL:-1}
source bench/prune_recovery/steps.sh
prep
score() {   # score NAME MODEL_PATH [ppl]: perplexity and the benchmarks (with "ppl": perplexity only)
    ppl "$1" "$2"
    [ "${3:-}" = ppl ] && return 0
    step "$1.eval" "$BIN" eval "$2" --tasks "$TASKS" --limit "$EVAL_LIMIT" --seed 1234 --threads "$THREADS" \
        --json "$OUT/$1.eval.json"
}

score parent "$MODEL"
# the ranking: once (it comes with a plain slice of the 30% arch, not used further)
step rank "$BIN" prune "$MODEL" --arch "$OUT/a30.json" --out "$OUT/rank" --calib "$CALIB" --no-reconstruct \
    --threads "$THREADS"
uniform_arch a50 24 448 896   # half the parameters: the six layers with the lowest layer-skip loss dropped
for a in $ARCHS; do
    for m in $METHODS; do
        [ $m = lso ] && [ $a != a30 ] && continue   # outputs-only: the 30% arch, pruned only
        s=$a-$m
        flag=; [ "$m" = slice ] && flag=--no-reconstruct; [ "$m" = lso ] && flag=--recon-outputs-only
        step "$s.prune" "$BIN" prune "$MODEL" --arch "$OUT/$a.json" --out "$OUT/$s" --ranking "$OUT/rank/ranking.json" \
            --calib "$CALIB" $flag --threads "$THREADS"
        score "$s.pruned" "$OUT/$s" $([ "$PRUNED_EVAL" = 1 ] || echo ppl)
    done
done
first=1
for n in $DISTILL; do
    for s in $STUDENTS; do
        if [ $first = 0 ] && [[ " $LONG " != *" $s "* ]]; then continue; fi
        step "$s.d$n" "$BIN" distill --parent "$MODEL" --student "$OUT/$s" --data "$DATA" --tokens "$n" \
            --out "$OUT/$s-d$n" --ckpt-dir "$OUT/$s-d$n.ckpt" --threads "$THREADS"
        score "$s.d$n" "$OUT/$s-d$n"
    done
    first=0
done

python3 - "$OUT" "$DISTILL" "$MODEL" "$CALIB" "$DATA" "$EVAL_LIMIT" "$PPL_CHUNKS" <<'PY' | tee "$RES"
import json, os, sys, datetime
sys.path.insert(0, "bench/prune_recovery")
from outputs import Outputs
out, budgets, model, calib, data, limit, chunks = sys.argv[1:8]
budgets = budgets.split()
j, wall = Outputs(out).json, Outputs(out).wall
def row(label, key):
    ppl = j(key + ".ppl.out")
    ev = j(key + ".eval.json")
    avg = None
    if ev:
        accs = [v["acc"] for v in ev["accuracy"].values()]
        avg = sum(accs) / len(accs)
    return label, ppl["ppl"] if ppl else None, avg
par = row("parent", "parent")
print("# Pruning recovery: least-squares reconstruction against the plain slice (SmolLM2-135M, CPU)\n")
print("%s on the 2-core machine. Parent `%s`; ranking and reconstruction text `%s` (16,384 tokens "
      "reconstruct, as jobs do); distillation text `%s`; WikiText-2 perplexity %s x 512 (llama.cpp's "
      "chunk method), eight benchmarks at %s items each (seed 1234). Produced by "
      "`bench/prune_recovery/run.sh`.\n" % (datetime.date.today(), os.path.basename(model),
                                             os.path.basename(calib), os.path.basename(data), chunks, limit))
print("| student | params | stage | WikiText-2 ppl | x parent | 8-bench avg | vs parent (points) | step wall s |")
print("|---|---|---|---|---|---|---|---|")
print("| parent | %s | - | %.2f | 1.00 | %.4f | 0 | - |" % (
    j("rank/prune.json")["parent_params"] if j("rank/prune.json") else "?", par[1], par[2]))
for a, name in (("a30", "30%-cheaper (hidden 504, 27 layers)"), ("a50", "half the parameters (hidden 448, 24 layers by the ranking, FFN 896)")):
    for m, mname in (("slice", "slice"), ("lso", "reconstructed, o_proj and down_proj only"),
                     ("ls", "reconstructed, every projection")):
        s = a + "-" + m
        man = j(s + "/prune.json")
        if man is None:
            continue
        params = man["params"] if man else "?"
        stages = [("pruned only", s + ".pruned", s + ".prune")] + [
            ("+ %s distill tokens" % b, "%s.d%s" % (s, b), "%s.d%s" % (s, b)) for b in budgets]
        for st, key, wkey in stages:
            _, ppl, avg = row(st, key)
            if ppl is None:
                continue
            w = wall(wkey)
            print("| %s, %s | %s | %s | %.2f | %.2f | %s | %s | %s |" % (
                name, mname, params, st, ppl, ppl / par[1], "%.4f" % avg if avg is not None else "-",
                "%+.1f" % (100 * (avg - par[2])) if avg is not None else "-", "%.0f" % w if w else "-"))
ceil = dict(l.split() for l in open(os.path.join(out, "ceilings.txt")))
print("\nMachine ceilings measured in the same run: sgemm %s GFLOP/s (1024^3), STREAM triad %s GB/s (%s threads)." % (
    ceil["sgemm_gflops"], ceil["triad_gbs"], ceil["threads"]))
print("\nThe ranking (activation statistics and layer-skip losses on the calibration text, as jobs rank) "
      "took %s s; each prune step's wall time is the slice and, where reconstructed, the reconstruction." %
      ("%.0f" % wall("rank") if wall("rank") else "?"))
rec = j("a30-ls/prune.json")
if rec and rec.get("reconstruction"):
    r = rec["reconstruction"]
    ps = r["projections"]
    print("\nReconstruction of the 30%% arch: %d tokens (%d x %d), %.0f s, %d of %d projections refit; "
          "relative error summed over projections %.3f -> %.3f (per projection: mean %.3f -> %.3f)." % (
              r["tokens"], r["sequences"], r["seq_len"], r["wall_s"], sum(p["refit"] for p in ps), len(ps),
              sum(p["error_before"] for p in ps) / max(sum(p["target_sq"] for p in ps), 1e-30),
              sum(p["error_after"] for p in ps) / max(sum(p["target_sq"] for p in ps), 1e-30),
              sum(p["rel_error_before"] for p in ps) / len(ps), sum(p["rel_error_after"] for p in ps) / len(ps)))
    # its GEMM work, about: per refit projection X^T X (2 N d^2), Y^T X and two residuals
    # (6 N d c), else one residual; block forwards: the parent once, the student twice
    # where refit (2 N x block weights each; attention scores 2 N T qd, causal)
    N, T = r["tokens"], r["seq_len"]
    pa = j("a30-ls/arch.json")
    def blocks(a):
        C, D = a["hidden_size"], a["head_dim"]
        out = []
        for l in a["layers"]:
            at, ml = l.get("attention"), l.get("mlp")
            out.append(((2 * at["n_heads"] + 2 * at["n_kv_heads"]) * D * C if at else 0, at["n_heads"] * D if at else 0,
                        3 * ml["ffn_dim"] * C if ml else 0))
        return out
    par_arch = j("parent.arch.json")
    fl = 0.0
    for p in ps:
        d, c = p["in"], p["out"]
        fl += (2 * N * d * d + 6 * N * d * c) if p["pruned"] else 2 * N * d * c
    for (w_at, qd, w_ml), (li, l) in zip(blocks(pa), enumerate(pa["layers"])):
        refit = {q["proj"]: q["pruned"] for q in ps if q["layer"] == li}
        fl += (1 + refit.get("o_proj", 0)) * (2 * N * w_at + 2 * N * T * qd) + (1 + refit.get("down_proj", 0)) * 2 * N * w_ml
    if par_arch:
        for w_at, qd, w_ml in blocks(par_arch):
            fl += 2 * N * w_at + 2 * N * T * qd + 2 * N * w_ml
    g = fl / 1e9 / r["wall_s"]
    print("Its GEMM work is about %.0f GFLOP: %.0f GFLOP/s over its wall time, %.0f%% of the sgemm ceiling "
          "(the rest: host copies of the activations, fp64 sums and the Cholesky solves)." % (
              fl / 1e9, g, 100 * g / float(ceil["sgemm_gflops"])))
PY
echo "wrote $RES"
