#!/bin/bash
# bench/prune_recovery/hidden.sh — the intermediate-state loss of distillation
# (`autocompress distill --hidden-weight`) against logit KD alone, after pruning SmolLM2-135M
# to two archs: the 30%-cheaper arch of bench/results/smollm2-135m-cpu (hidden 504, 27 layers)
# and a depth cut (the parent's widths, the 20 layers whose removal the ranking scores
# costliest), each sliced from one ranking and distilled at each weight on the short budget;
# the 30% arch again on the long budget at each weight, with its eight-benchmark average.
# WikiText-2 perplexity (llama.cpp's chunk method) of each. Writes
# bench/results/prune_recovery-hidden.md.
#
# Knobs (environment): MODEL, CALIB (distillation text), WEIGHTS (default "0 1"; 0 is logit KD
# alone), TOKENS (32768), LONG (262144; "" for none), SEED (1234), LR (3e-4, cosine to a
# tenth), TASKS, EVAL_LIMIT (200), PPL_CHUNKS (16), THREADS (all cores), OUT (work folder,
# kept: a rerun reuses what is there), RES (the table).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/prune_recovery/smollm2.sh
WEIGHTS=${WEIGHTS:-0 1}
TOKENS=${TOKENS:-32768}
LONG=${LONG-262144}
SEED=${SEED:-1234}
LR=${LR:-3e-4}
OUT=${OUT:-/tmp/ac-prune-hidden}
RES=${RES:-bench/results/prune_recovery-hidden.md}
source bench/prune_recovery/steps.sh
prep
distill() {   # distill ARCH WEIGHT TOKENS
    local n=$1.w$2.t$3
    step "$n" "$BIN" distill --parent "$MODEL" --student "$OUT/$1" --data "$CALIB" --tokens "$3" --lr "$LR" \
        --lr-min "$(python3 -c "print($LR / 10)")" --seed "$SEED" --out "$OUT/$n" --ckpt-dir "$OUT/$n.ckpt" \
        --hidden-weight "$2" --threads "$THREADS"
    rm -rf "$OUT/$n.ckpt"   # a 98M-parameter student's two checkpoints hold about 2.4 GB
    ppl "$n" "$OUT/$n"
}

ppl parent "$MODEL"
step rank "$BIN" prune "$MODEL" --arch "$OUT/a30.json" --out "$OUT/rank" --calib "$CALIB" --no-reconstruct \
    --threads "$THREADS"
uniform_arch d20 20 576 1536   # SmolLM2-135M's own widths
for a in a30 d20; do
    step "$a.prune" "$BIN" prune "$MODEL" --arch "$OUT/$a.json" --out "$OUT/$a" --ranking "$OUT/rank/ranking.json" \
        --calib "$CALIB" --no-reconstruct --threads "$THREADS"
    ppl "$a" "$OUT/$a"
    for w in $WEIGHTS; do distill "$a" "$w" "$TOKENS"; done
done
for w in $WEIGHTS; do
    [ -n "$LONG" ] || break
    distill a30 "$w" "$LONG"
    step "a30.w$w.t$LONG.eval" "$BIN" eval "$OUT/a30.w$w.t$LONG" --tasks "$TASKS" --limit "$EVAL_LIMIT" --seed 1234 \
        --threads "$THREADS" --json "$OUT/a30.w$w.t$LONG.eval.json"
done
[ -n "$LONG" ] && step parent.eval "$BIN" eval "$MODEL" --tasks "$TASKS" --limit "$EVAL_LIMIT" --seed 1234 \
    --threads "$THREADS" --json "$OUT/parent.eval.json"

python3 - "$OUT" "$MODEL" "$CALIB" "$TOKENS" "$LONG" "$PPL_CHUNKS" "$SEED" "$LR" "$WEIGHTS" <<'PY' | tee "$RES"
import datetime, os, re, statistics, sys
sys.path.insert(0, "bench/prune_recovery")
from outputs import Outputs
out, model, calib, tokens, long_, chunks, seed, lr, weights = sys.argv[1:10]
o = Outputs(out)
weights = weights.split()
ppl = lambda n: (o.json(n + ".ppl.out") or {}).get("ppl")
par = ppl("parent")
def last(n, pat):
    """The last match of pat (one float group) in step n's log, or None."""
    p = os.path.join(out, n + ".log")
    m = re.findall(pat, open(p).read()) if os.path.exists(p) else []
    return float(m[-1]) if m else None
print("# The intermediate-state loss of distillation after pruning (SmolLM2-135M, CPU)\n")
print("%s on the 2-core machine. Parent `%s` (WikiText-2 perplexity %.2f), sliced from one ranking to two "
      "archs; `autocompress distill` on `%s` at lr %s with cosine to a tenth, batch 4 x 128, KD, seed %s, with "
      "`--hidden-weight W` (0: logit KD alone; W > 0 adds the mean cosine distance of each layer's output to its "
      "source layer's in the ranked parent, through the norm weight of the parent's block that reads it, weighted "
      "to W times the logit loss). WikiText-2 perplexity %s x 512 (llama.cpp's chunk method); validation loss: "
      "the student's CE on the held-out tenth of the text. Produced by `bench/prune_recovery/hidden.sh`.\n"
      % (datetime.date.today(), os.path.basename(model), par, os.path.basename(calib), lr, seed, chunks))
arch = {"a30": "30%-cheaper (hidden 504, 27 layers)", "d20": "depth cut (widths kept, 20 of 30 layers)"}
print("## %s distillation tokens\n" % tokens)
print("| arch | pruned only | weight | perplexity | x parent | validation loss | cosine distance at the end | wall s |")
print("|---|---|---|---|---|---|---|---|")
for a in arch:
    for w in weights:
        n = "%s.w%s.t%s" % (a, w, tokens)
        p = ppl(n)
        if p is None:
            continue
        v, h = last(n, r"validation loss (\d+\.\d+)"), last(n, r" hidden (\d+\.\d+)")
        print("| %s | %.1f | %s | %.1f | %.2f | %s | %s | %s |" % (arch[a], ppl(a), w, p, p / par,
              "%.4f" % v if v else "-", "%.4f" % h if h is not None else "-", "%.0f" % (o.wall(n) or 0)))
if long_:
    def avg(n):
        ev = o.json(n + ".eval.json")
        return statistics.mean(v["acc"] for v in ev["accuracy"].values()) if ev else None
    pa = avg("parent")
    print("\n## %s distillation tokens (%s)\n" % (long_, arch["a30"]))
    print("| weight | WikiText-2 ppl | x parent | 8-bench avg | vs parent (points) | validation loss | wall s |")
    print("|---|---|---|---|---|---|---|")
    if pa is not None:
        print("| parent | %.2f | 1.00 | %.4f | 0 | - | - |" % (par, pa))
    for w in weights:
        n = "a30.w%s.t%s" % (w, long_)
        p, a, v = ppl(n), avg(n), last(n, r"validation loss (\d+\.\d+)")
        if p is None:
            continue
        print("| %s | %.2f | %.2f | %s | %s | %s | %.0f |" % (w, p, p / par, "%.4f" % a if a is not None else "-",
              "%+.1f" % (100 * (a - pa)) if a is not None and pa is not None else "-",
              "%.4f" % v if v else "-", o.wall(n) or 0))
ceil = dict(l.split() for l in open(os.path.join(out, "ceilings.txt")))
print("\nMachine ceilings measured in the same run: sgemm %s GFLOP/s, STREAM triad %s GB/s." % (
    ceil.get("sgemm_gflops", "?"), ceil.get("triad_gbs", "?")))
PY
