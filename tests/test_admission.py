"""The central queue and the rate limiter, on a virtual clock."""

from __future__ import annotations

import random

import pytest

from engine.clock import VirtualClock
from engine.sampling_params import SamplingParams
from engine.serving.routing.rate_limit import RateLimiter
from engine.serving.routing.request_queue import QueuedRequest, RequestQueue

pytestmark = pytest.mark.unit


def req(i: int) -> QueuedRequest:
    return QueuedRequest(f"r{i}", [1, 2, 3], SamplingParams())


def test_full_queue_refuses_with_jittered_integer_retry_after() -> None:
    clock = VirtualClock()
    q = RequestQueue(cap=4, deadline_s=None, clock=clock, rng=random.Random(0))
    results = [q.offer(req(i)) for i in range(20)]
    assert [r.admitted for r in results[:4]] == [True] * 4
    refused = results[4:]
    assert all(not r.admitted and r.reason == "queue_full" for r in refused)
    waits = [r.retry_after_s for r in refused]
    assert all(isinstance(w, int) and w >= 1 for w in waits)
    assert len(set(waits)) > 1  # jitter: the refused do not all return together
    assert len(q) == 4 and q.num_rejected == 16


def test_retry_after_follows_the_measured_drain_rate() -> None:
    clock = VirtualClock()
    q = RequestQueue(cap=40, deadline_s=None, clock=clock, rng=random.Random(1))
    for i in range(40):
        q.offer(req(i))
    for _ in range(20):  # drains at 2 per second
        clock.advance(0.5)
        q.pop()
    assert abs(q.drain_rate() - 2.0) < 0.2
    waits = [q.retry_after() for _ in range(200)]
    expected = len(q) / q.drain_rate()  # about 10 s to drain the 20 left
    assert max(waits) <= 2 * expected + 1 and min(waits) >= 1
    assert abs(sum(waits) / len(waits) - expected) < 2.5  # full jitter centres on the expectation


def test_expired_requests_never_leave_the_queue_for_a_replica() -> None:
    clock = VirtualClock()
    q = RequestQueue(cap=10, deadline_s=2.0, clock=clock)
    q.offer(req(0))
    q.offer(req(1))
    clock.advance(1.5)
    q.offer(req(2))
    clock.advance(1.0)  # r0 and r1 are past their deadline; r2 is not
    assert q.pop().request_id == "r2"
    assert [r.request_id for r in q.take_expired()] == ["r0", "r1"]
    assert q.num_expired == 2 and q.pop() is None


def test_remove_a_request_whose_client_left() -> None:
    q = RequestQueue(cap=3, deadline_s=None, clock=VirtualClock())
    for i in range(3):
        q.offer(req(i))
    assert q.remove("r1").request_id == "r1"
    assert [q.pop().request_id, q.pop().request_id] == ["r0", "r2"]


def test_token_bucket_per_key() -> None:
    clock = VirtualClock()
    limiter = RateLimiter(rate_limit=2.0, clock=clock)
    assert limiter.check("a") == 0.0 and limiter.check("a") == 0.0
    wait = limiter.check("a")
    assert 0 < wait <= 0.5
    assert limiter.check("b") == 0.0  # another key has its own bucket
    clock.advance(wait)
    assert limiter.check("a") == 0.0
    assert RateLimiter(None, clock).check("a") == 0.0
