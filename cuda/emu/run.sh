#!/bin/bash
# cuda/emu/run.sh — builds the CUDA backend (cuda/*.cu, rewritten by prep.py) against the
# SIMT emulator and runs the CUDA unit tests on the CPU: a check of kernel indexing,
# tiling, barriers and host-side launch logic where no GPU exists. Not timing, not the
# real compiler or hardware: bench/gpu_check.sh on a GPU is the real check.
# Usage: cuda/emu/run.sh [ops|model|nccl|devices ...]   (default: devices nccl model ops)
# Slow: block-by-block fibers; test_cuda_ops takes minutes. EMU_DEVICES=N emulates N GPUs.
set -eu
cd "$(dirname "$0")/../.."
OUT=${BUILD:-build}-emu
EMU=cuda/emu
mkdir -p "$OUT/gen" "$OUT/obj"
CXX="g++ -std=c++17 -O1 -g -I$EMU/include -I."
for f in cuda/*.cu; do
    b=$(basename "$f" .cu)
    python3 $EMU/prep.py "$f" "$OUT/gen/$b.cpp"
    $CXX -D__CUDACC__ -c "$OUT/gen/$b.cpp" -o "$OUT/obj/$b.o"
done
# (its fibers switch by _longjmp between stacks, which fortify's check would take for a fault)
$CXX -U_FORTIFY_SOURCE -c $EMU/emu.cpp -o "$OUT/obj/emu.o"
CC="gcc -std=c11 -D_GNU_SOURCE -O1 -g -fopenmp -DAC_CUDA=1 -I. -I/usr/include/x86_64-linux-gnu/openblas-pthread"
for f in engine/*.c; do
    $CC -c "$f" -o "$OUT/obj/eng_$(basename "$f" .c).o"
done
status=0
for t in ${@:-devices nccl model ops}; do
    $CC -o "$OUT/test_cuda_$t" tests/unit/test_cuda_$t.c "$OUT"/obj/*.o -ldnnl -lopenblas -lcmocka -lpcre2-8 -lm -lstdc++
    echo "== emulated test_cuda_$t"
    if ! EMU_DEVICES=${EMU_DEVICES:-2} "$OUT/test_cuda_$t"; then status=1; fi
done
exit $status
