#!/bin/bash
# bench/llamacpp_target/run.sh — llama.cpp as the target engine on SmolLM2-135M: for each
# weight type (PRECISIONS, default "f32 q8_0 q4_0"), at B=1, 256 prompt + 64 output tokens
# and THREADS (2) threads, flash attention FLASH (off, as llama-cpp-python serves by default):
#   1. a calibration inside llama.cpp (`autocompress calibrate --engine llama.cpp`): its
#      held-out latency and memory MAPE against llama.cpp's own timing, and its grid;
#   2. the parent's llama.cpp latency: its GGUF at that type, median of ROUNDS fresh
#      processes of llama-cpp-python (warm-up, then 3 requests each);
#   3. one job (`autocompress run`) with a latency limit of FRACTION (0.7) of that, no
#      distillation (a latency result: weights do not change it), exporting the GGUF;
#   4. the exported GGUF timed independently: llama-cpp-python, a fresh process per
#      model, parent and result alternating A B A B, ROUNDS rounds, medians;
#   5. beside it, what the built-in engine's tables (fp32, our engine) predict for the
#      same arch and what our engine measures — the difference the target engine makes.
# Prints and writes bench/results/llamacpp_target.md with the machine's ceilings (GEMM
# FLOP/s and memory bandwidth, measured in the same run). OUT keeps the work (a rerun
# reuses finished calibrations and jobs).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${AC_BIN:-$PWD/build/autocompress}
HELPER=$(dirname "$BIN")/ac-llama
export AC_SHARED=${AC_SHARED:-$(cd .. && pwd)/shared}
MODEL=${MODEL:-$(scripts/fetch-models.sh)}
PRECISIONS=${PRECISIONS:-f32 q8_0 q4_0}
THREADS=${THREADS:-2}
FRACTION=${FRACTION:-0.7}
ROUNDS=${ROUNDS:-5}
FLASH=${FLASH:-off}   # target.flash_attention, and llama-cpp-python's flash_attn in the independent timing
VALIDATE=${VALIDATE:-10}
SEARCH_TOKENS=${SEARCH_TOKENS:-8192}
OUT=${OUT:-/tmp/ac-llamacpp-target}
RES=${RES:-bench/results/llamacpp_target.md}
source scripts/pyenv.sh >/dev/null
make -s -j2 all >/dev/null
[ -x "$HELPER" ] || { echo "no $HELPER: llama.cpp is not installed (scripts/llamacpp.sh install; make)" >&2; exit 1; }
mkdir -p "$OUT/data"
build/tools/ceilings_probe "$THREADS" >"$OUT/ceilings.txt"
[ -s "$OUT/parent.f32.gguf" ] || "$BIN" export "$MODEL" --format gguf --dtype fp32 --out "$OUT/parent.f32.gguf" >/dev/null
# the built-in engine's calibration of the same parent and workload (for column 5)
[ -s "$OUT/cal.builtin.json" ] || "$BIN" calibrate --model "$MODEL" --prompt 256 --output 64 --data-dir "$OUT/data" \
    --json >"$OUT/cal.builtin.json"

exec "$AC_PYTHON" - "$BIN" "$HELPER" "$MODEL" "$OUT" "$RES" "$THREADS" "$FRACTION" "$ROUNDS" "$VALIDATE" \
    "$SEARCH_TOKENS" "$AC_SHARED" "$FLASH" $PRECISIONS <<'PY'
import json, os, statistics, subprocess, sys, time
(BIN, HELPER, MODEL, OUT, RES, THREADS, FRACTION, ROUNDS, VALIDATE, SEARCH_TOKENS, SHARED, FLASH), PRECS = \
    sys.argv[1:13], sys.argv[13:]
THREADS, FRACTION, ROUNDS, VALIDATE = int(THREADS), float(FRACTION), int(ROUNDS), int(VALIDATE)
C4 = os.path.join(SHARED, "data", "text", "c4", "c4_sample.jsonl")
S, N = 256, 64

# One request timed in a fresh llama-cpp-python process: warm-up, then 3 requests of a
# 256-token random prompt and 64 greedy decode steps (eval + sample: what a server does).
TIMER = r'''
import json, random, sys, time
import llama_cpp
path, threads, S, N, fa = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
m = llama_cpp.Llama(path, n_ctx=S + N, n_threads=threads, n_threads_batch=threads, flash_attn=fa == "on",
                    verbose=False)
rng = random.Random(1)
out = []
for rep in range(4):
    m.reset()
    toks = [rng.randrange(m.n_vocab()) for _ in range(S)]
    t0 = time.perf_counter()
    m.eval(toks)
    for i in range(N):
        tok = int(m.scores[m.n_tokens - 1].argmax())   # greedy on the last logits
        m.eval([tok])
    t1 = time.perf_counter()
    if rep:
        out.append((t1 - t0) * 1000)
print(json.dumps({"ms": sorted(out)[len(out) // 2]}))
'''


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-3000:]))
    return r.stdout


def time_fresh(path):
    return json.loads(run([sys.executable, "-c", TIMER, path, str(THREADS), str(S), str(N), FLASH]))["ms"]


def helper(*args):
    return json.loads(run([HELPER] + list(args)))


def write_report(rows):
    L = ["# llama.cpp as the target engine: SmolLM2-135M, B=1, %d + %d tokens, %d threads, flash attention %s" % (S, N, THREADS, FLASH), "",
         "Produced by `bench/llamacpp_target/run.sh` on this machine (%s). llama.cpp %s (llama-cpp-python %s, ggml %s), "
         "build flags `%s`; CPU features: %s." % (time.strftime("%Y-%m-%d"), info["ggml_commit"], info["package_version"],
                                                  info["ggml_version"], info["build_flags"], info["system_info"]),
         "", "Machine ceilings (same run): " + ceil, "",
         "## Calibration inside llama.cpp (held-out random archs, each the faster of two fresh processes)", "",
         "The machine's own spread: each held-out arch is served in two fresh processes; the last columns give "
         "how far apart the two are (|a - b| / min(a, b), median and max over the archs). A prediction cannot be "
         "checked closer than the measurement repeats.", "",
         "Anchored: the prediction a job's search makes, the tables' phases scaled by the parent's measured over "
         "predicted time (the median of the parent's servings in the same run, one before each slot of random archs), against the mean of the arch's "
         "two servings.", "",
         "| type | held-out archs | latency MAPE | max | anchored MAPE | max | memory MAPE | max | hidden sizes | "
         "MLP grid | wall s | two processes apart: median | max |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        v = r["v"]
        sp = sorted(abs(a - b) / min(a, b) * 100 for a, b in
                    (x["measured_process_latencies_ms"] for x in v["rows"] if "measured_process_latencies_ms" in x))
        L.append("| %s | %d | %.2f%% | %.2f%% | %s | %s | %.2f%% | %.2f%% | %s | %s | %.0f | %s | %s |" % (
            r["P"], v["archs"], v["latency_mape_pct"], v["latency_max_pct"],
            "%.2f%%" % v["latency_anchored_mape_pct"] if "latency_anchored_mape_pct" in v else "-",
            "%.2f%%" % v["latency_anchored_max_pct"] if "latency_anchored_max_pct" in v else "-",
            v["memory_mape_pct"], v["memory_max_pct"],
            r["hid"], ",".join(map(str, r["grid"])), r["cal"]["wall_s"],
            "%.1f%%" % statistics.median(sp) if sp else "-", "%.1f%%" % sp[-1] if sp else "-"))
    L += ["", "## A job per type: latency limit %.0f%% of the parent's llama.cpp latency" % (100 * FRACTION), "",
          "Independent timing: llama-cpp-python, one model per fresh process, parent and result alternating, "
          "median of %d rounds (each a warm-up and the median of 3 requests)." % ROUNDS, "",
          "| type | parent ms | limit ms | result arch | GGUF MB (parent) | fallback tensors | aimed ms | "
          "predicted ms | measured by the job ms (its 3 processes) | independent: parent / result ms | holds "
          "(independent) | result/parent independent | built-in engine's tables: result/parent |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append("| %s | %.1f | %.1f | hidden %d, %d layers | %.1f (%.1f) | %d | %s | %.1f | %.1f (%s) | %.1f / %.1f | %s | %.3f | %.3f |"
                 % (r["P"], r["parent_ms"], r["limit"], r["hidden"], r["layers"], r["size"] / 1e6, r["psize"] / 1e6,
                    r["fallbacks"], "%.1f" % r["aimed"] if r.get("aimed") else "-", r["pred"], r["meas"],
                    ", ".join("%.0f" % x for x in r.get("procs", [])), r["indep_parent"], r["indep_result"],
                    "yes" if r["indep_holds"] else "**no**", r["indep_result"] / r["indep_parent"], r["builtin_ratio"]))
    L += ["", "Aimed: the latency the search aimed at, the limit less the calibration's largest held-out error "
          "(anchored, when the calibration measured it: the margin the job takes by default). The last column is "
          "what the built-in engine's fp32 tables predict for the same arch relative to the parent: the speed-up a "
          "search priced in our own engine would have promised.", "",
          "### The search, served: anchor and checks", "",
          "| type | parent predicted by the calibration ms | parent served at the anchor ms (3 processes) | prefill x | "
          "decode x | checks: predicted -> served ms | last check within the aim |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        sv = r.get("served") or {}
        an = sv.get("anchor")
        if not an:
            L.append("| %s | - | - | - | - | - | - |" % r["P"])
            continue
        L.append("| %s | %.1f | %.1f (%s) | %.3f | %.3f | %s | %s |" % (
            r["P"], an["parent_predicted_ms"], an["parent_measured_ms"],
            ", ".join("%.0f" % x for x in an["process_latencies_ms"]), an["prefill_scale"], an["decode_scale"],
            "; ".join("%.1f -> %.1f" % (c.get("predicted_latency_ms", 0), c["latency_ms"]) for c in sv.get("checks", [])),
            "yes" if r.get("checks", {}).get("last_within") else "no"))
    open(RES, "w").write("\n".join(L) + "\n")
    return "\n".join(L)


ceil = open(os.path.join(OUT, "ceilings.txt")).read().strip()
info = helper("info")
builtin = json.load(open(os.path.join(OUT, "cal.builtin.json")))
rows = []
for P in PRECS:
    pg = os.path.join(OUT, "parent.%s.gguf" % P)
    if not os.path.exists(pg):
        if P == "f32":
            os.link(os.path.join(OUT, "parent.f32.gguf"), pg)
        else:
            helper("quantize", os.path.join(OUT, "parent.f32.gguf"), pg, P, "--threads", str(THREADS))
    calp = os.path.join(OUT, "cal.%s.json" % P)
    if not os.path.exists(calp):
        t0 = time.time()
        txt = run([BIN, "calibrate", "--model", MODEL, "--engine", "llama.cpp", "--precision", P, "--engine-threads",
                   str(THREADS), "--flash-attention", FLASH, "--prompt", str(S), "--output", str(N), "--validate", str(VALIDATE),
                   "--data-dir", os.path.join(OUT, "data"), "--json"])
        open(calp, "w").write(txt)
        print("%s: calibration %.0f s" % (P, time.time() - t0), flush=True)
    cal = json.load(open(calp))
    # the limit the job was given: a rerun that reuses the job reuses its parent timing
    pmsp = os.path.join(OUT, "parent.%s.ms" % P)
    if not os.path.exists(pmsp):
        open(pmsp, "w").write("%.6f\n" % statistics.median(time_fresh(pg) for _ in range(ROUNDS)))
    parent_ms = float(open(pmsp).read())
    limit = round(FRACTION * parent_ms, 3)
    jobdir = os.path.join(OUT, "job.%s" % P)
    if not os.path.exists(os.path.join(jobdir, "model.gguf")):
        spec = {"name": "llamacpp-target-" + P, "model": {"path": MODEL},
                "target": {"device": "cpu", "engine": "llama.cpp", "precision": P, "threads": THREADS,
                           "flash_attention": FLASH,
                           "workload": {"batch_size": 1, "prompt_tokens": S, "output_tokens": N}},
                "constraints": {"latency_ms": limit},
                "budgets": {"search_tokens": int(SEARCH_TOKENS), "distill_tokens": 0},
                "data": {"calibration": C4, "distillation": C4},
                "evaluation": {"tasks": ["arc_easy"], "limit": 20, "seed": 1234}, "export": ["gguf"]}
        specp = os.path.join(OUT, "spec.%s.json" % P)
        json.dump(spec, open(specp, "w"), indent=1)
        os.makedirs(jobdir, exist_ok=True)
        # the job reuses the calibration above (same target, engine build and key)
        subprocess.run(["cp", "-r", os.path.join(OUT, "data", "calibrations"), jobdir], check=True)
        # and the ranking of an earlier type's job: the rank stage runs in the built-in
        # engine on the same text whatever the target (its cache key says so)
        for q in PRECS:
            rc = os.path.join(OUT, "job.%s" % q, "rankcache")
            if q != P and os.path.isdir(rc) and os.listdir(rc):
                subprocess.run(["cp", "-r", rc, jobdir], check=True)
                break
        t0 = time.time()
        fin = json.loads(run([BIN, "run", specp, "--out", jobdir]))
        assert fin["status"] == "succeeded", fin
        json.dump(fin, open(os.path.join(jobdir, "job.json"), "w"), indent=1)
        print("%s: job %.0f s" % (P, time.time() - t0), flush=True)
    rep = json.load(open(os.path.join(jobdir, "report.json")))
    arch = rep["result"]["arch"]
    archp = os.path.join(OUT, "result.%s.arch.json" % P)
    json.dump(arch, open(archp, "w"))
    # independent timing, fresh processes, alternating
    a, b = [], []
    for _ in range(ROUNDS):
        a.append(time_fresh(pg))
        b.append(time_fresh(os.path.join(jobdir, "model.gguf")))
    pa, pb = statistics.median(a), statistics.median(b)
    est = json.loads(run([BIN, "estimate", "--arch", archp, "--prompt", str(S), "--output", str(N), "--data-dir",
                          os.path.join(OUT, "data"), "--json"]))
    est_parent = json.loads(run([BIN, "estimate", "--model", MODEL, "--prompt", str(S), "--output", str(N),
                                 "--data-dir", os.path.join(OUT, "data"), "--json"]))
    row = {r["name"]: r for r in rep["limits"]}["latency_ms"]
    v = cal["validation"]
    grid = sorted({e["ffn_dim"] for e in cal["tables"]["prefill"] if e["part"] == "mlp"})
    hid = cal["cost"]["hidden_sizes"]
    sdoc = json.load(open(os.path.join(jobdir, "search.json")))
    aim = sdoc.get("aim", {})
    rows.append(dict(P=P, cal=cal, v=v, grid=grid, hid=hid, parent_ms=parent_ms, limit=limit, pred=row["predicted"],
                     aimed=aim.get("latency_ms"), served=sdoc.get("served"), checks=sdoc.get("checks", {}),
                     procs=rep["result"]["measured"].get("process_latencies_ms", []),
                     meas=row["measured"], holds=row["holds"], indep_parent=pa, indep_result=pb,
                     indep_holds=pb <= limit, builtin_ratio=est["predicted"]["latency_ms"] /
                     est_parent["predicted"]["latency_ms"], fallbacks=rep["engine"]["fallback_tensors"],
                     params=rep["result"]["params"] if "params" in rep["result"] else None,
                     hidden=arch["hidden_size"], layers=len(arch["layers"]),
                     size=os.path.getsize(os.path.join(jobdir, "model.gguf")), psize=os.path.getsize(pg)))
    print(json.dumps({k: x for k, x in rows[-1].items() if k not in ("cal", "v", "served")}), flush=True)
    write_report(rows)   # after each type: a cut-short run still leaves its rows

print(write_report(rows))
PY
