"""Make a mixture-of-experts model with real weights from SmolLM2-135M (MoEfication).

No small pretrained MoE checkpoint ships in a package this machine can reach, so this script
builds one from a dense model, and says how:

  1. Calibration: the dense model (an HF directory, LlamaForCausalLM, as
     `autocompress export SmolLM2.gguf --format hf --dtype fp32` writes it) runs on
     --tokens tokens of --text; each layer's MLP input x (after its RMSNorm) and gated
     activations h = silu(x Wg^T) * (x Wu^T) are kept.
  2. Shared expert: the --shared neurons of largest mean |h| (the ones nearly every token
     uses) form a Qwen2-MoE shared expert. Its gate weight is 0 (sigmoid 0.5) and its
     down_proj is doubled, so it adds exactly what those neurons added before. With
     --shared 0 there is none, and the result is a Mixtral instead (no attention biases).
  3. Experts: the other neurons are split into --experts groups of equal size by balanced
     k-means on their activation patterns (|h| over the calibration tokens, normalized):
     neurons that fire together land in one expert (MoEfication, Zhang et al. 2022).
  4. Router: a linear map x -> E logits fitted by ridge regression to each expert's output
     norm ||h_e Wd_e^T|| per token (standardized per token), so that softmax top-k picks
     the experts that would have contributed most.
  5. Routing weights: top --top-k of E, renormalized (norm_topk_prob); each expert's
     down_proj is multiplied by top-k, so equal routing weights (1/k) give the dense sum
     of the chosen experts.

The result is a Qwen2MoeForCausalLM directory (attention biases 0: SmolLM2 has none; a
MixtralForCausalLM one with --shared 0) with the
parent's tokenizer files. Per layer it prints the relative error of the MoE MLP output against
the dense MLP on held-out tokens. It is not a trained MoE: distill it from the parent
(`autocompress distill`) before claiming anything about its quality; bench/families/run.sh
does, and reports the perplexity of each step.

Runs under $AC_TF_PYTHON (transformers 4.40.2 on the system torch).
usage: moefy.py DENSE_HF_DIR OUT_DIR --text FILE [--experts 8] [--top-k 2] [--shared 512]
                [--tokens 16384] [--seq 256] [--seed 1]"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM, MixtralConfig, Qwen2MoeConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def calib_ids(tok_path, text_path, n, seed):
    tok = Tokenizer.from_file(tok_path)
    text = open(text_path, encoding="utf-8", errors="replace").read()
    rng = np.random.default_rng(seed)
    start = int(rng.integers(0, max(1, len(text) - 40 * n)))
    ids = tok.encode(text[start:start + 40 * n]).ids
    if len(ids) < n:
        ids = tok.encode(text).ids
    return torch.tensor(ids[:n])


def capture(model, ids, seq):
    """Per layer: the MLP inputs X [T, C] (post-norm), over rows of `seq` tokens."""
    xs = [[] for _ in model.model.layers]
    hooks = [layer.mlp.register_forward_hook(lambda mod, inp, out, i=i: xs[i].append(inp[0].reshape(-1, inp[0].shape[-1])))
             for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        for r in range(0, len(ids) - seq + 1, seq):
            model(ids[r:r + seq][None])
    for h in hooks:
        h.remove()
    return [torch.cat(x) for x in xs]


def balanced_kmeans(feat, k, iters, seed):
    """feat [n, d] rows (one per neuron) into k groups of n/k each: k-means centroids, then
    each neuron placed in order of confidence into its nearest group with room."""
    n = feat.shape[0]
    size = n // k
    g = torch.Generator().manual_seed(seed)
    cent = feat[torch.randperm(n, generator=g)[:k]].clone()
    for _ in range(iters):
        d = torch.cdist(feat, cent)
        assign = torch.full((n,), -1, dtype=torch.long)
        room = [size] * k
        order = torch.argsort(d.min(1).values - d.max(1).values)   # most decided first
        for j in order.tolist():
            for c in torch.argsort(d[j]).tolist():
                if room[c]:
                    assign[j] = c
                    room[c] -= 1
                    break
        for c in range(k):
            cent[c] = feat[assign == c].mean(0)
    return assign


def moefy_layer(layer, X, Xv, E, K, S, seed):
    mlp = layer.mlp
    Wg, Wu, Wd = mlp.gate_proj.weight.data, mlp.up_proj.weight.data, mlp.down_proj.weight.data
    with torch.no_grad():
        H = torch.nn.functional.silu(X @ Wg.T) * (X @ Wu.T)            # [T, F]
        use = H.abs().mean(0)
        shared = torch.argsort(use, descending=True)[:S]
        rest = torch.tensor(sorted(set(range(Wg.shape[0])) - set(shared.tolist())))
        feat = H[:, rest].abs().T
        feat = feat / (feat.norm(dim=1, keepdim=True) + 1e-9)
        assign = balanced_kmeans(feat, E, 8, seed)
        groups = [rest[assign == e] for e in range(E)]
        # router target: each expert's output norm per token, standardized per token
        mass = torch.stack([(H[:, g] @ Wd[:, g].T).norm(dim=1) for g in groups], 1)   # [T, E]
        z = (mass - mass.mean(1, keepdim=True)) / (mass.std(1, keepdim=True) + 1e-6)
        lam = 1e-2 * X.shape[0]
        Wr = torch.linalg.solve(X.T @ X + lam * torch.eye(X.shape[1]), X.T @ z).T   # [E, C]
        out = {"gate.weight": Wr.contiguous()}
        if S:
            out.update({"shared_expert.gate_proj.weight": Wg[shared].contiguous(),
                        "shared_expert.up_proj.weight": Wu[shared].contiguous(),
                        "shared_expert.down_proj.weight": (2.0 * Wd[:, shared]).contiguous(),
                        "shared_expert_gate.weight": torch.zeros(1, X.shape[1])})
        names = ("w1", "w3", "w2") if not S else ("gate_proj", "up_proj", "down_proj")   # Mixtral's, Qwen2-MoE's
        for e, g in enumerate(groups):
            out["experts.%d.%s.weight" % (e, names[0])] = Wg[g].contiguous()
            out["experts.%d.%s.weight" % (e, names[1])] = Wu[g].contiguous()
            out["experts.%d.%s.weight" % (e, names[2])] = (K * Wd[:, g]).contiguous()
        # held-out check: the MoE MLP against the dense one
        dense = mlp(Xv)
        p = torch.softmax(Xv @ Wr.T, -1)
        w, idx = p.topk(K, -1)
        w = w / w.sum(-1, keepdim=True)
        Hv = torch.nn.functional.silu(Xv @ Wg.T) * (Xv @ Wu.T)
        y = Hv[:, shared] @ Wd[:, shared].T
        for e, g in enumerate(groups):
            we = (w * (idx == e)).sum(-1, keepdim=True)
            y = y + we * K * (Hv[:, g] @ Wd[:, g].T)
        rel = float((y - dense).norm() / dense.norm())
        # how often the router picks the experts of largest true output
        mv = torch.stack([(Hv[:, g] @ Wd[:, g].T).norm(dim=1) for g in groups], 1)
        hit = float((mv.topk(K, -1).indices.sort(-1).values == idx.sort(-1).values).all(-1).float().mean())
    return out, rel, hit


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dense")
    ap.add_argument("out")
    ap.add_argument("--text", required=True)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--shared", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model = LlamaForCausalLM.from_pretrained(a.dense, torch_dtype=torch.float32).eval()
    cfg = model.config
    F = cfg.intermediate_size
    if (F - a.shared) % a.experts:
        sys.exit("moefy: %d neurons less %d shared do not split into %d equal experts" % (F, a.shared, a.experts))
    ids = calib_ids(os.path.join(a.dense, "tokenizer.json"), a.text, a.tokens + 4 * a.seq, a.seed)
    X = capture(model, ids[:a.tokens], a.seq)
    Xv = capture(model, ids[a.tokens:], a.seq)
    sd = {k: v for k, v in model.state_dict().items() if ".mlp." not in k}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    report = []
    for l, layer in enumerate(model.model.layers):
        w, rel, hit = moefy_layer(layer, X[l], Xv[l], a.experts, a.top_k, a.shared, a.seed + l)
        for k, v in w.items():
            sd["model.layers.%d.%s.%s" % (l, "mlp" if a.shared else "block_sparse_moe", k)] = v
        for p in ("q", "k", "v"):
            n = getattr(layer.self_attn, p + "_proj").weight.shape[0]
            if a.shared:
                sd["model.layers.%d.self_attn.%s_proj.bias" % (l, p)] = torch.zeros(n)
        report.append({"layer": l, "mlp_rel_error": rel, "router_topk_exact": hit})
        print("layer %2d: MoE MLP vs dense, relative error %.3f; router picks the true top-%d in %.0f%% of tokens"
              % (l, rel, a.top_k, 100 * hit), flush=True)
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
                  num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                  max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta,
                  rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
                  num_experts_per_tok=a.top_k, bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
                  torch_dtype="float32")
    if not a.shared:   # no shared expert: a Mixtral (every router renormalized, no attention bias)
        qcfg = MixtralConfig(intermediate_size=F // a.experts, num_local_experts=a.experts, sliding_window=None,
                             **common)
        qcfg.architectures = ["MixtralForCausalLM"]
    else:
        qcfg = Qwen2MoeConfig(intermediate_size=F, num_experts=a.experts, norm_topk_prob=True,
                              moe_intermediate_size=(F - a.shared) // a.experts,
                              shared_expert_intermediate_size=a.shared, decoder_sparse_step=1, **common)
        qcfg.architectures = ["Qwen2MoeForCausalLM"]
    os.makedirs(a.out, exist_ok=True)
    qcfg.save_pretrained(a.out)
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(a.out, "model.safetensors"),
              metadata={"format": "pt"})
    for f in TOKENIZER_FILES:
        if os.path.exists(os.path.join(a.dense, f)):
            shutil.copy(os.path.join(a.dense, f), os.path.join(a.out, f))
    with open(os.path.join(a.out, "moefy.json"), "w") as f:
        json.dump({"parent": os.path.abspath(a.dense), "experts": a.experts, "top_k": a.top_k, "shared": a.shared,
                   "calibration_tokens": a.tokens, "text": os.path.abspath(a.text), "layers": report}, f, indent=1)
    print("moefy: wrote %s (%d experts of %d, top %d, shared %d)" % (a.out, a.experts, (F - a.shared) // a.experts,
                                                                     a.top_k, a.shared))


if __name__ == "__main__":
    main()
