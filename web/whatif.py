"""The what-if endpoints of the pages: A/B side by side, predict-then-run, and each lesson's "at
scale" experiment. The work is engine/sim's (compare.py, predict.py); this module only reads the
request, runs one simulation at a time, and answers in JSON (errors as the OpenAI API's).

- `POST /whatif/ab`: an experiment ({"preset"?, "traffic"?, "a"?, "b"?}) -> both sides' table
  rows, timelines, badges and reproducing commands; `GET /whatif/ab?ab=PRESET&t.KEY=..&a.KEY=..
  &b.KEY=..` is the same experiment from a shared link's query.
- `GET /whatif/presets`: the presets and the keys an experiment takes.
- `POST /whatif/predict`: the simulator's prediction of the live lab's charts at its levers now.
- `POST /whatif/lesson/<step>`: that lesson's at-scale experiment(s), as `/whatif/ab` answers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from engine.errors import InvalidParamError, ServingError
from engine.sim.compare import (
    DEFAULT_SIDE,
    DEFAULT_TRAFFIC,
    PRICE,
    SIDE_FIELDS,
    TRAFFIC_FIELDS,
    parse_experiment,
    run_experiment,
)
from engine.sim.predict import predict
from engine.sim.presets import PRESETS

whatif = Blueprint("whatif", __name__, url_prefix="/whatif")
# One simulation at a time in the web process: a second browser's waits its turn (briefly) or is
# told to retry, so simulations never pile up beside the live engine's stream.
_running = threading.Lock()
WAIT_S = 10.0
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


def _answer(work: Callable[[], dict[str, Any]]) -> tuple[Response, int]:
    """Run one simulation under the lock; refusals as OpenAI-style errors naming the parameter."""
    if not _running.acquire(timeout=WAIT_S):
        err = ServingError(429, "another simulation is running in this server; try again in a moment", None, "busy", 2)
        return jsonify(err.body()), 429
    try:
        return jsonify({"ok": True, **work()}), 200
    except InvalidParamError as err:
        return jsonify(ServingError(400, err.message, err.param).body()), 400
    except ServingError as err:
        return jsonify(err.body()), err.status
    finally:
        _running.release()


def _body() -> dict[str, Any]:
    body = request.get_json(silent=True)
    if body is None and request.content_length:
        raise InvalidParamError("body", "must be a JSON object")
    return body if body is not None else {}


@whatif.post("/ab")
def ab_post() -> tuple[Response, int]:
    def work() -> dict[str, Any]:
        return run_experiment(parse_experiment(_body()))

    return _answer(work)


@whatif.get("/ab")
def ab_get() -> tuple[Response, int]:
    return _answer(lambda: run_experiment(parse_experiment(experiment_from_query(request.args))))


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


@whatif.post("/predict")
def predict_live() -> tuple[Response, int]:
    lab = current_app.extensions["servelab_lab"]
    return _answer(lambda: predict(dict(lab.levers)))


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
        return run_experiment(parse_experiment(run["experiment"])) | {"title": run["title"], "watch": run["watch"]}

    return _answer(work)
