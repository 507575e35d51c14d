"""The lab in remote mode in a real browser (issue 17): ServeLab's own `python -m engine serve` is
the remote (it speaks vLLM's metric names), with a small queue so a flood fills it and 429s
come back, and `python app.py --backend remote --base-url ...` is the lab, both real server
processes. The page names the remote, every chart on /lab fills from the remote's /metrics and
the lab's clients, a flood fills the remote's queue (vllm:num_requests_waiting through the lab's
snapshot), the remote's 429s reach the timeline, the prompt box streams through the app's
pass-through, a lever the remote owns is read-only and refused by name, and stopping the remote
mid-run is reported on the page without breaking it; bringing it back reconnects."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.support import server_process
from tests.support.server_process import ROOT, ServerProcess, kv_budget_mb

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "tests" / "artifacts"
MODEL = "SmolLM2-135M-Instruct"
# A remote small enough to fill: 4 batch slots, 4 places in its queue, a short drain when stopped.
REMOTE_FLAGS = ("--queue-cap", "4", "--max-num-seqs", "4", "--kv-budget-mb", kv_budget_mb(64), "--drain-timeout-s", "2")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed"),
]

EVERY_CHART_FILLED = """() => {
  const charts = Array.from(document.querySelectorAll('.chart'));
  return charts.length > 0 && charts.every((el) => (el.data || []).some((t) => t.y.some((v) => v !== null)));
}"""
EMPTY_CHARTS = """() => Array.from(document.querySelectorAll('.chart'))
  .filter((el) => !(el.data || []).some((t) => t.y.some((v) => v !== null))).map((el) => el.dataset.metric)"""


@pytest.fixture(scope="module")
def remote() -> Iterator[ServerProcess]:
    proc = ServerProcess(*REMOTE_FLAGS)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def lab_server(remote: ServerProcess) -> Iterator[ServerProcess]:
    proc = ServerProcess("--backend", "remote", "--base-url", remote.base_url, command=("app.py",))
    yield proc
    proc.stop()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)  # a shared 2-core machine under load is slow to settle a page
    page.page_errors = []  # type: ignore[attr-defined]
    page.on("pageerror", lambda e: page.page_errors.append(str(e)))  # type: ignore[attr-defined]
    yield page
    context.close()


def emit(page: Page, event: str, data: dict) -> dict:
    return page.evaluate(
        "([event, data]) => new Promise((done) => window.servelab.socket.emit(event, data, done))", [event, data]
    )


def timeline_has(page: Page, kind: str, words: str, timeout_s: float = 90) -> None:
    page.wait_for_function(
        "([kind, words]) => Array.from(document.querySelectorAll('#timeline li.ev-' + kind))"
        ".some((li) => li.textContent.includes(words))",
        arg=[kind, words],
        timeout=timeout_s * 1000,
    )


def test_the_lab_drives_and_watches_a_remote_server(
    remote: ServerProcess, lab_server: ServerProcess, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    page.goto(f"{lab_server.base_url}/lab")
    page.wait_for_function("window.servelab && window.servelab.snapshots > 2")
    expect(page.locator("#engine-badge")).to_contain_text(f"remote: ServeLab at {remote.base_url}, model {MODEL}")
    expect(page.locator("#status-text")).to_have_text("serving")
    page.evaluate("""() => { window.maxQueue = 0;
      window.servelab.socket.on('metrics', (s) => { window.maxQueue = Math.max(window.maxQueue, s.queue_depth || 0); }); }""")

    # The prompt box streams through the app's pass-through to the remote.
    page.fill("#prompt-max", "8")
    page.click("#prompt-send")
    expect(page.locator("#prompt-timing")).to_contain_text("total", timeout=60_000)
    assert page.inner_text("#prompt-output").strip()

    # A lever the remote owns: read-only with the remote's value, and refused by name.
    owned = page.locator('.lever[data-key="block_size"]')
    expect(owned).to_contain_text("remote: 16 tokens, from vllm:cache_config_info")
    assert page.locator('[name="max_num_seqs"]').is_disabled()
    ack = emit(page, "set_levers", {"max_num_seqs": 8})
    assert (
        not ack["ok"] and ack["error"]["param"] == "max_num_seqs" and "belongs to the remote" in ack["error"]["message"]
    )
    ack = emit(page, "set_levers", {"request_rate": 8, "prompt_tokens": 64, "output_tokens": 16})
    assert ack["ok"] and ack["changed"]["request_rate"] == 8

    # The flood: the remote's queue fills, its 429s reach the timeline, every chart fills.
    page.click("#flood-button")
    page.wait_for_function("window.maxQueue > 0", timeout=60_000)
    timeline_has(page, "remote", "429 Too Many Requests")
    try:
        page.wait_for_function(EVERY_CHART_FILLED, timeout=90_000)
    except PlaywrightTimeout:
        pytest.fail(f"charts left empty: {page.evaluate(EMPTY_CHARTS)}")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "remote-lab.png"))

    # The remote stops mid-run: the page says so and keeps streaming.
    port = remote.port
    remote.stop()
    expect(page.locator("#status-text")).to_have_text("unreachable", timeout=30_000)
    expect(page.locator("#remote-banner")).to_contain_text("unreachable")
    timeline_has(page, "remote", "remote API: unreachable")
    timeline_has(page, "remote", "failed connections from the remote")  # the flood's, summed up
    before = page.evaluate("window.servelab.snapshots")
    page.wait_for_function(f"window.servelab.snapshots > {before + 5}")
    assert page.evaluate("window.servelab.lab.traffic.running")  # the lab's flood runs on, refused
    assert emit(page, "flood", {"action": "stop"})["ok"]

    # It comes back on the same port: the lab reconnects.
    monkeypatch.setattr(server_process, "free_port", lambda: port)
    back = ServerProcess(*REMOTE_FLAGS)
    try:
        try:
            expect(page.locator("#status-text")).to_have_text("serving", timeout=90_000)
        except AssertionError:
            pytest.fail(f"not reconnected: {lab_server.request('GET', '/ready')[1].decode()}")
        timeline_has(page, "remote", "remote API back")
    finally:
        back.stop()
    assert page.page_errors == []  # type: ignore[attr-defined]


def test_a_plan_for_this_machine_is_measured_on_the_remote_fleet(
    remote: ServerProcess, lab_server: ServerProcess, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Predict-then-run for a fleet (issue 29): the Plan page plans ServeLab's own engine on the
    `cpu` device, then sends the plan's traffic to the remote (`python -m engine serve`) and lays
    the remote's measured figures beside the prediction."""
    fleet = None
    if remote.proc.poll() is not None:  # the test before stopped it: the same remote again, on its port
        monkeypatch.setattr(server_process, "free_port", lambda: remote.port)
        fleet = ServerProcess(*REMOTE_FLAGS)
    try:
        deadline = time.monotonic() + 90
        while lab_server.request("GET", "/ready")[0] != 200:  # the lab has reconnected to it
            assert time.monotonic() < deadline, lab_server.request("GET", "/ready")[1].decode()
            time.sleep(0.5)
        _plan_and_measure(lab_server, page)
    finally:
        if fleet is not None:
            fleet.stop()


def _plan_and_measure(lab_server: ServerProcess, page: Page) -> None:
    page.goto(f"{lab_server.base_url}/plan")
    form = page.locator("#plan-form")
    form.locator("[name=model]").select_option("smollm2-135m")
    for name, value in {"rate": "1", "input_tokens": "32", "output_tokens": "16", "input_range_ratio": "0",
                        "ttft_slo_ms": "20000", "tpot_slo_ms": "2000", "max_gpus": "1", "price.cpu": "0.1"}.items():  # fmt: skip
        form.locator(f"[name='{name}']").fill(value)
    for box in form.locator("input[name=device], input[name=dtype]").all():
        box.set_checked(box.get_attribute("value") in ("cpu", "bf16"))
    form.locator("[name=disaggregation]").set_checked(False)
    form.locator("#plan-run").click()
    page.wait_for_function("window.servelabPlan.plan !== null", timeout=180_000)
    plan = page.evaluate("window.servelabPlan.plan")
    chosen = plan["cheapest"] or plan["closest"]
    assert chosen["device"] == "cpu" and chosen["servelab_command"].startswith("python -m engine serve --replicas 1")
    expect(page.locator("#plan-launch pre").first).to_contain_text("python -m engine serve")
    expect(page.locator("#plan-measure")).to_be_visible()
    page.locator("#plan-measure-s").fill("40")  # the metrics' 30 s window inside the traffic, then 10 s of readings
    page.locator("#plan-measure-run").click()
    page.wait_for_function(
        "window.servelabPlan.measured !== undefined"
        " || document.getElementById('plan-measure-status').textContent.startsWith('could not')",
        timeout=120_000,
    )
    assert page.evaluate("window.servelabPlan.measured !== undefined"), page.locator("#plan-measure-status").text_content()
    measured = page.evaluate("window.servelabPlan.measured")
    print({k: (chosen[k], measured[k]) for k in measured})  # predicted, measured
    assert measured["ttft_p50_s"] > 0 and measured["tpot_p50_s"] > 0 and measured["output_tok_s"] > 0, measured
    names = page.evaluate("document.getElementById('plan-chart').data.map(t => t.name)")
    assert "measured on the remote fleet" in names
    expect(page.locator("#plan-measure-table tr")).to_have_count(6)
    expect(page.locator("#plan-measure-status")).to_contain_text("measured over 40 s")
    assert page.page_errors == []  # type: ignore[attr-defined]
