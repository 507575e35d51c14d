"""Serve the teaching app over a remote backend (issue 17): the composition root's half that
owns the HTTP server and the signals. Nothing of ServeLab's engine runs here: SIGTERM stops the
lab's traffic and its poller, then the server; the remote keeps serving its own clients."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from werkzeug.serving import make_server

from engine.lab.remote.remote_lab import RemoteLab
from engine.launch.api_server import RequestLog, freeze_startup_heap

log = logging.getLogger("servelab.server")


def serve_remote(lab: RemoteLab, app: Any, host: str, port: int) -> int:
    server = make_server(host, port, app, threaded=True, request_handler=RequestLog)
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if stopping.is_set():
            return
        stopping.set()
        log.info("stopping: the lab's traffic ends; the remote is left as it is")

        def shut() -> None:
            lab.stop()
            server.shutdown()

        threading.Thread(target=shut, name="stop", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("serving the lab on http://%s:%d over %s", host, server.port, lab.label())
    log.info("ready")
    freeze_startup_heap()
    try:
        server.serve_forever()
    finally:
        lab.stop()
    log.info("stopped")
    return 0
