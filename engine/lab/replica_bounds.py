"""How many replicas a lab's fleet may serve with: the one rule the live lab, the simulated lab and
predict-then-run share."""

from __future__ import annotations

from typing import Any


def devices_per_replica(levers: dict[str, Any]) -> int:
    """The devices one replica takes: its tensor-parallel ranks in each of its pipeline stages."""
    return int(levers.get("tensor_parallel", 1)) * int(levers.get("pipeline_parallel", 1))


def split_pools(levers: dict[str, Any]) -> tuple[int, int] | None:
    """A prefill/decode split's (prefill replicas, decode replicas), or None: colocated."""
    prefill, decode = int(levers.get("prefill_gpus", 0)), int(levers.get("decode_gpus", 0))
    if not prefill or not decode:
        return None
    per = devices_per_replica(levers)
    return max(1, prefill // per), max(1, decode // per)


def replica_bounds(levers: dict[str, Any], warm_pool_holds_devices: bool) -> tuple[int, int]:
    """(fewest, most) serving replicas, the autoscaler's bounds: the most held to the device budget
    (gpu_count // devices_per_replica groups), never below one, and the fewest within the most.

    A warm replica holds its GPUs, so a simulated fleet's warm pool comes out of the budget. Live
    on CPU, replicas share the machine's cores and an idle warm one takes no core time: the warm
    pool stands beside the budget (on a 2-core machine, 2 serving replicas and 1 warm).

    A prefill/decode split's pools are fixed: the serving replicas are its prefill pool."""
    if (pools := split_pools(levers)) is not None:
        return pools[0], pools[0]
    groups = int(levers["gpu_count"]) // devices_per_replica(levers)
    if warm_pool_holds_devices:
        groups -= int(levers["warm_pool"])
    most = max(1, min(int(levers["max_replicas"]), groups))
    return max(1, min(int(levers["min_replicas"]), most)), most
