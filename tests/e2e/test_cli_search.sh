#!/bin/bash
# `autocompress search` on stories260K with a latency limit no arch meets. By default the
# search anchors the built-in engine's tables to the parent served now, so its refusal names
# the cheapest arch's cost and the speed it was priced at (the parent served in X ms against
# Y predicted by the calibration); with --no-served-check the tables decide as calibrated
# and the refusal says nothing of a serving. A quick calibration (one model, one repetition)
# is made first in the search's data dir, which the search reuses.
# Env: AC_BIN, AC_SHARED.
set -euo pipefail
BIN=${AC_BIN:?}
DATA=${AC_SHARED:?}/data
MODEL=$DATA/models/stories260K/stories260K.bin
TOK=$DATA/models/stories260K/tok512.bin
TEXT=$DATA/text/tinystories/validation_100.txt
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$BIN" calibrate --model "$MODEL" --no-hidden --models 1 --reps 1 --validate 0 --fit 0 --prompt 16 --output 4 \
    --threads 2 --data-dir "$W" >"$W/cal.out" 2>"$W/cal.err" || { cat "$W/cal.err"; fail "calibrate"; }
search() {   # search OUT_PREFIX EXTRA...
    local out=$1
    shift
    if "$BIN" search "$MODEL" --tokenizer "$TOK" --latency-ms 0.001 --calib "$TEXT" --search-tokens 256 \
        --rank-tokens 256 --axes heads,ffn,depth --prompt 16 --output 4 --data-dir "$W" "$@" >"$out.out" 2>"$out.err"; then
        cat "$out.err"
        fail "a latency limit of 0.001 ms was met"
    fi
}

search "$W/served"
grep -q "cheapest predicts latency_ms" "$W/served.err" || { cat "$W/served.err"; fail "no cheapest cost in the refusal"; }
grep -Eq "priced at this machine's speed now: the parent served in [0-9.]+ ms against [0-9.]+ predicted" \
    "$W/served.err" || { cat "$W/served.err"; fail "the refusal does not say at which speed the search priced"; }
grep -q "search.anchor: the parent served in" "$W/served.err" || { cat "$W/served.err"; fail "no anchor event"; }

search "$W/plain" --no-served-check
grep -q "cheapest predicts latency_ms" "$W/plain.err" || { cat "$W/plain.err"; fail "no cheapest cost in the refusal"; }
if grep -q "priced at this machine's speed\|search.anchor" "$W/plain.err"; then
    cat "$W/plain.err"
    fail "--no-served-check served the parent"
fi
echo "refused: $(grep -o 'cheapest predicts.*' "$W/served.err")"

# estimate --calibration FILE prices only the target the file was measured on: the same
# workload at another precision is refused, naming both targets
CAL=$(ls "$W"/calibrations/*.json | head -1)
"$BIN" estimate --model "$MODEL" --calibration "$CAL" --prompt 16 --output 4 >"$W/e1.out" 2>"$W/e1.err" \
    || { cat "$W/e1.err"; fail "estimate --calibration on its own target"; }
if "$BIN" estimate --model "$MODEL" --calibration "$CAL" --prompt 16 --output 4 --precision bf16 \
    >"$W/e2.out" 2>"$W/e2.err"; then
    cat "$W/e2.out"
    fail "a calibration measured at fp32 priced bf16"
fi
grep -q "was calibrated for the target" "$W/e2.err" || { cat "$W/e2.err"; fail "the refusal does not name the targets"; }
echo "PASS: an unmeetable latency limit is refused with the speed the search priced at, and without it under --no-served-check"
