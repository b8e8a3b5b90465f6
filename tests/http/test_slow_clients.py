"""Black-box: slow clients cannot hold the server. A slowloris-style client on one loopback
address (127.0.0.2) opens every connection the server allows and trickles bytes (request
lines, headers, bodies) slowly enough that the idle timeout never fires. It gets at most
its per-IP share (by default a quarter of --max-connections); /healthz still answers from
127.0.0.1 while it holds them; and each slow connection is closed once the request
deadline (--request-deadline-s) has passed, logged as "terminated":"deadline". Requests
that arrive in time are untouched, and a long-poll may outlast the deadline (it only
covers receiving the request). Bounded: 16 connections, a 2 s deadline, about 10 s."""
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from acserver import Server, test_spec  # noqa: E402

MAX_CONN, DEADLINE_S, IDLE_S = 16, 2, 30
SLOW_IP = "127.0.0.2"

# What each slow connection sends first, then one more byte of trickle every 0.3 s.
OPENINGS = [
    b"GET /healthz HT",                                                   # unfinished request line
    b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n",                              # headers never end
    b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 4096\r\n\r\n{",                                     # body never ends
    b"",                                                                  # connects, says nothing
]


class Slow:
    def __init__(self, port, opening):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((SLOW_IP, 0))
        self.sock.settimeout(5)
        self.sock.connect(("127.0.0.1", port))
        self.t0 = time.monotonic()
        self.opening = opening
        self.closed_at = None
        self.got = b""
        try:
            if opening:
                self.sock.sendall(opening)
        except OSError:
            self.closed_at = time.monotonic()

    def poll(self):
        """Trickle a byte unless the server closed the connection; True while open."""
        if self.closed_at is not None:
            return False
        self.sock.setblocking(False)
        try:
            data = self.sock.recv(4096)
            if not data:
                self.closed_at = time.monotonic()
                return False
            self.got += data
        except BlockingIOError:
            pass
        except OSError:
            self.closed_at = time.monotonic()
            return False
        try:
            if self.opening:
                self.sock.send(b"a" if self.opening.endswith((b"{", b"HT")) else b"X")
        except BlockingIOError:
            pass
        except OSError:
            self.closed_at = time.monotonic()
            return False
        return True

    def close(self):
        self.sock.close()


def main():
    env = {"AC_MAX_CONNECTIONS": str(MAX_CONN), "AC_REQUEST_DEADLINE_S": str(DEADLINE_S),
           "AC_TIMEOUT_S": str(IDLE_S)}
    with Server(env=env) as s:
        _, _, job = s.json("POST", "/v1/jobs", test_spec(["test_sleep"], x_test_sleep_ms=60000), expect=201)
        # --- the slow client opens every connection the server allows, and more
        slow = [Slow(s.port, OPENINGS[i % len(OPENINGS)]) for i in range(MAX_CONN)]
        time.sleep(0.6)
        for c in slow:
            c.poll()
        held = [c for c in slow if c.closed_at is None]
        assert 0 < len(held) <= MAX_CONN // 4, "one address holds %d of %d connections" % (len(held), MAX_CONN)

        # --- while it holds them, another client is served at once, on several connections
        t0 = time.monotonic()
        for _ in range(3):
            st, _, doc = s.json("GET", "/healthz", timeout=3)
            assert st == 200 and doc == {"status": "ok"}, (st, doc)
        assert time.monotonic() - t0 < 2, "healthz took %.1f s" % (time.monotonic() - t0)

        # --- a long-poll parked past the deadline still gets its answer
        answer = {}

        def long_poll():
            answer["r"] = s.json("GET", "/v1/jobs/%s/events?after=evt_999999999&wait=%d" % (job["id"], DEADLINE_S + 2),
                                 timeout=DEADLINE_S + 10)
        lp = threading.Thread(target=long_poll)
        lp.start()

        # --- a request whose body arrives slowly, but within the deadline, is served
        body = json.dumps(test_spec(["test_sleep"], x_test_sleep_ms=60000)).encode()
        ok = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        ok.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), len(body) // 4 + 1):
            time.sleep(0.2)
            ok.sendall(body[i:i + len(body) // 4 + 1])
        reply = b""
        while True:
            chunk = ok.recv(65536)
            if not chunk:
                break
            reply += chunk
        ok.close()
        assert reply.startswith(b"HTTP/1.1 201"), reply[:300]

        # --- every slow connection is closed after the deadline, while still trickling
        t_end = time.monotonic() + DEADLINE_S + 4
        while time.monotonic() < t_end and any(c.poll() for c in held):
            time.sleep(0.3)
        for c in held:
            assert c.closed_at is not None, "a slow connection (%r) outlived the %d s deadline" % (c.opening, DEADLINE_S)
            life = c.closed_at - c.t0
            assert DEADLINE_S - 0.2 <= life <= DEADLINE_S + 2, "closed after %.2f s (deadline %d s)" % (life, DEADLINE_S)
        for c in slow:
            c.close()

        lp.join()
        st, _, doc = answer["r"]
        assert st == 200 and doc["data"] == [], (st, doc)
        # the address can connect again once its connections are gone
        c = Slow(s.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        c.sock.setblocking(True)
        assert c.sock.recv(4096).startswith(b"HTTP/1.1 200"), "the slow address is still refused"
        c.close()
        time.sleep(0.2)
        log = [json.loads(l) for l in s.log_text().splitlines() if l.startswith("{")]
        cut = [r for r in log if r.get("terminated") == "deadline"]
        assert len(cut) >= len(held), "%d deadline closes logged for %d slow connections" % (len(cut), len(held))
        assert s.stop() == 0
    print("one address held %d of %d connections; healthz answered meanwhile; all closed after the %d s deadline"
          % (len(held), MAX_CONN, DEADLINE_S))


if __name__ == "__main__":
    main()
