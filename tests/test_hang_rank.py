"""Issue 26: the failure gallery's collective_timeout row stops one rank of a tensor-parallel
replica from the page (LiveLab.hang_rank, the socket event `hang_rank`) and resumes it.

Real parts: the live lab as app.py builds it, over real replica processes (the real model, fp32,
a group of two ranks on this machine's cores). Defence off: the stopped rank (state T in /proc)
hangs the group while it still looks ready, and resuming it lets tokens flow again. Then a rebuild
(collective_timeout back on) resumes a rank left stopped before it drains the old group, and with
the defence on the same stop fails the group loudly and the autoscaler orders a fresh one; resume
then says the group was replaced. The refusals (no tensor-parallel replica, nothing stopped, an
unknown action, the simulated executor, a remote lab, a watching browser) need no loaded model."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app import build_lab, create_app
from engine.errors import InvalidParamError, ServingError
from engine.lab.live.lab import LiveLab
from engine.lab.live.rank_hang import StoppedRank
from engine.lab.remote.remote_backend import RemoteConfig
from engine.lab.remote.remote_lab import RemoteLab
from engine.parallel.distributed import process_state
from engine.sampling_params import SamplingParams
from engine.serving.replicas.messages import RequestError, TokenDelta
from tests.support.server_process import free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

LONG = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
PROMPT = [500 + i for i in range(24)]
HUNG_S = 6.0  # no token for this long while the replica says ready: no guard is armed at all
TP_LEVERS = {
    "tensor_parallel": 2,
    "gpu_count": 2,
    "min_replicas": 1,
    "max_replicas": 1,
    "kv_budget_mb": 32,
    "provision_delay_s": 0.0,
    "collective_timeout": False,
}


def gone(pid: int) -> bool:
    return process_state(pid) in (None, "Z", "X")


def refusal(call: Any) -> ServingError:
    with pytest.raises(ServingError) as err:
        call()
    return err.value


def replica_messages(lab: LiveLab) -> list[str]:
    return [e["message"] for e in lab.fleet.events.recent("replica")]


def ready_group(lab: LiveLab) -> Any:
    ready = [r for r in lab.fleet.replicas if r.state == "ready" and r.stats is not None]
    return ready[0] if ready else None


def until_last(events: queue.Queue, timeout_s: float) -> list[Any]:
    out: list[Any] = []
    while not out or not (isinstance(out[-1], RequestError) or out[-1].finished):
        out.append(events.get(timeout=timeout_s))
    return out


# real replica processes: one lab, a group of two ranks -----------------------------------------


@pytest.fixture(scope="module")
def tp_lab() -> Iterator[LiveLab]:
    lab = build_lab(TP_LEVERS, engine={"dtype": "float32"}, drain_timeout_s=3.0)
    pids: set[int] = set()  # every rank that ever reported: none may outlive the lab

    def note_ranks(snap: dict[str, Any]) -> None:
        for replica in list(lab.fleet.replicas):
            if replica.stats is not None:
                pids.update(replica.stats.tp_rank_pids)

    lab.fleet.subscribe(note_ranks)
    try:
        assert wait_for(lambda: ready_group(lab) is not None, 240), [r.error for r in lab.fleet.replicas]
        yield lab
    finally:
        lab.stop()
        lab.fleet.stop()
    assert wait_for(lambda: all(gone(pid) for pid in pids - {os.getpid()}), 20), pids


def test_without_the_defence_a_stopped_rank_hangs_the_group_until_resumed(tp_lab: LiveLab) -> None:
    lab, group = tp_lab, ready_group(tp_lab)
    pids = group.stats.tp_rank_pids
    events = lab.fleet.submit("hung", PROMPT, LONG, None)
    assert isinstance(events.get(timeout=60), TokenDelta)

    answer = lab.hang_rank("stop")
    assert (answer.replica, answer.pid, answer.guarded) == (group.replica_id, pids[1], False)
    assert "collective_timeout is off" in answer.message and "Traffic is off" in answer.message
    assert wait_for(lambda: process_state(pids[1]) == "T", 2), process_state(pids[1])  # a signal lands a moment later
    again = refusal(lambda: lab.hang_rank("stop"))
    assert (again.status, again.param) == (409, "action") and "already stopped" in again.message
    time.sleep(0.5)
    while not events.empty():  # what was already on its way
        events.get_nowait()
    hung_since = time.monotonic()
    while time.monotonic() - hung_since < HUNG_S:
        assert group.state == "ready", (group.state, group.error)  # what /ready and the chart report
        time.sleep(0.5)
    assert events.empty()  # no token while it "looks" ready

    answer = lab.hang_rank("resume")
    assert answer.resumed and "SIGCONT" in answer.message
    assert isinstance(events.get(timeout=30), TokenDelta)  # tokens flow again
    assert process_state(pids[1]) != "T"
    nothing = refusal(lambda: lab.hang_rank("resume"))
    assert (nothing.status, nothing.param) == (409, "action") and "no rank is stopped" in nothing.message
    lab.fleet.router.abort("hung")
    said = replica_messages(lab)
    assert any("stopped (SIGSTOP)" in m for m in said) and any("resumed (SIGCONT)" in m for m in said)


def test_a_rebuild_resumes_the_rank_and_with_the_defence_the_group_fails_loudly(tp_lab: LiveLab) -> None:
    lab, old = tp_lab, ready_group(tp_lab)
    assert wait_for(lambda: old.num_in_flight == 0, 30)  # the last test's request aborted
    pid = lab.hang_rank("stop").pid
    lab.set_levers({"collective_timeout": True})  # a rebuild: the old group drains, so it must answer
    assert wait_for(lambda: process_state(pid) != "T", 2) and lab.hangs.stopped is None
    assert any("the replicas are rebuilt" in m for m in replica_messages(lab))

    assert wait_for(lambda: ready_group(lab) not in (None, old), 240), [r.error for r in lab.fleet.replicas]
    group = ready_group(lab)
    pids = group.stats.tp_rank_pids
    events = lab.fleet.submit("doomed", PROMPT, LONG, None)
    assert isinstance(events.get(timeout=60), TokenDelta)
    answer = lab.hang_rank("stop")
    stopped = time.monotonic()
    assert answer.guarded and "fails loudly" in answer.message
    assert wait_for(lambda: group.state == "failed", 16.0), (
        f"{group.state} 16 s after SIGSTOP: the collectives' 10 s timeout and the watchdog's 14 s fail it sooner"
    )
    tail = until_last(events, 5)
    assert isinstance(tail[-1], RequestError) and "rank 1" in tail[-1].message
    print(f"failed after {time.monotonic() - stopped:.1f} s: {tail[-1].message}")
    assert wait_for(lambda: any(r is not group for r in lab.fleet.replicas), 30)  # the autoscaler's fresh one
    assert wait_for(lambda: gone(pids[1]), 10)

    answer = lab.hang_rank("resume")
    assert not answer.resumed and "replaced" in answer.message
    assert refusal(lambda: lab.hang_rank("resume")).status == 409


# refusals: no model needs to load -------------------------------------------------------------


@pytest.fixture
def sleeper() -> Iterator[int]:
    """A real process to stand in for a stopped rank where no group is loaded."""
    proc = subprocess.Popen(["sleep", "120"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def held(lab: LiveLab, pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    assert wait_for(lambda: process_state(pid) == "T", 2)
    lab.hangs.stopped = StoppedRank(0, pid, os.getpid(), guarded=False)


def test_the_refusals_and_no_rank_left_stopped(sleeper: int) -> None:
    lab = build_lab({"kv_budget_mb": 16}, engine={"dtype": "float32"}, drain_timeout_s=1.0)
    try:
        err = refusal(lambda: lab.hang_rank("stop"))  # tensor_parallel 1: nothing to stop
        assert (err.status, err.param) == (409, "tensor_parallel") and "set tensor_parallel or pipeline_parallel to 2" in err.message
        assert refusal(lambda: lab.hang_rank("resume")).param == "action"
        with pytest.raises(InvalidParamError) as bad:
            lab.hang_rank("pause")
        assert bad.value.param == "action"

        app = create_app(lab, "secret")  # the socket event, through the same guard as flood
        for path in ("/failures", "/steps/6"):  # the row's two buttons, on the gallery and on step 6
            html = app.test_client().get(path).get_data(as_text=True)
            assert html.count('class="btn small-btn hang-rank"') == 2 and "Stop a rank" in html, path
        socketio = app.extensions["servelab_live"].socketio
        watcher = socketio.test_client(app, namespace="/live")
        ack = watcher.emit("hang_rank", {"action": "stop"}, namespace="/live", callback=True)
        assert ack["ok"] is False and ack["error"]["code"] == "forbidden"
        teacher = socketio.test_client(app, namespace="/live", auth={"token": "secret"})
        ack = teacher.emit("hang_rank", {"action": "stop"}, namespace="/live", callback=True)
        assert ack["ok"] is False and ack["error"]["param"] == "tensor_parallel", ack
        ack = teacher.emit("hang_rank", {"action": "nap"}, namespace="/live", callback=True)
        assert ack["ok"] is False and ack["error"]["param"] == "action", ack

        held(lab, sleeper)  # switching to the simulated executor resumes a stopped rank first
        lab.set_levers({"executor": "sim"})
        assert wait_for(lambda: process_state(sleeper) == "S", 2) and lab.hangs.stopped is None
        assert any("simulated executor" in m for m in replica_messages(lab))
        err = refusal(lambda: lab.hang_rank("stop"))
        assert (err.status, err.param) == (409, "executor") and "switch executor to live" in err.message
        lab.set_levers({"executor": "live"})
        held(lab, sleeper)  # and so does stopping the lab
    finally:
        lab.stop()
        lab.fleet.stop()
    assert wait_for(lambda: process_state(sleeper) == "S", 2)
    assert any("the lab stopped" in m for m in replica_messages(lab))


def test_a_remote_lab_has_no_ranks_of_ours() -> None:
    lab = RemoteLab(RemoteConfig.from_args(f"http://127.0.0.1:{free_port()}"))
    try:
        err = refusal(lambda: lab.hang_rank("stop"))
        assert (err.status, err.param) == (409, "executor") and "not this lab's" in err.message
        with pytest.raises(InvalidParamError):
            lab.hang_rank("nap")
    finally:
        lab.stop()
