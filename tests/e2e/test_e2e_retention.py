"""Black-box: artifact retention (--retain-max-bytes, --retain-max-age-s). With a size
cap, finished jobs are removed oldest first (their rows answer 404, their artifacts and
work directories are gone) until the data directory fits the cap, while a job that is
running meanwhile is never touched and the newest job stays downloadable. With an age
cap, a finished job older than the cap is gone once the next job starts. A folder under the
data directory deeper than PATH_MAX is measured (the walk goes by relative calls), and
nothing is removed under a cap far above the directory's size. Uses the test
stages (AC_TEST_STAGES=1: test_artifact writes a seeded blob of x_test_artifact_bytes)."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "http"))
from acserver import Server, test_spec  # noqa: E402

MiB = 1 << 20


def du(path):
    total = 0
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def run_artifact_job(s, i):
    spec = test_spec(["test_artifact"], x_test_artifact_bytes=MiB + 4096 * i)
    _, _, job = s.json("POST", "/v1/jobs", spec, expect=201)
    fin = s.wait_status(job["id"], ("succeeded", "failed", "cancelled"), timeout=60)
    assert fin["status"] == "succeeded", fin
    return job["id"]


def size_cap():
    cap = 7 * MiB
    with Server(args=["--workers", "2", "--retain-max-bytes", str(cap)]) as s:
        _, _, sleeper = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=120000), expect=201)
        s.wait_stage(sleeper["id"], "test_sleep")
        ids = [run_artifact_job(s, i) for i in range(8)]
        present = [s.request("GET", "/v1/jobs/" + j)[0] == 200 for j in ids]
        assert present[-1], "the newest job was removed"
        assert not present[0], "the oldest finished job was kept over the cap"
        # removal is oldest first: once one job is present, all newer ones are too
        first = present.index(True)
        assert all(present[first:]), present
        for j in ids[:first]:
            assert not os.path.exists(os.path.join(s.data_dir, "jobs", j)), j
            st, _, _ = s.request("GET", "/v1/jobs/%s/artifacts/blob.bin" % j)
            assert st == 404, st
        st, _, body = s.request("GET", "/v1/jobs/%s/artifacts/blob.bin" % ids[-1])
        assert st == 200 and len(body) == MiB + 4096 * 7
        used = du(s.data_dir)
        assert used <= cap, "data dir %d bytes over the %d cap" % (used, cap)
        # read before the sleeper ends: its worker's own retention pass at the end may
        # remove the oldest of these too
        removed = [e for j in ids[first:] for e in
                   s.json("GET", "/v1/jobs/%s/events?limit=1000" % j, expect=200)[2]["data"]
                   if e["type"] == "retention"]
        # the running job is untouched
        _, _, sj = s.json("GET", "/v1/jobs/" + sleeper["id"], expect=200)
        assert sj["status"] == "running", sj
        s.json("POST", "/v1/jobs/%s/cancel" % sleeper["id"])
        s.wait_status(sleeper["id"], ("cancelled",), timeout=10)
        # each removal is an event of the job whose worker made it (events of jobs removed
        # later are gone with them)
        assert removed and all(e["data"]["removed"] >= 1 and e["data"]["max_bytes"] == cap for e in removed), removed
        print("size cap %d B: %d of %d finished jobs removed oldest first, data dir %d B" %
              (cap, first, len(ids), used))


def age_cap():
    with Server(args=["--retain-max-age-s", "2"]) as s:
        old = run_artifact_job(s, 0)
        time.sleep(3.5)
        new = run_artifact_job(s, 1)
        assert s.request("GET", "/v1/jobs/" + old)[0] == 404, "a job past the age cap was kept"
        assert s.request("GET", "/v1/jobs/" + new)[0] == 200
        print("age cap: a job finished 3.5 s earlier was removed when the next job started")


def make_deep(top, levels):
    """A chain of folders whose full path is longer than PATH_MAX (4096), made by relative
    calls, with a file of 64 KiB at its end."""
    os.mkdir(top)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d" * 200, dir_fd=fd)
            nfd = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        f = os.open("blob", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(f, b"x" * 65536)
        os.close(f)
    finally:
        os.close(fd)


def deep_folder():
    with Server(args=["--retain-max-bytes", str(1 << 30)]) as s:
        make_deep(os.path.join(s.data_dir, "deep"), 24)   # 24 x 201 characters
        ids = [run_artifact_job(s, i) for i in range(3)]
        present = [s.request("GET", "/v1/jobs/" + j)[0] == 200 for j in ids]
        assert all(present), "jobs removed under a 1 GiB cap: %s" % present
        print("a folder deeper than PATH_MAX: 3 of 3 finished jobs kept under a 1 GiB cap")


def main():
    deep_folder()
    size_cap()
    age_cap()
    print("ok")


if __name__ == "__main__":
    main()
