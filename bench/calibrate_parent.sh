#!/bin/bash
# bench/calibrate_parent.sh BIN MODEL DATA_DIR OUT_DIR PROMPT OUTPUT — what the SmolLM2
# benchmarks do before their jobs: the parent's arch (OUT_DIR/parent_arch.json), the CPU
# calibration a job with a hidden-size search uses (the parent's hidden size and its
# eighths from one half up, multiples of 8, as the calibrate stage adds them), cached in
# DATA_DIR so every job reuses it (OUT_DIR/calibration.json), and the parent's estimate
# at batch 1 (OUT_DIR/parent_estimate.json). HIDDEN_SEARCH=0: the parent's hidden size only,
# as a job whose search_space.hidden is false calibrates.
set -euo pipefail
[ $# = 6 ] || { echo "usage: $0 BIN MODEL DATA_DIR OUT_DIR PROMPT OUTPUT" >&2; exit 2; }
BIN=$1 MODEL=$2 DATA=$3 OUT=$4 PROMPT=$5 OUTPUT=$6
"$BIN" inspect "$MODEL" --json > "$OUT/parent_arch.json"
HIDDEN=$(python3 -c 'import json,sys; h=json.load(open(sys.argv[1]))["hidden_size"]; print(",".join(str(h*j//8//8*8) for j in range(4, 8)))' "$OUT/parent_arch.json")
[ "${HIDDEN_SEARCH:-1}" = 0 ] && HOPT=(--no-hidden) || HOPT=(--hidden "$HIDDEN")
"$BIN" calibrate --arch "$OUT/parent_arch.json" --device cpu --batch 1 --prompt "$PROMPT" --output "$OUTPUT" \
    "${HOPT[@]}" --data-dir "$DATA" --json > "$OUT/calibration.json"
"$BIN" estimate --arch "$OUT/parent_arch.json" --device cpu --batch 1 --prompt "$PROMPT" --output "$OUTPUT" \
    --data-dir "$DATA" --json > "$OUT/parent_estimate.json"
