"""Predict, observe, explain: a scenario or "Break it" card may carry `predict: {question,
options, answer, metric, settle_s}`. The page asks the question before it applies the card's
levers, then after settle_s shows the guess beside what the metric did (the mean of the last
snapshots before the change and at the end). This module checks the field for the lesson
validator (web/lessons.py) and hands the cards to the classroom (web/classroom.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The snapshot keys a prediction may watch (engine/serving/telemetry/metrics.py's snapshot, the lab's
# additions), with the words a page shows beside the values.
PREDICT_METRICS = {
    "ttft_p50": "TTFT p50 (s)",
    "ttft_p99": "TTFT p99 (s)",
    "itl_p50": "ITL p50 (s)",
    "itl_p99": "ITL p99 (s)",
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
}
SETTLE_S_DEFAULT = 20.0
SETTLE_S_RANGE = (5.0, 300.0)
CARD_KINDS = ("scenarios", "failure_modes")


@dataclass(frozen=True)
class PredictCard:
    """One card's prediction, its answer as an option index."""

    kind: str
    index: int
    title: str
    question: str
    options: list[str]
    answer: int
    metric: str
    settle_s: float

    def view(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "index": self.index,
            "title": self.title,
            "metric": self.metric,
            "label": PREDICT_METRICS[self.metric],
            "settle_s": self.settle_s,
        }


def answer_index(predict: dict[str, Any]) -> int | None:
    """`answer` may be the right option's index or its text."""
    options, answer = predict.get("options"), predict.get("answer")
    if not isinstance(options, list):
        return None
    if isinstance(answer, int) and not isinstance(answer, bool):
        return answer if 0 <= answer < len(options) else None
    return options.index(answer) if isinstance(answer, str) and answer in options else None


def check_predict(predict: Any) -> list[tuple[tuple, str]]:
    """The mistakes in one card's `predict`, each as (key under predict, message)."""
    if not isinstance(predict, dict):
        return [((), "predict must be a mapping of question, options, answer and metric")]
    errors: list[tuple[tuple, str]] = []
    if not isinstance(predict.get("question"), str) or not predict["question"].strip():
        errors.append((("question",), "predict needs a non-empty question"))
    options = predict.get("options")
    if not isinstance(options, list) or len(options) < 2 or not all(isinstance(o, str) and o.strip() for o in options):
        errors.append((("options",), "predict needs at least two options, each a non-empty string"))
    elif len(set(options)) != len(options):
        errors.append((("options",), "predict's options must differ from each other"))
    elif answer_index(predict) is None:
        errors.append((("answer",), "predict's answer must be one of its options (its index or its text)"))
    metric = predict.get("metric")
    if metric not in PREDICT_METRICS:
        errors.append(
            (("metric",), f"unknown metric {metric!r}; a prediction watches one of {', '.join(PREDICT_METRICS)}")
        )
    settle = predict.get("settle_s", SETTLE_S_DEFAULT)
    low, high = SETTLE_S_RANGE
    if isinstance(settle, bool) or not isinstance(settle, (int, float)) or not low <= settle <= high:
        errors.append((("settle_s",), f"settle_s must be a number of seconds from {low:g} to {high:g}"))
    for key in sorted(set(predict) - {"question", "options", "answer", "metric", "settle_s"}):
        errors.append(((key,), f"unknown field {key!r} in predict"))
    return errors


def predict_cards(meta: dict[str, Any]) -> list[PredictCard]:
    """A lesson's cards that carry a prediction (validated), in page order."""
    found = []
    for kind in CARD_KINDS:
        for index, card in enumerate(meta.get(kind) or []):
            predict = card.get("predict") if isinstance(card, dict) else None
            if isinstance(predict, dict) and not check_predict(predict):
                found.append(
                    PredictCard(
                        kind,
                        index,
                        card["title"],
                        predict["question"],
                        list(predict["options"]),
                        answer_index(predict) or 0,
                        predict["metric"],
                        float(predict.get("settle_s", SETTLE_S_DEFAULT)),
                    )
                )
    return found
