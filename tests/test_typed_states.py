"""Issue 45, part 5: states that were bare strings are StrEnums, parsed at the edge.

A member equals its word and serialises as it, so JSON, the pages and the CLI read what they did;
a word from outside (a socket event's `action`) that names no member is refused with the same
error and field as before. Fakes only: no model, no server, no socket."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from flask import Flask, request

from engine.clock import VirtualClock
from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.step_record import DECODE, HANDOFF, PREFILL, StepEntry, StepRecord
from engine.errors import InvalidParamError, ServingError
from engine.lab.facade import RankHangAction
from engine.lab.live.lab_clients import STREAM_ENDED_EARLY, Attempt, AttemptOutcome, ClientCounts, _ending
from engine.lab.live.rank_hang import RankHang
from engine.sampling_params import SamplingParams
from engine.serving.load.loadgen_metrics import RequestRecord, RequestStatus, summarize
from engine.serving.replicas.messages import StepMessage
from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.traces import Outcome, RequestTraces
from engine.sim.deployment import Deployment
from engine.sim.devices import get_device
from engine.sim.models import get_model
from engine.sim.runner import CostModelRunner, sim_executor
from engine.worker.executor import Runner
from web.classroom import ClassRegistry
from web.classroom_state import (
    ClassFloodAction,
    ClassPhase,
    Classroom,
    PollAction,
    PredictAction,
    Question,
    QuestionKind,
    parse_action,
)
from web.live import LiveChannel, Role
from web.openai_request import RequestKind, parse_request

pytestmark = pytest.mark.unit


def record(index: int = 0) -> RequestRecord:
    return RequestRecord(index, f"r{index}", prompt_tokens=8, max_tokens=4)


# request status (engine/serving/load) ----------------------------------------------------------


def test_a_request_status_round_trips_through_json_as_its_word() -> None:
    rec = record()
    assert rec.status is RequestStatus.PENDING
    rec.start(1.0)
    rec.token(1.5, ids=[7])
    rec.done()
    text = json.dumps(rec.to_dict())
    assert '"status": "ok"' in text  # the result files keep the plain word
    back = json.loads(text)["status"]
    assert RequestStatus(back) is RequestStatus.OK and back == RequestStatus.OK and rec.status == "ok"


def test_each_ending_sets_its_status_once() -> None:
    ok, failed, gave_up, rejected, empty = (record(i) for i in range(5))
    for rec in (ok, failed, gave_up, rejected, empty):
        rec.start(0.0)
    ok.token(0.1)
    ok.done()
    failed.fail("boom", 500)
    gave_up.give_up("no first token")
    rejected.reject(429, 2.0, "queue_full")
    empty.done()  # no token came: a failure, not a success
    rejected.fail("late")  # an ended record ignores later writes
    assert [r.status for r in (ok, failed, gave_up, rejected, empty)] == [
        RequestStatus.OK, RequestStatus.FAILED, RequestStatus.GAVE_UP, RequestStatus.REJECTED, RequestStatus.FAILED,
    ]  # fmt: skip
    summary = summarize([ok, failed, gave_up, rejected, empty], duration_s=1.0)
    assert (summary["completed"], summary["failed"], summary["rejected"]) == (1, 3, 1)
    assert summary["rejected_by_status"] == {"429": 1}


# the lab's clients' attempts (engine/lab/live/lab_clients.py) ----------------------------------


def test_attempt_outcomes_are_counted_by_member_and_by_word() -> None:
    counts = ClientCounts()
    for outcome in (AttemptOutcome.REFUSED, AttemptOutcome.GAVE_UP, AttemptOutcome.CUT, AttemptOutcome.OK):
        counts.record(Attempt(0.0, 1, outcome, 1.0))
    counts.record(Attempt(0.0, 1, "refused", 1.0))  # type: ignore[arg-type]  (engine/lab/traffic.py's words)
    assert counts.fields() == {
        "client_sent_total": 5, "client_refused_total": 2, "client_gave_up": 1, "client_cut_before_first_token": 1,
    }  # fmt: skip


def test_a_send_ends_ok_cut_or_failed() -> None:
    served, cut, short, broken = (record(i) for i in range(4))
    served.start(0.0)
    served.token(0.1)
    served.done()
    cut.fail("cut by the proxy: idle", 504)
    short.fail(f"{STREAM_ENDED_EARLY} (0 tokens)")
    broken.fail("HTTP 500: oops", 500)
    assert [_ending(r) for r in (served, cut, short, broken)] == [
        AttemptOutcome.OK, AttemptOutcome.CUT, AttemptOutcome.CUT, AttemptOutcome.FAILED,
    ]  # fmt: skip


# rank-hang actions: the socket's `action` ------------------------------------------------------


@pytest.mark.parametrize("word", ["stop", "resume"])
def test_a_rank_hang_word_parses_to_its_member(word: str) -> None:
    action = RankHangAction.parse(word)
    assert action is RankHangAction(word) and action == word and json.dumps(action) == f'"{word}"'


@pytest.mark.parametrize("bad", ["pause", "", None, 1, ["stop"], {"action": "stop"}, "STOP"])
def test_a_bad_rank_hang_action_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(InvalidParamError) as err:
        RankHangAction.parse(bad)
    assert err.value.param == "action" and err.value.message == "must be stop or resume"
    with pytest.raises(InvalidParamError) as err:
        RankHang(list, EventLog()).act(bad)  # the live lab's own check says the same
    assert err.value.param == "action"


def test_resume_with_nothing_stopped_is_a_409_on_action() -> None:
    with pytest.raises(ServingError) as err:
        RankHang(list, EventLog()).act(RankHangAction.RESUME)
    assert err.value.status == 409 and err.value.param == "action" and err.value.code == "not_stopped"


# roles and the live socket's edge (web/live.py) ------------------------------------------------


class FakeSocket:
    def __init__(self) -> None:
        self.emitted: list[tuple[Any, ...]] = []

    def on_event(self, *args: Any, **kwargs: Any) -> None:
        pass

    def emit(self, *args: Any, **kwargs: Any) -> None:
        self.emitted.append(args)


class FakeLab:
    events = None
    traces = None

    def __init__(self) -> None:
        self.actions: list[Any] = []

    def subscribe(self, callback: Any) -> None:
        pass

    def hang_rank(self, action: RankHangAction) -> Any:
        self.actions.append(action)
        return SimpleNamespace(to_json=lambda: {"action": action})


def channel(token: str | None = "secret") -> tuple[LiveChannel, FakeLab]:
    lab = FakeLab()
    return LiveChannel(FakeSocket(), lab, None, token), lab  # type: ignore[arg-type]


def test_the_server_decides_a_role_and_the_page_reads_its_word() -> None:
    live, _ = channel()
    assert live._role("secret") is Role.INSTRUCTOR
    assert live._role("instructor") is Role.VIEWER  # naming a role is no token: it watches
    assert live._role(None) is Role.VIEWER
    assert channel(None)[0]._role(None) is Role.OPEN
    assert json.dumps({"role": Role.VIEWER}) == '{"role": "viewer"}'
    with pytest.raises(ValueError):
        Role("admin")


def test_hang_rank_parses_its_action_at_the_socket() -> None:
    live, lab = channel()
    with Flask(__name__).test_request_context():
        request.sid = "s1"  # type: ignore[attr-defined]
        live.roles["s1"] = Role.INSTRUCTOR
        bad = live.on_hang_rank({"action": "pause"})
        assert bad["ok"] is False and bad["error"]["param"] == "action"
        assert bad["error"]["type"] == "invalid_request_error"  # the socket's 400
        assert live.on_hang_rank({})["error"]["param"] == "action"  # no action at all
        assert live.on_hang_rank({"action": "stop"}) == {"ok": True, "action": "stop"}
        assert lab.actions == [RankHangAction.STOP] and lab.actions[0] is RankHangAction.STOP
        live.roles["s1"] = Role.VIEWER
        refused = live.on_hang_rank({"action": "stop"})
        assert refused["ok"] is False and refused["error"]["code"] == "forbidden" and len(lab.actions) == 1


# the classroom (web/classroom_state.py, web/classroom.py) --------------------------------------


@pytest.mark.parametrize(
    ("kind", "words"),
    [(ClassFloodAction, "start, stop or set"), (PollAction, "open, reveal or close"), (PredictAction, "ask or apply")],
)
def test_a_bad_class_action_is_a_400_naming_action(kind: Any, words: str) -> None:
    for member in kind:
        assert parse_action(kind, str(member)) is member
    for bad in ("explode", None, 3, ["open"]):
        with pytest.raises(ServingError) as err:
            parse_action(kind, bad)
        assert (err.value.status, err.value.param, err.value.message) == (400, "action", f"action must be {words}")


def test_only_the_instructor_role_runs_the_class() -> None:
    live, _ = channel()
    registry = ClassRegistry(live, None)
    registry.current = Classroom(1)
    live.roles |= {"teacher": Role.INSTRUCTOR, "pupil": Role.VIEWER}
    with pytest.raises(ServingError) as err:
        registry.on_poll("pupil", {"action": "open"})
    assert err.value.status == 403 and err.value.code == "forbidden"
    with pytest.raises(ServingError) as err:
        registry.on_poll("teacher", {"action": "explode"})
    assert (err.value.status, err.value.param) == (400, "action")
    with pytest.raises(ServingError) as err:
        registry.on_poll("teacher", {"action": PollAction.REVEAL})
    assert (err.value.status, err.value.code) == (409, "no_poll")


def test_a_question_carries_its_kind_and_phase_as_words() -> None:
    question = Question("poll", "Which?", ["a", "b"], 0, ["", ""])  # type: ignore[arg-type]
    assert question.kind is QuestionKind.POLL
    question.phase = ClassPhase.REVEALED
    view = json.loads(json.dumps(question.view(teacher=False)))
    assert view["kind"] == "poll" and view["phase"] == "revealed" and view["correct"] == 0


# a step's phases on the request traces (engine/core/step_record.py's Phase) -------------------------


def test_trace_rows_follow_each_step_phase() -> None:
    traces = RequestTraces(VirtualClock())
    traces.admitted("a", None, 0, 10, 5, 0.0)
    traces.dispatched("a", 0)

    def step(at: float, phase: Any, tokens: int) -> dict[str, Any]:
        record = StepRecord(0, at, at + 0.1, 64, 4, (StepEntry("a", phase, tokens),), ())
        traces.observe(StepMessage(0, at + 0.1, steps=[record]))
        return traces.rows()[0]

    row = step(1.0, PREFILL, 10)
    assert row["outcome"] == Outcome.PREFILL and row["chunks"] == [[1.0, 10]]
    # The prefill's last step sampled the first token; each decode adds one; a pickled record's word reads the same.
    assert step(2.0, "decode", 1)["output_tokens"] == 2
    assert step(3.0, DECODE, 1)["output_tokens"] == 3
    assert step(4.0, HANDOFF, 3)["output_tokens"] == 4  # a landed handoff makes one token, whatever it read


# the OpenAI endpoints' kind, and the Runner protocol -------------------------------------------


def test_a_request_kind_comes_from_its_route() -> None:
    assert parse_request({"prompt": "hi"}, RequestKind.COMPLETION, "m").kind is RequestKind.COMPLETION
    chat = parse_request({"messages": [{"role": "user", "content": "hi"}]}, "chat", "m")  # type: ignore[arg-type]
    assert chat.kind is RequestKind.CHAT and chat.request_id.startswith("chatcmpl-")


def test_the_cost_model_runner_is_a_runner_with_a_split_step() -> None:
    declared = {name for name in vars(Runner) if not name.startswith("_")} | set(Runner.__annotations__)
    assert {"execute", "launch", "collect", "forget", "last_model_s"} <= declared
    config = EngineConfig(max_num_seqs=4, max_batched_tokens=64)
    dep = Deployment(get_model("llama-3.1-8b"), get_device("h100"))
    runner = sim_executor(dep, config).runner
    assert isinstance(runner, CostModelRunner)
    assert all(hasattr(runner, name) for name in declared)
    engine = LLMEngine(config, VirtualClock(), sim_executor(dep, config))
    engine.add_request("a", params=SamplingParams(max_tokens=4, ignore_eos=True), prompt_token_ids=list(range(20)))
    _, batch = engine.begin_step()
    whole = runner.execute(batch)
    whole_s = runner.last_model_s
    assert runner.collect(runner.launch(batch)) == whole and runner.last_model_s == whole_s
