"""Oracle: GGUF files of the MoE and Mamba-2 families as parents. Tiny random checkpoints of each
family (the writers of tests/oracle/test_models_{hybrid,mamba2,olmoe}_hf.py, and Mixtral and
Qwen2-MoE written here) are exported as llama.cpp names them (`autocompress export --format
gguf`: mamba2, nemotron_h, nemotron_h_moe with and without LatentMoE, olmoe, qwen2moe, llama with
experts) and read back as parents. Checks, per family:
  - `inspect` reads the GGUF as the checkpoint's arch (the family, every layer's blocks, experts,
    Mamba shape, latent);
  - F32: the engine's logits from the GGUF equal those from the checkpoint (stacked experts
    split back per expert, ssm_a = -exp(A_log) back to A_log, q/k un-permuted for Mixtral);
  - Q8_0: every tensor, written back out of the GGUF parent as HF safetensors, equals the
    checkpoint's within Q8_0's rounding (half a step of 1/127 of each 32-block's largest value,
    and the f16 scale's own rounding: 0.6 steps; random tiny
    Mamba layers amplify that rounding too much for a logits tolerance to mean anything);
  - pruning from the GGUF parent (experts or Mamba heads cut) equals pruning from the checkpoint.
A GGUF of an architecture not read is refused naming the ones that are. Run with $AC_PYTHON."""
import json
import os
import sys
import tempfile

import numpy as np
import torch
from safetensors.numpy import load_file as load

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_models_hybrid_hf as hf  # noqa: E402
import test_models_mamba2_hf as m2  # noqa: E402
import test_models_olmoe_hf as ol  # noqa: E402

check = hf.check


def make_softmax_moe(d, fam, seed=3):
    """A Mixtral or Qwen2-MoE checkpoint (GQA, 4 experts top 2; Qwen2-MoE with q/k/v biases and a
    gated shared expert, norm_topk_prob false as llama.cpp's qwen2moe runs it)."""
    g = torch.Generator().manual_seed(seed)
    V, C, L, H, KV, E, K, F, S = 512, 32, 2, 4, 2, 4, 2, 16, 12
    D = C // H

    def rnd(*shape, base=0.0, std=0.3):
        return base + torch.randn(*shape, generator=g) * std
    qwen = fam == "qwen2_moe"
    W = {"model.embed_tokens.weight": rnd(V, C, std=1.0), "model.norm.weight": rnd(C, base=1, std=0.1),
         "lm_head.weight": rnd(V, C)}
    for l in range(L):
        p = "model.layers.%d." % l
        W[p + "input_layernorm.weight"] = rnd(C, base=1, std=0.1)
        W[p + "post_attention_layernorm.weight"] = rnd(C, base=1, std=0.1)
        for n, o in (("q", H * D), ("k", KV * D), ("v", KV * D)):
            W[p + "self_attn.%s_proj.weight" % n] = rnd(o, C)
            if qwen:
                W[p + "self_attn.%s_proj.bias" % n] = rnd(o, std=0.1)
        W[p + "self_attn.o_proj.weight"] = rnd(C, H * D)
        m = p + ("mlp." if qwen else "block_sparse_moe.")
        W[m + "gate.weight"] = rnd(E, C, std=1.0)
        names = ("gate_proj", "up_proj", "down_proj") if qwen else ("w1", "w3", "w2")
        for e in range(E):
            for n, sh in zip(names, ((F, C), (F, C), (C, F))):
                W[m + "experts.%d.%s.weight" % (e, n)] = rnd(*sh)
        if qwen:
            for n, sh in (("gate_proj", (S, C)), ("up_proj", (S, C)), ("down_proj", (C, S))):
                W[p + "mlp.shared_expert.%s.weight" % n] = rnd(*sh)
            W[p + "mlp.shared_expert_gate.weight"] = rnd(1, C)
    os.makedirs(d, exist_ok=True)
    hf.write_safetensors(os.path.join(d, "model.safetensors"), W)
    cfg = {"vocab_size": V, "hidden_size": C, "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV,
           "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
           "num_experts_per_tok": K, "torch_dtype": "float32"}
    if qwen:
        cfg.update(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", num_experts=E, intermediate_size=F,
                   moe_intermediate_size=F, shared_expert_intermediate_size=S, norm_topk_prob=False)
    else:
        cfg.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=E, intermediate_size=F)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)


def logits(path, tmp, tag, *extra):
    out, _ = hf.engine_logits(path, tmp, tag, *extra)
    return out


def case(tmp, tag, make, want_arch, cut):
    d = os.path.join(tmp, tag)
    make(d)
    a = json.loads(hf.run([hf.AC, "inspect", d, "--json"]).stdout)
    ref = logits(d, tmp, tag + "-hf")
    for dt in ("fp32", "q8_0"):
        gg = os.path.join(tmp, "%s-%s.gguf" % (tag, dt))
        hf.run([hf.AC, "export", d, "--out", gg, "--format", "gguf", "--dtype", dt, "--tokenizer", hf.TOK])
        b = json.loads(hf.run([hf.AC, "inspect", gg, "--json"]).stdout)
        same = b["family"] == a["family"] and all([l.get(k) for l in b["layers"]] == [l.get(k) for l in a["layers"]]
                                                  for k in ("moe", "mamba", "attention", "mlp"))
        if dt == "fp32":
            e = float(np.abs(logits(gg, tmp, tag + "-gg") - ref).max())
            check(same and e == 0, "%s: its F32 GGUF (%s) reads back as the checkpoint's %s arch with the same logits "
                                   "(max |diff| %.1e)" % (tag, want_arch, a["family"], e))
            continue
        x = os.path.join(tmp, tag + "-q8-hf")
        hf.run([hf.AC, "export", gg, "--out", x, "--format", "hf", "--dtype", "fp32"])
        A, B = load(os.path.join(d, "model.safetensors")), load(os.path.join(x, "model.safetensors"))
        worst, missing = 0.0, [k for k in A if k not in B and not (k == "lm_head.weight" and a["tie_word_embeddings"])]
        for k in A:
            if k in B:
                u, v = A[k].reshape(-1), B[k].reshape(-1)
                n = u.size // 32 * 32
                blk = np.repeat(np.abs(u[:n]).reshape(-1, 32).max(1), 32) if n else np.zeros(0)
                bound = np.concatenate([blk / 127 * 0.6, np.full(u.size - n, np.abs(u).max() / 1000 + 1e-7)]) + 1e-6
                worst = max(worst, float((np.abs(u - v) / bound).max()))
        check(same and not missing and worst <= 1.0,
              "%s: its Q8_0 GGUF reads back as the same arch, every tensor within Q8_0's rounding (worst %.2f of the "
              "bound; missing %s)" % (tag, worst, missing))
    cp = os.path.join(tmp, tag + "-cut.json")
    with open(cp, "w") as f:
        json.dump(cut(a), f)
    p_hf = logits(d, tmp, tag + "-cut-hf", "--arch", cp)
    p_gg = logits(os.path.join(tmp, tag + "-fp32.gguf"), tmp, tag + "-cut-gg", "--arch", cp)
    check(np.array_equal(p_hf, p_gg), "%s: pruned from the GGUF parent = pruned from the checkpoint" % tag)


def cut_experts(a, n=3):
    b = dict(a, layers=[dict(l) for l in a["layers"]])
    for l in b["layers"]:
        if l.get("moe"):
            l["moe"] = dict(l["moe"], n_experts=n)
    return b


def cut_mamba(a, n=4):
    b = dict(a, layers=[dict(l) for l in a["layers"]])
    for l in b["layers"]:
        if l.get("mamba"):
            l["mamba"] = dict(l["mamba"], n_heads=n)
    return b


def main():
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "ids.txt"), "w") as f:
            f.write(" ".join(map(str, hf.IDS)))
        case(tmp, "mamba2", lambda d: m2.make_mamba2(d, m2.CFG), "mamba2", cut_mamba)
        case(tmp, "nemotron-h", lambda d: hf.make_checkpoint(d, hf.CFG), "nemotron_h", cut_mamba)
        moe = dict(hf.MOE, pattern="ME*EM")
        case(tmp, "nemotron-h-moe", lambda d: hf.make_checkpoint(d, moe, seed=9), "nemotron_h_moe",
             lambda a: cut_mamba(cut_experts(a, 4)))
        case(tmp, "nemotron-h-latent", lambda d: hf.make_checkpoint(d, dict(moe, Lt=12), seed=13), "nemotron_h_moe",
             lambda a: cut_experts(a, 4))
        case(tmp, "olmoe", lambda d: ol.make_checkpoint(d), "olmoe", cut_experts)
        case(tmp, "qwen2moe", lambda d: make_softmax_moe(d, "qwen2_moe"), "qwen2moe", cut_experts)
        case(tmp, "mixtral", lambda d: make_softmax_moe(d, "mixtral"), "llama with experts", cut_experts)
        bad = os.path.join(tmp, "bad.gguf")
        raw = open(os.path.join(tmp, "mamba2-fp32.gguf"), "rb").read()
        at = raw.find(b"mamba2")
        with open(bad, "wb") as f:   # general.architecture "mamba9": same length, unknown
            f.write(raw[:at] + b"mamba9" + raw[at + 6:])
        r = hf.run([hf.AC, "inspect", bad], expect=1)
        check("not supported" in r.stderr and "nemotron_h" in r.stderr,
              "an unknown GGUF architecture is refused naming the ones read: %s" % r.stderr.strip()[-120:])
    if hf.failures:
        print("FAIL:\n  " + "\n  ".join(hf.failures))
        sys.exit(1)
    print("PASS: GGUF parents of the MoE and Mamba-2 families read back as their checkpoints")


if __name__ == "__main__":
    main()
