"""What the web layer needs of a lab: the one face the live stream (web/live.py) and the pages
(web/pages.py) depend on. Two labs have it: LiveLab (engine/lab/live/lab.py: ServeLab's own
engine, or its simulated fleet) and RemoteLab (engine/lab/remote/remote_lab.py: an existing vLLM,
SGLang or ServeLab server driven and watched from outside). The web layer never asks which."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.lab.flood import FloodState
from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.snapshot import FleetSnapshot
from engine.serving.telemetry.traces import RequestTraces

# What a lab publishes several times a second and takes back in snapshot(): a FleetSnapshot from
# a fleet of ours (live or simulated); a remote server's readings, already in the stream's keys
# (engine/lab/remote/remote_metrics.py: a key the remote does not expose is None, named in `missing`).
Reading = FleetSnapshot | dict[str, Any]



class Executor(enum.StrEnum):
    """What the stream's snapshots come from (the `executor` lever's values, and a remote lab's)."""

    LIVE = "live"  # ServeLab's own engine on this machine
    SIM = "sim"  # the simulated fleet on the what-if executor's clock
    REMOTE = "remote"  # an existing server the lab drives from outside


class LabStatus(enum.StrEnum):
    """The header's word for a lab's state (the pages' status dot takes it as its CSS class)."""

    STARTING = "starting"
    SERVING = "serving"
    REBUILDING = "rebuilding"  # a lever that needs new replicas is being applied
    FAILED = "failed"  # no replica became ready
    SIMULATING = "simulating"
    # A remote lab's (engine/lab/remote/remote_lab.py)
    CONNECTING = "connecting"
    UNREACHABLE = "unreachable"
    NOT_OPENAI = "not OpenAI-compatible"
    REFUSED = "refused"
    SERVING_WITHOUT_METRICS = "serving (no metrics)"


@dataclass(frozen=True)
class LeverChange:
    """What a set_levers did: the levers whose values changed, whether replicas are rebuilt for
    them, and every lever's value now. Each lab's set_levers is the same path: validate_levers,
    the lab's own check (nothing applies if it refuses), apply, announce, this."""

    changed: dict[str, Any]
    rebuild: bool
    levers: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"changed": dict(self.changed), "rebuild": self.rebuild, "levers": dict(self.levers)}


def announce(events: EventLog, source: str, changed: dict[str, Any], how: str) -> None:
    """A lever change in the event timeline: who moved what, and how it applied."""
    if changed:
        text = ", ".join(f"{k}={v}" for k, v in changed.items())
        events.emit("config", f"{source}: {text} ({how})", levers=changed)


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
    def executor(self) -> Executor:
        """What the stream's snapshots come from."""
        ...

    def subscribe(self, callback: Callable[[Reading], None]) -> None:
        """callback(reading), several times a second, for the live stream (web/live.py hands it
        back to snapshot())."""
        ...

    def set_levers(self, changes: dict[str, Any], source: str = "lab") -> LeverChange:
        """Validate and apply; InvalidParamError / ServingError naming the lever otherwise."""
        ...

    def flood(self, action: str, ramp_to: float | None = None, ramp_s: float = 30.0) -> FloodState:
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

    def snapshot(self, reading: Reading) -> dict[str, Any]:
        """A reading the lab published plus the lab's view of it: the stream's `metrics` payload."""
        ...

    def stop(self) -> None: ...
