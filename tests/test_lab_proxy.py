"""The lab's proxy alone (engine/lab/proxy.py), in front of a small real HTTP server that
streams chunks: flushed, the first chunk reaches the client while the upstream still holds the
rest; held, nothing comes until the upstream finishes; a silent upstream is cut at the idle
timeout (504 before any byte); a client that hangs up makes the proxy hang up on the upstream.
Each test orders what happened by what the upstream saw, so a busy machine changes no outcome."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.lab.proxy import IDLE_TIMEOUT_CODE, LabProxy, ProxySettings
from tests.support.waiting import wait_for

pytestmark = pytest.mark.unit

CHUNKS = 5
GAP_S = 0.2
LONG_CHUNKS = 50  # /long: a stream still going 10 s on, so the proxy's hang-up always meets it
GATE_S = 10.0  # how long /gated and /silent wait for the test before going on by themselves


class Upstream(ThreadingHTTPServer):
    """POST /stream: CHUNKS chunks GAP_S apart (chunked encoding), /long: LONG_CHUNKS of them;
    /gated: one chunk, then the rest once the test's client says it has read it (or GATE_S on);
    /silent?s=N: headers only after N seconds of silence (or at teardown), then one chunk. The
    tests order events by what the upstream saw, not by how fast this machine runs them."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), StreamHandler)
        self.client_gone = 0
        self.bodies: list[bytes] = []
        self.client_has_first = threading.Event()  # set by a test's client once it reads /gated's first chunk
        self.waited_for_client: list[bool] = []  # per /gated stream: the client had chunk 0 before the rest
        self.release = threading.Event()  # ends every /silent wait (teardown)
        self.finished_at: list[float] = []  # monotonic, just before each stream's last bytes

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class StreamHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Upstream

    def log_message(self, format: str, *args: object) -> None:  # the stdlib's names
        pass

    def do_POST(self) -> None:
        self.server.bodies.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if self.path.startswith("/silent"):
            self.server.release.wait(float(self.path.split("=")[1]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = {"/stream": CHUNKS, "/long": LONG_CHUNKS, "/gated": CHUNKS}.get(self.path, 1)
        try:
            for i in range(chunks):
                if i == 1 and self.path == "/gated":
                    self.server.waited_for_client.append(self.server.client_has_first.wait(GATE_S))
                data = f"data: {i}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                if self.path != "/gated":
                    time.sleep(GAP_S)
            self.server.finished_at.append(time.monotonic())
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.server.client_gone += 1


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True).start()
    yield server
    server.release.set()
    server.client_has_first.set()
    server.shutdown()
    server.server_close()


def read_times(url: str, path: str, on_first: Callable[[], None] = lambda: None) -> tuple[int, list[float], float]:
    """(status, when each SSE line arrived, when the request was sent), monotonic seconds;
    on_first runs when the first line arrives."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    sent = time.monotonic()
    conn.request("POST", path, body=b'{"x": 1}', headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    times: list[float] = []
    if resp.status == 200:
        for line in resp:
            if line.startswith(b"data:"):
                times.append(time.monotonic())
                if len(times) == 1:
                    on_first()
    else:
        resp.read()
    conn.close()
    return resp.status, times, sent


def test_flushed_chunks_come_through_as_they_are_made_and_the_body_is_forwarded(upstream: Upstream) -> None:
    proxy = LabProxy(upstream.url, lambda: ProxySettings(stream_flush=True)).start()
    try:
        status, times, _ = read_times(proxy.base_url, "/gated", on_first=upstream.client_has_first.set)
        assert status == 200 and len(times) == CHUNKS
        # The upstream held its other chunks until the client had the first: only a proxy that
        # flushes lets that happen (a holding one sends nothing until the upstream ends, GATE_S on).
        assert upstream.waited_for_client == [True]
        assert upstream.bodies == [b'{"x": 1}']
        assert proxy.counts.forwarded == 1 and proxy.counts.cut_idle == 0
    finally:
        proxy.stop()


def test_held_streams_arrive_all_at_once_when_the_upstream_finishes(upstream: Upstream) -> None:
    proxy = LabProxy(upstream.url, lambda: ProxySettings(stream_flush=False)).start()
    try:
        status, times, sent = read_times(proxy.base_url, "/stream")
        assert status == 200 and len(times) == CHUNKS
        assert times[0] >= upstream.finished_at[0]  # the first line waited for the upstream's last bytes
        assert times[0] - sent >= (CHUNKS - 1) * GAP_S  # (a lower bound: a busy machine only adds)
    finally:
        proxy.stop()


def test_a_silent_upstream_is_cut_at_the_idle_timeout_read_live(upstream: Upstream) -> None:
    settings = {"idle": 0.3}
    proxy = LabProxy(upstream.url, lambda: ProxySettings(True, settings["idle"])).start()
    try:
        # Silent until teardown (GATE_S at most): a 504 can only be the proxy's cut, never the
        # upstream speaking; and the cut is not early.
        status, _, sent = read_times(proxy.base_url, f"/silent?s={GATE_S}")
        assert status == 504 and proxy.counts.cut_idle == 1
        assert time.monotonic() - sent >= settings["idle"]
        assert not upstream.finished_at  # the upstream had not spoken
        settings["idle"] = 0.0  # no timeout now: the next silent stream waits it out
        status, times, _ = read_times(proxy.base_url, "/silent?s=0.6")
        assert status == 200 and len(times) == 1 and proxy.counts.cut_idle == 1
    finally:
        proxy.stop()


def test_idle_body_reports_its_code(upstream: Upstream) -> None:
    proxy = LabProxy(upstream.url, lambda: ProxySettings(True, 0.2)).start()
    try:
        host, port = proxy.base_url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", f"/silent?s={GATE_S}", body=b"{}")
        resp = conn.getresponse()
        assert resp.status == 504 and IDLE_TIMEOUT_CODE in resp.read().decode()
    finally:
        proxy.stop()


def test_a_client_that_hangs_up_makes_the_proxy_hang_up_on_the_upstream(upstream: Upstream) -> None:
    proxy = LabProxy(upstream.url, lambda: ProxySettings(stream_flush=False)).start()  # held: nothing written to the client
    try:
        host, port = proxy.base_url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /long HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        assert wait_for(lambda: proxy.counts.forwarded == 1, 10.0)  # the upstream has the request
        sock.close()
        assert wait_for(lambda: proxy.counts.client_hung_up == 1, 10.0)
        # The upstream's next write failed: /long still had seconds to go, however slow this machine.
        assert wait_for(lambda: upstream.client_gone == 1, 10.0)
    finally:
        proxy.stop()
