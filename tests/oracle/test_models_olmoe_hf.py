"""Oracle: OLMoE checkpoints (family olmoe) in Hugging Face's layout, read, pruned and written.
A tiny random OlmoeForCausalLM (config.json as OlmoeConfig writes it; safetensors with model.*
names: self_attn.q_norm / k_norm over the whole q and k rows, mlp.gate and mlp.experts.e.*) is
written here. transformers 4.40.2 has no OLMoE class; the reference is the independent float64
MoE model of tests/oracle/test_engine_oracle_moe.py (softmax top-k without renormalization,
whole-row q/k RMSNorm before RoPE). Checks:
  - `inspect --json` reads the family, 6 experts top 2 and norm_topk_prob false;
  - the engine's logits on the checkpoint equal the reference's;
  - the HF export writes OlmoeForCausalLM and reloads with identical logits; pruning to the
    parent's own arch is the identity;
  - pruning experts (router rows with them) and attention heads (q_norm / k_norm channels with
    their heads) equals the reference on weights sliced here by hand; the HF class holds the
    experts' cut (its export reloads) and refuses the heads' (head_dim = hidden / heads);
  - ranking in place (heads and experts permuted, the norms' channels with them) keeps the
    parent's logits;
  - a job (`autocompress run`) under a parameter limit runs every stage and exports both formats;
  - clip_qkv is refused naming the field; the GGUF export is llama.cpp's olmoe
    (tests/oracle/test_export_llamacpp_moe.py runs it).
Random weights: no quality claim. Run with $AC_PYTHON."""
import json
import os
import struct
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_engine_oracle_moe as moe  # noqa: E402
import test_models_hybrid_hf as hf  # noqa: E402

torch.set_default_dtype(torch.float64)
V, C, H, L, E, K, F = 512, 32, 4, 3, 6, 2, 12
D = C // H
check = hf.check


def make_checkpoint(d, seed=5, kv=H):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, std=0.3, base=0.0):
        return (base + torch.randn(*shape, generator=g) * std).to(torch.float32).to(torch.float64)

    W = {"model.embed_tokens.weight": rnd(V, C, std=1.0), "model.norm.weight": rnd(C, base=1, std=0.1),
         "lm_head.weight": rnd(V, C)}
    for l in range(L):
        p = "model.layers.%d." % l
        W[p + "input_layernorm.weight"] = rnd(C, base=1, std=0.1)
        W[p + "post_attention_layernorm.weight"] = rnd(C, base=1, std=0.1)
        for n in "qo":
            W[p + "self_attn.%s_proj.weight" % n] = rnd(C, C)
        for n in "kv":
            W[p + "self_attn.%s_proj.weight" % n] = rnd(kv * D, C)
        W[p + "self_attn.q_norm.weight"] = rnd(C, base=1, std=0.2)
        W[p + "self_attn.k_norm.weight"] = rnd(kv * D, base=1, std=0.2)
        W[p + "mlp.gate.weight"] = rnd(E, C, std=1.0)
        for e in range(E):
            W[p + "mlp.experts.%d.gate_proj.weight" % e] = rnd(F, C)
            W[p + "mlp.experts.%d.up_proj.weight" % e] = rnd(F, C)
            W[p + "mlp.experts.%d.down_proj.weight" % e] = rnd(C, F)
    os.makedirs(d, exist_ok=True)
    hf.write_safetensors(os.path.join(d, "model.safetensors"), W)
    conf = {"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "vocab_size": V, "hidden_size": C,
            "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": kv,
            "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0, "clip_qkv": None,
            "num_experts_per_tok": K, "num_experts": E, "norm_topk_prob": False, "output_router_logits": False,
            "router_aux_loss_coef": 0.01, "tie_word_embeddings": False, "torch_dtype": "float32"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(conf, f)
    return W, conf


def ref_logits(W, heads=H, kv=H, experts=E):
    a = {"V": V, "C": C, "D": D, "theta": 10000.0, "eps": 1e-5, "tied": 0, "bias": 0, "rope": (0, 0.0, 0.0, 0.0, 0),
         "family": "olmoe", "layers": [(heads, kv, 0, experts, min(K, experts), F, 0, 0)] * L}
    with torch.no_grad():
        return moe.model_forward(a, W, torch.tensor([hf.IDS])).numpy()[0]


def sliced(W, heads, experts):
    """The first `heads` heads (each its own KV head) and the first `experts` experts."""
    out = {}
    for k, v in W.items():
        if k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            v = v[:heads * D]
        elif k.endswith(("q_norm.weight", "k_norm.weight")):
            v = v[:heads * D]
        elif k.endswith("o_proj.weight"):
            v = v[:, :heads * D]
        elif k.endswith("mlp.gate.weight"):
            v = v[:experts]
        elif ".experts." in k and int(k.split(".experts.")[1].split(".")[0]) >= experts:
            continue
        out[k] = v
    return out


def main():
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "ids.txt"), "w") as f:
            f.write(" ".join(map(str, hf.IDS)))
        d = os.path.join(tmp, "parent")
        W, conf = make_checkpoint(d)
        a = json.loads(hf.run([hf.AC, "inspect", d, "--json"]).stdout)
        mo = a["layers"][0]["moe"]
        check(a["family"] == "olmoe" and len(a["layers"]) == L and mo["n_experts"] == E and mo["top_k"] == K and
              not mo["norm_topk_prob"] and a["layers"][0]["attention"] == {"n_heads": H, "n_kv_heads": H},
              "inspect reads OlmoeForCausalLM: 3 MoE layers of 6 experts, top 2, not renormalized: %s" % mo)
        eng, _ = hf.engine_logits(d, tmp, "parent")
        e = hf.rel(eng, ref_logits(W))
        check(e < 1e-4, "engine logits on the checkpoint = float64 reference with q/k norms (rel err %.2e)" % e)

        x = os.path.join(tmp, "export")
        hf.engine_logits(d, tmp, "x", "--hf", x)
        xc = json.load(open(os.path.join(x, "config.json")))
        hdr_len = struct.unpack("<Q", open(os.path.join(x, "model.safetensors"), "rb").read(8))[0]
        hdr = json.loads(open(os.path.join(x, "model.safetensors"), "rb").read(8 + hdr_len)[8:])
        back, _ = hf.engine_logits(x, tmp, "xb")
        check(xc["architectures"] == ["OlmoeForCausalLM"] and xc["num_experts"] == E and xc["intermediate_size"] == F
              and xc["norm_topk_prob"] is False and "model.layers.0.self_attn.k_norm.weight" in hdr and
              np.array_equal(back, eng), "HF export: OlmoeForCausalLM with q_norm/k_norm, reloads with identical logits")

        ap = os.path.join(tmp, "same.json")
        with open(ap, "w") as f:
            json.dump(a, f)
        same, _ = hf.engine_logits(d, tmp, "same", "--arch", ap)
        check(np.array_equal(same, eng), "pruning to the parent's own arch is the identity (bit-identical logits)")

        cut = dict(a, layers=[dict(l, attention={"n_heads": 2, "n_kv_heads": 2},
                                   moe=dict(l["moe"], n_experts=4)) for l in a["layers"]])
        cp = os.path.join(tmp, "cut.json")
        with open(cp, "w") as f:
            json.dump(cut, f)
        pe, _ = hf.engine_logits(d, tmp, "cut", "--arch", cp)
        e = hf.rel(pe, ref_logits(sliced(W, 2, 4), heads=2, kv=2, experts=4))
        check(e < 1e-4, "2 of 4 heads (q_norm / k_norm channels with them) and 4 of 6 experts = the reference on "
                        "weights sliced by hand (rel err %.2e)" % e)
        r = hf.run([hf.TOOL, d, "--arch", cp, "--hf", os.path.join(tmp, "no"), "--logits", os.path.join(tmp, "ids.txt"),
                    os.path.join(tmp, "no.f32")], expect=3)
        check("head_dim" in r.stderr, "fewer query heads than hidden / head_dim: OlmoeForCausalLM cannot hold it, "
                                      "refused: %s" % r.stderr.strip()[-100:])
        cut4 = dict(a, layers=[dict(l, moe=dict(l["moe"], n_experts=4)) for l in a["layers"]])
        cp4 = os.path.join(tmp, "cut4.json")
        with open(cp4, "w") as f:
            json.dump(cut4, f)
        px = os.path.join(tmp, "pruned-hf")
        p4, _ = hf.engine_logits(d, tmp, "cut4", "--arch", cp4, "--hf", px)
        pb, _ = hf.engine_logits(px, tmp, "cut4b")
        e = hf.rel(p4, ref_logits(sliced(W, H, 4), experts=4))
        check(e < 1e-4 and np.array_equal(pb, p4) and json.load(open(os.path.join(px, "config.json")))["num_experts"] == 4,
              "4 of 6 experts = the reference (rel err %.2e); its export (num_experts 4) reloads with the same logits" % e)

        rk = os.path.join(tmp, "ranked")
        hf.run([hf.AC, "prune", d, "--arch", ap, "--out", rk, "--tokenizer", hf.TOK, "--calib", hf.TEXT,
                "--calib-tokens", "512", "--layer-tokens", "0", "--batch", "2", "--seq", "64", "--no-reconstruct"])
        rj = json.load(open(os.path.join(rk, "ranking.json")))
        perm = rj["layers"][0].get("heads", {}).get("perm") or rj["layers"][0].get("head_perm")
        ranked, _ = hf.engine_logits(rk, tmp, "ranked")
        e = hf.rel(ranked, eng)
        check(e < 1e-5, "ranked in place (heads and experts permuted, the norms' channels with them; layer 0 heads %s), "
                        "the parent's logits (rel err %.2e)" % (perm, e))

        rep, jd = hf.run_job(d, tmp, "olmoe", 50000, ["hf", "gguf"])
        res, lim = rep["result"]["arch"], rep["limits"][0]
        xc = json.loads(hf.tar_config(os.path.join(jd, "model-hf.tar")))
        gg = open(os.path.join(jd, "model.gguf"), "rb").read(4096)
        check(res["family"] == "olmoe" and lim["holds"] and lim["measured"] <= 50000 and
              xc["architectures"] == ["OlmoeForCausalLM"] and xc["num_hidden_layers"] == len(res["layers"]) and
              b"olmoe" in gg, "a job under 50,000 parameters (of %d) succeeds with %d layers of %d experts (%d "
              "measured), exported as OlmoeForCausalLM and llama.cpp's olmoe" % (
                  rep["parent"]["params"], len(res["layers"]), res["layers"][0]["moe"]["n_experts"], lim["measured"]))
        b = os.path.join(tmp, "bad-clip")
        os.makedirs(b)
        with open(os.path.join(b, "config.json"), "w") as f:
            json.dump(dict(conf, clip_qkv=8.0), f)
        os.symlink(os.path.join(d, "model.safetensors"), os.path.join(b, "model.safetensors"))
        r = hf.run([hf.AC, "inspect", b], expect=1)
        check("clip_qkv" in r.stderr, "refused, naming clip_qkv: %s" % r.stderr.strip()[-110:])
        hf.run([hf.AC, "export", d, "--out", os.path.join(tmp, "x.gguf"), "--format", "gguf", "--dtype", "fp32",
                "--tokenizer", hf.TOK])
        gg = open(os.path.join(tmp, "x.gguf"), "rb").read(1 << 16)
        check(gg[:4] == b"GGUF" and b"olmoe" in gg and b"attn_q_norm" in gg,
              "GGUF export writes llama.cpp's olmoe with attn_q_norm / attn_k_norm")
    if hf.failures:
        print("FAIL:\n  " + "\n  ".join(hf.failures))
        sys.exit(1)
    print("PASS: OLMoE read, pruned and written")


if __name__ == "__main__":
    main()
