"""One model resolver behind every entry point (storage/modelio's format probe).

Routes (/v1/jobs, /v1/calibrations, /v1/estimates, /v1/models) and subcommands
(calibrate, estimate, search, prune, distill, eval, export, inspect, generate,
perplexity, run) all take the three formats a user brings: stories260K as a llama2.c
.bin, SmolLM2-135M as a GGUF and an HF directory (stories260K exported by the product).
A file in no model format is refused naming the formats accepted (a 422 on routes),
and a FIFO is refused without being opened. On routes, /etc/passwd, /etc/does-not-exist
and links escaping a root (with and without an existing target) all get the same 403,
so answers say nothing about which files exist outside the roots.

SmolLM2's GGUF goes through the routes and the subcommands that read it once (inspect, generate,
perplexity, eval, export, estimate); calibrate, prune, distill, run and search, minutes each on its
shape on 2 cores, run on stories260K in all three formats (its GGUF written by `export`). The
SmolLM2 job is bench/job/smollm2.sh.
# store: incidental (model formats and paths; not run again in the PostgreSQL pass)
# sanitize: once (58 s under ASan: pipelines other tests sanitize; the format probe is the format tests')
"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import AC_BIN, DATA, MODEL, TEXT, TOK, env, events, server  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def sh(args, ok=True, timeout=300):
    r = subprocess.run([AC_BIN] + args, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **env()))
    if ok and r.returncode != 0:
        raise AssertionError("autocompress %s: exit %d\n%s%s" % (" ".join(args), r.returncode, r.stdout, r.stderr))
    return r


def smollm2():
    path = subprocess.run([os.path.join(ROOT, "scripts", "fetch-models.sh")], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert os.path.getsize(path) > 50 << 20, path
    return path


def check_routes(tmp, models):
    """models: {name: (path, tokenizer or None)}; every path inside the server's roots."""
    s = server(test_stages=True)
    roots = [os.path.dirname(p) for p, _ in models.values()]
    for r in sorted(set(roots)):
        s.args += ["--data-root", r]
    with s:
        d = s.data_dir
        mdir = os.path.join(d, "models")
        not_model = os.path.join(mdir, "notes.txt")
        with open(not_model, "w") as f:
            f.write("not a model\n" * 10)
        fifo = os.path.join(mdir, "pipe.gguf")
        os.mkfifo(fifo)
        os.symlink("/etc/passwd", os.path.join(mdir, "escape.gguf"))
        os.symlink("/etc/does-not-exist", os.path.join(mdir, "dangling.gguf"))
        target = {"device": "cpu", "workload": {"batch_size": 1, "prompt_tokens": 8, "output_tokens": 2}}

        def ref(path, tok):
            r = {"path": path}
            if tok:
                r["tokenizer"] = tok
            return r

        def calls(r):
            """(route, body) for a model reference r, each route in its own request shape."""
            yield "/v1/jobs", {"model": r, "constraints": {"params": 1000}, "target": target,
                               "x_test_pipeline": ["test_sleep"], "x_test_sleep_ms": 1}
            yield "/v1/calibrations", {"model": r, "target": target, "x_test_pipeline": ["test_sleep"],
                                       "x_test_sleep_ms": 1}
            yield "/v1/estimates", {"model": r, "target": target}
            yield "/v1/models", dict(r, name="m")

        for name, (path, tok) in models.items():
            for route, body in calls(ref(path, tok)):
                st, _, doc = s.json("POST", route, body)
                if route == "/v1/estimates":
                    # the shape was read: the answer names the calibration to run
                    assert st == 409 and doc["code"] == "calibration_required" and "cal_" in doc["detail"], \
                        (name, route, st, doc)
                else:
                    assert st in (200, 201, 202), (name, route, st, doc)
                    if route == "/v1/models":
                        assert doc["format"] == {"l2c": "llama2c", "gguf": "gguf", "hf": "hf"}[name], doc
            print("%-5s accepted by every route" % name)

        for bad in (not_model, fifo, os.path.join(mdir, "emptydir")):
            if bad.endswith("emptydir"):
                os.mkdir(bad)
            t0 = time.time()
            for route, body in calls({"path": bad}):
                st, _, doc = s.json("POST", route, body, timeout=10)
                pointer = "/path" if route == "/v1/models" else "/model/path"
                assert st == 422 and doc["errors"][0]["pointer"] == pointer, (route, bad, st, doc)
                msg = doc["errors"][0]["message"]
                assert "accepted:" in msg and "GGUF" in msg and "llama2.c" in msg, (route, msg)
                assert d not in msg, ("the server's own paths are not echoed", msg)
            assert time.time() - t0 < 5, "a FIFO must not be opened"
            print("refused on every route, naming the formats: %s" % os.path.basename(bad))

        for route, _ in calls({}):
            answers = []
            for p in ("/etc/passwd", "/etc/does-not-exist", "models/escape.gguf", "models/dangling.gguf",
                      os.path.join(mdir, "escape.gguf"), os.path.join(mdir, "dangling.gguf")):
                body = dict(next(b for r, b in calls({"path": p}) if r == route))
                st, _, doc = s.json("POST", route, body)
                assert st == 403 and doc["code"] == "path_forbidden", (route, p, st, doc)
                answers.append(json.dumps(doc["errors"]))
            assert len(set(answers)) == 1, ("403 answers differ: they tell which files exist", route, answers)
        print("403 alike for existing, missing and escaping paths on every route")
        # nothing above left a thread blocked on the FIFO: SIGTERM ends the server promptly
        t0 = time.time()
        assert s.stop(timeout=20) == 0 and time.time() - t0 < 15, "the server did not stop promptly"


def check_commands(tmp, models, text):
    dd = os.path.join(tmp, "dd")
    for name, (path, tok) in models.items():
        tk = ["--tokenizer", tok] if tok else []
        out = os.path.join(tmp, "cmd-" + name)
        os.makedirs(out)
        arch = os.path.join(out, "arch.json")
        with open(arch, "w") as f:
            f.write(sh(["inspect", path, "--json"]).stdout)
        assert json.load(open(arch))["layers"], name
        assert "generated" in sh(["generate", path, "--prompt", "Once upon a time", "--max-tokens", "4"] + tk).stderr \
            or sh(["generate", path, "--prompt", "Once", "--max-tokens", "2"] + tk).stdout.strip()
        sh(["perplexity", path, "--text", text, "--ctx", "32", "--chunks", "2"] + tk)
        sh(["eval", path, "--tasks", "arc_easy", "--limit", "2"] + tk)
        sh(["export", path, "--out", os.path.join(out, "x.gguf"), "--format", "gguf", "--dtype", "fp32"])
        own = os.path.join(out, "dd")   # a calibration cache of its own: the first estimate has none
        r = sh(["estimate", "--model", path, "--data-dir", own, "--prompt", "8", "--output", "2"], ok=False)
        assert r.returncode == 1 and "no calibration covers" in r.stderr, (name, r.stderr)
        if name == "gguf":   # SmolLM2: the subcommands below take minutes on it; "gguf-own" runs them on a GGUF
            print("%-8s accepted by inspect, generate, perplexity, eval, export, estimate" % name)
            continue
        sh(["calibrate", "--model", path, "--no-hidden", "--models", "1", "--reps", "1", "--validate", "0", "--fit",
            "0", "--prompt", "8", "--output", "2", "--data-dir", own])
        sh(["estimate", "--model", path, "--data-dir", own, "--prompt", "8", "--output", "2"])
        sh(["prune", path, "--arch", arch, "--out", os.path.join(out, "p"), "--calib", text, "--calib-tokens", "64",
            "--layer-tokens", "0", "--batch", "1", "--seq", "32"] + tk)
        sh(["distill", "--parent", path, "--student", os.path.join(out, "p"), "--data", text, "--tokens", "64",
            "--batch", "1", "--seq", "32", "--out", os.path.join(out, "d")] + tk)
        spec = os.path.join(out, "spec.json")
        with open(spec, "w") as f:
            json.dump({"model": dict({"path": path}, **({"tokenizer": tok} if tok else {})),
                       "constraints": {"params": 1000}, "x_test_pipeline": ["test_sleep"], "x_test_sleep_ms": 1}, f)
        r = subprocess.run([AC_BIN, "run", spec, "--out", os.path.join(out, "run")], capture_output=True, text=True,
                           env=dict(os.environ, AC_TEST_STAGES="1", **env()), timeout=120)
        assert r.returncode == 0 and '"succeeded"' in r.stdout, (name, r.stdout, r.stderr)
        sh(["search", path, "--params", "150000", "--calib", text, "--search-tokens", "256", "--rank-tokens", "256",
            "--axes", "heads,ffn,depth", "--data-dir", dd, "--prompt", "8", "--output", "2"] + tk, timeout=600)
        print("%-5s accepted by every subcommand" % name)

    # a file in no model format: every subcommand says which formats it takes
    arch = os.path.join(tmp, "cmd-l2c", "arch.json")
    bad = text
    for args in (["inspect", bad], ["generate", bad, "--prompt", "x"], ["perplexity", bad, "--text", text],
                 ["eval", bad, "--tasks", "arc_easy", "--limit", "1"], ["export", bad, "--out", tmp + "/b.gguf"],
                 ["estimate", "--model", bad, "--data-dir", dd], ["calibrate", "--model", bad, "--data-dir", dd],
                 ["prune", bad, "--arch", arch, "--out", tmp + "/bp", "--calib", text],
                 ["distill", "--parent", bad, "--student", os.path.join(tmp, "cmd-l2c", "p"), "--data", text,
                  "--tokens", "8", "--out", tmp + "/bd"],
                 ["search", bad, "--params", "1000", "--calib", text, "--data-dir", dd]):
        r = sh(args, ok=False)
        assert r.returncode != 0 and "accepted:" in r.stderr and "GGUF" in r.stderr, (args[0], r.stderr)
    spec = os.path.join(tmp, "bad.json")
    with open(spec, "w") as f:
        json.dump({"model": {"path": bad}, "constraints": {"params": 1000}}, f)
    r = subprocess.run([AC_BIN, "run", spec, "--out", tmp + "/br"], capture_output=True, text=True)
    assert r.returncode == 2 and "/model/path" in r.stderr and "accepted:" in r.stderr, r.stderr
    print("a file in no model format is refused by every subcommand, naming the formats")


def check_default_calibration():
    """A default `autocompress calibrate` and a job with the default target and search
    space share one cached calibration: same id, and the job reuses it."""
    s = server()
    with s:
        r = sh(["calibrate", "--model", MODEL, "--data-dir", s.data_dir, "--json"], timeout=600)
        cal = json.loads(r.stdout)
        assert cal["target"]["workload"] == {"batch_size": 1, "prompt_tokens": 256, "output_tokens": 64}, cal["target"]
        _, _, job = s.json("POST", "/v1/jobs", {"model": {"path": MODEL, "tokenizer": TOK},
                                               "constraints": {"params": 150000},
                                               "data": {"calibration": TEXT}}, expect=201)
        t0, done = time.time(), None
        while time.time() - t0 < 120 and not done:
            done = next((e for e in events(s, job["id"]) if e["type"] == "calibrate.done"), None)
            time.sleep(0.2)
        s.json("POST", "/v1/jobs/%s/cancel" % job["id"], expect=200)
        assert done, "no calibrate.done event"
        assert done["data"]["reused"] is True and done["data"]["calibration_id"] == cal["id"], (done, cal["id"])
        print("a default job reused the default CLI calibration %s" % cal["id"])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        hf = os.path.join(tmp, "stories-hf")
        sh(["export", MODEL, "--out", hf, "--format", "hf", "--dtype", "fp32"])
        models = {"l2c": (MODEL, TOK), "gguf": (smollm2(), None), "hf": (hf, None)}   # the export carries its tokenizer
        check_routes(tmp, models)
        own_gguf = os.path.join(tmp, "stories.gguf")   # stories260K as a GGUF: the full round of subcommands
        sh(["export", MODEL, "--out", own_gguf, "--format", "gguf", "--dtype", "fp32"])
        models["gguf-own"] = (own_gguf, TOK)
        text = os.path.join(tmp, "text.txt")
        with open(TEXT) as f, open(text, "w") as g:
            g.write(f.read()[:20000])
        check_commands(tmp, models, text)
    check_default_calibration()


if __name__ == "__main__":
    main()
