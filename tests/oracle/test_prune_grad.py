"""Gradients through a pruned student against an independent PyTorch implementation.

tests/tools/prune_oracle ranks a random heterogeneous GQA parent, permutes it, prunes it
to a smaller heterogeneous arch (narrower hidden, fewer KV groups and query heads per
group, narrower / removed MLP, removed attention, a removed layer) and takes one loss +
backward step (CE, CE+KD against the parent, and CE+KD with the intermediate-state loss:
the cosine distance of each student layer's output to its source layer's in the parent, on
the parent's first channels, both through the norm weight of the parent's next block,
weighted to hidden_weight times the logit loss). Here PyTorch (float64) rebuilds both
models from the dumped weights and the arch JSON, checks that every student tensor is the
prefix slice of the ranked parent's, and compares the loss and every weight gradient
(relative error < 1e-4). Env: AC_BIN (build/autocompress; the tool sits in build/tools).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

torch.set_default_dtype(torch.float64)


def read_records(path):
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    p = 0
    while p < len(data):
        (n,) = struct.unpack_from("<i", data, p); p += 4
        name = data[p:p + n].decode(); p += n
        (nd,) = struct.unpack_from("<i", data, p); p += 4
        shape = struct.unpack_from("<%dq" % nd, data, p); p += 8 * nd
        cnt = int(np.prod(shape)) if nd else 1
        arr = np.frombuffer(data, dtype="<f4", count=cnt, offset=p).reshape(shape); p += 4 * cnt
        out[name] = arr.astype(np.float64)
    return out


def rms(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    # x [T, H, D], rotate_half layout
    T, H, D = x.shape
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attn_block(arch, g, pre, x):
    """The attention block of layer `pre` on stream x [T, C]: (heads' output before o_proj, o_proj output)."""
    D = arch["head_dim"]
    L = arch["layers"][int(pre.split(".")[2])]
    Hq, Hkv = L["attention"]["n_heads"], L["attention"]["n_kv_heads"]
    T = x.shape[0]
    h = rms(x, g(pre + "input_layernorm.weight"), arch["norm_eps"])
    q = h @ g(pre + "self_attn.q_proj.weight").T
    k = h @ g(pre + "self_attn.k_proj.weight").T
    v = h @ g(pre + "self_attn.v_proj.weight").T
    if arch.get("attention_bias"):
        q = q + g(pre + "self_attn.q_proj.bias")
        k = k + g(pre + "self_attn.k_proj.bias")
        v = v + g(pre + "self_attn.v_proj.bias")
    q = rope(q.view(T, Hq, D), arch["rope_theta"])
    k = rope(k.view(T, Hkv, D), arch["rope_theta"])
    v = v.view(T, Hkv, D)
    rep = Hq // Hkv
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    s = torch.einsum("thd,shd->hts", q, k) / D ** 0.5
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    s = s.masked_fill(mask, float("-inf"))
    a = torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(T, Hq * D)
    return a, a @ g(pre + "self_attn.o_proj.weight").T


def mlp_block(arch, g, pre, x):
    """The MLP block of layer `pre` on stream x [T, C]: (gated units before down_proj, down_proj output)."""
    h = rms(x, g(pre + "post_attention_layernorm.weight"), arch["norm_eps"])
    u = torch.nn.functional.silu(h @ g(pre + "mlp.gate_proj.weight").T) * (h @ g(pre + "mlp.up_proj.weight").T)
    return u, u @ g(pre + "mlp.down_proj.weight").T


def forward(arch, W, prefix, tokens, layers=None):
    """Logits [B, T, V] of the model in W (dict name -> tensor); with layers (a list), the
    stream [B, T, C] after each layer is appended to it."""
    g = lambda n: W[prefix + n]
    outs, states = [], []
    for row in tokens:
        x = g("model.embed_tokens.weight")[row]
        st = []
        for i, L in enumerate(arch["layers"]):
            pre = "model.layers.%d." % i
            if L.get("attention"):
                x = x + attn_block(arch, g, pre, x)[1]
            if L.get("mlp"):
                x = x + mlp_block(arch, g, pre, x)[1]
            st.append(x)
        states.append(st)
        x = rms(x, g("model.norm.weight"), arch["norm_eps"])
        head = g("lm_head.weight") if (prefix + "lm_head.weight") in W else g("model.embed_tokens.weight")
        outs.append(x @ head.T)
    if layers is not None:
        layers.extend(torch.stack([states[b][i] for b in range(len(states))]) for i in range(len(arch["layers"])))
    return torch.stack(outs)


def check_slices(pa, sa, rec):
    """Every student tensor is the prefix slice of the ranked parent's tensor."""
    C, D = sa["hidden_size"], sa["head_dim"]
    P = lambda n: rec["parent." + n]
    for i, L in enumerate(sa["layers"]):
        src = L["source_layer"]
        pl = pa["layers"][src]
        sp, pp = "student.model.layers.%d." % i, "model.layers.%d." % src
        if L.get("attention"):
            hq, hkv = L["attention"]["n_heads"], L["attention"]["n_kv_heads"]
            pr = pl["attention"]["n_heads"] // pl["attention"]["n_kv_heads"]
            tr = hq // hkv
            qrows = [(g * pr + j) * D + d for g in range(hkv) for j in range(tr) for d in range(D)]
            kvrows = list(range(hkv * D))
            assert np.array_equal(rec[sp + "self_attn.q_proj.weight"], P(pp + "self_attn.q_proj.weight")[qrows][:, :C])
            assert np.array_equal(rec[sp + "self_attn.k_proj.weight"], P(pp + "self_attn.k_proj.weight")[kvrows][:, :C])
            assert np.array_equal(rec[sp + "self_attn.o_proj.weight"], P(pp + "self_attn.o_proj.weight")[:C][:, qrows])
        if L.get("mlp"):
            F = L["mlp"]["ffn_dim"]
            assert np.array_equal(rec[sp + "mlp.up_proj.weight"], P(pp + "mlp.up_proj.weight")[:F, :C])
            assert np.array_equal(rec[sp + "mlp.down_proj.weight"], P(pp + "mlp.down_proj.weight")[:C, :F])
    assert np.array_equal(rec["student.model.embed_tokens.weight"], P("model.embed_tokens.weight")[:, :C])


def run_case(tool, seed, hidden, kd, hw=0.0):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "case")
        subprocess.run([tool, out, str(seed), str(hidden), str(kd), str(hw)], check=True, stdout=subprocess.DEVNULL)
        rec = read_records(out + ".bin")
        pa = json.load(open(out + ".parent.json"))
        sa = json.load(open(out + ".student.json"))
    check_slices(pa, sa, rec)
    tokens = torch.tensor(rec["tokens"], dtype=torch.long)
    targets = torch.tensor(rec["targets"], dtype=torch.long)
    loss_c, ce_c, kd_c, temp, w, hw_c, hid_c = [float(v) for v in rec["loss"]]
    assert abs(hw_c - hw) < 1e-6
    W = {k: torch.tensor(v, requires_grad=k.startswith("student.")) for k, v in rec.items()
         if k.startswith("student.") or k.startswith("parent.")}
    s_states, t_states = [], []
    logits = forward(sa, W, "student.", tokens, s_states)
    V = logits.shape[-1]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets)
    if kd:
        with torch.no_grad():
            t_logits = forward(pa, W, "parent.", tokens, t_states)
        p = (t_logits / temp).log_softmax(-1)
        q = (logits / temp).log_softmax(-1)
        kl = (p.exp() * (p - q)).sum(-1).mean() * temp * temp
        loss = w * kl + (1 - w) * ce
    else:
        loss = ce
    logit_loss = loss.item()
    if hw > 0:
        C = sa["hidden_size"]
        def reader(j):   # the parent's norm weight that reads its stream after layer j
            for k in range(j + 1, len(pa["layers"])):
                pre = "parent.model.layers.%d." % k
                if pa["layers"][k].get("attention"):
                    return W[pre + "input_layernorm.weight"]
                if pa["layers"][k].get("mlp"):
                    return W[pre + "post_attention_layernorm.weight"]
            return W["parent.model.norm.weight"]
        dist = []
        for i, L in enumerate(sa["layers"]):
            g = reader(L["source_layer"])[:C]
            t = t_states[L["source_layer"]][..., :C]
            dist.append(1 - torch.nn.functional.cosine_similarity(s_states[i] * g, t * g, dim=-1))
        hid = torch.stack(dist).mean()
        assert abs(hid.item() - hid_c) < 1e-4 * (1 + hid.item()), (hid.item(), hid_c)
        assert hid.item() > 1e-3, hid.item()   # the student is not its parent: the term is not empty
        loss = loss + hw * logit_loss / hid.item() * hid
    loss.backward()
    assert abs(logit_loss - loss_c) < 1e-4 * (1 + abs(logit_loss)), (logit_loss, loss_c)
    worst = 0.0
    for name, t in W.items():
        if not name.startswith("student."):
            continue
        g_c = torch.tensor(rec["grad." + name[len("student."):]])
        g_t = t.grad if t.grad is not None else torch.zeros_like(t)
        err = ((g_c - g_t).norm() / max(g_t.norm().item(), 1e-12)).item()
        worst = max(worst, err)
        assert err < 1e-4, "%s: gradient rel err %.3g" % (name, err)
    print("seed %d hidden %d kd %d hw %g: loss torch %.6f engine %.6f (hidden %.6f), worst gradient rel err %.3g "
          "over %d tensors" % (seed, hidden, kd, hw, logit_loss, loss_c, hid_c, worst,
                               sum(1 for n in W if n.startswith("student."))))


def main():
    tool = os.path.join(os.path.dirname(os.environ.get("AC_BIN", "build/autocompress")), "tools", "prune_oracle")
    if not os.access(tool, os.X_OK):
        print("missing %s (make all builds it)" % tool)
        return 1
    run_case(tool, 3, 20, 0)    # hidden pruned, CE
    run_case(tool, 5, 32, 1)    # hidden kept, CE + KD against the ranked parent
    run_case(tool, 9, 24, 1)    # hidden pruned, CE + KD (teacher wider than the student)
    run_case(tool, 9, 24, 1, 0.5)   # ... with the intermediate-state loss (a parent layer removed)
    run_case(tool, 5, 32, 1, 2.0)   # ... hidden kept
    return 0


if __name__ == "__main__":
    sys.exit(main())
