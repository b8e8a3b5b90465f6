#!/bin/bash
# The SmolLM2-135M-Instruct evaluation behind bench/results/eval_smollm2.md: each of the
# eight benchmarks at 500 seeded items (all where fewer), one process per task so a
# finished task's JSON survives if a later one is stopped. Runs niced (CPU-heavy).
#   bench/eval/run_smollm2.sh [BUILD] [LIMIT]     (results in bench/results/eval_smollm2_LIMIT/)
# OMP_WAIT_POLICY=PASSIVE: on a shared, oversubscribed machine spinning threads only burn
# the CPU other processes need.
set -u
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
LIMIT=${2:-500}
BIN=${AC_EVAL_BIN:-$BUILD/autocompress}
MODEL=$(scripts/fetch-models.sh)
OUT=bench/results/eval_smollm2_$LIMIT
mkdir -p "$OUT"
export AC_SHARED=${AC_SHARED:-$(cd .. && pwd)/shared}
for t in winogrande piqa lambada_openai openbookqa arc_easy boolq arc_challenge hellaswag; do
    [ -s "$OUT/$t.json" ] && continue
    OMP_WAIT_POLICY=PASSIVE nice -n 10 "$BIN" eval "$MODEL" --tasks "$t" --limit "$LIMIT" --seed 1234 --threads "${THREADS:-1}" \
        --json "$OUT/$t.json" --log-samples "$OUT/$t.samples.jsonl" >"$OUT/$t.log" 2>&1
    echo "$t: exit $?"
done
