"""The teaching app in a real browser: `python app.py` serving the real model in replica
processes, driven by Playwright over Debian's chromium. Screenshots of every page go to
tests/artifacts/ (git-ignored) for a person to look at."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from engine.levers import LEVERS
from tests.support.app_page import (
    ARTIFACTS,
    TOKEN,
    collect_events,
    lab_value,
    needs_chromium,
    open_as_instructor,
    predict_first_card,
    screenshot,
    set_levers,
    wait_for,
)
from tests.support.server_process import ServerProcess, kv_budget_mb
from web.lessons import TRACE_CHARTS, LessonLibrary

API_KEY = "outside-client-key"
PAGES = ["/", *(f"/steps/{lesson.step}" for lesson in LessonLibrary().lessons()), "/lab", "/authoring"]

pytestmark = [pytest.mark.browser, needs_chromium]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    # A small KV budget and batch keep the engine light on a 2-core machine; the levers still move.
    proc = ServerProcess(
        "--kv-budget-mb", kv_budget_mb(64), "--max-num-seqs", "16", command=("app.py",),
        env={"SERVELAB_INSTRUCTOR_TOKEN": TOKEN},
        api_keys=API_KEY,  # the pages keep working with keys set; outside clients need one
    )  # fmt: skip
    yield proc
    proc.stop()


def test_every_page_loads_shows_its_levers_and_streams_charts(server: ServerProcess, page: Page) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    lessons = {lesson.step: lesson for lesson in LessonLibrary().lessons()}
    for path in PAGES:
        open_as_instructor(page, server, path)
        if path.startswith("/steps/"):
            lesson = lessons[int(path.rsplit("/", 1)[1])]
            # The Plotly charts stream series; traces.js draws the others (tests/test_traces_page.py).
            keys, charts = list(lesson.meta["levers"]), [c for c in lesson.meta["charts"] if c not in TRACE_CHARTS]
            expect(page.locator("#decision .question")).to_have_text(lesson.meta["decision"]["question"])
            # The problem and the decision above the charts, the experiments next, then the rest
            # of the lesson, its last paragraph naming where its figures were measured.
            order = page.evaluate(
                "() => ['.lesson.problem', '#glossary', '#decision', '.charts', '.scenarios', '#figures-note'].map((s) => {"
                " const el = document.querySelector(s); return el && el.getBoundingClientRect().top; })"
            )
            assert order[:5] == sorted(order[:5]), (path, order)  # the metrics' spans before anything uses them
            expect(page.locator("#glossary dt")).to_have_count(len(lesson.metrics))
            if lesson.figures:
                assert order[5] > order[4], (path, order)
                expect(page.locator("#figures-note")).to_contain_text("measured on")
        elif path == "/lab":
            keys, charts = list(LEVERS), ["queue_depth", "kv_blocks", "ttft", "replicas", "batch_size"]
        elif path == "/authoring":
            keys, charts = [], []
            expect(page.locator("#authoring h1")).to_have_text("Writing a lesson")
        else:
            keys, charts = [], []
            expect(page.locator("#live-model")).to_contain_text("SmolLM2")
        for key in keys:
            expect(page.locator(f"[name={key}]")).to_have_count(1)
        for chart in charts:
            selector = f"document.getElementById('chart-{chart}')"
            before = page.evaluate(f"{selector}.data[0].x.length")
            wait_for(page, f"{selector}.data[0].x.length > {before} + 2", 10)
        if charts:  # the back-of-envelope panel is computed from a replica's measured facts
            expect(page.locator("[data-env=sequences_fit]")).not_to_have_text("…")
        name = path.strip("/").replace("/", "-") or "index"
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        assert page.errors == [], f"{path}: {page.errors}"  # type: ignore[attr-defined]


def test_snapshots_arrive_at_least_five_times_a_second(server: ServerProcess, page: Page) -> None:
    open_as_instructor(page, server, "/")
    start = page.evaluate("window.servelab.snapshots")
    time.sleep(3.0)
    assert page.evaluate("window.servelab.snapshots") - start >= 14  # 5/s over 3 s, less one tick of slack


def test_moving_levers_reconfigures_the_live_engine(server: ServerProcess, page: Page) -> None:
    open_as_instructor(page, server, "/steps/2")
    page.fill("[name=request_rate]", "3.5")
    page.dispatch_event("[name=request_rate]", "change")
    wait_for(page, "window.servelab.lab.levers.request_rate === 3.5", 10)
    # An engine lever travels to the replica process: its own stats report the new slot count.
    page.fill("[name=max_num_seqs]", "12")
    page.dispatch_event("[name=max_num_seqs]", "change")
    wait_for(page, "window.servelab.lab.levers.max_num_seqs === 12", 10)
    page.evaluate("window.servelab.last = null; window.servelab.socket.on('metrics', s => window.servelab.last = s)")
    wait_for(page, "window.servelab.last && window.servelab.last.max_num_seqs === 12", 10)
    # A refused value says why, next to the input, and the running config stays.
    page.fill("[name=queue_cap]", "0")
    page.dispatch_event("[name=queue_cap]", "change")
    expect(page.locator(".lever[data-key=queue_cap] .lever-error")).to_contain_text("at least 1")
    assert lab_value(page, "queue_cap") == 64
    page.fill("[name=max_num_seqs]", "16")
    page.dispatch_event("[name=max_num_seqs]", "change")
    wait_for(page, "window.servelab.lab.levers.max_num_seqs === 16", 10)


def test_gpu_count_beyond_the_devices_present_says_so(server: ServerProcess, page: Page) -> None:
    open_as_instructor(page, server, "/lab")
    devices = page.evaluate("window.servelab.lab.devices")
    page.fill("[name=gpu_count]", str(devices + 1))
    page.dispatch_event("[name=gpu_count]", "change")
    expect(page.locator(".lever[data-key=gpu_count] .lever-error")).to_contain_text(f"at most {devices} devices")
    assert lab_value(page, "gpu_count") == 1


def test_decision_question_explains_every_option(server: ServerProcess, page: Page) -> None:
    open_as_instructor(page, server, "/steps/5")
    wrong = page.locator(".option[data-correct=false]").first
    wrong.click()
    expect(wrong).to_have_class("option chosen wrong")
    expect(page.locator(".why").first).to_be_visible()
    expect(page.locator(".option.correct")).to_have_count(1)


def test_own_prompt_streams_through_the_queue(server: ServerProcess, page: Page) -> None:
    open_as_instructor(page, server, "/steps/1")
    page.fill("#prompt-text", "List three colours of the rainbow.")
    page.fill("#prompt-max", "12")
    page.click("#prompt-send")
    expect(page.locator("#prompt-timing")).to_contain_text("total", timeout=60_000)
    assert page.inner_text("#prompt-output").strip()
    # The browser's own TTFT beside the server's figure for the same request.
    expect(page.locator("#prompt-timing")).to_contain_text(" (server; ")


def test_flood_ttft_chart_climbs_with_the_queue_on_both_lines(server: ServerProcess, page: Page) -> None:
    """Two batch slots and a flood: the wait in the queue shows on the ttft chart, where the
    server's line (from the one arrival stamp) and the clients' line climb together."""
    open_as_instructor(page, server, "/steps/8")
    wait_for(page, "window.servelab.lab !== null", 30)
    before = page.evaluate(
        "(({max_num_seqs, output_tokens, prompt_tokens}) => ({max_num_seqs, output_tokens, prompt_tokens}))"
        "(window.servelab.lab.levers)"
    )
    page.evaluate("window.servelab.socket.emit('set_levers', {max_num_seqs: 2, output_tokens: 24, prompt_tokens: 64})")
    wait_for(page, "window.servelab.lab.levers.max_num_seqs === 2", 10)
    ttft = "document.getElementById('chart-ttft').data"
    last = "(t) => t.y.filter((v) => v !== null).slice(-1)[0] || 0"
    try:
        page.fill("#ramp-to", "20")
        page.fill("#ramp-s", "1")
        page.click("#flood-button")
        wait_for(page, f"({last})({ttft}[0]) > 1 && ({last})({ttft}[2]) > 1", 90)
        server_p50 = page.evaluate(f"({last})({ttft}[0])")
        client_p50 = page.evaluate(f"({last})({ttft}[2])")
        assert abs(server_p50 - client_p50) <= 0.1 * client_p50 + 0.05, (server_p50, client_p50)
        page.wait_for_timeout(5000)  # a few more seconds of the climb for the picture
        page.locator("#chart-ttft").screenshot(path=str(ARTIFACTS / "steps-8-ttft-chart.png"))
        screenshot(page, "steps-8-ttft-climbs.png")
    finally:
        page.click("#traffic-stop")
        page.evaluate("(levers) => window.servelab.socket.emit('set_levers', levers)", before)
    wait_for(page, f"window.servelab.lab.levers.max_num_seqs === {before['max_num_seqs']}", 10)


def test_flood_fills_a_small_queue_and_shows_429s(server: ServerProcess, page: Page) -> None:
    open_as_instructor(page, server, "/steps/8")
    page.evaluate(
        "window.servelab.maxQueue = 0; window.servelab.socket.on('metrics', s => "
        "window.servelab.maxQueue = Math.max(window.servelab.maxQueue, s.queue_depth))"
    )
    page.fill("[name=queue_cap]", "2")
    page.dispatch_event("[name=queue_cap]", "change")
    wait_for(page, "window.servelab.lab.levers.queue_cap === 2", 10)
    try:
        page.fill("#ramp-to", "40")
        page.fill("#ramp-s", "2")
        page.click("#flood-button")
        wait_for(page, "window.servelab.lab.traffic.running", 10)
        wait_for(page, "window.servelab.maxQueue > 0", 60)
        rejected = "document.getElementById('chart-rejected').data[0].y"
        wait_for(page, f"{rejected}.length && {rejected}[{rejected}.length - 1] > 0", 60)
        expect(page.locator("#traffic-refused")).not_to_have_text("0")
        screenshot(page, "steps-8-flood.png")
    finally:
        page.click("#traffic-stop")
        page.fill("[name=queue_cap]", "64")
        page.dispatch_event("[name=queue_cap]", "change")
    wait_for(page, "!window.servelab.lab.traffic.running && window.servelab.lab.levers.queue_cap === 64", 10)


def test_scenario_card_sets_levers_and_says_what_to_watch(server: ServerProcess, page: Page) -> None:
    open_as_instructor(page, server, "/steps/2")
    page.click("[data-kind=scenarios][data-scenario='0']")
    # Every card asks its prediction first (static/predict.js): the guess, then the levers.
    expect(page.locator(".predict-box .predict-question")).to_contain_text("Predict first:")
    page.locator(".predict-box .predict-option").first.click()
    expect(page.locator("#scenario-result")).to_contain_text("Watch:")
    wait_for(page, "window.servelab.lab.levers.burstiness === 0.2", 10)
    page.click("#traffic-stop")
    page.evaluate("window.servelab.socket.emit('set_levers', {burstiness: 1.0})")


def test_a_rebuild_lever_shows_its_status_and_comes_back(server: ServerProcess, page: Page) -> None:
    open_as_instructor(page, server, "/lab")
    page.select_option("[name=block_size]", "32")
    expect(page.locator("#status-text")).to_have_text("rebuilding", timeout=10_000)
    expect(page.locator("#status-text")).to_have_text("serving", timeout=180_000)
    assert lab_value(page, "block_size") == 32
    wait_for(page, "window.servelab.lab.envelope !== null", 30)


def test_a_watcher_without_the_token_cannot_change_anything(server: ServerProcess, page: Page) -> None:
    page.goto(f"{server.base_url}/steps/2")
    page.wait_for_function("window.servelab && window.servelab.role === 'viewer'")
    expect(page.locator("[name=request_rate]")).to_be_disabled()
    expect(page.locator("#role-badge")).to_have_text("watching")
    for event, payload in (("set_levers", "{request_rate: 9}"), ("flood", "{action: 'start'}")):
        ack = page.evaluate(f"new Promise(r => window.servelab.socket.emit({event!r}, {payload}, r))")
        assert ack["ok"] is False and ack["error"]["code"] == "forbidden", ack
    assert lab_value(page, "request_rate") != 9


def test_socketio_refuses_a_foreign_origin(server: ServerProcess) -> None:
    def handshake(origin: str) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/socket.io/?EIO=4&transport=polling", headers={"Origin": origin})
        status = conn.getresponse().status
        conn.close()
        return status

    assert handshake(f"http://127.0.0.1:{server.port}") == 200
    assert handshake("http://evil.example") == 400


def test_step_6_shards_the_live_model_and_shows_the_collectives(server: ServerProcess, page: Page) -> None:
    open_as_instructor(page, server, "/steps/6")
    page.click("#apply-preset")
    wait_for(page, "window.servelab.lab.levers.gpu_count === 2 && window.servelab.lab.status === 'serving'", 30)
    page.click("[data-kind=scenarios][data-scenario='0']")  # "Shard it in two"
    # A numeric prediction first (static/predict.js): the guess locked in, then the levers move.
    page.locator(".predict-box .predict-number input").fill("120")
    page.locator(".predict-box .predict-number button").click()
    expect(page.locator("#status-text")).to_have_text("rebuilding", timeout=10_000)
    expect(page.locator("#status-text")).to_have_text("serving", timeout=240_000)
    try:
        # The scenario started traffic: decode steps now pay all-reduces, and the panel says so.
        chart = "document.getElementById('chart-allreduce_ms').data[0].y"
        wait_for(page, f"{chart}.some(v => v > 0)", 120)
        expect(page.locator(".bn", has_text="All-reduce share of a step")).to_contain_text("60 of them")
        expect(page.locator(".bn", has_text="Per-device weight footprint")).to_contain_text(" / ")
        screenshot(page, "steps-6-sharded.png")
    finally:
        page.click("#traffic-stop")  # and the server's own KV budget back: step 6's is smaller
        set_levers(page, f"{{tensor_parallel: 1, gpu_count: 1, kv_budget_mb: {kv_budget_mb(64)}}}")
    expect(page.locator("#status-text")).to_have_text("serving", timeout=240_000)


def test_step_7_autoscales_from_the_warm_pool_and_drains_back(server: ServerProcess, page: Page) -> None:
    open_as_instructor(page, server, "/steps/7")
    last = "window.servelab.last"
    page.evaluate(f"{last} = null; window.servelab.socket.on('metrics', s => {last} = s)")
    # Start from an idle engine, so the autoscaler acts on this test's flood and nothing earlier.
    wait_for(page, f"{last} && {last}.queue_depth === 0 && {last}.running === 0", 240)
    collect_events(page)
    set_levers(page, "{gpu_count: 2, min_replicas: 1, max_replicas: 2, warm_pool: 1, provision_delay_s: 600}")
    wait_for(page, f"{last}.replicas.warm === 1", 180)
    try:
        set_levers(page, "{queue_cap: 64, max_num_seqs: 4}")
        page.evaluate("window.servelab.socket.emit('flood', {action: 'ramp', to: 12, over_s: 1})")
        scale_up = "window.servelab.events.some(e => e.kind === 'scale' && e.delta > 0)"
        wait_for(page, f"{scale_up} && {last}.replicas.ready === 2", 120)
        # Not the first scale event: on a slow CPU a "holding" one can come before it.
        expect(page.locator("#timeline .ev-scale", has_text="from the warm pool").first).to_be_visible()
        screenshot(page, "steps-7-scaled.png")
    finally:
        page.evaluate("window.servelab.socket.emit('flood', {action: 'stop'})")
        set_levers(page, "{max_replicas: 1, warm_pool: 0, max_num_seqs: 16}")
    # Scale-in is a drain: the second replica leaves without a cut stream.
    wait_for(page, f"{last}.replicas.ready === 1 && !{last}.replicas.draining && !{last}.replicas.warm", 180)
    assert page.evaluate("window.servelab.events.some(e => e.kind === 'scale' && e.delta < 0)")
    assert not page.evaluate("window.servelab.events.some(e => e.kind === 'cancelled')")
    set_levers(page, "{gpu_count: 1, queue_cap: 64}")


# Last in the module: their requests (and step 3's 1,500-token prompt) would otherwise sit in the
# 30 s metrics window that the flood test compares against its clients' own TTFT.


def test_with_keys_set_outside_clients_need_one_and_a_page_session_is_not_a_key(server: ServerProcess) -> None:
    """The page's cookie and header pass; no key, a wrong key, a forged cookie, or the cookie
    without the page's header (what another site's form could send) get 401 with the body named."""
    body = {"prompt": "The sky is", "max_tokens": 2}
    status, payload = server.request("POST", "/v1/completions", body)
    assert status == 401 and json.loads(payload)["error"]["code"] == "unauthorized"
    assert server.request("POST", "/v1/completions", body, {"Authorization": "Bearer wrong"})[0] == 401
    assert server.request("POST", "/v1/completions", body, {"Authorization": f"Bearer {API_KEY}"})[0] == 200
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("GET", "/steps/1")
    response = conn.getresponse()
    response.read()
    cookie = response.getheader("Set-Cookie") or ""
    conn.close()
    assert cookie.startswith("servelab_page=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    session = cookie.split(";", 1)[0]
    page_headers = {"Cookie": session, "X-ServeLab-Page": "1"}
    assert server.request("POST", "/v1/completions", body, page_headers)[0] == 200
    assert server.request("POST", "/v1/completions", body, {"Cookie": session})[0] == 401
    forged = session[: session.index(".") + 1] + "0" * 64
    assert server.request("POST", "/v1/completions", body, {"Cookie": forged, "X-ServeLab-Page": "1"})[0] == 401


def test_step_3_long_prompt_is_answered_with_keys_set(server: ServerProcess, page: Page) -> None:
    open_as_instructor(page, server, "/steps/3")
    # From an idle engine: step 7's flood can leave its queue (up to 64 requests) still draining,
    # and on a 2-core AVX2 CPU in fp32 that outlasts the 30 s queue deadline of a prompt behind it.
    last = "window.servelab.last"
    idle = (
        f"{last} && {last}.queue_depth === 0 && {last}.running === 0 && {last}.waiting === 0 && "
        f"{last}.kv_used_blocks === 0 && {last}.replicas.ready >= 1 && !{last}.replicas.draining"
    )
    page.evaluate("window.servelab.last = null; window.servelab.socket.on('metrics', s => window.servelab.last = s)")
    try:
        wait_for(page, idle, 240)
    except Exception as exc:  # a fleet that never goes idle: say what it holds
        snapshot = page.evaluate("JSON.stringify(window.servelab.last)")
        raise AssertionError(f"the engine never went idle: {snapshot[:4000]}") from exc
    page.click("#long-prompt")
    try:
        expect(page.locator("#prompt-timing")).to_contain_text("answered in", timeout=120_000)
    except AssertionError as exc:  # say what the fleet looked like: which replica held what
        snapshot = page.evaluate("JSON.stringify(window.servelab.last)")
        raise AssertionError(f"{exc}\nthe latest snapshot: {snapshot[:4000]}") from None


def test_step_9_shares_a_system_prompt_and_the_hit_rate_shows_it(server: ServerProcess, page: Page) -> None:
    """Step 9 (written in markdown alone, issue 41): its first card gives every request one
    512-token system prompt, and the prefix_hit_rate chart, the engine's own counters, climbs."""
    open_as_instructor(page, server, "/steps/9")
    predict_first_card(page, "0.8")
    wait_for(page, "window.servelab.lab.levers.system_prompt_tokens === 512", 10)
    # The rebuild to two replicas and the first misses come first; then the hits.
    wait_for(page, "(() => { const d = document.getElementById('chart-prefix_hit_rate').data[0].y;"
                   " return d.length && d[d.length - 1] > 30; })()", 240)
    page.click("#traffic-stop")
    page.evaluate("window.servelab.socket.emit('set_levers', {system_prompt_tokens: 0})")


def test_step_11_guesses_ahead_and_the_speculation_chart_shows_the_guesses_kept(
    server: ServerProcess, page: Page
) -> None:
    """Step 11 (issue 43): its first card turns speculation on over quoting prompts; the page's
    speculation chart, the engine's own counts, shows most guesses kept, and the lever is live."""
    open_as_instructor(page, server, "/steps/11")
    page.click("#apply-preset")  # the step's settings: quoting prompts, one stream at a time, no guessing
    wait_for(page, "window.servelab.lab.levers.prompt_style === 'quote'", 10)
    predict_first_card(page, "0.05")
    wait_for(page, "window.servelab.lab.levers.num_speculative_tokens === 4", 10)
    wait_for(page, "(() => { const d = document.getElementById('chart-speculation').data[0].y;"
                   " return d.length && d[d.length - 1] > 30; })()", 180)
    page.click("#traffic-stop")
    page.evaluate("window.servelab.socket.emit('set_levers', {num_speculative_tokens: 0, prompt_style: 'random'})")
    wait_for(page, "window.servelab.lab.levers.num_speculative_tokens === 0", 10)
    assert lab_value(page, "prompt_style") == "random"


def test_step_10_splits_prefill_from_decode_and_the_swimlanes_show_the_handoff(
    server: ServerProcess, page: Page
) -> None:
    """Step 10 (issue 43): its split card rebuilds the fleet into a prefill and a decode replica;
    the lab's requests then cross by handoff, drawn as its own phase in their swimlanes."""
    open_as_instructor(page, server, "/steps/10")
    page.click("#apply-preset")
    wait_for(page, "window.servelab.lab.levers.prompt_tokens === 1500", 10)
    wait_for(page, "window.servelab.lab.status === 'serving'", 240)  # the preset's KV budget rebuilt them
    page.click("[data-kind=scenarios][data-scenario='1']")
    box = page.locator(".predict-box")
    expect(box.locator(".predict-question")).to_contain_text("Predict first:")
    box.locator(".predict-option").first.click()
    expect(page.locator("#scenario-result")).to_contain_text("Watch:")
    wait_for(page, "window.servelab.lab.levers.prefill_gpus === 1 && window.servelab.lab.levers.decode_gpus === 1", 10)
    page.click("#traffic-start")
    wait_for(page, "window.servelabTraces.rows().some((r) => r.handoff && r.handoff[1] !== null)", 240)
    expect(page.locator("#chart-swimlanes")).to_contain_text("KV handoff")  # its legend
    page.click("#traffic-stop")
    page.evaluate("window.servelab.socket.emit('set_levers', {prefill_gpus: 0, decode_gpus: 0})")
    wait_for(page, "window.servelab.lab.levers.prefill_gpus === 0", 10)
