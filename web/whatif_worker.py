"""What-if runs (A/B, at scale, predict) off the live engine's cores (issue 26).

A simulation is pure CPU. Run in a Flask request thread at normal priority it took its share of
the two cores from the live replica (BENCHMARKS.md measured a live step 1.71x slower beside 0.15
of a core). So every run goes to one worker process, started on first use, at the lowest CPU
priority the OS offers (nice 19 and, on Linux, SCHED_IDLE: it runs only on cycles nothing else
wants), one run at a time in arrival order. A caller may name a ticket and ask its place in the
line meanwhile (`position`); past MAX_WAITING runs in line a new one is refused with 429.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidParamError, ServingError

MAX_WAITING = 8


def _lowest_priority() -> None:
    """The worker's initializer: below every other process on this machine."""
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        os.nice(19)  # its CPU time is /proc/stat's `nice` column, which the replicas' governor leaves out
        if sys.platform == "linux":
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        pass  # a platform without them runs the worker at the priority it has


@dataclass(frozen=True)
class Failure:
    """An error raised in the worker, carried back as plain fields (custom exceptions with
    several constructor arguments do not survive pickling)."""

    status: int
    message: str
    param: str | None
    code: str | None
    invalid_param: bool = False  # an InvalidParamError, else a ServingError

    def error(self) -> Exception:
        if self.invalid_param:
            return InvalidParamError(self.param or "body", self.message)
        return ServingError(self.status, self.message, self.param, self.code)


def _call(fn: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> dict[str, Any] | Failure:
    """Runs in the worker: fn(*args), its refusals as a Failure."""
    try:
        return fn(*args)
    except InvalidParamError as err:
        return Failure(400, err.message, err.param, None, invalid_param=True)
    except ServingError as err:
        body = err.body()["error"]
        return Failure(err.status, body["message"], body.get("param"), body.get("code"))


class WhatIfWorker:
    def __init__(self, max_waiting: int = MAX_WAITING) -> None:
        self.max_waiting = max_waiting
        self._pool: ProcessPoolExecutor | None = None
        self._line: list[str] = []  # tickets: the running one first, then the waiting, in order
        self._turn = threading.Condition()

    def position(self, ticket: str) -> int | None:
        """0: running; n: n runs ahead of it; None: not in line (done, or never came)."""
        with self._turn:
            return self._line.index(ticket) if ticket in self._line else None

    def waiting(self) -> int:
        with self._turn:
            return len(self._line)

    def run(self, fn: Callable[..., dict[str, Any]], *args: Any, ticket: str | None = None) -> dict[str, Any]:
        """fn(*args) in the worker once every run ahead of this one has finished. fn must be a
        module-level function and args picklable."""
        ticket = ticket or uuid.uuid4().hex
        with self._turn:
            if len(self._line) > self.max_waiting or ticket in self._line:
                raise ServingError(
                    429, f"{len(self._line)} what-if runs are in line; try again in a moment", None, "busy", 5
                )
            self._line.append(ticket)
            while self._line[0] != ticket:
                self._turn.wait()
        try:
            answer = self._submit(fn, args)
        finally:
            with self._turn:
                self._line.remove(ticket)
                self._turn.notify_all()
        if isinstance(answer, Failure):
            raise answer.error()
        return answer

    def _submit(self, fn: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> dict[str, Any] | Failure:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")  # no copy of the web process's threads
            self._pool = ProcessPoolExecutor(1, mp_context=context, initializer=_lowest_priority)
        try:
            return self._pool.submit(_call, fn, args).result()
        except BrokenProcessPool as err:
            self._pool = None  # the next run starts a fresh worker
            raise ServingError(500, "the what-if worker died during this run", None, "worker_died") from err

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
