"""Shared prefixes in the simulator: the simulated lab's fleet on its virtual clock finds a shared
system prompt and a conversation's history in its own prefix cache (the sim engine's counters),
and an A/B shows what prefix-aware routing is worth on two 70B replicas. No model, no wall clock."""

from __future__ import annotations

from typing import Any

import pytest

from engine.lab.simulated.lab_sim import SimLab
from engine.levers import LEVERS
from engine.sim.compare import as_cli_spec, command_for, parse_experiment, run_experiment, spec_from_command

pytestmark = pytest.mark.unit

DEFAULTS = {key: lever.default for key, lever in LEVERS.items()}
BLOCK = 16
SHARED = DEFAULTS | {
    "executor": "sim", "model": "smollm2-135m", "device": "h100", "gpu_count": 1, "request_rate": 20.0,
    "prompt_tokens": 160, "system_prompt_tokens": 128, "output_tokens": 4, "max_replicas": 1,
}  # fmt: skip
# Two 70B replicas of TP4 (the weights in bf16 leave each 490k tokens of KV), every request opening with
# one 4,000-token system prompt; conversations of 4 turns whose new messages are as long again.
SEVENTY_B = {"model": "llama-3.1-70b", "device": "h100", "gpu_count": 8, "tensor_parallel": 4, "prefix_caching": True}
CONVERSATIONS = {
    "request_rate": 2.0, "prompt_tokens": 8000, "output_tokens": 300, "num_requests": 150,
    "system_prompt_tokens": 4000, "conversation_turns": 4,
}  # fmt: skip


def counters(lab: SimLab) -> tuple[int, int]:
    """(prompt tokens looked up, found) by the simulated replicas' own block managers."""
    engines = [r.engine for r in lab.fleet.replicas]
    return sum(e.kv.prefix_queries for e in engines), sum(e.kv.prefix_hits for e in engines)


def drain(lab: SimLab) -> None:
    """Stop the arrivals and run the fleet until every request sent has ended."""
    lab.stop_traffic()
    for _ in range(200):
        if lab.finished + lab.refused >= lab.sent:
            return
        lab.loop.run(until=lab.clock.now() + 1.0)
    raise AssertionError(f"{lab.sent - lab.finished} requests never ended")


def test_the_simulated_fleet_shares_the_system_prompts_blocks_and_counts_its_hits() -> None:
    lab = SimLab(SHARED, lambda snap: None)
    lab.start_traffic()
    lab.loop.run(until=2.0)
    engine = lab.fleet.replicas[0].engine
    shared = 128 // BLOCK
    while len(engine.scheduler.running) < 2:  # two carriers at once: they hold the same blocks
        lab.loop.run(until=lab.clock.now() + 0.01)
    running = list(engine.scheduler.running)
    heads = {tuple(seq.block_table[:shared]) for seq in running}
    assert len(heads) == 1 and all(engine.kv.ref_counts[b] >= len(running) for b in heads.pop())
    lab.loop.run(until=20.0)
    snap = lab.fleet.snapshot()
    drain(lab)
    queries, hits = counters(lab)
    assert lab.finished == lab.sent > 300
    # Every carrier found the 8 shared blocks, the first few aside (and, rarely, one more block: two
    # simulated requests' own runs of ids may start alike, engine/sim/workload.py).
    assert abs(hits - 128 * lab.sent) <= 3 * 128
    expected = 128 * lab.sent / queries  # floor(S / block) x block over the prompts' mean
    assert hits / queries == pytest.approx(expected, rel=0.01) and expected == pytest.approx(0.8, abs=0.03)
    assert snap.prefix_hit_rate == pytest.approx(expected, rel=0.03)  # the stream's windowed figure, as live
    assert snap.to_json()["prefix_hit_rate"] == snap.prefix_hit_rate


def test_a_simulated_conversation_finds_its_whole_history_cached() -> None:
    """No system prompt: no two conversations share a token, yet a later turn finds its history."""
    lab = SimLab(SHARED | {"system_prompt_tokens": 0, "conversation_turns": 3, "request_rate": 5.0}, lambda snap: None)
    seen: list[tuple[int, int]] = []
    answered = lab.open_turns.answered

    def check(seq: Any, turns: int) -> None:
        turn = lab.open_turns.turn(seq.request_id)
        if turn is not None and turn.history:  # a later turn: the last prompt and its answer resent
            history = len(turn.history[0]) + len(turn.history[1])
            seen.append((seq.num_cached_tokens, (history - 1) // BLOCK * BLOCK))
        answered(seq, turns)

    lab.open_turns.answered = check  # type: ignore[method-assign]
    lab.start_traffic()
    lab.loop.run(until=30.0)
    drain(lab)
    assert len(seen) > 50 and all(cached == expected for cached, expected in seen)  # the answers' ids, exactly
    queries, hits = counters(lab)
    assert 0.35 < hits / queries < 0.6  # first turns find nothing, later ones their history


def test_the_simulated_labs_router_honours_prefix_aware_routing() -> None:
    """The simulated lab's fleet has the live lab's Router and defences: blind to the cache, about
    half of a conversation's turns land on the replica that does not hold its history."""
    two = SHARED | {"gpu_count": 2, "min_replicas": 2, "max_replicas": 2, "system_prompt_tokens": 0,
                    "output_tokens": 16, "conversation_turns": 4}  # fmt: skip
    rates = {}
    for aware in (True, False):
        lab = SimLab(two | {"prefix_aware_routing": aware}, lambda snap: None)
        lab.start_traffic()
        lab.loop.run(until=30.0)
        queries, hits = counters(lab)
        rates[aware] = hits / queries
        assert len(lab.fleet.replicas) == 2 and lab.fleet.snapshot().prefix_hit_rate == pytest.approx(rates[aware])
    assert rates[True] > 0.5 and rates[False] < 0.7 * rates[True]  # measured 0.61 and 0.34


def test_prefix_aware_routing_keeps_a_conversation_where_its_history_is_cached() -> None:
    experiment = {
        "traffic": CONVERSATIONS,
        "a": SEVENTY_B | {"label": "prefix-aware"}, "b": SEVENTY_B | {"prefix_aware_routing": False, "label": "blind"},
    }  # fmt: skip
    result = run_experiment(parse_experiment(experiment))
    aware, blind = result["a"]["summary"], result["b"]["summary"]
    assert result["a"]["workload_digest"] == result["b"]["workload_digest"]  # one request list
    assert aware["completed"] == blind["completed"] == 150 and aware["replicas"] == 2
    assert aware["prefix_hit_rate"] >= blind["prefix_hit_rate"] + 0.08  # measured 0.645 against 0.527
    assert aware["ttft_p50_s"] < 0.8 * blind["ttft_p50_s"] and aware["ttft_p99_s"] < blind["ttft_p99_s"]
    command = result["b"]["command"]
    for flag in ("--system-prompt-tokens 4000", "--conversation-turns 4", "--prefix-aware-routing false"):
        assert flag in command
    spec = parse_experiment(experiment).spec("b")
    assert spec_from_command(command_for(spec)) == as_cli_spec(spec)


def test_one_shared_system_prompt_is_cached_on_every_replica_either_way() -> None:
    """Prefix-blind, each replica computes the system prompt once and then finds it too: routing
    matters where prefixes differ by request (conversations), not for one prompt everyone shares."""
    traffic = {"request_rate": 4.0, "prompt_tokens": 5000, "output_tokens": 100, "num_requests": 200,
               "system_prompt_tokens": 4000}  # fmt: skip
    result = run_experiment(parse_experiment(
        {"traffic": traffic, "a": SEVENTY_B, "b": SEVENTY_B | {"prefix_aware_routing": False}}
    ))  # fmt: skip
    aware, blind = result["a"]["summary"], result["b"]["summary"]
    assert aware["prefix_hit_rate"] == pytest.approx(4000 / 5000, abs=0.02)  # each replica's first miss aside
    assert blind["prefix_hit_rate"] == pytest.approx(aware["prefix_hit_rate"], abs=0.005)
    off = run_experiment(parse_experiment({"traffic": traffic, "a": SEVENTY_B | {"prefix_caching": False}}))
    assert off["a"]["summary"]["prefix_hit_rate"] == 0.0
    assert off["a"]["summary"]["ttft_p50_s"] > 2 * result["a"]["summary"]["ttft_p50_s"]
