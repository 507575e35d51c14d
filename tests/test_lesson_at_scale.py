"""Each lesson's "at scale" experiment: the commands its text names are the experiment's own
(engine/sim/compare.py command_for), rerunning them through the CLI's parsing gives the figures
the text quotes (within 2%), every quoted figure appears in the text, and each refusal the text
describes is the simulator's. So a change to the simulator cannot leave a lesson silently wrong."""

from __future__ import annotations

import pytest

from engine.errors import InvalidParamError
from engine.sim.compare import command_for, parse_experiment, spec_from_command, table_row
from engine.sim.run import simulate
from tests.support.lesson_files import GOOD, write
from web.lessons import LessonLibrary, parse_lesson

pytestmark = pytest.mark.unit

LESSONS = [lesson for lesson in LessonLibrary().lessons() if lesson.meta.get("at_scale")]
TOLERANCE = 0.02


def test_every_step_has_an_at_scale_experiment() -> None:
    assert [lesson.step for lesson in LESSONS] == [lesson.step for lesson in LessonLibrary().lessons()]


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: f"step{lesson.step}")
def test_the_quoted_figures_come_from_the_named_runs(lesson) -> None:
    text = lesson.path.read_text(encoding="utf-8")
    body = text[text.index("\n---\n", 4) :]
    for run in lesson.meta["at_scale"]:
        experiment = parse_experiment(run["experiment"])
        figures = {}
        for side in ("a", "b"):
            command = command_for(experiment.spec(side))
            assert command in body, f"step {lesson.step}: the text does not name side {side}'s run: {command}"
            spec = spec_from_command(command)
            result = simulate(spec)
            figures[side] = result | table_row(spec, result, getattr(experiment, side).gpu_hour_usd)
        for quote in run.get("quotes", []):
            measured, quoted = figures[quote["side"]][quote["key"]], quote["value"]
            assert measured == pytest.approx(quoted, rel=TOLERANCE), (lesson.step, run["title"], quote, measured)
            assert f"{quoted:g}" in body, f"step {lesson.step}: {quote} is not in the lesson text"
        for refusal in run.get("refusals", []):
            with pytest.raises(InvalidParamError) as err:
                parse_experiment({"a": refusal["levers"]})
            assert refusal["reason"] in err.value.message


AT_SCALE = """\
at_scale:
  - title: TP4 against TP8
    watch: The TTFT rows.
    predict: {question: "Which has the lower TTFT p99?", options: [TP4, TP8], answer: 1}
    experiment:
      traffic: {request_rate: 20.0}
      a: {label: TP4, model: llama-3.1-70b, gpu_count: 8, tensor_parallel: 4}
      b: {label: TP8, model: llama-3.1-70b, gpu_count: 8, tensor_parallel: 8}
    quotes:
      - {side: a, key: ttft_p99_s, value: 0.8}
"""


@pytest.mark.parametrize(
    ("change", "words", "offset"),
    [
        (("tensor_parallel: 8}", "tensor_parallel: 3}"), "b.tensor_parallel", 7),  # not a TP degree
        (("gpu_count: 8, tensor_parallel: 4", "gpu_count: 1, tensor_parallel: 1"), "141 GB", 6),  # does not fit
        (("{label: TP8, ", "{"), "side b needs a label", 7),
        (("side: a, key", "side: c, key"), "a quote needs side", 9),
        (("options: [TP4, TP8], answer: 1", "options: [TP4, TP8], answer: 2"), "answer must be one of its options", 3),
        (("watch: The TTFT rows.", "watch: ''"), "needs a non-empty watch", 2),
    ],
)
def test_a_bad_at_scale_experiment_points_at_its_line(tmp_path, change, words, offset) -> None:
    text = GOOD
    end = text.index("\n---\n", 4)
    first_line = text[:end].count("\n") + 2  # the at_scale: line, after the front matter so far
    path = write(tmp_path, text[: end + 1] + AT_SCALE.replace(*change) + text[end + 1 :])
    lesson, errors = parse_lesson(path)
    assert lesson is None and any(words in e.message for e in errors), errors
    assert any(e.line == first_line + offset for e in errors if words in e.message), (errors, first_line + offset)


def test_a_good_at_scale_experiment_loads(tmp_path) -> None:
    end = GOOD.index("\n---\n", 4)
    lesson, errors = parse_lesson(write(tmp_path, GOOD[: end + 1] + AT_SCALE + GOOD[end + 1 :]))
    assert errors == [] and lesson is not None and lesson.meta["at_scale"][0]["experiment"]["b"]["label"] == "TP8"
