# tier: slow (needs llama-cpp-python built from PyPI; run with make test-slow)
"""Oracle: `autocompress eval` log-likelihoods against llama.cpp (llama-cpp-python) on
SmolLM2-135M-Instruct, one real item of each of several tasks (MMLU 1-shot included).
Both sides get the same harness prompt strings (from --dump-prompts); llama.cpp tokenizes
them itself, with the harness's _encode_pair, so tokenizer, templates, position alignment
and log-softmax are all checked. Both run the F32 copy of the Q4_1 GGUF (every tensor
dequantized, bench/ppl/gguf_dequant.py): on Q4_1 itself llama.cpp also quantizes the
activations to Q8_1, which moves log-likelihoods by ~0.05 nats per token; on the same fp32
weights the two must agree closely. Needs the SmolLM2 GGUF (scripts/fetch-models.sh)."""
import json, math, os, subprocess, sys, tempfile

import numpy as np

try:
    from llama_cpp import Llama
except ImportError:
    print("SKIP: llama_cpp (llama-cpp-python) is not installed in $AC_PYTHON")
    sys.exit(0)

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ac_bin = os.environ["AC_BIN"]
q4 = subprocess.check_output([os.path.join(root, "scripts/fetch-models.sh")], text=True).strip()
model = os.path.join(os.path.dirname(q4), "SmolLM2-135M-Instruct.F32-dequant.gguf")
if not os.path.exists(model):
    subprocess.check_call([sys.executable, os.path.join(root, "bench/ppl/gguf_dequant.py"), q4, model])
tasks = "arc_easy,winogrande,lambada_openai,boolq,mmlu"
common = [ac_bin, "eval", model, "--tasks", tasks, "--limit", "1", "--seed", "7", "--subjects", "anatomy",
          "--num-fewshot", "1", "--threads", "2"]
tmp = tempfile.mkdtemp()
prompts, samples, out = (os.path.join(tmp, n) for n in ("p.jsonl", "s.jsonl", "r.json"))
subprocess.check_call(common + ["--dump-prompts", prompts])
subprocess.check_call(common + ["--log-samples", samples, "--json", out], stdout=subprocess.DEVNULL)
P = [json.loads(l) for l in open(prompts)]
S = [json.loads(l) for l in open(samples)]
assert len(P) == len(S) == 5, (len(P), len(S))

llm = Llama(model_path=model, n_ctx=2048, logits_all=True, verbose=False, n_threads=2, seed=0)
eos = llm.token_eos()


def tok(s):
    return llm.tokenize(s.encode("utf-8"), add_bos=False, special=False) if s else []


def loglik(ctx, cont):
    if ctx == "":
        c, w = [eos], tok(cont)
    else:
        n = len(ctx) - len(ctx.rstrip())
        if n:
            cont, ctx = ctx[-n:] + cont, ctx[:-n]
        whole = tok(ctx + cont)
        c = tok(ctx)
        w = whole[len(c):]
    inp = (c + w)[:-1]
    llm.reset()
    llm.eval(inp)
    lg = np.array(llm.scores[: len(inp)], dtype=np.float64)
    lp = lg - lg.max(axis=1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(axis=1, keepdims=True))
    ll, greedy = 0.0, True
    for j, t in enumerate(w):
        p = len(inp) - len(w) + j
        ll += lp[p, t]
        greedy &= int(lp[p].argmax()) == t
    return ll, greedy, len(w)


worst = 0.0
agree = total = 0
sum_abs = sum_tok = 0
for p, s in zip(P, S):
    assert (p["task"], p["line"]) == (s["task"], s["line"])
    ours = s["ll"]
    ref = [loglik(r["context"], r["continuation"]) for r in p["requests"]]
    for (rl, rg, nt), ol, og in zip(ref, ours, s["greedy"]):
        assert rg == og, f"{p['task']} line {p['line']}: greedy flag differs"
        d = abs(rl - ol)
        worst = max(worst, d / max(1, nt))
        sum_abs += d
        sum_tok += nt
        print(f"{p['task']:16s} line {p['line']:5d}: ours {ol:9.4f}  llama.cpp {rl:9.4f}  ({nt} tokens)")
        assert d <= 0.01 * nt + 0.01, f"{p['task']} line {p['line']}: ours {ol:.4f} llama.cpp {rl:.4f} ({nt} tokens)"
    if len(ref) > 1:
        total += 1
        agree += int(np.argmax(ours)) == int(np.argmax([r[0] for r in ref]))
print(f"max |ll difference| per token {worst:.4f}, mean {sum_abs / sum_tok:.4f} nats; argmax agrees on {agree}/{total}")
assert sum_abs / sum_tok < 0.005
assert agree == total
res = json.load(open(out))
assert all(res["tasks"][t]["ok"] for t in tasks.split(","))
print("PASS")
