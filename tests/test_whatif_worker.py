"""The what-if worker (web/whatif_worker.py): runs happen in another process at the lowest CPU
priority, one at a time in arrival order with their place in line readable meanwhile, a full
line refuses with 429, refusals keep their parameter, and a worker that dies is said once and
replaced on the next run. The runs (tests/support/worker_jobs.py) hold until the test lets them
go, so the order of events is the test's, not this machine's speed."""

from __future__ import annotations

import itertools
import os
import sys
import threading
from pathlib import Path

import pytest

from engine.errors import InvalidParamError, ServingError
from tests.support.waiting import wait_for
from tests.support.worker_jobs import die, hold, hold_until, refuse, where_am_i
from web.whatif_worker import WhatIfWorker

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def worker() -> WhatIfWorker:
    w = WhatIfWorker(max_waiting=2)
    yield w
    w.close()


def test_a_run_goes_to_another_process_at_the_lowest_priority(worker: WhatIfWorker) -> None:
    where = worker.run(where_am_i)
    assert where["pid"] != os.getpid()
    assert where["nice"] == 19
    if sys.platform == "linux":
        assert where["policy"] == os.SCHED_IDLE


def test_runs_go_one_at_a_time_in_arrival_order_and_say_their_place(worker: WhatIfWorker, tmp_path: Path) -> None:
    go = tmp_path / "go"  # the runs hold until the test makes it
    results: dict[str, dict] = {}

    def post(label: str) -> None:
        results[label] = worker.run(hold_until, str(go), label, ticket=label)

    threads = []
    for place, label in enumerate(("first", "second", "third")):
        threads.append(threading.Thread(target=post, args=(label,)))
        threads[-1].start()
        assert wait_for(lambda label=label, place=place: worker.position(label) == place, 10.0)  # in line first
    assert (worker.position("first"), worker.position("second"), worker.position("third")) == (0, 1, 2)
    assert worker.waiting() == 3
    go.touch()
    for t in threads:
        t.join(30)
    runs = [results[label] for label in ("first", "second", "third")]
    assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(runs)), runs
    assert worker.position("first") is None and worker.waiting() == 0


def test_a_full_line_is_refused_with_429(worker: WhatIfWorker, tmp_path: Path) -> None:
    go = tmp_path / "go"
    threads = [threading.Thread(target=worker.run, args=(hold_until, str(go), str(i))) for i in range(3)]
    for in_line, t in enumerate(threads, start=1):
        t.start()
        assert wait_for(lambda in_line=in_line: worker.waiting() == in_line, 10.0)
    with pytest.raises(ServingError) as refused:
        worker.run(hold, 0.0, "late")
    assert refused.value.status == 429 and refused.value.code == "busy" and refused.value.retry_after_s
    go.touch()
    for t in threads:
        t.join(30)
    assert worker.waiting() == 0


def test_a_refusal_keeps_its_parameter(worker: WhatIfWorker) -> None:
    with pytest.raises(InvalidParamError) as refused:
        worker.run(refuse, "a.tensor_parallel")
    assert refused.value.param == "a.tensor_parallel" and "between 1 and 8" in refused.value.message


def test_a_worker_that_dies_is_said_and_replaced(worker: WhatIfWorker) -> None:
    with pytest.raises(ServingError) as died:
        worker.run(die)
    assert died.value.status == 500 and died.value.code == "worker_died"
    assert worker.run(hold, 0.0, "after")["label"] == "after"
