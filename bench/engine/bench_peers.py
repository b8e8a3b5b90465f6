"""Peers for bench/engine: the same SmolLM2-135M shapes and workloads as engine_bench.c,
run in PyTorch eager (fp32, random weights, torch.set_num_threads(threads)) and, through the
llama.cpp hook below, in llama.cpp (llama-cpp-python) on a SmolLM2 GGUF.
Prints "name value unit" lines like engine_bench; rates use process CPU time (robust on a
shared machine for single-threaded runs), NAME_wall lines the wall clock.
Usage: bench_peers.py THREADS [--quick] [--llamacpp-only | --torch-only]."""
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

LAST_WALL = [0.0]


class Timer:
    """CPU and wall seconds of a block."""
    def __enter__(self):
        self.c0, self.w0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.cpu, self.wall = time.process_time() - self.c0, time.perf_counter() - self.w0

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 1
QUICK = "--quick" in sys.argv
torch.set_num_threads(THREADS)
torch.manual_seed(1)

V, C, L, HQ, HKV, D, FF = 49152, 576, 30, 9, 3, 64, 1536
THETA, EPS = 100000.0, 1e-5


def make_params():
    p = {"emb": torch.randn(V, C) * 0.02, "norm": torch.ones(C), "layers": []}
    for _ in range(L):
        p["layers"].append({
            "an": torch.ones(C), "fn": torch.ones(C),
            "wq": torch.randn(HQ * D, C) * 0.02, "wk": torch.randn(HKV * D, C) * 0.02,
            "wv": torch.randn(HKV * D, C) * 0.02, "wo": torch.randn(C, HQ * D) * 0.02,
            "wg": torch.randn(FF, C) * 0.02, "wu": torch.randn(FF, C) * 0.02, "wd": torch.randn(C, FF) * 0.02})
    return p


INV = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=torch.float32) / D))


def rope(x, pos):
    ang = pos[:, None].float() * INV[None, :]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def forward(p, tokens, cache=None, last_only=True):
    """tokens [B,T]; cache: list of (k, v) per layer [B,S,HKV,D] or None (no cache kept)."""
    B, T = tokens.shape
    past = cache[0][0].shape[1] if cache and cache[0] is not None else 0
    pos = torch.arange(past, past + T)
    x = p["emb"][tokens]
    new_cache = []
    for i, ly in enumerate(p["layers"]):
        h = rmsnorm(x, ly["an"])
        q = rope((h @ ly["wq"].T).view(B, T, HQ, D), pos)
        k = rope((h @ ly["wk"].T).view(B, T, HKV, D), pos)
        v = (h @ ly["wv"].T).view(B, T, HKV, D)
        if cache is not None and cache[i] is not None:
            k = torch.cat([cache[i][0], k], 1)
            v = torch.cat([cache[i][1], v], 1)
        new_cache.append((k, v))
        S = k.shape[1]
        kk = k.repeat_interleave(HQ // HKV, 2).transpose(1, 2)
        vv = v.repeat_interleave(HQ // HKV, 2).transpose(1, 2)
        s = (q.transpose(1, 2) @ kk.transpose(-1, -2)) / math.sqrt(D)
        if T > 1:
            mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
            s = s.masked_fill(~mask, float("-inf"))
        o = (s.softmax(-1) @ vv).transpose(1, 2).reshape(B, T, HQ * D)
        x = x + o @ ly["wo"].T
        h = rmsnorm(x, ly["fn"])
        x = x + (F.silu(h @ ly["wg"].T) * (h @ ly["wu"].T)) @ ly["wd"].T
    if last_only:
        x = x[:, -1:]
    return rmsnorm(x, p["norm"]) @ p["emb"].T, new_cache


def bench_prefill(p, B, T, reps):
    tok = torch.randint(0, V, (B, T))
    best = 1e30
    with torch.no_grad():
        for _ in range(reps):
            with Timer() as t:
                forward(p, tok)
            if t.cpu < best:
                best, LAST_WALL[0] = t.cpu, t.wall
    return B * T / best


def bench_decode(p, B, P, steps):
    tok = torch.randint(0, V, (B, P))
    with torch.no_grad():
        logits, cache = forward(p, tok, cache=[None] * L)
        with Timer() as t:
            for _ in range(steps):
                nxt = logits[:, -1].argmax(-1, keepdim=True)
                logits, cache = forward(p, nxt, cache=cache)
    LAST_WALL[0] = t.wall
    return B * steps / t.cpu


def bench_train(p, B, T, steps):
    params = [p["emb"], p["norm"]] + [t for ly in p["layers"] for t in ly.values()]
    for t in params:
        t.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    tok = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))
    best = 1e30
    for _ in range(steps):
        with Timer() as t:
            opt.zero_grad(set_to_none=False)
            logits, _ = forward(p, tok, last_only=False)
            loss = F.cross_entropy(logits.view(-1, V), tgt.view(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        if t.cpu < best:
            best, LAST_WALL[0] = t.cpu, t.wall
    for t in params:
        t.requires_grad_(False)
    return B * T / best


# ---- llama.cpp hook ------------------------------------------------------------------------
# llama.cpp runs a real SmolLM2-135M GGUF (same shapes as above). Default: the fp32
# dequantized GGUF in $AC_CACHE/models if present (same precision as our engine), else the
# Q4_1 one (marked, not comparable in precision). Override with AC_LLAMACPP_GGUF. When the
# formats engineer's GGUF loader lands, engine_bench can run the SAME weights; until then the
# engine uses random weights of the same shapes (speed does not depend on the values).
def llamacpp_bench(T, steps):
    cache = os.environ.get("AC_CACHE", os.path.expanduser("~/.cache/autocompress"))
    path = os.environ.get("AC_LLAMACPP_GGUF")
    if not path:
        for name in ("SmolLM2-135M-Instruct.F32-dequant.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"):
            cand = os.path.join(cache, "models", name)
            if os.path.exists(cand):
                path = cand
                break
    try:
        import llama_cpp
    except ImportError:
        print("llamacpp skipped (llama-cpp-python not installed)")
        return
    if not path or not os.path.exists(path):
        print("llamacpp skipped (no SmolLM2 GGUF; run scripts/fetch-models.sh)")
        return
    llm = llama_cpp.Llama(model_path=path, n_ctx=T + steps + 8, n_batch=T, n_threads=THREADS,
                          n_threads_batch=THREADS, verbose=False)
    toks = [(i * 7919 + 13) % V for i in range(T)]
    best = 1e30
    for _ in range(1 if QUICK else 2):
        llm.reset()
        with Timer() as t:
            llm.eval(toks)
        if t.cpu < best:
            best, wall = t.cpu, t.wall
    print("llamacpp_prefill_b1 %.1f tok/s (T=%d, %s)" % (T / best, T, os.path.basename(path)))
    print("llamacpp_prefill_b1_wall %.1f tok/s" % (T / wall))
    llm.reset()
    llm.eval(toks[:128])
    with Timer() as t:
        for s in range(steps):
            llm.eval([(s * 31 + 5) % V])
    print("llamacpp_decode_b1 %.2f tok/s (prompt 128, %d steps, %s)" % (steps / t.cpu, steps, os.path.basename(path)))
    print("llamacpp_decode_b1_wall %.2f tok/s" % (steps / t.wall))


def main():
    print("torch_threads %d" % torch.get_num_threads())
    T = 128 if QUICK else 512
    steps = 8 if QUICK else 32
    if "--llamacpp-only" not in sys.argv:
        p = make_params()
        bench_prefill(p, 1, 64, 1)
        def out(name, v, n_tok, note):
            print("torch_%s %.2f tok/s (%s)" % (name, v, note))
            print("torch_%s_wall %.2f tok/s" % (name, n_tok / LAST_WALL[0]))
            sys.stdout.flush()
        out("prefill_b1", bench_prefill(p, 1, T, 1 if QUICK else 2), T, "T=%d" % T)
        out("prefill_b8", bench_prefill(p, 8, T, 1), 8 * T, "T=%d" % T)
        out("decode_b1", bench_decode(p, 1, 128, steps), steps, "prompt 128, %d steps" % steps)
        out("decode_b8", bench_decode(p, 8, 128, steps), 8 * steps, "prompt 128, %d steps" % steps)
        TB, TT = (1, 64) if QUICK else (4, 256)
        out("train_step", bench_train(p, TB, TT, 1 if QUICK else 2), TB * TT, "B=%d T=%d, CE, fwd+bwd+AdamW" % (TB, TT))
    if "--torch-only" not in sys.argv:
        llamacpp_bench(T, steps)


if __name__ == "__main__":
    main()
