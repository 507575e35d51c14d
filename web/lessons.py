"""Lessons: `lessons/NN-slug.md`, YAML front matter plus a markdown body.

`python -m web.lessons check [FILES]` validates every lesson (web/lesson_checks.py's rules, the
placeholders and the number rule of web/lesson_text.py) and prints `file:line: message` for each
mistake (exit 1 if any). Rates written relative to capacity resolve here from the figures the page
shows (web/sizing.py). The body renders with markdown-it-py and is sanitised with nh3, so a lesson
holding <script> or a javascript: link renders harmless. LessonLibrary re-reads a file when its
modification time changes, so an edited lesson shows on the next page load."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nh3
import yaml
from markdown_it import MarkdownIt

from engine.levers import LEVERS
from web.figures import Figure, FigureBook, provenance
from web.glossary import Metric, used_in
from web.lesson_checks import (
    CARD_KINDS,
    Checker,
    LessonError,
    check_body,
    check_definitions,
    check_front,
    check_numbers,
    index_lines,
    quoted_values,
)
from web.lesson_text import fill_levers, lever_text, render
from web.sizing import NEEDS as CAPACITY_FIGURES
from web.sizing import fit, relative_factor, resolve_rates

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
_markdown = MarkdownIt("commonmark", {"html": False}).enable("table")


@dataclass
class Lesson:
    path: Path
    meta: dict[str, Any]
    body_html: str  # the body after its first section
    mtime: float = 0.0
    problem_html: str = ""  # the body's first section (its problem statement), shown above the charts
    figures: list[Figure] = field(default_factory=list)  # the measured figures it quotes
    metrics: list[Metric] = field(default_factory=list)  # the metrics its page names (its glossary)

    @property
    def step(self) -> int:
        return self.meta["step"]

    @property
    def provenance(self) -> list[str]:
        return provenance(self.figures)


def parse_lesson(path: Path, book: FigureBook | None = None) -> tuple[Lesson | None, list[LessonError]]:
    raw = path.read_text(encoding="utf-8")
    if not raw.startswith("---\n"):
        return None, [LessonError(path, 1, "a lesson starts with '---' and YAML front matter")]
    front_end = raw.find("\n---\n", 4)
    if front_end < 0:
        return None, [LessonError(path, 1, "the front matter has no closing '---'")]
    book = book or FigureBook()
    figures = book.figures()
    rendered = render(raw, figures, front_end + 5)
    if rendered.errors:
        return None, [LessonError(path, line, message) for line, message in rendered.errors]
    text = rendered.text
    end = text.find("\n---\n", 4)
    front, body = text[4:end], text[end + 5 :]
    try:
        node = yaml.compose(front, Loader=yaml.SafeLoader)
        meta = yaml.safe_load(front)
    except yaml.YAMLError as err:
        mark = getattr(err, "context_mark", None) or getattr(err, "problem_mark", None)  # where it began
        line = getattr(mark, "line", 0) + 2
        return None, [LessonError(path, line, f"YAML: {getattr(err, 'problem', err)}")]
    lines: dict[tuple, int] = {}
    index_lines(node, (), lines)
    checker = Checker(path, lines, frozenset(CHARTS))
    check_front(meta, checker)
    check_body(raw, body, raw.count("\n", 0, front_end + 5) + 1, checker)
    if isinstance(meta, dict):
        check_numbers(raw, front_end, quoted_values(meta), checker)
    relative = not checker.errors and _relative_levers(meta)
    if not checker.errors:
        try:
            body = _resolve(meta, body, {name: fig.value for name, fig in figures.items()})
        except KeyError as err:
            checker.fail(("levers",), f"a rate relative to capacity needs the measured figure {err.args[0]} (make figures)")
    if checker.errors:
        return None, checker.errors
    problem, rest = _split_first_section(body)
    problem_html, html = (nh3.clean(_markdown.render(part), url_schemes={"http", "https", "mailto"}) for part in (problem, rest))
    used = rendered.figures
    if relative:  # the rates it resolved came from the capacity's figures too
        used |= {name: figures[name] for name in CAPACITY_FIGURES if name in figures}
    charts = " ".join(CHARTS[name] for name in meta["charts"])  # a chart's title names what it plots
    page_text = body + charts + json.dumps({k: meta[k] for k in ("scenarios", "failure_modes", "decision")})
    return Lesson(path, meta, html, path.stat().st_mtime, problem_html, list(used.values()), used_in(page_text)), []


def _resolve(meta: dict[str, Any], body: str, values: dict[str, float]) -> str:
    """Rates written relative to capacity become this machine's numbers (web/sizing.py), and
    {{lever:KEY}} the value it names: a card's own inside the card, else the lesson's. The cards
    keep what was written under `relative`, for the page to show. Returns the body, filled."""
    defaults = {key: lever.default for key, lever in LEVERS.items()}
    model = fit(values) if _relative_levers(meta) else None
    lesson_levers = defaults | meta["levers"]
    if model is not None:
        meta["levers"] = resolve_rates(meta["levers"], lesson_levers, model)
        lesson_levers = defaults | meta["levers"]
    for kind in CARD_KINDS:
        for card in meta[kind]:
            written = {k: v for k, v in card["levers"].items() if relative_factor(v) is not None}
            merged = lesson_levers | card["levers"]
            if written and model is not None:
                card["levers"] = resolve_rates(card["levers"], merged, model)
                card["relative"] = written
                merged = lesson_levers | card["levers"]
                capacity = model.req_s(merged["prompt_tokens"], merged["output_tokens"])
                card["sized"] = [f"{key} {lever_text(key, card['levers'][key])}: {text.strip()} (about {capacity:.2f} "
                                 "req/s at these lengths, from the measured figures)" for key, text in written.items()]  # fmt: skip
            _fill(card, merged)
    for key in ("title", "summary", "decision", "at_scale"):
        if key in meta:
            meta[key] = _fill(meta[key], lesson_levers)
    return fill_levers(body, lesson_levers)


def _relative_levers(meta: dict[str, Any]) -> bool:
    """Whether any of the lesson's rates is written relative to capacity."""
    cards = [card for kind in CARD_KINDS for card in meta[kind]]
    return any(relative_factor(v) is not None for levers in [meta["levers"]] + [c["levers"] for c in cards] for v in levers.values())


def _fill(value: Any, levers: dict[str, Any]) -> Any:
    """Every string in a nested value with its {{lever:KEY}} marks filled, in place for containers."""
    if isinstance(value, str):
        return fill_levers(value, levers)
    if isinstance(value, dict):
        for key in value:
            value[key] = _fill(value[key], levers)
    elif isinstance(value, list):
        value[:] = [_fill(item, levers) for item in value]
    return value


def _split_first_section(body: str) -> tuple[str, str]:
    """The body's first `## ` section (the problem it poses) and the rest: a page puts the first
    beside the decision, above the experiment, and the rest below it."""
    starts = [m.start() for m in re.finditer(r"^## ", body, flags=re.MULTILINE)]
    if len(starts) < 2:
        return body, ""
    return body[: starts[1]], body[starts[1] :]


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
    # Where the course first names a metric it defines it: judged over the whole folder.
    errors += check_definitions(sorted(LESSONS_DIR.glob("[0-9][0-9]-*.md")))
    for err in errors:
        print(err)
    print(f"{len(paths)} lesson(s) checked, {len(errors)} mistake(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
