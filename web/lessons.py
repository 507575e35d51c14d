"""Lessons: `lessons/NN-slug.md`, YAML front matter plus a markdown body.

`python -m web.lessons check [FILES]` validates every lesson and prints `file:line: message` for
each mistake (exit 1 if any). The body renders with markdown-it-py and is sanitised with nh3, so
a lesson holding <script> or a javascript: link renders harmless. LessonLibrary re-reads a file
when its modification time changes, so an edited lesson shows on the next page load."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nh3
import yaml
from markdown_it import MarkdownIt

from engine.errors import InvalidParamError
from engine.levers import LEVERS
from web.failures import failures_for_step
from web.figures import Figure, FigureBook, provenance
from web.predictions import check_predict

LESSONS_DIR = Path(__file__).resolve().parent.parent / "lessons"
CHARTS = {  # the live charts a lesson may name, with the title a page gives each
    "queue_depth": "Queue depth",
    "running": "Running and waiting requests",
    "kv_blocks": "KV blocks used / total",
    "ttft": "TTFT p50 / p99 (s): server and clients",
    "itl": "ITL p50 / p99 (s)",
    "tokens_per_s": "Output tokens/s",
    "rejected": "Refused requests (total)",
    "preempted": "Preemptions (total)",
    "replicas": "Replicas by state",
    "batch_size": "Batch size / slots",
    "allreduce_ms": "Tensor parallel: all-reduce time per step (ms)",
    "stage_idle": "Pipeline stages: each stage's idle share, the bubble (%)",
    "scaling": "Autoscaler: scale changes, replicas ordered, streams cut (totals)",
    # Drawn by static/traces.js from the `trace` event, not from the metrics snapshot.
    "swimlanes": "Requests, one row each: queued, waiting, prefill chunks, decode, preempted, end",
    "batch_steps": "The batch, step by step: tokens per engine step against the budget",
    "stage_steps": "Pipeline stages, batch by batch: where each stage worked, and where it idled (the bubble)",
}
TRACE_CHARTS = frozenset({"swimlanes", "batch_steps", "stage_steps"})  # the charts above that are not Plotly series
# The charts only an engine of ours can feed: the traces, and the pipeline stages' busy time.
OWN_ENGINE_CHARTS = TRACE_CHARTS | {"stage_idle"}
FILE_NAME = re.compile(r"^(\d\d)-[a-z0-9-]+\.md$")
_markdown = MarkdownIt("commonmark", {"html": False}).enable("table")


@dataclass
class LessonError:
    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class Lesson:
    path: Path
    meta: dict[str, Any]
    body_html: str  # the body after its first section
    mtime: float = 0.0
    problem_html: str = ""  # the body's first section (its problem statement), shown above the charts
    figures: list[Figure] = field(default_factory=list)  # the measured figures it quotes

    @property
    def step(self) -> int:
        return self.meta["step"]

    @property
    def provenance(self) -> list[str]:
        return provenance(self.figures)


@dataclass
class _Checker:
    path: Path
    lines: dict[tuple, int]  # front-matter path -> 1-based file line
    errors: list[LessonError] = field(default_factory=list)

    def fail(self, where: tuple, message: str) -> None:
        while where and where not in self.lines:
            where = where[:-1]
        self.errors.append(LessonError(self.path, self.lines.get(where, 1), message))


def parse_lesson(path: Path, book: FigureBook | None = None) -> tuple[Lesson | None, list[LessonError]]:
    raw = path.read_text(encoding="utf-8")
    text, figures, unknown = (book or FigureBook()).render(raw)
    if unknown:
        return None, [LessonError(path, raw[: raw.find("{{fig:" + name)].count("\n") + 1,
                                  f"no measured figure named {name!r} (web/figures.py SPECS)") for name in unknown]  # fmt: skip
    if not text.startswith("---\n"):
        return None, [LessonError(path, 1, "a lesson starts with '---' and YAML front matter")]
    end = text.find("\n---\n", 4)
    if end < 0:
        return None, [LessonError(path, 1, "the front matter has no closing '---'")]
    front, body = text[4:end], text[end + 5 :]
    try:
        node = yaml.compose(front, Loader=yaml.SafeLoader)
        meta = yaml.safe_load(front)
    except yaml.YAMLError as err:
        mark = getattr(err, "context_mark", None) or getattr(err, "problem_mark", None)  # where it began
        line = getattr(mark, "line", 0) + 2
        return None, [LessonError(path, line, f"YAML: {getattr(err, 'problem', err)}")]
    lines: dict[tuple, int] = {}
    _index_lines(node, (), lines)
    checker = _Checker(path, lines)
    _check(meta, checker)
    if checker.errors:
        return None, checker.errors
    problem, rest = _split_first_section(body)
    problem_html, html = (nh3.clean(_markdown.render(part), url_schemes={"http", "https", "mailto"}) for part in (problem, rest))
    return Lesson(path, meta, html, path.stat().st_mtime, problem_html, figures), []


def _split_first_section(body: str) -> tuple[str, str]:
    """The body's first `## ` section (the problem it poses) and the rest: a page puts the first
    beside the decision, above the experiment, and the rest below it."""
    starts = [m.start() for m in re.finditer(r"^## ", body, flags=re.MULTILINE)]
    if len(starts) < 2:
        return body, ""
    return body[: starts[1]], body[starts[1] :]


def _index_lines(node: yaml.Node | None, where: tuple, out: dict[tuple, int]) -> None:
    if node is None:
        return
    out[where] = node.start_mark.line + 2  # +1 for 1-based, +1 for the opening '---'
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            _index_lines(value, (*where, key.value), out)
            out[(*where, key.value)] = key.start_mark.line + 2  # point at the key, not its value
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, (*where, i), out)


def _check(meta: Any, c: _Checker) -> None:
    if not isinstance(meta, dict):
        c.fail((), "the front matter must be a mapping")
        return
    match = FILE_NAME.match(c.path.name)
    if not match:
        c.fail((), "the file name must be NN-slug.md")
    step = meta.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 1 <= step <= 8:
        c.fail(("step",), "step must be a whole number from 1 to 8")
    elif match and int(match.group(1)) != step:
        c.fail(("step",), f"step {step} does not match the file name's {match.group(1)}")
    for key in ("title", "summary"):
        if not isinstance(meta.get(key), str) or not meta[key].strip():
            c.fail((key,), f"{key} must be a non-empty string")
    _check_levers(meta.get("levers"), ("levers",), c, required=True)
    charts = meta.get("charts")
    if not isinstance(charts, list) or not charts:
        c.fail(("charts",), "charts must be a non-empty list")
    else:
        for i, chart in enumerate(charts):
            if chart not in CHARTS:
                c.fail(("charts", i), f"unknown chart {chart!r}; charts are {', '.join(CHARTS)}")
    _check_cards(meta.get("scenarios"), "scenarios", ("title", "watch"), c)
    _check_cards(meta.get("failure_modes"), "failure_modes", ("title", "expect"), c)
    if isinstance(step, int) and not isinstance(step, bool):
        _check_defence_cards(step, meta.get("failure_modes"), c)
    _check_decision(meta.get("decision"), c)
    cards = [card for kind in ("scenarios", "failure_modes") for card in meta.get(kind) or [] if isinstance(card, dict)]
    if cards and not any("predict" in card for card in cards):
        c.fail(("scenarios",), "at least one card (scenarios or failure_modes) must carry a predict")
    if "at_scale" in meta:
        _check_at_scale(meta["at_scale"], c)
    known = {"step", "title", "summary", "levers", "charts", "scenarios", "decision", "failure_modes", "at_scale"}
    for key in meta:
        if key not in known:
            c.fail((key,), f"unknown field {key!r}")


def _check_levers(levers: Any, where: tuple, c: _Checker, required: bool) -> None:
    if not isinstance(levers, dict) or (required and not levers):
        c.fail(where, "levers must be a mapping of lever keys to values")
        return
    for key, value in levers.items():
        if key not in LEVERS:
            c.fail((*where, key), f"unknown lever {key!r}")
            continue
        try:
            LEVERS[key].validate(value)
        except InvalidParamError as err:
            c.fail((*where, key), f"lever {err}")


def _check_cards(cards: Any, name: str, texts: tuple[str, ...], c: _Checker) -> None:
    if not isinstance(cards, list) or not cards:
        c.fail((name,), f"{name} must be a non-empty list")
        return
    for i, card in enumerate(cards):
        if not isinstance(card, dict):
            c.fail((name, i), f"each of {name} must be a mapping")
            continue
        for key in texts:
            if not isinstance(card.get(key), str) or not card[key].strip():
                c.fail((name, i, key), f"{name}[{i}] needs a non-empty {key}")
        _check_levers(card.get("levers"), (name, i, "levers"), c, required=True)
        if "predict" in card:  # predict, observe, explain (web/predictions.py)
            for where, message in check_predict(card["predict"]):
                c.fail((name, i, "predict", *where), f"{name}[{i}]: {message}")


def _check_defence_cards(step: int, cards: Any, c: _Checker) -> None:
    """Each defence lever whose failure this step teaches (web/failures.py) is set by one of its
    "Break it" cards, so the lesson breaks what the gallery says it does."""
    if not isinstance(cards, list):
        return  # _check_cards has said so
    used = {key for card in cards if isinstance(card, dict) and isinstance(card.get("levers"), dict) for key in card["levers"]}
    for failure in failures_for_step(step):
        if failure.lever not in used:
            c.fail(("failure_modes",), f"no Break it card sets the defence lever {failure.lever!r} of step {step}")


def _check_decision(decision: Any, c: _Checker) -> None:
    if not isinstance(decision, dict) or not isinstance(decision.get("question"), str):
        c.fail(("decision",), "decision needs a question and options")
        return
    options = decision.get("options")
    if not isinstance(options, list) or len(options) < 2:
        c.fail(("decision", "options"), "a decision needs at least two options")
        return
    correct = 0
    for i, option in enumerate(options):
        if (
            not isinstance(option, dict)
            or not isinstance(option.get("text"), str)
            or not isinstance(option.get("why"), str)
        ):
            c.fail(("decision", "options", i), "each option needs text and why")
            continue
        if not isinstance(option.get("correct"), bool):
            c.fail(("decision", "options", i), "each option needs correct: true or false")
        correct += option.get("correct") is True
    if correct != 1:
        c.fail(("decision", "options"), f"exactly one option must be correct, found {correct}")


def _check_at_scale(runs: Any, c: _Checker) -> None:
    """at_scale: a list of simulated experiments, each {title, watch, experiment (an A/B of
    engine/sim/compare.py: traffic, a, b, each side with a label), quotes (the figures the body
    quotes: side, key of the side's table row or summary, value), refusals (levers of a side the
    simulator refuses, and words of its reason)}. The quoted figures themselves are checked
    against fresh runs by tests/test_lesson_at_scale.py, not here (a page load runs no simulation)."""
    from engine.sim.compare import parse_experiment

    if not isinstance(runs, list) or not runs:
        c.fail(("at_scale",), "at_scale must be a non-empty list of experiments")
        return
    for i, run in enumerate(runs):
        where = ("at_scale", i)
        if not isinstance(run, dict):
            c.fail(where, "each at_scale entry must be a mapping")
            continue
        for key in ("title", "watch"):
            if not isinstance(run.get(key), str) or not run[key].strip():
                c.fail((*where, key), f"at_scale[{i}] needs a non-empty {key}")
        unknown = set(run) - {"title", "watch", "experiment", "quotes", "refusals"}
        for key in sorted(unknown):
            c.fail((*where, key), f"unknown field {key!r} in at_scale[{i}]")
        experiment = run.get("experiment")
        if not isinstance(experiment, dict) or not all(isinstance(experiment.get(s), dict) for s in ("a", "b")):
            c.fail((*where, "experiment"), "an experiment needs traffic and two sides, a and b")
            continue
        for side in ("a", "b"):
            if not isinstance(experiment[side].get("label"), str):
                c.fail((*where, "experiment", side), f"side {side} needs a label")
        try:
            parse_experiment(experiment)
        except InvalidParamError as err:
            group, _, key = (err.param or "").partition(".")
            c.fail((*where, "experiment", group, key), f"experiment {err}")
        for j, quote in enumerate(run.get("quotes") or []):
            ok = isinstance(quote, dict) and quote.get("side") in ("a", "b") and isinstance(quote.get("key"), str)
            if not ok or isinstance(quote.get("value"), bool) or not isinstance(quote.get("value"), (int, float)):
                c.fail((*where, "quotes", j), "a quote needs side (a or b), key and a numeric value")
        for j, refusal in enumerate(run.get("refusals") or []):
            if not isinstance(refusal, dict) or not isinstance(refusal.get("levers"), dict) or not isinstance(
                refusal.get("reason"), str
            ):
                c.fail((*where, "refusals", j), "a refusal needs levers (one side's) and words of the reason")


class LessonLibrary:
    """The lessons of a folder, re-read whenever a file changes."""

    def __init__(self, folder: Path = LESSONS_DIR, book: FigureBook | None = None) -> None:
        self.folder = folder
        self.book = book or FigureBook()
        self._cache: dict[Path, tuple[tuple, Lesson]] = {}

    def lessons(self) -> list[Lesson]:
        found = []
        for path in sorted(self.folder.glob("[0-9][0-9]-*.md")):
            stamp = (path.stat().st_mtime, self.book.stamp())  # a fresh measurement re-renders it
            cached = self._cache.get(path)
            if cached is None or cached[0] != stamp:
                lesson, errors = parse_lesson(path, self.book)
                if lesson is None:
                    raise ValueError("; ".join(map(str, errors)))
                self._cache[path] = cached = (stamp, lesson)
            found.append(cached[1])
        return found

    def step(self, number: int) -> Lesson | None:
        return next((lesson for lesson in self.lessons() if lesson.step == number), None)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] != "check":
        print("usage: python -m web.lessons check [FILE ...]", file=sys.stderr)
        return 2
    paths = [Path(p) for p in argv[2:]] or sorted(LESSONS_DIR.glob("*.md"))
    errors = [err for path in paths for err in parse_lesson(path)[1]]
    for err in errors:
        print(err)
    print(f"{len(paths)} lesson(s) checked, {len(errors)} mistake(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
