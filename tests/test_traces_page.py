"""The request swimlanes and the batch chart in a real browser: `python app.py` serving the real
model with a squeezed KV budget (preemptions) and a small token budget (chunked prompts), the
charts read back from the SVG the page drew.

The flood runs at half a request a second: below what the squeezed engine serves even on a slow
CI machine (about 0.7 a second there), so no queue builds and a request sent beside it is served
within its deadline. The preemptions come from a burst the test sends and waits out."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from tests.support.browser_pages import new_page
from tests.support.server_process import ROOT, ServerProcess, kv_budget_mb

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "tests" / "artifacts"
BUDGET = 32  # max_batched_tokens: a 150-token prompt is read in five chunks
FLOOD_RATE = 0.5  # requests a second, under the engine's capacity here
BURST = 6  # concurrent 40+48-token requests: 6 x 88 tokens outgrow the 272 tokens of KV
LANES = "#chart-swimlanes g.lane"
ENDED = ("finished", "cancelled", "refused", "expired", "failed")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    # 6 MB of KV is 272 tokens of SmolLM2: a few requests that grow as they decode outrun it.
    flags = ("--kv-budget-mb", kv_budget_mb(6), "--max-batched-tokens", str(BUDGET), "--max-num-seqs", "8")
    traffic = ("--prompt-tokens", "40", "--output-tokens", "48", "--request-rate", str(FLOOD_RATE))
    proc = ServerProcess(*flags, *traffic, command=("app.py",))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def page(browser: Browser, server: ServerProcess) -> Iterator[Page]:
    ARTIFACTS.mkdir(exist_ok=True)
    context, page = new_page(browser, 1400, 1200)
    page.goto(f"{server.base_url}/steps/3")
    page.wait_for_function("window.servelabTraces && window.servelab.snapshots > 0")
    yield page
    assert page.uncaught == [], page.uncaught
    context.close()


def lanes(page: Page) -> int:
    return page.locator(LANES).count()


def complete(server: ServerProcess, prompt: str, max_tokens: int, user: str) -> int:
    """One completion to its end: its HTTP status."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "user": user, "ignore_eos": True, "temperature": 0}
    status, payload = server.request("POST", "/v1/completions", body)
    assert status == 200, payload
    return status


def flood(page: Page, action: str) -> None:
    ack = page.evaluate(f"new Promise(r => window.servelab.socket.emit('flood', {{action: '{action}'}}, r))")
    assert ack["ok"], ack


def wait_idle(page: Page) -> None:
    """Every request the page has seen has ended: what the flood left queued is served or expired
    (a slow machine serves fewer than the flood sends), so the next request waits for nobody."""
    page.wait_for_function(
        f"window.servelabTraces.rows().every(r => {list(ENDED)!r}.includes(r.outcome))", timeout=120_000
    )


def test_the_swimlanes_gain_rows_as_the_flood_runs(page: Page) -> None:
    flood(page, "start")
    page.wait_for_function(f"document.querySelectorAll('{LANES}').length >= 3", timeout=60_000)
    first = lanes(page)
    page.wait_for_function(f"document.querySelectorAll('{LANES}').length >= {first + 4}", timeout=60_000)


def test_the_batch_chart_bars_never_exceed_the_budget_line(page: Page) -> None:
    # An arriving prompt is read in chunks beside the running decodes: wait for such a step.
    page.wait_for_function(
        """document.querySelectorAll('#chart-batch_steps g.bar').length >= 30 &&
           Array.from(document.querySelectorAll('#chart-batch_steps g.bar')).some(g => {
             const phases = Array.from(g.querySelectorAll('rect.bar-seg')).map(r => r.dataset.phase);
             return phases.includes('prefill') && phases.includes('decode');
           })""",
        timeout=90_000,
    )
    bars = page.evaluate(
        """() => Array.from(document.querySelectorAll('#chart-batch_steps g.bar')).map(g => ({
             tokens: Number(g.dataset.tokens), budget: Number(g.dataset.budget), seqs: Number(g.dataset.seqs),
             top: Math.min(...Array.from(g.querySelectorAll('rect.bar-seg')).map(r => Number(r.getAttribute('y')))),
             line: Number(g.querySelector('line.budget').getAttribute('y1')),
             model: ['y', 'height'].map(k => Number(g.querySelector('rect.step-time').getAttribute(k))),
             host: ['y', 'height'].map(k => Number(g.querySelector('rect.step-host').getAttribute(k))),
           }))"""
    )
    assert len(bars) >= 30
    for bar in bars:
        assert bar["budget"] == BUDGET and 0 < bar["tokens"] <= bar["budget"] and 1 <= bar["seqs"] <= 8
        assert bar["top"] >= bar["line"] - 1e-6, bar  # SVG y grows downward: the stack stays below the line
        # Each step's time: the model's part, the host's stacked on it (the engine measured both).
        (model_y, model_h), (host_y, host_h) = bar["model"], bar["host"]
        assert model_h > 0 and host_h > 0 and host_y + host_h == pytest.approx(model_y, abs=1e-6), bar
    assert_host_share(page)
    page.locator("#chart-batch_steps").screenshot(path=str(ARTIFACTS / "traces-batch-steps.png"))
    flood(page, "stop")
    wait_idle(page)


def assert_host_share(page: Page) -> None:
    """The caption under the batch chart gives the host's share of the shown steps' time."""
    note = page.locator("#chart-batch_steps .trace-note").text_content() or ""
    share = re.search(r"host (\d+)% of step time over the last (\d+) steps", note)
    assert share, note
    assert 0 <= int(share[1]) <= 100 and int(share[2]) >= 1


def test_a_long_prompt_shows_its_chunks(server: ServerProcess, page: Page) -> None:
    wait_idle(page)
    page.evaluate("window.servelabTraces.highlightUser('long-prompt')")
    complete(server, "word " * 150, 8, "long-prompt")
    mine = "#chart-swimlanes g.lane.mine"
    page.wait_for_function(f"document.querySelector('{mine}[data-outcome=finished]')", timeout=30_000)
    lane = page.locator(mine).first
    assert lane.get_attribute("data-user") == "long-prompt"
    # 150 words under a 32-token budget: at least five chunks, each a tick.
    assert lane.locator("line.chunk-tick").count() >= 5
    assert "long-prompt" in lane.locator("text.mine-label").text_content()
    hover = lane.locator("title").text_content()
    for word in ("arrival", "scheduled", "first token", "last token", "TTFT", "TPOT"):
        assert word in hover
    row = page.evaluate("window.servelabTraces.rows().find(r => r.user === 'long-prompt')")
    assert row["outcome"] == "finished" and row["ttft"] > 0 and sum(c[1] for c in row["chunks"]) >= 150
    page.locator("#chart-swimlanes").screenshot(path=str(ARTIFACTS / "traces-swimlanes.png"))


def test_a_squeezed_kv_budget_draws_preempted_segments(server: ServerProcess, page: Page) -> None:
    wait_idle(page)
    burst = [
        threading.Thread(target=complete, args=(server, "word " * 40, 48, f"burst-{i}"), daemon=True)
        for i in range(BURST)
    ]
    for thread in burst:
        thread.start()
    for thread in burst:
        thread.join(240)
    assert not any(thread.is_alive() for thread in burst)
    page.wait_for_function(
        "window.servelabTraces.rows().filter(r => r.user && r.user.startsWith('burst-')"
        f" && r.outcome === 'finished').length === {BURST}",
        timeout=30_000,
    )
    preempted = page.evaluate("window.servelabTraces.rows().filter(r => r.preempted.length).length")
    assert preempted >= 1
    # The preempted request is recomputed: a prefill segment drawn after the preempted one.
    page.wait_for_function("document.querySelector('#chart-swimlanes rect.seg[data-phase=preempted]')")
    after = page.evaluate(
        """() => Array.from(document.querySelectorAll('#chart-swimlanes g.lane')).some(g => {
             const phases = Array.from(g.querySelectorAll('rect.seg')).map(r => r.dataset.phase);
             const i = phases.indexOf('preempted');
             return i >= 0 && phases.slice(i + 1).includes('prefill');
           })"""
    )
    assert after


def test_the_swimlanes_follow_the_simulated_fleet(page: Page) -> None:
    """Simulated mode: the same charts, fed by the simulated fleet's traces on its own clock."""
    levers = "{executor: 'sim', model: 'llama-3.1-8b', device: 'h100', gpu_count: 1, request_rate: 20}"
    ack = page.evaluate(f"new Promise(r => window.servelab.socket.emit('set_levers', {levers}, r))")
    assert ack["ok"], ack
    try:
        page.wait_for_function("window.servelab.lab.executor === 'sim'", timeout=30_000)
        ack = page.evaluate("new Promise(r => window.servelab.socket.emit('flood', {action: 'start'}, r))")
        assert ack["ok"], ack
        page.wait_for_function(
            "document.querySelectorAll('#chart-swimlanes g.lane[data-outcome=finished]').length >= 5"
            " && document.querySelectorAll('#chart-batch_steps g.bar').length >= 10",
            timeout=60_000,
        )
        # Every row is the simulated fleet's (its requests are numbered; the API's are cmpl-...).
        rows = page.evaluate("window.servelabTraces.rows()")
        assert rows and all(r["id"].isdigit() for r in rows), [r["id"] for r in rows][:5]
        assert_host_share(page)  # the simulated steps carry the cost model's split
    finally:
        page.evaluate("new Promise(r => window.servelab.socket.emit('flood', {action: 'stop'}, r))")
        page.evaluate("new Promise(r => window.servelab.socket.emit('set_levers', {executor: 'live'}, r))")
        page.wait_for_function("window.servelab.lab.executor === 'live'", timeout=30_000)


def test_a_user_name_is_drawn_as_text_never_as_html(server: ServerProcess, page: Page) -> None:
    name = "<img src=x onerror=window.pwned=1>"
    wait_idle(page)
    page.evaluate(f"window.servelabTraces.highlightUser({name!r})")
    complete(server, "Hi", 2, name)
    # Redraws are paced: until the next one, an earlier test's lane may still be the one marked.
    mine = f"Array.from(document.querySelectorAll('#chart-swimlanes g.lane.mine')).find(g => g.dataset.user === {name!r})"
    page.wait_for_function(f"{mine} && {mine}.querySelector('text.mine-label')", timeout=30_000)
    assert name in page.evaluate(f"{mine}.querySelector('text.mine-label').textContent")
    assert page.locator("#chart-swimlanes img").count() == 0 and page.evaluate("window.pwned === undefined")
