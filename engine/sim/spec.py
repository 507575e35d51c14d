"""A what-if run's specification: the model, the devices and their count, TP and PP, the engine's and
the router's settings, the workload and the fleet's; `deployment()` and `replica_bounds()` refuse
what cannot run with a SimConfigError that names the flag (engine/sim/run.py runs it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig
from engine.levers import LEVERS
from engine.serving.load.prompt_mix import PromptMix
from engine.sim import constants as C
from engine.sim.deployment import Deployment, SimConfigError
from engine.sim.devices import get_device
from engine.sim.models import get_model
from engine.sim.workload import Burst, ListConversations, SimRequest, make_workload

# The one lever -> simulator mapping: a lever's key (engine/levers.py; an A/B experiment's keys
# are the same names) and the SimSpec field it sets. The simulated lab, predict-then-run and A/B
# all build their SimSpec through spec_fields; each names the levers that apply to it.
LEVER_FIELDS: dict[str, str] = {
    "model": "model", "device": "device", "gpu_count": "gpus", "tensor_parallel": "tp", "pipeline_parallel": "pp",
    "pipeline_overlap": "pp_overlap", "weight_dtype": "dtype",
    "kv_dtype": "kv_dtype", "prompt_tokens": "input_tokens", "output_tokens": "output_tokens",
    "input_range_ratio": "input_range_ratio", "request_rate": "rate", "burstiness": "burstiness",
    "burst_factor": "burst_factor", "burst_at_s": "burst_at_s", "burst_s": "burst_s", "num_requests": "num_requests",
    "seed": "seed", "ttft_target_ms": "ttft_slo_ms", "prefill_gpus": "prefill_gpus", "decode_gpus": "decode_gpus",
    "max_num_seqs": "max_num_seqs", "max_batched_tokens": "max_batched_tokens", "paged": "paged",
    "block_size": "block_size", "prefix_caching": "prefix_caching", "kv_budget_mb": "kv_budget_mb",
    "queue_cap": "queue_cap", "deadline_s": "deadline_s", "autoscale": "autoscale", "min_replicas": "min_replicas",
    "max_replicas": "max_replicas", "warm_pool": "warm_pool", "provision_delay_s": "provision_delay_s",
    "system_prompt_tokens": "system_prompt_tokens", "system_prompt_share": "system_prompt_share",
    "prefix_aware_routing": "prefix_aware_routing", "conversation_turns": "conversation_turns",
    "host_profile": "host_profile", "num_speculative_tokens": "spec_tokens", "spec_acceptance": "spec_acceptance",
    "spec_draft_cost": "spec_draft_cost",
}  # fmt: skip


def spec_fields(levers: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """SimSpec's keyword arguments from lever values: each of `keys` that `levers` holds, under
    its field's name, in the lever's type. Prefill and decode pools of 0 and 0 are colocated (no
    split), as the levers mean them."""
    out: dict[str, Any] = {}
    for key in keys:
        if key in levers:
            value, lever = levers[key], LEVERS.get(key)
            out[LEVER_FIELDS[key]] = value if lever is None or value is None else lever.kind(value)
    if not out.get("prefill_gpus") and not out.get("decode_gpus"):
        out.pop("prefill_gpus", None), out.pop("decode_gpus", None)
    return out


@dataclass
class SimSpec:
    model: str
    device: str
    gpus: int
    tp: int = 1
    pp: int = 1  # pipeline stages a replica (each a TP group): a replica takes tp x pp GPUs
    pp_overlap: bool = True  # as many batches in flight as stages; False: one at a time (the bubble)
    dtype: str = "bf16"
    kv_dtype: str = "bf16"
    input_tokens: int = 1000
    output_tokens: int = 1000
    input_range_ratio: float = 0.0
    num_requests: int = 1000
    rate: float = float("inf")
    # Closed loop: at most this many requests in flight, each client sending its next the moment
    # its last one ends (`vllm bench serve --max-concurrency`); with a finite rate, the rate's
    # arrivals wait for a free client (engine/sim/clients.py). None: open loop, the rate alone.
    concurrency: int | None = None
    burstiness: float = 1.0
    # A shared system prompt at the head of this share of the prompts, inside input_tokens
    # (engine/serving/load/prompt_mix.py): what prefix caching and prefix-aware routing can serve.
    system_prompt_tokens: int = 0
    system_prompt_share: float = 1.0
    # Turns per conversation: a turn resends the last one's prompt and answer, then its own part as
    # the new message (workload.ListConversations).
    conversation_turns: int = 1
    burst_factor: float = 1.0  # the rate times this for burst_s from burst_at_s (workload.Burst)
    burst_at_s: float = 0.0
    burst_s: float = 0.0
    max_num_seqs: int = 1024  # vLLM v1's default for the API server on a >= 70 GB GPU
    max_batched_tokens: int = 8192
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    seed: int = 0
    admission: str = "greedy"  # engine/config.py ADMISSION_POLICIES
    kv_watermark: float = 0.0  # EngineConfig.kv_watermark: vLLM v0's whole-prompt admission, 0 off (v1)
    # The 2024 Python engines' scheduling (EngineConfig.prefill_first, scheduler_steps): prompt
    # steps apart from decode steps (vLLM v0 without chunked prefill, SGLang 0.3), and a decode
    # batch run this many steps per schedule (vLLM 0.6's --num-scheduler-steps).
    prefill_first: bool = False
    scheduler_steps: int = 1
    # The engine's host work per step, by generation (engine/sim/host_profiles.py): "default" is the
    # cost model's fixed step overhead; the others are Vidur's measured stages, serial or hidden.
    host_profile: str = "default"
    # Speculative decoding (EngineConfig.num_speculative_tokens): guesses a decode checks a step, and
    # the chance each stands once those before it did (Deployment.spec_acceptance).
    spec_tokens: int = 0
    spec_acceptance: float = 0.6
    spec_draft_cost: float = 0.0  # a draft pass over the target's step: 0 for n-gram lookup (Deployment)
    prefix_caching: bool = False  # random prompts share no prefix; hashing them only costs time
    paged: bool = True  # False: static batches over contiguous max-length KV slabs (EngineConfig.paged)
    block_size: int = 16  # KV block size in tokens (EngineConfig.block_size)
    kv_budget_mb: float | None = None  # per GPU; None: what the device's memory leaves (EngineConfig)
    queue_cap: int | None = None  # None: every request is queued (as `vllm bench serve` expects)
    # The router's central queue (engine/serving/routing/defences.py): a request waits there until
    # a replica has room (a free slot, KV for the prompt, no waiter of its own). False: each goes
    # to a replica on arrival, as a bare engine's own server takes it (the published runs' setup).
    central_queue: bool = True
    # The router sends a prompt where its prefix is cached (the defence lever); False: prefix-blind,
    # equal loads take turns (engine/serving/routing/router.py).
    prefix_aware_routing: bool = True
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

    @property
    def group(self) -> int:
        """GPUs one replica takes: its TP group in each of its pipeline stages."""
        return self.tp * self.pp

    @property
    def shape_name(self) -> str:
        return f"TP{self.tp}" + (f" x PP{self.pp}" if self.pp > 1 else "")

    def replicas(self, gpus: int | None = None) -> int:
        """Replicas that `gpus` (the run's, by default) hold."""
        return (self.gpus if gpus is None else gpus) // self.group

    def replica_bounds(self) -> tuple[int, int]:
        """(fewest, most) replicas of an autoscaled run, checked against the GPUs."""
        most = self.replicas() if self.max_replicas is None else self.max_replicas
        if not 1 <= self.min_replicas <= most:
            raise SimConfigError(f"--min-replicas {self.min_replicas} must be in [1, --max-replicas {most}]")
        if (most + self.warm_pool) * self.group > self.gpus:
            raise SimConfigError(
                f"{most} replicas + a warm pool of {self.warm_pool} at {self.shape_name} need more than --gpus {self.gpus}"
            )
        if self.storage_bw <= 0 or self.provision_delay_s < 0 or self.warm_pool < 0:
            raise SimConfigError("storage bandwidth must be positive; provisioning delay and warm pool not negative")
        if self.prefill_gpus is not None:
            raise SimConfigError("autoscaling runs colocated replicas: leave out --prefill-gpus/--decode-gpus")
        if not self.central_queue:
            raise SimConfigError("an autoscaled fleet routes through its central queue: leave out --central-queue false")
        return self.min_replicas, most

    def deployment(self) -> Deployment:
        try:
            model, device = get_model(self.model), get_device(self.device)
        except KeyError as err:
            raise SimConfigError(err.args[0]) from None
        if self.group > self.gpus:
            shape = f"tensor parallel {self.tp}" + (f" x pipeline parallel {self.pp}" if self.pp > 1 else "")
            raise SimConfigError(f"{shape} needs {self.group} GPUs; --gpus is {self.gpus}")
        if self.concurrency is not None and self.concurrency < 1:
            raise SimConfigError(f"--concurrency {self.concurrency} must be at least 1")
        if self.scheduler_steps < 1:
            raise SimConfigError(f"--scheduler-steps {self.scheduler_steps} must be at least 1")
        if self.scheduler_steps > 1 and (self.pp > 1 or not self.paged):
            raise SimConfigError("--scheduler-steps above 1 runs one paged batch at a time: leave out --pp and --paged false")
        if self.prefill_first and not self.paged:
            raise SimConfigError("--prefill-first is a policy of the paged scheduler: leave out --paged false")
        if self.conversation_turns < 1:
            raise SimConfigError(f"--conversation-turns {self.conversation_turns} must be at least 1")
        if self.front_on_device:
            device = device.with_front()
        if self.spec_tokens < 0:
            raise SimConfigError("--num-speculative-tokens must not be negative")
        if self.spec_tokens and (not self.paged or self.pp > 1 or self.scheduler_steps > 1):
            raise SimConfigError(
                "--num-speculative-tokens speculates on the paged scheduler, one pipeline stage, one scheduler step"
            )
        dep = Deployment(
            model, device, self.tp, self.dtype, self.kv_dtype, self.pp, self.host_profile, self.spec_acceptance,
            self.spec_draft_cost,
        )
        if self.gpus % self.group:
            raise SimConfigError(f"--gpus {self.gpus} is not a whole number of {self.shape_name} replicas")
        if (self.prefill_gpus is None) != (self.decode_gpus is None):
            raise SimConfigError("disaggregation needs both --prefill-gpus and --decode-gpus")
        if self.prefill_gpus is not None and self.decode_gpus is not None:
            p, d, g = self.prefill_gpus, self.decode_gpus, self.group
            if p < g or d < g or p % g or d % g or p + d != self.gpus:
                raise SimConfigError(
                    f"--prefill-gpus {p} and --decode-gpus {d} must each be whole {self.shape_name} replicas "
                    f"and add up to --gpus {self.gpus}"
                )
        spread, system = 1 + self.input_range_ratio, self.system_prompt_tokens
        if system < 0 or not 0 <= self.system_prompt_share <= 1:
            raise SimConfigError("--system-prompt-tokens must not be negative, --system-prompt-share in [0, 1]")
        # A carrier's own part is drawn around what the system prompt leaves, at least 1 token.
        prompt = max(int(self.input_tokens * spread), system + int(max(1, self.input_tokens - system) * spread))
        longest = prompt + int(self.output_tokens * spread)
        if longest > model.cfg.max_position:
            raise SimConfigError(
                f"a request of up to {longest} tokens is longer than {model.name}'s context of {model.cfg.max_position}"
            )
        return dep

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            max_num_seqs=self.max_num_seqs, max_batched_tokens=self.max_batched_tokens,
            prefix_caching=self.prefix_caching, admission=self.admission, kv_watermark=self.kv_watermark, seed=self.seed,
            paged=self.paged, block_size=self.block_size, kv_budget_mb=self.kv_budget_mb,
            prefill_first=self.prefill_first, scheduler_steps=self.scheduler_steps,
            num_speculative_tokens=self.spec_tokens,
        )

    def conversations(self, dep: Deployment) -> ListConversations | None:
        """The request list's conversations (None at one turn a conversation). A turn that would
        not leave room in the context for the longest answer drawn starts a new conversation."""
        if self.conversation_turns <= 1:
            return None
        mix = PromptMix(
            self.input_tokens, self.system_prompt_tokens, self.system_prompt_share, self.conversation_turns,
            self.input_range_ratio,
        )
        longest_answer = int(self.output_tokens * (1 + self.input_range_ratio))
        return ListConversations(mix, dep.model.cfg.vocab_size, dep.model.cfg.max_position - longest_answer)

    def workload(self) -> list[SimRequest]:
        """The spec's own requests: seeded arrivals (with the burst, if any) and lengths."""
        if self.burst_factor <= 0 or self.burst_at_s < 0 or self.burst_s < 0:
            raise SimConfigError("the burst's factor must be positive, its start and length not negative")
        burst = Burst(self.burst_factor, self.burst_at_s, self.burst_s) if self.burst_factor != 1.0 else None
        return make_workload(
            self.num_requests, self.rate, self.input_tokens, self.output_tokens, self.input_range_ratio,
            self.burstiness, self.seed, burst, self.system_prompt_tokens, self.system_prompt_share,
        )
