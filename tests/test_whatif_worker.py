"""The what-if worker (web/whatif_worker.py): runs happen in another process at the lowest CPU
priority, one at a time in arrival order with their place in line readable meanwhile, a full
line refuses with 429, refusals keep their parameter, and a worker that dies is said once and
replaced on the next run."""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time

import pytest

from engine.errors import InvalidParamError, ServingError
from web.whatif_worker import WhatIfWorker


def where_am_i() -> dict:
    policy = os.sched_getscheduler(0) if sys.platform == "linux" else None
    return {"pid": os.getpid(), "nice": os.getpriority(os.PRIO_PROCESS, 0), "policy": policy}


def hold(seconds: float, label: str) -> dict:
    start = time.time()
    time.sleep(seconds)
    return {"label": label, "start": start, "end": time.time()}


def refuse(param: str) -> dict:
    raise InvalidParamError(param, "must be between 1 and 8")


def die() -> dict:
    os._exit(3)


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


def test_runs_go_one_at_a_time_in_arrival_order_and_say_their_place(worker: WhatIfWorker) -> None:
    results: dict[str, dict] = {}

    def post(label: str) -> None:
        results[label] = worker.run(hold, 0.6, label, ticket=label)

    threads = []
    for label in ("first", "second", "third"):
        threads.append(threading.Thread(target=post, args=(label,)))
        threads[-1].start()
        time.sleep(0.15)  # arrival order
    deadline = time.monotonic() + 10
    while worker.position("third") != 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (worker.position("first"), worker.position("second"), worker.position("third")) == (0, 1, 2)
    assert worker.waiting() == 3
    for t in threads:
        t.join(30)
    runs = [results[label] for label in ("first", "second", "third")]
    assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(runs)), runs
    assert worker.position("first") is None and worker.waiting() == 0


def test_a_full_line_is_refused_with_429(worker: WhatIfWorker) -> None:
    threads = [threading.Thread(target=worker.run, args=(hold, 1.0, str(i))) for i in range(3)]
    for t in threads:
        t.start()
        time.sleep(0.1)
    with pytest.raises(ServingError) as refused:
        worker.run(hold, 0.0, "late")
    assert refused.value.status == 429 and refused.value.code == "busy" and refused.value.retry_after_s
    for t in threads:
        t.join(30)


def test_a_refusal_keeps_its_parameter(worker: WhatIfWorker) -> None:
    with pytest.raises(InvalidParamError) as refused:
        worker.run(refuse, "a.tensor_parallel")
    assert refused.value.param == "a.tensor_parallel" and "between 1 and 8" in refused.value.message


def test_a_worker_that_dies_is_said_and_replaced(worker: WhatIfWorker) -> None:
    with pytest.raises(ServingError) as died:
        worker.run(die)
    assert died.value.status == 500 and died.value.code == "worker_died"
    assert worker.run(hold, 0.0, "after")["label"] == "after"
