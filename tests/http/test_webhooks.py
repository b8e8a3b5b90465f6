"""Black-box: webhooks. With --webhook-secret-file, a job with a callback_url gets one
signed POST (Standard Webhooks headers; the HMAC-SHA256 signature verifies with the
secret) on its terminal state; a receiver answering 500 first gets the same message
again after the backoff, and the job's events record the delivery. Without a secret
the server refuses callback_url (422). Without --allow-private-webhook-hosts a receiver
must be on a public address: a loopback literal (or localhost, or credentials in the URL)
is refused at POST (422), and a name that resolves to loopback ("127.1") is refused at
connection time: the delivery fails for good at once, naming the address, and the
receiver sees nothing. A receiver that accepts and never answers delays no other
receiver's webhook, and a stop does not wait for its attempt. A failure message cut inside
a character still ends its job failed, with its webhook."""
import base64
import hashlib
import hmac
import http.server
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from acserver import Server, check_problem, test_spec  # noqa: E402


def main():
    got = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((time.time(), {k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(500 if len(got) == 1 else 204)  # first attempt fails
            self.end_headers()

        def log_message(self, *a):
            pass

    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d/hook?team=npc" % hook.server_address[1]

    key = os.urandom(24)
    s = Server(args=["--webhook-retry-s", "2", "--allow-private-webhook-hosts"])  # the retry comes 1-2 s later
    secret = os.path.join(s.tmp, "whsec")
    with open(secret, "w") as f:
        f.write("whsec_" + base64.b64encode(key).decode() + "\n")
    s.args += ["--webhook-secret-file", secret]
    with s:
        check_problem(*s.json("POST", "/v1/jobs", test_spec(["test_fail"], callback_url="ftp://x/y")), 422,
                      pointer="/callback_url")
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=100, callback_url=url),
                           expect=201)
        assert job["spec"]["callback_url"] == url
        t0 = time.time()
        while len(got) < 2 and time.time() - t0 < 20:
            time.sleep(0.05)
        assert len(got) == 2, got
        (t1, h1, b1), (t2, h2, b2) = got
        assert b1 == b2 and h1["webhook-id"] == h2["webhook-id"] and t2 - t1 >= 1.0, (t2 - t1)
        ev = json.loads(b2)
        assert ev["type"] == "job.succeeded" and ev["data"]["id"] == job["id"] and ev["data"]["status"] == "succeeded"
        assert ev["data"]["error"] is None
        assert h2["webhook-id"].startswith("msg_") and abs(int(h2["webhook-timestamp"]) - time.time()) < 60
        signed = ("%s.%s." % (h2["webhook-id"], h2["webhook-timestamp"])).encode() + b2
        want = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        assert h2["webhook-signature"] == want, (h2["webhook-signature"], want)
        assert h2["content-type"] == "application/json"
        t0 = time.time()
        while time.time() - t0 < 5:
            _, _, evs = s.json("GET", "/v1/jobs/%s/events" % job["id"], expect=200)
            if evs["data"][-1]["type"] == "webhook.delivered":
                break
            time.sleep(0.05)
        assert evs["data"][-1]["type"] == "webhook.delivered", [e["type"] for e in evs["data"]]
        time.sleep(1.5)
        assert len(got) == 2, "delivered twice after a 2xx"
        # a failure message cut inside a character (the stage's 1,023 bytes): the job still
        # ends failed, naming the stage, and its webhook goes out with the message mended
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_fail"], x_test_fail_message="\u00e9" * 700,
                                                         callback_url=url), expect=201)
        fin = s.wait_status(job["id"], ("failed", "succeeded", "cancelled"), timeout=20)
        assert fin["status"] == "failed" and fin["error"]["code"] == "stage_failed", fin
        t0 = time.time()
        while len(got) < 3 and time.time() - t0 < 10:
            time.sleep(0.05)
        assert len(got) == 3, got
        ev = json.loads(got[2][2])
        assert ev["type"] == "job.failed" and ev["data"]["error"]["code"] == "stage_failed", ev
        assert ev["data"]["error"]["message"].startswith("stage test_fail failed: \u00e9\u00e9"), ev
        assert s.stop() == 0
    with Server() as s2:  # no secret: callbacks are refused
        check_problem(*s2.json("POST", "/v1/jobs", test_spec(["test_fail"], callback_url=url)), 422,
                      pointer="/callback_url")
        assert s2.stop() == 0
    port = hook.server_address[1]
    s3 = Server(args=["--webhook-retry-s", "1"])
    secret = os.path.join(s3.tmp, "whsec")
    with open(secret, "w") as f:
        f.write("whsec_" + base64.b64encode(key).decode() + "\n")
    s3.args += ["--webhook-secret-file", secret]
    with s3:  # public receivers only
        for bad, says in (("http://127.0.0.1:%d/hook" % port, "--allow-private-webhook-hosts"),
                          ("http://[::1]:%d/hook" % port, "--allow-private-webhook-hosts"),
                          ("https://169.254.169.254/latest", "--allow-private-webhook-hosts"),
                          ("http://LocalHost.:%d/hook" % port, "--allow-private-webhook-hosts"),
                          ("https://user:pw@example.com/hook", "credentials")):
            st, h, doc = s3.json("POST", "/v1/jobs", test_spec(["test_fail"], callback_url=bad))
            check_problem(st, h, doc, 422, pointer="/callback_url")
            assert says in json.dumps(doc), (bad, doc)
        before = len(got)
        _, _, job = s3.json("POST", "/v1/jobs", test_spec(["test_fail"], callback_url="http://127.1:%d/hook" % port),
                            expect=201)
        t0, evs = time.time(), []
        while time.time() - t0 < 10:
            _, _, evs = s3.json("GET", "/v1/jobs/%s/events" % job["id"], expect=200)
            if any(e["type"].startswith("webhook.") for e in evs["data"]):
                break
            time.sleep(0.05)
        wh = [e for e in evs["data"] if e["type"].startswith("webhook.")]
        assert [e["type"] for e in wh] == ["webhook.failed"], evs
        assert "refused to connect to 127.0.0.1" in wh[0]["message"], wh
        assert "--allow-private-webhook-hosts" in wh[0]["message"], wh
        time.sleep(1.5)  # past the first retry's delay: no retry, no request
        _, _, evs = s3.json("GET", "/v1/jobs/%s/events" % job["id"], expect=200)
        assert len([e for e in evs["data"] if e["type"].startswith("webhook.")]) == 1, evs
        assert len(got) == before, got[before:]
        assert s3.stop() == 0
    # A receiver that accepts and never answers (a tarpit) holds up no other receiver: the
    # next job's webhook goes out while the tarpit's attempt still hangs, and a stop cuts
    # the hanging attempt short instead of waiting out its 10 s.
    tarpit = socket.socket()
    tarpit.bind(("127.0.0.1", 0))
    tarpit.listen(16)
    held = []

    def swallow():
        while True:
            try:
                held.append(tarpit.accept()[0])
            except OSError:
                return

    threading.Thread(target=swallow, daemon=True).start()
    s4 = Server(args=["--webhook-retry-s", "60", "--allow-private-webhook-hosts"])
    secret = os.path.join(s4.tmp, "whsec")
    with open(secret, "w") as f:
        f.write("whsec_" + base64.b64encode(key).decode() + "\n")
    s4.args += ["--webhook-secret-file", secret]
    with s4:
        slow = "http://127.0.0.1:%d/never" % tarpit.getsockname()[1]
        s4.json("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=10, callback_url=slow), expect=201)
        t0 = time.time()
        while not held and time.time() - t0 < 10:
            time.sleep(0.02)
        assert held, "the tarpit saw no delivery"
        before = len(got)
        _, _, job = s4.json("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=10, callback_url=url),
                            expect=201)
        t0 = time.time()
        while len(got) == before and time.time() - t0 < 15:
            time.sleep(0.02)
        waited = time.time() - t0
        assert len(got) > before and waited < 4, "the second receiver waited %.1f s behind the tarpit" % waited
        assert json.loads(got[-1][2])["data"]["id"] == job["id"]
        t0 = time.time()
        assert s4.stop() == 0
        took = time.time() - t0
        assert took < 5, "the stop waited %.1f s for the tarpit's delivery" % took
    tarpit.close()
    print("tarpit: the next receiver got its webhook %.2f s after its job was queued; the stop took %.2f s"
          % (waited, took))
    hook.shutdown()
    print("ok")


if __name__ == "__main__":
    main()
