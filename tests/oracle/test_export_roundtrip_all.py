"""Every export loads back into every subcommand that takes a model, and as a job's parent.

Parents: stories260K (llama2.c .bin + tok512.bin) and SmolLM2-135M (the Q4_1 GGUF from
scripts/fetch-models.sh; a failed fetch fails this test). Each is exported with
`autocompress export --format hf|deci|gguf --dtype fp32`, and `inspect`, `eval`,
`perplexity` and `generate` run on the parent and on every export:
  - inspect: the same parameter count and per-layer arch;
  - eval (arc_easy, 3 items): the same accuracies and every choice's log-likelihood
    within 1e-4 (relative);
  - perplexity (2 chunks of 64 tokens of TinyStories): within 1e-5 relative;
  - generate (greedy): the same text.
stories260K's FFN width (172) is no DeciLM ffn_mult (readers round widths up to multiples
of 256), so `--format deci` must refuse it by name; an arch DeciLM can hold (three of its
layers, MLPs removed: `export --arch`) is exported instead, runs in the four subcommands,
and gives the in-memory pruned model's greedy ids and perplexity (tools/export_interop).
Last, a tiny job (`autocompress run`) takes stories260K's HF export as its parent: it
succeeds, scores the parent, and its own exports carry the tokenizer again.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AC_BIN = os.environ.get("AC_BIN", os.path.join(ROOT, "build", "autocompress"))
INTEROP = os.path.join(os.path.dirname(AC_BIN), "tools", "export_interop")
SHARED = os.environ.get("AC_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
DATA = os.path.join(SHARED, "data")
STORIES = os.path.join(DATA, "models", "stories260K", "stories260K.bin")
TEXT = os.path.join(DATA, "text", "tinystories", "validation_100.txt")
PROMPT = "Once upon a time"
failures = []


class Failed(Exception):
    pass


def run(args, ok=True):
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    if ok and r.returncode != 0:
        raise Failed("%s: %s" % (" ".join(os.path.basename(a) if os.path.isabs(a) else a for a in args[:3]),
                                 r.stderr.strip()[-1000:]))
    return r


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def probe(model, tmp, label, gen_tokens):
    """What the four subcommands say about `model`; None (failure recorded) when one fails."""
    try:
        return probe_or_raise(model, tmp, label, gen_tokens)
    except Failed as e:
        failures.append("%s: %s" % (label, e))
        return None


def probe_or_raise(model, tmp, label, gen_tokens):
    out = {}
    text = run([AC_BIN, "inspect", model]).stdout
    m = re.search(r"^parameters:\s+(\d+)", text, re.M)
    out["params"] = int(m.group(1)) if m else -1
    out["arch"] = json.loads(run([AC_BIN, "inspect", model, "--json"]).stdout)
    ej, sj = os.path.join(tmp, label + ".eval.json"), os.path.join(tmp, label + ".samples.jsonl")
    run([AC_BIN, "eval", model, "--tasks", "arc_easy", "--limit", "3", "--data", DATA,
         "--json", ej, "--log-samples", sj])
    with open(ej) as f:
        out["eval"] = json.load(f)
    with open(sj) as f:
        out["samples"] = sorted((json.loads(x) for x in f), key=lambda s: (s["task"], s["line"]))
    out["ppl"] = json.loads(run([AC_BIN, "perplexity", model, "--text", TEXT, "--ctx", "64", "--chunks", "2",
                                 "--json"]).stdout)["ppl"]
    out["gen"] = run([AC_BIN, "generate", model, "--prompt", PROMPT, "--max-tokens", str(gen_tokens)]).stdout
    for t, r in out["eval"]["tasks"].items():
        check(r.get("ok") and r.get("n") == 3, "%s: eval %s did not score 3 items: %s" % (label, t, r.get("error")))
    return out


def same_json(a, b, rel=1e-6):
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
            abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_json(a[k], b[k], rel) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same_json(x, y, rel) for x, y in zip(a, b))
    return a == b


def compare(parent, got, label):
    if not parent or not got:
        return
    check(got["params"] == parent["params"], "%s: %d parameters, parent %d" % (label, got["params"], parent["params"]))
    check(same_json(got["arch"], parent["arch"]), "%s: inspect --json arch differs from the parent's" % label)
    for t, r in parent["eval"]["accuracy"].items():
        g = got["eval"]["accuracy"].get(t, {})
        check(g.get("acc") == r["acc"] and g.get("acc_norm") == r.get("acc_norm"),
              "%s: %s acc %s/%s, parent %s/%s" % (label, t, g.get("acc"), g.get("acc_norm"), r["acc"], r.get("acc_norm")))
    worst = 0.0
    if check(len(got["samples"]) == len(parent["samples"]), "%s: %d eval samples, parent %d" % (
            label, len(got["samples"]), len(parent["samples"]))):
        for s, p in zip(got["samples"], parent["samples"]):
            for x, y in zip(s["ll"], p["ll"]):
                worst = max(worst, abs(x - y) / max(abs(y), 1e-9))
    check(worst <= 1e-4, "%s: log-likelihoods differ from the parent's by %.3g (relative)" % (label, worst))
    dp = abs(got["ppl"] - parent["ppl"]) / parent["ppl"]
    check(dp <= 1e-5, "%s: perplexity %.6f, parent %.6f" % (label, got["ppl"], parent["ppl"]))
    check(got["gen"] == parent["gen"], "%s: generated %r, parent %r" % (label, got["gen"], parent["gen"]))
    print("%-26s params %d  ppl %.6f (parent %.6f)  max ll rel diff %.2g  greedy %s" % (
        label, got["params"], got["ppl"], parent["ppl"], worst, "same" if got["gen"] == parent["gen"] else "DIFFERENT"))


def export(model, out, fmt, extra=()):
    r = run([AC_BIN, "export", model, "--format", fmt, "--dtype", "fp32", "--out", out] + list(extra), ok=False)
    if not check(r.returncode == 0, "export %s -> %s: %s" % (os.path.basename(model), fmt, r.stderr.strip())):
        return {}
    man = json.loads(r.stdout)
    check(man.get("tokenizer") is True, "export %s -> %s: manifest says tokenizer %s (%s)" % (
        os.path.basename(model), fmt, man.get("tokenizer"), man.get("note")))
    return man


def stories(tmp):
    parent = probe(STORIES, tmp, "stories", 24)
    if not parent:
        return None
    print("%-26s params %d  ppl %.6f  greedy %r" % ("stories260K (parent)", parent["params"], parent["ppl"],
                                                    parent["gen"].strip()))
    hf = os.path.join(tmp, "stories-hf")
    check(export(STORIES, hf, "hf")["class"] == "LlamaForCausalLM", "stories hf: not LlamaForCausalLM")
    compare(parent, probe(hf, tmp, "stories-hf", 24), "stories260K -> hf")
    gg = os.path.join(tmp, "stories.gguf")
    check(export(STORIES, gg, "gguf")["class"] == "llama", "stories gguf: not llama")
    compare(parent, probe(gg, tmp, "stories-gguf", 24), "stories260K -> gguf")
    # DeciLM cannot state FFN width 172: refused with the reason, nothing written.
    refused = os.path.join(tmp, "stories-deci")
    r = run([AC_BIN, "export", STORIES, "--format", "deci", "--dtype", "fp32", "--out", refused], ok=False)
    check(r.returncode != 0 and "ffn_dim 172" in r.stderr and "ffn_mult" in r.stderr and not os.path.exists(refused),
          "stories deci: expected a refusal naming ffn_dim 172 and ffn_mult, got rc %d: %s" % (r.returncode, r.stderr))
    # What DeciLM can hold: layers 0, 1, 3 with their MLPs removed (no_op ffn).
    arch = dict(parent["arch"])
    arch["layers"] = [dict(parent["arch"]["layers"][i], mlp=None) for i in (0, 1, 3)]
    ap = os.path.join(tmp, "attn-only.json")
    with open(ap, "w") as f:
        json.dump(arch, f)
    deci = os.path.join(tmp, "stories-attn-deci")
    check(export(STORIES, deci, "deci", ["--arch", ap])["class"] == "DeciLMForCausalLM", "pruned deci: class")
    got = probe(deci, tmp, "stories-deci", 24)
    if not got:
        return hf
    check(same_json(got["arch"]["layers"], arch["layers"]), "pruned deci: inspect shows %s" % got["arch"]["layers"])
    check(got["params"] < parent["params"] and got["gen"].startswith(PROMPT), "pruned deci: params %d, text %r" % (
        got["params"], got["gen"]))
    ids = os.path.join(tmp, "ids.txt")
    with open(ids, "w") as f:
        f.write("1 403 407 261 378 432 383 286 261 376 298 315 421 395 317 426 " * 4)
    mem = run([INTEROP, STORIES, "--arch", ap, "--greedy", ids, "16", "--ppl", ids, "32", "2"], ok=False).stdout
    back = run([INTEROP, deci, "--greedy", ids, "16", "--ppl", ids, "32", "2"], ok=False).stdout
    check(mem == back, "pruned deci: in-memory %r, reloaded %r" % (mem, back))
    print("%-26s params %d  arch %s  in-memory == reloaded: %s" % (
        "stories260K pruned -> deci", got["params"], "3 layers, MLP removed", mem == back))
    return hf


def smollm2(tmp):
    r = run(["sh", "scripts/fetch-models.sh"], ok=False)
    model = r.stdout.strip()
    if r.returncode != 0 or not os.path.isfile(model):
        raise SystemExit("FAIL: scripts/fetch-models.sh could not provide SmolLM2 (rc %d): %s" % (
            r.returncode, r.stderr.strip()[-500:]))
    parent = probe(model, tmp, "smollm2", 8)
    if not parent:
        return
    print("%-26s params %d  ppl %.6f  greedy %r" % ("SmolLM2-135M Q4_1 (parent)", parent["params"], parent["ppl"],
                                                    parent["gen"].strip()))
    for fmt, cls, out in (("hf", "LlamaForCausalLM", "smollm2-hf"), ("deci", "DeciLMForCausalLM", "smollm2-deci"),
                          ("gguf", "llama", "smollm2.gguf")):
        path = os.path.join(tmp, out)
        check(export(model, path, fmt)["class"] == cls, "smollm2 %s: not %s" % (fmt, cls))
        compare(parent, probe(path, tmp, out, 8), "SmolLM2 -> " + fmt)
        if os.path.isdir(path):
            shutil.rmtree(path)   # 0.5 GB each
        elif os.path.exists(path):
            os.unlink(path)


def job_on_export(tmp, parent_dir):
    spec = {
        "name": "parent-is-an-export",
        "model": {"path": parent_dir},
        "target": {"device": "cpu", "precision": "fp32",
                   "workload": {"batch_size": 1, "prompt_tokens": 16, "output_tokens": 4}},
        "constraints": {"params": 200000},
        "search_space": {"hidden": True, "heads": False, "ffn": False, "depth": False},
        "budgets": {"search_tokens": 1024, "distill_tokens": 1024},
        "data": {"calibration": TEXT, "distillation": TEXT},
        "evaluation": {"tasks": ["arc_easy"], "limit": 3},
        "export": ["hf", "gguf"],
    }
    sp = os.path.join(tmp, "spec.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    out = os.path.join(tmp, "job")
    r = run([AC_BIN, "run", sp, "--out", out], ok=False)
    try:
        job = json.loads(r.stdout)
    except ValueError:
        job = {}
    if not check(r.returncode == 0 and job.get("status") == "succeeded",
                 "job on the HF export: rc %d, %s" % (r.returncode, job.get("error") or r.stderr[-800:])):
        return
    rep = job["report"]
    pacc = rep.get("parent", {}).get("accuracy", {}).get("arc_easy", {})
    check(pacc.get("n") == 3, "job: the parent (an HF export) was not scored: %s" % rep.get("parent"))
    arts = rep.get("export", {}).get("artifacts", [])
    check(len(arts) == 2 and all(a.get("tokenizer") is True for a in arts), "job: exports %s" % arts)
    g = os.path.join(out, "model.gguf")
    check(os.path.isfile(g) and run([AC_BIN, "generate", g, "--prompt", PROMPT, "--max-tokens", "4"], ok=False)
          .stdout.startswith(PROMPT), "job: its model.gguf does not generate")
    print("%-26s succeeded; parent arc_easy acc %s on %s items; result params %s; exports %s" % (
        "job, parent = hf export", pacc.get("acc"), pacc.get("n"), rep.get("result", {}).get("params"),
        ", ".join("%s (tokenizer %s)" % (a["name"], a["tokenizer"]) for a in arts)))


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        hf = stories(tmp)
        t1 = time.time()
        smollm2(tmp)
        t2 = time.time()
        if hf:
            job_on_export(tmp, hf)
        t3 = time.time()
    print("wall: stories %.1f s, SmolLM2 %.1f s, job %.1f s" % (t1 - t0, t2 - t1, t3 - t2))
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
