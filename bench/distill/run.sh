#!/bin/bash
# Distillation training speed on SmolLM2-135M shapes (CPU): autocompress's KD step
# (build/tools/distill_bench, the product's distill_run) at fp32 and at bf16 (oneDNN,
# engine/cpu_mm16.h) beside PyTorch eager's same step (torch_step.py), same threads,
# each in a process of its own, alternating fp32 / bf16 / PyTorch for ROUNDS rounds;
# medians over the rounds of each process's best step, with the machine's sgemm, bf16
# GEMM and triad ceilings from the same processes.
# Usage: bench/distill/run.sh [BUILD] ; env THREADS (2), BATCH (1), SEQ (128), STEPS (3),
# ROUNDS (5), OUT (bench/results/distill_speed.md; "-" prints only).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
THREADS=${THREADS:-2}
BATCH=${BATCH:-1}
SEQ=${SEQ:-128}
STEPS=${STEPS:-3}
ROUNDS=${ROUNDS:-5}
OUT=${OUT:-bench/results/distill_speed.md}
source scripts/pyenv.sh >/dev/null
ARGS=(--threads "$THREADS" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS")
runs=$(mktemp)
trap 'rm -f "$runs"' EXIT
for r in $(seq 1 "$ROUNDS"); do
    "$BUILD/tools/distill_bench" "${ARGS[@]}" --precision fp32 >>"$runs"
    "$BUILD/tools/distill_bench" "${ARGS[@]}" --precision bf16 >>"$runs"
    OMP_NUM_THREADS=$THREADS "$AC_PYTHON" bench/distill/torch_step.py "${ARGS[@]}" >>"$runs"
    echo "round $r/$ROUNDS done" >&2
done
"$AC_PYTHON" - "$runs" "$OUT" <<'PY'
import json, os, platform, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = sys.argv[2]
f32 = [r for r in runs if r["impl"] == "autocompress" and r["precision"] == "fp32"]
b16 = [r for r in runs if r["impl"] == "autocompress" and r["precision"] == "bf16"]
pt = [r for r in runs if r["impl"] != "autocompress"]
med = lambda rs, k: statistics.median(r[k] for r in rs)
rng = lambda rs, k: "%.1f–%.1f" % (min(r[k] for r in rs), max(r[k] for r in rs))
c = f32[0]
tokens = c["batch"] * c["seq"]
flops = (2.0 * c["teacher_params"] + 6.0 * c["student_params"]) * tokens
# fp32 bytes: teacher weights read once; student weights read in forward and backward, gradient written and read,
# AdamW reads and writes weights and both moments
bytes_ = 4.0 * (c["teacher_params"] + c["student_params"] * (2 + 2 + 6))
sg, g16, tri = med(f32 + b16, "sgemm_gflops"), med(b16, "gemm16_gflops"), med(f32 + b16, "triad_gbs")
rows = [("autocompress fp32 (OpenBLAS %s)" % c["gemm_kernel"], f32, sg),
        ("autocompress bf16 (oneDNN %s)" % b16[0]["gemm_kernel"], b16, g16),
        ("%s eager fp32" % pt[0]["impl"], pt, sg)]
lines = [
    "# Distillation step speed, SmolLM2-135M shapes, CPU",
    "",
    "One step = teacher (SmolLM2-135M shape, %d params) forward + student (hidden 512, FFN 1152, %d params) "
    "forward/backward on the KD loss + AdamW; batch %d x %d tokens, %d threads, random weights. Each row is %d "
    "processes of its own, alternating fp32 / bf16 / PyTorch; a process times %d steps after one warm-up and gives "
    "its best; the table gives the median over the processes and their range (%s)." % (
        c["teacher_params"], c["student_params"], c["batch"], c["seq"], c["threads"], len(f32), c["steps"],
        platform.node()),
    "",
    "| implementation | training tokens/s (median) | range | step s (median) | GFLOP/s | share of its GEMM ceiling |",
    "|---|---:|---:|---:|---:|---:|",
]
for name, rs, ceil in rows:
    step = med(rs, "best_step_s")
    lines.append("| %s | %.1f | %s | %.3f | %.1f | %.0f%% |" % (
        name, med(rs, "tokens_per_s"), rng(rs, "tokens_per_s"), step, flops / step / 1e9,
        100 * flops / step / 1e9 / ceil))
lines += [
    "",
    "bf16 / fp32: **%.2fx** (medians; the pairs of one round: %s). autocompress fp32 / PyTorch: **%.2fx**." % (
        med(b16, "tokens_per_s") / med(f32, "tokens_per_s"),
        ", ".join("%.2f" % (b["tokens_per_s"] / a["tokens_per_s"]) for a, b in zip(f32, b16)),
        med(f32, "tokens_per_s") / med(pt, "tokens_per_s")),
    "",
    "Machine ceilings measured in the same processes (medians): sgemm %.1f GFLOP/s and bf16 GEMM %.1f GFLOP/s "
    "(1024^3, fp32 accumulation), STREAM triad %.2f GB/s." % (sg, g16, tri),
    "",
    "A step costs about %.1f GFLOP (2·N·T for the teacher's forward, 6·N·T for the student's forward and backward, "
    "attention scores left out). At bf16 the GEMMs are no longer most of the step: AdamW and the fp32 weight, "
    "gradient and moment traffic move about %.1f GB a step (%.0f%% of the triad bandwidth over the bf16 step), "
    "and norms, attention and the KD loss stay fp32. The bf16 weights are rounded once per optimizer step "
    "(the frozen teacher's once per run) and kept: %.0f MB of copies." % (
        flops / 1e9, bytes_ / 1e9, 100 * bytes_ / med(b16, "best_step_s") / 1e9 / tri,
        med(b16, "gemm16_copies_bytes") / 1e6),
    "",
    "Load average when the table was written: %.1f on %d cores (other work on the machine slows every row and "
    "the ceilings alike; compare the ratios, not the absolute numbers)." % (os.getloadavg()[0], os.cpu_count()),
]
text = "\n".join(lines) + "\n"
print(text)
if out != "-":
    open(out, "w").write(text)
PY
