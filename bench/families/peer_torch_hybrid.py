"""PyTorch eager peer of BUILD/tools/engine_bench --model for a Nemotron-H checkpoint. transformers
4.40.2 (the pinned reference) has no Nemotron-H class, so this is the family's math written here
in PyTorch the way transformers' NemotronH torch path computes it: prefill through the chunked
SSD scan (chunks of 128: quadratic within a chunk, states passed between chunks), decode one
token at a time through a conv and SSM state cache, attention (no RoPE) through a KV cache,
squared-ReLU MLPs; fp32, same threads. Before timing it checks its logits against the engine's
on the same ids (export_interop --logits) when a file of them is given. Prints "name value unit"
lines like engine_bench (wall-clock rates; *_cpu beside them).
usage: peer_torch_hybrid.py MODEL_DIR THREADS [--check ENGINE_LOGITS.f32 IDS.txt]"""
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def load(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    raw = open(os.path.join(d, "model.safetensors"), "rb").read()
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    W = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        W[k] = torch.from_numpy(np.frombuffer(raw, np.float32, (b - a) // 4, 8 + n + a).reshape(v["shape"]).copy())
    return cfg, W


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def segsum(x):
    """x [..., T] -> [..., T, T]: sum of x over (j, i] below the diagonal, -inf above."""
    T = x.size(-1)
    x = x[..., None].expand(*x.shape, T)
    x = x.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool), -1), 0)
    s = torch.cumsum(x, dim=-2)
    return s.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool), 0), -math.inf)


def ssd(X, A, Bm, Cm, L):
    """Chunked SSD scan (the Mamba-2 paper's minimal form): X [b, l, h, p] (x*dt), A [b, l, h]
    (A*dt), Bm, Cm [b, l, h, n]; l a multiple of L. Returns y [b, l, h, p] and the final state."""
    b, l, h, p = X.shape
    c = l // L
    X, A, Bm, Cm = X.reshape(b, c, L, h, p), A.reshape(b, c, L, h), Bm.reshape(b, c, L, h, -1), Cm.reshape(b, c, L, h, -1)
    A = A.permute(0, 3, 1, 2)                                           # b h c L
    Acs = torch.cumsum(A, -1)
    Ld = torch.exp(segsum(A))
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Cm, Bm, Ld, X)
    decay = torch.exp(Acs[..., -1:] - Acs)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bm, decay, X)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], 1)
    dchunk = torch.exp(segsum(F.pad(Acs[..., -1], (1, 0))))
    new = torch.einsum("bhzc,bchpn->bzhpn", dchunk, states)
    states, final = new[:, :-1], new[:, -1]
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", Cm, states, torch.exp(Acs))
    return (y_diag + y_off).reshape(b, l, h, p), final


class Model:
    def __init__(self, d):
        self.cfg, self.W = load(d)
        c = self.cfg
        self.pat, self.eps = c["hybrid_override_pattern"], c.get("layer_norm_epsilon", 1e-5)
        self.H, self.P, self.N, self.G, self.K = c["mamba_num_heads"], c["mamba_head_dim"], c["ssm_state_size"], \
            c["n_groups"], c["conv_kernel"]
        self.hq, self.hkv, self.D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]

    def mixer(self, p, h, cache, l):
        W, H, P, N, G, K = self.W, self.H, self.P, self.N, self.G, self.K
        b, T, _ = h.shape
        di, cd = H * P, H * P + 2 * G * N
        zxd = h @ W[p + "in_proj.weight"].T
        z, xbc, dt = zxd[..., :di], zxd[..., di:di + cd], zxd[..., di + cd:]
        cw, cb = W[p + "conv1d.weight"], W[p + "conv1d.bias"]
        prev = cache.get(("conv", l))
        seq = torch.cat([prev, xbc], 1) if prev is not None else F.pad(xbc, (0, 0, K - 1, 0))
        cache[("conv", l)] = seq[:, -(K - 1):]
        xbc = F.silu(F.conv1d(seq.transpose(1, 2), cw, cb, groups=cd).transpose(1, 2))
        x, Bm, Cm = xbc[..., :di].reshape(b, T, H, P), xbc[..., di:di + G * N], xbc[..., di + G * N:]
        Bm = Bm.reshape(b, T, G, N).repeat_interleave(H // G, 2)
        Cm = Cm.reshape(b, T, G, N).repeat_interleave(H // G, 2)
        dt = F.softplus(dt + W[p + "dt_bias"])
        A = -torch.exp(W[p + "A_log"])
        st = cache.get(("ssm", l))
        if T == 1 and st is not None:   # decode: the recurrent step
            st = st * torch.exp(dt[:, 0, :, None, None] * A[:, None, None]) + \
                (dt[:, 0, :, None, None] * x[:, 0, :, :, None]) * Bm[:, 0, :, None, :]
            y = torch.einsum("bhpn,bhn->bhp", st, Cm[:, 0])[:, None]
        else:
            L = 128
            pad = (-T) % L
            Xp = F.pad(x * dt[..., None], (0, 0, 0, 0, 0, pad))
            y, st = ssd(Xp, F.pad(A * dt, (0, 0, 0, pad)), F.pad(Bm, (0, 0, 0, 0, 0, pad)),
                        F.pad(Cm, (0, 0, 0, 0, 0, pad)), L)
            y = y[:, :T]
        cache[("ssm", l)] = st
        y = (y + W[p + "D"][:, None] * x).reshape(b, T, di) * F.silu(z)
        yg = y.reshape(b, T, G, di // G)
        y = (yg * torch.rsqrt(yg.pow(2).mean(-1, keepdim=True) + self.eps)).reshape(b, T, di) * W[p + "norm.weight"]
        return y @ W[p + "out_proj.weight"].T

    def attention(self, p, h, cache, l):
        W, hq, hkv, D = self.W, self.hq, self.hkv, self.D
        b, T, _ = h.shape
        q = (h @ W[p + "q_proj.weight"].T).reshape(b, T, hq, D).transpose(1, 2)
        k = (h @ W[p + "k_proj.weight"].T).reshape(b, T, hkv, D).transpose(1, 2)
        v = (h @ W[p + "v_proj.weight"].T).reshape(b, T, hkv, D).transpose(1, 2)
        if ("k", l) in cache:
            k, v = torch.cat([cache[("k", l)], k], 2), torch.cat([cache[("v", l)], v], 2)
        cache[("k", l)], cache[("v", l)] = k, v
        k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        S = k.shape[2]
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        if T > 1:
            s = s.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(S - T), -math.inf)
        o = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, T, hq * D)
        return o @ W[p + "o_proj.weight"].T

    def __call__(self, ids, cache, last_only=False):
        W = self.W
        x = W["backbone.embeddings.weight"][ids]
        for l, ch in enumerate(self.pat):
            p = "backbone.layers.%d." % l
            h = rms(x, W[p + "norm.weight"], self.eps)
            if ch == "M":
                x = x + self.mixer(p + "mixer.", h, cache, l)
            elif ch == "*":
                x = x + self.attention(p + "mixer.", h, cache, l)
            else:
                x = x + (F.relu(h @ W[p + "mixer.up_proj.weight"].T) ** 2) @ W[p + "mixer.down_proj.weight"].T
        if last_only:
            x = x[:, -1:]
        return rms(x, W["backbone.norm_f.weight"], self.eps) @ W["lm_head.weight"].T


def main():
    path, threads = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(threads)
    m = Model(path)
    V = m.cfg["vocab_size"]
    print("peer pytorch %s, Nemotron-H written in PyTorch (chunked SSD prefill, recurrent decode)" % torch.__version__)
    print("threads %d" % torch.get_num_threads())
    with torch.no_grad():
        if "--check" in sys.argv:
            ref_path, ids_path = sys.argv[sys.argv.index("--check") + 1:][:2]
            ids = torch.tensor([[int(t) for t in open(ids_path).read().split()]])
            ref = np.fromfile(ref_path, np.float32).reshape(ids.shape[1], -1)
            full = m(ids, {})[0].numpy()
            cache, steps = {}, []   # the decode path too: prefill half, then one token at a time
            h = ids.shape[1] // 2
            steps.append(m(ids[:, :h], cache)[0].numpy())
            for t in range(h, ids.shape[1]):
                steps.append(m(ids[:, t:t + 1], cache)[0].numpy())
            dec = np.concatenate(steps)
            scale = np.abs(ref).max()
            print("check_prefill_rel_err %.2e" % (np.abs(full - ref).max() / scale))
            print("check_decode_rel_err %.2e" % (np.abs(dec - ref).max() / scale))
        T = 512
        ids = (torch.arange(T) * 7919 + 13) % V
        m(ids[None, :64], {})   # warm-up
        best = None
        for _ in range(2):
            w0, c0 = time.perf_counter(), time.process_time()
            m(ids[None, :T], {}, last_only=True)
            w, c = time.perf_counter() - w0, time.process_time() - c0
            best = (w, c) if best is None or w < best[0] else best
        print("prefill_b1_wall %.1f tok/s (T=%d)" % (T / best[0], T))
        print("prefill_b1_cpu %.1f tok/s" % (T / best[1]))
        steps, cache = 32, {}
        nxt = m(ids[None, :128], cache, last_only=True)[:, -1:].argmax(-1)
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            nxt = m(nxt, cache, last_only=True)[:, -1:].argmax(-1)
        w, c = time.perf_counter() - w0, time.process_time() - c0
        print("decode_b1_wall %.2f tok/s (prompt 128, %d steps)" % (steps / w, steps))
        print("decode_b1_cpu %.2f tok/s" % (steps / c))


if __name__ == "__main__":
    main()
