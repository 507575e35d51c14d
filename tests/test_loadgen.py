"""The load generator: vLLM-style arrivals and request shapes, metrics on hand-built records with
known answers, the HTTP target against a tiny fake SSE server, and one run through a real
Router and replica that overflows its queue."""

from __future__ import annotations

import json
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from engine.config import EngineConfig
from engine.serving.load.loadgen import (
    HttpTarget,
    LoadRequest,
    RouterTarget,
    arrival_times,
    make_requests,
    run_load,
)
from engine.serving.load.loadgen_metrics import RequestRecord, percentile, summarize
from engine.serving.replicas.replica import ReplicaHandle
from engine.serving.routing.router import Router, RouterConfig

pytestmark = pytest.mark.integration

# arrivals and shapes ----------------------------------------------------------------------------


def _gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0] + offsets, offsets)]


def test_poisson_arrivals_have_the_asked_rate() -> None:
    offsets = arrival_times(rate=5.0, num_requests=2000, seed=1)
    assert offsets == sorted(offsets) and offsets[0] > 0
    assert offsets[-1] == pytest.approx(2000 / 5.0)  # vLLM rescales the last arrival to n/rate
    gaps = _gaps(offsets)
    assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.01)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.1)  # exponential


def test_burstiness_shapes_the_spread_not_the_rate() -> None:
    def cv(burstiness: float) -> float:
        gaps = _gaps(arrival_times(10.0, 2000, burstiness, seed=2))
        assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.01)
        return statistics.stdev(gaps) / statistics.mean(gaps)

    bursty, regular = cv(0.25), cv(4.0)
    assert bursty > 1.5 and regular < 0.7  # CV of Gamma(k) is 1/sqrt(k): 2 and 0.5
    assert arrival_times(10.0, 5, float("inf")) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])


def test_infinite_rate_sends_everything_at_once_and_seeds_repeat() -> None:
    assert arrival_times(float("inf"), 7) == [0.0] * 7
    assert arrival_times(3.0, 50, 0.5, seed=9) == arrival_times(3.0, 50, 0.5, seed=9)
    assert arrival_times(3.0, 50, 0.5, seed=9) != arrival_times(3.0, 50, 0.5, seed=10)
    assert arrival_times(3.0, 0) == []


def test_request_shapes_stay_in_bounds_and_repeat_with_the_seed() -> None:
    requests = make_requests(300, prompt_tokens=200, output_tokens=64, range_ratio=0.5, seed=3)
    prompts = [len(r.prompt_token_ids) for r in requests]
    outputs = [r.max_tokens for r in requests]
    assert min(prompts) >= 100 and max(prompts) <= 300 and min(outputs) >= 32 and max(outputs) <= 96
    assert statistics.mean(prompts) == pytest.approx(200, rel=0.05)
    assert max(prompts) - min(prompts) > 150  # they do spread over the range
    assert all(100 <= t < 49000 for r in requests for t in r.prompt_token_ids)
    assert len({r.request_id for r in requests}) == 300
    again = make_requests(300, 200, 64, 0.5, seed=3)
    assert [r.prompt_token_ids for r in again] == [r.prompt_token_ids for r in requests]
    tiny = make_requests(50, prompt_tokens=1, output_tokens=1, range_ratio=0.9)
    assert all(len(r.prompt_token_ids) >= 1 and r.max_tokens >= 1 for r in tiny)
    fixed = make_requests(5, 20, 6, range_ratio=0.0)
    assert all(len(r.prompt_token_ids) == 20 and r.max_tokens == 6 for r in fixed)


# metrics ----------------------------------------------------------------------------------------


def _ok(i: int, send: float, tokens: list[float], output_tokens: int) -> RequestRecord:
    r = RequestRecord(i, f"r{i}", prompt_tokens=10, max_tokens=output_tokens)
    r.status, r.send_time, r.token_times = "ok", send, tokens
    r.end_time, r.output_tokens = tokens[-1], output_tokens
    return r


def _records() -> list[RequestRecord]:
    failed = RequestRecord(3, "r3", 10, 4, status="failed", error="replica stopped")
    rejected = RequestRecord(4, "r4", 10, 4, status="rejected", http_status=429, retry_after_s=2)
    return [
        _ok(0, 0.0, [0.1, 0.3, 0.6], 3),  # ttft 100, e2el 600, tpot 250, itl 200 300
        _ok(1, 1.0, [1.2, 1.3], 5),  # usage said 5 tokens in 2 chunks: ttft 200, e2el 300, tpot 25, itl 100
        _ok(2, 2.0, [2.05], 1),  # one token: ttft 50, e2el 50, no tpot, no itl
        failed,
        rejected,
    ]


def test_summary_numbers_match_vllm_definitions() -> None:
    s = summarize(_records(), duration_s=4.0, slos=None)
    assert (s["completed"], s["failed"], s["rejected"]) == (3, 1, 1)
    assert s["rejected_by_status"] == {"429": 1} and s["errors"] == {"replica stopped": 1}
    assert s["request_throughput"] == pytest.approx(0.75)
    assert s["output_throughput"] == pytest.approx(9 / 4)
    assert s["total_input_tokens"] == 30 and s["request_goodput"] is None
    expected = {
        "ttft": (350 / 3, 100, 198),  # sorted 50 100 200; p99 interpolates 98% of the way to 200
        "tpot": (137.5, 137.5, 247.75),
        "itl": (200, 200, 298),
        "e2el": (950 / 3, 300, 594),
    }
    for name, (mean, median, p99) in expected.items():
        got = (s[f"mean_{name}_ms"], s[f"median_{name}_ms"], s[f"p99_{name}_ms"])
        assert got == pytest.approx((mean, median, p99)), name


def test_goodput_counts_requests_meeting_every_slo() -> None:
    records = _records()
    # r0 misses tpot (250 > 100), r1 misses ttft; r2 passes (one token: tpot counts as 0)
    assert summarize(records, 4.0, {"ttft": 150, "tpot": 100})["request_goodput"] == pytest.approx(0.25)
    assert summarize(records, 4.0, {"e2el": 350})["request_goodput"] == pytest.approx(0.5)
    assert summarize(records, 4.0, {"ttft": 1e9})["request_goodput"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="itl"):
        summarize(records, 4.0, {"itl": 50})


def test_empty_run_reports_zeros_and_percentile_matches_numpy() -> None:
    s = summarize([RequestRecord(0, "x", 5, 5, status="failed")], 1.0, {"ttft": 10})
    assert s["completed"] == 0 and s["mean_ttft_ms"] == 0.0 and s["request_goodput"] == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([7.0], 99) == 7.0
    assert percentile([10.0, 0.0, 5.0], 25) == 2.5


# runner and HTTP target -------------------------------------------------------------------------


class _Stuck:
    """A target whose requests never finish on their own."""

    def send(self, request: LoadRequest, record: RequestRecord, stop: threading.Event) -> None:
        record.start(time.perf_counter())
        stop.wait()


def test_run_stops_itself_at_max_duration() -> None:
    requests = [LoadRequest(f"s{i}", [100], 1) for i in range(3)]
    started = time.perf_counter()
    records = run_load(_Stuck(), requests, [0.0, 0.0, 30.0], max_duration_s=0.3)
    took = time.perf_counter() - started
    assert took < 2.0, f"run_load took {took:.2f} s: within 2 s of its max_duration_s 0.3 (6.7x it)"
    assert [r.status for r in records] == ["failed"] * 3
    assert records[2].send_time is None  # its arrival was past the deadline


class _FakeOpenAI(BaseHTTPRequestHandler):
    bodies: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:  # the stdlib's name for it
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body | {"path": self.path, "auth": self.headers.get("Authorization")})
        if body["model"] == "busy":
            self.send_response(429)
            self.send_header("Retry-After", "3")
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "queue full"}}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if body["model"] == "broken":
            events = ['{"choices": [{"text": "a"}]}', '{"error": {"message": "replica died"}}']
        else:
            text = ["a", "", "b", "c"]  # an empty chunk (held-back bytes) is no token
            events = [json.dumps({"choices": [{"text": t}]}) for t in text]
            events.append(json.dumps({"choices": [], "usage": {"completion_tokens": 4}}))
        self.wfile.write(b": ping\n\n")
        for event in events:
            self.wfile.write(f"data: {event}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.01)
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: Any) -> None:
        pass


def test_http_target_reads_the_stream_rejections_and_in_band_errors() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        request = LoadRequest("h0", [101, 102, 103], 4)
        outcomes = {}
        for model in ("good", "busy", "broken"):
            target = HttpTarget(base, model, api_key="k")
            outcomes[model] = run_load(target, [request], [0.0], max_duration_s=10)[0]
    finally:
        server.shutdown()
        server.server_close()
    good, busy, broken = outcomes["good"], outcomes["busy"], outcomes["broken"]
    assert good.status == "ok" and good.output_tokens == 4 and len(good.token_times) == 3
    assert 0 < good.ttft <= good.e2el and len(good.itls) == 2 and min(good.itls) > 0.005
    assert busy.status == "rejected" and busy.http_status == 429 and busy.retry_after_s == 3.0
    assert broken.status == "failed" and broken.error == "replica died"
    sent = _FakeOpenAI.bodies[0]
    assert sent["path"] == "/v1/completions" and sent["auth"] == "Bearer k"
    assert sent["prompt"] == [101, 102, 103] and sent["max_tokens"] == 4 and sent["ignore_eos"] is True
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["temperature"] == 0


# one real replica -------------------------------------------------------------------------------


def test_router_run_overflows_the_queue_and_completes_the_admitted() -> None:
    # A generous heartbeat timeout: on a busy shared CPU one step can pass the default 2 s, and a
    # replica declared stuck leaves the router's queued requests waiting for max_duration_s.
    handle = ReplicaHandle(0, EngineConfig(dtype="bfloat16", max_num_seqs=4), heartbeat_timeout_s=30.0)
    router = None
    try:
        assert handle.wait_ready(), handle.error
        router = Router([handle], RouterConfig(queue_cap=2, deadline_s=None))
        requests = make_requests(12, prompt_tokens=20, output_tokens=6, seed=5)
        started = time.perf_counter()
        records = run_load(RouterTarget(router), requests, arrival_times(float("inf"), 12), max_duration_s=60)
        summary = summarize(records, time.perf_counter() - started, {"ttft": 60_000})
    finally:
        if router is not None:
            router.close()
        handle.stop()
    ok = [r for r in records if r.status == "ok"]
    rejected = [r for r in records if r.status == "rejected"]
    outcome = [(r.status, r.error) for r in records]
    assert ok and rejected and len(ok) + len(rejected) == 12, outcome  # at most 4 running + 2 queued
    assert all(r.http_status == 429 and r.error.startswith("queue_full") for r in rejected)
    assert all(r.retry_after_s >= 1 for r in rejected)
    assert all(r.output_tokens == r.max_tokens for r in ok)
    assert router.rejected == {"queue_full": len(rejected)}
    assert (summary["completed"], summary["rejected"], summary["failed"]) == (len(ok), len(rejected), 0)
    assert summary["total_output_tokens"] == sum(r.max_tokens for r in ok)
    assert 0 < summary["mean_ttft_ms"] <= summary["mean_e2el_ms"] and summary["mean_tpot_ms"] > 0
    assert summary["mean_itl_ms"] > 0 and summary["request_goodput"] == pytest.approx(summary["request_throughput"])
