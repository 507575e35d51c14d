"""What the web layer needs of a lab: the one face the live stream (web/live.py) and the pages
(web/pages.py) depend on. Two labs have it: LiveLab (engine/lab/live/lab.py: ServeLab's own
engine, or its simulated fleet) and RemoteLab (engine/lab/remote/remote_lab.py: an existing vLLM,
SGLang or ServeLab server driven and watched from outside). The web layer never asks which."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from engine.errors import InvalidParamError
from engine.lab.envelope import Envelope
from engine.lab.flood import FloodState
from engine.lab.remote.remote_metrics import RemoteSnapshot
from engine.platform.machine import EnginePlan
from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.snapshot import FleetSnapshot
from engine.serving.telemetry.traces import RequestTraces

# What a lab publishes several times a second and takes back in snapshot(), typed either way: a
# FleetSnapshot from a fleet of ours (live or simulated); a RemoteSnapshot of a remote server's
# metrics (engine/lab/remote/remote_metrics.py: the stream's keys, None where the remote does not
# expose one, named in `missing`). The web floor only hands it back; each becomes JSON (to_json)
# inside its lab's snapshot().
Reading = FleetSnapshot | RemoteSnapshot


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


class RankHangAction(enum.StrEnum):
    """The hang_rank event's `action` (the failure gallery's buttons; engine/lab/live/rank_hang.py)."""

    STOP = "stop"  # SIGSTOP one rank of a ready sharded replica
    RESUME = "resume"  # SIGCONT it

    @classmethod
    def parse(cls, value: object) -> RankHangAction:
        """The socket's word, or InvalidParamError naming `action` (the socket answers it as a 400)."""
        try:
            return cls(value)
        except ValueError:
            raise InvalidParamError("action", f"must be {' or '.join(cls)}") from None


@dataclass(frozen=True)
class RankHangAnswer:
    """What a hang_rank action did, for the page (the socket's acknowledgement): which rank of
    which replica was stopped or resumed. A stop says whether the replica's collective_timeout
    guards it; a resume, whether the rank was still there to resume."""

    message: str
    stopped: bool
    replica: int
    pid: int
    guarded: bool | None = None  # a stop's
    resumed: bool | None = None  # a resume's

    def to_json(self) -> dict[str, Any]:
        out = {"message": self.message, "stopped": self.stopped, "replica": self.replica, "pid": self.pid}
        return out | ({"guarded": self.guarded} if self.stopped else {"resumed": self.resumed})


@dataclass(frozen=True)
class BackgroundWork:
    """What runs behind the page, read off the process: simulation pacers alive, the live flood on."""

    sim_pacers: int
    live_traffic: bool


@dataclass(frozen=True)
class SimState:
    """The simulated fleet as the page shows it: its badge, its clock and speed, what it served."""

    badge: str
    sim_time_s: float
    speed: int
    achieved_speed: float
    running: bool  # its pacer runs
    finished: int
    load_s: float  # a replica's weight load, simulated seconds


@dataclass(frozen=True)
class RemoteView:
    """What a remote lab knows of its server, for the page's banner and read-only levers."""

    base_url: str
    metrics_url: str
    flavour: str
    model: str | None
    max_model_len: int | None
    server: str | None
    reachable: bool
    problems: list[str]
    lab_levers: list[str]  # the levers the lab applies itself (traffic, clients, proxy)
    readonly: dict[str, str]  # each lever the remote owns, with its value where it says
    errors: dict[str, int]  # the remote's errors by kind, so far


@dataclass(frozen=True)
class LabState:
    """What the pages show of a lab (the header, the levers, the envelope, the traffic): live_state(),
    sent in `hello` and in each snapshot's `lab`, and given to the page templates, as to_json().
    ServeLab's own engine (live or simulated) says what it runs on (`engine`) or why it cannot
    serve (`problem`); a remote lab names its server instead (`backend`, `remote`)."""

    model: str
    device: str
    dtype: str
    devices: int
    status: LabStatus
    levers: dict[str, Any]
    envelope: Envelope | None
    traffic: FloodState
    executor: Executor
    run: int
    badge: str | None
    sim: SimState | None
    running: BackgroundWork
    engine: EnginePlan | None = None
    problem: str | None = None
    backend: str | None = None
    remote: RemoteView | None = None

    def to_json(self) -> dict[str, Any]:
        # The keys and their order as the page has always had them: a lab of ours has no
        # backend/remote keys, a remote lab no engine/problem keys.
        ours = self.remote is None
        out: dict[str, Any] = {"model": self.model, "device": self.device, "dtype": self.dtype}
        if ours:
            out |= {"engine": self.engine.to_json() if self.engine is not None else None, "problem": self.problem}
        else:
            out["backend"] = self.backend
        out |= {
            "devices": self.devices,
            "status": self.status,
            "levers": dict(self.levers),
            "envelope": self.envelope.to_json() if self.envelope is not None else None,
            "traffic": self.traffic.to_json(),
            "executor": self.executor,
            "run": self.run,
            "badge": self.badge,
            "sim": asdict(self.sim) if self.sim is not None else None,
        }
        if self.remote is not None:
            out["remote"] = asdict(self.remote)
        return out | {"running": asdict(self.running)}


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

    def hang_rank(self, action: RankHangAction) -> RankHangAnswer:
        """The collective_timeout row's fault: "stop" one rank of a tensor-parallel replica
        (SIGSTOP), "resume" it (SIGCONT); refused where no process of the lab's runs a rank."""
        ...

    def live_state(self) -> LabState:
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
