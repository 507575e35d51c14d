"""The remote pass-through's open streams by the OpenAI `user` that sent them, so a student who
leaves a class has theirs cancelled in remote mode too: shutting the upstream socket ends the
relay, and the remote sees its client hang up and cancels the request, as it would for its own."""

from __future__ import annotations

import json
import socket
import threading


def user_of(body: bytes) -> str | None:
    """The request body's `user`, if it is a JSON object with a string there (the remote judges
    the rest of the body; this only files the stream)."""
    try:
        user = json.loads(body).get("user")
    except (ValueError, AttributeError):
        return None
    return user if isinstance(user, str) else None


class UserStreams:
    def __init__(self) -> None:
        self._open: dict[str, set[socket.socket]] = {}
        self._lock = threading.Lock()

    def add(self, user: str, sock: socket.socket) -> None:
        """The stream's socket, taken before the response is read: http.client lets go of it
        (conn.sock = None) when the response will close the connection, the response keeps it."""
        with self._lock:
            self._open.setdefault(user, set()).add(sock)

    def discard(self, user: str, sock: socket.socket) -> None:
        with self._lock:
            socks = self._open.get(user)
            if socks is not None:
                socks.discard(sock)
                if not socks:
                    del self._open[user]

    def cancel(self, user: str) -> int:
        """Cut every open stream of this user; how many there were."""
        with self._lock:
            socks = list(self._open.pop(user, ()))
        for sock in socks:
            try:  # shutdown, not close: it wakes the relay's blocked read
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already gone
        return len(socks)
