"""Every lever a learner can move: one typed definition shared by the API, the sockets, the pages
and the lessons. Keys are fixed by DESIGN.md; a page's input `name` is the key.

`apply` says how a change reaches the live engine: "load" (the load generator), "in_place"
(the running fleet takes it), "rebuild" (replicas restart), "sim" (the what-if fleet only),
"mode" (which executor the lab runs: the live engine or the simulated fleet).

`group` sorts the pages' forms: "" the ordinary levers; "defence" a guard the guide names, on by
default, whose "off" reproduces the production failure it prevents (engine/serving/routing/defences.py,
and the /failures gallery); "client" how the lab's own clients and the proxy in front of the
server behave (patience, retries, idle timeout).

Ranges are what the simulated fleet can reach (thousands of req/s, 32k prompts, 512 GPUs); the
live engine's narrower limits on this machine are engine/lab/live/lab.py check_live's, and a
simulated configuration's are engine/lab/simulated/lab_check.py check_sim's (the simulator's own reasons)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from engine.catalog import DEVICE_NAMES
from engine.catalog import MODEL_NAMES as MODELS  # the simulator's names; the first runs live
from engine.errors import InvalidParamError

EXECUTORS = ("live", "sim")


class Apply(enum.StrEnum):
    """How a change reaches the live engine (engine/lab/lever_routes.py says it per executor)."""

    LOAD = "load"
    IN_PLACE = "in_place"
    REBUILD = "rebuild"
    SIM = "sim"
    MODE = "mode"


class LeverGroup(enum.StrEnum):
    """Which form a lever sits in on the pages."""

    ORDINARY = ""
    DEFENCE = "defence"
    CLIENT = "client"
SIM_SPEEDS = (1, 10, 60)  # simulated seconds per wall second


@dataclass(frozen=True)
class Lever:
    key: str
    kind: type  # int, float, bool or str
    default: Any
    label: str
    unit: str = ""
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] = ()
    apply: Apply = Apply.IN_PLACE
    group: LeverGroup = LeverGroup.ORDINARY

    def __post_init__(self) -> None:  # the table below writes them as their strings
        object.__setattr__(self, "apply", Apply(self.apply))
        object.__setattr__(self, "group", LeverGroup(self.group))

    def validate(self, value: Any) -> Any:
        """The value in this lever's type, or InvalidParamError naming the lever."""
        if self.kind is bool:
            if not isinstance(value, bool):
                raise InvalidParamError(self.key, f"must be true or false, got {value!r}")
            return value
        if self.kind is str:
            if value not in self.choices:
                raise InvalidParamError(self.key, f"must be one of {list(self.choices)}, got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidParamError(self.key, f"must be a number, got {value!r}")
        if self.kind is int and value != int(value):
            raise InvalidParamError(self.key, f"must be a whole number, got {value!r}")
        value = self.kind(value)
        if self.choices and value not in self.choices:
            raise InvalidParamError(self.key, f"must be one of {list(self.choices)}, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise InvalidParamError(self.key, f"must be at least {self.minimum:g}{self.unit and ' ' + self.unit}")
        if self.maximum is not None and value > self.maximum:
            raise InvalidParamError(self.key, f"must be at most {self.maximum:g}{self.unit and ' ' + self.unit}")
        return value


LEVERS: dict[str, Lever] = {
    lever.key: lever
    for lever in (
        Lever("executor", str, "live", "Executor", choices=EXECUTORS, apply="mode"),
        Lever("device", str, "h100", "Simulated GPU", choices=DEVICE_NAMES, apply="sim"),
        Lever("sim_speed", int, 1, "Simulation speed", "x", choices=SIM_SPEEDS, apply="sim"),
        Lever("request_rate", float, 1.0, "Request rate", "req/s", 0, 5000, apply="load"),
        Lever("prompt_tokens", int, 200, "Prompt length (mean)", "tokens", 1, 32768, apply="load"),
        Lever("output_tokens", int, 64, "Output length (mean)", "tokens", 1, 32768, apply="load"),
        Lever("burstiness", float, 1.0, "Burstiness (1 = Poisson)", "", 0.1, 10, apply="load"),
        # Prompts that share prefixes (engine/serving/load/prompt_mix.py): one system prompt at the head
        # of a share of the requests, inside prompt_tokens; conversations that resend their history.
        Lever("system_prompt_tokens", int, 0, "Shared system prompt", "tokens", 0, 32768, apply="load"),
        Lever("system_prompt_share", float, 1.0, "Requests carrying it", "", 0, 1, apply="load"),
        Lever("conversation_turns", int, 1, "Turns per conversation", "", 1, 16, apply="load"),
        # What the prompts say (engine/serving/load/text_prompts.py): random ids; a text to write out
        # again, whose answer quotes it (editing); or a story to write, new text.
        Lever("prompt_style", str, "random", "Prompts", choices=("random", "quote", "write"), apply="load"),
        Lever("model", str, MODELS[0], "Model", choices=MODELS, apply="rebuild"),
        Lever("gpu_count", int, 1, "Devices", "", 1, 512),  # the device budget the autoscaler scales within
        Lever("ttft_target_ms", int, 1000, "TTFT target (p99)", "ms", 10, 60000),
        Lever("paged", bool, True, "Paged KV + continuous batching", apply="rebuild"),
        Lever("tensor_parallel", int, 1, "Tensor-parallel degree", "", choices=(1, 2, 4, 8, 16), apply="rebuild"),
        # A replica is tensor_parallel x pipeline_parallel devices (engine/parallel/distributed.py).
        Lever("pipeline_parallel", int, 1, "Pipeline stages", "", 1, 16, apply="rebuild"),
        Lever("pipeline_overlap", bool, True, "Pipeline overlap (a batch per stage)", apply="rebuild"),
        Lever("weight_dtype", str, "bf16", "Weight dtype", choices=("bf16", "fp8", "fp4"), apply="sim"),
        Lever("kv_dtype", str, "bf16", "KV cache dtype", choices=("bf16", "fp8"), apply="sim"),
        # A prefill/decode split (both > 0, adding up to gpu_count): live, replica processes that
        # prefill and hand the KV to ones that decode (engine/serving/disagg/); simulated, two pools.
        Lever("prefill_gpus", int, 0, "Prefill pool (0 = colocated)", "devices", 0, 512, apply="rebuild"),
        Lever("decode_gpus", int, 0, "Decode pool (0 = colocated)", "devices", 0, 512, apply="rebuild"),
        Lever("block_size", int, 16, "KV block size", "tokens", choices=(8, 16, 32, 64), apply="rebuild"),
        Lever("max_num_seqs", int, 64, "Batch slots", "sequences", 1, 1024),
        Lever("max_batched_tokens", int, 2048, "Token budget per step", "tokens", 16, 65536),
        Lever("chunked_prefill", bool, True, "Chunked prefill", group="defence"),
        Lever("prefix_caching", bool, True, "Prefix caching"),
        Lever("kv_budget_mb", float, 512.0, "KV budget per device (live)", "MB", 1, 100000, apply="rebuild"),
        # Precision on the live engine (the simulator's are weight_dtype and kv_dtype).
        Lever("quantization", str, "none", "Weights (live): int8 = W8A8", choices=("none", "int8"), apply="rebuild"),
        Lever("kv_cache_dtype", str, "auto", "KV cache dtype (live)", choices=("auto", "fp8"), apply="rebuild"),
        # Speculative decoding (engine/sample/spec_decode.py): n-gram guesses checked in one pass. Live,
        # the guesses come from the text; simulated, spec_acceptance stands for how often they hold.
        Lever("num_speculative_tokens", int, 0, "Speculative tokens (0 = off)", "tokens", 0, 8),
        Lever("spec_lookup_max", int, 4, "Guess lookup: longest match", "tokens", 1, 16),
        Lever("spec_lookup_min", int, 2, "Guess lookup: shortest match", "tokens", 1, 16),
        Lever("spec_acceptance", float, 0.6, "Guesses that hold (simulated)", "", 0, 1, apply="sim"),
        Lever("queue_cap", int, 64, "Queue capacity", "requests", 1, 100000),
        Lever("deadline_s", float, 30.0, "Queue deadline", "s", 0.1, 3600),
        Lever("rate_limit", float, 0.0, "Rate limit per key (0 = off)", "req/s", 0, 1000),
        Lever("min_replicas", int, 1, "Min replicas", "", 0, 512),
        Lever("max_replicas", int, 2, "Max replicas", "", 1, 512),
        Lever("warm_pool", int, 0, "Warm pool", "replicas", 0, 64),
        Lever("provision_delay_s", float, 5.0, "Provisioning delay", "s", 0, 3600),
        # The user's own price: what a GPU-hour costs them; the what-if's cost per million tokens.
        Lever("gpu_hour_usd", float, 2.0, "Your GPU price", "$/GPU-hour", 0, 1000, apply="sim"),
        # Defences (DESIGN.md): default on; off reproduces the failure the guide names.
        Lever("stream_flush", bool, True, "Streams flushed per chunk (off: a buffering proxy)", apply="load", group="defence"),
        Lever("heartbeat", bool, True, "Heartbeat pings while a request waits", group="defence"),
        Lever("cancel_on_disconnect", bool, True, "Cancel when the client hangs up", group="defence"),
        Lever("queue_bound", bool, True, "Bounded queue (queue_cap refuses)", group="defence"),
        Lever("deadline_recheck", bool, True, "Deadline rechecked before prefill", group="defence"),
        Lever("retry_jitter", bool, True, "Jitter in Retry-After", group="defence"),
        Lever("central_queue", bool, True, "One central queue (off: per-replica inboxes)", group="defence"),
        Lever("aging", bool, True, "Aging (a reserved slot for old waiters)", group="defence"),
        Lever("prefix_aware_routing", bool, True, "Prefix-aware routing", group="defence"),
        Lever("collective_timeout", bool, True, "Timeout on tensor-parallel collectives", apply="rebuild", group="defence"),
        Lever("drain_on_scale_in", bool, True, "Drain on scale-in", group="defence"),
        Lever("asymmetric_windows", bool, True, "Asymmetric scaling windows", group="defence"),
        Lever("count_pending", bool, True, "Count starting replicas as capacity", group="defence"),
        # A cost, not a defence: reduction order independent of the batch, bitwise-stable outputs.
        Lever("batch_invariant", bool, False, "Batch-invariant kernels", apply="rebuild", group="defence"),
        # The lab's clients and the proxy hop between them and the server.
        Lever("client_patience_s", float, 0.0, "Client patience (0 = waits forever)", "s", 0, 3600, apply="load", group="client"),
        Lever("client_retries", int, 0, "Client retries after a 429", "", 0, 10, apply="load", group="client"),
        Lever("proxy_idle_timeout_s", float, 60.0, "Proxy idle timeout (0 = none)", "s", 0, 3600, apply="load", group="client"),
    )
}


DEFENCE_LEVERS = tuple(key for key, lever in LEVERS.items() if lever.group == LeverGroup.DEFENCE)
CLIENT_LEVERS = tuple(key for key, lever in LEVERS.items() if lever.group == LeverGroup.CLIENT)
# The levers a running router takes at once (RouterConfig's fields), without a rebuild.
ROUTER_LEVERS = ("queue_cap", "deadline_s", "rate_limit")


def validate_levers(values: dict[str, Any]) -> dict[str, Any]:
    """Check a set of lever values; unknown keys and bad values raise InvalidParamError."""
    if not isinstance(values, dict):
        raise InvalidParamError("levers", "must be an object of lever values")
    clean = {}
    for key, value in values.items():
        lever = LEVERS.get(key)
        if lever is None:
            raise InvalidParamError(key, "is not a lever")
        clean[key] = lever.validate(value)
    if clean.get("min_replicas", 0) > clean.get("max_replicas", 64):
        raise InvalidParamError("min_replicas", "must not exceed max_replicas")
    if clean.get("spec_lookup_min", 1) > clean.get("spec_lookup_max", 16):
        raise InvalidParamError("spec_lookup_min", "must not exceed spec_lookup_max")
    return clean


def parse_bool(text: str) -> bool:
    """A boolean lever's command-line value."""
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")
