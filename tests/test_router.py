"""The router over real replica processes: overload, deadlines, prefix-aware routing, and the
cheap refusals (key, rate limit, context) that come before any queueing."""

from __future__ import annotations

import queue

import pytest

from engine.clock import VirtualClock
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.serving.replicas.messages import RequestError
from engine.serving.replicas.replica import ReplicaHandle
from engine.serving.routing.router import AdmissionError, Router, RouterConfig
from engine.serving.telemetry.metrics import MetricsBus

pytestmark = pytest.mark.integration

SHORT = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def finish(events: queue.Queue, timeout: float = 120.0) -> list:
    got = []
    while True:
        event = events.get(timeout=timeout)
        got.append(event)
        if isinstance(event, RequestError) or event.finished:
            return got


@pytest.fixture(scope="module")
def replicas() -> list[ReplicaHandle]:
    handles = [ReplicaHandle(i, EngineConfig(dtype="bfloat16", max_num_seqs=2), cores=[i % 2]) for i in range(2)]
    for handle in handles:
        assert handle.wait_ready(), handle.error
    yield handles
    for handle in handles:
        handle.stop()


def test_overload_refuses_with_varied_retry_after_and_completes_the_admitted(replicas: list[ReplicaHandle]) -> None:
    router = Router(replicas[:1], RouterConfig(queue_cap=4, deadline_s=None))
    bus = MetricsBus()
    replicas[0].on_message = bus.observe
    admitted, waits = [], []
    for i in range(20):
        try:
            admitted.append(router.submit(f"flood-{i}", [100 + i] * 40, SHORT))
        except AdmissionError as err:
            assert err.status == 429 and err.reason == "queue_full"
            waits.append(err.retry_after_s)
    assert waits and all(isinstance(w, int) and w >= 1 for w in waits)
    assert len(set(waits)) > 1
    assert router.max_depth_seen <= 4
    for events in admitted:
        assert finish(events)[-1].finish_reason == "length"
    replicas[0].on_message = None
    assert bus.generation_tokens == SHORT.max_tokens * len(admitted)
    assert bus.histograms["time_to_first_token_seconds"].count == len(admitted)
    text = bus.prometheus_text("smollm2", len(router.queue), router.rejected)
    assert f'servelab_rejected_requests_total{{reason="queue_full"}} {len(waits)}' in text
    router.close()


def test_expired_requests_never_reach_a_replica(replicas: list[ReplicaHandle]) -> None:
    router = Router(replicas[:1], RouterConfig(queue_cap=10, deadline_s=0.3))
    long = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    running = [router.submit(f"busy-{i}", [200 + i] * 30, long) for i in range(2)]  # fill both slots
    # Both are running before the late ones queue: on a busy machine the replica may take longer
    # than the deadline to admit them, and the deadline only ever drops a request not yet started.
    firsts = [events.get(timeout=120) for events in running]
    assert not any(isinstance(event, RequestError) for event in firsts), firsts
    queued = [router.submit(f"late-{i}", [300 + i] * 30, SHORT) for i in range(3)]
    for events in queued:
        outcome = finish(events)
        assert len(outcome) == 1 and isinstance(outcome[0], RequestError) and "deadline" in outcome[0].message
    assert router.rejected["deadline"] == 3
    for first, events in zip(firsts, running):
        assert (first if first.finished else finish(events)[-1]).finish_reason == "length"
    router.close()


def test_shared_prefix_goes_to_the_replica_that_caches_it(replicas: list[ReplicaHandle]) -> None:
    router = Router(replicas, RouterConfig(queue_cap=10, deadline_s=None))
    preamble = list(range(1000, 1064))  # four full blocks
    first = finish(router.submit("pre-0", preamble + [5, 6, 7], SHORT))
    assert first[-1].num_cached_tokens == 0
    for i in range(1, 4):
        deltas = finish(router.submit(f"pre-{i}", preamble + [8 + i], SHORT))
        assert deltas[-1].num_cached_tokens == 64  # it landed where the preamble is cached
    router.close()


def test_cheap_refusals_come_before_the_queue() -> None:
    clock = VirtualClock()
    router = Router([], RouterConfig(api_keys=["k1"], rate_limit=1.0, max_model_len=100), clock)
    with pytest.raises(AdmissionError) as err:
        router.submit("a", [1], SHORT, api_key="wrong")
    assert err.value.status == 401
    router.submit("b", [1], SHORT, api_key="k1")
    with pytest.raises(AdmissionError) as err:
        router.submit("c", [1], SHORT, api_key="k1")
    assert err.value.status == 429 and err.value.reason == "rate_limited" and err.value.retry_after_s >= 1
    clock.advance(1.0)
    with pytest.raises(AdmissionError) as err:
        router.submit("d", [1] * 95, SHORT, api_key="k1")
    assert err.value.status == 400 and err.value.param == "max_tokens"
    assert len(router.queue) == 1 and router.rejected == {"unauthorized": 1, "rate_limited": 1, "too_long": 1}
    router.close()


@pytest.mark.parametrize("jitter", [True, False])
def test_rate_limit_refusals_carry_jittered_retry_after(jitter: bool) -> None:
    """A rate-limited key's 429s: Retry-After is never shorter than the bucket's wait, and with
    retry_jitter on it varies (the refused spread out); off, it is the wait itself, every time."""
    from engine.serving.routing.defences import Defences

    clock = VirtualClock()
    router = Router([], RouterConfig(rate_limit=0.25), clock, defences=Defences(retry_jitter=jitter))
    router.submit("first", [1], SHORT, api_key="k")  # takes the bucket's token: the next waits 4 s
    waits = []
    for i in range(40):
        with pytest.raises(AdmissionError) as err:
            router.submit(f"r{i}", [1], SHORT, api_key="k")
        assert err.value.reason == "rate_limited" and err.value.retry_after_s >= 4
        waits.append(err.value.retry_after_s)
    assert (len(set(waits)) > 2) if jitter else (set(waits) == {4})
    router.close()


class _Reported:
    """A serving replica as the router sees it once it has reported a step: its state and stats."""

    def __init__(self, kv_total_blocks: int) -> None:
        from engine.serving.replicas.messages import ReplicaStats
        from engine.serving.replicas.replica_api import ReplicaState

        self.state = ReplicaState.READY
        self.stats = ReplicaStats(kv_total_blocks=kv_total_blocks, max_num_seqs=4)
        self.num_in_flight = 0
        self.replica_id = 0


def test_a_prompt_no_replicas_cache_can_hold_is_refused_at_once() -> None:
    """Not queued to wait out its deadline at the head of the line: a 400 naming the prompt."""
    router = Router([_Reported(91)], RouterConfig(block_size=16, max_model_len=8192), VirtualClock())  # type: ignore[list-item]
    with pytest.raises(AdmissionError) as err:
        router.submit("huge", [7] * 1500, SHORT)
    assert err.value.status == 400 and err.value.param == "prompt" and "91" in str(err.value)
    router.submit("fits", [7] * 1400, SHORT)  # 88 blocks of 16 with its first output token
    assert len(router.queue) == 1 and router.rejected == {"too_long": 1}
    router.close()
