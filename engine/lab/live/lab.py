"""The live lab: the levers' current values over one running fleet, and what moving one does.

A change reaches the engine the cheapest way it can (engine/levers.py says which): the traffic
generator reads load levers on its next arrival; the router takes queue levers in place; the
replicas take batch levers in place from their next step; the autoscaler takes its bounds and
pool; and the rest rebuild the replicas in the background (old ones drain, so nothing running
is cut), with the status visible.

How many replicas serve: the autoscaler keeps it within [min_replicas, max_replicas], and
gpu_count is the device budget, so at most gpu_count // tensor_parallel replicas ever run.

The lever `executor` switches the whole lab, for every browser, like any other lever: "sim"
starts one simulated fleet (engine/lab/simulated/lab_sim.py) from the live levers plus the simulator's
own (device, dtypes, pools, speed) and whatever the same change sets, checked by the simulator
first (a configuration it cannot run is refused with its reason, and nothing changes); the live
flood stops, and the live fleet stays up, idle, for the API. The stream then carries the
simulated fleet's snapshots and events through the same contract. "live" stops the simulated
fleet (its pacer thread ends: nothing simulated runs behind the page) and returns to the live
levers as they were. Only one simulated fleet ever runs; a change to its deployment (model,
device, GPUs, TP, dtypes, pools, paged, block size) replaces it, starting at simulated time 0."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from engine.config import EngineConfig
from engine.errors import InvalidParamError, ServingError
from engine.lab.envelope import MB, Facts, bottlenecks, envelope
from engine.lab.facade import (
    BackgroundWork,
    Executor,
    LabState,
    LabStatus,
    LeverChange,
    RankHangAction,
    RankHangAnswer,
    announce,
)
from engine.lab.flood import FloodLimits, FloodState, flood, flood_state
from engine.lab.lever_routes import Route, by_route, keys_routed
from engine.lab.live.lab_clients import simulated_client_fields
from engine.lab.live.rank_hang import RankHang
from engine.lab.live_limits import LIVE_FLOOD, check_live, live_devices
from engine.lab.replica_bounds import replica_bounds, split_pools
from engine.lab.shape import shape_for
from engine.lab.simulated.lab_check import check_sim, model_label
from engine.lab.simulated.lab_sim import SimLab
from engine.lab.traffic import TrafficDriver
from engine.levers import LEVERS, validate_levers
from engine.platform.machine import device_kind
from engine.serving.load.text_prompts import TextPrompts
from engine.serving.replicas.replica_api import SERVING
from engine.serving.routing.defences import Defences
from engine.serving.scaling.autoscaler import LEVERS as AUTOSCALER_LEVERS
from engine.serving.scaling.autoscaler import TARGET_LEVERS, Autoscaler, AutoscalerConfig
from engine.serving.scaling.fleet import Fleet
from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.snapshot import FleetSnapshot
from engine.serving.telemetry.traces import RequestTraces

log = logging.getLogger("servelab.lab")

DEFENCES = Defences.names()  # the serving layer's guards: fleet.defences takes them in place
# Kept for the simulated fleet; the live engine has no use for them (engine/lab/lever_routes.py).
SIM_ONLY = keys_routed(Executor.LIVE, Route.KEPT)
# Levers that are EngineConfig fields too; `model` and `device` are not: the levers name a
# simulator's model and GPU, the fields a path and a torch device.
ENGINE_LEVERS = tuple(key for key in LEVERS if key in EngineConfig.field_names() and key not in ("model", "device"))


def engine_fields(levers: dict[str, Any]) -> dict[str, Any]:
    """The EngineConfig fields these lever values set."""
    return {key: levers[key] for key in ENGINE_LEVERS}

# A simulated flood goes as far as the lever's own range (a live one: live_limits.LIVE_FLOOD).
SIM_FLOOD = FloodLimits(float(LEVERS["request_rate"].maximum or 0), longest_ramp_s=3600.0)

class LiveLab:
    def __init__(self, fleet: Fleet, levers: dict[str, Any] | None = None) -> None:
        self.fleet = fleet
        self.levers = {key: lever.default for key, lever in LEVERS.items()} | (levers or {})
        self.devices = live_devices(fleet.engine_config.device)
        check_live(self.levers, self.levers, self.devices, fleet.engine_config.device)
        self.levers["executor"] = Executor.LIVE  # the lab starts live; `executor` switches it (set_levers)
        fleet.defences.update(**{key: self.levers[key] for key in DEFENCES})  # the levers' one source
        self.sim_levers = dict(self.levers)  # the simulated fleet's, kept across switches
        self.sim: SimLab | None = None
        self.run = 0  # which fleet the stream shows: a new one per switch or simulated rebuild
        self._subscribers: list[Callable[[FleetSnapshot], None]] = []
        fleet.subscribe(self._live_snapshot)
        self.status = LabStatus.STARTING
        self._lock = threading.RLock()
        api_key = (fleet.router.config.api_keys or [None])[0]  # flood traffic passes the key check
        self.traffic = TrafficDriver(
            fleet.router, lambda: self.levers, api_key=api_key or "flood",
            texts=lambda: TextPrompts(fleet.tokenizer.encode),
        )  # fmt: skip
        self.autoscaler = Autoscaler(fleet, AutoscalerConfig.from_levers(self._scaling()))
        self.autoscaler.start()
        self.hangs = RankHang(lambda: fleet.replicas, fleet.events)  # the failure gallery's stopped rank
        threading.Thread(target=self._await_ready, name="lab-ready", daemon=True).start()

    @property
    def events(self) -> EventLog:
        """The event log the stream reads: the simulated fleet's while it runs."""
        sim = self.sim
        return self.fleet.events if sim is None else sim.events

    @property
    def traces(self) -> RequestTraces:
        """The request traces the stream reads: the simulated fleet's while it runs."""
        sim = self.sim
        return self.fleet.traces if sim is None else sim.fleet.traces

    @property
    def executor(self) -> Executor:
        return Executor.LIVE if self.sim is None else Executor.SIM

    @property
    def current_levers(self) -> dict[str, Any]:
        return self.levers if self.sim is None else self.sim_levers

    def subscribe(self, callback: Callable[[FleetSnapshot], None]) -> None:
        """callback(snapshot) for the stream: the live fleet's, or the simulated fleet's while it runs."""
        self._subscribers.append(callback)

    def _live_snapshot(self, snap: FleetSnapshot) -> None:
        if self.sim is None:
            for callback in list(self._subscribers):
                callback(snap)

    def _sim_snapshot(self, sim: SimLab, snap: FleetSnapshot) -> None:
        if self.sim is sim:  # a replaced or stopped fleet's last tick goes nowhere
            for callback in list(self._subscribers):
                callback(snap)

    # levers -------------------------------------------------------------------------------------

    def set_levers(self, changes: dict[str, Any], source: str = "lab") -> LeverChange:
        """Validate, then apply; returns what changed and how. A bad value raises
        InvalidParamError naming the lever, and nothing is applied."""
        clean = validate_levers(changes)
        with self._lock:
            if clean.get("executor", self.executor) == Executor.SIM:
                return self._set_sim(clean, source)
            if self.sim is not None:  # back to the live engine: nothing simulated runs after this
                self.sim.stop()
                self.sim, self.run = None, self.run + 1
                self.events.emit("config", f"{source}: executor=live (the simulated fleet stopped)", levers={"executor": Executor.LIVE})
            clean.pop("executor", None)
            for key in SIM_ONLY:
                if key in clean:
                    self.sim_levers[key] = self.levers[key] = clean.pop(key)
            merged = self.levers | clean
            check_live(clean, merged, self.devices, self.fleet.engine_config.device)
            if clean.get("prompt_style", "random") != "random":
                try:
                    self.traffic.text_prompts()
                except RuntimeError as err:
                    raise InvalidParamError("prompt_style", str(err)) from None
            changed = {k: v for k, v in clean.items() if self.levers[k] != v}
            routed = by_route(changed, Executor.LIVE)
            rebuild = list(routed[Route.REBUILD])
            if rebuild and self.status == LabStatus.REBUILDING:
                raise ServingError(
                    409, "the replicas are still being rebuilt; try again when they are ready", rebuild[0], "busy"
                )
            self.levers = merged
            self.traffic.levers_moved(routed[Route.LOAD])
            if routed[Route.ROUTER]:
                self.fleet.router.reconfigure(**routed[Route.ROUTER])
            if defences := routed[Route.DEFENCE]:
                self.fleet.defences.update(**defences)
                if defences.get("cancel_on_disconnect"):
                    self._cancel_orphans()
            if routed[Route.ENGINE]:
                self.fleet.reconfigure(**routed[Route.ENGINE])
            if routed[Route.SCALING]:
                self.autoscaler.reconfigure(**self._scaling())
            if rebuild:
                self._rebuild()
        announce(self.events, source, changed, "rebuilding replicas" if rebuild else "applied in place")
        return LeverChange(changed, bool(rebuild), dict(self.levers))

    def _cancel_orphans(self) -> None:
        """cancel_on_disconnect back on: the requests left running for clients already gone
        are cancelled now, so the damage stops with the defence (and their KV is freed)."""
        router, bus = self.fleet.router, self.fleet.bus
        for request_id in bus.gone_requests():
            queued = request_id in router.queue  # no replica will report its end
            router.abort(request_id)
            if queued:
                bus.forget_gone(request_id)

    def _set_sim(self, clean: dict[str, Any], source: str) -> LeverChange:
        """The simulated fleet: entered (from the live levers plus the simulator's own), changed in
        place, or replaced when its deployment changes. The simulator checks first."""
        entering = self.sim is None
        base = (self.levers | {k: self.sim_levers[k] for k in SIM_ONLY}) if entering else self.sim_levers
        merged = base | clean | {"executor": Executor.SIM}
        check_sim(merged, clean)  # InvalidParamError with the simulator's reason: nothing changes
        changed = {k: v for k, v in clean.items() if base.get(k) != v}
        old = self.sim
        rebuild = entering or old.needs_rebuild(changed)  # type: ignore[union-attr]
        if rebuild:
            sim = SimLab(merged, lambda snap: self._sim_snapshot(sim, snap))
            if entering:
                self.traffic.stop()  # the live flood ends: one fleet has traffic at a time
                self.hangs.release("the lab switched to the simulated executor")
            if old is None or old.sending:
                sim.start_traffic()  # a simulated fleet is there to be watched under load
            if old is not None:
                old.stop()
            self.sim, self.run = sim, self.run + 1
            sim.start()
        else:
            old.apply(changed)  # type: ignore[union-attr]
        self.sim_levers = merged
        announce(self.events, source, changed, "a new simulated fleet" if rebuild else "applied in place")
        return LeverChange(changed, False, dict(merged))

    def _rebuild(self) -> None:
        self.hangs.release("the replicas are rebuilt (a stopped rank would hold its group's drain)")
        self.status = LabStatus.REBUILDING
        fewest, most = replica_bounds(self.levers, warm_pool_holds_devices=False)
        serving = sum(r.state in SERVING for r in self.fleet.replicas)
        pools = split_pools(self.levers)
        self.fleet.fleet_config.decode_replicas = pools[1] if pools else 0
        self.fleet.rebuild(
            self.fleet.engine_config.replace(**engine_fields(self.levers)), min(max(serving, fewest), most)
        )
        threading.Thread(target=self._await_ready, name="lab-ready", daemon=True).start()

    def _scaling(self) -> dict[str, Any]:
        """The autoscaler's settings: its levers and targets, with the bounds of replica_bounds."""
        fewest, most = replica_bounds(self.levers, warm_pool_holds_devices=False)
        keys = (*AUTOSCALER_LEVERS, *TARGET_LEVERS)
        return {key: self.levers[key] for key in keys} | {"min_replicas": fewest, "max_replicas": most}

    def _await_ready(self) -> None:
        ok = self.fleet.wait_serving()
        self.status = LabStatus.SERVING if ok else LabStatus.FAILED
        if ok:
            self.events.emit("replica", "a replica is ready")
        elif self.fleet.unservable is None:  # an unservable fleet has said why already
            self.events.emit("replica", "no replica ready yet")

    # traffic ------------------------------------------------------------------------------------

    def flood(self, action: str, ramp_to: float | None = None, ramp_s: float = 30.0) -> FloodState:
        """start: send at request_rate; ramp: climb linearly to ramp_to over ramp_s; stop. On the
        simulated fleet, its arrivals, up to the lever's own range."""
        sim = self.sim
        if sim is not None:
            return flood(sim.traffic, action, ramp_to, ramp_s, SIM_FLOOD, self.events, "simulated ")
        return flood(self.traffic, action, ramp_to, ramp_s, LIVE_FLOOD, self.events)

    def hang_rank(self, action: RankHangAction | str) -> RankHangAnswer:
        """The collective_timeout row: "stop" SIGSTOPs rank 1 of a ready tensor-parallel replica,
        "resume" SIGCONTs it (engine/lab/live/rank_hang.py). Simulated, there is no process to stop."""
        with self._lock:
            if self.sim is not None and RankHangAction.parse(action):
                raise ServingError(
                    409, "the simulated executor has no rank processes to stop: switch executor to live", "executor"
                )
            return self.hangs.act(action, traffic_on=self.traffic.running)

    def traffic_state(self) -> FloodState:
        return flood_state(self.sim.traffic if self.sim is not None else self.traffic)

    # what the pages and the live stream show ----------------------------------------------------

    def facts(self) -> Facts:
        """What the first reporting replica measured about itself (weights, KV, bandwidth)."""
        for replica in list(self.fleet.replicas):
            if replica.stats is not None and replica.stats.param_bytes:
                return Facts.of_replica(replica.stats)
        return Facts()

    def live_state(self) -> LabState:
        config = self.fleet.engine_config
        sim = self.sim
        plan = self.fleet.engine_plan
        if sim is None:
            model, device = self.fleet.model_name, plan.device if plan is not None else config.device
            dtype = plan.dtype if plan is not None else config.dtype
            status, panel, state = self.status, envelope(self.levers, self.facts()), None
        else:
            levers = self.sim_levers
            model = model_label(str(levers["model"]))
            device = f"{str(levers['device']).upper()} x {levers['gpu_count']}"
            dtype = f"{levers['weight_dtype']} (KV {levers['kv_dtype']})"
            status, panel, state = LabStatus.SIMULATING, envelope(levers, sim.facts()), sim.state()
        # What runs behind the page, read off the process: simulation pacers alive, live flood on.
        pacers = sum(t.name == "sim-pacer" for t in threading.enumerate())
        return LabState(
            model=model, device=device, dtype=dtype, devices=self.devices, status=status,
            levers=dict(self.current_levers), envelope=panel, traffic=self.traffic_state(), executor=self.executor,
            run=self.run, badge=state.badge if state is not None else None, sim=state,
            running=BackgroundWork(pacers, self.traffic.running),
            # what the engine runs on this machine and why; why it cannot, when it cannot
            engine=plan, problem=self.fleet.unservable,
        )

    def snapshot(self, reading: FleetSnapshot) -> dict[str, Any]:
        """A fleet's snapshot plus the lab's view of it (status, levers, traffic: `lab`), as the
        live stream sends it (the snapshot becomes JSON here). The server's latencies sit beside
        the lab's clients' (`client_*`): the same figures measured at the receiving end of the
        stream. Simulated: times are simulated seconds, and the snapshot says so (`executor`,
        `badge`, `sim_time_s`)."""
        sim = self.sim
        levers = self.current_levers
        if sim is None:
            facts = self.facts()
            extra = self.traffic.clients.view().fields() | {"autoscaler": self.autoscaler.status()}
            extra |= self.traffic.fields()
            readings = bottlenecks(levers, facts, reading)
            memory = int(self.fleet.engine_config.memory_cap_mb * MB)
            total = facts.param_bytes * int(levers["tensor_parallel"])
            fits = 1 if total <= memory * int(levers["tensor_parallel"]) else None
            device = "GPU" if device_kind(self.fleet.engine_config.device) == "cuda" else "CPU core"
        else:
            facts = sim.facts()
            extra = {"autoscaler": None if sim.autoscaler is None else sim.autoscaler.status(), "sim_time_s": reading.time}
            extra |= simulated_client_fields(flood_state(sim.traffic))
            readings = bottlenecks(levers, facts, reading)
            memory, total, fits = int(facts.device_memory_gb * 1e9), facts.weight_bytes_total, sim.min_tp
            device = str(levers["device"]).upper()
        shape = shape_for(levers, facts, reading, readings, device, memory, total, fits, simulated=sim is not None)
        lab = self.live_state()
        return reading.to_json() | extra | {
            "bottlenecks": [r.to_json() for r in readings],
            "ttft_target_ms": levers["ttft_target_ms"],
            "executor": lab.executor,
            "badge": lab.badge,
            "run": lab.run,
            "shape": shape.view(),
            "lab": lab.to_json(),
        }

    def connect(self, server_url: str) -> None:
        """The lab's clients send over HTTP, through the lab's proxy, to this server (the
        composition root passes its URL once bound); their counters go to /metrics too."""
        self.traffic.connect(server_url, self.fleet.model_name)
        if self.traffic.counts.prometheus_lines not in self.fleet.bus.text_sources:
            self.fleet.bus.text_sources.append(self.traffic.counts.prometheus_lines)

    def cancel_user(self, user: str) -> int:
        """The live fleet's requests of this user not yet ended (its request traces), aborted."""
        request_ids = self.fleet.traces.in_flight(user)
        for request_id in request_ids:
            self.fleet.router.abort(request_id)
        return len(request_ids)

    def stop(self) -> None:
        self.hangs.release("the lab stopped")
        self.traffic.stop()
        self.traffic.close()
        self.autoscaler.stop()
        if self.sim is not None:
            self.sim.stop()
