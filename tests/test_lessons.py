"""Lesson files: the shipped ones are valid; broken ones are pointed at by file and line; bodies
are sanitised; edits are picked up."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.errors import InvalidParamError
from engine.lab.live_limits import check_live
from engine.levers import LEVERS, validate_levers
from tests.support.lesson_files import GOOD, write
from web.evolution import EVOLUTION
from web.failures import check_table, failures_for_step
from web.lessons import LESSONS_DIR, LessonLibrary, main, parse_lesson

pytestmark = pytest.mark.unit


def test_shipped_lessons_are_valid_and_each_has_its_own_step() -> None:
    files = sorted(LESSONS_DIR.glob("*.md"))
    for path in files:
        _lesson, errors = parse_lesson(path)
        assert not errors, [str(e) for e in errors]
    library = LessonLibrary()
    steps = [lesson.step for lesson in library.lessons()]
    assert len(steps) == len(files) and steps == sorted(set(steps)) and not library.broken()
    assert sum(bool(lesson.meta.get("finale")) for lesson in library.lessons()) == 1
    assert main(["lessons", "check"]) == 0


@pytest.mark.parametrize(
    ("change", "line", "words"),
    [
        (("  queue_cap: 8", "  queue_kap: 8"), 7, "unknown lever 'queue_kap'"),
        (("  queue_cap: 8", "  queue_cap: -1"), 7, "queue_cap"),
        (("charts: [queue_depth, rejected]", "charts: [queue_depth, vibes]"), 8, "unknown chart 'vibes'"),
        (("step: 2", "step: 3"), 2, "does not match"),
        (("      correct: false", "      correct: true"), 16, "exactly one option"),
        (("    watch: The queue_depth chart fills, then drains.", "    watch: ''"), 12, "watch"),
        (("title: Put a queue in front", "title: [unclosed"), 3, "YAML"),
        (("failure_modes:", "failure_mode:"), 23, "unknown key 'failure_mode' in the front matter: did you mean"),
        # A Break it card's levers must be levers, and the step's defence levers must all be used.
        (("{queue_cap: 10000, queue_bound", "{queue_kap: 10000, queue_bound"), 25, "unknown lever 'queue_kap'"),
        ((", central_queue: false}", "}"), 23, "defence lever 'central_queue' of step 2"),
    ],
)
def test_mistakes_point_at_their_line(tmp_path: Path, change: tuple[str, str], line: int, words: str) -> None:
    path = write(tmp_path, GOOD.replace(*change, 1))
    lesson, errors = parse_lesson(path)
    assert lesson is None
    assert errors
    assert any(e.line == line and words in e.message for e in errors), [str(e) for e in errors]
    assert str(errors[0]).startswith(f"{path}:")


def test_break_it_cards_use_the_defence_levers_of_their_step(tmp_path: Path) -> None:
    """GOOD (step 2) passes because its card sets step 2's four defences; the shipped lessons each
    set every defence of their step (web/failures.py's rows), and a card naming a lever that does
    not exist is refused at its line."""
    assert parse_lesson(write(tmp_path, GOOD))[1] == []
    assert {f.lever for f in failures_for_step(2)} == {"queue_bound", "deadline_recheck", "retry_jitter", "central_queue"}
    for lesson in LessonLibrary().lessons():
        used = {key for card in lesson.meta["failure_modes"] for key in card["levers"]}
        assert {f.lever for f in failures_for_step(lesson.step)} <= used, lesson.path.name
    bad = write(tmp_path, GOOD.replace("central_queue: false}", "central_queues: false}"), "02-bad.md")
    errors = parse_lesson(bad)[1]
    assert [(e.line, e.message) for e in errors] == [
        (23, "no Break it card sets the defence lever 'central_queue' of step 2"),
        (25, "unknown lever 'central_queues' in failure_modes[0]'s levers: did you mean 'central_queue'?"),
    ]
    assert check_table() == []


def test_validator_command_reports_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, GOOD.replace("  queue_cap: 8", "  queue_kap: 8"))
    assert main(["lessons", "check", str(bad)]) == 1
    assert f"{bad}:7: unknown lever 'queue_kap'" in capsys.readouterr().out


def test_script_and_javascript_links_render_harmless(tmp_path: Path) -> None:
    evil = GOOD + '\n<script>alert("x")</script>\n\n[click](javascript:alert(1)) <img src=x onerror=alert(1)>\n'
    lesson, errors = parse_lesson(write(tmp_path, evil))
    assert not errors
    html = (lesson.problem_html + lesson.body_html).lower()
    # Tags come out escaped as text; no live script, handler or javascript: link remains.
    assert "<script" not in html and "<img" not in html and 'href="javascript' not in html
    assert "<strong>bold</strong>" in html


def test_edited_lesson_is_reloaded(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    library = LessonLibrary(tmp_path)
    assert library.step(2).meta["title"] == "Put a queue in front"
    path.write_text(GOOD.replace("Put a queue in front", "Queue first"))
    stat = path.stat()
    os.utime(path, (stat.st_atime, stat.st_mtime + 5))
    assert library.step(2).meta["title"] == "Queue first"


def test_levers_are_typed_and_checked() -> None:
    assert validate_levers({"request_rate": 3, "paged": False, "block_size": 32}) == {
        "request_rate": 3.0,
        "paged": False,
        "block_size": 32,
    }
    for bad, key in [({"block_size": 12}, "block_size"), ({"paged": "yes"}, "paged"), ({"warp": 9}, "warp"),
                     ({"min_replicas": 5, "max_replicas": 2}, "min_replicas"), ({"queue_cap": 2.5}, "queue_cap")]:  # fmt: skip
        with pytest.raises(InvalidParamError) as err:
            validate_levers(bad)
        assert err.value.param == key
    assert set(LEVERS) >= {"request_rate", "gpu_count", "ttft_target_ms", "paged", "tensor_parallel", "kv_budget_mb"}


def test_every_card_runs_on_the_live_engine_of_a_two_core_machine() -> None:
    """A lesson's preset, scenarios and failure modes are levers a 2-core CI machine can run
    live (no model but the live one, no more devices than it has): nothing a learner clicks is
    refused for want of hardware."""
    defaults = {key: lever.default for key, lever in LEVERS.items()}
    for lesson in LessonLibrary().lessons():
        preset = defaults | lesson.meta["levers"]
        check_live(lesson.meta["levers"], preset, devices=2)
        for kind in ("scenarios", "failure_modes"):
            for card in lesson.meta[kind]:
                try:
                    check_live(card["levers"], preset | card["levers"], devices=2)
                except InvalidParamError as err:
                    pytest.fail(f"{lesson.path.name} {kind} {card['title']!r}: {err}")
    for card in EVOLUTION:
        check_live(card["levers"], defaults | card["levers"], devices=2)
