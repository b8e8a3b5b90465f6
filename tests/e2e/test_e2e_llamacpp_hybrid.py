"""llama.cpp as the target engine for a Nemotron-H hybrid (Mamba-2 mixers, attention, a dense
MLP and sigmoid-routed MoE layers; random weights, the tiny model of test_e2e_hybrid.py),
end to end through HTTP at F32, 32 + 8 tokens, 2 threads:
- POST /v1/calibrations with target.engine "llama.cpp" calibrates inside llama.cpp by
  repeated blocks of llama.cpp's nemotron_h graph, one block per layer: the tables hold
  entries for every Mamba head count, every expert count, attention and dense MLP widths,
  the shared expert at 1/4, 1/2 and 3/4 of its width beside the parent's experts (one
  shared width per model, as the GGUF holds it), and the memory model keeps the recurrent state at f32 (llama.cpp's RS buffer) beside the
  KV cache; the held-out random archs (one Mamba head count and one expert count each, as
  llama.cpp holds) were measured in fresh llama.cpp processes, their memory predicted
  within 5%;
- POST /v1/estimates with the same target is answered from that calibration;
- a job with a params limit at 85% of the parent's and a latency limit (LATENCY_HEADROOM
  times the parent's llama.cpp prediction: the tiny model's 1.5-3 ms requests are mostly
  fixed costs, and fresh processes' times, to which a job anchors its tables, spread by
  tens of percent; at 3x, one full run measured 5.73 ms against a 3.18 ms limit), exporting GGUF,
  succeeds: its report names the engine, the measured latency comes from llama.cpp and
  holds, the params limit holds, and the result keeps one Mamba head count, one expert
  count, width and shared width at most the parent's (what the GGUF holds) and an attention
  layer;
- a Mamba-2 model (llama.cpp's mamba2 graph: Mamba mixers only) calibrates in llama.cpp too
  (a base of one Mamba layer per head count), is estimated from it, and a job cut by a
  params limit holds its limits measured in llama.cpp;
- a LatentMoE (Nemotron 3 Super's routed experts in a latent of 12) calibrates in llama.cpp
  with the parent's experts at latents 3, 6 and 9 beside its own (one latent per model, as
  the GGUF holds it), and a job searching the latent alone under a params limit exports a
  GGUF of one narrower latent that llama.cpp serves within its limits.
Random weights: no quality claim."""
# store: incidental (its jobs under PostgreSQL: test_e2e_stories; not run again in the PostgreSQL pass)
# sanitize: once (83 s under ASan; its job path is test_e2e_llamacpp's, its GGUF export test_models_gguf_families')
import os
import subprocess
import sys
import tempfile

# The latency limits over the parent's predicted latency: the params limits make the
# searches cut; the latency limits check that the measurement comes from llama.cpp and
# holds, at a level a few ms of host noise on ms-long requests cannot cross.
LATENCY_HEADROOM = 10.0

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import AC_BIN, DATA, TEXT, TOK, calibrate, llamacpp_job, server  # noqa: E402
from test_e2e_hybrid import FS, make_model  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
os.environ.setdefault("AC_BIN", AC_BIN)   # the oracle's checkpoint writers read it
import test_models_hybrid_hf as hy  # noqa: E402
import test_models_mamba2_hf as m2  # noqa: E402

TARGET = {"device": "cpu", "engine": "llama.cpp", "precision": "f32", "threads": 2,
          "workload": {"batch_size": 1, "prompt_tokens": 32, "output_tokens": 8}}


def main():
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "hybrid")
        make_model(model)
        s = server(args=["--data-root", DATA, "--data-root", tmp])
        try:
            s.start()
            body = {"model": {"path": model, "tokenizer": TOK}, "target": TARGET}
            cal = calibrate(s, body)
            assert cal["engine"]["name"] == "llama.cpp", cal["engine"]
            tb = cal["tables"]
            mamba = sorted({e["mamba"]["n_heads"] for e in tb["prefill"] if e.get("mamba")})
            experts = sorted({e["moe"]["n_experts"] for e in tb["prefill"] if e.get("moe")})
            attn = sorted({e["n_heads"] for e in tb["prefill"] if e.get("n_heads")})
            assert mamba and experts and attn, (mamba, experts, attn)
            # the parent's experts beside a shared expert of 1/4, 1/2 and 3/4 of its width (one
            # shared width per model, as llama.cpp's nemotron_h holds it)
            shared = sorted({e["moe"]["shared_ffn_dim"] for e in tb["prefill"] if e.get("moe")})
            assert shared == [FS // 4, FS // 2, 3 * FS // 4, FS], shared
            assert tb["memory"]["state_bytes_per_element"] == 4, tb["memory"]
            v = cal["validation"]
            assert v["archs"] >= 4 and v["memory_mape_pct"] < 5, v
            print("tables: Mamba heads %s, experts %s, attention heads %s; held-out in llama.cpp: latency MAPE "
                  "%.2f%% (max %.2f%%), memory MAPE %.2f%% (max %.2f%%)"
                  % (mamba, experts, attn, v["latency_mape_pct"], v["latency_max_pct"], v["memory_mape_pct"],
                     v["memory_max_pct"]))

            _, _, est = s.json("POST", "/v1/estimates", body, expect=200)
            lat = est["predicted"]["latency_ms"]
            assert lat > 0 and est["calibration_id"] == cal["id"], (est, cal["id"])
            # the tiny model's latency is mostly fixed costs, and a job anchors its tables to the
            # parent as llama.cpp serves it then (noise of a few ms processes moves that level):
            # the params limit makes the search cut, the latency limit is the one measured
            out = subprocess.run([AC_BIN, "inspect", model], capture_output=True, text=True, check=True).stdout
            params = int(out.split("parameters:")[1].split()[0])
            limit = round(LATENCY_HEADROOM * lat, 6)
            spec = {"name": "e2e-llamacpp-hybrid", "model": {"path": model, "tokenizer": TOK}, "target": TARGET,
                    "constraints": {"latency_ms": limit, "params": int(0.85 * params)}, "budgets": {"search_tokens": 8192, "distill_tokens": 4096},
                    "search_space": {"hidden": False, "depth": False},
                    "data": {"calibration": TEXT, "distillation": TEXT},
                    "evaluation": {"tasks": ["arc_easy"], "limit": 8, "seed": 1234}, "export": ["gguf"]}
            rep = llamacpp_job(s, spec)
            assert rep["result"]["measured"]["llama_cpp_buffers"]["kv"] > 0, rep["result"]["measured"]
            row = {r["name"]: r for r in rep["limits"]}["latency_ms"]
            layers = rep["result"]["arch"]["layers"]
            mh = {l["mamba"]["n_heads"] for l in layers if l.get("mamba")}
            ne = {l["moe"]["n_experts"] for l in layers if l.get("moe")}
            nw = {l["moe"]["expert_ffn_dim"] for l in layers if l.get("moe")}
            ns = {l["moe"]["shared_ffn_dim"] for l in layers if l.get("moe")}
            assert len(mh) == 1 and len(ne) <= 1 and len(nw) <= 1 and any(l.get("attention") for l in layers), layers
            assert len(ns) <= 1 and all(0 < s <= FS for s in ns), ns
            print("job: limit %.3f ms, predicted %.3f ms, measured in llama.cpp %.3f ms, holds %s; Mamba heads %s, "
                  "experts %s of %s units, shared expert %s" % (limit, row["predicted"], row["measured"], row["holds"],
                                                                 mh, ne, nw, ns))

            # a Mamba-2 parent: every layer a Mamba mixer, llama.cpp's mamba2 graph
            m2dir = os.path.join(tmp, "mamba2")
            m2.make_mamba2(m2dir, m2.CFG)
            body = {"model": {"path": m2dir, "tokenizer": TOK}, "target": TARGET}
            cal = calibrate(s, body)
            tb, v = cal["tables"], cal["validation"]
            mamba = sorted({e["mamba"]["n_heads"] for e in tb["prefill"] if e.get("mamba")})
            assert len(mamba) >= 2 and not any(e.get("n_heads") or e.get("ffn_dim") for e in tb["prefill"]), mamba
            assert tb["memory"]["state_bytes_per_element"] == 4 and v["memory_mape_pct"] < 5, (tb["memory"], v)
            _, _, est = s.json("POST", "/v1/estimates", body, expect=200)
            assert est["predicted"]["latency_ms"] > 0 and est["calibration_id"] == cal["id"], est
            print("mamba2: Mamba heads %s; held-out in llama.cpp: latency MAPE %.2f%% (max %.2f%%), memory MAPE "
                  "%.2f%% (max %.2f%%)" % (mamba, v["latency_mape_pct"], v["latency_max_pct"], v["memory_mape_pct"],
                                           v["memory_max_pct"]))
            out = subprocess.run([AC_BIN, "inspect", m2dir], capture_output=True, text=True, check=True).stdout
            p2 = int(out.split("parameters:")[1].split()[0])
            lim = {"latency_ms": round(LATENCY_HEADROOM * est["predicted"]["latency_ms"], 6), "params": int(0.9 * p2)}
            rep = llamacpp_job(s, dict(spec, name="e2e-llamacpp-mamba2", model=body["model"], constraints=lim))
            rows = {r["name"]: r for r in rep["limits"]}
            mh = {l["mamba"]["n_heads"] for l in rep["result"]["arch"]["layers"] if l.get("mamba")}
            print("mamba2 job: Mamba heads %s, latency measured in llama.cpp %.3f ms (limit %.3f), params %d (limit %d)"
                  % (mh, rows["latency_ms"]["measured"], lim["latency_ms"], rows["params"]["measured"], lim["params"]))

            # a LatentMoE parent: its latent searched alone, one for the model
            ldir = os.path.join(tmp, "latent")
            hy.make_checkpoint(ldir, dict(hy.MOE, Lt=12, pattern="ME*E"), seed=13)   # no dense MLP: nemotron_h_moe
            body = {"model": {"path": ldir, "tokenizer": TOK}, "target": TARGET}
            cal = calibrate(s, body)
            tb, v = cal["tables"], cal["validation"]
            lts = sorted({e["moe"]["latent_dim"] for e in tb["prefill"] if e.get("moe")})
            assert lts == [3, 6, 9, 12] and v["memory_mape_pct"] < 5, (lts, v)
            _, _, est = s.json("POST", "/v1/estimates", body, expect=200)
            out = subprocess.run([AC_BIN, "inspect", ldir], capture_output=True, text=True, check=True).stdout
            pl = int(out.split("parameters:")[1].split()[0])
            lim = {"latency_ms": round(LATENCY_HEADROOM * est["predicted"]["latency_ms"], 6), "params": int(0.97 * pl)}
            axes = {k: False for k in ("hidden", "heads", "ffn", "experts", "expert_widths", "shared_expert_widths",
                                       "mamba_heads", "depth")}
            rep = llamacpp_job(s, dict(spec, name="e2e-llamacpp-latent", model=body["model"], constraints=lim,
                                       search_space=axes))
            rows = {r["name"]: r for r in rep["limits"]}
            lt = {l["moe"]["latent_dim"] for l in rep["result"]["arch"]["layers"] if l.get("moe")}
            assert len(lt) == 1 and max(lt) < 12, lt
            print("latent: tables at latents %s; held-out in llama.cpp: latency MAPE %.2f%%, memory MAPE %.2f%%; job: "
                  "latent %s, latency measured in llama.cpp %.3f ms (limit %.3f), params %d (limit %d)"
                  % (lts, v["latency_mape_pct"], v["memory_mape_pct"], lt, rows["latency_ms"]["measured"],
                     lim["latency_ms"], rows["params"]["measured"], lim["params"]))
        finally:
            s.stop()
    print("PASS: llama.cpp calibration, estimate and job on a Nemotron-H hybrid, a Mamba-2 model and a LatentMoE")


if __name__ == "__main__":
    main()
