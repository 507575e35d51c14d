"""The what-if endpoints of the pages: A/B side by side, predict-then-run, and each lesson's "at
scale" experiment. The work is engine/sim's (compare.py, predict.py); this module only reads the
request, runs one simulation at a time, and answers in JSON (errors as the OpenAI API's).

- `POST /whatif/ab`: an experiment ({"preset"?, "traffic"?, "a"?, "b"?}) -> both sides' table
  rows, timelines, badges and reproducing commands; `GET /whatif/ab?ab=PRESET&t.KEY=..&a.KEY=..
  &b.KEY=..` is the same experiment from a shared link's query.
- `GET /whatif/presets`: the presets and the keys an experiment takes.
- `POST /whatif/predict`: the simulator's prediction of the live lab's charts at its levers now.
- `POST /whatif/lesson/<step>`: that lesson's at-scale experiment(s), as `/whatif/ab` answers.
- `GET /whatif/queue?ticket=T`: the place in line of the run posted with `?ticket=T`.
- `POST /whatif/plan?ticket=T`: a deployment plan (engine/sim/plan.py) for the Plan page's query;
  `GET /whatif/plan/progress?ticket=T`: its lines searched so far ({"done", "total"}, or null).

Every run goes to the what-if worker (web/whatif_worker.py: one process at the lowest CPU
priority, one run at a time, in arrival order), never a request thread. While a class runs, only
its instructor starts one (the class token in `X-ServeLab-Token`, as the page's socket presents it)."""

from __future__ import annotations

import hmac
import json
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from engine.errors import InvalidParamError, ServingError
from engine.lab.simulated.predict import predict
from engine.sim.compare import (
    DEFAULT_SIDE,
    DEFAULT_TRAFFIC,
    PRICE,
    SIDE_FIELDS,
    TRAFFIC_FIELDS,
    parse_experiment,
    run_experiment,
)
from engine.sim.plan import plan_for_page
from engine.sim.plan_space import PlanQuery
from engine.sim.presets import PRESETS
from web.openai_api import error_response
from web.whatif_worker import WhatIfWorker

whatif = Blueprint("whatif", __name__, url_prefix="/whatif")
QUERY_GROUPS = {"t": "traffic", "a": "a", "b": "b"}  # a shared link's key prefixes


def experiment_from_query(args: Mapping[str, str]) -> dict[str, Any]:
    """A shared link's query (?ab=PRESET&t.request_rate=20&a.tensor_parallel=4&b.tensor_parallel=8)
    as an experiment body; `ab=1` names no preset. Values stay text: parse_experiment types them."""
    body: dict[str, Any] = {}
    preset = args.get("ab")
    if preset and preset != "1":
        body["preset"] = preset
    for name, value in args.items():
        group, _, key = name.partition(".")
        if group in QUERY_GROUPS and key:
            body.setdefault(QUERY_GROUPS[group], {})[key] = value
    return body


def worker() -> WhatIfWorker:
    return current_app.extensions.setdefault("servelab_whatif_worker", WhatIfWorker())


def _instructor_only_in_class() -> None:
    live = current_app.extensions.get("servelab_live")
    class_token = live.class_token() if live is not None else None
    presented = request.headers.get("X-ServeLab-Token") or ""
    if class_token and not hmac.compare_digest(presented.encode(), class_token.encode()):
        raise ServingError(403, "while a class runs, only its instructor starts what-if runs", "token", "forbidden")


def _answer(work: Callable[[], dict[str, Any]]) -> tuple[Response, int]:
    """Run one simulation through the worker; refusals as OpenAI-style errors naming the parameter."""
    try:
        _instructor_only_in_class()
        return jsonify({"ok": True, **work()}), 200
    except InvalidParamError as err:
        return jsonify(ServingError(400, err.message, err.param).body()), 400
    except ServingError as err:
        return error_response(err), err.status  # with Retry-After where it has one


def _in_worker(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    return worker().run(fn, *args, ticket=request.args.get("ticket") or None)


def _body() -> dict[str, Any]:
    body = request.get_json(silent=True)
    if body is None and request.content_length:
        raise InvalidParamError("body", "must be a JSON object")
    return body if body is not None else {}


@whatif.post("/ab")
def ab_post() -> tuple[Response, int]:
    return _answer(lambda: _in_worker(run_experiment, parse_experiment(_body())))


@whatif.get("/ab")
def ab_get() -> tuple[Response, int]:
    return _answer(lambda: _in_worker(run_experiment, parse_experiment(experiment_from_query(request.args))))


@whatif.get("/presets")
def presets() -> Response:
    def keys(table: dict) -> list[dict[str, Any]]:
        return [
            {"key": f.key, "kind": f.kind.__name__, "min": f.minimum, "max": f.maximum, "choices": list(f.choices)}
            for f in table.values()
        ]

    return jsonify({
        "presets": PRESETS,
        "traffic": keys(TRAFFIC_FIELDS),
        "side": keys(SIDE_FIELDS),
        "defaults": {"traffic": DEFAULT_TRAFFIC, "side": DEFAULT_SIDE | {"gpu_hour_usd": PRICE.default}},
        "price": {"key": PRICE.key, "label": PRICE.label, "unit": PRICE.unit},
    })  # fmt: skip


@whatif.get("/queue")
def queue_position() -> Response:
    """{"position": 0 running / n runs ahead / null not in line, "in_line": every run in line}."""
    w = worker()
    return jsonify({"position": w.position(request.args.get("ticket", "")), "in_line": w.waiting()})


@whatif.post("/predict")
def predict_live() -> tuple[Response, int]:
    lab = current_app.extensions["servelab_lab"]
    return _answer(lambda: _in_worker(predict, dict(lab.levers)))


@whatif.post("/lesson/<int:step>")
def lesson_at_scale(step: int) -> tuple[Response, int]:
    lesson = current_app.extensions["servelab_lessons"].step(step)

    def work() -> dict[str, Any]:
        if lesson is None or not lesson.meta.get("at_scale"):
            raise ServingError(404, f"step {step} has no at-scale experiment", "step")
        index = request.args.get("index", "0")
        runs = lesson.meta["at_scale"]
        if not index.isdigit() or int(index) >= len(runs):
            raise InvalidParamError("index", f"must be 0 to {len(runs) - 1}")
        run = runs[int(index)]
        result = _in_worker(run_experiment, parse_experiment(run["experiment"]))
        return result | {"title": run["title"], "watch": run["watch"]}

    return _answer(work)


def _progress_path(ticket: str | None) -> Path | None:
    """Where the worker writes a plan's progress: a file per ticket the page chose (letters,
    digits and dashes only), which the page polls while it waits."""
    if not ticket or not re.fullmatch(r"[A-Za-z0-9-]{1,64}", ticket):
        return None
    return Path(tempfile.gettempdir()) / f"servelab-plan-{ticket}.json"


@whatif.post("/plan")
def plan_post() -> tuple[Response, int]:
    def work() -> dict[str, Any]:
        query = PlanQuery.from_body(_body())
        path = _progress_path(request.args.get("ticket"))
        try:
            return _in_worker(plan_for_page, query, None if path is None else str(path))
        finally:
            if path is not None:
                path.unlink(missing_ok=True)

    return _answer(work)


@whatif.get("/plan/progress")
def plan_progress() -> Response:
    path = _progress_path(request.args.get("ticket"))
    try:
        return jsonify(json.loads(path.read_text()) if path is not None else None)
    except (OSError, ValueError):
        return jsonify(None)  # not started yet, or being written
