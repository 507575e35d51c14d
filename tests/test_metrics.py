"""The metrics bus on synthetic step messages: vLLM's metric names, latencies from timestamps."""

from __future__ import annotations

import pickle

import pytest

from engine.clock import VirtualClock
from engine.core.engine_stats import EngineStats, field_values
from engine.core.sequence import RequestTimes
from engine.parallel.ranks import ShardStats
from engine.serving.replicas.messages import ReplicaStats, StepMessage, TokenDelta
from engine.serving.telemetry.metrics import MetricsBus

pytestmark = pytest.mark.unit


def delta(
    rid: str, n: int, finished: bool = False, reason: str | None = None, times: RequestTimes | None = None, first=False
) -> TokenDelta:
    return TokenDelta(rid, list(range(n)), "x" * n, finished, reason, 10, 0, times, first)


def test_latencies_counters_and_prometheus_names() -> None:
    clock = VirtualClock(100.0)
    bus = MetricsBus(clock)
    stats = ReplicaStats(
        running=2, waiting=1, kv_used_blocks=30, kv_total_blocks=120, num_preemptions=3,
        prefix_cache_queries=200, prefix_cache_hits=64,
    )
    # Arrival is the router's stamp; "queued" is when the replica's scheduler got the request.
    a = RequestTimes(99.0, queued=99.125, scheduled=99.25, first_token=99.5, tokens=[99.5])
    b = RequestTimes(99.0, queued=99.0625, scheduled=99.125, first_token=99.25, tokens=[99.25])
    # TTFT and queue time count on the delta that carries the first token, before the request ends.
    bus.observe(StepMessage(0, 99.5, [delta("a", 1, times=a, first=True), delta("b", 1, times=b, first=True)], stats))
    assert bus.histograms["time_to_first_token_seconds"].count == 2
    assert bus.histograms["e2e_request_latency_seconds"].count == 0
    a_end = RequestTimes(99.0, 99.125, 99.25, 99.5, tokens=[99.5, 99.75, 100.0], finished=100.0)
    bus.observe(StepMessage(0, 100.0, [delta("a", 2, True, "length", a_end)], stats=stats))
    b_end = RequestTimes(99.0, 99.0625, 99.125, 99.25, tokens=[99.25, 99.5], aborted=100.0)
    bus.observe(StepMessage(1, 100.0, [delta("b", 0, True, "abort", b_end)], state="draining"))
    # Replicas by state come from their owner (the fleet): a killed replica sends no message.
    states = {"ready": 1, "draining": 1}
    snap = bus.snapshot(queue_depth=4, rejected={"queue_full": 2}, replicas=states)
    assert snap.running == 2 and snap.kv_used_blocks == 30 and snap.queue_depth == 4
    assert snap.ttft_p50 == 0.25 and snap.ttft_p99 == 0.5 and snap.itl_p99 == 0.25
    assert snap.queue_time_p50 == 0.125 and snap.queue_time_p99 == 0.25
    assert snap.replicas == {"ready": 1, "draining": 1}
    text = bus.prometheus_text("smollm2", queue_depth=4, rejected={"queue_full": 2}, replicas=states)
    assert 'vllm:num_requests_running{model_name="smollm2"} 2' in text
    assert 'vllm:num_requests_waiting{model_name="smollm2"} 5' in text
    assert 'vllm:kv_cache_usage_perc{model_name="smollm2"} 0.25' in text
    assert 'vllm:generation_tokens_total{model_name="smollm2"} 4' in text
    assert 'vllm:prompt_tokens_total{model_name="smollm2"} 20' in text
    assert 'vllm:prefix_cache_hits_total{model_name="smollm2"} 64' in text
    assert 'vllm:time_to_first_token_seconds_bucket{model_name="smollm2",le="0.25"} 1' in text
    assert 'vllm:time_to_first_token_seconds_count{model_name="smollm2"} 2' in text
    assert 'vllm:inter_token_latency_seconds_count{model_name="smollm2"} 3' in text
    assert 'vllm:request_queue_time_seconds_sum{model_name="smollm2"} 0.375' in text
    assert 'vllm:e2e_request_latency_seconds_sum{model_name="smollm2"} 2.0' in text
    # The split: the router's central queue, then the wait inside the replica; they add up.
    assert 'servelab_central_queue_time_seconds_sum{model_name="smollm2"} 0.1875' in text
    assert 'servelab_replica_queue_time_seconds_sum{model_name="smollm2"} 0.1875' in text
    assert 'servelab_rejected_requests_total{reason="queue_full"} 2' in text
    assert "servelab_wasted_tokens_total 2" in text
    assert 'servelab_replicas{state="draining"} 1' in text


def test_replica_stats_cross_the_pipe_typed() -> None:
    """A live replica widens its engine's typed stats (EngineStats, sharding included) by what its
    process knows; the record pickles over the pipe as it is, every engine figure kept."""
    shards = ShardStats(tensor_parallel=2, tp_rank_pids=[41, 42], rank_pids=[41, 42])
    engine = EngineStats(**field_values(shards), running=2, kv_used_blocks=3, kv_total_blocks=10, spec_checks=5)
    stats = ReplicaStats.of_engine(engine, max_num_seqs=4, pid=41, copy_gbs=12.5)
    msg = pickle.loads(pickle.dumps(StepMessage(0, 1.0, stats=stats)))
    assert msg.stats == stats and msg.stats.free_blocks == 7 and msg.stats.tp_rank_pids == [41, 42]
    assert field_values(engine).items() <= field_values(msg.stats).items()
    assert (msg.stats.max_num_seqs, msg.stats.pid, msg.stats.copy_gbs) == (4, 41, 12.5)
    assert StepMessage(0, 1.0).stats is None  # a message with no step: the bus keeps the last stats


def test_tokens_landing_in_one_step_are_one_delivery_and_tpot_counts_them_all() -> None:
    """A speculating step lands its kept guesses with the model's token: the stream sees one
    delivery (one ITL sample, as vLLM counts it), and TPOT divides the time by every token."""
    clock = VirtualClock(10.0)
    bus = MetricsBus(clock)
    times = RequestTimes(9.0, scheduled=9.0, first_token=9.5, tokens=[9.5, 9.7, 9.7, 9.7, 9.9, 9.9], finished=9.9)
    bus.observe(StepMessage(0, 9.9, [delta("a", 6, True, "length", times, first=True)], ReplicaStats()))
    snap = bus.snapshot()
    assert bus.histograms["inter_token_latency_seconds"].count == 2  # 9.5 -> 9.7 -> 9.9
    assert snap.itl_p50 == pytest.approx(0.2)
    assert snap.tpot_p50 == pytest.approx(0.4 / 5)
