"""Least-squares reconstruction against PyTorch (float64).

tests/tools/recon_oracle prunes a random GQA parent (FFN units, query heads, whole KV
groups, or hidden channels with a layer and parts removed) and reconstructs the student
on random calibration rows. Here PyTorch walks both models layer by layer on the same
rows, with the engine's refit weights for the layers before, and for every projection
(o_proj and down_proj on the block's own inputs; q/k/v and gate/up on the normalized
block input, against the parent's kept rows on the parent's normalized input):
  - the least-squares solution damped toward the slice W0, which torch.linalg.lstsq gives
    on [X; sqrt(lambda) I] against [Y; sqrt(lambda) W0^T], equals the engine's new weights
    (relative error < 1e-3), lambda being `damp` times the mean diagonal of X^T X as the
    engine reports it; for q/k/v and gate/up, the map M the same way from the student's
    normalized input to the parent's (damped toward the kept channels' selection), and
    W' = W_parent[kept rows] M;
  - the reported squared errors before and after are the ones PyTorch measures, and
    after <= before; a projection the engine kept (no gain) is the slice unchanged;
  - projections that read nothing pruned (inputs and upstream as the parent's) stay.
The same on a Nemotron-H parent ("M*M-": Mamba-2 mixers, attention without RoPE, a
squared-ReLU MLP; test_engine_oracle_hybrid.py's PyTorch blocks), cut in hidden size, Mamba
heads (one of two per group), query heads and MLP units: a Mamba mixer's in_proj (the kept
heads' z, x and dt rows, every B and C row) by the input map, its out_proj on the gated
norm's output; up_proj alone on the MLP's input side.
And on a Qwen2-MoE parent (attention and an MoE with a shared expert in every layer;
test_engine_oracle_moe.py's PyTorch block), cut in hidden size, experts, expert and shared
expert widths and query heads: the router (its kept experts' rows), every kept expert's
gate_proj and up_proj (its kept units' rows), the shared expert's and its gate by the input
map, as q/k/v are, and each narrowed expert's down_proj on the tokens the student routes to it
(its units' activations against the parent expert's output on those tokens), and the narrowed
shared expert's on every token; with compensation on (CASE+comp), in every layer that lost
experts or width the shared expert's down_proj on every token instead (its units times its
gate against the parent block's output less the student's routed experts); and on a Nemotron-H
parent ("*E*E": sigmoid routing in groups, a shared expert, the last MoE a LatentMoE; experts
narrowed in both, the latent cut from 16 to 12) the router, the experts' up_proj (the first
experts of every group kept), behind the latent fc1_latent_proj (its first rows), the experts'
down_proj (the latent one's on the first latent channels) and the
shared expert's down_proj the same two ways. And on a Mixtral parent (the Qwen2-MoE case
without its shared expert): with compensation on, in every layer that lost experts or width
each kept expert's down_proj in turn (a block coordinate descent sweep), on the tokens routed
to it, its units times its routing weight against the parent block's output less the other
kept experts as they are at that step.
Then a run killed with SIGKILL after two layers and rerun on its checkpoints writes the
same weights, byte for byte, as a run straight through (the mixed and the MoE cases). Env: AC_BIN.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_prune_grad import attn_block, mlp_block, read_records, rms  # noqa: E402
from test_engine_oracle_hybrid import attention as hybrid_attention, mamba_mixer, moe_nemotron, nemotron_route  # noqa: E402
from test_engine_oracle_moe import moe_block, moe_names, swiglu  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_default_dtype(torch.float64)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from e2e_common import schema_validator  # noqa: E402

check_projection = schema_validator("/components/schemas/Report/properties/pruning/properties/projections/items",
                                    "a reconstruction's projection")


def run_tool(tool, out, case, *extra):
    return subprocess.run([tool, out, case, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def load(out):
    rec = read_records(out + ".bin")
    pa = json.load(open(out + ".parent.json"))
    sa = json.load(open(out + ".student.json"))
    rj = json.load(open(out + ".recon.json"))
    return rec, pa, sa, rj


def kept_rows(pa, sa, src, i, proj):
    """The parent rows of an input projection that the prefix selection keeps."""
    D, L, P = pa["head_dim"], sa["layers"][i], pa["layers"][src]
    if proj == "q_proj":
        hq, hkv = L["attention"]["n_heads"], L["attention"]["n_kv_heads"]
        pr = P["attention"]["n_heads"] // P["attention"]["n_kv_heads"]
        return [(g * pr + j) * D + d for g in range(hkv) for j in range(hq // hkv) for d in range(D)]
    if proj in ("k_proj", "v_proj"):
        return list(range(L["attention"]["n_kv_heads"] * D))
    return list(range(L["mlp"]["ffn_dim"]))


def check_fit(case, o, X, Y, before, after, damp, ref_of=None):
    """One projection's outcome against PyTorch: errors, and the weights against lstsq.
    ref_of(lam) gives the reference weights (default: lstsq of X against Y damped toward
    before)."""
    err = lambda w: ((X @ w.T - Y) ** 2).sum().item()
    e0, e1 = err(before), err(after)
    where = (case, o["layer"], o["proj"])
    assert abs(e0 - o["error_before"]) <= 1e-3 * e0 + 1e-9, (where, e0, o["error_before"])
    assert abs(e1 - o["error_after"]) <= 1e-3 * e1 + 1e-9, (where, e1, o["error_after"])
    assert o["error_after"] <= o["error_before"]
    if not o["pruned"]:
        assert not o["refit"] and torch.equal(before, after), where
        return None
    lam = damp * (X * X).sum().item() / X.shape[1]
    assert abs(lam - o["lambda"]) <= 1e-3 * lam, (where, lam, o["lambda"])
    ref = ref_of(lam) if ref_of else ridge(X, Y, before, lam)
    if not o["refit"]:
        assert torch.equal(before, after) and err(ref) >= e0 * (1 - 1e-6), where
        return None
    rel = ((after - ref).norm() / ref.norm()).item()
    assert rel < 1e-3, (where, rel)
    assert err(ref) < e0
    return rel


def check_input(case, o, Xs, Xp, Wp, before, after, damp):
    """An input projection's outcome: the parent's kept rows Wp on the parent's normalized input
    Xp are the targets; the reference is Wp M, M the map from Xs to Xp damped toward the kept
    channels' selection (a prefix)."""
    sel = torch.eye(Xp.shape[1])[:, :Xs.shape[1]]
    return check_fit(case, o, Xs, Xp @ Wp.T, before, after, damp, lambda lam: Wp @ ridge(Xs, Xp, sel, lam))


def ridge(X, Y, prior, lam):
    """argmin_W |X W^T - Y|^2 + lam |W - prior|^2, by torch.linalg.lstsq."""
    Xa = torch.cat([X, lam ** 0.5 * torch.eye(X.shape[1])])
    Ya = torch.cat([Y, lam ** 0.5 * prior.T])
    return torch.linalg.lstsq(Xa, Ya).solution.T


def run_case(tool, case):
    """The tool's run of a case: weights W (parent., before., after.), the tokens, both archs,
    the outcome and its projections by (layer, proj). Each projection's record must fit the
    Report schema's (openapi/openapi.yaml)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, case)
        p = run_tool(tool, out, case)
        assert p.returncode == 0, p.stderr.decode()
        rec, pa, sa, rj = load(out)
    for o in rj["projections"]:
        check_projection(o)
    W = {k: torch.tensor(v) for k, v in rec.items()}
    return (W, torch.tensor(rec["tokens"], dtype=torch.long), pa, sa, rj,
            {(o["layer"], o["proj"]): o for o in rj["projections"]})


def check_case(tool, case):
    W, tokens, pa, sa, rj, outcomes = run_case(tool, case)
    P = lambda n: W["parent." + n]
    A = lambda n: W["after." + n]
    c, eps, damp = sa["hidden_size"], pa["norm_eps"], rj["damp"]
    xs_p = [P("model.embed_tokens.weight")[row] for row in tokens]
    xs_s = [A("model.embed_tokens.weight")[row] for row in tokens]
    worst, refits, prev = 0.0, 0, -1
    blocks = ((attn_block, "attention", "input_layernorm.weight", ("q_proj", "k_proj", "v_proj"), "o_proj",
               "self_attn.%s.weight"),
              (mlp_block, "mlp", "post_attention_layernorm.weight", ("gate_proj", "up_proj"), "down_proj",
               "mlp.%s.weight"))
    for i, L in enumerate(sa["layers"]):
        src = L["source_layer"]
        for l in range(prev + 1, src):   # parent layers the student lost
            for blk, key, *_ in blocks:
                if pa["layers"][l].get(key):
                    xs_p = [x + blk(pa, P, "model.layers.%d." % l, x)[1] for x in xs_p]
        prev = src
        for blk, key, norm, inputs, proj, wfmt in blocks:
            ppre, spre = "model.layers.%d." % src, "model.layers.%d." % i
            if not pa["layers"][src].get(key):
                continue
            Xp = torch.cat([rms(x, P(ppre + norm), eps) for x in xs_p])
            ys = [blk(pa, P, ppre, x)[1] for x in xs_p]
            xs_p = [x + y for x, y in zip(xs_p, ys)]
            if not L.get(key):
                assert (i, proj) not in outcomes
                continue
            Xs = torch.cat([rms(x, A(spre + norm), eps) for x in xs_s])
            for ip in inputs:
                if (i, ip) not in outcomes:
                    continue
                Wp = P(ppre + wfmt % ip)[kept_rows(pa, sa, src, i, ip)]
                rel = check_input(case, outcomes[(i, ip)], Xs, Xp, Wp, W["before." + spre + wfmt % ip],
                                  A(spre + wfmt % ip), damp)
                if rel is not None:
                    worst, refits = max(worst, rel), refits + 1
            X = torch.cat([blk(sa, A, spre, x)[0] for x in xs_s])
            Y = torch.cat(ys)[:, :c]
            rel = check_fit(case, outcomes[(i, proj)], X, Y, W["before." + spre + wfmt % proj], A(spre + wfmt % proj),
                            damp)
            if rel is not None:
                worst, refits = max(worst, rel), refits + 1
            xs_s = [x + blk(sa, A, spre, x)[1] for x in xs_s]
    assert refits > 0, case
    assert any(o["proj"] == "q_proj" and o["refit"] for o in rj["projections"]), case
    print("%s: %d of %d projections refit, worst weight rel err vs torch.linalg.lstsq %.2g; o_proj/down_proj "
          "rel error %s" % (case, refits, len(outcomes), worst,
                            ", ".join("%.3f->%.3f" % (o["rel_error_before"], o["rel_error_after"])
                                      for o in rj["projections"] if o["proj"] in ("o_proj", "down_proj"))))


def hybrid_block(arch, g, pre, x):
    """Nemotron-H block of layer `pre` (backbone.layers.l.) on stream x [T, C]: (its output
    projection's input, its output), the input taken by an identity output projection."""
    L = arch["layers"][int(pre.split(".")[2])]
    h = rms(x, g(pre + "norm.weight"), arch["norm_eps"])[None]
    W = {n: g(pre + "mixer." + n) for n in MIXER_NAMES[kind_of(L)]}
    if kind_of(L) == "mamba":
        m = L["mamba"]
        mm = (m["n_heads"], m["head_dim"], m["d_state"], m["n_groups"], m["conv_kernel"])
        f = lambda W: mamba_mixer(W, "", h, mm, None, arch["norm_eps"])[0]
        out = "out_proj.weight"
    elif kind_of(L) == "attention":
        a = L["attention"]
        f = lambda W: hybrid_attention(W, "", h, a["n_heads"], a["n_kv_heads"], arch["head_dim"], None)[0]
        out = "o_proj.weight"
    else:
        f = lambda W: torch.relu(h[0] @ W["up_proj.weight"].T) ** 2 @ W["down_proj.weight"].T
        out = "down_proj.weight"
    n_in = W[out].shape[1]
    return f(dict(W, **{out: torch.eye(n_in)})), f(W)


MIXER_NAMES = {"mamba": ("in_proj.weight", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D", "norm.weight",
                         "out_proj.weight"),
               "attention": ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"),
               "mlp": ("up_proj.weight", "down_proj.weight")}
HYBRID_PROJ = {"mamba": (("in_proj",), "out_proj"), "attention": (("q_proj", "k_proj", "v_proj"), "o_proj"),
               "mlp": (("up_proj",), "down_proj")}


def kind_of(L):
    return "mamba" if L.get("mamba") else "attention" if L.get("attention") else "moe" if L.get("moe") else "mlp"


def nemotron_lay(arch, l):
    m = arch["layers"][l]["moe"]
    r = m["router"]
    return (0, 0, 0, m["n_experts"], m["top_k"], m["expert_ffn_dim"], m["shared_ffn_dim"], int(m["norm_topk_prob"]),
            0, 0, 0, 0, 0, 1, r["n_group"], r["topk_group"], r["routed_scaling_factor"], m.get("latent_dim", 0))


def nemotron_moe_y(arch, W, pre, h):
    """A Nemotron-H MoE block's output on h (test_engine_oracle_hybrid's reference): W the
    weights by name, pre the layer's prefix in W ("parent.backbone.layers.1.")."""
    view = {k[len(pre):]: v for k, v in W.items() if k.startswith(pre)}
    return moe_nemotron(view, "mixer.", h, nemotron_lay(arch, int(pre.split(".")[-2])), None)


def nemotron_expert_downs(pa, sa, W, src, i, Xs, Xp, c):
    """A narrowed Nemotron-H MoE layer's expert outputs: (student expert, its squared-ReLU
    units on the tokens the student routes to it, the parent expert's output on them at the
    kept channels (of the hidden size, or the first of a latent), the student's down_proj name); without compensation
    a narrowed shared expert's too (None: every token, against the parent's own)."""
    ms, mp = sa["layers"][i]["moe"], pa["layers"][src]["moe"]
    G = mp["router"]["n_group"]
    exp = [g * (mp["n_experts"] // G) + j for g in range(G) for j in range(ms["n_experts"] // G)]
    sv = {k[len("after."):]: v for k, v in W.items() if k.startswith("after.")}
    spre, ppre = "backbone.layers.%d.mixer." % i, "backbone.layers.%d.mixer." % src
    topi = nemotron_route(sv, spre, Xs, nemotron_lay(sa, i))[0]
    lat = ms.get("latent_dim", 0)
    hs = Xs @ W["after." + spre + "fc1_latent_proj.weight"].T if lat else Xs
    hp = Xp @ W["parent." + ppre + "fc1_latent_proj.weight"].T if lat else Xp
    out = []
    for e, x in enumerate(exp):
        rows = (topi == e).any(-1)
        if not rows.any():   # no token: nothing to fit, no record
            continue
        Hs = torch.relu(hs[rows] @ W["after." + spre + "experts.%d.up_proj.weight" % e].T) ** 2
        Yp = (torch.relu(hp[rows] @ W["parent." + ppre + "experts.%d.up_proj.weight" % x].T) ** 2) @ \
            W["parent." + ppre + "experts.%d.down_proj.weight" % x].T
        out.append((e, Hs, Yp[:, :lat or c], spre + "experts.%d.down_proj.weight" % e))
    return out


def nemotron_shared_own(pa, sa, W, src, i, Xs, Xp, c):
    """Without compensation, a narrowed Nemotron-H shared expert: (its squared-ReLU units on
    every token, the parent shared expert's output at the kept channels, its down_proj name)."""
    spre, ppre = "backbone.layers.%d.mixer." % i, "backbone.layers.%d.mixer." % src
    Hs = torch.relu(Xs @ W["after." + spre + "shared_experts.up_proj.weight"].T) ** 2
    Yp = (torch.relu(Xp @ W["parent." + ppre + "shared_experts.up_proj.weight"].T) ** 2) @ \
        W["parent." + ppre + "shared_experts.down_proj.weight"].T
    return Hs, Yp[:, :c], spre + "shared_experts.down_proj.weight"


def moe_changed(pm, sm):
    return any(pm.get(k, 0) != sm.get(k, 0) for k in ("n_experts", "top_k", "expert_ffn_dim", "shared_ffn_dim",
                                                      "latent_dim"))


def nemotron_shared_down(pa, sa, W, src, i, Xs, Xp, c):
    """A changed Nemotron-H MoE layer's shared expert: (its squared-ReLU units on every token,
    the parent block's output at the kept channels less the student's routed experts (the
    student's block as refit, less its shared expert), the student's down_proj name)."""
    spre, ppre = "backbone.layers.%d." % i, "backbone.layers.%d." % src
    n = "mixer.shared_experts.%s_proj.weight"
    Hs = torch.relu(Xs @ W["after." + spre + n % "up"].T) ** 2
    routed = nemotron_moe_y(sa, W, "after." + spre, Xs) - Hs @ W["after." + spre + n % "down"].T
    return Hs, nemotron_moe_y(pa, W, "parent." + ppre, Xp)[:, :c] - routed, spre + n % "down"


def nemotron_moe_inputs(pa, sa, src, i):
    """A Nemotron-H MoE layer's input projections: (proj, expert, student name, parent name, parent
    rows or None for all); the kept experts are the first of every routing group."""
    m, mp = sa["layers"][i]["moe"], pa["layers"][src]["moe"]
    G = mp["router"]["n_group"]
    exp = [g * (mp["n_experts"] // G) + j for g in range(G) for j in range(m["n_experts"] // G)]
    out = [("router", None, "gate.weight", "gate.weight", exp)]
    if m.get("latent_dim"):
        out.append(("fc1_latent_proj", None, "fc1_latent_proj.weight", "fc1_latent_proj.weight",
                    list(range(m["latent_dim"]))))   # the first latent channels
    else:
        out += [("experts.up_proj", e, "experts.%d.up_proj.weight" % e, "experts.%d.up_proj.weight" % x,
                 list(range(m["expert_ffn_dim"]))) for e, x in enumerate(exp)]   # the first units of each
    if m["shared_ffn_dim"]:
        out.append(("shared_expert.up_proj", None, "shared_experts.up_proj.weight", "shared_experts.up_proj.weight",
                    list(range(m["shared_ffn_dim"]))))
    return out


def hybrid_rows(pa, sa, src, i, proj):
    """The parent rows a student input projection keeps (the prefix selection: in_proj's kept
    heads are the first of each group)."""
    if proj != "in_proj":
        return kept_rows(pa, sa, src, i, proj)
    mp, ms = pa["layers"][src]["mamba"], sa["layers"][i]["mamba"]
    P, G, S = mp["head_dim"], mp["n_groups"], mp["d_state"]
    di, hpg_p, hpg_s = mp["n_heads"] * P, mp["n_heads"] // G, ms["n_heads"] // G
    heads = [g * hpg_p + j for g in range(G) for j in range(hpg_s)]
    return ([h * P + j for h in heads for j in range(P)] + [di + h * P + j for h in heads for j in range(P)] +
            list(range(2 * di, 2 * di + 2 * G * S)) + [2 * di + 2 * G * S + h for h in heads])


def check_hybrid(tool, case="hybrid"):
    W, tokens, pa, sa, rj, outcomes = run_case(tool, case)
    comp = case.endswith("+comp")
    moe_outcomes = {(o["layer"], o["proj"], o.get("expert")): o for o in rj["projections"]}
    P = lambda n: W["parent." + n]
    A = lambda n: W["after." + n]
    c, damp, eps = sa["hidden_size"], rj["damp"], pa["norm_eps"]
    xs_p = [P("backbone.embeddings.weight")[row] for row in tokens]
    xs_s = [A("backbone.embeddings.weight")[row] for row in tokens]
    worst, refits, checked, shared_fits = 0.0, 0, 0, 0
    for i, L in enumerate(sa["layers"]):
        src, kind = L["source_layer"], kind_of(L)
        ppre, spre = "backbone.layers.%d." % src, "backbone.layers.%d." % i
        Xp = torch.cat([rms(x, P(ppre + "norm.weight"), eps) for x in xs_p])
        Xs = torch.cat([rms(x, A(spre + "norm.weight"), eps) for x in xs_s])
        if kind == "moe":   # its input projections by the input map, then both streams through it
            for proj, e, sname, pname, rows in nemotron_moe_inputs(pa, sa, src, i):
                Wp = P(ppre + "mixer." + pname)
                rel = check_input(case, moe_outcomes[(i, proj, e)], Xs, Xp, Wp if rows is None else Wp[rows],
                                  W["before." + spre + "mixer." + sname], A(spre + "mixer." + sname), damp)
                checked += 1
                if rel is not None:
                    worst, refits = max(worst, rel), refits + 1
            fits = []
            pm = pa["layers"][src]["moe"]
            if L["moe"]["expert_ffn_dim"] < pm["expert_ffn_dim"] or L["moe"].get("latent_dim", 0) < pm.get("latent_dim", 0):
                fits += [(moe_outcomes[(i, "experts.down_proj", e)], Hs, Yp, name)
                         for e, Hs, Yp, name in nemotron_expert_downs(pa, sa, W, src, i, Xs, Xp, c)]
            if comp and L["moe"]["shared_ffn_dim"] and moe_changed(pa["layers"][src]["moe"], L["moe"]):
                fits.append((moe_outcomes[(i, "shared_expert.down_proj", None)],)
                            + nemotron_shared_down(pa, sa, W, src, i, Xs, Xp, c))
                shared_fits += 1
            elif not comp and L["moe"]["shared_ffn_dim"] < pa["layers"][src]["moe"]["shared_ffn_dim"]:
                fits.append((moe_outcomes[(i, "shared_expert.down_proj", None)],)
                            + nemotron_shared_own(pa, sa, W, src, i, Xs, Xp, c))
                shared_fits += 1
            for o, Hs, Yp, name in fits:
                rel = check_fit(case, o, Hs, Yp, W["before." + name], A(name), damp)
                checked += 1
                if rel is not None:
                    worst, refits = max(worst, rel), refits + 1
            xs_p = [x + nemotron_moe_y(pa, W, "parent." + ppre, rms(x, P(ppre + "norm.weight"), eps)) for x in xs_p]
            xs_s = [x + nemotron_moe_y(sa, W, "after." + spre, rms(x, A(spre + "norm.weight"), eps)) for x in xs_s]
            continue
        ys = [hybrid_block(pa, P, ppre, x)[1] for x in xs_p]
        xs_p = [x + y for x, y in zip(xs_p, ys)]
        inputs, proj = HYBRID_PROJ[kind]
        for ip in inputs:
            if (i, ip) not in outcomes:   # the stream still the parent's restricted: inputs not refit
                continue
            o = outcomes[(i, ip)]
            Wp = P(ppre + "mixer.%s.weight" % ip)[hybrid_rows(pa, sa, src, i, ip)]
            rel = check_input(case, o, Xs, Xp, Wp, W["before." + spre + "mixer.%s.weight" % ip],
                              A(spre + "mixer.%s.weight" % ip), damp)
            checked += 1
            if rel is not None:
                worst, refits = max(worst, rel), refits + 1
        X = torch.cat([hybrid_block(sa, A, spre, x)[0] for x in xs_s])
        Y = torch.cat(ys)[:, :c]
        rel = check_fit(case, outcomes[(i, proj)], X, Y, W["before." + spre + "mixer.%s.weight" % proj],
                        A(spre + "mixer.%s.weight" % proj), damp)
        checked += 1
        if rel is not None:
            worst, refits = max(worst, rel), refits + 1
        xs_s = [x + hybrid_block(sa, A, spre, x)[1] for x in xs_s]
    assert checked == len(rj["projections"]), (checked, len(rj["projections"]))
    done = {(o["proj"], o["refit"]) for o in rj["projections"]}
    need = ("router", "experts.up_proj", "fc1_latent_proj", "shared_expert.up_proj", "experts.down_proj",
            "shared_expert.down_proj") if case.startswith("hybrid_moe") else ("in_proj", "out_proj")
    assert all((p, True) in done for p in need), done
    # compensating: both MoE layers changed; else the shared expert narrowed in layer 1 only
    assert shared_fits == (0 if case == "hybrid" else 2 if comp else 1), shared_fits
    print("%s: %d of %d projections refit (%s among them), worst weight rel err vs torch.linalg.lstsq %.2g" % (
        case, refits, checked, ", ".join(need), worst))


def check_moe(tool, case="moe", comp=False):
    """A Qwen2-MoE parent (case moe: a shared expert) or a Mixtral one (case mixtral: none)."""
    name = case + ("+comp" if comp else "")
    W, tokens, pa, sa, rj, _ = run_case(tool, name)
    outcomes = {(o["layer"], o["proj"], o.get("expert")): o for o in rj["projections"]}
    P = lambda n: W["parent." + n]
    A = lambda n: W["after." + n]
    view = lambda pre: {k[len(pre):]: v for k, v in W.items() if k.startswith(pre)}
    Pw, Aw = view("parent."), view("after.")
    c, eps, damp = sa["hidden_size"], pa["norm_eps"], rj["damp"]

    def moe_y(arch, Wd, l, h):
        m = arch["layers"][l]["moe"]
        lay = (1, 0, 0, m["n_experts"], m["top_k"], 0, m["shared_ffn_dim"], m["norm_topk_prob"])
        return moe_block({"family": arch["family"]}, Wd, l, h, lay, None)

    xs_p = [P("model.embed_tokens.weight")[row] for row in tokens]
    xs_s = [A("model.embed_tokens.weight")[row] for row in tokens]
    worst, refits, checked, shared_fits, swept = 0.0, 0, 0, 0, 0
    for i, L in enumerate(sa["layers"]):
        pre = "model.layers.%d." % i   # no layer removed: student layer i is parent layer i
        router, experts = moe_names(sa["family"], i)
        Xp = torch.cat([rms(x, P(pre + "input_layernorm.weight"), eps) for x in xs_p])
        Xs = torch.cat([rms(x, A(pre + "input_layernorm.weight"), eps) for x in xs_s])
        fits = []
        for ip in ("q_proj", "k_proj", "v_proj"):
            n = pre + "self_attn.%s.weight" % ip
            fits.append(check_input(name, outcomes[(i, ip, None)], Xs, Xp, P(n)[kept_rows(pa, sa, i, i, ip)],
                                    W["before." + n], A(n), damp))
        ys = [attn_block(pa, P, pre, x)[1] for x in xs_p]
        n = pre + "self_attn.o_proj.weight"
        fits.append(check_fit(name, outcomes[(i, "o_proj", None)], torch.cat([attn_block(sa, A, pre, x)[0] for x in xs_s]),
                              torch.cat(ys)[:, :c], W["before." + n], A(n), damp))
        xs_p = [x + y for x, y in zip(xs_p, ys)]
        xs_s = [x + attn_block(sa, A, pre, x)[1] for x in xs_s]
        Xp = torch.cat([rms(x, P(pre + "post_attention_layernorm.weight"), eps) for x in xs_p])
        Xs = torch.cat([rms(x, A(pre + "post_attention_layernorm.weight"), eps) for x in xs_s])
        E, fe, fs = L["moe"]["n_experts"], L["moe"]["expert_ffn_dim"], L["moe"]["shared_ffn_dim"]
        inputs = [("router", None, router, list(range(E)))]   # the first experts' rows
        inputs += [("experts." + w, e, experts(e)[j], list(range(fe)))   # their first units
                   for e in range(E) for j, w in ((0, "gate_proj"), (1, "up_proj"))]
        if fs:
            inputs += [("shared_expert." + w, None, pre + "mlp.shared_expert.%s.weight" % w, list(range(fs)))
                       for w in ("gate_proj", "up_proj")]
            inputs += [("shared_expert_gate", None, pre + "mlp.shared_expert_gate.weight", None)]
        for proj, e, wn, rows in inputs:
            Wp = P(wn) if rows is None else P(wn)[rows]
            fits.append(check_input(name, outcomes[(i, proj, e)], Xs, Xp, Wp, W["before." + wn], A(wn), damp))
        changed = comp and moe_changed(pa["layers"][i]["moe"], L["moe"])
        topw, topi = (Xs @ A(router).T).softmax(-1).topk(L["moe"]["top_k"], dim=-1)
        if L["moe"]["norm_topk_prob"]:
            topw = topw / topw.sum(-1, keepdim=True)
        if fe < pa["layers"][i]["moe"]["expert_ffn_dim"] and not (changed and not fs):
            # narrowed experts: each one's down_proj against its parent expert
            for e in range(E):
                rows = (topi == e).any(-1)
                if not rows.any():   # no token: nothing to fit, no record
                    continue
                g, u, d = experts(e)
                Hs = F.silu(Xs[rows] @ A(g).T) * (Xs[rows] @ A(u).T)
                Yp = swiglu(Xp[rows], *[P(x) for x in moe_names(pa["family"], i)[1](e)])
                fits.append(check_fit(name, outcomes[(i, "experts.down_proj", e)], Hs, Yp[:, :c],
                                      W["before." + d], A(d), damp))
        if not comp and fs < pa["layers"][i]["moe"]["shared_ffn_dim"]:
            # a narrowed shared expert: every token, before its gate, against the parent's own
            x = pre + "mlp.shared_expert."
            Hs = F.silu(Xs @ A(x + "gate_proj.weight").T) * (Xs @ A(x + "up_proj.weight").T)
            Yp = swiglu(Xp, *[P(x + w + ".weight") for w in ("gate_proj", "up_proj", "down_proj")])
            fits.append(check_fit(name, outcomes[(i, "shared_expert.down_proj", None)], Hs, Yp[:, :c],
                                  W["before." + x + "down_proj.weight"], A(x + "down_proj.weight"), damp))
            shared_fits += 1
        if changed and fs:
            # compensating, the shared expert on every token: its units times its gate against what the parent's
            # block output leaves after the student's routed experts (its block as refit, less
            # its shared expert's gated output)
            x = pre + "mlp.shared_expert."
            Hs = F.silu(Xs @ A(x + "gate_proj.weight").T) * (Xs @ A(x + "up_proj.weight").T)
            g = torch.sigmoid(Xs @ A(pre + "mlp.shared_expert_gate.weight").T)
            routed = moe_y(sa, Aw, i, Xs) - g * (Hs @ A(x + "down_proj.weight").T)
            fits.append(check_fit(name, outcomes[(i, "shared_expert.down_proj", None)], g * Hs,
                                  moe_y(pa, Pw, i, Xp)[:, :c] - routed, W["before." + x + "down_proj.weight"],
                                  A(x + "down_proj.weight"), damp))
            shared_fits += 1
        if changed and not fs:
            # compensating without a shared expert: the kept experts' down_proj one after another,
            # each on its routed tokens, its units times its routing weight against the parent's
            # block output less the other experts as they are at that step (the earlier ones refit)
            cur = dict(Aw)
            for e in range(E):
                cur[experts(e)[2]] = W["before." + experts(e)[2]]
            Yb = moe_y(pa, Pw, i, Xp)[:, :c]
            for e in range(E):
                rows = (topi == e).any(-1)
                if not rows.any():
                    continue
                g, u, d = experts(e)
                w = (topw * (topi == e)).sum(-1)[rows][:, None]
                Hs = F.silu(Xs[rows] @ A(g).T) * (Xs[rows] @ A(u).T)
                T = Yb[rows] - moe_y(sa, cur, i, Xs)[rows] + w * (Hs @ cur[d].T)
                fits.append(check_fit(name, outcomes[(i, "experts.down_proj", e)], w * Hs, T, W["before." + d], A(d),
                                      damp))
                cur[d] = A(d)
            swept += 1
        checked += len(fits)
        for rel in fits:
            if rel is not None:
                worst, refits = max(worst, rel), refits + 1
        xs_p = [x + moe_y(pa, Pw, i, rms(x, P(pre + "post_attention_layernorm.weight"), eps)) for x in xs_p]
        xs_s = [x + moe_y(sa, Aw, i, rms(x, A(pre + "post_attention_layernorm.weight"), eps)) for x in xs_s]
    assert checked == len(rj["projections"]), (checked, len(rj["projections"]))
    done = {o["proj"] for o in rj["projections"] if o["refit"]}
    need = {"router", "experts.gate_proj", "experts.up_proj", "experts.down_proj"}
    if case == "moe":
        need |= {"shared_expert.up_proj", "shared_expert.down_proj"}
    assert need <= done, done
    # compensating: layers 0, 2 and 3 lost experts (layer 1 kept its 6), through the shared expert
    # or, without one, swept; else layer 0's narrowed shared expert
    assert (shared_fits, swept) == ((3 if comp else 1, 0) if case == "moe" else (0, 3 if comp else 0)), (shared_fits, swept)
    print("%s: %d of %d projections refit (%s among them), worst weight rel err vs torch.linalg.lstsq %.2g; "
          "router rel error %s" % (
              name, refits, checked, ", ".join(sorted(need)), worst,
              ", ".join("%.3f->%.3f" % (o["rel_error_before"], o["rel_error_after"])
                        for o in rj["projections"] if o["proj"] == "router")))
    if comp and case == "mixtral":   # the sweep lowers each changed block's error on its tokens
        sw = [o for o in rj["projections"] if o["proj"] == "experts.down_proj"]
        print("%s: the sweep's %d expert refits, block error on their tokens %.4f -> %.4f (sums of relative errors)" % (
            name, len(sw), sum(o["rel_error_before"] for o in sw), sum(o["rel_error_after"] for o in sw)))


def check_resume(tool, case, layers):
    with tempfile.TemporaryDirectory() as d:
        straight, resumed, ck = os.path.join(d, "a"), os.path.join(d, "b"), os.path.join(d, "ckpt")
        p = run_tool(tool, straight, case)
        assert p.returncode == 0, p.stderr.decode()
        p = run_tool(tool, resumed, case, ck, "2")
        assert p.returncode == -9, (p.returncode, p.stderr.decode())
        assert sorted(f for f in os.listdir(ck) if f.startswith("layer-")) == \
            ["layer-0000.safetensors", "layer-0001.safetensors"]
        p = run_tool(tool, resumed, case, ck)
        assert p.returncode == 0, p.stderr.decode()
        a, b = read_records(straight + ".bin"), read_records(resumed + ".bin")
        names = [n for n in a if n.startswith("after.")]
        assert names and all(a[n].tobytes() == b[n].tobytes() for n in names)
        ra, rb = json.load(open(straight + ".recon.json")), json.load(open(resumed + ".recon.json"))
        assert rb["resumed_layers"] == 2 and ra["resumed_layers"] == 0
        assert ra["projections"] == rb["projections"]
    print("%s: killed after 2 of %d layers and resumed: the same %d tensors, byte for byte" % (case, layers, len(names)))


def main():
    tool = os.path.join(os.path.dirname(os.environ.get("AC_BIN", "build/autocompress")), "tools", "recon_oracle")
    if not os.access(tool, os.X_OK):
        print("missing %s (make all builds it)" % tool)
        return 1
    for case in ("ffn", "heads", "kv", "mixed"):
        check_case(tool, case)
    check_hybrid(tool)
    check_hybrid(tool, "hybrid_moe")
    check_hybrid(tool, "hybrid_moe+comp")
    check_moe(tool)
    check_moe(tool, comp=True)
    check_moe(tool, "mixtral")
    check_moe(tool, "mixtral", comp=True)
    check_resume(tool, "mixed", 3)
    check_resume(tool, "moe", 4)
    check_resume(tool, "moe+comp", 4)
    check_resume(tool, "mixtral+comp", 4)
    return 0


if __name__ == "__main__":
    sys.exit(main())
