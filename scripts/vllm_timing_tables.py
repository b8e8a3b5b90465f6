#!/usr/bin/env python3
"""scripts/vllm_timing_tables.py — timing tables measured in vLLM (or TensorRT-LLM) on a
GPU host, converted for `autocompress calibrate --import` (docs/timing-tables.md,
"Measuring vLLM or TensorRT-LLM on a GPU host"). Python 3 standard library only.

  plan   the parent's config.json -> plan.json, one config.json per model to serve (random
         weights: `--load-format dummy`) and, on stdout, the `vllm bench latency` commands
  build  plan.json + the benchmarks' JSON outputs -> the timing-tables import document

Method (repeated blocks): per hidden size, a base model of one block and, per grid entry,
the base block plus COPIES blocks holding only that entry (attention-only or MLP-only
DeciLM blocks). An entry costs (median(model) - median(base)) / COPIES, per phase; the
fixed costs are the base minus its own parts. Each model runs twice: `--output-len 1`
(the prefill) and `--output-len N+1` (the prefill and N decode steps: AutoCompress's
request of N output tokens). It measures nothing itself and needs no GPU.
"""
import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile

PLAN_FORMAT = "autocompress.vllm-plan/1"
TABLES_FORMAT = "autocompress.timing-tables/1"
BYTES_PER_PARAM = {"bf16": 2, "fp16": 2, "fp32": 4}
VLLM_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
GIB = 1 << 30
# How a vLLM version turns CUDA graphs (and torch.compile) off.
EAGER = {"enforce-eager": ["--enforce-eager"], "O0": ["--optimization-level", "0"]}
# The DeciLM config class vLLM and transformers load for "nemotron-nas" (trust_remote_code),
# as storage/export_decilm.c names it.
DECI_AUTO_MAP = {
    "AutoConfig": "nvidia/Llama-3_1-Nemotron-51B-Instruct--configuration_decilm.DeciLMConfig",
    "AutoModelForCausalLM": "nvidia/Llama-3_1-Nemotron-51B-Instruct--modeling_decilm.DeciLMForCausalLM",
}


class Fault(Exception):
    """A user-facing error: printed as `vllm_timing_tables: MESSAGE`, exit status 1."""


def write_json_atomic(path, obj):
    """Writes obj with sorted keys to path through a temporary file, fsync and rename."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise Fault("%s: no such file (%s)" % (path, what))
    except (OSError, ValueError) as e:
        raise Fault("%s: not readable JSON (%s): %s" % (path, what, e))


# ---------- the parent and the grid (as compress/cal_grid.c) ----------

def parse_parent(path):
    """The parent's shape from a Llama-style HF config.json (LlamaForCausalLM, Mistral, Qwen2)."""
    c = load_json(path, "the parent's config.json")
    if not isinstance(c, dict):
        raise Fault("%s: must be a JSON object" % path)
    if c.get("block_configs"):
        raise Fault("%s: a DeciLM (block_configs) config; give the unpruned parent's config.json" % path)
    for k in ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers", "vocab_size"):
        if not isinstance(c.get(k), int) or c[k] <= 0:
            raise Fault("%s: %s must be a positive integer" % (path, k))
    heads = c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or heads
    if heads % kv:
        raise Fault("%s: num_key_value_heads %d does not divide num_attention_heads %d" % (path, kv, heads))
    return {
        "family": "llama",
        "hidden_size": c["hidden_size"],
        "n_heads": heads,
        "n_kv_heads": kv,
        "ffn_dim": c["intermediate_size"],
        "n_layers": c["num_hidden_layers"],
        "vocab_size": c["vocab_size"],
        "head_dim": c.get("head_dim") or c["hidden_size"] // heads,
        "tie_word_embeddings": bool(c.get("tie_word_embeddings", False)),
        "attention_bias": bool(c.get("attention_bias", c.get("model_type") == "qwen2")),
        "max_position_embeddings": c.get("max_position_embeddings", 2048),
        "rms_norm_eps": c.get("rms_norm_eps", 1e-5),
        "rope_theta": c.get("rope_theta", 10000.0),
        "rope_scaling": c.get("rope_scaling"),
        "bos_token_id": c.get("bos_token_id"),
        "eos_token_id": c.get("eos_token_id"),
    }


def grid_attention(H, KV):
    """(heads, kv_heads) for KV groups g = 1..KV, then (k*KV, KV) for k = 1..H/KV."""
    group, out = H // KV, []
    for g in range(1, KV + 1):
        out.append((g * group, g))
    for k in range(1, group + 1):
        if (k * KV, KV) not in out:
            out.append((k * KV, KV))
    return out


def grid_mlp(F, multiple):
    """FFN widths k*F/8 (multiples of 8) and F/32, snapped to `multiple` when it is > 1."""
    low = (F // 32) // 8 * 8
    if low < 8:
        low = F if F < 8 else 8
    out = [low]
    for k in range(1, 9):
        f = F if k == 8 else (F * k // 8) // 8 * 8
        if f > out[-1]:
            out.append(f)
    if multiple > 1:
        out = sorted({f if f == F else max(multiple, round(f / multiple) * multiple) for f in out})
        out = [f for f in out if f <= F]
    return out


def hidden_candidates(C):
    """The hidden sizes a hidden-size search may choose: 4/8..7/8 of C, multiples of 8."""
    out = []
    for j in range(4, 8):
        h = (C * j // 8) // 8 * 8
        if 0 < h < C and h not in out:
            out.append(h)
    return out


# ---------- DeciLM block_configs ----------

def deci_intermediate(ffn_mult, C):
    v = int(2.0 * ffn_mult * C / 3.0)
    return v if v % 256 == 0 else v + 256 - v % 256


def deci_ffn_mult(f, C):
    """ffn_mult that vLLM's nemotron_nas maps back to exactly f, or None (f % 256 != 0)."""
    if f <= 0 or f % 256:
        return None
    m = float("%.6f" % (3.0 * f / (2.0 * C)))
    return m if deci_intermediate(m, C) == f else None


def deci_block(layer, C):
    h, kv, f = layer["n_heads"], layer["n_kv_heads"], layer["ffn_dim"]
    att = {"n_heads_in_group": h // kv if h else None, "no_op": h == 0, "num_sink_tokens": None,
           "replace_with_linear": False, "sparsify": None, "unshifted_sink": False,
           "use_prefill_window_in_sink_attention": False, "window_length": None}
    ffn = {"no_op": f == 0, "replace_with_linear": False, "sparsify": None}
    m = deci_ffn_mult(f, C) if f else None
    if f and m is None:
        ffn["intermediate_size"] = f   # read by vLLM when the block has no ffn_mult
    else:
        ffn["ffn_mult"] = m
    return {"attention": att, "ffn": ffn}


def params(parent, C, layers):
    """Parameter count as engine/arch.c arch_params counts it."""
    V, D = parent["vocab_size"], parent["head_dim"]
    n = V * C * (1 if parent["tie_word_embeddings"] else 2) + C
    for l in layers:
        if l["n_heads"]:
            q, kv = l["n_heads"] * D, l["n_kv_heads"] * D
            n += C + C * q + 2 * C * kv + q * C + ((q + 2 * kv) if parent["attention_bias"] else 0)
        if l["ffn_dim"]:
            n += C + 3 * C * l["ffn_dim"]
    return n


def deci_config(parent, C, heads, layers, dtype, max_pos):
    c = {
        "architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas", "auto_map": DECI_AUTO_MAP,
        "hidden_size": C, "num_hidden_layers": len(layers), "num_attention_heads": heads,
        "head_dim": parent["head_dim"], "vocab_size": parent["vocab_size"], "max_position_embeddings": max_pos,
        "rms_norm_eps": parent["rms_norm_eps"], "rope_theta": parent["rope_theta"],
        "rope_scaling": parent["rope_scaling"], "tie_word_embeddings": parent["tie_word_embeddings"],
        "attention_bias": parent["attention_bias"], "mlp_bias": False, "hidden_act": "silu",
        "torch_dtype": dtype, "use_cache": True, "intermediate_size": None, "num_key_value_heads": None,
        "block_configs": [deci_block(l, C) for l in layers],
    }
    for k in ("bos_token_id", "eos_token_id"):
        if parent[k] is not None:
            c[k] = parent[k]
    return c


# ---------- plan ----------

def layer(h, kv, f):
    return {"n_heads": h, "n_kv_heads": kv, "ffn_dim": f}


def plan_models(parent, hiddens, copies, multiple):
    """The models to serve: per hidden size a base per query-head count (DeciLM fixes the
    query heads of a whole model), one model per grid entry and one of empty blocks."""
    H, KV, F = parent["n_heads"], parent["n_kv_heads"], parent["ffn_dim"]
    attn, mlp = grid_attention(H, KV), grid_mlp(F, multiple)
    models = []
    for C in hiddens:
        main = "c%d_base_h%d" % (C, H)
        bases = {}
        for h, kv in attn:
            bases[h] = (H, KV) if h == H else (h, max(k for hh, k in attn if hh == h))
        for h in sorted(bases):
            models.append({"name": "c%d_base_h%d" % (C, h), "role": "base", "hidden_size": C, "n_heads": h,
                           "layers": [layer(bases[h][0], bases[h][1], F)]})
        for h, kv in attn:
            models.append({"name": "c%d_attn_h%d_kv%d" % (C, h, kv), "role": "attention", "hidden_size": C,
                           "n_heads": h, "entry": {"n_heads": h, "n_kv_heads": kv},
                           "base": "c%d_base_h%d" % (C, h),
                           "layers": [layer(bases[h][0], bases[h][1], F)] + [layer(h, kv, 0)] * copies})
        for f in mlp:
            models.append({"name": "c%d_mlp_f%d" % (C, f), "role": "mlp", "hidden_size": C, "n_heads": H,
                           "entry": {"ffn_dim": f}, "base": main,
                           "layers": [layer(H, KV, F)] + [layer(0, 0, f)] * copies})
        models.append({"name": "c%d_empty" % C, "role": "empty", "hidden_size": C, "n_heads": H, "base": main,
                       "layers": [layer(H, KV, F)] + [layer(0, 0, 0)] * copies})
    return models, attn, mlp


def vllm_command(a, model_dir, out_len, result):
    cmd = ["vllm", "bench", "latency", "--model", model_dir]
    if a.tokenizer:
        cmd += ["--tokenizer", a.tokenizer]
    cmd += ["--load-format", "dummy", "--trust-remote-code", "--dtype", VLLM_DTYPE[a.precision],
            "--input-len", str(a.prompt), "--output-len", str(out_len), "--batch-size", str(a.batch),
            "--num-iters-warmup", str(a.warmup), "--num-iters", str(a.iters)]
    cmd += EAGER[a.eager] + ["--output-json", result]
    return " ".join(shlex.quote(x) for x in cmd)


def cmd_plan(a):
    parent = parse_parent(a.parent)
    if a.precision not in BYTES_PER_PARAM:
        raise Fault("--precision %s: one of %s" % (a.precision, ", ".join(sorted(BYTES_PER_PARAM))))
    if min(a.batch, a.prompt, a.output, a.copies, a.iters) < 1:
        raise Fault("--batch, --prompt, --output, --copies and --iters must be positive")
    C = parent["hidden_size"]
    hiddens = [C]
    for h in (hidden_candidates(C) if a.search_hidden else []) + a.hidden:
        if h <= 0 or h > C or h % 8:
            raise Fault("--hidden %d: a hidden size must be a multiple of 8 in (0, %d]" % (h, C))
        if h not in hiddens:
            hiddens.append(h)
    hiddens.sort(reverse=True)
    if a.tokenizer is None:
        d = os.path.dirname(os.path.abspath(a.parent))
        if any(os.path.exists(os.path.join(d, t)) for t in ("tokenizer.json", "tokenizer.model")):
            a.tokenizer = os.path.dirname(a.parent) or "."
        else:
            print("vllm_timing_tables: no tokenizer beside %s; pass --tokenizer DIR (the planned model "
                  "directories hold only config.json)" % a.parent, file=sys.stderr)
    models_dir = a.models_dir or os.path.join(os.path.dirname(a.out), "models")
    models, attn, mlp = plan_models(parent, hiddens, a.copies, a.ffn_multiple)
    max_pos = max(parent["max_position_embeddings"], a.prompt + a.output + 1)
    odd = sorted({f for f in mlp if deci_ffn_mult(f, C) is None})
    script = ["#!/bin/sh", "# vLLM timing runs planned by scripts/vllm_timing_tables.py (%d models)" % len(models),
              "set -e", "mkdir -p %s" % shlex.quote(a.results_dir)]
    for m in models:
        C_m = m["hidden_size"]
        mdir = os.path.join(models_dir, m["name"])
        cfg = deci_config(parent, C_m, m["n_heads"], m["layers"], VLLM_DTYPE[a.precision], max_pos)
        write_json_atomic(os.path.join(mdir, "config.json"), cfg)
        m["config"] = os.path.join(mdir, "config.json")
        m["block_configs"] = cfg["block_configs"]
        m["params"] = params(parent, C_m, m["layers"])
        m["runs"] = {}
        for phase, out_len in (("prefill", 1), ("full", a.output + 1)):
            result = os.path.join(a.results_dir, "%s.%s.json" % (m["name"], phase))
            m["runs"][phase] = {"output_len": out_len, "result": os.path.basename(result),
                                "command": vllm_command(a, mdir, out_len, result)}
            script.append(m["runs"][phase]["command"])
    plan = {
        "format": PLAN_FORMAT, "engine": "vllm", "parent": parent, "copies": a.copies,
        "target": {"device": a.device, "precision": a.precision,
                   "workload": {"batch_size": a.batch, "prompt_tokens": a.prompt, "output_tokens": a.output}},
        "hidden_sizes": hiddens, "grid": {"attention": [list(x) for x in attn], "mlp": mlp},
        "models_dir": models_dir, "results_dir": a.results_dir, "models": models,
    }
    write_json_atomic(a.out, plan)
    print("\n".join(script))
    print("vllm_timing_tables: %d models (%d runs) for hidden %s; configs in %s, plan %s" %
          (len(models), 2 * len(models), ",".join(map(str, hiddens)), models_dir, a.out), file=sys.stderr)
    if odd:
        print("vllm_timing_tables: note: FFN widths %s have no exact DeciLM ffn_mult (not multiples of "
              "256); their blocks carry intermediate_size, which vLLM's nemotron_nas reads only when the "
              "block has no ffn_mult attribute (--ffn-multiple 256 avoids them)" % ",".join(map(str, odd)),
              file=sys.stderr)
    return 0


# ---------- build ----------

def read_latencies_ms(path):
    """Median and MAD (ms) and sample count of one benchmark output: `vllm bench latency
    --output-json` (avg_latency, latencies: seconds) or `trtllm-bench latency --report_json`
    (performance.request_latency_percentiles_ms.p50 or avg_request_latency_ms: ms)."""
    d = load_json(path, "a benchmark result")
    if not isinstance(d, dict):
        raise Fault("%s: must be a JSON object" % path)
    perf = d.get("performance")
    if "avg_latency" not in d and isinstance(perf, dict):
        pct = perf.get("request_latency_percentiles_ms") or {}
        v = pct.get("p50", perf.get("avg_request_latency_ms"))
        if not isinstance(v, (int, float)) or v <= 0:
            raise Fault("%s: a trtllm-bench report without performance.request_latency_percentiles_ms.p50 "
                        "or performance.avg_request_latency_ms" % path)
        return float(v), 0.0, int((d.get("request_info") or {}).get("num_requests") or 1)
    avg = d.get("avg_latency")
    if not isinstance(avg, (int, float)) or isinstance(avg, bool) or not avg > 0:
        raise Fault("%s: no avg_latency (seconds, > 0): not a `vllm bench latency --output-json` file" % path)
    lat = d.get("latencies")
    if lat is None or lat == []:
        return avg * 1e3, 0.0, 1
    if not isinstance(lat, list) or not all(isinstance(x, (int, float)) and x > 0 for x in lat):
        raise Fault("%s: latencies must be a list of positive numbers (seconds)" % path)
    med = statistics.median(lat)
    mad = statistics.median(abs(x - med) for x in lat)
    return med * 1e3, mad * 1e3, len(lat)


def parse_memory(path, plan):
    m = load_json(path, "the memory file")
    known = {"model", "weights_gib", "activation_peak_gib", "non_torch_gib", "kv_bytes_per_element"}
    if not isinstance(m, dict):
        raise Fault("%s: must be a JSON object" % path)
    for k in m:
        if k not in known:
            raise Fault("%s: unknown key %r (known: %s)" % (path, k, ", ".join(sorted(known))))
    for k in known - {"model"}:
        if k in m and (not isinstance(m[k], (int, float)) or m[k] < 0):
            raise Fault("%s: %s must be a number >= 0" % (path, k))
    if "weights_gib" not in m:
        raise Fault("%s: weights_gib required (vLLM's log: \"Model loading took X GiB\")" % path)
    names = {x["name"]: x for x in plan["models"]}
    name = m.get("model", "c%d_base_h%d" % (plan["parent"]["hidden_size"], plan["parent"]["n_heads"]))
    if name not in names:
        raise Fault("%s: model %r is not in the plan" % (path, name))
    return m, names[name]


def entry_key(C, e):
    k = {"part": "attention" if "n_heads" in e else "mlp", "hidden_size": C}
    k.update(e)
    return k


def cmd_build(a):
    plan = load_json(a.plan, "the plan")
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT:
        raise Fault("%s: not a plan written by `vllm_timing_tables.py plan` (format %s)" % (a.plan, PLAN_FORMAT))
    if len(a.source) > 31 or not a.source:
        raise Fault("--source: 1 to 31 characters (%d given)" % len(a.source))
    results = a.results or plan["results_dir"]
    N, copies, parent = plan["target"]["workload"]["output_tokens"], plan["copies"], plan["parent"]
    S = plan["target"]["workload"]["prompt_tokens"]
    # per model: prefill ms and decode ms per step (medians), their MADs, samples
    meas = {}
    for m in plan["models"]:
        p, pmad, n = read_latencies_ms(os.path.join(results, m["runs"]["prefill"]["result"]))
        t, tmad, _ = read_latencies_ms(os.path.join(results, m["runs"]["full"]["result"]))
        meas[m["name"]] = {"prefill": p, "decode": (t - p) / N, "prefill_mad": pmad,
                           "decode_mad": (tmad + pmad) / N, "samples": n}
    prefill, decode, fixed, clamped = [], [], [], []
    for C in plan["hidden_sizes"]:
        ms = [m for m in plan["models"] if m["hidden_size"] == C]
        block = {}   # name -> per-phase cost of one repeated block
        for m in ms:
            if m["role"] != "base":
                b, r = meas[m["base"]], meas[m["name"]]
                block[m["name"]] = {ph: (r[ph] - b[ph]) / copies for ph in ("prefill", "decode")}
        empty = block["c%d_empty" % C]
        half = {ph: max(0.0, empty[ph]) / 2 for ph in ("prefill", "decode")}   # removed attention = removed MLP
        costs = {}   # key tuple -> {phase: ms}, mads, samples
        for m in ms:
            if m["role"] in ("attention", "mlp"):
                k = tuple(sorted(m["entry"].items()))
                costs[k] = ({ph: block[m["name"]][ph] - half[ph] for ph in ("prefill", "decode")}, m["name"])
        costs[(("n_heads", 0), ("n_kv_heads", 0))] = (dict(half), "c%d_empty" % C)
        costs[(("ffn_dim", 0),)] = (dict(half), "c%d_empty" % C)
        ctx = S + N // 2
        for k, (c, name) in sorted(costs.items()):
            e = entry_key(C, dict(k))
            r = meas[name]
            for ph in ("prefill", "decode"):
                if c[ph] < 0:
                    clamped.append("%s %s %.4g ms" % (name, ph, c[ph]))
            prefill.append(dict(e, ms=max(0.0, c["prefill"]), mad_ms=r["prefill_mad"] / copies,
                                samples=r["samples"]))
            decode.append(dict(e, contexts=[ctx], ms=[max(0.0, c["decode"])],
                               mad_ms=[r["decode_mad"] / copies], samples=r["samples"]))
        base = meas["c%d_base_h%d" % (C, parent["n_heads"])]
        pa = costs[(("n_heads", parent["n_heads"]), ("n_kv_heads", parent["n_kv_heads"]))][0]
        pm = costs[(("ffn_dim", parent["ffn_dim"]),)][0]
        # Embedding, LM head and the engine's own step time are not told apart: all of it is "other".
        fixed.append({"hidden_size": C, "prefill_embedding_ms": 0.0, "prefill_head_ms": 0.0,
                      "prefill_other_ms": base["prefill"] - pa["prefill"] - pm["prefill"],
                      "decode_embedding_ms": 0.0, "decode_head_ms": 0.0,
                      "decode_other_ms": base["decode"] - pa["decode"] - pm["decode"], "workspace_bytes": 0})
    bpp = BYTES_PER_PARAM[plan["target"]["precision"]]
    memory = {"workspace_combine": "max", "weight_bytes_per_param": bpp, "weight_overhead_bytes": 0,
              "kv_bytes_per_element": bpp, "kv_overhead_bytes": 0, "runtime_bytes": 0}
    notes = []
    if a.memory:
        mem, model = parse_memory(a.memory, plan)
        memory["weight_overhead_bytes"] = int(round(mem["weights_gib"] * GIB - bpp * model["params"]))
        memory["kv_bytes_per_element"] = mem.get("kv_bytes_per_element", bpp)
        memory["runtime_bytes"] = int(round(mem.get("non_torch_gib", 0) * GIB))
        for f in fixed:
            f["workspace_bytes"] = int(round(mem.get("activation_peak_gib", 0) * GIB))
        if memory["kv_bytes_per_element"] <= 0:
            raise Fault("%s: kv_bytes_per_element must be positive" % a.memory)
    else:
        notes.append("memory was not measured: weights = %d bytes per parameter (%s), KV at the same width, "
                     "no workspace or runtime buffers (pass --memory FILE from vLLM's log)"
                     % (bpp, plan["target"]["precision"]))
    notes.append("decode entries hold one context each (%d = prompt + output/2): whole-request latencies "
                 "give no per-context slope" % (S + N // 2))
    if clamped:
        notes.append("%d negative part costs (noise) clamped to 0: %s" % (len(clamped), "; ".join(clamped)))
    doc = {
        "format": TABLES_FORMAT, "source": a.source, "target": plan["target"],
        "tables": {
            "shape": {k: parent[k] for k in ("family", "vocab_size", "head_dim", "tie_word_embeddings",
                                             "attention_bias")},
            "prefill": prefill, "decode": decode, "fixed": {"by_hidden": fixed}, "memory": memory,
        },
    }
    write_json_atomic(a.out, doc)
    print("vllm_timing_tables: %s: %d prefill + %d decode entries for hidden %s" %
          (a.out, len(prefill), len(decode), ",".join(map(str, plan["hidden_sizes"]))), file=sys.stderr)
    for n in notes:
        print("vllm_timing_tables: note: " + n, file=sys.stderr)
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog="vllm_timing_tables.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="the models and vllm commands to run on the GPU host")
    p.add_argument("--parent", required=True, help="the parent's HF config.json (Llama-style)")
    p.add_argument("--out", required=True, help="plan.json to write")
    p.add_argument("--copies", type=int, default=8, help="repeated blocks per entry model (default 8)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--output", type=int, default=64, help="output tokens N (runs use --output-len N+1)")
    p.add_argument("--device", default="cuda:0", help="the target's device in the tables (default cuda:0)")
    p.add_argument("--precision", default="bf16", help="bf16 (default), fp16 or fp32")
    p.add_argument("--hidden", type=lambda s: [int(x) for x in s.split(",") if x], default=[],
                   help="extra hidden sizes H1,H2,... beside the parent's")
    p.add_argument("--search-hidden", action="store_true", help="add 4/8..7/8 of the parent's hidden size")
    p.add_argument("--ffn-multiple", type=int, default=1, help="snap FFN grid widths to this multiple (256 "
                   "keeps every width exact in DeciLM's ffn_mult)")
    p.add_argument("--models-dir", help="where each model's config.json goes (default: beside plan.json, models/)")
    p.add_argument("--results-dir", default="results", help="where the vllm commands write (default results)")
    p.add_argument("--tokenizer", help="tokenizer for vLLM (default: the parent's folder when it holds one)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--eager", choices=sorted(EAGER), default="enforce-eager",
                   help="CUDA graphs off with --enforce-eager (default) or, vLLM >= 0.12, --optimization-level 0")
    b = sub.add_parser("build", help="the timing-tables import document from the results")
    b.add_argument("--plan", required=True)
    b.add_argument("--results", help="folder of the benchmark JSON outputs (default: the plan's results_dir)")
    b.add_argument("--out", required=True, help="tables.json to write")
    b.add_argument("--source", default="vllm", help="the document's source, at most 31 characters")
    b.add_argument("--memory", help="JSON of memory figures from vLLM's log (docs/timing-tables.md)")
    a = ap.parse_args(argv)
    try:
        return cmd_plan(a) if a.cmd == "plan" else cmd_build(a)
    except Fault as e:
        print("vllm_timing_tables: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
