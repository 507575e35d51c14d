"""A/B: two what-if configurations on the same seeded traffic, side by side.

An experiment is one traffic (rate, lengths, burstiness, a burst, how many requests, the seed,
the TTFT target that goodput counts against) and two sides (model, device, GPUs, TP, dtypes,
pools, batching, autoscaling, and the user's GPU price). Both sides replay the very same request
list (engine/sim/workload.py), one after the other, through `simulate` (the code behind
`python -m engine.sim run`), and each side's figures come with the exact command that reproduces
them. Keys are lever keys (engine/levers.py) where a lever exists, else the CLI's names.

    experiment = parse_experiment({"preset": "tp4_vs_tp8"})
    result = run_experiment(experiment)   # {"traffic", "a", "b"}: summaries, table rows, timelines
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from engine.errors import InvalidParamError
from engine.levers import LEVERS
from engine.serving.replicas.replica_api import ENDED
from engine.sim import calibration
from engine.sim.deployment import SimConfigError
from engine.sim.experiment_fields import SIDE_FIELDS, TRAFFIC_FIELDS, Field
from engine.sim.presets import PRESETS
from engine.sim.run import SimSpec, simulate
from engine.sim.spec import spec_fields
from engine.sim.workload import SimRequest

# The work one side may simulate: requests x (output + prompt / PROMPT_WEIGHT) tokens. Decode
# tokens cost a scheduler step each; a prompt is priced in chunks, so its tokens weigh less.
MAX_WORK = 2_000_000
PROMPT_WEIGHT = 16
TIMELINE_S = 1.0  # one chart point per simulated second
PRICE = LEVERS["gpu_hour_usd"]  # per side: two device kinds have two prices
DEFAULT_TRAFFIC: dict[str, Any] = {
    "request_rate": 10.0, "prompt_tokens": 1000, "output_tokens": 250, "input_range_ratio": 0.5,
    "num_requests": 500, "ttft_target_ms": float(LEVERS["ttft_target_ms"].default),
}  # fmt: skip
DEFAULT_SIDE: dict[str, Any] = {"model": "llama-3.1-8b", "device": "h100", "gpu_count": 1, "tensor_parallel": 1}
# Which key a simulator refusal is about, from the words of its reason (deployment.py, run.py).
REASON_KEYS = (
    ("--prefill-gpus", "prefill_gpus"), ("--decode-gpus", "decode_gpus"), ("disaggregation", "prefill_gpus"),
    ("--min-replicas", "min_replicas"), ("warm pool", "warm_pool"), ("autoscaling", "autoscale"),
    ("kv dtype", "kv_dtype"), ("of weights", "model"), ("fp4", "weight_dtype"), ("dtype", "weight_dtype"),
    ("whole number of tp", "gpu_count"), ("tensor parallel", "tensor_parallel"), ("pipeline parallel", "pipeline_parallel"), ("context", "prompt_tokens"),
    ("device", "device"), ("burst", "burst_factor"), ("kv", "kv_budget_mb"),
)  # fmt: skip


@dataclass
class Side:
    label: str
    levers: dict[str, Any]  # SIDE_FIELDS keys, every one this side sets
    gpu_hour_usd: float = PRICE.default


@dataclass
class Experiment:
    traffic: dict[str, Any]  # TRAFFIC_FIELDS keys
    a: Side
    b: Side
    preset: str | None = None
    sides: tuple[str, ...] = ("a", "b")

    def spec(self, name: str) -> SimSpec:
        """The side's SimSpec: the traffic's fields and the side's, over SimSpec's own defaults."""
        side: Side = getattr(self, name)
        values = spec_fields(self.traffic | side.levers, (*self.traffic, *side.levers))
        if "kv_dtype" not in values:  # the CLI's rule: the KV cache in the weights' dtype, fp4 keeps bf16
            values["kv_dtype"] = "bf16" if values.get("dtype", "bf16") == "fp4" else values.get("dtype", "bf16")
        return SimSpec(**values, timeline=True, timeline_s=TIMELINE_S)


def parse_experiment(body: Mapping[str, Any]) -> Experiment:
    """{"preset"?, "traffic"?, "a"?, "b"?}: the preset's values, overridden key by key; a side
    takes "label" and "gpu_hour_usd" beside its levers. Raises InvalidParamError naming
    `traffic.<key>`, `a.<key>` or `b.<key>`."""
    if not isinstance(body, Mapping):
        raise InvalidParamError("experiment", "must be an object with traffic, a and b")
    unknown = set(body) - {"preset", "traffic", "a", "b"}
    if unknown:
        raise InvalidParamError(min(unknown), "is not part of an experiment (preset, traffic, a, b)")
    preset_name = body.get("preset")
    if preset_name is not None and preset_name not in PRESETS:
        raise InvalidParamError("preset", f"must be one of {', '.join(PRESETS)}, got {preset_name!r}")
    preset = PRESETS.get(preset_name or "", {})
    traffic = DEFAULT_TRAFFIC | dict(preset.get("traffic", {})) | _mapping(body, "traffic")
    clean = {
        key: _field(TRAFFIC_FIELDS, key, "traffic").coerce(value, f"traffic.{key}") for key, value in traffic.items()
    }
    sides = []
    for name in ("a", "b"):
        given = dict(preset.get(name, {})) | _mapping(body, name)
        label = str(given.pop("label", name.upper()))[:80]
        price = PRICE.validate(_number(given.pop("gpu_hour_usd", PRICE.default), f"{name}.gpu_hour_usd"))
        levers = DEFAULT_SIDE | given
        sides.append(
            Side(label, {k: _field(SIDE_FIELDS, k, name).coerce(v, f"{name}.{k}") for k, v in levers.items()}, price)
        )
    experiment = Experiment(clean, sides[0], sides[1], preset_name)
    for name in experiment.sides:
        check_side(experiment, name)
    return experiment


def check_side(experiment: Experiment, name: str) -> SimSpec:
    """The side's spec if the simulator can run it and the work is within bounds, else
    InvalidParamError naming the side's key the simulator's reason is about."""
    spec = experiment.spec(name)
    try:
        spec.deployment()
        if spec.autoscale:
            spec.replica_bounds()
    except SimConfigError as err:
        raise InvalidParamError(blame(str(err), name), str(err)) from None
    # A conversation's turn resends its history: over N turns a prompt is P + (N - 1) / 2 x (P + O) on average.
    prompt = spec.input_tokens + (spec.conversation_turns - 1) / 2 * (spec.input_tokens + spec.output_tokens)
    work = spec.num_requests * (spec.output_tokens + prompt / PROMPT_WEIGHT) * (1 + spec.input_range_ratio)
    if work > MAX_WORK:
        raise InvalidParamError(
            "traffic.num_requests",
            f"{spec.num_requests} requests of {spec.input_tokens} + {spec.output_tokens} tokens are more work than "
            "one A/B runs in the browser: use fewer requests, or run the side's command (python -m engine.sim run)",
        )
    return spec


def blame(reason: str, side: str) -> str:
    """The parameter a simulator refusal is about: `traffic.<key>` or `<side>.<key>`."""
    text = reason.lower()
    key = next((key for words, key in REASON_KEYS if words in text), "model")
    return f"traffic.{key}" if key in TRAFFIC_FIELDS else f"{side}.{key}"


def _mapping(body: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key, {})
    if not isinstance(value, Mapping):
        raise InvalidParamError(key, "must be an object of keys and values")
    return dict(value)


def _field(table: dict[str, Field], key: str, where: str) -> Field:
    if key not in table:
        raise InvalidParamError(f"{where}.{key}", f"is not a key here; known: {', '.join(table)}")
    return table[key]


def _number(value: Any, where: str) -> float:
    return Field(where, float, PRICE.minimum, PRICE.maximum).coerce(value, where)


# running ---------------------------------------------------------------------------------------


def run_experiment(experiment: Experiment) -> dict[str, Any]:
    """Both sides on one request list, one after the other: each side's summary (the CLI's JSON),
    table row, timeline, badge and reproducing command."""
    first = experiment.spec(experiment.sides[0])
    requests = first.workload()
    out: dict[str, Any] = {
        "traffic": experiment.traffic | {"workload_digest": workload_digest(requests), "requests": len(requests)},
        "preset": experiment.preset,
    }
    for name in experiment.sides:
        side: Side = getattr(experiment, name)
        spec = experiment.spec(name)
        result = simulate(spec, requests)
        out[name] = {
            "label": side.label,
            "levers": side.levers | {"gpu_hour_usd": side.gpu_hour_usd},
            "badge": badge(spec),
            "command": command_for(spec),
            "workload_digest": workload_digest(requests),
            "row": table_row(spec, result, side.gpu_hour_usd),
            "timeline": result["timeline"],
            "summary": {k: v for k, v in result.items() if k not in ("timeline", "replicas_started", "scale_events")},
            "scale_events": result.get("scale_events", []),
        }
    return out


def workload_digest(requests: list[SimRequest]) -> str:
    """A fingerprint of the request list (arrivals and lengths): equal on both sides of an A/B."""
    h = hashlib.sha256()
    for r in requests:
        system = f",{r.system_len}" if r.system_len else ""  # without a system prompt: the digest as ever
        h.update(f"{r.request_id},{r.arrival!r},{r.prompt_len},{r.max_tokens}{system};".encode())
    return h.hexdigest()[:16]


def gpu_seconds(spec: SimSpec, result: dict[str, Any]) -> tuple[float, int]:
    """(GPU-seconds paid for, the most GPUs held at once). A fixed fleet holds every GPU for the
    whole run; an autoscaled one holds each replica that is provisioning, loading, serving,
    draining or warm in the pool, row by row of its timeline."""
    if not spec.autoscale:
        return spec.gpus * result["simulated_s"], spec.gpus
    rows, end = result["timeline"], result["simulated_s"]
    held, most = 0.0, 0
    for i, row in enumerate(rows):  # a row's fleet holds from its time to the next row's
        until = min(rows[i + 1]["t"] if i + 1 < len(rows) else end, end)
        gpus = spec.group * sum(n for state, n in row["replicas"].items() if state not in ENDED)
        held += gpus * max(0.0, until - row["t"])
        most = max(most, gpus) if row["t"] <= end else most
    return held, most


# The figures of a side's run a lesson may quote (the summary and table_row's, the machine's own
# wall time left out): web/lesson_checks.py refuses any other key, tests/test_sim_compare.py holds it to a run.
RESULT_KEYS = (
    "output_tok_s", "output_tok_s_per_gpu", "request_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
    "itl_p99_s", "e2el_p50_s", "goodput_req_s", "goodput_share", "completed", "refused", "preemptions",
    "kv_blocks_per_replica", "kv_usage_max", "running_max", "replicas", "prefill_replicas", "steps", "gpus_used",
    "gpu_hours", "cost_usd", "cost_per_mtok_usd", "simulated_s", "prefix_hit_rate", "spec_acceptance",
    "spec_tokens_per_step",
)  # fmt: skip


def table_row(spec: SimSpec, result: dict[str, Any], gpu_hour_usd: float) -> dict[str, Any]:
    """The A/B table's figures: the run's own summary, plus GPUs and what the output cost."""
    seconds, most = gpu_seconds(spec, result)
    output_tokens = result["output_tok_s"] * result["simulated_s"]
    cost = seconds / 3600 * gpu_hour_usd
    return {
        "output_tok_s": result["output_tok_s"],
        "ttft_p50_s": result["ttft_p50_s"], "ttft_p99_s": result["ttft_p99_s"],
        "tpot_p50_s": result["tpot_p50_s"], "tpot_p99_s": result["tpot_p99_s"],
        "itl_p99_s": result["itl_p99_s"],
        "goodput_req_s": result["goodput_req_s"],
        "goodput_share": result["goodput_req_s"] / result["request_s"] if result["request_s"] else 0.0,
        "gpus_used": most, "gpu_hours": seconds / 3600,
        "cost_usd": cost,
        "cost_per_mtok_usd": cost / output_tokens * 1e6 if output_tokens else None,
        "completed": result["completed"], "refused": sum(result["refused"].values()),
        "prefix_hit_rate": result["prefix_hit_rate"],
        # Speculative decoding's (None where the side does not speculate).
        "spec_acceptance": result.get("spec_acceptance"), "spec_tokens_per_step": result.get("spec_tokens_per_step"),
        "simulated_s": result["simulated_s"],
    }  # fmt: skip


def badge(spec: SimSpec) -> str:
    """simulated: H100 x 8, Llama-3.1-70B (TP8, fp8, P/D 4+4)."""
    extras = [spec.shape_name] if spec.group > 1 else []
    extras += [spec.dtype] if spec.dtype != "bf16" else []
    extras += [f"P/D {spec.prefill_gpus}+{spec.decode_gpus}"] if spec.prefill_gpus is not None else []
    extras += ["static batches"] if not spec.paged else []
    extras += ["autoscaled"] if spec.autoscale else []
    model = spec.model.replace("llama", "Llama").replace("smollm2", "SmolLM2").replace("b", "B")
    extras += [calibration.describe()] if spec.device == "cpu" else []  # whose fit, its error (issue 40)
    text = f"simulated: {spec.device.upper()} x {spec.gpus}, {model}"
    return text + (f" ({', '.join(extras)})" if extras else "")


# the command that reproduces a side --------------------------------------------------------------


def command_for(spec: SimSpec) -> str:
    """`python -m engine.sim run ...` with every flag whose value is not the CLI's default."""
    from engine.sim.__main__ import parser, spec_from

    default = spec_from(parser().parse_args(["run", "--model", spec.model, "--device", spec.device]))
    words = ["python", "-m", "engine.sim", "run", "--model", spec.model, "--device", spec.device]
    by_field = {f.spec_field: f for f in (*TRAFFIC_FIELDS.values(), *SIDE_FIELDS.values())}
    for f in fields(SimSpec):
        name = f.name
        if name in ("model", "device", "timeline", "timeline_s") or name not in by_field:
            continue
        value, was = getattr(spec, name), getattr(default, name)
        if value == was and not (name == "kv_dtype" and spec.dtype != default.dtype):
            continue
        text = (
            str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)
        )
        words += [by_field[name].flag, text]
    return shlex.join([*words, "--json"])


def spec_from_command(command: str) -> SimSpec:
    """The SimSpec a `python -m engine.sim run ...` command runs (the CLI's own parsing)."""
    from engine.sim.__main__ import parser, spec_from

    words = shlex.split(command)
    if words[:4] != ["python", "-m", "engine.sim", "run"]:
        raise ValueError(f"not a `python -m engine.sim run` command: {command!r}")
    return spec_from(parser().parse_args(words[3:]))


def as_cli_spec(spec: SimSpec) -> SimSpec:
    """The spec as the CLI runs it: without the timeline the A/B records for its charts."""
    return replace(spec, timeline=False, timeline_s=SimSpec.timeline_s)


__all__ = [
    "DEFAULT_SIDE",
    "DEFAULT_TRAFFIC",
    "SIDE_FIELDS",
    "TRAFFIC_FIELDS",
    "Experiment",
    "Field",
    "Side",
    "as_cli_spec",
    "blame",
    "check_side",
    "command_for",
    "parse_experiment",
    "run_experiment",
    "spec_from_command",
    "table_row",
    "workload_digest",
]  # fmt: skip
