"""The queue, router and scheduler rows of /failures (issue 15, part B) on the live engine: one
fleet of two real replica processes serving the real model, each defence switched off (the failure
shows in its metric, past a stated threshold), then back on (the metric stays healthy, and no KV
block or process is left behind). Thresholds are counts and ratios, never absolute latencies."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.serving.replicas.replica import ReplicaHandle
from engine.serving.replicas.replica_process import replica_pids
from engine.serving.routing.defences import Defences
from engine.serving.routing.router import RouterConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig
from tests.support.failure_traffic import (
    Outcome,
    Traffic,
    assert_idle_and_whole,
    percentile,
    prompt,
    ratio,
    said,
    seed_of,
    sleep_until,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

ENGINE = EngineConfig(kv_budget_mb=160)  # room for every prompt below; a small cache loads faster
QUEUE_CAP, DEADLINE_S = 64, 300.0  # the router's config object is changed in place: keep these apart


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    def patient_replica(*args: Any, **kwargs: Any) -> ReplicaHandle:
        # These rows are not about the stall watchdog: a 2 s pause of this shared 2-core machine
        # (other sessions' work) must not fail a replica in the middle of a measurement.
        return ReplicaHandle(*args, heartbeat_timeout_s=10.0, **kwargs)

    router = RouterConfig(queue_cap=QUEUE_CAP, deadline_s=DEADLINE_S)
    fleet = Fleet(ENGINE, router, FleetConfig(replicas=2), replica_factory=patient_replica)
    try:
        assert fleet.wait_ready(180), [r.error for r in fleet.replicas]
        yield fleet
    finally:
        fleet.stop()
        assert all(not r.process.is_alive() for r in fleet.replicas)


@pytest.fixture(autouse=True)
def restored(fleet: Fleet) -> Iterator[list[int]]:
    """Each test starts from the defaults and must leave the fleet whole once its defence is on again."""
    pids = replica_pids(os.getpid())
    assert len(pids) == 2
    yield pids
    fleet.defences.update(**dict.fromkeys(Defences.names(), True))
    fleet.reconfigure(
        max_num_seqs=ENGINE.max_num_seqs, max_batched_tokens=ENGINE.max_batched_tokens, chunked_prefill=True
    )
    fleet.router.reconfigure(queue_cap=QUEUE_CAP, deadline_s=DEADLINE_S)
    assert_idle_and_whole(fleet, pids)


def served(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.times is not None]


def test_queue_bound_off_the_queue_is_a_delay_line(fleet: Fleet, restored: list[int]) -> None:
    fleet.reconfigure(max_num_seqs=2)
    fleet.router.reconfigure(queue_cap=4)

    def burst(tag: str) -> tuple[list[Outcome], int]:
        fleet.router.max_depth_seen = 0
        traffic = Traffic(fleet, tag)
        for i in range(40):
            traffic.submit(prompt(seed_of(tag) + i, 24), 8)
        return traffic.collect(), fleet.router.max_depth_seen

    bounded, bounded_depth = burst("bound-on")
    fleet.defences.update(queue_bound=False)
    unbounded, unbounded_depth = burst("bound-off")
    fleet.defences.update(queue_bound=True)
    refused_on = sum(o.refused == "queue_full" for o in bounded)
    ttft_on = max(o.ttft or 0.0 for o in served(bounded))
    ttfts_off = [o.ttft or 0.0 for o in unbounded]
    print(
        f"queue_bound on: {refused_on} refused, depth {bounded_depth}, TTFT max {ttft_on:.2f} s; "
        f"off: 0 refused, depth {unbounded_depth}, TTFT max {max(ttfts_off):.2f} s"
    )
    assert refused_on >= 20 and bounded_depth <= 4  # the cap holds and refuses the rest at once
    assert all(o.refused is None for o in unbounded) and len(served(unbounded)) == 40  # no refusal at all
    assert unbounded_depth >= 5 * 4  # the queue grew far past the cap
    # waiting grows with the line, with no limit
    assert ratio(max(ttfts_off), ttft_on) >= 2.5, said("TTFT max, queue_bound off / on", max(ttfts_off), ttft_on, ">= 2.5x")
    first, last = ttfts_off[:4], ttfts_off[-10:]  # the first served at once; the last waited the line out
    late, early = sum(last) / len(last), sum(first) / len(first)
    assert ratio(late, early) >= 3, said("mean TTFT, the last 10 / the first 4 served", late, early, ">= 3x")


def test_deadline_recheck_off_prefills_requests_already_late(fleet: Fleet) -> None:
    fleet.reconfigure(max_num_seqs=1)
    fleet.router.reconfigure(deadline_s=1.0)

    def burst(tag: str) -> tuple[list[Outcome], int, int, int]:
        before = fleet.snapshot()
        traffic = Traffic(fleet, tag)
        for i in range(24):
            traffic.submit(prompt(seed_of(tag) + i, 48), 12)
        outcomes = traffic.collect()
        time.sleep(0.6)  # the replicas' next stats carry their counters
        after = fleet.snapshot()
        at_replicas = sum(r.stats.num_expired for r in fleet.replicas if r.stats)
        return (
            outcomes,
            after.expired_prefill_tokens - before.expired_prefill_tokens,
            after.rejected.get("deadline", 0) - before.rejected.get("deadline", 0),
            at_replicas,
        )

    fleet.defences.update(deadline_recheck=False)
    late, late_prefill, late_dropped, _ = burst("recheck-off")
    print(f"deadline_recheck off: {late_prefill} prompt tokens prefilled past their deadline")
    assert late_dropped == 0 and len(served(late)) == 24  # every late request was still served
    assert late_prefill >= 48 * 10  # and its prompt prefilled after its deadline had passed

    fleet.defences.update(deadline_recheck=True)
    checked, checked_prefill, checked_dropped, _ = burst("recheck-on")
    assert checked_prefill == 0  # nothing late was prefilled
    assert checked_dropped >= 10 and sum(o.error == "deadline passed while queued" for o in checked) == checked_dropped

    # Per-replica inboxes: the late requests wait inside the replicas, whose scheduler drops them.
    expired_before = sum(r.stats.num_expired for r in fleet.replicas if r.stats)
    fleet.defences.update(central_queue=False)
    _, inboxed_prefill, inboxed_dropped, expired_after = burst("recheck-replica")
    fleet.defences.update(central_queue=True)
    assert inboxed_prefill == 0 and inboxed_dropped >= 10
    assert expired_after - expired_before >= 10


def test_central_queue_off_a_request_waits_behind_a_long_prefill(fleet: Fleet) -> None:
    # The long prompt's prefill time on this machine now, so the short ones land inside it under
    # any load: a short one (32 tokens) is done well before the next comes.
    # A short one beside it warms the other replica too (a replica's first step is slow).
    lone = Traffic(fleet, "central-lone")
    lone.submit(prompt(seed_of("central-lone"), 1500), 1)
    lone.submit(prompt(seed_of("central-lone") + 1, 32), 1)
    long_s = lone.collect()[0].ttft or 1.0

    def rounds(tag: str) -> tuple[list[Outcome], int]:
        traffic, depths, done = Traffic(fleet, tag), [0], threading.Event()

        def watch() -> None:
            while not done.wait(0.03):
                depths.append(max(fleet.snapshot().replica_queue_depths, default=0))

        watcher = threading.Thread(target=watch)
        watcher.start()
        shorts = []
        for r in range(2):
            t0 = time.monotonic()
            traffic.submit(prompt(seed_of(tag) + 100 * r, 1500), 1)  # a long prompt lands
            for i in range(4):  # then short ones keep coming while it is prefilled
                sleep_until(t0 + long_s / 5 * (i + 1))
                shorts.append(traffic.submit(prompt(seed_of(tag) + 100 * r + i + 1, 32), 1))
            traffic.collect()
        done.set()
        watcher.join()
        return shorts, max(depths)

    central, central_depth = rounds("central-on")
    fleet.defences.update(central_queue=False)
    inboxes, inbox_depth = rounds("central-off")
    fleet.defences.update(central_queue=True)
    p99_on = percentile([o.ttft or 0.0 for o in served(central)], 99)
    p99_off = percentile([o.ttft or 0.0 for o in served(inboxes)], 99)
    print(
        f"central_queue (long prefill {long_s:.2f} s) on: short TTFT p99 {p99_on:.2f} s, "
        f"replica depth max {central_depth}; off: {p99_off:.2f} s, {inbox_depth}"
    )
    assert len(served(central)) == len(served(inboxes)) == 8
    # short requests sat behind the long prefill
    assert ratio(p99_off, p99_on) >= 2.0, said("short TTFT p99, central_queue off / on", p99_off, p99_on, ">= 2x")
    assert inbox_depth >= 2 and inbox_depth > central_depth  # while the other replica idled


def test_prefix_aware_routing_off_halves_the_hit_rate(fleet: Fleet) -> None:
    def shared_preambles(tag: str, seed: int) -> tuple[float, float]:
        """5 preambles of 384 tokens, each sent 3 times in turn, one request at a time."""
        stats = [r.stats for r in fleet.replicas if r.stats]
        queries0 = sum(s.prefix_cache_queries for s in stats)
        hits0 = sum(s.prefix_cache_hits for s in stats)
        ttfts = []
        for i in range(15):
            traffic = Traffic(fleet, f"{tag}-{i}")
            traffic.submit(prompt(seed + i % 5, 384) + prompt(seed + 50 + i, 8), 1)
            ttfts += [o.ttft or 0.0 for o in traffic.collect()]
        time.sleep(0.6)  # the replicas' next stats carry their counters
        stats = [r.stats for r in fleet.replicas if r.stats]
        queries = sum(s.prefix_cache_queries for s in stats) - queries0
        hits = sum(s.prefix_cache_hits for s in stats) - hits0
        return hits / queries, percentile(ttfts, 50)

    aware_rate, aware_ttft = shared_preambles("prefix-on", 5000)
    fleet.defences.update(prefix_aware_routing=False)
    blind_rate, blind_ttft = shared_preambles("prefix-off", 6000)
    fleet.defences.update(prefix_aware_routing=True)
    print(
        f"prefix_aware_routing on: hit rate {aware_rate:.2f}, TTFT p50 {aware_ttft:.3f} s; "
        f"off: {blind_rate:.2f}, {blind_ttft:.3f} s"
    )
    assert aware_rate >= 0.55  # each preamble is computed once, then found
    assert blind_rate <= 0.65 * aware_rate  # each replica computes each preamble for itself
    assert ratio(blind_ttft, aware_ttft) >= 1.3, said("TTFT p50, prefix-blind / aware", blind_ttft, aware_ttft, ">= 1.3x")
    snap = fleet.snapshot()
    assert isinstance(snap.prefix_hit_rate, float) and 0.0 < snap.prefix_hit_rate < 1.0


def test_chunked_prefill_off_running_streams_stall_on_a_long_prompt(fleet: Fleet) -> None:
    fleet.reconfigure(max_batched_tokens=128)

    def streams_with_long_prompts(tag: str) -> float:
        traffic = Traffic(fleet, tag)
        streams = [traffic.submit(prompt(seed_of(tag) + i, 16), 40) for i in range(4)]
        # The long prompts land while the streams decode, however fast this machine runs them (a
        # fixed 0.6 s outlived all 40 tokens on a fast CPU: nothing left to stall).
        assert wait_for(lambda: sum(r.stats.running for r in fleet.replicas if r.stats) >= 4, timeout_s=30)
        for i in range(2):  # a 1,500-token prompt lands on each replica while the streams run
            traffic.submit(prompt(seed_of(tag) + 10 + i, 1500), 1)
        traffic.collect()
        gaps = [gap for o in streams if o.times is not None for gap in o.times.itl]
        assert len(gaps) == 4 * 39
        return percentile(gaps, 99)

    chunked = streams_with_long_prompts("chunked-on")
    fleet.reconfigure(chunked_prefill=False)
    whole = streams_with_long_prompts("chunked-off")
    fleet.reconfigure(chunked_prefill=True)
    print(f"chunked_prefill on: stream ITL p99 {chunked:.3f} s; off: {whole:.3f} s")
    # ITL p99 spikes by the whole prompt's prefill
    assert ratio(whole, chunked) >= 2.0, said("stream ITL p99, chunked_prefill off / on", whole, chunked, ">= 2x")
