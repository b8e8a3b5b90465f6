#!/bin/bash
# bench/prune_recovery/lr.sh — the distillation's peak learning rate after pruning:
# SmolLM2-135M cut to the 30%-cheaper arch of bench/results/smollm2-135m-cpu (hidden 504,
# 27 layers) as the plain slice and reconstructed, each distilled at each peak rate (cosine
# to a tenth of it, `autocompress distill`'s other defaults), over several seeds (the seed
# picks where in the text distillation starts); WikiText-2 perplexity (llama.cpp's chunk
# method) of each, and the eight-benchmark average of the LONG budget's students. Writes
# bench/results/prune_recovery-lr.md.
#
# Knobs (environment): MODEL, CALIB (reconstruction and distillation text), RANKING (a
# saved ranking.json of the parent, as `autocompress prune --out` writes; unset: ranked
# here, as jobs rank), LRS (peak rates, default "1e-3 3e-4 1e-4"), SEEDS (default
# "1234 7 99"), TOKENS (the short budget, default 32768), STUDENTS (default "slice ls"),
# LONG (the long budget, default 262144; "" for none), LONG_LRS (its rates, default
# "1e-3 3e-4", seed 1234, the slice), BATCH and SEQ (the distillation's micro-batch,
# default 4 x 128), HIDDEN (`--hidden-weight`: the intermediate-state loss, marked .hW in the
# distillations' names and -hiddenW in the default RES; unset: off),
# TASKS, EVAL_LIMIT (200), PPL_CHUNKS (16), THREADS (all cores), OUT (work folder, kept: a
# rerun reuses what is there, so give each BATCH x SEQ its own), RES (the table).
# Only the first seed runs every rate and student; the other seeds run the slice at the
# first two rates.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/prune_recovery/smollm2.sh
LRS=${LRS:-1e-3 3e-4 1e-4}
SEEDS=${SEEDS:-1234 7 99}
TOKENS=${TOKENS:-32768}
STUDENTS=${STUDENTS:-slice ls}
LONG=${LONG-262144}
LONG_LRS=${LONG_LRS:-1e-3 3e-4}
BATCH=${BATCH:-4}
SEQ=${SEQ:-128}
OUT=${OUT:-/tmp/ac-prune-lr}
H=${HIDDEN:+.h$HIDDEN}   # in the names of the distillations, so that runs with and without it never mix
RES=${RES:-bench/results/prune_recovery-lr${HIDDEN:+-hidden$HIDDEN}.md}
source bench/prune_recovery/steps.sh
prep
distill() {   # distill STUDENT SEED LR TOKENS NAME
    step "$5" "$BIN" distill --parent "$MODEL" --student "$OUT/a30-$1" --data "$CALIB" --tokens "$4" --lr "$3" \
        --lr-min "$(python3 -c "print($3 / 10)")" --seed "$2" --out "$OUT/$5" --ckpt-dir "$OUT/$5.ckpt" \
        --batch "$BATCH" --seq "$SEQ" --threads "$THREADS" ${HIDDEN:+--hidden-weight "$HIDDEN"}
    rm -rf "$OUT/$5.ckpt"   # a 98M-parameter student's two checkpoints hold about 2.4 GB
    ppl "$5" "$OUT/$5"
}

ppl parent "$MODEL"
if [ -z "${RANKING:-}" ]; then
    step rank "$BIN" prune "$MODEL" --arch "$OUT/a30.json" --out "$OUT/rank" --calib "$CALIB" --no-reconstruct \
        --threads "$THREADS"
    RANKING=$OUT/rank/ranking.json
fi
for s in $STUDENTS; do
    flag=; [ "$s" = slice ] && flag=--no-reconstruct
    step "$s.prune" "$BIN" prune "$MODEL" --arch "$OUT/a30.json" --out "$OUT/a30-$s" --ranking "$RANKING" \
        --calib "$CALIB" $flag --threads "$THREADS"
    ppl "$s" "$OUT/a30-$s"
done
first=1
for seed in $SEEDS; do
    n=0
    for lr in $LRS; do
        for s in $STUDENTS; do
            [ $first = 0 ] && { [ "$s" != slice ] || [ $n -ge 2 ]; } && continue
            distill "$s" "$seed" "$lr" "$TOKENS" "$s.s$seed.d$lr$H"
        done
        n=$((n + 1))
    done
    first=0
done
seed=${SEEDS%% *}
for lr in $LONG_LRS; do
    [ -n "$LONG" ] || break
    name=slice.s$seed.d$lr$H.t$LONG
    distill slice "$seed" "$lr" "$LONG" "$name"
    step "$name.eval" "$BIN" eval "$OUT/$name" --tasks "$TASKS" --limit "$EVAL_LIMIT" --seed 1234 \
        --threads "$THREADS" --json "$OUT/$name.eval.json"
done
[ -n "$LONG" ] && step parent.eval "$BIN" eval "$MODEL" --tasks "$TASKS" --limit "$EVAL_LIMIT" --seed 1234 \
    --threads "$THREADS" --json "$OUT/parent.eval.json"

python3 - "$OUT" "$MODEL" "$CALIB" "$TOKENS" "$LONG" "$PPL_CHUNKS" "$EVAL_LIMIT" "$SEEDS" "$LRS" "$LONG_LRS" \
    "$STUDENTS" "$BATCH" "$SEQ" "${HIDDEN:-}" <<'PY' | tee "$RES"
import datetime, os, statistics, sys
sys.path.insert(0, "bench/prune_recovery")
from outputs import Outputs
out, model, calib, tokens, long_, chunks, limit, seeds, lrs, long_lrs, students, batch, seq, hidden = sys.argv[1:15]
hs = ".h" + hidden if hidden else ""   # the names' mark of the intermediate-state loss
o = Outputs(out)
seeds, lrs, long_lrs, students = seeds.split(), lrs.split(), long_lrs.split(), students.split()
ppl = lambda n: (o.json(n + ".ppl.out") or {}).get("ppl")
par = ppl("parent")
name = {"slice": "slice", "ls": "reconstructed"}
print("# Distillation's learning rate after pruning (SmolLM2-135M, CPU)\n")
print("%s on the 2-core machine. Parent `%s` (WikiText-2 perplexity %.2f); the 30%%-cheaper arch of "
      "bench/results/smollm2-135m-cpu (hidden 504, 27 layers), sliced or reconstructed (16,384 tokens) from one "
      "ranking; distillation text `%s`, `autocompress distill` at each peak rate with cosine to a tenth of it "
      "(10 warm-up steps, batch %s x %s, AdamW, %s); the seed picks where distillation starts in the text. "
      "WikiText-2 perplexity %s x 512 (llama.cpp's chunk method). Produced by `bench/prune_recovery/lr.sh`.\n"
      % (datetime.date.today(), os.path.basename(model), par, os.path.basename(calib), batch, seq,
         "KD and the intermediate-state loss at `--hidden-weight %s`" % hidden if hidden else "pure KD", chunks))
print("## %s distillation tokens\n" % tokens)
print("| student | pruned only | seed | " + " | ".join("lr %s" % lr for lr in lrs) + " |")
print("|---|---|---|" + "---|" * len(lrs))
for s in students:
    for seed in seeds:
        cells = [ppl("%s.s%s.d%s%s" % (s, seed, lr, hs)) for lr in lrs]
        if all(c is None for c in cells):
            continue
        print("| %s | %.1f | %s | %s |" % (name.get(s, s), ppl(s), seed,
              " | ".join("%.1f (%.2fx)" % (c, c / par) if c else "-" for c in cells)))
for a, b in ((lrs[0], lrs[1]),) if len(lrs) > 1 else ():
    r = [ppl("slice.s%s.d%s%s" % (seed, b, hs)) / ppl("slice.s%s.d%s%s" % (seed, a, hs)) for seed in seeds
         if ppl("slice.s%s.d%s%s" % (seed, a, hs)) and ppl("slice.s%s.d%s%s" % (seed, b, hs))]
    if r:
        print("\nSlice, lr %s over lr %s: %s (mean %.3f over %d seeds)" % (
            b, a, ", ".join("%.3f" % x for x in r), statistics.mean(r), len(r)))
walls = [o.wall("%s.s%s.d%s%s" % (s, seed, lr, hs)) for s in students for seed in seeds for lr in lrs]
walls = [w for w in walls if w]
if walls:
    print("Each distillation took %.0f-%.0f s (median %.0f)." % (min(walls), max(walls), statistics.median(walls)))
if long_:
    def avg(n):
        ev = o.json(n + ".eval.json")
        return statistics.mean(v["acc"] for v in ev["accuracy"].values()) if ev else None
    pa = avg("parent")
    print("\n## %s distillation tokens (slice, seed %s)\n" % (long_, seeds[0]))
    print("| lr | WikiText-2 ppl | x parent | 8-bench avg | vs parent (points) | wall s |")
    print("|---|---|---|---|---|---|")
    if pa is not None:
        print("| parent | %.2f | 1.00 | %.4f | 0 | - |" % (par, pa))
    for lr in long_lrs:
        n = "slice.s%s.d%s%s.t%s" % (seeds[0], lr, hs, long_)
        p, a, w = ppl(n), avg(n), o.wall(n)
        if p is None:
            continue
        print("| %s | %.2f | %.2f | %s | %s | %s |" % (lr, p, p / par, "%.4f" % a if a is not None else "-",
              "%+.1f" % (100 * (a - pa)) if a is not None and pa is not None else "-", "%.0f" % w if w else "-"))
ceil = dict(l.split() for l in open(os.path.join(out, "ceilings.txt")))
print("\nMachine ceilings measured in the same run: sgemm %s GFLOP/s, STREAM triad %s GB/s." % (
    ceil.get("sgemm_gflops", "?"), ceil.get("triad_gbs", "?")))
PY
