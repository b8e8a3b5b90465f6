"""Engine oracle: an independent float64 PyTorch implementation of the Llama-family model
(HF layout: rotate_half RoPE, GQA, SwiGLU, RMSNorm, tied/untied head, q/k/v bias) with the
search masks, checked against the C engine (fp32) driven through tests/tools/engine_oracle.
Random tiny configs cover GQA, tied and untied heads, odd sizes, heterogeneous per-layer
widths, removed attention, removed MLP, attention bias and rope scaling. Checks: logits
(rel err < 1e-5), CE and KD loss values, every weight gradient and every mask gradient
including d loss / d hidden_count (rel err < 1e-4 each).
Run with $AC_PYTHON; finds the tool beside $AC_BIN (BUILD/tools/engine_oracle)."""
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

torch.set_num_threads(1)
torch.set_default_dtype(torch.float64)

LOGIT_TOL = 1e-5
GRAD_TOL = 1e-4


def tool_path():
    binp = os.environ.get("AC_BIN", "build/autocompress")
    path = os.path.join(os.path.dirname(binp), "tools", "engine_oracle")
    if not os.path.exists(path):
        sys.exit(f"FAIL: {path} not built (make BUILD=... {path})")
    return path


def read_records(path):
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    o = 0
    while o < len(data):
        (n,) = struct.unpack_from("<i", data, o); o += 4
        name = data[o:o + n].decode(); o += n
        (nd,) = struct.unpack_from("<i", data, o); o += 4
        shape = struct.unpack_from("<%dq" % nd, data, o); o += 8 * nd
        cnt = int(np.prod(shape)) if nd else 1
        arr = np.frombuffer(data, dtype="<f4", count=cnt, offset=o).reshape(shape); o += 4 * cnt
        out[name] = torch.tensor(arr.astype(np.float64))
    return out


def arch_lines(a):
    rs = a["rope"]
    head = "%d %d %d %r %r %d %d %d %r %r %r %d %d" % (
        a["V"], a["C"], a["D"], a["theta"], a["eps"], a["tied"], a["bias"], rs[0], rs[1], rs[2], rs[3], rs[4],
        len(a["layers"]))
    return [head] + ["%d %d %d" % tuple(l) for l in a["layers"]]


def inv_freq(a):
    D = a["D"]
    typ, fac, lo, hi, orig = a["rope"]
    out = []
    for i in range(D // 2):
        f = 1.0 / (a["theta"] ** ((2.0 * i) / D))
        if typ == 1:
            f /= fac
        elif typ == 2:
            lo_wl, hi_wl, wl = orig / lo, orig / hi, 2 * math.pi / f
            if wl > lo_wl:
                f /= fac
            elif wl >= hi_wl:
                s = (orig / wl - lo) / (hi - lo)
                f = (1 - s) * f / fac + s * f
        out.append(f)
    return torch.tensor(np.array(out, dtype=np.float32).astype(np.float64))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def model_forward(a, W, tokens, masks=None, hidden_count=None):
    """W: dict name -> tensor. masks: dict with hidden, head[l], ffn[l], attn_gate, mlp_gate.
    Returns logits [B,T,V]."""
    B, T = tokens.shape
    C, D = a["C"], a["D"]
    n_eff = hidden_count if masks is not None else C
    eps = a["eps"]

    def norm(x, w):
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) / n_eff + eps) * w

    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq(a)[None, :]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    causal = torch.ones(T, T).tril().bool()
    x = W["model.embed_tokens.weight"][tokens]
    if masks is not None:
        x = x * masks["hidden"]
    for l, (hq, hkv, ffn) in enumerate(a["layers"]):
        p = "model.layers.%d." % l
        if hq:
            h = norm(x, W[p + "input_layernorm.weight"])
            q = h @ W[p + "self_attn.q_proj.weight"].T
            k = h @ W[p + "self_attn.k_proj.weight"].T
            v = h @ W[p + "self_attn.v_proj.weight"].T
            if a["bias"]:
                q = q + W[p + "self_attn.q_proj.bias"]
                k = k + W[p + "self_attn.k_proj.bias"]
                v = v + W[p + "self_attn.v_proj.bias"]
            q = q.view(B, T, hq, D)
            k = k.view(B, T, hkv, D)
            v = v.view(B, T, hkv, D)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            rep = hq // hkv
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
            s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
            s = s.masked_fill(~causal, float("-inf"))
            o = torch.einsum("bhts,bshd->bthd", s.softmax(-1), v)
            if masks is not None:
                o = o * masks["head"][l][None, None, :, None]
            y = o.reshape(B, T, hq * D) @ W[p + "self_attn.o_proj.weight"].T
            if masks is not None:
                x = (x + masks["attn_gate"][l] * y) * masks["hidden"]
            else:
                x = x + y
        if ffn:
            h = norm(x, W[p + "post_attention_layernorm.weight"])
            g = h @ W[p + "mlp.gate_proj.weight"].T
            u = h @ W[p + "mlp.up_proj.weight"].T
            z = torch.nn.functional.silu(g) * u
            if masks is not None:
                z = z * masks["ffn"][l]
            y = z @ W[p + "mlp.down_proj.weight"].T
            if masks is not None:
                x = (x + masks["mlp_gate"][l] * y) * masks["hidden"]
            else:
                x = x + y
    h = norm(x, W["model.norm.weight"])
    lm = W["model.embed_tokens.weight"] if a["tied"] else W["lm_head.weight"]
    return h @ lm.T


def split_masks(a, block):
    C, L = a["C"], len(a["layers"])
    o = C
    m = {"hidden": block[:C], "head": [], "ffn": []}
    for hq, _, ffn in a["layers"]:
        m["head"].append(block[o:o + hq]); o += hq
        m["ffn"].append(block[o:o + ffn]); o += ffn
    m["attn_gate"] = block[o:o + L]; o += L
    m["mlp_gate"] = block[o:o + L]; o += L
    assert o == block.numel()
    return m


def rel(c, r):
    den = r.abs().max().item()
    diff = (c - r).abs().max().item()
    return diff / den if den > 0 else diff


def random_arch(rng, vocab, hidden, head_dim, opts):
    layers = []
    for i in range(opts.get("n_layers", 3)):
        hkv = rng.choice([1, 2])
        hq = hkv * rng.choice([1, 2, 3])
        ffn = rng.choice([5, 9, 16, 23])
        if i in opts.get("no_attn", ()):
            hq = hkv = 0
        if i in opts.get("no_mlp", ()):
            ffn = 0
        layers.append((hq, hkv, ffn))
    return {"V": vocab, "C": hidden, "D": head_dim, "theta": opts.get("theta", 10000.0), "eps": 1e-5,
            "tied": opts.get("tied", 1), "bias": opts.get("bias", 0),
            "rope": opts.get("rope", (0, 0.0, 0.0, 0.0, 0)), "layers": layers}


def run_case(tool, idx, a, ta, B, T, masks, tau, kdw, seed):
    with tempfile.TemporaryDirectory() as d:
        cfgp, outp = os.path.join(d, "cfg.txt"), os.path.join(d, "out.bin")
        with open(cfgp, "w") as f:
            f.write("%d %d %d %d %r %r\n" % (B, T, masks, seed, tau, kdw))
            f.write("\n".join(arch_lines(a) + arch_lines(ta)) + "\n")
        r = subprocess.run([tool, cfgp, outp], capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError("tool failed: " + r.stderr)
        rec = read_records(outp)
    W = {k[2:]: v.clone().requires_grad_(True) for k, v in rec.items() if k.startswith("w.")}
    TW = {k[2:]: v for k, v in rec.items() if k.startswith("t.")}
    tokens = rec["tokens"].long().view(B, T)
    targets = rec["targets"].long().view(B, T)
    mk = hc = None
    if masks:
        block = rec["mask.block"].clone().requires_grad_(True)
        hc = rec["mask.hidden_count"][0].clone().requires_grad_(True)
        mk = split_masks(a, block)
    failures = []
    logits = model_forward(a, W, tokens, mk, hc)
    e = rel(rec["logits"], logits.detach())
    print("case %d: logits rel err %.2e" % (idx, e))
    if e > LOGIT_TOL:
        failures.append("logits rel err %.3e" % e)

    valid = targets >= 0
    cnt = valid.sum()
    lse = logits.logsumexp(-1)
    picked = logits.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    ce = ((lse - picked) * valid).sum() / cnt
    with torch.no_grad():
        tl = model_forward(ta, TW, tokens)
    logp_t = (tl / tau).log_softmax(-1)
    logq = (logits / tau).log_softmax(-1)
    kd_rows = (logp_t.exp() * (logp_t - logq)).sum(-1) * tau * tau
    kd = (kd_rows * valid).sum() / cnt
    loss = kdw * kd + (1 - kdw) * ce
    loss.backward()
    c_loss, c_ce, c_kd = rec["losses"].tolist()
    for nm, c, r in (("loss", c_loss, loss.item()), ("ce", c_ce, ce.item()), ("kd", c_kd, kd.item())):
        er = abs(c - r) / max(abs(r), 1e-12)
        print("case %d: %s C %.8f torch %.8f rel %.1e" % (idx, nm, c, r, er))
        if er > GRAD_TOL:
            failures.append("%s rel err %.3e" % (nm, er))
    worst = 0.0
    for name, w in W.items():
        e = rel(rec["g." + name], w.grad)
        worst = max(worst, e)
        if e > GRAD_TOL:
            failures.append("grad %s rel err %.3e" % (name, e))
    print("case %d: worst weight-grad rel err %.2e over %d tensors" % (idx, worst, len(W)))
    if masks:
        cg = split_masks(a, rec["mask.grad"])
        tg = split_masks(a, block.grad)
        parts = [("hidden", cg["hidden"], tg["hidden"]), ("attn_gate", cg["attn_gate"], tg["attn_gate"]),
                 ("mlp_gate", cg["mlp_gate"], tg["mlp_gate"])]
        for key in [k for k, v in cg.items() if isinstance(v, list)]:   # head, ffn (expert in MoE)
            for l in range(len(a["layers"])):
                if cg[key][l].numel():
                    parts.append(("%s[%d]" % (key, l), cg[key][l], tg[key][l]))
        worst = 0.0
        for nm, c, r in parts:
            e = rel(c, r)
            worst = max(worst, e)
            if e > GRAD_TOL:
                failures.append("mask grad %s rel err %.3e" % (nm, e))
        c_hc, r_hc = rec["mask.hidden_count"][1].item(), hc.grad.item()
        e_hc = abs(c_hc - r_hc) / max(abs(r_hc), 1e-8)
        print("case %d: worst mask-grad rel err %.2e; d/d hidden_count C %.6e torch %.6e (rel %.1e)"
              % (idx, worst, c_hc, r_hc, e_hc))
        if e_hc > GRAD_TOL:
            failures.append("hidden_count grad rel err %.3e" % e_hc)
    return failures


def main():
    tool = tool_path()
    rng = random.Random(20261130)
    cases = [
        # (student options, vocab, hidden, head_dim, masks)
        (dict(tied=1), 41, 24, 8, 1),
        (dict(tied=0, bias=1, no_attn=(1,), no_mlp=(2,), rope=(2, 8.0, 1.0, 4.0, 16)), 37, 20, 4, 1),
        (dict(tied=0, n_layers=2, rope=(1, 2.0, 0.0, 0.0, 0)), 31, 15, 6, 0),
        (dict(tied=1, bias=1, n_layers=4, no_mlp=(0,), no_attn=(3,)), 29, 18, 6, 1),
        (dict(tied=0, n_layers=2, theta=500.0), 53, 12, 2, 1),
        # long enough to cross the CPU attention tile (32 query rows)
        (dict(tied=1, n_layers=2, bias=1), 23, 16, 4, 1, (2, 45)),
    ]
    failures = []
    for i, case in enumerate(cases):
        opts, V, C, D, masks = case[:5]
        a = random_arch(rng, V, C, D, opts)
        ta = random_arch(rng, V, C + 4, D, dict(tied=1 - opts.get("tied", 1), n_layers=2))
        B, T = rng.choice([1, 2, 3]), rng.choice([5, 7, 9])
        if len(case) > 5:
            B, T = case[5]
        tau, kdw = (2.0, 1.0, 0.7, 1.5, 3.0, 1.2)[i], (1.0, 0.3, 0.0, 0.5, 0.7, 0.6)[i]
        print("case %d: B=%d T=%d tau=%g kd_weight=%g layers=%s tied=%d bias=%d masks=%d" %
              (i, B, T, tau, kdw, a["layers"], a["tied"], a["bias"], masks))
        for f in run_case(tool, i, a, ta, B, T, masks, tau, kdw, 100 + i):
            failures.append("case %d: %s" % (i, f))
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("PASS: %d random configs match the float64 PyTorch reference" % len(cases))


if __name__ == "__main__":
    main()
