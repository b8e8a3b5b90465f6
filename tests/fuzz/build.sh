#!/bin/bash
# Build the libFuzzer targets (clang -fsanitize=fuzzer,address,undefined) into
# ${BUILD:-build}-fuzz/ and, with --run SECONDS, run each one on its corpus under
# tests/fuzz/corpus/<target>/ (new interesting inputs go to a scratch folder; crash
# inputs are written to tests/fuzz/corpus/<target>/crash-* to keep as regressions).
# With --regress, run each target once over its corpus (what CI does).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${BUILD:-build}-fuzz
mkdir -p "$OUT"
CC=${FUZZ_CC:-clang}
CFLAGS="-std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. $(pkg-config --cflags jansson libpcre2-8)"
LIBS="$(pkg-config --libs jansson libpcre2-8) -lm"
SRCS="storage/safetensors.c storage/gguf.c storage/llama2c.c storage/tokload.c engine/tokenizer.c engine/arch.c"
for t in tests/fuzz/fuzz_*.c; do
    n=$(basename "$t" .c)
    $CC $CFLAGS -o "$OUT/$n" "$t" $SRCS $LIBS
    echo "built $OUT/$n"
done
mode=${1:-}
secs=${2:-30}
for t in tests/fuzz/fuzz_*.c; do
    n=$(basename "$t" .c)
    corpus=tests/fuzz/corpus/${n#fuzz_}
    mkdir -p "$corpus"
    if [ "$mode" = --run ]; then
        scratch=$(mktemp -d)
        "$OUT/$n" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -artifact_prefix="$corpus/" \
            "$scratch" "$corpus" || { echo "$n: CRASH (input kept under $corpus)"; rm -rf "$scratch"; exit 1; }
        rm -rf "$scratch"
    elif [ "$mode" = --regress ]; then
        "$OUT/$n" -runs=0 "$corpus"
    fi
done
