"""Request traces (engine/serving/telemetry/traces.py) and step records (engine/core/step_record.py): the real
Fleet, Router, Scheduler and BlockManager on a VirtualClock (simulated replicas), and one real
engine step of the live model."""

from __future__ import annotations

from typing import Any

import pytest

from engine.clock import VirtualClock
from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.step_record import StepRecord
from engine.sampling_params import SamplingParams
from engine.serving.routing.router import AdmissionError, RouterConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig
from engine.serving.telemetry.traces import ENDED, Outcome, RequestTraces
from engine.sim.loop import EventLoop
from engine.sim.replica import SimReplica
from engine.sim.run import SimSpec
from engine.sim.runner import sim_executor

pytestmark = pytest.mark.integration


class SimFleet:
    """One simulated H100 replica of an 8B model behind the real fleet, on the loop's clock."""

    def __init__(self, queue_cap: int = 64, deadline_s: float | None = 30.0, **engine: Any) -> None:
        spec = SimSpec(model="llama-3.1-8b", device="h100", gpus=1)
        dep = spec.deployment()
        self.loop = EventLoop()
        clock = self.loop.clock
        config = spec.engine_config().replace(**engine)

        def new_replica(replica_id: int, cfg: EngineConfig, cores: Any = None, on_message: Any = None) -> SimReplica:
            engine = LLMEngine(cfg, clock, sim_executor(dep, cfg))
            return SimReplica(replica_id, engine, self.loop, lambda seq: None, on_message=on_message)

        self.fleet = Fleet(
            config, RouterConfig(queue_cap=queue_cap, deadline_s=deadline_s), FleetConfig(1), new_replica, clock,
            driver=self.loop, model=(dep.model.name, dep.model.cfg.max_position),
        )  # fmt: skip
        self.traces = self.fleet.traces

    def send(self, request_id: str, prompt: int, out: int, user: str | None = None) -> Any:
        params = SamplingParams(temperature=0, max_tokens=out, ignore_eos=True)
        return self.fleet.submit(request_id, list(range(1, prompt + 1)), params, None, user=user)

    def run(self, seconds: float) -> None:
        """Run the loop `seconds` on; the clock ends there even if the last event came sooner."""
        clock = self.loop.clock
        target = clock.now() + seconds
        self.loop.run(until=target)
        clock.advance(target - clock.now())

    def row(self, request_id: str) -> dict[str, Any]:
        return next(r for r in self.traces.rows() if r["id"] == request_id)


def test_a_request_row_goes_queued_to_finished_with_its_timestamps() -> None:
    sim = SimFleet(max_batched_tokens=256)
    sim.send("long", 1000, 20, user="ada")
    assert sim.row("long")["outcome"] == "queued"
    sim.run(5.0)
    row = sim.row("long")
    assert row["outcome"] == "finished" and row["user"] == "ada" and row["replica"] == 0
    assert row["arrival"] <= row["dispatched"] <= row["scheduled"] < row["first_token"] <= row["last_token"] <= row["end"]
    # A 1000-token prompt under a 256-token budget is read in four chunks, one tick each.
    assert [c[1] for c in row["chunks"]] == [256, 256, 256, 232]
    assert row["output_tokens"] == 20
    assert row["ttft"] == pytest.approx(row["first_token"] - row["arrival"])
    assert row["tpot"] == pytest.approx((row["last_token"] - row["first_token"]) / 19)
    assert sim.traces.in_flight("ada") == []


def test_phases_change_as_the_replica_steps() -> None:
    sim = SimFleet(max_batched_tokens=128)
    sim.send("a", 600, 200)
    seen = set()
    for _ in range(400):
        sim.run(0.01)
        seen.add(sim.row("a")["outcome"])
        if sim.row("a")["outcome"] == "finished":
            break
    assert {"prefill", "decode", "finished"} <= seen


def test_steps_carry_the_batch_under_its_budget() -> None:
    sim = SimFleet(max_batched_tokens=64, max_num_seqs=4)
    for i in range(6):
        sim.send(f"r{i}", 100, 30)
    sim.run(3.0)
    steps = sim.traces.take_changes()["steps"]
    assert steps, "no step records reached the fleet"
    for step in steps:
        tokens = sum(e["tokens"] for e in step["entries"])
        assert 0 < tokens <= step["max_batched_tokens"] == 64
        assert len(step["entries"]) <= step["max_num_seqs"] == 4
        assert step["start"] < step["end"]
        assert 0 < step["model_s"] < step["end"] - step["start"]  # the default profile's fixed host overhead
        assert {e["phase"] for e in step["entries"]} <= {"prefill", "decode"}
    mixed = [s for s in steps if {e["phase"] for e in s["entries"]} == {"prefill", "decode"}]
    assert mixed, "continuous batching: some step should run a prefill chunk beside decodes"


def test_a_squeezed_kv_budget_preempts_and_the_row_says_when() -> None:
    sim = SimFleet(kv_budget_mb=20, max_num_seqs=16, block_size=16)  # 8B: 2 MB a block of 16 tokens
    blocks = sim.fleet.replicas[0].engine.kv.num_blocks
    for i in range(8):  # together they outgrow the blocks as they decode
        sim.send(f"p{i}", 16, blocks * 16 // 4)
    sim.run(30.0)
    rows = sim.traces.rows()
    preempted = [r for r in rows if r["preempted"]]
    assert preempted, f"no preemption with {blocks} blocks"
    assert all(r["outcome"] == "finished" for r in rows)
    victim = preempted[0]
    # Recomputed after the preemption: a prefill chunk after it.
    assert any(c[0] >= victim["preempted"][0] for c in victim["chunks"])


def test_refused_expired_and_cancelled_rows() -> None:
    sim = SimFleet(queue_cap=2, deadline_s=0.5, max_num_seqs=1)
    sim.send("busy", 50, 2000)
    sim.run(0.05)  # dispatched: the replica's one slot is taken
    sim.send("q1", 50, 5)
    sim.send("q2", 50, 5, user="bob")
    with pytest.raises(AdmissionError):
        sim.send("q3", 50, 5, user="cy")
    assert sim.row("q3")["outcome"] == "refused"
    assert sim.traces.in_flight("bob") == ["q2"]
    sim.fleet.router.abort("q1")
    assert sim.row("q1")["outcome"] == "cancelled"
    sim.run(1.0)
    assert sim.row("q2")["outcome"] == "expired"
    sim.fleet.router.abort("busy")
    sim.run(0.1)
    assert sim.row("busy")["outcome"] == "cancelled"
    assert all(Outcome(r["outcome"]) in ENDED for r in sim.traces.rows())


def test_a_stopped_replica_fails_what_it_held() -> None:
    sim = SimFleet()
    sim.send("held", 50, 5000)
    sim.run(0.2)
    sim.fleet.replicas[0].fail("machine lost")
    sim.fleet.watch_once()
    assert sim.row("held")["outcome"] == "failed"


def test_the_window_is_bounded_with_a_summary_and_user_rows_are_never_sampled_out() -> None:
    clock = VirtualClock()
    traces = RequestTraces(clock, window=50, rows_per_s=10)
    for i in range(400):  # 400 arrivals in one second: far more than 10 rows a second
        user = "stu" if i % 40 == 0 else None
        traces.admitted(f"r{i}", user, 0, 10, 10, clock.now())
        clock.advance(0.0025)
    rows = traces.rows()
    users = [r for r in rows if r["user"] == "stu"]
    assert len(users) == 10, "every request with a user keeps its row"
    assert traces.sampled == 400 - len(rows) - sum(traces.summary.values())
    assert traces.sampled > 300
    for i in range(400, 500):  # slow traffic: every request gets a row, the window stays bounded
        clock.advance(0.2)
        traces.admitted(f"r{i}", None, 0, 10, 10, clock.now())
    rows = traces.rows()
    # In flight, the student's rows stay past the window; the rest is the newest 50 - 10.
    assert len(rows) == 50 and sum(r["user"] == "stu" for r in rows) == 10
    assert [r["id"] for r in rows if r["user"] is None] == [f"r{i}" for i in range(460, 500)]
    assert traces.summary == {"queued": 400 - traces.sampled - 10 + 60}
    changes = traces.take_changes()
    assert len(changes["rows"]) <= 50 and traces.take_changes()["rows"] == []


def test_user_field_is_checked_by_the_api_parser() -> None:
    from engine.errors import ServingError
    from web.openai_request import parse_request

    ok = parse_request({"prompt": "hi", "user": "student-7"}, "completion", "m")
    assert ok.user == "student-7"
    for bad in (7, ["x"], "u" * 65):
        with pytest.raises(ServingError) as err:
            parse_request({"prompt": "hi", "user": bad}, "completion", "m")
        assert err.value.param == "user" and err.value.status == 400


def test_a_real_engine_step_makes_a_record(llm_fp32: Any) -> None:
    engine: LLMEngine = llm_fp32.engine
    engine.step_records.take()
    engine.add_request("one", "The capital of France is", SamplingParams(temperature=0, max_tokens=3))
    engine.add_request("two", "Hello", SamplingParams(temperature=0, max_tokens=3))
    while engine.has_work():
        engine.step()
    records: list[StepRecord] = engine.step_records.take()
    assert len(records) == 3
    first, second = records[0], records[1]
    assert {e.request_id: e.phase for e in first.entries} == {"one": "prefill", "two": "prefill"}
    assert first.num_tokens == sum(len(engine.tokenizer.encode(p)) for p in ("The capital of France is", "Hello"))
    assert [(e.phase, e.tokens) for e in second.entries] == [("decode", 1), ("decode", 1)]
    assert first.start < first.end <= second.start < second.end
    assert first.max_batched_tokens == engine.config.max_batched_tokens and first.preempted == ()
    # The executor timed the model inside the step: the rest (schedule, inputs, outputs) is the host's.
    for record in records:
        assert 0 < record.model_s < record.end - record.start
        assert record.host_s == pytest.approx(record.end - record.start - record.model_s)
        assert record.to_dict()["model_s"] == record.model_s


def test_the_step_ring_keeps_only_the_newest() -> None:
    from engine.core.step_record import StepRing

    ring = StepRing(size=3)
    for i in range(5):
        ring.append(StepRecord(0, float(i), i + 0.5, 64, 4, (), ()))
    assert [r.start for r in ring.take()] == [2.0, 3.0, 4.0] and len(ring) == 0


def test_a_handed_off_request_shows_its_handoff_then_decodes_on_the_other_replica() -> None:
    """A prefill/decode split (engine/serving/disagg/): the prefill replica's last delta carries
    the KV; the decode replica's first step lands it (its step entry's phase is handoff)."""
    from engine.core.kv_segment import SharedKV
    from engine.core.sequence import RequestTimes
    from engine.core.step_record import StepEntry
    from engine.serving.replicas.messages import StepMessage, TokenDelta

    clock = VirtualClock(10.0)
    traces = RequestTraces(clock)
    traces.admitted("r", None, 0, 40, 4, 10.0)
    traces.dispatched("r", 0)
    traces.observe(StepMessage(0, 10.5, steps=[StepRecord(0, 10.2, 10.5, 64, 8, (StepEntry("r", "prefill", 40),), ())]))
    shared = SharedKV("psm_test", (30, 2, 2, 16, 3, 64), "float32")
    first = TokenDelta("r", [7], "x", False, None, 40, 0, RequestTimes(10.0, scheduled=10.2, first_token=10.5, tokens=[10.5]),
                       True, handoff=shared)  # fmt: skip
    traces.observe(StepMessage(0, 10.5, [first]))
    row = next(r for r in traces.rows() if r["id"] == "r")
    assert row["outcome"] == "handoff" and row["handoff"] == [10.5, None, float(shared.nbytes)]
    traces.observe(StepMessage(1, 10.8, steps=[StepRecord(1, 10.6, 10.8, 64, 8, (StepEntry("r", "handoff", 9),), ())]))
    row = next(r for r in traces.rows() if r["id"] == "r")
    assert row["handoff"][1] == 10.6 and row["replica"] == 1 and row["outcome"] == "decode"
    assert row["output_tokens"] == 2 and row["scheduled"] == 10.2  # its first batch stays the prefill's
