"""What the web layer needs of a lab: the one face the live stream (web/live.py) and the pages
(web/pages.py) depend on. Two labs have it: LiveLab (engine/lab/live/lab.py: ServeLab's own
engine, or its simulated fleet) and RemoteLab (engine/lab/remote/remote_lab.py: an existing vLLM,
SGLang or ServeLab server driven and watched from outside). The web layer never asks which."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.traces import RequestTraces


class LabFacade(Protocol):
    levers: dict[str, Any]  # the lab's current lever values (the pages' inputs)
    run: int  # which fleet the stream shows (a new one per executor switch)

    @property
    def traces(self) -> RequestTraces | None:
        """The request traces the swimlanes and batch chart read (the simulated fleet's while it
        runs); None where no engine of ours serves (a remote lab)."""
        ...

    @property
    def events(self) -> EventLog:
        """The event log the timeline reads with a cursor."""
        ...

    @property
    def executor(self) -> str:
        """ "live", "sim" or "remote": what the stream's snapshots come from."""
        ...

    def subscribe(self, callback: Callable[[dict[str, Any]], None]) -> None:
        """callback(snapshot), several times a second, for the live stream."""
        ...

    def set_levers(self, changes: dict[str, Any], source: str = "lab") -> dict[str, Any]:
        """Validate and apply; InvalidParamError / ServingError naming the lever otherwise."""
        ...

    def flood(self, action: str, ramp_to: float | None = None, ramp_s: float = 30.0) -> dict[str, Any]:
        """The lab's traffic: start, ramp or stop."""
        ...

    def hang_rank(self, action: str) -> dict[str, Any]:
        """The collective_timeout row's fault: "stop" one rank of a tensor-parallel replica
        (SIGSTOP), "resume" it (SIGCONT); refused where no process of the lab's runs a rank."""
        ...

    def live_state(self) -> dict[str, Any]:
        """What the pages show of the lab (status, model, levers, traffic, ...)."""
        ...

    def cancel_user(self, user: str) -> int:
        """Cancel every request of this OpenAI `user` still in flight (a student who left a class);
        how many were cancelled."""
        ...

    def snapshot(self, snap: dict[str, Any]) -> dict[str, Any]:
        """A metrics snapshot plus the lab's view of it, as the stream sends it."""
        ...

    def stop(self) -> None: ...
