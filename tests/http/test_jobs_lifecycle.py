"""Black-box: a job's life through the real server and worker processes — stages run in
order with events and progress, long-polls (job ?wait with If-None-Match, events ?wait
with a cursor) return promptly on change, a multi-megabyte artifact downloads whole and
by Range and reassembles to the same sha-256 (ETag, Repr-Digest, If-None-Match,
If-Range, 416, HEAD), cancel reaches a running worker within a second, a missing stage
fails the job with "stage X is not available in this build", delete needs a terminal
job, and calibrations run as jobs of their own kind."""
import base64
import hashlib
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from acserver import Server, check_problem, test_spec  # noqa: E402

MB6 = 6 * 1024 * 1024 + 123


def main():
    with Server() as s:
        # --- a job that publishes a 6 MB artifact, then sleeps
        st, hd, job = s.json("POST", "/v1/jobs", test_spec(["test_artifact", "test_sleep"], x_test_sleep_ms=1500,
                                                           x_test_artifact_bytes=MB6), expect=201)
        jid = job["id"]
        assert job["status"] == "queued" and job["stages"] == ["test_artifact", "test_sleep"]
        assert job["created_at"] > 1.6e9 and job["started_at"] is None
        j = s.wait_stage(jid, "test_sleep")
        assert j["stages_done"] == 1 and j["started_at"] and j["attempts"] == 1
        # job long-poll: If-None-Match with the current ETag waits for the next change
        _, hd, j = s.json("GET", "/v1/jobs/" + jid, expect=200)
        etag = hd["etag"]
        st, _, _ = s.json("GET", "/v1/jobs/" + jid, headers={"If-None-Match": etag})
        assert st in (200, 304)
        t0 = time.time()
        st, hd2, j2 = s.json("GET", "/v1/jobs/%s?wait=10" % jid, headers={"If-None-Match": etag})
        assert time.time() - t0 < 5 and (st == 200 and hd2["etag"] != etag), (st, hd2)
        # until terminal: ?wait without a validator returns when the job is done
        st, hd, done = s.json("GET", "/v1/jobs/%s?wait=20" % jid, expect=200)
        assert done["status"] == "succeeded", done
        assert done["finished_at"] >= done["started_at"] and done["error"] is None
        assert done["progress"]["stage"] == "test_sleep" and done["progress"]["percent"] == 100.0
        st, hd3, _ = s.request("GET", "/v1/jobs/" + jid, headers={"If-None-Match": hd["etag"]})
        assert st == 304, st

        # --- events: ordered, cursor, long-poll returns immediately when terminal
        _, _, ev = s.json("GET", "/v1/jobs/%s/events?limit=1000" % jid, expect=200)
        types = [e["type"] for e in ev["data"]]
        for want in ("job.created", "job.started", "stage.started", "artifact.published", "stage.completed",
                     "test.sleep", "job.succeeded"):
            assert want in types, (want, types)
        assert types[0] == "job.created" and types[-1] == "job.succeeded"
        ids = [e["id"] for e in ev["data"]]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        _, _, page = s.json("GET", "/v1/jobs/%s/events?limit=2" % jid, expect=200)
        assert page["has_more"] and len(page["data"]) == 2
        _, _, page2 = s.json("GET", "/v1/jobs/%s/events?limit=2&after=%s" % (jid, page["last_id"]), expect=200)
        assert page2["data"][0]["id"] == ids[2]
        t0 = time.time()
        _, _, tail = s.json("GET", "/v1/jobs/%s/events?after=%s&wait=10" % (jid, ids[-1]), expect=200)
        assert tail["data"] == [] and time.time() - t0 < 2

        # --- report
        _, _, rep = s.json("GET", "/v1/jobs/%s/report" % jid, expect=200)
        assert rep["job_id"] == jid and rep["complete"] is True and rep["test"]["artifact_bytes"] == MB6
        assert [x["name"] for x in rep["stages"]] == ["test_artifact", "test_sleep"]
        assert rep["stages"][1]["wall_s"] >= 1.0

        # --- artifacts
        _, _, arts = s.json("GET", "/v1/jobs/%s/artifacts" % jid, expect=200)
        blob = [a for a in arts["data"] if a["name"] == "blob.bin"][0]
        assert blob["size_bytes"] == MB6 and blob["stage"] == "test_artifact"
        url = blob["url"]
        st, hd, whole = s.request("GET", url)
        assert st == 200 and len(whole) == MB6
        digest = hashlib.sha256(whole).hexdigest()
        assert digest == blob["sha256"] and hd["etag"] == '"%s"' % digest
        assert hd["repr-digest"] == "sha-256=:%s:" % base64.b64encode(hashlib.sha256(whole).digest()).decode()
        assert hd["accept-ranges"] == "bytes" and 'filename="blob.bin"' in hd["content-disposition"]
        # ranges in 7 pieces, fetched concurrently, reassemble to the same digest
        step = MB6 // 7 + 1
        parts = {}
        def fetch(i):
            a, b = i * step, min(MB6, (i + 1) * step) - 1
            st, hd, data = s.request("GET", url, headers={"Range": "bytes=%d-%d" % (a, b)})
            assert st == 206 and hd["content-range"] == "bytes %d-%d/%d" % (a, b, MB6), (st, hd)
            parts[i] = data
        th = [threading.Thread(target=fetch, args=(i,)) for i in range(7)]
        [t.start() for t in th]
        [t.join() for t in th]
        assert hashlib.sha256(b"".join(parts[i] for i in range(7))).hexdigest() == digest
        st, hd, data = s.request("GET", url, headers={"Range": "bytes=-100"})
        assert st == 206 and data == whole[-100:]
        st, hd, data = s.request("GET", url, headers={"Range": "bytes=%d-" % (MB6 - 10)})
        assert st == 206 and data == whole[-10:]
        st, hd, data = s.request("GET", url, headers={"Range": "bytes=%d-" % MB6})
        assert st == 416 and hd["content-range"] == "bytes */%d" % MB6
        # a problem is not the artifact: no attachment name (a browser would save the
        # problem as blob.bin) and not immutable
        assert "content-disposition" not in hd and "cache-control" not in hd and "repr-digest" not in hd, hd
        assert hd["etag"] == '"%s"' % digest, hd   # the representation the 416 refers to
        # positions past 2^63 - 1 (RFC 9110 sets no limit on the digits) are past the end, not malformed
        huge = "99999999999999999999"
        st, hd, data = s.request("GET", url, headers={"Range": "bytes=%s-" % huge})
        assert st == 416 and hd["content-range"] == "bytes */%d" % MB6, (st, hd)
        st, hd, data = s.request("GET", url, headers={"Range": "bytes=%d-%s" % (MB6 - 10, huge)})
        assert st == 206 and data == whole[-10:], (st, hd)
        st, hd, data = s.request("GET", url, headers={"Range": "bytes=-%s" % huge})
        assert st == 206 and hd["content-range"] == "bytes 0-%d/%d" % (MB6 - 1, MB6) and len(data) == MB6, (st, hd)
        st, hd, data = s.request("GET", url, headers={"Range": "bytes=0-9", "If-Range": '"%s"' % digest})
        assert st == 206 and data == whole[:10]
        st, hd, data = s.request("GET", url, headers={"Range": "bytes=0-9", "If-Range": '"stale"'})
        assert st == 200 and len(data) == MB6
        st, hd, data = s.request("GET", url, headers={"Range": "bytes=0-1,5-6"})
        assert st == 200 and len(data) == MB6  # several ranges: the whole representation
        st, hd, data = s.request("GET", url, headers={"If-None-Match": '"%s"' % digest})
        assert st == 304 and data == b""
        st, hd, data = s.request("HEAD", url)
        assert st == 200 and data == b"" and int(hd["content-length"]) == MB6 and hd["etag"] == '"%s"' % digest

        # --- cancel a running job: the worker stops within a second
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=60000), expect=201)
        s.wait_stage(job["id"], "test_sleep")
        # an events long-poll parked at the tail wakes as soon as the next event lands; the
        # tail is taken once the stage's own events are written (the stage field is set
        # first), so nothing but the cancel can wake it
        t0 = time.time()
        while True:
            _, _, ev = s.json("GET", "/v1/jobs/%s/events?limit=1000" % job["id"], expect=200)
            if any(e["type"] == "test.sleep" for e in ev["data"]) or time.time() - t0 > 10:
                break
            time.sleep(0.02)
        woke = {}
        def poll():
            t = time.time()
            woke["page"] = s.json("GET", "/v1/jobs/%s/events?after=%s&wait=20" % (job["id"], ev["last_id"]), expect=200)[2]
            woke["dt"] = time.time() - t
        th = threading.Thread(target=poll)
        th.start()
        time.sleep(0.5)
        _, _, m = s.request("GET", "/metrics")
        assert b"ac_http_suspended_requests 1" in m, m
        t0 = time.time()
        _, _, c = s.json("POST", "/v1/jobs/%s/cancel" % job["id"], expect=200)
        th.join()
        assert woke["page"]["data"] and woke["page"]["data"][0]["type"] == "job.cancel_requested", woke
        assert time.time() - t0 < 1.0 and woke["dt"] < 5, woke
        assert c["cancel_requested"] is True and c["status"] in ("running", "cancelled")
        fin = s.wait_status(job["id"], ("cancelled", "failed", "succeeded"), timeout=5)
        assert fin["status"] == "cancelled" and time.time() - t0 < 1.5, (fin, time.time() - t0)
        _, _, c2 = s.json("POST", "/v1/jobs/%s/cancel" % job["id"], expect=200)  # terminal: no error
        assert c2["status"] == "cancelled"

        # --- a stage blocked in a system call that the cancel interrupts (EINTR) and that
        # fails because of it: the job ends cancelled, not failed
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_fail"], x_test_sleep_ms=30000), expect=201)
        s.wait_stage(job["id"], "test_fail")
        time.sleep(0.3)
        s.json("POST", "/v1/jobs/%s/cancel" % job["id"], expect=200)
        fin = s.wait_status(job["id"], ("cancelled", "failed", "succeeded"), timeout=5)
        assert fin["status"] == "cancelled" and fin["error"] is None, fin

        # --- cancel a queued job (the only worker slot is busy)
        _, _, busy = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=60000), expect=201)
        _, _, queued = s.json("POST", "/v1/jobs", test_spec(["test_sleep"]), expect=201)
        s.wait_stage(busy["id"], "test_sleep")
        _, _, q = s.json("GET", "/v1/jobs/" + queued["id"], expect=200)
        assert q["status"] == "queued"
        _, _, q = s.json("POST", "/v1/jobs/%s/cancel" % queued["id"], expect=200)
        assert q["status"] == "cancelled" and q["started_at"] is None
        check_problem(*s.json("DELETE", "/v1/jobs/" + busy["id"]), 409, "job_not_terminal")
        s.json("POST", "/v1/jobs/%s/cancel" % busy["id"], expect=200)
        s.wait_status(busy["id"], ("cancelled",), timeout=5)

        # --- a stage this build lacks fails the job, naming it
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_sleep", "no_such_stage"], x_test_sleep_ms=100), expect=201)
        fin = s.wait_status(job["id"], ("failed", "succeeded"))
        assert fin["status"] == "failed" and fin["error"]["code"] == "stage_unavailable", fin
        assert fin["error"]["message"] == "stage no_such_stage is not available in this build", fin
        assert fin["stages_done"] == 1
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_fail"]), expect=201)
        fin = s.wait_status(job["id"], ("failed", "succeeded"))
        assert fin["error"]["code"] == "stage_failed" and "test_fail always fails" in fin["error"]["message"]
        # a failure message cut inside a character (the stage's 1,023 bytes, the stored
        # error's 1,023): the job's error and its job.failed event still render
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_fail"], x_test_fail_message="\u00e9" * 700), expect=201)
        fin = s.wait_status(job["id"], ("failed", "succeeded"))
        assert fin["error"] and fin["error"]["code"] == "stage_failed", fin
        assert fin["error"]["message"].startswith("stage test_fail failed: \u00e9\u00e9"), fin
        assert len(fin["error"]["message"].encode()) <= 1023, fin
        _, _, ev = s.json("GET", "/v1/jobs/%s/events" % job["id"], expect=200)
        failed = [e for e in ev["data"] if e["type"] == "job.failed"]
        assert len(failed) == 1 and failed[0]["message"].startswith("job failed: stage test_fail failed: \u00e9"), ev

        # --- delete a terminal job: gone with its events and artifacts
        _, _, dl = s.json("DELETE", "/v1/jobs/" + jid, expect=200)
        assert dl == {"id": jid, "object": "job.deleted", "deleted": True}
        check_problem(*s.json("GET", "/v1/jobs/" + jid), 404)
        check_problem(*s.json("GET", url), 404)
        check_problem(*s.json("GET", "/v1/jobs/%s/events" % jid), 404)
        assert not os.path.exists(os.path.join(s.data_dir, "artifacts", "sha256", digest[:2], digest))
        assert not os.path.exists(os.path.join(s.data_dir, "jobs", jid))

        # --- list: newest first, cursor pagination
        _, _, lst = s.json("GET", "/v1/jobs?limit=2", expect=200)
        assert lst["object"] == "list" and len(lst["data"]) == 2 and lst["has_more"]
        assert lst["first_id"] == lst["data"][0]["id"]

        # --- calibrations: a job of kind calibration running the single stage "calibrate"
        st, hd, cal = s.json("POST", "/v1/calibrations", {"model": {"path": "models/tiny.bin"}, "target": {"device": "cpu"}})
        assert st == 202 and cal["id"].startswith("cal_") and cal["object"] == "calibration", (st, cal)
        assert hd["location"] == "/v1/calibrations/" + cal["id"]
        fin = s.wait_status(cal["id"], ("failed", "succeeded"), timeout=60, kind="calibrations")
        assert "result" in fin
        if fin["status"] == "failed":  # until the calibrate stage is registered in this build
            assert fin["error"]["message"] == "stage calibrate is not available in this build" or \
                fin["error"]["code"] == "stage_failed", fin
        _, _, cl = s.json("GET", "/v1/calibrations", expect=200)
        assert cl["data"][0]["id"] == cal["id"]
        check_problem(*s.json("GET", "/v1/jobs/" + cal["id"]), 404)
        check_problem(*s.json("GET", "/v1/calibrations/" + job["id"]), 404)
        st, hd, cal2 = s.json("POST", "/v1/calibrations", {"model": {"path": "models/tiny.bin"},
                                                            "x_test_pipeline": ["test_sleep"], "x_test_sleep_ms": 50})
        fin = s.wait_status(cal2["id"], ("failed", "succeeded"), kind="calibrations")
        assert fin["status"] == "succeeded" and fin["result"] is None  # no calibration.json published

        assert s.stop() == 0
        assert '"status":5' not in s.log_text()
    print("ok")


if __name__ == "__main__":
    main()
