"""A lesson's front matter read as YAML, with a syntax error said at the line an author must
fix, in words about the text rather than about the parser. PyYAML marks two places: where the
trouble was noticed (`problem_mark`) and where the construct it was reading began
(`context_mark`); which one is the author's line depends on the mistake."""

from __future__ import annotations

import re
from typing import Any

import yaml

# (words of PyYAML's problem, words of its context or "", use the context's line, what to tell the author)
_PLAIN = (
    ("expected ',' or ']'", "", True, ("a list opened with '[' here is not closed with ']' on its line; quote an "
     "item that holds ',' or ': '")),
    ("expected ',' or '}'", "", True, ("a mapping opened with '{' here is not closed with '}' on its line; quote a "
     "value that holds ',' or ': '")),
    ("mapping values are not allowed", "", False, ("a ': ' YAML did not expect: a key here must line up "
     "with the keys around it, and a value holding ': ' goes in quotes (\"...\")")),
    ("found unexpected end of stream", "quoted scalar", True, "a quote opened here is never closed"),
    ("could not find expected ':'", "", True, "this line is neither 'key: value' nor a '- ' list item (a ':' missing?)"),
    ("that cannot start any token", "", False, ("a character YAML cannot start a value with (a tab? YAML indents with "
     "spaces only; quote a value that starts with '@', '`', '%' or '|')")),
    ("expected <block end>", "", False, ("this line's indentation does not line up with the lines above it: the keys "
     "of one mapping, and the items of one list, start in the same column")),
    ("found duplicate anchor", "", False, "an anchor ('&name') is defined twice"),
    ("found undefined alias", "", False, "an alias ('*name') names no anchor: quote a value that starts with '*'"),
)  # fmt: skip


def yaml_problem(err: yaml.YAMLError, first_line: int = 2) -> tuple[int, str]:
    """(file line, words) for a syntax error in YAML that starts at file line `first_line`."""
    problem = str(getattr(err, "problem", "") or err)
    context = str(getattr(err, "context", "") or "")
    problem_mark = getattr(err, "problem_mark", None)
    context_mark = getattr(err, "context_mark", None)
    for words, context_words, at_context, message in _PLAIN:
        if words in problem and context_words in context:
            mark = context_mark if at_context and context_mark is not None else problem_mark
            return (mark.line if mark else 0) + first_line, f"YAML: {message}"
    mark = problem_mark or context_mark
    return (mark.line if mark else 0) + first_line, f"YAML cannot read this line: {problem}" + (f" ({context})" if context else "")


def _unclosed_quote(front: str, before_line: int) -> int | None:
    """The first line before `before_line` (0-based) whose double quotes do not pair up: a quoted
    value YAML let run on past its line until a later quote, where the parser then tripped."""
    for number, line in enumerate(front.split("\n")[:before_line]):
        if line.lstrip().startswith("#"):
            continue
        if len(re.findall(r'(?<!\\)"', line)) % 2:
            return number
    return None


def read_front(front: str) -> tuple[yaml.Node | None, Any, tuple[int, str] | None]:
    """The front matter's node tree (for lines and keys) and its value, or the syntax error."""
    try:
        return yaml.compose(front, Loader=yaml.SafeLoader), yaml.safe_load(front), None
    except yaml.YAMLError as err:
        line, message = yaml_problem(err)
        opened = _unclosed_quote(front, line - 2)
        if opened is not None:
            return None, None, (opened + 2, f"YAML: a quote opened here is not closed on its line, so the value ran on to line {line}")
        return None, None, (line, message)
