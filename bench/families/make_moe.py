"""A random Qwen2-MoE-shaped checkpoint at SmolLM2-135M's dimensions for the llama.cpp target
benchmark (bench/families/llamacpp_job.py), written as the Hub's are (Qwen2MoeForCausalLM
config.json, model.* safetensors): 30 layers, hidden 576, 9 query / 3 KV heads of 64 with
q/k/v biases, every layer an MoE of 8 SwiGLU experts of 128, top 2, not renormalized (as
llama.cpp's qwen2moe computes), and a gated shared expert of 512 (the shape of the MoE made
from SmolLM2 in bench/results/smollm2-moe-cpu.md, which renormalizes its top-k and so cannot
be a qwen2moe GGUF); tied embeddings. Random weights (std 1/sqrt(fan-in)): a shape for
timing and the cost model, no quality.
usage: make_moe.py OUT_DIR [VOCAB]  (VOCAB 512: stories260K's tokenizer fits, for jobs)"""
import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import save_file

V, C, L, H, KV, D = 49152, 576, 30, 9, 3, 64
E, K, FE, FS = 8, 2, 128, 512


def main():
    global V
    out = sys.argv[1]
    V = int(sys.argv[2]) if len(sys.argv) > 2 else V
    rng = np.random.default_rng(2027)

    def lin(o, i):
        return rng.standard_normal((o, i), dtype=np.float32) / np.float32(math.sqrt(i))
    w = {"model.embed_tokens.weight": rng.standard_normal((V, C), dtype=np.float32) * np.float32(0.02),
         "model.norm.weight": np.ones(C, np.float32)}
    for l in range(L):
        p = "model.layers.%d." % l
        w[p + "input_layernorm.weight"] = np.ones(C, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(C, np.float32)
        for n, o in (("q", H * D), ("k", KV * D), ("v", KV * D)):
            w[p + "self_attn.%s_proj.weight" % n] = lin(o, C)
            w[p + "self_attn.%s_proj.bias" % n] = np.zeros(o, np.float32)
        w[p + "self_attn.o_proj.weight"] = lin(C, H * D)
        w[p + "mlp.gate.weight"] = lin(E, C)
        for e in range(E):
            q = p + "mlp.experts.%d." % e
            w[q + "gate_proj.weight"], w[q + "up_proj.weight"], w[q + "down_proj.weight"] = \
                lin(FE, C), lin(FE, C), lin(C, FE)
        q = p + "mlp.shared_expert."
        w[q + "gate_proj.weight"], w[q + "up_proj.weight"], w[q + "down_proj.weight"] = \
            lin(FS, C), lin(FS, C), lin(C, FS)
        w[p + "mlp.shared_expert_gate.weight"] = lin(1, C)
    os.makedirs(out, exist_ok=True)
    save_file(w, os.path.join(out, "model.safetensors"))
    cfg = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "vocab_size": V, "hidden_size": C,
           "intermediate_size": FE, "moe_intermediate_size": FE, "shared_expert_intermediate_size": FS,
           "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV, "num_experts": E,
           "num_experts_per_tok": K, "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
           "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
           "tie_word_embeddings": True, "torch_dtype": "float32"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print("wrote %s: %d layers of %d experts, %.1fM parameters" % (out, L, E, sum(v.size for v in w.values()) / 1e6))


if __name__ == "__main__":
    main()
