"""Runs for the what-if worker's tests (tests/test_whatif_worker.py). The worker runs them in its
own process, which imports them by name: module-level functions, in a module that is no test."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from engine.errors import InvalidParamError


def where_am_i() -> dict:
    policy = os.sched_getscheduler(0) if sys.platform == "linux" else None
    return {"pid": os.getpid(), "nice": os.getpriority(os.PRIO_PROCESS, 0), "policy": policy}


def hold(seconds: float, label: str) -> dict:
    start = time.time()
    time.sleep(seconds)
    return {"label": label, "start": start, "end": time.time()}


def hold_until(go: str, label: str, limit_s: float = 60.0) -> dict:
    """Runs until the file `go` exists (or limit_s passes): the test says when a run ends, so
    no outcome hangs on how fast this machine starts the next one."""
    start = time.time()
    while not Path(go).exists() and time.time() - start < limit_s:
        time.sleep(0.01)
    return {"label": label, "start": start, "end": time.time()}


def refuse(param: str) -> dict:
    raise InvalidParamError(param, "must be between 1 and 8")


def die() -> dict:
    os._exit(3)
