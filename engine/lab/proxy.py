"""The lab's proxy: a real HTTP hop between the lab's clients and the server, as nginx or a load
balancer sits in front of a production one. It forwards each request to the upstream base URL
and relays the response's bytes as they are, with two settings read live at every read:

  stream_flush   on: each chunk goes on to the client as it arrives; off: the whole response is
                 held until the upstream finishes, then sent at once (nginx's proxy_buffering):
                 a stream's first token reaches the user when its last one does. (The
                 server's `X-Accel-Buffering: no` is not heeded: a proxy configured to
                 buffer regardless, as many load balancers are.)
  idle_timeout_s > 0: an upstream that sends no byte for this long is cut (nginx's
                 proxy_read_timeout). Nothing relayed yet: the client gets a 504; otherwise the
                 connection closes mid-stream. A server's `: ping` comments are bytes: they keep
                 a waiting stream open.

A client that hangs up is seen at once (its socket reads EOF), and the proxy closes the upstream
connection, so the server learns of it at its next write, as it would behind nginx. The proxy is
the lab's, a client-side component: the server does not know it is there."""

from __future__ import annotations

import json
import select
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from engine.clock import WALL_CLOCK, Clock

POLL_S = 0.05  # how often a relay re-reads its settings and looks at the client's socket
READ_BYTES = 65536
# Hop-by-hop headers (RFC 9110 7.6.1) are the proxy's own business: never forwarded.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"}
IDLE_TIMEOUT_CODE = "proxy_idle_timeout"
ORPHAN_IDLE_S = 60.0  # an orphaned response silent this long is given up
VIA = "servelab-lab-proxy"  # the Via header it adds (RFC 9110 7.6.3): the server's log skips the lab's own traffic


@dataclass(frozen=True)
class ProxySettings:
    stream_flush: bool = True
    idle_timeout_s: float = 0.0  # 0: none
    # False: a client that hangs up is not passed on; the proxy reads the upstream's response to
    # its end, so the server generates every token for nobody (cancel_on_disconnect off against
    # a remote server, issue 17, whose own cancellation the lab cannot switch off).
    relay_hangup: bool = True


@dataclass
class ProxyCounts:
    """Running counts since the proxy started (the client counts what a cut cost it)."""

    forwarded: int = 0
    cut_idle: int = 0  # streams cut at the idle timeout
    client_hung_up: int = 0  # relays ended because the client went away first
    orphan_chunks: int = 0  # SSE data chunks read for a client already gone (relay_hangup off)


class LabProxy:
    """A threaded HTTP forwarder on its own localhost port; `base_url` once started."""

    def __init__(
        self,
        upstream: str,
        settings: Callable[[], ProxySettings],
        host: str = "127.0.0.1",
        clock: Clock = WALL_CLOCK,
    ) -> None:
        url = urlsplit(upstream)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"the proxy forwards to http(s)://host[:port], got {upstream!r}")
        # https: a remote server behind TLS (issue 17), verified as any client verifies it.
        self.upstream_tls = ssl.create_default_context() if url.scheme == "https" else None
        self.upstream_host, self.upstream_port = url.hostname, url.port or (443 if self.upstream_tls else 80)
        self.upstream_path = url.path.rstrip("/")
        self.settings = settings
        self.clock = clock  # the idle timeouts' clock: how long the upstream has been silent
        self.counts = ProxyCounts()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> LabProxy:
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.2,), name="lab-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def count(self, field: str) -> None:
        with self._lock:
            setattr(self.counts, field, getattr(self.counts, field) + 1)

    def open_upstream(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> socket.socket:
        """A fresh connection per request ("Connection: close"), the request written whole: the
        response then ends when the upstream closes, so the relay needs no HTTP parsing."""
        sock = socket.create_connection((self.upstream_host, self.upstream_port), timeout=10.0)
        if self.upstream_tls is not None:  # the handshake, blocking, before the relay reads it
            sock = self.upstream_tls.wrap_socket(sock, server_hostname=self.upstream_host)
        lines = [f"{method} {self.upstream_path}{path} HTTP/1.1", f"Host: {self.upstream_host}:{self.upstream_port}"]
        # The proxy frames the body itself: a second Content-Length is a malformed request to a
        # strict server (uvicorn's h11, vLLM's and SGLang's front, answers 400).
        lines += [f"{name}: {value}" for name, value in headers if name.lower() not in (*HOP_BY_HOP, "content-length")]
        lines += ["Connection: close", f"Content-Length: {len(body)}", f"Via: 1.1 {VIA}"]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        sock.setblocking(False)
        return sock


def _handler_for(proxy: LabProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(_RelayHandler):
        pass

    Handler.proxy = proxy
    return Handler


class _RelayHandler(BaseHTTPRequestHandler):
    proxy: LabProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # the stdlib's names
        pass  # one line per request on stderr would drown the app's log

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def _forward(self) -> None:
        self.close_connection = True
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._error(411, "the proxy needs a Content-Length body", "length_required")
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            upstream = self.proxy.open_upstream(self.command, self.path, list(self.headers.items()), body)
        except OSError as err:
            self._error(502, f"the proxy could not reach the server: {err}", "bad_gateway")
            return
        self.proxy.count("forwarded")
        try:
            self._relay(upstream)
        finally:
            upstream.close()

    def _relay(self, upstream: socket.socket) -> None:
        """Move the upstream's bytes to the client until the upstream closes, the idle timeout
        passes, or the client leaves; flush or hold them as the setting says at each read."""
        held: list[bytes] = []
        relayed = False  # any byte already sent to the client
        clock = self.proxy.clock
        last_byte = clock.now()
        watch_client = True
        while True:
            settings = self.proxy.settings()
            watched = [upstream, self.connection] if watch_client else [upstream]
            readable, _, _ = select.select(watched, [], [], POLL_S)
            if self.connection in readable:
                if _client_left(self.connection):
                    self.proxy.count("client_hung_up")
                    if not settings.relay_hangup:
                        self._read_to_end(upstream)
                        return
                    upstream.shutdown(socket.SHUT_RDWR)
                    return
                watch_client = False  # bytes after the request (a pipelined one): not ours to read
            if upstream in readable:
                data = _recv(upstream)
                if data == b"":  # the upstream finished: whatever is held goes now
                    self._send(b"".join(held))
                    return
                if data:
                    last_byte = clock.now()
                    held.append(data)
            if held and settings.stream_flush:
                if not self._send(b"".join(held)):
                    return
                held, relayed = [], True
            timeout = settings.idle_timeout_s
            if timeout > 0 and clock.now() - last_byte > timeout:
                self.proxy.count("cut_idle")
                upstream.shutdown(socket.SHUT_RDWR)
                if not relayed:
                    self._error(504, f"no bytes from the server for {timeout:g} s (the proxy's idle timeout)",
                                IDLE_TIMEOUT_CODE)
                return  # mid-stream: the connection just closes, as nginx's does

    def _read_to_end(self, upstream: socket.socket) -> None:
        """The client left and the server is not told: read the rest of its response for
        nobody, counting the data chunks made for a client already gone."""
        clock = self.proxy.clock
        last_byte = clock.now()
        while clock.now() - last_byte < ORPHAN_IDLE_S:
            readable, _, _ = select.select([upstream], [], [], POLL_S)
            data = _recv(upstream) if readable else None
            if data == b"":
                return
            if data:
                last_byte = clock.now()
                for _ in range(data.count(b"data: {")):
                    self.proxy.count("orphan_chunks")

    def _send(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except OSError:
            return False

    def _error(self, status: int, message: str, code: str) -> None:
        body = json.dumps({"error": {"message": message, "type": "proxy_error", "param": None, "code": code}}).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass


def _recv(sock: socket.socket) -> bytes | None:
    """What the upstream sent; b"" at its end (or a reset); None when select woke for nothing."""
    try:
        data = sock.recv(READ_BYTES)
        while isinstance(sock, ssl.SSLSocket) and data and sock.pending():  # decrypted, not in select's sight
            data += sock.recv(sock.pending())
        return data
    except (BlockingIOError, ssl.SSLWantReadError):
        return None
    except OSError:
        return b""


def _client_left(conn: socket.socket) -> bool:
    """The client's socket is readable: EOF (or a reset) means it hung up."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
