#!/bin/bash
# Distillation training speed on SmolLM2-135M shapes (CPU): autocompress's KD step
# (build/tools/distill_bench) beside PyTorch eager's same step (torch_step.py), same
# threads, as a ratio, with the machine's sgemm and triad ceilings from the same run.
# Usage: bench/distill/run.sh [BUILD] ; env THREADS (2), BATCH (1), SEQ (128), STEPS (3),
# OUT (bench/results/distill_speed.md; "-" prints only).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
THREADS=${THREADS:-2}
BATCH=${BATCH:-1}
SEQ=${SEQ:-128}
STEPS=${STEPS:-3}
OUT=${OUT:-bench/results/distill_speed.md}
source scripts/pyenv.sh >/dev/null
ARGS=(--threads "$THREADS" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS")
c=$("$BUILD/tools/distill_bench" "${ARGS[@]}")
t=$(OMP_NUM_THREADS=$THREADS "$AC_PYTHON" bench/distill/torch_step.py "${ARGS[@]}")
"$AC_PYTHON" - "$c" "$t" "$OUT" <<'PY'
import json, os, platform, sys
c, t, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
tokens = c["batch"] * c["seq"]
flops = (2.0 * c["teacher_params"] + 6.0 * c["student_params"]) * tokens
# fp32 bytes: teacher weights read once; student weights read in forward and backward, gradient written and read,
# AdamW reads and writes weights and both moments
bytes_ = 4.0 * (c["teacher_params"] + c["student_params"] * (2 + 2 + 6))
lines = [
    "# Distillation step speed, SmolLM2-135M shapes, CPU",
    "",
    "One step = teacher (SmolLM2-135M shape, %d params) forward + student (hidden 512, FFN 1152, %d params) "
    "forward/backward on the KD loss + AdamW; batch %d x %d tokens, %d threads, random weights, best of %d steps "
    "after one warm-up (%s)." % (c["teacher_params"], c["student_params"], c["batch"], c["seq"], c["threads"],
                                  c["steps"], platform.node()),
    "",
    "| implementation | training tokens/s (best) | tokens/s (mean) | step s (best) |",
    "|---|---:|---:|---:|",
    "| autocompress (C, OpenBLAS) | %.1f | %.1f | %.3f |" % (c["tokens_per_s"], c["mean_tokens_per_s"], c["best_step_s"]),
    "| %s eager | %.1f | %.1f | %.3f |" % (t["impl"], t["tokens_per_s"], t["mean_tokens_per_s"], t["best_step_s"]),
    "",
    "Ratio autocompress / PyTorch: **%.2fx** (best), %.2fx (mean)." % (
        c["tokens_per_s"] / t["tokens_per_s"], c["mean_tokens_per_s"] / t["mean_tokens_per_s"]),
    "",
    "Machine ceilings measured in the same run: sgemm %.1f GFLOP/s (1024^3), STREAM triad %.2f GB/s." % (
        c["sgemm_gflops"], c["triad_gbs"]),
    "",
    "Share of the GEMM ceiling: a step costs about %.1f GFLOP (2·N·T for the teacher's forward, 6·N·T for the "
    "student's forward and backward, attention scores left out), so autocompress runs at %.1f GFLOP/s, **%.0f%%** "
    "of sgemm, and PyTorch at %.1f GFLOP/s (%.0f%%). The step is compute-bound: AdamW and the weight reads move "
    "about %.1f GB, %.0f%% of what the triad bandwidth allows in the step's time." % (
        flops / 1e9, flops / c["best_step_s"] / 1e9, 100 * flops / c["best_step_s"] / 1e9 / c["sgemm_gflops"],
        flops / t["best_step_s"] / 1e9, 100 * flops / t["best_step_s"] / 1e9 / c["sgemm_gflops"],
        bytes_ / 1e9, 100 * bytes_ / c["best_step_s"] / 1e9 / c["triad_gbs"]),
    "",
    "Load average when the table was written: %.1f on %d cores (other work on the machine slows both "
    "implementations and the ceilings alike; compare the ratio, not the absolute numbers)." % (
        os.getloadavg()[0], os.cpu_count()),
]
text = "\n".join(lines) + "\n"
print(text)
if out != "-":
    open(out, "w").write(text)
PY
