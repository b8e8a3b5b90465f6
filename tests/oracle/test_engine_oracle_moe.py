"""Engine oracle for the mixture-of-experts families: an independent float64 PyTorch
implementation of Mixtral's block_sparse_moe (softmax router, top-k renormalized, SwiGLU
experts w1/w3/w2) and Qwen2-MoE's mlp (top-k with or without norm_topk_prob, a shared expert
scaled by sigmoid of its own gate) and OLMoE's (top-k with or without norm_topk_prob, no shared
expert; attention RMS-normalizes q and k over their whole rows with q_norm / k_norm before RoPE),
beside attention layers and dense MLP layers, with the
search masks (the expert masks scale each chosen expert's routing weight, the unit masks unit u
of every routed expert, the shared-expert masks each unit of the shared expert). Every expert runs
on every token here and is weighted by its (zero when not chosen) routing weight: no token
grouping, so the engine's gather / GEMM / scatter path is checked against plain algebra.
Checks: logits (rel err < 1e-5), CE and KD losses, every weight gradient and every mask
gradient, expert, unit and shared-expert masks included (rel err < 1e-4).
Run with $AC_PYTHON; the driver is BUILD/tools/engine_oracle (tests/tools/engine_oracle.c)."""
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_engine_oracle as base  # noqa: E402

F = torch.nn.functional
dense_forward, dense_arch_lines = base.model_forward, base.arch_lines


def moe_names(fam, l):
    if fam == "mixtral":
        p = "model.layers.%d.block_sparse_moe." % l
        return p + "gate.weight", lambda e: [p + "experts.%d.%s.weight" % (e, w) for w in ("w1", "w3", "w2")]
    p = "model.layers.%d.mlp." % l
    return p + "gate.weight", lambda e: [p + "experts.%d.%s.weight" % (e, w)
                                         for w in ("gate_proj", "up_proj", "down_proj")]


def swiglu(h, wg, wu, wd, um=None):
    z = F.silu(h @ wg.T) * (h @ wu.T)
    return (z if um is None else z * um) @ wd.T


def moe_block(a, W, l, h, lay, masks):
    E, k, _, S, norm = lay[3:8]
    router, experts = moe_names(a["family"], l)
    prob = (h @ W[router].T).softmax(-1)
    topw, topi = prob.topk(k, dim=-1)
    if norm:
        topw = topw / topw.sum(-1, keepdim=True)
    um = sm = None
    if masks is not None:
        topw = topw * masks["expert"][l][topi]
        um = masks["ffn"][l]   # unit u of every routed expert
        sm = masks["shared"][l]
    y = torch.zeros_like(h)
    for e in range(E):
        w = (topw * (topi == e)).sum(-1)
        y = y + w[..., None] * swiglu(h, *[W[n] for n in experts(e)], um)
    if S:
        p = "model.layers.%d.mlp." % l
        g = torch.sigmoid(h @ W[p + "shared_expert_gate.weight"].T)
        y = y + g * swiglu(h, *[W[p + "shared_expert.%s.weight" % n] for n in ("gate_proj", "up_proj", "down_proj")], sm)
    return y


def model_forward(a, W, tokens, masks=None, hidden_count=None):
    """base.model_forward with MoE layers: the dense path handles attention and dense MLPs;
    MoE layers are spliced in by running layer by layer."""
    if not any(len(l) > 3 and l[3] for l in a["layers"]):
        return dense_forward(a, W, tokens, masks, hidden_count)
    B, T = tokens.shape
    C = a["C"]
    n_eff = hidden_count if masks is not None else C

    def norm(x, w):
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) / n_eff + a["eps"]) * w

    x = W["model.embed_tokens.weight"][tokens]
    if masks is not None:
        x = x * masks["hidden"]
    for l, lay in enumerate(a["layers"]):
        p = "model.layers.%d." % l
        one = dict(a, layers=[tuple(lay[:2]) + (0,)])
        if lay[0]:   # attention alone, through the dense reference with a one-layer arch
            x = attn_only(one, W, p, x, masks, l, B, T, n_eff)
        if len(lay) > 3 and lay[3]:
            y = moe_block(a, W, l, norm(x, W[p + "post_attention_layernorm.weight"]), lay, masks)
        elif lay[2]:
            h = norm(x, W[p + "post_attention_layernorm.weight"])
            z = F.silu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)
            if masks is not None:
                z = z * masks["ffn"][l]
            y = z @ W[p + "mlp.down_proj.weight"].T
        else:
            continue
        x = (x + masks["mlp_gate"][l] * y) * masks["hidden"] if masks is not None else x + y
    h = norm(x, W["model.norm.weight"])
    lm = W["model.embed_tokens.weight"] if a["tied"] else W["lm_head.weight"]
    return h @ lm.T


def attn_only(one, W, p, x, masks, l, B, T, n_eff):
    """One attention block of layer l on stream x, as base.model_forward computes it."""
    import math
    D, hq, hkv = one["D"], one["layers"][0][0], one["layers"][0][1]

    def norm(v, w):
        return v * torch.rsqrt((v * v).sum(-1, keepdim=True) / n_eff + one["eps"]) * w

    ang = torch.arange(T, dtype=torch.float64)[:, None] * base.inv_freq(one)[None, :]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    h = norm(x, W[p + "input_layernorm.weight"])
    q, k, v = (h @ W[p + "self_attn.%s_proj.weight" % n].T for n in "qkv")
    if one["bias"]:
        q, k, v = (t + W[p + "self_attn.%s_proj.bias" % n] for t, n in zip((q, k, v), "qkv"))
    if one.get("family") == "olmoe":   # whole-row RMSNorm of q and k (all heads together)
        q, k = (t * torch.rsqrt((t * t).mean(-1, keepdim=True) + one["eps"]) * W[p + "self_attn.%s_norm.weight" % n]
                for t, n in ((q, "q"), (k, "k")))
    q, k, v = q.view(B, T, hq, D), k.view(B, T, hkv, D), v.view(B, T, hkv, D)
    q = q * cos + base.rotate_half(q) * sin
    k = k * cos + base.rotate_half(k) * sin
    k, v = k.repeat_interleave(hq // hkv, dim=2), v.repeat_interleave(hq // hkv, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
    s = s.masked_fill(~torch.ones(T, T).tril().bool(), float("-inf"))
    o = torch.einsum("bhts,bshd->bthd", s.softmax(-1), v)
    if masks is not None:
        o = o * masks["head"][l][None, None, :, None]
    y = o.reshape(B, T, hq * D) @ W[p + "self_attn.o_proj.weight"].T
    return (x + masks["attn_gate"][l] * y) * masks["hidden"] if masks is not None else x + y


def split_masks(a, block):
    C, L = a["C"], len(a["layers"])
    o = C
    m = {"hidden": block[:C], "head": [], "ffn": [], "expert": []}
    for lay in a["layers"]:
        m["head"].append(block[o:o + lay[0]]); o += lay[0]
        f = lay[2] or (lay[5] if len(lay) > 3 and lay[3] else 0)   # an MoE: its experts' unit masks
        m["ffn"].append(block[o:o + f]); o += f
    m["attn_gate"] = block[o:o + L]; o += L
    m["mlp_gate"] = block[o:o + L]; o += L
    for lay in a["layers"]:
        e = lay[3] if len(lay) > 3 else 0
        m["expert"].append(block[o:o + e]); o += e
    m["shared"] = []
    for lay in a["layers"]:   # the shared experts' unit masks
        s = lay[6] if len(lay) > 3 and lay[3] else 0
        m["shared"].append(block[o:o + s]); o += s
    assert o == block.numel()
    return m


def arch_lines(a):
    lines = dense_arch_lines(dict(a, layers=[tuple(l[:3]) for l in a["layers"]]))
    lines[0] += " " + a["family"]
    for i, l in enumerate(a["layers"]):
        if len(l) > 3:
            lines[1 + i] = " ".join(str(v) for v in l)
    return lines


def random_moe_arch(rng, fam, V, C, D, n_layers, dense=(), no_attn=(), tied=1):
    layers = []
    for i in range(n_layers):
        hkv = rng.choice([1, 2])
        hq, hkv = (0, 0) if i in no_attn else (hkv * rng.choice([1, 2]), hkv)
        if i in dense:
            layers.append((hq, hkv, rng.choice([7, 12])))
            continue
        E = rng.choice([3, 4, 6])
        k = rng.choice([1, 2]) if E > 3 else 2
        shared = rng.choice([5, 9]) if fam == "qwen2_moe" else 0   # none in Mixtral and OLMoE
        norm = 1 if fam == "mixtral" else rng.choice([0, 1])
        layers.append((hq, hkv, 0, E, k, rng.choice([4, 7, 10]), shared, norm))
    return {"V": V, "C": C, "D": D, "theta": 10000.0, "eps": 1e-5, "tied": tied, "bias": int(fam == "qwen2_moe"),
            "rope": (0, 0.0, 0.0, 0.0, 0), "layers": layers, "family": fam}


def main():
    tool = base.tool_path()
    base.arch_lines = arch_lines
    base.split_masks = split_masks
    base.model_forward = model_forward
    rng = random.Random(20261203)
    cases = [
        ("mixtral", dict(n_layers=2), 1, (2, 7)),
        ("mixtral", dict(n_layers=3, dense=(1,), no_attn=(2,), tied=0), 1, (3, 5)),
        ("qwen2_moe", dict(n_layers=2), 1, (2, 9)),
        ("qwen2_moe", dict(n_layers=3, dense=(0,), tied=0), 0, (1, 40)),
        ("olmoe", dict(n_layers=2, tied=0), 1, (2, 7)),
        ("olmoe", dict(n_layers=3, no_attn=(1,)), 0, (1, 33)),
    ]
    failures = []
    for i, (fam, opts, masks, (B, T)) in enumerate(cases):
        a = random_moe_arch(rng, fam, 37, 16, 4, **opts)
        ta = base.random_arch(rng, 37, 20, 4, dict(tied=1, n_layers=2))
        ta["family"] = "llama"
        print("case %d: %s B=%d T=%d layers=%s masks=%d" % (i, fam, B, T, a["layers"], masks))
        for f in base.run_case(tool, i, a, ta, B, T, masks, 1.5, 0.4, 300 + i):
            failures.append("case %d: %s" % (i, f))
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("PASS: %d random MoE configs match the float64 PyTorch reference" % len(cases))


if __name__ == "__main__":
    main()
