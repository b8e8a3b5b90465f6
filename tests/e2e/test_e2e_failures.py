"""End to end through HTTP only: how real jobs end when they cannot succeed.
A stories260K job cancelled during search (DNAS, or a Minitron++ candidate's trial
distillation) is `cancelled` within 2 s, leaves no worker
process, and lists no artifact of the interrupted stage (only those of stages that
completed). A parent that is not a supported family (an HF directory of a GPT-2 model)
fails at `load` with the reason. A job whose limits cannot be met fails as soon as the
calibration is known (at the start of `rank`, before any model work) with the cheapest
architecture's costs in the error, within seconds. (The infeasible
case is also covered by test_e2e_stories.py, which uses it to find the parent's latency.)
A parent scored while one of its tasks could not be read (its file gone after the POST)
is not kept for later jobs: the next job with that task scores the parent again."""
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import artifacts, events, server, stories_spec, wait_terminal, worker_pids  # noqa: E402


def cancel_during_search(s, method):
    spec = stories_spec(budgets={"search_tokens": 50_000_000, "distill_tokens": 16384}, method=method)
    _, _, job = s.json("POST", "/v1/jobs", spec, expect=201)
    jid = job["id"]
    s.wait_stage(jid, "search", timeout=600)
    # let the search make progress (its supernet is built and iterating; or, for Minitron++,
    # its first candidate's trial distils 25M tokens, which it says nothing of until done)
    t0 = time.time()
    while method == "autocompress" and not any(e["type"].startswith("search.") for e in events(s, jid)):
        assert time.time() - t0 < 120, "no search event"
        time.sleep(0.1)
    if method == "minitron":
        time.sleep(1.5)
    pids = worker_pids(jid)
    assert len(pids) == 1, pids
    t_cancel = time.time()
    st, _, _ = s.json("POST", "/v1/jobs/%s/cancel" % jid)
    assert st in (200, 202), st
    fin = s.wait_status(jid, ("cancelled", "failed", "succeeded"), timeout=10)
    dt = time.time() - t_cancel
    assert fin["status"] == "cancelled", fin
    assert dt <= 2.0, "cancel took %.2f s" % dt
    t1 = time.time()
    while worker_pids(jid) and time.time() - t1 < 2:
        time.sleep(0.05)
    assert worker_pids(jid) == [], "a worker is still running after cancel: %s" % worker_pids(jid)
    for p in pids:
        assert process_gone(p), "worker %d is still alive after cancel" % p
    arts = artifacts(s, jid)
    stages = {a["stage"] for a in arts.values()}
    assert "search" not in stages and "search.json" not in arts, arts
    assert stages <= {"calibrate", "rank"}, stages   # only completed stages' artifacts
    _, _, rep = s.json("GET", "/v1/jobs/%s/report" % jid, expect=200)
    assert rep["status"] == "cancelled" and rep["complete"] is False
    assert "search" not in [x["name"] for x in rep["stages"]], rep["stages"]
    st, hd, html = s.request("GET", "/v1/jobs/%s/report.html" % jid)
    assert st == 200 and hd["content-type"].startswith("text/html"), (st, hd)
    assert b"partial report" in html and b"cancelled" in html and b"<script" not in html
    # a job cancelled before its result: the result's layers are a dash, not 0
    assert re.search(rb"layers: \d+ &rarr; &mdash;", html), re.findall(rb"layers: [^<]*", html)
    # the page loads nothing and runs nothing, and says so
    assert hd["content-security-policy"].startswith("default-src 'none'"), hd
    assert hd["x-content-type-options"] == "nosniff", hd
    print("cancel during search: cancelled in %.2f s, artifacts %s" % (dt, sorted(arts)))


def process_gone(pid):
    """True when pid has exited: no /proc entry, or a zombie waiting to be reaped. The entry can go
    between any two reads (its parent reaps it), so a vanished file counts as gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def unsupported_family(s):
    d = os.path.join(s.data_dir, "models", "gpt2-tiny")
    os.makedirs(d, exist_ok=True)
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 512, "n_embd": 64,
           "n_layer": 2, "n_head": 4, "n_positions": 128}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    hdr = json.dumps({"__metadata__": {"format": "pt"}}).encode()
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(len(hdr).to_bytes(8, "little") + hdr)
    spec = stories_spec()
    spec["model"] = {"path": "models/gpt2-tiny"}
    st, _, doc = s.json("POST", "/v1/jobs", spec)
    assert st == 201, "the spec validator should accept a readable model directory: %s %s" % (st, doc)
    fin = wait_terminal(s, doc["id"], 120)
    assert fin["status"] == "failed" and fin["stage"] == "load", fin
    msg = fin["error"]["message"]
    assert "GPT2LMHeadModel" in msg and "not supported" in msg and "LlamaForCausalLM" in msg, msg
    print("unsupported family: %s" % msg)


def infeasible(s):
    spec = stories_spec(constraints={"params": 1000})   # the embeddings alone are 32768
    _, _, job = s.json("POST", "/v1/jobs", spec, expect=201)
    fin = wait_terminal(s, job["id"], 600)
    assert fin["status"] == "failed" and fin["stage"] == "rank", fin
    msg = fin["error"]["message"]
    assert "cheapest" in msg and "params" in msg, msg
    ev = events(s, job["id"])
    start = [e for e in ev if e["type"] == "stage.started" and "rank" in e["message"]]
    assert start, [e["type"] for e in ev]
    assert ev[-1]["type"] == "job.failed"
    assert ev[-1]["created_at"] - start[-1]["created_at"] <= 5, (start[-1], ev[-1])
    print("infeasible: %s" % msg)


def parent_scores_with_a_failed_task(s):
    task = os.path.join(s.data_dir, "models", "mine.jsonl")
    with open(task, "w") as f:
        for i in range(10):
            f.write(json.dumps({"context": "Once upon a time there was a", "choices": [" cat", " dog", " tree"],
                                "gold": i % 3}) + "\n")
    spec = stories_spec(evaluation={"tasks": [{"name": "mine", "path": task}], "limit": 10, "seed": 1234})
    _, _, job = s.json("POST", "/v1/jobs", spec, expect=201)
    os.rename(task, task + ".away")   # after the spec check, long before the evaluate stage
    fin = wait_terminal(s, job["id"], 600)
    os.rename(task + ".away", task)
    kinds = [e["type"] for e in events(s, job["id"])]
    assert "evaluate.task_failed" in kinds, (fin, kinds)
    _, _, again = s.json("POST", "/v1/jobs", spec, expect=201)
    fin = wait_terminal(s, again["id"], 600)
    assert fin["status"] == "succeeded", fin
    kinds = [e["type"] for e in events(s, again["id"])]
    assert "evaluate.parent_reused" not in kinds, kinds
    _, _, rep = s.json("GET", "/v1/jobs/%s/report" % again["id"], expect=200)
    assert "mine" in rep["parent"]["accuracy"], rep["parent"]
    print("ok: a parent run with a failed task was not cached; the next job scored the parent again")


def main():
    s = server()
    try:
        s.start()
        unsupported_family(s)
        infeasible(s)
        parent_scores_with_a_failed_task(s)
        cancel_during_search(s, "autocompress")
        cancel_during_search(s, "minitron")   # within a candidate's trial distillation
        assert s.stop() == 0
    finally:
        s.cleanup()
    print("ok")


if __name__ == "__main__":
    main()
