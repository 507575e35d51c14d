"""The watchers load test's setup, shared with `python -m bench.watchers_cpu`: the server
(`python app.py`, pinned to half this machine's cores) and the watchers on the other half, and
STREAMS closed-loop clients that keep the engine decoding meanwhile."""

from __future__ import annotations

import http.client
import json
import os
import threading

from tests.support.server_process import ServerProcess

STREAMS = 4  # closed-loop clients keep this many requests decoding
CORES = sorted(os.sched_getaffinity(0))
SERVER_CORES = set(CORES[: max(1, len(CORES) // 2)])
WATCHER_CORES = set(CORES[len(SERVER_CORES) :]) or set(CORES)
# `python app.py` itself, on the server's cores (its replica processes inherit them).
PINNED_APP = (
    "-c",
    (
        f"import os, runpy, sys; os.sched_setaffinity(0, {SERVER_CORES!r}); sys.argv[0] = 'app.py'; "
        "runpy.run_path('app.py', run_name='__main__')"
    ),
)


class Streams:
    """STREAMS closed-loop clients: each sends a 64-token completion as soon as its last ends."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(STREAMS)]
        for thread in self.threads:
            thread.start()

    def _loop(self) -> None:
        body = json.dumps({"prompt": "Tell me about the sea.", "max_tokens": 64, "ignore_eos": True, "temperature": 0})
        while not self.stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            assert conn.getresponse().read()
            conn.close()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)
