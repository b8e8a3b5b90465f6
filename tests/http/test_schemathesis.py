# tier: slow (Schemathesis from PyPI; two bounded runs of about 2 minutes each)
"""Property-based contract test: Schemathesis, every check, against a production server
(AC_TEST_STAGES unset) that reads its contract from /openapi.yaml: once open, once with
a tokens file (requests carry a read,write token). It must find nothing: no failure of
any check, no error. The number of cases each run generated is printed.

The server's data roots hold what the contract's examples name (a llama2.c checkpoint in
the smallest shape the model probe takes, the stories260K tokenizer, a text file), so
jobs, calibrations and models can really be created and the stateful phase follows them.
Model downloads by URL go through a proxy on a closed loopback port (https_proxy), so
nothing the fuzzer writes leaves the machine. Budget: AC_SCHEMATHESIS_TIME seconds per
run (default 90), one worker; AC_SCHEMATHESIS_SEED fixes the seed (default a fixed one,
so that a failure reproduces); reports go to AC_SCHEMATHESIS_REPORT when set.

One setting is not Schemathesis' default: positive_data_acceptance also expects 422 and
416. The contract never answers 400 to a request its schemas allow; it answers 422 to one
they allow but the server cannot act on (a path that does not exist, an id that is not
registered, a limit no arch meets) and 416 to a Range past the artifact's end. A schema
cannot say which files exist or how long an artifact is, so these are correct answers to
schema-valid data, while a 400 for it is still a failure (tests/http/test_contract_edges.py
keeps each one found)."""
import glob
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from acserver import Server, write_tiny_l2c  # noqa: E402

ST = os.path.join(os.path.dirname(sys.executable), "schemathesis")
if not os.path.exists(ST):  # first run in a fresh venv: install it (PyPI, the ordinary client)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "schemathesis"], check=True)

TOKEN = "w" * 8 + "-schemathesis-write-0123"
TIME_S = int(os.environ.get("AC_SCHEMATHESIS_TIME", "90"))
SEED = os.environ.get("AC_SCHEMATHESIS_SEED", "20261201")
CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "416", "422", "429", "5xx"]
"""


def populate(data_dir):
    """The files the contract's examples name, under the default data roots."""
    models = os.path.join(data_dir, "models", "stories260K")
    os.makedirs(models, exist_ok=True)
    write_tiny_l2c(os.path.join(models, "stories260K.bin"))
    shared = os.environ.get("AC_SHARED", "")
    tok = os.path.join(shared, "data", "models", "stories260K", "tok512.bin")
    if os.path.isfile(tok):
        shutil.copyfile(tok, os.path.join(models, "tok512.bin"))
    else:  # a llama2.c tokenizer with one piece: enough to exist and be a regular file
        with open(os.path.join(models, "tok512.bin"), "wb") as f:
            f.write((1).to_bytes(4, "little") + b"\0\0\0\0" + (1).to_bytes(4, "little") + b"a")
    text = os.path.join(data_dir, "data", "tinystories")
    os.makedirs(text, exist_ok=True)
    with open(os.path.join(text, "validation_100.txt"), "w") as f:
        f.write("Once upon a time there was a little girl who liked to play outside.\n" * 20)


def run(name, server, extra):
    tmp = os.path.join(server.tmp, "st-" + name)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "schemathesis.toml"), "w") as f:
        f.write(CONFIG)
    report = os.path.join(tmp, "report")
    base = "http://127.0.0.1:%d" % server.port
    cmd = [ST, "--no-color", "--config-file", os.path.join(tmp, "schemathesis.toml"), "run", base + "/openapi.yaml",
           "--url", base, "--checks", "all", "--workers", "1", "--max-time", str(TIME_S), "--seed", SEED,
           "--request-timeout", "70", "--generation-database", "none", "--report", "json,junit",
           "--report-dir", report, "--output-truncate", "false"] + extra
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=TIME_S + 240)
    keep = os.environ.get("AC_SCHEMATHESIS_REPORT")
    if keep:
        dst = os.path.join(keep, name)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(report, dst)
        with open(os.path.join(dst, "output.txt"), "w") as f:
            f.write(p.stdout + p.stderr)
    paths = glob.glob(os.path.join(report, "*.json"))
    if not paths:
        sys.stdout.write(p.stdout[-20000:] + p.stderr[-5000:])
        raise AssertionError("%s: schemathesis wrote no report (exit %d)" % (name, p.returncode))
    with open(paths[0]) as f:
        rep = json.load(f)
    cases = rep["test_cases"]
    summary = "%s: %d cases generated, %d with failures, %d errored; phases %s; %.0f s" % (
        name, cases["generated"], cases["with_failures"], cases["errored"],
        ", ".join("%s %s" % (k, v["status"]) for k, v in rep["phases"].items()), rep["running_time"])
    if p.returncode != 0 or rep["failures"] or rep["errors"] or cases["with_failures"] or cases["errored"]:
        sys.stdout.write(p.stdout[-30000:] + p.stderr[-5000:])
        raise AssertionError(summary)
    missing = rep["warnings"].get("missing_test_data", [])
    print(summary + ("; no real ids reached: %s" % ", ".join(missing) if missing else ""), flush=True)
    return cases["generated"]


def main():
    counts = {}
    proxy = {"https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9", "no_proxy": "",
             "HTTPS_PROXY": "http://127.0.0.1:9", "ALL_PROXY": "http://127.0.0.1:9"}
    # Long-polls are capped at 2 s, so that one cannot spend the run's time budget (the
    # contract says a wait beyond --max-wait-s is capped, not refused).
    args = ["--max-wait-s", "2"]
    # open: no tokens file
    s = Server(test_stages=False, env=proxy, args=args)
    s.env.pop("AC_TEST_STAGES", None)
    populate(s.data_dir)
    with s:
        counts["open"] = run("open", s, [])
        assert s.stop() == 0
    # with a tokens file: every /v1 request carries a read,write token
    t = Server(test_stages=False, env=proxy, args=args)
    t.env.pop("AC_TEST_STAGES", None)
    populate(t.data_dir)
    tokens = os.path.join(t.tmp, "tokens")
    with open(tokens, "w") as f:
        f.write("%s read,write\n" % TOKEN)
    t.args += ["--tokens-file", tokens]
    with t:
        counts["tokens"] = run("tokens", t, ["-H", "Authorization: Bearer " + TOKEN])
        assert t.stop() == 0
    print("schemathesis: %d cases without tokens, %d with tokens, no failures" % (counts["open"], counts["tokens"]))


if __name__ == "__main__":
    main()
