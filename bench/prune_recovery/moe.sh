#!/bin/bash
# bench/prune_recovery/moe.sh — least-squares reconstruction on a mixture-of-experts parent
# with real weights: the MoE made from SmolLM2-135M by bench/families/moefy.py (Qwen2-MoE, 8
# experts of 128, top 2, shared expert 512), cut to 6 and to 4 experts per layer with the
# hidden size kept (576), and to 6 with it cut (504); each student as the plain slice and
# reconstructed as jobs do (router, experts' and shared expert's input projections) and with
# --compensate-experts (the shared expert's down_proj refit to the parent block's output less
# the routed experts; for a Mixtral made with `moefy.py --shared 0`, each kept expert's down_proj
# in turn, to it less the other experts), and, with OLD_BIN (an autocompress built before a change to the
# reconstruction), reconstructed by that build. Perplexity (llama.cpp's chunk method, 16 x 512) on three texts
# unlike the calibration text (C4): WikiText-2, Shakespeare, TinyStories. The ranking skips
# the layer-skip losses (no student drops a layer).
# Usage: bench/prune_recovery/moe.sh MOE_DIR; env OLD_BIN (and OLD_LABEL, its name in the table), OUT (work folder, kept: a rerun
# reuses what is there; default /tmp/ac-prune-moe), THREADS (all cores), PPL_CHUNKS (16), ARCHS (default
# "e6 e4 h504e6"), RES (default bench/results/prune_recovery-moe.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
MOE=$1
BIN=${AC_BIN:-$PWD/build/autocompress}
export AC_SHARED=${AC_SHARED:-$(cd .. && pwd)/shared}
OLD_BIN=${OLD_BIN:-}
OUT=${OUT:-/tmp/ac-prune-moe}
THREADS=${THREADS:-0}
PPL_CHUNKS=${PPL_CHUNKS:-16}
CALIB=$AC_SHARED/data/text/c4/c4_sample.jsonl
T=$AC_SHARED/data/text
TEXTS="wiki:$T/wikitext-2-raw/wiki.test.raw shakespeare:$T/tinyshakespeare/input.txt tinystories:$T/tinystories/validation_100.txt"
RES=${RES:-bench/results/prune_recovery-moe.md}
ARCHS=${ARCHS:-e6 e4 h504e6}
mkdir -p "$OUT"
source bench/prune_recovery/steps.sh
make -s -j2 all >/dev/null

"$BIN" inspect "$MOE" --json >"$OUT/parent.arch.json"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for name, hidden, experts in (("e6", None, 6), ("e4", None, 4), ("h504e6", 504, 6)):
    a = json.load(open(out + "/parent.arch.json"))
    if hidden:
        a["hidden_size"] = hidden
    for l in a["layers"]:
        if l.get("moe"):
            l["moe"]["n_experts"] = experts
    json.dump(a, open("%s/%s.json" % (out, name), "w"), indent=1)
PY
ppl() {   # ppl NAME MODEL
    for t in $TEXTS; do
        step "$1.ppl.${t%%:*}" "$BIN" perplexity "$2" --text "${t#*:}" --chunks "$PPL_CHUNKS" --threads "$THREADS" --json
    done
}
ppl parent "$MOE"
step rank "$BIN" prune "$MOE" --arch "$OUT/h504e6.json" --out "$OUT/rank" --calib "$CALIB" --no-reconstruct \
    --layer-tokens 0 --threads "$THREADS"
for a in $ARCHS; do
    for m in slice ls comp old; do
        b=$BIN; flag=
        [ $m = slice ] && flag=--no-reconstruct
        [ $m = comp ] && flag=--compensate-experts
        if [ $m = old ]; then [ -n "$OLD_BIN" ] || continue; b=$OLD_BIN; fi
        step "$a-$m.prune" "$b" prune "$MOE" --arch "$OUT/$a.json" --out "$OUT/$a-$m" --ranking "$OUT/rank/ranking.json" \
            --calib "$CALIB" $flag --threads "$THREADS"
        ppl "$a-$m" "$OUT/$a-$m"
    done
done
build/tools/ceilings_probe "$THREADS" >"$OUT/ceilings.txt"

python3 - "$OUT" "$MOE" "$PPL_CHUNKS" "${OLD_LABEL:-$OLD_BIN}" <<'PY' | tee "$RES"
import datetime, json, math, os, sys
sys.path.insert(0, "bench/prune_recovery")
from outputs import Outputs
out, moe, chunks, old = sys.argv[1:5]
texts = ("wiki", "shakespeare", "tinystories")
j, wall = Outputs(out).json, Outputs(out).wall
par = {t: j("parent.ppl.%s.out" % t)["ppl"] for t in texts}
cfg = json.load(open(os.path.join(moe, "config.json")))
print("# Reconstruction on a mixture of experts: the MoE made from SmolLM2-135M, pruned (CPU)\n")
man = json.load(open(os.path.join(moe, "prune.json"))) if os.path.exists(os.path.join(moe, "prune.json")) else {}
dist = ("then distilled from it (`autocompress distill`, %d tokens of C4)" % man["distill_tokens"]
        if man.get("distill_tokens") else "and not distilled")
print("%s on the 2-core machine. Parent `%s` (%s, %d layers, %d experts of %d, top %d, shared expert %d), made by "
      "bench/families/moefy.py from SmolLM2-135M-Instruct %s. Ranking (32,768 tokens, no layer-skip losses) and reconstruction "
      "(16,384 tokens) on C4; perplexity %s x 512 (llama.cpp's chunk method) on three other texts. Produced by "
      "`bench/prune_recovery/moe.sh`.\n" % (datetime.date.today(), os.path.basename(moe.rstrip("/")), cfg["model_type"],
                                            cfg["num_hidden_layers"], cfg.get("num_experts") or cfg["num_local_experts"],
                                            cfg.get("moe_intermediate_size") or cfg["intermediate_size"],
                                            cfg["num_experts_per_tok"], cfg.get("shared_expert_intermediate_size", 0),
                                            dist, chunks))
print("| student | params | method | WikiText-2 | Shakespeare | TinyStories | geo. mean x parent | prune wall s |")
print("|---|---|---|---|---|---|---|---|")
print("| parent | - | - | %s | - | - |" % " | ".join("%.2f" % par[t] for t in texts))
names = {"e6": "6 of 8 experts per layer, hidden 576", "e4": "4 of 8 experts per layer, hidden 576",
         "h504e6": "6 of 8 experts per layer, hidden 504"}
methods = (("slice", "slice"), ("old", "reconstructed by %s" % (old or "the old build")),
           ("ls", "reconstructed (MoE inputs too)"), ("comp", "reconstructed, --compensate-experts"))
for a in ("e6", "e4", "h504e6"):
    for m, mname in methods:
        man = j("%s-%s/prune.json" % (a, m))
        if man is None:
            continue
        p = [j("%s-%s.ppl.%s.out" % (a, m, t))["ppl"] for t in texts]
        g = math.exp(sum(math.log(x / par[t]) for x, t in zip(p, texts)) / len(texts))
        print("| %s | %d | %s | %s | %.2f | %.0f |" % (names[a], man["params"], mname, " | ".join("%.2f" % x for x in p),
                                                       g, wall("%s-%s.prune" % (a, m)) or 0))
ceil = dict(l.split() for l in open(os.path.join(out, "ceilings.txt")))
print("\nMachine ceilings measured in the same run: sgemm %s GFLOP/s (1024^3), STREAM triad %s GB/s (%s threads)." % (
    ceil["sgemm_gflops"], ceil["triad_gbs"], ceil["threads"]))
print("The ranking took %.0f s; each prune step's wall time is the slice and, where reconstructed, the "
      "reconstruction." % (wall("rank") or 0))
PY
echo "wrote $RES"
