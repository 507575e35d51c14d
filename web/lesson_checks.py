"""The rules a lesson's front matter and body keep (web/lessons.py parses; this judges).

Front matter: step, title, summary, levers, charts, scenarios, decision, failure_modes and
at_scale, each checked at its line. Beyond the shapes: every card (scenario and "Break it") asks a
prediction before it shows its result, at least one of a lesson's asks for a number, every
at-scale experiment asks one before it runs, the body ends with its sources, no lesson runs past
MAX_WORDS, and no machine-dependent number is written by hand (web/lesson_text.py)."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from engine.errors import InvalidParamError
from engine.levers import LEVERS
from web.failures import failures_for_step
from web.glossary import METRICS
from web.lesson_text import body_prose, mask, unmarked_numbers
from web.predictions import check_at_scale_predict, check_predict
from web.sizing import RELATIVE_LEVERS, relative_factor

FILE_NAME = re.compile(r"^(\d\d)-[a-z0-9-]+\.md$")
MAX_WORDS = 2300  # the whole file, front matter included, as `wc -w` counts
CARD_KINDS = ("scenarios", "failure_modes")
MAX_STEP = 99  # the file name's two digits
# Front-matter values that are prose a learner reads (the number rule applies to them).
PROSE_KEYS = {"title", "summary", "watch", "expect", "question", "options", "text", "why", "label"}
SOURCES = re.compile(r"^## Sources\s*$", re.MULTILINE)


@dataclass(frozen=True)
class LessonError:
    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class Checker:
    path: Path
    lines: dict[tuple, int]  # front-matter path -> 1-based file line
    charts: frozenset[str]
    errors: list[LessonError] = field(default_factory=list)

    def fail(self, where: tuple, message: str) -> None:
        while where and where not in self.lines:
            where = where[:-1]
        self.errors.append(LessonError(self.path, self.lines.get(where, 1), message))

    def fail_at(self, line: int, message: str) -> None:
        self.errors.append(LessonError(self.path, line, message))


def index_lines(node: yaml.Node | None, where: tuple, out: dict[tuple, int]) -> None:
    if node is None:
        return
    out[where] = node.start_mark.line + 2  # +1 for 1-based, +1 for the opening '---'
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            index_lines(value, (*where, key.value), out)
            out[(*where, key.value)] = key.start_mark.line + 2  # point at the key, not its value
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            index_lines(item, (*where, i), out)


def check_front(meta: Any, c: Checker) -> None:
    if not isinstance(meta, dict):
        c.fail((), "the front matter must be a mapping")
        return
    match = FILE_NAME.match(c.path.name)
    if not match:
        c.fail((), "the file name must be NN-slug.md")
    step = meta.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 1 <= step <= MAX_STEP:
        c.fail(("step",), f"step must be a whole number from 1 to {MAX_STEP}")
    elif match and int(match.group(1)) != step:
        c.fail(("step",), f"step {step} does not match the file name's {match.group(1)}")
    for key in ("title", "summary"):
        if not isinstance(meta.get(key), str) or not meta[key].strip():
            c.fail((key,), f"{key} must be a non-empty string")
    for key in ("finale", "plan"):
        if key in meta and not isinstance(meta[key], bool):
            c.fail((key,), f"{key} must be true or false")
    check_levers(meta.get("levers"), ("levers",), c, required=True)
    charts = meta.get("charts")
    if not isinstance(charts, list) or not charts:
        c.fail(("charts",), "charts must be a non-empty list")
    else:
        for i, chart in enumerate(charts):
            if chart not in c.charts:
                c.fail(("charts", i), f"unknown chart {chart!r}; charts are {', '.join(sorted(c.charts))}")
    _check_cards(meta.get("scenarios"), "scenarios", ("title", "watch"), c)
    _check_cards(meta.get("failure_modes"), "failure_modes", ("title", "expect"), c)
    if isinstance(step, int) and not isinstance(step, bool):
        _check_defence_cards(step, meta.get("failure_modes"), c)
    _check_decision(meta.get("decision"), c)
    cards = [card for kind in CARD_KINDS for card in meta.get(kind) or [] if isinstance(card, dict)]
    if cards and not any(isinstance(card.get("predict"), dict) and "tolerance" in card["predict"] for card in cards):
        c.fail(("scenarios",), "no card asks for a number: give at least one card a numeric predict "
                               "(question, metric, tolerance, no options)")  # fmt: skip
    if "at_scale" in meta:
        _check_at_scale(meta["at_scale"], c)


def check_levers(levers: Any, where: tuple, c: Checker, required: bool) -> None:
    if not isinstance(levers, dict) or (required and not levers):
        c.fail(where, "levers must be a mapping of lever keys to values")
        return
    for key, value in levers.items():
        if key not in LEVERS:
            continue  # an unknown key: web/lesson_schema.py's walk says so, with the nearest lever
        if isinstance(value, str) and key in RELATIVE_LEVERS:
            if relative_factor(value) is None:
                c.fail((*where, key), f"lever {key}: write a number or 'Nx capacity' (e.g. '2x capacity'), got {value!r}")
            continue  # resolved, then validated, once the figures are read (web/lessons.py)
        try:
            LEVERS[key].validate(value)
        except InvalidParamError as err:
            c.fail((*where, key), f"lever {err}")


def _check_cards(cards: Any, name: str, texts: tuple[str, ...], c: Checker) -> None:
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
        check_levers(card.get("levers"), (name, i, "levers"), c, required=True)
        if "predict" not in card:  # predict, observe, explain (web/predictions.py)
            c.fail((name, i), f"{name}[{i}] ({card.get('title')!r}) asks no prediction: every card asks one "
                              "before it shows its result (predict: question, options, answer, metric)")  # fmt: skip
            continue
        for where, message in check_predict(card["predict"]):
            c.fail((name, i, "predict", *where), f"{name}[{i}]: {message}")


def _check_defence_cards(step: int, cards: Any, c: Checker) -> None:
    """Each defence lever whose failure this step teaches (web/failures.py) is set by one of its
    "Break it" cards, so the lesson breaks what the gallery says it does."""
    if not isinstance(cards, list):
        return  # _check_cards has said so
    used = {key for card in cards if isinstance(card, dict) and isinstance(card.get("levers"), dict) for key in card["levers"]}
    for failure in failures_for_step(step):
        if failure.lever not in used:
            c.fail(("failure_modes",), f"no Break it card sets the defence lever {failure.lever!r} of step {step}")


def _check_decision(decision: Any, c: Checker) -> None:
    if not isinstance(decision, dict) or not isinstance(decision.get("question"), str):
        c.fail(("decision",), "decision needs a question and options")
        return
    options = decision.get("options")
    if not isinstance(options, list) or len(options) < 2:
        c.fail(("decision", "options"), "a decision needs at least two options")
        return
    correct = 0
    for i, option in enumerate(options):
        if not isinstance(option, dict) or not isinstance(option.get("text"), str) or not isinstance(option.get("why"), str):
            c.fail(("decision", "options", i), "each option needs text and why")
            continue
        if not isinstance(option.get("correct"), bool):
            c.fail(("decision", "options", i), "each option needs correct: true or false")
        correct += option.get("correct") is True
    if correct != 1:
        c.fail(("decision", "options"), f"exactly one option must be correct, found {correct}")


def _check_at_scale(runs: Any, c: Checker) -> None:
    """at_scale: a list of simulated experiments, each {title, watch, experiment (an A/B of
    engine/sim/compare.py: traffic, a, b, each side with a label), predict (asked before it runs),
    quotes (the figures the body quotes: side, key of the side's table row or summary, value),
    refusals (levers of a side the simulator refuses, and words of its reason)}. The quoted figures
    themselves are checked against fresh runs by tests/test_lesson_at_scale.py, not here (a page
    load runs no simulation)."""
    from engine.sim.compare import RESULT_KEYS, parse_experiment

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
        if "predict" not in run:
            c.fail(where, f"at_scale[{i}] asks no prediction: give it predict (question, options, answer), asked before it runs")
        else:
            for sub, message in check_at_scale_predict(run["predict"]):
                c.fail((*where, "predict", *sub), f"at_scale[{i}]: {message}")
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
            elif quote["key"] not in RESULT_KEYS:
                near = difflib.get_close_matches(quote["key"], RESULT_KEYS, n=1, cutoff=0.7)
                hint = f": did you mean {near[0]!r}?" if near else f"; a run's figures are {', '.join(RESULT_KEYS)}"
                c.fail((*where, "quotes", j, "key"), f"a run has no figure {quote['key']!r}{hint}")
        for j, refusal in enumerate(run.get("refusals") or []):
            if not isinstance(refusal, dict) or not isinstance(refusal.get("levers"), dict) or not isinstance(
                refusal.get("reason"), str
            ):
                c.fail((*where, "refusals", j), "a refusal needs levers (one side's) and words of the reason")


def quoted_values(meta: dict[str, Any]) -> set[str]:
    """The numbers of a lesson's simulated experiments as the text writes them: each quote's value
    (tests/test_lesson_at_scale.py checks it against a fresh run) and the traffic each experiment
    runs (a simulated fleet's rate is the experiment's design, not this machine's)."""
    runs = [run for run in meta.get("at_scale") or [] if isinstance(run, dict)]
    quotes = [q.get("value") for run in runs for q in run.get("quotes") or [] if isinstance(q, dict)]
    traffic = [v for run in runs for v in ((run.get("experiment") or {}).get("traffic") or {}).values()]
    return {f"{v:g}" for v in quotes + traffic if isinstance(v, (int, float)) and not isinstance(v, bool)}


def check_numbers(raw: str, front_end: int, allowed: set[str], c: Checker) -> None:
    """The number rule over the front matter's prose values and the body, each at its line."""
    masked = mask(raw)
    front = masked[4:front_end]
    try:
        root = yaml.compose(front, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        root = None  # the rendered text's own YAML error is reported instead
    for node in _prose_nodes(root):
        text = front[node.start_mark.index : node.end_mark.index]
        for offset, words in unmarked_numbers(text, allowed):
            c.fail_at(node.start_mark.line + 2 + text.count("\n", 0, offset), _number_message(words))
    body_start = front_end + 5
    body = mask(body_prose(raw[body_start:]))  # fences first: a fence's backticks are not a code span
    first_line = raw.count("\n", 0, body_start) + 1
    for offset, words in unmarked_numbers(body, allowed):
        c.fail_at(first_line + body.count("\n", 0, offset), _number_message(words))


def _number_message(words: str) -> str:
    return (f"{words!r} is a machine-dependent number written by hand: write it as {{{{fig:NAME}}}}, "
            "{{calc:EXPR|FMT}} or {{lever:KEY}}, or mark a constant or a published figure {{const:...}}")  # fmt: skip


def _prose_nodes(node: yaml.Node | None, key: str = "") -> list[yaml.ScalarNode]:
    if isinstance(node, yaml.MappingNode):
        return [n for k, v in node.value for n in _prose_nodes(v, k.value)]
    if isinstance(node, yaml.SequenceNode):
        return [n for item in node.value for n in _prose_nodes(item, key if key == "options" else "")]
    return [node] if isinstance(node, yaml.ScalarNode) and key in PROSE_KEYS else []


def check_body(raw: str, body: str, first_line: int, c: Checker) -> None:
    """The body (starting at file line `first_line`) ends with its sources, and the file stays
    readable in one sitting."""
    words = len(raw.split())
    if words > MAX_WORDS:
        c.fail_at(1, f"the lesson runs {words:,} words (front matter included); at most {MAX_WORDS:,}: split or cut it")
    sections = [m.start() for m in re.finditer(r"^## ", body, flags=re.MULTILINE)]
    found = SOURCES.search(body)
    if found is None:
        c.fail_at(first_line + body.rstrip().count("\n"), "the lesson ends with no '## Sources' section: list the papers, posts "
                                                 "and docs its claims come from")  # fmt: skip
    elif found.start() != sections[-1]:
        c.fail_at(first_line + body.count("\n", 0, found.start()), "'## Sources' must be the lesson's last section")
    elif not re.search(r"^\s*[-*] \S", body[found.end() :], flags=re.MULTILINE):
        c.fail_at(first_line + body.count("\n", 0, found.start()), "'## Sources' lists nothing: one source per '- ' line")


def check_definitions(paths: list[Path]) -> list[LessonError]:
    """Where the course (its lessons in file order, which is step order) first names a metric, it
    defines it: that lesson holds {{def:KEY}} and names the metric nowhere in its body before it.
    Every page also lists its metrics' definitions above its experiments (web/glossary.py)."""
    seen: set[str] = set()
    errors = []
    for path in sorted(paths, key=lambda p: p.name):
        raw = path.read_text(encoding="utf-8")
        end = raw.find("\n---\n", 4)
        if not raw.startswith("---\n") or end < 0:
            continue  # parse_lesson says so
        masked = mask(raw)
        try:
            root = yaml.compose(masked[4:end], Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            root = None
        front = " ".join(masked[4:end][n.start_mark.index : n.end_mark.index] for n in _prose_nodes(root))
        body_start = end + 5
        body = mask(body_prose(raw[body_start:]))
        for key, metric in METRICS.items():
            define = re.search(r"\{\{def:" + key + r"\}\}", raw)
            named = metric.mentions.search(body)
            if key in seen or not (define or named or metric.mentions.search(front)):
                continue
            seen.add(key)
            line = raw.count("\n", 0, body_start + named.start()) + 1 if named else 1
            if define is None:
                errors.append(LessonError(path, line, f"the course first names {metric.term} in this lesson: define it "
                                                      f"with {{{{def:{key}}}}} at its first mention"))  # fmt: skip
            elif named and body_start + named.start() < define.start():
                errors.append(LessonError(path, line, f"{metric.term} is named here before {{{{def:{key}}}}} defines it"))
    return errors
