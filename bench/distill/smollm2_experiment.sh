#!/bin/bash
# SmolLM2-135M-Instruct: prune to a ~25% cheaper arch (hidden 576 -> 512, FFN 1536 -> 1152
# in every layer: 24% fewer parameters, so ~24% less weight traffic per decoded token),
# then distill it from the parent on C4 text with a budget a 2-core CPU can afford, and
# compare WikiText-2 perplexity (llama.cpp's chunk method, `autocompress perplexity`) of
# parent, pruned-only and distilled. Usage: bench/distill/smollm2_experiment.sh [BUILD]
# Knobs (env): TOKENS (distillation budget, 4096), CALIB (ranking tokens, 2048),
# PPL_CHUNKS (512-token chunks scored, 8), THREADS (2), OUT (bench/results/distill_smollm2.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
BIN=$PWD/$BUILD/autocompress
SHARED=${AC_SHARED:-$(cd .. && pwd)/shared}
MODEL=$(scripts/fetch-models.sh)
TOKENS=${TOKENS:-4096}
CALIB=${CALIB:-2048}
PPL_CHUNKS=${PPL_CHUNKS:-8}
THREADS=${THREADS:-2}
OUT=${OUT:-bench/results/distill_smollm2.md}
W=${WORK:-$(mktemp -d)}
C4=$SHARED/data/text/c4/c4_sample.jsonl
WIKI=$SHARED/data/text/wikitext-2-raw/wiki.test.raw

python3 - "$W" <<'PY'
import json, sys
base = {"family": "llama", "vocab_size": 49152, "head_dim": 64, "max_position_embeddings": 8192,
        "rope_theta": 100000.0, "rope_scaling": None, "norm_eps": 9.999999747378752e-06,
        "tie_word_embeddings": True, "hidden_size": 512,
        "layers": [{"source_layer": i, "attention": {"n_heads": 9, "n_kv_heads": 3}, "mlp": {"ffn_dim": 1152}}
                   for i in range(30)]}
json.dump(base, open(sys.argv[1] + "/target.json", "w"))
PY

t0=$(date +%s)
"$BIN" prune "$MODEL" --arch "$W/target.json" --out "$W/student" --calib "$C4" --calib-tokens "$CALIB" \
    --layer-tokens 0 --batch 4 --seq 256 --threads "$THREADS" >"$W/prune.json"
t1=$(date +%s)
"$BIN" distill --parent "$MODEL" --student "$W/student" --data "$C4" --tokens "$TOKENS" --batch 1 --seq 128 \
    --lr 1e-4 --lr-min 1e-5 --warmup 4 --eval-every 0 --val-tokens 512 --ckpt-every 0 --threads "$THREADS" \
    --out "$W/distilled" >"$W/distill.json"
t2=$(date +%s)
ppl() {
    "$BIN" perplexity "$1" --tokenizer "$MODEL" --text "$WIKI" --ctx 512 --chunks "$PPL_CHUNKS" \
        --threads "$THREADS" --json 2>/dev/null | tail -1
}
ppl "$MODEL" >"$W/ppl_parent.json"
ppl "$W/student" >"$W/ppl_pruned.json"
ppl "$W/distilled" >"$W/ppl_distilled.json"
t3=$(date +%s)

python3 - "$W" "$OUT" "$TOKENS" "$CALIB" "$PPL_CHUNKS" "$THREADS" $((t1 - t0)) $((t2 - t1)) $((t3 - t2)) <<'PY'
import json, sys, platform, os
w, out, tokens, calib, chunks, threads, t_prune, t_dist, t_ppl = sys.argv[1:]
j = lambda n: json.load(open(os.path.join(w, n)))
pr, di = j("prune.json"), j("distill.json")
pp, ps, pd = j("ppl_parent.json"), j("ppl_pruned.json"), j("ppl_distilled.json")
rows = [
    ("parent (SmolLM2-135M-Instruct Q4_1, dequantized to fp32)", pr["parent_params"], di["val_loss_parent"], pp["ppl"]),
    ("pruned only (ranked on C4, hidden 512, FFN 1152)", pr["params"], di["val_loss_pruned"], ps["ppl"]),
    ("pruned + distilled (%s tokens of C4)" % tokens, pr["params"], di["val_loss_distilled"], pd["ppl"]),
]
with open(out, "w") as f:
    f.write("# SmolLM2-135M-Instruct: pruned only vs distilled (CPU budget)\n\n")
    f.write("Produced by `bench/distill/smollm2_experiment.sh` (%s, %s threads).\n\n" % (platform.node(), threads))
    f.write("Target arch: every layer keeps 9/3 heads; hidden 576 -> 512, FFN 1536 -> 1152: %d -> %d parameters "
            "(%.1f%% fewer; decode latency on CPU tracks weight bytes).\n" % (pr["parent_params"], pr["params"],
            100 * (1 - pr["params"] / pr["parent_params"])))
    f.write("Ranking: %s calibration tokens of C4 (activation statistics only; no layer removal). "
            "Distillation: pure logit KD (T=1), AdamW lr 1e-4 -> 1e-5, batch 1 x 128, **%s tokens** "
            "(the budget a shared 2-core CPU affords: %s s), validation on held-out C4 documents (512 tokens).\n\n"
            % (calib, di["tokens"], t_dist))
    f.write("| model | params | C4 val loss (nats/token) | WikiText-2 ppl (%s x 512-token chunks) |\n" % chunks)
    f.write("|---|---:|---:|---:|\n")
    for name, p, vl, ppl in rows:
        f.write("| %s | %d | %.4f | %.2f |\n" % (name, p, vl, ppl))
    f.write("\nWall time: prune %s s, distill %s s, perplexities %s s. Distillation throughput %.1f tokens/s "
            "(load average %.1f on %d cores when the table was written).\n"
            % (t_prune, t_dist, t_ppl, di["tokens_per_s"], os.getloadavg()[0], os.cpu_count()))
    f.write("\nThe eight-benchmark average (compress/eval.h, `autocompress eval --tasks eight`) is not in this table: "
            "at this machine's speed it needs hours per model; run it with the same three model paths.\n")
print(open(out).read())
PY
