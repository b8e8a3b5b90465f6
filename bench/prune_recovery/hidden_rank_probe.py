"""Probe, not part of the product: which criterion should rank the hidden channels for a
hidden-size cut? SmolLM2-135M, hidden 576 -> KEEP, nothing else cut, in float64 PyTorch; the
channel slice with the residual norms' gains x sqrt(C/KEEP), as the product slices.
Criteria, from 16 x 256 C4 tokens: act (mean |norm output| over every norm, the product's
and Minitron's), wanda (per 256-token sequence, sum over every projection that reads a norm
output of ||W[:,j]|| * ||x_j||, the LM head on the final norm's too), fisher (sum over the
sequences of (dL/dm_j)^2, m a mask on the embedding and every block's output), taylor
(|sum dL/dm_j|). WikiText-2 raw test, 8 x 256 tokens. It also prints how much of the stream's
energy its three largest channels hold after every fifth layer, raw and through the next input
norm's weight (what the intermediate-state loss of `distill --hidden-weight` compares).
usage: THREADS=2 AC_SHARED=../shared python hidden_rank_probe.py MODEL.gguf WIKI.raw KEEP
(the project venv: gguf, llama_cpp for the tokenizer; docs/pruning.md has the numbers)"""
import math, os, sys, time
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_llama import Llama
torch.set_num_threads(int(os.environ.get("THREADS", "2")))
model = Llama(sys.argv[1])
L, C, D = model.L, model.C, model.D
ev = model.toks(sys.argv[2], 8, 256)
cal = model.c4(16, 256)
rope, rms = model.rope, model.rms
def fwd(M, ids, m=None, stats=None):
    B, T = ids.shape
    x = M["emb"][ids]
    if m is not None: x = x * m
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for l in range(L):
        p = M["l"][l]
        h = rms(x, p["an"])
        if stats is not None:
            stats["act"] += h.abs().reshape(-1, h.shape[-1]).mean(0).detach()
            hn = h.reshape(-1, h.shape[-1]).norm(dim=0).detach()
            stats["wanda"] += hn * (p["q"].norm(dim=0) + p["k"].norm(dim=0) + p["v"].norm(dim=0))
        q = (h @ p["q"].T).view(B, T, -1, D); k = (h @ p["k"].T).view(B, T, -1, D); v = (h @ p["v"].T).view(B, T, -1, D)
        q, k = rope(q, T), rope(k, T)
        rep = q.shape[2] // k.shape[2]
        k = k.repeat_interleave(rep, 2); v = v.repeat_interleave(rep, 2)
        sc = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) / math.sqrt(D) + mask
        a = torch.softmax(sc, -1) @ v.transpose(1, 2)
        y = a.transpose(1, 2).reshape(B, T, -1) @ p["o"].T
        x = x + (y * m if m is not None else y)
        h = rms(x, p["fn"])
        if stats is not None:
            stats["act"] += h.abs().reshape(-1, h.shape[-1]).mean(0).detach()
            hn = h.reshape(-1, h.shape[-1]).norm(dim=0).detach()
            stats["wanda"] += hn * (p["g"].norm(dim=0) + p["u"].norm(dim=0))
        y = (torch.nn.functional.silu(h @ p["g"].T) * (h @ p["u"].T)) @ p["d"].T
        x = x + (y * m if m is not None else y)
        if stats is not None:   # the stream's energy per channel after each layer
            stats["energy"][l] += (x.detach() ** 2).reshape(-1, x.shape[-1]).sum(0)
    h = rms(x, M["on"])
    if stats is not None:
        stats["wanda"] += h.reshape(-1, h.shape[-1]).norm(dim=0).detach() * M["head"].norm(dim=0)
    return h @ M["head"].T
def nll(M, ids, m=None, stats=None):
    lg = fwd(M, ids, m, stats)[0]
    return -torch.log_softmax(lg[:-1], -1).gather(1, ids[0, 1:, None]).mean()
def ppl(M, ids):
    with torch.no_grad():
        return math.exp(sum(nll(M, ids[b:b+1]).item() for b in range(ids.shape[0])) / ids.shape[0])
P = model.params()
t0 = time.time(); print("parent ppl %.2f (%.0fs)" % (ppl(P, ev), time.time() - t0), flush=True)
keep = int(sys.argv[3]) if len(sys.argv) > 3 else 504
stats = {"act": torch.zeros(C, dtype=torch.float64), "wanda": torch.zeros(C, dtype=torch.float64),
         "energy": torch.zeros(L, C, dtype=torch.float64)}
fisher = torch.zeros(C, dtype=torch.float64); taylor = torch.zeros(C, dtype=torch.float64)
t0 = time.time()
for b in range(cal.shape[0]):
    m = torch.ones(C, dtype=torch.float64, requires_grad=True)
    loss = nll(P, cal[b:b+1], m, stats)
    g, = torch.autograd.grad(loss, m)
    fisher += g * g; taylor += g
print("statistics on %d x 256 calibration tokens (%.0fs)" % (cal.shape[0], time.time() - t0), flush=True)
top3 = lambda e: float(e.sort(descending=True)[0][:3].sum() / e.sum())
for l in range(0, L - 1, 5):   # what a cosine on the stream after layer l sees, raw and through the next norm
    e = stats["energy"][l]
    print("after layer %2d: the 3 largest channels hold %.3f of the stream's energy, %.3f through layer %d's "
          "input norm" % (l, top3(e), top3(e * P["l"][l + 1]["an"] ** 2), l + 1), flush=True)
def slice_ppl(score):
    idx = score.argsort(descending=True)[:keep]
    sc = math.sqrt(C / keep)
    S = {"emb": P["emb"][:, idx], "on": P["on"][idx] * sc, "head": P["head"][:, idx], "l": []}
    for p in P["l"]:
        S["l"].append(dict(an=p["an"][idx] * sc, fn=p["fn"][idx] * sc, q=p["q"][:, idx], k=p["k"][:, idx],
                           v=p["v"][:, idx], o=p["o"][idx], g=p["g"][:, idx], u=p["u"][:, idx], d=p["d"][idx]))
    return ppl(S, ev), idx
base = None
for name, s in (("act", stats["act"]), ("wanda", stats["wanda"]), ("fisher", fisher), ("taylor", taylor.abs())):
    p, idx = slice_ppl(s)
    if base is None: base = set(idx.tolist())
    print("%-7s slice %d: ppl %.2f (channels shared with act: %d)" % (name, keep, p, len(base & set(idx.tolist()))),
          flush=True)
