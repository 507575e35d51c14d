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
from markdown_it import MarkdownIt

from engine.levers import LEVERS
from web.charts import CHARTS, OWN_ENGINE_CHARTS, TRACE_CHARTS  # noqa: F401 - the pages import them from here
from web.figures import Figure, FigureBook, provenance
from web.glossary import Metric, used_in
from web.lesson_checks import (
    CARD_KINDS,
    FILE_NAME,
    Checker,
    LessonError,
    check_body,
    check_definitions,
    check_front,
    check_numbers,
    index_lines,
    quoted_values,
)
from web.lesson_reference import new_lesson, reference
from web.lesson_schema import check_keys
from web.lesson_text import fill_levers, lever_text, render
from web.lesson_yaml import read_front
from web.sizing import NEEDS as CAPACITY_FIGURES
from web.sizing import fit, relative_factor, resolve_rates

LESSONS_DIR = Path(__file__).resolve().parent.parent / "lessons"
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
    """The lesson, or every mistake in it (one run finds them all), in line order."""
    raw = path.read_text(encoding="utf-8")
    if not raw.startswith("---\n"):
        return None, [LessonError(path, 1, "a lesson starts with '---' and YAML front matter")]
    front_end = raw.find("\n---\n", 4)
    if front_end < 0:
        return None, [LessonError(path, 1, "the front matter has no closing '---'")]
    book = book or FigureBook()
    figures = book.figures()
    rendered = render(raw, figures, front_end + 5)
    text = rendered.text
    end = text.find("\n---\n", 4)
    front, body = text[4:end], text[end + 5 :]
    node, meta, problem = read_front(front)
    lines: dict[tuple, int] = {}
    index_lines(node, (), lines)
    checker = Checker(path, lines, frozenset(CHARTS))
    checker.errors += [LessonError(path, line, message) for line, message in rendered.errors]
    if problem is not None:
        checker.fail_at(*problem)
    else:
        checker.errors += [LessonError(path, p.line, p.message) for p in check_keys(node)]
        check_front(meta, checker)
    check_body(raw, body, raw.count("\n", 0, front_end + 5) + 1, checker)
    if isinstance(meta, dict):
        check_numbers(raw, front_end, quoted_values(meta), checker)
    relative = not checker.errors and _relative_levers(meta)
    if not checker.errors:
        try:
            body = _resolve(meta, body, {name: fig.value for name, fig in figures.items()}, relative)
        except KeyError as err:
            checker.fail(("levers",), f"a rate relative to capacity needs the measured figure {err.args[0]} (make figures)")
    if checker.errors:
        return None, sorted(checker.errors, key=lambda e: e.line)
    problem_text, rest = _split_first_section(body)
    problem_html, html = render_markdown(problem_text), render_markdown(rest)
    used = rendered.figures
    if relative:  # the rates it resolved came from the capacity's figures too
        used |= {name: figures[name] for name in CAPACITY_FIGURES if name in figures}
    charts = " ".join(CHARTS[name] for name in meta["charts"])  # a chart's title names what it plots
    page_text = body + charts + json.dumps({k: meta[k] for k in ("scenarios", "failure_modes", "decision")})
    return Lesson(path, meta, html, path.stat().st_mtime, problem_html, list(used.values()), used_in(page_text)), []


def render_markdown(text: str) -> str:
    """Markdown as sanitised HTML: raw tags come out as text, and only http(s) and mailto links."""
    return nh3.clean(_markdown.render(text), url_schemes={"http", "https", "mailto"})


def _resolve(meta: dict[str, Any], body: str, values: dict[str, float], relative: bool) -> str:
    """Rates written relative to capacity become this machine's numbers (web/sizing.py), and
    {{lever:KEY}} the value it names: a card's own inside the card, else the lesson's. The cards
    keep what was written under `relative`, for the page to show. Returns the body, filled."""
    defaults = {key: lever.default for key, lever in LEVERS.items()}
    model = fit(values) if relative else None
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


def step_of(path: Path) -> int | None:
    """The step a lesson file claims by its name (NN-slug.md), read without parsing it."""
    match = FILE_NAME.match(path.name)
    return int(match.group(1)) if match else None


def check_together(lessons: list[Lesson]) -> list[LessonError]:
    """What no one file can say: two lessons with one step, more than one finale."""
    errors, first = [], {}
    for lesson in lessons:
        if lesson.step in first:
            errors.append(LessonError(lesson.path, 2, f"step {lesson.step} is also {first[lesson.step].name}'s: "
                                                      "give each lesson its own step number"))  # fmt: skip
        else:
            first[lesson.step] = lesson.path
    finales = [lesson for lesson in lessons if lesson.meta.get("finale")]
    errors += [LessonError(lesson.path, 2, f"finale: true here and in {finales[0].path.name}: a course has one finale")
               for lesson in finales[1:]]  # fmt: skip
    return errors


@dataclass(frozen=True)
class BrokenLesson:
    """A lesson file with mistakes: the page at its step shows them, with their lines."""

    path: Path
    step: int | None
    errors: list[LessonError]


class LessonLibrary:
    """The lessons of a folder, re-read whenever a file changes. A file with mistakes is held
    aside (`broken`), so the other pages serve on while its author reads what to fix."""

    def __init__(self, folder: Path = LESSONS_DIR, book: FigureBook | None = None) -> None:
        self.folder = folder
        self.book = book or FigureBook()
        self._cache: dict[Path, tuple[tuple, Lesson | BrokenLesson]] = {}

    def _read(self) -> list[Lesson | BrokenLesson]:
        found: list[Lesson | BrokenLesson] = []
        for path in sorted(self.folder.glob("[0-9][0-9]-*.md")):
            stamp = (path.stat().st_mtime, self.book.stamp())  # a fresh measurement re-renders it
            cached = self._cache.get(path)
            if cached is None or cached[0] != stamp:
                lesson, errors = parse_lesson(path, self.book)
                self._cache[path] = cached = (stamp, lesson or BrokenLesson(path, step_of(path), errors))
            found.append(cached[1])
        good = [item for item in found if isinstance(item, Lesson)]
        clashes = {err.path: err for err in check_together(good)}
        return [BrokenLesson(item.path, item.step, [clashes[item.path]]) if item.path in clashes else item
                for item in found]  # fmt: skip

    def lessons(self) -> list[Lesson]:
        """The valid lessons, in step order."""
        return sorted((item for item in self._read() if isinstance(item, Lesson)), key=lambda lesson: lesson.step)

    def broken(self) -> list[BrokenLesson]:
        return [item for item in self._read() if isinstance(item, BrokenLesson)]

    def step(self, number: int) -> Lesson | None:
        return next((lesson for lesson in self.lessons() if lesson.step == number), None)

    def broken_step(self, number: int) -> BrokenLesson | None:
        return next((item for item in self.broken() if item.step == number), None)


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else ""
    if command == "schema" and len(argv) == 2:
        print(reference(), end="")
        return 0
    if command == "new" and len(argv) == 3:
        return new_lesson(LESSONS_DIR, argv[2])
    if command != "check":
        print('usage: python -m web.lessons check [FILE ...] | schema | new "Title"', file=sys.stderr)
        return 2
    paths = [Path(p).resolve() for p in argv[2:]] or sorted(LESSONS_DIR.glob("*.md"))
    errors = [err for path in paths for err in parse_lesson(path)[1]]
    for folder in dict.fromkeys(path.parent for path in paths):
        # Two files with one step, two finales: said whichever of the two was named.
        errors += [err for item in LessonLibrary(folder).broken() for err in item.errors if err not in errors]
        # Where the course first names a metric it defines it: judged over the whole folder.
        errors += check_definitions(sorted(folder.glob("[0-9][0-9]-*.md")))
    for err in errors:
        print(err)
    print(f"{len(paths)} lesson(s) checked, {len(errors)} mistake(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
