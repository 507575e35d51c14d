"""cancel_on_disconnect against a remote (issue 17): the remote's own cancellation is not the lab's
to switch off, so the lab's proxy plays the failure: with relay_hangup off it does not pass a
client's hang-up on, and reads the stream to its end for nobody. A real upstream streams 30
chunks; a real client reads one and hangs up."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from engine.lab.proxy import LabProxy, ProxySettings

pytestmark = pytest.mark.integration

CHUNKS = 30


class StreamingUpstream:
    """Streams CHUNKS SSE chunks 40 ms apart; counts the ones it could write."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.written = 0
        self.ended = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    for i in range(CHUNKS):
                        self.wfile.write(f'data: {{"i": {i}}}\n\n'.encode())
                        self.wfile.flush()
                        owner.written += 1
                        time.sleep(0.04)
                except OSError:
                    pass  # the proxy hung up: the server would abort the request here
                finally:
                    owner.ended.set()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.scheme = "https" if tls is not None else "http"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def upstream() -> Iterator[StreamingUpstream]:
    server = StreamingUpstream()
    yield server
    server.server.shutdown()
    server.server.server_close()


def hang_up_after_first_chunk(proxy: LabProxy) -> None:
    host, port = proxy._server.server_address[:2]
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        seen = b""
        while b"data:" not in seen:
            seen += sock.recv(4096)


@pytest.mark.parametrize("relay_hangup", [True, False])
def test_the_proxy_passes_a_hang_up_on_or_reads_for_nobody(upstream: StreamingUpstream, relay_hangup: bool) -> None:
    proxy = LabProxy(upstream.url, lambda: ProxySettings(True, 0.0, relay_hangup)).start()
    try:
        hang_up_after_first_chunk(proxy)
        assert upstream.ended.wait(10)
        if relay_hangup:  # the server hears it: its writes fail long before the 30th chunk
            assert upstream.written < CHUNKS // 2 and proxy.counts.orphan_chunks == 0
        else:  # the server never hears: every chunk made, the ones after the hang-up counted
            assert upstream.written == CHUNKS
            deadline = time.monotonic() + 5
            while proxy.counts.orphan_chunks < CHUNKS - 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert CHUNKS - 3 <= proxy.counts.orphan_chunks < CHUNKS
        assert proxy.counts.client_hung_up == 1
    finally:
        proxy.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test's certificate")
def test_the_proxy_relays_a_remote_behind_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    upstream = StreamingUpstream(tls)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the proxy verifies the remote, trusting this one
    proxy = LabProxy(upstream.url, lambda: ProxySettings(True, 0.0)).start()
    try:
        host, port = proxy._server.server_address[:2]
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            seen = b""
            while chunk := sock.recv(4096):
                seen += chunk
        assert seen.count(b"data: {") == CHUNKS and upstream.written == CHUNKS
    finally:
        proxy.stop()
        upstream.server.shutdown()
        upstream.server.server_close()
