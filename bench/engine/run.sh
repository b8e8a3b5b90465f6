#!/bin/bash
# Engine speed against its peers: BUILD/tools/engine_bench (this engine, at fp32 and at
# bf16), bench/engine/bench_peers.py (PyTorch eager; llama.cpp through llama-cpp-python),
# same shapes and threads, each in a process of its own, alternating engine fp32 / engine
# bf16 / PyTorch / llama.cpp for ROUNDS rounds. The table gives wall-clock medians over
# the rounds (CPU-time rates beside, in the raw output), ratios, and the share of the
# machine ceilings reached (sgemm and bf16 GEMM GFLOP/s, triad GB/s, measured in the same
# processes); writes bench/results/engine.md.
# Usage: bench/engine/run.sh [BUILD] [THREADS] [--quick] ; env ROUNDS (5)
set -eu
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
THREADS=${2:-2}
QUICK=${3:-}
ROUNDS=${ROUNDS:-5}
source scripts/pyenv.sh >/dev/null
bin=$BUILD/tools/engine_bench
[ -x "$bin" ] || { echo "engine_bench not built: make BUILD=$BUILD $bin" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
    "$bin" --threads "$THREADS" --precision fp32 $QUICK >"$tmp/fp32.$r"
    "$bin" --threads "$THREADS" --precision bf16 $QUICK >"$tmp/bf16.$r"
    OMP_NUM_THREADS=$THREADS "$AC_PYTHON" bench/engine/bench_peers.py "$THREADS" $QUICK --torch-only >"$tmp/torch.$r"
    # a peer that crashes leaves its rows n/a and says how it ended (not the engine's failure)
    OMP_NUM_THREADS=$THREADS "$AC_PYTHON" bench/engine/bench_peers.py "$THREADS" $QUICK --llamacpp-only \
        >"$tmp/llama.$r" 2>"$tmp/llama.err" || echo "llamacpp_exit $? (llama.cpp's process died; see its stderr)" >>"$tmp/llama.$r"
    echo "round $r/$ROUNDS done" >&2
done
"$AC_PYTHON" - "$tmp" "$ROUNDS" "$THREADS" "$load" "$QUICK" <<'PY'
import sys, datetime, platform, statistics
tmp, rounds, threads, load, quick = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
sys.path.insert(0, "bench")
from rounds import Rounds
R = Rounds(tmp, rounds, ("fp32", "bf16", "torch", "llama"))
runs, med, rng = R.runs, R.med, R.rng
n_params = med("fp32", "params")
weights = n_params * 4
flop_tok = 2 * (n_params - 49152 * 576 - 576)
sg = statistics.median([x for k in ("fp32", "bf16") for x in [r.get("sgemm_gflops_wall") for r in runs[k]] if x])
g16 = med("bf16", "gemm16_gflops_wall")
bw = statistics.median([x for k in ("fp32", "bf16") for x in [r.get("triad_bandwidth_wall") for r in runs[k]] if x])
T = "128" if quick else "512"
work = [("prefill B=1 x %s" % T, "prefill_b1", "flop"), ("prefill B=8 x %s" % T, "prefill_b8", "flop"),
        ("decode B=1 (ctx 128)", "decode_b1", "bytes"), ("decode B=8 (ctx 128)", "decode_b8", "bytes8"),
        ("train step (CE, fwd+bwd+AdamW)", "train_step", "train")]
def share(kind, v, ceil_gemm, wbytes):
    if v is None:
        return ""
    if kind == "flop":
        return "%.0f%%" % (100 * v * flop_tok / 1e9 / ceil_gemm)
    if kind == "train":
        return "%.0f%%" % (100 * 3 * v * flop_tok / 1e9 / ceil_gemm)
    per = wbytes if kind == "bytes" else wbytes / 8
    return "%.0f%% of triad" % (100 * v * per / 1e9 / bw)
f = lambda v: "%.1f" % v if v else "n/a"
x = lambda a, b: "%.2fx" % (a / b) if a and b else "n/a"
rows = []
for name, key, kind in work:
    e32, e16 = med("fp32", key + "_wall"), med("bf16", key + "_wall")
    tv, lv = med("torch", "torch_%s_wall" % key), med("llama", "llamacpp_%s_wall" % key)
    rows.append("| %s | %s (%s) | %s (%s) | %s | %s | %s | %s | %s | %s / %s |" % (
        name, f(e32), rng("fp32", key + "_wall"), f(e16), rng("bf16", key + "_wall"), x(e16, e32), f(tv), x(e32, tv),
        f(lv), x(e32, lv), share(kind, e32, sg, weights), share(kind, e16, g16, weights / 2)))
out = ["# Engine speed (CPU backend)", "",
       "Wall-clock tokens/s, medians over %d rounds (range in brackets); each round runs the engine at fp32, the "
       "engine at bf16, PyTorch eager and llama.cpp, each in a process of its own, in turn." % rounds,
       "Measured %s UTC on %s, %s threads, load average at start %s%s." % (
           datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), platform.node(), threads, load,
           " (quick mode: T=128, fewer steps)" if quick else ""),
       "Model: SmolLM2-135M shapes (hidden 576, 30 layers, 9/3 heads, head_dim 64, FFN 1536, vocab 49152, tied), "
       "random weights. bf16: GEMM operands rounded to bf16, fp32 accumulation (oneDNN %s); served models keep a "
       "bf16 copy of their weights, so decode streams half the bytes." % runs["bf16"][0].get("gemm_kernel", "?"),
       "Machine ceilings measured in the same processes (medians): sgemm %.1f GFLOP/s and bf16 GEMM %.1f GFLOP/s "
       "(%s^3), triad %.2f GB/s." % (sg, g16 or 0, "1024" if quick else "2048", bw), "",
       "| workload | engine fp32 | engine bf16 | bf16/fp32 | PyTorch eager | engine fp32/torch | llama.cpp | "
       "engine fp32/llama.cpp | share of ceiling fp32 / bf16 |",
       "|---|---|---|---|---|---|---|---|---|"] + rows + ["",
       "Ceiling shares: prefill and training count projection FLOPs (2 x non-embedding params per token, x3 for "
       "training) against the sgemm rate (fp32) or the bf16 GEMM rate (bf16); decode counts one read of all weights "
       "per step (4 bytes a weight at fp32, 2 at bf16; per row for B=8, where weights are shared) against triad "
       "bandwidth, which a read-only stream can pass. llama.cpp runs the SmolLM2 GGUF named in the raw output "
       "(batch 8 and training are not measured there)%s. Raw output of the last round:" % (
           "; on this host its process died in every round (exit %s, in llama_decode: ggml's AMX_INT8 build; "
           "llama.cpp's own segfault, so its rows are n/a)" % int(runs["llama"][0]["llamacpp_exit"])
           if all("llamacpp_exit" in r for r in runs["llama"]) else ""), "", "```"]
for k in ("fp32", "bf16", "torch", "llama"):
    out += [l.rstrip() for l in open("%s/%s.%d" % (tmp, k, rounds))]
out.append("```")
text = "\n".join(out) + "\n"
open("bench/results/engine.md", "w").write(text)
print(text)
PY
