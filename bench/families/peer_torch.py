"""PyTorch eager peer of BUILD/tools/engine_bench --model for the families benchmark: the
same HF directory loaded by transformers 4.40.2 (its own Mixtral / Qwen2-MoE / Llama class,
fp32), the same threads, prefill of 1 x T tokens and decode of 1 token per step after a
128-token prompt through its KV cache. Prints "name value unit" lines like engine_bench
(wall-clock rates; *_cpu beside them). Runs under $AC_TF_PYTHON.
usage: peer_torch.py MODEL_DIR THREADS [--quick]"""
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


def main():
    path, threads, quick = sys.argv[1], int(sys.argv[2]), "--quick" in sys.argv
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    V = model.config.vocab_size
    T = 128 if quick else 512
    ids = (torch.arange(T) * 7919 + 13) % V
    print("peer pytorch %s transformers %s %s" % (torch.__version__, transformers.__version__, type(model).__name__))
    print("threads %d" % torch.get_num_threads())
    with torch.no_grad():
        model(ids[None, :64])   # warm-up
        best = None
        for _ in range(1 if quick else 2):
            w0, c0 = time.perf_counter(), time.process_time()
            model(ids[None, :T], use_cache=False)
            w, c = time.perf_counter() - w0, time.process_time() - c0
            best = (w, c) if best is None or w < best[0] else best
        print("prefill_b1_wall %.1f tok/s (T=%d)" % (T / best[0], T))
        print("prefill_b1_cpu %.1f tok/s" % (T / best[1]))
        steps = 8 if quick else 32
        out = model(ids[None, :128], use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            out = model(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        w, c = time.perf_counter() - w0, time.process_time() - c0
        print("decode_b1_wall %.2f tok/s (prompt 128, %d steps)" % (steps / w, steps))
        print("decode_b1_cpu %.2f tok/s" % (steps / c))


if __name__ == "__main__":
    main()
