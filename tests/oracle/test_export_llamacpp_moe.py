# tier: slow (needs llama-cpp-python built from PyPI; run with make test-slow)
"""GGUF exports of the MoE families run in llama.cpp (llama-cpp-python) as in the engine.

Tiny random models written here (config.json + safetensors): a Mixtral (GGUF arch `llama`
with experts; interleaved RoPE) and a Qwen2-MoE with a shared expert and q/k/v biases (GGUF
`qwen2moe`; norm_topk_prob false, as llama.cpp computes it), and an OLMoE (GGUF `olmoe`: q and
k RMS-normed over their rows; tests/oracle/test_models_olmoe_hf.py's writer), whole and with
its experts cut to 4 of 6, and to 4 of 6 each cut to half its units. Each is exported as F32 GGUF by
the engine side (tests/tools/export_interop --no-vocab: llama.cpp runs token ids) and llama.cpp
scores the same 24 token ids: every position's logits agree with the engine's (max abs
difference under 1e-3 of the logits' scale). Archs llama.cpp cannot hold are refused by the
exporter with the reason: per-layer expert counts, a renormalizing Qwen2-MoE, a dense layer,
an OLMoE with fewer KV heads than query heads (llama.cpp sizes k_norm by the hidden size).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

try:
    from llama_cpp import Llama
except ImportError:
    print("FAIL: llama_cpp (llama-cpp-python) is not importable from", sys.executable)
    sys.exit(1)
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_models_olmoe_hf as olmoe  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AC_BIN = os.environ.get("AC_BIN", os.path.join(ROOT, "build", "autocompress"))
TOOL = os.path.join(os.path.dirname(AC_BIN), "tools", "export_interop")
IDS = [1, 17, 42, 5, 9, 61, 3, 33, 8, 27, 50, 12, 7, 44, 19, 2, 38, 60, 21, 14, 11, 29, 31, 6]
V, C, L, H, KV, E, K, F, S = 64, 64, 3, 4, 2, 4, 2, 48, 40
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def make(d, fam, norm=None, dense_layer=None):
    rng = np.random.default_rng(11 if fam == "mixtral" else 12)
    D = C // H

    def lin(o, i):
        return rng.normal(0, 1.0 / np.sqrt(i), (o, i))
    w = {"model.embed_tokens.weight": rng.normal(0, 1.0, (V, C)), "model.norm.weight": 1 + 0.1 * rng.normal(size=C)}
    qwen = fam == "qwen2_moe"
    for l in range(L):
        p = "model.layers.%d." % l
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.normal(size=C)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.normal(size=C)
        for n, o in (("q", H * D), ("k", KV * D), ("v", KV * D)):
            w[p + "self_attn.%s_proj.weight" % n] = lin(o, C)
            if qwen:
                w[p + "self_attn.%s_proj.bias" % n] = rng.normal(0, 0.2, o)
        w[p + "self_attn.o_proj.weight"] = lin(C, H * D)
        if l == dense_layer:
            for n, sh in (("gate_proj", (F, C)), ("up_proj", (F, C)), ("down_proj", (C, F))):
                w[p + "mlp.%s.weight" % n] = lin(*sh)
            continue
        m = p + ("mlp." if qwen else "block_sparse_moe.")
        w[m + "gate.weight"] = lin(E, C) * 3
        names = ("gate_proj", "up_proj", "down_proj") if qwen else ("w1", "w3", "w2")
        for e in range(E):
            for n, sh in zip(names, ((F, C), (F, C), (C, F))):
                w[m + "experts.%d.%s.weight" % (e, n)] = lin(*sh)
        if qwen:
            for n, sh in (("gate_proj", (S, C)), ("up_proj", (S, C)), ("down_proj", (C, S))):
                w[p + "mlp.shared_expert.%s.weight" % n] = lin(*sh)
            w[p + "mlp.shared_expert_gate.weight"] = lin(1, C)
    os.makedirs(d, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in w.items()}, os.path.join(d, "model.safetensors"))
    cfg = {"vocab_size": V, "hidden_size": C, "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV,
           "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
           "num_experts_per_tok": K, "torch_dtype": "float32"}
    if qwen:
        cfg.update(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", num_experts=E, intermediate_size=F,
                   moe_intermediate_size=F, shared_expert_intermediate_size=S, norm_topk_prob=bool(norm),
                   mlp_only_layers=[dense_layer] if dense_layer is not None else [])
    else:
        cfg.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=E,
                   intermediate_size=F)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))


def engine_and_gguf(d, tmp, tag, arch=None):
    out, gg = os.path.join(tmp, tag + ".f32"), os.path.join(tmp, tag + ".gguf")
    ids = os.path.join(tmp, "ids.txt")
    cmd = [TOOL, d] + (["--arch", arch] if arch else []) + ["--no-vocab", "--gguf", gg, "--logits", ids, out]
    return subprocess.run(cmd, capture_output=True, text=True), out, gg


def llama_logits(gguf, f32_cache=False):
    kv = dict(type_k=0, type_v=0) if f32_cache else {}   # GGML_TYPE_F32; llama.cpp's default is F16
    llm = Llama(model_path=gguf, n_ctx=64, n_threads=2, logits_all=True, verbose=False, n_batch=64, **kv)
    llm.eval(IDS)
    return np.array(llm.scores[:len(IDS)], dtype=np.float32)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "ids.txt"), "w").write(" ".join(map(str, IDS)))
        for fam, tag in (("mixtral", "mixtral"), ("qwen2_moe", "qwen2moe")):
            d = os.path.join(tmp, tag)
            make(d, fam, norm=False)
            r, out, gg = engine_and_gguf(d, tmp, tag)
            if r.returncode != 0:
                check(False, "%s: export %s" % (tag, r.stderr.strip()[-300:]))
                continue
            eng = np.fromfile(out, dtype=np.float32).reshape(len(IDS), -1)
            ref = llama_logits(gg)
            diff = float(np.abs(eng - ref).max())
            scale = float(np.abs(eng).max())
            check(diff < 1e-3 * scale and "class=%s" % ("llama" if fam == "mixtral" else "qwen2moe") in r.stdout,
                  "%s: llama.cpp logits = engine logits on the GGUF export (max |diff| %.2e, logits up to %.1f)" %
                  (tag, diff, scale))
            if fam == "mixtral":   # per-layer expert counts: refused
                a = json.loads(subprocess.run([AC_BIN, "inspect", d, "--json"], capture_output=True, text=True,
                                              check=True).stdout)
                a = a.get("arch", a)
                a["layers"][1]["moe"]["n_experts"] = 3
                ap = os.path.join(tmp, "het.json")
                json.dump(a, open(ap, "w"))
                r, _, gg = engine_and_gguf(d, tmp, "het", ap)
                check(r.returncode == 3 and "one shape for every layer" in r.stdout and not os.path.exists(gg),
                      "per-layer expert counts are refused for GGUF: " + r.stdout.strip()[:100])
        d = os.path.join(tmp, "olmoe")
        olmoe.make_checkpoint(d)
        a = json.loads(subprocess.run([AC_BIN, "inspect", d, "--json"], capture_output=True, text=True,
                                      check=True).stdout)
        a = a.get("arch", a)
        olmoe.make_checkpoint(os.path.join(tmp, "olmoe-gqa"), kv=2)
        half = a["layers"][0]["moe"]["expert_ffn_dim"] // 2   # every expert cut to its first units
        for tag, change in (("olmoe", None), ("olmoe-cut", dict(n_experts=4)),
                            ("olmoe-narrow", dict(n_experts=4, expert_ffn_dim=half)), ("olmoe-gqa", "kv")):
            ap = None
            if change == "kv":
                d = os.path.join(tmp, "olmoe-gqa")
            elif change:
                b = dict(a, layers=[dict(l) for l in a["layers"]])
                for l in b["layers"]:
                    l["moe"] = dict(l["moe"], **change)
                ap = os.path.join(tmp, tag + ".json")
                json.dump(b, open(ap, "w"))
            r, out, gg = engine_and_gguf(d, tmp, tag, ap)
            if change == "kv":
                check(r.returncode == 3 and "KV heads" in r.stdout and not os.path.exists(gg),
                      "refused for llama.cpp's olmoe: " + (r.stdout + r.stderr).strip()[:160])
                continue
            eng = np.fromfile(out, dtype=np.float32).reshape(len(IDS), -1)
            diff, scale = float(np.abs(eng - llama_logits(gg, f32_cache=True)).max()), float(np.abs(eng).max())
            check(r.returncode == 0 and diff < 1e-4 * scale and "class=olmoe" in r.stdout,
                  "%s: llama.cpp logits (F32 KV cache) = engine logits on the GGUF export (max |diff| %.2e, logits up "
                  "to %.1f)" % (tag, diff, scale))
        for kw, tag, needle in ((dict(norm=True), "qn", "renormalizes"), (dict(dense_layer=1), "qd", "differs")):
            d = os.path.join(tmp, tag)
            make(d, "qwen2_moe", **kw)
            r, _, gg = engine_and_gguf(d, tmp, tag)
            check(r.returncode == 3 and needle in r.stdout and not os.path.exists(gg),
                  "refused for llama.cpp's qwen2moe: " + r.stdout.strip()[:110])
    if failures:
        print("FAIL: %d checks" % len(failures))
        sys.exit(1)
    print("PASS: the MoE families' GGUF exports compute the engine's logits in llama.cpp")


if __name__ == "__main__":
    main()
