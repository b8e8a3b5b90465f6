#!/bin/bash
# bench/gpu_check.sh — the CUDA backend's check on a GPU machine, in one call (< 8 min):
# builds with CUDA=1 (for the present GPU's SM only, unless CUDA_ARCHS is set), runs the
# CUDA unit tests (every op vs the CPU backend, the whole model vs the CPU), runs the real
# stories260K checkpoint on cuda:0 against the CPU, measures the two ceilings (GEMM
# TFLOP/s, device copy GB/s) and SmolLM2-135M-shaped prefill/decode tokens/s in fp32 and
# bf16 with their share of those ceilings, distillation tokens/s (the product's loop) at
# fp32 and bf16 beside the same GEMM ceilings, the cost model's held-out validation on
# the device, and one short real job (stories260K, `autocompress run`) on it. Prints
# progress, stops cleanly at its time limit (LIMIT_S, default 480: the steps left are
# marked skipped), prints a table last and writes it to bench/results/gpu_h200.md on an
# H200, else bench/results/gpu_check-<host>-<date>.md. Exit status 0 only when every
# check that ran passed.
# PREBUILT=1: compile nothing; the binaries in $BUILD were built on another machine with
# the same CUDA major version (`make CUDA=1 CUDA_ARCHS=<this GPU's SM> ARCH=-march=x86-64-v3`)
# and carried here, for GPU machines without the project's packages; their libraries then
# come from LD_LIBRARY_PATH.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
DEVICE=${DEVICE:-cuda:0}
JOBS=$(nproc 2>/dev/null || echo 4)
LOG=${GPU_LOG:-$(mktemp -d)}   # GPU_LOG: keep the logs there
LIMIT_S=${LIMIT_S:-480}
T0=$(date +%s)
fail=0
left() { echo $(( LIMIT_S - ( $(date +%s) - T0 ) )); }
say() { printf '== %s\n' "$*"; }

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIPPED: no CUDA device (nvidia-smi finds no GPU); gpu_check needs a GPU machine"
    exit 0
fi
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
CC_NUM=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
ARCHS=${CUDA_ARCHS:-$CC_NUM}
say "GPU: $GPU_NAME (sm_$CC_NUM), building for: $ARCHS"

t0=$(date +%s)
if [ "${PREBUILT:-0}" = 1 ]; then
    for b in autocompress tests/test_cuda_ops tests/test_cuda_model tests/test_cuda_devices tests/test_cuda_nccl \
             tools/cuda_bench tools/distill_bench; do
        [ -x "$BUILD/$b" ] || { echo "gpu_check: PREBUILT=1 but $BUILD/$b is missing"; exit 1; }
    done
    say "prebuilt binaries in $BUILD"
else
    rm -f "$BUILD"/obj/cuda/*.o   # the Makefile's nvcc rule tracks no header dependencies
    if ! timeout 300 make -j"$JOBS" CUDA=1 BUILD="$BUILD" CUDA_ARCHS="$ARCHS" \
            "$BUILD"/autocompress "$BUILD"/tests/test_cuda_ops "$BUILD"/tests/test_cuda_model \
            "$BUILD"/tests/test_cuda_devices "$BUILD"/tests/test_cuda_nccl "$BUILD"/tools/cuda_bench \
            "$BUILD"/tools/distill_bench >"$LOG/build" 2>&1; then
        tail -40 "$LOG/build"
        echo "gpu_check: CUDA=1 build failed"
        exit 1
    fi
    say "build: $(( $(date +%s) - t0 )) s"
    # the cost model's bench belongs to another area: optional here
    make -j"$JOBS" CUDA=1 BUILD="$BUILD" CUDA_ARCHS="$ARCHS" "$BUILD"/tools/costmodel_bench >>"$LOG/build" 2>&1 ||
        echo "costmodel_bench did not build: its row will be empty"
fi

run() {   # name timeout_s command...: runs, keeps output in $LOG/name, records failure
    local name=$1 to=$2; shift 2
    local rest; rest=$(left)
    if [ "$rest" -lt 20 ]; then   # the time limit: what is left is skipped, not failed
        say "$name: SKIPPED (time limit ${LIMIT_S}s reached)"
        echo "SKIPPED: time limit" >"$LOG/$name"
        return 0
    fi
    [ "$to" -gt $((rest - 10)) ] && to=$((rest - 10))
    say "$name (at $(( $(date +%s) - T0 )) s of ${LIMIT_S})"
    timeout "$to" "$@" >"$LOG/$name" 2>&1
    local rc=$?
    if [ $rc -eq 0 ]; then
        tail -3 "$LOG/$name"
        return 0
    fi
    fail=$((fail + 1))
    echo "FAILED: $name (exit $rc)"; tail -30 "$LOG/$name"
    return 1
}

run test_cuda_devices 60 "$BUILD"/tests/test_cuda_devices
run test_cuda_nccl 60 "$BUILD"/tests/test_cuda_nccl
run test_cuda_ops 180 "$BUILD"/tests/test_cuda_ops
run test_cuda_model 120 "$BUILD"/tests/test_cuda_model

STORIES=""
for d in "${AC_SHARED:-}/data" shared/data ../shared/data; do
    [ -f "$d/models/stories260K/stories260K.bin" ] && { STORIES="$d/models/stories260K/stories260K.bin"; break; }
done
if [ -n "$STORIES" ]; then
    run stories 120 "$BUILD"/tools/cuda_bench compare --device "$DEVICE" --model "$STORIES" --steps 64
else
    echo "stories260K not found (set AC_SHARED): SKIPPED" >"$LOG/stories"
    say "stories260K checkpoint not found: SKIPPED"
fi
run ceilings 120 "$BUILD"/tools/cuda_bench ceilings --device "$DEVICE"
run smollm_fp32 120 "$BUILD"/tools/cuda_bench model --device "$DEVICE" --prec fp32 --T 512 --steps 128
run smollm_bf16 120 "$BUILD"/tools/cuda_bench model --device "$DEVICE" --prec bf16 --T 512 --steps 128
# the Nemotron-H-shaped hybrids (random weights): Mamba-2 mixers, attention, and MLPs or
# sigmoid-routed MoE layers (bench/cuda/*.json)
for h in hybrid moe; do
    run nemotron_${h}_fp32 120 "$BUILD"/tools/cuda_bench model --device "$DEVICE" --prec fp32 --T 512 --steps 128 \
        --arch bench/cuda/nemotron_h_$h.json --train
done
# the hybrid with the Mamba-2 scan step by step (prefill and training), beside the chunked form above
run nemotron_hybrid_fp32_recurrent 120 "$BUILD"/tools/cuda_bench model --device "$DEVICE" --prec fp32 --T 512 \
    --steps 16 --arch bench/cuda/nemotron_h_hybrid.json --train --scan recurrent
# distillation: the product's loop (teacher SmolLM2-135M shape, student hidden 512)
for p in fp32 bf16; do
    run distill_$p 120 "$BUILD"/tools/distill_bench --device "$DEVICE" --precision $p --batch 4 --seq 256 --steps 5
done
# data-parallel distillation over the GPUs (one process each, NCCL) against one process,
# on a stories260K student pruned here; needs two GPUs
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ -n "$STORIES" ] && [ "$NGPU" -ge 2 ]; then
    DD=$(cd "$(dirname "$STORIES")/../.." && pwd)
    python3 - "$LOG/dp_arch.json" <<'PY'
import json, sys
lay = lambda s: {"source_layer": s, "attention": {"n_heads": 8, "n_kv_heads": 4}, "mlp": {"ffn_dim": 86}}
json.dump({"family": "llama", "vocab_size": 512, "hidden_size": 64, "head_dim": 8, "max_position_embeddings": 512,
           "rope_theta": 10000.0, "rope_scaling": None, "norm_eps": 1e-5, "tie_word_embeddings": True,
           "layers": [lay(s) for s in (0, 1, 3, 4)]}, open(sys.argv[1], "w"))
PY
    "$BUILD"/autocompress prune "$STORIES" --arch "$LOG/dp_arch.json" --out "$LOG/dp_s" \
        --calib "$DD/text/tinystories/validation_100.txt" --calib-tokens 2048 >"$LOG/dp_prune" 2>&1
    DPA=(--parent "$STORIES" --student "$LOG/dp_s" --data "$DD/text/tinystories/validation_100.txt" --tokens 8192
         --batch 4 --seq 64 --accum 2 --ckpt-every 0 --eval-every 0)
    run dp_one 90 "$BUILD"/autocompress distill "${DPA[@]}" --device cuda:0 --out "$LOG/dp_one.model"
    run dp_two 90 "$BUILD"/autocompress distill "${DPA[@]}" --ranks 2 --device cuda --out "$LOG/dp_two.model"
fi
# one short real job on the device: stories260K, a params limit, small budgets
if [ -n "$STORIES" ]; then
    DATA_DIR=$(cd "$(dirname "$STORIES")/../.." && pwd)   # server paths take no '..'
    TXT=$DATA_DIR/text/tinystories/validation_100.txt
    cat >"$LOG/job.json" <<EOF
{"name": "gpu-check", "model": {"path": "$STORIES", "tokenizer": "$(dirname "$STORIES")/tok512.bin"},
 "target": {"device": "$DEVICE", "precision": "bf16", "workload": {"batch_size": 1, "prompt_tokens": 32, "output_tokens": 8}},
 "constraints": {"params": 200000}, "budgets": {"search_tokens": 8192, "distill_tokens": 16384},
 "data": {"calibration": "$TXT", "distillation": "$TXT"},
 "evaluation": {"tasks": ["lambada_openai"], "limit": 10, "seed": 1234}, "export": ["gguf"]}
EOF
    AC_SHARED=$(dirname "$DATA_DIR") run job 150 "$BUILD"/autocompress run "$LOG/job.json" --out "$LOG/jobdir"
fi
# the cost model's held-out latency/memory errors on the GPU (owned by the cost-model
# bench; cut off after 150 s so the whole check stays under 8 minutes)
if [ -x "$BUILD"/tools/costmodel_bench ] && [ "$(left)" -gt 60 ]; then
    say costmodel
    timeout $(( $(left) - 30 < 150 ? $(left) - 30 : 150 )) "$BUILD"/tools/costmodel_bench --device "$DEVICE" --batch 1 --prompt 256 --output 64 >"$LOG/costmodel" 2>&1 ||
        echo "costmodel_bench: exit $? (not counted as a CUDA failure; see $LOG/costmodel)"
fi

val() { awk -v k="$2" '$1 == k { print $2 }' "$LOG/$1" 2>/dev/null | tail -1; }
worst() {   # worst CUDAOP/CUDAMODEL error in log $1 among names matching $2 (awk regex)
    awk -v re="$2" '($1 == "CUDAOP" || $1 == "CUDAMODEL") && $2 ~ re { if (n == "" || $3 + 0 > m) { m = $3 + 0; n = $2 } }
        END { if (n == "") print "-"; else printf "%.2e (%s)\n", m, n }' "$LOG/$1" 2>/dev/null
}
share() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.1f%%", 100 * a / b; else print "-" }'; }

F32=$(val ceilings gemm_fp32_TFLOPs); B16=$(val ceilings gemm_bf16_TFLOPs); BW=$(val ceilings copy_GBps)
NOPS=$(cat "$LOG"/test_cuda_ops "$LOG"/test_cuda_model 2>/dev/null | grep -c '^CUDA')
mkdir -p bench/results
OUT=bench/results/gpu_check-$(hostname -s)-$(date -u +%Y%m%dT%H%MZ).md
case "$GPU_NAME" in *H200*) OUT=bench/results/gpu_h200.md ;; esac
jv() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])[sys.argv[2]])' "$LOG/$1" "$2" 2>/dev/null || echo "-"; }
{
    echo "# gpu_check: $GPU_NAME (sm_$CC_NUM), $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo
    echo "| check | result |"
    echo "|---|---|"
    echo "| op/model comparisons vs CPU | $NOPS checked; failures: $fail step(s) failed |"
    echo "| worst fp32 op (tol 1e-5) | $(worst test_cuda_ops '^(gemm_fp32|rms|rope|attn|swiglu|embed|xent|kl|add|axpy|scale|dot|sumsq|fill|bias|colsum|mask|group|adamw|ssm|gated|relu2)') |"
    echo "| worst bf16/fp16 GEMM (tol 1e-2) | $(worst test_cuda_ops '^gemm_(bf16|fp16)') |"
    echo "| worst whole-model (tol 1e-4) | $(worst test_cuda_model '.') |"
    echo "| worst whole-model per family (tol 1e-4) | llama $(worst test_cuda_model '^[a-z_0-9]+$'); qwen2_moe $(worst test_cuda_model '^qwen2_moe/'); olmoe $(worst test_cuda_model '^olmoe/'); nemotron_h $(worst test_cuda_model '^nemotron_h/') |"
    echo "| stories260K greedy tokens equal to CPU | $(val stories greedy_tokens_equal)/$(val stories model_tokens); logits max rel err decode $(val stories decode_logits_max_rel_err), prefill $(val stories prefill_logits_max_rel_err) |"
    echo "| ceiling: GEMM fp32 (no TF32) | ${F32:-?} TFLOP/s |"
    echo "| ceiling: GEMM bf16 (fp32 acc) | ${B16:-?} TFLOP/s |"
    echo "| ceiling: device copy (read+write) | ${BW:-?} GB/s |"
    for p in fp32 bf16; do
        C=$F32; [ $p = bf16 ] && C=$B16
        echo "| SmolLM2-135M shape $p prefill B=1 T=512 | $(val smollm_$p prefill_tokens_per_s) tok/s, $(val smollm_$p prefill_TFLOPs) TFLOP/s = $(share "$(val smollm_$p prefill_TFLOPs)" "$C") of GEMM $p |"
        echo "| SmolLM2-135M shape $p decode B=1 ctx 512 | $(val smollm_$p decode_tokens_per_s) tok/s, $(val smollm_$p decode_GBps) GB/s = $(share "$(val smollm_$p decode_GBps)" "$BW") of copy |"
    done
    for h in hybrid moe; do
        echo "| Nemotron-H-shaped $h (bench/cuda/nemotron_h_$h.json, $(val nemotron_${h}_fp32 params) params) fp32 prefill B=1 T=512 | $(val nemotron_${h}_fp32 prefill_tokens_per_s) tok/s, $(val nemotron_${h}_fp32 prefill_TFLOPs) TFLOP/s = $(share "$(val nemotron_${h}_fp32 prefill_TFLOPs)" "$F32") of GEMM fp32 |"
        echo "| Nemotron-H-shaped $h fp32 decode B=1 ctx 512 | $(val nemotron_${h}_fp32 decode_tokens_per_s) tok/s, $(val nemotron_${h}_fp32 decode_GBps) GB/s = $(share "$(val nemotron_${h}_fp32 decode_GBps)" "$BW") of copy |"
        echo "| Nemotron-H-shaped $h fp32 training step B=1 T=512 (CE fwd+bwd) | $(val nemotron_${h}_fp32 train_tokens_per_s) tok/s, $(val nemotron_${h}_fp32 train_TFLOPs) TFLOP/s = $(share "$(val nemotron_${h}_fp32 train_TFLOPs)" "$F32") of GEMM fp32 |"
    done
    for k in prefill train; do
        A=$(val nemotron_hybrid_fp32 ${k}_tokens_per_s); R=$(val nemotron_hybrid_fp32_recurrent ${k}_tokens_per_s)
        echo "| Nemotron-H-shaped hybrid fp32 $k B=1 T=512, scan chunked vs step by step | ${A:-?} vs ${R:-?} tok/s: $(awk -v a="$A" -v b="$R" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }') |"
    done
    for p in fp32 bf16; do
        G=$(jv distill_$p sgemm_gflops); [ $p = bf16 ] && G=$(jv distill_$p gemm16_gflops)
        echo "| distillation step $p, B=4 x 256 (teacher fwd + student fwd/bwd + AdamW) | $(jv distill_$p tokens_per_s) tok/s (best of 5 steps); GEMM ceiling through the same backend $G GFLOP/s |"
    done
    echo "| short job on $DEVICE (stories260K, bf16, autocompress run) | $(if [ -s "$LOG/jobdir/report.json" ]; then echo "succeeded, report.json written"; else tail -1 "$LOG/job" 2>/dev/null || echo '-'; fi) |"
    if [ -s "$LOG/dp_two" ]; then
        echo "| distillation on 2 GPUs (NCCL) vs 1: final loss | $(jv dp_two final_loss) vs $(jv dp_one final_loss); $(jv dp_two tokens_per_s) vs $(jv dp_one tokens_per_s) tok/s |"
    fi
    echo "| time used | $(( $(date +%s) - T0 )) s of ${LIMIT_S} s |"
    echo "| cost model held-out errors ($DEVICE, batch 1) | $(grep -o 'latency MAPE[^;]*;[^;]*memory MAPE[^;]*' "$LOG/costmodel" 2>/dev/null | head -1 | tr -d '*' || echo '-') |"
    echo
    echo "bf16 here rounds fp32 weights to bf16 inside every GEMM call (no cached bf16 weights), so"
    echo "its decode moves more bytes than fp32; shares use the matching GEMM ceiling."
} >"$LOG/table"
cp "$LOG/table" "$OUT"
echo
cat "$LOG/table"
echo "(written to $OUT; logs in $LOG)"
[ "$fail" -eq 0 ]
