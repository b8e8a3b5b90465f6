"""End to end through HTTP: a running calibration is cancelled through the API. POST
/v1/calibrations for stories260K at a workload that takes about a minute and a half
(batch 8, prompt 512, output 128), then POST /v1/calibrations/{id}/cancel once it runs:
the answer is the calibration (its schema's fields), it ends `cancelled` within a few
seconds, nothing is cached for it, a second cancel is a no-op, and the device's one worker
is free: a small calibration posted next succeeds. A calibration asked for by arch alone
(no model) succeeds, and estimates by that arch are answered from it. A job's id on the
calibrations route is a 404. Before, no route stopped a calibration short of killing the
server."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import MODEL, TOK, server  # noqa: E402


def main():
    s = server()
    try:
        s.start()
        body = {"model": {"path": MODEL, "tokenizer": TOK},
                "target": {"device": "cpu", "workload": {"batch_size": 8, "prompt_tokens": 512, "output_tokens": 128}}}
        _, _, c = s.json("POST", "/v1/calibrations", body, expect=202)
        t0 = time.time()
        while c["status"] != "running":
            assert c["status"] == "queued" and time.time() - t0 < 60, c
            time.sleep(0.2)
            _, _, c = s.json("GET", "/v1/calibrations/" + c["id"], expect=200)
        time.sleep(2)   # inside its requests
        t1 = time.time()
        # a POST: query parameters of the GET (wait) are not its business, nor parked on
        _, _, got = s.json("POST", "/v1/calibrations/%s/cancel?wait=abc" % c["id"], expect=200)
        assert time.time() - t1 < 2, time.time() - t1
        assert got["id"] == c["id"] and "result" in got and got["status"] in ("running", "cancelled"), got
        while got["status"] != "cancelled":
            assert got["status"] == "running" and time.time() - t1 < 10, got
            _, _, got = s.json("GET", "/v1/calibrations/%s?wait=5" % c["id"], expect=200, timeout=30)
        took = time.time() - t1
        assert got["result"] is None, got
        _, _, again = s.json("POST", "/v1/calibrations/%s/cancel" % c["id"], expect=200)
        assert again["status"] == "cancelled", again
        _, _, lst = s.json("GET", "/v1/calibrations?limit=100", expect=200)
        assert [x["status"] for x in lst["data"] if x["id"] == c["id"]] == ["cancelled"], lst
        cached = os.listdir(os.path.join(s.data_dir, "calibrations")) if os.path.isdir(
            os.path.join(s.data_dir, "calibrations")) else []
        assert not [f for f in cached if f.endswith(".json")], cached
        # the device's one worker is free again: a small calibration runs and succeeds at once
        small = dict(body, target={"device": "cpu", "workload": {"batch_size": 1, "prompt_tokens": 32,
                                                                "output_tokens": 8}})
        t2 = time.time()
        _, _, d = s.json("POST", "/v1/calibrations", small, expect=202)
        while d["status"] not in ("succeeded", "failed", "cancelled"):
            assert time.time() - t2 < 60, d
            _, _, d = s.json("GET", "/v1/calibrations/%s?wait=10" % d["id"], expect=200, timeout=40)
        assert d["status"] == "succeeded" and d["result"] is not None, d
        # a calibration of an arch, with no model (DESIGN.md §10 {model | arch, target}): an
        # estimate by that arch at a new workload has none, then is answered from it
        _, _, est = s.json("POST", "/v1/estimates", {"model": body["model"], "target": small["target"]}, expect=200)
        other = {"device": "cpu", "workload": {"batch_size": 1, "prompt_tokens": 48, "output_tokens": 8}}
        st, _, doc = s.json("POST", "/v1/estimates", {"arch": est["arch"], "target": other})
        assert st == 409 and doc["code"] == "calibration_required", (st, doc)
        _, _, a = s.json("POST", "/v1/calibrations", {"arch": est["arch"], "target": other}, expect=202)
        assert a["model"] is None and a["arch"] == est["arch"], a
        t3 = time.time()
        while a["status"] not in ("succeeded", "failed", "cancelled"):
            assert time.time() - t3 < 60, a
            _, _, a = s.json("GET", "/v1/calibrations/%s?wait=10" % a["id"], expect=200, timeout=40)
        assert a["status"] == "succeeded" and a["result"] is not None, a
        _, _, by_arch = s.json("POST", "/v1/estimates", {"arch": est["arch"], "target": other}, expect=200)
        assert by_arch["calibration_id"] == a["result"]["id"], (by_arch, a["result"]["id"])
        st, _, doc = s.json("POST", "/v1/calibrations", {"arch": est["arch"], "model": body["model"], "target": other})
        assert st == 422, (st, doc)
        st, _, doc = s.json("POST", "/v1/calibrations/job_0123456789abcdef01234567/cancel")
        assert st == 404, (st, doc)
        print("a running calibration cancelled through the API: cancelled %.1f s after the request; the next one "
              "succeeded %.1f s after it was posted" % (took, time.time() - t2))
    finally:
        s.stop()


if __name__ == "__main__":
    main()
