"""A random Nemotron-H-shaped checkpoint for the families benchmark, written as the Hub's are
(NemotronHForCausalLM config.json, backbone.* safetensors, conv1d [conv_dim, 1, K]): Nano's
block mix scaled down — 20 layers of which 10 Mamba-2 mixers, 8 squared-ReLU MLPs and 2
attention layers (Nano: 23 M, 23 E, 6 *; its MoE layers are dense MLPs here, Nemotron-H's MoE
not being built), hidden 768, Mamba 24 heads of 64 (d_inner 2 x hidden), state 128, 8 groups,
conv 4; attention 12 query / 2 KV heads of 64; MLP 2048; vocab 32000, untied. 128.6M
parameters. Random weights (std 1/sqrt(fan-in); A_log = log(1..H), dt_bias so that dt starts
near 0.01-0.1 as Mamba initializes it): a shape for timing and the cost model, no quality.
usage: make_hybrid.py OUT_DIR [VOCAB]  (VOCAB 512: stories260K's tokenizer fits, for jobs)"""
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


def main():
    global V
    out = sys.argv[1]
    V = int(sys.argv[2]) if len(sys.argv) > 2 else V
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
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print("wrote %s: %d layers %s, %.1fM parameters" % (out, len(PATTERN), PATTERN,
                                                         sum(v.size for v in w.values()) / 1e6))


if __name__ == "__main__":
    main()
