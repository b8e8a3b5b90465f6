# tier: slow (needs llama-cpp-python built from PyPI; run with make test-slow)
"""GGUF exports of Nemotron-H and Mamba-2 run in llama.cpp (llama-cpp-python's nemotron_h,
nemotron_h_moe and mamba2) as in the engine.

Tiny random checkpoints written as the Hub's (tests/oracle/test_models_hybrid_hf.py's writer): a
dense hybrid "M*M-M" (Mamba-2, attention, squared-ReLU MLP) and an MoE hybrid "ME*EM" (sigmoid
router with its correction bias, routed scale 2.5, a shared expert, also cut to half its width;
also with its experts in a
latent of 12, LatentMoE's ffn_latent_down/up around them, also cut to a latent of 8) and a Mamba2ForCausalLM of
four Mamba-2 layers in two groups (tests/oracle/test_models_mamba2_hf.py's writer), each exported as F32 GGUF by
the engine side (tests/tools/export_interop --no-vocab: llama.cpp runs token ids), also after
pruning Mamba heads. llama.cpp scores the same 39 token ids with an F32 KV cache, in batches of 8
so that its conv and SSM states carry across batches: every position's logits agree with the
engine's (max abs difference under 1e-4 of the logits' scale; an F16 KV cache, llama.cpp's
default, moves them by about 2e-3). What llama.cpp cannot hold is refused with the reason: a
dense MLP beside MoE layers, per-layer Mamba shapes.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_models_hybrid_hf as hf  # noqa: E402
import test_models_mamba2_hf as m2  # noqa: E402

IDS = [3, 17, 42, 5, 9, 61, 0, 33, 8, 27, 50, 12, 7, 44, 19, 2, 38, 60, 21, 14, 301, 77, 499, 100, 200, 300, 400, 1,
       2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def engine_and_gguf(d, tmp, tag, arch=None, expect=0):
    gg, out = os.path.join(tmp, tag + ".gguf"), os.path.join(tmp, tag + ".f32")
    ids = os.path.join(tmp, "ids.txt")
    cmd = [hf.TOOL, d] + (["--arch", arch] if arch else []) + ["--no-vocab", "--gguf", gg, "--logits", ids, out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != expect:
        raise AssertionError("%s -> %d: %s" % (" ".join(cmd), r.returncode, r.stderr[-1500:]))
    return (np.fromfile(out, np.float32).reshape(len(IDS), -1) if expect == 0 else None), gg, r


def llama_logits(gguf):
    llm = Llama(model_path=gguf, n_ctx=64, n_threads=2, logits_all=True, verbose=False, n_batch=8, n_ubatch=8,
                type_k=0, type_v=0)   # F32 KV cache
    llm.eval(IDS)
    return np.array(llm.scores[:len(IDS)])


def case(tmp, tag, c, cut=None, make=hf.make_checkpoint, experts=None, shared=None, latent=None):
    d = os.path.join(tmp, tag)
    make(d, c, seed=21)
    arch = None
    if cut or experts or shared or latent:
        a = json.loads(subprocess.run([hf.AC, "inspect", d, "--json"], capture_output=True, text=True,
                                      check=True).stdout)
        for y in a["layers"]:
            if y.get("mamba") and cut:
                y["mamba"]["n_heads"] = cut
            if y.get("moe") and experts:
                y["moe"]["n_experts"], y["moe"]["top_k"] = experts, min(experts, y["moe"]["top_k"])
            if y.get("moe") and shared:   # one shared width for every layer, as the GGUF holds it
                y["moe"]["shared_ffn_dim"] = shared
            if y.get("moe") and latent:   # one latent for every layer, as the GGUF holds it
                y["moe"]["latent_dim"] = latent
        arch = os.path.join(tmp, tag + "-cut.json")
        with open(arch, "w") as f:
            json.dump(a, f)
    eng, gg, r = engine_and_gguf(d, tmp, tag, arch)
    ref = llama_logits(gg)
    diff, scale = float(np.abs(ref - eng).max()), float(np.abs(eng).max())
    check(diff < 1e-4 * scale, "%s (%s): llama.cpp logits = engine logits on the GGUF export (max |diff| %.2e, "
                               "logits up to %.1f)" % (tag, r.stdout.strip().split("class=")[-1], diff, scale))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "ids.txt"), "w") as f:
            f.write(" ".join(map(str, IDS)))
        case(tmp, "dense", hf.CFG)
        case(tmp, "dense-cut", hf.CFG, cut=4)
        moe = dict(hf.MOE, pattern="ME*EM")
        case(tmp, "moe", moe)
        case(tmp, "moe-two", moe, experts=2)
        case(tmp, "moe-shared-cut", moe, shared=hf.MOE["Fs"] // 2)   # the search's narrower shared expert
        case(tmp, "moe-grouped", dict(moe, ng=3, tg=2))
        case(tmp, "moe-latent", dict(moe, Lt=12))   # Nemotron 3 Super's LatentMoE
        case(tmp, "moe-latent-cut", dict(moe, Lt=12), latent=8)   # its latent pruned
        case(tmp, "mamba2", m2.CFG, make=m2.make_mamba2)
        case(tmp, "mamba2-cut", m2.CFG, cut=4, make=m2.make_mamba2)
        d = os.path.join(tmp, "mixed")
        hf.make_checkpoint(d, hf.MOE, seed=21)   # "ME*E-": a dense MLP beside MoE layers
        _, _, r = engine_and_gguf(d, tmp, "mixed", expect=3)
        check("dense MLP beside MoE" in r.stderr, "a dense MLP beside MoE layers is refused: %s" %
              r.stderr.strip()[-100:])
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("PASS: Nemotron-H's and Mamba-2's GGUF exports compute the engine's logits in llama.cpp")


if __name__ == "__main__":
    main()
