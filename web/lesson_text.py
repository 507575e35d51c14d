"""A lesson's placeholders, and the rule that no machine-dependent number is written by hand.

Placeholders (anywhere in a lesson: body, card texts, predictions, the decision):

    {{fig:NAME}} {{fig:NAME|bare}}   a measured figure (web/figures.py SPECS), with or without its unit
    {{calc:EXPR|FMT}}                 computed from the figures when the page loads: EXPR is figure names,
                                      numbers, + - * / ( ), min(), max(), floor() and capacity(P, O) (web/sizing.py);
                                      FMT is the decimals then the unit as it reads: `1 s`, `0x`, `2`
    {{lever:KEY}}                     a lever's value with its unit: a card's own inside a card, else the lesson's
    {{const:TEXT}}                    a number that is not this machine's (a design constant, a published
                                      figure, arithmetic on a published shape), written as TEXT
    {{def:KEY}}                       a metric's definition (web/glossary.py)

`unmarked_numbers` finds the rest: a number with a time, rate or throughput unit, or a ratio
("12x", "six times"), in prose, outside every placeholder and code span, that is not one of the
lesson's simulator quotes."""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.levers import LEVERS
from web.figures import SPECS, Figure
from web.glossary import METRICS
from web.sizing import CapacityModel, fit

# Any {{...}}: a known kind is rendered; anything else (a typo, `{{ fig:x }}`) is an error, never literal text.
ANY = re.compile(r"\{\{(.*?)\}\}")
KINDS = re.compile(r"^(fig|calc|lever|const|def):(.*)$", re.DOTALL)
FIG_ARG = re.compile(r"^([a-z0-9_]+)(\|bare)?$")
CALC_ARG = re.compile(r"^(.+)\|(\d)(.*)$", re.DOTALL)
# {{lever:KEY}} waits for the YAML (a card's levers are known only then) behind private-use marks,
# which YAML takes as ordinary characters wherever they stand.
LEVER_OPEN, LEVER_CLOSE = "\ue000", "\ue001"
LEVER_MARK = re.compile(LEVER_OPEN + r"([a-z_]+)" + LEVER_CLOSE)
NOT_MEASURED = "(not measured yet: make figures)"
UNKNOWN = ("unknown placeholder {!r}: write {{{{fig:NAME}}}}, {{{{calc:EXPR|FMT}}}}, {{{{lever:KEY}}}}, "
           "{{{{const:TEXT}}}} or {{{{def:METRIC}}}}, with no spaces inside the braces")  # fmt: skip


@dataclass
class Rendered:
    text: str
    figures: dict[str, Figure] = field(default_factory=dict)
    errors: list[tuple[int, str]] = field(default_factory=list)  # (1-based line, message)


def render(raw: str, figures: Mapping[str, Figure], body_start: int) -> Rendered:
    """Every placeholder but {{lever:...}} replaced (that one marked for `fill_levers`).
    `body_start` is the offset where the markdown body begins: a definition is bold there and
    plain in the front matter."""
    out = Rendered("")
    values = {name: fig.value for name, fig in figures.items()}

    def replace(match: re.Match[str]) -> str:
        line = raw.count("\n", 0, match.start()) + 1
        kind = KINDS.match(match.group(1))
        if kind is None:
            out.errors.append((line, UNKNOWN.format(match.group(0))))
            return match.group(0)
        name, arg = kind.groups()
        try:
            if name == "fig":
                return _figure(arg, figures, out.figures)
            if name == "calc":
                return _calc(arg, figures, values, out.figures)
            if name == "lever":
                if arg not in LEVERS:
                    raise ValueError(f"unknown lever {arg!r} in {{{{lever:...}}}}")
                return LEVER_OPEN + arg + LEVER_CLOSE
            if name == "const":
                if not arg.strip():
                    raise ValueError("{{const:...}} needs its text")
                return arg
            if arg not in METRICS:
                raise ValueError(f"unknown metric {arg!r} in {{{{def:...}}}}; metrics are {', '.join(METRICS)}")
            return METRICS[arg].inline(markdown=match.start() >= body_start)
        except ValueError as err:
            out.errors.append((line, str(err)))
            return match.group(0)

    out.text = ANY.sub(replace, raw)
    for stray in re.finditer(r"\{\{|\}\}", ANY.sub(lambda m: " " * len(m.group(0)), raw)):
        message = f"a placeholder's {stray.group(0)!r} has no partner: write {{{{kind:...}}}} on one line"
        out.errors.append((raw.count("\n", 0, stray.start()) + 1, message))
    return out


def _figure(arg: str, figures: Mapping[str, Figure], used: dict[str, Figure]) -> str:
    match = FIG_ARG.match(arg)
    if match is None or match.group(1) not in SPECS:
        raise ValueError(f"no measured figure named {arg.split('|')[0]!r} (web/figures.py SPECS)")
    figure = figures.get(match.group(1))
    if figure is None:
        return NOT_MEASURED
    used[figure.name] = figure
    return figure.text(bare=bool(match.group(2)))


def _calc(arg: str, figures: Mapping[str, Figure], values: Mapping[str, float], used: dict[str, Figure]) -> str:
    match = CALC_ARG.match(arg)
    if match is None:
        raise ValueError(f"{{{{calc:{arg}}}}} needs a format after '|': the decimals, then the unit ('1 s', '0x')")
    expr, digits, unit = match.group(1), int(match.group(2)), match.group(3)
    names = names_in(expr)
    missing = [n for n in names if n not in values and n in SPECS]
    if missing:
        return NOT_MEASURED
    value = evaluate(expr, values)
    used.update({n: figures[n] for n in names if n in figures})
    if "capacity" in expr:
        used.update({n: figures[n] for n in ("ramp_all_req_s", "decode_step_b64_ms", "prefill_2048_ms") if n in figures})
    return f"{value:,.{digits}f}{unit}"


FUNCTIONS = ("min", "max", "floor", "capacity")
_OPERATORS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
}  # fmt: skip


def names_in(expr: str) -> list[str]:
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"calc: cannot read {expr!r} ({err.msg})") from None
    return [node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id not in FUNCTIONS]


def evaluate(expr: str, values: Mapping[str, float]) -> float:
    """EXPR over the figures' values; ValueError for anything but + - * /, min, max, capacity and names."""
    model: list[CapacityModel] = []

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.Name):
            if node.id not in SPECS:
                raise ValueError(f"calc: no measured figure named {node.id!r}")
            return float(values[node.id])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ValueError("calc: division by zero")
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            args = [ev(a) for a in node.args]
            if node.func.id in ("min", "max") and len(args) >= 2:
                return (min if node.func.id == "min" else max)(args)
            if node.func.id == "floor" and len(args) == 1:  # a count the engine takes whole (blocks in a budget)
                return float(math.floor(args[0]))
            if node.func.id == "capacity" and len(args) == 2:
                if not model:
                    model.append(fit(values))
                return model[0].req_s(*args)
            raise ValueError(f"calc: {node.func.id}() takes one argument (floor), two (capacity) or two or more (min, max)")
        raise ValueError(f"calc: only numbers, figure names, + - * /, min, max, floor and capacity(P, O) ({ast.dump(node)[:40]})")

    try:
        return ev(ast.parse(expr.strip(), mode="eval"))
    except SyntaxError as err:
        raise ValueError(f"calc: cannot read {expr!r} ({err.msg})") from None
    except KeyError as err:
        raise ValueError(f"calc: capacity() needs the figure {err.args[0]}") from None


def lever_text(key: str, value: Any) -> str:
    """A lever's value as prose reads it: `3.38 req/s`, `225 tokens`, `on`."""
    lever = LEVERS[key]
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)):
        number = f"{round(float(value), 2):,g}" if not float(value).is_integer() else f"{int(value):,}"
        return f"{number} {lever.unit}".strip()
    return str(value)


def fill_levers(text: str, levers: Mapping[str, Any]) -> str:
    return LEVER_MARK.sub(lambda m: lever_text(m.group(1), levers.get(m.group(1), LEVERS[m.group(1)].default)), text)


# ---- the rule: no machine-dependent number by hand -------------------------------------------------------
_WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
          "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty", "thirty",
          "forty", "fifty", "sixty", "hundred", "thousand"]  # fmt: skip
_NUMBER = r"(?<![\w.,/-])(\d+(?:,\d{3})*(?:\.\d+)?|(?:" + "|".join(_WORDS) + r"))"
_SEP = r"(?:[\s\u00a0-]|&nbsp;)"
# A bare "s" counts only after a space ("3 s"): "429s" is a status code's plural, "ones" a word.
_TIME = r"(?:" + _SEP + r"?(?:ms|milliseconds?|µs|us|microseconds?|ns|secs?|seconds?|minutes?|mins?|hours?|hrs?)|\s+s)\b"
_NOUN = r"(?:(?:output\s+|new\s+|prompt\s+)?(?:tokens?|requests?|req|tok|streams?|arrivals?|clients?)\s+)?"
_RATE = (_SEP + r"?(?:tok(?:en)?s?/s|req(?:uest)?s?/s|/s\b|" + _NOUN + r"(?:per|a|each|every)\s+second\b|"
         r"[KMGTP]i?B/s|[KMGTP]?FLOP/?s\b|[KMGTP]?FLOPS\b)")  # fmt: skip
UNMARKED = re.compile(_NUMBER + r"(?:" + _TIME + "|" + _RATE + r"|(?<=\d)x(?![\w])|\s+times\b)", re.IGNORECASE)
CODE_SPAN = re.compile(r"(?<!`)`[^`\n]+`(?!`)")


def mask(text: str) -> str:
    """The text with every placeholder and code span blanked to the same length (so offsets and
    lines hold), for the number rule and for reading the front matter's structure."""
    def blank(match: re.Match[str]) -> str:
        return "\ue002" * len(match.group(0))

    return CODE_SPAN.sub(blank, ANY.sub(blank, text))


def unmarked_numbers(prose: str, allowed: set[str]) -> list[tuple[int, str]]:
    """(offset, the words) of each hand-written machine-dependent number in already masked prose;
    `allowed` holds the lesson's simulator quotes as `f"{value:g}"`."""
    found = []
    for match in UNMARKED.finditer(prose):
        if match.group(1).replace(",", "") in allowed:
            continue
        found.append((match.start(), match.group(0).strip()))
    return found


def body_prose(body: str) -> str:
    """The body with fenced code blocks blanked (they are commands, not prose)."""
    out, fenced = [], False
    for line in body.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append(" " * len(line))
        else:
            out.append(" " * len(line) if fenced else line)
    return "\n".join(out)
