"""Background measurements that give way to the live engine (issue 40).

`make run`'s first start measures the machine (bench/calibrate.py, then bench/figures.py) beside
the engine the learner drives. Nice 19 and SCHED_IDLE were not enough: beside that measurement
the live engine served 8.0 tok/s against 160.5 alone, on 2 cores (issue 40). So the
measurement runs in its own process group, and a watcher stops the whole group (SIGSTOP) the
moment the live fleet has a request, and continues it (SIGCONT) once the fleet has had none for
RESUME_AFTER_S. The measurement counts the SIGCONTs (engine/platform/host_load.py) and drops the timings
a pause fell inside. A run that ends with REFUSED_EXIT (measured on a busy machine, not kept) is
tried again RETRY_S later, at most TRIES times in all, and then said once and left. The watcher
reaps the process; stop() ends it with the server.

Its own process group in the server's session: if the server dies without stop(), the group is
orphaned with a stopped member, and the kernel sends it SIGHUP then SIGCONT, so nothing is left
stopped forever.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

POLL_S = 0.05  # how soon a new request stops the measurement
RESUME_AFTER_S = 2.0  # the fleet idle this long before it continues
RETRY_S = 600.0
TRIES = 3
REFUSED_EXIT = 3  # bench/calibrate.py's and bench/figures.py's "measured on a busy machine"

log = logging.getLogger("servelab.background")


@dataclass
class YieldState:
    """What the watcher has done so far (the log and the tests read it)."""

    tries: int = 0
    pauses: int = 0
    paused_s: float = 0.0
    paused: bool = False
    exit_codes: tuple[int, ...] = ()
    done: bool = False


class YieldingProcess:
    """One background command, paused whenever `busy()` says the live engine has work."""

    def __init__(
        self,
        command: list[str],
        busy: Callable[[], bool],
        log_path: Path,
        cwd: Path | None = None,
        retry_s: float = RETRY_S,
        tries: int = TRIES,
        resume_after_s: float = RESUME_AFTER_S,
    ) -> None:
        self.command, self.busy, self.log_path, self.cwd = command, busy, log_path, cwd
        self.retry_s, self.tries, self.resume_after_s = retry_s, tries, resume_after_s
        self.state = YieldState()
        self.process: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="background-measurement", daemon=True)

    def start(self) -> YieldingProcess:
        self._thread.start()
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.state.tries += 1
            code = self._run_once()
            self.state.exit_codes += (code,)
            if code != REFUSED_EXIT or self._stop.is_set():
                break
            if self.state.tries >= self.tries:
                log.warning("background measurement: the machine was busy on all %d tries; not tried again "
                            "(`make calibrate` on a quiet machine fits it)", self.tries)  # fmt: skip
                break
            log.info("background measurement: the machine was busy; trying again in %.0f s", self.retry_s)
            self._stop.wait(self.retry_s)
        self.state.done = True

    def _run_once(self) -> int:
        with open(self.log_path, "a") as out, self._lock:
            if self._stop.is_set():
                return -1
            self.process = subprocess.Popen(
                self.command, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT, process_group=0
            )
        idle_since: float | None = time.monotonic()
        paused_at = 0.0
        while self.process.poll() is None:
            now = time.monotonic()
            if self.busy():
                idle_since = None
                if not self.state.paused:
                    self._signal(signal.SIGSTOP)
                    self.state.paused, self.state.pauses, paused_at = True, self.state.pauses + 1, now
            else:
                idle_since = idle_since if idle_since is not None else now
                if self.state.paused and now - idle_since >= self.resume_after_s:
                    self._signal(signal.SIGCONT)
                    self.state.paused = False
                    self.state.paused_s += now - paused_at
            if self._stop.wait(POLL_S):
                break
        return self.process.wait()  # reaped: no zombie under the server

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.process.pid, sig)  # type: ignore[union-attr]
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 10.0) -> None:
        """The server stops: end the measurement (a later start tries again) and reap it."""
        with self._lock:
            self._stop.set()
            process = self.process
        if process is not None and process.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._thread.join(timeout)
