"""What a lesson file may hold: every key of its front matter, card, prediction, decision and
at-scale experiment, with its type and meaning. One table, read two ways: the validator walks a
lesson's YAML against it (an unknown or misspelt key, or a key given twice, is an error at its
line: `check_keys`), and `python -m web.lessons schema` prints it as the authors' reference
(web/lesson_reference.py), so the reference cannot say what the validator does not check."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import yaml


@dataclass(frozen=True)
class Key:
    name: str
    kind: str  # as the reference writes the type: "text", "whole number", "list of <shape>", ...
    meaning: str
    required: bool = False
    shape: str = ""  # the Shape (by name) of a mapping, or of each item of a list


@dataclass(frozen=True)
class Shape:
    """A mapping's keys. An open shape's keys come from a table elsewhere (levers, the
    simulator's traffic and side fields): `open_keys` lists them, `open_kind` says what they are."""

    name: str
    title: str
    keys: tuple[Key, ...] = ()
    open_keys: Callable[[], Iterable[str]] | None = None
    open_kind: str = ""

    def known(self) -> list[str]:
        return [k.name for k in self.keys] + (list(self.open_keys()) if self.open_keys else [])

    def key(self, name: str) -> Key | None:
        return next((k for k in self.keys if k.name == name), None)


def _levers() -> Iterable[str]:
    from engine.levers import LEVERS

    return LEVERS


def _traffic() -> Iterable[str]:
    from engine.sim.compare import TRAFFIC_FIELDS

    return TRAFFIC_FIELDS


def _side() -> Iterable[str]:
    from engine.sim.compare import SIDE_FIELDS

    return ["label", "gpu_hour_usd", *SIDE_FIELDS]


_CARD_COMMON = (
    Key("title", "text", "the card's name, on its button", True),
    Key("levers", "mapping of lever to value", "what the card sets, over the lesson's levers; a rate may be "
        "written relative to capacity ('2x capacity')", True, "levers"),
)  # fmt: skip
_PREDICT = Key("predict", "mapping", "the prediction the learner makes before the card's levers apply", True, "predict")

SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("lesson", "The front matter", (
        Key("step", "whole number", "the step's number: its page is /steps/N, steps are listed in this order, and "
            "the file name starts with it (09-share-the-prefix.md); no two lessons share one", True),
        Key("title", "text", "the page's heading", True),
        Key("summary", "text", "one or two sentences under the heading and on the index", True),
        Key("finale", "true or false", "this lesson is the finale: its page carries the flood (a ramp of the request "
            "rate); at most one lesson says true"),
        Key("plan", "true or false", "show the 'Plan this traffic at scale' panel under the experiments"),
        Key("levers", "mapping of lever to value", "the levers the page starts from, and the ones it shows", True, "levers"),
        Key("charts", "list of chart names", "the live charts the page draws, in order", True),
        Key("scenarios", "list of cards", "'Try these': experiments on the live engine", True, "scenario"),
        Key("failure_modes", "list of cards", "'Break it': each turns a defence off or pushes past a limit", True, "failure"),
        Key("decision", "mapping", "the design question the lesson answers, with options and why each fails or works",
            True, "decision"),
        Key("at_scale", "list of experiments", "simulated A/B runs of the same idea on production models and GPUs",
            False, "at_scale"),
    )),
    Shape("scenario", "A 'Try these' card (each item of scenarios)", (
        *_CARD_COMMON,
        Key("watch", "text", "what to watch once the levers apply (shown after the prediction)", True),
        _PREDICT,
    )),
    Shape("failure", "A 'Break it' card (each item of failure_modes)", (
        *_CARD_COMMON,
        Key("expect", "text", "what goes wrong and which chart shows it (shown after the prediction)", True),
        _PREDICT,
    )),
    Shape("predict", "A card's predict: a choice (options and answer) or a number (tolerance)", (
        Key("question", "text", "asked before the levers apply", True),
        Key("options", "list of text", "a choice's answers, at least two, all different"),
        Key("answer", "whole number or text", "the right option: its index from 0, or its text"),
        Key("metric", "metric name", "the measurement that settles it: the page shows its mean before the change "
            "and after settle_s", True),
        Key("settle_s", "number of seconds", "how long the engine runs before the result shows (5 to 300; 20 if left out)"),
        Key("tolerance", "fraction", "makes it a number to type: right within plus or minus this share of the "
            "measurement (0.05 to 2); a numeric predict has no options or answer"),
    )),
    Shape("decision", "The decision", (
        Key("question", "text", "the design question", True),
        Key("options", "list of options", "at least two; exactly one correct", True, "option"),
    )),
    Shape("option", "A decision's option", (
        Key("text", "text", "the design choice", True),
        Key("correct", "true or false", "whether this is the choice the lesson argues for", True),
        Key("why", "text", "why it works, or the way it fails (the why-not)", True),
    )),
    Shape("at_scale", "An at-scale experiment (each item of at_scale)", (
        Key("title", "text", "the experiment's name", True),
        Key("watch", "text", "what to compare once it has run", True),
        Key("predict", "mapping", "asked before it runs", True, "at_scale_predict"),
        Key("experiment", "mapping", "the A/B: one traffic, two sides", True, "experiment"),
        Key("quotes", "list of quotes", "each figure of the run that the body quotes (checked against a fresh run)",
            False, "quote"),
        Key("refusals", "list of refusals", "levers of a side the simulator refuses, and words of its reason",
            False, "refusal"),
    )),
    Shape("at_scale_predict", "An at-scale experiment's predict", (
        Key("question", "text", "asked before it runs", True),
        Key("options", "list of text", "at least two, all different", True),
        Key("answer", "whole number or text", "the right option: its index from 0, or its text", True),
    )),
    Shape("experiment", "An experiment: the same seeded traffic through two configurations", (
        Key("preset", "preset name", "start from a named preset (engine/sim/presets.py), then override key by key"),
        Key("traffic", "mapping", "the requests both sides serve", False, "traffic"),
        Key("a", "mapping", "side a: a label and the simulator's settings", True, "side"),
        Key("b", "mapping", "side b: a label and the simulator's settings", True, "side"),
    )),
    Shape("quote", "A quote: a figure of one side's run that the body writes", (
        Key("side", "a or b", "whose run", True),
        Key("key", "result key", "which figure of the run", True),
        Key("value", "number", "as the body writes it (a fresh run must agree within 2%)", True),
    )),
    Shape("refusal", "A refusal: a side the simulator must refuse", (
        Key("levers", "mapping", "the side's settings", True),
        Key("reason", "text", "words of the simulator's reason", True),
    )),
    Shape("levers", "Levers", open_keys=_levers, open_kind="lever"),
    Shape("traffic", "An experiment's traffic", open_keys=_traffic, open_kind="traffic key"),
    Shape("side", "An experiment's side", open_keys=_side, open_kind="side key"),
)}  # fmt: skip


@dataclass(frozen=True)
class KeyProblem:
    line: int
    message: str


def check_keys(node: yaml.Node | None, shape: str = "lesson", where: str = "the front matter") -> list[KeyProblem]:
    """Every key the table does not know, and every key given twice, anywhere under `node` (the
    composed front matter), each at its line (1-based in the file: the front matter starts on line
    2). Types and values are the validator's other rules (web/lesson_checks.py)."""
    errors: list[KeyProblem] = []
    _walk(node, SHAPES[shape], where, errors)
    return errors


def _walk(node: yaml.Node | None, shape: Shape, where: str, errors: list[KeyProblem]) -> None:
    if not isinstance(node, yaml.MappingNode):
        return  # the type rules say what it should be
    known, seen = shape.known(), {}
    for key_node, value in node.value:
        name, line = key_node.value, key_node.start_mark.line + 2
        if name in seen:
            errors.append(KeyProblem(line, f"{name!r} is given twice in {where} (first at line {seen[name]}): YAML keeps "
                                          "only the last, so say it once"))  # fmt: skip
            continue
        seen[name] = line
        if name not in known:
            errors.append(KeyProblem(line, _unknown(name, shape, where)))
            continue
        key = shape.key(name)
        if key is None or not key.shape:
            continue
        inner = SHAPES[key.shape]
        label = f"{name}" if where == "the front matter" else f"{where}'s {name}"
        if isinstance(value, yaml.SequenceNode):
            for i, item in enumerate(value.value):
                _walk(item, inner, f"{name}[{i}]" if where == "the front matter" else f"{where}'s {name}[{i}]", errors)
        else:
            _walk(value, inner, label, errors)


def _unknown(name: str, shape: Shape, where: str) -> str:
    what = shape.open_kind or "key"
    near = difflib.get_close_matches(str(name), shape.known(), n=1, cutoff=0.75)
    hint = f": did you mean {near[0]!r}?" if near else (
        f"; {where} takes {', '.join(shape.known())}" if not shape.open_keys else " (python -m web.lessons schema lists them)")
    return f"unknown {what} {name!r} in {where}{hint}"
