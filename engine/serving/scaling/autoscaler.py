"""The autoscaler: reads the fleet's load, decides how many replicas should serve, and asks the
fleet for them.

Four signals come from the metrics bus: requests queued (the router's queue plus any waiting
inside replicas), batch-slot use (sequences in the batch / max_num_seqs), KV use (blocks used /
blocks held) and, when a target is set (ttft_target_ms), the p99 time to first token over the
metrics' sliding window (the figure the page charts). Pressure on any of them for the whole short
window (up_window_s) adds replicas; every signal low for the whole long window (down_window_s)
drains one. TTFT is pressure above its target and calm only at or under ttft_low of it (half):
between the two the fleet keeps its size, so a fleet that meets the target, and would miss it one
replica smaller, is not drained only to order the replica back.
With no first token in the window TTFT says nothing either way, and it orders nothing until a
whole metrics window (ttft_settle_s) has passed since capacity last changed: before then the p99
still holds the old fleet's first tokens. Replicas still starting or provisioning count as
capacity already ordered, so a queue (or a slow first token) that is already being answered never
orders again; any change in capacity restarts both windows, so flapping load cannot flap the
fleet. `decide` is pure (signals in, a Decision out) so tests feed it recorded traces on a
VirtualClock; `tick` is the actuator that reads the fleet and calls it, one round at the clock's
now(): a driver runs it every tick_s (a thread live, the EventLoop in simulation).

Two of those guards are defence levers (engine/serving/routing/defences.py), read from the fleet's
Defences at each decision: `asymmetric_windows` off uses the short window both ways, so a load
that hovers at the threshold scales in at the first lull and out at the next burst (the replica
count flaps); `count_pending` off counts only ready replicas as capacity when reacting to load,
so every up window during a long provisioning delay orders again what is already on its way. The
floor (min_replicas) still counts starting replicas either way: it is not a reaction to load."""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Protocol

from engine.clock import WALL_CLOCK, Clock
from engine.serving.driver import Driver, WallClockDriver
from engine.serving.replicas.replica_api import PoolState, ReplicaState
from engine.serving.routing.defences import Defences
from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.metrics import WINDOW_S as METRICS_WINDOW_S
from engine.serving.telemetry.snapshot import FleetSnapshot

log = logging.getLogger("servelab.autoscaler")

ORDERED = (ReplicaState.STARTING, PoolState.PROVISIONING)  # replica states that are capacity on its way
LEVERS = ("min_replicas", "max_replicas", "warm_pool", "provision_delay_s")  # engine/levers.py keys it takes live
FLEET_SETTINGS = ("warm_pool", "provision_delay_s")  # the fleet keeps these; the autoscaler passes them on
# engine/levers.py keys it reads as a target only: a fleet without an autoscaler needs no rebuild for them.
TARGET_LEVERS = ("ttft_target_ms",)


@dataclass
class AutoscalerConfig:
    min_replicas: int = 1
    max_replicas: int = 2
    # Orders for the fleet, which keeps them (FleetConfig): set on it when the autoscaler is made,
    # never held here after. None leaves the fleet's.
    warm_pool: int | None = None
    provision_delay_s: float | None = None
    up_window_s: float = 5.0  # pressure this long scales up
    down_window_s: float = 30.0  # calm this long scales down
    queue_high: float = 8.0  # queued requests per ready replica above which the fleet is behind
    slot_high: float = 0.9  # batch slots in use, fraction: at or above is pressure
    kv_high: float = 0.9  # KV blocks in use, fraction: at or above is pressure
    queue_low: float = 0.0  # calm: queued requests per ready replica at or below this,
    slot_low: float = 0.3  # and slots and KV at or below these
    kv_low: float = 0.3
    ttft_target_ms: float | None = None  # p99 TTFT above this is pressure; None or 0: the signal is off
    ttft_low: float = 0.5  # calm needs p99 TTFT at or below this fraction of the target too
    # The p99 is over the metrics' sliding window: until a whole window has passed since capacity
    # last changed it still holds first tokens of the old fleet, and would order again for them.
    ttft_settle_s: float = METRICS_WINDOW_S
    tick_s: float = 0.5

    @classmethod
    def from_levers(cls, levers: dict[str, Any], **settings: Any) -> AutoscalerConfig:
        """The lab's lever values (only LEVERS and TARGET_LEVERS are read), plus any other settings."""
        return cls(**{k: levers[k] for k in (*LEVERS, *TARGET_LEVERS) if k in levers}, **settings)


@dataclass(frozen=True)
class Signals:
    """One sample of what the autoscaler looks at."""

    time: float
    queued: int
    slot_util: float
    kv_util: float
    ready: int
    starting: int  # ordered and not yet ready: provisioning or loading
    draining: int = 0
    ttft_p99_s: float | None = None  # over the metrics' window; None: no first token in it

    @property
    def capacity(self) -> int:
        return self.ready + self.starting

    @classmethod
    def from_snapshot(cls, snap: FleetSnapshot) -> Signals:
        states, slots, kv = snap.replicas, snap.max_num_seqs, snap.kv_total_blocks
        return cls(
            time=snap.time,
            queued=snap.queue_depth + snap.waiting,
            slot_util=snap.batch_size / slots if slots else 0.0,
            kv_util=snap.kv_used_blocks / kv if kv else 0.0,
            ready=states.get(ReplicaState.READY, 0),
            starting=sum(states.get(s, 0) for s in ORDERED),
            draining=states.get(ReplicaState.DRAINING, 0),
            ttft_p99_s=snap.ttft_p99,
        )


@dataclass(frozen=True)
class Decision:
    delta: int  # replicas to add (+) or drain (-); 0 is a hold worth telling
    reason: str


class Scalable(Protocol):
    """What the autoscaler needs of a fleet (engine.serving.scaling.fleet.Fleet)."""

    events: EventLog
    defences: Defences  # read at each decision: the lab changes it in place
    unservable: str | None  # set: no replica can load here; the autoscaler orders nothing
    warm_pool: int | None
    provision_delay_s: float | None

    def snapshot(self) -> FleetSnapshot: ...
    def scale_up(self, count: int = 1) -> str: ...
    def scale_down(self) -> str: ...
    def set_warm_pool(self, count: int) -> None: ...
    def set_provision_delay(self, seconds: float) -> None: ...


class Autoscaler:
    """Decides when ticked: by a driver after start(), or by hand. The fleet's warm_pool and
    provision_delay_s pass through it (from the config here, live by reconfigure)."""

    def __init__(self, fleet: Scalable, config: AutoscalerConfig | None = None, clock: Clock = WALL_CLOCK) -> None:
        self.fleet = fleet
        config = config or AutoscalerConfig()
        self.config = replace(config, warm_pool=None, provision_delay_s=None)
        self.clock = clock
        self.decisions: list[Decision] = []  # every decision acted on or told, oldest first
        self._hot_since: float | None = None
        self._calm_since: float | None = None
        self._held = False  # a hold was told in this pressure streak
        self._last_capacity: tuple[int, int] | None = None
        self._capacity_since = 0.0  # when capacity last changed: TTFT from before then is stale
        self._last = ""  # the last decision's message, for status()
        self._driver: Driver | None = None
        self._own_driver: WallClockDriver | None = None
        self._runs = 0
        self._lock = threading.Lock()
        if config.warm_pool is not None:  # the pool first: its orders keep the delay of the moment
            fleet.set_warm_pool(config.warm_pool)
        if config.provision_delay_s is not None:
            fleet.set_provision_delay(config.provision_delay_s)

    # the decision -------------------------------------------------------------------------------

    def decide(self, s: Signals) -> Decision | None:
        """What to do now, given this sample and the streaks behind it; None is: nothing."""
        c = self.config
        floor, ceiling = max(1, c.min_replicas), max(1, c.max_replicas)  # with none, no queue would wake it
        if self._last_capacity != (s.ready, s.starting):  # capacity changed: the windows start over
            self._last_capacity, self._capacity_since = (s.ready, s.starting), s.time
            self._hot_since = self._calm_since = None
            self._held = False
        if s.capacity < floor:
            return Decision(floor - s.capacity, f"{self._count(s)} < min_replicas {floor}: +{floor - s.capacity}")
        defences = self.fleet.defences
        if not defences.count_pending:  # the defence off: what is starting is not capacity
            s = replace(s, starting=0)
        if s.capacity > ceiling:
            return Decision(-1, f"{self._count(s)} > max_replicas {ceiling}: -1")
        down_window_s = c.down_window_s if defences.asymmetric_windows else c.up_window_s
        pressure, calm = self._pressure(s), self._calm(s)
        self._hot_since = (self._hot_since if self._hot_since is not None else s.time) if pressure else None
        self._calm_since = (self._calm_since if self._calm_since is not None else s.time) if calm else None
        if pressure is None:
            self._held = False
        elif s.time - self._hot_since >= c.up_window_s:
            return self._scale_up(s, pressure, s.time - self._hot_since)
        if calm and s.time - self._calm_since >= down_window_s and s.ready > floor and not s.starting:
            if s.draining:
                return None  # one drain at a time
            return Decision(-1, f"{calm} for {s.time - self._calm_since:.0f} s: -1 (drain one of {s.ready} ready)")
        return None

    def _scale_up(self, s: Signals, pressure: str, lasted: float) -> Decision | None:
        c = self.config
        want = min(max(1, c.max_replicas), max(s.ready + 1, math.ceil(s.queued / c.queue_high)))
        order = want - s.capacity
        pending = f"{s.starting} already starting"
        if order > 0:
            return Decision(order, f"{pressure} for {lasted:.0f} s: +{order}" + (f", {pending}" if s.starting else ""))
        if self._held:
            return None
        self._held = True
        why = pending if s.starting else f"at max_replicas {c.max_replicas}"
        return Decision(0, f"{pressure} for {lasted:.0f} s: holding, {why}")

    def _pressure(self, s: Signals) -> str | None:
        c = self.config
        if s.ready and s.queued > c.queue_high * s.ready:
            return f"queue depth {s.queued} > {c.queue_high * s.ready:g}"
        if s.ready and s.kv_util >= c.kv_high:
            return f"KV {s.kv_util:.0%} >= {c.kv_high:.0%}"
        if s.ready and s.slot_util >= c.slot_high:
            return f"batch slots {s.slot_util:.0%} >= {c.slot_high:.0%}"
        ttft_ms = self._ttft_ms(s)
        settled = s.time - self._capacity_since >= c.ttft_settle_s
        if s.ready and settled and ttft_ms is not None and c.ttft_target_ms and ttft_ms > c.ttft_target_ms:
            return f"p99 TTFT {ttft_ms:.0f} ms > target {c.ttft_target_ms:g} ms"
        return None

    def _calm(self, s: Signals) -> str | None:
        c = self.config
        if s.queued > c.queue_low * s.ready or s.slot_util > c.slot_low or s.kv_util > c.kv_low:
            return None
        queue = f"queue {s.queued} <= {c.queue_low * s.ready:g}" if c.queue_low else "queue empty"
        calm = f"{queue}, slots {s.slot_util:.0%} <= {c.slot_low:.0%}, KV {s.kv_util:.0%} <= {c.kv_low:.0%}"
        ttft_ms = self._ttft_ms(s)
        if ttft_ms is None or not c.ttft_target_ms:  # no target, or no first token in the window
            return calm
        # Stale or not: after a scale-up the old window is pessimistic, so it only delays a drain.
        if ttft_ms > c.ttft_low * c.ttft_target_ms:
            return None
        return f"{calm}, p99 TTFT {ttft_ms:.0f} ms <= {c.ttft_low * c.ttft_target_ms:g} ms"

    @staticmethod
    def _ttft_ms(s: Signals) -> float | None:
        return None if s.ttft_p99_s is None else s.ttft_p99_s * 1000

    @staticmethod
    def _count(s: Signals) -> str:
        return f"{s.ready} ready + {s.starting} starting"

    # the actuator -------------------------------------------------------------------------------

    def tick(self) -> Decision | None:
        """Read the fleet, decide, act, and tell the live stream why."""
        with self._lock:
            if self.fleet.unservable is not None:  # the fleet said why, once; ordering cannot help
                return None
            decision = self.decide(Signals.from_snapshot(self.fleet.snapshot()))
            if decision is None:
                return None
            done = ""
            if decision.delta > 0:
                done = self.fleet.scale_up(decision.delta)
            elif decision.delta < 0:
                done = self.fleet.scale_down()
            self.decisions.append(decision)
            message = decision.reason + (f" ({done})" if done else "")
            self.fleet.events.emit("scale", message, delta=decision.delta, reason=decision.reason)
            self._last = message
            log.info("autoscaler: %s", message)
            return decision

    def reconfigure(self, **changes: Any) -> None:
        """Live levers: min_replicas, max_replicas, warm_pool, provision_delay_s (and any other
        AutoscalerConfig field). The fleet takes the pool and the delay at once; the bounds apply
        from the next tick."""
        known = {f.name for f in fields(AutoscalerConfig)}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"not autoscaler settings: {sorted(unknown)}")
        with self._lock:
            for key, value in changes.items():
                if key not in FLEET_SETTINGS:
                    setattr(self.config, key, value)
            if changes.get("warm_pool") is not None:
                self.fleet.set_warm_pool(int(changes["warm_pool"]))
            if changes.get("provision_delay_s") is not None:
                self.fleet.set_provision_delay(float(changes["provision_delay_s"]))

    def status(self) -> dict[str, Any]:
        """For the live page: the settings, the streaks under way and the last decision."""
        now = self.clock.now()
        return {
            "running": self.running,
            "config": asdict(self.config)
            | {"warm_pool": self.fleet.warm_pool, "provision_delay_s": self.fleet.provision_delay_s},
            "pressure_for_s": None if self._hot_since is None else round(now - self._hot_since, 1),
            "calm_for_s": None if self._calm_since is None else round(now - self._calm_since, 1),
            "last_decision": self._last,
        }

    def start(self, driver: Driver | None = None) -> None:
        """Tick every tick_s on `driver` (the simulation's EventLoop), or live on a thread of its own."""
        if self.running:
            return
        if driver is None:
            driver = self._own_driver = WallClockDriver("autoscaler")
        self._driver, self._runs = driver, self._runs + 1
        run = self._runs  # a stop() and start() later, this run's ticks end

        def step() -> bool:
            return self._tick_step(run)

        # The first tick waits a period, as a timer's does: the fleet has just been made.
        driver.after(self.config.tick_s, lambda: driver.every(self.config.tick_s, step))

    def stop(self) -> None:
        self._driver = None
        if self._own_driver is not None:
            self._own_driver.stop()
            self._own_driver = None

    @property
    def running(self) -> bool:
        return self._driver is not None

    def _tick_step(self, run: int) -> bool:
        if self._driver is None or run != self._runs:
            return False
        try:
            self.tick()
        except Exception:  # a bad tick must not end autoscaling
            log.exception("autoscaler tick failed")
        return True
