"""Black-box: what the server answers to malformed and oversized requests, case by case
(printed as a table). Everything the server can see is a problem+json answer with
X-Request-Id: a request target over --conn-memory/8 (414), a request head over
--conn-memory/2 (431), and framing that could be read two ways (repeated Content-Length,
Content-Length beside Transfer-Encoding: 400; a transfer coding other than chunked:
501), each closing the connection. What libmicrohttpd refuses before the server's
handler runs is answered by the library itself, as HTML without X-Request-Id: a request
too large for a connection's memory (414/431), a Content-Length that is not a number
(400) or overflows 64 bits (413), a header line without a colon (400), a malformed
chunked body (400) and an HTTP version other than 1.x (505). With libmicrohttpd before
1.0.0 a bad Content-Length also gets its status line and headers written twice (fixed
upstream in commit f1bfbe71, released in 1.0.0; docs/http.md): this test asserts that
doubling on those versions and a single status line on later ones, so it says which one
the linked library does."""
import json
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(__file__))
from acserver import Server  # noqa: E402

import yaml  # noqa: E402

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "openapi", "openapi.yaml")) as _f:
    PROBLEM_CODES = set(yaml.safe_load(_f)["components"]["schemas"]["Problem"]["properties"]["code"]["enum"])

CONN_MEMORY = 65536                      # the server's default --conn-memory
OURS, LIBRARY = "server", "libmicrohttpd"


def raw(port, data, timeout=5):
    """Send data, read until the server closes (or timeout). Returns the bytes read."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    out = b""
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
    except socket.timeout:
        raise AssertionError("the server neither answered nor closed within %d s: %r" % (timeout, out[:200]))
    finally:
        s.close()
    return out


def parse(out):
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, body


def version_tuple(v):
    return tuple(int(x) for x in v.split(".")[:3])


def main():
    with Server() as s:
        port = s.port
        lib = [json.loads(l) for l in s.log_text().splitlines() if '"listening"' in l][0].get("libmicrohttpd", "0")
        fixed_upstream = version_tuple(lib) >= (1, 0, 0)
        get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
        post = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        cases = [
            # name, request, status, who answers, problem code (ours)
            ("target over conn-memory/8", b"GET /v1/jobs?x=" + b"a" * (CONN_MEMORY // 8) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
             414, OURS, "uri_too_long"),
            ("head over conn-memory/2", get + b"X-Big: " + b"b" * (CONN_MEMORY // 2) + b"\r\n\r\n",
             431, OURS, "headers_too_large"),
            ("two Content-Length", post + b"Content-Length: 2\r\nContent-Length: 20\r\n\r\n{}",
             400, OURS, "invalid_request"),
            ("Content-Length and chunked", post + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
             400, OURS, "invalid_request"),
            ("Transfer-Encoding: gzip", post + b"Transfer-Encoding: gzip\r\n\r\n{}",
             501, OURS, "not_implemented"),
            ("body over --body-limit", post + b"Content-Length: 2000000\r\n\r\n", 413, OURS, "body_too_large"),
            ("target over a connection's memory", b"GET /v1/jobs?x=" + b"a" * CONN_MEMORY + b" HTTP/1.1\r\nHost: x\r\n\r\n",
             414, LIBRARY, None),
            ("head over a connection's memory", get + b"X-Big: " + b"b" * CONN_MEMORY + b"\r\n\r\n", 431, LIBRARY, None),
            ("Content-Length: -1", post + b"Content-Length: -1\r\n\r\n", 400, LIBRARY, None),
            ("Content-Length: abc", post + b"Content-Length: abc\r\n\r\n", 400, LIBRARY, None),
            ("Content-Length over 2^64", post + b"Content-Length: 99999999999999999999999\r\n\r\n", 413, LIBRARY, None),
            ("header line without a colon", get + b"Bad Header\r\n\r\n", 400, LIBRARY, None),
            ("malformed chunked body", post + b"Transfer-Encoding: chunked\r\n\r\nZZ\r\n", 400, LIBRARY, None),
            ("HTTP/2.0 request line", b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 505, LIBRARY, None),
        ]
        rows = []
        for name, req, want, who, code in cases:
            out = raw(port, req)
            assert out, "%s: the connection closed without an answer" % name
            status, hdrs, body = parse(out)
            assert status == want, "%s: status %d, expected %d: %r" % (name, status, want, out[:300])
            status_lines = out.count(b"HTTP/1.1 %d " % want)
            if who == OURS:
                assert hdrs.get("content-type", "").startswith("application/problem+json"), (name, hdrs)
                doc = json.loads(body)
                assert doc["code"] == code and doc["status"] == want, (name, doc)
                assert code in PROBLEM_CODES, "%s: code %s is not in openapi.yaml's Problem.code" % (name, code)
                assert doc["request_id"] == hdrs.get("x-request-id"), (name, doc, hdrs)
                assert hdrs.get("connection", "").lower() == "close", (name, hdrs)
                assert status_lines == 1, (name, out[:600])
            else:
                # The library's own answer: HTML, no request id (none was made).
                assert "x-request-id" not in hdrs and b"<html>" in out, (name, out[:400])
                doubled = name.startswith("Content-Length")
                if doubled and not fixed_upstream:
                    # libmicrohttpd < 1.0.0 writes the status line and headers twice
                    # for a bad Content-Length (f1bfbe71, released in 1.0.0).
                    assert status_lines == 2, (name, status_lines, out[:600])
                else:
                    assert status_lines == 1, (name, status_lines, out[:600])
            rows.append((name, status, who, "%d status line%s" % (status_lines, "s" if status_lines > 1 else "")))
        # The server is fine afterwards, and logged the library's answers with their status.
        assert s.json("GET", "/healthz")[0] == 200
        log = [json.loads(l) for l in s.log_text().splitlines() if l.startswith("{")]
        by_lib = [r for r in log if r.get("answered_by") == "libmicrohttpd"]
        assert {r["status"] for r in by_lib} >= {400, 413}, by_lib
        assert s.stop() == 0
    print("libmicrohttpd %s" % lib)
    for r in rows:
        print("  %-36s %d  answered by %-14s %s" % r)


if __name__ == "__main__":
    main()
