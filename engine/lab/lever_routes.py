"""Where a lever's change goes, for each executor: the one dispatch table the live, simulated and
remote labs read (engine/lab/live/lab.py, engine/lab/simulated/lab_sim.py, engine/lab/remote/).

The executors differ, and this is the one place that says how. The simulated fleet rebuilds for
its deployment (model, device, dtypes, gpu_count) where the live engine keeps those for the
simulator and scales within gpu_count; the live engine's precision levers (quantization,
kv_cache_dtype, kv_budget_mb) and its rank guards mean nothing to the simulated fleet; a remote
server owns everything but the lab's own traffic, clients and proxy."""

from __future__ import annotations

import enum
from typing import Any

from engine.config import IN_PLACE_FIELDS
from engine.lab.facade import Executor
from engine.lab.remote.remote_levers import REMOTE_LEVERS
from engine.levers import LEVERS, ROUTER_LEVERS, Apply
from engine.serving.routing.defences import Defences
from engine.serving.scaling.autoscaler import LEVERS as AUTOSCALER_LEVERS
from engine.serving.scaling.autoscaler import TARGET_LEVERS


class Route(enum.StrEnum):
    MODE = "mode"  # which executor runs: the `executor` lever
    LOAD = "load"  # the lab's own traffic, clients and proxy read it as they send
    ROUTER = "router"  # the router's queue cap, deadline and rate limit, in place
    DEFENCE = "defence"  # the serving layer's guards, in place
    ENGINE = "engine"  # every replica's scheduler, in place (LLMEngine.reconfigure)
    SCALING = "scaling"  # the autoscaler's bounds and targets
    REBUILD = "rebuild"  # new replicas (live), a new simulated fleet (sim)
    KEPT = "kept"  # kept in the levers for another executor or a reader; nothing to apply here
    REMOTE = "remote"  # the remote server's own setting: refused, naming where it is set


# The simulated fleet's scheduler takes these in place (engine/sim's replicas reconfigure).
SIM_ENGINE = (
    "max_num_seqs", "max_batched_tokens", "chunked_prefill", "prefix_caching", "num_speculative_tokens", "aging",
)  # fmt: skip
# A new simulated fleet: its deployment or its pools change.
SIM_REBUILD = (
    "model", "device", "gpu_count", "tensor_parallel", "pipeline_parallel", "pipeline_overlap", "weight_dtype",
    "kv_dtype", "prefill_gpus", "decode_gpus", "paged", "block_size", "spec_acceptance",
)  # fmt: skip
SCALING_LEVERS = (*AUTOSCALER_LEVERS, *TARGET_LEVERS)
DEFENCES = Defences.names()


def _live(key: str) -> frozenset[Route]:
    apply = LEVERS[key].apply
    if apply == Apply.MODE:
        return frozenset({Route.MODE})
    if apply == Apply.SIM:
        return frozenset({Route.KEPT})  # the simulator's: the live engine has no use for them
    routes = set()
    if apply == Apply.LOAD:
        routes.add(Route.LOAD)
    if apply == Apply.REBUILD:
        routes.add(Route.REBUILD)
    if key in ROUTER_LEVERS:
        routes.add(Route.ROUTER)
    if key in DEFENCES:
        routes.add(Route.DEFENCE)
    if key in IN_PLACE_FIELDS and apply == Apply.IN_PLACE:
        routes.add(Route.ENGINE)
    # the device budget and the replicas' shape bound the autoscaler too
    if key in (*SCALING_LEVERS, "gpu_count", "tensor_parallel", "pipeline_parallel"):
        routes.add(Route.SCALING)
    return frozenset(routes)


def _sim(key: str) -> frozenset[Route]:
    if LEVERS[key].apply == Apply.MODE:
        return frozenset({Route.MODE})
    if key in SIM_REBUILD:
        return frozenset({Route.REBUILD})
    routes = set()
    if LEVERS[key].apply == Apply.LOAD:
        routes.add(Route.LOAD)
    if key in ROUTER_LEVERS:
        routes.add(Route.ROUTER)
    if key in DEFENCES:
        routes.add(Route.DEFENCE)
    if key in SIM_ENGINE:
        routes.add(Route.ENGINE)
    if key in SCALING_LEVERS:
        routes.add(Route.SCALING)
    return frozenset(routes or {Route.KEPT})


def _remote(key: str) -> frozenset[Route]:
    if LEVERS[key].apply == Apply.MODE:
        return frozenset({Route.MODE})
    if key in REMOTE_LEVERS:
        return frozenset({Route.SCALING if key in SCALING_LEVERS else Route.LOAD})
    return frozenset({Route.REMOTE})


ROUTES: dict[Executor, dict[str, frozenset[Route]]] = {
    executor: {key: table(key) or frozenset({Route.KEPT}) for key in LEVERS}
    for executor, table in ((Executor.LIVE, _live), (Executor.SIM, _sim), (Executor.REMOTE, _remote))
}


def routes_of(key: str, executor: Executor) -> frozenset[Route]:
    return ROUTES[executor][key]


def by_route(changed: dict[str, Any], executor: Executor) -> dict[Route, dict[str, Any]]:
    """The changed levers sorted by where each goes (a lever may go to several places)."""
    out: dict[Route, dict[str, Any]] = {route: {} for route in Route}
    for key, value in changed.items():
        for route in ROUTES[executor][key]:
            out[route][key] = value
    return out


def keys_routed(executor: Executor, route: Route) -> tuple[str, ...]:
    return tuple(key for key, routes in ROUTES[executor].items() if route in routes)
