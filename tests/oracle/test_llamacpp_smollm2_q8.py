# tier: slow
"""SmolLM2-135M calibrated inside llama.cpp at q8_0 (64 + 16 tokens, 2 threads, the
default hidden-size candidates): every width the tables cover - hidden sizes, each
attention's heads x head_dim, each FFN width - is a multiple of q8_0's block of 32 and the
tables say so (width_multiple 32); the held-out archs were served in llama.cpp. The cost
model then refuses an arch off the block (FFN 1000) naming the block, and prices the
parent. A q8_0 calibration of stories260K (FFN 172, no multiple of 32) fails naming the
width, and f16 of the same is accepted (no block)."""
import json, os, subprocess, sys, tempfile

AC = os.environ["AC_BIN"]
shared = os.environ["AC_SHARED"]
here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(os.path.dirname(here))
model = subprocess.run(["sh", os.path.join(repo, "scripts/fetch-models.sh")], capture_output=True, text=True,
                       check=True).stdout.strip()
stories = os.path.join(shared, "data", "models", "stories260K", "stories260K.bin")
TGT = ["--engine", "llama.cpp", "--engine-threads", "2", "--prompt", "64", "--output", "16"]


def ac(*args, ok=True):
    r = subprocess.run([AC, *args], capture_output=True, text=True)
    if ok and r.returncode != 0:
        sys.exit("FAIL: autocompress %s: rc=%d\n%s" % (" ".join(args), r.returncode, r.stderr[-3000:]))
    return r


with tempfile.TemporaryDirectory() as d:
    cal = json.loads(ac("calibrate", "--model", model, "--precision", "q8_0", *TGT, "--validate", "3",
                        "--data-dir", d, "--json").stdout)
    t = cal["tables"]
    assert t["width_multiple"] == 32, t.get("width_multiple")
    hd = t["shape"]["head_dim"]
    hidden = sorted({e["hidden_size"] for e in t["prefill"]})
    ffn = sorted({e["ffn_dim"] for e in t["prefill"] if e["part"] == "mlp"})
    heads = sorted({e["n_heads"] for e in t["prefill"] if e["part"] == "attention"})
    assert len(hidden) > 1 and all(h % 32 == 0 for h in hidden), hidden
    assert len(ffn) > 2 and all(f % 32 == 0 for f in ffn), ffn
    assert all(h * hd % 32 == 0 for h in heads), heads
    assert cal["target"]["precision"] == "q8_0" and cal["target"]["engine"] == "llama.cpp", cal["target"]
    v = cal["validation"]
    assert v["archs"] == 3 and "llama.cpp" in v["measured_memory"], v
    print("q8_0 grid: hidden %s, ffn %s, heads %s; held-out latency MAPE %.1f%%, memory MAPE %.1f%%"
          % (hidden, ffn, heads, v["latency_mape_pct"], v["memory_mape_pct"]))

    arch = json.loads(ac("inspect", model, "--json").stdout)
    arch = arch.get("arch", arch)
    est = json.loads(ac("estimate", "--model", model, "--precision", "q8_0", *TGT, "--data-dir", d, "--json").stdout)
    assert est["predicted"]["latency_ms"] > 0, est
    arch["layers"][3]["mlp"]["ffn_dim"] = 1000
    p = os.path.join(d, "off.json")
    json.dump(arch, open(p, "w"))
    r = ac("estimate", "--arch", p, "--precision", "q8_0", *TGT, "--data-dir", d, "--json", ok=False)
    assert r.returncode != 0 and "ffn_dim 1000 is not a multiple of 32" in r.stderr, (r.returncode, r.stderr)
    print("refused off-block arch:", r.stderr.strip().splitlines()[-1])

    r = ac("calibrate", "--model", stories, "--precision", "q8_0", *TGT, "--data-dir", d, "--json", ok=False)
    assert r.returncode != 0 and "not a multiple of 32" in r.stderr, (r.returncode, r.stderr)
    print("stories260K at q8_0:", r.stderr.strip().splitlines()[-1])
print("ok")
