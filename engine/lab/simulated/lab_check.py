"""The lab's simulated configuration: the levers in the simulator's terms (a SimSpec), its
verdict on them (a configuration it cannot run is an InvalidParamError with the simulator's
own reason, named after the lever it is about), and the badge every simulated chart carries."""

from __future__ import annotations

from typing import Any

from engine.errors import InvalidParamError
from engine.lab.replica_bounds import replica_bounds
from engine.sim import calibration
from engine.sim.deployment import Deployment, SimConfigError
from engine.sim.run import SimSpec
from engine.sim.spec import spec_fields

# Which levers a simulator refusal is about, most likely first: the one a learner just moved
# among them is named, so the reason appears next to it.
FIT_KEYS = ("model", "tensor_parallel", "pipeline_parallel", "gpu_count", "device", "weight_dtype")
TP_KEYS = ("tensor_parallel", "pipeline_parallel", "model")
DTYPE_KEYS = ("weight_dtype", "device")


def model_label(name: str) -> str:
    """The badge's model name: llama-3.1-70b -> Llama-3.1-70B, smollm2-135m -> SmolLM2-135M."""
    head, *rest = name.split("-")
    head = "SmolLM2" if head == "smollm2" else head.capitalize()
    return "-".join([head, *(part.upper() if part[-1:] in "bm" else part for part in rest)])


BADGE_LEVERS = ("device", "gpu_count", "prefill_gpus", "decode_gpus", "model", "tensor_parallel", "pipeline_parallel")


def badge(levers: dict[str, Any]) -> str:
    """What every simulated chart and panel says it shows: 'simulated: H100 x 64, Llama-3.1-70B'."""
    pools = int(levers["prefill_gpus"])
    split = f" (prefill {pools} + decode {int(levers['decode_gpus'])})" if pools else ""
    tp, pp = int(levers["tensor_parallel"]), int(levers.get("pipeline_parallel", 1))
    words = (
        f"simulated: {str(levers['device']).upper()} x {int(levers['gpu_count'])}{split}, "
        f"{model_label(str(levers['model']))}" + (f", TP{tp}" if tp > 1 else "") + (f" x PP{pp}" if pp > 1 else "")
    )
    if levers["device"] == "cpu":  # a fit of this or another machine, with its error (issue 40)
        words += f" ({calibration.describe()})"
    return words


# The levers a simulated lab's fleet takes (the rest are the live engine's on this machine, or the
# lab's traffic, which the lab drives itself).
SIM_LEVERS = (
    "model", "device", "gpu_count", "tensor_parallel", "pipeline_parallel", "pipeline_overlap", "weight_dtype",
    "kv_dtype", "prompt_tokens", "output_tokens", "system_prompt_tokens", "system_prompt_share",
    "max_num_seqs", "max_batched_tokens", "prefix_caching", "prefill_gpus", "decode_gpus", "min_replicas",
    "max_replicas", "warm_pool", "provision_delay_s", "num_speculative_tokens", "spec_acceptance", "paged",
)  # fmt: skip


def sim_spec(levers: dict[str, Any]) -> SimSpec:
    """The simulator's view of the lab's levers."""
    values = spec_fields(levers, SIM_LEVERS) | {"min_replicas": max(1, int(levers["min_replicas"]))}
    return SimSpec(**values, input_range_ratio=0.5)  # the lab's traffic draws lengths within +-50% of the means


def _refuse(reason: str, keys: tuple[str, ...], changed: dict[str, Any]) -> InvalidParamError:
    param = next((key for key in keys if key in changed), keys[0])
    return InvalidParamError(param, f"cannot run simulated: {reason}")


def check_sim(levers: dict[str, Any], changed: dict[str, Any]) -> tuple[SimSpec, Deployment]:
    """The simulator's verdict on a configuration: its spec and deployment, or InvalidParamError
    with the simulator's reason, named after the lever (of those just changed) it is about."""
    spec = sim_spec(levers)
    if (spec.prefill_gpus or 0) * (spec.decode_gpus or 0) == 0 and spec.prefill_gpus != spec.decode_gpus:
        raise _refuse("a prefill/decode split needs both pools (or both 0: colocated)", ("prefill_gpus", "decode_gpus"), changed)
    try:
        dep = spec.deployment()
    except SimConfigError as err:
        reason = str(err)
        if "FP4" in reason:
            keys = DTYPE_KEYS
        elif "must divide" in reason:
            keys = TP_KEYS
        elif "pipeline parallel" in reason and "layers" in reason:
            keys = ("pipeline_parallel", "model")
        elif "speculat" in reason:
            keys = ("num_speculative_tokens", "paged", "pipeline_parallel")
        elif "context" in reason:
            keys = ("prompt_tokens", "output_tokens", "system_prompt_tokens", "model")
        elif "prefill" in reason or "disaggregation" in reason:
            keys = ("prefill_gpus", "decode_gpus", "gpu_count")
        elif "whole number" in reason or "needs" in reason and "GPUs" in reason and "weights" not in reason:
            keys = ("gpu_count", "tensor_parallel", "pipeline_parallel")
        else:
            keys = FIT_KEYS
        raise _refuse(reason, keys, changed) from None
    if spec.prefill_gpus is None:
        spec.min_replicas, spec.max_replicas = replica_bounds(levers, warm_pool_holds_devices=True)
        try:
            spec.replica_bounds()
        except SimConfigError as err:
            raise _refuse(str(err), ("min_replicas", "max_replicas", "warm_pool", "gpu_count"), changed) from None
    return spec, dep


def fits(dep: Deployment, tp: int) -> bool:
    """This model, device and dtype on a TP group of tp GPUs: does the simulator take it?"""
    try:
        Deployment(dep.model, dep.device, tp, dep.dtype, dep.kv_dtype)
    except SimConfigError:
        return False
    return True
