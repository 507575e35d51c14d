"""The failure gallery (/failures) in a real browser over `python app.py`: one row per failure of
issue 15's table; a row whose metric the snapshot lacks says "no data"; three rows' break / fix
toggles set their defence levers on the live engine through set_levers (a watching browser cannot)
and their sparklines, fed by the live snapshots, change. Step 3's long-prompt button sends 1,500
prompt tokens through the API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.server_process import ServerProcess, kv_budget_mb
from web.failures import FAILURES

CHROMIUM = "/usr/bin/chromium"
TOKEN = "gallery-secret"
# Rows whose metric the live engine reports under the lab's own traffic within seconds, and whose
# lever applies without a rebuild: the server's ITL and TTFT tails, the clients' TTFT.
ROWS = ("chunked_prefill", "queue_bound", "stream_flush")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "--kv-budget-mb", kv_budget_mb(64), "--max-num-seqs", "16", "--request-rate", "2", "--drain-timeout-s", "3",
        command=("app.py",), env={"SERVELAB_INSTRUCTOR_TOKEN": TOKEN},
    )
    yield proc
    proc.stop()


def wait(page: Page, expression: str, arg: object = None, timeout_s: float = 90) -> None:
    page.wait_for_function(expression, arg=arg, timeout=timeout_s * 1000)


def spark(page: Page, lever: str) -> str:
    return page.eval_on_selector(f"#spark-{lever} path", "p => p.getAttribute('d')") or ""


def test_step_3_sends_a_1500_token_prompt(server: ServerProcess, page: Page) -> None:
    """First, while the engine is idle: the prompt waits behind nothing but its own prefill."""
    page.goto(f"{server.base_url}/steps/3?token={TOKEN}")
    wait(page, "window.servelab && window.servelab.role === 'instructor' && window.servelab.snapshots > 0")
    page.click("#long-prompt")
    expect(page.locator("#prompt-timing")).to_contain_text("1500-token prompt answered in", timeout=120_000)
    assert page.errors == []  # type: ignore[attr-defined]


def test_a_step_page_shows_its_defences_and_their_metrics(server: ServerProcess, page: Page) -> None:
    """Each step's page carries its own rows of the gallery: the metric that exposes each failure
    is on the step's page, fed by the same snapshots."""
    page.goto(f"{server.base_url}/steps/1?token={TOKEN}")
    wait(page, "window.servelab && window.servelab.role === 'instructor' && window.servelab.snapshots > 0")
    rows = page.locator("#step-failures .failure-row")
    expect(rows).to_have_count(sum(f.step == 1 for f in FAILURES))
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.lever)") == [f.lever for f in FAILURES if f.step == 1]
    wait(page, "window.servelab.failures.length > 0 && window.servelab.failures.every(r => r.points.length > 2)")
    assert page.errors == []  # type: ignore[attr-defined]


def test_three_toggles_break_and_fix_their_defences_and_the_sparklines_follow(server: ServerProcess, page: Page) -> None:
    page.goto(f"{server.base_url}/failures?token={TOKEN}")
    wait(page, "window.servelab && window.servelab.role === 'instructor' && window.servelab.lastSnapshot !== undefined")
    expect(page.locator(".steps-nav a[href='/failures']")).to_have_class("current")
    rows = page.locator(".failure-row")
    expect(rows).to_have_count(len(FAILURES))
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.lever)") == [f.lever for f in FAILURES]
    expect(page.locator("#failure-collective_timeout a")).to_have_attribute("href", "/steps/6")
    # A key the snapshot lacks reads "no data"; one it has reads a number once a reading comes.
    snap = page.evaluate("window.servelab.lastSnapshot")
    for f in FAILURES:
        if f.metric not in snap:
            expect(page.locator(f"#spark-value-{f.lever}")).to_have_text("no data")

    page.click("#traffic-start")
    wait(page, "window.servelab.lab.traffic.running")
    for lever in ROWS:
        # Readings of every row first: the engine has served requests and the tails exist.
        wait(page, "lever => window.servelab.failures.find(r => r.lever === lever).points.some(v => v !== null)", lever, 120)
    for lever in ROWS:
        button = page.locator(f"#failure-{lever} .failure-toggle")
        expect(button).to_have_text("Break")
        before = spark(page, lever)
        button.click()
        wait(page, "lever => window.servelab.lab.levers[lever] === false", lever, 30)
        expect(button).to_have_text("Fix")
        expect(page.locator(f"#failure-{lever}")).to_have_class("failure-row broken")
        wait(page, "([lever, before]) => document.querySelector('#spark-' + lever + ' path').getAttribute('d') !== before",
             [lever, before], 30)
    for lever in ROWS:  # fixed again: the defaults are back on the live engine
        page.locator(f"#failure-{lever} .failure-toggle").click()
        wait(page, "lever => window.servelab.lab.levers[lever] === true", lever, 30)
        expect(page.locator(f"#failure-{lever} .failure-toggle")).to_have_text("Break")
    page.click("#traffic-stop")
    assert page.errors == []  # type: ignore[attr-defined]


def test_a_watching_browser_cannot_toggle(server: ServerProcess, page: Page) -> None:
    page.goto(f"{server.base_url}/failures")
    wait(page, "window.servelab && window.servelab.role === 'viewer'")
    expect(page.locator("#failure-drain_on_scale_in .failure-toggle")).to_be_disabled()
    ack = page.evaluate(
        "() => new Promise(done => window.servelab.socket.emit('set_levers', {drain_on_scale_in: false}, done))"
    )
    assert ack["ok"] is False and ack["error"]["code"] == "forbidden"
