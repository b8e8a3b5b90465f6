#!/bin/bash
# bench/search_compare/run.sh — AutoCompress (DNAS) against the Minitron++ baseline under
# the same deployment limits, ranking, cost model and final distillation budget. Each
# method runs as a real job (`autocompress run`); both jobs of a limit share one
# calibration (copied into each job's data dir) and rank deterministically on the same
# text. Two limits: latency at FRACTION of the parent's predicted latency, and memory at
# FRACTION of its predicted memory. Prints the table and writes it to
# bench/results/search_compare[-$TAG].md.
#
# Defaults are the issue's setting: SmolLM2-135M-Instruct, CPU, batch 1, 256 prompt + 64
# output tokens, the eight benchmarks at 200 items each. Knobs (environment): MODEL,
# PROMPT, OUTPUT, TASKS (comma list), EVAL_LIMIT, SEARCH_TOKENS (DNAS budget; each of the
# four Minitron++ trials distils half of it), DISTILL_TOKENS, CALIB, FRACTION, EXPORT,
# OUT, TAG.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${AC_BIN:-$PWD/build/autocompress}
export AC_SHARED=${AC_SHARED:-$(cd .. && pwd)/shared}
SHARED=$AC_SHARED
MODEL=${MODEL:-$(scripts/fetch-models.sh)}
PROMPT=${PROMPT:-256}
OUTPUT=${OUTPUT:-64}
TASKS=${TASKS:-arc_easy,arc_challenge,piqa,hellaswag,winogrande,boolq,openbookqa,lambada_openai}
EVAL_LIMIT=${EVAL_LIMIT:-200}
SEARCH_TOKENS=${SEARCH_TOKENS:-65536}
DISTILL_TOKENS=${DISTILL_TOKENS:-131072}
CALIB=${CALIB:-$SHARED/data/text/c4/c4_sample.jsonl}
FRACTION=${FRACTION:-0.6}
EXPORT=${EXPORT:-}
OUT=${OUT:-/tmp/ac-search-compare}
TAG=${TAG:-}
RESULT=bench/results/search_compare${TAG:+-$TAG}.md
mkdir -p "$OUT/shared"
t0=$(date +%s)
echo "calibrating the target once (cached in $OUT/shared) ..." >&2
# The parent's shape as arch JSON: calibrate and estimate take it for every model format.
"$BIN" inspect "$MODEL" --json > "$OUT/parent_arch.json"
"$BIN" calibrate --arch "$OUT/parent_arch.json" --device cpu --batch 1 --prompt "$PROMPT" --output "$OUTPUT" \
    --data-dir "$OUT/shared" --json > "$OUT/calibration.json"
"$BIN" estimate --arch "$OUT/parent_arch.json" --device cpu --batch 1 --prompt "$PROMPT" --output "$OUTPUT" \
    --data-dir "$OUT/shared" --json > "$OUT/parent_estimate.json"
python3 - "$OUT" "$MODEL" "$CALIB" "$SEARCH_TOKENS" "$DISTILL_TOKENS" "$EVAL_LIMIT" "$FRACTION" "$PROMPT" \
    "$OUTPUT" "$TASKS" "$EXPORT" <<'PY'
import json, sys, os
out, model, calib, st, dt, lim, frac, prompt, output, tasks, export = sys.argv[1:12]
p = json.load(open(os.path.join(out, "parent_estimate.json")))["predicted"]
limits = {"latency": {"latency_ms": round(float(frac) * p["latency_ms"], 4)},
          "memory": {"memory_gib": float(frac) * p["memory_bytes"]["total"] / 2**30}}
for lname, cons in limits.items():
    for method in ("autocompress", "minitron"):
        spec = {"name": f"compare-{lname}-{method}", "model": {"path": model},
                "target": {"device": "cpu", "precision": "fp32",
                           "workload": {"batch_size": 1, "prompt_tokens": int(prompt), "output_tokens": int(output)}},
                "constraints": cons, "method": method,
                "search_space": {"hidden": True, "heads": True, "ffn": True, "depth": True},
                "budgets": {"search_tokens": int(st), "distill_tokens": int(dt)},
                "data": {"calibration": calib, "distillation": calib},
                "evaluation": {"tasks": tasks.split(","), "limit": int(lim), "seed": 1234},
                "export": [x for x in export.split(",") if x]}
        json.dump(spec, open(os.path.join(out, f"spec-{lname}-{method}.json"), "w"), indent=2)
PY
for l in latency memory; do
    for m in autocompress minitron; do
        d=$OUT/$l-$m
        rm -rf "$d"; mkdir -p "$d"
        cp -r "$OUT/shared/calibrations" "$d/"
        echo "running $l / $m ..." >&2
        "$BIN" run "$OUT/spec-$l-$m.json" --out "$d" > "$d/job.json" 2> "$d/run.log" || echo "job $l/$m failed (see $d/run.log)" >&2
    done
done
python3 - "$OUT" "$SEARCH_TOKENS" "$DISTILL_TOKENS" "$EVAL_LIMIT" "$MODEL" "$PROMPT" "$OUTPUT" "$(( $(date +%s) - t0 ))" \
    <<'PY' | tee "$RESULT"
import json, sys, os, math
out, st, dt, lim, model, prompt, output, wall = sys.argv[1:9]
cal = json.load(open(os.path.join(out, "calibration.json")))
par = json.load(open(os.path.join(out, "parent_estimate.json")))["predicted"]
print(f"# Search comparison: AutoCompress (DNAS) vs Minitron++\n")
print(f"Model `{os.path.basename(model)}`; target cpu fp32, batch 1, {prompt} prompt + {output} output tokens. "
      f"One calibration `{cal.get('id')}` ({cal.get('entries')} entries, {cal.get('wall_s', 0):.0f} s) serves both methods. "
      f"Parent predicted latency {par['latency_ms']:.2f} ms, memory {par['memory_bytes']['total']/2**20:.1f} MiB. "
      f"Budgets: DNAS search {st} tokens; Minitron++ 4 frontier candidates x {int(st)//2} tokens; final distillation "
      f"{dt} tokens for both; evaluation {lim} items per task. Whole comparison: {int(wall)/60:.1f} min wall.\n")
print("| limit | method | layers: heads/ffn | params | latency pred / meas (ms) | memory pred / meas (MiB) | selection tokens | distill val loss | task avg | per task |")
print("|---|---|---|---|---|---|---|---|---|---|")
for l in ("latency", "memory"):
    for m in ("autocompress", "minitron"):
        d = os.path.join(out, f"{l}-{m}")
        try:
            job = json.load(open(os.path.join(d, "job.json")))
        except Exception:
            print(f"| {l} | {m} | job did not run | | | | | | | |"); continue
        rp = os.path.join(d, "report.json")
        if job.get("status") != "succeeded" or not os.path.exists(rp):
            err = (job.get("error") or {}).get("message", job.get("status"))
            print(f"| {l} | {m} | failed: {err} | | | | | | | |"); continue
        r = json.load(open(rp))
        res = r.get("result", {})
        pred, meas = res.get("predicted", {}), res.get("measured", {})
        layers = res.get("arch", {}).get("layers", [])
        summ = " ".join(f"{(x.get('attention') or {}).get('n_heads', 0)}/{(x.get('mlp') or {}).get('ffn_dim', 0)}" for x in layers)
        mem_p = (pred.get("memory_bytes") or {}).get("total", 0) / 2**20
        mem_m = (meas.get("peak_memory_bytes") or 0) / 2**20
        acc = res.get("accuracy", {})
        per = ", ".join(f"{k} {v.get('acc', float('nan')):.3f}" for k, v in sorted(acc.items()) if isinstance(v, dict) and "acc" in v)
        vl = (r.get("distillation") or {}).get("val_loss", float("nan"))
        avg = res.get("average")
        print(f"| {l} | {m} | {len(layers)}L: {summ} | {res.get('params', 0)} | {pred.get('latency_ms', 0):.2f} / "
              f"{meas.get('latency_ms', 0):.2f} | {mem_p:.2f} / {mem_m:.2f} | {r.get('search', {}).get('selection_tokens', 0)} | "
              f"{vl:.4f} | {avg if avg is None else round(avg, 4)} | {per} |")
PY
