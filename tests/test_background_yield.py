"""Background measurements give way to the live engine (engine/launch/yielding.py, issue 40):
a real background process beside a real replica is stopped while the fleet has a request and
continues once it has none; a run refused as measured on a busy machine is tried again, at most
TRIES times; whatever ends, the process is reaped."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.launch.yielding import REFUSED_EXIT, YieldingProcess
from engine.parallel.distributed import process_state
from engine.sampling_params import SamplingParams
from engine.serving.replicas.messages import RequestError, TokenDelta
from engine.serving.routing.router import RouterConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

BUSY_LOOP = [sys.executable, "-c", "while True: pass"]  # what a measurement does to a core


def test_a_background_process_is_stopped_while_the_replica_serves(
    hf_reference: dict[str, Any], tmp_path: Path
) -> None:
    fleet = Fleet(EngineConfig(dtype="float32", max_num_seqs=4), RouterConfig(), FleetConfig(replicas=1, provision_delay_s=0.0))
    runner = YieldingProcess(BUSY_LOOP, fleet.has_work, tmp_path / "background.log", resume_after_s=0.5)
    try:
        assert fleet.wait_ready(240)
        runner.start()
        assert wait_for(lambda: runner.pid is not None and process_state(runner.pid) == "R", 10)
        pid = runner.pid
        assert pid is not None
        events = fleet.submit("live", hf_reference["prompts"][0]["prompt_ids"],
                              SamplingParams(temperature=0, max_tokens=48, ignore_eos=True), None)  # fmt: skip
        states = []
        while True:  # at every token the replica streams, the background process is stopped
            event = events.get(timeout=120)
            assert not isinstance(event, RequestError), event
            states.append(process_state(pid))
            if isinstance(event, TokenDelta) and event.finished:
                break
        assert states and set(states) <= {"T", "t"}, states
        assert wait_for(lambda: process_state(pid) == "R", 5), process_state(pid)  # the fleet idle: it goes on
        assert runner.state.pauses >= 1 and runner.state.paused_s > 0
    finally:
        runner.stop()
        fleet.stop()
    assert runner.process is not None and runner.process.returncode is not None  # reaped, no zombie
    assert process_state(runner.process.pid) is None


def test_a_refused_run_is_tried_again_and_then_left(tmp_path: Path) -> None:
    refused = [sys.executable, "-c", f"import sys; sys.exit({REFUSED_EXIT})"]
    runner = YieldingProcess(refused, lambda: False, tmp_path / "background.log", retry_s=0.05, tries=3).start()
    assert wait_for(lambda: runner.state.done, 30)
    assert runner.state.exit_codes == (REFUSED_EXIT,) * 3 and runner.state.tries == 3
    ok = YieldingProcess([sys.executable, "-c", "pass"], lambda: False, tmp_path / "ok.log", retry_s=0.05).start()
    assert wait_for(lambda: ok.state.done, 30) and ok.state.exit_codes == (0,)
