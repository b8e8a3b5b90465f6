#!/bin/bash
# bench/costmodel/run.sh — builds and runs the cost-model benchmark (costmodel_bench):
# calibration of a SmolLM2-135M-shaped parent at batch 1 and 8 (prompt 256 + output 64),
# the held-out validation table, calibration cost, estimate speed and the machine's
# GEMM / memory-copy ceilings. Writes bench/results/costmodel_<device>.md.
#   DEVICE=cuda:0 bench/costmodel/run.sh     (same script on a GPU; build with CUDA=1)
# Extra arguments go to costmodel_bench (e.g. --validate-reps 5). Runs under nice -n -5
# when permitted (timings on a shared machine are noisy), else at normal priority.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
DEVICE=${DEVICE:-cpu}
MAKEFLAGS_CUDA=""
[[ "$DEVICE" == cuda* ]] && MAKEFLAGS_CUDA="CUDA=1"
make -j"$(nproc)" $MAKEFLAGS_CUDA BUILD="$BUILD" "$BUILD/tools/costmodel_bench" >/dev/null
out="bench/results/costmodel_${DEVICE//:/}.md"
nice_cmd=""
if nice -n -5 true 2>/dev/null; then nice_cmd="nice -n -5"; fi
$nice_cmd "$BUILD/tools/costmodel_bench" --device "$DEVICE" --batch 1,8 --prompt 256 --output 64 --out "$out" "$@"
echo "wrote $out"
