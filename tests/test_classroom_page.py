"""Classroom mode and prediction cards in a real browser (Debian chromium) over `python app.py`
with SERVELAB_INSTRUCTOR_TOKEN set: a step's prediction card asks before its levers change and
shows the guess beside the metric's before and after; an instructor page and three student
pages (separate browser contexts) join, send prompts, each finds its own highlighted requests in
the swimlanes, a poll's answers reach the instructor and its reveal reaches the students, a
student's attempts to move levers or flood are refused, and a name holding HTML stays text."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Locator, Page, expect

from tests.support import browser_pages
from tests.support.server_process import ServerProcess, kv_budget_mb
from web.lessons import LessonLibrary
from web.predictions import predict_cards

CHROMIUM = "/usr/bin/chromium"
TOKEN = "class-secret"
NAMES = ("Ada", "<img src=x onerror=alert(1)>", "Grace")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "--kv-budget-mb",
        kv_budget_mb(64),
        "--max-num-seqs",
        "16",
        "--request-rate",
        "3",
        "--drain-timeout-s",
        "3",
        command=("app.py",),
        env={"SERVELAB_INSTRUCTOR_TOKEN": TOKEN},
        api_keys="outside-client-key",  # students' prompts and the class flood pass as pages
    )
    yield proc
    proc.stop()


def new_page(browser: Browser) -> tuple[BrowserContext, Page]:
    return browser_pages.new_page(browser, 1300, 950)


def wait(page: Page, expression: str, arg: object = None, timeout_s: float = 60) -> Any:
    return page.wait_for_function(f"(arg) => ({expression})", arg=arg, timeout=timeout_s * 1000).json_value()


def press(target: Locator) -> None:
    """A click on a visible button. The click event itself, not Playwright's pointer click: the
    swimlanes grow a lane per request, so what lies below them moves every tick and never
    counts as stable for a pointer click on a busy machine."""
    expect(target).to_be_visible()
    target.dispatch_event("click")


def emit(page: Page, event: str, data: dict) -> dict:
    """An event sent from the page's own socket, as a script on a student's page could."""
    return page.evaluate(
        "([event, data]) => new Promise((ok) => window.servelab.socket.emit(event, data, ok))", [event, data]
    )


@pytest.fixture(scope="module")
def classroom(server: ServerProcess, browser: Browser) -> Iterator[dict[str, Any]]:
    """An instructor page and three student pages, each in its own browser context."""
    contexts: list[BrowserContext] = []
    context, teacher = new_page(browser)
    contexts.append(context)
    teacher.goto(f"{server.base_url}/class/new?token={TOKEN}")
    teacher.select_option("select[name=step]", "4")
    teacher.click("#class-start")
    teacher.wait_for_url("**/class/*/teach")
    wait(teacher, "window.servelab.role === 'instructor' && window.servelab.classroom.state !== null")
    code = teacher.locator("#class-code").inner_text()
    students = []
    for name in NAMES:
        context, page = new_page(browser)
        contexts.append(context)
        page.goto(f"{server.base_url}/join/{code}")
        page.fill("#join-name", name)
        page.click("#join-send")
        expect(page.locator("#student-view")).to_be_visible(timeout=30_000)
        students.append(page)
    yield {"teacher": teacher, "students": students, "code": code}
    for context in contexts:
        context.close()


def test_with_the_env_token_set_starting_a_class_needs_it(server: ServerProcess) -> None:
    status, body = server.request("POST", "/class/new", {"step": 1})
    assert status == 403 and json.loads(body)["error"]["param"] == "token"
    status, body = server.request("POST", "/class/new", {"step": 1, "token": "a guess"})
    assert status == 403


def test_while_a_class_runs_only_its_instructor_starts_what_if_runs(
    server: ServerProcess, classroom: dict[str, Any]
) -> None:
    body = {"a": {"not_a_lever": 1}}
    status, payload = server.request("POST", "/whatif/ab", body)
    assert status == 403 and json.loads(payload)["error"]["param"] == "token"
    status, payload = server.request("POST", "/whatif/ab", body, {"X-ServeLab-Token": TOKEN})
    assert status == 400 and json.loads(payload)["error"]["param"] == "a.not_a_lever"  # past the gate


def test_students_join_and_the_instructor_lists_them_as_text(classroom: dict[str, Any]) -> None:
    teacher, students = classroom["teacher"], classroom["students"]
    expect(teacher.locator("#student-list .student-name")).to_have_text(list(NAMES), timeout=20_000)
    for page, name in zip(students, NAMES, strict=True):
        expect(page.locator("#student-hello")).to_have_text("You are " + name)
        assert page.locator("img").count() == 0 and page.dialogs == []  # type: ignore[attr-defined]
        assert page.evaluate("window.servelab.role") == "viewer"
    assert teacher.locator("#student-list img").count() == 0


def test_a_poll_reaches_the_instructor_and_its_reveal_reaches_the_students(classroom: dict[str, Any]) -> None:
    teacher, students = classroom["teacher"], classroom["students"]
    press(teacher.locator("#poll-open"))
    for i, page in enumerate(students):
        expect(page.locator("#class-poll")).to_be_visible()
        press(page.locator("#poll-options .option").nth(i % 2))
        expect(page.locator("#poll-options .option.chosen")).to_have_count(1)
    expect(teacher.locator("#poll-phase")).to_contain_text("3 answered", timeout=20_000)
    counts = teacher.locator("#poll-options .count").all_inner_texts()
    assert [int(c) for c in counts][:2] == [2, 1]
    assert students[0].locator("#poll-options .count").count() == 0  # the distribution is the instructor's
    press(teacher.locator("#poll-reveal"))
    for page in students:
        expect(page.locator("#poll-options .option.correct")).to_have_count(1)
        expect(page.locator("#poll-options .why").first).to_be_visible()
        expect(page.locator("#poll-phase")).to_have_text("revealed")


def test_a_student_cannot_move_levers_or_flood(classroom: dict[str, Any]) -> None:
    page = classroom["students"][0]
    for event, data in (
        ("set_levers", {"max_num_seqs": 2}),
        ("flood", {"action": "ramp", "to": 50, "over_s": 5}),
        ("class_flood", {"action": "start", "rate": 5}),
        ("class_poll", {"action": "reveal"}),
    ):
        ack = emit(page, event, data)
        assert ack["ok"] is False and ack["error"]["code"] == "forbidden", (event, ack)
    assert page.evaluate("window.servelab.lab.levers.max_num_seqs") != 2


def test_students_send_prompts_and_each_sees_their_own_highlighted_rows(classroom: dict[str, Any]) -> None:
    teacher, students = classroom["teacher"], classroom["students"]
    for page in students:
        press(page.locator("#class-prompt-send"))
    for page in students:
        expect(page.locator("#class-prompt-timing")).to_contain_text("time to first token", timeout=120_000)
    for page in students:
        me = page.evaluate("window.servelab.classroom.student.id")
        # The rows part A's traces keep for this student's `user`, and the ones its chart highlights.
        mine = wait(page, "window.servelabTraces.rows().filter(r => r.user === arg).length", me, 30)
        assert mine >= 1
        others = page.evaluate("(arg) => window.servelabTraces.rows().filter(r => r.user && r.user !== arg).length", me)
        assert others >= 2  # the other students' requests are there too, not highlighted
        # ... and the lanes the swimlanes chart draws: this student's highlighted, the others' not.
        wait(page, "document.querySelectorAll('#chart-swimlanes g.lane.mine').length > 0", None, 30)
        drawn_mine = page.eval_on_selector_all("#chart-swimlanes g.lane.mine", "gs => gs.map(g => g.dataset.user)")
        assert set(drawn_mine) == {me}
        assert page.locator("#chart-swimlanes g.lane[data-user]:not(.mine)").count() >= 2
        expect(page.locator("#queue-position")).not_to_be_empty()
    expect(teacher.locator("#student-list [data-ttft]")).to_have_count(3)
    wait(
        teacher,
        "Array.from(document.querySelectorAll('#student-list [data-ttft]')).every(td => td.textContent.endsWith(' ms'))",
        None,
        30,
    )


def test_a_class_flood_sends_from_every_student_browser(classroom: dict[str, Any]) -> None:
    teacher, students = classroom["teacher"], classroom["students"]
    teacher.fill("#flood-rate", "1")
    teacher.fill("#flood-prompt", "16")
    teacher.fill("#flood-output", "4")
    press(teacher.locator("#flood-start"))
    expect(teacher.locator("#flood-state")).to_have_text("on")
    for page in students:
        try:
            wait(page, "window.servelab.classroom.flood.done >= 2", None, 60)
        except Exception as err:
            counts = page.evaluate("JSON.stringify(window.servelab.classroom)")
            raise AssertionError(f"{counts} {page.locator('#flood-status').inner_text()}") from err
    press(teacher.locator("#flood-stop"))
    for page in students:
        expect(page.locator("#flood-state")).to_have_text("off")
        assert page.errors == []  # type: ignore[attr-defined]
    assert teacher.errors == []  # type: ignore[attr-defined]


def test_a_class_prediction_collects_guesses_then_every_page_watches(classroom: dict[str, Any]) -> None:
    teacher, students = classroom["teacher"], classroom["students"]
    card = predict_cards(LessonLibrary().step(4).meta, numbers=False)[0]  # a class answers by option
    press(teacher.locator("[data-ask='0']"))
    for i, page in enumerate(students):
        expect(page.locator("#predict-question")).to_have_text(card.question)
        press(page.locator("#predict-options .option").nth(i % len(card.options)))
        expect(page.locator("#predict-options .option.chosen")).to_have_count(1)
    expect(teacher.locator("#predict-phase")).to_contain_text("3 guessed", timeout=20_000)
    assert sum(int(c) for c in teacher.locator("#predict-options .count").all_inner_texts()) == 3
    press(teacher.locator("#predict-apply"))
    for page in (teacher, *students):
        expect(page.locator("#predict-result")).to_contain_text("watching " + card.view()["label"], timeout=20_000)
    assert students[0].locator("#predict-options .option.correct").count() == 0  # the answer waits for the outcome


def test_a_prediction_card_asks_before_its_levers_change(server: ServerProcess, browser: Browser) -> None:
    lesson = LessonLibrary().step(4)
    card = next(c for c in predict_cards(lesson.meta) if c.metric == "queue_depth")  # "A small ceiling"
    levers = lesson.meta[card.kind][card.index]["levers"]
    context, page = new_page(browser)
    page.goto(f"{server.base_url}/steps/4?token={TOKEN}")
    wait(page, "window.servelab && window.servelab.role === 'instructor' && window.servelab.snapshots > 0")
    press(page.locator("#apply-preset"))  # the step's own levers: half this machine's capacity, 64 slots
    rate = lesson.meta["levers"]["request_rate"]  # resolved from the figures the page shows
    wait(page, "window.servelab.lab.levers.max_num_seqs === 64 && window.servelab.lab.levers.request_rate === arg", rate)
    press(page.locator("#traffic-start"))
    wait(page, "window.servelab.lab.traffic.running")
    time.sleep(6)  # a baseline of snapshots under the step's traffic
    button = page.locator(f"button[data-kind={card.kind}][data-scenario='{card.index}']")
    press(button)
    box = page.locator(".predict-box")
    expect(box.locator(".predict-question")).to_contain_text(card.question)
    time.sleep(2)  # asked, not applied: the levers have not moved
    assert page.evaluate("window.servelab.lab.levers.max_num_seqs") == 64
    press(box.locator(".predict-option").nth(card.answer))
    try:
        wait(page, "window.servelab.lab.levers.max_num_seqs === arg", levers["max_num_seqs"], 60)
    except Exception as err:  # say what the scenario's acknowledgement said
        said = page.locator("#scenario-result").inner_text()
        raise AssertionError(f"{said!r} {page.errors} {box.inner_html()}") from err  # type: ignore[attr-defined]
    expect(box.locator(".predict-result")).to_contain_text("watching")
    result = box.locator(".predict-result.done")
    expect(result).to_have_count(1, timeout=(card.settle_s + 30) * 1000)
    expect(result).to_contain_text("Your guess: " + card.options[card.answer])
    expect(result).to_contain_text("(you were right)")
    before, after = (float(result.get_attribute(f"data-{side}") or "nan") for side in ("before", "after"))
    expect(result).to_contain_text("went from ")
    assert after > before, (before, after)  # the lesson's answer ("climbs") is what the live engine did
    assert page.errors == []  # type: ignore[attr-defined]
    press(page.locator("#traffic-stop"))  # last in the file: what it queued drains after the module's classroom tests
    assert emit(page, "set_levers", {"max_num_seqs": 16, "request_rate": 1.0})["ok"]
    context.close()


def test_a_numeric_prediction_is_typed_then_scored_against_the_measurement(server: ServerProcess, browser: Browser) -> None:
    lesson = LessonLibrary().step(4)
    card = next(c for c in predict_cards(lesson.meta) if c.tolerance is not None)  # "Single file": tokens/s
    levers = lesson.meta[card.kind][card.index]["levers"]
    context, page = new_page(browser)
    page.goto(f"{server.base_url}/steps/4?token={TOKEN}")
    wait(page, "window.servelab && window.servelab.role === 'instructor' && window.servelab.snapshots > 0")
    press(page.locator("#apply-preset"))
    wait(page, "window.servelab.lab.levers.max_num_seqs === 64")
    press(page.locator("#traffic-start"))
    wait(page, "window.servelab.lab.traffic.running")
    time.sleep(6)
    press(page.locator(f"button[data-kind={card.kind}][data-scenario='{card.index}']"))
    box = page.locator(".predict-box")
    expect(box.locator(".predict-question")).to_contain_text(card.question.split("?")[0][:40])
    assert box.locator(".predict-option").count() == 0  # a number, typed: no options
    time.sleep(2)
    assert page.evaluate("window.servelab.lab.levers.max_num_seqs") == 64  # asked, not applied
    box.locator(".predict-number input").fill("30")
    press(box.locator(".predict-number button"))
    wait(page, "window.servelab.lab.levers.max_num_seqs === arg", levers["max_num_seqs"], 60)
    result = box.locator(".predict-result.done")
    expect(result).to_have_count(1, timeout=(card.settle_s + 30) * 1000)
    expect(result).to_contain_text("Your guess: 30.00")
    expect(result).to_contain_text(f"within ±{round(card.tolerance * 100)}%")
    after = float(result.get_attribute("data-after") or "nan")
    assert after > 0, after  # a measured tokens/s came back to score against
    assert (result.get_attribute("data-right") == "true") == (abs(30 - after) <= card.tolerance * after)
    assert page.errors == []  # type: ignore[attr-defined]
    press(page.locator("#traffic-stop"))
    assert emit(page, "set_levers", {"max_num_seqs": 16, "request_rate": 1.0})["ok"]
    context.close()
