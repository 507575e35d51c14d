"""How a simulated fleet is put together, once: each SimReplica is the engine's own LLMEngine
priced by the cost model on the run's event loop, and a fleet of them is the serving stack's own
Fleet (its Router, MetricsBus, provisioning) with the loop as its driver. A plain run
(engine/sim/run.py) drives bare replicas behind a Router; an autoscaled run
(engine/sim/fleet_run.py) and the lab's simulated mode (engine/lab/simulated/lab_sim.py) take a
fleet."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.steady_decodes import SteadyDecodes
from engine.serving.routing.defences import Defences
from engine.serving.routing.router import RouterConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig
from engine.serving.telemetry.events import EventLog
from engine.sim import constants as C
from engine.sim.deployment import Deployment
from engine.sim.host_profiles import PROFILES
from engine.sim.loop import EventLoop
from engine.sim.pipelined_replica import PipelinedSimReplica
from engine.sim.replica import Finished, SimReplica
from engine.sim.runner import SIM_TOKEN, sim_executor


def kv_transfer_s(dep: Deployment, gpus: int) -> Callable[[int], float]:
    """A prefill/decode split's KV hand-off: seconds for a prompt of n tokens to reach its decode
    replica, each GPU of the prefill group sending its shard to its peer over the link that joins
    them (NVLink inside a node; the inter-node fabric once the run spans nodes)."""
    link = C.INTER_NODE_BW if gpus > dep.device.gpus_per_node else dep.device.link_bw
    per_token = dep.stage_kv_bytes_per_token
    return lambda tokens: tokens * per_token / link


# Steady decodes as counts (engine/core/steady_decodes.py): a switch for tests that compare both ways.
STEADY_DECODES = True


def sim_replica(
    replica_id: int, config: EngineConfig, dep: Deployment, loop: EventLoop, on_finished: Finished,
    kv_transfer_s: Callable[[int], float] | None = None, load_s: float = 0.0, on_message: Any = None,
    record_steps: bool = True, pp_overlap: bool = True,
) -> SimReplica:
    """One simulated replica of `dep` on the loop's clock (SimReplica's arguments, engine built);
    with pipeline stages, one that runs its batches through them (pp_overlap: as many in flight
    as stages, or one at a time)."""
    engine = LLMEngine(config, loop.clock, sim_executor(dep, config))
    if dep.pp == 1:
        replica = SimReplica(replica_id, engine, loop, on_finished, kv_transfer_s, load_s, on_message, record_steps)
        replica.defer_outputs = PROFILES[dep.host].defers_outputs
        if STEADY_DECODES and not record_steps and not replica.defer_outputs and config.paged:
            # Nobody draws its steps and its tokens land as they are made: its decodes run as counts.
            engine.scheduler.use_steady(SteadyDecodes(SIM_TOKEN, config.block_size))
        return replica
    return PipelinedSimReplica(
        replica_id, engine, loop, on_finished, kv_transfer_s, load_s, on_message, record_steps,
        stages=dep.pp, overlap=pp_overlap,
    )


def sim_fleet(
    dep: Deployment, config: EngineConfig, router_config: RouterConfig, fleet_config: FleetConfig, loop: EventLoop,
    on_finished: Finished, *, load_s: float, first_id: int = 0, kv_transfer_s: Callable[[int], float] | None = None,
    events: EventLog | None = None, defences: Defences | None = None, record_steps: bool = True,
    made: list[SimReplica] | None = None, pp_overlap: bool = True,
) -> Fleet:
    """A Fleet of simulated replicas on the loop. The first replicas and the warm pool are loaded
    before the run begins; a replica ordered later loads its weights for load_s. Replica ids start
    at first_id (a prefill/decode split numbers its second pool after the first); `made` collects
    every replica the fleet ever starts, retired ones too."""
    booting = True

    def new_replica(replica_id: int, cfg: EngineConfig, cores: Any = None, on_message: Any = None) -> SimReplica:
        replica = sim_replica(
            first_id + replica_id, cfg, dep, loop, on_finished, kv_transfer_s, 0.0 if booting else load_s, on_message,
            record_steps, pp_overlap,
        )
        if made is not None:
            made.append(replica)
        return replica

    fleet = Fleet(
        config, router_config, fleet_config, new_replica, loop.clock, driver=loop,
        model=(dep.model.name, dep.model.cfg.max_position), events=events, defences=defences,
    )
    booting = False
    return fleet
