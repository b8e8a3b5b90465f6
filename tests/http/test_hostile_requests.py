"""Black-box regressions found by a hostile client: a NUL byte in the request target
never truncates the path; undecodable bytes in an id still get a whole problem
document that does not echo them; a body with thousands of faults gets a bounded
problem; empty and blank Idempotency-Key headers are refused; an integer written as
179639.0 is the integer 179639; a wait beyond the server's cap is capped, a wait on an id
of the other kind is a 404 at once, and "evt_" is not an event cursor."""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from acserver import Server, check_problem, test_spec  # noqa: E402


def raw(port, text):
    """One raw request (bytes as given); returns (status, headers text, body bytes)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = b""
    try:
        sock.sendall(text)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            cl = [l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
            if cl and len(body) >= int(cl[0].split(b":")[1]):
                break
    finally:
        sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head[9:12]), head.decode("latin-1"), body


def main():
    with Server() as s:
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_artifact"]), expect=201)
        jid = job["id"]
        s.wait_status(jid, ("succeeded",))
        # --- NUL in the path: a 400, never the truncated route
        for path in ("/v1/jobs/%s%%00junk" % jid, "/v1/jobs/%s%%00junk/artifacts/blob.bin" % jid,
                     "/v1/jobs/%s/artifacts/blob.bin%%00.txt" % jid, "/v1/jobs?after=%00"):
            st, hd, doc = s.json("GET", path)
            check_problem(st, hd, doc, 400, "invalid_request")
            assert "NUL" in doc["detail"], doc
        # --- undecodable ids: a whole problem (never an empty body), bytes not echoed
        for bad in ("%FF", "%ED%A0%80", "%C0%AF", "job_%FE%FF"):
            for method, path in (("GET", "/v1/jobs/%s"), ("GET", "/v1/jobs/%s/report"),
                                 ("POST", "/v1/jobs/%s/cancel"), ("DELETE", "/v1/jobs/%s"),
                                 ("GET", "/v1/jobs/%s/events"), ("GET", "/v1/calibrations/%s"),
                                 ("GET", "/v1/models/%s")):
                st, hd, body = raw(s.port, ("%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                                            % (method, path % bad)).encode())
                assert st == 404 and body, (method, path % bad, st, body)
                doc = json.loads(body.decode("utf-8"))   # valid UTF-8, valid JSON
                assert doc["code"] == "not_found" and "\ufffd" not in doc["detail"], doc
        # --- error amplification: the fault list is bounded and counted
        body = json.dumps(dict(test_spec(["test_sleep"]), **{"k%d" % i: 1 for i in range(5000)}))
        st, hd, doc = s.json("POST", "/v1/jobs", body, {"Content-Type": "application/json"})
        check_problem(st, hd, doc, 400, "invalid_spec")
        assert len(doc["errors"]) == 100 and doc["errors_total"] == 5000, (len(doc["errors"]), doc.get("errors_total"))
        # --- empty and blank idempotency keys are refused, not taken as no key
        spec = json.dumps(test_spec(["test_sleep"])).encode()
        for value in (b"", b"   ", b"\t"):
            st, head, body = raw(s.port, b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                 b"Content-Type: application/json\r\nIdempotency-Key:" + value +
                                 b"\r\nContent-Length: %d\r\n\r\n" % len(spec) + spec)
            assert st == 400 and json.loads(body)["code"] == "invalid_idempotency_key", (value, st, body)
        # --- the contract's query limits: a long wait is capped (not refused), "evt_" is no cursor
        t0 = time.time()
        st, _, doc = s.json("GET", "/v1/jobs/%s?wait=3600" % jid)   # terminal: answers at once
        assert st == 200 and time.time() - t0 < 5, (st, doc)
        # a running job asked for as a calibration (or the other way round): 404 at once, not
        # after the wait (it was parked like its own kind's and answered 404 at the deadline)
        _, _, run = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=30000), expect=201)
        s.wait_status(run["id"], ("running",))
        t0 = time.time()
        st, hd, doc = s.json("GET", "/v1/calibrations/%s?wait=5" % run["id"])
        check_problem(st, hd, doc, 404, "not_found")
        assert time.time() - t0 < 2, time.time() - t0
        s.json("POST", "/v1/jobs/%s/cancel" % run["id"], expect=200)
        st, hd, doc = s.json("GET", "/v1/jobs/%s/events?after=evt_" % jid)
        check_problem(st, hd, doc, 400, "invalid_parameter")
        # --- an integral real is an integer
        st, _, doc = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], constraints={"params": 179639.0}))
        assert st == 201 and doc["spec"]["constraints"]["params"] == 179639, (st, doc)
        st, _, doc = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], constraints={"params": 179639.5}))
        assert st == 400 and doc["errors"][0]["pointer"] == "/constraints/params", (st, doc)
    print("NUL paths, undecodable ids, fault floods, blank idempotency keys and integral reals all handled")


if __name__ == "__main__":
    main()
