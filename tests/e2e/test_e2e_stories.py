"""End to end through HTTP only, on stories260K. An impossible latency limit fails at
rank (right after calibration) within seconds with the cheapest architecture's costs in the error; its report's
parent arch and cached calibration give the parent's predicted latency (POST
/v1/estimates). Job A (AutoCompress, every axis, GGUF export) with a latency limit at 70%
of that succeeds; its report validates against the OpenAPI Report schema and holds every
§10 part (limits predicted/measured/holds, archs, memory, accuracy with stderr, tokens,
stage times, calibration id); the measured latency respects the limit or the report's
`holds` says it does not (measurements under machine load can exceed the prediction:
printed, not hidden); the HTML report renders with inline SVG and no script; each
artifact's sha-256 matches its record and the export manifest. Job C (the Minitron++
baseline: uniform result, HF export) gives the tarball; the exported checkpoint scored
again by `autocompress eval` gives the reported perplexity (within bf16 rounding: exports
are bf16). Job B = job A again, killed with kill -9 (server and worker) in the middle of
distillation: after a restart it resumes at distill from its last checkpoint, completes,
and its model tensors equal job A's. Job D: only the worker killed -9 mid-distillation,
the server (--max-attempts 2) requeues the job, which resumes at distill and ends with the
same model."""
import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from e2e_common import (AC_BIN, MODEL, TOK, artifacts, download, env, events, tar_member,  # noqa: E402
                        report_validator, server, sha256, stories_spec, wait_terminal, worker_pids)
from peak_rss import peak_rss  # noqa: E402

STAGES = ["load", "calibrate", "rank", "search", "prune", "distill", "evaluate", "measure", "export"]


def parent_latency(s, target):
    """An impossible limit first: the job fails within seconds (at rank, as soon as the
    calibration is known) with the cheapest
    architecture's costs in the error. Its load stage put the parent's arch in the report
    and its calibrate stage cached the target's tables, so POST /v1/estimates then gives
    the parent's predicted latency."""
    spec = stories_spec(constraints={"latency_ms": 0.001})
    _, _, job = s.json("POST", "/v1/jobs", spec, expect=201)
    fin = wait_terminal(s, job["id"], 600)
    assert fin["status"] == "failed" and fin["stage"] == "rank", fin
    msg = fin["error"]["message"]
    assert "cheapest" in msg and "latency_ms" in msg, msg
    ev = events(s, job["id"])
    print("infeasible limit: %s; events: %s" % (msg, [(e["type"], e.get("created_at")) for e in ev][-4:]))
    _, _, rep = s.json("GET", "/v1/jobs/%s/report" % job["id"], expect=200)
    assert rep["complete"] is False
    assert all(x["name"] != "search" for x in rep["stages"]), rep["stages"]   # search never completed
    parent = rep["parent"]["arch"]
    _, _, est = s.json("POST", "/v1/estimates", {"arch": parent, "target": target}, expect=200)
    lat = est["predicted"]["latency_ms"]
    assert lat > 0 and est["calibration_id"] == rep["calibration_id"], (est, rep["calibration_id"])
    # the CPU's tables name what they were measured with: the BLAS kernel and how idle threads waited
    with open(os.path.join(s.data_dir, "calibrations", rep["calibration_id"] + ".json")) as f:
        cpu = json.load(f)["cpu"]
    pol, spin = os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT")
    want = " ".join(x for x in ("OMP_WAIT_POLICY=%s" % pol if pol else "",
                                "GOMP_SPINCOUNT=%s" % spin if spin else "") if x) or "default"
    assert cpu["wait_policy"] == want and cpu["blas_kernel"] and "OpenBLAS" in cpu["blas_config"], (cpu, want)
    return lat


def check_report(rep, spec, limit, stages):
    report_validator()(rep)
    assert rep["complete"] is True and rep["status"] == "succeeded", rep["status"]
    assert rep["calibration_id"].startswith("cal_")
    assert rep["method"] == spec["method"] if "method" in spec else rep["method"] == "autocompress"
    assert rep["target"]["workload"]["prompt_tokens"] == 32
    # limits: predicted within the limit; holds says honestly whether the measurement is
    rows = {r["name"]: r for r in rep["limits"]}
    assert set(rows) == {"latency_ms"}, rows
    r = rows["latency_ms"]
    assert abs(r["limit"] - limit) < 1e-9 * limit, r
    assert r["predicted"] is not None and r["holds_predicted"] == (r["predicted"] <= limit), r
    if not (rep["search"].get("served") or {}).get("checks"):
        # unchecked, the prediction decides; a served check judges the measurement instead
        assert r["holds_predicted"] is True, r
    assert r["measured"] is not None and r["measured"] > 0, r
    assert r["holds"] == (r["measured"] <= limit), r
    assert r["predicted"] == rep["result"]["predicted"]["latency_ms"]
    assert r["measured"] == rep["result"]["measured"]["latency_ms"]
    # the machine's load from other work over the measurements: one stretch for both
    hl = rep["result"]["measured"]["host_load"]
    assert hl == rep["parent"]["measured"]["host_load"] and hl["wall_s"] > 0, hl
    busy = (hl["others_cpu_pct"] + hl["steal_pct"]) / 100 * hl["cores"]   # cores other work kept busy
    assert 0 <= hl["others_cpu_pct"] <= 100 and 1 <= hl["threads"] <= hl["cores"], hl
    assert hl["contended"] == (not hl["too_short"] and busy >= hl["cores"] - hl["threads"] + 0.25), hl
    if not r["holds"]:
        print("NOTE: measured latency %.3f ms exceeds the %.3f ms limit (predicted %.3f ms) — the report says "
              "holds=false; the machine is loaded (measured under load, predicted from the calibration)"
              % (r["measured"], limit, r["predicted"]))
    # archs: parent and result per layer; the result is smaller and predicted faster
    p, res = rep["parent"], rep["result"]
    assert len(p["arch"]["layers"]) == 5 and p["params"] == 260032, p["params"]
    assert res["arch"]["layers"] and res["params"] < p["params"], res["params"]
    for l in res["arch"]["layers"]:
        assert 0 <= l["source_layer"] < 5
    assert res["predicted"]["latency_ms"] < p["predicted"]["latency_ms"]
    # memory: itemized vs naive with the measured peak
    m = rep["memory"]
    assert m["itemized"]["total"] == sum(m["itemized"][k] for k in
                                         ("weights", "request_cache", "prefill_workspace", "runtime_buffers"))
    assert m["naive_weights_plus_kv"] > 0 and m["measured_peak"] > 0
    # accuracy per benchmark with stderr, parent and result, and the average
    for side in (p, res):
        assert set(side["accuracy"]) == {"arc_easy", "lambada_openai"}, side["accuracy"]
        for a in side["accuracy"].values():
            assert a["n"] == 10 and 0 <= a["acc"] <= 1 and a["stderr"] >= 0, a
        avg = sum(a["acc"] for a in side["accuracy"].values()) / 2
        assert abs(side["average"] - avg) < 1e-9, (side["average"], avg)
        assert side["perplexity"]["lambada_openai"] > 1
    # tokens and wall times
    sel, budget = rep["search"]["selection_tokens"], spec["budgets"]["search_tokens"]
    if rep["method"] == "autocompress":
        assert sel == budget, rep["search"]
    else:   # the Minitron++ driver spends search_tokens/2 per candidate (reported, not hidden)
        assert sel > 0, rep["search"]
        if sel > budget:
            print("NOTE: minitron spent %d selection tokens for a budget of %d" % (sel, budget))
    assert rep["distillation"]["tokens"] == spec["budgets"]["distill_tokens"], rep["distillation"]
    # the spec's seed (default 1234) drives the search's and the distillation's draws
    assert rep["search"]["seed"] == rep["distillation"]["seed"] == spec.get("seed", 1234), \
        (rep["search"], rep["distillation"])
    d = rep["distillation"]   # the schedule it ran: warm-up to lr, cosine down to lr_min
    assert d["lr"] > d["lr_min"] > 0 and 1 <= d["warmup_steps"] <= d["steps"], d
    # pruning: a distilled job keeps the plain slice unless the spec asks for the
    # reconstruction; reconstructed, every projection of the student is listed, none worse
    pr = rep["pruning"]
    if not spec.get("pruning", {}).get("reconstruct"):
        assert pr == {"reconstruct": False, "method": "slice"}, pr
    else:
        assert pr["reconstruct"] is True and pr["method"] == "least_squares", pr
        n_proj = sum(bool(l.get("attention")) + bool(l.get("mlp")) for l in res["arch"]["layers"])
        outs = [p for p in pr["projections"] if p["proj"] in ("o_proj", "down_proj")]
        assert len(outs) == n_proj and pr["tokens"] > 0 and pr["inputs"] is True, pr
        assert all(p["error_after"] <= p["error_before"] for p in pr["projections"]), pr
        assert any(p["refit"] for p in pr["projections"]), pr
    names = [s["name"] for s in rep["stages"]]
    assert [n for n in names if n in stages] == stages, names
    assert all(s["wall_s"] >= 0 for s in rep["stages"])


def check_html(s, jid):
    st, hd, body = s.request("GET", "/v1/jobs/%s/report.html" % jid)
    assert st == 200 and hd["content-type"].startswith("text/html"), (st, hd)
    html = body.decode()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "<script" not in html.lower() and "javascript:" not in html.lower()
    assert html.count("<svg") >= 4, html.count("<svg")   # FFN, heads, limits, accuracy
    for want in (jid, "latency_ms", "Kept FFN width per layer", "Attention heads per layer",
                 "Accuracy per benchmark", "arc_easy", "Predicted vs measured"):
        assert want in html, want
    st, _, _ = s.request("GET", "/v1/jobs/job_doesnotexist/report.html")
    assert st == 404


def check_artifacts(s, jid, rep, model_name):
    arts = artifacts(s, jid)
    for want in (model_name, "export-manifest.json", "report.json", "timing_tables.json", "eval.json"):
        assert want in arts, sorted(arts)
    _, model = download(s, jid, model_name)
    assert sha256(model) == arts[model_name]["sha256"] and len(model) == arts[model_name]["size_bytes"]
    _, man = download(s, jid, "export-manifest.json")
    assert sha256(man) == arts["export-manifest.json"]["sha256"]
    listed = {a["name"]: a["sha256"] for a in json.loads(man)["artifacts"]}
    assert listed.get(model_name) == arts[model_name]["sha256"], (listed, arts[model_name])
    _, rj = download(s, jid, "report.json")
    stored = json.loads(rj)
    for k in ("limits", "parent", "result", "memory", "search", "distillation", "calibration_id"):
        assert stored[k] == rep[k], k
    return model


def check_reload(tar, rep):
    """The exported HF checkpoint, scored again by the CLI, gives the reported numbers
    (bf16 weights: log-perplexity within 0.05 nats, or 0.5% of it where it is large,
    accuracy within one item of 10). A heavily pruned stories260K scores lambada_openai
    at perplexities of 1e10 and more (log 23 and more): bf16's rounding moves such a
    model's confident wrong logits by more than 0.05 nats (0.059 seen at 4e10)."""
    tmp = tempfile.mkdtemp(prefix="ac-e2e-")
    try:
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            t.extractall(tmp)
        root = [d for d in os.listdir(tmp) if os.path.isdir(os.path.join(tmp, d))][0]
        with open(os.path.join(tmp, root, "config.json")) as f:
            cfg = json.load(f)
        assert cfg["num_hidden_layers"] == len(rep["result"]["arch"]["layers"]), cfg
        out = os.path.join(tmp, "eval.json")
        e = dict(os.environ)
        e.update(env())
        subprocess.run([AC_BIN, "eval", os.path.join(tmp, root), "--tokenizer", TOK, "--tasks",
                        "arc_easy,lambada_openai", "--limit", "10", "--seed", "1234", "--json", out],
                       check=True, env=e, stdout=subprocess.DEVNULL, timeout=300)
        with open(out) as f:
            ev = json.load(f)
        want = rep["result"]["perplexity"]["lambada_openai"]
        got = ev["perplexity"]["lambada_openai"]
        assert abs(math.log(got) - math.log(want)) < max(0.05, 0.005 * math.log(want)), (got, want)
        for k, a in rep["result"]["accuracy"].items():
            assert abs(ev["accuracy"][k]["acc"] - a["acc"]) <= 0.1 + 1e-9, (k, ev["accuracy"][k], a)
        print("exported HF model reloaded: lambada perplexity %.6g (report %.6g, bf16 export)" % (got, want))
        # the peak memory the report measured holds where the user serves: a fresh generate
        # process on the download (a context the report's workload fits in) peaks no higher
        # (not under the sanitizers, whose shadow memory and quarantine grow with each
        # process's own allocations)
        served = peak_rss([AC_BIN, "generate", os.path.join(tmp, root), "--tokenizer", TOK, "--prompt",
                           "Once upon a time", "--max-tokens", "400"], e)
        measured = rep["result"]["measured"]["peak_memory_bytes"]
        print("served peak RSS %.1f MiB, reported %.1f MiB" % (served / 2**20, measured / 2**20))
        if os.environ.get("AC_SANITIZED") != "1":
            assert measured >= 0.9 * served, (measured, served)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def distill_step(s, jid):
    steps = [e["data"]["step"] for e in events(s, jid)
             if e["type"] == "distill.progress" and isinstance(e.get("data"), dict)]
    return max(steps) if steps else 0


def main():
    target = {"device": "cpu", "precision": "fp32",
              "workload": {"batch_size": 1, "prompt_tokens": 32, "output_tokens": 8}}
    s = server()
    s.args += ["--max-attempts", "2"]   # a killed worker's job resumes instead of failing (job D)
    try:
        s.start()
        lat = parent_latency(s, target)
        limit = round(0.7 * lat, 6)

        # --- job A: the product path (AutoCompress over every axis). Its per-layer result
        # is not exported: the exporters cannot yet represent every arch the search picks
        # (GGUF: no attention-only layers, attention in layer 0; HF: uniform layers;
        # DeciLM: FFN widths on the ffn_mult grid, which stories260K's 172 is not).
        # Half the parent's predicted latency: the search anchors the tables to the parent as
        # served at the job's start, and at a looser limit a machine that has sped up since
        # the calibration (a test suite's neighbours come and go) finds the parent within it.
        limit_a = round(0.5 * lat, 6)
        spec = stories_spec(constraints={"latency_ms": limit_a, "margin_pct": 10}, export=[],
                            pruning={"reconstruct": True}, seed=7)
        t0 = time.time()
        _, _, job = s.json("POST", "/v1/jobs", spec, expect=201)
        fin = wait_terminal(s, job["id"], 900)
        assert fin["status"] == "succeeded", fin
        assert "export" not in fin["stages"], fin["stages"]
        print("job A: %.0f s, parent predicted %.3f ms, limit %.3f ms" % (time.time() - t0, lat, limit_a))
        _, _, rep = s.json("GET", "/v1/jobs/%s/report" % job["id"], expect=200)
        check_report(rep, spec, limit_a, STAGES[:-1])
        layer_events = [e for e in events(s, job["id"]) if e["type"] == "prune.reconstruct.layer"]
        assert [e["data"]["layer"] for e in layer_events] == list(range(len(rep["result"]["arch"]["layers"]))), \
            layer_events
        # margin_pct 10: the search aimed 10% under the limit; the report checks the limit itself
        assert rep["limits"][0]["limit"] == limit_a, rep["limits"]
        aim = rep["search"]["aim"]
        assert aim["source"] == "spec" and aim["margin"]["latency_pct"] == 10, aim
        assert abs(rep["limits"][0]["aimed"] - 0.9 * limit_a) < 1e-9 * limit_a, rep["limits"]
        # the search anchored the tables to the parent served in the built-in engine then
        # (each phase by measured over predicted; no parent bias in a built-in calibration),
        # and served what it settled on beside the parent before returning it
        sv = rep["search"]["served"]
        an = sv["anchor"]
        assert an["engine"] == "autocompress" and an["parent_bias"] == {"prefill": 1, "decode": 1}, an
        assert abs(an["decode_scale"] - an["parent_measured_decode_ms"] / an["parent_predicted_decode_ms"]) < \
            1e-6 * an["decode_scale"], an
        types = [e["type"] for e in events(s, job["id"])]
        assert "search.anchor" in types, types
        assert ("measure.contended" in types) == rep["result"]["measured"]["host_load"]["contended"], types
        for x in [an] + sv["checks"]:   # each serving records the machine's load from other work
            assert x["host_load"]["wall_s"] > 0 and 0 <= x["host_load"].get("others_cpu_pct", 0) <= 100, x
        _, sj = download(s, job["id"], "search.json")
        sj = json.loads(sj)
        assert sv["checks"], sv   # the parent does not meet the limit: what DNAS settled on was served
        assert "search.check" in types and sj["checks"]["served"] == len(sv["checks"]), (types, sj["checks"])
        for c in sv["checks"]:   # priced at the anchor's level: the median ratio times the parent's
            assert len(c["process_latencies_ms"]) == len(c["parent_process_latencies_ms"]) == 3, c
            assert abs(c["latency_ms"] - c["ratio_to_parent"] * an["parent_measured_ms"]) < 1e-6 * c["latency_ms"]
        served_limit = limit_a * (1 - aim["margin"]["served_pct"] / 100)
        if sj["checks"]["last_within"]:   # the result is an arch measured within, less the spread
            row = [c for c in sv["checks"] if c["arch"] == sj["summary"]]
            assert row and row[-1]["latency_ms"] <= 0.99 * served_limit * (1 + 1e-9), (row, served_limit)
        print("job A: %d served checks: %s" % (len(sv["checks"]), [(round(c["predicted_latency_ms"], 3),
                                                                   round(c["latency_ms"], 3)) for c in sv["checks"]]))
        check_html(s, job["id"])
        arts = artifacts(s, job["id"])
        _, rj = download(s, job["id"], "report.json")
        assert sha256(rj) == arts["report.json"]["sha256"]
        lim = rep["limits"][0]
        print("job A latency: limit %.3f predicted %.3f measured %.3f holds=%s; %s -> %s params; %s" %
              (lim["limit"], lim["predicted"], lim["measured"], lim["holds"], rep["parent"]["params"],
               rep["result"]["params"], [(l["source_layer"], (l["attention"] or {}).get("n_heads"),
                                          (l["mlp"] or {}).get("ffn_dim")) for l in rep["result"]["arch"]["layers"]]))

        # --- job C: the uniform Minitron++ baseline, exported as an HF tarball that reloads.
        # Its parent is a fresh copy of A's (another path, a new mtime): the ranking and
        # the parent's scores are keyed by content, so C still reuses A's.
        copy_dir = os.path.join(s.data_dir, "models", "copy")
        os.makedirs(copy_dir, exist_ok=True)
        parent_copy = os.path.join(copy_dir, "stories260K.bin")
        shutil.copyfile(MODEL, parent_copy)
        # served_check false: the tables as calibrated decide, so job B and D (this spec again)
        # choose C's arch whatever the machine's speed at their start, and their resumed
        # models can be compared with C's byte for byte
        spec_c = stories_spec(model={"path": parent_copy, "tokenizer": TOK},
                              constraints={"latency_ms": limit, "served_check": False}, method="minitron", export=["hf"],
                              evaluation={"tasks": ["arc_easy", "lambada_openai"], "limit": 10, "seed": 1234,
                                          "pruned": True})
        _, _, jc = s.json("POST", "/v1/jobs", spec_c, expect=201)
        fin = wait_terminal(s, jc["id"], 900)
        assert fin["status"] == "succeeded", fin
        _, _, rep_c = s.json("GET", "/v1/jobs/%s/report" % jc["id"], expect=200)
        check_report(rep_c, spec_c, limit, STAGES)
        assert "served" not in rep_c["search"] and "search.anchor" not in [e["type"] for e in events(s, jc["id"])]
        # no margin_pct: the search aims under the limit by the largest latency error the
        # job's calibration measured on its held-out archs (or at the limit itself when
        # only the limit leaves an arch, and the report says so)
        aim, val = rep_c["search"]["aim"], rep_c["calibration_validation"]
        assert isinstance(val["host_load"]["contended"], bool), val   # how busy the machine was calibrating
        row = rep_c["limits"][0]
        if aim["source"] == "calibration":
            assert abs(aim["margin"]["latency_pct"] - min(val["latency_max_pct"], 50)) < 1e-9, (aim, val)
            assert aim["margin"]["memory_pct"] == min(val["memory_max_pct"], 50), (aim, val)
        else:
            assert aim["source"].startswith("none: no arch") and aim["margin"]["latency_pct"] == 0, aim
        assert abs(row["aimed"] - limit * (1 - aim["margin"]["latency_pct"] / 100)) < 1e-9 * limit, (row, aim)
        assert row["predicted"] <= row["aimed"] * (1 + 1e-9), row
        print("job C aim: %s" % aim)
        # the parent was scored once, by job A; job C reads the same scores from the cache
        ev_a, ev_c = [e["type"] for e in events(s, job["id"])], [e["type"] for e in events(s, jc["id"])]
        assert "evaluate.parent_reused" not in ev_a and "evaluate.parent_reused" in ev_c, (ev_a, ev_c)
        # and ranks it once: same parent content and calibration text
        assert "rank.reused" not in ev_a and "rank.reused" in ev_c, (ev_a, ev_c)
        ra, rc = rep["ranking"], rep_c["ranking"]   # C's from ranking.json (10 significant digits)
        assert ra["layer_order"] == rc["layer_order"] and ra["tokens"] == rc["tokens"], (ra, rc)
        assert all(abs(x - y) <= 1e-8 * abs(x) for x, y in zip(ra["layer_skip_loss"], rc["layer_skip_loss"])), (ra, rc)
        assert rep_c["parent"]["accuracy"] == rep["parent"]["accuracy"], (rep_c["parent"], rep["parent"])
        # evaluation.pruned: the pruned-only student scored on the same items, a different model
        pr, res = rep_c["pruned"], rep_c["result"]
        assert sorted(pr["accuracy"]) == sorted(res["accuracy"]) == ["arc_easy", "lambada_openai"], pr
        assert all(pr["accuracy"][t]["n"] == 10 for t in pr["accuracy"]), pr
        assert pr["perplexity"] != res["perplexity"], (pr, res)
        _, _, html_c = s.request("GET", "/v1/jobs/%s/report.html" % jc["id"])
        assert "<th>pruned only</th>" in html_c.decode(), "report.html lacks the pruned-only column"
        _, _, html_a = s.request("GET", "/v1/jobs/%s/report.html" % job["id"])
        assert "pruned only" not in html_a.decode()
        print("job C: perplexity pruned only %s, distilled %s, parent %s"
              % (pr["perplexity"], res["perplexity"], rep_c["parent"]["perplexity"]))
        tar_c = check_artifacts(s, jc["id"], rep_c, "model-hf.tar")
        check_reload(tar_c, rep_c)

        # --- job B: job C again, killed -9 in the middle of distillation, resumed after a restart
        _, _, jb = s.json("POST", "/v1/jobs", spec_c, expect=201)
        t1 = time.time()
        while distill_step(s, jb["id"]) < 12:   # checkpoints every 5 steps of 32
            _, _, j = s.json("GET", "/v1/jobs/%s" % jb["id"], expect=200)
            assert j["status"] in ("queued", "running"), j
            assert time.time() - t1 < 900, "job B never reached distill step 12"
            time.sleep(0.05)
        pids = worker_pids(jb["id"])
        assert len(pids) == 1, pids
        killed_at = distill_step(s, jb["id"])   # a lower bound: a step may finish before the kill lands
        s.kill9()
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        s.restart()
        fin = wait_terminal(s, jb["id"], 900)
        assert fin["status"] == "succeeded", fin
        _, _, rb = s.json("GET", "/v1/jobs/%s/report" % jb["id"], expect=200)
        report_validator()(rb)
        d = rb["distillation"]
        # resumed from the last checkpoint (every 5 steps) at or after the step seen before the kill
        assert killed_at // 5 * 5 <= d["resumed_from_step"] < 32, (d, killed_at)
        attempts = [st.get("attempt", 1) for st in rb["stages"] if st["name"] == "distill"]
        assert max(attempts) >= 2, rb["stages"]
        for st in rb["stages"]:   # stages before distill were not run again
            if st["name"] in ("load", "calibrate", "rank", "search", "prune"):
                assert st.get("attempt", 1) == 1, st
        _, tar_b = download(s, jb["id"], "model-hf.tar")
        assert sha256(tar_member(tar_b, "model.safetensors")) == sha256(tar_member(tar_c, "model.safetensors")), \
            "the resumed job's model differs from the uninterrupted run's"
        assert rb["result"]["perplexity"] == rep_c["result"]["perplexity"]
        print("job B: killed at distill step >= %d, resumed from step %d, model.safetensors equal to job C's"
              % (killed_at, d["resumed_from_step"]))

        # --- job D: job C again, only its worker killed -9 mid-distillation while the server
        # lives on: with --max-attempts 2 the server requeues it, it resumes at distill from
        # the last checkpoint, and its model equals the uninterrupted run's
        _, _, jd = s.json("POST", "/v1/jobs", spec_c, expect=201)
        t1 = time.time()
        while distill_step(s, jd["id"]) < 12:
            _, _, j = s.json("GET", "/v1/jobs/%s" % jd["id"], expect=200)
            assert j["status"] in ("queued", "running"), j
            assert time.time() - t1 < 900, "job D never reached distill step 12"
            time.sleep(0.05)
        pids = worker_pids(jd["id"])
        assert len(pids) == 1, pids
        killed_at = distill_step(s, jd["id"])
        os.kill(pids[0], signal.SIGKILL)
        fin = wait_terminal(s, jd["id"], 900)
        assert fin["status"] == "succeeded", fin
        ev = events(s, jd["id"])
        assert any("SIGKILL" in e["message"] and "requeued" in e["message"] for e in ev), [e["message"] for e in ev]
        _, _, rd = s.json("GET", "/v1/jobs/%s/report" % jd["id"], expect=200)
        assert killed_at // 5 * 5 <= rd["distillation"]["resumed_from_step"] < 32, (rd["distillation"], killed_at)
        _, tar_d = download(s, jd["id"], "model-hf.tar")
        assert sha256(tar_member(tar_d, "model.safetensors")) == sha256(tar_member(tar_c, "model.safetensors")), \
            "the job resumed after a worker kill differs from the uninterrupted run"
        print("job D: worker killed at distill step >= %d, requeued, resumed from step %d, same model"
              % (killed_at, rd["distillation"]["resumed_from_step"]))
        assert s.stop() == 0
    finally:
        s.cleanup()
    print("ok")


if __name__ == "__main__":
    main()
