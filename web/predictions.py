"""Predict, observe, explain: every scenario and "Break it" card carries a `predict`, of two kinds.

- choice: `{question, options, answer, metric, settle_s}`; answer is an option's index or text.
- number: `{question, metric, tolerance, settle_s}`; the learner types a value in the metric's
  unit, and it is right when within +-tolerance (a fraction) of what the metric measured.

The page asks the question before it applies the card's levers, then after settle_s shows the
guess beside what the metric did (the mean of the last snapshots before the change and at the
end). An at-scale experiment's `predict: {question, options, answer}` is asked before it runs.
This module checks the fields for the lesson validator (web/lesson_checks.py) and hands the
choice cards to the classroom (web/classroom.py), whose students answer by option."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The snapshot keys a prediction may watch (engine/serving/telemetry/metrics.py's snapshot, the lab's
# additions), with the words a page shows beside the values.
PREDICT_METRICS = {
    "ttft_p50": "TTFT p50 (s)",
    "ttft_p99": "TTFT p99 (s)",
    "client_ttft_p50": "TTFT p50 at the clients' end of the stream (s)",
    "itl_p50": "ITL p50 (s)",
    "itl_p99": "ITL p99 (s)",
    "tpot_p50": "TPOT p50 (s)",
    "queue_time_p99": "queue time p99 (s)",
    "queue_depth": "queue depth",
    "running": "running requests",
    "waiting": "requests waiting inside the replicas",
    "tokens_per_s": "output tokens/s",
    "batch_size": "batch size",
    "kv_used_blocks": "KV blocks used",
    "kv_total_blocks": "KV blocks in all",
    "preempted": "preemptions (total)",
    "wasted_tokens_per_s": "wasted tokens/s",
    "replicas_ordered_total": "replicas ordered (total)",
    "prefix_hit_rate": "prefix-cache hit rate (share of prompt tokens found cached)",
    "spec_acceptance": "speculative guesses kept (share of guesses checked)",
    "spec_tokens_per_step": "tokens per step of a speculating decode",
}
SETTLE_S_DEFAULT = 20.0
SETTLE_S_RANGE = (5.0, 300.0)
TOLERANCE_RANGE = (0.05, 2.0)  # a numeric guess within +-5% .. +-200% of the measurement
CARD_KINDS = ("scenarios", "failure_modes")


@dataclass(frozen=True)
class PredictCard:
    """One card's prediction, its answer as an option index."""

    kind: str
    index: int
    title: str
    question: str
    options: list[str]  # empty for a number
    answer: int  # -1 for a number
    metric: str
    settle_s: float
    tolerance: float | None = None  # a number's, relative

    def view(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "index": self.index,
            "title": self.title,
            "metric": self.metric,
            "label": PREDICT_METRICS[self.metric],
            "settle_s": self.settle_s,
            "tolerance": self.tolerance,
        }


def answer_index(predict: dict[str, Any]) -> int | None:
    """`answer` may be the right option's index or its text."""
    options, answer = predict.get("options"), predict.get("answer")
    if not isinstance(options, list):
        return None
    if isinstance(answer, int) and not isinstance(answer, bool):
        return answer if 0 <= answer < len(options) else None
    return options.index(answer) if isinstance(answer, str) and answer in options else None


def _check_options(predict: dict[str, Any]) -> list[tuple[tuple, str]]:
    options = predict.get("options")
    if not isinstance(options, list) or len(options) < 2 or not all(isinstance(o, str) and o.strip() for o in options):
        return [(("options",), "predict needs at least two options, each a non-empty string")]
    if len(set(options)) != len(options):
        return [(("options",), "predict's options must differ from each other")]
    if answer_index(predict) is None:
        return [(("answer",), "predict's answer must be one of its options (its index or its text)")]
    return []


def _check_question(predict: dict[str, Any]) -> list[tuple[tuple, str]]:
    if not isinstance(predict.get("question"), str) or not predict["question"].strip():
        return [(("question",), "predict needs a non-empty question")]
    return []


def check_predict(predict: Any) -> list[tuple[tuple, str]]:
    """The mistakes in one card's `predict`, each as (key under predict, message)."""
    if not isinstance(predict, dict):
        return [((), "predict must be a mapping: question, options, answer and metric (or tolerance for a number)")]
    errors = _check_question(predict)
    numeric = "tolerance" in predict
    if numeric:
        tolerance, (low, high) = predict["tolerance"], TOLERANCE_RANGE
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not low <= tolerance <= high:
            errors.append((("tolerance",), f"tolerance must be a fraction from {low:g} to {high:g} (0.5: within 50%)"))
        for key in ("options", "answer"):
            if key in predict:
                errors.append(((key,), f"a numeric predict (it has a tolerance) takes no {key}: the learner types a number"))
    else:
        errors += _check_options(predict)
    metric = predict.get("metric")
    if metric not in PREDICT_METRICS:
        said = "predict needs a metric" if metric is None else f"unknown metric {metric!r}"
        errors.append((("metric",), f"{said}; a prediction watches one of {', '.join(PREDICT_METRICS)}"))
    settle = predict.get("settle_s", SETTLE_S_DEFAULT)
    low, high = SETTLE_S_RANGE
    if isinstance(settle, bool) or not isinstance(settle, (int, float)) or not low <= settle <= high:
        errors.append((("settle_s",), f"settle_s must be a number of seconds from {low:g} to {high:g}"))
    return errors  # an unknown key: web/lesson_schema.py's walk says so


def check_at_scale_predict(predict: Any) -> list[tuple[tuple, str]]:
    """An at-scale experiment's prediction: a question and options, one of them the answer."""
    if not isinstance(predict, dict):
        return [((), "predict must be a mapping of question, options and answer")]
    return _check_question(predict) + _check_options(predict)


def predict_cards(meta: dict[str, Any], numbers: bool = True) -> list[PredictCard]:
    """A lesson's cards that carry a prediction (validated), in page order; `numbers=False` leaves
    out the numeric ones (a classroom's students answer by option)."""
    found = []
    for kind in CARD_KINDS:
        for index, card in enumerate(meta.get(kind) or []):
            predict = card.get("predict") if isinstance(card, dict) else None
            if not isinstance(predict, dict) or check_predict(predict):
                continue
            numeric = "tolerance" in predict
            if numeric and not numbers:
                continue
            found.append(
                PredictCard(
                    kind,
                    index,
                    card["title"],
                    predict["question"],
                    [] if numeric else list(predict["options"]),
                    -1 if numeric else answer_index(predict) or 0,
                    predict["metric"],
                    float(predict.get("settle_s", SETTLE_S_DEFAULT)),
                    float(predict["tolerance"]) if numeric else None,
                )
            )
    return found
