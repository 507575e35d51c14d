"""The back-of-envelope and bottleneck arithmetic, the event log's cursor, and the flood's ramp:
pure pieces of the live lab, checked against numbers worked by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.clock import VirtualClock
from engine.lab.arrivals import Ramp
from engine.lab.envelope import MB, Facts, bottlenecks, decode_step_ms, envelope
from engine.levers import LEVERS
from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.snapshot import FleetSnapshot

pytestmark = pytest.mark.unit

LEVERS_NOW = {key: lever.default for key, lever in LEVERS.items()} | {"prompt_tokens": 200, "output_tokens": 56}
# SmolLM2-135M in bf16: 30 layers x 3 KV heads x 64 dims x K and V x 2 bytes = 23,040 bytes a token.
FACTS = Facts(param_bytes=270 * MB, kv_bytes_per_token=23040, kv_budget_bytes=512 * MB, copy_gbs=20.0)


def test_envelope_from_the_live_config() -> None:
    env = envelope(LEVERS_NOW, FACTS)
    assert env is not None
    assert env.kv_kb_per_token == pytest.approx(22.5)
    assert env.kv_mb_per_sequence == pytest.approx(256 * 23040 / MB)
    assert env.sequences_fit == 512 * MB // (256 * 23040)  # 91
    assert env.batch == 64  # max_num_seqs binds before the KV budget does
    step_bytes = 270 * MB + 64 * (200 + 28) * 23040  # the weights once, plus the batch's cached K/V
    assert env.decode_step_ms == pytest.approx(step_bytes / 20e9 * 1000)
    assert env.capacity_tok_s == pytest.approx(64 / (env.decode_step_ms / 1000))
    # The page's JSON: the same keys as ever.
    assert set(env.to_json()) == {
        "weight_mb_per_device", "weight_mb_held", "kv_kb_per_token", "kv_mb_per_sequence", "kv_budget_mb",
        "sequences_fit", "batch", "copy_gbs", "decode_step_ms", "capacity_tok_s",
    }


def test_a_shard_reports_its_own_footprint_and_floor() -> None:
    """Under tensor parallelism a replica reports its rank 0's shard (the largest): the envelope
    reads those per-device facts as they are, and counts replicas as gpu_count // tp."""
    shard = replace(FACTS, param_bytes=180 * MB, kv_bytes_per_token=15360, tp_rank_weight_bytes=[327 * MB, 294 * MB])
    env = envelope(LEVERS_NOW | {"tensor_parallel": 2, "gpu_count": 2}, shard)
    assert env is not None
    assert env.weight_mb_per_device == pytest.approx(180) and env.weight_mb_held == pytest.approx(327)
    assert env.sequences_fit == 512 * MB // (256 * 15360)  # a third fewer heads: half as many more sequences
    assert env.capacity_tok_s == pytest.approx(64 / (env.decode_step_ms / 1000))  # one replica of two ranks
    assert decode_step_ms(shard, 8, 100) < decode_step_ms(FACTS, 8, 100)


def test_envelope_waits_for_a_replica_to_report() -> None:
    assert envelope(LEVERS_NOW, Facts()) is None


def test_bottlenecks_read_measured_values_against_their_limits() -> None:
    snap = FleetSnapshot(
        time=0.0, kv_used_blocks=95, kv_total_blocks=100, running=16, max_num_seqs=64, batch_size=16,
        tokens_per_s=100.0, ttft_p99=1.5, replicas={"ready": 1},
    )
    readings = {b.key: b.to_json() for b in bottlenecks(LEVERS_NOW, FACTS, snap)}
    assert set(readings) == {"kv_pressure", "weights", "decode", "slots", "ttft"}
    assert readings["kv_pressure"]["ratio"] == pytest.approx(0.95) and readings["kv_pressure"]["level"] == "hot"
    assert readings["slots"]["ratio"] == pytest.approx(0.25) and readings["slots"]["level"] == "ok"
    assert readings["ttft"]["ratio"] == pytest.approx(1.5) and readings["ttft"]["level"] == "hot"
    assert "weights" in readings and readings["weights"]["ratio"] is None  # no footprint reported yet
    capacity = 16 / (decode_step_ms(FACTS, 16, 228) / 1000)
    assert readings["decode"]["ratio"] == pytest.approx(100 / capacity)


def test_bottlenecks_with_nothing_measured_yet_are_idle() -> None:
    snap = FleetSnapshot(time=0.0)
    assert all(b.level == "idle" for b in bottlenecks(LEVERS_NOW, Facts(), snap))


def test_event_log_cursor_sees_each_event_once() -> None:
    clock = VirtualClock()
    log = EventLog(clock, keep=3)
    log.emit("config", "a")
    first, cursor = log.since(0)
    assert [e["message"] for e in first] == ["a"]
    for name in "bcde":
        log.emit("finished", name)
    fresh, cursor = log.since(cursor)
    assert [e["message"] for e in fresh] == ["c", "d", "e"]  # only the newest `keep` are held
    assert log.since(cursor) == ([], cursor)
    with pytest.raises(ValueError, match="unknown event kind"):
        log.emit("nonsense", "x")


def test_ramp_climbs_linearly_then_holds() -> None:
    ramp = Ramp(start_rate=1.0, end_rate=21.0, start_time=10.0, duration_s=20.0)
    assert ramp.rate(10.0) == 1.0
    assert ramp.rate(20.0) == pytest.approx(11.0)
    assert ramp.rate(100.0) == 21.0
    assert Ramp(1.0, 5.0, 0.0, 0.0).rate(0.0) == 5.0


def test_a_shard_group_shows_its_collectives_and_rank_weights() -> None:
    facts = replace(FACTS, tensor_parallel=2, tp_rank_weight_bytes=[327 * MB, 294 * MB], allreduces_per_step=60)
    snap = FleetSnapshot(
        time=0.0, kv_used_blocks=10, kv_total_blocks=100, running=4, max_num_seqs=64, batch_size=4,
        tokens_per_s=20.0, ttft_p99=None, itl_p50=0.170, allreduce_ms=140.0, replicas={"ready": 1},
    )
    readings = {b.key: b.to_json() for b in bottlenecks(LEVERS_NOW, facts, snap)}
    assert readings["collectives"]["ratio"] == pytest.approx(140 / 170)
    assert readings["collectives"]["level"] == "hot" and "60 of them" in readings["collectives"]["text"]
    assert readings["weights"]["text"].startswith("327 / 294 MB")
    assert readings["weights"]["ratio"] == pytest.approx(327 / (327 + 512))
