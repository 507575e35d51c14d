"""The remote pass-through's streams by user: cancelling a user cuts their open upstream streams
(the relay's blocked read wakes, the server sees its client go) and no one else's."""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from engine.lab.remote.user_streams import UserStreams, user_of
from tests.support.waiting import wait_for

pytestmark = pytest.mark.unit


CHUNKS, GAP_S = 400, 0.05  # a stream of 20 s: any cut ends it long before that, however busy the machine


class SlowStream(BaseHTTPRequestHandler):
    """An SSE stream that sends a chunk every GAP_S for CHUNKS chunks, noting when its client left."""

    hung_up: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for i in range(CHUNKS):
                self.wfile.write(f"data: {i}\n\n".encode())
                self.wfile.flush()
                time.sleep(GAP_S)
        except OSError:
            SlowStream.hung_up.append(self.path)

    def log_message(self, *args: Any) -> None:
        pass


def open_stream(port: int, path: str) -> tuple[Any, http.client.HTTPResponse]:
    """(socket, response), the socket taken before the response as the pass-through does: this
    HTTP/1.0 server closes the connection, so http.client hands the socket to the response."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    sock = conn.sock
    return sock, conn.getresponse()


def read_until_cut(resp: http.client.HTTPResponse, ended: list[float]) -> None:
    try:
        while resp.read1(65536):
            pass
    except (OSError, http.client.HTTPException):
        pass
    ended.append(time.monotonic())


def test_cancel_cuts_the_users_streams_and_leaves_the_others() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowStream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    streams = UserStreams()
    try:
        port = server.server_address[1]
        mine = [open_stream(port, f"/ada/{i}") for i in range(2)]
        theirs = open_stream(port, "/bob/0")
        for sock, _ in mine:
            streams.add("ada", sock)
        streams.add("bob", theirs[0])
        ended: dict[str, list[float]] = {"ada0": [], "ada1": [], "bob": []}
        readers = [
            threading.Thread(target=read_until_cut, args=(resp, ended[key]), daemon=True)
            for (_, resp), key in zip([*mine, theirs], ended)
        ]
        for reader in readers:
            reader.start()
        time.sleep(0.3)  # the readers under way before the cut
        cut_at = time.monotonic()
        assert streams.cancel("ada") == 2
        for reader in readers[:2]:
            reader.join(CHUNKS * GAP_S / 2)
        assert ended["ada0"] and ended["ada1"], "a cancelled stream's read did not wake"
        woke = max(ended["ada0"] + ended["ada1"]) - cut_at
        assert woke < CHUNKS * GAP_S / 2, f"the reads ended {woke:.1f} s after the cut: the stream's end, not the cut"
        assert not ended["bob"], "another user's stream was cut"
        assert wait_for(lambda: len(SlowStream.hung_up) >= 2, 10.0)
        assert sorted(SlowStream.hung_up) == ["/ada/0", "/ada/1"]  # the server saw them go
        assert streams.cancel("ada") == 0  # nothing left of theirs
        streams.discard("bob", theirs[0])
        assert streams.cancel("bob") == 0
    finally:
        server.shutdown()
        server.server_close()


def test_user_of_reads_a_string_user_and_nothing_else() -> None:
    assert user_of(b'{"prompt": "hi", "user": "s-1"}') == "s-1"
    assert user_of(b'{"prompt": "hi", "user": 5}') is None
    assert user_of(b"[1, 2]") is None
    assert user_of(b"not json") is None
