"""Helpers for the end-to-end black-box tests (not a test itself: no test_ prefix).
Reuses tests/http/acserver.py to start the real `autocompress serve` on a free loopback
port; adds the stories260K job spec, waiting, artifact download and report validation
against openapi/openapi.yaml's Report schema. Everything goes through HTTP; the only
other things these tests touch are worker pids (for kill -9) and `autocompress eval`
on a downloaded export."""
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "http"))
from acserver import AC_BIN, Server  # noqa: E402,F401

ROOT = os.path.join(HERE, "..", "..")
SHARED = os.environ.get("AC_SHARED") or os.path.join(ROOT, "..", "shared")
DATA = os.path.join(os.path.abspath(SHARED), "data")
MODEL = os.path.join(DATA, "models", "stories260K", "stories260K.bin")
TOK = os.path.join(DATA, "models", "stories260K", "tok512.bin")
TEXT = os.path.join(DATA, "text", "tinystories", "validation_100.txt")
TERMINAL = ("succeeded", "failed", "cancelled")


def env():
    """Environment for servers and CLI runs (beside tests/run_all.sh's): the eval data."""
    return {"AC_SHARED": os.path.abspath(SHARED)}


def server(**kw):
    kw.setdefault("env", env())
    kw.setdefault("test_stages", False)
    kw.setdefault("args", ["--data-root", DATA])
    s = Server(**kw)
    s.args += ["--data-root", os.path.join(s.data_dir, "models")]   # models a test writes
    return s


def stories_spec(**over):
    """A small real stories260K job: 32+8 token workload, tiny budgets, 2 eval tasks."""
    spec = {"name": "e2e-stories260K",
            "model": {"path": MODEL, "tokenizer": TOK},
            "target": {"device": "cpu", "precision": "fp32",
                       "workload": {"batch_size": 1, "prompt_tokens": 32, "output_tokens": 8}},
            "constraints": {"params": 200000},
            "budgets": {"search_tokens": 8192, "distill_tokens": 16384},
            "data": {"calibration": TEXT, "distillation": TEXT},
            "evaluation": {"tasks": ["arc_easy", "lambada_openai"], "limit": 10, "seed": 1234},
            # a per-layer result exports as GGUF only: stories260K's FFN width (172) fits
            # neither DeciLM's ffn_mult grid nor LlamaForCausalLM (uniform layers only)
            "export": ["gguf"]}
    spec.update(over)
    return spec


def wait_terminal(s, jid, timeout):
    t0 = time.time()
    j = None
    while time.time() - t0 < timeout:
        _, _, j = s.json("GET", "/v1/jobs/%s?wait=10" % jid, expect=200, timeout=40)
        if j["status"] in TERMINAL:
            return j
    raise AssertionError("job %s not finished after %ss: %s" % (jid, timeout, j))


def calibrate(s, body):
    """POST /v1/calibrations and wait (15 minutes at most) for it to succeed: the calibration
    document (tables, validation, engine)."""
    _, _, c = s.json("POST", "/v1/calibrations", body, expect=202)
    t0 = time.time()
    while c["status"] not in ("succeeded", "failed", "cancelled"):
        _, _, c = s.json("GET", "/v1/calibrations/%s?wait=10" % c["id"], expect=200, timeout=40)
        assert time.time() - t0 < 900, c
    assert c["status"] == "succeeded", c
    res = c.get("result") or c
    return res if "tables" in res else res.get("calibration", res)


def llamacpp_job(s, spec):
    """POST a job served by llama.cpp (target.engine "llama.cpp", F32) with a latency and a
    params limit and wait for it to succeed: its report names the engine, its measured numbers
    come from llama.cpp's buffers (a KV buffer only where the model has attention), and both
    limits hold as measured. The report."""
    _, _, job = s.json("POST", "/v1/jobs", spec, expect=201)
    fin = wait_terminal(s, job["id"], 1200)
    assert fin["status"] == "succeeded", fin
    _, _, rep = s.json("GET", "/v1/jobs/%s/report" % job["id"], expect=200)
    assert rep["engine"]["name"] == "llama.cpp" and rep["engine"]["precision"] == "f32", rep["engine"]
    m = rep["result"]["measured"]
    assert m["llama_cpp_buffers"]["model"] > 0 and m["llama_cpp_buffers"]["kv"] >= 0, m
    rows = {r["name"]: r for r in rep["limits"]}
    lim = spec["constraints"]
    row = rows["latency_ms"]
    assert row["measured"] == m["latency_ms"] and row["holds"] and m["latency_ms"] <= lim["latency_ms"], row
    assert rows["params"]["holds"] and rows["params"]["measured"] <= lim["params"], rows["params"]
    return rep


def events(s, jid):
    _, _, ev = s.json("GET", "/v1/jobs/%s/events?limit=1000" % jid, expect=200)
    return ev["data"]


def artifacts(s, jid):
    _, _, a = s.json("GET", "/v1/jobs/%s/artifacts" % jid, expect=200)
    return {x["name"]: x for x in a["data"]}


def download(s, jid, name):
    st, hd, body = s.request("GET", "/v1/jobs/%s/artifacts/%s" % (jid, name), timeout=60)
    assert st == 200, (st, body[:300])
    return hd, body


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def tar_member(tar_bytes, suffix):
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as t:
        for m in t.getmembers():
            if m.name.endswith(suffix):
                return t.extractfile(m).read()
    raise AssertionError("no %s in the tarball" % suffix)


def gguf_tensors(data):
    """{name: bytes} of a GGUF file's tensors (metadata such as the job name ignored)."""
    import tempfile
    import gguf
    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(data)
        f.flush()
        r = gguf.GGUFReader(f.name)
        return {t.name: bytes(t.data.tobytes()) for t in r.tensors}


def worker_pids(job_id):
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                argv = f.read().split(b"\0")
            with open("/proc/%s/stat" % p) as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        if b"worker" in argv and job_id.encode() in argv:
            pids.append(int(p))
    return pids


def report_validator():
    """A function that raises when a report does not validate against the Report schema."""
    return schema_validator("/components/schemas/Report", "report")


def schema_validator(pointer, what):
    """A function that raises when a JSON value does not validate against the schema at
    `pointer` in openapi/openapi.yaml (`what` names it in the message)."""
    import yaml
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "jsonschema"], check=True)
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012
    with open(os.path.join(ROOT, "openapi", "openapi.yaml")) as f:
        doc = yaml.safe_load(f)
    registry = Registry().with_resource("urn:openapi", Resource.from_contents(doc, default_specification=DRAFT202012))
    schema = {"$ref": "urn:openapi#" + pointer}
    v = Draft202012Validator(schema, registry=registry)

    def check(value):
        errs = sorted(v.iter_errors(value), key=lambda e: list(e.path))
        assert not errs, "%s does not match the schema %s: %s" % (what, pointer, [
            (list(e.path), e.message[:200]) for e in errs[:5]])
    return check
