"""Black-box: bearer tokens from --tokens-file (and AC_TOKENS_FILE): every /v1 route needs
a token (401 problem with WWW-Authenticate), a read token cannot write (403), a write
token can, /healthz stays open; and without AC_TEST_STAGES the test-only spec fields are
unknown fields (400)."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from acserver import CALIB, Server, check_problem, test_spec  # noqa: E402

READ = "r" * 8 + "-read-token-0123"
WRITE = "w" * 8 + "-write-token-0123"


def main():
    s = Server(test_stages=False)
    tokens = os.path.join(s.tmp, "tokens")
    with open(tokens, "w") as f:
        f.write("# comment\n%s read\n\n%s read,write   # both\n" % (READ, WRITE))
    s.env["AC_TOKENS_FILE"] = tokens
    with s:
        rd = {"Authorization": "Bearer " + READ}
        wr = {"Authorization": "Bearer " + WRITE}
        s.json("GET", "/healthz", expect=200)
        for path in ("/v1/jobs", "/v1/devices", "/v1/models", "/v1/jobs/job_x", "/v1/nope"):
            st, hd, doc = s.json("GET", path)
            check_problem(st, hd, doc, 401, "unauthorized")
            assert hd["www-authenticate"].startswith("Bearer")
        check_problem(*s.json("GET", "/v1/jobs", headers={"Authorization": "Bearer " + READ[:-1] + "X"}), 401)
        check_problem(*s.json("GET", "/v1/jobs", headers={"Authorization": "Basic abc"}), 401)
        check_problem(*s.json("GET", "/v1/jobs", headers={"Authorization": "Bearer "}), 401)
        s.json("GET", "/v1/jobs", headers=rd, expect=200)
        s.json("GET", "/v1/devices", headers=wr, expect=200)
        spec = {"model": {"path": "models/tiny.bin"}, "constraints": {"params": 1000}, "data": CALIB}
        check_problem(*s.json("POST", "/v1/jobs", spec, headers=rd), 403, "insufficient_scope")
        check_problem(*s.json("POST", "/v1/jobs", spec), 401)
        st, hd, job = s.json("POST", "/v1/jobs", spec, headers=wr, expect=201)
        check_problem(*s.json("POST", "/v1/jobs/%s/cancel" % job["id"], headers=rd), 403)
        s.json("POST", "/v1/jobs/%s/cancel" % job["id"], headers=wr, expect=200)
        # test-only fields are unknown without AC_TEST_STAGES=1
        check_problem(*s.json("POST", "/v1/jobs", test_spec(["test_sleep"]), headers=wr), 400, pointer="/x_test_pipeline")
        assert s.stop() == 0
    # a bad tokens file refuses to start
    bad = Server(test_stages=False, args=["--tokens-file", "/nonexistent/tokens"])
    try:
        try:
            bad.start(timeout=5)
            raise AssertionError("server started with a missing tokens file")
        except RuntimeError as e:
            assert "tokens" in str(e)
    finally:
        bad.cleanup()
    print("ok")


if __name__ == "__main__":
    main()
