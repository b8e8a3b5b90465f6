"""Black-box: a full disk. The server's data directory lives on a 6 MiB tmpfs; a job whose
stage writes 8 MiB fails with code disk_full and a message naming the full disk, its
partial artifact is not listed, and the store stays consistent: the server still answers,
the failed job can be deleted, and a small job afterwards succeeds. Needs permission to
mount a tmpfs (root with CAP_SYS_ADMIN); without it the test says so and skips."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "http"))
from acserver import Server, test_spec  # noqa: E402

MiB = 1 << 20


def main():
    mnt = tempfile.mkdtemp(prefix="ac-full-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", mnt], capture_output=True, text=True)
    if r.returncode != 0:
        os.rmdir(mnt)
        print("SKIP: cannot mount a tmpfs here (%s); the disk-full path is untested" % r.stderr.strip())
        return
    try:
        with Server(data_dir=os.path.join(mnt, "var")) as s:
            _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_artifact"], x_test_artifact_bytes=8 * MiB),
                               expect=201)
            fin = s.wait_status(job["id"], ("failed", "succeeded"), timeout=60)
            assert fin["status"] == "failed", fin
            assert fin["error"]["code"] == "disk_full", fin["error"]
            assert "disk is full" in fin["error"]["message"] and "No space left" in fin["error"]["message"], fin
            _, _, arts = s.json("GET", "/v1/jobs/%s/artifacts" % job["id"], expect=200)
            assert arts["data"] == [], arts
            s.json("DELETE", "/v1/jobs/%s" % job["id"])
            assert s.request("GET", "/v1/jobs/" + job["id"])[0] == 404
            _, _, small = s.json("POST", "/v1/jobs", test_spec(["test_artifact"], x_test_artifact_bytes=64 << 10),
                                 expect=201)
            fin = s.wait_status(small["id"], ("failed", "succeeded"), timeout=60)
            assert fin["status"] == "succeeded", fin
            st, _, body = s.request("GET", "/v1/jobs/%s/artifacts/blob.bin" % small["id"])
            assert st == 200 and len(body) == 64 << 10
            print("disk full: %s" % "job failed with disk_full; store consistent; next job succeeded")
            assert s.stop() == 0
    finally:
        subprocess.run(["umount", mnt], check=False)
        os.rmdir(mnt)
    print("ok")


if __name__ == "__main__":
    main()
