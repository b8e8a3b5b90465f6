"""Oracle: Mamba-2 checkpoints (family mamba2), read, pruned and written, in both layouts users
hold them in: transformers' Mamba2ForCausalLM (config.json of Mamba2Config, backbone.embeddings,
lm_head) and mamba_ssm's own (state-spaces/mamba2-*: d_model, n_layer, ssm_cfg {"layer":
"Mamba2"}, the vocabulary padded to pad_vocab_size_multiple, backbone.embedding, tied head).
Tiny random checkpoints; the reference is the float64 Mamba-2 of
tests/oracle/test_engine_oracle_hybrid.py (SSD quadratic form, gated norm per group as mamba_ssm
and llama.cpp run it). transformers 4.40.2 has no Mamba-2 class, so that reference stands in.
Checks:
  - `inspect --json` reads the family, the Mamba shape and (mamba_ssm) the padded vocabulary;
  - the engine's logits on each layout equal the reference's;
  - the HF export writes Mamba2ForCausalLM (expand * hidden = heads * head_dim) and reloads with
    identical logits; pruning to the parent's own arch is the identity;
  - pruning Mamba heads (the first of each group) equals the reference on weights sliced here by
    hand, and its export (num_heads 4, expand 0.5) reloads with the same logits;
  - what the engine cannot run is refused naming the field (Mamba-1, MLPs, attention layers,
    an expand that disagrees with the heads);
  - a job (`autocompress run`) under a parameter limit runs every stage and exports both formats;
  - calibration times the mixer per head count, an estimate prices the conv and SSM state,
    both methods search one head count for every layer, and the GGUF export is llama.cpp's
    mamba2 (tests/oracle/test_export_llamacpp_hybrid.py runs it).
Random weights: no quality claim. Run with $AC_PYTHON."""
import json
import os
import sys
import tarfile
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_models_hybrid_hf as hf  # noqa: E402

CFG = dict(hf.CFG, pattern="MMMM", MH=8, MP=4, S=6, G=2, K=4)
SSM = dict(hf.CFG, pattern="MMM", V=500, MH=8, MP=4, S=6, G=1, K=4)   # expand 1: 8 heads x 4 = hidden 32
check = hf.check


def hf_config(c):
    return {"architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "vocab_size": c["V"],
            "hidden_size": c["C"], "num_hidden_layers": len(c["pattern"]), "num_heads": c["MH"],
            "head_dim": c["MP"], "expand": c["MH"] * c["MP"] / c["C"], "state_size": c["S"], "n_groups": c["G"],
            "conv_kernel": c["K"], "layer_norm_epsilon": 1e-5, "use_bias": False, "use_conv_bias": True,
            "hidden_act": "silu", "rms_norm": True, "residual_in_fp32": True, "chunk_size": 256,
            "time_step_limit": [0.0, float("inf")], "tie_word_embeddings": False, "torch_dtype": "float32"}


def make_mamba2(d, c, seed=7, layout="hf"):
    """A Mamba-2 checkpoint: the hybrid writer's weights for an all-"M" pattern under this family's
    config (layout "hf"), or mamba_ssm's config and names with a padded, tied embedding ("ssm")."""
    W, _ = hf.make_checkpoint(d, c, seed=seed)
    if layout == "hf":
        conf = hf_config(c)
    else:
        pad = 16
        Vp = (c["V"] + pad - 1) // pad * pad
        g = torch.Generator().manual_seed(seed + 1)
        W["backbone.embeddings.weight"] = torch.randn(Vp, c["C"], generator=g).to(torch.float32).to(torch.float64)
        del W["lm_head.weight"]
        conf = {"d_model": c["C"], "d_intermediate": 0, "n_layer": len(c["pattern"]), "vocab_size": c["V"],
                "ssm_cfg": {"layer": "Mamba2", "d_state": c["S"], "d_conv": c["K"], "headdim": c["MP"],
                            "ngroups": c["G"], "expand": c["MH"] * c["MP"] // c["C"]},
                "attn_layer_idx": [], "attn_cfg": {}, "rms_norm": True, "residual_in_fp32": True,
                "fused_add_norm": True, "pad_vocab_size_multiple": pad, "tie_embeddings": True}
        names = {k: ("backbone.embedding.weight" if k == "backbone.embeddings.weight" else k) for k in W}
        hf.write_safetensors(os.path.join(d, "model.safetensors"), {names[k]: v for k, v in W.items()})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(conf, f)
    return W, conf


def ref_logits(c, W, tied=False, **kw):
    Wr = {k: (v[:, 0, :] if k.endswith("conv1d.weight") else v) for k, v in W.items()}
    if tied:
        Wr["lm_head.weight"] = Wr["backbone.embeddings.weight"]
    a = dict(hf.ref_arch(c, **kw), V=Wr["backbone.embeddings.weight"].shape[0])
    with torch.no_grad():
        return hf.hy.model_forward(a, Wr, torch.tensor([hf.IDS])).numpy()[0]


def check_refusals(tmp, d, conf, ssm_dir, ssm_conf):
    for tag, base, src, change, needle in (
            ("mamba1", ssm_conf, ssm_dir, {"ssm_cfg": {"d_state": 6}}, "Mamba-1"),
            ("mlp", ssm_conf, ssm_dir, {"d_intermediate": 64}, "d_intermediate"),
            ("attn", ssm_conf, ssm_dir, {"attn_layer_idx": [1]}, "attn_layer_idx"),
            ("expand", conf, d, {"expand": 2}, "expand"),
            ("norm", conf, d, {"rms_norm": False}, "rms_norm")):
        b = os.path.join(tmp, "bad-" + tag)
        os.makedirs(b)
        with open(os.path.join(b, "config.json"), "w") as f:
            json.dump(dict(base, **change), f)
        os.symlink(os.path.join(src, "model.safetensors"), os.path.join(b, "model.safetensors"))
        r = hf.run([hf.AC, "inspect", b], expect=1)
        check(needle in r.stderr, "refused, naming %s: %s" % (needle, r.stderr.strip()[-150:]))


def check_cost_model(tmp, d, cut):
    dd = os.path.join(tmp, "dd")
    cal = json.loads(hf.run([hf.AC, "calibrate", "--model", d, "--no-hidden", "--models", "1", "--reps", "1",
                             "--validate", "3", "--fit", "0", "--prompt", "8", "--output", "4", "--data-dir", dd,
                             "--json"]).stdout)
    mam = sorted(e["mamba"]["n_heads"] for e in cal["tables"]["prefill"] if e.get("mamba"))
    check(mam == [2, 4, 6, 8], "calibration times the Mamba mixer at 2, 4, 6 and 8 heads: %s" % mam)
    rows = cal["validation"]["rows"]
    check(len(rows) == 3 and all(all(l.get("mamba") for l in r["arch"]["layers"]) for r in rows),
          "held-out validation serves %d Mamba-2 archs (latency MAPE %.1f%%)" %
          (len(rows), cal["validation"]["latency_mape_pct"]))
    est = json.loads(hf.run([hf.AC, "estimate", "--arch", cut, "--data-dir", dd, "--prompt", "8", "--output", "4",
                             "--json"]).stdout)
    want = 4 * 4 * ((4 - 1) * (16 + 24) + 4 * 4 * 6)   # 4 layers x (conv history + SSM state) of 4 heads, fp32
    got = est["predicted"]["memory_bytes"]["request_cache"]
    check(got == want, "the request cache prices the conv and SSM states exactly (%d bytes, want %d)" % (got, want))
    par = json.loads(hf.run([hf.AC, "estimate", "--arch", os.path.join(d, "config.json"), "--data-dir", dd,
                             "--prompt", "8", "--output", "4", "--json"]).stdout)
    for method in ("autocompress", "minitron"):
        r = hf.run([hf.AC, "search", d, "--method", method, "--axes", "mamba_heads", "--params",
                    str(int(0.95 * par["params"])), "--calib", hf.TEXT, "--tokenizer", hf.TOK, "--search-tokens", "1024",
                    "--rank-tokens", "256", "--data-dir", dd, "--prompt", "8", "--output", "4", "--json"])
        got = json.loads(r.stdout)["arch"]
        mh = [l["mamba"]["n_heads"] for l in got["layers"]]
        check(got["family"] == "mamba2" and len(mh) == 4 and len(set(mh)) == 1 and mh[0] < 8 and mh[0] % 2 == 0,
              "%s: one Mamba head count for every layer meets 95%% of the parameters: %s" % (method, mh))


def run_job_checked(tmp, d):
    """A job on the Mamba-2 parent under 85% of its parameters: every stage runs, the limit holds as
    measured, and both exports come back (the HF one reloads as the report's arch)."""
    rep, jd = hf.run_job(d, tmp, "m2", 43000, ["hf", "gguf"])
    res = rep["result"]["arch"]
    lim = rep["limits"][0]
    tar = os.path.join(jd, "model-hf.tar")
    x = os.path.join(tmp, "m2-job-x")
    os.makedirs(x)
    with tarfile.open(tar) as t:
        t.extractall(x)
    back = json.loads(hf.run([hf.AC, "inspect", os.path.join(x, "model-hf"), "--json"]).stdout)
    gg = open(os.path.join(jd, "model.gguf"), "rb").read(4096)
    check(res["family"] == "mamba2" and lim["holds"] and lim["measured"] <= 43000 and
          [l["mamba"] for l in back["layers"]] == [l["mamba"] for l in res["layers"]] and b"mamba2" in gg,
          "a job under 43,000 parameters (of %d) succeeds: %d layers of %d heads, %d parameters measured; its HF "
          "export reloads as the report's arch, its GGUF is mamba2" % (
              rep["parent"]["params"], len(res["layers"]), res["layers"][0]["mamba"]["n_heads"], lim["measured"]))


def main():
    c = CFG
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "ids.txt"), "w") as f:
            f.write(" ".join(map(str, hf.IDS)))
        d = os.path.join(tmp, "parent")
        W, conf = make_mamba2(d, c)
        a = json.loads(hf.run([hf.AC, "inspect", d, "--json"]).stdout)
        check(a["family"] == "mamba2" and len(a["layers"]) == 4 and all(
            l["mamba"] == {"n_heads": 8, "head_dim": 4, "d_state": 6, "n_groups": 2, "conv_kernel": 4} and
            l["attention"] is None for l in a["layers"]), "inspect reads Mamba2ForCausalLM: 4 layers of 8 x 4 heads")
        eng, _ = hf.engine_logits(d, tmp, "parent")
        e = hf.rel(eng, ref_logits(c, W))
        check(e < 1e-4, "engine logits on the Mamba2ForCausalLM checkpoint = float64 reference (rel err %.2e)" % e)

        x = os.path.join(tmp, "export")
        hf.engine_logits(d, tmp, "x", "--hf", x)
        xc = json.load(open(os.path.join(x, "config.json")))
        back, _ = hf.engine_logits(x, tmp, "xb")
        check(xc["architectures"] == ["Mamba2ForCausalLM"] and xc["num_heads"] == 8 and
              xc["expand"] * xc["hidden_size"] == 32 and "mlp_bias" not in xc and np.array_equal(back, eng),
              "HF export: Mamba2ForCausalLM (expand %s, no attention fields), reloads with identical logits" %
              xc["expand"])

        ap = os.path.join(tmp, "same.json")
        with open(ap, "w") as f:
            json.dump(a, f)
        same, _ = hf.engine_logits(d, tmp, "same", "--arch", ap)
        check(np.array_equal(same, eng), "pruning to the parent's own arch is the identity (bit-identical logits)")

        cut = dict(a, layers=[dict(l, mamba=dict(l["mamba"], n_heads=4)) for l in a["layers"]])
        cp = os.path.join(tmp, "cut.json")
        with open(cp, "w") as f:
            json.dump(cut, f)
        px = os.path.join(tmp, "pruned-hf")
        pe, _ = hf.engine_logits(d, tmp, "cut", "--arch", cp, "--hf", px)
        e = hf.rel(pe, ref_logits(c, hf.sliced(c, W, 4, c["H"], c["F"]), mh=4))
        pc = json.load(open(os.path.join(px, "config.json")))
        pb, _ = hf.engine_logits(px, tmp, "cutb")
        check(e < 1e-4 and pc["num_heads"] == 4 and pc["expand"] == 0.5 and np.array_equal(pb, pe),
              "pruned to 4 heads (2 per group) = the reference on weights sliced by hand (rel err %.2e); its export "
              "(num_heads 4, expand %s) reloads with the same logits" % (e, pc["expand"]))

        sd = os.path.join(tmp, "mamba-ssm")
        Ws, sconf = make_mamba2(sd, SSM, seed=11, layout="ssm")
        sa = json.loads(hf.run([hf.AC, "inspect", sd, "--json"]).stdout)
        se, _ = hf.engine_logits(sd, tmp, "ssm")
        e = hf.rel(se, ref_logits(SSM, Ws, tied=True))
        check(sa["family"] == "mamba2" and sa["vocab_size"] == 512 and sa["tie_word_embeddings"] and
              sa["layers"][0]["mamba"]["n_heads"] == 8 and e < 1e-4,
              "mamba_ssm's layout (d_model, ssm_cfg, vocabulary 500 padded to 512, tied embedding.weight): "
              "logits = reference (rel err %.2e)" % e)

        run_job_checked(tmp, d)
        check_refusals(tmp, d, conf, sd, sconf)
        check_cost_model(tmp, d, cp)
        hf.run([hf.AC, "export", d, "--out", os.path.join(tmp, "x.gguf"), "--format", "gguf", "--dtype", "fp32",
                "--tokenizer", hf.TOK])
        gg = open(os.path.join(tmp, "x.gguf"), "rb").read(4096)
        check(gg[:4] == b"GGUF" and b"mamba2" in gg and b"ssm.group_count" in gg and b"feed_forward_length" not in gg,
              "GGUF export writes llama.cpp's mamba2 (ssm.* keys, no feed-forward keys)")
    if hf.failures:
        print("FAIL:\n  " + "\n  ".join(hf.failures))
        sys.exit(1)
    print("PASS: Mamba-2 read, pruned and written")


if __name__ == "__main__":
    main()
