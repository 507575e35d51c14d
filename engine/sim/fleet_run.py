"""An autoscaled what-if run: the serving stack's own Fleet (its Router, MetricsBus and replica
bookkeeping) and Autoscaler over SimReplicas, every step of theirs on one EventLoop.

The fleet starts at min_replicas, loaded (the run begins with a serving fleet) beside a loaded
warm pool. A cold start then costs what it costs a real one: provision_delay_s for the machine,
then the weights' load (weight bytes per GPU / storage bandwidth) in STARTING before READY; a
replica promoted from the warm pool skips both. The fleet's snapshots (the lab's own) are read
every timeline_s into a timeline of replicas, queue depth and tokens/s."""

from __future__ import annotations

from typing import Any

from engine.clock import stopwatch
from engine.serving.replicas.replica_api import ReplicaState
from engine.serving.routing.defences import Defences
from engine.serving.routing.router import AdmissionError, RouterConfig
from engine.serving.scaling.autoscaler import Autoscaler, AutoscalerConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig
from engine.serving.telemetry.snapshot import FleetSnapshot
from engine.sim.assembly import sim_fleet
from engine.sim.clients import ClosedLoop
from engine.sim.loop import EventLoop
from engine.sim.replica import SimReplica
from engine.sim.results import Recorder, replica_figures, summarize, take_errors
from engine.sim.spec import SimSpec
from engine.sim.workload import SimRequest, sim_params

DONE_CHECK_S = 0.1  # how often the run looks for its end (simulated seconds)


def simulate_fleet(
    spec: SimSpec, autoscaler_settings: dict[str, Any] | None = None, requests: list[SimRequest] | None = None
) -> dict[str, Any]:
    """Run the workload to its end on an autoscaled fleet; autoscaler_settings override
    AutoscalerConfig fields (windows, thresholds, tick_s). Raises SimConfigError."""
    elapsed = stopwatch()
    dep = spec.deployment()
    fewest, most = spec.replica_bounds()
    config = spec.engine_config()
    loop = EventLoop()
    clock = loop.clock
    if requests is None:
        requests = spec.workload()
    rec = Recorder({r.request_id: r.arrival for r in requests})
    hop = dep.device.front_latency_s if spec.front_on_device else 0.0  # client -> router (see SimSpec)
    if spec.ttft_slo_ms is not None or spec.tpot_slo_ms is not None:
        rec.slo_s = ((spec.ttft_slo_ms or float("inf")) / 1000, (spec.tpot_slo_ms or float("inf")) / 1000)
    streams: dict[str, Any] = {}
    made: list[SimReplica] = []  # every replica the fleet ever started, retired ones too
    load_s = dep.fullest_stage_bytes / dep.tp / spec.storage_bw  # each GPU reads its own shard

    # Closed loop (--concurrency): a client sends its next request when its last one ends.
    clients = None
    if spec.concurrency is not None:
        clients = ClosedLoop(spec.concurrency, loop, hop, rec.arrivals, lambda r: arrive(r))
    ended = clients.ended if clients is not None else lambda request_id: None
    answers = clients.answers if clients is not None else lambda request_id: None

    conversations = spec.conversations(dep)  # conversation_turns: arrivals continue answered ones

    def finished(seq: Any) -> None:
        rec.finish(seq)
        if conversations is not None:
            conversations.answered(seq)
        streams.pop(seq.request_id, None)
        ended(seq.request_id)

    router_config = RouterConfig(queue_cap=spec.queue_cap or max(1, spec.num_requests), deadline_s=spec.deadline_s)
    fleet_config = FleetConfig(fewest, warm_pool=spec.warm_pool, provision_delay_s=spec.provision_delay_s)
    fleet = sim_fleet(
        dep, config, router_config, fleet_config, loop, finished, load_s=load_s, record_steps=False, made=made,
        pp_overlap=spec.pp_overlap, defences=Defences(prefix_aware_routing=spec.prefix_aware_routing),
    )
    auto = Autoscaler(
        fleet, AutoscalerConfig(min_replicas=fewest, max_replicas=most, **(autoscaler_settings or {})), clock
    )
    auto.start(loop)

    timeline: list[dict[str, Any]] = []
    tokens_seen = [0.0, 0]  # (time, tokens) at the last timeline row

    scale: list[dict[str, Any]] = []
    cursor = [0]

    def record(snap: FleetSnapshot) -> None:
        # The event log keeps the latest 2000 events: the scale ones are read off as they come.
        events, cursor[0] = fleet.events.since(cursor[0], limit=10_000)
        scale.extend(
            {"t": round(e["time"], 3), "delta": e["delta"], "message": e["message"]}
            for e in events if e["kind"] == "scale" and e["delta"]
        )
        now = snap.time
        if timeline and now - timeline[-1]["t"] < spec.timeline_s - 1e-9:
            return
        tokens = sum(r.tokens_out for r in made)
        span = now - tokens_seen[0]
        timeline.append({
            "t": round(now, 3), "replicas": dict(snap.replicas), "queue_depth": snap.queue_depth,
            "running": snap.running, "kv_used_blocks": snap.kv_used_blocks, "kv_total_blocks": snap.kv_total_blocks,
            "output_tok_s": (tokens - tokens_seen[1]) / span if span > 0 else 0.0,
            "ttft_p50_s": snap.ttft_p50, "ttft_p99_s": snap.ttft_p99,
        })
        tokens_seen[:] = [now, tokens]

    fleet.subscribe(record)
    refused: dict[str, str] = {}
    vocab = dep.model.cfg.vocab_size
    arrived = [0]

    def arrive(r: Any) -> None:
        arrived[0] += 1
        params = sim_params(r.max_tokens)
        ids = r.token_ids(vocab) if conversations is None else conversations.prompt(r)
        try:
            streams[r.request_id] = fleet.submit(r.request_id, ids, params, None, answers(r.request_id))
        except AdmissionError as err:
            refused[r.request_id] = err.reason
            if conversations is not None:
                conversations.failed(r.request_id)
            ended(r.request_id)
        fleet.router.dispatch_once()  # submit wakes the live dispatcher at once

    work_done_at: list[float] = []

    def check_done() -> bool:
        busy = any(r.busy for r in made) or len(fleet.router.queue) > 0 or not _answered(streams)
        if arrived[0] < len(requests) or busy:
            work_done_at.clear()  # a request still to come or still running
            return True
        work_done_at[:] = work_done_at or [clock.now()]
        if spec.settle and (len(fleet.replicas) > fewest or fleet.retiring):
            return True  # idle: the autoscaler drains back to min_replicas, one long window a time
        auto.stop()
        fleet.stop()  # its steps end, and with nothing left the loop runs out
        return False

    if clients is not None:
        clients.start(requests)
    else:
        for r in requests:
            loop.at(r.arrival + hop, lambda r=r: arrive(r))
    if spec.kill_replica_at_s is not None:
        loop.at(spec.kill_replica_at_s, lambda: _kill_one(fleet))
    loop.every(DONE_CHECK_S, check_done)
    loop.run()

    take_errors(streams, rec.finished, refused)
    served_s = work_done_at[0] if work_done_at else clock.now()  # the figures span the work, not the settling
    result = summarize(rec, served_s, spec.gpus)
    served = [r for r in made if r.on_message is not None]  # routed to at some point (pool ones are not)
    result |= replica_figures(made, refused, loop, clock.now(), elapsed())
    result |= {
        "replicas": max((row["replicas"].get(ReplicaState.READY, 0) for row in timeline), default=fewest),
        "prefill_replicas": 0,
        "simulated_s": served_s,
        "settled_s": clock.now(),
        "load_s": load_s,
        "replicas_started": [
            {"id": r.replica_id, "created_s": round(r.created_at, 3), "ready_s": None if r.ready_at is None else round(r.ready_at, 3)} for r in served
        ],
        "scale_events": scale,
        "timeline": timeline,
    }
    if clients is not None:
        result |= clients.figures()
    return result


def _answered(streams: dict[str, Any]) -> bool:
    """Every open stream has its answer waiting (a RequestError: deadline, failed replica)."""
    return all(not events.empty() for events in streams.values())


def _kill_one(fleet: Fleet) -> None:
    """The chosen time's failure: the first serving replica dies with what it holds."""
    for replica in fleet.replicas:
        if replica.state == ReplicaState.READY:
            replica.fail(f"replica {replica.replica_id} killed")
            return
