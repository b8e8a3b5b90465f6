"""End to end through HTTP on a mixture-of-experts parent: a tiny Qwen2-MoE (random weights
written here as config.json + safetensors: MoE layers of 8 experts, top 2, with a shared
expert, one dense layer; stories260K's tokenizer). A job with an impossible latency limit
fails at rank and leaves the calibration that prices the parent (POST /v1/estimates); a job
with a latency limit at 85% of the parent's predicted latency and a parameter limit at 75%
of its parameters (heads, FFN widths and expert counts searched; not the hidden size nor
depth) then succeeds: its report's arch is a qwen2_moe arch whose expert counts
differ between layers (top-k capped at each count), its predicted latency and parameters
are within the limits, the measured ones are reported with `holds`, the search offered the
shared expert's narrower widths, and the HF export is a Qwen2MoeForCausalLM config with
block_configs whose per-layer experts and shared-expert widths are the report's, and it loads
back (`autocompress inspect`) as the same arch."""
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

C, V, L, H, KV, D = 64, 512, 4, 4, 2, 16
E, K, FE, FS, FD = 8, 2, 32, 48, 96


def make_model(d, fam="qwen2_moe", experts=E, dense=(2,)):
    """Qwen2-MoE (a shared expert, q/k/v biases; layers in `dense` are dense MLPs:
    mlp_only_layers) or Mixtral (fam "mixtral": no shared expert, no biases, every layer MoE)."""
    qwen = fam == "qwen2_moe"
    rng = np.random.default_rng(7 if qwen else 6)
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, C)), "model.norm.weight": np.ones(C)}

    def lin(o, i):
        return rng.normal(0, 1.0 / np.sqrt(i), (o, i))
    for l in range(L):
        p = "model.layers.%d." % l
        w[p + "input_layernorm.weight"] = np.ones(C)
        w[p + "post_attention_layernorm.weight"] = np.ones(C)
        for n, o in (("q", H * D), ("k", KV * D), ("v", KV * D)):
            w[p + "self_attn.%s_proj.weight" % n] = lin(o, C)
            if qwen:
                w[p + "self_attn.%s_proj.bias" % n] = rng.normal(0, 0.1, o)
        w[p + "self_attn.o_proj.weight"] = lin(C, H * D)
        if l in dense:
            w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = lin(FD, C), lin(FD, C)
            w[p + "mlp.down_proj.weight"] = lin(C, FD)
            continue
        m = p + ("mlp." if qwen else "block_sparse_moe.")
        w[m + "gate.weight"] = lin(experts, C) * 4
        names = ("gate_proj", "up_proj", "down_proj") if qwen else ("w1", "w3", "w2")
        for e in range(experts):
            q = m + "experts.%d." % e
            w[q + names[0] + ".weight"], w[q + names[1] + ".weight"] = lin(FE, C), lin(FE, C)
            w[q + names[2] + ".weight"] = lin(C, FE)
        if qwen:
            q = p + "mlp.shared_expert."
            w[q + "gate_proj.weight"], w[q + "up_proj.weight"] = lin(FS, C), lin(FS, C)
            w[q + "down_proj.weight"] = lin(C, FS)
            w[p + "mlp.shared_expert_gate.weight"] = lin(1, C)
    os.makedirs(d, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in w.items()},
              os.path.join(d, "model.safetensors"))
    cfg = {"vocab_size": V, "hidden_size": C, "num_hidden_layers": L, "num_attention_heads": H,
           "num_key_value_heads": KV, "num_experts_per_tok": K, "max_position_embeddings": 256,
           "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "torch_dtype": "float32"}
    if qwen:
        cfg.update(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", intermediate_size=FD,
                   moe_intermediate_size=FE, shared_expert_intermediate_size=FS, num_experts=experts,
                   norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=list(dense))
    else:
        cfg.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=experts,
                   intermediate_size=FE)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)


def spec(model, constraints):
    return {"name": "e2e-moe", "model": {"path": model, "tokenizer": TOK},
            "target": {"device": "cpu", "precision": "fp32",
                       "workload": {"batch_size": 1, "prompt_tokens": 32, "output_tokens": 8}},
            "constraints": constraints, "budgets": {"search_tokens": 8192, "distill_tokens": 4096},
            "search_space": {"hidden": False, "depth": False},
            "data": {"calibration": TEXT, "distillation": TEXT},
            "evaluation": {"tasks": ["arc_easy"], "limit": 8, "seed": 1234}, "export": ["hf"]}


def main():
    with tempfile.TemporaryDirectory() as tmp, server(args=["--data-root", DATA, "--data-root", tmp]) as s:
        model = os.path.join(tmp, "qwen2moe-tiny")
        make_model(model)
        _, _, job = s.json("POST", "/v1/jobs", spec(model, {"latency_ms": 0.001}), expect=201)
        fin = wait_terminal(s, job["id"], 600)
        assert fin["status"] == "failed" and fin["stage"] == "rank", fin
        _, _, rep = s.json("GET", "/v1/jobs/%s/report" % job["id"], expect=200)
        parent = rep["parent"]["arch"]
        assert parent["family"] == "qwen2_moe" and parent["layers"][0]["moe"]["n_experts"] == E, parent
        target = spec(model, {})["target"]
        _, _, est = s.json("POST", "/v1/estimates", {"arch": parent, "target": target}, expect=200)
        lat, params = est["predicted"]["latency_ms"], rep["parent"]["params"]
        print("parent: %.3f ms predicted, %d params" % (lat, params))

        # served_check false: this test is about the family, so the tables as calibrated decide
        # (test_e2e_stories checks the anchor and the served checks)
        lim = {"latency_ms": 0.85 * lat, "params": int(0.75 * params), "margin_pct": 5,
               "served_check": False}
        _, _, job = s.json("POST", "/v1/jobs", spec(model, lim), expect=201)
        fin = wait_terminal(s, job["id"], 1200)
        assert fin["status"] == "succeeded", fin
        _, _, rep = s.json("GET", "/v1/jobs/%s/report" % job["id"], expect=200)
        arch = rep["result"]["arch"]
        counts = [y["moe"]["n_experts"] if y.get("moe") else None for y in arch["layers"]]
        print("result: %s" % [(y["source_layer"], y.get("attention"), y.get("mlp"), y.get("moe")) for y in arch["layers"]])
        moe = [c for c in counts if c]
        assert arch["family"] == "qwen2_moe", arch
        assert len(set(moe)) > 1, "expert counts do not vary per layer: %s" % counts
        for y in arch["layers"]:
            if y.get("moe"):
                assert y["moe"]["top_k"] == min(K, y["moe"]["n_experts"]), y
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
        assert conf["architectures"] == ["Qwen2MoeForCausalLM"], conf
        got = [b["ffn"].get("moe", {}).get("num_local_experts") for b in conf["block_configs"]]
        assert got == counts, (got, counts)
        shared = [y["moe"]["shared_ffn_dim"] if y.get("moe") else None for y in arch["layers"]]
        got = [b["ffn"].get("moe", {}).get("shared_expert_intermediate_dim") for b in conf["block_configs"]]
        assert got == shared, (got, shared)
        # the search offered narrower shared experts among those the calibration priced (12, 24,
        # 36; 8 counts x 3 routed widths x 2 shared widths fill the axis)
        _, sblob = download(s, job["id"], "search.json")
        offered = {c.get("shared_width") for y in json.loads(sblob)["distribution"]["layers"]
                   for c in y.get("experts", [])} - {None}
        assert offered and offered <= {12, 24, 36}, offered
        back = json.loads(subprocess.run([AC_BIN, "inspect", os.path.dirname(cfgs[0]), "--json"], capture_output=True,
                                         text=True, check=True).stdout)
        back = back.get("arch", back)
        assert [y.get("moe") for y in back["layers"]] == [y.get("moe") for y in arch["layers"]], back
        print("PASS: per-layer experts %s (shared experts %s) under latency %.3f ms and %d params, exported and "
              "reloaded" % (counts, shared, lim["latency_ms"], lim["params"]))


if __name__ == "__main__":
    main()
