"""llama.cpp's perplexity method, computed in Python over llama-cpp-python (logits_all):
non-overlapping chunks of CTX tokens (first token -> BOS when the vocab adds BOS),
scoring positions [CTX/2, CTX-1) of each chunk. Prints one JSON line.
usage: llamacpp_ppl.py MODEL.gguf TEXT CTX N_CHUNKS THREADS"""
import json, sys, time

import numpy as np
from llama_cpp import Llama

model, text_path, ctx, nchunks, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
text = open(text_path, encoding="utf-8", newline="").read()
llm = Llama(model_path=model, n_ctx=ctx, n_batch=ctx, logits_all=True, verbose=False, n_threads=threads)
toks = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
add_bos = len(toks) > 0 and toks[0] == llm.token_bos()
first = ctx // 2
nll, cnt, t0 = 0.0, 0, time.time()
n = min(nchunks, len(toks) // ctx)
for c in range(n):
    chunk = list(toks[c * ctx:(c + 1) * ctx])
    if add_bos:
        chunk[0] = llm.token_bos()
    llm.reset()
    llm.eval(chunk)
    lg = np.asarray(llm.scores[:ctx], dtype=np.float64)
    for j in range(first, ctx - 1):
        row = lg[j]
        m = row.max()
        nll += np.log(np.exp(row - m).sum()) + m - row[toks[c * ctx + j + 1]]
        cnt += 1
print(json.dumps({"ppl": float(np.exp(nll / cnt)), "mean_nll": nll / cnt, "tokens_scored": cnt,
                  "text_tokens": len(toks), "chunks": n, "ctx": ctx, "seconds": round(time.time() - t0, 2)}))
