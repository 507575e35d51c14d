"""One what-if run: the serving stack's own Router (and its RequestQueue) in front of simulated
replicas, clients arriving from the load generator's processes, all on one event loop.

    result = simulate(SimSpec(model="llama-3.1-70b", device="h100", gpus=8, tp=8, ...))
"""

from __future__ import annotations

import queue
from typing import Any

from engine.clock import stopwatch
from engine.core.sequence import FinishReason
from engine.serving.routing.defences import Defences
from engine.serving.routing.router import AdmissionError, Router, RouterConfig
from engine.serving.telemetry.events import EventLog
from engine.sim.assembly import kv_transfer_s, sim_replica
from engine.sim.clients import ClosedLoop
from engine.sim.fleet_run import simulate_fleet
from engine.sim.loop import EventLoop
from engine.sim.replica import SimReplica
from engine.sim.results import Recorder, replica_figures, summarize, take_errors
from engine.sim.spec import SimSpec
from engine.sim.workload import SimRequest, sim_params


def simulate(spec: SimSpec, requests: list[SimRequest] | None = None) -> dict[str, Any]:
    """Run the workload to its end; raises SimConfigError for a configuration that cannot run.
    requests: an explicit workload (arrivals and lengths, e.g. a live run's) instead of the spec's."""
    if spec.autoscale:
        return simulate_fleet(spec, requests=requests)
    elapsed = stopwatch()
    dep = spec.deployment()
    config = spec.engine_config()
    loop = EventLoop()
    clock = loop.clock
    requests = requests if requests is not None else spec.workload()
    rec = Recorder({r.request_id: r.arrival for r in requests})
    if spec.ttft_slo_ms is not None or spec.tpot_slo_ms is not None:
        rec.slo_s = ((spec.ttft_slo_ms or float("inf")) / 1000, (spec.tpot_slo_ms or float("inf")) / 1000)

    streams: dict[str, Any] = {}
    first_tokens: dict[str, float] = {}  # disaggregated: the prefill replica's token time

    def new_replica(i: int, on_finished: Any, transfer: Any = None) -> SimReplica:
        # A decode replica finds the KV it is handed through its prefix cache (import_prefix).
        cfg = config if transfer is None else config.replace(prefix_caching=True)
        # Headless: nothing draws steps.
        return sim_replica(i, cfg, dep, loop, on_finished, transfer, record_steps=False, pp_overlap=spec.pp_overlap)

    def new_router(pool: list[SimReplica], cap: int | None) -> Router:
        router_config = RouterConfig(
            queue_cap=cap or max(1, spec.num_requests), deadline_s=spec.deadline_s,
            block_size=config.block_size, max_model_len=dep.model.cfg.max_position,
        )
        defences = Defences(central_queue=spec.central_queue, prefix_aware_routing=spec.prefix_aware_routing)
        return Router(pool, router_config, clock, EventLog(clock), dispatch_thread=False, defences=defences)

    hop = dep.device.front_latency_s if spec.front_on_device else 0.0  # client -> router (see SimSpec)
    # Closed loop (--concurrency): a client sends its next request when its last one ends.
    clients = None
    if spec.concurrency is not None:
        clients = ClosedLoop(spec.concurrency, loop, hop, rec.arrivals, lambda r: arrive(r))
    ended = clients.ended if clients is not None else lambda request_id: None
    # Open loop, nobody reads a request's stream but take_errors: a C queue, where queue.Queue
    # would build a lock and three Conditions for each of a big run's requests.
    answers = clients.answers if clients is not None else lambda request_id: queue.SimpleQueue()

    # conversation_turns: an arrival continues an answered conversation (its prompt the history).
    conversations = spec.conversations(dep)
    answered = conversations.answered if conversations is not None else lambda seq: None

    def finished(seq: Any) -> None:
        rec.finish(seq)
        answered(seq)
        streams.pop(seq.request_id, None)  # its final TokenDelta is read off the Sequence here
        ended(seq.request_id)

    if spec.prefill_gpus is None:
        replicas = [new_replica(i, finished) for i in range(spec.replicas())]
        router = new_router(replicas, spec.queue_cap)
        decode_router = None
    else:
        assert spec.decode_gpus is not None
        transfer_s = kv_transfer_s(dep, spec.gpus)

        def decoded(seq: Any) -> None:
            rec.finish(seq, (first_tokens.pop(seq.request_id),))
            answered(seq)
            streams.pop(seq.request_id, None)
            ended(seq.request_id)

        def prefilled(seq: Any) -> None:
            streams.pop(seq.request_id, None)
            left = decode_left.pop(seq.request_id)
            if left == 0 or seq.finish_reason == FinishReason.ABORT:
                rec.finish(seq)
                answered(seq)
                ended(seq.request_id)
                return
            first_tokens[seq.request_id] = seq.times.first_token
            params = sim_params(left)
            events = answers(seq.request_id)
            streams[seq.request_id] = decode_router.submit(  # type: ignore[union-attr]
                seq.request_id, seq.token_ids, params, events=events
            )
            decode_router.dispatch_once()  # type: ignore[union-attr]

        n_prefill = spec.replicas(spec.prefill_gpus)
        prefill = [new_replica(i, prefilled) for i in range(n_prefill)]
        decode = [new_replica(n_prefill + i, decoded, transfer_s) for i in range(spec.replicas(spec.decode_gpus))]
        replicas = prefill + decode
        router = new_router(prefill, spec.queue_cap)
        decode_router = new_router(decode, None)
    decode_left: dict[str, int] = {}
    refused: dict[str, str] = {}
    vocab = dep.model.cfg.vocab_size

    def arrive(r: Any) -> None:
        arrived[0] += 1
        max_tokens = r.max_tokens
        if decode_router is not None:  # the prefill pool computes the prompt and the first token
            decode_left[r.request_id], max_tokens = r.max_tokens - 1, 1
        params = sim_params(max_tokens)
        ids = r.token_ids(vocab) if conversations is None else conversations.prompt(r)
        try:
            streams[r.request_id] = router.submit(r.request_id, ids, params, events=answers(r.request_id))
        except AdmissionError as err:
            refused[r.request_id] = err.reason
            if conversations is not None:
                conversations.failed(r.request_id)
            ended(r.request_id)
        router.dispatch_once()  # submit wakes the live dispatcher at once

    arrived = [0]

    routers = [router] if decode_router is None else [router, decode_router]

    def open_requests() -> bool:
        busy = any(r.busy for r in replicas) or any(len(rt.queue) for rt in routers)
        return arrived[0] < len(requests) or busy

    sampler = None
    if spec.timeline:
        from engine.sim.timeline import TimelineSampler

        sampler = TimelineSampler(spec.timeline_s, replicas, routers, clock)

    def poll() -> bool:
        for rt in routers:
            rt.dispatch_once()
        if sampler is not None:
            sampler.due()  # on the router's own poll, so the timeline adds no event past the run's end
        return open_requests()

    if clients is not None:
        clients.start(requests)
    else:
        for r in requests:
            loop.at(r.arrival + hop, lambda r=r: arrive(r))
    loop.every(Router.DISPATCH_POLL_S, poll)
    if spec.kill_replica_at_s is not None:
        loop.at(spec.kill_replica_at_s, lambda: replicas[0].fail("replica 0 killed"))
    loop.run()

    take_errors(streams, rec.finished, refused)
    result = summarize(rec, clock.now(), spec.gpus)
    front = replicas if decode_router is None else replicas[: spec.replicas(spec.prefill_gpus)]
    result |= replica_figures(replicas, refused, loop, clock.now(), elapsed(), front)
    result |= {
        "replicas": len(replicas),
        "prefill_replicas": 0 if decode_router is None else spec.replicas(spec.prefill_gpus),
        "simulated_s": clock.now(),
    }
    if clients is not None:
        result |= clients.figures()
    if sampler is not None:
        from engine.sim.timeline import fill_ttft

        if not sampler.rows or sampler.rows[-1]["t"] < clock.now():
            sampler.sample()  # the end of the run
        fill_ttft(sampler.rows, rec)
        result["timeline"] = sampler.rows
    return result
