"""Helpers for the black-box HTTP tests: start the real `autocompress serve` on a free
loopback port (port 0; the port is read from the server's "listening" log line) with a
fresh data directory, talk to it with http.client, stop it gracefully or with kill -9.
Not a test itself (no test_ prefix)."""
import atexit
import hashlib
import http.client
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

AC_BIN = os.environ.get("AC_BIN") or os.path.join(os.path.dirname(__file__), "..", "..", "build", "autocompress")

# A spec that runs only test stages (AC_TEST_STAGES=1) on a placeholder model file.
def write_tiny_l2c(path, tokenizer=True):
    """A tiny llama2.c checkpoint the model probe takes (dim 8, 1 layer, vocab 32, a context
    of 512 tokens, which a job's default workload fits in, zero weights): for tests that
    need a model path but never load the weights. With an
    empty tok32.bin beside it (where a job's spec check looks for its tokenizer), unless
    tokenizer is False."""
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", 8, 16, 1, 2, 2, 32, 512) + b"\0" * (2968 * 4))
    if tokenizer:
        open(os.path.join(os.path.dirname(path), "tok32.bin"), "wb").close()


CALIB = {"calibration": "data/calib.txt"}   # the text every Server's data root holds


def test_spec(pipeline, **extra):
    spec = {"model": {"path": "models/tiny.bin"}, "constraints": {"latency_ms": 50},
            "x_test_pipeline": pipeline}
    spec.update(extra)
    return spec


def store_for(data_dir):
    """The AC_STORE of a server on data_dir: "" (SQLite) unless AC_TEST_PG names a test
    PostgreSQL server (tests/run_all.sh's PostgreSQL pass); then a database of the data
    directory's own, created on first use and found again on restart."""
    base = os.environ.get("AC_TEST_PG")
    if not base:
        return ""
    name = "ac_" + hashlib.sha1(os.path.realpath(data_dir).encode()).hexdigest()[:20]
    have = subprocess.run(["psql", "-qtA", base, "-c", "SELECT 1 FROM pg_database WHERE datname='%s'" % name],
                          capture_output=True, text=True, check=True).stdout.strip()
    if have != "1":
        subprocess.run(["psql", "-q", base, "-c", "CREATE DATABASE %s" % name], capture_output=True, check=True)
    return base.replace("postgresql:///postgres?", "postgresql:///%s?" % name, 1)


class Server:
    def __init__(self, data_dir=None, args=(), env=None, test_stages=True):
        self.tmp = tempfile.mkdtemp(prefix="ac-http-")
        atexit.register(self.cleanup)   # also for tests that never reach their own cleanup
        self.data_dir = data_dir or os.path.join(self.tmp, "var")
        self.args = list(args)
        self.env = dict(os.environ)
        if test_stages:
            self.env["AC_TEST_STAGES"] = "1"
        self.env["AC_STORE"] = store_for(self.data_dir)
        self.env.update(env or {})
        self.proc = None
        self.port = None
        self.log_path = os.path.join(self.tmp, "server.log")
        os.makedirs(os.path.join(self.data_dir, "models"), exist_ok=True)
        write_tiny_l2c(os.path.join(self.data_dir, "models", "tiny.bin"))
        os.makedirs(os.path.join(self.data_dir, "data"), exist_ok=True)   # a job's calibration text: CALIB
        with open(os.path.join(self.data_dir, "data", "calib.txt"), "w") as f:
            f.write("Once upon a time there was a tiny model.\n")

    def start(self, timeout=15):
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([AC_BIN, "serve", "--listen", "127.0.0.1:0", "--data-dir", self.data_dir]
                                     + self.args, stdout=self.log, stderr=self.log, env=self.env)
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited with %s:\n%s" % (self.proc.returncode, self.log_text()))
            for line in self.log_text().splitlines():
                if '"listening"' in line:
                    rec = json.loads(line)
                    if rec.get("msg") == "listening":
                        self.port = rec["port"]
            if self.port:
                return self
            time.sleep(0.02)
        raise RuntimeError("server did not start:\n" + self.log_text())

    def restart(self):
        self.port = None
        with open(self.log_path, "ab") as f:
            f.write(b"--- restart ---\n")
        # The previous "listening" lines must not be read again.
        os.rename(self.log_path, self.log_path + ".%d" % time.time_ns())
        return self.start()

    def log_text(self):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stop(self, timeout=30):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("server ignored SIGTERM for %ss" % timeout)
        text = self.log_text()
        jobs = os.path.join(self.data_dir, "jobs")
        for j in os.listdir(jobs) if os.path.isdir(jobs) else []:
            try:
                with open(os.path.join(jobs, j, "worker.log"), errors="replace") as f:
                    text += f.read()
            except OSError:
                pass
        for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            assert bad not in text, "sanitizer report in the server log:\n" + text[-4000:]
        return self.proc.returncode if self.proc else None

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def cleanup(self):
        try:
            if self.proc and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, et, ev, tb):
        if et is not None:
            sys.stderr.write("---- server log ----\n" + self.log_text()[-6000:] + "\n")
        self.cleanup()
        return False

    # ---- requests ------------------------------------------------------------------
    def request(self, method, path, body=None, headers=None, timeout=30):
        """Returns (status, headers with lower-case names, body bytes)."""
        h = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        elif isinstance(body, str):
            body = body.encode()
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def json(self, method, path, body=None, headers=None, expect=None, timeout=30):
        st, hd, data = self.request(method, path, body, headers, timeout)
        doc = json.loads(data) if data else None
        if expect is not None and st != expect:
            raise AssertionError("%s %s: expected %s, got %s: %s" % (method, path, expect, st, data[:2000]))
        return st, hd, doc

    def wait_status(self, job_id, statuses, timeout=20, kind="jobs"):
        t0 = time.time()
        while time.time() - t0 < timeout:
            _, _, j = self.json("GET", "/v1/%s/%s" % (kind, job_id), expect=200)
            if j["status"] in statuses:
                return j
            time.sleep(0.05)
        raise AssertionError("job %s did not reach %s in %ss: %s" % (job_id, statuses, timeout, j))

    def wait_stage(self, job_id, stage, timeout=20):
        t0 = time.time()
        while time.time() - t0 < timeout:
            _, _, j = self.json("GET", "/v1/jobs/%s" % job_id, expect=200)
            if j["status"] == "running" and j["stage"] == stage:
                return j
            time.sleep(0.02)
        raise AssertionError("job %s never ran stage %s: %s" % (job_id, stage, j))


def check_problem(status, headers, doc, want_status, code=None, pointer=None):
    assert status == want_status, "expected %s, got %s: %s" % (want_status, status, doc)
    assert headers.get("content-type", "").startswith("application/problem+json"), headers
    for k in ("type", "title", "status", "detail", "code", "request_id"):
        assert k in doc, "problem lacks %s: %s" % (k, doc)
    assert doc["status"] == want_status
    assert doc["request_id"] == headers.get("x-request-id"), (doc, headers)
    if code:
        assert doc["code"] == code, doc
    if pointer is not None:
        ptrs = [e.get("pointer") for e in doc.get("errors", [])]
        assert pointer in ptrs, "pointer %s not in %s" % (pointer, ptrs)
