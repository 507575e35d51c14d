"""Replica processes: real spawned engines, one message per step, abort, bad input, drain, and
a replica killed mid-stream."""

from __future__ import annotations

import os
import signal
import time

import pytest

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.serving.replicas.messages import AddRequest, RequestError, TokenDelta
from engine.serving.replicas.replica import ReplicaHandle
from tests.support.replicas import collect
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = ["The days of the week are Monday, Tuesday,", "def square(x):\n    return"]


@pytest.fixture(scope="module")
def replica() -> ReplicaHandle:
    handle = ReplicaHandle(0, EngineConfig(dtype="float32"), heartbeat_timeout_s=30.0)
    assert handle.wait_ready(), handle.error
    yield handle
    handle.stop()
    assert not handle.process.is_alive()


def test_streams_match_offline_greedy_and_share_step_messages(replica: ReplicaHandle, llm_fp32: LLM) -> None:
    tokenizer = llm_fp32.tokenizer
    want = llm_fp32.generate(PROMPTS, GREEDY)
    messages_before = replica.num_token_messages
    streams = [replica.submit(AddRequest(f"s{i}", tokenizer.encode(p), GREEDY)) for i, p in enumerate(PROMPTS)]
    for events, expected in zip(streams, want):
        deltas = collect(events)
        assert all(isinstance(d, TokenDelta) for d in deltas)
        assert [t for d in deltas for t in d.token_ids] == expected.token_ids
        assert "".join(d.text for d in deltas) == expected.text
        assert deltas[-1].finish_reason == "length" and deltas[-1].times.first_token is not None
    # One message per step carries both requests' tokens, not one message per token.
    assert replica.num_token_messages - messages_before <= GREEDY.max_tokens + 2


def test_abort_frees_blocks_and_bad_input_names_the_field(replica: ReplicaHandle, llm_fp32: LLM) -> None:
    ids = llm_fp32.tokenizer.encode(PROMPTS[0])
    long = replica.submit(AddRequest("long", ids, SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)))
    bad = replica.submit(AddRequest("bad", ids, SamplingParams(max_tokens=9000)))
    error = collect(bad)[0]
    assert isinstance(error, RequestError) and error.param == "max_tokens"
    first = long.get(timeout=60)
    assert isinstance(first, TokenDelta) and not first.finished
    replica.abort("long")
    last = collect(long)[-1]
    assert isinstance(last, TokenDelta) and last.finish_reason == "abort"
    assert wait_for(lambda: replica.stats is not None and replica.stats.kv_used_blocks == 0 and replica.stats.running == 0, 5)


def test_sigkill_fails_in_flight_streams_within_two_seconds(llm_fp32: LLM) -> None:
    handle = ReplicaHandle(1, EngineConfig(dtype="float32"))
    assert handle.wait_ready(), handle.error
    ids = llm_fp32.tokenizer.encode(PROMPTS[1])
    events = handle.submit(AddRequest("doomed", ids, SamplingParams(max_tokens=2000, ignore_eos=True)))
    assert isinstance(events.get(timeout=60), TokenDelta)
    killed = time.monotonic()
    os.kill(handle.process.pid, signal.SIGKILL)
    assert wait_for(lambda: handle.state == "failed", 2.0), f"{handle.state} 2 s after SIGKILL: failed within 2 s"
    took = time.monotonic() - killed
    assert took < 2.0, f"failed {took:.2f} s after SIGKILL: within 2 s"
    tail = collect(events, timeout=2.0)
    assert isinstance(tail[-1], RequestError) and "died" in tail[-1].message
    assert isinstance(handle.submit(AddRequest("after", [1, 2, 3], GREEDY)).get(timeout=1), RequestError)
    handle.stop()


def test_drain_finishes_residents_then_stops(llm_fp32: LLM) -> None:
    handle = ReplicaHandle(2, EngineConfig(dtype="float32"))
    assert handle.wait_ready(), handle.error
    resident = handle.submit(AddRequest("resident", llm_fp32.tokenizer.encode(PROMPTS[0]), GREEDY))
    handle.drain()
    refused = handle.submit(AddRequest("late", [1, 2, 3], GREEDY)).get(timeout=5)
    assert isinstance(refused, RequestError)
    deltas = collect(resident)
    assert sum(len(d.token_ids) for d in deltas) == GREEDY.max_tokens
    assert wait_for(lambda: handle.state == "stopped", 10)
    handle.process.join(10)
    assert handle.process.exitcode == 0
