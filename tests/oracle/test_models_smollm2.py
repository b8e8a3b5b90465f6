"""Oracle: SmolLM2-135M-Instruct (Q4_1 GGUF, fetched by scripts/fetch-models.sh) through
the real binary: inspect (arch per layer, Q4_1 bytes), greedy generation is coherent,
perplexity agrees with llama.cpp (llama-cpp-python, same chunking) on a short slice of
wikitext-2 - within 0.5% on the F32-dequantized copy (same weights, fp32 math both
sides) and within 3% on Q4_1 as shipped (llama.cpp also quantizes activations to Q8_1) -
and a truncated copy of the file fails with a clear message."""
import json, os, subprocess, sys, tempfile

AC = os.environ["AC_BIN"]
shared = os.environ["AC_SHARED"]
cache = os.environ.get("AC_CACHE", os.path.expanduser("~/.cache/autocompress"))
here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(os.path.dirname(here))
model = subprocess.run(["sh", os.path.join(repo, "scripts/fetch-models.sh")], capture_output=True, text=True,
                       check=True).stdout.strip()

def ac(*args):
    r = subprocess.run([AC, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: autocompress {' '.join(args)}: rc={r.returncode}\n{r.stderr}")
    return r.stdout

a = json.loads(ac("inspect", model, "--json"))
assert a["vocab_size"] == 49152 and a["hidden_size"] == 576 and a["head_dim"] == 64, a
assert len(a["layers"]) == 30 and a["tie_word_embeddings"] is True, a
assert all(l["attention"] == {"n_heads": 9, "n_kv_heads": 3} and l["mlp"] == {"ffn_dim": 1536} for l in a["layers"])
text = ac("inspect", model)
assert "Q4_1" in text and "parameters:  134515008" in text, text
print("inspect ok")

out = ac("generate", model, "--prompt", "The capital of France is", "--max-tokens", "6", "--threads", "2")
print("generate:", out.strip())
assert out.startswith("The capital of France is") and "Paris" in out, out

with tempfile.TemporaryDirectory() as tmp:
    bad = os.path.join(tmp, "trunc.gguf")
    with open(model, "rb") as f, open(bad, "wb") as g:
        g.write(f.read(4 << 20))
    r = subprocess.run([AC, "inspect", bad], capture_output=True, text=True)
    assert r.returncode == 1 and "past the end" in r.stderr, (r.returncode, r.stderr)
    print("truncated:", r.stderr.strip())

    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("SKIP: llama-cpp-python is not installed in", sys.executable, "- perplexity comparison not run")
        sys.exit(0)
    wiki = os.path.join(shared, "data/text/wikitext-2-raw/wiki.test.raw")
    slice_path = os.path.join(tmp, "wiki_slice.txt")
    with open(wiki, encoding="utf-8", newline="") as f, open(slice_path, "w", encoding="utf-8", newline="") as g:
        g.write(f.read(6000))
    f32 = os.path.join(cache, "models", "SmolLM2-135M-Instruct.F32-dequant.gguf")
    if not os.path.exists(f32):
        subprocess.run([sys.executable, os.path.join(repo, "bench/ppl/gguf_dequant.py"), model, f32], check=True)
    for name, path, tol in (("F32-dequant", f32, 0.5), ("Q4_1", model, 3.0)):
        ours = json.loads(ac("perplexity", path, "--text", slice_path, "--ctx", "128", "--chunks", "2", "--json",
                             "--threads", "2"))
        ref = json.loads(subprocess.run([sys.executable, os.path.join(repo, "bench/ppl/llamacpp_ppl.py"), path,
                                         slice_path, "128", "2", "2"], capture_output=True, text=True,
                                        check=True).stdout)
        d = 100 * (ours["ppl"] - ref["ppl"]) / ref["ppl"]
        print(f"{name}: ours {ours['ppl']:.4f} llama.cpp {ref['ppl']:.4f} ({d:+.3f}%), "
              f"{ours['tokens_scored']} tokens of {ours['text_tokens']}")
        assert ours["text_tokens"] == ref["text_tokens"] and ours["tokens_scored"] == ref["tokens_scored"], (ours, ref)
        assert abs(d) < tol, f"{name}: {d:.3f}% exceeds {tol}%"
print("ok")
