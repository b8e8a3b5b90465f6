"""End to end through HTTP: a calibration made beside other work says so. With a process
spinning on every core, POST /v1/calibrations for stories260K succeeds and its document's
host_load is contended (other processes kept cores busy that its threads needed), and the
calibration's events carry calibrate.contended with the share; the load's numbers are
consistent with the rule (docs/timing-tables.md). The spinners stop before the test ends."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import MODEL, TOK, server  # noqa: E402

SPIN = "import time\nt = time.time()\nwhile time.time() - t < 600: pass\n"


def main():
    cores = os.cpu_count() or 1
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(cores)]
    s = server()
    try:
        s.start()
        body = {"model": {"path": MODEL, "tokenizer": TOK},
                "target": {"device": "cpu", "workload": {"batch_size": 1, "prompt_tokens": 256, "output_tokens": 64}}}
        _, _, c = s.json("POST", "/v1/calibrations", body, expect=202)
        t0 = time.time()
        while c["status"] not in ("succeeded", "failed", "cancelled"):
            assert time.time() - t0 < 600, c
            _, _, c = s.json("GET", "/v1/calibrations/%s?wait=10" % c["id"], expect=200, timeout=40)
        assert c["status"] == "succeeded", c
        hl = c["result"]["host_load"]
        assert hl["known"] is True and hl["cores"] >= 1 and 1 <= hl["threads"] <= hl["cores"], hl
        busy = (hl["others_cpu_pct"] + hl["steal_pct"]) / 100 * hl["cores"]
        assert hl["wall_s"] >= 1 and not hl["too_short"], hl   # beside the spinners it takes seconds
        assert hl["contended"] is True and busy >= hl["cores"] - hl["threads"] + 0.25, hl
        _, _, ev = s.json("GET", "/v1/jobs/%s/events?limit=1000" % c["id"], expect=200)
        got = [e for e in ev["data"] if e["type"] == "calibrate.contended"]
        assert len(got) == 1, [e["type"] for e in ev["data"]]
        assert "beside other work" in got[0]["message"] and "%.0f%%" % hl["others_cpu_pct"] in got[0]["message"], got
        assert got[0]["data"]["contended"] is True, got
        print("calibration beside %d spinning processes: others %.0f%% of %d cores over %.1f s, contended; event: %s"
              % (cores, hl["others_cpu_pct"], hl["cores"], hl["wall_s"], got[0]["message"][:80]))
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()
        s.stop()


if __name__ == "__main__":
    main()
