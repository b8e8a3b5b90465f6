#!/bin/bash
# stories260K: rank on TinyStories, prune to half the FFN width (172 -> 86) and one layer
# fewer (the layer whose removal costs least calibration loss), distill from the parent
# on TinyStories, and tabulate the validation loss (held-out stories) of the parent, the
# pruned-only and the distilled model in bench/results/distill_stories260k.md.
# Usage: bench/distill/stories260k_experiment.sh [BUILD]; env WORK (reuse a folder: steps
# whose output exists are skipped), TOKENS (409600), THREADS (1), OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
BIN=$PWD/$BUILD/autocompress
SHARED=${AC_SHARED:-$(cd .. && pwd)/shared}
MODEL=$SHARED/data/models/stories260K/stories260K.bin
TEXT=$SHARED/data/text/tinystories/validation_100.txt
TOKENS=${TOKENS:-409600}
THREADS=${THREADS:-1}
OUT=${OUT:-bench/results/distill_stories260k.md}
W=${WORK:-$(mktemp -d)}
mkdir -p "$W"

python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
base = {"family": "llama", "vocab_size": 512, "hidden_size": 64, "head_dim": 8, "max_position_embeddings": 512,
        "rope_theta": 10000.0, "rope_scaling": None, "norm_eps": 1e-5, "tie_word_embeddings": True}
lay = lambda s, f: {"source_layer": s, "attention": {"n_heads": 8, "n_kv_heads": 4}, "mlp": {"ffn_dim": f}}
json.dump(dict(base, layers=[lay(s, 172) for s in range(5)]), open(w + "/parent.json", "w"))
PY
# 1. rank (the parent's own arch: a permuted copy plus ranking.json with layer scores)
[ -s "$W/rank/ranking.json" ] || "$BIN" prune "$MODEL" --arch "$W/parent.json" --out "$W/rank" --calib "$TEXT" \
    --calib-tokens 8192 --layer-tokens 4096 --seq 256 --threads "$THREADS" >"$W/rank.json"
# 2. the target: FFN 86 everywhere, drop the layer with the smallest skip loss
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
r = json.load(open(w + "/rank/ranking.json"))
skip = [l["skip"]["layer"] for l in r["layers"]]
drop = min(range(len(skip)), key=lambda i: skip[i])
a = json.load(open(w + "/parent.json"))
a["layers"] = [dict(l, mlp={"ffn_dim": 86}) for i, l in enumerate(a["layers"]) if i != drop]
json.dump(a, open(w + "/target.json", "w"))
json.dump({"drop": drop, "skip": skip, "base_loss": r["base_loss"]}, open(w + "/choice.json", "w"))
PY
# 3. prune with the saved ranking, 4. distill
[ -s "$W/prune.json" ] || "$BIN" prune "$MODEL" --arch "$W/target.json" --out "$W/student" \
    --ranking "$W/rank/ranking.json" --threads "$THREADS" >"$W/prune.json"
[ -s "$W/distill.json" ] || "$BIN" distill --parent "$MODEL" --student "$W/student" --data "$TEXT" \
    --tokens "$TOKENS" --batch 8 --seq 128 --lr 2e-3 --lr-min 1e-4 --warmup 20 --ckpt-every 100 --eval-every 50 \
    --val-tokens 4096 --threads "$THREADS" --out "$W/distilled" --ckpt-dir "$W/ckpt" \
    >"$W/distill.json" 2>"$W/distill.log"

python3 - "$W" "$OUT" <<'PY'
import json, os, re, sys
w, out = sys.argv[1:]
j = lambda n: json.load(open("%s/%s" % (w, n)))
ch, pr, di = j("choice.json"), j("prune.json"), j("distill.json")
curve = re.findall(r"step (\d+) validation loss ([0-9.]+)", open(w + "/distill.log").read())
info = re.search(r"(\d+) documents, (\d+) training and (\d+) validation tokens", open(w + "/distill.log").read())
L = []
L.append("# stories260K: pruned only vs distilled vs parent\n")
L.append("Produced by `bench/distill/stories260k_experiment.sh`. Data: the 100 TinyStories validation stories in "
         "shared/data (the only TinyStories text there), split by document with seed 1234: %s stories / %s tokens "
         "for ranking and distillation, %s held-out tokens for validation (scored in whole 128-token windows, "
         "at most 4096 tokens).\n" % (int(info.group(1)) - 10, info.group(2), info.group(3)))
L.append("Ranking: 8192 calibration tokens for activation scores, 4096 per layer-skip loss; layer skip losses "
         "(nats/token) %s, so layer %d is removed. Target: 4 layers (source %s), 8/4 heads, FFN 172 -> 86: "
         "%d -> %d parameters.\n" % (", ".join("%.3f" % s for s in ch["skip"]), ch["drop"],
                                     [i for i in range(5) if i != ch["drop"]], pr["parent_params"], pr["params"]))
L.append("Distillation: pure logit KD (T=1) from the parent, AdamW (0.9, 0.95, wd 0.01), lr 2e-3 with 20 warm-up "
         "steps and cosine to 1e-4, clip 1.0, batch 8 x 128, **%d tokens** (%d steps, about %.0f epochs of the "
         "training split), %.0f s at %.0f tokens/s on one thread (%d cores, load average %.1f when this "
         "table was written).\n" % (di["tokens"], di["steps"], di["tokens"] / int(info.group(2)), di["wall_s"],
                                   di["tokens_per_s"], os.cpu_count(), os.getloadavg()[0]))
L.append("| model | params | validation loss (nats/token) | perplexity |")
L.append("|---|---:|---:|---:|")
import math
for name, p, v in (("parent (stories260K)", pr["parent_params"], di["val_loss_parent"]),
                   ("pruned only", pr["params"], di["val_loss_pruned"]),
                   ("pruned + distilled", pr["params"], di["val_loss_distilled"])):
    L.append("| %s | %d | %.4f | %.2f |" % (name, p, v, math.exp(v)))
L.append("\nValidation loss during distillation (step: loss): " + ", ".join("%s: %s" % c for c in curve) + ".")
L.append("\nDistillation recovers %.0f%% of the loss gap the pruning opened (pruned %.3f, distilled %.3f, parent "
         "%.3f). The training split is small (the KD training loss falls far below the validation loss), so "
         "more text, not more steps, is what would close the rest." % (
             100 * (di["val_loss_pruned"] - di["val_loss_distilled"]) / (di["val_loss_pruned"] - di["val_loss_parent"]),
             di["val_loss_pruned"], di["val_loss_distilled"], di["val_loss_parent"]))
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
