"""The lesson validator's checks of a card's `predict` (web/predictions.py through web/lessons.py):
each mistake is reported at its line, and every card of every lesson carries a prediction."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.lesson_files import GOOD as GOOD_LESSON
from web.lessons import LESSONS_DIR, parse_lesson
from web.predictions import PREDICT_METRICS, check_predict, predict_cards

pytestmark = pytest.mark.unit

GOOD = {
    "question": "Halve max_num_seqs: what does the queue do?",
    "options": ["climbs", "falls"],
    "answer": 0,
    "metric": "queue_depth",
}


def lesson_with(tmp_path: Path, predict: str | None) -> Path:
    """The test lesson with its Break it card's prediction replaced (or removed, with None)."""
    text = GOOD_LESSON
    start = text.index("    predict: {question: \"What does TTFT do?\"")
    end = text.index("\n", start) + 1
    text = text[:start] + (predict or "") + text[end:]
    path = tmp_path / "02-queue.md"
    path.write_text(text)
    return path


def test_every_card_of_every_lesson_carries_a_valid_prediction() -> None:
    for path in sorted(LESSONS_DIR.glob("*.md")):
        lesson, errors = parse_lesson(path)
        assert lesson is not None, errors
        cards = predict_cards(lesson.meta)
        assert len(cards) == len(lesson.meta["scenarios"]) + len(lesson.meta["failure_modes"]), path.name
        for card in cards:
            assert card.metric in PREDICT_METRICS
            assert 0 <= card.answer < len(card.options) if card.tolerance is None else card.options == []


def test_a_card_without_a_prediction_is_refused(tmp_path: Path) -> None:
    lesson, errors = parse_lesson(lesson_with(tmp_path, None))
    assert lesson is None
    assert any("failure_modes[0] ('Unbounded queue') asks no prediction" in str(e) for e in errors), errors


@pytest.mark.parametrize(
    ("predict", "words"),
    [
        (
            "    predict: {question: 'Q?', options: [a, b], answer: c, metric: queue_depth}\n",
            "answer must be one of its options",
        ),
        (
            "    predict: {question: 'Q?', options: [a, b], answer: 2, metric: queue_depth}\n",
            "answer must be one of its options",
        ),
        ("    predict: {question: 'Q?', options: [a, b], answer: 0, metric: gpu_joy}\n", "unknown metric 'gpu_joy'"),
        ("    predict: {question: 'Q?', options: [a], answer: 0, metric: queue_depth}\n", "at least two options"),
        ("    predict: {options: [a, b], answer: 0, metric: queue_depth}\n", "non-empty question"),
        (
            "    predict: {question: 'Q?', options: [a, b], answer: 0, metric: queue_depth, settle_s: 1}\n",
            "settle_s must be",
        ),
        (
            "    predict: {question: 'Q?', options: [a, b], answer: 0, metric: queue_depth, hint: x}\n",
            "unknown key 'hint' in failure_modes[0]'s predict",
        ),
        ("    predict: 'rises'\n", "predict must be a mapping"),
    ],
)
def test_each_mistake_in_a_prediction_is_named_at_its_line(tmp_path: Path, predict: str, words: str) -> None:
    path = lesson_with(tmp_path, predict)
    lesson, errors = parse_lesson(path)
    assert lesson is None
    line = path.read_text().splitlines().index(predict.rstrip("\n")) + 1
    assert any(words in e.message and e.line == line for e in errors), (line, [str(e) for e in errors])


def test_a_number_is_scored_within_its_tolerance_and_the_classroom_gets_only_choices() -> None:
    number = {"question": "TTFT p50, in seconds?", "metric": "ttft_p50", "tolerance": 0.5}
    assert check_predict(number) == []
    meta = {"scenarios": [{"title": "n", "predict": number}, {"title": "c", "predict": GOOD}], "failure_modes": []}
    cards = predict_cards(meta)
    assert [(c.title, c.tolerance, c.options, c.answer) for c in cards] == [("n", 0.5, [], -1), ("c", None, ["climbs", "falls"], 0)]
    assert cards[0].view()["tolerance"] == 0.5
    assert [c.title for c in predict_cards(meta, numbers=False)] == ["c"]
    assert any("takes no options" in m for _, m in check_predict(number | {"options": ["a", "b"]}))


def test_the_answer_may_be_the_option_text_and_the_settle_time_defaults() -> None:
    assert check_predict(GOOD) == []
    assert check_predict(GOOD | {"answer": "falls"}) == []
    cards = predict_cards({"scenarios": [{"title": "t", "predict": GOOD | {"answer": "falls"}}], "failure_modes": []})
    assert cards[0].answer == 1 and cards[0].settle_s == 20.0 and cards[0].kind == "scenarios"
