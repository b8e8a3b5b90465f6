"""A random Nemotron-H-shaped checkpoint for the families benchmark, written as the Hub's are
(NemotronHForCausalLM config.json, backbone.* safetensors, conv1d [conv_dim, 1, K]): Nano's
block mix scaled down — 20 layers of which 10 Mamba-2 mixers, 8 squared-ReLU MLPs and 2
attention layers (Nano: 23 M, 23 E, 6 *; its MoE layers are dense MLPs here, Nemotron-H's MoE
not being built), hidden 768, Mamba 24 heads of 64 (d_inner 2 x hidden), state 128, 8 groups,
conv 4; attention 12 query / 2 KV heads of 64; MLP 2048; vocab 32000, untied. 128.6M
parameters. Random weights (std 1/sqrt(fan-in); A_log = log(1..H), dt_bias so that dt starts
near 0.01-0.1 as Mamba initializes it): a shape for timing and the cost model, no quality.
With --latent the 8 MLPs are Nemotron 3 Super's LatentMoE layers instead: 16 routed
squared-ReLU experts of 512 (top 4, sigmoid routing, scale 2.5) in a latent of 384 beside a
shared expert of 1024 (171.1M parameters).
usage: make_hybrid.py OUT_DIR [VOCAB] [--latent]  (VOCAB 512: stories260K's tokenizer fits, for jobs)"""
import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import save_file

V, C, F = 32000, 768, 2048
H, KV, D = 12, 2, 64
MH, MP, S, G, K = 24, 64, 128, 8, 4
PATTERN = "M-M-M*M-M-M-M-M*M-M-"
E, TOPK, FE, FS, LT = 16, 4, 512, 1024, 384   # --latent


def main():
    global V, PATTERN
    args = [a for a in sys.argv[1:] if a != "--latent"]
    latent = len(args) < len(sys.argv) - 1
    out = args[0]
    V = int(args[1]) if len(args) > 1 else V
    if latent:
        PATTERN = PATTERN.replace("-", "E")
    rng = np.random.default_rng(2026)
    di, cd = MH * MP, MH * MP + 2 * G * S

    def lin(o, i):
        return rng.standard_normal((o, i), dtype=np.float32) / np.float32(math.sqrt(i))
    w = {"backbone.embeddings.weight": rng.standard_normal((V, C), dtype=np.float32) * np.float32(0.02),
         "backbone.norm_f.weight": np.ones(C, np.float32), "lm_head.weight": lin(V, C)}
    for l, ch in enumerate(PATTERN):
        p = "backbone.layers.%d." % l
        w[p + "norm.weight"] = np.ones(C, np.float32)
        if ch == "M":
            dt = np.exp(rng.uniform(math.log(0.001), math.log(0.1), MH))
            w[p + "mixer.in_proj.weight"] = lin(di + cd + MH, C)
            w[p + "mixer.conv1d.weight"] = lin(cd, K).reshape(cd, 1, K)
            w[p + "mixer.conv1d.bias"] = np.zeros(cd, np.float32)
            w[p + "mixer.dt_bias"] = (dt + np.log(-np.expm1(-dt))).astype(np.float32)   # softplus^-1
            w[p + "mixer.A_log"] = np.log(np.arange(1, MH + 1, dtype=np.float32))
            w[p + "mixer.D"] = np.ones(MH, np.float32)
            w[p + "mixer.norm.weight"] = np.ones(di, np.float32)
            w[p + "mixer.out_proj.weight"] = lin(C, di)
        elif ch == "*":
            for n, o in (("q", H * D), ("k", KV * D), ("v", KV * D)):
                w[p + "mixer.%s_proj.weight" % n] = lin(o, C)
            w[p + "mixer.o_proj.weight"] = lin(C, H * D)
        elif ch == "E":
            w[p + "mixer.gate.weight"] = lin(E, C)
            w[p + "mixer.gate.e_score_correction_bias"] = np.zeros(E, np.float32)
            w[p + "mixer.fc1_latent_proj.weight"], w[p + "mixer.fc2_latent_proj.weight"] = lin(LT, C), lin(C, LT)
            for e in range(E):
                q = p + "mixer.experts.%d." % e
                w[q + "up_proj.weight"], w[q + "down_proj.weight"] = lin(FE, LT), lin(LT, FE)
            w[p + "mixer.shared_experts.up_proj.weight"] = lin(FS, C)
            w[p + "mixer.shared_experts.down_proj.weight"] = lin(C, FS)
        else:
            w[p + "mixer.up_proj.weight"], w[p + "mixer.down_proj.weight"] = lin(F, C), lin(C, F)
    os.makedirs(out, exist_ok=True)
    save_file(w, os.path.join(out, "model.safetensors"))
    cfg = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": V, "hidden_size": C,
           "intermediate_size": F, "num_hidden_layers": len(PATTERN), "hybrid_override_pattern": PATTERN,
           "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": D, "mamba_num_heads": MH,
           "mamba_head_dim": MP, "ssm_state_size": S, "n_groups": G, "conv_kernel": K, "layer_norm_epsilon": 1e-5,
           "max_position_embeddings": 4096, "tie_word_embeddings": False, "mlp_hidden_act": "relu2",
           "mamba_hidden_act": "silu", "use_conv_bias": True, "time_step_limit": [0.0, float("inf")],
           "chunk_size": 128, "torch_dtype": "float32"}
    if latent:
        cfg.update({"n_routed_experts": E, "num_experts_per_tok": TOPK, "moe_intermediate_size": FE,
                    "moe_shared_expert_intermediate_size": FS, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
                    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "moe_latent_size": LT})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print("wrote %s: %d layers %s, %.1fM parameters" % (out, len(PATTERN), PATTERN,
                                                         sum(v.size for v in w.values()) / 1e6))


if __name__ == "__main__":
    main()
