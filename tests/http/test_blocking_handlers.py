"""Black-box: a request whose handler waits (on a lock, a child process, a file being hashed)
does not hold the HTTP thread that received it. The server runs with one HTTP thread
(AC_HTTP_THREADS=1), so a handler that waited on that thread would stall every other
connection. A DELETE of a finished job waits up to 5 s for the artifact store's publish
lock, which the test holds (as a publishing worker would): meanwhile /healthz and the job's
GET answer at once, and the DELETE then answers 503 store_busy. Released, the DELETE
succeeds. A SIGTERM while such a request waits lets it finish and answer before the server
exits, with status 0; a SIGTERM beside an artifact download whose client stopped reading
ends the server cleanly within seconds (the download is cut, as at any shutdown)."""
import fcntl
import os
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from acserver import Server, test_spec  # noqa: E402


def finished_job(s):
    _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_artifact"], x_test_artifact_bytes=4096), expect=201)
    s.wait_status(job["id"], ("succeeded",), timeout=60)
    return job["id"]


def delete_in_background(s, jid):
    out = {}

    def go():
        out["t0"] = time.monotonic()
        try:
            out["resp"] = s.json("DELETE", "/v1/jobs/" + jid, timeout=30)
        except Exception as e:   # reported by the caller
            out["error"] = repr(e)
        out["t1"] = time.monotonic()

    t = threading.Thread(target=go)
    t.start()
    return t, out


def hold_publish_lock(s):
    fd = os.open(os.path.join(s.data_dir, "artifacts", ".publish.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)   # a worker publishing: the DELETE's exclusive lock waits
    return fd


def others_answer_while_delete_waits(s):
    jid = finished_job(s)
    fd = hold_publish_lock(s)
    t, out = delete_in_background(s, jid)
    time.sleep(0.5)   # the DELETE is in its handler, waiting for the lock
    for path in ("/healthz", "/v1/jobs/" + jid):
        t0 = time.monotonic()
        st, _, _ = s.request("GET", path, timeout=3)
        dt = time.monotonic() - t0
        assert st == 200, (path, st)
        assert "t1" not in out, "the DELETE answered before %s: it did not wait on the lock: %s" % (path, out)
        print("%s answered in %.3f s while the DELETE waited" % (path, dt))
    t.join(30)
    assert "error" not in out, out
    st, _, doc = out["resp"]
    assert st == 503 and doc["code"] == "store_busy", (st, doc)
    assert out["t1"] - out["t0"] >= 4.5, "the DELETE answered after %.2f s, not after its 5 s wait" % (
        out["t1"] - out["t0"])
    os.close(fd)
    s.json("DELETE", "/v1/jobs/" + jid, expect=200)
    s.json("GET", "/v1/jobs/" + jid, expect=404)


def sigterm_lets_a_waiting_request_answer(s):
    jid = finished_job(s)
    fd = hold_publish_lock(s)
    t, out = delete_in_background(s, jid)
    time.sleep(0.5)
    s.proc.send_signal(signal.SIGTERM)
    t.join(30)
    assert "error" not in out, out
    st, _, doc = out["resp"]
    assert st == 503 and doc["code"] == "store_busy", (st, doc)
    rc = s.stop(timeout=30)
    assert rc == 0, "server exited with %s" % rc
    os.close(fd)


def sigterm_beside_a_stalled_download(s):
    """A client that started an artifact download and stopped reading does not hold the
    shutdown: the server exits cleanly (status 0), within seconds, not at its deadline."""
    _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_artifact"], x_test_artifact_bytes=64 << 20), expect=201)
    s.wait_status(job["id"], ("succeeded",), timeout=60)
    c = socket.create_connection(("127.0.0.1", s.port))
    c.sendall(("GET /v1/jobs/%s/artifacts/blob.bin HTTP/1.1\r\nHost: x\r\n\r\n" % job["id"]).encode())
    assert c.recv(4096).startswith(b"HTTP/1.1 200"), "the download did not start"
    time.sleep(0.3)   # the socket's buffers fill; the client reads nothing more
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    try:
        rc = s.proc.wait(30)
    finally:
        c.close()
    dt = time.monotonic() - t0
    assert rc == 0, "the server exited with %s after %.1f s (its shutdown deadline forced it)" % (rc, dt)
    assert dt < 12, "shutdown took %.1f s beside a stalled download" % dt
    print("shutdown beside a stalled download: %.1f s" % dt)


def main():
    with Server(env={"AC_HTTP_THREADS": "1"}) as s:
        others_answer_while_delete_waits(s)
        sigterm_lets_a_waiting_request_answer(s)
    with Server(env={"AC_HTTP_THREADS": "1"}) as s:
        sigterm_beside_a_stalled_download(s)
    print("ok")


if __name__ == "__main__":
    main()
