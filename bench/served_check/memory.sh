#!/bin/bash
# bench/served_check/memory.sh — the memory a served model takes, measured where it is
# served: a fresh process each. For SmolLM2-135M (as an F32 GGUF and the Q4_1 GGUF the
# engine dequantizes) and stories260K, at batch 1, PROMPT + OUTPUT tokens (256 + 64):
#   1. `autocompress generate` (the built-in engine as a user serves it): its peak RSS, read
#      from /proc while it runs (scripts/peak_rss.py);
#   2. `autocompress measure` (what jobs report): the process's peak, the engine's buffers,
#      the weights, and the RSS before the model;
#   3. llama.cpp on the same GGUF (ac-llama bench, the target engine's measurement): its
#      peak RSS and the buffers it reports, where the helper is installed.
# Each row is the median of ROUNDS (5) fresh processes, the engines alternating. Prints and
# writes bench/results/served_memory.md with the machine's ceilings (GEMM FLOP/s and
# memory bandwidth, measured in the same run).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${AC_BIN:-$PWD/build/autocompress}
HELPER=$(dirname "$BIN")/ac-llama
export AC_SHARED=${AC_SHARED:-$(cd .. && pwd)/shared}
Q41=${MODEL:-$(scripts/fetch-models.sh)}
PROMPT=${PROMPT:-256}
OUTPUT=${OUTPUT:-64}
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-2}
OUT=${OUT:-/tmp/ac-served-memory}
RES=${RES:-bench/results/served_memory.md}
source scripts/pyenv.sh >/dev/null
make -s -j2 all >/dev/null
mkdir -p "$OUT"
build/tools/ceilings_probe "$THREADS" >"$OUT/ceilings.txt"
F32=$OUT/smollm2.f32.gguf
[ -s "$F32" ] || "$BIN" export "$Q41" --format gguf --dtype fp32 --out "$F32" >/dev/null
STORIES=$AC_SHARED/data/models/stories260K/stories260K.bin
python3 - "$BIN" "$HELPER" "$PROMPT" "$OUTPUT" "$ROUNDS" "$THREADS" "$OUT/ceilings.txt" "$RES" \
    "SmolLM2-135M F32 GGUF=$F32" "SmolLM2-135M Q4_1 GGUF=$Q41" "stories260K llama2.c=$STORIES" <<'EOF'
import json, os, statistics, subprocess, sys

sys.path.insert(0, "scripts")
from peak_rss import peak_rss

BIN, HELPER, PROMPT, OUTPUT, ROUNDS, THREADS, CEIL, RES = sys.argv[1:9]
PROMPT, OUTPUT, ROUNDS, THREADS = int(PROMPT), int(OUTPUT), int(ROUNDS), int(THREADS)
MODELS = [a.split("=", 1) for a in sys.argv[9:]]
MIB = 2 ** 20


def json_of(cmd):
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


ceil = dict(l.split() for l in open(CEIL) if len(l.split()) == 2)
rows = []
for name, path in MODELS:
    gen, meas, lc = [], [], []
    for _ in range(ROUNDS):
        gen.append(peak_rss([BIN, "generate", path, "--prompt", "Once upon a time", "--max-tokens", str(OUTPUT),
                             "--threads", str(THREADS)]))
        meas.append(json_of([BIN, "measure", "--model", path, "--prompt", str(PROMPT), "--output", str(OUTPUT),
                             "--threads", str(THREADS), "--json"]))
        if path.endswith(".gguf") and os.access(HELPER, os.X_OK):
            lc.append(json_of([HELPER, "bench", path, "--threads", str(THREADS), "--batch", "1", "--prompt",
                               str(PROMPT), "--output", str(OUTPUT), "--warmup", "1", "--reps", "3"]))
    med = lambda k: statistics.median(m[k] for m in meas)
    row = {"model": name, "generate": statistics.median(gen), "measure": med("process_peak_bytes"),
           "backend": med("backend_peak_bytes"), "weights": med("weights_bytes"),
           "before": med("rss_before_model_bytes"), "latency": med("latency_ms")}
    if lc:
        row["llama"] = statistics.median(b["rss_peak"] for b in lc)
        row["llama_model"] = statistics.median(b["buffers"]["model"] for b in lc)
    rows.append(row)

lines = ["# Served memory: the built-in engine and llama.cpp, a fresh process each", "",
         "Batch 1, %d prompt + %d output tokens, %d threads, the median of %d fresh processes per column "
         "(generate and measure alternating with llama.cpp's helper). `bench/served_check/memory.sh`." %
         (PROMPT, OUTPUT, THREADS, ROUNDS), "",
         "Machine ceilings (same run): sgemm %.1f GFLOP/s, triad %.2f GB/s (%d threads)." %
         (float(ceil.get("sgemm_gflops", 0)), float(ceil.get("triad_gbs", 0)), THREADS), "",
         "| model | generate: peak RSS | measure: process peak | engine buffers | weights (fp32) | RSS before the model "
         "| llama.cpp: peak RSS (its model buffer) | measure latency |",
         "|---|---|---|---|---|---|---|---|"]
for r in rows:
    lcs = "%.1f MiB (%.1f MiB)" % (r["llama"] / MIB, r["llama_model"] / MIB) if "llama" in r else "-"
    lines.append("| %s | %.1f MiB | %.1f MiB | %.1f MiB | %.1f MiB | %.1f MiB | %s | %.1f ms |" % (
        r["model"], r["generate"] / MIB, r["measure"] / MIB, r["backend"] / MIB, r["weights"] / MIB,
        r["before"] / MIB, lcs, r["latency"]))
text = "\n".join(lines) + "\n"
print(text)
with open(RES, "w") as f:
    f.write(text)
EOF
