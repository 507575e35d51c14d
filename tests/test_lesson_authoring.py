"""Authoring a lesson in markdown alone (issue 41): every mistake an author makes is said at its
line, all of them in one run; steps come from the files (any number, a finale by front matter,
no two on one step); the reference is the validator's own tables; `new` writes a valid step."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.lesson_files import GOOD
from web.lesson_reference import new_lesson, reference
from web.lessons import LESSONS_DIR, LessonLibrary, main, parse_lesson

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent

# (what the author wrote instead, the line it is on in GOOD, words of the error)
MISTAKES = [
    (("    predict: {question: \"How deep", "    predcit: {question: \"How deep"), 13, "unknown key 'predcit' in scenarios[0]: did you mean 'predict'?"),
    (("metric: queue_depth, tolerance", "metrc: queue_depth, tolerance"), 13, "unknown key 'metrc' in scenarios[0]'s predict: did you mean 'metric'?"),
    (("      why: Capacity frees up", "      wy: Capacity frees up"), 19, "unknown key 'wy' in decision's options[0]: did you mean 'why'?"),
    (("  question: Traffic is spiky", "  qestion: Traffic is spiky"), 15, "unknown key 'qestion' in decision: did you mean 'question'?"),
    (("    expect: Everyone waits", "    expects: Everyone waits"), 26, "unknown key 'expects' in failure_modes[0]: did you mean 'expect'?"),
    (("step: 2\n", "step: 2\nsumary: x\n"), 3, "unknown key 'sumary' in the front matter: did you mean 'summary'?"),
    (("  queue_cap: 8\n", "  queue_cap: 8\n  queue_cap: 9\n"), 8, "'queue_cap' is given twice in levers (first at line 7)"),
    (("title: Put a queue in front\n", "title: Put a queue in front\ntitle: Again\n"), 4, "'title' is given twice in the front matter"),
    (("Body text with", "Body {{fig:kv_token_kb} text with"), 31, "'{{' has no partner"),
    (("Body text with", "Body {{ fig:kv_token_kb }} text with"), 31, "no spaces inside the braces"),
    (("Body text with", "Body {fig:kv_token_kb}} text with"), 31, "'}}' has no partner"),
    (("Body text with", "Body {{fig:no_such_figure}} text with"), 31, "no measured figure named 'no_such_figure'"),
    (("title: Put a queue in front", "title: Put a queue: in front"), 3, "a ': ' YAML did not expect"),
    (("title: Put a queue in front", "title: [Put a queue in front"), 3, "a list opened with '[' here is not closed"),
    (("title: Put a queue in front", 'title: "Put a queue in front'), 3, "a quote opened here is not closed on its line"),
    (("  queue_cap: 8", "\tqueue_cap: 8"), 7, "a tab?"),
    (("  queue_cap: 8", "  queue_cap 8"), 7, "neither 'key: value' nor a '- ' list item"),
    (("    watch: The queue_depth", "     watch: The queue_depth"), 12, "does not line up"),
]  # fmt: skip

AT_SCALE = """\
at_scale:
  - title: A bigger queue at scale
    watch: Compare TTFT.
    predict: {question: "Which side waits longer?", options: [a, b], answer: 0}
    experiment:
      traffic: {request_rate: 5.0, num_requests: 50}
      a: {label: small, model: llama-3.1-8b}
      b: {label: big, model: llama-3.1-8b, gpu_count: 2}
    quotes:
      - {side: a, key: ttft_p99_s, value: 1.0}
"""


def _write(tmp_path: Path, text: str, name: str = "02-queue.md") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("change", "line", "words"), MISTAKES, ids=[m[2][:40] for m in MISTAKES])
def test_each_mistake_is_said_at_its_line(tmp_path: Path, change: tuple[str, str], line: int, words: str) -> None:
    assert change[0] in GOOD, change
    lesson, errors = parse_lesson(_write(tmp_path, GOOD.replace(*change, 1)))
    assert lesson is None
    assert any(e.line == line and words in e.message for e in errors), [f"{e.line}: {e.message}" for e in errors]


def test_at_scale_keys_and_quote_keys_are_checked(tmp_path: Path) -> None:
    with_runs = GOOD.replace("failure_modes:", AT_SCALE + "failure_modes:", 1)
    assert parse_lesson(_write(tmp_path, with_runs))[1] == []
    for change, words in [
        (("key: ttft_p99_s", "key: ttft_p99"), "a run has no figure 'ttft_p99': did you mean 'ttft_p99_s'?"),
        (("    quotes:", "    quote:"), "unknown key 'quote' in at_scale[0]: did you mean 'quotes'?"),
        (("{request_rate: 5.0,", "{request_rat: 5.0,"), "unknown traffic key 'request_rat' in at_scale[0]'s experiment's traffic"),
        (("{label: big,", "{labl: big,"), "unknown side key 'labl' in at_scale[0]'s experiment's b: did you mean 'label'?"),
        (("answer: 0}\n    experiment", "anwser: 0}\n    experiment"), "unknown key 'anwser' in at_scale[0]'s predict"),
    ]:  # fmt: skip
        assert change[0] in with_runs, change
        errors = parse_lesson(_write(tmp_path, with_runs.replace(*change, 1)))[1]
        assert any(words in e.message for e in errors), (words, [str(e) for e in errors])


def test_every_mistake_of_a_file_is_said_in_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD
    for change, _line, _words in (MISTAKES[0], MISTAKES[2], MISTAKES[6], MISTAKES[8]):
        text = text.replace(*change, 1)
    path = _write(tmp_path, text)
    assert main(["lessons", "check", str(path)]) == 1
    out = capsys.readouterr().out
    for words in ("'predcit'", "'wy'", "given twice", "has no partner"):
        assert words in out, out
    # And a YAML error does not hide the body's mistakes.
    text = GOOD.replace("title: Put a queue in front", "title: [x", 1).replace("Body text", "Body {{fig:nope}} text")
    lines = {e.line for e in parse_lesson(_write(tmp_path, text))[1]}
    assert lines == {3, 31}


def test_steps_come_from_the_files(tmp_path: Path) -> None:
    """Any number of steps, in step order, with gaps; a step twice and two finales are errors, the
    clashing file held aside with its error while the others serve."""
    first = _write(tmp_path, GOOD.replace("step: 2", "step: 2\nfinale: true"), "02-queue.md")
    _write(tmp_path, GOOD.replace("step: 2", "step: 12").replace("Put a queue in front", "Twelve"), "12-twelve.md")
    library = LessonLibrary(tmp_path)
    assert [lesson.step for lesson in library.lessons()] == [2, 12] and not library.broken()
    _write(tmp_path, GOOD.replace("Put a queue in front", "Another queue"), "02-again.md")
    assert [lesson.step for lesson in library.lessons()] == [2, 12]
    [clash] = library.broken()
    assert clash.path.name == "02-queue.md" and clash.step == 2  # "02-again" sorts first and keeps the step
    assert "step 2 is also 02-again.md's" in clash.errors[0].message
    (tmp_path / "02-again.md").unlink()
    _write(tmp_path, GOOD.replace("step: 2", "step: 12\nfinale: true").replace("Put a queue in front", "Twelve"), "12-twelve.md")
    [two] = library.broken()
    assert two.step == 12 and f"and in {first.name}" in two.errors[0].message
    assert main(["lessons", "check", str(tmp_path / "12-twelve.md")]) == 1


def test_a_broken_file_leaves_the_others_serving(tmp_path: Path) -> None:
    _write(tmp_path, GOOD)
    _write(tmp_path, GOOD.replace("step: 2", "step: 3").replace("  queue_cap: 8", "  queue_kap: 8"), "03-broken.md")
    library = LessonLibrary(tmp_path)
    assert [lesson.step for lesson in library.lessons()] == [2]
    assert library.step(3) is None
    broken = library.broken_step(3)
    assert broken is not None and broken.errors[0].line == 7 and "queue_kap" in broken.errors[0].message


def test_new_writes_the_next_step_valid_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "lessons"
    shutil.copytree(LESSONS_DIR, folder)
    assert new_lesson(folder, "Share the load") == 0
    last = max(int(p.name[:2]) for p in LESSONS_DIR.glob("[0-9][0-9]-*.md"))
    path = folder / f"{last + 1:02d}-share-the-load.md"
    assert path.exists(), capsys.readouterr().out
    lesson, errors = parse_lesson(path)
    assert not errors, [str(e) for e in errors]
    assert lesson is not None and lesson.step == last + 1 and lesson.meta["title"] == "Share the load"
    assert main(["lessons", "check", str(path)]) == 0


def test_the_reference_is_the_validators_tables_and_is_kept_in_the_repository() -> None:
    text = reference()
    from engine.levers import LEVERS
    from web.charts import CHARTS
    from web.lesson_schema import SHAPES
    from web.predictions import PREDICT_METRICS

    for shape in SHAPES.values():
        for key in shape.keys:
            assert f"| `{key.name}` |" in text, (shape.name, key.name)
    for names in (LEVERS, CHARTS, PREDICT_METRICS):
        for name in names:
            assert f"`{name}`" in text, name
    assert (ROOT / "docs" / "AUTHORING.md").read_text(encoding="utf-8") == text, (
        "docs/AUTHORING.md is stale: python -m web.lessons schema > docs/AUTHORING.md"
    )
