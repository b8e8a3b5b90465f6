"""Oracle: the mixture-of-experts families against Hugging Face transformers 4.40.2. Tiny
random MixtralForCausalLM and Qwen2MoeForCausalLM models (the latter with a dense layer from
mlp_only_layers, a shared expert, and both settings of norm_topk_prob) are written by
transformers itself (save_pretrained, safetensors; Qwen2-MoE's dense layers come from
decoder_sparse_step, as 4.40.2 has no mlp_only_layers). Checks:
  - `inspect --json` reads the family, per-layer experts, top-k, widths and dense layers;
  - the engine's logits equal transformers' (fp32);
  - our HF export of the unpruned model loads back in transformers with the same logits,
    `autocompress export --format hf` writes the family's class and DeciLM is refused;
  - pruning experts uniformly (router rows sliced with them, top-k capped) gives the logits
    of a transformers model built with that many experts from the same sliced weights;
  - cutting every expert (and the shared expert) to its first units gives the logits of a
    transformers model of those intermediate sizes on the sliced weights;
  - pruning experts and their widths per layer writes block_configs (ffn.moe) and the export
    reloads in the engine with the same logits.
Runs under $AC_TF_PYTHON (scripts/pyenv.sh); re-executes itself there when started elsewhere."""
import json
import os
import subprocess
import sys
import tempfile

if __name__ == "__main__" and os.environ.get("AC_TF_PYTHON") and not os.environ.get("AC_TF_REEXEC"):
    os.environ["AC_TF_REEXEC"] = "1"   # venv pythons share one binary: compare environments, not paths
    os.execv(os.environ["AC_TF_PYTHON"], [os.environ["AC_TF_PYTHON"]] + sys.argv)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM  # noqa: E402

torch.set_num_threads(1)
AC = os.environ["AC_BIN"]
TOOL = os.path.join(os.path.dirname(AC), "tools", "export_interop")
IDS = [3, 17, 42, 5, 9, 61, 0, 33, 8, 27, 50, 12, 7, 44, 19, 2, 38, 60, 21, 14]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(args, expect=0):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != expect:
        raise AssertionError("%s -> %d (expected %d): %s" % (" ".join(args), r.returncode, expect, r.stderr[-2000:]))
    return r


def tf_logits(model):
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].float().numpy()


def engine_logits(path, tmp, tag, *extra):
    out = os.path.join(tmp, tag + ".f32")
    r = run([TOOL, path] + list(extra) + ["--logits", os.path.join(tmp, "ids.txt"), out])
    return np.fromfile(out, dtype=np.float32).reshape(len(IDS), -1), r


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-6))


def mixtral():
    cfg = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=24, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                        max_position_embeddings=128, rope_theta=10000.0, tie_word_embeddings=False)
    return cfg, MixtralForCausalLM


def qwen(norm):
    cfg = Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=40, moe_intermediate_size=16,
                         shared_expert_intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, num_experts=6, num_experts_per_tok=2, norm_topk_prob=norm,
                         decoder_sparse_step=2, max_position_embeddings=128, tie_word_embeddings=True)
    return cfg, Qwen2MoeForCausalLM


def make(tmp, tag, cfg, cls, seed):
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():   # transformers' init is tiny (std 0.02): widen it so routing and logits vary
        for p in model.parameters():
            p.mul_(10.0 if p.dim() > 1 else 1.0)
    d = os.path.join(tmp, tag)
    model.save_pretrained(d, safe_serialization=True)
    return model, d


def moe_layers(cfg, fam):
    out = []
    for l in range(cfg.num_hidden_layers):
        if fam == "qwen2_moe" and (l + 1) % cfg.decoder_sparse_step:
            out.append(("dense", cfg.intermediate_size))
        elif fam == "mixtral":
            out.append(("moe", cfg.num_local_experts, cfg.num_experts_per_tok, cfg.intermediate_size, 0, True))
        else:
            out.append(("moe", cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
                        cfg.shared_expert_intermediate_size, cfg.norm_topk_prob))
    return out


def check_inspect(d, cfg, fam, tag):
    a = json.loads(run([AC, "inspect", d, "--json"]).stdout)
    arch = a.get("arch", a)
    want = moe_layers(cfg, fam)
    got = []
    for ly in arch["layers"]:
        if ly.get("moe"):
            m = ly["moe"]
            got.append(("moe", m["n_experts"], m["top_k"], m["expert_ffn_dim"], m["shared_ffn_dim"],
                        m["norm_topk_prob"]))
        else:
            got.append(("dense", ly["mlp"]["ffn_dim"]))
    check(arch["family"] == fam and got == want, "%s: inspect reads family %s and layers %s" % (tag, fam, got))


def sliced_state(model, fam, keep):
    """The transformers state dict with experts keep[l] (a count: the first ones) per MoE layer."""
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    out = {}
    for k, v in sd.items():
        parts = k.split(".")
        if "experts" in parts:
            l, e = int(parts[2]), int(parts[parts.index("experts") + 1])
            if e >= keep[l]:
                continue
        if k.endswith("block_sparse_moe.gate.weight") or k.endswith("mlp.gate.weight"):
            v = v[:keep[int(parts[2])]]
        out[k] = v
    return out


def narrowed_state(model, fe, fs):
    """The transformers state dict with every expert's first fe units (gate/up rows, down
    columns) and the shared expert's first fs."""
    out = {}
    for k, v in model.state_dict().items():
        v = v.clone()
        w = fe if ".experts." in k else fs if ".shared_expert." in k else 0
        if w and any(k.endswith(x) for x in ("w1.weight", "w3.weight", "gate_proj.weight", "up_proj.weight")):
            v = v[:w]
        elif w and any(k.endswith(x) for x in ("w2.weight", "down_proj.weight")):
            v = v[:, :w]
        out[k] = v
    return out


def case(tmp, tag, cfg, cls, fam, seed):
    model, d = make(tmp, tag, cfg, cls, seed)
    check_inspect(d, cfg, fam, tag)
    ref = tf_logits(model)
    eng, _ = engine_logits(d, tmp, tag)
    e = rel(eng, ref)
    check(e < 1e-4, "%s: engine logits = transformers %s (rel err %.2e)" % (tag, transformers.__version__, e))

    exp_dir = os.path.join(tmp, tag + "-exp")
    _, r = engine_logits(d, tmp, tag + "-x", "--hf", exp_dir)
    back = cls.from_pretrained(exp_dir, torch_dtype=torch.float32).eval()
    e = rel(tf_logits(back), ref)
    check(type(back).__name__ == cls.__name__ and e < 1e-4,
          "%s: HF export loads in transformers as %s, logits equal (rel err %.2e)" % (tag, cls.__name__, e))

    # The CLI's export: "hf" is the family's class, DeciLM is refused
    cli = os.path.join(tmp, tag + "-cli")
    run([AC, "export", d, "--format", "hf", "--dtype", "fp32", "--out", cli])
    conf = json.load(open(os.path.join(cli, "config.json")))
    r = run([AC, "export", d, "--format", "deci", "--out", os.path.join(tmp, tag + "-deci")], expect=1)
    check(conf["architectures"] == [cls.__name__] and "DeciLM" in r.stderr,
          "%s: `export --format hf` writes %s, deci is refused (%s)" % (tag, conf["architectures"][0],
                                                                       r.stderr.strip()[:60]))

    # Uniform expert pruning: 3 of the experts per MoE layer, top-k kept at 2.
    L = cfg.num_hidden_layers
    layers = json.loads(run([AC, "inspect", d, "--json"]).stdout)
    arch = layers.get("arch", layers)
    n = 3
    for ly in arch["layers"]:
        if ly.get("moe"):
            ly["moe"]["n_experts"] = n
    ap = os.path.join(tmp, tag + "-u.json")
    json.dump(arch, open(ap, "w"))
    eng_u, _ = engine_logits(d, tmp, tag + "-u", "--arch", ap)
    ucfg = cls.config_class.from_dict(cfg.to_dict())
    setattr(ucfg, "num_local_experts" if fam == "mixtral" else "num_experts", n)
    um = cls(ucfg).eval()
    um.load_state_dict(sliced_state(model, fam, [n] * L))   # strict: every tensor, none left over
    e = rel(eng_u, tf_logits(um))
    check(e < 1e-4, "%s: %d experts kept per layer = transformers model of %d experts on the sliced weights "
          "(rel err %.2e)" % (tag, n, n, e))

    # Narrower experts (and shared expert): each keeps its first units, as transformers' model of
    # those intermediate sizes computes on the sliced weights.
    fe = (cfg.intermediate_size if fam == "mixtral" else cfg.moe_intermediate_size) // 2
    fs = getattr(cfg, "shared_expert_intermediate_size", 0) // 2
    for ly in arch["layers"]:
        if ly.get("moe"):
            ly["moe"].update(n_experts=cfg.num_local_experts if fam == "mixtral" else cfg.num_experts,
                             expert_ffn_dim=fe, shared_ffn_dim=fs)
    ap = os.path.join(tmp, tag + "-w.json")
    json.dump(arch, open(ap, "w"))
    eng_w, _ = engine_logits(d, tmp, tag + "-w", "--arch", ap)
    wcfg = cls.config_class.from_dict(cfg.to_dict())
    setattr(wcfg, "intermediate_size" if fam == "mixtral" else "moe_intermediate_size", fe)
    if fs:
        wcfg.shared_expert_intermediate_size = fs
    wm = cls(wcfg).eval()
    wm.load_state_dict(narrowed_state(model, fe, fs))
    e = rel(eng_w, tf_logits(wm))
    check(e < 1e-4, "%s: experts cut to %d units%s = transformers' model of that width on the sliced weights "
          "(rel err %.2e)" % (tag, fe, " and the shared expert to %d" % fs if fs else "", e))

    # Per-layer expert counts, top-k and widths: block_configs, reloaded by the engine.
    counts = [2, 3, 1, 2]
    widths = [fe, fe + 2, 2 * fe, fe]
    for ly, c, w in zip(arch["layers"], counts, widths):
        if ly.get("moe"):
            ly["moe"]["n_experts"] = c
            ly["moe"]["top_k"] = min(ly["moe"]["top_k"], c)
            ly["moe"]["expert_ffn_dim"] = w
    ap = os.path.join(tmp, tag + "-h.json")
    json.dump(arch, open(ap, "w"))
    het = os.path.join(tmp, tag + "-het")
    eng_h, r = engine_logits(d, tmp, tag + "-h", "--arch", ap, "--hf", het)
    conf = json.load(open(os.path.join(het, "config.json")))
    bc = conf.get("block_configs") or []
    got = [(b["ffn"].get("moe", {}).get("num_local_experts"), b["ffn"].get("moe", {}).get("expert_intermediate_dim"))
           for b in bc]
    want = [(c, w) if ly.get("moe") else (None, None) for ly, c, w in zip(arch["layers"], counts, widths)]
    check(conf["architectures"] == [cls.__name__] and got == want,
          "%s: per-layer experts and widths %s written as block_configs ffn.moe (%s)" % (tag, want, got))
    eng_b, _ = engine_logits(het, tmp, tag + "-hb")
    e = rel(eng_b, eng_h)
    check(e < 1e-6, "%s: the per-layer export reloads with the pruned model's logits (rel err %.2e)" % (tag, e))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "ids.txt"), "w") as f:
            f.write(" ".join(map(str, IDS)))
        cfg, cls = mixtral()
        case(tmp, "mixtral", cfg, cls, "mixtral", 1)
        for norm in (False, True):
            cfg, cls = qwen(norm)
            case(tmp, "qwen2moe-norm%d" % norm, cfg, cls, "qwen2_moe", 2 + norm)
    if failures:
        print("FAIL: %d checks failed" % len(failures))
        sys.exit(1)
    print("PASS: Mixtral and Qwen2-MoE match transformers %s" % transformers.__version__)


if __name__ == "__main__":
    main()
