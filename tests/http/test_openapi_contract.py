"""Contract: openapi/openapi.yaml (OpenAPI 3.1) and the server agree. The routes the
server serves (`autocompress serve --print-routes`) and the operations the document
lists are the same set; the document served at /openapi.yaml is the file in the repo;
every schema is valid JSON Schema 2020-12; and real responses from a running server —
successes and problems — each have a documented status and content type and validate
against the documented schema (jsonschema, installed into $AC_PYTHON's venv)."""
import json
import os
import re
import subprocess
import sys

import yaml

try:
    import jsonschema  # noqa: F401
except ImportError:  # first run in a fresh venv: install it (PyPI, the ordinary client)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "jsonschema"], check=True)
from jsonschema import Draft202012Validator  # noqa: E402
from referencing import Registry, Resource  # noqa: E402
from referencing.jsonschema import DRAFT202012  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from acserver import AC_BIN, Server, test_spec  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
METHODS = ("get", "put", "post", "delete", "head", "patch", "options")


def esc(p):
    return p.replace("~", "~0").replace("/", "~1")


def main():
    with open(os.path.join(ROOT, "openapi", "openapi.yaml"), "rb") as f:
        raw = f.read()
    doc = yaml.safe_load(raw)
    assert doc["openapi"].startswith("3.1"), doc["openapi"]

    # --- route parity
    out = subprocess.run([AC_BIN, "serve", "--print-routes"], capture_output=True, text=True, check=True).stdout
    served = {tuple(line.split(" ", 1)) for line in out.strip().splitlines()}
    documented = {(m.upper(), p) for p, item in doc["paths"].items() for m in item if m in METHODS}
    assert served - documented == set(), "served but not documented: %s" % sorted(served - documented)
    assert documented - served == set(), "documented but not served: %s" % sorted(documented - served)

    # --- schemas are valid 2020-12
    for name, sch in doc["components"]["schemas"].items():
        Draft202012Validator.check_schema(sch)
    registry = Registry().with_resource("urn:openapi", Resource.from_contents(doc, default_specification=DRAFT202012))
    # the document refuses what the validator refuses: constraints without a limit
    cons = Draft202012Validator(doc["components"]["schemas"]["Constraints"])
    assert not cons.is_valid({"margin_pct": 5}) and not cons.is_valid({"served_check": True})
    assert cons.is_valid({"params": 1000, "margin_pct": 5})

    templates = []
    for p in doc["paths"]:
        rx = "^" + re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(p)) + "$"
        if p.endswith("{name}"):
            rx = rx[:-len("[^/]+$")] + ".+$"
        templates.append((re.compile(rx), p))

    def resolve(obj):
        while isinstance(obj, dict) and "$ref" in obj:
            ptr = obj["$ref"].lstrip("#/").split("/")
            obj = doc
            for part in ptr:
                obj = obj[part.replace("~1", "/").replace("~0", "~")]
        return obj

    checked = []

    def check(method, path, status, headers, body):
        bare = path.split("?")[0]
        tpl = [p for rx, p in templates if rx.match(bare)]
        assert tpl, "no documented path for %s" % bare
        tpl = sorted(tpl, key=len)[0] if len(tpl) == 1 else [t for t in tpl if "{" not in t or t.count("/") == bare.count("/")][0]
        op = doc["paths"][tpl].get(method.lower())
        assert op, "%s %s not documented" % (method, tpl)
        resp = op["responses"].get(str(status)) or op["responses"].get("default")
        assert resp, "%s %s: status %s not documented (documented: %s)" % (method, tpl, status, list(op["responses"]))
        resp = resolve(resp)
        ctype = headers.get("content-type", "").split(";")[0].strip()
        content = resp.get("content")
        if not content or method == "HEAD" or status == 304:
            assert not body, "%s %s %s: undocumented body" % (method, tpl, status)
            checked.append((method, tpl, status))
            return
        if ctype not in content:  # a media range: "*/*" (an artifact, as its record names) or "type/*"
            ctype = "*/*" if "*/*" in content else ctype.split("/")[0] + "/*"
        assert ctype in content, "%s %s %s: content type %s not in %s" % (method, tpl, status, ctype, list(content))
        if ctype.endswith("json") and content[ctype].get("schema"):
            code = [k for k, v in op["responses"].items() if v is resp or resolve(v) is resp][0]
            key = "urn:openapi#/paths/%s/%s/responses/%s" % (esc(tpl), method.lower(), code)
            base = op["responses"][code]
            if "$ref" in base:
                key = "urn:openapi" + base["$ref"]
            schema = {"$ref": key + "/content/" + esc(ctype) + "/schema"}
            v = Draft202012Validator(schema, registry=registry)
            errs = sorted(v.iter_errors(json.loads(body)), key=lambda e: e.path)
            assert not errs, "%s %s %s: %s\n%s" % (method, tpl, status, errs[0].message, body[:1500])
        checked.append((method, tpl, status))

    with Server() as s:
        assert s.request("GET", "/openapi.yaml")[2] == raw, "served document differs from openapi/openapi.yaml"

        def call(method, path, body=None, headers=None):
            st, hd, data = s.request(method, path, body, headers)
            check(method, path, st, hd, data)
            return st, hd, json.loads(data) if data and hd.get("content-type", "").find("json") >= 0 else data

        os.makedirs(os.path.join(s.data_dir, "models", "hf"))
        with open(os.path.join(s.data_dir, "models", "hf", "config.json"), "w") as f:
            f.write("{}")
        open(os.path.join(s.data_dir, "models", "hf", "model.safetensors"), "w").close()
        call("GET", "/healthz")
        call("GET", "/readyz")
        call("GET", "/metrics")
        call("GET", "/openapi.yaml")
        call("GET", "/v1/devices")
        call("GET", "/v1/engines")
        _, _, job = call("POST", "/v1/jobs", test_spec(["test_artifact", "test_sleep"], x_test_sleep_ms=300,
                                                      x_test_artifact_bytes=100000, name="c", metadata={"a": "b"}),
                         {"Idempotency-Key": "k1"})
        call("POST", "/v1/jobs", test_spec(["test_artifact", "test_sleep"], x_test_sleep_ms=300,
                                           x_test_artifact_bytes=100000, name="c", metadata={"a": "b"}),
             {"Idempotency-Key": "k1"})
        call("POST", "/v1/jobs", test_spec(["test_fail"]), {"Idempotency-Key": "k1"})
        jid = job["id"]
        st, hd, _ = call("GET", "/v1/jobs/%s?wait=20" % jid)
        call("GET", "/v1/jobs/" + jid, headers={"If-None-Match": hd["etag"]})
        call("GET", "/v1/jobs")
        call("GET", "/v1/jobs?limit=1")
        call("GET", "/v1/jobs?limit=0")
        call("GET", "/v1/jobs/%s/events" % jid)
        call("GET", "/v1/jobs/%s/events?after=evt_2&limit=3" % jid)
        call("GET", "/v1/jobs/%s/events?after=x" % jid)
        call("GET", "/v1/jobs/%s/report" % jid)
        call("GET", "/v1/jobs/%s/artifacts" % jid)
        call("GET", "/v1/jobs/%s/artifacts/blob.bin" % jid)
        call("HEAD", "/v1/jobs/%s/artifacts/blob.bin" % jid)
        call("GET", "/v1/jobs/%s/artifacts/blob.bin" % jid, headers={"Range": "bytes=0-99"})
        call("GET", "/v1/jobs/%s/artifacts/blob.bin" % jid, headers={"Range": "bytes=999999999-"})
        call("GET", "/v1/jobs/%s/artifacts/..%%2fx" % jid)
        call("GET", "/v1/jobs/%s/artifacts/nope" % jid)
        call("POST", "/v1/jobs/%s/cancel" % jid)
        _, _, f = call("POST", "/v1/jobs", test_spec(["test_fail"]))
        s.wait_status(f["id"], ("failed",))
        call("GET", "/v1/jobs/" + f["id"])
        _, _, r = call("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=30000))
        s.wait_stage(r["id"], "test_sleep")
        call("GET", "/v1/jobs/" + r["id"])
        call("DELETE", "/v1/jobs/" + r["id"])
        call("POST", "/v1/jobs/%s/cancel" % r["id"])
        s.wait_status(r["id"], ("cancelled",))
        call("DELETE", "/v1/jobs/" + r["id"])
        call("DELETE", "/v1/jobs/" + r["id"])
        call("POST", "/v1/jobs", {"model": {"path": "/etc/passwd"}, "constraints": {}, "bogus": 1})
        call("POST", "/v1/jobs", {"model": {"path": "models/tiny.bin"}, "constraints": {"latency_ms": -1}})
        call("POST", "/v1/jobs", b"{", {"Content-Type": "application/json"})
        call("POST", "/v1/jobs", b"{}", {"Content-Type": "text/plain"})
        _, _, m = call("POST", "/v1/models", {"path": "models/hf", "name": "h"})
        call("POST", "/v1/models", {"path": "models/nothere"})
        call("GET", "/v1/models")
        call("GET", "/v1/models/" + m["id"])
        call("GET", "/v1/models/mdl_none")
        _, _, c = call("POST", "/v1/calibrations", {"model": {"id": m["id"]}, "x_test_pipeline": ["test_sleep"],
                                                     "x_test_sleep_ms": 10})
        s.wait_status(c["id"], ("succeeded", "failed"), kind="calibrations")
        call("GET", "/v1/calibrations/" + c["id"])
        call("GET", "/v1/calibrations")
        call("POST", "/v1/calibrations", {"target": {}})
        call("POST", "/v1/estimates", {"model": {"path": "models/tiny.bin"}, "target": {"device": "cpu"}})
        call("POST", "/v1/jobs", test_spec(["test_sleep"], target={"engine": "nonsense"}))
        call("POST", "/v1/calibrations", {"model": {"id": m["id"]}, "target": {"engine": "autocompress",
                                                                              "kv_cache_type": "f16"}})
        call("GET", "/v1/nowhere") if False else None
        assert s.stop() == 0
    print("ok: %d responses validated against %d documented operations" % (len(checked), len(documented)))


if __name__ == "__main__":
    main()
