"""One what-if run: the serving stack's own Router (and its RequestQueue) in front of simulated
replicas, clients arriving from the load generator's processes, all on one event loop.

    result = simulate(SimSpec(model="llama-3.1-70b", device="h100", gpus=8, tp=8, ...))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.clock import stopwatch
from engine.config import EngineConfig
from engine.levers import LEVERS
from engine.sampling_params import SamplingParams
from engine.serving.events import EventLog
from engine.serving.messages import RequestError
from engine.serving.router import AdmissionError, Router, RouterConfig
from engine.sim import constants as C
from engine.sim.deployment import Deployment, SimConfigError
from engine.sim.devices import get_device
from engine.sim.loop import EventLoop
from engine.sim.models import get_model
from engine.sim.replica import SimReplica
from engine.sim.results import Recorder, summarize
from engine.sim.runner import sim_executor
from engine.sim.workload import Burst, SimRequest, make_workload


@dataclass
class SimSpec:
    model: str
    device: str
    gpus: int
    tp: int = 1
    dtype: str = "bf16"
    kv_dtype: str = "bf16"
    input_tokens: int = 1000
    output_tokens: int = 1000
    input_range_ratio: float = 0.0
    num_requests: int = 1000
    rate: float = float("inf")
    burstiness: float = 1.0
    burst_factor: float = 1.0  # the rate times this for burst_s from burst_at_s (workload.Burst)
    burst_at_s: float = 0.0
    burst_s: float = 0.0
    max_num_seqs: int = 1024  # vLLM v1's default for the API server on a >= 70 GB GPU
    max_batched_tokens: int = 8192
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    seed: int = 0
    admission: str = "greedy"  # engine/config.py ADMISSION_POLICIES
    prefix_caching: bool = False  # random prompts share no prefix; hashing them only costs time
    paged: bool = True  # False: static batches over contiguous max-length KV slabs (EngineConfig.paged)
    block_size: int = 16  # KV block size in tokens (EngineConfig.block_size)
    kv_budget_mb: float | None = None  # per GPU; None: what the device's memory leaves (EngineConfig)
    queue_cap: int | None = None  # None: every request is queued (as `vllm bench serve` expects)
    deadline_s: float | None = None
    kill_replica_at_s: float | None = None  # replica 0 fails at this simulated time
    # The live server on this machine: the HTTP front and the clients share the device's cores
    # (Device.with_front; the request reaches the router after the device's front latency).
    front_on_device: bool = False
    prefill_gpus: int | None = None  # both set: a prefill pool and a decode pool (disaggregation)
    decode_gpus: int | None = None
    # Autoscaling (engine/sim/fleet_run.py): the real Fleet and Autoscaler over SimReplicas,
    # starting at min_replicas and growing up to max_replicas (None: every TP group --gpus holds).
    autoscale: bool = False
    min_replicas: int = LEVERS["min_replicas"].default
    max_replicas: int | None = None
    warm_pool: int = LEVERS["warm_pool"].default
    provision_delay_s: float = LEVERS["provision_delay_s"].default
    storage_bw: float = C.STORAGE_BW  # bytes/s per GPU: a cold start loads its weight shard at this
    timeline_s: float = 1.0  # the timeline: one row per this many simulated seconds
    timeline: bool = False  # a plain run records one too (the autoscaled run always does)
    settle: bool = False  # after the last request, run on idle until the fleet is back at min_replicas

    def replica_bounds(self) -> tuple[int, int]:
        """(fewest, most) replicas of an autoscaled run, checked against the GPUs."""
        most = self.gpus // self.tp if self.max_replicas is None else self.max_replicas
        if not 1 <= self.min_replicas <= most:
            raise SimConfigError(f"--min-replicas {self.min_replicas} must be in [1, --max-replicas {most}]")
        if (most + self.warm_pool) * self.tp > self.gpus:
            raise SimConfigError(
                f"{most} replicas + a warm pool of {self.warm_pool} at TP{self.tp} need more than --gpus {self.gpus}"
            )
        if self.storage_bw <= 0 or self.provision_delay_s < 0 or self.warm_pool < 0:
            raise SimConfigError("storage bandwidth must be positive; provisioning delay and warm pool not negative")
        if self.prefill_gpus is not None:
            raise SimConfigError("autoscaling runs colocated replicas: leave out --prefill-gpus/--decode-gpus")
        return self.min_replicas, most

    def deployment(self) -> Deployment:
        try:
            model, device = get_model(self.model), get_device(self.device)
        except KeyError as err:
            raise SimConfigError(err.args[0]) from None
        if self.tp > self.gpus:
            raise SimConfigError(f"tensor parallel {self.tp} needs {self.tp} GPUs; --gpus is {self.gpus}")
        if self.front_on_device:
            device = device.with_front()
        dep = Deployment(model, device, self.tp, self.dtype, self.kv_dtype)
        if self.gpus % self.tp:
            raise SimConfigError(f"--gpus {self.gpus} is not a whole number of TP{self.tp} replicas")
        if (self.prefill_gpus is None) != (self.decode_gpus is None):
            raise SimConfigError("disaggregation needs both --prefill-gpus and --decode-gpus")
        if self.prefill_gpus is not None and self.decode_gpus is not None:
            p, d = self.prefill_gpus, self.decode_gpus
            if p < self.tp or d < self.tp or p % self.tp or d % self.tp or p + d != self.gpus:
                raise SimConfigError(
                    f"--prefill-gpus {p} and --decode-gpus {d} must each be whole TP{self.tp} replicas "
                    f"and add up to --gpus {self.gpus}"
                )
        longest = int(self.input_tokens * (1 + self.input_range_ratio)) + int(self.output_tokens * (1 + self.input_range_ratio))
        if longest > model.cfg.max_position:
            raise SimConfigError(
                f"a request of up to {longest} tokens is longer than {model.name}'s context of {model.cfg.max_position}"
            )
        return dep

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            max_num_seqs=self.max_num_seqs, max_batched_tokens=self.max_batched_tokens,
            prefix_caching=self.prefix_caching, admission=self.admission, seed=self.seed,
            paged=self.paged, block_size=self.block_size, kv_budget_mb=self.kv_budget_mb,
        )

    def workload(self) -> list[SimRequest]:
        """The spec's own requests: seeded arrivals (with the burst, if any) and lengths."""
        if self.burst_factor <= 0 or self.burst_at_s < 0 or self.burst_s < 0:
            raise SimConfigError("the burst's factor must be positive, its start and length not negative")
        burst = Burst(self.burst_factor, self.burst_at_s, self.burst_s) if self.burst_factor != 1.0 else None
        return make_workload(
            self.num_requests, self.rate, self.input_tokens, self.output_tokens, self.input_range_ratio,
            self.burstiness, self.seed, burst,
        )


def simulate(spec: SimSpec, requests: list[SimRequest] | None = None) -> dict[str, Any]:
    """Run the workload to its end; raises SimConfigError for a configuration that cannot run.
    requests: an explicit workload (arrivals and lengths, e.g. a live run's) instead of the spec's."""
    if spec.autoscale:
        from engine.sim.fleet_run import simulate_fleet

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

    from engine.llm_engine import LLMEngine

    streams: dict[str, Any] = {}
    first_tokens: dict[str, float] = {}  # disaggregated: the prefill replica's token time

    def new_replica(i: int, on_finished: Any, transfer: Any = None) -> SimReplica:
        # A decode replica finds the KV it is handed through its prefix cache (import_prefix).
        cfg = config if transfer is None else config.replace(prefix_caching=True)
        engine = LLMEngine(cfg, clock, sim_executor(dep, cfg))
        return SimReplica(i, engine, loop, on_finished, transfer, record_steps=False)  # headless: nothing draws steps

    def new_router(pool: list[SimReplica], cap: int | None) -> Router:
        router_config = RouterConfig(
            queue_cap=cap or max(1, spec.num_requests), deadline_s=spec.deadline_s,
            block_size=config.block_size, max_model_len=dep.model.cfg.max_position,
        )
        return Router(pool, router_config, clock, EventLog(clock), dispatch_thread=False)

    def finished(seq: Any) -> None:
        rec.finish(seq)
        streams.pop(seq.request_id, None)  # its final TokenDelta is read off the Sequence here

    if spec.prefill_gpus is None:
        replicas = [new_replica(i, finished) for i in range(spec.gpus // spec.tp)]
        router = new_router(replicas, spec.queue_cap)
        decode_router = None
    else:
        assert spec.decode_gpus is not None
        link = C.INTER_NODE_BW if spec.gpus > dep.device.gpus_per_node else dep.device.link_bw
        per_token = dep.kv_bytes_per_token  # each GPU of the prefill group sends its shard to its peer

        def transfer_s(tokens: int) -> float:
            return tokens * per_token / link

        def decoded(seq: Any) -> None:
            rec.finish(seq, (first_tokens.pop(seq.request_id),))
            streams.pop(seq.request_id, None)

        def prefilled(seq: Any) -> None:
            streams.pop(seq.request_id, None)
            left = decode_left.pop(seq.request_id)
            if left == 0 or seq.finish_reason == "abort":
                rec.finish(seq)
                return
            first_tokens[seq.request_id] = seq.times.first_token
            params = SamplingParams(temperature=0, max_tokens=left, ignore_eos=True)
            streams[seq.request_id] = decode_router.submit(seq.request_id, seq.token_ids, params)  # type: ignore[union-attr]
            decode_router.dispatch_once()  # type: ignore[union-attr]

        n_prefill = spec.prefill_gpus // spec.tp
        prefill = [new_replica(i, prefilled) for i in range(n_prefill)]
        decode = [new_replica(n_prefill + i, decoded, transfer_s) for i in range(spec.decode_gpus // spec.tp)]
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
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        try:
            streams[r.request_id] = router.submit(r.request_id, r.token_ids(vocab), params)
        except AdmissionError as err:
            refused[r.request_id] = err.reason
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

    hop = dep.device.front_latency_s if spec.front_on_device else 0.0  # client -> router (see SimSpec)
    for r in requests:
        loop.at(r.arrival + hop, lambda r=r: arrive(r))
    loop.every(Router.DISPATCH_POLL_S, poll)
    if spec.kill_replica_at_s is not None:
        loop.at(spec.kill_replica_at_s, lambda: replicas[0].fail("replica 0 killed"))
    loop.run()

    take_errors(streams, rec.finished, refused)
    result = summarize(rec, clock.now(), spec.gpus)
    result |= replica_figures(replicas, refused, loop, clock.now(), elapsed())
    result |= {
        "replicas": len(replicas),
        "prefill_replicas": 0 if decode_router is None else spec.prefill_gpus // spec.tp,
        "simulated_s": clock.now(),
    }
    if sampler is not None:
        from engine.sim.timeline import fill_ttft

        if not sampler.rows or sampler.rows[-1]["t"] < clock.now():
            sampler.sample()  # the end of the run
        fill_ttft(sampler.rows, rec)
        result["timeline"] = sampler.rows
    return result


def replica_figures(
    replicas: list[SimReplica], refused: dict[str, str], loop: EventLoop, ran_s: float, wall_s: float
) -> dict[str, Any]:
    """What every run reports of its replicas and its refusals, besides the request figures."""
    reasons: dict[str, int] = {}
    for reason in refused.values():
        reasons[reason] = reasons.get(reason, 0) + 1
    return {
        "kv_usage_max": max(r.kv_usage_max for r in replicas),
        "preemptions": sum(r.engine.scheduler.num_preemptions for r in replicas),
        "wall_s": wall_s,
        "sim_s_per_wall_s": ran_s / wall_s,
        "refused": reasons,
        "kv_blocks_per_replica": replicas[0].engine.kv.num_blocks,
        "kv_blocks_free_at_end": all(r.engine.kv.num_used_blocks == 0 for r in replicas),
        "steps": sum(r.engine.num_steps for r in replicas),
        "events": loop.num_events,
    }


def take_errors(streams: dict[str, Any], finished: dict[str, str], refused: dict[str, str]) -> None:
    """Requests that did not finish were answered with a RequestError (deadline, failed replica)."""
    for request_id, events in streams.items():
        if request_id in finished:
            continue
        while not events.empty():
            event = events.get_nowait()
            if isinstance(event, RequestError):
                refused[request_id] = event.message
                break
