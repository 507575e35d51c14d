"""Simulated mode in a real browser: `python app.py` (the live engine in replica processes) with
the lab switched to the simulated fleet, driven by Playwright over Debian's chromium."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.server_process import ServerProcess, kv_budget_mb
from web.lessons import CHARTS, TRACE_CHARTS

CHROMIUM = "/usr/bin/chromium"
TOKEN = "teacher-secret"
SEVENTY_B_LINK = "/lab?executor=sim&model=llama-3.1-70b&device=h100&gpu_count=8&tensor_parallel=8&request_rate=50"
BADGE = "simulated: H100 x 8, Llama-3.1-70B, TP8"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "--kv-budget-mb", kv_budget_mb(64), "--max-num-seqs", "16", command=("app.py",), env={"SERVELAB_INSTRUCTOR_TOKEN": TOKEN}
    )
    yield proc
    proc.stop()


@pytest.fixture
def page(browser: Browser, server: ServerProcess) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    # Every test leaves the lab live, as the next one expects.
    page.evaluate("window.servelab.socket.emit('set_levers', {executor: 'live'})")
    page.wait_for_function("window.servelab.lab.executor === 'live'")
    context.close()
    assert errors == []


def open_lab(page: Page, server: ServerProcess, path: str = "/lab") -> None:
    joiner = "&" if "?" in path else "?"
    page.goto(f"{server.base_url}{path}{joiner}token={TOKEN}")
    page.wait_for_function("window.servelab && window.servelab.role === 'instructor' && window.servelab.snapshots > 0")


def set_levers(page: Page, levers: str) -> None:
    """Through the socket, as a scenario card does; fails the test on a refusal."""
    page.evaluate(
        f"new Promise((ok, no) => window.servelab.socket.emit('set_levers', {levers}, a => a.ok ? ok() : no(a.error.message)))"
    )


def wait_for(page: Page, expression: str, timeout_s: float = 30) -> None:
    page.wait_for_function(expression, timeout=timeout_s * 1000)


def test_a_link_runs_70b_on_8_h100s_and_every_chart_panel_and_badge_follows_the_simulated_fleet(
    server: ServerProcess, page: Page
) -> None:
    open_lab(page, server, SEVENTY_B_LINK)
    wait_for(page, "window.servelab.lab.executor === 'sim' && window.servelab.lab.levers.tensor_parallel === 8")
    levers = page.evaluate("window.servelab.lab.levers")
    assert (levers["model"], levers["device"], levers["gpu_count"], levers["request_rate"]) == ("llama-3.1-70b", "h100", 8, 50)
    for chart in (c for c in CHARTS if c not in TRACE_CHARTS):  # traces.js draws the others (test_traces_page)
        selector = f"document.getElementById('chart-{chart}')"
        before = page.evaluate(f"{selector}.data[0].x.length")
        wait_for(page, f"{selector}.data[0].x.length > {before} + 2", 10)
    # Simulated seconds on the x-axis, and simulated traffic flowing through the fleet.
    assert page.evaluate("document.getElementById('chart-queue_depth').layout.xaxis.title.text") == "simulated time"
    wait_for(page, "window.servelab.lab.traffic.sent > 50 && window.servelab.lab.sim.finished > 0")
    badges = page.locator(".chart-card .mode-badge, #bottlenecks .mode-badge, #shape .mode-badge, #envelope .mode-badge")
    assert badges.count() == len(CHARTS) + 3
    for i in range(badges.count()):
        expect(badges.nth(i)).to_be_visible()
        expect(badges.nth(i)).to_have_text(BADGE)
    expect(page.locator("#bottleneck-list")).to_contain_text("17.6 GB of weights per device, on each of 8")
    expect(page.locator("#engine-badge")).to_contain_text("Llama-3.1-70B")
    # The page's own link to the experiment reproduces it in a fresh browser.
    href = page.get_attribute("#share-link", "href")
    assert href is not None and "executor=sim" in href and "model=llama-3.1-70b" in href
    set_levers(page, "{executor: 'live'}")
    wait_for(page, "window.servelab.lab.executor === 'live'")
    open_lab(page, server, href)
    wait_for(page, "window.servelab.lab.executor === 'sim' && window.servelab.lab.levers.gpu_count === 8")
    again = page.evaluate("window.servelab.lab.levers")
    assert {k: again[k] for k in ("model", "device", "tensor_parallel", "request_rate")} == {
        "model": "llama-3.1-70b", "device": "h100", "tensor_parallel": 8, "request_rate": 50
    }


def test_70b_on_one_h100_is_refused_next_to_the_lever_and_tp2_is_accepted(server: ServerProcess, page: Page) -> None:
    open_lab(page, server)
    set_levers(page, "{executor: 'sim', model: 'llama-3.1-8b', device: 'h100', gpu_count: 2, tensor_parallel: 1}")
    wait_for(page, "window.servelab.lab.executor === 'sim'")
    run = page.evaluate("window.servelab.lab.run")
    page.select_option("[name=model]", "llama-3.1-70b")
    error = page.locator(".lever[data-key=model] .lever-error")
    expect(error).to_contain_text("needs 141 GB of weights; 1 x h100 hold 80 GB")
    # Nothing else changed: the same simulated fleet runs the same levers.
    assert page.evaluate("window.servelab.lab.levers.model") == "llama-3.1-8b"
    assert page.evaluate("window.servelab.lab.run") == run
    expect(page.locator("[name=model]")).to_have_value("llama-3.1-8b")
    page.select_option("[name=tensor_parallel]", "2")
    wait_for(page, "window.servelab.lab.levers.tensor_parallel === 2")
    expect(page.locator(".lever[data-key=tensor_parallel] .lever-error")).to_have_text("")
    page.select_option("[name=model]", "llama-3.1-70b")
    wait_for(page, "window.servelab.lab.levers.model === 'llama-3.1-70b' && window.servelab.lab.badge.includes('Llama-3.1-70B')")
    expect(error).to_have_text("")


def test_the_recommended_shape_follows_the_levers_across_the_thresholds(server: ServerProcess, page: Page) -> None:
    open_lab(page, server)
    set_levers(page, "{executor: 'sim', sim_speed: 10, model: 'llama-3.1-8b', device: 'h100', gpu_count: 1, "
                     "tensor_parallel: 1, request_rate: 1, prompt_tokens: 200, output_tokens: 64, ttft_target_ms: 1000}")
    stage = page.locator("#shape-stage")
    expect(stage).to_have_text("1. One GPU serving one request")
    # The pace asked, and the pace achieved where this machine falls behind it.
    expect(page.locator("#status-text")).to_contain_text("simulating at ")
    expect(page.locator("#status-text")).to_contain_text("10x")
    set_levers(page, "{gpu_count: 8, tensor_parallel: 8}")
    set_levers(page, "{model: 'llama-3.1-70b'}")
    expect(stage).to_have_text("4. Tensor-parallel sharding")
    expect(page.locator("#shape-reasons")).to_contain_text("weights 141 GB > 80 GB per H100: shard, TP >= 2")
    set_levers(page, "{prompt_tokens: 16000, ttft_target_ms: 200, request_rate: 2}")
    expect(stage).to_have_text("5. Prefill/decode disaggregation", timeout=30_000)
    expect(page.locator("#shape-reasons")).to_contain_text("while decode has headroom")
    expect(page.locator("#shape-reasons")).to_contain_text("split prefill from decode")


def test_switching_modes_back_and_forth_leaves_nothing_running_behind_the_page(server: ServerProcess, page: Page) -> None:
    for n in range(1, 9):  # the mode switch is on every step page, once
        status, body = server.request("GET", f"/steps/{n}")
        assert status == 200 and body.count(b'name="executor"') == 1, n
    open_lab(page, server)
    page.evaluate("window.servelab.socket.emit('flood', {action: 'start'})")  # live traffic at the lever's rate
    wait_for(page, "window.servelab.lab.running.live_traffic === true")
    for _ in range(2):
        page.select_option("[name=executor]", "sim")
        wait_for(page, "window.servelab.lab.executor === 'sim' && window.servelab.lab.running.sim_pacers === 1")
        assert page.evaluate("window.servelab.lab.running.live_traffic") is False  # the live flood stopped
        wait_for(page, "window.servelab.lab.sim.sim_time_s > 1")
        page.select_option("[name=executor]", "live")
        wait_for(page, "window.servelab.lab.executor === 'live' && window.servelab.lab.running.sim_pacers === 0")
        assert page.evaluate("window.servelab.lab.running.live_traffic") is False
    # The stream is the live engine's again: its snapshots keep coming, unbadged.
    count = page.evaluate("window.servelab.snapshots")
    wait_for(page, f"window.servelab.snapshots > {count} + 5", 5)
    expect(page.locator("#bottlenecks .mode-badge")).to_be_hidden()


def test_the_plan_page_draws_the_frontier_hovers_a_shape_and_a_click_opens_it_in_the_simulated_lab(
    server: ServerProcess, page: Page
) -> None:
    open_lab(page, server)  # the instructor's token, kept in this browser for the lab the click opens
    page.goto(f"{server.base_url}/plan")
    # The "how accurate" note reads bench/sim_latency.py's record: the medians' errors and the step's alone.
    expect(page.locator("#plan-accuracy table")).to_contain_text("rows with a known configuration")
    expect(page.locator("#plan-accuracy-step")).to_contain_text("decode step alone")
    form = page.locator("#plan-form")
    form.locator("[name=model]").select_option("llama-3.1-8b")
    for name, value in {"rate": "8", "input_tokens": "400", "output_tokens": "60", "ttft_slo_ms": "300", "tpot_slo_ms": "20",
                        "max_gpus": "4"}.items():  # fmt: skip
        form.locator(f"[name={name}]").fill(value)
    for box in form.locator("input[name=device], input[name=dtype]").all():
        box.set_checked(box.get_attribute("value") in ("h100", "fp8"))
    form.locator("[name=disaggregation]").set_checked(False)
    form.locator("#plan-run").click()
    wait_for(page, "window.servelabPlan.plan !== null", 180)
    plan = page.evaluate("window.servelabPlan.plan")
    assert plan["feasible"] and {p["device"] for p in plan["points"]} == {"h100"}
    assert {p["dtype"] for p in plan["points"]} == {"fp8"} and not any(p["prefill_replicas"] for p in plan["points"])
    names = page.evaluate("document.getElementById('plan-chart').data.map(t => t.name)")
    assert "h100 fp8 aggregated" in names and "cheapest that meets both targets" in names
    expect(page.locator("#plan-verdict")).to_contain_text("cheapest that meets both SLOs")
    expect(page.locator("#plan-launch pre").first).to_contain_text("vllm serve")
    expect(page.locator("#plan-launch pre").nth(1)).to_contain_text("sglang.launch_server")
    # Hover the starred point with the mouse, then click it: the lab opens on that shape.
    chosen = plan["points"][plan["cheapest"]["id"]]
    page.evaluate("window.scrollTo(0, 0)")  # the Plan button scrolled the form's foot into view
    x, y = page.evaluate(
        """([x, y]) => { const gd = document.getElementById('plan-chart'), r = gd.getBoundingClientRect();
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        return [r.left + xa._offset + xa.l2p(x), r.top + ya._offset + ya.l2p(y)]; }""",
        [chosen["tok_s_per_user"], chosen["output_tok_s_per_gpu"]],
    )
    page.mouse.move(x, y)
    expect(page.locator("#plan-chart .hovertext").first).to_contain_text("tok/s/GPU")
    expect(page.locator("#plan-chart .hovertext").first).to_contain_text(f"{chosen['gpus']} h100")
    page.mouse.click(x, y)
    page.wait_for_url("**/lab?executor=sim*")
    wait_for(page, "window.servelab && window.servelab.lab && window.servelab.lab.executor === 'sim'")
    wait_for(page, f"window.servelab.lab.levers.gpu_count === {chosen['gpus']}")
    levers = page.evaluate("window.servelab.lab.levers")
    assert (levers["device"], levers["tensor_parallel"], levers["pipeline_parallel"], levers["weight_dtype"]) == (
        "h100", chosen["tp"], chosen["pp"], "fp8"
    )
    assert levers["max_num_seqs"] == chosen["max_num_seqs"] and levers["model"] == "llama-3.1-8b"


def test_step_7_plans_its_own_traffic_at_scale(server: ServerProcess, page: Page) -> None:
    open_lab(page, server, "/steps/7")
    levers = page.evaluate("window.servelab.lab.levers")
    page.locator("#plan-panel-model").select_option("llama-3.1-8b")
    page.locator("#plan-panel-link").click()
    page.wait_for_url("**/plan?*")
    form = page.locator("#plan-form")
    expect(form.locator("[name=model]")).to_have_value("llama-3.1-8b")
    assert float(form.locator("[name=rate]").input_value()) == max(1, levers["request_rate"])
    expect(form.locator("[name=input_tokens]")).to_have_value(str(levers["prompt_tokens"]))
    expect(form.locator("[name=ttft_slo_ms]")).to_have_value(str(levers["ttft_target_ms"]))
    page.goto(f"{server.base_url}/lab")  # the page fixture leaves the lab from a page that has one
    page.wait_for_function("window.servelab && window.servelab.snapshots > 0")
