"""The keys of an A/B experiment (engine/sim/compare.py): each one's type and range, and the SimSpec
field and `python -m engine.sim run` flag it sets. Keys are lever keys (engine/levers.py) where a
lever exists, else the CLI's names."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidParamError
from engine.sim.deployment import KV_DTYPES, WEIGHT_DTYPES
from engine.sim.devices import DEVICE_NAMES
from engine.sim.host_profiles import HOST_PROFILES
from engine.sim.models import MODEL_NAMES
from engine.sim.spec import LEVER_FIELDS

MAX_REQUESTS = 4000  # per side: with compare.py's work bound, one A/B returns in seconds on 2 cores
# The lever's model names (engine/levers.py MODELS) and the simulator's, lower-cased.
MODEL_ALIASES = {"llama-8b": "llama-3.1-8b", "llama-70b": "llama-3.1-70b", "llama-405b": "llama-3.1-405b"}


@dataclass(frozen=True)
class Field:
    """One key of an experiment: its type and range, and the SimSpec field and CLI flag it sets."""

    key: str
    kind: type
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] = ()

    @property
    def spec_field(self) -> str:
        return LEVER_FIELDS[self.key]

    @property
    def flag(self) -> str:
        return "--" + {"gpus": "gpus", "tp": "tp", "rate": "rate", "spec_tokens": "num-speculative-tokens"}.get(
            self.spec_field, self.spec_field.replace("_", "-")
        )

    def coerce(self, value: Any, where: str) -> Any:
        """The value in this field's type (a query string's text too), or InvalidParamError naming `where`."""
        if isinstance(value, str) and self.kind is not str:
            text = value.strip().lower()
            if self.kind is bool:
                if text not in ("true", "false"):
                    raise InvalidParamError(where, f"must be true or false, got {value!r}")
                value = text == "true"
            else:
                try:
                    value = float(text)
                except ValueError:
                    raise InvalidParamError(where, f"must be a number, got {value!r}") from None
        if self.kind is bool:
            if not isinstance(value, bool):
                raise InvalidParamError(where, f"must be true or false, got {value!r}")
            return value
        if self.kind is str:
            text = MODEL_ALIASES.get(str(value).lower(), str(value).lower())
            if text not in self.choices:
                raise InvalidParamError(where, f"must be one of {', '.join(self.choices)}, got {value!r}")
            return text
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise InvalidParamError(where, f"must be a number, got {value!r}")
        if self.kind is int and value != int(value):
            raise InvalidParamError(where, f"must be a whole number, got {value!r}")
        value = self.kind(value)
        if self.choices and value not in self.choices:
            raise InvalidParamError(where, f"must be one of {', '.join(map(str, self.choices))}, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise InvalidParamError(where, f"must be at least {self.minimum:g}")
        if self.maximum is not None and value > self.maximum:
            raise InvalidParamError(where, f"must be at most {self.maximum:g}")
        return value


TRAFFIC_FIELDS = {f.key: f for f in (
    Field("request_rate", float, 0.01, 10000),
    Field("prompt_tokens", int, 1, 131072),
    Field("output_tokens", int, 1, 131072),
    Field("input_range_ratio", float, 0, 0.99),
    Field("burstiness", float, 0.1, 10),
    Field("system_prompt_tokens", int, 0, 32768),
    Field("system_prompt_share", float, 0, 1),
    Field("conversation_turns", int, 1, 16),
    Field("burst_factor", float, 0.1, 100),
    Field("burst_at_s", float, 0, 86400),
    Field("burst_s", float, 0, 86400),
    Field("num_requests", int, 1, MAX_REQUESTS),
    Field("seed", int, 0, 2**31 - 1),
    Field("ttft_target_ms", float, 1, 600000),
)}  # fmt: skip
SIDE_FIELDS = {f.key: f for f in (
    Field("model", str, choices=MODEL_NAMES),
    Field("device", str, choices=DEVICE_NAMES),
    Field("gpu_count", int, 1, 512),
    Field("tensor_parallel", int, choices=(1, 2, 4, 8, 16)),
    Field("pipeline_parallel", int, 1, 16),
    Field("pipeline_overlap", bool),
    Field("weight_dtype", str, choices=WEIGHT_DTYPES),
    Field("kv_dtype", str, choices=KV_DTYPES),
    Field("prefill_gpus", int, 0, 512),  # 0 with decode_gpus 0: colocated
    Field("decode_gpus", int, 0, 512),
    Field("max_num_seqs", int, 1, 4096),
    Field("max_batched_tokens", int, 16, 131072),
    Field("paged", bool),
    Field("block_size", int, choices=(8, 16, 32, 64, 128)),
    Field("prefix_caching", bool),
    Field("prefix_aware_routing", bool),
    Field("host_profile", str, choices=HOST_PROFILES),
    Field("num_speculative_tokens", int, 0, 16),
    Field("spec_acceptance", float, 0, 1),
    Field("spec_draft_cost", float, 0, 1),
    Field("kv_budget_mb", float, 1, 10_000_000),
    Field("queue_cap", int, 1, 1_000_000),
    Field("deadline_s", float, 0.1, 86400),
    Field("autoscale", bool),
    Field("min_replicas", int, 1, 512),
    Field("max_replicas", int, 1, 512),
    Field("warm_pool", int, 0, 512),
    Field("provision_delay_s", float, 0, 86400),
)}  # fmt: skip
