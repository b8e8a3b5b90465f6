# tier: slow (needs llama-cpp-python built from PyPI; run with make test-slow)
"""RoPE scaling survives the GGUF export as llama.cpp reads it.

Tiny random Llama models written here (config.json + safetensors, 2 layers, head size 16)
with llama3 RoPE scaling (Llama 3.1 and later: factor 8, low/high frequency factors 1
and 4, original context 32, so that the 8 frequencies span all three regions), with linear
scaling, and without. Each is exported as F32 GGUF by the engine side
(tests/tools/export_interop --no-vocab), uniform (GGUF arch `llama`) and with its second
layer's MLP narrowed (`deci`); llama.cpp scores the same 48 token ids and every
position's logits agree with the engine's (max abs difference under 1e-3 of the logits'
scale). llama.cpp takes llama3 scaling only from the tensor rope_freqs.weight; without it,
the file loads and runs unscaled. The GGUF, read back by the engine (export_interop on the
file), gives the same logits as the HF folder.
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AC_BIN = os.environ.get("AC_BIN", os.path.join(ROOT, "build", "autocompress"))
TOOL = os.path.join(os.path.dirname(AC_BIN), "tools", "export_interop")
V, C, L, H, KV, F, D = 64, 32, 2, 2, 1, 48, 16
IDS = [int(x) for x in np.random.default_rng(3).integers(0, V, 48)]
SCALINGS = {
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32},
    "linear": {"type": "linear", "factor": 4.0},
    "none": None,
}
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def make(d, scaling):
    rng = np.random.default_rng(7)

    def lin(o, i):
        return rng.normal(0, 1.0 / np.sqrt(i), (o, i))
    w = {"model.embed_tokens.weight": rng.normal(0, 1.0, (V, C)), "model.norm.weight": 1 + 0.1 * rng.normal(size=C)}
    for l in range(L):
        p = "model.layers.%d." % l
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.normal(size=C)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.normal(size=C)
        # large q and k: attention depends strongly on the rotation, so scaling shows
        w[p + "self_attn.q_proj.weight"] = 3 * lin(H * D, C)
        w[p + "self_attn.k_proj.weight"] = 3 * lin(KV * D, C)
        w[p + "self_attn.v_proj.weight"] = lin(KV * D, C)
        w[p + "self_attn.o_proj.weight"] = lin(C, H * D)
        w[p + "mlp.gate_proj.weight"] = lin(F, C)
        w[p + "mlp.up_proj.weight"] = lin(F, C)
        w[p + "mlp.down_proj.weight"] = lin(C, F)
    os.makedirs(d, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in w.items()}, os.path.join(d, "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": C,
           "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV, "intermediate_size": F,
           "head_dim": D, "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
           "tie_word_embeddings": True, "torch_dtype": "float32", "rope_scaling": scaling}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))


def engine_logits(src, tmp, tag, arch=None, gguf=None):
    out = os.path.join(tmp, tag + ".f32")
    cmd = [TOOL, src] + (["--arch", arch] if arch else []) + ["--no-vocab"] + (["--gguf", gguf] if gguf else [])
    cmd += ["--logits", os.path.join(tmp, "ids.txt"), out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return r, None
    return r, np.fromfile(out, dtype=np.float32).reshape(len(IDS), -1)


def llama_logits(gguf):
    llm = Llama(model_path=gguf, n_ctx=64, n_threads=2, logits_all=True, verbose=False, n_batch=64,
                type_k=0, type_v=0)   # F32 KV cache: the comparison is of the rotation, not of F16 rounding
    llm.eval(IDS)
    return np.array(llm.scores[:len(IDS)], dtype=np.float32)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "ids.txt"), "w").write(" ".join(map(str, IDS)))
        by = {}
        for name, scaling in SCALINGS.items():
            d = os.path.join(tmp, name)
            make(d, scaling)
            a = json.loads(subprocess.run([AC_BIN, "inspect", d, "--json"], capture_output=True, text=True,
                                          check=True).stdout)
            a = a.get("arch", a)
            a["layers"][1]["mlp"]["ffn_dim"] = 32   # heterogeneous: GGUF `deci`
            het = os.path.join(tmp, name + "-het.json")
            json.dump(a, open(het, "w"))
            for tag, arch, cls in ((name, None, "llama"), (name + "-deci", het, "deci")):
                gg = os.path.join(tmp, tag + ".gguf")
                r, eng = engine_logits(d, tmp, tag, arch, gg)
                if eng is None:
                    check(False, "%s: export: %s" % (tag, r.stderr.strip()[-300:]))
                    continue
                ref = llama_logits(gg)
                diff, scale = float(np.abs(eng - ref).max()), float(np.abs(eng).max())
                check(diff < 1e-3 * scale and "class=%s" % cls in r.stdout,
                      "%s: llama.cpp logits = engine logits on the GGUF export (max |diff| %.2e, logits up to %.1f)"
                      % (tag, diff, scale))
                by[tag] = eng
                if arch is None:   # the engine reads the GGUF back with the same scaling
                    r2, back = engine_logits(gg, tmp, tag + "-back")
                    if back is None:
                        check(False, "%s: the engine cannot read its GGUF: %s" % (tag, r2.stderr.strip()[-300:]))
                    else:
                        d2 = float(np.abs(back - eng).max())
                        check(d2 < 1e-4 * scale, "%s: the GGUF read back gives the HF folder's logits (max |diff| "
                              "%.2e)" % (tag, d2))
        # the scalings are told apart by these logits at all (else the checks above prove nothing)
        if "llama3" in by and "none" in by:
            sep = float(np.abs(by["llama3"] - by["none"]).max())
            check(sep > 0.05 * float(np.abs(by["none"]).max()),
                  "llama3 scaling changes the logits (max |diff| %.2e against no scaling)" % sep)
    if failures:
        print("FAILED: %d checks" % len(failures))
        sys.exit(1)
    print("PASS: RoPE scaling (llama3, linear) runs in llama.cpp as in the engine")


if __name__ == "__main__":
    main()
