"""PyTorch CPU (eager, fp32) timing of the distillation step bench/distill/distill_bench.c
times: teacher = SmolLM2-135M shape (hidden 576, 30 layers, 9/3 heads, head_dim 64, FFN
1536, vocab 49152, tied), student = hidden 512, FFN 1152; random weights; teacher forward
under no_grad, student forward, KL(teacher || student) at T=1, backward, global-norm clip
1.0, AdamW. Same threads (torch.set_num_threads). Prints one JSON line.
Usage: torch_step.py [--threads N] [--batch B] [--seq T] [--steps S]
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, C, H, KV, D, FF):
        super().__init__()
        self.H, self.KV, self.D = H, KV, D
        self.n1 = torch.nn.Parameter(torch.ones(C))
        self.n2 = torch.nn.Parameter(torch.ones(C))
        self.q = torch.nn.Linear(C, H * D, bias=False)
        self.k = torch.nn.Linear(C, KV * D, bias=False)
        self.v = torch.nn.Linear(C, KV * D, bias=False)
        self.o = torch.nn.Linear(H * D, C, bias=False)
        self.g = torch.nn.Linear(C, FF, bias=False)
        self.u = torch.nn.Linear(C, FF, bias=False)
        self.d = torch.nn.Linear(FF, C, bias=False)


def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


class Model(torch.nn.Module):
    def __init__(self, C, FF, V=49152, L=30, H=9, KV=3, D=64):
        super().__init__()
        self.emb = torch.nn.Embedding(V, C)
        self.blocks = torch.nn.ModuleList([Block(C, H, KV, D, FF) for _ in range(L)])
        self.norm = torch.nn.Parameter(torch.ones(C))
        self.H, self.KV, self.D = H, KV, D
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, tok):
        B, T = tok.shape
        D = self.D
        inv = 1.0 / (100000.0 ** (torch.arange(0, D, 2).float() / D))
        ang = torch.arange(T).float()[:, None] * inv[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1)
        sin = torch.cat([ang.sin(), ang.sin()], -1)
        rot = lambda x: x * cos + torch.cat([-x[..., D // 2:], x[..., : D // 2]], -1) * sin
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = self.emb(tok)
        for b in self.blocks:
            h = rms(x, b.n1)
            q = rot(b.q(h).view(B, T, self.H, D).transpose(1, 2))
            k = rot(b.k(h).view(B, T, self.KV, D).transpose(1, 2))
            v = b.v(h).view(B, T, self.KV, D).transpose(1, 2)
            rep = self.H // self.KV
            k = k.repeat_interleave(rep, 1)
            v = v.repeat_interleave(rep, 1)
            a = ((q @ k.transpose(-1, -2)) / D ** 0.5 + mask).softmax(-1) @ v
            x = x + b.o(a.transpose(1, 2).reshape(B, T, self.H * D))
            h = rms(x, b.n2)
            x = x + b.d(F.silu(b.g(h)) * b.u(h))
        return rms(x, self.norm) @ self.emb.weight.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    teacher, student = Model(576, 1536), Model(512, 1152)
    teacher.requires_grad_(False)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    tok = torch.randint(0, 49152, (a.batch, a.seq))
    times, loss = [], 0.0
    for s in range(a.steps + 1):
        t0 = time.perf_counter()
        with torch.no_grad():
            tl = teacher(tok).log_softmax(-1)
        sl = student(tok).log_softmax(-1)
        kl = (tl.exp() * (tl - sl)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        kl.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        loss = kl.item()
        if s > 0:
            times.append(dt)
    n = a.batch * a.seq
    print(json.dumps({"impl": "pytorch %s" % torch.__version__, "threads": a.threads, "batch": a.batch,
                      "seq": a.seq, "steps": a.steps, "best_step_s": min(times),
                      "mean_step_s": sum(times) / len(times), "tokens_per_s": n / min(times),
                      "mean_tokens_per_s": n * len(times) / sum(times), "loss": loss}))


if __name__ == "__main__":
    main()
