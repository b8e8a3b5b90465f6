"""Black-box: 200 job submissions from 40 concurrent clients are all committed (201 each,
ids unique), list pagination with a cursor sees each exactly once while new jobs keep
arriving, and all 200 survive kill -9 of the server (durable before 201)."""
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(__file__))
from acserver import Server, test_spec  # noqa: E402

N, CLIENTS = 200, 40


def main():
    with Server() as s:
        ids, errors = [], []
        lock = threading.Lock()

        def client(k):
            for i in range(k, N, CLIENTS):
                try:
                    # every job sleeps long, so one runs and the rest stay queued
                    st, hd, doc = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=60000,
                                                                       name="c%d" % i))
                    with lock:
                        (ids if st == 201 else errors).append(doc["id"] if st == 201 else (st, doc))
                except Exception as e:  # noqa: BLE001
                    with lock:
                        errors.append(repr(e))
        th = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
        [t.start() for t in th]
        [t.join() for t in th]
        assert not errors, errors[:5]
        assert len(ids) == N and len(set(ids)) == N

        def walk(limit):
            seen, after = [], None
            while True:
                q = "/v1/jobs?limit=%d" % limit + ("&after=" + after if after else "")
                _, _, page = s.json("GET", q, expect=200)
                seen += [j["id"] for j in page["data"]]
                if not page["has_more"]:
                    return seen
                after = page["last_id"]

        # pagination while more jobs arrive: each of the original 200 appears exactly once
        extra = []
        def more():
            for i in range(10):
                extra.append(s.json("POST", "/v1/jobs", test_spec(["test_fail"]), expect=201)[2]["id"])
        t = threading.Thread(target=more)
        t.start()
        seen = walk(7)
        t.join()
        assert sorted(x for x in seen if x in set(ids)) == sorted(ids), "pagination lost or repeated jobs"
        assert len(seen) == len(set(seen))
        names = {j: None for j in ids}
        seen_all = walk(1000)
        assert set(ids) | set(extra) == set(seen_all) and len(seen_all) == N + 10

        s.kill9()
        s.restart()
        seen = walk(50)
        assert set(ids) <= set(seen) and len(seen) == N + 10, "jobs lost across kill -9"
        _, _, counts = s.json("GET", "/readyz", expect=200)
        assert counts["queued"] + counts["running"] >= N - 1
        del names
        assert s.stop() == 0
    print("ok")


if __name__ == "__main__":
    main()
