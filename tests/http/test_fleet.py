"""Many hosts on one machine, over a real PostgreSQL server (tests/tools/pg.sh): an API
server that runs no jobs (--workers 0) and two worker agents (`autocompress worker
--store postgresql://...`), each with a data directory of its own, as two hosts would be.
  - 50 queued jobs are drained by both agents, each job run exactly once;
  - a cancel posted to the API reaches the job on an agent within seconds;
  - kill -9 of the agent running a job: its lease runs out, the other agent takes the job
    over, runs again the finished stage whose outputs stayed on the dead host, and the
    artifact equals that of an uninterrupted run; with an S3 artifact store (moto) the
    agent taking over fetches that stage's outputs instead and resumes at the unfinished
    stage;
  - a calibration run by an agent serves the API's estimates (its timing tables come
    through the artifact store);
  - a model registered by URL (fetched by the API) reaches an agent through the artifact
    store, into the agent's own data directory;
  - the API, on a host without a GPU, takes jobs for a GPU that a live worker agent offers
    (its row in the runners registry), lists that device, refuses a precision the device
    lacks, and refuses the device again once the agent is gone;
  - an agent connected as the worker role of docs/fleet.md (its SQL is read from there)
    runs jobs, and that role cannot create one;
  - PostgreSQL killed while a job runs and started again: meanwhile the API answers 503
    with Retry-After; afterwards the job finishes, each stage run once, nothing lost;
  - PostgreSQL frozen (SIGSTOP: connections open, nothing answered): a worker agent given
    SIGTERM still ends, by its shutdown deadline (grace + 15 s), saying so.
# store: own PostgreSQL (not run again in tests/run_all.sh's PostgreSQL pass)
"""
import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from acserver import AC_BIN, Server, test_spec  # noqa: E402

PG = os.path.join(os.path.dirname(__file__), "..", "tools", "pg.sh")
SHARED = os.path.abspath(os.environ.get("AC_SHARED") or os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                                                      "shared"))


def pg(*args):
    return subprocess.run(["bash", PG] + list(args), check=True, capture_output=True, text=True).stdout.strip()


class Agent:
    def __init__(self, store, root, name, args=(), env=None):
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir)
        self.log_path = os.path.join(root, name + ".log")
        env = dict(os.environ, AC_TEST_STAGES="1", AC_STORE="", **(env or {}))
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([AC_BIN, "worker", "--store", store, "--devices", "cpu", "--data-dir", self.dir,
                                      "--lease-s", "3"] + list(args), stdout=self.log, stderr=self.log, env=env)
        self.runner = None
        self.name = name
        t0 = time.time()
        while time.time() - t0 < 15 and not self.runner:
            assert self.proc.poll() is None, "agent exited:\n" + self.text()
            for line in self.text().splitlines():
                if '"worker agent ready"' in line:
                    self.runner = json.loads(line)["runner"]
            time.sleep(0.05)
        assert self.runner, "agent did not start:\n" + self.text()

    def text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        text = self.text()
        for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            assert bad not in text, "sanitizer report in the agent log:\n" + text[-4000:]


def events(s, job_id):
    _, _, doc = s.json("GET", "/v1/jobs/%s/events?limit=1000" % job_id, expect=200)
    return doc["data"]


def runners(evs):
    return [e["data"]["runner"] for e in evs if e["type"] == "job.started"]


def blob_sha(s, job_id):
    _, _, doc = s.json("GET", "/v1/jobs/%s/artifacts" % job_id, expect=200)
    return {a["name"]: a["sha256"] for a in doc["data"]}["blob.bin"]


TAKEOVER_SPEC = test_spec(["test_artifact", "test_sleep"], x_test_sleep_ms=3500, x_test_artifact_bytes=300000)


def takeover(s, a, b):
    """kill -9 the agent that runs a job in its second stage; the other one finishes it.
    Returns the job's events."""
    jid = s.json("POST", "/v1/jobs", TAKEOVER_SPEC, expect=201)[2]["id"]
    running = s.wait_stage(jid, "test_sleep", timeout=20)
    first = runners(events(s, jid))[0]
    assert running["runner"] == first, (running, first)   # the job names the runner holding it
    victim, other = (a, b) if first == a.runner else (b, a)
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    t0 = time.time()
    j = s.wait_status(jid, ("succeeded", "failed"), timeout=60)
    assert j["status"] == "succeeded" and j["attempts"] == 2, j
    evs = events(s, jid)
    assert runners(evs) == [victim.runner, other.runner], runners(evs)
    assert [e for e in evs if e["type"] == "job.requeued" and "lease" in e["message"]], evs
    print("ok: kill -9 of %s: %s took the job over and finished it in %.1f s" % (victim.name, other.name,
                                                                                  time.time() - t0))
    return jid, evs


def drain_and_takeover(s, store, root):
    a, b = Agent(store, root, "host-a"), Agent(store, root, "host-b")
    try:
        ids = [s.json("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=100), expect=201)[2]["id"]
               for _ in range(50)]
        for i in ids:
            j = s.wait_status(i, ("succeeded", "failed", "cancelled"), timeout=120)
            assert j["status"] == "succeeded", j
        seen = {}
        for i in ids:
            evs = events(s, i)
            started = [e for e in evs if e["type"] == "stage.started"]
            assert len(runners(evs)) == 1 and len(started) == 1, (i, evs)
            seen[runners(evs)[0]] = seen.get(runners(evs)[0], 0) + 1
        assert set(seen) == {a.runner, b.runner}, seen
        print("ok: 50 jobs drained, each run once: %s" % seen)

        # a cancel posted to the API reaches the job on whichever agent runs it
        cid = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=60000), expect=201)[2]["id"]
        s.wait_stage(cid, "test_sleep", timeout=20)
        t0 = time.time()
        s.json("POST", "/v1/jobs/%s/cancel" % cid, expect=200)
        j = s.wait_status(cid, ("cancelled",), timeout=10)
        print("ok: cancel reached the agent in %.2f s" % (time.time() - t0))

        # the reference: the same job, uninterrupted
        ref = s.json("POST", "/v1/jobs", TAKEOVER_SPEC, expect=201)[2]["id"]
        assert s.wait_status(ref, ("succeeded", "failed"), timeout=60)["status"] == "succeeded"
        # no shared artifact store: the finished stage runs again on the new host
        jid, evs = takeover(s, a, b)
        rerun = [e for e in evs if e["type"] == "job.stages_rerun"]
        assert len(rerun) == 1 and rerun[0]["data"]["from"] == "test_artifact", rerun
        assert blob_sha(s, jid) == blob_sha(s, ref)
        print("ok: ... it ran test_artifact again (its outputs were on the dead host); artifact equal to the "
              "uninterrupted run's")
        return blob_sha(s, ref)
    finally:
        for x in (a, b):
            x.stop()


def start_moto():
    """A local S3 server (PyPI moto) with bucket ac-fleet: (process, the settings that point
    a runner at it)."""
    port = subprocess.run([sys.executable, "-c", "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); "
                           "print(s.getsockname()[1])"], capture_output=True, text=True, check=True).stdout.strip()
    moto = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1",
                             "-p", port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ep = "http://127.0.0.1:" + port
    for _ in range(100):
        try:
            urllib.request.urlopen(urllib.request.Request(ep + "/ac-fleet", method="PUT"), timeout=5).read()
            break
        except OSError:
            time.sleep(0.2)
    env = {"AWS_ENDPOINT_URL": ep, "AWS_ACCESS_KEY_ID": "AKIDTEST", "AWS_SECRET_ACCESS_KEY": "TopSecret42"}
    return moto, env, ["--artifacts", "s3://ac-fleet/x", "--s3-allow-http"]


def calibrate_elsewhere(s, agent_runner):
    """A calibration request run by an agent: the API (which runs no jobs) then answers
    estimates from it."""
    model = os.path.join(s.data_dir, "models", "stories260K.bin")
    shutil.copy(os.path.join(SHARED, "data", "models", "stories260K", "stories260K.bin"), model)
    req = {"model": {"path": "models/stories260K.bin"},
           "target": {"device": "cpu", "workload": {"batch_size": 1, "prompt_tokens": 32, "output_tokens": 8}}}
    _, _, cal = s.json("POST", "/v1/calibrations", req, expect=202)
    j = s.wait_status(cal["id"], ("succeeded", "failed", "cancelled"), timeout=300, kind="calibrations")
    assert j["status"] == "succeeded" and j["result"]["id"].startswith("cal_"), j
    assert runners(events(s, cal["id"])) == [agent_runner], events(s, cal["id"])
    _, _, est = s.json("POST", "/v1/estimates", req, expect=200)
    assert est["calibration_id"] == j["result"]["id"] and est["predicted"]["latency_ms"] > 0, est
    print("ok: a calibration run on an agent answers the API's estimates (%.2f ms predicted)"
          % est["predicted"]["latency_ms"])


def model_by_url(s, agent):
    """A model the API fetched by URL: the agent running its job takes its own copy."""
    src = os.path.join(SHARED, "data", "models", "stories260K", "stories260K.bin")
    sha = hashlib.sha256(open(src, "rb").read()).hexdigest()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=os.path.dirname(src))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = "http://127.0.0.1:%d/stories260K.bin" % httpd.server_address[1]
        _, _, m = s.json("POST", "/v1/models", {"url": url, "sha256": sha, "name": "stories"}, expect=202)
        t0 = time.time()
        while m["status"] != "ready":
            assert m["status"] == "fetching" and time.time() - t0 < 60, m
            time.sleep(0.1)
            _, _, m = s.json("GET", "/v1/models/" + m["id"], expect=200)
        jid = s.json("POST", "/v1/jobs", dict(test_spec(["test_sleep"], x_test_sleep_ms=100), model={"id": m["id"]}),
                     expect=201)[2]["id"]
        j = s.wait_status(jid, ("succeeded", "failed"), timeout=60)
        assert j["status"] == "succeeded", j
        evs = events(s, jid)
        assert runners(evs) == [agent.runner] and [e for e in evs if e["type"] == "model.localized"], evs
        copy = os.path.join(agent.dir, "models", sha, "stories260K.bin")
        assert hashlib.sha256(open(copy, "rb").read()).hexdigest() == sha, copy
        print("ok: a model the API fetched by URL reached the agent through the artifact store")
    finally:
        httpd.shutdown()


def takeover_with_s3(s, store, root, ref_sha, env, args):
    """Agents writing through to the S3 bucket the API reads: the new host fetches the
    finished stage's outputs and resumes at the unfinished one."""
    agents = []
    try:
        agents = [Agent(store, root, "host-c", args, env), Agent(store, root, "host-d", args, env)]
        jid, evs = takeover(s, *agents)
        kinds = [e["type"] for e in evs]
        assert "job.stage_fetched" in kinds and "job.stages_rerun" not in kinds, kinds
        started = [e["data"]["stage"] for e in evs if e["type"] == "stage.started"]
        assert started == ["test_artifact", "test_sleep", "test_sleep"], started   # resumed at the unfinished one
        assert blob_sha(s, jid) == ref_sha
        print("ok: ... with an S3 artifact store it fetched test_artifact's outputs and resumed at test_sleep; "
              "artifact equal to the uninterrupted run's")
        alive = [a for a in agents if a.proc.poll() is None][0]
        calibrate_elsewhere(s, alive.runner)
        model_by_url(s, alive)
    finally:
        for x in agents:
            x.stop()


def worker_role(s, store, root):
    """docs/fleet.md's worker role: it runs jobs, it cannot create them."""
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "fleet.md")).read()
    sql = re.search(r"```sql\n(.*?)```", doc, re.S).group(1).replace("'...'", "'worker-secret'")
    subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", store, "-c", sql], check=True, capture_output=True)
    as_worker = store.replace("user=postgres", "user=ac_worker")
    agent = Agent(as_worker, root, "host-role")
    try:
        t0 = time.time()   # its registry row (written with the role's grants) makes its devices visible
        while not [d for d in s.json("GET", "/v1/devices", expect=200)[2]["data"] if d.get("runner") == agent.runner]:
            assert time.time() - t0 < 10, "the role's agent never registered: " + agent.text()[-2000:]
            time.sleep(0.1)
        jid = s.json("POST", "/v1/jobs", test_spec(["test_sleep", "test_artifact"], x_test_sleep_ms=100,
                                                   x_test_artifact_bytes=1000), expect=201)[2]["id"]
        j = s.wait_status(jid, ("succeeded", "failed"), timeout=30)
        assert j["status"] == "succeeded" and runners(events(s, jid)) == [agent.runner], (j, events(s, jid))
    finally:
        agent.stop()
    p = subprocess.run(["psql", as_worker, "-c", "INSERT INTO jobs(id, kind, status, device, spec, stages, "
                        "created_at, updated_at) VALUES ('job_x', 'job', 'queued', 'cpu', '{}', '[]', 0, 0)"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "permission denied" in p.stderr, (p.returncode, p.stderr)
    print("ok: the worker role ran a job and may not create one")


GPU_HOST = {"devices": [{"id": "cuda:0", "object": "device", "kind": "cuda", "description": "NVIDIA H100 80GB HBM3",
                         "memory_bytes": 85520809984, "compute_capability": "9.0", "cores": 132,
                         "precisions": ["fp32", "bf16"]}],
            "engines": ["autocompress"], "workers_per_device": 1}


def fleet_devices(s, store):
    """A GPU that only a worker agent on another host has (its registry row, written as
    that agent would write it)."""
    gpu_job = test_spec(["test_sleep"], target={"device": "cuda:0", "precision": "bf16"})
    st, _, doc = s.json("POST", "/v1/jobs", gpu_job)
    assert st == 422 and any(e["pointer"] == "/target/device" for e in doc["errors"]), doc
    assert "no worker agent" in json.dumps(doc), doc
    def beat(seen):
        sql = ("INSERT INTO runners(name, info, started_at, seen_at) VALUES ('worker/gpu-host/var', '%s', %d, %d) "
               "ON CONFLICT (name) DO UPDATE SET seen_at=excluded.seen_at" % (json.dumps(GPU_HOST), seen, seen))
        subprocess.run(["psql", "-q", store, "-c", sql], check=True, capture_output=True)
    beat(int(time.time()))
    _, _, devs = s.json("GET", "/v1/devices", expect=200)
    remote = [d for d in devs["data"] if d.get("runner") == "worker/gpu-host/var"]
    assert [d["id"] for d in remote] == ["cuda:0"], devs
    _, _, job = s.json("POST", "/v1/jobs", gpu_job, expect=201)
    assert job["device"] == "cuda:0" and job["status"] == "queued", job
    st, _, doc = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], target={"device": "cuda:0", "precision": "fp16"}))
    assert st == 422 and any(e["pointer"] == "/target/precision" for e in doc["errors"]), doc
    s.json("POST", "/v1/jobs/%s/cancel" % job["id"], expect=200)
    beat(int(time.time()) - 3600)   # the agent stopped renewing its row an hour ago
    st, _, doc = s.json("POST", "/v1/jobs", gpu_job)
    assert st == 422, (st, doc)
    print("ok: a GPU only a live worker agent has is listed and taken; gone with the agent")


def store_restart(root):
    """The API server (running its own jobs) while PostgreSQL is killed and restarted."""
    pgdir = tempfile.mkdtemp(prefix="ac-pg-")   # its parents must be open to the postgres user
    base = pg("start", pgdir)
    store = pg("newdb", base, "ac_fleet_restart")
    try:
        with Server(env={"AC_STORE": store}) as s:
            jid = s.json("POST", "/v1/jobs", test_spec(["test_sleep", "test_sleep"], x_test_sleep_ms=3000),
                         expect=201)[2]["id"]
            s.wait_stage(jid, "test_sleep", timeout=20)
            pg("kill", pgdir)
            st, hd, doc = s.json("GET", "/v1/jobs/" + jid)
            assert st == 503 and hd.get("retry-after"), (st, hd, doc)
            st, hd, body = s.request("GET", "/v1/jobs/%s/report.html" % jid)
            assert st == 503 and hd.get("retry-after") and b"store_unavailable" in body, (st, hd, body[:300])
            st, hd, doc = s.json("POST", "/v1/jobs", test_spec(["test_sleep"]))
            assert st == 503 and hd.get("retry-after") and doc["code"] == "store_unavailable", (st, doc)
            st, hd, _ = s.json("GET", "/readyz")
            assert st == 503, st
            time.sleep(2)
            pg("start", pgdir)
            j = s.wait_status(jid, ("succeeded", "failed", "cancelled"), timeout=60)
            assert j["status"] == "succeeded" and j["attempts"] == 1, j
            evs = events(s, jid)
            kinds = [e["type"] for e in evs]
            assert kinds.count("job.started") == 1 and kinds.count("stage.started") == 2, kinds
            assert kinds.count("stage.completed") == 2 and kinds.count("job.succeeded") == 1, kinds
            print("ok: PostgreSQL killed and restarted mid-job: 503 with Retry-After meanwhile, the job ran once")
            s.stop()
    finally:
        pg("stop", pgdir)
        subprocess.run(["rm", "-rf", pgdir])


def frozen_store(root):
    """A worker agent whose store stops answering mid-call: SIGTERM ends it by the deadline."""
    pgdir = tempfile.mkdtemp(prefix="ac-pg-")
    base = pg("start", pgdir)
    store = pg("newdb", base, "ac_fleet_frozen")
    frozen = []
    try:
        agent = Agent(store, root, "frozen", args=["--shutdown-grace-s", "1"])
        with open(os.path.join(pgdir, "data", "postmaster.pid")) as f:
            postmaster = int(f.readline())
        kids = subprocess.run(["ps", "-o", "pid=", "--ppid", str(postmaster)], capture_output=True, text=True).stdout
        frozen = [postmaster] + [int(p) for p in kids.split()]
        for p in frozen:
            os.kill(p, signal.SIGSTOP)
        time.sleep(2)   # the agent's scheduler is now waiting on a store call (its rescue runs every second)
        t0 = time.time()
        agent.proc.send_signal(signal.SIGTERM)
        try:
            code = agent.proc.wait(30)
        except subprocess.TimeoutExpired:
            agent.proc.kill()
            agent.proc.wait()
            raise AssertionError("the agent was still running 30 s after SIGTERM:\n" + agent.text()[-2000:])
        took = time.time() - t0
        assert code == 1 and "shutdown did not finish within 16 s" in agent.text(), (code, agent.text()[-2000:])
        print("ok: a worker agent whose store froze ended %.1f s after SIGTERM (deadline 16 s)" % took)
    finally:
        for p in frozen:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
        pg("stop", pgdir)
        subprocess.run(["rm", "-rf", pgdir])


def main():
    root = tempfile.mkdtemp(prefix="ac-fleet-")
    pgdir = tempfile.mkdtemp(prefix="ac-pg-")
    base = pg("start", pgdir)
    moto, s3_env, s3_args = start_moto()
    try:
        store = pg("newdb", base, "ac_fleet")
        with Server(args=["--workers", "0", "--allow-http-models", "--allow-private-model-hosts"] + s3_args, env=dict(s3_env, AC_STORE=store, AC_SHARED=SHARED)) as s:
            ref_sha = drain_and_takeover(s, store, root)
            takeover_with_s3(s, store, root, ref_sha, dict(s3_env, AC_SHARED=SHARED), s3_args)
            fleet_devices(s, store)
            worker_role(s, store, root)
            s.stop()
    finally:
        moto.terminate()
        moto.wait()
        pg("stop", pgdir)
        subprocess.run(["rm", "-rf", pgdir])
    store_restart(root)
    frozen_store(root)
    subprocess.run(["rm", "-rf", root])


if __name__ == "__main__":
    main()
