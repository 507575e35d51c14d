"""Run the API server: build the fleet, wait for it, serve HTTP, and drain on SIGTERM.

This is the composition root that reaches up to the web layer (engine/ below it never imports
Flask). SIGTERM: /ready answers 503 at once, new requests get 503, in-flight ones finish (up to
the drain timeout), the replicas stop, and the process exits leaving no child behind."""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from werkzeug.serving import WSGIRequestHandler, make_server

from engine.config import EngineConfig
from engine.errors import InvalidParamError
from engine.lab.proxy import VIA
from engine.platform import machine
from engine.platform.machine import MachineError
from engine.serving.routing.defences import Defences
from engine.serving.routing.router import RouterConfig, api_keys_from_env
from engine.serving.scaling.fleet import Fleet, FleetConfig

log = logging.getLogger("servelab.server")


def serve_forever(args: argparse.Namespace, levers: dict[str, Any]) -> int:
    from web import create_api_app

    keys = api_keys_from_env()
    router_config = RouterConfig(
        queue_cap=args.queue_cap,
        deadline_s=args.deadline_s,
        rate_limit=args.rate_limit,
        api_keys=keys,
    )
    defences = Defences(**{key: getattr(args, key) for key in Defences.names()})
    try:  # what no replica could get past is refused here, in one line
        machine.cpu()
        engine_config = EngineConfig(**levers)
        if args.decode_replicas < 0:
            raise InvalidParamError("decode_replicas", "must not be negative")
        fleet_config = FleetConfig(args.replicas, args.drain_timeout_s, decode_replicas=args.decode_replicas)
        fleet = Fleet(engine_config, router_config, fleet_config, defences=defences)
    except (InvalidParamError, MachineError) as err:
        log.error("cannot serve: %s", err)
        return 2
    log.info(
        "API keys: %s",
        "required (SERVELAB_API_KEYS)" if keys else "none: the API is open (localhost classroom default)",
    )
    app = create_api_app(fleet, args.sse_ping_s, stream_flush=args.stream_flush)
    return serve_app(fleet, app, args.host, args.port)


def serve_app(
    fleet: Fleet,
    app: Any,
    host: str,
    port: int,
    on_stop: Callable[[], None] | None = None,
    on_bound: Callable[[str], None] | None = None,
) -> int:
    """Serve a WSGI app over this fleet until SIGTERM or SIGINT, then drain: /ready turns 503,
    queued and running requests finish (up to the drain timeout), the replicas stop.
    on_bound(url): told the server's base URL once its port is bound (the lab's clients)."""
    server = make_server(host, port, app, threaded=True, request_handler=RequestLog)
    if on_bound is not None:
        on_bound(local_url(host, server.port))
    stopping = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        if stopping.is_set():
            return
        stopping.set()
        log.info("SIGTERM: draining")

        def drain() -> None:
            if on_stop is not None:
                on_stop()
            fleet.drain_and_stop()
            server.shutdown()

        threading.Thread(target=drain, name="drain", daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigterm)
    log.info(
        "serving %s on http://%s:%d with %d replica(s); loading...",
        fleet.model_name,
        host,
        server.port,
        len(fleet.replicas),
    )
    # "ready" is said only when a replica is; a fleet that cannot serve has said why, once.
    if fleet.wait_serving():
        plan = fleet.engine_plan
        log.info("ready%s", f": {plan.summary()}" if plan is not None else "")
    elif fleet.unservable is None:
        log.error("no replica ready yet; still trying")
    freeze_startup_heap()
    try:
        server.serve_forever()
    finally:
        if not stopping.is_set():
            fleet.stop()
    log.info("stopped")
    return 0


def freeze_startup_heap() -> None:
    """What start-up built (modules, the app, the first fleet) lives about as long as the server:
    frozen, the collector's full passes skip it, and the live stream's ticks stop waiting on them
    (a full pass over the front's start-up heap, 190k objects, took 0.09 s here). The cost: if a
    rebuild drops that first fleet, what of it only a cycle held is never reclaimed (once)."""
    gc.collect()
    gc.freeze()


class RequestLog(WSGIRequestHandler):
    """werkzeug's access log, less the lab's own clients (they come through the lab's proxy,
    which says so in Via): a flood of 20 req/s would bury everything else."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if VIA not in (self.headers.get("Via") or ""):
            super().log_request(code, size)


def local_url(host: str, port: int) -> str:
    """This machine's way to the server: a wildcard bind is reached on loopback."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
