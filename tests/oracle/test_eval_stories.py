"""End to end: `autocompress eval` on stories260K, 3 items of each of the eight benchmarks,
plus a user JSONL task and a malformed one, checked against an independent reference:
llama2.c's own tokenizer algorithm (run.c encode, reimplemented here) and a PyTorch
forward of the llama2.c checkpoint in its original layout (interleaved-pair RoPE). Every
request's log-likelihood and greedy flag must match; the JSON must hold every task with
n = 3, the malformed task must fail naming file, line and field, and the rest must run. A
task given by URL with its #sha256 is fetched and scored as the same file read locally."""
import json, math, os, struct, subprocess, sys, tempfile

import torch

ac_bin = os.environ["AC_BIN"]
shared = os.environ.get("AC_SHARED") or os.path.join(os.path.dirname(__file__), "../../../shared")
mdir = os.path.join(shared, "data/models/stories260K")
model = os.path.join(mdir, "stories260K.bin")
tmp = tempfile.mkdtemp()

good = os.path.join(tmp, "mine.jsonl")
with open(good, "w") as f:
    f.write(json.dumps({"context": "Once upon a time, there was a little", "choices": [" girl", " table"], "gold": 0}) + "\n")
    f.write(json.dumps({"context": "Lily liked to play in the", "choices": [" park", " math"], "gold": 0}) + "\n")
bad = os.path.join(tmp, "broken.jsonl")
with open(bad, "w") as f:
    f.write(json.dumps({"context": "a", "choices": [" b", " c"], "gold": 0}) + "\n")
    f.write(json.dumps({"context": "a", "choices": [" b", " c"], "gold": "1"}) + "\n")

tasks = "eight," + good + "," + bad
common = [ac_bin, "eval", model, "--tasks", tasks, "--limit", "3", "--seed", "1234", "--threads", "1",
          "--data", os.path.join(shared, "data")]
prompts, samples, out = (os.path.join(tmp, n) for n in ("p.jsonl", "s.jsonl", "r.json"))
proc = subprocess.run(common + ["--log-samples", samples, "--json", out], capture_output=True, text=True)
print(proc.stdout)
assert proc.returncode == 1, "a failed task must make the run exit 1"
assert "broken.jsonl:2: field 'gold'" in proc.stderr, proc.stderr
res = json.load(open(out))
eight = ["arc_easy", "arc_challenge", "piqa", "hellaswag", "winogrande", "boolq", "openbookqa", "lambada_openai"]
for t in eight + ["mine"]:
    r = res["tasks"][t]
    assert r["ok"] and r["n"] == (2 if t == "mine" else 3), r
    assert 0.0 <= r["acc"] <= 1.0 and r["truncated"] == 0
assert not res["tasks"]["broken"]["ok"]
assert "acc_norm" in res["tasks"]["hellaswag"] and "acc_norm" not in res["tasks"]["winogrande"]
assert res["perplexity"]["lambada_openai"] > 1.0
assert set(res["accuracy"]) == set(eight + ["mine"])

# ---- the reference: llama2.c tokenizer (run.c encode) ---------------------------------
with open(model, "rb") as f:
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("7i", f.read(28))
    shared_cls = vocab > 0
    vocab = abs(vocab)
    raw = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)

pieces, scores = [], []
with open(os.path.join(mdir, "tok512.bin"), "rb") as f:
    f.read(4)
    for _ in range(vocab):
        s, n = struct.unpack("fi", f.read(8))
        pieces.append(f.read(n))
        scores.append(s)
lookup = {}
for i, p in enumerate(pieces):
    lookup.setdefault(p, i)


def encode(text):
    if not text:
        return []
    ids = [lookup[b" "]]
    for ch in text:
        b = ch.encode("utf-8")
        ids += [lookup[b]] if b in lookup else [x + 3 for x in b]
    while True:
        best, bi, bid = -1e10, -1, -1
        for i in range(len(ids) - 1):
            j = lookup.get(pieces[ids[i]] + pieces[ids[i + 1]], -1)
            if j != -1 and scores[j] > best:
                best, bi, bid = scores[j], i, j
        if bi < 0:
            return ids
        ids[bi:bi + 2] = [bid]


# ---- the reference: llama2.c forward in PyTorch ---------------------------------------
hd = dim // n_heads
kvd = n_kv * hd
off = 0


def take(*shape):
    global off
    n = math.prod(shape)
    t = raw[off:off + n].reshape(shape)
    off += n
    return t


emb = take(vocab, dim)
rms_att = take(n_layers, dim)
wq = take(n_layers, dim, dim)
wk = take(n_layers, kvd, dim)
wv = take(n_layers, kvd, dim)
wo = take(n_layers, dim, dim)
rms_ffn = take(n_layers, dim)
w1 = take(n_layers, hidden, dim)
w2 = take(n_layers, dim, hidden)
w3 = take(n_layers, hidden, dim)
rms_final = take(dim)
wcls = emb


def rmsnorm(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * w


def rope(x, T):   # x [T, H, hd]; llama2.c rotates interleaved pairs (2i, 2i+1)
    freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * freq[None, :]
    c, s = torch.cos(ang).float()[:, None, :], torch.sin(ang).float()[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


@torch.no_grad()
def logprobs(tokens):
    T = len(tokens)
    x = emb[torch.tensor(tokens)]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for l in range(n_layers):
        h = rmsnorm(x, rms_att[l])
        q = rope((h @ wq[l].T).view(T, n_heads, hd), T)
        k = rope((h @ wk[l].T).view(T, n_kv, hd), T)
        v = (h @ wv[l].T).view(T, n_kv, hd)
        rep = n_heads // n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd) + mask
        o = torch.einsum("hts,shd->thd", att.softmax(-1), v).reshape(T, dim)
        x = x + o @ wo[l].T
        h = rmsnorm(x, rms_ffn[l])
        x = x + (torch.nn.functional.silu(h @ w1[l].T) * (h @ w3[l].T)) @ w2[l].T
    return torch.log_softmax((rmsnorm(x, rms_final) @ wcls.T).double(), -1)


def loglik(ctx, cont):
    if ctx == "":
        c, w = [1], encode(cont)
    else:
        n = len(ctx) - len(ctx.rstrip())
        if n:
            cont, ctx = ctx[-n:] + cont, ctx[:-n]
        c = encode(ctx)
        w = encode(ctx + cont)[len(c):]
        c = [1] + c   # the llama2.c tokenizer asks for BOS
    inp = (c + w)[:-1]
    lp = logprobs(inp)
    ll, greedy = 0.0, True
    for j, t in enumerate(w):
        p = len(inp) - len(w) + j
        ll += lp[p, t].item()
        greedy &= int(lp[p].argmax()) == t
    return ll, greedy


# ---- compare every request --------------------------------------------------------------
subprocess.check_call(common[:4] + ["eight"] + common[5:] + ["--dump-prompts", prompts])
P = [json.loads(l) for l in open(prompts)]
S = {(s["task"], s["line"]): s for s in map(json.loads, open(samples))}
assert len(P) == 24, len(P)
worst = 0.0
for p in P:
    s = S[(p["task"], p["line"])]
    assert len(s["ll"]) == len(p["requests"])
    for r, ol, og in zip(p["requests"], s["ll"], s["greedy"]):
        rl, rg = loglik(r["context"], r["continuation"])
        worst = max(worst, abs(rl - ol))
        assert abs(rl - ol) < 2e-3 + 1e-4 * abs(rl), f"{p['task']}:{p['line']}: ours {ol} reference {rl}"
        if p["task"] == "lambada_openai":
            assert rg == og
print(f"24 items, every request within {worst:.2e} nats of the PyTorch/llama2.c reference")

# ---- a task by URL (#sha256=): fetched, then scored as the same file read locally ------------
import hashlib, http.server, threading  # noqa: E402


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: Quiet(*a, directory=tmp))
threading.Thread(target=httpd.serve_forever, daemon=True).start()
sha = hashlib.sha256(open(good, "rb").read()).hexdigest()
url = "http://127.0.0.1:%d/mine.jsonl#sha256=%s" % (httpd.server_address[1], sha)
by_url = os.path.join(tmp, "url.json")
proc = subprocess.run(common[:4] + [url] + common[5:] + ["--json", by_url], capture_output=True, text=True)
assert proc.returncode == 0, proc.stderr
got = json.load(open(by_url))["tasks"]
assert list(got) == ["mine"] and got["mine"]["ok"] and got["mine"]["n"] == 2, got
assert got["mine"]["acc"] == res["tasks"]["mine"]["acc"], (got["mine"], res["tasks"]["mine"])
httpd.shutdown()
print("a task by URL: fetched, verified and scored as the local file")
print("PASS")
