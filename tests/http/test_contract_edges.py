"""Black-box regressions for what Schemathesis (tests/http/test_schemathesis.py) found
where the server and its contract disagreed, on a production server (no test stages).
The rule they follow: a request the contract's schemas allow never gets a 400; what
they allow but the server cannot act on is a 422.
- A body that is valid JSON but not an object (`0`, `"x"`, `null`) is a 400 naming the
  body's type, not "not valid JSON".
- A model registration's size_bytes may be written 194.0, like every integer.
- Valid JSON the server cannot hold (U+0000 in a string or a key, an integer beyond 64
  bits) is a 422 unprocessable_json, not a 400 invalid_json, and its error's pointer names
  where the value sits (RFC 6901; a key holding U+0000 is named by its object).
- A list cursor (`after`) of the list's id shape that names no item is a 422
  cursor_not_found; one of another shape stays a 400 invalid_parameter."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from acserver import Server, check_problem  # noqa: E402

SPEC = '{"model": {"path": "models/tiny.bin"}, "constraints": {"params": 1000}%s}'
CT = {"Content-Type": "application/json"}


def main():
    s = Server(test_stages=False)
    s.env.pop("AC_TEST_STAGES", None)
    with s:
        # --- valid JSON that is not an object
        for body in ("0", '"text"', "null", "true", "[]"):
            for path in ("/v1/jobs", "/v1/calibrations", "/v1/models", "/v1/estimates"):
                st, hd, doc = s.json("POST", path, body, CT)
                check_problem(st, hd, doc, 400, pointer="")
                assert doc["code"] != "invalid_json", (path, body, doc)
        # --- valid JSON the server cannot hold
        for path, body, ptr in (("/v1/jobs", SPEC % ', "name": "a\\u0000b"', "/name"),
                                ("/v1/jobs", SPEC % ', "metadata": {"k\\u0000": "v"}', "/metadata"),
                                ("/v1/jobs", SPEC % ', "x": 18446744073709551616', "/x"),
                                ("/v1/jobs", SPEC % ', "evaluation": {"tasks": ["arc_easy", 18446744073709551616, 1]}',
                                 "/evaluation/tasks/1"),
                                ("/v1/jobs", SPEC % ', "metadata": {"a/b~\\u00e9": [[0], {"x": 1e999}]}',
                                 "/metadata/a~1b~0\u00e9/1/x"),
                                ("/v1/models", '{"path": "|\\u00e9\\u0000"}', "/path"),
                                ("/v1/estimates", '{"target": {}, "arch": {"\\u0000": 1}}', "/arch"),
                                ("/v1/estimates", '{"target": {}, "arch": {"n": -28104915893911114131303935577937674240}}',
                                 "/arch/n")):
            st, hd, doc = s.json("POST", path, body, CT)
            check_problem(st, hd, doc, 422, "unprocessable_json", pointer=ptr)
        # a pointer longer than the server keeps, cut inside a character: still listed
        deep = "1e999"
        for _ in range(5):
            deep = '{"%s": %s}' % ("\\u00e9" * 60, deep)
        st, hd, doc = s.json("POST", "/v1/jobs", SPEC % (', "metadata": %s' % deep), CT)
        check_problem(st, hd, doc, 422, "unprocessable_json")
        assert doc["errors"][0]["pointer"].startswith("/metadata/\u00e9\u00e9"), doc
        st, hd, doc = s.json("POST", "/v1/jobs", '{"model": ', CT)     # still invalid JSON: 400
        check_problem(st, hd, doc, 400, "invalid_json")
        # --- an integral real is an integer in a model registration too
        st, hd, doc = s.json("POST", "/v1/models", {"url": "https://127.0.0.1:9/m.gguf", "sha256": "ab" * 32,
                                                    "size_bytes": 194.0})
        assert st == 202 and doc["bytes_total"] in (None, 194), (st, doc)
        # --- list cursors: well-formed but unknown is 422, malformed is 400
        for path, prefix in (("/v1/jobs", "job_"), ("/v1/calibrations", "cal_"), ("/v1/models", "mdl_")):
            st, hd, doc = s.json("GET", "%s?after=%s%s" % (path, prefix, "0" * 24))
            check_problem(st, hd, doc, 422, "cursor_not_found")
            assert doc["errors"][0]["parameter"] == "after", doc
            for bad in ("0" * 64, prefix + "xyz", prefix + "0" * 25, "evt_1"):
                check_problem(*s.json("GET", "%s?after=%s" % (path, bad)), 400, "invalid_parameter")
        assert s.stop() == 0
    print("non-object bodies, unholdable JSON values and unknown cursors get the contract's answers")


if __name__ == "__main__":
    main()
