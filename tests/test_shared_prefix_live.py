"""Shared prefixes on the live engine, the real model: the lab's traffic opens its prompts with one
system prompt and the engine serves its blocks from the prefix cache (shared blocks, its own
counters); a conversation over HTTP gets its answer's exact ids back (vLLM's return_token_ids)
and resends them, so its next turn finds its whole history cached. Small sizes: a 128-token system
prompt in 160-token prompts, 4 output tokens."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from werkzeug.serving import make_server

from engine.config import EngineConfig
from engine.lab.live.lab import LiveLab
from engine.lab.traffic import TrafficDriver
from engine.levers import LEVERS
from engine.sampling_params import SamplingParams
from engine.serving.load.loadgen import LoadRequest
from engine.serving.load.loadgen_metrics import RequestRecord
from engine.serving.routing.router import RouterConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig
from tests.support.waiting import wait_for
from web import create_api_app

pytestmark = pytest.mark.integration

BLOCK = 16
SHARED = {"prompt_tokens": 160, "system_prompt_tokens": 128, "output_tokens": 4, "system_prompt_share": 1.0,
          "conversation_turns": 1, "max_num_seqs": 8}  # fmt: skip


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[LiveLab, Fleet, str]]:
    fleet = Fleet(EngineConfig(max_num_seqs=8), RouterConfig(queue_cap=64, deadline_s=600), FleetConfig(replicas=1))
    lab = LiveLab(fleet, dict(SHARED))
    server = make_server("127.0.0.1", 0, create_api_app(fleet), threaded=True)
    threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True).start()
    url = f"http://127.0.0.1:{server.port}"
    lab.connect(url)  # the lab's clients stream over HTTP through the lab's proxy, as in the app
    try:
        assert fleet.wait_ready(180), [r.error for r in fleet.replicas]
        yield lab, fleet, url
    finally:
        lab.stop()
        server.shutdown()
        fleet.stop()


def send(traffic: TrafficDriver) -> tuple[LoadRequest, RequestRecord]:
    """The traffic's next request, sent on this thread to its end."""
    request = traffic.next_request()
    record = RequestRecord(0, request.request_id, len(request.prompt_token_ids), request.max_tokens)
    assert traffic._in_flight.acquire(timeout=1)  # _send gives its slot back
    traffic._send(request, record)
    assert record.status == "ok", record.error
    return request, record


def counters(fleet: Fleet) -> tuple[int, int]:
    """(prompt tokens looked up, found in the cache) by the replica's engine, from its own stats."""
    stats = fleet.replicas[0].stats
    assert stats is not None
    return stats.prefix_cache_queries, stats.prefix_cache_hits


def settled(fleet: Fleet, queries: int) -> tuple[int, int]:
    """The counters once the replica's stats carry `queries` looked-up tokens (a step's message)."""
    assert wait_for(lambda: counters(fleet)[0] >= queries, 10.0), counters(fleet)
    return counters(fleet)


def test_two_carriers_hold_the_same_blocks(llm_fp32: Any) -> None:
    engine = llm_fp32.engine
    levers = {key: lever.default for key, lever in LEVERS.items()} | SHARED
    traffic = TrafficDriver(None, lambda: levers, seed=11)  # a system prompt no other test sends
    a, b = traffic.next_request(), traffic.next_request()
    assert a.prompt_token_ids[:128] == b.prompt_token_ids[:128] and a.prompt_token_ids[128:] != b.prompt_token_ids[128:]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    hits = engine.kv.prefix_hits
    first = engine.add_request("shared-a", None, params, prompt_token_ids=a.prompt_token_ids)
    while not first.output_token_ids:  # its prompt computed, its blocks published
        engine.step()
    second = engine.add_request("shared-b", None, params, prompt_token_ids=b.prompt_token_ids)
    engine.step()
    shared = 128 // BLOCK
    assert second.num_cached_tokens == 128 and second.block_table[:shared] == first.block_table[:shared]
    assert all(engine.kv.ref_counts[block] == 2 for block in first.block_table[:shared])  # one copy, two holders
    assert second.block_table[shared] != first.block_table[shared]  # their own parts apart
    while engine.has_work():
        engine.step()
    assert engine.kv.prefix_hits - hits == 128


def test_the_live_fleet_finds_the_system_prompt_at_its_share_of_the_prompt(live: tuple[LiveLab, Fleet, str]) -> None:
    lab, fleet, _ = live
    lab.set_levers(dict(SHARED))
    send(lab.traffic)  # the system prompt computed once
    queries0, hits0 = settled(fleet, 1)
    lengths = [len(send(lab.traffic)[0].prompt_token_ids) for _ in range(8)]
    queries, hits = settled(fleet, queries0 + sum(lengths))
    assert queries - queries0 == sum(lengths) and hits - hits0 == 8 * 128  # floor(S / block) x block, each
    rate = (hits - hits0) / (queries - queries0)
    assert rate == pytest.approx(128 / 160, abs=0.1)  # the own parts are drawn around 32 tokens
    assert 0.5 < fleet.snapshot().prefix_hit_rate <= rate  # the stream's window holds the first miss too


def test_a_conversation_over_http_resends_its_answer_and_finds_its_history(live: tuple[LiveLab, Fleet, str]) -> None:
    lab, fleet, _ = live
    lab.set_levers(dict(SHARED) | {"conversation_turns": 3})
    first, answer1 = send(lab.traffic)
    # Every generated id came back (return_token_ids, through the lab's proxy): ignore_eos, so max_tokens of them.
    assert first.conversation is not None and len(answer1.output_token_ids) == first.max_tokens
    queries0, _ = settled(fleet, 1)
    second, answer2 = send(lab.traffic)
    assert second.conversation is first.conversation
    history = [*first.prompt_token_ids, *answer1.output_token_ids]
    assert second.prompt_token_ids[: len(history)] == history  # the answer exactly as the engine made it
    queries, hits = settled(fleet, queries0 + len(second.prompt_token_ids))
    third, _ = send(lab.traffic)
    history = [*second.prompt_token_ids, *answer2.output_token_ids]
    assert third.prompt_token_ids[: len(history)] == history
    _, hits3 = settled(fleet, queries + len(third.prompt_token_ids))
    # The last token of an answer never ran through the model, so its KV is not there yet.
    assert hits3 - hits == (len(history) - 1) // BLOCK * BLOCK
    fourth, _ = send(lab.traffic)  # three turns: a new conversation
    assert fourth.conversation is not first.conversation and len(fourth.prompt_token_ids) < 160 * 2


def test_return_token_ids_gives_the_prompts_and_the_answers_ids(live: tuple[LiveLab, Fleet, str]) -> None:
    _, _, url = live

    def post(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    prompt = [1000 + i for i in range(20)]
    status, body = post({"prompt": prompt, "max_tokens": 3, "temperature": 0, "return_token_ids": True})
    assert status == 200
    choice = body["choices"][0]
    assert choice["prompt_token_ids"] == prompt and len(choice["token_ids"]) == 3
    status, plain = post({"prompt": prompt, "max_tokens": 3, "temperature": 0})
    assert status == 200 and "token_ids" not in plain["choices"][0] and plain["choices"][0]["text"] == choice["text"]
    status, error = post({"prompt": prompt, "max_tokens": 3, "return_token_ids": "yes"})
    assert status == 400 and error["error"]["param"] == "return_token_ids"
