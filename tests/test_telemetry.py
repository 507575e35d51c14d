"""Telemetry that tells the truth: the server's TTFT, queue time and e2e latency start at the
request's one arrival time (the router's admission stamp), so they include the wait in the
central queue, and the lab's clients, timing at their end of the stream, agree with them."""

from __future__ import annotations

import http.client
import json
import re
import time

import pytest

from engine.clock import VirtualClock
from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.lab.live.lab import LiveLab
from engine.sampling_params import SamplingParams
from engine.serving.load.loadgen import HttpTarget, arrival_times, make_requests, run_load
from engine.serving.replicas.messages import StepMessage
from engine.serving.replicas.replica_requests import ReplicaRequests
from engine.serving.routing.request_queue import QueuedRequest, RequestQueue
from engine.serving.routing.router import RouterConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig
from engine.serving.telemetry.metrics import MetricsBus
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.integration

MODEL = "SmolLM2-135M-Instruct"


def test_a_request_that_waited_in_the_queue_reports_ttft_at_least_the_wait() -> None:
    clock = VirtualClock(100.0)
    queue = RequestQueue(cap=4, deadline_s=None, clock=clock)
    engine = LLMEngine(EngineConfig(dtype="float32", kv_budget_mb=32), clock=clock)
    bus = MetricsBus(clock)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    assert queue.offer(QueuedRequest("waited", [400 + i for i in range(20)], params)).admitted
    wait = 7.5
    clock.advance(wait)  # the request sits in the central queue
    head = queue.pop()
    assert head is not None and head.arrival == 100.0
    engine.add_request(
        head.request_id, None, head.params, prompt_token_ids=head.prompt_token_ids, arrival_time=head.arrival
    )
    requests = ReplicaRequests(engine)  # what a replica process reports of its engine's outputs
    while engine.has_work():
        deltas = [requests.delta(out) for out in engine.step()]
        bus.observe(StepMessage(0, clock.now(), deltas))
        clock.advance(0.25)  # each step takes a quarter second of virtual time
    ttft = bus.histograms["time_to_first_token_seconds"]
    queued = bus.histograms["request_queue_time_seconds"]
    central = bus.servelab_histograms["central_queue_time_seconds"]
    assert ttft.count == 1 and ttft.total >= wait
    assert queued.count == 1 and queued.total == pytest.approx(wait)
    assert central.total == pytest.approx(wait)
    assert bus.histograms["e2e_request_latency_seconds"].total == pytest.approx(wait + 0.5)
    snap = bus.snapshot()
    assert snap.ttft_p50 >= wait and snap.queue_time_p50 == pytest.approx(wait)
    assert engine.kv.num_used_blocks == 0


def _histogram(text: str, name: str) -> tuple[float, int]:
    total = float(re.search(rf"^vllm:{name}_sum{{[^}}]*}} (\S+)$", text, re.MULTILINE).group(1))
    count = int(re.search(rf"^vllm:{name}_count{{[^}}]*}} (\S+)$", text, re.MULTILINE).group(1))
    return total, count


def _mean_delta(before: str, after: str, name: str) -> float:
    (s0, c0), (s1, c1) = _histogram(before, name), _histogram(after, name)
    assert c1 > c0
    return (s1 - s0) / (c1 - c0)


def test_server_ttft_matches_what_clients_measure_when_requests_queue() -> None:
    """The case from the issue: 12 streams at once into one replica with 2 batch slots."""
    # A generous deadline: on a busy machine the 30 s default would expire requests this case needs.
    srv = ServerProcess("--replicas", "1", "--max-num-seqs", "2", "--queue-cap", "64", "--deadline-s", "600")
    try:
        target = HttpTarget(srv.base_url, MODEL)
        # A lone request first: its TTFT is a prefill with no queue in front.
        solo = run_load(target, make_requests(1, 200, 8, 0.0, seed=1), [0.0], max_duration_s=120)[0]
        assert solo.status == "ok", solo.error
        _, before = srv.request("GET", "/metrics")
        records = run_load(target, make_requests(12, 200, 48, 0.0, seed=2), arrival_times(float("inf"), 12), 300)
        _, after = srv.request("GET", "/metrics")
        assert all(r.status == "ok" for r in records), [r.error for r in records]
        before, after = before.decode(), after.decode()
        clients = sum(r.ttft for r in records) / len(records)  # type: ignore[misc]
        server = _mean_delta(before, after, "time_to_first_token_seconds")
        queued = _mean_delta(before, after, "request_queue_time_seconds")
        print(f"clients' mean TTFT {clients:.3f} s, server's {server:.3f} s, server's queue time {queued:.3f} s")
        assert clients > 1.0  # the case does queue: most requests wait seconds
        assert server == pytest.approx(clients, rel=0.10)
        # The queue time accounts for the wait: what a client waited beyond an unqueued prefill.
        assert queued == pytest.approx(clients - solo.ttft, rel=0.15)  # type: ignore[operator]
        # A stream's last chunk carries the server's own figures for that request (the prompt box shows them).
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
        body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, "stream": True}
        sent = time.monotonic()
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        lines = [raw.decode().strip() for raw in conn.getresponse()]
        elapsed = time.monotonic() - sent
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        timing = chunks[-1]["servelab"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert 0 < timing["queue_time_s"] <= timing["ttft_s"] <= timing["e2e_s"] < elapsed
        e2e = _mean_delta(before, after, "e2e_request_latency_seconds")
        assert e2e == pytest.approx(sum(r.e2el for r in records) / len(records), rel=0.10)  # type: ignore[misc]
    finally:
        srv.stop()


def test_the_live_snapshot_ttft_climbs_with_a_backlog_and_the_clients_line_follows() -> None:
    fleet = Fleet(EngineConfig(dtype="bfloat16", max_num_seqs=2), RouterConfig(queue_cap=64), FleetConfig(replicas=1))
    lab = LiveLab(fleet, {"max_num_seqs": 2, "prompt_tokens": 32, "output_tokens": 24, "request_rate": 20.0})
    try:
        assert fleet.wait_ready()
        lab.flood("start")
        # The clock starts at the first token: a fresh replica's first step carries one-off costs.
        deadline = time.monotonic() + 60
        while fleet.bus.histograms["time_to_first_token_seconds"].count == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        start = time.monotonic()
        snap: dict = {}
        while time.monotonic() - start < 10:
            time.sleep(0.25)
            snap = lab.snapshot(fleet.snapshot())
            if (snap["ttft_p50"] or 0) > 1.0 and (snap["queue_time_p50"] or 0) > 0.5:
                break
        print({k: snap[k] for k in ("ttft_p50", "client_ttft_p50", "queue_depth", "queue_time_p50")})
        assert snap["ttft_p50"] > 1.0, snap["ttft_p50"]
        assert snap["queue_time_p50"] > 0.5
        # The clients' line: sampled a moment later so both windows hold the same requests.
        lab.traffic.stop()
        time.sleep(0.5)
        snap = lab.snapshot(fleet.snapshot())
        assert snap["client_ttft_p50"] == pytest.approx(snap["ttft_p50"], rel=0.10)
    finally:
        lab.stop()
        fleet.stop()
