"""The aging row of /failures (issue 15, part B) on the real model, in one in-process engine: a few
requests of low priority among a steady stream of ordinary ones. With aging on, waiting raises
their priority and the oldest waiter gets a reserved slot past starvation_s; off, they wait as
long as anyone better keeps arriving: the max and p99.9 TTFT grow while the median looks fine."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from engine.clock import VirtualClock
from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.llm_engine import LLMEngine
from engine.core.scheduler import Scheduler
from engine.core.sequence import RequestTimes, Sequence
from engine.sampling_params import SamplingParams
from engine.serving.telemetry.metrics import window_percentile
from tests.support.failure_traffic import prompt, ratio, said

pytestmark = pytest.mark.integration

TRAFFIC_S = 8.0  # how long ordinary requests keep the waiting line full (aging on, a 2-core AVX2 CPU served its slowest in 2 s)
STARVATION_S = 0.5  # the reserved slot's bound, shorter than the traffic so it shows


@pytest.fixture(scope="module")
def engine() -> Iterator[LLMEngine]:
    engine = LLMEngine(EngineConfig(max_num_seqs=2, starvation_s=STARVATION_S, kv_budget_mb=64, num_threads=1))
    engine.add_request("warm-up", None, SamplingParams(max_tokens=2), prompt(0, 16))  # the first steps are slow
    while engine.has_work():
        engine.step()
    yield engine
    engine.close()


def steady_stream_with_low_priority(engine: LLMEngine, tag: str) -> tuple[list[float], list[float]]:
    """TTFTs of the ordinary requests and of the three low-priority ones."""
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    low = [engine.add_request(f"{tag}-low-{i}", None, params, prompt(i, 16), priority=10) for i in range(3)]
    ordinary: list[Sequence] = []
    end = time.monotonic() + TRAFFIC_S
    while time.monotonic() < end:
        while sum(s.priority == 0 for s in engine.scheduler.waiting) < 3:  # more than the free slots, always
            n = len(ordinary)
            ordinary.append(engine.add_request(f"{tag}-{n}", None, params, prompt(100 + n, 16)))
        engine.step()
    while engine.has_work():
        engine.step()
    return [s.times.ttft or 0.0 for s in ordinary], [s.times.ttft or 0.0 for s in low]


def test_aging_off_low_priority_waits_while_the_median_looks_fine(engine: LLMEngine) -> None:
    fair_ordinary, fair_low = steady_stream_with_low_priority(engine, "aging-on")
    engine.reconfigure(aging=False)
    try:
        unfair_ordinary, unfair_low = steady_stream_with_low_priority(engine, "aging-off")
    finally:
        engine.reconfigure(aging=True)
    fair, unfair = sorted(fair_ordinary + fair_low), sorted(unfair_ordinary + unfair_low)
    print(  # what the row shows, for the record (pytest -s)
        f"aging on: TTFT max {max(fair):.2f} s, p50 {window_percentile(fair, 50):.3f} s over {len(fair)}; "
        f"off: max {max(unfair):.2f} s, p50 {window_percentile(unfair, 50):.3f} s over {len(unfair)}"
    )
    assert len(unfair) >= 20  # enough requests for the median to be an ordinary one
    # off: served only once the stream stopped
    low_max = max(unfair_low)
    assert ratio(low_max, TRAFFIC_S) >= 0.9, said("low-priority TTFT max, aging off / the traffic's length", low_max,
                                                  TRAFFIC_S, ">= 0.9x")
    # the max TTFT (and p99.9, its neighbour here) grows
    assert ratio(max(unfair), max(fair)) >= 3, said("TTFT max, aging off / on", max(unfair), max(fair), ">= 3x")
    p999_off, p999_on = window_percentile(unfair, 99.9) or 0.0, window_percentile(fair, 99.9) or 0.0
    assert ratio(p999_off, p999_on) >= 3, said("TTFT p99.9, aging off / on", p999_off, p999_on, ">= 3x")
    p50_off, p50_on = window_percentile(unfair, 50) or 0.0, window_percentile(fair, 50) or 0.0
    # while the median looks fine
    assert 0.5 <= ratio(p50_off, p50_on) <= 2.0, said("TTFT p50, aging off / on", p50_off, p50_on, "0.5x to 2x")
    # Back on, nothing is held: no KV block in use, no request left.
    assert not engine.has_work() and engine.kv.num_used_blocks == 0


def test_the_scheduler_drops_a_late_waiter_unstarted_or_counts_its_prefill() -> None:
    """The replica's deadline recheck, on a virtual clock: a waiter whose deadline passed is dropped
    before any prefill (its blocks never taken); told not to drop it, the scheduler prefills it and
    counts the prompt tokens spent past the deadline."""
    clock = VirtualClock()
    config = EngineConfig(block_size=4, max_num_seqs=1, prefix_caching=False)
    sched = Scheduler(config, BlockManager(64, 4, False), clock)
    params = SamplingParams(max_tokens=50)
    running = Sequence("running", [7] * 8, params, RequestTimes(arrival=0.0))
    dropped = Sequence("dropped", [7] * 12, params, RequestTimes(arrival=0.0), deadline=1.0)
    paid = Sequence("paid", [7] * 12, params, RequestTimes(arrival=0.0), deadline=1.0, drop_if_expired=False)
    for s in (running, dropped, paid):
        sched.add(s)
    assert sched.schedule().seqs == [running]  # one slot: the others wait
    clock.advance(2.0)
    out = sched.schedule()
    assert out.expired == [dropped] and not dropped.block_table and sched.num_expired == 1
    sched.remove(running)
    out = sched.schedule()
    assert out.seqs == [paid] and sched.expired_prefill_tokens == 12
