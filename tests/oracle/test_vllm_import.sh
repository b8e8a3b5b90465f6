#!/bin/bash
# The vLLM recipe end to end without a GPU: scripts/vllm_timing_tables.py plans the
# repeated-block models for a stories260K-shaped parent (two hidden sizes), `vllm bench
# latency`-style results are fabricated for every planned run from a known linear cost
# model (fixed + per-layer costs, noisy latencies with exact medians), `build` writes the
# import document, `calibrate --import` stores it, and `estimate` on the target it names
# predicts the known model's latency within 1% (on grid, off grid, between hidden sizes),
# with weights from --memory; trtllm-bench reports of the same runs build the same
# tables. A result file without avg_latency is refused naming the file; a document with
# one mutated field is refused naming its JSON pointer.
# Env: AC_BIN, AC_PYTHON (the script itself needs only the standard library).
set -euo pipefail
BIN=${AC_BIN:?}
PY=${AC_PYTHON:-python3}
SCRIPT=$(cd "$(dirname "$0")/../.." && pwd)/scripts/vllm_timing_tables.py
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
TARGET=(--device cuda:0 --precision bf16 --batch 2 --prompt 32 --output 16)

cat >"$W/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
 "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 172,
 "num_hidden_layers": 5, "vocab_size": 512, "max_position_embeddings": 512,
 "tie_word_embeddings": true, "rms_norm_eps": 1e-5, "torch_dtype": "float32"}
EOF

"$PY" "$SCRIPT" plan --parent "$W/config.json" --out "$W/plan.json" --copies 8 --batch 2 --prompt 32 \
    --output 16 --hidden 48 --tokenizer "$W" --results-dir "$W/results" >"$W/run.sh" 2>"$W/plan.log" ||
    { cat "$W/plan.log"; fail "plan"; }
# every planned run is a vllm bench latency command writing its own result file
"$PY" - "$W" <<'PY' || fail "plan content"
import json, os, sys
w = sys.argv[1]
plan = json.load(open(w + "/plan.json"))
cmds = [l for l in open(w + "/run.sh") if l.startswith("vllm bench latency")]
assert len(cmds) == 2 * len(plan["models"]), (len(cmds), len(plan["models"]))
assert plan["hidden_sizes"] == [64, 48]
for m in plan["models"]:
    cfg = json.load(open(m["config"]))
    assert cfg["architectures"] == ["DeciLMForCausalLM"] and len(cfg["block_configs"]) == len(m["layers"])
    assert cfg["hidden_size"] == m["hidden_size"] and cfg["num_attention_heads"] == m["n_heads"]
    for ph, n in (("prefill", 1), ("full", 17)):
        c = m["runs"][ph]["command"]
        assert "--output-len %d " % n in c and "--enforce-eager" in c and "--batch-size 2" in c, c
        assert c.endswith(os.path.join(w, "results", m["runs"][ph]["result"])), c
    if m["role"] != "base":
        assert len(m["layers"]) == 9
PY

# The known engine: a request of B rows, S prompt tokens and `out` output tokens takes
# prefill + (out - 1) decode steps; each layer costs its attention, its MLP and 0.3 ms
# (decode 0.06 ms) of its own (a block with neither still pays it), all scaled by hidden/64.
cat >"$W/known.py" <<'PY'
def layer_ms(C, l):
    s = C / 64.0
    p = 0.3 * s + (0.02 * l["n_heads"] + 0.03 * l["n_kv_heads"]) * s + 0.004 * l["ffn_dim"] * s
    d = 0.06 * s + (0.004 * l["n_heads"] + 0.006 * l["n_kv_heads"]) * s + 0.0008 * l["ffn_dim"] * s
    return p, d

def request_ms(C, layers, out):
    p, d = 10.0 + 0.02 * C, 2.0 + 0.001 * C
    for l in layers:
        lp, ld = layer_ms(C, l)
        p, d = p + lp, d + ld
    return p + (out - 1) * d, p, d
PY
"$PY" - "$W" <<'PY' || fail "fabricate results"
import json, os, statistics, sys
w = sys.argv[1]
sys.path.insert(0, w)
from known import request_ms
plan = json.load(open(w + "/plan.json"))
os.makedirs(w + "/results")
noise = [0, 0, 0.003, -0.003, 0.01, -0.01, 0.02, -0.02, 0.05, -0.04]   # median 0
for m in plan["models"]:
    for run in m["runs"].values():
        v = request_ms(m["hidden_size"], m["layers"], run["output_len"])[0] / 1e3
        lat = [v * (1 + x) for x in noise]
        assert abs(statistics.median(lat) - v) < 1e-15
        json.dump({"avg_latency": sum(lat) / len(lat), "std_latency": statistics.pstdev(lat), "latencies": lat,
                   "percentiles": {"50": statistics.median(lat)}}, open(w + "/results/" + run["result"], "w"))
PY

# memory from the base model's log line: 2 bytes a parameter plus 1 MiB
"$PY" - "$W" <<'PY'
import json, sys
w = sys.argv[1]
base = [m for m in json.load(open(w + "/plan.json"))["models"] if m["name"] == "c64_base_h8"][0]
json.dump({"weights_gib": (2 * base["params"] + 1048576) / 2**30}, open(w + "/memory.json", "w"))
PY
"$PY" "$SCRIPT" build --plan "$W/plan.json" --results "$W/results" --out "$W/tables.json" --source "vllm test" \
    --memory "$W/memory.json" 2>"$W/build.log" || { cat "$W/build.log"; fail "build"; }
grep -q "one context each" "$W/build.log" || fail "build does not say decode entries hold one context"
"$BIN" calibrate --import "$W/tables.json" --data-dir "$W/data" --json >"$W/cal.json" 2>"$W/cal.log" ||
    { cat "$W/cal.log"; fail "import"; }

# archs: on grid (removed parts too), off-grid FFN widths, and hidden 56 between the tables
"$PY" - "$W" <<'PY'
import json, sys
w = sys.argv[1]
base = {"family": "llama", "vocab_size": 512, "head_dim": 8, "max_position_embeddings": 512, "rope_theta": 10000.0,
        "rope_scaling": None, "norm_eps": 1e-5, "tie_word_embeddings": True}
def lay(s, h, kv, f):
    return {"source_layer": s, "attention": {"n_heads": h, "n_kv_heads": kv} if h else None,
            "mlp": {"ffn_dim": f} if f else None}
archs = {
    "grid": dict(base, hidden_size=64, layers=[lay(0, 8, 4, 172), lay(1, 4, 2, 80), lay(2, 0, 0, 40),
                                              lay(3, 6, 3, 0), lay(4, 4, 4, 144)]),
    "offgrid": dict(base, hidden_size=64, layers=[lay(0, 8, 4, 100), lay(1, 2, 1, 12), lay(3, 8, 4, 150)]),
    "hidden56": dict(base, hidden_size=56, layers=[lay(0, 8, 4, 172), lay(2, 6, 3, 60), lay(4, 0, 0, 172)]),
}
for k, a in archs.items():
    json.dump(a, open("%s/%s.json" % (w, k), "w"))
PY
for a in grid offgrid hidden56; do
    "$BIN" estimate --arch "$W/$a.json" "${TARGET[@]}" --data-dir "$W/data" --json >"$W/est_$a.json" \
        2>"$W/est.log" || { cat "$W/est.log"; fail "estimate $a"; }
done
"$PY" - "$W" <<'PY' || fail "estimates against the known model"
import json, sys
w = sys.argv[1]
sys.path.insert(0, w)
from known import request_ms
cal = json.load(open(w + "/cal.json"))
for a in ("grid", "offgrid", "hidden56"):
    arch, est = json.load(open("%s/%s.json" % (w, a))), json.load(open("%s/est_%s.json" % (w, a)))
    assert est["calibration_id"] == cal["id"], (est["calibration_id"], cal["id"])
    layers = [{"n_heads": (l["attention"] or {}).get("n_heads", 0),
               "n_kv_heads": (l["attention"] or {}).get("n_kv_heads", 0),
               "ffn_dim": (l["mlp"] or {}).get("ffn_dim", 0)} for l in arch["layers"]]
    # AutoCompress's request of 16 output tokens is vLLM's --output-len 17: prefill + 16 steps
    want, want_p, want_d = request_ms(arch["hidden_size"], layers, 17)
    p = est["predicted"]
    err = abs(p["latency_ms"] - want) / want
    print("%-9s predicted %9.4f ms  known %9.4f ms  error %.2e  (prefill %.4f/%.4f, decode/token %.5f/%.5f)" %
          (a, p["latency_ms"], want, err, p["prefill_ms"], want_p, p["decode_ms_per_token"], want_d))
    assert err < 0.01, a
    assert abs(p["prefill_ms"] - want_p) / want_p < 0.01 and abs(p["decode_ms_per_token"] - want_d) / want_d < 0.01
    weights = p["memory_bytes"]["weights"]
    assert abs(weights - (2 * est["params"] + 1048576)) <= 1, (weights, est["params"])
PY

# without --memory: weights at 2 bytes a parameter, and the note says memory was not measured
"$PY" "$SCRIPT" build --plan "$W/plan.json" --results "$W/results" --out "$W/tables_nomem.json" 2>"$W/build.log" ||
    { cat "$W/build.log"; fail "build without --memory"; }
grep -q "memory was not measured" "$W/build.log" || fail "no note that memory was not measured"
"$BIN" estimate --arch "$W/grid.json" "${TARGET[@]}" --calibration "$W/tables_nomem.json" --json >"$W/est_nomem.json" ||
    fail "estimate from the import document"
"$PY" -c "
import json, sys
e = json.load(open(sys.argv[1]))
assert e['predicted']['memory_bytes']['weights'] == 2 * e['params'], e['predicted']['memory_bytes']
" "$W/est_nomem.json" || fail "weights without --memory"

# the same runs as trtllm-bench --report_json files (milliseconds) build the same tables
"$PY" - "$W" <<'PY'
import json, os, statistics, sys
w = sys.argv[1]
os.makedirs(w + "/trt")
for f in os.listdir(w + "/results"):
    lat = [x * 1e3 for x in json.load(open(w + "/results/" + f))["latencies"]]
    pct = {"p50": statistics.median(lat), "p95": max(lat), "p99": max(lat), "minimum": min(lat),
           "maximum": max(lat), "average": sum(lat) / len(lat)}
    json.dump({"performance": {"request_latency_percentiles_ms": pct, "avg_request_latency_ms": pct["average"]},
               "request_info": {"num_requests": len(lat)}}, open(w + "/trt/" + f, "w"))
PY
"$PY" "$SCRIPT" build --plan "$W/plan.json" --results "$W/trt" --out "$W/tables_trt.json" 2>"$W/build.log" ||
    { cat "$W/build.log"; fail "build from trtllm-bench reports"; }
"$PY" - "$W/tables_nomem.json" "$W/tables_trt.json" <<'PY' || fail "trtllm-bench reports give other tables"
import json, sys
a, b = (json.load(open(p))["tables"] for p in sys.argv[1:])
for ph in ("prefill", "decode"):
    for x, y in zip(a[ph], b[ph]):
        xm, ym = (x["ms"], y["ms"]) if ph == "prefill" else (x["ms"][0], y["ms"][0])
        assert abs(xm - ym) <= 1e-9 * max(1.0, xm), (ph, x, y)
for u, v in zip(a["fixed"]["by_hidden"], b["fixed"]["by_hidden"]):
    assert all(abs(u[k] - v[k]) < 1e-9 for k in u), (u, v)
PY

# a result file without avg_latency: refused, naming the file
cp -r "$W/results" "$W/bad"
victim=$W/bad/c64_mlp_f80.full.json
"$PY" -c "
import json, sys
d = json.load(open(sys.argv[1]))
del d['avg_latency']
json.dump(d, open(sys.argv[1], 'w'))
" "$victim"
if "$PY" "$SCRIPT" build --plan "$W/plan.json" --results "$W/bad" --out "$W/never.json" 2>"$W/bad.log"; then
    fail "build accepted a result without avg_latency"
fi
grep -q "$victim: no avg_latency" "$W/bad.log" || { cat "$W/bad.log"; fail "error does not name the file"; }
[ ! -e "$W/never.json" ] || fail "a refused build left a document"
echo "malformed result: $(cat "$W/bad.log")"

# one mutated field: refused by --import with its JSON pointer
"$PY" -c "
import json, sys
d = json.load(open(sys.argv[1]))
d['tables']['prefill'][3]['ms'] = -1.0
json.dump(d, open(sys.argv[2], 'w'))
" "$W/tables.json" "$W/mutated.json"
if "$BIN" calibrate --import "$W/mutated.json" --data-dir "$W/data2" 2>"$W/mut.log"; then
    fail "import accepted a negative ms"
fi
grep -q "/tables/prefill/3/ms" "$W/mut.log" || { cat "$W/mut.log"; fail "refusal does not name the pointer"; }
echo "mutated document: $(cat "$W/mut.log")"
echo "ok"
