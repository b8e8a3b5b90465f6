# tier: slow (needs llama-cpp-python built from PyPI; run with make test-slow)
"""A llama2.c parent (stories260K, SentencePiece-style vocabulary) exported to GGUF runs in
llama.cpp: the tokenizer metadata is built through the engine's tokenizer API (pieces with
spaces spelled U+2581, scores, token types, BOS/EOS), the weights are F32. Greedy decoding
from BOS gives the same 48 ids as the engine, and llama.cpp's detokenized text is the
integrity sentence of shared/data/PROVENANCE.md ("Once upon a time, there was a little girl
named Lily. She loved to play outside in the park."); llama.cpp tokenizes that sentence
back to the ids both engines generated for it. Also exercises `autocompress export`.
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AC_BIN = os.environ.get("AC_BIN", os.path.join(ROOT, "build", "autocompress"))
TOOL = os.path.join(os.path.dirname(AC_BIN), "tools", "export_interop")
SHARED = os.environ.get("AC_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
MODEL = os.path.join(SHARED, "data", "models", "stories260K", "stories260K.bin")
SENTENCE = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
N = 48


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        g = os.path.join(tmp, "stories.gguf")
        r = subprocess.run([AC_BIN, "export", MODEL, "--format", "gguf", "--dtype", "fp32", "--out", g],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("FAIL: export: " + r.stderr)
        man = json.loads(r.stdout)
        if not man["tokenizer"] or man["class"] != "llama":
            failures.append("manifest: tokenizer %s class %s" % (man["tokenizer"], man["class"]))
        with open(os.path.join(tmp, "bos.txt"), "w") as f:
            f.write("1")
        r = subprocess.run([TOOL, MODEL, "--greedy", os.path.join(tmp, "bos.txt"), str(N)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("FAIL: engine greedy: " + r.stderr)
        eng = [int(x) for x in r.stdout.split("greedy:")[1].split()]
        llm = Llama(model_path=g, n_ctx=128, logits_all=True, verbose=False, n_threads=2, type_k=0, type_v=0)
        llm.eval([llm.token_bos()])
        cpp = []
        for _ in range(N):
            t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            cpp.append(t)
            llm.eval([t])
        text = llm.detokenize(cpp).decode("utf-8", "replace")
        print("bos id %d; engine == llama.cpp greedy ids (%d): %s" % (llm.token_bos(), N, eng == cpp))
        print("llama.cpp text:", repr(text))
        if eng != cpp:
            failures.append("greedy ids differ")
        if not text.strip().startswith(SENTENCE):
            failures.append("llama.cpp text is not the integrity sentence")
        ids = llm.tokenize(SENTENCE.encode(), add_bos=False)
        same = cpp[:len(ids)] == ids
        print("llama.cpp tokenizes the sentence to the generated ids: %s (%d tokens)" % (same, len(ids)))
        if not same:
            failures.append("tokenization of the sentence differs from the generated ids")
    if failures:
        print("FAIL:", "; ".join(failures))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
