"""What is known of a replica's ranks without torch: how long their collectives and steps may
take, and the sharding stats every engine reports (its ShardGroup's, or one rank's). A live
replica's front process, the live lab's rank switches and the simulator's engines read these;
engine/collectives.py and engine/distributed.py (which need torch) re-export them."""

from __future__ import annotations

import os
from typing import Any

COLLECTIVE_TIMEOUT_S = 10.0  # a collective waiting longer than this fails the group
STEP_TIMEOUT_S = 14.0  # the front process's watchdog on one step of a sharded replica
START_TIMEOUT_S = 300.0


def pp_stats(weight_bytes: int, block_bytes: int) -> dict[str, Any]:
    """The pipeline facts of one stage (no pipeline): the keys a pipelined replica reports."""
    return {
        "pipeline_parallel": 1,
        "pp_stage_layers": [],
        "pp_stage_weight_bytes": [weight_bytes],
        "pp_stage_kv_block_bytes": [block_bytes],
        "pp_stage_busy_ms_per_step": [],
        "pp_stage_idle_share": [],
    }


def tp_stats(group: Any, weight_bytes: int, block_bytes: int) -> dict[str, Any]:
    """The sharding facts engine.stats() reports, the same keys for one rank:
    tensor_parallel (ranks a stage), tp_rank_weight_bytes (weights each rank of the first stage
    holds, rank 0 first), tp_rank_pids, rank_pids (every rank's, rank 0 first), allreduce_ms_per_step (rank 0's wall time in all-reduces,
    mean of the latest steps), allreduces_per_step (2 per layer of the stage); and with pipeline
    stages, pipeline_parallel and per stage: pp_stage_layers, pp_stage_weight_bytes (its TP ranks
    together), pp_stage_kv_block_bytes (one KV block's bytes there), pp_stage_busy_ms_per_step and pp_stage_idle_share (the bubble, over the latest
    STAGE_WINDOW_S). group: the replica's ShardGroup (engine/distributed.py, whose stats() these
    are), None for one rank."""
    if group is not None:
        return group.stats()
    return {
        "tensor_parallel": 1,
        "tp_rank_weight_bytes": [weight_bytes],
        "tp_rank_pids": [os.getpid()],
        "rank_pids": [os.getpid()],
        "allreduce_ms_per_step": 0.0,
        "allreduces_per_step": 0,
    } | pp_stats(weight_bytes, block_bytes)
