"""The remote lab's driver (issue 17): its round, SNAPSHOT_HZ times a second on a WallClockDriver
(the one thread and the only wall clock behind a RemoteLab), probes /v1/models if that is due (on
its own thread: a remote that does not answer never holds the stream up), scrapes /metrics, sums
up the errors and publishes the snapshot."""

from __future__ import annotations

import threading
from typing import Protocol

from engine.clock import Clock
from engine.serving.driver import WallClockDriver
from engine.serving.telemetry.snapshot import (
    SNAPSHOT_HZ,  # the live fleet's rate: the stream's contract is at least 5 a second
)

PROBE_EVERY_S = 2.0  # while the remote is down or not OpenAI-compatible


class Polled(Protocol):
    """What the poller drives (RemoteLab): its clock, and three calls a round."""

    clock: Clock

    def probe_due(self) -> bool:
        """Whether a probe of /v1/models is due now; books the next one if it is."""
        ...

    def probe_now(self) -> None: ...

    def poll(self) -> None:
        """Scrape /metrics if the remote is reachable, sum up the errors, publish the snapshot."""
        ...


class RemotePoller:
    """The remote lab's driver: the one thread, and the only wall clock, behind it."""

    def __init__(self, lab: Polled, hz: float = SNAPSHOT_HZ) -> None:
        self.lab = lab
        self.period_s = 1.0 / hz
        self._probing = threading.Event()  # a probe on its own thread is still out
        self._driver = WallClockDriver("remote-poller")

    def start(self) -> None:
        self._driver.every(self.period_s, self._step)

    def stop(self) -> None:
        self._driver.stop()

    def tick(self, wait_for_probe: bool = True) -> None:
        """One round: probe /v1/models if due (on its own thread when not waited for: a remote
        that does not answer must not hold the stream up), scrape, summarise errors, publish."""
        lab = self.lab
        if lab.probe_due():
            if wait_for_probe:
                lab.probe_now()
            elif not self._probing.is_set():
                self._probing.set()
                threading.Thread(target=self._probe, name="remote-probe", daemon=True).start()
        lab.poll()

    def _probe(self) -> None:
        try:
            self.lab.probe_now()
        finally:
            self._probing.clear()

    def _step(self) -> bool:
        self.tick(wait_for_probe=False)  # the driver logs a failed round and runs the next
        return True
