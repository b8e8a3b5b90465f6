#!/bin/bash
# Build the libFuzzer targets (clang -fsanitize=fuzzer,address,undefined) into
# ${BUILD:-build}-fuzz/ and, with --run SECONDS, run each one on its corpus under
# tests/fuzz/corpus/<target>/ (new interesting inputs go to a scratch folder; crash
# inputs are written to tests/fuzz/corpus/<target>/crash-* to keep as regressions).
# With --regress, run each target once over its corpus (make test does the same without
# clang: build/tests/test_formats_corpus). Names after the mode pick targets:
#   tests/fuzz/build.sh --run 60 fuzz_hfconfig fuzz_tokenizer_json
#   tests/fuzz/build.sh --regress fuzz_gguf
# Each target is linked with the sources it reaches: the .c beside every project header
# included from it, followed transitively, so a new dependency cannot be left out.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${BUILD:-build}-fuzz
mkdir -p "$OUT"
CC=${FUZZ_CC:-clang}
CFLAGS="-std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. $(pkg-config --cflags jansson libpcre2-8)"
LIBS="$(pkg-config --libs jansson libpcre2-8) -lm"

# Library sources reached from file $1 through #include "dir/name.h" (paths from the root).
sources_of() {
    local -A seen=()
    local queue=("$1") f h c
    while [ ${#queue[@]} -gt 0 ]; do
        f=${queue[0]}
        queue=("${queue[@]:1}")
        for h in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\.h\)".*/\1/p' "$f"); do
            [ -f "$h" ] && [ -z "${seen[$h]:-}" ] || continue
            seen[$h]=1
            queue+=("$h")
            c=${h%.h}.c
            if [ -f "$c" ] && [ -z "${seen[$c]:-}" ]; then
                seen[$c]=1
                queue+=("$c")
                echo "$c"
            fi
        done
    done
}

mode= secs=30
case ${1:-} in
--run) mode=--run; secs=${2:?--run needs SECONDS}; shift 2 ;;
--regress) mode=--regress; shift ;;
esac
targets=()
if [ $# -gt 0 ]; then
    for n in "$@"; do targets+=("tests/fuzz/${n%.c}.c"); done
else
    targets=(tests/fuzz/fuzz_*.c)
fi
for t in "${targets[@]}"; do
    n=$(basename "$t" .c)
    srcs=$(sources_of "$t" | sort)
    $CC $CFLAGS -o "$OUT/$n" "$t" $srcs $LIBS
    echo "built $OUT/$n ($(echo $srcs | wc -w) sources)"
done
for t in "${targets[@]}"; do
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
