"""Issue 15, part A: the lab's clients behave like clients (over HTTP, through the lab's proxy,
to the app's own server), and four defences break and mend on the live engine: one real
replica process of the real model, one server, one lab for the whole module.

Each row runs its defence off, then back on, on the same lab, and measures only that phase's
requests (their records' send times, counters read before and after). Thresholds are counts
and ratios, never absolute latencies. After each row the fleet goes idle and holds no KV block
(`kv_used_blocks` back to 0) and still runs exactly its one replica process."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from werkzeug.serving import make_server

from engine.config import EngineConfig
from engine.lab.live.lab import LiveLab
from engine.lab.live.lab_clients import Attempt
from engine.launch.api_server import RequestLog
from engine.serving.load.loadgen import HttpTarget, make_requests, now, run_load
from engine.serving.load.loadgen_metrics import RequestRecord
from engine.serving.replicas.replica_process import replica_pids
from engine.serving.routing.router import RouterConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig
from engine.serving.telemetry.snapshot import FleetSnapshot
from tests.support.waiting import wait_for
from web import create_api_app

pytestmark = pytest.mark.integration

# The server's heartbeat interval here: well inside the proxy idle timeouts below, and a hang-up
# is seen within two writes (the first after it succeeds), so within 0.2 s.
PING_S = 0.1
# Burstiness 10: nearly even gaps, so a few seconds of flood hold a predictable number of requests.
BASE = {"prompt_tokens": 32, "output_tokens": 24, "max_num_seqs": 8, "queue_cap": 64, "deadline_s": 600.0,
        "burstiness": 10.0, "proxy_idle_timeout_s": 0.0, "client_patience_s": 0.0, "client_retries": 0}


DEFENCES_ON = {"stream_flush": True, "heartbeat": True, "cancel_on_disconnect": True, "retry_jitter": True}
SOLO_TOKENS = 48  # the calibration request's length


@dataclass
class Live:
    lab: LiveLab
    fleet: Fleet
    server_url: str
    pids: list[int]
    solo_s: float = 0.0  # one 48-token request alone, end to end: this machine's speed just now

    def calibrate(self) -> float:
        """Time one request alone, now: other work on this machine moves its speed 5x within
        minutes, so a row sizes its waits by a reading taken just before it."""
        target = HttpTarget(self.server_url, self.fleet.model_name)
        solo = run_load(target, make_requests(1, 32, SOLO_TOKENS, 0.0, seed=8), [0.0], max_duration_s=120)[0]
        assert solo.e2el is not None, solo.error
        self.solo_s = solo.e2el
        return self.solo_s

    def tokens_lasting(self, seconds: float) -> int:
        """A mean output length whose shortest draw (half the mean) still lasts `seconds` alone."""
        return max(16, min(2000, round(2 * seconds * SOLO_TOKENS / self.solo_s)))


def serve(fleet: Fleet, **options: Any) -> tuple[Any, str]:
    server = make_server("127.0.0.1", 0, create_api_app(fleet, PING_S, **options), threaded=True,
                         request_handler=RequestLog)
    threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True).start()
    return server, f"http://127.0.0.1:{server.port}"


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    fleet = Fleet(EngineConfig(max_num_seqs=BASE["max_num_seqs"]), RouterConfig(queue_cap=64, deadline_s=600),
                  FleetConfig(replicas=1))
    lab = LiveLab(fleet, dict(BASE))
    server, url = serve(fleet)
    lab.connect(url)
    try:
        assert fleet.wait_ready()
        pids = replica_pids(os.getpid())
        assert len(pids) == 1
        # A fresh replica's first steps carry one-off costs: spend them before any row measures.
        target = HttpTarget(url, fleet.model_name)
        run_load(target, make_requests(2, 32, 8, seed=9), [0.0, 0.0], max_duration_s=120)
        yield Live(lab, fleet, url, pids)
    finally:
        lab.stop()
        server.shutdown()
        fleet.stop()
    assert wait_for(lambda: not replica_pids(os.getpid()), 20)


@pytest.fixture(autouse=True)
def defences_on(request: pytest.FixtureRequest) -> None:
    """Every row starts from the ordinary levers with its defences on, whatever a row before left."""
    if "live" in request.fixturenames:
        request.getfixturevalue("live").lab.set_levers(dict(BASE) | DEFENCES_ON)


def settle(live: Live) -> FleetSnapshot:
    """Back to the ordinary levers, then wait for the fleet to go idle: nothing queued or
    running, every KV block freed, the one replica process still the only one."""
    live.lab.set_levers(dict(BASE))
    idle = wait_for(lambda: _idle(live.fleet.snapshot()), 90, 0.2)
    snap = live.fleet.snapshot()
    assert idle, {k: getattr(snap, k) for k in ("queue_depth", "running", "waiting", "kv_used_blocks")}
    assert snap.kv_used_blocks == 0
    assert replica_pids(os.getpid()) == live.pids
    return snap


def _idle(snap: FleetSnapshot) -> bool:
    return snap.queue_depth == 0 and snap.running == 0 and snap.waiting == 0 and snap.kv_used_blocks == 0


def flood(live: Live, levers: dict[str, Any], seconds: float) -> float:
    """Traffic at the levers for `seconds`; returns when it started (the clients' clock)."""
    live.lab.set_levers(levers)
    start = now()
    live.lab.flood("start")
    time.sleep(seconds)
    live.lab.flood("stop")
    return start


def records_since(live: Live, start: float) -> list[RequestRecord]:
    return live.lab.traffic.clients.recent(start)


def attempts_since(live: Live, start: float) -> list[Attempt]:
    return [a for a in live.lab.traffic.counts.recent() if a.sent >= start]


def server_mean_ttft(live: Live) -> tuple[float, int]:
    histogram = live.fleet.bus.histograms["time_to_first_token_seconds"]
    return histogram.total, histogram.count


# stream_flush ----------------------------------------------------------------------------------


def _ttft_share(records: list[RequestRecord]) -> float:
    """The median over completed requests of the clients' TTFT / e2e (1: the first token came with the last)."""
    shares = [r.ttft / r.e2el for r in records if r.status == "ok" and r.e2el]  # type: ignore[operator]
    assert len(shares) >= 3, [r.status for r in records]
    return statistics.median(shares)


def test_stream_flush_off_clients_see_ttft_near_e2e_while_the_server_ttft_stays_small(live: Live) -> None:
    phases = {}
    for flush in (False, True):  # broken, then the defence back on
        start = flood(live, {"stream_flush": flush, "request_rate": 2.0, "output_tokens": 48}, 3.0)
        settle(live)
        records = [r for r in records_since(live, start) if r.status == "ok"]
        # Per request, the server's TTFT (its `servelab` figures) over the one its client saw.
        server_share = statistics.median(r.server_ttft_s / r.ttft for r in records)  # type: ignore[operator]
        phases[flush] = (_ttft_share(records), server_share)
    print(phases)
    # (client TTFT / e2e, server TTFT / client TTFT), medians over the requests, per stream_flush
    seen = f"stream_flush off {phases[False]}, on {phases[True]}"
    # held by the proxy: the first token reaches the user with the last
    assert phases[False][0] >= 0.8, f"client TTFT / e2e with flush off: expected >= 0.8; {seen}"
    # while the server's own TTFT saw none of that wait
    assert phases[False][1] < 0.5, f"server / client TTFT with flush off: expected < 0.5; {seen}"
    # flushed: the first token comes long before the last
    assert phases[True][0] < 0.5, f"client TTFT / e2e with flush on: expected < 0.5; {seen}"
    # and the two lines meet again (within the HTTP hops of a short TTFT)
    assert phases[True][1] > 0.5, f"server / client TTFT with flush on: expected > 0.5; {seen}"


def test_serve_stream_flush_false_holds_the_stream_in_the_server_itself(live: Live) -> None:
    """`python -m engine serve --stream-flush false`: no lab proxy; the server's SSE writer holds it."""
    for flush, check in ((False, lambda s: s >= 0.8), (True, lambda s: s < 0.5)):
        server, url = serve(live.fleet, stream_flush=flush)
        try:
            target = HttpTarget(url, live.fleet.model_name)
            records = run_load(target, make_requests(3, 32, 24, seed=5), [0.0, 0.3, 0.6], max_duration_s=60)
        finally:
            server.shutdown()
        share = _ttft_share(records)
        assert check(share), f"client TTFT / e2e {share:.2f} with stream_flush {flush}: expected >= 0.8 off, < 0.5 on"
    settle(live)


# heartbeat + proxy_idle_timeout_s ---------------------------------------------------------------


def test_heartbeat_off_streams_waiting_in_the_queue_are_cut_before_their_first_token(live: Live) -> None:
    # Five requests at once before one batch slot, each lasting at least twice the proxy's idle
    # timeout: the four behind the first wait past it; the heartbeat (every 0.1 s) keeps them open.
    idle = max(0.8, live.calibrate() / 8)
    levers = {"max_num_seqs": 1, "output_tokens": live.tokens_lasting(2 * idle), "proxy_idle_timeout_s": idle,
              "request_rate": 0.0}
    cuts = {}
    for heartbeat in (False, True):
        before = live.lab.snapshot(live.fleet.snapshot())["client_cut_before_first_token"]
        live.lab.set_levers(levers | {"heartbeat": heartbeat})
        start = now()
        records = live.lab.traffic.burst(5)
        assert wait_for(lambda records=records: all(r.status != "pending" for r in records), 120, 0.1)
        settle(live)
        after = live.lab.snapshot(live.fleet.snapshot())["client_cut_before_first_token"]
        outcomes = [a.outcome for a in attempts_since(live, start)]
        assert after - before == outcomes.count("cut")
        cuts[heartbeat] = (outcomes.count("cut"), outcomes.count("ok"))
    print(levers, live.solo_s, cuts)
    assert cuts[False][0] >= 3  # cut at the proxy, counted by the clients
    assert cuts[True] == (0, 5)  # the same waits, kept open by `: ping`


# cancel_on_disconnect + client_patience_s ----------------------------------------------------------


def test_cancel_on_disconnect_off_requests_whose_clients_gave_up_run_on_for_nobody(live: Live) -> None:
    # Six requests at once before one batch slot, their clients 1 s patient: the first is served
    # (at least 2 s of tokens at this machine's speed); the other five give up while it runs.
    live.calibrate()
    levers = {"max_num_seqs": 1, "output_tokens": live.tokens_lasting(2.0), "request_rate": 0.0,
              "client_patience_s": 1.0}
    bus = live.fleet.bus
    wasted, gave_up, per_s = {}, {}, {}
    for cancel in (False, True):
        w0, g0 = bus.wasted_tokens, live.lab.traffic.counts.gave_up
        live.lab.set_levers(levers | {"cancel_on_disconnect": cancel})
        records = live.lab.traffic.burst(6)
        if not cancel:  # the orphans get the slot once the first is done, and run for nobody
            assert wait_for(lambda w0=w0: bus.wasted_tokens > w0, 60, 0.1), live.lab.traffic.counts.fields()
            first = bus.wasted_tokens
            time.sleep(2.0)
            assert bus.wasted_tokens > first  # rising
            assert len(bus.gone_requests()) >= 4
        else:
            assert wait_for(lambda records=records: all(r.status != "pending" for r in records), 60, 0.1)
            time.sleep(1.0)
        per_s[cancel] = live.lab.snapshot(live.fleet.snapshot())["wasted_tokens_per_s"]
        wasted[cancel], gave_up[cancel] = bus.wasted_tokens - w0, live.lab.traffic.counts.gave_up - g0
        live.lab.set_levers({"cancel_on_disconnect": True})  # back on: the orphans are cancelled too
        settle(live)
    print(levers, live.solo_s, wasted, gave_up, per_s)
    assert not bus.gone_requests()
    assert gave_up[False] >= 4 and gave_up[True] >= 4  # the clients' patience ran out, both times
    assert wasted[False] > 0 and per_s[False] > 0
    assert wasted[True] <= 3  # hung up in the queue: each aborted before it reached the replica


# retry_jitter + client_retries -----------------------------------------------------------------------


def clustered_share(times: list[float], among: list[float] | None = None, window_s: float = 0.2, others: int = 5) -> float:
    """The measure: the share of these moments that have at least `others` more moments of
    `among` (these same ones by default; a quarter of the burst of 20) within +-window_s/2, a
    0.2 s window around each. Clients returning in step score near 1; the same clients spread over
    seconds score near 0."""
    crowd = times if among is None else among
    crowded = sum(sum(abs(u - t) <= window_s / 2 for u in crowd) - 1 >= others for t in times)
    return crowded / len(times)


def test_retry_jitter_off_refused_clients_return_in_synchronized_waves(live: Live) -> None:
    # 20 requests at once into a queue of 2 in front of one batch slot: most are refused, and
    # each client retries after its Retry-After, up to 6 times.
    levers = {"max_num_seqs": 1, "output_tokens": 24, "queue_cap": 2, "client_retries": 6, "request_rate": 0.0}
    shares = {}
    for jitter in (False, True):
        live.lab.set_levers(levers | {"retry_jitter": jitter})
        start = now()
        records = live.lab.traffic.burst(20)
        time.sleep(7.0)
        live.lab.set_levers({"client_retries": 0})  # the clients waiting to retry stop there
        retries = [a for a in attempts_since(live, start) if a.number >= 2]
        # A refused retry counted when its client came back, not when the answer landed: a busy
        # machine's HTTP hops spread the answers (CI: sends 0.70 clustered, their refusals' ends 0.32).
        # And its crowd is every client that came back with it, whatever its answer: late waves
        # are small (a few clients left), and counting only the refused among them scored tight
        # waves of 2-6 at 0.46 (sends within 0.05 s of each other, jitter off); this way 0.77-0.97
        # over 7 runs, and 0.0-0.2 with jitter on.
        sent = [a.sent for a in retries]
        refused = [a.sent for a in retries if a.outcome == "refused"]
        assert len(retries) >= 10 and len(refused) >= 5, len(retries)
        shares[jitter] = (clustered_share(sent), clustered_share(refused, among=sent))
        settle(live)
        # A request served on a retry: its TTFT counts from its first attempt (Retry-After >= 1 s).
        served_late = [r for r in records if r.status == "ok" and r.attempts >= 2]
        assert all(r.ttft >= 1.0 for r in served_late), [r.ttft for r in served_late]  # type: ignore[operator]
    counts = live.lab.traffic.counts
    text = live.fleet.metrics_text()
    assert f"servelab_client_requests_sent_total {counts.sent}" in text
    assert f"servelab_client_requests_refused_total {counts.refused}" in text
    snap = live.lab.snapshot(live.fleet.snapshot())
    assert snap["client_sent_total"] == counts.sent and snap["client_refused_total"] == counts.refused
    print(shares)
    # Measured off: 0.9-1.0 alone, 0.64-0.70 on a loaded CI machine; 40-50 retries drawn at random over 3-4 s score
    # ~0.1 (0.4 at worst in 200 draws). So: off in waves, on spread out, and off well above on in
    # the same run.
    for off, on in zip(shares[False], shares[True], strict=True):
        assert off >= 0.5 and on <= 0.5 and off - on >= 0.3, shares


# the pieces on their own (no model) -----------------------------------------------------------------


def test_serve_takes_stream_flush_as_a_flag() -> None:
    import subprocess
    import sys

    def run(*flags: str) -> subprocess.CompletedProcess[str]:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        command = [sys.executable, "-m", "engine", "serve", *flags]
        env = {**os.environ, "PYTHONPATH": root}
        return subprocess.run(command, check=False, capture_output=True, text=True, timeout=60, cwd=root, env=env)

    bad = run("--stream-flush", "sometimes")  # argparse refuses it by name, before anything loads
    assert bad.returncode == 2 and "argument --stream-flush: invalid" in bad.stderr, bad.stderr


def test_retry_after_without_jitter_is_the_exact_drain_estimate_read_at_each_refusal() -> None:
    from engine.clock import VirtualClock
    from engine.sampling_params import SamplingParams
    from engine.serving.routing.defences import Defences
    from engine.serving.routing.request_queue import QueuedRequest, RequestQueue

    clock, defences = VirtualClock(0.0), Defences()
    queue = RequestQueue(cap=6, deadline_s=None, clock=clock, defences=defences)
    for i in range(6):
        assert queue.offer(QueuedRequest(f"r{i}", [1], SamplingParams())).admitted
    for _ in range(2):  # two dequeues 1 s apart: 2 per 1 s measured, so 4 queued drain in 2 s
        clock.advance(0.5)
        queue.pop()
    clock.advance(0.5)
    jittered = {queue.retry_after() for _ in range(200)}
    defences.update(retry_jitter=False)
    exact = {queue.retry_after() for _ in range(200)}
    assert exact == {2}  # every refused client told the same: they come back together
    assert len(jittered) >= 3 and min(jittered) == 1  # full jitter: 1 .. twice the estimate


def test_tokens_made_after_the_client_left_count_as_wasted_in_the_window() -> None:
    from engine.clock import VirtualClock
    from engine.core.sequence import RequestTimes
    from engine.serving.replicas.messages import StepMessage, TokenDelta
    from engine.serving.telemetry.metrics import MetricsBus

    clock = VirtualClock(100.0)
    bus = MetricsBus(clock)

    def step(finished: bool = False) -> None:
        times = RequestTimes(arrival=99.0, tokens=[100.0] * 3)
        delta = TokenDelta("r1", [7], "", finished, "length" if finished else None, 4, 0, times=times)
        bus.observe(StepMessage(0, clock.now(), [delta]))
        clock.advance(1.0)

    step()
    assert bus.wasted_tokens == 0
    bus.client_gone("r1")
    step()
    step(finished=True)
    assert bus.wasted_tokens == 2 and not bus.gone_requests()
    assert bus.snapshot().wasted_tokens_per_s == pytest.approx(2 / 30)
    clock.advance(31.0)
    assert bus.snapshot().wasted_tokens_per_s == 0.0  # out of the window; the total stays
    assert "servelab_wasted_tokens_total 2" in bus.prometheus_text("m")
