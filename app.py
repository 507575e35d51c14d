"""ServeLab's teaching app: `python app.py` serves the pages, the OpenAI-compatible API, the
live Socket.IO stream and the live engine (replica processes) on http://127.0.0.1:5000.

Flask-SocketIO runs in threading mode, passed explicitly: the product card lists eventlet, but
eventlet is deprecated by its authors and, like gevent, locked the server up with torch in the
process when measured here."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from flask import Flask, request
from flask_socketio import SocketIO

from engine.errors import InvalidParamError
from engine.lab.facade import Executor, LabFacade
from engine.launch.served import preload_allocator, served_levers
from engine.levers import LEVERS, parse_bool, validate_levers
from engine.platform import machine
from engine.platform.machine import MachineError
from engine.serving.routing.router import api_keys_from_env
from web import create_api_app
from web.classroom import install_classroom
from web.lessons import LessonLibrary
from web.live import LiveChannel
from web.page_session import PageSessions
from web.pages import pages
from web.whatif import whatif

if TYPE_CHECKING:
    from engine.lab.live.lab import LiveLab
    from engine.lab.remote.remote_backend import RemoteConfig
    from engine.lab.remote.remote_lab import RemoteLab
    from engine.launch.yielding import YieldingProcess

# The live lab (its fleet of replica processes) and the remote lab are imported where each is built:
# `import app`, the web layer and the what-if panels load neither the lab they do not run nor torch
# (tests/test_web_imports.py). Live, torch loads in the replica processes; the web process itself
# loads it only to count CUDA devices (engine/lab/live_limits.py) when the engine runs on CUDA.

ROOT = Path(__file__).resolve().parent

# The teaching app's heartbeat: its lab's proxy idle timeout (proxy_idle_timeout_s) goes down to
# a few seconds in the lessons, and `: ping` must come more often than that for the heartbeat
# defence to hold. (`python -m engine serve` keeps 10 s: vllm bench serve trips on lone comments.)
LAB_PING_S = 2.0


def build_lab(levers: dict | None = None, engine: dict | None = None, drain_timeout_s: float = 30.0) -> LiveLab:
    """The live engine behind the app: a fleet shaped by the levers (defaults where unset)."""
    from engine.config import EngineConfig
    from engine.lab.live.lab import LiveLab, engine_fields
    from engine.lab.replica_bounds import replica_bounds, split_pools
    from engine.serving.routing.defences import Defences
    from engine.serving.routing.router import RouterConfig
    from engine.serving.scaling.fleet import Fleet, FleetConfig

    values = {key: lever.default for key, lever in LEVERS.items()} | validate_levers(levers or {})
    engine_config = EngineConfig(**engine_fields(values), **(engine or {}))
    router_config = RouterConfig(
        queue_cap=values["queue_cap"],
        deadline_s=values["deadline_s"],
        rate_limit=values["rate_limit"] or None,
        api_keys=api_keys_from_env(),
    )
    # The autoscaler grows the fleet from its fewest, within the devices gpu_count grants; the warm
    # pool is loaded from the start, as the first replicas are.
    fewest, _ = replica_bounds(values, warm_pool_holds_devices=False)
    pools = split_pools(values)
    fleet_config = FleetConfig(
        fewest, drain_timeout_s, values["warm_pool"], values["provision_delay_s"], pools[1] if pools else 0
    )
    fleet = Fleet(engine_config, router_config, fleet_config, defences=Defences.from_levers(values))
    return LiveLab(fleet, values)


def build_remote_lab(config: RemoteConfig, levers: dict | None = None) -> RemoteLab:
    """The lab over a remote server (issue 17): no replica here; its first probe done."""
    from engine.lab.remote.remote_lab import RemoteLab

    return RemoteLab(config, validate_levers(levers or {})).start()


def create_app(lab: LabFacade, instructor_token: str | None = None) -> Flask:
    """Pages, API and the live stream over one lab: ServeLab's own engine (LiveLab), or a
    remote server (RemoteLab), whose API the app passes through."""
    remote = lab.executor == Executor.REMOTE
    if remote:
        from web.remote_api import create_remote_api_app

        app = create_remote_api_app(lab, api_keys_from_env())  # type: ignore[arg-type]
    else:
        app = create_api_app(lab.fleet, LAB_PING_S)  # type: ignore[attr-defined]
    app.extensions["servelab_lab"] = lab
    # With SERVELAB_API_KEYS set, the app's own pages prompt with a session cookie issued with
    # each page (web/page_session.py); outside clients still need a key.
    sessions = app.extensions["servelab_page_sessions"] = PageSessions()
    app.after_request(lambda response: sessions.issue(request, response))
    if not remote:
        lab.fleet.router.config.issued = sessions.is_page_credential  # type: ignore[attr-defined]
    lessons = LessonLibrary()
    app.extensions["servelab_lessons"] = lessons
    app.register_blueprint(pages)
    app.register_blueprint(whatif)  # the what-if panels: A/B, predict-then-run, at scale
    # cors_allowed_origins=None is Socket.IO's same-origin rule: a page from another origin
    # cannot drive this engine from a learner's browser.
    socketio = SocketIO(app, async_mode="threading", cors_allowed_origins=None)
    app.extensions["servelab_live"] = live = LiveChannel(socketio, lab, lessons, instructor_token)
    install_classroom(app, live, instructor_token)  # /class/new, /join/CODE and their socket events
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python app.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "5000")))
    parser.add_argument("--dtype", default="auto", help="auto: bf16 where this machine multiplies it natively, else fp32")
    parser.add_argument("--model-path", default=None, help="a GGUF file or HF folder for the live engine (default: SmolLM2)")
    parser.add_argument("--drain-timeout-s", type=float, default=30.0)
    parser.add_argument("--calibrate-in-background", action="store_true",
                        help="fit the what-if cpu device to this machine at the lowest priority if it has no fit yet (make run)")  # fmt: skip
    parser.add_argument("--backend", choices=("local", "remote"), default="local",
                        help="remote: drive and watch an existing vLLM / SGLang / ServeLab server")
    parser.add_argument("--base-url", default=os.environ.get("REMOTE_BASE_URL"), help="the remote's API root")
    parser.add_argument("--metrics-url", default=os.environ.get("REMOTE_METRICS_URL"), help="default: BASE_URL/metrics")
    parser.add_argument("--api-key", default=os.environ.get("REMOTE_API_KEY"), help="the remote's API key")
    for lever in LEVERS.values():  # every lever is a flag: --request-rate 2, --paged false
        kind = parse_bool if lever.kind is bool else lever.kind
        parser.add_argument("--" + lever.key.replace("_", "-"), type=kind, default=None, help=lever.label)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    levers = {key: getattr(args, key) for key in LEVERS if getattr(args, key) is not None}
    token = os.environ.get("SERVELAB_INSTRUCTOR_TOKEN") or None
    if args.backend == "remote":
        return main_remote(args, levers, token)
    from engine.launch.api_server import serve_app

    try:  # what no replica could get past is refused here, in one line
        machine.cpu()
        preload_allocator()  # the replicas and the background measurement start with tcmalloc
        # The fastest configuration (compiled, huge pages): engine/launch/served.py.
        engine = served_levers() | {"dtype": args.dtype, "model": args.model_path}
        lab = build_lab(levers, engine, args.drain_timeout_s)
    except (InvalidParamError, MachineError) as err:
        print(f"python app.py: cannot serve: {err}", file=sys.stderr)
        return 2
    logging.getLogger("servelab.app").info(
        "levers: %s", "instructor only (SERVELAB_INSTRUCTOR_TOKEN)" if token else "anyone connected may move them"
    )
    # SERVELAB_BACKGROUND_YIELD=off: the measurement runs on at nice 19 and SCHED_IDLE alone, as
    # before issue 40 (bench/background_beside_live.py --unyielding measures what that costs).
    yielding = os.environ.get("SERVELAB_BACKGROUND_YIELD", "on") != "off"
    busy = lab.fleet.has_work if yielding else (lambda: False)
    background = start_background_calibration(busy) if args.calibrate_in_background else None

    def stop() -> None:
        if background is not None:
            background.stop()
        lab.stop()

    # The lab's clients reach the server as any user does, over HTTP (through the lab's proxy):
    # told its URL once the port is bound.
    return serve_app(lab.fleet, create_app(lab, token), args.host, args.port, on_stop=stop, on_bound=lab.connect)


def start_background_calibration(busy: Callable[[], bool]) -> YieldingProcess | None:
    """`make run`'s first start on a machine: `python -m bench.calibrate` (it fits the what-if cpu
    device; the page does not wait for it), unless this machine and engine build already have a
    fit or one is being made; then (or at once, if the fit exists) `python -m bench.figures
    --background`, the lessons' offline figures, if they are not measured here yet. It gives way
    to the live engine: paused while the fleet has a request (engine/launch/yielding.py), and a
    run on a busy machine is refused and tried again later."""
    from engine.launch.yielding import YieldingProcess
    from engine.sim import calibration
    from web.figures import local_path

    key = calibration.this_machine()
    log = logging.getLogger("servelab.app")
    if calibration.calibrating_since(key) is not None:
        return None
    found = calibration.load(key)
    figures = [] if local_path(key).exists() else ["-m", "bench.figures", "--background"]
    if found is not None and found.this_machine and not figures:
        return None
    calibration.CALIBRATION_DIR.mkdir(parents=True, exist_ok=True)
    out = calibration.path_for(key).with_suffix(".log")
    out.write_text("")
    if found is None or not found.this_machine:
        command = [sys.executable, "-m", "bench.calibrate", "--background", *(["--then-figures"] if figures else [])]
    else:
        command = [sys.executable, *figures]
    log.info("measuring this machine in the background, paused while the engine serves: %s (log: %s)",
             " ".join(command[1:]), out)  # fmt: skip
    return YieldingProcess(command, busy, out, cwd=ROOT).start()


def main_remote(args: argparse.Namespace, levers: dict, token: str | None) -> int:
    """--backend remote: bad flags exit 2 with one line; then the lab serves over the remote."""
    from engine.lab.remote.remote_backend import RemoteConfig
    from engine.lab.remote.remote_levers import REMOTE_LEVERS
    from engine.launch.remote_server import serve_remote

    try:
        config = RemoteConfig.from_args(args.base_url, args.metrics_url, args.api_key)
        owned = [key for key in levers if key not in REMOTE_LEVERS]
        if owned:
            flag = "--" + owned[0].replace("_", "-")
            raise ValueError(f"{flag} belongs to the remote server: set it where the remote starts, not here")
        lab = build_remote_lab(config, levers)
    except (ValueError, InvalidParamError) as err:
        print(f"python app.py: error: {err}", file=sys.stderr)
        return 2
    return serve_remote(lab, create_app(lab, token), args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
