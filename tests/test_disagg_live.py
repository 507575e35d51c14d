"""Prefill/decode disaggregation across real replica processes: one prefill replica, one decode
replica, the KV handed over through shared memory. The stream is the text one engine makes alone;
TTFT is counted once, where the first token was made; a decode replica killed mid-stream ends its
streams with an error in the stream, frees every segment, and is replaced; a handoff with no
decode replica ready waits for one, and past its wait ends with the reason in its stream."""

from __future__ import annotations

import os
import queue
from collections.abc import Iterator

import pytest

from engine import LLM
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.serving.replicas.messages import RequestError, TokenDelta
from engine.serving.replicas.replica_api import ReplicaState
from engine.serving.routing.router import RouterConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

PROMPT = (
    "Fix the spelling in this text and write it out again in full.\n\nText: To reset the router, unplug it for "
    "thirty seconds, plug it back in, and wait until the green light stops blinking.\n\nFixed text:"
)
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def segments() -> set[str]:
    """Shared-memory segments in this machine's /dev/shm (Python's are named psm_...)."""
    return {name for name in os.listdir("/dev/shm") if name.startswith("psm_")}


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    config = EngineConfig(dtype="float32", kv_budget_mb=64, max_num_seqs=8)
    fleet = Fleet(config, RouterConfig(), FleetConfig(replicas=1, decode_replicas=1, drain_timeout_s=10))
    try:
        assert wait_for(lambda: fleet.ready and all(r.state == ReplicaState.READY for r in fleet.downstream()), 240)
        yield fleet
    finally:
        fleet.stop()


def collect(events: queue.Queue, timeout: float = 120.0) -> tuple[list[TokenDelta], RequestError | None]:
    deltas: list[TokenDelta] = []
    while True:
        event = events.get(timeout=timeout)
        if isinstance(event, RequestError):
            return deltas, event
        deltas.append(event)
        if event.finished:
            return deltas, None


def test_a_split_fleet_streams_what_one_engine_makes_alone(fleet: Fleet) -> None:
    assert fleet.tokenizer is not None
    ids = fleet.tokenizer.encode(PROMPT)
    alone = LLM(dtype="float32", kv_budget_mb=32).generate([ids], GREEDY)[0].token_ids
    before = segments()
    deltas, error = collect(fleet.submit("split-1", ids, GREEDY, None))
    assert error is None
    assert [t for d in deltas for t in d.token_ids] == alone
    assert deltas[0].first_token and deltas[0].token_ids == alone[:1]  # from the prefill replica
    assert deltas[-1].num_prompt_tokens == len(ids)  # the decode replica's prompt, less the first token
    assert fleet.decode is not None and fleet.decode.handoffs == 1 and fleet.decode.handoff_bytes > 0
    decoder = fleet.downstream()[0]
    assert wait_for(lambda: decoder.stats is not None and decoder.stats.prefix_cache_hits >= len(ids) // 16 * 16, 10)
    bus = fleet.bus
    assert bus.histograms["time_to_first_token_seconds"].count == 1  # counted once, where it was made
    assert wait_for(lambda: bus.histograms["e2e_request_latency_seconds"].count == 1, 10)
    assert segments() <= before  # every segment read and unlinked
    # The handoff as its own phase in the request's trace, and counted in /metrics.
    row = next(r for r in fleet.traces.rows() if r["id"] == "split-1")
    sent, landed, moved = row["handoff"]
    assert landed is not None and landed >= sent and moved == bus.kv_handoff_bytes > 0
    assert row["replica"] == decoder.replica_id and row["outcome"] == "finished"
    assert row["output_tokens"] == GREEDY.max_tokens
    # In the batch chart, the decode replica's step that landed it: only the last partial block
    # (and the first token, now a prompt token) computed there.
    landed = [
        (step["replica"], e["tokens"]) for step in fleet.traces.full()["steps"] for e in step["entries"]
        if e["request_id"] == "split-1" and e["phase"] == "handoff"
    ]  # fmt: skip
    assert landed == [(decoder.replica_id, len(ids) + 1 - len(ids) // 16 * 16)]
    assert "servelab_kv_handoffs_total 1" in fleet.metrics_text()


def test_a_decode_replica_killed_mid_stream_fails_its_streams_in_band_and_is_replaced(fleet: Fleet) -> None:
    assert fleet.tokenizer is not None
    ids = fleet.tokenizer.encode(PROMPT)
    before = segments()
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    events = fleet.submit("split-killed", ids, long, None)
    first = events.get(timeout=120)
    assert isinstance(first, TokenDelta) and first.first_token
    decoder = fleet.downstream()[0]
    assert wait_for(lambda: decoder.num_in_flight == 1, 30)
    decoder.kill("decode replica killed by the test")
    while not isinstance(event := events.get(timeout=30), RequestError):
        assert isinstance(event, TokenDelta) and not event.finished
    assert "killed" in event.message
    assert wait_for(lambda: any(r.state == ReplicaState.READY and r is not decoder for r in fleet.downstream()), 240)
    deltas, error = collect(fleet.submit("split-after", ids, GREEDY, None))
    assert error is None and deltas[-1].finished
    assert segments() <= before


def test_a_handoff_waits_for_a_decode_replica_and_gives_up_with_a_reason(fleet: Fleet) -> None:
    assert fleet.tokenizer is not None and fleet.decode is not None
    ids = fleet.tokenizer.encode(PROMPT)
    before = segments()
    for replica in fleet.downstream():
        replica.drain()  # draining, then stopped: it takes nothing new until the pool replaces it
    deltas, error = collect(fleet.submit("split-waits", ids, GREEDY, None))  # waits for the replacement
    assert error is None and deltas[-1].finished
    fleet.decode.wait_s = 0.5
    try:
        for replica in fleet.downstream():
            replica.drain()
        deltas, error = collect(fleet.submit("split-nowhere", ids, GREEDY, None))
        assert error is not None and "no decode replica was ready" in error.message
        assert len(deltas) == 1 and deltas[0].first_token  # the first token came; the rest could not
    finally:
        fleet.decode.wait_s = 30.0
    assert segments() <= before
    assert wait_for(lambda: any(r.state == ReplicaState.READY for r in fleet.downstream()), 240)  # replaced
