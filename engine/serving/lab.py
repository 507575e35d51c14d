"""The live lab: the levers' current values over one running fleet, and what moving one does.

A change reaches the engine the cheapest way it can (engine/levers.py says which): the traffic
generator reads load levers on its next arrival; the router takes queue levers in place; the
replicas take batch levers in place from their next step; the autoscaler takes its bounds and
pool; and the rest rebuild the replicas in the background (old ones drain, so nothing running
is cut), with the status visible.

How many replicas serve: the autoscaler keeps it within [min_replicas, max_replicas], and
gpu_count is the device budget, so at most gpu_count // tensor_parallel replicas ever run."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from engine.config import IN_PLACE_FIELDS, EngineConfig
from engine.errors import InvalidParamError, ServingError
from engine.levers import LEVERS, validate_levers
from engine.serving.autoscaler import LEVERS as AUTOSCALER_LEVERS
from engine.serving.autoscaler import Autoscaler, AutoscalerConfig
from engine.serving.envelope import bottlenecks, envelope
from engine.serving.events import EventLog
from engine.serving.fleet import Fleet
from engine.serving.replica_api import SERVING
from engine.serving.traffic import TrafficDriver

log = logging.getLogger("servelab.lab")

LIVE_MODEL = "SmolLM2-135M"
ROUTER_LEVERS = ("queue_cap", "deadline_s", "rate_limit")
ENGINE_IN_PLACE = tuple(key for key in LEVERS if key in IN_PLACE_FIELDS)
REBUILD_LEVERS = tuple(key for key, lever in LEVERS.items() if lever.apply == "rebuild")
# Levers that are EngineConfig fields too; `model` is not: the lever names a model, the field a path.
ENGINE_LEVERS = tuple(key for key in LEVERS if key in EngineConfig.field_names() and key != "model")
FLOOD_MAX_RATE = 200.0


def engine_fields(levers: dict[str, Any]) -> dict[str, Any]:
    """The EngineConfig fields these lever values set."""
    return {key: levers[key] for key in ENGINE_LEVERS}


def replica_bounds(levers: dict[str, Any]) -> tuple[int, int]:
    """(fewest, most) serving replicas: the autoscaler's bounds, the most held to the device
    budget (gpu_count // tensor_parallel), and never below one."""
    most = max(1, min(int(levers["max_replicas"]), int(levers["gpu_count"]) // int(levers["tensor_parallel"])))
    return max(1, min(int(levers["min_replicas"]), most)), most


def live_devices(device: str) -> int:
    """What `gpu_count` may reach live: CUDA devices on a GPU machine, else this process's cores."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.device_count()
    return len(os.sched_getaffinity(0))


class LiveLab:
    def __init__(self, fleet: Fleet, levers: dict[str, Any] | None = None) -> None:
        self.fleet = fleet
        self.levers = {key: lever.default for key, lever in LEVERS.items()} | (levers or {})
        self.devices = live_devices(fleet.engine_config.device)
        check_live(self.levers, self.levers, self.devices, fleet.engine_config.device)
        self.status = "starting"
        self._lock = threading.Lock()
        api_key = (fleet.router.config.api_keys or [None])[0]  # flood traffic passes the key check
        self.traffic = TrafficDriver(fleet.router, lambda: self.levers, api_key=api_key or "flood")
        self.autoscaler = Autoscaler(fleet, AutoscalerConfig.from_levers(self._scaling()))
        self.autoscaler.start()
        threading.Thread(target=self._await_ready, name="lab-ready", daemon=True).start()

    @property
    def events(self) -> EventLog:
        return self.fleet.events

    # levers -------------------------------------------------------------------------------------

    def set_levers(self, changes: dict[str, Any], source: str = "lab") -> dict[str, Any]:
        """Validate, then apply; returns what changed and how. A bad value raises
        InvalidParamError naming the lever, and nothing is applied."""
        clean = validate_levers(changes)
        with self._lock:
            merged = self.levers | clean
            check_live(clean, merged, self.devices, self.fleet.engine_config.device)
            changed = {k: v for k, v in clean.items() if self.levers[k] != v}
            rebuild = [k for k in changed if k in REBUILD_LEVERS]
            if rebuild and self.status == "rebuilding":
                raise ServingError(
                    409, "the replicas are still being rebuilt; try again when they are ready", rebuild[0], "busy"
                )
            self.levers = merged
            router = {k: changed[k] for k in ROUTER_LEVERS if k in changed}
            if router:
                self.fleet.router.reconfigure(**router)
            in_place = {k: changed[k] for k in ENGINE_IN_PLACE if k in changed}
            if in_place:
                self.fleet.reconfigure(**in_place)
            if any(k in changed for k in (*AUTOSCALER_LEVERS, "gpu_count", "tensor_parallel")):
                self.autoscaler.reconfigure(**self._scaling())
            if rebuild:
                self._rebuild()
        if changed:
            text = ", ".join(f"{k}={v}" for k, v in changed.items())
            how = "rebuilding replicas" if rebuild else "applied in place"
            self.events.emit("config", f"{source}: {text} ({how})", levers=changed)
        return {"changed": changed, "rebuild": bool(rebuild), "levers": dict(self.levers)}

    def _rebuild(self) -> None:
        self.status = "rebuilding"
        fewest, most = replica_bounds(self.levers)
        serving = sum(r.state in SERVING for r in self.fleet.replicas)
        self.fleet.rebuild(
            self.fleet.engine_config.replace(**engine_fields(self.levers)), min(max(serving, fewest), most)
        )
        threading.Thread(target=self._await_ready, name="lab-ready", daemon=True).start()

    def _scaling(self) -> dict[str, Any]:
        """The autoscaler's settings: its levers, with the bounds of replica_bounds."""
        fewest, most = replica_bounds(self.levers)
        return {key: self.levers[key] for key in AUTOSCALER_LEVERS} | {"min_replicas": fewest, "max_replicas": most}

    def _await_ready(self) -> None:
        ok = self.fleet.wait_ready()
        self.status = "serving" if ok else "failed"
        self.events.emit("replica", "all replicas ready" if ok else "a replica failed to start")

    # traffic ------------------------------------------------------------------------------------

    def flood(self, action: str, ramp_to: float | None = None, ramp_s: float = 30.0) -> dict[str, Any]:
        """start: send at request_rate; ramp: climb linearly to ramp_to over ramp_s; stop."""
        if action == "stop":
            self.traffic.stop()
            self.events.emit("flood", "traffic stopped")
        elif action in ("start", "ramp"):
            if action == "ramp":
                if (
                    not isinstance(ramp_to, (int, float))
                    or isinstance(ramp_to, bool)
                    or not 0 < ramp_to <= FLOOD_MAX_RATE
                ):
                    raise InvalidParamError("to", f"the ramp's target rate must be in (0, {FLOOD_MAX_RATE:g}] req/s")
                if not isinstance(ramp_s, (int, float)) or not 0 <= ramp_s <= 600:
                    raise InvalidParamError("over_s", "the ramp's duration must be in [0, 600] s")
            self.traffic.start(ramp_to if action == "ramp" else None, float(ramp_s))
            what = (
                f"ramping to {ramp_to:g} req/s over {ramp_s:g} s"
                if action == "ramp"
                else (f"sending {self.levers['request_rate']:g} req/s")
            )
            self.events.emit("flood", f"traffic on: {what}")
        else:
            raise InvalidParamError("action", "must be start, ramp or stop")
        return self.traffic_state()

    def traffic_state(self) -> dict[str, Any]:
        return {
            "running": self.traffic.running,
            "rate": round(self.traffic.current_rate(), 2),
            "sent": self.traffic.sent,
            "refused": self.traffic.refused,
        }

    # what the pages and the live stream show ----------------------------------------------------

    def facts(self) -> dict[str, Any]:
        """What the first reporting replica measured about itself (weights, KV, bandwidth)."""
        for replica in list(self.fleet.replicas):
            if replica.stats is not None and replica.stats.facts.get("param_bytes"):
                return replica.stats.facts
        return {}

    def live_state(self) -> dict[str, Any]:
        config = self.fleet.engine_config
        return {
            "model": self.fleet.model_name,
            "device": config.device,
            "dtype": config.dtype,
            "devices": self.devices,
            "status": self.status,
            "levers": dict(self.levers),
            "envelope": envelope(self.levers, self.facts()),
            "traffic": self.traffic_state(),
        }

    def snapshot(self, snap: dict[str, Any]) -> dict[str, Any]:
        """A metrics snapshot plus the lab's view of it (status, levers, traffic: `lab`), for the
        live stream. The server's latencies sit beside the lab's clients' (`client_*`): the same
        figures measured at the receiving end of the stream."""
        return snap | self.traffic.clients.view().fields() | {
            "bottlenecks": bottlenecks(self.levers, self.facts(), snap),
            "ttft_target_ms": self.levers["ttft_target_ms"],
            "autoscaler": self.autoscaler.status(),
            "lab": self.live_state(),
        }

    def stop(self) -> None:
        self.traffic.stop()
        self.autoscaler.stop()


def check_live(clean: dict[str, Any], merged: dict[str, Any], devices: int, device: str = "cpu") -> None:
    """What this machine can run live, beyond each lever's own range: InvalidParamError otherwise."""
    if "model" in clean and clean["model"] != LIVE_MODEL:
        raise InvalidParamError(
            "model",
            f"{clean['model']} cannot run live here: only {LIVE_MODEL} fits this machine, so the live "
            f"engine stays on {LIVE_MODEL}",
        )
    tp, count = int(merged["tensor_parallel"]), int(merged["gpu_count"])
    what = "CUDA GPUs" if device.startswith("cuda") else "CPU cores"
    if count > devices:
        raise InvalidParamError(
            "gpu_count",
            f"this machine has {devices} {what}, so the live engine runs at most {devices} devices; "
            f"{count} is beyond what is present",
        )
    if tp > devices:
        raise InvalidParamError(
            "tensor_parallel", f"a shard group of {tp} needs {tp} devices; this machine has {devices} {what}"
        )
    if count % tp:
        raise InvalidParamError("gpu_count", f"must be a multiple of tensor_parallel ({tp})")
    if int(merged["min_replicas"]) * tp > count:
        raise InvalidParamError(
            "min_replicas",
            f"{merged['min_replicas']} replica(s) of {tp} device(s) need more than gpu_count ({count}) devices",
        )
