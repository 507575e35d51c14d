"""The what-if panels in a real browser (Debian chromium) over `python app.py` serving the real
model: A/B on the same traffic fills its table and a shared link reproduces it; a lesson's
at-scale experiment runs; predict-then-run draws the dashed prediction before the live traffic
starts, the live line follows, and the gap is shown as a number."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.server_process import ServerProcess, kv_budget_mb

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess("--kv-budget-mb", kv_budget_mb(64), "--max-num-seqs", "16", command=("app.py",))
    yield proc
    proc.stop()


@pytest.fixture
def page(page: Page) -> Iterator[Page]:
    """conftest's page, failing the test on any uncaught exception in it."""
    yield page
    assert page.uncaught == []  # type: ignore[attr-defined]


def open_page(page: Page, server: ServerProcess, path: str) -> None:
    page.goto(server.base_url + path)
    page.wait_for_function("window.servelab && window.servelab.snapshots > 0")


def table(page: Page, box: str) -> dict[str, list[str]]:
    rows = page.locator(f"{box} tbody tr")
    return {
        rows.nth(i).get_attribute("data-key"): rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())
    }


def test_ab_fills_the_table_refuses_a_bad_side_and_a_shared_link_reproduces_it(
    server: ServerProcess, page: Page
) -> None:
    open_page(page, server, "/lab")
    # The user's price on the lab's gpu_hour_usd lever is the price both sides are costed at.
    page.evaluate("window.servelab.socket.emit('set_levers', {gpu_hour_usd: 3.0})")
    page.wait_for_function("window.servelab.lab.levers.gpu_hour_usd === 3.0", timeout=10_000)
    page.select_option("#ab-preset", "tp4_vs_tp8")
    expect(page.locator("[name='b.tensor_parallel']")).to_have_value("8")
    page.fill("[name='t.num_requests']", "150")
    page.click("#ab-run")
    page.wait_for_selector("#ab-results[data-filled]", state="attached", timeout=60_000)
    first = table(page, "#ab-results")
    assert first["output_tok_s"][1] != "–" and first["ttft_p99_s"][2].endswith(" s")
    assert first["completed"][1:3] == ["150", "150"]  # the same 150 requests on both sides
    expect(page.locator("#ab-results .sim-badge[data-side=a]")).to_contain_text(
        "simulated: H100 x 8, Llama-3.1-70B (TP4)"
    )
    expect(page.locator("#ab-results .sim-badge[data-side=b]")).to_contain_text("(TP8)")
    expect(page.locator("#ab-results [data-command=b]")).to_contain_text("--tp 8")
    for metric in ("tokens_per_s", "ttft", "queue_depth", "kv"):  # two sides overlaid on each chart
        traces = page.evaluate(f"document.querySelector('#ab-results [data-ab-metric={metric}]').data.map(t => t.name)")
        assert "A" in traces and "B" in traces
    link = page.get_attribute("#ab-link", "href")
    assert link and "ab=tp4_vs_tp8" in link and "t.num_requests=150" in link and "a.gpu_hour_usd=3" in link
    hours, cost = float(first["gpu_hours"][1]), float(first["cost_per_mtok_usd"][1].lstrip("$"))
    tokens = float(first["output_tok_s"][1].replace(",", "")) * float(first["simulated_s"][1])
    assert cost == pytest.approx(hours * 3.0 / tokens * 1e6, rel=0.02)  # the table's rounding

    # A side that cannot run is refused next to its lever with the simulator's reason; the table stays.
    page.fill("[name='b.gpu_count']", "1")
    page.fill("[name='b.tensor_parallel']", "1")
    page.click("#ab-run")
    expect(page.locator("#ab-status")).to_contain_text("b.model")
    expect(page.locator("fieldset[data-group=b] label.invalid .field-error")).to_contain_text("141 GB")
    assert table(page, "#ab-results") == first

    # The shared link, opened fresh, runs the same experiment to the same figures.
    fresh = page.context.new_page()
    fresh.goto(server.base_url + link)
    fresh.wait_for_selector("#ab-results[data-filled]", state="attached", timeout=60_000)
    assert table(fresh, "#ab-results") == first
    fresh.close()
    page.evaluate("window.servelab.socket.emit('set_levers', {gpu_hour_usd: 2.0})")


def test_a_lesson_runs_its_at_scale_experiment(server: ServerProcess, page: Page) -> None:
    open_page(page, server, "/steps/4")
    page.click("[data-at-scale='0']")
    box = page.locator("#at-scale .predict-box")
    expect(box.locator(".predict-question")).to_contain_text("What does static batching do?")  # asked first
    time.sleep(1)
    assert page.locator("#at-scale-results[data-filled]").count() == 0  # and nothing ran yet
    box.locator(".predict-option").nth(0).click()
    page.wait_for_selector("#at-scale-results[data-filled]", state="attached", timeout=60_000)
    expect(box.locator(".predict-result")).to_contain_text("(you were right)")
    expect(page.locator("#at-scale-results .sim-badge[data-side=b]")).to_contain_text("static batches")
    rows = table(page, "#at-scale-results")
    assert rows["output_tok_s"][1:3] == ["2,838", "1,967"]  # the figures the lesson's text quotes


def test_predict_then_run_on_the_live_engine(server: ServerProcess, page: Page) -> None:
    open_page(page, server, "/lab")  # every chart
    assert page.evaluate("window.servelab.lab.traffic.running") is False
    # Record what happens first: the dashed prediction on the chart, or live traffic.
    page.evaluate("""() => {
      window.order = [];
      const note = (what) => { if (!window.order.includes(what)) window.order.push(what); };
      window.servelab.socket.on('metrics', (s) => { if (s.lab.traffic.running) note('traffic'); });
      new MutationObserver(() => { if (document.body.dataset.predicted) note('predicted'); })
        .observe(document.body, { attributes: true });
    }""")
    page.click("#predict-run")
    page.wait_for_function("window.order.includes('traffic')", timeout=60_000)
    assert page.evaluate("window.order") == ["predicted", "traffic"]
    for chart in ("ttft", "tokens_per_s", "queue_depth"):
        dashed = page.evaluate(
            f"document.getElementById('chart-{chart}').data.filter(t => t.meta === 'predicted')"
            ".map(t => [t.line.dash, t.x.length])"
        )
        assert dashed and all(dash == "dash" and points > 50 for dash, points in dashed), (chart, dashed)
    # The live line follows: the server's TTFT p50 gains values once requests finish.
    page.wait_for_function("document.getElementById('chart-ttft').data[0].y.some(v => v !== null)", timeout=60_000)
    gap = page.locator("#predict-gap")
    expect(gap).to_be_visible(timeout=60_000)
    expect(gap).to_contain_text("vs predicted")
    expect(gap).to_contain_text("%")
    page.evaluate("window.servelab.socket.emit('flood', {action: 'stop'})")
    page.wait_for_function("!window.servelab.lab.traffic.running", timeout=10_000)
