"""Issue 39's lesson rules, each failing on a planted mistake at the right line: no machine-dependent
number by hand (web/lesson_text.py), rates sized to the machine (web/sizing.py), a prediction
before every result and a number among them (web/predictions.py), metrics defined where the
course first names them (web/glossary.py), sources last, and a readable length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.lesson_files import GOOD, write
from web.figures import REFERENCE, FigureBook
from web.glossary import METRICS
from web.lesson_checks import MAX_WORDS, check_definitions
from web.lesson_text import evaluate, lever_text, unmarked_numbers
from web.lessons import LESSONS_DIR, LessonLibrary, main, parse_lesson
from web.sizing import fit, relative_factor

pytestmark = pytest.mark.unit

FIGURES = {name: fig.value for name, fig in FigureBook(REFERENCE, Path("/nonexistent")).figures().items()}
BODY_LINE = GOOD.count("\n", 0, GOOD.index("Body text")) + 1  # "Body text with **bold**."
WATCH_LINE = GOOD.count("\n", 0, GOOD.index("    watch: The queue_depth")) + 1


def errors_of(tmp_path: Path, text: str) -> list[tuple[int, str]]:
    lesson, errors = parse_lesson(write(tmp_path, text))
    assert (lesson is None) == bool(errors)
    return [(e.line, e.message) for e in errors]


def assert_flags(tmp_path: Path, text: str, line: int, words: str) -> None:
    found = errors_of(tmp_path, text)
    assert any(at == line and words in message for at, message in found), found


@pytest.mark.parametrize(
    ("written", "words"),
    [
        ("a 2,048-token prefill took about 790 ms", "790 ms"),
        ("about 2.6 s per answer", "2.6 s"),
        ("near 50 tok/s", "50 tok/s"),
        ("the queue grows 4 a second", "4 a second"),
        ("one request per second", "one request per second"),
        ("about six times what this machine can serve", "six times"),
        ("a 12x overload", "12x"),
        ("it waits two seconds", "two seconds"),
        ("3.35 TB/s of bandwidth", "3.35 TB/s"),
    ],
)
def test_a_hand_written_machine_number_is_flagged_at_its_line(tmp_path: Path, written: str, words: str) -> None:
    assert_flags(tmp_path, GOOD.replace("Body text with", f"Body text: {written}, with"), BODY_LINE, repr(words))
    assert_flags(tmp_path, GOOD.replace("fills, then drains.", f"fills, then drains; {written}."), WATCH_LINE, repr(words))


@pytest.mark.parametrize(
    "written",
    [
        "{{fig:decode_step_b1_ms}} a step",
        "{{calc:decode_step_b1_ms*128/1000|1 s}} an answer",
        "{{calc:20/ramp_all_req_s|0x}} what it serves",
        "the deadline of {{const:30 s}}",
        "`--rate 4 req/s` in a command",
        "HTTP 429s and the ones that wait",
        "a 2,048-token prompt of Llama-3-70B, 128 tokens out",
    ],
)
def test_placeholders_constants_and_code_pass(tmp_path: Path, written: str) -> None:
    assert errors_of(tmp_path, GOOD.replace("Body text with", f"Body text: {written}, with")) == []


def test_a_simulator_quote_and_its_experiments_rate_stay_literal(tmp_path: Path) -> None:
    at_scale = (
        "at_scale:\n  - title: TP4 against TP8 at 20 req/s\n    watch: TP8's TTFT p99 is 0.8 s.\n"
        "    predict: {question: 'Which is faster?', options: [TP4, TP8], answer: 1}\n"
        "    experiment:\n      traffic: {request_rate: 20.0}\n"
        "      a: {label: TP4, model: llama-3.1-70b, gpu_count: 8, tensor_parallel: 4}\n"
        "      b: {label: TP8, model: llama-3.1-70b, gpu_count: 8, tensor_parallel: 8}\n"
        "    quotes:\n      - {side: b, key: ttft_p99_s, value: 0.8}\n---\n"
    )
    text = GOOD.replace("---\n# The queue", at_scale + "# The queue")
    assert errors_of(tmp_path, text) == []
    assert_flags(tmp_path, text.replace("is 0.8 s", "is 0.9 s"), text.count("\n", 0, text.index("watch: TP8")) + 1, "'0.9 s'")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (("Body text with", "{{ fig:decode_step_b1_ms }} with"), "unknown placeholder"),
        (("Body text with", "{{fig:decode_step_b1_ms} with"), "has no partner"),
        (("Body text with", "{{fig:no_such_figure}} with"), "no measured figure named 'no_such_figure'"),
        (("Body text with", "{{calc:no_such*2|1 s}} with"), "no measured figure named 'no_such'"),
        (("Body text with", "{{calc:decode_step_b1_ms*2}} with"), "needs a format"),
        (("Body text with", "{{calc:__import__('os')|1}} with"), "calc:"),
        (("Body text with", "{{def:latency}} with"), "unknown metric 'latency'"),
        (("Body text with", "{{lever:warp}} with"), "unknown lever 'warp'"),
    ],
)
def test_a_broken_placeholder_is_refused_at_its_line(tmp_path: Path, change: tuple[str, str], words: str) -> None:
    assert_flags(tmp_path, GOOD.replace(*change), BODY_LINE, words)


def test_every_card_asks_a_prediction_and_one_asks_for_a_number(tmp_path: Path) -> None:
    no_predict = GOOD.replace('    predict: {question: "How deep does the queue get?", metric: queue_depth, tolerance: 0.5}\n', "")
    assert no_predict != GOOD
    line = GOOD.count("\n", 0, GOOD.index("  - title: A burst")) + 1
    assert_flags(tmp_path, no_predict, line, "scenarios[0] ('A burst') asks no prediction")
    choice = GOOD.replace("metric: queue_depth, tolerance: 0.5}", "options: [Rises, Falls], answer: 0, metric: queue_depth}")
    assert_flags(tmp_path, choice, GOOD.count("\n", 0, GOOD.index("scenarios:")) + 1, "no card asks for a number")
    both = GOOD.replace("tolerance: 0.5}", "tolerance: 0.5, options: [a, b]}")
    assert_flags(tmp_path, both, line + 3, "takes no options")
    wild = GOOD.replace("tolerance: 0.5}", "tolerance: 7}")
    assert_flags(tmp_path, wild, line + 3, "tolerance must be a fraction")


def test_an_at_scale_experiment_asks_before_it_runs(tmp_path: Path) -> None:
    at_scale = (
        "at_scale:\n  - title: TP4 against TP8\n    watch: The TTFT rows.\n"
        "    experiment:\n      traffic: {request_rate: 20.0}\n"
        "      a: {label: TP4, model: llama-3.1-70b, gpu_count: 8, tensor_parallel: 4}\n"
        "      b: {label: TP8, model: llama-3.1-70b, gpu_count: 8, tensor_parallel: 8}\n---\n"
    )
    text = GOOD.replace("---\n# The queue", at_scale + "# The queue")
    assert_flags(tmp_path, text, text.count("\n", 0, text.index("  - title: TP4")) + 1, "at_scale[0] asks no prediction")


def test_the_lesson_ends_with_its_sources_and_stays_short(tmp_path: Path) -> None:
    last = GOOD.rstrip().count("\n") + 1
    assert_flags(tmp_path, GOOD.replace("## Sources", "## Reading"), last, "no '## Sources' section")
    moved = GOOD + "\n## Afterword\n\nMore.\n"
    assert_flags(tmp_path, moved, GOOD.count("\n", 0, GOOD.index("## Sources")) + 1, "must be the lesson's last section")
    empty = GOOD.replace("- The serving guide's step 2.", "The guide.")
    assert_flags(tmp_path, empty, GOOD.count("\n", 0, GOOD.index("## Sources")) + 1, "lists nothing")
    long = GOOD.replace("Body text with **bold**.", "word " * MAX_WORDS)
    assert_flags(tmp_path, long, 1, f"at most {MAX_WORDS:,}")


def test_a_rate_relative_to_capacity_resolves_from_the_figures_and_names_itself(tmp_path: Path) -> None:
    text = GOOD.replace("  request_rate: 4.0", "  request_rate: 0.5x capacity").replace(
        "levers: {burstiness: 0.3}", "levers: {request_rate: 2x capacity, prompt_tokens: 2000, output_tokens: 64}"
    ).replace("fills, then drains.", "fills at {{lever:request_rate}}, then drains.")
    book = FigureBook(REFERENCE, Path("/nonexistent"))
    lesson, errors = parse_lesson(write(tmp_path, text), book)
    assert errors == []
    model = fit(FIGURES)
    card = lesson.meta["scenarios"][0]
    assert card["levers"]["request_rate"] == round(2 * model.req_s(2000, 64), 2)
    assert card["relative"] == {"request_rate": "2x capacity"}
    assert f"fills at {lever_text('request_rate', card['levers']['request_rate'])}, then" in card["watch"]
    assert lesson.meta["levers"]["request_rate"] == round(0.5 * model.req_s(200, 64), 2)  # the lever defaults' lengths
    assert {"ramp_all_req_s", "decode_step_b64_ms", "prefill_2048_ms"} <= {f.name for f in lesson.figures}
    line = text.count("\n", 0, text.index("levers: {request_rate: 2x")) + 1
    assert_flags(tmp_path, text.replace("2x capacity", "2 times capacity"), line, "write a number or 'Nx capacity'")


def test_the_capacity_model_meets_the_saturation_it_was_fitted_on() -> None:
    model = fit(FIGURES)
    # The engine bench's own shape (prompts uniform in 50-400, 128 out) gives the measured rate back.
    bench = sum(model.request_ms(p, 128, square_factor=1.0) for p in range(50, 401)) / 351
    assert 1000 / bench == pytest.approx(FIGURES["ramp_all_req_s"], rel=0.01)
    assert model.req_s(2000, 128) < model.req_s(200, 128) and model.req_s(200, 1000) < model.req_s(200, 128)
    assert evaluate("capacity(225, 128) * 2", FIGURES) == pytest.approx(2 * model.req_s(225, 128))
    assert relative_factor("1.5x capacity") == 1.5 and relative_factor("fast") is None


def test_a_metric_is_defined_where_the_course_first_names_it(tmp_path: Path) -> None:
    first = write(tmp_path, GOOD.replace("Body text with", "The TTFT climbs, with"), "02-first.md")
    later = write(tmp_path, GOOD.replace("step: 2", "step: 3").replace("Body text with", "TTFT again, with"), "03-later.md")
    found = [(e.path.name, e.line, e.message) for e in check_definitions([later, first])]
    message = "the course first names TTFT in this lesson: define it with {{def:ttft}} at its first mention"
    assert ("02-first.md", BODY_LINE, message) in found
    assert not any(name == "03-later.md" and "TTFT" in message for name, _, message in found)
    first.write_text(GOOD.replace("Body text with", "TTFT climbs; {{def:ttft}} with"))
    assert any("named here before {{def:ttft}}" in e.message for e in check_definitions([first]))
    first.write_text(GOOD.replace("Body text with", "{{def:ttft}}: it climbs, with"))
    assert not any("TTFT" in e.message for e in check_definitions([first, later]))
    lesson, _ = parse_lesson(first)
    assert "TTFT" in [m.term for m in lesson.metrics] and METRICS["ttft"].meaning in lesson.problem_html


def test_unmarked_numbers_reads_words_and_units() -> None:
    found = [words for _, words in unmarked_numbers("one request a second, 4.5 ms, 300 GB/s, 8x, in 2024, HTTP 429s", set())]
    assert found == ["one request a second", "4.5 ms", "300 GB/s", "8x"]


def test_the_shipped_lessons_keep_every_rule() -> None:
    """Every card of every step asks a prediction, each step asks at least one number, every
    at-scale experiment asks before it runs, and `python -m web.lessons check` is clean."""
    assert main(["lessons", "check"]) == 0
    for lesson in LessonLibrary().lessons():
        cards = lesson.meta["scenarios"] + lesson.meta["failure_modes"]
        assert all("predict" in card for card in cards), lesson.path.name
        assert any("tolerance" in card["predict"] for card in cards), lesson.path.name
        assert all("predict" in run for run in lesson.meta.get("at_scale", [])), lesson.path.name
        assert len(lesson.path.read_text().split()) <= MAX_WORDS, lesson.path.name
    assert json.loads(REFERENCE.read_text())["groups"]
    assert sorted(LESSONS_DIR.glob("[0-9][0-9]-*.md"))
