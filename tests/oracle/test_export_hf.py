"""HF exports read by independent readers.

1. `autocompress export` of SmolLM2-135M (bf16, with --tar): the tar's members are the
   directory's files and match its SHA256SUMS; safetensors (PyPI) reads every tensor as
   BF16 with metadata format "pt"; `export --verify` passes, and fails after one flipped
   byte and after a truncation (digest on reload).
2. Uniform fp32 export loads with transformers AutoModelForCausalLM (LlamaForCausalLM)
   and gives the engine's logits (transformers 4.40.2 from $AC_CACHE/tf440, installed
   beside torch 1.13; without it this part is reported as not run).
3. Heterogeneous fp32 export (DeciLMForCausalLM): block_configs checked field by field
   against the Nemotron-NAS schema as its readers consume it (block_config.py dataclass
   fields of nvidia/Llama-3_1-Nemotron-51B-Instruct, vLLM nemotron_nas.py, llama.cpp
   conversion/deci.py), then a PyTorch forward written here from those readers' rules
   (kv heads = num_attention_heads // n_heads_in_group, intermediate size from ffn_mult
   rounded up to 256, no_op parts skipped with their norms) reproduces the engine's logits.
"""
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AC_BIN = os.environ.get("AC_BIN", os.path.join(ROOT, "build", "autocompress"))
TOOL = os.path.join(os.path.dirname(AC_BIN), "tools", "export_interop")
CACHE = os.environ.get("AC_CACHE", os.path.expanduser("~/.cache/autocompress"))
IDS = [504, 3458, 282, 4649, 314, 253, 1345, 30, 378, 1686, 28, 2020, 432, 6101, 198, 1, 17, 9, 4093, 2]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(cmd, expect=0):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != expect:
        print(r.stdout[-2000:], r.stderr[-2000:])
        raise SystemExit("FAIL: %s exited %d (expected %d)" % (" ".join(cmd[:3]), r.returncode, expect))
    return r


def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def layer(src, h, kv, f):
    return {"source_layer": src, "attention": {"n_heads": h, "n_kv_heads": kv} if h else None,
            "mlp": {"ffn_dim": f} if f else None}


# ---- schema of the readers (transcribed from their sources; see module docstring) ----
ATTN_FIELDS = {"no_op", "replace_with_linear", "sparsify", "n_heads_in_group", "window_length",
               "num_sink_tokens", "use_prefill_window_in_sink_attention", "unshifted_sink"}
FFN_FIELDS = {"no_op", "replace_with_linear", "sparsify", "ffn_mult"}


def ffn_mult_to_intermediate(m, n_embd):          # vLLM / llama.cpp _ffn_mult_to_intermediate_size
    n = int(2 * m * n_embd / 3)
    return n if n % 256 == 0 else n + 256 - n % 256


def check_decilm_config(cfg, arch):
    check(cfg["architectures"] == ["DeciLMForCausalLM"], "architectures == [DeciLMForCausalLM]")
    check(cfg["model_type"] == "nemotron-nas", "model_type nemotron-nas")
    check(cfg["num_hidden_layers"] == len(cfg["block_configs"]) == len(arch["layers"]),
          "num_hidden_layers == len(block_configs) == arch layers")
    H, C = cfg["num_attention_heads"], cfg["hidden_size"]
    check(C // H == arch["head_dim"], "hidden_size // num_attention_heads == head_dim (DeciLM derives it)")
    for k in ("rms_norm_eps", "rope_theta", "vocab_size", "max_position_embeddings", "tie_word_embeddings",
              "hidden_act"):
        check(k in cfg, "global field %s present" % k)
    ok_fields = ok_attn = ok_ffn = ok_cpp = True
    for i, (b, l) in enumerate(zip(cfg["block_configs"], arch["layers"])):
        at, ff = b["attention"], b["ffn"]
        ok_fields &= set(at) <= ATTN_FIELDS and set(ff) <= FFN_FIELDS and "n_heads_in_group" in at \
            and "replace_with_linear" in at and "ffn_mult" in ff and "no_op" in at and "no_op" in ff
        ok_fields &= not (at["no_op"] and at["replace_with_linear"]) and not (ff["no_op"] and ff["replace_with_linear"])
        # vLLM DeciLMDecoderLayer
        if l["attention"] is None:
            ok_attn &= at["no_op"] is True and at["n_heads_in_group"] is None
        else:
            ok_attn &= (not at["no_op"]) and l["attention"]["n_heads"] == H and \
                H // at["n_heads_in_group"] == l["attention"]["n_kv_heads"] and H % at["n_heads_in_group"] == 0
        if l["mlp"] is None:
            ok_ffn &= ff["no_op"] is True and ff["ffn_mult"] is None
        else:
            ok_ffn &= (not ff["no_op"]) and ffn_mult_to_intermediate(round(ff["ffn_mult"], 6), C) == l["mlp"]["ffn_dim"]
        # llama.cpp conversion/deci.py arrays
        nkv = 0 if at["n_heads_in_group"] is None else H // at["n_heads_in_group"]
        nh = 0 if at["n_heads_in_group"] is None else H
        nff = 0 if ff["ffn_mult"] is None else ffn_mult_to_intermediate(ff["ffn_mult"], C)
        exp = (l["attention"] or {}).get("n_heads", 0), (l["attention"] or {}).get("n_kv_heads", 0), \
            (l["mlp"] or {}).get("ffn_dim", 0)
        ok_cpp &= (nh, nkv, nff) == exp
    check(ok_fields, "every block: only block_config.py fields, n_heads_in_group/replace_with_linear/ffn_mult/no_op present")
    check(ok_attn, "vLLM: kv heads = num_attention_heads // n_heads_in_group, no_op where attention removed")
    check(ok_ffn, "vLLM: intermediate size from ffn_mult (round 6, up to 256) == arch ffn_dim, no_op where MLP removed")
    check(ok_cpp, "llama.cpp deci.py: per-layer head_count / head_count_kv / feed_forward_length == arch")


def decilm_forward(d, ids):
    """Forward of a DeciLM directory as vLLM's DeciLM layers compute it (fp64 for clarity)."""
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = {k: v.double() for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    H, C, eps, theta = cfg["num_attention_heads"], cfg["hidden_size"], cfg["rms_norm_eps"], cfg["rope_theta"]
    D = C // H
    T = len(ids)
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rms(v, g):
        return v / torch.sqrt((v * v).mean(-1, keepdim=True) + eps) * g

    def rope(q):
        q1, q2 = q[..., :D // 2], q[..., D // 2:]
        return q * cos + torch.cat([-q2, q1], -1) * sin

    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for i, b in enumerate(cfg["block_configs"]):
        p = "model.layers.%d." % i
        if not b["attention"]["no_op"]:
            kvh = H // b["attention"]["n_heads_in_group"]
            h = rms(x, w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(T, H, D).transpose(0, 1)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).view(T, kvh, D).transpose(0, 1)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, kvh, D).transpose(0, 1)
            q, k = rope(q), rope(k)
            k, v = k.repeat_interleave(H // kvh, 0), v.repeat_interleave(H // kvh, 0)
            a = torch.softmax(q @ k.transpose(1, 2) / D ** 0.5 + mask, -1) @ v
            x = x + a.transpose(0, 1).reshape(T, H * D) @ w[p + "self_attn.o_proj.weight"].T
        if not b["ffn"]["no_op"]:
            h = rms(x, w[p + "post_attention_layernorm.weight"])
            g = h @ w[p + "mlp.gate_proj.weight"].T
            u = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return (x @ head.T).numpy()


def main():
    out = subprocess.run(["sh", os.path.join(ROOT, "scripts", "fetch-models.sh")], capture_output=True, text=True)
    parent = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if not os.path.exists(parent):
        raise SystemExit("FAIL: cannot fetch SmolLM2: " + out.stderr[-500:])
    pa = json.loads(run([AC_BIN, "inspect", parent, "--json"]).stdout)
    with tempfile.TemporaryDirectory() as tmp:
        ids_file = os.path.join(tmp, "ids.txt")
        with open(ids_file, "w") as f:
            f.write(" ".join(map(str, IDS)))

        # 1. CLI export, tar, digests.
        d, t = os.path.join(tmp, "smol-bf16"), os.path.join(tmp, "smol-bf16.tar")
        man = json.loads(run([AC_BIN, "export", parent, "--out", d, "--tar", t]).stdout)
        check(man["class"] == "LlamaForCausalLM" and man["tokenizer"] is True, "CLI manifest: class and tokenizer")
        check(man["files"][0]["sha256"] == sha(t) and man["files"][0]["size"] == os.path.getsize(t),
              "CLI manifest: tar size and sha-256")
        sums = dict(reversed(l.split("  ")) for l in open(os.path.join(d, "SHA256SUMS")).read().splitlines())
        with tarfile.open(t) as tf:
            names = sorted(m.name for m in tf.getmembers() if m.isfile())
            same = all(hashlib.sha256(tf.extractfile("smol-bf16/" + n).read()).hexdigest() == sums[n]
                       for n in sums)
        check(names == sorted("smol-bf16/" + n for n in os.listdir(d)), "tar members == directory files")
        check(same, "tar member digests == SHA256SUMS")
        from safetensors import safe_open
        with safe_open(os.path.join(d, "model.safetensors"), "np") as sf:
            meta = sf.metadata()
            keys = list(sf.keys())
        hdr_len = int.from_bytes(open(os.path.join(d, "model.safetensors"), "rb").read(8), "little")
        hdr = json.loads(open(os.path.join(d, "model.safetensors"), "rb").read(8 + hdr_len)[8:])
        check(meta == {"format": "pt"} and all(hdr[k]["dtype"] == "BF16" for k in keys) and len(keys) == 2 + 9 * 30,
              "safetensors: %d tensors, all BF16, metadata format pt" % len(keys))
        tok_ok = os.path.exists(os.path.join(d, "tokenizer.json")) and os.path.exists(os.path.join(d, "tokenizer_config.json"))
        check(tok_ok, "tokenizer.json and tokenizer_config.json written from the GGUF parent")
        run([AC_BIN, "export", "--verify", d])
        st = os.path.join(d, "model.safetensors")
        with open(st, "r+b") as f:
            f.seek(4096)
            b = f.read(1)
            f.seek(4096)
            f.write(bytes([b[0] ^ 1]))
        r = run([AC_BIN, "export", "--verify", d], expect=1)
        check("mismatch" in r.stderr, "flipped byte detected on reload: " + r.stderr.strip()[:80])
        os.truncate(st, os.path.getsize(st) - 1000)
        r = run([AC_BIN, "export", "--verify", d], expect=1)
        check("mismatch" in r.stderr, "truncation detected on reload")

        # 2. Uniform fp32 export through transformers.
        u = os.path.join(tmp, "u32")
        uni = dict(pa, layers=[layer(i, 9, 3, 1536) for i in range(len(pa["layers"]))])
        json.dump(uni, open(os.path.join(tmp, "u.json"), "w"))
        run([TOOL, parent, "--arch", os.path.join(tmp, "u.json"), "--hf", u, "--logits", ids_file,
             os.path.join(tmp, "u.f32")])
        eng_u = np.fromfile(os.path.join(tmp, "u.f32"), dtype=np.float32).reshape(len(IDS), -1)
        tf_dir = os.path.join(CACHE, "tf440")
        if os.path.isdir(tf_dir):
            sys.path.insert(0, tf_dir)
        try:
            import transformers
            from transformers import AutoModelForCausalLM
            m = AutoModelForCausalLM.from_pretrained(u, torch_dtype=torch.float32)
            with torch.no_grad():
                lg = m(torch.tensor([IDS])).logits[0].float().numpy()
            diff = float(np.abs(lg - eng_u).max())
            print("transformers %s: %s, max |logit diff| vs engine = %.3g" % (transformers.__version__,
                                                                              type(m).__name__, diff))
            check(type(m).__name__ == "LlamaForCausalLM" and diff < 2e-3,
                  "transformers AutoModelForCausalLM loads the uniform export, logits match (fp32)")
            from transformers import AutoTokenizer
            tk = AutoTokenizer.from_pretrained(u)
            sample = "The 3 cats' owner wasn't home.\n<|im_start|>user"
            ucfg = json.load(open(os.path.join(u, "config.json")))
            check(tk(sample)["input_ids"] == tk.backend_tokenizer.encode(sample).ids and len(tk(sample)["input_ids"]) > 5
                  and tk.eos_token_id == ucfg["eos_token_id"] and tk.bos_token_id == ucfg["bos_token_id"],
                  "transformers AutoTokenizer loads the tokenizer files built from the GGUF parent")
        except ImportError as e:
            print("NOT RUN: transformers is not importable (%s); install it as bench/results/export_checks.md says" % e)

        # 3. Heterogeneous DeciLM export: schema, then a forward by the readers' rules.
        L = len(pa["layers"])
        het = []
        for i in range(L):
            if i == 20:
                continue                                   # layer removed
            # Prefix slicing keeps SmolLM2's 9/3 heads (a group cannot grow); per-layer KV
            # heads are covered by tests/unit/test_export_roundtrip.c on a random model.
            f = [1536, 1024, 768, 512, 256][i % 5]
            het.append(layer(i, 0 if i == 4 else 9, 0 if i == 4 else 3, 0 if i == 7 else f))
        het_a = dict(pa, layers=het)
        json.dump(het_a, open(os.path.join(tmp, "d.json"), "w"))
        dd = os.path.join(tmp, "deci32")
        r = run([TOOL, parent, "--arch", os.path.join(tmp, "d.json"), "--hf", dd, "--logits", ids_file,
                 os.path.join(tmp, "d.f32")])
        check("class=DeciLMForCausalLM" in r.stdout, "heterogeneous arch exported as DeciLMForCausalLM")
        cfg = json.load(open(os.path.join(dd, "config.json")))
        check_decilm_config(cfg, het_a)
        eng_d = np.fromfile(os.path.join(tmp, "d.f32"), dtype=np.float32).reshape(len(IDS), -1)
        ref = decilm_forward(dd, IDS)
        diff = float(np.abs(ref - eng_d).max())
        print("DeciLM reader-rules forward (PyTorch fp64) vs engine: max |logit diff| = %.3g" % diff)
        check(diff < 2e-3, "DeciLM export computes the engine's logits under the readers' rules")
        # The CLI keeps the spec's meaning of "hf": LlamaForCausalLM only, never a silent change.
        r = run([AC_BIN, "export", parent, "--arch", os.path.join(tmp, "d.json"), "--format", "hf",
                 "--out", os.path.join(tmp, "cli-het")], expect=1)
        check("uniform layers only" in r.stderr and not os.path.exists(os.path.join(tmp, "cli-het")),
              "CLI --format hf refuses a heterogeneous arch: " + r.stderr.strip()[:90])
        # Per-layer query heads are not expressible in DeciLM: refused, nothing written.
        bad = dict(pa, layers=[layer(0, 9, 3, 1536), layer(1, 6, 2, 1536)])
        json.dump(bad, open(os.path.join(tmp, "bad.json"), "w"))
        r = run([TOOL, parent, "--arch", os.path.join(tmp, "bad.json"), "--hf", os.path.join(tmp, "bad")], expect=3)
        check("query heads" in r.stdout and not os.path.exists(os.path.join(tmp, "bad")),
              "per-layer query heads refused for HF (DeciLM cannot state them)")
    if failures:
        print("FAIL:", "; ".join(failures))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
