#!/bin/bash
# Model families: the MoE made from SmolLM2 (bench/families/moefy.py), served by this engine
# (BUILD/tools/engine_bench --model) and by PyTorch eager (bench/families/peer_torch.py,
# transformers' own Qwen2MoeForCausalLM), same threads, each in a process of its own,
# alternating engine / PyTorch for ROUNDS rounds: prefill (1 x 512) and decode (batch 1 after
# a 128-token prompt) tokens/s, wall-clock medians, with the machine's ceilings (sgemm GFLOP/s,
# triad GB/s) measured in the engine's processes and the share reached. Then the cost model's
# held-out error on random per-layer MoE archs of that parent (autocompress calibrate), and
# the quality steps of the MoE model (dense parent, MoEfied, distilled) as WikiText-2
# perplexity. llama.cpp is not a peer here: GGUF export of MoE families is not built.
# Writes bench/results/families.md.
# Usage: bench/families/run.sh MOE_DIR [DENSE_DIR] [DISTILLED_DIR] [BUILD] [THREADS]; env ROUNDS (5),
# OUT (raw outputs, /tmp/ac-families), REPORT_ONLY=1 (the table again from OUT's outputs)
set -eu
cd "$(dirname "$0")/../.."
MOE=$1
DENSE=${2:-}
DIST=${3:-}
BUILD=${4:-build}
THREADS=${5:-2}
ROUNDS=${ROUNDS:-5}
source scripts/pyenv.sh >/dev/null
bin=$BUILD/tools/engine_bench
[ -x "$bin" ] || { echo "engine_bench not built: make BUILD=$BUILD $bin" >&2; exit 1; }
tmp=${OUT:-/tmp/ac-families}   # raw outputs, kept
[ "${REPORT_ONLY:-0}" = 1 ] || { rm -rf "$tmp"; mkdir -p "$tmp"; }
load=$(cut -d' ' -f1-3 /proc/loadavg)
[ "${REPORT_ONLY:-0}" = 1 ] && load=$(cat "$tmp/load" 2>/dev/null || echo "$load")
[ "${REPORT_ONLY:-0}" = 1 ] || {
echo "$load" >"$tmp/load"
for r in $(seq 1 "$ROUNDS"); do
    "$bin" --threads "$THREADS" --model "$MOE" >"$tmp/engine.$r"
    OMP_NUM_THREADS=$THREADS "$AC_TF_PYTHON" bench/families/peer_torch.py "$MOE" "$THREADS" >"$tmp/torch.$r" 2>/dev/null
    echo "round $r/$ROUNDS done" >&2
done
W=${AC_SHARED:-../shared}/data/text/wikitext-2-raw/wiki.test.raw
for m in "$DENSE" "$MOE" "$DIST"; do
    [ -n "$m" ] || continue
    "$BUILD/autocompress" perplexity "$m" --text "$W" --ctx 512 --chunks 40 --json >"$tmp/ppl.$(basename "$m")" 2>/dev/null
done
"$BUILD/autocompress" calibrate --model "$MOE" --threads "$THREADS" --validate 10 --fit 6 --no-hidden \
    --data-dir "$tmp/var" --no-cache --json >"$tmp/cal.json" 2>/dev/null
}
"$AC_PYTHON" - "$tmp" "$ROUNDS" "$THREADS" "$load" "$MOE" "$DENSE" "$DIST" <<'PY'
import json, os, statistics, sys, datetime
tmp, rounds, threads, load, moe, dense, dist = sys.argv[1:8]
rounds = int(rounds)
sys.path.insert(0, "bench")
from rounds import Rounds
R = Rounds(tmp, rounds, ("engine", "torch"))
runs, med, rng = R.runs, R.med, R.rng
e = runs["engine"][0]
active, params = e["active_params"], e["params"]
cfg = json.load(open(os.path.join(moe, "config.json")))
V, C = cfg["vocab_size"], cfg["hidden_size"]
flop_tok = 2 * (active - V * C - C)
sg, bw = med("engine", "sgemm_gflops_wall"), med("engine", "triad_bandwidth_wall")
out = ["# Model families: the MoE made from SmolLM2-135M, CPU", ""]
out.append("Model: %s (%s, %d layers, %d experts of %d, top %d, shared expert %d; %.1fM parameters, %.1fM "
           "run per token). %s" % (moe, cfg["model_type"], cfg["num_hidden_layers"], cfg["num_experts"],
                                   cfg["moe_intermediate_size"], cfg["num_experts_per_tok"],
                                   cfg["shared_expert_intermediate_size"], params / 1e6, active / 1e6,
                                   datetime.date.today().isoformat()))
out.append("")
out.append("Machine ceilings measured in the engine's processes (medians): sgemm %.1f GFLOP/s, triad %.2f GB/s. "
           "%s threads, %d rounds alternating engine / PyTorch, each in a process of its own; load average "
           "before: %s." % (sg, bw, threads, rounds, load))
out.append("")
out.append("| phase | autocompress tok/s (median, range) | PyTorch eager tok/s (median, range) | ratio | engine share of ceiling |")
out.append("|---|---:|---:|---:|---:|")
p_e, p_t = med("engine", "prefill_b1_wall"), med("torch", "prefill_b1_wall")
d_e, d_t = med("engine", "decode_b1_wall"), med("torch", "decode_b1_wall")
out.append("| prefill 1 x 512 | %.1f (%s) | %.1f (%s) | %.2fx | %.0f%% of sgemm (%.1f GFLOP/s in projections) |" % (
    p_e, rng("engine", "prefill_b1_wall"), p_t, rng("torch", "prefill_b1_wall"), p_e / p_t,
    100 * p_e * flop_tok / 1e9 / sg, p_e * flop_tok / 1e9))
out.append("| decode b1 (prompt 128) | %.2f (%s) | %.2f (%s) | %.2fx | %.0f%% of triad (%.2f GB/s of run weights) |" % (
    d_e, rng("engine", "decode_b1_wall"), d_t, rng("torch", "decode_b1_wall"), d_e / d_t,
    100 * d_e * active * 4 / 1e9 / bw, d_e * active * 4 / 1e9))
out.append("")
peer = next((l.split(None, 1)[1].strip() for l in open(os.path.join(tmp, "torch.1")) if l.startswith("peer ")), "?")
out.append("Peer: %s (eager, fp32). CPU-time rates are in the raw outputs (engine_bench NAME, peer NAME_cpu). "
           "llama.cpp is not in this table: the MoEfied model renormalizes its top-k weights "
           "(norm_topk_prob), which llama.cpp's qwen2moe never does, so its GGUF export is refused." % peer)
cal = json.load(open(os.path.join(tmp, "cal.json")))
v = cal.get("validation", {})
out.append("")
out.append("## Cost model on the MoE parent")
out.append("")
out.append("`autocompress calibrate --model MOE --no-hidden` (workload 1 x 256 + 64): %d timing entries, held-out "
           "random archs with per-layer expert counts: latency MAPE %.1f%% (max %.1f%%), memory MAPE %.2f%% "
           "(max %.2f%%), naive weights+KV memory MAPE %.1f%%." % (
               cal.get("entries", 0), v.get("latency_mape_pct", float("nan")), v.get("latency_max_pct", float("nan")),
               v.get("memory_mape_pct", float("nan")), v.get("memory_max_pct", float("nan")),
               v.get("naive_memory_mape_pct", float("nan"))))
rows = []
for name, m in (("dense SmolLM2-135M", dense), ("MoEfied (no training)", moe), ("MoEfied, distilled", dist)):
    p = os.path.join(tmp, "ppl." + os.path.basename(m)) if m else ""
    if m and os.path.exists(p) and os.path.getsize(p):
        j = json.load(open(p))
        rows.append("| %s | %.2f | %d |" % (name, j["ppl"], j["tokens_scored"]))
if rows:
    out += ["", "## Quality steps (WikiText-2 test, 40 chunks of 512, second halves scored)", "",
            "| model | perplexity | tokens scored |", "|---|---:|---:|"] + rows
    man = os.path.join(dist, "prune.json") if dist else ""
    if man and os.path.exists(man):
        m = json.load(open(man))
        out += ["", "The distilled model: `autocompress distill` from the dense parent, %s tokens of C4 (%s steps). "
                "bench/families/moefy.py's header says how the MoE was made; its per-layer errors are in the "
                "MoE directory's moefy.json." % (m.get("distill_tokens"), m.get("distill_steps"))]
out.append("")
print("\n".join(out))
open("bench/results/families.md", "w").write("\n".join(out) + "\n")
PY
