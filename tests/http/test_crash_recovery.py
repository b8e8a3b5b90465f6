"""Black-box: crashes and restarts, under --max-attempts 2. kill -9 of a worker requeues
its job once, the second kill fails it naming the signal and the stage; a worker that
aborts likewise; kill -9 of the server mid-job takes its worker down with it, and the
restarted server requeues the job, which resumes at its first unfinished stage with its
earlier events and artifacts intact; a job whose server dies on every start fails once
its starts are spent (server_lost) instead of looping; SIGTERM stops the server
gracefully (the running job goes back to the queue and resumes after restart)."""
import hashlib
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from acserver import Server, test_spec  # noqa: E402


def worker_pids(job_id):
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv and job_id.encode() in argv:
            try:
                with open("/proc/%s/stat" % p) as f:
                    if f.read().split(")")[-1].split()[0] == "Z":
                        continue
            except OSError:
                continue
            pids.append(int(p))
    return pids


def events(s, jid):
    _, _, ev = s.json("GET", "/v1/jobs/%s/events?limit=1000" % jid, expect=200)
    return ev["data"]


def main():
    with Server(args=["--max-attempts", "2"]) as s:
        # --- kill -9 of a worker: requeued (attempt 2 of 2), then killed again: failed
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=60000), expect=201)
        for attempt in (1, 2):
            t0 = time.time()
            while time.time() - t0 < 10:
                j = s.wait_stage(job["id"], "test_sleep")
                pids = worker_pids(job["id"])
                if j["attempts"] == attempt and len(pids) == 1:
                    break
                time.sleep(0.05)
            assert j["attempts"] == attempt and len(pids) == 1, (j, pids)
            os.kill(pids[0], signal.SIGKILL)
        fin = s.wait_status(job["id"], ("failed", "succeeded", "cancelled"), timeout=10)
        assert fin["status"] == "failed" and fin["error"]["code"] == "worker_killed", fin
        msg = fin["error"]["message"]
        assert "signal 9" in msg and "SIGKILL" in msg and "test_sleep" in msg, msg
        assert events(s, job["id"])[-1]["type"] == "job.failed"

        # --- a worker that crashes by itself
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_crash"]), expect=201)
        fin = s.wait_status(job["id"], ("failed", "succeeded"), timeout=10)
        assert "SIGABRT" in fin["error"]["message"] and "test_crash" in fin["error"]["message"], fin

        # --- kill -9 of the server during a running job, then restart
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_artifact", "test_sleep"], x_test_sleep_ms=2500,
                                                         x_test_artifact_bytes=3 << 20), expect=201)
        jid = job["id"]
        s.wait_stage(jid, "test_sleep")
        before = events(s, jid)
        _, _, arts = s.json("GET", "/v1/jobs/%s/artifacts" % jid, expect=200)
        blob = [a for a in arts["data"] if a["name"] == "blob.bin"][0]
        wp = worker_pids(jid)
        assert len(wp) == 1
        s.kill9()
        t0 = time.time()
        while worker_pids(jid) and time.time() - t0 < 5:
            time.sleep(0.05)
        assert not worker_pids(jid), "the worker outlived its server"
        s.restart()
        assert "requeued jobs a previous server left running" in s.log_text()
        fin = s.wait_status(jid, ("succeeded", "failed", "cancelled"), timeout=30)
        assert fin["status"] == "succeeded" and fin["attempts"] == 2, fin
        after = events(s, jid)
        assert [e["id"] for e in after[:len(before)]] == [e["id"] for e in before], "events were lost"
        types = [e["type"] for e in after]
        assert "job.requeued" in types
        started = [e["data"]["stage"] for e in after if e["type"] == "stage.started"]
        assert started == ["test_artifact", "test_sleep", "test_sleep"], started  # resumed, not restarted
        st, hd, data = s.request("GET", blob["url"])
        assert st == 200 and hashlib.sha256(data).hexdigest() == blob["sha256"]

        # --- a job whose server dies on each of its starts: failed once they are spent
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=60000), expect=201)
        jid = job["id"]
        for _ in range(2):
            s.wait_stage(jid, "test_sleep")
            s.kill9()
            t0 = time.time()
            while worker_pids(jid) and time.time() - t0 < 5:
                time.sleep(0.05)
            s.restart()
        fin = s.wait_status(jid, ("succeeded", "failed", "cancelled"), timeout=10)
        assert fin["status"] == "failed" and fin["error"]["code"] == "server_lost" and fin["attempts"] == 2, fin
        assert "after 2 of 2 attempts" in fin["error"]["message"], fin

        # --- SIGTERM while a job runs: graceful stop, the job resumes after restart
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_sleep", "test_sleep"], x_test_sleep_ms=1500), expect=201)
        jid = job["id"]
        s.wait_stage(jid, "test_sleep")
        t0 = time.time()
        assert s.stop() == 0
        assert time.time() - t0 < 10
        assert not worker_pids(jid)
        s.restart()
        fin = s.wait_status(jid, ("succeeded", "failed", "cancelled"), timeout=30)
        assert fin["status"] == "succeeded", fin
        types = [e["type"] for e in events(s, jid)]
        assert "job.requeued" in types, types
        assert s.stop() == 0
    print("ok")


if __name__ == "__main__":
    main()
