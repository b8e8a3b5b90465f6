#!/bin/bash
# bench/prune_recovery/iterative.sh — pruning in two steps with distillation between them,
# against one cut, at the same distillation budget: SmolLM2-135M to the 30%-cheaper arch of
# bench/results/smollm2-135m-cpu (hidden 504, 27 layers).
#   one cut:   slice the parent to the arch, distil TOKENS tokens;
#   two steps: slice the parent to a halfway arch (hidden 536, each layer's FFN width and
#              KV groups halfway to the arch's, every layer kept), distil TOKENS/2; rank that
#              student afresh and slice it to the arch, distil TOKENS/2.
# Every distillation learns from the parent (pure KD, `autocompress distill`'s defaults),
# from the same seed. WikiText-2 perplexity (llama.cpp's chunk method) after each step and
# the eight-benchmark average of both finished students. Writes
# bench/results/prune_recovery-iterative.md.
#
# Knobs (environment): MODEL, CALIB (ranking and distillation text), TOKENS (default
# 262144), SEED (1234), BATCH and SEQ (4 x 128), TASKS, EVAL_LIMIT (200), PPL_CHUNKS (16),
# THREADS (all cores), OUT (work folder, kept: a rerun reuses what is there), RES (the table).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/prune_recovery/smollm2.sh
TOKENS=${TOKENS:-262144}
SEED=${SEED:-1234}
BATCH=${BATCH:-4}
SEQ=${SEQ:-128}
OUT=${OUT:-/tmp/ac-prune-iterative}
RES=${RES:-bench/results/prune_recovery-iterative.md}
HALF=$((TOKENS / 2))
source bench/prune_recovery/steps.sh
prep
# the halfway arch: hidden 536; each layer's FFN width halfway to the arch's (a multiple of
# 32) and its KV groups too (rounded up: 3 of 3 heads per group); the layers the arch drops
# kept whole, so the arch reads the same source_layer numbers in it
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
p, a = json.load(open(out + "/parent.arch.json")), json.load(open(out + "/a30.json"))
by = {l["source_layer"]: l for l in a["layers"]}
half = dict(p)
half["hidden_size"] = 536
layers = []
for i, l in enumerate(p["layers"]):
    t = by.get(i)
    if t is None:
        layers.append(dict(l, source_layer=i))
        continue
    kv0, kv1 = l["attention"]["n_kv_heads"], t["attention"]["n_kv_heads"]
    per = l["attention"]["n_heads"] // kv0
    kv = -(-(kv0 + kv1) // 2)
    ffn = int(round((l["mlp"]["ffn_dim"] + t["mlp"]["ffn_dim"]) / 2 / 32) * 32)
    layers.append({"source_layer": i, "attention": {"n_heads": per * kv, "n_kv_heads": kv}, "mlp": {"ffn_dim": ffn}})
half["layers"] = layers
json.dump(half, open(out + "/half.json", "w"), indent=1)
PY
distill() {   # distill STUDENT_DIR TOKENS NAME
    step "$3" "$BIN" distill --parent "$MODEL" --student "$1" --data "$CALIB" --tokens "$2" --seed "$SEED" \
        --out "$OUT/$3" --ckpt-dir "$OUT/$3.ckpt" --batch "$BATCH" --seq "$SEQ" --threads "$THREADS"
    rm -rf "$OUT/$3.ckpt"   # a 98M-parameter student's two checkpoints hold about 2.4 GB
    ppl "$3" "$OUT/$3"
}
evalm() { step "$1.eval" "$BIN" eval "$2" --tasks "$TASKS" --limit "$EVAL_LIMIT" --seed 1234 --threads "$THREADS" \
    --json "$OUT/$1.eval.json"; }

ppl parent "$MODEL"
evalm parent "$MODEL"
step rank "$BIN" prune "$MODEL" --arch "$OUT/a30.json" --out "$OUT/rank" --calib "$CALIB" --no-reconstruct \
    --threads "$THREADS"
# one cut
ppl once.pruned "$OUT/rank"
distill "$OUT/rank" "$TOKENS" once
evalm once "$OUT/once"
# two steps
step half.prune "$BIN" prune "$MODEL" --arch "$OUT/half.json" --out "$OUT/half" --ranking "$OUT/rank/ranking.json" \
    --calib "$CALIB" --no-reconstruct --threads "$THREADS"
ppl half.pruned "$OUT/half"
distill "$OUT/half" "$HALF" half.d
step two.prune "$BIN" prune "$OUT/half.d" --arch "$OUT/a30.json" --out "$OUT/two" --calib "$CALIB" --no-reconstruct \
    --threads "$THREADS"
ppl two.pruned "$OUT/two"
distill "$OUT/two" "$HALF" two.d
evalm two.d "$OUT/two.d"

python3 - "$OUT" "$MODEL" "$CALIB" "$TOKENS" "$SEED" "$PPL_CHUNKS" "$EVAL_LIMIT" "$BATCH" "$SEQ" <<'PY' | tee "$RES"
import datetime, os, statistics, sys
sys.path.insert(0, "bench/prune_recovery")
from outputs import Outputs
out, model, calib, tokens, seed, chunks, limit, batch, seq = sys.argv[1:10]
o = Outputs(out)
ppl = lambda n: (o.json(n + ".ppl.out") or {}).get("ppl")
def avg(n):
    ev = o.json(n + ".eval.json")
    return statistics.mean(v["acc"] for v in ev["accuracy"].values()) if ev else None
par, pa = ppl("parent"), avg("parent")
half = int(tokens) // 2
cell = lambda n: "%.2f (%.2fx)" % (ppl(n), ppl(n) / par) if ppl(n) else "-"
wall = lambda n: "%.0f" % o.wall(n) if o.wall(n) else "-"
print("# Pruning in two steps against one cut (SmolLM2-135M, CPU)\n")
print("%s on the 2-core machine. Parent `%s` (WikiText-2 perplexity %.2f, eight-benchmark average %.4f); the "
      "30%%-cheaper arch of bench/results/smollm2-135m-cpu (hidden 504, 27 layers); every cut a plain slice from "
      "a fresh activation ranking (`autocompress prune --no-reconstruct`). Distillation: `autocompress distill` "
      "from the parent, pure KD, its default schedule (lr 3e-4, cosine to 3e-5), batch %s x %s, seed %s, text "
      "`%s`. WikiText-2 perplexity %s x 512 (llama.cpp's chunk method); the eight benchmarks %s items each. "
      "Produced by `bench/prune_recovery/iterative.sh`.\n"
      % (datetime.date.today(), os.path.basename(model), par, pa if pa is not None else float("nan"), batch, seq,
         seed, os.path.basename(calib), chunks, limit))
print("| path | step | WikiText-2 ppl | wall s |")
print("|---|---|---|---|")
print("| one cut | slice to the arch | %s | %s |" % (cell("once.pruned"), wall("rank")))
print("| | distil %s tokens | %s | %s |" % (tokens, cell("once"), wall("once")))
print("| two steps | slice to halfway (hidden 536, 30 layers) | %s | %s |" % (cell("half.pruned"), wall("half.prune")))
print("| | distil %d tokens | %s | %s |" % (half, cell("half.d"), wall("half.d")))
print("| | rank it, slice to the arch | %s | %s |" % (cell("two.pruned"), wall("two.prune")))
print("| | distil %d tokens | %s | %s |" % (half, cell("two.d"), wall("two.d")))
print("\n| student | WikiText-2 ppl | x parent | 8-bench avg | vs parent (points) |")
print("|---|---|---|---|---|")
for label, n in (("parent", "parent"), ("one cut", "once"), ("two steps", "two.d")):
    p, a = ppl(n), avg(n)
    print("| %s | %s | %s | %s | %s |" % (label, "%.2f" % p if p else "-", "%.2f" % (p / par) if p else "-",
          "%.4f" % a if a is not None else "-",
          "%+.1f" % (100 * (a - pa)) if a is not None and pa is not None else "-"))
ceil = dict(l.split() for l in open(os.path.join(out, "ceilings.txt")))
print("\nMachine ceilings measured in the same run: sgemm %s GFLOP/s, STREAM triad %s GB/s." % (
    ceil.get("sgemm_gflops", "?"), ceil.get("triad_gbs", "?")))
PY
