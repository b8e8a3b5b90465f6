"""Engine oracle for the hybrid Mamba-2 family (nemotron_h): an independent float64 PyTorch
implementation of Nemotron-H's blocks as HF transformers' modeling_nemotron_h.py computes them
(pre-norm blocks "M" Mamba-2, "*" attention without RoPE, "-" squared-ReLU MLP of up and down),
checked against the C engine (fp32) driven through tests/tools/engine_oracle.
The Mamba-2 mixer here is written in the SSD's quadratic ("attention") form — y_t = sum_{s<=t}
(C_t . B_s) exp(sum_{r=s+1..t} dt_r A) dt_s x_s + D x_t — which shares nothing with the engine's
recurrent scan; the conv is torch's grouped Conv1d with padding K-1 cut to T, then SiLU; the gated
norm is silu(z)-gated RMSNorm within n_groups groups, as Zamba2RMSNormGated. dt = softplus(dt +
dt_bias), unclamped (time_step_limit (0, inf)). The search masks: hidden, per-layer Mamba (or
attention) head masks on the gated-norm output before out_proj, MLP unit masks, block gates.
Checks: logits (rel err < 1e-5), CE and KD losses, every weight gradient (A_log, D, dt_bias, the
conv and the gated norm included) and every mask gradient (rel err < 1e-4).
Random weights: no quality claim is made for these models.
Run with $AC_PYTHON; the driver is BUILD/tools/engine_oracle (tests/tools/engine_oracle.c)."""
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_engine_oracle as base  # noqa: E402

F = torch.nn.functional
dense_forward, dense_arch_lines = base.model_forward, base.arch_lines


def segsum_decay(adt):
    """adt [B, T, H] (dt * A): L [B, H, T, T] with L[t, s] = exp(sum_{r=s+1..t} adt_r), 0 above the diagonal."""
    cs = adt.cumsum(1).permute(0, 2, 1)                       # [B, H, T]
    diff = cs[..., :, None] - cs[..., None, :]                # [B, H, t, s]
    T = adt.shape[1]
    return diff.exp().masked_fill(~torch.ones(T, T).tril().bool(), 0.0)


def mamba_mixer(W, p, h, m, head_mask, eps):
    """Nemotron-H's Mamba2Mixer on normalized input h [B, T, C]. m: (H, P, S, G, K)."""
    H, P, S, G, K = m
    B, T, _ = h.shape
    di, cd = H * P, H * P + 2 * G * S
    zxbcdt = h @ W[p + "in_proj.weight"].T
    z, xbc, dt = zxbcdt[..., :di], zxbcdt[..., di:di + cd], zxbcdt[..., di + cd:]
    conv = F.conv1d(xbc.transpose(1, 2), W[p + "conv1d.weight"][:, None, :], W[p + "conv1d.bias"], padding=K - 1,
                    groups=cd)[..., :T].transpose(1, 2)
    xbc = F.silu(conv)
    x, Bm, Cm = xbc[..., :di].view(B, T, H, P), xbc[..., di:di + G * S], xbc[..., di + G * S:]
    Bm = Bm.view(B, T, G, S).repeat_interleave(H // G, dim=2)   # head h reads group h // (H/G)
    Cm = Cm.view(B, T, G, S).repeat_interleave(H // G, dim=2)
    dt = F.softplus(dt + W[p + "dt_bias"])                       # [B, T, H]
    A = -torch.exp(W[p + "A_log"])
    L = segsum_decay(dt * A)                                     # [B, H, t, s]
    cb = torch.einsum("bthn,bshn->bhts", Cm, Bm)
    y = torch.einsum("bhts,bsh,bshp->bthp", cb * L, dt, x) + W[p + "D"][:, None] * x
    y = y.reshape(B, T, di) * F.silu(z)
    yg = y.view(B, T, G, di // G)
    yg = yg * torch.rsqrt(yg.pow(2).mean(-1, keepdim=True) + eps)
    y = yg.reshape(B, T, di) * W[p + "norm.weight"]
    if head_mask is not None:
        y = (y.view(B, T, H, P) * head_mask[:, None]).reshape(B, T, di)
    return y @ W[p + "out_proj.weight"].T


def attention(W, p, h, hq, hkv, D, head_mask):
    B, T, _ = h.shape
    q, k, v = (h @ W[p + "%s_proj.weight" % n].T for n in "qkv")
    q, k, v = q.view(B, T, hq, D), k.view(B, T, hkv, D), v.view(B, T, hkv, D)
    k, v = k.repeat_interleave(hq // hkv, dim=2), v.repeat_interleave(hq // hkv, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
    s = s.masked_fill(~torch.ones(T, T).tril().bool(), float("-inf"))
    o = torch.einsum("bhts,bshd->bthd", s.softmax(-1), v)
    if head_mask is not None:
        o = o * head_mask[:, None]
    return o.reshape(B, T, hq * D) @ W[p + "o_proj.weight"].T


def nemotron_route(W, p, h, lay):
    """Nemotron-H's routing of h: the chosen experts [.., k] and their sigmoid scores (unnormalized)."""
    E, k = lay[3:5]
    ng, tg = lay[14], lay[15]
    s = torch.sigmoid(h @ W[p + "gate.weight"].T)
    choice = s + W[p + "gate.e_score_correction_bias"]
    if tg < ng:
        grp = choice.view(*choice.shape[:-1], ng, E // ng).topk(2, dim=-1)[0].sum(-1)
        keep = torch.zeros_like(grp).scatter(-1, grp.topk(tg, dim=-1)[1], 1.0)
        choice = choice.masked_fill(keep.repeat_interleave(E // ng, -1) == 0, float("-inf"))
    topi = choice.topk(k, dim=-1)[1]
    return topi, s.gather(-1, topi)


def moe_nemotron(W, p, h, lay, em, um=None, sm=None, lm=None):
    """Nemotron-H's MoE (modeling_nemotron_h.py's router and experts): sigmoid scores, the choice by
    scores + e_score_correction_bias within the topk_group best groups (each group scored by the sum
    of its two best biased scores), weights from the unbiased scores, normalized (+1e-20) when
    norm_topk, times routed_scaling_factor; squared-ReLU experts; a shared expert added as it is.
    LatentMoE (lay[17] > 0, Nemotron 3 Super): the experts read h fc1_latent_proj^T and their sum
    goes back through fc2_latent_proj; router and shared expert read h.
    Every expert runs on every token here, weighted by its (zero when not chosen) routing weight;
    em scales the chosen experts' weights, um unit u of every routed expert, sm the shared expert's units,
    lm the latent's channels on both sides (the search's masks)."""
    E, k, Fe, Fs, norm = lay[3:8]
    scale = lay[16]
    latent = len(lay) > 17 and lay[17]
    topi, topw = nemotron_route(W, p, h, lay)
    if norm:
        topw = topw / (topw.sum(-1, keepdim=True) + 1e-20)
    topw = topw * scale
    if em is not None:
        topw = topw * em[topi]
    he = h @ W[p + "fc1_latent_proj.weight"].T if latent else h
    if latent and lm is not None:
        he = he * lm
    y = torch.zeros_like(he)
    for e in range(E):
        w = (topw * (topi == e)).sum(-1)
        q = p + "experts.%d." % e
        z = F.relu(he @ W[q + "up_proj.weight"].T) ** 2
        y = y + w[..., None] * (z if um is None else z * um) @ W[q + "down_proj.weight"].T
    if latent:
        y = y @ W[p + "fc2_latent_proj.weight"].T if lm is None else (y * lm) @ W[p + "fc2_latent_proj.weight"].T
    if Fs:
        z = F.relu(h @ W[p + "shared_experts.up_proj.weight"].T) ** 2
        y = y + (z if sm is None else z * sm) @ W[p + "shared_experts.down_proj.weight"].T
    # the bias only chooses (an index has no gradient): its gradient is zero, as the engine's
    return y + 0.0 * W[p + "gate.e_score_correction_bias"].sum()


def model_forward(a, W, tokens, masks=None, hidden_count=None):
    if a.get("family") != "nemotron_h":
        return dense_forward(a, W, tokens, masks, hidden_count)
    C = a["C"]
    n_eff = hidden_count if masks is not None else C

    def norm(x, w):
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) / n_eff + a["eps"]) * w

    x = W["backbone.embeddings.weight"][tokens]
    if masks is not None:
        x = x * masks["hidden"]
    for l, lay in enumerate(a["layers"]):
        p = "backbone.layers.%d." % l
        hq, hkv, ffn, mam = lay[0], lay[1], lay[2], lay[8:13] or (0,)
        h = norm(x, W[p + "norm.weight"])
        hm = masks["head"][l] if masks is not None else None
        if mam[0] or hq:
            if mam[0]:
                y = mamba_mixer(W, p + "mixer.", h, mam, hm, a["eps"])
            else:
                y = attention(W, p + "mixer.", h, hq, hkv, a["D"], hm)
            x = (x + masks["attn_gate"][l] * y) * masks["hidden"] if masks is not None else x + y
            if not ffn:
                continue
            # a mixer and an MLP in one layer (the engine's timing models): the MLP's own block
            h, pre = norm(x, W[p + "mlp_norm.weight"]), p + "mlp."
        else:
            pre = p + "mixer."
        if len(lay) > 3 and lay[3]:   # an MoE
            y = moe_nemotron(W, pre, h, lay, masks["expert"][l] if masks is not None else None,
                             masks["ffn"][l] if masks is not None else None,
                             masks["shared"][l] if masks is not None else None,
                             masks["latent"][l] if masks is not None else None)
            x = (x + masks["mlp_gate"][l] * y) * masks["hidden"] if masks is not None else x + y
            continue
        u = F.relu(h @ W[pre + "up_proj.weight"].T) ** 2
        if masks is not None:
            u = u * masks["ffn"][l]
        y = u @ W[pre + "down_proj.weight"].T
        x = (x + masks["mlp_gate"][l] * y) * masks["hidden"] if masks is not None else x + y
    h = norm(x, W["backbone.norm_f.weight"])
    lm = W["backbone.embeddings.weight"] if a["tied"] else W["lm_head.weight"]
    return h @ lm.T


def split_masks(a, block):
    C, L = a["C"], len(a["layers"])
    o = C
    m = {"hidden": block[:C], "head": [], "ffn": []}
    for lay in a["layers"]:
        heads = lay[0] or (lay[8] if len(lay) > 8 else 0)
        m["head"].append(block[o:o + heads]); o += heads
        f = lay[2] or (lay[5] if len(lay) > 3 and lay[3] else 0)   # an MoE: its experts' unit masks
        m["ffn"].append(block[o:o + f]); o += f
    m["attn_gate"] = block[o:o + L]; o += L
    m["mlp_gate"] = block[o:o + L]; o += L
    m["expert"] = []
    for lay in a["layers"]:
        e = lay[3] if len(lay) > 3 else 0
        m["expert"].append(block[o:o + e]); o += e
    m["shared"] = []
    for lay in a["layers"]:   # the shared experts' unit masks
        s = lay[6] if len(lay) > 3 and lay[3] else 0
        m["shared"].append(block[o:o + s]); o += s
    m["latent"] = []
    for lay in a["layers"]:   # the LatentMoE layers' latent channels
        t = lay[17] if len(lay) > 17 and lay[3] else 0
        m["latent"].append(block[o:o + t]); o += t
    assert o == block.numel()
    return m


def arch_lines(a):
    lines = dense_arch_lines(dict(a, layers=[tuple(l[:3]) for l in a["layers"]]))
    lines[0] += " " + a.get("family", "llama")
    for i, l in enumerate(a["layers"]):
        if len(l) > 3:
            lines[1 + i] = " ".join(str(v) for v in l)
    return lines


def random_hybrid(rng, pattern, V, C, D, tied=0, mamba=None):
    """Layers for a pattern of M (Mamba-2), * (attention), - (MLP), m (Mamba-2 and an MLP), a
    (attention and an MLP)."""
    H, P, S, G, K = mamba or (rng.choice([4, 6]), rng.choice([3, 4]), rng.choice([4, 5]), 2, rng.choice([2, 4]))
    layers = []
    for c in pattern:
        if c in "Mm":   # m: a Mamba mixer and an MLP in one layer
            layers.append((0, 0, rng.choice([6, 11]) if c == "m" else 0, 0, 0, 0, 0, 0, H, P, S, G, K))
        elif c in "EL":   # Nemotron-H's MoE: 6 experts top 2 in 3 groups of which 2 kept, a shared expert;
            ng, tg = (3, 2) if rng.random() < 0.5 else (1, 1)   # L: LatentMoE (experts in a latent of 5 or 9)
            layers.append((0, 0, 0, 6, 2, rng.choice([4, 7]), rng.choice([0, 5]), rng.choice([0, 1]), 0, 0, 0, 0, 0, 1,
                           ng, tg, rng.choice([1.0, 2.5]), rng.choice([5, 9]) if c == "L" else 0))
        elif c in "*a":   # a: attention and an MLP in one layer
            hkv = rng.choice([1, 2])
            layers.append((hkv * rng.choice([1, 2]), hkv, rng.choice([6, 11]) if c == "a" else 0))
        else:
            layers.append((0, 0, rng.choice([6, 11])))
    return {"V": V, "C": C, "D": D, "theta": 10000.0, "eps": 1e-5, "tied": tied, "bias": 0,
            "rope": (0, 0.0, 0.0, 0.0, 0), "layers": layers, "family": "nemotron_h"}


def main():
    tool = base.tool_path()
    base.arch_lines = arch_lines
    base.split_masks = split_masks
    base.model_forward = model_forward
    rng = random.Random(20261204)
    cases = [   # (pattern, masks, (B, T), tied, mamba shape (H, P, S, G, K) or None)
        ("M-M*", 1, (2, 7), 0, None),
        ("M*-M", 0, (1, 9), 1, (4, 4, 6, 4, 4)),
        # longer than the scan's checkpoint interval (32 steps): the backward's recompute crosses chunks
        ("MM-", 1, (2, 45), 0, (6, 3, 4, 3, 3)),
        ("*M-", 1, (3, 5), 1, (2, 8, 3, 1, 1)),
        # the engine's two-block layers (calibration's timing models): Mamba + MLP, attention + MLP
        ("m*a-", 1, (2, 6), 0, (4, 3, 4, 2, 2)),
        # Nemotron-H's MoE layers: sigmoid routing, correction bias, grouped top-k, routed scale
        ("ME*E", 1, (2, 7), 0, None),
        ("EME", 0, (1, 9), 1, (4, 4, 6, 4, 4)),
        # LatentMoE (Nemotron 3 Super): the experts in a latent space, projected in and out
        ("ML*L", 1, (2, 7), 0, None),
        ("LMEL", 0, (1, 12), 1, None),
    ]
    failures = []
    for i, (pattern, masks, (B, T), tied, shape) in enumerate(cases):
        a = random_hybrid(rng, pattern, 37, 16, 4, tied, shape)
        ta = base.random_arch(rng, 37, 20, 4, dict(tied=1, n_layers=2))
        ta["family"] = "llama"
        print("case %d: %s B=%d T=%d layers=%s masks=%d" % (i, pattern, B, T, a["layers"], masks))
        for f in base.run_case(tool, i, a, ta, B, T, masks, 1.5, 0.4, 500 + i):
            failures.append("case %d: %s" % (i, f))
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("PASS: %d random Nemotron-H configs match the float64 PyTorch reference" % len(cases))


if __name__ == "__main__":
    main()
