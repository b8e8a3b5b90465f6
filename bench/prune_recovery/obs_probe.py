"""Probe, not part of the product: would ZipLM's greedy OBS rule choose better FFN units to
remove than the ranking's activation order (mean |h| of the down_proj input)? SmolLM2-135M,
every layer cut to the same FFN width KEEP, nothing else pruned, float64 statistics on
16 x 512 C4 tokens; WikiText-2 perplexity on 16 x 512 chunks (the second half of each
scored, as llama.cpp does). Variants: each order sliced; each with down_proj refit by
least squares on the kept units (ridge 1% of the kept units' mean Gram diagonal); OBS's own
sequential update (ridge 1% of the whole Gram's mean diagonal).
usage: python obs_probe.py HF_DIR C4.jsonl WIKI.raw KEEP   (the transformers venv,
$AC_TF_PYTHON; HF_DIR from `autocompress export MODEL.gguf --format hf --dtype fp32 --out
HF_DIR`; docs/pruning.md has the numbers)"""
import json, math, sys, time
import torch
from transformers import AutoModelForCausalLM
from tokenizers import Tokenizer
torch.set_num_threads(2)
hf, c4, wiki, keep = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tok = Tokenizer.from_file(hf + "/tokenizer.json")
model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
L = model.config.num_hidden_layers
F = model.config.intermediate_size
ids = []
for line in open(c4):
    ids += tok.encode(json.loads(line)["text"]).ids
    if len(ids) >= 16 * 512:
        break
cal = torch.tensor(ids[:16 * 512]).view(16, 512)
H = [torch.zeros(F, F, dtype=torch.float64) for _ in range(L)]
A = [torch.zeros(F, dtype=torch.float64) for _ in range(L)]
def hook(l):
    def f(mod, inp):
        h = inp[0].reshape(-1, F).double()
        H[l] += h.T @ h
        A[l] += h.abs().sum(0)
    return f
hs = [model.model.layers[l].mlp.down_proj.register_forward_pre_hook(hook(l)) for l in range(L)]
t0 = time.time()
with torch.no_grad():
    for b in range(16):
        model(cal[b:b + 1])
for h in hs:
    h.remove()
print("calibration %.0f s" % (time.time() - t0), flush=True)
W0 = [model.model.layers[l].mlp.down_proj.weight.detach().double().clone() for l in range(L)]

def obs(l, keep):
    """Greedy OBS removal of F - keep columns: the kept set and the OBS-updated W."""
    Hl = H[l].clone()
    Hl += 0.01 * Hl.diagonal().mean() * torch.eye(F, dtype=torch.float64)
    Hi = torch.linalg.inv(Hl)
    W = W0[l].clone()
    alive = torch.ones(F, dtype=torch.bool)
    for _ in range(F - keep):
        s = (W * W).sum(0) / Hi.diagonal()
        s[~alive] = float("inf")
        j = int(s.argmin())
        W -= torch.outer(W[:, j], Hi[j]) / Hi[j, j]
        Hi -= torch.outer(Hi[:, j], Hi[j]) / Hi[j, j]
        alive[j] = False
        W[:, j] = 0
    return alive.nonzero().flatten(), W

def refit(l, kept):
    """down_proj on the kept units: argmin |h_k W'^T - h W^T|^2 (+1% ridge) from the Gram."""
    Hl = H[l]
    Hkk = Hl[kept][:, kept]
    Hkk = Hkk + 0.01 * Hkk.diagonal().mean() * torch.eye(len(kept), dtype=torch.float64)
    return torch.linalg.solve(Hkk, Hl[kept] @ W0[l].T).T

def ppl():
    text = open(wiki, encoding="utf-8").read()
    t = torch.tensor(tok.encode(text).ids)
    nll, n = 0.0, 0
    with torch.no_grad():
        for c in range(16):
            x = t[c * 512:(c + 1) * 512][None]
            lg = model(x).logits[0, 255:-1].double()   # the second half of each chunk, as llama.cpp
            nll += torch.nn.functional.cross_entropy(lg, x[0, 256:], reduction="sum").item()
            n += 256
    return math.exp(nll / n)

def install(cut):   # cut: per layer (kept units, down_proj [C, keep])
    for l, (kept, Wd) in enumerate(cut):
        m = model.model.layers[l].mlp
        m.gate_proj.weight.data = orig[l][0][kept].clone()
        m.up_proj.weight.data = orig[l][1][kept].clone()
        m.down_proj.weight.data = Wd.float()

orig = [(model.model.layers[l].mlp.gate_proj.weight.data.clone(), model.model.layers[l].mlp.up_proj.weight.data.clone(),
         model.model.layers[l].mlp.down_proj.weight.data.clone()) for l in range(L)]
print("parent ppl %.2f" % ppl(), flush=True)
act = [torch.sort(torch.argsort(-A[l])[:keep]).values for l in range(L)]
t0 = time.time()
ob = [obs(l, keep) for l in range(L)]
print("greedy OBS %.0f s" % (time.time() - t0), flush=True)
rows = []
for name, cut in (("activation order, slice", [(k, W0[l][:, k]) for l, k in enumerate(act)]),
                  ("activation order, down_proj refit", [(k, refit(l, k)) for l, k in enumerate(act)]),
                  ("OBS order, slice", [(k, W0[l][:, k]) for l, (k, _) in enumerate(ob)]),
                  ("OBS order, OBS update (ZipLM)", [(k, W[:, k]) for l, (k, W) in enumerate(ob)]),
                  ("OBS order, down_proj refit", [(k, refit(l, k)) for l, (k, _) in enumerate(ob)])):
    install(cut)
    print("FFN %d of %d: %s: ppl %.2f" % (keep, F, name, ppl()), flush=True)
overlap = sum(len(set(a.tolist()) & set(k.tolist())) for a, (k, _) in zip(act, ob)) / (L * keep)
print("kept units shared by both orders: %.1f%%" % (100 * overlap))
