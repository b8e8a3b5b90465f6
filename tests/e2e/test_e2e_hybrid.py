"""End to end through HTTP on a hybrid Mamba-2 parent: a tiny Nemotron-H (random weights written
here as the Hub's checkpoints are: NemotronHForCausalLM config.json with hybrid_override_pattern
"M*MEMEM" (MoE layers of 8 squared-ReLU experts behind a sigmoid router with its correction
bias, top 2, a shared expert, routed scale 2.5) and time_step_limit [0.0, Infinity], backbone.*
safetensors, conv1d [cd, 1, K];
stories260K's tokenizer). A job with an impossible latency limit fails at rank and leaves the
calibration that prices the parent (POST /v1/estimates; its tables time Mamba mixers per head
count). A job with a latency limit at 95% of the parent's predicted latency and a parameter
limit at 85% of its parameters (the Mamba head count searched; attention heads and MLP widths
stay, as NemotronHForCausalLM holds one of each; hidden size and depth held) then succeeds: its
report's arch is a nemotron_h arch with one Mamba head count for every Mamba layer, a multiple
of the groups and below the parent's, its predicted costs are
within the limits, the measured ones are reported with `holds`, and the HF export is a
NemotronHForCausalLM config whose mamba_num_heads and pattern are the report's, which loads back
(`autocompress inspect`) as the same arch, and the GGUF export is llama.cpp's nemotron_h_moe. A
third job exporting "hf" alone under 90% of the parameters ends with expert counts that differ per
MoE layer, written as NemotronH block_configs and reloaded as the report's arch (llama.cpp's GGUF
holds one count, so with "gguf" asked the experts stay). Random weights: no quality claim."""
# store: incidental (its jobs under PostgreSQL: test_e2e_stories; not run again in the PostgreSQL pass)
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import AC_BIN, DATA, TEXT, TOK, download, server, tar_member, wait_terminal  # noqa: E402

C, V, H, KV, D, F = 64, 512, 4, 2, 16, 128
MH, MP, S, G, K = 8, 8, 16, 2, 4
E, TOPK, FE, FS = 8, 2, 32, 48
PATTERN = "M*MEMEM"


def make_model(d):
    rng = np.random.default_rng(11)
    di, cd = MH * MP, MH * MP + 2 * G * S

    def lin(o, i):
        return rng.normal(0, 1.0 / np.sqrt(i), (o, i))
    w = {"backbone.embeddings.weight": rng.normal(0, 0.5, (V, C)), "backbone.norm_f.weight": np.ones(C),
         "lm_head.weight": lin(V, C)}
    for l, ch in enumerate(PATTERN):
        p = "backbone.layers.%d." % l
        w[p + "norm.weight"] = np.ones(C)
        if ch == "M":
            w[p + "mixer.in_proj.weight"] = lin(di + cd + MH, C)
            w[p + "mixer.conv1d.weight"] = rng.normal(0, 0.5, (cd, 1, K))
            w[p + "mixer.conv1d.bias"] = rng.normal(0, 0.1, cd)
            w[p + "mixer.dt_bias"] = rng.normal(-1, 0.5, MH)
            w[p + "mixer.A_log"] = np.log(np.arange(1, MH + 1, dtype=np.float64))
            w[p + "mixer.D"] = np.ones(MH)
            w[p + "mixer.norm.weight"] = np.ones(di)
            w[p + "mixer.out_proj.weight"] = lin(C, di)
        elif ch == "E":
            w[p + "mixer.gate.weight"] = lin(E, C) * 4
            w[p + "mixer.gate.e_score_correction_bias"] = rng.normal(0, 0.1, E)
            for e in range(E):
                w[p + "mixer.experts.%d.up_proj.weight" % e] = lin(FE, C)
                w[p + "mixer.experts.%d.down_proj.weight" % e] = lin(C, FE)
            w[p + "mixer.shared_experts.up_proj.weight"] = lin(FS, C)
            w[p + "mixer.shared_experts.down_proj.weight"] = lin(C, FS)
        elif ch == "*":
            for n, o in (("q", H * D), ("k", KV * D), ("v", KV * D)):
                w[p + "mixer.%s_proj.weight" % n] = lin(o, C)
            w[p + "mixer.o_proj.weight"] = lin(C, H * D)
        else:
            w[p + "mixer.up_proj.weight"], w[p + "mixer.down_proj.weight"] = lin(F, C), lin(C, F)
    os.makedirs(d, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in w.items()},
              os.path.join(d, "model.safetensors"))
    cfg = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": V, "hidden_size": C,
           "intermediate_size": F, "num_hidden_layers": len(PATTERN), "hybrid_override_pattern": PATTERN,
           "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": D, "mamba_num_heads": MH,
           "mamba_head_dim": MP, "ssm_state_size": S, "n_groups": G, "conv_kernel": K, "layer_norm_epsilon": 1e-5,
           "max_position_embeddings": 256, "tie_word_embeddings": False, "mlp_hidden_act": "relu2",
           "mamba_hidden_act": "silu", "use_conv_bias": True, "time_step_limit": [0.0, float("inf")],
           "n_routed_experts": E, "num_experts_per_tok": TOPK, "moe_intermediate_size": FE,
           "moe_shared_expert_intermediate_size": FS, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5,
           "norm_topk_prob": True, "torch_dtype": "float32"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)


def spec(model, constraints, export=("hf", "gguf")):
    return {"name": "e2e-hybrid", "model": {"path": model, "tokenizer": TOK},
            "target": {"device": "cpu", "precision": "fp32",
                       "workload": {"batch_size": 1, "prompt_tokens": 32, "output_tokens": 8}},
            "constraints": constraints, "budgets": {"search_tokens": 8192, "distill_tokens": 4096},
            # expert widths off: a cut of them can meet these limits alone, and this job is
            # here for the Mamba head axis (widths: tests/unit/test_search_dnas.c)
            "search_space": {"hidden": False, "depth": False, "expert_widths": False},
            "data": {"calibration": TEXT, "distillation": TEXT},
            "evaluation": {"tasks": ["arc_easy"], "limit": 8, "seed": 1234}, "export": list(export)}


def main():
    with tempfile.TemporaryDirectory() as tmp, server(args=["--data-root", DATA, "--data-root", tmp]) as s:
        model = os.path.join(tmp, "nemotron-h-tiny")
        make_model(model)
        _, _, job = s.json("POST", "/v1/jobs", spec(model, {"latency_ms": 0.001}), expect=201)
        fin = wait_terminal(s, job["id"], 600)
        assert fin["status"] == "failed" and fin["stage"] == "rank", fin
        _, _, rep = s.json("GET", "/v1/jobs/%s/report" % job["id"], expect=200)
        parent = rep["parent"]["arch"]
        assert parent["family"] == "nemotron_h" and parent["layers"][0]["mamba"]["n_heads"] == MH, parent
        target = spec(model, {})["target"]
        _, _, est = s.json("POST", "/v1/estimates", {"arch": parent, "target": target}, expect=200)
        lat, params = est["predicted"]["latency_ms"], rep["parent"]["params"]
        print("parent: %.3f ms predicted, %d params" % (lat, params))

        # the tiny model's cheapest arch predicts about 0.86 of the parent (fixed costs
        # dominate): 0.9 less the 5% margin sat on that edge and failed by calibration noise
        # served_check false: this test is about the family, so the tables as calibrated decide
        # (test_e2e_stories checks the anchor and the served checks)
        lim = {"latency_ms": 0.95 * lat, "params": int(0.85 * params), "margin_pct": 5,
               "served_check": False}
        _, _, job = s.json("POST", "/v1/jobs", spec(model, lim), expect=201)
        fin = wait_terminal(s, job["id"], 1200)
        assert fin["status"] == "succeeded", fin
        _, _, rep = s.json("GET", "/v1/jobs/%s/report" % job["id"], expect=200)
        arch = rep["result"]["arch"]
        heads = [y["mamba"]["n_heads"] for y in arch["layers"] if y.get("mamba")]
        print("result: %s" % [(y["source_layer"], y.get("attention"), y.get("mlp"), y.get("mamba", {}).get("n_heads"),
                               (y.get("moe") or {}).get("n_experts"))
                               for y in arch["layers"]])
        assert arch["family"] == "nemotron_h", arch
        assert heads and len(set(heads)) == 1 and heads[0] % G == 0 and heads[0] < MH, \
            "one Mamba head count per model, below the parent's: %s" % heads
        for x in rep["limits"]:
            print("limit %s: limit %.4g predicted %.4g measured %s holds %s" % (
                x["name"], x["limit"], x["predicted"], x.get("measured"), x.get("holds")))
            assert x["predicted"] <= x["limit"] * (1 + 1e-9), x
            assert "holds" in x
        _, blob = download(s, job["id"], "model-hf.tar")
        out = os.path.join(tmp, "export")
        with tarfile.open(fileobj=io.BytesIO(blob)) as t:
            t.extractall(out)   # our own tarball (its member names are checked by test_tar)
        cfgs = [os.path.join(r, f) for r, _, fs in os.walk(out) for f in fs if f == "config.json"]
        conf = json.loads(tar_member(blob, "config.json"))
        pat = "".join("M" if y.get("mamba") else "*" if y.get("attention") else "E" if y.get("moe") else "-"
                      for y in arch["layers"])
        assert conf["architectures"] == ["NemotronHForCausalLM"] and conf["mamba_num_heads"] == heads[0] and \
            conf["hybrid_override_pattern"] == pat, conf
        back = json.loads(subprocess.run([AC_BIN, "inspect", os.path.dirname(cfgs[0]), "--json"], capture_output=True,
                                         text=True, check=True).stdout)
        back = back.get("arch", back)
        assert [y.get("mamba") for y in back["layers"]] == [y.get("mamba") for y in arch["layers"]], back
        _, gguf = download(s, job["id"], "model.gguf")   # llama.cpp runs it: tests/oracle/test_export_llamacpp_hybrid.py
        assert gguf[:4] == b"GGUF" and b"nemotron_h_moe" in gguf[:4096], "the GGUF export is llama.cpp's nemotron_h_moe"
        experts = per_layer_experts(s, model, params, tmp)
        print("PASS: Mamba heads %d (of %d), pattern %s, hidden %d under latency %.3f ms and %d params, exported "
              "and reloaded; with \"hf\" alone, experts per layer %s" % (heads[0], MH, pat, arch["hidden_size"],
                                                                         lim["latency_ms"], lim["params"], experts))


def per_layer_experts(s, model, params, tmp):
    """A job exporting "hf" alone (NemotronH block_configs hold per-layer expert counts; llama.cpp's
    GGUF holds one) under 90% of the parameters: the search varies the MoE layers' expert counts,
    the export carries them and reloads as the report's arch."""
    lim = {"params": int(0.9 * params)}   # exact, so the search is the same on every machine
    _, _, job = s.json("POST", "/v1/jobs", spec(model, lim, export=("hf",)), expect=201)
    fin = wait_terminal(s, job["id"], 1200)
    assert fin["status"] == "succeeded", fin
    _, _, rep = s.json("GET", "/v1/jobs/%s/report" % job["id"], expect=200)
    arch = rep["result"]["arch"]
    experts = [y["moe"]["n_experts"] for y in arch["layers"] if y.get("moe")]
    assert len(set(experts)) > 1 and all(0 < n <= E for n in experts), \
        "expert counts that differ per layer: %s" % experts
    assert all(x["predicted"] <= x["limit"] * (1 + 1e-9) and "holds" in x for x in rep["limits"]), rep["limits"]
    _, blob = download(s, job["id"], "model-hf.tar")
    conf = json.loads(tar_member(blob, "config.json"))
    bl = [b["ffn"]["moe"]["num_local_experts"] for b in conf["block_configs"] if b.get("ffn")]
    assert bl == experts, (bl, experts)
    out = os.path.join(tmp, "export-experts")
    with tarfile.open(fileobj=io.BytesIO(blob)) as t:
        t.extractall(out)
    cfg = [r for r, _, fs in os.walk(out) for f in fs if f == "config.json"][0]
    back = json.loads(subprocess.run([AC_BIN, "inspect", cfg, "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    back = back.get("arch", back)
    assert [(y.get("moe") or {}).get("n_experts") for y in back["layers"]] == \
        [(y.get("moe") or {}).get("n_experts") for y in arch["layers"]], back
    return experts


if __name__ == "__main__":
    main()
