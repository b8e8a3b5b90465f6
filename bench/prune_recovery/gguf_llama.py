"""Probe support, not part of the product: a llama-family GGUF as float64 PyTorch tensors for
bench/prune_recovery's PyTorch probes (rotation_probe.py, hidden_rank_probe.py), with its
tokenizer (llama-cpp-python, vocabulary only), RoPE in GGUF's interleaved layout and RMSNorm.
Needs the project venv (gguf, llama_cpp, torch)."""
import json, os
import numpy as np, torch, gguf
from gguf import GGUFReader


class Llama:
    def __init__(self, path):
        r = GGUFReader(path)
        self.W = {}
        for t in r.tensors:
            d = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            self.W[t.name] = torch.from_numpy(d.reshape([int(x) for x in reversed(t.shape.tolist())])).double()
        f = {k: r.fields[k].contents() for k in r.fields if not k.startswith("tokenizer")}
        self.L, self.C = f["llama.block_count"], f["llama.embedding_length"]
        self.H, self.KV = f["llama.attention.head_count"], f["llama.attention.head_count_kv"]
        self.D, self.eps = self.C // self.H, f["llama.attention.layer_norm_rms_epsilon"]
        self.theta = f.get("llama.rope.freq_base", 10000.0)
        from llama_cpp import Llama as Vocab
        self.tok = Vocab(model_path=path, vocab_only=True, verbose=False)

    def params(self):
        """The weights by part: emb, on (final norm), head, and per layer an, fn (norms), q, k,
        v, o, g, u, d."""
        W = self.W
        P = {"emb": W["token_embd.weight"], "on": W["output_norm.weight"], "l": []}
        P["head"] = W.get("output.weight", P["emb"])
        for l in range(self.L):
            g = lambda n: W[f"blk.{l}.{n}.weight"]
            P["l"].append(dict(an=g("attn_norm"), fn=g("ffn_norm"), q=g("attn_q"), k=g("attn_k"), v=g("attn_v"),
                               o=g("attn_output"), g=g("ffn_gate"), u=g("ffn_up"), d=g("ffn_down")))
        return P

    def toks(self, path, n, seq, jsonl=False):
        """n x seq tokens from the start of a text file (a .jsonl's first 400 documents)."""
        txt = open(path).read()
        if jsonl:
            txt = "\n\n".join(json.loads(l)["text"] for l in txt.splitlines()[:400])
        ids = self.tok.tokenize(txt.encode()[:4000000], add_bos=False)
        return torch.tensor(ids[: n * seq]).view(n, seq)

    def c4(self, n, seq):
        shared = os.environ.get("AC_SHARED", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                          "..", "shared"))
        return self.toks(os.path.join(shared, "data", "text", "c4", "c4_sample.jsonl"), n, seq, True)

    def rope(self, x, T):
        """x [B, T, heads, D], rotated in interleaved pairs (GGUF's llama layout)."""
        inv = self.theta ** (-torch.arange(0, self.D, 2, dtype=torch.float64) / self.D)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
        c, s = ang.cos()[None, :, None], ang.sin()[None, :, None]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def rms(self, x, g):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * g
