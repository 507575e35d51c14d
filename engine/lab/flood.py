"""The flood: one set of controls (start, ramp, stop) over whichever traffic a lab drives: the live
lab's clients, the remote lab's (the same Traffic, aimed at the remote) or the simulated lab's
arrivals on the virtual clock. Each lab says only how far its traffic may go."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from engine.errors import InvalidParamError
from engine.serving.telemetry.events import EventLog


class FloodAction(enum.StrEnum):
    START = "start"  # send at the request_rate lever
    RAMP = "ramp"  # climb linearly from request_rate to a target over a duration
    STOP = "stop"  # send no more; requests in flight finish


@dataclass(frozen=True)
class FloodLimits:
    most_rate: float  # req/s a ramp may reach
    longest_ramp_s: float = 600.0


@dataclass(frozen=True)
class FloodState:
    """What the pages show of a lab's traffic (the JSON of flood answers and the lab's facts)."""

    running: bool
    rate: float  # req/s now (the ramp's, or the lever's; 0 while stopped)
    sent: int
    refused: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class FloodSource(Protocol):
    """Traffic the flood drives: engine/lab/traffic.py's Traffic, and the simulated lab's arrivals."""

    @property
    def running(self) -> bool: ...

    @property
    def sent(self) -> int: ...

    @property
    def refused(self) -> int: ...

    def current_rate(self) -> float: ...

    def start(self, ramp_to: float | None, ramp_s: float) -> None: ...

    def stop(self) -> None: ...


def check_ramp(ramp_to: object, ramp_s: object, limits: FloodLimits) -> None:
    """A ramp's target rate in (0, most_rate] req/s over [0, longest_ramp_s] s, else InvalidParamError."""
    if not isinstance(ramp_to, (int, float)) or isinstance(ramp_to, bool) or not 0 < ramp_to <= limits.most_rate:
        raise InvalidParamError("to", f"the ramp's target rate must be in (0, {limits.most_rate:g}] req/s")
    if not isinstance(ramp_s, (int, float)) or isinstance(ramp_s, bool) or not 0 <= ramp_s <= limits.longest_ramp_s:
        raise InvalidParamError("over_s", f"the ramp's duration must be in [0, {limits.longest_ramp_s:g}] s")


def flood_state(source: FloodSource) -> FloodState:
    running = source.running
    return FloodState(running, round(source.current_rate() if running else 0.0, 2), source.sent, source.refused)


def flood(
    source: FloodSource, action: str, ramp_to: object, ramp_s: object, limits: FloodLimits, events: EventLog,
    where: str = "",
) -> FloodState:
    """Carry out one flood control on source, say it in the event log (`where` names traffic that
    is not the live engine's: "simulated ", "remote "), and answer the traffic's state."""
    try:
        act = FloodAction(action)
    except ValueError:
        raise InvalidParamError("action", "must be start, ramp or stop") from None
    if act is FloodAction.STOP:
        source.stop()
        events.emit("flood", f"{where}traffic stopped")
        return flood_state(source)
    if act is FloodAction.RAMP:
        check_ramp(ramp_to, ramp_s, limits)
        target, over = float(ramp_to), float(ramp_s)  # type: ignore[arg-type]
        source.start(target, over)
        events.emit("flood", f"{where}traffic on: ramping to {target:g} req/s over {over:g} s")
    else:
        source.start(None, 30.0)
        events.emit("flood", f"{where}traffic on: sending {source.current_rate():g} req/s")
    return flood_state(source)
