"""Prometheus text exposition (format 0.0.4, what vLLM, SGLang and ServeLab serve at /metrics):
parsed into samples, and histogram quantiles computed from cumulative buckets the way
Prometheus's histogram_quantile does.

A small parser of our own: prometheus_client is not among this project's dependencies, and the
text format is a few rules (RFC-like spec: https://prometheus.io/docs/instrumenting/exposition_formats/):
`# HELP` / `# TYPE` comments, then `name{label="value",...} value [timestamp]` lines, label
values escaping `\\`, `\"` and `\n`. A malformed line raises PrometheusParseError naming its
line number, so a server that is not speaking Prometheus is reported as such."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|(?=}))')
ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class PrometheusParseError(ValueError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Exposition:
    """One scrape: every sample in order, and the types the `# TYPE` lines declared."""

    samples: list[Sample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)

    def names(self) -> set[str]:
        return {s.name for s in self.samples}

    def series(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name]


def parse(text: str) -> Exposition:
    out = Exposition()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                out.types[parts[2]] = parts[3].strip()
            continue
        out.samples.append(_sample(line, number))
    return out


def _sample(line: str, number: int) -> Sample:
    match = NAME.match(line)
    if match is None:
        raise PrometheusParseError(number, f"expected a metric name, got {line[:60]!r}")
    name, rest = match.group(), line[match.end() :]
    labels: dict[str, str] = {}
    if rest.startswith("{"):
        rest = rest[1:]
        while not rest.lstrip().startswith("}"):
            pair = LABEL.match(rest)
            if pair is None:
                raise PrometheusParseError(number, f"bad label set in {line[:80]!r}")
            labels[pair.group(1)] = re.sub(r"\\[\\\"n]", lambda m: ESCAPES[m.group()], pair.group(2))
            rest = rest[pair.end() :]
        rest = rest.lstrip()[1:]
    fields = rest.split()
    if not fields or len(fields) > 2:
        raise PrometheusParseError(number, f"expected `value [timestamp]` after {name}, got {rest.strip()!r}")
    try:
        value = float(fields[0])  # float() reads +Inf, -Inf and NaN as the format writes them
    except ValueError:
        raise PrometheusParseError(number, f"{name}: {fields[0]!r} is not a number") from None
    return Sample(name, labels, value)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile (0..1) of a histogram given as (upper bound, cumulative count) pairs with
    +Inf last, interpolated linearly inside the bucket the rank falls in, as Prometheus does:
    the first bucket's lower bound is 0 (when its upper bound is positive), and a rank in the
    +Inf bucket answers the highest finite bound. None when the histogram is empty."""
    ordered = sorted(buckets)
    if not ordered or not math.isinf(ordered[-1][0]):
        return None
    total = ordered[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound if len(ordered) > 1 else None
            if lower_count == 0 and bound <= 0:
                return bound
            in_bucket = count - lower_count
            if in_bucket <= 0:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / in_bucket
        lower_bound, lower_count = bound, count
    return None
