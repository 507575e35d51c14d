"""The lessons' measured figures: every one is named, committed with the machine that measured it,
shown as this machine's only when it was measured here, and `make figures` lists what moved."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.figures import compare, merge
from engine.sim import calibration
from web.figures import GROUPS, PLACEHOLDER, REFERENCE, SPECS, FigureBook
from web.lessons import LESSONS_DIR, LessonLibrary, parse_lesson

pytestmark = pytest.mark.unit

THIS = calibration.MachineKey("Test CPU", "avx512", "avx2", "float32", 2, "code")
OTHER = calibration.MachineKey("Reference CPU", "amx", "amx", "bfloat16", 2, "code")


def group(key: calibration.MachineKey, figures: dict[str, float], date: str = "2026-12-01T10:00:00+00:00") -> dict:
    return {"machine": asdict(key), "date": date, "command": "python -m bench.figures", "figures": figures}


def test_every_placeholder_names_a_figure_and_the_reference_holds_every_figure() -> None:
    used = {m.group(1) for path in LESSONS_DIR.glob("*.md") for m in PLACEHOLDER.finditer(path.read_text())}
    assert used and used <= set(SPECS), sorted(used - set(SPECS))
    reference = json.loads(REFERENCE.read_text())["groups"]
    assert set(reference) == set(GROUPS)
    for name, entry in reference.items():
        assert set(entry["machine"]) == set(calibration.KEY_FIELDS) and entry["date"] and entry["command"], name
        measured = {k for k, v in entry["figures"].items() if v is not None}
        assert {n for n, s in SPECS.items() if s.group == name} <= measured, name
    for path in LESSONS_DIR.glob("*.md"):  # every lesson renders with the reference alone
        lesson, errors = parse_lesson(path, FigureBook(REFERENCE, Path("/nonexistent"), THIS))
        assert lesson is not None, errors
        rendered = lesson.problem_html + lesson.body_html + json.dumps(lesson.meta)
        assert "{{" not in rendered and "\ue000" not in rendered and "not measured yet" not in rendered, path.name


def test_every_lesson_sizes_its_cards_from_the_figures_it_shows(tmp_path: Path) -> None:
    """With no figures of its own a machine's pages resolve `Nx capacity` from the reference's
    (and say so); once `make figures` has measured it, from its own: a machine half as fast gets
    cards at half the rate, and its pages say "this machine"."""
    reference = json.loads(REFERENCE.read_text())["groups"]
    local = tmp_path / "local.json"
    slower = {name: group(THIS, {k: v / 2 if k.endswith(("_tok_s", "_req_s")) else v * 2 if k.endswith(("_ms", "_s")) else v
                                 for k, v in entry["figures"].items()}) for name, entry in reference.items()}  # fmt: skip
    merge(local, slower)
    as_reference = {l.step: l for l in LessonLibrary(LESSONS_DIR, FigureBook(REFERENCE, tmp_path / "none.json", THIS)).lessons()}
    as_here = {l.step: l for l in LessonLibrary(LESSONS_DIR, FigureBook(REFERENCE, local, THIS)).lessons()}
    sized = 0
    for step, lesson in as_here.items():
        cards = zip(lesson.meta["scenarios"] + lesson.meta["failure_modes"],
                    as_reference[step].meta["scenarios"] + as_reference[step].meta["failure_modes"], strict=True)  # fmt: skip
        for here, there in cards:
            for key in here.get("relative", {}):
                sized += 1
                assert here["levers"][key] == pytest.approx(there["levers"][key] / 2, rel=0.05, abs=0.011), (step, here["title"])
        if lesson.figures:
            assert all("this machine" in line for line in lesson.provenance), lesson.provenance
            assert not any("this machine" in line for line in as_reference[step].provenance)
    assert sized >= 8  # the load-dependent cards of the course are sized to the machine


def test_a_foreign_figure_names_its_machine_and_this_machines_replaces_it(tmp_path: Path) -> None:
    reference, local = tmp_path / "figures.json", tmp_path / "local.json"
    merge(reference, {"steps": group(OTHER, {"decode_step_b2_ms": 20.4, "decode_step_b64_ms": 82.0})})
    book = FigureBook(reference, local, THIS)
    text, used, unknown = book.render("{{fig:decode_step_b2_ms}} and {{fig:decode_step_b64_ms|bare}}")
    assert (text, unknown) == ("20 ms and 82", [])
    assert [f.this_machine for f in used] == [False, False]
    from web.figures import provenance

    assert provenance(used) == ["2 measured on Reference CPU (amx, bfloat16), 2026-12-01"]
    merge(local, {"steps": group(THIS, {"decode_step_b2_ms": 35.9}, "2026-12-03T17:00:00+00:00")})
    text, used, _ = book.render("{{fig:decode_step_b2_ms}} and {{fig:decode_step_b64_ms}}")
    assert text == "36 ms and 82 ms"  # this machine's where it has one, the reference's for the rest
    assert provenance(used) == [
        "1 measured on this machine, 2026-12-03",
        "1 measured on Reference CPU (amx, bfloat16), 2026-12-01",
    ]
    # A local file measured under another key (another dtype, older step code) is not this machine's.
    stale = tmp_path / "stale.json"
    merge(stale, {"steps": group(OTHER, {"decode_step_b2_ms": 50.0})})
    assert not FigureBook(reference, stale, THIS).figures()["decode_step_b2_ms"].this_machine


def test_a_lesson_naming_an_unknown_figure_is_refused_at_its_line(tmp_path: Path) -> None:
    source = next(LESSONS_DIR.glob("04-*.md")).read_text()
    bad = source.replace("{{fig:offline_static_tok_s}}", "{{fig:offline_statik_tok_s}}")
    path = tmp_path / "04-continuous-batching.md"
    path.write_text(bad)
    lesson, errors = parse_lesson(path, FigureBook(REFERENCE, tmp_path / "none.json", THIS))
    line = bad[: bad.index("offline_statik")].count("\n") + 1
    assert lesson is None and [(e.line, "offline_statik_tok_s" in e.message) for e in errors] == [(line, True)]


def test_a_fresh_measurement_rerenders_the_lesson(tmp_path: Path) -> None:
    folder = tmp_path / "lessons"
    folder.mkdir()
    (folder / "04-continuous-batching.md").write_text(next(LESSONS_DIR.glob("04-*.md")).read_text())
    local = tmp_path / "local.json"
    library = LessonLibrary(folder, FigureBook(REFERENCE, local, THIS))
    assert "this machine" not in " ".join(library.step(4).provenance)
    merge(local, {"offline": group(THIS, {"offline_continuous_tok_s": 1234.0})})
    lesson = library.step(4)
    assert "1,234" in lesson.body_html and "measured on this machine" in " ".join(lesson.provenance)


def test_the_figures_command_lists_what_moved_more_than_ten_percent() -> None:
    old = {"groups": {"ramp": group(OTHER, {"ramp_1_ttft_p50_ms": 47.0, "ramp_1_tok_s": 123.0})}}
    new = {"groups": {"ramp": group(THIS, {"ramp_1_ttft_p50_ms": 50.0, "ramp_1_tok_s": 98.0})}}
    assert compare(old, new) == ["ramp_1_tok_s: 123.0 -> 98.0 (-20%)"]




def test_readme_quotes_the_reference_figures_it_marks(tmp_path: Path) -> None:
    """README's marked figures are the reference's, as `make figures --rewrite` wrote them."""
    from bench.figures import ROOT, rewrite_readme
    from web.figures import MARKER

    readme = (ROOT / "README.md").read_text()
    marked = MARKER.findall(readme)
    assert {name for name, _ in marked} >= {n for n, s in SPECS.items() if s.group == "peers"}
    copy = tmp_path / "README.md"
    copy.write_text(readme)
    assert rewrite_readme(json.loads(REFERENCE.read_text()), copy) == []
    assert copy.read_text() == readme, "README's figures are not the reference's: make figures FIGURES_ARGS=--rewrite"
