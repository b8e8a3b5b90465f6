#!/bin/bash
# Model families, hybrid Mamba-2: a random Nemotron-H-shaped model (bench/families/make_hybrid.py,
# 128.6M parameters, written once into the model cache) served by this engine
# (BUILD/tools/engine_bench --model) and by PyTorch eager (bench/families/peer_torch_hybrid.py:
# the family written in PyTorch, chunked SSD prefill and recurrent decode, as transformers' torch
# path computes it; transformers 4.40.2 has no Nemotron-H class), same threads, each in a process
# of its own, alternating engine / PyTorch / llama.cpp for ROUNDS rounds: prefill (1 x 512) and decode
# (batch 1 after a 128-token prompt) tokens/s, wall-clock medians, with the machine's ceilings
# (sgemm GFLOP/s, triad GB/s) measured in the engine's processes. The PyTorch peer's logits are checked
# against the engine's first (prefill and decode paths); llama.cpp's nemotron_h serves the
# engine's own F32 GGUF export of it (BUILD/ac-llama bench, F32 KV cache) as the third. Then the
# cost model's held-out error on random archs of that parent with cut Mamba heads (autocompress
# calibrate). Random weights: timing only.
# Writes bench/results/families-hybrid.md.
# Usage: bench/families/hybrid.sh [BUILD] [THREADS]; env ROUNDS (5), OUT (raw outputs,
# /tmp/ac-hybrid), REPORT_ONLY=1 (the table again from OUT's outputs)
set -eu
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
THREADS=${2:-2}
ROUNDS=${ROUNDS:-5}
source scripts/pyenv.sh >/dev/null
bin=$BUILD/tools/engine_bench
[ -x "$bin" ] || { echo "engine_bench not built: make BUILD=$BUILD $bin" >&2; exit 1; }
MODEL=${AC_CACHE:-$HOME/.cache/autocompress}/nemotron-h-bench
[ -f "$MODEL/model.safetensors" ] || "$AC_PYTHON" bench/families/make_hybrid.py "$MODEL" >&2
tmp=${OUT:-/tmp/ac-hybrid}
[ "${REPORT_ONLY:-0}" = 1 ] || { rm -rf "$tmp"; mkdir -p "$tmp"; }
load=$(cut -d' ' -f1-3 /proc/loadavg)
[ "${REPORT_ONLY:-0}" = 1 ] && load=$(cat "$tmp/load" 2>/dev/null || echo "$load")
[ "${REPORT_ONLY:-0}" = 1 ] || {
echo "$load" >"$tmp/load"
seq 1 300 | awk '{print ($1 * 7919 + 13) % 32000}' | tr '\n' ' ' >"$tmp/ids.txt"
"$BUILD/tools/export_interop" "$MODEL" --logits "$tmp/ids.txt" "$tmp/engine.f32" >/dev/null
OMP_NUM_THREADS=$THREADS "$AC_PYTHON" bench/families/peer_torch_hybrid.py "$MODEL" "$THREADS" \
    --check "$tmp/engine.f32" "$tmp/ids.txt" >"$tmp/check" 2>&1
# llama.cpp's nemotron_h on the engine's own F32 GGUF export (no vocabulary: token ids), F32 KV cache
"$BUILD/tools/export_interop" "$MODEL" --no-vocab --gguf "$tmp/model.gguf" --dtype fp32 >/dev/null
llama_round() {   # prefill 1 x 512, decode 32 steps after a 128-token prompt: "name value unit" lines
    local p d
    p=$("$BUILD/ac-llama" bench "$tmp/model.gguf" --threads "$THREADS" --prompt 512 --output 1 --warmup 1 --reps 2 \
        --kv-type f32)
    d=$("$BUILD/ac-llama" bench "$tmp/model.gguf" --threads "$THREADS" --prompt 128 --output 32 --warmup 1 --reps 1 \
        --kv-type f32)
    "$AC_PYTHON" -c 'import json, sys
p, d = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print("prefill_b1_wall %.1f tok/s" % (512 / (min(r["prefill_ms"] for r in p["reps"]) / 1000)))
dm = d["reps"][0]["decode_ms"]
print("decode_b1_wall %.2f tok/s" % (len(dm) / (sum(dm) / 1000)))' "$p" "$d"
}
for r in $(seq 1 "$ROUNDS"); do
    "$bin" --threads "$THREADS" --model "$MODEL" >"$tmp/engine.$r"
    OMP_NUM_THREADS=$THREADS "$AC_PYTHON" bench/families/peer_torch_hybrid.py "$MODEL" "$THREADS" >"$tmp/torch.$r" 2>/dev/null
    llama_round >"$tmp/llama.$r"
    echo "round $r/$ROUNDS done" >&2
done
"$BUILD/autocompress" calibrate --model "$MODEL" --threads "$THREADS" --validate 10 --fit 6 --no-hidden \
    --data-dir "$tmp/var" --no-cache --json >"$tmp/cal.json" 2>/dev/null
}
"$AC_PYTHON" - "$tmp" "$ROUNDS" "$THREADS" "$load" "$MODEL" <<'PY'
import datetime, json, os, sys
tmp, rounds, threads, load, model = sys.argv[1:6]
rounds = int(rounds)
sys.path.insert(0, "bench")
from rounds import Rounds
R = Rounds(tmp, rounds, ("engine", "torch", "llama"))
runs, med, rng = R.runs, R.med, R.rng
e = runs["engine"][0]
params = e["params"]
cfg = json.load(open(os.path.join(model, "config.json")))
V, C = cfg["vocab_size"], cfg["hidden_size"]
flop_tok = 2 * (params - V * C)   # the projections a token runs (embedding lookup aside)
sg, bw = med("engine", "sgemm_gflops_wall"), med("engine", "triad_bandwidth_wall")
chk = dict(l.split()[:2] for l in open(os.path.join(tmp, "check")) if l.startswith("check_"))
out = ["# Model families: a Nemotron-H-shaped hybrid (random weights), CPU", ""]
out.append("Model: bench/families/make_hybrid.py (`%s`, %d layers: %d Mamba-2 mixers of %d heads x %d, state %d, "
           "%d groups; %d attention layers of %d/%d heads; %d squared-ReLU MLPs of %d; hidden %d; %.1fM "
           "parameters). Random weights: timing and the cost model only. %s" % (
               cfg["hybrid_override_pattern"], cfg["num_hidden_layers"], cfg["hybrid_override_pattern"].count("M"),
               cfg["mamba_num_heads"], cfg["mamba_head_dim"], cfg["ssm_state_size"], cfg["n_groups"],
               cfg["hybrid_override_pattern"].count("*"), cfg["num_attention_heads"], cfg["num_key_value_heads"],
               cfg["hybrid_override_pattern"].count("-"), cfg["intermediate_size"], C, params / 1e6,
               datetime.date.today().isoformat()))
out.append("")
out.append("Machine ceilings measured in the engine's processes (medians): sgemm %.1f GFLOP/s, triad %.2f GB/s. "
           "%s threads, %d rounds alternating engine / PyTorch / llama.cpp, each in a process of its own; load average "
           "before: %s." % (sg, bw, threads, rounds, load))
out.append("")
out.append("| phase | autocompress tok/s (median, range) | llama.cpp F32 tok/s | PyTorch eager tok/s | vs llama.cpp | "
           "vs PyTorch | engine share of ceiling |")
out.append("|---|---:|---:|---:|---:|---:|---:|")
p_e, p_t, p_l = med("engine", "prefill_b1_wall"), med("torch", "prefill_b1_wall"), med("llama", "prefill_b1_wall")
d_e, d_t, d_l = med("engine", "decode_b1_wall"), med("torch", "decode_b1_wall"), med("llama", "decode_b1_wall")
out.append("| prefill 1 x 512 | %.1f (%s) | %.1f (%s) | %.1f (%s) | %.2fx | %.2fx | %.0f%% of sgemm (%.1f GFLOP/s in "
           "projections) |" % (p_e, rng("engine", "prefill_b1_wall"), p_l, rng("llama", "prefill_b1_wall"), p_t,
                               rng("torch", "prefill_b1_wall"), p_e / p_l, p_e / p_t, 100 * p_e * flop_tok / 1e9 / sg,
                               p_e * flop_tok / 1e9))
out.append("| decode b1 (prompt 128) | %.2f (%s) | %.2f (%s) | %.2f (%s) | %.2fx | %.2fx | %.0f%% of triad (%.2f GB/s "
           "of weights) |" % (d_e, rng("engine", "decode_b1_wall"), d_l, rng("llama", "decode_b1_wall"), d_t,
                              rng("torch", "decode_b1_wall"), d_e / d_l, d_e / d_t, 100 * d_e * params * 4 / 1e9 / bw,
                              d_e * params * 4 / 1e9))
out.append("")
out.append("llama.cpp: llama-cpp-python 0.3.36's libllama through BUILD/ac-llama bench (one process per run, "
           "llama-bench's timing), its nemotron_h on the engine's own F32 GGUF export with an F32 KV cache "
           "(tests/oracle/test_export_llamacpp_hybrid.py: the same logits within 1.7e-5); prefill the best of 2 "
           "requests of 512 tokens, decode 32 steps after 128.")
out.append("")
out.append("Peer: bench/families/peer_torch_hybrid.py on PyTorch %s (eager, fp32): its logits equal the engine's "
           "on 300 tokens within %s (prefill, chunked SSD) and %s (decode through its state cache), relative to "
           "the largest logit. CPU-time rates are in the raw outputs (engine_bench NAME, peer NAME_cpu). The "
           "engine's prefill runs the scan's recurrence (a chunked SSD prefill is not built; engine_bench's "
           "ssm_scan_b1 lines give the scan's rate and its share of the prefill): the "
           "projections are GEMMs, the scan is %d heads x %d x %d state per token per Mamba layer." % (
               next((l.split()[2].rstrip(",") for l in open(os.path.join(tmp, "torch.1")) if l.startswith("peer ")), "?"),
               chk.get("check_prefill_rel_err", "?"), chk.get("check_decode_rel_err", "?"), cfg["mamba_num_heads"],
               cfg["mamba_head_dim"], cfg["ssm_state_size"]))
cal = json.load(open(os.path.join(tmp, "cal.json")))
v = cal.get("validation", {})
out += ["", "## Cost model on the hybrid parent", ""]
out.append("`autocompress calibrate --model MODEL --no-hidden` (workload 1 x 256 + 64): %d timing entries (Mamba "
           "mixers at %s heads), held-out random archs with cut Mamba heads, attention heads and MLP widths and "
           "removed layers: latency MAPE %.1f%% (max %.1f%%), memory MAPE %.2f%% (max %.2f%%), naive "
           "weights+KV memory MAPE %.1f%%." % (
               cal.get("entries", 0),
               ", ".join(str(x) for x in sorted({e["mamba"]["n_heads"] for e in cal["tables"]["prefill"] if e.get("mamba")})),
               v.get("latency_mape_pct", float("nan")), v.get("latency_max_pct", float("nan")),
               v.get("memory_mape_pct", float("nan")), v.get("memory_max_pct", float("nan")),
               v.get("naive_memory_mape_pct", float("nan"))))
out.append("")
print("\n".join(out))
open("bench/results/families-hybrid.md", "w").write("\n".join(out) + "\n")
PY
