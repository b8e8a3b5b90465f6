"""Black-box: the server with --artifacts s3://BUCKET/PREFIX against a real S3-compatible
server (PyPI moto[server]): a job's 250 MB artifact is uploaded by the worker process as a
multipart upload (4 parts of 64 MiB, as the object's ETag says) under PREFIX/sha256/<hex>;
with the local copy gone (another host, or a cache emptied), a HEAD is answered from the
bucket's HEAD without fetching it, and a GET fetches it back,
checked against its name, and serves it by Range with the same ETag and Repr-Digest, the
pieces reassembling to the same sha-256; an object corrupted in the bucket is refused and
never served; a model fetched by URL that the bucket cannot take is failed, not ready, and registered again (another file name) it is ready from the kept download; a server pointed at a bucket that does not exist refuses to start, naming
it. (moto does not check signatures: unit/test_sigv4 checks those.)"""
import base64
import functools
import hashlib
import http.server
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from acserver import AC_BIN, Server, test_spec  # noqa: E402

SIZE = 250 * 1024 * 1024 + 17
PIECE = 37 * 1024 * 1024


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def s3(method, url, data=None):
    req = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, dict((k.lower(), v) for k, v in r.headers.items()), r.read()


def model_upload_fails(ep, env):
    """A model fetched by URL that cannot be put into the artifact store (its bucket gone
    after start-up) is failed, naming the store, not ready: hosts reading the store could
    not run its jobs. Registered again once the bucket is back, it is ready from the kept
    download, and the bucket holds it with its sha-256."""
    src = os.path.join(os.environ.get("AC_SHARED", "../shared"), "data", "models", "stories260K", "stories260K.bin")
    sha = hashlib.sha256(open(src, "rb").read()).hexdigest()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=os.path.dirname(src))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    s3("PUT", ep + "/ac-gone")
    try:
        with Server(args=["--artifacts", "s3://ac-gone/m", "--s3-allow-http", "--allow-http-models",
                          "--allow-private-model-hosts"], env=env) as s:
            s3("DELETE", ep + "/ac-gone")
            reg = {"url": "http://127.0.0.1:%d/stories260K.bin" % httpd.server_address[1], "sha256": sha}
            _, _, m = s.json("POST", "/v1/models", reg, expect=202)
            t0 = time.time()
            while m["status"] == "fetching":
                assert time.time() - t0 < 90, m
                time.sleep(0.2)
                _, _, m = s.json("GET", "/v1/models/" + m["id"], expect=200)
            assert m["status"] == "failed" and "artifact store" in m["error"]["message"], m
            s3("PUT", ep + "/ac-gone")
            # registered again under another file name, with no server to download from:
            # the kept download is taken
            httpd.shutdown()
            httpd.server_close()
            reg["url"] = "http://127.0.0.1:%d/renamed.bin" % port
            _, _, m = s.json("POST", "/v1/models", reg, expect=202)
            while m["status"] == "fetching":
                assert time.time() - t0 < 150, m
                time.sleep(0.2)
                _, _, m = s.json("GET", "/v1/models/" + m["id"], expect=200)
            assert m["status"] == "ready" and m["path"].endswith("/renamed.bin"), m
            assert os.listdir(os.path.dirname(m["path"])) == ["renamed.bin"], os.listdir(os.path.dirname(m["path"]))
            tool = os.path.join(os.path.dirname(AC_BIN), "tools", "ac_s3")
            out = subprocess.run([tool, "head", "s3://ac-gone/m", "sha256/" + sha], env=dict(os.environ, **env),
                                 check=True, capture_output=True, text=True).stdout.split()
            assert out[0] == str(os.path.getsize(src)) and out[2] == sha, out
        print("ok: a model the artifact store could not take failed naming it, and was ready from its kept download "
              "once registered again (under another name)")
    finally:
        httpd.shutdown()
        httpd.server_close()


def main():
    port = free_port()
    moto = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1",
                             "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ep = "http://127.0.0.1:%d" % port
    try:
        for _ in range(100):
            try:
                s3("PUT", ep + "/ac-art")
                break
            except OSError:
                time.sleep(0.2)
        env = {"AWS_ENDPOINT_URL": ep, "AWS_ACCESS_KEY_ID": "AKIDTEST", "AWS_SECRET_ACCESS_KEY": "TopSecret42"}
        # --- a bucket that does not exist: the server does not start
        bad = Server(args=["--artifacts", "s3://no-such-bucket/x", "--s3-allow-http"], env=env)
        try:
            bad.start()
            raise AssertionError("the server started against a missing bucket")
        except RuntimeError as e:
            assert "no-such-bucket: no such bucket" in str(e), str(e)[-500:]
        finally:
            bad.cleanup()

        with Server(args=["--artifacts", "s3://ac-art/fleet", "--s3-allow-http"], env=env) as s:
            _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_artifact"], x_test_artifact_bytes=SIZE),
                               expect=201)
            t0 = time.time()
            while True:
                _, _, j = s.json("GET", "/v1/jobs/%s?wait=20" % job["id"], expect=200)
                if j["status"] in ("succeeded", "failed", "cancelled"):
                    break
                assert time.time() - t0 < 300, j
            assert j["status"] == "succeeded", j
            _, _, arts = s.json("GET", "/v1/jobs/%s/artifacts" % job["id"], expect=200)
            blob = [a for a in arts["data"] if a["name"] == "blob.bin"][0]
            hexd = blob["sha256"]
            assert blob["size_bytes"] == SIZE
            # in the bucket, uploaded in parts
            st, hd, _ = s3("HEAD", "%s/ac-art/fleet/sha256/%s" % (ep, hexd))
            assert int(hd["content-length"]) == SIZE and hd["etag"].strip('"').endswith("-4"), hd
            # the local copy gone: fetched back, then served by Range
            local = os.path.join(s.data_dir, "artifacts", "sha256", hexd[:2], hexd)
            os.unlink(local)
            # a HEAD asks the bucket and answers, without fetching the blob
            st, hd, _ = s.request("HEAD", blob["url"])
            assert st == 200 and int(hd["content-length"]) == SIZE and hd["etag"] == '"%s"' % hexd, (st, hd)
            assert not os.path.exists(local), "a HEAD fetched the blob"
            h = hashlib.sha256()
            off = 0
            while off < SIZE:
                end = min(off + PIECE, SIZE) - 1
                st, hd, part = s.request("GET", blob["url"], headers={"Range": "bytes=%d-%d" % (off, end)})
                assert st == 206 and len(part) == end - off + 1, (st, len(part))
                assert hd["etag"] == '"%s"' % hexd, hd
                h.update(part)
                off = end + 1
            assert h.hexdigest() == hexd
            assert os.path.getsize(local) == SIZE
            st, hd, _ = s.request("HEAD", blob["url"])
            assert hd["repr-digest"] == "sha-256=:%s:" % base64.b64encode(bytes.fromhex(hexd)).decode(), hd
            print("ok: %d bytes up in 4 parts, fetched back and served in %d ranges" % (SIZE, -(-SIZE // PIECE)))
            # an object corrupted in the bucket is refused, not served
            note = [a for a in arts["data"] if a["name"] == "note.txt"][0]
            bad_path = os.path.join(s.tmp, "bad.txt")
            with open(bad_path, "wb") as f:
                f.write(b"x" * note["size_bytes"])
            tool = os.path.join(os.path.dirname(AC_BIN), "tools", "ac_s3")
            subprocess.run([tool, "put", "s3://ac-art/fleet", "sha256/" + note["sha256"], bad_path], check=True,
                           env=dict(os.environ, **env), stdout=subprocess.DEVNULL)
            os.unlink(os.path.join(s.data_dir, "artifacts", "sha256", note["sha256"][:2], note["sha256"]))
            st, _, body = s.request("HEAD", note["url"])
            assert st >= 500, (st, body[:300])
            st, _, body = s.request("GET", note["url"])
            assert st >= 500 and b"does not match its name" in body, (st, body[:300])
            assert not os.path.exists(os.path.join(s.data_dir, "artifacts", "sha256", note["sha256"][:2],
                                                   note["sha256"]))
            assert "TopSecret42" not in s.log_text()
        print("ok: artifacts in s3")
        model_upload_fails(ep, env)
    finally:
        moto.terminate()
        moto.wait()


if __name__ == "__main__":
    main()
