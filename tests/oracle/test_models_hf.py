"""Oracle: HF-format models end to end. For two tiny random models written here with the
reference `safetensors` library - a Llama (untied, BF16, sharded with an index, a
SentencePiece-style tokenizer.json: Prepend/Replace normalizer, byte fallback) and a
Qwen2 (q/k/v bias, tied, F32, byte-level tokenizer.json) - check that
  - our tokenizer.json loader encodes id-for-id like HF `tokenizers` and round-trips;
  - `inspect --json` gives the arch of config.json;
  - `perplexity --stride` equals a PyTorch forward written here (rotate_half RoPE, GQA,
    RMSNorm, SwiGLU) on the same weights, token for token (sliding windows).
Also: our own safetensors writer's output loads in the reference library."""
import json, math, os, subprocess, sys, tempfile

import numpy as np
import torch
from safetensors.torch import save_file, load_file
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, decoders, trainers, processors

AC = os.environ["AC_BIN"]
tool = os.path.join(os.path.dirname(AC), "tools", "ac_tokenize")
shared = os.environ["AC_SHARED"]
wiki = open(os.path.join(shared, "data/text/wikitext-2-raw/wiki.test.raw"), encoding="utf-8", newline="").read()
train_text = [wiki[i:i + 500] for i in range(0, 100000, 500)]
texts = ["Hello world, this is a test.", "  spaces  and\nnewlines\r\n", "emoji 🤗 and café, 日本",
         "numbers 1234567 and code: x = f(y) + 3;", wiki[200000:201500]]

def byte_level_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(train_text, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok

def spm_tokenizer(path):
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.train_from_iterator(train_text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
    j = json.loads(tok.to_str())
    v = j["model"]["vocab"]
    for b in range(256):
        v["<0x%02X>" % b] = len(v)
    j["model"]["byte_fallback"] = True
    j["decoder"] = {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                     {"type": "ByteFallback"}, {"type": "Fuse"},
                                                     {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [v["<s>"]], "tokens": ["<s>"]}}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    return Tokenizer.from_file(path)

def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

def forward(W, cfg, ids):
    C, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, eps, T = C // H, cfg["rms_norm_eps"], len(ids)
    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    rot = lambda x: torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)
    x = W["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"], eps)
        lin = lambda n, y: y @ W[p + n + ".weight"].T + (W[p + n + ".bias"] if p + n + ".bias" in W else 0)
        q = lin("self_attn.q_proj", h).view(T, H, D).transpose(0, 1)
        k = lin("self_attn.k_proj", h).view(T, KV, D).transpose(0, 1)
        v = lin("self_attn.v_proj", h).view(T, KV, D).transpose(0, 1)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        k, v = k.repeat_interleave(H // KV, 0), v.repeat_interleave(H // KV, 0)
        s = (q @ k.transpose(1, 2)) / math.sqrt(D) + torch.triu(torch.full((T, T), -1e30, dtype=x.dtype), 1)
        o = (s.softmax(-1) @ v).transpose(0, 1).reshape(T, H * D)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"], eps)
        g = h @ W[p + "mlp.gate_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.T

def sliding_nll(W, cfg, ids, ctx, stride):
    nll, n, prev = 0.0, 0, 0
    for b in range(0, len(ids) - 1, stride):
        e = min(b + ctx, len(ids))
        frm = max(prev, b + 1)
        lg = forward(W, cfg, ids[b:e]).log_softmax(-1)
        for p in range(frm, e):
            nll -= lg[p - 1 - b, ids[p]].item()
            n += 1
        prev = e
        if e == len(ids):
            break
    return nll / n, n

def run(name, cfg, tok, tokpath, dtype, shards, tmp):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    g = torch.Generator().manual_seed(7)
    C, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, KV, L = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    D = C // H
    r = lambda *s: (torch.randn(*s, generator=g) * 0.15).to(dtype)
    W = {"model.embed_tokens.weight": r(V, C), "model.norm.weight": 1 + r(C)}
    if not cfg["tie_word_embeddings"]:
        W["lm_head.weight"] = r(V, C)
    for l in range(L):
        p = f"model.layers.{l}."
        W.update({p + "input_layernorm.weight": 1 + r(C), p + "post_attention_layernorm.weight": 1 + r(C),
                  p + "self_attn.q_proj.weight": r(H * D, C), p + "self_attn.k_proj.weight": r(KV * D, C),
                  p + "self_attn.v_proj.weight": r(KV * D, C), p + "self_attn.o_proj.weight": r(C, H * D),
                  p + "mlp.gate_proj.weight": r(F, C), p + "mlp.up_proj.weight": r(F, C),
                  p + "mlp.down_proj.weight": r(C, F)})
        if cfg.get("model_type") == "qwen2":
            W.update({p + "self_attn.q_proj.bias": r(H * D), p + "self_attn.k_proj.bias": r(KV * D),
                      p + "self_attn.v_proj.bias": r(KV * D)})
    names = sorted(W)
    if shards == 1:
        save_file(W, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    else:
        wm = {}
        for s in range(shards):
            part = {k: W[k] for k in names[s::shards]}
            fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            save_file(part, os.path.join(d, fn), metadata={"format": "pt"})
            wm.update({k: fn for k in part})
        json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    os.replace(tokpath, os.path.join(d, "tokenizer.json"))
    tokpath = os.path.join(d, "tokenizer.json")
    # tokenizer: ids and round trips
    out = subprocess.run([tool, "hf", tokpath], input=json.dumps(texts), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for t, got in zip(texts, json.loads(out.stdout)):
        want = tok.encode(t, add_special_tokens=False).ids
        assert got["ids"] == want, (name, t[:60], got["ids"][:20], want[:20])
        assert got["decoded"] == t, (name, t[:60], got["decoded"][:60])
    # arch
    a = json.loads(subprocess.run([AC, "inspect", d, "--json"], capture_output=True, text=True, check=True).stdout)
    assert a["hidden_size"] == C and a["vocab_size"] == V and len(a["layers"]) == L, a
    assert a["layers"][0]["attention"] == {"n_heads": H, "n_kv_heads": KV} and a["layers"][0]["mlp"] == {"ffn_dim": F}
    assert a["tie_word_embeddings"] == cfg["tie_word_embeddings"] and a.get("attention_bias", False) == (cfg.get("model_type") == "qwen2")
    # perplexity against the PyTorch forward (fp64 on the stored weights)
    text = texts[-1]
    tp = os.path.join(tmp, name + ".txt")
    open(tp, "w", encoding="utf-8", newline="").write(text)
    res = json.loads(subprocess.run([AC, "perplexity", d, "--text", tp, "--ctx", "48", "--stride", "20", "--json",
                                     "--threads", "1"], capture_output=True, text=True, check=True).stdout)
    ids = tok.encode(text, add_special_tokens=True).ids
    W64 = {k: v.to(torch.float64) for k, v in W.items()}
    ref, n = sliding_nll(W64, cfg, ids, 48, 20)
    print(f"{name}: ours mean NLL {res['mean_nll']:.6f} over {res['tokens_scored']}, torch {ref:.6f} over {n}")
    assert res["tokens_scored"] == n and res["text_tokens"] == len(ids), (res, n, len(ids))
    assert abs(res["mean_nll"] - ref) < 2e-4 * max(1.0, abs(ref)), (res["mean_nll"], ref)
    # our writer, read back by the reference library: F32 exact, BF16/F16 as torch rounds
    for dt, tdt in (("F32", torch.float32), ("BF16", torch.bfloat16), ("F16", torch.float16)):
        outp = os.path.join(tmp, f"{name}.{dt}.safetensors")
        subprocess.run([os.path.join(os.path.dirname(tool), "ac_st_copy"), d, outp, dt], check=True)
        back = load_file(outp)
        assert sorted(back) == names, (sorted(back)[:3], names[:3])
        for k in names:
            assert back[k].dtype == tdt and back[k].shape == W[k].shape, (k, back[k].dtype, back[k].shape)
            assert torch.equal(back[k], W[k].to(torch.float32).to(tdt)), (dt, k)
    return d

with tempfile.TemporaryDirectory() as tmp:
    tp = os.path.join(tmp, "spm.json")
    spm = spm_tokenizer(tp)
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": spm.get_vocab_size(),
             "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    run("llama_bf16_sharded", llama, spm, tp, torch.bfloat16, 2, tmp)
    bl = byte_level_tokenizer()
    tp = os.path.join(tmp, "bl.json")
    bl.save(tp)
    qwen = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": bl.get_vocab_size(),
            "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 6,
            "num_key_value_heads": 2, "max_position_embeddings": 256, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True, "use_sliding_window": False, "torch_dtype": "float32"}
    run("qwen2_f32_tied", qwen, bl, tp, torch.float32, 1, tmp)
print("ok")
