"""Black-box: hostile and malformed inputs against the real server are 4xx problems
(never a 5xx or a crash), the spec is validated completely with JSON pointers, server
paths are confined to the data roots, idempotency keys replay or conflict, and the small
routes (health, ready, metrics, devices, models, estimates, 404/405/413/415) behave."""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from acserver import CALIB, Server, check_problem, test_spec, write_tiny_l2c  # noqa: E402


def raw_exchange(port, head, body):
    """Send raw bytes, tolerate the server closing early; returns (status or None, bytes)."""
    import socket
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = b""
    try:
        sock.sendall(head)
        try:
            if body:
                sock.sendall(body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data and b'"request_id"' in data:
                break
    finally:
        sock.close()
    if not data.startswith(b"HTTP/1.1 "):
        return None, data
    return int(data[9:12]), data


def post(s, path, body, headers=None):
    return s.json("POST", path, body, headers)


def main():
    with Server() as s:
        d = s.data_dir
        # symlink escaping a root, and a file outside every root
        os.symlink("/etc", os.path.join(d, "models", "escape"))
        os.symlink("/etc/hostname", os.path.join(d, "models", "escape.bin"))
        os.makedirs(os.path.join(d, "models", "hf"))
        with open(os.path.join(d, "models", "hf", "config.json"), "w") as f:
            f.write("{}")
        open(os.path.join(d, "models", "hf", "model.safetensors"), "w").close()

        # --- small routes
        st, hd, doc = s.json("GET", "/healthz", expect=200)
        assert doc == {"status": "ok"} and hd["x-request-id"].startswith("req_")
        st, hd, doc = s.json("GET", "/readyz", expect=200)
        assert doc["status"] == "ready"
        st, hd, body = s.request("GET", "/metrics")
        assert st == 200 and b"ac_http_requests_total" in body and b'ac_jobs{status="queued"}' in body, body[:500]
        st, hd, doc = s.json("GET", "/v1/devices", expect=200)
        assert doc["object"] == "list" and doc["data"][0]["id"] == "cpu" and doc["data"][0]["memory_bytes"] > 0
        # the CPU's GEMMs run a kernel its vector units can run: never OpenBLAS's generic fallback
        # on a CPU with AVX2 and FMA (a CPU newer than the library falls back to "Prescott")
        blas = doc["data"][0]["blas"]
        assert blas["kernel"] and "OpenBLAS" in blas["config"], blas
        flags = set(open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split())
        if {"avx2", "fma"} <= flags:
            assert blas["kernel"] not in ("Prescott", "Core2", "Penryn", "Nehalem", "Sandybridge", "Atom"), blas
        st, hd, body = s.request("GET", "/openapi.yaml")
        assert st == 200 and body.startswith(b"openapi: 3.1"), body[:100]
        st, hd, _ = s.request("GET", "/healthz", headers={"X-Request-Id": "client-chosen.id_1"})
        assert hd["x-request-id"] == "client-chosen.id_1"
        st, hd, _ = s.request("GET", "/healthz", headers={"X-Request-Id": "bad id with spaces"})
        assert hd["x-request-id"].startswith("req_")

        # --- routing errors
        check_problem(*s.json("GET", "/v1/nope"), 404, "not_found")
        check_problem(*s.json("GET", "/"), 404, "not_found")
        st, hd, doc = s.json("PUT", "/v1/jobs")
        check_problem(st, hd, doc, 405, "method_not_allowed")
        assert hd["allow"] == "GET, POST, HEAD", hd
        st, hd, doc = s.json("PATCH", "/v1/jobs/job_x")
        check_problem(st, hd, doc, 405)
        assert "DELETE" in hd["allow"] and "GET" in hd["allow"]

        # --- media type and size
        check_problem(*s.json("POST", "/v1/jobs", b"{}", {"Content-Type": "text/plain"}), 415, "unsupported_media_type")
        check_problem(*s.json("POST", "/v1/jobs", b"{}"), 415)
        big = b"{" + b" " * (10 * 1024 * 1024) + b"}"
        head = ("POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: %d\r\n" % len(big))
        # with Expect: 100-continue (what curl sends for big bodies) the 413 comes before the body
        status, text = raw_exchange(s.port, (head + "Expect: 100-continue\r\n\r\n").encode(), b"")
        assert status == 413 and b"body_too_large" in text, (status, text[:300])
        # without it the server answers 413 and closes; the client may see the reset first
        status, text = raw_exchange(s.port, (head + "\r\n").encode(), big)
        assert status in (413, None), status
        # chunked (no Content-Length) over the limit is also 413
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        c.putrequest("POST", "/v1/jobs")
        c.putheader("Content-Type", "application/json")
        c.putheader("Transfer-Encoding", "chunked")
        c.endheaders()
        chunk = b"x" * 65536
        try:
            for _ in range(40):
                c.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            c.send(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        r = c.getresponse()
        assert r.status == 413, r.status
        c.close()

        # --- malformed bodies
        ct = {"Content-Type": "application/json"}
        check_problem(*s.json("POST", "/v1/jobs", b"{not json", ct), 400, "invalid_json")
        check_problem(*s.json("POST", "/v1/jobs", b"", ct), 400, "invalid_json")
        check_problem(*s.json("POST", "/v1/jobs", b'{"name":"a","name":"b"}', ct), 400, "invalid_json")
        check_problem(*s.json("POST", "/v1/jobs", b'{"name":"\xff\xfe"}', ct), 400, "invalid_json")
        check_problem(*s.json("POST", "/v1/jobs", b'[1,2]', ct), 400, pointer="")
        # valid JSON, but a NUL would cut the string short: refused as unprocessable, not as "not JSON"
        check_problem(*s.json("POST", "/v1/jobs", b'{"name":"a\\u0000b","model":{"path":"models/tiny.bin"},"constraints":{"latency_ms":1}}', ct), 422, "unprocessable_json")

        # --- spec validation with pointers
        base = {"model": {"path": "models/tiny.bin"}, "constraints": {"latency_ms": 100}, "data": dict(CALIB)}
        def bad(mut, status, pointer):
            spec = json.loads(json.dumps(base))
            mut(spec)
            check_problem(*post(s, "/v1/jobs", spec), status, pointer=pointer)
        bad(lambda x: x.update(bogus=1), 400, "/bogus")
        bad(lambda x: x["constraints"].update(latency_ms="fast"), 400, "/constraints/latency_ms")
        bad(lambda x: x["constraints"].update(latency_ms=-5), 422, "/constraints/latency_ms")
        bad(lambda x: x.update(constraints={}), 422, "/constraints")
        bad(lambda x: x.pop("constraints"), 400, "/constraints")
        bad(lambda x: x.update(target={"device": "tpu:7"}), 422, "/target/device")
        bad(lambda x: x.update(target={"device": "cuda:9"}), 422, "/target/device")
        bad(lambda x: x.update(target={"workload": {"batch_size": -1}}), 422, "/target/workload/batch_size")
        bad(lambda x: x.update(target={"workload": {"batch_size": 10**30}}), 422, "/target/workload/batch_size")  # beyond 64 bits
        bad(lambda x: x.update(target={"workload": {"prompt_tokens": 1048576, "output_tokens": 10}}), 422, "/target/workload")
        bad(lambda x: x.update(target={"precision": "int3"}), 422, "/target/precision")
        # llama.cpp holds at most 256 sequences: a larger batch is refused now, not at its first serving
        bad(lambda x: x.update(target={"engine": "llama.cpp", "workload": {"batch_size": 257}}), 422,
            "/target/workload/batch_size")
        bad(lambda x: x.update(method="magic"), 422, "/method")
        bad(lambda x: x.update(search_space={k: False for k in ("hidden", "heads", "ffn", "experts", "expert_widths", "shared_expert_widths", "latent_widths", "mamba_heads", "depth")}), 422, "/search_space")
        bad(lambda x: x.update(search_space={"wings": True}), 400, "/search_space/wings")
        bad(lambda x: x.update(budgets={"search_tokens": 0}), 422, "/budgets/search_tokens")
        bad(lambda x: x.update(budgets={"distill_tokens": -1}), 422, "/budgets/distill_tokens")
        bad(lambda x: x.update(evaluation={"tasks": ["arc_easy", "nonsense"]}), 422, "/evaluation/tasks/1")
        bad(lambda x: x.update(export=["hf", "hf"]), 422, "/export/1")
        bad(lambda x: x.update(export=["onnx"]), 422, "/export/0")
        bad(lambda x: x.update(metadata={str(i): "v" for i in range(17)}), 422, "/metadata")
        bad(lambda x: x.update(metadata={"a": 1}), 400, "/metadata/a")
        bad(lambda x: x["constraints"].update(memory_gib=1e6), 422, "/constraints/memory_gib")
        bad(lambda x: x.update(model={"path": "models/missing.bin"}), 422, "/model/path")
        bad(lambda x: x.update(model={"path": "models/hf", "id": "mdl_x"}), 422, "/model")
        bad(lambda x: x.update(model={"id": "mdl_nope"}), 422, "/model/id")
        bad(lambda x: x.update(model={"url": "https://example.com/m.gguf"}), 422, "/model/url")
        # path confinement: 403
        bad(lambda x: x.update(model={"path": "/etc/passwd"}), 403, "/model/path")
        bad(lambda x: x.update(model={"path": "models/../../../etc/passwd"}), 403, "/model/path")
        bad(lambda x: x.update(model={"path": "models/escape/hostname"}), 403, "/model/path")
        bad(lambda x: x.update(model={"path": "models/escape.bin"}), 403, "/model/path")
        bad(lambda x: x.update(data={"calibration": "/etc/shadow"}), 403, "/data/calibration")
        bad(lambda x: x.update(model={"path": "models/tiny.bin", "tokenizer": "../x"}), 403, "/model/tokenizer")
        # the loader reads a model folder's files by name, links followed: a link out of the
        # roots is refused (the server's paths unnamed); one inside them (a hub cache's
        # snapshot into its blobs) is taken
        outside = tempfile.mkdtemp(prefix="ac-outside-")
        with open(os.path.join(outside, "config.json"), "w") as f:
            f.write("{}")
        open(os.path.join(outside, "tok32.bin"), "wb").close()
        for name, target in (("hfleak", os.path.join(outside, "config.json")), ("hflink", "../hf/config.json")):
            os.makedirs(os.path.join(d, "models", name))
            os.symlink(target, os.path.join(d, "models", name, "config.json"))
            open(os.path.join(d, "models", name, "model.safetensors"), "w").close()
        st, hd, doc = post(s, "/v1/jobs", dict(base, model={"path": "models/hfleak"}))
        check_problem(st, hd, doc, 403, pointer="/model/path")
        assert "file config.json is a link that leads outside" in json.dumps(doc) and outside not in json.dumps(doc), doc
        check_problem(*post(s, "/v1/models", {"path": "models/hfleak"}), 403, pointer="/path")
        st, _, doc = post(s, "/v1/jobs", dict(base, model={"path": "models/hflink"}, name="linked inside"))
        assert st == 201, doc
        # so are the files read beside a model file: the tokenizer it finds, a safetensors
        # file's config.json (registration too); other files beside it are not read
        os.makedirs(os.path.join(d, "models", "tokleak"))
        write_tiny_l2c(os.path.join(d, "models", "tokleak", "m.bin"), tokenizer=False)
        os.symlink(os.path.join(outside, "tok32.bin"), os.path.join(d, "models", "tokleak", "tok32.bin"))
        os.symlink("/etc/hostname", os.path.join(d, "models", "tokleak", "notes.txt"))
        st, hd, doc = post(s, "/v1/jobs", dict(base, model={"path": "models/tokleak/m.bin"}))
        check_problem(st, hd, doc, 403, pointer="/model/path")
        assert "file tok32.bin is a link" in json.dumps(doc) and outside not in json.dumps(doc), doc
        check_problem(*post(s, "/v1/models", {"path": "models/tokleak/m.bin"}), 403, pointer="/path")
        os.makedirs(os.path.join(d, "models", "stleak"))
        open(os.path.join(d, "models", "stleak", "m.safetensors"), "wb").write(b"\x02\0\0\0\0\0\0\0{}")
        os.symlink(os.path.join(outside, "config.json"), os.path.join(d, "models", "stleak", "config.json"))
        st, hd, doc = post(s, "/v1/jobs", dict(base, model={"path": "models/stleak/m.safetensors"}))
        check_problem(st, hd, doc, 403, pointer="/model/path")
        assert "file config.json is a link" in json.dumps(doc), doc
        # the files read with a tokenizer.json beside a model file (its special tokens) alike
        os.makedirs(os.path.join(d, "models", "specleak"))
        open(os.path.join(d, "models", "specleak", "m.safetensors"), "wb").write(b"\x02\0\0\0\0\0\0\0{}")
        with open(os.path.join(d, "models", "specleak", "config.json"), "w") as f:
            f.write("{}")
        with open(os.path.join(outside, "tokenizer_config.json"), "w") as f:
            f.write("{}")
        os.symlink(os.path.join(outside, "tokenizer_config.json"),
                   os.path.join(d, "models", "specleak", "tokenizer_config.json"))
        st, hd, doc = post(s, "/v1/jobs", dict(base, model={"path": "models/specleak/m.safetensors"}))
        check_problem(st, hd, doc, 403, pointer="/model/path")
        assert "file tokenizer_config.json is a link" in json.dumps(doc) and outside not in json.dumps(doc), doc
        os.unlink(os.path.join(d, "models", "tokleak", "tok32.bin"))
        open(os.path.join(d, "models", "tokleak", "tok32.bin"), "wb").close()
        st, _, doc = post(s, "/v1/jobs", dict(base, model={"path": "models/tokleak/m.bin"}, name="a link not read"))
        assert st == 201, doc
        shutil.rmtree(outside)
        # a job tokenizes its text: a model with no tokenizer beside it and none given is
        # refused at once (it failed after the calibration), naming the model, not the path
        os.makedirs(os.path.join(d, "models", "notok"))
        write_tiny_l2c(os.path.join(d, "models", "notok", "m.bin"), tokenizer=False)
        st, hd, doc = post(s, "/v1/jobs", dict(base, model={"path": "models/notok/m.bin"}))
        check_problem(st, hd, doc, 422, pointer="/model/tokenizer")
        assert "m.bin: it has no tokenizer beside it" in json.dumps(doc) and d not in json.dumps(doc), doc
        st, hd, doc = post(s, "/v1/jobs", dict(base, constraints={"latency_ms": -1},
                                                model={"path": "models/notok/m.bin", "tokenizer": "models/hf/config.json"}))
        check_problem(st, hd, doc, 422, pointer="/constraints/latency_ms")
        assert "/model/tokenizer" not in [e["pointer"] for e in doc["errors"]], doc
        # several faults at once are all listed
        st, hd, doc = post(s, "/v1/jobs", {"model": {"path": "/etc/passwd"}, "constraints": {"latency_ms": -1}, "x": 1})
        check_problem(st, hd, doc, 403)
        assert {e["pointer"] for e in doc["errors"]} >= {"/model/path", "/constraints/latency_ms", "/x"}, doc
        # test-only fields are unknown unless AC_TEST_STAGES=1 (checked in test_auth.py's server)

        # a valid spec with a HF directory model is accepted (and normalized)
        st, hd, doc = post(s, "/v1/jobs", dict(base, model={"path": "models/hf"}, name="ok"))
        assert st == 201, doc
        assert doc["spec"]["model"]["format"] == "hf" and doc["spec"]["target"]["device"] == "cpu"
        assert hd["location"] == "/v1/jobs/" + doc["id"] and hd["etag"]

        # --- query parameters
        for q in ("limit=0", "limit=-1", "limit=1001", "limit=99999999999999999999999", "limit=abc",
                  "limit=+5", "limit=%205", "limit=5%20", "after=" + "x" * 100, "after=job_doesnotexist"):
            check_problem(*s.json("GET", "/v1/jobs?" + q), 400)
        for q in ("after=evt_-1", "after=evt_99999999999999999999999", "after=zzz", "wait=-1", "wait=100000", "limit=5000",
                  "after=evt_-0", "after=evt_+5", "after=evt_%205", "after=evt_1234567890123456789", "wait=+1"):
            check_problem(*s.json("GET", "/v1/jobs/%s/events?%s" % (doc["id"], q)), 400)
        check_problem(*s.json("GET", "/v1/jobs/%s?wait=-3" % doc["id"]), 400)
        check_problem(*s.json("GET", "/v1/jobs/job_missing"), 404, "not_found")

        # --- artifact names
        jid = doc["id"]
        for name in ("..%2f..%2fetc%2fpasswd", "%2fetc%2fpasswd", "..", ".hidden", "a%00b", "a/b"):
            st, hd, d2 = s.json("GET", "/v1/jobs/%s/artifacts/%s" % (jid, name))
            assert 400 <= st < 500, (name, st, d2)
            check_problem(st, hd, d2, st)
        st, hd, d2 = s.json("GET", "/v1/jobs/%s/artifacts//etc/passwd" % jid)
        assert 400 <= st < 500, st
        check_problem(*s.json("GET", "/v1/jobs/%s/artifacts/none.bin" % jid), 404)

        # --- idempotency
        spec = test_spec(["test_fail"])
        k = {"Idempotency-Key": "key-123"}
        st1, h1, j1 = post(s, "/v1/jobs", spec, k)
        assert st1 == 201, j1
        st2, h2, j2 = post(s, "/v1/jobs", spec, k)
        assert st2 == 201 and j2["id"] == j1["id"] and h2.get("idempotent-replayed") == "true", (st2, h2, j2)
        # key order and whitespace do not matter; content does
        st3, h3, j3 = s.json("POST", "/v1/jobs", json.dumps(spec, indent=3, sort_keys=True).encode(),
                             {"Content-Type": "application/json", **k})
        assert st3 == 201 and j3["id"] == j1["id"]
        check_problem(*post(s, "/v1/jobs", dict(spec, name="other"), k), 422, "idempotency_key_reused")
        check_problem(*post(s, "/v1/jobs", spec, {"Idempotency-Key": "bad key"}), 400)
        st4, _, j4 = post(s, "/v1/jobs", spec, {"Idempotency-Key": "key-456"})
        assert st4 == 201 and j4["id"] != j1["id"]

        # --- models
        st, hd, m = post(s, "/v1/models", {"path": "models/hf", "name": "tiny-hf"})
        assert st == 201 and m["id"].startswith("mdl_") and m["format"] == "hf", m
        check_problem(*post(s, "/v1/models", {"path": "/etc/passwd"}), 403, pointer="/path")
        check_problem(*post(s, "/v1/models", {"path": "models/missing"}), 422, pointer="/path")
        check_problem(*post(s, "/v1/models", {"path": "models/tiny.bin", "x": 1}), 400, pointer="/x")
        _, _, ml = s.json("GET", "/v1/models", expect=200)
        assert [x["id"] for x in ml["data"]] == [m["id"]], ml
        s.json("GET", "/v1/models/" + m["id"], expect=200)
        check_problem(*s.json("GET", "/v1/models/mdl_none"), 404)
        st, hd, doc = post(s, "/v1/jobs", dict(base, model={"id": m["id"]}))
        assert st == 201 and doc["spec"]["model"]["path"].endswith("/models/hf"), doc
        # a registered model without a tokenizer: a job by its id is told to register it with one
        st, hd, m2 = post(s, "/v1/models", {"path": "models/notok/m.bin", "name": "no-tokenizer"})
        assert st == 201, m2
        st, hd, doc = post(s, "/v1/jobs", dict(base, model={"id": m2["id"]}))
        check_problem(st, hd, doc, 422, pointer="/model/tokenizer")
        assert "register it again with its tokenizer" in doc["detail"], doc

        # a key cut inside a character in its fault's pointer is still a fault (it was dropped: 201)
        check_problem(*post(s, "/v1/models", {"path": "models/tiny.bin", "\u20ac" * 100: 1}), 400)

        # a method with quotes is escaped in the access log, not spliced into it
        st, _ = raw_exchange(s.port, b'X","level":"x /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: hostile.method\r\n'
                             b'Connection: close\r\n\r\n', b"")
        assert st is None or st >= 400, st

        # --- estimates: an empty request is the client's fault, never 5xx
        st, hd, doc = post(s, "/v1/estimates", {})
        assert 400 <= st < 500, (st, doc)
        check_problem(st, hd, doc, st)

        # the server survived all of it
        s.json("GET", "/healthz", expect=200)
        assert s.proc.poll() is None
        assert s.stop() == 0
        assert '"status":5' not in s.log_text(), "a 5xx was logged"
        # the log is one JSON object per line; each request has its access line
        lines = [json.loads(l) for l in s.log_text().splitlines() if l.strip()]
        access = [l for l in lines if l.get("msg") == "request"]
        for l in access:
            for k in ("ts", "method", "path", "status", "bytes", "duration_ms", "request_id", "remote"):
                assert k in l, (k, l)
        mine = [l for l in access if l["request_id"] == "client-chosen.id_1"]
        assert len(mine) == 1 and mine[0]["path"] == "/healthz" and mine[0]["status"] == 200, mine
        assert any(l["status"] == 413 for l in access) and any(l["method"] == "PUT" for l in access)
        hostile = [l for l in access if l["request_id"] == "hostile.method"]
        assert len(hostile) == 1 and hostile[0]["method"] == 'X","level":"x' and hostile[0]["level"] == "info", hostile
        assert any(l.get("msg") == "shutting down" for l in lines)
    print("ok")


if __name__ == "__main__":
    main()
