"""llama.cpp as the target engine for mixture-of-experts parents whose every layer pairs
attention with experts (Qwen2-MoE with a shared expert, Mixtral; random weights), end to end
through HTTP at F32, 32 + 8 tokens, 2 threads. llama.cpp's qwen2moe and llama graphs hold one
shape for every layer of a model, so:
- POST /v1/calibrations with target.engine "llama.cpp" calibrates inside llama.cpp by
  repeated whole layers at the parent's hidden size and heads, one model per expert block:
  the tables hold the parent's attention (priced 0: it is never apart from its experts in a
  model llama.cpp runs), an entry per expert count from 2 up to the parent's at its expert
  width, and counts at 1/4, 1/2 and 3/4 of that width, and (Qwen2-MoE) the parent's experts
  beside a shared expert of 1/4, 1/2 and 3/4 of its width; the held-out random archs (a depth
  and one expert count and width each) were measured in fresh llama.cpp processes, their
  memory predicted within 5%;
- POST /v1/estimates with the same target is answered from that calibration, and the parent's
  prediction is within a factor of three of what llama.cpp measured for it (the anchor);
- a job searching expert counts (not depth) with a params limit at 85% of the parent's (two
  experts fewer in every layer meet it) and a latency limit (10x the parent's llama.cpp
  prediction: the tiny model's ms-long requests are mostly fixed costs, and a few ms of
  host noise crossed 3x in test_e2e_llamacpp_hybrid), exporting GGUF, succeeds:
  the report names the engine, latency measured in llama.cpp holds, the params limit holds,
  and the result has one expert block for every layer (llama.cpp's GGUF holds one), fewer
  experts (at least 2, top-k within them), narrower ones or a narrower shared expert than
  the parent's;
- the same calibration for a Mixtral parent (llama.cpp's llama graph with experts).
Random weights: no quality claim."""
# store: incidental (its jobs under PostgreSQL: test_e2e_stories; not run again in the PostgreSQL pass)
# sanitize: once (49 s under ASan; its job path is test_e2e_llamacpp's, its GGUF export test_models_gguf_families')
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import AC_BIN, DATA, TEXT, TOK, calibrate, llamacpp_job, server  # noqa: E402
from test_e2e_moe import K, L, H, C, FE, FS, make_model  # noqa: E402

TARGET = {"device": "cpu", "engine": "llama.cpp", "precision": "f32", "threads": 2,
          "workload": {"batch_size": 1, "prompt_tokens": 32, "output_tokens": 8}}
E = 6


def check_calibration(s, model, fam):
    body = {"model": {"path": model, "tokenizer": TOK}, "target": TARGET}
    cal = calibrate(s, body)
    assert cal["engine"]["name"] == "llama.cpp" and cal["family"] == fam, (cal["engine"], cal["family"])
    tb = cal["tables"]
    experts = sorted({e["moe"]["n_experts"] for e in tb["prefill"] if e.get("moe")})
    widths = sorted({e["moe"]["expert_ffn_dim"] for e in tb["prefill"] if e.get("moe")})
    attn = [e for e in tb["prefill"] if e.get("n_heads")]
    assert experts == list(range(2, E + 1)), experts
    assert widths == [FE // 4, FE // 2, 3 * FE // 4, FE], widths
    # Qwen2-MoE's shared expert at 1/4, 1/2 and 3/4 of its width beside the parent's experts
    # (one shared width per model, as the GGUF holds it); Mixtral has none
    shared = sorted({e["moe"]["shared_ffn_dim"] for e in tb["prefill"] if e.get("moe")})
    assert shared == ([FS // 4, FS // 2, 3 * FS // 4, FS] if fam == "qwen2_moe" else [0]), shared
    assert len(attn) == 1 and attn[0]["n_heads"] == H and attn[0]["ms"] == 0, attn
    assert all(e["ms"] > 0 for e in tb["prefill"] if e.get("moe")), tb["prefill"]
    assert {f["hidden_size"] for f in tb["fixed"]["by_hidden"]} == {C}, tb["fixed"]
    v = cal["validation"]
    assert v["archs"] >= 4 and v["memory_mape_pct"] < 5, v
    drawn = set()
    for r in v["rows"]:   # held-out archs: one expert count and width for the whole model
        blocks = {(y["moe"]["n_experts"], y["moe"]["expert_ffn_dim"]) for y in r["arch"]["layers"]}
        assert len(blocks) == 1 and all(y.get("attention") for y in r["arch"]["layers"]), r["arch"]
        drawn |= blocks
    assert len({w for _, w in drawn}) > 1, drawn   # widths are validated, not only counts
    _, _, est = s.json("POST", "/v1/estimates", body, expect=200)
    lat = est["predicted"]["latency_ms"]
    assert lat > 0 and est["calibration_id"] == cal["id"], (est, cal["id"])
    measured = v["anchor"]["parent_measured_ms"]
    assert measured / 3 < lat < 3 * measured, (lat, measured)
    print("%s: experts %s; held-out in llama.cpp: latency MAPE %.2f%% (max %.2f%%), memory MAPE %.2f%% (max %.2f%%); "
          "parent predicted %.3f ms, served %.3f ms" % (fam, experts, v["latency_mape_pct"], v["latency_max_pct"],
                                                       v["memory_mape_pct"], v["memory_max_pct"], lat, measured))
    return lat


def main():
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "qwen2moe")
        make_model(model, "qwen2_moe", E, ())
        s = server(args=["--data-root", DATA, "--data-root", tmp])
        try:
            s.start()
            lat = check_calibration(s, model, "qwen2_moe")
            out = subprocess.run([AC_BIN, "inspect", model], capture_output=True, text=True, check=True).stdout
            params = int(out.split("parameters:")[1].split()[0])
            limit = round(10.0 * lat, 6)
            spec = {"name": "e2e-llamacpp-moe", "model": {"path": model, "tokenizer": TOK}, "target": TARGET,
                    "constraints": {"latency_ms": limit, "params": int(0.85 * params)},
                    "budgets": {"search_tokens": 8192, "distill_tokens": 4096},
                    "search_space": {"hidden": False, "depth": False},
                    "data": {"calibration": TEXT, "distillation": TEXT},
                    "evaluation": {"tasks": ["arc_easy"], "limit": 8, "seed": 1234}, "export": ["gguf"]}
            rep = llamacpp_job(s, spec)
            m = rep["result"]["measured"]
            assert m["llama_cpp_buffers"]["kv"] > 0, m
            row = {r["name"]: r for r in rep["limits"]}["latency_ms"]
            layers = rep["result"]["arch"]["layers"]
            shapes = {json.dumps([y.get("attention"), y.get("moe")], sort_keys=True) for y in layers}
            ne, fe, fs = (layers[0]["moe"][k] for k in ("n_experts", "expert_ffn_dim", "shared_ffn_dim"))
            assert len(layers) == L and len(shapes) == 1 and 2 <= ne <= E and fe <= FE and fs <= FS, layers
            assert (ne, fe, fs) != (E, FE, FS), layers[0]
            assert layers[0]["moe"]["top_k"] == min(K, ne), layers[0]
            print("parent measured %s, result %s" % (rep["parent"]["measured"].get("process_latencies_ms"),
                                                     m.get("process_latencies_ms")))
            print("job: %d experts of %d units and a shared expert of %d (parent %d of %d, %d) in every layer, limit "
                  "%.3f ms, predicted %.3f ms, measured in llama.cpp %.3f ms, holds %s"
                  % (ne, fe, fs, E, FE, FS, limit, row["predicted"], row["measured"], row["holds"]))

            model = os.path.join(tmp, "mixtral")
            make_model(model, "mixtral", E, ())
            check_calibration(s, model, "mixtral")
        finally:
            s.stop()
    print("PASS: llama.cpp calibration, estimate and job on Qwen2-MoE; calibration and estimate on Mixtral")


if __name__ == "__main__":
    main()
