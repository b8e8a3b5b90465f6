"""bench/families/llamacpp_job.py — llama.cpp as the target engine for a family model of
random weights (timing only): the Nemotron-H-shaped hybrid of bench/families/make_hybrid.py,
or the Qwen2-MoE at SmolLM2-135M's dimensions of bench/families/make_moe.py:
a calibration inside llama.cpp through HTTP (2 threads, B=1, 256 + 64 tokens, the parent's
hidden size) and its held-out errors, then a job with a latency limit at 70% of the parent's
llama.cpp prediction exporting GGUF, and the parent's and the result's GGUF timed again
independently (BUILD/ac-llama bench, a fresh process each, parent and result alternating,
ROUNDS rounds of a warm-up and 3 requests, medians). Prints the machine's ceilings (sgemm
GFLOP/s, triad GB/s: BUILD/tools/ceilings_probe, 2 threads) measured first, and markdown tables.
usage: llamacpp_job.py MODEL_DIR (make_hybrid.py / make_moe.py OUT 512: a vocabulary stories260K's tokenizer
covers) [PRECISION] [ROUNDS]   (env AC_BIN, AC_SHARED)"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "e2e"))
from e2e_common import AC_BIN, DATA, TEXT, TOK, download, server, wait_terminal  # noqa: E402


def serve_ms(helper, gguf):
    out = subprocess.run([helper, "bench", gguf, "--threads", "2", "--prompt", "256", "--output", "64", "--reps",
                          "3"], capture_output=True, text=True, timeout=900, check=True)
    reps = json.loads(out.stdout)["reps"]
    return statistics.median(r["prefill_ms"] + sum(r["decode_ms"]) for r in reps)


def main():
    model, prec = os.path.abspath(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "f32"
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    probe = os.path.join(os.path.dirname(AC_BIN), "tools", "ceilings_probe")
    ceil = subprocess.run([probe], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="2")).stdout.strip()
    target = {"device": "cpu", "engine": "llama.cpp", "precision": prec, "threads": 2,
              "workload": {"batch_size": 1, "prompt_tokens": 256, "output_tokens": 64}}
    with tempfile.TemporaryDirectory() as tmp:
        s = server(args=["--data-root", DATA, "--data-root", os.path.dirname(model), "--data-root", tmp])
        try:
            s.start()
            t0 = time.time()
            # a job under an impossible limit calibrates the parent's hidden size (a calibration
            # request would calibrate every hidden size a default job searches) and stops at rank
            spec = {"name": "bench-llamacpp-job", "model": {"path": model, "tokenizer": TOK}, "target": target,
                    "search_space": {"hidden": False}, "constraints": {"latency_ms": 0.001},
                    "budgets": {"search_tokens": 16384, "distill_tokens": 8192},
                    "data": {"calibration": TEXT, "distillation": TEXT},
                    "evaluation": {"tasks": ["arc_easy"], "limit": 8, "seed": 1234}, "export": ["gguf"]}
            _, _, j = s.json("POST", "/v1/jobs", spec, expect=201)
            fin = wait_terminal(s, j["id"], 7200)
            assert fin["status"] == "failed" and fin["stage"] == "rank", fin
            _, _, rep = s.json("GET", "/v1/jobs/%s/report" % j["id"], expect=200)
            v, cal_s = rep["calibration_validation"], time.time() - t0
            _, _, est = s.json("POST", "/v1/estimates", {"arch": rep["parent"]["arch"], "target": target},
                               expect=200)
            lat = est["predicted"]["latency_ms"]
            limit = round(0.7 * lat, 3)
            t0 = time.time()
            _, _, j = s.json("POST", "/v1/jobs", dict(spec, constraints={"latency_ms": limit}), expect=201)
            fin = wait_terminal(s, j["id"], 7200)
            assert fin["status"] == "succeeded", fin
            job_s = time.time() - t0
            _, _, rep = s.json("GET", "/v1/jobs/%s/report" % j["id"], expect=200)
            row = {r["name"]: r for r in rep["limits"]}["latency_ms"]
            sdoc = rep.get("search") or {}
            served = sdoc.get("served") or {}
            _, gguf = download(s, j["id"], "model.gguf")
        finally:
            s.stop()
        res_path, par_path = os.path.join(tmp, "result.gguf"), os.path.join(tmp, "parent.gguf")
        with open(res_path, "wb") as f:
            f.write(gguf)
        subprocess.run([AC_BIN, "export", model, "--format", "gguf", "--dtype", "fp32" if prec == "f32" else "q8_0",
                        "--tokenizer", TOK, "--out", par_path], capture_output=True, check=True)
        helper = os.path.join(os.path.dirname(AC_BIN), "ac-llama")
        par, out = [], []
        for _ in range(rounds):
            par.append(serve_ms(helper, par_path))
            out.append(serve_ms(helper, res_path))
    arch = rep["result"]["arch"]["layers"]
    mh = sorted({l["mamba"]["n_heads"] for l in arch if l.get("mamba")})
    ne = sorted({l["moe"]["n_experts"] for l in arch if l.get("moe")})
    attn = [l["attention"]["n_heads"] for l in arch if l.get("attention")]
    ffn = [l["mlp"]["ffn_dim"] for l in arch if l.get("mlp")]
    print("Machine ceilings (measured first, 2 threads): " + "; ".join(ceil.splitlines()))
    print()
    print("| precision | held-out archs | latency MAPE (max) | memory MAPE (max) | naive memory MAPE | calibration s |")
    print("|---|---|---|---|---|---|")
    print("| %s | %d | %.2f%% (%.2f%%) | %.2f%% (%.2f%%) | %.2f%% | %.0f |"
          % (prec, v["archs"], v["latency_mape_pct"], v["latency_max_pct"], v["memory_mape_pct"], v["memory_max_pct"],
             v["naive_memory_mape_pct"], cal_s))
    print()
    print("| parent predicted ms | limit ms | result: Mamba heads, expert counts, attention heads, MLP widths, layers | job predicted "
          "/ measured ms | holds (job) | independent parent / result ms (median of %d) | result/parent | job s |"
          % rounds)
    print("|---|---|---|---|---|---|---|---|")
    pm, rm = statistics.median(par), statistics.median(out)
    print("| %.1f | %.1f | %s, %s, %s, %s, %d | %.1f / %.1f | %s | %.1f / %.1f (%.1f-%.1f / %.1f-%.1f) | %.3f | %.0f |"
          % (lat, limit, mh, ne, attn, ffn, len(arch), row["predicted"], row["measured"], row["holds"], pm, rm,
             min(par), max(par), min(out), max(out), rm / pm, job_s))


    print()
    print("The search's aim and its served checks (each arch in a fresh llama.cpp process beside the parent):")
    print("aim: %s" % json.dumps(sdoc.get("aim")))
    print("anchor: %s" % json.dumps(served.get("anchor")))
    for c in served.get("checks", []):
        print("- predicted %.1f ms, served %.1f ms (x%.3f of the parent): %s" % (
            c.get("predicted_latency_ms", 0), c["latency_ms"], c["ratio_to_parent"], c["arch"][:120]))


if __name__ == "__main__":
    main()
