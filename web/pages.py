"""The teaching pages: `/` (the path of steps and the live engine), `/steps/N` (one per lesson
file, in step order), `/lab` (every lever), `/failures` (the failure gallery), `/authoring` (the
lesson authors' reference), plus the npm-installed browser libraries under /static/vendor/."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from flask import Blueprint, Response, abort, current_app, render_template, send_file

from engine.catalog import DEVICE_NAMES, MODEL_NAMES
from engine.errors import ServingError
from engine.lab.facade import LabFacade
from engine.lab.shape import TRADEOFFS
from engine.levers import LEVERS
from engine.serving.telemetry.metrics import WINDOW_S
from engine.sim.constants import GPU_HOUR_USD
from engine.sim.plan_space import PlanQuery
from web.diagram import diagram
from web.evolution import EVOLUTION
from web.failures import FAILURES
from web.lesson_reference import reference
from web.lessons import CHARTS, OWN_ENGINE_CHARTS, LessonLibrary, render_markdown

ROOT = Path(__file__).resolve().parent.parent
# What /static/vendor/<name> serves, from node_modules (package.json pins the versions).
VENDOR = {
    "socket.io.min.js": ROOT / "node_modules/socket.io-client/dist/socket.io.min.js",
    "plotly.min.js": ROOT / "node_modules/plotly.js-dist-min/plotly.min.js",
}
APPLY_TAGS = {"load": "traffic", "in_place": "in place", "rebuild": "rebuilds replicas", "sim": "what-if", "mode": "executor"}
MODE_KEYS = ("executor", "device", "sim_speed")  # the mode bar's, on every page with levers

pages = Blueprint("pages", __name__)


def lab() -> LabFacade:
    return current_app.extensions["servelab_lab"]


def library() -> LessonLibrary:
    return current_app.extensions["servelab_lessons"]


@pages.get("/")
def index() -> str:
    return render_template("index.html", lessons=library().lessons(), live=lab().live_state().to_json(), evolution=EVOLUTION)


def _drawable(charts: Iterable[str]) -> list[str]:
    """The charts this lab can feed: the swimlanes, the batch and stage charts, TPOT and speculation
    need an engine of ours (a remote lab reads no request traces or stage timings, only the
    remote's aggregates it knows: web/charts.py OWN_ENGINE_CHARTS)."""
    names = list(charts)
    return names if lab().traces is not None else [c for c in names if c not in OWN_ENGINE_CHARTS]


@pages.get("/steps/<int:number>")
def step(number: int) -> str:
    lessons = library().lessons()
    at = next((i for i, item in enumerate(lessons) if item.step == number), None)
    if at is None:
        broken = library().broken_step(number)
        if broken is None:
            abort(404)
        # The author's loop: the page says what to fix, at which lines, and the rest of the site serves on.
        return render_template("lesson_errors.html", broken=broken, lessons=lessons, live=lab().live_state().to_json())
    lesson = lessons[at]
    return render_template(
        "step.html",
        lesson=lesson,
        lessons=lessons,
        before=lessons[at - 1] if at > 0 else None,
        after=lessons[at + 1] if at + 1 < len(lessons) else None,
        live=lab().live_state().to_json(),
        levers=[LEVERS[key] for key in lesson.meta["levers"]],
        charts=_drawable(lesson.meta["charts"]),
        diagram=diagram(number),
        failures=[f for f in FAILURES if f.step == number],  # this step's defences, with their metrics
        **_shared(),
    )


@pages.app_context_processor
def _broken_lessons() -> dict:
    """Every page's navigation marks a lesson file with mistakes, so its author finds the page that says them."""
    lessons = current_app.extensions.get("servelab_lessons")
    return {"broken_lessons": lessons.broken() if lessons is not None else []}


@pages.get("/authoring")
def authoring() -> str:
    """The lesson authors' reference, generated from the validator's own tables."""
    return render_template("authoring.html", reference=render_markdown(reference()), lessons=library().lessons(),
                           live=lab().live_state().to_json())  # fmt: skip


@pages.get("/lab")
def lab_page() -> str:
    return render_template(
        "lab.html",
        lessons=library().lessons(),
        live=lab().live_state().to_json(),
        levers=list(LEVERS.values()),
        charts=_drawable(CHARTS),
        diagram=diagram(None),
        evolution=EVOLUTION,
        **_shared(),
    )


@pages.get("/plan")
def plan_page() -> str:
    """The deployment planner: a query, the frontier it finds, the cheapest shape and its launch."""
    return render_template(
        "plan.html", lessons=library().lessons(), live=lab().live_state().to_json(),
        # smollm2-135m on `cpu` plans a fleet of ServeLab's own engine on this machine (price it yourself).
        models=list(MODEL_NAMES), devices=list(DEVICE_NAMES),
        prices=GPU_HOUR_USD, defaults=PlanQuery, accuracy=_latency_accuracy(), window_s=round(WINDOW_S), **_shared(),
    )  # fmt: skip


def _latency_accuracy() -> dict | None:
    """The simulator's latency errors against published runs (bench/sim_latency.py's last result),
    for the Plan page's "how accurate is this"; None where it was never run."""
    path = ROOT / "bench" / "results" / "sim_latency.json"
    try:
        result = json.loads(path.read_text())
        return {"date": result["date"], "command": result["command"], "mape": result["mape_p50_percent"],
                "itl_mape": result.get("itl_mape_p50_percent")}
    except (OSError, ValueError, KeyError):
        return None


@pages.get("/failures")
def failures_page() -> str:
    """The failure gallery: every defence lever's failure, a break / fix toggle and its metric live."""
    return render_template(
        "failures.html", lessons=library().lessons(), live=lab().live_state().to_json(), failures=FAILURES, **_shared()
    )


@pages.get("/static/vendor/<name>")
def vendor(name: str) -> Response:
    path = VENDOR.get(name)
    if path is None:
        abort(404)
    if not path.exists():
        raise ServingError(500, f"{path.relative_to(ROOT)} is missing: run `make run` (it runs npm ci)", None)
    return send_file(path, mimetype="text/javascript", max_age=3600)


def _shared() -> dict:
    return {
        "chart_titles": CHARTS, "apply_tags": APPLY_TAGS, "mode_keys": MODE_KEYS,
        "mode_levers": [LEVERS[key] for key in MODE_KEYS], "tradeoffs": TRADEOFFS,
        "lever_defaults": {key: lever.default for key, lever in LEVERS.items()},
    }
