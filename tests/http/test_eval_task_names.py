"""Every benchmark name that openapi.yaml lists for evaluation.tasks is one the server's
spec validation accepts (POST /v1/jobs answers 201) and one the evaluator can load
(`autocompress eval --dump-prompts` writes its items), so that no valid job can fail at
its evaluate stage for want of a loader. SciQ's items, all of them, are also rebuilt
here from Python's csv module and the lm-evaluation-harness template. Uses
$AC_SHARED/data."""
import csv
import json
import os
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(__file__))
from acserver import AC_BIN, Server, test_spec  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SHARED = os.environ.get("AC_SHARED") or os.path.join(ROOT, "..", "shared")
MODEL = os.path.join(SHARED, "data", "models", "stories260K", "stories260K.bin")


def main():
    with open(os.path.join(ROOT, "openapi", "openapi.yaml"), "rb") as f:
        doc = yaml.safe_load(f)
    items = doc["components"]["schemas"]["Evaluation"]["properties"]["tasks"]["items"]["oneOf"]
    names = next(alt["enum"] for alt in items if "enum" in alt)
    assert len(names) >= 10, names

    with Server() as s:
        for name in names:
            st, _, job = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], evaluation={"tasks": [name]}))
            assert st == 201, "spec refused documented task %s: %s" % (name, job)
            s.json("POST", "/v1/jobs/%s/cancel" % job["id"], expect=200)

    with tempfile.TemporaryDirectory(prefix="ac-tasknames-") as tmp:
        for name in names:
            out = os.path.join(tmp, name + ".jsonl")
            p = subprocess.run([AC_BIN, "eval", MODEL, "--tasks", name, "--limit", "2", "--data",
                                os.path.join(SHARED, "data"), "--dump-prompts", out],
                               capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, "no loader for documented task %s: %s%s" % (name, p.stdout, p.stderr)
            with open(out) as f:
                rows = [json.loads(line) for line in f if line.strip()]
            assert rows, "task %s produced no items" % name
        # sciq: every row as sciq.yaml builds it (this data has no distractors, so the
        # gold answer is the one continuation)
        out = os.path.join(tmp, "sciq_all.jsonl")
        subprocess.run([AC_BIN, "eval", MODEL, "--tasks", "sciq", "--data", os.path.join(SHARED, "data"),
                        "--dump-prompts", out], check=True, capture_output=True, timeout=300)
        with open(out) as f:
            got = [json.loads(line) for line in f]
        with open(os.path.join(SHARED, "data", "eval", "sciq", "sciq_test_support.csv"), newline="",
                  encoding="utf-8") as f:
            want = list(csv.DictReader(f))
        assert len(got) == len(want) == 884, (len(got), len(want))
        for g, w in zip(got, want):
            ctx = w["support"].lstrip() + "\nQuestion: " + w["question"] + "\nAnswer:"
            assert g["requests"] == [{"context": ctx, "continuation": " " + w["correct_answer"],
                                      "norm_len": len(w["correct_answer"])}], (g, w)
    print("%d task names: accepted by the spec and loadable; sciq's 884 prompts as the harness's" % len(names))


if __name__ == "__main__":
    main()
