# tier: slow (needs llama-cpp-python built from PyPI; run with make test-slow)
"""Exported GGUF runs in llama.cpp (llama-cpp-python) exactly as in the engine.

SmolLM2-135M-Instruct (Q4_1 parent) is sliced by prefix pruning to (a) a uniform arch
(GGUF arch `llama`) and (b) a heterogeneous one (per-layer FFN widths and head counts,
one layer removed; GGUF arch `deci` with per-layer arrays), exported as F32 GGUF by the
engine side (tests/tools/export_interop), and loaded by llama.cpp. Checks: llama.cpp
tokenizes WikiText-2 with the carried-over tokenizer metadata exactly like the HF
tokenizer.json built from the same parent; greedy continuation of 32 tokens is identical;
perplexity over CHUNKS chunks of CTX tokens (llama-perplexity convention: the second half
of each chunk is scored) is within 1% of the engine's. An arch llama.cpp cannot run is
refused by the exporter. Prints the numbers for bench/results/export_checks.md.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

CTX, CHUNKS, N_GEN = 256, 4, 32

try:
    from llama_cpp import Llama
except ImportError:
    # llama-cpp-python is part of the oracle environment (scripts/pyenv.sh); without it
    # this interop check cannot run at all, which is a failure, not a skip.
    print("FAIL: llama_cpp (llama-cpp-python) is not importable from", sys.executable)
    sys.exit(1)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AC_BIN = os.environ.get("AC_BIN", os.path.join(ROOT, "build", "autocompress"))
TOOL = os.path.join(os.path.dirname(AC_BIN), "tools", "export_interop")
SHARED = os.environ.get("AC_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode not in (0, 3):
        print(r.stdout, r.stderr)
        raise SystemExit("FAIL: %s exited %d" % (cmd[0], r.returncode))
    return r


def model_path():
    out = subprocess.run(["sh", os.path.join(ROOT, "scripts", "fetch-models.sh")], capture_output=True, text=True)
    path = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.returncode != 0 or not os.path.exists(path):
        raise SystemExit("FAIL: cannot fetch SmolLM2 (scripts/fetch-models.sh): " + out.stderr[-500:])
    return path


def layer(src, h, kv, f):
    return {"source_layer": src, "attention": {"n_heads": h, "n_kv_heads": kv} if h else None,
            "mlp": {"ffn_dim": f} if f else None}


def llama_ppl(llm, ids):
    nll, n = 0.0, 0
    for c in range(CHUNKS):
        chunk = ids[c * CTX:(c + 1) * CTX]
        llm.reset()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[:CTX], dtype=np.float64)
        for j in range(CTX // 2, CTX - 1):
            l = logits[j]
            m = l.max()
            nll += math.log(np.exp(l - m).sum()) + m - l[chunk[j + 1]]
            n += 1
    return math.exp(nll / n), n


def llama_greedy(llm, prompt):
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(N_GEN):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(t)
        llm.eval([t])
    return out


def main():
    if not os.path.exists(TOOL):
        raise SystemExit("FAIL: helper %s not built (make all)" % TOOL)
    parent = model_path()
    pa = json.loads(run([AC_BIN, "inspect", parent, "--json"]).stdout)
    L = len(pa["layers"])
    uniform = dict(pa, layers=[layer(i, 6, 2, 1024) for i in range(L)])
    het_layers = []
    for i in range(L):
        if i == L // 2:
            continue                      # one layer removed
        h, kv = [(9, 3), (6, 2), (3, 1)][i % 3]
        f = [1536, 1024, 768, 1280][i % 4]
        het_layers.append(layer(i, h, kv, f))
    het = dict(pa, layers=het_layers)
    bad = dict(pa, layers=[layer(0, 9, 3, 1536), layer(1, 9, 3, 0)] + [layer(i, 9, 3, 1536) for i in range(2, L)])

    text = open(os.path.join(SHARED, "data", "text", "wikitext-2-raw", "wiki.test.raw"), encoding="utf-8").read()[:40000]
    failures = []
    vocab = Llama(model_path=parent, vocab_only=True, verbose=False)
    ids = vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    prompt = vocab.tokenize(b"The capital of France is", add_bos=False)
    assert len(ids) >= CTX * CHUNKS, len(ids)
    with tempfile.TemporaryDirectory() as tmp:
        wiki_file, prompt_file = os.path.join(tmp, "wiki.txt"), os.path.join(tmp, "prompt.txt")
        with open(wiki_file, "w") as f:
            f.write(" ".join(map(str, ids[:CTX * CHUNKS])))
        with open(prompt_file, "w") as f:
            f.write(" ".join(map(str, prompt)))
        hf_dir = os.path.join(tmp, "hf")
        for name, a, expect in (("uniform", uniform, "llama"), ("heterogeneous", het, "deci")):
            gguf = os.path.join(tmp, name + ".gguf")
            # One engine process: slice, export, then greedy and perplexity on the same weights.
            cmd = [TOOL, parent, "--arch", write(tmp, name + ".json", a), "--gguf", gguf]
            if name == "uniform":
                cmd += ["--dtype", "bf16", "--hf", hf_dir, "--dtype", "fp32"]
            r = run(cmd + ["--greedy", prompt_file, str(N_GEN), "--ppl", wiki_file, str(CTX), str(CHUNKS)])
            assert ("class=" + expect) in r.stdout, r.stdout
            eng_greedy = [int(x) for x in r.stdout.split("greedy:")[1].split("\n")[0].split()]
            eng_ppl = float(r.stdout.split("ppl=")[1].split()[0])
            if name == "uniform":
                # The exported file's own tokenizer metadata (copied from the parent) and the
                # tokenizer.json built from it tokenize WikiText-2 identically.
                import tokenizers
                own = Llama(model_path=gguf, vocab_only=True, verbose=False)
                big = open(os.path.join(SHARED, "data", "text", "wikitext-2-raw", "wiki.test.raw"),
                           encoding="utf-8").read()[:200000]
                cpp_ids = own.tokenize(big.encode("utf-8"), add_bos=False, special=False)
                tk = tokenizers.Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
                same = tk.encode(big, add_special_tokens=False).ids == cpp_ids
                print("tokenizer: %d WikiText-2 tokens, llama.cpp (exported GGUF) == exported tokenizer.json: %s"
                      % (len(cpp_ids), same))
                if not same:
                    failures.append("tokenizer.json disagrees with llama.cpp tokenization")
            # F32 KV cache: llama.cpp's default F16 cache moves logits by ~1e-2, enough to flip
            # near-ties in greedy decoding of an undistilled pruned model.
            llm = Llama(model_path=gguf, n_ctx=CTX, n_batch=CTX, logits_all=True, verbose=False, n_threads=2,
                        type_k=0, type_v=0)
            cpp_greedy = llama_greedy(llm, prompt)
            cpp_ppl, n = llama_ppl(llm, ids)
            rel = abs(cpp_ppl - eng_ppl) / eng_ppl
            print("%s (%s, %d layers): greedy %d tokens equal: %s | perplexity engine %.4f llama.cpp %.4f "
                  "(rel diff %.4f%%, %d chunks x %d tokens, %d scored)"
                  % (name, expect, len(a["layers"]), N_GEN, eng_greedy == cpp_greedy, eng_ppl, cpp_ppl,
                     100 * rel, CHUNKS, CTX, n))
            print("  engine   :", repr(vocab.detokenize(eng_greedy).decode("utf-8", "replace")))
            print("  llama.cpp:", repr(vocab.detokenize(cpp_greedy).decode("utf-8", "replace")))
            if eng_greedy != cpp_greedy:
                failures.append(name + ": greedy text differs")
            if rel > 0.01:
                failures.append(name + ": perplexity differs by %.3f%%" % (100 * rel))
            del llm

        # Quantized and half-precision files: the unpruned parent as Q8_0 GGUF, reloaded by the
        # engine (same dequantized weights; llama.cpp also quantizes activations to 8 bits in
        # its Q8_0 matmuls, which a degenerate pruned model would amplify), and the
        # heterogeneous BF16 GGUF against the engine's fp32 weights; within 1% in both.
        write(tmp, "parent.json", pa)
        for name, src, dtype, engine_model in (("parent", "parent.json", "q8_0", "reload"),
                                               ("heterogeneous", "heterogeneous.json", "bf16", "fp32")):
            g = os.path.join(tmp, "%s-%s.gguf" % (name, dtype))
            run([TOOL, parent, "--arch", os.path.join(tmp, src), "--dtype", dtype, "--gguf", g])
            if engine_model == "reload":
                r = run([TOOL, g, "--ppl", wiki_file, str(CTX), str(CHUNKS)])
            else:
                r = run([TOOL, parent, "--arch", os.path.join(tmp, src), "--ppl", wiki_file, str(CTX), str(CHUNKS)])
            eng_ppl = float(r.stdout.split("ppl=")[1].split()[0])
            llm = Llama(model_path=g, n_ctx=CTX, n_batch=CTX, logits_all=True, verbose=False, n_threads=2,
                        type_k=0, type_v=0)
            cpp_ppl, n = llama_ppl(llm, ids)
            del llm
            rel = abs(cpp_ppl - eng_ppl) / eng_ppl
            print("%s %s GGUF: perplexity engine (%s) %.4f llama.cpp %.4f (rel diff %.4f%%)"
                  % (name, dtype.upper(), "reloaded from the file" if engine_model == "reload" else "fp32 weights",
                     eng_ppl, cpp_ppl, 100 * rel))
            if rel > 0.01:
                failures.append("%s %s: perplexity differs by %.3f%%" % (name, dtype, 100 * rel))

        # An arch llama.cpp's deci graph cannot run (attention kept, MLP removed) is refused.
        bad_gguf = os.path.join(tmp, "bad.gguf")
        r = run([TOOL, parent, "--arch", write(tmp, "bad.json", bad), "--gguf", bad_gguf])
        refused = r.returncode == 3 and "removes the MLP" in r.stdout and not os.path.exists(bad_gguf)
        print("refuses a layer with attention but no MLP for GGUF:", refused)
        if not refused:
            failures.append("unexpressible arch was not refused")
    if failures:
        print("FAIL:", "; ".join(failures))
        sys.exit(1)
    print("PASS")


def write(tmp, name, obj):
    p = os.path.join(tmp, name)
    with open(p, "w") as f:
        json.dump(obj, f)
    return p


if __name__ == "__main__":
    main()
