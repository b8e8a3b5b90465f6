"""Black-box: target.precision bf16 on the built-in engine. /v1/devices lists the CPU's
GEMM precisions (oneDNN's probe: a kernel for the type on this CPU, never its reference
loops). A precision the CPU lists runs a whole stories260K job at it: the calibration is
measured at bf16 (its own id, its document names oneDNN's kernel), and the job's report
carries the precision it was calibrated, distilled, evaluated and measured at. A precision
the CPU does not list is a 422 at /target/precision naming why, and nothing is queued."""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import server, stories_spec, wait_terminal  # noqa: E402


def main():
    s = server()
    try:
        s.start()
        _, _, devs = s.json("GET", "/v1/devices", expect=200)
        cpu = next(d for d in devs["data"] if d["id"] == "cpu")
        precs = cpu["precisions"]
        assert precs[0] == "fp32" and set(precs) <= {"fp32", "bf16", "fp16"}, precs
        print("cpu precisions:", precs)
        _, _, before = s.json("GET", "/v1/jobs", expect=200)
        for p in ("bf16", "fp16"):
            if p in precs:
                continue
            spec = stories_spec()
            spec["target"]["precision"] = p
            st, _, body = s.json("POST", "/v1/jobs", spec)
            assert st == 422, (st, body)
            errs = [e for e in body["errors"] if e["pointer"] == "/target/precision"]
            assert errs and p in errs[0]["message"] and "cpu" in errs[0]["message"], body
            print("refused:", errs[0]["message"])
        _, _, after = s.json("GET", "/v1/jobs", expect=200)
        assert len(after["data"]) == len(before["data"]), "a refused spec queued a job"
        if "bf16" not in precs:
            print("this CPU has no bf16 GEMM kernel: the bf16 job is not run here")
            return
        reps = {}
        for p in ("fp32", "bf16"):   # the same job at both precisions, on one server
            spec = stories_spec(evaluation={"tasks": ["lambada_openai"], "limit": 10, "seed": 1234})
            spec["target"]["precision"] = p
            _, _, job = s.json("POST", "/v1/jobs", spec, expect=201)
            fin = wait_terminal(s, job["id"], 900)
            assert fin["status"] == "succeeded", fin
            _, _, reps[p] = s.json("GET", "/v1/jobs/%s/report" % job["id"], expect=200)
        rep, r32 = reps["bf16"], reps["fp32"]
        assert rep["target"]["precision"] == "bf16" and rep["target"]["engine"] == "autocompress", rep["target"]
        assert rep["calibration_id"] != r32["calibration_id"], "the bf16 job reused the fp32 calibration"
        with open(os.path.join(s.data_dir, "calibrations", rep["calibration_id"] + ".json")) as f:
            cal = json.load(f)
        assert cal["target"]["precision"] == "bf16", cal["target"]
        kernel = cal["cpu"]["gemm_kernel"]
        assert "bf16" in kernel and kernel != cal["cpu"]["blas_kernel"], cal["cpu"]
        # the memory model counts the kept bf16 copy of every weight matrix: about 4 + 2
        # bytes a parameter at bf16, 4 at fp32 (both measured)
        with open(os.path.join(s.data_dir, "calibrations", r32["calibration_id"] + ".json")) as f:
            cal32 = json.load(f)
        w16, w32 = (c["tables"]["memory"]["weight_bytes_per_param"] for c in (cal, cal32))
        assert 3.9 < w32 < 4.2 and 5.6 < w16 < 6.4, (w16, w32)
        # the parent is scored again at bf16 (not the fp32 job's cached scores): close to
        # fp32's, not equal to it
        ppl = rep["result"]["perplexity"]["lambada_openai"]
        p16, p32 = rep["parent"]["perplexity"]["lambada_openai"], r32["parent"]["perplexity"]["lambada_openai"]
        assert 1 < ppl < float("inf"), rep["result"]
        assert p16 != p32 and abs(math.log(p16 / p32)) < 0.1, (p16, p32)
        lim = rep["limits"][0]
        assert lim["measured"] > 0, lim
        print("bf16 job: calibration %s (gemm %s), params %s -> %s, lambada ppl %.4g; parent %.6g at bf16, "
              "%.6g at fp32; weight bytes a parameter %.3f at bf16, %.3f at fp32; %s" % (
                  rep["calibration_id"], kernel, rep["parent"]["params"], rep["result"]["params"], ppl, p16, p32, w16,
                  w32, lim))
    finally:
        s.stop()


if __name__ == "__main__":
    main()
