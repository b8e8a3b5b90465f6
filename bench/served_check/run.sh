#!/bin/bash
# bench/served_check/run.sh — a search on the built-in engine anchored and checked where it
# is served (compress/servecheck.h), on a calibration that may be days old. SmolLM2-135M,
# CPU, batch 1, PROMPT + OUTPUT tokens, a latency limit at FRACTION of the parent's
# predicted latency; `autocompress search` with the served check, the anchor's scales and
# every check (predicted at the anchor, measured beside the parent) tabled. DATA: a data
# dir whose calibrations/ holds the calibration to reuse (default: calibrated here first,
# into OUT/data, as bench/calibrate_parent.sh does). Knobs: SEARCH_TOKENS (default 4096),
# RANK_TOKENS (4096), SEED (1234), LIMIT_MS (overrides FRACTION), OUT, TAG, TABLE_ONLY=1
# (no search: the table of OUT/search.json and the wall time recorded beside it). Prints
# the table and writes bench/results/served_check[-TAG].md.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${AC_BIN:-$PWD/build/autocompress}
export AC_SHARED=${AC_SHARED:-$(cd .. && pwd)/shared}
MODEL=${MODEL:-$(scripts/fetch-models.sh)}
PROMPT=${PROMPT:-256}
OUTPUT=${OUTPUT:-64}
FRACTION=${FRACTION:-0.6}
SEARCH_TOKENS=${SEARCH_TOKENS:-4096}
RANK_TOKENS=${RANK_TOKENS:-4096}
SEED=${SEED:-1234}
OUT=${OUT:-/tmp/ac-served-check}
TAG=${TAG:-}
CALIB=$AC_SHARED/data/text/c4/c4_sample.jsonl
mkdir -p "$OUT/data"
if [ -n "${DATA:-}" ]; then
    rm -rf "$OUT/data/calibrations"
    cp -r "$DATA/calibrations" "$OUT/data/"
fi
bench/calibrate_parent.sh "$BIN" "$MODEL" "$OUT/data" "$OUT" "$PROMPT" "$OUTPUT"
LIMIT_MS=${LIMIT_MS:-$(python3 -c 'import json,sys; print(round(float(sys.argv[2]) * json.load(open(sys.argv[1]))["predicted"]["latency_ms"], 4))' "$OUT/parent_estimate.json" "$FRACTION")}
if [ -z "${TABLE_ONLY:-}" ]; then
    t0=$(date +%s)
    "$BIN" search "$MODEL" --latency-ms "$LIMIT_MS" --calib "$CALIB" --search-tokens "$SEARCH_TOKENS" \
        --rank-tokens "$RANK_TOKENS" --prompt "$PROMPT" --output "$OUTPUT" --data-dir "$OUT/data" --seed "$SEED" \
        --json > "$OUT/search.json" 2> "$OUT/search.log"
    echo $(( $(date +%s) - t0 )) > "$OUT/search.wall_s"
fi
python3 - "$OUT" "$LIMIT_MS" "$(cat "$OUT/search.wall_s")" "$MODEL" "$SEARCH_TOKENS" "$PROMPT" "$OUTPUT" <<'PY' | tee "bench/results/served_check${TAG:+-$TAG}.md"
import json, os, re, sys
out, limit, wall, model, st, prompt, output = sys.argv[1:8]
limit = float(limit)
d = json.load(open(os.path.join(out, "search.json")))
done = re.search(r"search.done: .* (\d+) parameters", open(os.path.join(out, "search.log")).read())
cal = json.load(open(os.path.join(out, "calibration.json")))
sv, aim = d["served"], d["aim"]
an = sv["anchor"]
served_limit = limit * (1 - aim["margin"]["served_pct"] / 100)
print("# A search anchored and checked where it is served: SmolLM2-135M on the built-in engine\n")
print(f"Model `{os.path.basename(model)}`; target cpu fp32, batch 1, {prompt} prompt + {output} output tokens; "
      f"calibration `{cal['id']}` (reused: {cal.get('reused', 'no')}); latency limit {limit:.1f} ms; "
      f"DNAS with {st} selection tokens; `autocompress search` wall {int(wall) / 60:.1f} min (ranking, search, "
      f"anchor and checks).\n")
print(f"Aim {aim['latency_ms']:.1f} ms: the calibration's largest held-out error, "
      f"{aim['margin']['latency_pct']:.1f}%, under the limit; a served check is judged against the limit less "
      f"{aim['margin']['served_pct']:.0f}% ({served_limit:.1f} ms, and within only at 99% of it).\n")
print("| anchor | predicted by the calibration | served now | scale |")
print("|---|---|---|---|")
print(f"| parent latency (ms) | {an['parent_predicted_ms']:.1f} | {an['parent_measured_ms']:.1f} | "
      f"prefill x{an['prefill_scale']:.3f}, decode x{an['decode_scale']:.3f} |\n")
print("| check | arch | predicted at the anchor (ms) | its rounds (ms) | parent's rounds (ms) | ratio | measured (ms) | verdict |")
print("|---|---|---|---|---|---|---|---|")
for i, c in enumerate(sv["checks"]):
    ok = c["latency_ms"] <= 0.99 * served_limit
    h = c["arch"].split(" | ")[0]
    n = c["arch"].count("| L")
    print(f"| {i + 1} | {h}, {n} layers | {c['predicted_latency_ms']:.1f} | "
          f"{', '.join('%.0f' % x for x in c['process_latencies_ms'])} | "
          f"{', '.join('%.0f' % x for x in c['parent_process_latencies_ms'])} | {c['ratio_to_parent']:.4f} | "
          f"{c['latency_ms']:.1f} | {'within' if ok else 'over'} |")
print(f"\nReturned: {d['summary'].split(' | ')[0]}, {d['summary'].count('| L')} layers, "
      f"{done.group(1) if done else '?'} parameters, predicted {d['predicted']['latency_ms']:.1f} ms at the anchor; "
      f"last check within: {d['checks']['last_within']}.")
PY
