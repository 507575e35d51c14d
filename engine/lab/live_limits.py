"""What the live engine on this machine can run, beyond each lever's own range (which is the
simulated fleet's): the one model that fits, the devices present, the replicas a device budget
allows, and the most a live flood and its lengths may ask."""

from __future__ import annotations

from typing import Any

from engine.errors import InvalidParamError
from engine.lab.flood import FloodLimits
from engine.lab.replica_bounds import devices_per_replica
from engine.platform.machine import device_kind, usable_cores, visible_gpus

LIVE_MODEL = "smollm2-135m"
FLOOD_MAX_RATE = 200.0
# How far a flood of the lab's own clients may go (live, or aimed at a remote server).
LIVE_FLOOD = FloodLimits(FLOOD_MAX_RATE)
# What the live engine on this machine takes, where the lever's own range (the simulated fleet's)
# reaches further: a live flood past these would only measure a machine on its knees.
LIVE_MAX = {
    "request_rate": FLOOD_MAX_RATE, "prompt_tokens": 4000, "system_prompt_tokens": 4000, "output_tokens": 2000,
    "max_num_seqs": 256,
    "max_batched_tokens": 16384, "queue_cap": 10000, "min_replicas": 64, "max_replicas": 64, "warm_pool": 16,
    "provision_delay_s": 600, "pipeline_parallel": 4,
}


def live_devices(device: str) -> int:
    """What `gpu_count` may reach live: CUDA devices on a GPU machine, else this process's cores
    (read without torch: this is the web process)."""
    if device_kind(device) == "cuda":
        return visible_gpus()
    return usable_cores()


def check_live(clean: dict[str, Any], merged: dict[str, Any], devices: int, device: str = "cpu") -> None:
    """What this machine can run live, beyond each lever's own range: InvalidParamError otherwise."""
    for key, most in LIVE_MAX.items():
        if key in clean and clean[key] > most:
            raise InvalidParamError(
                key, f"the live engine on this machine takes at most {most:g}; the simulated executor goes further"
            )
    if "model" in clean and clean["model"] != LIVE_MODEL:
        raise InvalidParamError(
            "model",
            f"{clean['model']} cannot run live here: only {LIVE_MODEL} fits this machine, so the live "
            f"engine stays on {LIVE_MODEL} (choose the simulated executor to run it)",
        )
    check_speculation(clean, merged)
    check_split(clean, merged)
    tp, count = int(merged["tensor_parallel"]), int(merged["gpu_count"])
    pp = int(merged.get("pipeline_parallel", 1))
    what = "CUDA GPUs" if device_kind(device) == "cuda" else "CPU cores"
    if count > devices:
        raise InvalidParamError(
            "gpu_count",
            f"this machine has {devices} {what}, so the live engine runs at most {devices} devices; "
            f"{count} is beyond what is present",
        )
    if tp > devices:
        raise InvalidParamError(
            "tensor_parallel", f"a shard group of {tp} needs {tp} devices; this machine has {devices} {what}"
        )
    if tp * pp > devices:
        raise InvalidParamError(
            "pipeline_parallel",
            f"{pp} stages of {tp} rank(s) need {tp * pp} devices; this machine has {devices} {what}",
        )
    per_replica = devices_per_replica(merged)
    shape = f"tensor_parallel x pipeline_parallel ({tp} x {pp})" if pp > 1 else f"tensor_parallel ({tp})"
    if count % per_replica:
        raise InvalidParamError("gpu_count", f"must be a multiple of {shape}")
    if int(merged["min_replicas"]) * per_replica > count:
        raise InvalidParamError(
            "min_replicas",
            f"{merged['min_replicas']} replica(s) of {per_replica} device(s) need more than gpu_count ({count}) devices",
        )


def check_speculation(clean: dict[str, Any], merged: dict[str, Any]) -> None:
    """Speculative decoding's window, and what it runs on (EngineConfig's own rule, said before
    anything is applied): InvalidParamError naming the lever just moved."""
    if int(merged["spec_lookup_min"]) > int(merged["spec_lookup_max"]):
        key = "spec_lookup_min" if "spec_lookup_min" in clean else "spec_lookup_max"
        raise InvalidParamError(key, "the shortest match must not exceed the longest (spec_lookup_min <= spec_lookup_max)")
    if int(merged["num_speculative_tokens"]) and (not merged["paged"] or int(merged.get("pipeline_parallel", 1)) > 1):
        key = next((k for k in ("num_speculative_tokens", "paged", "pipeline_parallel") if k in clean), "num_speculative_tokens")
        raise InvalidParamError(
            key, "speculative decoding runs on the paged scheduler with one pipeline stage: turn it off first, or keep them"
        )


def check_split(clean: dict[str, Any], merged: dict[str, Any]) -> None:
    """A prefill/decode split live: both pools, whole replicas, adding up to gpu_count."""
    prefill, decode = int(merged.get("prefill_gpus", 0)), int(merged.get("decode_gpus", 0))
    if not prefill and not decode:
        return
    key = next((k for k in ("prefill_gpus", "decode_gpus", "gpu_count") if k in clean), "prefill_gpus")
    per = devices_per_replica(merged)
    if not prefill or not decode:
        raise InvalidParamError(key, "a prefill/decode split needs both pools (or both 0: colocated)")
    if prefill % per or decode % per or prefill + decode != int(merged["gpu_count"]):
        raise InvalidParamError(
            key, f"prefill_gpus ({prefill}) and decode_gpus ({decode}) must each be whole replicas of {per} "
            f"device(s) and add up to gpu_count ({merged['gpu_count']})",
        )
