"""The lab's proxy alone (engine/lab/proxy.py), in front of a small real HTTP server that
streams a chunk every 0.2 s: flushed, the first chunk comes through long before the last;
held, nothing comes until the upstream finishes; a silent upstream is cut at the idle timeout
(504 before any byte); a client that hangs up makes the proxy hang up on the upstream."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.lab.proxy import IDLE_TIMEOUT_CODE, LabProxy, ProxySettings
from tests.waiting import wait_for

CHUNKS = 5
GAP_S = 0.2


class Upstream(ThreadingHTTPServer):
    """POST /stream: CHUNKS chunks GAP_S apart (chunked encoding); POST /silent?s=N: headers
    only after N seconds of silence, then one chunk. Counts the streams whose client left."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), StreamHandler)
        self.client_gone = 0
        self.bodies: list[bytes] = []

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
            time.sleep(float(self.path.split("=")[1]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for i in range(CHUNKS if self.path == "/stream" else 1):
                data = f"data: {i}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                time.sleep(GAP_S)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.server.client_gone += 1


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def read_times(url: str, path: str) -> tuple[int, list[float], float]:
    """(status, when each SSE line arrived, when the request was sent), monotonic seconds."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    sent = time.monotonic()
    conn.request("POST", path, body=b'{"x": 1}', headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    times = [time.monotonic() for line in resp if line.startswith(b"data:")] if resp.status == 200 else []
    if resp.status != 200:
        resp.read()
    conn.close()
    return resp.status, times, sent


def test_flushed_chunks_come_through_as_they_are_made_and_the_body_is_forwarded(upstream: Upstream) -> None:
    proxy = LabProxy(upstream.url, lambda: ProxySettings(stream_flush=True)).start()
    try:
        status, times, sent = read_times(proxy.base_url, "/stream")
        assert status == 200 and len(times) == CHUNKS
        first, last = times[0] - sent, times[-1] - sent
        assert first < 0.5 * last, (first, last)  # the first chunk, well before the stream ends
        assert upstream.bodies == [b'{"x": 1}']
        assert proxy.counts.forwarded == 1 and proxy.counts.cut_idle == 0
    finally:
        proxy.stop()


def test_held_streams_arrive_all_at_once_when_the_upstream_finishes(upstream: Upstream) -> None:
    proxy = LabProxy(upstream.url, lambda: ProxySettings(stream_flush=False)).start()
    try:
        status, times, sent = read_times(proxy.base_url, "/stream")
        assert status == 200 and len(times) == CHUNKS
        assert times[0] - sent >= 0.8 * (times[-1] - sent)  # the first line waited for the last
        assert times[0] - sent >= (CHUNKS - 1) * GAP_S
    finally:
        proxy.stop()


def test_a_silent_upstream_is_cut_at_the_idle_timeout_read_live(upstream: Upstream) -> None:
    settings = {"idle": 0.3}
    proxy = LabProxy(upstream.url, lambda: ProxySettings(True, settings["idle"])).start()
    try:
        status, _, sent = read_times(proxy.base_url, "/silent?s=1.0")
        assert status == 504 and proxy.counts.cut_idle == 1
        assert time.monotonic() - sent < 0.9  # cut at the timeout, not when the upstream spoke
        settings["idle"] = 0.0  # no timeout now: the next silent stream waits it out
        status, times, _ = read_times(proxy.base_url, "/silent?s=0.6")
        assert status == 200 and len(times) == 1 and proxy.counts.cut_idle == 1
    finally:
        proxy.stop()


def test_idle_body_reports_its_code(upstream: Upstream) -> None:
    proxy = LabProxy(upstream.url, lambda: ProxySettings(True, 0.2)).start()
    try:
        host, port = proxy.base_url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("POST", "/silent?s=0.6", body=b"{}")
        resp = conn.getresponse()
        assert resp.status == 504 and IDLE_TIMEOUT_CODE in resp.read().decode()
    finally:
        proxy.stop()


def test_a_client_that_hangs_up_makes_the_proxy_hang_up_on_the_upstream(upstream: Upstream) -> None:
    proxy = LabProxy(upstream.url, lambda: ProxySettings(stream_flush=False)).start()  # held: nothing written to the client
    try:
        host, port = proxy.base_url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        time.sleep(GAP_S)
        sock.close()
        assert wait_for(lambda: proxy.counts.client_hung_up == 1, 2.0)
        assert wait_for(lambda: upstream.client_gone == 1, 3.0)  # the upstream's next write failed
    finally:
        proxy.stop()
