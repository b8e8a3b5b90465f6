"""Probe, not part of the product: does a SliceGPT-style rotation make hidden-size pruning
cheaper than the channel slice the product does? SmolLM2-135M, hidden 576 -> KEEP, nothing
else pruned, in float64 PyTorch: the parent, the channel slice (channels ranked by mean
|RMSNorm output|, as Minitron ranks them), and the PCA rotation of the residual stream
(RMSNorm weights folded into the next projections, one orthogonal Q for every layer, the
first KEEP principal directions kept), with the head untied (the rotated head is
E*diag(g)*Q, no longer the embedding) or kept tied with the rotated final norm's diagonal.
WikiText-2 raw test, 8 x 256 tokens; calibration 32 x 256 tokens of C4 (8 used). Each slice
also with the residual norms' gains x sqrt(C/KEEP), as the product slices.
usage: python rotation_probe.py MODEL.gguf WIKI.raw KEEP   (the project venv: gguf,
llama_cpp for the tokenizer; docs/pruning.md has the numbers)"""
import math, os, sys, time
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_llama import Llama
torch.set_num_threads(1)
m = Llama(sys.argv[1])
W, L, C, H, KV, D, eps = m.W, m.L, m.C, m.H, m.KV, m.D, m.eps
print(L, C, H, KV, m.theta, eps, "output.weight" in W)
ev = m.toks(sys.argv[2], 8, 256)
cal = m.c4(32, 256)
rope, rms = m.rope, m.rms
def fwd(M, ids, collect=None):
    B, T = ids.shape
    x = M["emb"][ids]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for l in range(L):
        p = M["l"][l]
        if collect is not None: collect.append(x.reshape(-1, x.shape[-1]))
        h = rms(x, p["an"])
        q = (h @ p["q"].T).view(B, T, -1, D); k = (h @ p["k"].T).view(B, T, -1, D); v = (h @ p["v"].T).view(B, T, -1, D)
        q, k = rope(q, T), rope(k, T)
        rep = q.shape[2] // k.shape[2]
        k = k.repeat_interleave(rep, 2); v = v.repeat_interleave(rep, 2)
        a = torch.softmax((q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) / math.sqrt(D) + mask, -1) @ v.transpose(1, 2)
        x = x + a.transpose(1, 2).reshape(B, T, -1) @ p["o"].T
        if collect is not None: collect.append(x.reshape(-1, x.shape[-1]))
        h = rms(x, p["fn"])
        x = x + (torch.nn.functional.silu(h @ p["g"].T) * (h @ p["u"].T)) @ p["d"].T
    if collect is not None: collect.append(x.reshape(-1, x.shape[-1]))
    return rms(x, M["on"]) @ M["head"].T
def ppl(M, ids):
    nll = 0; n = 0
    for b in range(ids.shape[0]):
        lg = fwd(M, ids[b:b+1])[0]
        lp = torch.log_softmax(lg[:-1], -1)
        nll -= lp.gather(1, ids[b, 1:, None]).sum().item(); n += ids.shape[1] - 1
    return math.exp(nll / n)
P = m.params()
t0 = time.time(); base = ppl(P, ev); print("parent ppl %.2f (%.0fs)" % (base, time.time() - t0), flush=True)
keep = int(sys.argv[3]) if len(sys.argv) > 3 else 504
# channel slice: score = mean |norm output| across norms (Minitron-style)
col = []; 
with torch.no_grad():
    for b in range(0, 8): fwd(P, cal[b:b+1], col)
score = torch.zeros(C, dtype=torch.float64)
for l in range(L):
    for i, nm in ((2*l, "an"), (2*l+1, "fn")):
        score += rms(col[i], P["l"][l][nm]).abs().mean(0)
idx = score.argsort(descending=True)[:keep]
def slice_model(M, idx, head_sep=False):
    S = {"emb": M["emb"][:, idx], "on": M["on"][idx], "head": M["head"][:, idx], "l": []}
    for p in M["l"]:
        S["l"].append(dict(an=p["an"][idx], fn=p["fn"][idx], q=p["q"][:, idx], k=p["k"][:, idx], v=p["v"][:, idx], o=p["o"][idx], g=p["g"][:, idx], u=p["u"][:, idx], d=p["d"][idx]))
    return S
Sc = slice_model(P, idx)
print("channel slice %d: ppl %.2f" % (keep, ppl(Sc, ev)), flush=True)
sc = math.sqrt(C / keep)   # the product's slice: residual norms' gains x sqrt(C/C')
Sc["on"] = Sc["on"] * sc; Sc["l"] = [dict(p, an=p["an"] * sc, fn=p["fn"] * sc) for p in Sc["l"]]
print("channel slice %d, norm scale %.3f: ppl %.2f" % (keep, sc, ppl(Sc, ev)), flush=True)
# fold norms, rotate by PCA of residual stream
F = {"emb": P["emb"].clone(), "on": torch.ones(C, dtype=torch.float64), "l": []}
F["head"] = P["head"] * P["on"][None]
for p in P["l"]:
    F["l"].append(dict(an=torch.ones(C, dtype=torch.float64), fn=torch.ones(C, dtype=torch.float64), q=p["q"] * p["an"], k=p["k"] * p["an"], v=p["v"] * p["an"], o=p["o"], g=p["g"] * p["fn"], u=p["u"] * p["fn"], d=p["d"]))
print("folded ppl %.2f" % ppl(F, ev[:2]), "vs parent first2", ppl(P, ev[:2]), flush=True)
cov = torch.zeros(C, C, dtype=torch.float64)
for X in col: 
    Xn = X / X.norm(dim=1, keepdim=True) * math.sqrt(C)   # what the norms see
    cov += Xn.T @ Xn
ev_, Q = torch.linalg.eigh(cov); Q = Q[:, ev_.argsort(descending=True)]
print("energy kept at %d: %.4f" % (keep, ev_.sort(descending=True)[0][:keep].sum() / ev_.sum()))
def rotate(M, Q):
    R = {"emb": M["emb"] @ Q, "on": M["on"], "head": M["head"] @ Q, "l": []}
    for p in M["l"]:
        R["l"].append(dict(an=p["an"], fn=p["fn"], q=p["q"] @ Q, k=p["k"] @ Q, v=p["v"] @ Q, o=Q.T @ p["o"], g=p["g"] @ Q, u=p["u"] @ Q, d=Q.T @ p["d"]))
    return R
Rm = rotate(F, Q)
print("rotated ppl (first2) %.2f" % ppl(Rm, ev[:2]), flush=True)
ar = torch.arange(keep)
Sp = slice_model(Rm, ar)
print("pca slice %d untied head: ppl %.2f" % (keep, ppl(Sp, ev)), flush=True)
for s in (math.sqrt(C / keep),):
    Sp2 = dict(Sp); Sp2["l"] = [dict(p, an=p["an"] * s, fn=p["fn"] * s) for p in Sp["l"]]; Sp2["on"] = Sp["on"] * s
    print("pca slice %d untied, norm scale %.3f: ppl %.2f" % (keep, s, ppl(Sp2, ev)), flush=True)
# tied: head = emb@Q (no fold of output norm) with diag approx of Q^T diag(g) Q
G = Q.T @ torch.diag(P["on"]) @ Q
Tm = dict(Rm); Tm["head"] = Rm["emb"]; Tm["on"] = torch.diag(G)
St = slice_model(Tm, ar)
print("pca slice %d tied diag-approx: ppl %.2f" % (keep, ppl(St, ev)), flush=True)
print("tied full (no slice) diag-approx: ppl(first2) %.2f" % ppl(Tm, ev[:2]))
