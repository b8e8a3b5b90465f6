"""Oracle: Nemotron-H checkpoints in Hugging Face's layout, read, pruned and written. A tiny
random NemotronHForCausalLM ("M*M-M": Mamba-2, attention, Mamba-2, MLP, Mamba-2) is written here
as the Hub's checkpoints are: config.json by Python's json (hybrid_override_pattern, and
time_step_limit [0.0, Infinity], which is not JSON but is what NVIDIA publishes), safetensors
with backbone.* names and the conv1d weight as [conv_dim, 1, K]. The reference is the float64
Nemotron-H of tests/oracle/test_engine_oracle_hybrid.py (SSD quadratic form). transformers
4.40.2 has no Nemotron-H class, so that reference stands in for it. Checks:
  - `inspect --json` reads the pattern, the Mamba shape, heads and widths;
  - the engine's logits on the checkpoint equal the reference's;
  - our HF export writes NemotronHForCausalLM with the pattern and a [cd, 1, K] conv weight,
    and reloads with identical logits;
  - pruning to the parent's own arch is the identity (bit-identical logits);
  - pruning Mamba heads (the first of each group) equals the reference on weights sliced here
    by hand (z, x and dt rows of in_proj, x conv channels, dt_bias, A_log, D, gated-norm weight,
    out_proj columns; B and C whole), with attention heads and MLP units cut as well; its HF
    export reloads with the same logits;
  - ranking (prune with calibration text) keeps heads inside their groups: the ranked parent
    computes the parent's logits;
  - MoE layers: experts cut to fewer units each and the shared expert narrowed equal the
    reference on weights sliced by hand, and the ranking orders every expert's units;
  - LatentMoE (moe_latent_size, Nemotron 3 Super): read, equal to the reference, written, and
    pruned (experts; the hidden size through fc1/fc2_latent_proj, the latent experts whole; the
    latent itself: fc1's rows, the experts' up columns and down rows, fc2's columns);
  - configs the engine cannot run are refused naming the field (a bad moe_latent_size, a dt clamp);
    the GGUF export is llama.cpp's nemotron_h;
  - calibration times Mamba mixers per head count, held-out hybrids validate, an estimate
    prices the Mamba conv and SSM states in the request cache exactly, and both methods
    search one Mamba head count for every Mamba layer.
Random weights: no quality claim. Run with $AC_PYTHON."""
import json
import math
import os
import struct
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_engine_oracle_hybrid as hy  # noqa: E402

torch.set_default_dtype(torch.float64)
AC = os.environ["AC_BIN"]
TOOL = os.path.join(os.path.dirname(AC), "tools", "export_interop")
SHARED = os.environ.get("AC_SHARED", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared"))
# Under the sanitizers (make test-sanitize) a tiny model's timings are the instrumentation's:
# the checks that order two predicted latencies run in the plain pass only.
TIMED = os.environ.get("AC_SANITIZED") != "1"
TOK = os.path.join(SHARED, "data", "models", "stories260K", "tok512.bin")
TEXT = os.path.join(SHARED, "data", "text", "tinystories", "validation_100.txt")
IDS = [3, 17, 42, 5, 9, 61, 0, 33, 8, 27, 50, 12, 7, 44, 19, 2, 38, 60, 21, 14, 301, 77, 499]
CFG = dict(V=512, C=32, H=4, KV=2, D=8, F=40, MH=8, MP=4, S=6, G=2, K=4, pattern="M*M-M")
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


def run_job(model, tmp, tag, params, export):
    """A whole job without the server (`autocompress run`: rank, calibrate, search, prune, distill,
    evaluate, measure, export) under a parameter limit. Returns the report and its folder."""
    out = os.path.join(tmp, tag + "-job")
    spec = {"name": tag, "model": {"path": model, "tokenizer": TOK},
            "target": {"device": "cpu", "precision": "fp32",
                       "workload": {"batch_size": 1, "prompt_tokens": 32, "output_tokens": 8}},
            "constraints": {"params": params}, "budgets": {"search_tokens": 4096, "distill_tokens": 2048},
            "data": {"calibration": TEXT, "distillation": TEXT},
            "evaluation": {"tasks": ["arc_easy"], "limit": 8, "seed": 1234}, "export": export}
    sp = os.path.join(tmp, tag + "-spec.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    run([AC, "run", sp, "--out", out])
    return json.load(open(os.path.join(out, "report.json"))), out


def tar_config(tar):
    """The config.json inside an HF export's tarball, as text."""
    with tarfile.open(tar) as t:
        return next(t.extractfile(m).read() for m in t.getmembers() if m.name.endswith("/config.json"))


def write_safetensors(path, tensors):
    header, off, blobs = {}, 0, []
    for name, t in tensors.items():
        b = t.to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def layers_of(c, mh=None, heads=None, ffn=None, kv=None, experts=None, fe=None, fs=None):
    out = []
    for ch in c["pattern"]:
        if ch == "E":
            E = experts or c["E"]
            out.append((0, 0, 0, E, min(c["k"], E), fe or c["Fe"], fs or c["Fs"], 1, 0, 0, 0, 0, 0, 1, c["ng"], c["tg"],
                        c["scale"],
                        c.get("Lt", 0)))
        elif ch == "M":
            out.append((0, 0, 0, 0, 0, 0, 0, 0, mh or c["MH"], c["MP"], c["S"], c["G"], c["K"]))
        elif ch == "*":
            out.append((heads or c["H"], kv or c["KV"], 0))
        else:
            out.append((0, 0, ffn or c["F"]))
    return out


def ref_arch(c, **kw):
    return {"V": c["V"], "C": c["C"], "D": c["D"], "eps": 1e-5, "tied": 0, "family": "nemotron_h",
            "layers": layers_of(c, **kw)}


def make_checkpoint(d, c, seed=7):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, std=0.3):
        return torch.randn(*shape, generator=g) * std

    C, di, cd = c["C"], c["MH"] * c["MP"], c["MH"] * c["MP"] + 2 * c["G"] * c["S"]
    W = {"backbone.embeddings.weight": rnd(c["V"], C, std=1.0)}
    for l, ch in enumerate(c["pattern"]):
        p = "backbone.layers.%d." % l
        W[p + "norm.weight"] = 1 + rnd(C, std=0.1)
        if ch == "M":
            W[p + "mixer.in_proj.weight"] = rnd(di + cd + c["MH"], C)
            W[p + "mixer.conv1d.weight"] = rnd(cd, 1, c["K"], std=0.5)
            W[p + "mixer.conv1d.bias"] = rnd(cd, std=0.1)
            W[p + "mixer.dt_bias"] = rnd(c["MH"], std=0.5)
            W[p + "mixer.A_log"] = torch.log(torch.arange(1, c["MH"] + 1, dtype=torch.float64))
            W[p + "mixer.D"] = 1 + rnd(c["MH"], std=0.1)
            W[p + "mixer.norm.weight"] = 1 + rnd(di, std=0.1)
            W[p + "mixer.out_proj.weight"] = rnd(C, di)
        elif ch == "E":
            W[p + "mixer.gate.weight"] = rnd(c["E"], C, std=1.0)
            W[p + "mixer.gate.e_score_correction_bias"] = rnd(c["E"], std=0.3)
            io = c.get("Lt") or C   # LatentMoE: the experts in the latent
            if c.get("Lt"):
                W[p + "mixer.fc1_latent_proj.weight"] = rnd(io, C)
                W[p + "mixer.fc2_latent_proj.weight"] = rnd(C, io)
            for e in range(c["E"]):
                W[p + "mixer.experts.%d.up_proj.weight" % e] = rnd(c["Fe"], io)
                W[p + "mixer.experts.%d.down_proj.weight" % e] = rnd(io, c["Fe"])
            W[p + "mixer.shared_experts.up_proj.weight"] = rnd(c["Fs"], C)
            W[p + "mixer.shared_experts.down_proj.weight"] = rnd(C, c["Fs"])
        elif ch == "*":
            for n, rows in (("q", c["H"]), ("k", c["KV"]), ("v", c["KV"])):
                W[p + "mixer.%s_proj.weight" % n] = rnd(rows * c["D"], C)
            W[p + "mixer.o_proj.weight"] = rnd(C, c["H"] * c["D"])
        else:
            W[p + "mixer.up_proj.weight"] = rnd(c["F"], C)
            W[p + "mixer.down_proj.weight"] = rnd(C, c["F"])
    W["backbone.norm_f.weight"] = 1 + rnd(C, std=0.1)
    W["lm_head.weight"] = rnd(c["V"], C)
    W = {k: v.to(torch.float32).to(torch.float64) for k, v in W.items()}   # the values the file holds
    os.makedirs(d, exist_ok=True)
    conf = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": c["V"],
            "hidden_size": C, "intermediate_size": c["F"], "num_hidden_layers": len(c["pattern"]),
            "hybrid_override_pattern": c["pattern"], "num_attention_heads": c["H"],
            "num_key_value_heads": c["KV"], "head_dim": c["D"], "mamba_num_heads": c["MH"],
            "mamba_head_dim": c["MP"], "ssm_state_size": c["S"], "n_groups": c["G"], "conv_kernel": c["K"],
            "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False, "mlp_hidden_act": "relu2",
            "mamba_hidden_act": "silu", "use_bias": False, "use_conv_bias": True, "residual_in_fp32": False,
            "time_step_limit": [0.0, float("inf")], "time_step_min": 0.001, "chunk_size": 128,
            "torch_dtype": "float32"}
    if "E" in c["pattern"]:
        conf.update({"n_routed_experts": c["E"], "num_experts_per_tok": c["k"], "moe_intermediate_size": c["Fe"],
                     "moe_shared_expert_intermediate_size": c["Fs"], "n_shared_experts": 1, "n_group": c["ng"],
                     "topk_group": c["tg"], "routed_scaling_factor": c["scale"], "norm_topk_prob": True,
                     "moe_latent_size": c.get("Lt")})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(conf, f)   # writes Infinity, as the published configs carry it
    write_safetensors(os.path.join(d, "model.safetensors"), W)
    return W, conf


def ref_logits(c, W, **kw):
    Wr = {k: (v[:, 0, :] if k.endswith("conv1d.weight") else v) for k, v in W.items()}
    with torch.no_grad():
        return hy.model_forward(ref_arch(c, **kw), Wr, torch.tensor([IDS])).numpy()[0]


def engine_logits(path, tmp, tag, *extra):
    out = os.path.join(tmp, tag + ".f32")
    r = run([TOOL, path] + list(extra) + ["--logits", os.path.join(tmp, "ids.txt"), out])
    return np.fromfile(out, dtype=np.float32).reshape(len(IDS), -1), r


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-6))


def sliced(c, W, mh, heads, ffn):
    """The parent's weights cut by hand to mh Mamba heads (the first of each group), the first
    heads/KV groups of attention, the first ffn units."""
    P, G, S, H = c["MP"], c["G"], c["S"], c["MH"]
    di, GS = H * P, G * S
    keep = [g * (H // G) + j for g in range(G) for j in range(mh // G)]
    ch = [h * P + p for h in keep for p in range(P)]
    out = {}
    for k, v in W.items():
        if "mixer.in_proj" in k:
            rows = ch + [di + i for i in ch] + list(range(2 * di, 2 * di + 2 * GS)) + [2 * di + 2 * GS + h for h in keep]
            v = v[rows]
        elif "mixer.conv1d" in k:
            v = v[ch + list(range(di, di + 2 * GS))]
        elif k.endswith(("mixer.dt_bias", "mixer.A_log", "mixer.D")):
            v = v[keep]
        elif k.endswith("mixer.norm.weight"):
            v = v[ch]
        elif "mixer.out_proj" in k:
            v = v[:, ch]
        elif k.endswith("mixer.q_proj.weight"):   # the first KV group and its query heads
            v = v[:heads * c["D"]]
        elif k.endswith(("mixer.k_proj.weight", "mixer.v_proj.weight")):
            v = v[:c["D"]]
        elif k.endswith("mixer.o_proj.weight"):
            v = v[:, :heads * c["D"]]
        elif k.endswith("mixer.up_proj.weight"):
            v = v[:ffn]
        elif k.endswith("mixer.down_proj.weight"):
            v = v[:, :ffn]
        out[k] = v
    return out


def check_refusals(tmp, conf):
    for tag, change, needle in (("latent", {"hybrid_override_pattern": "M*E-M", "moe_latent_size": 2.5},
                                 "moe_latent_size"),
                                ("clamp", {"time_step_limit": [0.001, 0.1]}, "time_step_limit"),
                                ("act", {"mlp_hidden_act": "gelu"}, "mlp_hidden_act")):
        d = os.path.join(tmp, "bad-" + tag)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(dict(conf, **change), f)
        os.symlink(os.path.join(tmp, "parent", "model.safetensors"), os.path.join(d, "model.safetensors"))
        r = run([AC, "inspect", d], expect=1)
        check(needle in r.stderr, "refused, naming %s: %s" % (needle, r.stderr.strip()[-160:]))


MOE = dict(CFG, pattern="ME*E-", E=6, k=2, Fe=12, Fs=10, ng=1, tg=1, scale=2.5)


def sliced_experts(c, W, keep):
    """The parent's MoE layers cut by hand to experts `keep` (router rows and bias with them)."""
    out = dict(W)
    for l, ch in enumerate(c["pattern"]):
        if ch != "E":
            continue
        p = "backbone.layers.%d.mixer." % l
        out[p + "gate.weight"] = W[p + "gate.weight"][keep]
        out[p + "gate.e_score_correction_bias"] = W[p + "gate.e_score_correction_bias"][keep]
        for i, e in enumerate(keep):
            for w in ("up_proj", "down_proj"):
                out[p + "experts.%d.%s.weight" % (i, w)] = W[p + "experts.%d.%s.weight" % (e, w)]
        for e in range(len(keep), c["E"]):
            for w in ("up_proj", "down_proj"):
                out.pop(p + "experts.%d.%s.weight" % (e, w))
    return out


def sliced_units(c, W, fe, fs):
    """The parent's MoE layers cut by hand to each expert's first fe units and the shared
    expert's first fs (up_proj rows, down_proj columns)."""
    out = dict(W)
    for l, ch in enumerate(c["pattern"]):
        if ch != "E":
            continue
        p = "backbone.layers.%d.mixer." % l
        for e in range(c["E"]):
            out[p + "experts.%d.up_proj.weight" % e] = W[p + "experts.%d.up_proj.weight" % e][:fe]
            out[p + "experts.%d.down_proj.weight" % e] = W[p + "experts.%d.down_proj.weight" % e][:, :fe]
        out[p + "shared_experts.up_proj.weight"] = W[p + "shared_experts.up_proj.weight"][:fs]
        out[p + "shared_experts.down_proj.weight"] = W[p + "shared_experts.down_proj.weight"][:, :fs]
    return out


def check_moe(tmp):
    """Nemotron-H's MoE layers: sigmoid router with its correction bias, squared-ReLU experts,
    a shared expert, routed_scaling_factor; read, computed, written, pruned and ranked."""
    c = MOE
    d = os.path.join(tmp, "moe-parent")
    W, conf = make_checkpoint(d, c, seed=9)
    a = json.loads(run([AC, "inspect", d, "--json"]).stdout)
    mo = a["layers"][1]["moe"]
    check(mo["n_experts"] == 6 and mo["top_k"] == 2 and mo["shared_ffn_dim"] == 10 and
          mo["router"] == {"scores": "sigmoid", "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5},
          "inspect reads the MoE layers: 6 squared-ReLU experts, top 2, sigmoid router, scale 2.5: %s" % mo)
    ref = ref_logits(c, W)
    eng, _ = engine_logits(d, tmp, "moe")
    e = rel(eng, ref)
    check(e < 1e-4, "MoE checkpoint: engine logits = float64 reference (rel err %.2e)" % e)
    x = os.path.join(tmp, "moe-export")
    engine_logits(d, tmp, "moe-x", "--hf", x)
    xc = json.load(open(os.path.join(x, "config.json")))
    back, _ = engine_logits(x, tmp, "moe-xb")
    check(np.array_equal(back, eng) and xc["n_routed_experts"] == 6 and xc["routed_scaling_factor"] == 2.5 and
          xc["hybrid_override_pattern"] == "ME*E-", "the MoE model's HF export reloads with identical logits")
    cut = dict(a, layers=[dict(l) for l in a["layers"]])
    for l in cut["layers"]:
        if l.get("moe"):
            l["moe"] = dict(l["moe"], n_experts=4)
    cp = os.path.join(tmp, "moe-cut.json")
    with open(cp, "w") as f:
        json.dump(cut, f)
    pe, _ = engine_logits(d, tmp, "moe-cut", "--arch", cp)
    pr = ref_logits(c, sliced_experts(c, W, [0, 1, 2, 3]), experts=4)
    e = rel(pe, pr)
    check(e < 1e-4, "pruned to 4 of 6 experts (router rows and correction bias with them) = the reference on "
                    "weights sliced by hand (rel err %.2e)" % e)
    for l in cut["layers"]:
        if l.get("moe"):
            l["moe"] = dict(l["moe"], n_experts=6, expert_ffn_dim=7, shared_ffn_dim=6)
    with open(cp, "w") as f:
        json.dump(cut, f)
    x = os.path.join(tmp, "moe-narrow")
    pe, _ = engine_logits(d, tmp, "moe-narrow", "--arch", cp, "--hf", x)
    e = rel(pe, ref_logits(c, sliced_units(c, W, 7, 6), fe=7, fs=6))
    xc = json.load(open(os.path.join(x, "config.json")))
    back, _ = engine_logits(x, tmp, "moe-narrow-b")
    check(e < 1e-4 and xc["moe_intermediate_size"] == 7 and xc["moe_shared_expert_intermediate_size"] == 6 and
          np.array_equal(back, pe), "experts cut to 7 of 12 units and the shared expert to 6 of 10 = the reference "
          "on weights sliced by hand (rel err %.2e); its HF export reloads with identical logits" % e)
    ap = os.path.join(tmp, "moe-same.json")
    with open(ap, "w") as f:
        json.dump(a, f)
    rk = os.path.join(tmp, "moe-ranked")
    run([AC, "prune", d, "--arch", ap, "--out", rk, "--tokenizer", TOK, "--calib", TEXT, "--calib-tokens", "512",
         "--layer-tokens", "0", "--batch", "2", "--seq", "64", "--no-reconstruct"])
    ranked, _ = engine_logits(rk, tmp, "moe-ranked")
    e = rel(ranked, eng)
    check(e < 1e-5, "experts ranked in place (routed output mass) keep the parent's logits (rel err %.2e)" % e)
    units = json.load(open(os.path.join(rk, "ranking.json")))["layers"][1]["experts"]
    check(len(units["units"]) == 6 and sorted(units["units"][0]["perm"]) == list(range(12)) and
          sorted(units["shared"]["perm"]) == list(range(10)),
          "the ranking orders each expert's 12 units and the shared expert's 10")
    check_grouped(tmp, dict(c, E=12, ng=3, tg=2))


def check_grouped(tmp, c):
    """Grouped routing (12 experts in 3 groups, the best 2 groups kept): ranking sorts experts
    inside their groups, pruning keeps as many in each."""
    g = os.path.join(tmp, "moe-grouped")
    W, _ = make_checkpoint(g, c, seed=9)
    a = json.loads(run([AC, "inspect", g, "--json"]).stdout)
    eng, _ = engine_logits(g, tmp, "grouped")

    def cut_to(n, tag):
        b = dict(a, layers=[dict(l, moe=dict(l["moe"], n_experts=n)) if l.get("moe") else l for l in a["layers"]])
        p = os.path.join(tmp, tag + ".json")
        with open(p, "w") as f:
            json.dump(b, f)
        return p
    pe, _ = engine_logits(g, tmp, "grouped-6", "--arch", cut_to(6, "grouped-6"))
    e = rel(pe, ref_logits(c, sliced_experts(c, W, [0, 1, 4, 5, 8, 9]), experts=6))
    check(e < 1e-4, "grouped routing cut to 6 of 12 experts, the first 2 of each of the 3 groups (router rows and "
                    "bias with them) = the reference on weights sliced by hand (rel err %.2e)" % e)
    for n, needle in ((4, "n_group"), (3, "two at least")):
        r = run([TOOL, g, "--arch", cut_to(n, "grouped-%d" % n), "--logits", os.path.join(tmp, "ids.txt"),
                 os.path.join(tmp, "g.f32")], expect=1)
        check(needle in r.stderr, "%d experts in 3 groups refused: %s" % (n, r.stderr.strip()[-120:]))
    ap = os.path.join(tmp, "grouped-same.json")
    with open(ap, "w") as f:
        json.dump(a, f)
    rk = os.path.join(tmp, "grouped-ranked")
    run([AC, "prune", g, "--arch", ap, "--out", rk, "--tokenizer", TOK, "--calib", TEXT, "--calib-tokens", "512",
         "--layer-tokens", "0", "--batch", "2", "--seq", "64", "--no-reconstruct"])
    perm = json.load(open(os.path.join(rk, "ranking.json")))["layers"][1]["experts"]["score_perm"]["perm"]
    ranked, _ = engine_logits(rk, tmp, "grouped-ranked")
    e = rel(ranked, eng)
    check(e < 1e-5 and all(p // 4 == i // 4 for i, p in enumerate(perm)),
          "ranked in place, experts sorted inside their routing groups (%s), the parent's logits (rel err %.2e; "
          "sorting across groups changed them by 1.3)" % (perm, e))
    dd = os.path.join(tmp, "dd-grouped")
    cal = json.loads(run([AC, "calibrate", "--model", g, "--no-hidden", "--models", "1", "--reps", "1", "--validate",
                          "2", "--fit", "0", "--prompt", "8", "--output", "4", "--data-dir", dd, "--json"]).stdout)
    moe = [x["moe"] for x in cal["tables"]["prefill"] if x.get("moe")]
    counts = sorted(m["n_experts"] for m in moe if m["expert_ffn_dim"] == c["Fe"] and m["shared_ffn_dim"] == c["Fs"])
    narrow = sorted({m["expert_ffn_dim"] for m in moe} - {c["Fe"]})
    shared = sorted((m["shared_ffn_dim"], m["n_experts"], m["expert_ffn_dim"]) for m in moe
                    if m["shared_ffn_dim"] != c["Fs"])
    want = sorted({c["Fs"] * k // 4 for k in (1, 2, 3)} - {0, c["Fs"]})
    check(counts == [6, 9, 12] and narrow == [3, 6, 9] and all(m["n_experts"] in (6, 9, 12) for m in moe) and
          shared == [(w, 12, c["Fe"]) for w in want],
          "calibration times 6, 9 and 12 experts (multiples of the 3 groups, two at least in each): %s, narrower "
          "experts of %s units, and the 12 experts beside a shared expert of %s units (the parent's %d)" % (
              counts, narrow, [x[0] for x in shared], c["Fs"]))
    par = json.loads(run([AC, "estimate", "--arch", os.path.join(g, "config.json"), "--data-dir", dd, "--prompt", "8",
                          "--output", "4", "--json"]).stdout)["params"]
    for method in ("autocompress", "minitron"):
        r = run([AC, "search", g, "--method", method, "--axes", "experts", "--params", str(int(0.9 * par)), "--calib",
                 TEXT, "--tokenizer", TOK, "--search-tokens", "1024", "--rank-tokens", "256", "--data-dir", dd,
                 "--prompt", "8", "--output", "4", "--json"])
        res = json.loads(r.stdout)["arch"]
        got = [l["moe"]["n_experts"] for l in res["layers"] if l.get("moe")]
        check(len(got) == 2 and all(n in (6, 9) for n in got) and (method == "autocompress" or len(set(got)) == 1),
              "%s under 90%% of the parameters: expert counts %s, as many in each group" % (method, got))
        if method == "autocompress" and len(set(got)) == 2:   # per-layer counts: NemotronH's block_configs
            rp, x = os.path.join(tmp, "grouped-dnas.json"), os.path.join(tmp, "grouped-dnas-hf")
            with open(rp, "w") as f:
                json.dump(res, f)
            pe, _ = engine_logits(g, tmp, "grouped-dnas", "--arch", rp, "--hf", x)
            xc = json.load(open(os.path.join(x, "config.json")))
            back, _ = engine_logits(x, tmp, "grouped-dnas-b")
            bl = [b["ffn"]["moe"]["num_local_experts"] for b in xc.get("block_configs", []) if b.get("ffn")]
            check(bl == got and np.array_equal(back, pe), "the per-layer expert counts go out as NemotronH "
                  "block_configs %s and reload with the same logits" % bl)


def hidden_cut(c, W, h):
    """The parent's weights cut by hand to the first h hidden channels (every tensor reading or
    writing the residual stream; a LatentMoE's experts keep their latent). The residual
    stream's norms keep the parent's scale: their gains times sqrt(C / h)."""
    C, out = c["C"], {}
    for k, v in W.items():
        if k.endswith(("norm.weight", "norm_f.weight")) and "mixer." not in k:
            v = v[:h] * math.sqrt(C / h)
        elif k.endswith(("embeddings.weight", "lm_head.weight", "in_proj.weight", "gate.weight", "fc1_latent_proj.weight",
                         "q_proj.weight", "k_proj.weight", "v_proj.weight")) or \
                (k.endswith("up_proj.weight") and ".experts." not in k):
            v = v[:, :h]
        elif k.endswith(("out_proj.weight", "fc2_latent_proj.weight", "o_proj.weight")) or \
                (k.endswith("down_proj.weight") and ".experts." not in k):
            v = v[:h]
        elif ".experts." in k and not c.get("Lt"):
            v = v[:, :h] if k.endswith("up_proj.weight") else v[:h]
        out[k] = v
    assert out["backbone.embeddings.weight"].shape[1] == h and C > h
    return out


def latent_cut(W, k):
    """A LatentMoE's weights cut by hand to the first k latent channels: fc1_latent_proj's rows,
    every expert's up_proj columns and down_proj rows, fc2_latent_proj's columns."""
    out = {}
    for n, v in W.items():
        if n.endswith("fc1_latent_proj.weight"):
            v = v[:k]
        elif n.endswith("fc2_latent_proj.weight"):
            v = v[:, :k]
        elif ".mixer.experts." in n:
            v = v[:, :k] if n.endswith("up_proj.weight") else v[:k]
        out[n] = v
    return out


def cut_export(d, tmp, a, tag, moe, **top):
    """The engine's logits of checkpoint d pruned to arch a with every MoE layer's fields moe and
    the top-level fields top changed, exported to HF; the export's logits; its folder."""
    cut = dict(a, layers=[dict(l) for l in a["layers"]], **top)
    for l in cut["layers"]:
        if l.get("moe"):
            l["moe"] = dict(l["moe"], **moe)
    cp, px = os.path.join(tmp, tag + ".json"), os.path.join(tmp, tag + "-hf")
    with open(cp, "w") as f:
        json.dump(cut, f)
    pe, _ = engine_logits(d, tmp, tag, "--arch", cp, "--hf", px)
    pb, _ = engine_logits(px, tmp, tag + "-b")
    return pe, pb, px


def check_latent(tmp):
    """LatentMoE (Nemotron 3 Super): the experts in a latent of 12, fc1/fc2_latent_proj around them;
    read, computed, written, pruned (experts; the hidden size, which the latent keeps; the latent);
    the calibration prices narrower latents and both methods search one latent for the model."""
    c = dict(MOE, Lt=12)
    d = os.path.join(tmp, "latent-parent")
    W, conf = make_checkpoint(d, c, seed=13)
    a = json.loads(run([AC, "inspect", d, "--json"]).stdout)
    check(a["layers"][1]["moe"].get("latent_dim") == 12, "inspect reads moe_latent_size 12: %s" % a["layers"][1]["moe"])
    eng, _ = engine_logits(d, tmp, "latent")
    e = rel(eng, ref_logits(c, W))
    check(e < 1e-4, "LatentMoE checkpoint: engine logits = float64 reference (rel err %.2e)" % e)
    x = os.path.join(tmp, "latent-export")
    engine_logits(d, tmp, "latent-x", "--hf", x)
    back, _ = engine_logits(x, tmp, "latent-xb")
    check(np.array_equal(back, eng) and json.load(open(os.path.join(x, "config.json")))["moe_latent_size"] == 12,
          "the LatentMoE model's HF export (moe_latent_size 12) reloads with identical logits")
    pe, pb, px = cut_export(d, tmp, a, "latent-cut", {"n_experts": 4}, hidden_size=24)
    e = rel(pe, ref_logits(dict(c, C=24), hidden_cut(c, sliced_experts(c, W, [0, 1, 2, 3]), 24), experts=4))
    check(e < 1e-4 and np.array_equal(pb, pe),
          "hidden 32 -> 24 (fc1 columns and fc2 rows cut, the latent experts whole) and 4 of 6 experts = the reference "
          "on weights sliced by hand (rel err %.2e); the export reloads with the same logits" % e)
    pe, pb, px = cut_export(d, tmp, a, "latent-narrow", {"latent_dim": 8})
    e = rel(pe, ref_logits(dict(c, Lt=8), latent_cut(W, 8)))
    check(e < 1e-4 and np.array_equal(pb, pe) and json.load(open(os.path.join(px, "config.json")))["moe_latent_size"] == 8,
          "latent 12 -> 8 (fc1 rows, the experts' up_proj columns and down_proj rows, fc2 columns cut) = the reference "
          "on weights sliced by hand (rel err %.2e); its HF export (moe_latent_size 8) reloads with the same logits" % e)
    dd = os.path.join(tmp, "latent-dd")
    cal = json.loads(run([AC, "calibrate", "--model", d, "--no-hidden", "--models", "1", "--reps", "1", "--validate",
                          "2", "--fit", "0", "--prompt", "8", "--output", "4", "--data-dir", dd, "--json"]).stdout)
    lts = sorted({e["moe"]["latent_dim"] for e in cal["tables"]["prefill"] if e.get("moe", {}).get("latent_dim")})
    check(lts == [3, 6, 9, 12], "calibration times the MoE at latents 3, 6, 9 and 12: %s" % lts)
    est = [json.loads(run([AC, "estimate", "--arch", x, "--data-dir", dd, "--prompt", "8", "--output", "4",
                           "--json"]).stdout) for x in (os.path.join(d, "config.json"), os.path.join(px, "config.json"))]
    limit = (est[0]["params"] + est[1]["params"]) // 2   # half the parameters the latent of 8 saves
    check(est[1]["predicted"]["latency_ms"] > 0 and est[1]["params"] < est[0]["params"],
          "the latent of 8 (between two priced latents) is priced: %.4f ms (the parent %.4f ms), %d parameters "
          "(the parent %d)" % (est[1]["predicted"]["latency_ms"], est[0]["predicted"]["latency_ms"], est[1]["params"],
                                est[0]["params"]))
    for method in ("autocompress", "minitron"):
        r = run([AC, "search", d, "--method", method, "--axes", "latent_widths", "--params", str(limit), "--calib", TEXT,
                 "--tokenizer", TOK, "--search-tokens", "1024", "--rank-tokens", "256", "--data-dir", dd, "--prompt",
                 "8", "--output", "4", "--json"])
        got = json.loads(r.stdout)["arch"]["layers"]
        lt = [l["moe"]["latent_dim"] for l in got if l.get("moe")]
        check(len(lt) == 2 and len(set(lt)) == 1 and lt[0] in (3, 6, 9) and len(got) == 5,
              "%s: the latent axis alone meets the parameter limit with one latent for the model: %s" % (method, lt))


def check_cost_model(tmp, d, cut):
    """Calibration times Mamba mixers per head count; estimates price pruned hybrids; both
    methods search the global Mamba head count."""
    dd = os.path.join(tmp, "dd")
    cal = json.loads(run([AC, "calibrate", "--model", d, "--no-hidden", "--models", "1", "--reps", "1", "--validate",
                          "3", "--fit", "0", "--prompt", "8", "--output", "4", "--data-dir", dd, "--json"]).stdout)
    mam = sorted(e["mamba"]["n_heads"] for e in cal["tables"]["prefill"] if e.get("mamba"))
    check(mam == [2, 4, 6, 8] and all(e["mamba"]["n_groups"] == 2 for e in cal["tables"]["prefill"] if e.get("mamba")),
          "calibration times the Mamba mixer at 2, 4, 6 and 8 heads (multiples of the 2 groups): %s" % mam)
    rows = cal["validation"]["rows"]
    check(len(rows) == 3 and any(l.get("mamba") and l["mamba"]["n_heads"] < 8 for r in rows for l in r["arch"]["layers"]),
          "held-out validation serves %d hybrid archs with pruned Mamba heads (latency MAPE %.1f%%)" %
          (len(rows), cal["validation"]["latency_mape_pct"]))
    st = [r for r in rows if r["predicted_memory_items"]["memory_bytes"]["request_cache"] > 0]
    exact = True   # the engine's own bytes: weights + cache + workspace, as measured (attention's tiles included)
    for r in rows:
        it = r["predicted_memory_items"]["memory_bytes"]
        pb, mb_ = it["weights"] + it["request_cache"] + it["prefill_workspace"], r["measured_backend_peak_bytes"]
        attn = any(l.get("attention") for l in r["arch"]["layers"])
        exact &= pb == mb_ if attn else pb >= mb_   # Mamba-only: the tiles priced, on the safe side
    check(exact, "held-out hybrids: predicted backend bytes equal the engine's measured peak (>= where no attention is left)")
    est = json.loads(run([AC, "estimate", "--arch", cut, "--data-dir", dd, "--prompt", "8", "--output", "4",
                          "--json"]).stdout)
    mb = est["predicted"]["memory_bytes"]
    # the cut arch's cache: attention 2*1*8*(8+4) + Mamba layers 3 * ((4-1)*(16+24) + 4*4*6) elements, fp32
    want = 4 * (2 * 1 * 8 * 12 + 3 * (3 * 40 + 4 * 4 * 6))
    check(mb["request_cache"] == want and len(st) == len(rows),
          "the request cache prices the Mamba conv and SSM states exactly (%d bytes)" % mb["request_cache"])
    par = json.loads(run([AC, "estimate", "--arch", os.path.join(d, "config.json"), "--data-dir", dd, "--prompt", "8",
                          "--output", "4", "--json"]).stdout)
    check((par["predicted"]["latency_ms"] > est["predicted"]["latency_ms"] or not TIMED) and par["params"] > est["params"],
          "estimate reads the published config.json (Infinity in time_step_limit); the parent prices above the cut "
          "(%.3f > %.3f ms)" % (par["predicted"]["latency_ms"], est["predicted"]["latency_ms"]))
    for method in ("autocompress", "minitron"):
        r = run([AC, "search", d, "--method", method, "--axes", "mamba_heads", "--params", str(int(0.95 * par["params"])),
                 "--calib", TEXT, "--tokenizer", TOK, "--search-tokens", "1024", "--rank-tokens", "256", "--data-dir", dd,
                 "--prompt", "8", "--output", "4", "--json"])
        got = json.loads(r.stdout)["arch"]["layers"]
        mh = [l["mamba"]["n_heads"] for l in got if l.get("mamba")]
        check(len(mh) == 3 and len(set(mh)) == 1 and mh[0] < 8 and mh[0] % 2 == 0 and len(got) == 5 and
              got[1]["attention"] == {"n_heads": 4, "n_kv_heads": 2} and got[3]["mlp"] == {"ffn_dim": 40},
              "%s: the Mamba axis alone meets 95%% of the parameters with one head count for every Mamba layer: %s" %
              (method, mh))


def main():
    c = CFG
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "ids.txt"), "w") as f:
            f.write(" ".join(map(str, IDS)))
        d = os.path.join(tmp, "parent")
        W, conf = make_checkpoint(d, c)
        a = json.loads(run([AC, "inspect", d, "--json"]).stdout)
        ly = a["layers"]
        check(a["family"] == "nemotron_h" and len(ly) == 5 and ly[0]["mamba"] == {
            "n_heads": 8, "head_dim": 4, "d_state": 6, "n_groups": 2, "conv_kernel": 4} and ly[0]["attention"] is None
              and ly[1]["attention"] == {"n_heads": 4, "n_kv_heads": 2} and ly[3]["mlp"] == {"ffn_dim": 40},
              "inspect reads the pattern M*M-M, the Mamba shape, heads and widths")
        ref = ref_logits(c, W)
        eng, _ = engine_logits(d, tmp, "parent")
        e = rel(eng, ref)
        check(e < 1e-4, "engine logits on the checkpoint = float64 reference (rel err %.2e)" % e)

        x = os.path.join(tmp, "export")
        _, r = engine_logits(d, tmp, "x", "--hf", x)
        xc = json.load(open(os.path.join(x, "config.json")))
        hdr = json.loads(open(os.path.join(x, "model.safetensors"), "rb").read()[8:][:struct.unpack(
            "<Q", open(os.path.join(x, "model.safetensors"), "rb").read(8))[0]])
        check(xc["architectures"] == ["NemotronHForCausalLM"] and xc["hybrid_override_pattern"] == "M*M-M" and
              hdr["backbone.layers.0.mixer.conv1d.weight"]["shape"] == [56, 1, 4],
              "HF export: NemotronHForCausalLM, pattern M*M-M, conv1d weight [56, 1, 4]")
        back, _ = engine_logits(x, tmp, "xb")
        check(np.array_equal(back, eng), "the export reloads with identical logits")

        ap = os.path.join(tmp, "same.json")
        with open(ap, "w") as f:
            f.write(run([AC, "inspect", d, "--json"]).stdout)
        same, _ = engine_logits(d, tmp, "same", "--arch", ap)
        check(np.array_equal(same, eng), "pruning to the parent's own arch is the identity (bit-identical logits)")

        cut = dict(a, layers=[dict(l) for l in a["layers"]])
        for l in cut["layers"]:
            if l.get("mamba"):
                l["mamba"] = dict(l["mamba"], n_heads=4)
        cut["layers"][1]["attention"] = {"n_heads": 2, "n_kv_heads": 1}
        cut["layers"][3]["mlp"] = {"ffn_dim": 24}
        cp = os.path.join(tmp, "cut.json")
        with open(cp, "w") as f:
            json.dump(cut, f)
        px = os.path.join(tmp, "pruned-hf")
        pe, _ = engine_logits(d, tmp, "cut", "--arch", cp, "--hf", px)
        pr = ref_logits(c, sliced(c, W, 4, 2, 24), mh=4, heads=2, ffn=24, kv=1)
        e = rel(pe, pr)
        check(e < 1e-4, "pruned to 4 Mamba heads (2 per group), 2 query heads, 24 MLP units = the reference on "
                        "weights sliced by hand (rel err %.2e)" % e)
        pb, _ = engine_logits(px, tmp, "cutb")
        check(np.array_equal(pb, pe) and json.load(open(os.path.join(px, "config.json")))["mamba_num_heads"] == 4,
              "the pruned model's HF export (mamba_num_heads 4) reloads with the same logits")

        rk = os.path.join(tmp, "ranked")
        r = run([AC, "prune", d, "--arch", ap, "--out", rk, "--tokenizer", TOK, "--calib", TEXT, "--calib-tokens",
                 "512", "--layer-tokens", "0", "--batch", "2", "--seq", "64", "--no-reconstruct"])
        rj = json.load(open(os.path.join(rk, "ranking.json"))) if os.path.exists(os.path.join(rk, "ranking.json")) \
            else None
        ranked, _ = engine_logits(rk, tmp, "ranked")
        e = rel(ranked, eng)
        perm = rj["layers"][0]["mamba"]["score_perm"]["perm"] if rj else None
        check(e < 1e-5 and (perm is None or all(p // 4 == i // 4 for i, p in enumerate(perm))),
              "ranked in place (heads permuted inside their groups: %s), the parent's logits (rel err %.2e)" %
              (perm, e))
        check_refusals(tmp, conf)
        check_moe(tmp)
        check_latent(tmp)
        check_cost_model(tmp, d, cp)
        r = run([AC, "export", d, "--out", os.path.join(tmp, "x.gguf"), "--format", "gguf", "--dtype", "fp32",
                 "--tokenizer", TOK])
        gg = open(os.path.join(tmp, "x.gguf"), "rb").read(4096)
        check(gg[:4] == b"GGUF" and b"nemotron_h" in gg and b"ssm.time_step_rank" in gg,
              "GGUF export writes llama.cpp's nemotron_h (tests/oracle/test_export_llamacpp_hybrid.py runs it)")
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("PASS: Nemotron-H read, pruned and written")


if __name__ == "__main__":
    main()
