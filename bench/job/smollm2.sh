#!/bin/bash
# bench/job/smollm2.sh — one full SmolLM2-135M-Instruct job through the REST API on the
# CPU target: a latency limit at FRACTION (0.75) of the parent's predicted latency, the
# AutoCompress search over every axis, distillation, the eight benchmarks on parent,
# pruned-only and distilled student (evaluation.pruned), measurement and a GGUF export.
# Writes bench/results/smollm2-135m-cpu.{json,html,md}: the job's report as served by
# GET /v1/jobs/{id}/report and /report.html, and a summary with the WikiText-2
# perplexity (llama.cpp's chunk method) of parent, pruned-only and distilled models.
# Knobs (env): SEARCH_TOKENS (32768), DISTILL_TOKENS (65536), EVAL_LIMIT (200),
# FRACTION (0.75), MARGIN (constraints.margin_pct; unset: the product's default, the
# calibration's largest held-out error), PROMPT (256), OUTPUT (64), PPL_CHUNKS (16), WORK (work dir), and
# SHARED_CACHE: a folder with calibrations/, rankcache/ and evalcache/ to reuse (e.g. the one
# bench/search_compare/run.sh fills). Another parent (MODEL, an HF or pruned directory: the MoE
# bench/families/moefy.py makes): TITLE, RES (results path without extension), EXPORT (gguf),
# TASKS (comma list; default the eight), HIDDEN_SEARCH (1; 0: no hidden-size search, as MoE
# families' HF export needs), EXPERT_WIDTHS (1; 0: MoE layers keep their experts' width).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${AC_BIN:-$PWD/build/autocompress}
export AC_SHARED=${AC_SHARED:-$(cd .. && pwd)/shared}
MODEL=${MODEL:-$(scripts/fetch-models.sh)}
SEARCH_TOKENS=${SEARCH_TOKENS:-32768}
DISTILL_TOKENS=${DISTILL_TOKENS:-65536}
EVAL_LIMIT=${EVAL_LIMIT:-200}
export FRACTION=${FRACTION:-0.75}
MARGIN=${MARGIN:-}
PROMPT=${PROMPT:-256}
OUTPUT=${OUTPUT:-64}
PPL_CHUNKS=${PPL_CHUNKS:-16}
WORK=${WORK:-/tmp/ac-smollm2-job}
SHARED_CACHE=${SHARED_CACHE:-}
RES=${RES:-bench/results/smollm2-135m-cpu}
TITLE=${TITLE:-SmolLM2-135M-Instruct}
EXPORT=${EXPORT:-gguf}
TASKS=${TASKS:-arc_easy,arc_challenge,piqa,hellaswag,winogrande,boolq,openbookqa,lambada_openai}
export HIDDEN_SEARCH=${HIDDEN_SEARCH:-1}
EXPERT_WIDTHS=${EXPERT_WIDTHS:-1}
WIKI=$AC_SHARED/data/text/wikitext-2-raw/wiki.test.raw
C4=$AC_SHARED/data/text/c4/c4_sample.jsonl

rm -rf "$WORK"
mkdir -p "$WORK/data"
if [ -n "$SHARED_CACHE" ]; then
    [ -d "$SHARED_CACHE/calibrations" ] && cp -r "$SHARED_CACHE/calibrations" "$WORK/data/"
    for c in evalcache rankcache; do
        [ -d "$SHARED_CACHE/$c" ] && ln -s "$SHARED_CACHE/$c" "$WORK/data/$c"
    done
fi
t0=$(date +%s)
# the calibration the job uses (reused when already cached), the parent's predicted costs
bench/calibrate_parent.sh "$BIN" "$MODEL" "$WORK/data" "$WORK" "$PROMPT" "$OUTPUT"

"$BIN" serve --listen 127.0.0.1:0 --data-dir "$WORK/data" --data-root "$(dirname "$MODEL")" \
    --data-root "$AC_SHARED/data" > "$WORK/serve.out" 2> "$WORK/serve.log" &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    port=$(grep -h '"listening"' "$WORK/serve.log" "$WORK/serve.out" 2>/dev/null | head -1 |
           python3 -c 'import json,sys; l=sys.stdin.readline(); print(json.loads(l)["port"] if l else "")' || true)
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.2
done
[ -n "${port:-}" ] || { echo "the server did not start (see $WORK/serve.log)" >&2; exit 1; }
URL=http://127.0.0.1:$port

python3 - "$URL" "$WORK" "$MODEL" "$C4" "$SEARCH_TOKENS" "$DISTILL_TOKENS" "$EVAL_LIMIT" "$FRACTION" "$PROMPT" \
    "$OUTPUT" "$MARGIN" "$EXPORT" "$TASKS" "$HIDDEN_SEARCH" "$EXPERT_WIDTHS" <<'PY'
import json, sys, time, urllib.request
url, work, model, c4, st, dt, lim, frac, prompt, output, margin, export, tasks, hidden, widths = sys.argv[1:16]
par = json.load(open(f"{work}/parent_estimate.json"))["predicted"]
spec = {"name": "smollm2-135m-cpu-latency", "model": {"path": model},
        "target": {"device": "cpu", "precision": "fp32",
                   "workload": {"batch_size": 1, "prompt_tokens": int(prompt), "output_tokens": int(output)}},
        "constraints": {"latency_ms": round(float(frac) * par["latency_ms"], 3)},
        "method": "autocompress",
        "search_space": {"hidden": hidden == "1", "heads": True, "ffn": True, "experts": True,
                         "expert_widths": widths == "1", "depth": True},
        "budgets": {"search_tokens": int(st), "distill_tokens": int(dt)},
        "data": {"calibration": c4, "distillation": c4},
        "evaluation": {"tasks": tasks.split(","), "limit": int(lim), "seed": 1234, "pruned": True},
        "export": export.split(",")}
if margin:
    spec["constraints"]["margin_pct"] = float(margin)
json.dump(spec, open(f"{work}/spec.json", "w"), indent=1)


def call(method, path, body=None):
    req = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


job = call("POST", "/v1/jobs", spec)
print(f"job {job['id']} submitted; latency limit {spec['constraints']['latency_ms']} ms", file=sys.stderr)
after = None
while True:
    # the status is read before the page, so a terminal job's last events are in it
    j = call("GET", f"/v1/jobs/{job['id']}")
    page = call("GET", f"/v1/jobs/{job['id']}/events?limit=100&wait=30" + (f"&after={after}" if after else ""))
    for e in page.get("data", []):
        if not e["type"].endswith(".progress"):
            print(f"  {e['created_at']} {e['type']}: {e['message'][:160]}", file=sys.stderr)
    after = page.get("last_id") or after
    if j["status"] in ("succeeded", "failed", "cancelled") and not page.get("has_more"):
        break
json.dump(j, open(f"{work}/job.json", "w"), indent=1)
print(f"job {j['id']}: {j['status']}", file=sys.stderr)
PY
jid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$WORK/job.json")
curl -sf "$URL/v1/jobs/$jid/report" > "$WORK/report.json"
curl -sf "$URL/v1/jobs/$jid/report.html" > "$WORK/report.html"
curl -sf "$URL/v1/jobs/$jid/artifacts" > "$WORK/artifacts.json"
jobdir=$WORK/data/jobs/$jid
gguf=$(python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); print(next((x["name"] for x in a.get("data", a if isinstance(a, list) else []) if x["name"].endswith(".gguf")), ""))' "$WORK/artifacts.json")
if [ -n "$gguf" ]; then
    curl -sf -o "$WORK/$gguf" "$URL/v1/jobs/$jid/artifacts/$gguf"
    "$BIN" perplexity "$WORK/$gguf" --text "$WIKI" --chunks "$PPL_CHUNKS" --json > "$WORK/ppl_result.json" || true
elif curl -sf -o "$WORK/model-hf.tar" "$URL/v1/jobs/$jid/artifacts/model-hf.tar"; then
    mkdir -p "$WORK/hf" && tar -xf "$WORK/model-hf.tar" -C "$WORK/hf"
    hfdir=$(dirname "$(find "$WORK/hf" -name config.json | head -1)")
    "$BIN" perplexity "$hfdir" --text "$WIKI" --chunks "$PPL_CHUNKS" --json > "$WORK/ppl_result.json" || true
fi
"$BIN" perplexity "$MODEL" --text "$WIKI" --chunks "$PPL_CHUNKS" --json > "$WORK/ppl_parent.json" || true
[ -d "$jobdir/prune/student" ] &&
    "$BIN" perplexity "$jobdir/prune/student" --text "$WIKI" --chunks "$PPL_CHUNKS" --json > "$WORK/ppl_pruned.json" || true
kill $srv 2>/dev/null || true
cp "$WORK/report.json" "$RES.json"
cp "$WORK/report.html" "$RES.html"
python3 - "$WORK" "$(( $(date +%s) - t0 ))" "$PPL_CHUNKS" "$gguf" "$TITLE" "$RES" <<'PY' | tee "$RES.md"
import json, sys, os
work, wall, chunks, gguf, title, res_path = sys.argv[1:7]
base = os.path.basename(res_path)
r = json.load(open(f"{work}/report.json"))
spec = json.load(open(f"{work}/spec.json"))
arts = json.load(open(f"{work}/artifacts.json"))


def ppl(name):
    try:
        return "%.2f" % json.load(open(f"{work}/ppl_{name}.json"))["ppl"]
    except Exception:
        return "—"


def avg(m):
    a = (m or {}).get("average")
    return "—" if a is None else "%.4f" % a


def acc(m, t):
    x = ((m or {}).get("accuracy") or {}).get(t)
    return "—" if not x else "%.3f ± %.3f" % (x["acc"], x["stderr"])


par, res, pru = r.get("parent", {}), r.get("result", {}), r.get("pruned", {})
print(f"# {title}, one full job through the REST API (CPU target)\n")
print(f"Job `{r.get('job_id')}`: {r.get('status')}; {int(wall) / 60:.1f} min wall for the whole script. "
      f"Files: `{base}.json` (GET /v1/jobs/{{id}}/report) and `{base}.html` "
      f"(GET /v1/jobs/{{id}}/report.html). Produced by `bench/job/smollm2.sh`.\n")
w = spec["target"]["workload"]
aim = r.get("search", {}).get("aim", {})
print(f"Spec: latency ≤ {spec['constraints']['latency_ms']} ms ({float(os.environ.get('FRACTION', 0.75)):.0%} of the parent's predicted latency; the search "
      f"aims {aim.get('margin', {}).get('latency_pct', 0):.2f}% under it, margin from {aim.get('source', '?')}) at batch "
      f"{w['batch_size']}, {w['prompt_tokens']} prompt + {w['output_tokens']} output tokens; method "
      f"{spec['method']} over {', '.join(k for k, v in spec['search_space'].items() if v)}; budgets {spec['budgets']['search_tokens']} "
      f"selection and {spec['budgets']['distill_tokens']} distillation tokens of C4; evaluation "
      f"{spec['evaluation']['limit']} items per task (seed 1234); export {', '.join(spec['export'])}.\n")
print("| | parent | pruned only | pruned + distilled |")
print("|---|---|---|---|")
print(f"| parameters | {par.get('params')} | {res.get('params')} | {res.get('params')} |")
print(f"| predicted latency (ms) | {(par.get('predicted') or {}).get('latency_ms', 0):.1f} | "
      f"{(res.get('predicted') or {}).get('latency_ms', 0):.1f} | same |")
print(f"| measured latency (ms) | {(par.get('measured') or {}).get('latency_ms', 0):.1f} | "
      f"{(res.get('measured') or {}).get('latency_ms', 0):.1f} | same |")
print(f"| WikiText-2 perplexity ({chunks} x 512) | {ppl('parent')} | {ppl('pruned')} | {ppl('result')} |")
for t in spec["evaluation"]["tasks"]:
    print(f"| {t} acc | {acc(par, t)} | {acc(pru, t)} | {acc(res, t)} |")
print(f"| **{len(spec['evaluation']['tasks'])}-benchmark average** | {avg(par)} | {avg(pru)} | {avg(res)} |\n")
for l in r.get("limits", []):
    print(f"- limit {l.get('name')} ≤ {l.get('limit')} (aimed at {l.get('aimed')}): predicted {l.get('predicted')}, "
          f"measured {l.get('measured')}, holds: {l.get('holds')}")
d = r.get("distillation", {})
print(f"- distillation: {d.get('tokens')} tokens in {d.get('steps')} steps, {d.get('wall_s', 0):.0f} s; "
      f"validation loss {d.get('val_loss')}")
s = r.get("search", {})
print(f"- search: {s.get('selection_tokens')} selection tokens, {s.get('wall_s', 0):.0f} s")
print("- wall time per stage (s): " + ", ".join(f"{x['name']} {x.get('wall_s', 0):.0f}" for x in r.get("stages", [])))
a = res.get("arch", {})
print(f"- result arch: hidden {a.get('hidden_size')}, {len(a.get('layers', []))} layers: " +
      " ".join(f"{(x.get('attention') or {}).get('n_heads', 0)}/" +
               (f"e{x['moe']['n_experts']}x{x['moe']['expert_ffn_dim']}" if x.get('moe')
                else f"{(x.get('mlp') or {}).get('ffn_dim', 0)}")
               for x in a.get("layers", [])))
print(f"- artifacts: " + ", ".join(f"{x['name']} ({x.get('size_bytes')} B)" for x in arts.get("data", [])))
PY
